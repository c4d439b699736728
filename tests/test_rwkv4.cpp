// RWKV-4 through the public API on the CPU backend: the golden files in f32/f16/bf16, fresh
// random inputs against the float64 reference (odd C, long T with k ~ N(0, 20^2), k up to +-60,
// planar and interleaved states, strides, packing, dtypes), determinism over thread counts,
// the workspace formula, the reference's backward against finite differences, and bad inputs
// of the new fields.
//
// The seed is new each run and printed with every failure; WKV_TEST_SEED=<seed> reproduces a
// run. Outputs and the workspace are NaN before each call (and the gaps of strided tensors,
// inputs included); gaps of outputs must stay NaN, inputs must come back unchanged, and nothing
// may be written past wkv_workspace_size() bytes.
#include "wkv_doctest.h"

#include <filesystem>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "golden.h"
#include "test_isa.h"
#include "test_util_ops.h"

using namespace wkvtest;

namespace {

// ------------------------------------------------------------------------------ the runner

enum Role { R_W, R_U, R_K, R_V, R_Y, R_DY, R_DW, R_DU, R_DK, R_DV, R_COUNT };

struct Config {
    int64_t B = 1, T = 1, C = 1;
    double k_std = 0.5;       // k ~ N(0, k_std^2)
    double k_uniform = 0.0;   // > 0: k ~ U(-k_uniform, k_uniform) instead
    wkv_dtype dtype = WKV_DTYPE_F32;
    bool mixed = false;       // every tensor its own dtype (f32, bf16, f16 in turn)
    bool state_in = false, state_out = false, dstate_out = false, dstate_in = false;
    Layout layout = Layout::Contiguous;
    bool interleaved = false;  // WKV_FLAG_RWKV4_STATE_INTERLEAVED: [S,C,3]
    bool padded_state = false; // states with gaps and a byte_offset
    bool in_place = false;     // state_out is state_in
    int threads = 2;
    wkv_parallel_for_fn pf = nullptr;

