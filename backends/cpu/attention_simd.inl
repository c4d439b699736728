/* The vector form of attention.cpp's block step (AttnBlockFn), against the traits V: compiled
 * once per path in cpu_<isa>.cpp. Rows are padded in scratch (attention.cpp): a row of q, of v and
 * of the accumulator is Dp floats (a multiple of 16) with zeros after D, a transposed key block is D rows of Bc
 * (a multiple of W) keys.
 *
 * Per pair of query rows: the scores against the block's keys with the accumulators in
 * registers (one broadcast of q[r][d] per key vector: Bc / W FMAs per row and d, the key vectors
 * loaded once for both rows), the masked lanes set to -inf, the running max, p = vexp(s - m),
 * then acc = acc * exp(m_old - m) + sum_j p_j v_j, D in chunks of 4 vectors so the chunk's
 * accumulators stay in registers across the block's keys. */

/* Query rows per group: their score accumulators (rows x Bc / W vectors) and, in the P V
 * product, their accumulators for 4 vectors of D (rows x 4) fit the register file: 4 rows on
 * 32 registers of 16 floats, 2 on 16 registers of 8. */
constexpr int kAttnRows = W >= 16 ? 4 : 2;

/* 0, 1, ..., W - 1: the lane numbers, to mask a block's keys past a row's last */
WKV_SIMD_INLINE T attn_iota() {
    alignas(64) static const float lanes[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    return V::load(lanes);
}

WKV_SIMD_INLINE float attn_hsum(const T* x, int n) {
    T s = x[0];
    for (int i = 1; i < n; ++i) s = V::add(s, x[i]);
    alignas(64) float t[W];
    V::store(t, s);
    float r = 0.0f;
    for (int i = 0; i < W; ++i) r += t[i];
    return r;
}

/* Rows [0, rows) of the tile against nb keys (nb <= bc): see AttnBlockFn in attention.h. The
 * scores come from scores(r0, nr, s): s[i][c] = the scaled scores of row r0 + i (i < nr) against
 * keys c W .. c W + W - 1 (the float32 products below, or bf16 dot products: attn_block_bf16). */
template <int BCV, class Scores>
WKV_SIMD_INLINE void attn_block_core(const Scores& scores, int64_t rows, int64_t Dp, const float* vb, int64_t nb,
                                     const int64_t* seen, float* p_rows, float* acc, float* m, float* l) {
    constexpr int64_t bc = (int64_t)BCV * W;
    const T neg_inf = V::set1(-__builtin_inff());
    for (int64_t r0 = 0; r0 < rows; r0 += kAttnRows) {
        const int nr = rows - r0 < kAttnRows ? (int)(rows - r0) : kAttnRows;
        T s[kAttnRows][BCV];
        scores(r0, nr, s);
        /* The group's softmax step, the rows side by side: mask, the block maxima of all rows
         * in one hmax4, the rescale factors in one vexp, p = exp(s - max) into p_rows, the
         * block sums in one hsum4. Rows past nr and rows that see no key are all -inf: with
         * their max taken as 0 their p is exactly 0 and their corr exp(-inf) = 0 (their
         * accumulator is still 0 then), so no row needs a branch of its own. */
        int64_t keys = 0; /* the group's widest n_seen: the P V product's keys */
        for (int i = 0; i < kAttnRows; ++i) {
            const int64_t n_seen = i >= nr ? 0 : seen[r0 + i] < nb ? seen[r0 + i] : nb;
            keys = n_seen > keys ? n_seen : keys;
            if (n_seen >= bc) continue;
            const T limit = V::set1((float)n_seen);
            for (int c = 0; c < BCV; ++c) { /* lanes at or past n_seen: -inf */
                if ((int64_t)c * W + W <= n_seen) continue;
                /* a blend, not an add: a stale key column may hold anything, even NaN */
                s[i][c] = V::blend(V::lt(V::add(attn_iota(), V::set1((float)(c * W))), limit), s[i][c], neg_inf);
            }
        }
        T red[4];
        for (int i = 0; i < 4; ++i) {
            const int ii = i < kAttnRows ? i : kAttnRows - 1;
            red[i] = s[ii][0];
            for (int c = 1; c < BCV; ++c) red[i] = V::max(red[i], s[ii][c]);
        }
        alignas(64) float mx[W > 4 ? W : 4] = {}, corr[W > 4 ? W : 4] = {};
        bool live[kAttnRows]; /* the row has seen a finite score: its max is real */
        V::q_store(mx, V::hmax4(red[0], red[1], red[2], red[3]));
        for (int i = 0; i < kAttnRows; ++i) {
            const float m_old = i < nr ? m[r0 + i] : -__builtin_inff();
            mx[i] = std::max(m_old, mx[i]);
            live[i] = mx[i] != -__builtin_inff();
            if (!live[i]) mx[i] = 0.0f;
            corr[i] = m_old - mx[i];
        }
        {
            T cv = V::load(corr);
            vexp_n<1>(&cv);
            V::store(corr, cv);
        }
        for (int i = 0; i < kAttnRows; ++i) {
            const T mxv = V::set1(mx[i]);
            T pv[BCV];
            for (int c = 0; c < BCV; ++c) pv[c] = V::sub(s[i][c], mxv);
            vexp_n<BCV>(pv); /* exp(-inf) is exactly 0: masked lanes add nothing below */
            float* pr = p_rows + i * bc;
            for (int c = 0; c < BCV; ++c) V::store(pr + c * W, pv[c]);
            red[i] = pv[0];
            for (int c = 1; c < BCV; ++c) red[i] = V::add(red[i], pv[c]);
        }
        for (int i = kAttnRows; i < 4; ++i) red[i] = V::zero();
        alignas(64) float sum[4];
        V::q_store(sum, V::hsum4(red[0], red[1], red[2], red[3]));
        for (int i = 0; i < nr; ++i) {
            const int64_t r = r0 + i;
            l[r] = l[r] * corr[i] + sum[i];
            if (live[i]) m[r] = mx[i];
        }
        if (keys == 0) continue;
        /* acc = acc * corr + P V for the group's rows, 4 vectors of D at a time, each V row
         * loaded once for every row of the group */
        for (int64_t d0 = 0; d0 < Dp; d0 += 4 * W) {
            const int nv = Dp - d0 >= 4 * W ? 4 : (int)((Dp - d0) / W);
            T a[kAttnRows][4];
            for (int i = 0; i < kAttnRows; ++i) {
                const T cv = V::set1(i < nr ? corr[i] : 0.0f);
                for (int u = 0; u < 4; ++u)
                    a[i][u] = i < nr && u < nv ? V::mul(V::load(acc + (r0 + i) * Dp + d0 + u * W), cv) : V::zero();
            }
            for (int64_t j = 0; j < keys; ++j) {
                const float* vj = vb + j * Dp + d0;
                T vv[4];
                for (int u = 0; u < 4; ++u) vv[u] = u < nv ? V::load(vj + u * W) : V::zero();
                for (int i = 0; i < kAttnRows; ++i) {
                    if (i >= nr) break;
                    const T pj = V::set1(p_rows[i * bc + j]);
                    for (int u = 0; u < 4; ++u)
                        if (u < nv) a[i][u] = V::fma(pj, vv[u], a[i][u]);
                }
            }
            for (int i = 0; i < kAttnRows; ++i) {
                if (i >= nr) break;
                for (int u = 0; u < 4; ++u)
                    if (u < nv) V::store(acc + (r0 + i) * Dp + d0 + u * W, a[i][u]);
            }
        }
    }
}

/* The float32 scores: q scaled, the keys transposed (AttnBlockFn). */
template <int BCV>
void attn_block_bcv(const float* q, int64_t rows, int64_t Dp, int64_t D, const float* kt, int64_t kt_stride,
                    const float* vb, int64_t nb, const int64_t* seen, float* p_rows, float* acc, float* m, float* l) {
    const auto scores = [&](int64_t r0, int nr, T (*s)[BCV]) {
        for (int i = 0; i < kAttnRows; ++i)
            for (int c = 0; c < BCV; ++c) s[i][c] = V::zero();
        for (int64_t d = 0; d < D; ++d) {
            const float* kd = kt + d * kt_stride;
            T kv[BCV];
            for (int c = 0; c < BCV; ++c) kv[c] = V::load(kd + c * W);
            for (int i = 0; i < kAttnRows; ++i) {
                if (i >= nr) break;
                const T qd = V::set1(q[(r0 + i) * Dp + d]);
                for (int c = 0; c < BCV; ++c) s[i][c] = V::fma(qd, kv[c], s[i][c]);
            }
        }
    };
    attn_block_core<BCV>(scores, rows, Dp, vb, nb, seen, p_rows, acc, m, l);
}

#if defined(WKV_ATTN_BF16_DOT)
/* Its own target: AVX-512 BF16 on top of the path's (install_avx512 checks the CPU has it). A
 * functor, not a lambda: clang gives a lambda's body no target of the enclosing function's. */
#define WKV_ATTN_BF16_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))

/* The bf16 scores (AttnBlockBf16Fn): per pair of d, one vdpbf16ps adds both products of 16 keys
 * (exact products, float32 sums), so Q K^T takes half the instructions of the float32 form;
 * then the scale. */
template <int BCV>
struct AttnBf16Scores {
    const uint32_t* qp;
    int64_t Dh;
    const uint32_t* ktp;
    int64_t kt_stride;
    float scale;
    WKV_ATTN_BF16_TARGET void operator()(int64_t r0, int nr, T (*s)[BCV]) const {
        for (int i = 0; i < kAttnRows; ++i)
            for (int c = 0; c < BCV; ++c) s[i][c] = V::zero();
        for (int64_t d = 0; d < Dh; ++d) {
            const uint32_t* kd = ktp + d * kt_stride;
            __m512bh kv[BCV];
            for (int c = 0; c < BCV; ++c) kv[c] = (__m512bh)_mm512_loadu_si512(kd + c * W);
            for (int i = 0; i < kAttnRows; ++i) {
                if (i >= nr) break;
                const __m512bh qd = (__m512bh)_mm512_set1_epi32((int)qp[(r0 + i) * Dh + d]);
                for (int c = 0; c < BCV; ++c) s[i][c] = _mm512_dpbf16_ps(s[i][c], qd, kv[c]);
            }
        }
        const T sc = V::set1(scale);
        for (int i = 0; i < kAttnRows; ++i)
            for (int c = 0; c < BCV; ++c) s[i][c] = V::mul(s[i][c], sc);
    }
};

template <int BCV>
WKV_ATTN_BF16_TARGET void attn_block_bf16_bcv(const uint32_t* qp, int64_t rows, int64_t Dh, int64_t Dp,
                                              const uint32_t* ktp, int64_t kt_stride, const float* vb, int64_t nb,
                                              const int64_t* seen, float scale, float* p_rows, float* acc, float* m,
                                              float* l) {
    const AttnBf16Scores<BCV> scores{qp, Dh, ktp, kt_stride, scale};
    attn_block_core<BCV>(scores, rows, Dp, vb, nb, seen, p_rows, acc, m, l);
}

/* AttnBlockBf16Fn: false for a block size it has no kernel for (the caller converts to float32). */
WKV_ATTN_BF16_TARGET bool attn_block_bf16(
    const uint32_t* qp, int64_t rows, int64_t Dh, int64_t Dp, const uint32_t* ktp, int64_t kt_stride, const float* vb,
    int64_t nb, int64_t bc, const int64_t* seen, float scale, float* p_rows, float* acc, float* m, float* l) {
    if (bc == 64 && Dp % W == 0)
        attn_block_bf16_bcv<64 / W>(qp, rows, Dh, Dp, ktp, kt_stride, vb, nb, seen, scale, p_rows, acc, m, l);
    else if (bc == 128 && Dp % W == 0)
        attn_block_bf16_bcv<128 / W>(qp, rows, Dh, Dp, ktp, kt_stride, vb, nb, seen, scale, p_rows, acc, m, l);
    else
        return false;
    return true;
}
#endif

/* AttnBlockFn: false for a block size this path has no kernel for (the scalar step runs). */
bool attn_block(const float* q, int64_t rows, int64_t Dp, int64_t D, const float* kt, int64_t kt_stride,
                const float* vb, int64_t nb, int64_t bc, const int64_t* seen, float* p_rows, float* acc, float* m,
                float* l) {
    if (bc == 64 && Dp % W == 0)
        attn_block_bcv<64 / W>(q, rows, Dp, D, kt, kt_stride, vb, nb, seen, p_rows, acc, m, l);
    else if (bc == 128 && Dp % W == 0)
        attn_block_bcv<128 / W>(q, rows, Dp, D, kt, kt_stride, vb, nb, seen, p_rows, acc, m, l);
    else
        return false;
    return true;
}

/* AttnRowsFn (attention.h): the keys as rows, for tiles of a row or two. Per row: the scores
 * four keys at a time (q in registers, one accumulator per key, the four horizontal sums in one
 * transpose-and-add, V::hsum4), the
 * running max, p = vexp(s - m) over the block, acc = acc * corr + sum_j p_j v_j with the row's
 * accumulator in registers. D a multiple of W (no tail; only D floats of a key are read). */
bool attn_rows(const float* q, int64_t rows, int64_t Dp, int64_t D, const float* kb, int64_t k_stride,
               const float* vb, int64_t v_stride, int64_t nb, const int64_t* seen, float* p_rows, float* acc,
               float* m, float* l) {
    constexpr int kMaxV = 256 / W;
    if (D % W || D > 256) return false;
    const int nv = (int)(D / W);
    const float neg_inf = -__builtin_inff();
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t n_seen = seen[r] < nb ? seen[r] : nb;
        if (n_seen <= 0) continue;
        T qv[kMaxV];
        for (int c = 0; c < nv; ++c) qv[c] = V::load(q + r * Dp + c * W);
        int64_t j = 0;
        for (; j + 4 <= n_seen; j += 4) {
            const float* k0 = kb + j * k_stride;
            T s0 = V::zero(), s1 = V::zero(), s2 = V::zero(), s3 = V::zero();
            for (int c = 0; c < nv; ++c) {
                s0 = V::fma(qv[c], V::load(k0 + c * W), s0);
                s1 = V::fma(qv[c], V::load(k0 + k_stride + c * W), s1);
                s2 = V::fma(qv[c], V::load(k0 + 2 * k_stride + c * W), s2);
                s3 = V::fma(qv[c], V::load(k0 + 3 * k_stride + c * W), s3);
            }
            V::q_storeu(p_rows + j, V::hsum4(s0, s1, s2, s3)); /* the four sums in registers */
        }
        for (; j < n_seen; ++j) {
            T s0 = V::zero();
            for (int c = 0; c < nv; ++c) s0 = V::fma(qv[c], V::load(kb + j * k_stride + c * W), s0);
            float four[4];
            V::q_storeu(four, V::hsum4(s0, V::zero(), V::zero(), V::zero()));
            p_rows[j] = four[0];
        }
        float mx = m[r];
        for (j = 0; j < n_seen; ++j) mx = p_rows[j] > mx ? p_rows[j] : mx;
        if (mx == neg_inf) continue; /* only -inf scores so far: m stays -inf, nothing NaN */
        const float corr = m[r] == neg_inf ? 0.0f : std::exp(m[r] - mx);
        const int64_t nvec = (n_seen + W - 1) / W;
        for (j = n_seen; j < nvec * W; ++j) p_rows[j] = neg_inf; /* exp gives exactly 0 there */
        const T mxv = V::set1(mx);
        T sum = V::zero();
        for (int64_t c = 0; c < nvec; ++c) {
            const T e = vexp(V::sub(V::load(p_rows + c * W), mxv));
            V::store(p_rows + c * W, e);
            sum = V::add(sum, e);
        }
        l[r] = l[r] * corr + attn_hsum(&sum, 1);
        m[r] = mx;
        T a[kMaxV];
        const T cv = V::set1(corr);
        for (int c = 0; c < nv; ++c) a[c] = V::mul(V::load(acc + r * Dp + c * W), cv);
        for (j = 0; j < n_seen; ++j) {
            const T pj = V::set1(p_rows[j]);
            const float* vj = vb + j * v_stride;
            for (int c = 0; c < nv; ++c) a[c] = V::fma(pj, V::load(vj + c * W), a[c]);
        }
        for (int c = 0; c < nv; ++c) V::store(acc + r * Dp + c * W, a[c]);
    }
    return true;
}

