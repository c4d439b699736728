/* RWKV-4 vector kernels, written against the traits V (see simd_avx2.inl); included by
 * cpu_<isa>.cpp after simd_common.inl. rwkv4.cpp's recurrence, its (aa, bb, ph + pl) state and
 * its every branch, in W channels at once: each branch becomes a blend of both sides, each of
 * its three exps per token (e1, e2, and A or Bk) a vexp.
 *
 * FORWARD: one item walks a run of channel blocks of a sequence (forward_group4: as many as
 * leave an item per thread), token by token, so that each token's rows of the run are one
 * contiguous read. Channels past C in the last vector are padded (k = v = u = w = 0 and the
 * empty state, which stay finite). Scratch per chunk: 10 * Cp floats (Cp: the run's channels
 * rounded up to W): the state (4 rows) and w u wd k v y.
 *
 * BACKWARD: rwkv4.cpp's items (sequence, run of up to 16 channel blocks), workspace and
 * reduction, the run walked token by token (each token's rows of the run one contiguous read:
 * NOTES.md, step 28); only where C is a multiple of W (every block is then whole vectors);
 * other C run the scalar backward, so the workspace formula is the same on every path. */

constexpr int64_t K4 = kRwkv4CheckpointInterval;
constexpr int64_t CB4 = kRwkv4ChannelBlock;
constexpr float kEmptyPP4 = -1e38f;
constexpr int64_t kStateRows4 = 4; /* a checkpoint block: aa bb ph pl rows */

/* s + e = a + b exactly (TwoSum), e = 0 where s is not finite */
WKV_SIMD_INLINE void two_sum4(T a, T b, T* s, T* e) noexcept {
    const T sum = V::add(a, b);
    const T bv = V::sub(sum, a);
    const T err = V::add(V::sub(a, V::sub(sum, bv)), V::sub(b, bv));
    *s = sum;
    *e = V::blend(V::finite(sum), err, V::zero());
}

/* rwkv4.cpp's Token, for W channels */
struct Token4 {
    T e1, e2, inv, y, A, Bk, qh, ql, side;
};

template <bool kY>
WKV_SIMD_INLINE Token4 token4(T a, T b, T ph, T pl, T kk, T vv, T uu, T wdd) noexcept {
    Token4 o;
    const T one = V::set1(1.0f);
    if (kY) {
        T wh, wl;
        two_sum4(uu, kk, &wh, &wl);
        const T q = V::blend(V::ge(ph, wh), ph, wh);
        o.e1 = vexp(V::add(V::sub(ph, q), pl));
        o.e2 = vexp(V::add(V::sub(wh, q), wl));
        o.inv = V::div(one, V::add(V::mul(o.e1, b), o.e2));
        o.y = V::mul(V::add(V::mul(o.e1, a), V::mul(o.e2, vv)), o.inv);
    }
    T sh, sl;
    two_sum4(ph, wdd, &sh, &sl);
    const T lo = V::add(sl, pl);
    const M fin = V::finite(sh);
    const T hi = V::blend(fin, V::add(sh, lo), sh);
    const T rl = V::blend(fin, V::sub(lo, V::sub(hi, sh)), V::zero());
    o.side = V::add(V::sub(hi, kk), rl);
    const M up = V::ge(o.side, V::zero()); /* q2 = pp + wd */
    const T E = vexp(V::blend(up, V::sub(V::sub(kk, hi), rl), V::add(V::sub(hi, kk), rl)));
    o.qh = V::blend(up, hi, kk);
    o.ql = V::blend(up, rl, V::zero());
    o.A = V::blend(up, one, E);
    o.Bk = V::blend(up, E, one);
    return o;
}

/* One forward token over n channels (a multiple of W): state rows st (aa bb ph pl, row stride
 * ld), in place. */
template <bool kY>
inline void step4(float* st, int64_t ld, int64_t n, const float* u, const float* wd,
                  const float* k, const float* v, float* y) noexcept {
    for (int64_t c = 0; c < n; c += W) {
        const T a = V::load(st + c), b = V::load(st + ld + c);
        const T ph = V::load(st + 2 * ld + c), pl = V::load(st + 3 * ld + c);
        const T vv = V::load(v + c);
        const Token4 o = token4<kY>(a, b, ph, pl, V::load(k + c), vv, V::load(u + c),
                                    V::load(wd + c));
        if (kY) V::store(y + c, o.y);
        V::store(st + c, V::fma(o.A, a, V::mul(o.Bk, vv)));
        V::store(st + ld + c, V::fma(o.A, b, o.Bk));
        V::store(st + 2 * ld + c, o.qh);
        V::store(st + 3 * ld + c, o.ql);
    }
}

