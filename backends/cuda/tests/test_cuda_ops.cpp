// RWKV-6/5 and RWKV-4 on the CUDA backend (part of wkv_cuda_tests):
//   - every golden wkv6_* / wkv4_* file through the golden checker (tools/common/golden.c) on
//     CUDA in f32/f16/bf16, RWKV-6 with value- and key-major states;
//   - random inputs against the CPU backend (the same host bytes to both): T in {1, 17, 100},
//     N in {32, 64, 128}, every decay form, every dtype and a mix, strided layouts, RWKV-5
//     (w with a T-stride of 0), state options and orders (key-major, RWKV-4 interleaved,
//     padded, in place), packed sequences with an empty one, RWKV-4 with k ~ N(0, 20^2);
//     tensors in device memory and in host memory (the staging path);
//   - determinism: two device runs are bit-identical.
// Every output is NaN-poisoned before each call. Without a CUDA device every case skips.
#include "wkv_doctest.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <memory>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "golden.h"
#include "test_util_ops.h"

using namespace wkvtest;

namespace {

// ------------------------------------------------------------------------------ golden files

TEST_CASE("cuda: every golden wkv6/wkv4 file, f32/f16/bf16, both state orders") {
    CUDA_TEST_OR_SKIP();
    const std::string dir = golden_dir();
    for (const char* name : {"wkv6_log_N64", "wkv6_exp_neg_exp_N64", "wkv4_C96", "wkv4_C96_largek"}) {
        const std::string path = dir + "/" + name + ".safetensors";
        const bool r6 = name[3] == '6';
        for (wkv_dtype dt : {WKV_DTYPE_F32, WKV_DTYPE_F16, WKV_DTYPE_BF16})
            for (int km = 0; km < (r6 ? 2 : 1); km++) {
                wkv_golden_options o{};
                o.backend = WKV_BACKEND_CUDA;
                o.dtype = dt;
                o.state_key_major = km;
                wkv_golden_result r{};
                wkv_golden_run_ex(path.c_str(), &o, &r);
                char line[768];
                wkv_golden_format(&r, line, sizeof line);
                std::ostringstream os;
                os << "golden " << (r.status == WKV_GOLDEN_PASS ? "PASS " : "FAIL ") << name
                   << ".safetensors " << dtype_name(dt) << (km ? " key-major" : " value-major")
                   << " max_rel_err=" << std::scientific << std::setprecision(2) << r.max_rel_err
                   << " (" << r.worst << ")";
                MESSAGE(os.str());
                CHECK_MESSAGE(r.status == WKV_GOLDEN_PASS, path << ": " << line);
            }
    }
}

// ------------------------------------------------------------------------------ the runner

struct Cfg {
    wkv_op op = WKV_OP_RWKV6;
    int64_t B = 2, T = 17, H = 2, N = 64; // RWKV-4: C = N (H unused)
    wkv_decay_form form = WKV_DECAY_EXP_NEG_EXP;
    wkv_dtype dtype = WKV_DTYPE_F32;
    bool mixed = false;
    bool state_in = true, state_out = true, dstate_out = true, dstate_in = true;
    Layout layout = Layout::Contiguous;
    bool rwkv5 = false, padded_state = false, key_major = false, interleaved = false, in_place = false;
    double k_std = 0.5;

