// The RWKV-7 harness of wkv_cuda_tests: a problem's configuration (shape, dtype, decay form,
// layouts, state options), its random inputs, one forward + backward through the public API on
// the CUDA or the CPU backend with every output poisoned and every guard zone checked
// (run_backend), and the comparisons against the CPU backend, the float64 reference and the
// golden files. Used by test_cuda_rwkv7.cpp, test_cuda_rwkv7_chunked.cpp, test_cuda_runtime.cpp.
#ifndef WKV_CUDA_RWKV7_HARNESS_H
#define WKV_CUDA_RWKV7_HARNESS_H

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "test_rwkv7_config.h"

namespace cudatest {

// The CUDA cases' configuration: head size 64 and every state option on unless a case says
// otherwise (the shared RWKV-7 configuration's defaults are the CPU tests' minimal ones).
struct Config : Rwkv7Config {
    Config() {
        N = 64;
        state_in = state_out = dstate_out = dstate_in = true;
    }
    // dk in another layout than the other five gradients (PaddedT, or Contiguous when the
    // case's layout is PaddedT): the backward's general write-out, not its views-alike path
    bool dk_own_layout = false;
};

struct Results {
    std::vector<double> y, sT, dr, dw, dk, dv, da, db, ds0;
};

// Runs forward then backward through the public API on `backend`: host tensors for the CPU,
// for CUDA what `mem` says (device mirrors by default). Checks poisoning, guard zones and
// unchanged inputs along the way; a host workspace must come back untouched. Without a
// device-pointer or buffer tensor, no synchronisation at all: the calls must be complete.
Results run_backend(wkv_backend backend, const Config& c, const Rwkv7Data& d,
                    const std::vector<double>& dy, const std::vector<double>& dsT,
                    const int64_t* seq_offsets = nullptr, int64_t num_seqs = 0,
                    Mem mem = Mem::Device);

// Inputs rounded to the dtype (the state, s0, dsT float32), with the reference on those values.
struct Case {
    Rwkv7Data d;
    std::vector<double> dy, dsT;
};

Case make_case(Rng& rng, const Config& c, int64_t B_for_data);

void compare(const char* what, const std::vector<double>& got, const std::vector<double>& ref,
             double tol, const std::string& desc);

// CUDA vs the CPU backend (same inputs) and vs the float64 reference.
void check_config(const Config& c, uint64_t seed, const std::vector<int64_t>* offsets = nullptr);

// The dtypes, head sizes and decay forms the cases cycle through.
const wkv_dtype kDtypes[] = {WKV_DTYPE_F32, WKV_DTYPE_F16, WKV_DTYPE_BF16};
const int64_t kHeadSizes3[] = {64, 32, 128};
const wkv_decay_form kForms[] = {WKV_DECAY_CLAMPW, WKV_DECAY_LOG, WKV_DECAY_EXP_NEG_EXP, WKV_DECAY_DIRECT};

// One golden wkv7 file on CUDA in f32/f16/bf16, both state orders, forward and backward.
void check_golden_rwkv7(const std::string& path);

// Sets an environment variable for the contexts created in its scope (the backend reads its
// switches at context creation), then restores the previous value.
struct ScopedEnv {
    std::string name, old;
    bool had;
    ScopedEnv(const char* var, const char* value) : name(var) {
        const char* e = std::getenv(var);
        had = e != nullptr;
        if (had) old = e;
        setenv(var, value, 1);
    }
    ~ScopedEnv() {
        if (had) setenv(name.c_str(), old.c_str(), 1);
        else unsetenv(name.c_str());
    }
};

// WKV_CUDA_RWKV7_CHUNKED (the chunked forward) and WKV_CUDA_RWKV7_CHUNKED_BWD (the chunked
// backward) for the contexts created in its scope.
struct ChunkedEnv : ScopedEnv {
    explicit ChunkedEnv(const char* value) : ScopedEnv("WKV_CUDA_RWKV7_CHUNKED", value) {}
};
struct ChunkedBwdEnv : ScopedEnv {
    explicit ChunkedBwdEnv(const char* value) : ScopedEnv("WKV_CUDA_RWKV7_CHUNKED_BWD", value) {}
};

// A small RWKV-7 problem on the device: inputs, outputs, states and a workspace.
struct DeviceProblem {
    Config c;
    Rwkv7Data d;
    std::vector<HostTensor> in, g;
    HostTensor y, s0, s1, dy, dsT, ds0;
    std::vector<std::unique_ptr<DevMirror>> m;
    wkv_forward_desc f{};
    wkv_backward_desc bd{};
    void* ws = nullptr;

