/* The exported entry points: contexts, the ops, introspection. Each one validates through
 * validate.c, runs the backend, and records the outcome (status, message, log). */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "checkpoints.h"
#include "context.h"
#include "fault.h"
#include "message.h"
#include "registry.h"
#include "thread_pool.h"
#include "validate.h"

struct wkv_context {
    const wkv_backend_iface* iface;
    void* backend_state;
    wkv_target target;
    wkv_thread_pool* pool; /* NULL when the host's parallel_for is used */
    wkv_log_fn log;
    void* log_user_data;
    wkv_log_level log_level;
    atomic_int busy;
    atomic_int lost; /* the device failed: only destroy is allowed (wkv_context_health reads it) */
    wkv_fault_plan* fault; /* WKV_FAULT's plan (fault.h), NULL without one */
    char last_error[sizeof(((wkv_message*)0)->text) + 64];
    /* device buffers: the live wkv_buffer objects of this context, sorted by address */
    wkv_buffer** buffers;
    size_t num_buffers, cap_buffers;
    /* checkpoints saving forwards left in workspaces (checkpoints.h); NULL until the first */
    wkv_ckpt_records* ckpts;
};

static void destroy_all_buffers(wkv_context* ctx);

/* The message of the last failing context-free call on this thread. */
static _Thread_local char tls_last_error[sizeof(((wkv_message*)0)->text) + 64];

static void emit_log(wkv_log_fn log, void* user, wkv_log_level max, wkv_log_level level,
                     const char* fmt, ...) WKV_PRINTF(5, 6);
static void emit_log(wkv_log_fn log, void* user, wkv_log_level max, wkv_log_level level,
                     const char* fmt, ...) {
    if (!log || level > max) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    log(user, level, line);
}

/* Context-free failure: thread-local message. */
static wkv_status fail_free(wkv_status st, const char* fmt, ...) WKV_PRINTF(2, 3);
static wkv_status fail_free(wkv_status st, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_last_error, sizeof tls_last_error, fmt, ap);
    va_end(ap);
    return st;
}

/* Records the outcome of a call on ctx and logs a failure. */
static wkv_status finish(wkv_context* ctx, const char* fn, wkv_status st, const wkv_message* msg) {
    if (st == WKV_OK) {
        ctx->last_error[0] = '\0';
        return st;
    }
    if (st == WKV_ERROR_DEVICE_LOST) atomic_store(&ctx->lost, 1);
    snprintf(ctx->last_error, sizeof ctx->last_error, "%s: %s", fn,
             msg->text[0] ? msg->text : wkv_status_string(st));
    emit_log(ctx->log, ctx->log_user_data, ctx->log_level, WKV_LOG_ERROR, "%s", ctx->last_error);
    return st;
}

/* Claims the context for one call; a concurrent second call gets WKV_ERROR_BUSY. */
static wkv_status enter(wkv_context* ctx, const char* fn) {
    if (!ctx) return fail_free(WKV_ERROR_NULL_POINTER, "%s: ctx is NULL", fn);
    if (atomic_exchange(&ctx->busy, 1))
        return fail_free(WKV_ERROR_BUSY,
                         "%s: another call is running on this context (a context is externally "
                         "synchronised; use one context per thread)", fn);
    if (atomic_load(&ctx->lost)) {
        atomic_store(&ctx->busy, 0);
        wkv_message m;
        snprintf(m.text, sizeof m.text, "the device was lost earlier; destroy this context");
        return finish(ctx, fn, WKV_ERROR_DEVICE_LOST, &m);
    }
    return WKV_OK;
}

static void leave(wkv_context* ctx) { atomic_store(&ctx->busy, 0); }

/* ------------------------------------------------------------------------------ contexts */

static int parse_backend_env(const char* s, wkv_backend* out) {
    if (!strcasecmp(s, "cpu")) *out = WKV_BACKEND_CPU;
    else if (!strcasecmp(s, "cuda")) *out = WKV_BACKEND_CUDA;
    else if (!strcasecmp(s, "vulkan")) *out = WKV_BACKEND_VULKAN;
    else if (!strcasecmp(s, "auto")) *out = WKV_BACKEND_AUTO;
    else return 0;
    return 1;
}

/* WKV_NUM_THREADS, when set: 1..1024 into *out (1); unset or empty: 0; anything else: -1. */
static int threads_env(int32_t* out) {
    const char* env = getenv("WKV_NUM_THREADS");
    if (!env || !*env) return 0;
    char* end = NULL;
    errno = 0;
    long n = strtol(env, &end, 10);
    if (errno || end == env || *end != '\0' || n < 1 || n > 1024) return -1;
    *out = (int32_t)n;
    return 1;
}

static int32_t default_threads(void) {
    int32_t n_env = 0;
    if (threads_env(&n_env) == 1) return n_env;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n >= 1 ? (int32_t)(n > 1024 ? 1024 : n) : 1;
}

/* Picks the backend: the caller's (or WKV_BACKEND's) choice, or the first available of
 * CUDA > Vulkan > CPU. Logs the choice and each fallback. */
static wkv_status choose_backend(const wkv_context_options* o, wkv_backend* out,
                                 const wkv_backend_iface** iface) {
    wkv_backend want = o->backend;
    const char* env = getenv("WKV_BACKEND");
    if (env && *env) {
        wkv_backend forced;
        if (!parse_backend_env(env, &forced))
            return fail_free(WKV_ERROR_INVALID_ARGUMENT,
                             "wkv_context_create: WKV_BACKEND=%s: expected cpu, cuda, vulkan or auto", env);
        if (forced != want)
            emit_log(o->log, o->log_user_data, o->log_level, WKV_LOG_INFO,
                     "WKV_BACKEND=%s overrides the requested backend %s", env, wkv_backend_name(want));
        want = forced;
    }
    const char* why = NULL;
    if (want != WKV_BACKEND_AUTO) {
        *iface = wkv_registry_get(want, &why);
        if (!*iface)
            return fail_free(WKV_ERROR_BACKEND_UNAVAILABLE,
                             "wkv_context_create: backend %s is unavailable: %s", wkv_backend_name(want), why);
        *out = want;
        emit_log(o->log, o->log_user_data, o->log_level, WKV_LOG_INFO, "backend %s (%s)",
                 wkv_backend_name(want), why);
        return WKV_OK;
    }
    static const wkv_backend order[] = {WKV_BACKEND_CUDA, WKV_BACKEND_VULKAN, WKV_BACKEND_CPU};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; ++i) {
        *iface = wkv_registry_get(order[i], &why);
        if (*iface && (*iface)->auto_skip && (*iface)->auto_skip(&why)) *iface = NULL; /* e.g. only lavapipe */
        if (*iface) {
            *out = order[i];
            emit_log(o->log, o->log_user_data, o->log_level, WKV_LOG_INFO, "backend auto: chose %s (%s)",
                     wkv_backend_name(order[i]), why);
            return WKV_OK;
        }
        emit_log(o->log, o->log_user_data, o->log_level, WKV_LOG_INFO, "backend auto: %s unavailable: %s",
                 wkv_backend_name(order[i]), why);
    }
    return fail_free(WKV_ERROR_INTERNAL, "wkv_context_create: no backend is available, not even cpu");
}

