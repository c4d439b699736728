/* Softmax attention backward on CUDA (wkv.h, wkv_attention_backward), device code: the SIMT
 * kernels, flash form (P recomputed from the forward's lse, never stored), float32 arithmetic,
 * every dtype, D <= 256, grouped heads, causal, packed. Two kernels, no atomics, no workspace:
 * every output element is summed by one thread in a fixed order, so the result does not depend
 * on the launch.
 *   p = exp(s - lse)   delta = dout . o - dlse   ds = p (dout . v - delta)
 *   dk_j = sum_rows ds q_scaled     dv_j = sum_rows p dout     dq_i = scale sum_keys ds k
 *
 * attn_bwd_kv_simt: a block is one warp, (tile of 32 keys, kv head). Lane j owns key j: its k
 * and v rows, and its dk and dv accumulators, are rows of shared memory padded to D + 1 floats
 * (lane j at a fixed d: 32 banks). For each query head of the kv head and each row that sees
 * the tile, the warp stages the row's scaled q and dout (and sums dout . o into delta), each
 * lane scores its key, and adds ds q and p dout to its own rows. A key no row sees: dk = dv = 0.
 *
 * attn_bwd_q_simt: the forward's shape (16 rows of one head per block, 4 warps of 4 rows, key
 * blocks of 32 staged in shared memory), with ds in place of p and K in place of V: lane l holds
 * dq at d = l + 32 e. A row that sees no key: dq = 0.
 *
 * Included by attention_bwd.cu and by the CPU emulation test (tests/emu), as
 * attention_kernel.cuh. */
#ifndef WKV_BACKENDS_CUDA_ATTENTION_BWD_KERNEL_CUH
#define WKV_BACKENDS_CUDA_ATTENTION_BWD_KERNEL_CUH

#include "attention_kernel.cuh"

