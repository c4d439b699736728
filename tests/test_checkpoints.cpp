// Checkpoints saved by the forward (wkv_forward_desc.workspace) and reused by the backward
// (WKV_BACKWARD_REUSE_CHECKPOINTS): on every CPU instruction-set path, for every op, dtype,
// packed and strided layout, with and without state_in / dstate_out, a backward that reuses
// the forward's checkpoints gives bit for bit the outputs of one that recomputes them, and the
// forward's own outputs do not change by saving. Every misuse the context can see returns its
// status with a message naming the argument and writes nothing.
#include <cmath>
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "wkv_doctest.h"

#include "test_any_op.h"
#include "test_isa.h"
#include "test_util.h"
#include "test_util_ops.h"

using namespace wkvtest;

namespace {

struct Case {
    wkv_op op = WKV_OP_RWKV7;
    wkv_dtype dtype = WKV_DTYPE_F32;
    int64_t T = 75, H = 2, N = 64; // RWKV-4: C = N
    int64_t B = 2;                 // sequences (packed: their count, in one row)
    bool packed = false, strided = false, with_s0 = true, with_dsT = true;
    bool aligned = false; // per-token tensors start on a 64-byte boundary (vector stores)
    uint32_t flags = 0; // forward flags (WKV_FLAG_STATE_KEY_MAJOR)
    int threads = 1;
};

bool any_nan(const HostTensor& t) {
    for (double x : t.read())
        if (std::isnan(x)) return true;
    return false;
}

std::string label(const Case& c) {
    return std::string(op_label(c.op)) + " bits=" + std::to_string(c.dtype.bits) +
           (c.dtype.code == WKV_DTYPE_CODE_BFLOAT ? "bf" : "") + " T=" + std::to_string(c.T) +
           " H=" + std::to_string(c.H) + " N=" + std::to_string(c.N) + (c.packed ? " packed" : "") +
           (c.strided ? " strided" : "") + (c.with_s0 ? " s0" : "") + (c.with_dsT ? " dsT" : "") +
           (c.flags ? " key-major" : "") + " threads=" + std::to_string(c.threads);
}

// One problem's tensors and descriptors (host memory), built from a Case.
struct Problem {
    Case c;
    AnyProblem ap; // the values (B rows, or one packed row)
    std::vector<int64_t> offsets;
    std::map<std::string, std::unique_ptr<HostTensor>> t;
    wkv_forward_desc f{};
    wkv_backward_desc g{};

    // The backward's workspace (wkv_workspace_size of g, plus `extra` bytes), given to g.
    Workspace backward_workspace(wkv_context* ctx, size_t extra = 0) {
        size_t bytes = 0;
        REQUIRE(wkv_workspace_size(ctx, &bytes, &g) == WKV_OK);
        Workspace ws(bytes + extra);
        g.workspace = ws.data();
        g.workspace_size = bytes;
        return ws;
    }

    std::vector<int64_t> shape(const std::string& name) const {
        AnyProblem q = ap;
        q.B = c.packed ? c.B : ap.B; // state slots: sequences
        const bool state = name == "s0" || name == "sT" || name == "dsT" || name == "ds0";
        return any_shape(state ? q : ap, name);
    }

    HostTensor& make(const std::string& name, bool per_token) {
        const std::vector<int64_t> shp = shape(name);
        if (c.strided && per_token) { // every axis but the last twice as far apart, offset 3
            const size_t last = shp.size() - 1;
            std::vector<int64_t> str(shp.size(), 1);
            str[last - 1] = 2 * shp[last];
            for (size_t d = last - 1; d-- > 0;) str[d] = str[d + 1] * shp[d + 1];
            t[name].reset(new HostTensor(c.dtype, shp, str, 3));
        } else if (c.aligned && per_token) { // contiguous, shifted onto a 64-byte boundary
            std::vector<int64_t> str(shp.size(), 1);
            for (size_t d = shp.size() - 1; d-- > 0;) str[d] = str[d + 1] * shp[d + 1];
            HostTensor* x = new HostTensor(c.dtype, shp, str, 16);
            const uintptr_t at = reinterpret_cast<uintptr_t>(x->buf.data());
            x->offset_elems = ((64 - at % 64) % 64) / x->elem_size();
            t[name].reset(x);
        } else {
            t[name].reset(new HostTensor(per_token || name == "u" || name == "w" ? c.dtype : WKV_DTYPE_F32, shp));
        }
        t[name]->poison();
        return *t[name];
    }

