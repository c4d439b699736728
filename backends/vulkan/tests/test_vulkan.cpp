// The Vulkan backend through the public API, on whatever Vulkan device there is (lavapipe in
// CI), with the Khronos validation layer on (WKV_VULKAN_VALIDATION=1, set by ctest): any
// validation message fails the call during which it arrived, and the suite checks the count.
//
// - golden: every RWKV-7 golden file in f32, f16 and bf16 through tools/common/golden.h (host
//   tensors, staged by the library) — the same checker as `wkv-bench golden`;
// - random: RWKV-7 forward + backward against the CPU backend on the same inputs, over
//   T in {1,2,15,16,17,100} x N in {32,64,128}, every decay form and dtype, strided/head-major/
//   broadcast layouts, both state orders, in-place state, packed sequences (one empty), with
//   the tensors in host memory and in wkv_buffers (workspace in a buffer or in host memory);
//   outputs and workspace poisoned with NaN first, gaps of strided outputs must stay NaN;
// - the memory model: wkv_buffer create/upload/download, the core's span checks, a decode loop
//   whose state never leaves the device.
// RWKV-6/5 and RWKV-4: test_vulkan_ops.cpp.
// WKV_TEST_SEED=<seed> reproduces a run (the seed is printed with failures).
#include "wkv_doctest.h"

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan_core.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "suite_contexts.h"
#include "test_rwkv7_config.h"
#include "test_util.h"
#include "test_util_ops.h"
#include "wkv/wkv_vulkan.h"

using namespace wkvtest;

namespace {

using Contexts = SuiteContexts;

wkv_context* make_context(wkv_backend backend, int threads = 2) {
    wkv_context_options o{};
    o.struct_size = sizeof o;
    o.backend = backend;
    o.cpu_threads = threads;
    wkv_context* ctx = nullptr;
    const wkv_status st = wkv_context_create(&o, &ctx);
    INFO(std::string(wkv_last_error(nullptr)));
    REQUIRE(st == WKV_OK);
    return ctx;
}

Contexts& contexts() { return suite_contexts(); }

uint64_t validation_count(wkv_context* ctx) {
    uint64_t n = 0;
    REQUIRE(wkv_vulkan_validation_message_count(ctx, &n) == WKV_OK);
    return n;
}

// ------------------------------------------------------------------------------ tensors

enum class Mem { Host, Buffer };

// A tensor of a call: a HostTensor, mirrored into a wkv_buffer (same bytes, same strides and
// byte_offset) in Mem::Buffer mode.
struct Arg {
    HostTensor h;
    wkv_context* ctx = nullptr;
    wkv_buffer* buf = nullptr;

    Arg() = default;
    explicit Arg(HostTensor t) : h(std::move(t)) {}
    Arg(const Arg&) = delete;
    Arg& operator=(const Arg&) = delete;
    Arg(Arg&& o) noexcept : h(std::move(o.h)), ctx(o.ctx), buf(o.buf) { o.buf = nullptr; }
    Arg& operator=(Arg&& o) noexcept {
        std::swap(h, o.h);
        std::swap(ctx, o.ctx);
        std::swap(buf, o.buf);
        return *this;
    }
    ~Arg() { wkv_buffer_destroy(buf); }

    // The wkv_tensor for the call; in buffer mode (re)uploads the host bytes first.
    wkv_tensor view(wkv_context* c, Mem m) {
        wkv_tensor t = h.view();
        if (m == Mem::Host) return t;
        ctx = c;
        if (!buf) REQUIRE(wkv_buffer_create(c, h.buf.size(), &buf) == WKV_OK);
        REQUIRE(wkv_buffer_upload(c, buf, 0, h.buf.data(), h.buf.size()) == WKV_OK);
        wkv_tensor b = wkv_tensor_make_buffer(buf, t.byte_offset, t.dtype, t.ndim, t.shape);
        b.strides = t.strides;
        return b;
    }
    // Buffer mode: the device bytes back into h.
    void pull() {
        if (buf) REQUIRE(wkv_buffer_download(ctx, buf, 0, h.buf.data(), h.buf.size()) == WKV_OK);
    }
};

// The shared RWKV-7 configuration (tests/test_rwkv7_config.h) with this file's defaults (N = 32,
// every state option on) and what only the Vulkan cases vary: packed sequences, memory kinds.
struct Config : Rwkv7Config {
    std::vector<int64_t> offsets; // packed when not empty (B = 1)
    Mem mem = Mem::Host;
    bool ws_buffer = false;        // workspace: a wkv_buffer (Mem::Buffer only) or host memory