    DevMirror* mirror(HostTensor& t) {
        m.emplace_back(new DevMirror(t));
        return m.back().get();
    }
    void build(wkv_context* ctx, uint64_t seed) {
        Rng rng(seed);
        d = random_rwkv7(rng, c.B, c.T, c.H, c.N, c.form, true);
        in.resize(6);
        const std::vector<double>* vals[6] = {&d.r, &d.w, &d.k, &d.v, &d.a, &d.b};
        for (int i = 0; i < 6; i++) {
            in[(size_t)i] = HostTensor(c.dtype, {c.B, c.T, c.H, c.N});
            in[(size_t)i].fill(*vals[i]);
        }
        y = HostTensor(c.dtype, {c.B, c.T, c.H, c.N});
        y.poison();
        s0 = HostTensor(WKV_DTYPE_F32, {c.B, c.H, c.N, c.N});
        s0.fill(d.s0);
        s1 = HostTensor(WKV_DTYPE_F32, {c.B, c.H, c.N, c.N});
        s1.poison();
        dy = HostTensor(c.dtype, {c.B, c.T, c.H, c.N});
        dy.fill(random_normal(rng, d.tok_count()));
        dsT = HostTensor(WKV_DTYPE_F32, {c.B, c.H, c.N, c.N});
        dsT.fill(random_normal(rng, d.state_count()));
        ds0 = HostTensor(WKV_DTYPE_F32, {c.B, c.H, c.N, c.N});
        ds0.poison();
        g.resize(6);
        for (auto& t : g) {
            t = HostTensor(c.dtype, {c.B, c.T, c.H, c.N});
            t.poison();
        }
        f.struct_size = sizeof f;
        f.op = WKV_OP_RWKV7;
        f.decay_form = c.form;
        wkv_tensor* fin[6] = {&f.r, &f.w, &f.k, &f.v, &f.a, &f.b};
        for (int i = 0; i < 6; i++) *fin[i] = mirror(in[(size_t)i])->view();
        f.y = mirror(y)->view();
        f.state_in = mirror(s0)->view();
        f.state_out = mirror(s1)->view();
        bd.struct_size = sizeof bd;
        bd.forward = &f;
        bd.dy = mirror(dy)->view();
        bd.dstate_out = mirror(dsT)->view();
        wkv_tensor* gout[6] = {&bd.dr, &bd.dw, &bd.dk, &bd.dv, &bd.da, &bd.db};
        for (int i = 0; i < 6; i++) *gout[i] = mirror(g[(size_t)i])->view();
        bd.dstate_in = mirror(ds0)->view();
        size_t bytes = 0;
        REQUIRE(wkv_workspace_size(ctx, &bytes, &bd) == WKV_OK);
        CU(cudaMalloc(&ws, bytes));
        bd.workspace = ws;
        bd.workspace_size = bytes;
    }
    ~DeviceProblem() {
        if (ws) cudaFree(ws);
    }
    // Every output as bytes, downloaded.
    std::vector<unsigned char> outputs() {
        std::vector<unsigned char> all;
        for (auto& x : m) {
            x->download();
            all.insert(all.end(), x->h->buf.begin(), x->h->buf.end());
        }
        return all;
    }
};

// Forward + backward on the context's stream, then on a stream of the caller's, captured into
// a CUDA graph and replayed twice: the same bits.
void check_caller_stream_and_graph(wkv_decay_form form);

}  // namespace cudatest

#endif  // WKV_CUDA_RWKV7_HARNESS_H