/* guest: Vulkan guest mode (the backend is Vulkan, WKV_BACKEND does not apply). */
static wkv_status context_create(const wkv_context_options* options, const void* guest, wkv_context** out) {
    tls_last_error[0] = '\0';
    if (!out) return fail_free(WKV_ERROR_NULL_POINTER, "wkv_context_create: out is NULL");
    *out = NULL;
    wkv_context_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    if (options) {
        wkv_message m;
        wkv_status st = wkv_check_struct_size_since(options, offsetof(wkv_context_options, flags), sizeof o,
                                                    "options", &m);
        if (st) return fail_free(st, "wkv_context_create: %s", m.text);
        memcpy(&o, options, options->struct_size < sizeof o ? options->struct_size : sizeof o);
        o.struct_size = sizeof o;
    }
    if (o.log_level == 0) o.log_level = WKV_LOG_WARN;
    if (o.log_level < WKV_LOG_ERROR || o.log_level > WKV_LOG_DEBUG)
        return fail_free(WKV_ERROR_INVALID_ARGUMENT, "wkv_context_create: options->log_level is %d",
                         (int)o.log_level);
    if ((int)o.backend < WKV_BACKEND_AUTO || (int)o.backend >= WKV_BACKEND_COUNT_)
        return fail_free(WKV_ERROR_INVALID_ARGUMENT,
                         "wkv_context_create: options->backend is %d: expected a wkv_backend (0..3)",
                         (int)o.backend);
    if (o.device_index < 0)
        return fail_free(WKV_ERROR_INVALID_ARGUMENT, "wkv_context_create: options->device_index is %d",
                         (int)o.device_index);
    if (o.cpu_threads < 0 || o.cpu_threads > 1024)
        return fail_free(WKV_ERROR_INVALID_ARGUMENT,
                         "wkv_context_create: options->cpu_threads is %d: expected 0 (all cores) to 1024",
                         (int)o.cpu_threads);
    int32_t n_env = 0;
    if (o.cpu_threads == 0 && threads_env(&n_env) < 0)
        return fail_free(WKV_ERROR_INVALID_ARGUMENT,
                         "wkv_context_create: WKV_NUM_THREADS=%s: expected a whole number of threads, "
                         "1 to 1024 (or unset: all cores)", getenv("WKV_NUM_THREADS"));
    if (o.flags & ~(uint64_t)WKV_CONTEXT_ASYNC)
        return fail_free(WKV_ERROR_INVALID_ARGUMENT,
                         "wkv_context_create: options->flags is 0x%llx: unknown bits (known: WKV_CONTEXT_ASYNC)",
                         (unsigned long long)o.flags);
    if (!o.parallel_for && o.parallel_for_user_data)
        return fail_free(WKV_ERROR_INVALID_ARGUMENT,
                         "wkv_context_create: options->parallel_for_user_data is set without parallel_for");

    wkv_backend kind = WKV_BACKEND_CPU;
    const wkv_backend_iface* iface = NULL;
    wkv_status st;
    if (guest) {
        if (o.backend != WKV_BACKEND_AUTO && o.backend != WKV_BACKEND_VULKAN)
            return fail_free(WKV_ERROR_INVALID_ARGUMENT,
                             "wkv_vulkan_context_create: options->backend is %s: expected auto or vulkan",
                             wkv_backend_name(o.backend));
        const char* why = NULL;
        kind = WKV_BACKEND_VULKAN;
        iface = wkv_registry_get(kind, &why);
        if (!iface)
            return fail_free(WKV_ERROR_BACKEND_UNAVAILABLE, "wkv_vulkan_context_create: backend vulkan is "
                             "unavailable: %s", why);
    } else if ((st = choose_backend(&o, &kind, &iface))) {
        return st;
    }

    /* WKV_FAULT (fault.h): the context's plan, handed to its backend with the create args. */
    wkv_fault_plan* fault = NULL;
    char fault_err[256];
    if ((st = wkv_fault_plan_create(&fault, fault_err, sizeof fault_err)))
        return fail_free(st, "wkv_context_create: WKV_FAULT=%s: %s", getenv("WKV_FAULT"), fault_err);
    if (!wkv_fault_compiled_in() && getenv("WKV_FAULT") && *getenv("WKV_FAULT"))
        emit_log(o.log, o.log_user_data, o.log_level, WKV_LOG_WARN,
                 "WKV_FAULT is set, but this libwkv was built without fault injection "
                 "(WKV_FAULT_INJECTION=OFF): ignored");

    wkv_context* ctx = wkv_fault_check(fault, WKV_FAULT_OOM, "context") ? NULL
                                                                        : (wkv_context*)calloc(1, sizeof *ctx);
    if (!ctx) {
        wkv_fault_plan_destroy(fault);
        return fail_free(WKV_ERROR_OUT_OF_MEMORY, "wkv_context_create: out of memory");
    }
    ctx->fault = fault;
    ctx->iface = iface;
    ctx->target.backend = kind;
    ctx->target.device_index = o.device_index;
    ctx->target.ctx = ctx;
    ctx->target.find_buffer = wkv_context_find_buffer;
    ctx->target.buffer_is_live = wkv_buffer_is_live;
    ctx->log = o.log;
    ctx->log_user_data = o.log_user_data;
    ctx->log_level = o.log_level;
    atomic_init(&ctx->busy, 0);
    atomic_init(&ctx->lost, 0);

    wkv_backend_create_args args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.device_index = o.device_index;
    args.guest = guest;
    args.fault = fault ? wkv_fault_check : NULL;
    args.fault_plan = fault;
    args.context_flags = o.flags;
    if (o.parallel_for) {
        args.parallel_for = o.parallel_for;
        args.parallel_for_user_data = o.parallel_for_user_data;
        args.num_threads = o.cpu_threads > 0 ? o.cpu_threads : default_threads();
    } else {
        /* GPU backends only use the host thread for set-up: give them a pool of one. */
        args.num_threads = kind == WKV_BACKEND_CPU ? (o.cpu_threads > 0 ? o.cpu_threads : default_threads()) : 1;
        ctx->pool = wkv_fault_check(fault, WKV_FAULT_OOM, "threads") ? NULL
                                                                      : wkv_thread_pool_create(args.num_threads);
        if (!ctx->pool) {
            wkv_fault_plan_destroy(fault);
            free(ctx);
            return fail_free(WKV_ERROR_OUT_OF_MEMORY, "wkv_context_create: cannot start %d CPU threads",
                             (int)args.num_threads);
        }
        args.parallel_for = wkv_thread_pool_parallel_for;
        args.parallel_for_user_data = ctx->pool;
        args.own_pool = 1;
    }
    wkv_message m;
    m.text[0] = '\0';
    st = iface->create(&args, &ctx->backend_state, &m);
    if (st) {
        wkv_thread_pool_destroy(ctx->pool);
        wkv_fault_plan_destroy(fault);
        free(ctx);
        return fail_free(st, "wkv_context_create: backend %s: %s", wkv_backend_name(kind),
                         m.text[0] ? m.text : wkv_status_string(st));
    }
    emit_log(ctx->log, ctx->log_user_data, ctx->log_level, WKV_LOG_DEBUG,
             "context on %s, device %d, %d CPU thread(s)%s", wkv_backend_name(kind), (int)o.device_index,
             (int)args.num_threads, o.parallel_for ? " (host parallel_for)" : "");
    *out = ctx;
    return WKV_OK;
}

