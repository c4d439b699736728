/* RWKV-6 (and RWKV-5) vector kernels, written against the traits V (see simd_avx2.inl);
 * included by cpu_<isa>.cpp after simd_common.inl. The math and the checkpoint scheme are
 * rwkv6.cpp's; what differs is the order of the float32 operations (sums over j in W lanes,
 * reduced by V::hsum4), the padding of N to Np (a multiple of W) and, in the forward, the
 * token-major head groups of simd_common.inl (head_group).
 *
 * FORWARD, per token, one sweep over the state, kRows6 value rows at a time:
 *     y[i] = S[i] . r + v[i] ruk,   S[i] = S[i] * decay + v[i] k      (ruk = sum_j r u k)
 * 3 vector ops per state element. Forward scratch per chunk: G Np^2 + 8 Np floats (G heads'
 * states; r w k v u decay y rows).
 *
 * BACKWARD, per (sequence, head), rwkv6.cpp's replay and sweep; the sweep is one pass per
 * kRows6 rows (dv, dk, dd, dr sums and dS = dS decay + dy r^T): 6 vector ops per element.
 * Only for N a multiple of W, where the workspace is exactly rwkv6.cpp's (the same regions,
 * the same sizes); other N run rwkv6.cpp's scalar backward, so that the workspace formula is
 * the same on every path. */

constexpr int kRows6 = 4;
constexpr int64_t K6 = kRwkv6CheckpointInterval; /* the checkpoint interval */

/* One forward token over the rows [0, Np): src -> dst (may be the same). kY: also y. */
template <int NV, bool kY>
inline void step6_rows(const float* src, int64_t srs, float* dst, int64_t drs, int nv_rt,
                       int64_t Np, const float* __restrict decay, const float* __restrict k,
                       const float* __restrict v, const float* __restrict r, float ruk,
                       float* y) noexcept {
    const int nv = NV ? NV : nv_rt;
    const V::Q ruk4 = V::q_set1(ruk);
    for (int64_t ib = 0; ib < Np; ib += kRows6) {
        const float* sp[kRows6];
        float* dp[kRows6];
#pragma GCC unroll 16
        for (int u = 0; u < kRows6; ++u) {
            sp[u] = src + (ib + u) * srs;
            dp[u] = dst + (ib + u) * drs;
        }
        const V::Q v4 = V::q_loadu(v + ib);
        T vb[kRows6];
#pragma GCC unroll 16
        for (int u = 0; u < kRows6; ++u) vb[u] = V::bcast_mem(v + ib + u); /* load port */
        T yc[kRows6];
#pragma GCC unroll 16
        for (int u = 0; u < kRows6; ++u) yc[u] = V::zero();
#pragma GCC unroll 16
        for (int q = 0; q < nv; ++q) {
            const int64_t o = (int64_t)q * W;
            const T dv = V::load(decay + o), kv = V::load(k + o);
            const T rv = kY ? V::load(r + o) : V::zero();
#pragma GCC unroll 16
            for (int u = 0; u < kRows6; ++u) {
                const T sv = V::load(sp[u] + o);
                if (kY) yc[u] = V::fma(sv, rv, yc[u]);
                V::store(dp[u] + o, V::fma(sv, dv, V::mul(vb[u], kv)));
            }
        }
        if (kY)
            V::q_storeu(y + ib, V::q_fma(v4, ruk4, V::hsum4(yc[0], yc[1], yc[2], yc[3])));
    }
}

/* sum_j a[j] b[j] c[j] over Np lanes */
inline float dot3(const float* a, const float* b, const float* c, int64_t Np) noexcept {
    T acc = V::zero();
    for (int64_t j = 0; j < Np; j += W)
        acc = V::fma(V::mul(V::load(a + j), V::load(b + j)), V::load(c + j), acc);
    float out[4];
    V::q_storeu(out, V::hsum4(acc, V::zero(), V::zero(), V::zero()));
    return out[0];
}

inline void prefetch_token6(const wkv_problem* p, int64_t batch, int64_t t, int64_t h,
                            bool with_y) noexcept {
    const int64_t N = p->N;
    prefetch_token(p->w, batch, t, h, N);
    prefetch_token(p->k, batch, t, h, N);
    prefetch_token(p->v, batch, t, h, N);
    if (with_y) {
        prefetch_token(p->r, batch, t, h, N);
        prefetch_token(p->y, batch, t, h, N);
    }
}

