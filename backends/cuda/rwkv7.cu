/* RWKV-7 WKV on CUDA: forward and backward (checkpoint + replay; never divides by the decay).
 *
 * Semantics are the CPU backend's (backends/cpu/rwkv7.cpp): per (sequence s, head h), with S the
 * N x N float32 state S[i][j] (i value row, j key column), per token t:
 *     sa[i]   = sum_l S[i][l] a[l]                         (S before the update)
 *     S[i][j] = S[i][j] decay[j] + sa[i] b[j] + v[i] k[j]
 *     y[i]    = sum_j S[i][j] r[j]                         (S after the update)
 * decay and d decay / d w come from w in the kernel (decay_of below mirrors decay_row of
 * backends/cpu/cpu_internal.h). Inputs of any dtype are converted to float32 on load; all
 * arithmetic and the state are float32; outputs are rounded to their dtype on store.
 *
 * ------------------------------------------------------------------------------ LAYOUT
 * One block per (sequence, head). A thread owns a register tile of the state: R value rows
 * (rows rg R .. rg R + R - 1) times the N / L key columns
 *     J(q) = { 4 (g L + q) + e : g < N / (4 L), e < 4 },   q = lane within the row group,
 * so a block has (N / R) * L threads (Tile below). Forward: R = 1 row (2 in the decode kernel
 * at large batch), L = P = 2 lanes, 2 N threads (N in that case); backward: N=32: R=2, L=8,
 * 128 threads; N=64: R=4, L=8, 128; N=128: R=2, L=8, 512 (its column form: one column per
 * LC = threads / N lanes, see BwdLayout). Token vectors (r, decay, k, a, b)
 * sit in shared memory; each float4 a thread reads serves its R rows. The float4 groups are
 * interleaved across the L lanes so a warp's reads hit distinct banks. Row sums (sa, y; in
 * backward dv and d sa) are butterfly-reduced over the L lanes of a row group (adjacent lanes
 * of one warp). Global indices are int64 arithmetic on the views' strides; tensors need only
 * natural alignment.
 *
 * ------------------------------------------------------------------------------ FORWARD
 * Chunked kernel (any T, packed): tokens staged through double-buffered shared memory in
 * chunks of 8 (N = 128: 4), the chunk after next prefetched into registers, one barrier per
 * chunk; y through shared memory (N = 128: stored straight from registers). At N = 64 the
 * staging and the y stores are done by N extra producer threads (rwkv7_forward_ws_kernel),
 * the compute threads only walk the tokens. Decode kernel (unpacked T = 1): the same step for
 * one token, token and state loads issued together, one barrier. Both share row_step, and
 * every row's arithmetic depends only on L, so results do not depend on the kernel, B or T
 * (details at the forward kernels). The state is read once at the start and written once at
 * the end, so state_out may be state_in. No workspace, unless the forward saves the
 * backward's checkpoints into the backward's (N = 32 / 64; see pass A below).
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
 *        row form    (thread (rg, q): dS[R rows][J(q)])          -> dv, d sa    (row sums)
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
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cuda_elem.cuh"
#include "cuda_internal.h"

namespace wkv_cuda {
namespace {

constexpr float kClampwScale = 0.60653065971263342f; /* exp(-0.5) */

/* A thread's tile: R rows x N / L columns; (N / R) * L threads. */
template <int N_, int R_, int L_>
struct Tile {
    static constexpr int N = N_, R = R_, L = L_;
    static constexpr int C = N / L;       /* columns per thread (row form) = rows (column form) */
    static constexpr int G = C / 4;       /* float4 groups of those */
    static constexpr int NT = (N / R) * L;
    static constexpr int TPJ = NT / N;    /* staging: threads per column */
    static_assert(C % 4 == 0 && C >= 4 && (R == 1 || R == 2 || R == 4) && 32 % L == 0 && NT % N == 0, "tile");
};

template <int N> struct BwdTile;
/* Block sizes as plain constants (launch bounds cannot name the specialisations above). */
__host__ __device__ constexpr int bwd_threads(int N) { return N == 128 ? 512 : 128; }
template <> struct BwdTile<32> { using T = Tile<32, 2, 8>; };
template <> struct BwdTile<64> { using T = Tile<64, 4, 8>; };
template <> struct BwdTile<128> { using T = Tile<128, 2, 8>; };

/* ------------------------------------------------------------------------- element access */

/* Branch-free: two 16-bit loads (the same one twice for 16-bit types) and selects. A switch
 * around each load makes the compiler retire every load before the next one (the scoreboard
 * state must agree where the branches join), which serialises the prefetches. */
__device__ __forceinline__ float load_elem(const DevView& v, int64_t off) {
    const int es = v.elem == 0 ? 4 : 2;
    const unsigned short* ptr = reinterpret_cast<const unsigned short*>(v.data + off * es);
    const unsigned lo = ptr[0];
    const unsigned hi = ptr[es >> 2];
    const float f32 = __uint_as_float(lo | (hi << 16));
    const float bf16 = __uint_as_float(lo << 16);
    const float f16 = __half2float(__ushort_as_half((unsigned short)lo));
    return v.elem == 0 ? f32 : (v.elem == 2 ? bf16 : f16);
}

__device__ __forceinline__ void store_elem(const DevView& v, int64_t off, float x) {
    switch (v.elem) {
    case 0: reinterpret_cast<float*>(v.data)[off] = x; break;
    case 1: reinterpret_cast<__half*>(v.data)[off] = __float2half_rn(x); break;
    default: reinterpret_cast<__nv_bfloat16*>(v.data)[off] = __float2bfloat16_rn(x); break;
    }
}

/* Offset of [b, 0, h, 0] of a per-token view. */
__device__ __forceinline__ int64_t tok_base(const DevView& v, int64_t b, int64_t h) {
    return b * v.s[0] + h * v.s[2];
}

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* decay and d decay / d w from w: the CPU backend's decay_row, element by element. */
__device__ __forceinline__ float decay_of(int form, float w, float* ddw) {
    switch (form) {
    case 1: /* DIRECT */
        *ddw = 1.0f;
        return w;
    case 2: { /* LOG */
        const float d = expf(w);
        *ddw = d;
        return d;
    }
    case 3: { /* EXP_NEG_EXP */
        const float e = expf(w);
        const float d = expf(-e);
        *ddw = isinf(e) ? -0.0f : -e * d;
        return d;
    }
    default: { /* CLAMPW */
        const float z = expf(-fabsf(w));
        const float inv = 1.0f / (1.0f + z);
        const float sig = w >= 0.0f ? inv : z * inv;
        const float d = expf(-kClampwScale * sig);
        *ddw = -kClampwScale * (z * inv * inv) * d;
        return d;
    }
    }
}

