/* RWKV-7 backward in chunks of C = 32 tokens, parallel over time (small batch), fp32 on CUDA
 * cores: a first implementation of NOTES.md "Chunked backward: design", step by step the float64
 * spec design/rwkv7_chunk_bwd.py (same names: W, Aab, Arb, U, dU, dX, dM, ...). CLAMPW, N = 64,
 * unpacked sequences (rwkv7_use_chunked_bwd in cuda_backend.cpp).
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
 *   B3 rwkv7_chunk_bwd_local_kernel, one block per (sequence, head, chunk): the chunk's token
 *      gradients from S_e, dS_x, dY and the inputs (the spec's backward_local), the decay
 *      gradient by the log route (dlog_decay_suffix: exact enough where decay >= 0.545).
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
    constexpr int N = kN, C = kC, NT = kPrepThreads;
    __shared__ float sDY[C][N];
    __shared__ float sZ[C][N];
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
    for (int e = tid; e < N * C; e += NT) {
        const int j = e / C, t = e % C;
        sZ[t][j] = ws[WS::WZ + (size_t)j * 2 * C + C + t];
        ws[WS::YL + (size_t)t * N + j] = ws[WS::WZ + (size_t)j * 2 * C + t]; /* W^T */
    }
    __syncthreads();
    /* thread: column j, rows i = ig + 4 m */
    const int j = tid % N, ig = tid / N;
    float acc[N / 4];
#pragma unroll
    for (int m = 0; m < N / 4; ++m) acc[m] = 0.0f;
