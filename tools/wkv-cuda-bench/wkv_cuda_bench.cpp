// wkv-cuda-bench: times the CUDA backend on device-resident tensors, with CUDA events.
//
// wkv-bench perf links only libwkv and hands the library host tensors; this program links
// cudart, keeps every tensor on the GPU and times on the GPU's clock. Each sample is
// `--inner` back-to-back calls between two events on the context's stream, divided by
// --inner (with --graph the calls are first captured into a CUDA graph and the sample replays
// it; --graph-calls G captures G calls into the one graph, as a model's decode step would hold
// them, and the sample replays it inner / G times). Reported: the median and minimum per-call
// device time over --repeat samples, the host time one call takes to enqueue (host_us) and,
// with --graph, the nodes of the graph (graph_nodes: kernels, copies, memsets, allocations).
//
// Passes: forward, backward (wkv_backward alone) and fwdbwd (forward then backward, the
// "training step" of the anchors). Inputs look like an RWKV-7 model's (see
// wkvt_rwkv7_random); a 256-token block is generated and tiled along T.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "wkv/wkv.h"
#include "wkv/wkv_cuda.h"
#include "wkv_tools.h"

namespace {

#define CK(call)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            std::fprintf(stderr, "wkv-cuda-bench: %s: %s\n", #call, cudaGetErrorString(e_)); \
            std::exit(1);                                                                     \
        }                                                                                     \
    } while (0)

struct Opts {
    std::vector<int64_t> B{8}, T{4096};
    int64_t H = 32, N = 64;
    std::vector<wkv_dtype> dtypes{WKV_DTYPE_BF16};
    wkv_decay_form form = WKV_DECAY_CLAMPW;
    bool fwd = true, bwd = true, fwdbwd = true, state = true, graph = false, json = false;
    int repeat = 20, warmup = 3, inner = 1, device = 0;
    int graph_calls = 1; // calls captured into the one graph (--graph-calls)
    uint64_t seed = 1;
};

void usage() {
    std::printf(
        "usage: wkv-cuda-bench [--B list] [--T list] [--H H] [--N N] [--dtype list]\n"
        "                      [--decay clampw|log|exp_neg_exp|direct] [--pass forward|backward|\n"
        "                      fwdbwd|all] [--repeat R] [--warmup W] [--inner K] [--graph]\n"
        "                      [--graph-calls G]\n"
        "                      [--no-state] [--device I] [--seed S] [--json]\n"
        "Times the CUDA backend on device tensors with CUDA events (see the file's header).\n");
}

std::vector<int64_t> parse_list(const char* s) {
    std::vector<int64_t> out;
    std::string x(s);
    size_t p = 0;
    while (p <= x.size()) {
        size_t q = x.find(',', p);
        if (q == std::string::npos) q = x.size();
        out.push_back(std::strtoll(x.substr(p, q - p).c_str(), nullptr, 10));
        p = q + 1;
    }
    return out;
}

struct DevBuf {
    void* p = nullptr;
    size_t n = 0;
    explicit DevBuf(size_t bytes) : n(bytes) { CK(cudaMalloc(&p, bytes ? bytes : 1)); }
    ~DevBuf() { cudaFree(p); }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;
};

