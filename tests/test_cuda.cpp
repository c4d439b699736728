// The CUDA backend plugin.
//
// This file is compiled twice:
//   - into wkv_tests (which links only libwkv and has no CUDA header): the part below that needs
//     no CUDA runtime — the backend's self-description, with or without a GPU;
//   - into backends/cuda/tests/wkv_cuda_tests with WKV_TEST_CUDA_RUNTIME (links cudart): the GPU
//     tests, on device memory: every golden wkv7 file in f32/f16/bf16 (both state orders), random
//     inputs against the CPU backend and the float64 reference across T, N, dtypes, decay forms,
//     strides, packed sequences and state options; streams and CUDA-graph capture; errors; the
//     chunked RWKV-7 forward forced on (WKV_CUDA_RWKV7_CHUNKED=1) for the clampw files and inputs.
//     Without a CUDA device each case prints "SKIPPED: no CUDA device" and the program exits 77
//     (ctest: "Skipped").
//
// Every output and the workspace are poisoned with NaN before each call (gaps of strided tensors
// too), each device buffer has a guard zone that must come back untouched, and inputs must come
// back unchanged. WKV_TEST_SEED=<seed> reproduces a run's random inputs.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "test_util.h"
#include "wkv/wkv.h"

using namespace wkvtest;

#if !defined(WKV_TEST_CUDA_RUNTIME)

TEST_CASE("cuda: the backend describes itself, with or without a GPU") {
    wkv_backend_info info{};
    info.struct_size = sizeof info;
    REQUIRE(wkv_backend_get_info(WKV_BACKEND_CUDA, &info) == WKV_OK);
    REQUIRE(info.reason != nullptr);
    CHECK(std::strlen(info.reason) > 0);
    if (!info.available) {
        MESSAGE("cuda backend unavailable: " << std::string(info.reason));
        // Missing plugin, or the plugin without a usable device: never a crash, always a reason.
        const std::string why = info.reason;
        CHECK((why.find("not found") != std::string::npos ||
               why.find("no CUDA device") != std::string::npos ||
               why.find("cannot run") != std::string::npos));
        CHECK(info.device_count == 0);
        wkv_context_options o{};
        o.struct_size = sizeof o;
        o.backend = WKV_BACKEND_CUDA;
        wkv_context* ctx = nullptr;
        CHECK(wkv_context_create(&o, &ctx) == WKV_ERROR_BACKEND_UNAVAILABLE);
        CHECK(ctx == nullptr);
        // AUTO still works: it falls back to the CPU.
        o.backend = WKV_BACKEND_AUTO;
        REQUIRE(wkv_context_create(&o, &ctx) == WKV_OK);
        CHECK(wkv_context_backend(ctx) != WKV_BACKEND_CUDA);
        wkv_context_destroy(ctx);
    } else {
        CHECK(info.device_count >= 1);
        CHECK((info.ops & (1u << WKV_OP_RWKV7)) != 0);
        CHECK((info.ops & (1u << WKV_OP_RWKV6)) != 0);
        CHECK((info.ops & (1u << WKV_OP_RWKV4)) != 0);
        CHECK(info.dtypes == 7u);
        CHECK(info.any_head_size == 0);
        std::vector<int> sizes(info.head_sizes, info.head_sizes + info.num_head_sizes);
        for (int n : {32, 64, 128}) CHECK(std::find(sizes.begin(), sizes.end(), n) != sizes.end());
        wkv_device_info di{};
        di.struct_size = sizeof di;
        CHECK(wkv_device_get_info(WKV_BACKEND_CUDA, 0, &di) == WKV_OK);
        CHECK(di.memory_bytes > 0);
        CHECK(di.compute_units > 0);
    }
}

#else  // ================================================================ with the CUDA runtime

#include <cuda_runtime_api.h>

#include <iomanip>
#include <sstream>

#include "wkv/wkv_cuda.h"

// Set by cuda_test_main.cpp's main: how many cases skipped for want of a device, and ran.
extern int g_wkv_cuda_skipped;
extern int g_wkv_cuda_ran;

