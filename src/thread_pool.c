#include "thread_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct wkv_thread_pool {
    pthread_mutex_t mutex;
    pthread_cond_t wake;  /* a new job, or shutdown */
    pthread_cond_t done;  /* the last worker left the job */
    pthread_t* workers;
    int32_t num_workers;
    int shutdown;
    uint64_t generation; /* bumped per job, so a worker joins each job once */
    int32_t active;      /* workers still inside the current job */
    /* the current job */
    wkv_task_fn fn;
    void* task_data;
    int64_t n;
    atomic_llong next;
};

static void run_items(wkv_thread_pool* pool) {
    for (;;) {
        long long i = atomic_fetch_add(&pool->next, 1);
        if (i >= pool->n) return;
        pool->fn(pool->task_data, i, i + 1);
    }
}

static void* worker_main(void* arg) {
    wkv_thread_pool* pool = (wkv_thread_pool*)arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&pool->mutex);
    for (;;) {
        while (!pool->shutdown && pool->generation == seen) pthread_cond_wait(&pool->wake, &pool->mutex);
        if (pool->shutdown) break;
        seen = pool->generation;
        pthread_mutex_unlock(&pool->mutex);
        run_items(pool);
        pthread_mutex_lock(&pool->mutex);
        if (--pool->active == 0) pthread_cond_signal(&pool->done);
    }
    pthread_mutex_unlock(&pool->mutex);
    return NULL;
}

wkv_thread_pool* wkv_thread_pool_create(int32_t threads) {
    wkv_thread_pool* pool = (wkv_thread_pool*)calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->done, NULL);
    int32_t want = threads > 1 ? threads - 1 : 0;
    if (want > 0) {
        pool->workers = (pthread_t*)calloc((size_t)want, sizeof(pthread_t));
        if (!pool->workers) {
            wkv_thread_pool_destroy(pool);
            return NULL;
        }
    }
    for (int32_t i = 0; i < want; ++i) {
        if (pthread_create(&pool->workers[i], NULL, worker_main, pool) != 0) break;
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
    pool->shutdown = 1;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);
    for (int32_t i = 0; i < pool->num_workers; ++i) pthread_join(pool->workers[i], NULL);
    free(pool->workers);
    pthread_cond_destroy(&pool->done);
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
    pthread_mutex_lock(&pool->mutex);
    pool->fn = fn;
    pool->task_data = task_data;
    pool->n = n;
    atomic_store(&pool->next, 0);
    pool->active = pool->num_workers;
    pool->generation++;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);

    run_items(pool);

    pthread_mutex_lock(&pool->mutex);
    while (pool->active > 0) pthread_cond_wait(&pool->done, &pool->mutex);
    pthread_mutex_unlock(&pool->mutex);
}
