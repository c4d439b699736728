/* Helpers shared by wkv-bench and the tests: see wkv_tools.h. */
#define _POSIX_C_SOURCE 200809L
#include "wkv_tools.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "half.h"
#include "reference/wkv_reference.h"

/* ----------------------------------------------------------------------- names, parsing */

int wkvt_dtype_equal(wkv_dtype a, wkv_dtype b) {
    return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

static int wkvt_is_f32(wkv_dtype d) { return wkvt_dtype_equal(d, WKV_DTYPE_F32); }
static int wkvt_is_f16(wkv_dtype d) { return wkvt_dtype_equal(d, WKV_DTYPE_F16); }
static int wkvt_is_bf16(wkv_dtype d) { return wkvt_dtype_equal(d, WKV_DTYPE_BF16); }

const char* wkvt_dtype_name(wkv_dtype d) {
    if (wkvt_is_f32(d)) return "f32";
    if (wkvt_is_f16(d)) return "f16";
    if (wkvt_is_bf16(d)) return "bf16";
    return "?";
}

int wkvt_dtype_parse(const char* s, wkv_dtype* out) {
    if (!s) return -1;
    if (!strcmp(s, "f32") || !strcmp(s, "float32") || !strcmp(s, "fp32")) *out = WKV_DTYPE_F32;
    else if (!strcmp(s, "f16") || !strcmp(s, "float16") || !strcmp(s, "fp16") ||
             !strcmp(s, "half"))
        *out = WKV_DTYPE_F16;
    else if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) *out = WKV_DTYPE_BF16;
    else return -1;
    return 0;
}

size_t wkvt_dtype_size(wkv_dtype d) {
    if (wkvt_is_f32(d)) return 4;
    if (wkvt_is_f16(d) || wkvt_is_bf16(d)) return 2;
    return 0;
}

uint32_t wkvt_dtype_bit(wkv_dtype d) {
    if (wkvt_is_f32(d)) return 1u;
    if (wkvt_is_f16(d)) return 2u;
    if (wkvt_is_bf16(d)) return 4u;
    return 0;
}

const char* wkvt_backend_name(wkv_backend b) {
    switch (b) {
    case WKV_BACKEND_AUTO: return "auto";
    case WKV_BACKEND_CPU: return "cpu";
    case WKV_BACKEND_CUDA: return "cuda";
    case WKV_BACKEND_VULKAN: return "vulkan";
    default: return "?";
    }
}

int wkvt_backend_parse(const char* s, wkv_backend* out) {
    if (!s) return -1;
    if (!strcmp(s, "auto")) *out = WKV_BACKEND_AUTO;
    else if (!strcmp(s, "cpu")) *out = WKV_BACKEND_CPU;
    else if (!strcmp(s, "cuda")) *out = WKV_BACKEND_CUDA;
    else if (!strcmp(s, "vulkan")) *out = WKV_BACKEND_VULKAN;
    else return -1;
    return 0;
}

const char* wkvt_op_name(wkv_op op) {
    switch (op) {
    case WKV_OP_RWKV4: return "rwkv4";
    case WKV_OP_RWKV6: return "rwkv6";
    case WKV_OP_RWKV7: return "rwkv7";
    default: return "?";
    }
}

int wkvt_op_parse(const char* s, wkv_op* out) {
    if (!s) return -1;
    if (!strcmp(s, "rwkv7") || !strcmp(s, "wkv7") || !strcmp(s, "7")) *out = WKV_OP_RWKV7;
    else if (!strcmp(s, "rwkv6") || !strcmp(s, "wkv6") || !strcmp(s, "6")) *out = WKV_OP_RWKV6;
    else if (!strcmp(s, "rwkv4") || !strcmp(s, "wkv4") || !strcmp(s, "4")) *out = WKV_OP_RWKV4;
    else return -1;
    return 0;
}

const char* wkvt_decay_form_name(wkv_decay_form f) {
    switch (f) {
    case WKV_DECAY_DIRECT: return "direct";
    case WKV_DECAY_LOG: return "log";
    case WKV_DECAY_EXP_NEG_EXP: return "exp_neg_exp";
    case WKV_DECAY_CLAMPW: return "clampw";
    default: return "?";
    }
}