/* Sum over the L adjacent lanes of a group (L a power of two dividing 32). */
template <int L>
__device__ __forceinline__ float lanes_sum(float x) {
#pragma unroll
    for (int o = 1; o < L; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* R consecutive floats of shared memory (aligned to R floats) <-> registers. */
template <int R>
__device__ __forceinline__ void lds_r(const float* p, float* x) {
    if constexpr (R == 4) {
        const float4 v = *reinterpret_cast<const float4*>(p);
        x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
    } else if constexpr (R == 1) {
        x[0] = *p;
    } else {
        const float2 v = *reinterpret_cast<const float2*>(p);
        x[0] = v.x, x[1] = v.y;
    }
}

template <int R>
__device__ __forceinline__ void sts_r(float* p, const float* x) {
    if constexpr (R == 4) *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
    else *reinterpret_cast<float2*>(p) = make_float2(x[0], x[1]);
}

/* Sequence bounds of block `blk` of a launch. */
struct SeqPos {
    int64_t local, s, batch, h, t0, t1;
};

__device__ __forceinline__ SeqPos seq_pos(const SeqInfo& q, int H, int64_t T) {
    SeqPos p;
    const int64_t blk = blockIdx.x;
    p.local = blk / H;
    p.h = blk % H;
    p.s = q.first + p.local;
    if (q.packed) {
        p.batch = 0;
        p.t0 = q.off[p.local];
        p.t1 = q.off[p.local + 1];
    } else {
        p.batch = p.s;
        p.t0 = 0;
        p.t1 = T;
    }
    return p;
}

/* ------------------------------------------------------------------------ state in / out */

/* True when a state view can be read as float4 rows: unit column stride, every other stride
 * a multiple of 4, base 16-byte aligned. */
__device__ __forceinline__ bool state_vec4(const DevView& v) {
    return v.s[3] == 1 && (v.s[2] % 4) == 0 && (v.s[1] % 4) == 0 && (v.s[0] % 4) == 0 &&
           (reinterpret_cast<uintptr_t>(v.data) & 15u) == 0;
}

/* Row form: rows rg R + rr, columns J(q) of slice (s, h) into S[R][C]; zeros if absent. */
template <class T>
__device__ __forceinline__ void load_state_rows(const DevView& v, int64_t s, int64_t h, int rg,
                                                int q, float (&S)[T::R][T::C]) {
    constexpr int R = T::R, L = T::L, G = T::G;
    if (!v.data) {
#pragma unroll
        for (int rr = 0; rr < R; ++rr)
#pragma unroll
            for (int x = 0; x < T::C; ++x) S[rr][x] = 0.0f;
        return;
    }
    /* one branch around all the loads: a branch per load would retire each before the next */
    const float* p = reinterpret_cast<const float*>(v.data);
    const int64_t base = s * v.s[0] + h * v.s[1] + (int64_t)(rg * R) * v.s[2];
    if (state_vec4(v)) {
#pragma unroll
        for (int rr = 0; rr < R; ++rr)
#pragma unroll
            for (int g = 0; g < G; ++g) {
                const float4 x = *reinterpret_cast<const float4*>(p + base + rr * v.s[2] + 4 * (g * L + q));
                S[rr][4 * g] = x.x, S[rr][4 * g + 1] = x.y, S[rr][4 * g + 2] = x.z, S[rr][4 * g + 3] = x.w;
            }
    } else {
#pragma unroll
        for (int rr = 0; rr < R; ++rr)
#pragma unroll
            for (int g = 0; g < G; ++g)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    S[rr][4 * g + e] = p[base + rr * v.s[2] + (int64_t)(4 * (g * L + q) + e) * v.s[3]];
    }
}

template <class T>
__device__ __forceinline__ void store_state_rows(const DevView& v, int64_t s, int64_t h, int rg,
                                                 int q, const float (&S)[T::R][T::C]) {
    constexpr int R = T::R, L = T::L, G = T::G;
    if (!v.data) return;
    float* p = reinterpret_cast<float*>(v.data);
    const bool vec = state_vec4(v);
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
        const int64_t base = s * v.s[0] + h * v.s[1] + (int64_t)(rg * R + rr) * v.s[2];
#pragma unroll
        for (int g = 0; g < G; ++g) {
            const int j = 4 * (g * L + q);
            if (vec) {
                *reinterpret_cast<float4*>(p + base + j) =
                    make_float4(S[rr][4 * g], S[rr][4 * g + 1], S[rr][4 * g + 2], S[rr][4 * g + 3]);
            } else {
#pragma unroll
                for (int e = 0; e < 4; ++e) p[base + (int64_t)(j + e) * v.s[3]] = S[rr][4 * g + e];
            }
        }
    }
}

/* ---------------------------------------------------------------------- one forward step */

/* S (the thread's tile) <- S diag(d) + sa b^T + v k^T for one token, sa given; vr holds v of the
 * tile's rows. The one expression of the update: every caller gets the same bits. */
template <class T>
__device__ __forceinline__ void fwd_update(float (&S)[T::R][T::C], int q, const float (&vr)[T::R],
                                           const float* d, const float* k, const float* b,
                                           const float (&sa)[T::R]) {
    constexpr int R = T::R, L = T::L, G = T::G;
    const float4* d4 = reinterpret_cast<const float4*>(d);
    const float4* k4 = reinterpret_cast<const float4*>(k);
    const float4* b4 = reinterpret_cast<const float4*>(b);
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const float4 dv = d4[g * L + q], kv = k4[g * L + q], bv = b4[g * L + q];
#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
            float* x = &S[rr][4 * g];
            x[0] = fmaf(x[0], dv.x, fmaf(sa[rr], bv.x, vr[rr] * kv.x));
            x[1] = fmaf(x[1], dv.y, fmaf(sa[rr], bv.y, vr[rr] * kv.y));
            x[2] = fmaf(x[2], dv.z, fmaf(sa[rr], bv.z, vr[rr] * kv.z));
            x[3] = fmaf(x[3], dv.w, fmaf(sa[rr], bv.w, vr[rr] * kv.w));
        }
    }
}

/* S (the thread's tile) <- one token. v_rows points at v of the tile's first row. Returns
 * sa of the tile's rows in sa[]; with want_y also y (reduced over the lanes) in y[]. */
template <class T>
__device__ __forceinline__ void fwd_step(float (&S)[T::R][T::C], int q, const float* v_rows,
                                         const float* d, const float* k, const float* a,
                                         const float* b, const float* r, bool want_y,
                                         float (&sa)[T::R], float (&y)[T::R]) {
    constexpr int R = T::R, L = T::L, G = T::G;
    const float4* a4 = reinterpret_cast<const float4*>(a);
    float vr[R];
    lds_r<R>(v_rows, vr);
    float acc[R], acc2[R]; /* two chains per row */
#pragma unroll
    for (int rr = 0; rr < R; ++rr) acc[rr] = 0.0f, acc2[rr] = 0.0f;
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const float4 av = a4[g * L + q];
#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
            acc[rr] = fmaf(S[rr][4 * g + 0], av.x, acc[rr]);
            acc2[rr] = fmaf(S[rr][4 * g + 1], av.y, acc2[rr]);
            acc[rr] = fmaf(S[rr][4 * g + 2], av.z, acc[rr]);
            acc2[rr] = fmaf(S[rr][4 * g + 3], av.w, acc2[rr]);
        }
    }
#pragma unroll
    for (int rr = 0; rr < R; ++rr) sa[rr] = lanes_sum<L>(acc[rr] + acc2[rr]);
    fwd_update<T>(S, q, vr, d, k, b, sa);
    if (want_y) {
        const float4* r4 = reinterpret_cast<const float4*>(r);
#pragma unroll
        for (int rr = 0; rr < R; ++rr) acc[rr] = 0.0f, acc2[rr] = 0.0f;
#pragma unroll
        for (int g = 0; g < G; ++g) {
            const float4 rv = r4[g * L + q];
#pragma unroll
            for (int rr = 0; rr < R; ++rr) {
                acc[rr] = fmaf(S[rr][4 * g + 0], rv.x, acc[rr]);
                acc2[rr] = fmaf(S[rr][4 * g + 1], rv.y, acc2[rr]);
                acc[rr] = fmaf(S[rr][4 * g + 2], rv.z, acc[rr]);
                acc2[rr] = fmaf(S[rr][4 * g + 3], rv.w, acc2[rr]);
            }
        }
#pragma unroll
        for (int rr = 0; rr < R; ++rr) y[rr] = lanes_sum<L>(acc[rr] + acc2[rr]);
    }
}