    Config() {
        N = 32;
        state_in = state_out = dstate_out = dstate_in = true;
    }
    int64_t S() const { return offsets.empty() ? B : static_cast<int64_t>(offsets.size()) - 1; }
    std::string describe() const {
        std::ostringstream s;
        s << Rwkv7Config::describe() << " packed=" << offsets.size()
          << " mem=" << (mem == Mem::Host ? "host" : "buffer") << " ws_buffer=" << ws_buffer;
        return s.str();
    }
};

HostTensor token_tensor(const Config& c, bool broadcast_t = false) { return wkvtest::token_tensor(c, c.dtype, broadcast_t); }

HostTensor state_tensor(const Config& c) { return wkvtest::state_tensor(c, c.S()); }

std::vector<double> lib_state(const Config& c, const std::vector<double>& x) { return wkvtest::to_lib_state(c, c.S(), x); }

struct Problem {
    std::vector<double> in[6]; // r w k v a b, rounded to the dtype
    std::vector<double> s0, dy, dsT;
};

Problem make_problem(const Config& c, Rng& rng) {
    Rwkv7Data d = random_rwkv7(rng, c.B, c.T, c.H, c.N, c.form, c.state_in && c.offsets.empty());
    Problem p;
    std::vector<double>* src[6] = {&d.r, &d.w, &d.k, &d.v, &d.a, &d.b};
    for (int i = 0; i < 6; i++) p.in[i] = rounded(c.dtype, *src[i]);
    if (c.w_broadcast)
        for (int64_t b = 0; b < c.B; b++)
            for (int64_t t = 1; t < c.T; t++)
                for (int64_t hn = 0; hn < c.H * c.N; hn++)
                    p.in[1][static_cast<size_t>((b * c.T + t) * c.H * c.N + hn)] =
                        p.in[1][static_cast<size_t>(b * c.T * c.H * c.N + hn)];
    const size_t state_n = static_cast<size_t>(c.S() * c.H * c.N * c.N);
    if (c.state_in) p.s0 = c.offsets.empty() ? rounded(WKV_DTYPE_F32, d.s0) : rounded(WKV_DTYPE_F32, random_normal(rng, state_n, 0.3));
    p.dy = rounded(c.dtype, random_normal(rng, d.tok_count()));
    if (c.dstate_out) p.dsT = rounded(WKV_DTYPE_F32, random_normal(rng, state_n));
    return p;
}

struct Results {
    std::vector<double> y, sT, g[6], ds0;
};

// wkv_forward then wkv_backward on ctx, every output and the workspace poisoned first.
Results run(wkv_context* ctx, const Config& c, const Problem& p) {
    const Mem m = c.mem;
    Arg in[6];
    for (int i = 0; i < 6; i++) {
        in[i] = Arg(token_tensor(c, i == 1 && c.w_broadcast));
        in[i].h.poison();
        in[i].h.fill(p.in[i]);
    }
    Arg y(token_tensor(c)), s_in(state_tensor(c)), s_out(state_tensor(c));
    s_in.h.poison();
    if (c.state_in) s_in.h.fill(lib_state(c, p.s0));
    y.h.poison();
    s_out.h.poison();

    wkv_forward_desc f{};
    f.struct_size = sizeof f;
    f.op = WKV_OP_RWKV7;
    f.decay_form = c.form;
    f.flags = c.key_major ? static_cast<uint32_t>(WKV_FLAG_STATE_KEY_MAJOR) : 0u;
    wkv_tensor* fin[6] = {&f.r, &f.w, &f.k, &f.v, &f.a, &f.b};
    for (int i = 0; i < 6; i++) *fin[i] = in[i].view(ctx, m);
    f.y = y.view(ctx, m);
    if (c.state_in) f.state_in = s_in.view(ctx, m);
    if (c.state_out) f.state_out = c.in_place ? f.state_in : s_out.view(ctx, m);
    if (!c.offsets.empty()) {
        f.seq_offsets = c.offsets.data();
        f.num_seqs = static_cast<int64_t>(c.offsets.size()) - 1;
    }
    wkv_status st = wkv_forward(ctx, &f);
    {
        INFO("wkv_forward: " << std::string(wkv_last_error(ctx)));
        REQUIRE(st == WKV_OK);
    }
    Results r;
    y.pull();
    r.y = y.h.read();
    CHECK(y.h.gaps_still_nan());
    if (c.state_out) {
        Arg& so = c.in_place ? s_in : s_out;
        so.pull();
        r.sT = lib_state(c, so.h.read());
        CHECK(so.h.gaps_still_nan());
    }
    // backward: state_in again holds s0 (an in-place forward overwrote it)
    if (c.state_in && c.in_place) {
        s_in.h.poison();
        s_in.h.fill(lib_state(c, p.s0));
        f.state_in = s_in.view(ctx, m);
    }
    Arg dy(token_tensor(c)), ds_out(state_tensor(c)), ds_in(state_tensor(c));
    dy.h.poison();
    dy.h.fill(p.dy);
    ds_out.h.poison();
    if (c.dstate_out) ds_out.h.fill(lib_state(c, p.dsT));
    ds_in.h.poison();
    Arg g[6];
    wkv_backward_desc bd{};
    bd.struct_size = sizeof bd;
    bd.forward = &f;
    bd.dy = dy.view(ctx, m);
    if (c.dstate_out) bd.dstate_out = ds_out.view(ctx, m);
    wkv_tensor* gout[6] = {&bd.dr, &bd.dw, &bd.dk, &bd.dv, &bd.da, &bd.db};
    for (int i = 0; i < 6; i++) {
        g[i] = Arg(token_tensor(c));
        g[i].h.poison();
        *gout[i] = g[i].view(ctx, m);
    }
    if (c.dstate_in) bd.dstate_in = ds_in.view(ctx, m);
    size_t bytes = 0;
    st = wkv_workspace_size(ctx, &bytes, &bd);
    {
        INFO("wkv_workspace_size: " << std::string(wkv_last_error(ctx)));
        REQUIRE(st == WKV_OK);
    }
    std::vector<unsigned char> ws(bytes + 1, 0xff); // NaN
    wkv_buffer* wsb = nullptr;
    if (c.ws_buffer && m == Mem::Buffer) {
        REQUIRE(wkv_buffer_create(ctx, bytes, &wsb) == WKV_OK);
        REQUIRE(wkv_buffer_upload(ctx, wsb, 0, ws.data(), bytes) == WKV_OK);
        bd.workspace = wsb;
    } else {
        bd.workspace = ws.data();
    }
    bd.workspace_size = bytes;
    st = wkv_backward(ctx, &bd);
    wkv_buffer_destroy(wsb);
    {
        INFO("wkv_backward: " << std::string(wkv_last_error(ctx)));
        REQUIRE(st == WKV_OK);
    }
    for (int i = 0; i < 6; i++) {
        g[i].pull();
        r.g[i] = g[i].h.read();
        CHECK(g[i].h.gaps_still_nan());
    }
    if (c.dstate_in) {
        ds_in.pull();
        r.ds0 = lib_state(c, ds_in.h.read());
        CHECK(ds_in.h.gaps_still_nan());
    }
    return r;
}

void compare(const Config& c, const Results& vk, const Results& cpu, uint64_t seed) {
    const bool half = c.dtype.bits == 16;
    const double tol_f = half ? 5e-3 : 2e-5, tol_g = half ? 1e-2 : 2e-5;
    INFO("seed=" << seed << " " << c.describe());
    CHECK(rel_err(vk.y, cpu.y) <= tol_f);
    if (c.state_out) CHECK(rel_err(vk.sT, cpu.sT) <= tol_f);
    static const char* names[6] = {"dr", "dw", "dk", "dv", "da", "db"};
    for (int i = 0; i < 6; i++) {
        INFO(names[i]);
        CHECK(rel_err(vk.g[i], cpu.g[i]) <= tol_g);
    }
    if (c.dstate_in) CHECK(rel_err(vk.ds0, cpu.ds0) <= tol_g);
}

void check_case(const Config& c, uint64_t seed) {
    Rng rng(seed);
    const Problem p = make_problem(c, rng);
    Config host = c;
    host.mem = Mem::Host;
    host.ws_buffer = false;
    const Results ref = run(contexts().cpu, host, p);
    const Results got = run(contexts().vk, c, p);
    compare(c, got, ref, seed);
}

} // namespace

