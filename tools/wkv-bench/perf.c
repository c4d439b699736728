/* wkv-bench perf: times wkv_forward / wkv_backward on random, realistic inputs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "wkv_tools.h"

/* Nominal flop counts per token and head (N = head size), used for GFLOP/s:
 *   forward:  9 N^2  = sa (N^2 multiply-adds: 2 N^2) + update (S*decay + sa*b + v*k: 3 mul
 *             + 2 add per element: 5 N^2) + readout (2 N^2)
 *   backward: 28 N^2 = the forward recomputed (9 N^2) + the gradient recurrence: dS += dy r^T,
 *             dr, dk, dv, d decay, db, d sa, da (2 N^2 each: 16 N^2), dS <- dS diag(decay) +
 *             d sa a^T (3 N^2) */
#define PERF_FLOP_FWD 9.0
#define PERF_FLOP_BWD 28.0

enum { PERF_MAX_LIST = 16 };

static void perf_usage(FILE* f) {
    fprintf(f,
            "usage: wkv-bench perf [--op rwkv7] [--backend auto|cpu|cuda|vulkan] [--device I]\n"
            "                      [--B B] [--T T] [--H H] [--N N] [--dtype f32|f16|bf16]\n"
            "                      [--threads K] [--decay FORM] [--pass forward|backward|both]\n"
            "                      [--repeat R] [--warmup W] [--no-state] [--seed S] [--json]\n"
            "\n"
            "Times wkv_forward and/or wkv_backward on random inputs that look like an RWKV-7\n"
            "model's (decays in (0.545, 1), a = -kk, b = kk*iclr), with host (CPU-memory)\n"
            "tensors: W warm-up calls, then R timed calls (wall clock, CLOCK_MONOTONIC, around\n"
            "each call; for a GPU backend that includes the copies to and from the device).\n"
            "B, T, H, N, --dtype and --threads take comma-separated lists (every combination\n"
            "is measured).\n"
            "\n"
            "  --op OP        rwkv7 (the only op timed so far)\n"
            "  --backend B    default auto\n"
            "  --device I     GPU ordinal (default 0)\n"
            "  --B, --T, --H, --N   batch, tokens, heads, head size (default 1, 1024, 32, 64)\n"
            "  --dtype D      input/output dtype; the state is always f32 (default f32)\n"
            "  --threads K    CPU threads; 0 = WKV_NUM_THREADS or all cores (default 0)\n"
            "  --decay FORM   clampw|log|exp_neg_exp|direct (default clampw)\n"
            "  --pass P       forward, backward or both (default both)\n"
            "  --repeat R     timed calls (default 5); --warmup W  untimed calls first (default 1)\n"
            "  --no-state     no state_in / state_out (start from zero, drop the final state)\n"
            "  --seed S       random seed (default 1)\n"
            "  --json         one JSON object per measurement per line, keys: op backend device\n"
            "                 dtype B T H N threads pass median_ms min_ms tokens_per_s gflops gbps\n"
            "\n"
            "Reported per measurement: median and minimum time per call; tokens/s = B*T / median;\n"
            "GFLOP/s from a nominal count per token and head: forward %.0f*N^2 (sa 2N^2, update\n"
            "5N^2, readout 2N^2), backward %.0f*N^2 (forward recomputed 9N^2 + gradients 19N^2);\n"
            "GB/s from the bytes a call must move once: forward reads r w k v a b (+ state_in)\n"
            "and writes y (+ state_out); backward reads r w k v a b, dy (+ state_in, d state_out)\n"
            "and writes dr dw dk dv da db (+ d state_in); workspace traffic is not counted.\n",
            PERF_FLOP_FWD, PERF_FLOP_BWD);
}

typedef struct perf_shape {
    int64_t B, T, H, N;
} perf_shape;

typedef struct perf_cfg {
    wkv_backend backend;
    int32_t device;
    wkv_decay_form decay;
    int fwd, bwd, repeat, warmup, json, state;
    uint64_t seed;
} perf_cfg;

static int cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

