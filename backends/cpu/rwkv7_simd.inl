/* RWKV-7 vector kernels, written against the traits V (see simd_avx2.inl); included by
 * cpu_<isa>.cpp after simd_common.inl. The math and the workspace are rwkv7.cpp's; what differs
 * is the order of the float32 operations (sums over j run in W lanes, reduced by V::hsum4).
 *
 * FORWARD. Per (sequence, head) item the N x N state lives in scratch, padded to Np x Np
 * (Np = N rounded up to W) — or, for a one-token call whose states are float32 rows of N == Np
 * contiguous floats, in the caller's state_in / state_out themselves (decode: no copy at all).
 * Per token, one sweep over the state, kRows value rows at a time:
 *     sa[i] = S[i] . a                          (the rows as they were: S_{t-1})
 *     S[i]  = S[i] * decay + sa[i] b + v[i] k   (written back in place: row i needs only
 *     y[i]  = S[i] . r                           its own old values and sa[i])
 * the decay computed per token by vexp (decay_rows). N = 32, 64, 128 (padded) have
 * compile-time row lengths; other N run the same code with a run-time length.
 *
 * Items of kTransposedMinLen tokens or more at N = 32 / 64 / 128 walk a transposed state
 * instead (rwkv7_transposed.inl: one pass per token, no horizontal sums), unless
 * WKV_RWKV7_WALK=rows.
 *
 * Forward scratch per chunk: G Np^2 + 8 Np floats (states; r w k v a b decay y rows); on a
 * transposed walk, G Np^2 + walk_scratch_floats (the token rows and the walk's rows), plus
 * G kBlock Np for the block walk (the group's y rows of a block). */

#ifndef WKV_RWKV7_ROWS
#define WKV_RWKV7_ROWS 4
#endif
constexpr int kRows = WKV_RWKV7_ROWS; /* value rows per pass (a multiple of 4) */
constexpr int64_t K7 = kRwkv7CheckpointInterval; /* the checkpoint interval */

/* sa = S . a for the kRows rows at `rows` (row stride rs), summed into sa_mem (and sa_out). */
template <int NV>
WKV_SIMD_INLINE void sa_block(const float* rows, int64_t rs, int nv, const float* __restrict a,
                              float* sa_mem, float* sa_out) noexcept {
    T c[kRows];
#pragma GCC unroll 16
    for (int u = 0; u < kRows; ++u) c[u] = V::zero();
#pragma GCC unroll 16
    for (int q = 0; q < (NV ? NV : nv); ++q) {
        const T av = V::load(a + q * W);
#pragma GCC unroll 16
        for (int u = 0; u < kRows; ++u) c[u] = V::fma(V::load(rows + u * rs + q * W), av, c[u]);
    }
#pragma GCC unroll 16
    for (int u = 0; u < kRows; u += 4) {
        const V::Q sa4 = V::hsum4(c[u], c[u + 1], c[u + 2], c[u + 3]);
        V::q_store(sa_mem + u, sa4);
        if (sa_out) V::q_storeu(sa_out + u, sa4);
    }
}

/* The update (+ readout) of the kRows rows [ib, ib + kRows) of one token: step_rows' loop body,
 * with the rows' sa at sa (sa_block's sums). */
template <int NV, bool kY, bool kDr>
WKV_SIMD_INLINE void update_block(const float* src, int64_t srs, float* dst, int64_t drs, int nv,
                                  int64_t ib, const float* sa, const float* __restrict decay,
                                  const float* __restrict k, const float* __restrict v,
                                  const float* __restrict b, const float* __restrict r,
                                  float* y) noexcept {
    const float* sp[kRows];
    float* dp[kRows];
#pragma GCC unroll 16
    for (int u = 0; u < kRows; ++u) {
        sp[u] = src + (ib + u) * srs;
        dp[u] = dst + (ib + u) * drs;
    }
    /* per-row scalars are broadcast from memory (a load-port operation) rather than
     * shuffled out of a register (the port 512-bit FMAs also use): NOTES.md, step 12 */
    T sab[kRows], vb[kRows];
#pragma GCC unroll 16
    for (int u = 0; u < kRows; ++u) {
        sab[u] = V::bcast_mem(sa + u);
        vb[u] = V::bcast_mem(v + ib + u);
    }

    T dyb[kRows]; /* kDr: dy of the rows */
    if (kDr) {
#pragma GCC unroll 16
        for (int u = 0; u < kRows; ++u) dyb[u] = V::bcast_mem(r + ib + u);
    }

    T yc[kRows];
#pragma GCC unroll 16
    for (int u = 0; u < kRows; ++u) yc[u] = V::zero();
#pragma GCC unroll 16
    for (int q = 0; q < nv; ++q) {
        const int64_t o = (int64_t)q * W;
        const T dv = V::load(decay + o), bv = V::load(b + o), kv = V::load(k + o);
        const T rv = kY ? V::load(r + o) : V::zero();
        T drv = kDr ? V::load(y + o) : V::zero();
#pragma GCC unroll 16
        for (int u = 0; u < kRows; ++u) {
            const T x = V::fma(V::load(sp[u] + o), dv, V::fma(sab[u], bv, V::mul(vb[u], kv)));
            V::store(dp[u] + o, x);
            if (kY) yc[u] = V::fma(x, rv, yc[u]);
            if (kDr) drv = V::fma(x, dyb[u], drv);
        }
        if (kDr) V::store(y + o, drv);
    }
    if (kY) {
#pragma GCC unroll 16
        for (int u = 0; u < kRows; u += 4)
            V::q_storeu(y + ib + u, V::hsum4(yc[u], yc[u + 1], yc[u + 2], yc[u + 3]));
    }
}

