// Softmax attention on Vulkan (shaders/attn_fwd.comp) against the float64 reference, with the
// same cases as the CPU suite (tests/test_attention.cpp): every dtype, mask, head grouping, head
// dim up to 256, Tq != Tk, T = 1, fully masked rows, large logits, strided and packed tensors,
// both configurations, host memory and wkv_buffers; the golden files; refusals. The validation
// layer is on for the whole suite (CMakeLists.txt): any message fails the case.
#include "wkv_doctest.h"

#include <vulkan/vulkan_core.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "safetensors.h"
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

std::vector<std::string> config_names() {
    int32_t n = 0;
    REQUIRE(wkv_attention_configs(vk(), nullptr, 0, &n) == WKV_OK);
    std::vector<wkv_attention_config> cfg((size_t)n);
    for (auto& c : cfg) c.struct_size = sizeof c;
    REQUIRE(wkv_attention_configs(vk(), cfg.data(), n, &n) == WKV_OK);
    std::vector<std::string> names;
    for (const auto& c : cfg)
        if (c.fits) names.push_back(c.name);
    return names;
}

}  // namespace

TEST_CASE("vulkan attention: the configurations listed, one default, each runs") {
    int32_t n = 0;
    REQUIRE(wkv_attention_configs(vk(), nullptr, 0, &n) == WKV_OK);
    REQUIRE(n == 2);
    std::vector<wkv_attention_config> cfg((size_t)n);
    for (auto& c : cfg) c.struct_size = sizeof c;
    REQUIRE(wkv_attention_configs(vk(), cfg.data(), n, &n) == WKV_OK);
    int defaults = 0;
    for (const auto& c : cfg) {
        CAPTURE(c.name);
        CHECK(std::string(c.name).rfind("vulkan.", 0) == 0);
        CHECK(c.block_q * (std::string(c.name).find("q16") != std::string::npos ? 4 : 1) == 64);
        CHECK(c.max_head_dim == 256);
        CHECK(c.shared_bytes <= 16384);
        defaults += c.is_default;
        if (c.is_default) CHECK(c.fits == 1);
    }
    CHECK(defaults == 1);
    CHECK(config_names().size() >= 1);
}

TEST_CASE("vulkan attention: against the float64 reference, every dtype, mask, grouping and head dim") {
    Rng rng(test_seed());
    for (const wkv_dtype dt : {WKV_DTYPE_F32, WKV_DTYPE_F16, WKV_DTYPE_BF16})
        for (const bool causal : {false, true})
            for (const int64_t D : {16, 40, 64, 128, 256}) {
                AttnCase a;
                a.dtype = dt, a.causal = causal, a.D = D;
                a.B = 2, a.Tq = 37, a.Tk = 37, a.Hq = 4, a.Hkv = 2;  // odd T, GQA, tails of every tile
                a.buffers = D == 64;
                CAPTURE(D);
                CAPTURE(causal);
                CAPTURE(dtype_name(dt));
                check_run(vk(), a, rng);
            }
    check_no_validation_message();
}

TEST_CASE("vulkan attention: shapes, strides, scales, large logits; each configuration, host and buffers") {
    Rng rng(test_seed());
    for (const std::string& name : config_names())
        for (const bool buffers : {false, true})
            for (const bool causal : {false, true}) {
                CAPTURE(name);
                CAPTURE(buffers);
                CAPTURE(causal);
                AttnCase a;
                a.config = name.c_str(), a.buffers = buffers, a.causal = causal;
                a.Tq = 7, a.Tk = 100, a.Hq = 6, a.Hkv = 1;  // Tq < Tk, multi-query
                check_run(vk(), a, rng);
                a.Tq = 1, a.Tk = 1;  // one token
                check_run(vk(), a, rng);
                a.Tq = 1, a.Tk = 300;  // a decode step against a long cache
                check_run(vk(), a, rng);
                a.Tq = 20, a.Tk = 9;  // Tq > Tk: causal rows before the first key see nothing
                check_run(vk(), a, rng);
                a.Tq = 130, a.Tk = 130, a.strided = true, a.scale = 0.3;  // strides, tails
                check_run(vk(), a, rng);
                a.strided = false, a.scale = 0.0, a.logit_scale = 300.0;  // logits of ~1e3: no overflow
                a.Tq = 33, a.Tk = 65;
                check_run(vk(), a, rng);
            }
    check_no_validation_message();
}

