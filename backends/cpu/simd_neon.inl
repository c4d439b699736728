/* Vector traits for the AArch64 NEON path: 4 floats per vector. The interface of
 * simd_avx2.inl; included by cpu_neon.cpp inside its own namespace. NEON (Advanced SIMD, with
 * FMA, float division and f16 conversions) is part of the AArch64 baseline, so no target
 * pragma is needed. Where NEON's semantics differ from x86's, these follow x86's (min/max with
 * NaN, bf16 rounding), so that every path computes the same thing. */
struct V {
    using T = float32x4_t;
    using M = uint32x4_t; /* all-ones lanes */
    static constexpr int W = 4;
    using Q = float32x4_t; /* a vector is already 4 floats */

    static inline void q_store(float* p, Q x) { vst1q_f32(p, x); }
    static inline void q_storeu(float* p, Q x) { vst1q_f32(p, x); }
    static inline Q q_loadu(const float* p) { return vld1q_f32(p); }
    static inline Q q_set1(float x) { return vdupq_n_f32(x); }
    static inline Q q_fma(Q a, Q b, Q c) { return vfmaq_f32(c, a, b); }
    /* the 4 x 4 matrix of rows a b c d transposed in place */
    static inline void q_transpose4(Q& a, Q& b, Q& c, Q& d) {
        const float32x4x2_t ab = vtrnq_f32(a, b), cd = vtrnq_f32(c, d); /* a0 b0 a2 b2 | a1 b1 a3 b3 */
        a = vcombine_f32(vget_low_f32(ab.val[0]), vget_low_f32(cd.val[0]));
        b = vcombine_f32(vget_low_f32(ab.val[1]), vget_low_f32(cd.val[1]));
        c = vcombine_f32(vget_high_f32(ab.val[0]), vget_high_f32(cd.val[0]));
        d = vcombine_f32(vget_high_f32(ab.val[1]), vget_high_f32(cd.val[1]));
    }

    static inline T load(const float* p) { return vld1q_f32(p); }
    static inline void store(float* p, T x) { vst1q_f32(p, x); }
    /* no non-temporal store worth it here: a plain store (and no fence) */
    static inline void stream(float* p, T x) { vst1q_f32(p, x); }
    static inline void stream_fence() {}
    static inline T zero() { return vdupq_n_f32(0.0f); }
    static inline T set1(float x) { return vdupq_n_f32(x); }
    static inline T add(T a, T b) { return vaddq_f32(a, b); }
    static inline T sub(T a, T b) { return vsubq_f32(a, b); }
    static inline T mul(T a, T b) { return vmulq_f32(a, b); }
    static inline T div(T a, T b) { return vdivq_f32(a, b); }
    /* min/max return b when either is NaN, as x86's minps/maxps do (vminq_f32 would return
     * NaN, vminnmq_f32 the number): vexp's clamp relies on NaN flowing through */
    static inline T min(T a, T b) { return vbslq_f32(vcltq_f32(a, b), a, b); }
    static inline T max(T a, T b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }
    static inline T fma(T a, T b, T c) { return vfmaq_f32(c, a, b); }
    static inline T fnma(T a, T b, T c) { return vfmsq_f32(c, a, b); }
    static inline T abs(T a) { return vabsq_f32(a); }
    static inline T neg(T a) { return vnegq_f32(a); }
    static inline T round(T a) { return vrndnq_f32(a); } /* to nearest, ties to even */
    static inline M ge(T a, T b) { return vcgeq_f32(a, b); }
    static inline M eq(T a, T b) { return vceqq_f32(a, b); }
    static inline M lt(T a, T b) { return vcltq_f32(a, b); }
    static inline M gt(T a, T b) { return vcgtq_f32(a, b); }
    static inline M finite(T a) { return vcltq_f32(vabsq_f32(a), vdupq_n_f32(INFINITY)); }
    static inline T blend(M m, T a, T b) { return vbslq_f32(m, a, b); }

    /* as simd_avx2.inl: 2^n1 * 2^n2 with n1 = floor(n / 2) */
    static inline T scale2(T x, T n) {
        const int32x4_t ni = vcvtnq_s32_f32(n);
        const int32x4_t n1 = vshrq_n_s32(ni, 1);
        const int32x4_t n2 = vsubq_s32(ni, n1);
        const int32x4_t bias = vdupq_n_s32(127);
        const T p1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n1, bias), 23));
        const T p2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n2, bias), 23));
        return vmulq_f32(vmulq_f32(x, p1), p2);
    }

    /* two rounds of pairwise adds: (a0 a1) -> a0.01 a0.23 a1.01 a1.23, then the four sums */
    static inline Q hsum4(T a0, T a1, T a2, T a3) {
        return vpaddq_f32(vpaddq_f32(a0, a1), vpaddq_f32(a2, a3));
    }
    /* pairwise maxima as hsum4's pairwise adds, each pair through max() so NaN follows x86 */
    static inline Q hmax4(T a0, T a1, T a2, T a3) {
        const T p01 = max(vuzp1q_f32(a0, a1), vuzp2q_f32(a0, a1)), p23 = max(vuzp1q_f32(a2, a3), vuzp2q_f32(a2, a3));
        return max(vuzp1q_f32(p01, p23), vuzp2q_f32(p01, p23));
    }
    static inline T bcast_mem(const float* p) { return vld1q_dup_f32(p); }
    static inline T fma_bm(T a, const float* p, T c) { return vfmaq_f32(c, a, vld1q_dup_f32(p)); }
    template <int L>
    static inline T bcast(Q x) {
        return vdupq_laneq_f32(x, L);
    }

    /* 16-bit rows: loaded and stored as bytes, which any alignment allows */
    static inline T load_f16(const void* p) {
        return vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(static_cast<const uint8_t*>(p))));
    }
    static inline T load_bf16(const void* p) {
        const uint16x4_t h = vreinterpret_u16_u8(vld1_u8(static_cast<const uint8_t*>(p)));
        return vreinterpretq_f32_u32(vshlq_n_u32(vmovl_u16(h), 16));
    }
    /* vcvt_f16_f32 rounds by FPCR: to nearest even unless the caller changed it (as F16C's
     * conversion with _MM_FROUND_TO_NEAREST_INT does always) */
    static inline void store_f16(void* p, T x) {
        vst1_u8(static_cast<uint8_t*>(p), vreinterpret_u8_f16(vcvt_f16_f32(x)));
    }
    /* as simd_avx2.inl: round to nearest even by adding 0x7fff + the kept part's lowest bit;
     * NaN keeps its sign and top payload bits, made quiet */
    static inline void store_bf16(void* p, T x) {
        const uint32x4_t u = vreinterpretq_u32_f32(x);
        const uint32x4_t hi = vshrq_n_u32(u, 16);
        const uint32x4_t odd = vandq_u32(hi, vdupq_n_u32(1));
        const uint32x4_t rounded =
            vshrq_n_u32(vaddq_u32(u, vaddq_u32(vdupq_n_u32(0x7fff), odd)), 16);
        const uint32x4_t qnan = vorrq_u32(hi, vdupq_n_u32(0x40));
        const uint32x4_t nan = vmvnq_u32(vceqq_f32(x, x));
        const uint16x4_t r = vmovn_u32(vbslq_u32(nan, qnan, rounded));
        vst1_u8(static_cast<uint8_t*>(p), vreinterpret_u8_u16(r));
    }
};
