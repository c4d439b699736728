/* Run-time choice of the CPU backend's instruction-set path: see isa.h. */
#include "isa.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cpu_internal.h"

namespace wkv_cpu {

const char* isa_name(Isa isa) noexcept {
    switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kNeon: return "neon";
    }
    return "unknown";
}

bool isa_compiled(Isa isa) noexcept {
    if (isa == Isa::kScalar) return true;
    if (isa == Isa::kNeon) return WKV_CPU_NEON_SIMD != 0;
    return WKV_CPU_X86_SIMD != 0 && (isa == Isa::kAvx2 || isa == Isa::kAvx512);
}

bool isa_supported(Isa isa) noexcept {
    if (!isa_compiled(isa)) return false;
    /* NEON is part of AArch64: compiled means supported */
    if (isa == Isa::kNeon) return true;
#if WKV_CPU_X86_SIMD
    /* __builtin_cpu_supports reads cpuid once (libgcc / compiler-rt) and reports AVX and
     * AVX-512 only when the OS enables their register state (XCR0). */
#if defined(__clang__)
    /* Clang's __builtin_cpu_supports (14 at least) knows no "f16c": every AVX2 CPU has F16C
     * (Intel since Ivy Bridge, AMD since Piledriver) */
    const bool f16c = true;
#else
    const bool f16c = __builtin_cpu_supports("f16c");
#endif
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    switch (isa) {
    case Isa::kScalar: return true;
    case Isa::kAvx2: return avx2;
    case Isa::kAvx512:
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    case Isa::kNeon: return false; /* not compiled on x86-64 */
    }
    return false;
#else
    return isa == Isa::kScalar;
#endif
}

Isa isa_best() noexcept {
    for (int i = kIsaCount - 1; i > 0; --i)
        if (isa_supported(static_cast<Isa>(i))) return static_cast<Isa>(i);
    return Isa::kScalar;
}

wkv_status isa_from_env(Isa* out, wkv_message* msg) noexcept {
    const char* env = std::getenv("WKV_CPU_ISA");
    if (!env || !*env || std::strcmp(env, "auto") == 0) {
        *out = isa_best();
        return WKV_OK;
    }
    for (int i = 0; i < kIsaCount; ++i) {
        const Isa isa = static_cast<Isa>(i);
        if (std::strcmp(env, isa_name(isa)) != 0) continue;
        if (!isa_compiled(isa)) {
            set_message(msg, "WKV_CPU_ISA=%s: this build has no %s path", env, env);
            return WKV_ERROR_UNSUPPORTED;
        }
        if (!isa_supported(isa)) {
            set_message(msg, "WKV_CPU_ISA=%s: this CPU cannot execute the %s path (best: %s)",
                        env, env, isa_name(isa_best()));
            return WKV_ERROR_UNSUPPORTED;
        }
        *out = isa;
        return WKV_OK;
    }
    set_message(msg, "WKV_CPU_ISA=%.64s is not a path (auto, scalar, avx2, avx512, neon)", env);
    return WKV_ERROR_UNSUPPORTED;
}

namespace {
struct Description {
    char text[600];
    Description() noexcept {
        Isa isa;
        wkv_message msg;
        msg.text[0] = '\0';
        char runs[64] = "";
        for (int i = 0; i < kIsaCount; ++i)
            if (isa_supported(static_cast<Isa>(i))) {
                std::strncat(runs, " ", sizeof runs - std::strlen(runs) - 1);
                std::strncat(runs, isa_name(static_cast<Isa>(i)),
                             sizeof runs - std::strlen(runs) - 1);
            }
        if (isa_from_env(&isa, &msg) == WKV_OK)
            std::snprintf(text, sizeof text, "built in; SIMD path %s (this CPU runs:%s)",
                          isa_name(isa), runs);
        else /* msg.text starts with "cpu backend: " */
            std::snprintf(text, sizeof text, "built in; %s", msg.text + 13);
    }
};
} // namespace

const char* isa_description() noexcept {
    static const Description d; /* built once, thread-safely, at the first call */
    return d.text;
}

} // namespace wkv_cpu
