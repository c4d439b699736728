/* Small helpers shared by wkv-bench and the tests: names of enums, dtype conversion, error
 * norms, a timer, a seeded random generator and realistic RWKV-7, RWKV-6 and RWKV-4 inputs. */
#ifndef WKV_TOOLS_WKV_TOOLS_H
#define WKV_TOOLS_WKV_TOOLS_H

#include <stddef.h>
#include <stdint.h>

#include "wkv/wkv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ----------------------------------------------------------------------- names, parsing */

/* "f32", "f16", "bf16"; "?" for anything else. */
const char* wkvt_dtype_name(wkv_dtype dtype);
/* Accepts f32|float32|fp32, f16|float16|fp16|half, bf16|bfloat16. Returns 0 on success. */
int wkvt_dtype_parse(const char* s, wkv_dtype* out);
/* Bytes per element of f32/f16/bf16; 0 for anything else. */
size_t wkvt_dtype_size(wkv_dtype dtype);
int wkvt_dtype_equal(wkv_dtype a, wkv_dtype b);
/* Bit of wkv_backend_info.dtypes for this dtype (0 when it has none). */
uint32_t wkvt_dtype_bit(wkv_dtype dtype);

/* "auto", "cpu", "cuda", "vulkan"; "?" otherwise. */
const char* wkvt_backend_name(wkv_backend backend);
int wkvt_backend_parse(const char* s, wkv_backend* out);

/* "rwkv7", "rwkv6", "rwkv4"; parse also accepts "wkv7", "7", ... */
const char* wkvt_op_name(wkv_op op);
int wkvt_op_parse(const char* s, wkv_op* out);

/* "direct", "log", "exp_neg_exp", "clampw". */
const char* wkvt_decay_form_name(wkv_decay_form form);
int wkvt_decay_form_parse(const char* s, wkv_decay_form* out);

/* Parses a decimal integer in [lo, hi] (whole string). Returns 0 on success. */
int wkvt_parse_i64(const char* s, int64_t lo, int64_t hi, int64_t* out);

/* --------------------------------------------------------------------------- conversion */

/* dst[i] = src[i] converted (round-to-nearest-even) to dtype f32/f16/bf16. */
void wkvt_store_f32(const float* src, void* dst, wkv_dtype dtype, size_t n);
/* dst[i] = the value of element i of a f32/f16/bf16 buffer. */
void wkvt_load_f64(const void* src, wkv_dtype dtype, double* dst, size_t n);
void wkvt_load_f32(const void* src, wkv_dtype dtype, float* dst, size_t n);
/* x[i] = x[i] rounded to dtype and back (no-op for f32). */
void wkvt_round_f32(float* x, wkv_dtype dtype, size_t n);
/* Fills n elements of dtype with a quiet NaN. */
void wkvt_fill_nan(void* dst, wkv_dtype dtype, size_t n);

/* ------------------------------------------------------------------------------ numerics */

/* ||out - ref||_2 / ||ref||_2 over n elements; the absolute ||out - ref||_2 when ref is all
 * zero. INFINITY when out holds a NaN or an infinity (a non-finite ref is compared as is). */
double wkvt_rel_err(const double* out, const double* ref, size_t n);

/* --------------------------------------------------------------------------------- timing */

/* Seconds from CLOCK_MONOTONIC. */
double wkvt_now(void);

/* ---------------------------------------------------------------------------- randomness */

typedef struct wkvt_rng {
    uint64_t s[4];
    int have_spare;
    double spare;
} wkvt_rng;

void wkvt_rng_seed(wkvt_rng* rng, uint64_t seed);
uint64_t wkvt_rng_u64(wkvt_rng* rng);
double wkvt_rng_uniform(wkvt_rng* rng); /* [0, 1) */
double wkvt_rng_normal(wkvt_rng* rng);  /* N(0, 1) */

/* Fills r, w, k, v, a, b (each [B,T,H,N] float32, contiguous) the way the golden files and
 * RWKV-7 models look: r, k, v ~ N(0, 0.5^2); kk = normalize(N(0,1)) per head and token,
 * iclr = sigmoid(1.5 N(0,1) - 0.2), a = -kk, b = kk * iclr; the decay is
 * exp(-e^-0.5 sigmoid(z)) in (0.545, 1) with z = (a per-head permutation of
 * linspace(-5, 3, N)) + N(0,1), and w is that decay written in `form`. The per-channel
 * offsets come from seed_offsets alone (a layer's fixed decay bias), so a sequence generated
 * in pieces (prefill, then one token at a time) keeps them: pass the same seed_offsets. */
void wkvt_rwkv7_random(wkvt_rng* rng, uint64_t seed_offsets, wkv_decay_form form, int64_t B,
                       int64_t T, int64_t H, int64_t N, float* r, float* w, float* k, float* v,
                       float* a, float* b);

/* Fills r, w, k, v ([B,T,H,N] float32, contiguous) and, when not NULL, the bonus u [H,N] the
 * way the golden files draw RWKV-6 inputs: r, k, v ~ N(0, 0.5^2), u ~ N(0, 0.5^2); the decay is
 * exp(-exp(w_raw)), from ~1e-6 to 0.999, with w_raw = (a per-head permutation of
 * linspace(-6, 1, N)) + 0.5 N(0,1), and w is that decay written in `form` (exp_neg_exp:
 * w_raw; log: -exp(w_raw); direct: the decay; clampw, which reaches only (0.545, 1): the
 * RWKV-7 draw, -5 + 8 (w_raw + 6) / 7 + N(0,1)). The offsets and u come from seed_offsets
 * alone (a layer's parameters); everything else from rng. */
void wkvt_rwkv6_random(wkvt_rng* rng, uint64_t seed_offsets, wkv_decay_form form, int64_t B,
                       int64_t T, int64_t H, int64_t N, float* r, float* w, float* k, float* v,
                       float* u);

/* RWKV-4 inputs as the golden files draw them: when w and u are not NULL, w (time_decay) [C] =
 * (a permutation of linspace(-5, 3, C)) + 0.3 N(0,1) and u (time_first) [C] = log 0.3 +
 * 0.5 N(0,1), from seed_offsets alone; k, v [B,T,C] ~ N(0, 0.5^2) from rng. */
void wkvt_rwkv4_random(wkvt_rng* rng, uint64_t seed_offsets, int64_t B, int64_t T, int64_t C,
                       float* w, float* u, float* k, float* v);

/* A realistic initial state, as the golden files' s0: the state after a `prefix`-token run of
 * fresh inputs (drawn as above, from rng) from the zero / empty state, through the float64
 * reference, rounded to float32. RWKV-6: s0 [B,H,N,N], with the layer's u [H,N] and decay
 * offsets (seed_offsets, form); RWKV-4: s0 [B,3,C] planar (aa, bb, pp), with the layer's w
 * and u [C]. Return 0, or -1 when out of memory (then s0 is the zero / empty state). */
int wkvt_rwkv6_prefix_state(wkvt_rng* rng, uint64_t seed_offsets, wkv_decay_form form,
                            int64_t B, int64_t H, int64_t N, const float* u, int64_t prefix,
                            float* s0);
int wkvt_rwkv4_prefix_state(wkvt_rng* rng, int64_t B, int64_t C, const float* w, const float* u,
                            int64_t prefix, float* s0);

#ifdef __cplusplus
}
#endif

#endif /* WKV_TOOLS_WKV_TOOLS_H */
