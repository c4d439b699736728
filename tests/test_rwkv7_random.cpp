// RWKV-7 through the public API on the CPU backend against the float64 reference
// (src/reference), on fresh random inputs every run.
//
// Inputs are drawn the way tests/golden/README.md describes (see random_rwkv7 in test_util.h).
// The seed is new each run and printed with every failure; WKV_TEST_SEED=<seed> reproduces a
// run. Each case rounds its inputs to the dtype the library gets (float32, float16 or bfloat16;
// the state, s0 and dsT always float32) and runs the reference on exactly those values.
//
// Every output — y, state_out, each gradient, dstate_in — and the workspace are filled with NaN
// before each call (and the gaps of strided tensors too, inputs included), so an element that is
// not written, or an input read outside its view, fails. Gaps of outputs must stay NaN, and the
// inputs must come back unchanged.
//
// Tolerances (norm-wise relative error): float32 1e-5 on everything; 16-bit inputs 5e-3 on y and
// state_out, 1e-2 on the gradients. A rare draw is so ill-conditioned that any float32
// evaluation misses 1e-5 (tiny tensors sharing one cancelling dot product); for those the
// tolerance rises to 64x what a plain float32 evaluation of the same draw gets (at most 1e-2):
// see compare().
#include "wkv_doctest.h"

#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include "test_isa.h"
#include "test_rwkv7_config.h"
#include "test_util.h"
#include "test_util_ops.h"

using namespace wkvtest;

