// Every kind of bad input gets its status and a message naming the argument; nothing is written
// to any output (outputs are NaN-poisoned before each call and must stay NaN); the library never
// prints.
#include "wkv_doctest.h"

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <functional>
#include <set>
#include <string>
#include <unistd.h>

#include "test_util.h"

using namespace wkvtest;

namespace {

bool all_nan(const HostTensor& t) {
    for (size_t e = 0; e < t.buf.size() / t.elem_size(); ++e)
        if (!std::isnan(t.load(static_cast<int64_t>(e)))) return false;
    return true;
}

struct CpuContext {
    wkv_context* ctx = nullptr;
    explicit CpuContext(int threads = 1) {
        wkv_context_options o{};
        o.struct_size = sizeof o;
        o.backend = WKV_BACKEND_CPU;
        o.cpu_threads = threads;
        REQUIRE(wkv_context_create(&o, &ctx) == WKV_OK);
    }
    ~CpuContext() { wkv_context_destroy(ctx); }
};

// A valid small RWKV-7 forward + backward call, which each case then breaks in one way.
struct Fixture {
    static constexpr int64_t B = 2, T = 3, H = 2, N = 4;
    HostTensor r, w, k, v, a, b, y, s_in, s_out;
    HostTensor dy, dr, dw, dk, dv, da, db, ds_in;
    std::vector<unsigned char> workspace;
    wkv_forward_desc f{};
    wkv_backward_desc g{};

    Fixture() {
        Rng rng(1);
        Rwkv7Data d = random_rwkv7(rng, B, T, H, N, WKV_DECAY_CLAMPW, true);
        std::vector<int64_t> tok = d.tok_shape(), st = d.state_shape();
        HostTensor* ins[] = {&r, &w, &k, &v, &a, &b};
        auto vals = d.inputs();
        for (int i = 0; i < 6; ++i) {
            *ins[i] = HostTensor(WKV_DTYPE_F32, tok);
            ins[i]->fill(*vals[static_cast<size_t>(i)]);
        }
        s_in = HostTensor(WKV_DTYPE_F32, st);
        s_in.fill(d.s0);
        for (HostTensor* o : {&y, &dy, &dr, &dw, &dk, &dv, &da, &db}) *o = HostTensor(WKV_DTYPE_F32, tok);
        dy.fill(random_normal(rng, d.tok_count()));
        s_out = HostTensor(WKV_DTYPE_F32, st);
        ds_in = HostTensor(WKV_DTYPE_F32, st);
        poison();
        f.struct_size = sizeof f;
        f.op = WKV_OP_RWKV7;
        f.decay_form = WKV_DECAY_CLAMPW;
        f.r = r.view(), f.w = w.view(), f.k = k.view(), f.v = v.view(), f.a = a.view(), f.b = b.view();
        f.y = y.view();
        f.state_in = s_in.view();
        f.state_out = s_out.view();
        g.struct_size = sizeof g;
        g.forward = &f;
        g.dy = dy.view();
        g.dr = dr.view(), g.dw = dw.view(), g.dk = dk.view(), g.dv = dv.view(), g.da = da.view(),
        g.db = db.view();
        g.dstate_in = ds_in.view();
    }
    void poison() {
        for (HostTensor* o : {&y, &s_out, &dr, &dw, &dk, &dv, &da, &db, &ds_in}) o->poison();
    }
    bool outputs_untouched() const {
        for (const HostTensor* o : {&y, &s_out, &dr, &dw, &dk, &dv, &da, &db, &ds_in})
            if (!all_nan(*o)) return false;
        return true;
    }
    void give_workspace(wkv_context* ctx) {
        size_t bytes = 0;
        REQUIRE(wkv_workspace_size(ctx, &bytes, &g) == WKV_OK);
        workspace.assign(bytes + 1, 0);
        g.workspace = workspace.data();
        g.workspace_size = bytes;
    }
};

// Runs one broken forward call and checks status, message and untouched outputs.
void expect_forward_fails(const std::string& what, wkv_status want, const char* needle,
                          const std::function<void(Fixture&)>& breakit) {
    CAPTURE(what);
    CpuContext c;
    Fixture fx;
    breakit(fx);
    wkv_status got = wkv_forward(c.ctx, &fx.f);
    std::string msg = wkv_last_error(c.ctx);
    CAPTURE(msg);
    CHECK(wkv_status_string(got) == std::string(wkv_status_string(want)));
    CHECK(msg.find(needle) != std::string::npos);
    CHECK(fx.outputs_untouched());
}

void expect_backward_fails(const std::string& what, wkv_status want, const char* needle,
                           const std::function<void(Fixture&, wkv_context*)>& breakit) {
    CAPTURE(what);
    CpuContext c;
    Fixture fx;
    fx.give_workspace(c.ctx);
    breakit(fx, c.ctx);
    wkv_status got = wkv_backward(c.ctx, &fx.g);
    std::string msg = wkv_last_error(c.ctx);
    CAPTURE(msg);
    CHECK(wkv_status_string(got) == std::string(wkv_status_string(want)));
    CHECK(msg.find(needle) != std::string::npos);
    CHECK(fx.outputs_untouched());
}

// Redirects stderr and stdout to a temporary file for the life of the object.
struct CaptureStdio {
    int saved_out = -1, saved_err = -1;
    FILE* tmp = nullptr;
    CaptureStdio() {
        fflush(stdout);
        fflush(stderr);
        tmp = tmpfile();
        saved_out = dup(1);
        saved_err = dup(2);
        dup2(fileno(tmp), 1);
        dup2(fileno(tmp), 2);
    }
    std::string finish() {
        fflush(stdout);
        fflush(stderr);
        dup2(saved_out, 1);
        dup2(saved_err, 2);
        close(saved_out);
        close(saved_err);
        std::string s;
        rewind(tmp);
        int ch;
        while ((ch = fgetc(tmp)) != EOF) s.push_back(static_cast<char>(ch));
        fclose(tmp);
        return s;
    }
};

}  // namespace

