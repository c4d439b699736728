/* Force-included into backends/cpu/isa.cpp by the fuzz build (CMakeLists.txt here) when clang is
 * older than 15, whose __builtin_cpu_supports does not know "f16c". The same answers, from
 * cpuid and XCR0, for every feature isa.cpp asks about; anything else is "no". Remove it once
 * isa.cpp builds with clang 14 (or the fuzz build uses a newer clang). */
#ifndef WKV_TESTS_FUZZ_CLANG14_COMPAT_H
#define WKV_TESTS_FUZZ_CLANG14_COMPAT_H
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <string.h>

static inline int wkv_fuzz_cpu_supports(const char* f) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    unsigned c1 = c;
    unsigned long long xcr0 = 0;
    if ((c1 >> 27) & 1) { /* OSXSAVE */
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        xcr0 = ((unsigned long long)hi << 32) | lo;
    }
    int avx_os = (xcr0 & 0x6) == 0x6, avx512_os = (xcr0 & 0xe6) == 0xe6;
    unsigned b7 = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) b7 = b;
    if (!strcmp(f, "f16c")) return avx_os && ((c1 >> 29) & 1);
    if (!strcmp(f, "fma")) return avx_os && ((c1 >> 12) & 1);
    if (!strcmp(f, "avx2")) return avx_os && ((b7 >> 5) & 1);
    if (!strcmp(f, "avx512f")) return avx512_os && ((b7 >> 16) & 1);
    if (!strcmp(f, "avx512dq")) return avx512_os && ((b7 >> 17) & 1);
    if (!strcmp(f, "avx512bw")) return avx512_os && ((b7 >> 30) & 1);
    if (!strcmp(f, "avx512vl")) return avx512_os && ((b7 >> 31) & 1);
    return 0;
}
#define __builtin_cpu_supports(feature) wkv_fuzz_cpu_supports(feature)
#endif
#endif
