#include "thread_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define WKV_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define WKV_CPU_RELAX() __asm__ __volatile__("yield")
#else
#define WKV_CPU_RELAX() ((void)0)
#endif

/* How a job runs (see thread_pool.h for the contract):
 *
 * - The slots of a job are split into one contiguous home range per thread (the caller is
 *   thread 0). Each range has a 64-bit claim word (generation << 32 | next slot); a thread takes
 *   slots by compare-and-swap on its own range's word first, then on the others' (stealing).
 *   So with every thread running, thread k runs the same slots call after call — for a decode
 *   loop, the same heads, whose states then stay in that core's cache instead of moving between
 *   cores each call (NOTES.md, step 15) — and a thread that is late loses nothing: its range is
 *   taken by the others.
 * - The caller announces a job by storing its fields, opening every range word, then storing
 *   the generation in `job`. A worker that wakes after the job's slots are all taken, or after
 *   the job is over (a range word's generation has moved on), takes nothing and touches nothing
 *   of the caller's. Before it rewrites the fields for the next job, the caller closes every
 *   range word (kClosed), so a worker that read any field of the next job fails its CAS.
 * - The caller waits for the slots to be *finished* (`done`), not for the workers to have
 *   looked at the job: a worker the OS has not scheduled yet costs the caller nothing.
 * - Idle workers poll `job` for kSpinNs before they block on a condition variable, and a
 *   caller whose slots are all taken polls `done` for kSpinNs before it blocks: back-to-back
 *   calls (a decode loop) then cost no futex wake-up; a pool left idle blocks after the spin
 *   and uses no CPU. Blocking uses the usual flag-then-recheck handshake (sequentially
 *   consistent atomics on both sides), so no wake-up is lost. */

enum { kSpinNs = 50000 };
/* The slot part of a closed claim word: the caller is writing the next job's fields. */
#define kClosed UINT32_MAX

/* One range's claim word, on a cache line of its own. */
typedef struct {
    _Atomic uint64_t w; /* (generation << 32) | next slot of this range */
    char pad[64 - sizeof(uint64_t)];
} claim_word;

typedef struct {
    wkv_thread_pool* pool;
    int32_t index; /* 1.. num_workers (the caller is 0) */
} worker_arg;

struct wkv_thread_pool {
    _Atomic uint64_t job; /* the generation of the current job (announces it) */
    claim_word* range;    /* threads of them */
    int32_t threads;      /* num_workers + 1 */
    /* the current job: written by the caller before it opens the ranges */
    _Atomic(wkv_task_fn) fn;
    _Atomic(void*) task_data;
    atomic_llong n;     /* items */
    atomic_llong step;  /* items per slot (1 unless n does not fit 32 bits) */
    atomic_llong slots; /* ceil(n / step) */
    atomic_llong done;  /* slots finished */

    atomic_int sleepers;       /* workers blocked (or about to block) on `wake` */
    atomic_int caller_waiting; /* the caller blocked (or about to block) on `finished` */
    atomic_int shutdown;
    pthread_mutex_t mutex;
    pthread_cond_t wake;     /* a new job, or shutdown */
    pthread_cond_t finished; /* the last slot of the job is done */

    pthread_t* workers;
    worker_arg* args;
    int32_t num_workers;
};

/* The first slot of range r of `slots` over the pool's threads (range r ends where r + 1
 * begins). */
