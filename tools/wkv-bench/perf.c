/* wkv-bench perf: times wkv_forward / wkv_backward on random, realistic inputs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "wkv_tools.h"

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define PERF_X86 1
#else
#define PERF_X86 0
#endif

/* Nominal flop counts (used for GFLOP/s), counted from each recurrence as wkv.h writes it; a
 * multiply, add, max, divide or exp counts 1, lower-order terms are left out.
 * RWKV-7, per token and head (N = head size):
 *   forward   9 N^2 = sa (2 N^2) + update S*decay + sa*b + v*k (5 N^2) + readout S.r (2 N^2)
 *   backward 28 N^2 = the forward recomputed (9 N^2) + gradients: dS += dy r^T, dr, dk, dv,
 *                     d decay, db, d sa, da (2 N^2 each: 16 N^2), dS <- dS diag(decay) +
 *                     d sa a^T (3 N^2)
 * RWKV-6, per token and head:
 *   forward   5 N^2 = readout S.r (2 N^2) + update S*decay + v*k (3 N^2)   (the bonus
 *                     r.(u*k) and v*ruk are O(N), not counted)
 *   backward 16 N^2 = the forward recomputed (5 N^2) + gradients: dv = dS.k, dk = dS^T v,
 *                     d decay = sum_i dS*S, dr = S^T dy (2 N^2 each: 8 N^2), dS <- dS
 *                     diag(decay) + dy r^T (3 N^2)   (du, dw and the bonus terms are O(N))
 * RWKV-4, per token and channel (C = H * N channels):
 *   forward   23    = output: u + k, max, 2 x (subtract, exp), e1*aa + e2*v, e1*bb + e2,
 *                     divide (12); state update: pp + wd, max, 2 x (subtract, exp),
 *                     A*aa + Bk*v, A*bb + Bk (11)
 *   backward  54    = the forward recomputed (23) + gradients (31): through y gy, gy*e1,
 *                     -gy*e1*y, gy*e1*(aa - y*bb), gy*e2, gy*e2*(v - y) (10); through the
 *                     update dA, dB, dA*A, dq2, gaa*A, gbb*A, the pp and wd shares, gaa*Bk,
 *                     dB*Bk, the routing of dq2 (20); du (1) */
static const struct perf_op {
    wkv_op op;
    const char* name;
    double flop_fwd, flop_bwd; /* per token and head x N^2, or per token and channel (RWKV-4) */
    int ntok_in;               /* per-token inputs (each [B,T,H,N]); as many gradients */
    int npar;                  /* per-layer inputs of H*N elements (u; w and u); as many grads */
} perf_ops[] = {
    {WKV_OP_RWKV7, "rwkv7", 9.0, 28.0, 6, 0},
    {WKV_OP_RWKV6, "rwkv6", 5.0, 16.0, 4, 1},
    {WKV_OP_RWKV4, "rwkv4", 23.0, 54.0, 2, 2},
};
enum { PERF_NOPS = 3 };
typedef struct perf_op perf_op;

enum { PERF_MAX_LIST = 16 };
/* Tokens of the random prefix run that makes the RWKV-6 and RWKV-4 initial states. */
enum { PERF_STATE_PREFIX = 16 };