int wkvt_decay_form_parse(const char* s, wkv_decay_form* out) {
    if (!s) return -1;
    if (!strcmp(s, "direct")) *out = WKV_DECAY_DIRECT;
    else if (!strcmp(s, "log")) *out = WKV_DECAY_LOG;
    else if (!strcmp(s, "exp_neg_exp")) *out = WKV_DECAY_EXP_NEG_EXP;
    else if (!strcmp(s, "clampw")) *out = WKV_DECAY_CLAMPW;
    else return -1;
    return 0;
}

int wkvt_parse_i64(const char* s, int64_t lo, int64_t hi, int64_t* out) {
    if (!s || !*s) return -1;
    char* end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || !end || *end || v < lo || v > hi) return -1;
    *out = (int64_t)v;
    return 0;
}

/* --------------------------------------------------------------------------- conversion */

void wkvt_store_f32(const float* src, void* dst, wkv_dtype d, size_t n) {
    if (wkvt_is_f32(d)) {
        memcpy(dst, src, n * sizeof(float));
    } else if (wkvt_is_f16(d)) {
        uint16_t* o = (uint16_t*)dst;
        for (size_t i = 0; i < n; i++) o[i] = wkv_f32_to_f16(src[i]);
    } else if (wkvt_is_bf16(d)) {
        uint16_t* o = (uint16_t*)dst;
        for (size_t i = 0; i < n; i++) o[i] = wkv_f32_to_bf16(src[i]);
    }
}

void wkvt_load_f64(const void* src, wkv_dtype d, double* dst, size_t n) {
    if (wkvt_is_f32(d)) {
        const float* s = (const float*)src;
        for (size_t i = 0; i < n; i++) dst[i] = s[i];
    } else if (wkvt_is_f16(d)) {
        const uint16_t* s = (const uint16_t*)src;
        for (size_t i = 0; i < n; i++) dst[i] = wkv_f16_to_f32(s[i]);
    } else if (wkvt_is_bf16(d)) {
        const uint16_t* s = (const uint16_t*)src;
        for (size_t i = 0; i < n; i++) dst[i] = wkv_bf16_to_f32(s[i]);
    }
}

void wkvt_load_f32(const void* src, wkv_dtype d, float* dst, size_t n) {
    if (wkvt_is_f32(d)) {
        memcpy(dst, src, n * sizeof(float));
    } else if (wkvt_is_f16(d)) {
        const uint16_t* s = (const uint16_t*)src;
        for (size_t i = 0; i < n; i++) dst[i] = wkv_f16_to_f32(s[i]);
    } else if (wkvt_is_bf16(d)) {
        const uint16_t* s = (const uint16_t*)src;
        for (size_t i = 0; i < n; i++) dst[i] = wkv_bf16_to_f32(s[i]);
    }
}

void wkvt_round_f32(float* x, wkv_dtype d, size_t n) {
    if (wkvt_is_f16(d))
        for (size_t i = 0; i < n; i++) x[i] = wkv_f16_to_f32(wkv_f32_to_f16(x[i]));
    else if (wkvt_is_bf16(d))
        for (size_t i = 0; i < n; i++) x[i] = wkv_bf16_to_f32(wkv_f32_to_bf16(x[i]));
}

void wkvt_fill_nan(void* dst, wkv_dtype d, size_t n) {
    if (wkvt_is_f32(d)) {
        float* o = (float*)dst;
        float nan = wkv_bits_f32(0x7fc00000u);
        for (size_t i = 0; i < n; i++) o[i] = nan;
    } else if (wkvt_is_f16(d) || wkvt_is_bf16(d)) {
        uint16_t* o = (uint16_t*)dst;
        uint16_t nan = wkvt_is_f16(d) ? 0x7e00u : 0x7fc0u;
        for (size_t i = 0; i < n; i++) o[i] = nan;
    }
}

/* ------------------------------------------------------------------------------ numerics */

double wkvt_rel_err(const double* out, const double* ref, size_t n) {
    /* Two-pass scaled sums would be overkill: values here are O(1..1e4). */
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(out[i])) return INFINITY;
        double d = out[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    if (isnan(num)) return INFINITY;
    if (den == 0.0) return sqrt(num);
    return sqrt(num / den);
}

