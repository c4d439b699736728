// The attention backward on Vulkan (shaders/attn_bwd.comp) against the float64 reference, with
// the cases of the CPU suite (tests/test_attention_backward.cpp): every dtype, mask, grouping and
// head dim, dlse, Tq != Tk, T = 1, decode, rows that see no key and keys no row sees (exact
// zeros), packed and strided tensors, large logits, host memory and wkv_buffers; the same bits
// call after call; refusals.
// The validation layer is on for the whole suite: any message fails the case.
#include "wkv_doctest.h"

#include <vulkan/vulkan_core.h>

#include <cmath>
#include <string>
#include <vector>

#include "suite_contexts.h"
#include "test_attention.h"
#include "test_util.h"
#include "wkv/wkv_vulkan.h"

using namespace wkvtest;

namespace {

wkv_context* vk() { return suite_contexts().vk; }

void check_no_validation_message() {
    uint64_t n = 0;
    REQUIRE(wkv_vulkan_validation_message_count(vk(), &n) == WKV_OK);
    CHECK(n == 0);
}

}  // namespace

TEST_CASE("vulkan attention backward: against the float64 reference, every dtype, mask, grouping and D") {
    Rng rng(test_seed());
    for (const wkv_dtype dt : {WKV_DTYPE_F32, WKV_DTYPE_F16, WKV_DTYPE_BF16})
        for (const bool causal : {false, true})
            for (const int64_t D : {16, 40, 64, 128, 256}) {
                AttnCase a;
                a.dtype = dt, a.causal = causal, a.D = D;
                a.B = 2, a.Tq = 37, a.Tk = 37, a.Hq = 4, a.Hkv = 2;  // odd T, GQA, tails of every tile
                a.dlse = D == 40;
                a.buffers = D == 64;  // wkv_buffers: no staging
                CAPTURE(D);
                CAPTURE(causal);
                CAPTURE(dtype_name(dt));
                check_backward(vk(), a, rng);
            }
    check_no_validation_message();
}

TEST_CASE("vulkan attention backward: shapes, strides, scales, large logits, dlse") {
    Rng rng(test_seed());
    for (const bool causal : {false, true}) {
        CAPTURE(causal);
        AttnCase a;
        a.causal = causal;
        a.Tq = 7, a.Tk = 100, a.Hq = 6, a.Hkv = 1;  // Tq < Tk, multi-query
        check_backward(vk(), a, rng);
        a.Tq = 1, a.Tk = 1;  // one token
        check_backward(vk(), a, rng);
        a.Tq = 1, a.Tk = 300;  // a decode step against a long cache
        check_backward(vk(), a, rng);
        a.Tq = 90, a.Tk = 9;  // Tq > Tk: causal rows before the first key see nothing
        check_backward(vk(), a, rng);
        a.Tq = 130, a.Tk = 130, a.strided = true, a.scale = 0.3, a.dlse = true;  // strides, tails
        check_backward(vk(), a, rng);
        a.buffers = true;  // the same in wkv_buffers (strided views of them)
        check_backward(vk(), a, rng);
        a.buffers = false;
        a.strided = false, a.scale = 0.0, a.logit_scale = 10.0;  // logits of ~100
        a.Tq = 33, a.Tk = 65;
        check_backward(vk(), a, rng);
    }
    check_no_validation_message();
}

TEST_CASE("vulkan attention backward: packed sequences, and what sees nothing gets zeros") {
    Rng rng(test_seed());
    for (const bool causal : {false, true}) {
        CAPTURE(causal);
        AttnCase a;
        a.causal = causal;
        a.q_off = {0, 5, 5, 85, 86, 86};      // an empty sequence, a one-token one
        a.k_off = {0, 9, 12, 140, 141, 150};  // keys without queries (the last sequence)
        a.Tq = 86, a.Tk = 150, a.Hq = 4, a.Hkv = 2;
        check_backward(vk(), a, rng);
        AttnBwdRun r = run_backward(vk(), a, rng);
        REQUIRE_MESSAGE(r.status == WKV_OK, r.message);
        for (int64_t j = 141; j < 150; ++j)
            for (int64_t x = 0; x < a.Hkv * a.D; ++x) {
                CHECK(r.dk[(size_t)(j * a.Hkv * a.D + x)] == 0.0);
                CHECK(r.dv[(size_t)(j * a.Hkv * a.D + x)] == 0.0);
            }
    }
    AttnCase a;
    a.causal = true, a.Tq = 10, a.Tk = 4;  // rows 0..5 see no key: their dq is exactly 0
    AttnBwdRun r = run_backward(vk(), a, rng);
    REQUIRE_MESSAGE(r.status == WKV_OK, r.message);
    for (int64_t x = 0; x < 6 * a.Hq * a.D; ++x) CHECK(r.dq[(size_t)x] == 0.0);
    CHECK(rel_err(r.dq, r.dq_ref) <= 2e-5);
    a.Tk = 0, a.causal = false;  // no keys at all: dq = 0
    check_backward(vk(), a, rng);
    a.B = 3, a.Tq = 0, a.Tk = 6;  // no query rows: dk = dv = 0
    check_backward(vk(), a, rng);
    check_no_validation_message();
}