/* One token over the rows [0, Np) of the state: src rows (row stride srs) -> dst rows (drs);
 * dst may be src (in place). NV: vectors per row (0 = the run-time nv). kY: also y = S_new . r
 * (into y). kDr (the backward's replay): also dr = S_new^T dy (into y, with r = dy). sa_out
 * (may be NULL): sa per row.
 * Software-pipelined by one block of rows: the sa sums of block ib + kRows (its FMAs and
 * hsum4, a chain of ~40 cycles) are issued before block ib's update, whose sa came from the
 * iteration before, so the update's FMAs never wait on a reduction (NOTES.md, step 23). Every
 * value is computed by the same operations in the same order as without the pipelining. */
template <int NV, bool kY, bool kDr = false>
inline void step_rows(const float* src, int64_t srs, float* dst, int64_t drs, int nv_rt,
                      int64_t Np, const float* __restrict decay, const float* __restrict k,
                      const float* __restrict v, const float* __restrict a,
                      const float* __restrict b, const float* __restrict r, float* y,
                      float* sa_out) noexcept {
    const int nv = NV ? NV : nv_rt;
    alignas(16) float sa_mem[2][kRows];
    if (kDr)
        for (int64_t j = 0; j < Np; j += W) V::store(y + j, V::zero());
    sa_block<NV>(src, srs, nv, a, sa_mem[0], sa_out);
    int cur = 0;
    for (int64_t ib = 0; ib < Np; ib += kRows, cur ^= 1) {
        /* the next block's sa first: rows of src that this block's update does not write */
        if (ib + kRows < Np)
            sa_block<NV>(src + (ib + kRows) * srs, srs, nv, a, sa_mem[cur ^ 1],
                         sa_out ? sa_out + ib + kRows : nullptr);
        update_block<NV, kY, kDr>(src, srs, dst, drs, nv, ib, sa_mem[cur], decay, k, v, b, r, y);
    }
}

/* Per-token rows in scratch: r w k v a b decay y, Np floats each. */
struct Rows7 {
    float *r, *w, *k, *v, *a, *b, *decay, *y;
};
inline Rows7 carve_rows7(float* rows, int64_t Np) noexcept {
    Rows7 x;
    x.r = rows;
    x.w = rows + Np;
    x.k = rows + 2 * Np;
    x.v = rows + 3 * Np;
    x.a = rows + 4 * Np;
    x.b = rows + 5 * Np;
    x.decay = rows + 6 * Np;
    x.y = rows + 7 * Np;
    return x;
}

/* The token's inputs as float32 rows of Np (pointers into the tensors where possible); without
 * r (!with_r) or a (!with_a: the fused walk read it a token earlier) they are NULL. */
struct Inputs7 {
    const float *r, *k, *v, *a, *b, *decay;
};
inline Inputs7 load_inputs7(const wkv_problem* p, int64_t batch, int64_t t, int64_t h,
                            int64_t Np, bool with_r, const Rows7& x, float* ddw,
                            bool with_a = true) noexcept {
    const int64_t N = p->N;
    Inputs7 in;
    in.r = with_r ? token_in(p->r, batch, t, h, N, Np, x.r) : nullptr;
    in.k = token_in(p->k, batch, t, h, N, Np, x.k);
    in.v = token_in(p->v, batch, t, h, N, Np, x.v);
    in.a = with_a ? token_in(p->a, batch, t, h, N, Np, x.a) : nullptr;
    in.b = token_in(p->b, batch, t, h, N, Np, x.b);
    const float* w = token_in(p->w, batch, t, h, N, Np, x.w);
    if (p->decay_form == WKV_DECAY_DIRECT && !ddw) { /* the decays themselves: no copy */
        in.decay = w;
        return in;
    }
    decay_rows(p->decay_form, w, x.decay, ddw, Np);
    in.decay = x.decay;
    return in;
}

int64_t forward_group7(const wkv_problem* p, int64_t threads) {
#ifdef WKV_RWKV7_GROUP /* a fixed group, for experiments (NOTES.md) */
    (void)p;
    (void)threads;
    return WKV_RWKV7_GROUP;
#else
    return head_group(p, threads);
#endif
}

#include "rwkv7_transposed.inl"

uint64_t forward_chunk_floats7(const wkv_problem* p, int64_t group, CheckedSize& c) {
    const uint64_t Np = (uint64_t)padded(p->N), G = (uint64_t)group;
    const uint64_t states = c.mul(G, c.mul(Np, Np));
    const Walk7 walk = walk_setting7();
    if (walk == Walk7::rows) return c.add(states, c.mul(8, Np));
    /* the walk's scratch (with the token rows); the blocks' y rows of the group */
    const uint64_t ws = (uint64_t)walk_scratch_floats(walk, (int64_t)Np, group);
    return c.add(c.add(states, ws), walk == Walk7::blocks ? c.mul(G, c.mul((uint64_t)kBlock, Np)) : 0);
}

