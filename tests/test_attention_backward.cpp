// The backward of softmax attention (wkv_attention_backward) against the float64 reference
// (src/reference/attention.c), whose gradients are themselves checked against central
// differences of its forward: every dtype, mask, head grouping, D up to 256, Tq != Tk, rows and
// keys that see nothing, packed sequences, strides, large logits; the gradients poisoned first.
// Results identical for any thread count; every kind of bad input refused, naming the argument.
#include <cstring>
#include <limits>

#include "wkv_doctest.h"
#include "test_attention.h"
#include "test_util.h"

using namespace wkvtest;

namespace {

struct Ctx {
    wkv_context* ctx = nullptr;
    explicit Ctx(int32_t threads = 0) {
        wkv_context_options o{};
        o.struct_size = sizeof o;
        o.backend = WKV_BACKEND_CPU;
        o.cpu_threads = threads;
        REQUIRE(wkv_context_create(&o, &ctx) == WKV_OK);
    }
    ~Ctx() { wkv_context_destroy(ctx); }
};

}  // namespace

TEST_CASE("attention backward: the float64 reference's gradients are its forward's central differences") {
    Rng rng(test_seed());
    for (const bool causal : {false, true}) {
        wkv_ref_attention in{};
        in.B = 1, in.Tq = 5, in.Tk = 7, in.Hq = 4, in.Hkv = 2, in.D = 6;  // GQA, Tq < Tk
        in.causal = causal;
        in.scale = 0.7;
        const size_t nq = (size_t)(in.Tq * in.Hq * in.D), nk = (size_t)(in.Tk * in.Hkv * in.D);
        const size_t nl = (size_t)(in.Tq * in.Hq);
        std::vector<double> q = random_normal(rng, nq), k = random_normal(rng, nk), v = random_normal(rng, nk),
                            g = random_normal(rng, nq), gl = random_normal(rng, nl);
        in.q = q.data(), in.k = k.data(), in.v = v.data();
        std::vector<double> dq(nq), dk(nk), dv(nk), o(nq), lse(nl);
        wkv_ref_attention_backward(&in, g.data(), gl.data(), dq.data(), dk.data(), dv.data());
        auto loss = [&]() {  // o . g + lse . gl (causal rows 0.. see keys: Tq < Tk, lse finite)
            wkv_ref_attention_forward(&in, o.data(), lse.data());
            double l = 0;
            for (size_t i = 0; i < nq; ++i) l += o[i] * g[i];
            for (size_t i = 0; i < nl; ++i) l += lse[i] * gl[i];
            return l;
        };
        const std::pair<std::vector<double>*, std::vector<double>*> pairs[] = {{&q, &dq}, {&k, &dk}, {&v, &dv}};
        for (const auto& pr : pairs) {
            std::vector<double> fd(pr.first->size());
            for (size_t i = 0; i < fd.size(); ++i) {
                const double x = (*pr.first)[i], h = 1e-5;
                (*pr.first)[i] = x + h;
                const double lp = loss();
                (*pr.first)[i] = x - h;
                const double lm = loss();
                (*pr.first)[i] = x;
                fd[i] = (lp - lm) / (2 * h);
            }
            CHECK(rel_err(*pr.second, fd) <= 1e-7);
        }
    }
}

