// The float64 reference (src/reference) against the third-party golden files, and its backward
// against central finite differences of its own forward.
#include "wkv_doctest.h"

#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"

using namespace wkvtest;

namespace {

wkv_decay_form parse_form(const std::string& s) {
    if (s == "direct") return WKV_DECAY_DIRECT;
    if (s == "log") return WKV_DECAY_LOG;
    if (s == "exp_neg_exp") return WKV_DECAY_EXP_NEG_EXP;
    if (s == "clampw") return WKV_DECAY_CLAMPW;
    return static_cast<wkv_decay_form>(0);
}

// L = sum(y * dy) + sum(sT * dsT) (dsT empty = zero), the scalar the backward differentiates.
double loss(const Rwkv7Data& d, const std::vector<double>& dy, const std::vector<double>& dsT) {
    std::vector<double> y, sT;
    ref_forward(d, y, sT);
    double L = 0.0;
    for (size_t i = 0; i < y.size(); i++) L += y[i] * dy[i];
    for (size_t i = 0; i < dsT.size(); i++) L += sT[i] * dsT[i];
    return L;
}

struct FdStats {
    double worst = 0.0;  // largest |fd - analytic| / (|analytic| + rms(gradient tensor))
    int checked = 0;
};

// Compares every element (or `samples` random ones when > 0) of each input's analytic gradient
// with the central difference (L(x+h) - L(x-h)) / 2h. s0 is made explicit (zeros when absent)
// so that ds0 is checked too. Fails when the error exceeds `tol` relative to
// |analytic| + rms(gradient tensor).
FdStats check_fd(const Rwkv7Data& d0, const std::vector<double>& dy,
                 const std::vector<double>& dsT, double tol, Rng& rng, int samples = 0,
                 double h = 1e-6) {
    Rwkv7Grads g = ref_backward(d0, dy, dsT);
    Rwkv7Data d = d0;
    if (d.s0.empty()) d.s0.assign(d.state_count(), 0.0);
    const char* names[7] = {"r", "w", "k", "v", "a", "b", "s0"};
    std::vector<double>* xs[7] = {&d.r, &d.w, &d.k, &d.v, &d.a, &d.b, &d.s0};
    const std::vector<double>* gs[7] = {&g.dr, &g.dw, &g.dk, &g.dv, &g.da, &g.db, &g.ds0};
    FdStats st;
    for (int t = 0; t < 7; t++) {
        const std::string tensor_name = names[t];
        CAPTURE(tensor_name);
        std::vector<double>& x = *xs[t];
        const std::vector<double>& gr = *gs[t];
        REQUIRE(all_finite(gr));
        const double scale = rms(gr);
        std::vector<size_t> idx;
        if (samples > 0)
            for (int s = 0; s < samples; s++)
                idx.push_back(static_cast<size_t>(rng.integer(0, static_cast<int64_t>(x.size()) - 1)));
        else
            for (size_t i = 0; i < x.size(); i++) idx.push_back(i);
        for (size_t i : idx) {
            const double x0 = x[i];
            x[i] = x0 + h;
            const double lp = loss(d, dy, dsT);
            x[i] = x0 - h;
            const double lm = loss(d, dy, dsT);
            x[i] = x0;
            const double fd = (lp - lm) / (2.0 * h);
            const double err = std::fabs(fd - gr[i]) / (std::fabs(gr[i]) + scale + 1e-300);
            st.worst = std::max(st.worst, err);
            st.checked++;
            if (!(err <= tol)) {
                CAPTURE(i);
                CAPTURE(fd);
                CAPTURE(gr[i]);
                CAPTURE(scale);
                CHECK(err <= tol);
            }
        }
    }
    return st;
}

}  // namespace

