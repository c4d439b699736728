// Softmax attention on CUDA (attention.cu, cuda.simt.q16.kv32) against the float64 reference,
// with the CPU and Vulkan suites' cases (tests/test_attention.h): every dtype, mask, head
// grouping, head dim up to 256 (the one past 48 KB of shared memory), Tq != Tk, T = 1, fully
// masked rows, large logits, strided and packed tensors, host memory (staged) and wkv_buffers;
// the golden files; the opt-in gate (WKV_CUDA_ATTENTION) and the refusals. Outputs are
// NaN-poisoned before each call. Without a CUDA device every case skips.
#include "wkv_doctest.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "safetensors.h"
#include "test_attention.h"

using namespace wkvtest;
using cudatest::CudaContext;

namespace {

// A context whose attention kernels are enabled: the variable is read at creation, so it is set
// by a base constructed before the context (bases are constructed in the order listed).
struct AttentionOn {
    AttentionOn() { setenv("WKV_CUDA_ATTENTION", "1", 1); }
};
struct AttnContext : AttentionOn, CudaContext {};

}  // namespace

namespace {

std::vector<wkv_attention_config> configs(wkv_context* ctx) {
    int32_t n = 0;
    REQUIRE(wkv_attention_configs(ctx, nullptr, 0, &n) == WKV_OK);
    std::vector<wkv_attention_config> cfg((size_t)n);
    for (auto& c : cfg) c.struct_size = sizeof c;
    REQUIRE(wkv_attention_configs(ctx, cfg.data(), n, &n) == WKV_OK);
    return cfg;
}

}  // namespace

TEST_CASE("cuda attention: refused unless WKV_CUDA_ATTENTION=1, listed with fits = 0 then") {
    CUDA_TEST_OR_SKIP();
    unsetenv("WKV_CUDA_ATTENTION");
    CudaContext c;
    const auto cfg = configs(c.ctx);
    REQUIRE(cfg.size() == 5);
    for (const auto& x : cfg) CHECK(x.fits == 0);
    Rng rng(test_seed());
    AttnCase a;
    const AttnRun r = run(c.ctx, a, rng);
    CHECK(r.status == WKV_ERROR_UNSUPPORTED);
    CHECK(r.message.find("WKV_CUDA_ATTENTION=1") != std::string::npos);
}

TEST_CASE("cuda attention: the configurations listed, each the default of its dtype and head dim, all fit") {
    CUDA_TEST_OR_SKIP();
    AttnContext c;
    const auto cfg = configs(c.ctx);
    REQUIRE(cfg.size() == 5);
    for (const auto& x : cfg) {
        const std::string name = x.name;
        CAPTURE(name);
        CHECK(x.is_default == 1);
        CHECK(x.fits == 1);  // every sm_80+ device opts in to >= 99 KB
        CHECK(x.warps == 4);
        if (name == "cuda.simt.q16.kv32") {
            CHECK(x.block_q == 16);
            CHECK(x.block_kv == 32);
            CHECK(x.max_head_dim == 256);
            CHECK(x.head_dim == 0);
            CHECK(x.dtype.bits == 0);
            CHECK(x.shared_bytes > 48 * 1024);  // D = 256 needs the opt-in limit
        } else {
            CHECK(name.rfind("cuda.mma.", 0) == 0);
            CHECK(x.block_q == 64);
            CHECK(x.block_kv == 64);
            CHECK((x.head_dim == 64 || x.head_dim == 128));
            CHECK(x.dtype.bits == 16);
            CHECK(x.shared_bytes <= 48 * 1024);
        }
    }
}

