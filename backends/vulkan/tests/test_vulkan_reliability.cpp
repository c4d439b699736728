// The Vulkan backend's failure paths and its NaN/Inf policy (docs/RELIABILITY.md), on
// whatever Vulkan device there is (lavapipe in CI) with the validation layer on:
// - fault injection (src/fault.h, builds with WKV_FAULT_INJECTION): out of device memory when
//   the staging/scratch buffers grow and in wkv_buffer_create, the device lost at vkQueueSubmit
//   (every op forward and backward, in turn): a status and a message, outputs untouched, the
//   context's health, every later call refused, destroy frees everything, other contexts work;
// - NaN and Inf inputs: the results agree with the float64 reference element by element (NaN
//   where it has NaN, the same finite values elsewhere): tests/test_nonfinite.cpp's check.
#include "wkv_doctest.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "test_any_op.h"
#include "test_fault_util.h"
#include "test_nonfinite.h"
#define VK_NO_PROTOTYPES
#include <vulkan/vulkan_core.h>

#include "wkv/wkv_vulkan.h"

using namespace wkvtest;

namespace {

wkv_context* vk_context(const char* fault = nullptr) { return fault_context(WKV_BACKEND_VULKAN, fault); }

uint64_t validation_messages(wkv_context* ctx) {
    uint64_t n = 0;
    CHECK(wkv_vulkan_validation_message_count(ctx, &n) == WKV_OK);
    return n;
}

} // namespace

TEST_CASE("vulkan fault: out of device memory (staging, scratch, buffers) is a status; the context stays healthy") {
    if (!faults_compiled_in()) {
        MESSAGE("this build has no fault injection (WKV_FAULT_INJECTION=OFF)");
        return;
    }
    const uint64_t seed = test_seed();
    CAPTURE(seed);
    const std::vector<AnyProblem> ps = fault_problems(seed);
    // oom:scratch@n: the n-th growth of a cached buffer (staging, its device mirror, the
    // backward's scratch) fails; the same call again succeeds.
    int injected = 0;
    for (int n = 1; n <= 12; ++n) {
        const std::string spec = "oom:scratch@" + std::to_string(n);
        CAPTURE(spec);
        wkv_context* ctx = vk_context(spec.c_str());
        bool failed = false;
        for (const auto& p : ps) {
            const Arrays ref = any_reference(p);
            AnyRun run = any_run(ctx, p);
            if (run.forward != WKV_OK || run.backward != WKV_OK) {
                failed = true;
                ++injected;
                CHECK((run.forward == WKV_ERROR_OUT_OF_MEMORY || run.backward == WKV_ERROR_OUT_OF_MEMORY));
                CHECK(contains(run.forward_msg + run.backward_msg, "VK_ERROR_OUT_OF_DEVICE_MEMORY"));
                CHECK(run.failures_untouched);
                CHECK(wkv_context_health(ctx) == WKV_OK);
                run = any_run(ctx, p);
            }
            check_ok(run, ref);
        }
        CHECK(validation_messages(ctx) == 0);
        wkv_context_destroy(ctx);
        if (!failed) break;
    }
    CHECK(injected >= 2);
    // oom:buffer: wkv_buffer_create
    wkv_context* ctx = vk_context("oom:buffer@2");
    wkv_buffer *a = nullptr, *b = nullptr;
    CHECK(wkv_buffer_create(ctx, 256, &a) == WKV_OK);
    CHECK(wkv_buffer_create(ctx, 256, &b) == WKV_ERROR_OUT_OF_MEMORY);
    CHECK(b == nullptr);
    CHECK(contains(wkv_last_error(ctx), "wkv_buffer_create"));
    CHECK(wkv_context_health(ctx) == WKV_OK);
    CHECK(wkv_buffer_create(ctx, 256, &b) == WKV_OK);
    wkv_buffer_destroy(a);
    wkv_buffer_destroy(b);
    CHECK(validation_messages(ctx) == 0);
    wkv_context_destroy(ctx);
    MESSAGE("vulkan oom: " << injected + 1 << " faults injected and survived");
}