TEST_CASE("the valid fixture succeeds (so each broken case fails for its one reason)") {
    CpuContext c;
    Fixture fx;
    REQUIRE(wkv_forward(c.ctx, &fx.f) == WKV_OK);
    CHECK(std::string(wkv_last_error(c.ctx)).empty());
    fx.give_workspace(c.ctx);
    CHECK(wkv_backward(c.ctx, &fx.g) == WKV_OK);
}

TEST_CASE("bad forward descriptors") {
    {
        CpuContext c;
        CHECK(wkv_forward(c.ctx, nullptr) == WKV_ERROR_NULL_POINTER);
        CHECK(std::string(wkv_last_error(c.ctx)).find("desc is NULL") != std::string::npos);
    }
    expect_forward_fails("struct_size 0", WKV_ERROR_STRUCT_SIZE, "desc->struct_size",
                         [](Fixture& fx) { fx.f.struct_size = 0; });
    expect_forward_fails("struct_size small", WKV_ERROR_STRUCT_SIZE, "struct_size",
                         [](Fixture& fx) { fx.f.struct_size = sizeof(wkv_forward_desc) - 8; });
    expect_forward_fails("op 0", WKV_ERROR_INVALID_ARGUMENT, "desc->op", [](Fixture& fx) { fx.f.op = (wkv_op)0; });
    expect_forward_fails("op 5", WKV_ERROR_INVALID_ARGUMENT, "desc->op", [](Fixture& fx) { fx.f.op = (wkv_op)5; });
    expect_forward_fails("decay_form 0", WKV_ERROR_INVALID_ARGUMENT, "desc->decay_form",
                         [](Fixture& fx) { fx.f.decay_form = (wkv_decay_form)0; });
    expect_forward_fails("decay_form 9", WKV_ERROR_INVALID_ARGUMENT, "desc->decay_form",
                         [](Fixture& fx) { fx.f.decay_form = (wkv_decay_form)9; });
    expect_forward_fails("unknown flag", WKV_ERROR_INVALID_ARGUMENT, "desc->flags",
                         [](Fixture& fx) { fx.f.flags = 1u << 7; });
    expect_forward_fails("rwkv4 flag on rwkv7", WKV_ERROR_INVALID_ARGUMENT, "desc->flags",
                         [](Fixture& fx) { fx.f.flags = WKV_FLAG_RWKV4_STATE_INTERLEAVED; });
    expect_forward_fails("null r", WKV_ERROR_NULL_POINTER, "desc->r.data",
                         [](Fixture& fx) { fx.f.r.data = nullptr; });
    expect_forward_fails("null v", WKV_ERROR_NULL_POINTER, "desc->v.data",
                         [](Fixture& fx) { fx.f.v.data = nullptr; });
    expect_forward_fails("null y", WKV_ERROR_NULL_POINTER, "desc->y.data",
                         [](Fixture& fx) { fx.f.y.data = nullptr; });
    expect_forward_fails("null shape", WKV_ERROR_NULL_POINTER, "desc->k.shape",
                         [](Fixture& fx) { fx.f.k.shape = nullptr; });
    expect_forward_fails("ndim", WKV_ERROR_SHAPE, "desc->k.ndim", [](Fixture& fx) { fx.f.k.ndim = 3; });
    static const int64_t zero_b[4] = {0, 3, 2, 4};
    expect_forward_fails("B = 0", WKV_ERROR_SHAPE, "desc->v.shape[0]", [](Fixture& fx) { fx.f.v.shape = zero_b; });
    static const int64_t neg_t[4] = {2, -3, 2, 4};
    expect_forward_fails("T < 0", WKV_ERROR_SHAPE, "desc->v.shape[1]", [](Fixture& fx) { fx.f.v.shape = neg_t; });
    static const int64_t other_n[4] = {2, 3, 2, 5};
    expect_forward_fails("inconsistent N", WKV_ERROR_SHAPE, "desc->a.shape[3]",
                         [](Fixture& fx) { fx.f.a.shape = other_n; });
    expect_forward_fails("only v has another head size", WKV_ERROR_SHAPE, "desc->v.shape[3]",
                         [](Fixture& fx) { fx.f.v.shape = other_n; });
    expect_forward_fails("only v has another length", WKV_ERROR_SHAPE, "desc->v.shape[1]",
                         [](Fixture& fx) { static const int64_t t4[4] = {2, 4, 2, 4}; fx.f.v.shape = t4; });
    static const int64_t other_t[4] = {2, 4, 2, 4};
    expect_forward_fails("inconsistent T in y", WKV_ERROR_SHAPE, "desc->y.shape[1]",
                         [](Fixture& fx) { fx.f.y.shape = other_t; });
    expect_forward_fails("int dtype", WKV_ERROR_DTYPE, "desc->w.dtype",
                         [](Fixture& fx) { fx.f.w.dtype = WKV_DTYPE_I64; });
    expect_forward_fails("lanes", WKV_ERROR_DTYPE, "desc->b.dtype", [](Fixture& fx) { fx.f.b.dtype.lanes = 2; });
    expect_forward_fails("f64", WKV_ERROR_DTYPE, "desc->r.dtype",
                         [](Fixture& fx) { fx.f.r.dtype = wkv_dtype_make(WKV_DTYPE_CODE_FLOAT, 64); });
    expect_forward_fails("f16 state", WKV_ERROR_DTYPE, "desc->state_in",
                         [](Fixture& fx) { fx.f.state_in.dtype = WKV_DTYPE_F16; });
    static const int64_t bad_state[4] = {2, 2, 4, 5};
    expect_forward_fails("state shape", WKV_ERROR_SHAPE, "desc->state_out.shape[3]",
                         [](Fixture& fx) { fx.f.state_out.shape = bad_state; });
    expect_forward_fails("u given to rwkv7", WKV_ERROR_INVALID_ARGUMENT, "desc->u",
                         [](Fixture& fx) { fx.f.u = fx.f.r; });
    expect_forward_fails("device pointer on the cpu", WKV_ERROR_DEVICE_MISMATCH, "desc->k.device",
                         [](Fixture& fx) { fx.f.k.device.type = WKV_DEVICE_CUDA; });
    expect_forward_fails("vulkan memory on the cpu", WKV_ERROR_DEVICE_MISMATCH, "desc->y.device",
                         [](Fixture& fx) { fx.f.y.device.type = WKV_DEVICE_VULKAN; });
}

