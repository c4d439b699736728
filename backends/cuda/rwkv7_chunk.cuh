/* What the chunked RWKV-7 forward (rwkv7_chunk.cu) and backward (rwkv7_chunk_bwd.cu) share:
 * the per-chunk workspace layout the forward's local and state kernels fill (and the backward
 * recomputes into its own workspace), the CLAMPW log decay, the right-looking solve step, the
 * C x C products of a 2 x 2 tile, and the walk over chunk states (its update, its state rows). */
#ifndef WKV_BACKENDS_CUDA_RWKV7_CHUNK_CUH
#define WKV_BACKENDS_CUDA_RWKV7_CHUNK_CUH

#include <cuda_runtime.h>

#include "cuda_internal.h"

namespace wkv_cuda {
namespace chunk {

/* Workspace of one chunk, in floats: WZ [N][2C] (w_t then z_t, column j = key index), Bh [C][N],
 * Yl [C][N] (yl_t, column = value row), L [N][N], gamma [N]. */
template <int N, int C>
struct ChunkWs {
    static constexpr size_t WZ = 0, BH = WZ + 2 * N * C, YL = BH + (size_t)C * N, L = YL + (size_t)C * N,
                            GM = L + (size_t)N * N, FLOATS = GM + N;
    static_assert(FLOATS % 4 == 0, "chunk workspace must keep float4 alignment");
};

__device__ __forceinline__ float clampw_log_decay(float w) {
    /* log of decay_of's CLAMPW value: -exp(-1/2) sigmoid(w), sigmoid as decay_of computes it */
    const float z = expf(-fabsf(w));
    const float inv = 1.0f / (1.0f + z);
    const float sig = w >= 0.0f ? inv : z * inv;
    return -0.60653065971263342f * sig;
}

/* x[t] += row[t] f for t in [lo, C); row 16-byte aligned. Called from fully unrolled loops, so
 * lo is a constant there and the skipped groups and lanes cost nothing. */
template <int C>
__device__ __forceinline__ void axpy_row(float (&x)[C], const float* row, float f, int lo) {
#pragma unroll
    for (int k = 0; k < C / 4; ++k) {
        if (4 * k + 3 < lo) continue;
        const float4 a = reinterpret_cast<const float4*>(row)[k];
        if (4 * k >= lo) x[4 * k] = fmaf(a.x, f, x[4 * k]);
        if (4 * k + 1 >= lo) x[4 * k + 1] = fmaf(a.y, f, x[4 * k + 1]);
        if (4 * k + 2 >= lo) x[4 * k + 2] = fmaf(a.z, f, x[4 * k + 2]);
        x[4 * k + 3] = fmaf(a.w, f, x[4 * k + 3]);
    }
}

/* The four C x C products of a 2 x 2 tile of (t, s), t in {ti, ti + C/2}, s in {si, si + C/2}:
 * acc[0] = X0_t . Y0_s, acc[1] = X0_t . Y1_s, acc[2] = X1_t . Y0_s, acc[3] = X1_t . Y1_s over
 * N, rows NP floats apart (16-byte aligned). The quarter with t < C/2 <= s lies above the
 * diagonal, where every caller keeps zeros: it is not computed (left 0). */
template <int N, int C, int NP>
__device__ __forceinline__ void tile_products(const float* X0, const float* X1, const float* Y0,
                                              const float* Y1, int ti, int si, float (&acc)[4][2][2]) {
    constexpr int HC = C / 2;
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
        for (int x = 0; x < 2; ++x) acc[m][x][0] = acc[m][x][1] = 0.0f;
#pragma unroll 4
    for (int j = 0; j < N; j += 4) {
        float4 x0[2], x1[2], y0[2], y1[2];
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            x0[x] = *reinterpret_cast<const float4*>(X0 + (ti + x * HC) * NP + j);
            x1[x] = *reinterpret_cast<const float4*>(X1 + (ti + x * HC) * NP + j);
            y0[x] = *reinterpret_cast<const float4*>(Y0 + (si + x * HC) * NP + j);
            y1[x] = *reinterpret_cast<const float4*>(Y1 + (si + x * HC) * NP + j);
        }
#pragma unroll
        for (int x = 0; x < 2; ++x)
#pragma unroll
            for (int y = 0; y < 2; ++y) {
                if (x == 0 && y == 1) continue;
                acc[0][x][y] = fmaf(x0[x].x, y0[y].x, fmaf(x0[x].y, y0[y].y, fmaf(x0[x].z, y0[y].z, fmaf(x0[x].w, y0[y].w, acc[0][x][y]))));
                acc[1][x][y] = fmaf(x0[x].x, y1[y].x, fmaf(x0[x].y, y1[y].y, fmaf(x0[x].z, y1[y].z, fmaf(x0[x].w, y1[y].w, acc[1][x][y]))));
                acc[2][x][y] = fmaf(x1[x].x, y0[y].x, fmaf(x1[x].y, y0[y].y, fmaf(x1[x].z, y0[y].z, fmaf(x1[x].w, y0[y].w, acc[2][x][y]))));
                acc[3][x][y] = fmaf(x1[x].x, y1[y].x, fmaf(x1[x].y, y1[y].y, fmaf(x1[x].z, y1[y].z, fmaf(x1[x].w, y1[y].w, acc[3][x][y]))));
            }
    }
}

/* A walk over chunk states (the forward's S, the backward's dS), one chunk, for the thread's SC
 * columns q SC .. q SC + SC - 1 of one row: S <- S o gamma + sum_t P[t] M[t] + L, and the new
 * row into srow. gm: gamma [N]; lrow: L's row [N]; prow: P's row [C]; M: [C][N]. */
template <int N, int C, int SC>
__device__ __forceinline__ void walk_update(float (&S)[SC], const float* gm, const float* lrow,
                                            const float* prow, const float* M, int q, float* srow) {
    float acc[SC], acc2[SC];
#pragma unroll
    for (int x = 0; x < SC; x += 4) {
        const float4 g = *reinterpret_cast<const float4*>(gm + q * SC + x);
        const float4 l = *reinterpret_cast<const float4*>(lrow + q * SC + x);
        acc[x] = fmaf(S[x], g.x, l.x);
        acc[x + 1] = fmaf(S[x + 1], g.y, l.y);
        acc[x + 2] = fmaf(S[x + 2], g.z, l.z);
        acc[x + 3] = fmaf(S[x + 3], g.w, l.w);
        acc2[x] = acc2[x + 1] = acc2[x + 2] = acc2[x + 3] = 0.0f;
    }
#pragma unroll 4
    for (int t = 0; t < C; t += 2) {
        const float p0 = prow[t], p1 = prow[t + 1];
#pragma unroll
        for (int x = 0; x < SC; x += 4) {
            const float4 m0 = *reinterpret_cast<const float4*>(M + t * N + q * SC + x);
            const float4 m1 = *reinterpret_cast<const float4*>(M + (t + 1) * N + q * SC + x);
            acc[x] = fmaf(p0, m0.x, acc[x]);
            acc[x + 1] = fmaf(p0, m0.y, acc[x + 1]);
            acc[x + 2] = fmaf(p0, m0.z, acc[x + 2]);
            acc[x + 3] = fmaf(p0, m0.w, acc[x + 3]);
            acc2[x] = fmaf(p1, m1.x, acc2[x]);
            acc2[x + 1] = fmaf(p1, m1.y, acc2[x + 1]);
            acc2[x + 2] = fmaf(p1, m1.z, acc2[x + 2]);
            acc2[x + 3] = fmaf(p1, m1.w, acc2[x + 3]);
        }
    }
#pragma unroll
    for (int x = 0; x < SC; ++x) {
        S[x] = acc[x] + acc2[x];
        srow[q * SC + x] = S[x];
    }
}

/* A walk's state row i of (sequence s, head h), columns q SC .. q SC + SC - 1, from a float32
 * state view (zeros without one) and back to one (nothing without one). */
template <int SC>
__device__ __forceinline__ void load_state_row(const DevView& v, int64_t s, int64_t h, int i, int q,
                                               float (&S)[SC]) {
    const float* src = reinterpret_cast<const float*>(v.data);
#pragma unroll
    for (int x = 0; x < SC; ++x)
        S[x] = src ? src[s * v.s[0] + h * v.s[1] + (int64_t)i * v.s[2] + (int64_t)(q * SC + x) * v.s[3]] : 0.0f;
}
template <int SC>
__device__ __forceinline__ void store_state_row(const DevView& v, int64_t s, int64_t h, int i, int q,
                                                const float (&S)[SC]) {
    if (!v.data) return;
    float* dst = reinterpret_cast<float*>(v.data);
#pragma unroll
    for (int x = 0; x < SC; ++x)
        dst[s * v.s[0] + h * v.s[1] + (int64_t)i * v.s[2] + (int64_t)(q * SC + x) * v.s[3]] = S[x];
}

} // namespace chunk
} // namespace wkv_cuda

#endif
