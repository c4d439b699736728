// The CPU backend's run-time choice of instruction-set path (WKV_CPU_ISA, backends/cpu/isa.h).
// Each path's numerics are checked against the float64 reference by the op suites: in process
// (the "every CPU path" cases of test_rwkv7_random.cpp and the others), and in full by ctest,
// which runs the rwkv and golden cases once per path (wkv_tests_isa_<path>).
#include "wkv_doctest.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "test_isa.h"
#include "wkv/wkv.h"

using namespace wkvtest;

namespace {

wkv_status create_cpu(wkv_context** ctx) {
    wkv_context_options o{};
    o.struct_size = sizeof o;
    o.backend = WKV_BACKEND_CPU;
    *ctx = nullptr;
    return wkv_context_create(&o, ctx);
}

#if defined(__x86_64__) && defined(__linux__) /* only the x86 case below asks */
bool cpu_has(const char* flag) {
    std::FILE* f = std::fopen("/proc/cpuinfo", "r");
    if (!f) return false;
    char line[8192];
    bool found = false;
    while (!found && std::fgets(line, sizeof line, f)) {
        if (std::string(line).rfind("flags", 0) != 0) continue;
        const std::string l = std::string(" ") + line + " ";
        found = l.find(std::string(" ") + flag + " ") != std::string::npos ||
                l.find(std::string(" ") + flag + "\n") != std::string::npos;
        break;
    }
    std::fclose(f);
    return found;
}
#endif

}  // namespace

TEST_CASE("cpu isa: scalar always runs; unknown values are refused with a message") {
    const std::vector<std::string> paths = runnable_cpu_isas();
    REQUIRE(!paths.empty());
    CHECK(paths.front() == "scalar");
    MESSAGE("CPU paths this machine runs:" << [&] {
        std::string s;
        for (const std::string& p : paths) s += " " + p;
        return s;
    }());
    {
        ScopedIsa isa("bogus");
        wkv_context* ctx = nullptr;
        CHECK(create_cpu(&ctx) == WKV_ERROR_UNSUPPORTED);
        CHECK(ctx == nullptr);
        CHECK(std::string(wkv_last_error(nullptr)).find("WKV_CPU_ISA") != std::string::npos);
    }
    for (const char* v : {"", "auto"}) {
        ScopedIsa isa(v);
        wkv_context* ctx = nullptr;
        CHECK(create_cpu(&ctx) == WKV_OK);
        wkv_context_destroy(ctx);
    }
    wkv_backend_info info{};
    info.struct_size = sizeof info;
    REQUIRE(wkv_backend_get_info(WKV_BACKEND_CPU, &info) == WKV_OK);
    CHECK(std::string(info.reason).find("built in") == 0);
}

TEST_CASE("cpu isa: the x86 vector paths run exactly where /proc/cpuinfo says they can") {
#if defined(__x86_64__) && defined(__linux__)
    const std::vector<std::string> paths = runnable_cpu_isas();
    auto has = [&](const char* p) {
        for (const std::string& x : paths)
            if (x == p) return true;
        return false;
    };
    const bool avx2 = cpu_has("avx2") && cpu_has("fma") && cpu_has("f16c");
    const bool avx512 = avx2 && cpu_has("avx512f") && cpu_has("avx512bw") &&
                        cpu_has("avx512dq") && cpu_has("avx512vl");
    CHECK(has("avx2") == avx2);
    CHECK(has("avx512") == avx512);
    if (!avx512) {
        ScopedIsa isa("avx512");
        wkv_context* ctx = nullptr;
        CHECK(create_cpu(&ctx) == WKV_ERROR_UNSUPPORTED);
        CHECK(std::string(wkv_last_error(nullptr)).find("cannot execute") != std::string::npos);
    }
#else
    MESSAGE("not an x86-64 Linux machine: only the scalar path");
#endif
}

TEST_CASE("cpu isa: on AArch64 the NEON path always runs (the widest there: auto picks it)") {
#if defined(__aarch64__)
    const std::vector<std::string> paths = runnable_cpu_isas();
    CHECK(paths == std::vector<std::string>{"scalar", "neon"});
    wkv_backend_info info{};
    info.struct_size = sizeof info;
    REQUIRE(wkv_backend_get_info(WKV_BACKEND_CPU, &info) == WKV_OK);
    /* the reason is built at the first call, under whatever WKV_CPU_ISA the run has */
    if (std::string(info.reason).find("WKV_CPU_ISA") == std::string::npos)
        CHECK(std::string(info.reason).find("runs: scalar neon)") != std::string::npos);
#else
    const std::vector<std::string> paths = runnable_cpu_isas();
    for (const std::string& p : paths) CHECK(p != "neon");
    ScopedIsa isa("neon");
    wkv_context* ctx = nullptr;
    CHECK(create_cpu(&ctx) == WKV_ERROR_UNSUPPORTED);
    CHECK(std::string(wkv_last_error(nullptr)).find("has no neon path") != std::string::npos);
#endif
}
