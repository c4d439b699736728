/* Helpers every vector kernel shares, written against the traits V (simd_avx2.inl,
 * simd_avx512.inl). Included by cpu_<isa>.cpp after V, inside the ISA's target region and
 * namespace. */

using T = V::T;
using M = V::M;
constexpr int W = V::W;

/* N rounded up to a multiple of W: the vector kernels' row length. Rows and states in scratch
 * are zero-padded to it (a zero-padded column stays zero through every recurrence here, and
 * contributes nothing to any sum). */
inline int64_t padded(int64_t N) noexcept { return (N + W - 1) / W * W; }

/* Small hot helpers that GCC's inliner otherwise leaves as calls once the file has many
 * callers (measured: vexp as a call cost 40 instructions per vector instead of ~25). */
#define WKV_SIMD_INLINE inline __attribute__((always_inline))

/* exp(x) for every float: ~1 ulp (Cephes' polynomial on [-ln2/2, ln2/2] after x = n ln2 + r),
 * +inf above ~88.72, results below ~-87.3 rounded through the subnormals to 0, NaN -> NaN. */
WKV_SIMD_INLINE T vexp(T x) noexcept {
    /* max(lo, x) and min(hi, .) return x when it is NaN, so NaN flows through to p */
    const T xc = V::min(V::set1(88.8f), V::max(V::set1(-104.0f), x));
    const T n = V::round(V::mul(xc, V::set1(1.44269504088896341f)));
    T r = V::fnma(n, V::set1(0.693359375f), xc);
    r = V::fnma(n, V::set1(-2.12194440e-4f), r);
    T p = V::set1(1.9875691500e-4f);
    p = V::fma(p, r, V::set1(1.3981999507e-3f));
    p = V::fma(p, r, V::set1(8.3334519073e-3f));
    p = V::fma(p, r, V::set1(4.1665795894e-2f));
    p = V::fma(p, r, V::set1(1.6666665459e-1f));
    p = V::fma(p, r, V::set1(5.0000001201e-1f));
    p = V::fma(p, V::mul(r, r), V::add(r, V::set1(1.0f)));
    return V::scale2(p, n);
}

/* vexp of U vectors in lockstep: the same operations in the same order per vector (the same
 * results), interleaved so that U independent chains fill the pipelines. One vexp is a chain
 * of ~20 dependent operations; called on one vector after another, as a decay row's few vectors
 * were, the out-of-order window held only a couple of them (NOTES.md, step 22). */
template <int U>
WKV_SIMD_INLINE void vexp_n(T* x) noexcept {
    T n[U], r[U], p[U];
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) x[u] = V::min(V::set1(88.8f), V::max(V::set1(-104.0f), x[u]));
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) n[u] = V::round(V::mul(x[u], V::set1(1.44269504088896341f)));
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) r[u] = V::fnma(n[u], V::set1(0.693359375f), x[u]);
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) r[u] = V::fnma(n[u], V::set1(-2.12194440e-4f), r[u]);
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) p[u] = V::fma(V::set1(1.9875691500e-4f), r[u], V::set1(1.3981999507e-3f));
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) p[u] = V::fma(p[u], r[u], V::set1(8.3334519073e-3f));
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) p[u] = V::fma(p[u], r[u], V::set1(4.1665795894e-2f));
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) p[u] = V::fma(p[u], r[u], V::set1(1.6666665459e-1f));
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) p[u] = V::fma(p[u], r[u], V::set1(5.0000001201e-1f));
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) p[u] = V::fma(p[u], V::mul(r[u], r[u]), V::add(r[u], V::set1(1.0f)));
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) x[u] = V::scale2(p[u], n[u]);
}

/* decay_rows' LOG, EXP_NEG_EXP and CLAMPW decays (and derivatives when ddw) of U vectors in
 * lockstep: its formulas and operations, interleaved as vexp_n is. */