TEST_CASE("overflowing shapes and strides") {
    static const int64_t huge[4] = {int64_t(1) << 40, int64_t(1) << 40, 2, 4};
    expect_forward_fails("B*T*H*N overflows", WKV_ERROR_OVERFLOW, "desc->v",
                         [](Fixture& fx) { fx.f.v.shape = huge; });
    static const int64_t huge_n[4] = {1, 1, 1, int64_t(1) << 33};
    expect_forward_fails("N*N overflows", WKV_ERROR_OVERFLOW, "desc->v",
                         [](Fixture& fx) { fx.f.v.shape = huge_n; });
    static const int64_t big_stride[4] = {INT64_MAX / 2, 8, 4, 1};
    expect_forward_fails("stride overflows the bytes", WKV_ERROR_OVERFLOW, "desc->r.strides[0]",
                         [](Fixture& fx) { fx.f.r.strides = big_stride; });
    static const int64_t sum_stride[4] = {INT64_MAX - 20, 8, 4, 1}; // the sum of the reaches overflows
    expect_forward_fails("stride overflows the sum", WKV_ERROR_OVERFLOW, "desc->r.strides[0]",
                         [](Fixture& fx) { fx.f.r.strides = sum_stride; });
    static const int64_t mul_stride[4] = {8 * 3 * 2 * 4, INT64_MAX / 2 + 8, 4, 1}; // (T-1) * stride overflows
    expect_forward_fails("stride times the size overflows", WKV_ERROR_OVERFLOW, "desc->k.strides[1]",
                         [](Fixture& fx) { fx.f.k.strides = mul_stride; });
    static const int64_t min_stride[4] = {INT64_MIN, 8, 4, 1};
    expect_forward_fails("INT64_MIN stride", WKV_ERROR_OVERFLOW, "desc->r.strides[0]",
                         [](Fixture& fx) { fx.f.r.strides = min_stride; });
    expect_forward_fails("byte_offset overflows", WKV_ERROR_OVERFLOW, "desc->k",
                         [](Fixture& fx) { fx.f.k.byte_offset = UINT64_MAX - 3; });
}