    explicit Problem(const Case& cs) : c(cs) {
        Rng rng(1234 + static_cast<uint64_t>(c.op) * 7 + static_cast<uint64_t>(c.N));
        const int64_t rows = c.packed ? 1 : c.B;
        ap = any_random(rng, c.op, rows, c.T, c.H, c.N);
        if (c.packed) {
            offsets = {0, 5, 5, c.T - 33, c.T}; // an empty sequence, one of < K, and longer ones
            AnyProblem st = any_random(rng, c.op, 4, 1, c.H, c.N);
            ap.in["s0"] = st.in["s0"];
            ap.in["dsT"] = st.in["dsT"];
            this->c.B = 4;
        }
        f.struct_size = sizeof f;
        f.op = c.op;
        f.decay_form = ap.form;
        f.flags = c.flags;
        for (const auto& name : any_inputs(c.op)) {
            const bool param = name == "u" || (c.op == WKV_OP_RWKV4 && name == "w");
            make(name, !param).fill(ap.in.at(name));
            *any_detail::slot(f, name) = t[name]->view();
        }
        if (c.with_s0) {
            make("s0", false).fill(ap.in.at("s0"));
            f.state_in = t["s0"]->view();
        }
        f.y = make("y", true).view();
        f.state_out = make("sT", false).view();
        if (c.packed) {
            f.seq_offsets = offsets.data();
            f.num_seqs = 4;
        }
        g.struct_size = sizeof g;
        g.forward = &f;
        make("dy", true).fill(ap.in.at("dy"));
        g.dy = t["dy"]->view();
        if (c.with_dsT) {
            make("dsT", false).fill(ap.in.at("dsT"));
            g.dstate_out = t["dsT"]->view();
        }
        for (const auto& name : any_grads(c.op)) {
            const bool param = name == "du" || (c.op == WKV_OP_RWKV4 && name == "dw") || name == "ds0";
            make(name, !param);
            *any_detail::grad_slot(g, name) = t[name]->view();
        }
    }