    wkv_dtype dtype_of(int role) const {
        static const wkv_dtype rot[3] = {WKV_DTYPE_F32, WKV_DTYPE_BF16, WKV_DTYPE_F16};
        return mixed ? rot[role % 3] : dtype;
    }
    bool any16() const {
        for (int r = 0; r < R_COUNT; r++)
            if (dtype_of(r).bits == 16) return true;
        return false;
    }
    std::string describe() const {
        std::ostringstream s;
        s << "B=" << B << " T=" << T << " C=" << C << " k_std=" << k_std
          << " k_uniform=" << k_uniform << " dtype=" << (mixed ? "mixed" : dtype_name(dtype))
          << " state_in=" << state_in << " state_out=" << state_out
          << " dstate_out=" << dstate_out << " dstate_in=" << dstate_in
          << " layout=" << layout_name(layout) << " interleaved=" << interleaved
          << " padded_state=" << padded_state << " in_place=" << in_place
          << " threads=" << threads << (pf ? " (reverse parallel_for)" : "");
        return s.str();
    }
};

// w, u and their gradients [C]: contiguous, or (any other layout) with a stride of 3.
HostTensor param_tensor(const Config& c, wkv_dtype dt) {
    if (c.layout == Layout::Contiguous) return HostTensor(dt, {c.C});
    return HostTensor(dt, {c.C}, {3}, 1);
}

HostTensor state_tensor(const Config& c, int64_t S) {
    const int64_t C = c.C;
    if (c.interleaved) {
        if (c.padded_state) return HostTensor(WKV_DTYPE_F32, {S, C, 3}, {4 * C + 3, 4, 1}, 1);
        return HostTensor(WKV_DTYPE_F32, {S, C, 3});
    }
    if (c.padded_state) return HostTensor(WKV_DTYPE_F32, {S, 3, C}, {3 * (C + 1) + 2, C + 1, 1}, 2);
    return HostTensor(WKV_DTYPE_F32, {S, 3, C});
}

// Planar [S,3,C] (the reference's) <-> the library's layout.
std::vector<double> to_lib(const Config& c, int64_t S, const std::vector<double>& x) {
    return c.interleaved ? permute(x, {S, 3, c.C}, {0, 2, 1}) : x;
}
std::vector<double> from_lib(const Config& c, int64_t S, const std::vector<double>& x) {
    return c.interleaved ? permute(x, {S, c.C, 3}, {0, 2, 1}) : x;
}

struct Results {
    std::vector<double> y, sT, dw, du, dk, dv, ds0;
    std::vector<std::vector<unsigned char>> raw;
};

Results run_library(const Config& c, const Rwkv4Data& d, const std::vector<double>& dy,
                    const std::vector<double>& dsT, const std::vector<int64_t>& offsets) {
    CpuCtx holder(c.threads, c.pf);
    REQUIRE_MESSAGE(holder.status == WKV_OK, std::string(wkv_last_error(nullptr)));
    wkv_context* ctx = holder.ctx;
    const int64_t num_seqs = offsets.empty() ? 0 : static_cast<int64_t>(offsets.size()) - 1;
    const int64_t S = num_seqs > 0 ? num_seqs : c.B;

    std::vector<HostTensor> in(4);
    in[0] = param_tensor(c, c.dtype_of(R_W));
    in[1] = param_tensor(c, c.dtype_of(R_U));
    in[2] = token_tensor(c.dtype_of(R_K), c.B, c.T, 0, c.C, c.layout);
    in[3] = token_tensor(c.dtype_of(R_V), c.B, c.T, 0, c.C, c.layout);
    const std::vector<double>* vals[4] = {&d.w, &d.u, &d.k, &d.v};
    for (size_t i = 0; i < 4; i++) fill_input(in[i], *vals[i]);
    HostTensor y = token_tensor(c.dtype_of(R_Y), c.B, c.T, 0, c.C, c.layout);
    HostTensor s_in = state_tensor(c, S), s_out = state_tensor(c, S);
    if (c.state_in) fill_input(s_in, to_lib(c, S, d.s0));

    wkv_forward_desc f{};
    f.struct_size = sizeof f;
    f.op = WKV_OP_RWKV4;
    f.decay_form = WKV_DECAY_EXP_NEG_EXP;
    f.flags = c.interleaved ? static_cast<uint32_t>(WKV_FLAG_RWKV4_STATE_INTERLEAVED) : 0u;
    f.w = in[0].view();
    f.u = in[1].view();
    f.k = in[2].view();
    f.v = in[3].view();
    f.y = y.view();
    if (c.state_in) f.state_in = s_in.view();
    if (c.state_out) f.state_out = c.in_place ? s_in.view() : s_out.view();
    f.seq_offsets = num_seqs ? offsets.data() : nullptr;
    f.num_seqs = num_seqs;

    Unchanged fwd_inputs;
    const char* names[4] = {"w", "u", "k", "v"};
    for (size_t i = 0; i < 4; i++) fwd_inputs.add(in[i], names[i]);
    if (c.state_in && !c.in_place) fwd_inputs.add(s_in, "state_in");

    y.poison();
    if (!c.in_place) s_out.poison();
    forward_ok(ctx, f);
    Results res;
    res.y = read_output(y, res.raw);
    if (c.state_out) res.sT = from_lib(c, S, read_output(c.in_place ? s_in : s_out, res.raw));
    fwd_inputs.check("forward");

    // The backward reads state_in again: after an in-place forward it holds sT, so restore s0.
    if (c.state_in && c.in_place) fill_input(s_in, to_lib(c, S, d.s0));
    HostTensor dyt = token_tensor(c.dtype_of(R_DY), c.B, c.T, 0, c.C, c.layout);
    fill_input(dyt, dy);
    HostTensor ds_out = state_tensor(c, S), ds_in = state_tensor(c, S);
    if (c.dstate_out) fill_input(ds_out, to_lib(c, S, dsT));
    std::vector<HostTensor> g(4);
    g[0] = param_tensor(c, c.dtype_of(R_DW));
    g[1] = param_tensor(c, c.dtype_of(R_DU));
    g[2] = token_tensor(c.dtype_of(R_DK), c.B, c.T, 0, c.C, c.layout);
    g[3] = token_tensor(c.dtype_of(R_DV), c.B, c.T, 0, c.C, c.layout);
    for (HostTensor& t : g) t.poison();
    ds_in.poison();
    y.poison(); // the backward ignores the forward's outputs: garbage there, to be sure
    Unchanged bwd_inputs;
    for (size_t i = 0; i < 4; i++) bwd_inputs.add(in[i], names[i]);
    if (c.state_in) bwd_inputs.add(s_in, "state_in");
    bwd_inputs.add(dyt, "dy");
    if (c.dstate_out) bwd_inputs.add(ds_out, "dstate_out");

    wkv_backward_desc bd{};
    bd.struct_size = sizeof bd;
    bd.forward = &f;
    bd.dy = dyt.view();
    if (c.dstate_out) bd.dstate_out = ds_out.view();
    bd.dw = g[0].view();
    bd.du = g[1].view();
    bd.dk = g[2].view();
    bd.dv = g[3].view();
    if (c.dstate_in) bd.dstate_in = ds_in.view();
    backward_ok(ctx, bd);
    std::vector<double>* outs[4] = {&res.dw, &res.du, &res.dk, &res.dv};
    for (size_t i = 0; i < 4; i++) *outs[i] = read_output(g[i], res.raw);
    if (c.dstate_in) res.ds0 = from_lib(c, S, read_output(ds_in, res.raw));
    bwd_inputs.check("backward");
    return res;
}

// ------------------------------------------------------------------------------ problems

struct Problem {
    Rwkv4Data d;
    std::vector<double> dy, dsT; // dsT planar, one state per slot (empty: none)
};

Problem make_problem(const Config& c, int64_t S, Rng& rng) {
    Problem p;
    p.d = random_rwkv4(rng, c.B, c.T, c.C, c.k_std, false);
    if (c.k_uniform > 0)
        for (double& x : p.d.k) x = rng.uniform(-c.k_uniform, c.k_uniform);
    if (c.state_in) {
        Rwkv4Data pre = p.d;
        pre.B = S;
        pre.T = 16;
        pre.k = random_normal(rng, pre.tok_count(), c.k_std);
        pre.v = random_normal(rng, pre.tok_count(), 0.5);
        pre.s0.clear();
        std::vector<double> y;
        ref4_forward(pre, y, p.d.s0);
    }
    p.d.w = rounded(c.dtype_of(R_W), p.d.w);
    p.d.u = rounded(c.dtype_of(R_U), p.d.u);
    p.d.k = rounded(c.dtype_of(R_K), p.d.k);
    p.d.v = rounded(c.dtype_of(R_V), p.d.v);
    p.d.s0 = rounded(WKV_DTYPE_F32, p.d.s0);
    p.dy = rounded(c.dtype_of(R_DY), random_normal(rng, p.d.tok_count()));
    if (c.dstate_out) p.dsT = rounded(WKV_DTYPE_F32, random_normal(rng, static_cast<size_t>(S * 3 * c.C)));
    return p;
}

struct RefOut {
    std::vector<double> y, sT;
    Rwkv4Grads g;
};

// The empty state [3,C]: aa = bb = 0, pp = -1e38.
std::vector<double> empty_state(int64_t C) {
    std::vector<double> s(static_cast<size_t>(3 * C), 0.0);
    for (int64_t c = 0; c < C; c++) s[static_cast<size_t>(2 * C + c)] = WKV_REF_RWKV4_PP_EMPTY;
    return s;
}

RefOut reference(const Problem& p, const std::vector<int64_t>& offsets) {
    RefOut o;
    const Rwkv4Data& d = p.d;
    if (offsets.empty()) {
        ref4_forward(d, o.y, o.sT);
        o.g = ref4_backward(d, p.dy, p.dsT);
        return o;
    }
    const size_t S = offsets.size() - 1, C = static_cast<size_t>(d.C), SC = 3 * C;
    o.y.assign(d.tok_count(), 0.0);
    o.sT.assign(S * SC, 0.0);
    o.g.ds0.assign(S * SC, 0.0);
    o.g.dk.assign(d.tok_count(), 0.0);
    o.g.dv.assign(d.tok_count(), 0.0);
    o.g.dw.assign(C, 0.0);
    o.g.du.assign(C, 0.0);
    for (size_t s = 0; s < S; s++) {
        const size_t t0 = static_cast<size_t>(offsets[s]), t1 = static_cast<size_t>(offsets[s + 1]);
        const std::vector<double> s0 = d.s0.empty() ? empty_state(d.C) : slice(d.s0, s * SC, (s + 1) * SC);
        const std::vector<double> dsT = p.dsT.empty() ? std::vector<double>(SC, 0.0) : slice(p.dsT, s * SC, (s + 1) * SC);
        if (t1 == t0) {
            put(o.sT, s0, s * SC);
            put(o.g.ds0, dsT, s * SC);
            continue;
        }
        Rwkv4Data q;
        q.B = 1;
        q.T = static_cast<int64_t>(t1 - t0);
        q.C = d.C;
        q.w = d.w;
        q.u = d.u;
        q.k = slice(d.k, t0 * C, t1 * C);
        q.v = slice(d.v, t0 * C, t1 * C);
        q.s0 = s0;
        std::vector<double> y, sT;
        ref4_forward(q, y, sT);
        Rwkv4Grads g = ref4_backward(q, slice(p.dy, t0 * C, t1 * C), dsT);
        put(o.y, y, t0 * C);
        put(o.sT, sT, s * SC);
        put(o.g.dk, g.dk, t0 * C);
        put(o.g.dv, g.dv, t0 * C);
        put(o.g.ds0, g.ds0, s * SC);
        for (size_t x = 0; x < C; x++) {
            o.g.dw[x] += g.dw[x];
            o.g.du[x] += g.du[x];
        }
    }
    return o;
}

// The three parts of a planar state [S,3,C] one at a time.
std::vector<double> part_of(const std::vector<double>& x, int64_t S, int64_t C, int part) {
    std::vector<double> out;
    for (int64_t s = 0; s < S; s++)
        for (int64_t c = 0; c < C; c++) out.push_back(x[static_cast<size_t>((s * 3 + part) * C + c)]);
    return out;
}

Results check_config(const Config& c, uint64_t seed, const std::vector<int64_t>& lens = {}) {
    const std::vector<int64_t> offsets = lens.empty() ? std::vector<int64_t>() : offsets_of(lens);
    const int64_t S = lens.empty() ? c.B : static_cast<int64_t>(lens.size());
    Rng rng(seed);
    Problem p = make_problem(c, S, rng);
    INFO("seed " << seed << ": " << c.describe() << std::string(lens.empty() ? "" : " packed"));
    const Results got = run_library(c, p.d, p.dy, p.dsT, offsets);
    const RefOut ref = reference(p, offsets);
    Problem q = p;
    for (auto* x : {&q.d.w, &q.d.u, &q.d.k, &q.d.v, &q.d.s0, &q.dy, &q.dsT}) perturb(rng, *x);
    const RefOut pert = reference(q, offsets);

    const bool is16 = c.any16();
    auto check = [&](const std::string& name, const std::vector<double>& g,
                     const std::vector<double>& r, const std::vector<double>& pr, bool forward) {
        const double base = is16 ? (forward ? kTol16Forward : kTol16Grad) : kTolF32;
        const double tol = cond_tol(base, rel_err(pr, r));
        const double err = rel_err(g, r);
        if (std::getenv("WKV_TEST_VERBOSE"))
            MESSAGE(c.describe() << "  " << name << ": rel_err " << err << " tol " << tol);
        INFO(name << ": rel_err " << err << " tol " << tol);
        CHECK(err <= tol);
    };
    check("y", got.y, ref.y, pert.y, true);
    const char* parts[3] = {"aa", "bb", "pp"};
    for (int k = 0; k < 3; k++) {
        if (c.state_out)
            check(std::string("state_out ") + parts[k], part_of(got.sT, S, c.C, k),
                  part_of(ref.sT, S, c.C, k), part_of(pert.sT, S, c.C, k), true);
        if (c.dstate_in)
            check(std::string("dstate_in ") + parts[k], part_of(got.ds0, S, c.C, k),
                  part_of(ref.g.ds0, S, c.C, k), part_of(pert.g.ds0, S, c.C, k), false);
    }
    check("dw", got.dw, ref.g.dw, pert.g.dw, false);
    check("du", got.du, ref.g.du, pert.g.du, false);
    check("dk", got.dk, ref.g.dk, pert.g.dk, false);
    check("dv", got.dv, ref.g.dv, pert.g.dv, false);
    return got;
}

Config full_state(Config c) {
    c.state_in = c.state_out = c.dstate_out = c.dstate_in = true;
    return c;
}

}  // namespace