// ------------------------------------------------------------------------------ info, API

TEST_CASE("vulkan: backend info claims RWKV-7, every dtype and form, N = 32, 64, 128") {
    wkv_backend_info info{};
    info.struct_size = sizeof info;
    REQUIRE(wkv_backend_get_info(WKV_BACKEND_VULKAN, &info) == WKV_OK);
    CHECK(info.available == 1);
    CHECK(info.device_count >= 1);
    CHECK((info.ops & (1u << WKV_OP_RWKV7)) != 0);
    CHECK(info.dtypes == 7u);
    CHECK(info.decay_forms == ((1u << 1) | (1u << 2) | (1u << 3) | (1u << 4)));
    for (int n : {32, 64, 128}) {
        bool found = false;
        for (int i = 0; i < info.num_head_sizes; i++) found |= info.head_sizes[i] == n;
        CHECK_MESSAGE(found, "head size " << n);
    }
    wkv_device_info dev{};
    dev.struct_size = sizeof dev;
    CHECK(wkv_device_get_info(WKV_BACKEND_VULKAN, 0, &dev) == WKV_OK);
    CHECK(std::string(dev.name).size() > 0);
    CHECK(wkv_context_backend(contexts().vk) == WKV_BACKEND_VULKAN);
}

TEST_CASE("vulkan: buffers: zero-filled, upload/download round trip, range checks") {
    wkv_context* ctx = contexts().vk;
    wkv_buffer* b = nullptr;
    REQUIRE(wkv_buffer_create(ctx, 1001, &b) == WKV_OK);
    CHECK(wkv_buffer_size(b) == 1001);
    std::vector<unsigned char> got(1001, 0xab), data(1001);
    REQUIRE(wkv_buffer_download(ctx, b, 0, got.data(), got.size()) == WKV_OK);
    CHECK(got == std::vector<unsigned char>(1001, 0));
    for (size_t i = 0; i < data.size(); i++) data[i] = static_cast<unsigned char>(i * 7 + 3);
    REQUIRE(wkv_buffer_upload(ctx, b, 0, data.data(), data.size()) == WKV_OK);
    REQUIRE(wkv_buffer_upload(ctx, b, 13, data.data(), 5) == WKV_OK);
    for (size_t i = 0; i < 5; i++) data[13 + i] = data[i];
    REQUIRE(wkv_buffer_download(ctx, b, 0, got.data(), got.size()) == WKV_OK);
    CHECK(got == data);
    CHECK(wkv_context_synchronize(ctx) == WKV_OK);  // a no-op: every call is complete on return
    CHECK(wkv_buffer_upload(ctx, b, 1000, data.data(), 2) == WKV_ERROR_INVALID_ARGUMENT);
    CHECK(wkv_buffer_download(ctx, b, 0, nullptr, 4) == WKV_ERROR_NULL_POINTER);
    CHECK(wkv_buffer_create(ctx, 0, &b) == WKV_ERROR_INVALID_ARGUMENT);
    CHECK(b == nullptr);
    wkv_buffer_destroy(nullptr);
    // the CPU backend has no device buffers
    wkv_buffer* c = nullptr;
    CHECK(wkv_buffer_create(contexts().cpu, 64, &c) == WKV_ERROR_UNSUPPORTED);
    CHECK(c == nullptr);
    CHECK(std::string(wkv_last_error(contexts().cpu)).find("no device buffers") != std::string::npos);
}

