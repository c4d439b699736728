/* RWKV-6 (and RWKV-5: w with a T-stride of 0) WKV on CUDA: forward and backward (checkpoint +
 * replay; never divides by the decay).
 *
 * Semantics are the CPU backend's (backends/cpu/rwkv6.cpp): per (sequence s, head h), S the
 * N x N float32 state S[i][j] (i value row, j key column), u the head's bonus row, per token t:
 *     y[i]    = sum_j r[j] S[i][j]  +  v[i] ruk,   ruk = sum_j r[j] u[j] k[j]   (S before)
 *     S[i][j] = S[i][j] decay[j] + v[i] k[j]
 * Inputs of any dtype are converted to float32 on load; arithmetic and the state are float32.
 * N in {32, 64, 128}.
 *
 * What parallelises: every element S[i][j] is its own scalar recurrence (decay depends on the
 * column only, the update is an outer product). Rows are coupled only through y (a row sum),
 * columns only through the gradients' column sums. So the state is split over threads by
 * element and nothing on the recurrence's chain crosses threads; only the output sums do.
 *
 * ------------------------------------------------------------------------------ ROW SCAN
 * One block of N^2 / 16 threads per (sequence, head): thread (p, q), q < L = N / 4, owns rows
 * 4p .. 4p + 3 and columns 4q .. 4q + 3 (the L lanes of a row group read one contiguous span
 * of shared memory per operand, and each float4 read serves four rows). Tokens are staged kTC
 * at a time in shared memory; the next chunk's global loads are issued before the current
 * chunk is computed. Per token: four partial row dot products, reduced over the L lanes by a
 * reduce-scatter (log2 L + 1 shuffles), the element updates. (Shared-memory bandwidth, not
 * FMA issue, bounded the 2-row version; the 4-row one with 8 lanes halved the reads but left
 * 8 warps per SM and was latency-bound: see NOTES.md.)
 *   forward:  A = r, B = k, V = v, out = y;  state_in -> state_out.
 *   backward, the same scan walked from the last token to the first: with G = dL/dS after
 *   token t (G = dstate_out after the last one),
 *       dv[i] = sum_j G[i][j] k[j] + dy[i] ruk;   G[i][j] = G[i][j] decay[j] + dy[i] r[j]
 *   i.e. A = k, B = r, V = dy, out = dv; dstate_out -> dstate_in.
 *
 * ------------------------------------------------------------------------------ COLUMN SCAN
 * (backward only) dr, dk, dw and du are column sums over the rows:
 *     dr[j] = sum_i Sp[i][j] dy[i] + u[j] k[j] dyv        (Sp = the state before token t)
 *     dk[j] = sum_i G[i][j] v[i]  + r[j] u[j] dyv,       dyv = sum_i dy[i] v[i]
 *     dd[j] = sum_i G[i][j] Sp[i][j];  dw[j] = dd[j] d decay / d w;  du[j] += r[j] k[j] dyv
 * Thread (j, g) owns column j, rows 4 (g + RG c) + e (c < 2, e < 4), RG = N / 8 threads per
 * column on adjacent lanes (the column sums: log2 RG xor-shuffles); blocks of 128 threads hold
 * 1024 / N columns, N^2 / 1024 blocks per (sequence, head). K = kRwkv6SegK = 8 tokens per
 * segment (8 K = 64 replay registers; 16 doubled the registers and halved the occupancy):
 *   A. run the forward (column form) from state_in, storing the state before each segment in
 *      the workspace (checkpoints: each thread its own 8 floats, two coalesced float4);
 *   B. for each segment, last first: replay it from its checkpoint into registers (the K
 *      states before its tokens, 8 K floats per thread), then walk it backwards.
 * Outputs are staged in shared memory and written per segment, coalesced along the columns.
 * du: per thread a running sum in token order (last first), written per (sequence, head); a
 * second kernel sums the partials over sequences 0, 1, ... in order (deterministic: no
 * atomics anywhere). The column scan is launched before the row scan, which writes dstate_in.
 *
 * WORKSPACE (bytes), K = 8:
 *     256 + A256(4 * H * G * N * N)          checkpoints, G = sum_s ceil(L_s / K)
 *         + A256(4 * num_seqs * H * N)       du partials
 * where A256 rounds up to a multiple of 256. E.g. B=8 T=4096 H=32 N=64: 2 GiB + 64 KiB.
 */
#include <initializer_list>

#include "cuda_elem.cuh"