/* ---- the backward's steps (AttnBwdProbsFn, AttnBwdKvFn, AttnBwdQFn in attention.h)
 *
 * probs: per group of rows, the scores against the block's transposed keys and dout . v against
 * its transposed values with the accumulators in registers (as the forward's block step), the
 * masked lanes to -inf, p = vexp(s - lse), ds = p (dp - delta).
 * kv: dk and dv transposed, a tile of d rows by key vectors in registers across every row of
 * the group: outer products of the rows of ds (p) with broadcast elements of q (dout).
 * q: per group of rows and chunk of 4 vectors of D, dq in registers across the block's keys. */
template <int BCV>
void attn_bwd_probs_bcv(const float* q, const float* dout, int64_t rows, int64_t Dp, int64_t D, const float* kt,
                        const float* vt, int64_t kt_stride, const float* lse, const float* delta, const int64_t* seen,
                        float* p, float* ds) {
    constexpr int64_t bc = (int64_t)BCV * W;
    const T neg_inf = V::set1(-__builtin_inff());
    for (int64_t r0 = 0; r0 < rows; r0 += kAttnRows) {
        const int nr = rows - r0 < kAttnRows ? (int)(rows - r0) : kAttnRows;
        T s[kAttnRows][BCV], g[kAttnRows][BCV];
        for (int i = 0; i < kAttnRows; ++i)
            for (int c = 0; c < BCV; ++c) s[i][c] = g[i][c] = V::zero();
        for (int64_t d = 0; d < D; ++d) {
            const float* kd = kt + d * kt_stride;
            T kv[BCV];
            for (int c = 0; c < BCV; ++c) kv[c] = V::load(kd + c * W);
            for (int i = 0; i < kAttnRows; ++i) {
                if (i >= nr) break;
                const T qd = V::set1(q[(r0 + i) * Dp + d]);
                for (int c = 0; c < BCV; ++c) s[i][c] = V::fma(qd, kv[c], s[i][c]);
            }
        }
        for (int64_t d = 0; d < D; ++d) {
            const float* vd = vt + d * kt_stride;
            T vv[BCV];
            for (int c = 0; c < BCV; ++c) vv[c] = V::load(vd + c * W);
            for (int i = 0; i < kAttnRows; ++i) {
                if (i >= nr) break;
                const T gd = V::set1(dout[(r0 + i) * Dp + d]);
                for (int c = 0; c < BCV; ++c) g[i][c] = V::fma(gd, vv[c], g[i][c]);
            }
        }
        for (int i = 0; i < nr; ++i) {
            const int64_t r = r0 + i;
            const int64_t n = seen[r] < bc ? seen[r] : bc;
            float* pr = p + r * bc;
            float* dr = ds + r * bc;
            if (n <= 0) {
                for (int c = 0; c < BCV; ++c) V::store(pr + c * W, V::zero()), V::store(dr + c * W, V::zero());
                continue;
            }
            alignas(64) float lane[W];
            for (int c = 0; c < BCV; ++c) { /* lanes at or past n: -inf, so p = 0 there */
                const int64_t j0 = (int64_t)c * W;
                if (j0 + W <= n) continue;
                for (int t = 0; t < W; ++t) lane[t] = j0 + t < n ? 0.0f : -1.0f;
                s[i][c] = V::blend(V::lt(V::load(lane), V::zero()), neg_inf, s[i][c]);
            }
            const T lv = V::set1(lse[r]), dl = V::set1(delta[r]);
            for (int c = 0; c < BCV; ++c) s[i][c] = V::sub(s[i][c], lv);
            vexp_n<BCV>(s[i]);
            for (int c = 0; c < BCV; ++c) {
                V::store(pr + c * W, s[i][c]);
                V::store(dr + c * W, V::mul(s[i][c], V::sub(g[i][c], dl)));
            }
        }
    }
}

