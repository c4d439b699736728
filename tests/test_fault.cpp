// Fault injection (src/fault.h) on the core and the CPU backend, and wkv_context_health.
// WKV_FAULT makes chosen failure points fail as the real failure would; these tests prove that
// each failure comes back as the right status with a message, that outputs stay untouched, that
// a lost context says so and refuses every later call, that destroy still frees everything (the
// ASan build checks leaks, valgrind runs these cases too), and that other contexts keep working.
// The plugin loader's point (no_driver) needs a fresh process: tests/plugin runs it. In a build
// without WKV_FAULT_INJECTION the cases that need it say so and pass.
#include "wkv_doctest.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "test_any_op.h"
#include "test_fault_util.h"
#include "wkv/wkv.h"

using namespace wkvtest;

namespace {

struct Logs {
    std::vector<std::string> lines;
    static void fn(void* user, wkv_log_level, const char* message) {
        static_cast<Logs*>(user)->lines.push_back(message);
    }
    bool any(const char* needle) const {
        for (const auto& l : lines)
            if (l.find(needle) != std::string::npos) return true;
        return false;
    }
};

wkv_status create_cpu(wkv_context** ctx, int threads = 2, Logs* logs = nullptr) {
    wkv_context_options o{};
    o.struct_size = sizeof o;
    o.backend = WKV_BACKEND_CPU;
    o.cpu_threads = threads;
    if (logs) {
        o.log = Logs::fn;
        o.log_user_data = logs;
        o.log_level = WKV_LOG_WARN;
    }
    *ctx = nullptr;
    return wkv_context_create(&o, ctx);
}

// The three ops, small, with states; each one's float64 reference.
struct Suite {
    std::vector<AnyProblem> problems;
    std::vector<Arrays> refs;
    explicit Suite(uint64_t seed) {
        Rng rng(seed);
        problems.push_back(any_random(rng, WKV_OP_RWKV7, 2, 9, 2, 8));
        problems.push_back(any_random(rng, WKV_OP_RWKV6, 2, 9, 2, 8, WKV_DECAY_EXP_NEG_EXP));
        problems.push_back(any_random(rng, WKV_OP_RWKV4, 2, 9, 1, 16));
        for (const auto& p : problems) refs.push_back(any_reference(p));
    }
};

// Every call of run failed with `want` and a message, or succeeded with correct results.
// Returns the number of calls that failed.
int check_run(const AnyRun& run, const Arrays& ref, wkv_status want, const char* what) {
    CAPTURE(what);
    CAPTURE(run.forward_msg);
    CAPTURE(run.backward_msg);
    CHECK(run.failures_untouched);
    int failed = 0;
    for (wkv_status st : {run.forward, run.workspace, run.backward}) {
        if (st == WKV_OK) continue;
        CHECK(st == want);
        ++failed;
    }
    if (run.forward != WKV_OK) CHECK(!run.forward_msg.empty());
    if (run.workspace != WKV_OK || run.backward != WKV_OK) CHECK(!run.backward_msg.empty());
    for (const auto& kv : run.out) {
        CAPTURE(kv.first);
        CHECK(rel_err(kv.second, ref.at(kv.first)) < 1e-4);
    }
    return failed;
}

} // namespace

TEST_CASE("fault: wkv_context_health is ok on a working context, NULL_POINTER for NULL") {
    CHECK(wkv_context_health(nullptr) == WKV_ERROR_NULL_POINTER);
    wkv_context* ctx = nullptr;
    REQUIRE(create_cpu(&ctx) == WKV_OK);
    CHECK(wkv_context_health(ctx) == WKV_OK);
    wkv_context_destroy(ctx);
}

