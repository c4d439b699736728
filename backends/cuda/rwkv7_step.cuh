/* RWKV-7 on CUDA: what the forward (rwkv7.cu) and the backward (rwkv7_bwd.cu) share, the
 * backward's pass A walking the tokens in the forward's row layout and arithmetic: the state
 * tile, element access, the state's loads and stores, one forward step (fwd_step, fwd_update)
 * and the forward's row slices (RowTile, row_step, store_row_slices). The layout is described
 * at the top of rwkv7.cu. Header-only device code, in an unnamed namespace: each file that
 * includes it gets its own copy, inlined. */
#ifndef WKV_CUDA_RWKV7_STEP_CUH
#define WKV_CUDA_RWKV7_STEP_CUH

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


/* ------------------------------------------------------------------------- element access */

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

/* The decay forms and min64 are cuda_elem.cuh's, shared with RWKV-6/4 and the chunked kernels. */
using elem::decay_of;
using elem::min64;

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
    else if constexpr (R == 1) *p = x[0];
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

/* Where staging thread sj's column of a block's (sequence, head) starts in the six token
 * inputs: token t's element at col.x + t * p.x.s[1]. */
struct TokenCols {
    int64_t r, w, k, v, a, b;
};

template <class Params>
__device__ __forceinline__ TokenCols token_cols(const Params& p, const SeqPos& pos, int sj) {
    auto at = [&](const DevView& v) { return tok_base(v, pos.batch, pos.h) + sj * v.s[3]; };
    return TokenCols{at(p.r), at(p.w), at(p.k), at(p.v), at(p.a), at(p.b)};
}

/* Token t's six inputs in that column, each load unconditional (see elem::load). */
template <class Params>
__device__ __forceinline__ void load_token(const Params& p, const TokenCols& col, int64_t t, float& r, float& w,
                                           float& k, float& v, float& a, float& b) {
    r = elem::load(p.r, col.r + t * p.r.s[1]);
    w = elem::load(p.w, col.w + t * p.w.s[1]);
    k = elem::load(p.k, col.k + t * p.k.s[1]);
    v = elem::load(p.v, col.v + t * p.v.s[1]);
    a = elem::load(p.a, col.a + t * p.a.s[1]);
    b = elem::load(p.b, col.b + t * p.b.s[1]);
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

/* out[rr] = S_rr . x for the thread's rows: its columns J(q) (x a float4-aligned vector in
 * shared memory) in two chains per row, then the sum over the row's L lanes. */
template <class T>
__device__ __forceinline__ void rows_dot(const float (&S)[T::R][T::C], int q, const float* x, float (&out)[T::R]) {
    constexpr int R = T::R, L = T::L, G = T::G;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float acc[R], acc2[R];
#pragma unroll
    for (int rr = 0; rr < R; ++rr) acc[rr] = 0.0f, acc2[rr] = 0.0f;
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const float4 xv = x4[g * L + q];
#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
            acc[rr] = fmaf(S[rr][4 * g + 0], xv.x, acc[rr]);
            acc2[rr] = fmaf(S[rr][4 * g + 1], xv.y, acc2[rr]);
            acc[rr] = fmaf(S[rr][4 * g + 2], xv.z, acc[rr]);
            acc2[rr] = fmaf(S[rr][4 * g + 3], xv.w, acc2[rr]);
        }
    }
#pragma unroll
    for (int rr = 0; rr < R; ++rr) out[rr] = lanes_sum<L>(acc[rr] + acc2[rr]);
}

/* S (the thread's tile) <- one token. v_rows points at v of the tile's first row. Returns
 * sa of the tile's rows in sa[]; with want_y also y (reduced over the lanes) in y[]. */