wkv_status wkv_context_create(const wkv_context_options* options, wkv_context** out) {
    return context_create(options, NULL, out);
}

wkv_status wkv_context_create_guest(const wkv_context_options* options, const void* guest, const char* fn,
                                    wkv_context** out) {
    if (!guest) {
        if (out) *out = NULL;
        return fail_free(WKV_ERROR_NULL_POINTER, "%s: guest is NULL", fn);
    }
    return context_create(options, guest, out);
}

void wkv_context_destroy(wkv_context* ctx) {
    if (!ctx) return;
    destroy_all_buffers(ctx);
    ctx->iface->destroy(ctx->backend_state);
    wkv_ckpt_records_destroy(ctx->ckpts);
    wkv_thread_pool_destroy(ctx->pool);
    wkv_fault_plan_destroy(ctx->fault);
    free(ctx);
}

wkv_status wkv_context_health(const wkv_context* ctx) {
    if (!ctx) return fail_free(WKV_ERROR_NULL_POINTER, "wkv_context_health: ctx is NULL");
    return atomic_load(&((wkv_context*)ctx)->lost) ? WKV_ERROR_DEVICE_LOST : WKV_OK;
}

wkv_backend wkv_context_backend(const wkv_context* ctx) {
    return ctx ? ctx->target.backend : WKV_BACKEND_AUTO;
}

const char* wkv_last_error(const wkv_context* ctx) { return ctx ? ctx->last_error : tls_last_error; }

/* ----------------------------------------------------------------------------- the ops */

/* Whether the backend's iface has the (appended) member m: ABI v2's saves_checkpoints, v3's
 * forward_scratch_size. */
#define IFACE_HAS(iface, m) \
    ((iface)->struct_size >= offsetof(wkv_backend_iface, m) + sizeof((iface)->m) ? (iface)->m : NULL)

/* The backend's saves_checkpoints hook (ABI v2), or NULL. */
static int32_t (*saves_hook(const wkv_backend_iface* iface))(void*, const wkv_problem*) {
    return IFACE_HAS(iface, saves_checkpoints);
}

/* A forward with a workspace (p->workspace set by the validation): checks the workspace against
 * the backward's size (the workspace of the backward of this very problem) on every backend and
 * ISA, so a call's status never depends on where it runs; then sets p->save_checkpoints where
 * the backend saves checkpoints for p, and drops the workspace where it does not. */
static wkv_status prepare_save(wkv_context* ctx, wkv_problem* p, const wkv_spans* spans, wkv_message* m) {
    if (!p->workspace) return WKV_OK;
    wkv_workspace_mem_kind(&ctx->target, p, NULL); /* a backend may save into device memory only */
    /* the backward of this problem: the forward's inputs, no outputs */
    wkv_problem b = *p;
    b.backward = 1;
    memset(&b.y, 0, sizeof b.y);
    memset(&b.state_out, 0, sizeof b.state_out);
    memset(&b.mem[7], 0, sizeof b.mem[0]); /* y and state_out (backend.h's order) */
    memset(&b.mem[9], 0, sizeof b.mem[0]);
    b.scratch = NULL; /* the forward's */
    b.scratch_size = 0;
    size_t needed = 0;
    wkv_status st = ctx->iface->workspace_size(ctx->backend_state, &b, &needed, m);
    if (!st) st = wkv_validate_workspace_mem(&ctx->target, NULL, spans, needed, p, m);
    if (st) return st;
    int32_t (*saves)(void*, const wkv_problem*) = saves_hook(ctx->iface);
    if (!saves || !saves(ctx->backend_state, p)) {
        memset(&p->workspace_mem, 0, sizeof p->workspace_mem);
        p->workspace = NULL; /* ignored: the backward will recompute (the record says so) */
        p->workspace_size = 0;
        return WKV_OK;
    }
    p->save_checkpoints = 1;
    return WKV_OK;
}

