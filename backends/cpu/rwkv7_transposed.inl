/* The RWKV-7 state walked on a transposed state. Included by rwkv7_simd.inl after step_rows;
 * used by the forward (with or without y, saving checkpoints or not) and by the backward's
 * checkpoint pass, for N = 32 / 64 / 128 and sequences of kTransposedMinLen tokens or more
 * (walk7). Two walks (NOTES.md, steps 43-44):
 *   - FUSED (the default): token by token, one pass over the state per token (step_fused7),
 *     which also sums the next token's u = S a from the state it has just written, so no sum
 *     runs across the lanes and the state is read once per token, where step_rows reads it
 *     twice and reduces every row horizontally twice.
 *   - BLOCKS (WKV_RWKV7_WALK=blocks): blocks of kBlock tokens in the chunked ("WY") form below;
 *     measured at parity with step_rows on two Xeons and on a Zen 4, so not the default.
 * WKV_RWKV7_WALK=rows keeps every sequence on step_rows (for measuring and testing it).
 *
 * LAYOUT. The state is kept transposed, St[j][i] = S[i][j] (key j's row of Np floats holds
 * every value row i), so a block's per-token vectors are the token rows as they come (v, and
 * what is computed from r, k, a, b and the decays) and each per-key factor is a broadcast.
 *
 * BLOCK MATH. Row i of S, s (over keys j), for tokens t = 1..C of a block, s_0 = the entry state:
 *     u_t = s_{t-1} . a_t        s_t = s_{t-1} o w_t + u_t b_t + v_t k_t        y_t = s_t . r_t
 * With P_t = w_1 o ... o w_t (elementwise, P_0 = 1) and the token vectors
 *     at_t = P_{t-1} o a_t     rt_t = P_t o r_t     bh_t = b_t / P_t     kh_t = k_t / P_t
 * the state is s_t = P_t o (s_0 + sum_{tau<=t} u_tau bh_tau + v_tau kh_tau), so
 *     u_t = s_0 . at_t + sum_{tau<t}  Aab[t][tau] u_tau + Aak[t][tau] v_tau
 *     y_t = s_0 . rt_t + sum_{tau<=t} Arb[t][tau] u_tau + Ark[t][tau] v_tau
 *     s_C = P_C o (s_0 + sum_tau u_tau bh_tau + v_tau kh_tau)
 * with Aab[t][tau] = at_t . bh_tau, Aak = at_t . kh_tau, Arb = rt_t . bh_tau, Ark = rt_t . kh_tau
 * (C x C dot products). For every row at once, vectors over i: X_t = s_0 . at_t and
 * Z_t = s_0 . rt_t are one pass over St (X = St^T [at], sums down the lanes); then
 * W_t = X_t + sum_{tau<t} Aak[t][tau] V_tau, U = L W with L = (I - Aab)^-1 (unit lower
 * triangular, solved once per block), Y_t = Z_t + sum_{tau<=t} Arb U_tau + Ark V_tau; and the
 * exit state is one more pass, St[j] = P_C[j] (St[j] + sum_tau bh_tau[j] U_tau + kh_tau[j] V_tau).
 * Per element and token that is 4 + 1/C vector FMAs (the step's 5), in passes that hold the
 * state slice in registers across 4 tokens or 4 keys.
 *
 * RANGE. bh and kh divide by P_t: a block whose running products leave [kBlockLo, kBlockHi]
 * (tiny or zero decays, non-finite decays) is walked token by token instead (step_fused7), so
 * such decays cost speed, never accuracy. Which tokens are walked which way depends only on
 * the inputs and the walk, so the forward, the saving forward and the backward's checkpoint
 * pass make the same states bit for bit. */

constexpr int kBlock = 8; /* C: tokens per block */
constexpr int64_t kTransposedMinLen = 2 * kBlock; /* shorter: step_rows (the transposes cost) */
constexpr float kBlockLo = 1e-20f, kBlockHi = 1e20f;
constexpr int kCC = kBlock * kBlock;
/* Value vectors per pass of step_fused7: its u, v, y and next-u vectors stay in registers, 4 CH
 * of them beside 5 broadcasts: CH = 4 on AVX-512's 32 registers (3% faster than 2 on a Zen 4),
 * 2 on AVX2's 16 and on NEON. */
