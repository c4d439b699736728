// The CUDA backend's failure paths and its NaN/Inf policy (docs/RELIABILITY.md), on a
// CUDA device (without one every case says SKIPPED):
// - fault injection (src/fault.h, builds with WKV_FAULT_INJECTION: scripts/device.sh turns it
//   on): cudaMalloc failing for the staging scratch and in wkv_buffer_create, the device lost
//   at a launch or copy ("submit") and when the stream is waited for ("sync", as an
//   asynchronous kernel failure shows itself): a status and a message, outputs untouched, the
//   context's health, every later call refused, destroy frees everything, other contexts work;
// - NaN and Inf inputs: the results agree with the float64 reference element by element
//   (tests/test_nonfinite.h, the check every backend's suite runs).
#include "wkv_doctest.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "test_any_op.h"
#include "test_fault_util.h"
#include "test_nonfinite.h"
#include "wkv/wkv.h"

using namespace wkvtest;

namespace {

wkv_context* cuda_context(const char* fault = nullptr) { return fault_context(WKV_BACKEND_CUDA, fault); }

} // namespace

TEST_CASE("cuda fault: cudaMalloc failing (staging scratch, buffers) is a status; the context stays healthy") {
    CUDA_TEST_OR_SKIP();
    if (!faults_compiled_in()) {
        MESSAGE("this build has no fault injection (WKV_FAULT_INJECTION=OFF)");
        return;
    }
    const uint64_t seed = test_seed();
    CAPTURE(seed);
    const std::vector<AnyProblem> ps = fault_problems(seed);
    int injected = 0;
    for (int n = 1; n <= 12; ++n) { // oom:scratch@n: the n-th growth of the staging scratch
        const std::string spec = "oom:scratch@" + std::to_string(n);
        CAPTURE(spec);
        wkv_context* ctx = cuda_context(spec.c_str());
        bool failed = false;
        for (const auto& p : ps) {
            const Arrays ref = any_reference(p);
            AnyRun run = any_run(ctx, p);
            if (run.forward != WKV_OK || run.backward != WKV_OK) {
                failed = true;
                ++injected;
                CHECK((run.forward == WKV_ERROR_OUT_OF_MEMORY || run.backward == WKV_ERROR_OUT_OF_MEMORY));
                CHECK(contains(run.forward_msg + run.backward_msg, "device scratch"));
                CHECK(run.failures_untouched);
                CHECK(wkv_context_health(ctx) == WKV_OK);
                run = any_run(ctx, p);
            }
            check_ok(run, ref);
        }
        wkv_context_destroy(ctx);
        if (!failed) break;
    }
    CHECK(injected >= 1);
    wkv_context* ctx = cuda_context("oom:buffer@2");
    wkv_buffer *a = nullptr, *b = nullptr;
    CHECK(wkv_buffer_create(ctx, 256, &a) == WKV_OK);
    CHECK(wkv_buffer_create(ctx, 256, &b) == WKV_ERROR_OUT_OF_MEMORY);
    CHECK(b == nullptr);
    CHECK(contains(wkv_last_error(ctx), "cudaMalloc"));
    CHECK(wkv_context_health(ctx) == WKV_OK);
    CHECK(wkv_buffer_create(ctx, 256, &b) == WKV_OK);
    wkv_buffer_destroy(a);
    wkv_buffer_destroy(b);
    wkv_context_destroy(ctx);
    MESSAGE("cuda oom: " << injected + 1 << " faults injected and survived");
}