/* ------------------------------------------------------------------------------- forward */

/* Rows are independent (sa_i = S_i . a; S_i <- S_i o decay + sa_i b + v_i k; y_i = S_i . r),
 * so thread (rg, q) of a block owns R whole-row slices: rows rg R .. rg R + R - 1, columns
 * J(q) of each (N / P floats per row; P = FwdLanes::P lanes per row, adjacent in the warp).
 * A token costs 2 lanes_sum<P> per row (one shuffle level at P = 2, against three in the old
 * 4-row x 8-lane tile) and one float4 shared-memory read per 4 columns, serving all R rows.
 * Measured at the B = 8 anchor (NOTES.md, v6): P = 2, R = 1 2.72 ms; P = 1 4.93 (one warp per
 * scheduler, long chains); P = 4, R = 1 3.60; P = 4, R = 2 3.33; P = 8 4.55. P is fixed per
 * head size and every row's arithmetic depends on P only, so results are the same bits
 * whatever R, kernel, B or T: T one-token calls equal one T-token call.
 *
 * Chunked kernel (any T, packed): tokens are staged in chunks of CH = 8 (N = 128: 4) (r,
 * decay, k, v, a, b; the decay transform on the way in) into a double-buffered shared-memory
 * area: the chunk after next is loaded into registers (clamped token index, so no load sits
 * under a branch) while the block computes the current one, then written to the other
 * buffer; one __syncthreads per chunk. y goes to a double-buffered shared area in the token
 * loop and out to memory, coalesced, by the whole block after the chunk's barrier. When the
 * forward saves the backward's checkpoints (p.ckpt), the state before every K1-token segment
 * is written at a chunk start (K1 a multiple of CH).
 * Decode kernel (unpacked T = 1): the same for one token without the loop; token and state
 * loads are issued together, one barrier. It takes R = 2 rows per thread at large batch (16
 * float4 state loads in flight per thread): 104 us at B = 256, 3.7 us at B = 1 in a graph,
 * against 126 us and 7.6 us for a version in which each thread loaded (and transformed) the
 * token values of its own columns, no barrier. */
template <int N>
struct FwdLanes { /* the same for every N today (P = 4 was slower at every shape measured) */
    static constexpr int P = 2;
};

template <int N, int R>
struct RowTile {
    static constexpr int P = FwdLanes<N>::P;
    static constexpr int C = N / P;       /* columns per row per thread */
    static constexpr int G = C / 4;       /* float4 groups of those */
    static constexpr int CH = N == 128 ? 4 : 8; /* tokens per staged chunk (N = 128: 48 KB smem) */
    using StateTile = Tile<N, R, P>;      /* the state loaders' view */
    static constexpr int NT = StateTile::NT;
    static constexpr int TPJ = StateTile::TPJ; /* staging: threads per column */
    static constexpr int PER = CH / TPJ;  /* tokens a thread stages per chunk */
    static_assert(G >= 1 && CH % TPJ == 0 && PER >= 1, "row tile");
};

enum { F_R = 0, F_D, F_K, F_V, F_A, F_B, F_NUM };

/* x . y over the thread's 4 G columns (8 independent chains), then over the P lanes. */
template <int P, int G>
__device__ __forceinline__ float row_dot(const float (&x)[4 * G], const float4 (&y4)[G]) {
    float acc[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const int c = (g & 1) * 4;
        acc[c + 0] = fmaf(x[4 * g + 0], y4[g].x, acc[c + 0]);
        acc[c + 1] = fmaf(x[4 * g + 1], y4[g].y, acc[c + 1]);
        acc[c + 2] = fmaf(x[4 * g + 2], y4[g].z, acc[c + 2]);
        acc[c + 3] = fmaf(x[4 * g + 3], y4[g].w, acc[c + 3]);
    }
    return lanes_sum<P>(((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])));
}

/* One token on one row slice: sa = S . a, then S <- S o decay + sa b + v k. Returns sa. The
 * forward kernels and the backward's replay share it (one arithmetic for the recurrence). */
template <int P, int G>
__device__ __forceinline__ float row_update(float (&S)[4 * G], float v, const float4 (&a4)[G],
                                            const float4 (&d4)[G], const float4 (&k4)[G],
                                            const float4 (&b4)[G]) {
    const float sa = row_dot<P, G>(S, a4);
#pragma unroll
    for (int g = 0; g < G; ++g) {
        float* x = &S[4 * g];
        x[0] = fmaf(x[0], d4[g].x, fmaf(sa, b4[g].x, v * k4[g].x));
        x[1] = fmaf(x[1], d4[g].y, fmaf(sa, b4[g].y, v * k4[g].y));
        x[2] = fmaf(x[2], d4[g].z, fmaf(sa, b4[g].z, v * k4[g].z));
        x[3] = fmaf(x[3], d4[g].w, fmaf(sa, b4[g].w, v * k4[g].w));
    }
    return sa;
}

/* The thread's float4 groups g P + q, g < G, of a token vector in shared memory. */
template <int P, int G>
__device__ __forceinline__ void lds_groups(const float* vec, int q, float4 (&x4)[G]) {
#pragma unroll
    for (int g = 0; g < G; ++g) x4[g] = reinterpret_cast<const float4*>(vec)[g * P + q];
}

/* One token on the thread's R row slices from the token's vectors in shared memory (tok[f],
 * f in F_R..F_B); returns y of the rows. */
template <int R, int P, int G>
__device__ __forceinline__ void row_step(float (&S)[R][4 * G], const float* const (&tok)[F_NUM],
                                         int rg, int q, float (&y)[R]) {
    float4 a4[G], d4[G], k4[G], b4[G], r4[G];
    lds_groups<P, G>(tok[F_A], q, a4);
    lds_groups<P, G>(tok[F_D], q, d4);
    lds_groups<P, G>(tok[F_K], q, k4);
    lds_groups<P, G>(tok[F_B], q, b4);
    lds_groups<P, G>(tok[F_R], q, r4);
    float v[R];
    lds_r<R>(tok[F_V] + rg * R, v);
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
        row_update<P, G>(S[rr], v[rr], a4, d4, k4, b4);
        y[rr] = row_dot<P, G>(S[rr], r4);
    }
}

/* The thread's row slices (rows rg R.., float4 groups g P + q) into a row-major N x N state at
 * ck: a checkpoint, in the backward's layout. */
template <int N, int R, int P, int G>
__device__ __forceinline__ void store_row_slices(float* ck, const float (&S)[R][4 * G], int rg, int q) {
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
        float4* row = reinterpret_cast<float4*>(ck + (size_t)(rg * R + rr) * N);
#pragma unroll
        for (int g = 0; g < G; ++g)
            row[g * P + q] = make_float4(S[rr][4 * g], S[rr][4 * g + 1], S[rr][4 * g + 2], S[rr][4 * g + 3]);
    }
}

