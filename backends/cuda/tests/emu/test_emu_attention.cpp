// The CUDA attention kernels' device code (attention_kernel.cuh, attention_bwd_kernel.cuh) and
// their launch plan (attention_plan.h), run on the CPU by the fiber emulator (cuda_emu.h)
// against the float64 reference, forward and backward: every dtype, mask, head grouping, head
// dim 16..256 (tails of the 32-lane rows), Tq != Tk both ways, a decode step, strides, scale,
// large logits, rows that see no key, no keys at all, no rows, packed sequences (an empty one;
// more than one launch carries), lse or dlse absent. The outputs are NaN-poisoned, and shared
// memory starts as NaN: an element not written shows.
// What this cannot show — the CUDA compiler, the hardware, timing — the GPU suite
// (test_cuda_attention.cpp) does.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "wkv_doctest.h"

#include "cuda_emu.h"  // before the kernel: the CUDA built-ins on the host

#include "attention_bwd_kernel.cuh"
#include "attention_kernel.cuh"
#include "attention_mma_bwd_kernel.cuh"
#include "attention_mma_kernel.cuh"
#include "attention_plan.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "reference/wkv_reference.h"
#include "test_util.h"

using namespace wkvtest;

namespace {

struct Case {
    int64_t B = 1, Tq = 5, Tk = 5, Hq = 2, Hkv = 2, D = 16;
    bool causal = false, strided = false, lse = true;
    int kernel = wkv_cuda::kAttnSimt;  // the forward kernel
    float scale = 0.0f;
    double logit_scale = 1.0;
    std::vector<int64_t> q_off, k_off;
    wkv_dtype dtype = WKV_DTYPE_F32;
};

int32_t elem_code(wkv_dtype dt) { return dt.bits == 32 ? 0 : dt.code == WKV_DTYPE_F16.code ? 1 : 2; }

HostTensor tensor(const Case& c, int64_t T, int64_t H) {
    if (!c.strided) return HostTensor(c.dtype, {c.B, T, H, c.D});
    return HostTensor(c.dtype, {c.B, T, H, c.D}, {T * H * 2 * c.D, H * 2 * c.D, 2 * c.D, 1}, 3);
}

wkv_cuda::DevView dev(HostTensor& t, int32_t elem) {
    wkv_cuda::DevView v{};
    v.data = reinterpret_cast<char*>(t.buf.data()) + t.offset_elems * t.elem_size();
    for (int x = 0; x < 4; ++x) v.s[x] = t.strides[(size_t)x];
    v.elem = elem;
    return v;
}

struct Result {
    std::vector<double> o, lse, o_ref, lse_ref;
};

wkv_attention_problem problem(const Case& c) {
    wkv_attention_problem p{};
    p.B = c.B, p.Tq = c.Tq, p.Tk = c.Tk, p.Hq = c.Hq, p.Hkv = c.Hkv, p.D = c.D;
    p.num_seqs = c.q_off.empty() ? c.B : (int64_t)c.q_off.size() - 1;
    p.q_offsets = c.q_off.empty() ? nullptr : c.q_off.data();
    p.k_offsets = c.k_off.empty() ? nullptr : c.k_off.data();
    p.causal = c.causal;
    p.scale = c.scale != 0.0f ? c.scale : 1.0f / std::sqrt((float)c.D);
    return p;
}

// lse / dlse [B, Hq, Tq] as the kernels' [b, t, h, 0] view
wkv_cuda::DevView row_view(HostTensor& t, const Case& c) {
    wkv_cuda::DevView v = dev(t, 0);
    v.s[0] = c.Hq * c.Tq, v.s[1] = 1, v.s[2] = c.Tq, v.s[3] = 0;
    return v;
}

int g_mma_staging[2];      // mma forward calls that staged K/V element by element, 16 bytes at a time
int g_mma_bwd_staging[2];  // mma backward calls that staged Q/dout so, likewise

// Runs one kernel over the plan's launches; REQUIREs that none deadlocked.
template <class Params, class Body>
void run_plan(const wkv_attention_problem& p, int64_t unit, bool by_keys, int64_t heads, Params& prm,
              unsigned threads, size_t smem, Body&& body) {
    std::string error;
    const int64_t max_tiles = wkv_cuda::attn_max_tiles(&p, unit, by_keys);
    const int rc = wkv_cuda::attn_plan_launches(&p, unit, by_keys, heads, max_tiles, [&](const wkv_cuda::AttnSeqs& seq, int64_t blocks) {
        prm.seq = seq;
        error = wkv_emu::launch((unsigned)blocks, threads, smem, [&]() { body(prm); }, test_seed());
        return error.empty() ? 0 : 1;
    });
    REQUIRE_MESSAGE(rc == 0, error);
}

// The emulated forward: o (and lse unless lse_out is NULL) from q, k, v.
void forward(const Case& c, HostTensor& tq, HostTensor& tk, HostTensor& tv, HostTensor& to, HostTensor* lse_out) {
    const wkv_attention_problem p = problem(c);
    const int32_t e = elem_code(c.dtype);
    wkv_cuda::AttnFwdParams prm{};
    prm.q = dev(tq, e), prm.k = dev(tk, e), prm.v = dev(tv, e), prm.o = dev(to, e);
    if (lse_out) prm.lse = row_view(*lse_out, c);
    prm.sh = wkv_cuda::attn_shape(&p);
    if (c.kernel == wkv_cuda::kAttnMma) {
        prm.sh.kv_vec16 = wkv_cuda::attn_rows_vec16(&p, prm.k, prm.v);
        ++g_mma_staging[prm.sh.kv_vec16];
        const size_t smem = wkv_cuda::attn::mma_fwd_smem_bytes((int)c.D);
        const bool bf16 = e == 2;
        run_plan(p, wkv_cuda::attn::kMmaRows, false, p.Hq, prm, wkv_cuda::attn::kMmaWarps * 32, smem,
                 [&](const wkv_cuda::AttnFwdParams& x) {
                     if (c.D == 64 && bf16) wkv_cuda::attn::attn_fwd_mma<64, true>(x);
                     else if (c.D == 64) wkv_cuda::attn::attn_fwd_mma<64, false>(x);
                     else if (bf16) wkv_cuda::attn::attn_fwd_mma<128, true>(x);
                     else wkv_cuda::attn::attn_fwd_mma<128, false>(x);
                 });
        return;
    }
    const int dpl = wkv_cuda::attn::attn_dpl((int)c.D);
    const size_t smem = wkv_cuda::attn::attn_simt_smem_bytes((int)c.D);
    run_plan(p, wkv_cuda::attn::kAttnRows, false, p.Hq, prm, wkv_cuda::attn::kAttnWarps * 32, smem,
             [&](const wkv_cuda::AttnFwdParams& x) {
                 if (dpl == 2) wkv_cuda::attn::attn_fwd_simt<2>(x);
                 else if (dpl == 4) wkv_cuda::attn::attn_fwd_simt<4>(x);
                 else wkv_cuda::attn::attn_fwd_simt<8>(x);
             });
}

wkv_ref_attention reference(const Case& c, const std::vector<double>& q, const std::vector<double>& k,
                            const std::vector<double>& v) {
    const wkv_attention_problem p = problem(c);
    wkv_ref_attention in{};
    in.B = c.B, in.Tq = c.Tq, in.Tk = c.Tk, in.Hq = c.Hq, in.Hkv = c.Hkv, in.D = c.D;
    in.causal = c.causal;
    in.scale = (double)p.scale;
    in.q = q.data(), in.k = k.data(), in.v = v.data();
    if (!c.q_off.empty()) in.num_seqs = p.num_seqs, in.q_offsets = c.q_off.data(), in.k_offsets = c.k_off.data();
    return in;
}

Result run(const Case& c, Rng& rng) {
    const int64_t nq = c.B * c.Tq * c.Hq * c.D, nk = c.B * c.Tk * c.Hkv * c.D;
    std::vector<double> q = random_normal(rng, (size_t)nq), k = random_normal(rng, (size_t)nk),
                        v = random_normal(rng, (size_t)nk);
    for (double& x : q) x *= c.logit_scale;
    q = rounded(c.dtype, q), k = rounded(c.dtype, k), v = rounded(c.dtype, v);
    HostTensor tq = tensor(c, c.Tq, c.Hq), tk = tensor(c, c.Tk, c.Hkv), tv = tensor(c, c.Tk, c.Hkv),
               to = tensor(c, c.Tq, c.Hq);
    HostTensor tl(WKV_DTYPE_F32, {c.B, c.Hq, c.Tq});
    tq.fill(q), tk.fill(k), tv.fill(v);
    to.poison(), tl.poison();
    forward(c, tq, tk, tv, to, c.lse ? &tl : nullptr);
    CHECK(to.gaps_still_nan());
    Result r;
    r.o = to.read(), r.lse = tl.read();
    const wkv_ref_attention in = reference(c, q, k, v);
    r.o_ref.assign((size_t)nq, 0.0), r.lse_ref.assign((size_t)(c.B * c.Hq * c.Tq), 0.0);
    wkv_ref_attention_forward(&in, r.o_ref.data(), r.lse_ref.data());
    return r;
}

// The emulated backward after the emulated forward, against the float64 reference's
// gradients; with_dlse: a random gradient of lse too.
void check_backward(const Case& c, Rng& rng, bool with_dlse = false) {
    const int64_t nq = c.B * c.Tq * c.Hq * c.D, nk = c.B * c.Tk * c.Hkv * c.D, nl = c.B * c.Hq * c.Tq;
    std::vector<double> q = random_normal(rng, (size_t)nq), k = random_normal(rng, (size_t)nk),
                        v = random_normal(rng, (size_t)nk), g = random_normal(rng, (size_t)nq);
    const std::vector<double> gl = random_normal(rng, (size_t)nl);
    for (double& x : q) x *= c.logit_scale;
    q = rounded(c.dtype, q), k = rounded(c.dtype, k), v = rounded(c.dtype, v), g = rounded(c.dtype, g);
    HostTensor tq = tensor(c, c.Tq, c.Hq), tk = tensor(c, c.Tk, c.Hkv), tv = tensor(c, c.Tk, c.Hkv),
               to = tensor(c, c.Tq, c.Hq), tg = tensor(c, c.Tq, c.Hq), tdq = tensor(c, c.Tq, c.Hq),
               tdk = tensor(c, c.Tk, c.Hkv), tdv = tensor(c, c.Tk, c.Hkv);
    HostTensor tl(WKV_DTYPE_F32, {c.B, c.Hq, c.Tq}), tgl(WKV_DTYPE_F32, {c.B, c.Hq, c.Tq});
    tq.fill(q), tk.fill(k), tv.fill(v), tg.fill(g), tgl.fill(gl);
    to.poison(), tl.poison(), tdq.poison(), tdk.poison(), tdv.poison();
    forward(c, tq, tk, tv, to, &tl);

    const wkv_attention_problem p = problem(c);
    const int32_t e = elem_code(c.dtype);
    wkv_cuda::AttnBwdParams prm{};
    prm.q = dev(tq, e), prm.k = dev(tk, e), prm.v = dev(tv, e), prm.o = dev(to, e), prm.lse = row_view(tl, c);
    prm.dout = dev(tg, e), prm.dq = dev(tdq, e), prm.dk = dev(tdk, e), prm.dv = dev(tdv, e);
    if (with_dlse) prm.dlse = row_view(tgl, c);
    prm.sh = wkv_cuda::attn_shape(&p);
    if (c.kernel == wkv_cuda::kAttnMma) {
        prm.sh.kv_vec16 = wkv_cuda::attn_rows_vec16(&p, prm.k, prm.v);
        prm.qd_vec16 = wkv_cuda::attn_rows_vec16(&p, prm.q, prm.dout);
        ++g_mma_bwd_staging[prm.qd_vec16];
        const size_t smem = wkv_cuda::attn::mma_bwd_smem_bytes((int)c.D);
        const bool bf16 = e == 2;
        const unsigned threads = wkv_cuda::attn::kMmaWarps * 32;
        using wkv_cuda::AttnBwdParams;
        run_plan(p, 64, true, p.Hkv, prm, threads, smem, [&](const AttnBwdParams& x) {
            if (c.D == 64 && bf16) wkv_cuda::attn::attn_bwd_kv_mma<64, true>(x);
            else if (c.D == 64) wkv_cuda::attn::attn_bwd_kv_mma<64, false>(x);
            else if (bf16) wkv_cuda::attn::attn_bwd_kv_mma<128, true>(x);
            else wkv_cuda::attn::attn_bwd_kv_mma<128, false>(x);
        });
        run_plan(p, 64, false, p.Hq, prm, threads, smem, [&](const AttnBwdParams& x) {
            if (c.D == 64 && bf16) wkv_cuda::attn::attn_bwd_q_mma<64, true>(x);
            else if (c.D == 64) wkv_cuda::attn::attn_bwd_q_mma<64, false>(x);
            else if (bf16) wkv_cuda::attn::attn_bwd_q_mma<128, true>(x);
            else wkv_cuda::attn::attn_bwd_q_mma<128, false>(x);
        });
    } else {
    const int dpl = wkv_cuda::attn::attn_dpl((int)c.D);
    const size_t kv_smem = wkv_cuda::attn::bwd_kv_simt_smem_bytes((int)c.D);
    const size_t q_smem = wkv_cuda::attn::bwd_q_simt_smem_bytes((int)c.D);
    run_plan(p, wkv_cuda::attn::kBwdKeys, true, p.Hkv, prm, 32, kv_smem,
             [&](const wkv_cuda::AttnBwdParams& x) { wkv_cuda::attn::attn_bwd_kv_simt(x); });
    run_plan(p, wkv_cuda::attn::kBwdRows, false, p.Hq, prm, wkv_cuda::attn::kBwdWarps * 32, q_smem,
             [&](const wkv_cuda::AttnBwdParams& x) {
                 if (dpl == 2) wkv_cuda::attn::attn_bwd_q_simt<2>(x);
                 else if (dpl == 4) wkv_cuda::attn::attn_bwd_q_simt<4>(x);
                 else wkv_cuda::attn::attn_bwd_q_simt<8>(x);
             });
    }
    CHECK(tdq.gaps_still_nan());
    CHECK(tdk.gaps_still_nan());
    const wkv_ref_attention in = reference(c, q, k, v);
    std::vector<double> dq((size_t)nq), dk((size_t)nk), dv((size_t)nk);
    wkv_ref_attention_backward(&in, g.data(), with_dlse ? gl.data() : nullptr, dq.data(), dk.data(), dv.data());
    // measured (the CPU suite's bounds): f32 ~4e-7, f16 ~2.5e-4, bf16 ~2e-3
    const double tol = c.dtype.bits == 32 ? 2e-5 : c.dtype.code == WKV_DTYPE_CODE_BFLOAT ? 5e-3 : 1e-3;
    const std::vector<double> got[3] = {tdq.read(), tdk.read(), tdv.read()};
    const std::vector<double>* want[3] = {&dq, &dk, &dv};
    const char* names[3] = {"dq", "dk", "dv"};
    for (int x = 0; x < 3; ++x) {
        CAPTURE(names[x]);
        CHECK(all_finite(got[x]));
        bool zero_ref = true;
        for (double y : *want[x]) zero_ref = zero_ref && y == 0.0;
        if (zero_ref) {  // nothing seen, or a cancellation (one key: ds = 0)
            for (double y : got[x]) CHECK(std::fabs(y) <= 1e-5);
            continue;
        }
        CHECK_MESSAGE(rel_err(got[x], *want[x]) <= tol, names[x], " rel err ", rel_err(got[x], *want[x]));
    }
}

void check(const Case& c, Rng& rng) {
    const Result r = run(c, rng);
    // 16-bit I/O: 2e-3 (the mma kernel also rounds p to 16 bits for P V: measured below)
    const double tol = c.dtype.bits == 32 ? 1e-5 : 2e-3;
    CHECK(all_finite(r.o));
    CHECK_MESSAGE(rel_err(r.o, r.o_ref) <= tol, "o rel err ", rel_err(r.o, r.o_ref));
    if (!c.lse) {
        for (double x : r.lse) CHECK(std::isnan(x));  // not asked: not written
        return;
    }
    std::vector<double> got, want;
    for (size_t i = 0; i < r.lse.size(); ++i) {
        if (std::isinf(r.lse_ref[i])) {
            CHECK(r.lse[i] == -std::numeric_limits<double>::infinity());
            continue;
        }
        got.push_back(r.lse[i]), want.push_back(r.lse_ref[i]);
    }
    if (!want.empty()) CHECK_MESSAGE(rel_err(got, want) <= 1e-5, "lse rel err ", rel_err(got, want));
}

}  // namespace