TEST_CASE("aliasing outputs") {
    expect_forward_fails("y is r", WKV_ERROR_ALIASING, "desc->y overlaps desc->r",
                         [](Fixture& fx) { fx.f.y = fx.f.r; });
    expect_forward_fails("state_out is r", WKV_ERROR_ALIASING, "desc->state_out overlaps",
                         [](Fixture& fx) { fx.f.state_out.data = fx.r.buf.data(); });
    static const int64_t zero_t[4] = {12 * 2 * 4 / 3, 0, 4, 1};
    expect_forward_fails("y with a zero stride", WKV_ERROR_ALIASING, "desc->y",
                         [](Fixture& fx) { fx.f.y.strides = zero_t; });
    static const int64_t small_t[4] = {24, 7, 4, 1}; // T stride 7 < H*N = 8: rows overlap
    expect_forward_fails("y with overlapping rows", WKV_ERROR_ALIASING, "desc->y",
                         [](Fixture& fx) { fx.f.y.strides = small_t; });
    expect_forward_fails("state_out overlaps state_in partly", WKV_ERROR_ALIASING,
                         "state_out may alias state_in only exactly", [](Fixture& fx) {
                             fx.f.state_out = fx.f.state_in;
                             fx.f.state_out.byte_offset = 4;
                             fx.s_in.poison();  // the state_in buffer is now also an output
                         });
    expect_backward_fails("dk is dv", WKV_ERROR_ALIASING, "desc->dk overlaps desc->dv",
                          [](Fixture& fx, wkv_context*) { fx.g.dv = fx.g.dk; });
    expect_backward_fails("dr is dy", WKV_ERROR_ALIASING, "desc->dr overlaps desc->dy",
                          [](Fixture& fx, wkv_context*) { fx.g.dr = fx.g.dy; });
    expect_backward_fails("dstate_in is state_in", WKV_ERROR_ALIASING, "desc->dstate_in overlaps",
                          [](Fixture& fx, wkv_context*) { fx.g.dstate_in = fx.f.state_in; });
    expect_backward_fails("workspace is dk", WKV_ERROR_ALIASING, "desc->workspace overlaps",
                          [](Fixture& fx, wkv_context*) {
                              // a workspace that covers dk (dk is poisoned: it must stay so)
                              fx.g.workspace = fx.dk.buf.data();
                          });
}

TEST_CASE("in-place state stepping is allowed") {
    CpuContext c;
    Fixture fx;
    std::vector<double> before = fx.s_in.read();
    fx.f.state_out = fx.f.state_in;
    REQUIRE(wkv_forward(c.ctx, &fx.f) == WKV_OK);
    CHECK(fx.s_in.read() != before);
}

TEST_CASE("bad packed sequences") {
    static const int64_t off_ok[3] = {0, 1, 3};
    expect_forward_fails("B must be 1", WKV_ERROR_SEQUENCE_OFFSETS, "B = 1", [](Fixture& fx) {
        fx.f.seq_offsets = off_ok;
        fx.f.num_seqs = 2;
    });
    // From here on a packed fixture: B = 1 by viewing only the first batch row.
    static const int64_t tok1[4] = {1, 3, 2, 4};
    static const int64_t st2[4] = {2, 2, 4, 4};
    auto packed = [](Fixture& fx, const int64_t* off, int64_t n) {
        for (wkv_tensor* t : {&fx.f.r, &fx.f.w, &fx.f.k, &fx.f.v, &fx.f.a, &fx.f.b, &fx.f.y}) t->shape = tok1;
        fx.f.state_in.shape = st2;
        fx.f.state_out.shape = st2;
        fx.f.seq_offsets = off;
        fx.f.num_seqs = n;
    };
    expect_forward_fails("null offsets", WKV_ERROR_NULL_POINTER, "desc->seq_offsets",
                         [&](Fixture& fx) { packed(fx, nullptr, 2); });
    expect_forward_fails("negative count", WKV_ERROR_SEQUENCE_OFFSETS, "desc->num_seqs",
                         [&](Fixture& fx) { packed(fx, off_ok, -1); });
    expect_forward_fails("offsets without a count", WKV_ERROR_SEQUENCE_OFFSETS, "desc->seq_offsets",
                         [&](Fixture& fx) { packed(fx, off_ok, 0); });
    static const int64_t off_start[3] = {1, 2, 3};
    expect_forward_fails("not starting at 0", WKV_ERROR_SEQUENCE_OFFSETS, "desc->seq_offsets[0]",
                         [&](Fixture& fx) { packed(fx, off_start, 2); });
    static const int64_t off_down[3] = {0, 3, 2};
    expect_forward_fails("decreasing", WKV_ERROR_SEQUENCE_OFFSETS, "desc->seq_offsets[2]",
                         [&](Fixture& fx) { packed(fx, off_down, 2); });
    static const int64_t off_short[3] = {0, 1, 2};
    expect_forward_fails("not ending at T", WKV_ERROR_SEQUENCE_OFFSETS, "total length T",
                         [&](Fixture& fx) { packed(fx, off_short, 2); });
    static const int64_t off3[4] = {0, 1, 2, 3};
    expect_forward_fails("one state slot per sequence", WKV_ERROR_SHAPE, "desc->state_in.shape[0]",
                         [&](Fixture& fx) { packed(fx, off3, 3); });
}

