/* The Vulkan backend's shared pieces: per-context state, buffers, submission, pipelines.
 * Internal to backends/vulkan/. Layout of the files:
 *   vk_loader.c     dlopen of libvulkan.so.1 and the function tables
 *   vk_device.c     probe, device info, instance/device creation, validation messenger
 *   vk_memory.c     buffers (library-owned, staging, scratch), one-shot submission
 *   vk_pipeline.c   the embedded SPIR-V table, descriptor layouts, pipelines per variant
 *   vk_op.c         what every op shares: binding plan, staging, parameter block, descriptors
 *   vk_rwkv7.c      RWKV-7 and RWKV-6 (one structure: N x N state per head): workspace, dispatch
 *   vk_rwkv4.c      RWKV-4: workspace, dispatch
 *   vk_attention.c  softmax attention: configurations, dispatch
 *   vk_backend.c    the plugin's function table and entry point */
#ifndef WKV_VK_INTERNAL_H
#define WKV_VK_INTERNAL_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "vk_loader.h"

#if defined(__GNUC__)
#define WKV_VK_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define WKV_VK_PRINTF(a, b)
#endif

/* printf into msg, prefixed "vulkan backend: "; returns status. */
wkv_status wkv_vk_fail(wkv_message* msg, wkv_status status, const char* fmt, ...) WKV_VK_PRINTF(3, 4);
/* A failed VkResult as a status and message ("what: VK_ERROR_..."). */
wkv_status wkv_vk_result(wkv_message* msg, VkResult r, const char* what);
const char* wkv_vk_result_name(VkResult r);

/* ---------------------------------------------------------------------------- buffers */

typedef struct vkw_buffer {
    VkBuffer buffer;
    VkDeviceMemory memory;
    VkDeviceSize size; /* of the VkBuffer: the requested size rounded up to 4 (>= 16) */
    void* mapped;      /* host-visible buffers stay mapped */
    int imported;      /* guest mode: the host's VkBuffer (not destroyed, memory not ours) */
} vkw_buffer;

/* ---------------------------------------------------------------------------- kernels */

enum {
    WKV_VK_KERNEL_RWKV7_FWD = 0,
    WKV_VK_KERNEL_RWKV7_BWD = 1,
    WKV_VK_KERNEL_RWKV6_FWD = 2,
    WKV_VK_KERNEL_RWKV6_BWD = 3,
    WKV_VK_KERNEL_RWKV4_FWD = 4,
    WKV_VK_KERNEL_RWKV4_BWD = 5,
    WKV_VK_KERNEL_REDUCE = 6, /* the backward's per-sequence partials of du (RWKV-6), dw + du (RWKV-4) */
    WKV_VK_KERNEL_ATTN = 7,   /* softmax attention forward (vk_attention.c) */
    WKV_VK_KERNEL_ATTN_BWD_KV = 8, /* its backward: dk, dv (shaders/attn_bwd.comp, WKV_ATTN_KV) */
    WKV_VK_KERNEL_ATTN_BWD_Q = 9,  /* its backward: dq */
    WKV_VK_KERNELS = 10
};
/* Bindings beyond the tensor slots (binding = slot + 1; 0 is the parameter block). */
enum { WKV_VK_BINDING_CKPT = 21, WKV_VK_BINDING_REPLAY = 22, WKV_VK_BINDING_PART = 23, WKV_VK_MAX_BINDINGS = 24 };
/* The backward's checkpoint interval; shaders/wkv_common.glsl WKV_K. */
enum { WKV_VK_K = 32 };

/* A pipeline's specialisation: head size, tokens per chunk (forwards), lanes per state row
 * (forwards), per-token dtype (forwards; -1: read per slot at run time). */
typedef struct vkw_spec {
    int n, tc, lanes, dtype;
} vkw_spec;

typedef struct vkw_pipeline {
    int kernel;
    vkw_spec spec;
    VkPipeline pipeline;
} vkw_pipeline;

typedef struct vkw_kernel {
    VkShaderModule module;
    VkDescriptorSetLayout set_layout;
    VkPipelineLayout layout;
    uint32_t bindings[WKV_VK_MAX_BINDINGS];
    uint32_t num_bindings;
} vkw_kernel;

/* ---------------------------------------------------------------------------- context */