template <int NV>
void forward_item7_nv(const wkv_problem* p, int64_t G, int64_t item, float* scratch,
                      const BackwardJob* save) noexcept {
    const int64_t H = p->H, N = p->N, Np = padded(N);
    const int nv = (int)(Np / W);
    const int64_t groups = (H + G - 1) / G;
    const int64_t s = item / groups, h0 = item % groups * G;
    const int64_t h1 = h0 + G < H ? h0 + G : H;
    const int64_t nh = h1 - h0;
    int64_t batch, t0, t1;
    wkv_problem_sequence(p, s, &batch, &t0, &t1);
    if constexpr (NV != 0) {
        const Walk7 walk = walk7<NV>(t1 - t0);
        if (walk != Walk7::rows) {
            forward_item7_transposed<NV>(walk, p, G, item, scratch, save);
            return;
        }
    }

    const Rows7 x = carve_rows7(scratch + G * Np * Np, Np);
    float* S[kMaxGroup];        /* head g's state in scratch (Np x Np) */
    const float* src[kMaxGroup]; /* where head g's next token reads its state */
    int64_t srs[kMaxGroup];
    float* out[kMaxGroup];       /* state_out rows addressed in place, or NULL */
    int64_t out_rs[kMaxGroup];
    /* save: head g's checkpoints (the backward's layout), the state before token t0 + q K at
     * ck[g] + q Np^2; the forward's own sweep writes them: the token before a boundary steps
     * into the checkpoint, the next one steps out of it */
    float* ck[kMaxGroup];
    const int64_t nseg = segment_count(t1 - t0, K7);
    for (int64_t g = 0; g < nh; ++g) {
        S[g] = scratch + g * Np * Np;
        const int64_t h = h0 + g;
        if (t1 == t0) { /* the state passes through */
            if (view_present(p->state_out)) {
                state_in_padded(p->state_in, s, h, N, Np, S[g]);
                state_out_padded(p->state_out, s, h, N, Np, S[g]);
            }
            continue;
        }
        ck[g] = save ? save->ckpt + ((size_t)save->first_segment(s) * (size_t)H +
                                     (size_t)h * (size_t)nseg) * (size_t)(Np * Np)
                     : nullptr;
        srs[g] = Np;
        src[g] = ck[g] ? nullptr : state_rows(p->state_in, s, h, N, Np, &srs[g]);
        if (ck[g]) {
            state_in_padded(p->state_in, s, h, N, Np, ck[g]); /* as the checkpoint pass does */
            src[g] = ck[g];
        } else if (!src[g]) {
            state_in_padded(p->state_in, s, h, N, Np, S[g]); /* all of it before any write */
            src[g] = S[g];
            srs[g] = Np;
        }
        out_rs[g] = 0;
        out[g] = state_rows(p->state_out, s, h, N, Np, &out_rs[g]);
    }
    if (t1 == t0) return;

    const bool want_y = view_present(p->y);
    for (int64_t t = t0; t < t1; ++t) {
        const bool last = t + 1 == t1;
        const int64_t boundary = save && (t + 1 - t0) % K7 == 0 && !last ? (t + 1 - t0) / K7 : 0;
        for (int64_t g = 0; g < nh; ++g) {
            const int64_t h = h0 + g;
            float* dst = last && out[g] ? out[g] : boundary ? ck[g] + boundary * Np * Np : S[g];
            const int64_t drs = last && out[g] ? out_rs[g] : Np;
            const Inputs7 in = load_inputs7(p, batch, t, h, Np, want_y, x, nullptr);
            if (want_y) {
                float* yd = token_out_direct(p->y, batch, t, h, N, Np);
                step_rows<NV, true>(src[g], srs[g], dst, drs, nv, Np, in.decay, in.k, in.v, in.a,
                                    in.b, in.r, yd ? yd : x.y, nullptr);
                if (!yd) token_out(p->y, batch, t, h, N, x.y);
            } else {
                step_rows<NV, false>(src[g], srs[g], dst, drs, nv, Np, in.decay, in.k, in.v,
                                     in.a, in.b, nullptr, nullptr, nullptr);
            }
            src[g] = dst;
            srs[g] = drs;
        }
    }
    for (int64_t g = 0; g < nh; ++g)
        if (!out[g]) state_out_padded(p->state_out, s, h0 + g, N, Np, src[g]);
}

void forward_item7(const wkv_problem* p, int64_t group, int64_t item, float* scratch,
                   const BackwardJob* save) noexcept {
    switch (p->N) {
    case 32: forward_item7_nv<32 / W>(p, group, item, scratch, save); return;
    case 64: forward_item7_nv<64 / W>(p, group, item, scratch, save); return;
    case 128: forward_item7_nv<128 / W>(p, group, item, scratch, save); return;
    default: forward_item7_nv<0>(p, group, item, scratch, save); return;
    }
}

