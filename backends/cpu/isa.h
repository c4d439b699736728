/* The CPU backend's instruction-set paths and their run-time choice. Internal to backends/cpu/.
 *
 * Every op has a portable scalar path (rwkv7.cpp, rwkv6.cpp, rwkv4.cpp: plain C++ the compiler
 * may auto-vectorize for the build's baseline). On x86-64 with GCC or Clang the build also
 * compiles vector paths for wider instruction sets (cpu_avx2.cpp, cpu_avx512.cpp: the kernels
 * of *_simd.inl under `#pragma GCC target`, so the rest of the library keeps the baseline
 * ISA). On AArch64 the build compiles the NEON path (cpu_neon.cpp: the same kernels, NEON
 * being part of the baseline there), which every AArch64 CPU runs. Which path a context runs is chosen when it is created:
 *   - WKV_CPU_ISA unset, empty or "auto": the widest path this CPU executes
 *     (__builtin_cpu_supports, which also checks that the OS saves the vector registers);
 *   - WKV_CPU_ISA=scalar|avx2|avx512|neon: that path; creating the context fails with
 *     WKV_ERROR_UNSUPPORTED when this build lacks it or this CPU cannot execute it (it is meant
 *     for tests and benchmarks, which must not silently run another path).
 * Paths differ only in the order of float32 operations: each matches the float64 reference
 * within the same tolerances; results are not bit-identical across paths, and are
 * bit-identical across thread counts within one path. */
#ifndef WKV_BACKENDS_CPU_ISA_H
#define WKV_BACKENDS_CPU_ISA_H

#include "backend.h"

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define WKV_CPU_X86_SIMD 1
#else
#define WKV_CPU_X86_SIMD 0
#endif
#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#define WKV_CPU_NEON_SIMD 1
#else
#define WKV_CPU_NEON_SIMD 0
#endif

namespace wkv_cpu {

enum class Isa : int {
    kScalar = 0, /* portable C++ */
    kAvx2 = 1,   /* AVX2 + FMA + F16C, 8 floats per vector */
    kAvx512 = 2, /* AVX-512 F/BW/DQ/VL (+ the AVX2 set), 16 floats per vector */
    kNeon = 3,   /* AArch64 NEON, 4 floats per vector */
};
constexpr int kIsaCount = 4;

/* "scalar", "avx2", "avx512", "neon". */
const char* isa_name(Isa isa) noexcept;
/* This build has the path. */
bool isa_compiled(Isa isa) noexcept;
/* This build has the path and this CPU (and OS) can execute it. */
bool isa_supported(Isa isa) noexcept;
/* The widest supported path. */
Isa isa_best() noexcept;
/* The path WKV_CPU_ISA asks for (see above); WKV_OK, or WKV_ERROR_UNSUPPORTED with msg. */
wkv_status isa_from_env(Isa* out, wkv_message* msg) noexcept;
/* A static description for wkv_backend_info.reason: "built in; SIMD path avx512 (this CPU
 * runs: scalar avx2 avx512)", or one that says why WKV_CPU_ISA is refused. */
const char* isa_description() noexcept;

} // namespace wkv_cpu

#endif