/* rows x cols floats of shared memory (row-major) to a per-token view at element offset
 * `base` (token u at base + u * s[1], column c at + c * s[3]), by `nt` threads. The dtype
 * branch is taken once, outside the loop. */
__device__ __forceinline__ void store_rows(const DevView& v, int64_t base, const float* src,
                                           int rows, int cols, int nt, int tid) {
    const int n = rows * cols;
    switch (v.elem) {
    case 0:
        for (int e = tid; e < n; e += nt)
            reinterpret_cast<float*>(v.data)[base + (e / cols) * v.s[1] + (e % cols) * v.s[3]] = src[e];
        break;
    case 1:
        for (int e = tid; e < n; e += nt)
            reinterpret_cast<__half*>(v.data)[base + (e / cols) * v.s[1] + (e % cols) * v.s[3]] = __float2half_rn(src[e]);
        break;
    default:
        for (int e = tid; e < n; e += nt)
            reinterpret_cast<__nv_bfloat16*>(v.data)[base + (e / cols) * v.s[1] + (e % cols) * v.s[3]] =
                __float2bfloat16_rn(src[e]);
        break;
    }
}

/* Where a saving forward writes the checkpoints of (sequence, head) pos: the backward's
 * address (Rwkv7BwdParams::ckpt); nullptr when not saving. */
template <int N>
__device__ __forceinline__ float* fwd_ckpt_base(const Rwkv7FwdParams& p, const SeqPos& pos) {
    if (!p.ckpt) return nullptr;
    const int64_t nseg = (pos.t1 - pos.t0 + p.K1 - 1) / p.K1;
    const int64_t seg0 = p.seq.packed ? p.seg0[pos.local] : pos.s * ((p.T + p.K1 - 1) / p.K1);
    return p.ckpt + ((size_t)seg0 * p.H + (size_t)pos.h * nseg) * (size_t)(N * N);
}

/* The chunked forward stores y through shared memory (see the token loop), except at N = 128. */
template <int N>
constexpr bool kYShared = N != 128;

template <int N, int R>
__global__ void __launch_bounds__(RowTile<N, R>::NT)
    rwkv7_forward_kernel(const __grid_constant__ Rwkv7FwdParams p) {
    using RT = RowTile<N, R>;
    using T = typename RT::StateTile;
    constexpr int P = RT::P, C = RT::C, G = RT::G, CH = RT::CH, PER = RT::PER, TPJ = RT::TPJ;
    __shared__ __align__(16) float s_tok[2][CH][F_NUM][N];
    constexpr int YB = kYShared<N> ? 2 * CH * N : 1;
    __shared__ float s_y[YB == 1 ? 1 : 2][YB == 1 ? 1 : CH][YB == 1 ? 1 : N]; /* y of a chunk */

    const int tid = threadIdx.x;
    const int rg = tid / P, q = tid % P;  /* compute: rows rg R.., columns J(q) */
    const int sj = tid % N, su = tid / N; /* staging: column sj, tokens su + TPJ x */
    const SeqPos pos = seq_pos(p.seq, p.H, p.T);
    const int64_t t0 = pos.t0, t1 = pos.t1;
    const bool want_y = p.y.data != nullptr;

    const int64_t br = tok_base(p.r, pos.batch, pos.h) + sj * p.r.s[3];
    const int64_t bw = tok_base(p.w, pos.batch, pos.h) + sj * p.w.s[3];
    const int64_t bk = tok_base(p.k, pos.batch, pos.h) + sj * p.k.s[3];
    const int64_t bv = tok_base(p.v, pos.batch, pos.h) + sj * p.v.s[3];
    const int64_t ba = tok_base(p.a, pos.batch, pos.h) + sj * p.a.s[3];
    const int64_t bb = tok_base(p.b, pos.batch, pos.h) + sj * p.b.s[3];
    const int64_t by = want_y ? tok_base(p.y, pos.batch, pos.h) : 0;

    float pr[PER], pw[PER], pk[PER], pv[PER], pa[PER], pb[PER];
    /* tokens tc + u of the chunk at tc, clamped to the last token of the sequence: every load
     * is unconditional (see load_elem for why that matters) */
    auto prefetch = [&](int64_t tc) {
#pragma unroll
        for (int x = 0; x < PER; ++x) {
            const int64_t t = min64(tc + su + TPJ * x, t1 - 1);
            pr[x] = load_elem(p.r, br + t * p.r.s[1]);
            pw[x] = load_elem(p.w, bw + t * p.w.s[1]);
            pk[x] = load_elem(p.k, bk + t * p.k.s[1]);
            pv[x] = load_elem(p.v, bv + t * p.v.s[1]);
            pa[x] = load_elem(p.a, ba + t * p.a.s[1]);
            pb[x] = load_elem(p.b, bb + t * p.b.s[1]);
        }
    };
    auto stage = [&](int buf, int m) {
#pragma unroll
        for (int x = 0; x < PER; ++x) {
            const int u = su + TPJ * x;
            if (u < m) {
                float ddw;
                s_tok[buf][u][F_R][sj] = pr[x];
                s_tok[buf][u][F_D][sj] = decay_of(p.form, pw[x], &ddw);
                s_tok[buf][u][F_K][sj] = pk[x];
                s_tok[buf][u][F_V][sj] = pv[x];
                s_tok[buf][u][F_A][sj] = pa[x];
                s_tok[buf][u][F_B][sj] = pb[x];
            }
        }
    };

    if (t0 < t1) prefetch(t0); /* token loads first: they overlap the state's */
    float S[R][C];
    load_state_rows<T>(p.state_in, pos.s, pos.h, rg, q, S);
    if (t0 < t1) {
        stage(0, (int)min64(CH, t1 - t0));
        prefetch(t0 + CH);
    }
    /* Saving the backward's checkpoints (p.ckpt): the state before every K1-token segment,
     * at the backward's address (K1 a multiple of CH, see rwkv7_forward_saves), row-major. */
    float* ck = fwd_ckpt_base<N>(p, pos);
    int ck_pos = 0; /* tokens since the last checkpoint */
    __syncthreads();
    int buf = 0;
    for (int64_t tc = t0; tc < t1; tc += CH, buf ^= 1) {
        const int m = (int)min64(CH, t1 - tc);
        if (ck && ck_pos == 0) {
            store_row_slices<N, R, P, G>(ck, S, rg, q);
            ck += N * N;
        }
        ck_pos = ck_pos + CH == p.K1 ? 0 : ck_pos + CH;
        for (int u = 0; u < m; ++u) {
            const float* const tok[F_NUM] = {s_tok[buf][u][F_R], s_tok[buf][u][F_D], s_tok[buf][u][F_K],
                                             s_tok[buf][u][F_V], s_tok[buf][u][F_A], s_tok[buf][u][F_B]};
            float y[R];
            row_step<R, P, G>(S, tok, rg, q, y);
            if constexpr (kYShared<N>) {
                /* y to shared memory, by every lane of the row (each holds the butterfly sum):
                 * no branch in the token loop. A `q == 0` store of the dtype here made each
                 * token wait for the previous one's y reduction (NOTES v9: B = 1 2.26 -> 2.05
                 * ms, B = 8 2.81 -> 2.67; N = 128 measured 24% slower with it, so not there) */
#pragma unroll
                for (int rr = 0; rr < R; ++rr) s_y[buf][u][rg * R + rr] = y[rr];
            } else if (want_y && q == 0) {
#pragma unroll
                for (int rr = 0; rr < R; ++rr)
                    store_elem(p.y, by + (tc + u) * p.y.s[1] + (int64_t)(rg * R + rr) * p.y.s[3], y[rr]);
            }
        }
        /* the next chunk into the other buffer (its readers passed the last barrier), then
         * the one after that into registers */
        stage(buf ^ 1, (int)min64(CH, t1 - tc - CH));
        prefetch(tc + 2 * CH);
        __syncthreads();
        /* this chunk's y, coalesced, by the whole block; s_y[buf] is written again two chunks
         * on, after the next barrier */
        if (kYShared<N> && want_y) store_rows(p.y, by + tc * p.y.s[1], &s_y[buf][0][0], m, N, RT::NT, tid);
    }
    store_state_rows<T>(p.state_out, pos.s, pos.h, rg, q, S);
}

