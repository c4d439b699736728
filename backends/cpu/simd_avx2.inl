/* Vector traits for the AVX2 + FMA + F16C path: 8 floats per vector. Included by cpu_avx2.cpp
 * inside its `#pragma GCC target` region and its own namespace (see isa.h); the kernels
 * (*_simd.inl) are written against this interface, which simd_avx512.inl and simd_neon.inl provide
 * too:
 *   T, M (a lane mask), W; load/store (any alignment), zero, set1, arithmetic, fma(a,b,c) =
 *   a*b + c, fnma(a,b,c) = c - a*b; comparisons ge eq lt gt (false where NaN) and finite
 *   (|a| < inf) to M; blend(m, a, b) = m ? a : b; scale2(x, n) = x * 2^n for integer-valued n;
 *   hsum4(a0..a3) -> the four lane sums as one Q, hmax4 the four lane maxima; bcast<L>(Q) -> lane L everywhere;
 *   bcast_mem(p) -> *p everywhere; fma_bm(a, p, c) = a * bcast_mem(p) + c;
 *   Q, a vector of 4 floats (what hsum4 returns), with q_store (16-byte aligned), q_storeu,
 *   q_loadu, q_set1, q_fma and q_transpose4; 16-bit loads and stores (f16 with F16C, bf16 by
 *   shifting; rounding to nearest even, NaN stays NaN). */
struct V {
    using T = __m256;
    using M = __m256; /* all-ones lanes */
    static constexpr int W = 8;
    using Q = __m128;

    static inline void q_store(float* p, Q x) { _mm_store_ps(p, x); }
    static inline void q_storeu(float* p, Q x) { _mm_storeu_ps(p, x); }
    static inline Q q_loadu(const float* p) { return _mm_loadu_ps(p); }
    static inline Q q_set1(float x) { return _mm_set1_ps(x); }
    static inline Q q_fma(Q a, Q b, Q c) { return _mm_fmadd_ps(a, b, c); }
    /* the 4 x 4 matrix of rows a b c d transposed in place */
    static inline void q_transpose4(Q& a, Q& b, Q& c, Q& d) { _MM_TRANSPOSE4_PS(a, b, c, d); }

    static inline T load(const float* p) { return _mm256_loadu_ps(p); }
    static inline void store(float* p, T x) { _mm256_storeu_ps(p, x); }
    /* a non-temporal store (p 32-byte aligned), and the fence that orders such stores before
     * the item's completion is published */
    static inline void stream(float* p, T x) { _mm256_stream_ps(p, x); }
    static inline void stream_fence() { _mm_sfence(); }
    static inline T zero() { return _mm256_setzero_ps(); }
    static inline T set1(float x) { return _mm256_set1_ps(x); }
    static inline T add(T a, T b) { return _mm256_add_ps(a, b); }
    static inline T sub(T a, T b) { return _mm256_sub_ps(a, b); }
    static inline T mul(T a, T b) { return _mm256_mul_ps(a, b); }
    static inline T div(T a, T b) { return _mm256_div_ps(a, b); }
    /* min/max return b when either is NaN */
    static inline T min(T a, T b) { return _mm256_min_ps(a, b); }
    static inline T max(T a, T b) { return _mm256_max_ps(a, b); }
    static inline T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
    static inline T fnma(T a, T b, T c) { return _mm256_fnmadd_ps(a, b, c); }
    static inline T abs(T a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
    static inline T neg(T a) { return _mm256_xor_ps(_mm256_set1_ps(-0.0f), a); }
    static inline T round(T a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    static inline M ge(T a, T b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }
    static inline M eq(T a, T b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
    static inline M lt(T a, T b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
    static inline M gt(T a, T b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
    static inline M finite(T a) {
        return _mm256_cmp_ps(abs(a), _mm256_set1_ps(INFINITY), _CMP_LT_OQ);
    }
    static inline T blend(M m, T a, T b) { return _mm256_blendv_ps(b, a, m); }

    /* 2^n1 * 2^n2 with n = n1 + n2, n1 = floor(n / 2): exact for integer-valued n in
     * [-252, 254] wherever the product is a normal float or zero/inf after the second rounding */
    static inline T scale2(T x, T n) {
        const __m256i ni = _mm256_cvtps_epi32(n);
        const __m256i n1 = _mm256_srai_epi32(ni, 1);
        const __m256i n2 = _mm256_sub_epi32(ni, n1);
        const __m256i bias = _mm256_set1_epi32(127);
        const T p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
        const T p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
        return _mm256_mul_ps(_mm256_mul_ps(x, p1), p2);
    }

    static inline Q hsum4(T a0, T a1, T a2, T a3) {
        const __m256 t0 = _mm256_hadd_ps(a0, a1), t1 = _mm256_hadd_ps(a2, a3);
        const __m256 t2 = _mm256_hadd_ps(t0, t1); /* a0 a1 a2 a3 (low half sums, high half) */
        return _mm_add_ps(_mm256_castps256_ps128(t2), _mm256_extractf128_ps(t2, 1));
    }
    /* The four lane maxima (hsum4 with max; hadd has no max form, so unpacks and shuffles). */
    static inline Q hmax4(T a0, T a1, T a2, T a3) {
        const T s01 = _mm256_max_ps(_mm256_unpacklo_ps(a0, a1), _mm256_unpackhi_ps(a0, a1));
        const T s23 = _mm256_max_ps(_mm256_unpacklo_ps(a2, a3), _mm256_unpackhi_ps(a2, a3));
        const T s = _mm256_max_ps(_mm256_shuffle_ps(s01, s23, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm256_shuffle_ps(s01, s23, _MM_SHUFFLE(3, 2, 3, 2)));
        return _mm_max_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    }
    /* *p in every lane, as a load-port broadcast: written as asm so that the compiler can
     * neither keep the value in a register and shuffle it (the shuffle port is the one
     * 512-bit FMAs share) nor fold a just-stored value into a register broadcast */
    static inline T bcast_mem(const float* p) {
        T r;
        __asm__("vbroadcastss %1, %0" : "=v"(r) : "m"(*p));
        return r;
    }
    /* c + a * (*p in every lane): AVX2 has no broadcast memory operand, so a broadcast load
     * into a scratch register right before the FMA (re-read at every use: 16 registers hold
     * no per-row broadcasts besides the sums) */
    static inline T fma_bm(T a, const float* p, T c) {
        T b;
        __asm__("vbroadcastss %3, %1\n\tvfmadd231ps %1, %2, %0"
                : "+v"(c), "=&v"(b)
                : "v"(a), "m"(*p));
        return c;
    }
    template <int L>
    static inline T bcast(Q x) {
        return _mm256_broadcastss_ps(_mm_shuffle_ps(x, x, _MM_SHUFFLE(L, L, L, L)));
    }

    static inline T load_f16(const void* p) {
        return _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(p)));
    }
    static inline T load_bf16(const void* p) {
        const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(static_cast<const __m128i*>(p)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
    }
    static inline void store_f16(void* p, T x) {
        _mm_storeu_si128(static_cast<__m128i*>(p),
                         _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    static inline void store_bf16(void* p, T x) {
        const __m256i u = _mm256_castps_si256(x);
        const __m256i hi = _mm256_srli_epi32(u, 16);
        const __m256i odd = _mm256_and_si256(hi, _mm256_set1_epi32(1));
        const __m256i rounded =
            _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
        const __m256i qnan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
        const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        const __m256i r = _mm256_blendv_epi8(rounded, qnan, nan);
        const __m128i packed =
            _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
        _mm_storeu_si128(static_cast<__m128i*>(p), packed);
    }
};
