/* An RWKV-7 ("x070") language model in plain C: loads a safetensors checkpoint with BlinkDL's
 * key names (what wkv.model.save_safetensors writes), prefills a prompt, then decodes greedily.
 * libwkv runs the WKV recurrence (one wkv_forward per layer, the state stepped in place); the
 * rest is the readable float32 arithmetic of the model, row-parallel with OpenMP when the
 * compiler has it. It prints the same tokens as `python -m wkv.model` for the same weights.
 *
 *   rwkv7_model WEIGHTS.safetensors [--prompt TEXT | --tokens 1,2,3] [--generate N] [--backend cpu|cuda|vulkan]
 *
 * --prompt feeds the text's UTF-8 bytes as tokens (a byte-level model's vocabulary); --tokens
 * takes ids as they are (a World-vocabulary model's: tokenise with the rwkv package). The
 * checkpoint may be float32, float16 or bfloat16: it is converted to float32 once, at load. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <wkv/wkv.h>

#include "safetensors.h"

#define LN_EPS 1e-5f
#define LN_X_EPS 64e-5f

typedef struct mat { /* a row-major weight, rows x cols */
    float* p;
    int64_t rows, cols;
} mat;

typedef struct layer {
    float *ln0_w, *ln0_b, *ln1_w, *ln1_b, *ln2_w, *ln2_b;
    float *x_r, *x_w, *x_k, *x_v, *x_a, *x_g, *w0, *a0, *v0, *k_k, *k_a, *r_k;
    mat w1, w2, a1, a2, v1, v2, g1, g2; /* low-rank pairs, used as x @ w1 @ w2: [C][rank], [rank][C] */
    mat wr, wk, wv, wo;                 /* nn.Linear weights: [out][in] */
    float *lnx_w, *lnx_b;
    float* ffn_xk;
    mat ffn_key, ffn_value;
} layer;

typedef struct model {
    int64_t n_layer, C, H, N, V, F;
    float *emb, *ln_out_w, *ln_out_b;
    mat head;
    layer* layers;
    st_file* file;
    float** owned; /* every converted tensor, freed at the end */
    size_t n_owned;
} model;

/* ------------------------------------------------------------------------------ loading */

static char g_err[512];

static int fail(const char* fmt, const char* key, long long a, long long b) {
    snprintf(g_err, sizeof g_err, fmt, key, a, b);
    return 0;
}

/* The tensor `key` as float32 with numel elements (and rows x cols when cols > 0); 0 on error. */
static int take(model* m, const char* key, int64_t rows, int64_t cols, float** out) {
    const st_tensor* t = st_find(m->file, key);
    int64_t want = cols > 0 ? rows * cols : rows;
    if (!t) return fail("missing key '%s'", key, 0, 0);
    if (!st_dtype_is_float(t->dtype)) return fail("key '%s' is not a float tensor", key, 0, 0);
    if (t->numel != want) return fail("key '%s' has %lld elements; expected %lld", key, t->numel, want);
    if (cols > 0 && (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols))
        return fail("key '%s' is not a [%lld, %lld] matrix", key, rows, cols);
    float* p = malloc((size_t)want * sizeof *p);
    float** list = realloc(m->owned, (m->n_owned + 1) * sizeof *list);
    if (!p || !list) {
        free(p);
        if (list) m->owned = list;
        return fail("out of memory for key '%s'", key, 0, 0);
    }
    m->owned = list;
    m->owned[m->n_owned++] = p;
    st_tensor_to_f32(t, p);
    *out = p;
    return 1;
}

static int take_row(model* m, int64_t l, const char* part, int64_t n, float** out) {
    char key[96];
    snprintf(key, sizeof key, "blocks.%lld.%s", (long long)l, part);
    return take(m, key, n, 0, out);
}

