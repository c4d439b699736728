// Helpers for the RWKV-6/5 and RWKV-4 tests (tests/test_rwkv6.cpp, tests/test_rwkv4.cpp): the
// float64 problems and their reference runs, random inputs drawn the way the golden files'
// README describes, packed-sequence slicing, a CPU context and NaN-poisoned workspaces; and for
// every op's random-input runner (RWKV-7's too) the checked public-API calls; for every backend's
// suite, the golden files through the golden checker.
// Header-only (everything inline); builds on test_util.h.
#ifndef WKV_TESTS_TEST_UTIL_OPS_H
#define WKV_TESTS_TEST_UTIL_OPS_H

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <numeric>
#include <string>
#include <vector>

#include "wkv_doctest.h"

#include "golden.h"
#include "test_util.h"

namespace wkvtest {

// ------------------------------------------------------------------------------ RWKV-6

// A float64 RWKV-6 problem: contiguous r w k v [B,T,H,N], u [H,N], s0 [B,H,N,N] (empty = none).
struct Rwkv6Data {
    int64_t B = 0, T = 0, H = 0, N = 0;
    wkv_decay_form form = WKV_DECAY_EXP_NEG_EXP;
    std::vector<double> r, w, k, v, u, s0;

    size_t tok_count() const { return static_cast<size_t>(B * T * H * N); }
    size_t state_count() const { return static_cast<size_t>(B * H * N * N); }
    // The per-token inputs in API order r, w, k, v.
    std::vector<std::vector<double>*> tokens() { return {&r, &w, &k, &v}; }

    wkv_ref_rwkv6 ref() const {
        wkv_ref_rwkv6 in;
        in.B = B; in.T = T; in.H = H; in.N = N;
        in.decay_form = form;
        in.r = r.data(); in.w = w.data(); in.k = k.data(); in.v = v.data();
        in.u = u.data();
        in.s0 = s0.empty() ? nullptr : s0.data();
        return in;
    }
};

struct Rwkv6Grads {
    std::vector<double> dr, dw, dk, dv, du, ds0;
};

inline void ref6_forward(const Rwkv6Data& d, std::vector<double>& y, std::vector<double>& sT) {
    y.assign(d.tok_count(), 0.0);
    sT.assign(d.state_count(), 0.0);
    wkv_ref_rwkv6 in = d.ref();
    wkv_ref_rwkv6_forward(&in, y.data(), sT.data());
}

// dsT empty = zero.
inline Rwkv6Grads ref6_backward(const Rwkv6Data& d, const std::vector<double>& dy,
                                const std::vector<double>& dsT) {
    Rwkv6Grads g;
    for (auto* x : {&g.dr, &g.dw, &g.dk, &g.dv}) x->assign(d.tok_count(), 0.0);
    g.du.assign(static_cast<size_t>(d.H * d.N), 0.0);
    g.ds0.assign(d.state_count(), 0.0);
    wkv_ref_rwkv6 in = d.ref();
    wkv_ref_rwkv6_backward(&in, dy.data(), dsT.empty() ? nullptr : dsT.data(), g.dr.data(),
                           g.dw.data(), g.dk.data(), g.dv.data(), g.du.data(), g.ds0.data());
    return g;
}

// Random RWKV-6 inputs as the golden README draws them: r, k, v ~ N(0, 0.5^2), u ~ N(0, 0.5^2);
// w_raw = per-channel offset (each head a permutation of linspace(lo, hi, N)) + 0.5 N(0,1),
// decay = exp(-exp(w_raw)) (lo = -6, hi = 1: decays from ~1e-6 to 0.999), w = that decay in
// `form` (CLAMPW, which cannot go below 0.545: w = linspace(-5, 3) offsets + N(0,1), as RWKV-7). With `w_constant_t`, w does not change over t (RWKV-5). With `with_s0`, s0 is the
// state after a random `prefix`-token run from zero.
inline Rwkv6Data random_rwkv6(Rng& rng, int64_t B, int64_t T, int64_t H, int64_t N,
                              wkv_decay_form form, bool with_s0, bool w_constant_t = false,
                              double lo = -6.0, double hi = 1.0, int64_t prefix = 8) {
    Rwkv6Data d;
    d.B = B; d.T = T; d.H = H; d.N = N;
    d.form = form;
    const size_t n = d.tok_count();
    for (auto* x : {&d.r, &d.w, &d.k, &d.v}) x->assign(n, 0.0);
    d.u.assign(static_cast<size_t>(H * N), 0.0);
    std::vector<double> offset(static_cast<size_t>(H * N));
    for (int64_t h = 0; h < H; h++) {
        std::vector<int64_t> perm(static_cast<size_t>(N));
        std::iota(perm.begin(), perm.end(), int64_t(0));
        std::shuffle(perm.begin(), perm.end(), rng.gen);
        for (int64_t j = 0; j < N; j++)
            offset[static_cast<size_t>(h * N + j)] =
                N == 1 ? 0.5 * (lo + hi)
                       : lo + (hi - lo) * static_cast<double>(perm[static_cast<size_t>(j)]) /
                                  static_cast<double>(N - 1);
    }
    for (double& x : d.u) x = rng.normal(0.0, 0.5);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t j = 0; j < N; j++) {
                    const size_t e = static_cast<size_t>(((b * T + t) * H + h) * N + j);
                    d.r[e] = rng.normal(0.0, 0.5);
                    d.k[e] = rng.normal(0.0, 0.5);
                    d.v[e] = rng.normal(0.0, 0.5);
                    if (w_constant_t && t > 0) {
                        d.w[e] = d.w[static_cast<size_t>(((b * T) * H + h) * N + j)];
                        continue;
                    }
                    const double raw = offset[static_cast<size_t>(h * N + j)] + 0.5 * rng.normal();
                    if (form == WKV_DECAY_CLAMPW)  // reaches (0.545, 1) only: the RWKV-7 draw
                        d.w[e] = -5.0 + 8.0 * (raw - lo) / (hi - lo) + rng.normal();
                    else
                        d.w[e] = form == WKV_DECAY_EXP_NEG_EXP
                                     ? raw
                                     : w_for_decay(form, std::exp(-std::exp(raw)));
                }
    if (with_s0) {
        Rwkv6Data pre = random_rwkv6(rng, B, prefix, H, N, form, false, false, lo, hi);
        pre.u = d.u;
        std::vector<double> y;
        ref6_forward(pre, y, d.s0);
    }
    return d;
}