template <int U>
WKV_SIMD_INLINE void decay_n(wkv_decay_form form, const float* w, float* decay,
                             float* ddw) noexcept {
    const T one = V::set1(1.0f);
    T x[U], d[U], g[U];
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) x[u] = V::load(w + u * W);
    if (form == WKV_DECAY_LOG) {
#pragma GCC unroll 8
        for (int u = 0; u < U; ++u) d[u] = x[u];
        vexp_n<U>(d);
#pragma GCC unroll 8
        for (int u = 0; u < U; ++u) g[u] = d[u];
    } else if (form == WKV_DECAY_EXP_NEG_EXP) {
        T e[U];
#pragma GCC unroll 8
        for (int u = 0; u < U; ++u) e[u] = x[u];
        vexp_n<U>(e);
#pragma GCC unroll 8
        for (int u = 0; u < U; ++u) d[u] = V::neg(e[u]);
        vexp_n<U>(d);
#pragma GCC unroll 8
        for (int u = 0; u < U; ++u)
            g[u] = V::blend(V::eq(e[u], V::set1(INFINITY)), V::set1(-0.0f), V::neg(V::mul(e[u], d[u])));
    } else { /* WKV_DECAY_CLAMPW */
        T z[U], inv[U];
#pragma GCC unroll 8
        for (int u = 0; u < U; ++u) z[u] = V::neg(V::abs(x[u]));
        vexp_n<U>(z);
#pragma GCC unroll 8
        for (int u = 0; u < U; ++u) {
            inv[u] = V::div(one, V::add(one, z[u]));
            const T sig = V::blend(V::ge(x[u], V::zero()), inv[u], V::mul(z[u], inv[u]));
            d[u] = V::mul(V::set1(-kClampwScale), sig);
        }
        vexp_n<U>(d);
#pragma GCC unroll 8
        for (int u = 0; u < U; ++u)
            g[u] = V::mul(V::mul(V::set1(-kClampwScale), V::mul(V::mul(z[u], inv[u]), inv[u])), d[u]);
    }
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) {
        V::store(decay + u * W, d[u]);
        if (ddw) V::store(ddw + u * W, g[u]);
    }
}

/* decay_row() (cpu_internal.h) on Np = nv * W lanes: the same formulas, vectorized. */
inline void decay_rows(wkv_decay_form form, const float* w, float* decay, float* ddw,
                       int64_t Np) noexcept {
    const T one = V::set1(1.0f);
    int64_t j0 = 0;
    if (form == WKV_DECAY_LOG || form == WKV_DECAY_EXP_NEG_EXP || form == WKV_DECAY_CLAMPW) {
        for (; j0 + 4 * W <= Np; j0 += 4 * W) /* 4 vectors at a time, in lockstep */
            decay_n<4>(form, w + j0, decay + j0, ddw ? ddw + j0 : nullptr);
        for (; j0 + 2 * W <= Np; j0 += 2 * W) /* the rest (N = 32 on AVX-512): 2 at a time */
            decay_n<2>(form, w + j0, decay + j0, ddw ? ddw + j0 : nullptr);
    }
    for (int64_t j = j0; j < Np; j += W) {
        const T x = V::load(w + j);
        T d, g = one;
        switch (form) {
        case WKV_DECAY_DIRECT: d = x; break;
        case WKV_DECAY_LOG:
            d = vexp(x);
            g = d;
            break;
        case WKV_DECAY_EXP_NEG_EXP: {
            const T e = vexp(x);
            d = vexp(V::neg(e));
            /* -e * d, or -0 once e is infinite (d is 0 there) */
            g = V::blend(V::eq(e, V::set1(INFINITY)), V::set1(-0.0f), V::neg(V::mul(e, d)));
            break;
        }
        case WKV_DECAY_CLAMPW: {
            const T z = vexp(V::neg(V::abs(x)));
            const T inv = V::div(one, V::add(one, z));
            const T sig = V::blend(V::ge(x, V::zero()), inv, V::mul(z, inv));
            d = vexp(V::mul(V::set1(-kClampwScale), sig));
            g = V::mul(V::mul(V::set1(-kClampwScale), V::mul(V::mul(z, inv), inv)), d);
            break;
        }
        default:
            d = V::set1(NAN);
            g = d;
            break;
        }
        V::store(decay + j, d);
        if (ddw) V::store(ddw + j, g);
    }
}

/* Whether p is aligned to the vector width (W floats). The kernels read a row once per group
 * of value rows (16 times per token-head at N = 64) and a state row twice per token: rows that
 * are not vector-aligned would make every vector access straddle two cache lines (on AVX-512
 * every one, at the 16-byte alignment of malloc), so such rows are copied once into aligned
 * scratch instead (NOTES.md, step 13). */
inline bool vector_aligned(const void* p) noexcept {
    return (reinterpret_cast<uintptr_t>(p) & (uintptr_t)(4 * W - 1)) == 0;
}

/* One token row: n elements of v from element offset `off` along stride[3], as float32.
 * Returns a pointer straight into the tensor when it is float32, contiguous, vector-aligned
 * and n == Np; otherwise converts into buf (Np floats, zero-padded past n) and returns buf. */