// ================================================================================ golden

TEST_CASE("rwkv4: golden files through the library, f32/f16/bf16") {
    const std::vector<std::string> files = golden_files("wkv4_");
    REQUIRE(files.size() >= 2);
    wkv_backend_info info{};
    info.struct_size = sizeof info;
    REQUIRE(wkv_backend_get_info(WKV_BACKEND_CPU, &info) == WKV_OK);
    const wkv_dtype dtypes[3] = {WKV_DTYPE_F32, WKV_DTYPE_F16, WKV_DTYPE_BF16};
    for (const std::string& path : files) {
        for (const wkv_dtype& dt : dtypes)
            for (int threads : {1, 3}) {
                wkv_golden_options o{};
                o.backend = WKV_BACKEND_CPU;
                o.dtype = dt;
                o.cpu_threads = threads;
                wkv_golden_result r;
                wkv_golden_run_ex(path.c_str(), &o, &r);
                char line[1024];
                wkv_golden_format(&r, line, sizeof line);
                INFO(std::filesystem::path(path).filename().string() << " threads=" << threads << "  " << line);
                CHECK(r.op == WKV_OP_RWKV4);
                CHECK(wkv_golden_backend_claims(&info, &r, nullptr, 0) == 1);
                CHECK(r.status == WKV_GOLDEN_PASS);
            }
        wkv_golden_result r;
        wkv_golden_run_reference(path.c_str(), &r);
        INFO(path << " float64 reference: " << r.message);
        CHECK(r.status == WKV_GOLDEN_PASS);
    }
}

