// Forward-saved checkpoints on the CUDA backend (part of wkv_cuda_tests): a forward given the
// backward's workspace (wkv_forward_desc.workspace) writes the checkpoints of the backward's
// pass A; a backward with WKV_BACKWARD_REUSE_CHECKPOINTS skips that pass and must give bit
// for bit the gradients of one that recomputes them, while the forward's own outputs do not
// change by saving. RWKV-7 at N = 32 / 64 saves (backends/cuda/rwkv7_bwd.cu: pass A runs in the
// forward's arithmetic) and N = 128 does not, where the flag must change nothing; RWKV-6 saves
// at N = 32 / 64 (the row scan stores the column scan's checkpoints, backends/cuda/rwkv6.cu;
// at N = 128 saving cost the forward more than it saved the backward, so it does not).
// Cases: T with a tail (not a multiple of the segment or the staged chunk), T = 1 (the decode
// kernel), packed sequences with an empty one, without state_in, key-major states, strided
// inputs (NaN in the gaps), f32, f16, bf16. Every tensor and the workspace are wkv_buffers
// (device memory); outputs and the workspace are NaN-filled before each call.
#include "wkv_doctest.h"

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "test_any_op.h"
#include "test_util.h"
#include "test_util_ops.h"

using namespace wkvtest;

namespace {

struct CkCase {
    wkv_op op = WKV_OP_RWKV7;
    wkv_dtype dtype = WKV_DTYPE_F32;
    int64_t B = 2, T = 75, H = 2, N = 64;
    bool packed = false, with_s0 = true;
    bool strided = false; // token inputs (and dy) with a gap of N after each head's N elements
    uint32_t flags = 0;

    std::string label() const {
        return std::string(op_label(op)) + " " + dtype_name(dtype) + " B=" + std::to_string(B) +
               " T=" + std::to_string(T) + " N=" + std::to_string(N) + (packed ? " packed" : "") +
               (with_s0 ? "" : " no-s0") + (flags ? " key-major" : "") + (strided ? " strided" : "");
    }
};

// A problem's tensors in wkv_buffers of one CUDA context (host copies for filling and reading).
struct DevProblem {
    wkv_context* ctx = nullptr;
    CkCase c;
    std::vector<int64_t> offsets;
    std::map<std::string, HostTensor> h;
    std::map<std::string, wkv_buffer*> b;
    wkv_forward_desc f{};
    wkv_backward_desc g{};
    wkv_buffer* ws = nullptr;
    size_t ws_bytes = 0;

    wkv_tensor put(const std::string& name, HostTensor t, const std::vector<double>* values) {
        if (values) t.fill(*values);
        else t.poison();
        h[name] = std::move(t);
        HostTensor& x = h[name];
        REQUIRE(wkv_buffer_create(ctx, x.buf.size(), &b[name]) == WKV_OK);
        REQUIRE(wkv_buffer_upload(ctx, b[name], 0, x.buf.data(), x.buf.size()) == WKV_OK);
        wkv_tensor v = wkv_tensor_make_buffer(b[name], 0, x.dtype, (int32_t)x.shape.size(), x.shape.data());
        if (!x.contiguous) v.strides = x.strides.data();
        return v;
    }
    // An input tensor: [B, T, H, N] ones strided when the case says so (gaps NaN).
    HostTensor input(wkv_dtype dt, std::vector<int64_t> shape) const {
        if (!c.strided || shape.size() != 4) return HostTensor(dt, shape);
        const int64_t n2 = 2 * shape[3];
        HostTensor t(dt, shape, {shape[1] * shape[2] * n2, shape[2] * n2, n2, 1}, 0);
        t.poison();
        return t;
    }