TEST_CASE("bad backward descriptors") {
    expect_backward_fails("null forward", WKV_ERROR_NULL_POINTER, "desc->forward is NULL",
                          [](Fixture& fx, wkv_context*) { fx.g.forward = nullptr; });
    expect_backward_fails("struct_size", WKV_ERROR_STRUCT_SIZE, "desc->struct_size",
                          [](Fixture& fx, wkv_context*) { fx.g.struct_size = 3; });
    expect_backward_fails("forward struct_size", WKV_ERROR_STRUCT_SIZE, "desc->forward->struct_size",
                          [](Fixture& fx, wkv_context*) { fx.f.struct_size = 3; });
    expect_backward_fails("bad op in forward", WKV_ERROR_INVALID_ARGUMENT, "desc->forward->op",
                          [](Fixture& fx, wkv_context*) { fx.f.op = (wkv_op)1; });
    expect_backward_fails("null forward input", WKV_ERROR_NULL_POINTER, "desc->forward->a.data",
                          [](Fixture& fx, wkv_context*) { fx.f.a.data = nullptr; });
    expect_backward_fails("missing dr", WKV_ERROR_NULL_POINTER, "desc->dr.data",
                          [](Fixture& fx, wkv_context*) { fx.g.dr.data = nullptr; });
    expect_backward_fails("missing dy", WKV_ERROR_NULL_POINTER, "desc->dy.data",
                          [](Fixture& fx, wkv_context*) { fx.g.dy.data = nullptr; });
    expect_backward_fails("du for rwkv7", WKV_ERROR_INVALID_ARGUMENT, "desc->du",
                          [](Fixture& fx, wkv_context*) { fx.g.du = fx.g.dr; });
    static const int64_t other_t[4] = {2, 4, 2, 4};
    expect_backward_fails("dy shape", WKV_ERROR_SHAPE, "desc->dy.shape[1]",
                          [](Fixture& fx, wkv_context*) { fx.g.dy.shape = other_t; });
    expect_backward_fails("dw dtype", WKV_ERROR_DTYPE, "desc->dw.dtype",
                          [](Fixture& fx, wkv_context*) { fx.g.dw.dtype = WKV_DTYPE_I64; });
    expect_backward_fails("bf16 dstate_in", WKV_ERROR_DTYPE, "desc->dstate_in",
                          [](Fixture& fx, wkv_context*) { fx.g.dstate_in.dtype = WKV_DTYPE_BF16; });
    expect_backward_fails("workspace NULL", WKV_ERROR_NULL_POINTER, "desc->workspace is NULL",
                          [](Fixture& fx, wkv_context*) { fx.g.workspace = nullptr; });
    expect_backward_fails("workspace too small", WKV_ERROR_WORKSPACE_TOO_SMALL, "desc->workspace_size",
                          [](Fixture& fx, wkv_context*) { fx.g.workspace_size -= 1; });
    expect_backward_fails("dk on the gpu", WKV_ERROR_DEVICE_MISMATCH, "desc->dk.device",
                          [](Fixture& fx, wkv_context*) { fx.g.dk.device.type = WKV_DEVICE_CUDA; });
    {
        CpuContext c;
        Fixture fx;
        CHECK(wkv_workspace_size(c.ctx, nullptr, &fx.g) == WKV_ERROR_NULL_POINTER);
        CHECK(std::string(wkv_last_error(c.ctx)).find("out_bytes") != std::string::npos);
        size_t bytes = 12345;
        CHECK(wkv_workspace_size(c.ctx, &bytes, nullptr) == WKV_ERROR_NULL_POINTER);
        CHECK(bytes == 12345);
    }
}

// The forward's scratch (wkv_forward_desc.scratch): the CPU backend needs none, so the query
// says 0 and a scratch is never touched, but what is wrong whatever the size (NULL with a size)
// is refused on every backend. The checks that depend on a nonzero size (too small, aliasing,
// wkv_buffers) run against the test plugin that claims scratch: tests/plugin/test_plugins.cpp.
TEST_CASE("the forward's scratch on the CPU backend: 0 bytes, ignored; NULL with a size refused") {
    CpuContext c;
    Fixture fx;
    size_t bytes = 12345;
    CHECK(wkv_forward_scratch_size(c.ctx, &bytes, &fx.f) == WKV_OK);
    CHECK(bytes == 0);
    REQUIRE(wkv_forward(c.ctx, &fx.f) == WKV_OK);
    const std::vector<unsigned char> y_plain = fx.y.buf;
    // a scratch the CPU cannot use: never read or written, even where it overlaps a tensor
    std::vector<unsigned char> scratch(64, 0xcd);
    fx.poison();
    fx.f.scratch = scratch.data();
    fx.f.scratch_size = scratch.size();
    CHECK(wkv_forward_scratch_size(c.ctx, &bytes, &fx.f) == WKV_OK);
    CHECK(bytes == 0);
    REQUIRE(wkv_forward(c.ctx, &fx.f) == WKV_OK);
    CHECK(fx.y.buf == y_plain);
    for (unsigned char x : scratch) CHECK(x == 0xcd);
    fx.poison();
    fx.f.scratch = fx.y.buf.data();
    fx.f.scratch_size = fx.y.buf.size();
    REQUIRE(wkv_forward(c.ctx, &fx.f) == WKV_OK);
    CHECK(fx.y.buf == y_plain);
    // the query validates the descriptor; its out-parameter and descriptor must be there
    CHECK(wkv_forward_scratch_size(c.ctx, nullptr, &fx.f) == WKV_ERROR_NULL_POINTER);
    CHECK(std::string(wkv_last_error(c.ctx)).find("out_bytes") != std::string::npos);
    bytes = 12345;
    CHECK(wkv_forward_scratch_size(c.ctx, &bytes, nullptr) == WKV_ERROR_NULL_POINTER);
    CHECK(wkv_forward_scratch_size(nullptr, &bytes, &fx.f) == WKV_ERROR_NULL_POINTER);
    fx.f.k.ndim = 3;
    CHECK(wkv_forward_scratch_size(c.ctx, &bytes, &fx.f) == WKV_ERROR_SHAPE);
    CHECK(std::string(wkv_last_error(c.ctx)).find("desc->k.ndim") != std::string::npos);
    fx.f.k.ndim = 4;
    fx.f.scratch = nullptr;
    fx.f.scratch_size = 16;
    CHECK(wkv_forward_scratch_size(c.ctx, &bytes, &fx.f) == WKV_ERROR_NULL_POINTER);
    CHECK(std::string(wkv_last_error(c.ctx)).find("desc->scratch is NULL") != std::string::npos);
    CHECK(bytes == 12345);
    expect_forward_fails("scratch NULL with a size", WKV_ERROR_NULL_POINTER,
                         "desc->scratch is NULL but desc->scratch_size is 16", [](Fixture& f) {
                             f.f.scratch = nullptr;
                             f.f.scratch_size = 16;
                         });
}

