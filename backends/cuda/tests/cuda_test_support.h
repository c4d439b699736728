// What every wkv_cuda_tests file shares: whether a CUDA device is there (else each case skips,
// counted for cuda_test_main.cpp's exit code 77), a check of CUDA runtime calls, and copies of
// host tensors in device memory or in wkv_buffers with a guard zone after them.
#ifndef WKV_CUDA_TEST_SUPPORT_H
#define WKV_CUDA_TEST_SUPPORT_H

#include "wkv_doctest.h"

#include <cuda_runtime_api.h>

#include <string>

#include "test_util.h"
#include "wkv/wkv.h"
#include "wkv/wkv_cuda.h"

// Set by cuda_test_main.cpp's main: how many cases skipped for want of a device, and ran.
extern int g_wkv_cuda_skipped;
extern int g_wkv_cuda_ran;

namespace cudatest {

using namespace wkvtest;

// NULL when a CUDA device and the cuda backend are usable, else why not.
const char* cuda_unavailable_reason();

#define CUDA_TEST_OR_SKIP()                                                        \
    do {                                                                           \
        if (const char* why_ = cudatest::cuda_unavailable_reason()) {              \
            MESSAGE("SKIPPED: no CUDA device (" << std::string(why_) << ")");      \
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
inline unsigned char guard_byte(size_t i) { return (unsigned char)(0x5Au ^ (i * 13u)); }

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
        INFO(std::string(wkv_last_error(ctx)));
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

const char* mem_name(Mem m);

struct CudaContext {
    wkv_context* ctx = nullptr;
    CudaContext() {
        wkv_context_options o{};
        o.struct_size = sizeof o;
        o.backend = WKV_BACKEND_CUDA;
        const wkv_status st = wkv_context_create(&o, &ctx);
        INFO(std::string(wkv_last_error(nullptr)));
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


}  // namespace cudatest

#endif  // WKV_CUDA_TEST_SUPPORT_H