    std::vector<std::string> outputs(bool backward) const {
        if (!backward) return {"y", "sT"};
        return any_grads(c.op);
    }
    // The outputs' bytes; poison() makes them all NaN again.
    std::vector<unsigned char> bytes(bool backward) const {
        std::vector<unsigned char> out;
        for (const auto& name : outputs(backward))
            out.insert(out.end(), t.at(name)->buf.begin(), t.at(name)->buf.end());
        return out;
    }
    void poison(bool backward) {
        for (const auto& name : outputs(backward)) t[name]->poison();
    }
    bool untouched(bool backward) const {
        for (const auto& name : outputs(backward))
            if (!all_nan(*t.at(name))) return false;
        return true;
    }
};

// Reuse and recompute agree bit for bit; the forward's outputs do not change by saving.
void check_case(const Case& c) {
    CAPTURE(label(c));
    CpuCtx cx(c.threads);
    REQUIRE(cx.status == WKV_OK);
    Problem p(c);
    Workspace ws = p.backward_workspace(cx.ctx);
    const size_t bytes = ws.bytes;

    REQUIRE(wkv_forward(cx.ctx, &p.f) == WKV_OK);
    const std::vector<unsigned char> y_plain = p.bytes(false);
    REQUIRE(wkv_backward(cx.ctx, &p.g) == WKV_OK);
    const std::vector<unsigned char> grads_recomputed = p.bytes(true);
    for (const auto& name : p.outputs(true)) CHECK(!any_nan(*p.t[name]));

    std::memset(ws.buf.data(), 0xff, ws.bytes); // NaN: what the forward does not save shows
    p.poison(false);
    p.poison(true);
    p.f.workspace = ws.data();
    p.f.workspace_size = bytes;
    REQUIRE(wkv_forward(cx.ctx, &p.f) == WKV_OK);
    CHECK(p.bytes(false) == y_plain);
    p.g.flags = WKV_BACKWARD_REUSE_CHECKPOINTS;
    REQUIRE(wkv_backward(cx.ctx, &p.g) == WKV_OK);
    CHECK(p.bytes(true) == grads_recomputed);
    // the checkpoints stay: a second backward may reuse them again
    p.poison(true);
    REQUIRE(wkv_backward(cx.ctx, &p.g) == WKV_OK);
    CHECK(p.bytes(true) == grads_recomputed);
    CHECK(ws.guard_intact());
}

std::vector<Case> cases() {
    std::vector<Case> out;
    for (wkv_op op : {WKV_OP_RWKV7, WKV_OP_RWKV6, WKV_OP_RWKV4}) {
        // N = 64: the vector paths' own backward; N = 20 (RWKV-4: C = 40): padded rows, or the
        // scalar backward (RWKV-6/4 on a vector path: the forward does not save, the backward
        // recomputes, which the flag must not change)
        for (int64_t N : {int64_t(64), int64_t(op == WKV_OP_RWKV4 ? 40 : 20)}) {
            Case c;
            c.op = op;
            c.N = N;
            c.H = op == WKV_OP_RWKV4 ? 1 : 2;
            out.push_back(c);
            Case t = c; t.T = 64; t.threads = 3; out.push_back(t); // T a multiple of K
            Case s = c; s.T = 1; s.with_s0 = false; out.push_back(s); // one token, no state
            Case pk = c; pk.packed = true; out.push_back(pk);
            Case st = c; st.strided = true; st.with_dsT = false; out.push_back(st);
            Case bf = c; bf.dtype = WKV_DTYPE_BF16; bf.threads = 2; out.push_back(bf);
            Case hf = c; hf.dtype = WKV_DTYPE_F16; hf.packed = true; hf.strided = true; out.push_back(hf);
            if (op != WKV_OP_RWKV4) {
                Case km = c; km.flags = WKV_FLAG_STATE_KEY_MAJOR; out.push_back(km);
            }
        }
    }
    return out;
}

} // namespace

TEST_CASE("checkpoints: a backward reusing the forward's checkpoints is bit-identical to one that recomputes them") {
    for (const std::string& isa : runnable_cpu_isas()) {
        CAPTURE(isa);
        ScopedIsa scope(isa.c_str());
        for (const Case& c : cases()) check_case(c);
    }
}

TEST_CASE("checkpoints: the forward saves them in the backward's workspace (the backward's own pass is skipped)") {
    // With the flag, the backward reads the checkpoints; were they not saved (a NaN-filled
    // workspace), the gradients would be NaN: spoil one checkpoint after the forward and the
    // reusing backward must differ from the recomputing one. (Proves the pass is skipped.)
    Case c;
    c.T = 75;
    CpuCtx cx(1);
    Problem p(c);
    Workspace ws = p.backward_workspace(cx.ctx);
    const size_t bytes = ws.bytes;
    p.f.workspace = ws.data();
    p.f.workspace_size = bytes;
    REQUIRE(wkv_forward(cx.ctx, &p.f) == WKV_OK);
    std::vector<unsigned char> saved(ws.buf.begin(), ws.buf.begin() + static_cast<long>(bytes));
    // the last checkpoint of the first (sequence, head): somewhere in the workspace a state of
    // N*N floats that the forward wrote; flip every float that the forward wrote to NaN
    size_t written = 0;
    for (size_t i = 0; i + 4 <= bytes; i += 4) {
        uint32_t w;
        std::memcpy(&w, ws.buf.data() + i, 4);
        if (w != 0xffffffffu) {
            std::memset(ws.buf.data() + i, 0xff, 4);
            ++written;
        }
    }
    // 2 sequences x 2 heads x 3 segments of N x N states
    CHECK(written >= static_cast<size_t>(2 * 2 * 3 * 64 * 64) / 2);
    p.g.flags = WKV_BACKWARD_REUSE_CHECKPOINTS;
    REQUIRE(wkv_backward(cx.ctx, &p.g) == WKV_OK);
    CHECK(any_nan(*p.t["dr"]));
}

