// What the fault-injection suites share (tests/test_fault.cpp on the CPU, the CUDA and Vulkan
// backends' *_reliability.cpp): setting WKV_FAULT around a context's creation, a context of one
// backend with or without a fault plan, the three small problems every backend runs, and the
// check of a call that was expected to succeed.
#ifndef WKV_TEST_FAULT_UTIL_H
#define WKV_TEST_FAULT_UTIL_H

#include "wkv_doctest.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "test_any_op.h"
#include "wkv/wkv.h"

namespace wkvtest {

inline bool faults_compiled_in() { return std::strstr(wkv_build_info(), "fault injection") != nullptr; }

// WKV_FAULT for the contexts created during its lifetime (the plan is read at creation).
struct FaultEnv {
    explicit FaultEnv(const char* spec) { setenv("WKV_FAULT", spec, 1); }
    ~FaultEnv() { unsetenv("WKV_FAULT"); }
    FaultEnv(const FaultEnv&) = delete;
    FaultEnv& operator=(const FaultEnv&) = delete;
};

inline bool contains(const std::string& s, const char* needle) { return s.find(needle) != std::string::npos; }

// A context of `backend`, created under the fault plan `fault` when one is given.
inline wkv_context* fault_context(wkv_backend backend, const char* fault = nullptr) {
    wkv_context_options o{};
    o.struct_size = sizeof o;
    o.backend = backend;
    wkv_context* ctx = nullptr;
    wkv_status st;
    if (fault) {
        FaultEnv env(fault);
        st = wkv_context_create(&o, &ctx);
    } else {
        st = wkv_context_create(&o, &ctx);
    }
    INFO(std::string(wkv_last_error(nullptr)));
    REQUIRE(st == WKV_OK);
    return ctx;
}

// The three ops, small (N = 32: every GPU backend runs it), with states.
inline std::vector<AnyProblem> fault_problems(uint64_t seed) {
    Rng rng(seed);
    return {any_random(rng, WKV_OP_RWKV7, 2, 9, 2, 32), any_random(rng, WKV_OP_RWKV6, 2, 9, 2, 32, WKV_DECAY_EXP_NEG_EXP),
            any_random(rng, WKV_OP_RWKV4, 2, 9, 1, 64)};
}

// A run that must have succeeded, with results that agree with the reference.
inline void check_ok(const AnyRun& run, const Arrays& ref) {
    CAPTURE(run.forward_msg);
    CAPTURE(run.backward_msg);
    REQUIRE(run.forward == WKV_OK);
    REQUIRE(run.backward == WKV_OK);
    for (const auto& kv : run.out) {
        CAPTURE(kv.first);
        CHECK(rel_err(kv.second, ref.at(kv.first)) < 1e-4);
    }
}

} // namespace wkvtest

#endif
