// WKV_CONTEXT_ASYNC on Vulkan (wkv.h, WHEN OUTPUTS ARE READY; vk_internal.h, ASYNC CALLS): a
// call on buffers only returns once submitted, up to WKV_VK_SLOTS of them in flight. Every case
// runs the same RWKV-7 decode loop (T = 1 steps stepping a state buffer in place) on an async
// context and on a synchronous one and requires the same bits: the slots' parameter blocks,
// descriptor sets and replayed command buffers must not be overwritten while pending, and each
// step must see the previous step's state. Under the validation layer (ctest sets
// WKV_VULKAN_VALIDATION=1) every call fails on a validation message, and each case checks the
// async context's count at the end.
#include "wkv_doctest.h"

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan_core.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "test_fault_util.h"
#include "test_util.h"
#include "wkv/wkv_vulkan.h"

using namespace wkvtest;

namespace {

wkv_context* make_vk(uint64_t flags) {
    wkv_context_options o{};
    o.struct_size = sizeof o;
    o.backend = WKV_BACKEND_VULKAN;
    o.flags = flags;
    wkv_context* ctx = nullptr;
    const wkv_status st = wkv_context_create(&o, &ctx);
    INFO(std::string(wkv_last_error(nullptr)));
    REQUIRE(st == WKV_OK);
    return ctx;
}

uint64_t validation_count(wkv_context* ctx) {
    uint64_t n = 0;
    REQUIRE(wkv_vulkan_validation_message_count(ctx, &n) == WKV_OK);
    return n;
}

// A synchronous and an asynchronous context side by side, destroyed at the end of the test.
struct SyncAndAsync {
    wkv_context* sync = make_vk(0);
    wkv_context* async = make_vk(WKV_CONTEXT_ASYNC);
    ~SyncAndAsync() {
        wkv_context_destroy(async);
        wkv_context_destroy(sync);
    }
};

// A decode loop's device data on one context: every token of every input in one [B, T, H, N]
// buffer (step t reads token t through a strided [B, 1, H, N] view at a byte offset), y likewise,
// and the state [B, H, N, N] stepped in place.
struct Decode {
    wkv_context* ctx = nullptr;
    int64_t B = 0, T = 0, H = 0, N = 0;
    wkv_buffer* in[6] = {};
    wkv_buffer* y = nullptr;
    wkv_buffer* state = nullptr;
    int64_t tok_strides[4] = {};

    Decode(wkv_context* c, const Rwkv7Data& d) : ctx(c), B(d.B), T(d.T), H(d.H), N(d.N) {
        const std::vector<double>* src[6] = {&d.r, &d.w, &d.k, &d.v, &d.a, &d.b};
        for (int i = 0; i < 6; i++) {
            const std::vector<float> f(src[i]->begin(), src[i]->end());
            REQUIRE(wkv_buffer_create(ctx, f.size() * 4, &in[i]) == WKV_OK);
            REQUIRE(wkv_buffer_upload(ctx, in[i], 0, f.data(), f.size() * 4) == WKV_OK);
        }
        const std::vector<float> poison(d.tok_count(), std::nanf(""));
        REQUIRE(wkv_buffer_create(ctx, poison.size() * 4, &y) == WKV_OK);
        REQUIRE(wkv_buffer_upload(ctx, y, 0, poison.data(), poison.size() * 4) == WKV_OK);
        const std::vector<float> s0(d.s0.begin(), d.s0.end());
        REQUIRE(wkv_buffer_create(ctx, s0.size() * 4, &state) == WKV_OK);
        REQUIRE(wkv_buffer_upload(ctx, state, 0, s0.data(), s0.size() * 4) == WKV_OK);
        const int64_t st[4] = {T * H * N, H * N, N, 1};
        std::memcpy(tok_strides, st, sizeof st);
    }
    ~Decode() {
        for (auto* b : in) wkv_buffer_destroy(b);
        wkv_buffer_destroy(y);
        wkv_buffer_destroy(state);
    }
    Decode(const Decode&) = delete;
    Decode& operator=(const Decode&) = delete;