constexpr int kFusedChunk = W == 16 ? 4 : 2;

/* Block scratch (Np floats per row): carve_rows7's 8 token rows; X and Z (kBlock rows each);
 * the C x C matrices Aab Aak Arb Ark L (kCC floats each); then per head of the group its
 * prepared rows A R B K Vr (kBlock rows each), P and a check row. */
constexpr int64_t kHeadRows = 5 * kBlock + 2;
inline int64_t block_scratch_floats(int64_t Np, int64_t G) noexcept {
    return (8 + 2 * kBlock) * Np + 5 * kCC + G * kHeadRows * Np;
}

struct Block7 { /* shared by the group's heads */
    Rows7 x;
    float *X, *Z;
    float *ab, *ak, *rb, *rk, *L;
    float* heads;
};
struct Head7 { /* one head's prepared block */
    float *A, *R, *B, *K, *Vr, *P, *bad;
};
inline Block7 carve_block7(float* s, int64_t Np) noexcept {
    Block7 b;
    b.x = carve_rows7(s, Np);
    b.X = s + 8 * Np;
    b.Z = b.X + kBlock * Np;
    float* q = b.Z + kBlock * Np;
    float** mats[] = {&b.ab, &b.ak, &b.rb, &b.rk, &b.L};
    for (float** m : mats) {
        *m = q;
        q += kCC;
    }
    b.heads = q;
    return b;
}
inline Head7 head_block7(const Block7& b, int64_t g, int64_t Np) noexcept {
    float* q = b.heads + g * kHeadRows * Np;
    Head7 h;
    float** rows[] = {&h.A, &h.R, &h.B, &h.K, &h.Vr};
    for (float** r : rows) {
        *r = q;
        q += kBlock * Np;
    }
    h.P = q;
    h.bad = q + Np;
    return h;
}

/* The next block's token rows of one head, fetched into L2 a few lines at a time while this
 * block's exit state is computed, so that the next block's preparation reads them from L2
 * rather than waiting on memory (NOTES.md, step 43). */
struct RowPrefetch {
    static constexpr int kMaxRows = 6 * kBlock;
    const char* row[kMaxRows];
    int rows = 0, line = 0, lines_per_row = 0, cur = 0;
    void add(const wkv_view& v, int64_t b, int64_t t, int64_t h, int64_t n) noexcept {
        if (!view_present(v) || rows == kMaxRows) return;
        row[rows++] = v.data + view_offset(v, b, t, h) * wkv_elem_size(v.elem);
        const int lines = (int)((n * wkv_elem_size(v.elem) * (v.stride[3] ? v.stride[3] : 1) + 63) / 64);
        if (lines > lines_per_row) lines_per_row = lines;
    }
    /* the next k lines */
    WKV_SIMD_INLINE void issue(int k) noexcept {
        for (; k > 0 && cur < rows; --k) {
            __builtin_prefetch(row[cur] + 64 * line, 0, 2);
            if (++line == lines_per_row) {
                line = 0;
                ++cur;
            }
        }
    }
    int total() const noexcept { return rows * lines_per_row; }
};

/* St = S^T for an Np x Np matrix in place, and dst = src^T (row strides Np), 4 x 4 tiles in
 * registers (Np is a multiple of 4): a checkpoint of the saving forward and the checkpoint pass
 * is one such copy every K7 tokens, which scalar copies made ~15% of the saving forward. */
WKV_SIMD_INLINE void transpose_tile4(const float* src, int64_t ss, float* dst, int64_t ds) noexcept {
    V::Q a = V::q_loadu(src), b = V::q_loadu(src + ss), c = V::q_loadu(src + 2 * ss),
         d = V::q_loadu(src + 3 * ss);
    V::q_transpose4(a, b, c, d);
    V::q_storeu(dst, a);
    V::q_storeu(dst + ds, b);
    V::q_storeu(dst + 2 * ds, c);
    V::q_storeu(dst + 3 * ds, d);
}
inline void transpose_copy(const float* src, float* dst, int64_t Np) noexcept {
    for (int64_t i = 0; i < Np; i += 4)
        for (int64_t j = 0; j < Np; j += 4) transpose_tile4(src + i * Np + j, Np, dst + j * Np + i, Np);
}
inline void transpose_in_place(float* m, int64_t Np) noexcept {
    alignas(16) float tile[16];
    for (int64_t i = 0; i < Np; i += 4) {
        float* d = m + i * Np + i; /* the diagonal tile, through tile */
        transpose_tile4(d, Np, tile, 4);
        for (int r = 0; r < 4; ++r) V::q_storeu(d + r * Np, V::q_loadu(tile + 4 * r));
        for (int64_t j = i + 4; j < Np; j += 4) { /* tiles (i, j) and (j, i) swapped */
            float* x = m + i * Np + j;
            float* y = m + j * Np + i;
            transpose_tile4(x, Np, tile, 4); /* x^T aside */
            transpose_tile4(y, Np, x, Np);   /* y^T into x */
            for (int r = 0; r < 4; ++r) V::q_storeu(y + r * Np, V::q_loadu(tile + 4 * r));
        }
    }
}

