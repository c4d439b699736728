/* Plugging a host job system into libwkv's CPU backend (wkv_context_options.parallel_for).
 *
 * A game engine or an inference server usually owns its worker threads already; libwkv then
 * runs its CPU work on them instead of starting threads of its own. This file is such a host:
 * a tiny job system (a fixed set of worker threads and one queue of "range" jobs; the thread
 * that submits work helps run it and waits for it), the ~15-line parallel_for that adapts it
 * to libwkv, and a check that a RWKV-7 forward run on it equals the built-in pool's results
 * bit for bit (the CPU backend's items never depend on which thread runs them).
 *
 * Run by ctest (wkv_example_job_system); prints "job system: ok" and returns 0 on success. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wkv/wkv.h>

/* ------------------------------------------------------------------ the host's job system */

enum { kWorkers = 3, kQueue = 256 };

typedef struct Job {
    void (*run)(void* arg, int64_t begin, int64_t end);
    void* arg;
    int64_t begin, end;
    int* pending; /* the submitter's count of unfinished jobs */
} Job;

typedef struct JobSystem {
    pthread_mutex_t mutex;
    pthread_cond_t work; /* a job was queued, or stop */
    pthread_cond_t idle; /* a job finished */
    Job queue[kQueue];
    int head, count, stop;
    pthread_t threads[kWorkers];
    int64_t jobs_run_by_workers; /* for the demonstration below */
} JobSystem;

/* Runs one queued job (mutex held on entry and exit). */
static void run_one(JobSystem* js, int by_worker) {
    Job j = js->queue[js->head];
    js->head = (js->head + 1) % kQueue;
    js->count--;
    pthread_mutex_unlock(&js->mutex);
    j.run(j.arg, j.begin, j.end);
    pthread_mutex_lock(&js->mutex);
    if (by_worker) js->jobs_run_by_workers++;
    if (--*j.pending == 0) pthread_cond_broadcast(&js->idle);
}

static void* worker(void* arg) {
    JobSystem* js = (JobSystem*)arg;
    pthread_mutex_lock(&js->mutex);
    for (;;) {
        while (js->count == 0 && !js->stop) pthread_cond_wait(&js->work, &js->mutex);
        if (js->count == 0 && js->stop) break;
        run_one(js, 1);
    }
    pthread_mutex_unlock(&js->mutex);
    return NULL;
}

static int job_system_start(JobSystem* js) {
    memset(js, 0, sizeof *js);
    pthread_mutex_init(&js->mutex, NULL);
    pthread_cond_init(&js->work, NULL);
    pthread_cond_init(&js->idle, NULL);
    for (int i = 0; i < kWorkers; ++i)
        if (pthread_create(&js->threads[i], NULL, worker, js) != 0) return 0;
    return 1;
}

static void job_system_stop(JobSystem* js) {
    pthread_mutex_lock(&js->mutex);
    js->stop = 1;
    pthread_cond_broadcast(&js->work);
    pthread_mutex_unlock(&js->mutex);
    for (int i = 0; i < kWorkers; ++i) pthread_join(js->threads[i], NULL);
    pthread_cond_destroy(&js->idle);
    pthread_cond_destroy(&js->work);
    pthread_mutex_destroy(&js->mutex);
}

/* Splits [0, n) into `parts` jobs, queues them, helps run queued jobs and waits for its own. */
static void job_system_run(JobSystem* js, int64_t n, int64_t parts,
                           void (*run)(void*, int64_t, int64_t), void* arg) {
    if (parts > n) parts = n;
    if (parts > kQueue) parts = kQueue;
    int pending = (int)parts;
    pthread_mutex_lock(&js->mutex);
    for (int64_t p = 0; p < parts; ++p) {
        while (js->count == kQueue) pthread_cond_wait(&js->idle, &js->mutex);
        Job* j = &js->queue[(js->head + js->count) % kQueue];
        j->run = run;
        j->arg = arg;
        j->begin = n * p / parts;
        j->end = n * (p + 1) / parts;
        j->pending = &pending;
        js->count++;
    }
    pthread_cond_broadcast(&js->work);
    while (pending > 0) {
        if (js->count > 0) run_one(js, 0); /* help instead of sleeping */
        else pthread_cond_wait(&js->idle, &js->mutex);
    }
    pthread_mutex_unlock(&js->mutex);
}

/* ------------------------------------------------------------------ the adapter for libwkv */

