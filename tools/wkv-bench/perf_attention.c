/* wkv-bench perf --op attention: times wkv_attention (with the backend's default kernel
 * configuration or with each of them: --config NAME|all) and wkv_attention_backward. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "wkv_tools.h"

static void attn_usage(FILE* f) {
    fprintf(f,
            "usage: wkv-bench perf --op attention [--backend auto|cpu|cuda|vulkan] [--device I]\n"
            "                      [--B B] [--T T] [--Tk TK] [--H HQ] [--kv-heads HKV] [--D D]\n"
            "                      [--dtype f32|f16|bf16] [--causal] [--config NAME|all]\n"
            "                      [--pass forward|backward|both] [--threads K] [--repeat R]\n"
            "                      [--warmup W] [--json]\n"
            "\n"
            "Times softmax attention (wkv_attention, wkv_attention_backward) on random tensors:\n"
            "q [B, T, HQ, D], k and v [B, TK, HKV, D] (TK defaults to T, HKV to HQ), medians of R calls\n"
            "after W, each call followed by wkv_context_synchronize. Host tensors on the CPU; on a GPU\n"
            "backend every tensor lives in a library buffer (wkv_buffer_*, no staging). TFLOP/s counts 4 B HQ T TK D for the forward, 10 B HQ T TK D (its five products)\n"
            "for the backward, halved when causal and T = TK.\n"
            "  --config NAME  pin one forward configuration (wkv_attention_configs); `all`: each one built\n"
            "                 for this dtype and D that fits the device, in turn\n"
            "  --pass P       forward (default), backward (after one forward that writes lse), or both\n"
            "  --json         one JSON object per measurement and line: kind \"perf\", op \"attention\",\n"
            "                 pass, backend, device, dtype, B, T, Tk, H, kv_heads, D, causal, config,\n"
            "                 threads, repeat, median_ms, min_ms, tflops\n");
}

static int cmp_d(const void* a, const void* b) {
    const double x = *(const double*)a, y = *(const double*)b;
    return x < y ? -1 : x > y;
}

/* Uniform values in [-1, 1) in dt (wkv_tools' generator and conversion). */
static int fill_random(void* data, wkv_dtype dt, int64_t n, wkvt_rng* rng) {
    float* tmp = (float*)malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!tmp) return -1;
    for (int64_t i = 0; i < n; i++) tmp[i] = (float)(wkvt_rng_uniform(rng) * 2.0 - 1.0);
    wkvt_store_f32(tmp, data, dt, (size_t)n);
    free(tmp);
    return 0;
}

