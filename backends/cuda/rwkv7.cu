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
 * so a block has (N / R) * L threads (Tile, rwkv7_step.cuh). Forward: R = 1 row (2 in the decode kernel
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
 * one token, token and state loads issued together, one barrier (at the smallest batches two
 * warp barriers, the decay transformed beside sa = S . a: decode_body); with one row per thread a
 * head's rows are split over up to 8 blocks (decode_layout). Both run row_step's arithmetic, and
 * every row's arithmetic depends only on L, so results do not depend on the kernel, B or T
 * (details at the forward kernels). The state is read once at the start and written once at
 * the end, so state_out may be state_in. No workspace, unless the forward saves the
 * backward's checkpoints into the backward's (N = 32 / 64; see pass A in rwkv7_bwd.cu).
 *
 * The backward (checkpoint + replay) is rwkv7_bwd.cu; what both use is rwkv7_step.cuh.
 */
#include "rwkv7_step.cuh"
#include "wkv/wkv.h" /* WKV_DECAY_CLAMPW */

namespace wkv_cuda {
namespace {

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

    const TokenCols col = token_cols(p, pos, sj);
    const int64_t by = want_y ? tok_base(p.y, pos.batch, pos.h) : 0;

    float pr[PER], pw[PER], pk[PER], pv[PER], pa[PER], pb[PER];
    /* tokens tc + u of the chunk at tc, clamped to the last token of the sequence: every load
     * is unconditional (see elem::load for why that matters) */
    auto prefetch = [&](int64_t tc) {
#pragma unroll
        for (int x = 0; x < PER; ++x) {
            const int64_t t = min64(tc + su + TPJ * x, t1 - 1);
            load_token(p, col, t, pr[x], pw[x], pk[x], pv[x], pa[x], pb[x]);
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
     * at the backward's address (K1 a multiple of CH, see rwkv7_forward_saves), by rows
     * (ck_slot). */
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
 * SM where the plain kernel fits many), so N = 32 and 128 keep rwkv7_forward_kernel.
 * VT != 0: the producers' vector path (below; VT = wkv_elem + 1, chosen per launch by vec_type). */
template <int N, int VT = 0, bool SAVE = false>
__global__ void __launch_bounds__(RowTile<N, 1>::NT + N, 2)
    rwkv7_forward_ws_kernel(const __grid_constant__ Rwkv7FwdParams p) {
    using RT = RowTile<N, 1>;
    using T = typename RT::StateTile;
    constexpr int P = RT::P, C = RT::C, G = RT::G, CH = RT::CH, NT = RT::NT;
    __shared__ __align__(16) float s_tok[2][CH][F_NUM][N];
    __shared__ __align__(16) float s_y[2][CH][N];
    /* SAVE (p.ckpt set; a kernel of its own, so the plain forward carries none of this): on
     * sm_90 (elem::kBulkCopies) the compute threads stage each checkpoint in one of two N x N
     * tiles of dynamic shared memory (p.ck_smem bytes, see rwkv7_prepare_saving_forward;
     * conflict-free by ck_slot) and after the chunk's barrier the first producer thread sends it
     * out as one bulk copy, so no compute warp waits for its checkpoint's global stores to take
     * their registers (NOTES v39). */
    extern __shared__ __align__(128) float s_ck[];
    constexpr bool BULK = SAVE && elem::kBulkCopies;

    const int tid = threadIdx.x;
    const bool producer = tid >= NT;
    const int rg = producer ? 0 : tid / P, q = tid % P;
    const int sj = producer ? tid - NT : 0;
    const SeqPos pos = seq_pos(p.seq, p.H, p.T);
    const int64_t t0 = pos.t0, t1 = pos.t1;
    const bool want_y = p.y.data != nullptr;

    const TokenCols col = token_cols(p, pos, sj);
    const int64_t by = want_y ? tok_base(p.y, pos.batch, pos.h) : 0;

    float pr[CH], pw[CH], pk[CH], pv[CH], pa[CH], pb[CH];
    auto prefetch = [&](int64_t tc) {
#pragma unroll
        for (int x = 0; x < CH; ++x) {
            const int64_t t = min64(tc + x, t1 - 1);
            load_token(p, col, t, pr[x], pw[x], pk[x], pv[x], pa[x], pb[x]);
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

    /* The producers' vector path (VT = wkv_elem + 1: the six token views and y of one dtype, 4
     * consecutive aligned elements along N; vec_type): producer sj moves the 4 columns 4 (sj %
     * VG).. of tokens sj / VG + VX i of each chunk as one 16-byte (f32) or 8-byte access per
     * tensor, against 6 x CH two-part element loads with 64-bit index arithmetic (NOTES v34: the
     * producers' element path was ~1290 instructions per warp and chunk, ~25% of the issue
     * slots). Same values staged, same conversions: the same bits. */
    constexpr int VG = N / 4, VX = N / VG, VPER = CH / VX; /* vec4 groups per token; tokens per pass */
    static_assert(VT == 0 || CH % VX == 0, "vector producers");
    constexpr int VE = VT == 0 ? 1 : VT; /* the element type the vector helpers are built for */
    const DevView* const vviews[F_NUM] = {&p.r, &p.w, &p.k, &p.v, &p.a, &p.b};
    const int vcg = sj % VG, vx0 = sj / VG;
    int64_t vbase[F_NUM];
    int64_t vyb = 0;
    if constexpr (VT != 0) {
#pragma unroll
        for (int f = 0; f < F_NUM; ++f) vbase[f] = tok_base(*vviews[f], pos.batch, pos.h) + 4 * vcg;
        vyb = want_y ? tok_base(p.y, pos.batch, pos.h) + 4 * vcg : 0;
    }
    auto produce_vec = [&](int64_t tc, int buf, int m) { /* load and stage chunk tc (m tokens) */
        typename elem::Vec4<VE>::raw raw[VPER][F_NUM];
#pragma unroll
        for (int i = 0; i < VPER; ++i) {
            const int64_t t = min64(tc + vx0 + VX * i, t1 - 1);
#pragma unroll
            for (int f = 0; f < F_NUM; ++f) raw[i][f] = elem::load4<VE>(*vviews[f], vbase[f] + t * vviews[f]->s[1]);
        }
#pragma unroll
        for (int i = 0; i < VPER; ++i) {
            const int x = vx0 + VX * i;
            if (x < m) {
#pragma unroll
                for (int f = 0; f < F_NUM; ++f) {
                    float4 v4 = elem::to_float4<VE>(raw[i][f]);
                    if (f == F_D) {
                        float ddw;
                        v4.x = decay_of(p.form, v4.x, &ddw);
                        v4.y = decay_of(p.form, v4.y, &ddw);
                        v4.z = decay_of(p.form, v4.z, &ddw);
                        v4.w = decay_of(p.form, v4.w, &ddw);
                    }
                    *reinterpret_cast<float4*>(&s_tok[buf][x][f][4 * vcg]) = v4;
                }
            }
        }
    };
    auto store_y_vec = [&](int64_t tc, int buf, int rows) { /* y of chunk tc (rows tokens) out */
#pragma unroll
        for (int i = 0; i < VPER; ++i) {
            const int x = vx0 + VX * i;
            if (x < rows)
                elem::store4<VE>(p.y, vyb + (tc + x) * p.y.s[1], *reinterpret_cast<const float4*>(&s_y[buf][x][4 * vcg]));
        }
    };

    float S[1][C];
    if (producer) {
        if (t0 < t1) {
            if constexpr (VT != 0) {
                produce_vec(t0, 0, (int)min64(CH, t1 - t0));
            } else {
                prefetch(t0);
                stage(0, (int)min64(CH, t1 - t0));
            }
        }
    } else {
        load_state_rows<T>(p.state_in, pos.s, pos.h, rg, q, S);
    }
    float* ck = SAVE ? fwd_ckpt_base<N>(p, pos) : nullptr; /* the next checkpoint's address */
    float* ck_out = nullptr; /* BULK: where the checkpoint staged last chunk goes; or none */
    int ck_pos = 0, ck_buf = 0; /* tokens since the last checkpoint; BULK: the next tile */
    __syncthreads();
    int buf = 0;
    for (int64_t tc = t0; tc < t1; tc += CH, buf ^= 1) {
        const int m = (int)min64(CH, t1 - tc);
        const bool save = SAVE && ck_pos == 0;
        if constexpr (SAVE) ck_pos = ck_pos + CH == p.K1 ? 0 : ck_pos + CH;
        if constexpr (BULK) {
            /* last chunk's tile (written and fenced before the barrier) out; the tile this chunk
             * writes was read by its copy before that barrier (bulk_wait_read below) */
            if (ck_out && tid == NT) elem::bulk_store(ck_out, s_ck + (ck_buf ^ 1) * N * N, N * N * sizeof(float));
            if (save && !producer) {
                store_row_slices<N, 1, P, G>(s_ck + ck_buf * N * N, S, rg, q);
                elem::fence_proxy_async();
            }
        } else if (save && !producer) {
            store_row_slices<N, 1, P, G>(ck, S, rg, q);
        }
        if (!producer) {
            for (int u = 0; u < m; ++u) {
                const float* const tok[F_NUM] = {s_tok[buf][u][F_R], s_tok[buf][u][F_D], s_tok[buf][u][F_K],
                                                 s_tok[buf][u][F_V], s_tok[buf][u][F_A], s_tok[buf][u][F_B]};
                float y[1];
                row_step<1, P, G>(S, tok, rg, q, y);
                s_y[buf][u][rg] = y[0];
            }
        } else if constexpr (VT != 0) {
            if (tc > t0 && want_y) store_y_vec(tc - CH, buf ^ 1, CH);
            produce_vec(tc + CH, buf ^ 1, (int)min64(CH, t1 - tc - CH));
        } else {
            if (tc > t0 && want_y) store_rows(p.y, by + (tc - CH) * p.y.s[1], &s_y[buf ^ 1][0][0], CH, N, N, sj);
            /* loaded and staged in one go: the producers wait for the loads themselves, and
             * no prefetch registers stay live across the loop (they would add to the compute
             * threads' count: one program, one register allocation) */
            prefetch(tc + CH);
            stage(buf ^ 1, (int)min64(CH, t1 - tc - CH));
        }
        if constexpr (BULK) {
            if (ck_out && tid == NT) elem::bulk_wait_read();
            ck_out = save ? ck : nullptr;
            ck_buf ^= save ? 1 : 0;
        }
        if (save) ck += N * N;
        __syncthreads();
    }
    if constexpr (BULK) {
        if (ck_out && tid == NT) {
            elem::bulk_store(ck_out, s_ck + (ck_buf ^ 1) * N * N, N * N * sizeof(float));
            elem::bulk_wait();
        }
    }
    if (producer) {
        if (t0 < t1 && want_y) {
            const int64_t tl = t0 + ((t1 - t0 - 1) / CH) * CH;
            if constexpr (VT != 0) store_y_vec(tl, buf ^ 1, (int)(t1 - tl));
            else store_rows(p.y, by + tl * p.y.s[1], &s_y[buf ^ 1][0][0], (int)(t1 - tl), N, N, sj);
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
    __device__ DecodeViews(const Rwkv7DecodeParams& p_, int64_t blk) : p(p_) {
        s = p.first + blk / p.H;
        h = blk % p.H;
    }
    __device__ float tok(int f, int j) const {
        return elem::load(p.x[f], tok_base(p.x[f], s, h) + j * p.x[f].s[3]);
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

/* A zero state row (the largest N) in global memory, never written: the dense decode's rows when
 * state_in is absent. Not const, so that the compiler cannot fold the loads back into a branch. */
__device__ __align__(16) float g_zero_row[128];

template <int N, int E> /* E: wkv_elem of the token tensors (0 f32, 1 f16, 2 bf16) */
struct DecodeDense {
    const Rwkv7DecodeDense& p;
    int64_t blk; /* (sequence - first) H + head */
    __device__ DecodeDense(const Rwkv7DecodeDense& p_, int64_t blk_) : p(p_), blk(blk_) {}
    __device__ float tok(int f, int j) const {
        const int64_t i = blk * N + j;
        if constexpr (E == 0) return static_cast<const float*>(p.x[f])[i];
        else if constexpr (E == 1) return __half2float(static_cast<const __half*>(p.x[f])[i]);
        else return __bfloat162float(static_cast<const __nv_bfloat16*>(p.x[f])[i]);
    }
    /* rows rg R.., float4 groups g L + q of the row-major N x N slice (load_state_rows' tile).
     * No branch: without state_in every row reads g_zero_row. Behind a branch (main until v26)
     * the state loads were issued ~35 instructions after the token loads and ptxas could put
     * other work between them; branch-free, all 16 loads go out together (NOTES v29). */
    template <class T>
    __device__ void load_state(int rg, int q, float (&S)[T::R][T::C]) const {
#pragma unroll
        for (int rr = 0; rr < T::R; ++rr) {
            const float* row = p.state_in ? p.state_in + (blk * N + rg * T::R + rr) * N : g_zero_row;
#pragma unroll
            for (int g = 0; g < T::G; ++g) {
                const float4 x = *reinterpret_cast<const float4*>(row + 4 * (g * T::L + q));
                S[rr][4 * g] = x.x, S[rr][4 * g + 1] = x.y, S[rr][4 * g + 2] = x.z, S[rr][4 * g + 3] = x.w;
            }
        }
    }
    /* One 16-byte write-back store per float4 (st.global.wb.v4: written as a float4 assignment,
     * nvcc split these into 4 scalar stores, measured: B = 8 decode 5.2 -> 11.5 us), predicated
     * on state_out from an address taken once: no branch, so ptxas can issue the stores as soon
     * as S is final (ahead of the y dot product where decode_body stores early, NOTES v33; behind
     * a branch it recomputed the addresses after the y store). Outputs are never read back by
     * the kernel, so no memory clobber. */
    template <class T>
    __device__ void store_state(int rg, int q, const float (&S)[T::R][T::C]) const {
        const int en = p.state_out != nullptr;
#pragma unroll
        for (int rr = 0; rr < T::R; ++rr) {
            float* row = p.state_out + (blk * N + rg * T::R + rr) * N + 4 * q;
#pragma unroll
            for (int g = 0; g < T::G; ++g)
                asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.s32 p, %5, 0;\n\t"
                             "@p st.global.wb.v4.f32 [%0], {%1, %2, %3, %4};\n\t}"
                             :
                             : "l"(row + 4 * g * T::L), "f"(S[rr][4 * g]), "f"(S[rr][4 * g + 1]),
                               "f"(S[rr][4 * g + 2]), "f"(S[rr][4 * g + 3]), "r"(en));
        }
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
 * together, one barrier (or two, decode_body). SP > 1 (small batch, see decode_layout): a head's rows are split over
 * SP blocks (block (head, part) = (blockIdx.x / SP, blockIdx.x % SP) owns rows part N / SP ..;
 * rows are independent), each staging the head's whole token vectors itself, so SP times the
 * SMs move the state and a block's barrier spans N / SP rows. P lanes per row: 2, or 4 (N = 64
 * at the smallest batches: a block is one warp of 8 rows at SP = 8). Every row's arithmetic is
 * the same (row_dot: P = 4 adds in P = 2's order), so the bits are. */
template <int N, int R, int SP, int P = FwdLanes<N>::P>
struct DecodeShape {
    static constexpr int NT = (N / R) * P / SP;    /* threads of a block */
    static constexpr int SC = N > NT ? N / NT : 1; /* columns a thread stages */
    static_assert(NT >= 32 && (N % NT == 0 || NT % N == 0), "decode split");
};

/* x[c][f] <- the decay of x[c][f] for the SC columns c, one switch on the form around all of
 * them: a switch per column (each a branch tree) ran the transforms one after the other (NOTES
 * v29). FORM (4: clampw) makes the form a constant: no branch tree at all (NOTES v33). Clampw's
 * reciprocal without the division's branch (decay_of<true>), so the columns' transforms
 * interleave: the same bits as decay_of per element. */
template <int SC, int F, int FORM = 0>
__device__ __forceinline__ void decay_cols(int form, float (&x)[SC][F], int f) {
    float ddw;
    switch (FORM ? FORM : form) {
    case 1:
#pragma unroll
        for (int c = 0; c < SC; ++c) x[c][f] = decay_of<true>(1, x[c][f], &ddw);
        break;
    case 2:
#pragma unroll
        for (int c = 0; c < SC; ++c) x[c][f] = decay_of<true>(2, x[c][f], &ddw);
        break;
    case 3:
#pragma unroll
        for (int c = 0; c < SC; ++c) x[c][f] = decay_of<true>(3, x[c][f], &ddw);
        break;
    default:
#pragma unroll
        for (int c = 0; c < SC; ++c) x[c][f] = decay_of<true>(4, x[c][f], &ddw); /* clampw */
        break;
    }
}

/* The one-token step of a block. FORM: 0, or 4 when the launch is clampw (decay_cols). Two
 * orders of the work after the loads:
 *  - one barrier: every thread transforms its columns' decays and stages all six vectors, then
 *    each row's sa = S . a, update and y;
 *  - kSplit (one-warp blocks of 8 rows x 4 lanes, the smallest batches, decode_layout): r k v a
 *    b staged first and sa = S . a computed while the decay is transformed, the decay staged
 *    behind a second warp barrier; the state stored before the y dot product. The decay's ~100
 *    cycles then run beside sa's instead of ahead of every shared-memory read (NOTES v33: B = 1
 *    f32 2.69 -> 2.46 us with the constant form and decay_of<true>; v29 lost with this order
 *    because the decay's branches kept ptxas from interleaving it; v22 lost with a second
 *    block-wide barrier at 4-warp blocks).
 * Both give the same bits (row_update = row_dot + row_apply). */
template <int N, int R, int SP, int P, int FORM = 0, class Acc>
__device__ __forceinline__ void decode_body(const Acc& acc) {
    using T = Tile<N, R, P>;
    constexpr int C = T::C, G = T::G;
    constexpr int NT = DecodeShape<N, R, SP, P>::NT, SC = DecodeShape<N, R, SP, P>::SC;
    constexpr bool kSplit = NT == 32 && P == 4;
    __shared__ __align__(16) float s_tok[F_NUM][N];
    const int tid = threadIdx.x;
    const int rg = (int)(blockIdx.x % SP) * (NT / P) + tid / P, q = tid % P; /* rg: the head's row group */
    /* every thread loads columns tid + c NT (SC > 1), or tid % N (threads past N load it
     * again: no load under a branch) */
    float x[SC][F_NUM];
#pragma unroll
    for (int c = 0; c < SC; ++c)
#pragma unroll
        for (int f = 0; f < F_NUM; ++f) x[c][f] = acc.tok(f, SC > 1 ? tid + c * NT : tid % N);
    float4 a4[G], k4[G], b4[G], r4[G], d4[G];
    float v[R];
    float S[R][C];
    acc.template load_state<T>(rg, q, S);
    if constexpr (kSplit) {
        static_assert(SC * NT == N, "kSplit: every thread stages SC columns");
#pragma unroll
        for (int c = 0; c < SC; ++c)
#pragma unroll
            for (int f = 0; f < F_NUM; ++f)
                if (f != F_D) s_tok[f][tid + c * NT] = x[c][f];
        __syncwarp();
        lds_groups<P, G>(s_tok[F_A], q, a4);
        lds_groups<P, G>(s_tok[F_K], q, k4);
        lds_groups<P, G>(s_tok[F_B], q, b4);
        lds_groups<P, G>(s_tok[F_R], q, r4);
        lds_r<R>(s_tok[F_V] + rg * R, v);
        decay_cols<SC, F_NUM, FORM>(acc.form(), x, F_D);
        float sa[R];
#pragma unroll
        for (int rr = 0; rr < R; ++rr) sa[rr] = row_dot<P, G>(S[rr], a4);
#pragma unroll
        for (int c = 0; c < SC; ++c) s_tok[F_D][tid + c * NT] = x[c][F_D];
        __syncwarp();
        lds_groups<P, G>(s_tok[F_D], q, d4);
        if (float* ck = acc.ckpt()) store_row_slices<N, R, P, G>(ck, S, rg, q);
#pragma unroll
        for (int rr = 0; rr < R; ++rr) row_apply<G>(S[rr], v[rr], sa[rr], d4, k4, b4);
        acc.template store_state<T>(rg, q, S);
    } else {
        if (SC > 1 || tid < N) {
            decay_cols<SC, F_NUM, FORM>(acc.form(), x, F_D);
#pragma unroll
            for (int c = 0; c < SC; ++c) {
                const int sj = SC > 1 ? tid + c * NT : tid;
#pragma unroll
                for (int f = 0; f < F_NUM; ++f) s_tok[f][sj] = x[c][f];
            }
        }
        /* a one-warp block needs only the warp's barrier (its memory ordering included) */
        if constexpr (NT == 32) __syncwarp();
        else __syncthreads();
        /* row_step's loads and arithmetic, the decay read last (as measured, NOTES v24) */
        lds_groups<P, G>(s_tok[F_A], q, a4);
        lds_groups<P, G>(s_tok[F_K], q, k4);
        lds_groups<P, G>(s_tok[F_B], q, b4);
        lds_groups<P, G>(s_tok[F_R], q, r4);
        lds_r<R>(s_tok[F_V] + rg * R, v);
        lds_groups<P, G>(s_tok[F_D], q, d4);
        /* the state before the token, stored only now that the update needs S anyway: a
         * (predicated) store naming S right after its loads made the warp wait for them before
         * the decay transform (NOTES v29) */
        if (float* ck = acc.ckpt()) store_row_slices<N, R, P, G>(ck, S, rg, q);
#pragma unroll
        for (int rr = 0; rr < R; ++rr) row_update<P, G>(S[rr], v[rr], a4, d4, k4, b4);
    }
    float y[R];
#pragma unroll
    for (int rr = 0; rr < R; ++rr) y[rr] = row_dot<P, G>(S[rr], r4);
    if (acc.has_y() && q == 0) {
#pragma unroll
        for (int rr = 0; rr < R; ++rr) acc.store_y(rg * R + rr, y[rr]);
    }
    if constexpr (!kSplit) acc.template store_state<T>(rg, q, S);
}

template <int N, int R, int SP, int P>
__global__ void __launch_bounds__(DecodeShape<N, R, SP, P>::NT)
    rwkv7_decode_kernel(const __grid_constant__ Rwkv7DecodeParams p) {
    decode_body<N, R, SP, P>(DecodeViews<N>(p, blockIdx.x / SP));
}

template <int N, int R, int SP, int P, int E, int FORM = 0>
__global__ void __launch_bounds__(DecodeShape<N, R, SP, P>::NT)
    rwkv7_decode_dense_kernel(const __grid_constant__ Rwkv7DecodeDense p) {
    decode_body<N, R, SP, P, FORM>(DecodeDense<N, E>(p, blockIdx.x / SP));
}

/* The dense kernel of dtype E; at P = 4 (the smallest batches) its clampw copy for clampw. */
template <int N, int R, int SP, int P, int E>
void launch_dense(const Rwkv7DecodeDense& dd, unsigned grid, unsigned nt, cudaStream_t stream) {
    if constexpr (P == 4) {
        if (dd.form == WKV_DECAY_CLAMPW) {
            rwkv7_decode_dense_kernel<N, R, SP, P, E, WKV_DECAY_CLAMPW><<<grid, nt, 0, stream>>>(dd);
            return;
        }
    }
    rwkv7_decode_dense_kernel<N, R, SP, P, E><<<grid, nt, 0, stream>>>(dd);
}

/* The decode kernel's layout, chosen here only: R rows per thread, a head's rows over SP
 * blocks (decode_body).
 *  - R: two (16 float4 state loads in flight per thread) when that still gives the GPU a warp
 *    per scheduler, else one. The chunked kernel always takes one row (measured at the B = 8
 *    anchor: R = 1, P = 2 2.72 ms; R = 2, P = 4 3.33; R = 4, P = 4 3.78; R = 1, P = 1 4.93).
 *  - SP (R = 1 only): 4 blocks per head (N = 32: 2, so a block keeps a warp) up to 8 blocks
 *    per SM, halved beyond. Measured (H100, N = 64, H = 32, NOTES v22): SP = 4 was the fastest
 *    at every R = 1 batch, B = 1 to 8 (8: 1024 blocks of one warp on 132 SMs): B = 1 3.09 ->
 *    2.89 us, B = 4 3.55 -> 3.18, B = 8 4.20 -> 4.03 in a one-kernel graph; SP = 2 in between.
 *  - P (lanes per row): 4 at N = 64 while B H SP stays within 4 blocks per SM at SP = 8 (one
 *    warp of 8 rows per block), else 2. Measured (NOTES v24): B = 1 f32 2.83 -> 2.71 us, B = 2
 *    2.98 -> 2.88, a graph of 100 B = 1 calls 2.08 -> 1.88 us per call; but B = 4 3.22 -> 3.5
 *    and B = 8 4.06 -> 4.26 (each of the 8 blocks stages the whole token vectors: twice SP =
 *    4's token loads, and the 4-lane sums take 5 shuffles instead of 1).
 * WKV_CUDA_RWKV7_ROWS (1 or 2) and WKV_CUDA_RWKV7_SPLIT (1, 2, 4 or 8; capped for N, 8 meaning
 * P = 4 at N = 64) override them, for tests and measurements. */
struct DecodeLayout {
    int rows, split, lanes;
};

int env_choice(const char* name, int a, int b, int c, int d) {
    const char* e = std::getenv(name);
    const int x = e ? std::atoi(e) : 0;
    return x == a || x == b || x == c || x == d ? x : 0;
}

DecodeLayout decode_layout(int N, int64_t blocks, int sms) {
    static const int forced_rows = env_choice("WKV_CUDA_RWKV7_ROWS", 1, 2, 2, 2);
    static const int forced_split = env_choice("WKV_CUDA_RWKV7_SPLIT", 1, 2, 4, 8);
    const int64_t sm = sms > 0 ? sms : 1;
    DecodeLayout l{1, 1, FwdLanes<64>::P};
    if (N == 128) l.rows = 1; /* R = 2: 128 state registers per thread */
    else if (forced_rows) l.rows = forced_rows;
    else l.rows = blocks * (N / 2) * FwdLanes<64>::P / 32 >= 4 * sm ? 2 : 1;
    if (l.rows == 1) {
        l.split = N == 32 ? 2 : 4;
        if (forced_split) l.split = forced_split < l.split ? forced_split : l.split;
        else
            while (l.split > 1 && blocks * l.split > 8 * sm) l.split /= 2;
    }
    if (N == 64 && l.rows == 1 && (forced_split ? forced_split == 8 : blocks * 8 <= 4 * sm)) l.split = 8, l.lanes = 4;
    return l;
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
template <int N, int R, int SP, int P = FwdLanes<N>::P>
void launch_decode(const Rwkv7FwdParams& p, unsigned nb, cudaStream_t stream) {
    constexpr int NT = DecodeShape<N, R, SP, P>::NT;
    const unsigned grid = nb * SP;
    if constexpr (R == 1) {
        Rwkv7DecodeDense dd;
        int elem = 0;
        if (decode_dense(p, N, &dd, &elem)) {
            if (elem == 0) launch_dense<N, R, SP, P, 0>(dd, grid, NT, stream);
            else if (elem == 1) launch_dense<N, R, SP, P, 1>(dd, grid, NT, stream);
            else launch_dense<N, R, SP, P, 2>(dd, grid, NT, stream);
            return;
        }
    }
    Rwkv7DecodeParams d;
    d.x[F_R] = p.r, d.x[F_D] = p.w, d.x[F_K] = p.k, d.x[F_V] = p.v, d.x[F_A] = p.a, d.x[F_B] = p.b;
    d.y = p.y, d.state_in = p.state_in, d.state_out = p.state_out;
    d.ckpt = p.ckpt, d.first = p.seq.first, d.H = p.H, d.form = p.form;
    rwkv7_decode_kernel<N, R, SP, P><<<grid, NT, 0, stream>>>(d);
}

template <int N>
int launch_fwd(const Rwkv7FwdParams& p, int64_t blocks, int sms, cudaStream_t stream) {
    const unsigned nb = (unsigned)blocks;
    if (p.seq.packed || p.T != 1) {
        if constexpr (N == 64) {
            constexpr unsigned NT = RowTile<N, 1>::NT + N;
            const int vt = vec_type({&p.r, &p.w, &p.k, &p.v, &p.a, &p.b, &p.y},
                                    {&p.r, &p.w, &p.k, &p.v, &p.a, &p.b, &p.y}, p.seq, p.T, p.H);
            with_vec_type(vt, [&](auto vt_c) {
                constexpr int VT = decltype(vt_c)::value;
                if (p.ckpt) rwkv7_forward_ws_kernel<N, VT, true><<<nb, NT, (size_t)p.ck_smem, stream>>>(p);
                else rwkv7_forward_ws_kernel<N, VT><<<nb, NT, 0, stream>>>(p);
                return 0;
            });
        } else {
            rwkv7_forward_kernel<N, 1><<<nb, RowTile<N, 1>::NT, 0, stream>>>(p);
        }
        return (int)cudaGetLastError();
    }
    const DecodeLayout l = decode_layout(N, blocks, sms);
    if (l.rows == 2) {
        if constexpr (N != 128) launch_decode<N, 2, 1>(p, nb, stream);
    } else if (l.lanes == 4) {
        if constexpr (N == 64) launch_decode<N, 1, 8, 4>(p, nb, stream);
    } else if (l.split == 4) {
        if constexpr (N != 32) launch_decode<N, 1, 4>(p, nb, stream);
    } else if (l.split == 2) launch_decode<N, 1, 2>(p, nb, stream);
    else launch_decode<N, 1, 1>(p, nb, stream);
    return (int)cudaGetLastError();
}

} // namespace

int rwkv7_prepare_saving_forward(int N, int* ck_smem) {
    *ck_smem = 0;
    if (N != 64) return (int)cudaSuccess; /* rwkv7_forward_kernel saves by global stores */
    /* the kernel image this device runs: sm_90 code (or PTX JIT-compiled from compute_90) has
     * the bulk-copy path; older ones store directly and need no tiles */
    cudaFuncAttributes attr;
    cudaError_t e = cudaFuncGetAttributes(&attr, rwkv7_forward_ws_kernel<64, 0, true>);
    if (e != cudaSuccess || attr.binaryVersion < 90) return (int)e;
    const int bytes = 2 * 64 * 64 * (int)sizeof(float); /* two checkpoint tiles */
    for (int vt = 0; vt <= 3 && e == cudaSuccess; ++vt)
        e = (cudaError_t)with_vec_type(vt, [&](auto vt_c) {
            constexpr int VT = decltype(vt_c)::value;
            return (int)cudaFuncSetAttribute(rwkv7_forward_ws_kernel<64, VT, true>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
        });
    if (e == cudaSuccess) *ck_smem = bytes;
    return (int)e;
}

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
