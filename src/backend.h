/* The contract between the libwkv core and a backend (the built-in CPU one or a plugin).
 *
 * The core validates every public descriptor once and hands the backend a wkv_problem: shapes
 * resolved, every tensor reduced to a base pointer, an element type and four strides in
 * elements, flags such as WKV_FLAG_STATE_KEY_MAJOR already folded into the strides. A backend
 * never re-checks what is described here as guaranteed; it only says "not for this shape"
 * (WKV_ERROR_UNSUPPORTED) for what it does not implement.
 *
 * This header is C, versioned by WKV_BACKEND_ABI_VERSION; bump it on any change of layout or
 * meaning. A plugin exports one symbol, WKV_PLUGIN_ENTRY_SYMBOL, of type wkv_plugin_entry_fn. */
#ifndef WKV_SRC_BACKEND_H
#define WKV_SRC_BACKEND_H

#include <stddef.h>

#include "wkv/wkv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* v2: wkv_problem.save_checkpoints / reuse_checkpoints and wkv_backend_iface.saves_checkpoints
 * (appended; a v1 plugin never sees a workspace in a forward, nor a reuse).
 * v3: wkv_problem.scratch / scratch_size / scratch_mem and wkv_backend_iface.forward_scratch_size
 * (appended; a v2 plugin reports 0 and is never handed a scratch). */
/* v4: wkv_backend_iface.attention and attention_configs, wkv_attention_problem (appended; a v3
 * plugin has no attention: the core answers WKV_ERROR_UNSUPPORTED for it). */
/* v5: wkv_backend_iface.attention_backward, wkv_attention_backward_problem (appended; a v4
 * plugin has no attention backward: the core answers WKV_ERROR_UNSUPPORTED for it). */
#define WKV_BACKEND_ABI_VERSION 5u
/* The oldest backend ABI this core still accepts from a plugin. */
#define WKV_BACKEND_ABI_MIN 1u

typedef enum wkv_elem { WKV_ELEM_F32 = 0, WKV_ELEM_F16 = 1, WKV_ELEM_BF16 = 2 } wkv_elem;

/* One tensor as the backend sees it. Element at logical index (i0, i1, i2, i3) is at
 * data + elem_size * (i0*stride[0] + i1*stride[1] + i2*stride[2] + i3*stride[3]).
 *
 * Logical axes, by role:
 *   per-token tensors (r w k v a b y and their gradients): [b, t, h, n]
 *     RWKV-4: [b, t, 0, c]  (H = 1, N = C)
 *   RWKV-6 u and RWKV-4 w, u: the same per-token axes with stride[0] = stride[1] = 0
 *     (RWKV-4 also stride[2] = 0), so u[h][n] reads as u at (any b, any t, h, n)
 *   RWKV-7/6 state and its gradients: [s, h, i (value), j (key)]
 *   RWKV-4 state: [s, part (0 = aa, 1 = bb, 2 = pp), 0, c]
 * where s is the sequence index (= batch index unless packed).
 * data == NULL means absent (only optional tensors can be absent). For output gradients of
 * broadcast inputs, the core allocates nothing: a gradient is always a full-shape tensor. */
typedef struct wkv_view {
    char* data; /* byte_offset already added */
    wkv_elem elem;
    int64_t stride[4];
} wkv_view;

/* Where a view's memory is (see wkv_problem.mem). Three kinds:
 *   buffer != NULL       a wkv_buffer of this backend (host = 0);
 *   buffer == NULL, host = 1   host memory (device.type WKV_DEVICE_CPU or WKV_DEVICE_CUDA_HOST):
 *                        view.data is a host address. The CPU backend reads it; a GPU backend
 *                        stages it (copies the span [data + lo, data + hi) in, and out again
 *                        for an output);
 *   buffer == NULL, host = 0   memory the backend addresses directly: a device pointer
 *                        (WKV_DEVICE_CUDA, WKV_DEVICE_CUDA_MANAGED) or, on the CPU backend,
 *                        managed memory. */