TEST_CASE("older wkv_forward_desc versions: without workspace, without scratch") {
    CpuContext c;
    Fixture fx;
    REQUIRE(wkv_forward(c.ctx, &fx.f) == WKV_OK);
    const std::vector<unsigned char> y_plain = fx.y.buf;
    // the bytes past an older struct_size are not read: whatever they hold is ignored
    fx.f.scratch = nullptr;
    fx.f.scratch_size = 99;
    for (size_t size : {offsetof(wkv_forward_desc, workspace), offsetof(wkv_forward_desc, scratch)}) {
        CAPTURE(size);
        fx.poison();
        fx.f.struct_size = size;
        size_t bytes = 1;
        CHECK(wkv_forward_scratch_size(c.ctx, &bytes, &fx.f) == WKV_OK);
        CHECK(bytes == 0);
        CHECK(wkv_forward(c.ctx, &fx.f) == WKV_OK);
        CHECK(fx.y.buf == y_plain);
    }
    fx.f.struct_size = offsetof(wkv_forward_desc, scratch) + sizeof(void*); // no version's size
    CHECK(wkv_forward(c.ctx, &fx.f) == WKV_ERROR_STRUCT_SIZE);
}

TEST_CASE("a newer, larger struct is accepted when its unknown tail is zero") {
    CpuContext c;
    Fixture fx;
    struct Bigger {
        wkv_forward_desc d;
        unsigned char tail[32];
    } big{};
    big.d = fx.f;
    big.d.struct_size = sizeof big;
    CHECK(wkv_forward(c.ctx, &big.d) == WKV_OK);
    fx.poison();
    big.tail[5] = 1;
    CHECK(wkv_forward(c.ctx, &big.d) == WKV_ERROR_STRUCT_SIZE);
    CHECK(std::string(wkv_last_error(c.ctx)).find("newer header") != std::string::npos);
    CHECK(fx.outputs_untouched());
}

TEST_CASE("bad context options") {
    wkv_context* ctx = reinterpret_cast<wkv_context*>(&ctx);  // must be reset to NULL on failure
    wkv_context_options o{};
    o.struct_size = 8;
    CHECK(wkv_context_create(&o, &ctx) == WKV_ERROR_STRUCT_SIZE);
    CHECK(ctx == nullptr);
    CHECK(std::string(wkv_last_error(nullptr)).find("options->struct_size") != std::string::npos);
    o.struct_size = sizeof o;
    o.backend = (wkv_backend)9;
    CHECK(wkv_context_create(&o, &ctx) == WKV_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(wkv_last_error(nullptr)).find("options->backend") != std::string::npos);
    o.backend = WKV_BACKEND_CPU;
    o.cpu_threads = -2;
    CHECK(wkv_context_create(&o, &ctx) == WKV_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(wkv_last_error(nullptr)).find("options->cpu_threads") != std::string::npos);
    o.cpu_threads = 0;
    o.device_index = -1;
    CHECK(wkv_context_create(&o, &ctx) == WKV_ERROR_INVALID_ARGUMENT);
    o.device_index = 0;
    o.log_level = (wkv_log_level)42;
    CHECK(wkv_context_create(&o, &ctx) == WKV_ERROR_INVALID_ARGUMENT);
    CHECK(wkv_context_create(&o, nullptr) == WKV_ERROR_NULL_POINTER);
    wkv_context_destroy(nullptr);  // accepted

    // An absent plugin: unavailable, with the reason.
    o.log_level = WKV_LOG_WARN;
    o.backend = WKV_BACKEND_VULKAN;
    wkv_backend_info info{};
    info.struct_size = sizeof info;
    REQUIRE(wkv_backend_get_info(WKV_BACKEND_VULKAN, &info) == WKV_OK);
    if (!info.available) {
        CHECK(wkv_context_create(&o, &ctx) == WKV_ERROR_BACKEND_UNAVAILABLE);
        CHECK(std::string(wkv_last_error(nullptr)).find("vulkan") != std::string::npos);
    }
}