template <class T>
__device__ __forceinline__ void fwd_step(float (&S)[T::R][T::C], int q, const float* v_rows,
                                         const float* d, const float* k, const float* a,
                                         const float* b, const float* r, bool want_y,
                                         float (&sa)[T::R], float (&y)[T::R]) {
    constexpr int R = T::R;
    float vr[R];
    lds_r<R>(v_rows, vr);
    rows_dot<T>(S, q, a, sa);
    fwd_update<T>(S, q, vr, d, k, b, sa);
    if (want_y) rows_dot<T>(S, q, r, y);
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

/* x . y over the thread's 4 G columns (8 independent chains), then over the P lanes.
 * P = 4 (the decode kernel's one-warp blocks, decode_layout) adds the same numbers in the same
 * order as P = 2: P = 2 lane q holds float4 groups 2 g + q and its acc[0..3] chain the even g,
 * acc[4..7] the odd; P = 4 lane q + 2 h holds groups 4 m + q + 2 h = 2 (2 m + h) + q, exactly
 * P = 2 lane q's groups of parity h, so its 4 chains are that lane's acc[4 h..] and one 4-float
 * exchange with lane ^ 2 completes the same expression (a + b = b + a bit for bit). */
template <int P, int G>
__device__ __forceinline__ float row_dot(const float (&x)[4 * G], const float4 (&y4)[G]) {
    static_assert(P == 2 || P == 4, "row_dot: the sum's order is defined for P = 2 (and its P = 4 split)");
    if constexpr (P == 4) {
        float acc[4], o[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[e] = 0.0f;
#pragma unroll
        for (int g = 0; g < G; ++g) {
            acc[0] = fmaf(x[4 * g + 0], y4[g].x, acc[0]);
            acc[1] = fmaf(x[4 * g + 1], y4[g].y, acc[1]);
            acc[2] = fmaf(x[4 * g + 2], y4[g].z, acc[2]);
            acc[3] = fmaf(x[4 * g + 3], y4[g].w, acc[3]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) o[e] = __shfl_xor_sync(0xffffffffu, acc[e], 2);
        return lanes_sum<2>(((acc[0] + o[0]) + (acc[1] + o[1])) + ((acc[2] + o[2]) + (acc[3] + o[3])));
    } else {
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
}

/* One token on one row slice: sa = S . a, then S <- S o decay + sa b + v k. Returns sa. The
 * forward kernels and the backward's replay share it (one arithmetic for the recurrence). */
template <int G>
__device__ __forceinline__ void row_apply(float (&S)[4 * G], float v, float sa, const float4 (&d4)[G],
                                          const float4 (&k4)[G], const float4 (&b4)[G]) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
        float* x = &S[4 * g];
        x[0] = fmaf(x[0], d4[g].x, fmaf(sa, b4[g].x, v * k4[g].x));
        x[1] = fmaf(x[1], d4[g].y, fmaf(sa, b4[g].y, v * k4[g].y));
        x[2] = fmaf(x[2], d4[g].z, fmaf(sa, b4[g].z, v * k4[g].z));
        x[3] = fmaf(x[3], d4[g].w, fmaf(sa, b4[g].w, v * k4[g].w));
    }
}

template <int P, int G>
__device__ __forceinline__ float row_update(float (&S)[4 * G], float v, const float4 (&a4)[G],
                                            const float4 (&d4)[G], const float4 (&k4)[G],
                                            const float4 (&b4)[G]) {
    const float sa = row_dot<P, G>(S, a4);
    row_apply<G>(S, v, sa, d4, k4, b4);
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

/* A checkpoint (N = 32 / 64) is N rows of N floats, row-major, but row r's float4 group s sits
 * at slot ck_slot(r, s) = s ^ 2 (r & 3): the eight float4 stores of a quarter-warp (rows 4 i..
 * 4 i + 3, P = 2 lanes each, the same group) then fall into eight distinct shared-memory bank
 * groups, so the saving forward stages a checkpoint in shared memory without conflicts and
 * sends it out as one bulk copy (rwkv7_forward_ws_kernel), its global image being the shared
 * one. Every writer (store_row_slices) and the backward's reader (fetch_ckpt) go through it;
 * N = 128 checkpoints (the backward's own tile layout) are not permuted. */
template <int N>
__host__ __device__ constexpr int ck_slot(int row, int slot) {
    return N == 128 ? slot : slot ^ ((row & 3) << 1);
}

/* The thread's row slices (rows rg R.., float4 groups g P + q) into an N x N checkpoint at ck
 * (global or shared memory), in the backward's layout (ck_slot). */
template <int N, int R, int P, int G>
__device__ __forceinline__ void store_row_slices(float* ck, const float (&S)[R][4 * G], int rg, int q) {
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
        const int r = rg * R + rr;
        float4* row = reinterpret_cast<float4*>(ck + (size_t)r * N);
#pragma unroll
        for (int g = 0; g < G; ++g)
            row[ck_slot<N>(r, g * P + q)] =
                make_float4(S[rr][4 * g], S[rr][4 * g + 1], S[rr][4 * g + 2], S[rr][4 * g + 3]);
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

} // namespace
} // namespace wkv_cuda

#endif // WKV_CUDA_RWKV7_STEP_CUH
