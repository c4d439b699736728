// src/half.h's conversions against the x86 conversion instructions, an independent
// implementation: F16C (vcvtph2ps / vcvtps2ph, round to nearest even) for float16 and AVX-512
// BF16 (vcvtneps2bf16) for bfloat16, each where the CPU has it. Every float16 bit pattern; for
// float32 -> 16 bits, every exponent with random mantissas, the ties, the specials.
#include "wkv_doctest.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "half.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

namespace {

__attribute__((target("f16c"))) float hw_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
__attribute__((target("f16c"))) uint16_t hw_f32_to_f16(float f) {
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
__attribute__((target("avx512f,avx512vl,avx512bf16"))) uint16_t hw_f32_to_bf16(float f) {
    const __m128bh r = _mm_cvtneps_pbh(_mm_set1_ps(f));
    uint16_t out;
    std::memcpy(&out, &r, 2);
    return out;
}

uint32_t bits(float f) { return wkv_f32_bits(f); }
float from_bits(uint32_t u) { return wkv_bits_f32(u); }

// Floats to convert: zeros, infinities, NaNs, the largest / smallest of each kind, every
// exponent with random mantissas and both signs, and the exact halfway points between
// neighbouring 16-bit values (the rounding ties) around every float16 / bfloat16 exponent.
std::vector<float> probe_floats() {
    std::vector<float> xs = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, from_bits(0x7f800001u),
                             65504.0f, 65520.0f, 65519.99f, 6.0e-8f, 5.9604645e-8f, 2.9802322e-8f,
                             from_bits(0x00000001u), from_bits(0x007fffffu), from_bits(0x7f7fffffu)};
    std::mt19937 rng(7);
    for (uint32_t e = 0; e < 256; ++e)
        for (int i = 0; i < 64; ++i) {
            const uint32_t man = rng() & 0x7fffffu;
            xs.push_back(from_bits((e << 23) | man));
            xs.push_back(from_bits(0x80000000u | (e << 23) | man));
        }
    for (uint32_t e = 100; e < 160; ++e)
        for (uint32_t m : {0x1000u, 0x3000u, 0x7ff000u, 0x8000u, 0x18000u, 0x7f8000u})
            xs.push_back(from_bits((e << 23) | m)); // f16 ties (bit 12 halfway) and bf16 ties (bit 15)
    return xs;
}

} // namespace

TEST_CASE("half.h: every float16 converts to float32 as F16C's vcvtph2ps does") {
    if (!__builtin_cpu_supports("f16c")) return;
    int checked = 0;
    for (uint32_t h = 0; h < 65536; ++h) {
        const float ours = wkv_f16_to_f32((uint16_t)h), hw = hw_f16_to_f32((uint16_t)h);
        CAPTURE(h);
        if (std::isnan(hw)) { // payload kept; the instruction also sets the quiet bit
            CHECK(std::isnan(ours));
            CHECK((bits(ours) | 0x00400000u) == bits(hw));
        } else {
            CHECK(bits(ours) == bits(hw));
        }
        ++checked;
    }
    CHECK(checked == 65536);
}

TEST_CASE("half.h: float32 rounds to float16 as F16C's vcvtps2ph does (nearest even)") {
    if (!__builtin_cpu_supports("f16c")) return;
    for (float f : probe_floats()) {
        const uint16_t ours = wkv_f32_to_f16(f), hw = hw_f32_to_f16(f);
        CAPTURE(bits(f));
        if (std::isnan(f)) {
            CHECK((ours & 0x7c00u) == 0x7c00u);
            CHECK((ours & 0x3ffu) != 0);
            CHECK((ours & 0x8000u) == (hw & 0x8000u));
        } else {
            CHECK(ours == hw);
        }
    }
}

TEST_CASE("half.h: float32 rounds to bfloat16 as AVX-512 BF16's vcvtneps2bf16 does") {
    if (!__builtin_cpu_supports("avx512bf16")) return;
    for (float f : probe_floats()) {
        if (std::fpclassify(f) == FP_SUBNORMAL) continue; // the instruction treats them as zero
        const uint16_t ours = wkv_f32_to_bf16(f), hw = hw_f32_to_bf16(f);
        CAPTURE(bits(f));
        if (std::isnan(f)) {
            CHECK(std::isnan(wkv_bf16_to_f32(ours)));
            CHECK((ours | 0x40u) == (hw | 0x40u));
        } else {
            CHECK(ours == hw);
        }
    }
}
#endif