// ------------------------------------------------------------------------------ RWKV-4

// A float64 RWKV-4 problem: w, u [C]; k, v [B,T,C]; s0 [B,3,C] planar (aa, bb, pp), empty =
// none (aa = bb = 0, pp = -1e38).
struct Rwkv4Data {
    int64_t B = 0, T = 0, C = 0;
    std::vector<double> w, u, k, v, s0;

    size_t tok_count() const { return static_cast<size_t>(B * T * C); }
    size_t state_count() const { return static_cast<size_t>(B * 3 * C); }

    wkv_ref_rwkv4 ref() const {
        wkv_ref_rwkv4 in;
        in.B = B; in.T = T; in.C = C;
        in.w = w.data(); in.u = u.data(); in.k = k.data(); in.v = v.data();
        in.s0 = s0.empty() ? nullptr : s0.data();
        return in;
    }
};

struct Rwkv4Grads {
    std::vector<double> dw, du, dk, dv, ds0;
};

inline void ref4_forward(const Rwkv4Data& d, std::vector<double>& y, std::vector<double>& sT) {
    y.assign(d.tok_count(), 0.0);
    sT.assign(d.state_count(), 0.0);
    wkv_ref_rwkv4 in = d.ref();
    wkv_ref_rwkv4_forward(&in, y.data(), sT.data());
}

inline Rwkv4Grads ref4_backward(const Rwkv4Data& d, const std::vector<double>& dy,
                                const std::vector<double>& dsT) {
    Rwkv4Grads g;
    g.dw.assign(static_cast<size_t>(d.C), 0.0);
    g.du.assign(static_cast<size_t>(d.C), 0.0);
    g.dk.assign(d.tok_count(), 0.0);
    g.dv.assign(d.tok_count(), 0.0);
    g.ds0.assign(d.state_count(), 0.0);
    wkv_ref_rwkv4 in = d.ref();
    wkv_ref_rwkv4_backward(&in, dy.data(), dsT.empty() ? nullptr : dsT.data(), g.dw.data(),
                           g.du.data(), g.dk.data(), g.dv.data(), g.ds0.data());
    return g;
}

