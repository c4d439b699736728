/* RWKV-7 WKV on CUDA: the backward (checkpoint + replay; never divides by the decay). The
 * semantics and the state tile's layout are at the top of rwkv7.cu; the code shared with the
 * forward is rwkv7_step.cuh.
 *
 * ------------------------------------------------------------------------------ BACKWARD
 * K1 = tokens per checkpointed segment, K2 = tokens replayed into shared memory at once (K1 a
 * multiple of K2; chosen per device from the shared memory it offers, see cuda_backend.cpp:
 * on an H100 K1 = 8, K2 = 4 for N = 64, so that two blocks fit on an SM). Per (sequence,
 * head) of L tokens, G = ceil(L / K1) segments:
 *   A. run the forward from state_in, storing the state before each segment in the workspace
 *      (N = 32 / 64: in the forward kernel's row layout and arithmetic, so a saving forward
 *      writes the same bits and a backward reusing them skips this pass: p.reuse);
 *   B. for each segment, last first: stage its tokens (r w k v a b dy, decay, d decay/dw) in
 *      shared memory (N = 32 / 64: its checkpoint too, copied in by cp.async during the previous
 *      segment's last window); for each K2-window of it, last first: reload the checkpoint, replay
 *      the tokens before the window in registers (N = 128: after the first window with the sa it
 *      kept, no dot products), then replay the window storing each state
 *      S_{t-1} (in row quads, see BwdLayout), each sa_t and the per-warp partial sums of
 *      sa_t . dy_t and v_t . dy_t in shared memory; then walk the window backwards with the
 *      state gradient dS held twice in registers:
 *        row form    (thread (rg, q) of its own tile (BwdRowTile): dS[rows][J(q)]) -> dv, d sa (row sums)
 *        column form (thread (j, q): dS[rows of quads q + LC m][j]) -> dk db da dd dr (column sums)
 *      so every sum is over the L (LC) lanes of one row (column), never over the block:
 *        g = dS + dy r^T;  dv = g k;  d sa = g b;  dk = g^T v;  db = g^T sa;
 *        da = S_{t-1}^T d sa;  dd = colsum(g o S_{t-1});  dw = dd * d decay / dw;
 *        dr = S_t^T dy = decay o (S_{t-1}^T dy) + b (sa . dy) + k (v . dy)   (S_t never stored)
 *        dS <- g diag(decay) + d sa a^T.
 *   dstate_in = dS at the end.
 * The workspace holds only the checkpoints: H * sum_s ceil(L_s / K1) * N * N floats (+ 256
 * bytes of alignment slack).
 */
#include "rwkv7_step.cuh"