/* What a recorded forward depends on besides its parameter block (vk_rwkv7.c). */
typedef struct vkw_replay_key {
    int kernel;
    VkPipeline pipeline;
    int64_t items;
    uint64_t epoch, params_bytes, params_offset;
    VkBuffer params_buffer;
    VkBuffer buffer[WKV_PROBLEM_VIEWS];
    VkDeviceSize offset[WKV_PROBLEM_VIEWS], range[WKV_PROBLEM_VIEWS];
} vkw_replay_key;

/* ASYNC CALLS (WKV_CONTEXT_ASYNC). A call on buffers only is recorded and not waited for. What
 * the GPU may still read while it is pending is per call: the command buffer, its fence, the
 * descriptor pool and the parameter block. These form a slot; the context's fields of those
 * names (cmd, fence, desc_pool, params, replay_*, batch_*) are the active slot, and `ring` holds
 * the others. An async call that cannot go into the active slot swaps in the ring's oldest slot
 * (waiting for its fence if it is pending too), so up to WKV_VK_SLOTS command buffers are in
 * flight. Each slot keeps its own recorded command buffer for replay.
 *   What a step costs the GPU depends on how calls are packed: on NVIDIA's driver (H100) a
 * decode step costs ~8 us when steps follow each other inside one command buffer, ~17 us when
 * each is a command buffer of its own, ~22 us when each is also a submission of its own
 * (DESIGN.md, async calls). So:
 *   - a forward made while the GPU is busy is recorded into the active slot's command buffer,
 *     which stays open (WKV_VK_OPEN) for the next forwards, up to batch_max calls and as long
 *     as the slot's descriptor pool and parameter block have room (each call has its own set
 *     and its own region of the block; the full barrier that starts every call orders it after
 *     the previous one, as between command buffers);
 *   - a command buffer is ended and submitted as soon as a call finds the GPU dry (the newest
 *     submission's fence has signalled) or it holds batch_max calls; otherwise an ended one is
 *     queued (WKV_VK_QUEUED), and the queued ones go in one vkQueueSubmit (in call order, one
 *     fence: the newest's, which the others wait on) with the next submission, when a slot must
 *     be reused, or when anything waits (vkw_drain, which ends an open one first).
 * While the GPU is busy, calls thus gather into long command buffers on their own; when it is
 * idle a call is submitted at once (and replays its slot's recording when the bindings match).
 * A synchronous call or transfer first waits for every pending slot (vkw_drain), so that the
 * shared staging, mirror and scratch buffers are free; dependencies between calls are the full
 * barrier each call begins with, whose first scope covers every earlier command on the queue. */
enum { WKV_VK_SLOTS = 8 };
enum { WKV_VK_QUEUED = 1, WKV_VK_SUBMITTED = 2, WKV_VK_OPEN = 3 };
/* Calls per command buffer at most (WKV_VULKAN_BATCH overrides: tests, tuning). */
enum { WKV_VK_BATCH_MAX = 64 };
typedef struct vkw_slot {
    VkCommandBuffer cmd;
    VkFence fence;
    VkDescriptorPool desc_pool;
    uint32_t desc_pool_sets;
    vkw_buffer params;
    int pending;      /* WKV_VK_OPEN, WKV_VK_QUEUED or WKV_VK_SUBMITTED, 0: free */
    VkFence wait;     /* submitted: the fence of its submission (its own, or a later slot's) */
    int replay_valid;
    vkw_replay_key replay_key;
    uint32_t batch_calls, batch_sets; /* calls and descriptor sets in cmd since it began */
    uint64_t batch_params;            /* bytes of params in use by them */
} vkw_slot;

/* WKV_VULKAN_PROFILE=1: where a call's host time goes. The host's time is split into exclusive
 * phases (vkw_prof_enter switches phase); wkv_context_synchronize after 8 or more calls prints
 * the calls since the previous synchronize as one line to stderr (DESIGN.md, decode). Off: one
 * branch per phase switch. */
enum { WKV_VK_PROF_IDLE, WKV_VK_PROF_GAP, WKV_VK_PROF_BEGIN, WKV_VK_PROF_WAIT, WKV_VK_PROF_PLAN,
       WKV_VK_PROF_RECORD, WKV_VK_PROF_POLL, WKV_VK_PROF_SUBMIT, WKV_VK_PROF_SYNC, WKV_VK_PROF_PHASES };
