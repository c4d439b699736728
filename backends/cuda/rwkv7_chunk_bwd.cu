/* RWKV-7 backward in chunks of C = 32 tokens, parallel over time (small batch): NOTES.md
 * "Chunked backward: design", step by step the float64 spec tests/formulations/rwkv7_chunk_bwd.py (same
 * names: W, Aab, Arb, U, dU, dX, dM, ...). CLAMPW, N = 64, unpacked sequences
 * (rwkv7_use_chunked_bwd in cuda_backend.cpp). B3's matrix products run on tensor cores (TF32,
 * 3xTF32 where a tensor is float32; NOTES v21), everything else in fp32 on CUDA cores; each
 * warp's gradient tiles leave through a warp-private shared-memory tile as whole rows (NOTES v25).
 *
 * The workspace (rwkv7_chunk_bwd_ws_bytes, the caller's backward workspace) holds the chunked
 * forward's per-chunk area (rwkv7_chunk.cuh's ChunkWs) followed by one N x N matrix per chunk
 * (DS). Kernels, in stream order:
 *   F1, F2: the chunked forward's local and state kernels (rwkv7_chunk.cu, no outputs): W | Z,
 *      Bh, gamma of every chunk, and each chunk's entry state S_e in its L area (B1 of the design
 *      and the entry states: the sequential forward's checkpoints are not reused);
 *   P  rwkv7_chunk_bwd_prep_kernel, one block per (sequence, head, chunk): Ld = dY^T Z (the part
 *      of dS_e that does not depend on the walk) into DS, and W^T into the (unused) Yl area so
 *      the walk reads both of its matrices as rows;
 *   B2 rwkv7_chunk_bwd_walk_kernel, one block per (sequence, head, 16 value rows), last chunk
 *      first from dstate_out: dS_e = dS_x o gamma + (dS_x Bh^T) W + Ld; each chunk's dS_x
 *      replaces its Ld rows in DS (read first); the first chunk's dS_e is dstate_in;
 *   B3 rwkv7_chunk_bwd_local_kernel, one block of 16 warps per (sequence, head, chunk): the
 *      chunk's token gradients from S_e, dS_x, dY and the inputs (the spec's backward_local),
 *      the decay gradient by the log route (dlog_decay_suffix: exact enough where decay >=
 *      0.545). Two warps per 16 x 16 tile of each C x N result, each with its own products; the
 *      serial parts (G's sum, the two column walks, dG's suffix sums) one thread per column,
 *      everything around them over the whole block (NOTES v26).
 * Decays as in the forward: exp(G_t - G_s) = exp(G_t) exp(-G_s) (CLAMPW keeps exp(-G) finite).
 * Every pair gradient is then a plain product: with re = r e^G, ae = a e^Gp, bi = b e^-G,
 * ki = k e^-G,  dr_t = e^G_t (dRe_t + sum_s dArb[t,s] bi_s + dArk[t,s] ki_s),
 *               db_s = e^-G_s (gamma dBh_s + sum_t dArb[t,s] re_t + dAab[t,s] ae_t),
 * and the log-decay gradient's per-token terms are r dr - b db - k dk (G side) and a da (Gp side)
 * of the full gradients, plus at the chunk's last token sum_s (dBh o Bh + dKh o Kh) + dgam gamma.
 */
#include <cuda_runtime.h>

#include "cuda_elem.cuh"
#include "cuda_internal.h"
#include "rwkv7_chunk.cuh"