TEST_CASE("WKV_BACKEND overrides the choice; a bad value is an error") {
    wkv_context* ctx = nullptr;
    wkv_context_options o{};
    o.struct_size = sizeof o;
    setenv("WKV_BACKEND", "bogus", 1);
    CHECK(wkv_context_create(&o, &ctx) == WKV_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(wkv_last_error(nullptr)).find("WKV_BACKEND=bogus") != std::string::npos);
    setenv("WKV_BACKEND", "cpu", 1);
    REQUIRE(wkv_context_create(&o, &ctx) == WKV_OK);
    CHECK(wkv_context_backend(ctx) == WKV_BACKEND_CPU);
    wkv_context_destroy(ctx);
    unsetenv("WKV_BACKEND");
}

TEST_CASE("WKV_NUM_THREADS: a count 1..1024 is used; anything else is refused, naming the variable") {
    wkv_context_options o{};
    o.struct_size = sizeof o;
    o.backend = WKV_BACKEND_CPU;
    for (const char* bad : {"-7", "0", "1e20", "99999999999999999999", "4x", "two", "1025"}) {
        CAPTURE(bad);
        setenv("WKV_NUM_THREADS", bad, 1);
        wkv_context* ctx = reinterpret_cast<wkv_context*>(0x1);
        CHECK(wkv_context_create(&o, &ctx) == WKV_ERROR_INVALID_ARGUMENT);
        CHECK(ctx == nullptr);
        CHECK(std::string(wkv_last_error(nullptr)).find(std::string("WKV_NUM_THREADS=") + bad) != std::string::npos);
        o.cpu_threads = 2; // the caller's count wins: the variable is not read
        ctx = nullptr;
        CHECK(wkv_context_create(&o, &ctx) == WKV_OK);
        wkv_context_destroy(ctx);
        o.cpu_threads = 0;
    }
    setenv("WKV_NUM_THREADS", "3", 1);
    wkv_context* ctx = nullptr;
    CHECK(wkv_context_create(&o, &ctx) == WKV_OK);
    wkv_context_destroy(ctx);
    unsetenv("WKV_NUM_THREADS");
}

TEST_CASE("wkv_context_health(NULL) says why") {
    CHECK(wkv_context_health(nullptr) == WKV_ERROR_NULL_POINTER);
    CHECK(std::string(wkv_last_error(nullptr)).find("wkv_context_health: ctx is NULL") != std::string::npos);
}

TEST_CASE("null context") {
    Fixture fx;
    CHECK(wkv_forward(nullptr, &fx.f) == WKV_ERROR_NULL_POINTER);
    CHECK(std::string(wkv_last_error(nullptr)).find("ctx is NULL") != std::string::npos);
    CHECK(wkv_backward(nullptr, &fx.g) == WKV_ERROR_NULL_POINTER);
    size_t bytes = 0;
    CHECK(wkv_workspace_size(nullptr, &bytes, &fx.g) == WKV_ERROR_NULL_POINTER);
    CHECK(fx.outputs_untouched());
}

TEST_CASE("wkv_context_synchronize: a no-op on the CPU backend; NULL context") {
    CpuContext c;
    CHECK(wkv_context_synchronize(c.ctx) == WKV_OK);
    CHECK(std::string(wkv_last_error(c.ctx)).empty());
    Fixture fx;
    REQUIRE(wkv_forward(c.ctx, &fx.f) == WKV_OK);
    CHECK(wkv_context_synchronize(c.ctx) == WKV_OK);
    CHECK(wkv_context_synchronize(nullptr) == WKV_ERROR_NULL_POINTER);
    CHECK(std::string(wkv_last_error(nullptr)).find("wkv_context_synchronize: ctx is NULL") != std::string::npos);
}