TEST_CASE("cuda fault: the device lost at a launch or a wait: health, later calls refused, others work") {
    CUDA_TEST_OR_SKIP();
    if (!faults_compiled_in()) return;
    const uint64_t seed = test_seed();
    CAPTURE(seed);
    const std::vector<AnyProblem> ps = fault_problems(seed);
    std::vector<Arrays> refs;
    for (const auto& p : ps) refs.push_back(any_reference(p));
    wkv_context* healthy = cuda_context();
    int injected = 0;
    // "submit" (each forward and backward launches once) and "sync" (host tensors: each call
    // waits for its stream before it returns), the n-th of either
    for (const char* site : {"submit", "sync"}) {
        for (int n = 1; n <= 6; ++n) {
            const std::string spec = std::string("device_lost:") + site + "@" + std::to_string(n);
            CAPTURE(spec);
            wkv_context* ctx = cuda_context(spec.c_str());
            bool lost = false;
            for (size_t i = 0; i < ps.size(); ++i) {
                AnyRun run = any_run(ctx, ps[i]);
                if (lost) {
                    CHECK(run.forward == WKV_ERROR_DEVICE_LOST);
                    CHECK(run.failures_untouched);
                    continue;
                }
                if (run.forward == WKV_OK && run.backward == WKV_OK) {
                    for (const auto& kv : run.out) CHECK(rel_err(kv.second, refs[i].at(kv.first)) < 1e-4);
                    continue;
                }
                lost = true;
                ++injected;
                CHECK((run.forward == WKV_ERROR_DEVICE_LOST || run.backward == WKV_ERROR_DEVICE_LOST));
                CHECK(contains(run.forward_msg + run.backward_msg, "cudaErrorLaunchFailure"));
                if (std::string(site) == "submit") CHECK(run.failures_untouched); // nothing ran
                CHECK(wkv_context_health(ctx) == WKV_ERROR_DEVICE_LOST);
            }
            REQUIRE(lost);
            wkv_buffer* buf = nullptr;
            CHECK(wkv_buffer_create(ctx, 64, &buf) == WKV_ERROR_DEVICE_LOST);
            CHECK(wkv_context_synchronize(ctx) == WKV_ERROR_DEVICE_LOST);
            wkv_context_destroy(ctx);
            const size_t j = static_cast<size_t>(n) % ps.size();
            check_ok(any_run(healthy, ps[j]), refs[j]);
            CHECK(wkv_context_health(healthy) == WKV_OK);
        }
    }
    // an asynchronous failure: the call returned OK, wkv_context_synchronize reports it
    wkv_context* ctx = cuda_context("device_lost:sync@2");
    wkv_buffer* buf = nullptr;
    REQUIRE(wkv_buffer_create(ctx, 1024, &buf) == WKV_OK);
    CHECK(wkv_context_synchronize(ctx) == WKV_OK);             // sync 1
    CHECK(wkv_context_synchronize(ctx) == WKV_ERROR_DEVICE_LOST); // sync 2
    CHECK(contains(wkv_last_error(ctx), "wkv_context_synchronize"));
    CHECK(wkv_context_health(ctx) == WKV_ERROR_DEVICE_LOST);
    std::vector<float> host(256, 1.0f);
    CHECK(wkv_buffer_upload(ctx, buf, 0, host.data(), 1024) == WKV_ERROR_DEVICE_LOST);
    wkv_buffer_destroy(buf);
    wkv_context_destroy(ctx);
    ++injected;
    wkv_context_destroy(healthy);
    CHECK(injected == 13);
    MESSAGE("cuda device_lost: " << injected << " faults injected and survived");
}

TEST_CASE("cuda nonfinite: NaN and Inf inputs propagate as in the float64 reference, every op") {
    CUDA_TEST_OR_SKIP();
    const uint64_t seed = test_seed();
    CAPTURE(seed);
    wkv_context* ctx = cuda_context();
    int cases = 0;
    for (wkv_op op : {WKV_OP_RWKV7, WKV_OP_RWKV6, WKV_OP_RWKV4}) {
        for (const NonfiniteCase& c : nonfinite_cases(seed, op, op == WKV_OP_RWKV4 ? 64 : 32)) {
            CAPTURE(c.name);
            const std::string why = nonfinite_disagreement(any_run(ctx, c.p), c, 1e-4);
            CHECK_MESSAGE(why.empty(), why);
            ++cases;
        }
    }
    wkv_context_destroy(ctx);
    MESSAGE(cases << " NaN/Inf cases, forward and backward");
}