namespace {

const char* cuda_unavailable_reason() {
    static std::string why;
    static int state = -1;  // -1 unknown, 0 no, 1 yes
    if (state < 0) {
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        wkv_backend_info info{};
        info.struct_size = sizeof info;
        wkv_backend_get_info(WKV_BACKEND_CUDA, &info);
        if (e != cudaSuccess || n == 0) {
            why = std::string("cudaGetDeviceCount: ") + (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
            state = 0;
        } else if (!info.available) {
            why = std::string("the cuda backend is unavailable: ") + (info.reason ? info.reason : "?");
            state = 0;
        } else {
            state = 1;
        }
    }
    return state ? nullptr : why.c_str();
}

#define CUDA_TEST_OR_SKIP()                                                        \
    do {                                                                           \
        if (const char* why_ = cuda_unavailable_reason()) {                        \
            MESSAGE("SKIPPED: no CUDA device (" << std::string(why_) << ")");                   \
            ++g_wkv_cuda_skipped;                                                  \
            return;                                                                \
        }                                                                          \
        ++g_wkv_cuda_ran;                                                          \
    } while (0)

#define CU(call)                                                                   \
    do {                                                                           \
        cudaError_t e_ = (call);                                                   \
        INFO(#call);                                                               \
        REQUIRE_MESSAGE(e_ == cudaSuccess, std::string(cudaGetErrorString(e_)));   \
    } while (0)

constexpr size_t kGuard = 256;
unsigned char guard_byte(size_t i) { return (unsigned char)(0x5Au ^ (i * 13u)); }

// A copy of a HostTensor's whole storage (gaps included) followed by a guard zone, in device
// memory (DevMirror: a device pointer) or in a wkv_buffer (BufMirror).
struct Mirror {
    HostTensor* h = nullptr;
    virtual ~Mirror() = default;
    virtual void upload() = 0;
    virtual void download() = 0;
    virtual bool guard_ok() const = 0;
    virtual wkv_tensor view() const = 0;
};

struct DevMirror : Mirror {
    void* d = nullptr;
    size_t bytes = 0;

    DevMirror() = default;
    explicit DevMirror(HostTensor& t) : bytes(t.buf.size()) {
        h = &t;
        CU(cudaMalloc(&d, bytes + kGuard));
        std::vector<unsigned char> g(kGuard);
        for (size_t i = 0; i < kGuard; i++) g[i] = guard_byte(i);
        CU(cudaMemcpy(static_cast<char*>(d) + bytes, g.data(), kGuard, cudaMemcpyHostToDevice));
        upload();
    }
    ~DevMirror() override {
        if (d) cudaFree(d);
    }
    DevMirror(const DevMirror&) = delete;
    DevMirror& operator=(const DevMirror&) = delete;

    void upload() override { CU(cudaMemcpy(d, h->buf.data(), bytes, cudaMemcpyHostToDevice)); }
    void download() override { CU(cudaMemcpy(h->buf.data(), d, bytes, cudaMemcpyDeviceToHost)); }
    bool guard_ok() const override {
        std::vector<unsigned char> g(kGuard);
        if (cudaMemcpy(g.data(), static_cast<const char*>(d) + bytes, kGuard, cudaMemcpyDeviceToHost) != cudaSuccess)
            return false;
        for (size_t i = 0; i < kGuard; i++)
            if (g[i] != guard_byte(i)) return false;
        return true;
    }
    // The host view with its data on the device.
    wkv_tensor view() const override {
        wkv_tensor t = h->view();
        t.data = d;
        t.device.type = WKV_DEVICE_CUDA;
        t.device.id = 0;
        return t;
    }
};

// The same in a wkv_buffer of ctx (which must outlive it).
struct BufMirror : Mirror {
    wkv_context* ctx = nullptr;
    wkv_buffer* b = nullptr;
    size_t bytes = 0;

    BufMirror(wkv_context* c, HostTensor& t) : ctx(c), bytes(t.buf.size()) {
        h = &t;
        INFO(wkv_last_error(ctx));
        REQUIRE(wkv_buffer_create(ctx, bytes + kGuard, &b) == WKV_OK);
        std::vector<unsigned char> g(kGuard);
        for (size_t i = 0; i < kGuard; i++) g[i] = guard_byte(i);
        REQUIRE(wkv_buffer_upload(ctx, b, bytes, g.data(), kGuard) == WKV_OK);
        upload();
    }
    ~BufMirror() override { wkv_buffer_destroy(b); }
    BufMirror(const BufMirror&) = delete;
    BufMirror& operator=(const BufMirror&) = delete;

    void upload() override { REQUIRE(wkv_buffer_upload(ctx, b, 0, h->buf.data(), bytes) == WKV_OK); }
    void download() override { REQUIRE(wkv_buffer_download(ctx, b, 0, h->buf.data(), bytes) == WKV_OK); }
    bool guard_ok() const override {
        std::vector<unsigned char> g(kGuard);
        if (wkv_buffer_download(ctx, b, bytes, g.data(), kGuard) != WKV_OK) return false;
        for (size_t i = 0; i < kGuard; i++)
            if (g[i] != guard_byte(i)) return false;
        return true;
    }
    // The host view in the buffer: wkv_tensor_make_buffer, then the view's strides.
    wkv_tensor view() const override {
        const wkv_tensor t = h->view();
        wkv_tensor x = wkv_tensor_make_buffer(b, t.byte_offset, t.dtype, t.ndim, t.shape);
        x.strides = t.strides;
        CHECK(x.device.type == WKV_DEVICE_CUDA);
        CHECK(x.device.id == 0);
        return x;
    }
};

// Where run_backend puts the tensors of a CUDA call: device pointers, host memory (staged by
// the plugin), wkv_buffers, or a mix (tensor i: host, device, buffer by i % 3; host workspace).
enum class Mem { Device, Host, Buffer, Mixed };

const char* mem_name(Mem m) {
    return m == Mem::Device ? "device" : m == Mem::Host ? "host" : m == Mem::Buffer ? "buffer" : "mixed";
}

struct CudaContext {
    wkv_context* ctx = nullptr;
    CudaContext() {
        wkv_context_options o{};
        o.struct_size = sizeof o;
        o.backend = WKV_BACKEND_CUDA;
        const wkv_status st = wkv_context_create(&o, &ctx);
        INFO(wkv_last_error(nullptr));
        REQUIRE(st == WKV_OK);
    }
    ~CudaContext() { wkv_context_destroy(ctx); }
    CudaContext(const CudaContext&) = delete;
    CudaContext& operator=(const CudaContext&) = delete;
    void sync() {
        cudaStream_t s = nullptr;
        REQUIRE(wkv_cuda_get_stream(ctx, &s) == WKV_OK);
        CU(cudaStreamSynchronize(s));
    }
};

// ------------------------------------------------------------------------------ configuration

enum class Layout { Contiguous, PaddedT, HeadMajor };

const char* layout_name(Layout l) {
    return l == Layout::Contiguous ? "contiguous" : l == Layout::PaddedT ? "padded-T" : "head-major";
}

struct Config {
    int64_t B = 1, T = 1, H = 1, N = 64;
    wkv_decay_form form = WKV_DECAY_CLAMPW;
    wkv_dtype dtype = WKV_DTYPE_F32;
    bool state_in = true, state_out = true, dstate_out = true, dstate_in = true;
    Layout layout = Layout::Contiguous;
    bool w_broadcast = false, padded_state = false, key_major = false, in_place = false;

    std::string describe() const {
        std::ostringstream s;
        s << "B=" << B << " T=" << T << " H=" << H << " N=" << N << " form=" << form_name(form)
          << " dtype=" << dtype_name(dtype) << " state_in=" << state_in << " state_out=" << state_out
          << " dstate_out=" << dstate_out << " dstate_in=" << dstate_in
          << " layout=" << layout_name(layout) << " w_broadcast=" << w_broadcast
          << " padded_state=" << padded_state << " key_major=" << key_major << " in_place=" << in_place;
        return s.str();
    }
};

HostTensor token_tensor(const Config& c, wkv_dtype dt, bool broadcast_t = false) {
    const int64_t B = c.B, T = c.T, H = c.H, N = c.N;
    std::vector<int64_t> shape = {B, T, H, N};
    if (broadcast_t) return HostTensor(dt, shape, {H * N, 0, N, 1}, 0);
    switch (c.layout) {
    case Layout::PaddedT: return HostTensor(dt, shape, {T * 2 * H * N, 2 * H * N, N, 1}, 3);
    case Layout::HeadMajor: return HostTensor(dt, shape, {H * T * N, N, T * N, 1}, 0);
    default: return HostTensor(dt, shape);
    }
}

HostTensor state_tensor(const Config& c, int64_t S) {
    std::vector<int64_t> shape = {S, c.H, c.N, c.N};
    if (c.padded_state)
        return HostTensor(WKV_DTYPE_F32, shape, {c.H * (c.N * c.N + 5), c.N * c.N + 5, c.N, 1}, 2);
    return HostTensor(WKV_DTYPE_F32, shape);
}

std::vector<double> to_lib_state(const Config& c, int64_t S, const std::vector<double>& x) {
    return c.key_major ? permute(x, {S, c.H, c.N, c.N}, {0, 1, 3, 2}) : x;
}

void fill_input(HostTensor& t, const std::vector<double>& v) {
    t.poison();
    t.fill(v);
}

struct Results {
    std::vector<double> y, sT, dr, dw, dk, dv, da, db, ds0;
};

// Runs forward then backward through the public API on `backend`: host tensors for the CPU,
// for CUDA what `mem` says (device mirrors by default). Checks poisoning, guard zones and
// unchanged inputs along the way; a host workspace must come back untouched. Without a
// device-pointer or buffer tensor, no synchronisation at all: the calls must be complete.
Results run_backend(wkv_backend backend, const Config& c, const Rwkv7Data& d,
                    const std::vector<double>& dy, const std::vector<double>& dsT,
                    const int64_t* seq_offsets = nullptr, int64_t num_seqs = 0,
                    Mem mem = Mem::Device) {
    const bool on_cuda = backend == WKV_BACKEND_CUDA;
    const bool cuda = on_cuda && mem != Mem::Host; /* some tensor is not host memory */
    wkv_context* ctx = nullptr;
    {
        wkv_context_options o{};
        o.struct_size = sizeof o;
        o.backend = backend;
        o.cpu_threads = 2;
        const wkv_status st = wkv_context_create(&o, &ctx);
        INFO(wkv_last_error(nullptr));
        REQUIRE(st == WKV_OK);
    }
    struct Destroy {
        wkv_context* c;
        ~Destroy() { wkv_context_destroy(c); }
    } destroy{ctx};
    const int64_t S = num_seqs > 0 ? num_seqs : c.B;

    const std::vector<double>* in_vals[6] = {&d.r, &d.w, &d.k, &d.v, &d.a, &d.b};
    std::vector<HostTensor> in(6);
    for (int i = 0; i < 6; i++) {
        in[(size_t)i] = token_tensor(c, c.dtype, i == 1 && c.w_broadcast);
        fill_input(in[(size_t)i], *in_vals[i]);
    }
    HostTensor y = token_tensor(c, c.dtype);
    HostTensor s_in = state_tensor(c, S), s_out = state_tensor(c, S);
    if (c.state_in) fill_input(s_in, to_lib_state(c, S, d.s0));
    y.poison();
    if (!c.in_place) s_out.poison();
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
    std::vector<std::vector<unsigned char>> inputs_before;
    for (const HostTensor& t : in) inputs_before.push_back(t.buf);

    // Device mirrors (CUDA only): same storage layout, data pointers replaced.
    std::vector<std::unique_ptr<Mirror>> mir;
    int n_tensors = 0;
    auto tensor = [&](HostTensor& t) -> wkv_tensor {
        static const Mem kRound[3] = {Mem::Host, Mem::Device, Mem::Buffer};
        const Mem kind = mem == Mem::Mixed ? kRound[n_tensors++ % 3] : mem;
        if (!on_cuda || kind == Mem::Host) return t.view();
        if (kind == Mem::Buffer) mir.emplace_back(new BufMirror(ctx, t));
        else mir.emplace_back(new DevMirror(t));
        return mir.back()->view();
    };
    auto mirror_of = [&](HostTensor& t) -> Mirror* {
        for (auto& m : mir)
            if (m->h == &t) return m.get();
        return nullptr;
    };

    wkv_forward_desc f{};
    f.struct_size = sizeof f;
    f.op = WKV_OP_RWKV7;
    f.decay_form = c.form;
    f.flags = c.key_major ? (uint32_t)WKV_FLAG_STATE_KEY_MAJOR : 0u;
    f.r = tensor(in[0]);
    f.w = tensor(in[1]);
    f.k = tensor(in[2]);
    f.v = tensor(in[3]);
    f.a = tensor(in[4]);
    f.b = tensor(in[5]);
    f.y = tensor(y);
    wkv_tensor sin_t = tensor(s_in);
    wkv_tensor sout_t = tensor(s_out);
    if (c.state_in) f.state_in = sin_t;
    if (c.state_out) f.state_out = c.in_place ? sin_t : sout_t;
    f.seq_offsets = seq_offsets;
    f.num_seqs = num_seqs;

    // the mirrors' cudaMemcpy may still be in flight on the legacy stream, which the context's
    // non-blocking stream does not wait for (wkv_cuda.h)
    if (on_cuda) CU(cudaDeviceSynchronize());
    wkv_status st = wkv_forward(ctx, &f);
    {
        INFO("wkv_forward: " << wkv_last_error(ctx));
        REQUIRE(st == WKV_OK);
    }
    if (cuda) {
        if (mem == Mem::Device) CU(cudaDeviceSynchronize());
        else REQUIRE(wkv_context_synchronize(ctx) == WKV_OK);
        for (auto& m : mir) m->download();
    }
    Results res;
    res.y = y.read();
    CHECK(y.gaps_still_nan());
    if (c.state_out) {
        HostTensor& so = c.in_place ? s_in : s_out;
        res.sT = to_lib_state(c, S, so.read());
        CHECK(so.gaps_still_nan());
    }
    for (size_t i = 0; i < in.size(); i++)
        CHECK_MESSAGE(in[i].buf == inputs_before[i], "input " << i << " was modified");

    // backward: restore s0 after an in-place forward, make y garbage
    if (c.state_in && c.in_place) {
        fill_input(s_in, to_lib_state(c, S, d.s0));
        if (Mirror* m = mirror_of(s_in)) m->upload();
    }
    y.poison();
    if (Mirror* m = mirror_of(y)) m->upload();

    wkv_backward_desc bd{};
    bd.struct_size = sizeof bd;
    bd.forward = &f;
    bd.dy = tensor(dyt);
    if (c.dstate_out) bd.dstate_out = tensor(ds_out);
    bd.dr = tensor(g[0]);
    bd.dw = tensor(g[1]);
    bd.dk = tensor(g[2]);
    bd.dv = tensor(g[3]);
    bd.da = tensor(g[4]);
    bd.db = tensor(g[5]);
    if (c.dstate_in) bd.dstate_in = tensor(ds_in);
    size_t ws = 0;
    st = wkv_workspace_size(ctx, &ws, &bd);
    {
        INFO("wkv_workspace_size: " << wkv_last_error(ctx));
        REQUIRE(st == WKV_OK);
    }
    std::vector<unsigned char> host_ws;
    void* dws = nullptr;
    wkv_buffer* bws = nullptr;
    if (on_cuda && mem == Mem::Device) {
        CU(cudaMalloc(&dws, ws + kGuard));
        CU(cudaMemset(dws, 0xFF, ws + kGuard));  // NaN everywhere; the tail is a guard
        bd.workspace = dws;
    } else if (on_cuda && mem == Mem::Buffer) {
        REQUIRE(wkv_buffer_create(ctx, ws + kGuard, &bws) == WKV_OK);
        std::vector<unsigned char> ff(ws + kGuard, 0xFF);
        REQUIRE(wkv_buffer_upload(ctx, bws, 0, ff.data(), ff.size()) == WKV_OK);
        bd.workspace = bws;
    } else {
        host_ws.assign(ws, 0xFF);
        bd.workspace = host_ws.data();
    }
    bd.workspace_size = ws;
    if (on_cuda) CU(cudaDeviceSynchronize());  // the poison memset and uploads, as before the forward
    st = wkv_backward(ctx, &bd);
    {
        INFO("wkv_backward: " << wkv_last_error(ctx));
        REQUIRE(st == WKV_OK);
    }
    if (on_cuda && !cuda) {  // host memory only: complete on return, nothing left on the stream
        cudaStream_t s = nullptr;
        REQUIRE(wkv_cuda_get_stream(ctx, &s) == WKV_OK);
        CHECK(cudaStreamQuery(s) == cudaSuccess);
    }
    if (on_cuda && (mem == Mem::Host || mem == Mem::Mixed)) {
        bool untouched = true;
        for (unsigned char b : host_ws) untouched = untouched && b == 0xFF;
        CHECK_MESSAGE(untouched, "the CUDA backend wrote into a host workspace");
    }
    if (cuda) {
        if (mem == Mem::Device) CU(cudaDeviceSynchronize());
        else REQUIRE(wkv_context_synchronize(ctx) == WKV_OK);
        std::vector<unsigned char> tail(kGuard);
        if (dws) {
            CU(cudaMemcpy(tail.data(), static_cast<char*>(dws) + ws, kGuard, cudaMemcpyDeviceToHost));
        } else if (bws) {
            REQUIRE(wkv_buffer_download(ctx, bws, ws, tail.data(), kGuard) == WKV_OK);
        } else {
            tail.assign(kGuard, 0xFF);
        }
        bool tail_ok = true;
        for (unsigned char b : tail) tail_ok = tail_ok && b == 0xFF;
        CHECK_MESSAGE(tail_ok, "the backward wrote past its workspace");
        if (dws) cudaFree(dws);
        wkv_buffer_destroy(bws);
        for (auto& m : mir) {
            CHECK_MESSAGE(m->guard_ok(), "a device buffer's guard zone was overwritten");
            m->download();
        }
    }
    for (HostTensor* t : {&g[0], &g[1], &g[2], &g[3], &g[4], &g[5]}) CHECK(t->gaps_still_nan());
    res.dr = g[0].read();
    res.dw = g[1].read();
    res.dk = g[2].read();
    res.dv = g[3].read();
    res.da = g[4].read();
    res.db = g[5].read();
    if (c.dstate_in) {
        res.ds0 = to_lib_state(c, S, ds_in.read());
        CHECK(ds_in.gaps_still_nan());
    }
    for (size_t i = 0; i < in.size(); i++)
        CHECK_MESSAGE(in[i].buf == inputs_before[i], "input " << i << " was modified by the backward");
    return res;
}

// Inputs rounded to the dtype (the state, s0, dsT float32), with the reference on those values.
struct Case {
    Rwkv7Data d;
    std::vector<double> dy, dsT;
};

Case make_case(Rng& rng, const Config& c, int64_t B_for_data) {
    Case k;
    k.d = random_rwkv7(rng, B_for_data, c.T, c.H, c.N, c.form, c.state_in);
    for (auto* x : k.d.inputs()) *x = rounded(c.dtype, *x);
    if (c.w_broadcast)  // one w row per (b, h), repeated over t
        for (int64_t b = 0; b < B_for_data; b++)
            for (int64_t t = 1; t < c.T; t++)
                for (int64_t e = 0; e < c.H * c.N; e++)
                    k.d.w[(size_t)((b * c.T + t) * c.H * c.N + e)] = k.d.w[(size_t)(b * c.T * c.H * c.N + e)];
    if (!c.state_in) k.d.s0.clear();
    else k.d.s0 = rounded(WKV_DTYPE_F32, k.d.s0);
    k.dy = rounded(c.dtype, random_normal(rng, k.d.tok_count()));
    k.dsT = rounded(WKV_DTYPE_F32, random_normal(rng, k.d.state_count()));
    return k;
}

void compare(const char* what, const std::vector<double>& got, const std::vector<double>& ref,
             double tol, const std::string& desc) {
    const double e = rel_err(got, ref);
    INFO(desc);
    CHECK_MESSAGE(e <= tol, std::string(what) << ": rel err " << e << " > " << tol);
}

// CUDA vs the CPU backend (same inputs) and vs the float64 reference.
void check_config(const Config& c, uint64_t seed, const std::vector<int64_t>* offsets = nullptr) {
    Rng rng(seed);
    const bool packed = offsets != nullptr;
    const int64_t S = packed ? (int64_t)offsets->size() - 1 : c.B;
    // Packed: B = 1 and one state per sequence; the reference runs each sequence as a batch.
    Case k = make_case(rng, c, c.B);
    std::vector<double> s0_lib = k.d.s0, dsT_lib = k.dsT;
    if (packed) {
        Rng r2(seed ^ 0x9e37u);
        Rwkv7Data pre = random_rwkv7(r2, S, 8, c.H, c.N, c.form, false);
        std::vector<double> ytmp;
        if (c.state_in) ref_forward(pre, ytmp, s0_lib);
        s0_lib = rounded(WKV_DTYPE_F32, s0_lib);
        if (!c.state_in) s0_lib.assign((size_t)(S * c.H * c.N * c.N), 0.0);
        dsT_lib = rounded(WKV_DTYPE_F32, random_normal(r2, (size_t)(S * c.H * c.N * c.N)));
        k.d.s0 = s0_lib;
    }
    const int64_t* off = packed ? offsets->data() : nullptr;
    const std::string desc = c.describe() + " seed=" + std::to_string(seed) + (packed ? " packed" : "");
    Results gpu = run_backend(WKV_BACKEND_CUDA, c, k.d, k.dy, dsT_lib, off, packed ? S : 0);
    Results cpu = run_backend(WKV_BACKEND_CPU, c, k.d, k.dy, dsT_lib, off, packed ? S : 0);

    const bool is16 = c.dtype.bits == 16;
    const double tc = is16 ? 4e-3 : 2e-5;  // against the CPU backend
    compare("y vs cpu", gpu.y, cpu.y, tc, desc);
    if (c.state_out) compare("sT vs cpu", gpu.sT, cpu.sT, tc, desc);
    compare("dr vs cpu", gpu.dr, cpu.dr, tc, desc);
    compare("dw vs cpu", gpu.dw, cpu.dw, tc, desc);
    compare("dk vs cpu", gpu.dk, cpu.dk, tc, desc);
    compare("dv vs cpu", gpu.dv, cpu.dv, tc, desc);
    compare("da vs cpu", gpu.da, cpu.da, tc, desc);
    compare("db vs cpu", gpu.db, cpu.db, tc, desc);
    if (c.dstate_in) compare("ds0 vs cpu", gpu.ds0, cpu.ds0, tc, desc);

    // float64 reference: unpacked only (packed is checked against the CPU, which the CPU
    // suite checks against the reference)
    if (!packed) {
        std::vector<double> y, sT;
        ref_forward(k.d, y, sT);
        Rwkv7Grads gr = ref_backward(k.d, k.dy, c.dstate_out ? k.dsT : std::vector<double>());
        const double tf = is16 ? 5e-3 : 1e-4, tg = is16 ? 1e-2 : 1e-4;
        compare("y vs ref", gpu.y, y, tf, desc);
        if (c.state_out) compare("sT vs ref", gpu.sT, sT, tf, desc);
        compare("dr vs ref", gpu.dr, gr.dr, tg, desc);
        compare("dw vs ref", gpu.dw, gr.dw, tg, desc);
        compare("dk vs ref", gpu.dk, gr.dk, tg, desc);
        compare("dv vs ref", gpu.dv, gr.dv, tg, desc);
        compare("da vs ref", gpu.da, gr.da, tg, desc);
        compare("db vs ref", gpu.db, gr.db, tg, desc);
        if (c.dstate_in && c.state_in) compare("ds0 vs ref", gpu.ds0, gr.ds0, tg, desc);
    }
}

const wkv_dtype kDtypes[] = {WKV_DTYPE_F32, WKV_DTYPE_F16, WKV_DTYPE_BF16};
const int64_t kHeadSizes3[] = {64, 32, 128};
const wkv_decay_form kForms[] = {WKV_DECAY_CLAMPW, WKV_DECAY_LOG, WKV_DECAY_EXP_NEG_EXP, WKV_DECAY_DIRECT};

}  // namespace

// ------------------------------------------------------------------------------ golden files

namespace {

// One golden wkv7 file on CUDA in f32/f16/bf16, both state orders, forward and backward.
void check_golden_rwkv7(const std::string& path) {
    {
        SafeTensors f;
        INFO(path);
        REQUIRE_MESSAGE(f.load(path), f.error);
        Config c;
        c.B = std::stoll(f.meta("B"));
        c.T = std::stoll(f.meta("T"));
        c.H = std::stoll(f.meta("H"));
        c.N = std::stoll(f.meta("N"));
        const std::string form = f.meta("decay_form");
        c.form = form == "log" ? WKV_DECAY_LOG : form == "exp_neg_exp" ? WKV_DECAY_EXP_NEG_EXP
               : form == "clampw" ? WKV_DECAY_CLAMPW : WKV_DECAY_DIRECT;
        for (wkv_dtype dt : kDtypes)
            for (int km = 0; km < 2; km++) {
                c.dtype = dt;
                c.key_major = km != 0;
                Rwkv7Data d;
                d.B = c.B; d.T = c.T; d.H = c.H; d.N = c.N; d.form = c.form;
                d.r = f.at("r"); d.w = f.at("w"); d.k = f.at("k");
                d.v = f.at("v"); d.a = f.at("a"); d.b = f.at("b");
                d.s0 = f.at("s0");
                const bool is16 = dt.bits == 16;
                for (auto* x : d.inputs()) *x = rounded(dt, *x);
                std::vector<double> dy = rounded(dt, f.at("dy"));
                const std::vector<double>& dsT = f.at("dsT");
                Results got = run_backend(WKV_BACKEND_CUDA, c, d, dy, dsT);
                // references: the file's float64 for f32; libwkv's float64 reference on the
                // rounded inputs for 16-bit (as tools/common/golden.c does)
                std::vector<double> y = f.at("y"), sT = f.at("sT");
                Rwkv7Grads gr;
                gr.dr = f.at("dr"); gr.dw = f.at("dw"); gr.dk = f.at("dk"); gr.dv = f.at("dv");
                gr.da = f.at("da"); gr.db = f.at("db"); gr.ds0 = f.at("ds0");
                if (is16) {
                    ref_forward(d, y, sT);
                    gr = ref_backward(d, dy, dsT);
                }
                const double tf = is16 ? 5e-3 : 1e-4, tg = is16 ? 1e-2 : 1e-4;
                struct {
                    const char* n;
                    const std::vector<double>* got;
                    const std::vector<double>* ref;
                    double tol;
                } cmp[] = {{"y", &got.y, &y, tf},        {"sT", &got.sT, &sT, tf},
                           {"dr", &got.dr, &gr.dr, tg},   {"dw", &got.dw, &gr.dw, tg},
                           {"dk", &got.dk, &gr.dk, tg},   {"dv", &got.dv, &gr.dv, tg},
                           {"da", &got.da, &gr.da, tg},   {"db", &got.db, &gr.db, tg},
                           {"ds0", &got.ds0, &gr.ds0, tg}};
                double worst = 0.0;
                std::string worst_name;
                bool pass = true;
                for (auto& x : cmp) {
                    const double e = rel_err(*x.got, *x.ref);
                    if (!(e <= x.tol)) pass = false;
                    if (!(e <= worst)) {
                        worst = e;
                        worst_name = x.n;
                    }
                    CHECK_MESSAGE(e <= x.tol, path << " " << std::string(dtype_name(dt))
                                                   << std::string(km ? " key-major" : "") << ": "
                                                   << std::string(x.n) << " rel err " << e);
                }
                const std::string base = path.substr(path.find_last_of('/') + 1);
                std::ostringstream os;
                os << "golden " << (pass ? "PASS " : "FAIL ") << base << " " << dtype_name(dt)
                   << (km ? " key-major" : " value-major") << " max_rel_err=" << std::scientific
                   << std::setprecision(2) << worst << " (" << worst_name << ")";
                const std::string line = os.str();
                MESSAGE(line);
            }
    }
}

}  // namespace

TEST_CASE("cuda: every golden wkv7 file, f32/f16/bf16, both state orders") {
    CUDA_TEST_OR_SKIP();
    const std::string dir = golden_dir();
    for (const char* name : {"wkv7_log_N64", "wkv7_exp_neg_exp_N64", "wkv7_clampw_N64", "wkv7_direct_N64",
                             "wkv7_log_N32", "wkv7_log_N128", "wkv7_clampw_decode_T1", "wkv7_clampw_T200"})
        check_golden_rwkv7(dir + "/" + name + ".safetensors");
}

// ------------------------------------------------------------------------ random vs CPU

TEST_CASE("cuda: random inputs against the CPU backend and the reference: T x N x dtype x form") {
    CUDA_TEST_OR_SKIP();
    const uint64_t seed = test_seed();
    int n = 0;
    for (int64_t N : {32, 64, 128})
        for (int64_t T : {1, 2, 15, 16, 17, 100}) {
            Config c;
            c.B = 2;
            c.H = 2;
            c.T = T;
            c.N = N;
            c.dtype = kDtypes[n % 3];
            c.form = kForms[n % 4];
            // vary the state options; keep both on most of the time
            c.state_in = n % 5 != 1;
            c.state_out = n % 7 != 2;
            c.dstate_out = n % 3 != 2;
            c.dstate_in = c.state_in ? n % 4 != 3 : n % 2 == 0;
            check_config(c, seed + (uint64_t)n);
            n++;
        }
}

TEST_CASE("cuda: every dtype and decay form at N=64, T=33 (two checkpoint segments + a tail)") {
    CUDA_TEST_OR_SKIP();
    const uint64_t seed = test_seed();
    int n = 0;
    for (wkv_dtype dt : kDtypes)
        for (wkv_decay_form form : kForms) {
            Config c;
            c.B = 2;
            c.H = 3;
            c.T = 33;
            c.N = 64;
            c.dtype = dt;
            c.form = form;
            check_config(c, seed + 100 + (uint64_t)n++);
        }
}

TEST_CASE("cuda: strided views, broadcast w, padded and key-major states, in-place state") {
    CUDA_TEST_OR_SKIP();
    const uint64_t seed = test_seed();
    int n = 0;
    for (Layout l : {Layout::Contiguous, Layout::PaddedT, Layout::HeadMajor})
        for (int variant = 0; variant < 4; variant++) {
            Config c;
            c.B = 2;
            c.H = 2;
            c.T = 19;
            c.N = n % 2 ? 32 : 64;
            c.layout = l;
            c.dtype = kDtypes[(size_t)(n % 3)];
            c.form = kForms[(size_t)(n % 4)];
            c.w_broadcast = variant == 1;
            c.padded_state = variant == 2 || variant == 3;
            c.key_major = variant == 2 || variant == 0;
            c.in_place = variant == 3;
            check_config(c, seed + 200 + (uint64_t)n++);
        }
}

TEST_CASE("cuda: packed sequences (empty ones, segment edges, more than one launch)") {
    CUDA_TEST_OR_SKIP();
    const uint64_t seed = test_seed();
    {
        std::vector<int64_t> off = {0, 0, 5, 22, 22, 39, 72};
        Config c;
        c.B = 1;
        c.T = off.back();
        c.H = 2;
        c.N = 64;
        c.dtype = WKV_DTYPE_BF16;
        check_config(c, seed + 300, &off);
        c.dtype = WKV_DTYPE_F32;
        c.key_major = true;
        c.layout = Layout::HeadMajor;
        c.form = WKV_DECAY_LOG;
        check_config(c, seed + 301, &off);
    }
    {
        // 300 sequences: three launches of at most 128 sequences each
        Rng rng(seed + 302);
        std::vector<int64_t> off = {0};
        for (int s = 0; s < 300; s++) off.push_back(off.back() + rng.integer(0, 4));
        Config c;
        c.B = 1;
        c.T = off.back();
        c.H = 1;
        c.N = 32;
        c.dtype = WKV_DTYPE_F16;
        c.form = WKV_DECAY_EXP_NEG_EXP;
        check_config(c, seed + 303, &off);
    }
}

TEST_CASE("cuda: a long sequence (T=300) at N=128") {
    CUDA_TEST_OR_SKIP();
    Config c;
    c.B = 1;
    c.H = 1;
    c.T = 300;
    c.N = 128;
    check_config(c, test_seed() + 400);
}

// ------------------------------------------------------------- the chunked RWKV-7 forward

namespace {

// Sets WKV_CUDA_RWKV7_CHUNKED for the contexts created in its scope (the backend reads it at
// context creation), then restores the previous value.
struct ChunkedEnv {
    std::string old;
    bool had;
    explicit ChunkedEnv(const char* value) {
        const char* e = std::getenv("WKV_CUDA_RWKV7_CHUNKED");
        had = e != nullptr;
        if (had) old = e;
        setenv("WKV_CUDA_RWKV7_CHUNKED", value, 1);
    }
    ~ChunkedEnv() {
        if (had) setenv("WKV_CUDA_RWKV7_CHUNKED", old.c_str(), 1);
        else unsetenv("WKV_CUDA_RWKV7_CHUNKED");
    }
};

void check_caller_stream_and_graph(wkv_decay_form form);  // below, with the streams

}  // namespace

// backends/cuda/rwkv7_chunk.cu: N = 64, CLAMPW, unpacked; forced on wherever it applies. The
// backward (always the sequential checkpoint + replay) checks the same inputs alongside.
TEST_CASE("cuda: the chunked RWKV-7 forward (WKV_CUDA_RWKV7_CHUNKED=1): golden, random, layouts, graphs") {
    CUDA_TEST_OR_SKIP();
    const uint64_t seed = test_seed();
    {
        // the switch reaches the kernels: the two forwards round differently
        Rng rng(seed + 500);
        Config c;
        c.B = 1; c.H = 2; c.T = 100; c.N = 64;
        Case k = make_case(rng, c, c.B);
        Results seq, chk;
        {
            ChunkedEnv env("0");
            seq = run_backend(WKV_BACKEND_CUDA, c, k.d, k.dy, k.dsT);
        }
        {
            ChunkedEnv env("1");
            chk = run_backend(WKV_BACKEND_CUDA, c, k.d, k.dy, k.dsT);
        }
        CHECK_MESSAGE(seq.y != chk.y, "WKV_CUDA_RWKV7_CHUNKED=1 gave the sequential forward's bits");
        compare("y chunked vs sequential", chk.y, seq.y, 2e-5, c.describe());
        compare("sT chunked vs sequential", chk.sT, seq.sT, 2e-5, c.describe());
    }
    ChunkedEnv env("1");
    const std::string dir = golden_dir();
    for (const char* name : {"wkv7_clampw_N64", "wkv7_clampw_T200"})
        check_golden_rwkv7(dir + "/" + name + ".safetensors");
    int n = 0;
    // T around the chunk length (32), several chunks with a tail, every dtype, state options
    for (int64_t T : {2, 31, 32, 33, 64, 100, 257}) {
        Config c;
        c.B = 2;
        c.H = 3;
        c.T = T;
        c.N = 64;
        c.dtype = kDtypes[n % 3];
        c.state_in = n % 4 != 1;
        c.state_out = n % 5 != 2;
        check_config(c, seed + 510 + (uint64_t)n++);
    }
    for (Layout l : {Layout::PaddedT, Layout::HeadMajor})
        for (int variant = 0; variant < 4; variant++) {
            Config c;
            c.B = 2;
            c.H = 2;
            c.T = 45;
            c.N = 64;
            c.layout = l;
            c.dtype = kDtypes[(size_t)(n % 3)];
            c.w_broadcast = variant == 1;
            c.padded_state = variant == 2 || variant == 3;
            c.key_major = variant == 2 || variant == 0;
            c.in_place = variant == 3;
            check_config(c, seed + 510 + (uint64_t)n++);
        }
    check_caller_stream_and_graph(WKV_DECAY_CLAMPW);
}

// ------------------------------------------------------------------------ streams, graphs

namespace {

// A small RWKV-7 problem on the device: inputs, outputs, states and a workspace.
struct DeviceProblem {
    Config c;
    Rwkv7Data d;
    std::vector<HostTensor> in, g;
    HostTensor y, s0, s1, dy, dsT, ds0;
    std::vector<std::unique_ptr<DevMirror>> m;
    wkv_forward_desc f{};
    wkv_backward_desc bd{};
    void* ws = nullptr;

    DevMirror* mirror(HostTensor& t) {
        m.emplace_back(new DevMirror(t));
        return m.back().get();
    }
    void build(wkv_context* ctx, uint64_t seed) {
        Rng rng(seed);
        d = random_rwkv7(rng, c.B, c.T, c.H, c.N, c.form, true);
        in.resize(6);
        const std::vector<double>* vals[6] = {&d.r, &d.w, &d.k, &d.v, &d.a, &d.b};
        for (int i = 0; i < 6; i++) {
            in[(size_t)i] = HostTensor(c.dtype, {c.B, c.T, c.H, c.N});
            in[(size_t)i].fill(*vals[i]);
        }
        y = HostTensor(c.dtype, {c.B, c.T, c.H, c.N});
        y.poison();
        s0 = HostTensor(WKV_DTYPE_F32, {c.B, c.H, c.N, c.N});
        s0.fill(d.s0);
        s1 = HostTensor(WKV_DTYPE_F32, {c.B, c.H, c.N, c.N});
        s1.poison();
        dy = HostTensor(c.dtype, {c.B, c.T, c.H, c.N});
        dy.fill(random_normal(rng, d.tok_count()));
        dsT = HostTensor(WKV_DTYPE_F32, {c.B, c.H, c.N, c.N});
        dsT.fill(random_normal(rng, d.state_count()));
        ds0 = HostTensor(WKV_DTYPE_F32, {c.B, c.H, c.N, c.N});
        ds0.poison();
        g.resize(6);
        for (auto& t : g) {
            t = HostTensor(c.dtype, {c.B, c.T, c.H, c.N});
            t.poison();
        }
        f.struct_size = sizeof f;
        f.op = WKV_OP_RWKV7;
        f.decay_form = c.form;
        wkv_tensor* fin[6] = {&f.r, &f.w, &f.k, &f.v, &f.a, &f.b};
        for (int i = 0; i < 6; i++) *fin[i] = mirror(in[(size_t)i])->view();
        f.y = mirror(y)->view();
        f.state_in = mirror(s0)->view();
        f.state_out = mirror(s1)->view();
        bd.struct_size = sizeof bd;
        bd.forward = &f;
        bd.dy = mirror(dy)->view();
        bd.dstate_out = mirror(dsT)->view();
        wkv_tensor* gout[6] = {&bd.dr, &bd.dw, &bd.dk, &bd.dv, &bd.da, &bd.db};
        for (int i = 0; i < 6; i++) *gout[i] = mirror(g[(size_t)i])->view();
        bd.dstate_in = mirror(ds0)->view();
        size_t bytes = 0;
        REQUIRE(wkv_workspace_size(ctx, &bytes, &bd) == WKV_OK);
        CU(cudaMalloc(&ws, bytes));
        bd.workspace = ws;
        bd.workspace_size = bytes;
    }
    ~DeviceProblem() {
        if (ws) cudaFree(ws);
    }
    // Every output as bytes, downloaded.
    std::vector<unsigned char> outputs() {
        std::vector<unsigned char> all;
        for (auto& x : m) {
            x->download();
            all.insert(all.end(), x->h->buf.begin(), x->h->buf.end());
        }
        return all;
    }
};

}  // namespace

namespace {

// Memory allocation nodes in a captured graph (the pool's cudaMallocFromPoolAsync makes one).
size_t alloc_nodes(cudaGraph_t graph) {
    size_t n = 0;
    CU(cudaGraphGetNodes(graph, nullptr, &n));
    std::vector<cudaGraphNode_t> nodes(n);
    if (n) CU(cudaGraphGetNodes(graph, nodes.data(), &n));
    size_t allocs = 0;
    for (cudaGraphNode_t node : nodes) {
        cudaGraphNodeType type;
        CU(cudaGraphNodeGetType(node, &type));
        if (type == cudaGraphNodeTypeMemAlloc) ++allocs;
    }
    return allocs;
}

}  // namespace

// wkv_forward_desc.scratch: the chunked forward's workspace from the caller instead of the
// context's pool. Same bits as the pool path, whatever the scratch held (poisoned) and wherever
// it starts (misaligned); nothing written past the size asked for; a captured graph holds no
// allocation; bad scratch refused naming it; 0 bytes where the sequential forward runs.
TEST_CASE("cuda: the chunked RWKV-7 forward on the caller's scratch: the pool path's bits, no allocation") {
    CUDA_TEST_OR_SKIP();
    ChunkedEnv env("1");
    CudaContext cc;
    DeviceProblem p;
    p.c.B = 2; p.c.T = 100; p.c.H = 3; p.c.N = 64; p.c.dtype = WKV_DTYPE_F16;  // CLAMPW
    p.build(cc.ctx, test_seed() + 600);
    auto poison_outputs = [&] {
        for (auto& m : p.m)
            if (m->h == &p.y || m->h == &p.s1) {
                m->h->poison();
                m->upload();
            }
    };
    size_t need = 0;
    REQUIRE(wkv_forward_scratch_size(cc.ctx, &need, &p.f) == WKV_OK);
    CHECK(need >= (size_t)(p.c.B * p.c.T * p.c.H) * 1024);  // ~1.5 KB per token and head
    {
        ChunkedEnv never("0");
        CudaContext seq;
        size_t none = 1;
        REQUIRE(wkv_forward_scratch_size(seq.ctx, &none, &p.f) == WKV_OK);
        CHECK(none == 0);
    }
    REQUIRE(wkv_forward(cc.ctx, &p.f) == WKV_OK);  // the pool
    cc.sync();
    const std::vector<unsigned char> pooled = p.outputs();

    // a device pointer one byte past an allocation's start, poisoned, with a guard zone after
    void* alloc = nullptr;
    CU(cudaMalloc(&alloc, need + 1 + kGuard));
    std::unique_ptr<void, cudaError_t (*)(void*)> hold(alloc, cudaFree);
    char* base = static_cast<char*>(alloc);
    CU(cudaMemset(base, 0xff, need + 1));  // NaN in every float
    std::vector<unsigned char> g(kGuard);
    for (size_t i = 0; i < kGuard; i++) g[i] = guard_byte(i);
    CU(cudaMemcpy(base + 1 + need, g.data(), kGuard, cudaMemcpyHostToDevice));
    CU(cudaDeviceSynchronize());
    poison_outputs();
    p.f.scratch = base + 1;
    p.f.scratch_size = need;
    REQUIRE(wkv_forward(cc.ctx, &p.f) == WKV_OK);
    cc.sync();
    CHECK(p.outputs() == pooled);
    std::vector<unsigned char> after(kGuard);
    CU(cudaMemcpy(after.data(), base + 1 + need, kGuard, cudaMemcpyDeviceToHost));
    CHECK(after == g);

    // in a wkv_buffer of the context
    wkv_buffer* buf = nullptr;
    REQUIRE(wkv_buffer_create(cc.ctx, need, &buf) == WKV_OK);
    poison_outputs();
    p.f.scratch = buf;
    REQUIRE(wkv_forward(cc.ctx, &p.f) == WKV_OK);
    cc.sync();
    CHECK(p.outputs() == pooled);
    wkv_buffer_destroy(buf);

    // bad scratch: refused before anything runs, the message naming it
    std::vector<unsigned char> host(need);
    const struct {
        void* ptr;
        size_t size;
        wkv_status want;
        const char* needle;
    } bad[] = {{base + 1, need - 1, WKV_ERROR_WORKSPACE_TOO_SMALL, "desc->scratch_size"},
               {host.data(), need, WKV_ERROR_DEVICE_MISMATCH, "desc->scratch is host memory"},
               {nullptr, need, WKV_ERROR_NULL_POINTER, "desc->scratch is NULL"},
               // (need bytes from y may reach another tensor's allocation too: any name will do)
               {const_cast<void*>(p.f.y.data), need, WKV_ERROR_ALIASING, "desc->scratch overlaps desc->"}};
    for (const auto& x : bad) {
        p.f.scratch = x.ptr;
        p.f.scratch_size = x.size;
        const wkv_status got = wkv_forward(cc.ctx, &p.f);
        const std::string msg = wkv_last_error(cc.ctx);
        CAPTURE(msg);
        CHECK(got == x.want);
        CHECK(msg.find(x.needle) != std::string::npos);
    }

    // captured into a CUDA graph on the caller's stream: no allocation node with the scratch,
    // one from the pool without it; replays give the same bits
    cudaStream_t mine = nullptr;
    CU(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking));
    REQUIRE(wkv_cuda_set_stream(cc.ctx, mine) == WKV_OK);
    for (const bool caller : {true, false}) {
        CAPTURE(caller);
        poison_outputs();
        p.f.scratch = caller ? base + 1 : nullptr;
        p.f.scratch_size = caller ? need : 0;
        cudaGraph_t graph = nullptr;
        CU(cudaStreamBeginCapture(mine, cudaStreamCaptureModeGlobal));
        const wkv_status st = wkv_forward(cc.ctx, &p.f);
        CU(cudaStreamEndCapture(mine, &graph));
        INFO(wkv_last_error(cc.ctx));
        REQUIRE(st == WKV_OK);
        if (caller) CHECK(alloc_nodes(graph) == 0);
        else CHECK(alloc_nodes(graph) >= 1);
        cudaGraphExec_t exec = nullptr;
        CU(cudaGraphInstantiate(&exec, graph, 0));
        CU(cudaGraphLaunch(exec, mine));
        CU(cudaGraphLaunch(exec, mine));
        CU(cudaStreamSynchronize(mine));
        CHECK(p.outputs() == pooled);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
    }
    REQUIRE(wkv_cuda_set_stream(cc.ctx, nullptr) == WKV_OK);
    cudaStreamDestroy(mine);
    p.f.scratch = nullptr;
    p.f.scratch_size = 0;
}

TEST_CASE("cuda: the context's own stream is non-blocking; results are deterministic") {
    CUDA_TEST_OR_SKIP();
    CudaContext cc;
    cudaStream_t s = nullptr;
    REQUIRE(wkv_cuda_get_stream(cc.ctx, &s) == WKV_OK);
    REQUIRE(s != nullptr);
    unsigned flags = 0;
    CU(cudaStreamGetFlags(s, &flags));
    CHECK((flags & cudaStreamNonBlocking) != 0);

    DeviceProblem p;
    p.c.B = 3; p.c.T = 40; p.c.H = 2; p.c.N = 64; p.c.dtype = WKV_DTYPE_BF16;
    p.build(cc.ctx, test_seed());
    REQUIRE(wkv_forward(cc.ctx, &p.f) == WKV_OK);
    REQUIRE(wkv_backward(cc.ctx, &p.bd) == WKV_OK);
    cc.sync();
    std::vector<unsigned char> first = p.outputs();
    REQUIRE(wkv_forward(cc.ctx, &p.f) == WKV_OK);
    REQUIRE(wkv_backward(cc.ctx, &p.bd) == WKV_OK);
    cc.sync();
    CHECK(p.outputs() == first);  // bit-identical
}

namespace {

// Forward + backward on the context's stream, then on a stream of the caller's, captured into
// a CUDA graph and replayed twice: the same bits.
void check_caller_stream_and_graph(wkv_decay_form form) {
    CudaContext cc;
    DeviceProblem p;
    p.c.B = 2; p.c.T = 37; p.c.H = 3; p.c.N = 64; p.c.dtype = WKV_DTYPE_F16;
    p.c.form = form;
    p.build(cc.ctx, test_seed());
    REQUIRE(wkv_forward(cc.ctx, &p.f) == WKV_OK);
    REQUIRE(wkv_backward(cc.ctx, &p.bd) == WKV_OK);
    cc.sync();
    const std::vector<unsigned char> direct = p.outputs();

    cudaStream_t mine = nullptr;
    CU(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking));
    REQUIRE(wkv_cuda_set_stream(cc.ctx, mine) == WKV_OK);
    cudaStream_t back = nullptr;
    REQUIRE(wkv_cuda_get_stream(cc.ctx, &back) == WKV_OK);
    CHECK(back == mine);