typedef struct vkw_profile {
    uint64_t ns[WKV_VK_PROF_PHASES];
    uint64_t calls, appended, replayed, submits, submitted_cmds, polls, waits;
    uint64_t t; /* when the current phase began */
    int phase;
} vkw_profile;

typedef struct wkv_vk_state {
    const wkv_vk_global* g;
    VkInstance instance;
    wkv_vk_instance_fns ifn;
    VkDebugUtilsMessengerEXT messenger;
    VkPhysicalDevice phys;
    VkPhysicalDeviceProperties props;
    VkPhysicalDeviceMemoryProperties mem_props;
    VkDevice device;
    wkv_vk_device_fns fn;
    uint32_t queue_family;
    VkQueue queue;
    int storage16; /* 16-bit storage enabled: the *_s16 shader variants */
    int max_n;     /* largest head size the limits allow */
    int rolled;    /* the *_rolled shader variants (CPU implementations; WKV_VULKAN_ROLLED) */
    int spin_wait; /* fence waits spin on vkGetFenceStatus (GPUs; WKV_VULKAN_SPIN) */
    int subgroup_shuffle; /* compute shaders have subgroupShuffleXor (else the *_nosg forwards) */
    int subgroup_size;
    int knob_lanes, knob_tc; /* WKV_VULKAN_LANES, WKV_VULKAN_TC (0: unset; tests, tuning) */

    VkCommandPool cmd_pool;
    VkCommandBuffer cmd;
    VkFence fence;
    VkDescriptorPool desc_pool;
    uint32_t desc_pool_sets;

    /* The last forward's command buffer, submitted again as it is when the next forward binds
     * the same buffers in the same way (a decode loop on wkv_buffers): no descriptor writes and
     * no recording (vk_rwkv7.c). Recording anything else into cmd (vkw_begin) clears
     * replay_valid; destroying any buffer bumps buffer_epoch, which is part of the key, so a
     * new buffer that happens to get a freed one's handle never matches. */
    int replay_valid;
    uint64_t buffer_epoch;
    vkw_replay_key replay_key;
    uint32_t batch_calls, batch_sets;
    uint64_t batch_params;

    /* Async calls (above): the active slot's submission is not waited for yet; the other slots;
     * the next one to swap in; whether the context was created async and whether the current
     * call runs so; a failure of pending work found where it could not be returned
     * (wkv_buffer_destroy), returned by the next call or synchronize. */
    int pending;
    VkFence wait;
    vkw_slot ring[WKV_VK_SLOTS - 1];
    VkFence newest; /* the newest submission's fence (VK_NULL_HANDLE once it was waited for) */
    int ring_next;
    int async, call_async;
    /* This call: records into the open command buffer (appending), or may leave its command
     * buffer open for the next calls (batching: a forward while the GPU is busy). */
    int appending, batching;
    uint32_t batch_max; /* WKV_VK_BATCH_MAX, or WKV_VULKAN_BATCH (1: never append) */
    wkv_status deferred;
    char deferred_text[256];

    vkw_kernel kernels[WKV_VK_KERNELS];
    vkw_pipeline* pipelines;
    size_t num_pipelines, cap_pipelines;

    /* Cached, grown on demand: host-visible staging, its device mirror for host tensors and
     * the parameter block, device scratch for a host-memory workspace, a 16-byte dummy. */
    vkw_buffer staging, mirror, scratch, dummy;
    /* The parameter block of a call without host tensors, written in place (no copy, no
     * barrier) when the device has host-visible device-local memory; params_direct = 0 once
     * it turned out not to. */
    vkw_buffer params;
    int params_direct;

    /* Guest mode (wkv_vulkan.h): instance and device are the host's (never destroyed here);
     * g points at guest_g when the host gave its vkGetInstanceProcAddr. */
    int guest;
    wkv_vk_global guest_g;
    /* While an op is recorded into the host's command buffer (wkv_vulkan_record_*): cmd is
     * the host's, vkw_begin / vkw_submit_wait neither begin nor submit, and the op uses the
     * rec_* set of cached objects (swapped in), so that synchronous calls made before the
     * host's command buffer runs do not overwrite what it reads. */
    int recording;
    vkw_buffer rec_staging, rec_mirror, rec_scratch, rec_params;
    VkDescriptorPool rec_desc_pool;
    uint32_t rec_desc_pool_sets;

    /* WKV_FAULT (src/fault.h, test builds only): oom "scratch" (vkw_buffer_reserve growing),
     * "buffer" (wkv_buffer_create), device_lost "submit" (vkQueueSubmit). A hit returns the
     * VkResult the real failure gives. */
    wkv_fault_hook fault;

    int profiling; /* WKV_VULKAN_PROFILE=1 */
    vkw_profile prof;

    /* WKV_VULKAN_VALIDATION=1: messages counted by the messenger; an op fails on a new one. */
    int validation;
    atomic_ullong validation_count;
    unsigned long long validation_seen;
    char validation_first[512];
} wkv_vk_state;

