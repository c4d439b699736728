/* Softmax attention forward on CUDA (wkv.h, attention), device code: the portable SIMT kernel
 * cuda.simt.q16.kv32, online softmax in float32, every dtype, D <= 256, strided views, grouped
 * heads, causal (bottom-right aligned per sequence), packed sequences.
 *
 * A block is (tile of kAttnRows = 16 query rows of one sequence, query head): 4 warps of 4 rows
 * each. Per block of 32 keys the block stages K (rows padded to D + 1 floats: lane j reads key j
 * at a fixed d, so the 32 lanes hit 32 banks) and V (rows of 32 * DPL floats, zeros past D) in
 * shared memory as float32; then each warp, for each of its rows, has lane j score key j
 * (s = q . k_j over D, q broadcast from shared memory), takes the warp's max and sum by
 * shuffles, rescales its accumulator (lane l owns d = l + 32 e, e < DPL) by exp(m_old - m_new)
 * and adds p_j v_j with p_j broadcast by shuffle. A row that sees no key keeps m = -inf, l = 0:
 * o = 0, lse = -inf. No atomics: the result does not depend on the launch.
 *
 * It is the correctness baseline: scalar FMAs, no tensor cores (the mma / wgmma kernels are
 * the next configurations of the registry). */
#ifndef WKV_BACKENDS_CUDA_ATTENTION_KERNEL_CUH
#define WKV_BACKENDS_CUDA_ATTENTION_KERNEL_CUH

/* Included by attention.cu, and by the CPU emulation test (backends/cuda/tests/emu), which
 * defines WKV_CUDA_EMULATION and provides the CUDA built-ins and elem:: on the host. */
#ifndef WKV_CUDA_EMULATION
#include <cuda_runtime.h>

#include "cuda_elem.cuh"
#define WKV_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#endif
#include <cmath>

#include "cuda_internal.h"

namespace wkv_cuda {
namespace attn {

constexpr int kAttnRows = 16;   /* query rows per block */
constexpr int kAttnKeys = 32;   /* keys per shared-memory block: one per lane */
constexpr int kAttnWarps = 4;
constexpr int kRowsPerWarp = kAttnRows / kAttnWarps;

/* Floats per lane of a row of D (<= kAttnMaxD) accumulators: D <= 32 * attn_dpl(D). */
__host__ __device__ constexpr int attn_dpl(int D) { return D <= 64 ? 2 : D <= 128 ? 4 : 8; }

/* Dynamic shared memory of attn_fwd_simt at head dim D: q, K padded to D + 1, V to 32 DPL. */
__host__ __device__ constexpr size_t attn_simt_smem_bytes(int D) {
    return sizeof(float) * ((size_t)kAttnRows * D + (size_t)kAttnKeys * (D + 1) + (size_t)kAttnKeys * 32 * attn_dpl(D));
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ int64_t offset(const DevView& v, int64_t b, int64_t t, int64_t h, int64_t d) {
    return b * v.s[0] + t * v.s[1] + h * v.s[2] + d * v.s[3];
}

/* Batch, query rows [q0, q1), keys [k0, k1) and tile index within its sequence of a launch's
 * tile `tile_all` (AttnSeqs). */
__device__ __forceinline__ void attn_locate(const AttnSeqs& q, const AttnShape& sh, int64_t tile_all, int64_t* b,
                                            int64_t* q0, int64_t* q1, int64_t* k0, int64_t* k1, int64_t* tile) {
    int local = 0;
    if (q.packed) {
        while (local + 1 < q.count && q.tiles_before[local + 1] <= tile_all) ++local;
        *tile = tile_all - q.tiles_before[local];
        *b = 0;
        *q0 = q.q_off[local], *q1 = q.q_off[local + 1];
        *k0 = q.k_off[local], *k1 = q.k_off[local + 1];
    } else {
        local = (int)(tile_all / q.tiles_per_seq);
        *tile = tile_all % q.tiles_per_seq;
        *b = q.first + local;
        *q0 = 0, *q1 = sh.Tq, *k0 = 0, *k1 = sh.Tk;
    }
}

/* The last key row `row` sees: every key of its sequence, or (causal, bottom-right aligned)
 * up to row + (k1 - k0) - (q1 - q0); below k0 when it sees none. */
__device__ __forceinline__ int64_t attn_last_key(const AttnShape& sh, int64_t row, int64_t q0, int64_t q1,
                                                 int64_t k0, int64_t k1) {
    return sh.causal ? elem::min64(k1 - 1, k0 + (row - q0) + (k1 - k0) - (q1 - q0)) : k1 - 1;
}

/* DPL: accumulator floats per lane (D <= 32 * DPL). */
template <int DPL>
__global__ void __launch_bounds__(kAttnWarps * 32) attn_fwd_simt(const AttnFwdParams p) {
    WKV_DYNAMIC_SHARED(float, smem);
    constexpr int Dv = 32 * DPL;
    const AttnShape& sh = p.sh;
    const int D = sh.D, Dk = sh.D + 1;
    float* q_s = smem;                      /* [kAttnRows][D], scaled */
    float* k_s = q_s + kAttnRows * D;       /* [kAttnKeys][D + 1] */
    float* v_s = k_s + kAttnKeys * Dk;      /* [kAttnKeys][Dv], zeros past D */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    /* which sequence, tile and head */
    const int64_t h = blockIdx.x % sh.Hq;
    int64_t b, q0, q1, k0, k1, tile;
    attn_locate(p.seq, sh, blockIdx.x / sh.Hq, &b, &q0, &q1, &k0, &k1, &tile);
    const int64_t r0 = q0 + tile * kAttnRows;
    const int64_t r1 = elem::min64(q1, r0 + kAttnRows);
    const int64_t g = h / (sh.Hq / sh.Hkv);
    /* keys [k0, kend) reach some row of the tile (causal: the last row sees the most) */
    const int64_t kend = attn_last_key(sh, r1 - 1, q0, q1, k0, k1) + 1;

    for (int i = tid; i < kAttnRows * D; i += blockDim.x) {
        const int r = i / D, d = i % D;
        q_s[i] = r0 + r < r1 ? elem::load(p.q, offset(p.q, b, r0 + r, h, d)) * sh.scale : 0.0f;
    }
    for (int i = tid; i < kAttnKeys * Dv; i += blockDim.x)
        if (i % Dv >= D) v_s[i] = 0.0f;

    float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][DPL];
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        m[rr] = -INFINITY;
        l[rr] = 0.0f;
#pragma unroll
        for (int e = 0; e < DPL; ++e) acc[rr][e] = 0.0f;
    }

