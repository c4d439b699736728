// RWKV-7 single-token decode on the CUDA backend (part of wkv_cuda_tests): a T = 1 forward on
// device memory is exactly one kernel node when captured into a CUDA graph (no copy, memset or
// allocation node: what a decode loop replays is that one kernel), its replays give the direct
// call's bits, and both agree with the float64 reference; the same step through head-padded
// views (the kernel's general form; at B = 1 and 3 the direct call took the dense one:
// backends/cuda/rwkv7.cu, DecodeDense) and as B packed one-token sequences (the sequential
// forward kernel, whole heads) gives the same bits. B = 1 and 3 take the decode kernel with one
// row per thread, a head's rows split over 4 blocks (N = 32: 2; N = 64 at B = 1 on a GPU of 64
// SMs or more: 8 one-warp blocks, 4 lanes per row, the same sums); B = 256 (512 heads) the one
// with two rows per thread, whole heads (decode_layout; the general form
// only); N = 32 / 64 / 128; f32 and bf16 inputs; clampw, and at N = 64 the other decay forms;
// state_in and state_out apart (so a replay recomputes the same step) or one buffer. And T one-token calls in place (views of a T-token
// tensor: the general form) give one T-token call's bits (y and state). Outputs are NaN-filled
// before every call.
#include "wkv_doctest.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "test_util.h"
#include "wkv/wkv_cuda.h"

extern int g_wkv_cuda_skipped;
extern int g_wkv_cuda_ran;

using namespace wkvtest;