static int take_mat(model* m, int64_t l, const char* part, int64_t rows, int64_t cols, mat* out) {
    char key[96];
    snprintf(key, sizeof key, "blocks.%lld.%s", (long long)l, part);
    out->rows = rows, out->cols = cols;
    return take(m, key, rows, cols, &out->p);
}

static int64_t dim(const st_file* f, const char* key, int i) {
    const st_tensor* t = st_find(f, key);
    return t && t->ndim == 2 ? t->shape[i] : -1;
}

static int load_model(const char* path, model* m) {
    char err[256];
    memset(m, 0, sizeof *m);
    m->file = st_open(path, err, sizeof err);
    if (!m->file) return snprintf(g_err, sizeof g_err, "%s", err), 0;
    m->V = dim(m->file, "emb.weight", 0), m->C = dim(m->file, "emb.weight", 1);
    m->H = dim(m->file, "blocks.0.att.r_k", 0), m->N = dim(m->file, "blocks.0.att.r_k", 1);
    m->F = dim(m->file, "blocks.0.ffn.key.weight", 0);
    if (m->V <= 0 || m->C <= 0) return fail("missing key '%s' (or it is not [vocab, n_embd])", "emb.weight", 0, 0);
    if (m->H <= 0 || m->H * m->N != m->C) return fail("key '%s' is not [n_head, head_size]", "blocks.0.att.r_k", 0, 0);
    if (m->F <= 0) return fail("missing key '%s'", "blocks.0.ffn.key.weight", 0, 0);
    for (size_t i = 0; i < st_count(m->file); ++i) {
        long long l;
        if (sscanf(st_at(m->file, i)->name, "blocks.%lld.", &l) == 1 && l + 1 > m->n_layer) m->n_layer = l + 1;
    }
    m->layers = calloc((size_t)m->n_layer, sizeof *m->layers);
    if (!m->layers) return fail("out of memory%s", "", 0, 0);
    const int64_t C = m->C;
    if (!take(m, "emb.weight", m->V, C, &m->emb) || !take(m, "ln_out.weight", C, 0, &m->ln_out_w) ||
        !take(m, "ln_out.bias", C, 0, &m->ln_out_b) || !take(m, "head.weight", m->V, C, &m->head.p))
        return 0;
    m->head.rows = m->V, m->head.cols = C;
    for (int64_t l = 0; l < m->n_layer; ++l) {
        layer* y = &m->layers[l];
        const int64_t rw = dim(m->file, "blocks.0.att.w1", 1), ra = dim(m->file, "blocks.0.att.a1", 1);
        const int64_t rg = dim(m->file, "blocks.0.att.g1", 1), rv = m->n_layer > 1 ? dim(m->file, "blocks.1.att.v1", 1) : 0;
        float** rows[] = {&y->ln1_w, &y->ln1_b, &y->ln2_w, &y->ln2_b, &y->x_r, &y->x_w, &y->x_k, &y->x_v, &y->x_a,
                          &y->x_g, &y->w0, &y->a0, &y->k_k, &y->k_a, &y->r_k, &y->lnx_w, &y->lnx_b, &y->ffn_xk};
        const char* names[] = {"ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias", "att.x_r", "att.x_w", "att.x_k",
                               "att.x_v", "att.x_a", "att.x_g", "att.w0", "att.a0", "att.k_k", "att.k_a", "att.r_k",
                               "att.ln_x.weight", "att.ln_x.bias", "ffn.x_k"};
        for (size_t i = 0; i < sizeof names / sizeof *names; ++i)
            if (!take_row(m, l, names[i], C, rows[i])) return 0;
        if (l == 0 && (!take_row(m, 0, "ln0.weight", C, &y->ln0_w) || !take_row(m, 0, "ln0.bias", C, &y->ln0_b)))
            return 0;
        if (!take_mat(m, l, "att.w1", C, rw, &y->w1) || !take_mat(m, l, "att.w2", rw, C, &y->w2) ||
            !take_mat(m, l, "att.a1", C, ra, &y->a1) || !take_mat(m, l, "att.a2", ra, C, &y->a2) ||
            !take_mat(m, l, "att.g1", C, rg, &y->g1) || !take_mat(m, l, "att.g2", rg, C, &y->g2) ||
            !take_mat(m, l, "att.receptance.weight", C, C, &y->wr) || !take_mat(m, l, "att.key.weight", C, C, &y->wk) ||
            !take_mat(m, l, "att.value.weight", C, C, &y->wv) || !take_mat(m, l, "att.output.weight", C, C, &y->wo) ||
            !take_mat(m, l, "ffn.key.weight", m->F, C, &y->ffn_key) ||
            !take_mat(m, l, "ffn.value.weight", C, m->F, &y->ffn_value))
            return 0;
        if (l > 0 && (!take_row(m, l, "att.v0", C, &y->v0) || !take_mat(m, l, "att.v1", C, rv, &y->v1) ||
                      !take_mat(m, l, "att.v2", rv, C, &y->v2)))
            return 0;
    }
    return 1;
}

