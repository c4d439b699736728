// The chunked RWKV-7 forward (backends/cuda/rwkv7_chunk.cu) forced on with
// WKV_CUDA_RWKV7_CHUNKED=1 (part of wkv_cuda_tests): golden files, random inputs, layouts and
// graphs as the sequential forward gets them; and its scratch from the caller
// (wkv_forward_desc.scratch): the pool path's bits, nothing written past it, no allocation node
// in a captured graph, bad scratch refused with a message naming it.
#include "wkv_doctest.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "rwkv7_harness.h"

using namespace cudatest;

namespace {

// Padded-T and head-major token layouts, each with broadcast w, padded, key-major and in-place
// states (B=2 H=2 T=45 N=64, the dtype cycling with n): the cases the chunked kernels must take
// like contiguous ones. Case n gets seed base + n.
void check_layouts(uint64_t base, int& n) {
    for (Layout l : {Layout::PaddedT, Layout::Transposed})
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
            check_config(c, base + (uint64_t)n++);
        }
}

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
    check_layouts(seed + 510, n);
    check_caller_stream_and_graph(WKV_DECAY_CLAMPW);
}

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
        INFO(std::string(wkv_last_error(cc.ctx)));
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

// backends/cuda/rwkv7_chunk_bwd.cu: the chunked backward (N = 64, CLAMPW, unpacked) forced on
// with WKV_CUDA_RWKV7_CHUNKED_BWD=1: the golden files, random inputs around the chunk length
// (tails), every dtype and state option, strided layouts, against the CPU backend and the
// float64 reference at the usual tolerances; with the forward sequential and chunked; two runs
// give the same bits.
TEST_CASE("cuda: the chunked RWKV-7 backward (WKV_CUDA_RWKV7_CHUNKED_BWD=1): golden, random, layouts, bits") {
    CUDA_TEST_OR_SKIP();
    const uint64_t seed = test_seed();
    Config c0;
    c0.B = 1; c0.H = 2; c0.T = 100; c0.N = 64;
    Rng rng(seed + 700);
    const Case k0 = make_case(rng, c0, c0.B);
    {
        // the switch reaches the kernels: the two backwards round differently
        Results seq, chk;
        {
            ChunkedBwdEnv env("0");
            seq = run_backend(WKV_BACKEND_CUDA, c0, k0.d, k0.dy, k0.dsT);
        }
        {
            ChunkedBwdEnv env("1");
            chk = run_backend(WKV_BACKEND_CUDA, c0, k0.d, k0.dy, k0.dsT);
        }
        CHECK_MESSAGE(seq.dr != chk.dr, "WKV_CUDA_RWKV7_CHUNKED_BWD=1 gave the sequential backward's bits");
        CHECK(seq.y == chk.y);  // the forward is not the backward's switch
        compare("dr chunked vs sequential", chk.dr, seq.dr, 2e-5, c0.describe());
        compare("dw chunked vs sequential", chk.dw, seq.dw, 2e-5, c0.describe());
        compare("ds0 chunked vs sequential", chk.ds0, seq.ds0, 2e-5, c0.describe());
    }
    ChunkedBwdEnv env("1");
    {
        // deterministic: two runs (fresh contexts) give the same bits, every output
        const Results a = run_backend(WKV_BACKEND_CUDA, c0, k0.d, k0.dy, k0.dsT);
        const Results b = run_backend(WKV_BACKEND_CUDA, c0, k0.d, k0.dy, k0.dsT);
        CHECK(a.dr == b.dr);
        CHECK(a.dw == b.dw);
        CHECK(a.dk == b.dk);
        CHECK(a.dv == b.dv);
        CHECK(a.da == b.da);
        CHECK(a.db == b.db);
        CHECK(a.ds0 == b.ds0);
    }
    const std::string dir = golden_dir();
    for (const char* fwd : {"0", "1"}) {
        CAPTURE(fwd);
        ChunkedEnv fenv(fwd);
        for (const char* name : {"wkv7_clampw_N64", "wkv7_clampw_T200"})
            check_golden_rwkv7(dir + "/" + name + ".safetensors");
    }
    int n = 0;
    // T around the chunk length (32), tails, every dtype, state and state-gradient options
    for (int64_t T : {31, 32, 33, 100, 257})
        for (int d = 0; d < 3; d++) {
            Config c;
            c.B = 2;
            c.H = 3;
            c.T = T;
            c.N = 64;
            c.dtype = kDtypes[d];
            c.state_in = n % 4 != 1;
            c.state_out = n % 5 != 2;
            c.dstate_out = n % 3 != 1;
            c.dstate_in = n % 7 != 3;
            check_config(c, seed + 710 + (uint64_t)n++);
        }
    check_layouts(seed + 710, n);
    {
        ChunkedEnv fenv("1");  // both chunked
        Config c;
        c.B = 1; c.H = 4; c.T = 300; c.N = 64; c.dtype = WKV_DTYPE_BF16;
        check_config(c, seed + 710 + (uint64_t)n++);
    }
    check_caller_stream_and_graph(WKV_DECAY_CLAMPW);
}