TEST_CASE("fault: WKV_FAULT's grammar; a malformed value fails wkv_context_create naming it") {
    if (!faults_compiled_in()) {
        Logs logs;
        FaultEnv env("oom");
        wkv_context* ctx = nullptr;
        REQUIRE(create_cpu(&ctx, 1, &logs) == WKV_OK); // ignored, with a warning
        CHECK(logs.any("built without fault injection"));
        wkv_context_destroy(ctx);
        MESSAGE("this build has no fault injection (WKV_FAULT_INJECTION=OFF): WKV_FAULT is ignored");
        return;
    }
    for (const char* bad : {"oom@0", "oom@", "oom@x", "boom", "oom:nowhere", "device_lost:scratch",
                            "oom,", ",oom", "no_driver:cpu", "oom@1@2",
                            "oom,oom,oom,oom,oom,oom,oom,oom,oom"}) {
        CAPTURE(bad);
        FaultEnv env(bad);
        wkv_context* ctx = nullptr;
        CHECK(create_cpu(&ctx) == WKV_ERROR_INVALID_ARGUMENT);
        CHECK(ctx == nullptr);
        CHECK(contains(wkv_last_error(nullptr), "WKV_FAULT="));
    }
    for (const char* good : {"oom:buffer", "device_lost:sync@3", "no_driver", "no_driver:vulkan@1",
                             "oom:scratch@2,device_lost@5", "oom:buffer,device_lost:sync"}) {
        CAPTURE(good);
        FaultEnv env(good);
        wkv_context* ctx = nullptr;
        CHECK(create_cpu(&ctx) == WKV_OK); // none of these points is reached by create
        wkv_context_destroy(ctx);
    }
}

TEST_CASE("fault: oom at creation (context, threads, backend state): a status, a message, no leak") {
    if (!faults_compiled_in()) return;
    for (const char* spec : {"oom:context", "oom:threads", "oom:state", "oom@1", "oom@2", "oom@3"}) {
        CAPTURE(spec);
        FaultEnv env(spec);
        wkv_context* ctx = nullptr;
        CHECK(create_cpu(&ctx) == WKV_ERROR_OUT_OF_MEMORY);
        CHECK(ctx == nullptr);
        const std::string why = wkv_last_error(nullptr);
        CAPTURE(why);
        CHECK(contains(why, "wkv_context_create"));
        CHECK((contains(why, "out of memory") || contains(why, "threads") || contains(why, "state")));
    }
    // a host job system has no thread pool: its context never reaches "threads"
    FaultEnv env("oom:threads");
    wkv_context_options o{};
    o.struct_size = sizeof o;
    o.backend = WKV_BACKEND_CPU;
    o.parallel_for = reverse_parallel_for;
    wkv_context* ctx = nullptr;
    CHECK(wkv_context_create(&o, &ctx) == WKV_OK);
    wkv_context_destroy(ctx);
}

TEST_CASE("fault: every allocation of a context's life fails in turn; each is a status, the retry works") {
    if (!faults_compiled_in()) return;
    const uint64_t seed = test_seed();
    CAPTURE(seed);
    Suite suite(seed);
    // WKV_FAULT=oom@n for n = 1, 2, ...: the n-th allocation point of the context fails. Until
    // a run reaches no n-th point: creation, then each op's forward and backward in turn.
    int injected = 0;
    bool reached = true;
    for (int n = 1; reached && n < 64; ++n) {
        const std::string spec = "oom@" + std::to_string(n);
        CAPTURE(spec);
        wkv_context* ctx = nullptr;
        wkv_status st;
        {
            FaultEnv env(spec.c_str());
            st = create_cpu(&ctx);
        }
        if (st != WKV_OK) {
            CHECK(st == WKV_ERROR_OUT_OF_MEMORY);
            CHECK(ctx == nullptr);
            ++injected;
            continue;
        }
        int failed = 0;
        for (size_t i = 0; i < suite.problems.size(); ++i) {
            AnyRun run = any_run(ctx, suite.problems[i], true);
            const int f = check_run(run, suite.refs[i], WKV_ERROR_OUT_OF_MEMORY, op_label(suite.problems[i].op));
            if (f) {
                CHECK(wkv_context_health(ctx) == WKV_OK); // out of memory is not lost
                CHECK(contains(run.forward_msg + run.backward_msg, "cannot allocate"));
                // the fault was the n-th point only: the same call works now
                AnyRun again = any_run(ctx, suite.problems[i], true);
                CHECK(check_run(again, suite.refs[i], WKV_OK, "retry") == 0);
            }
            failed += f;
        }
        injected += failed;
        reached = failed > 0;
        wkv_context_destroy(ctx);
    }
    CHECK(!reached); // the sweep ended: every point was tried
    CHECK(injected >= 4); // context, threads, state, the first forward scratch (it grows as needed)
    MESSAGE("oom sweep: " << injected << " allocation faults injected and survived");
}

