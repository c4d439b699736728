/* The CPU backend's default thread pool: a fixed set of workers that run one parallel_for at a
 * time. Items are handed out one by one from an atomic counter, so the split never changes
 * what an item computes (results are identical for any thread count). The caller runs items
 * too and returns once every item is finished, without waiting for workers that have not woken
 * up; idle workers poll for ~50 us before they block (back-to-back calls cost no wake-up). */
#ifndef WKV_SRC_THREAD_POOL_H
#define WKV_SRC_THREAD_POOL_H

#include "wkv/wkv.h"

typedef struct wkv_thread_pool wkv_thread_pool;

/* A pool of `threads` workers counting the caller (threads - 1 are started). NULL on failure. */
wkv_thread_pool* wkv_thread_pool_create(int32_t threads);
void wkv_thread_pool_destroy(wkv_thread_pool* pool);
/* A wkv_parallel_for_fn: user_data is the pool. */
void wkv_thread_pool_parallel_for(void* pool, int64_t n, wkv_task_fn fn, void* task_data);

#endif