static void perf_usage(FILE* f) {
    fprintf(f,
            "usage: wkv-bench perf [--op rwkv7|rwkv6|rwkv4|all] [--backend auto|cpu|cuda|vulkan]\n"
            "       (wkv-bench perf --op attention --help: softmax attention's own options)\n"
            "                      [--device I] [--B B] [--T T] [--H H] [--N N]\n"
            "                      [--dtype f32|f16|bf16] [--threads K] [--decay FORM]\n"
            "                      [--pass forward|backward|both] [--repeat R] [--warmup W]\n"
            "                      [--no-state] [--in-place] [--reuse] [--async] [--seed S]\n"
            "                      [--json]\n"
            "\n"
            "Times wkv_forward and/or wkv_backward on random inputs that look like a model's,\n"
            "W warm-up calls, then R timed samples (wall clock, CLOCK_MONOTONIC). On the CPU a\n"
            "sample is one call on host tensors. On a GPU backend every tensor and the workspace\n"
            "live in library buffers (wkv_buffer_*, no staging), and a sample is `batch` calls\n"
            "back to back plus one wkv_context_synchronize, divided by batch (batch sized so a\n"
            "sample takes ~2 ms; reported as \"batch\"). --op, B, T, H, N, --dtype and --threads\n"
            "take comma-separated\n"
            "lists (every combination is measured).\n"
            "\n"
            "  --op OP        rwkv7, rwkv6, rwkv4 or all (every op the backend supports); default\n"
            "                 rwkv7. Inputs, drawn as tests/golden/README.md describes:\n"
            "                   rwkv7  r w k v a b [B,T,H,N]: decays in (0.545, 1), a = -kk,\n"
            "                          b = kk*iclr; state [B,H,N,N] = 0.1 N(0,1)\n"
            "                   rwkv6  r w k v [B,T,H,N], u [H,N]: decays exp(-exp(w_raw)) from\n"
            "                          ~1e-6 to 0.999; state [B,H,N,N] after a %d-token prefix\n"
            "                   rwkv4  k v [B,T,C] with C = H*N, w u [C] (time_decay,\n"
            "                          time_first); state (aa, bb, pp) [B,3,C] after a\n"
            "                          %d-token prefix\n"
            "  --backend B    default auto\n"
            "  --device I     GPU ordinal (default 0)\n"
            "  --B, --T, --H, --N   batch, tokens, heads, head size (default 1, 1024, 32, 64);\n"
            "                 rwkv4 runs C = H*N channels\n"
            "  --dtype D      input/output dtype; the state is always f32 (default f32)\n"
            "  --threads K    CPU threads; 0 = WKV_NUM_THREADS or all cores (default 0)\n"
            "  --decay FORM   clampw|log|exp_neg_exp|direct for rwkv7 and rwkv6 (default clampw\n"
            "                 for rwkv7, exp_neg_exp for rwkv6); rwkv4 is always exp_neg_exp\n"
            "  --pass P       forward, backward or both (default both)\n"
            "  --repeat R     timed calls (default 5); --warmup W  untimed calls first (default 1);\n"
            "                 on a GPU backend a warm-up (W > 0) also lasts at least 1 s of calls, so\n"
            "                 that a GPU idle while the inputs were drawn is back at its clocks\n"
            "  --no-state     no state_in / state_out (start from zero, drop the final state)\n"
            "  --in-place     state_out is state_in's memory (one state stepped in place call after\n"
            "                 call, as a decode loop keeps it); forward only\n"
            "  --async        a context with WKV_CONTEXT_ASYNC (Vulkan: a call on buffers returns\n"
            "                 once submitted; the batch's calls queue back to back and the\n"
            "                 sample's wkv_context_synchronize waits for them; CUDA, CPU: no change);\n"
            "                 the text line adds the host's time per call before the synchronize\n"
            "  --reuse        training with checkpoints saved by the forward: times, interleaved\n"
            "                 in each sample (so that a busy machine slows all alike), the\n"
            "                 forward, the backward, the forward saving its checkpoints into the\n"
            "                 backward's workspace (pass \"fwd+save\") and the backward reusing\n"
            "                 them (WKV_BACKWARD_REUSE_CHECKPOINTS, pass \"bwd-reuse\"), then the\n"
            "                 ratios of the medians (backward / forward); --pass is ignored\n"
            "  --seed S       random seed (default 1)\n"
            "  --json         one JSON object per measurement per line, keys: op backend device\n"
            "                 dtype B T H N threads pass decay state repeat median_ms min_ms\n"
            "                 tokens_per_s gflops gbps, and on the CPU backend peak_gflops\n"
            "                 peak_frac\n"
            "\n"
            "Reported per measurement: median and minimum time per call; tokens/s = B*T / median;\n"
            "on the CPU backend also the share of the machine's float32 FMA peak for the run's\n"
            "threads (measured once: one thread's chains of AVX-512 or AVX2 FMAs, times threads);\n"
            "GFLOP/s from a nominal count of the recurrence as written (a multiply, add, max,\n"
            "divide or exp is 1; lower-order terms left out):\n"
            "  rwkv7  per token and head: forward %.0f*N^2 (sa 2N^2, update 5N^2, readout\n"
            "         2N^2), backward %.0f*N^2 (forward recomputed 9N^2 + gradients 19N^2)\n"
            "  rwkv6  per token and head: forward %.0f*N^2 (readout 2N^2, update 3N^2),\n"
            "         backward %.0f*N^2 (forward recomputed 5N^2 + dv dk dr d-decay 8N^2 +\n"
            "         dS update 3N^2)\n"
            "  rwkv4  per token and channel: forward %.0f (output 12, state update 11), backward\n"
            "         %.0f (forward recomputed 23 + gradients 31)\n"
            "GB/s from the bytes a call must move once (each in its dtype; states f32):\n"
            "  rwkv7  forward reads r w k v a b (+ state_in), writes y (+ state_out); backward\n"
            "         reads r w k v a b dy (+ state_in, d state_out), writes dr dw dk dv da db\n"
            "         (+ d state_in)\n"
            "  rwkv6  forward reads r w k v u (+ state_in), writes y (+ state_out); backward\n"
            "         reads r w k v u dy (+ state_in, d state_out), writes dr dw dk dv du\n"
            "         (+ d state_in)\n"
            "  rwkv4  forward reads k v w u (+ state_in), writes y (+ state_out); backward reads\n"
            "         k v w u dy (+ state_in, d state_out), writes dk dv dw du (+ d state_in)\n"
            "workspace traffic is not counted.\n",
            (int)PERF_STATE_PREFIX, (int)PERF_STATE_PREFIX, perf_ops[0].flop_fwd,
            perf_ops[0].flop_bwd, perf_ops[1].flop_fwd, perf_ops[1].flop_bwd,
            perf_ops[2].flop_fwd, perf_ops[2].flop_bwd);
}

typedef struct perf_shape {
    int64_t B, T, H, N;
} perf_shape;

typedef struct perf_cfg {
    wkv_backend backend;
    int32_t device;
    wkv_decay_form decay;
    int decay_set; /* --decay given */
    int fwd, bwd, repeat, warmup, json, state;
    int reuse; /* --reuse */
    int async;    /* --async: WKV_CONTEXT_ASYNC */
    int in_place; /* --in-place: state_out = state_in */
    uint64_t seed;
} perf_cfg;

/* The host's time per call of the last perf_call's batch, before its synchronize (--async: what
 * a call costs the host when it does not wait); after perf_time, the least over its samples. */
static double perf_enqueue_s;

/* The decay form an op runs with. */
static wkv_decay_form perf_decay(const perf_cfg* c, const perf_op* op) {
    if (op->op == WKV_OP_RWKV4) return WKV_DECAY_EXP_NEG_EXP;
    if (c->decay_set) return c->decay;
    return op->op == WKV_OP_RWKV7 ? WKV_DECAY_CLAMPW : WKV_DECAY_EXP_NEG_EXP;
}

static int cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

/* ---- the machine's float32 FMA peak, measured: one thread, 12 independent chains of vector
 * FMAs (two FMA units of latency 4 need 8) for the widest instruction set this CPU runs of
 * those the CPU backend has (AVX-512, AVX2+FMA); 2 flops per lane per FMA. */
