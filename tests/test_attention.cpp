// Softmax attention (wkv_attention) against the float64 reference (src/reference/attention.c):
// causal and not, grouped-query heads, packed sequences, Tq != Tk, T = 1, odd T, fully masked
// rows, large logits, strided tensors, every dtype and configuration; outputs poisoned first.
// And every kind of bad input refused with a message naming the argument.
#include <limits>

#include "wkv_doctest.h"
#include "test_attention.h"
#include "test_util.h"

using namespace wkvtest;

namespace {

struct Ctx {
    wkv_context* ctx = nullptr;
    Ctx() {
        wkv_context_options o{};
        o.struct_size = sizeof o;
        o.backend = WKV_BACKEND_CPU;
        REQUIRE(wkv_context_create(&o, &ctx) == WKV_OK);
    }
    ~Ctx() { wkv_context_destroy(ctx); }
};

}  // namespace

TEST_CASE("attention: against the float64 reference, every mask, head grouping and shape") {
    Ctx c;
    Rng rng(test_seed());
    for (const wkv_dtype dt : {WKV_DTYPE_F32, WKV_DTYPE_F16, WKV_DTYPE_BF16}) {
        for (const bool causal : {false, true}) {
            for (const int64_t D : {16, 32, 64, 80, 128}) {
                AttnCase a;
                a.dtype = dt, a.causal = causal, a.D = D;
                a.B = 2, a.Tq = 37, a.Tk = 37, a.Hq = 4, a.Hkv = 2;  // odd T, GQA
                CAPTURE(D);
                CAPTURE(causal);
                CAPTURE(dtype_name(dt));
                check_run(c.ctx, a, rng);
            }
        }
    }
    for (const bool causal : {false, true}) {
        CAPTURE(causal);
        AttnCase a;
        a.causal = causal;
        a.Tq = 7, a.Tk = 100, a.Hq = 6, a.Hkv = 1;  // Tq < Tk, multi-query
        check_run(c.ctx, a, rng);
        a.Tq = 1, a.Tk = 1;  // one token
        check_run(c.ctx, a, rng);
        a.Tq = 1, a.Tk = 300;  // a decode step against a long cache
        check_run(c.ctx, a, rng);
        a.Tq = 20, a.Tk = 9;  // Tq > Tk: causal rows before the first key see nothing
        check_run(c.ctx, a, rng);
        a.Tq = 130, a.Tk = 130, a.strided = true, a.scale = 0.3;  // tails of every tile, strides
        check_run(c.ctx, a, rng);
        a.strided = false, a.scale = 0.0, a.logit_scale = 300.0;  // logits of ~1e3: no overflow
        a.Tq = 33, a.Tk = 65;
        check_run(c.ctx, a, rng);
    }
}

