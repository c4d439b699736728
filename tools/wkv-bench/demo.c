/* wkv-bench demo: a realistic RWKV-7 workload on the best backend present — a prefill through
 * several layers, each keeping its own state, then token-by-token decoding with the state
 * updated in place — checked against the float64 reference, with a short report. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "reference/wkv_reference.h"
#include "wkv_tools.h"

#define DEMO_FLOP_FWD 9.0 /* per token, head and N^2: see perf.c */

/* A contiguous tensor: in buf when there is one (GPU backends), else at host. */
static wkv_tensor demo_tensor(wkv_buffer* buf, void* host, wkv_dtype dt, const int64_t* shape) {
    return buf ? wkv_tensor_make_buffer(buf, 0, dt, 4, shape) : wkv_tensor_make(host, dt, 4, shape);
}

/* fd's six inputs r w k v a b (host[], `bytes` each) and y: uploaded into the GPU buffers when
 * there are any (GPU backends), else the host arrays themselves. Returns the uploads' status. */
static wkv_status demo_set_tokens(wkv_context* ctx, wkv_forward_desc* fd, wkv_buffer* const* g_in, wkv_buffer* g_y,
                                  void* const* host, void* y, size_t bytes, wkv_dtype dt, const int64_t* shape) {
    wkv_tensor* in[6] = {&fd->r, &fd->w, &fd->k, &fd->v, &fd->a, &fd->b};
    wkv_status s = WKV_OK;
    for (int i = 0; i < 6; i++) {
        if (g_in[i] && s == WKV_OK) s = wkv_buffer_upload(ctx, g_in[i], 0, host[i], bytes);
        *in[i] = demo_tensor(g_in[i], host[i], dt, shape);
    }
    fd->y = demo_tensor(g_y, y, dt, shape);
    return s;
}

/* One timed call: on a GPU backend until its work is complete. */
static wkv_status demo_call(wkv_context* ctx, const wkv_forward_desc* fd, int gpu, double* seconds) {
    const double t0 = wkvt_now();
    wkv_status s = wkv_forward(ctx, fd);
    if (s == WKV_OK && gpu) s = wkv_context_synchronize(ctx);
    *seconds += wkvt_now() - t0;
    return s;
}

typedef struct demo_cfg {
    int layers;
    int64_t B, H, N, T, D;
    wkv_dtype dt;
    wkv_backend backend;
    int32_t device;
    int threads;
    wkv_decay_form decay;
    uint64_t seed;
    int check;
} demo_cfg;

static void demo_usage(FILE* f) {
    fprintf(f,
            "usage: wkv-bench demo [--layers L] [--heads H] [--head-size N] [--batch B]\n"
            "                      [--prefill T] [--decode D] [--dtype f32|f16|bf16]\n"
            "                      [--backend auto|cpu|cuda|vulkan] [--device I] [--threads K]\n"
            "                      [--decay FORM] [--seed S] [--no-check]\n"
            "\n"
            "Runs the WKV part of an RWKV-7 model on the best backend present (AUTO: CUDA, else\n"
            "Vulkan, else CPU): a prefill of T tokens through L layers, each layer keeping its\n"
            "own state, then D tokens decoded one at a time (T=1 calls, state_in == state_out:\n"
            "the state is updated in place). Inputs are random but shaped like a model's\n"
            "(decays in (0.545, 1), a = -kk, b = kk*iclr). On a GPU the states, inputs and\n"
            "outputs live in device buffers (wkv_buffer), as a model keeps them: copies to and\n"
            "from the host are outside the timed calls, and each timed call runs to completion\n"
            "(wkv_context_synchronize). Then layer 0 — every head, its whole\n"
            "prefill output and state, every decoded token, the final state — is compared with\n"
            "libwkv's float64 reference run on the same inputs.\n"
            "\n"
            "  --layers L      layers (default 4)\n"
            "  --heads H       heads per layer (default 32)\n"
            "  --head-size N   head size (default 64)\n"
            "  --batch B       sequences decoded together (default 1)\n"
            "  --prefill T     prompt tokens (default 2048)\n"
            "  --decode D      generated tokens (default 64)\n"
            "  --dtype D       input/output dtype; the state is f32 (default f32)\n"
            "  --backend B     default auto; --device I: GPU ordinal (default 0)\n"
            "  --threads K     CPU threads (default: WKV_NUM_THREADS or all cores)\n"
            "  --decay FORM    clampw|log|exp_neg_exp|direct (default clampw, as models use)\n"
            "  --seed S        random seed (default 1)\n"
            "  --no-check      skip the comparison with the float64 reference\n"
            "\n"
            "Prints the settings, prefill tokens/s, decode tokens/s and microseconds per token,\n"
            "the largest norm-wise relative error against the reference (tolerance %.0e for\n"
            "f32, %.0e for 16-bit inputs) and PASS or FAIL. Exit status 0 on PASS, 1 on FAIL,\n"
            "2 on a usage error.\n",
            1e-4, 5e-3);
}