static void free_model(model* m) {
    for (size_t i = 0; i < m->n_owned; ++i) free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    st_close(m->file);
}

/* ------------------------------------------------------------------------------ arithmetic */

/* out[t][o] = x[t] . W[o] (an nn.Linear without bias). Tokens go in blocks of 32 so that the
 * block's x rows stay in the core's L2 while every W row is read against them (a decode step:
 * one pass over W, which is what its speed is bound by). */
static float dot(const float* x, const float* w, int64_t n) {
    float acc[8] = {0}; /* eight partial sums: a loop the compiler vectorises without -ffast-math */
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += x[i + j] * w[i + j];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; ++i) s += x[i] * w[i];
    return s;
}

#ifdef WKV_EXAMPLE_BLAS
/* The Fortran BLAS entry (every BLAS has it; no cblas.h needed). Column-major: out (O x T) =
 * W_rowmajor (seen as I x O, transposed) times x_rowmajor (seen as I x T). */
void sgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc);
#endif

static void linear(float* out, const float* x, const mat* W, int64_t T) {
    const int64_t I = W->cols, O = W->rows;
#ifdef WKV_EXAMPLE_BLAS
    if (T > 1) { /* a decode step is bound by reading W once: the plain loop below does that */
        const int m = (int)O, n = (int)T, k = (int)I;
        const float one = 1.0f, zero = 0.0f;
        sgemm_("T", "N", &m, &n, &k, &one, W->p, &k, x, &k, &zero, out, &m);
        return;
    }
#endif
    for (int64_t t0 = 0; t0 < T; t0 += 32) {
        const int64_t t1 = t0 + 32 < T ? t0 + 32 : T;
#pragma omp parallel for schedule(static)
        for (int64_t o = 0; o < O; ++o)
            for (int64_t t = t0; t < t1; ++t) out[t * O + o] = dot(x + t * I, W->p + o * I, I);
    }
}

/* out[t] = x[t] @ M for M [I][O] (the low-rank matrices' layout). */
static void matmul(float* out, const float* x, const mat* M, int64_t T) {
    const int64_t I = M->rows, O = M->cols;
#ifdef WKV_EXAMPLE_BLAS
    if (T > 1) { /* column-major: out (O x T) = M_rowmajor (seen as O x I) times x (seen as I x T) */
        const int m = (int)O, n = (int)T, k = (int)I;
        const float one = 1.0f, zero = 0.0f;
        sgemm_("N", "N", &m, &n, &k, &one, M->p, &m, x, &k, &zero, out, &m);
        return;
    }
#endif
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
        float* o = out + t * O;
        memset(o, 0, (size_t)O * sizeof *o);
        for (int64_t i = 0; i < I; ++i) {
            const float xi = x[t * I + i], *m = M->p + i * O;
            for (int64_t j = 0; j < O; ++j) o[j] += xi * m[j];
        }
    }
}