namespace wkv_cuda {
namespace {

template <int N> struct BwdTile;
/* Block sizes as plain constants (launch bounds cannot name the specialisations above). */
__host__ __device__ constexpr int bwd_threads(int N) { return N == 128 ? 512 : 128; }
template <> struct BwdTile<32> { using T = Tile<32, 2, 8>; };
template <> struct BwdTile<64> { using T = Tile<64, 4, 8>; };
template <> struct BwdTile<128> { using T = Tile<128, 2, 8>; };
/* The row form's tile (dS by rows: dv, d sa). It reads no state, so its layout need not be the
 * replay's: at N = 32 one row x 8 columns per thread over 4 lanes (2 shuffle levels for 2 sums
 * instead of 3 for 4) is -5% bwd-reuse; at N = 64 Tile<64, 2, 4> (8 shuffles instead of 24)
 * was +7.6%, Tile<64, 1, 2> +6% (NOTES v32), so N = 64 and 128 keep the replay's tile. */
template <int N> struct BwdRowTile { using T = typename BwdTile<N>::T; };
template <> struct BwdRowTile<32> { using T = Tile<32, 1, 4>; };

/* ------------------------------------------------------------------------------ backward */

/* Shared-memory layout of the backward, in floats (every region a multiple of 4 floats):
 *   tokens  K1 x [r d ddw k v a b dy : N each]
 *   states  K2 x N x QS        S_{t-1} of window token x, in row quads (below)
 *   sa      K2 x N             sa of each window token
 *   dsa     2 x N              d sa of the current token (double-buffered)
 *   sy      K2 x 2 x NW        per warp partial sums of sa . dy and v . dy of each window token
 *   out     K2 x 6 x N         the window's gradients (dr dw dk dv da db), written out by the
 *                              whole block after the window, coalesced
 *   sap     K1 x N             N = 128 (kKeepSa): sa of the segment's tokens, from its first window
 *   ck      N x N              N = 32 / 64 (kCkptSmem): the segment's checkpoint, row-major
 *                              (the fetch undoes the global layout's ck_slot permutation)
 * Column form (the gradient sweep's column sums): thread (cg, q) = (tid / LC, tid % LC) owns
 * the CC columns cg CC + cc over the row quads qd = q + LC m (rows 4 qd .. 4 qd + 3), so a
 * column's sums take log2(LC) shuffle levels, and it reads its rows of the token vectors as
 * float4s of the natural layout (each serving CC columns). N = 32 / 64: CC = 1, LC = 4 / 2;
 * N = 128: CC = 2, LC = 8 (CC = 1 there: 6.86 ms against 6.24, B = 8 T = 1024; NOTES v14). A
 * state is stored as float4 "quads" (S[4 qd + e][c], e < 4) at float4 index qd QS + swz(c): the
 * replay's tile thread (rows of one quad, columns 4 (g L + q) + e) writes its rows of a column
 * as one float4 (two floats at R = 2), the column-form thread reads one float4 per quad and
 * column.
 * swz(c) = c ^ ((c >> 2) & 7) puts the 8 columns a replay quarter-warp stores in distinct
 * bank groups, and QS = N + 8 / LC the LC quads a column-form quarter-warp reads. */
template <class T>
struct BwdLayout {
    static constexpr int N = T::N;
    static constexpr int CC = N == 128 ? 2 : 1; /* column form: columns per thread */
    static constexpr int LC = T::NT * CC / N;  /* column form: lanes per column group */
    static constexpr int NQ = N / (4 * LC);    /* column form: row quads per thread */
    static constexpr int QS = N + 8 / LC;     /* float4 slots per quad (padded) */
    static constexpr int SF = N * QS;          /* floats per stored state */
    static constexpr int NW = T::NT / 32;      /* warps */
    static constexpr int NOUT = 6; /* staged gradient rows per token: dr dw dk dv da db */
    static constexpr int TOK = 8 * N;
    static_assert((LC == 2 || LC == 4 || LC == 8) && NQ >= 1 && NW % 4 == 0 && T::L == 8, "backward layout");
};

enum { T_R = 0, T_D, T_DDW, T_K, T_V, T_A, T_B, T_DY };

/* Float4 slot of column c in a state quad (see BwdLayout). */
__device__ __forceinline__ int swz(int c) { return c ^ ((c >> 2) & 7); }

/* N = 32 / 64: the segment's checkpoint is copied into shared memory (cp.async) while the
 * previous segment's last window walks, so no window's replay starts with a global-memory round
 * trip (NOTES v18: bwd-reuse -2.7% at N = 64, -3.5% at N = 32). N = 128 (one block per SM, 177
 * KB) would lose K1 = 8 to those 64 KB, and keeps the global read. */
template <int N>
constexpr bool kCkptSmem = N != 128;
/* N = 128: the segment's first window keeps the sa of the tokens it replays, so the later
 * windows replay without dot products or shuffles (K2 = 2 there: 20 full steps per 8 tokens
 * become 8 full + 12 update-only; NOTES v17: -4.9%). At N = 32 / 64 (K2 = 4: 12 -> 8 + 4) it
 * gained nothing alone and lost 1.6-2% together with kCkptSmem. */
template <int N>
constexpr bool kKeepSa = N == 128;
/* N = 128: the replay skips each window's last update, which nothing reads (NOTES v42: backward
 * -5.6% at B = 8 T = 1024 f32); at N = 32 / 64 the branch cost more than the update (+1-2%). */
template <int N>
constexpr bool kSkipDeadUpdate = N == 128;

template <int N>
size_t bwd_smem_floats(int K1, int K2) {
    using Lay = BwdLayout<typename BwdTile<N>::T>;
    return (size_t)K1 * Lay::TOK + (size_t)K2 * Lay::SF + (size_t)K2 * N + 2u * N + (size_t)K2 * 2 * Lay::NW +
           (size_t)K2 * Lay::NOUT * N + (kKeepSa<N> ? (size_t)K1 * N : 0) + (kCkptSmem<N> ? (size_t)N * N : 0);
}

constexpr int kMaxK1 = 8; /* pass A prefetches a whole segment into registers */

/* Pass A in the forward's row layout (see the backward kernel): N = 128 keeps the tile (64
 * state floats per thread at 512 threads would spill), and its forward does not save. */
template <int N>
constexpr bool kRowPassA = N != 128;

/* Two gradient views stored alike (dtype and strides): the write-out's one offset serves both. */
__device__ __forceinline__ bool same_layout(const DevView& a, const DevView& b) {
    return a.elem == b.elem && a.s[0] == b.s[0] && a.s[1] == b.s[1] && a.s[2] == b.s[2] && a.s[3] == b.s[3];
}

template <class E> __device__ __forceinline__ E to_elem(float x);
template <> __device__ __forceinline__ float to_elem<float>(float x) { return x; }
template <> __device__ __forceinline__ __half to_elem<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 to_elem<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

/* VT != 0: the vector path of the segment staging and the window write-out (VT = wkv_elem + 1,
 * chosen per launch by vec_type: the seven token views r w k v a b dy and the six gradient views
 * of one dtype, 4 consecutive aligned elements along N). VT = 0: the element path for anything
 * else (mixed dtypes, strided or unaligned along N). Both parts: bwd-reuse -6.6% at N = 64, -4%
 * at N = 32, 0 at N = 128; the write-out alone was -2.3% (NOTES v35). */
template <int N, int VT = 0>
__global__ void __launch_bounds__(bwd_threads(N), 1)
    rwkv7_backward_kernel(const __grid_constant__ Rwkv7BwdParams p) {
    using T = typename BwdTile<N>::T;
    using RT = typename BwdRowTile<N>::T; /* the row form's tile */
    static_assert(RT::NT == T::NT, "row tile");
    constexpr int RR = RT::R, RL = RT::L, RC = RT::C, RG = RT::G;
    using Lay = BwdLayout<T>;
    static_assert(T::NT == bwd_threads(N), "block size");
    constexpr int R = T::R, L = T::L, C = T::C, G = T::G, TPJ = T::TPJ;
    constexpr int TOK = Lay::TOK, CC = Lay::CC, LC = Lay::LC, NQ = Lay::NQ, QS = Lay::QS, SF = Lay::SF;
    constexpr int NW = Lay::NW;
    constexpr int PERA = kMaxK1 / TPJ;
    extern __shared__ __align__(16) float smem[];
    const int K1 = p.K1, K2 = p.K2;
    float* s_tok = smem;
    float* s_states = s_tok + (size_t)K1 * TOK;
    float* s_sa = s_states + (size_t)K2 * SF;
    float* s_dsa = s_sa + (size_t)K2 * N;
    float* s_sy = s_dsa + 2 * N;
    float* s_out = s_sy + (size_t)K2 * 2 * NW;
    float* s_sap = s_out + (size_t)K2 * Lay::NOUT * N; /* K1 x N: sa of the segment's tokens (kKeepSa) */
    float* s_ck = s_sap + (kKeepSa<N> ? (size_t)K1 * N : 0); /* N x N: the segment's checkpoint (kCkptSmem) */
    constexpr bool CK_SMEM = kCkptSmem<N>;
    enum { O_DR = 0, O_DW, O_DK, O_DV, O_DA, O_DB };
    auto outv = [&](int x, int which) -> float* { return s_out + ((size_t)x * Lay::NOUT + which) * N; };

    const int tid = threadIdx.x;
    const int rg = tid / L, q = tid % L;  /* replay: rows rg R.., columns J(q) */
    const int rgr = tid / RL, qr = tid % RL; /* row form: rows rgr RR.., columns J(qr) of RT */
    const int cg = tid / LC, cq = tid % LC; /* column form: columns cg CC.., quads cq + LC m */
    const int sj = tid % N, su = tid / N; /* staging: column sj, tokens su + TPJ x */
    const SeqPos pos = seq_pos(p.seq, p.H, p.T);
    const int64_t t0 = pos.t0, t1 = pos.t1, len = t1 - t0;
    const int64_t nseg = (len + K1 - 1) / K1;
    const int64_t seg0 = p.seq.packed ? p.seg0[pos.local] : pos.s * ((p.T + K1 - 1) / K1);
    float* ckpt = p.ckpt + ((size_t)seg0 * p.H + (size_t)pos.h * nseg) * (size_t)(N * N);

    auto tokv = [&](int u, int which) -> float* { return s_tok + (size_t)u * TOK + which * N; };

    const TokenCols col = token_cols(p, pos, sj);
    const int64_t bdy = tok_base(p.dy, pos.batch, pos.h) + sj * p.dy.s[3];
    auto ioff = [&](const DevView& v, int64_t base, int64_t t) { return base + t * v.s[1]; };

    /* The tile's checkpoint rows: row rg R + rr, float4 group g at ck + row N + 4 (g L + q). */
    auto store_ckpt = [&](float* ck, const float (&S)[R][C]) {
#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
            float4* row = reinterpret_cast<float4*>(ck + (size_t)(rg * R + rr) * N);
#pragma unroll
            for (int g = 0; g < G; ++g)
                row[g * L + q] = make_float4(S[rr][4 * g], S[rr][4 * g + 1], S[rr][4 * g + 2], S[rr][4 * g + 3]);
        }
    };
    auto load_ckpt = [&](const float* ck, float (&S)[R][C]) {
#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
            const float4* row = reinterpret_cast<const float4*>(ck + (size_t)(rg * R + rr) * N);
#pragma unroll
            for (int g = 0; g < G; ++g) {
                const float4 x = row[g * L + q];
                S[rr][4 * g] = x.x, S[rr][4 * g + 1] = x.y, S[rr][4 * g + 2] = x.z, S[rr][4 * g + 3] = x.w;
            }
        }
    };
    auto step = [&](float (&S)[R][C], int u, float (&sa)[R]) {
        float y[R];
        fwd_step<T>(S, q, tokv(u, T_V) + rg * R, tokv(u, T_D), tokv(u, T_K), tokv(u, T_A),
                    tokv(u, T_B), nullptr, false, sa, y);
    };
    /* fwd_step's update with sa given */
    auto step_known = [&](float (&S)[R][C], int u, const float (&sa)[R]) {
        float vr[R];
        lds_r<R>(tokv(u, T_V) + rg * R, vr);
        fwd_update<T>(S, q, vr, tokv(u, T_D), tokv(u, T_K), tokv(u, T_B), sa);
    };
    /* (kCkptSmem) segment gg's checkpoint into s_ck by asynchronous copies (waited for before the
     * barrier that ends the segment's staging), undoing ck_slot: float4 i = tid + NT x is row
     * i / (N / 4), group i % (N / 4), and each step adds NT / (N / 4) rows, a multiple of 4, so
     * the permutation is the same for all of a thread's copies (one source offset per thread) */
    static_assert(!kCkptSmem<N> || (T::NT / (N / 4)) % 4 == 0, "checkpoint fetch");
    const int ck_r0 = tid / (N / 4);
    const int ck_src0 = ck_r0 * N + 4 * ck_slot<N>(ck_r0, tid % (N / 4));
    auto fetch_ckpt = [&](int64_t gg) {
        const float* src = ckpt + (size_t)gg * (N * N) + ck_src0;
        for (int i = tid; i < N * N / 4; i += T::NT, src += 4 * T::NT) elem::cp_async16(s_ck + 4 * i, src);
        elem::cp_async_commit();
    };