namespace {

using Config = Rwkv7Config;

// The library's results, as logical float64 values in the reference's layout (states value-
// major), plus the raw output buffers for bit-exact comparisons.
struct Results {
    std::vector<double> y, sT, dr, dw, dk, dv, da, db, ds0;
    std::vector<std::vector<unsigned char>> raw;
};

// Runs wkv_forward then wkv_backward on `d` (values already representable in c.dtype) through
// the public API. `seq_offsets`/`num_seqs` pack sequences (then d.B == 1 and s0, dsT hold one
// state per sequence). dsT is used only when c.dstate_out.
Results run_library(const Config& c, const Rwkv7Data& d, const std::vector<double>& dy,
                    const std::vector<double>& dsT, const int64_t* seq_offsets = nullptr,
                    int64_t num_seqs = 0) {
    CpuCtx holder(c.threads);
    REQUIRE_MESSAGE(holder.status == WKV_OK, std::string(wkv_last_error(nullptr)));
    wkv_context* ctx = holder.ctx;
    const int64_t S = num_seqs > 0 ? num_seqs : c.B;

    const std::vector<double>* in_vals[6] = {&d.r, &d.w, &d.k, &d.v, &d.a, &d.b};
    std::vector<HostTensor> in(6);
    for (int i = 0; i < 6; i++) {
        in[static_cast<size_t>(i)] = token_tensor(c, c.dtype, i == 1 && c.w_broadcast);
        fill_input(in[static_cast<size_t>(i)], *in_vals[i]);
    }
    HostTensor y = token_tensor(c, c.dtype);
    HostTensor s_in = state_tensor(c, S), s_out = state_tensor(c, S);
    if (c.state_in) fill_input(s_in, to_lib_state(c, S, d.s0));

    wkv_forward_desc f{};
    f.struct_size = sizeof f;
    f.op = WKV_OP_RWKV7;
    f.decay_form = c.form;
    f.flags = c.key_major ? static_cast<uint32_t>(WKV_FLAG_STATE_KEY_MAJOR) : 0u;
    f.r = in[0].view();
    f.w = in[1].view();
    f.k = in[2].view();
    f.v = in[3].view();
    f.a = in[4].view();
    f.b = in[5].view();
    f.y = y.view();
    if (c.state_in) f.state_in = s_in.view();
    if (c.state_out) f.state_out = c.in_place ? s_in.view() : s_out.view();
    f.seq_offsets = seq_offsets;
    f.num_seqs = num_seqs;

    Unchanged fwd_inputs;
    const char* names[6] = {"r", "w", "k", "v", "a", "b"};
    for (size_t i = 0; i < 6; i++) fwd_inputs.add(in[i], names[i]);
    if (c.state_in && !c.in_place) fwd_inputs.add(s_in, "state_in");

    // ------------------------------------------------------------------ forward
    y.poison();
    if (!c.in_place) s_out.poison();
    forward_ok(ctx, f);
    Results res;
    res.y = read_output(y, res.raw);
    // the transpose is its own inverse
    if (c.state_out) res.sT = to_lib_state(c, S, read_output(c.in_place ? s_in : s_out, res.raw));
    fwd_inputs.check("forward");

    // ------------------------------------------------------------------ backward
    // The backward reads state_in again: after an in-place forward it holds sT, so restore s0.
    if (c.state_in && c.in_place) fill_input(s_in, to_lib_state(c, S, d.s0));
    HostTensor dyt = token_tensor(c, c.dtype);
    fill_input(dyt, dy);
    HostTensor ds_out = state_tensor(c, S), ds_in = state_tensor(c, S);
    if (c.dstate_out) fill_input(ds_out, to_lib_state(c, S, dsT));
    std::vector<HostTensor> g(6);
    for (HostTensor& t : g) {
        t = token_tensor(c, c.dtype);
        t.poison();
    }
    ds_in.poison();
    y.poison(); // the backward ignores the forward's outputs: garbage there, to be sure
    Unchanged bwd_inputs;
    for (size_t i = 0; i < 6; i++) bwd_inputs.add(in[i], names[i]);
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
    bd.da = g[4].view();
    bd.db = g[5].view();
    if (c.dstate_in) bd.dstate_in = ds_in.view();
    backward_ok(ctx, bd);
    std::vector<double>* outs[6] = {&res.dr, &res.dw, &res.dk, &res.dv, &res.da, &res.db};
    for (size_t i = 0; i < 6; i++) *outs[i] = read_output(g[i], res.raw);
    if (c.dstate_in) res.ds0 = to_lib_state(c, S, read_output(ds_in, res.raw));
    bwd_inputs.check("backward");
    return res;
}

// Draws a problem for `c`, rounded to what the library is given.
struct Problem {
    Rwkv7Data d;
    std::vector<double> dy, dsT;
};

Problem make_problem(const Config& c, Rng& rng) {
    Problem p;
    p.d = random_rwkv7(rng, c.B, c.T, c.H, c.N, c.form, c.state_in);
    if (c.w_broadcast)  // one w per (b, h, n), the same at every t
        for (int64_t b = 0; b < c.B; b++)
            for (int64_t t = 1; t < c.T; t++)
                for (int64_t hn = 0; hn < c.H * c.N; hn++)
                    p.d.w[static_cast<size_t>((b * c.T + t) * c.H * c.N + hn)] =
                        p.d.w[static_cast<size_t>(b * c.T * c.H * c.N + hn)];
    for (auto* x : p.d.inputs()) *x = rounded(c.dtype, *x);
    p.d.s0 = rounded(WKV_DTYPE_F32, p.d.s0);
    p.dy = rounded(c.dtype, random_normal(rng, p.d.tok_count()));
    if (c.dstate_out) p.dsT = rounded(WKV_DTYPE_F32, random_normal(rng, p.d.state_count()));
    return p;
}

// The reference's outputs for a problem.
struct RefOut {
    std::vector<double> y, sT;
    Rwkv7Grads g;
};

RefOut reference(const Problem& p) {
    RefOut o;
    ref_forward(p.d, o.y, o.sT);
    o.g = ref_backward(p.d, p.dy, p.dsT);
    return o;
}

// The reference for packed sequences: each sequence [offsets[s], offsets[s+1]) of the single
// batch row run on its own from its own state slot s0[s] with its own dsT[s]. An empty
// sequence passes its state through (sT[s] = s0[s], ds0[s] = dsT[s]).
// `eval` computes one sequence (reference or plain_f32).
RefOut packed_reference(const Problem& p, const std::vector<int64_t>& offsets,
                        RefOut (*eval)(const Problem&)) {
    const Rwkv7Data& d = p.d;
    const int64_t num_seqs = static_cast<int64_t>(offsets.size()) - 1;
    const size_t HN = static_cast<size_t>(d.H * d.N), NN = static_cast<size_t>(d.H * d.N * d.N);
    RefOut o;
    o.y.assign(d.tok_count(), 0.0);
    o.sT.assign(static_cast<size_t>(num_seqs) * NN, 0.0);
    o.g.ds0.assign(static_cast<size_t>(num_seqs) * NN, 0.0);
    for (auto* x : {&o.g.dr, &o.g.dw, &o.g.dk, &o.g.dv, &o.g.da, &o.g.db}) x->assign(d.tok_count(), 0.0);
    auto range = [](const std::vector<double>& x, size_t begin, size_t end) {
        return std::vector<double>(x.begin() + static_cast<std::ptrdiff_t>(begin),
                                   x.begin() + static_cast<std::ptrdiff_t>(end));
    };
    auto put = [](std::vector<double>& dst, const std::vector<double>& src, size_t at) {
        std::copy(src.begin(), src.end(), dst.begin() + static_cast<std::ptrdiff_t>(at));
    };
    for (size_t s = 0; s < static_cast<size_t>(num_seqs); s++) {
        const size_t t0 = static_cast<size_t>(offsets[s]), t1 = static_cast<size_t>(offsets[s + 1]);
        const std::vector<double> s0 = range(d.s0, s * NN, (s + 1) * NN);
        const std::vector<double> dsT = range(p.dsT, s * NN, (s + 1) * NN);
        if (t1 == t0) {
            put(o.sT, s0, s * NN);
            put(o.g.ds0, dsT, s * NN);
            continue;
        }
        Problem q;
        q.d.B = 1;
        q.d.T = static_cast<int64_t>(t1 - t0);
        q.d.H = d.H;
        q.d.N = d.N;
        q.d.form = d.form;
        const std::vector<double>* src[6] = {&d.r, &d.w, &d.k, &d.v, &d.a, &d.b};
        std::vector<std::vector<double>*> dst = q.d.inputs();
        for (int i = 0; i < 6; i++) *dst[static_cast<size_t>(i)] = range(*src[i], t0 * HN, t1 * HN);
        q.d.s0 = s0;
        q.dy = range(p.dy, t0 * HN, t1 * HN);
        q.dsT = dsT;
        const RefOut r = eval(q);
        const std::vector<double>& y = r.y;
        const std::vector<double>& sT = r.sT;
        const Rwkv7Grads& g = r.g;
        put(o.y, y, t0 * HN);
        put(o.sT, sT, s * NN);
        put(o.g.dr, g.dr, t0 * HN);
        put(o.g.dw, g.dw, t0 * HN);
        put(o.g.dk, g.dk, t0 * HN);
        put(o.g.dv, g.dv, t0 * HN);
        put(o.g.da, g.da, t0 * HN);
        put(o.g.db, g.db, t0 * HN);
        put(o.g.ds0, g.ds0, s * NN);
    }
    return o;
}

// The problem with every input, s0, dy and dsT multiplied by (1 + u 2^-23), u uniform in
// [-1, 1]: a float32 rounding's worth of noise.
Problem perturbed(const Problem& p, Rng& rng) {
    Problem q = p;
    const double ulp = std::ldexp(1.0, -23);
    for (auto* x : q.d.inputs())
        for (double& v : *x) v *= 1.0 + ulp * rng.uniform(-1.0, 1.0);
    for (auto* x : {&q.d.s0, &q.dy, &q.dsT})
        for (double& v : *x) v *= 1.0 + ulp * rng.uniform(-1.0, 1.0);
    return q;
}

// The same recurrence as the reference, in plain float32: sequential sums, every state kept.
// Not a reference: a yardstick for how far an honest float32 evaluation of this very draw
// lands from the float64 one.
RefOut plain_f32(const Problem& p) {
    const Rwkv7Data& d = p.d;
    const int64_t T = d.T, N = d.N;
    const size_t NN = static_cast<size_t>(N * N);
    RefOut o;
    o.y.assign(d.tok_count(), 0.0);
    o.sT.assign(d.state_count(), 0.0);
    o.g.ds0.assign(d.state_count(), 0.0);
    for (auto* x : {&o.g.dr, &o.g.dw, &o.g.dk, &o.g.dv, &o.g.da, &o.g.db}) x->assign(d.tok_count(), 0.0);
    std::vector<float> S(static_cast<size_t>(T + 1) * NN), dS(NN), sa(static_cast<size_t>(N)),
        dsa(static_cast<size_t>(N)), dec(static_cast<size_t>(N));
    auto f = [](double x) { return static_cast<float>(x); };
    for (int64_t b = 0; b < d.B; b++) {
        for (int64_t h = 0; h < d.H; h++) {
            const size_t so = static_cast<size_t>(b * d.H + h) * NN;
            for (size_t e = 0; e < NN; e++) S[e] = d.s0.empty() ? 0.0f : f(d.s0[so + e]);
            for (int64_t t = 0; t < T; t++) {
                const size_t o0 = static_cast<size_t>(((b * T + t) * d.H + h) * N);
                auto in = [&](const std::vector<double>& x, int64_t j) { return f(x[o0 + static_cast<size_t>(j)]); };
                const float* Sp = &S[static_cast<size_t>(t) * NN];
                float* St = &S[static_cast<size_t>(t + 1) * NN];
                for (int64_t i = 0; i < N; i++) {
                    float acc = 0.0f;
                    for (int64_t l = 0; l < N; l++) acc += Sp[i * N + l] * in(d.a, l);
                    sa[static_cast<size_t>(i)] = acc;
                }
                for (int64_t i = 0; i < N; i++) {
                    float acc = 0.0f;
                    for (int64_t j = 0; j < N; j++) {
                        St[i * N + j] = Sp[i * N + j] * f(wkv_ref_decay(d.form, in(d.w, j))) +
                                        sa[static_cast<size_t>(i)] * in(d.b, j) + in(d.v, i) * in(d.k, j);
                        acc += St[i * N + j] * in(d.r, j);
                    }
                    o.y[o0 + static_cast<size_t>(i)] = acc;
                }
            }
            const float* Sl = &S[static_cast<size_t>(T) * NN];
            for (size_t e = 0; e < NN; e++) {
                o.sT[so + e] = Sl[e];
                dS[e] = p.dsT.empty() ? 0.0f : f(p.dsT[so + e]);
            }
            for (int64_t t = T - 1; t >= 0; t--) {
                const size_t o0 = static_cast<size_t>(((b * T + t) * d.H + h) * N);
                auto in = [&](const std::vector<double>& x, int64_t j) { return f(x[o0 + static_cast<size_t>(j)]); };
                auto G = [&](int64_t i, int64_t j) -> float& { return dS[static_cast<size_t>(i * N + j)]; };
                const float* Sp = &S[static_cast<size_t>(t) * NN];
                const float* St = &S[static_cast<size_t>(t + 1) * NN];
                for (int64_t i = 0; i < N; i++)
                    for (int64_t j = 0; j < N; j++) G(i, j) += in(p.dy, i) * in(d.r, j);
                for (int64_t x = 0; x < N; x++) {
                    const size_t ox = o0 + static_cast<size_t>(x);
                    float dr = 0.0f, dk = 0.0f, dd = 0.0f, dv = 0.0f, sax = 0.0f, dsax = 0.0f;
                    for (int64_t i = 0; i < N; i++) {
                        // x as a key column: dr, dk, d decay; x as a value row: dv, sa, dsa
                        dr += St[i * N + x] * in(p.dy, i);
                        dk += G(i, x) * in(d.v, i);
                        dd += G(i, x) * Sp[i * N + x];
                        dv += G(x, i) * in(d.k, i);
                        sax += Sp[x * N + i] * in(d.a, i);
                        dsax += G(x, i) * in(d.b, i);
                    }
                    o.g.dr[ox] = dr;
                    o.g.dk[ox] = dk;
                    o.g.dv[ox] = dv;
                    o.g.dw[ox] = dd * f(wkv_ref_decay_grad(d.form, in(d.w, x)));
                    dec[static_cast<size_t>(x)] = f(wkv_ref_decay(d.form, in(d.w, x)));
                    sa[static_cast<size_t>(x)] = sax;
                    dsa[static_cast<size_t>(x)] = dsax;
                }
                for (int64_t j = 0; j < N; j++) {
                    float db = 0.0f, da = 0.0f;
                    for (int64_t i = 0; i < N; i++) {
                        db += G(i, j) * sa[static_cast<size_t>(i)];
                        da += Sp[i * N + j] * dsa[static_cast<size_t>(i)];
                    }
                    o.g.db[o0 + static_cast<size_t>(j)] = db;
                    o.g.da[o0 + static_cast<size_t>(j)] = da;
                }
                for (int64_t i = 0; i < N; i++)
                    for (int64_t j = 0; j < N; j++)
                        G(i, j) = G(i, j) * dec[static_cast<size_t>(j)] + dsa[static_cast<size_t>(i)] * in(d.a, j);
            }
            for (size_t e = 0; e < NN; e++) o.g.ds0[so + e] = dS[e];
        }
    }
    return o;
}

// What the comparisons measure against: the reference, the reference on perturbed() inputs,
// and plain_f32().
struct Yardsticks {
    RefOut ref, perturbed, f32;
};

// How far a float32 evaluation may land from the reference depends on the draw. The check is
//     error <= max(tol, min(kFloorCap, kCondFactor * max(sensitivity, plain float32 error)))
// where sensitivity is the relative change of the reference output under a float32
// rounding's worth of input noise (perturbed()) and the plain float32 error is that of
// plain_f32() on the same draw. On a typical draw both are ~1e-7 and the floor stays far below
// the tolerances. It matters for tiny tensors whose every element shares one cancelling dot
// product: e.g. with T = 2, no state and no dstate_out, da_1 = k_0 (v_0 . dy_1)(r_1 . b_1), and
// when both dot products cancel, every float32 evaluation, correct or not, is off by about the
// product of their condition numbers.
// The floor never exceeds kFloorCap: a real bug (a wrong index, a missing term, a transposed
// state) is off by order one, and plain_f32() itself is checked in its own test below.
constexpr double kCondFactor = 64.0;
constexpr double kFloorCap = 1e-2;

void compare(const char* name, const std::vector<double>& got, const std::vector<double>& ref,
             const std::vector<double>& ref_perturbed, const std::vector<double>& f32, double tol) {
    const double e = rel_err(got, ref);
    const double sensitivity = rel_err(ref_perturbed, ref);
    const double f32_err = rel_err(f32, ref);
    const double allowed =
        std::max(tol, std::min(kFloorCap, kCondFactor * std::max(sensitivity, f32_err)));
    const std::string tensor = name;
    INFO(tensor << ": norm-wise relative error " << e << ", allowed " << allowed
                << " (tolerance " << tol << "; on this draw the float32 sensitivity is "
                << sensitivity << " and a plain float32 evaluation's error " << f32_err << ")");
    CHECK(e <= allowed);
    if (std::getenv("WKV_TEST_DUMP") && !(e <= allowed))
        for (size_t i = 0; i < got.size() && i < ref.size(); i++)
            std::printf("%s[%zu] lib % .9e ref % .9e\n", name, i, got[i], ref[i]);
    if (std::getenv("WKV_TEST_STATS"))
        std::printf("STAT %s tol %.0e err %.3e sens %.3e f32 %.3e\n", name, tol, e, sensitivity, f32_err);
}

void compare_all(const Config& c, const Results& lib, const Yardsticks& ys) {
    const bool half = c.dtype.bits == 16;
    const double tol_fwd = half ? 5e-3 : 1e-5, tol_grad = half ? 1e-2 : 1e-5;
    const RefOut &r = ys.ref, &p = ys.perturbed, &f = ys.f32;
    compare("y", lib.y, r.y, p.y, f.y, tol_fwd);
    if (c.state_out) compare("state_out", lib.sT, r.sT, p.sT, f.sT, tol_fwd);
    compare("dr", lib.dr, r.g.dr, p.g.dr, f.g.dr, tol_grad);
    compare("dw", lib.dw, r.g.dw, p.g.dw, f.g.dw, tol_grad);
    compare("dk", lib.dk, r.g.dk, p.g.dk, f.g.dk, tol_grad);
    compare("dv", lib.dv, r.g.dv, p.g.dv, f.g.dv, tol_grad);
    compare("da", lib.da, r.g.da, p.g.da, f.g.da, tol_grad);
    compare("db", lib.db, r.g.db, p.g.db, f.g.db, tol_grad);
    if (c.dstate_in) compare("dstate_in", lib.ds0, r.g.ds0, p.g.ds0, f.g.ds0, tol_grad);
}

// One random case: the library against the reference on the same (rounded) values.
void check_case(const Config& c, uint64_t seed) {
    INFO("case: " << c.describe());
    INFO("case seed " << seed);
    Rng rng(seed);
    Problem p = make_problem(c, rng);
    Results lib = run_library(c, p.d, p.dy, p.dsT);
    compare_all(c, lib, {reference(p), reference(perturbed(p, rng)), plain_f32(p)});
}

struct SeedInfo {
    uint64_t seed;
    SeedInfo() : seed(test_seed()) {}
};

// The run's seed (one per process, so every test case of a run reproduces with it).
uint64_t run_seed() {
    static SeedInfo s;
    return s.seed;
}

#define WKV_SEED_INFO()                                                                        \
    const uint64_t seed = run_seed();                                                          \
    INFO("seed " << seed << " (reproduce with WKV_TEST_SEED=" << seed << ")")

const int64_t kT[] = {1, 2, 15, 16, 17, 100};
const int64_t kN[] = {1, 7, 32, 64, 128};
const wkv_decay_form kForms[] = {WKV_DECAY_DIRECT, WKV_DECAY_LOG, WKV_DECAY_EXP_NEG_EXP,
                                 WKV_DECAY_CLAMPW};
const wkv_dtype kDtypes[] = {WKV_DTYPE_F32, WKV_DTYPE_F16, WKV_DTYPE_BF16};

}  // namespace