// ========================================================================= random inputs

TEST_CASE("rwkv4: random inputs against the float64 reference") {
    const uint64_t seed = test_seed();
    std::vector<Config> cs;
    Config c;
    // T = 1, C = 1
    c = full_state(Config{});
    cs.push_back(c);
    // C = 45: a full and a partial channel block; B = 3, interleaved states, channel stride T
    c = full_state(Config{});
    c.B = 3, c.T = 17, c.C = 45, c.interleaved = true, c.layout = Layout::Transposed;
    cs.push_back(c);
    // two checkpoint segments, f16, padded-T, padded planar states, in place
    c = full_state(Config{});
    c.B = 2, c.T = 40, c.C = 33, c.dtype = WKV_DTYPE_F16, c.layout = Layout::PaddedT;
    c.padded_state = true, c.in_place = true, c.threads = 3;
    cs.push_back(c);
    // every tensor its own dtype, inner stride 2, padded interleaved states, large k
    c = full_state(Config{});
    c.B = 2, c.T = 33, c.C = 70, c.mixed = true, c.layout = Layout::InnerStride;
    c.interleaved = true, c.padded_state = true, c.k_std = 4.0;
    cs.push_back(c);
    // bf16
    c = full_state(Config{});
    c.B = 1, c.T = 65, c.C = 64, c.dtype = WKV_DTYPE_BF16;
    cs.push_back(c);
    // no state at all (the empty initial state), three segments
    c = Config{};
    c.B = 2, c.T = 65, c.C = 7;
    cs.push_back(c);
    // the gradient w.r.t. the empty initial state, and a final state
    c = Config{};
    c.B = 2, c.T = 3, c.C = 5, c.state_out = true, c.dstate_in = true;
    cs.push_back(c);
    for (size_t i = 0; i < cs.size(); i++) check_config(cs[i], seed + i);
}

TEST_CASE("rwkv4: extreme inputs do not overflow: k ~ N(0, 20^2) over T = 1000, k up to +-60") {
    const uint64_t seed = test_seed();
    Config c = full_state(Config{});
    c.B = 1, c.T = 1000, c.C = 96, c.k_std = 20.0;
    Results r = check_config(c, seed);
    CHECK(all_finite(r.y));
    CHECK(all_finite(r.dk));
    CHECK(all_finite(r.ds0));
    Config e = full_state(Config{});  // without an initial state, k uniform in [-60, 60]
    e.state_in = false;
    e.B = 2, e.T = 300, e.C = 40, e.k_uniform = 60.0;
    r = check_config(e, seed + 1);
    CHECK(all_finite(r.y));
    CHECK(all_finite(r.dw));
    CHECK(all_finite(r.du));
    e.state_in = true, e.dtype = WKV_DTYPE_BF16, e.interleaved = true;
    check_config(e, seed + 2);
}

TEST_CASE("rwkv4: packed sequences, an empty one included, with and without states") {
    const uint64_t seed = test_seed();
    Config c = full_state(Config{});
    c.B = 1, c.C = 37, c.T = 46;
    check_config(c, seed, {5, 0, 40, 1});
    c.dtype = WKV_DTYPE_BF16, c.interleaved = true, c.in_place = true, c.k_std = 4.0;
    check_config(c, seed + 1, {0, 5, 40, 1});
    Config n;
    n.B = 1, n.C = 9, n.T = 34, n.layout = Layout::Transposed;
    check_config(n, seed + 2, {33, 0, 1});
    n.dstate_in = true, n.state_out = true;
    check_config(n, seed + 3, {0, 34, 0});
}