TEST_CASE("checkpoints: misuse is refused with a message naming the argument, nothing written") {
    auto expect = [](const char* what, bool backward, wkv_status want, const char* needle, auto&& setup) {
        CAPTURE(what);
        CpuCtx cx(1);
        Case c;
        c.T = 40;
        Problem p(c);
        Workspace ws = p.backward_workspace(cx.ctx, 4096);
        setup(cx.ctx, p, ws, p.g.workspace_size);
        p.poison(false);
        p.poison(true);
        const wkv_status got = backward ? wkv_backward(cx.ctx, &p.g) : wkv_forward(cx.ctx, &p.f);
        const std::string msg = wkv_last_error(cx.ctx);
        CAPTURE(msg);
        CHECK(std::string(wkv_status_string(got)) == wkv_status_string(want));
        CHECK(msg.find(needle) != std::string::npos);
        CHECK(p.untouched(backward));
        CHECK(p.untouched(false));
    };
    auto nothing = [](wkv_context*, Problem&, Workspace&, size_t) {};
    auto reuse = [](wkv_context*, Problem& p, Workspace&, size_t) { p.g.flags = WKV_BACKWARD_REUSE_CHECKPOINTS; };
    auto saving_forward = [](wkv_context* ctx, Problem& p, Workspace& ws, size_t bytes) {
        p.f.workspace = ws.data();
        p.f.workspace_size = bytes;
        REQUIRE(wkv_forward(ctx, &p.f) == WKV_OK);
        p.f.workspace = nullptr;
        p.f.workspace_size = 0;
        p.g.flags = WKV_BACKWARD_REUSE_CHECKPOINTS;
    };
    (void)nothing;

    expect("the flag without a saving forward", true, WKV_ERROR_INVALID_ARGUMENT, "desc->workspace", reuse);
    expect("the flag after a forward without workspace", true, WKV_ERROR_INVALID_ARGUMENT, "desc->workspace",
           [&](wkv_context* ctx, Problem& p, Workspace& ws, size_t b) {
               REQUIRE(wkv_forward(ctx, &p.f) == WKV_OK);
               reuse(ctx, p, ws, b);
           });
    expect("the flag with another workspace", true, WKV_ERROR_INVALID_ARGUMENT, "desc->workspace",
           [&](wkv_context* ctx, Problem& p, Workspace& ws, size_t b) {
               saving_forward(ctx, p, ws, b);
               p.g.workspace = ws.buf.data() + 64;
           });
    expect("the flag, state_in dropped since the forward", true, WKV_ERROR_INVALID_ARGUMENT, "desc->forward",
           [&](wkv_context* ctx, Problem& p, Workspace& ws, size_t b) {
               saving_forward(ctx, p, ws, b);
               p.f.state_in.data = nullptr;
           });
    expect("the flag, another decay form", true, WKV_ERROR_INVALID_ARGUMENT, "desc->workspace",
           [&](wkv_context* ctx, Problem& p, Workspace& ws, size_t b) {
               saving_forward(ctx, p, ws, b);
               p.f.decay_form = WKV_DECAY_DIRECT;
           });
    expect("the flag, another r dtype", true, WKV_ERROR_INVALID_ARGUMENT, "desc->workspace",
           [&](wkv_context* ctx, Problem& p, Workspace& ws, size_t b) {
               saving_forward(ctx, p, ws, b);
               p.t["r2"].reset(new HostTensor(WKV_DTYPE_BF16, p.shape("r")));
               p.t["r2"]->fill(p.ap.in.at("r"));
               p.f.r = p.t["r2"]->view();
           });
    expect("the flag after a recomputing backward overwrote them", true, WKV_ERROR_INVALID_ARGUMENT,
           "desc->workspace", [&](wkv_context* ctx, Problem& p, Workspace& ws, size_t b) {
               saving_forward(ctx, p, ws, b);
               p.g.flags = 0;
               REQUIRE(wkv_backward(ctx, &p.g) == WKV_OK);
               p.g.flags = WKV_BACKWARD_REUSE_CHECKPOINTS;
           });
    expect("the flag on another context", true, WKV_ERROR_INVALID_ARGUMENT, "desc->workspace",
           [&](wkv_context*, Problem& p, Workspace& ws, size_t b) {
               CpuCtx other(1);
               saving_forward(other.ctx, p, ws, b);
           });
    expect("unknown backward flags", true, WKV_ERROR_INVALID_ARGUMENT, "desc->flags",
           [](wkv_context*, Problem& p, Workspace&, size_t) { p.g.flags = 0x10; });
    expect("forward workspace too small", false, WKV_ERROR_WORKSPACE_TOO_SMALL, "desc->workspace_size",
           [](wkv_context*, Problem& p, Workspace& ws, size_t b) {
               p.f.workspace = ws.data();
               p.f.workspace_size = b - 1;
           });
    expect("forward workspace NULL with a size", false, WKV_ERROR_NULL_POINTER, "desc->workspace",
           [](wkv_context*, Problem& p, Workspace&, size_t b) {
               p.f.workspace = nullptr;
               p.f.workspace_size = b;
           });
    expect("forward workspace over y", false, WKV_ERROR_ALIASING, "desc->workspace",
           [](wkv_context*, Problem& p, Workspace& ws, size_t b) {
               p.t["y"]->buf.resize(b + 4096); // y at the start of a buffer as large as the workspace
               p.f.y = p.t["y"]->view();
               p.f.workspace = p.t["y"]->buf.data();
               p.f.workspace_size = b;
               (void)ws;
           });
}