typedef struct wkv_buffer_ref {
    void* buffer;    /* the backend's buffer handle; NULL = not in a buffer */
    uint64_t offset; /* byte offset of element (0,0,0,0) inside the buffer */
    /* Every byte the view reaches, relative to element (0,0,0,0): [lo, hi), lo <= 0 < hi (a
     * view with negative strides reaches below its first element). Gaps of strided views are
     * inside the range. 0, 0 for an absent view. */
    int64_t lo, hi;
    int32_t host;    /* 1: host memory (above) */
    int32_t reserved_; /* 0 */
} wkv_buffer_ref;
enum { WKV_PROBLEM_VIEWS = 20 }; /* the wkv_view members of wkv_problem */

typedef struct wkv_problem {
    wkv_op op;
    wkv_decay_form decay_form;
    uint32_t flags; /* the caller's flags (already folded into strides; for information) */
    int backward;   /* 0 for wkv_forward, 1 for wkv_backward / wkv_workspace_size */

    int64_t B, T, H, N; /* RWKV-4: H = 1, N = C */

    /* Independent sequences. Not packed: num_seqs = B, seq_offsets = NULL, sequence s is batch
     * s over t in [0, T). Packed: B = 1, sequence s is batch 0 over
     * t in [seq_offsets[s], seq_offsets[s+1]) (host memory, validated non-decreasing 0..T).
     * Use wkv_problem_sequence() below rather than reading these directly. */
    int64_t num_seqs;
    const int64_t* seq_offsets;

    /* Forward inputs/outputs. Absent for an op: data == NULL. */
    wkv_view r, w, k, v, a, b, u;
    wkv_view y;         /* forward only (data NULL in a backward problem) */
    wkv_view state_in;  /* optional: absent = zeros */
    wkv_view state_out; /* optional, forward only; may be exactly state_in (same data+strides) */

    /* Backward only. */
    wkv_view dy;
    wkv_view dstate_out; /* optional: absent = zero */
    wkv_view dr, dw, dk, dv, da, db, du;
    wkv_view dstate_in;  /* optional */
    void* workspace;     /* >= the backend's workspace_size() bytes (checked by the core) */
    size_t workspace_size;

    /* ---- memory (the memory model of wkv.h's DEVICE BUFFERS section) ----
     * Where each view's memory is. mem[i] belongs to the i-th view of this struct in order
     * (r w k v a b u y state_in state_out dy dstate_out dr dw dk dv da db du dstate_in; use
     * wkv_problem_mem()). Always filled for a present view: host, lo, hi as wkv_buffer_ref
     * says. With buffer != NULL the view lives in a wkv_buffer of this backend: `buffer` is
     * the backend's own handle (from buffer_create), `offset` the byte offset of element
     * (0,0,0,0) inside it; the core has checked that every element the view reaches is inside
     * the buffer and that offset is a multiple of the element size. view.data is then non-NULL
     * but NOT an address. Backends without buffer_create never see buffer views. */
    wkv_buffer_ref mem[WKV_PROBLEM_VIEWS];
    /* The workspace (wkv_backward only), likewise, with lo = 0 and hi = workspace_size:
     * buffer != NULL: a wkv_buffer, [0, workspace_size) of it. Otherwise workspace is a
     * pointer, and host = 1 when the core knows it is host memory: always on the CPU backend,
     * and on a backend whose device memory is only wkv_buffers (Vulkan). On CUDA a pointer
     * workspace may be a device or a host pointer (wkv.h gives it no device type): the core
     * sets host = 0 and the plugin asks the driver (cudaPointerGetAttributes). */
    wkv_buffer_ref workspace_mem;

    /* ---- checkpoints saved by the forward (ABI v2; wkv.h's USAGE, Training) ----
     * Forward: 1 when the backend must also write into workspace (workspace_size bytes, at
     * least its workspace_size() for this problem as a backward; memory in workspace_mem) the
     * checkpoints its backward of the same problem would compute, exactly as that backward
     * lays them out. Set by the core only where saves_checkpoints() said yes. Backward: 0. */
    int32_t save_checkpoints;
    /* Backward: 1 when workspace holds the checkpoints a forward with save_checkpoints wrote for
     * this very problem on this context (checked by the core): skip computing them. */
    int32_t reuse_checkpoints;

    /* ---- the caller's forward scratch (ABI v3; wkv_forward_desc.scratch) ----
     * Forward only, and only where forward_scratch_size() said the problem can use some: NULL
     * (the backend finds memory itself), or at least that many bytes (checked by the core:
     * size, aliasing with the views over those bytes, wkv_buffer ownership and range). Its
     * memory in scratch_mem as workspace_mem says (lo = 0, hi = scratch_size): a wkv_buffer
     * (buffer != NULL), or a pointer, with host = 0 on CUDA (the plugin asks the driver and
     * refuses host memory). NULL, 0 in every other problem. */
    void* scratch;
    size_t scratch_size;
    wkv_buffer_ref scratch_mem;
} wkv_problem;