    for (int64_t j0 = k0; j0 < kend; j0 += kAttnKeys) {
        __syncthreads(); /* the previous block's reads are done (and q_s, the pads written) */
        for (int i = tid; i < kAttnKeys * D; i += blockDim.x) {
            const int j = i / D, d = i % D;
            const int64_t key = j0 + j;
            const bool in = key < kend;
            k_s[j * Dk + d] = in ? elem::load(p.k, offset(p.k, b, key, g, d)) : 0.0f;
            v_s[j * Dv + d] = in ? elem::load(p.v, offset(p.v, b, key, g, d)) : 0.0f;
        }
        __syncthreads();
        const int64_t key = j0 + lane;
#pragma unroll
        for (int rr = 0; rr < kRowsPerWarp; ++rr) {
            const int r = warp * kRowsPerWarp + rr;
            const int64_t row = r0 + r;
            if (row >= r1) continue; /* warp-uniform */
            const int64_t last = attn_last_key(sh, row, q0, q1, k0, k1);
            const float* qr = q_s + r * D;
            const float* kj = k_s + lane * Dk;
            float s = 0.0f;
            for (int d = 0; d < D; ++d) s = fmaf(qr[d], kj[d], s);
            const bool valid = key <= last && key < kend;
            s = valid ? s : -INFINITY;
            const float m_new = fmaxf(m[rr], warp_max(s));
            if (m_new == -INFINITY) continue; /* no key seen yet: nothing to add (warp-uniform) */
            const float pj = valid ? expf(s - m_new) : 0.0f;
            const float corr = m[rr] == -INFINITY ? 0.0f : expf(m[rr] - m_new);
            l[rr] = l[rr] * corr + warp_sum(pj);
            m[rr] = m_new;
#pragma unroll
            for (int e = 0; e < DPL; ++e) acc[rr][e] *= corr;
            for (int jj = 0; jj < kAttnKeys; ++jj) {
                const float pb = __shfl_sync(0xffffffffu, pj, jj);
                const float* vr = v_s + jj * Dv + lane;
#pragma unroll
                for (int e = 0; e < DPL; ++e) acc[rr][e] = fmaf(pb, vr[32 * e], acc[rr][e]);
            }
        }
    }

#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const int64_t row = r0 + warp * kRowsPerWarp + rr;
        if (row >= r1) continue;
        const float inv = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
#pragma unroll
        for (int e = 0; e < DPL; ++e) {
            const int d = lane + 32 * e;
            if (d < D) elem::store(p.o, offset(p.o, b, row, h, d), acc[rr][e] * inv);
        }
        if (p.lse.data && lane == 0)
            elem::store(p.lse, offset(p.lse, b, row, h, 0), l[rr] > 0.0f ? m[rr] + logf(l[rr]) : -INFINITY);
    }
}

} // namespace attn
} // namespace wkv_cuda

#endif