    // poison the outputs, then capture forward + backward and replay the graph twice
    for (auto& m : p.m) {
        HostTensor* h = m->h;
        if (h == &p.y || h == &p.s1 || h == &p.ds0 ||
            std::any_of(p.g.begin(), p.g.end(), [&](const HostTensor& t) { return &t == h; })) {
            h->poison();
            m->upload();
        }
    }
    cudaGraph_t graph = nullptr;
    CU(cudaStreamBeginCapture(mine, cudaStreamCaptureModeGlobal));
    const wkv_status s1 = wkv_forward(cc.ctx, &p.f);
    const wkv_status s2 = wkv_backward(cc.ctx, &p.bd);
    CU(cudaStreamEndCapture(mine, &graph));
    INFO(wkv_last_error(cc.ctx));
    REQUIRE(s1 == WKV_OK);
    REQUIRE(s2 == WKV_OK);
    cudaGraphExec_t exec = nullptr;
    CU(cudaGraphInstantiate(&exec, graph, 0));
    CU(cudaGraphLaunch(exec, mine));
    CU(cudaGraphLaunch(exec, mine));
    CU(cudaStreamSynchronize(mine));
    CHECK(p.outputs() == direct);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    REQUIRE(wkv_cuda_set_stream(cc.ctx, nullptr) == WKV_OK);  // legacy default, explicitly
    cudaStreamDestroy(mine);
}

}  // namespace