#define PERF_FMA_CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#if PERF_X86
__attribute__((target("avx512f"))) static float perf_fma_avx512(long iters) {
    const __m512 m = _mm512_set1_ps(0.9999999f), a = _mm512_set1_ps(1e-7f);
#define PERF_DECL(i) __m512 x##i = _mm512_set1_ps(1.0f + (float)(i));
    PERF_FMA_CHAINS(PERF_DECL)
#undef PERF_DECL
    for (long it = 0; it < iters; it++) {
#define PERF_STEP(i) x##i = _mm512_fmadd_ps(x##i, m, a);
        PERF_FMA_CHAINS(PERF_STEP)
#undef PERF_STEP
    }
    __m512 sum = _mm512_setzero_ps();
#define PERF_SUM(i) sum = _mm512_add_ps(sum, x##i);
    PERF_FMA_CHAINS(PERF_SUM)
#undef PERF_SUM
    return _mm512_reduce_add_ps(sum);
}
__attribute__((target("avx2,fma"))) static float perf_fma_avx2(long iters) {
    const __m256 m = _mm256_set1_ps(0.9999999f), a = _mm256_set1_ps(1e-7f);
#define PERF_DECL(i) __m256 x##i = _mm256_set1_ps(1.0f + (float)(i));
    PERF_FMA_CHAINS(PERF_DECL)
#undef PERF_DECL
    for (long it = 0; it < iters; it++) {
#define PERF_STEP(i) x##i = _mm256_fmadd_ps(x##i, m, a);
        PERF_FMA_CHAINS(PERF_STEP)
#undef PERF_STEP
    }
    __m256 sum = _mm256_setzero_ps();
#define PERF_SUM(i) sum = _mm256_add_ps(sum, x##i);
    PERF_FMA_CHAINS(PERF_SUM)
#undef PERF_SUM
    float out[8];
    _mm256_storeu_ps(out, sum);
    return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}
#endif

/* GFLOP/s of one thread (0 when unknown) and the instruction set it was measured with; the best
 * of 5 runs of ~10 ms (the machine may be busy). Measured once. */
static double perf_fma_peak(const char** isa) {
    static double peak = -1.0;
    static const char* which = "none";
    if (peak < 0.0) {
        peak = 0.0;
#if PERF_X86
        int lanes = 0;
        float (*fn)(long) = NULL;
        if (__builtin_cpu_supports("avx512f")) {
            fn = perf_fma_avx512, lanes = 16, which = "avx512";
        } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
            fn = perf_fma_avx2, lanes = 8, which = "avx2";
        }
        if (fn) {
            volatile float sink = 0.0f;
            const long iters = 100000;
            for (int r = 0; r < 5; r++) {
                double t0 = wkvt_now();
                sink += fn(iters);
                double t1 = wkvt_now();
                double g = (double)iters * 12.0 * lanes * 2.0 / (t1 - t0) * 1e-9;
                if (t1 > t0 && g > peak) peak = g;
            }
            (void)sink;
        }
#endif
    }
    if (isa) *isa = which;
    return peak;
}

static void perf_report(const perf_cfg* c, const perf_op* op, const char* backend,
                        const char* device, wkv_dtype dt, const perf_shape* s, int threads,
                        const char* pass, double* times, int n, int batch, double flop_per,
                        double bytes) {
    qsort(times, (size_t)n, sizeof *times, cmp_double);
    double med = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
    double mn = times[0];
    double tokens = (double)s->B * (double)s->T;
    /* per token: H heads of N^2, or (RWKV-4) C = H*N channels */
    double per_token = (double)s->H * (double)s->N * (op->op == WKV_OP_RWKV4 ? 1.0 : (double)s->N);
    double flops = flop_per * tokens * per_token;
    double tps = med > 0 ? tokens / med : INFINITY;
    double gflops = med > 0 ? flops / med * 1e-9 : INFINITY;
    double gbps = med > 0 ? bytes / med * 1e-9 : INFINITY;
    /* the CPU backend: the share of the measured FMA peak of `threads` threads */
    double peak = !strcmp(backend, "cpu") && threads > 0 ? perf_fma_peak(NULL) * threads : 0.0;
    bench_progress_clear();
    if (c->json) {
        printf("{\"op\":\"%s\",\"backend\":\"%s\",\"device\":", op->name, backend);
        bench_json_string(stdout, device);
        printf(",\"dtype\":\"%s\",\"B\":%lld,\"T\":%lld,\"H\":%lld,\"N\":%lld,\"threads\":%d,"
               "\"pass\":\"%s\",\"decay\":\"%s\",\"state\":%s,\"in_place\":%s,\"repeat\":%d,"
               "\"batch\":%d,\"median_ms\":%.6g,"
               "\"min_ms\":%.6g,\"tokens_per_s\":%.6g,\"gflops\":%.6g,\"gbps\":%.6g,\"async\":%s",
               wkvt_dtype_name(dt), (long long)s->B, (long long)s->T, (long long)s->H,
               (long long)s->N, threads, pass, wkvt_decay_form_name(perf_decay(c, op)),
               c->state ? "true" : "false", c->in_place ? "true" : "false", n, batch, med * 1e3,
               mn * 1e3, tps, gflops, gbps, c->async ? "true" : "false");
        if (peak > 0) printf(",\"peak_gflops\":%.6g,\"peak_frac\":%.4g", peak, gflops / peak);
        printf("}\n");
    } else {
        char shape[96];
        if (op->op == WKV_OP_RWKV4)
            snprintf(shape, sizeof shape, "B=%lld T=%lld H=%lld N=%lld (C=%lld)", (long long)s->B,
                     (long long)s->T, (long long)s->H, (long long)s->N,
                     (long long)(s->H * s->N));
        else
            snprintf(shape, sizeof shape, "B=%lld T=%lld H=%lld N=%lld", (long long)s->B,
                     (long long)s->T, (long long)s->H, (long long)s->N);
        printf("%s %-8s %s%s %-4s %s threads=%d: median %.3f ms (min %.3f)  %.4g tokens/s  "
               "%.3g GFLOP/s",
               op->name, pass, backend, c->async ? " async" : "", wkvt_dtype_name(dt), shape, threads, med * 1e3, mn * 1e3,
               tps, gflops);
        if (peak > 0) printf(" (%.0f%% of peak)", 100.0 * gflops / peak);
        printf("  %.3g GB/s", gbps);
        if (c->async) printf("  host %.2f us/call before the synchronize (min)", perf_enqueue_s * 1e6);
        printf("\n");
    }
    fflush(stdout);
}