/* The forward's scratch (p->scratch set by the validation, after prepare_save: the size may
 * depend on p->save_checkpoints): asks the backend how much p can use (*needed; 0 without the
 * ABI v3 hook) and checks the scratch against it, or with check_size == 0 (the size query) only
 * what does not depend on the size. The backend gets it only where it can use it. */
static wkv_status resolve_scratch(wkv_context* ctx, wkv_problem* p, const wkv_spans* spans, int check_size,
                                  size_t* needed, wkv_message* m) {
    void* scratch = p->scratch;
    size_t scratch_size = p->scratch_size;
    p->scratch = NULL; /* the size must not depend on it (backend.h) */
    p->scratch_size = 0;
    *needed = 0;
    wkv_status (*size_hook)(void*, const wkv_problem*, size_t*, wkv_message*) =
        IFACE_HAS(ctx->iface, forward_scratch_size);
    wkv_status st = size_hook ? size_hook(ctx->backend_state, p, needed, m) : WKV_OK;
    if (st) return st;
    p->scratch = scratch;
    p->scratch_size = scratch_size;
    st = wkv_validate_scratch_mem(&ctx->target, spans, check_size ? *needed : 0, p, m);
    if (st || *needed == 0 || !scratch) { /* nothing to hand on */
        p->scratch = NULL;
        p->scratch_size = 0;
        memset(&p->scratch_mem, 0, sizeof p->scratch_mem);
    }
    return st;
}

/* Validates a forward descriptor for running it (check_size = 1) or for the scratch size query
 * (0): tensors, the workspace where the backend saves checkpoints, the scratch. *ws, *ws_size:
 * the caller's workspace (which p keeps only where the backend saves into it). */
static wkv_status prepare_forward(wkv_context* ctx, const wkv_forward_desc* desc, int check_size, wkv_problem* p,
                                  wkv_spans* spans, void** ws, size_t* ws_size, size_t* scratch_needed,
                                  wkv_message* m) {
    *ws = NULL;
    *ws_size = 0;
    wkv_status st = wkv_validate_forward_spans(&ctx->target, desc, p, spans, m);
    if (st) return st;
    *ws = p->workspace;
    *ws_size = p->workspace_size;
    st = prepare_save(ctx, p, spans, m);
    if (!st) st = resolve_scratch(ctx, p, spans, check_size, scratch_needed, m);
    return st;
}

wkv_status wkv_forward(wkv_context* ctx, const wkv_forward_desc* desc) {
    wkv_status st = enter(ctx, "wkv_forward");
    if (st) return st;
    wkv_problem p;
    wkv_spans spans;
    wkv_message m;
    m.text[0] = '\0';
    size_t scratch_needed = 0, ws_size = 0;
    void* ws = NULL;
    st = prepare_forward(ctx, desc, 1, &p, &spans, &ws, &ws_size, &scratch_needed, &m);
    /* room for the context's record of the workspace, so nothing can fail once the forward ran */
    if (!st && ws && !wkv_ckpt_reserve(&ctx->ckpts)) st = wkv_fail(&m, WKV_ERROR_OUT_OF_MEMORY, "out of memory");
    if (!st) st = ctx->iface->forward(ctx->backend_state, &p, &m);
    if (!st && ws) wkv_ckpt_note_forward(ctx->ckpts, &p, ws, ws_size, p.save_checkpoints);
    st = finish(ctx, "wkv_forward", st, &m);
    leave(ctx);
    return st;
}

/* Validates a backward descriptor and asks the backend for its workspace size. */
static wkv_status prepare_backward(wkv_context* ctx, const wkv_backward_desc* desc, wkv_problem* p,
                                   wkv_spans* spans, size_t* needed, wkv_message* m) {
    wkv_status st = wkv_validate_backward(&ctx->target, desc, p, spans, m);
    if (st) return st;
    return ctx->iface->workspace_size(ctx->backend_state, p, needed, m);
}

/* WKV_BACKWARD_REUSE_CHECKPOINTS (requested in p->reuse_checkpoints by the validation): kept
 * when the context's record of the workspace matches and the backend saved; refused without a
 * matching record. A backward that does not reuse overwrites the workspace: its records go. */
static wkv_status resolve_reuse(wkv_context* ctx, wkv_problem* p, wkv_message* m) {
    if (!p->reuse_checkpoints) {
        wkv_ckpt_forget(ctx->ckpts, p->workspace, p->workspace_size);
        return WKV_OK;
    }
    int saved = 0;
    wkv_status st = wkv_ckpt_lookup(ctx->ckpts, p, p->workspace, &saved, m);
    if (st) return st;
    p->reuse_checkpoints = saved;
    return WKV_OK;
}

wkv_status wkv_backward(wkv_context* ctx, const wkv_backward_desc* desc) {
    wkv_status st = enter(ctx, "wkv_backward");
    if (st) return st;
    wkv_problem p;
    wkv_spans spans;
    wkv_message m;
    m.text[0] = '\0';
    size_t needed = 0;
    st = prepare_backward(ctx, desc, &p, &spans, &needed, &m);
    if (!st) st = wkv_validate_workspace_mem(&ctx->target, desc, &spans, needed, &p, &m);
    if (!st) st = resolve_reuse(ctx, &p, &m);
    if (!st) st = ctx->iface->backward(ctx->backend_state, &p, &m);
    st = finish(ctx, "wkv_backward", st, &m);
    leave(ctx);
    return st;
}

wkv_status wkv_workspace_size(wkv_context* ctx, size_t* out_bytes, const wkv_backward_desc* desc) {
    wkv_status st = enter(ctx, "wkv_workspace_size");
    if (st) return st;
    wkv_problem p;
    wkv_spans spans;
    wkv_message m;
    m.text[0] = '\0';
    size_t needed = 0;
    if (!out_bytes) st = wkv_fail(&m, WKV_ERROR_NULL_POINTER, "out_bytes is NULL");
    else st = prepare_backward(ctx, desc, &p, &spans, &needed, &m);
    if (!st) *out_bytes = needed;
    st = finish(ctx, "wkv_workspace_size", st, &m);
    leave(ctx);
    return st;
}

