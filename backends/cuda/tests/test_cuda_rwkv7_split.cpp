// RWKV-7 forward with a head's rows spread over several blocks (part of wkv_cuda_tests).
//
// The forward may split each (sequence, head) over SPLIT blocks of N / SPLIT rows
// (backends/cuda/rwkv7.cu, forward_split). Rows are independent and every row's arithmetic is
// the same whatever SPLIT, so for each forced split (WKV_CUDA_RWKV7_SPLIT, read when a context
// is created) y and the final state must be the same bits as with one block per head, and
// match the CPU backend. Cases: N = 32 / 64 / 128, T = 1 (the decode kernel), T not a multiple
// of the staged chunk (8 tokens; N = 128: 4), packed sequences with an empty one, f32 and bf16,
// value- and key-major states. Host tensors (the plugin stages them); outputs NaN-poisoned.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "test_util.h"

extern int g_wkv_cuda_skipped;
extern int g_wkv_cuda_ran;

using namespace wkvtest;

namespace {

bool split_cuda_available() {
    wkv_backend_info info{};
    info.struct_size = sizeof info;
    return wkv_backend_get_info(WKV_BACKEND_CUDA, &info) == WKV_OK && info.available;
}

struct SplitCase {
    int64_t B, T, H, N;
    wkv_dtype dt;
    std::vector<int64_t> off; // packed: token offsets (B = 1); empty: unpacked
    bool key_major;

    int64_t seqs() const { return off.empty() ? B : (int64_t)off.size() - 1; }
    std::string describe(int split) const {
        return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
               " N=" + std::to_string(N) + " dtype=" + dtype_name(dt) + (off.empty() ? "" : " packed") +
               (key_major ? " key-major" : "") + " split=" + std::to_string(split);
    }
};

struct FwdOut {
    HostTensor y, s;
};

// One forward through the public API on `backend`; for CUDA the context is created with
// WKV_CUDA_RWKV7_SPLIT = split (0: unset, the plugin's own choice).
FwdOut run_forward(wkv_backend backend, int split, const SplitCase& c, const Rwkv7Data& d,
                   const std::vector<double>& s0) {
    const char* old = std::getenv("WKV_CUDA_RWKV7_SPLIT");
    const std::string saved = old ? old : "";
    if (split > 0) setenv("WKV_CUDA_RWKV7_SPLIT", std::to_string(split).c_str(), 1);
    else unsetenv("WKV_CUDA_RWKV7_SPLIT");
    wkv_context* ctx = nullptr;
    wkv_context_options o{};
    o.struct_size = sizeof o;
    o.backend = backend;
    o.cpu_threads = 2;
    const wkv_status cs = wkv_context_create(&o, &ctx);
    if (old) setenv("WKV_CUDA_RWKV7_SPLIT", saved.c_str(), 1);
    else unsetenv("WKV_CUDA_RWKV7_SPLIT");
    INFO(wkv_last_error(nullptr));
    REQUIRE(cs == WKV_OK);

    const std::vector<double>* vals[6] = {&d.r, &d.w, &d.k, &d.v, &d.a, &d.b};
    std::vector<HostTensor> in(6);
    for (int i = 0; i < 6; i++) {
        in[(size_t)i] = HostTensor(c.dt, {c.B, c.T, c.H, c.N});
        in[(size_t)i].fill(*vals[i]);
    }
    HostTensor s_in(WKV_DTYPE_F32, {c.seqs(), c.H, c.N, c.N});
    s_in.fill(s0);
    FwdOut out;
    out.y = HostTensor(c.dt, {c.B, c.T, c.H, c.N});
    out.s = HostTensor(WKV_DTYPE_F32, {c.seqs(), c.H, c.N, c.N});
    out.y.poison();
    out.s.poison();

    wkv_forward_desc f{};
    f.struct_size = sizeof f;
    f.op = WKV_OP_RWKV7;
    f.decay_form = d.form;
    f.flags = c.key_major ? (uint32_t)WKV_FLAG_STATE_KEY_MAJOR : 0u;
    f.r = in[0].view(); f.w = in[1].view(); f.k = in[2].view();
    f.v = in[3].view(); f.a = in[4].view(); f.b = in[5].view();
    f.y = out.y.view();
    f.state_in = s_in.view();
    f.state_out = out.s.view();
    if (!c.off.empty()) {
        f.seq_offsets = c.off.data();
        f.num_seqs = c.seqs();
    }
    const wkv_status st = wkv_forward(ctx, &f);
    INFO(wkv_last_error(ctx));
    CHECK(st == WKV_OK);
    wkv_context_destroy(ctx);
    return out;
}

} // namespace

TEST_CASE("cuda rwkv7: forward with a head's rows split over 1/2/4/8 blocks: same bits, = CPU") {
    if (!split_cuda_available()) {
        MESSAGE("SKIPPED: no CUDA device");
        ++g_wkv_cuda_skipped;
        return;
    }
    ++g_wkv_cuda_ran;
    const SplitCase cases[] = {
        {2, 13, 3, 64, WKV_DTYPE_F32, {}, false},
        {1, 1, 2, 64, WKV_DTYPE_F32, {}, false},
        {2, 37, 2, 32, WKV_DTYPE_BF16, {}, false},
        {3, 1, 2, 32, WKV_DTYPE_F32, {}, true},
        {1, 13, 1, 128, WKV_DTYPE_F32, {}, false},
        {3, 1, 2, 128, WKV_DTYPE_BF16, {}, true},
        {1, 31, 2, 64, WKV_DTYPE_BF16, {0, 5, 5, 22, 31}, false},
        {1, 10, 1, 128, WKV_DTYPE_F32, {0, 1, 2, 10}, true},
        {1, 9, 2, 32, WKV_DTYPE_F32, {0, 9}, false},
    };
    const uint64_t seed = test_seed();
    int n = 0;
    for (const SplitCase& c : cases) {
        Rng rng(seed + (uint64_t)n++);
        Rwkv7Data d = random_rwkv7(rng, c.B, c.T, c.H, c.N, WKV_DECAY_CLAMPW, false);
        for (auto* x : d.inputs()) *x = rounded(c.dt, *x);
        const std::vector<double> s0 =
            rounded(WKV_DTYPE_F32, random_normal(rng, (size_t)(c.seqs() * c.H * c.N * c.N), 0.3));
        const FwdOut cpu = run_forward(WKV_BACKEND_CPU, 0, c, d, s0);
        const FwdOut one = run_forward(WKV_BACKEND_CUDA, 1, c, d, s0);
        const double tol = c.dt.bits == 16 ? 4e-3 : 2e-5;
        {
            INFO(c.describe(1) << " seed=" << seed);
            CHECK(rel_err(one.y.read(), cpu.y.read()) <= tol);
            CHECK(rel_err(one.s.read(), cpu.s.read()) <= tol);
        }
        for (int split : {2, 4, 8, 0}) {
            const FwdOut got = run_forward(WKV_BACKEND_CUDA, split, c, d, s0);
            INFO(c.describe(split) << " seed=" << seed);
            CHECK(got.y.buf == one.y.buf);
            CHECK(got.s.buf == one.s.buf);
        }
    }
}