/* Host tensors are 64-byte aligned, as a tensor framework's are (PyTorch's CPU allocator,
 * ggml's buffers): with malloc's 16-byte alignment every 64-byte vector access to a row would
 * straddle two cache lines, and the CPU numbers would measure that (backends/cpu/NOTES.md,
 * step 13). */
static void* perf_alloc(size_t bytes) {
    const size_t rounded = (bytes + 63) / 64 * 64;
#if defined(_WIN32)
    return _aligned_malloc(rounded ? rounded : 64, 64);
#else
    void* p = NULL;
    return posix_memalign(&p, 64, rounded ? rounded : 64) == 0 ? p : NULL;
#endif
}

static void perf_free(void* p) {
#if defined(_WIN32)
    _aligned_free(p);
#else
    free(p);
#endif
}

/* On a GPU backend the timed tensors live in library buffers (bench.h: bench_resident). */
int bench_make_resident(wkv_context* ctx, bench_resident* r, wkv_tensor* t, const char* name) {
    if (!t->data) return 0;
    uint64_t bytes = t->dtype.bits / 8u;
    for (int d = 0; d < t->ndim; d++) bytes *= (uint64_t)t->shape[d];
    wkv_buffer* b = NULL;
    if (r->n == BENCH_MAX_BUFFERS || wkv_buffer_create(ctx, bytes, &b) != WKV_OK ||
        (r->buf[r->n++] = b, wkv_buffer_upload(ctx, b, 0, t->data, bytes) != WKV_OK)) {
        bench_error("wkv-bench perf: cannot put %s on the device: %s\n", name, wkv_last_error(ctx));
        return -1;
    }
    *t = wkv_tensor_make_buffer(b, 0, t->dtype, t->ndim, t->shape);
    return 0;
}

void bench_release(bench_resident* r) {
    for (int i = 0; i < r->n; i++) wkv_buffer_destroy(r->buf[i]);
    r->n = 0;
}

/* Times one call of fwd or bwd: on a GPU backend, `batch` back-to-back calls and one
 * wkv_context_synchronize, divided by batch (device throughput, launch overhead hidden as it
 * is in a real loop); on the CPU, one call. Returns the status. */
static wkv_status perf_call(wkv_context* ctx, const wkv_forward_desc* fd, const wkv_backward_desc* bd,
                            int device, int batch, double* seconds) {
    wkv_status st = WKV_OK;
    double t0 = wkvt_now();
    for (int j = 0; j < batch && st == WKV_OK; j++) st = bd ? wkv_backward(ctx, bd) : wkv_forward(ctx, fd);
    perf_enqueue_s = (wkvt_now() - t0) / batch;
    if (st == WKV_OK && device) st = wkv_context_synchronize(ctx);
    *seconds = (wkvt_now() - t0) / batch;
    return st;
}

/* On a GPU backend every warm-up lasts at least this long (seconds of back-to-back calls):
 * drawing a large shape's inputs takes the host seconds, during which the GPU idles, and a GPU
 * under dynamic clocks (NVIDIA's under Vulkan: a CUDA context holds its clocks, a Vulkan
 * device does not) drops to idle clocks and comes back only under sustained load. One warm-up
 * call was not enough: on the H100 the Vulkan forward at B=8 T=4096 then ran 5.5x slower
 * (11.8 ms against 2.14 ms), the ratio of idle to boost clocks (backends/vulkan/DESIGN.md, "Measuring"). */
static const double perf_device_warm_s = 1.0;

/* Calls fd / bd until perf_device_warm_s has passed (GPU backends). */
static wkv_status perf_warm_device(wkv_context* ctx, const wkv_forward_desc* fd, const wkv_backward_desc* bd) {
    const double t0 = wkvt_now();
    double t = 0;
    wkv_status st = WKV_OK;
    while (st == WKV_OK && wkvt_now() - t0 < perf_device_warm_s) st = perf_call(ctx, fd, bd, 1, 1, &t);
    return st;
}

/* Warm-up, then `repeat` timed samples. On a GPU backend the batch is sized so a sample takes
 * about 2 ms. Returns the status; *batch_out says what was used. */
static wkv_status perf_time(const perf_cfg* c, wkv_context* ctx, const wkv_forward_desc* fd,
                            const wkv_backward_desc* bd, int device, double* times, int* batch_out) {
    double t = 0;
    wkv_status st = WKV_OK;
    for (int i = 0; i < c->warmup && st == WKV_OK; i++) st = perf_call(ctx, fd, bd, device, 1, &t);
    if (st == WKV_OK && device && c->warmup > 0) st = perf_warm_device(ctx, fd, bd);
    if (st == WKV_OK && device) st = perf_call(ctx, fd, bd, device, 1, &t);
    int batch = 1;
    if (device && t > 0 && t < 2e-3) batch = (int)(2e-3 / t) < 1000 ? (int)(2e-3 / t) : 1000;
    double enq_min = INFINITY;
    for (int i = 0; i < c->repeat && st == WKV_OK; i++) {
        st = perf_call(ctx, fd, bd, device, batch, &times[i]);
        if (perf_enqueue_s < enq_min) enq_min = perf_enqueue_s;
    }
    perf_enqueue_s = enq_min; /* reported with --async */
    *batch_out = batch;
    return st;
}

/* --reuse: the four calls of a training step, each timed once per sample, in the same
 * sample (A/B interleaved): plain forward, plain backward, forward saving its checkpoints, and
 * backward reusing them. times holds 4 * repeat slots. Returns the status. */