TEST_CASE("reference: decay forms and their derivatives") {
    const wkv_decay_form forms[4] = {WKV_DECAY_DIRECT, WKV_DECAY_LOG, WKV_DECAY_EXP_NEG_EXP,
                                     WKV_DECAY_CLAMPW};
    CHECK(wkv_ref_decay(WKV_DECAY_DIRECT, 0.75) == 0.75);
    CHECK(wkv_ref_decay(WKV_DECAY_LOG, 0.0) == 1.0);
    CHECK(wkv_ref_decay(WKV_DECAY_EXP_NEG_EXP, 0.0) == doctest::Approx(std::exp(-1.0)).epsilon(1e-15));
    CHECK(wkv_ref_decay(WKV_DECAY_CLAMPW, 0.0) ==
          doctest::Approx(std::exp(-0.5 * std::exp(-0.5))).epsilon(1e-15));
    // CLAMPW spans (exp(-e^-0.5), 1) and never under/overflows.
    CHECK(wkv_ref_decay(WKV_DECAY_CLAMPW, 800.0) == doctest::Approx(std::exp(-std::exp(-0.5))).epsilon(1e-15));
    CHECK(wkv_ref_decay(WKV_DECAY_CLAMPW, -800.0) == 1.0);
    CHECK(std::isfinite(wkv_ref_decay_grad(WKV_DECAY_CLAMPW, 800.0)));
    CHECK(std::isfinite(wkv_ref_decay_grad(WKV_DECAY_CLAMPW, -800.0)));
    for (wkv_decay_form f : forms) {
        const std::string form = form_name(f);
        CAPTURE(form);
        for (double decay : {1e-6, 0.1, 0.55, 0.9, 0.999}) {
            // CLAMPW reaches only (exp(-e^-0.5), 1) = (0.5452, 1).
            if (f == WKV_DECAY_CLAMPW && decay < 0.5453) continue;
            CAPTURE(decay);
            const double w = w_for_decay(f, decay);
            CHECK(wkv_ref_decay(f, w) == doctest::Approx(decay).epsilon(1e-12));
            const double h = 1e-6;
            const double fd = (wkv_ref_decay(f, w + h) - wkv_ref_decay(f, w - h)) / (2 * h);
            CHECK(wkv_ref_decay_grad(f, w) == doctest::Approx(fd).epsilon(1e-7).scale(decay));
        }
    }
}

TEST_CASE("reference: reproduces the RWKV-7 golden files to 1e-10") {
    const std::vector<std::string> files = golden_files("wkv7_");
    INFO("golden dir: " << golden_dir());
    REQUIRE(files.size() >= 8);
    double worst = 0.0;
    for (const std::string& path : files) {
        CAPTURE(path);
        SafeTensors st;
        REQUIRE_MESSAGE(st.load(path), st.error);
        REQUIRE(st.meta("op") == "wkv7");
        REQUIRE(st.meta("layout") == "BTHN");
        Rwkv7Data d;
        d.B = std::stoll(st.meta("B"));
        d.T = std::stoll(st.meta("T"));
        d.H = std::stoll(st.meta("H"));
        d.N = std::stoll(st.meta("N"));
        d.form = parse_form(st.meta("decay_form"));
        REQUIRE(d.form != 0);
        for (const char* name : {"r", "w", "k", "v", "a", "b", "s0", "dy", "dsT", "y", "sT", "dr",
                                 "dw", "dk", "dv", "da", "db", "ds0", "decay", "d_decay"}) {
            const std::string tensor_name = name;
            CAPTURE(tensor_name);
            REQUIRE(st.has(name));
            const bool state = std::string(name) == "s0" || std::string(name) == "dsT" ||
                               std::string(name) == "sT" || std::string(name) == "ds0";
            const std::vector<int64_t> want = state ? d.state_shape() : d.tok_shape();
            REQUIRE(st.tensors.at(name).shape == want);
        }
        d.r = st.at("r"); d.w = st.at("w"); d.k = st.at("k");
        d.v = st.at("v"); d.a = st.at("a"); d.b = st.at("b");
        d.s0 = st.at("s0");
        const std::vector<double>& dy = st.at("dy");
        const std::vector<double>& dsT = st.at("dsT");

        std::vector<double> y, sT;
        ref_forward(d, y, sT);
        Rwkv7Grads g = ref_backward(d, dy, dsT);
        const std::pair<const char*, const std::vector<double>*> outs[9] = {
            {"y", &y},      {"sT", &sT},    {"dr", &g.dr}, {"dw", &g.dw},  {"dk", &g.dk},
            {"dv", &g.dv}, {"da", &g.da}, {"db", &g.db}, {"ds0", &g.ds0}};
        double file_worst = 0.0;
        for (const auto& o : outs) {
            const std::string out_name = o.first;
            CAPTURE(out_name);
            const double e = rel_err(*o.second, st.at(o.first));
            CHECK(e <= 1e-10);
            file_worst = std::max(file_worst, e);
        }
        worst = std::max(worst, file_worst);

        // decay and d_decay: the same problem with the decay given directly (w = decay) has
        // dw = dL/d decay, and dw of the file's form is d_decay * d decay / d w.
        Rwkv7Data direct = d;
        direct.form = WKV_DECAY_DIRECT;
        std::vector<double> chain(d.w.size());
        for (size_t i = 0; i < d.w.size(); i++) {
            direct.w[i] = wkv_ref_decay(d.form, d.w[i]);
            chain[i] = st.at("d_decay")[i] * wkv_ref_decay_grad(d.form, d.w[i]);
        }
        CHECK(rel_err(direct.w, st.at("decay")) <= 1e-13);
        Rwkv7Grads gd = ref_backward(direct, dy, dsT);
        CHECK(rel_err(gd.dw, st.at("d_decay")) <= 1e-10);
        CHECK(rel_err(g.dw, chain) <= 1e-10);
        CHECK(rel_err(chain, st.at("dw")) <= 1e-10);
        // The other gradients do not depend on how the decay is written.
        CHECK(rel_err(gd.dk, st.at("dk")) <= 1e-10);
        CHECK(rel_err(gd.ds0, st.at("ds0")) <= 1e-10);
    }
    MESSAGE(files.size() << " golden files, worst relative error " << worst);
}