// Random RWKV-4 inputs as the golden README draws them: w = permuted linspace(-5, 3, C) +
// 0.3 N(0,1); u = log 0.3 + 0.5 N(0,1); k ~ N(0, k_std^2); v ~ N(0, 0.5^2). With `with_s0`, s0
// is the state after a `prefix`-token run from the empty state.
inline Rwkv4Data random_rwkv4(Rng& rng, int64_t B, int64_t T, int64_t C, double k_std,
                              bool with_s0, int64_t prefix = 16) {
    Rwkv4Data d;
    d.B = B; d.T = T; d.C = C;
    std::vector<int64_t> perm(static_cast<size_t>(C));
    std::iota(perm.begin(), perm.end(), int64_t(0));
    std::shuffle(perm.begin(), perm.end(), rng.gen);
    d.w.resize(static_cast<size_t>(C));
    d.u.resize(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; c++) {
        const double lin = C == 1 ? -1.0 : -5.0 + 8.0 * static_cast<double>(perm[static_cast<size_t>(c)]) /
                                                     static_cast<double>(C - 1);
        d.w[static_cast<size_t>(c)] = lin + 0.3 * rng.normal();
        d.u[static_cast<size_t>(c)] = std::log(0.3) + 0.5 * rng.normal();
    }
    d.k = random_normal(rng, d.tok_count(), k_std);
    d.v = random_normal(rng, d.tok_count(), 0.5);
    if (with_s0) {
        Rwkv4Data pre = d;
        pre.T = prefix;
        pre.k = random_normal(rng, pre.tok_count(), k_std);
        pre.v = random_normal(rng, pre.tok_count(), 0.5);
        pre.s0.clear();
        std::vector<double> y;
        ref4_forward(pre, y, d.s0);
    }
    return d;
}

// ------------------------------------------------------------------------------ slicing

inline std::vector<double> slice(const std::vector<double>& x, size_t begin, size_t end) {
    return std::vector<double>(x.begin() + static_cast<std::ptrdiff_t>(begin),
                               x.begin() + static_cast<std::ptrdiff_t>(end));
}

inline void put(std::vector<double>& dst, const std::vector<double>& src, size_t at) {
    std::copy(src.begin(), src.end(), dst.begin() + static_cast<std::ptrdiff_t>(at));
}

// Packed sequence offsets for B = 1: `lens` in order (zeros allowed), 0 .. total.
inline std::vector<int64_t> offsets_of(const std::vector<int64_t>& lens) {
    std::vector<int64_t> off(1, 0);
    for (int64_t l : lens) off.push_back(off.back() + l);
    return off;
}

// ------------------------------------------------------------------------------ library

// A CPU context with `threads` threads, or (parallel_for != NULL) on a host job system.
struct CpuCtx {
    wkv_context* ctx = nullptr;
    wkv_status status = WKV_OK;
    explicit CpuCtx(int threads, wkv_parallel_for_fn pf = nullptr, void* user = nullptr) {
        wkv_context_options o{};
        o.struct_size = sizeof o;
        o.backend = WKV_BACKEND_CPU;
        o.cpu_threads = threads;
        o.parallel_for = pf;
        o.parallel_for_user_data = user;
        status = wkv_context_create(&o, &ctx);
    }
    ~CpuCtx() { wkv_context_destroy(ctx); }
    CpuCtx(const CpuCtx&) = delete;
    CpuCtx& operator=(const CpuCtx&) = delete;
};

// One broken call on a fresh one-thread CPU context: status, a message naming the argument
// (needle), and no output touched. Fx is a test file's fixture: a valid forward desc f and
// backward desc g, a workspace vector, outputs_untouched(); breakit breaks one thing.
template <class Fx, class Break>
void expect_call_fails(bool backward, const std::string& what, wkv_status want, const char* needle,
                       const Break& breakit) {
    CAPTURE(what);
    CpuCtx c(1);
    Fx fx;
    if (backward) {
        size_t bytes = 0;
        REQUIRE(wkv_workspace_size(c.ctx, &bytes, &fx.g) == WKV_OK);
        fx.workspace.assign(bytes + 1, 0);
        fx.g.workspace = fx.workspace.data();
        fx.g.workspace_size = bytes;
    }
    breakit(fx);
    const wkv_status got = backward ? wkv_backward(c.ctx, &fx.g) : wkv_forward(c.ctx, &fx.f);
    const std::string msg = wkv_last_error(c.ctx);
    CAPTURE(msg);
    CHECK(std::string(wkv_status_string(got)) == wkv_status_string(want));
    CHECK(msg.find(needle) != std::string::npos);
    CHECK(fx.outputs_untouched());
}