/* One token on the transposed state in a single pass, fused with the next token's u:
 * St[j] = St[j] w_j + b_j u + k_j v, then y += r_j St[j] (kY) and un += an_j St[j] (kN), value
 * vectors CH at a time (u, v, y and un of the CH vectors stay in registers across the keys); y
 * stored non-temporally when stream_y. un may be u (each CH-vector slice of u is read before
 * its slice of un is written). The keys are summed in transposed_product's order, so a u
 * carried from the previous token and one made afresh are the same bits. */
template <int NV, int CH, bool kY, bool kN>
__attribute__((noinline)) /* its own registers: inlined, GCC kept its row pointers on the stack */
void step_fused7(float* St, const float* __restrict decay, const float* __restrict k,
                 const float* __restrict v, const float* __restrict b, const float* __restrict r,
                 float* y, const float* u, const float* __restrict an, float* un,
                 bool stream_y = false) noexcept {
    constexpr int64_t Np = (int64_t)NV * W;
    static_assert(NV % CH == 0, "CH divides NV");
    for (int iv = 0; iv < NV; iv += CH) {
        const int64_t o = (int64_t)iv * W;
        T uu[CH], vv[CH], yy[CH], nn[CH];
#pragma GCC unroll 8
        for (int c = 0; c < CH; ++c) {
            uu[c] = V::load(u + o + c * W);
            vv[c] = V::load(v + o + c * W);
            yy[c] = nn[c] = V::zero();
        }
#pragma GCC unroll 2
        for (int64_t j = 0; j < Np; ++j) {
            float* sj = St + j * Np + o;
            const T wj = V::bcast_mem(decay + j), bj = V::bcast_mem(b + j), kj = V::bcast_mem(k + j);
            const T rj = kY ? V::bcast_mem(r + j) : V::zero();
            const T aj = kN ? V::bcast_mem(an + j) : V::zero();
#pragma GCC unroll 8
            for (int c = 0; c < CH; ++c) {
                const T x = V::fma(kj, vv[c], V::fma(bj, uu[c], V::mul(V::load(sj + c * W), wj)));
                V::store(sj + c * W, x);
                if (kY) yy[c] = V::fma(rj, x, yy[c]);
                if (kN) nn[c] = V::fma(aj, x, nn[c]);
            }
        }
#pragma GCC unroll 8
        for (int c = 0; c < CH; ++c) {
            if (kY && stream_y) V::stream(y + o + c * W, yy[c]);
            else if (kY) V::store(y + o + c * W, yy[c]);
            if (kN) V::store(un + o + c * W, nn[c]);
        }
    }
}

/* u = St^T a (one pass). */
template <int NV>
inline void transposed_product(const float* St, const float* __restrict a, float* u) noexcept {
    constexpr int64_t Np = (int64_t)NV * W;
    for (int iv = 0; iv < NV; iv += 2) {
        const int64_t o = (int64_t)iv * W;
        T u0 = V::zero(), u1 = V::zero();
        for (int64_t j = 0; j < Np; ++j) {
            const T aj = V::bcast_mem(a + j);
            u0 = V::fma(aj, V::load(St + j * Np + o), u0);
            u1 = V::fma(aj, V::load(St + j * Np + o + W), u1);
        }
        V::store(u + o, u0);
        V::store(u + o + W, u1);
    }
}

/* step_fused7 for token `in`, its variant picked at run time: y (NULL: none), the next token's
 * u from an into un (an NULL: none). */