TEST_CASE("rwkv4: results are bit-identical over thread counts and work splits") {
    const uint64_t seed = test_seed();
    Config c = full_state(Config{});
    c.B = 3, c.T = 70, c.C = 100, c.k_std = 4.0, c.threads = 1;
    const Results one = check_config(c, seed);
    c.threads = 3;
    const Results three = check_config(c, seed);
    c.threads = 4;
    c.pf = reverse_parallel_for;
    const Results rev = check_config(c, seed);
    REQUIRE(one.raw.size() == three.raw.size());
    for (size_t i = 0; i < one.raw.size(); i++) {
        CHECK(one.raw[i] == three.raw[i]);
        CHECK(one.raw[i] == rev.raw[i]);
    }
    c = full_state(Config{});
    c.B = 1, c.T = 60, c.C = 65, c.threads = 1;
    const Results p1 = check_config(c, seed + 1, {20, 0, 33, 7});
    c.threads = 5;
    const Results p5 = check_config(c, seed + 1, {20, 0, 33, 7});
    for (size_t i = 0; i < p1.raw.size(); i++) CHECK(p1.raw[i] == p5.raw[i]);
}

TEST_CASE("rwkv4: wkv_workspace_size is the documented formula") {
    // workspace = 64 + [packed] A64(8 (num_seqs + 1)) + A64(16 C G) + A64(8 num_seqs C)
    //           + chunks A64(4 (4 R + 11) Wm), Wm = min(32 BG, C), BG blocks of 32 channels per
    //           item, see backends/cpu/rwkv4.cpp
    struct Shape {
        int64_t B, T, C;
        std::vector<int64_t> lens;
        int threads;
    };
    const std::vector<Shape> shapes = {{1, 1, 1, {}, 1},       {2, 37, 96, {}, 2},
                                       {3, 32, 7, {}, 16},     {1, 1000, 4096, {}, 1},
                                       {1, 46, 33, {5, 0, 40, 1}, 3}, {1, 3, 64, {0, 3, 0}, 2},
                                       {1, 40, 2048, {}, 2},   {1, 40, 2048, {}, 16},
                                       {2, 31, 1000, {}, 1},   {1, 33, 608, {}, 3}};
    for (const Shape& s : shapes) {
        CAPTURE(s.B);
        CAPTURE(s.T);
        CAPTURE(s.C);
        CAPTURE(s.threads);
        CpuCtx ctx(s.threads);
        REQUIRE(ctx.status == WKV_OK);
        const SeqSpan q = seq_span(s.B, s.T, s.lens);
        const int64_t num_seqs = q.num_seqs;
        HostTensor k(WKV_DTYPE_BF16, {s.B, s.T, s.C}), w(WKV_DTYPE_F32, {s.C});
        HostTensor dk(WKV_DTYPE_BF16, {s.B, s.T, s.C}), dv = dk, dy = dk;
        HostTensor dw(WKV_DTYPE_F32, {s.C}), du = dw;
        wkv_forward_desc f{};
        f.struct_size = sizeof f;
        f.op = WKV_OP_RWKV4;
        f.decay_form = WKV_DECAY_EXP_NEG_EXP;
        f.k = f.v = k.view();
        f.w = f.u = w.view();
        f.seq_offsets = q.offsets.empty() ? nullptr : q.offsets.data();
        f.num_seqs = q.offsets.empty() ? 0 : num_seqs;
        wkv_backward_desc g{};
        g.struct_size = sizeof g;
        g.forward = &f;
        g.dy = dy.view(), g.dk = dk.view(), g.dv = dv.view(), g.dw = dw.view(), g.du = du.view();
        size_t bytes = 0;
        REQUIRE_MESSAGE(wkv_workspace_size(ctx.ctx, &bytes, &g) == WKV_OK, std::string(wkv_last_error(ctx.ctx)));

        const uint64_t C = static_cast<uint64_t>(s.C), nb = (C + 31) / 32;
        const uint64_t seqs = std::max<uint64_t>(1, static_cast<uint64_t>(num_seqs));
        const uint64_t P = (static_cast<uint64_t>(std::max(1, s.threads)) + seqs - 1) / seqs;
        const uint64_t BG = std::min<uint64_t>(16, (nb + P - 1) / P);
        const uint64_t Wm = std::min<uint64_t>(32 * BG, C);
        const uint64_t G = q.segments, R = static_cast<uint64_t>(std::min<int64_t>(q.longest, 32));
        const uint64_t items = static_cast<uint64_t>(num_seqs) * ((nb + BG - 1) / BG);
        const uint64_t chunks = std::min<uint64_t>(items, 4u * static_cast<uint64_t>(s.threads));
        const uint64_t want = 64 + q.packed_bytes +
                              a64(16 * C * G) + a64(8 * static_cast<uint64_t>(num_seqs) * C) +
                              chunks * a64(4 * (4 * R + 11) * Wm);
        CHECK(bytes == want);
    }
}

// ======================================================================== finite differences

namespace {

double loss4(const Rwkv4Data& d, const std::vector<double>& dy, const std::vector<double>& dsT) {
    std::vector<double> y, sT;
    ref4_forward(d, y, sT);
    double L = 0.0;
    for (size_t i = 0; i < y.size(); i++) L += y[i] * dy[i];
    for (size_t i = 0; i < dsT.size(); i++) L += sT[i] * dsT[i];
    return L;
}

}  // namespace