namespace wkv_cuda {
namespace {

using elem::load;
using elem::min64;
using elem::store;

constexpr int kTC = 16;          /* row scan: tokens staged per chunk */
/* row scan: a thread owns 4 rows x 4 columns; the N / 4 lanes of a row group sit in one warp
 * (N <= 128), so a block has N^2 / 16 threads */
__host__ __device__ constexpr int row_lanes(int N) { return N / 4; }
__host__ __device__ constexpr int row_threads(int N) { return N * N / 16; }
constexpr int kColThreads = 128; /* column scan: threads per block */
constexpr int kRS = 8;           /* column scan: rows per thread */
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ int64_t tok(const DevView& v, int64_t b, int64_t t, int64_t h, int64_t n) {
    return b * v.s[0] + t * v.s[1] + h * v.s[2] + n * v.s[3];
}
__device__ __forceinline__ int64_t st_off(const DevView& v, int64_t s, int64_t h, int64_t i, int64_t j) {
    return s * v.s[0] + h * v.s[1] + i * v.s[2] + j * v.s[3];
}

/* The contiguous fast path's element helpers (Vec4, load4, to_float4, store4, load1, store1) are
 * cuda_elem.cuh's, shared with the RWKV-7 forward's producers; vec_type is below. */
using elem::elem_bytes;
using elem::load1;
using elem::load4;
using elem::store1;
using elem::store4;
using elem::to_float4;
using elem::Vec4;

/* The row scan (see the top). BWD walks the tokens last first; SAVE (forward only) stores the
 * column scan's checkpoints at ck (a template switch: the plain forward keeps its registers). */
template <int N, bool BWD, bool SAVE, int VT>
__device__ __forceinline__ void row_scan(const DevView& A, const DevView& B, const DevView& W,
                                         const DevView& V, const DevView& U, const DevView& out,
                                         const DevView& sin, const DevView& sout, int form, int H,
                                         int64_t T, const SeqInfo& seqi, float* ck, int64_t nseg) {
    constexpr int kRows = 4;                /* rows per thread */
    constexpr int kLanes = row_lanes(N);    /* lanes per row group: 8, 16, 32 */
    constexpr int NT = row_threads(N);      /* threads */
    constexpr int NQ = N / (4 * kLanes);    /* float4 column chunks per thread (1) */
    constexpr int PER = kTC * N / NT;       /* loads per tensor per thread (256 / N) */
    static_assert(NQ == 1 && kLanes >= 8 && kLanes <= 32 && PER * NT == kTC * N, "row tile");
    __shared__ __align__(16) float sA[kTC][N];
    __shared__ __align__(16) float sB[kTC][N];
    __shared__ __align__(16) float sD[kTC][N];
    __shared__ __align__(16) float sV[kTC][N];
    __shared__ __align__(16) float sY[kTC][N];
    __shared__ float su[N];
    __shared__ float sruk[kTC];
    const int tid = threadIdx.x;
    const int i = kRows * (tid / kLanes), q = tid % kLanes; /* rows i .. i + 3 */
    const int64_t local = blockIdx.x / H, h = blockIdx.x % H;
    const elem::Seq sq = elem::seq_of(seqi, local, T);
    const int64_t len = sq.t1 - sq.t0;

    float S[kRows][4 * NQ];
    if (sin.data) {
        const float* sp = reinterpret_cast<const float*>(sin.data);
#pragma unroll
        for (int rr = 0; rr < kRows; ++rr)
#pragma unroll
            for (int m = 0; m < NQ; ++m)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    S[rr][4 * m + e] = sp[st_off(sin, sq.s, h, i + rr, 4 * (q + kLanes * m) + e)];
    } else {
#pragma unroll
        for (int rr = 0; rr < kRows; ++rr)
#pragma unroll
            for (int x = 0; x < 4 * NQ; ++x) S[rr][x] = 0.0f;
    }
    if (tid < N) su[tid] = load(U, h * U.s[2] + tid * U.s[3]);

    /* staging, generic path (VT = 0): element e of a tensor for this thread is token slot
     * x0 + XS e, column col */
    constexpr int XS = NT / N;
    const int x0 = tid / N, col = tid % N;
    constexpr int PE = VT == 0 ? PER : 1;
    float pa[PE], pb[PE], pw[PE], pv[PE];
    auto token_of = [&](int64_t idx) { return BWD ? sq.t1 - 1 - idx : sq.t0 + idx; };
    /* vector path (VT != 0): vector e of this thread is idx = tid + NT e of the chunk's
     * kTC x N / 4 per tensor, token slot idx / C4, columns 4 (idx % C4) .. + 3; at N = 128 the
     * chunk has fewer vectors than threads and the rest load a copy they do not store */
    constexpr int C4 = N / 4, NV = kTC * C4, VPER = NV >= NT ? NV / NT : 1;
    static_assert(VPER * NT == NV || (VPER == 1 && NV < NT), "vector tile");
    using Raw = typename Vec4<VT == 0 ? 1 : VT>::raw;
    Raw qa[VT == 0 ? 1 : VPER], qb[VT == 0 ? 1 : VPER], qw[VT == 0 ? 1 : VPER], qv[VT == 0 ? 1 : VPER];
    int vx[VPER], vc[VPER];
    if constexpr (VT != 0) {
#pragma unroll
        for (int e = 0; e < VPER; ++e) {
            const int idx = (tid + NT * e) % NV;
            vx[e] = idx / C4;
            vc[e] = 4 * (idx % C4);
        }
    }
    auto fetch = [&](int64_t c) {
        if constexpr (VT == 0) {
#pragma unroll
            for (int e = 0; e < PER; ++e) {
                const int64_t t = token_of(min64(c * kTC + x0 + XS * e, len - 1)); /* clamped: no branch */
                pa[e] = load(A, tok(A, sq.batch, t, h, col));
                pb[e] = load(B, tok(B, sq.batch, t, h, col));
                pw[e] = load(W, tok(W, sq.batch, t, h, col));
                pv[e] = load(V, tok(V, sq.batch, t, h, col));
            }
        } else {
#pragma unroll
            for (int e = 0; e < VPER; ++e) {
                const int64_t t = token_of(min64(c * kTC + vx[e], len - 1));
                qa[e] = load4<VT>(A, tok(A, sq.batch, t, h, vc[e]));
                qb[e] = load4<VT>(B, tok(B, sq.batch, t, h, vc[e]));
                qw[e] = load4<VT>(W, tok(W, sq.batch, t, h, vc[e]));
                qv[e] = load4<VT>(V, tok(V, sq.batch, t, h, vc[e]));
            }
        }
    };
    /* one token: four partial row dot products, reduced over the kLanes lanes by a
     * reduce-scatter (lanes q and q ^ L/2 swap row pairs, q and q ^ L/4 single rows, the
     * remaining levels add: log2 L + 1 shuffles instead of 4 log2 L), after which lane q holds
     * row `mine` of the group; then the element updates */
    const bool hi = (q & (kLanes / 2)) != 0, mid = (q & (kLanes / 4)) != 0;
    const int mine = 2 * (int)hi + (int)mid;
    const bool writer = (q & (kLanes / 4 - 1)) == 0;
    auto step = [&](int x) {
        const float4 vv = *reinterpret_cast<const float4*>(&sV[x][i]);
        const float vi[kRows] = {vv.x, vv.y, vv.z, vv.w};
        float acc[kRows];
#pragma unroll
        for (int rr = 0; rr < kRows; ++rr) acc[rr] = 0.0f;
#pragma unroll
        for (int m = 0; m < NQ; ++m) {
            const int j = 4 * (q + kLanes * m);
            const float4 a = *reinterpret_cast<const float4*>(&sA[x][j]);
            const float4 b = *reinterpret_cast<const float4*>(&sB[x][j]);
            const float4 d = *reinterpret_cast<const float4*>(&sD[x][j]);
#pragma unroll
            for (int rr = 0; rr < kRows; ++rr) {
                float* s = &S[rr][4 * m];
                acc[rr] = fmaf(s[0], a.x, acc[rr]);
                acc[rr] = fmaf(s[1], a.y, acc[rr]);
                acc[rr] = fmaf(s[2], a.z, acc[rr]);
                acc[rr] = fmaf(s[3], a.w, acc[rr]);
                s[0] = fmaf(s[0], d.x, vi[rr] * b.x);
                s[1] = fmaf(s[1], d.y, vi[rr] * b.y);
                s[2] = fmaf(s[2], d.z, vi[rr] * b.z);
                s[3] = fmaf(s[3], d.w, vi[rr] * b.w);
            }
        }
        float k0 = hi ? acc[2] : acc[0], k1 = hi ? acc[3] : acc[1];
        const float s0 = hi ? acc[0] : acc[2], s1 = hi ? acc[1] : acc[3];
        k0 += __shfl_xor_sync(kFull, s0, kLanes / 2);
        k1 += __shfl_xor_sync(kFull, s1, kLanes / 2);
        float y = mid ? k1 : k0;
        y += __shfl_xor_sync(kFull, mid ? k0 : k1, kLanes / 4);
#pragma unroll
        for (int o = kLanes / 8; o >= 1; o >>= 1) y += __shfl_xor_sync(kFull, y, o);
        if (writer) {
            const float v = mine == 0 ? vi[0] : (mine == 1 ? vi[1] : (mine == 2 ? vi[2] : vi[3]));
            sY[x][i + mine] = fmaf(v, sruk[x], y);
        }
    };
    /* SAVE: the column scan's checkpoints (ck: this (sequence, head)'s area, see the column
     * scan): the state before token K g, element S[i][j] where the column scan's thread
     * (column j, rows 4 (rg + RG c) + e) keeps it, so a thread's 4 rows of one column are one
     * float4 there, and its 4 columns (one block of CB columns) are RG float4 apart. Each
     * element is a scalar recurrence computed with the same fmaf(S, decay, v k) in both
     * kernels, so the bits do not depend on the thread layout. */
    constexpr int K = kRwkv6SegK, RG = N / kRS, CB = kColThreads / RG;
    static_assert(kTC % K == 0 && kRows == 4 && RG * CB == kColThreads && CB % 4 == 0, "checkpoint layout");
    float4* ck4 = nullptr;
    if constexpr (SAVE) {
        const int p4 = i / 4, j0 = 4 * q;
        ck4 = reinterpret_cast<float4*>(ck) + (size_t)(j0 / CB) * (size_t)nseg * 256u + (p4 / RG) * kColThreads +
              (j0 % CB) * RG + p4 % RG;
    }
    auto save = [&](int64_t g) {
        float4* dst = ck4 + (size_t)g * 256u;
#pragma unroll
        for (int e = 0; e < 4; ++e) dst[e * RG] = make_float4(S[0][e], S[1][e], S[2][e], S[3][e]);
    };
    const int64_t nch = (len + kTC - 1) / kTC;
    if (SAVE && nseg > 0) save(0);
    if (len > 0) fetch(0);
    for (int64_t c = 0; c < nch; ++c) {
        const int n = (int)min64(kTC, len - c * kTC);
        __syncthreads(); /* the previous chunk's readers are done */
        if constexpr (VT == 0) {
#pragma unroll
            for (int e = 0; e < PER; ++e) {
                const int x = x0 + XS * e;
                float ddw;
                sA[x][col] = pa[e];
                sB[x][col] = pb[e];
                sD[x][col] = elem::decay_of(form, pw[e], &ddw);
                sV[x][col] = pv[e];
            }
        } else {
#pragma unroll
            for (int e = 0; e < VPER; ++e) {
                if (NV >= NT || tid < NV) {
                    float ddw;
                    const float4 w4 = to_float4<VT>(qw[e]);
                    *reinterpret_cast<float4*>(&sA[vx[e]][vc[e]]) = to_float4<VT>(qa[e]);
                    *reinterpret_cast<float4*>(&sB[vx[e]][vc[e]]) = to_float4<VT>(qb[e]);
                    *reinterpret_cast<float4*>(&sV[vx[e]][vc[e]]) = to_float4<VT>(qv[e]);
                    *reinterpret_cast<float4*>(&sD[vx[e]][vc[e]]) =
                        make_float4(elem::decay_of(form, w4.x, &ddw), elem::decay_of(form, w4.y, &ddw),
                                    elem::decay_of(form, w4.z, &ddw), elem::decay_of(form, w4.w, &ddw));
                }
            }
        }
        fetch(c + 1 < nch ? c + 1 : c); /* the next chunk's loads fly during this one */
        __syncthreads();
        {
            const int w = tid >> 5, lane = tid & 31;
            for (int x = w; x < kTC; x += NT / 32) {
                float a = 0.0f;
#pragma unroll
                for (int z = 0; z < N / 32; ++z) {
                    const int j = lane + 32 * z;
                    a = fmaf(sA[x][j] * su[j], sB[x][j], a);
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(kFull, a, o);
                if (lane == 0) sruk[x] = a;
            }
        }
        __syncthreads();
        /* SAVE: checkpoint K g is stored where its state is live anyway when it can be: the
         * chunk's first one (x = 0) at the end of the previous chunk (or before the first),
         * after its last step; only the mid-chunk ones are stored between steps. ptxas sinks
         * a chunk's global stores towards its end, so a state stored at x = 0 was held in 16
         * extra registers through the chunk (the saving forward needed 142 registers against
         * the plain one's 105 and got 127: NOTES v10). */
        if (n == kTC) { /* whole chunk: straight-line code, tokens can overlap */
#pragma unroll
            for (int x = 0; x < kTC; ++x) {
                if (SAVE && x % K == 0 && x > 0) save(c * (kTC / K) + x / K);
                step(x);
            }
            if (SAVE && (c + 1) * (kTC / K) < nseg) save((c + 1) * (kTC / K));
        } else { /* the last chunk: no checkpoint after it */
            for (int x = 0; x < n; ++x) {
                if (SAVE && x % K == 0 && x > 0) save(c * (kTC / K) + x / K);
                step(x);
            }
        }
        __syncthreads();
        if (out.data) {
            if constexpr (VT == 0) {
#pragma unroll
                for (int e = 0; e < PER; ++e) {
                    const int x = x0 + XS * e;
                    if (x < n) store(out, tok(out, sq.batch, token_of(c * kTC + x), h, col), sY[x][col]);
                }
            } else {
#pragma unroll
                for (int e = 0; e < VPER; ++e) {
                    const int x = vx[e];
                    if (x < n && (NV >= NT || tid < NV))
                        store4<VT>(out, tok(out, sq.batch, token_of(c * kTC + x), h, vc[e]),
                                   *reinterpret_cast<const float4*>(&sY[x][vc[e]]));
                }
            }
        }
    }
    if (sout.data) {
        float* sp = reinterpret_cast<float*>(sout.data);
#pragma unroll
        for (int rr = 0; rr < kRows; ++rr)
#pragma unroll
            for (int m = 0; m < NQ; ++m)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    sp[st_off(sout, sq.s, h, i + rr, 4 * (q + kLanes * m) + e)] = S[rr][4 * m + e];
    }
}

/* The plain forward's register count (128 at N = 64, 168 at N = 32) sets its occupancy (16
 * warps / SM at N = 64: see NOTES v5); the saving one asks for the same blocks per SM, or its
 * extra registers (158 / 210 unbounded) would halve them (N = 64: 1.82 -> 2.84 ms). */
__host__ __device__ constexpr int row_min_blocks(int N) { return N == 32 ? 6 : (N == 64 ? 2 : 1); }

template <int N, bool SAVE, int VT>
__global__ void __launch_bounds__(row_threads(N), SAVE ? row_min_blocks(N) : 1)
    rwkv6_forward_kernel(const Rwkv6FwdParams p) {
    constexpr int K = kRwkv6SegK;
    float* ck = nullptr;
    int64_t nseg = 0;
    if (SAVE) { /* the column scan's checkpoint base of this (sequence, head) */
        const int64_t local = blockIdx.x / p.H, h = blockIdx.x % p.H;
        const elem::Seq sq = elem::seq_of(p.seq, local, p.T);
        nseg = (sq.t1 - sq.t0 + K - 1) / K;
        const int64_t seg0 = p.seq.packed ? p.seg0[local] : sq.s * ((p.T + K - 1) / K);
        ck = p.ckpt + ((size_t)seg0 * (size_t)p.H + (size_t)h * (size_t)nseg) * (size_t)N * N;
    }
    row_scan<N, false, SAVE, VT>(p.r, p.k, p.w, p.v, p.u, p.y, p.state_in, p.state_out, p.form, p.H, p.T, p.seq,
                             ck, nseg);
}

template <int N, int VT>
__global__ void __launch_bounds__(row_threads(N), 1) rwkv6_bwd_rows_kernel(const Rwkv6BwdParams p) {
    row_scan<N, true, false, VT>(p.k, p.r, p.w, p.dy, p.u, p.dv, p.dstate_out, p.dstate_in, p.form, p.H, p.T, p.seq,
                      nullptr, 0);
}

/* The column scan (see the top). */
template <int N, int VT>
__global__ void __launch_bounds__(kColThreads, 4) rwkv6_bwd_cols_kernel(const Rwkv6BwdParams p) {
    constexpr int K = kRwkv6SegK;
    constexpr int RG = N / kRS;             /* threads per column */
    constexpr int CB = kColThreads / RG;    /* columns per block */
    constexpr int NB = N / CB;              /* blocks per (sequence, head) */
    constexpr int PV = K * N / kColThreads; /* v / dy loads per thread per segment */
    constexpr int PC = (K * CB + kColThreads - 1) / kColThreads; /* r / k / w loads per thread */
    constexpr int XC = kColThreads / CB;    /* r / k / w slot step */
    static_assert(CB * N == 1024 && PV * kColThreads == K * N && PC * kColThreads >= K * CB, "tile");
    __shared__ __align__(16) float sV[K][N];
    __shared__ __align__(16) float sDY[K][N];
    __shared__ __align__(16) float4 sQ[K][CB]; /* r, k, decay, d decay / d w */
    __shared__ float sO[3][K][CB];             /* dr, dk, dw */
    __shared__ float sdyv[K];
    __shared__ float su[CB];
    __shared__ float4 sCk[2][2][kColThreads]; /* checkpoints, one segment ahead (cp.async) */
    const int H = p.H;
    const int tid = threadIdx.x;
    const int cl = tid / RG, rg = tid % RG;
    const int64_t blk = blockIdx.x / NB;
    const int cb = (int)(blockIdx.x % NB);
    const int64_t local = blk / H, h = blk % H;
    const elem::Seq sq = elem::seq_of(p.seq, local, p.T);
    const int j = cb * CB + cl;
    const int64_t len = sq.t1 - sq.t0;
    const int64_t nseg = (len + K - 1) / K;
    const int64_t seg0 = p.seq.packed ? p.seg0[local] : sq.s * ((p.T + K - 1) / K);
    /* this block's checkpoints: nseg areas of 1024 floats, float4 (c * 128 + tid) of each */
    float4* ck = reinterpret_cast<float4*>(p.ckpt + ((size_t)seg0 * (size_t)H + (size_t)h * (size_t)nseg) * (size_t)N * N +
                                           (size_t)cb * (size_t)nseg * 1024u);
    if (tid < CB) su[tid] = load(p.u, h * p.u.s[2] + (int64_t)(cb * CB + tid) * p.u.s[3]);
    auto row = [&](int c, int e) { return 4 * (rg + RG * c) + e; };

    /* staging (element e: v / dy slot xv + (128 / N) e, row rv; r / k / w slot xc + XC e,
     * column cc; slots past K (N = 128) are loaded clamped and dropped) */
    const int xv = tid / N, rv = tid % N, xc = tid / CB, cc = tid % CB;
    constexpr int PVE = VT == 0 ? PV : 1;
    float fv[PVE], fdy[PVE], fr[PC], fk[PC], fw[PC];
    /* vector path (VT != 0, see Vec4): v and dy by vectors of 4 rows (vector e of this thread:
     * idx = tid + 128 e of the segment's K x N / 4, token slot idx / C4, rows 4 (idx % C4) ..
     * + 3; at N = 32 the rest load a copy they do not store), r / k / w by typed element loads
     * (offsets recomputed per load: kept in registers they spilled at the 128 cap) */
    constexpr int C4 = N / 4, NV = K * C4, VPER = NV >= kColThreads ? NV / kColThreads : 1;
    using Raw = typename Vec4<VT == 0 ? 1 : VT>::raw;
    Raw qv[VT == 0 ? 1 : VPER], qdy[VT == 0 ? 1 : VPER];
    int vx[VPER], vr[VPER];
    if constexpr (VT != 0) {
#pragma unroll
        for (int e = 0; e < VPER; ++e) {
            const int idx = (tid + kColThreads * e) % NV;
            vx[e] = idx / C4;
            vr[e] = 4 * (idx % C4);
        }
    }
    auto fetch = [&](int64_t g, bool bw) {
        const int64_t tb = sq.t0 + g * K;
        if constexpr (VT == 0) {
#pragma unroll
            for (int e = 0; e < PV; ++e) {
                const int64_t t = tb + min64(xv + (kColThreads / N) * e, len - 1 - g * K);
                fv[e] = load(p.v, tok(p.v, sq.batch, t, h, rv));
                if (bw) fdy[e] = load(p.dy, tok(p.dy, sq.batch, t, h, rv));
            }
#pragma unroll
            for (int e = 0; e < PC; ++e) {
                const int64_t t = tb + min64(xc + XC * e, len - 1 - g * K);
                const int64_t jj = cb * CB + cc;
                if (bw) fr[e] = load(p.r, tok(p.r, sq.batch, t, h, jj));
                fk[e] = load(p.k, tok(p.k, sq.batch, t, h, jj));
                fw[e] = load(p.w, tok(p.w, sq.batch, t, h, jj));
            }
        } else {
#pragma unroll
            for (int e = 0; e < VPER; ++e) {
                const int64_t t = tb + min64(vx[e], len - 1 - g * K);
                qv[e] = load4<VT>(p.v, tok(p.v, sq.batch, t, h, vr[e]));
                if (bw) qdy[e] = load4<VT>(p.dy, tok(p.dy, sq.batch, t, h, vr[e]));
            }
#pragma unroll
            for (int e = 0; e < PC; ++e) {
                const int64_t t = tb + min64(xc + XC * e, len - 1 - g * K);
                const int64_t jj = cb * CB + cc;
                if (bw) fr[e] = load1<VT>(p.r, tok(p.r, sq.batch, t, h, jj));
                fk[e] = load1<VT>(p.k, tok(p.k, sq.batch, t, h, jj));
                fw[e] = load1<VT>(p.w, tok(p.w, sq.batch, t, h, jj));
            }
        }
    };
    auto put = [&](bool bw) {
        if constexpr (VT == 0) {
#pragma unroll
            for (int e = 0; e < PV; ++e) {
                sV[xv + (kColThreads / N) * e][rv] = fv[e];
                if (bw) sDY[xv + (kColThreads / N) * e][rv] = fdy[e];
            }
        } else {
#pragma unroll
            for (int e = 0; e < VPER; ++e) {
                if (NV >= kColThreads || tid < NV) {
                    *reinterpret_cast<float4*>(&sV[vx[e]][vr[e]]) = to_float4<VT>(qv[e]);
                    if (bw) *reinterpret_cast<float4*>(&sDY[vx[e]][vr[e]]) = to_float4<VT>(qdy[e]);
                }
            }
        }
#pragma unroll
        for (int e = 0; e < PC; ++e) {
            float ddw;
            const float d = elem::decay_of(p.form, fw[e], &ddw);
            if (xc + XC * e < K) sQ[xc + XC * e][cc] = make_float4(bw ? fr[e] : 0.0f, fk[e], d, ddw);
        }
    };

    /* A. checkpoints (skipped when a saving forward wrote them: the same bits, see row_scan) */
    if (!p.reuse) {
        float cur[kRS];
        if (p.state_in.data) {
            const float* sp = reinterpret_cast<const float*>(p.state_in.data);
#pragma unroll
            for (int c = 0; c < 2; ++c)
#pragma unroll
                for (int e = 0; e < 4; ++e) cur[4 * c + e] = sp[st_off(p.state_in, sq.s, h, row(c, e), j)];
        } else {
#pragma unroll
            for (int e = 0; e < kRS; ++e) cur[e] = 0.0f;
        }
        if (nseg > 0) {
            ck[tid] = make_float4(cur[0], cur[1], cur[2], cur[3]);
            ck[kColThreads + tid] = make_float4(cur[4], cur[5], cur[6], cur[7]);
        }
        if (nseg > 1) fetch(0, false);
        for (int64_t g = 0; g + 1 < nseg; ++g) {
            __syncthreads();
            put(false);
            fetch(g + 2 < nseg ? g + 1 : g, false);
            __syncthreads();
#pragma unroll
            for (int x = 0; x < K; ++x) {
                const float4 qv = sQ[x][cl];
                const float4 va = *reinterpret_cast<const float4*>(&sV[x][row(0, 0)]);
                const float4 vb = *reinterpret_cast<const float4*>(&sV[x][row(1, 0)]);
                const float v[kRS] = {va.x, va.y, va.z, va.w, vb.x, vb.y, vb.z, vb.w};
#pragma unroll
                for (int e = 0; e < kRS; ++e) cur[e] = fmaf(cur[e], qv.z, v[e] * qv.y);
            }
            float4* c = ck + (size_t)(g + 1) * 256u;
            c[tid] = make_float4(cur[0], cur[1], cur[2], cur[3]);
            c[kColThreads + tid] = make_float4(cur[4], cur[5], cur[6], cur[7]);
        }
    }

    /* B. segments in reverse */
    float G[kRS];
    if (p.dstate_out.data) {
        const float* sp = reinterpret_cast<const float*>(p.dstate_out.data);
#pragma unroll
        for (int c = 0; c < 2; ++c)
#pragma unroll
            for (int e = 0; e < 4; ++e) G[4 * c + e] = sp[st_off(p.dstate_out, sq.s, h, row(c, e), j)];
    } else {
#pragma unroll
        for (int e = 0; e < kRS; ++e) G[e] = 0.0f;
    }
    float du_acc = 0.0f;
    /* the segment's checkpoint comes one segment ahead into shared memory by cp.async (no
     * registers: the kernel is at its cap). Each thread copies and later reads only its own two
     * float4, so its cp.async.wait_group is the only synchronisation needed. Pass A's stores
     * are this thread's own writes to the same addresses: fenced before the copies read them. */
    auto ck_fetch = [&](int64_t g) {
        if (g >= 0) {
            const float4* c = ck + (size_t)g * 256u;
            elem::cp_async16(&sCk[g & 1][0][tid], c + tid);
            elem::cp_async16(&sCk[g & 1][1][tid], c + kColThreads + tid);
        }
        elem::cp_async_commit(); /* an empty group when g < 0: one group per segment either way */
    };
    if (!p.reuse) __threadfence_block();
    if (nseg > 0) {
        fetch(nseg - 1, true);
        ck_fetch(nseg - 1);
    }
    for (int64_t g = nseg - 1; g >= 0; --g) {
        const int m = (int)min64(K, len - g * K);
        __syncthreads(); /* the previous segment's readers are done */
        put(true);
        fetch(g > 0 ? g - 1 : 0, true);
        ck_fetch(g - 1);
        __syncthreads();
        {
            const int w = tid >> 5, lane = tid & 31;
#pragma unroll
            for (int x = w; x < K; x += kColThreads / 32) {
                float a = 0.0f;
#pragma unroll
                for (int z = 0; z < N / 32; ++z) a = fmaf(sDY[x][lane + 32 * z], sV[x][lane + 32 * z], a);
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(kFull, a, o);
                if (lane == 0) sdyv[x] = a;
            }
        }
        /* replay: SR[x] = the state before token x of the segment (slots past m hold clamped
         * copies of real tokens: finite, never used) */
        float SR[K][kRS];
        {
            elem::cp_async_wait<1>(); /* this segment's checkpoint (the newest group is g - 1's) */
            const float4 a = sCk[g & 1][0][tid], b = sCk[g & 1][1][tid];
            float cur[kRS] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int x = 0; x < K; ++x) {
#pragma unroll
                for (int e = 0; e < kRS; ++e) SR[x][e] = cur[e];
                if (x + 1 < K) {
                    const float4 qv = sQ[x][cl];
                    const float4 va = *reinterpret_cast<const float4*>(&sV[x][row(0, 0)]);
                    const float4 vb = *reinterpret_cast<const float4*>(&sV[x][row(1, 0)]);
                    const float v[kRS] = {va.x, va.y, va.z, va.w, vb.x, vb.y, vb.z, vb.w};
#pragma unroll
                    for (int e = 0; e < kRS; ++e) cur[e] = fmaf(cur[e], qv.z, v[e] * qv.y);
                }
            }
        }
        __syncthreads(); /* sdyv */
        auto sweep_tok = [&](int x) {
            const float4 qv = sQ[x][cl]; /* r, k, decay, ddw */
            const float4 va = *reinterpret_cast<const float4*>(&sV[x][row(0, 0)]);
            const float4 vb = *reinterpret_cast<const float4*>(&sV[x][row(1, 0)]);
            const float4 ya = *reinterpret_cast<const float4*>(&sDY[x][row(0, 0)]);
            const float4 yb = *reinterpret_cast<const float4*>(&sDY[x][row(1, 0)]);
            const float v[kRS] = {va.x, va.y, va.z, va.w, vb.x, vb.y, vb.z, vb.w};
            const float dy[kRS] = {ya.x, ya.y, ya.z, ya.w, yb.x, yb.y, yb.z, yb.w};
            float dr = 0.0f, dk = 0.0f, dd = 0.0f;
#pragma unroll
            for (int e = 0; e < kRS; ++e) {
                const float sp = SR[x][e], gg = G[e];
                dk = fmaf(gg, v[e], dk);
                dd = fmaf(gg, sp, dd);
                dr = fmaf(sp, dy[e], dr);
                G[e] = fmaf(gg, qv.z, dy[e] * qv.x);
            }
#pragma unroll
            for (int o = 1; o < RG; o <<= 1) {
                dr += __shfl_xor_sync(kFull, dr, o);
                dk += __shfl_xor_sync(kFull, dk, o);
                dd += __shfl_xor_sync(kFull, dd, o);
            }
            const float dyv = sdyv[x], uj = su[cl];
            du_acc = fmaf(qv.x * qv.y, dyv, du_acc);
            if (rg == 0) {
                sO[0][x][cl] = fmaf(uj * qv.y, dyv, dr);
                sO[1][x][cl] = fmaf(qv.x * uj, dyv, dk);
                sO[2][x][cl] = dd * qv.w;
            }
        };
        if (m == K) { /* a whole segment: straight-line code, tokens can overlap */
#pragma unroll
            for (int x = K - 1; x >= 0; --x) sweep_tok(x);
        } else {
#pragma unroll
            for (int x = K - 1; x >= 0; --x)
                if (x < m) sweep_tok(x);
        }
        __syncthreads();
#pragma unroll
        for (int o = 0; o < 3; ++o) {
            const DevView& ov = o == 0 ? p.dr : (o == 1 ? p.dk : p.dw);
#pragma unroll
            for (int e = 0; e < PC; ++e) {
                const int x = xc + XC * e;
                if constexpr (VT == 0) {
                    if (x < m) store(ov, tok(ov, sq.batch, sq.t0 + g * K + x, h, cb * CB + cc), sO[o][x][cc]);
                } else {
                    if (x < m) store1<VT>(ov, tok(ov, sq.batch, sq.t0 + g * K + x, h, cb * CB + cc), sO[o][x][cc]);
                }
            }
        }
    }
    if (rg == 0) p.part[((size_t)sq.s * (size_t)H + (size_t)h) * N + j] = du_acc;
}

__global__ void rwkv6_reduce_kernel(const float* part, DevView du, int64_t S, int32_t H, int32_t N) {
    const int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= (int64_t)H * N) return;
    const int64_t h = x / N, j = x % N;
    float a = 0.0f;
    for (int64_t s = 0; s < S; ++s) a += part[(s * H + h) * N + j];
    store(du, h * du.s[2] + j * du.s[3], a);
}

template <int N, int VT>
int launch_fwd_vt(const Rwkv6FwdParams& p, int64_t blocks, cudaStream_t s) {
    if (p.ckpt) rwkv6_forward_kernel<N, true, VT><<<(unsigned)blocks, row_threads(N), 0, s>>>(p);
    else rwkv6_forward_kernel<N, false, VT><<<(unsigned)blocks, row_threads(N), 0, s>>>(p);
    return (int)cudaGetLastError();
}
template <int N>
int launch_fwd(const Rwkv6FwdParams& p, int64_t blocks, cudaStream_t s) {
    const int vt = vec_type({&p.r, &p.k, &p.w, &p.v, &p.y}, {&p.r, &p.k, &p.w, &p.v, &p.y}, p.seq, p.T, p.H);
    return with_vec_type(vt, [&](auto vt_c) {
        constexpr int VT = decltype(vt_c)::value;
        return launch_fwd_vt<N, VT>(p, blocks, s);
    });
}
template <int N, int VT>
int launch_bwd_vt(const Rwkv6BwdParams& p, int64_t blocks, cudaStream_t s) {
    /* columns first: the row scan overwrites dstate_in, which may alias dstate_out. At N = 32
     * the column scan's vector path spilled at its 128-register cap: the generic one there. */
    rwkv6_bwd_cols_kernel<N, N == 32 ? 0 : VT><<<(unsigned)(blocks * (N * N / 1024)), kColThreads, 0, s>>>(p);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return (int)e;
    rwkv6_bwd_rows_kernel<N, VT><<<(unsigned)blocks, row_threads(N), 0, s>>>(p);
    return (int)cudaGetLastError();
}
template <int N>
int launch_bwd(const Rwkv6BwdParams& p, int64_t blocks, cudaStream_t s) {
    /* one VT for both scans: the column scan stages v and dy by vectors and the rest by typed
     * elements, the row scan k, r, w, dy and dv by vectors */
    const int vt = vec_type({&p.r, &p.k, &p.w, &p.v, &p.dy, &p.dr, &p.dk, &p.dw, &p.dv},
                            {&p.r, &p.k, &p.w, &p.v, &p.dy, &p.dv}, p.seq, p.T, p.H);
    return with_vec_type(vt, [&](auto vt_c) {
        constexpr int VT = decltype(vt_c)::value;
        return launch_bwd_vt<N, VT>(p, blocks, s);
    });
}

} // namespace