/* ----------------------------------------------------------------------------- backward
 * rwkv7.cpp's checkpoint + replay scheme (K = 32), with these changes:
 *   - an item is a group of up to kBackwardGroup heads of a sequence (backward_group7), whose
 *     input rows are read token-major, all the group's heads of a token together: in the
 *     checkpoint pass as in the forward, and for each segment into the token records of every
 *     head of the group (converted, with decay and d decay / d w), before the heads replay and
 *     sweep it one after the other; the gradients go to the records too and are written
 *     token-major after the last head. (One head per item read each token's rows from a page
 *     of its own: NOTES.md, step 8.)
 *   - the replay of a segment keeps, per token, sa (from its sweep) and dr = S_t^T dy (the
 *     state it has just made), so the backward sweep needs only S_{t-1}, never S_t;
 *   - the backward sweep is one pass per kRows rows for g = dS + dy r^T with dk, db, dd and the
 *     dv, dsa sums, and a second for da = Sp^T dsa; the state update dS = g decay + dsa a^T is
 *     deferred into the next token's first pass (and done alone after a segment's first token),
 *     so each token reads and writes dS once (NOTES.md, step 21);
 *   - head j's sweep and head j + 1's replay run together, block of rows by block of rows,
 *     the replay writing each state into the slot the sweep has just read (sweep_replay_rows;
 *     NOTES.md, step 37).
 * Workspace (floats), with G = the group, R = min(K, max_s L_s):
 *   checkpoints = H * (sum_s ceil(L_s / K)) * Np^2   (as rwkv7.cpp's, N padded to Np)
 *   chunk       = (G + R) * Np^2 + G * R * kTokRows * Np + Np
 *                 (the group's dS, R replay states, G * R token records, one row of sums). */
/* record rows: r k v a b dy decay ddw sa dr (w before it) dw dk dv da db */
constexpr int64_t kTokRows = 15;
/* 8 heads: each token's rows of a group are 2 KiB runs at f32 N = 64 (1 KiB at bf16), half the
 * pages per byte of 4 heads; the chunk is ~1.6 MiB of L2 (NOTES.md, step 36) */
constexpr int64_t kBackwardGroup = 8;

/* One token's rows for the backward (each Np long). */
struct Tok7 {
    const float *r, *k, *v, *a, *b, *dy;
    float *decay, *ddw, *sa, *dr;
};

/* Loads token t's rows into record `rows` (kTokRows * Np floats): r k v a b dy (only with
 * grads) converted, or pointers into the tensors where they are float32 rows and !copy; decay
 * and ddw (only with grads) computed. */
inline Tok7 load_tok7(const wkv_problem* p, int64_t batch, int64_t t, int64_t h, int64_t Np,
                      float* rows, bool with_grads, bool copy) noexcept {
    const int64_t N = p->N;
    auto in = [&](const wkv_view& v, float* buf) -> const float* {
        const float* x = token_in(v, batch, t, h, N, Np, buf);
        if (copy && x != buf) /* a row in the tensor (Np floats): inline vector copies */
            for (int64_t j = 0; j < Np; j += W) V::store(buf + j, V::load(x + j));
        return buf;
    };
    Tok7 x;
    float* w = rows + 9 * Np; /* w shares the dr row: dr is written after decay is made */
    x.k = copy ? in(p->k, rows + Np) : token_in(p->k, batch, t, h, N, Np, rows + Np);
    x.v = copy ? in(p->v, rows + 2 * Np) : token_in(p->v, batch, t, h, N, Np, rows + 2 * Np);
    x.a = copy ? in(p->a, rows + 3 * Np) : token_in(p->a, batch, t, h, N, Np, rows + 3 * Np);
    x.b = copy ? in(p->b, rows + 4 * Np) : token_in(p->b, batch, t, h, N, Np, rows + 4 * Np);
    x.decay = rows + 6 * Np;
    x.ddw = rows + 7 * Np;
    x.sa = rows + 8 * Np;
    x.dr = rows + 9 * Np;
    decay_rows(p->decay_form, token_in(p->w, batch, t, h, N, Np, w), x.decay,
               with_grads ? x.ddw : nullptr, Np);
    if (with_grads) {
        x.r = copy ? in(p->r, rows) : token_in(p->r, batch, t, h, N, Np, rows);
        x.dy = copy ? in(p->dy, rows + 5 * Np) : token_in(p->dy, batch, t, h, N, Np, rows + 5 * Np);
    } else {
        x.r = x.dy = nullptr;
    }
    return x;
}

/* The record's rows, as load_tok7(copy = true) left them. */
inline Tok7 record7(float* rows, int64_t Np) noexcept {
    Tok7 x;
    x.r = rows;
    x.k = rows + Np;
    x.v = rows + 2 * Np;
    x.a = rows + 3 * Np;
    x.b = rows + 4 * Np;
    x.dy = rows + 5 * Np;
    x.decay = rows + 6 * Np;
    x.ddw = rows + 7 * Np;
    x.sa = rows + 8 * Np;
    x.dr = rows + 9 * Np;
    return x;
}

constexpr bool kSweepPipelined = W >= 16; /* AVX-512 (32 registers of 16 floats) */

/* backward_rows' second pass for the kRows rows of Sp at sp: da += Sp^T dsa (dS's own update
 * waits for the next step), dsa of the rows at dsa. */