TEST_CASE("cuda: the caller's stream, and capture into a CUDA graph") {
    CUDA_TEST_OR_SKIP();
    check_caller_stream_and_graph(WKV_DECAY_LOG);
}

TEST_CASE("cuda: T one-token calls in place equal one T-token call, bit for bit") {
    CUDA_TEST_OR_SKIP();
    CudaContext cc;
    Config c;
    // 320 (sequence, head) blocks: on a GPU of at most 160 SMs (an H100: 132) the T = 1 calls
    // take the decode kernel with 2 rows per thread and the T = 9 call the chunked kernel with
    // 1 (backends/cuda/rwkv7.cu, forward_rows): the two must agree bit for bit all the same.
    c.B = 160; c.T = 9; c.H = 2; c.N = 64;
    Rng rng(test_seed());
    Rwkv7Data d = random_rwkv7(rng, c.B, c.T, c.H, c.N, c.form, true);
    const std::vector<double>* vals[6] = {&d.r, &d.w, &d.k, &d.v, &d.a, &d.b};
    std::vector<HostTensor> in(6);
    std::vector<std::unique_ptr<DevMirror>> m;
    for (int i = 0; i < 6; i++) {
        in[(size_t)i] = HostTensor(WKV_DTYPE_F32, {c.B, c.T, c.H, c.N});
        in[(size_t)i].fill(*vals[i]);
        m.emplace_back(new DevMirror(in[(size_t)i]));
    }
    HostTensor state(WKV_DTYPE_F32, {c.B, c.H, c.N, c.N}), state2(WKV_DTYPE_F32, {c.B, c.H, c.N, c.N});
    state.fill(d.s0);
    state2.fill(d.s0);
    HostTensor y(WKV_DTYPE_F32, {c.B, c.T, c.H, c.N}), y1(WKV_DTYPE_F32, {c.B, 1, c.H, c.N});
    DevMirror ds(state), ds2(state2), dyo(y), dy1(y1);
    // all at once
    wkv_forward_desc f{};
    f.struct_size = sizeof f;
    f.op = WKV_OP_RWKV7;
    f.decay_form = c.form;
    f.r = m[0]->view(); f.w = m[1]->view(); f.k = m[2]->view();
    f.v = m[3]->view(); f.a = m[4]->view(); f.b = m[5]->view();
    f.y = dyo.view();
    f.state_in = f.state_out = ds.view();
    REQUIRE(wkv_forward(cc.ctx, &f) == WKV_OK);
    // one token at a time: views of token t ([B,1,H,N] with the full tensor's strides)
    const int64_t one_shape[4] = {c.B, 1, c.H, c.N};
    const int64_t tok_strides[4] = {c.T * c.H * c.N, c.H * c.N, c.N, 1};
    for (int64_t t = 0; t < c.T; t++) {
        wkv_forward_desc g = f;
        wkv_tensor* xs[6] = {&g.r, &g.w, &g.k, &g.v, &g.a, &g.b};
        for (int i = 0; i < 6; i++) {
            xs[i]->shape = one_shape;
            xs[i]->strides = tok_strides;
            xs[i]->byte_offset = (uint64_t)(t * c.H * c.N) * 4u;
        }
        g.y = dy1.view();
        g.state_in = g.state_out = ds2.view();
        REQUIRE(wkv_forward(cc.ctx, &g) == WKV_OK);
    }
    cc.sync();
    ds.download();
    ds2.download();
    CHECK(state.buf == state2.buf);
}