wkv_status wkv_forward_scratch_size(wkv_context* ctx, size_t* out_bytes, const wkv_forward_desc* desc) {
    wkv_status st = enter(ctx, "wkv_forward_scratch_size");
    if (st) return st;
    wkv_problem p;
    wkv_spans spans;
    wkv_message m;
    m.text[0] = '\0';
    size_t needed = 0, ws_size = 0;
    void* ws = NULL;
    if (!out_bytes) st = wkv_fail(&m, WKV_ERROR_NULL_POINTER, "out_bytes is NULL");
    else st = prepare_forward(ctx, desc, 0, &p, &spans, &ws, &ws_size, &needed, &m);
    if (!st) *out_bytes = needed;
    st = finish(ctx, "wkv_forward_scratch_size", st, &m);
    leave(ctx);
    return st;
}

wkv_status wkv_context_record(wkv_context* ctx, const char* fn, wkv_backend backend, int32_t request, void* cmd,
                              const void* desc, int backward) {
    wkv_status st = enter(ctx, fn);
    if (st) return st;
    wkv_problem p;
    wkv_spans spans;
    wkv_message m;
    m.text[0] = '\0';
    void* ws = NULL; /* a recorded forward's workspace */
    size_t ws_size = 0;
    if (ctx->target.backend != backend || !ctx->iface->control) {
        st = wkv_fail(&m, WKV_ERROR_INVALID_ARGUMENT, "the context runs on the %s backend, not %s",
                      wkv_backend_name(ctx->target.backend), wkv_backend_name(backend));
    } else if (!cmd) {
        st = wkv_fail(&m, WKV_ERROR_NULL_POINTER, "cmd is NULL");
    } else if (backward) {
        size_t needed = 0;
        st = prepare_backward(ctx, (const wkv_backward_desc*)desc, &p, &spans, &needed, &m);
        if (!st) st = wkv_validate_workspace_mem(&ctx->target, (const wkv_backward_desc*)desc, &spans, needed, &p, &m);
        if (!st) st = resolve_reuse(ctx, &p, &m);
    } else {
        st = wkv_validate_forward_spans(&ctx->target, (const wkv_forward_desc*)desc, &p, &spans, &m);
        /* a recorded forward saves no checkpoints (a backend that saves runs on the host):
         * only the record that says so, as prepare_save does for such a backend */
        ws = p.workspace;
        ws_size = p.workspace_size;
        p.workspace = NULL;
        p.workspace_size = 0;
        size_t scratch_needed = 0; /* the scratch, checked as wkv_forward checks it */
        if (!st) st = resolve_scratch(ctx, &p, &spans, 1, &scratch_needed, &m);
        if (!st && ws && !wkv_ckpt_reserve(&ctx->ckpts)) st = wkv_fail(&m, WKV_ERROR_OUT_OF_MEMORY, "out of memory");
    }
    if (!st) {
        static const char* names[WKV_PROBLEM_VIEWS] = {
            "r", "w", "k", "v", "a", "b", "u", "y", "state_in", "state_out", "dy", "dstate_out",
            "dr", "dw", "dk", "dv", "da", "db", "du", "dstate_in"};
        const wkv_view* views = &p.r;
        for (int i = 0; i < WKV_PROBLEM_VIEWS && !st; ++i)
            if (views[i].data && !p.mem[i].buffer)
                st = wkv_fail(&m, WKV_ERROR_DEVICE_MISMATCH,
                              "%s is not in a wkv_buffer: a recorded op takes device buffers only", names[i]);
    }
    if (!st) {
        wkv_vulkan_record_args ra;
        ra.cmd = cmd;
        ra.p = &p;
        st = ctx->iface->control(ctx->backend_state, request, &ra, &m);
    }
    if (!st && ws) wkv_ckpt_note_forward(ctx->ckpts, &p, ws, ws_size, 0);
    st = finish(ctx, fn, st, &m);
    leave(ctx);
    return st;
}

wkv_status wkv_context_synchronize(wkv_context* ctx) {
    wkv_status st = enter(ctx, "wkv_context_synchronize");
    if (st) return st;
    wkv_message m;
    m.text[0] = '\0';
    if (ctx->iface->synchronize) st = ctx->iface->synchronize(ctx->backend_state, &m);
    st = finish(ctx, "wkv_context_synchronize", st, &m);
    leave(ctx);
    return st;
}

wkv_status wkv_context_control(wkv_context* ctx, const char* fn, wkv_backend backend, int32_t request,
                               void* data, const char* required) {
    wkv_status st = enter(ctx, fn);
    if (st) return st;
    wkv_message m;
    m.text[0] = '\0';
    if (required && !data)
        st = wkv_fail(&m, WKV_ERROR_NULL_POINTER, "%s is NULL", required);
    else if (ctx->target.backend != backend)
        st = wkv_fail(&m, WKV_ERROR_INVALID_ARGUMENT, "the context runs on the %s backend, not %s",
                      wkv_backend_name(ctx->target.backend), wkv_backend_name(backend));
    else if (!ctx->iface->control)
        st = wkv_fail(&m, WKV_ERROR_UNSUPPORTED, "the %s backend has no such control",
                      wkv_backend_name(backend));
    else
        st = ctx->iface->control(ctx->backend_state, request, data, &m);
    st = finish(ctx, fn, st, &m);
    leave(ctx);
    return st;
}

/* ------------------------------------------------------------------------------ attention */

/* A pinned configuration must be one the backend lists, and one that fits its device. */
static wkv_status check_attention_config(wkv_context* ctx, const char* name, wkv_message* m) {
    int32_t (*list)(void*, wkv_attention_config*, int32_t) = IFACE_HAS(ctx->iface, attention_configs);
    wkv_attention_config cfg[32];
    memset(cfg, 0, sizeof cfg);
    for (int i = 0; i < 32; ++i) cfg[i].struct_size = sizeof cfg[i];
    int32_t n = list ? list(ctx->backend_state, cfg, 32) : 0;
    if (n > 32) n = 32;
    for (int32_t i = 0; i < n; ++i) {
        cfg[i].name[sizeof cfg[i].name - 1] = '\0';
        if (strncmp(cfg[i].name, name, sizeof cfg[i].name) != 0) continue;
        if (!cfg[i].fits)
            return wkv_fail(m, WKV_ERROR_UNSUPPORTED, "desc->config \"%s\" does not fit this %s device "
                            "(wkv_attention_configs: fits = 0)", cfg[i].name, ctx->iface->name);
        return WKV_OK;
    }
    return wkv_fail(m, WKV_ERROR_INVALID_ARGUMENT, "desc->config \"%.64s\" is not an attention configuration of "
                    "the %s backend (wkv_attention_configs lists them)", name, ctx->iface->name);
}