inline const float* row_in(const wkv_view& v, int64_t off, int64_t n, int64_t Np,
                           float* buf) noexcept {
    if (v.stride[3] == 1) {
        const char* src = v.data + off * wkv_elem_size(v.elem);
        int64_t j = 0;
        switch (v.elem) {
        case WKV_ELEM_F32:
            if (n == Np && vector_aligned(src)) return reinterpret_cast<const float*>(src);
            std::memcpy(buf, src, (size_t)n * 4);
            j = n;
            break;
        case WKV_ELEM_F16:
            for (; j + W <= n; j += W) V::store(buf + j, V::load_f16(src + 2 * j));
            for (; j < n; ++j) {
                uint16_t h;
                std::memcpy(&h, src + 2 * j, 2);
                buf[j] = wkv_f16_to_f32(h);
            }
            break;
        case WKV_ELEM_BF16:
            for (; j + W <= n; j += W) V::store(buf + j, V::load_bf16(src + 2 * j));
            for (; j < n; ++j) {
                uint16_t h;
                std::memcpy(&h, src + 2 * j, 2);
                buf[j] = wkv_bf16_to_f32(h);
            }
            break;
        }
    } else {
        load_row(v, off, n, buf);
    }
    for (int64_t j = n; j < Np; ++j) buf[j] = 0.0f;
    return buf;
}

/* store_row() with vector conversions for contiguous 16-bit rows. */
inline void row_out(const wkv_view& v, int64_t off, int64_t n, const float* src) noexcept {
    if (v.stride[3] != 1) {
        store_row(v, off, n, src);
        return;
    }
    int64_t j = 0;
    if (v.elem == WKV_ELEM_F32) { /* inline vector stores: a memcpy call per row cost more */
        float* dst = reinterpret_cast<float*>(v.data + off * 4);
        for (; j + W <= n; j += W) V::store(dst + j, V::load(src + j));
        if (j < n) store_row(v, off + j, n - j, src + j);
        return;
    }
    char* dst = v.data + off * 2;
    if (v.elem == WKV_ELEM_F16) {
        for (; j + W <= n; j += W) V::store_f16(dst + 2 * j, V::load(src + j));
    } else {
        for (; j + W <= n; j += W) V::store_bf16(dst + 2 * j, V::load(src + j));
    }
    if (j < n) store_row(v, off + j, n - j, src + j);
}

/* row_out() for rows written once and not read again soon (the backward's gradients of a long
 * sequence): float32 rows that are whole aligned vectors go out by non-temporal stores, which
 * skip reading each line before writing it (half the memory traffic) and leave the caches to
 * the state. The caller runs V::stream_fence() before its item ends. */
inline void row_out_stream(const wkv_view& v, int64_t off, int64_t n, const float* src) noexcept {
    float* dst = reinterpret_cast<float*>(v.data + off * 4);
    if (v.elem != WKV_ELEM_F32 || v.stride[3] != 1 || n % W != 0 || !vector_aligned(dst)) {
        row_out(v, off, n, src);
        return;
    }
    for (int64_t j = 0; j < n; j += W) V::stream(dst + j, V::load(src + j));
}

/* Token rows of a per-token view [b, t, h, :]. */
inline const float* token_in(const wkv_view& v, int64_t b, int64_t t, int64_t h, int64_t n,
                             int64_t Np, float* buf) noexcept {
    return row_in(v, view_offset(v, b, t, h), n, Np, buf);
}
inline void token_out(const wkv_view& v, int64_t b, int64_t t, int64_t h, int64_t n,
                      const float* src) noexcept {
    row_out(v, view_offset(v, b, t, h), n, src);
}
/* Where a kernel may write a token's output row of n == Np floats itself: the row in the
 * tensor when it is float32 and contiguous, else NULL (then it goes through buf and
 * token_out). A kernel that leaves y in scratch in 4-float pieces and then copies it out
 * reads them back with vector loads that no store can forward to: ~20 cycles per load
 * (NOTES.md, step 24). */
inline float* token_out_direct(const wkv_view& v, int64_t b, int64_t t, int64_t h, int64_t n,
                               int64_t Np) noexcept {
    if (v.elem != WKV_ELEM_F32 || v.stride[3] != 1 || n != Np) return nullptr;
    return reinterpret_cast<float*>(v.data + view_offset(v, b, t, h) * 4);
}
/* Whether a backward streams its per-token gradients (row_out_stream): when one gradient
 * tensor is larger than 1 MiB, more than the caches keep for the caller anyway; smaller
 * calls (decode) leave them in the cache. */
inline bool stream_gradients(const wkv_problem* p) noexcept {
    return (double)p->B * (double)p->T * (double)p->H * (double)p->N > 262144.0;
}
inline void grad_out(bool stream, const wkv_view& v, int64_t off, int64_t n, const float* src) noexcept {
    if (stream) row_out_stream(v, off, n, src);
    else row_out(v, off, n, src);
}
inline void token_grad_out(bool stream, const wkv_view& v, int64_t b, int64_t t, int64_t h, int64_t n,
                           const float* src) noexcept {
    grad_out(stream, v, view_offset(v, b, t, h), n, src);
}