// A host job system that runs the range in reverse, one index at a time: results must not
// depend on how the work is split or ordered.
inline void reverse_parallel_for(void*, int64_t n, wkv_task_fn fn, void* data) {
    for (int64_t i = n - 1; i >= 0; i--) fn(data, i, i + 1);
}

inline bool all_nan(const HostTensor& t) {
    for (size_t e = 0; e < t.buf.size() / t.elem_size(); ++e)
        if (!std::isnan(t.load(static_cast<int64_t>(e)))) return false;
    return true;
}

// A workspace of `bytes` bytes filled with 0xff (a NaN in every float format), with 256 guard
// bytes after it that must come back untouched.
struct Workspace {
    std::vector<unsigned char> buf;
    size_t bytes = 0;
    explicit Workspace(size_t n) : buf(n + 256, 0xff), bytes(n) {}
    void* data() { return bytes ? buf.data() : nullptr; }
    bool guard_intact() const {
        for (size_t i = bytes; i < buf.size(); i++)
            if (buf[i] != 0xff) return false;
        return true;
    }
};

// ------------------------------------------------------------------------------ checked calls
// What every op's random-input runner checks around its public-API calls (test_rwkv4.cpp,
// test_rwkv6.cpp, test_rwkv7_random.cpp).

// Tensors a call must leave as they were: their bytes now, compared after the call.
class Unchanged {
  public:
    void add(const HostTensor& t, std::string name) { items_.push_back({&t, t.buf, std::move(name)}); }
    void check(const char* call) const {
        for (const Item& i : items_) CHECK_MESSAGE(i.t->buf == i.bytes, i.name << " was modified by the " << call);
    }

  private:
    struct Item {
        const HostTensor* t;
        std::vector<unsigned char> bytes;
        std::string name;
    };
    std::vector<Item> items_;
};

// wkv_forward must succeed (the library's message is shown when it does not).
inline void forward_ok(wkv_context* ctx, const wkv_forward_desc& f) {
    const wkv_status st = wkv_forward(ctx, &f);
    INFO("wkv_forward: " << std::string(wkv_last_error(ctx)));
    REQUIRE(st == WKV_OK);
}

// wkv_backward with a workspace of exactly wkv_workspace_size() bytes (NaN-filled), which must
// succeed and write nothing past those bytes.
inline void backward_ok(wkv_context* ctx, wkv_backward_desc& bd) {
    size_t bytes = 0;
    wkv_status st = wkv_workspace_size(ctx, &bytes, &bd);
    {
        INFO("wkv_workspace_size: " << std::string(wkv_last_error(ctx)));
        REQUIRE(st == WKV_OK);
    }
    Workspace ws(bytes);
    bd.workspace = ws.data();
    bd.workspace_size = bytes;
    st = wkv_backward(ctx, &bd);
    {
        INFO("wkv_backward: " << std::string(wkv_last_error(ctx)));
        REQUIRE(st == WKV_OK);
    }
    CHECK_MESSAGE(ws.guard_intact(), "the backward wrote past wkv_workspace_size() bytes");
    bd.workspace = nullptr;
}

// An output after its call: the gaps of a strided tensor must still be NaN; its bytes join `raw`
// (every output, for the bitwise comparisons between runs); returns its values.
inline std::vector<double> read_output(const HostTensor& t, std::vector<std::vector<unsigned char>>& raw) {
    CHECK(t.gaps_still_nan());
    raw.push_back(t.buf);
    return t.read();
}

// ------------------------------------------------------------------------------ workspace formulas
// What the CPU backward's documented workspace formulas take from a problem (each op's
// "wkv_workspace_size is the documented formula" test).

inline uint64_t a64(uint64_t x) { return (x + 63) / 64 * 64; }

// The sequences of a test shape: B sequences of T tokens, or `lens` packed (then B = 1).
struct SeqSpan {
    int64_t num_seqs = 0;
    std::vector<int64_t> offsets; // for wkv_forward_desc.seq_offsets; empty when not packed
    uint64_t segments = 0;        // G = sum over sequences of ceil(L_s / 32)
    int64_t longest = 0;          // the longest L_s
    uint64_t packed_bytes = 0;    // the packed offsets' prefix sums: A64(8 (num_seqs + 1)), or 0
};