template <int NV>
inline void step_fused7_any(float* St, const Inputs7& in, float* y, const float* u,
                            const float* an, float* un, bool stream_y) noexcept {
    constexpr int CH = kFusedChunk < NV ? kFusedChunk : NV;
    if (y && an)
        step_fused7<NV, CH, true, true>(St, in.decay, in.k, in.v, in.b, in.r, y, u, an, un, stream_y);
    else if (y)
        step_fused7<NV, CH, true, false>(St, in.decay, in.k, in.v, in.b, in.r, y, u, an, un, stream_y);
    else if (an)
        step_fused7<NV, CH, false, true>(St, in.decay, in.k, in.v, in.b, in.r, y, u, an, un);
    else
        step_fused7<NV, CH, false, false>(St, in.decay, in.k, in.v, in.b, in.r, y, u, an, un);
}

/* One token alone (u made afresh into u_row): the fallback of a block whose products left the
 * range, and the block walk's tail. */
template <int NV>
inline void step_alone7(float* St, const Inputs7& in, float* u_row, float* y) noexcept {
    transposed_product<NV>(St, in.a, u_row);
    step_fused7_any<NV>(St, in, y, u_row, nullptr, nullptr, false);
}

/* out[q] = St^T m[q] for the 4 token rows m[0..3] (rows Np apart) into out[0..3]. */
template <int NV>
WKV_SIMD_INLINE void block_products(const float* St, const float* m, float* out) noexcept {
    constexpr int64_t Np = (int64_t)NV * W;
    for (int iv = 0; iv < NV; iv += 2) {
        const int64_t o = (int64_t)iv * W;
        T c[4][2];
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) c[q][0] = c[q][1] = V::zero();
#pragma GCC unroll 4
        for (int64_t j = 0; j < Np; ++j) {
            const T s0 = V::load(St + j * Np + o), s1 = V::load(St + j * Np + o + W);
#pragma GCC unroll 4
            for (int q = 0; q < 4; ++q) {
                const T mj = V::bcast_mem(m + q * Np + j);
                c[q][0] = V::fma(mj, s0, c[q][0]);
                c[q][1] = V::fma(mj, s1, c[q][1]);
            }
        }
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) {
            V::store(out + q * Np + o, c[q][0]);
            V::store(out + q * Np + o + W, c[q][1]);
        }
    }
}

/* d[0..3] = x . y[q] for the rows y[q] (Np apart), into d. */
template <int NV>
WKV_SIMD_INLINE void dot4(const float* x, const float* y, float* d) noexcept {
    constexpr int64_t Np = (int64_t)NV * W;
    T c0 = V::zero(), c1 = V::zero(), c2 = V::zero(), c3 = V::zero();
#pragma GCC unroll 16
    for (int q = 0; q < NV; ++q) {
        const T xv = V::load(x + q * W);
        c0 = V::fma(xv, V::load(y + q * W), c0);
        c1 = V::fma(xv, V::load(y + Np + q * W), c1);
        c2 = V::fma(xv, V::load(y + 2 * Np + q * W), c2);
        c3 = V::fma(xv, V::load(y + 3 * Np + q * W), c3);
    }
    V::q_storeu(d, V::hsum4(c0, c1, c2, c3));
}

/* Token c of a block into head hd's prepared rows: at = P_{c-1} o a, P_c, rt = P_c o r (want_y),
 * bh = b / P_c, kh = k / P_c, v; the check row marks lanes whose P_c left the range. */
template <int NV>
WKV_SIMD_INLINE void prepare_token7(const Inputs7& in, int c, const Head7& hd, bool want_y) noexcept {
    constexpr int64_t Np = (int64_t)NV * W;
    const T one = V::set1(1.0f), lo = V::set1(kBlockLo), hi = V::set1(kBlockHi);
    float *A = hd.A + c * Np, *R = hd.R + c * Np, *B = hd.B + c * Np, *K = hd.K + c * Np,
          *Vr = hd.Vr + c * Np;
    T bad = c ? V::load(hd.bad) : V::zero();
#pragma GCC unroll 16
    for (int q = 0; q < NV; ++q) {
        const int64_t o = (int64_t)q * W;
        T pv = c ? V::load(hd.P + o) : one;
        V::store(A + o, V::mul(pv, V::load(in.a + o)));
        pv = V::mul(pv, V::load(in.decay + o));
        V::store(hd.P + o, pv);
        if (want_y) V::store(R + o, V::mul(pv, V::load(in.r + o)));
        const T inv = V::div(one, pv);
        V::store(B + o, V::mul(V::load(in.b + o), inv));
        V::store(K + o, V::mul(V::load(in.k + o), inv));
        V::store(Vr + o, V::load(in.v + o));
        bad = V::blend(V::ge(pv, lo), bad, one); /* false for NaN */
        bad = V::blend(V::gt(pv, hi), one, bad);
    }
    V::store(hd.bad, bad);
}

