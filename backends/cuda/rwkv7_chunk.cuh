/* What the chunked RWKV-7 forward (rwkv7_chunk.cu) and backward (rwkv7_chunk_bwd.cu) share:
 * the per-chunk workspace layout the forward's local and state kernels fill (and the backward
 * recomputes into its own workspace), the CLAMPW log decay, and the right-looking solve step. */
#ifndef WKV_BACKENDS_CUDA_RWKV7_CHUNK_CUH
#define WKV_BACKENDS_CUDA_RWKV7_CHUNK_CUH

#include <cuda_runtime.h>

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

} // namespace chunk
} // namespace wkv_cuda

#endif
