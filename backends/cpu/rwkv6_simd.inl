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

/* One forward token over the kRows6 rows [ib, ib + kRows6): src -> dst (may be the same; row
 * strides srs, drs). kY: also their y (into y + ib, with ruk4's u term). */
template <int NV, bool kY>
WKV_SIMD_INLINE void step6_block(const float* src, int64_t srs, float* dst, int64_t drs, int nv,
                                 int64_t ib, const float* __restrict decay,
                                 const float* __restrict k, const float* __restrict v,
                                 const float* __restrict r, V::Q ruk4, float* y) noexcept {
    const float* sp[kRows6];
    float* dp[kRows6];
#pragma GCC unroll 16
    for (int u = 0; u < kRows6; ++u) {
        sp[u] = src + (ib + u) * srs;
        dp[u] = dst + (ib + u) * drs;
    }
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
        V::q_storeu(y + ib, V::q_fma(V::q_loadu(v + ib), ruk4, V::hsum4(yc[0], yc[1], yc[2], yc[3])));
}

/* One forward token over the rows [0, Np): src -> dst (may be the same). kY: also y. */
template <int NV, bool kY>
inline void step6_rows(const float* src, int64_t srs, float* dst, int64_t drs, int nv_rt,
                       int64_t Np, const float* __restrict decay, const float* __restrict k,
                       const float* __restrict v, const float* __restrict r, float ruk,
                       float* y) noexcept {
    const int nv = NV ? NV : nv_rt;
    const V::Q ruk4 = V::q_set1(ruk);
    for (int64_t ib = 0; ib < Np; ib += kRows6)
        step6_block<NV, kY>(src, srs, dst, drs, nv, ib, decay, k, v, r, ruk4, y);
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
    for (int64_t t = t0; t < t1; ++t) {
        const bool last = t + 1 == t1;
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

/* ----------------------------------------------------------------------------- backward
 * rwkv6.cpp's checkpoint + replay scheme (K = 32; N a multiple of W), with these changes, as in
 * rwkv7_simd.inl's backward:
 *   - an item is a group of up to kBackwardGroup6 heads of a sequence (backward_group6), whose
 *     input rows are read token-major, all the group's heads of a token together: in the
 *     checkpoint pass as in the forward (each head stepping in place), and for each segment into
 *     the token records of every head of the group (converted, with decay and d decay / d w,
 *     made once per token for the replay and the sweep), before the heads replay and sweep it
 *     one after the other; the gradients go to the records too and are written token-major
 *     after the last head (NOTES.md, step 30);
 *   - the sweep is one pass per kRows6 rows (dv, dk, dd, dr sums and dS = dS decay + dy r^T):
 *     6 vector ops per element;
 *   - head j's sweep and head j + 1's replay run together, block of rows by block of rows, the
 *     replay writing each state into the slot the sweep has just read (backward6_rows' kReplay;
 *     NOTES.md, step 48).
 * Workspace (floats), with G = the group, R = min(K, max_s L_s) - 1 (0 if that is < 0):
 *   checkpoints = H * (sum_s ceil(L_s / K)) * N^2     (as rwkv6.cpp's)
 *   du partials = num_seqs * H * N                    (as rwkv6.cpp's)
 *   chunk       = (G + R) * N^2 + G * (R + 1) * kTokRows6 * N + 2 * G * N
 *                 (the group's dS, R replay states, G (R + 1) token records, u and du rows). */
/* record rows: r k v dy decay ddw dr dw (w before the decay, dd before dw) dk dv */
constexpr int64_t kTokRows6 = 10;
/* the replay beside the sweep where vectors have 32 registers (AVX-512): 7-11% faster there;
 * on AVX2 (16 registers) 12% slower, so there each head replays alone (NOTES.md, step 48) */
constexpr bool kReplayBesideSweep6 = W >= 16;
/* 8 heads: head 0's replay, the one beside no sweep, is an eighth of the replays (NOTES.md,
 * step 48; the chunk ~1.2 MiB at f32 N = 64) */
constexpr int64_t kBackwardGroup6 = 8;

/* Another head's replay step, run beside a sweep (backward6_rows' kReplay): src -> dst with
 * that head's token rows; dst may be the sweep's Sp. */
struct Replay6 {
    const float* src;
    float* dst;
    const float *decay, *k, *v;
};

/* One backward step over the rows of dS (row stride Np): on entry the gradient w.r.t. S_t, on
 * exit w.r.t. S_{t-1} (Sp, row stride Np). Writes dv (per row, without the ruk term) and the
 * sums over rows dk, dd, dr (without the u terms); see rwkv6.cpp.
 * kReplay: after each block of rows, the replay step rp (step6_rows' arithmetic) of the same
 * rows, which the sweep has then read for the last time: rp.dst may be Sp, whose lines the
 * sweep has just brought into L1, so the replay's stores need no fetch from L2 (as RWKV-7's
 * sweep_replay_rows; NOTES.md, steps 37 and 48). */
template <int NV, bool kReplay = false>
inline void backward6_rows(float* dS, const float* Sp, int nv_rt, int64_t Np,
                           const float* __restrict r, const float* __restrict k,
                           const float* __restrict v, const float* __restrict decay,
                           const float* __restrict dy, float* __restrict dr,
                           float* __restrict dk, float* __restrict dv,
                           float* __restrict dd, const Replay6* rp = nullptr) noexcept {
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
        if (kReplay) /* the other head's replay of these rows, into the slot just read */
            step6_block<NV, false>(rp->src, Np, rp->dst, Np, nv, ib, rp->decay, rp->k, rp->v,
                                   nullptr, V::q_set1(0.0f), nullptr);
    }
}

int64_t backward_group6(const wkv_problem* p, int64_t threads) {
    if (p->N % W != 0) return 1; /* rwkv6.cpp's scalar backward: one head per item */
    return backward_head_group(p, threads, kBackwardGroup6);
}

BackwardSizes backward_sizes6(const wkv_problem* p, const BackwardShape& shape, CheckedSize& c) {
    if (p->N % W != 0) return kRwkv6Op.backward_sizes(p, shape, c);
    const uint64_t N = (uint64_t)p->N, H = (uint64_t)p->H, G = (uint64_t)shape.group;
    const int64_t max_len = shape.max_len;
    BackwardSizes z;
    z.replay_states = max_len < 1 ? 0 : (max_len < K6 ? max_len : K6) - 1;
    const uint64_t R = (uint64_t)z.replay_states;
    z.ckpt_floats = c.mul(c.mul(H, shape.segments), c.mul(N, N));
    z.part_floats = c.mul(c.mul((uint64_t)p->num_seqs, H), N); /* per (sequence, head) */
    z.chunk_floats = c.add(c.add(c.mul(c.add(G, R), c.mul(N, N)),
                                 c.mul(c.mul(c.mul(G, R + 1), (uint64_t)kTokRows6), N)),
                           c.mul(2 * G, N));
    return z;
}

/* One token's record (kTokRows6 rows of Np, the order of the comment above). */
struct Tok6 {
    float *r, *k, *v, *dy, *decay, *ddw, *dr, *dw, *dk, *dv;
};

inline Tok6 record6(float* rows, int64_t Np) noexcept {
    Tok6 x;
    x.r = rows;
    x.k = rows + Np;
    x.v = rows + 2 * Np;
    x.dy = rows + 3 * Np;
    x.decay = rows + 4 * Np;
    x.ddw = rows + 5 * Np;
    x.dr = rows + 6 * Np;
    x.dw = rows + 7 * Np;
    x.dk = rows + 8 * Np;
    x.dv = rows + 9 * Np;
    return x;
}

/* Token t's rows of head h into the record at `rows`: r k v dy converted (or copied: inline
 * vector copies), w into the dw row, then decay and ddw from it. */
inline void load_tok6(const wkv_problem* p, int64_t batch, int64_t t, int64_t h, int64_t Np,
                      float* rows) noexcept {
    const int64_t N = p->N;
    const Tok6 x = record6(rows, Np);
    auto in = [&](const wkv_view& v, float* buf) {
        const float* src = token_in(v, batch, t, h, N, Np, buf);
        if (src != buf)
            for (int64_t j = 0; j < Np; j += W) V::store(buf + j, V::load(src + j));
    };
    in(p->r, x.r);
    in(p->k, x.k);
    in(p->v, x.v);
    in(p->dy, x.dy);
    decay_rows(p->decay_form, token_in(p->w, batch, t, h, N, Np, x.dw), x.decay, x.ddw, Np);
}

template <int NV>
void backward_item6_nv(const BackwardJob* job, int64_t item, float* scratch) noexcept {
    const wkv_problem* p = job->p;
    const int64_t H = p->H, N = p->N, Np = padded(N); /* Np = N here */
    const int nv = (int)(Np / W);
    const size_t n2 = (size_t)(Np * Np);
    const int64_t G = job->layout.group, groups = (H + G - 1) / G;
    const int64_t s = item / groups, h0 = item % groups * G;
    const int64_t nh = h0 + G < H ? G : H - h0;
    int64_t batch, t0, t1;
    wkv_problem_sequence(p, s, &batch, &t0, &t1);
    const int64_t len = t1 - t0;
    const int64_t R = job->layout.replay_states, nrec = R + 1; /* records per head */

    float* dSs = scratch;                       /* G states */
    float* replay = dSs + (size_t)G * n2;       /* R states */
    float* recs = replay + (size_t)R * n2;      /* G * nrec records */
    float* urows = recs + (size_t)(G * nrec * kTokRows6 * Np);
    float* dus = urows + (size_t)(G * Np);
    const size_t rec_floats = (size_t)(kTokRows6 * Np);
    auto rec = [&](int64_t j, int64_t u) { return recs + (size_t)(j * nrec + u) * rec_floats; };
    auto du_out = [&](int64_t j) { return job->part + (size_t)(s * H + h0 + j) * (size_t)N; };

    if (len == 0) { /* nothing flows through but the state gradient */
        for (int64_t j = 0; j < nh; ++j) {
            for (int64_t i = 0; i < N; ++i) du_out(j)[i] = 0.0f;
            if (view_present(p->dstate_in)) {
                state_in_padded(p->dstate_out, s, h0 + j, N, Np, dSs);
                state_out_padded(p->dstate_in, s, h0 + j, N, Np, dSs);
            }
        }
        return;
    }
    const float* u[kBackwardGroup6];
    for (int64_t j = 0; j < nh; ++j) {
        u[j] = token_in(p->u, 0, 0, h0 + j, N, Np, urows + j * Np);
        for (int64_t i = 0; i < Np; i += W) V::store(dus + j * Np + i, V::zero());
    }

    const int64_t nseg = segment_count(len, K6);
    const int64_t seg0 = job->first_segment(s);
    const bool nt = stream_gradients(p);
    auto ck = [&](int64_t j, int64_t g) {
        return job->ckpt + ((size_t)seg0 * (size_t)H + (size_t)(h0 + j) * (size_t)nseg + (size_t)g) * n2;
    };

    /* 1. checkpoints: ck(j, g) = head j's state before token t0 + g K, token-major over the
     *    group (each head steps in place in replay[j]; nseg > 1 means R = K - 1 >= G) */
    const int64_t pass = p->reuse_checkpoints ? 0 : nseg; /* reuse: the forward saved them */
    for (int64_t j = 0; j < nh && pass; ++j) state_in_padded(p->state_in, s, h0 + j, N, Np, ck(j, 0));
    for (int64_t g = 0; g + 1 < pass; ++g) {
        for (int64_t q = 0; q < K6; ++q) {
            const int64_t t = t0 + g * K6 + q;
            for (int64_t j = 0; j < nh; ++j) {
                const Tok6 x = record6(rec(0, 0), Np); /* its rows as buffers */
                const int64_t h = h0 + j;
                const float* k = token_in(p->k, batch, t, h, N, Np, x.k);
                const float* v = token_in(p->v, batch, t, h, N, Np, x.v);
                decay_rows(p->decay_form, token_in(p->w, batch, t, h, N, Np, x.dw), x.decay,
                           nullptr, Np);
                const float* src = q == 0 ? ck(j, g) : replay + (size_t)j * n2;
                float* dst = q + 1 == K6 ? ck(j, g + 1) : replay + (size_t)j * n2;
                step6_rows<NV, false>(src, Np, dst, Np, nv, Np, x.decay, k, v, nullptr, 0.0f,
                                      nullptr);
            }
        }
    }

    /* 2. segments in reverse: the group's records (token-major), then per head replay and
     *    sweep backward, then the gradients (token-major) */
    for (int64_t j = 0; j < nh; ++j)
        state_in_padded(p->dstate_out, s, h0 + j, N, Np, dSs + (size_t)j * n2);
    for (int64_t g = nseg - 1; g >= 0; --g) {
        const int64_t ts = t0 + g * K6;
        const int64_t m = t1 - ts < K6 ? t1 - ts : K6;
        for (int64_t q = 0; q < m; ++q) {
            for (int64_t j = 0; j < nh; ++j) load_tok6(p, batch, ts + q, h0 + j, Np, rec(j, q));
        }
        /* Head j's S_q (the state after token ts + q, q <= m - 2) is in replay slot(j, q).
         * Head j's sweep and head j + 1's replay run together: sweep step k (token m - 1 - k)
         * reads S_{m-2-k} of head j, and replay step k writes S_k of head j + 1 into that
         * same slot right behind it, so the maps alternate: even heads q, odd heads m - 2 - q
         * (as RWKV-7's, NOTES.md, step 37). Head 0's replay runs alone (every head's where
         * !kReplayBesideSweep6). */
        auto slot = [&](int64_t j, int64_t q) {
            return replay + (size_t)(!kReplayBesideSweep6 || j % 2 == 0 ? q : m - 2 - q) * n2;
        };
        for (int64_t j = 0; j < nh; ++j) {
            const float* start = ck(j, g);
            float* dS = dSs + (size_t)j * n2;
            float* du = dus + j * Np;
            for (int64_t q = 0; q + 1 < m && (j == 0 || !kReplayBesideSweep6); ++q) {
                const Tok6 x = record6(rec(j, q), Np); /* the states after ts .. ts + m - 2 */
                step6_rows<NV, false>(q == 0 ? start : slot(j, q - 1), Np, slot(j, q), Np, nv,
                                      Np, x.decay, x.k, x.v, nullptr, 0.0f, nullptr);
            }
            for (int64_t q = m - 1; q >= 0; --q) {
                const Tok6 x = record6(rec(j, q), Np);
                const float* Sp = q == 0 ? start : slot(j, q - 1); /* S_{t-1} */
                const int64_t k = m - 1 - q; /* the sweep's step; head j + 1's replay step */
                float dyv_out[4];
                {
                    T acc = V::zero();
                    for (int64_t i = 0; i < Np; i += W)
                        acc = V::fma(V::load(x.dy + i), V::load(x.v + i), acc);
                    V::q_storeu(dyv_out, V::hsum4(acc, V::zero(), V::zero(), V::zero()));
                }
                const float dyv = dyv_out[0];
                const float ruk = dot3(x.r, u[j], x.k, Np);
                /* dd into the dw row (its w is spent), then dw = dd ddw in place */
                if (kReplayBesideSweep6 && j + 1 < nh && k + 1 < m) {
                    const Tok6 n = record6(rec(j + 1, k), Np);
                    const Replay6 rp = {k == 0 ? ck(j + 1, g) : slot(j + 1, k - 1), slot(j + 1, k),
                                        n.decay, n.k, n.v};
                    backward6_rows<NV, true>(dS, Sp, nv, Np, x.r, x.k, x.v, x.decay, x.dy, x.dr,
                                             x.dk, x.dv, x.dw, &rp);
                } else {
                    backward6_rows<NV>(dS, Sp, nv, Np, x.r, x.k, x.v, x.decay, x.dy, x.dr, x.dk,
                                       x.dv, x.dw);
                }
                const T dyvv = V::set1(dyv), rukv = V::set1(ruk);
                for (int64_t i = 0; i < Np; i += W) {
                    const T uj = V::load(u[j] + i), kj = V::load(x.k + i), rj = V::load(x.r + i);
                    const T ud = V::mul(uj, dyvv);
                    V::store(x.dr + i, V::fma(kj, ud, V::load(x.dr + i)));
                    V::store(x.dk + i, V::fma(rj, ud, V::load(x.dk + i)));
                    V::store(du + i, V::fma(V::mul(rj, kj), dyvv, V::load(du + i)));
                    V::store(x.dv + i, V::fma(V::load(x.dy + i), rukv, V::load(x.dv + i)));
                    V::store(x.dw + i, V::mul(V::load(x.dw + i), V::load(x.ddw + i)));
                }
            }
        }
        for (int64_t q = 0; q < m; ++q) {
            const int64_t t = ts + q;
            for (int64_t j = 0; j < nh; ++j) {
                const Tok6 x = record6(rec(j, q), Np);
                const int64_t h = h0 + j;
                token_grad_out(nt, p->dr, batch, t, h, N, x.dr);
                token_grad_out(nt, p->dw, batch, t, h, N, x.dw);
                token_grad_out(nt, p->dk, batch, t, h, N, x.dk);
                token_grad_out(nt, p->dv, batch, t, h, N, x.dv);
            }
        }
    }

    /* 3. */
    for (int64_t j = 0; j < nh; ++j) {
        state_out_padded(p->dstate_in, s, h0 + j, N, Np, dSs + (size_t)j * n2);
        for (int64_t i = 0; i < N; ++i) du_out(j)[i] = dus[j * Np + i];
    }
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
    op->backward_group = backward_group6;
    op->backward_sizes = backward_sizes6;
    op->backward_item = backward_item6;
    op->saves = saves6;
}
