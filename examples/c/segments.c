/* One long sequence in segments, in C: the recipe of wkv.h's "Segments of one sequence" with
 * nothing but wkv_forward (the same calls split a sequence across devices or processes).
 *
 * RWKV-7's state update is affine in the state, so a segment of L tokens maps its initial
 * state S to S A + B (per head, N x N). With the sequence [1, T, H, N] viewed as P segments
 * [P, L, H, N] (strides only, no copy):
 *   1. B: one forward of all segments from a zero state (state_in NULL) -> state_out B[P], y0;
 *   2. A: one forward from the identity with v = 0 (a broadcast zero: all strides 0) -> A[P],
 *      and y1_t = M_1 ... M_t r_t (its state at t is the product of the transitions so far);
 *   3. the true initial states, in order: S_0 = the sequence's state, S_{i+1} = S_i A_i + B_i
 *      (this composition is associative: across devices it is a scan);
 *   4. y is linear in the initial state too: y_t[v] = y0_t[v] + sum_i S[v][i] y1_t[i], and the
 *      final state is S A + B of the last segment. No third forward.
 * RWKV-6/5 is the same with its bonus u shared by every segment (with v = 0 it adds nothing to
 * y1). RWKV-4's state is the log-space (aa, bb, pp) and its decay one time-invariant number per
 * channel: a segment's transition is its end from the zero state plus L wd, composed in log
 * space (step 3 below); its y is a ratio, not linear in the state, so step 4 is one forward of
 * all segments from their true initial states.
 * The example checks y and the final state against one forward of the whole sequence.
 *
 *   segments [--op rwkv7|rwkv6|rwkv4] [--backend cpu|vulkan|cuda|auto] [--T T] [--segments P]
 *            [--H H] [--N N]          (RWKV-4: C = H * N channels)
 * Prints the largest relative differences and "segments: ok" (exit 0) when they are within
 * float32 rounding. Run by ctest on the CPU and, when present, on Vulkan. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wkv/wkv.h>

static const char* backend_name(wkv_backend b) {
    return b == WKV_BACKEND_CPU ? "cpu" : b == WKV_BACKEND_CUDA ? "cuda" : b == WKV_BACKEND_VULKAN ? "vulkan" : "?";
}

static float* alloc_floats(size_t n) {
    float* p = (float*)calloc(n ? n : 1, sizeof(float));
    if (!p) {
        fprintf(stderr, "segments: out of memory\n");
        exit(1);
    }
    return p;
}

/* Deterministic inputs: uniform in [lo, hi). */
static void fill(float* x, size_t n, float lo, float hi, uint64_t* s) {
    for (size_t i = 0; i < n; ++i) {
        *s = *s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = lo + (hi - lo) * (float)((*s >> 40) * (1.0 / 16777216.0));
    }
}

/* Largest |a - b| over the largest |b|. */
static double rel_diff(const float* a, const float* b, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; ++i) {
        double e = fabs((double)a[i] - b[i]);
        if (e > d) d = e;
        if (fabs(b[i]) > m) m = fabs(b[i]);
    }
    return m > 0 ? d / m : d;
}

/* RWKV-4, step 3: the state after a segment with zero-start end (aaS, bbS, ppS) and log decay
 * ld = L wd, from (aa0, bb0, pp0): the linear-space sum, in log space. */
static void rwkv4_apply(const float* start, const float* end, const float* ld, float* out, int64_t C) {
    for (int64_t c = 0; c < C; ++c) {
        const double p0 = (double)start[2 * C + c] + ld[c], pS = end[2 * C + c], p = p0 > pS ? p0 : pS;
        const double e0 = exp(p0 - p), eS = exp(pS - p);
        out[c] = (float)(start[c] * e0 + end[c] * eS);
        out[C + c] = (float)(start[C + c] * e0 + end[C + c] * eS);
        out[2 * C + c] = (float)p;
    }
}