TEST_CASE("vulkan fault: the device lost at vkQueueSubmit: health, later calls refused, others work") {
    if (!faults_compiled_in()) return;
    const uint64_t seed = test_seed();
    CAPTURE(seed);
    const std::vector<AnyProblem> ps = fault_problems(seed);
    std::vector<Arrays> refs;
    for (const auto& p : ps) refs.push_back(any_reference(p));
    wkv_context* healthy = vk_context();
    int injected = 0;
    // device_lost@n: the n-th submission (each forward and backward submits once; a buffer's
    // zero fill and upload/download too)
    for (int n = 1; n <= 6; ++n) {
        const std::string spec = "device_lost@" + std::to_string(n);
        CAPTURE(spec);
        wkv_context* ctx = vk_context(spec.c_str());
        wkv_buffer* keep = nullptr;
        bool lost = false;
        for (size_t i = 0; i < ps.size(); ++i) {
            AnyRun run = any_run(ctx, ps[i]);
            CHECK(run.failures_untouched);
            if (lost) {
                CHECK(run.forward == WKV_ERROR_DEVICE_LOST);
                CHECK(contains(run.forward_msg, "destroy this context"));
                continue;
            }
            if (run.forward == WKV_OK && run.backward == WKV_OK) {
                for (const auto& kv : run.out) CHECK(rel_err(kv.second, refs[i].at(kv.first)) < 1e-4);
                CHECK(wkv_context_health(ctx) == WKV_OK);
                continue;
            }
            lost = true;
            ++injected;
            CHECK((run.forward == WKV_ERROR_DEVICE_LOST || run.backward == WKV_ERROR_DEVICE_LOST));
            CHECK(contains(run.forward_msg + run.backward_msg, "VK_ERROR_DEVICE_LOST"));
            CHECK(wkv_context_health(ctx) == WKV_ERROR_DEVICE_LOST);
            if (run.forward == WKV_OK) // a forward that completed is correct
                CHECK(rel_err(run.out["y"], refs[i].at("y")) < 1e-4);
        }
        REQUIRE(lost);
        CHECK(wkv_buffer_create(ctx, 64, &keep) == WKV_ERROR_DEVICE_LOST);
        CHECK(keep == nullptr);
        CHECK(wkv_context_synchronize(ctx) == WKV_ERROR_DEVICE_LOST);
        // (a lost context refuses even the validation count; a validation message during a
        // call would have failed that call with WKV_ERROR_INTERNAL instead)
        uint64_t count = 0;
        CHECK(wkv_vulkan_validation_message_count(ctx, &count) == WKV_ERROR_DEVICE_LOST);
        wkv_context_destroy(ctx); // frees everything (the ASan build checks)
        // the context created before, and a new one, work
        check_ok(any_run(healthy, ps[static_cast<size_t>(n) % ps.size()]), refs[static_cast<size_t>(n) % ps.size()]);
        CHECK(wkv_context_health(healthy) == WKV_OK);
    }
    wkv_context* fresh = vk_context();
    check_ok(any_run(fresh, ps[0]), refs[0]);
    wkv_context_destroy(fresh);
    // a lost context's buffers: destroying them (before or with the context) is fine
    wkv_context* ctx = vk_context("device_lost:submit@2");
    wkv_buffer* buf = nullptr;
    REQUIRE(wkv_buffer_create(ctx, 1024, &buf) == WKV_OK); // submission 1: the zero fill
    std::vector<float> host(256, 1.0f);
    CHECK(wkv_buffer_upload(ctx, buf, 0, host.data(), 1024) == WKV_ERROR_DEVICE_LOST);
    CHECK(wkv_context_health(ctx) == WKV_ERROR_DEVICE_LOST);
    CHECK(wkv_buffer_download(ctx, buf, 0, host.data(), 1024) == WKV_ERROR_DEVICE_LOST);
    wkv_context_destroy(ctx); // frees buf too
    ++injected;
    CHECK(validation_messages(healthy) == 0);
    wkv_context_destroy(healthy);
    CHECK(injected == 7);
    MESSAGE("vulkan device_lost: " << injected << " faults injected and survived");
}

TEST_CASE("vulkan nonfinite: NaN and Inf inputs propagate as in the float64 reference, every op") {
    const uint64_t seed = test_seed();
    CAPTURE(seed);
    wkv_context* ctx = vk_context();
    int cases = 0;
    for (wkv_op op : {WKV_OP_RWKV7, WKV_OP_RWKV6, WKV_OP_RWKV4}) {
        for (const NonfiniteCase& c : nonfinite_cases(seed, op, op == WKV_OP_RWKV4 ? 64 : 32)) {
            CAPTURE(c.name);
            const std::string why = nonfinite_disagreement(any_run(ctx, c.p), c, 1e-4);
            CHECK_MESSAGE(why.empty(), why);
            ++cases;
        }
    }
    CHECK(validation_messages(ctx) == 0);
    wkv_context_destroy(ctx);
    MESSAGE(cases << " NaN/Inf cases, forward and backward");
}
