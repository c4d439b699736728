/* Strided, dtype-converting loads and stores for the CPU backend.
 *
 * A wkv_view is a base pointer, an element type and four strides in elements (any int64: 0
 * broadcasts, negative walks backwards). These helpers move one row along the last axis
 * (stride[3]) between a view and a contiguous float32 array. Every element access goes through
 * memcpy, so a tensor whose base is not aligned to its element size is still read correctly;
 * compilers turn the small memcpys into plain loads and stores. 16-bit values are converted with
 * half.h (round-to-nearest-even on store). */
#ifndef WKV_BACKENDS_CPU_TENSOR_ACCESS_H
#define WKV_BACKENDS_CPU_TENSOR_ACCESS_H

#include <cstdint>
#include <cstring>

#include "backend.h"
#include "half.h"

namespace wkv_cpu {

/* Element offset (in elements) of logical index (i0, i1, i2, 0). */
inline int64_t view_offset(const wkv_view& v, int64_t i0, int64_t i1, int64_t i2) noexcept {
    return i0 * v.stride[0] + i1 * v.stride[1] + i2 * v.stride[2];
}

inline bool view_present(const wkv_view& v) noexcept { return v.data != nullptr; }

/* n 16-bit values at src, st elements apart (any alignment), as floats. The contiguous case
 * is a loop of its own: the compiler vectorises it (half.h's conversions have no branches). */
template <bool kBf16>
inline void load_row16(const char* src, int64_t n, int64_t st, float* __restrict dst) noexcept {
    const auto cvt = [](uint16_t h) { return kBf16 ? wkv_bf16_to_f32(h) : wkv_f16_to_f32(h); };
    uint16_t h;
    if (st == 1)
        for (int64_t j = 0; j < n; ++j) std::memcpy(&h, src + j * 2, 2), dst[j] = cvt(h);
    else
        for (int64_t j = 0; j < n; ++j) std::memcpy(&h, src + j * st * 2, 2), dst[j] = cvt(h);
}

/* dst[j] = float(v[off + j * stride[3]]) for j in [0, n). */
inline void load_row(const wkv_view& v, int64_t off, int64_t n, float* dst) noexcept {
    const int64_t st = v.stride[3];
    const char* base = v.data;
    switch (v.elem) {
    case WKV_ELEM_F32:
        if (st == 1) {
            std::memcpy(dst, base + off * 4, (size_t)n * 4);
        } else {
            for (int64_t j = 0; j < n; ++j) std::memcpy(&dst[j], base + (off + j * st) * 4, 4);
        }
        return;
    case WKV_ELEM_F16:
        load_row16<false>(base + off * 2, n, st, dst);
        return;
    case WKV_ELEM_BF16:
        load_row16<true>(base + off * 2, n, st, dst);
        return;
    }
}

/* v[off + j * stride[3]] = src[j] (converted to the view's type) for j in [0, n). */
inline void store_row(const wkv_view& v, int64_t off, int64_t n, const float* src) noexcept {
    const int64_t st = v.stride[3];
    char* base = v.data;
    switch (v.elem) {
    case WKV_ELEM_F32:
        if (st == 1) {
            std::memcpy(base + off * 4, src, (size_t)n * 4);
        } else {
            for (int64_t j = 0; j < n; ++j) std::memcpy(base + (off + j * st) * 4, &src[j], 4);
        }
        return;
    case WKV_ELEM_F16:
        for (int64_t j = 0; j < n; ++j) {
            const uint16_t h = wkv_f32_to_f16(src[j]);
            std::memcpy(base + (off + j * st) * 2, &h, 2);
        }
        return;
    case WKV_ELEM_BF16:
        for (int64_t j = 0; j < n; ++j) {
            const uint16_t h = wkv_f32_to_bf16(src[j]);
            std::memcpy(base + (off + j * st) * 2, &h, 2);
        }
        return;
    }
}

/* Per-token row [b, t, h, :] of a per-token view. */
inline void load_token(const wkv_view& v, int64_t b, int64_t t, int64_t h, int64_t n,
                       float* dst) noexcept {
    load_row(v, view_offset(v, b, t, h), n, dst);
}

inline void store_token(const wkv_view& v, int64_t b, int64_t t, int64_t h, int64_t n,
                        const float* src) noexcept {
    store_row(v, view_offset(v, b, t, h), n, src);
}

/* An N x N state slice [s, h, :, :] <-> a contiguous row-major float32 matrix M[i][j]
 * (i = value row, j = key column; a key-major layout is already folded into the strides).
 * An absent view loads as zeros. */
inline void load_state(const wkv_view& v, int64_t s, int64_t h, int64_t n, float* m) noexcept {
    if (!view_present(v)) {
        for (int64_t x = 0; x < n * n; ++x) m[x] = 0.0f;
        return;
    }
    const int64_t base = v.stride[0] * s + v.stride[1] * h;
    for (int64_t i = 0; i < n; ++i) load_row(v, base + i * v.stride[2], n, m + i * n);
}

inline void store_state(const wkv_view& v, int64_t s, int64_t h, int64_t n,
                        const float* m) noexcept {
    if (!view_present(v)) return;
    const int64_t base = v.stride[0] * s + v.stride[1] * h;
    for (int64_t i = 0; i < n; ++i) store_row(v, base + i * v.stride[2], n, m + i * n);
}

} // namespace wkv_cpu

#endif