static void perf_report(const perf_cfg* c, const char* backend, const char* device,
                        wkv_dtype dt, const perf_shape* s, int threads, const char* pass,
                        double* times, int n, double flop_per, double bytes) {
    qsort(times, (size_t)n, sizeof *times, cmp_double);
    double med = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
    double mn = times[0];
    double tokens = (double)s->B * (double)s->T;
    double flops = flop_per * tokens * (double)s->H * (double)s->N * (double)s->N;
    double tps = med > 0 ? tokens / med : INFINITY;
    double gflops = med > 0 ? flops / med * 1e-9 : INFINITY;
    double gbps = med > 0 ? bytes / med * 1e-9 : INFINITY;
    if (c->json) {
        printf("{\"op\":\"rwkv7\",\"backend\":\"%s\",\"device\":", backend);
        bench_json_string(stdout, device);
        printf(",\"dtype\":\"%s\",\"B\":%lld,\"T\":%lld,\"H\":%lld,\"N\":%lld,\"threads\":%d,"
               "\"pass\":\"%s\",\"decay\":\"%s\",\"state\":%s,\"repeat\":%d,\"median_ms\":%.6g,"
               "\"min_ms\":%.6g,\"tokens_per_s\":%.6g,\"gflops\":%.6g,\"gbps\":%.6g}\n",
               wkvt_dtype_name(dt), (long long)s->B, (long long)s->T, (long long)s->H,
               (long long)s->N, threads, pass, wkvt_decay_form_name(c->decay),
               c->state ? "true" : "false", n, med * 1e3, mn * 1e3, tps, gflops, gbps);
    } else {
        printf("rwkv7 %-8s %s %-4s B=%lld T=%lld H=%lld N=%lld threads=%d: median %.3f ms "
               "(min %.3f)  %.4g tokens/s  %.3g GFLOP/s  %.3g GB/s\n",
               pass, backend, wkvt_dtype_name(dt), (long long)s->B, (long long)s->T,
               (long long)s->H, (long long)s->N, threads, med * 1e3, mn * 1e3, tps, gflops, gbps);
    }
    fflush(stdout);
}