#pragma unroll 4
    for (int t = 0; t < C; ++t) {
        const float z = sZ[t][j];
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

/* ---- B3: the chunks' local gradients ------------------------------------------------------ */

constexpr int kLocalThreads = 256;

/* Shared memory, in floats. Token rows [C][NP] (NP = N + 4: float4 rows in distinct banks);
 * the states [N][SP] (SP = N + 1: a warp reading one row's columns or one column's rows is
 * conflict-free); the forward matrices transposed [s][t] (rows of CT = C + 4, float4 reads by
 * the solves) and Aab untransposed, later aliased by the four dM [t][s] (rows of C + 1). */
struct LocalSmem {
    static constexpr int N = kN, C = kC, NP = N + 4, SP = N + 1, CT = C + 4, CP = C + 1, TOK = C * NP;
    static constexpr int R = 0, A = R + TOK, B = A + TOK, K = B + TOK, RE = K + TOK, AE = RE + TOK, BI = AE + TOK,
                         KI = BI + TOK, V = KI + TOK, DY = V + TOK, U = DY + TOK, DX = U + TOK,
                         G = DX + TOK,       /* [C][N] G_t (cumulative log decay) */
        DLW = G + C * N,                     /* [C][N] d log decay / d w */
        SE = DLW + C * N, DS = SE + N * SP,  /* S_e, dS_x [N][SP] */
        M = DS + N * SP,                     /* AabT, AakT, ArbT, ArkT, Aab: 5 x [C][CT]; then dM */
        DG = M + 5 * C * CT, DGP = DG + C * N, /* the log-decay gradient's G and Gp terms */
        GM = DGP + C * N, DGAM = GM + N, RED = DGAM + N, FLOATS = RED + 4 * N;
    static_assert(4 * C * CP <= 5 * C * CT, "dM fits over the matrices");
    static_assert(TOK % 4 == 0 && (SE % 4) == 0 && (M % 4) == 0 && (CT % 4) == 0, "float4 alignment");
};

__global__ void __launch_bounds__(kLocalThreads) rwkv7_chunk_bwd_local_kernel(const __grid_constant__ Rwkv7ChunkBwdParams p) {
    using SM = LocalSmem;
    constexpr int N = kN, C = kC, NT = kLocalThreads, NP = SM::NP, SP = SM::SP, CT = SM::CT, CP = SM::CP;
    constexpr int RG = NT / N, RPT = C / RG; /* row groups, rows per thread (rows ig + RG m) */
    static_assert(NT % N == 0 && C % RG == 0, "thread tiles");
    extern __shared__ float4 smem4[];
    float* sm = reinterpret_cast<float*>(smem4);
    float *sR = sm + SM::R, *sA = sm + SM::A, *sB = sm + SM::B, *sK = sm + SM::K;
    float *sRe = sm + SM::RE, *sAe = sm + SM::AE, *sBi = sm + SM::BI, *sKi = sm + SM::KI;
    float *sV = sm + SM::V, *sDY = sm + SM::DY, *sU = sm + SM::U, *sDX = sm + SM::DX;
    float *sG = sm + SM::G, *sDLW = sm + SM::DLW, *sSe = sm + SM::SE, *sDS = sm + SM::DS;
    float* sM = sm + SM::M;
    const float *AabT = sM, *AakT = sM + C * CT, *ArbT = sM + 2 * C * CT, *ArkT = sM + 3 * C * CT, *AabN = sM + 4 * C * CT;
    float *dArb = sM, *dArk = sM + C * CP, *dAab = sM + 2 * C * CP, *dAak = sM + 3 * C * CP;
    float *sDG = sm + SM::DG, *sDGP = sm + SM::DGP, *sGam = sm + SM::GM, *sDgam = sm + SM::DGAM, *sRed = sm + SM::RED;

    const int tid = threadIdx.x;
    const int64_t c = blockIdx.x % p.nc, sh = blockIdx.x / p.nc;
    const int64_t h = sh % p.H, s = sh / p.H, t0 = c * C;
    const float* ws = p.ws + (size_t)blockIdx.x * WS::FLOATS;
    const float* dsx = p.ds + (size_t)blockIdx.x * kDsFloats;
    const int col = tid % N, ig = tid / N; /* the C x N tiles: column col, rows ig + RG m */

    /* tokens (zero past T), dY, S_e and dS_x */
    {
        const int j = col;
        const int64_t br = s * p.r.s[0] + h * p.r.s[2] + j * p.r.s[3], bw = s * p.w.s[0] + h * p.w.s[2] + j * p.w.s[3];
        const int64_t bk = s * p.k.s[0] + h * p.k.s[2] + j * p.k.s[3], bv = s * p.v.s[0] + h * p.v.s[2] + j * p.v.s[3];
        const int64_t ba = s * p.a.s[0] + h * p.a.s[2] + j * p.a.s[3], bb = s * p.b.s[0] + h * p.b.s[2] + j * p.b.s[3];
        const int64_t bd = s * p.dy.s[0] + h * p.dy.s[2] + j * p.dy.s[3];
#pragma unroll 2
        for (int m = 0; m < RPT; ++m) {
            const int u = ig + RG * m;
            const int64_t t = min64(t0 + u, p.T - 1);
            const bool in = t0 + u < p.T;
            const float r = elem::load(p.r, br + t * p.r.s[1]), w = elem::load(p.w, bw + t * p.w.s[1]);
            const float k = elem::load(p.k, bk + t * p.k.s[1]), v = elem::load(p.v, bv + t * p.v.s[1]);
            const float a = elem::load(p.a, ba + t * p.a.s[1]), b = elem::load(p.b, bb + t * p.b.s[1]);
            const float dy = elem::load(p.dy, bd + t * p.dy.s[1]);
            sR[u * NP + j] = in ? r : 0.0f;
            sK[u * NP + j] = in ? k : 0.0f;
            sA[u * NP + j] = in ? a : 0.0f;
            sB[u * NP + j] = in ? b : 0.0f;
            sV[u * NP + j] = in ? v : 0.0f;
            sDY[u * NP + j] = in ? dy : 0.0f;
            sG[u * N + j] = in ? clampw_log_decay(w) : 0.0f;
            /* d log decay / dw = -exp(-1/2) sigmoid'(w), as decay_of's CLAMPW */
            const float z = expf(-fabsf(w));
            const float inv = 1.0f / (1.0f + z);
            sDLW[u * N + j] = -kClampwC * (z * inv * inv);
        }
    }
    for (int e = tid; e < N * N; e += NT) {
        const int i = e / N, j = e % N;
        sSe[i * SP + j] = ws[WS::L + e];
        sDS[i * SP + j] = dsx[e];
    }
    __syncthreads();

    /* G and the scaled vectors, a column per thread */
    if (tid < N) {
        const int j = tid;
        float G = 0.0f;
#pragma unroll 4
        for (int u = 0; u < C; ++u) {
            const float gp = G;
            G += sG[u * N + j];
            sG[u * N + j] = G;
            const float eg = expf(G), eni = expf(-G);
            sRe[u * NP + j] = sR[u * NP + j] * eg;
            sAe[u * NP + j] = sA[u * NP + j] * expf(gp);
            sBi[u * NP + j] = sB[u * NP + j] * eni;
            sKi[u * NP + j] = sK[u * NP + j] * eni;
        }
        sGam[j] = expf(G);
    }
    __syncthreads();

    /* Aab, Aak (s < t), Arb, Ark (s <= t), transposed, and Aab as is: the forward's 2 x 2 tiles */
    constexpr int HC = C / 2;
    for (int e = tid; e < HC * HC; e += NT) {
        const int ti = e / HC, si = e % HC;
        float acc[4][2][2];
        chunk::tile_products<N, C, NP>(sAe, sRe, sBi, sKi, ti, si, acc);
#pragma unroll
        for (int x = 0; x < 2; ++x)
#pragma unroll
            for (int y = 0; y < 2; ++y) {
                const int t = ti + x * HC, sj = si + y * HC;
                const float aab = sj < t ? acc[0][x][y] : 0.0f;
                sM[0 * C * CT + sj * CT + t] = aab;
                sM[1 * C * CT + sj * CT + t] = sj < t ? acc[1][x][y] : 0.0f;
                sM[2 * C * CT + sj * CT + t] = sj <= t ? acc[2][x][y] : 0.0f;
                sM[3 * C * CT + sj * CT + t] = sj <= t ? acc[3][x][y] : 0.0f;
                sM[4 * C * CT + t * CT + sj] = aab;
            }
    }
    __syncthreads();

    /* U0 = Ae S_e^T + Aak V (value column i = col), then U = (I - Aab)^-1 U0 */
    {
        const int i = col;
        float acc[RPT];
#pragma unroll
        for (int m = 0; m < RPT; ++m) acc[m] = 0.0f;
#pragma unroll 4
        for (int j = 0; j < N; ++j) {
            const float se = sSe[i * SP + j];
#pragma unroll
            for (int m = 0; m < RPT; ++m) acc[m] = fmaf(sAe[(ig + RG * m) * NP + j], se, acc[m]);
        }
#pragma unroll 4
        for (int u = 0; u < C; ++u) {
            const float v = sV[u * NP + i];
#pragma unroll
            for (int m = 0; m < RPT; ++m) acc[m] = fmaf(AakT[u * CT + ig + RG * m], v, acc[m]);
        }
#pragma unroll
        for (int m = 0; m < RPT; ++m) sU[(ig + RG * m) * NP + i] = acc[m];
    }
    __syncthreads();
    if (tid < N) {
        const int i = tid;
        float x[C];
#pragma unroll
        for (int t = 0; t < C; ++t) x[t] = sU[t * NP + i];
#pragma unroll
        for (int u = 0; u < C; ++u) axpy_row<C>(x, AabT + u * CT, x[u], u + 1);
#pragma unroll
        for (int t = 0; t < C; ++t) sU[t * NP + i] = x[t];
    }
    /* dU = Arb^T dY + Bh dS_x^T (Bh = bi gamma), into DX */
    {
        const int i = col;
        float acc[RPT];
#pragma unroll
        for (int m = 0; m < RPT; ++m) acc[m] = 0.0f;
#pragma unroll 4
        for (int t = 0; t < C; ++t) {
            const float dy = sDY[t * NP + i];
#pragma unroll
            for (int m = 0; m < RPT; ++m) acc[m] = fmaf(ArbT[(ig + RG * m) * CT + t], dy, acc[m]);
        }
#pragma unroll 4
        for (int j = 0; j < N; ++j) {
            const float d = sDS[i * SP + j] * sGam[j];
#pragma unroll
            for (int m = 0; m < RPT; ++m) acc[m] = fmaf(sBi[(ig + RG * m) * NP + j], d, acc[m]);
        }
#pragma unroll
        for (int m = 0; m < RPT; ++m) sDX[(ig + RG * m) * NP + i] = acc[m];
    }
    __syncthreads();
    /* dX = (I - Aab)^-T dU: back substitution, last token first */
    if (tid < N) {
        const int i = tid;
        float x[C];
#pragma unroll
        for (int t = 0; t < C; ++t) x[t] = sDX[t * NP + i];
#pragma unroll
        for (int u = C - 1; u > 0; --u) axpy_row_below<C>(x, AabN + u * CT, x[u], u);
#pragma unroll
        for (int t = 0; t < C; ++t) sDX[t * NP + i] = x[t];
    } else if (tid < 2 * N) {
        /* dgam = column sums of S_e o dS_x */
        const int j = tid - N;
        float acc = 0.0f;
#pragma unroll 8
        for (int i = 0; i < N; ++i) acc = fmaf(sSe[i * SP + j], sDS[i * SP + j], acc);
        sDgam[j] = acc;
    }
    __syncthreads();

    /* dv = Ark^T dY + Aak^T dX + Kh dS_x^T (value column i = col) */
    {
        const int i = col;
        float acc[RPT];
#pragma unroll
        for (int m = 0; m < RPT; ++m) acc[m] = 0.0f;
#pragma unroll 4
        for (int t = 0; t < C; ++t) {
            const float dy = sDY[t * NP + i], dx = sDX[t * NP + i];
#pragma unroll
            for (int m = 0; m < RPT; ++m)
                acc[m] = fmaf(ArkT[(ig + RG * m) * CT + t], dy, fmaf(AakT[(ig + RG * m) * CT + t], dx, acc[m]));
        }
#pragma unroll 4
        for (int j = 0; j < N; ++j) {
            const float d = sDS[i * SP + j] * sGam[j];
#pragma unroll
            for (int m = 0; m < RPT; ++m) acc[m] = fmaf(sKi[(ig + RG * m) * NP + j], d, acc[m]);
        }
        const int64_t bo = s * p.dv.s[0] + h * p.dv.s[2] + (int64_t)i * p.dv.s[3];
#pragma unroll
        for (int m = 0; m < RPT; ++m) {
            const int64_t t = t0 + ig + RG * m;
            elem::store_if(p.dv, bo + min64(t, p.T - 1) * p.dv.s[1], acc[m], t < p.T);
        }
    }
    __syncthreads(); /* the forward matrices are done: dM goes over them */

    /* dArb = tril(dY U^T), dArk = tril(dY V^T), dAab = stril(dX U^T), dAak = stril(dX V^T) */
    for (int e = tid; e < HC * HC; e += NT) {
        const int ti = e / HC, si = e % HC;
        float acc[4][2][2];
        chunk::tile_products<N, C, NP>(sDY, sDX, sU, sV, ti, si, acc);
#pragma unroll
        for (int x = 0; x < 2; ++x)
#pragma unroll
            for (int y = 0; y < 2; ++y) {
                const int t = ti + x * HC, sj = si + y * HC;
                dArb[t * CP + sj] = sj <= t ? acc[0][x][y] : 0.0f;
                dArk[t * CP + sj] = sj <= t ? acc[1][x][y] : 0.0f;
                dAab[t * CP + sj] = sj < t ? acc[2][x][y] : 0.0f;
                dAak[t * CP + sj] = sj < t ? acc[3][x][y] : 0.0f;
            }
    }
    __syncthreads();

    /* the token gradients, key column j = col, tokens t = ig + RG m */
    {
        const int j = col;
        const int64_t tb = t0 + ig;
        float dGt[RPT], dGp[RPT];
        { /* dr and da */
            float ar[RPT], aa[RPT];
#pragma unroll
            for (int m = 0; m < RPT; ++m) ar[m] = aa[m] = 0.0f;
#pragma unroll 4
            for (int i = 0; i < N; ++i) {
                const float se = sSe[i * SP + j];
#pragma unroll
                for (int m = 0; m < RPT; ++m) {
                    ar[m] = fmaf(sDY[(ig + RG * m) * NP + i], se, ar[m]); /* dRe */
                    aa[m] = fmaf(sDX[(ig + RG * m) * NP + i], se, aa[m]); /* dAe */
                }
            }
#pragma unroll 4
            for (int u = 0; u < C; ++u) {
                const float bi = sBi[u * NP + j], ki = sKi[u * NP + j];
#pragma unroll
                for (int m = 0; m < RPT; ++m) {
                    const int t = ig + RG * m;
                    ar[m] = fmaf(dArb[t * CP + u], bi, fmaf(dArk[t * CP + u], ki, ar[m]));
                    aa[m] = fmaf(dAab[t * CP + u], bi, fmaf(dAak[t * CP + u], ki, aa[m]));
                }
            }
            const int64_t bo_r = s * p.dr.s[0] + h * p.dr.s[2] + (int64_t)j * p.dr.s[3];
            const int64_t bo_a = s * p.da.s[0] + h * p.da.s[2] + (int64_t)j * p.da.s[3];
#pragma unroll
            for (int m = 0; m < RPT; ++m) {
                const int t = ig + RG * m;
                const float G = sG[t * N + j], Gp = t > 0 ? sG[(t - 1) * N + j] : 0.0f;
                const float dr = expf(G) * ar[m], da = expf(Gp) * aa[m];
                dGt[m] = sR[t * NP + j] * dr;
                dGp[m] = sA[t * NP + j] * da;
                const int64_t tt = min64(tb + RG * m, p.T - 1);
                const bool en = tb + RG * m < p.T;
                elem::store_if(p.dr, bo_r + tt * p.dr.s[1], dr, en);
                elem::store_if(p.da, bo_a + tt * p.da.s[1], da, en);
            }
        }
        float red = 0.0f; /* sum over the thread's tokens of dBh o Bh + dKh o Kh */
        { /* db and dk */
            const float gam = sGam[j];
            float ab[RPT], ak[RPT];
#pragma unroll
            for (int m = 0; m < RPT; ++m) ab[m] = ak[m] = 0.0f;
#pragma unroll 4
            for (int i = 0; i < N; ++i) {
                const float d = sDS[i * SP + j];
#pragma unroll
                for (int m = 0; m < RPT; ++m) {
                    ab[m] = fmaf(sU[(ig + RG * m) * NP + i], d, ab[m]); /* dBh */
                    ak[m] = fmaf(sV[(ig + RG * m) * NP + i], d, ak[m]); /* dKh */
                }
            }
#pragma unroll
            for (int m = 0; m < RPT; ++m) {
                const int t = ig + RG * m;
                red = fmaf(ab[m], sBi[t * NP + j] * gam, fmaf(ak[m], sKi[t * NP + j] * gam, red));
                ab[m] *= gam;
                ak[m] *= gam;
            }
#pragma unroll 4
            for (int u = 0; u < C; ++u) {
                const float re = sRe[u * NP + j], ae = sAe[u * NP + j];
#pragma unroll
                for (int m = 0; m < RPT; ++m) {
                    const int t = ig + RG * m; /* the s side: column t of the dM */
                    ab[m] = fmaf(dArb[u * CP + t], re, fmaf(dAab[u * CP + t], ae, ab[m]));
                    ak[m] = fmaf(dArk[u * CP + t], re, fmaf(dAak[u * CP + t], ae, ak[m]));
                }
            }
            const int64_t bo_b = s * p.db.s[0] + h * p.db.s[2] + (int64_t)j * p.db.s[3];
            const int64_t bo_k = s * p.dk.s[0] + h * p.dk.s[2] + (int64_t)j * p.dk.s[3];
#pragma unroll
            for (int m = 0; m < RPT; ++m) {
                const int t = ig + RG * m;
                const float eni = expf(-sG[t * N + j]);
                const float db = eni * ab[m], dk = eni * ak[m];
                dGt[m] -= sB[t * NP + j] * db + sK[t * NP + j] * dk;
                const int64_t tt = min64(tb + RG * m, p.T - 1);
                const bool en = tb + RG * m < p.T;
                elem::store_if(p.db, bo_b + tt * p.db.s[1], db, en);
                elem::store_if(p.dk, bo_k + tt * p.dk.s[1], dk, en);
            }
        }
#pragma unroll
        for (int m = 0; m < RPT; ++m) {
            sDG[(ig + RG * m) * N + j] = dGt[m];
            sDGP[(ig + RG * m) * N + j] = dGp[m];
        }
        sRed[ig * N + j] = red;
    }
    __syncthreads();

    /* dL/dg_u = sum_{t >= u} dG_t + sum_{t > u} dGp_t (the chunk's last token also carries
     * G_L's terms), then dw = dg * d log decay / dw */
    if (tid < N) {
        const int j = tid;
        float last = sDgam[j] * sGam[j];
#pragma unroll
        for (int g = 0; g < RG; ++g) last += sRed[g * N + j];
        float suf = last, sufp = 0.0f;
        const int64_t bo = s * p.dw.s[0] + h * p.dw.s[2] + (int64_t)j * p.dw.s[3];
#pragma unroll 4
        for (int u = C - 1; u >= 0; --u) {
            suf += sDG[u * N + j];
            const float dg = suf + sufp;
            sufp += sDGP[u * N + j];
            const int64_t t = t0 + u;
            elem::store_if(p.dw, bo + min64(t, p.T - 1) * p.dw.s[1], dg * sDLW[u * N + j], t < p.T);
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
    return (int)cudaFuncSetAttribute(rwkv7_chunk_bwd_local_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)(LocalSmem::FLOATS * sizeof(float)));
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
    rwkv7_chunk_bwd_local_kernel<<<(unsigned)(heads * p.nc), kLocalThreads, LocalSmem::FLOATS * sizeof(float), st>>>(p);
    return (int)cudaGetLastError();
}

} // namespace wkv_cuda