TEST_CASE("reference: an absent s0 / dsT is the same as zeros") {
    Rng rng(7);
    Rwkv7Data d = random_rwkv7(rng, 2, 9, 2, 5, WKV_DECAY_LOG, false);
    std::vector<double> dy = random_normal(rng, d.tok_count());
    std::vector<double> y1, s1, y2, s2;
    ref_forward(d, y1, s1);
    Rwkv7Grads g1 = ref_backward(d, dy, {});
    Rwkv7Data z = d;
    z.s0.assign(d.state_count(), 0.0);
    ref_forward(z, y2, s2);
    Rwkv7Grads g2 = ref_backward(z, dy, std::vector<double>(d.state_count(), 0.0));
    CHECK(y1 == y2);
    CHECK(s1 == s2);
    CHECK(g1.dr == g2.dr);
    CHECK(g1.dw == g2.dw);
    CHECK(g1.da == g2.da);
    CHECK(g1.ds0 == g2.ds0);
    // A NULL sT is allowed.
    wkv_ref_rwkv7 in = d.ref();
    std::vector<double> y3(d.tok_count());
    wkv_ref_rwkv7_forward(&in, y3.data(), nullptr);
    CHECK(y3 == y1);
}

TEST_CASE("reference: backward matches central finite differences") {
    const wkv_decay_form forms[4] = {WKV_DECAY_DIRECT, WKV_DECAY_LOG, WKV_DECAY_EXP_NEG_EXP,
                                     WKV_DECAY_CLAMPW};
    Rng rng(12345);
    double worst = 0.0;
    for (wkv_decay_form f : forms) {
        for (int with_s0 = 0; with_s0 < 2; with_s0++) {
            for (int with_dsT = 0; with_dsT < 2; with_dsT++) {
                const std::string form = form_name(f);
        CAPTURE(form);
                CAPTURE(with_s0);
                CAPTURE(with_dsT);
                Rwkv7Data d = random_rwkv7(rng, 2, 5, 2, 3, f, with_s0 != 0);
                std::vector<double> dy = random_normal(rng, d.tok_count());
                std::vector<double> dsT;
                if (with_dsT) dsT = random_normal(rng, d.state_count());
                FdStats s = check_fd(d, dy, dsT, 1e-6, rng);
                worst = std::max(worst, s.worst);
            }
        }
    }
    MESSAGE("worst finite-difference disagreement: " << worst);
}

