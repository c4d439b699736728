// rwkv7_harness.h's definitions.
#include "rwkv7_harness.h"

#include <iomanip>
#include <sstream>

namespace cudatest {

Results run_backend(wkv_backend backend, const Config& c, const Rwkv7Data& d,
                    const std::vector<double>& dy, const std::vector<double>& dsT,
                    const int64_t* seq_offsets, int64_t num_seqs,
                    Mem mem) {
    const bool on_cuda = backend == WKV_BACKEND_CUDA;
    const bool cuda = on_cuda && mem != Mem::Host; /* some tensor is not host memory */
    wkv_context* ctx = nullptr;
    {
        wkv_context_options o{};
        o.struct_size = sizeof o;
        o.backend = backend;
        o.cpu_threads = c.threads;
        const wkv_status st = wkv_context_create(&o, &ctx);
        INFO(std::string(wkv_last_error(nullptr)));
        REQUIRE(st == WKV_OK);
    }
    struct Destroy {
        wkv_context* c;
        ~Destroy() { wkv_context_destroy(c); }
    } destroy{ctx};
    const int64_t S = num_seqs > 0 ? num_seqs : c.B;

    const std::vector<double>* in_vals[6] = {&d.r, &d.w, &d.k, &d.v, &d.a, &d.b};
    std::vector<HostTensor> in(6);
    for (int i = 0; i < 6; i++) {
        in[(size_t)i] = token_tensor(c, c.dtype, i == 1 && c.w_broadcast);
        fill_input(in[(size_t)i], *in_vals[i]);
    }
    HostTensor y = token_tensor(c, c.dtype);
    HostTensor s_in = state_tensor(c, S), s_out = state_tensor(c, S);
    if (c.state_in) fill_input(s_in, to_lib_state(c, S, d.s0));
    y.poison();
    if (!c.in_place) s_out.poison();
    HostTensor dyt = token_tensor(c, c.dtype);
    fill_input(dyt, dy);
    HostTensor ds_out = state_tensor(c, S), ds_in = state_tensor(c, S);
    if (c.dstate_out) fill_input(ds_out, to_lib_state(c, S, dsT));
    std::vector<HostTensor> g(6);
    for (size_t i = 0; i < g.size(); i++) {
        const Layout own = c.layout == Layout::PaddedT ? Layout::Contiguous : Layout::PaddedT;
        g[i] = i == 2 && c.dk_own_layout ? token_tensor(c.dtype, c.B, c.T, c.H, c.N, own) : token_tensor(c, c.dtype);
        g[i].poison();
    }
    ds_in.poison();
    std::vector<std::vector<unsigned char>> inputs_before;
    for (const HostTensor& t : in) inputs_before.push_back(t.buf);

    // Device mirrors (CUDA only): same storage layout, data pointers replaced.
    std::vector<std::unique_ptr<Mirror>> mir;
    int n_tensors = 0;
    auto tensor = [&](HostTensor& t) -> wkv_tensor {
        static const Mem kRound[3] = {Mem::Host, Mem::Device, Mem::Buffer};
        const Mem kind = mem == Mem::Mixed ? kRound[n_tensors++ % 3] : mem;
        if (!on_cuda || kind == Mem::Host) return t.view();
        if (kind == Mem::Buffer) mir.emplace_back(new BufMirror(ctx, t));
        else mir.emplace_back(new DevMirror(t));
        return mir.back()->view();
    };
    auto mirror_of = [&](HostTensor& t) -> Mirror* {
        for (auto& m : mir)
            if (m->h == &t) return m.get();
        return nullptr;
    };

    wkv_forward_desc f{};
    f.struct_size = sizeof f;
    f.op = WKV_OP_RWKV7;
    f.decay_form = c.form;
    f.flags = c.key_major ? (uint32_t)WKV_FLAG_STATE_KEY_MAJOR : 0u;
    f.r = tensor(in[0]);
    f.w = tensor(in[1]);
    f.k = tensor(in[2]);
    f.v = tensor(in[3]);
    f.a = tensor(in[4]);
    f.b = tensor(in[5]);
    f.y = tensor(y);
    wkv_tensor sin_t = tensor(s_in);
    wkv_tensor sout_t = tensor(s_out);
    if (c.state_in) f.state_in = sin_t;
    if (c.state_out) f.state_out = c.in_place ? sin_t : sout_t;
    f.seq_offsets = seq_offsets;
    f.num_seqs = num_seqs;

    // the mirrors' cudaMemcpy may still be in flight on the legacy stream, which the context's
    // non-blocking stream does not wait for (wkv_cuda.h)
    if (on_cuda) CU(cudaDeviceSynchronize());
    wkv_status st = wkv_forward(ctx, &f);
    {
        INFO("wkv_forward: " << std::string(wkv_last_error(ctx)));
        REQUIRE(st == WKV_OK);
    }
    if (cuda) {
        if (mem == Mem::Device) CU(cudaDeviceSynchronize());
        else REQUIRE(wkv_context_synchronize(ctx) == WKV_OK);
        for (auto& m : mir) m->download();
    }
    Results res;
    res.y = y.read();
    CHECK(y.gaps_still_nan());
    if (c.state_out) {
        HostTensor& so = c.in_place ? s_in : s_out;
        res.sT = to_lib_state(c, S, so.read());
        CHECK(so.gaps_still_nan());
    }
    for (size_t i = 0; i < in.size(); i++)
        CHECK_MESSAGE(in[i].buf == inputs_before[i], "input " << i << " was modified");

    // backward: restore s0 after an in-place forward, make y garbage
    if (c.state_in && c.in_place) {
        fill_input(s_in, to_lib_state(c, S, d.s0));
        if (Mirror* m = mirror_of(s_in)) m->upload();
    }
    y.poison();
    if (Mirror* m = mirror_of(y)) m->upload();

    wkv_backward_desc bd{};
    bd.struct_size = sizeof bd;
    bd.forward = &f;
    bd.dy = tensor(dyt);
    if (c.dstate_out) bd.dstate_out = tensor(ds_out);
    bd.dr = tensor(g[0]);
    bd.dw = tensor(g[1]);
    bd.dk = tensor(g[2]);
    bd.dv = tensor(g[3]);
    bd.da = tensor(g[4]);
    bd.db = tensor(g[5]);
    if (c.dstate_in) bd.dstate_in = tensor(ds_in);
    size_t ws = 0;
    st = wkv_workspace_size(ctx, &ws, &bd);
    {
        INFO("wkv_workspace_size: " << std::string(wkv_last_error(ctx)));
        REQUIRE(st == WKV_OK);
    }
    std::vector<unsigned char> host_ws;
    void* dws = nullptr;
    wkv_buffer* bws = nullptr;
    if (on_cuda && mem == Mem::Device) {
        CU(cudaMalloc(&dws, ws + kGuard));
        CU(cudaMemset(dws, 0xFF, ws + kGuard));  // NaN everywhere; the tail is a guard
        CU(cudaDeviceSynchronize());  // the memset is on the legacy stream, the kernels are not
        bd.workspace = dws;
    } else if (on_cuda && mem == Mem::Buffer) {
        REQUIRE(wkv_buffer_create(ctx, ws + kGuard, &bws) == WKV_OK);
        std::vector<unsigned char> ff(ws + kGuard, 0xFF);
        REQUIRE(wkv_buffer_upload(ctx, bws, 0, ff.data(), ff.size()) == WKV_OK);
        bd.workspace = bws;
    } else {
        host_ws.assign(ws, 0xFF);
        bd.workspace = host_ws.data();
    }
    bd.workspace_size = ws;
    if (on_cuda) CU(cudaDeviceSynchronize());  // the poison memset and uploads, as before the forward
    st = wkv_backward(ctx, &bd);
    {
        INFO("wkv_backward: " << std::string(wkv_last_error(ctx)));
        REQUIRE(st == WKV_OK);
    }
    if (on_cuda && !cuda) {  // host memory only: complete on return, nothing left on the stream
        cudaStream_t s = nullptr;
        REQUIRE(wkv_cuda_get_stream(ctx, &s) == WKV_OK);
        CHECK(cudaStreamQuery(s) == cudaSuccess);
    }
    if (on_cuda && (mem == Mem::Host || mem == Mem::Mixed)) {
        bool untouched = true;
        for (unsigned char b : host_ws) untouched = untouched && b == 0xFF;
        CHECK_MESSAGE(untouched, "the CUDA backend wrote into a host workspace");
    }
    if (cuda) {
        if (mem == Mem::Device) CU(cudaDeviceSynchronize());
        else REQUIRE(wkv_context_synchronize(ctx) == WKV_OK);
        std::vector<unsigned char> tail(kGuard);
        if (dws) {
            CU(cudaMemcpy(tail.data(), static_cast<char*>(dws) + ws, kGuard, cudaMemcpyDeviceToHost));
        } else if (bws) {
            REQUIRE(wkv_buffer_download(ctx, bws, ws, tail.data(), kGuard) == WKV_OK);
        } else {
            tail.assign(kGuard, 0xFF);
        }
        bool tail_ok = true;
        for (unsigned char b : tail) tail_ok = tail_ok && b == 0xFF;
        CHECK_MESSAGE(tail_ok, "the backward wrote past its workspace");
        if (dws) cudaFree(dws);
        wkv_buffer_destroy(bws);
        for (auto& m : mir) {
            CHECK_MESSAGE(m->guard_ok(), "a device buffer's guard zone was overwritten");
            m->download();
        }
    }
    for (HostTensor* t : {&g[0], &g[1], &g[2], &g[3], &g[4], &g[5]}) CHECK(t->gaps_still_nan());
    res.dr = g[0].read();
    res.dw = g[1].read();
    res.dk = g[2].read();
    res.dv = g[3].read();
    res.da = g[4].read();
    res.db = g[5].read();
    if (c.dstate_in) {
        res.ds0 = to_lib_state(c, S, ds_in.read());
        CHECK(ds_in.gaps_still_nan());
    }
    for (size_t i = 0; i < in.size(); i++)
        CHECK_MESSAGE(in[i].buf == inputs_before[i], "input " << i << " was modified by the backward");
    return res;
}

Case make_case(Rng& rng, const Config& c, int64_t B_for_data) {
    Case k;
    k.d = random_rwkv7(rng, B_for_data, c.T, c.H, c.N, c.form, c.state_in);
    for (auto* x : k.d.inputs()) *x = rounded(c.dtype, *x);
    if (c.w_broadcast)  // one w row per (b, h), repeated over t
        for (int64_t b = 0; b < B_for_data; b++)
            for (int64_t t = 1; t < c.T; t++)
                for (int64_t e = 0; e < c.H * c.N; e++)
                    k.d.w[(size_t)((b * c.T + t) * c.H * c.N + e)] = k.d.w[(size_t)(b * c.T * c.H * c.N + e)];
    if (!c.state_in) k.d.s0.clear();
    else k.d.s0 = rounded(WKV_DTYPE_F32, k.d.s0);
    k.dy = rounded(c.dtype, random_normal(rng, k.d.tok_count()));
    k.dsT = rounded(WKV_DTYPE_F32, random_normal(rng, k.d.state_count()));
    return k;
}

void compare(const char* what, const std::vector<double>& got, const std::vector<double>& ref,
             double tol, const std::string& desc) {
    const double e = rel_err(got, ref);
    INFO(desc);
    CHECK_MESSAGE(e <= tol, std::string(what) << ": rel err " << e << " > " << tol);
}

void check_config(const Config& c, uint64_t seed, const std::vector<int64_t>* offsets) {
    Rng rng(seed);
    const bool packed = offsets != nullptr;
    const int64_t S = packed ? (int64_t)offsets->size() - 1 : c.B;
    // Packed: B = 1 and one state per sequence; the reference runs each sequence as a batch.
    Case k = make_case(rng, c, c.B);
    std::vector<double> s0_lib = k.d.s0, dsT_lib = k.dsT;
    if (packed) {
        Rng r2(seed ^ 0x9e37u);
        Rwkv7Data pre = random_rwkv7(r2, S, 8, c.H, c.N, c.form, false);
        std::vector<double> ytmp;
        if (c.state_in) ref_forward(pre, ytmp, s0_lib);
        s0_lib = rounded(WKV_DTYPE_F32, s0_lib);
        if (!c.state_in) s0_lib.assign((size_t)(S * c.H * c.N * c.N), 0.0);
        dsT_lib = rounded(WKV_DTYPE_F32, random_normal(r2, (size_t)(S * c.H * c.N * c.N)));
        k.d.s0 = s0_lib;
    }
    const int64_t* off = packed ? offsets->data() : nullptr;
    const std::string desc = c.describe() + " seed=" + std::to_string(seed) + (packed ? " packed" : "");
    Results gpu = run_backend(WKV_BACKEND_CUDA, c, k.d, k.dy, dsT_lib, off, packed ? S : 0);
    Results cpu = run_backend(WKV_BACKEND_CPU, c, k.d, k.dy, dsT_lib, off, packed ? S : 0);

    const bool is16 = c.dtype.bits == 16;
    const double tc = is16 ? 4e-3 : 2e-5;  // against the CPU backend
    compare("y vs cpu", gpu.y, cpu.y, tc, desc);
    if (c.state_out) compare("sT vs cpu", gpu.sT, cpu.sT, tc, desc);
    compare("dr vs cpu", gpu.dr, cpu.dr, tc, desc);
    compare("dw vs cpu", gpu.dw, cpu.dw, tc, desc);
    compare("dk vs cpu", gpu.dk, cpu.dk, tc, desc);
    compare("dv vs cpu", gpu.dv, cpu.dv, tc, desc);
    compare("da vs cpu", gpu.da, cpu.da, tc, desc);
    compare("db vs cpu", gpu.db, cpu.db, tc, desc);
    if (c.dstate_in) compare("ds0 vs cpu", gpu.ds0, cpu.ds0, tc, desc);

    // float64 reference: unpacked only (packed is checked against the CPU, which the CPU
    // suite checks against the reference)
    if (!packed) {
        std::vector<double> y, sT;
        ref_forward(k.d, y, sT);
        Rwkv7Grads gr = ref_backward(k.d, k.dy, c.dstate_out ? k.dsT : std::vector<double>());
        const double tf = is16 ? 5e-3 : 1e-4, tg = is16 ? 1e-2 : 1e-4;
        compare("y vs ref", gpu.y, y, tf, desc);
        if (c.state_out) compare("sT vs ref", gpu.sT, sT, tf, desc);
        compare("dr vs ref", gpu.dr, gr.dr, tg, desc);
        compare("dw vs ref", gpu.dw, gr.dw, tg, desc);
        compare("dk vs ref", gpu.dk, gr.dk, tg, desc);
        compare("dv vs ref", gpu.dv, gr.dv, tg, desc);
        compare("da vs ref", gpu.da, gr.da, tg, desc);
        compare("db vs ref", gpu.db, gr.db, tg, desc);
        if (c.dstate_in && c.state_in) compare("ds0 vs ref", gpu.ds0, gr.ds0, tg, desc);
    }
}

void check_golden_rwkv7(const std::string& path) {
    {
        SafeTensors f;
        INFO(path);
        REQUIRE_MESSAGE(f.load(path), f.error);
        Config c;
        c.B = std::stoll(f.meta("B"));
        c.T = std::stoll(f.meta("T"));
        c.H = std::stoll(f.meta("H"));
        c.N = std::stoll(f.meta("N"));
        const std::string form = f.meta("decay_form");
        c.form = form == "log" ? WKV_DECAY_LOG : form == "exp_neg_exp" ? WKV_DECAY_EXP_NEG_EXP
               : form == "clampw" ? WKV_DECAY_CLAMPW : WKV_DECAY_DIRECT;
        for (wkv_dtype dt : kDtypes)
            for (int km = 0; km < 2; km++) {
                c.dtype = dt;
                c.key_major = km != 0;
                Rwkv7Data d;
                d.B = c.B; d.T = c.T; d.H = c.H; d.N = c.N; d.form = c.form;
                d.r = f.at("r"); d.w = f.at("w"); d.k = f.at("k");
                d.v = f.at("v"); d.a = f.at("a"); d.b = f.at("b");
                d.s0 = f.at("s0");
                const bool is16 = dt.bits == 16;
                for (auto* x : d.inputs()) *x = rounded(dt, *x);
                std::vector<double> dy = rounded(dt, f.at("dy"));
                const std::vector<double>& dsT = f.at("dsT");
                Results got = run_backend(WKV_BACKEND_CUDA, c, d, dy, dsT);
                // references: the file's float64 for f32; libwkv's float64 reference on the
                // rounded inputs for 16-bit (as tools/common/golden.c does)
                std::vector<double> y = f.at("y"), sT = f.at("sT");
                Rwkv7Grads gr;
                gr.dr = f.at("dr"); gr.dw = f.at("dw"); gr.dk = f.at("dk"); gr.dv = f.at("dv");
                gr.da = f.at("da"); gr.db = f.at("db"); gr.ds0 = f.at("ds0");
                if (is16) {
                    ref_forward(d, y, sT);
                    gr = ref_backward(d, dy, dsT);
                }
                const double tf = is16 ? 5e-3 : 1e-4, tg = is16 ? 1e-2 : 1e-4;
                struct {
                    const char* n;
                    const std::vector<double>* got;
                    const std::vector<double>* ref;
                    double tol;
                } cmp[] = {{"y", &got.y, &y, tf},        {"sT", &got.sT, &sT, tf},
                           {"dr", &got.dr, &gr.dr, tg},   {"dw", &got.dw, &gr.dw, tg},
                           {"dk", &got.dk, &gr.dk, tg},   {"dv", &got.dv, &gr.dv, tg},
                           {"da", &got.da, &gr.da, tg},   {"db", &got.db, &gr.db, tg},
                           {"ds0", &got.ds0, &gr.ds0, tg}};
                double worst = 0.0;
                std::string worst_name;
                bool pass = true;
                for (auto& x : cmp) {
                    const double e = rel_err(*x.got, *x.ref);
                    if (!(e <= x.tol)) pass = false;
                    if (!(e <= worst)) {
                        worst = e;
                        worst_name = x.n;
                    }
                    CHECK_MESSAGE(e <= x.tol, path << " " << std::string(dtype_name(dt))
                                                   << std::string(km ? " key-major" : "") << ": "
                                                   << std::string(x.n) << " rel err " << e);
                }
                const std::string base = path.substr(path.find_last_of('/') + 1);
                std::ostringstream os;
                os << "golden " << (pass ? "PASS " : "FAIL ") << base << " " << dtype_name(dt)
                   << (km ? " key-major" : " value-major") << " max_rel_err=" << std::scientific
                   << std::setprecision(2) << worst << " (" << worst_name << ")";
                const std::string line = os.str();
                MESSAGE(line);
            }
    }
}

void check_caller_stream_and_graph(wkv_decay_form form) {
    CudaContext cc;
    DeviceProblem p;
    p.c.B = 2; p.c.T = 37; p.c.H = 3; p.c.N = 64; p.c.dtype = WKV_DTYPE_F16;
    p.c.form = form;
    p.build(cc.ctx, test_seed());
    REQUIRE(wkv_forward(cc.ctx, &p.f) == WKV_OK);
    REQUIRE(wkv_backward(cc.ctx, &p.bd) == WKV_OK);
    cc.sync();
    const std::vector<unsigned char> direct = p.outputs();

    cudaStream_t mine = nullptr;
    CU(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking));
    REQUIRE(wkv_cuda_set_stream(cc.ctx, mine) == WKV_OK);
    cudaStream_t back = nullptr;
    REQUIRE(wkv_cuda_get_stream(cc.ctx, &back) == WKV_OK);
    CHECK(back == mine);