namespace wkv_cuda {
namespace {

using chunk::axpy_row;
using chunk::ChunkWs;
using chunk::clampw_log_decay;
using elem::cp_async16;
using elem::cp_async_commit;
using elem::cp_async_wait_all;
using elem::min64;

constexpr int kN = 64, kC = 32;
using WS = ChunkWs<kN, kC>;
constexpr size_t kDsFloats = (size_t)kN * kN; /* one chunk's Ld, then dS_x */
constexpr float kClampwC = 0.60653065971263342f; /* exp(-1/2) */

/* x[t] += row[t] f for t < hi (the back substitution's step; hi a constant when unrolled). */
template <int C>
__device__ __forceinline__ void axpy_row_below(float (&x)[C], const float* row, float f, int hi) {
#pragma unroll
    for (int k = 0; k < C / 4; ++k) {
        if (4 * k >= hi) continue;
        const float4 a = reinterpret_cast<const float4*>(row)[k];
        x[4 * k] = fmaf(a.x, f, x[4 * k]);
        if (4 * k + 1 < hi) x[4 * k + 1] = fmaf(a.y, f, x[4 * k + 1]);
        if (4 * k + 2 < hi) x[4 * k + 2] = fmaf(a.z, f, x[4 * k + 2]);
        if (4 * k + 3 < hi) x[4 * k + 3] = fmaf(a.w, f, x[4 * k + 3]);
    }
}

/* ---- P: Ld = dY^T Z into DS, W^T into Yl ------------------------------------------------- */

constexpr int kPrepThreads = 256;

__global__ void __launch_bounds__(kPrepThreads) rwkv7_chunk_bwd_prep_kernel(const __grid_constant__ Rwkv7ChunkBwdParams p) {
    constexpr int N = kN, C = kC, NT = kPrepThreads, WP = 2 * C + 1;
    __shared__ float sDY[C][N];
    __shared__ float sWZ[N][WP]; /* the chunk's W | Z rows (key j), padded: column reads conflict-free */
    const int tid = threadIdx.x;
    const int64_t c = blockIdx.x % p.nc, sh = blockIdx.x / p.nc;
    const int64_t h = sh % p.H, s = sh / p.H, t0 = c * C;
    float* ws = p.ws + (size_t)blockIdx.x * WS::FLOATS;
    float* ds = p.ds + (size_t)blockIdx.x * kDsFloats;
    {
        const int i = tid % N;
        const int64_t bd = s * p.dy.s[0] + h * p.dy.s[2] + i * p.dy.s[3];
        for (int u = tid / N; u < C; u += NT / N) {
            const int64_t t = min64(t0 + u, p.T - 1);
            const float d = elem::load(p.dy, bd + t * p.dy.s[1]);
            sDY[u][i] = t0 + u < p.T ? d : 0.0f;
        }
    }
    for (int e = tid; e < N * 2 * C; e += NT) sWZ[e / (2 * C)][e % (2 * C)] = ws[WS::WZ + e];
    __syncthreads();
    for (int e = tid; e < N * C; e += NT) ws[WS::YL + e] = sWZ[e % N][e / N]; /* W^T [t][j] */
    /* thread: column j, rows i = ig + 4 m */
    const int j = tid % N, ig = tid / N;
    float acc[N / 4];
#pragma unroll
    for (int m = 0; m < N / 4; ++m) acc[m] = 0.0f;
#pragma unroll 4
    for (int t = 0; t < C; ++t) {
        const float z = sWZ[j][C + t];
#pragma unroll
        for (int m = 0; m < N / 4; ++m) acc[m] = fmaf(sDY[t][ig + 4 * m], z, acc[m]);
    }
#pragma unroll
    for (int m = 0; m < N / 4; ++m) ds[(size_t)(ig + 4 * m) * N + j] = acc[m];
}

/* ---- B2: the reverse walk over the chunks ------------------------------------------------- */

constexpr int kWalkRows = 16; /* value rows per block */

/* Shared memory of the walk, in floats: two chunk buffers (W^T [C][N], Bh [C][NP] (rows padded:
 * the P step reads 16 rows at once), Ld [RB][N] (the block's rows), gamma [N]), then the rows'
 * dS [RB][N] and P = dS Bh^T [RB][C + 1]. */
struct WalkSmem {
    static constexpr int N = kN, C = kC, RB = kWalkRows, NP = N + 4;
    static constexpr int WT = 0, BH = WT + C * N, LD = BH + C * NP, GM = LD + RB * N, BUF = GM + N;
    static constexpr int S = 2 * BUF, PP = C + 1, P = S + RB * N, FLOATS = P + RB * PP;
    static_assert(BUF % 4 == 0 && NP % 4 == 0, "float4 pieces");
};

__global__ void __launch_bounds__(kWalkRows * 16) rwkv7_chunk_bwd_walk_kernel(const __grid_constant__ Rwkv7ChunkBwdParams p) {
    using SM = WalkSmem;
    constexpr int N = kN, C = kC, RB = kWalkRows, NT = RB * 16, Q = 16, SC = N / Q, NP = SM::NP;
    extern __shared__ float4 smem4[];
    float* sm = reinterpret_cast<float*>(smem4);
    float* sS = sm + SM::S;
    float* sP = sm + SM::P;
    const int tid = threadIdx.x, il = tid / Q, q = tid % Q;
    constexpr int RBLK = N / RB;
    const int64_t rb = blockIdx.x % RBLK, sh = blockIdx.x / RBLK;
    const int64_t h = sh % p.H, s = sh / p.H;
    const int i0 = (int)rb * RB, i = i0 + il;
    const float* ws0 = p.ws + (size_t)sh * p.nc * WS::FLOATS;
    float* ds0 = p.ds + (size_t)sh * p.nc * kDsFloats;

    auto prefetch = [&](int64_t c, int buf) {
        const float* g = ws0 + (size_t)c * WS::FLOATS;
        const float* d = ds0 + (size_t)c * kDsFloats;
        float* b = sm + buf * SM::BUF;
        constexpr int nW = C * N / 4, nBH = C * N / 4, nL = RB * N / 4, nGM = N / 4;
        constexpr int total = nW + nBH + nL + nGM;
        for (int e = tid; e < total; e += NT) {
            int x = e;
            if (x < nW) { cp_async16(b + SM::WT + 4 * x, g + WS::YL + 4 * x); continue; }
            x -= nW;
            if (x < nBH) {
                const int t = x / (N / 4), f = x % (N / 4);
                cp_async16(b + SM::BH + t * NP + 4 * f, g + WS::BH + (size_t)t * N + 4 * f);
                continue;
            }
            x -= nBH;
            if (x < nL) { cp_async16(b + SM::LD + 4 * x, d + (size_t)i0 * N + 4 * x); continue; }
            x -= nL;
            cp_async16(b + SM::GM + 4 * x, g + WS::GM + 4 * x);
        }
        cp_async_commit();
    };

    if (p.nc > 0) prefetch(p.nc - 1, 0);
    float S[SC]; /* dS row i, columns q SC .. q SC + SC - 1 */
    chunk::load_state_row(p.dstate_out, s, h, i, q, S);
#pragma unroll
    for (int x = 0; x < SC; ++x) sS[il * N + q * SC + x] = S[x];
    for (int64_t c = p.nc - 1, k = 0; c >= 0; --c, ++k) {
        const int buf = (int)(k & 1);
        cp_async_wait_all();
        __syncthreads(); /* chunk c visible (its Ld rows read into shared memory); sS complete */
        if (c > 0) prefetch(c - 1, buf ^ 1);
        const float* cb = sm + buf * SM::BUF;
        { /* dS_x of chunk c over its Ld rows */
            float* dst = ds0 + (size_t)c * kDsFloats + (size_t)i * N + q * SC;
#pragma unroll
            for (int x = 0; x < SC; x += 4) *reinterpret_cast<float4*>(dst + x) = make_float4(S[x], S[x + 1], S[x + 2], S[x + 3]);
        }
        /* P[il][t] = sum_j dS[i][j] Bh[t][j], t = q and q + 16 */
        {
            float a0 = 0.0f, a1 = 0.0f;
#pragma unroll 4
            for (int j = 0; j < N; j += 4) {
                const float4 d = *reinterpret_cast<const float4*>(sS + il * N + j);
                const float4 b0 = *reinterpret_cast<const float4*>(cb + SM::BH + q * NP + j);
                const float4 b1 = *reinterpret_cast<const float4*>(cb + SM::BH + (q + 16) * NP + j);
                a0 = fmaf(d.x, b0.x, fmaf(d.y, b0.y, fmaf(d.z, b0.z, fmaf(d.w, b0.w, a0))));
                a1 = fmaf(d.x, b1.x, fmaf(d.y, b1.y, fmaf(d.z, b1.z, fmaf(d.w, b1.w, a1))));
            }
            sP[il * SM::PP + q] = a0;
            sP[il * SM::PP + q + 16] = a1;
        }
        __syncthreads();
        /* dS <- dS o gamma + sum_t P[i][t] W[t] + Ld[i] */
        chunk::walk_update<N, C, SC>(S, cb + SM::GM, cb + SM::LD + il * N, sP + il * SM::PP,
                                     cb + SM::WT, q, sS + il * N);
    }
    chunk::store_state_row(p.dstate_in, s, h, i, q, S);
}

/* ---- B3: the chunks' local gradients, products on tensor cores ---------------------------- */

constexpr int kLocalThreads = 512; /* 16 warps: two per 16 x 16 tile of a C x N result (NOTES v26) */

/* Every matrix product of B3 runs as mma.sync m16n8k8 with TF32 operands and float32
 * accumulation (NOTES.md, v21). P = 1: operands rounded to TF32 (10-bit mantissa; the design's
 * precision model: ~5e-4 relative, for 16-bit I/O whose tolerance is 4e-3); P = 3: each operand
 * split hi + lo and three products summed (lo hi + hi lo + hi hi; what is dropped, lo lo, is
 * ~2^-22 relative: float32 accuracy, for f32 I/O and its 2e-5). */
__device__ __forceinline__ uint32_t to_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* acc[n] += A B for the warp's 16 x 8 tiles n = 0..NT-1, k over [k0, k1) (multiples of 8):
 * A(m, k) = a[m am + k ak] (a at the tile's first row), B(k, n) = b[k bk + n bn] (b at its first
 * column). Lane (g, q) = (lane / 4, lane % 4) holds acc[n][x] = D(g + 8 (x / 2), 8 n + 2 q + x % 2)
 * (PTX's fragment layout for m16n8k8 .tf32). */
template <int P, int NT>
__device__ __forceinline__ void mma_acc(float (&acc)[NT][4], const float* a, int am, int ak, const float* b, int bk,
                                        int bn, int k0, int k1) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll 2
    for (int k = k0; k < k1; k += 8) {
        const float af[4] = {a[g * am + (k + q) * ak], a[(g + 8) * am + (k + q) * ak], a[g * am + (k + q + 4) * ak],
                             a[(g + 8) * am + (k + q + 4) * ak]};
        uint32_t ah[4], al[4];
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            ah[x] = to_tf32(af[x]);
            al[x] = P == 3 ? to_tf32(af[x] - __uint_as_float(ah[x])) : 0u;
        }
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const float b0 = b[(k + q) * bk + (8 * n + g) * bn], b1 = b[(k + q + 4) * bk + (8 * n + g) * bn];
            const uint32_t bh0 = to_tf32(b0), bh1 = to_tf32(b1);
            if (P == 3) {
                mma_tf32(acc[n], al, bh0, bh1);
                mma_tf32(acc[n], ah, to_tf32(b0 - __uint_as_float(bh0)), to_tf32(b1 - __uint_as_float(bh1)));
            }
            mma_tf32(acc[n], ah, bh0, bh1);
        }
    }
}

