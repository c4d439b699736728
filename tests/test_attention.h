// Shared by the attention suites (tests/test_attention.cpp on the CPU, the Vulkan suite): one
// call of wkv_attention on random inputs, its outputs poisoned first, against the float64
// reference (src/reference/attention.c).
#ifndef WKV_TEST_ATTENTION_H
#define WKV_TEST_ATTENTION_H

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "reference/wkv_reference.h"
#include "test_util.h"
#include "wkv_doctest.h"

namespace wkvtest {

struct AttnCase {
    int64_t B = 1, Tq = 5, Tk = 5, Hq = 2, Hkv = 2, D = 16;
    bool causal = false;
    double scale = 0.0;               // 0: 1/sqrt(D)
    std::vector<int64_t> q_off, k_off; // packed when not empty
    wkv_dtype dtype = WKV_DTYPE_F32;
    bool strided = false;             // q, k, v, o inside wider buffers ([B, T, H, 2D])
    double logit_scale = 1.0;         // multiplies q: large values test overflow handling
    const char* config = nullptr;
    bool buffers = false;             // every tensor in a wkv_buffer of the context (GPU backends)
    bool dlse = false;                // the backward also gets a gradient of lse
};

struct AttnRun {
    wkv_status status;
    std::string message;
    std::vector<double> o, lse, o_ref, lse_ref;
};

inline HostTensor make(wkv_dtype dt, int64_t B, int64_t T, int64_t H, int64_t D, bool strided) {
    if (!strided) return HostTensor(dt, {B, T, H, D});
    return HostTensor(dt, {B, T, H, D}, {T * H * 2 * D, H * 2 * D, 2 * D, 1}, 3);
}

inline AttnRun run(wkv_context* ctx, const AttnCase& c, Rng& rng) {
    AttnRun out;
    const int64_t nq = c.B * c.Tq * c.Hq * c.D, nk = c.B * c.Tk * c.Hkv * c.D;
    std::vector<double> q = random_normal(rng, (size_t)nq), k = random_normal(rng, (size_t)nk),
                        v = random_normal(rng, (size_t)nk);
    for (double& x : q) x *= c.logit_scale;
    q = rounded(c.dtype, q), k = rounded(c.dtype, k), v = rounded(c.dtype, v);
    HostTensor tq = make(c.dtype, c.B, c.Tq, c.Hq, c.D, c.strided), tk = make(c.dtype, c.B, c.Tk, c.Hkv, c.D, c.strided),
               tv = make(c.dtype, c.B, c.Tk, c.Hkv, c.D, c.strided), to = make(c.dtype, c.B, c.Tq, c.Hq, c.D, c.strided);
    HostTensor tl(WKV_DTYPE_F32, {c.B, c.Hq, c.Tq});
    fill_input(tq, q), fill_input(tk, k), fill_input(tv, v);
    to.poison(), tl.poison();
    wkv_attention_desc d{};
    d.struct_size = sizeof d;
    d.flags = c.causal ? WKV_ATTENTION_CAUSAL : 0;
    d.scale = (float)c.scale;
    d.q = tq.view(), d.k = tk.view(), d.v = tv.view(), d.o = to.view(), d.lse = tl.view();
    static float empty_storage[1];  // an empty tensor still needs a non-NULL data pointer
    for (wkv_tensor* t : {&d.q, &d.k, &d.v, &d.o, &d.lse})
        if (!t->data) t->data = empty_storage;
    if (!c.q_off.empty()) {
        d.q_offsets = c.q_off.data(), d.k_offsets = c.k_off.data();
        d.num_seqs = (int64_t)c.q_off.size() - 1;
    }
    d.config = c.config;
    std::vector<wkv_buffer*> bufs;
    if (c.buffers) {  // the same bytes in wkv_buffers; the outputs read back below
        HostTensor* hs[5] = {&tq, &tk, &tv, &to, &tl};
        wkv_tensor* ts[5] = {&d.q, &d.k, &d.v, &d.o, &d.lse};
        for (int i = 0; i < 5; ++i) {
            wkv_buffer* b = nullptr;
            REQUIRE(wkv_buffer_create(ctx, std::max<size_t>(hs[i]->buf.size(), 16), &b) == WKV_OK);
            if (!hs[i]->buf.empty()) REQUIRE(wkv_buffer_upload(ctx, b, 0, hs[i]->buf.data(), hs[i]->buf.size()) == WKV_OK);
            wkv_tensor t = wkv_tensor_make_buffer(b, ts[i]->byte_offset, ts[i]->dtype, ts[i]->ndim, ts[i]->shape);
            t.strides = ts[i]->strides;
            *ts[i] = t;
            bufs.push_back(b);
        }
    }
    out.status = wkv_attention(ctx, &d);
    out.message = wkv_last_error(ctx);
    if (c.buffers) {
        if (out.status == WKV_OK) REQUIRE(wkv_context_synchronize(ctx) == WKV_OK);
        if (!to.buf.empty()) REQUIRE(wkv_buffer_download(ctx, bufs[3], 0, to.buf.data(), to.buf.size()) == WKV_OK);
        if (!tl.buf.empty()) REQUIRE(wkv_buffer_download(ctx, bufs[4], 0, tl.buf.data(), tl.buf.size()) == WKV_OK);
        for (wkv_buffer* b : bufs) wkv_buffer_destroy(b);
    }
    if (out.status != WKV_OK) return out;
    CHECK(to.gaps_still_nan());
    out.o = to.read(), out.lse = tl.read();
    wkv_ref_attention in{};
    in.B = c.B, in.Tq = c.Tq, in.Tk = c.Tk, in.Hq = c.Hq, in.Hkv = c.Hkv, in.D = c.D;
    in.causal = c.causal;
    in.scale = c.scale != 0.0 ? (double)(float)c.scale : 1.0 / std::sqrt((double)c.D);
    in.q = q.data(), in.k = k.data(), in.v = v.data();
    if (!c.q_off.empty()) in.num_seqs = d.num_seqs, in.q_offsets = c.q_off.data(), in.k_offsets = c.k_off.data();
    out.o_ref.assign((size_t)nq, 0.0), out.lse_ref.assign((size_t)(c.B * c.Hq * c.Tq), 0.0);
    wkv_ref_attention_forward(&in, out.o_ref.data(), out.lse_ref.data());
    return out;
}

// lse rows that see no key are -inf in both; compare the finite ones.
inline void check_lse(const AttnRun& r, double tol) {
    std::vector<double> got, want;
    for (size_t i = 0; i < r.lse.size(); ++i) {
        if (std::isinf(r.lse_ref[i])) {
            CHECK(r.lse[i] == -std::numeric_limits<double>::infinity());
            continue;
        }
        got.push_back(r.lse[i]), want.push_back(r.lse_ref[i]);
    }
    if (!want.empty()) CHECK(rel_err(got, want) <= tol);
}

inline void check_run(wkv_context* ctx, const AttnCase& c, Rng& rng) {
    AttnRun r = run(ctx, c, rng);
    REQUIRE_MESSAGE(r.status == WKV_OK, r.message);
    const double tol = c.dtype.bits == 32 ? 1e-5 : 2e-3;
    // 16-bit outputs are rounded once more than the reference: the tolerance covers it
    CHECK(all_finite(r.o));
    CHECK_MESSAGE(rel_err(r.o, r.o_ref) <= tol, "rel err ", rel_err(r.o, r.o_ref));
    check_lse(r, 1e-5);
}

// ---- the backward (wkv_attention_backward): a forward with lse, then the backward of a random
// dout, the gradients poisoned first, against the float64 reference's.
struct AttnBwdRun {
    wkv_status status;
    std::string message;
    std::vector<double> dq, dk, dv, dq_ref, dk_ref, dv_ref;
};

inline AttnBwdRun run_backward(wkv_context* ctx, const AttnCase& c, Rng& rng) {
    AttnBwdRun out;
    const int64_t nq = c.B * c.Tq * c.Hq * c.D, nk = c.B * c.Tk * c.Hkv * c.D;
    std::vector<double> q = random_normal(rng, (size_t)nq), k = random_normal(rng, (size_t)nk),
                        v = random_normal(rng, (size_t)nk), g = random_normal(rng, (size_t)nq);
    for (double& x : q) x *= c.logit_scale;
    q = rounded(c.dtype, q), k = rounded(c.dtype, k), v = rounded(c.dtype, v), g = rounded(c.dtype, g);
    auto mk = [&](int64_t T, int64_t H) { return make(c.dtype, c.B, T, H, c.D, c.strided); };
    HostTensor tq = mk(c.Tq, c.Hq), tk = mk(c.Tk, c.Hkv), tv = mk(c.Tk, c.Hkv), to = mk(c.Tq, c.Hq), tg = mk(c.Tq, c.Hq),
               tdq = mk(c.Tq, c.Hq), tdk = mk(c.Tk, c.Hkv), tdv = mk(c.Tk, c.Hkv);
    HostTensor tl(WKV_DTYPE_F32, {c.B, c.Hq, c.Tq}), tgl(WKV_DTYPE_F32, {c.B, c.Hq, c.Tq});
    const std::vector<double> gl = random_normal(rng, (size_t)(c.B * c.Hq * c.Tq));
    fill_input(tq, q), fill_input(tk, k), fill_input(tv, v), fill_input(tg, g), fill_input(tgl, gl);
    to.poison(), tl.poison(), tdq.poison(), tdk.poison(), tdv.poison();
    wkv_attention_desc d{};
    d.struct_size = sizeof d;
    d.flags = c.causal ? WKV_ATTENTION_CAUSAL : 0;
    d.scale = (float)c.scale;
    d.q = tq.view(), d.k = tk.view(), d.v = tv.view(), d.o = to.view(), d.lse = tl.view();
    wkv_attention_backward_desc bd{};
    bd.struct_size = sizeof bd;
    bd.forward = &d;
    bd.dout = tg.view(), bd.dq = tdq.view(), bd.dk = tdk.view(), bd.dv = tdv.view();
    if (c.dlse) bd.dlse = tgl.view();
    static float empty_storage[1];  // an empty tensor still needs a non-NULL data pointer
    for (wkv_tensor* t : {&d.q, &d.k, &d.v, &d.o, &d.lse, &bd.dout, &bd.dq, &bd.dk, &bd.dv, &bd.dlse})
        if (!t->data && (t != &bd.dlse || c.dlse)) t->data = empty_storage;
    if (!c.q_off.empty()) {
        d.q_offsets = c.q_off.data(), d.k_offsets = c.k_off.data();
        d.num_seqs = (int64_t)c.q_off.size() - 1;
    }
    std::vector<wkv_buffer*> bufs;
    if (c.buffers) {  // every tensor of both calls in wkv_buffers; the gradients read back below
        HostTensor* hs[10] = {&tq, &tk, &tv, &to, &tl, &tg, &tgl, &tdq, &tdk, &tdv};
        wkv_tensor* ts[10] = {&d.q, &d.k, &d.v, &d.o, &d.lse, &bd.dout, &bd.dlse, &bd.dq, &bd.dk, &bd.dv};
        for (int i = 0; i < 10; ++i) {
            wkv_buffer* b = nullptr;
            REQUIRE(wkv_buffer_create(ctx, std::max<size_t>(hs[i]->buf.size(), 16), &b) == WKV_OK);
            if (!hs[i]->buf.empty()) REQUIRE(wkv_buffer_upload(ctx, b, 0, hs[i]->buf.data(), hs[i]->buf.size()) == WKV_OK);
            bufs.push_back(b);
            if (i == 6 && !c.dlse) continue;  // no dlse: the buffer stays unused
            wkv_tensor t = wkv_tensor_make_buffer(b, ts[i]->byte_offset, ts[i]->dtype, ts[i]->ndim, ts[i]->shape);
            t.strides = ts[i]->strides;
            *ts[i] = t;
        }
    }
    REQUIRE_MESSAGE(wkv_attention(ctx, &d) == WKV_OK, wkv_last_error(ctx));
    out.status = wkv_attention_backward(ctx, &bd);
    out.message = wkv_last_error(ctx);
    if (c.buffers) {
        if (out.status == WKV_OK) REQUIRE(wkv_context_synchronize(ctx) == WKV_OK);
        HostTensor* back[3] = {&tdq, &tdk, &tdv};
        for (int i = 0; i < 3; ++i)
            if (!back[i]->buf.empty())
                REQUIRE(wkv_buffer_download(ctx, bufs[(size_t)(7 + i)], 0, back[i]->buf.data(), back[i]->buf.size()) == WKV_OK);
        for (wkv_buffer* b : bufs) wkv_buffer_destroy(b);
    }
    if (out.status != WKV_OK) return out;
    CHECK(tdq.gaps_still_nan());
    CHECK(tdk.gaps_still_nan());
    CHECK(tdv.gaps_still_nan());
    out.dq = tdq.read(), out.dk = tdk.read(), out.dv = tdv.read();
    wkv_ref_attention in{};
    in.B = c.B, in.Tq = c.Tq, in.Tk = c.Tk, in.Hq = c.Hq, in.Hkv = c.Hkv, in.D = c.D;
    in.causal = c.causal;
    in.scale = c.scale != 0.0 ? (double)(float)c.scale : 1.0 / std::sqrt((double)c.D);
    in.q = q.data(), in.k = k.data(), in.v = v.data();
    if (!c.q_off.empty()) in.num_seqs = d.num_seqs, in.q_offsets = c.q_off.data(), in.k_offsets = c.k_off.data();
    out.dq_ref.assign((size_t)nq, 0.0), out.dk_ref.assign((size_t)nk, 0.0), out.dv_ref.assign((size_t)nk, 0.0);
    wkv_ref_attention_backward(&in, g.data(), c.dlse ? gl.data() : nullptr, out.dq_ref.data(), out.dk_ref.data(), out.dv_ref.data());
    return out;
}

// Measured: float32 4e-7 (6e-6 with logits ~100), f16 2.5e-4, bf16 2e-3 (the forward's o, which
// delta reads, and each gradient are rounded once more than the reference); bounds 2e-5, 1e-3, 5e-3.
inline void check_backward(wkv_context* ctx, const AttnCase& c, Rng& rng) {
    AttnBwdRun r = run_backward(ctx, c, rng);
    REQUIRE_MESSAGE(r.status == WKV_OK, r.message);
    const double tol = c.dtype.bits == 32 ? 2e-5 : c.dtype.code == WKV_DTYPE_CODE_BFLOAT ? 5e-3 : 1e-3;
    const std::pair<const char*, std::pair<std::vector<double>*, std::vector<double>*>> grads[] = {
        {"dq", {&r.dq, &r.dq_ref}}, {"dk", {&r.dk, &r.dk_ref}}, {"dv", {&r.dv, &r.dv_ref}}};
    for (const auto& gr : grads) {
        CAPTURE(gr.first);
        CHECK(all_finite(*gr.second.first));
        if (gr.second.first->empty()) continue;
        bool zero_ref = true;
        for (double x : *gr.second.second) zero_ref = zero_ref && x == 0.0;
        if (zero_ref) {  // nothing seen, or a cancellation (one key: ds = p (dp - delta) = 0)
            for (double x : *gr.second.first) CHECK(std::fabs(x) <= 1e-5);
            continue;
        }
        const double e = rel_err(*gr.second.first, *gr.second.second);
        CHECK_MESSAGE(e <= tol, gr.first, " rel err ", e);
    }
}

/* Every golden file of tests/golden/attention (torch's math attention in float64: plain, causal,
 * GQA, Tq != Tk, packed sequences) through ctx's wkv_attention in float32: o and lse within
 * 1e-5 rel-RMS. The same check for every backend's suite. */
inline void check_attention_golden_files(wkv_context* ctx) {
    std::vector<std::string> files;
    std::error_code ec;
    const std::string dir = golden_dir() + "/attention";
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
        if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    REQUIRE_MESSAGE(files.size() >= 6, "attention golden files in ", dir);
    for (const std::string& path : files) {
        CAPTURE(path);
        SafeTensors f;
        REQUIRE_MESSAGE(f.load(path), f.error);
        REQUIRE(f.meta("op") == "attention");
        const auto& qs = f.tensors.at("q").shape;
        const auto& ks = f.tensors.at("k").shape;
        const int64_t B = qs[0], Tq = qs[1], Hq = qs[2], D = qs[3], Tk = ks[1], Hkv = ks[2];
        std::vector<int64_t> qo, ko;
        {
            char err[256];
            st_file* sf = st_open(path.c_str(), err, sizeof err);
            REQUIRE_MESSAGE(sf, err);
            for (auto [name, out] : {std::pair<const char*, std::vector<int64_t>*>{"q_offsets", &qo}, {"k_offsets", &ko}}) {
                const st_tensor* t = st_find(sf, name);
                if (!t) continue;
                REQUIRE(t->dtype == ST_I64);
                out->resize((size_t)t->numel);
                std::memcpy(out->data(), t->data, (size_t)t->numel * 8);
            }
            st_close(sf);
        }
        HostTensor tq(WKV_DTYPE_F32, {B, Tq, Hq, D}), tk(WKV_DTYPE_F32, {B, Tk, Hkv, D}), tv(WKV_DTYPE_F32, {B, Tk, Hkv, D}),
            to(WKV_DTYPE_F32, {B, Tq, Hq, D}), tl(WKV_DTYPE_F32, {B, Hq, Tq});
        fill_input(tq, f.at("q")), fill_input(tk, f.at("k")), fill_input(tv, f.at("v"));
        to.poison(), tl.poison();
        wkv_attention_desc d{};
        d.struct_size = sizeof d;
        d.flags = f.meta("causal") == "1" ? WKV_ATTENTION_CAUSAL : 0;
        d.scale = (float)std::stod(f.meta("scale"));
        d.q = tq.view(), d.k = tk.view(), d.v = tv.view(), d.o = to.view(), d.lse = tl.view();
        if (!qo.empty()) d.q_offsets = qo.data(), d.k_offsets = ko.data(), d.num_seqs = (int64_t)qo.size() - 1;
        REQUIRE_MESSAGE(wkv_attention(ctx, &d) == WKV_OK, wkv_last_error(ctx));
        CHECK_MESSAGE(rel_err(to.read(), f.at("o")) <= 1e-5, "o rel err ", rel_err(to.read(), f.at("o")));
        AttnRun r;
        r.lse = tl.read(), r.lse_ref = f.at("lse");
        check_lse(r, 1e-5);
    }
}

} // namespace wkvtest

#endif