TEST_CASE("vulkan: the core checks buffer tensors (ownership, span, offset, workspace)") {
    wkv_context* ctx = contexts().vk;
    const int64_t B = 1, T = 3, H = 1, N = 32, E = B * T * H * N;
    int64_t shape[4] = {B, T, H, N};
    wkv_buffer* buf = nullptr;
    REQUIRE(wkv_buffer_create(ctx, 8 * E * 4, &buf) == WKV_OK);
    wkv_forward_desc f{};
    f.struct_size = sizeof f;
    f.op = WKV_OP_RWKV7;
    f.decay_form = WKV_DECAY_LOG;
    wkv_tensor* t[7] = {&f.r, &f.w, &f.k, &f.v, &f.a, &f.b, &f.y};
    for (int i = 0; i < 7; i++) *t[i] = wkv_tensor_make_buffer(buf, static_cast<uint64_t>(i) * E * 4, WKV_DTYPE_F32, 4, shape);
    CHECK(wkv_forward(ctx, &f) == WKV_OK);
    // y past the end of the buffer
    f.y.byte_offset = 7 * E * 4 + 4;
    CHECK(wkv_forward(ctx, &f) == WKV_ERROR_SHAPE);
    CHECK(std::string(wkv_last_error(ctx)).find("desc->y") != std::string::npos);
    // not a multiple of the element size
    f.y.byte_offset = 6 * E * 4 + 2;
    CHECK(wkv_forward(ctx, &f) == WKV_ERROR_INVALID_ARGUMENT);
    // y overlapping an input in the same buffer
    f.y.byte_offset = 5 * E * 4 + 4;
    CHECK(wkv_forward(ctx, &f) == WKV_ERROR_ALIASING);
    f.y.byte_offset = 6 * E * 4;
    // a pointer that is not a wkv_buffer of this context
    float host[E];
    wkv_tensor bad = f.r;
    f.r.data = host;
    CHECK(wkv_forward(ctx, &f) == WKV_ERROR_DEVICE_MISMATCH);
    f.r = bad;
    // a buffer of another Vulkan context
    wkv_context* other = make_context(WKV_BACKEND_VULKAN);
    wkv_buffer* foreign = nullptr;
    REQUIRE(wkv_buffer_create(other, 8 * E * 4, &foreign) == WKV_OK);
    f.r.data = foreign;
    CHECK(wkv_forward(ctx, &f) == WKV_ERROR_DEVICE_MISMATCH);
    f.r = bad;
    wkv_buffer_destroy(foreign);
    wkv_context_destroy(other);
    // a workspace buffer too small / big enough
    wkv_backward_desc bd{};
    bd.struct_size = sizeof bd;
    bd.forward = &f;
    bd.dy = f.y;
    wkv_buffer* grads = nullptr;
    REQUIRE(wkv_buffer_create(ctx, 6 * E * 4, &grads) == WKV_OK);
    wkv_tensor* gt[6] = {&bd.dr, &bd.dw, &bd.dk, &bd.dv, &bd.da, &bd.db};
    for (int i = 0; i < 6; i++) *gt[i] = wkv_tensor_make_buffer(grads, static_cast<uint64_t>(i) * E * 4, WKV_DTYPE_F32, 4, shape);
    size_t need = 0;
    REQUIRE(wkv_workspace_size(ctx, &need, &bd) == WKV_OK);
    wkv_buffer* ws = nullptr;
    REQUIRE(wkv_buffer_create(ctx, need, &ws) == WKV_OK);
    bd.workspace = ws;
    bd.workspace_size = need - 4;
    CHECK(wkv_backward(ctx, &bd) == WKV_ERROR_WORKSPACE_TOO_SMALL);
    bd.workspace_size = need + 4;
    CHECK(wkv_backward(ctx, &bd) == WKV_ERROR_SHAPE); // larger than the buffer
    bd.workspace_size = need;
    CHECK(wkv_backward(ctx, &bd) == WKV_OK);
    // the workspace may not be a buffer holding a tensor of the call
    bd.workspace = grads;
    bd.workspace_size = need;
    CHECK(wkv_backward(ctx, &bd) != WKV_OK);
    wkv_buffer_destroy(ws);
    wkv_buffer_destroy(grads);
    wkv_buffer_destroy(buf);
    // buffer tensors on the CPU backend: not its memory
    int64_t one[4] = {1, 1, 1, 1};
    float x = 0;
    wkv_forward_desc g{};
    g.struct_size = sizeof g;
    g.op = WKV_OP_RWKV7;
    g.decay_form = WKV_DECAY_LOG;
    wkv_tensor* gt2[7] = {&g.r, &g.w, &g.k, &g.v, &g.a, &g.b, &g.y};
    for (int i = 0; i < 7; i++) *gt2[i] = wkv_tensor_make(&x, WKV_DTYPE_F32, 4, one);
    g.y.device.type = WKV_DEVICE_VULKAN;
    CHECK(wkv_forward(contexts().cpu, &g) == WKV_ERROR_DEVICE_MISMATCH);
}