/* Element offsets of channel c0 (rwkv4.cpp's token_off, param_off, state_off). */
inline int64_t token_off4(const wkv_view& x, int64_t batch, int64_t t, int64_t c0) noexcept {
    return view_offset(x, batch, t, 0) + c0 * x.stride[3];
}
inline int64_t param_off4(const wkv_view& x, int64_t c0) noexcept { return c0 * x.stride[3]; }
inline int64_t state_off4(const wkv_view& x, int64_t s, int64_t part, int64_t c0) noexcept {
    return s * x.stride[0] + part * x.stride[1] + c0 * x.stride[3];
}

/* The state of slot s, channels [c0, c0 + n), into rows of ld (n <= np <= ld, zero/empty-padded
 * to np): from the view, or empty when absent. */
inline void load_state4v(const wkv_view& x, int64_t s, int64_t c0, int64_t n, int64_t np,
                         int64_t ld, float* st) noexcept {
    for (int64_t part = 0; part < 3; ++part) {
        float* row = st + part * ld;
        if (view_present(x)) load_row(x, state_off4(x, s, part, c0), n, row);
        for (int64_t c = view_present(x) ? n : 0; c < np; ++c) row[c] = part == 2 ? kEmptyPP4 : 0.0f;
    }
    for (int64_t c = 0; c < np; ++c) st[3 * ld + c] = 0.0f;
}

inline void store_state4v(const wkv_view& x, int64_t s, int64_t c0, int64_t n, int64_t ld,
                          const float* st) noexcept {
    if (!view_present(x)) return;
    for (int64_t part = 0; part < 3; ++part)
        store_row(x, state_off4(x, s, part, c0), n, st + part * ld);
}

/* w, u of channels [c0, c0 + n), zero-padded to np, and wd = -exp(w). */
inline void load_params4(const wkv_problem* p, int64_t c0, int64_t n, int64_t np, float* w,
                         float* u, float* wd) noexcept {
    const float* wp = row_in(p->w, param_off4(p->w, c0), n, np, w);
    if (wp != w) std::memcpy(w, wp, sizeof(float) * (size_t)np);
    const float* up = row_in(p->u, param_off4(p->u, c0), n, np, u);
    if (up != u) std::memcpy(u, up, sizeof(float) * (size_t)np);
    for (int64_t c = 0; c < np; c += W) V::store(wd + c, V::neg(vexp(V::load(w + c))));
}

/* Channel blocks per forward item: all of a sequence's, or a share of them when there are
 * fewer sequences than threads. */
constexpr int64_t kMaxBlocks4 = 256; /* 8192 channels: 320 KiB of scratch */
int64_t forward_group4(const wkv_problem* p, int64_t threads) {
    const int64_t nb = (p->N + CB4 - 1) / CB4;
    const int64_t seqs = p->num_seqs > 0 ? p->num_seqs : 1;
    const int64_t per_seq = (threads + seqs - 1) / seqs;
    int64_t g = per_seq > 1 ? (nb + per_seq - 1) / per_seq : nb;
    if (g > kMaxBlocks4) g = kMaxBlocks4;
    return g < 1 ? 1 : g;
}

uint64_t forward_chunk_floats4(const wkv_problem* p, int64_t group, CheckedSize& c) {
    const uint64_t run = c.mul((uint64_t)group, (uint64_t)CB4);
    const uint64_t n = run < (uint64_t)p->N ? run : (uint64_t)p->N;
    return c.mul(10, (uint64_t)padded((int64_t)n));
}

/* save: copies the run's state (rows of ld) into the backward's checkpoint q of each channel
 * block of the run (rwkv4.cpp's layout: per block, 4 rows of its n channels). */