/* The chunked kernel with its staging taken off the compute warps (N = 64): threads [0, NT)
 * compute exactly as rwkv7_forward_kernel (same bits), threads [NT, NT + N) are producers,
 * thread NT + j owning column j: while the compute warps walk chunk c they write chunk c - 1's
 * y, then load chunk c + 1 and stage it into the other buffer; one barrier per chunk for all.
 * Measured (NOTES v11, H100): B = 8 bf16 2.68 -> 2.54 ms, B = 1 f16 2.05 -> 1.96, saving
 * forward 3.22 -> 2.89; at N = 32 (B = 8) 58% slower (250 registers at 96 threads: 2 blocks per
 * SM where the plain kernel fits many), so N = 32 and 128 keep rwkv7_forward_kernel. */
template <int N>
__global__ void __launch_bounds__(RowTile<N, 1>::NT + N, 2)
    rwkv7_forward_ws_kernel(const __grid_constant__ Rwkv7FwdParams p) {
    using RT = RowTile<N, 1>;
    using T = typename RT::StateTile;
    constexpr int P = RT::P, C = RT::C, G = RT::G, CH = RT::CH, NT = RT::NT;
    __shared__ __align__(16) float s_tok[2][CH][F_NUM][N];
    __shared__ float s_y[2][CH][N];

    const int tid = threadIdx.x;
    const bool producer = tid >= NT;
    const int rg = producer ? 0 : tid / P, q = tid % P;
    const int sj = producer ? tid - NT : 0;
    const SeqPos pos = seq_pos(p.seq, p.H, p.T);
    const int64_t t0 = pos.t0, t1 = pos.t1;
    const bool want_y = p.y.data != nullptr;

    const int64_t br = tok_base(p.r, pos.batch, pos.h) + sj * p.r.s[3];
    const int64_t bw = tok_base(p.w, pos.batch, pos.h) + sj * p.w.s[3];
    const int64_t bk = tok_base(p.k, pos.batch, pos.h) + sj * p.k.s[3];
    const int64_t bv = tok_base(p.v, pos.batch, pos.h) + sj * p.v.s[3];
    const int64_t ba = tok_base(p.a, pos.batch, pos.h) + sj * p.a.s[3];
    const int64_t bb = tok_base(p.b, pos.batch, pos.h) + sj * p.b.s[3];
    const int64_t by = want_y ? tok_base(p.y, pos.batch, pos.h) : 0;

    float pr[CH], pw[CH], pk[CH], pv[CH], pa[CH], pb[CH];
    auto prefetch = [&](int64_t tc) {
#pragma unroll
        for (int x = 0; x < CH; ++x) {
            const int64_t t = min64(tc + x, t1 - 1);
            pr[x] = load_elem(p.r, br + t * p.r.s[1]);
            pw[x] = load_elem(p.w, bw + t * p.w.s[1]);
            pk[x] = load_elem(p.k, bk + t * p.k.s[1]);
            pv[x] = load_elem(p.v, bv + t * p.v.s[1]);
            pa[x] = load_elem(p.a, ba + t * p.a.s[1]);
            pb[x] = load_elem(p.b, bb + t * p.b.s[1]);
        }
    };
    auto stage = [&](int buf, int m) {
#pragma unroll
        for (int x = 0; x < CH; ++x) {
            if (x < m) {
                float ddw;
                s_tok[buf][x][F_R][sj] = pr[x];
                s_tok[buf][x][F_D][sj] = decay_of(p.form, pw[x], &ddw);
                s_tok[buf][x][F_K][sj] = pk[x];
                s_tok[buf][x][F_V][sj] = pv[x];
                s_tok[buf][x][F_A][sj] = pa[x];
                s_tok[buf][x][F_B][sj] = pb[x];
            }
        }
    };

    float S[1][C];
    if (producer) {
        if (t0 < t1) {
            prefetch(t0);
            stage(0, (int)min64(CH, t1 - t0));
        }
    } else {
        load_state_rows<T>(p.state_in, pos.s, pos.h, rg, q, S);
    }
    float* ck = fwd_ckpt_base<N>(p, pos);
    int ck_pos = 0;
    __syncthreads();
    int buf = 0;
    for (int64_t tc = t0; tc < t1; tc += CH, buf ^= 1) {
        const int m = (int)min64(CH, t1 - tc);
        if (!producer) {
            if (ck && ck_pos == 0) {
                store_row_slices<N, 1, P, G>(ck, S, rg, q);
                ck += N * N;
            }
            ck_pos = ck_pos + CH == p.K1 ? 0 : ck_pos + CH;
            for (int u = 0; u < m; ++u) {
                const float* const tok[F_NUM] = {s_tok[buf][u][F_R], s_tok[buf][u][F_D], s_tok[buf][u][F_K],
                                                 s_tok[buf][u][F_V], s_tok[buf][u][F_A], s_tok[buf][u][F_B]};
                float y[1];
                row_step<1, P, G>(S, tok, rg, q, y);
                s_y[buf][u][rg] = y[0];
            }
        } else {
            if (tc > t0 && want_y) store_rows(p.y, by + (tc - CH) * p.y.s[1], &s_y[buf ^ 1][0][0], CH, N, N, sj);
            /* loaded and staged in one go: the producers wait for the loads themselves, and
             * no prefetch registers stay live across the loop (they would add to the compute
             * threads' count: one program, one register allocation) */
            prefetch(tc + CH);
            stage(buf ^ 1, (int)min64(CH, t1 - tc - CH));
        }
        __syncthreads();
    }
    if (producer) {
        if (t0 < t1 && want_y) {
            const int64_t tl = t0 + ((t1 - t0 - 1) / CH) * CH;
            store_rows(p.y, by + tl * p.y.s[1], &s_y[buf ^ 1][0][0], (int)(t1 - tl), N, N, sj);
        }
    } else {
        store_state_rows<T>(p.state_out, pos.s, pos.h, rg, q, S);
    }
}

/* The decode kernel (unpacked T = 1) in two forms with one body (decode_body), which differ only
 * in how a block finds its tensors:
 *  - DecodeViews: any strides, a dtype per tensor (Rwkv7DecodeParams: Rwkv7FwdParams less the
 *    packed offsets and checkpoint segments, 456 bytes of parameters instead of 2.6 KB);
 *  - DecodeDense<E> (one row per thread only, see launch_decode): the layout a decode loop has
 *    (every token tensor [B, 1, H, N] dense, one dtype E for r w k v a b and y; states absent
 *    or dense value-major [B, H, N, N], 16-byte aligned; checked on the host, decode_dense), so
 *    the kernel reads 9 pointers, no strides, and block b's tensors start at b N (states b N N):
 *    no 64-bit index arithmetic, no division for (sequence, head), one load per element.
 *    Measured (NOTES v19): the general form's parameter reads and address arithmetic (~250
 *    instructions per warp, constant-cache misses) and its two-load element reads were ~1 us
 *    of a 3.8 us graph replay at B = 1; the dense form takes 3.07 us.
 * Both give the same bits (same loads' values, same row_step). */