TEST_CASE("fault: device_lost: the context reports it and refuses every later call; others keep working") {
    if (!faults_compiled_in()) return;
    const uint64_t seed = test_seed();
    CAPTURE(seed);
    Suite suite(seed);
    wkv_context* healthy = nullptr;
    REQUIRE(create_cpu(&healthy) == WKV_OK); // created before WKV_FAULT: never fails
    // device_lost@n: the n-th call that hands work to the "device" (a forward or a backward)
    int injected = 0;
    for (int n = 1; n <= 6; ++n) {
        const std::string spec = "device_lost@" + std::to_string(n);
        CAPTURE(spec);
        wkv_context* ctx = nullptr;
        {
            FaultEnv env(spec.c_str());
            REQUIRE(create_cpu(&ctx) == WKV_OK);
        }
        bool lost = false;
        for (size_t i = 0; i < suite.problems.size(); ++i) {
            AnyRun run = any_run(ctx, suite.problems[i], true);
            if (!lost) {
                check_run(run, suite.refs[i], WKV_ERROR_DEVICE_LOST, op_label(suite.problems[i].op));
                lost = run.forward != WKV_OK || run.backward != WKV_OK;
                if (lost) {
                    ++injected;
                    CHECK(contains(run.forward_msg + run.backward_msg, "device was lost"));
                    CHECK(wkv_context_health(ctx) == WKV_ERROR_DEVICE_LOST);
                } else {
                    CHECK(wkv_context_health(ctx) == WKV_OK);
                }
            } else { // every later call: DEVICE_LOST, a message, nothing written
                CHECK(run.forward == WKV_ERROR_DEVICE_LOST);
                CHECK(run.failures_untouched);
                CHECK(contains(run.forward_msg, "lost"));
            }
        }
        REQUIRE(lost);
        // the other entry points of a lost context
        CHECK(wkv_context_synchronize(ctx) == WKV_ERROR_DEVICE_LOST);
        CHECK(contains(wkv_last_error(ctx), "wkv_context_synchronize"));
        wkv_buffer* buf = nullptr;
        CHECK(wkv_buffer_create(ctx, 64, &buf) == WKV_ERROR_DEVICE_LOST);
        CHECK(buf == nullptr);
        size_t bytes = 0;
        wkv_backward_desc g{};
        g.struct_size = sizeof g;
        CHECK(wkv_workspace_size(ctx, &bytes, &g) == WKV_ERROR_DEVICE_LOST);
        CHECK(wkv_context_health(ctx) == WKV_ERROR_DEVICE_LOST);
        CHECK(wkv_context_backend(ctx) == WKV_BACKEND_CPU);
        // the context created before, and one created now, work
        for (size_t i = 0; i < suite.problems.size(); ++i)
            CHECK(check_run(any_run(healthy, suite.problems[i]), suite.refs[i], WKV_OK, "healthy") == 0);
        wkv_context* fresh = nullptr;
        REQUIRE(create_cpu(&fresh) == WKV_OK);
        CHECK(check_run(any_run(fresh, suite.problems[0]), suite.refs[0], WKV_OK, "fresh") == 0);
        wkv_context_destroy(fresh);
        wkv_context_destroy(ctx); // frees everything (ASan / valgrind)
    }
    CHECK(wkv_context_health(healthy) == WKV_OK);
    wkv_context_destroy(healthy);
    CHECK(injected == 6);
    MESSAGE("device_lost: " << injected << " faults injected and survived");
}

TEST_CASE("fault: a scratch allocation that fails leaves outputs untouched, the context healthy") {
    if (!faults_compiled_in()) return;
    const uint64_t seed = test_seed();
    CAPTURE(seed);
    Suite suite(seed);
    wkv_context* ctx = nullptr;
    {
        FaultEnv env("oom:scratch"); // every growth of the forward scratch
        REQUIRE(create_cpu(&ctx) == WKV_OK);
    }
    for (size_t i = 0; i < suite.problems.size(); ++i) {
        AnyRun run = any_run(ctx, suite.problems[i], false);
        CHECK(run.forward == WKV_ERROR_OUT_OF_MEMORY);
        CHECK(run.failures_untouched);
        CHECK(contains(run.forward_msg, "forward scratch"));
        CHECK(wkv_context_health(ctx) == WKV_OK);
    }
    wkv_context_destroy(ctx);
}