static void layer_norm(float* out, const float* x, const float* w, const float* b, int64_t T, int64_t C, float eps) {
    for (int64_t t = 0; t < T; ++t) {
        const float* xt = x + t * C;
        double mean = 0, var = 0;
        for (int64_t c = 0; c < C; ++c) mean += xt[c];
        mean /= (double)C;
        for (int64_t c = 0; c < C; ++c) var += (xt[c] - mean) * (xt[c] - mean);
        const float inv = (float)(1.0 / sqrt(var / (double)C + eps));
        for (int64_t c = 0; c < C; ++c) out[t * C + c] = (float)(xt[c] - mean) * inv * w[c] + b[c];
    }
}

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* ------------------------------------------------------------------------------ the model */

typedef struct state { /* per layer: time-mix previous token, WKV state, channel-mix previous token */
    float *att_shift, *wkv, *ffn_shift;
} state;

typedef struct scratch {
    float *x, *xn, *dx, *mix[6], *r, *w, *k, *v, *a, *g, *kk, *b, *y, *lo, *lo2, *vf, *ff;
} scratch;

/* Token shift: dx[t] = x[t-1] - x[t], with the previous call's last token before t = 0. */
static void shift_diff(float* dx, const float* x, float* prev, int64_t T, int64_t C) {
    for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < C; ++c) dx[t * C + c] = (t ? x[(t - 1) * C + c] : prev[c]) - x[t * C + c];
    memcpy(prev, x + (T - 1) * C, (size_t)C * sizeof *prev);
}