TEST_CASE("attention: decode steps (a row or two per head), keys read as rows, heads grouped") {
    Ctx c;
    Rng rng(test_seed());
    for (const int64_t Tq : {1, 2})
        for (const int64_t Tk : {1, 63, 64, 65, 300})
            for (const auto& hh : {std::pair<int64_t, int64_t>{8, 8}, {8, 2}, {8, 1}}) {
                AttnCase a;
                a.Tq = Tq, a.Tk = Tk, a.Hq = hh.first, a.Hkv = hh.second, a.D = 64, a.B = 2;
                a.causal = Tk % 2 == 1;
                CAPTURE(Tq);
                CAPTURE(Tk);
                CAPTURE(a.Hkv);
                check_run(c.ctx, a, rng);  // float32 rows read in place
            }
    for (const wkv_dtype dt : {WKV_DTYPE_F32, WKV_DTYPE_F16, WKV_DTYPE_BF16})
        for (const int64_t D : {1, 16, 40, 128, 256})
            for (const bool strided : {false, true}) {
                // (D = 1 in 16 bits: a dozen outputs, each rounded once more than the reference:
                // their rel-RMS is noise around the tolerance)
                if (D == 1 && dt.bits == 16) continue;
                AttnCase a;
                a.dtype = dt, a.D = D, a.strided = strided, a.Tq = 1, a.Tk = 131, a.Hq = 6, a.Hkv = 2, a.B = 2;
                CAPTURE(dtype_name(dt));
                CAPTURE(D);
                CAPTURE(strided);
                check_run(c.ctx, a, rng);  // rows copied (16-bit, strided) or in place; D tails
            }
    AttnCase p;  // packed decode: one query row per sequence against caches of different lengths
    p.Hq = 4, p.Hkv = 1, p.D = 32, p.causal = true;
    p.q_off = {0, 1, 2, 3}, p.k_off = {0, 50, 51, 180};
    p.Tq = 3, p.Tk = 180;
    check_run(c.ctx, p, rng);
    int32_t n = 0;
    REQUIRE(wkv_attention_configs(c.ctx, nullptr, 0, &n) == WKV_OK);
    std::vector<wkv_attention_config> cfg((size_t)n);
    for (auto& x : cfg) x.struct_size = sizeof x;
    REQUIRE(wkv_attention_configs(c.ctx, cfg.data(), n, &n) == WKV_OK);
    for (const auto& x : cfg) {  // q4 tiles cannot hold a group's rows: heads one by one there
        AttnCase a;
        a.config = x.name, a.Tq = 2, a.Tk = 77, a.Hq = 12, a.Hkv = 3, a.D = 48, a.causal = true;
        CAPTURE(x.name);
        check_run(c.ctx, a, rng);
    }
}

TEST_CASE("attention: fully masked rows give zeros and -inf, never NaN") {
    Ctx c;
    Rng rng(test_seed());
    AttnCase a;
    a.causal = true, a.Tq = 10, a.Tk = 4;  // rows 0..5 see no key
    AttnRun r = run(c.ctx, a, rng);
    REQUIRE(r.status == WKV_OK);
    for (int64_t t = 0; t < 6; ++t)
        for (int64_t h = 0; h < a.Hq; ++h) {
            CHECK(r.lse[(size_t)(h * a.Tq + t)] == -std::numeric_limits<double>::infinity());
            for (int64_t d = 0; d < a.D; ++d) CHECK(r.o[(size_t)((t * a.Hq + h) * a.D + d)] == 0.0);
        }
    CHECK(rel_err(r.o, r.o_ref) <= 1e-5);
    a.Tk = 0, a.causal = false;  // no keys at all
    r = run(c.ctx, a, rng);
    REQUIRE(r.status == WKV_OK);
    for (double x : r.o) CHECK(x == 0.0);
    // no query rows, several batches: an empty output overlaps nothing (found by the fuzzer:
    // its contiguous strides are 0 along B, which the overlap check took for a broadcast)
    a.B = 3, a.Tq = 0, a.Tk = 6;
    r = run(c.ctx, a, rng);
    CHECK_MESSAGE(r.status == WKV_OK, r.message);
}

TEST_CASE("attention: packed variable-length sequences") {
    Ctx c;
    Rng rng(test_seed());
    for (const bool causal : {false, true}) {
        AttnCase a;
        a.causal = causal;
        a.q_off = {0, 5, 5, 25, 26};   // an empty sequence, a one-token one
        a.k_off = {0, 9, 12, 32, 33};  // a sequence with keys but no queries
        a.Tq = 26, a.Tk = 33, a.Hq = 4, a.Hkv = 2;
        CAPTURE(causal);
        check_run(c.ctx, a, rng);
    }
}