TEST_CASE("vulkan: head sizes beyond the device's limits are refused, not computed wrongly") {
    wkv_context* ctx = contexts().vk;
    const int64_t N = 300;
    int64_t shape[4] = {1, 1, 1, N};
    std::vector<float> x(N, 0.5f), y(N);
    wkv_forward_desc f{};
    f.struct_size = sizeof f;
    f.op = WKV_OP_RWKV7;
    f.decay_form = WKV_DECAY_LOG;
    wkv_tensor* t[6] = {&f.r, &f.w, &f.k, &f.v, &f.a, &f.b};
    for (auto* p : t) *p = wkv_tensor_make(x.data(), WKV_DTYPE_F32, 4, shape);
    f.y = wkv_tensor_make(y.data(), WKV_DTYPE_F32, 4, shape);
    CHECK(wkv_forward(ctx, &f) == WKV_ERROR_UNSUPPORTED);
    CHECK(std::string(wkv_last_error(ctx)).find("head size") != std::string::npos);
}

TEST_CASE("vulkan: guest mode needs its options (the rest: test_vulkan_guest.cpp)") {
    wkv_context* out = reinterpret_cast<wkv_context*>(1);
    CHECK(wkv_vulkan_context_create(nullptr, nullptr, &out) == WKV_ERROR_NULL_POINTER);
    CHECK(out == nullptr);
    CHECK(std::string(wkv_last_error(nullptr)).find("guest") != std::string::npos);
}

// ------------------------------------------------------------------------------ golden

TEST_CASE("vulkan golden: every RWKV-7 file, f32/f16/bf16") {
    CHECK(check_golden_files(WKV_BACKEND_VULKAN, {"wkv7_"}) >= 24);
}

// ------------------------------------------------------------------------------ random

