/* Softmax attention backward on CUDA with tensor cores, device code (f16/bf16, D = 64 or 128;
 * float32 scores and accumulators): the flash-attention-2 form in two kernels, no atomics, no
 * workspace (the result does not depend on the launch), with the fragment helpers and layouts
 * of attention_mma_kernel.cuh.
 *   s = scale q.k   p = exp(s - lse)   delta = dout . o - dlse   ds = p (dout . v - delta)
 *
 * attn_bwd_kv_mma: a block is 64 keys x one kv head, 4 warps of 16 keys. K and V stay staged
 * for the block; for each query head of the kv head and each block of 64 rows that sees the
 * keys, Q and dout rows are staged (with lse, and delta summed from dout . o), then per warp
 *   S^T = K Q^T, dP^T = V dout^T   (16 keys x 64 rows: A from K / V rows, B from Q / dout rows)
 *   P^T, dS^T from them, masked      (the accumulator tiles, in place)
 *   dV += P^T dout, dK += dS^T Q     (P^T, dS^T fed back as A fragments; B two rows a register)
 * and dk = scale dK, dv are stored (a key no row sees: 0).
 * attn_bwd_q_mma: a block is 64 rows x one query head, 4 warps of 16 rows, Q and dout staged
 * once; per staged block of 64 keys S = Q K^T, dP = dout V^T, dS, and dQ += dS K; dq = scale dQ
 * (a row that sees no key: 0).
 * bf16 P and dS go in as hi + lo parts, as in the forward.
 *
 * Included by attention_bwd.cu and by the CPU emulation test (tests/emu). */
#ifndef WKV_BACKENDS_CUDA_ATTENTION_MMA_BWD_KERNEL_CUH
#define WKV_BACKENDS_CUDA_ATTENTION_MMA_BWD_KERNEL_CUH

#include "attention_mma_kernel.cuh"