template <int NV>
WKV_SIMD_INLINE void da_rows(const float* sp, const float* dsa, float* da, int nv_rt,
                             int64_t Np_rt) noexcept {
    const int nv = NV ? NV : nv_rt;
    const int64_t Np = NV ? (int64_t)NV * W : Np_rt;
    T dsab[kRows];
#pragma GCC unroll 16
    for (int u = 0; u < kRows; ++u) dsab[u] = V::bcast_mem(dsa + u);
#pragma GCC unroll 16
    for (int q = 0; q < nv; ++q) {
        const int64_t o = (int64_t)q * W;
        T dav = V::load(da + o);
#pragma GCC unroll 16
        for (int u = 0; u < kRows; ++u) dav = V::fma(V::load(sp + u * Np + o), dsab[u], dav);
        V::store(da + o, dav);
    }
}

/* backward_rows (below): one backward step over the rows of dS (row stride Np), token t, whose
 * record (load_tok7's rows, kTokRows * Np floats) is `rec`; token t+1's record follows it
 * (rec + kTokRows Np). The update of dS from token t+1 (dS_t = g_{t+1} decay_{t+1} +
 * dsa_{t+1} a_{t+1}^T) is deferred into this step's first pass (kPend), so that the state is
 * read and written once per token:
 *   entry, kPend:  dS = g_{t+1}, and token t+1's record holds dsa_{t+1} in its sa row;
 *   entry, !kPend: dS = the gradient w.r.t. S_t (the segment's last token: nothing pending);
 *   exit:          dS = g_t = dS_t + dy_t r_t^T, and dsa_t in token t's sa row (each sa_t is
 *                  read before it is overwritten), for the next step or apply_pending7.
 * Writes the record's dv, dk, db, da rows and the sum over rows dd (see rwkv7.cpp), with the
 * old order of every float operation (the deferred update is the same mul and fma, later).
 * Every row is addressed from rec with compile-time offsets (NV > 0): the pass then needs a
 * handful of general registers, where a pointer per row spilled them (NOTES.md, step 21).
 * sweep_block is its first pass over the kRows rows [ib, ib + kRows); sweep_begin, sweep_da and
 * sweep_end the rest, so that sweep_replay_rows can run a replay beside it. */
template <int NV, bool kPend>
WKV_SIMD_INLINE void sweep_block(float* dS, const float* Sp, float* rec, float* __restrict dd,
                                 int nv_rt, int64_t Np_rt, int64_t ib) noexcept {
    const int nv = NV ? NV : nv_rt;
    const int64_t Np = NV ? (int64_t)NV * W : Np_rt;
    /* the record's rows (record7's order) and the gradient rows after them */
    const float *r = rec, *k = rec + Np, *v = rec + 2 * Np, *b = rec + 4 * Np,
                *dy = rec + 5 * Np;
    float* dsa = rec + 8 * Np; /* sa_t, then dsa_t row by row */
    float *dk = rec + 11 * Np, *dv = rec + 12 * Np, *db = rec + 14 * Np;
    const float* next = rec + kTokRows * Np; /* token t+1's record (kPend) */
    const float *pa = next + 3 * Np, *pdecay = next + 6 * Np, *pdsa = next + 8 * Np;
    float* g = dS + ib * Np;
    const float* sp = Sp + ib * Np;
    /* per-row scalars: dy and the pending dsa held as broadcasts; v and sa, read once per
     * vector, as broadcasts from memory into the FMA (V::fma_bm), which keeps the pass
     * inside AVX-512's 32 registers */
    T dyb[kRows], pdb[kRows];
#pragma GCC unroll 16
    for (int u = 0; u < kRows; ++u) {
        dyb[u] = V::bcast_mem(dy + ib + u);
        if (kPend) pdb[u] = V::bcast_mem(pdsa + ib + u);
    }

    /* g = dS_t + dy r^T, dS_t = g' decay' + dsa' a'^T (kPend; ' = token t+1) (stored);
     * dk += g^T v;  db += g^T sa;  dd += sum_i g * Sp;  cv = g . k (dv);  cb = g . b (dsa) */
    T cv[kRows], cb[kRows];
#pragma GCC unroll 16
    for (int u = 0; u < kRows; ++u) cv[u] = cb[u] = V::zero();
#pragma GCC unroll 16
    for (int q = 0; q < nv; ++q) {
        const int64_t o = (int64_t)q * W;
        const T rv = V::load(r + o), kv = V::load(k + o), bv = V::load(b + o);
        const T pdec = kPend ? V::load(pdecay + o) : V::zero();
        const T pav = kPend ? V::load(pa + o) : V::zero();
        T dkv = V::load(dk + o), dbv = V::load(db + o), ddv = V::load(dd + o);
#pragma GCC unroll 16
        for (int u = 0; u < kRows; ++u) {
            const T ds = kPend ? V::fma(V::load(g + u * Np + o), pdec, V::mul(pdb[u], pav))
                               : V::load(g + u * Np + o);
            const T gv = V::fma(dyb[u], rv, ds);
            V::store(g + u * Np + o, gv);
            dkv = V::fma_bm(gv, v + ib + u, dkv);
            dbv = V::fma_bm(gv, dsa + ib + u, dbv); /* still sa_t here */
            ddv = V::fma(gv, V::load(sp + u * Np + o), ddv);
            cv[u] = V::fma(gv, kv, cv[u]);
            cb[u] = V::fma(gv, bv, cb[u]);
        }
        V::store(dk + o, dkv);
        V::store(db + o, dbv);
        V::store(dd + o, ddv);
    }
#pragma GCC unroll 16
    for (int u = 0; u < kRows; u += 4) {
        V::q_storeu(dv + ib + u, V::hsum4(cv[u], cv[u + 1], cv[u + 2], cv[u + 3]));
        V::q_storeu(dsa + ib + u, V::hsum4(cb[u], cb[u + 1], cb[u + 2], cb[u + 3]));
    }
}