TEST_CASE("attention backward: against the float64 reference, every dtype, mask, grouping and D") {
    Ctx c;
    Rng rng(test_seed());
    // the three ways (attention_backward.cpp), by the (sequence, kv head) items: B = 1 with 2 kv
    // heads of 2 query heads: 2 items, 4 with slices, the three passes; B = 2: 4 items of 2
    // slices, the sliced single pass; B = 2 with 4 kv heads: 8 items, the single pass
    const int64_t ways[3][2] = {{1, 2}, {2, 2}, {2, 4}};  // B, kv heads
    for (const auto& way : ways)
        for (const wkv_dtype dt : {WKV_DTYPE_F32, WKV_DTYPE_F16, WKV_DTYPE_BF16})
            for (const bool causal : {false, true})
                for (const int64_t D : {16, 40, 64, 128, 256}) {
                    const int64_t kv_heads = way[1];
                    AttnCase a;
                    a.dtype = dt, a.causal = causal, a.D = D;
                    a.B = way[0], a.Tq = 77, a.Tk = 77, a.Hq = 2 * kv_heads, a.Hkv = kv_heads;  // tile tails, GQA
                    CAPTURE(a.B);
                    CAPTURE(kv_heads);
                    CAPTURE(dtype_name(dt));
                    CAPTURE(causal);
                    CAPTURE(D);
                    check_backward(c.ctx, a, rng);
                }
    // multi-query: B = 1 with 6 heads, the three passes (6 slices: too few items); 8 heads, 8
    // slices; B = 8, the single pass; and 2 kv heads of 3 query heads at B = 2: 4 items of 2
    // uneven slices (1 and 2 heads)
    const int64_t mqa[4][3] = {{1, 6, 1}, {1, 8, 1}, {8, 6, 1}, {2, 6, 2}};  // B, query heads, kv heads
    for (const auto& m : mqa)
    for (const bool causal : {false, true}) {
        CAPTURE(m[0]);
        CAPTURE(m[1]);
        CAPTURE(m[2]);
        CAPTURE(causal);
        AttnCase a;
        a.B = m[0], a.causal = causal;
        a.Tq = 7, a.Tk = 150, a.Hq = m[1], a.Hkv = m[2];  // Tq < Tk, multi-query
        check_backward(c.ctx, a, rng);
        a.Tq = 1, a.Tk = 1;  // one token
        check_backward(c.ctx, a, rng);
        a.Tq = 1, a.Tk = 300;  // a decode step
        check_backward(c.ctx, a, rng);
        a.Tq = 90, a.Tk = 9;  // Tq > Tk: causal rows before the first key see nothing (dq = 0)
        check_backward(c.ctx, a, rng);
        a.Tq = 130, a.Tk = 130, a.strided = true, a.scale = 0.3;  // strides, a given scale
        check_backward(c.ctx, a, rng);
        a.strided = false, a.scale = 0.0, a.logit_scale = 30.0;  // sharp softmax: logits ~100
        a.Tq = 33, a.Tk = 65;
        check_backward(c.ctx, a, rng);
        a.logit_scale = 1.0, a.dlse = true;  // a gradient of lse too (merging partial attentions)
        check_backward(c.ctx, a, rng);
        a.dtype = WKV_DTYPE_BF16;
        check_backward(c.ctx, a, rng);
    }
}

TEST_CASE("attention backward: packed sequences, and what sees nothing gets zeros") {
    Ctx c;
    Rng rng(test_seed());
    for (const bool causal : {false, true}) {
        CAPTURE(causal);
        AttnCase a;
        a.causal = causal;
        a.q_off = {0, 5, 5, 85, 86, 86};   // an empty sequence, a one-token one
        a.k_off = {0, 9, 12, 140, 141, 150};  // keys without queries (the last sequence)
        a.Tq = 86, a.Tk = 150, a.Hq = 4, a.Hkv = 2;  // 10 items: the single pass
        check_backward(c.ctx, a, rng);
        a.Hkv = 1;  // 5 items of 2 slices: the sliced single pass
        check_backward(c.ctx, a, rng);
        AttnBwdRun r = run_backward(c.ctx, a, rng);
        REQUIRE(r.status == WKV_OK);
        for (int64_t j = 141; j < 150; ++j)  // the last sequence's keys: no query sees them
            for (int64_t x = 0; x < a.Hkv * a.D; ++x) {
                CHECK(r.dk[(size_t)(j * a.Hkv * a.D + x)] == 0.0);
                CHECK(r.dv[(size_t)(j * a.Hkv * a.D + x)] == 0.0);
            }
    }
    AttnCase a;
    a.causal = true, a.Tq = 10, a.Tk = 4;  // rows 0..5 see no key: their dq is exactly 0
    AttnBwdRun r = run_backward(c.ctx, a, rng);
    REQUIRE(r.status == WKV_OK);
    for (int64_t x = 0; x < 6 * a.Hq * a.D; ++x) CHECK(r.dq[(size_t)x] == 0.0);
    CHECK(rel_err(r.dq, r.dq_ref) <= 2e-5);
    a.Tk = 0, a.causal = false;  // no keys at all: dq = 0
    check_backward(c.ctx, a, rng);
    a.B = 3, a.Tq = 0, a.Tk = 6;  // no query rows: dk = dv = 0
    check_backward(c.ctx, a, rng);
}