static wkv_status perf_time_reuse(const perf_cfg* c, wkv_context* ctx, const wkv_forward_desc* fd,
                                  const wkv_backward_desc* bd, int device, double* times) {
    wkv_forward_desc fs = *fd;
    fs.workspace = bd->workspace;
    fs.workspace_size = bd->workspace_size;
    wkv_backward_desc br = *bd;
    br.forward = &fs;
    br.flags = WKV_BACKWARD_REUSE_CHECKPOINTS;
    wkv_status st = WKV_OK;
    if (device && c->warmup > 0) st = perf_warm_device(ctx, fd, bd);
    for (int i = 0; i < c->warmup + c->repeat && st == WKV_OK; i++) {
        const int k = i - c->warmup; /* < 0: warm-up */
        double dt[4] = {0, 0, 0, 0};
        st = perf_call(ctx, fd, NULL, device, 1, &dt[0]);
        if (st == WKV_OK) st = perf_call(ctx, fd, bd, device, 1, &dt[1]);
        if (st == WKV_OK) st = perf_call(ctx, &fs, NULL, device, 1, &dt[2]);
        if (st == WKV_OK) st = perf_call(ctx, &fs, &br, device, 1, &dt[3]);
        for (int j = 0; j < 4 && k >= 0; j++) times[j * c->repeat + k] = dt[j];
    }
    return st;
}