/* Error accumulators: sum (out - ref)^2 and sum ref^2; any non-finite output -> bad. */
typedef struct demo_err {
    double num, den;
    int bad;
} demo_err;

static double demo_err_value(const demo_err* e) {
    if (e->bad || isnan(e->num)) return INFINITY;
    return e->den > 0 ? sqrt(e->num / e->den) : sqrt(e->num);
}

static void demo_acc(demo_err* e, double out, double ref) {
    if (!isfinite(out)) e->bad = 1;
    double d = out - ref;
    e->num += d * d;
    e->den += ref * ref;
}

/* The float64 reference over tokens [0, T) of f32 inputs [B,T,H,N] (one head at a time),
 * starting from ref_state (double [B,H,N,N]; NULL = zero), compared with the library's y
 * (dtype, [B,T,H,N]) and state (f32 [B,H,N,N]). ref_state_out (may equal ref_state) gets the
 * reference's final state. Returns -1 when out of memory. */
static int demo_check(const demo_cfg* c, int64_t T, float* const* in, const double* ref_state,
                      const void* y_lib, const float* state_lib, double* ref_state_out,
                      demo_err* ey, demo_err* es) {
    const int64_t B = c->B, H = c->H, N = c->N;
    const size_t tn = (size_t)(T * N), nn = (size_t)(N * N);
    double* buf = (double*)malloc((6 * tn + tn + 2 * nn) * sizeof(double));
    float* yl = (float*)malloc((size_t)N * sizeof(float));
    if (!buf || !yl) {
        free(buf);
        free(yl);
        return -1;
    }
    double* x[6];
    for (int i = 0; i < 6; i++) x[i] = buf + (size_t)i * tn;
    double* yr = buf + 6 * tn;
    double* s0 = yr + tn;
    double* sT = s0 + nn;
    const size_t es_ = wkvt_dtype_size(c->dt);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            for (int64_t t = 0; t < T; t++) {
                size_t src = (size_t)(((b * T + t) * H + h) * N);
                for (int i = 0; i < 6; i++)
                    for (int64_t j = 0; j < N; j++) x[i][t * N + j] = in[i][src + (size_t)j];
            }
            size_t so = (size_t)((b * H + h) * N * N);
            if (ref_state) memcpy(s0, ref_state + so, nn * sizeof(double));
            wkv_ref_rwkv7 r;
            memset(&r, 0, sizeof r);
            r.B = 1, r.T = T, r.H = 1, r.N = N;
            r.decay_form = c->decay;
            r.r = x[0], r.w = x[1], r.k = x[2], r.v = x[3], r.a = x[4], r.b = x[5];
            r.s0 = ref_state ? s0 : NULL;
            wkv_ref_rwkv7_forward(&r, yr, sT);
            for (int64_t t = 0; t < T; t++) {
                size_t src = (size_t)(((b * T + t) * H + h) * N);
                wkvt_load_f32((const char*)y_lib + src * es_, c->dt, yl, (size_t)N);
                for (int64_t j = 0; j < N; j++) demo_acc(ey, yl[j], yr[t * N + j]);
            }
            for (size_t e = 0; e < nn; e++) demo_acc(es, state_lib[so + e], sT[e]);
            memcpy(ref_state_out + so, sT, nn * sizeof(double));
        }
    free(buf);
    free(yl);
    return 0;
}

static void demo_progress(int tty, const char* fmt, int a, int b) {
    if (!tty) return;
    fprintf(stderr, "\r\033[K");
    fprintf(stderr, fmt, a, b);
    fflush(stderr);
}