namespace {

bool decode_cuda_available() {
    wkv_backend_info info{};
    info.struct_size = sizeof info;
    return wkv_backend_get_info(WKV_BACKEND_CUDA, &info) == WKV_OK && info.available;
}

#define DEC_CU(x) REQUIRE((x) == cudaSuccess)

// A host tensor and its device copy.
struct Dev {
    HostTensor h;
    void* d = nullptr;
    explicit Dev(HostTensor t) : h(std::move(t)) {
        DEC_CU(cudaMalloc(&d, h.buf.size()));
        upload();
    }
    ~Dev() { cudaFree(d); }
    Dev(const Dev&) = delete;
    Dev& operator=(const Dev&) = delete;
    void upload() { DEC_CU(cudaMemcpy(d, h.buf.data(), h.buf.size(), cudaMemcpyHostToDevice)); }
    // all-ones bits: NaN in f32/bf16. cudaMemset runs on the legacy stream, which the test's
    // non-blocking stream does not wait for: without the synchronisation a late memset could
    // overwrite what the next kernel writes (seen at B = 256: 2 MiB states).
    void poison() {
        DEC_CU(cudaMemset(d, 0xff, h.buf.size()));
        DEC_CU(cudaDeviceSynchronize());
    }
    std::vector<unsigned char> bytes() const {
        std::vector<unsigned char> b(h.buf.size());
        DEC_CU(cudaMemcpy(b.data(), d, b.size(), cudaMemcpyDeviceToHost));
        return b;
    }
    std::vector<double> values() const {
        HostTensor t = h;
        DEC_CU(cudaMemcpy(t.buf.data(), d, t.buf.size(), cudaMemcpyDeviceToHost));
        return t.read();
    }
    wkv_tensor view() {
        wkv_tensor t = h.view();
        t.data = d;
        t.device.type = WKV_DEVICE_CUDA;
        t.device.id = 0;
        return t;
    }
};

void check_decode(wkv_context* ctx, cudaStream_t stream, int64_t B, int64_t H, int64_t N, wkv_dtype dt,
                  bool in_place, uint64_t seed, wkv_decay_form form = WKV_DECAY_CLAMPW) {
    INFO("B=" << B << " H=" << H << " N=" << N << " " << std::string(dtype_name(dt)) << std::string(in_place ? " in place" : "")
              << " form=" << form_name(form) << " seed=" << seed);
    Rng rng(seed);
    Rwkv7Data d = random_rwkv7(rng, B, 1, H, N, form, true);
    for (auto* x : d.inputs()) *x = rounded(dt, *x); // the reference sees what the GPU reads
    std::vector<double> y_ref, s_ref;
    ref_forward(d, y_ref, s_ref);

    std::vector<std::unique_ptr<Dev>> in;
    for (auto* x : d.inputs()) {
        HostTensor t(dt, d.tok_shape());
        t.fill(*x);
        in.emplace_back(new Dev(std::move(t)));
    }
    HostTensor s0(WKV_DTYPE_F32, d.state_shape());
    s0.fill(d.s0);
    Dev state_in(s0), state_out(HostTensor(WKV_DTYPE_F32, d.state_shape())), y(HostTensor(dt, d.tok_shape()));

    wkv_forward_desc f{};
    f.struct_size = sizeof f;
    f.op = WKV_OP_RWKV7;
    f.decay_form = form;
    wkv_tensor* xs[6] = {&f.r, &f.w, &f.k, &f.v, &f.a, &f.b};
    for (int i = 0; i < 6; i++) *xs[i] = in[(size_t)i]->view();
    f.y = y.view();
    f.state_in = state_in.view();
    f.state_out = in_place ? state_in.view() : state_out.view();
    Dev& out = in_place ? state_in : state_out;

    // direct
    y.poison();
    if (!in_place) state_out.poison();
    REQUIRE(wkv_forward(ctx, &f) == WKV_OK);
    DEC_CU(cudaStreamSynchronize(stream));
    const double tol = dt.bits == 32 ? 2e-6 : 4e-3; /* y is rounded to the dtype on store */
    CHECK(rel_err(y.values(), y_ref) < tol);
    CHECK(rel_err(out.values(), s_ref) < 2e-6);
    const std::vector<unsigned char> y_direct = y.bytes(), s_direct = out.bytes();

    // the same step through head-padded views (the kernel's general form, not the dense one):
    // the same bits
    {
        const std::vector<int64_t> pad_strides = {H * 2 * N, H * 2 * N, 2 * N, 1};
        std::vector<std::unique_ptr<Dev>> pin;
        for (auto* x : d.inputs()) {
            HostTensor t(dt, d.tok_shape(), pad_strides, 0);
            t.poison();
            t.fill(*x);
            pin.emplace_back(new Dev(std::move(t)));
        }
        HostTensor yp_h(dt, d.tok_shape(), pad_strides, 0);
        Dev yp(std::move(yp_h)), sp(HostTensor(WKV_DTYPE_F32, d.state_shape()));
        if (in_place) state_in.upload();
        yp.poison();
        sp.poison();
        wkv_forward_desc g = f;
        wkv_tensor* gs[6] = {&g.r, &g.w, &g.k, &g.v, &g.a, &g.b};
        for (int i = 0; i < 6; i++) *gs[i] = pin[(size_t)i]->view();
        g.y = yp.view();
        g.state_in = state_in.view();
        g.state_out = sp.view();
        REQUIRE(wkv_forward(ctx, &g) == WKV_OK);
        DEC_CU(cudaStreamSynchronize(stream));
        HostTensor yd(dt, d.tok_shape());
        yd.buf = y_direct;
        CHECK(yp.values() == yd.read());
        CHECK(sp.bytes() == s_direct);
    }

    // the same step as B packed one-token sequences (the same buffers read as [1, B, H, N],
    // offsets 0, 1, .., B): the sequential forward kernel, one block per (sequence, head), where
    // the decode kernel at small B splits a head's rows over blocks (decode_layout): the same bits
    {
        if (in_place) state_in.upload();
        Dev yq(HostTensor(dt, d.tok_shape())), sq(HostTensor(WKV_DTYPE_F32, d.state_shape()));
        yq.poison();
        sq.poison();
        std::vector<int64_t> off((size_t)B + 1);
        for (int64_t s = 0; s <= B; s++) off[(size_t)s] = s;
        const int64_t packed_shape[4] = {1, B, H, N};
        wkv_forward_desc g = f;
        g.y = yq.view();
        g.state_in = state_in.view();
        g.state_out = sq.view();
        wkv_tensor* gs[7] = {&g.r, &g.w, &g.k, &g.v, &g.a, &g.b, &g.y};
        for (wkv_tensor* x : gs) x->shape = packed_shape;
        g.seq_offsets = off.data();
        g.num_seqs = B;
        REQUIRE(wkv_forward(ctx, &g) == WKV_OK);
        DEC_CU(cudaStreamSynchronize(stream));
        CHECK(yq.bytes() == y_direct);
        CHECK(sq.bytes() == s_direct);
    }

    // captured: one kernel node, nothing else
    if (in_place) state_in.upload();
    y.poison();
    if (!in_place) state_out.poison();
    cudaGraph_t graph = nullptr;
    DEC_CU(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const wkv_status st = wkv_forward(ctx, &f);
    DEC_CU(cudaStreamEndCapture(stream, &graph));
    INFO(std::string(wkv_last_error(ctx)));
    REQUIRE(st == WKV_OK);
    size_t n = 0;
    DEC_CU(cudaGraphGetNodes(graph, nullptr, &n));
    REQUIRE(n == 1);
    cudaGraphNode_t node = nullptr;
    DEC_CU(cudaGraphGetNodes(graph, &node, &n));
    cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
    DEC_CU(cudaGraphNodeGetType(node, &type));
    CHECK(type == cudaGraphNodeTypeKernel);
    cudaGraphExec_t exec = nullptr;
    DEC_CU(cudaGraphInstantiate(&exec, graph, 0));
    DEC_CU(cudaGraphLaunch(exec, stream));
    if (!in_place) DEC_CU(cudaGraphLaunch(exec, stream)); /* a replay of the same step */
    DEC_CU(cudaStreamSynchronize(stream));
    CHECK(y.bytes() == y_direct);
    CHECK(out.bytes() == s_direct);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
}

// T one-token calls (views of token t of the full tensors, state in place) against one T-token
// call: the same bits.
void check_steps(wkv_context* ctx, cudaStream_t stream, int64_t B, int64_t H, int64_t N, wkv_dtype dt,
                 uint64_t seed) {
    const int64_t T = 5;
    INFO("steps B=" << B << " H=" << H << " N=" << N << " " << std::string(dtype_name(dt)) << " seed=" << seed);
    Rng rng(seed);
    Rwkv7Data d = random_rwkv7(rng, B, T, H, N, WKV_DECAY_CLAMPW, true);
    std::vector<std::unique_ptr<Dev>> in;
    for (auto* x : d.inputs()) {
        HostTensor t(dt, d.tok_shape());
        t.fill(*x);
        in.emplace_back(new Dev(std::move(t)));
    }
    HostTensor s0(WKV_DTYPE_F32, d.state_shape());
    s0.fill(d.s0);
    Dev st_all(s0), st_steps(s0), y_all(HostTensor(dt, d.tok_shape())), y_steps(HostTensor(dt, d.tok_shape()));
    y_all.poison();
    y_steps.poison();
    wkv_forward_desc f{};
    f.struct_size = sizeof f;
    f.op = WKV_OP_RWKV7;
    f.decay_form = WKV_DECAY_CLAMPW;
    wkv_tensor* xs[6] = {&f.r, &f.w, &f.k, &f.v, &f.a, &f.b};
    for (int i = 0; i < 6; i++) *xs[i] = in[(size_t)i]->view();
    f.y = y_all.view();
    f.state_in = f.state_out = st_all.view();
    REQUIRE(wkv_forward(ctx, &f) == WKV_OK);
    const int64_t one_shape[4] = {B, 1, H, N};
    const int64_t strides[4] = {T * H * N, H * N, N, 1};
    for (int64_t t = 0; t < T; t++) {
        wkv_forward_desc g = f;
        wkv_tensor* gs[7] = {&g.r, &g.w, &g.k, &g.v, &g.a, &g.b, &g.y};
        g.y = y_steps.view();
        for (wkv_tensor* x : gs) {
            x->shape = one_shape;
            x->strides = strides;
            x->byte_offset = (uint64_t)(t * H * N) * (dt.bits / 8u);
        }
        g.state_in = g.state_out = st_steps.view();
        REQUIRE(wkv_forward(ctx, &g) == WKV_OK);
    }
    DEC_CU(cudaStreamSynchronize(stream));
    CHECK(y_steps.bytes() == y_all.bytes());
    CHECK(st_steps.bytes() == st_all.bytes());
    std::vector<double> y_ref, s_ref;
    for (auto* x : d.inputs()) *x = rounded(dt, *x);
    ref_forward(d, y_ref, s_ref);
    CHECK(rel_err(st_steps.values(), s_ref) < 2e-6);
}

} // namespace

TEST_CASE("cuda rwkv7 decode: T = 1 is one kernel node in a graph; its replays, the general form and T one-token "
          "calls give the same bits; all match the reference") {
    if (!decode_cuda_available()) {
        MESSAGE("SKIPPED: no CUDA device");
        ++g_wkv_cuda_skipped;
        return;
    }
    ++g_wkv_cuda_ran;
    wkv_context* ctx = nullptr;
    wkv_context_options o{};
    o.struct_size = sizeof o;
    o.backend = WKV_BACKEND_CUDA;
    REQUIRE(wkv_context_create(&o, &ctx) == WKV_OK);
    cudaStream_t stream = nullptr;
    DEC_CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    REQUIRE(wkv_cuda_set_stream(ctx, stream) == WKV_OK);
    const uint64_t seed = test_seed();
    for (int64_t N : {32, 64, 128})
        for (wkv_dtype dt : {WKV_DTYPE_F32, WKV_DTYPE_BF16}) {
            check_decode(ctx, stream, 1, 4096 / (N * 2), N, dt, false, seed);
            check_decode(ctx, stream, 3, 2, N, dt, true, seed + 1);
        }
    check_decode(ctx, stream, 256, 2, 64, WKV_DTYPE_F32, false, seed + 2);
    // the other decay forms (above: clampw, which at B <= 2, N = 64 takes a copy of the kernel
    // with the form a constant; these take the one that switches on the form, NOTES v33)
    for (wkv_decay_form form : {WKV_DECAY_DIRECT, WKV_DECAY_LOG, WKV_DECAY_EXP_NEG_EXP}) {
        check_decode(ctx, stream, 1, 32, 64, WKV_DTYPE_F32, false, seed + 5, form);
        check_decode(ctx, stream, 3, 2, 64, WKV_DTYPE_BF16, true, seed + 6, form);
    }
    for (int64_t N : {32, 64, 128}) check_steps(ctx, stream, 2, 3, N, N == 64 ? WKV_DTYPE_BF16 : WKV_DTYPE_F32, seed + 4);
    check_decode(ctx, stream, 256, 2, 64, WKV_DTYPE_BF16, true, seed + 3);
    REQUIRE(wkv_cuda_set_stream(ctx, nullptr) == WKV_OK);
    cudaStreamDestroy(stream);
    wkv_context_destroy(ctx);
}