TEST_CASE("rwkv4: the reference backward matches central finite differences") {
    const uint64_t seed = test_seed();
    for (double k_std : {0.5, 4.0}) {
        Rng rng(seed + static_cast<uint64_t>(k_std));
        Rwkv4Data d = random_rwkv4(rng, 2, 6, 3, k_std, true);
        const std::vector<double> dy = random_normal(rng, d.tok_count());
        const std::vector<double> dsT = random_normal(rng, d.state_count());
        const Rwkv4Grads g = ref4_backward(d, dy, dsT);
        const char* names[5] = {"w", "u", "k", "v", "s0"};
        std::vector<double>* xs[5] = {&d.w, &d.u, &d.k, &d.v, &d.s0};
        const std::vector<double>* gs[5] = {&g.dw, &g.du, &g.dk, &g.dv, &g.ds0};
        double worst = 0.0;
        for (int t = 0; t < 5; t++) {
            INFO("seed " << seed << " k_std " << k_std << " d" << names[t]);
            std::vector<double>& x = *xs[t];
            const double scale = rms(*gs[t]);
            REQUIRE(all_finite(*gs[t]));
            for (size_t i = 0; i < x.size(); i++) {
                const double x0 = x[i], h = 1e-6;
                x[i] = x0 + h;
                const double lp = loss4(d, dy, dsT);
                x[i] = x0 - h;
                const double lm = loss4(d, dy, dsT);
                x[i] = x0;
                const double fd = (lp - lm) / (2 * h), an = (*gs[t])[i];
                const double err = std::fabs(fd - an) / (std::fabs(an) + scale + 1e-300);
                worst = std::max(worst, err);
                INFO("element " << i << " fd " << fd << " analytic " << an);
                CHECK(err <= 1e-6);
            }
        }
        MESSAGE("rwkv4 k_std " << k_std << ": worst finite-difference error " << worst);
    }
    // Without an initial state the reference starts from aa = bb = 0, pp = -1e38: the same as
    // passing that state explicitly.
    Rng rng(seed);
    Rwkv4Data d = random_rwkv4(rng, 2, 5, 4, 1.0, false);
    std::vector<double> y0, s0T, y1, s1T;
    ref4_forward(d, y0, s0T);
    d.s0.assign(d.state_count(), 0.0);
    for (int64_t b = 0; b < d.B; b++)
        for (int64_t c = 0; c < d.C; c++) d.s0[static_cast<size_t>((b * 3 + 2) * d.C + c)] = -1e38;
    ref4_forward(d, y1, s1T);
    CHECK(y0 == y1);
    CHECK(s0T == s1T);
}

// ============================================================================ bad inputs

namespace {

struct Fixture {
    static constexpr int64_t B = 2, T = 3, C = 5;
    HostTensor w, u, k, v, y, s_in, s_out, dy, dw, du, dk, dv, ds_in, extra4, extra1;
    std::vector<unsigned char> workspace;
    wkv_forward_desc f{};
    wkv_backward_desc g{};

    Fixture() {
        Rng rng(4);
        Rwkv4Data d = random_rwkv4(rng, B, T, C, 1.0, true);
        const std::vector<int64_t> tok = {B, T, C}, st = {B, 3, C}, ch = {C};
        w = HostTensor(WKV_DTYPE_F32, ch);
        w.fill(d.w);
        u = HostTensor(WKV_DTYPE_F32, ch);
        u.fill(d.u);
        k = HostTensor(WKV_DTYPE_F32, tok);
        k.fill(d.k);
        v = HostTensor(WKV_DTYPE_F32, tok);
        v.fill(d.v);
        s_in = HostTensor(WKV_DTYPE_F32, st);
        s_in.fill(d.s0);
        for (HostTensor* o : {&y, &dy, &dk, &dv}) *o = HostTensor(WKV_DTYPE_F32, tok);
        dy.fill(random_normal(rng, d.tok_count()));
        dw = HostTensor(WKV_DTYPE_F32, ch);
        du = HostTensor(WKV_DTYPE_F32, ch);
        s_out = HostTensor(WKV_DTYPE_F32, st);
        ds_in = HostTensor(WKV_DTYPE_F32, st);
        extra4 = HostTensor(WKV_DTYPE_F32, {B, T, 1, C});
        extra1 = HostTensor(WKV_DTYPE_F32, tok);
        poison();
        f.struct_size = sizeof f;
        f.op = WKV_OP_RWKV4;
        f.decay_form = WKV_DECAY_EXP_NEG_EXP;
        f.w = w.view(), f.u = u.view(), f.k = k.view(), f.v = v.view();
        f.y = y.view();
        f.state_in = s_in.view();
        f.state_out = s_out.view();
        g.struct_size = sizeof g;
        g.forward = &f;
        g.dy = dy.view();
        g.dw = dw.view(), g.du = du.view(), g.dk = dk.view(), g.dv = dv.view();
        g.dstate_in = ds_in.view();
    }
    void poison() {
        for (HostTensor* o : {&y, &s_out, &dw, &du, &dk, &dv, &ds_in}) o->poison();
    }
    bool outputs_untouched() const {
        for (const HostTensor* o : {&y, &s_out, &dw, &du, &dk, &dv, &ds_in})
            if (!all_nan(*o)) return false;
        return true;
    }
};

void expect_forward_fails(const std::string& what, wkv_status want, const char* needle,
                          const std::function<void(Fixture&)>& breakit) {
    expect_call_fails<Fixture>(false, what, want, needle, breakit);
}

void expect_backward_fails(const std::string& what, wkv_status want, const char* needle,
                           const std::function<void(Fixture&)>& breakit) {
    expect_call_fails<Fixture>(true, what, want, needle, breakit);
}

}  // namespace

