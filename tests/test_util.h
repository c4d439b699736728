// Small helpers shared by the tests: random numbers, host tensors with arbitrary strides and
// dtypes (with NaN poisoning), the per-token layouts the tests cycle through, norm-wise relative
// error, 16-bit rounding, reading the golden files (through tools/common/safetensors.h), and
// random RWKV-7 inputs drawn the way the golden files' README describes. Header-only; everything
// is `inline` so every test file may include it.
#ifndef WKV_TESTS_TEST_UTIL_H
#define WKV_TESTS_TEST_UTIL_H

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "golden.h"
#include "half.h"
#include "reference/wkv_reference.h"
#include "safetensors.h"
#include "wkv/wkv.h"

namespace wkvtest {

// ------------------------------------------------------------------------------ numbers

// A seeded generator. std::normal_distribution is implementation-defined, so a seed reproduces
// a run on the same standard library only; that is all the tests need.
struct Rng {
    std::mt19937_64 gen;
    explicit Rng(uint64_t seed) : gen(seed) {}
    double normal(double mean = 0.0, double stddev = 1.0) {
        return std::normal_distribution<double>(mean, stddev)(gen);
    }
    double uniform(double lo, double hi) {
        return std::uniform_real_distribution<double>(lo, hi)(gen);
    }
    int64_t integer(int64_t lo, int64_t hi) {  // inclusive
        return std::uniform_int_distribution<int64_t>(lo, hi)(gen);
    }
};

// A fresh seed per run, unless WKV_TEST_SEED fixes it. Print it in failure messages.
inline uint64_t test_seed() {
    if (const char* s = std::getenv("WKV_TEST_SEED"))
        if (*s) return std::strtoull(s, nullptr, 0);
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

// ||got - ref||_2 / ||ref||_2 over all elements (||got - ref||_2 when ref is all zeros).
// Any non-finite value in `got` gives +infinity, so NaN never passes a tolerance.
inline double rel_err(const double* got, const double* ref, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!std::isfinite(got[i])) return INFINITY;
        double d = got[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}
inline double rel_err(const std::vector<double>& got, const std::vector<double>& ref) {
    if (got.size() != ref.size()) return INFINITY;
    return rel_err(got.data(), ref.data(), got.size());
}

inline double rms(const std::vector<double>& x) {
    double s = 0.0;
    for (double v : x) s += v * v;
    return x.empty() ? 0.0 : std::sqrt(s / static_cast<double>(x.size()));
}

inline bool all_finite(const std::vector<double>& x) {
    for (double v : x)
        if (!std::isfinite(v)) return false;
    return true;
}

// Round to the nearest float16 / bfloat16 (through float32, as a caller's cast would).
inline double round_f16(double x) { return wkv_f16_to_f32(wkv_f32_to_f16(static_cast<float>(x))); }
inline double round_bf16(double x) { return wkv_bf16_to_f32(wkv_f32_to_bf16(static_cast<float>(x))); }
inline double round_f32(double x) { return static_cast<float>(x); }
inline double round_to(wkv_dtype dt, double x) {
    if (dt.bits == 16) return dt.code == WKV_DTYPE_CODE_BFLOAT ? round_bf16(x) : round_f16(x);
    if (dt.bits == 32) return round_f32(x);
    return x;
}
inline std::vector<double> rounded(wkv_dtype dt, std::vector<double> x) {
    for (double& v : x) v = round_to(dt, v);
    return x;
}

inline const char* dtype_name(wkv_dtype dt) {
    if (dt.bits == 16) return dt.code == WKV_DTYPE_CODE_BFLOAT ? "bf16" : "f16";
    return dt.bits == 32 ? "f32" : dt.bits == 64 ? "f64" : "?";
}

inline const char* form_name(wkv_decay_form f) {
    switch (f) {
    case WKV_DECAY_DIRECT: return "direct";
    case WKV_DECAY_LOG: return "log";
    case WKV_DECAY_EXP_NEG_EXP: return "exp_neg_exp";
    case WKV_DECAY_CLAMPW: return "clampw";
    default: return "?";
    }
}

// ------------------------------------------------------------------------------ tensors

// A host tensor of any dtype (f32, f16, bf16, f64) with arbitrary element strides, owning its
// storage. Logical values go in and out as float64 in row-major order of `shape`. Take the
// wkv_tensor with view() after the object has its final address (it points into it).
struct HostTensor {
    wkv_dtype dtype = WKV_DTYPE_F32;
    std::vector<int64_t> shape, strides;  // strides in elements
    bool contiguous = true;               // view() passes strides == NULL
    uint64_t offset_elems = 0;            // byte_offset = offset_elems * element size
    std::vector<unsigned char> buf;

    HostTensor() = default;

    // C-contiguous, storage exactly the tensor.
    HostTensor(wkv_dtype dt, std::vector<int64_t> shp) : dtype(dt), shape(std::move(shp)) {
        strides.assign(shape.size(), 1);
        for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
        buf.assign(static_cast<size_t>(numel()) * elem_size(), 0);
    }

    // Explicit strides (>= 0, in elements) and a leading offset, storage just large enough.
    HostTensor(wkv_dtype dt, std::vector<int64_t> shp, std::vector<int64_t> str, uint64_t off)
        : dtype(dt), shape(std::move(shp)), strides(std::move(str)), contiguous(false),
          offset_elems(off) {
        int64_t reach = 0;
        for (size_t d = 0; d < shape.size(); d++) reach += (shape[d] - 1) * strides[d];
        buf.assign(static_cast<size_t>(static_cast<int64_t>(off) + reach + 1) * elem_size(), 0);
    }

    size_t elem_size() const { return dtype.bits / 8u; }
    int64_t numel() const {
        int64_t n = 1;
        for (int64_t s : shape) n *= s;
        return n;
    }
    // Element offset (from buf start) of the logical element with row-major index `lin`.
    int64_t elem_offset(int64_t lin) const {
        int64_t off = static_cast<int64_t>(offset_elems);
        for (size_t d = shape.size(); d-- > 0;) {
            off += (lin % shape[d]) * strides[d];
            lin /= shape[d];
        }
        return off;
    }
    double load(int64_t e) const {
        const unsigned char* p = buf.data() + static_cast<size_t>(e) * elem_size();
        if (dtype.bits == 64) { double v; std::memcpy(&v, p, 8); return v; }
        if (dtype.bits == 32) { float v; std::memcpy(&v, p, 4); return v; }
        uint16_t h;
        std::memcpy(&h, p, 2);
        return dtype.code == WKV_DTYPE_CODE_BFLOAT ? wkv_bf16_to_f32(h) : wkv_f16_to_f32(h);
    }
    void store(int64_t e, double x) {
        unsigned char* p = buf.data() + static_cast<size_t>(e) * elem_size();
        if (dtype.bits == 64) { std::memcpy(p, &x, 8); return; }
        float f = static_cast<float>(x);
        if (dtype.bits == 32) { std::memcpy(p, &f, 4); return; }
        uint16_t h = dtype.code == WKV_DTYPE_CODE_BFLOAT ? wkv_f32_to_bf16(f) : wkv_f32_to_f16(f);
        std::memcpy(p, &h, 2);
    }
    // Writes logical values (row-major, numel of them), rounding to the dtype.
    void fill(const std::vector<double>& v) {
        for (int64_t i = 0; i < numel(); i++) store(elem_offset(i), v[static_cast<size_t>(i)]);
    }
    std::vector<double> read() const {
        std::vector<double> v(static_cast<size_t>(numel()));
        for (int64_t i = 0; i < numel(); i++) v[static_cast<size_t>(i)] = load(elem_offset(i));
        return v;
    }
    // Every byte of the storage (the tensor and any gaps around it) becomes NaN.
    void poison() {
        for (size_t e = 0; e < buf.size() / elem_size(); e++) store(static_cast<int64_t>(e), NAN);
    }
    wkv_tensor view() {
        wkv_tensor t = wkv_tensor_make(buf.data(), dtype, static_cast<int32_t>(shape.size()),
                                       shape.data());
        if (!contiguous) {
            t.strides = strides.data();
            t.byte_offset = offset_elems * elem_size();
        }
        return t;
    }
    // True when every storage element that is not part of the tensor is still NaN (an output
    // that was poisoned must not be written outside its view).
    bool gaps_still_nan() const {
        std::vector<char> inside(buf.size() / elem_size(), 0);
        for (int64_t i = 0; i < numel(); i++) inside[static_cast<size_t>(elem_offset(i))] = 1;
        for (size_t e = 0; e < inside.size(); e++)
            if (!inside[e] && !std::isnan(load(static_cast<int64_t>(e)))) return false;
        return true;
    }
};

// Permutes a row-major array of shape `shape` by axis permutation `perm` (out axis d = in axis
// perm[d]), e.g. perm {0,1,3,2} transposes the last two axes.
inline std::vector<double> permute(const std::vector<double>& x, const std::vector<int64_t>& shape,
                                   const std::vector<int>& perm) {
    const size_t nd = shape.size();
    std::vector<int64_t> in_str(nd, 1), out_shape(nd);
    for (size_t d = nd; d-- > 1;) in_str[d - 1] = in_str[d] * shape[d];
    for (size_t d = 0; d < nd; d++) out_shape[d] = shape[static_cast<size_t>(perm[d])];
    std::vector<double> out(x.size());
    for (size_t lin = 0; lin < x.size(); lin++) {
        int64_t rem = static_cast<int64_t>(lin), src = 0;
        for (size_t d = nd; d-- > 0;) {
            src += (rem % out_shape[d]) * in_str[static_cast<size_t>(perm[d])];
            rem /= out_shape[d];
        }
        out[lin] = x[static_cast<size_t>(src)];
    }
    return out;
}

// Fills an input: the whole storage NaN first (gaps must never be read), then the values.
inline void fill_input(HostTensor& t, const std::vector<double>& v) {
    t.poison();
    t.fill(v);
}

// How per-token tensors sit in memory.
enum class Layout {
    Contiguous,   // strides NULL
    PaddedT,      // inside a buffer twice as wide on T, byte_offset != 0
    Transposed,   // RWKV-6: memory [B,H,T,N]; RWKV-4: memory [B,C,T] (channel stride T)
    InnerStride,  // every element 2 apart (last stride 2), byte_offset != 0
};

inline const char* layout_name(Layout l) {
    switch (l) {
    case Layout::Contiguous: return "contiguous";
    case Layout::PaddedT: return "padded-T";
    case Layout::Transposed: return "transposed";
    default: return "inner-stride-2";
    }
}

// A per-token tensor [B,T,H,N] (H = 0: [B,T,N], RWKV-4) in `l`; `broadcast_t`: T-stride 0.
inline HostTensor token_tensor(wkv_dtype dt, int64_t B, int64_t T, int64_t H, int64_t N,
                               Layout l, bool broadcast_t = false) {
    if (H == 0) {  // [B,T,C]
        const int64_t C = N;
        std::vector<int64_t> shape = {B, T, C};
        if (broadcast_t) return HostTensor(dt, shape, {C, 0, 1}, 1);
        switch (l) {
        case Layout::PaddedT: return HostTensor(dt, shape, {T * 2 * C, 2 * C, 1}, 3);
        case Layout::Transposed: return HostTensor(dt, shape, {C * T, 1, T}, 0);
        case Layout::InnerStride: return HostTensor(dt, shape, {2 * T * C, 2 * C, 2}, 1);
        default: return HostTensor(dt, shape);
        }
    }
    std::vector<int64_t> shape = {B, T, H, N};
    if (broadcast_t) return HostTensor(dt, shape, {H * N, 0, N, 1}, 1);
    switch (l) {
    case Layout::PaddedT: return HostTensor(dt, shape, {T * 2 * H * N, 2 * H * N, N, 1}, 3);
    case Layout::Transposed: return HostTensor(dt, shape, {H * T * N, N, T * N, 1}, 0);
    case Layout::InnerStride: return HostTensor(dt, shape, {2 * T * H * N, 2 * H * N, 2 * N, 2}, 1);
    default: return HostTensor(dt, shape);
    }
}

// ------------------------------------------------------------------------------ safetensors

// The float tensors (as float64) and the metadata of a safetensors file, read with
// tools/common/safetensors.h.
struct SafeTensors {
    struct Entry {
        std::vector<int64_t> shape;
        std::vector<double> data;
    };
    std::map<std::string, Entry> tensors;
    std::map<std::string, std::string> metadata;
    std::string error;

    bool has(const std::string& name) const { return tensors.count(name) != 0; }
    const std::vector<double>& at(const std::string& name) const { return tensors.at(name).data; }
    std::string meta(const std::string& key) const {
        auto it = metadata.find(key);
        return it == metadata.end() ? std::string() : it->second;
    }

    bool load(const std::string& path) {
        char err[256] = "";
        st_file* f = st_open(path.c_str(), err, sizeof err);
        if (!f) {
            error = err;
            return false;
        }
        for (size_t i = 0; i < st_count(f); i++) {
            const st_tensor* t = st_at(f, i);
            if (!st_dtype_is_float(t->dtype)) continue;
            Entry e;
            e.shape.assign(t->shape, t->shape + t->ndim);
            e.data.resize(static_cast<size_t>(t->numel));
            st_tensor_to_f64(t, e.data.data());
            tensors[t->name] = std::move(e);
        }
        for (size_t i = 0; i < st_meta_count(f); i++) {
            const char *k = nullptr, *v = nullptr;
            if (st_meta_at(f, i, &k, &v)) metadata[k] = v;
        }
        st_close(f);
        return true;
    }
};

// The golden files' directory: $WKV_GOLDEN_DIR, else the build's default.
inline std::string golden_dir() { return wkv_golden_dir(); }

// The golden files whose names start with `prefix` (e.g. "wkv7_"), sorted; paths.
inline std::vector<std::string> golden_files(const std::string& prefix) {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(golden_dir(), ec)) {
        const std::string name = e.path().filename().string();
        if (name.rfind(prefix, 0) == 0 && e.path().extension() == ".safetensors")
            out.push_back(e.path().string());
    }
    std::sort(out.begin(), out.end());
    return out;
}

// ------------------------------------------------------------------------------ RWKV-7 data

// A float64 RWKV-7 problem: contiguous [B,T,H,N] inputs, optional s0 [B,H,N,N] (empty = none).
struct Rwkv7Data {
    int64_t B = 0, T = 0, H = 0, N = 0;
    wkv_decay_form form = WKV_DECAY_CLAMPW;
    std::vector<double> r, w, k, v, a, b, s0;