wkv_status wkv_attention(wkv_context* ctx, const wkv_attention_desc* desc) {
    wkv_status st = enter(ctx, "wkv_attention");
    if (st) return st;
    wkv_message m;
    m.text[0] = '\0';
    wkv_attention_problem p;
    wkv_status (*run)(void*, const wkv_attention_problem*, wkv_message*) = IFACE_HAS(ctx->iface, attention);
    st = wkv_validate_attention(&ctx->target, desc, &p, &m);
    if (!st && !run)
        st = wkv_fail(&m, WKV_ERROR_UNSUPPORTED, "the %s backend has no attention kernel yet (the CPU and Vulkan "
                      "backends have)", ctx->iface->name);
    if (!st && p.config) st = check_attention_config(ctx, p.config, &m);
    if (!st) st = run(ctx->backend_state, &p, &m);
    st = finish(ctx, "wkv_attention", st, &m);
    leave(ctx);
    return st;
}

wkv_status wkv_attention_backward(wkv_context* ctx, const wkv_attention_backward_desc* desc) {
    wkv_status st = enter(ctx, "wkv_attention_backward");
    if (st) return st;
    wkv_message m;
    m.text[0] = '\0';
    wkv_attention_backward_problem p;
    wkv_status (*run)(void*, const wkv_attention_backward_problem*, wkv_message*) =
        IFACE_HAS(ctx->iface, attention_backward);
    st = wkv_validate_attention_backward(&ctx->target, desc, &p, &m);
    if (!st && !run)
        st = wkv_fail(&m, WKV_ERROR_UNSUPPORTED, "the %s backend has no attention backward kernel yet (the CPU "
                      "backend has)", ctx->iface->name);
    if (!st) st = run(ctx->backend_state, &p, &m);
    st = finish(ctx, "wkv_attention_backward", st, &m);
    leave(ctx);
    return st;
}

wkv_status wkv_attention_configs(wkv_context* ctx, wkv_attention_config* out, int32_t capacity, int32_t* count) {
    wkv_status st = enter(ctx, "wkv_attention_configs");
    if (st) return st;
    wkv_message m;
    m.text[0] = '\0';
    int32_t (*list)(void*, wkv_attention_config*, int32_t) = IFACE_HAS(ctx->iface, attention_configs);
    if (!count) st = wkv_fail(&m, WKV_ERROR_NULL_POINTER, "count is NULL");
    else if (capacity < 0) st = wkv_fail(&m, WKV_ERROR_INVALID_ARGUMENT, "capacity is %d: must be >= 0", (int)capacity);
    else if (capacity > 0 && !out) st = wkv_fail(&m, WKV_ERROR_NULL_POINTER, "out is NULL but capacity is %d", (int)capacity);
    else if (capacity > 0 && out[0].struct_size != sizeof(wkv_attention_config))
        st = wkv_fail(&m, WKV_ERROR_STRUCT_SIZE, "out[0].struct_size is %zu, expected %zu", out[0].struct_size,
                      sizeof(wkv_attention_config));
    if (!st) {
        for (int32_t i = 0; i < capacity; ++i) {
            memset(&out[i], 0, sizeof out[i]);
            out[i].struct_size = sizeof(wkv_attention_config);
        }
        *count = list ? list(ctx->backend_state, out, capacity) : 0;
    }
    st = finish(ctx, "wkv_attention_configs", st, &m);
    leave(ctx);
    return st;
}

/* ------------------------------------------------------------------------- introspection */

static wkv_status check_kind(const char* fn, wkv_backend backend) {
    if (backend != WKV_BACKEND_CPU && backend != WKV_BACKEND_CUDA && backend != WKV_BACKEND_VULKAN)
        return fail_free(WKV_ERROR_INVALID_ARGUMENT,
                         "%s: backend is %d: expected WKV_BACKEND_CPU, _CUDA or _VULKAN", fn, (int)backend);
    return WKV_OK;
}

wkv_status wkv_backend_get_info(wkv_backend backend, wkv_backend_info* out) {
    tls_last_error[0] = '\0';
    if (!out) return fail_free(WKV_ERROR_NULL_POINTER, "wkv_backend_get_info: out is NULL");
    if (out->struct_size < sizeof *out)
        return fail_free(WKV_ERROR_STRUCT_SIZE,
                         "wkv_backend_get_info: out->struct_size is %zu, expected %zu", out->struct_size,
                         sizeof *out);
    wkv_status st = check_kind("wkv_backend_get_info", backend);
    if (st) return st;
    wkv_registry_info(backend, out);
    return WKV_OK;
}

wkv_status wkv_device_get_info(wkv_backend backend, int32_t index, wkv_device_info* out) {
    tls_last_error[0] = '\0';
    if (!out) return fail_free(WKV_ERROR_NULL_POINTER, "wkv_device_get_info: out is NULL");
    if (out->struct_size < sizeof *out)
        return fail_free(WKV_ERROR_STRUCT_SIZE, "wkv_device_get_info: out->struct_size is %zu, expected %zu",
                         out->struct_size, sizeof *out);
    wkv_status st = check_kind("wkv_device_get_info", backend);
    if (st) return st;
    const char* why = NULL;
    const wkv_backend_iface* iface = wkv_registry_get(backend, &why);
    if (!iface)
        return fail_free(WKV_ERROR_BACKEND_UNAVAILABLE, "wkv_device_get_info: backend %s is unavailable: %s",
                         wkv_backend_name(backend), why);
    wkv_backend_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    wkv_registry_info(backend, &info);
    if (index < 0 || index >= info.device_count)
        return fail_free(WKV_ERROR_INVALID_ARGUMENT, "wkv_device_get_info: index %d, backend %s has %d device(s)",
                         (int)index, wkv_backend_name(backend), (int)info.device_count);
    size_t keep = out->struct_size;
    memset(out, 0, sizeof *out);
    out->struct_size = keep;
    if (!iface->device_info) {
        snprintf(out->name, sizeof out->name, "%s device %d", wkv_backend_name(backend), (int)index);
        return WKV_OK;
    }
    wkv_message m;
    m.text[0] = '\0';
    st = iface->device_info(index, out, &m);
    out->struct_size = keep;
    if (st) return fail_free(st, "wkv_device_get_info: %s", m.text[0] ? m.text : wkv_status_string(st));
    return WKV_OK;
}