template <int NT>
__device__ __forceinline__ void zero(float (&acc)[NT][4]) {
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}

/* Shared memory, in floats. Token rows [C][TS] and the states [N][SS] (TS = SS = N + 4: an A
 * operand read along its rows, lane (g, q) at g TS + q, hits 32 distinct banks); the forward
 * matrices transposed [s][t] (rows of CT = C + 4: float4 reads by the solves, conflict-free
 * row-wise fragments) and Aab as is, later aliased by the four dM [t][s] (rows of CT). */
struct LocalSmem {
    static constexpr int N = kN, C = kC, TS = N + 4, SS = N + 4, CT = C + 4, TOK = C * TS;
    static constexpr int R = 0, A = R + TOK, B = A + TOK, K = B + TOK, RE = K + TOK, AE = RE + TOK, BI = AE + TOK,
                         KI = BI + TOK, V = KI + TOK, DY = V + TOK, U = DY + TOK, DX = U + TOK,
                         G = DX + TOK,       /* [C][N] G_t (cumulative log decay); later the log-decay gradient's G terms */
        DLW = G + C * N,                     /* [C][N] d log decay / d w */
        SE = DLW + C * N, DS = SE + N * SS,  /* S_e, then dS_x o gamma (per column) [N][SS] */
        M = DS + N * SS,                     /* AabT, AakT, ArbT, ArkT, Aab: 5 x [C][CT]; then dM */
        DG = G, DGP = M + 5 * C * CT,        /* the log-decay gradient's G terms (over G, dead since the
                                              * scaling: e^G and e^-G are kept) and its Gp terms */
        GM = DGP + C * N, DGAM = GM + N, RED = DGAM + N, DGQ = RED + 2 * N, /* dgam's 4 partial sums [4][N] */
        ST = DGQ + 4 * N,                    /* a 16 x 16 staging tile per warp (stage_out) */
        EG = ST + (kLocalThreads / 32) * 256, /* [C][N] e^G and e^-G, formed once by the scaling */
        ENG = EG + C * N, FLOATS = ENG + C * N;
    static_assert(TOK % 4 == 0 && (SE % 4) == 0 && (M % 4) == 0 && (CT % 4) == 0 && (ST % 4) == 0, "float4 alignment");
};

