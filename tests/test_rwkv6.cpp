// RWKV-6 (and RWKV-5: w with a T-stride of 0) through the public API on the CPU backend: the
// golden files in f32/f16/bf16, fresh random inputs against the float64 reference over odd
// shapes, layouts, dtypes, packing and states, determinism over thread counts, the workspace
// formula, the reference's backward against finite differences, and bad inputs of the new
// fields.
//
// The seed is new each run and printed with every failure; WKV_TEST_SEED=<seed> reproduces a
// run. Every output and the workspace are NaN before each call (and the gaps of strided
// tensors, inputs included), so an element that is not written, or an input read outside its
// view, fails; gaps of outputs must stay NaN, inputs must come back unchanged, and nothing may
// be written past wkv_workspace_size() bytes.
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

enum Role { R_R, R_W, R_K, R_V, R_U, R_Y, R_DY, R_DR, R_DW, R_DK, R_DV, R_DU, R_COUNT };

struct Config {
    int64_t B = 1, T = 1, H = 1, N = 1;
    wkv_decay_form form = WKV_DECAY_EXP_NEG_EXP;
    wkv_dtype dtype = WKV_DTYPE_F32;
    bool mixed = false;       // every tensor its own dtype (f32, bf16, f16 in turn)
    bool state_in = false;    // forward: state_in = s0
    bool state_out = false;   // forward: state_out
    bool dstate_out = false;  // backward: dstate_out = dsT
    bool dstate_in = false;   // backward: dstate_in
    Layout layout = Layout::Contiguous;
    bool rwkv5 = false;        // w constant over t, given with a T-stride of 0
    bool padded_state = false; // states with a gap between heads and a byte_offset
    bool key_major = false;    // WKV_FLAG_STATE_KEY_MAJOR
    bool in_place = false;     // state_out is state_in
    int threads = 2;
    wkv_parallel_for_fn pf = nullptr;
    double lo = -6.0, hi = 1.0; // the draw's w_raw range (decay exp(-exp(w_raw)))

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
        s << "B=" << B << " T=" << T << " H=" << H << " N=" << N << " form=" << form_name(form)
          << " dtype=" << (mixed ? "mixed" : dtype_name(dtype)) << " state_in=" << state_in
          << " state_out=" << state_out << " dstate_out=" << dstate_out
          << " dstate_in=" << dstate_in << " layout=" << layout_name(layout)
          << " rwkv5=" << rwkv5 << " padded_state=" << padded_state
          << " key_major=" << key_major << " in_place=" << in_place << " threads=" << threads
          << (pf ? " (reverse parallel_for)" : "") << " w_raw in [" << lo << ", " << hi << "]";
        return s.str();
    }
};

// u / du [H,N]: contiguous, or (any other layout) strided with gaps.
HostTensor param_tensor(const Config& c, wkv_dtype dt) {
    if (c.layout == Layout::Contiguous) return HostTensor(dt, {c.H, c.N});
    return HostTensor(dt, {c.H, c.N}, {3 * c.N + 1, 3}, 2);
}

HostTensor state_tensor(const Config& c, int64_t S) {
    std::vector<int64_t> shape = {S, c.H, c.N, c.N};
    if (c.padded_state)
        return HostTensor(WKV_DTYPE_F32, shape, {c.H * (c.N * c.N + 5), c.N * c.N + 5, c.N, 1}, 2);
    return HostTensor(WKV_DTYPE_F32, shape);
}

// A state [S,H,N,N] as the library holds it (transposed in the last two axes when key-major).
std::vector<double> to_lib(const Config& c, int64_t S, const std::vector<double>& x) {
    return c.key_major ? permute(x, {S, c.H, c.N, c.N}, {0, 1, 3, 2}) : x;
}

struct Results {
    std::vector<double> y, sT, dr, dw, dk, dv, du, ds0;
    std::vector<std::vector<unsigned char>> raw; // every output buffer, for bitwise checks
};