/* ====================================================================== device buffers
 * wkv.h's DEVICE BUFFERS section. The core owns each wkv_buffer (its context, the backend's
 * handle, its size) and keeps a context's live buffers in a sorted array, so that a tensor's
 * data can be recognised as one of them without ever being dereferenced. */

struct wkv_buffer {
    wkv_context* ctx;
    void* backend_buffer;
    uint64_t size;
};

/* Index of the first entry >= buf in a sorted array of n buffers. */
static size_t lower_bound(wkv_buffer* const* arr, size_t n, const void* buf) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)arr[mid] < (uintptr_t)buf) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static size_t buffer_lower_bound(const wkv_context* ctx, const void* buf) {
    return lower_bound(ctx->buffers, ctx->num_buffers, buf);
}

/* Every live buffer of every context, sorted by address: tells a buffer of another context
 * from a device pointer (CUDA tensors of either kind have device.type WKV_DEVICE_CUDA). */
static pthread_mutex_t g_live_lock = PTHREAD_MUTEX_INITIALIZER;
static wkv_buffer** g_live;
static size_t g_live_cap;
static atomic_size_t g_live_count; /* written under g_live_lock; read without it for the fast path */

int wkv_buffer_is_live(const void* ptr) {
    if (!ptr || atomic_load(&g_live_count) == 0) return 0;
    pthread_mutex_lock(&g_live_lock);
    size_t n = atomic_load(&g_live_count);
    size_t i = lower_bound(g_live, n, ptr);
    int found = i < n && (const void*)g_live[i] == ptr;
    pthread_mutex_unlock(&g_live_lock);
    return found;
}

/* Room for one more live buffer (0: out of memory). */
static int live_reserve(void) {
    pthread_mutex_lock(&g_live_lock);
    int ok = 1;
    size_t n = atomic_load(&g_live_count);
    if (n == g_live_cap) {
        size_t cap = g_live_cap ? 2 * g_live_cap : 64;
        wkv_buffer** grown = (wkv_buffer**)realloc(g_live, cap * sizeof *grown);
        if (grown) g_live = grown, g_live_cap = cap;
        else ok = 0;
    }
    pthread_mutex_unlock(&g_live_lock);
    return ok;
}

/* After live_reserve (another thread may have used the room: then grow again). */
static int live_insert(wkv_buffer* buf) {
    for (;;) {
        pthread_mutex_lock(&g_live_lock);
        size_t n = atomic_load(&g_live_count);
        if (n < g_live_cap) {
            size_t i = lower_bound(g_live, n, buf);
            memmove(&g_live[i + 1], &g_live[i], (n - i) * sizeof *g_live);
            g_live[i] = buf;
            atomic_store(&g_live_count, n + 1);
            pthread_mutex_unlock(&g_live_lock);
            return 1;
        }
        pthread_mutex_unlock(&g_live_lock);
        if (!live_reserve()) return 0;
    }
}

static void live_remove(wkv_buffer* buf) {
    pthread_mutex_lock(&g_live_lock);
    size_t n = atomic_load(&g_live_count);
    size_t i = lower_bound(g_live, n, buf);
    if (i < n && g_live[i] == buf) {
        memmove(&g_live[i], &g_live[i + 1], (n - i - 1) * sizeof *g_live);
        atomic_store(&g_live_count, n - 1);
    }
    pthread_mutex_unlock(&g_live_lock);
}

int wkv_context_find_buffer(const wkv_context* ctx, const void* ptr, void** backend_buffer,
                            uint64_t* size) {
    if (!ctx || !ptr) return 0;
    size_t i = buffer_lower_bound(ctx, ptr);
    if (i >= ctx->num_buffers || (const void*)ctx->buffers[i] != ptr) return 0;
    if (backend_buffer) *backend_buffer = ctx->buffers[i]->backend_buffer;
    if (size) *size = ctx->buffers[i]->size;
    return 1;
}

static void destroy_all_buffers(wkv_context* ctx) {
    for (size_t i = 0; i < ctx->num_buffers; ++i) {
        live_remove(ctx->buffers[i]);
        ctx->iface->buffer_destroy(ctx->backend_state, ctx->buffers[i]->backend_buffer);
        free(ctx->buffers[i]);
    }
    free(ctx->buffers);
    ctx->buffers = NULL;
    ctx->num_buffers = ctx->cap_buffers = 0;
}

