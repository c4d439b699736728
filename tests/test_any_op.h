// Any op (RWKV-7, RWKV-6, RWKV-4), forward and backward, on any context, with host float32
// tensors: a small problem as named float64 arrays, its float64 reference, and a run through
// the public API whose outputs are poisoned with NaN first. Shared by the fault-injection and
// the NaN/Inf tests of every backend (tests/, backends/vulkan/tests, backends/cuda/tests): host
// tensors are accepted by every backend, so one runner serves them all. Header-only.
#ifndef WKV_TESTS_TEST_ANY_OP_H
#define WKV_TESTS_TEST_ANY_OP_H

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "test_util.h"
#include "test_util_ops.h"

namespace wkvtest {

// Named float64 arrays: inputs r w k v a b u s0 dy dsT (the op's), or outputs y sT and the
// gradients dr dw dk dv da db du ds0 (the op's). s0 and dsT are always present.
using Arrays = std::map<std::string, std::vector<double>>;

struct AnyProblem {
    wkv_op op = WKV_OP_RWKV7;
    wkv_decay_form form = WKV_DECAY_CLAMPW;
    int64_t B = 1, T = 1, H = 1, N = 1; // RWKV-4: H = 1, N = C
    Arrays in;
};

inline const char* op_label(wkv_op op) {
    return op == WKV_OP_RWKV7 ? "rwkv7" : op == WKV_OP_RWKV6 ? "rwkv6" : "rwkv4";
}

// The op's per-token and per-channel inputs, in descriptor order.
inline std::vector<std::string> any_inputs(wkv_op op) {
    if (op == WKV_OP_RWKV7) return {"r", "w", "k", "v", "a", "b"};
    if (op == WKV_OP_RWKV6) return {"r", "w", "k", "v", "u"};
    return {"w", "u", "k", "v"};
}

// Gradient name of each input, and of the state.
inline std::vector<std::string> any_grads(wkv_op op) {
    std::vector<std::string> g;
    for (const auto& x : any_inputs(op)) g.push_back("d" + x);
    g.push_back("ds0");
    return g;
}

inline std::vector<int64_t> any_shape(const AnyProblem& p, const std::string& name) {
    const std::string base = name[0] == 'd' && name != "dy" && name != "dsT" ? name.substr(1) : name;
    const bool r4 = p.op == WKV_OP_RWKV4;
    if (base == "s0" || base == "sT" || base == "dsT")
        return r4 ? std::vector<int64_t>{p.B, 3, p.N} : std::vector<int64_t>{p.B, p.H, p.N, p.N};
    if (r4 && (base == "w" || base == "u")) return {p.N};
    if (base == "u") return {p.H, p.N};
    return r4 ? std::vector<int64_t>{p.B, p.T, p.N} : std::vector<int64_t>{p.B, p.T, p.H, p.N};
}

inline size_t any_count(const AnyProblem& p, const std::string& name) {
    size_t n = 1;
    for (int64_t d : any_shape(p, name)) n *= static_cast<size_t>(d);
    return n;
}

// Random inputs drawn as the golden files' README describes (random_rwkv7/6/4), a state s0,
// dy ~ N(0, 1) and dsT ~ N(0, 0.1^2). RWKV-4 ignores H and form (C = N, EXP_NEG_EXP).
inline AnyProblem any_random(Rng& rng, wkv_op op, int64_t B, int64_t T, int64_t H, int64_t N,
                             wkv_decay_form form = WKV_DECAY_CLAMPW) {
    AnyProblem p;
    p.op = op;
    p.B = B;
    p.T = T;
    p.H = op == WKV_OP_RWKV4 ? 1 : H;
    p.N = N;
    p.form = op == WKV_OP_RWKV4 ? WKV_DECAY_EXP_NEG_EXP : form;
    if (op == WKV_OP_RWKV7) {
        Rwkv7Data d = random_rwkv7(rng, B, T, H, N, form, true);
        p.in = {{"r", d.r}, {"w", d.w}, {"k", d.k}, {"v", d.v}, {"a", d.a}, {"b", d.b}, {"s0", d.s0}};
    } else if (op == WKV_OP_RWKV6) {
        Rwkv6Data d = random_rwkv6(rng, B, T, H, N, form, true);
        p.in = {{"r", d.r}, {"w", d.w}, {"k", d.k}, {"v", d.v}, {"u", d.u}, {"s0", d.s0}};
    } else {
        Rwkv4Data d = random_rwkv4(rng, B, T, N, 1.0, true);
        p.in = {{"w", d.w}, {"u", d.u}, {"k", d.k}, {"v", d.v}, {"s0", d.s0}};
    }
    p.in["dy"] = random_normal(rng, any_count(p, "y"), 1.0);
    p.in["dsT"] = random_normal(rng, any_count(p, "sT"), 0.1);
    return p;
}

// The float64 reference: y, sT and the op's gradients.
inline Arrays any_reference(const AnyProblem& p) {
    Arrays o;
    const Arrays& in = p.in;
    if (p.op == WKV_OP_RWKV7) {
        Rwkv7Data d;
        d.B = p.B; d.T = p.T; d.H = p.H; d.N = p.N; d.form = p.form;
        d.r = in.at("r"); d.w = in.at("w"); d.k = in.at("k"); d.v = in.at("v");
        d.a = in.at("a"); d.b = in.at("b"); d.s0 = in.at("s0");
        ref_forward(d, o["y"], o["sT"]);
        Rwkv7Grads g = ref_backward(d, in.at("dy"), in.at("dsT"));
        o["dr"] = g.dr; o["dw"] = g.dw; o["dk"] = g.dk; o["dv"] = g.dv;
        o["da"] = g.da; o["db"] = g.db; o["ds0"] = g.ds0;
    } else if (p.op == WKV_OP_RWKV6) {
        Rwkv6Data d;
        d.B = p.B; d.T = p.T; d.H = p.H; d.N = p.N; d.form = p.form;
        d.r = in.at("r"); d.w = in.at("w"); d.k = in.at("k"); d.v = in.at("v");
        d.u = in.at("u"); d.s0 = in.at("s0");
        ref6_forward(d, o["y"], o["sT"]);
        Rwkv6Grads g = ref6_backward(d, in.at("dy"), in.at("dsT"));
        o["dr"] = g.dr; o["dw"] = g.dw; o["dk"] = g.dk; o["dv"] = g.dv;
        o["du"] = g.du; o["ds0"] = g.ds0;
    } else {
        Rwkv4Data d;
        d.B = p.B; d.T = p.T; d.C = p.N;
        d.w = in.at("w"); d.u = in.at("u"); d.k = in.at("k"); d.v = in.at("v"); d.s0 = in.at("s0");
        ref4_forward(d, o["y"], o["sT"]);
        Rwkv4Grads g = ref4_backward(d, in.at("dy"), in.at("dsT"));
        o["dw"] = g.dw; o["du"] = g.du; o["dk"] = g.dk; o["dv"] = g.dv; o["ds0"] = g.ds0;
    }
    return o;
}

// What a run through the library gave.
struct AnyRun {
    wkv_status forward = WKV_OK, workspace = WKV_OK, backward = WKV_OK;
    std::string forward_msg, backward_msg; // wkv_last_error after a failing call
    // false when a failing call wrote any output (every output is poisoned with NaN first, and
    // a failing call must leave it so)
    bool failures_untouched = true;
    Arrays out; // y, sT (after a successful forward), the gradients (after a successful backward)
};

namespace any_detail {
inline wkv_tensor* slot(wkv_forward_desc& f, const std::string& name) {
    if (name == "r") return &f.r;
    if (name == "w") return &f.w;
    if (name == "k") return &f.k;
    if (name == "v") return &f.v;
    if (name == "a") return &f.a;
    if (name == "b") return &f.b;
    return &f.u;
}
inline wkv_tensor* grad_slot(wkv_backward_desc& g, const std::string& name) {
    if (name == "dr") return &g.dr;
    if (name == "dw") return &g.dw;
    if (name == "dk") return &g.dk;
    if (name == "dv") return &g.dv;
    if (name == "da") return &g.da;
    if (name == "db") return &g.db;
    if (name == "du") return &g.du;
    return &g.dstate_in;
}
} // namespace any_detail

// Runs p's forward (with state_in = s0, state_out) and, when `backward`, its backward (with
// dstate_out = dsT, dstate_in) on ctx, host float32 tensors, outputs poisoned.
inline AnyRun any_run(wkv_context* ctx, const AnyProblem& p, bool backward = true) {
    AnyRun run;
    std::map<std::string, std::unique_ptr<HostTensor>> t;
    auto make = [&](const std::string& name) -> HostTensor& {
        t[name].reset(new HostTensor(WKV_DTYPE_F32, any_shape(p, name)));
        return *t[name];
    };
    wkv_forward_desc f{};
    f.struct_size = sizeof f;
    f.op = p.op;
    f.decay_form = p.form;
    if (p.op == WKV_OP_RWKV4) f.flags = 0;
    for (const auto& name : any_inputs(p.op)) {
        make(name).fill(p.in.at(name));
        *any_detail::slot(f, name) = t[name]->view();
    }
    make("s0").fill(p.in.at("s0"));
    f.state_in = t["s0"]->view();
    make("y").poison();
    f.y = t["y"]->view();
    make("sT").poison();
    f.state_out = t["sT"]->view();
    run.forward = wkv_forward(ctx, &f);
    if (run.forward != WKV_OK) {
        run.forward_msg = wkv_last_error(ctx);
        run.failures_untouched = all_nan(*t["y"]) && all_nan(*t["sT"]);
        return run;
    }
    run.out["y"] = t["y"]->read();
    run.out["sT"] = t["sT"]->read();
    if (!backward) return run;

    wkv_backward_desc g{};
    g.struct_size = sizeof g;
    g.forward = &f;
    make("dy").fill(p.in.at("dy"));
    g.dy = t["dy"]->view();
    make("dsT").fill(p.in.at("dsT"));
    g.dstate_out = t["dsT"]->view();
    for (const auto& name : any_grads(p.op)) {
        make(name).poison();
        *any_detail::grad_slot(g, name) = t[name]->view();
    }
    size_t bytes = 0;
    run.workspace = wkv_workspace_size(ctx, &bytes, &g);
    if (run.workspace != WKV_OK) {
        run.backward_msg = wkv_last_error(ctx);
        return run;
    }
    Workspace ws(bytes);
    g.workspace = ws.data();
    g.workspace_size = bytes;
    run.backward = wkv_backward(ctx, &g);
    if (run.backward != WKV_OK) {
        run.backward_msg = wkv_last_error(ctx);
        for (const auto& name : any_grads(p.op)) run.failures_untouched &= all_nan(*t[name]);
        return run;
    }
    for (const auto& name : any_grads(p.op)) run.out[name] = t[name]->read();
    return run;
}

// Largest norm-wise relative error of the run's outputs against the reference (all finite).
inline double any_max_err(const AnyRun& run, const Arrays& ref) {
    double worst = 0.0;
    for (const auto& kv : run.out) worst = std::max(worst, rel_err(kv.second, ref.at(kv.first)));
    return worst;
}

} // namespace wkvtest

#endif