    /* ---------------- A: checkpoints (a forward pass, a segment prefetched ahead), skipped
     * when the forward saved them (p.reuse). For N = 32 and 64 the pass runs in the forward
     * kernel's row layout and arithmetic (row_update, P lanes per row; threads past P N idle),
     * so its checkpoints are the bits a saving forward writes (rwkv7_forward_saves). */
    constexpr int AP = FwdLanes<N>::P, AG = N / AP / 4;
    using AT = Tile<N, 1, AP>;
    const int arow = tid / AP < N ? tid / AP : N - 1, aq = tid % AP; /* clamped: loads only */
    const bool a_on = tid < AP * N;
    if (nseg > 0 && !p.reuse) {
        float S[R][C];
        float SA[1][N / AP];
        if constexpr (kRowPassA<N>) load_state_rows<AT>(p.state_in, pos.s, pos.h, arow, aq, SA);
        else load_state_rows<T>(p.state_in, pos.s, pos.h, rg, q, S);
        float pw[PERA], pk[PERA], pv[PERA], pa[PERA], pb[PERA];
        auto prefetch = [&](int64_t ts) { /* unconditional loads, clamped token (see forward) */
#pragma unroll
            for (int x = 0; x < PERA; ++x) {
                const int u = su + TPJ * x;
                const int64_t t = ts + (u < K1 ? u : K1 - 1);
                pw[x] = elem::load(p.w, ioff(p.w, col.w, t));
                pk[x] = elem::load(p.k, ioff(p.k, col.k, t));
                pv[x] = elem::load(p.v, ioff(p.v, col.v, t));
                pa[x] = elem::load(p.a, ioff(p.a, col.a, t));
                pb[x] = elem::load(p.b, ioff(p.b, col.b, t));
            }
        };
        if (nseg > 1) prefetch(t0);
        for (int64_t g = 0; g < nseg; ++g) {
            if constexpr (kRowPassA<N>) {
                if (a_on) store_row_slices<N, 1, AP, AG>(ckpt + (size_t)g * (N * N), SA, arow, aq);
            } else {
                store_ckpt(ckpt + (size_t)g * (N * N), S);
            }
            if (g + 1 == nseg) break;
            __syncthreads();
#pragma unroll
            for (int x = 0; x < PERA; ++x) {
                const int u = su + TPJ * x;
                if (u < K1) {
                    float ddw;
                    tokv(u, T_D)[sj] = decay_of(p.form, pw[x], &ddw);
                    tokv(u, T_K)[sj] = pk[x];
                    tokv(u, T_V)[sj] = pv[x];
                    tokv(u, T_A)[sj] = pa[x];
                    tokv(u, T_B)[sj] = pb[x];
                }
            }
            __syncthreads();
            if (g + 2 < nseg) prefetch(t0 + (g + 1) * K1);
            if constexpr (kRowPassA<N>) {
                if (a_on) {
                    for (int u = 0; u < K1; ++u) {
                        float4 a4[AG], d4[AG], k4[AG], b4[AG];
                        lds_groups<AP, AG>(tokv(u, T_A), aq, a4);
                        lds_groups<AP, AG>(tokv(u, T_D), aq, d4);
                        lds_groups<AP, AG>(tokv(u, T_K), aq, k4);
                        lds_groups<AP, AG>(tokv(u, T_B), aq, b4);
                        row_update<AP, AG>(SA[0], tokv(u, T_V)[arow], a4, d4, k4, b4);
                    }
                }
            } else {
                for (int u = 0; u < K1; ++u) {
                    float sa[R];
                    step(S, u, sa);
                }
            }
        }
    }

