// RWKV-7 on the CUDA backend (part of wkv_cuda_tests): every golden wkv7 file in f32/f16/bf16
// (both state orders); random inputs against the CPU backend and the float64 reference across
// T, N, dtypes, decay forms, strides, broadcast w, padded / key-major / in-place states, packed
// sequences and state options; T one-token calls against one T-token call, bit for bit.
// Every output and the workspace are poisoned with NaN before each call (gaps of strided tensors
// too), each device buffer has a guard zone that must come back untouched, and inputs must come
// back unchanged (rwkv7_harness.h). WKV_TEST_SEED=<seed> reproduces a run's random inputs.
#include "wkv_doctest.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "rwkv7_harness.h"

using namespace cudatest;

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

TEST_CASE("cuda: strided views, broadcast w, padded and key-major states, in-place state, gradients in two layouts") {
    CUDA_TEST_OR_SKIP();
    const uint64_t seed = test_seed();
    int n = 0;
    // InnerStride (elements 2 apart, misaligned) keeps the forward's producers on their element
    // path at N = 64 (the others take the vector path: rwkv7.cu, vec_type)
    for (Layout l : {Layout::Contiguous, Layout::PaddedT, Layout::Transposed, Layout::InnerStride})
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
            c.dk_own_layout = variant == 1;
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
        c.layout = Layout::Transposed;
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

TEST_CASE("cuda: T one-token calls in place equal one T-token call, bit for bit") {
    CUDA_TEST_OR_SKIP();
    CudaContext cc;
    Config c;
    // 320 (sequence, head) blocks: on a GPU of at most 160 SMs (an H100: 132) the T = 1 calls
    // take the decode kernel with 2 rows per thread and the T = 9 call the chunked kernel with
    // 1 (backends/cuda/rwkv7.cu, decode_layout): the two must agree bit for bit all the same.
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