TEST_CASE("vulkan attention: fully masked rows, no keys, no queries; packed sequences") {
    Rng rng(test_seed());
    AttnCase a;
    a.causal = true, a.Tq = 10, a.Tk = 4;  // rows 0..5 see no key: o = 0, lse = -inf
    AttnRun r = run(vk(), a, rng);
    REQUIRE_MESSAGE(r.status == WKV_OK, r.message);
    for (int64_t t = 0; t < 6; ++t)
        for (int64_t h = 0; h < a.Hq; ++h) {
            CHECK(r.lse[(size_t)(h * a.Tq + t)] == -std::numeric_limits<double>::infinity());
            for (int64_t d = 0; d < a.D; ++d) CHECK(r.o[(size_t)((t * a.Hq + h) * a.D + d)] == 0.0);
        }
    CHECK(rel_err(r.o, r.o_ref) <= 1e-5);
    a.Tk = 0, a.causal = false;  // no keys at all
    r = run(vk(), a, rng);
    REQUIRE_MESSAGE(r.status == WKV_OK, r.message);
    for (double x : r.o) CHECK(x == 0.0);
    a.B = 3, a.Tq = 0, a.Tk = 6;  // no query rows
    r = run(vk(), a, rng);
    CHECK_MESSAGE(r.status == WKV_OK, r.message);
    for (const bool causal : {false, true})
        for (const bool buffers : {false, true}) {
            AttnCase p;
            p.causal = causal, p.buffers = buffers, p.Hq = 4, p.Hkv = 2, p.D = 32;
            p.q_off = {0, 5, 5, 25, 26, 60}, p.k_off = {0, 9, 12, 30, 30, 70};  // an empty sequence, a one-token one
            p.Tq = 60, p.Tk = 70;
            CAPTURE(causal);
            CAPTURE(buffers);
            check_run(vk(), p, rng);
        }
    check_no_validation_message();
}

TEST_CASE("vulkan attention: the golden files (torch's math attention in float64)") {
    check_attention_golden_files(vk());
    check_no_validation_message();
}

TEST_CASE("vulkan attention: refusals name the argument, nothing written") {
    HostTensor q(WKV_DTYPE_F32, {1, 4, 4, 300}), k(WKV_DTYPE_F32, {1, 6, 2, 300}), v(WKV_DTYPE_F32, {1, 6, 2, 300}),
        o(WKV_DTYPE_F32, {1, 4, 4, 300});
    o.poison();
    wkv_attention_desc d{};
    d.struct_size = sizeof d;
    d.q = q.view(), d.k = k.view(), d.v = v.view(), d.o = o.view();
    CHECK(wkv_attention(vk(), &d) == WKV_ERROR_UNSUPPORTED);
    CHECK(std::string(wkv_last_error(vk())).find("D = 300") != std::string::npos);
    for (double x : o.read()) CHECK(std::isnan(x));
    HostTensor q8(WKV_DTYPE_F32, {1, 4, 4, 8}), k8(WKV_DTYPE_F32, {1, 6, 2, 8}), v8(WKV_DTYPE_F32, {1, 6, 2, 8}),
        o8(WKV_DTYPE_F32, {1, 4, 4, 8});
    d.q = q8.view(), d.k = k8.view(), d.v = v8.view(), d.o = o8.view();
    d.config = "cpu.tiled.q128.kv64";  // another backend's
    CHECK(wkv_attention(vk(), &d) == WKV_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(wkv_last_error(vk())).find("not an attention configuration of the vulkan backend") !=
          std::string::npos);
    check_no_validation_message();
}

TEST_CASE("vulkan attention: a pinned configuration that does not fit, and lavapipe's loop limit, are refused") {
    int32_t n = 0;
    REQUIRE(wkv_attention_configs(vk(), nullptr, 0, &n) == WKV_OK);
    std::vector<wkv_attention_config> cfg((size_t)n);
    for (auto& c : cfg) c.struct_size = sizeof c;
    REQUIRE(wkv_attention_configs(vk(), cfg.data(), n, &n) == WKV_OK);
    HostTensor q(WKV_DTYPE_F32, {1, 4, 2, 8}), k(WKV_DTYPE_F32, {1, 6, 2, 8}), v(WKV_DTYPE_F32, {1, 6, 2, 8}),
        o(WKV_DTYPE_F32, {1, 4, 2, 8});
    wkv_attention_desc d{};
    d.struct_size = sizeof d;
    d.q = q.view(), d.k = k.view(), d.v = v.view(), d.o = o.view();
    for (const auto& c : cfg) {  // without subgroup shuffles (ctest wkv_vulkan_tests_no16) q16 does not fit
        if (c.fits) continue;
        CAPTURE(c.name);
        o.poison();
        d.config = c.name;
        CHECK(wkv_attention(vk(), &d) == WKV_ERROR_UNSUPPORTED);
        CHECK(std::string(wkv_last_error(vk())).find("does not fit this vulkan device") != std::string::npos);
        for (double x : o.read()) CHECK(std::isnan(x));
    }
    wkv_device_info dev{};
    dev.struct_size = sizeof dev;
    REQUIRE(wkv_device_get_info(WKV_BACKEND_VULKAN, 0, &dev) == WKV_OK);
    if (std::string(dev.name).find("llvmpipe") == std::string::npos) return;  // the limit is lavapipe's
    HostTensor kl(WKV_DTYPE_F32, {1, 40000, 2, 8}), vl(WKV_DTYPE_F32, {1, 40000, 2, 8});
    o.poison();
    d.config = nullptr, d.k = kl.view(), d.v = vl.view();
    CHECK(wkv_attention(vk(), &d) == WKV_ERROR_UNSUPPORTED);
    CHECK(std::string(wkv_last_error(vk())).find("lavapipe stops at 65535") != std::string::npos);
    for (double x : o.read()) CHECK(std::isnan(x));
    check_no_validation_message();
}