// bf16 q and k in calls of several query tiles per head take bf16 dot products on a CPU with
// AVX-512 BF16 (the avx512 path; the others convert to float32 first, as before): odd D (a
// zero-padded last pair), every tile configuration (kv64, kv128, the decode tiles' row step),
// masks, GQA, packed, strided, a scale, large logits.
TEST_CASE("attention: bf16 inputs over several tiles (bf16 dot products where the CPU has them)") {
    Ctx c;
    Rng rng(test_seed());
    for (const bool causal : {false, true})
        for (const int64_t D : {17, 40, 64, 128}) {
            AttnCase a;
            a.dtype = WKV_DTYPE_BF16, a.causal = causal, a.D = D;
            a.B = 2, a.Tq = 300, a.Tk = 310, a.Hq = 4, a.Hkv = 2;  // 3 tiles of the default 128 rows
            CAPTURE(D);
            CAPTURE(causal);
            check_run(c.ctx, a, rng);
        }
    for (const char* cfg : {"cpu.tiled.q256.kv128", "cpu.tiled.q64.kv64", "cpu.tiled.q4.kv128"}) {
        CAPTURE(cfg);
        AttnCase a;
        a.dtype = WKV_DTYPE_BF16, a.config = cfg, a.causal = true, a.D = 64, a.Tq = 260, a.Tk = 260;
        check_run(c.ctx, a, rng);
        a.strided = true, a.scale = 0.3, a.causal = false;
        check_run(c.ctx, a, rng);
        a.strided = false, a.scale = 0.0, a.logit_scale = 100.0;  // logits of ~1e2
        check_run(c.ctx, a, rng);
    }
    AttnCase p;
    p.dtype = WKV_DTYPE_BF16, p.causal = true, p.Hq = 4, p.Hkv = 1, p.D = 32;
    p.q_off = {0, 200, 200, 470}, p.k_off = {0, 210, 215, 500};
    p.Tq = 470, p.Tk = 500;
    check_run(c.ctx, p, rng);
}

TEST_CASE("attention: every configuration gives the same answer; the list describes them") {
    Ctx c;
    int32_t n = -1;
    REQUIRE(wkv_attention_configs(c.ctx, nullptr, 0, &n) == WKV_OK);
    REQUIRE(n >= 2);
    std::vector<wkv_attention_config> cfg((size_t)n);
    for (auto& x : cfg) x.struct_size = sizeof x;
    int32_t n2 = 0;
    REQUIRE(wkv_attention_configs(c.ctx, cfg.data(), n, &n2) == WKV_OK);
    CHECK(n2 == n);
    int defaults = 0;
    for (const auto& x : cfg) {
        CAPTURE(x.name);
        CHECK(x.name[0] != '\0');
        CHECK(x.block_q > 0);
        CHECK(x.block_kv > 0);
        CHECK(x.fits == 1);
        defaults += x.is_default;
        Rng rng(test_seed());
        AttnCase a;
        a.causal = true, a.Tq = 70, a.Tk = 150, a.Hq = 3, a.Hkv = 1, a.D = 40;
        a.config = x.name;
        check_run(c.ctx, a, rng);
    }
    CHECK(defaults == 1);
}

