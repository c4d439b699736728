/* float32 <-> float16 / bfloat16 conversions, portable C (no compiler half type needed).
 * Rounding is round-to-nearest-even; NaN stays NaN, overflow gives infinity, float16
 * subnormals are exact. Shared by the backends, the tests and wkv-bench. */
#ifndef WKV_SRC_HALF_H
#define WKV_SRC_HALF_H

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

static inline uint32_t wkv_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float wkv_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float wkv_bf16_to_f32(uint16_t h) { return wkv_bits_f32((uint32_t)h << 16); }

static inline uint16_t wkv_f32_to_bf16(float f) {
    uint32_t u = wkv_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* No branches (masks, not selects, which compilers keep as jumps), so that loops of it
 * vectorise: the exponent rebiased by 112 (twice for inf / NaN, whose payload is kept),
 * subnormals and zero as man * 2^-24 (exact). */
static inline float wkv_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t em = h & 0x7fffu;
    const uint32_t special = 0u - (uint32_t)(em >= 0x7c00u); /* all ones for inf / NaN */
    const uint32_t tiny = 0u - (uint32_t)(em < 0x400u);      /* all ones for subnormal / zero */
    const uint32_t normal = (em << 13) + 0x38000000u + (special & 0x38000000u);
    const uint32_t small = wkv_f32_bits((float)(int32_t)em * (1.0f / 16777216.0f));
    return wkv_bits_f32(sign | (small & tiny) | (normal & ~tiny));
}

static inline uint16_t wkv_f32_to_f16(float f) {
    uint32_t u = wkv_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {
        /* below the smallest normal 2^-14: subnormal or zero; round man to 2^-24 steps */
        if (a < 0x33000000u) return sign; /* < 2^-25: rounds to zero */
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    /* normal: rebias exponent, round mantissa to 10 bits (carry into exponent is correct) */
    uint32_t r = a - 0x38000000u; /* exponent 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

#ifdef __cplusplus
}
#endif

#endif /* WKV_SRC_HALF_H */