TEST_CASE("vulkan random: T x N grid against the CPU backend, host and buffer tensors") {
    const uint64_t seed = test_seed();
    const wkv_decay_form forms[4] = {WKV_DECAY_CLAMPW, WKV_DECAY_LOG, WKV_DECAY_EXP_NEG_EXP, WKV_DECAY_DIRECT};
    const wkv_dtype dtypes[3] = {WKV_DTYPE_F32, WKV_DTYPE_BF16, WKV_DTYPE_F16};
    const Layout layouts[3] = {Layout::Contiguous, Layout::Transposed, Layout::PaddedT};
    int k = 0;
    for (int64_t T : {1, 2, 15, 16, 17, 100}) {
        for (int64_t N : {32, 64, 128}) {
            Config c;
            c.B = 2;
            c.T = T;
            c.H = N == 128 ? 1 : 2;
            c.N = N;
            c.form = forms[k % 4];
            c.dtype = dtypes[k % 3];
            c.layout = layouts[(k / 2) % 3];
            c.key_major = k % 2 == 1;
            c.padded_state = k % 3 == 2;
            c.w_broadcast = k % 5 == 3;
            c.state_in = k % 7 != 6;
            c.in_place = k % 4 == 1 && c.state_in; // state_out = state_in needs a state_in
            c.dstate_out = k % 6 != 5;
            c.mem = k % 2 == 0 ? Mem::Buffer : Mem::Host;
            c.ws_buffer = k % 4 == 0;
            check_case(c, seed + static_cast<uint64_t>(k));
            ++k;
        }
    }
}

// The forwards hold a state row as vec4 columns split over C lanes (shaders/wkv_rows.glsl):
// head sizes that are not a multiple of 4 or of 4C run through the zero-padded columns.
TEST_CASE("vulkan random: head sizes off the vec4 and lane grid (1, 3, 20, 33, 48)") {
    const uint64_t seed = test_seed();
    int k = 0;
    for (int64_t N : {1, 3, 20, 33, 48}) {
        for (int64_t T : {1, 17}) {
            Config c;
            c.B = 2;
            c.T = T;
            c.H = 2;
            c.N = N;
            c.form = k % 2 ? WKV_DECAY_LOG : WKV_DECAY_CLAMPW;
            c.dtype = k % 3 == 2 ? WKV_DTYPE_BF16 : WKV_DTYPE_F32;
            c.key_major = k % 2 == 1;
            c.in_place = k % 4 == 0;
            c.mem = k % 2 == 0 ? Mem::Buffer : Mem::Host;
            check_case(c, seed + 500 + static_cast<uint64_t>(k));
            ++k;
        }
    }
}

TEST_CASE("vulkan random: packed sequences (one empty), both state orders and memories") {
    const uint64_t seed = test_seed();
    int k = 0;
    for (bool key_major : {false, true}) {
        for (Mem m : {Mem::Host, Mem::Buffer}) {
            Config c;
            c.B = 1;
            c.T = 45;
            c.H = 2;
            c.N = 64;
            c.offsets = {0, 5, 5, 40, 45};
            c.form = key_major ? WKV_DECAY_LOG : WKV_DECAY_CLAMPW;
            c.dtype = m == Mem::Host ? WKV_DTYPE_F32 : WKV_DTYPE_BF16;
            c.key_major = key_major;
            c.in_place = key_major;
            c.mem = m;
            c.ws_buffer = m == Mem::Buffer;
            check_case(c, seed + 1000 + static_cast<uint64_t>(k++));
        }
    }
}

TEST_CASE("vulkan random: no state at all, w broadcast over T, f16") {
    const uint64_t seed = test_seed();
    Config c;
    c.B = 3;
    c.T = 33;
    c.H = 2;
    c.N = 32;
    c.dtype = WKV_DTYPE_F16;
    c.state_in = c.state_out = c.dstate_out = c.dstate_in = false;
    c.w_broadcast = true;
    c.mem = Mem::Buffer;
    check_case(c, seed + 2000);
}

// ------------------------------------------------------------------------------ decode

namespace {

// Token t of every sequence of a [B, T, H*N] float64 input, as float32 [B, 1, H*N].
std::vector<float> token_slice(const std::vector<double>& x, int64_t B, int64_t T, int64_t HN, int64_t t) {
    std::vector<float> out(static_cast<size_t>(B * HN));
    for (int64_t b = 0; b < B; b++)
        for (int64_t e = 0; e < HN; e++)
            out[static_cast<size_t>(b * HN + e)] = static_cast<float>(x[static_cast<size_t>((b * T + t) * HN + e)]);
    return out;
}

// Puts one step's y [B, 1, H*N] at token t of y_all [B, T, H*N].
void scatter_token(std::vector<double>& y_all, const std::vector<float>& y, int64_t B, int64_t T, int64_t HN,
                   int64_t t) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t e = 0; e < HN; e++)
            y_all[static_cast<size_t>((b * T + t) * HN + e)] = y[static_cast<size_t>(b * HN + e)];
}