/* backward_rows' zeroed sums: the record's dk, db, da rows and dd. */
inline void sweep_begin(float* rec, float* dd, int64_t Np) noexcept {
    float *dk = rec + 11 * Np, *da = rec + 13 * Np, *db = rec + 14 * Np;
    for (int64_t j = 0; j < Np; j += W) {
        V::store(dk + j, V::zero());
        V::store(db + j, V::zero());
        V::store(dd + j, V::zero());
        V::store(da + j, V::zero());
    }
}

/* backward_rows' second passes due after block ib's first: da += Sp^T dsa for block ib, or on
 * AVX-512 for the block before it, whose dsa sums are long done, so that this block's
 * reductions run beside it instead of in front of it (NOTES.md, step 25: the sweep −10%; on
 * AVX2, 16 registers, no gain: there each block's own pass). */
template <int NV>
WKV_SIMD_INLINE void sweep_da(const float* Sp, float* rec, int nv, int64_t Np,
                              int64_t ib) noexcept {
    const float* dsa = rec + 8 * Np;
    float* da = rec + 13 * Np;
    if (!kSweepPipelined) da_rows<NV>(Sp + ib * Np, dsa + ib, da, nv, Np);
    else if (ib > 0) da_rows<NV>(Sp + (ib - kRows) * Np, dsa + ib - kRows, da, nv, Np);
}
template <int NV>
WKV_SIMD_INLINE void sweep_end(const float* Sp, float* rec, int nv, int64_t Np) noexcept {
    if (kSweepPipelined)
        da_rows<NV>(Sp + (Np - kRows) * Np, rec + 8 * Np + Np - kRows, rec + 13 * Np, nv, Np);
}

template <int NV, bool kPend>
inline void backward_rows(float* dS, const float* Sp, float* rec, float* __restrict dd,
                          int nv_rt, int64_t Np_rt) noexcept {
    const int nv = NV ? NV : nv_rt;
    const int64_t Np = NV ? (int64_t)NV * W : Np_rt;
    sweep_begin(rec, dd, Np);
    for (int64_t ib = 0; ib < Np; ib += kRows) {
        sweep_block<NV, kPend>(dS, Sp, rec, dd, nv, Np, ib);
        sweep_da<NV>(Sp, rec, nv, Np, ib);
    }
    sweep_end<NV>(Sp, rec, nv, Np);
}

/* backward_rows for one head (dS, Sp, rec) and step_rows<NV, false, true> for another (the
 * replay of token x from src into dst), block by block: each replay block's update runs after
 * the sweep has read the same rows of Sp for the last time (its first pass and da), so dst may
 * be Sp — the replay then writes lines the sweep has just brought into L1 instead of fetching
 * them from L2 to write them (NOTES.md, step 37). The replay's update lags the sweep by one
 * block; each computes what it computes alone, in the same order. */
template <int NV, bool kPend>
inline void sweep_replay_rows(float* dS, const float* Sp, float* rec, float* __restrict dd,
                              int nv_rt, int64_t Np_rt, const float* src, float* dst,
                              const Tok7& x) noexcept {
    const int nv = NV ? NV : nv_rt;
    const int64_t Np = NV ? (int64_t)NV * W : Np_rt;
    alignas(16) float sa_mem[2][kRows];
    sweep_begin(rec, dd, Np);
    for (int64_t j = 0; j < Np; j += W) V::store(x.dr + j, V::zero());
    sa_block<NV>(src, Np, nv, x.a, sa_mem[0], x.sa);
    int cur = 0;
    for (int64_t ib = 0; ib < Np; ib += kRows) {
        sweep_block<NV, kPend>(dS, Sp, rec, dd, nv, Np, ib);
        sweep_da<NV>(Sp, rec, nv, Np, ib);
        if (ib > 0) { /* the replay's block ib - kRows, its sa of block ib first */
            sa_block<NV>(src + ib * Np, Np, nv, x.a, sa_mem[cur ^ 1], x.sa + ib);
            update_block<NV, false, true>(src, Np, dst, Np, nv, ib - kRows, sa_mem[cur], x.decay,
                                          x.k, x.v, x.b, x.dy, x.dr);
            cur ^= 1;
        }
    }
    sweep_end<NV>(Sp, rec, nv, Np);
    update_block<NV, false, true>(src, Np, dst, Np, nv, Np - kRows, sa_mem[cur], x.decay, x.k,
                                  x.v, x.b, x.dy, x.dr);
}

/* The deferred update of backward_rows, alone: dS = dS decay + dsa a^T with token x's rows
 * (dsa in its sa row), at the end of a segment (the first token of the segment). */