/* Whether a gradient's rows take one vector store per 4 adjacent columns: unit column stride, and
 * every row's column 4 c of this (sequence, head) at an element offset that is a multiple of 4
 * from a base aligned to 4 elements (16-bit: 8 bytes, float32: 16 bytes). */
__device__ __forceinline__ bool quads_ok(const DevView& v, int64_t bo) {
    const uintptr_t align = v.elem == 0 ? 15 : 7;
    return v.s[3] == 1 && (reinterpret_cast<uintptr_t>(v.data) & align) == 0 && (bo & 3) == 0 && (v.s[1] & 3) == 0;
}

/* The warp's 16 x 16 result tile (fragments acc[n][e]: row g + 8 (e / 2), column 8 n + 2 q + e % 2)
 * to rows tr .. tr + 15 (those below T), columns n0 .. n0 + 15 of a gradient, through the warp's
 * own staging tile: fragments in as float2, __syncwarp, rows out as float4 per lane, so each
 * quarter warp writes two whole 16-column rows (32 contiguous bytes each where 16-bit: full
 * sectors, where the fragments' element stores used ~9 of 32 bytes). No block barrier: the other
 * warps' products go on meanwhile. The tile's rows are 16 floats with the column halves swapped
 * on rows with bit 1 set, so both the fragment writes (rows g, 16 lanes a phase) and the row
 * reads (2 rows per 8 lanes) hit 32 distinct banks. */
__device__ __forceinline__ void stage_out(float* st, const float (&acc)[2][4], const DevView& v, int64_t bo, int64_t tr,
                                          int n0, int64_t T) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int sw = (g & 2) << 2; /* rows g and g + 8 share bit 1 */
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            *reinterpret_cast<float2*>(st + (g + 8 * h) * 16 + ((8 * n + 2 * q) ^ sw)) =
                make_float2(acc[n][2 * h], acc[n][2 * h + 1]);
    __syncwarp();
    const bool quads = quads_ok(v, bo);
#pragma unroll
    for (int it = 0; it < 2; ++it) {
        const int r = g + 8 * it, c = 4 * q;
        const float4 x = *reinterpret_cast<const float4*>(st + r * 16 + (c ^ ((r & 2) << 2)));
        const int64_t t = tr + r;
        if (t >= T) continue;
        const int64_t off = bo + t * v.s[1] + (int64_t)(n0 + c) * v.s[3];
        if (quads && v.elem == 0) {
            *reinterpret_cast<float4*>(reinterpret_cast<float*>(v.data) + off) = x;
        } else if (quads) {
            const bool hf = v.elem == 1;
            const unsigned lo = hf ? __half_as_ushort(__float2half_rn(x.x)) | ((unsigned)__half_as_ushort(__float2half_rn(x.y)) << 16)
                                   : __bfloat16_as_ushort(__float2bfloat16_rn(x.x)) | ((unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(x.y)) << 16);
            const unsigned hi = hf ? __half_as_ushort(__float2half_rn(x.z)) | ((unsigned)__half_as_ushort(__float2half_rn(x.w)) << 16)
                                   : __bfloat16_as_ushort(__float2bfloat16_rn(x.z)) | ((unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(x.w)) << 16);
            *reinterpret_cast<uint2*>(reinterpret_cast<unsigned short*>(v.data) + off) = make_uint2(lo, hi);
        } else {
            elem::store(v, off, x.x);
            elem::store(v, off + v.s[3], x.y);
            elem::store(v, off + 2 * v.s[3], x.z);
            elem::store(v, off + 3 * v.s[3], x.w);
        }
    }
    __syncwarp(); /* the tile is read before the warp's next stage_out writes it */
}