inline void save_state4(const BackwardJob* save, int64_t s, int64_t len, int64_t c0, int64_t n,
                        int64_t ld, const float* st, int64_t q) noexcept {
    const int64_t C = save->p->N, nseg = segment_count(len, K4);
    float* base = save->ckpt + (size_t)save->first_segment(s) * (size_t)(kStateRows4 * C);
    for (int64_t b0 = 0; b0 < n; b0 += CB4) {
        const int64_t bn = CB4 < n - b0 ? CB4 : n - b0;
        float* ck = base + (size_t)nseg * (size_t)(kStateRows4 * (c0 + b0)) +
                    (size_t)q * (size_t)(kStateRows4 * bn);
        for (int64_t part = 0; part < kStateRows4; ++part)
            std::memcpy(ck + part * bn, st + part * ld + b0, sizeof(float) * (size_t)bn);
    }
}

void forward_item4(const wkv_problem* p, int64_t group, int64_t item, float* scratch,
                   const BackwardJob* save) noexcept {
    const int64_t C = p->N, nb = (C + CB4 - 1) / CB4;
    const int64_t items = (nb + group - 1) / group;
    const int64_t s = item / items, c0 = (item % items) * group * CB4;
    const int64_t c1 = c0 + group * CB4 < C ? c0 + group * CB4 : C;
    const int64_t n = c1 - c0, np = padded(n);
    const int64_t ld = padded(group * CB4 < C ? group * CB4 : C); /* the chunk's row length */
    int64_t batch, t0, t1;
    wkv_problem_sequence(p, s, &batch, &t0, &t1);

    float* st = scratch; /* aa bb ph pl */
    float* w = scratch + 4 * ld;
    float* u = w + ld;
    float* wd = u + ld;
    float* kb = wd + ld;
    float* vb = kb + ld;
    float* y = vb + ld;

    /* Read the whole state first: state_out may be the same memory. */
    load_state4v(p->state_in, s, c0, n, np, ld, st);
    load_params4(p, c0, n, np, w, u, wd);
    const bool want_y = view_present(p->y);
    if (save && t1 > t0) save_state4(save, s, t1 - t0, c0, n, ld, st, 0);
    for (int64_t t = t0; t < t1; ++t) {
        const float* k = row_in(p->k, token_off4(p->k, batch, t, c0), n, np, kb);
        const float* v = row_in(p->v, token_off4(p->v, batch, t, c0), n, np, vb);
        if (want_y) {
            step4<true>(st, ld, np, u, wd, k, v, y);
            row_out(p->y, token_off4(p->y, batch, t, c0), n, y);
        } else {
            step4<false>(st, ld, np, u, wd, k, v, nullptr);
        }
        if (save && (t + 1 - t0) % K4 == 0 && t + 1 < t1)
            save_state4(save, s, t1 - t0, c0, n, ld, st, (t + 1 - t0) / K4);
    }
    store_state4v(p->state_out, s, c0, n, ld, st);
}

/* -------------------------------------------------------------------------------- backward */

/* rwkv4.cpp's backward_step for n channels (a multiple of W); S: the state before the token
 * (rows of ld). */
inline void backward_step4(const float* S, int64_t ld, int64_t n, const float* u,
                           const float* wd, const float* k, const float* v, const float* dy,
                           float* gaa, float* gbb, float* gpp, float* dk, float* dv, float* dwd,
                           float* du) noexcept {
    const T half = V::set1(0.5f);
    for (int64_t c = 0; c < n; c += W) {
        const T a = V::load(S + c), b = V::load(S + ld + c);
        const T ph = V::load(S + 2 * ld + c), pl = V::load(S + 3 * ld + c);
        const T vv = V::load(v + c);
        const Token4 o =
            token4<true>(a, b, ph, pl, V::load(k + c), vv, V::load(u + c), V::load(wd + c));
        /* through y */
        const T g = V::mul(V::load(dy + c), o.inv);
        const T ge1 = V::mul(g, o.e1), ge2 = V::mul(g, o.e2);
        const T dk_y = V::mul(ge2, V::sub(vv, o.y));
        T ga = ge1;
        T gb = V::neg(V::mul(V::mul(g, o.y), o.e1));
        T gp = V::mul(ge1, V::sub(a, V::mul(o.y, b)));
        T dkt = dk_y, dvt = ge2, dwt = V::zero();
        /* through the update */
        const T na = V::load(gaa + c), nb = V::load(gbb + c), np = V::load(gpp + c);
        const T dA = V::add(V::mul(na, a), V::mul(nb, b));
        const T dB = V::add(V::mul(na, vv), nb);
        const T dAA = V::mul(dA, o.A);
        const T dq2 = V::sub(V::sub(np, dAA), V::mul(dB, o.Bk));
        ga = V::add(ga, V::mul(na, o.A));
        gb = V::add(gb, V::mul(nb, o.A));
        gp = V::add(gp, dAA);
        dwt = V::add(dwt, dAA);
        dvt = V::add(dvt, V::mul(na, o.Bk));
        dkt = V::add(dkt, V::mul(dB, o.Bk));
        /* dq2 to pp + wd (side > 0), to k (side < 0), half to each on a tie */
        const M up = V::gt(o.side, V::zero()), down = V::lt(o.side, V::zero());
        const T hq = V::mul(half, dq2);
        const T to_p = V::blend(up, dq2, V::blend(down, V::zero(), hq));
        const T to_k = V::blend(down, dq2, V::blend(up, V::zero(), hq));
        gp = V::add(gp, to_p);
        dwt = V::add(dwt, to_p);
        dkt = V::add(dkt, to_k);
        V::store(gaa + c, ga);
        V::store(gbb + c, gb);
        V::store(gpp + c, gp);
        V::store(dk + c, dkt);
        V::store(dv + c, dvt);
        V::store(dwd + c, V::add(V::load(dwd + c), dwt));
        V::store(du + c, V::add(V::load(du + c), dk_y));
    }
}