/* The vector path's conditions (see Vec4) for one view: 4 consecutive elements along N are
 * contiguous, and every vector's first element is 4-element-aligned: unit N stride, the other
 * strides multiples of 4 where their index can be nonzero, aligned data. */
bool vec_view(const DevView& v, const SeqInfo& q, int64_t T, int32_t H) {
    if (!v.data) return true; /* absent (an output not asked for) */
    const int64_t es = v.elem == 0 ? 4 : 2;
    const bool batch_varies = !q.packed && (q.first != 0 || q.count > 1);
    return v.s[3] == 1 && (!batch_varies || v.s[0] % 4 == 0) && (T <= 1 || v.s[1] % 4 == 0) &&
           (H <= 1 || v.s[2] % 4 == 0) && reinterpret_cast<uintptr_t>(v.data) % (uintptr_t)(4 * es) == 0;
}
/* VT for a launch: wkv_elem + 1 when every view in `all` (present ones) has that dtype and
 * every view in `vec` passes vec_view; 0 (the generic path) otherwise. */
int vec_type(std::initializer_list<const DevView*> all, std::initializer_list<const DevView*> vec,
             const SeqInfo& q, int64_t T, int32_t H) {
    int elem = -1;
    for (const DevView* v : all) {
        if (!v->data) continue;
        if (elem >= 0 && v->elem != elem) return 0;
        elem = v->elem;
    }
    if (elem < 0 || elem > 2) return 0;
    for (const DevView* v : vec)
        if (!vec_view(*v, q, T, H)) return 0;
    return elem + 1;
}


int rwkv6_launch_forward(int N, const Rwkv6FwdParams& p, int64_t blocks, void* stream) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    switch (N) {
    case 32: return launch_fwd<32>(p, blocks, s);
    case 64: return launch_fwd<64>(p, blocks, s);
    case 128: return launch_fwd<128>(p, blocks, s);
    default: return (int)cudaErrorInvalidValue;
    }
}

int rwkv6_launch_backward(int N, const Rwkv6BwdParams& p, int64_t blocks, void* stream) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    switch (N) {
    case 32: return launch_bwd<32>(p, blocks, s);
    case 64: return launch_bwd<64>(p, blocks, s);
    case 128: return launch_bwd<128>(p, blocks, s);
    default: return (int)cudaErrorInvalidValue;
    }
}

int rwkv6_launch_reduce(int N, const float* part, DevView du, int64_t S, int32_t H, void* stream) {
    const int64_t n = (int64_t)H * N;
    rwkv6_reduce_kernel<<<(unsigned)((n + 127) / 128), 128, 0, static_cast<cudaStream_t>(stream)>>>(
        part, du, S, H, N);
    return (int)cudaGetLastError();
}

} // namespace wkv_cuda