    // One step: the inputs' token t_in, y's token t. With t and t_in fixed from step to step
    // every step binds the same ranges, and each slot's recorded command buffer runs again.
    wkv_status step(int64_t t, int64_t t_in) {
        const int64_t tshape[4] = {B, 1, H, N}, sshape[4] = {B, H, N, N};
        wkv_forward_desc f{};
        f.struct_size = sizeof f;
        f.op = WKV_OP_RWKV7;
        f.decay_form = WKV_DECAY_CLAMPW;
        wkv_tensor* dst[6] = {&f.r, &f.w, &f.k, &f.v, &f.a, &f.b};
        for (int i = 0; i < 6; i++) {
            *dst[i] = wkv_tensor_make_buffer(in[i], static_cast<uint64_t>(t_in * H * N * 4), WKV_DTYPE_F32, 4, tshape);
            dst[i]->strides = tok_strides;
        }
        f.y = wkv_tensor_make_buffer(y, static_cast<uint64_t>(t * H * N * 4), WKV_DTYPE_F32, 4, tshape);
        f.y.strides = tok_strides;
        f.state_in = f.state_out = wkv_tensor_make_buffer(state, 0, WKV_DTYPE_F32, 4, sshape);
        return wkv_forward(ctx, &f);
    }

    std::vector<float> download(wkv_buffer* b, size_t count) {
        std::vector<float> out(count);
        REQUIRE(wkv_buffer_download(ctx, b, 0, out.data(), count * 4) == WKV_OK);
        return out;
    }
    std::vector<float> y_all() { return download(y, static_cast<size_t>(B * T * H * N)); }
    std::vector<float> s_all() { return download(state, static_cast<size_t>(B * H * N * N)); }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

} // namespace

TEST_CASE("vulkan async: a decode loop of many T=1 steps equals the synchronous one bit for bit") {
    const uint64_t seed = test_seed();
    Rng rng(seed);
    INFO("seed=" << seed);
    const int64_t B = 2, T = 40, H = 2, N = 64;
    const Rwkv7Data d = random_rwkv7(rng, B, T, H, N, WKV_DECAY_CLAMPW, true);
    std::vector<double> y_ref, sT_ref;
    ref_forward(d, y_ref, sT_ref);
    SyncAndAsync cx;
    wkv_context *sync = cx.sync, *async = cx.async;
    for (int replay = 0; replay < 2; replay++) {
        // replay 0: every step binds other ranges (recorded anew); 1: from step 4 on every
        // step reads token 3 and writes y's token 3, so each slot's command buffer is
        // submitted again (vk_rwkv7.c, replay_key) while the others are pending
        CAPTURE(replay);
        Decode s(sync, d), a(async, d);
        for (int64_t t = 0; t < T; t++) {
            const int64_t tt = replay && t >= 4 ? 3 : t;
            REQUIRE(s.step(tt, tt) == WKV_OK);
            REQUIRE(a.step(tt, tt) == WKV_OK);
        }
        REQUIRE(wkv_context_synchronize(async) == WKV_OK);
        const std::vector<float> ys = s.y_all(), ya = a.y_all(), ss = s.s_all(), sa = a.s_all();
        CHECK(same_bits(ya, ys));
        CHECK(same_bits(sa, ss));
        if (!replay) { // and both are right
            CHECK(rel_err(std::vector<double>(ya.begin(), ya.end()), y_ref) <= 1e-5);
            CHECK(rel_err(std::vector<double>(sa.begin(), sa.end()), sT_ref) <= 1e-5);
        }
    }
    CHECK(validation_count(async) == 0);
}

TEST_CASE("vulkan async: steps gathered into shared command buffers, of any length, equal the synchronous loop") {
    // While the GPU is busy, forwards go into one open command buffer (vk_internal.h, ASYNC
    // CALLS), each with its own descriptor set and region of the parameter block. Two decode
    // loops of different B (parameter blocks of different sizes) on one context, in runs of 1 to
    // 4 steps of one then of the other; at most 1 call per command buffer (none shared), 3
    // (full ones submitted while the GPU is busy) and the default.
    const uint64_t seed = test_seed();
    Rng rng(seed);
    INFO("seed=" << seed);
    const int64_t T = 30, H = 2, N = 32;
    const Rwkv7Data d1 = random_rwkv7(rng, 1, T, H, N, WKV_DECAY_CLAMPW, true);
    const Rwkv7Data d3 = random_rwkv7(rng, 3, T, H, N, WKV_DECAY_CLAMPW, true);
    auto run = [&](wkv_context* ctx, std::vector<float> out[4]) {
        Decode a(ctx, d1), b(ctx, d3);
        int64_t ta = 0, tb = 0;
        for (int turn = 0; ta < T || tb < T; turn++) {
            Decode& x = turn % 2 ? b : a;
            int64_t& t = turn % 2 ? tb : ta;
            for (int i = 0; i < 1 + turn % 4 && t < T; i++, t++) REQUIRE(x.step(t, t) == WKV_OK);
        }
        REQUIRE(wkv_context_synchronize(ctx) == WKV_OK);
        out[0] = a.y_all(), out[1] = a.s_all(), out[2] = b.y_all(), out[3] = b.s_all();
    };
    struct Owned { // destroyed even when a REQUIRE ends the case
        wkv_context* ctx;
        ~Owned() { wkv_context_destroy(ctx); }
    };
    std::vector<float> want[4];
    {
        const Owned sync{make_vk(0)};
        run(sync.ctx, want);
    }
    for (const char* batch : {"1", "3", ""}) {
        CAPTURE(batch);
        if (*batch) setenv("WKV_VULKAN_BATCH", batch, 1); // read when the context is created
        const Owned async{make_vk(WKV_CONTEXT_ASYNC)};
        unsetenv("WKV_VULKAN_BATCH");
        std::vector<float> got[4];
        run(async.ctx, got);
        for (int i = 0; i < 4; i++) CHECK(same_bits(got[i], want[i]));
        CHECK(validation_count(async.ctx) == 0);
    }
}

TEST_CASE("vulkan async: a submission that fails is returned by the call or synchronize that made it") {
    // Which call submits depends on how the steps gathered (vk_internal.h, ASYNC CALLS), so the
    // n-th submission fails at some step or at the synchronize: the calls before it succeed, it
    // returns WKV_ERROR_DEVICE_LOST, every later call is refused, and destroy frees everything.
    if (!faults_compiled_in()) return;
    const uint64_t seed = test_seed();
    Rng rng(seed);
    INFO("seed=" << seed);
    const int64_t T = 24;
    const Rwkv7Data d = random_rwkv7(rng, 1, T, 2, 32, WKV_DECAY_CLAMPW, true);
    int injected = 0;
    // the decode's set-up submits 16 times (8 buffers: zero fill, upload); then the steps
    for (int n = 17; n <= 20; n++) {
        CAPTURE(n);
        wkv_context* ctx = nullptr;
        {
            const FaultEnv env(("device_lost:submit@" + std::to_string(n)).c_str());
            ctx = make_vk(WKV_CONTEXT_ASYNC);
        }
        {
            Decode a(ctx, d);
            int failed_at = -1; // step index, T: the synchronize
            for (int64_t t = 0; t <= T; t++) {
                const wkv_status st = t < T ? a.step(t, t) : wkv_context_synchronize(ctx);
                if (failed_at >= 0) {
                    CHECK(st == WKV_ERROR_DEVICE_LOST);
                } else if (st != WKV_OK) {
                    CHECK(st == WKV_ERROR_DEVICE_LOST);
                    CHECK(contains(wkv_last_error(ctx), "VK_ERROR_DEVICE_LOST"));
                    failed_at = static_cast<int>(t);
                }
            }
            if (failed_at >= 0) {
                ++injected;
                CHECK(wkv_context_health(ctx) == WKV_ERROR_DEVICE_LOST);
                CHECK(wkv_context_synchronize(ctx) == WKV_ERROR_DEVICE_LOST);
            } else {
                CHECK(wkv_context_health(ctx) == WKV_OK); // fewer submissions than n
            }
            for (auto*& b : a.in) b = nullptr; // freed with the context
            a.y = a.state = nullptr;
        }
        wkv_context_destroy(ctx);
    }
    CHECK(injected >= 1); // n = 17: the first step, submitted at once on an idle GPU
}

TEST_CASE("vulkan async: downloads between enqueued steps see every earlier step complete") {
    const uint64_t seed = test_seed();
    Rng rng(seed);
    INFO("seed=" << seed);
    const int64_t B = 1, T = 24, H = 2, N = 32;
    const Rwkv7Data d = random_rwkv7(rng, B, T, H, N, WKV_DECAY_CLAMPW, true);
    SyncAndAsync cx;
    wkv_context *sync = cx.sync, *async = cx.async;
    {
        Decode s(sync, d), a(async, d);
        for (int64_t t = 0; t < T; t++) {
            CAPTURE(t);
            REQUIRE(s.step(t, t) == WKV_OK);
            REQUIRE(a.step(t, t) == WKV_OK);
            if (t % 5 == 4) { // a few steps queue up, then a download without synchronize
                CHECK(same_bits(a.s_all(), s.s_all()));
                CHECK(same_bits(a.y_all(), s.y_all()));
            }
        }
        REQUIRE(wkv_context_synchronize(async) == WKV_OK);
        CHECK(same_bits(a.y_all(), s.y_all()));
    }
    CHECK(validation_count(async) == 0);
}

TEST_CASE("vulkan async: destroying buffers that enqueued calls use waits for them") {
    const uint64_t seed = test_seed();
    Rng rng(seed);
    INFO("seed=" << seed);
    const int64_t B = 1, T = 12, H = 2, N = 32;
    const Rwkv7Data d = random_rwkv7(rng, B, T, H, N, WKV_DECAY_CLAMPW, true);
    SyncAndAsync cx;
    wkv_context *sync = cx.sync, *async = cx.async;
    std::vector<float> s_sync;
    {
        Decode s(sync, d);
        for (int64_t t = 0; t < T; t++) REQUIRE(s.step(t, t) == WKV_OK);
        s_sync = s.s_all();
    }
    {
        // a whole decode's buffers destroyed right after its last step is enqueued
        Decode a(async, d);
        for (int64_t t = 0; t < T; t++) REQUIRE(a.step(t, t) == WKV_OK);
    }
    {
        // a y buffer replaced while steps that write it are pending; the state stays right
        Decode a(async, d);
        for (int64_t t = 0; t < T; t++) {
            if (t == 6) {
                wkv_buffer_destroy(a.y);
                a.y = nullptr;
                REQUIRE(wkv_buffer_create(async, static_cast<uint64_t>(B * T * H * N * 4), &a.y) == WKV_OK);
            }
            REQUIRE(a.step(t, t) == WKV_OK);
        }
        CHECK(same_bits(a.s_all(), s_sync));
    }
    CHECK(wkv_context_synchronize(async) == WKV_OK);
    CHECK(validation_count(async) == 0);
    // a context destroyed with calls pending (it frees the buffers that are left)
    {
        wkv_context* c = make_vk(WKV_CONTEXT_ASYNC);
        Decode a(c, d);
        for (int64_t t = 0; t < T; t++) REQUIRE(a.step(t, t) == WKV_OK);
        wkv_context_destroy(c);
        for (auto*& b : a.in) b = nullptr; // freed with the context
        a.y = a.state = nullptr;
    }
}

TEST_CASE("vulkan async: synchronize with nothing pending, and twice") {
    wkv_context* async = make_vk(WKV_CONTEXT_ASYNC);
    CHECK(wkv_context_synchronize(async) == WKV_OK);
    CHECK(wkv_context_synchronize(async) == WKV_OK);
    Rng rng(test_seed());
    const Rwkv7Data d = random_rwkv7(rng, 1, 3, 1, 32, WKV_DECAY_CLAMPW, true);
    {
        Decode a(async, d);
        REQUIRE(a.step(0, 0) == WKV_OK);
        CHECK(wkv_context_synchronize(async) == WKV_OK);
        CHECK(wkv_context_synchronize(async) == WKV_OK);
    }
    CHECK(validation_count(async) == 0);
    wkv_context_destroy(async);
}

TEST_CASE("vulkan async: a call with host tensors stays synchronous, after the enqueued ones") {
    const uint64_t seed = test_seed();
    Rng rng(seed);
    INFO("seed=" << seed);
    const int64_t B = 1, T = 10, H = 2, N = 32, HN = H * N;
    const Rwkv7Data d = random_rwkv7(rng, B, T, H, N, WKV_DECAY_CLAMPW, true);
    SyncAndAsync cx;
    wkv_context *sync = cx.sync, *async = cx.async;
    {
        Decode s(sync, d), a(async, d);
        for (int64_t t = 0; t < T - 1; t++) {
            REQUIRE(s.step(t, t) == WKV_OK);
            REQUIRE(a.step(t, t) == WKV_OK);
        }
        // the last token from host memory (y too), the state still in its buffer: the call
        // must read the state the enqueued steps leave and have y in place when it returns
        std::vector<float> y_host[2];
        Decode* both[2] = {&s, &a};
        for (int c = 0; c < 2; c++) {
            const int64_t tshape[4] = {B, 1, H, N}, sshape[4] = {B, H, N, N};
            const std::vector<double>* src[6] = {&d.r, &d.w, &d.k, &d.v, &d.a, &d.b};
            std::vector<float> tok[6];
            wkv_forward_desc f{};
            f.struct_size = sizeof f;
            f.op = WKV_OP_RWKV7;
            f.decay_form = WKV_DECAY_CLAMPW;
            wkv_tensor* dst[6] = {&f.r, &f.w, &f.k, &f.v, &f.a, &f.b};
            for (int i = 0; i < 6; i++) {
                tok[i].assign(src[i]->begin() + (T - 1) * HN, src[i]->begin() + T * HN);
                *dst[i] = wkv_tensor_make(tok[i].data(), WKV_DTYPE_F32, 4, tshape);
            }
            y_host[c].assign(static_cast<size_t>(HN), std::nanf(""));
            f.y = wkv_tensor_make(y_host[c].data(), WKV_DTYPE_F32, 4, tshape);
            f.state_in = f.state_out = wkv_tensor_make_buffer(both[c]->state, 0, WKV_DTYPE_F32, 4, sshape);
            REQUIRE(wkv_forward(both[c]->ctx, &f) == WKV_OK);
        }
        // no synchronize: the host output is complete when the call returns
        CHECK(same_bits(y_host[1], y_host[0]));
        for (float v : y_host[1]) REQUIRE(std::isfinite(v));
        CHECK(same_bits(a.s_all(), s.s_all()));
    }
    CHECK(validation_count(async) == 0);
}

TEST_CASE("vulkan async: unknown context flags are refused, naming flags") {
    wkv_context_options o{};
    o.struct_size = sizeof o;
    o.backend = WKV_BACKEND_VULKAN;
    o.flags = 1u << 7;
    wkv_context* ctx = nullptr;
    CHECK(wkv_context_create(&o, &ctx) == WKV_ERROR_INVALID_ARGUMENT);
    CHECK(ctx == nullptr);
    CHECK(std::string(wkv_last_error(nullptr)).find("flags") != std::string::npos);
}