wkv_tensor dev_tensor(void* p, wkv_dtype dt, const int64_t* shape) {
    wkv_tensor t = wkv_tensor_make(p, dt, 4, shape);
    t.device.type = WKV_DEVICE_CUDA;
    t.device.id = 0;
    return t;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Sample {
    double med_ms, min_ms, host_us;
    size_t graph_nodes; // nodes of the captured graph (0 without --graph)
};

// Times `fn` (which enqueues one call on `stream`).
template <class F>
Sample time_calls(const Opts& o, cudaStream_t stream, F fn) {
    cudaGraphExec_t exec = nullptr;
    size_t nodes = 0;
    if (o.graph) {
        cudaGraph_t g = nullptr;
        CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        bool ok = true;
        for (int c = 0; c < o.graph_calls && ok; c++) ok = fn();
        CK(cudaStreamEndCapture(stream, &g));
        if (!ok) std::exit(1);
        CK(cudaGraphGetNodes(g, nullptr, &nodes));
        CK(cudaGraphInstantiate(&exec, g, 0));
        cudaGraphDestroy(g);
    }
    auto one = [&]() -> bool {
        if (exec) return cudaGraphLaunch(exec, stream) == cudaSuccess;
        return fn();
    };
    for (int i = 0; i < o.warmup; i++)
        if (!one()) std::exit(1);
    CK(cudaStreamSynchronize(stream));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<double> ms;
    double host = 0.0;
    const int per = exec ? o.graph_calls : 1;            // calls per launch
    const int launches = std::max(1, o.inner / per);     // launches per sample
    const double calls = (double)launches * per;
    for (int r = 0; r < o.repeat; r++) {
        CK(cudaEventRecord(e0, stream));
        const double h0 = wkvt_now();
        for (int k = 0; k < launches; k++)
            if (!one()) std::exit(1);
        host += wkvt_now() - h0;
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        float t = 0.0f;
        CK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back((double)t / calls);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (exec) cudaGraphExecDestroy(exec);
    Sample s;
    s.med_ms = median(ms);
    s.min_ms = *std::min_element(ms.begin(), ms.end());
    s.host_us = host / (o.repeat * calls) * 1e6;
    s.graph_nodes = nodes;
    return s;
}

void report(const Opts& o, const char* device, const char* pass, wkv_dtype dt, int64_t B, int64_t T,
            const Sample& s, double flop_per, double bytes) {
    const double tokens = (double)B * (double)T;
    const double flops = flop_per * tokens * (double)o.H * (double)o.N * (double)o.N;
    const double sec = s.med_ms * 1e-3;
    if (o.json) {
        std::printf("{\"op\":\"rwkv7\",\"backend\":\"cuda\",\"device\":\"%s\",\"dtype\":\"%s\",\"B\":%lld,"
                    "\"T\":%lld,\"H\":%lld,\"N\":%lld,\"threads\":0,\"pass\":\"%s\",\"decay\":\"%s\","
                    "\"state\":%s,\"repeat\":%d,\"inner\":%d,\"graph\":%s,\"timing\":\"cuda_events\","
                    "\"median_ms\":%.6g,\"min_ms\":%.6g,\"host_us\":%.4g,\"tokens_per_s\":%.6g,"
                    "\"gflops\":%.6g,\"gbps\":%.6g,\"graph_nodes\":%zu,\"graph_calls\":%d}\n",
                    device, wkvt_dtype_name(dt), (long long)B, (long long)T, (long long)o.H,
                    (long long)o.N, pass, wkvt_decay_form_name(o.form), o.state ? "true" : "false",
                    o.repeat, o.inner, o.graph ? "true" : "false", s.med_ms, s.min_ms, s.host_us,
                    tokens / sec, flops / sec * 1e-9, bytes / sec * 1e-9, s.graph_nodes, o.graph ? o.graph_calls : 0);
    } else {
        char gtxt[48] = "";
        if (o.graph) std::snprintf(gtxt, sizeof gtxt, " graph (%d call%s, %zu node%s)", o.graph_calls,
                                o.graph_calls == 1 ? "" : "s", s.graph_nodes, s.graph_nodes == 1 ? "" : "s");
        std::printf("rwkv7 %-8s cuda %-4s B=%lld T=%lld H=%lld N=%lld%s: median %.4f ms (min %.4f)  "
                    "host %.2f us/call  %.4g tok/s  %.3g GFLOP/s  %.3g GB/s\n",
                    pass, wkvt_dtype_name(dt), (long long)B, (long long)T, (long long)o.H, (long long)o.N,
                    gtxt, s.med_ms, s.min_ms, s.host_us, tokens / sec,
                    flops / sec * 1e-9, bytes / sec * 1e-9);
    }
    std::fflush(stdout);
}

int run_one(const Opts& o, wkv_context* ctx, cudaStream_t stream, const char* device, wkv_dtype dt,
            int64_t B, int64_t T) {
    const int64_t H = o.H, N = o.N;
    const size_t n = (size_t)(B * T * H * N), sn = (size_t)(B * H * N * N);
    const size_t es = wkvt_dtype_size(dt);
    // a 256-token block of realistic inputs, tiled along T
    const int64_t Tg = std::min<int64_t>(T, 256);
    const size_t ng = (size_t)(B * Tg * H * N);
    std::vector<float> f[6];
    for (auto& x : f) x.resize(ng);
    wkvt_rng rng;
    wkvt_rng_seed(&rng, o.seed);
    wkvt_rwkv7_random(&rng, o.seed + 1, o.form, B, Tg, H, N, f[0].data(), f[1].data(), f[2].data(),
                      f[3].data(), f[4].data(), f[5].data());
    std::vector<unsigned char> host(n * es), blk(ng * es);
    auto upload_tiled = [&](const std::vector<float>& src, void* dst) {
        wkvt_store_f32(src.data(), blk.data(), dt, ng);
        const size_t row = (size_t)(H * N) * es;
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < T; t++)
                std::memcpy(host.data() + ((size_t)(b * T + t)) * row,
                            blk.data() + ((size_t)(b * Tg + t % Tg)) * row, row);
        CK(cudaMemcpy(dst, host.data(), n * es, cudaMemcpyHostToDevice));
    };
    DevBuf in0(n * es), in1(n * es), in2(n * es), in3(n * es), in4(n * es), in5(n * es);
    DevBuf* in[6] = {&in0, &in1, &in2, &in3, &in4, &in5};
    for (int i = 0; i < 6; i++) upload_tiled(f[i], in[i]->p);
    std::vector<float> dyf(ng);
    for (auto& x : dyf) x = (float)wkvt_rng_normal(&rng);
    DevBuf y(n * es), dy(n * es);
    upload_tiled(dyf, dy.p);
    DevBuf g0(n * es), g1(n * es), g2(n * es), g3(n * es), g4(n * es), g5(n * es);
    std::vector<float> st(sn);
    for (auto& x : st) x = (float)(0.1 * wkvt_rng_normal(&rng));
    DevBuf s0(sn * 4), s1(sn * 4), dsT(sn * 4), ds0(sn * 4);
    CK(cudaMemcpy(s0.p, st.data(), sn * 4, cudaMemcpyHostToDevice));
    for (auto& x : st) x = (float)wkvt_rng_normal(&rng);
    CK(cudaMemcpy(dsT.p, st.data(), sn * 4, cudaMemcpyHostToDevice));

    const int64_t shape[4] = {B, T, H, N}, sshape[4] = {B, H, N, N};
    wkv_forward_desc fd;
    std::memset(&fd, 0, sizeof fd);
    fd.struct_size = sizeof fd;
    fd.op = WKV_OP_RWKV7;
    fd.decay_form = o.form;
    fd.r = dev_tensor(in0.p, dt, shape);
    fd.w = dev_tensor(in1.p, dt, shape);
    fd.k = dev_tensor(in2.p, dt, shape);
    fd.v = dev_tensor(in3.p, dt, shape);
    fd.a = dev_tensor(in4.p, dt, shape);
    fd.b = dev_tensor(in5.p, dt, shape);
    fd.y = dev_tensor(y.p, dt, shape);
    if (o.state) {
        fd.state_in = dev_tensor(s0.p, WKV_DTYPE_F32, sshape);
        fd.state_out = dev_tensor(s1.p, WKV_DTYPE_F32, sshape);
    }
    wkv_backward_desc bd;
    std::memset(&bd, 0, sizeof bd);
    bd.struct_size = sizeof bd;
    bd.forward = &fd;
    bd.dy = dev_tensor(dy.p, dt, shape);
    bd.dr = dev_tensor(g0.p, dt, shape);
    bd.dw = dev_tensor(g1.p, dt, shape);
    bd.dk = dev_tensor(g2.p, dt, shape);
    bd.dv = dev_tensor(g3.p, dt, shape);
    bd.da = dev_tensor(g4.p, dt, shape);
    bd.db = dev_tensor(g5.p, dt, shape);
    if (o.state) {
        bd.dstate_out = dev_tensor(dsT.p, WKV_DTYPE_F32, sshape);
        bd.dstate_in = dev_tensor(ds0.p, WKV_DTYPE_F32, sshape);
    }
    size_t wsz = 0;
    if ((o.bwd || o.fwdbwd) && wkv_workspace_size(ctx, &wsz, &bd) != WKV_OK) {
        std::fprintf(stderr, "wkv-cuda-bench: wkv_workspace_size: %s\n", wkv_last_error(ctx));
        return 1;
    }
    DevBuf ws(wsz);
    bd.workspace = ws.p;
    bd.workspace_size = wsz;

    auto fwd = [&]() -> bool {
        if (wkv_forward(ctx, &fd) == WKV_OK) return true;
        std::fprintf(stderr, "wkv-cuda-bench: wkv_forward: %s\n", wkv_last_error(ctx));
        return false;
    };
    auto bwd = [&]() -> bool {
        if (wkv_backward(ctx, &bd) == WKV_OK) return true;
        std::fprintf(stderr, "wkv-cuda-bench: wkv_backward: %s\n", wkv_last_error(ctx));
        return false;
    };
    const double tok = (double)n * (double)es, stb = o.state ? (double)sn * 4.0 : 0.0;
    if (o.fwd) report(o, device, "forward", dt, B, T, time_calls(o, stream, fwd), 9.0, 7 * tok + 2 * stb);
    if (o.bwd)
        report(o, device, "backward", dt, B, T, time_calls(o, stream, bwd), 28.0, 13 * tok + 3 * stb);
    if (o.fwdbwd)
        report(o, device, "fwdbwd", dt, B, T, time_calls(o, stream, [&]() { return fwd() && bwd(); }),
               37.0, 20 * tok + 5 * stb);
    CK(cudaStreamSynchronize(stream));
    CK(cudaGetLastError());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Opts o;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto val = [&]() -> const char* {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "wkv-cuda-bench: %s needs a value\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "-h" || a == "--help") {
            usage();
            return 0;
        } else if (a == "--B") o.B = parse_list(val());
        else if (a == "--T") o.T = parse_list(val());
        else if (a == "--H") o.H = std::strtoll(val(), nullptr, 10);
        else if (a == "--N") o.N = std::strtoll(val(), nullptr, 10);
        else if (a == "--dtype") {
            o.dtypes.clear();
            std::string s = val();
            size_t p = 0;
            while (p <= s.size()) {
                size_t q = s.find(',', p);
                if (q == std::string::npos) q = s.size();
                wkv_dtype d;
                if (wkvt_dtype_parse(s.substr(p, q - p).c_str(), &d)) {
                    std::fprintf(stderr, "wkv-cuda-bench: bad dtype\n");
                    return 2;
                }
                o.dtypes.push_back(d);
                p = q + 1;
            }
        } else if (a == "--decay") {
            if (wkvt_decay_form_parse(val(), &o.form)) return 2;
        } else if (a == "--pass") {
            std::string p = val();
            o.fwd = p == "forward" || p == "all";
            o.bwd = p == "backward" || p == "all";
            o.fwdbwd = p == "fwdbwd" || p == "all";
        } else if (a == "--repeat") o.repeat = std::max(1, atoi(val()));
        else if (a == "--warmup") o.warmup = std::max(0, atoi(val()));
        else if (a == "--inner") o.inner = std::max(1, atoi(val()));
        else if (a == "--graph") o.graph = true;
        else if (a == "--graph-calls") o.graph_calls = std::max(1, atoi(val())), o.graph = true;
        else if (a == "--no-state") o.state = false;
        else if (a == "--device") o.device = atoi(val());
        else if (a == "--seed") o.seed = std::strtoull(val(), nullptr, 10);
        else if (a == "--json") o.json = true;
        else {
            std::fprintf(stderr, "wkv-cuda-bench: unknown option %s\n", a.c_str());
            usage();
            return 2;
        }
    }
    CK(cudaSetDevice(o.device));
    wkv_context_options co;
    std::memset(&co, 0, sizeof co);
    co.struct_size = sizeof co;
    co.backend = WKV_BACKEND_CUDA;
    co.device_index = o.device;
    wkv_context* ctx = nullptr;
    if (wkv_context_create(&co, &ctx) != WKV_OK) {
        std::fprintf(stderr, "wkv-cuda-bench: %s\n", wkv_last_error(nullptr));
        return 1;
    }
    cudaStream_t stream = nullptr;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    if (wkv_cuda_set_stream(ctx, stream) != WKV_OK) {
        std::fprintf(stderr, "wkv-cuda-bench: wkv_cuda_set_stream: %s\n", wkv_last_error(ctx));
        return 1;
    }
    wkv_device_info di;
    std::memset(&di, 0, sizeof di);
    di.struct_size = sizeof di;
    wkv_device_get_info(WKV_BACKEND_CUDA, o.device, &di);
    if (!o.json)
        std::printf("# %s, %d SMs; decay %s; state %s; warmup %d, repeat %d x %d calls%s\n", di.name,
                    di.compute_units, wkvt_decay_form_name(o.form), o.state ? "in/out" : "none",
                    o.warmup, o.repeat, o.inner, o.graph ? ", CUDA graph" : "");
    int rc = 0;
    for (wkv_dtype dt : o.dtypes)
        for (int64_t B : o.B)
            for (int64_t T : o.T) rc |= run_one(o, ctx, stream, di.name, dt, B, T);
    wkv_context_destroy(ctx);
    cudaStreamDestroy(stream);
    return rc;
}