namespace wkv_cuda {
namespace attn {

constexpr int kBwdKeys = 32;  /* keys per dk/dv block (its one warp's lanes) */
constexpr int kBwdRows = 16;  /* rows per dq block */
constexpr int kBwdWarps = 4;  /* warps per dq block */
constexpr int kBwdRowsPerWarp = kBwdRows / kBwdWarps;

/* Dynamic shared memory of attn_bwd_kv_simt (K, V, dK, dV rows of D + 1; q, dout rows) and of
 * attn_bwd_q_simt (q, dout tiles; K, V rows of D + 1). */
__host__ __device__ constexpr size_t bwd_kv_simt_smem_bytes(int D) {
    return sizeof(float) * (4 * (size_t)kBwdKeys * (D + 1) + 2 * (size_t)D);
}
__host__ __device__ constexpr size_t bwd_q_simt_smem_bytes(int D) {
    return sizeof(float) * (2 * (size_t)kBwdRows * D + 2 * (size_t)kAttnKeys * (D + 1));
}

__global__ void __launch_bounds__(32) attn_bwd_kv_simt(const AttnBwdParams p) {
    WKV_DYNAMIC_SHARED(float, smem);
    const AttnShape& sh = p.sh;
    const int D = sh.D, Dk = sh.D + 1;
    float* k_s = smem;                 /* [kBwdKeys][D + 1] */
    float* v_s = k_s + kBwdKeys * Dk;
    float* dk_s = v_s + kBwdKeys * Dk;
    float* dv_s = dk_s + kBwdKeys * Dk;
    float* q_s = dv_s + kBwdKeys * Dk; /* [D]: the row's q, scaled */
    float* do_s = q_s + D;             /* [D]: its dout */
    const int lane = threadIdx.x;

    const int64_t g = blockIdx.x % sh.Hkv;
    int64_t b, q0, q1, k0, k1, tile;
    attn_locate(p.seq, sh, blockIdx.x / sh.Hkv, &b, &q0, &q1, &k0, &k1, &tile);
    const int64_t j0 = k0 + tile * kBwdKeys, j1 = elem::min64(k1, j0 + kBwdKeys);
    for (int i = lane; i < kBwdKeys * D; i += 32) {
        const int j = i / D, d = i % D;
        const bool in = j0 + j < j1;
        k_s[j * Dk + d] = in ? elem::load(p.k, offset(p.k, b, j0 + j, g, d)) : 0.0f;
        v_s[j * Dk + d] = in ? elem::load(p.v, offset(p.v, b, j0 + j, g, d)) : 0.0f;
        dk_s[j * Dk + d] = 0.0f;
        dv_s[j * Dk + d] = 0.0f;
    }
    const int64_t key = j0 + lane;
    const bool key_in = key < j1;
    /* the first row that sees key j0 (causal: row i sees keys up to attn_last_key(i)) */
    const int64_t shift = (k1 - k0) - (q1 - q0);
    int64_t i_start = q0;
    if (sh.causal && q0 + (j0 - k0) - shift > q0) i_start = q0 + (j0 - k0) - shift;
    const int64_t group = sh.Hq / sh.Hkv;
    for (int64_t hh = 0; hh < group; ++hh) {
        const int64_t h = g * group + hh;
        for (int64_t i = i_start; i < q1; ++i) {
            const float lse = elem::load(p.lse, offset(p.lse, b, i, h, 0));
            if (lse == -INFINITY) continue; /* the row sees no key (uniform) */
            __syncthreads(); /* the previous row's reads of q_s, do_s are done (and the tiles') */
            float part = 0.0f;
            for (int d = lane; d < D; d += 32) {
                const float dout = elem::load(p.dout, offset(p.dout, b, i, h, d));
                q_s[d] = elem::load(p.q, offset(p.q, b, i, h, d)) * sh.scale;
                do_s[d] = dout;
                part = fmaf(dout, elem::load(p.o, offset(p.o, b, i, h, d)), part);
            }
            const float delta = warp_sum(part) - (p.dlse.data ? elem::load(p.dlse, offset(p.dlse, b, i, h, 0)) : 0.0f);
            __syncthreads();
            if (!key_in || key > attn_last_key(sh, i, q0, q1, k0, k1)) continue; /* no barrier below */
            const float* kj = k_s + lane * Dk;
            const float* vj = v_s + lane * Dk;
            float s = 0.0f, dp = 0.0f;
            for (int d = 0; d < D; ++d) {
                s = fmaf(q_s[d], kj[d], s);
                dp = fmaf(do_s[d], vj[d], dp);
            }
            const float pj = expf(s - lse);
            const float ds = pj * (dp - delta);
            float* dkj = dk_s + lane * Dk;
            float* dvj = dv_s + lane * Dk;
            for (int d = 0; d < D; ++d) {
                dkj[d] = fmaf(ds, q_s[d], dkj[d]);
                dvj[d] = fmaf(pj, do_s[d], dvj[d]);
            }
        }
    }
    __syncthreads();
    for (int i = lane; i < kBwdKeys * D; i += 32) {
        const int j = i / D, d = i % D;
        if (j0 + j >= j1) continue;
        elem::store(p.dk, offset(p.dk, b, j0 + j, g, d), dk_s[j * Dk + d]);
        elem::store(p.dv, offset(p.dv, b, j0 + j, g, d), dv_s[j * Dk + d]);
    }
}

/* DPL: dq floats per lane (D <= 32 * DPL). */
template <int DPL>
__global__ void __launch_bounds__(kBwdWarps * 32) attn_bwd_q_simt(const AttnBwdParams p) {
    WKV_DYNAMIC_SHARED(float, smem);
    const AttnShape& sh = p.sh;
    const int D = sh.D, Dk = sh.D + 1;
    float* q_s = smem;                  /* [kBwdRows][D], scaled */
    float* do_s = q_s + kBwdRows * D;   /* [kBwdRows][D] */
    float* k_s = do_s + kBwdRows * D;   /* [kAttnKeys][D + 1] */
    float* v_s = k_s + kAttnKeys * Dk;  /* [kAttnKeys][D + 1] */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    const int64_t h = blockIdx.x % sh.Hq;
    int64_t b, q0, q1, k0, k1, tile;
    attn_locate(p.seq, sh, blockIdx.x / sh.Hq, &b, &q0, &q1, &k0, &k1, &tile);
    const int64_t r0 = q0 + tile * kBwdRows;
    const int64_t r1 = elem::min64(q1, r0 + kBwdRows);
    const int64_t g = h / (sh.Hq / sh.Hkv);
    const int64_t kend = attn_last_key(sh, r1 - 1, q0, q1, k0, k1) + 1;

    for (int i = tid; i < kBwdRows * D; i += blockDim.x) {
        const int r = i / D, d = i % D;
        const bool in = r0 + r < r1;
        q_s[i] = in ? elem::load(p.q, offset(p.q, b, r0 + r, h, d)) * sh.scale : 0.0f;
        do_s[i] = in ? elem::load(p.dout, offset(p.dout, b, r0 + r, h, d)) : 0.0f;
    }
    float lse[kBwdRowsPerWarp], delta[kBwdRowsPerWarp], acc[kBwdRowsPerWarp][DPL];
#pragma unroll
    for (int rr = 0; rr < kBwdRowsPerWarp; ++rr) {
        const int64_t row = r0 + warp * kBwdRowsPerWarp + rr;
        lse[rr] = -INFINITY, delta[rr] = 0.0f;
#pragma unroll
        for (int e = 0; e < DPL; ++e) acc[rr][e] = 0.0f;
        if (row >= r1) continue; /* warp-uniform */
        lse[rr] = elem::load(p.lse, offset(p.lse, b, row, h, 0));
        float part = 0.0f;
        for (int d = lane; d < D; d += 32)
            part = fmaf(elem::load(p.dout, offset(p.dout, b, row, h, d)), elem::load(p.o, offset(p.o, b, row, h, d)), part);
        delta[rr] = warp_sum(part) - (p.dlse.data ? elem::load(p.dlse, offset(p.dlse, b, row, h, 0)) : 0.0f);
    }

    for (int64_t j0 = k0; j0 < kend; j0 += kAttnKeys) {
        __syncthreads(); /* the previous block's reads are done (and q_s, do_s written) */
        for (int i = tid; i < kAttnKeys * D; i += blockDim.x) {
            const int j = i / D, d = i % D;
            const bool in = j0 + j < kend;
            k_s[j * Dk + d] = in ? elem::load(p.k, offset(p.k, b, j0 + j, g, d)) : 0.0f;
            v_s[j * Dk + d] = in ? elem::load(p.v, offset(p.v, b, j0 + j, g, d)) : 0.0f;
        }
        __syncthreads();
        const int64_t key = j0 + lane;
#pragma unroll
        for (int rr = 0; rr < kBwdRowsPerWarp; ++rr) {
            const int r = warp * kBwdRowsPerWarp + rr;
            const int64_t row = r0 + r;
            if (row >= r1 || lse[rr] == -INFINITY) continue; /* warp-uniform */
            const bool valid = key < kend && key <= attn_last_key(sh, row, q0, q1, k0, k1);
            const float* qr = q_s + r * D;
            const float* dr = do_s + r * D;
            const float* kj = k_s + lane * Dk;
            const float* vj = v_s + lane * Dk;
            float s = 0.0f, dp = 0.0f;
            for (int d = 0; d < D; ++d) {
                s = fmaf(qr[d], kj[d], s);
                dp = fmaf(dr[d], vj[d], dp);
            }
            const float ds = valid ? expf(s - lse[rr]) * (dp - delta[rr]) : 0.0f;
            for (int jj = 0; jj < kAttnKeys; ++jj) {
                const float dsb = __shfl_sync(0xffffffffu, ds, jj);
                const float* kr = k_s + jj * Dk + lane;
#pragma unroll
                for (int e = 0; e < DPL; ++e)
                    if (lane + 32 * e < D) acc[rr][e] = fmaf(dsb, kr[32 * e], acc[rr][e]);
            }
        }
    }

#pragma unroll
    for (int rr = 0; rr < kBwdRowsPerWarp; ++rr) {
        const int64_t row = r0 + warp * kBwdRowsPerWarp + rr;
        if (row >= r1) continue;
#pragma unroll
        for (int e = 0; e < DPL; ++e) {
            const int d = lane + 32 * e;
            if (d < D) elem::store(p.dq, offset(p.dq, b, row, h, d), acc[rr][e] * sh.scale);
        }
    }
}

} // namespace attn
} // namespace wkv_cuda

#endif