/* A checkpoint of the run [c0, c0 + n) (save_state4's per-block layout) into rows of ld. */
inline void load_ckpt4(const BackwardJob* job, int64_t s, int64_t len, int64_t c0, int64_t n,
                       int64_t ld, float* st, int64_t q) noexcept {
    const int64_t C = job->p->N, nseg = segment_count(len, K4);
    const float* base = job->ckpt + (size_t)job->first_segment(s) * (size_t)(kStateRows4 * C);
    for (int64_t b0 = 0; b0 < n; b0 += CB4) {
        const int64_t bn = CB4 < n - b0 ? CB4 : n - b0;
        const float* ck = base + (size_t)nseg * (size_t)(kStateRows4 * (c0 + b0)) +
                          (size_t)q * (size_t)(kStateRows4 * bn);
        for (int64_t part = 0; part < kStateRows4; ++part)
            std::memcpy(st + part * ld + b0, ck + part * bn, sizeof(float) * (size_t)bn);
    }
}

/* An item: a run of BG channel blocks of a sequence (rwkv4.cpp's backward_group), walked token
 * by token; every channel sees rwkv4.cpp's per-block vector steps in the same order. */
void backward_item4_vec(const BackwardJob* job, int64_t item, float* scratch) noexcept {
    const wkv_problem* p = job->p;
    const int64_t C = p->N, nb = (C + CB4 - 1) / CB4, bg = job->layout.group;
    const int64_t per_seq = (nb + bg - 1) / bg;
    const int64_t Wm = bg * CB4 < C ? bg * CB4 : C; /* the chunk's row length */
    const int64_t s = item / per_seq, c0 = (item % per_seq) * bg * CB4;
    const int64_t n = Wm < C - c0 ? Wm : C - c0; /* a multiple of W */
    int64_t batch, t0, t1;
    wkv_problem_sequence(p, s, &batch, &t0, &t1);
    const int64_t len = t1 - t0;
    const size_t sz = (size_t)(kStateRows4 * n); /* one state: 4 rows of n */

    /* rwkv4.cpp's chunk: R state slots (slot 0 a segment's start, slot q + 1 the state after
     * its token q), then rows w u wd k v dy dk dv gaa gbb gpp */
    float* slots = scratch;
    float* rows = slots + (size_t)job->layout.replay_states * (size_t)(kStateRows4 * Wm);
    float* w = rows;
    float* u = rows + Wm;
    float* wd = rows + 2 * Wm;
    float* kb = rows + 3 * Wm;
    float* vb = rows + 4 * Wm;
    float* dyb = rows + 5 * Wm;
    float* dk = rows + 6 * Wm;
    float* dv = rows + 7 * Wm;
    float* gs = rows + 8 * Wm; /* gaa gbb gpp: rows of n */
    float* gaa = gs;
    float* gbb = gs + n;
    float* gpp = gs + 2 * n;
    float* dwd = job->part + (size_t)(2 * s) * (size_t)C + (size_t)c0;
    float* du = job->part + (size_t)(2 * s + 1) * (size_t)C + (size_t)c0;

    for (int64_t c = 0; c < n; ++c) {
        dwd[c] = 0.0f;
        du[c] = 0.0f;
    }
    auto load_grads = [&](const wkv_view& x) {
        for (int64_t part = 0; part < 3; ++part) {
            if (view_present(x))
                load_row(x, state_off4(x, s, part, c0), n, gs + part * n);
            else
                for (int64_t c = 0; c < n; ++c) gs[part * n + c] = 0.0f;
        }
    };
    if (len == 0) { /* nothing flows through but the state gradient */
        if (view_present(p->dstate_in)) {
            load_grads(p->dstate_out);
            store_state4v(p->dstate_in, s, c0, n, n, gs);
        }
        return;
    }
    load_params4(p, c0, n, n, w, u, wd);

    const int64_t nseg = segment_count(len, K4);
    const bool nt = stream_gradients(p);

    auto load_kv = [&](int64_t t, const float** k, const float** v) {
        *k = row_in(p->k, token_off4(p->k, batch, t, c0), n, n, kb);
        *v = row_in(p->v, token_off4(p->v, batch, t, c0), n, n, vb);
    };

    /* 1. checkpoints: the state before token t0 + g K, into the blocks' checkpoints (as the
     * saving forward does); reuse: the forward saved them. Slot 0 carries the state. */
    if (!p->reuse_checkpoints) {
        load_state4v(p->state_in, s, c0, n, n, n, slots);
        save_state4(job, s, len, c0, n, n, slots, 0);
        const int64_t tl = t0 + (nseg - 1) * K4; /* the last segment's first token */
        for (int64_t t = t0; t < tl; ++t) {
            const float *k, *v;
            load_kv(t, &k, &v);
            step4<false>(slots, n, n, u, wd, k, v, nullptr);
            if ((t + 1 - t0) % K4 == 0) save_state4(job, s, len, c0, n, n, slots, (t + 1 - t0) / K4);
        }
    }

    /* 2. segments in reverse: replay, then sweep backward */
    load_grads(p->dstate_out);
    for (int64_t g = nseg - 1; g >= 0; --g) {
        const int64_t ts = t0 + g * K4;
        const int64_t m = t1 - ts < K4 ? t1 - ts : K4;
        load_ckpt4(job, s, len, c0, n, n, slots, g);
        /* slot q + 1 = the state after token ts + q, q < m - 1 */
        for (int64_t q = 0; q + 1 < m; ++q) {
            float* dst = slots + (size_t)(q + 1) * sz;
            std::memcpy(dst, slots + (size_t)q * sz, sz * sizeof(float));
            const float *k, *v;
            load_kv(ts + q, &k, &v);
            step4<false>(dst, n, n, u, wd, k, v, nullptr);
        }
        for (int64_t q = m - 1; q >= 0; --q) {
            const int64_t t = ts + q;
            const float* S = slots + (size_t)q * sz;
            const float *k, *v;
            load_kv(t, &k, &v);
            const float* dy = row_in(p->dy, token_off4(p->dy, batch, t, c0), n, n, dyb);
            backward_step4(S, n, n, u, wd, k, v, dy, gaa, gbb, gpp, dk, dv, dwd, du);
            grad_out(nt, p->dk, token_off4(p->dk, batch, t, c0), n, dk);
            grad_out(nt, p->dv, token_off4(p->dv, batch, t, c0), n, dv);
        }
    }

    /* 3. */
    store_state4v(p->dstate_in, s, c0, n, n, gs);
    V::stream_fence(); /* the gradients' non-temporal stores, before the item counts as done */
}

void backward_item4(const BackwardJob* job, int64_t item, float* scratch) noexcept {
    if (job->p->N % W != 0) {
        kRwkv4Op.backward_item(job, item, scratch);
        return;
    }
    backward_item4_vec(job, item, scratch);
}

/* Puts this ISA's RWKV-4 functions into op (a copy of the scalar kRwkv4Op: its workspace sizes
 * and its reduction stay). */
/* The forward's step4 is the checkpoint pass's, channel by channel, where the backward is this
 * file's (C a multiple of W); rwkv4.cpp's scalar backward has other roundings. */
bool saves4(const wkv_problem* p) { return p->N % W == 0; }

inline void install_rwkv4(OpDesc* op) noexcept {
    op->saves = saves4;
    op->forward_group = forward_group4;
    op->forward_chunk_floats = forward_chunk_floats4;
    op->forward_item = forward_item4;
    op->backward_item = backward_item4;
}