// Forward then backward through the public API. offsets empty = not packed (else d.B == 1
// and s0, dsT hold one state per sequence).
Results run_library(const Config& c, const Rwkv6Data& d, const std::vector<double>& dy,
                    const std::vector<double>& dsT, const std::vector<int64_t>& offsets) {
    CpuCtx holder(c.threads, c.pf);
    REQUIRE_MESSAGE(holder.status == WKV_OK, std::string(wkv_last_error(nullptr)));
    wkv_context* ctx = holder.ctx;
    const int64_t num_seqs = offsets.empty() ? 0 : static_cast<int64_t>(offsets.size()) - 1;
    const int64_t S = num_seqs > 0 ? num_seqs : c.B;

    const std::vector<double>* tok_vals[4] = {&d.r, &d.w, &d.k, &d.v};
    std::vector<HostTensor> in(5);
    for (int i = 0; i < 4; i++) {
        in[static_cast<size_t>(i)] =
            token_tensor(c.dtype_of(i), c.B, c.T, c.H, c.N, c.layout, i == R_W && c.rwkv5);
        fill_input(in[static_cast<size_t>(i)], *tok_vals[i]);
    }
    in[4] = param_tensor(c, c.dtype_of(R_U));
    fill_input(in[4], d.u);
    HostTensor y = token_tensor(c.dtype_of(R_Y), c.B, c.T, c.H, c.N, c.layout);
    HostTensor s_in = state_tensor(c, S), s_out = state_tensor(c, S);
    if (c.state_in) fill_input(s_in, to_lib(c, S, d.s0));

    wkv_forward_desc f{};
    f.struct_size = sizeof f;
    f.op = WKV_OP_RWKV6;
    f.decay_form = c.form;
    f.flags = c.key_major ? static_cast<uint32_t>(WKV_FLAG_STATE_KEY_MAJOR) : 0u;
    f.r = in[0].view();
    f.w = in[1].view();
    f.k = in[2].view();
    f.v = in[3].view();
    f.u = in[4].view();
    f.y = y.view();
    if (c.state_in) f.state_in = s_in.view();
    if (c.state_out) f.state_out = c.in_place ? s_in.view() : s_out.view();
    f.seq_offsets = num_seqs ? offsets.data() : nullptr;
    f.num_seqs = num_seqs;

    Unchanged fwd_inputs;
    const char* names[5] = {"r", "w", "k", "v", "u"};
    for (size_t i = 0; i < 5; i++) fwd_inputs.add(in[i], names[i]);
    if (c.state_in && !c.in_place) fwd_inputs.add(s_in, "state_in");

    y.poison();
    if (!c.in_place) s_out.poison();
    forward_ok(ctx, f);
    Results res;
    res.y = read_output(y, res.raw);
    // the transpose is its own inverse
    if (c.state_out) res.sT = to_lib(c, S, read_output(c.in_place ? s_in : s_out, res.raw));
    fwd_inputs.check("forward");

    // The backward reads state_in again: after an in-place forward it holds sT, so restore s0.
    if (c.state_in && c.in_place) fill_input(s_in, to_lib(c, S, d.s0));
    HostTensor dyt = token_tensor(c.dtype_of(R_DY), c.B, c.T, c.H, c.N, c.layout);
    fill_input(dyt, dy);
    HostTensor ds_out = state_tensor(c, S), ds_in = state_tensor(c, S);
    if (c.dstate_out) fill_input(ds_out, to_lib(c, S, dsT));
    std::vector<HostTensor> g(5);
    for (int i = 0; i < 4; i++) g[static_cast<size_t>(i)] = token_tensor(c.dtype_of(R_DR + i), c.B, c.T, c.H, c.N, c.layout);
    g[4] = param_tensor(c, c.dtype_of(R_DU));
    for (HostTensor& t : g) t.poison();
    ds_in.poison();
    y.poison(); // the backward ignores the forward's outputs: garbage there, to be sure
    Unchanged bwd_inputs;
    for (size_t i = 0; i < 5; i++) bwd_inputs.add(in[i], names[i]);
    if (c.state_in) bwd_inputs.add(s_in, "state_in");
    bwd_inputs.add(dyt, "dy");
    if (c.dstate_out) bwd_inputs.add(ds_out, "dstate_out");

    wkv_backward_desc bd{};
    bd.struct_size = sizeof bd;
    bd.forward = &f;
    bd.dy = dyt.view();
    if (c.dstate_out) bd.dstate_out = ds_out.view();
    bd.dr = g[0].view();
    bd.dw = g[1].view();
    bd.dk = g[2].view();
    bd.dv = g[3].view();
    bd.du = g[4].view();
    if (c.dstate_in) bd.dstate_in = ds_in.view();
    backward_ok(ctx, bd);
    std::vector<double>* outs[5] = {&res.dr, &res.dw, &res.dk, &res.dv, &res.du};
    for (size_t i = 0; i < 5; i++) *outs[i] = read_output(g[i], res.raw);
    if (c.dstate_in) res.ds0 = to_lib(c, S, read_output(ds_in, res.raw));
    bwd_inputs.check("backward");
    return res;
}

// ------------------------------------------------------------------------------ problems

struct Problem {
    Rwkv6Data d;
    std::vector<double> dy, dsT; // dsT: one state per sequence (empty: none)
};