namespace wkv_cuda {
namespace attn {

/* Shared memory of each kernel: four staged 16-bit tiles of 64 rows (+ lse, delta). */
__host__ __device__ constexpr size_t mma_bwd_smem_bytes(int D) {
    return 4 * sizeof(uint16_t) * 64 * (size_t)(D + kMmaPad) + 2 * 64 * sizeof(float);
}

template <int D, bool BF16>
__global__ void __launch_bounds__(kMmaWarps * 32) attn_bwd_kv_mma(const AttnBwdParams p) {
    WKV_DYNAMIC_SHARED(uint16_t, smem16);
    constexpr int S = D + kMmaPad, KD = D / 16, DT = D / 8;
    uint16_t* k_s = smem16; /* [64][S] each */
    uint16_t* v_s = k_s + 64 * S;
    uint16_t* q_s = v_s + 64 * S;
    uint16_t* do_s = q_s + 64 * S;
    float* lse_s = reinterpret_cast<float*>(do_s + 64 * S); /* [64] */
    float* delta_s = lse_s + 64;                            /* [64] */
    const AttnShape& sh = p.sh;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;

    const int64_t kvh = blockIdx.x % sh.Hkv;
    int64_t b, q0, q1, k0, k1, tile;
    attn_locate(p.seq, sh, blockIdx.x / sh.Hkv, &b, &q0, &q1, &k0, &k1, &tile);
    const int64_t j0 = k0 + tile * 64, j1 = elem::min64(k1, j0 + 64);
    stage_rows<D, BF16>(k_s, p.k, b, j0, j1 - j0, kvh, sh.kv_vec16, tid);
    stage_rows<D, BF16>(v_s, p.v, b, j0, j1 - j0, kvh, sh.kv_vec16, tid);
    /* this lane's two keys: g and g + 8 of the warp's 16 */
    const int64_t key[2] = {j0 + warp * 16 + g, j0 + warp * 16 + g + 8};
    /* the first row that sees key j0 (row i sees keys up to attn_last_key(i)) */
    const int64_t shift = (k1 - k0) - (q1 - q0);
    int64_t i_start = q0;
    if (sh.causal && q0 + (j0 - k0) - shift > q0) i_start = q0 + (j0 - k0) - shift;

    float dk[DT][4], dv[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int i = 0; i < 4; ++i) dk[dt][i] = dv[dt][i] = 0.0f;
    const int64_t group = sh.Hq / sh.Hkv;
    for (int64_t hh = 0; hh < group; ++hh) {
        const int64_t h = kvh * group + hh;
        for (int64_t r0 = i_start; r0 < q1; r0 += 64) {
            __syncthreads(); /* the previous row block's reads are done (and K, V staged) */
            stage_rows<D, BF16>(q_s, p.q, b, r0, q1 - r0, h, p.qd_vec16, tid);
            stage_rows<D, BF16>(do_s, p.dout, b, r0, q1 - r0, h, p.qd_vec16, tid);
            if (tid < 64) {
                const int64_t row = r0 + tid;
                float lse = -INFINITY, delta = 0.0f;
                if (row < q1) {
                    lse = elem::load(p.lse, offset(p.lse, b, row, h, 0));
                    for (int d = 0; d < D; ++d)
                        delta = fmaf(elem::load(p.dout, offset(p.dout, b, row, h, d)),
                                     elem::load(p.o, offset(p.o, b, row, h, d)), delta);
                    if (p.dlse.data) delta -= elem::load(p.dlse, offset(p.dlse, b, row, h, 0));
                }
                lse_s[tid] = lse;
                delta_s[tid] = delta;
            }
            __syncthreads();
            float st[8][4], dpt[8][4]; /* 16 keys x 64 rows: n-tile nt = rows 8 nt .. 8 nt + 7 */
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) st[nt][i] = dpt[nt][i] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KD; ++kk) {
                uint32_t ka[4], va[4];
                frag_a<S>(ka, k_s, warp * 16, kk, g, t);
                frag_a<S>(va, v_s, warp * 16, kk, g, t);
#pragma unroll
                for (int nt = 0; nt < 8; ++nt) {
                    uint32_t qb[2], db[2];
                    frag_b_rows_n<S>(qb, q_s, nt * 8, kk, g, t);
                    frag_b_rows_n<S>(db, do_s, nt * 8, kk, g, t);
                    mma16816<BF16>(st[nt], ka, qb);
                    mma16816<BF16>(dpt[nt], va, db);
                }
            }
            /* element (key g or g + 8, row 8 nt + 2t + {0, 1}): P^T into st, dS^T into dpt */
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int rr = 8 * nt + 2 * t + (i & 1);
                    const int64_t row = r0 + rr, kj = key[i >> 1];
                    const float lse = lse_s[rr];
                    const bool valid = row < q1 && lse != -INFINITY && kj < j1 &&
                                       kj <= attn_last_key(sh, row, q0, q1, k0, k1);
                    const float pv = valid ? expf(st[nt][i] * sh.scale - lse) : 0.0f;
                    st[nt][i] = pv;
                    dpt[nt][i] = pv * (dpt[nt][i] - delta_s[rr]);
                }
            /* dV += P^T dout, dK += dS^T Q: k-step kk2 = rows 16 kk2 .. 16 kk2 + 15 */
#pragma unroll
            for (int kk2 = 0; kk2 < 4; ++kk2) {
                uint32_t pa[4], pl[4], sa[4], sl[4];
                frag_a_from_acc<BF16>(pa, pl, st, kk2);
                frag_a_from_acc<BF16>(sa, sl, dpt, kk2);
#pragma unroll
                for (int dt = 0; dt < DT; ++dt) {
                    uint32_t db[2], qb[2];
                    frag_b_rows_k<S>(db, do_s, 16 * kk2, dt, g, t);
                    frag_b_rows_k<S>(qb, q_s, 16 * kk2, dt, g, t);
                    mma_pair<BF16>(dv[dt], pa, pl, db);
                    mma_pair<BF16>(dk[dt], sa, sl, qb);
                }
            }
        }
    }
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int64_t kj = key[i >> 1];
            const int d = 8 * dt + 2 * t + (i & 1);
            if (kj < j1) {
                elem::store(p.dk, offset(p.dk, b, kj, kvh, d), dk[dt][i] * sh.scale);
                elem::store(p.dv, offset(p.dv, b, kj, kvh, d), dv[dt][i]);
            }
        }
}