/* vk_memory.c: profiling (WKV_VULKAN_PROFILE). Switches to phase; returns the phase left. */
int vkw_prof_switch(wkv_vk_state* st, int phase);
static inline int vkw_prof_enter(wkv_vk_state* st, int phase) {
    return st->profiling ? vkw_prof_switch(st, phase) : 0;
}
/* wkv_context_synchronize: prints the calls since the last one (8 or more), starts anew. */
void vkw_prof_report(wkv_vk_state* st);

/* Swaps two lvalues of type T (the recording objects, async slots). */
#define WKV_VK_SWAP(T, a, b) \
    do {                     \
        T t_ = (a);          \
        (a) = (b);           \
        (b) = t_;            \
    } while (0)

/* vk_device.c */
void wkv_vk_probe(wkv_backend_info* out);
int32_t wkv_vk_auto_skip(const char** why);
wkv_status wkv_vk_device_info(int32_t index, wkv_device_info* out, wkv_message* msg);
wkv_status wkv_vk_create(const wkv_backend_create_args* args, void** out_state, wkv_message* msg);
void wkv_vk_destroy(void* state);
/* WKV_ERROR_INTERNAL when the validation layer has said something since the last check. */
wkv_status wkv_vk_check_validation(wkv_vk_state* st, wkv_message* msg);
/* Guest mode: records p into the host's command buffer (WKV_CONTROL_VULKAN_RECORD). */
wkv_status wkv_vk_record(wkv_vk_state* st, void* cmd, const wkv_problem* p, wkv_message* msg);
/* Guest mode: wraps the host's VkBuffer (WKV_CONTROL_VULKAN_BUFFER_IMPORT). */
wkv_status wkv_vk_buffer_import(wkv_vk_state* st, uint64_t vk_buffer, uint64_t size, void** out, wkv_message* msg);
/* The head sizes the device's limits allow (shared memory, workgroup size). */
int wkv_vk_head_size_ok(const VkPhysicalDeviceLimits* lim, int64_t n);

/* vk_memory.c */
/* HOST_DEVICE: host-visible, coherent and device-local (a GPU's BAR memory), or nothing. */
enum { WKV_VK_DEVICE_LOCAL = 0, WKV_VK_HOST_VISIBLE = 1, WKV_VK_HOST_DEVICE = 2 };
wkv_status vkw_buffer_create(wkv_vk_state* st, VkDeviceSize bytes, int where, vkw_buffer* out, wkv_message* msg);
void vkw_buffer_destroy(wkv_vk_state* st, vkw_buffer* b);
/* Makes a cached buffer at least `bytes` big (contents are lost when it grows). */
wkv_status vkw_buffer_reserve(wkv_vk_state* st, vkw_buffer* b, VkDeviceSize bytes, int where, wkv_message* msg);
/* Command buffer: begin (after a full barrier from earlier work), then submit + wait. */
wkv_status vkw_begin(wkv_vk_state* st, wkv_message* msg);
/* Submits the command buffer as it was last ended, and waits for it. */
wkv_status vkw_resubmit_wait(wkv_vk_state* st, wkv_message* msg);
wkv_status vkw_submit_wait(wkv_vk_state* st, wkv_message* msg);
/* The same; host_reads = 0: the host reads nothing the command buffer wrote (no HOST barrier). */
wkv_status vkw_submit_wait_reads(wkv_vk_state* st, int host_reads, wkv_message* msg);
/* (vkw_submit_wait and vkw_resubmit_wait only submit when st->call_async: the slot is pending.) */
/* Starts a backend call: async (the context is async and the call's memory is all buffers):
 * makes a free slot active; otherwise waits for every pending slot. Returns a deferred error. */