    size_t tok_count() const { return static_cast<size_t>(B * T * H * N); }
    size_t state_count() const { return static_cast<size_t>(B * H * N * N); }
    std::vector<int64_t> tok_shape() const { return {B, T, H, N}; }
    std::vector<int64_t> state_shape() const { return {B, H, N, N}; }
    // The six per-token inputs in API order r, w, k, v, a, b.
    std::vector<std::vector<double>*> inputs() { return {&r, &w, &k, &v, &a, &b}; }

    wkv_ref_rwkv7 ref() const {
        wkv_ref_rwkv7 in;
        in.B = B; in.T = T; in.H = H; in.N = N;
        in.decay_form = form;
        in.r = r.data(); in.w = w.data(); in.k = k.data();
        in.v = v.data(); in.a = a.data(); in.b = b.data();
        in.s0 = s0.empty() ? nullptr : s0.data();
        return in;
    }
};

struct Rwkv7Grads {
    std::vector<double> dr, dw, dk, dv, da, db, ds0;
};

inline void ref_forward(const Rwkv7Data& d, std::vector<double>& y, std::vector<double>& sT) {
    y.assign(d.tok_count(), 0.0);
    sT.assign(d.state_count(), 0.0);
    wkv_ref_rwkv7 in = d.ref();
    wkv_ref_rwkv7_forward(&in, y.data(), sT.data());
}

// dsT empty = zero.
inline Rwkv7Grads ref_backward(const Rwkv7Data& d, const std::vector<double>& dy,
                               const std::vector<double>& dsT) {
    Rwkv7Grads g;
    for (auto* x : {&g.dr, &g.dw, &g.dk, &g.dv, &g.da, &g.db}) x->assign(d.tok_count(), 0.0);
    g.ds0.assign(d.state_count(), 0.0);
    wkv_ref_rwkv7 in = d.ref();
    wkv_ref_rwkv7_backward(&in, dy.data(), dsT.empty() ? nullptr : dsT.data(), g.dr.data(),
                           g.dw.data(), g.dk.data(), g.dv.data(), g.da.data(), g.db.data(),
                           g.ds0.data());
    return g;
}

// w such that wkv_ref_decay(form, w) == decay, for decay in (0, 1).
inline double w_for_decay(wkv_decay_form form, double decay) {
    switch (form) {
    case WKV_DECAY_DIRECT: return decay;
    case WKV_DECAY_LOG: return std::log(decay);
    case WKV_DECAY_EXP_NEG_EXP: return std::log(-std::log(decay));
    case WKV_DECAY_CLAMPW: {  // decay = exp(-c s(w)): s = -log(decay)/c, w = logit(s)
        double s = -std::log(decay) / std::exp(-0.5);
        return std::log(s / (1.0 - s));
    }
    default: return NAN;
    }
}

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Random RWKV-7 inputs as the golden README draws them: r, k, v ~ N(0, 0.5^2);
// kk = normalize(N(0,1)) per (b,t,h), iclr = sigmoid(1.5 N(0,1) - 0.2), a = -kk, b = kk iclr;
// z = per-channel offset (each head a permutation of linspace(-5, 3, N)) + N(0,1),
// decay = exp(-e^-0.5 sigmoid(z)) in (0.545, 1), w = that decay in `form` (clampw: w = z).
// With `with_s0`, s0 is the state after a random `prefix`-token run from zero.
inline Rwkv7Data random_rwkv7(Rng& rng, int64_t B, int64_t T, int64_t H, int64_t N,
                              wkv_decay_form form, bool with_s0, int64_t prefix = 8) {
    Rwkv7Data d;
    d.B = B; d.T = T; d.H = H; d.N = N; d.form = form;
    const size_t n = d.tok_count();
    for (auto* x : d.inputs()) x->assign(n, 0.0);
    std::vector<double> offset(static_cast<size_t>(H * N));
    for (int64_t h = 0; h < H; h++) {
        std::vector<double> lin(static_cast<size_t>(N));
        for (int64_t j = 0; j < N; j++)
            lin[static_cast<size_t>(j)] = N == 1 ? -5.0 : -5.0 + 8.0 * static_cast<double>(j) / static_cast<double>(N - 1);
        std::shuffle(lin.begin(), lin.end(), rng.gen);
        std::copy(lin.begin(), lin.end(), offset.begin() + h * N);
    }
    for (int64_t bt = 0; bt < B * T; bt++) {
        for (int64_t h = 0; h < H; h++) {
            const size_t o = static_cast<size_t>((bt * H + h) * N);
            double norm = 0.0;
            std::vector<double> kk(static_cast<size_t>(N));
            for (auto& x : kk) { x = rng.normal(); norm += x * x; }
            norm = std::max(std::sqrt(norm), 1e-12);
            for (int64_t j = 0; j < N; j++) {
                const size_t e = o + static_cast<size_t>(j);
                d.r[e] = rng.normal(0.0, 0.5);
                d.k[e] = rng.normal(0.0, 0.5);
                d.v[e] = rng.normal(0.0, 0.5);
                double kkj = kk[static_cast<size_t>(j)] / norm;
                double iclr = sigmoid(1.5 * rng.normal() - 0.2);
                d.a[e] = -kkj;
                d.b[e] = kkj * iclr;
                double z = offset[static_cast<size_t>(h * N + j)] + rng.normal();
                d.w[e] = form == WKV_DECAY_CLAMPW
                             ? z
                             : w_for_decay(form, std::exp(-std::exp(-0.5) * sigmoid(z)));
            }
        }
    }
    if (with_s0) {
        Rwkv7Data pre = random_rwkv7(rng, B, prefix, H, N, form, false);
        std::vector<double> y;
        ref_forward(pre, y, d.s0);
    }
    return d;
}

inline std::vector<double> random_normal(Rng& rng, size_t n, double stddev = 1.0) {
    std::vector<double> x(n);
    for (double& v : x) v = rng.normal(0.0, stddev);
    return x;
}

}  // namespace wkvtest

#endif  // WKV_TESTS_TEST_UTIL_H