/* One shape, one dtype, one context. Returns 0, or -1 after printing an error. */
static int perf_one(const perf_cfg* c, wkv_context* ctx, const char* backend,
                    const char* device, int threads, wkv_dtype dt, const perf_shape* s) {
    const size_t n = (size_t)(s->B * s->T * s->H * s->N);
    const size_t sn = (size_t)(s->B * s->H * s->N * s->N);
    const size_t es = wkvt_dtype_size(dt);
    int rc = -1;
    float* f[6] = {0};
    void* in[6] = {0};
    void* g[6] = {0};
    float *st0 = NULL, *st1 = NULL, *dsT = NULL, *ds0 = NULL, *tmp = NULL;
    void *y = NULL, *dy = NULL, *ws = NULL;
    double* times = (double*)malloc((size_t)c->repeat * sizeof *times);
    int ok = times != NULL;
    for (int i = 0; i < 6; i++) {
        f[i] = (float*)malloc(n * sizeof(float));
        in[i] = malloc(n * es);
        if (c->bwd) g[i] = malloc(n * es);
        ok = ok && f[i] && in[i] && (!c->bwd || g[i]);
    }
    y = malloc(n * es);
    dy = malloc(n * es);
    tmp = (float*)malloc(n * sizeof(float));
    st0 = (float*)malloc(sn * sizeof(float));
    st1 = (float*)malloc(sn * sizeof(float));
    dsT = (float*)malloc(sn * sizeof(float));
    ds0 = (float*)malloc(sn * sizeof(float));
    if (!ok || !y || !dy || !tmp || !st0 || !st1 || !dsT || !ds0) {
        fprintf(stderr, "wkv-bench perf: out of memory for B=%lld T=%lld H=%lld N=%lld\n",
                (long long)s->B, (long long)s->T, (long long)s->H, (long long)s->N);
        goto done;
    }
    wkvt_rng rng;
    wkvt_rng_seed(&rng, c->seed);
    wkvt_rwkv7_random(&rng, c->seed + 1, c->decay, s->B, s->T, s->H, s->N, f[0], f[1], f[2],
                      f[3], f[4], f[5]);
    for (int i = 0; i < 6; i++) wkvt_store_f32(f[i], in[i], dt, n);
    for (size_t i = 0; i < n; i++) tmp[i] = (float)wkvt_rng_normal(&rng);
    wkvt_store_f32(tmp, dy, dt, n);
    for (size_t i = 0; i < sn; i++) {
        st0[i] = (float)(0.1 * wkvt_rng_normal(&rng));
        dsT[i] = (float)wkvt_rng_normal(&rng);
    }

    int64_t shape[4] = {s->B, s->T, s->H, s->N};
    int64_t sshape[4] = {s->B, s->H, s->N, s->N};
    wkv_forward_desc fd;
    memset(&fd, 0, sizeof fd);
    fd.struct_size = sizeof fd;
    fd.op = WKV_OP_RWKV7;
    fd.decay_form = c->decay;
    fd.r = wkv_tensor_make(in[0], dt, 4, shape);
    fd.w = wkv_tensor_make(in[1], dt, 4, shape);
    fd.k = wkv_tensor_make(in[2], dt, 4, shape);
    fd.v = wkv_tensor_make(in[3], dt, 4, shape);
    fd.a = wkv_tensor_make(in[4], dt, 4, shape);
    fd.b = wkv_tensor_make(in[5], dt, 4, shape);
    fd.y = wkv_tensor_make(y, dt, 4, shape);
    if (c->state) {
        fd.state_in = wkv_tensor_make(st0, WKV_DTYPE_F32, 4, sshape);
        fd.state_out = wkv_tensor_make(st1, WKV_DTYPE_F32, 4, sshape);
    }
    const double state_bytes = c->state ? (double)sn * 4.0 : 0.0;
    const double tok_bytes = (double)n * (double)es;
    wkv_status st;

    if (c->fwd) {
        for (int i = 0; i < c->warmup + c->repeat; i++) {
            double t0 = wkvt_now();
            st = wkv_forward(ctx, &fd);
            double t1 = wkvt_now();
            if (st != WKV_OK) {
                fprintf(stderr, "wkv-bench perf: wkv_forward (B=%lld T=%lld H=%lld N=%lld %s): %s\n",
                        (long long)s->B, (long long)s->T, (long long)s->H, (long long)s->N,
                        wkvt_dtype_name(dt), wkv_last_error(ctx));
                goto done;
            }
            if (i >= c->warmup) times[i - c->warmup] = t1 - t0;
        }
        perf_report(c, backend, device, dt, s, threads, "forward", times, c->repeat,
                    PERF_FLOP_FWD, 7.0 * tok_bytes + 2.0 * state_bytes);
    }
    if (c->bwd) {
        wkv_backward_desc bd;
        memset(&bd, 0, sizeof bd);
        bd.struct_size = sizeof bd;
        bd.forward = &fd;
        bd.dy = wkv_tensor_make(dy, dt, 4, shape);
        bd.dr = wkv_tensor_make(g[0], dt, 4, shape);
        bd.dw = wkv_tensor_make(g[1], dt, 4, shape);
        bd.dk = wkv_tensor_make(g[2], dt, 4, shape);
        bd.dv = wkv_tensor_make(g[3], dt, 4, shape);
        bd.da = wkv_tensor_make(g[4], dt, 4, shape);
        bd.db = wkv_tensor_make(g[5], dt, 4, shape);
        if (c->state) {
            bd.dstate_out = wkv_tensor_make(dsT, WKV_DTYPE_F32, 4, sshape);
            bd.dstate_in = wkv_tensor_make(ds0, WKV_DTYPE_F32, 4, sshape);
        }
        size_t wsz = 0;
        st = wkv_workspace_size(ctx, &wsz, &bd);
        if (st != WKV_OK) {
            fprintf(stderr, "wkv-bench perf: wkv_workspace_size: %s\n", wkv_last_error(ctx));
            goto done;
        }
        if (wsz && !(ws = malloc(wsz))) {
            fprintf(stderr, "wkv-bench perf: out of memory for a %zu-byte workspace\n", wsz);
            goto done;
        }
        bd.workspace = ws;
        bd.workspace_size = wsz;
        for (int i = 0; i < c->warmup + c->repeat; i++) {
            double t0 = wkvt_now();
            st = wkv_backward(ctx, &bd);
            double t1 = wkvt_now();
            if (st != WKV_OK) {
                fprintf(stderr, "wkv-bench perf: wkv_backward (B=%lld T=%lld H=%lld N=%lld %s): %s\n",
                        (long long)s->B, (long long)s->T, (long long)s->H, (long long)s->N,
                        wkvt_dtype_name(dt), wkv_last_error(ctx));
                goto done;
            }
            if (i >= c->warmup) times[i - c->warmup] = t1 - t0;
        }
        perf_report(c, backend, device, dt, s, threads, "backward", times, c->repeat,
                    PERF_FLOP_BWD, 13.0 * tok_bytes + 3.0 * state_bytes);
    }
    rc = 0;
done:
    for (int i = 0; i < 6; i++) {
        free(f[i]);
        free(in[i]);
        free(g[i]);
    }
    free(y);
    free(dy);
    free(tmp);
    free(st0);
    free(st1);
    free(dsT);
    free(ds0);
    free(ws);
    free(times);
    return rc;
}