// Inputs rounded to what the library is given. S = state slots (B, or num_seqs when packed).
Problem make_problem(const Config& c, int64_t S, Rng& rng) {
    Problem p;
    p.d = random_rwkv6(rng, c.B, c.T, c.H, c.N, c.form, false, c.rwkv5, c.lo, c.hi);
    if (c.state_in) {
        Rwkv6Data pre = random_rwkv6(rng, S, 8, c.H, c.N, c.form, false, false, c.lo, c.hi);
        pre.u = p.d.u;
        std::vector<double> y;
        ref6_forward(pre, y, p.d.s0);
    }
    std::vector<std::vector<double>*> toks = p.d.tokens();
    for (int i = 0; i < 4; i++) *toks[static_cast<size_t>(i)] = rounded(c.dtype_of(i), *toks[static_cast<size_t>(i)]);
    p.d.u = rounded(c.dtype_of(R_U), p.d.u);
    p.d.s0 = rounded(WKV_DTYPE_F32, p.d.s0);
    p.dy = rounded(c.dtype_of(R_DY), random_normal(rng, p.d.tok_count()));
    if (c.dstate_out)
        p.dsT = rounded(WKV_DTYPE_F32, random_normal(rng, static_cast<size_t>(S * c.H * c.N * c.N)));
    return p;
}

struct RefOut {
    std::vector<double> y, sT;
    Rwkv6Grads g;
};

// The reference; packed (offsets not empty): each sequence on its own from its own state slot,
// an empty one passing its state (and state gradient) through; du sums over sequences.
RefOut reference(const Problem& p, const std::vector<int64_t>& offsets) {
    RefOut o;
    const Rwkv6Data& d = p.d;
    if (offsets.empty()) {
        ref6_forward(d, o.y, o.sT);
        o.g = ref6_backward(d, p.dy, p.dsT);
        return o;
    }
    const size_t S = offsets.size() - 1, HN = static_cast<size_t>(d.H * d.N),
                 NN = static_cast<size_t>(d.H * d.N * d.N);
    o.y.assign(d.tok_count(), 0.0);
    o.sT.assign(S * NN, 0.0);
    o.g.ds0.assign(S * NN, 0.0);
    for (auto* x : {&o.g.dr, &o.g.dw, &o.g.dk, &o.g.dv}) x->assign(d.tok_count(), 0.0);
    o.g.du.assign(HN, 0.0);
    for (size_t s = 0; s < S; s++) {
        const size_t t0 = static_cast<size_t>(offsets[s]), t1 = static_cast<size_t>(offsets[s + 1]);
        const std::vector<double> s0 = d.s0.empty() ? std::vector<double>(NN, 0.0) : slice(d.s0, s * NN, (s + 1) * NN);
        const std::vector<double> dsT = p.dsT.empty() ? std::vector<double>(NN, 0.0) : slice(p.dsT, s * NN, (s + 1) * NN);
        if (t1 == t0) {
            put(o.sT, s0, s * NN);
            put(o.g.ds0, dsT, s * NN);
            continue;
        }
        Rwkv6Data q;
        q.B = 1;
        q.T = static_cast<int64_t>(t1 - t0);
        q.H = d.H;
        q.N = d.N;
        q.form = d.form;
        q.r = slice(d.r, t0 * HN, t1 * HN);
        q.w = slice(d.w, t0 * HN, t1 * HN);
        q.k = slice(d.k, t0 * HN, t1 * HN);
        q.v = slice(d.v, t0 * HN, t1 * HN);
        q.u = d.u;
        q.s0 = s0;
        std::vector<double> y, sT;
        ref6_forward(q, y, sT);
        Rwkv6Grads g = ref6_backward(q, slice(p.dy, t0 * HN, t1 * HN), dsT);
        put(o.y, y, t0 * HN);
        put(o.sT, sT, s * NN);
        put(o.g.dr, g.dr, t0 * HN);
        put(o.g.dw, g.dw, t0 * HN);
        put(o.g.dk, g.dk, t0 * HN);
        put(o.g.dv, g.dv, t0 * HN);
        put(o.g.ds0, g.ds0, s * NN);
        for (size_t x = 0; x < HN; x++) o.g.du[x] += g.du[x];
    }
    return o;
}

// Runs config c (packed when `lens` is not empty: then c.B must be 1 and c.T = sum(lens))
// against the reference. Returns the library's results.
Results check_config(const Config& c, uint64_t seed, const std::vector<int64_t>& lens = {}) {
    const std::vector<int64_t> offsets = lens.empty() ? std::vector<int64_t>() : offsets_of(lens);
    const int64_t S = lens.empty() ? c.B : static_cast<int64_t>(lens.size());
    Rng rng(seed);
    Problem p = make_problem(c, S, rng);
    INFO("seed " << seed << ": " << c.describe() << std::string(lens.empty() ? "" : " packed"));
    const Results got = run_library(c, p.d, p.dy, p.dsT, offsets);
    const RefOut ref = reference(p, offsets);
    // Sensitivity of the reference to a float32 rounding of its inputs (see cond_tol).
    Problem q = p;
    for (auto* x : q.d.tokens()) perturb(rng, *x);
    for (auto* x : {&q.d.u, &q.d.s0, &q.dy, &q.dsT}) perturb(rng, *x);
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
    if (c.state_out) check("state_out", got.sT, ref.sT, pert.sT, true);
    check("dr", got.dr, ref.g.dr, pert.g.dr, false);
    check("dw", got.dw, ref.g.dw, pert.g.dw, false);
    check("dk", got.dk, ref.g.dk, pert.g.dk, false);
    check("dv", got.dv, ref.g.dv, pert.g.dv, false);
    check("du", got.du, ref.g.du, pert.g.du, false);
    if (c.dstate_in) check("dstate_in", got.ds0, ref.g.ds0, pert.g.ds0, false);
    return got;
}