int bench_demo(int argc, char** argv) {
    const char* cmd = "demo";
    demo_cfg c;
    memset(&c, 0, sizeof c);
    c.layers = 4;
    c.B = 1;
    c.H = 32;
    c.N = 64;
    c.T = 2048;
    c.D = 64;
    c.dt = WKV_DTYPE_F32;
    c.backend = WKV_BACKEND_AUTO;
    c.decay = WKV_DECAY_CLAMPW;
    c.seed = 1;
    c.check = 1;
    for (int i = 1; i < argc; i++) {
        const char* v = NULL;
        int m;
        int64_t x;
        if (bench_is_help(argv[i])) {
            demo_usage(stdout);
            return BENCH_OK;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--layers", &v))) {
            if (m < 0 || bench_int(cmd, "--layers", v, 1, 1024, &x)) return BENCH_USAGE;
            c.layers = (int)x;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--heads", &v))) {
            if (m < 0 || bench_int(cmd, "--heads", v, 1, 4096, &c.H)) return BENCH_USAGE;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--head-size", &v))) {
            if (m < 0 || bench_int(cmd, "--head-size", v, 1, 1024, &c.N)) return BENCH_USAGE;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--batch", &v))) {
            if (m < 0 || bench_int(cmd, "--batch", v, 1, 4096, &c.B)) return BENCH_USAGE;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--prefill", &v))) {
            if (m < 0 || bench_int(cmd, "--prefill", v, 1, 1 << 22, &c.T)) return BENCH_USAGE;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--decode", &v))) {
            if (m < 0 || bench_int(cmd, "--decode", v, 0, 1 << 20, &c.D)) return BENCH_USAGE;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--dtype", &v))) {
            if (m < 0) return BENCH_USAGE;
            if (wkvt_dtype_parse(v, &c.dt))
                return bench_usage_error(cmd, "--dtype: '%s' is not f32, f16 or bf16", v);
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--backend", &v))) {
            if (m < 0) return BENCH_USAGE;
            if (wkvt_backend_parse(v, &c.backend))
                return bench_usage_error(cmd, "--backend: '%s' is not auto, cpu, cuda or vulkan", v);
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--device", &v))) {
            if (m < 0 || bench_int(cmd, "--device", v, 0, 1024, &x)) return BENCH_USAGE;
            c.device = (int32_t)x;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--threads", &v))) {
            if (m < 0 || bench_int(cmd, "--threads", v, 0, 1024, &x)) return BENCH_USAGE;
            c.threads = (int)x;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--decay", &v))) {
            if (m < 0) return BENCH_USAGE;
            if (wkvt_decay_form_parse(v, &c.decay))
                return bench_usage_error(cmd, "--decay: '%s' is not clampw, log, exp_neg_exp or direct", v);
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--seed", &v))) {
            if (m < 0 || bench_int(cmd, "--seed", v, 0, INT64_MAX, &x)) return BENCH_USAGE;
            c.seed = (uint64_t)x;
        } else if (!strcmp(argv[i], "--no-check")) {
            c.check = 0;
        } else if (argv[i][0] == '-') {
            return bench_usage_error(cmd, "unknown option '%s'", argv[i]);
        } else {
            return bench_usage_error(cmd, "unexpected argument '%s'", argv[i]);
        }
    }
    if ((double)c.B * (double)c.T * (double)c.H * (double)c.N > 1073741824.0 ||
        (double)c.layers * (double)c.B * (double)c.H * (double)c.N * (double)c.N > 1073741824.0)
        return bench_usage_error(cmd, "the shape is too large for a demo");

    const double t_start = wkvt_now();
    const int tty = isatty(fileno(stderr));
    const int is16 = wkvt_dtype_size(c.dt) == 2;
    const double tol = is16 ? 5e-3 : 1e-4;
    const size_t es = wkvt_dtype_size(c.dt);
    const size_t n_pre = (size_t)(c.B * c.T * c.H * c.N);
    const size_t n_tok = (size_t)(c.B * c.H * c.N);
    const size_t sn = (size_t)(c.B * c.H * c.N * c.N);
    const size_t n_dec = n_tok * (size_t)c.D;
    int rc = BENCH_FAIL;

    wkv_context_options co;
    memset(&co, 0, sizeof co);
    co.struct_size = sizeof co;
    co.backend = c.backend;
    co.device_index = c.device;
    co.cpu_threads = c.threads;
    wkv_context* ctx = NULL;
    if (wkv_context_create(&co, &ctx) != WKV_OK) {
        fprintf(stderr, "wkv-bench demo: cannot create a context (backend %s): %s\n",
                wkvt_backend_name(c.backend), wkv_last_error(NULL));
        return BENCH_FAIL;
    }
    const wkv_backend be = wkv_context_backend(ctx);
    char device[256];
    bench_device_name(be, c.device, device, sizeof device);

    printf("wkv-bench demo: RWKV-7 WKV, %d layers x %lld heads x head size %lld, batch %lld\n",
           c.layers, (long long)c.H, (long long)c.N, (long long)c.B);
    printf("  settings  prefill %lld tokens, decode %lld tokens, %s inputs (f32 state), decay %s, seed %llu\n",
           (long long)c.T, (long long)c.D, wkvt_dtype_name(c.dt), wkvt_decay_form_name(c.decay),
           (unsigned long long)c.seed);
    if (be == WKV_BACKEND_CPU)
        printf("  backend   cpu (%s), %d threads\n", device[0] ? device : "unknown CPU",
               bench_cpu_threads(c.threads));
    else
        printf("  backend   %s (%s), states and tensors in device buffers\n", wkvt_backend_name(be),
               device[0] ? device : "device ?");
    fflush(stdout);

    /* buffers */
    float* pf[6] = {0};  /* prefill inputs, f32 (rounded to dt when 16-bit) */
    void* pl[6] = {0};   /* the same in dt (aliases pf for f32) */
    float* df[6] = {0};  /* one decode token */
    void* dl[6] = {0};
    float* dec_in[6] = {0}; /* layer 0's decode inputs, all tokens [B,D,H,N] */
    void* y_pre = malloc(n_pre * es);
    void* y_tok = malloc(n_tok * es);
    void* y_dec0 = malloc((n_dec ? n_dec : 1) * es); /* layer 0's decode outputs [B,D,H,N] */
    float* states = (float*)malloc((size_t)c.layers * sn * sizeof(float));
    float* state0_pre = (float*)malloc(sn * sizeof(float));
    double* ref_state = (double*)malloc(sn * sizeof(double));
    int oom = !y_pre || !y_tok || !y_dec0 || !states || !state0_pre || !ref_state;
    for (int i = 0; i < 6; i++) {
        pf[i] = (float*)malloc(n_pre * sizeof(float));
        df[i] = (float*)malloc(n_tok * sizeof(float));
        dec_in[i] = (float*)malloc((n_dec ? n_dec : 1) * sizeof(float));
        pl[i] = is16 ? malloc(n_pre * es) : pf[i];
        dl[i] = is16 ? malloc(n_tok * es) : df[i];
        oom = oom || !pf[i] || !df[i] || !dec_in[i] || !pl[i] || !dl[i];
    }
    demo_err e_ypre = {0, 0, 0}, e_spre = {0, 0, 0}, e_ydec = {0, 0, 0}, e_sfin = {0, 0, 0};
    double t_prefill = 0.0, t_decode = 0.0, t_gen = 0.0, t_check = 0.0;
    /* GPU backends: device buffers for the six inputs, y (prefill-sized, reused by the decode)
     * and every layer's state */
    const int gpu = be != WKV_BACKEND_CPU;
    wkv_buffer* g_in[6] = {0};
    wkv_buffer* g_y = NULL;
    wkv_buffer** g_st = gpu ? (wkv_buffer**)calloc((size_t)c.layers, sizeof *g_st) : NULL;
    if (oom || (gpu && !g_st)) {
        fprintf(stderr, "wkv-bench demo: out of memory\n");
        goto done;
    }
    if (gpu) {
        wkv_status bs = WKV_OK;
        for (int i = 0; i < 6 && bs == WKV_OK; i++) bs = wkv_buffer_create(ctx, n_pre * es, &g_in[i]);
        if (bs == WKV_OK) bs = wkv_buffer_create(ctx, n_pre * es, &g_y);
        for (int l = 0; l < c.layers && bs == WKV_OK; l++) bs = wkv_buffer_create(ctx, sn * sizeof(float), &g_st[l]);
        if (bs != WKV_OK) {
            fprintf(stderr, "wkv-bench demo: device buffers: %s\n", wkv_last_error(ctx));
            goto done;
        }
    }

    int64_t pshape[4] = {c.B, c.T, c.H, c.N};
    int64_t dshape[4] = {c.B, 1, c.H, c.N};
    int64_t sshape[4] = {c.B, c.H, c.N, c.N};
    wkv_forward_desc fd;
    memset(&fd, 0, sizeof fd);
    fd.struct_size = sizeof fd;
    fd.op = WKV_OP_RWKV7;
    fd.decay_form = c.decay;

    /* ---- prefill: every layer from a zero state; layer l's final state -> states[l] */
    for (int l = 0; l < c.layers; l++) {
        demo_progress(tty, "prefill: layer %d/%d", l + 1, c.layers);
        double g0 = wkvt_now();
        wkvt_rng rng;
        wkvt_rng_seed(&rng, c.seed * 1000003u + (uint64_t)l);
        wkvt_rwkv7_random(&rng, c.seed * 7919u + (uint64_t)l, c.decay, c.B, c.T, c.H, c.N, pf[0],
                          pf[1], pf[2], pf[3], pf[4], pf[5]);
        if (is16)
            for (int i = 0; i < 6; i++) {
                wkvt_store_f32(pf[i], pl[i], c.dt, n_pre);
                wkvt_load_f32(pl[i], c.dt, pf[i], n_pre); /* what the library sees */
            }
        t_gen += wkvt_now() - g0;
        wkv_status s = demo_set_tokens(ctx, &fd, g_in, g_y, pl, y_pre, n_pre * es, c.dt, pshape);
        fd.state_in = wkv_tensor_make(NULL, WKV_DTYPE_F32, 4, sshape); /* absent: zeros */
        fd.state_out = demo_tensor(gpu ? g_st[l] : NULL, states + (size_t)l * sn, WKV_DTYPE_F32, sshape);
        if (s == WKV_OK) s = demo_call(ctx, &fd, gpu, &t_prefill);
        if (s == WKV_OK && gpu && l == 0) { /* what the check reads */
            s = wkv_buffer_download(ctx, g_y, 0, y_pre, n_pre * es);
            if (s == WKV_OK) s = wkv_buffer_download(ctx, g_st[0], 0, states, sn * sizeof(float));
        }
        if (s != WKV_OK) {
            if (tty) fprintf(stderr, "\n");
            fprintf(stderr, "wkv-bench demo: prefill, layer %d: %s\n", l,
                    wkv_last_error(ctx));
            goto done;
        }
        if (l == 0 && c.check) {
            demo_progress(tty, "checking layer %d prefill (%d heads)", 0, (int)c.H);
            double c0 = wkvt_now();
            memcpy(state0_pre, states, sn * sizeof(float));
            if (demo_check(&c, c.T, pf, NULL, y_pre, state0_pre, ref_state, &e_ypre, &e_spre)) {
                fprintf(stderr, "wkv-bench demo: out of memory for the check\n");
                goto done;
            }
            t_check += wkvt_now() - c0;
        }
    }

    /* ---- decode: one token at a time through every layer, state updated in place */
    wkvt_rng drng;
    wkvt_rng_seed(&drng, c.seed * 1000003u + 999983u);
    for (int64_t t = 0; t < c.D; t++) {
        if (t % 8 == 0) demo_progress(tty, "decode: token %d/%d", (int)t + 1, (int)c.D);
        for (int l = 0; l < c.layers; l++) {
            double g0 = wkvt_now();
            wkvt_rwkv7_random(&drng, c.seed * 7919u + (uint64_t)l, c.decay, c.B, 1, c.H, c.N,
                              df[0], df[1], df[2], df[3], df[4], df[5]);
            if (is16)
                for (int i = 0; i < 6; i++) {
                    wkvt_store_f32(df[i], dl[i], c.dt, n_tok);
                    wkvt_load_f32(dl[i], c.dt, df[i], n_tok);
                }
            if (l == 0) /* keep layer 0's inputs, [B, D, H, N] */
                for (int i = 0; i < 6; i++)
                    for (int64_t b = 0; b < c.B; b++)
                        memcpy(dec_in[i] + (size_t)((b * c.D + t) * c.H * c.N),
                               df[i] + (size_t)(b * c.H * c.N), (size_t)(c.H * c.N) * sizeof(float));
            t_gen += wkvt_now() - g0;
            float* st = states + (size_t)l * sn;
            wkv_buffer* gst = gpu ? g_st[l] : NULL;
            wkv_status s = demo_set_tokens(ctx, &fd, g_in, g_y, dl, y_tok, n_tok * es, c.dt, dshape);
            fd.state_in = demo_tensor(gst, st, WKV_DTYPE_F32, sshape);
            fd.state_out = demo_tensor(gst, st, WKV_DTYPE_F32, sshape); /* in place */
            if (s == WKV_OK) s = demo_call(ctx, &fd, gpu, &t_decode);
            if (s == WKV_OK && gpu && l == 0) s = wkv_buffer_download(ctx, g_y, 0, y_tok, n_tok * es);
            if (s != WKV_OK) {
                if (tty) fprintf(stderr, "\n");
                fprintf(stderr, "wkv-bench demo: decode token %lld, layer %d: %s\n",
                        (long long)t, l, wkv_last_error(ctx));
                goto done;
            }
            if (l == 0)
                for (int64_t b = 0; b < c.B; b++)
                    memcpy((char*)y_dec0 + (size_t)((b * c.D + t) * c.H * c.N) * es,
                           (const char*)y_tok + (size_t)(b * c.H * c.N) * es,
                           (size_t)(c.H * c.N) * es);
        }
    }
    if (c.check && c.D > 0) {
        if (gpu && wkv_buffer_download(ctx, g_st[0], 0, states, sn * sizeof(float)) != WKV_OK) {
            fprintf(stderr, "wkv-bench demo: reading layer 0's state back: %s\n", wkv_last_error(ctx));
            goto done;
        }
        demo_progress(tty, "checking layer %d decode (%d tokens)", 0, (int)c.D);
        double c0 = wkvt_now();
        if (demo_check(&c, c.D, dec_in, ref_state, y_dec0, states, ref_state, &e_ydec, &e_sfin)) {
            fprintf(stderr, "wkv-bench demo: out of memory for the check\n");
            goto done;
        }
        t_check += wkvt_now() - c0;
    }
    if (tty) fprintf(stderr, "\r\033[K");

    /* ---- report */
    {
        double pre_tokens = (double)c.B * (double)c.T;
        double flops = DEMO_FLOP_FWD * pre_tokens * (double)c.layers * (double)c.H *
                       (double)c.N * (double)c.N;
        printf("  prefill   %lld tokens x %d layers in %.1f ms: %.0f tokens/s (%.2f GFLOP/s)\n",
               (long long)c.T * (long long)c.B, c.layers, t_prefill * 1e3,
               t_prefill > 0 ? pre_tokens / t_prefill : INFINITY,
               t_prefill > 0 ? flops / t_prefill * 1e-9 : INFINITY);
        if (c.D > 0) {
            double dec_tokens = (double)c.B * (double)c.D;
            printf("  decode    %lld tokens x %d layers (T=1, state in place) in %.1f ms: %.0f "
                   "tokens/s, %.1f us/token\n",
                   (long long)c.D * (long long)c.B, c.layers, t_decode * 1e3,
                   t_decode > 0 ? dec_tokens / t_decode : INFINITY,
                   t_decode / (double)c.D * 1e6);
        }
        int pass = 1;
        if (c.check) {
            double ev[4] = {demo_err_value(&e_ypre), demo_err_value(&e_spre),
                            demo_err_value(&e_ydec), demo_err_value(&e_sfin)};
            const char* en[4] = {"prefill y", "prefill state", "decode y", "final state"};
            int ne = c.D > 0 ? 4 : 2;
            double worst = 0.0;
            int wi = 0;
            for (int i = 0; i < ne; i++)
                if (!(ev[i] <= worst)) worst = ev[i], wi = i;
            printf("  check     layer 0, all %lld heads, vs the float64 reference: max rel err "
                   "%.2e (%s; tolerance %.0e)\n",
                   (long long)c.H, worst, en[wi], tol);
            printf("            prefill y %.2e, prefill state %.2e", ev[0], ev[1]);
            if (c.D > 0) printf(", decode y %.2e, final state %.2e", ev[2], ev[3]);
            printf("\n");
            pass = worst <= tol;
        } else {
            printf("  check     skipped (--no-check)\n");
        }
        printf("  time      %.2f s in all (kernels %.2f s, input generation %.2f s, reference "
               "check %.2f s)\n",
               wkvt_now() - t_start, t_prefill + t_decode, t_gen, t_check);
        printf("%s\n", !c.check ? "DONE (unchecked)" : pass ? "PASS" : "FAIL");
        rc = pass ? BENCH_OK : BENCH_FAIL;
    }
done:
    for (int i = 0; i < 6; i++) {
        if (is16) {
            free(pl[i]);
            free(dl[i]);
        }
        free(pf[i]);
        free(df[i]);
        free(dec_in[i]);
    }
    free(y_pre);
    free(y_tok);
    free(y_dec0);
    free(states);
    free(state0_pre);
    free(ref_state);
    for (int i = 0; i < 6; i++) wkv_buffer_destroy(g_in[i]);
    wkv_buffer_destroy(g_y);
    for (int l = 0; g_st && l < c.layers; l++) wkv_buffer_destroy(g_st[l]);
    free(g_st);
    wkv_context_destroy(ctx);
    return rc;
}