/* The memory of view v (one of p's views). */
static inline const wkv_buffer_ref* wkv_problem_mem(const wkv_problem* p, const wkv_view* v) {
    return &p->mem[((uintptr_t)v - (uintptr_t)&p->r) / sizeof(wkv_view)];
}

/* Batch index and token range [t0, t1) of sequence s. */
static inline void wkv_problem_sequence(const wkv_problem* p, int64_t s, int64_t* batch,
                                        int64_t* t0, int64_t* t1) {
    if (p->seq_offsets) {
        *batch = 0;
        *t0 = p->seq_offsets[s];
        *t1 = p->seq_offsets[s + 1];
    } else {
        *batch = s;
        *t0 = 0;
        *t1 = p->T;
    }
}

/* Softmax attention (wkv.h, attention), validated. Views use the four axes [b, t, h, d]; lse's
 * [b, t, h, 0] (its d stride 0). Packed: B = 1, sequence s has query rows [q_offsets[s],
 * q_offsets[s+1]) and keys [k_offsets[s], k_offsets[s+1]); not packed: num_seqs = B, offsets
 * NULL, every sequence Tq rows and Tk keys. */
typedef struct wkv_attention_problem {
    int64_t B, Tq, Tk, Hq, Hkv, D;
    int64_t num_seqs;
    const int64_t* q_offsets;
    const int64_t* k_offsets;
    int32_t causal;
    float scale; /* resolved: never 0 */
    wkv_view q, k, v, o;
    wkv_view lse; /* optional (data NULL), float32 */
    wkv_buffer_ref mem[5]; /* q, k, v, o, lse */
    const char* config; /* a pinned configuration's name, or NULL */
} wkv_attention_problem;

/* The backward of attention (wkv.h, wkv_attention_backward), validated: fwd is the forward's
 * problem with o and lse (present) as inputs; dout, dq like q, dk and dv like k. */
typedef struct wkv_attention_backward_problem {
    wkv_attention_problem fwd;
    wkv_view dout, dq, dk, dv;
    wkv_view dlse;         /* optional (data NULL), float32, axes as lse's */
    wkv_buffer_ref mem[5]; /* dout, dq, dk, dv, dlse */
} wkv_attention_backward_problem;

/* Batch, query rows [q0, q1) and keys [k0, k1) of sequence s. */
static inline void wkv_attention_sequence(const wkv_attention_problem* p, int64_t s, int64_t* batch,
                                          int64_t* q0, int64_t* q1, int64_t* k0, int64_t* k1) {
    if (p->q_offsets) {
        *batch = 0;
        *q0 = p->q_offsets[s], *q1 = p->q_offsets[s + 1];
        *k0 = p->k_offsets[s], *k1 = p->k_offsets[s + 1];
    } else {
        *batch = s;
        *q0 = 0, *q1 = p->Tq, *k0 = 0, *k1 = p->Tk;
    }
}