wkv_status vkw_call_begin(wkv_vk_state* st, int async, wkv_message* msg);
/* The same for a call that may be appended to the open command buffer (a forward; ASYNC CALLS):
 * params_bytes, the size of its parameter block; 0: it may not. */
wkv_status vkw_call_begin_append(wkv_vk_state* st, int async, uint64_t params_bytes, wkv_message* msg);
/* Waits for every pending slot (wkv_context_synchronize). */
wkv_status vkw_drain(wkv_vk_state* st, wkv_message* msg);
/* Frees the ring's slots (context destruction, after the device is idle). */
void vkw_ring_destroy(wkv_vk_state* st);
/* A buffer memory barrier on the whole of b. */
void vkw_barrier(wkv_vk_state* st, VkPipelineStageFlags src, VkAccessFlags src_access,
                 VkPipelineStageFlags dst, VkAccessFlags dst_access);
/* The plugin's buffer entry points (wkv_buffer_*). */
wkv_status wkv_vk_buffer_create(void* state, uint64_t bytes, void** out, wkv_message* msg);
void wkv_vk_buffer_destroy(void* state, void* buffer);
wkv_status wkv_vk_buffer_write(void* state, void* buffer, uint64_t offset, const void* src, uint64_t bytes, wkv_message* msg);
wkv_status wkv_vk_buffer_read(void* state, void* buffer, uint64_t offset, void* dst, uint64_t bytes, wkv_message* msg);

/* vk_pipeline.c */
wkv_status wkv_vk_kernels_create(wkv_vk_state* st, wkv_message* msg);
void wkv_vk_kernels_destroy(wkv_vk_state* st);
/* The pipeline of kernel for a specialisation, created on first use. */
wkv_status wkv_vk_pipeline(wkv_vk_state* st, int kernel, vkw_spec spec, VkPipeline* out, wkv_message* msg);
/* The specialisation of kernels that take only the head size n (0: none). */
vkw_spec wkv_vk_spec_n(int n);
/* Descriptor sets for one op: `count` sets of kernel's layout, then (last_kernel >= 0) one set of
 * last_kernel's layout at out[count] (the pool is reset first). */
wkv_status wkv_vk_descriptor_sets(wkv_vk_state* st, int kernel, uint32_t count, int last_kernel,
                                  VkDescriptorSet* out, wkv_message* msg);

/* vk_op.c: one op call's plan. Tensor slots: the order of wkv_problem's views (also
 * shaders/wkv_common.glsl SLOT_*). */
enum { S_R, S_W, S_K, S_V, S_A, S_B, S_U, S_Y, S_SIN, S_SOUT, S_DY, S_DSOUT, S_DR, S_DW, S_DK,
       S_DV, S_DA, S_DB, S_DU, S_DSIN };

/* shaders/wkv_common.glsl: TensorDesc, the Params header (std430) and the push constants. */
typedef struct gpu_tensor {
    int32_t base, dtype, present, pad;
    int32_t stride[4];
} gpu_tensor;
typedef struct gpu_header {
    int32_t B, T, H, N, num_seqs, form, flags, op;
} gpu_header;
typedef struct gpu_push {
    int32_t item_base, ck_first, ck_shift, rep_stride;
} gpu_push;

typedef struct slot_plan {
    int used, present, host, output;
    const char* host_lo; /* host: the address of the span's first byte */
    uint64_t bytes;      /* host: span length */
    uint64_t region;     /* host: offset of the span in staging / mirror */
    VkBuffer buffer;     /* bound buffer (mirror for host tensors) */
    VkDeviceSize offset, range;
    gpu_tensor d;
} slot_plan;

typedef struct op_plan {
    slot_plan slot[WKV_PROBLEM_VIEWS];
    int64_t S;
    uint64_t params_bytes, total; /* staging / mirror layout (total 0: nothing to copy) */
    VkBuffer params_buffer;       /* where the parameter block is bound: mirror or params */
    uint64_t params_offset;       /* ... at this offset (an appended call's region of params) */
} op_plan;