TEST_CASE("rwkv4: the valid fixture succeeds, planar and interleaved") {
    for (int inter = 0; inter < 2; inter++) {
        CpuCtx c(1);
        Fixture fx;
        static const int64_t st_i[3] = {2, 5, 3};
        if (inter) {
            fx.f.flags = WKV_FLAG_RWKV4_STATE_INTERLEAVED;
            fx.f.state_in.shape = fx.f.state_out.shape = fx.g.dstate_in.shape = st_i;
        }
        REQUIRE(wkv_forward(c.ctx, &fx.f) == WKV_OK);
        size_t bytes = 0;
        REQUIRE(wkv_workspace_size(c.ctx, &bytes, &fx.g) == WKV_OK);
        Workspace ws(bytes);
        fx.g.workspace = ws.data();
        fx.g.workspace_size = bytes;
        CHECK(wkv_backward(c.ctx, &fx.g) == WKV_OK);
        CHECK(all_finite(fx.dw.read()));
        CHECK(all_finite(fx.ds_in.read()));
    }
}

TEST_CASE("rwkv4: bad inputs of the new fields") {
    expect_forward_fails("r given to rwkv4", WKV_ERROR_INVALID_ARGUMENT, "desc->r",
                         [](Fixture& fx) { fx.f.r = fx.extra1.view(); });
    expect_forward_fails("a given to rwkv4", WKV_ERROR_INVALID_ARGUMENT, "desc->a",
                         [](Fixture& fx) { fx.f.a = fx.extra1.view(); });
    expect_forward_fails("log decay form", WKV_ERROR_INVALID_ARGUMENT, "desc->decay_form",
                         [](Fixture& fx) { fx.f.decay_form = WKV_DECAY_LOG; });
    expect_forward_fails("clampw decay form", WKV_ERROR_INVALID_ARGUMENT, "WKV_DECAY_EXP_NEG_EXP",
                         [](Fixture& fx) { fx.f.decay_form = WKV_DECAY_CLAMPW; });
    expect_forward_fails("key-major flag", WKV_ERROR_INVALID_ARGUMENT, "desc->flags",
                         [](Fixture& fx) { fx.f.flags = WKV_FLAG_STATE_KEY_MAJOR; });
    expect_forward_fails("per-head tokens", WKV_ERROR_SHAPE, "desc->v.ndim",
                         [](Fixture& fx) { fx.f.v = fx.extra4.view(); });
    expect_forward_fails("k per head", WKV_ERROR_SHAPE, "desc->k.ndim",
                         [](Fixture& fx) { fx.f.k = fx.extra4.view(); });
    expect_forward_fails("w per token", WKV_ERROR_SHAPE, "desc->w.ndim",
                         [](Fixture& fx) { fx.f.w = fx.extra1.view(); });
    static const int64_t c6[1] = {6};
    expect_forward_fails("u shape", WKV_ERROR_SHAPE, "desc->u.shape[0]",
                         [](Fixture& fx) { fx.f.u.shape = c6; });
    expect_forward_fails("w shape", WKV_ERROR_SHAPE, "desc->w.shape[0]",
                         [](Fixture& fx) { fx.f.w.shape = c6; });
    static const int64_t one_c[2] = {1, 5};
    expect_forward_fails("u [1,C]", WKV_ERROR_SHAPE, "desc->u.ndim", [](Fixture& fx) {
        fx.f.u.ndim = 2;
        fx.f.u.shape = one_c;
    });
    expect_forward_fails("u absent", WKV_ERROR_NULL_POINTER, "desc->u.data",
                         [](Fixture& fx) { fx.f.u.data = nullptr; });
    expect_forward_fails("u dtype", WKV_ERROR_DTYPE, "desc->u.dtype",
                         [](Fixture& fx) { fx.f.u.dtype = WKV_DTYPE_I64; });
    // planar states [B,3,C]
    static const int64_t pl_c[3] = {2, 3, 6}, pl_inter[3] = {2, 5, 3}, pl_b[3] = {3, 3, 5};
    static const int64_t pl_4d[4] = {2, 3, 5, 1};
    expect_forward_fails("planar state, wrong C", WKV_ERROR_SHAPE, "desc->state_in.shape[2]",
                         [](Fixture& fx) { fx.f.state_in.shape = pl_c; });
    expect_forward_fails("interleaved state without the flag", WKV_ERROR_SHAPE,
                         "desc->state_in.shape[1]", [](Fixture& fx) { fx.f.state_in.shape = pl_inter; });
    expect_forward_fails("planar state_out, wrong B", WKV_ERROR_SHAPE, "desc->state_out.shape[0]",
                         [](Fixture& fx) { fx.f.state_out.shape = pl_b; });
    expect_forward_fails("state 4-D", WKV_ERROR_SHAPE, "desc->state_in.ndim", [](Fixture& fx) {
        fx.f.state_in.ndim = 4;
        fx.f.state_in.shape = pl_4d;
    });
    expect_forward_fails("f16 state", WKV_ERROR_DTYPE, "desc->state_in",
                         [](Fixture& fx) { fx.f.state_in.dtype = WKV_DTYPE_F16; });
    // interleaved states [B,C,3]
    static const int64_t in_ok[3] = {2, 5, 3}, in_parts[3] = {2, 5, 4};
    expect_forward_fails("planar state with the interleaved flag", WKV_ERROR_SHAPE,
                         "desc->state_in.shape[1]",
                         [](Fixture& fx) { fx.f.flags = WKV_FLAG_RWKV4_STATE_INTERLEAVED; });
    expect_forward_fails("interleaved state, 4 parts", WKV_ERROR_SHAPE, "desc->state_out.shape[2]",
                         [](Fixture& fx) {
                             fx.f.flags = WKV_FLAG_RWKV4_STATE_INTERLEAVED;
                             fx.f.state_in.shape = in_ok;
                             fx.f.state_out.shape = in_parts;
                         });

    expect_backward_fails("du missing", WKV_ERROR_NULL_POINTER, "desc->du.data",
                          [](Fixture& fx) { fx.g.du.data = nullptr; });
    expect_backward_fails("dw missing", WKV_ERROR_NULL_POINTER, "desc->dw.data",
                          [](Fixture& fx) { fx.g.dw.data = nullptr; });
    expect_backward_fails("dr given for rwkv4", WKV_ERROR_INVALID_ARGUMENT, "desc->dr",
                          [](Fixture& fx) { fx.g.dr = fx.extra1.view(); });
    expect_backward_fails("dw shape", WKV_ERROR_SHAPE, "desc->dw.shape[0]",
                          [](Fixture& fx) { fx.g.dw.shape = c6; });
    expect_backward_fails("du dtype", WKV_ERROR_DTYPE, "desc->du.dtype",
                          [](Fixture& fx) { fx.g.du.dtype = WKV_DTYPE_I64; });
    static const int64_t zero_stride[1] = {0};
    expect_backward_fails("du with a zero stride", WKV_ERROR_ALIASING, "desc->du",
                          [](Fixture& fx) { fx.g.du.strides = zero_stride; });
    expect_backward_fails("dstate_out planar, wrong C", WKV_ERROR_SHAPE, "desc->dstate_out.shape[2]",
                          [](Fixture& fx) {
                              fx.g.dstate_out = fx.g.dstate_in;
                              fx.g.dstate_out.data = fx.s_out.buf.data();
                              fx.g.dstate_out.shape = pl_c;
                          });
    expect_backward_fails("dstate_in interleaved, planar shape", WKV_ERROR_SHAPE,
                          "desc->dstate_in.shape[1]", [](Fixture& fx) {
                              fx.f.flags = WKV_FLAG_RWKV4_STATE_INTERLEAVED;
                              fx.f.state_in.shape = in_ok;
                          });
    expect_backward_fails("forward decay form", WKV_ERROR_INVALID_ARGUMENT,
                          "desc->forward->decay_form",
                          [](Fixture& fx) { fx.f.decay_form = WKV_DECAY_DIRECT; });
    expect_backward_fails("forward r given", WKV_ERROR_INVALID_ARGUMENT, "desc->forward->r",
                          [](Fixture& fx) { fx.f.r = fx.extra1.view(); });
}