TEST_CASE("cuda: unsupported head sizes and misplaced memory are refused with a message") {
    CUDA_TEST_OR_SKIP();
    CudaContext cc;
    for (int64_t N : {16, 48, 256}) {
        Config c;
        c.N = N;
        c.T = 3;
        HostTensor x(WKV_DTYPE_F32, {1, 3, 1, N});
        DevMirror dx(x);
        wkv_forward_desc f{};
        f.struct_size = sizeof f;
        f.op = WKV_OP_RWKV7;
        f.decay_form = WKV_DECAY_LOG;
        HostTensor yh(WKV_DTYPE_F32, {1, 3, 1, N});
        DevMirror dyy(yh);
        f.r = f.w = f.k = f.v = f.a = f.b = dx.view();
        f.y = dyy.view();
        CHECK(wkv_forward(cc.ctx, &f) == WKV_ERROR_UNSUPPORTED);
        CHECK(std::string(wkv_last_error(cc.ctx)).find("head size") != std::string::npos);
    }
    // RWKV-6 with a head size other than 32, 64, 128
    {
        HostTensor x(WKV_DTYPE_F32, {1, 2, 1, 48}), u(WKV_DTYPE_F32, {1, 48});
        DevMirror dx(x), du(u);
        HostTensor yh(WKV_DTYPE_F32, {1, 2, 1, 48});
        DevMirror dyy(yh);
        wkv_forward_desc f{};
        f.struct_size = sizeof f;
        f.op = WKV_OP_RWKV6;
        f.decay_form = WKV_DECAY_LOG;
        f.r = f.w = f.k = f.v = dx.view();
        f.u = du.view();
        f.y = dyy.view();
        CHECK(wkv_forward(cc.ctx, &f) == WKV_ERROR_UNSUPPORTED);
        CHECK(std::string(wkv_last_error(cc.ctx)).find("head size") != std::string::npos);
    }
    // Vulkan memory on a CUDA context: refused by the core; host tensors: staged
    {
        HostTensor x(WKV_DTYPE_F32, {1, 2, 1, 64}), yh(WKV_DTYPE_F32, {1, 2, 1, 64});
        x.fill(std::vector<double>(128, 0.25));
        yh.poison();
        wkv_forward_desc f{};
        f.struct_size = sizeof f;
        f.op = WKV_OP_RWKV7;
        f.decay_form = WKV_DECAY_LOG;
        f.r = f.w = f.k = f.v = f.a = f.b = x.view();
        f.y = yh.view();
        f.y.device.type = WKV_DEVICE_VULKAN;
        CHECK(wkv_forward(cc.ctx, &f) == WKV_ERROR_DEVICE_MISMATCH);
        CHECK(std::string(wkv_last_error(cc.ctx)).find("desc->y.device") != std::string::npos);
        for (double v : yh.read()) CHECK(std::isnan(v));
        f.y = yh.view();
        CHECK(wkv_forward(cc.ctx, &f) == WKV_OK);
        for (double v : yh.read()) CHECK(std::isfinite(v));
    }
    // a host workspace (pageable or pinned): replaced by device scratch, its bytes untouched
    {
        DeviceProblem p;
        p.c.B = 1; p.c.T = 5; p.c.H = 1; p.c.N = 32;
        p.build(cc.ctx, test_seed());
        REQUIRE(wkv_backward(cc.ctx, &p.bd) == WKV_OK);
        cc.sync();
        const std::vector<unsigned char> ref = p.outputs();
        std::vector<unsigned char> host(p.bd.workspace_size, 0xAB);
        wkv_backward_desc bd = p.bd;
        bd.workspace = host.data();
        CHECK(wkv_backward(cc.ctx, &bd) == WKV_OK);
        CHECK(std::all_of(host.begin(), host.end(), [](unsigned char b) { return b == 0xAB; }));
        CHECK(p.outputs() == ref);
        unsigned char* pinned = nullptr;
        CU(cudaMallocHost(reinterpret_cast<void**>(&pinned), p.bd.workspace_size));
        std::memset(pinned, 0xCD, p.bd.workspace_size);
        bd.workspace = pinned;
        CHECK(wkv_backward(cc.ctx, &bd) == WKV_OK);
        CHECK(std::all_of(pinned, pinned + p.bd.workspace_size, [](unsigned char b) { return b == 0xCD; }));
        CHECK(p.outputs() == ref);
        cudaFreeHost(pinned);
    }
}