    DevProblem(wkv_context* cx, const CkCase& cs) : ctx(cx), c(cs) {
        Rng rng(4321 + (uint64_t)c.N + (uint64_t)c.T);
        const int64_t rows = c.packed ? 1 : c.B;
        AnyProblem ap = any_random(rng, c.op, rows, c.T, c.H, c.N);
        AnyProblem sp = ap; // state shapes: one per sequence
        if (c.packed) {
            offsets = {0, 5, 5, c.T - 33, c.T}; // an empty sequence, one shorter than K1
            AnyProblem st = any_random(rng, c.op, 4, 1, c.H, c.N);
            ap.in["s0"] = st.in["s0"];
            ap.in["dsT"] = st.in["dsT"];
            sp.B = 4;
        }
        f.struct_size = sizeof f;
        f.op = c.op;
        f.decay_form = ap.form;
        f.flags = c.flags;
        for (const auto& name : any_inputs(c.op)) {
            *any_detail::slot(f, name) = put(name, input(c.dtype, any_shape(ap, name)), &ap.in.at(name));
        }
        if (c.with_s0) f.state_in = put("s0", HostTensor(WKV_DTYPE_F32, any_shape(sp, "s0")), &ap.in.at("s0"));
        f.y = put("y", HostTensor(c.dtype, any_shape(ap, "y")), nullptr);
        f.state_out = put("sT", HostTensor(WKV_DTYPE_F32, any_shape(sp, "sT")), nullptr);
        if (c.packed) {
            f.seq_offsets = offsets.data();
            f.num_seqs = 4;
        }
        g.struct_size = sizeof g;
        g.forward = &f;
        g.dy = put("dy", input(c.dtype, any_shape(ap, "y")), &ap.in.at("dy"));
        g.dstate_out = put("dsT", HostTensor(WKV_DTYPE_F32, any_shape(sp, "dsT")), &ap.in.at("dsT"));
        for (const auto& name : any_grads(c.op)) {
            const bool state = name == "ds0";
            const AnyProblem& shp = state ? sp : ap;
            *any_detail::grad_slot(g, name) =
                put(name, HostTensor(state ? WKV_DTYPE_F32 : c.dtype, any_shape(shp, name)), nullptr);
        }
        REQUIRE(wkv_workspace_size(ctx, &ws_bytes, &g) == WKV_OK);
        REQUIRE(wkv_buffer_create(ctx, ws_bytes, &ws) == WKV_OK);
        g.workspace = ws;
        g.workspace_size = ws_bytes;
    }
    ~DevProblem() {
        for (auto& kv : b) wkv_buffer_destroy(kv.second);
        wkv_buffer_destroy(ws);
    }
    DevProblem(const DevProblem&) = delete;
    DevProblem& operator=(const DevProblem&) = delete;