TEST_CASE("rwkv4: every CPU path this machine runs against the reference") {
    // The instruction-set paths (WKV_CPU_ISA) turn every branch of the recurrence into blends
    // and walk runs of channel blocks token by token in the forward; their backward runs where
    // C is a multiple of the vector width (ctest's wkv_tests_isa_<path> entries run this whole
    // file on each path too).
    const uint64_t seed = test_seed();
    for (const std::string& isa : runnable_cpu_isas()) {
        ScopedIsa scope(isa.c_str());
        INFO("WKV_CPU_ISA=" << isa);
        Config c = full_state(Config{});
        c.B = 2, c.T = 40, c.C = 64, c.threads = 2;
        check_config(c, seed + 100);
        c.B = 1, c.T = 300, c.C = 96, c.k_std = 20.0, c.threads = 1;
        const Results r = check_config(c, seed + 101);
        CHECK(all_finite(r.y));
        CHECK(all_finite(r.dk));
        c = full_state(Config{});
        c.B = 1, c.T = 46, c.C = 48, c.dtype = WKV_DTYPE_F16, c.in_place = true;
        c.interleaved = true;
        check_config(c, seed + 102, {5, 0, 40, 1});
        c = Config{};
        c.B = 3, c.T = 17, c.C = 32, c.layout = Layout::Transposed, c.state_out = true;
        c.dtype = WKV_DTYPE_BF16, c.k_uniform = 60.0;
        check_config(c, seed + 103);
        c = full_state(Config{});
        c.B = 2, c.T = 1, c.C = 160, c.threads = 3;
        check_config(c, seed + 104);
        // more blocks (33) than one backward item walks (16): runs of 16, 16, 1 on one
        // thread, of 7 on 5 threads; per channel the same operations, so the same bits
        c = full_state(Config{});
        c.B = 1, c.T = 37, c.C = 1056, c.threads = 1;
        const Results g1 = check_config(c, seed + 105);
        c.threads = 5;
        c.pf = reverse_parallel_for;
        const Results g5 = check_config(c, seed + 105);
        REQUIRE(g1.raw.size() == g5.raw.size());
        for (size_t i = 0; i < g1.raw.size(); i++) CHECK(g1.raw[i] == g5.raw[i]);
    }
}