// --------------------------------------------------------- host memory, buffers, synchronize

namespace {

// The same call with its tensors in each memory kind: device pointers, host memory (staged by
// the plugin, synchronous), wkv_buffers, a mix of the three. Same kernels on the same inputs:
// the results must be bit-identical.
void check_memory_kinds(const Config& c, uint64_t seed, const std::vector<int64_t>* offsets = nullptr) {
    Rng rng(seed);
    const bool packed = offsets != nullptr;
    const int64_t S = packed ? (int64_t)offsets->size() - 1 : c.B;
    Case k = make_case(rng, c, c.B);
    std::vector<double> dsT = k.dsT;
    if (packed) {
        k.d.s0 = c.state_in ? rounded(WKV_DTYPE_F32, random_normal(rng, (size_t)(S * c.H * c.N * c.N)))
                            : std::vector<double>((size_t)(S * c.H * c.N * c.N), 0.0);
        dsT = rounded(WKV_DTYPE_F32, random_normal(rng, (size_t)(S * c.H * c.N * c.N)));
    }
    const int64_t* off = packed ? offsets->data() : nullptr;
    const int64_t ns = packed ? S : 0;
    const Results dev = run_backend(WKV_BACKEND_CUDA, c, k.d, k.dy, dsT, off, ns, Mem::Device);
    for (Mem m : {Mem::Host, Mem::Buffer, Mem::Mixed}) {
        INFO(c.describe() << " seed=" << seed << (packed ? " packed" : "") << " memory=" << mem_name(m));
        const Results got = run_backend(WKV_BACKEND_CUDA, c, k.d, k.dy, dsT, off, ns, m);
        CHECK(got.y == dev.y);
        CHECK(got.sT == dev.sT);
        CHECK(got.dr == dev.dr);
        CHECK(got.dw == dev.dw);
        CHECK(got.dk == dev.dk);
        CHECK(got.dv == dev.dv);
        CHECK(got.da == dev.da);
        CHECK(got.db == dev.db);
        CHECK(got.ds0 == dev.ds0);
    }
}

}  // namespace