    /* ---------------- B: segments in reverse */
    float dSr[RR][RC], dSc[CC][4 * NQ]; /* dSc[cc][4 m + e]: row 4 (cq + LC m) + e, column cg CC + cc */
    load_state_rows<RT>(p.dstate_out, pos.s, pos.h, rgr, qr, dSr);
    if (p.dstate_out.data) {
        const float* ps = reinterpret_cast<const float*>(p.dstate_out.data);
        const int64_t base = pos.s * p.dstate_out.s[0] + pos.h * p.dstate_out.s[1] + (int64_t)(cg * CC) * p.dstate_out.s[3];
#pragma unroll
        for (int cc = 0; cc < CC; ++cc)
#pragma unroll
            for (int m = 0; m < NQ; ++m)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    dSc[cc][4 * m + e] =
                        ps[base + cc * p.dstate_out.s[3] + (int64_t)(4 * (cq + LC * m) + e) * p.dstate_out.s[2]];
    } else {
#pragma unroll
        for (int cc = 0; cc < CC; ++cc)
#pragma unroll
            for (int i = 0; i < 4 * NQ; ++i) dSc[cc][i] = 0.0f;
    }
    /* element offset of [batch, t, h, c] of a gradient view (computed where it is stored) */
    auto goff = [&](const DevView& v, int64_t t, int64_t c) {
        return pos.batch * v.s[0] + t * v.s[1] + pos.h * v.s[2] + c * v.s[3];
    };