template <int D, bool BF16>
__global__ void __launch_bounds__(kMmaWarps * 32) attn_bwd_q_mma(const AttnBwdParams p) {
    WKV_DYNAMIC_SHARED(uint16_t, smem16);
    constexpr int S = D + kMmaPad, KD = D / 16, DT = D / 8;
    uint16_t* k_s = smem16; /* [64][S] each */
    uint16_t* v_s = k_s + 64 * S;
    uint16_t* q_s = v_s + 64 * S; /* the block's rows, staged once for the A fragments */
    uint16_t* do_s = q_s + 64 * S;
    const AttnShape& sh = p.sh;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;

    const int64_t h = blockIdx.x % sh.Hq;
    int64_t b, q0, q1, k0, k1, tile;
    attn_locate(p.seq, sh, blockIdx.x / sh.Hq, &b, &q0, &q1, &k0, &k1, &tile);
    const int64_t r0 = q0 + tile * 64;
    const int64_t r1 = elem::min64(q1, r0 + 64);
    const int64_t kvh = h / (sh.Hq / sh.Hkv);
    const int64_t kend = attn_last_key(sh, r1 - 1, q0, q1, k0, k1) + 1;
    stage_rows<D, BF16>(q_s, p.q, b, r0, r1 - r0, h, p.qd_vec16, tid);
    stage_rows<D, BF16>(do_s, p.dout, b, r0, r1 - r0, h, p.qd_vec16, tid);
    /* this lane's two rows: g and g + 8 of the warp's 16; lse, and delta summed over the 4 lanes
     * of the row (lane t takes d = t, t + 4, ...) */
    const int64_t row[2] = {r0 + warp * 16 + g, r0 + warp * 16 + g + 8};
    float lse[2], delta[2];
    int64_t last[2];
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        const bool in = row[x] < r1;
        lse[x] = in ? elem::load(p.lse, offset(p.lse, b, row[x], h, 0)) : -INFINITY;
        last[x] = in ? attn_last_key(sh, row[x], q0, q1, k0, k1) : k0 - 1;
        float part = 0.0f;
        if (in)
            for (int d = t; d < D; d += 4)
                part = fmaf(elem::load(p.dout, offset(p.dout, b, row[x], h, d)), elem::load(p.o, offset(p.o, b, row[x], h, d)),
                            part);
        part += __shfl_xor_sync(0xffffffffu, part, 1);
        part += __shfl_xor_sync(0xffffffffu, part, 2);
        delta[x] = part - (in && p.dlse.data ? elem::load(p.dlse, offset(p.dlse, b, row[x], h, 0)) : 0.0f);
    }
    float dq[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int i = 0; i < 4; ++i) dq[dt][i] = 0.0f;

    for (int64_t j0 = k0; j0 < kend; j0 += 64) {
        __syncthreads(); /* the previous block's reads are done */
        stage_rows<D, BF16>(k_s, p.k, b, j0, kend - j0, kvh, sh.kv_vec16, tid);
        stage_rows<D, BF16>(v_s, p.v, b, j0, kend - j0, kvh, sh.kv_vec16, tid);
        __syncthreads();
        float s[8][4], dp[8][4]; /* 16 rows x 64 keys */
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) s[nt][i] = dp[nt][i] = 0.0f;
        /* Q's and dout's A fragments re-read from shared memory per block: held in registers
         * for the whole walk they took the D = 128 kernel past 255 registers (spills) */
#pragma unroll
        for (int kk = 0; kk < KD; ++kk) {
            uint32_t qa[4], da[4];
            frag_a<S>(qa, q_s, warp * 16, kk, g, t);
            frag_a<S>(da, do_s, warp * 16, kk, g, t);
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                uint32_t kb[2], vb[2];
                frag_b_rows_n<S>(kb, k_s, nt * 8, kk, g, t);
                frag_b_rows_n<S>(vb, v_s, nt * 8, kk, g, t);
                mma16816<BF16>(s[nt], qa, kb);
                mma16816<BF16>(dp[nt], da, vb);
            }
        }
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int x = i >> 1;
                const int64_t kj = j0 + 8 * nt + 2 * t + (i & 1);
                const bool valid = lse[x] != -INFINITY && kj < kend && kj <= last[x];
                const float pv = valid ? expf(s[nt][i] * sh.scale - lse[x]) : 0.0f;
                s[nt][i] = pv * (dp[nt][i] - delta[x]); /* dS */
            }
        /* dQ += dS K: k-step kk2 = keys 16 kk2 .. 16 kk2 + 15 */
#pragma unroll
        for (int kk2 = 0; kk2 < 4; ++kk2) {
            uint32_t sa[4], sl[4];
            frag_a_from_acc<BF16>(sa, sl, s, kk2);
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
                uint32_t kb[2];
                frag_b_rows_k<S>(kb, k_s, 16 * kk2, dt, g, t);
                mma_pair<BF16>(dq[dt], sa, sl, kb);
            }
        }
    }
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int x = i >> 1;
            if (row[x] < r1) elem::store(p.dq, offset(p.dq, b, row[x], h, 8 * dt + 2 * t + (i & 1)), dq[dt][i] * sh.scale);
        }
}

} // namespace attn
} // namespace wkv_cuda

#endif