struct Rwkv7DecodeParams {
    DevView x[F_NUM]; /* r w k v a b, in F_ order (F_D: w) */
    DevView y, state_in, state_out;
    float* ckpt;   /* saving: the one checkpoint of (s, h) at (s H + h) N N (seg0 = s) */
    int64_t first; /* global index of the launch's first sequence */
    int32_t H;
    int32_t form;
};

struct Rwkv7DecodeDense {
    const void* x[F_NUM];  /* r w k v a b at the launch's first sequence, head 0 */
    void* y;               /* likewise, or nullptr */
    const float* state_in; /* at the launch's first sequence; nullptr: zeros */
    float* state_out;      /* likewise; nullptr: not written */
    float* ckpt;           /* saving: the launch's first (sequence, head)'s checkpoint; or nullptr */
    int32_t form;
    int32_t pad_;
};

template <int N>
struct DecodeViews {
    const Rwkv7DecodeParams& p;
    int64_t s, h;
    __device__ explicit DecodeViews(const Rwkv7DecodeParams& p_) : p(p_) {
        const int64_t blk = blockIdx.x;
        s = p.first + blk / p.H;
        h = blk % p.H;
    }
    __device__ float tok(int f, int j) const {
        return load_elem(p.x[f], tok_base(p.x[f], s, h) + j * p.x[f].s[3]);
    }
    template <class T>
    __device__ void load_state(int rg, int q, float (&S)[T::R][T::C]) const {
        load_state_rows<T>(p.state_in, s, h, rg, q, S);
    }
    template <class T>
    __device__ void store_state(int rg, int q, const float (&S)[T::R][T::C]) const {
        store_state_rows<T>(p.state_out, s, h, rg, q, S);
    }
    __device__ float* ckpt() const {
        return p.ckpt ? p.ckpt + ((size_t)s * p.H + (size_t)h) * (size_t)(N * N) : nullptr;
    }
    __device__ bool has_y() const { return p.y.data != nullptr; }
    __device__ void store_y(int row, float y) const {
        store_elem(p.y, tok_base(p.y, s, h) + (int64_t)row * p.y.s[3], y);
    }
    __device__ int form() const { return p.form; }
};

template <int N, int E> /* E: wkv_elem of the token tensors (0 f32, 1 f16, 2 bf16) */
struct DecodeDense {
    const Rwkv7DecodeDense& p;
    int64_t blk; /* (sequence - first) H + head */
    __device__ explicit DecodeDense(const Rwkv7DecodeDense& p_) : p(p_), blk(blockIdx.x) {}
    __device__ float tok(int f, int j) const {
        const int64_t i = blk * N + j;
        if constexpr (E == 0) return static_cast<const float*>(p.x[f])[i];
        else if constexpr (E == 1) return __half2float(static_cast<const __half*>(p.x[f])[i]);
        else return __bfloat162float(static_cast<const __nv_bfloat16*>(p.x[f])[i]);
    }
    /* rows rg R.., float4 groups g L + q of the row-major N x N slice (load_state_rows' tile) */
    template <class T>
    __device__ void load_state(int rg, int q, float (&S)[T::R][T::C]) const {
        if (!p.state_in) { /* one branch around all the loads (see load_state_rows) */
#pragma unroll
            for (int rr = 0; rr < T::R; ++rr)
#pragma unroll
                for (int x = 0; x < T::C; ++x) S[rr][x] = 0.0f;
            return;
        }
#pragma unroll
        for (int rr = 0; rr < T::R; ++rr)
#pragma unroll
            for (int g = 0; g < T::G; ++g) {
                const float4 x =
                    *reinterpret_cast<const float4*>(p.state_in + (blk * N + rg * T::R + rr) * N + 4 * (g * T::L + q));
                S[rr][4 * g] = x.x, S[rr][4 * g + 1] = x.y, S[rr][4 * g + 2] = x.z, S[rr][4 * g + 3] = x.w;
            }
    }
    /* __stwb: a plain (write-back) store, but one 16-byte vector store per float4 for certain;
     * written as a float4 assignment, nvcc split these into 4 scalar stores (measured: B = 8
     * decode 5.2 -> 11.5 us) */
    template <class T>
    __device__ void store_state(int rg, int q, const float (&S)[T::R][T::C]) const {
        if (!p.state_out) return;
#pragma unroll
        for (int rr = 0; rr < T::R; ++rr)
#pragma unroll
            for (int g = 0; g < T::G; ++g)
                __stwb(reinterpret_cast<float4*>(p.state_out + (blk * N + rg * T::R + rr) * N + 4 * (g * T::L + q)),
                       make_float4(S[rr][4 * g], S[rr][4 * g + 1], S[rr][4 * g + 2], S[rr][4 * g + 3]));
    }
    __device__ float* ckpt() const { return p.ckpt ? p.ckpt + blk * (N * N) : nullptr; }
    __device__ bool has_y() const { return p.y != nullptr; }
    __device__ void store_y(int row, float y) const {
        const int64_t i = blk * N + row;
        if constexpr (E == 0) static_cast<float*>(p.y)[i] = y;
        else if constexpr (E == 1) static_cast<__half*>(p.y)[i] = __float2half_rn(y);
        else static_cast<__nv_bfloat16*>(p.y)[i] = __float2bfloat16_rn(y);
    }
    __device__ int form() const { return p.form; }
};

/* The chunked kernel's work for one token, without its loop: token loads and state loads issued
 * together, one barrier. */
template <int N, int R, class Acc>
__device__ __forceinline__ void decode_body(const Acc& acc) {
    using RT = RowTile<N, R>;
    using T = typename RT::StateTile;
    constexpr int P = RT::P, C = RT::C, G = RT::G;
    __shared__ __align__(16) float s_tok[F_NUM][N];
    const int tid = threadIdx.x;
    const int rg = tid / P, q = tid % P, sj = tid % N;
    /* every thread loads column sj (threads past N load it again: no load under a branch) */
    float x[F_NUM];
#pragma unroll
    for (int f = 0; f < F_NUM; ++f) x[f] = acc.tok(f, sj);
    float S[R][C];
    acc.template load_state<T>(rg, q, S);
    if (float* ck = acc.ckpt()) store_row_slices<N, R, P, G>(ck, S, rg, q); /* the state before the token */
    if (tid < N) {
        float ddw;
        x[F_D] = decay_of(acc.form(), x[F_D], &ddw);
#pragma unroll
        for (int f = 0; f < F_NUM; ++f) s_tok[f][sj] = x[f];
    }
    __syncthreads();
    const float* const tok[F_NUM] = {s_tok[F_R], s_tok[F_D], s_tok[F_K], s_tok[F_V], s_tok[F_A], s_tok[F_B]};
    float y[R];
    row_step<R, P, G>(S, tok, rg, q, y);
    if (acc.has_y() && q == 0) {
#pragma unroll
        for (int rr = 0; rr < R; ++rr) acc.store_y(rg * R + rr, y[rr]);
    }
    acc.template store_state<T>(rg, q, S);
}