int64_t forward_group6(const wkv_problem* p, int64_t threads) { return head_group(p, threads); }

uint64_t forward_chunk_floats6(const wkv_problem* p, int64_t group, CheckedSize& c) {
    const uint64_t Np = (uint64_t)padded(p->N);
    return c.add(c.mul((uint64_t)group, c.mul(Np, Np)), c.mul(8, Np));
}

template <int NV>
void forward_item6_nv(const wkv_problem* p, int64_t G, int64_t item, float* scratch,
                      const BackwardJob* save) noexcept {
    const int64_t H = p->H, N = p->N, Np = padded(N);
    const int nv = (int)(Np / W);
    const int64_t groups = (H + G - 1) / G;
    const int64_t s = item / groups, h0 = item % groups * G;
    const int64_t h1 = h0 + G < H ? h0 + G : H;
    const int64_t nh = h1 - h0;
    int64_t batch, t0, t1;
    wkv_problem_sequence(p, s, &batch, &t0, &t1);

    float* rows = scratch + G * Np * Np;
    float* rbuf = rows;
    float* wbuf = rows + Np;
    float* kbuf = rows + 2 * Np;
    float* vbuf = rows + 3 * Np;
    float* ubuf = rows + 4 * Np;
    float* decay = rows + 5 * Np;
    float* y = rows + 6 * Np;

    float* S[kMaxGroup];
    const float* src[kMaxGroup];
    int64_t srs[kMaxGroup];
    float* out[kMaxGroup];
    int64_t out_rs[kMaxGroup];
    /* save: head g's checkpoints (the backward's layout), as in rwkv7_simd.inl's forward */
    float* ck[kMaxGroup];
    const int64_t nseg = segment_count(t1 - t0, K6);
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
    for (int64_t t = t0; t < t0 + kPrefetchAhead && t < t1; ++t)
        for (int64_t h = h0; h < h1; ++h) prefetch_token6(p, batch, t, h, want_y);
    for (int64_t t = t0; t < t1; ++t) {
        const bool last = t + 1 == t1;
        if (t + kPrefetchAhead < t1)
            for (int64_t h = h0; h < h1; ++h)
                prefetch_token6(p, batch, t + kPrefetchAhead, h, want_y);
        const int64_t boundary = save && (t + 1 - t0) % K6 == 0 && !last ? (t + 1 - t0) / K6 : 0;
        for (int64_t g = 0; g < nh; ++g) {
            const int64_t h = h0 + g;
            float* dst = last && out[g] ? out[g] : boundary ? ck[g] + boundary * Np * Np : S[g];
            const int64_t drs = last && out[g] ? out_rs[g] : Np;
            const float* k = token_in(p->k, batch, t, h, N, Np, kbuf);
            const float* v = token_in(p->v, batch, t, h, N, Np, vbuf);
            decay_rows(p->decay_form, token_in(p->w, batch, t, h, N, Np, wbuf), decay, nullptr,
                       Np);
            if (want_y) {
                const float* r = token_in(p->r, batch, t, h, N, Np, rbuf);
                const float* u = token_in(p->u, 0, 0, h, N, Np, ubuf);
                step6_rows<NV, true>(src[g], srs[g], dst, drs, nv, Np, decay, k, v, r,
                                     dot3(r, u, k, Np), y);
                token_out(p->y, batch, t, h, N, y);
            } else {
                step6_rows<NV, false>(src[g], srs[g], dst, drs, nv, Np, decay, k, v, nullptr,
                                      0.0f, nullptr);
            }
            src[g] = dst;
            srs[g] = drs;
        }
    }
    for (int64_t g = 0; g < nh; ++g)
        if (!out[g]) state_out_padded(p->state_out, s, h0 + g, N, Np, src[g]);
}