template <int P>
__global__ void __launch_bounds__(kLocalThreads, 1) rwkv7_chunk_bwd_local_kernel(const __grid_constant__ Rwkv7ChunkBwdParams p) {
    using SM = LocalSmem;
    constexpr int N = kN, C = kC, NT = kLocalThreads, TS = SM::TS, SS = SM::SS, CT = SM::CT;
    constexpr int RG = NT / N, RPT = C / RG; /* staging: column tid % N, rows ig + RG m */
    static_assert(NT == 512 && NT % N == 0 && C % RG == 0, "16 warps: two per 16 x 16 tile (2 x 4) of C x N");
    extern __shared__ float4 smem4[];
    float* sm = reinterpret_cast<float*>(smem4);
    float *sR = sm + SM::R, *sA = sm + SM::A, *sB = sm + SM::B, *sK = sm + SM::K;
    float *sRe = sm + SM::RE, *sAe = sm + SM::AE, *sBi = sm + SM::BI, *sKi = sm + SM::KI;
    float *sV = sm + SM::V, *sDY = sm + SM::DY, *sU = sm + SM::U, *sDX = sm + SM::DX;
    float *sG = sm + SM::G, *sDLW = sm + SM::DLW, *sSe = sm + SM::SE, *sDS = sm + SM::DS;
    float* sM = sm + SM::M;
    const float *AakT = sM + C * CT, *ArbT = sM + 2 * C * CT, *ArkT = sM + 3 * C * CT;
    const float *AabT = sM, *AabN = sM + 4 * C * CT;
    float *dArb = sM, *dArk = sM + C * CT, *dAab = sM + 2 * C * CT, *dAak = sM + 3 * C * CT;
    float *sDG = sm + SM::DG, *sDGP = sm + SM::DGP, *sGam = sm + SM::GM, *sDgam = sm + SM::DGAM, *sRed = sm + SM::RED;
    float* sDgq = sm + SM::DGQ;
    float* sSt = sm + SM::ST + (threadIdx.x >> 5) * 256; /* the warp's staging tile */
    float *sEG = sm + SM::EG, *sENG = sm + SM::ENG;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const int64_t c = blockIdx.x % p.nc, sh = blockIdx.x / p.nc;
    const int64_t h = sh % p.H, s = sh / p.H, t0 = c * C;
    const float* ws = p.ws + (size_t)blockIdx.x * WS::FLOATS;
    const float* dsx = p.ds + (size_t)blockIdx.x * kDsFloats;
    /* the warp's tile of a C x N result: rows m0 .. m0 + 15, columns n0 .. n0 + 15; warps w and
     * w + 8 share a tile (each computes a different product of it) */
    const int w8 = warp & 7, hi = warp >> 3, m0 = 16 * (w8 & 1), n0 = 16 * (w8 >> 1);

    /* S_e and dS_x by cp.async, issued first: their latency overlaps the token loads and the
     * G scan (waited for before the barrier that ends the scan; first read after it) */
    for (int e = tid; e < N * N / 4; e += NT) {
        const int i = e / (N / 4), j = 4 * (e % (N / 4));
        cp_async16(sSe + i * SS + j, ws + WS::L + 4 * e);
        cp_async16(sDS + i * SS + j, dsx + 4 * e);
    }
    cp_async_commit();

    /* tokens (zero past T), dY, the log decays g (G after the scan) and d log decay / dw */
    {
        const int j = tid % N, ig = tid / N;
        const int64_t br = s * p.r.s[0] + h * p.r.s[2] + j * p.r.s[3], bw = s * p.w.s[0] + h * p.w.s[2] + j * p.w.s[3];
        const int64_t bk = s * p.k.s[0] + h * p.k.s[2] + j * p.k.s[3], bv = s * p.v.s[0] + h * p.v.s[2] + j * p.v.s[3];
        const int64_t ba = s * p.a.s[0] + h * p.a.s[2] + j * p.a.s[3], bb = s * p.b.s[0] + h * p.b.s[2] + j * p.b.s[3];
        const int64_t bd = s * p.dy.s[0] + h * p.dy.s[2] + j * p.dy.s[3];
#pragma unroll 4
        for (int m = 0; m < RPT; ++m) {
            const int u = ig + RG * m;
            const int64_t t = min64(t0 + u, p.T - 1);
            const bool in = t0 + u < p.T;
            const float r = elem::load(p.r, br + t * p.r.s[1]), w = elem::load(p.w, bw + t * p.w.s[1]);
            const float k = elem::load(p.k, bk + t * p.k.s[1]), v = elem::load(p.v, bv + t * p.v.s[1]);
            const float a = elem::load(p.a, ba + t * p.a.s[1]), b = elem::load(p.b, bb + t * p.b.s[1]);
            const float dy = elem::load(p.dy, bd + t * p.dy.s[1]);
            sR[u * TS + j] = in ? r : 0.0f;
            sK[u * TS + j] = in ? k : 0.0f;
            sA[u * TS + j] = in ? a : 0.0f;
            sB[u * TS + j] = in ? b : 0.0f;
            sV[u * TS + j] = in ? v : 0.0f;
            sDY[u * TS + j] = in ? dy : 0.0f;
            sG[u * N + j] = in ? clampw_log_decay(w) : 0.0f;
            /* d log decay / dw = -exp(-1/2) sigmoid'(w), as decay_of's CLAMPW */
            const float z = expf(-fabsf(w));
            const float inv = 1.0f / (1.0f + z);
            sDLW[u * N + j] = -kClampwC * (z * inv * inv);
        }
    }
    __syncthreads();

    /* G, the cumulative log decay: a column per thread, summed in token order (the serial part:
     * 32 adds; the exponentials and the scaled vectors go to all threads below) */
    if (tid < N) {
        const int j = tid;
        float G = 0.0f;
#pragma unroll
        for (int u = 0; u < C; ++u) {
            G += sG[u * N + j];
            sG[u * N + j] = G;
        }
        sGam[j] = expf(G);
    }
    __syncthreads();

    /* the scaled vectors, all threads: column tid % N, rows ig + RG m (as the staging) */
    {
        const int j = tid % N, ig = tid / N;
#pragma unroll 4
        for (int m = 0; m < RPT; ++m) {
            const int u = ig + RG * m;
            const float G = sG[u * N + j], gp = u > 0 ? sG[(u - 1) * N + j] : 0.0f;
            const float eg = expf(G), eni = expf(-G);
            sEG[u * N + j] = eg;
            sENG[u * N + j] = eni;
            sRe[u * TS + j] = sR[u * TS + j] * eg;
            sAe[u * TS + j] = sA[u * TS + j] * expf(gp);
            sBi[u * TS + j] = sB[u * TS + j] * eni;
            sKi[u * TS + j] = sK[u * TS + j] * eni;
        }
    }
    cp_async_wait_all(); /* S_e, dS_x */
    __syncthreads();

    /* Aab, Aak (s < t), Arb, Ark (s <= t), transposed, and Aab as is. Warp: the 16 rows m0 of
     * X Y^T, X = Ae | Re, Y = Bi | Ki (matrix mi = 2 x + y), columns 16 hi .. 16 hi + 15. Also
     * dS_x o gamma in place, and dgam's column sums as 4 partials per column (the first 256
     * threads, not 64 down whole columns). */
    {
        const int x = (warp >> 1) & 1, y = (warp >> 2) & 1, mi = 2 * x + y;
        float acc[2][4];
        zero(acc);
        mma_acc<P>(acc, (x ? sRe : sAe) + m0 * TS, TS, 1, (y ? sKi : sBi) + 16 * hi * TS, 1, TS, 0, N);
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int t = m0 + g + 8 * (e >> 1), sj = 16 * hi + 8 * n + 2 * q + (e & 1);
                const float val = (mi < 2 ? sj < t : sj <= t) ? acc[n][e] : 0.0f;
                sM[mi * C * CT + sj * CT + t] = val;
                if (mi == 0) sM[4 * C * CT + t * CT + sj] = val;
            }
        if (tid < 4 * N) {
            const int j = tid % N; /* column j, rows tid / N + 4 m */
            const float gam = sGam[j];
            float part = 0.0f;
#pragma unroll 4
            for (int i = tid / N; i < N; i += 4) {
                const float dsg = sDS[i * SS + j] * gam;
                part = fmaf(sSe[i * SS + j], dsg, part);
                sDS[i * SS + j] = dsg;
            }
            sDgq[tid] = part;
        }
    }
    __syncthreads();

    /* U0 = Ae S_e^T + Aak V into U, and dU = Arb^T dY + Bh dS_x^T (Bh dS_x^T = Bi (dS_x o
     * gamma)^T) into DX: the warp's 16 x 16 tile of each (Aak[t][u] = 0 for u >= t, Arb[t][s]
     * = 0 for t < s: the k ranges stop / start at the tile) */
    {
        float acc[2][4];
        zero(acc);
        if (hi == 0) { /* U0 */
            mma_acc<P>(acc, sAe + m0 * TS, TS, 1, sSe + n0 * SS, 1, SS, 0, N);
            mma_acc<P>(acc, AakT + m0, 1, CT, sV + n0, TS, 1, 0, m0 + 16);
        } else { /* dU */
            mma_acc<P>(acc, ArbT + m0 * CT, CT, 1, sDY + n0, TS, 1, m0, C);
            mma_acc<P>(acc, sBi + m0 * TS, TS, 1, sDS + n0 * SS, 1, SS, 0, N);
        }
        float* dst = hi == 0 ? sU : sDX;
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) dst[(m0 + g + 8 * (e >> 1)) * TS + n0 + 8 * n + 2 * q + (e & 1)] = acc[n][e];
    }
    __syncthreads();

    /* two independent column walks: U = (I - Aab)^-1 U0 (forward substitution), dX = (I -
     * Aab)^-T dU (back substitution, last token first); and dgam gamma = column sums of S_e o
     * (dS_x o gamma) from the partial sums */
    if (tid < N) {
        const int i = tid;
        float xv[C];
#pragma unroll
        for (int t = 0; t < C; ++t) xv[t] = sU[t * TS + i];
#pragma unroll
        for (int u = 0; u < C; ++u) axpy_row<C>(xv, AabT + u * CT, xv[u], u + 1);
#pragma unroll
        for (int t = 0; t < C; ++t) sU[t * TS + i] = xv[t];
    } else if (tid < 2 * N) {
        const int i = tid - N;
        float xv[C];
#pragma unroll
        for (int t = 0; t < C; ++t) xv[t] = sDX[t * TS + i];
#pragma unroll
        for (int u = C - 1; u > 0; --u) axpy_row_below<C>(xv, AabN + u * CT, xv[u], u);
#pragma unroll
        for (int t = 0; t < C; ++t) sDX[t * TS + i] = xv[t];
    } else if (tid < 3 * N) {
        const int j = tid - 2 * N;
        sDgam[j] = (sDgq[j] + sDgq[N + j]) + (sDgq[2 * N + j] + sDgq[3 * N + j]);
    }
    __syncthreads();

    /* warps 0-7: dv = Ark^T dY + Aak^T dX + Kh dS_x^T (value column i); meanwhile warps 8-15:
     * dArb = tril(dY U^T), dArk = tril(dY V^T), dAab = stril(dX U^T), dAak = stril(dX V^T), the
     * warp's rows m0 of X Y^T, X = dY | dX, Y = U | V (matrix mi = 2 x + y), held in registers
     * until the forward matrices (read by dv) are done, then written over them */
    {
        const int x = (warp >> 1) & 1, y = (warp >> 2) & 1, mi = 2 * x + y;
        float acc[4][4];
        zero(acc);
        if (hi == 0) {
            float dv[2][4];
            zero(dv);
            mma_acc<P>(dv, ArkT + m0 * CT, CT, 1, sDY + n0, TS, 1, m0, C);
            mma_acc<P>(dv, AakT + m0 * CT, CT, 1, sDX + n0, TS, 1, m0, C);
            mma_acc<P>(dv, sKi + m0 * TS, TS, 1, sDS + n0 * SS, 1, SS, 0, N);
            stage_out(sSt, dv, p.dv, s * p.dv.s[0] + h * p.dv.s[2], t0 + m0, n0, p.T);
        } else {
            mma_acc<P>(acc, (x ? sDX : sDY) + m0 * TS, TS, 1, y ? sV : sU, 1, TS, 0, N);
        }
        __syncthreads(); /* the forward matrices are done: dM goes over them */
        if (hi != 0) {
#pragma unroll
            for (int n = 0; n < 4; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int t = m0 + g + 8 * (e >> 1), sj = 8 * n + 2 * q + (e & 1);
                    sM[mi * C * CT + t * CT + sj] = (mi < 2 ? sj <= t : sj < t) ? acc[n][e] : 0.0f;
                }
        }
    }
    __syncthreads();

    /* the token gradients of the warp's tile (token t, key column j), warps 0-7 dr and da,
     * warps 8-15 db and dk:
     *   dr = e^G (dY S_e + dArb Bi + dArk Ki),  da = e^Gp (dX S_e + dAab Bi + dAak Ki),
     *   db = e^-G (U dSg + dArb^T Re + dAab^T Ae),  dk = e^-G (V dSg + dArk^T Re + dAak^T Ae)
     * with dSg = dS_x o gamma; the log-decay gradient's per-token terms: r dr and a da into DG
     * and DGP, b db + k dk kept in registers and taken off DG after a barrier */
    float dGb[2][4];
    if (hi == 0) {
        float ar[2][4], aa[2][4];
        zero(ar);
        zero(aa);
        mma_acc<P>(ar, sDY + m0 * TS, TS, 1, sSe + n0, SS, 1, 0, N);
        mma_acc<P>(ar, dArb + m0 * CT, CT, 1, sBi + n0, TS, 1, 0, m0 + 16);
        mma_acc<P>(ar, dArk + m0 * CT, CT, 1, sKi + n0, TS, 1, 0, m0 + 16);
        mma_acc<P>(aa, sDX + m0 * TS, TS, 1, sSe + n0, SS, 1, 0, N);
        mma_acc<P>(aa, dAab + m0 * CT, CT, 1, sBi + n0, TS, 1, 0, m0 + 16);
        mma_acc<P>(aa, dAak + m0 * CT, CT, 1, sKi + n0, TS, 1, 0, m0 + 16);
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int t = m0 + g + 8 * (e >> 1), j = n0 + 8 * n + 2 * q + (e & 1);
                ar[n][e] *= sEG[t * N + j];                        /* dr */
                aa[n][e] *= t > 0 ? sEG[(t - 1) * N + j] : 1.0f; /* da: e^Gp, e^0 = 1 */
                sDG[t * N + j] = sR[t * TS + j] * ar[n][e];
                sDGP[t * N + j] = sA[t * TS + j] * aa[n][e];
            }
        stage_out(sSt, ar, p.dr, s * p.dr.s[0] + h * p.dr.s[2], t0 + m0, n0, p.T);
        stage_out(sSt, aa, p.da, s * p.da.s[0] + h * p.da.s[2], t0 + m0, n0, p.T);
    } else {
        float ab[2][4], ak[2][4];
        zero(ab);
        zero(ak);
        mma_acc<P>(ab, sU + m0 * TS, TS, 1, sDS + n0, SS, 1, 0, N);
        mma_acc<P>(ak, sV + m0 * TS, TS, 1, sDS + n0, SS, 1, 0, N);
        /* dgam's part through G_L: sum over the tile's tokens of dBh o Bh + dKh o Kh (gamma
         * in dSg), then over the 8 lanes of a column (g), one partial per row tile */
        float red[2][2];
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int j = n0 + 8 * n + 2 * q + e;
                red[n][e] = ab[n][e] * sBi[(m0 + g) * TS + j] + ak[n][e] * sKi[(m0 + g) * TS + j] +
                            ab[n][e + 2] * sBi[(m0 + g + 8) * TS + j] + ak[n][e + 2] * sKi[(m0 + g + 8) * TS + j];
#pragma unroll
                for (int o = 4; o < 32; o <<= 1) red[n][e] += __shfl_xor_sync(0xffffffffu, red[n][e], o);
                if (g == 0) sRed[(m0 / 16) * N + j] = red[n][e];
            }
        mma_acc<P>(ab, dArb + m0, 1, CT, sRe + n0, TS, 1, m0, C);
        mma_acc<P>(ab, dAab + m0, 1, CT, sAe + n0, TS, 1, m0, C);
        mma_acc<P>(ak, dArk + m0, 1, CT, sRe + n0, TS, 1, m0, C);
        mma_acc<P>(ak, dAak + m0, 1, CT, sAe + n0, TS, 1, m0, C);
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int t = m0 + g + 8 * (e >> 1), j = n0 + 8 * n + 2 * q + (e & 1);
                const float eni = sENG[t * N + j];
                ab[n][e] *= eni; /* db */
                ak[n][e] *= eni; /* dk */
                dGb[n][e] = sB[t * TS + j] * ab[n][e] + sK[t * TS + j] * ak[n][e];
            }
        stage_out(sSt, ab, p.db, s * p.db.s[0] + h * p.db.s[2], t0 + m0, n0, p.T);
        stage_out(sSt, ak, p.dk, s * p.dk.s[0] + h * p.dk.s[2], t0 + m0, n0, p.T);
    }
    __syncthreads(); /* r dr in DG */
    if (hi != 0) {
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int t = m0 + g + 8 * (e >> 1), j = n0 + 8 * n + 2 * q + (e & 1);
                sDG[t * N + j] -= dGb[n][e];
            }
    }
    __syncthreads();

    /* dL/dg_u = sum_{t >= u} dG_t + sum_{t > u} dGp_t (the chunk's last token also carries
     * G_L's terms), then dw = dg * d log decay / dw */
    if (tid < N) { /* the serial part: the suffix sums, dL/dg over DG in place */
        const int j = tid;
        float suf = sDgam[j] + sRed[j] + sRed[N + j], sufp = 0.0f;
#pragma unroll
        for (int u = C - 1; u >= 0; --u) {
            suf += sDG[u * N + j];
            const float dg = suf + sufp;
            sufp += sDGP[u * N + j];
            sDG[u * N + j] = dg;
        }
    }
    __syncthreads();
    { /* dw, all threads: column tid % N, rows ig + RG m */
        const int j = tid % N, ig = tid / N;
        const int64_t bo = s * p.dw.s[0] + h * p.dw.s[2] + (int64_t)j * p.dw.s[3];
#pragma unroll 4
        for (int m = 0; m < RPT; ++m) {
            const int u = ig + RG * m;
            const int64_t t = t0 + u;
            elem::store_if(p.dw, bo + min64(t, p.T - 1) * p.dw.s[1], sDG[u * N + j] * sDLW[u * N + j], t < p.T);
        }
    }
}

} // namespace