TEST_CASE("rwkv7 random: the plain float32 yardstick agrees with the reference") {
    // plain_f32() sets how much error an ill-conditioned draw may show; it must itself be a
    // faithful float32 evaluation, or that floor would be meaningless.
    WKV_SEED_INFO();
    for (int i = 0; i < 4; i++) {
        Config c;
        c.B = 2;
        c.T = 40;
        c.H = 2;
        c.N = i % 2 ? 32 : 17;
        c.form = kForms[i];
        c.state_in = c.state_out = c.dstate_out = c.dstate_in = true;
        INFO("case: " << c.describe());
        Rng rng(seed + 6000 + static_cast<uint64_t>(i));
        const Problem p = make_problem(c, rng);
        const RefOut r = reference(p), f = plain_f32(p);
        const std::pair<const std::vector<double>*, const std::vector<double>*> pairs[9] = {
            {&f.y, &r.y},       {&f.sT, &r.sT},     {&f.g.dr, &r.g.dr},
            {&f.g.dw, &r.g.dw}, {&f.g.dk, &r.g.dk}, {&f.g.dv, &r.g.dv},
            {&f.g.da, &r.g.da}, {&f.g.db, &r.g.db}, {&f.g.ds0, &r.g.ds0}};
        for (int k = 0; k < 9; k++) {
            CAPTURE(k);
            CHECK(rel_err(*pairs[k].first, *pairs[k].second) <= 1e-5);
        }
    }
}