uint64_t wkv_vk_align_up(uint64_t x, uint64_t a);
uint64_t wkv_vk_offset_alignment(const wkv_vk_state* st);
/* The size of p's parameter block (shaders/wkv_common.glsl Params). */
uint64_t wkv_vk_params_bytes(const wkv_problem* p);
/* Plans one tensor of extent ext (along its view's four axes) into sp: its span, where it is
 * bound (in place for a wkv_buffer, else staged), its shader descriptor. */
wkv_status wkv_vk_plan_view(wkv_vk_state* st, const wkv_view* v, const wkv_buffer_ref* mem, const int64_t ext[4],
                            slot_plan* sp, const char* name, int output, wkv_message* msg);
/* Writes an op's parameter block (op->params_bytes bytes) at dst. */
typedef void (*wkv_vk_params_writer)(char* dst, const op_plan* op, const void* data);
/* With op's slots planned: places the parameter block (in place when nothing is in host
 * memory and the device allows, else in staging) and lays out and fills staging. */
wkv_status wkv_vk_stage(wkv_vk_state* st, op_plan* op, wkv_vk_params_writer write, const void* data,
                        wkv_message* msg);
/* Plans the kernel's slots, lays out and fills staging (params + host spans); seg0: per
 * sequence, its first checkpoint segment (backward) or NULL. */
wkv_status wkv_vk_prepare(wkv_vk_state* st, const wkv_problem* p, op_plan* op, const int* in_slots, int n_in,
                          const int* out_slots, int n_out, const int64_t* seg0, wkv_message* msg);
/* Writes the descriptors of `set` for kernel: the parameter block, its slots, and (when the
 * kernel has them) the checkpoint, replay and partials ranges. */
void wkv_vk_write_set(wkv_vk_state* st, int kernel, VkDescriptorSet set, const op_plan* op,
                      const VkDescriptorBufferInfo* ck, const VkDescriptorBufferInfo* rep,
                      const VkDescriptorBufferInfo* part);
/* Begins the command buffer: staging -> mirror, barrier. */
wkv_status wkv_vk_record_upload(wkv_vk_state* st, const op_plan* op, wkv_message* msg);
/* Ends it: host outputs back to staging; submit, wait, copy them to the caller's memory. */
wkv_status wkv_vk_finish_and_download(wkv_vk_state* st, const op_plan* op, wkv_message* msg);
/* A compute -> compute barrier between dependent dispatches. */
void wkv_vk_compute_barrier(wkv_vk_state* st);
/* The longest sequence of p. */
int64_t wkv_vk_longest(const wkv_problem* p);

/* vk_rwkv7.c (RWKV-7 and RWKV-6) */
wkv_status wkv_vk_rwkv7_forward(wkv_vk_state* st, const wkv_problem* p, wkv_message* msg);
wkv_status wkv_vk_rwkv7_backward(wkv_vk_state* st, const wkv_problem* p, wkv_message* msg);
wkv_status wkv_vk_rwkv7_workspace_size(wkv_vk_state* st, const wkv_problem* p, size_t* out, wkv_message* msg);
/* vk_rwkv4.c */
wkv_status wkv_vk_rwkv4_forward(wkv_vk_state* st, const wkv_problem* p, wkv_message* msg);
wkv_status wkv_vk_rwkv4_backward(wkv_vk_state* st, const wkv_problem* p, wkv_message* msg);
wkv_status wkv_vk_rwkv4_workspace_size(wkv_vk_state* st, const wkv_problem* p, size_t* out, wkv_message* msg);
/* vk_attention.c */
wkv_status wkv_vk_attention(void* state, const wkv_attention_problem* p, wkv_message* msg);
wkv_status wkv_vk_attention_backward(void* state, const struct wkv_attention_backward_problem* p, wkv_message* msg);
int32_t wkv_vk_attention_configs(void* state, wkv_attention_config* out, int32_t capacity);
/* The forward's specialisation for p: lanes per row, tokens per chunk, dtype (vk_rwkv7.c). */
vkw_spec wkv_vk_forward_spec(const wkv_vk_state* st, const wkv_problem* p);
/* An integer knob from the environment, 1..1024, else 0 (read when a context is created). */
int wkv_vk_env_knob(const char* name);

#endif