TEST_CASE("vulkan attention backward: the same bits call after call, and equal to the CPU's within rounding") {
    AttnCase a;
    a.causal = true, a.B = 2, a.Tq = 70, a.Tk = 80, a.Hq = 4, a.Hkv = 2, a.D = 32;
    Rng r1(7), r2(7);
    AttnBwdRun x = run_backward(vk(), a, r1), y = run_backward(vk(), a, r2);
    REQUIRE_MESSAGE(x.status == WKV_OK, x.message);
    REQUIRE_MESSAGE(y.status == WKV_OK, y.message);
    CHECK(x.dq == y.dq);
    CHECK(x.dk == y.dk);
    CHECK(x.dv == y.dv);
    check_no_validation_message();
}

TEST_CASE("vulkan attention backward: refusals name the argument, nothing written") {
    HostTensor q(WKV_DTYPE_F32, {1, 4, 4, 300}), k(WKV_DTYPE_F32, {1, 6, 2, 300}), v(WKV_DTYPE_F32, {1, 6, 2, 300}),
        o(WKV_DTYPE_F32, {1, 4, 4, 300}), lse(WKV_DTYPE_F32, {1, 4, 4}), g(WKV_DTYPE_F32, {1, 4, 4, 300}),
        dq(WKV_DTYPE_F32, {1, 4, 4, 300}), dk(WKV_DTYPE_F32, {1, 6, 2, 300}), dv(WKV_DTYPE_F32, {1, 6, 2, 300});
    dq.poison(), dk.poison(), dv.poison();
    wkv_attention_desc d{};
    d.struct_size = sizeof d;
    d.q = q.view(), d.k = k.view(), d.v = v.view(), d.o = o.view(), d.lse = lse.view();
    wkv_attention_backward_desc bd{};
    bd.struct_size = sizeof bd;
    bd.forward = &d;
    bd.dout = g.view(), bd.dq = dq.view(), bd.dk = dk.view(), bd.dv = dv.view();
    CHECK(wkv_attention_backward(vk(), &bd) == WKV_ERROR_UNSUPPORTED);  // D = 300
    CHECK(std::string(wkv_last_error(vk())).find("D = 300") != std::string::npos);
    d.lse = wkv_tensor{};  // the core's check, before the backend: lse is required
    CHECK(wkv_attention_backward(vk(), &bd) == WKV_ERROR_NULL_POINTER);
    CHECK(std::string(wkv_last_error(vk())).find("desc->forward->lse.data is NULL") != std::string::npos);
    for (const HostTensor* t : {&dq, &dk, &dv})
        for (double x : t->read()) CHECK(std::isnan(x));
    wkv_device_info dev{};
    dev.struct_size = sizeof dev;
    REQUIRE(wkv_device_get_info(WKV_BACKEND_VULKAN, 0, &dev) == WKV_OK);
    if (std::string(dev.name).find("llvmpipe") != std::string::npos) {  // lavapipe's loop limit
        AttnCase a;  // just inside the host's estimate of the limit (~48,000 iterations): still right
        a.causal = false, a.Tq = 9000, a.Tk = 9000, a.Hq = 1, a.Hkv = 1, a.D = 8;
        Rng rng(test_seed());
        check_backward(vk(), a, rng);
        HostTensor ql(WKV_DTYPE_F32, {1, 20000, 1, 8}), kl(WKV_DTYPE_F32, {1, 20000, 1, 8}),
            ol(WKV_DTYPE_F32, {1, 20000, 1, 8}), ll(WKV_DTYPE_F32, {1, 1, 20000}), dql(WKV_DTYPE_F32, {1, 20000, 1, 8});
        dql.poison();
        d.q = ql.view(), d.k = kl.view(), d.v = kl.view(), d.o = ol.view(), d.lse = ll.view();
        bd.dout = ol.view(), bd.dq = dql.view(), bd.dk = dql.view(), bd.dv = dql.view();
        HostTensor dkl(WKV_DTYPE_F32, {1, 20000, 1, 8}), dvl(WKV_DTYPE_F32, {1, 20000, 1, 8});
        bd.dk = dkl.view(), bd.dv = dvl.view();
        CHECK(wkv_attention_backward(vk(), &bd) == WKV_ERROR_UNSUPPORTED);
        CHECK(std::string(wkv_last_error(vk())).find("lavapipe stops at 65535") != std::string::npos);
        for (double x : dql.read()) CHECK(std::isnan(x));
    }
    check_no_validation_message();
}