/* Where a backend writes why it failed. Always NUL-terminated by the writer. */
typedef struct wkv_message {
    char text[512];
} wkv_message;

/* ---- fault injection (tests; the grammar of WKV_FAULT is in src/fault.h) ----
 * The failure a point simulates, and the point's site name (WKV_FAULT=kind:site@n):
 *   WKV_FAULT_OOM          "state" (a backend's per-context state), "scratch" (scratch or
 *                          staging memory of a call), "buffer" (wkv_buffer_create's memory)
 *   WKV_FAULT_DEVICE_LOST  "submit" (work handed to the device: a CPU op, a CUDA launch or copy,
 *                          vkQueueSubmit), "sync" (waiting for the device: CUDA)
 * (the core's own points: oom "context", "threads"; no_driver "cuda", "vulkan": the loader). */
enum { WKV_FAULT_OOM = 1, WKV_FAULT_DEVICE_LOST = 2, WKV_FAULT_NO_DRIVER = 3 };
typedef int32_t (*wkv_fault_fn)(void* plan, int32_t kind, const char* site);

/* What the core offers a backend at creation. */
typedef struct wkv_backend_create_args {
    uint32_t struct_size;
    int32_t device_index;
    /* Never NULL: the core's thread pool or the host's job system. Calls fn over [0, n). */
    wkv_parallel_for_fn parallel_for;
    void* parallel_for_user_data;
    int32_t num_threads; /* how many workers parallel_for may use (a hint for splitting) */
    /* Vulkan guest mode (wkv_vulkan_context_create): the host's wkv_vulkan_guest_options,
     * NULL otherwise. A trailing field: read it only when struct_size covers it. */
    const void* guest;
    /* 1 when parallel_for is the core's own thread pool, 0 when it is the host's job system.
     * Only with the core's pool may a backend run a small call on the calling thread without
     * calling parallel_for (the host's job system sees every call). A trailing field: read it
     * only when struct_size covers it. */
    int32_t own_pool;
    /* Fault injection (src/fault.h; builds with WKV_FAULT_INJECTION only): the context's plan,
     * NULL when there is none. Trailing fields: read them with wkv_fault_hook_from(). */
    wkv_fault_fn fault;
    void* fault_plan;
    /* wkv_context_options.flags (WKV_CONTEXT_*, checked by the core). A trailing field: read it
     * with wkv_create_flags(). */
    uint64_t context_flags;
} wkv_backend_create_args;

static inline uint64_t wkv_create_flags(const wkv_backend_create_args* a) {
    return a && a->struct_size >= offsetof(wkv_backend_create_args, context_flags) + sizeof(uint64_t)
               ? a->context_flags
               : 0;
}

/* A backend keeps the hook from create() for its calls and asks wkv_fault_hit() at each of its
 * failure points; a hit means "fail here as the real failure would": return the status and
 * message the real failure gives (allocation: WKV_ERROR_OUT_OF_MEMORY; device lost:
 * WKV_ERROR_DEVICE_LOST, and every later call on the context fails the same way). */
typedef struct wkv_fault_hook {
    wkv_fault_fn fn;
    void* plan;
} wkv_fault_hook;

static inline wkv_fault_hook wkv_fault_hook_from(const wkv_backend_create_args* a) {
    wkv_fault_hook h;
    h.fn = NULL;
    h.plan = NULL;
    if (a && a->struct_size >= offsetof(wkv_backend_create_args, fault_plan) + sizeof(void*)) {
        h.fn = a->fault;
        h.plan = a->fault_plan;
    }
    return h;
}

/* Nonzero when the point (kind, site) must fail now. A constant 0 in builds without
 * WKV_FAULT_INJECTION, so the points cost nothing there. */
static inline int wkv_fault_hit(const wkv_fault_hook* h, int32_t kind, const char* site) {
#if defined(WKV_FAULT_INJECTION)
    return h && h->fn && h->fn(h->plan, kind, site) != 0;
#else
    (void)h;
    (void)kind;
    (void)site;
    return 0;
#endif
}