/* libwkv's parallel_for: run fn over [0, n) on the job system and return when it is done.
 * libwkv passes a few items per thread it was told about (cpu_threads); any split is fine. */
static void host_parallel_for(void* user_data, int64_t n, wkv_task_fn fn, void* task_data) {
    job_system_run((JobSystem*)user_data, n, n, fn, task_data);
}

/* --------------------------------------------------------------------------------- demo */

enum { B = 2, T = 256, H = 8, N = 64, E = B * T * H * N, S = B * H * N * N };

static float frand(uint32_t* s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / 16777216.0f; /* [0, 1) */
}

/* RWKV-7 forward over the inputs with the given context; y and the final state out. */
static int forward(wkv_context* ctx, float* const in[6], float* y, float* state) {
    int64_t shape[4] = {B, T, H, N}, sshape[4] = {B, H, N, N};
    wkv_forward_desc f;
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof f;
    f.op = WKV_OP_RWKV7;
    f.decay_form = WKV_DECAY_CLAMPW;
    wkv_tensor* t[6] = {&f.r, &f.w, &f.k, &f.v, &f.a, &f.b};
    for (int i = 0; i < 6; ++i) *t[i] = wkv_tensor_make(in[i], WKV_DTYPE_F32, 4, shape);
    f.y = wkv_tensor_make(y, WKV_DTYPE_F32, 4, shape);
    f.state_out = wkv_tensor_make(state, WKV_DTYPE_F32, 4, sshape);
    if (wkv_forward(ctx, &f) != WKV_OK) {
        printf("wkv_forward: %s\n", wkv_last_error(ctx));
        return 0;
    }
    return 1;
}

int main(void) {
    float* in[6];
    uint32_t seed = 7;
    for (int i = 0; i < 6; ++i) {
        in[i] = (float*)malloc(sizeof(float) * E);
        if (!in[i]) return 1;
        for (int e = 0; e < E; ++e) in[i][e] = frand(&seed) - 0.5f;
    }
    for (int e = 0; e < E; e += N) { /* a = -kk, b = kk * 0.5 with kk = k / |k| per token-head */
        float norm = 0.0f;
        for (int j = 0; j < N; ++j) norm += in[2][e + j] * in[2][e + j];
        norm = sqrtf(norm) + 1e-6f;
        for (int j = 0; j < N; ++j) {
            in[4][e + j] = -in[2][e + j] / norm;
            in[5][e + j] = 0.5f * in[2][e + j] / norm;
        }
    }
    float *y0 = (float*)malloc(sizeof(float) * E), *y1 = (float*)malloc(sizeof(float) * E);
    float *s0 = (float*)malloc(sizeof(float) * S), *s1 = (float*)malloc(sizeof(float) * S);
    if (!y0 || !y1 || !s0 || !s1) return 1;

    /* the reference: libwkv's own threads */
    wkv_context* own = NULL;
    wkv_context_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.backend = WKV_BACKEND_CPU;
    o.cpu_threads = 2;
    if (wkv_context_create(&o, &own) != WKV_OK) return printf("%s\n", wkv_last_error(NULL)), 1;
    if (!forward(own, in, y0, s0)) return 1;
    wkv_context_destroy(own);

    /* the same forward on the host's job system */
    JobSystem js;
    if (!job_system_start(&js)) return printf("cannot start the job system\n"), 1;
    wkv_context* hosted = NULL;
    o.cpu_threads = kWorkers + 1; /* how many threads run the work: libwkv splits for them */
    o.parallel_for = host_parallel_for;
    o.parallel_for_user_data = &js;
    if (wkv_context_create(&o, &hosted) != WKV_OK) return printf("%s\n", wkv_last_error(NULL)), 1;
    memset(y1, 0xff, sizeof(float) * E); /* NaN: every output must be written */
    memset(s1, 0xff, sizeof(float) * S);
    const int ok_call = forward(hosted, in, y1, s1);
    wkv_context_destroy(hosted);
    job_system_stop(&js);
    if (!ok_call) return 1;

    const int same = memcmp(y0, y1, sizeof(float) * E) == 0 && memcmp(s0, s1, sizeof(float) * S) == 0;
    printf("job system: %s (%lld of the ranges ran on its workers)\n", same ? "ok" : "MISMATCH",
           (long long)js.jobs_run_by_workers);
    for (int i = 0; i < 6; ++i) free(in[i]);
    free(y0);
    free(y1);
    free(s0);
    free(s1);
    return same ? 0 : 1;
}