    wkv_dtype dtype_of(int role) const {
        static const wkv_dtype rot[3] = {WKV_DTYPE_F32, WKV_DTYPE_BF16, WKV_DTYPE_F16};
        return mixed ? rot[role % 3] : dtype;
    }
    bool r4() const { return op == WKV_OP_RWKV4; }
    std::string describe() const {
        std::ostringstream s;
        s << (r4() ? "RWKV-4" : "RWKV-6") << " B=" << B << " T=" << T << " H=" << H << " N/C=" << N
          << " form=" << form_name(form) << " dtype=" << (mixed ? "mixed" : dtype_name(dtype))
          << " states=" << state_in << state_out << dstate_out << dstate_in
          << " layout=" << layout_name(layout) << " rwkv5=" << rwkv5 << " padded_state=" << padded_state
          << " key_major=" << key_major << " interleaved=" << interleaved << " in_place=" << in_place
          << " k_std=" << k_std;
        return s.str();
    }
};

// The problem's values (float64, planar states; rounded by the tensors they are stored in).
struct Data {
    std::vector<double> r, w, k, v, u, s0, dy, dsT; // RWKV-4: r unused
};

HostTensor tok(const Cfg& c, int role, bool broadcast_t = false) {
    return token_tensor(c.dtype_of(role), c.B, c.T, c.r4() ? 0 : c.H, c.N, c.layout, broadcast_t);
}

// RWKV-6 u/du [H,N]; RWKV-4 w, u, dw, du [C].
HostTensor param(const Cfg& c, int role) {
    const wkv_dtype dt = c.dtype_of(role);
    if (c.r4()) {
        if (c.layout == Layout::Contiguous) return HostTensor(dt, {c.N});
        return HostTensor(dt, {c.N}, {3}, 1);
    }
    if (c.layout == Layout::Contiguous) return HostTensor(dt, {c.H, c.N});
    return HostTensor(dt, {c.H, c.N}, {3 * c.N + 1, 3}, 2);
}

HostTensor state(const Cfg& c, int64_t S) {
    const int64_t N = c.N, H = c.H;
    if (c.r4()) {
        if (c.interleaved) {
            if (c.padded_state) return HostTensor(WKV_DTYPE_F32, {S, N, 3}, {4 * N + 3, 4, 1}, 1);
            return HostTensor(WKV_DTYPE_F32, {S, N, 3});
        }
        if (c.padded_state) return HostTensor(WKV_DTYPE_F32, {S, 3, N}, {3 * (N + 1) + 2, N + 1, 1}, 2);
        return HostTensor(WKV_DTYPE_F32, {S, 3, N});
    }
    if (c.padded_state)
        return HostTensor(WKV_DTYPE_F32, {S, H, N, N}, {H * (N * N + 5), N * N + 5, N, 1}, 2);
    return HostTensor(WKV_DTYPE_F32, {S, H, N, N});
}

// Planar / value-major (the data's order) <-> the library's.
std::vector<double> to_lib(const Cfg& c, int64_t S, const std::vector<double>& x) {
    if (c.r4()) return c.interleaved ? permute(x, {S, 3, c.N}, {0, 2, 1}) : x;
    return c.key_major ? permute(x, {S, c.H, c.N, c.N}, {0, 1, 3, 2}) : x;
}
std::vector<double> from_lib(const Cfg& c, int64_t S, const std::vector<double>& x) {
    if (c.r4()) return c.interleaved ? permute(x, {S, c.N, 3}, {0, 2, 1}) : x;
    return to_lib(c, S, x);
}

struct Out {
    std::vector<double> y, sT, ds0;
    std::vector<std::vector<double>> grads; // RWKV-6: dr dw dk dv du; RWKV-4: dw du dk dv
    std::vector<std::vector<unsigned char>> raw;
};

// Device copies of host tensors (whole storage), made on demand and reused per tensor.
struct Mirrors {
    struct M {
        HostTensor* h;
        void* d;
    };
    std::vector<M> m;
    ~Mirrors() {
        for (M& x : m) cudaFree(x.d);
    }
    wkv_tensor view(HostTensor& t, bool dev) {
        wkv_tensor v = t.view();
        if (!dev) return v;
        void* d = nullptr;
        for (M& x : m)
            if (x.h == &t) d = x.d;
        if (!d) {
            REQUIRE(cudaMalloc(&d, t.buf.size()) == cudaSuccess);
            REQUIRE(cudaMemcpy(d, t.buf.data(), t.buf.size(), cudaMemcpyHostToDevice) == cudaSuccess);
            m.push_back({&t, d});
        }
        v.data = d;
        v.device.type = WKV_DEVICE_CUDA;
        v.device.id = 0;
        return v;
    }
    void upload(HostTensor& t) {
        for (M& x : m)
            if (x.h == &t) REQUIRE(cudaMemcpy(x.d, t.buf.data(), t.buf.size(), cudaMemcpyHostToDevice) == cudaSuccess);
    }
    void download() {
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        for (M& x : m)
            REQUIRE(cudaMemcpy(x.h->buf.data(), x.d, x.h->buf.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
    }
};

// Forward then backward on `backend`; dev: every tensor and the workspace in device memory.
Out run(wkv_backend backend, bool dev, const Cfg& c, const Data& d, const std::vector<int64_t>& offsets) {
    wkv_context* ctx = nullptr;
    {
        wkv_context_options o{};
        o.struct_size = sizeof o;
        o.backend = backend;
        o.cpu_threads = 2;
        const wkv_status st = wkv_context_create(&o, &ctx);
        INFO(std::string(wkv_last_error(nullptr)));
        REQUIRE(st == WKV_OK);
    }
    struct Destroy {
        wkv_context* c;
        ~Destroy() { wkv_context_destroy(c); }
    } destroy{ctx};
    const int64_t num_seqs = offsets.empty() ? 0 : (int64_t)offsets.size() - 1;
    const int64_t S = num_seqs ? num_seqs : c.B;
    const bool r4 = c.r4();
    Mirrors mir;

    // RWKV-6 roles: r w k v u (0..4); RWKV-4: w u k v (0..3)
    std::vector<HostTensor> in;
    if (r4) {
        in.push_back(param(c, 0));
        in.push_back(param(c, 1));
        in.push_back(tok(c, 2));
        in.push_back(tok(c, 3));
        fill_input(in[0], d.w);
        fill_input(in[1], d.u);
        fill_input(in[2], d.k);
        fill_input(in[3], d.v);
    } else {
        in.push_back(tok(c, 0));
        in.push_back(tok(c, 1, c.rwkv5));
        in.push_back(tok(c, 2));
        in.push_back(tok(c, 3));
        in.push_back(param(c, 4));
        fill_input(in[0], d.r);
        fill_input(in[1], d.w);
        fill_input(in[2], d.k);
        fill_input(in[3], d.v);
        fill_input(in[4], d.u);
    }
    HostTensor y = tok(c, 5);
    HostTensor s_in = state(c, S), s_out = state(c, S);
    if (c.state_in) fill_input(s_in, to_lib(c, S, d.s0));
    y.poison();
    if (!c.in_place) s_out.poison();

    wkv_forward_desc f{};
    f.struct_size = sizeof f;
    f.op = c.op;
    f.decay_form = r4 ? WKV_DECAY_EXP_NEG_EXP : c.form;
    f.flags = (c.key_major && !r4 ? (uint32_t)WKV_FLAG_STATE_KEY_MAJOR : 0u) |
              (c.interleaved && r4 ? (uint32_t)WKV_FLAG_RWKV4_STATE_INTERLEAVED : 0u);
    if (r4) {
        f.w = mir.view(in[0], dev);
        f.u = mir.view(in[1], dev);
        f.k = mir.view(in[2], dev);
        f.v = mir.view(in[3], dev);
    } else {
        f.r = mir.view(in[0], dev);
        f.w = mir.view(in[1], dev);
        f.k = mir.view(in[2], dev);
        f.v = mir.view(in[3], dev);
        f.u = mir.view(in[4], dev);
    }
    f.y = mir.view(y, dev);
    if (c.state_in) f.state_in = mir.view(s_in, dev);
    if (c.state_out) f.state_out = c.in_place ? mir.view(s_in, dev) : mir.view(s_out, dev);
    f.seq_offsets = num_seqs ? offsets.data() : nullptr;
    f.num_seqs = num_seqs;
    std::vector<std::vector<unsigned char>> before;
    for (const HostTensor& t : in) before.push_back(t.buf);

    if (dev) REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // the mirrors' copies (see below)
    wkv_status st = wkv_forward(ctx, &f);
    {
        INFO("wkv_forward: " << std::string(wkv_last_error(ctx)));
        REQUIRE(st == WKV_OK);
    }
    if (dev) mir.download();
    Out res;
    res.y = y.read();
    CHECK(y.gaps_still_nan());
    res.raw.push_back(y.buf);
    if (c.state_out) {
        HostTensor& so = c.in_place ? s_in : s_out;
        res.sT = from_lib(c, S, so.read());
        CHECK(so.gaps_still_nan());
        res.raw.push_back(so.buf);
    }
    for (size_t i = 0; i < in.size(); i++) CHECK_MESSAGE(in[i].buf == before[i], "input " << i << " was modified");

    if (c.state_in && c.in_place) {
        fill_input(s_in, to_lib(c, S, d.s0));
        mir.upload(s_in);
    }
    HostTensor dyt = tok(c, 6);
    fill_input(dyt, d.dy);
    HostTensor ds_out = state(c, S), ds_in = state(c, S);
    if (c.dstate_out) fill_input(ds_out, to_lib(c, S, d.dsT));
    ds_in.poison();
    std::vector<HostTensor> g;
    if (r4) {
        g.push_back(param(c, 7));
        g.push_back(param(c, 8));
        g.push_back(tok(c, 9));
        g.push_back(tok(c, 10));
    } else {
        for (int i = 0; i < 4; i++) g.push_back(tok(c, 7 + i));
        g.push_back(param(c, 11));
    }
    for (HostTensor& t : g) t.poison();

    wkv_backward_desc bd{};
    bd.struct_size = sizeof bd;
    bd.forward = &f;
    bd.dy = mir.view(dyt, dev);
    if (c.dstate_out) bd.dstate_out = mir.view(ds_out, dev);
    if (r4) {
        bd.dw = mir.view(g[0], dev);
        bd.du = mir.view(g[1], dev);
        bd.dk = mir.view(g[2], dev);
        bd.dv = mir.view(g[3], dev);
    } else {
        bd.dr = mir.view(g[0], dev);
        bd.dw = mir.view(g[1], dev);
        bd.dk = mir.view(g[2], dev);
        bd.dv = mir.view(g[3], dev);
        bd.du = mir.view(g[4], dev);
    }
    if (c.dstate_in) bd.dstate_in = mir.view(ds_in, dev);
    size_t ws = 0;
    st = wkv_workspace_size(ctx, &ws, &bd);
    {
        INFO("wkv_workspace_size: " << std::string(wkv_last_error(ctx)));
        REQUIRE(st == WKV_OK);
    }
    std::vector<unsigned char> host_ws;
    void* dws = nullptr;
    if (dev) {
        REQUIRE(cudaMalloc(&dws, ws + 256) == cudaSuccess);
        REQUIRE(cudaMemset(dws, 0xFF, ws + 256) == cudaSuccess);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess); // the memset is on the legacy stream
        bd.workspace = dws;
    } else {
        host_ws.assign(ws + 256, 0xFF);
        bd.workspace = host_ws.data();
    }
    bd.workspace_size = ws;
    // the memset and the mirrors' copies run on the legacy stream, which the context's
    // non-blocking stream does not wait for (wkv_cuda.h)
    if (dev) REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    st = wkv_backward(ctx, &bd);
    {
        INFO("wkv_backward: " << std::string(wkv_last_error(ctx)));
        REQUIRE(st == WKV_OK);
    }
    if (dev) {
        mir.download();
        std::vector<unsigned char> tail(256);
        REQUIRE(cudaMemcpy(tail.data(), static_cast<char*>(dws) + ws, 256, cudaMemcpyDeviceToHost) == cudaSuccess);
        bool ok = true;
        for (unsigned char b : tail) ok = ok && b == 0xFF;
        CHECK_MESSAGE(ok, "the backward wrote past its workspace");
        cudaFree(dws);
    } else if (backend == WKV_BACKEND_CUDA) {
        bool ok = true;
        for (unsigned char b : host_ws) ok = ok && b == 0xFF;
        CHECK_MESSAGE(ok, "the CUDA backend wrote into a host workspace");
    }
    for (HostTensor& t : g) {
        CHECK(t.gaps_still_nan());
        res.grads.push_back(t.read());
        res.raw.push_back(t.buf);
    }
    if (c.dstate_in) {
        res.ds0 = from_lib(c, S, ds_in.read());
        CHECK(ds_in.gaps_still_nan());
        res.raw.push_back(ds_in.buf);
    }
    for (size_t i = 0; i < in.size(); i++)
        CHECK_MESSAGE(in[i].buf == before[i], "input " << i << " was modified by the backward");
    return res;
}

Data make_data(const Cfg& c, int64_t S, Rng& rng) {
    Data d;
    if (c.r4()) {
        Rwkv4Data x = random_rwkv4(rng, c.B, c.T, c.N, c.k_std, false);
        d.w = x.w;
        d.u = x.u;
        d.k = x.k;
        d.v = x.v;
        if (c.state_in) d.s0 = random_rwkv4(rng, S, 1, c.N, c.k_std, true).s0;
        d.dy = random_normal(rng, x.tok_count());
        if (c.dstate_out) d.dsT = random_normal(rng, (size_t)(S * 3 * c.N));
        return d;
    }
    Rwkv6Data x = random_rwkv6(rng, c.B, c.T, c.H, c.N, c.form, false, c.rwkv5);
    d.r = x.r;
    d.w = x.w;
    d.k = x.k;
    d.v = x.v;
    d.u = x.u;
    if (c.state_in) d.s0 = random_rwkv6(rng, S, 1, c.H, c.N, c.form, true).s0;
    d.dy = random_normal(rng, x.tok_count());
    if (c.dstate_out) d.dsT = random_normal(rng, (size_t)(S * c.H * c.N * c.N));
    return d;
}

double l2(const std::vector<double>& x) {
    double s = 0.0;
    for (double v : x) s += v * v;
    return std::sqrt(s);
}

double l2diff(const std::vector<double>& a, const std::vector<double>& b) {
    if (a.size() != b.size()) return INFINITY;
    double s = 0.0;
    for (size_t i = 0; i < a.size(); i++) s += (a[i] - b[i]) * (a[i] - b[i]);
    return std::isfinite(s) ? std::sqrt(s) : INFINITY;
}

void cmp(const char* what, const std::vector<double>& got, const std::vector<double>& ref, double tol,
         const std::string& desc) {
    const double e = rel_err(got, ref);
    INFO(desc);
    CHECK_MESSAGE(e <= tol, std::string(what) << ": rel err " << e << " > " << tol);
}

// CUDA (device memory, and host memory when `host_too`) against the CPU backend.
void check(const Cfg& c, uint64_t seed, const std::vector<int64_t>& lens = {}, bool host_too = false) {
    const std::vector<int64_t> offsets = lens.empty() ? std::vector<int64_t>() : offsets_of(lens);
    const int64_t S = lens.empty() ? c.B : (int64_t)lens.size();
    Rng rng(seed);
    const Data d = make_data(c, S, rng);
    const std::string desc = c.describe() + " seed=" + std::to_string(seed) + (lens.empty() ? "" : " packed");
    const Out cpu = run(WKV_BACKEND_CPU, false, c, d, offsets);
    const Out gpu = run(WKV_BACKEND_CUDA, true, c, d, offsets);
    bool any16 = false;
    for (int r = 0; r < 12; r++) any16 = any16 || c.dtype_of(r).bits == 16;
    const double tol = any16 ? 1e-2 : 1e-4;
    const char* names6[] = {"dr", "dw", "dk", "dv", "du"};
    const char* names4[] = {"dw", "du", "dk", "dv"};
    cmp("y", gpu.y, cpu.y, any16 ? 5e-3 : 1e-4, desc);
    if (c.state_out) cmp("state_out", gpu.sT, cpu.sT, any16 ? 5e-3 : 1e-4, desc);
    for (size_t i = 0; i < gpu.grads.size(); i++) {
        if (c.r4() && i == 1) {
            // RWKV-4 du = the sum over tokens of dk's y part gy e2 (v - y), which cancels to
            // rounding noise where y == v (T = 1 from the empty state: du is exactly 0 in
            // exact arithmetic, and the two backends' noise differs): measured against dv's
            // norm (the size of gy e2) when that is larger than du's own.
            const double den = std::max(l2(cpu.grads[1]), l2(cpu.grads[3]));
            const double e = den > 0 ? l2diff(gpu.grads[1], cpu.grads[1]) / den : 0.0;
            INFO(desc);
            CHECK_MESSAGE(e <= tol, "du: error " << e << " (relative to max(|du|, |dv|)) > " << tol);
            continue;
        }
        cmp(c.r4() ? names4[i] : names6[i], gpu.grads[i], cpu.grads[i], tol, desc);
    }
    if (c.dstate_in) cmp("dstate_in", gpu.ds0, cpu.ds0, tol, desc);
    if (host_too) {
        const Out host = run(WKV_BACKEND_CUDA, false, c, d, offsets);
        CHECK_MESSAGE(host.raw == gpu.raw, "host (staged) and device tensors differ: " << desc);
    }
}

const wkv_dtype kDt[] = {WKV_DTYPE_F32, WKV_DTYPE_F16, WKV_DTYPE_BF16};
const wkv_decay_form kForms6[] = {WKV_DECAY_EXP_NEG_EXP, WKV_DECAY_LOG, WKV_DECAY_DIRECT, WKV_DECAY_CLAMPW};

} // namespace

TEST_CASE("cuda rwkv6: random inputs vs the CPU backend: T x N x dtype x form x states") {
    CUDA_TEST_OR_SKIP();
    const uint64_t seed = test_seed();
    int n = 0;
    for (int64_t N : {32, 64, 128})
        for (int64_t T : {1, 17, 100}) {
            Cfg c;
            c.N = N;
            c.T = T;
            c.dtype = kDt[n % 3];
            c.form = kForms6[n % 4];
            c.state_in = n % 5 != 1;
            c.state_out = n % 7 != 2;
            c.dstate_out = n % 3 != 2;
            c.dstate_in = n % 4 != 3;
            c.key_major = n % 2 == 1;
            check(c, seed + (uint64_t)n, {}, n % 4 == 0);
            n++;
        }
}

TEST_CASE("cuda rwkv6: layouts, RWKV-5, mixed dtypes, padded/in-place states, packed") {
    CUDA_TEST_OR_SKIP();
    const uint64_t seed = test_seed() + 100;
    int n = 0;
    for (Layout l : {Layout::PaddedT, Layout::Transposed, Layout::InnerStride}) {
        Cfg c;
        c.layout = l;
        c.T = 33;
        c.rwkv5 = n == 1;
        c.mixed = n == 2;
        c.padded_state = n != 1;
        c.key_major = n == 0;
        c.in_place = n == 1;
        check(c, seed + (uint64_t)n++, {}, true);
    }
    for (int64_t N : {32, 64, 128}) {
        Cfg c;
        c.B = 1;
        c.N = N;
        c.T = 5 + 0 + 17 + 40 + 1;
        c.dtype = kDt[n % 3];
        c.key_major = N == 64;
        check(c, seed + (uint64_t)n++, {5, 0, 17, 40, 1}, N == 32);
        c.state_in = c.dstate_out = false;
        check(c, seed + (uint64_t)n++, {5, 0, 17, 40, 1});
    }
    {   // more sequences than one launch takes
        Cfg c;
        c.B = 1;
        c.H = 1;
        c.N = 32;
        std::vector<int64_t> lens;
        for (int i = 0; i < 130; i++) lens.push_back(i % 3);
        c.T = 0;
        for (int64_t x : lens) c.T += x;
        check(c, seed + (uint64_t)n++, lens);
    }
}

TEST_CASE("cuda rwkv4: random inputs vs the CPU backend: T x C x dtype x states, large k") {
    CUDA_TEST_OR_SKIP();
    const uint64_t seed = test_seed() + 200;
    int n = 0;
    for (int64_t C : {1, 96, 130, 2048})
        for (int64_t T : {1, 17, 100}) {
            Cfg c;
            c.op = WKV_OP_RWKV4;
            c.N = C;
            c.T = T;
            c.dtype = kDt[n % 3];
            c.state_in = n % 5 != 1;
            c.state_out = n % 7 != 2;
            c.dstate_out = n % 3 != 2;
            c.dstate_in = n % 4 != 3;
            c.interleaved = n % 2 == 1;
            c.k_std = n % 3 == 0 ? 20.0 : 0.5;
            check(c, seed + (uint64_t)n, {}, n % 4 == 0 && C <= 130);
            n++;
        }
    for (Layout l : {Layout::PaddedT, Layout::Transposed, Layout::InnerStride}) {
        Cfg c;
        c.op = WKV_OP_RWKV4;
        c.N = 77;
        c.T = 40;
        c.layout = l;
        c.mixed = n % 2 == 0;
        c.padded_state = true;
        c.interleaved = l == Layout::Transposed;
        c.in_place = l == Layout::InnerStride;
        c.k_std = 20.0;
        check(c, seed + (uint64_t)n++, {}, true);
    }
    {   // k ~ N(0, 20^2) over T = 1000
        Cfg c;
        c.op = WKV_OP_RWKV4;
        c.B = 1;
        c.N = 64;
        c.T = 1000;
        c.k_std = 20.0;
        check(c, seed + (uint64_t)n++);
    }
    for (int st = 0; st < 2; st++) { // packed, an empty sequence
        Cfg c;
        c.op = WKV_OP_RWKV4;
        c.B = 1;
        c.N = 96;
        c.T = 5 + 0 + 17 + 40 + 1;
        c.state_in = c.dstate_out = st == 0;
        c.interleaved = st == 1;
        check(c, seed + (uint64_t)n++, {5, 0, 17, 40, 1}, true);
    }
}

TEST_CASE("cuda rwkv6/rwkv4: two device runs are bit-identical (no order-dependent reductions)") {
    CUDA_TEST_OR_SKIP();
    for (wkv_op op : {WKV_OP_RWKV6, WKV_OP_RWKV4}) {
        Cfg c;
        c.op = op;
        c.B = 5;
        c.T = 40;
        c.N = op == WKV_OP_RWKV4 ? 300 : 64;
        Rng rng(7);
        const Data d = make_data(c, c.B, rng);
        const Out a = run(WKV_BACKEND_CUDA, true, c, d, {});
        const Out b = run(WKV_BACKEND_CUDA, true, c, d, {});
        CHECK(a.raw == b.raw);
    }
}