    /* the six gradient views alike (the usual training call): the write-out's fast path */
    const bool same6 = same_layout(p.dr, p.dw) && same_layout(p.dr, p.dk) && same_layout(p.dr, p.dv) &&
                       same_layout(p.dr, p.da) && same_layout(p.dr, p.db);
    /* the replay's state stores (row quads, see BwdLayout): this thread's quad (R = 2: half of
     * one) and 4 swz(4 q) */
    const int st_off = R == 4 ? 4 * rg * QS : 4 * (rg >> 1) * QS + 2 * (rg & 1);
    const int k4 = 4 * ((4 * q) ^ q);
    for (int64_t g = nseg - 1; g >= 0; --g) {
        const int64_t ts = t0 + g * K1;
        const int m = (int)min64(K1, t1 - ts);
        __syncthreads();
        if (CK_SMEM && g == nseg - 1) fetch_ckpt(g); /* later segments': during the one before */
        if constexpr (VT != 0) {
            /* vector staging: thread (vx, vg) moves columns 4 vg .. 4 vg + 3 of token vx (VX >=
             * K1: one token per thread) as one 16-byte (f32) or 8-byte load per view, against 7
             * x K1 / TPJ two-part element loads with 64-bit offsets per thread (the element path
             * below; NOTES v35). Same values, same conversions, same decay calls: the same bits. */
            constexpr int VG = N / 4, VX = T::NT / VG;
            static_assert(VX >= kMaxK1, "vector staging: one token per thread");
            const int vx = tid / VG, vc = 4 * (tid % VG);
            if (vx < m) {
                const int64_t t = ts + vx;
                auto off = [&](const DevView& v) { return pos.batch * v.s[0] + t * v.s[1] + pos.h * v.s[2] + vc; };
                const auto ir4 = elem::load4<VT>(p.r, off(p.r)), iw4 = elem::load4<VT>(p.w, off(p.w));
                const auto ik4 = elem::load4<VT>(p.k, off(p.k)), iv4 = elem::load4<VT>(p.v, off(p.v));
                const auto ia4 = elem::load4<VT>(p.a, off(p.a)), ib4 = elem::load4<VT>(p.b, off(p.b));
                const auto idy4 = elem::load4<VT>(p.dy, off(p.dy));
                const float4 w4 = elem::to_float4<VT>(iw4);
                float4 d4, ddw4;
                d4.x = decay_of(p.form, w4.x, &ddw4.x);
                d4.y = decay_of(p.form, w4.y, &ddw4.y);
                d4.z = decay_of(p.form, w4.z, &ddw4.z);
                d4.w = decay_of(p.form, w4.w, &ddw4.w);
                auto st4 = [&](int which, float4 x) { *reinterpret_cast<float4*>(tokv(vx, which) + vc) = x; };
                st4(T_D, d4);
                st4(T_DDW, ddw4);
                st4(T_K, elem::to_float4<VT>(ik4));
                st4(T_V, elem::to_float4<VT>(iv4));
                st4(T_A, elem::to_float4<VT>(ia4));
                st4(T_B, elem::to_float4<VT>(ib4));
                st4(T_R, elem::to_float4<VT>(ir4));
                st4(T_DY, elem::to_float4<VT>(idy4));
            }
        } else {
            /* staging: per group of tokens, all loads first (no branch), then guarded stores */
            constexpr int PB = kMaxK1 / TPJ, SG = PB < 4 ? PB : 4;
#pragma unroll
            for (int x0 = 0; x0 < PB; x0 += SG) {
                float lr[SG], lw[SG], lk[SG], lv[SG], la[SG], lb[SG], ldy[SG];
#pragma unroll
                for (int x = 0; x < SG; ++x) {
                    const int u = su + TPJ * (x0 + x);
                    const int64_t t = ts + (u < m ? u : m - 1);
                    load_token(p, col, t, lr[x], lw[x], lk[x], lv[x], la[x], lb[x]);
                    ldy[x] = elem::load(p.dy, ioff(p.dy, bdy, t));
                }
#pragma unroll
                for (int x = 0; x < SG; ++x) {
                    const int u = su + TPJ * (x0 + x);
                    if (u < m) {
                        float ddw;
                        tokv(u, T_D)[sj] = decay_of(p.form, lw[x], &ddw);
                        tokv(u, T_DDW)[sj] = ddw;
                        tokv(u, T_K)[sj] = lk[x];
                        tokv(u, T_V)[sj] = lv[x];
                        tokv(u, T_A)[sj] = la[x];
                        tokv(u, T_B)[sj] = lb[x];
                        tokv(u, T_R)[sj] = lr[x];
                        tokv(u, T_DY)[sj] = ldy[x];
                    }
                }
            }
        }
        if constexpr (CK_SMEM) elem::cp_async_wait_all();
        __syncthreads();
        const float* ckg = CK_SMEM ? s_ck : ckpt + (size_t)g * (N * N);
        const int nsub = (m + K2 - 1) / K2;
        for (int sb = nsub - 1; sb >= 0; --sb) {
            const int u0 = sb * K2, mu = min(K2, m - u0);
            /* replay: checkpoint -> state before u0 (registers), then the window into smem.
             * (kKeepSa) The segment's first window (sb = nsub - 1) replays every earlier token
             * and keeps their sa in s_sap; later windows replay with those sa (the update
             * alone: same bits, no dot products, no shuffles). */
            const bool known = kKeepSa<N> && sb < nsub - 1;
            {
                float S[R][C];
                load_ckpt(ckg, S);
                if (known) {
                    for (int u = 0; u < u0; ++u) {
                        float sa[R];
                        lds_r<R>(s_sap + (size_t)u * N + rg * R, sa);
                        step_known(S, u, sa);
                    }
                } else {
                    for (int u = 0; u < u0; ++u) {
                        float sa[R];
                        step(S, u, sa);
                        if constexpr (kKeepSa<N>) sts_r<R>(s_sap + (size_t)u * N + rg * R, sa); /* every lane: same value */
                    }
                }
                for (int x = 0; x < mu; ++x) {
                    /* the state in row quads: this thread's R rows of column c are one float4
                     * (R = 4: a whole quad) or half of one (R = 2) */
                    /* column c = 4 (gg L + q) + e: swz(c) = 32 gg + (kq ^ e), kq = 4 q ^ q (L = 8) */
                    float* st = s_states + (size_t)x * SF + st_off;
#pragma unroll
                    for (int gg = 0; gg < G; ++gg)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            float* dst = st + 128 * gg + (k4 ^ (4 * e));
                            if constexpr (R == 4)
                                *reinterpret_cast<float4*>(dst) =
                                    make_float4(S[0][4 * gg + e], S[1][4 * gg + e], S[2][4 * gg + e], S[3][4 * gg + e]);
                            else
                                *reinterpret_cast<float2*>(dst) = make_float2(S[0][4 * gg + e], S[1][4 * gg + e]);
                        }
                    /* kSkipDeadUpdate: the window's last token takes its sa only, as step
                     * computes it (its update would be dead: the next window starts again from
                     * the checkpoint) */
                    float sa[R];
                    const bool more = !kSkipDeadUpdate<N> || x + 1 < mu;
                    if (known) {
                        lds_r<R>(s_sap + (size_t)(u0 + x) * N + rg * R, sa);
                        if (more) step_known(S, u0 + x, sa);
                    } else if (more) {
                        step(S, u0 + x, sa);
                    } else {
                        rows_dot<T>(S, q, tokv(u0 + x, T_A), sa);
                    }
                    /* sa . dy and v . dy over the warp's rows (the column form's dr needs the
                     * sums over all rows: it adds the NW warps' partials) */
                    float dyr[R], vr[R];
                    lds_r<R>(tokv(u0 + x, T_DY) + rg * R, dyr);
                    lds_r<R>(tokv(u0 + x, T_V) + rg * R, vr);
                    float psy = 0.0f, pvy = 0.0f;
#pragma unroll
                    for (int rr = 0; rr < R; ++rr) {
                        psy = fmaf(sa[rr], dyr[rr], psy);
                        pvy = fmaf(vr[rr], dyr[rr], pvy);
                    }
#pragma unroll
                    for (int o = L; o < 32; o <<= 1) {
                        psy += __shfl_xor_sync(0xffffffffu, psy, o);
                        pvy += __shfl_xor_sync(0xffffffffu, pvy, o);
                    }
                    if (q == 0) sts_r<R>(s_sa + (size_t)x * N + rg * R, sa);
                    if ((tid & 31) == 0) {
                        s_sy[(size_t)(2 * x) * NW + tid / 32] = psy;
                        s_sy[(size_t)(2 * x + 1) * NW + tid / 32] = pvy;
                    }
                }
            }
            __syncthreads();
            /* every thread has read s_ck for the last time in this segment: the previous
             * segment's checkpoint comes in during this window's walk */
            if (CK_SMEM && sb == 0 && g > 0) fetch_ckpt(g - 1);

            for (int x = mu - 1; x >= 0; --x) {
                const int u = u0 + x;
                /* row form: g = dS + dy r^T; dv = g k; dsa = g b; dS = g decay + dsa a */
                {
                    const float4* r4 = reinterpret_cast<const float4*>(tokv(u, T_R));
                    const float4* k4 = reinterpret_cast<const float4*>(tokv(u, T_K));
                    const float4* b4 = reinterpret_cast<const float4*>(tokv(u, T_B));
                    const float4* d4 = reinterpret_cast<const float4*>(tokv(u, T_D));
                    const float4* a4 = reinterpret_cast<const float4*>(tokv(u, T_A));
                    float dyr[RR], dv[RR], ds[RR];
                    lds_r<RR>(tokv(u, T_DY) + rgr * RR, dyr);
#pragma unroll
                    for (int rr = 0; rr < RR; ++rr) dv[rr] = 0.0f, ds[rr] = 0.0f;
#pragma unroll
                    for (int gg = 0; gg < RG; ++gg) {
                        const float4 rv = r4[gg * RL + qr], kv = k4[gg * RL + qr], bv4 = b4[gg * RL + qr];
#pragma unroll
                        for (int rr = 0; rr < RR; ++rr) {
                            float* x4 = &dSr[rr][4 * gg];
                            x4[0] = fmaf(dyr[rr], rv.x, x4[0]);
                            x4[1] = fmaf(dyr[rr], rv.y, x4[1]);
                            x4[2] = fmaf(dyr[rr], rv.z, x4[2]);
                            x4[3] = fmaf(dyr[rr], rv.w, x4[3]);
                            dv[rr] = fmaf(x4[0], kv.x, dv[rr]);
                            dv[rr] = fmaf(x4[1], kv.y, dv[rr]);
                            dv[rr] = fmaf(x4[2], kv.z, dv[rr]);
                            dv[rr] = fmaf(x4[3], kv.w, dv[rr]);
                            ds[rr] = fmaf(x4[0], bv4.x, ds[rr]);
                            ds[rr] = fmaf(x4[1], bv4.y, ds[rr]);
                            ds[rr] = fmaf(x4[2], bv4.z, ds[rr]);
                            ds[rr] = fmaf(x4[3], bv4.w, ds[rr]);
                        }
                    }
#pragma unroll
                    for (int rr = 0; rr < RR; ++rr) {
                        dv[rr] = lanes_sum<RL>(dv[rr]);
                        ds[rr] = lanes_sum<RL>(ds[rr]);
                    }
#pragma unroll
                    for (int gg = 0; gg < RG; ++gg) {
                        const float4 dv4 = d4[gg * RL + qr], av = a4[gg * RL + qr];
#pragma unroll
                        for (int rr = 0; rr < RR; ++rr) {
                            float* x4 = &dSr[rr][4 * gg];
                            x4[0] = fmaf(x4[0], dv4.x, ds[rr] * av.x);
                            x4[1] = fmaf(x4[1], dv4.y, ds[rr] * av.y);
                            x4[2] = fmaf(x4[2], dv4.z, ds[rr] * av.z);
                            x4[3] = fmaf(x4[3], dv4.w, ds[rr] * av.w);
                        }
                    }
                    if (qr == 0) {
                        sts_r<RR>(s_dsa + (x & 1) * N + rgr * RR, ds);
                        sts_r<RR>(outv(x, O_DV) + rgr * RR, dv);
                    }
                }
                __syncthreads();
                /* column form for columns cg CC.. over the quads cq + LC m: g = dS + dy r^T;
                 * dk = g^T v; db = g^T sa; dd = colsum(g o S_{t-1}); da = S_{t-1}^T dsa;
                 * dp = S_{t-1}^T dy; dS = g decay + dsa a */
                {
                    float rj[CC], dj[CC], aj[CC];
                    const float4* S4[CC];
#pragma unroll
                    for (int cc = 0; cc < CC; ++cc) {
                        const int j = cg * CC + cc;
                        rj[cc] = tokv(u, T_R)[j], dj[cc] = tokv(u, T_D)[j], aj[cc] = tokv(u, T_A)[j];
                        S4[cc] = reinterpret_cast<const float4*>(s_states + (size_t)x * SF) + swz(j);
                    }
                    const float4* dy4 = reinterpret_cast<const float4*>(tokv(u, T_DY));
                    const float4* v4 = reinterpret_cast<const float4*>(tokv(u, T_V));
                    const float4* sa4 = reinterpret_cast<const float4*>(s_sa + (size_t)x * N);
                    const float4* dsa4 = reinterpret_cast<const float4*>(s_dsa + (x & 1) * N);
                    float dk[CC], db[CC], dd[CC], da[CC], dp[CC];
#pragma unroll
                    for (int cc = 0; cc < CC; ++cc) dk[cc] = db[cc] = dd[cc] = da[cc] = dp[cc] = 0.0f;
#pragma unroll
                    for (int mq = 0; mq < NQ; ++mq) {
                        const int qd = cq + LC * mq;
                        const float4 dyv = dy4[qd], vv = v4[qd], sav = sa4[qd], dsav = dsa4[qd];
                        const float dyx[4] = {dyv.x, dyv.y, dyv.z, dyv.w};
                        const float vx[4] = {vv.x, vv.y, vv.z, vv.w};
                        const float sax[4] = {sav.x, sav.y, sav.z, sav.w};
                        const float dsax[4] = {dsav.x, dsav.y, dsav.z, dsav.w};
#pragma unroll
                        for (int cc = 0; cc < CC; ++cc) {
                            const float4 sv = S4[cc][qd * QS];
                            const float sx[4] = {sv.x, sv.y, sv.z, sv.w};
#pragma unroll
                            for (int e = 0; e < 4; ++e) {
                                float& dsc = dSc[cc][4 * mq + e];
                                const float gc = fmaf(dyx[e], rj[cc], dsc);
                                dk[cc] = fmaf(gc, vx[e], dk[cc]);
                                db[cc] = fmaf(gc, sax[e], db[cc]);
                                dd[cc] = fmaf(gc, sx[e], dd[cc]);
                                da[cc] = fmaf(sx[e], dsax[e], da[cc]);
                                dp[cc] = fmaf(sx[e], dyx[e], dp[cc]);
                                dsc = fmaf(gc, dj[cc], dsax[e] * aj[cc]);
                            }
                        }
                    }
#pragma unroll
                    for (int cc = 0; cc < CC; ++cc) {
                        dk[cc] = lanes_sum<LC>(dk[cc]);
                        db[cc] = lanes_sum<LC>(db[cc]);
                        dd[cc] = lanes_sum<LC>(dd[cc]);
                        da[cc] = lanes_sum<LC>(da[cc]);
                        dp[cc] = lanes_sum<LC>(dp[cc]);
                    }
                    float say = 0.0f, vy = 0.0f;
#pragma unroll
                    for (int w = 0; w < NW; w += 4) {
                        const float4 ps = *reinterpret_cast<const float4*>(s_sy + (size_t)(2 * x) * NW + w);
                        const float4 pv = *reinterpret_cast<const float4*>(s_sy + (size_t)(2 * x + 1) * NW + w);
                        say += (ps.x + ps.y) + (ps.z + ps.w);
                        vy += (pv.x + pv.y) + (pv.z + pv.w);
                    }
                    if (cq == 0) {
#pragma unroll
                        for (int cc = 0; cc < CC; ++cc) {
                            const int j = cg * CC + cc;
                            const float bj = tokv(u, T_B)[j], kj = tokv(u, T_K)[j], wj = tokv(u, T_DDW)[j];
                            outv(x, O_DR)[j] = fmaf(dj[cc], dp[cc], fmaf(bj, say, kj * vy)); /* S_t^T dy */
                            outv(x, O_DW)[j] = dd[cc] * wj;
                            outv(x, O_DK)[j] = dk[cc];
                            outv(x, O_DA)[j] = da[cc];
                            outv(x, O_DB)[j] = db[cc];
                        }
                    }
                }
            }
            __syncthreads();
            /* the window's gradients, by the whole block. Views alike: thread (su, sj) writes
             * column sj of tokens su, su + TPJ, .. (NT is a multiple of N), one 64-bit offset per
             * token for all six, the dtype branch once around the loop. The general form (an
             * offset per view and element, a dtype branch per store) cost 12.7% of the stall
             * samples for 8% of the instructions; this form is -7% at N = 64 (NOTES v28). */
            if constexpr (VT != 0) {
                /* vector write-out: pair i = (half h, token xx) of thread (i, vg); half 0 writes
                 * dr dw dk, half 1 dv da db, columns 4 vg .. 4 vg + 3 as one 16- or 8-byte store
                 * each (rounded like store_elem: the same bits). At mu = K2 the half is uniform
                 * per warp. */
                constexpr int VG = N / 4, VX = T::NT / VG;
                const int vc = 4 * (tid % VG);
                for (int i = tid / VG; i < 2 * mu; i += VX) {
                    const int h = i >= mu, xx = i - h * mu;
                    const int64_t t = ts + u0 + xx;
                    auto put = [&](const DevView& v, int which) {
                        elem::store4<VT>(v, pos.batch * v.s[0] + t * v.s[1] + pos.h * v.s[2] + vc,
                                         *reinterpret_cast<const float4*>(outv(xx, which) + vc));
                    };
                    if (h == 0) {
                        put(p.dr, O_DR);
                        put(p.dw, O_DW);
                        put(p.dk, O_DK);
                    } else {
                        put(p.dv, O_DV);
                        put(p.da, O_DA);
                        put(p.db, O_DB);
                    }
                }
            } else if (same6) {
                const int64_t tb = ts + u0;
                const int64_t ocol = pos.batch * p.dr.s[0] + pos.h * p.dr.s[2] + (int64_t)sj * p.dr.s[3];
                auto wout = [&](auto e0) {
                    using E = decltype(e0);
                    for (int xx = su; xx < mu; xx += TPJ) {
                        const int64_t off = ocol + (tb + xx) * p.dr.s[1];
                        reinterpret_cast<E*>(p.dr.data)[off] = to_elem<E>(outv(xx, O_DR)[sj]);
                        reinterpret_cast<E*>(p.dw.data)[off] = to_elem<E>(outv(xx, O_DW)[sj]);
                        reinterpret_cast<E*>(p.dk.data)[off] = to_elem<E>(outv(xx, O_DK)[sj]);
                        reinterpret_cast<E*>(p.dv.data)[off] = to_elem<E>(outv(xx, O_DV)[sj]);
                        reinterpret_cast<E*>(p.da.data)[off] = to_elem<E>(outv(xx, O_DA)[sj]);
                        reinterpret_cast<E*>(p.db.data)[off] = to_elem<E>(outv(xx, O_DB)[sj]);
                    }
                };
                switch (p.dr.elem) {
                case 0: wout(0.0f); break;
                case 1: wout(__half()); break;
                default: wout(__nv_bfloat16()); break;
                }
            } else {
                for (int e = tid; e < mu * N; e += T::NT) { /* thread -> (token, column) */
                    const int xx = e / N, j = e % N;
                    const int64_t t = ts + u0 + xx;
                    store_elem(p.dr, goff(p.dr, t, j), outv(xx, O_DR)[j]);
                    store_elem(p.dw, goff(p.dw, t, j), outv(xx, O_DW)[j]);
                    store_elem(p.dk, goff(p.dk, t, j), outv(xx, O_DK)[j]);
                    store_elem(p.dv, goff(p.dv, t, j), outv(xx, O_DV)[j]);
                    store_elem(p.da, goff(p.da, t, j), outv(xx, O_DA)[j]);
                    store_elem(p.db, goff(p.db, t, j), outv(xx, O_DB)[j]);
                }
            }
        }
    }
    store_state_rows<RT>(p.dstate_in, pos.s, pos.h, rgr, qr, dSr);
}