static int time_mix(const model* m, const layer* L, int64_t li, scratch* s, state* st, int64_t T, wkv_context* ctx) {
    const int64_t C = m->C, H = m->H, N = m->N, TC = T * C;
    const float* mixes[6] = {L->x_r, L->x_w, L->x_k, L->x_v, L->x_a, L->x_g};
    shift_diff(s->dx, s->xn, st->att_shift + li * C, T, C);
    for (int j = 0; j < 6; ++j)
        for (int64_t i = 0; i < TC; ++i) s->mix[j][i] = s->xn[i] + s->dx[i] * mixes[j][i % C];
    linear(s->r, s->mix[0], &L->wr, T);
    matmul(s->lo, s->mix[1], &L->w1, T);
    for (int64_t i = 0; i < T * L->w1.cols; ++i) s->lo[i] = tanhf(s->lo[i]);
    matmul(s->w, s->lo, &L->w2, T);
    for (int64_t i = 0; i < TC; ++i) s->w[i] += L->w0[i % C]; /* raw: libwkv applies the clampw decay */
    linear(s->k, s->mix[2], &L->wk, T);
    linear(s->v, s->mix[3], &L->wv, T);
    matmul(s->lo, s->mix[4], &L->a1, T);
    matmul(s->a, s->lo, &L->a2, T);
    for (int64_t i = 0; i < TC; ++i) s->a[i] = sigmoidf(L->a0[i % C] + s->a[i]);
    matmul(s->lo, s->mix[5], &L->g1, T);
    for (int64_t i = 0; i < T * L->g1.cols; ++i) s->lo[i] = sigmoidf(s->lo[i]);
    matmul(s->g, s->lo, &L->g2, T);
    for (int64_t th = 0; th < T * H; ++th) { /* kk = normalize(k * k_k) per head; k scaled by a */
        float* kk = s->kk + th * N;
        const float *k = s->k + th * N, *k_k = L->k_k + (th % H) * N;
        double ss = 0;
        for (int64_t n = 0; n < N; ++n) kk[n] = k[n] * k_k[n], ss += (double)kk[n] * kk[n];
        const float inv = 1.0f / fmaxf((float)sqrt(ss), 1e-12f);
        for (int64_t n = 0; n < N; ++n) kk[n] *= inv;
    }
    for (int64_t i = 0; i < TC; ++i) {
        s->k[i] *= 1.0f + (s->a[i] - 1.0f) * L->k_a[i % C];
        s->b[i] = s->kk[i] * s->a[i];
        s->kk[i] = -s->kk[i]; /* the op's a = -kk */
    }
    if (li == 0) {
        memcpy(s->vf, s->v, (size_t)TC * sizeof *s->vf);
    } else {
        matmul(s->lo, s->mix[3], &L->v1, T);
        matmul(s->lo2, s->lo, &L->v2, T);
        for (int64_t i = 0; i < TC; ++i) s->v[i] += (s->vf[i] - s->v[i]) * sigmoidf(L->v0[i % C] + s->lo2[i]);
    }

    int64_t shape[4] = {1, T, H, N}, sshape[4] = {1, H, N, N};
    wkv_forward_desc f = {0};
    f.struct_size = sizeof f;
    f.op = WKV_OP_RWKV7;
    f.decay_form = WKV_DECAY_CLAMPW;
    f.r = wkv_tensor_make(s->r, WKV_DTYPE_F32, 4, shape), f.w = wkv_tensor_make(s->w, WKV_DTYPE_F32, 4, shape);
    f.k = wkv_tensor_make(s->k, WKV_DTYPE_F32, 4, shape), f.v = wkv_tensor_make(s->v, WKV_DTYPE_F32, 4, shape);
    f.a = wkv_tensor_make(s->kk, WKV_DTYPE_F32, 4, shape), f.b = wkv_tensor_make(s->b, WKV_DTYPE_F32, 4, shape);
    f.y = wkv_tensor_make(s->y, WKV_DTYPE_F32, 4, shape);
    f.state_in = f.state_out = wkv_tensor_make(st->wkv + li * H * N * N, WKV_DTYPE_F32, 4, sshape);
    if (wkv_forward(ctx, &f) != WKV_OK) return snprintf(g_err, sizeof g_err, "%s", wkv_last_error(ctx)), 0;

    for (int64_t th = 0; th < T * H; ++th) { /* ln_x (group norm per head), the r.k bonus, the gate */
        float* y = s->y + th * N;
        const int64_t c0 = (th % H) * N;
        double mean = 0, var = 0, rk = 0;
        for (int64_t n = 0; n < N; ++n) mean += y[n];
        mean /= (double)N;
        for (int64_t n = 0; n < N; ++n) var += (y[n] - mean) * (y[n] - mean);
        const float inv = (float)(1.0 / sqrt(var / (double)N + LN_X_EPS));
        for (int64_t n = 0; n < N; ++n) rk += (double)s->r[th * N + n] * s->k[th * N + n] * L->r_k[c0 + n];
        for (int64_t n = 0; n < N; ++n) {
            const float yn = (float)(y[n] - mean) * inv * L->lnx_w[c0 + n] + L->lnx_b[c0 + n];
            y[n] = (yn + (float)rk * s->v[th * N + n]) * s->g[th * N + n];
        }
    }
    linear(s->dx, s->y, &L->wo, T);
    for (int64_t i = 0; i < TC; ++i) s->x[i] += s->dx[i];
    return 1;
}

static void channel_mix(const model* m, const layer* L, int64_t li, scratch* s, state* st, int64_t T) {
    const int64_t C = m->C, TC = T * C;
    shift_diff(s->dx, s->xn, st->ffn_shift + li * C, T, C);
    for (int64_t i = 0; i < TC; ++i) s->mix[0][i] = s->xn[i] + s->dx[i] * L->ffn_xk[i % C];
    linear(s->ff, s->mix[0], &L->ffn_key, T);
    for (int64_t i = 0; i < T * m->F; ++i) s->ff[i] = s->ff[i] > 0 ? s->ff[i] * s->ff[i] : 0.0f;
    linear(s->dx, s->ff, &L->ffn_value, T);
    for (int64_t i = 0; i < TC; ++i) s->x[i] += s->dx[i];
}

