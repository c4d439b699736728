/* Vector traits for the AVX-512 path (F, BW, DQ, VL): 16 floats per vector. The interface of
 * simd_avx2.inl; included by cpu_avx512.cpp inside its `#pragma GCC target` region. */
struct V {
    using T = __m512;
    using M = __mmask16;
    static constexpr int W = 16;
    using Q = __m128;

    static inline void q_store(float* p, Q x) { _mm_store_ps(p, x); }
    static inline void q_storeu(float* p, Q x) { _mm_storeu_ps(p, x); }
    static inline Q q_loadu(const float* p) { return _mm_loadu_ps(p); }
    static inline Q q_set1(float x) { return _mm_set1_ps(x); }
    static inline Q q_fma(Q a, Q b, Q c) { return _mm_fmadd_ps(a, b, c); }
    /* the 4 x 4 matrix of rows a b c d transposed in place */
    static inline void q_transpose4(Q& a, Q& b, Q& c, Q& d) { _MM_TRANSPOSE4_PS(a, b, c, d); }

    static inline T load(const float* p) { return _mm512_loadu_ps(p); }
    static inline void store(float* p, T x) { _mm512_storeu_ps(p, x); }
    /* a non-temporal store (p 64-byte aligned), and the fence that orders such stores before
     * the item's completion is published */
    static inline void stream(float* p, T x) { _mm512_stream_ps(p, x); }
    static inline void stream_fence() { _mm_sfence(); }
    static inline T zero() { return _mm512_setzero_ps(); }
    static inline T set1(float x) { return _mm512_set1_ps(x); }
    static inline T add(T a, T b) { return _mm512_add_ps(a, b); }
    static inline T sub(T a, T b) { return _mm512_sub_ps(a, b); }
    static inline T mul(T a, T b) { return _mm512_mul_ps(a, b); }
    static inline T div(T a, T b) { return _mm512_div_ps(a, b); }
    static inline T min(T a, T b) { return _mm512_min_ps(a, b); }
    static inline T max(T a, T b) { return _mm512_max_ps(a, b); }
    static inline T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
    static inline T fnma(T a, T b, T c) { return _mm512_fnmadd_ps(a, b, c); }
    static inline T abs(T a) { return _mm512_abs_ps(a); }
    static inline T neg(T a) {
        return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32(INT32_MIN)));
    }
    static inline T round(T a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    static inline M ge(T a, T b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
    static inline M eq(T a, T b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
    static inline M lt(T a, T b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
    static inline M gt(T a, T b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
    static inline M finite(T a) {
        return _mm512_cmp_ps_mask(abs(a), _mm512_set1_ps(INFINITY), _CMP_LT_OQ);
    }
    static inline T blend(M m, T a, T b) { return _mm512_mask_blend_ps(m, b, a); }

    /* x * 2^n in one vscalefps (the AVX2 path's two-multiply split takes 9 operations): for
     * vexp's n in [-150, 128] and x in [0.7, 1.5] both round once, at the same place (x * 2^(n/2)
     * is exact and normal), so the results are the same bits, overflow to inf and the
     * subnormals included (NOTES.md, step 24) */
    static inline T scale2(T x, T n) { return _mm512_scalef_ps(x, n); }

    static inline __m256 half_sum(T a) {
        return _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    }
    /* The four lane sums: a transpose-and-add inside each 128-bit lane (4 unpacks, 2 shuffles),
     * then the four 128-bit lanes added (2 extracts): 8 shuffle-port operations, where
     * extract-and-hadd took 11 (NOTES.md, step 12). */
    static inline Q hsum4(T a0, T a1, T a2, T a3) {
        const T s01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
        const T s23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
        const T s = _mm512_add_ps(_mm512_shuffle_ps(s01, s23, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_ps(s01, s23, _MM_SHUFFLE(3, 2, 3, 2)));
        const __m256 h = half_sum(s);
        return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    }
    /* The four lane maxima, hsum4's shuffles with max for add (x86 max: NaN in, the second
     * operand out, as everywhere in these traits). */
    static inline Q hmax4(T a0, T a1, T a2, T a3) {
        const T s01 = _mm512_max_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
        const T s23 = _mm512_max_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
        const T s = _mm512_max_ps(_mm512_shuffle_ps(s01, s23, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_ps(s01, s23, _MM_SHUFFLE(3, 2, 3, 2)));
        const __m256 h = _mm256_max_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
        return _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    }
    /* *p in every lane, as a load-port broadcast: written as asm so that the compiler can
     * neither keep the value in a register and shuffle it (the shuffle port is the one
     * 512-bit FMAs share) nor fold a just-stored value into a register broadcast */
    static inline T bcast_mem(const float* p) {
        T r;
        __asm__("vbroadcastss %1, %0" : "=v"(r) : "m"(*p));
        return r;
    }
    /* c + a * (*p in every lane), the broadcast folded into the FMA as a memory operand
     * ({1to16}: a load-port operation, no register held for it) */
    static inline T fma_bm(T a, const float* p, T c) {
        __asm__("vfmadd231ps %2%{1to16%}, %1, %0" : "+v"(c) : "v"(a), "m"(*p));
        return c;
    }
    template <int L>
    static inline T bcast(Q x) {
        return _mm512_broadcastss_ps(_mm_shuffle_ps(x, x, _MM_SHUFFLE(L, L, L, L)));
    }

    static inline T load_f16(const void* p) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
    }
    static inline T load_bf16(const void* p) {
        const __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
    }
    static inline void store_f16(void* p, T x) {
        _mm256_storeu_si256(static_cast<__m256i*>(p),
                            _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    static inline void store_bf16(void* p, T x) {
        const __m512i u = _mm512_castps_si512(x);
        const __m512i hi = _mm512_srli_epi32(u, 16);
        const __m512i odd = _mm512_and_si512(hi, _mm512_set1_epi32(1));
        const __m512i rounded = _mm512_srli_epi32(
            _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
        const __m512i qnan = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
        const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        const __m512i r = _mm512_mask_blend_epi32(nan, rounded, qnan);
        _mm256_storeu_si256(static_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
    }
};