wkv_forward_desc rwkv7_clampw_desc() {
    wkv_forward_desc f{};
    f.struct_size = sizeof f;
    f.op = WKV_OP_RWKV7;
    f.decay_form = WKV_DECAY_CLAMPW;
    return f;
}

} // namespace

TEST_CASE("vulkan: a decode loop keeps its state in a buffer, stepped in place") {
    wkv_context* vk = contexts().vk;
    const uint64_t seed = test_seed();
    Rng rng(seed);
    const int64_t B = 2, T = 12, H = 2, N = 64, HN = H * N;
    Rwkv7Data d = random_rwkv7(rng, B, T, H, N, WKV_DECAY_CLAMPW, true);
    std::vector<double> y_ref, sT_ref;
    ref_forward(d, y_ref, sT_ref);

    const int64_t sshape[4] = {B, H, N, N}, tshape[4] = {B, 1, H, N};
    std::vector<float> s0(d.s0.begin(), d.s0.end());
    wkv_buffer* state = nullptr;
    REQUIRE(wkv_buffer_create(vk, s0.size() * 4, &state) == WKV_OK);
    REQUIRE(wkv_buffer_upload(vk, state, 0, s0.data(), s0.size() * 4) == WKV_OK);
    std::vector<double> y_all(static_cast<size_t>(B * T * HN));
    const std::vector<double>* src[6] = {&d.r, &d.w, &d.k, &d.v, &d.a, &d.b};
    for (int64_t t = 0; t < T; t++) {
        std::vector<float> tok[6], y(static_cast<size_t>(B * HN));
        wkv_forward_desc f = rwkv7_clampw_desc();
        wkv_tensor* in[6] = {&f.r, &f.w, &f.k, &f.v, &f.a, &f.b};
        for (int i = 0; i < 6; i++) {
            tok[i] = token_slice(*src[i], B, T, HN, t);
            *in[i] = wkv_tensor_make(tok[i].data(), WKV_DTYPE_F32, 4, tshape);
        }
        f.y = wkv_tensor_make(y.data(), WKV_DTYPE_F32, 4, tshape);
        f.state_in = f.state_out = wkv_tensor_make_buffer(state, 0, WKV_DTYPE_F32, 4, sshape);
        REQUIRE(wkv_forward(vk, &f) == WKV_OK);
        scatter_token(y_all, y, B, T, HN, t);
    }
    std::vector<float> sT(s0.size());
    REQUIRE(wkv_buffer_download(vk, state, 0, sT.data(), sT.size() * 4) == WKV_OK);
    wkv_buffer_destroy(state);
    INFO("seed=" << seed);
    CHECK(rel_err(y_all, y_ref) <= 1e-5);
    CHECK(rel_err(std::vector<double>(sT.begin(), sT.end()), sT_ref) <= 1e-5);
}