template <int N, int R>
__global__ void __launch_bounds__(RowTile<N, R>::NT)
    rwkv7_decode_kernel(const __grid_constant__ Rwkv7DecodeParams p) {
    decode_body<N, R>(DecodeViews<N>(p));
}

template <int N, int R, int E>
__global__ void __launch_bounds__(RowTile<N, R>::NT)
    rwkv7_decode_dense_kernel(const __grid_constant__ Rwkv7DecodeDense p) {
    decode_body<N, R>(DecodeDense<N, E>(p));
}

/* Rows per thread of the decode kernel (memory bound): two (16 float4 state loads in flight
 * per thread) when that still gives the GPU a warp per scheduler, else one. The chunked
 * kernel always takes one row (measured at the B = 8 anchor: R = 1, P = 2 2.72 ms; R = 2,
 * P = 4 3.33; R = 4, P = 4 3.78; R = 1, P = 1 4.93). WKV_CUDA_RWKV7_ROWS (1 or 2) overrides
 * the decode choice, for tests and measurements. */
int forward_rows(int N, int64_t blocks, int sms) {
    static const int forced = [] {
        const char* e = std::getenv("WKV_CUDA_RWKV7_ROWS");
        const int x = e ? std::atoi(e) : 0;
        return x == 1 || x == 2 ? x : 0;
    }();
    if (N == 128) return 1; /* R = 2: 128 state registers per thread */
    if (forced) return forced;
    return blocks * (N / 2) * FwdLanes<64>::P / 32 >= 4 * (int64_t)(sms > 0 ? sms : 1) ? 2 : 1;
}

/* Whether the decode kernel's dense form applies (see DecodeDense): every token tensor [B, 1, H,
 * N] dense in one dtype, the states absent or dense value-major and 16-byte aligned. Fills d
 * (pointers at the launch's first sequence) and the dtype. WKV_CUDA_RWKV7_DENSE=0 turns it off
 * (the general form everywhere, for tests and measurements). */
bool decode_dense(const Rwkv7FwdParams& p, int N, Rwkv7DecodeDense* d, int* elem) {
    static const bool off = [] {
        const char* e = std::getenv("WKV_CUDA_RWKV7_DENSE");
        return e && std::strcmp(e, "0") == 0;
    }();
    if (off) return false;
    const int64_t HN = (int64_t)p.H * N, first = p.seq.first;
    const DevView* t[F_NUM + 1] = {&p.r, &p.w, &p.k, &p.v, &p.a, &p.b, &p.y};
    for (int f = 0; f <= F_NUM; ++f) {
        const DevView& v = *t[f];
        if (f == F_NUM && !v.data) break; /* no y */
        if (v.elem != p.r.elem || v.s[3] != 1 || v.s[2] != N || v.s[0] != HN) return false;
    }
    const DevView* st[2] = {&p.state_in, &p.state_out};
    for (const DevView* v : st)
        if (v->data && (v->s[3] != 1 || v->s[2] != N || v->s[1] != (int64_t)N * N || v->s[0] != HN * N ||
                        (reinterpret_cast<uintptr_t>(v->data) & 15u) != 0))
            return false;
    const int64_t es = p.r.elem == 0 ? 4 : 2;
    for (int f = 0; f < F_NUM; ++f) d->x[f] = t[f]->data + first * HN * es;
    d->y = p.y.data ? p.y.data + first * HN * es : nullptr;
    d->state_in = p.state_in.data ? reinterpret_cast<const float*>(p.state_in.data) + first * HN * N : nullptr;
    d->state_out = p.state_out.data ? reinterpret_cast<float*>(p.state_out.data) + first * HN * N : nullptr;
    d->ckpt = p.ckpt ? p.ckpt + first * HN * N : nullptr; /* seg0 = s: one checkpoint per (s, h) */
    d->form = p.form;
    d->pad_ = 0;
    *elem = p.r.elem;
    return true;
}

/* The dense form only with one row per thread (small and medium batch, where the prologue is
 * the time); two rows per thread (large batch) is bandwidth-bound and the dense form measured
 * slower there (B = 256 f32 104.7 against 103.6 us, NOTES v19), so it keeps the general form. */
template <int N, int R>
void launch_decode(const Rwkv7FwdParams& p, unsigned nb, cudaStream_t stream) {
    constexpr int NT = RowTile<N, R>::NT;
    if constexpr (R == 1) {
        Rwkv7DecodeDense dd;
        int elem = 0;
        if (decode_dense(p, N, &dd, &elem)) {
            if (elem == 0) rwkv7_decode_dense_kernel<N, R, 0><<<nb, NT, 0, stream>>>(dd);
            else if (elem == 1) rwkv7_decode_dense_kernel<N, R, 1><<<nb, NT, 0, stream>>>(dd);
            else rwkv7_decode_dense_kernel<N, R, 2><<<nb, NT, 0, stream>>>(dd);
            return;
        }
    }
    Rwkv7DecodeParams d;
    d.x[F_R] = p.r, d.x[F_D] = p.w, d.x[F_K] = p.k, d.x[F_V] = p.v, d.x[F_A] = p.a, d.x[F_B] = p.b;
    d.y = p.y, d.state_in = p.state_in, d.state_out = p.state_out;
    d.ckpt = p.ckpt, d.first = p.seq.first, d.H = p.H, d.form = p.form;
    rwkv7_decode_kernel<N, R><<<nb, NT, 0, stream>>>(d);
}

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

