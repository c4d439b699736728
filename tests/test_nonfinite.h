// The NaN/Inf policy check (wkv.h, NUMERICS: propagate, never invent), shared by every
// backend's suite: each op's inputs (every one of them, the state and the gradients coming in
// too) get a NaN, a +Inf or a -Inf at one element; the library's outputs, forward and backward,
// must agree with the float64 reference element by element:
//   - finite where the reference is finite, and there as accurate as without the bad value;
//   - a NaN input: NaN exactly where the reference is NaN;
//   - an infinite input: non-finite where the reference is infinite; where the reference gets
//     NaN out of an infinity (inf - inf, 0 * inf), anything (a backend may take the formula's
//     limit, or keep an infinity that another evaluation order turns into NaN).
// Header-only; builds on test_any_op.h.
#ifndef WKV_TESTS_TEST_NONFINITE_H
#define WKV_TESTS_TEST_NONFINITE_H

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "test_any_op.h"

namespace wkvtest {

struct NonfiniteCase {
    std::string name; // e.g. "rwkv7 k=nan"
    bool nan = false; // the bad value is a NaN (else an infinity)
    AnyProblem p;
    Arrays ref;
};

// The element that goes bad: sequence 0, token T/2, the last head, channel N/2 (per-channel
// inputs: that head and channel; states: that head, row N/2, column N/4).
inline size_t nonfinite_index(const AnyProblem& p, const std::string& name) {
    const std::vector<int64_t> s = any_shape(p, name);
    const bool r4 = p.op == WKV_OP_RWKV4;
    if (s.size() == 1) return static_cast<size_t>(p.N / 2);                         // RWKV-4 w, u
    if (s.size() == 2) return static_cast<size_t>((p.H - 1) * p.N + p.N / 2);      // RWKV-6 u
    if (name == "s0" || name == "dsT") {
        if (r4) return static_cast<size_t>(1 * p.N + p.N / 2);                     // bb of channel N/2
        return static_cast<size_t>(((p.H - 1) * p.N + p.N / 2) * p.N + p.N / 4);
    }
    if (r4) return static_cast<size_t>((p.T / 2) * p.N + p.N / 2);
    return static_cast<size_t>(((p.T / 2) * p.H + (p.H - 1)) * p.N + p.N / 2);
}

// Every (input, value) case of op: NaN, +Inf and -Inf in each input of the op, in s0, dy and
// dsT. RWKV-4's s0 gets NaN and +Inf in bb only (its pp = -Inf is the empty state, legal).
inline std::vector<NonfiniteCase> nonfinite_cases(uint64_t seed, wkv_op op, int64_t N) {
    Rng rng(seed);
    const AnyProblem base = any_random(rng, op, 2, 9, 2, N, op == WKV_OP_RWKV7 ? WKV_DECAY_CLAMPW : WKV_DECAY_EXP_NEG_EXP);
    std::vector<std::string> names = any_inputs(op);
    names.push_back("s0");
    names.push_back("dy");
    names.push_back("dsT");
    const double inf = std::numeric_limits<double>::infinity();
    const struct {
        const char* label;
        double value;
    } values[] = {{"nan", std::nan("")}, {"+inf", inf}, {"-inf", -inf}};
    std::vector<NonfiniteCase> out;
    for (const auto& name : names)
        for (const auto& v : values) {
            if (op == WKV_OP_RWKV4 && (name == "s0" || name == "dsT") && v.value < 0) continue;
            NonfiniteCase c;
            c.name = std::string(op_label(op)) + " " + name + "=" + v.label;
            c.nan = std::isnan(v.value);
            c.p = base;
            c.p.in.at(name)[nonfinite_index(base, name)] = v.value;
            c.ref = any_reference(c.p);
            out.push_back(std::move(c));
        }
    return out;
}

// "" when every output of c's run agrees with the reference as the policy says; otherwise the
// first disagreement (output, element, got, want) or the relative error over the finite
// elements when it exceeds tol.
inline std::string nonfinite_disagreement(const AnyRun& run, const NonfiniteCase& c, double tol) {
    const Arrays& ref = c.ref;
    std::ostringstream why;
    if (run.forward != WKV_OK || run.backward != WKV_OK) {
        why << "status " << (int)run.forward << "/" << (int)run.backward << ": " << run.forward_msg
            << run.backward_msg;
        return why.str();
    }
    for (const auto& kv : run.out) {
        const std::vector<double>& got = kv.second;
        const std::vector<double>& want = ref.at(kv.first);
        std::vector<double> g, w; // the finite part
        for (size_t i = 0; i < got.size(); ++i) {
            const bool bad = c.nan ? std::isnan(got[i]) != std::isnan(want[i]) ||
                                         std::isfinite(got[i]) != std::isfinite(want[i])
                                   : (std::isfinite(want[i]) && !std::isfinite(got[i])) ||
                                         (std::isinf(want[i]) && std::isfinite(got[i]));
            if (bad) {
                why << kv.first << "[" << i << "] = " << got[i] << ", the reference has " << want[i];
                return why.str();
            }
            if (std::isfinite(want[i])) {
                g.push_back(got[i]);
                w.push_back(want[i]);
            }
        }
        const double e = rel_err(g, w);
        if (!(e <= tol)) {
            why << kv.first << ": relative error " << e << " over its " << g.size() << " finite elements";
            return why.str();
        }
    }
    return "";
}

} // namespace wkvtest

#endif