// Every tensor in a buffer: from the second step on, the forward submits its recorded command
// buffer again (vk_rwkv7.c, replay_key). Between steps the token buffers get new contents;
// at step 4 the y buffer is replaced (a destroyed buffer's handle may come back), at step 8 a
// host-tensor forward on the same context records something else into the command buffer.
// Every step must still read this step's inputs and write where it is told.
TEST_CASE("vulkan: a decode loop entirely in buffers (recorded command buffer submitted again)") {
    wkv_context* vk = contexts().vk;
    const uint64_t seed = test_seed();
    Rng rng(seed);
    const int64_t B = 2, T = 12, H = 2, N = 32, HN = H * N;
    Rwkv7Data d = random_rwkv7(rng, B, T, H, N, WKV_DECAY_CLAMPW, true);
    std::vector<double> y_ref, sT_ref;
    ref_forward(d, y_ref, sT_ref);

    const int64_t sshape[4] = {B, H, N, N}, tshape[4] = {B, 1, H, N};
    const size_t tok_bytes = static_cast<size_t>(B * HN) * 4;
    std::vector<float> s0(d.s0.begin(), d.s0.end());
    wkv_buffer* state = nullptr;
    REQUIRE(wkv_buffer_create(vk, s0.size() * 4, &state) == WKV_OK);
    REQUIRE(wkv_buffer_upload(vk, state, 0, s0.data(), s0.size() * 4) == WKV_OK);
    wkv_buffer* tokb[6] = {};
    for (auto& b : tokb) REQUIRE(wkv_buffer_create(vk, tok_bytes, &b) == WKV_OK);
    wkv_buffer* yb = nullptr;
    REQUIRE(wkv_buffer_create(vk, tok_bytes, &yb) == WKV_OK);
    std::vector<double> y_all(static_cast<size_t>(B * T * HN));
    const std::vector<double>* src[6] = {&d.r, &d.w, &d.k, &d.v, &d.a, &d.b};
    for (int64_t t = 0; t < T; t++) {
        if (t == 4) { // a new y buffer: nothing recorded may still write to the old one
            wkv_buffer_destroy(yb);
            REQUIRE(wkv_buffer_create(vk, tok_bytes, &yb) == WKV_OK);
        }
        if (t == 8) { // something else recorded into the context's command buffer
            Rng other(seed + 1);
            Rwkv7Data e = random_rwkv7(other, 1, 3, H, N, WKV_DECAY_CLAMPW, false);
            std::vector<float> r(e.r.begin(), e.r.end()), w(e.w.begin(), e.w.end()), k(e.k.begin(), e.k.end()),
                v(e.v.begin(), e.v.end()), a(e.a.begin(), e.a.end()), bb(e.b.begin(), e.b.end()), y(e.r.size());
            const int64_t shape[4] = {1, 3, H, N};
            wkv_forward_desc f = rwkv7_clampw_desc();
            f.r = wkv_tensor_make(r.data(), WKV_DTYPE_F32, 4, shape);
            f.w = wkv_tensor_make(w.data(), WKV_DTYPE_F32, 4, shape);
            f.k = wkv_tensor_make(k.data(), WKV_DTYPE_F32, 4, shape);
            f.v = wkv_tensor_make(v.data(), WKV_DTYPE_F32, 4, shape);
            f.a = wkv_tensor_make(a.data(), WKV_DTYPE_F32, 4, shape);
            f.b = wkv_tensor_make(bb.data(), WKV_DTYPE_F32, 4, shape);
            f.y = wkv_tensor_make(y.data(), WKV_DTYPE_F32, 4, shape);
            REQUIRE(wkv_forward(vk, &f) == WKV_OK);
        }
        wkv_forward_desc f = rwkv7_clampw_desc();
        wkv_tensor* in[6] = {&f.r, &f.w, &f.k, &f.v, &f.a, &f.b};
        for (int i = 0; i < 6; i++) {
            const std::vector<float> tok = token_slice(*src[i], B, T, HN, t);
            REQUIRE(wkv_buffer_upload(vk, tokb[i], 0, tok.data(), tok_bytes) == WKV_OK);
            *in[i] = wkv_tensor_make_buffer(tokb[i], 0, WKV_DTYPE_F32, 4, tshape);
        }
        std::vector<float> poison(static_cast<size_t>(B * HN), std::nanf("")), y(static_cast<size_t>(B * HN));
        REQUIRE(wkv_buffer_upload(vk, yb, 0, poison.data(), tok_bytes) == WKV_OK);
        f.y = wkv_tensor_make_buffer(yb, 0, WKV_DTYPE_F32, 4, tshape);
        f.state_in = f.state_out = wkv_tensor_make_buffer(state, 0, WKV_DTYPE_F32, 4, sshape);
        REQUIRE(wkv_forward(vk, &f) == WKV_OK);
        REQUIRE(wkv_buffer_download(vk, yb, 0, y.data(), tok_bytes) == WKV_OK);
        scatter_token(y_all, y, B, T, HN, t);
    }
    std::vector<float> sT(s0.size());
    REQUIRE(wkv_buffer_download(vk, state, 0, sT.data(), sT.size() * 4) == WKV_OK);
    for (auto* b : tokb) wkv_buffer_destroy(b);
    wkv_buffer_destroy(yb);
    wkv_buffer_destroy(state);
    INFO("seed=" << seed);
    CHECK(rel_err(y_all, y_ref) <= 1e-5);
    CHECK(rel_err(std::vector<double>(sT.begin(), sT.end()), sT_ref) <= 1e-5);
}

TEST_CASE("vulkan: no validation message during the suite") {
    CHECK(validation_count(contexts().vk) == 0);
}

// ------------------------------------------------------------------- the shared contexts

namespace wkvtest {

namespace {
SuiteContexts g_suite; // trivially destructible: nothing of it runs at exit (suite_contexts.h)
}

SuiteContexts& suite_contexts() {
    if (!g_suite.vk) g_suite.vk = make_context(WKV_BACKEND_VULKAN);
    if (!g_suite.cpu) g_suite.cpu = make_context(WKV_BACKEND_CPU);
    return g_suite;
}

void suite_contexts_destroy() {
    wkv_context_destroy(g_suite.vk);
    wkv_context_destroy(g_suite.cpu);
    g_suite = SuiteContexts{};
}

} // namespace wkvtest