TEST_CASE("cuda: host tensors, wkv_buffers and a mix give the device-pointer results, bit for bit") {
    CUDA_TEST_OR_SKIP();
    const uint64_t seed = test_seed();
    int n = 0;
    for (Layout l : {Layout::Contiguous, Layout::PaddedT, Layout::HeadMajor})
        for (int variant = 0; variant < 4; variant++) {
            Config c;
            c.B = 2;
            c.H = 2;
            c.T = 19 + n;
            c.N = kHeadSizes3[n % 3];
            c.layout = l;
            c.dtype = kDtypes[(size_t)(n % 3)];
            c.form = kForms[(size_t)(n % 4)];
            c.w_broadcast = variant == 1;
            c.padded_state = variant == 2 || variant == 3;
            c.key_major = variant == 2;
            c.in_place = variant == 3;
            c.state_in = variant != 1;
            c.dstate_out = variant != 2;
            check_memory_kinds(c, seed + 500 + (uint64_t)n++);
        }
    std::vector<int64_t> off = {0, 0, 5, 22, 22, 39, 72};
    Config c;
    c.B = 1;
    c.T = off.back();
    c.H = 2;
    c.N = 64;
    c.dtype = WKV_DTYPE_BF16;
    check_memory_kinds(c, seed + 550, &off);
}