int main(int argc, char** argv) {
    wkv_backend backend = WKV_BACKEND_AUTO;
    wkv_op op = WKV_OP_RWKV7;
    int64_t T = 512, P = 8, H = 2, N = 32;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--backend")) {
            const char* b = argv[i + 1];
            backend = !strcmp(b, "cpu") ? WKV_BACKEND_CPU : !strcmp(b, "vulkan") ? WKV_BACKEND_VULKAN
                    : !strcmp(b, "cuda") ? WKV_BACKEND_CUDA : WKV_BACKEND_AUTO;
        } else if (!strcmp(argv[i], "--op")) {
            op = !strcmp(argv[i + 1], "rwkv6") ? WKV_OP_RWKV6 : !strcmp(argv[i + 1], "rwkv4") ? WKV_OP_RWKV4 : WKV_OP_RWKV7;
        } else if (!strcmp(argv[i], "--T")) T = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--segments")) P = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--H")) H = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--N")) N = atoll(argv[i + 1]);
    }
    if (P < 1 || T < P || T % P || H < 1 || N < 1) {
        fprintf(stderr, "segments: T must be a positive multiple of --segments\n");
        return 2;
    }
    const int r4 = op == WKV_OP_RWKV4;
    const int64_t L = T / P, C = H * N;
    wkv_context_options opt = {0};
    opt.struct_size = sizeof opt;
    opt.backend = backend;
    wkv_context* ctx = NULL;
    if (wkv_context_create(&opt, &ctx) != WKV_OK) {
        fprintf(stderr, "segments: %s\n", wkv_last_error(NULL));
        return 1;
    }

    /* the per-token tensors [1, T, H, N] (RWKV-4 [1, T, C]), the shared ones, the state */
    const size_t ntok = (size_t)(T * C), nst = r4 ? (size_t)(3 * C) : (size_t)(H * N * N);
    float *r = alloc_floats(ntok), *w = alloc_floats(ntok), *k = alloc_floats(ntok), *v = alloc_floats(ntok);
    float *a = alloc_floats(ntok), *b = alloc_floats(ntok), *u = alloc_floats((size_t)C), *s0 = alloc_floats(nst);
    uint64_t seed = 7;
    /* w in [-6, -1]: decays close to 1 (a long memory), so every segment's output depends on the
     * states before it and a wrong composition shows */
    fill(r, ntok, -1, 1, &seed), fill(w, ntok, -6, -1, &seed);
    fill(k, ntok, r4 ? -3.0f : -0.5f, r4 ? 3.0f : 0.5f, &seed), fill(v, ntok, -1, 1, &seed);
    fill(u, (size_t)C, -0.5f, 0.5f, &seed), fill(s0, nst, -0.5f, 0.5f, &seed);
    if (r4)
        for (int64_t c = 0; c < C; ++c) s0[C + c] = 0.5f + fabsf(s0[C + c]); /* bb > 0 */
    /* a = -kk, b = kk * iclr: RWKV-7's in-context learning rate form (kk normalised per head) */
    for (int64_t t = 0; t < T * H; ++t) {
        float nrm = 0, *kk = k + t * N;
        for (int64_t i = 0; i < N; ++i) nrm += kk[i] * kk[i];
        nrm = sqrtf(nrm) + 1e-6f;
        for (int64_t i = 0; i < N; ++i) a[t * N + i] = -kk[i] / nrm, b[t * N + i] = kk[i] / nrm * 0.5f;
    }

    /* the reference: one forward of the whole sequence */
    float *y_ref = alloc_floats(ntok), *s_ref = alloc_floats(nst);
    const int64_t whole[4] = {1, T, H, N}, whole4[3] = {1, T, C}, st1[4] = {1, H, N, N}, st4[3] = {1, 3, C};
    const int64_t hn[2] = {H, N}, c1[1] = {C};
    const int nd = r4 ? 3 : 4;
    const int64_t* tok_shape = r4 ? whole4 : whole;
    wkv_forward_desc f = {0};
    f.struct_size = sizeof f;
    f.op = op;
    f.decay_form = op == WKV_OP_RWKV7 ? WKV_DECAY_CLAMPW : WKV_DECAY_EXP_NEG_EXP;
    f.k = wkv_tensor_make(k, WKV_DTYPE_F32, nd, tok_shape), f.v = wkv_tensor_make(v, WKV_DTYPE_F32, nd, tok_shape);
    f.y = wkv_tensor_make(y_ref, WKV_DTYPE_F32, nd, tok_shape);
    if (r4) {
        f.w = wkv_tensor_make(w, WKV_DTYPE_F32, 1, c1), f.u = wkv_tensor_make(u, WKV_DTYPE_F32, 1, c1);
    } else {
        f.r = wkv_tensor_make(r, WKV_DTYPE_F32, 4, whole), f.w = wkv_tensor_make(w, WKV_DTYPE_F32, 4, whole);
        if (op == WKV_OP_RWKV7)
            f.a = wkv_tensor_make(a, WKV_DTYPE_F32, 4, whole), f.b = wkv_tensor_make(b, WKV_DTYPE_F32, 4, whole);
        else
            f.u = wkv_tensor_make(u, WKV_DTYPE_F32, 2, hn);
    }
    const int64_t* st_shape = r4 ? st4 : st1;
    f.state_in = wkv_tensor_make(s0, WKV_DTYPE_F32, r4 ? 3 : 4, st_shape);
    f.state_out = wkv_tensor_make(s_ref, WKV_DTYPE_F32, r4 ? 3 : 4, st_shape);
    wkv_status st = wkv_forward(ctx, &f);

    /* the same tensors as P segments of L tokens: [P, L, H, N] ([P, L, C]), strides only */
    const int64_t seg[4] = {P, L, H, N}, seg4[3] = {P, L, C}, stP[4] = {P, H, N, N}, stP4[3] = {P, 3, C};
    const int64_t seg_strides[4] = {L * C, H * N, N, 1}, seg4_strides[3] = {L * C, C, 1}, zero_strides[4] = {0, 0, 0, 0};
    const int64_t* seg_shape = r4 ? seg4 : seg;
    const int64_t* seg_str = r4 ? seg4_strides : seg_strides;
    const int64_t* stP_shape = r4 ? stP4 : stP;
    float *A = alloc_floats((size_t)P * nst), *Bs = alloc_floats((size_t)P * nst), *eye = alloc_floats((size_t)P * nst);
    float *starts = alloc_floats((size_t)P * nst), *ends = alloc_floats((size_t)P * nst), *y = alloc_floats(ntok);
    float* y1 = alloc_floats(ntok);
    float zero = 0.0f;
    if (!r4)
        for (int64_t i = 0; i < P * H; ++i)
            for (int64_t d = 0; d < N; ++d) eye[(i * N + d) * N + d] = 1.0f;
    wkv_forward_desc g = f;
    wkv_tensor* toks[6] = {&g.r, &g.w, &g.k, &g.v, &g.a, &g.b};
    float* datas[6] = {r, w, k, v, a, b};
    for (int i = 0; i < 6; ++i) {
        if (!toks[i]->data || (r4 && i == 1)) continue; /* absent for this op; RWKV-4's w is [C] */
        *toks[i] = wkv_tensor_make(datas[i], WKV_DTYPE_F32, nd, seg_shape);
        toks[i]->strides = seg_str;
    }
    g.y = wkv_tensor_make(y, WKV_DTYPE_F32, nd, seg_shape); /* y0 (RWKV-4: overwritten by step 4) */
    g.y.strides = seg_str;
    g.state_in.data = NULL;
    g.state_out = wkv_tensor_make(Bs, WKV_DTYPE_F32, nd, stP_shape);
    if (!st) st = wkv_forward(ctx, &g); /* 1. B from zeros */
    if (!st && !r4) {
        g.v = wkv_tensor_make(&zero, WKV_DTYPE_F32, 4, seg);
        g.v.strides = zero_strides; /* v = 0 everywhere, one float */
        g.state_in = wkv_tensor_make(eye, WKV_DTYPE_F32, 4, stP);
        g.state_out = wkv_tensor_make(A, WKV_DTYPE_F32, 4, stP);
        g.y = wkv_tensor_make(y1, WKV_DTYPE_F32, 4, seg);
        g.y.strides = seg_str;
        st = wkv_forward(ctx, &g); /* 2. A and y1 from the identity */
    }
    if (st) {
        fprintf(stderr, "segments: %s\n", wkv_last_error(ctx));
        return 1;
    }
    /* 3. the true initial states in order: S_{i+1} = S_i A_i + B_i per head ([value][key] rows:
     * (S A)[i][j] = sum_m S[i][m] A[m][j]); RWKV-4 in log space with A = L wd per channel */
    memcpy(starts, s0, nst * sizeof(float));
    float* ld = alloc_floats((size_t)C);
    for (int64_t c = 0; c < C; ++c) ld[c] = (float)(-exp((double)w[c]) * (double)L);
    for (int64_t p = 0; p < P; ++p) { /* the last step gives the final state (RWKV-7/6) */
        float* next = p + 1 < P ? starts + (p + 1) * nst : ends + p * nst;
        if (r4) {
            if (p + 1 == P) break;
            rwkv4_apply(starts + p * nst, Bs + p * nst, ld, next, C);
            continue;
        }
        for (int64_t h = 0; h < H; ++h) {
            const float* S = starts + (p * H + h) * N * N;
            const float* Ap = A + (p * H + h) * N * N;
            const float* Bp = Bs + (p * H + h) * N * N;
            float* nh = next + h * N * N;
            for (int64_t i = 0; i < N; ++i)
                for (int64_t j = 0; j < N; ++j) {
                    double acc = Bp[i * N + j];
                    for (int64_t m = 0; m < N; ++m) acc += (double)S[i * N + m] * Ap[m * N + j];
                    nh[i * N + j] = (float)acc;
                }
        }
    }
    if (r4) { /* 4. RWKV-4: every segment from its true initial state */
        g.v = wkv_tensor_make(v, WKV_DTYPE_F32, nd, seg_shape);
        g.v.strides = seg_str;
        g.y = wkv_tensor_make(y, WKV_DTYPE_F32, nd, seg_shape);
        g.y.strides = seg_str;
        g.state_in = wkv_tensor_make(starts, WKV_DTYPE_F32, nd, stP_shape);
        g.state_out = wkv_tensor_make(ends, WKV_DTYPE_F32, nd, stP_shape);
        if (wkv_forward(ctx, &g) != WKV_OK) {
            fprintf(stderr, "segments: %s\n", wkv_last_error(ctx));
            return 1;
        }
    } else { /* 4. RWKV-7/6: y += S y1 per token and head (y, y1 [P, L, H, N] = [T, H, N]) */
        for (int64_t p = 0; p < P; ++p)
            for (int64_t t = p * L; t < (p + 1) * L; ++t)
                for (int64_t h = 0; h < H; ++h) {
                    const float* S = starts + (p * H + h) * N * N;
                    const float* z = y1 + (t * H + h) * N;
                    float* out = y + (t * H + h) * N;
                    for (int64_t i = 0; i < N; ++i) {
                        double acc = out[i];
                        for (int64_t m = 0; m < N; ++m) acc += (double)S[i * N + m] * z[m];
                        out[i] = (float)acc;
                    }
                }
    }
    double ds = rel_diff(ends + (P - 1) * nst, s_ref, nst);
    if (r4) { /* the triple is not unique: compare the linear-space numerator and denominator */
        float *lin = alloc_floats((size_t)(2 * C)), *lin_ref = alloc_floats((size_t)(2 * C));
        const float* e = ends + (P - 1) * nst;
        for (int64_t c = 0; c < 2 * C; ++c)
            lin[c] = e[c] * expf(e[2 * C + c % C]), lin_ref[c] = s_ref[c] * expf(s_ref[2 * C + c % C]);
        ds = rel_diff(lin, lin_ref, (size_t)(2 * C));
        free(lin), free(lin_ref);
    }
    const double dy = rel_diff(y, y_ref, ntok);
    static const char* op_names[8] = {0, 0, 0, 0, "rwkv4", 0, "rwkv6", "rwkv7"};
    printf("segments: %s on %s, T=%lld in %lld segments of %lld, H=%lld N=%lld: y differs by %.2e, the final "
           "state by %.2e (relative to their largest elements)\n", op_names[op], backend_name(wkv_context_backend(ctx)),
           (long long)T, (long long)P, (long long)L, (long long)H, (long long)N, dy, ds);
    const int ok = dy <= 1e-4 && ds <= 1e-4;
    printf("segments: %s\n", ok ? "ok" : "FAILED");
    wkv_context_destroy(ctx);
    free(r), free(w), free(k), free(v), free(a), free(b), free(u), free(s0), free(y_ref), free(s_ref);
    free(A), free(Bs), free(eye), free(starts), free(ends), free(y), free(y1), free(ld);
    return ok ? 0 : 1;
}