typedef struct wkv_backend_iface {
    uint32_t abi_version; /* WKV_BACKEND_ABI_VERSION the backend was built against */
    uint32_t struct_size; /* sizeof(wkv_backend_iface) it was built with */
    wkv_backend kind;
    const char* name;

    /* Fills out->available/reason/device_count/ops/dtypes/decay_forms/head sizes. Must be cheap
     * after the first call and must not fail hard when the driver is missing: it sets
     * available = 0 and a reason instead. out->struct_size, backend and name are set by the
     * core. */
    void (*probe)(wkv_backend_info* out);
    /* Optional (NULL = no per-device info). */
    wkv_status (*device_info)(int32_t index, wkv_device_info* out, wkv_message* msg);

    wkv_status (*create)(const wkv_backend_create_args* args, void** out_state, wkv_message* msg);
    void (*destroy)(void* state); /* accepts NULL */

    /* The workspace wkv_backward needs for p (p->backward == 1), in bytes; may return
     * WKV_ERROR_UNSUPPORTED with a message. */
    wkv_status (*workspace_size)(void* state, const wkv_problem* p, size_t* out_bytes,
                                 wkv_message* msg);
    wkv_status (*forward)(void* state, const wkv_problem* p, wkv_message* msg);
    wkv_status (*backward)(void* state, const wkv_problem* p, wkv_message* msg);

    /* Optional (NULL = none): backend-specific requests from the interop headers
     * (wkv_cuda.h, wkv_vulkan.h), e.g. WKV_CONTROL_CUDA_SET_STREAM. Unknown requests return
     * WKV_ERROR_UNSUPPORTED. */
    wkv_status (*control)(void* state, int32_t request, void* data, wkv_message* msg);

    /* ---- device buffers (wkv.h's DEVICE BUFFERS section). Optional: all four NULL when
     * the backend has no memory of its own (then wkv_buffer_create is WKV_ERROR_UNSUPPORTED).
     * The core owns the wkv_buffer objects, checks ranges and ownership, and passes the
     * backend's handle. buffer_create returns a zero-filled buffer; read/write are
     * synchronous and get ranges inside the buffer. */
    wkv_status (*buffer_create)(void* state, uint64_t bytes, void** out_buffer, wkv_message* msg);
    void (*buffer_destroy)(void* state, void* buffer);
    wkv_status (*buffer_write)(void* state, void* buffer, uint64_t offset, const void* src,
                               uint64_t bytes, wkv_message* msg);
    wkv_status (*buffer_read)(void* state, void* buffer, uint64_t offset, void* dst,
                              uint64_t bytes, wkv_message* msg);

    /* Optional (NULL = never skipped): nonzero when WKV_BACKEND_AUTO should pass over this
     * available backend (e.g. Vulkan whose only devices are software rasterisers such as
     * lavapipe, slower than the CPU backend); *why says so. An explicit request still gets it. */
    int32_t (*auto_skip)(const char** why);

    /* Optional (NULL = every call is complete when it returns, as on the CPU backend):
     * wkv_context_synchronize — waits until all work this context has enqueued has finished
     * (CUDA: cudaStreamSynchronize on the context's stream). */
    wkv_status (*synchronize)(void* state, wkv_message* msg);

    /* Optional (ABI v2; NULL = never): nonzero when a forward of p (p->backward == 0) can save
     * the checkpoints of its backward (wkv_problem.save_checkpoints) so that this backend's
     * backward reuses them with bit-identical results. Must not depend on anything but p and
     * the context. p->workspace_mem already says which memory the workspace is (a wkv_buffer
     * or a pointer; its size is checked only after a yes). */
    int32_t (*saves_checkpoints)(void* state, const wkv_problem* p);

    /* Optional (ABI v3; NULL = 0 always): the scratch a forward of p (p->backward == 0, with
     * p->save_checkpoints as the forward will have it, p->scratch not yet set) can use, in
     * bytes; 0 when it needs none. Must not depend on anything but p and the context (the
     * caller sizes its memory from it once), nor on p->scratch. */
    wkv_status (*forward_scratch_size)(void* state, const wkv_problem* p, size_t* out_bytes,
                                       wkv_message* msg);

    /* Optional (ABI v4; NULL = no attention): softmax attention (wkv.h, attention) of a problem
     * the core validated; p->config is the pinned configuration's name or NULL. */
    wkv_status (*attention)(void* state, const struct wkv_attention_problem* p, wkv_message* msg);
    /* Optional (ABI v4): the configurations this backend has, as wkv_attention_configs: fills
     * min(capacity, total) entries of out (their struct_size set by the core) and returns the
     * total. */
    int32_t (*attention_configs)(void* state, wkv_attention_config* out, int32_t capacity);

    /* Optional (ABI v5; NULL = none): the backward of attention (wkv.h, wkv_attention_backward)
     * of a problem the core validated. */
    wkv_status (*attention_backward)(void* state, const struct wkv_attention_backward_problem* p,
                                     wkv_message* msg);
} wkv_backend_iface;