void forward_item6(const wkv_problem* p, int64_t group, int64_t item, float* scratch,
                   const BackwardJob* save) noexcept {
    switch (p->N) {
    case 32: forward_item6_nv<32 / W>(p, group, item, scratch, save); return;
    case 64: forward_item6_nv<64 / W>(p, group, item, scratch, save); return;
    case 128: forward_item6_nv<128 / W>(p, group, item, scratch, save); return;
    default: forward_item6_nv<0>(p, group, item, scratch, save); return;
    }
}

/* The forward's sweep is the checkpoint pass's step6_rows (with y besides) where the backward
 * is this file's (N a multiple of W); rwkv6.cpp's scalar backward has other roundings. */
bool saves6(const wkv_problem* p) { return p->N % W == 0; }

/* -------------------------------------------------------------------------------- backward */

constexpr int64_t kBackwardRows6 = 14; /* r w k v u decay ddw dy dr dw dk dv dd du */

/* One backward step over the rows of dS (row stride Np): on entry the gradient w.r.t. S_t, on
 * exit w.r.t. S_{t-1} (Sp, row stride Np). Writes dv (per row, without the ruk term) and the
 * sums over rows dk, dd, dr (without the u terms); see rwkv6.cpp. */
template <int NV>
inline void backward6_rows(float* dS, const float* Sp, int nv_rt, int64_t Np,
                           const float* __restrict r, const float* __restrict k,
                           const float* __restrict v, const float* __restrict decay,
                           const float* __restrict dy, float* __restrict dr,
                           float* __restrict dk, float* __restrict dv,
                           float* __restrict dd) noexcept {
    const int nv = NV ? NV : nv_rt;
    for (int64_t j = 0; j < Np; j += W) {
        V::store(dr + j, V::zero());
        V::store(dk + j, V::zero());
        V::store(dd + j, V::zero());
    }
    for (int64_t ib = 0; ib < Np; ib += kRows6) {
        float* g[kRows6];
        const float* sp[kRows6];
#pragma GCC unroll 16
        for (int u = 0; u < kRows6; ++u) {
            g[u] = dS + (ib + u) * Np;
            sp[u] = Sp + (ib + u) * Np;
        }
        T dyb[kRows6], vb[kRows6], cv[kRows6];
#pragma GCC unroll 16
        for (int u = 0; u < kRows6; ++u) { /* load-port broadcasts */
            dyb[u] = V::bcast_mem(dy + ib + u);
            vb[u] = V::bcast_mem(v + ib + u);
        }
#pragma GCC unroll 16
        for (int u = 0; u < kRows6; ++u) cv[u] = V::zero();
        /* cv = g . k;  dk += g^T v;  dd += sum_i g * Sp;  dr += Sp^T dy;  g = g decay + dy r */
#pragma GCC unroll 16
        for (int q = 0; q < nv; ++q) {
            const int64_t o = (int64_t)q * W;
            const T kv = V::load(k + o), rv = V::load(r + o), decv = V::load(decay + o);
            T dkv = V::load(dk + o), ddv = V::load(dd + o), drv = V::load(dr + o);
#pragma GCC unroll 16
            for (int u = 0; u < kRows6; ++u) {
                const T gv = V::load(g[u] + o), pv = V::load(sp[u] + o);
                cv[u] = V::fma(gv, kv, cv[u]);
                dkv = V::fma(gv, vb[u], dkv);
                ddv = V::fma(gv, pv, ddv);
                drv = V::fma(pv, dyb[u], drv);
                V::store(g[u] + o, V::fma(gv, decv, V::mul(dyb[u], rv)));
            }
            V::store(dk + o, dkv);
            V::store(dd + o, ddv);
            V::store(dr + o, drv);
        }
        V::q_storeu(dv + ib, V::hsum4(cv[0], cv[1], cv[2], cv[3]));
    }
}

BackwardSizes backward_sizes6(const wkv_problem* p, const BackwardShape& shape, CheckedSize& c) {
    if (p->N % W != 0) return kRwkv6Op.backward_sizes(p, shape, c);
    const uint64_t Np = (uint64_t)padded(p->N), N = (uint64_t)p->N, H = (uint64_t)p->H;
    const int64_t max_len = shape.max_len;
    BackwardSizes z;
    z.replay_states = max_len < 1 ? 0 : (max_len < K6 ? max_len : K6) - 1;
    z.ckpt_floats = c.mul(c.mul(H, shape.segments), c.mul(Np, Np));
    z.part_floats = c.mul(shape.items, N);
    z.chunk_floats = c.add(c.mul((uint64_t)z.replay_states + 1, c.mul(Np, Np)),
                           c.mul((uint64_t)kBackwardRows6, Np));
    return z;
}