TEST_CASE("cuda attention: each configuration pinned; a pinned one for another dtype or D is refused") {
    CUDA_TEST_OR_SKIP();
    AttnContext c;
    Rng rng(test_seed());
    for (const auto& x : configs(c.ctx)) {
        const std::string name = x.name;
        CAPTURE(name);
        for (const bool causal : {false, true}) {
            AttnCase a;
            a.config = x.name, a.causal = causal;
            a.dtype = x.dtype.bits ? x.dtype : WKV_DTYPE_BF16;
            a.D = x.head_dim ? x.head_dim : 64;
            a.B = 2, a.Tq = 130, a.Tk = 150, a.Hq = 4, a.Hkv = 2;
            check_run(c.ctx, a, rng);
            a.Tq = 1, a.Tk = 200;  // decode
            check_run(c.ctx, a, rng);
        }
    }
    AttnCase a;
    a.config = "cuda.mma.bf16.d64.q64.kv64", a.dtype = WKV_DTYPE_F16, a.D = 64;
    AttnRun r = run(c.ctx, a, rng);
    CHECK(r.status == WKV_ERROR_UNSUPPORTED);
    CHECK(r.message.find("built for bf16 at D = 64") != std::string::npos);
    a.dtype = WKV_DTYPE_BF16, a.D = 128;
    r = run(c.ctx, a, rng);
    CHECK(r.status == WKV_ERROR_UNSUPPORTED);
}

TEST_CASE("cuda attention: against the float64 reference, every dtype, mask, grouping and head dim") {
    CUDA_TEST_OR_SKIP();
    AttnContext c;
    Rng rng(test_seed());
    for (const wkv_dtype dt : {WKV_DTYPE_F32, WKV_DTYPE_F16, WKV_DTYPE_BF16})
        for (const bool causal : {false, true})
            for (const int64_t D : {16, 40, 64, 96, 128, 256}) {
                AttnCase a;
                a.dtype = dt, a.causal = causal, a.D = D;
                a.B = 2, a.Tq = 37, a.Tk = 37, a.Hq = 4, a.Hkv = 2;  // odd T, GQA, tails of every tile
                a.buffers = D == 64;
                CAPTURE(D);
                CAPTURE(causal);
                CAPTURE(dtype_name(dt));
                check_run(c.ctx, a, rng);
            }
}

TEST_CASE("cuda attention: shapes, strides, scales, large logits; host memory and buffers") {
    CUDA_TEST_OR_SKIP();
    AttnContext c;
    Rng rng(test_seed());
    for (const bool buffers : {false, true})
        for (const bool causal : {false, true}) {
            CAPTURE(buffers);
            CAPTURE(causal);
            AttnCase a;
            a.buffers = buffers, a.causal = causal;
            a.Tq = 7, a.Tk = 100, a.Hq = 6, a.Hkv = 1;  // Tq < Tk, multi-query
            check_run(c.ctx, a, rng);
            a.Tq = 1, a.Tk = 1;  // one token
            check_run(c.ctx, a, rng);
            a.Tq = 1, a.Tk = 300;  // a decode step against a long cache
            check_run(c.ctx, a, rng);
            a.Tq = 20, a.Tk = 9;  // Tq > Tk: causal rows before the first key see nothing
            check_run(c.ctx, a, rng);
            a.Tq = 130, a.Tk = 130, a.strided = true, a.scale = 0.3;  // strides, tails
            check_run(c.ctx, a, rng);
            a.strided = false, a.scale = 0.0, a.logit_scale = 300.0;  // logits of ~1e3: no overflow
            a.Tq = 33, a.Tk = 65;
            check_run(c.ctx, a, rng);
            a.logit_scale = 1.0, a.B = 3, a.Tq = 1000, a.Tk = 1000, a.Hq = 8, a.Hkv = 2, a.D = 64;  // many blocks
            check_run(c.ctx, a, rng);
        }
}