/* Runs T tokens through the model, stepping `st`; the last token's logits go to `logits`. */
static int forward(const model* m, const int64_t* tokens, int64_t T, scratch* s, state* st, float* logits,
                   wkv_context* ctx) {
    const int64_t C = m->C;
    for (int64_t t = 0; t < T; ++t) memcpy(s->x + t * C, m->emb + tokens[t] * C, (size_t)C * sizeof *s->x);
    layer_norm(s->x, s->x, m->layers[0].ln0_w, m->layers[0].ln0_b, T, C, LN_EPS);
    for (int64_t l = 0; l < m->n_layer; ++l) {
        const layer* L = &m->layers[l];
        layer_norm(s->xn, s->x, L->ln1_w, L->ln1_b, T, C, LN_EPS);
        if (!time_mix(m, L, l, s, st, T, ctx)) return 0;
        layer_norm(s->xn, s->x, L->ln2_w, L->ln2_b, T, C, LN_EPS);
        channel_mix(m, L, l, s, st, T);
    }
    layer_norm(s->xn, s->x + (T - 1) * C, m->ln_out_w, m->ln_out_b, 1, C, LN_EPS);
    linear(logits, s->xn, &m->head, 1);
    return 1;
}

static int alloc_scratch(const model* m, int64_t T, scratch* s) {
    const size_t TC = (size_t)(T * m->C);
    size_t lora = 1;
    for (int64_t l = 0; l < m->n_layer; ++l) {
        const layer* L = &m->layers[l];
        const int64_t r[] = {L->w1.cols, L->a1.cols, L->g1.cols, L->v1.cols};
        for (int i = 0; i < 4; ++i) lora = (size_t)r[i] > lora ? (size_t)r[i] : lora;
    }
    float** big[] = {&s->x, &s->xn, &s->dx, &s->mix[0], &s->mix[1], &s->mix[2], &s->mix[3], &s->mix[4], &s->mix[5],
                     &s->r, &s->w, &s->k, &s->v, &s->a, &s->g, &s->kk, &s->b, &s->y, &s->lo2, &s->vf};
    for (size_t i = 0; i < sizeof big / sizeof *big; ++i)
        if (!(*big[i] = malloc(TC * sizeof(float)))) return 0;
    return (s->lo = malloc((size_t)T * lora * sizeof(float))) && (s->ff = malloc((size_t)(T * m->F) * sizeof(float)));
}

static void free_scratch(scratch* s) {
    float* all[] = {s->x, s->xn, s->dx, s->mix[0], s->mix[1], s->mix[2], s->mix[3], s->mix[4], s->mix[5], s->r,
                    s->w, s->k, s->v, s->a, s->g, s->kk, s->b, s->y, s->lo, s->lo2, s->vf, s->ff};
    for (size_t i = 0; i < sizeof all / sizeof *all; ++i) free(all[i]);
}

static int64_t argmax(const float* x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i)
        if (x[i] > x[best]) best = i;
    return best;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int usage(void) {
    fprintf(stderr, "usage: rwkv7_model WEIGHTS.safetensors [--prompt TEXT | --tokens 1,2,3] [--generate N] "
                    "[--backend cpu|cuda|vulkan]\n");
    return 2;
}