int bench_perf_attention(int argc, char** argv) {
    const char* cmd = "perf --op attention";
    wkv_backend backend = WKV_BACKEND_AUTO;
    int64_t B = 1, T = 1024, Tk = -1, H = 32, Hkv = -1, D = 64, threads = 0, repeat = 5, warmup = 1, device = 0;
    wkv_dtype dt = WKV_DTYPE_F32;
    int causal = 0, json = 0, fwd = 1, bwd = 0;
    const char* config = NULL;
    for (int i = 1; i < argc; i++) {
        const char* v = NULL;
        int m;
        if (bench_is_help(argv[i])) {
            attn_usage(stdout);
            return BENCH_OK;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--op", &v))) {
            if (m < 0) return BENCH_USAGE;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--backend", &v))) {
            if (m < 0) return BENCH_USAGE;
            if (wkvt_backend_parse(v, &backend))
                return bench_usage_error(cmd, "--backend: '%s' is not auto, cpu, cuda or vulkan", v);
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--dtype", &v))) {
            if (m < 0) return BENCH_USAGE;
            if (wkvt_dtype_parse(v, &dt)) return bench_usage_error(cmd, "--dtype: '%s' is not f32, f16 or bf16", v);
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--config", &v))) {
            if (m < 0) return BENCH_USAGE;
            config = v;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--pass", &v))) {
            if (m < 0) return BENCH_USAGE;
            if (!strcmp(v, "forward")) fwd = 1, bwd = 0;
            else if (!strcmp(v, "backward")) fwd = 0, bwd = 1;
            else if (!strcmp(v, "both")) fwd = 1, bwd = 1;
            else return bench_usage_error(cmd, "--pass: '%s' is not forward, backward or both", v);
        } else if (!strcmp(argv[i], "--causal")) {
            causal = 1;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else {
            struct { const char* name; int64_t* out; int64_t lo, hi; } ints[] = {
                {"--B", &B, 1, 1 << 20}, {"--T", &T, 1, 1 << 26}, {"--Tk", &Tk, 0, 1 << 26}, {"--H", &H, 1, 4096},
                {"--kv-heads", &Hkv, 1, 4096}, {"--D", &D, 1, 4096}, {"--threads", &threads, 0, 1024},
                {"--repeat", &repeat, 1, 100000}, {"--warmup", &warmup, 0, 100000}, {"--device", &device, 0, 1024}};
            int matched = 0;
            for (size_t k = 0; k < sizeof ints / sizeof ints[0] && !matched; k++) {
                if ((m = bench_opt(argc, argv, &i, cmd, ints[k].name, &v))) {
                    if (m < 0 || bench_int(cmd, ints[k].name, v, ints[k].lo, ints[k].hi, ints[k].out)) return BENCH_USAGE;
                    matched = 1;
                }
            }
            if (!matched) return bench_usage_error(cmd, "unknown option '%s'", argv[i]);
        }
    }
    if (Tk < 0) Tk = T;
    if (Hkv < 0) Hkv = H;
    wkv_context_options co;
    memset(&co, 0, sizeof co);
    co.struct_size = sizeof co;
    co.backend = backend;
    co.device_index = (int32_t)device;
    co.cpu_threads = (int32_t)threads;
    wkv_context* ctx = NULL;
    if (wkv_context_create(&co, &ctx) != WKV_OK) {
        bench_error("wkv-bench %s: %s\n", cmd, wkv_last_error(NULL));
        return BENCH_FAIL;
    }
    /* the configurations to time */
    enum { MAX_CFG = 32 };
    wkv_attention_config cfg[MAX_CFG];
    for (int k = 0; k < MAX_CFG; k++) memset(&cfg[k], 0, sizeof cfg[k]), cfg[k].struct_size = sizeof cfg[k];
    int32_t ncfg = 0;
    if (wkv_attention_configs(ctx, cfg, MAX_CFG, &ncfg) != WKV_OK) ncfg = 0;
    if (ncfg > MAX_CFG) ncfg = MAX_CFG;
    const char* names[MAX_CFG + 1];
    int nnames = 0;
    if (!config) names[nnames++] = NULL; /* the backend's choice */
    else if (!strcmp(config, "all")) /* each one built for this dtype and D that fits the device */
        for (int k = 0; k < ncfg; k++) {
            const wkv_attention_config* c = &cfg[k];
            if ((c->dtype.bits && (c->dtype.code != dt.code || c->dtype.bits != dt.bits)) ||
                (c->head_dim && c->head_dim != D) || !c->fits)
                continue;
            names[nnames++] = c->name;
        }
    else names[nnames++] = config;

    const size_t es = dt.bits / 8;
    const int64_t nq = B * T * H * D, nk = B * Tk * Hkv * D;
    void *q = malloc((size_t)nq * es), *k = malloc((size_t)nk * es), *v = malloc((size_t)nk * es),
         *o = malloc((size_t)nq * es);
    /* the backward's: lse, dout, dq, dk, dv (one byte when not timed) */
    const size_t nl = bwd ? (size_t)(B * H * T) : 1, nbq = bwd ? (size_t)nq * es : 1, nbk = bwd ? (size_t)nk * es : 1;
    float* lse = (float*)malloc(sizeof(float) * nl);
    void *dout = malloc(nbq), *dq = malloc(nbq), *dk = malloc(nbk), *dv = malloc(nbk);
    double* times = (double*)malloc(sizeof(double) * (size_t)repeat);
    int rc = BENCH_OK;
    bench_resident res; /* the tensors' buffers on a GPU backend */
    res.n = 0;
    if (!q || !k || !v || !o || !times || !lse || !dout || !dq || !dk || !dv) {
        bench_error("wkv-bench %s: out of memory\n", cmd);
        rc = BENCH_FAIL;
        goto out;
    }
    wkvt_rng rng;
    wkvt_rng_seed(&rng, 1);
    if (fill_random(q, dt, nq, &rng) || fill_random(k, dt, nk, &rng) || fill_random(v, dt, nk, &rng) ||
        (bwd && fill_random(dout, dt, nq, &rng))) {
        bench_error("wkv-bench %s: out of memory\n", cmd);
        rc = BENCH_FAIL;
        goto out;
    }
    const int64_t qshape[4] = {B, T, H, D}, kshape[4] = {B, Tk, Hkv, D};
    wkv_attention_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.flags = causal ? WKV_ATTENTION_CAUSAL : 0;
    d.q = wkv_tensor_make(q, dt, 4, qshape), d.k = wkv_tensor_make(k, dt, 4, kshape);
    d.v = wkv_tensor_make(v, dt, 4, kshape), d.o = wkv_tensor_make(o, dt, 4, qshape);
    const int64_t lshape[3] = {B, H, T};
    wkv_attention_backward_desc bd;
    memset(&bd, 0, sizeof bd);
    bd.struct_size = sizeof bd;
    bd.forward = &d;
    bd.dout = wkv_tensor_make(dout, dt, 4, qshape), bd.dq = wkv_tensor_make(dq, dt, 4, qshape);
    bd.dk = wkv_tensor_make(dk, dt, 4, kshape), bd.dv = wkv_tensor_make(dv, dt, 4, kshape);
    wkv_tensor lse_t = wkv_tensor_make(lse, WKV_DTYPE_F32, 3, lshape);
    if (wkv_context_backend(ctx) != WKV_BACKEND_CPU) {
        wkv_tensor* fwd_t[] = {&d.q, &d.k, &d.v, &d.o};
        for (size_t x = 0; x < sizeof fwd_t / sizeof fwd_t[0]; x++)
            if (bench_make_resident(ctx, &res, fwd_t[x], "the attention tensors")) {
                rc = BENCH_FAIL;
                goto out;
            }
        wkv_tensor* bwd_t[] = {&lse_t, &bd.dout, &bd.dq, &bd.dk, &bd.dv};
        for (size_t x = 0; bwd && x < sizeof bwd_t / sizeof bwd_t[0]; x++)
            if (bench_make_resident(ctx, &res, bwd_t[x], "the attention backward's tensors")) {
                rc = BENCH_FAIL;
                goto out;
            }
    }
    char dev[256];
    bench_device_name(wkv_context_backend(ctx), (int32_t)device, dev, sizeof dev);
    const double pairs = (double)B * (double)H * (double)T * (double)Tk * (double)D * (causal && T == Tk ? 0.5 : 1.0);
    /* runs: each configuration's forward, then the backward (once: it has no configurations) */
    const int nruns = (fwd ? nnames : 0) + bwd;
    for (int run = 0; run < nruns; run++) {
        const int is_bwd = run >= (fwd ? nnames : 0), c = is_bwd ? 0 : run;
        d.config = is_bwd ? NULL : names[c];
        d.lse = is_bwd ? lse_t : wkv_tensor_make(NULL, WKV_DTYPE_F32, 3, lshape);
        const double flops = (is_bwd ? 10.0 : 4.0) * pairs;
        bench_progress(run + 1, nruns, "attention %s", is_bwd ? "backward" : names[c] ? names[c] : "(default)");
        wkv_status st = is_bwd ? wkv_attention(ctx, &d) : WKV_OK; /* the backward's o and lse */
        for (int64_t w = 0; w < warmup && !st; w++) st = is_bwd ? wkv_attention_backward(ctx, &bd) : wkv_attention(ctx, &d);
        for (int64_t r = 0; r < repeat && !st; r++) {
            const double t0 = wkvt_now();
            st = is_bwd ? wkv_attention_backward(ctx, &bd) : wkv_attention(ctx, &d);
            if (!st) st = wkv_context_synchronize(ctx);
            times[r] = wkvt_now() - t0;
        }
        if (st) {
            bench_error("wkv-bench %s: %s\n", cmd, wkv_last_error(ctx));
            rc = BENCH_FAIL;
            continue;
        }
        qsort(times, (size_t)repeat, sizeof *times, cmp_d);
        const double med = times[repeat / 2], mn = times[0];
        const char* cname = is_bwd ? "(backward)" : names[c] ? names[c] : "(default)";
        const char* pass = is_bwd ? "backward" : "forward";
        bench_progress_clear();
        const int nthr = wkv_context_backend(ctx) == WKV_BACKEND_CPU ? bench_cpu_threads((int)threads) : 0;
        if (json) {
            printf("{\"kind\":\"perf\",\"op\":\"attention\",\"pass\":\"%s\",\"backend\":\"%s\",\"device\":", pass,
                   wkvt_backend_name(wkv_context_backend(ctx)));
            bench_json_string(stdout, dev);
            printf(",\"dtype\":\"%s\",\"B\":%lld,\"T\":%lld,\"Tk\":%lld,\"H\":%lld,\"kv_heads\":%lld,\"D\":%lld,"
                   "\"causal\":%s,\"config\":",
                   wkvt_dtype_name(dt), (long long)B, (long long)T, (long long)Tk, (long long)H, (long long)Hkv,
                   (long long)D, causal ? "true" : "false");
            bench_json_string(stdout, cname);
            printf(",\"threads\":%d,\"repeat\":%lld,\"median_ms\":%.6g,\"min_ms\":%.6g,\"tflops\":%.6g}\n", nthr,
                   (long long)repeat, med * 1e3, mn * 1e3, flops / med * 1e-12);
        } else {
            printf("attention %s %s %s B=%lld T=%lld Tk=%lld H=%lld/%lld D=%lld%s %s: median %.3f ms (min %.3f)  "
                   "%.3g TFLOP/s\n",
                   pass, wkvt_backend_name(wkv_context_backend(ctx)), wkvt_dtype_name(dt), (long long)B, (long long)T,
                   (long long)Tk, (long long)H, (long long)Hkv, (long long)D, causal ? " causal" : "", cname,
                   med * 1e3, mn * 1e3, flops / med * 1e-12);
        }
        fflush(stdout);
    }
out:
    bench_release(&res);
    free(q), free(k), free(v), free(o), free(times), free(lse), free(dout), free(dq), free(dk), free(dv);
    wkv_context_destroy(ctx);
    return rc;
}