TEST_CASE("cuda attention (emulated): every dtype, mask and head dim, grouped heads, odd T") {
    Rng rng(test_seed());
    for (const wkv_dtype dt : {WKV_DTYPE_F32, WKV_DTYPE_F16, WKV_DTYPE_BF16})
        for (const bool causal : {false, true})
            for (const int64_t D : {16, 40, 64, 96, 128, 256}) {
                Case c;
                c.dtype = dt, c.causal = causal, c.D = D;
                c.B = 2, c.Tq = 21, c.Tk = 37, c.Hq = 2, c.Hkv = 1;  // tails of the row and key blocks
                CAPTURE(D);
                CAPTURE(causal);
                CAPTURE(dtype_name(dt));
                check(c, rng);
            }
}

TEST_CASE("cuda attention (emulated): shapes, strides, scale, large logits, lse absent") {
    Rng rng(test_seed());
    for (const bool causal : {false, true}) {
        CAPTURE(causal);
        Case c;
        c.causal = causal;
        c.Tq = 7, c.Tk = 70, c.Hq = 6, c.Hkv = 1;  // Tq < Tk, multi-query
        check(c, rng);
        c.Tq = 1, c.Tk = 1;  // one token
        check(c, rng);
        c.Tq = 1, c.Tk = 100;  // a decode step
        check(c, rng);
        c.Tq = 40, c.Tk = 9;  // Tq > Tk: causal rows before the first key see nothing
        check(c, rng);
        c.Tq = 33, c.Tk = 33, c.strided = true, c.scale = 0.3f, c.dtype = WKV_DTYPE_BF16;  // strides
        check(c, rng);
        c.strided = false, c.scale = 0.0f, c.logit_scale = 300.0, c.dtype = WKV_DTYPE_F32;  // logits ~1e3
        check(c, rng);
        c.logit_scale = 1.0, c.lse = false;
        check(c, rng);
    }
}