template <int NV>
void backward_item6_nv(const BackwardJob* job, int64_t item, float* scratch) noexcept {
    const wkv_problem* p = job->p;
    const int64_t H = p->H, N = p->N, Np = padded(N);
    const int nv = (int)(Np / W);
    const size_t n2 = (size_t)(Np * Np);
    const int64_t s = item / H, h = item % H;
    int64_t batch, t0, t1;
    wkv_problem_sequence(p, s, &batch, &t0, &t1);
    const int64_t len = t1 - t0;

    float* dS = scratch;
    float* replay = dS + n2; /* replay_states matrices */
    float* rows = replay + (size_t)job->layout.replay_states * n2;
    float* rbuf = rows;
    float* wbuf = rows + Np;
    float* kbuf = rows + 2 * Np;
    float* vbuf = rows + 3 * Np;
    float* ubuf = rows + 4 * Np;
    float* decay = rows + 5 * Np;
    float* ddw = rows + 6 * Np;
    float* dybuf = rows + 7 * Np;
    float* dr = rows + 8 * Np;
    float* dw = rows + 9 * Np;
    float* dk = rows + 10 * Np;
    float* dv = rows + 11 * Np;
    float* dd = rows + 12 * Np;
    float* du = rows + 13 * Np;
    float* du_out = job->part + (size_t)item * (size_t)N;

    for (int64_t j = 0; j < Np; j += W) V::store(du + j, V::zero());
    if (len == 0) { /* nothing flows through but the state gradient */
        for (int64_t j = 0; j < N; ++j) du_out[j] = 0.0f;
        if (view_present(p->dstate_in)) {
            state_in_padded(p->dstate_out, s, h, N, Np, dS);
            state_out_padded(p->dstate_in, s, h, N, Np, dS);
        }
        return;
    }
    const float* u = token_in(p->u, 0, 0, h, N, Np, ubuf);

    const int64_t nseg = segment_count(len, K6);
    const int64_t seg0 = job->first_segment(s);
    const bool nt = stream_gradients(p);
    float* ck = job->ckpt + ((size_t)seg0 * (size_t)H + (size_t)h * (size_t)nseg) * n2;

    /* The m >= 1 tokens from ts on from state `start`: the state after token ts + q into
     * replay[q] for q < m - 1, and the state after the last token into `last` (when not NULL;
     * else it is not computed). */
    auto run_tokens = [&](int64_t ts, int64_t m, const float* start, float* last) {
        const int64_t steps = last ? m : m - 1;
        for (int64_t q = 0; q < steps; ++q) {
            const int64_t t = ts + q;
            if (q + kPrefetchAhead < steps) prefetch_token6(p, batch, t + kPrefetchAhead, h, false);
            const float* k = token_in(p->k, batch, t, h, N, Np, kbuf);
            const float* v = token_in(p->v, batch, t, h, N, Np, vbuf);
            decay_rows(p->decay_form, token_in(p->w, batch, t, h, N, Np, wbuf), decay, nullptr,
                       Np);
            const float* src = q == 0 ? start : replay + (size_t)(q - 1) * n2;
            float* dst = q == m - 1 ? last : replay + (size_t)q * n2;
            step6_rows<NV, false>(src, Np, dst, Np, nv, Np, decay, k, v, nullptr, 0.0f, nullptr);
        }
    };

    /* 1. checkpoints */
    if (!p->reuse_checkpoints) { /* else the forward saved them (saves6) */
        state_in_padded(p->state_in, s, h, N, Np, ck);
        for (int64_t g = 0; g + 1 < nseg; ++g)
            run_tokens(t0 + g * K6, K6, ck + (size_t)g * n2, ck + (size_t)(g + 1) * n2);
    }

    /* 2. segments in reverse: replay, then sweep backward */
    state_in_padded(p->dstate_out, s, h, N, Np, dS);
    for (int64_t g = nseg - 1; g >= 0; --g) {
        const int64_t ts = t0 + g * K6;
        const int64_t m = t1 - ts < K6 ? t1 - ts : K6;
        const float* start = ck + (size_t)g * n2;
        run_tokens(ts, m, start, nullptr);
        for (int64_t q = m - 1; q >= 0; --q) {
            const int64_t t = ts + q;
            if (q >= kPrefetchAhead) {
                prefetch_token6(p, batch, t - kPrefetchAhead, h, false);
                prefetch_token(p->r, batch, t - kPrefetchAhead, h, N);
                prefetch_token(p->dy, batch, t - kPrefetchAhead, h, N);
            }
            const float* Sp = q == 0 ? start : replay + (size_t)(q - 1) * n2; /* S_{t-1} */
            const float* r = token_in(p->r, batch, t, h, N, Np, rbuf);
            const float* k = token_in(p->k, batch, t, h, N, Np, kbuf);
            const float* v = token_in(p->v, batch, t, h, N, Np, vbuf);
            const float* dy = token_in(p->dy, batch, t, h, N, Np, dybuf);
            decay_rows(p->decay_form, token_in(p->w, batch, t, h, N, Np, wbuf), decay, ddw, Np);
            float dyv_out[4];
            {
                T acc = V::zero();
                for (int64_t j = 0; j < Np; j += W)
                    acc = V::fma(V::load(dy + j), V::load(v + j), acc);
                V::q_storeu(dyv_out, V::hsum4(acc, V::zero(), V::zero(), V::zero()));
            }
            const float dyv = dyv_out[0];
            const float ruk = dot3(r, u, k, Np);
            backward6_rows<NV>(dS, Sp, nv, Np, r, k, v, decay, dy, dr, dk, dv, dd);
            const T dyvv = V::set1(dyv), rukv = V::set1(ruk);
            for (int64_t j = 0; j < Np; j += W) {
                const T uj = V::load(u + j), kj = V::load(k + j), rj = V::load(r + j);
                const T ud = V::mul(uj, dyvv);
                V::store(dr + j, V::fma(kj, ud, V::load(dr + j)));
                V::store(dk + j, V::fma(rj, ud, V::load(dk + j)));
                V::store(du + j, V::fma(V::mul(rj, kj), dyvv, V::load(du + j)));
                V::store(dv + j, V::fma(V::load(dy + j), rukv, V::load(dv + j)));
                V::store(dw + j, V::mul(V::load(dd + j), V::load(ddw + j)));
            }
            token_grad_out(nt, p->dr, batch, t, h, N, dr);
            token_grad_out(nt, p->dw, batch, t, h, N, dw);
            token_grad_out(nt, p->dk, batch, t, h, N, dk);
            token_grad_out(nt, p->dv, batch, t, h, N, dv);
        }
    }

    /* 3. */
    state_out_padded(p->dstate_in, s, h, N, Np, dS);
    for (int64_t j = 0; j < N; ++j) du_out[j] = du[j];
    V::stream_fence(); /* the gradients' non-temporal stores, before the item counts as done */
}

void backward_item6(const BackwardJob* job, int64_t item, float* scratch) noexcept {
    if (job->p->N % W != 0) {
        kRwkv6Op.backward_item(job, item, scratch);
        return;
    }
    switch (job->p->N) {
    case 32: backward_item6_nv<32 / W>(job, item, scratch); return;
    case 64: backward_item6_nv<64 / W>(job, item, scratch); return;
    case 128: backward_item6_nv<128 / W>(job, item, scratch); return;
    default: backward_item6_nv<0>(job, item, scratch); return; /* N a multiple of W */
    }
}

/* Puts this ISA's RWKV-6 functions into op (a copy of the scalar kRwkv6Op; its
 * backward_reduce, which sums the du partials, stays). */
inline void install_rwkv6(OpDesc* op) noexcept {
    op->forward_group = forward_group6;
    op->forward_chunk_floats = forward_chunk_floats6;
    op->forward_item = forward_item6;
    op->backward_sizes = backward_sizes6;
    op->backward_item = backward_item6;
    op->saves = saves6;
}
