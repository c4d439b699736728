/* Softmax attention on the CPU (attention.cpp): the kernel and its configuration list. */
#ifndef WKV_BACKENDS_CPU_ATTENTION_H
#define WKV_BACKENDS_CPU_ATTENTION_H

#include "cpu_internal.h"

namespace wkv_cpu {

/* One key block against a tile's rows (attention.cpp): q [rows][Dp] (scaled, zero past D), kt
 * the block's keys transposed, D rows of kt_stride floats of which the first bc are readable
 * (columns past nb hold anything, even NaN), vb [nb][Dp] (zero past D), seen[r] the keys of
 * the block row r sees (<= nb), p_rows [2][bc] scratch; updates the rows' running max m, sum l
 * and accumulator acc [rows][Dp]. Returns false where the function has no kernel for bc (the
 * caller runs the scalar step). */
using AttnBlockFn = bool (*)(const float* q, int64_t rows, int64_t Dp, int64_t D, const float* kt,
                             int64_t kt_stride, const float* vb, int64_t nb, int64_t bc, const int64_t* seen,
                             float* p_rows, float* acc, float* m, float* l);

/* The same step for a tile of a row or two (a decode step, Tq = 1), with the keys as rows: no
 * transposition, which would cost more than such a tile's scores. Key j is kb + j * k_stride,
 * value j is vb + j * v_stride, D floats each (only those are read); the rest as AttnBlockFn,
 * p_rows holding >= nb floats. Returns false where the function has no kernel for D (the caller
 * runs the scalar step). */
using AttnRowsFn = bool (*)(const float* q, int64_t rows, int64_t Dp, int64_t D, const float* kb, int64_t k_stride,
                            const float* vb, int64_t v_stride, int64_t nb, const int64_t* seen, float* p_rows,
                            float* acc, float* m, float* l);

/* wkv_backend_iface.attention_configs: fills min(capacity, total) entries, returns the total. */
int32_t attention_configs(wkv_attention_config* out, int32_t capacity) noexcept;
/* wkv_backend_iface.attention for a validated problem; `block` and `rows` are the path's vector
 * steps (NULL: the scalar ones). */
wkv_status attention(const BackendState& st, AttnBlockFn block, AttnRowsFn rows, const wkv_attention_problem* p,
                     wkv_message* msg) noexcept;

} // namespace wkv_cpu

#endif