inline SeqSpan seq_span(int64_t B, int64_t T, const std::vector<int64_t>& lens) {
    SeqSpan x;
    x.num_seqs = lens.empty() ? B : static_cast<int64_t>(lens.size());
    if (!lens.empty()) {
        x.offsets = offsets_of(lens);
        x.packed_bytes = a64(8 * (static_cast<uint64_t>(x.num_seqs) + 1));
    }
    for (int64_t q = 0; q < x.num_seqs; q++) {
        const int64_t len = lens.empty() ? T : lens[static_cast<size_t>(q)];
        x.segments += static_cast<uint64_t>((len + 31) / 32);
        x.longest = std::max(x.longest, len);
    }
    return x;
}

// A shape of the RWKV-6 / RWKV-7 workspace-formula tests: B sequences of T tokens (or `lens`
// packed, B = 1) of H heads of size N, on `threads` threads.
struct HeadsShape {
    int64_t B, T, H, N;
    std::vector<int64_t> lens;
    int threads;
};

// The shapes both ops check: odd N, packed sequences with empty ones, more threads than items.
inline std::vector<HeadsShape> heads_workspace_shapes() {
    return {{1, 1, 1, 1, {}, 1},   {2, 37, 3, 64, {}, 2},          {3, 32, 2, 7, {}, 16},
            {1, 33, 1, 5, {}, 1},  {1, 46, 2, 7, {5, 0, 40, 1}, 3}, {1, 3, 4, 3, {0, 3, 0}, 2},
            {1, 70, 9, 32, {}, 1}, {2, 5, 6, 16, {}, 3},           {1, 46, 5, 64, {5, 0, 40, 1}, 2},
            {1, 3, 2, 32, {0, 3, 0}, 1}};
}

// Floats per vector of a CPU path (0: the scalar path).
inline uint64_t isa_width(const std::string& isa) {
    return isa == "avx2" ? 8 : isa == "avx512" ? 16 : isa == "neon" ? 4 : 0;
}

// Heads per backward item on the vector paths (simd_common.inl's backward_head_group): up to
// `most`, but enough items for every thread.
inline uint64_t backward_heads(uint64_t H, uint64_t num_seqs, uint64_t threads, uint64_t most) {
    const uint64_t per_seq = (threads + num_seqs - 1) / num_seqs;
    const uint64_t want = per_seq > 1 ? (H + per_seq - 1) / per_seq : H;
    return std::max<uint64_t>(1, std::min(want, most));
}

// Tolerances (norm-wise relative error): float32 everywhere, or any 16-bit tensor involved.
constexpr double kTolF32 = 1e-5;
constexpr double kTol16Forward = 5e-3;
constexpr double kTol16Grad = 1e-2;

// A rare draw is so ill-conditioned that no float32 evaluation gets within 1e-5 (a tiny tensor
// that is one cancelling dot product, e.g. du = r k (dy . v) at T = 1). `sensitivity` is how
// far the float64 reference moves (norm-wise, relatively) when every input is multiplied by
// (1 + 2^-23 U(-1, 1)), a float32 rounding's worth of noise; the tolerance is `base`, or 64x
// that sensitivity when larger, never above 1e-2.
inline double cond_tol(double base, double sensitivity) {
    return std::max(base, std::min(1e-2, 64.0 * sensitivity));
}

// Multiplies every value by (1 + 2^-23 U(-1, 1)).
inline void perturb(Rng& rng, std::vector<double>& x) {
    const double ulp = std::ldexp(1.0, -23);
    for (double& v : x) v *= 1.0 + ulp * rng.uniform(-1.0, 1.0);
}

// ------------------------------------------------------------------------------ golden files

// Every golden file whose name starts with one of `prefixes`, in f32, f16 and bf16, through the
// golden checker on `backend` (the checker of `wkv-bench golden`): each run must PASS. Returns
// the number of (file, dtype) runs, so the caller can demand that the files were there.
inline int check_golden_files(wkv_backend backend, std::initializer_list<const char*> prefixes) {
    int ran = 0;
    for (const char* prefix : prefixes) {
        for (const std::string& path : golden_files(prefix)) {
            for (wkv_dtype dt : {WKV_DTYPE_F32, WKV_DTYPE_F16, WKV_DTYPE_BF16}) {
                wkv_golden_result r{};
                wkv_golden_run(path.c_str(), backend, dt, &r);
                char line[1024];
                wkv_golden_format(&r, line, sizeof line);
                INFO(path << " " << dtype_name(dt) << ": " << line);
                CHECK(r.status == WKV_GOLDEN_PASS);
                ++ran;
            }
        }
    }
    return ran;
}

}  // namespace wkvtest

#endif  // WKV_TESTS_TEST_UTIL_OPS_H