TEST_CASE("cuda attention: fully masked rows, no keys, no queries; packed sequences") {
    CUDA_TEST_OR_SKIP();
    AttnContext c;
    Rng rng(test_seed());
    AttnCase a;
    a.causal = true, a.Tq = 10, a.Tk = 4;  // rows 0..5 see no key: o = 0, lse = -inf
    AttnRun r = run(c.ctx, a, rng);
    REQUIRE_MESSAGE(r.status == WKV_OK, r.message);
    for (int64_t t = 0; t < 6; ++t)
        for (int64_t h = 0; h < a.Hq; ++h) {
            CHECK(r.lse[(size_t)(h * a.Tq + t)] == -std::numeric_limits<double>::infinity());
            for (int64_t d = 0; d < a.D; ++d) CHECK(r.o[(size_t)((t * a.Hq + h) * a.D + d)] == 0.0);
        }
    CHECK(rel_err(r.o, r.o_ref) <= 1e-5);
    a.Tk = 0, a.causal = false;  // no keys at all
    r = run(c.ctx, a, rng);
    REQUIRE_MESSAGE(r.status == WKV_OK, r.message);
    for (double x : r.o) CHECK(x == 0.0);
    a.B = 3, a.Tq = 0, a.Tk = 6;  // no query rows
    r = run(c.ctx, a, rng);
    CHECK_MESSAGE(r.status == WKV_OK, r.message);
    for (const bool causal : {false, true})
        for (const bool buffers : {false, true}) {
            AttnCase p;
            p.causal = causal, p.buffers = buffers, p.Hq = 4, p.Hkv = 2, p.D = 32;
            p.q_off = {0, 5, 5, 25, 26, 60}, p.k_off = {0, 9, 12, 30, 30, 70};  // an empty sequence, a one-token one
            p.Tq = 60, p.Tk = 70;
            CAPTURE(causal);
            CAPTURE(buffers);
            check_run(c.ctx, p, rng);
        }
    // more sequences than one launch carries (kMaxSeqsPerLaunch = 128)
    AttnCase many;
    many.Hq = 2, many.Hkv = 1, many.D = 64, many.causal = true;
    for (int64_t s = 0, tq = 0, tk = 0; s <= 300; ++s) {
        many.q_off.push_back(tq), many.k_off.push_back(tk);
        tq += s % 7, tk += s % 7 + s % 3;
        many.Tq = many.q_off.back(), many.Tk = many.k_off.back();
    }
    check_run(c.ctx, many, rng);
}

TEST_CASE("cuda attention: the golden files (torch's math attention in float64)") {
    CUDA_TEST_OR_SKIP();
    AttnContext c;
    check_attention_golden_files(c.ctx);
}

TEST_CASE("cuda attention: refusals name the argument, nothing written") {
    CUDA_TEST_OR_SKIP();
    AttnContext c;
    HostTensor q(WKV_DTYPE_F32, {1, 4, 4, 300}), k(WKV_DTYPE_F32, {1, 6, 2, 300}), v(WKV_DTYPE_F32, {1, 6, 2, 300}),
        o(WKV_DTYPE_F32, {1, 4, 4, 300});
    o.poison();
    wkv_attention_desc d{};
    d.struct_size = sizeof d;
    d.q = q.view(), d.k = k.view(), d.v = v.view(), d.o = o.view();
    CHECK(wkv_attention(c.ctx, &d) == WKV_ERROR_UNSUPPORTED);
    CHECK(std::string(wkv_last_error(c.ctx)).find("D = 300") != std::string::npos);
    for (double x : o.read()) CHECK(std::isnan(x));
}

TEST_CASE("cuda attention backward: against the float64 reference, every dtype, mask, grouping and head dim") {
    CUDA_TEST_OR_SKIP();
    AttnContext c;
    Rng rng(test_seed());
    for (const wkv_dtype dt : {WKV_DTYPE_F32, WKV_DTYPE_F16, WKV_DTYPE_BF16})
        for (const bool causal : {false, true})
            for (const int64_t D : {16, 40, 64, 96, 128, 256}) {
                AttnCase a;
                a.dtype = dt, a.causal = causal, a.D = D;
                a.B = 2, a.Tq = 37, a.Tk = 45, a.Hq = 4, a.Hkv = 2;
                a.buffers = D == 64, a.dlse = D == 128;
                CAPTURE(D);
                CAPTURE(causal);
                CAPTURE(dtype_name(dt));
                check_backward(c.ctx, a, rng);
            }
}