TEST_CASE("reference: backward matches finite differences across recomputation chunks") {
    // T = 130 spans three of the backward's 64-token recomputation chunks.
    Rng rng(4242);
    Rwkv7Data d = random_rwkv7(rng, 1, 130, 1, 2, WKV_DECAY_CLAMPW, true);
    std::vector<double> dy = random_normal(rng, d.tok_count());
    std::vector<double> dsT = random_normal(rng, d.state_count());
    check_fd(d, dy, dsT, 1e-6, rng, 40);
}

TEST_CASE("reference: tiny decays give finite gradients that match finite differences") {
    Rng rng(777);
    const wkv_decay_form forms[4] = {WKV_DECAY_DIRECT, WKV_DECAY_LOG, WKV_DECAY_EXP_NEG_EXP,
                                     WKV_DECAY_CLAMPW};
    for (wkv_decay_form f : forms) {
        const std::string form = form_name(f);
        CAPTURE(form);
        Rwkv7Data d = random_rwkv7(rng, 2, 6, 2, 4, f, true);
        // Half of the channels decay by a factor down to 1e-6 per step (CLAMPW cannot go
        // below exp(-e^-0.5) ~ 0.545, so it gets its most extreme w instead).
        for (size_t i = 0; i < d.w.size(); i++) {
            if (i % 2) continue;
            const double decay = std::pow(10.0, rng.uniform(-6.0, -3.0));
            d.w[i] = f == WKV_DECAY_CLAMPW ? rng.uniform(20.0, 40.0) : w_for_decay(f, decay);
        }
        d.w[0] = f == WKV_DECAY_CLAMPW ? 40.0 : w_for_decay(f, 1e-6);
        std::vector<double> dy = random_normal(rng, d.tok_count());
        std::vector<double> dsT = random_normal(rng, d.state_count());
        std::vector<double> y, sT;
        ref_forward(d, y, sT);
        CHECK(all_finite(y));
        CHECK(all_finite(sT));
        Rwkv7Grads g = ref_backward(d, dy, dsT);
        for (auto* x : {&g.dr, &g.dw, &g.dk, &g.dv, &g.da, &g.db, &g.ds0}) CHECK(all_finite(*x));
        FdStats s = check_fd(d, dy, dsT, 1e-6, rng);
        MESSAGE(form << ": worst finite-difference disagreement " << s.worst);
    }
}

TEST_CASE("reference: every decay 1e-6 still gives correct gradients") {
    Rng rng(778);
    // Written directly, dL/dw is dL/d decay, of order one: finite differences check it well.
    Rwkv7Data d = random_rwkv7(rng, 1, 4, 1, 3, WKV_DECAY_DIRECT, true);
    for (double& w : d.w) w = 1e-6;
    std::vector<double> dy = random_normal(rng, d.tok_count());
    std::vector<double> dsT = random_normal(rng, d.state_count());
    FdStats s = check_fd(d, dy, dsT, 1e-6, rng);
    MESSAGE("worst finite-difference disagreement " << s.worst);
    Rwkv7Grads gd = ref_backward(d, dy, dsT);

    // In the LOG form (w = log 1e-6) dL/dw = 1e-6 dL/d decay, below what a finite difference
    // of L resolves; check the chain rule against the direct form instead.
    Rwkv7Data l = d;
    l.form = WKV_DECAY_LOG;
    for (double& w : l.w) w = std::log(1e-6);
    Rwkv7Grads gl = ref_backward(l, dy, dsT);
    std::vector<double> chain(gd.dw.size());
    for (size_t i = 0; i < chain.size(); i++) chain[i] = gd.dw[i] * std::exp(l.w[i]);
    CHECK(rel_err(gl.dw, chain) <= 1e-12);
    CHECK(rel_err(gl.dr, gd.dr) <= 1e-12);
    CHECK(rel_err(gl.dk, gd.dk) <= 1e-12);
    CHECK(rel_err(gl.dv, gd.dv) <= 1e-12);
    CHECK(rel_err(gl.da, gd.da) <= 1e-12);
    CHECK(rel_err(gl.db, gd.db) <= 1e-12);
    CHECK(rel_err(gl.ds0, gd.ds0) <= 1e-12);
}