TEST_CASE("rwkv7 random: shapes, decay forms, dtypes and states against the reference") {
    WKV_SEED_INFO();
    // A covering subset of T x N x B x H x form x dtype x state: the index walks each axis
    // with a different period, so every value of every axis appears, as does every T x N pair
    // (4 times), every form x dtype pair (10 times) and every form x dtype pair with each of
    // the five state modes (twice); the largest product (T = 100 with N = 128) has B = 1.
    const auto t0 = std::chrono::steady_clock::now();
    int cases = 0;
    for (int i = 0; i < 120; i++) {
        Config c;
        c.T = kT[i % 6];
        c.N = kN[i % 5];
        c.B = (i / 2) % 2 ? 3 : 1;
        c.H = (i / 3) % 2 ? 2 : 1;
        c.form = kForms[i % 4];
        c.dtype = kDtypes[(i / 4) % 3];
        const int state_mode = (i / 12) % 5;  // none, in, out, in+out, in+out with gradients
        c.state_in = state_mode == 1 || state_mode >= 3;
        c.state_out = state_mode >= 2;
        c.dstate_out = state_mode == 2 || state_mode == 4;
        c.dstate_in = c.state_in && (state_mode != 3 || i % 2 == 0);
        if (c.T == 100 && c.N == 128) c.B = 1;  // the one big shape: keep it cheap
        // Sprinkle the layout features over the shapes too (they have their own tests below).
        c.layout = i % 7 == 3 ? Layout::PaddedT : i % 7 == 5 ? Layout::Transposed : Layout::Contiguous;
        c.w_broadcast = i % 11 == 4;
        c.key_major = i % 13 == 6;
        c.padded_state = i % 17 == 9;
        check_case(c, seed + static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull);
        cases++;
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE(cases << " random cases in " << secs << " s");
}

TEST_CASE("rwkv7 random: strided and broadcast inputs") {
    WKV_SEED_INFO();
    int i = 0;
    for (Layout layout : {Layout::PaddedT, Layout::Transposed, Layout::Contiguous}) {
        for (wkv_dtype dt : {WKV_DTYPE_F32, WKV_DTYPE_BF16}) {
            for (bool w_broadcast : {false, true}) {
                Config c;
                c.B = 3;
                c.T = 17;
                c.H = 2;
                c.N = i % 2 ? 32 : 7;
                c.form = kForms[i % 4];
                c.dtype = dt;
                c.layout = layout;
                c.w_broadcast = w_broadcast;
                c.state_in = c.state_out = c.dstate_out = c.dstate_in = true;
                c.padded_state = layout == Layout::PaddedT;
                check_case(c, seed + 1000 + static_cast<uint64_t>(i++));
            }
        }
    }
}

TEST_CASE("rwkv7 random: key-major state (WKV_FLAG_STATE_KEY_MAJOR)") {
    WKV_SEED_INFO();
    int i = 0;
    for (int64_t N : {7, 64}) {
        for (bool padded : {false, true}) {
            Config c;
            c.B = 3;
            c.T = padded ? 33 : 32;  // around the CPU backend's 32-token checkpoint interval
            c.H = 2;
            c.N = N;
            c.form = kForms[i % 4];
            c.dtype = i % 2 ? WKV_DTYPE_F16 : WKV_DTYPE_F32;
            c.key_major = true;
            c.padded_state = padded;
            c.state_in = c.state_out = c.dstate_out = c.dstate_in = true;
            check_case(c, seed + 2000 + static_cast<uint64_t>(i++));
        }
    }
}

TEST_CASE("rwkv7 random: in-place state (state_out is state_in)") {
    WKV_SEED_INFO();
    int i = 0;
    for (bool key_major : {false, true}) {
        for (int64_t T : {1, 15}) {
            Config c;
            c.B = 3;
            c.T = T;
            c.H = 2;
            c.N = 32;
            c.form = kForms[(i + 1) % 4];
            c.key_major = key_major;
            c.in_place = true;
            c.padded_state = i % 2 == 1;
            c.state_in = c.state_out = c.dstate_out = c.dstate_in = true;
            check_case(c, seed + 3000 + static_cast<uint64_t>(i++));
        }
    }
}

TEST_CASE("rwkv7 random: decays near zero and zero (the CPU's blocks walked token by token)") {
    // With WKV_RWKV7_WALK=blocks (ctest's wkv_tests_rwkv7_blocks_*) the vector paths walk
    // sequences of 16 tokens or more in blocks of 8, dividing by the block's running decay
    // products; a block whose products leave [1e-20, 1e20] is stepped token by token
    // (backends/cpu/rwkv7_transposed.inl). Here blocks 1 and 3 of each sequence get
    // decays of 1e-4 and exact zeros (products far below 1e-20), the others ordinary ones, and
    // 37 tokens leave a tail of 5; every output and gradient against the reference.
    WKV_SEED_INFO();
    int i = 0;
    for (int64_t N : {32, 64, 128}) {
        Config c;
        c.B = 2;
        c.T = 37;
        c.H = 2;
        c.N = N;
        c.form = WKV_DECAY_DIRECT;
        c.state_in = c.state_out = c.dstate_out = c.dstate_in = true;
        INFO("case: " << c.describe());
        Rng rng(seed + 9000 + static_cast<uint64_t>(i++));
        Problem p = make_problem(c, rng);
        const int64_t HN = c.H * c.N;
        for (int64_t b = 0; b < c.B; b++)
            for (int64_t t = 8; t < 32; t++) {
                if (t / 8 % 2 == 0) continue;  // blocks 1 and 3
                for (int64_t e = 0; e < HN; e++) {
                    double& w = p.d.w[static_cast<size_t>((b * c.T + t) * HN + e)];
                    w = t / 8 == 1 ? 1e-4 * w : (e % 3 == 0 ? 0.0 : w);
                }
            }
        p.d.w = rounded(c.dtype, p.d.w);
        const Results lib = run_library(c, p.d, p.dy, p.dsT);
        compare_all(c, lib, {reference(p), reference(perturbed(p, rng)), plain_f32(p)});
    }
}

TEST_CASE("rwkv7 random: packed sequences equal separate runs") {
    WKV_SEED_INFO();
    struct Packing {
        std::vector<int64_t> offsets;
        int64_t N;
        wkv_dtype dtype;
    };
    // Each includes an empty sequence (its state passes through; its ds0 is its dsT).
    const Packing packings[] = {
        {{0, 5, 5, 22, 40}, 32, WKV_DTYPE_F32},
        {{0, 0, 1, 17, 33, 33}, 7, WKV_DTYPE_F32},
        {{0, 16, 16, 100}, 64, WKV_DTYPE_BF16},
    };
    int pi = 0;
    for (const Packing& pk : packings) {
        const int64_t num_seqs = static_cast<int64_t>(pk.offsets.size()) - 1;
        const int64_t T = pk.offsets.back();
        for (bool key_major : {false, true}) {
            Config c;
            c.B = 1;
            c.T = T;
            c.H = 2;
            c.N = pk.N;
            c.dtype = pk.dtype;
            c.form = kForms[pi % 4];
            c.key_major = key_major;
            c.state_in = c.state_out = c.dstate_out = c.dstate_in = true;
            const uint64_t cs = seed + 4000 + static_cast<uint64_t>(pi++);
            INFO("case: " << c.describe() << " num_seqs=" << num_seqs);
            INFO("case seed " << cs);
            Rng rng(cs);
            Config one = c;
            one.state_in = false;
            Problem p = make_problem(one, rng);  // B = 1 over the total T, no s0
            Rwkv7Data s0src = random_rwkv7(rng, num_seqs, 8, c.H, c.N, c.form, false);
            std::vector<double> unused;
            ref_forward(s0src, unused, p.d.s0);  // one realistic state per sequence
            p.d.s0 = rounded(WKV_DTYPE_F32, p.d.s0);
            p.dsT = rounded(WKV_DTYPE_F32, random_normal(rng, static_cast<size_t>(num_seqs * c.H * c.N * c.N)));

            Results lib = run_library(c, p.d, p.dy, p.dsT, pk.offsets.data(), num_seqs);
            const RefOut ref = packed_reference(p, pk.offsets, reference);
            compare_all(c, lib,
                        {ref, packed_reference(perturbed(p, rng), pk.offsets, reference),
                         packed_reference(p, pk.offsets, plain_f32)});
            const size_t NN = static_cast<size_t>(c.H * c.N * c.N);
            const std::vector<double>& sT = ref.sT;
            const std::vector<double>& ds0 = ref.g.ds0;
            // The empty sequences' states come through exactly (float32 in, float32 out).
            for (int64_t s = 0; s < num_seqs; s++) {
                if (pk.offsets[static_cast<size_t>(s)] != pk.offsets[static_cast<size_t>(s) + 1]) continue;
                CAPTURE(s);
                for (size_t e = static_cast<size_t>(s) * NN; e < static_cast<size_t>(s + 1) * NN; e++) {
                    if (lib.sT[e] != sT[e] || lib.ds0[e] != ds0[e]) {
                        CHECK_MESSAGE(false, "empty sequence's state or its gradient changed at element " << e);
                        break;
                    }
                }
            }
        }
    }
}

TEST_CASE("rwkv7 random: cpu_threads = 1 and 2 give bit-identical results") {
    WKV_SEED_INFO();
    int i = 0;
    for (wkv_dtype dt : {WKV_DTYPE_F32, WKV_DTYPE_BF16}) {
        for (int64_t T : {17, 100}) {
            Config c;
            c.B = 3;
            c.T = T;
            c.H = 2;
            c.N = T == 100 ? 64 : 32;
            c.dtype = dt;
            c.form = kForms[i % 4];
            c.state_in = c.state_out = c.dstate_out = c.dstate_in = true;
            const uint64_t cs = seed + 5000 + static_cast<uint64_t>(i++);
            INFO("case: " << c.describe());
            INFO("case seed " << cs);
            Rng rng(cs);
            Problem p = make_problem(c, rng);
            c.threads = 1;
            Results one = run_library(c, p.d, p.dy, p.dsT);
            c.threads = 2;
            Results two = run_library(c, p.d, p.dy, p.dsT);
            REQUIRE(one.raw.size() == two.raw.size());
            for (size_t k = 0; k < one.raw.size(); k++) {
                CAPTURE(k);
                CHECK(one.raw[k] == two.raw[k]);
            }
        }
    }
}

TEST_CASE("rwkv7 random: every CPU path this machine runs against the reference") {
    // The CPU backend's instruction-set paths (WKV_CPU_ISA) differ in the order of their float32
    // operations and in their code for N = 32/64/128 versus other N (padding), for in-place,
    // one-token and state-less calls, strided rows and 16-bit conversions: a few cases of each,
    // on every path (ctest's wkv_tests_isa_<path> entries run this whole file on each path).
    WKV_SEED_INFO();
    const int64_t kIsaN[] = {64, 32, 128, 7, 16, 24};
    for (const std::string& isa : runnable_cpu_isas()) {
        ScopedIsa scope(isa.c_str());
        INFO("WKV_CPU_ISA=" << isa);
        for (int i = 0; i < 12; i++) {
            Config c;
            c.T = i % 3 == 0 ? 1 : i % 3 == 1 ? 17 : 40;
            c.N = kIsaN[i % 6];
            c.B = i % 2 ? 2 : 1;
            c.H = i % 4 < 2 ? 2 : 3;
            c.form = kForms[i % 4];
            c.dtype = kDtypes[i % 3];
            c.state_in = i % 5 != 1;
            c.state_out = i % 5 != 2;
            c.dstate_out = c.state_out;
            c.dstate_in = c.state_in;
            c.in_place = c.state_in && c.state_out && i % 4 == 3;
            c.key_major = i == 5;
            c.padded_state = i == 7;
            c.layout = i == 8 ? Layout::Transposed : i == 10 ? Layout::PaddedT : Layout::Contiguous;
            c.threads = 1 + i % 2;
            check_case(c, seed + 7000 + static_cast<uint64_t>(i));
        }
    }
}

TEST_CASE("rwkv7 random: wkv_workspace_size is the documented formula") {
    // backends/cpu/rwkv7.cpp (the scalar path):
    //   workspace = 64 + [packed] A64(8 (num_seqs + 1)) + A64(4 H G N^2)
    //             + chunks A64(4 ((R + 1) N^2 + 16 N)),   chunks = min(num_seqs H, 4 threads)
    // backends/cpu/rwkv7_simd.inl (the vector paths: N padded to Np, a multiple of the vector
    // width W; backward items of up to 8 heads, Gh of them):
    //   workspace = 64 + [packed] A64(8 (num_seqs + 1)) + A64(4 H G Np^2)
    //             + chunks A64(4 ((Gh + R) Np^2 + Gh R 15 Np + Np))
    //   Gh = min(8, H, ceil(H / ceil(threads / num_seqs))), chunks = min(items, 4 threads),
    //   items = num_seqs ceil(H / Gh)
    // with G = sum over sequences of ceil(L_s / 32) and R = min(32, the longest L_s).
    // the shared shapes, and two with many heads (groups of 8 at 2 threads, a partial group)
    std::vector<HeadsShape> shapes = heads_workspace_shapes();
    shapes.push_back({1, 100, 32, 64, {}, 2});
    shapes.push_back({1, 65, 20, 24, {}, 1});
    for (const std::string& isa : runnable_cpu_isas()) {
        ScopedIsa scope(isa.c_str());
        const uint64_t W = isa_width(isa);
        for (const HeadsShape& s : shapes) {
            INFO("isa=" << isa << " B=" << s.B << " T=" << s.T << " H=" << s.H << " N=" << s.N
                        << " packed=" << !s.lens.empty() << " threads=" << s.threads);
            CpuCtx ctx(s.threads);
            REQUIRE(ctx.status == WKV_OK);
            const SeqSpan q = seq_span(s.B, s.T, s.lens);
            HostTensor x(WKV_DTYPE_F32, {s.B, s.T, s.H, s.N});
            HostTensor dy = x, dr = x, dw = x, dk = x, dv = x, da = x, db = x;
            wkv_forward_desc f{};
            f.struct_size = sizeof f;
            f.op = WKV_OP_RWKV7;
            f.decay_form = WKV_DECAY_EXP_NEG_EXP;
            f.r = f.w = f.k = f.v = f.a = f.b = x.view();
            f.seq_offsets = q.offsets.empty() ? nullptr : q.offsets.data();
            f.num_seqs = q.offsets.empty() ? 0 : q.num_seqs;
            wkv_backward_desc g{};
            g.struct_size = sizeof g;
            g.forward = &f;
            g.dy = dy.view(), g.dr = dr.view(), g.dw = dw.view(), g.dk = dk.view();
            g.dv = dv.view(), g.da = da.view(), g.db = db.view();
            size_t bytes = 0;
            REQUIRE_MESSAGE(wkv_workspace_size(ctx.ctx, &bytes, &g) == WKV_OK, std::string(wkv_last_error(ctx.ctx)));

            const uint64_t N = static_cast<uint64_t>(s.N), H = static_cast<uint64_t>(s.H);
            const uint64_t S = static_cast<uint64_t>(q.num_seqs), T = static_cast<uint64_t>(s.threads);
            const uint64_t G = q.segments, R = static_cast<uint64_t>(std::min<int64_t>(q.longest, 32));
            const uint64_t packed = q.packed_bytes;
            uint64_t want = 0;
            if (W == 0) {
                const uint64_t chunks = std::min<uint64_t>(S * H, 4u * T);
                want = 64 + packed + a64(4 * H * G * N * N) + chunks * a64(4 * ((R + 1) * N * N + 16 * N));
            } else {
                const uint64_t Np = (N + W - 1) / W * W;
                const uint64_t Gh = backward_heads(H, S, T, 8);
                const uint64_t items = S * ((H + Gh - 1) / Gh);
                const uint64_t chunks = std::min<uint64_t>(items, 4u * T);
                want = 64 + packed + a64(4 * H * G * Np * Np) +
                       chunks * a64(4 * ((Gh + R) * Np * Np + Gh * R * 15 * Np + Np));
            }
            CHECK(bytes == want);
        }
    }
}