TEST_CASE("attention: bad inputs get a status and a message naming the argument") {
    Ctx c;
    HostTensor q(WKV_DTYPE_F32, {1, 4, 4, 8}), k(WKV_DTYPE_F32, {1, 6, 2, 8}), v(WKV_DTYPE_F32, {1, 6, 2, 8}),
        o(WKV_DTYPE_F32, {1, 4, 4, 8}), lse(WKV_DTYPE_F32, {1, 4, 4});
    auto base = [&]() {
        wkv_attention_desc d{};
        d.struct_size = sizeof d;
        d.q = q.view(), d.k = k.view(), d.v = v.view(), d.o = o.view(), d.lse = lse.view();
        return d;
    };
    auto expect = [&](wkv_attention_desc d, wkv_status st, const char* needle) {
        o.poison();
        CAPTURE(needle);
        CHECK(wkv_attention(c.ctx, &d) == st);
        CHECK(std::string(wkv_last_error(c.ctx)).find(needle) != std::string::npos);
        for (double x : o.read()) CHECK(std::isnan(x));  // nothing written on failure
    };
    REQUIRE(wkv_attention(c.ctx, nullptr) == WKV_ERROR_NULL_POINTER);
    wkv_attention_desc d = base();
    d.struct_size = 8;
    expect(d, WKV_ERROR_STRUCT_SIZE, "desc->struct_size");
    HostTensor k3(WKV_DTYPE_F32, {1, 6, 3, 8}), v3(WKV_DTYPE_F32, {1, 6, 3, 8});
    d = base(), d.k = k3.view(), d.v = v3.view();
    expect(d, WKV_ERROR_SHAPE, "not a multiple of desc->k's 3");
    HostTensor kd(WKV_DTYPE_F32, {1, 6, 2, 7});
    d = base(), d.k = kd.view();
    expect(d, WKV_ERROR_SHAPE, "desc->k.shape[3] is 7, expected 8");
    HostTensor vt(WKV_DTYPE_F32, {1, 5, 2, 8});
    d = base(), d.v = vt.view();
    expect(d, WKV_ERROR_SHAPE, "desc->v.shape[1] is 5, expected 6");
    HostTensor oh(WKV_DTYPE_F16, {1, 4, 4, 8});
    d = base(), d.o = oh.view();
    expect(d, WKV_ERROR_DTYPE, "desc->o has another dtype than desc->q");
    HostTensor lh(WKV_DTYPE_F16, {1, 4, 4});
    d = base(), d.lse = lh.view();
    expect(d, WKV_ERROR_DTYPE, "desc->lse must be float32");
    d = base(), d.o = q.view();
    expect(d, WKV_ERROR_ALIASING, "desc->o overlaps desc->q");
    d = base(), d.flags = 0x10;
    expect(d, WKV_ERROR_INVALID_ARGUMENT, "desc->flags");
    d = base(), d.scale = std::numeric_limits<float>::infinity();
    expect(d, WKV_ERROR_INVALID_ARGUMENT, "desc->scale");
    d = base(), d.o.data = nullptr;
    expect(d, WKV_ERROR_NULL_POINTER, "desc->o.data is NULL");
    const int64_t qo[] = {0, 3, 2, 4}, ko[] = {0, 2, 4, 6}, ko_short[] = {0, 2, 4, 5};
    d = base(), d.num_seqs = 3, d.q_offsets = qo, d.k_offsets = ko;
    expect(d, WKV_ERROR_SEQUENCE_OFFSETS, "desc->q_offsets[2] = 2 is less than q_offsets[1] = 3");
    const int64_t qo_ok[] = {0, 1, 2, 4};
    d = base(), d.num_seqs = 3, d.q_offsets = qo_ok, d.k_offsets = ko_short;
    expect(d, WKV_ERROR_SEQUENCE_OFFSETS, "desc->k_offsets[3] is 5 but the total Tk is 6");
    d = base(), d.num_seqs = 3, d.q_offsets = qo_ok;
    expect(d, WKV_ERROR_NULL_POINTER, "desc->k_offsets is NULL");
    d = base(), d.q_offsets = qo_ok;
    expect(d, WKV_ERROR_SEQUENCE_OFFSETS, "num_seqs is 0");
    d = base(), d.config = "no.such.config";
    expect(d, WKV_ERROR_INVALID_ARGUMENT, "\"no.such.config\" is not an attention configuration");
    HostTensor q3(WKV_DTYPE_F32, {1, 4, 4, 300}), k300(WKV_DTYPE_F32, {1, 6, 2, 300}), v300(WKV_DTYPE_F32, {1, 6, 2, 300}),
        o300(WKV_DTYPE_F32, {1, 4, 4, 300});
    d = base(), d.q = q3.view(), d.k = k300.view(), d.v = v300.view(), d.o = o300.view();
    CHECK(wkv_attention(c.ctx, &d) == WKV_ERROR_UNSUPPORTED);
    CHECK(std::string(wkv_last_error(c.ctx)).find("D = 300") != std::string::npos);
    int32_t n = 0;
    CHECK(wkv_attention_configs(c.ctx, nullptr, 2, &n) == WKV_ERROR_NULL_POINTER);
    CHECK(wkv_attention_configs(c.ctx, nullptr, 0, nullptr) == WKV_ERROR_NULL_POINTER);
    wkv_attention_config bad{};
    CHECK(wkv_attention_configs(c.ctx, &bad, 1, &n) == WKV_ERROR_STRUCT_SIZE);
}

TEST_CASE("attention: the golden files (torch's math attention in float64)") {
    Ctx c;
    check_attention_golden_files(c.ctx);
}