static int64_t range_begin(const wkv_thread_pool* pool, int64_t slots, int32_t r) {
    return slots * r / pool->threads;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Takes and runs slots of range r of job `gen` until the range is empty or the job is no longer
 * current. Returns 0 when the job is over (stop looking at other ranges), 1 otherwise. */
static int run_range(wkv_thread_pool* pool, uint32_t gen, int32_t r) {
    _Atomic uint64_t* word = &pool->range[r].w;
    uint64_t w = atomic_load_explicit(word, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(w >> 32) != gen) return 0;
        const uint32_t i = (uint32_t)w;
        if (i == kClosed) return 0;
        /* The job's fields as of the claim word w (acquire loads of release stores: see the
         * comment at the top); if the CAS below succeeds they are all the job of w. */
        const int64_t slots = atomic_load_explicit(&pool->slots, memory_order_acquire);
        if ((int64_t)i >= range_begin(pool, slots, r + 1)) return 1;
        const wkv_task_fn fn = atomic_load_explicit(&pool->fn, memory_order_acquire);
        void* data = atomic_load_explicit(&pool->task_data, memory_order_acquire);
        const int64_t n = atomic_load_explicit(&pool->n, memory_order_acquire);
        const int64_t step = atomic_load_explicit(&pool->step, memory_order_acquire);
        if (!atomic_compare_exchange_weak_explicit(word, &w, w + 1, memory_order_acquire,
                                                   memory_order_acquire))
            continue; /* w now holds the current word */
        const int64_t begin = (int64_t)i * step;
        const int64_t end = n - begin < step ? n : begin + step;
        fn(data, begin, end);
        if (atomic_fetch_add(&pool->done, 1) + 1 == slots && atomic_load(&pool->caller_waiting)) {
            pthread_mutex_lock(&pool->mutex);
            pthread_cond_signal(&pool->finished);
            pthread_mutex_unlock(&pool->mutex);
        }
        w = atomic_load_explicit(word, memory_order_acquire);
    }
}

/* Thread `self`'s part of job `gen`: its home range, then the others'. */
static void run_slots(wkv_thread_pool* pool, uint32_t gen, int32_t self) {
    for (int32_t k = 0; k < pool->threads; ++k) {
        int32_t r = self + k;
        if (r >= pool->threads) r -= pool->threads;
        if (!run_range(pool, gen, r)) return;
    }
}

static void* worker_main(void* arg) {
    wkv_thread_pool* pool = ((worker_arg*)arg)->pool;
    const int32_t self = ((worker_arg*)arg)->index;
    uint32_t seen = 0;
    for (;;) {
        /* poll for a new generation, then block */
        uint32_t gen = (uint32_t)atomic_load_explicit(&pool->job, memory_order_acquire);
        if (gen == seen && !atomic_load(&pool->shutdown)) {
            const uint64_t t0 = now_ns();
            for (unsigned k = 1;; ++k) {
                WKV_CPU_RELAX();
                gen = (uint32_t)atomic_load_explicit(&pool->job, memory_order_acquire);
                if (gen != seen || atomic_load_explicit(&pool->shutdown, memory_order_relaxed)) break;
                if ((k & 63) == 0 && now_ns() - t0 > kSpinNs) {
                    pthread_mutex_lock(&pool->mutex);
                    atomic_fetch_add(&pool->sleepers, 1);
                    while ((gen = (uint32_t)atomic_load(&pool->job)) == seen && !atomic_load(&pool->shutdown))
                        pthread_cond_wait(&pool->wake, &pool->mutex);
                    atomic_fetch_sub(&pool->sleepers, 1);
                    pthread_mutex_unlock(&pool->mutex);
                    break;
                }
            }
        }
        if (atomic_load(&pool->shutdown)) break;
        seen = gen;
        run_slots(pool, gen, self);
    }
    return NULL;
}

