/* Softmax attention on the CPU (attention.cpp): the kernel and its configuration list. */
#ifndef WKV_BACKENDS_CPU_ATTENTION_H
#define WKV_BACKENDS_CPU_ATTENTION_H

#include "cpu_internal.h"

namespace wkv_cpu {

/* The largest head dim the CPU attention kernels take (forward and backward). */
constexpr int64_t kAttnMaxHeadDim = 256;

/* Rows of q, v, the accumulators and the gradients are Dp floats in scratch: D rounded up to 16
 * (every vector width), zeros after D, so the vector steps need no tails along D. */
inline int64_t attn_padded_dim(int64_t D) { return (D + 15) / 16 * 16; }

/* One key block against a tile's rows (attention.cpp): q [rows][Dp] (scaled, zero past D), kt
 * the block's keys transposed, D rows of kt_stride floats of which the first bc are readable
 * (columns past nb hold anything, even NaN), vb [nb][Dp] (zero past D), seen[r] the keys of
 * the block row r sees (<= nb), p_rows [2][bc] scratch; updates the rows' running max m, sum l
 * and accumulator acc [rows][Dp]. Returns false where the function has no kernel for bc (the
 * caller runs the scalar step). */
using AttnBlockFn = bool (*)(const float* q, int64_t rows, int64_t Dp, int64_t D, const float* kt,
                             int64_t kt_stride, const float* vb, int64_t nb, int64_t bc, const int64_t* seen,
                             float* p_rows, float* acc, float* m, float* l);

/* The block step with bf16 dot products (AVX-512 BF16, for bf16 q and k): as AttnBlockFn, but
 * q as qp [rows][Dh] and the keys as ktp [Dh][kt_stride], each a 32-bit pair of bf16 values
 * (elements 2i, 2i + 1; a zero after an odd D), q not scaled: scores = scale * (q . k), the
 * products exact, summed in float32. */
using AttnBlockBf16Fn = bool (*)(const uint32_t* qp, int64_t rows, int64_t Dh, int64_t Dp, const uint32_t* ktp,
                                 int64_t kt_stride, const float* vb, int64_t nb, int64_t bc, const int64_t* seen,
                                 float scale, float* p_rows, float* acc, float* m, float* l);

/* The same step for a tile of a row or two (a decode step, Tq = 1), with the keys as rows: no
 * transposition, which would cost more than such a tile's scores. Key j is kb + j * k_stride,
 * value j is vb + j * v_stride, D floats each (only those are read); the rest as AttnBlockFn,
 * p_rows holding >= nb floats. Returns false where the function has no kernel for D (the caller
 * runs the scalar step). */
using AttnRowsFn = bool (*)(const float* q, int64_t rows, int64_t Dp, int64_t D, const float* kb, int64_t k_stride,
                            const float* vb, int64_t v_stride, int64_t nb, const int64_t* seen, float* p_rows,
                            float* acc, float* m, float* l);

/* The backward's steps (attention_backward.cpp) for a group of query rows against one key block
 * of bc keys. Rows of q (scaled), dout, dk, dv, dq and krows are Dp floats (zeros past D); kt and
 * vt are the block's keys and values transposed, D rows of kt_stride floats of which bc are
 * readable (zeros past the block's keys); p and ds are [rows][bc]. Each returns false where it has
 * no kernel for bc (the caller runs the scalar step).
 *   probs: p[r][j] = exp(q_r . k_j - lse[r]) and ds[r][j] = p[r][j] (dout_r . v_j - delta[r]) for
 *          j < seen[r], 0 for the other j < bc (rows with lse = -inf: seen[r] is 0).
 *   kv:    dkt[d][j] += sum_r ds[r][j] q_r[d], dvt[d][j] += sum_r p[r][j] dout_r[d] for d < Dp,
 *          j < bc: dk and dv transposed, Dp rows of bc floats (outer products of a row of ds or
 *          p, bc keys wide, with one broadcast element of q or dout; the columns past the
 *          block's nb keys gain zeros).
 *   q:     dq[r] += sum_{j < nb} ds[r][j] krows[j]. */
using AttnBwdProbsFn = bool (*)(const float* q, const float* dout, int64_t rows, int64_t Dp, int64_t D,
                                const float* kt, const float* vt, int64_t kt_stride, int64_t bc, const float* lse,
                                const float* delta, const int64_t* seen, float* p, float* ds);
using AttnBwdKvFn = bool (*)(const float* q, const float* dout, int64_t rows, int64_t Dp, const float* p,
                             const float* ds, int64_t bc, float* dkt, float* dvt);
using AttnBwdQFn = bool (*)(const float* ds, int64_t rows, int64_t Dp, const float* krows, int64_t nb, int64_t bc,
                            float* dq);
struct AttnBwdFns {
    AttnBwdProbsFn probs = nullptr; /* NULL: the scalar steps */
    AttnBwdKvFn kv = nullptr;
    AttnBwdQFn q = nullptr;
};

/* wkv_backend_iface.attention_configs: fills min(capacity, total) entries, returns the total. */
int32_t attention_configs(wkv_attention_config* out, int32_t capacity) noexcept;
/* wkv_backend_iface.attention for a validated problem; `block` and `rows` are the path's vector
 * steps (NULL: the scalar ones), block_bf16 its bf16-dot step (NULL: none; bf16 inputs then take
 * `block` after conversion). */
wkv_status attention(const BackendState& st, AttnBlockFn block, AttnRowsFn rows, AttnBlockBf16Fn block_bf16,
                     const wkv_attention_problem* p, wkv_message* msg) noexcept;

/* wkv_backend_iface.attention_backward for a validated problem, with the path's vector steps. */
wkv_status attention_backward(const BackendState& st, const AttnBwdFns& fns, const wkv_attention_backward_problem* p,
                              wkv_message* msg) noexcept;

} // namespace wkv_cpu

#endif