int bench_perf(int argc, char** argv) {
    const char* cmd = "perf";
    perf_cfg c;
    memset(&c, 0, sizeof c);
    c.backend = WKV_BACKEND_AUTO;
    c.decay = WKV_DECAY_CLAMPW;
    c.fwd = c.bwd = 1;
    c.repeat = 5;
    c.warmup = 1;
    c.state = 1;
    c.seed = 1;
    int64_t Bs[PERF_MAX_LIST] = {1}, Ts[PERF_MAX_LIST] = {1024}, Hs[PERF_MAX_LIST] = {32},
            Ns[PERF_MAX_LIST] = {64}, thr[PERF_MAX_LIST] = {0};
    int nB = 1, nT = 1, nH = 1, nN = 1, nthr = 1, ndt = 1;
    wkv_dtype dts[PERF_MAX_LIST] = {WKV_DTYPE_F32};
    for (int i = 1; i < argc; i++) {
        const char* v = NULL;
        int m;
        int64_t x;
        if (bench_is_help(argv[i])) {
            perf_usage(stdout);
            return BENCH_OK;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--op", &v))) {
            wkv_op op;
            if (m < 0) return BENCH_USAGE;
            if (wkvt_op_parse(v, &op)) return bench_usage_error(cmd, "--op: unknown op '%s'", v);
            if (op != WKV_OP_RWKV7)
                return bench_usage_error(cmd, "--op: only rwkv7 is timed so far, not '%s'", v);
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--backend", &v))) {
            if (m < 0) return BENCH_USAGE;
            if (wkvt_backend_parse(v, &c.backend))
                return bench_usage_error(cmd, "--backend: '%s' is not auto, cpu, cuda or vulkan", v);
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--device", &v))) {
            if (m < 0 || bench_int(cmd, "--device", v, 0, 1024, &x)) return BENCH_USAGE;
            c.device = (int32_t)x;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--B", &v))) {
            if (m < 0 || (nB = bench_int_list(cmd, "--B", v, 1, 1 << 20, Bs, PERF_MAX_LIST)) < 0)
                return BENCH_USAGE;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--T", &v))) {
            if (m < 0 || (nT = bench_int_list(cmd, "--T", v, 1, 1 << 26, Ts, PERF_MAX_LIST)) < 0)
                return BENCH_USAGE;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--H", &v))) {
            if (m < 0 || (nH = bench_int_list(cmd, "--H", v, 1, 1 << 16, Hs, PERF_MAX_LIST)) < 0)
                return BENCH_USAGE;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--N", &v))) {
            if (m < 0 || (nN = bench_int_list(cmd, "--N", v, 1, 4096, Ns, PERF_MAX_LIST)) < 0)
                return BENCH_USAGE;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--threads", &v))) {
            if (m < 0 ||
                (nthr = bench_int_list(cmd, "--threads", v, 0, 1024, thr, PERF_MAX_LIST)) < 0)
                return BENCH_USAGE;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--dtype", &v))) {
            if (m < 0) return BENCH_USAGE;
            char buf[128];
            snprintf(buf, sizeof buf, "%s", v);
            ndt = 0;
            for (char* tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                if (ndt >= PERF_MAX_LIST || wkvt_dtype_parse(tok, &dts[ndt]))
                    return bench_usage_error(cmd, "--dtype: '%s' is not f32, f16 or bf16", tok);
                ndt++;
            }
            if (!ndt) return bench_usage_error(cmd, "--dtype: no value");
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--decay", &v))) {
            if (m < 0) return BENCH_USAGE;
            if (wkvt_decay_form_parse(v, &c.decay))
                return bench_usage_error(cmd, "--decay: '%s' is not clampw, log, exp_neg_exp or direct", v);
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--pass", &v))) {
            if (m < 0) return BENCH_USAGE;
            if (!strcmp(v, "forward")) c.fwd = 1, c.bwd = 0;
            else if (!strcmp(v, "backward")) c.fwd = 0, c.bwd = 1;
            else if (!strcmp(v, "both")) c.fwd = 1, c.bwd = 1;
            else return bench_usage_error(cmd, "--pass: '%s' is not forward, backward or both", v);
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--repeat", &v))) {
            if (m < 0 || bench_int(cmd, "--repeat", v, 1, 100000, &x)) return BENCH_USAGE;
            c.repeat = (int)x;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--warmup", &v))) {
            if (m < 0 || bench_int(cmd, "--warmup", v, 0, 100000, &x)) return BENCH_USAGE;
            c.warmup = (int)x;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--seed", &v))) {
            if (m < 0 || bench_int(cmd, "--seed", v, 0, INT64_MAX, &x)) return BENCH_USAGE;
            c.seed = (uint64_t)x;
        } else if (!strcmp(argv[i], "--json")) {
            c.json = 1;
        } else if (!strcmp(argv[i], "--no-state")) {
            c.state = 0;
        } else if (argv[i][0] == '-') {
            return bench_usage_error(cmd, "unknown option '%s'", argv[i]);
        } else {
            return bench_usage_error(cmd, "unexpected argument '%s'", argv[i]);
        }
    }
    /* every tensor below 2^31 elements (plenty for a benchmark, and no overflow anywhere) */
    for (int b = 0; b < nB; b++)
        for (int t = 0; t < nT; t++)
            for (int h = 0; h < nH; h++)
                for (int n = 0; n < nN; n++) {
                    double e = (double)Bs[b] * (double)Ts[t] * (double)Hs[h] * (double)Ns[n];
                    double se = (double)Bs[b] * (double)Hs[h] * (double)Ns[n] * (double)Ns[n];
                    if (e > 2147483647.0 || se > 2147483647.0)
                        return bench_usage_error(cmd, "B=%lld T=%lld H=%lld N=%lld is too large",
                                                 (long long)Bs[b], (long long)Ts[t],
                                                 (long long)Hs[h], (long long)Ns[n]);
                }

    int rc = BENCH_OK;
    for (int k = 0; k < nthr; k++) {
        wkv_context_options co;
        memset(&co, 0, sizeof co);
        co.struct_size = sizeof co;
        co.backend = c.backend;
        co.device_index = c.device;
        co.cpu_threads = (int32_t)thr[k];
        wkv_context* ctx = NULL;
        if (wkv_context_create(&co, &ctx) != WKV_OK) {
            fprintf(stderr, "wkv-bench perf: cannot create a context (backend %s): %s\n",
                    wkvt_backend_name(c.backend), wkv_last_error(NULL));
            return BENCH_FAIL;
        }
        wkv_backend be = wkv_context_backend(ctx);
        char device[256];
        bench_device_name(be, c.device, device, sizeof device);
        int threads = be == WKV_BACKEND_CPU ? bench_cpu_threads((int)thr[k]) : 0;
        if (!c.json && k == 0)
            printf("# backend %s, device %s; decay %s; state %s; warmup %d, repeat %d\n",
                   wkvt_backend_name(be), device[0] ? device : "?", wkvt_decay_form_name(c.decay),
                   c.state ? "in+out" : "none", c.warmup, c.repeat);
        for (int d = 0; d < ndt; d++)
            for (int b = 0; b < nB; b++)
                for (int t = 0; t < nT; t++)
                    for (int h = 0; h < nH; h++)
                        for (int n = 0; n < nN; n++) {
                            perf_shape s = {Bs[b], Ts[t], Hs[h], Ns[n]};
                            if (perf_one(&c, ctx, wkvt_backend_name(be), device, threads, dts[d],
                                         &s))
                                rc = BENCH_FAIL;
                        }
        wkv_context_destroy(ctx);
    }
    return rc;
}