wkv_thread_pool* wkv_thread_pool_create(int32_t threads) {
    wkv_thread_pool* pool = (wkv_thread_pool*)calloc(1, sizeof *pool);
    if (!pool) return NULL;
    atomic_init(&pool->job, 0);
    atomic_init(&pool->fn, NULL);
    atomic_init(&pool->task_data, NULL);
    atomic_init(&pool->n, 0);
    atomic_init(&pool->step, 1);
    atomic_init(&pool->slots, 0);
    atomic_init(&pool->done, 0);
    atomic_init(&pool->sleepers, 0);
    atomic_init(&pool->caller_waiting, 0);
    atomic_init(&pool->shutdown, 0);
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->finished, NULL);
    const int32_t want = threads > 1 ? threads - 1 : 0;
    pool->threads = want + 1;
    pool->range = (claim_word*)calloc((size_t)pool->threads, sizeof(claim_word));
    if (!pool->range) {
        wkv_thread_pool_destroy(pool);
        return NULL;
    }
    for (int32_t r = 0; r < pool->threads; ++r) atomic_init(&pool->range[r].w, kClosed);
    if (want > 0) {
        pool->workers = (pthread_t*)calloc((size_t)want, sizeof(pthread_t));
        pool->args = (worker_arg*)calloc((size_t)want, sizeof(worker_arg));
        if (!pool->workers || !pool->args) {
            wkv_thread_pool_destroy(pool);
            return NULL;
        }
    }
    for (int32_t i = 0; i < want; ++i) {
        pool->args[i].pool = pool;
        pool->args[i].index = i + 1;
        if (pthread_create(&pool->workers[i], NULL, worker_main, &pool->args[i]) != 0) break;
        pool->num_workers++;
    }
    if (pool->num_workers != want) {
        wkv_thread_pool_destroy(pool);
        return NULL;
    }
    return pool;
}

void wkv_thread_pool_destroy(wkv_thread_pool* pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mutex);
    atomic_store(&pool->shutdown, 1);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);
    for (int32_t i = 0; i < pool->num_workers; ++i) pthread_join(pool->workers[i], NULL);
    free(pool->workers);
    free(pool->args);
    free(pool->range);
    pthread_cond_destroy(&pool->finished);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->mutex);
    free(pool);
}

void wkv_thread_pool_parallel_for(void* user_data, int64_t n, wkv_task_fn fn, void* task_data) {
    wkv_thread_pool* pool = (wkv_thread_pool*)user_data;
    if (n <= 0) return;
    if (pool->num_workers == 0 || n == 1) {
        fn(task_data, 0, n);
        return;
    }
    /* slots are numbered in 32 bits: past that, a slot is a run of items */
    const int64_t max_slots = (int64_t)UINT32_MAX - 1;
    const int64_t step = n <= max_slots ? 1 : (n + max_slots - 1) / max_slots;
    const int64_t slots = (n + step - 1) / step;
    const uint64_t old = atomic_load_explicit(&pool->job, memory_order_relaxed);
    for (int32_t r = 0; r < pool->threads; ++r) atomic_store(&pool->range[r].w, (old << 32) | kClosed);
    atomic_store_explicit(&pool->fn, fn, memory_order_release);
    atomic_store_explicit(&pool->task_data, task_data, memory_order_release);
    atomic_store_explicit(&pool->n, n, memory_order_release);
    atomic_store_explicit(&pool->step, step, memory_order_release);
    atomic_store_explicit(&pool->slots, slots, memory_order_release);
    atomic_store_explicit(&pool->done, 0, memory_order_relaxed);
    const uint64_t gen = (old + 1) & 0xffffffffu;
    for (int32_t r = 0; r < pool->threads; ++r)
        atomic_store(&pool->range[r].w, (gen << 32) | (uint64_t)range_begin(pool, slots, r));
    atomic_store(&pool->job, gen); /* announces the job (seq_cst: see sleepers) */
    if (atomic_load(&pool->sleepers) > 0) {
        pthread_mutex_lock(&pool->mutex);
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->mutex);
    }

    run_slots(pool, (uint32_t)gen, 0);

    /* every slot is taken; wait for those other threads are running */
    if (atomic_load_explicit(&pool->done, memory_order_acquire) == slots) return;
    const uint64_t t0 = now_ns();
    for (unsigned k = 1;; ++k) {
        WKV_CPU_RELAX();
        if (atomic_load_explicit(&pool->done, memory_order_acquire) == slots) return;
        if ((k & 63) == 0 && now_ns() - t0 > kSpinNs) break;
    }
    pthread_mutex_lock(&pool->mutex);
    atomic_store(&pool->caller_waiting, 1);
    while (atomic_load(&pool->done) != slots) pthread_cond_wait(&pool->finished, &pool->mutex);
    atomic_store(&pool->caller_waiting, 0);
    pthread_mutex_unlock(&pool->mutex);
}
