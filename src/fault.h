/* Fault injection, for tests: WKV_FAULT makes chosen failure points of the core and the
 * backends fail as the real failure would, so tests can prove that each failure comes back as
 * a status with a message, that a lost context says so (wkv_context_health) and refuses later
 * calls, that destroy still frees everything, and that other contexts keep working.
 *
 * Compiled in only with the CMake option WKV_FAULT_INJECTION (ON in Debug builds, the asan
 * preset and the build CI tests; OFF in a default Release build and the Python package): the
 * macro WKV_FAULT_INJECTION turns every point into a constant 0 otherwise (backend.h's
 * wkv_fault_hit), and WKV_FAULT is then ignored (a context logs a warning when it is set).
 *
 *   WKV_FAULT = spec[,spec...]          at most 8 specs
 *   spec      = kind[:site][@n]
 *   kind      = oom | device_lost | no_driver
 *   site      = oom: context, threads, state, scratch, buffer
 *               device_lost: submit, sync
 *               no_driver: cuda, vulkan
 *               (backend.h lists where each one is); no site: every site of the kind
 *   @n        = only the n-th time a matching point is reached fails (n >= 1); without it
 *               every time does
 *
 * e.g. WKV_FAULT=oom:scratch@2 (a context's second scratch allocation fails),
 *      WKV_FAULT=device_lost (the first op loses the device), WKV_FAULT=no_driver:vulkan.
 * oom and device_lost are read when a context is created and count per context (contexts
 * created before WKV_FAULT was set never fail); no_driver is read when the plugin loader first
 * looks for a plugin (once per process) and counts per process. */
#ifndef WKV_SRC_FAULT_H
#define WKV_SRC_FAULT_H

#include <stddef.h>

#include "backend.h"

typedef struct wkv_fault_plan wkv_fault_plan;

/* 1 when this build has fault injection compiled in. */
int wkv_fault_compiled_in(void);
/* Parses WKV_FAULT (*out = NULL when unset, empty, or compiled out). On a malformed value
 * returns WKV_ERROR_INVALID_ARGUMENT with why in err. */
wkv_status wkv_fault_plan_create(wkv_fault_plan** out, char* err, size_t err_size);
void wkv_fault_plan_destroy(wkv_fault_plan* plan);
/* The wkv_fault_fn of a plan (plan may be NULL: never fails). */
int32_t wkv_fault_check(void* plan, int32_t kind, const char* site);
/* The process's plan, parsed from WKV_FAULT on first use (the plugin loader's points). */
int wkv_fault_process_hit(int32_t kind, const char* site);

#endif