/* Head hd's prepared block applied to St (transposed, Np x Np), y into yrows (kBlock rows of
 * Np, NULL for none). False, with St untouched, when the block's products left the range. */
template <int NV>
bool advance_prepared7(float* St, const Head7& hd, const Block7& bk, float* yrows,
                       RowPrefetch& pf) noexcept {
    constexpr int64_t Np = (int64_t)NV * W;
    constexpr int C = kBlock;
    const bool want_y = yrows != nullptr;
    for (int l = 0; l < W; ++l)
        if (hd.bad[l] != 0.0f) return false;
    /* 1. the C x C dot products (row t: tau < t for Aab / Aak, tau <= t for Arb / Ark; the
     *    rest of each group of 4 is computed and never read) and L = (I - Aab)^-1 */
    for (int c = 0; c < C; ++c)
        for (int g = 0; g < C; g += 4) {
            if (g < c) {
                dot4<NV>(hd.A + c * Np, hd.B + g * Np, bk.ab + c * C + g);
                dot4<NV>(hd.A + c * Np, hd.K + g * Np, bk.ak + c * C + g);
            }
            if (want_y && g <= c) {
                dot4<NV>(hd.R + c * Np, hd.B + g * Np, bk.rb + c * C + g);
                dot4<NV>(hd.R + c * Np, hd.K + g * Np, bk.rk + c * C + g);
            }
        }
    float* L = bk.L;
    for (int c = 0; c < C; ++c) {
        for (int tau = 0; tau < c; ++tau) {
            float s = 0.0f;
            for (int m = tau; m < c; ++m) s += bk.ab[c * C + m] * (m == tau ? 1.0f : L[m * C + tau]);
            L[c * C + tau] = s;
        }
    }

    /* 2. X = St^T A (and Z = St^T R) */
    for (int g = 0; g < C; g += 4) {
        block_products<NV>(St, hd.A + g * Np, bk.X + g * Np);
        if (want_y) block_products<NV>(St, hd.R + g * Np, bk.Z + g * Np);
    }

    /* 3. per value vector: W = X + Aak V; U = L W (into X's rows); Y = Z + Arb U + Ark V */
#pragma GCC unroll 2
    for (int q = 0; q < NV; ++q) {
        const int64_t o = (int64_t)q * W;
        T u[C];
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) {
            T acc = V::load(bk.X + c * Np + o);
#pragma GCC unroll 8
            for (int tau = 0; tau < c; ++tau)
                acc = V::fma(V::bcast_mem(bk.ak + c * C + tau), V::load(hd.Vr + tau * Np + o), acc);
            u[c] = acc;
        }
#pragma GCC unroll 8
        for (int c = C - 1; c > 0; --c) { /* in place, from the last: u[tau < c] still W */
            T acc = u[c];
#pragma GCC unroll 8
            for (int tau = 0; tau < c; ++tau) acc = V::fma(V::bcast_mem(L + c * C + tau), u[tau], acc);
            u[c] = acc;
        }
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) V::store(bk.X + c * Np + o, u[c]);
        if (want_y) {
#pragma GCC unroll 8
            for (int c = 0; c < C; ++c) {
                T acc = V::load(bk.Z + c * Np + o);
#pragma GCC unroll 8
                for (int tau = 0; tau <= c; ++tau) {
                    acc = V::fma(V::bcast_mem(bk.rb + c * C + tau), u[tau], acc);
                    acc = V::fma(V::bcast_mem(bk.rk + c * C + tau), V::load(hd.Vr + tau * Np + o), acc);
                }
                V::store(yrows + c * Np + o, acc);
            }
        }
    }

    /* 4. the exit state: St[j] = P_C[j] (St[j] + sum_tau B[tau][j] U_tau + K[tau][j] V_tau),
     *    4 keys by 2 value vectors at a time, the next block's rows fetched meanwhile */
    constexpr int kTiles = (int)(Np / 4) * (NV / 2);
    const int per_tile = (pf.total() + kTiles - 1) / kTiles;
    for (int64_t j = 0; j < Np; j += 4) {
        for (int iv = 0; iv < NV; iv += 2) {
            pf.issue(per_tile);
            const int64_t o = (int64_t)iv * W;
            T s[4][2];
#pragma GCC unroll 4
            for (int q = 0; q < 4; ++q) {
                s[q][0] = V::load(St + (j + q) * Np + o);
                s[q][1] = V::load(St + (j + q) * Np + o + W);
            }
#pragma GCC unroll 8
            for (int tau = 0; tau < C; ++tau) {
                const T u0 = V::load(bk.X + tau * Np + o), u1 = V::load(bk.X + tau * Np + o + W);
#pragma GCC unroll 4
                for (int q = 0; q < 4; ++q) {
                    const T bj = V::bcast_mem(hd.B + tau * Np + j + q);
                    s[q][0] = V::fma(bj, u0, s[q][0]);
                    s[q][1] = V::fma(bj, u1, s[q][1]);
                }
            }
#pragma GCC unroll 8
            for (int tau = 0; tau < C; ++tau) {
                const T v0 = V::load(hd.Vr + tau * Np + o), v1 = V::load(hd.Vr + tau * Np + o + W);
#pragma GCC unroll 4
                for (int q = 0; q < 4; ++q) {
                    const T kj = V::bcast_mem(hd.K + tau * Np + j + q);
                    s[q][0] = V::fma(kj, v0, s[q][0]);
                    s[q][1] = V::fma(kj, v1, s[q][1]);
                }
            }
#pragma GCC unroll 4
            for (int q = 0; q < 4; ++q) {
                const T pj = V::bcast_mem(hd.P + j + q);
                V::store(St + (j + q) * Np + o, V::mul(s[q][0], pj));
                V::store(St + (j + q) * Np + o + W, V::mul(s[q][1], pj));
            }
        }
    }
    return true;
}