    // poison the outputs, then capture forward + backward and replay the graph twice
    for (auto& m : p.m) {
        HostTensor* h = m->h;
        if (h == &p.y || h == &p.s1 || h == &p.ds0 ||
            std::any_of(p.g.begin(), p.g.end(), [&](const HostTensor& t) { return &t == h; })) {
            h->poison();
            m->upload();
        }
    }
    cudaGraph_t graph = nullptr;
    CU(cudaStreamBeginCapture(mine, cudaStreamCaptureModeGlobal));
    const wkv_status s1 = wkv_forward(cc.ctx, &p.f);
    const wkv_status s2 = wkv_backward(cc.ctx, &p.bd);
    CU(cudaStreamEndCapture(mine, &graph));
    INFO(std::string(wkv_last_error(cc.ctx)));
    REQUIRE(s1 == WKV_OK);
    REQUIRE(s2 == WKV_OK);
    cudaGraphExec_t exec = nullptr;
    CU(cudaGraphInstantiate(&exec, graph, 0));
    CU(cudaGraphLaunch(exec, mine));
    CU(cudaGraphLaunch(exec, mine));
    CU(cudaStreamSynchronize(mine));
    CHECK(p.outputs() == direct);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    REQUIRE(wkv_cuda_set_stream(cc.ctx, nullptr) == WKV_OK);  // legacy default, explicitly
    cudaStreamDestroy(mine);
}

}  // namespace cudatest