static double perf_median(double* x, int n) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* One op, one shape, one dtype, one context. Returns 0, or -1 after printing an error. */
static int perf_one(const perf_cfg* c, wkv_context* ctx, const char* backend,
                    const char* device, int threads, const perf_op* op, wkv_dtype dt,
                    const perf_shape* s) {
    const int r4 = op->op == WKV_OP_RWKV4, r6 = op->op == WKV_OP_RWKV6;
    const int64_t C = s->H * s->N; /* RWKV-4 channels */
    const size_t n = (size_t)(s->B * s->T * s->H * s->N);
    const size_t np = (size_t)(s->H * s->N); /* u [H,N]; RWKV-4 w, u [C] */
    const size_t sn = r4 ? (size_t)(s->B * 3 * C) : (size_t)(s->B * s->H * s->N * s->N);
    const size_t es = wkvt_dtype_size(dt);
    const wkv_decay_form decay = perf_decay(c, op);
    int rc = -1;
    float* f[6] = {0};  /* per-token inputs, float32 */
    void* in[6] = {0};  /* ... in dt */
    void* g[6] = {0};   /* their gradients */
    float* fp[2] = {0}; /* per-layer inputs (RWKV-6 u; RWKV-4 w, u) */
    void* inp[2] = {0};
    void* gp[2] = {0};
    float *st0 = NULL, *st1 = NULL, *dsT = NULL, *ds0 = NULL, *tmp = NULL;
    void *y = NULL, *dy = NULL, *ws = NULL;
    double* times = (double*)malloc((size_t)c->repeat * 4 * sizeof *times); /* 4: --reuse */
    bench_resident res;
    res.n = 0;
    int ok = times != NULL;
    for (int i = 0; i < op->ntok_in; i++) {
        f[i] = (float*)malloc(n * sizeof(float));
        in[i] = perf_alloc(n * es);
        if (c->bwd) g[i] = perf_alloc(n * es);
        ok = ok && f[i] && in[i] && (!c->bwd || g[i]);
    }
    for (int i = 0; i < op->npar; i++) {
        fp[i] = (float*)malloc(np * sizeof(float));
        inp[i] = perf_alloc(np * es);
        if (c->bwd) gp[i] = perf_alloc(np * es);
        ok = ok && fp[i] && inp[i] && (!c->bwd || gp[i]);
    }
    y = perf_alloc(n * es);
    dy = perf_alloc(n * es);
    tmp = (float*)malloc(n * sizeof(float));
    st0 = (float*)perf_alloc(sn * sizeof(float));
    st1 = (float*)perf_alloc(sn * sizeof(float));
    dsT = (float*)perf_alloc(sn * sizeof(float));
    ds0 = (float*)perf_alloc(sn * sizeof(float));
    if (!ok || !y || !dy || !tmp || !st0 || !st1 || !dsT || !ds0) {
        bench_error("wkv-bench perf: out of memory for %s B=%lld T=%lld H=%lld N=%lld\n",
                op->name, (long long)s->B, (long long)s->T, (long long)s->H, (long long)s->N);
        goto done;
    }
    wkvt_rng rng;
    wkvt_rng_seed(&rng, c->seed);
    if (r4)
        wkvt_rwkv4_random(&rng, c->seed + 1, s->B, s->T, C, fp[0], fp[1], f[0], f[1]);
    else if (r6)
        wkvt_rwkv6_random(&rng, c->seed + 1, decay, s->B, s->T, s->H, s->N, f[0], f[1], f[2],
                          f[3], fp[0]);
    else
        wkvt_rwkv7_random(&rng, c->seed + 1, decay, s->B, s->T, s->H, s->N, f[0], f[1], f[2],
                          f[3], f[4], f[5]);
    for (int i = 0; i < op->ntok_in; i++) wkvt_store_f32(f[i], in[i], dt, n);
    for (int i = 0; i < op->npar; i++) wkvt_store_f32(fp[i], inp[i], dt, np);
    for (size_t i = 0; i < n; i++) tmp[i] = (float)wkvt_rng_normal(&rng);
    wkvt_store_f32(tmp, dy, dt, n);
    if (r4 || r6) {
        for (size_t i = 0; i < sn; i++) dsT[i] = (float)wkvt_rng_normal(&rng);
        /* the state after a short run, computed from the inputs as the model will see them */
        wkvt_round_f32(fp[0], dt, np);
        if (r4) wkvt_round_f32(fp[1], dt, np);
        if (c->state &&
            (r4 ? wkvt_rwkv4_prefix_state(&rng, s->B, C, fp[0], fp[1], PERF_STATE_PREFIX, st0)
                 : wkvt_rwkv6_prefix_state(&rng, c->seed + 1, decay, s->B, s->H, s->N, fp[0],
                                           PERF_STATE_PREFIX, st0))) {
            bench_error("wkv-bench perf: out of memory for the %s initial state\n", op->name);
            goto done;
        }
    } else {
        for (size_t i = 0; i < sn; i++) {
            st0[i] = (float)(0.1 * wkvt_rng_normal(&rng));
            dsT[i] = (float)wkvt_rng_normal(&rng);
        }
    }

    int64_t shape[4] = {s->B, s->T, s->H, s->N}, shape3[3] = {s->B, s->T, C};
    int64_t sshape[4] = {s->B, s->H, s->N, s->N}, sshape4[3] = {s->B, 3, C};
    int64_t ushape[2] = {s->H, s->N}, cshape[1] = {C};
    const int64_t* tshape = r4 ? shape3 : shape; /* per-token tensors */
    const int tdim = r4 ? 3 : 4;
    wkv_forward_desc fd;
    memset(&fd, 0, sizeof fd);
    fd.struct_size = sizeof fd;
    fd.op = op->op;
    fd.decay_form = decay;
    if (r4) {
        fd.w = wkv_tensor_make(inp[0], dt, 1, cshape);
        fd.u = wkv_tensor_make(inp[1], dt, 1, cshape);
        fd.k = wkv_tensor_make(in[0], dt, 3, shape3);
        fd.v = wkv_tensor_make(in[1], dt, 3, shape3);
    } else {
        fd.r = wkv_tensor_make(in[0], dt, 4, shape);
        fd.w = wkv_tensor_make(in[1], dt, 4, shape);
        fd.k = wkv_tensor_make(in[2], dt, 4, shape);
        fd.v = wkv_tensor_make(in[3], dt, 4, shape);
        if (r6) {
            fd.u = wkv_tensor_make(inp[0], dt, 2, ushape);
        } else {
            fd.a = wkv_tensor_make(in[4], dt, 4, shape);
            fd.b = wkv_tensor_make(in[5], dt, 4, shape);
        }
    }
    fd.y = wkv_tensor_make(y, dt, tdim, tshape);
    if (c->state) {
        fd.state_in = r4 ? wkv_tensor_make(st0, WKV_DTYPE_F32, 3, sshape4)
                         : wkv_tensor_make(st0, WKV_DTYPE_F32, 4, sshape);
        fd.state_out = fd.state_in;
        fd.state_out.data = c->in_place ? st0 : st1;
    }
    const double state_bytes = c->state ? (double)sn * 4.0 : 0.0;
    const double tok_bytes = (double)n * (double)es;
    const double par_bytes = (double)np * (double)es;
    /* per-token tensors a call reads or writes once (see --help) */
    const double fwd_tok = (double)op->ntok_in + 1.0, bwd_tok = 2.0 * (double)op->ntok_in + 1.0;
    wkv_status st;
    const int on_device = wkv_context_backend(ctx) != WKV_BACKEND_CPU;
    int batch = 1;
    if (on_device) {
        wkv_tensor* fwd_tensors[] = {&fd.r, &fd.w, &fd.k, &fd.v, &fd.a, &fd.b, &fd.u, &fd.y,
                                     &fd.state_in, &fd.state_out};
        for (size_t i = 0; i < sizeof fwd_tensors / sizeof fwd_tensors[0]; i++)
            if ((!c->in_place || fwd_tensors[i] != &fd.state_out) &&
                bench_make_resident(ctx, &res, fwd_tensors[i], "the forward tensors"))
                goto done;
        if (c->in_place) fd.state_out = fd.state_in; /* the same device buffer */
    }

    if (c->fwd && !c->reuse) {
        st = perf_time(c, ctx, &fd, NULL, on_device, times, &batch);
        if (st != WKV_OK) {
            bench_error("wkv-bench perf: wkv_forward (%s B=%lld T=%lld H=%lld N=%lld %s): %s\n",
                    op->name, (long long)s->B, (long long)s->T, (long long)s->H, (long long)s->N,
                    wkvt_dtype_name(dt), wkv_last_error(ctx));
            goto done;
        }
        perf_report(c, op, backend, device, dt, s, threads, "forward", times, c->repeat, batch,
                    op->flop_fwd,
                    fwd_tok * tok_bytes + op->npar * par_bytes + 2.0 * state_bytes);
    }
    if (c->bwd || c->reuse) {
        wkv_backward_desc bd;
        memset(&bd, 0, sizeof bd);
        bd.struct_size = sizeof bd;
        bd.forward = &fd;
        bd.dy = wkv_tensor_make(dy, dt, tdim, tshape);
        if (r4) {
            bd.dw = wkv_tensor_make(gp[0], dt, 1, cshape);
            bd.du = wkv_tensor_make(gp[1], dt, 1, cshape);
            bd.dk = wkv_tensor_make(g[0], dt, 3, shape3);
            bd.dv = wkv_tensor_make(g[1], dt, 3, shape3);
        } else {
            bd.dr = wkv_tensor_make(g[0], dt, 4, shape);
            bd.dw = wkv_tensor_make(g[1], dt, 4, shape);
            bd.dk = wkv_tensor_make(g[2], dt, 4, shape);
            bd.dv = wkv_tensor_make(g[3], dt, 4, shape);
            if (r6) {
                bd.du = wkv_tensor_make(gp[0], dt, 2, ushape);
            } else {
                bd.da = wkv_tensor_make(g[4], dt, 4, shape);
                bd.db = wkv_tensor_make(g[5], dt, 4, shape);
            }
        }
        if (c->state) {
            bd.dstate_out = r4 ? wkv_tensor_make(dsT, WKV_DTYPE_F32, 3, sshape4)
                               : wkv_tensor_make(dsT, WKV_DTYPE_F32, 4, sshape);
            bd.dstate_in = bd.dstate_out;
            bd.dstate_in.data = ds0;
        }
        if (on_device) {
            wkv_tensor* bwd_tensors[] = {&bd.dy, &bd.dstate_out, &bd.dr, &bd.dw, &bd.dk, &bd.dv,
                                         &bd.da, &bd.db, &bd.du, &bd.dstate_in};
            for (size_t i = 0; i < sizeof bwd_tensors / sizeof bwd_tensors[0]; i++)
                if (bench_make_resident(ctx, &res, bwd_tensors[i], "the backward tensors")) goto done;
        }
        size_t wsz = 0;
        st = wkv_workspace_size(ctx, &wsz, &bd);
        if (st != WKV_OK) {
            bench_error("wkv-bench perf: wkv_workspace_size (%s): %s\n", op->name,
                    wkv_last_error(ctx));
            goto done;
        }
        if (on_device && wsz) {
            wkv_buffer* wb = NULL;
            if (res.n == BENCH_MAX_BUFFERS || wkv_buffer_create(ctx, wsz, &wb) != WKV_OK) {
                bench_error("wkv-bench perf: no %zu-byte device workspace: %s\n", wsz,
                        wkv_last_error(ctx));
                goto done;
            }
            res.buf[res.n++] = wb;
            bd.workspace = wb; /* a buffer of the context serves as the workspace */
        } else if (wsz && !(bd.workspace = ws = perf_alloc(wsz))) {
            bench_error("wkv-bench perf: out of memory for a %zu-byte workspace\n", wsz);
            goto done;
        }
        bd.workspace_size = wsz;
        if (c->reuse) {
            st = perf_time_reuse(c, ctx, &fd, &bd, on_device, times);
            if (st != WKV_OK) {
                bench_error("wkv-bench perf: --reuse (%s B=%lld T=%lld H=%lld N=%lld %s): %s\n",
                        op->name, (long long)s->B, (long long)s->T, (long long)s->H,
                        (long long)s->N, wkvt_dtype_name(dt), wkv_last_error(ctx));
                goto done;
            }
            static const char* passes[4] = {"forward", "backward", "fwd+save", "bwd-reuse"};
            double med[4];
            for (int j = 0; j < 4; j++) {
                double* x = times + j * c->repeat;
                const int bwd_pass = j % 2;
                perf_report(c, op, backend, device, dt, s, threads, passes[j], x, c->repeat, 1,
                            bwd_pass ? op->flop_bwd : op->flop_fwd,
                            bwd_pass ? bwd_tok * tok_bytes + 2.0 * op->npar * par_bytes + 3.0 * state_bytes
                                     : fwd_tok * tok_bytes + op->npar * par_bytes + 2.0 * state_bytes);
                med[j] = perf_median(x, c->repeat);
            }
            if (!c->json)
                printf("%s ratios threads=%d: backward/forward %.2f, bwd-reuse/forward %.2f, "
                       "bwd-reuse/fwd+save %.2f, fwd+save/forward %.2f, step (fwd+save + bwd-reuse)/"
                       "(forward + backward) %.2f\n",
                       op->name, threads, med[1] / med[0], med[3] / med[0], med[3] / med[2],
                       med[2] / med[0], (med[2] + med[3]) / (med[0] + med[1]));
            rc = 0;
            goto done;
        }
        st = perf_time(c, ctx, &fd, &bd, on_device, times, &batch);
        if (st != WKV_OK) {
            bench_error("wkv-bench perf: wkv_backward (%s B=%lld T=%lld H=%lld N=%lld %s): %s\n",
                    op->name, (long long)s->B, (long long)s->T, (long long)s->H, (long long)s->N,
                    wkvt_dtype_name(dt), wkv_last_error(ctx));
            goto done;
        }
        perf_report(c, op, backend, device, dt, s, threads, "backward", times, c->repeat, batch,
                    op->flop_bwd,
                    bwd_tok * tok_bytes + 2.0 * op->npar * par_bytes + 3.0 * state_bytes);
    }
    rc = 0;
done:
    for (int i = 0; i < 6; i++) {
        free(f[i]);
        perf_free(in[i]);
        perf_free(g[i]);
    }
    for (int i = 0; i < 2; i++) {
        free(fp[i]);
        perf_free(inp[i]);
        perf_free(gp[i]);
    }
    perf_free(y);
    perf_free(dy);
    free(tmp);
    perf_free(st0);
    perf_free(st1);
    perf_free(dsT);
    perf_free(ds0);
    perf_free(ws);
    free(times);
    bench_release(&res);
    return rc;
}