Config full_state(Config c) {
    c.state_in = c.state_out = c.dstate_out = c.dstate_in = true;
    return c;
}

wkv_backend_info cpu_info() {
    wkv_backend_info info{};
    info.struct_size = sizeof info;
    REQUIRE(wkv_backend_get_info(WKV_BACKEND_CPU, &info) == WKV_OK);
    return info;
}

}  // namespace

// ================================================================================ golden

TEST_CASE("rwkv6: the CPU backend claims RWKV-6 and RWKV-4 with every dtype and decay form") {
    const wkv_backend_info info = cpu_info();
    CHECK((info.ops & (1u << WKV_OP_RWKV6)) != 0);
    CHECK((info.ops & (1u << WKV_OP_RWKV4)) != 0);
    CHECK((info.ops & (1u << WKV_OP_RWKV7)) != 0);
    CHECK(info.dtypes == 7u);
    CHECK(info.any_head_size == 1);
}

TEST_CASE("rwkv6: golden files through the library, f32/f16/bf16, value- and key-major states") {
    const std::vector<std::string> files = golden_files("wkv6_");
    REQUIRE(files.size() >= 2);
    const wkv_backend_info info = cpu_info();
    const wkv_dtype dtypes[3] = {WKV_DTYPE_F32, WKV_DTYPE_F16, WKV_DTYPE_BF16};
    for (const std::string& path : files) {
        for (const wkv_dtype& dt : dtypes)
            for (int km = 0; km < 2; km++) {
                wkv_golden_options o{};
                o.backend = WKV_BACKEND_CPU;
                o.dtype = dt;
                o.cpu_threads = 2;
                o.state_key_major = km;
                wkv_golden_result r;
                wkv_golden_run_ex(path.c_str(), &o, &r);
                char line[1024];
                wkv_golden_format(&r, line, sizeof line);
                INFO(std::filesystem::path(path).filename().string() << " key_major=" << km << "  " << line);
                CHECK(r.op == WKV_OP_RWKV6);
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

TEST_CASE("rwkv6: random inputs against the float64 reference") {
    const uint64_t seed = test_seed();
    std::vector<Config> cs;
    Config c;
    // T = 1, B = 3, N = 7, states everywhere
    c = full_state(Config{});
    c.B = 3, c.T = 1, c.H = 2, c.N = 7;
    cs.push_back(c);
    // T = 17, N = 64, no state at all
    c = Config{};
    c.B = 1, c.T = 17, c.H = 2, c.N = 64;
    cs.push_back(c);
    // three checkpoint segments (the last short), padded-T, key-major states, log form
    c = full_state(Config{});
    c.B = 2, c.T = 77, c.H = 3, c.N = 7, c.layout = Layout::PaddedT, c.key_major = true;
    c.form = WKV_DECAY_LOG, c.threads = 3;
    cs.push_back(c);
    // head-major tokens, padded states, f16, direct form, only a final-state gradient
    c = Config{};
    c.B = 3, c.T = 33, c.H = 2, c.N = 5, c.layout = Layout::Transposed, c.padded_state = true;
    c.dtype = WKV_DTYPE_F16, c.form = WKV_DECAY_DIRECT, c.state_in = true, c.dstate_out = true;
    c.dstate_in = true;
    cs.push_back(c);
    // inner stride 2, every tensor its own dtype, in-place state, clampw form
    c = full_state(Config{});
    c.B = 3, c.T = 17, c.H = 2, c.N = 7, c.layout = Layout::InnerStride, c.mixed = true;
    c.in_place = true, c.form = WKV_DECAY_CLAMPW;
    cs.push_back(c);
    // bf16, N = 1
    c = full_state(Config{});
    c.B = 2, c.T = 40, c.H = 4, c.N = 1, c.dtype = WKV_DTYPE_BF16;
    cs.push_back(c);
    // decays down to 1e-6 (w_raw up to ~3.6): finite, exact gradients (nothing divides by them)
    c = full_state(Config{});
    c.B = 2, c.T = 70, c.H = 2, c.N = 16, c.lo = 0.0, c.hi = 2.6;
    cs.push_back(c);
    // N = 65 (a lane tail), state_out only, dstate_in without state_in
    c = Config{};
    c.B = 1, c.T = 9, c.H = 1, c.N = 65, c.state_out = true, c.dstate_in = true;
    cs.push_back(c);
    // N = 128, bf16, key-major padded states, more threads than items
    c = full_state(Config{});
    c.B = 1, c.T = 40, c.H = 2, c.N = 128, c.dtype = WKV_DTYPE_BF16, c.key_major = true;
    c.padded_state = true, c.threads = 8;
    cs.push_back(c);

    for (size_t i = 0; i < cs.size(); i++) check_config(cs[i], seed + i);
}

TEST_CASE("rwkv6: RWKV-5 is w with a T-stride of 0 (no special path)") {
    const uint64_t seed = test_seed();
    Config c = full_state(Config{});
    c.B = 2, c.T = 41, c.H = 2, c.N = 8, c.rwkv5 = true;
    check_config(c, seed);
    c.dtype = WKV_DTYPE_BF16, c.layout = Layout::PaddedT, c.form = WKV_DECAY_LOG, c.T = 5;
    check_config(c, seed + 1);
    c.dtype = WKV_DTYPE_F16, c.layout = Layout::InnerStride, c.form = WKV_DECAY_EXP_NEG_EXP;
    c.B = 1, c.T = 23;
    check_config(c, seed + 2, {7, 0, 16});
}

TEST_CASE("rwkv6: packed sequences, an empty one included, with and without states") {
    const uint64_t seed = test_seed();
    Config c = full_state(Config{});
    c.B = 1, c.H = 2, c.N = 7, c.T = 5 + 0 + 40 + 1;
    check_config(c, seed, {5, 0, 40, 1});
    c.dtype = WKV_DTYPE_BF16, c.key_major = true, c.in_place = true;
    check_config(c, seed + 1, {0, 5, 40, 1});
    Config n;  // no states
    n.B = 1, n.H = 3, n.N = 4, n.T = 34, n.layout = Layout::Transposed;
    check_config(n, seed + 2, {33, 0, 1});
    n.dstate_in = true; // dstate_in alone: the gradient w.r.t. the zero initial states
    check_config(n, seed + 3, {0, 34, 0});
}

TEST_CASE("rwkv6: results are bit-identical over thread counts and work splits") {
    const uint64_t seed = test_seed();
    Config c = full_state(Config{});
    c.B = 3, c.T = 70, c.H = 3, c.N = 9;
    c.threads = 1;
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
    // packed, too
    c = full_state(Config{});
    c.B = 1, c.T = 60, c.H = 2, c.N = 7, c.threads = 1;
    const Results p1 = check_config(c, seed + 1, {20, 0, 33, 7});
    c.threads = 5;
    const Results p5 = check_config(c, seed + 1, {20, 0, 33, 7});
    for (size_t i = 0; i < p1.raw.size(); i++) CHECK(p1.raw[i] == p5.raw[i]);
}

TEST_CASE("rwkv6: wkv_workspace_size is the documented formula") {
    // On the scalar path, and on a vector path (W floats per vector) where N is not a multiple
    // of W, see backends/cpu/rwkv6.cpp:
    //   workspace = 64 + [packed] A64(8 (num_seqs + 1)) + A64(4 H G N^2) + A64(4 items N)
    //             + chunks A64(4 ((R + 1) N^2 + 14 N))
    // and where it is (backends/cpu/rwkv6_simd.inl: items of up to 8 heads, Gh of them):
    //   workspace = 64 + [packed] A64(8 (num_seqs + 1)) + A64(4 H G N^2) + A64(4 num_seqs H N)
    //             + chunks A64(4 ((Gh + R) N^2 + Gh (R + 1) 10 N + 2 Gh N))
    //   Gh = min(8, H, ceil(H / ceil(threads / num_seqs))), chunks = min(items, 4 threads)
    for (const std::string& isa : runnable_cpu_isas()) {
        ScopedIsa scope(isa.c_str());
        const uint64_t W = isa_width(isa);
        for (const HeadsShape& s : heads_workspace_shapes()) {
            CAPTURE(isa);
            CAPTURE(s.B);
            CAPTURE(s.T);
            CAPTURE(s.H);
            CAPTURE(s.N);
            CAPTURE(s.threads);
            CpuCtx ctx(s.threads);
            REQUIRE(ctx.status == WKV_OK);
            const SeqSpan q = seq_span(s.B, s.T, s.lens);
            HostTensor r(WKV_DTYPE_F32, {s.B, s.T, s.H, s.N}), u(WKV_DTYPE_F32, {s.H, s.N});
            HostTensor dr(WKV_DTYPE_F32, {s.B, s.T, s.H, s.N}), dw = dr, dk = dr, dv = dr, dy = dr;
            HostTensor du(WKV_DTYPE_F32, {s.H, s.N});
            wkv_forward_desc f{};
            f.struct_size = sizeof f;
            f.op = WKV_OP_RWKV6;
            f.decay_form = WKV_DECAY_LOG;
            f.r = f.w = f.k = f.v = r.view();
            f.u = u.view();
            f.seq_offsets = q.offsets.empty() ? nullptr : q.offsets.data();
            f.num_seqs = q.offsets.empty() ? 0 : q.num_seqs;
            wkv_backward_desc g{};
            g.struct_size = sizeof g;
            g.forward = &f;
            g.dy = dy.view(), g.dr = dr.view(), g.dw = dw.view(), g.dk = dk.view(), g.dv = dv.view();
            g.du = du.view();
            size_t bytes = 0;
            REQUIRE_MESSAGE(wkv_workspace_size(ctx.ctx, &bytes, &g) == WKV_OK, std::string(wkv_last_error(ctx.ctx)));

            const uint64_t N = static_cast<uint64_t>(s.N), H = static_cast<uint64_t>(s.H);
            const uint64_t S = static_cast<uint64_t>(q.num_seqs), T = static_cast<uint64_t>(s.threads);
            const uint64_t G = q.segments;
            const uint64_t R = q.longest < 1 ? 0 : static_cast<uint64_t>(std::min<int64_t>(q.longest, 32) - 1);
            const uint64_t head = 64 + q.packed_bytes + a64(4 * H * G * N * N) +
                                  a64(4 * S * H * N);
            uint64_t want = 0;
            if (W == 0 || N % W != 0) {
                const uint64_t chunks = std::min<uint64_t>(S * H, 4u * T);
                want = head + chunks * a64(4 * ((R + 1) * N * N + 14 * N));
            } else {
                const uint64_t Gh = backward_heads(H, S, T, 8);
                const uint64_t items = S * ((H + Gh - 1) / Gh);
                const uint64_t chunks = std::min<uint64_t>(items, 4u * T);
                want = head + chunks * a64(4 * ((Gh + R) * N * N + Gh * (R + 1) * 10 * N + 2 * Gh * N));
            }
            CHECK(bytes == want);
        }
    }
}

// ======================================================================== finite differences

namespace {

double loss6(const Rwkv6Data& d, const std::vector<double>& dy, const std::vector<double>& dsT) {
    std::vector<double> y, sT;
    ref6_forward(d, y, sT);
    double L = 0.0;
    for (size_t i = 0; i < y.size(); i++) L += y[i] * dy[i];
    for (size_t i = 0; i < dsT.size(); i++) L += sT[i] * dsT[i];
    return L;
}

}  // namespace

TEST_CASE("rwkv6: the reference backward matches central finite differences") {
    const uint64_t seed = test_seed();
    const wkv_decay_form forms[4] = {WKV_DECAY_EXP_NEG_EXP, WKV_DECAY_LOG, WKV_DECAY_DIRECT,
                                     WKV_DECAY_CLAMPW};
    for (int fi = 0; fi < 4; fi++) {
        Rng rng(seed + static_cast<uint64_t>(fi));
        Rwkv6Data d = random_rwkv6(rng, 2, 5, 2, 3, forms[fi], true, false, -3.0, 1.0);
        const std::vector<double> dy = random_normal(rng, d.tok_count());
        const std::vector<double> dsT = random_normal(rng, d.state_count());
        const Rwkv6Grads g = ref6_backward(d, dy, dsT);
        const char* names[6] = {"r", "w", "k", "v", "u", "s0"};
        std::vector<double>* xs[6] = {&d.r, &d.w, &d.k, &d.v, &d.u, &d.s0};
        const std::vector<double>* gs[6] = {&g.dr, &g.dw, &g.dk, &g.dv, &g.du, &g.ds0};
        double worst = 0.0;
        for (int t = 0; t < 6; t++) {
            INFO("seed " << seed << " form " << std::string(form_name(forms[fi])) << " d" << std::string(names[t]));
            std::vector<double>& x = *xs[t];
            const double scale = rms(*gs[t]);
            REQUIRE(all_finite(*gs[t]));
            for (size_t i = 0; i < x.size(); i++) {
                const double x0 = x[i], h = 1e-6;
                x[i] = x0 + h;
                const double lp = loss6(d, dy, dsT);
                x[i] = x0 - h;
                const double lm = loss6(d, dy, dsT);
                x[i] = x0;
                const double fd = (lp - lm) / (2 * h), an = (*gs[t])[i];
                const double err = std::fabs(fd - an) / (std::fabs(an) + scale + 1e-300);
                worst = std::max(worst, err);
                INFO("element " << i << " fd " << fd << " analytic " << an);
                CHECK(err <= 1e-6);
            }
        }
        MESSAGE("rwkv6 " << std::string(form_name(forms[fi])) << ": worst finite-difference error " << worst);
    }
}

// ============================================================================ bad inputs

namespace {

// A valid small RWKV-6 forward + backward call, which each case then breaks in one way.
struct Fixture {
    static constexpr int64_t B = 2, T = 3, H = 2, N = 4;
    HostTensor r, w, k, v, u, y, s_in, s_out, dy, dr, dw, dk, dv, du, ds_in, extra;
    std::vector<unsigned char> workspace;
    wkv_forward_desc f{};
    wkv_backward_desc g{};

    Fixture() {
        Rng rng(3);
        Rwkv6Data d = random_rwkv6(rng, B, T, H, N, WKV_DECAY_EXP_NEG_EXP, true);
        const std::vector<int64_t> tok = {B, T, H, N}, st = {B, H, N, N}, hn = {H, N};
        HostTensor* ins[4] = {&r, &w, &k, &v};
        std::vector<std::vector<double>*> vals = d.tokens();
        for (int i = 0; i < 4; i++) {
            *ins[i] = HostTensor(WKV_DTYPE_F32, tok);
            ins[i]->fill(*vals[static_cast<size_t>(i)]);
        }
        u = HostTensor(WKV_DTYPE_F32, hn);
        u.fill(d.u);
        extra = HostTensor(WKV_DTYPE_F32, tok);
        s_in = HostTensor(WKV_DTYPE_F32, st);
        s_in.fill(d.s0);
        for (HostTensor* o : {&y, &dy, &dr, &dw, &dk, &dv}) *o = HostTensor(WKV_DTYPE_F32, tok);
        dy.fill(random_normal(rng, d.tok_count()));
        du = HostTensor(WKV_DTYPE_F32, hn);
        s_out = HostTensor(WKV_DTYPE_F32, st);
        ds_in = HostTensor(WKV_DTYPE_F32, st);
        poison();
        f.struct_size = sizeof f;
        f.op = WKV_OP_RWKV6;
        f.decay_form = WKV_DECAY_EXP_NEG_EXP;
        f.r = r.view(), f.w = w.view(), f.k = k.view(), f.v = v.view(), f.u = u.view();
        f.y = y.view();
        f.state_in = s_in.view();
        f.state_out = s_out.view();
        g.struct_size = sizeof g;
        g.forward = &f;
        g.dy = dy.view();
        g.dr = dr.view(), g.dw = dw.view(), g.dk = dk.view(), g.dv = dv.view(), g.du = du.view();
        g.dstate_in = ds_in.view();
    }
    void poison() {
        for (HostTensor* o : {&y, &s_out, &dr, &dw, &dk, &dv, &du, &ds_in}) o->poison();
    }
    bool outputs_untouched() const {
        for (const HostTensor* o : {&y, &s_out, &dr, &dw, &dk, &dv, &du, &ds_in})
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

TEST_CASE("rwkv6: the valid fixture succeeds (so each broken case fails for its one reason)") {
    CpuCtx c(1);
    Fixture fx;
    REQUIRE(wkv_forward(c.ctx, &fx.f) == WKV_OK);
    size_t bytes = 0;
    REQUIRE(wkv_workspace_size(c.ctx, &bytes, &fx.g) == WKV_OK);
    Workspace ws(bytes);
    fx.g.workspace = ws.data();
    fx.g.workspace_size = bytes;
    CHECK(wkv_backward(c.ctx, &fx.g) == WKV_OK);
    CHECK(all_finite(fx.du.read()));
}

TEST_CASE("rwkv6: bad inputs of the new fields") {
    expect_forward_fails("u absent", WKV_ERROR_NULL_POINTER, "desc->u.data",
                         [](Fixture& fx) { fx.f.u.data = nullptr; });
    static const int64_t u_wide[2] = {2, 5};
    expect_forward_fails("u shape", WKV_ERROR_SHAPE, "desc->u.shape[1]",
                         [](Fixture& fx) { fx.f.u.shape = u_wide; });
    static const int64_t u_heads[2] = {3, 4};
    expect_forward_fails("u heads", WKV_ERROR_SHAPE, "desc->u.shape[0]",
                         [](Fixture& fx) { fx.f.u.shape = u_heads; });
    expect_forward_fails("u per token", WKV_ERROR_SHAPE, "desc->u.ndim",
                         [](Fixture& fx) { fx.f.u = fx.extra.view(); });
    expect_forward_fails("u dtype", WKV_ERROR_DTYPE, "desc->u.dtype",
                         [](Fixture& fx) { fx.f.u.dtype = WKV_DTYPE_I64; });
    expect_forward_fails("u float64", WKV_ERROR_DTYPE, "desc->u.dtype",
                         [](Fixture& fx) { fx.f.u.dtype = wkv_dtype_make(WKV_DTYPE_CODE_FLOAT, 64); });
    expect_forward_fails("a given to rwkv6", WKV_ERROR_INVALID_ARGUMENT, "desc->a",
                         [](Fixture& fx) { fx.f.a = fx.extra.view(); });
    expect_forward_fails("b given to rwkv6", WKV_ERROR_INVALID_ARGUMENT, "desc->b",
                         [](Fixture& fx) { fx.f.b = fx.extra.view(); });
    expect_forward_fails("r absent", WKV_ERROR_NULL_POINTER, "desc->r.data",
                         [](Fixture& fx) { fx.f.r.data = nullptr; });
    expect_forward_fails("rwkv4 state flag", WKV_ERROR_INVALID_ARGUMENT, "desc->flags",
                         [](Fixture& fx) { fx.f.flags = WKV_FLAG_RWKV4_STATE_INTERLEAVED; });
    static const int64_t st_bad[4] = {2, 2, 4, 3};
    expect_forward_fails("state shape", WKV_ERROR_SHAPE, "desc->state_in.shape[3]",
                         [](Fixture& fx) { fx.f.state_in.shape = st_bad; });
    expect_forward_fails("y overlaps u", WKV_ERROR_ALIASING, "desc->y overlaps",
                         [](Fixture& fx) { fx.f.y.data = fx.u.buf.data(); });

    expect_backward_fails("du missing", WKV_ERROR_NULL_POINTER, "desc->du.data",
                          [](Fixture& fx) { fx.g.du.data = nullptr; });
    static const int64_t du_bad[2] = {2, 3};
    expect_backward_fails("du shape", WKV_ERROR_SHAPE, "desc->du.shape[1]",
                          [](Fixture& fx) { fx.g.du.shape = du_bad; });
    expect_backward_fails("du dtype", WKV_ERROR_DTYPE, "desc->du.dtype",
                          [](Fixture& fx) { fx.g.du.dtype = WKV_DTYPE_I64; });
    static const int64_t du_zero_stride[2] = {0, 1};
    expect_backward_fails("du with a zero stride", WKV_ERROR_ALIASING, "desc->du",
                          [](Fixture& fx) { fx.g.du.strides = du_zero_stride; });
    expect_backward_fails("da given for rwkv6", WKV_ERROR_INVALID_ARGUMENT, "desc->da",
                          [](Fixture& fx) { fx.g.da = fx.extra.view(); });
    expect_backward_fails("forward u absent", WKV_ERROR_NULL_POINTER, "desc->forward->u.data",
                          [](Fixture& fx) { fx.f.u.data = nullptr; });
    expect_backward_fails("du overlaps dr", WKV_ERROR_ALIASING, "overlaps",
                          [](Fixture& fx) { fx.g.du.data = fx.dr.buf.data(); });
}

TEST_CASE("rwkv6: every CPU path this machine runs against the reference") {
    // The instruction-set paths (WKV_CPU_ISA) differ in their float32 operation order, their
    // N = 32/64/128 code, padding of other N, head groups and 16-bit conversions (ctest's
    // wkv_tests_isa_<path> entries run this whole file on each path too).
    const uint64_t seed = test_seed();
    for (const std::string& isa : runnable_cpu_isas()) {
        ScopedIsa scope(isa.c_str());
        INFO("WKV_CPU_ISA=" << isa);
        Config c = full_state(Config{});
        c.B = 2, c.T = 40, c.H = 3, c.N = 64, c.threads = 2;
        check_config(c, seed + 100);
        c.N = 32, c.T = 1, c.dtype = WKV_DTYPE_BF16, c.in_place = true, c.form = WKV_DECAY_LOG;
        check_config(c, seed + 101);
        c = full_state(Config{});
        c.B = 1, c.T = 33, c.H = 2, c.N = 128, c.dtype = WKV_DTYPE_F16, c.key_major = true;
        c.form = WKV_DECAY_CLAMPW;
        check_config(c, seed + 102);
        c = Config{};
        c.B = 3, c.T = 17, c.H = 2, c.N = 16, c.layout = Layout::Transposed, c.state_out = true;
        check_config(c, seed + 103);
        c = full_state(Config{});
        c.B = 1, c.T = 35, c.H = 2, c.N = 24, c.form = WKV_DECAY_DIRECT, c.threads = 1;
        check_config(c, seed + 104, {20, 0, 15, 0});
        // the vector backward's head groups: 9 heads in items of 8 and 1 (one thread), of
        // 2 and 1 per sequence (five threads, three sequences, packed: one of them empty)
        c = full_state(Config{});
        c.B = 1, c.T = 70, c.H = 9, c.N = 32, c.threads = 1, c.dtype = WKV_DTYPE_BF16;
        check_config(c, seed + 105);
        c.T = 66, c.H = 3, c.N = 64, c.threads = 5, c.dtype = WKV_DTYPE_F32;
        check_config(c, seed + 106, {33, 0, 33});
        // 11 heads in items of 8 and 3 (an odd count: the replay slots' two maps, NOTES.md step
        // 48) over segments of 32, 32 and 1 token; on three threads items of 6 and 5: the same
        // bits, since a head's operations do not depend on its group
        c = full_state(Config{});
        c.B = 2, c.T = 65, c.H = 11, c.N = 16, c.threads = 1;
        const Results g1 = check_config(c, seed + 107);
        c.threads = 3;
        const Results g3 = check_config(c, seed + 107);
        REQUIRE(g1.raw.size() == g3.raw.size());
        size_t differ = 0;
        for (size_t i = 0; i < g1.raw.size(); i++) differ += g1.raw[i] != g3.raw[i];
        CHECK(differ == 0);
    }
}
