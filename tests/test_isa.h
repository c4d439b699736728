// The CPU backend's instruction-set paths (WKV_CPU_ISA; backends/cpu/isa.h) from a test's side.
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

#include "wkv/wkv.h"

namespace wkvtest {

// Sets WKV_CPU_ISA for the scope (the CPU backend reads it when a context is created), and puts
// back what was there.
class ScopedIsa {
public:
    explicit ScopedIsa(const char* isa) {
        const char* old = std::getenv("WKV_CPU_ISA");
        had_ = old != nullptr;
        if (had_) old_ = old;
        if (isa)
            setenv("WKV_CPU_ISA", isa, 1);
        else
            unsetenv("WKV_CPU_ISA");
    }
    ~ScopedIsa() {
        if (had_)
            setenv("WKV_CPU_ISA", old_.c_str(), 1);
        else
            unsetenv("WKV_CPU_ISA");
    }
    ScopedIsa(const ScopedIsa&) = delete;
    ScopedIsa& operator=(const ScopedIsa&) = delete;

private:
    bool had_ = false;
    std::string old_;
};

// Every path name the backend knows.
inline std::vector<std::string> all_cpu_isas() { return {"scalar", "avx2", "avx512", "neon"}; }

// The paths this build and this CPU run: those a CPU context can be created with.
inline std::vector<std::string> runnable_cpu_isas() {
    std::vector<std::string> out;
    for (const std::string& isa : all_cpu_isas()) {
        ScopedIsa scope(isa.c_str());
        wkv_context_options o{};
        o.struct_size = sizeof o;
        o.backend = WKV_BACKEND_CPU;
        wkv_context* ctx = nullptr;
        if (wkv_context_create(&o, &ctx) == WKV_OK) {
            out.push_back(isa);
            wkv_context_destroy(ctx);
        }
    }
    return out;
}

}  // namespace wkvtest