/* Parses --op's value (a comma-separated list, or all) into ops[]; returns the count, or -1
 * after printing the error. */
static int perf_parse_ops(const char* cmd, const char* v, const perf_op** ops) {
    char buf[128];
    int n = 0;
    if (strlen(v) >= sizeof buf) {
        bench_usage_error(cmd, "--op: list too long");
        return -1;
    }
    snprintf(buf, sizeof buf, "%s", v);
    for (char* tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (!strcmp(tok, "all")) {
            for (int k = 0; k < PERF_NOPS; k++) ops[k] = &perf_ops[k];
            n = PERF_NOPS;
            continue;
        }
        wkv_op op;
        if (wkvt_op_parse(tok, &op)) {
            bench_usage_error(cmd, "--op: '%s' is not rwkv7, rwkv6, rwkv4 or all", tok);
            return -1;
        }
        int seen = 0;
        for (int k = 0; k < n; k++) seen |= ops[k]->op == op;
        for (int k = 0; k < PERF_NOPS && !seen; k++)
            if (perf_ops[k].op == op) ops[n++] = &perf_ops[k];
    }
    if (n == 0) {
        bench_usage_error(cmd, "--op: no value");
        return -1;
    }
    return n;
}

int bench_perf(int argc, char** argv) {
    const char* cmd = "perf";
    for (int i = 1; i < argc; i++) /* attention has its own options (perf_attention.c) */
        if ((!strcmp(argv[i], "--op") && i + 1 < argc && !strcmp(argv[i + 1], "attention")) ||
            !strcmp(argv[i], "--op=attention"))
            return bench_perf_attention(argc, argv);
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
    int nB = 1, nT = 1, nH = 1, nN = 1, nthr = 1, ndt = 1, nops = 1, all_ops = 0;
    const perf_op* ops[PERF_NOPS] = {&perf_ops[0]};
    wkv_dtype dts[PERF_MAX_LIST] = {WKV_DTYPE_F32};
    for (int i = 1; i < argc; i++) {
        const char* v = NULL;
        int m;
        int64_t x;
        if (bench_is_help(argv[i])) {
            perf_usage(stdout);
            return BENCH_OK;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--op", &v))) {
            if (m < 0 || (nops = perf_parse_ops(cmd, v, ops)) < 0) return BENCH_USAGE;
            all_ops = strstr(v, "all") != NULL;
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
            c.decay_set = 1;
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
        } else if (!strcmp(argv[i], "--reuse")) {
            c.reuse = 1;
        } else if (!strcmp(argv[i], "--async")) {
            c.async = 1;
        } else if (!strcmp(argv[i], "--in-place")) {
            c.in_place = 1;
        } else if (argv[i][0] == '-') {
            return bench_usage_error(cmd, "unknown option '%s'", argv[i]);
        } else {
            return bench_usage_error(cmd, "unexpected argument '%s'", argv[i]);
        }
    }
    if (c.in_place && (c.bwd || c.reuse))
        return bench_usage_error(cmd, "--in-place times the forward only: give --pass forward "
                                      "(and no --reuse)");
    if (c.in_place && !c.state)
        return bench_usage_error(cmd, "--in-place steps the state in place: not with --no-state");
    if (c.reuse) c.bwd = 1; /* the backward's tensors are needed */
    if (nops == 1 && ops[0]->op == WKV_OP_RWKV4 && c.decay_set &&
        c.decay != WKV_DECAY_EXP_NEG_EXP)
        return bench_usage_error(cmd, "--decay: rwkv4 takes only exp_neg_exp, not '%s'",
                                 wkvt_decay_form_name(c.decay));
    int matrix_state = 0; /* an op with an N x N state per head */
    for (int o = 0; o < nops; o++) matrix_state |= ops[o]->op != WKV_OP_RWKV4;
    /* every tensor below 2^31 elements (plenty for a benchmark, and no overflow anywhere) */
    for (int b = 0; b < nB; b++)
        for (int t = 0; t < nT; t++)
            for (int h = 0; h < nH; h++)
                for (int n = 0; n < nN; n++) {
                    double e = (double)Bs[b] * (double)Ts[t] * (double)Hs[h] * (double)Ns[n];
                    double se = matrix_state ? (double)Bs[b] * (double)Hs[h] * (double)Ns[n] *
                                                   (double)Ns[n]
                                             : 3.0 * (double)Bs[b] * (double)Hs[h] * (double)Ns[n];
                    if (e > 2147483647.0 || se > 2147483647.0)
                        return bench_usage_error(cmd, "B=%lld T=%lld H=%lld N=%lld is too large",
                                                 (long long)Bs[b], (long long)Ts[t],
                                                 (long long)Hs[h], (long long)Ns[n]);
                }

    int rc = BENCH_OK;
    const int ncases = nthr * nops * ndt * nB * nT * nH * nN;
    int icase = 0;
    for (int k = 0; k < nthr; k++) {
        wkv_context_options co;
        memset(&co, 0, sizeof co);
        co.struct_size = sizeof co;
        co.backend = c.backend;
        co.device_index = c.device;
        co.cpu_threads = (int32_t)thr[k];
        co.flags = c.async ? WKV_CONTEXT_ASYNC : 0;
        wkv_context* ctx = NULL;
        if (wkv_context_create(&co, &ctx) != WKV_OK) {
            bench_error("wkv-bench perf: cannot create a context (backend %s): %s\n",
                    wkvt_backend_name(c.backend), wkv_last_error(NULL));
            return BENCH_FAIL;
        }
        wkv_backend be = wkv_context_backend(ctx);
        char device[256];
        bench_device_name(be, c.device, device, sizeof device);
        int threads = be == WKV_BACKEND_CPU ? bench_cpu_threads((int)thr[k]) : 0;
        wkv_backend_info info;
        memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        const uint32_t supported = wkv_backend_get_info(be, &info) == WKV_OK ? info.ops : ~0u;
        if (!c.json && k == 0) {
            printf("# backend %s, device %s; decay", wkvt_backend_name(be),
                   device[0] ? device : "?");
            for (int o = 0; o < nops; o++)
                printf("%s %s %s", o ? "," : "", ops[o]->name,
                       wkvt_decay_form_name(perf_decay(&c, ops[o])));
            printf("; state %s; warmup %d, repeat %d\n",
                   !c.state ? "none" : c.in_place ? "in place" : "in+out", c.warmup, c.repeat);
            if (be == WKV_BACKEND_CPU) {
                const char* isa;
                const double peak = perf_fma_peak(&isa);
                printf("# cpu: %s; measured FMA peak %.4g GFLOP/s per thread (%s)\n",
                       info.reason ? info.reason : "?", peak, isa);
            }
        }
        for (int o = 0; o < nops; o++) {
            if (!(supported & (1u << ops[o]->op))) {
                icase += ndt * nB * nT * nH * nN;
                /* --op all: every op the backend supports; a named one it lacks is an error */
                bench_error("wkv-bench perf: backend %s does not implement %s%s\n",
                        wkvt_backend_name(be), ops[o]->name, all_ops ? "; skipped" : "");
                if (!all_ops) rc = BENCH_FAIL;
                continue;
            }
            for (int d = 0; d < ndt; d++)
                for (int b = 0; b < nB; b++)
                    for (int t = 0; t < nT; t++)
                        for (int h = 0; h < nH; h++)
                            for (int n = 0; n < nN; n++) {
                                perf_shape s = {Bs[b], Ts[t], Hs[h], Ns[n]};
                                bench_progress(++icase, ncases,
                                               "%s %s B=%lld T=%lld H=%lld N=%lld threads=%d",
                                               ops[o]->name, wkvt_dtype_name(dts[d]),
                                               (long long)s.B, (long long)s.T, (long long)s.H,
                                               (long long)s.N, threads);
                                if (perf_one(&c, ctx, wkvt_backend_name(be), device, threads,
                                             ops[o], dts[d], &s))
                                    rc = BENCH_FAIL;
                            }
        }
        wkv_context_destroy(ctx);
    }
    bench_progress_clear();
    return rc;
}