/* request == 0: the backend's buffer_create; otherwise its control `request` (an import). */
static wkv_status buffer_new(wkv_context* ctx, const char* fn, uint64_t bytes, int32_t request,
                             wkv_vulkan_import_args* import, wkv_buffer** out) {
    if (out) *out = NULL;
    wkv_status st = enter(ctx, fn);
    if (st) return st;
    wkv_message m;
    m.text[0] = '\0';
    wkv_buffer* buf = NULL;
    if (!out) st = wkv_fail(&m, WKV_ERROR_NULL_POINTER, "out is NULL");
    else if (bytes == 0) st = wkv_fail(&m, WKV_ERROR_INVALID_ARGUMENT, "bytes is 0");
    else if (!ctx->iface->buffer_create)
        st = wkv_fail(&m, WKV_ERROR_UNSUPPORTED,
                      "the %s backend has no device buffers (its tensors are plain pointers)",
                      wkv_backend_name(ctx->target.backend));
    if (!st && ctx->num_buffers == ctx->cap_buffers) {
        size_t cap = ctx->cap_buffers ? 2 * ctx->cap_buffers : 16;
        wkv_buffer** grown = (wkv_buffer**)realloc(ctx->buffers, cap * sizeof *grown);
        if (!grown) st = wkv_fail(&m, WKV_ERROR_OUT_OF_MEMORY, "out of memory");
        else ctx->buffers = grown, ctx->cap_buffers = cap;
    }
    if (!st && (!(buf = (wkv_buffer*)calloc(1, sizeof *buf)) || !live_reserve()))
        st = wkv_fail(&m, WKV_ERROR_OUT_OF_MEMORY, "out of memory");
    if (!st && request) {
        if (!ctx->iface->control) {
            st = wkv_fail(&m, WKV_ERROR_UNSUPPORTED, "the %s backend cannot import buffers",
                          wkv_backend_name(ctx->target.backend));
        } else {
            import->out_handle = NULL;
            st = ctx->iface->control(ctx->backend_state, request, import, &m);
            if (!st) buf->backend_buffer = import->out_handle;
        }
    } else if (!st) {
        st = ctx->iface->buffer_create(ctx->backend_state, bytes, &buf->backend_buffer, &m);
    }
    if (!st && !live_insert(buf)) {
        ctx->iface->buffer_destroy(ctx->backend_state, buf->backend_buffer);
        st = wkv_fail(&m, WKV_ERROR_OUT_OF_MEMORY, "out of memory");
    }
    if (!st) {
        buf->ctx = ctx;
        buf->size = bytes;
        size_t i = buffer_lower_bound(ctx, buf);
        memmove(&ctx->buffers[i + 1], &ctx->buffers[i], (ctx->num_buffers - i) * sizeof *ctx->buffers);
        ctx->buffers[i] = buf;
        ++ctx->num_buffers;
        *out = buf;
    } else {
        free(buf);
    }
    st = finish(ctx, fn, st, &m);
    leave(ctx);
    return st;
}

wkv_status wkv_buffer_create(wkv_context* ctx, uint64_t bytes, wkv_buffer** out) {
    return buffer_new(ctx, "wkv_buffer_create", bytes, 0, NULL, out);
}

wkv_status wkv_buffer_create_imported(wkv_context* ctx, const char* fn, uint64_t bytes, int32_t request,
                                      wkv_vulkan_import_args* data, wkv_buffer** out) {
    return buffer_new(ctx, fn, bytes, request, data, out);
}

void wkv_buffer_destroy(wkv_buffer* buf) {
    if (!buf) return;
    wkv_context* ctx = buf->ctx;
    size_t i = buffer_lower_bound(ctx, buf);
    if (i >= ctx->num_buffers || ctx->buffers[i] != buf) return; /* not live: ignore */
    memmove(&ctx->buffers[i], &ctx->buffers[i + 1], (ctx->num_buffers - i - 1) * sizeof *ctx->buffers);
    --ctx->num_buffers;
    live_remove(buf);
    ctx->iface->buffer_destroy(ctx->backend_state, buf->backend_buffer);
    free(buf);
}

uint64_t wkv_buffer_size(const wkv_buffer* buf) { return buf ? buf->size : 0; }

wkv_tensor wkv_tensor_make_buffer(wkv_buffer* buf, uint64_t byte_offset, wkv_dtype dtype,
                                  int32_t ndim, const int64_t* shape) {
    wkv_tensor t = wkv_tensor_make(buf, dtype, ndim, shape);
    t.byte_offset = byte_offset;
    if (buf) {
        wkv_backend be = buf->ctx->target.backend;
        if (be == WKV_BACKEND_VULKAN || be == WKV_BACKEND_CUDA) {
            t.device.type = be == WKV_BACKEND_VULKAN ? WKV_DEVICE_VULKAN : WKV_DEVICE_CUDA;
            t.device.id = buf->ctx->target.device_index;
        }
    }
    return t;
}

/* Upload (to_device = 1) or download. */
static wkv_status buffer_copy(wkv_context* ctx, const char* fn, wkv_buffer* buf, uint64_t offset,
                              void* host, uint64_t bytes, int to_device) {
    wkv_status st = enter(ctx, fn);
    if (st) return st;
    wkv_message m;
    m.text[0] = '\0';
    uint64_t end;
    if (!buf) st = wkv_fail(&m, WKV_ERROR_NULL_POINTER, "buf is NULL");
    else if (!wkv_context_find_buffer(ctx, buf, NULL, NULL))
        st = wkv_fail(&m, WKV_ERROR_INVALID_ARGUMENT, "buf is not a live wkv_buffer of this context");
    else if (!host && bytes) st = wkv_fail(&m, WKV_ERROR_NULL_POINTER, "%s is NULL", to_device ? "src" : "dst");
    else if (__builtin_add_overflow(offset, bytes, &end) || end > buf->size)
        st = wkv_fail(&m, WKV_ERROR_INVALID_ARGUMENT,
                      "[offset %llu, + %llu bytes) is outside the buffer's %llu bytes",
                      (unsigned long long)offset, (unsigned long long)bytes, (unsigned long long)buf->size);
    else if (bytes)
        st = to_device ? ctx->iface->buffer_write(ctx->backend_state, buf->backend_buffer, offset, host, bytes, &m)
                       : ctx->iface->buffer_read(ctx->backend_state, buf->backend_buffer, offset, host, bytes, &m);
    st = finish(ctx, fn, st, &m);
    leave(ctx);
    return st;
}

wkv_status wkv_buffer_upload(wkv_context* ctx, wkv_buffer* buf, uint64_t offset, const void* src,
                             uint64_t bytes) {
    return buffer_copy(ctx, "wkv_buffer_upload", buf, offset, (void*)(uintptr_t)src, bytes, 1);
}

wkv_status wkv_buffer_download(wkv_context* ctx, wkv_buffer* buf, uint64_t offset, void* dst,
                               uint64_t bytes) {
    return buffer_copy(ctx, "wkv_buffer_download", buf, offset, dst, bytes, 0);
}

wkv_status wkv_fail_context_free(wkv_status st, const char* fn, const char* message) {
    return fail_free(st, "%s: %s", fn, message);
}