inline void apply_pending7(float* dS, int64_t Np, const Tok7& x) noexcept {
    for (int64_t i = 0; i < Np; ++i) {
        const T dsab = V::bcast_mem(x.sa + i);
        float* g = dS + i * Np;
        for (int64_t o = 0; o < Np; o += W)
            V::store(g + o, V::fma(V::load(g + o), V::load(x.decay + o), V::mul(dsab, V::load(x.a + o))));
    }
}

int64_t backward_group7(const wkv_problem* p, int64_t threads) {
    return backward_head_group(p, threads, kBackwardGroup);
}

BackwardSizes backward_sizes7(const wkv_problem* p, const BackwardShape& shape, CheckedSize& c) {
    const uint64_t Np = (uint64_t)padded(p->N), G = (uint64_t)shape.group;
    BackwardSizes z;
    z.replay_states = shape.max_len < K7 ? shape.max_len : K7;
    const uint64_t R = (uint64_t)z.replay_states;
    z.ckpt_floats = c.mul(c.mul((uint64_t)p->H, shape.segments), c.mul(Np, Np));
    z.chunk_floats = c.add(c.add(c.mul(c.add(G, R), c.mul(Np, Np)),
                                 c.mul(c.mul(c.mul(G, R), (uint64_t)kTokRows), Np)),
                           Np);
    return z;
}

