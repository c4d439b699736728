// The CUDA backend's runtime contract (part of wkv_cuda_tests): the context's non-blocking
// stream and determinism; the caller's stream and CUDA-graph capture; unsupported head sizes and
// misplaced memory refused with a message; host tensors, wkv_buffers and a mix giving the
// device-pointer results bit for bit; buffers; wkv_context_synchronize; backend and device info.
#include "wkv_doctest.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "rwkv7_harness.h"

using namespace cudatest;

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

TEST_CASE("cuda: the caller's stream, and capture into a CUDA graph") {
    CUDA_TEST_OR_SKIP();
    check_caller_stream_and_graph(WKV_DECAY_LOG);
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
        INFO(c.describe() << " seed=" << seed << std::string(packed ? " packed" : "") << " memory=" << std::string(mem_name(m)));
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
    for (Layout l : {Layout::Contiguous, Layout::PaddedT, Layout::Transposed})
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