bool attn_bwd_probs(const float* q, const float* dout, int64_t rows, int64_t Dp, int64_t D, const float* kt,
                    const float* vt, int64_t kt_stride, int64_t bc, const float* lse, const float* delta,
                    const int64_t* seen, float* p, float* ds) {
    if (bc != 64) return false;
    attn_bwd_probs_bcv<64 / W>(q, dout, rows, Dp, D, kt, vt, kt_stride, lse, delta, seen, p, ds);
    return true;
}

bool attn_bwd_kv(const float* q, const float* dout, int64_t rows, int64_t Dp, const float* p, const float* ds,
                 int64_t bc, float* dkt, float* dvt) {
    /* a tile of DT rows of d by JV vectors of keys in registers across the rows: per row JV
     * loads of ds (or p) and DT broadcasts of q (or dout) for DT * JV FMAs */
    constexpr int JV = 4, DT = W >= 16 ? 4 : 2;
    if (bc % (JV * W) || Dp % DT) return false;
    for (int m = 0; m < 2; ++m) {
        const float* a = m ? p : ds;
        const float* x = m ? dout : q;
        float* out = m ? dvt : dkt;
        for (int64_t j0 = 0; j0 < bc; j0 += JV * W)
            for (int64_t d0 = 0; d0 < Dp; d0 += DT) {
                T acc[DT][JV];
                for (int i = 0; i < DT; ++i)
                    for (int c = 0; c < JV; ++c) acc[i][c] = V::load(out + (d0 + i) * bc + j0 + c * W);
                for (int64_t r = 0; r < rows; ++r) {
                    T av[JV];
                    for (int c = 0; c < JV; ++c) av[c] = V::load(a + r * bc + j0 + c * W);
                    for (int i = 0; i < DT; ++i) {
                        const T xv = V::set1(x[r * Dp + d0 + i]);
                        for (int c = 0; c < JV; ++c) acc[i][c] = V::fma(xv, av[c], acc[i][c]);
                    }
                }
                for (int i = 0; i < DT; ++i)
                    for (int c = 0; c < JV; ++c) V::store(out + (d0 + i) * bc + j0 + c * W, acc[i][c]);
            }
    }
    return true;
}