/* The sizes of a v1 iface (without saves_checkpoints), a v2 one (without forward_scratch_size),
 * a v3 one (without attention) and a v4 one (without attention_backward), which the core still
 * accepts. */
#define WKV_BACKEND_IFACE_V1_SIZE offsetof(wkv_backend_iface, saves_checkpoints)
#define WKV_BACKEND_IFACE_V2_SIZE offsetof(wkv_backend_iface, forward_scratch_size)
#define WKV_BACKEND_IFACE_V3_SIZE offsetof(wkv_backend_iface, attention)
#define WKV_BACKEND_IFACE_V4_SIZE offsetof(wkv_backend_iface, attention_backward)

/* Requests for wkv_backend_iface.control. Values are part of the backend ABI. */
enum {
    WKV_CONTROL_CUDA_SET_STREAM = 1, /* data: the cudaStream_t (may be NULL = legacy default) */
    WKV_CONTROL_CUDA_GET_STREAM = 2, /* data: cudaStream_t* to fill */
    /* Vulkan (wkv_vulkan.h) */
    WKV_CONTROL_VULKAN_VALIDATION_COUNT = 100, /* data: uint64_t* to fill */
    WKV_CONTROL_VULKAN_BUFFER_IMPORT = 101,    /* data: wkv_vulkan_import_args* */
    WKV_CONTROL_VULKAN_RECORD = 102            /* data: wkv_vulkan_record_args* */
};

/* WKV_CONTROL_VULKAN_BUFFER_IMPORT: wrap the host's VkBuffer (bytes [0, size)) in a backend
 * buffer handle that buffer_destroy forgets without destroying the VkBuffer. */
typedef struct wkv_vulkan_import_args {
    uint64_t vk_buffer; /* the VkBuffer handle */
    uint64_t size;
    void* out_handle;   /* filled by the backend */
} wkv_vulkan_import_args;

/* WKV_CONTROL_VULKAN_RECORD: record p (validated by the core; every present view in a buffer)
 * into the host's command buffer instead of submitting it. */
typedef struct wkv_vulkan_record_args {
    void* cmd; /* VkCommandBuffer, recording */
    const wkv_problem* p;
} wkv_vulkan_record_args;

/* A plugin's single export. Returns NULL when it cannot serve a core of this ABI version. */
typedef const wkv_backend_iface* (*wkv_plugin_entry_fn)(uint32_t core_abi_version);
#define WKV_PLUGIN_ENTRY_SYMBOL "wkv_plugin_entry"

/* Element size in bytes. */
static inline int64_t wkv_elem_size(wkv_elem e) { return e == WKV_ELEM_F32 ? 4 : 2; }

#ifdef __cplusplus
}
#endif

#endif /* WKV_SRC_BACKEND_H */