// The status of a forward with a bad workspace must not depend on the CPU path: the vector
// paths do not save checkpoints where N (RWKV-4: C) is not a multiple of their width, and the
// core checks the workspace before it asks whether the backend saves (api.c, prepare_save).
TEST_CASE("checkpoints: a bad forward workspace gets the same status on every CPU path") {
    struct Bad {
        const char* what;
        wkv_status want;
        const char* needle;
    };
    const Bad bads[] = {{"too small", WKV_ERROR_WORKSPACE_TOO_SMALL, "desc->workspace_size"},
                        {"over y", WKV_ERROR_ALIASING, "desc->workspace"},
                        {"over k", WKV_ERROR_ALIASING, "desc->workspace"},
                        {"fits", WKV_OK, ""}};
    for (const std::string& isa : runnable_cpu_isas()) {
        ScopedIsa scope(isa.c_str());
        for (wkv_op op : {WKV_OP_RWKV7, WKV_OP_RWKV6, WKV_OP_RWKV4}) {
            for (int64_t N : {int64_t(20), int64_t(64)}) { // 20: no vector width divides it
                for (const Bad& bad : bads) {
                    CAPTURE(isa);
                    CAPTURE(op_label(op));
                    CAPTURE(N);
                    CAPTURE(bad.what);
                    CpuCtx cx(1);
                    REQUIRE(cx.status == WKV_OK);
                    Case c;
                    c.op = op;
                    c.N = N;
                    c.T = 40;
                    Problem p(c);
                    size_t bytes = 0;
                    REQUIRE(wkv_workspace_size(cx.ctx, &bytes, &p.g) == WKV_OK);
                    REQUIRE(bytes > 0);
                    Workspace ws(bytes);
                    p.f.workspace = ws.data();
                    p.f.workspace_size = bytes;
                    const std::string w = bad.what;
                    if (w == "too small") p.f.workspace_size = bytes - 1;
                    for (const char* over : {"y", "k"}) {
                        if (w != std::string("over ") + over) continue;
                        HostTensor& x = *p.t[over];
                        x.buf.resize(x.buf.size() + bytes); // x at the start of a buffer as large as the workspace
                        *(w == "over y" ? &p.f.y : any_detail::slot(p.f, over)) = x.view();
                        p.f.workspace = x.buf.data();
                    }
                    p.poison(false);
                    const wkv_status got = wkv_forward(cx.ctx, &p.f);
                    const std::string msg = wkv_last_error(cx.ctx);
                    CAPTURE(msg);
                    CHECK(std::string(wkv_status_string(got)) == wkv_status_string(bad.want));
                    if (bad.want != WKV_OK) {
                        CHECK(msg.find(bad.needle) != std::string::npos);
                        CHECK(p.untouched(false));
                    }
                }
            }
        }
    }
}