int main(int argc, char** argv) {
    const char *path = NULL, *prompt = "The quick brown fox", *ids = NULL, *backend = "cpu";
    long n_gen = 16;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--prompt") && i + 1 < argc) prompt = argv[++i];
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) ids = argv[++i];
        else if (!strcmp(argv[i], "--generate") && i + 1 < argc) n_gen = strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend = argv[++i];
        else if (argv[i][0] != '-' && !path) path = argv[i];
        else return usage();
    }
    if (!path || n_gen < 0) return usage();

    int64_t T = 0, cap = (int64_t)strlen(ids ? ids : prompt) + 1;
    int64_t* tokens = malloc((size_t)(cap + n_gen) * sizeof *tokens);
    if (!tokens) return fprintf(stderr, "out of memory\n"), 1;
    if (ids) {
        for (char* p = (char*)ids; *p;) {
            char* end;
            errno = 0;
            long long v = strtoll(p, &end, 10);
            if (end == p || errno) return fprintf(stderr, "--tokens: %s is not a comma list of ids\n", ids), 2;
            tokens[T++] = v;
            p = *end == ',' ? end + 1 : end;
            if (*end && *end != ',') return fprintf(stderr, "--tokens: unexpected '%c'\n", *end), 2;
        }
    } else {
        for (const unsigned char* p = (const unsigned char*)prompt; *p; ++p) tokens[T++] = *p;
    }
    if (T == 0) return fprintf(stderr, "the prompt has no tokens\n"), 2;

    model m;
    if (!load_model(path, &m)) {
        fprintf(stderr, "%s: %s\n", path, g_err);
        free_model(&m);
        free(tokens);
        return 1;
    }
    for (int64_t t = 0; t < T; ++t)
        if (tokens[t] < 0 || tokens[t] >= m.V)
            return fprintf(stderr, "token %lld is outside the vocabulary (%lld)\n", (long long)tokens[t],
                           (long long)m.V), 1;

    wkv_context* ctx = NULL;
    wkv_context_options opt = {0};
    opt.struct_size = sizeof opt;
    opt.backend = !strcmp(backend, "cuda") ? WKV_BACKEND_CUDA : !strcmp(backend, "vulkan") ? WKV_BACKEND_VULKAN
                                                                                          : WKV_BACKEND_CPU;
    if (wkv_context_create(&opt, &ctx) != WKV_OK) return fprintf(stderr, "%s\n", wkv_last_error(NULL)), 1;

    const int64_t C = m.C, HNN = m.H * m.N * m.N;
    state st = {calloc((size_t)(m.n_layer * C), sizeof(float)), calloc((size_t)(m.n_layer * HNN), sizeof(float)),
                calloc((size_t)(m.n_layer * C), sizeof(float))};
    float* logits = malloc((size_t)m.V * sizeof *logits);
    scratch s = {0};
    int ok = st.att_shift && st.wkv && st.ffn_shift && logits && alloc_scratch(&m, T, &s);
    if (!ok) snprintf(g_err, sizeof g_err, "out of memory");
    printf("model: %lld layers, width %lld, %lld heads of %lld, vocabulary %lld; libwkv %s, backend %s\n",
           (long long)m.n_layer, (long long)C, (long long)m.H, (long long)m.N, (long long)m.V, wkv_version_string(),
           backend);

    double t0 = now();
    ok = ok && forward(&m, tokens, T, &s, &st, logits, ctx);
    double t1 = now();
    if (ok) {
        printf("logits:");
        for (int i = 0; i < 8 && i < m.V; ++i) printf(" %.6g", logits[i]);
        printf("\ntokens:");
    }
    int64_t generated = 0;
    while (ok && generated < n_gen) {
        int64_t next = argmax(logits, m.V);
        tokens[T + generated++] = next;
        printf(" %lld", (long long)next);
        fflush(stdout);
        if (generated < n_gen) ok = forward(&m, &next, 1, &s, &st, logits, ctx);
    }
    double t2 = now();
    if (ok) {
        printf("\nprefill: %lld tokens in %.3f s (%.1f tokens/s); decode: %lld tokens in %.3f s (%.1f tokens/s)\n",
               (long long)T, t1 - t0, (double)T / (t1 - t0), (long long)(generated > 0 ? generated - 1 : 0), t2 - t1,
               generated > 1 ? (double)(generated - 1) / (t2 - t1) : 0.0);
    } else {
        fprintf(stderr, "%s\n", g_err);
    }
    free_scratch(&s);
    free(logits);
    free(st.att_shift), free(st.wkv), free(st.ffn_shift);
    wkv_context_destroy(ctx);
    free_model(&m);
    free(tokens);
    return ok ? 0 : 1;
}