size_t rwkv7_chunk_bwd_ws_bytes(int N, int64_t B, int64_t H, int64_t T) {
    const size_t fwd = rwkv7_chunk_ws_bytes(N, B, H, T);
    if (fwd == 0) return 0;
    const int64_t nc = (T + kC - 1) / kC;
    return fwd + (size_t)B * (size_t)H * (size_t)nc * kDsFloats * sizeof(float);
}

int rwkv7_prepare_chunked_bwd(int N) {
    if (N != kN) return (int)cudaErrorInvalidValue;
    cudaError_t e = cudaFuncSetAttribute(rwkv7_chunk_bwd_walk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)(WalkSmem::FLOATS * sizeof(float)));
    if (e != cudaSuccess) return (int)e;
    const int smem = (int)(LocalSmem::FLOATS * sizeof(float));
    e = cudaFuncSetAttribute(rwkv7_chunk_bwd_local_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return (int)e;
    return (int)cudaFuncSetAttribute(rwkv7_chunk_bwd_local_kernel<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
}

int rwkv7_launch_chunked_bwd(int N, const Rwkv7ChunkParams& f, const Rwkv7ChunkBwdParams& p, void* stream) {
    if (N != kN) return (int)cudaErrorInvalidValue;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    int e = rwkv7_launch_chunked(N, f, stream); /* F1, F2 (f.y absent: no outputs) */
    if (e != (int)cudaSuccess) return e;
    const int64_t heads = p.B * p.H;
    rwkv7_chunk_bwd_prep_kernel<<<(unsigned)(heads * p.nc), kPrepThreads, 0, st>>>(p);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return (int)err;
    rwkv7_chunk_bwd_walk_kernel<<<(unsigned)(heads * (kN / kWalkRows)), kWalkRows * 16, WalkSmem::FLOATS * sizeof(float),
                                  st>>>(p);
    err = cudaGetLastError();
    if (err != cudaSuccess) return (int)err;
    /* TF32 products where every tensor is 16-bit, 3xTF32 where any is float32 (their tolerances) */
    const DevView* views[] = {&p.r, &p.w, &p.k, &p.v, &p.a, &p.b, &p.dy, &p.dr, &p.dw, &p.dk, &p.dv, &p.da, &p.db};
    bool any_f32 = false;
    for (const DevView* v : views) any_f32 = any_f32 || v->elem == 0;
    const size_t smem = LocalSmem::FLOATS * sizeof(float);
    if (any_f32)
        rwkv7_chunk_bwd_local_kernel<3><<<(unsigned)(heads * p.nc), kLocalThreads, smem, st>>>(p);
    else
        rwkv7_chunk_bwd_local_kernel<1><<<(unsigned)(heads * p.nc), kLocalThreads, smem, st>>>(p);
    return (int)cudaGetLastError();
}

} // namespace wkv_cuda