TEST_CASE("attention backward: the same bits for every thread count") {
    const int64_t ways[3][2] = {{1, 2}, {2, 2}, {2, 4}};  // B, kv heads: three passes, sliced, single
    for (const auto& way : ways) {
    const int64_t kv_heads = way[1];
    CAPTURE(way[0]);
    CAPTURE(kv_heads);
    std::vector<double> first[3];
    for (const int32_t threads : {1, 2, 5}) {
        Ctx c(threads);
        Rng rng(7);
        AttnCase a;
        a.causal = true, a.B = way[0], a.Tq = 200, a.Tk = 230, a.Hq = 2 * kv_heads, a.Hkv = kv_heads, a.D = 32;
        AttnBwdRun r = run_backward(c.ctx, a, rng);
        REQUIRE(r.status == WKV_OK);
        if (threads == 1) {
            first[0] = r.dq, first[1] = r.dk, first[2] = r.dv;
            continue;
        }
        CAPTURE(threads);
        CHECK(r.dq == first[0]);
        CHECK(r.dk == first[1]);
        CHECK(r.dv == first[2]);
    }
    }
}

TEST_CASE("attention backward: bad inputs get a status and a message naming the argument") {
    Ctx c;
    HostTensor q(WKV_DTYPE_F32, {1, 4, 4, 8}), k(WKV_DTYPE_F32, {1, 6, 2, 8}), v(WKV_DTYPE_F32, {1, 6, 2, 8}),
        o(WKV_DTYPE_F32, {1, 4, 4, 8}), lse(WKV_DTYPE_F32, {1, 4, 4}), g(WKV_DTYPE_F32, {1, 4, 4, 8}),
        dq(WKV_DTYPE_F32, {1, 4, 4, 8}), dk(WKV_DTYPE_F32, {1, 6, 2, 8}), dv(WKV_DTYPE_F32, {1, 6, 2, 8});
    Rng rng(3);
    for (HostTensor* t : {&q, &k, &v, &g}) fill_input(*t, random_normal(rng, (size_t)t->numel()));
    wkv_attention_desc f{};
    f.struct_size = sizeof f;
    f.q = q.view(), f.k = k.view(), f.v = v.view(), f.o = o.view(), f.lse = lse.view();
    REQUIRE(wkv_attention(c.ctx, &f) == WKV_OK);
    wkv_attention_desc fwd = f;
    auto base = [&]() {
        fwd = f;
        wkv_attention_backward_desc d{};
        d.struct_size = sizeof d;
        d.forward = &fwd;
        d.dout = g.view(), d.dq = dq.view(), d.dk = dk.view(), d.dv = dv.view();
        return d;
    };
    auto expect = [&](const wkv_attention_backward_desc& d, wkv_status st, const char* needle) {
        dq.poison(), dk.poison(), dv.poison();
        CAPTURE(needle);
        CHECK(wkv_attention_backward(c.ctx, &d) == st);
        CHECK(std::string(wkv_last_error(c.ctx)).find(needle) != std::string::npos);
        for (HostTensor* t : {&dq, &dk, &dv})
            for (double x : t->read()) CHECK(std::isnan(x));  // nothing written on failure
    };
    wkv_attention_backward_desc d = base();
    REQUIRE(wkv_attention_backward(c.ctx, &d) == WKV_OK);  // the base case is good
    CHECK(wkv_attention_backward(c.ctx, nullptr) == WKV_ERROR_NULL_POINTER);
    d = base(), d.struct_size = 8;
    expect(d, WKV_ERROR_STRUCT_SIZE, "desc->struct_size");
    d = base(), d.forward = nullptr;
    expect(d, WKV_ERROR_NULL_POINTER, "desc->forward is NULL");
    d = base(), fwd.struct_size = 8;
    expect(d, WKV_ERROR_STRUCT_SIZE, "desc->forward->struct_size");
    d = base(), fwd.lse.data = nullptr;
    expect(d, WKV_ERROR_NULL_POINTER, "desc->forward->lse.data is NULL: the backward reads the lse");
    d = base(), fwd.o.data = nullptr;
    expect(d, WKV_ERROR_NULL_POINTER, "desc->forward->o.data is NULL");
    HostTensor k3(WKV_DTYPE_F32, {1, 6, 3, 8});
    d = base(), fwd.k = k3.view(), fwd.v = k3.view();
    expect(d, WKV_ERROR_SHAPE, "not a multiple of desc->forward->k's 3");
    d = base(), fwd.flags = 0x10;
    expect(d, WKV_ERROR_INVALID_ARGUMENT, "desc->forward->flags");
    HostTensor g5(WKV_DTYPE_F32, {1, 5, 4, 8});
    d = base(), d.dout = g5.view();
    expect(d, WKV_ERROR_SHAPE, "desc->dout.shape[1] is 5, expected 4");
    HostTensor dk7(WKV_DTYPE_F32, {1, 6, 2, 7});
    d = base(), d.dk = dk7.view();
    expect(d, WKV_ERROR_SHAPE, "desc->dk.shape[3] is 7, expected 8");
    HostTensor dqh(WKV_DTYPE_BF16, {1, 4, 4, 8});
    d = base(), d.dq = dqh.view();
    expect(d, WKV_ERROR_DTYPE, "desc->dq has another dtype than desc->forward->q");
    d = base(), d.dv.data = nullptr;
    expect(d, WKV_ERROR_NULL_POINTER, "desc->dv.data is NULL");
    d = base(), d.dk = d.dv;
    expect(d, WKV_ERROR_ALIASING, "overlaps");
    d = base(), d.dq = g.view();
    expect(d, WKV_ERROR_ALIASING, "desc->dq overlaps desc->dout");
    d = base(), d.dk = k.view();
    expect(d, WKV_ERROR_ALIASING, "desc->dk overlaps desc->forward->k");
    d = base(), d.dq = o.view();
    expect(d, WKV_ERROR_ALIASING, "desc->dq overlaps desc->forward->o");
    HostTensor dl(WKV_DTYPE_F32, {1, 4, 5}), dlh(WKV_DTYPE_F16, {1, 4, 4});
    d = base(), d.dlse = dl.view();
    expect(d, WKV_ERROR_SHAPE, "desc->dlse.shape[2] is 5, expected 4");
    d = base(), d.dlse = dlh.view();
    expect(d, WKV_ERROR_DTYPE, "desc->dlse must be float32");
    HostTensor q3(WKV_DTYPE_F32, {1, 4, 4, 300}), k300(WKV_DTYPE_F32, {1, 6, 2, 300}), g300(WKV_DTYPE_F32, {1, 4, 4, 300}),
        dq300(WKV_DTYPE_F32, {1, 4, 4, 300}), dk300(WKV_DTYPE_F32, {1, 6, 2, 300}), dv300(WKV_DTYPE_F32, {1, 6, 2, 300}),
        o300(WKV_DTYPE_F32, {1, 4, 4, 300});
    d = base(), fwd.q = q3.view(), fwd.k = k300.view(), fwd.v = k300.view(), fwd.o = o300.view();
    d.dout = g300.view(), d.dq = dq300.view(), d.dk = dk300.view(), d.dv = dv300.view();
    CHECK(wkv_attention_backward(c.ctx, &d) == WKV_ERROR_UNSUPPORTED);
    CHECK(std::string(wkv_last_error(c.ctx)).find("D = 300") != std::string::npos);
}