TEST_CASE("cuda attention backward: shapes, strides, no rows or keys, packed, many blocks") {
    CUDA_TEST_OR_SKIP();
    AttnContext c;
    Rng rng(test_seed());
    for (const bool causal : {false, true}) {
        CAPTURE(causal);
        AttnCase a;
        a.causal = causal;
        a.Tq = 7, a.Tk = 100, a.Hq = 6, a.Hkv = 1;  // multi-query
        check_backward(c.ctx, a, rng);
        a.Tq = 1, a.Tk = 300;  // a decode step
        check_backward(c.ctx, a, rng);
        a.Tq = 20, a.Tk = 9;  // Tq > Tk
        check_backward(c.ctx, a, rng);
        a.Tq = 130, a.Tk = 130, a.strided = true, a.scale = 0.3, a.dtype = WKV_DTYPE_BF16;
        check_backward(c.ctx, a, rng);
        a.strided = false, a.scale = 0.0, a.dtype = WKV_DTYPE_F32, a.Tq = 0, a.Tk = 6;  // no rows
        check_backward(c.ctx, a, rng);
        a.Tq = 6, a.Tk = 0;  // no keys
        check_backward(c.ctx, a, rng);
        a.B = 2, a.Tq = 700, a.Tk = 700, a.Hq = 8, a.Hkv = 2, a.D = 64;  // many blocks
        check_backward(c.ctx, a, rng);
        AttnCase p;
        p.causal = causal, p.Hq = 4, p.Hkv = 2, p.D = 32, p.buffers = true;
        p.q_off = {0, 5, 5, 25, 26, 60}, p.k_off = {0, 9, 12, 30, 30, 70};
        p.Tq = 60, p.Tk = 70;
        check_backward(c.ctx, p, rng);
    }
}

TEST_CASE("cuda attention backward: refused without WKV_CUDA_ATTENTION=1") {
    CUDA_TEST_OR_SKIP();
    AttnContext on;  // the forward runs on this one
    unsetenv("WKV_CUDA_ATTENTION");
    CudaContext off;
    Rng rng(test_seed());
    AttnCase a;
    // the forward on `on` (lse), the backward on `off`: run_backward runs both on one context,
    // so check the refusal through the public call directly
    HostTensor q = make(a.dtype, a.B, a.Tq, a.Hq, a.D, false), k = make(a.dtype, a.B, a.Tk, a.Hkv, a.D, false),
               v = make(a.dtype, a.B, a.Tk, a.Hkv, a.D, false), o = make(a.dtype, a.B, a.Tq, a.Hq, a.D, false),
               g = make(a.dtype, a.B, a.Tq, a.Hq, a.D, false), dq = make(a.dtype, a.B, a.Tq, a.Hq, a.D, false),
               dk = make(a.dtype, a.B, a.Tk, a.Hkv, a.D, false), dv = make(a.dtype, a.B, a.Tk, a.Hkv, a.D, false);
    HostTensor l(WKV_DTYPE_F32, {a.B, a.Hq, a.Tq});
    fill_input(q, random_normal(rng, (size_t)(a.B * a.Tq * a.Hq * a.D)));
    fill_input(k, random_normal(rng, (size_t)(a.B * a.Tk * a.Hkv * a.D)));
    fill_input(v, random_normal(rng, (size_t)(a.B * a.Tk * a.Hkv * a.D)));
    fill_input(g, random_normal(rng, (size_t)(a.B * a.Tq * a.Hq * a.D)));
    dq.poison(), dk.poison(), dv.poison();
    wkv_attention_desc d{};
    d.struct_size = sizeof d;
    d.q = q.view(), d.k = k.view(), d.v = v.view(), d.o = o.view(), d.lse = l.view();
    REQUIRE(wkv_attention(on.ctx, &d) == WKV_OK);
    wkv_attention_backward_desc bd{};
    bd.struct_size = sizeof bd;
    bd.forward = &d;
    bd.dout = g.view(), bd.dq = dq.view(), bd.dk = dk.view(), bd.dv = dv.view();
    CHECK(wkv_attention_backward(off.ctx, &bd) == WKV_ERROR_UNSUPPORTED);
    CHECK(std::string(wkv_last_error(off.ctx)).find("WKV_CUDA_ATTENTION=1") != std::string::npos);
    for (double x : dq.read()) CHECK(std::isnan(x));
    REQUIRE(wkv_attention_backward(on.ctx, &bd) == WKV_OK);
    CHECK(all_finite(dq.read()));
}