template <int NV>
void backward_item7_nv(const BackwardJob* job, int64_t item, float* scratch) noexcept {
    const wkv_problem* p = job->p;
    const int64_t H = p->H, N = p->N, Np = padded(N);
    const int nv = (int)(Np / W);
    const size_t n2 = (size_t)(Np * Np);
    const int64_t G = job->layout.group, groups = (H + G - 1) / G;
    const int64_t s = item / groups, h0 = item % groups * G;
    const int64_t nh = h0 + G < H ? G : H - h0;
    int64_t batch, t0, t1;
    wkv_problem_sequence(p, s, &batch, &t0, &t1);
    const int64_t len = t1 - t0;
    const int64_t R = job->layout.replay_states;

    float* dSs = scratch;                       /* G states */
    float* replay = dSs + (size_t)G * n2;       /* R states */
    float* recs = replay + (size_t)R * n2;      /* G * R records */
    float* dd = recs + (size_t)(G * R * kTokRows * Np);
    const size_t rec_floats = (size_t)(kTokRows * Np);
    auto rec = [&](int64_t j, int64_t u) { return recs + (size_t)(j * R + u) * rec_floats; };

    if (len == 0) { /* nothing flows through but the state gradient */
        if (view_present(p->dstate_in))
            for (int64_t j = 0; j < nh; ++j) {
                state_in_padded(p->dstate_out, s, h0 + j, N, Np, dSs);
                state_out_padded(p->dstate_in, s, h0 + j, N, Np, dSs);
            }
        return;
    }

    const int64_t nseg = segment_count(len, K7);
    const int64_t seg0 = job->first_segment(s);
    const bool nt = stream_gradients(p);
    auto ck = [&](int64_t j, int64_t g) {
        return job->ckpt + ((size_t)seg0 * (size_t)H + (size_t)(h0 + j) * (size_t)nseg + (size_t)g) * n2;
    };

    /* 1. checkpoints: ck(j, g) = head j's state before token t0 + g K, token-major over the
     *    group (each head runs in place in replay[j]; nseg > 1 means R = K >= G) */
    const int64_t pass = p->reuse_checkpoints ? 0 : nseg; /* reuse: the forward saved them */
    for (int64_t j = 0; j < nh && pass; ++j) state_in_padded(p->state_in, s, h0 + j, N, Np, ck(j, 0));
    const Walk7 walk = walk7<NV>(len); /* as the forward walks it (rwkv7_transposed.inl) */
    const bool rows = walk == Walk7::rows;
    if constexpr (NV != 0) {
        for (int64_t j = 0; j < nh && pass && !rows; ++j)
            transpose_copy(ck(j, 0), replay + (size_t)j * n2, Np);
        for (int64_t g = 0; g + 1 < pass && !rows; ++g) {
            walk_transposed7<NV>(walk, replay, nh, p, batch, t0 + g * K7, t0 + (g + 1) * K7, t1, h0,
                                 rec(0, 0), false, false, g > 0);
            for (int64_t j = 0; j < nh; ++j) transpose_copy(replay + (size_t)j * n2, ck(j, g + 1), Np);
        }
    }
    for (int64_t g = 0; g + 1 < pass && rows; ++g) {
        for (int64_t u = 0; u < K7; ++u) {
            const int64_t t = t0 + g * K7 + u;
            for (int64_t j = 0; j < nh; ++j) {
                const Tok7 x = load_tok7(p, batch, t, h0 + j, Np, rec(0, 0), false, false);
                const float* src = u == 0 ? ck(j, g) : replay + (size_t)j * n2;
                float* dst = u + 1 == K7 ? ck(j, g + 1) : replay + (size_t)j * n2;
                step_rows<NV, false>(src, Np, dst, Np, nv, Np, x.decay, x.k, x.v, x.a, x.b,
                                     nullptr, nullptr, nullptr);
            }
        }
    }

    /* 2. segments in reverse: the group's records (token-major), then per head replay
     *    (keeping sa and dr) and sweep backward, then the gradients (token-major) */
    for (int64_t j = 0; j < nh; ++j)
        state_in_padded(p->dstate_out, s, h0 + j, N, Np, dSs + (size_t)j * n2);
    for (int64_t g = nseg - 1; g >= 0; --g) {
        const int64_t ts = t0 + g * K7;
        const int64_t m = t1 - ts < K7 ? t1 - ts : K7;
        for (int64_t u = 0; u < m; ++u) {
            for (int64_t j = 0; j < nh; ++j)
                load_tok7(p, batch, ts + u, h0 + j, Np, rec(j, u), true, true);
        }
        /* Head j's S_u (the state after token ts + u) is in replay slot(j, u). Head j's sweep
         * and head j + 1's replay run together (sweep_replay_rows): sweep step k (token
         * m - 1 - k) reads S_{m-2-k} of head j, and replay step k writes S_k of head j + 1 into
         * that same slot right behind it; S_{m-1}, which no sweep reads, goes to the slot left
         * over (m - 1). So the maps alternate: even heads u, odd heads m - 2 - u (NOTES.md,
         * step 37). */
        auto slot = [&](int64_t j, int64_t u) {
            return replay + (size_t)(j % 2 == 0 || u == m - 1 ? u : m - 2 - u) * n2;
        };
        for (int64_t u = 0; u < m; ++u) { /* head 0's replay alone */
            const Tok7 x = record7(rec(0, u), Np);
            step_rows<NV, false, true>(u == 0 ? ck(0, g) : slot(0, u - 1), Np, slot(0, u), Np, nv,
                                       Np, x.decay, x.k, x.v, x.a, x.b, x.dy, x.dr, x.sa);
        }
        for (int64_t j = 0; j < nh; ++j) {
            float* dS = dSs + (size_t)j * n2;
            for (int64_t k = 0; k < m; ++k) {
                const int64_t u = m - 1 - k;
                float* r = rec(j, u);
                const float* Sp = u == 0 ? ck(j, g) : slot(j, u - 1); /* S_{t-1} */
                if (j + 1 < nh) {
                    const Tok7 x = record7(rec(j + 1, k), Np); /* head j + 1, token ts + k */
                    const float* src = k == 0 ? ck(j + 1, g) : slot(j + 1, k - 1);
                    if (u + 1 == m)
                        sweep_replay_rows<NV, false>(dS, Sp, r, dd, nv, Np, src, slot(j + 1, k), x);
                    else
                        sweep_replay_rows<NV, true>(dS, Sp, r, dd, nv, Np, src, slot(j + 1, k), x);
                } else if (u + 1 == m) {
                    backward_rows<NV, false>(dS, Sp, r, dd, nv, Np);
                } else {
                    backward_rows<NV, true>(dS, Sp, r, dd, nv, Np); /* rec(j, u + 1) follows r */
                }
                const float* ddw = r + 7 * Np;
                float* dw = r + 10 * Np;
                for (int64_t jj = 0; jj < Np; jj += W)
                    V::store(dw + jj, V::mul(V::load(dd + jj), V::load(ddw + jj)));
            }
            apply_pending7(dS, Np, record7(rec(j, 0), Np)); /* dS w.r.t. S_{ts-1} */
        }
        for (int64_t u = 0; u < m; ++u) {
            const int64_t t = ts + u;
            for (int64_t j = 0; j < nh; ++j) {
                const float* r = rec(j, u);
                const int64_t h = h0 + j;
                token_grad_out(nt, p->dr, batch, t, h, N, r + 9 * Np);
                token_grad_out(nt, p->dw, batch, t, h, N, r + 10 * Np);
                token_grad_out(nt, p->dk, batch, t, h, N, r + 11 * Np);
                token_grad_out(nt, p->dv, batch, t, h, N, r + 12 * Np);
                token_grad_out(nt, p->da, batch, t, h, N, r + 13 * Np);
                token_grad_out(nt, p->db, batch, t, h, N, r + 14 * Np);
            }
        }
    }

    /* 3. */
    for (int64_t j = 0; j < nh; ++j)
        state_out_padded(p->dstate_in, s, h0 + j, N, Np, dSs + (size_t)j * n2);
    V::stream_fence(); /* the gradients' non-temporal stores, before the item counts as done */
}

void backward_item7(const BackwardJob* job, int64_t item, float* scratch) noexcept {
    switch (job->p->N) {
    case 32: backward_item7_nv<32 / W>(job, item, scratch); return;
    case 64: backward_item7_nv<64 / W>(job, item, scratch); return;
    case 128: backward_item7_nv<128 / W>(job, item, scratch); return;
    default: backward_item7_nv<0>(job, item, scratch); return;
    }
}

/* Puts this ISA's RWKV-7 functions into op (a copy of the scalar kRwkv7Op). */
/* The forward's sweep is the checkpoint pass's step_rows on the same rows (with y besides). */
bool saves7(const wkv_problem*) { return true; }

inline void install_rwkv7(OpDesc* op) noexcept {
    op->saves = saves7;
    op->backward_group = backward_group7;
    op->backward_sizes = backward_sizes7;
    op->backward_item = backward_item7;
    op->forward_group = forward_group7;
    op->forward_chunk_floats = forward_chunk_floats7;
    op->forward_item = forward_item7;
}