bool attn_bwd_q(const float* ds, int64_t rows, int64_t Dp, const float* krows, int64_t nb, int64_t bc, float* dq) {
    if (Dp % W) return false;
    for (int64_t r0 = 0; r0 < rows; r0 += kAttnRows) {
        const int nr = rows - r0 < kAttnRows ? (int)(rows - r0) : kAttnRows;
        for (int64_t d0 = 0; d0 < Dp; d0 += 4 * W) {
            const int nv = Dp - d0 >= 4 * W ? 4 : (int)((Dp - d0) / W);
            T a[kAttnRows][4];
            for (int i = 0; i < kAttnRows; ++i)
                for (int u = 0; u < 4; ++u)
                    a[i][u] = i < nr && u < nv ? V::load(dq + (r0 + i) * Dp + d0 + u * W) : V::zero();
            for (int64_t j = 0; j < nb; ++j) {
                const float* kj = krows + j * Dp + d0;
                T kv[4];
                for (int u = 0; u < 4; ++u) kv[u] = u < nv ? V::load(kj + u * W) : V::zero();
                for (int i = 0; i < kAttnRows; ++i) {
                    if (i >= nr) break;
                    const T sj = V::set1(ds[(r0 + i) * bc + j]);
                    for (int u = 0; u < 4; ++u)
                        if (u < nv) a[i][u] = V::fma(sj, kv[u], a[i][u]);
                }
            }
            for (int i = 0; i < kAttnRows; ++i) {
                if (i >= nr) break;
                for (int u = 0; u < 4; ++u)
                    if (u < nv) V::store(dq + (r0 + i) * Dp + d0 + u * W, a[i][u]);
            }
        }
    }
    return true;
}