/* No software prefetches. A sequence's token rows are H * N elements apart (8 KiB at H = 32,
 * N = 64 in float32), each on a page of its own, and the kernels used to prefetch the rows 2
 * tokens ahead, but GCC 12 had deleted every one of those prefetches (a function that only
 * prefetches counts as free of side effects, and its calls go before inlining; always_inline
 * keeps them). Turned on, they were not faster: the RWKV-7 f32 forward and, with its next
 * segment prefetched into L2 as well, the RWKV-7 backward were slower in most alternated runs
 * (NOTES.md, step 35). So the rows are only read token-major in head groups (head_group). */
/* A state slice [s, h, :, :] that the kernels can address in place: float32 rows of N
 * contiguous floats (stride[3] == 1, 4-byte aligned), N == Np. Returns row 0 and its row
 * stride, or NULL. */
inline float* state_rows(const wkv_view& v, int64_t s, int64_t h, int64_t N, int64_t Np,
                         int64_t* row_stride) noexcept {
    if (!view_present(v) || N != Np || v.stride[3] != 1 || v.elem != WKV_ELEM_F32) return nullptr;
    char* p = v.data + (v.stride[0] * s + v.stride[1] * h) * 4;
    if ((reinterpret_cast<uintptr_t>(p) & 3u) != 0) return nullptr;
    *row_stride = v.stride[2];
    return reinterpret_cast<float*>(p);
}

/* load_state() into an Np x Np matrix (row stride Np), zero-padded; absent = zeros. */
inline void state_in_padded(const wkv_view& v, int64_t s, int64_t h, int64_t N, int64_t Np,
                            float* m) noexcept {
    if (!view_present(v)) {
        std::memset(m, 0, sizeof(float) * (size_t)(Np * Np));
        return;
    }
    const int64_t base = v.stride[0] * s + v.stride[1] * h;
    for (int64_t i = 0; i < Np; ++i) {
        float* row = m + i * Np;
        if (i < N) {
            load_row(v, base + i * v.stride[2], N, row);
            for (int64_t j = N; j < Np; ++j) row[j] = 0.0f;
        } else {
            std::memset(row, 0, sizeof(float) * (size_t)Np);
        }
    }
}

/* store_state() from an Np x Np matrix (row stride Np). */
inline void state_out_padded(const wkv_view& v, int64_t s, int64_t h, int64_t N, int64_t Np,
                             const float* m) noexcept {
    if (!view_present(v)) return;
    const int64_t base = v.stride[0] * s + v.stride[1] * h;
    for (int64_t i = 0; i < N; ++i) store_row(v, base + i * v.stride[2], N, m + i * Np);
}

/* Heads per forward item of the N x N-state ops (RWKV-7, RWKV-6), walked token-major (each
 * token for every head of the group, then the next token): the group's rows of one token are
 * adjacent in a [B, T, H, N] tensor, where one head's rows of successive tokens are H * N
 * elements apart, each on a page of its own — measured 2x faster at
 * T = 4096, H = 32 (backends/cpu/NOTES.md). The group's states (kGroupStateBytes at most) stay
 * in L2. As many heads as that allows, but enough items for every thread:
 * min(kGroupStateBytes / state, ceil(H / ceil(threads / num_seqs))); one head per item when
 * the sequences are kFewTokens long or less on average. Every head is computed the same way
 * whatever its group. */
constexpr int64_t kMaxGroup = 64;
constexpr int64_t kFewTokens = 8;
constexpr int64_t kGroupStateBytes = 256 * 1024;

inline int64_t head_group(const wkv_problem* p, int64_t threads) noexcept {
    const int64_t Np = padded(p->N), H = p->H;
    /* a few tokens per sequence (decode): nothing to gain from walking heads together, and one
     * head per item spreads the work more evenly over the threads */
    if (p->T <= kFewTokens * (p->num_seqs > 0 ? p->num_seqs : 1)) return 1;
    int64_t g = kGroupStateBytes / (4 * Np * Np);
    const int64_t seqs = p->num_seqs > 0 ? p->num_seqs : 1;
    const int64_t per_seq = (threads + seqs - 1) / seqs;
    const int64_t want = per_seq > 1 ? (H + per_seq - 1) / per_seq : H;
    if (g > want) g = want;
    if (g > kMaxGroup) g = kMaxGroup;
    return g < 1 ? 1 : g;
}

/* The heads of a backward item (RWKV-7, RWKV-6): up to `most`, but enough items for every
 * thread (ceil(H / ceil(threads / num_seqs)) when that is smaller). */
inline int64_t backward_head_group(const wkv_problem* p, int64_t threads, int64_t most) noexcept {
    const int64_t seqs = p->num_seqs > 0 ? p->num_seqs : 1;
    const int64_t per_seq = (threads + seqs - 1) / seqs;
    const int64_t want = per_seq > 1 ? (p->H + per_seq - 1) / per_seq : p->H;
    const int64_t g = want < most ? want : most;
    return g < 1 ? 1 : g;
}