/* --------------------------------------------------------------------------------- timing */

double wkvt_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------------------- randomness */

static uint64_t wkvt_splitmix(uint64_t* x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void wkvt_rng_seed(wkvt_rng* rng, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) rng->s[i] = wkvt_splitmix(&x);
    rng->have_spare = 0;
    rng->spare = 0.0;
}

static uint64_t wkvt_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t wkvt_rng_u64(wkvt_rng* rng) { /* xoshiro256** */
    uint64_t* s = rng->s;
    uint64_t result = wkvt_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = wkvt_rotl(s[3], 45);
    return result;
}

double wkvt_rng_uniform(wkvt_rng* rng) {
    return (double)(wkvt_rng_u64(rng) >> 11) * (1.0 / 9007199254740992.0);
}

double wkvt_rng_normal(wkvt_rng* rng) { /* Marsaglia polar method */
    if (rng->have_spare) {
        rng->have_spare = 0;
        return rng->spare;
    }
    double u, v, s;
    do {
        u = 2.0 * wkvt_rng_uniform(rng) - 1.0;
        v = 2.0 * wkvt_rng_uniform(rng) - 1.0;
        s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    double m = sqrt(-2.0 * log(s) / s);
    rng->spare = v * m;
    rng->have_spare = 1;
    return u * m;
}

static double wkvt_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* o[0..n) = linspace(lo, hi, n) ((lo + hi) / 2 when n = 1), shuffled (Fisher-Yates) by rng. */
static void wkvt_permuted_linspace(wkvt_rng* rng, double lo, double hi, int64_t n, double* o) {
    for (int64_t j = 0; j < n; j++)
        o[j] = n > 1 ? lo + (hi - lo) * (double)j / (double)(n - 1) : 0.5 * (lo + hi);
    for (int64_t j = n - 1; j > 0; j--) {
        int64_t m = (int64_t)(wkvt_rng_u64(rng) % (uint64_t)(j + 1));
        double t = o[j];
        o[j] = o[m];
        o[m] = t;
    }
}

void wkvt_rwkv7_random(wkvt_rng* rng, uint64_t seed_offsets, wkv_decay_form form, int64_t B,
                       int64_t T, int64_t H, int64_t N, float* r, float* w, float* k, float* v,
                       float* a, float* b) {
    /* Per-head decay offsets: a permutation of linspace(-5, 3, N) (fixed by seed_offsets). */
    double* offs = (double*)malloc((size_t)(H * N) * sizeof *offs);
    double* kk = (double*)malloc((size_t)N * sizeof *kk);
    if (!offs || !kk) { /* out of memory: plain but valid inputs */
        free(offs);
        free(kk);
        size_t n = (size_t)(B * T * H * N);
        for (size_t i = 0; i < n; i++) {
            r[i] = k[i] = v[i] = 0.1f;
            a[i] = b[i] = 0.0f;
            w[i] = (float)(form == WKV_DECAY_DIRECT ? 0.9
                           : form == WKV_DECAY_LOG ? log(0.9)
                           : form == WKV_DECAY_EXP_NEG_EXP ? log(-log(0.9))
                                                           : 0.0);
        }
        return;
    }
    wkvt_rng orng;
    wkvt_rng_seed(&orng, seed_offsets);
    for (int64_t h = 0; h < H; h++) wkvt_permuted_linspace(&orng, -5.0, 3.0, N, offs + h * N);
    const double e05 = exp(-0.5);
    for (int64_t bi = 0; bi < B; bi++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++) {
                size_t base = (size_t)(((bi * T + t) * H + h) * N);
                double norm = 0.0;
                for (int64_t j = 0; j < N; j++) {
                    kk[j] = wkvt_rng_normal(rng);
                    norm += kk[j] * kk[j];
                }
                norm = sqrt(norm);
                if (norm < 1e-12) norm = 1.0;
                for (int64_t j = 0; j < N; j++) {
                    size_t i = base + (size_t)j;
                    r[i] = (float)(0.5 * wkvt_rng_normal(rng));
                    k[i] = (float)(0.5 * wkvt_rng_normal(rng));
                    v[i] = (float)(0.5 * wkvt_rng_normal(rng));
                    double kn = kk[j] / norm;
                    double iclr = wkvt_sigmoid(1.5 * wkvt_rng_normal(rng) - 0.2);
                    a[i] = (float)(-kn);
                    b[i] = (float)(kn * iclr);
                    double z = offs[h * N + j] + wkvt_rng_normal(rng);
                    double ls = e05 * wkvt_sigmoid(z); /* decay = exp(-ls) */
                    double wv;
                    switch (form) {
                    case WKV_DECAY_DIRECT: wv = exp(-ls); break;
                    case WKV_DECAY_LOG: wv = -ls; break;
                    case WKV_DECAY_EXP_NEG_EXP: wv = log(ls); break;
                    default: wv = z; break; /* clampw */
                    }
                    w[i] = (float)wv;
                }
            }
    free(offs);
    free(kk);
}

/* ---------------------------------------------------------------------------- RWKV-6 / 4 */

/* The RWKV-6 decay range of the golden files: w_raw offsets from linspace(-6, 1, N). */
#define WKVT_RWKV6_LO (-6.0)
#define WKVT_RWKV6_HI 1.0

void wkvt_rwkv6_random(wkvt_rng* rng, uint64_t seed_offsets, wkv_decay_form form, int64_t B,
                       int64_t T, int64_t H, int64_t N, float* r, float* w, float* k, float* v,
                       float* u) {
    const double lo = WKVT_RWKV6_LO, hi = WKVT_RWKV6_HI;
    double* offs = (double*)malloc((size_t)(H * N) * sizeof *offs);
    wkvt_rng orng;
    wkvt_rng_seed(&orng, seed_offsets);
    if (!offs) { /* out of memory: plain but valid inputs */
        size_t n = (size_t)(B * T * H * N);
        for (size_t i = 0; i < n; i++) {
            r[i] = k[i] = v[i] = 0.1f;
            w[i] = (float)(form == WKV_DECAY_DIRECT ? 0.9
                           : form == WKV_DECAY_LOG ? log(0.9)
                           : form == WKV_DECAY_EXP_NEG_EXP ? log(-log(0.9))
                                                           : 0.0);
        }
        if (u)
            for (int64_t i = 0; i < H * N; i++) u[i] = 0.1f;
        return;
    }
    for (int64_t h = 0; h < H; h++) wkvt_permuted_linspace(&orng, lo, hi, N, offs + h * N);
    if (u)
        for (int64_t i = 0; i < H * N; i++) u[i] = (float)(0.5 * wkvt_rng_normal(&orng));
    for (int64_t bi = 0; bi < B; bi++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t j = 0; j < N; j++) {
                    size_t i = (size_t)(((bi * T + t) * H + h) * N + j);
                    r[i] = (float)(0.5 * wkvt_rng_normal(rng));
                    k[i] = (float)(0.5 * wkvt_rng_normal(rng));
                    v[i] = (float)(0.5 * wkvt_rng_normal(rng));
                    double raw = offs[h * N + j] + 0.5 * wkvt_rng_normal(rng);
                    double wv;
                    switch (form) {
                    case WKV_DECAY_EXP_NEG_EXP: wv = raw; break;
                    case WKV_DECAY_LOG: wv = -exp(raw); break;
                    case WKV_DECAY_DIRECT: wv = exp(-exp(raw)); break;
                    default: /* clampw reaches (0.545, 1) only: the RWKV-7 draw */
                        wv = -5.0 + 8.0 * (raw - lo) / (hi - lo) + wkvt_rng_normal(rng);
                        break;
                    }
                    w[i] = (float)wv;
                }
    free(offs);
}

void wkvt_rwkv4_random(wkvt_rng* rng, uint64_t seed_offsets, int64_t B, int64_t T, int64_t C,
                       float* w, float* u, float* k, float* v) {
    double* offs = (double*)malloc((size_t)C * sizeof *offs);
    wkvt_rng orng;
    wkvt_rng_seed(&orng, seed_offsets);
    if (w && u) {
        if (offs) wkvt_permuted_linspace(&orng, -5.0, 3.0, C, offs);
        for (int64_t c = 0; c < C; c++) {
            w[c] = (float)((offs ? offs[c] : -1.0) + 0.3 * wkvt_rng_normal(&orng));
            u[c] = (float)(log(0.3) + 0.5 * wkvt_rng_normal(&orng));
        }
    }
    free(offs);
    size_t n = (size_t)(B * T * C);
    for (size_t i = 0; i < n; i++) {
        k[i] = (float)(0.5 * wkvt_rng_normal(rng));
        v[i] = (float)(0.5 * wkvt_rng_normal(rng));
    }
}

/* float -> double copy into a new array (NULL when out of memory). */
static double* wkvt_to_f64(const float* x, size_t n) {
    double* d = (double*)malloc((n ? n : 1) * sizeof *d);
    if (d)
        for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

int wkvt_rwkv6_prefix_state(wkvt_rng* rng, uint64_t seed_offsets, wkv_decay_form form,
                            int64_t B, int64_t H, int64_t N, const float* u, int64_t prefix,
                            float* s0) {
    const size_t n = (size_t)(B * prefix * H * N), sn = (size_t)(B * H * N * N);
    float* f = (float*)malloc((4 * n + 1) * sizeof *f);
    double *d[5] = {0}, *sT = (double*)malloc(sn * sizeof *sT), *y = NULL;
    int rc = -1;
    for (size_t i = 0; i < sn; i++) s0[i] = 0.0f;
    if (!f || !sT) goto done;
    wkvt_rwkv6_random(rng, seed_offsets, form, B, prefix, H, N, f, f + n, f + 2 * n, f + 3 * n,
                      NULL);
    for (int i = 0; i < 4; i++)
        if (!(d[i] = wkvt_to_f64(f + (size_t)i * n, n))) goto done;
    if (!(d[4] = wkvt_to_f64(u, (size_t)(H * N))) || !(y = (double*)malloc((n + 1) * sizeof *y)))
        goto done;
    wkv_ref_rwkv6 in;
    in.B = B;
    in.T = prefix;
    in.H = H;
    in.N = N;
    in.decay_form = form;
    in.r = d[0];
    in.w = d[1];
    in.k = d[2];
    in.v = d[3];
    in.u = d[4];
    in.s0 = NULL;
    wkv_ref_rwkv6_forward(&in, y, sT);
    for (size_t i = 0; i < sn; i++) s0[i] = (float)sT[i];
    rc = 0;
done:
    for (int i = 0; i < 5; i++) free(d[i]);
    free(f);
    free(sT);
    free(y);
    return rc;
}

int wkvt_rwkv4_prefix_state(wkvt_rng* rng, int64_t B, int64_t C, const float* w, const float* u,
                            int64_t prefix, float* s0) {
    const size_t n = (size_t)(B * prefix * C), sn = (size_t)(B * 3 * C);
    float* f = (float*)malloc((2 * n + 1) * sizeof *f);
    double *d[4] = {0}, *sT = (double*)malloc(sn * sizeof *sT), *y = NULL;
    int rc = -1;
    for (size_t i = 0; i < sn; i++) s0[i] = (i / (size_t)C) % 3 == 2 ? -1e38f : 0.0f; /* empty */
    if (!f || !sT) goto done;
    wkvt_rwkv4_random(rng, 0, B, prefix, C, NULL, NULL, f, f + n);
    if (!(d[0] = wkvt_to_f64(w, (size_t)C)) || !(d[1] = wkvt_to_f64(u, (size_t)C)) ||
        !(d[2] = wkvt_to_f64(f, n)) || !(d[3] = wkvt_to_f64(f + n, n)) ||
        !(y = (double*)malloc((n + 1) * sizeof *y)))
        goto done;
    wkv_ref_rwkv4 in;
    in.B = B;
    in.T = prefix;
    in.C = C;
    in.w = d[0];
    in.u = d[1];
    in.k = d[2];
    in.v = d[3];
    in.s0 = NULL;
    wkv_ref_rwkv4_forward(&in, y, sT);
    for (size_t i = 0; i < sn; i++) s0[i] = (float)sT[i];
    rc = 0;
done:
    for (int i = 0; i < 4; i++) free(d[i]);
    free(f);
    free(sT);
    free(y);
    return rc;
}