TEST_CASE("cuda attention (emulated): rows that see no key, no keys, packed sequences") {
    Rng rng(test_seed());
    Case c;
    c.causal = true, c.Tq = 10, c.Tk = 4;  // rows 0..5 see no key: o = 0, lse = -inf
    Result r = run(c, rng);
    for (int64_t t = 0; t < 6; ++t)
        for (int64_t h = 0; h < c.Hq; ++h) {
            CHECK(r.lse[(size_t)(h * c.Tq + t)] == -std::numeric_limits<double>::infinity());
            for (int64_t d = 0; d < c.D; ++d) CHECK(r.o[(size_t)((t * c.Hq + h) * c.D + d)] == 0.0);
        }
    CHECK(rel_err(r.o, r.o_ref) <= 1e-5);
    c.Tk = 0, c.causal = false;  // no keys at all
    r = run(c, rng);
    for (double x : r.o) CHECK(x == 0.0);
    for (double x : r.lse) CHECK(x == -std::numeric_limits<double>::infinity());
    for (const bool causal : {false, true}) {
        CAPTURE(causal);
        Case p;
        p.causal = causal, p.Hq = 4, p.Hkv = 2, p.D = 32;
        p.q_off = {0, 5, 5, 25, 26, 60}, p.k_off = {0, 9, 12, 30, 30, 70};  // an empty sequence, a one-token one
        p.Tq = 60, p.Tk = 70;
        check(p, rng);
    }
    Case many;  // more sequences than one launch carries (kMaxSeqsPerLaunch)
    many.Hq = 1, many.Hkv = 1, many.D = 16, many.causal = true;
    for (int64_t s = 0, tq = 0, tk = 0; s <= 140; ++s) {
        many.q_off.push_back(tq), many.k_off.push_back(tk);
        tq += s % 3, tk += s % 3 + s % 2;
    }
    many.Tq = many.q_off.back(), many.Tk = many.k_off.back();
    int launches = 0;
    wkv_attention_problem p{};
    p.B = 1, p.Tq = many.Tq, p.Tk = many.Tk, p.Hq = 1, p.Hkv = 1, p.D = 16;
    p.num_seqs = (int64_t)many.q_off.size() - 1, p.q_offsets = many.q_off.data(), p.k_offsets = many.k_off.data();
    wkv_cuda::attn_plan_launches(&p, 16, false, 1, wkv_cuda::attn_max_tiles(&p, 16, false),
                                 [&](const wkv_cuda::AttnSeqs&, int64_t) { return ++launches, 0; });
    CHECK(launches == 2);
    check(many, rng);
}