TEST_CASE("checkpoints: callers built against the older descriptors get the defaults") {
    CpuCtx cx(1);
    Case c;
    c.T = 40;
    Problem p(c);
    Workspace ws = p.backward_workspace(cx.ctx);
    REQUIRE(wkv_forward(cx.ctx, &p.f) == WKV_OK);
    REQUIRE(wkv_backward(cx.ctx, &p.g) == WKV_OK);
    const std::vector<unsigned char> want = p.bytes(true);
    // old sizes: the new fields are not read (garbage there must not matter)
    p.f.struct_size = offsetof(wkv_forward_desc, workspace);
    p.f.workspace = reinterpret_cast<void*>(0x10);
    p.f.workspace_size = 7;
    p.g.struct_size = offsetof(wkv_backward_desc, flags);
    p.g.flags = 0xdead;
    p.poison(false);
    p.poison(true);
    REQUIRE(wkv_forward(cx.ctx, &p.f) == WKV_OK);
    REQUIRE(wkv_backward(cx.ctx, &p.g) == WKV_OK);
    CHECK(p.bytes(true) == want);
    // a size between the versions is no version
    p.f.struct_size = offsetof(wkv_forward_desc, workspace) + 4;
    CHECK(wkv_forward(cx.ctx, &p.f) == WKV_ERROR_STRUCT_SIZE);
}

TEST_CASE("checkpoints: long calls (gradients streamed past the caches) still match the float64 reference") {
    // Above 1 MiB per gradient tensor the vector backwards write the gradients with
    // non-temporal stores (simd_common.inl, stream_gradients); this size takes that path, with
    // and without reused checkpoints, on every path.
    for (const std::string& isa : runnable_cpu_isas()) {
        CAPTURE(isa);
        ScopedIsa scope(isa.c_str());
        for (wkv_op op : {WKV_OP_RWKV7, WKV_OP_RWKV6, WKV_OP_RWKV4}) {
            const std::string label_op = op_label(op);
            CAPTURE(label_op);
            const int64_t H = op == WKV_OP_RWKV4 ? 1 : 8, N = op == WKV_OP_RWKV4 ? 512 : 64;
            CpuCtx cx(2);
            Case c;
            c.aligned = true;
            c.op = op;
            c.B = 1;
            c.T = 530;
            c.H = H;
            c.N = N;
            c.threads = 2;
            Problem p(c);
            Workspace ws = p.backward_workspace(cx.ctx);
            REQUIRE(static_cast<double>(p.ap.T * p.ap.H * p.ap.N) > 262144.0);
            REQUIRE((reinterpret_cast<uintptr_t>(p.g.dk.data) + p.g.dk.byte_offset) % 64 == 0);
            REQUIRE(wkv_forward(cx.ctx, &p.f) == WKV_OK);
            REQUIRE(wkv_backward(cx.ctx, &p.g) == WKV_OK);
            const std::vector<unsigned char> want = p.bytes(true);
            const Arrays ref = any_reference(p.ap);
            for (const std::string& name : any_grads(op)) {
                CAPTURE(name);
                CHECK(rel_err(p.t[name]->read(), ref.at(name)) < 1e-5);
            }
            p.poison(true);
            p.f.workspace = ws.data();
            p.f.workspace_size = ws.bytes;
            REQUIRE(wkv_forward(cx.ctx, &p.f) == WKV_OK);
            p.g.flags = WKV_BACKWARD_REUSE_CHECKPOINTS;
            REQUIRE(wkv_backward(cx.ctx, &p.g) == WKV_OK);
            CHECK(p.bytes(true) == want);
        }
    }
}