TEST_CASE("cuda: buffers: zero-filled, upload/download, and the core's checks of buffer tensors") {
    CUDA_TEST_OR_SKIP();
    CudaContext cc;
    wkv_context* ctx = cc.ctx;
    {
        wkv_buffer* b = nullptr;
        REQUIRE(wkv_buffer_create(ctx, 1001, &b) == WKV_OK);
        CHECK(wkv_buffer_size(b) == 1001);
        std::vector<unsigned char> got(1001, 0xab), data(1001);
        REQUIRE(wkv_buffer_download(ctx, b, 0, got.data(), got.size()) == WKV_OK);
        CHECK(got == std::vector<unsigned char>(1001, 0));
        for (size_t i = 0; i < data.size(); i++) data[i] = static_cast<unsigned char>(i * 7 + 3);
        REQUIRE(wkv_buffer_upload(ctx, b, 0, data.data(), data.size()) == WKV_OK);
        REQUIRE(wkv_buffer_upload(ctx, b, 13, data.data(), 5) == WKV_OK);
        for (size_t i = 0; i < 5; i++) data[13 + i] = data[i];
        REQUIRE(wkv_buffer_download(ctx, b, 0, got.data(), got.size()) == WKV_OK);
        CHECK(got == data);
        CHECK(wkv_buffer_upload(ctx, b, 1000, data.data(), 2) == WKV_ERROR_INVALID_ARGUMENT);
        CHECK(wkv_buffer_download(ctx, b, 0, nullptr, 4) == WKV_ERROR_NULL_POINTER);
        wkv_buffer_destroy(b);
    }
    const int64_t B = 1, T = 3, H = 1, N = 32, E = B * T * H * N;
    int64_t shape[4] = {B, T, H, N};
    wkv_buffer* buf = nullptr;
    REQUIRE(wkv_buffer_create(ctx, 8 * E * 4, &buf) == WKV_OK);
    {
        std::vector<float> ones(8 * E, 0.5f);
        REQUIRE(wkv_buffer_upload(ctx, buf, 0, ones.data(), ones.size() * 4) == WKV_OK);
    }
    wkv_forward_desc f{};
    f.struct_size = sizeof f;
    f.op = WKV_OP_RWKV7;
    f.decay_form = WKV_DECAY_LOG;
    wkv_tensor* t[7] = {&f.r, &f.w, &f.k, &f.v, &f.a, &f.b, &f.y};
    for (int i = 0; i < 7; i++) *t[i] = wkv_tensor_make_buffer(buf, static_cast<uint64_t>(i) * E * 4, WKV_DTYPE_F32, 4, shape);
    CHECK(f.y.device.type == WKV_DEVICE_CUDA);
    CHECK(wkv_forward(ctx, &f) == WKV_OK);
    CHECK(wkv_context_synchronize(ctx) == WKV_OK);
    // y past the end of the buffer
    f.y.byte_offset = 7 * E * 4 + 4;
    CHECK(wkv_forward(ctx, &f) == WKV_ERROR_SHAPE);
    CHECK(std::string(wkv_last_error(ctx)).find("desc->y") != std::string::npos);
    // not a multiple of the element size
    f.y.byte_offset = 6 * E * 4 + 2;
    CHECK(wkv_forward(ctx, &f) == WKV_ERROR_INVALID_ARGUMENT);
    // y overlapping an input in the same buffer
    f.y.byte_offset = 5 * E * 4 + 4;
    CHECK(wkv_forward(ctx, &f) == WKV_ERROR_ALIASING);
    f.y.byte_offset = 6 * E * 4;
    // a buffer of another CUDA context
    wkv_tensor good = f.r;
    {
        CudaContext other;
        wkv_buffer* foreign = nullptr;
        REQUIRE(wkv_buffer_create(other.ctx, 8 * E * 4, &foreign) == WKV_OK);
        f.r.data = foreign;
        CHECK(wkv_forward(ctx, &f) == WKV_ERROR_DEVICE_MISMATCH);
        CHECK(std::string(wkv_last_error(ctx)).find("another context") != std::string::npos);
        f.r = good;
        wkv_buffer_destroy(foreign);
    }
    // a device pointer (device.type CUDA too) works beside buffer tensors
    void* dptr = nullptr;
    CU(cudaMalloc(&dptr, E * 4));
    CU(cudaMemset(dptr, 0, E * 4));
    CU(cudaDeviceSynchronize());  // the memset is on the legacy stream (wkv_cuda.h)
    f.r = wkv_tensor_make(dptr, WKV_DTYPE_F32, 4, shape);
    f.r.device.type = WKV_DEVICE_CUDA;
    CHECK(wkv_forward(ctx, &f) == WKV_OK);
    CHECK(wkv_context_synchronize(ctx) == WKV_OK);
    cudaFree(dptr);
    f.r = good;
    // workspace buffers: too small, larger than the buffer, right; not one holding a tensor
    wkv_backward_desc bd{};
    bd.struct_size = sizeof bd;
    bd.forward = &f;
    bd.dy = f.y;
    wkv_buffer* grads = nullptr;
    REQUIRE(wkv_buffer_create(ctx, 6 * E * 4, &grads) == WKV_OK);
    wkv_tensor* gt[6] = {&bd.dr, &bd.dw, &bd.dk, &bd.dv, &bd.da, &bd.db};
    for (int i = 0; i < 6; i++) *gt[i] = wkv_tensor_make_buffer(grads, static_cast<uint64_t>(i) * E * 4, WKV_DTYPE_F32, 4, shape);
    size_t need = 0;
    REQUIRE(wkv_workspace_size(ctx, &need, &bd) == WKV_OK);
    wkv_buffer* ws = nullptr;
    REQUIRE(wkv_buffer_create(ctx, need, &ws) == WKV_OK);
    bd.workspace = ws;
    bd.workspace_size = need - 4;
    CHECK(wkv_backward(ctx, &bd) == WKV_ERROR_WORKSPACE_TOO_SMALL);
    bd.workspace_size = need + 4;
    CHECK(wkv_backward(ctx, &bd) == WKV_ERROR_SHAPE);
    bd.workspace_size = need;
    CHECK(wkv_backward(ctx, &bd) == WKV_OK);
    bd.workspace = grads;
    CHECK(wkv_backward(ctx, &bd) != WKV_OK);
    CHECK(wkv_context_synchronize(ctx) == WKV_OK);
    std::vector<float> g(6 * E);
    REQUIRE(wkv_buffer_download(ctx, grads, 0, g.data(), g.size() * 4) == WKV_OK);
    for (float x : g) CHECK(std::isfinite(x));
    wkv_buffer_destroy(ws);
    wkv_buffer_destroy(grads);
    // left for wkv_context_destroy to free
    (void)buf;
}

TEST_CASE("cuda: wkv_context_synchronize waits for the context's stream") {
    CUDA_TEST_OR_SKIP();
    CudaContext cc;
    DeviceProblem p;
    p.c.B = 4; p.c.T = 1024; p.c.H = 8; p.c.N = 64; p.c.dtype = WKV_DTYPE_BF16;
    p.build(cc.ctx, test_seed());
    cudaStream_t s = nullptr;
    REQUIRE(wkv_cuda_get_stream(cc.ctx, &s) == WKV_OK);
    for (int round = 0; round < 2; round++) {
        if (round == 1) {  // the caller's stream
            CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
            REQUIRE(wkv_cuda_set_stream(cc.ctx, s) == WKV_OK);
        }
        for (int i = 0; i < 3; i++) {
            REQUIRE(wkv_forward(cc.ctx, &p.f) == WKV_OK);
            REQUIRE(wkv_backward(cc.ctx, &p.bd) == WKV_OK);
        }
        CHECK(wkv_context_synchronize(cc.ctx) == WKV_OK);
        CHECK(cudaStreamQuery(s) == cudaSuccess);
        CHECK(std::string(wkv_last_error(cc.ctx)).empty());
    }
    REQUIRE(wkv_cuda_set_stream(cc.ctx, nullptr) == WKV_OK);
    cudaStreamDestroy(s);
    CHECK(wkv_context_synchronize(cc.ctx) == WKV_OK);
}

TEST_CASE("cuda: backend info and device info") {
    CUDA_TEST_OR_SKIP();
    wkv_backend_info info{};
    info.struct_size = sizeof info;
    REQUIRE(wkv_backend_get_info(WKV_BACKEND_CUDA, &info) == WKV_OK);
    CHECK(info.available == 1);
    CHECK(info.num_head_sizes == 3);
    wkv_device_info di{};
    di.struct_size = sizeof di;
    REQUIRE(wkv_device_get_info(WKV_BACKEND_CUDA, 0, &di) == WKV_OK);
    MESSAGE("device 0: " << std::string(di.name) << ", " << (di.memory_bytes >> 20) << " MiB, " << di.compute_units << " SMs");
    CHECK(wkv_device_get_info(WKV_BACKEND_CUDA, 1000, &di) == WKV_ERROR_INVALID_ARGUMENT);
}

#endif  // WKV_TEST_CUDA_RUNTIME