TEST_CASE("status strings, version, introspection") {
    std::set<std::string> seen;
#define WKV_TEST_STATUS_(name, value, message)                                  \
    {                                                                           \
        std::string s = wkv_status_string(name);                                \
        CHECK(s.find(#name) == 0);                                              \
        CHECK(seen.insert(s).second);                                           \
        CHECK(static_cast<int>(name) == value);                                 \
    }
    WKV_STATUS_LIST(WKV_TEST_STATUS_)
#undef WKV_TEST_STATUS_
    CHECK(std::string(wkv_status_string(static_cast<wkv_status>(999))).find("unknown") != std::string::npos);
    CHECK(wkv_version() == WKV_VERSION);
    CHECK(std::string(wkv_version_string()) == "0.1.0");
    CHECK(std::string(wkv_build_info()).find("libwkv 0.1.0") == 0);

    wkv_backend_info info{};
    info.struct_size = sizeof info;
    REQUIRE(wkv_backend_get_info(WKV_BACKEND_CPU, &info) == WKV_OK);
    CHECK(info.available == 1);
    CHECK(std::string(info.name) == "cpu");
    CHECK((info.ops & (1u << WKV_OP_RWKV7)) != 0);
    CHECK(info.dtypes == 7u);
    CHECK(info.any_head_size == 1);
    CHECK(info.device_count == 1);
    CHECK(wkv_backend_get_info(WKV_BACKEND_AUTO, &info) == WKV_ERROR_INVALID_ARGUMENT);
    CHECK(wkv_backend_get_info(WKV_BACKEND_CPU, nullptr) == WKV_ERROR_NULL_POINTER);
    info.struct_size = 4;
    CHECK(wkv_backend_get_info(WKV_BACKEND_CPU, &info) == WKV_ERROR_STRUCT_SIZE);

    wkv_device_info dev{};
    dev.struct_size = sizeof dev;
    REQUIRE(wkv_device_get_info(WKV_BACKEND_CPU, 0, &dev) == WKV_OK);
    CHECK(std::string(dev.name).size() > 0);
    CHECK(dev.compute_units >= 1);
    CHECK(wkv_device_get_info(WKV_BACKEND_CPU, 1, &dev) == WKV_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(wkv_last_error(nullptr)).find("index 1") != std::string::npos);
}

TEST_CASE("a second call on a busy context returns WKV_ERROR_BUSY and touches nothing") {
    // The host job system runs inside wkv_forward; from there, call the same context again.
    struct Job {
        wkv_context* ctx = nullptr;
        Fixture* inner = nullptr;
        std::atomic<int> busy_seen{0}, calls{0};
    } job;
    wkv_context_options o{};
    o.struct_size = sizeof o;
    o.backend = WKV_BACKEND_CPU;
    o.parallel_for_user_data = &job;
    o.parallel_for = [](void* user, int64_t n, wkv_task_fn fn, void* data) {
        Job* j = static_cast<Job*>(user);
        if (j->calls++ == 0 && wkv_forward(j->ctx, &j->inner->f) == WKV_ERROR_BUSY) j->busy_seen++;
        fn(data, 0, n);
    };
    REQUIRE(wkv_context_create(&o, &job.ctx) == WKV_OK);
    Fixture outer, inner;
    job.inner = &inner;
    REQUIRE(wkv_forward(job.ctx, &outer.f) == WKV_OK);
    CHECK(job.calls.load() >= 1);
    CHECK(job.busy_seen.load() == 1);
    CHECK(std::string(wkv_last_error(nullptr)).find("another call is running") != std::string::npos);
    CHECK(inner.outputs_untouched());
    CHECK(!all_nan(outer.y));
    wkv_context_destroy(job.ctx);
}

TEST_CASE("failures are silent on stdout/stderr but reach the log callback") {
    struct Log {
        int errors = 0;
        std::string last;
    } log;
    wkv_context_options o{};
    o.struct_size = sizeof o;
    o.backend = WKV_BACKEND_CPU;
    o.log = [](void* user, wkv_log_level level, const char* message) {
        Log* l = static_cast<Log*>(user);
        if (level == WKV_LOG_ERROR) l->errors++;
        l->last = message;
    };
    o.log_user_data = &log;
    wkv_context* ctx = nullptr;
    CaptureStdio cap;
    REQUIRE(wkv_context_create(&o, &ctx) == WKV_OK);
    Fixture fx;
    fx.f.op = (wkv_op)3;
    wkv_status st = wkv_forward(ctx, &fx.f);
    fx.f.op = WKV_OP_RWKV7;
    fx.f.k.dtype = WKV_DTYPE_I64;
    wkv_status st2 = wkv_forward(ctx, &fx.f);
    wkv_context_destroy(ctx);
    wkv_context* none = nullptr;
    wkv_context_options bad{};
    bad.struct_size = 1;
    wkv_context_create(&bad, &none);
    std::string printed = cap.finish();
    CHECK(st == WKV_ERROR_INVALID_ARGUMENT);
    CHECK(st2 == WKV_ERROR_DTYPE);
    CHECK(log.errors == 2);
    CHECK(log.last.find("desc->k.dtype") != std::string::npos);
    CHECK(printed.empty());
}

TEST_CASE("context flags: WKV_CONTEXT_ASYNC accepted (the CPU ignores it), unknown bits refused, older size") {
    wkv_context_options o{};
    o.struct_size = sizeof o;
    o.backend = WKV_BACKEND_CPU;
    o.cpu_threads = 1;
    o.flags = WKV_CONTEXT_ASYNC;
    wkv_context* ctx = nullptr;
    REQUIRE(wkv_context_create(&o, &ctx) == WKV_OK);
    CHECK(wkv_context_synchronize(ctx) == WKV_OK);
    wkv_context_destroy(ctx);
    ctx = nullptr;
    o.flags = WKV_CONTEXT_ASYNC | (1ull << 40);
    CHECK(wkv_context_create(&o, &ctx) == WKV_ERROR_INVALID_ARGUMENT);
    CHECK(ctx == nullptr);
    CHECK(std::string(wkv_last_error(nullptr)).find("options->flags") != std::string::npos);
    // a caller built before `flags` existed: its struct ends where flags begins; the bytes
    // past it (here a set bit) are never read
    o.struct_size = offsetof(wkv_context_options, flags);
    REQUIRE(wkv_context_create(&o, &ctx) == WKV_OK);
    wkv_context_destroy(ctx);
}