/* Tokens t .. t + kBlock - 1 of the nh heads h0.. of sequence row `batch`, head g's state at
 * St0 + g Np^2 (transposed): the rows read token-major over the group (each token's rows of
 * the group adjacent in the tensors), then each head's block; a head whose block left the
 * range is stepped token by token. y of head g into ys + g kBlock Np (ys NULL: none). t_end:
 * the end of the walk (the next block, if whole, is prefetched). bs:
 * block_scratch_floats(Np, nh). */
template <int NV>
void advance_group7(float* St0, int64_t nh, const wkv_problem* p, int64_t batch, int64_t t,
                    int64_t t_end, int64_t h0, float* bs, float* ys) noexcept {
    constexpr int64_t Np = (int64_t)NV * W;
    const bool want_y = ys != nullptr;
    const Block7 bk = carve_block7(bs, Np);
    for (int c = 0; c < kBlock; ++c)
        for (int64_t g = 0; g < nh; ++g) {
            const Inputs7 in = load_inputs7(p, batch, t + c, h0 + g, Np, want_y, bk.x, nullptr);
            prepare_token7<NV>(in, c, head_block7(bk, g, Np), want_y);
        }
    for (int64_t g = 0; g < nh; ++g) {
        float* St = St0 + g * Np * Np;
        float* y = want_y ? ys + g * kBlock * Np : nullptr;
        RowPrefetch pf;
        if (t + 2 * kBlock <= t_end) {
            const wkv_view* views[] = {&p->r, &p->w, &p->k, &p->v, &p->a, &p->b};
            for (int c = 0; c < kBlock; ++c)
                for (const wkv_view* v : views)
                    if (want_y || v != &p->r) pf.add(*v, batch, t + kBlock + c, h0 + g, p->N);
        }
        if (advance_prepared7<NV>(St, head_block7(bk, g, Np), bk, y, pf)) continue;
        for (int c = 0; c < kBlock; ++c) { /* token by token, the rows read again */
            const Inputs7 in = load_inputs7(p, batch, t + c, h0 + g, Np, want_y, bk.x, nullptr);
            step_alone7<NV>(St, in, bk.X, want_y ? y + c * Np : nullptr);
        }
    }
}