/* The vector path's VT for a launch (see the kernel): 0 unless the seven token views and the
 * six gradient views share a dtype and pass vec_view. */
int bwd_vec_type(const Rwkv7BwdParams& p) {
    return vec_type({&p.r, &p.w, &p.k, &p.v, &p.a, &p.b, &p.dy, &p.dr, &p.dw, &p.dk, &p.dv, &p.da, &p.db},
                    {&p.r, &p.w, &p.k, &p.v, &p.a, &p.b, &p.dy, &p.dr, &p.dw, &p.dk, &p.dv, &p.da, &p.db}, p.seq,
                    p.T, p.H);
}

template <int N>
int launch_bwd(const Rwkv7BwdParams& p, int64_t blocks, size_t smem, cudaStream_t stream) {
    const unsigned nb = (unsigned)blocks, nt = BwdTile<N>::T::NT;
    with_vec_type(bwd_vec_type(p), [&](auto vt_c) {
        constexpr int VT = decltype(vt_c)::value;
        rwkv7_backward_kernel<N, VT><<<nb, nt, smem, stream>>>(p);
        return 0;
    });
    return (int)cudaGetLastError();
}

/* the dynamic shared-memory limit of every VT's kernel for N */
template <int N>
int prepare_bwd(int bytes) {
    const cudaFuncAttribute a = cudaFuncAttributeMaxDynamicSharedMemorySize;
    int e = (int)cudaSuccess;
    for (int vt = 0; vt <= 3 && e == (int)cudaSuccess; ++vt)
        e = with_vec_type(vt, [&](auto vt_c) {
            constexpr int VT = decltype(vt_c)::value;
            return (int)cudaFuncSetAttribute(rwkv7_backward_kernel<N, VT>, a, bytes);
        });
    return e;
}

} // namespace

size_t rwkv7_bwd_smem_bytes(int N, int K1, int K2) {
    switch (N) {
    case 32: return 4 * bwd_smem_floats<32>(K1, K2);
    case 64: return 4 * bwd_smem_floats<64>(K1, K2);
    case 128: return 4 * bwd_smem_floats<128>(K1, K2);
    default: return 0;
    }
}

int rwkv7_max_k1() { return kMaxK1; }

int rwkv7_launch_backward(int N, const Rwkv7BwdParams& p, int64_t blocks, size_t smem, void* stream) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    switch (N) {
    case 32: return launch_bwd<32>(p, blocks, smem, s);
    case 64: return launch_bwd<64>(p, blocks, smem, s);
    case 128: return launch_bwd<128>(p, blocks, smem, s);
    default: return (int)cudaErrorInvalidValue;
    }
}

int rwkv7_prepare_backward(int N, size_t smem) {
    const int bytes = (int)smem;
    switch (N) {
    case 32: return prepare_bwd<32>(bytes);
    case 64: return prepare_bwd<64>(bytes);
    case 128: return prepare_bwd<128>(bytes);
    default: return (int)cudaErrorInvalidValue;
    }
}

} // namespace wkv_cuda