TEST_CASE("cuda emulator: a missing barrier and divergent barriers are caught") {
    // a kernel that reads a neighbour's shared-memory element without __syncthreads: some
    // shuffled schedule reads it before it is written (NaN)
    int stale = 0;
    for (uint64_t seed = 1; seed <= 8; ++seed) {
        std::vector<float> out(64, 0.0f);
        const std::string e = wkv_emu::launch(1, 64, 64 * sizeof(float), [&]() {
            WKV_DYNAMIC_SHARED(float, s);
            const unsigned t = threadIdx.x;
            s[t] = (float)t;
            out[t] = s[(t + 1) % 64];
        }, seed);
        CHECK(e.empty());
        for (float x : out) stale += std::isnan(x) ? 1 : 0;
    }
    CHECK(stale > 0);
    // with the barrier every read sees the write
    std::vector<float> out(64, 0.0f);
    CHECK(wkv_emu::launch(1, 64, 64 * sizeof(float), [&]() {
              WKV_DYNAMIC_SHARED(float, s);
              const unsigned t = threadIdx.x;
              s[t] = (float)t;
              __syncthreads();
              out[t] = s[(t + 1) % 64];
          }).empty());
    for (unsigned t = 0; t < 64; ++t) CHECK(out[t] == (float)((t + 1) % 64));
    // a barrier only half the block reaches
    const std::string e = wkv_emu::launch(1, 64, 0, [&]() {
        if (threadIdx.x < 32) __syncthreads();
    });
    CHECK(e.find("deadlock") != std::string::npos);
    // warp shuffles: a butterfly sum over each warp of a 48-thread block (a partial warp)
    std::vector<float> sums(48, 0.0f);
    CHECK(wkv_emu::launch(1, 48, 0, [&]() {
              float x = (float)threadIdx.x;
              for (int o = 1; o < 16; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
              sums[threadIdx.x] = x;
          }).empty());
    for (unsigned t = 0; t < 48; ++t) {
        float want = 0.0f;
        for (unsigned u = t / 16 * 16; u < t / 16 * 16 + 16; ++u) want += (float)u;
        CHECK(sums[t] == want);
    }
}

TEST_CASE("cuda attention backward (emulated): every dtype, mask and head dim, grouped heads, odd T") {
    Rng rng(test_seed());
    for (const wkv_dtype dt : {WKV_DTYPE_F32, WKV_DTYPE_F16, WKV_DTYPE_BF16})
        for (const bool causal : {false, true})
            for (const int64_t D : {16, 40, 64, 96, 128, 256}) {
                Case c;
                c.dtype = dt, c.causal = causal, c.D = D;
                c.B = 2, c.Tq = 21, c.Tk = 37, c.Hq = 2, c.Hkv = 1;  // tails of the row and key tiles
                CAPTURE(D);
                CAPTURE(causal);
                CAPTURE(dtype_name(dt));
                check_backward(c, rng, D == 64);
            }
}

TEST_CASE("cuda attention backward (emulated): shapes, strides, scale, dlse, no rows or keys, packed") {
    Rng rng(test_seed());
    for (const bool causal : {false, true}) {
        CAPTURE(causal);
        Case c;
        c.causal = causal;
        c.Tq = 7, c.Tk = 70, c.Hq = 6, c.Hkv = 1;  // Tq < Tk, multi-query: dk, dv sum over 6 heads
        check_backward(c, rng);
        c.Tq = 1, c.Tk = 1;  // one token: dk = 0 by cancellation
        check_backward(c, rng);
        c.Tq = 1, c.Tk = 100;  // a decode step
        check_backward(c, rng, true);
        c.Tq = 40, c.Tk = 9;  // Tq > Tk: causal rows before the first key see nothing (dq = 0)
        check_backward(c, rng);
        c.Tq = 33, c.Tk = 33, c.strided = true, c.scale = 0.3f, c.dtype = WKV_DTYPE_BF16;  // strides
        check_backward(c, rng, true);
        c.strided = false, c.scale = 0.0f, c.logit_scale = 30.0, c.dtype = WKV_DTYPE_F32;  // logits ~100
        check_backward(c, rng);
        c.logit_scale = 1.0, c.Tq = 0, c.Tk = 6;  // no rows: dk = dv = 0
        check_backward(c, rng);
        c.Tq = 6, c.Tk = 0;  // no keys: dq = 0
        check_backward(c, rng);
    }
    for (const bool causal : {false, true}) {
        CAPTURE(causal);
        Case p;
        p.causal = causal, p.Hq = 4, p.Hkv = 2, p.D = 32;
        p.q_off = {0, 5, 5, 25, 26, 60, 60}, p.k_off = {0, 9, 12, 30, 30, 70, 75};  // empty, one-token, keys no row sees
        p.Tq = 60, p.Tk = 75;
        check_backward(p, rng, true);
    }
}

TEST_CASE("cuda attention mma (emulated): f16/bf16, D 64/128, masks, grouped heads, tails, packed") {
    Rng rng(test_seed());
    for (const wkv_dtype dt : {WKV_DTYPE_F16, WKV_DTYPE_BF16})
        for (const bool causal : {false, true})
            for (const int64_t D : {64, 128}) {
                Case c;
                c.kernel = wkv_cuda::kAttnMma;
                c.dtype = dt, c.causal = causal, c.D = D;
                c.B = 2, c.Tq = 70, c.Tk = 83, c.Hq = 2, c.Hkv = 1;  // a full and a partial row tile, 2 key blocks
                CAPTURE(D);
                CAPTURE(causal);
                CAPTURE(dtype_name(dt));
                check(c, rng);
            }
    for (const bool causal : {false, true}) {
        CAPTURE(causal);
        Case c;
        c.kernel = wkv_cuda::kAttnMma, c.dtype = WKV_DTYPE_BF16, c.D = 64, c.causal = causal;
        c.Tq = 1, c.Tk = 130;  // a decode step: one row of the 64
        check(c, rng);
        c.Tq = 100, c.Tk = 9, c.Hq = 3, c.Hkv = 3;  // Tq > Tk: rows that see no key
        check(c, rng);
        c.Tq = 65, c.Tk = 65, c.strided = true, c.scale = 0.3f, c.dtype = WKV_DTYPE_F16;  // strides
        check(c, rng);
        c.strided = false, c.scale = 0.0f, c.logit_scale = 30.0;  // logits ~100: the rescale
        check(c, rng);
        c.logit_scale = 1.0, c.lse = false;
        check(c, rng);
        c.lse = true, c.Tk = 0;  // no keys
        const Result r = run(c, rng);
        for (double x : r.o) CHECK(x == 0.0);
        Case p;
        p.kernel = wkv_cuda::kAttnMma, p.dtype = WKV_DTYPE_BF16, p.D = 64, p.causal = causal, p.Hq = 4, p.Hkv = 2;
        p.q_off = {0, 5, 5, 85, 86, 160}, p.k_off = {0, 9, 12, 100, 100, 170};
        p.Tq = 160, p.Tk = 170;
        check(p, rng);
    }
    CHECK(g_mma_staging[0] > 0);  // the strided case
    CHECK(g_mma_staging[1] > 0);  // the contiguous ones
}

TEST_CASE("cuda attention mma backward (emulated): f16/bf16, D 64/128, masks, grouped heads, tails, packed") {
    Rng rng(test_seed());
    for (const wkv_dtype dt : {WKV_DTYPE_F16, WKV_DTYPE_BF16})
        for (const bool causal : {false, true})
            for (const int64_t D : {64, 128}) {
                Case c;
                c.kernel = wkv_cuda::kAttnMma;
                c.dtype = dt, c.causal = causal, c.D = D;
                c.B = 2, c.Tq = 70, c.Tk = 83, c.Hq = 2, c.Hkv = 1;  // partial row and key tiles, 2 heads per kv head
                CAPTURE(D);
                CAPTURE(causal);
                CAPTURE(dtype_name(dt));
                check_backward(c, rng, D == 64);
            }
    for (const bool causal : {false, true}) {
        CAPTURE(causal);
        Case c;
        c.kernel = wkv_cuda::kAttnMma, c.dtype = WKV_DTYPE_BF16, c.D = 64, c.causal = causal;
        c.Tq = 1, c.Tk = 130;  // a decode step
        check_backward(c, rng, true);
        c.Tq = 100, c.Tk = 9, c.Hq = 3, c.Hkv = 3;  // Tq > Tk: rows that see no key (dq = 0)
        check_backward(c, rng);
        c.Tq = 65, c.Tk = 65, c.strided = true, c.scale = 0.3f, c.dtype = WKV_DTYPE_F16;  // strides: element staging
        check_backward(c, rng);
        c.strided = false, c.scale = 0.0f, c.logit_scale = 10.0;  // logits ~30
        check_backward(c, rng);
        c.logit_scale = 1.0, c.Tq = 0, c.Tk = 6;  // no rows: dk = dv = 0
        check_backward(c, rng);
        c.Tq = 6, c.Tk = 0;  // no keys: dq = 0
        check_backward(c, rng);
        Case p;
        p.kernel = wkv_cuda::kAttnMma, p.dtype = WKV_DTYPE_BF16, p.D = 64, p.causal = causal, p.Hq = 4, p.Hkv = 2;
        p.q_off = {0, 5, 5, 85, 86, 160, 160}, p.k_off = {0, 9, 12, 100, 100, 170, 180};
        p.Tq = 160, p.Tk = 180;
        check_backward(p, rng, true);
    }
    CHECK(g_mma_bwd_staging[0] > 0);
    CHECK(g_mma_bwd_staging[1] > 0);
}