/* Which walk: WKV_RWKV7_WALK = fused (the default), blocks or rows, read once per process. */
enum class Walk7 { rows, fused, blocks };
inline Walk7 walk_setting7() noexcept {
    static const Walk7 w = [] {
        const char* e = std::getenv("WKV_RWKV7_WALK");
        if (e && std::strcmp(e, "rows") == 0) return Walk7::rows;
        if (e && std::strcmp(e, "blocks") == 0) return Walk7::blocks;
        return Walk7::fused;
    }();
    return w;
}
/* The walk of an item of len tokens (NV: N = 32, 64 or 128; 0, another N: rows). The forward,
 * the saving forward and the checkpoint pass decide alike. */
template <int NV>
inline Walk7 walk7(int64_t len) noexcept {
    if (NV == 0 || NV % 2 != 0 || len < kTransposedMinLen) return Walk7::rows;
    return walk_setting7();
}

/* Scratch of a transposed walk over a group of G heads (floats): the fused walk's carve_rows7
 * rows and per head its u and next-a rows, or the block walk's block_scratch_floats. */
inline int64_t walk_scratch_floats(Walk7 walk, int64_t Np, int64_t G) noexcept {
    return walk == Walk7::blocks ? block_scratch_floats(Np, G) : (8 + 2 * G) * Np;
}

/* Tokens [t, t_end) of the nh heads h0.. of sequence row `batch` on their transposed states
 * (head g's at St0 + g Np^2), token by token, token-major over the group; y out to p->y
 * (want_y; streamed: stream_y). t_last: the item's last token + 1 (the walk sums u for token
 * t_end when t_end < t_last); u_ready: the previous walk on these states left u for token t in
 * the u rows. ws: walk_scratch_floats(fused, Np, nh). */
template <int NV>
void walk_fused7(float* St0, int64_t nh, const wkv_problem* p, int64_t batch, int64_t t,
                 int64_t t_end, int64_t t_last, int64_t h0, float* ws, bool want_y, bool stream_y,
                 bool u_ready) noexcept {
    constexpr int64_t Np = (int64_t)NV * W;
    const int64_t N = p->N;
    const Rows7 x = carve_rows7(ws, Np);
    float* const rows = ws + 8 * Np; /* head g: u at rows + 2 g Np, next a after it */
    for (int64_t g = 0; g < nh && !u_ready; ++g)
        transposed_product<NV>(St0 + g * Np * Np,
                               token_in(p->a, batch, t, h0 + g, N, Np, rows + (2 * g + 1) * Np),
                               rows + 2 * g * Np);
    for (; t < t_end; ++t) {
        const bool next = t + 1 < t_last;
        for (int64_t g = 0; g < nh; ++g) {
            float* St = St0 + g * Np * Np;
            float* u = rows + 2 * g * Np;
            const Inputs7 in = load_inputs7(p, batch, t, h0 + g, Np, want_y, x, nullptr, false);
            const float* an = next ? token_in(p->a, batch, t + 1, h0 + g, N, Np, u + Np) : nullptr;
            float* yd = want_y ? token_out_direct(p->y, batch, t, h0 + g, N, Np) : nullptr;
            float* y = yd ? yd : x.y; /* y straight into the tensor where it is float32 rows */
            const bool st = yd && stream_y && vector_aligned(yd); /* streams need aligned rows */
            step_fused7_any<NV>(St, in, want_y ? y : nullptr, u, an, u, st);
            if (want_y && !yd) token_grad_out(stream_y, p->y, batch, t, h0 + g, N, x.y);
        }
    }
}

/* Tokens [t, t_end) in blocks (advance_group7), the last (t_end - t) % kBlock one at a time;
 * y of the group as walk_fused7. ys: the group's y rows of a block (nh kBlock Np floats). */