    std::vector<std::string> outputs(bool backward) const {
        return backward ? any_grads(c.op) : std::vector<std::string>{"y", "sT"};
    }
    void poison(bool backward) {
        for (const auto& name : outputs(backward)) {
            HostTensor& x = h[name];
            x.poison();
            REQUIRE(wkv_buffer_upload(ctx, b[name], 0, x.buf.data(), x.buf.size()) == WKV_OK);
        }
    }
    void poison_workspace() {
        std::vector<unsigned char> ff(ws_bytes, 0xff);
        REQUIRE(wkv_buffer_upload(ctx, ws, 0, ff.data(), ff.size()) == WKV_OK);
    }
    std::vector<unsigned char> bytes(bool backward) {
        std::vector<unsigned char> out;
        for (const auto& name : outputs(backward)) {
            HostTensor& x = h[name];
            REQUIRE(wkv_buffer_download(ctx, b[name], 0, x.buf.data(), x.buf.size()) == WKV_OK);
            out.insert(out.end(), x.buf.begin(), x.buf.end());
        }
        return out;
    }
    bool any_nan(const std::string& name) {
        HostTensor& x = h[name];
        REQUIRE(wkv_buffer_download(ctx, b[name], 0, x.buf.data(), x.buf.size()) == WKV_OK);
        for (double v : x.read())
            if (std::isnan(v)) return true;
        return false;
    }
};

void check_case(const CkCase& c) {
    CAPTURE(c.label());
    wkv_context* ctx = nullptr;
    wkv_context_options o{};
    o.struct_size = sizeof o;
    o.backend = WKV_BACKEND_CUDA;
    REQUIRE(wkv_context_create(&o, &ctx) == WKV_OK);
    {
        DevProblem p(ctx, c);
        // plain forward, recomputing backward
        REQUIRE(wkv_forward(ctx, &p.f) == WKV_OK);
        const std::vector<unsigned char> fwd_plain = p.bytes(false);
        p.poison_workspace();
        REQUIRE(wkv_backward(ctx, &p.g) == WKV_OK);
        const std::vector<unsigned char> grads = p.bytes(true);
        for (const auto& name : p.outputs(true)) CHECK_MESSAGE(!p.any_nan(name), name);

        // saving forward, reusing backward (twice: the checkpoints stay)
        p.poison_workspace();
        p.poison(false);
        p.poison(true);
        p.f.workspace = p.ws;
        p.f.workspace_size = p.ws_bytes;
        INFO(std::string(wkv_last_error(ctx)));
        REQUIRE(wkv_forward(ctx, &p.f) == WKV_OK);
        CHECK(p.bytes(false) == fwd_plain);
        p.g.flags = WKV_BACKWARD_REUSE_CHECKPOINTS;
        REQUIRE(wkv_backward(ctx, &p.g) == WKV_OK);
        CHECK(p.bytes(true) == grads);
        p.poison(true);
        REQUIRE(wkv_backward(ctx, &p.g) == WKV_OK);
        CHECK(p.bytes(true) == grads);

        // the reusing backward reads what the forward saved: spoil it (NaN) after a saving
        // forward and the gradients show it where the forward saves, not where it does not
        REQUIRE(wkv_forward(ctx, &p.f) == WKV_OK);
        p.poison_workspace();
        p.poison(true);
        REQUIRE(wkv_backward(ctx, &p.g) == WKV_OK);
        const bool saves = c.N != 128 && (c.op == WKV_OP_RWKV7 || c.op == WKV_OP_RWKV6);
        CHECK(p.any_nan("dr") == saves);
        if (!saves) CHECK(p.bytes(true) == grads);
    }
    wkv_context_destroy(ctx);
}

} // namespace

TEST_CASE("cuda checkpoints: a backward reusing the forward's checkpoints is bit-identical to one that recomputes them") {
    CUDA_TEST_OR_SKIP();
    for (int64_t N : {int64_t(64), int64_t(32), int64_t(128)}) {
        CkCase c;
        c.N = N;
        check_case(c); // T = 75: 9 segments of K1 = 8 and a tail of 3
        CkCase one = c; one.T = 1; check_case(one); // the decode kernel
        CkCase pk = c; pk.packed = true; pk.dtype = WKV_DTYPE_BF16; check_case(pk);
        CkCase ns = c; ns.with_s0 = false; ns.T = 16; ns.dtype = WKV_DTYPE_F16; check_case(ns);
        CkCase km = c; km.flags = WKV_FLAG_STATE_KEY_MAJOR; km.T = 9; check_case(km);
    }
    // RWKV-6: the row scan saves at chunk starts and mid-chunk (K = 8, 16 tokens staged)
    for (int64_t N : {int64_t(64), int64_t(32), int64_t(128)}) {
        CkCase c;
        c.op = WKV_OP_RWKV6;
        c.N = N;
        check_case(c); // T = 75: 4 whole chunks, a tail of 11 (one more checkpoint mid-tail)
        CkCase one = c; one.T = 1; check_case(one);
        CkCase pk = c; pk.packed = true; pk.dtype = WKV_DTYPE_BF16; check_case(pk);
        CkCase ns = c; ns.with_s0 = false; ns.T = 16; ns.dtype = WKV_DTYPE_F16; check_case(ns);
        CkCase km = c; km.flags = WKV_FLAG_STATE_KEY_MAJOR; km.T = 9; check_case(km);
        CkCase sd = c; sd.strided = true; sd.T = 40; sd.dtype = WKV_DTYPE_BF16; check_case(sd);
    }
    CkCase sd7; // RWKV-7 strided, N = 64
    sd7.strided = true;
    sd7.T = 40;
    check_case(sd7);
}