template <int N>
__global__ void __launch_bounds__(bwd_threads(N), 1)
    rwkv7_backward_kernel(const __grid_constant__ Rwkv7BwdParams p) {
    using T = typename BwdTile<N>::T;
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
    const int rg = tid / L, q = tid % L;  /* replay and row form: rows rg R.., columns J(q) */
    const int cg = tid / LC, cq = tid % LC; /* column form: columns cg CC.., quads cq + LC m */
    const int sj = tid % N, su = tid / N; /* staging: column sj, tokens su + TPJ x */
    const SeqPos pos = seq_pos(p.seq, p.H, p.T);
    const int64_t t0 = pos.t0, t1 = pos.t1, len = t1 - t0;
    const int64_t nseg = (len + K1 - 1) / K1;
    const int64_t seg0 = p.seq.packed ? p.seg0[pos.local] : pos.s * ((p.T + K1 - 1) / K1);
    float* ckpt = p.ckpt + ((size_t)seg0 * p.H + (size_t)pos.h * nseg) * (size_t)(N * N);

    auto tokv = [&](int u, int which) -> float* { return s_tok + (size_t)u * TOK + which * N; };

    const int64_t br = tok_base(p.r, pos.batch, pos.h) + sj * p.r.s[3];
    const int64_t bw = tok_base(p.w, pos.batch, pos.h) + sj * p.w.s[3];
    const int64_t bk = tok_base(p.k, pos.batch, pos.h) + sj * p.k.s[3];
    const int64_t bv = tok_base(p.v, pos.batch, pos.h) + sj * p.v.s[3];
    const int64_t ba = tok_base(p.a, pos.batch, pos.h) + sj * p.a.s[3];
    const int64_t bb = tok_base(p.b, pos.batch, pos.h) + sj * p.b.s[3];
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
     * barrier that ends the segment's staging) */
    auto fetch_ckpt = [&](int64_t gg) {
        const float* src = ckpt + (size_t)gg * (N * N);
        for (int i = tid; i < N * N / 4; i += T::NT) elem::cp_async16(s_ck + 4 * i, src + 4 * i);
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
                pw[x] = load_elem(p.w, ioff(p.w, bw, t));
                pk[x] = load_elem(p.k, ioff(p.k, bk, t));
                pv[x] = load_elem(p.v, ioff(p.v, bv, t));
                pa[x] = load_elem(p.a, ioff(p.a, ba, t));
                pb[x] = load_elem(p.b, ioff(p.b, bb, t));
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
    float dSr[R][C], dSc[CC][4 * NQ]; /* dSc[cc][4 m + e]: row 4 (cq + LC m) + e, column cg CC + cc */
    load_state_rows<T>(p.dstate_out, pos.s, pos.h, rg, q, dSr);
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

    /* the replay's state stores (row quads, see BwdLayout): this thread's quad (R = 2: half of
     * one) and 4 swz(4 q) */
    const int st_off = R == 4 ? 4 * rg * QS : 4 * (rg >> 1) * QS + 2 * (rg & 1);
    const int k4 = 4 * ((4 * q) ^ q);
    for (int64_t g = nseg - 1; g >= 0; --g) {
        const int64_t ts = t0 + g * K1;
        const int m = (int)min64(K1, t1 - ts);
        __syncthreads();
        if (CK_SMEM && g == nseg - 1) fetch_ckpt(g); /* later segments': during the one before */
        {
            /* staging: per group of tokens, all loads first (no branch), then guarded stores */
            constexpr int PB = kMaxK1 / TPJ, SG = PB < 4 ? PB : 4;
#pragma unroll
            for (int x0 = 0; x0 < PB; x0 += SG) {
                float lr[SG], lw[SG], lk[SG], lv[SG], la[SG], lb[SG], ldy[SG];
#pragma unroll
                for (int x = 0; x < SG; ++x) {
                    const int u = su + TPJ * (x0 + x);
                    const int64_t t = ts + (u < m ? u : m - 1);
                    lr[x] = load_elem(p.r, ioff(p.r, br, t));
                    lw[x] = load_elem(p.w, ioff(p.w, bw, t));
                    lk[x] = load_elem(p.k, ioff(p.k, bk, t));
                    lv[x] = load_elem(p.v, ioff(p.v, bv, t));
                    la[x] = load_elem(p.a, ioff(p.a, ba, t));
                    lb[x] = load_elem(p.b, ioff(p.b, bb, t));
                    ldy[x] = load_elem(p.dy, ioff(p.dy, bdy, t));
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
                    float sa[R];
                    if (known) {
                        lds_r<R>(s_sap + (size_t)(u0 + x) * N + rg * R, sa);
                        step_known(S, u0 + x, sa);
                    } else {
                        step(S, u0 + x, sa);
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
                    float dyr[R], dv[R], ds[R];
                    lds_r<R>(tokv(u, T_DY) + rg * R, dyr);
#pragma unroll
                    for (int rr = 0; rr < R; ++rr) dv[rr] = 0.0f, ds[rr] = 0.0f;
#pragma unroll
                    for (int gg = 0; gg < G; ++gg) {
                        const float4 rv = r4[gg * L + q], kv = k4[gg * L + q], bv4 = b4[gg * L + q];
#pragma unroll
                        for (int rr = 0; rr < R; ++rr) {
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
                    for (int rr = 0; rr < R; ++rr) {
                        dv[rr] = lanes_sum<L>(dv[rr]);
                        ds[rr] = lanes_sum<L>(ds[rr]);
                    }
#pragma unroll
                    for (int gg = 0; gg < G; ++gg) {
                        const float4 dv4 = d4[gg * L + q], av = a4[gg * L + q];
#pragma unroll
                        for (int rr = 0; rr < R; ++rr) {
                            float* x4 = &dSr[rr][4 * gg];
                            x4[0] = fmaf(x4[0], dv4.x, ds[rr] * av.x);
                            x4[1] = fmaf(x4[1], dv4.y, ds[rr] * av.y);
                            x4[2] = fmaf(x4[2], dv4.z, ds[rr] * av.z);
                            x4[3] = fmaf(x4[3], dv4.w, ds[rr] * av.w);
                        }
                    }
                    if (q == 0) {
                        sts_r<R>(s_dsa + (x & 1) * N + rg * R, ds);
                        sts_r<R>(outv(x, O_DV) + rg * R, dv);
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
            /* the window's gradients, by the whole block: thread -> (token, column) */
            for (int e = tid; e < mu * N; e += T::NT) {
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
    store_state_rows<T>(p.dstate_in, pos.s, pos.h, rg, q, dSr);
}

template <int N>
int launch_fwd(const Rwkv7FwdParams& p, int64_t blocks, int sms, cudaStream_t stream) {
    const unsigned nb = (unsigned)blocks;
    if (p.seq.packed || p.T != 1) {
        if constexpr (N == 64) rwkv7_forward_ws_kernel<N><<<nb, RowTile<N, 1>::NT + N, 0, stream>>>(p);
        else rwkv7_forward_kernel<N, 1><<<nb, RowTile<N, 1>::NT, 0, stream>>>(p);
        return (int)cudaGetLastError();
    }
    if (forward_rows(N, blocks, sms) == 1) launch_decode<N, 1>(p, nb, stream);
    else if constexpr (N != 128) launch_decode<N, 2>(p, nb, stream);
    return (int)cudaGetLastError();
}

template <int N>
int launch_bwd(const Rwkv7BwdParams& p, int64_t blocks, size_t smem, cudaStream_t stream) {
    rwkv7_backward_kernel<N><<<(unsigned)blocks, BwdTile<N>::T::NT, smem, stream>>>(p);
    return (int)cudaGetLastError();
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

bool rwkv7_forward_saves(int N, int K1) {
    switch (N) {
    case 32: return K1 > 0 && K1 % RowTile<32, 1>::CH == 0;
    case 64: return K1 > 0 && K1 % RowTile<64, 1>::CH == 0;
    default: return false; /* N = 128: the backward's pass A is not in the forward's layout */
    }
}

int rwkv7_launch_forward(int N, const Rwkv7FwdParams& p, int64_t blocks, int sms, void* stream) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    switch (N) {
    case 32: return launch_fwd<32>(p, blocks, sms, s);
    case 64: return launch_fwd<64>(p, blocks, sms, s);
    case 128: return launch_fwd<128>(p, blocks, sms, s);
    default: return (int)cudaErrorInvalidValue;
    }
}

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
    case 32: return (int)cudaFuncSetAttribute(rwkv7_backward_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    case 64: return (int)cudaFuncSetAttribute(rwkv7_backward_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    case 128: return (int)cudaFuncSetAttribute(rwkv7_backward_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    default: return (int)cudaErrorInvalidValue;
    }
}

int rwkv7_check_kernel_image(int N) {
    cudaFuncAttributes attr;
    switch (N) {
    case 32: return (int)cudaFuncGetAttributes(&attr, rwkv7_forward_kernel<32, 1>);
    case 64: return (int)cudaFuncGetAttributes(&attr, rwkv7_forward_ws_kernel<64>);
    case 128: return (int)cudaFuncGetAttributes(&attr, rwkv7_forward_kernel<128, 1>);
    default: return (int)cudaErrorInvalidValue;
    }
}

} // namespace wkv_cuda