template <int NV>
void walk_blocks7(float* St0, int64_t nh, const wkv_problem* p, int64_t batch, int64_t t,
                  int64_t t_end, int64_t t_last, int64_t h0, float* bs, float* ys, bool want_y,
                  bool stream_y) noexcept {
    constexpr int64_t Np = (int64_t)NV * W;
    const int64_t N = p->N;
    for (; t + kBlock <= t_end; t += kBlock) {
        advance_group7<NV>(St0, nh, p, batch, t, t_last, h0, bs, want_y ? ys : nullptr);
        if (want_y)
            for (int c = 0; c < kBlock; ++c)
                for (int64_t g = 0; g < nh; ++g)
                    token_grad_out(stream_y, p->y, batch, t + c, h0 + g, N, ys + (g * kBlock + c) * Np);
    }
    const Block7 bk = carve_block7(bs, Np);
    for (; t < t_end; ++t)
        for (int64_t g = 0; g < nh; ++g) {
            const Inputs7 in = load_inputs7(p, batch, t, h0 + g, Np, want_y, bk.x, nullptr);
            step_alone7<NV>(St0 + g * Np * Np, in, bk.X, want_y ? bk.x.y : nullptr);
            if (want_y) token_grad_out(stream_y, p->y, batch, t, h0 + g, N, bk.x.y);
        }
}

/* Tokens [t, t_end) of the group by `walk` (fused or blocks); ws: walk_scratch_floats(walk, Np,
 * nh) floats, then (blocks, want_y) the y rows. */
template <int NV>
void walk_transposed7(Walk7 walk, float* St0, int64_t nh, const wkv_problem* p, int64_t batch,
                      int64_t t, int64_t t_end, int64_t t_last, int64_t h0, float* ws, bool want_y,
                      bool stream_y, bool u_ready) noexcept {
    if (walk == Walk7::fused)
        walk_fused7<NV>(St0, nh, p, batch, t, t_end, t_last, h0, ws, want_y, stream_y, u_ready);
    else
        walk_blocks7<NV>(St0, nh, p, batch, t, t_end, t_last, h0, ws,
                         ws + walk_scratch_floats(walk, (int64_t)NV * W, nh), want_y, stream_y);
}

/* forward_item7 for an item whose walk7 is not rows: the group's states transposed into
 * scratch, walked a segment of K7 tokens at a time when saving checkpoints (the same walk as
 * the checkpoint pass's), else all at once. */
template <int NV>
void forward_item7_transposed(Walk7 walk, const wkv_problem* p, int64_t G, int64_t item,
                              float* scratch, const BackwardJob* save) noexcept {
    constexpr int64_t Np = (int64_t)NV * W;
    constexpr int64_t n2 = Np * Np;
    const int64_t H = p->H, N = p->N;
    const int64_t groups = (H + G - 1) / G;
    const int64_t s = item / groups, h0 = item % groups * G;
    const int64_t nh = h0 + G < H ? G : H - h0;
    int64_t batch, t0, t1;
    wkv_problem_sequence(p, s, &batch, &t0, &t1);
    const int64_t len = t1 - t0, nseg = segment_count(len, K7);

    float* ck[kMaxGroup];
    for (int64_t g = 0; g < nh; ++g) {
        float* St = scratch + g * n2;
        const int64_t h = h0 + g;
        ck[g] = save ? save->ckpt + ((size_t)save->first_segment(s) * (size_t)H +
                                     (size_t)h * (size_t)nseg) * (size_t)n2
                     : nullptr;
        if (ck[g]) {
            state_in_padded(p->state_in, s, h, N, Np, ck[g]); /* as the checkpoint pass does */
            transpose_copy(ck[g], St, Np);
        } else {
            state_in_padded(p->state_in, s, h, N, Np, St);
            transpose_in_place(St, Np);
        }
    }

    const bool want_y = view_present(p->y);
    const bool stream_y = stream_gradients(p); /* y as large as a gradient that is streamed */
    float* ws = scratch + G * n2;
    const int64_t step = save ? K7 : len;
    for (int64_t t = t0; t < t1; t += step) {
        const int64_t t_end = t + step < t1 ? t + step : t1;
        walk_transposed7<NV>(walk, scratch, nh, p, batch, t, t_end, t1, h0, ws, want_y, stream_y,
                             t > t0);
        if (save && t_end < t1)
            for (int64_t g = 0; g < nh; ++g)
                transpose_copy(scratch + g * n2, ck[g] + ((t_end - t0) / K7) * n2, Np);
    }
    for (int64_t g = 0; g < nh; ++g) {
        float* St = scratch + g * n2;
        transpose_in_place(St, Np);
        state_out_padded(p->state_out, s, h0 + g, N, Np, St);
    }
    V::stream_fence(); /* y's non-temporal stores, before the item counts as done */
}
