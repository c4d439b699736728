/* The Vulkan plugin's function table and its one export, wkv_plugin_entry. */
#include <string.h>

#include "vk_internal.h"

static wkv_status vk_workspace_size(void* state, const wkv_problem* p, size_t* out, wkv_message* msg) {
    if (p->op == WKV_OP_RWKV4) return wkv_vk_rwkv4_workspace_size((wkv_vk_state*)state, p, out, msg);
    return wkv_vk_rwkv7_workspace_size((wkv_vk_state*)state, p, out, msg); /* RWKV-7 and RWKV-6 */
}

/* 1 when every present tensor and the workspace are wkv_buffers: the call may be enqueued
 * (WKV_CONTEXT_ASYNC); a host tensor is staged through the shared buffers and copied back. */
static int buffers_only(const wkv_problem* p) {
    for (int i = 0; i < WKV_PROBLEM_VIEWS; ++i)
        if ((&p->r)[i].data && !p->mem[i].buffer) return 0;
    if (p->backward && p->workspace && !p->workspace_mem.buffer) return 0;
    return 1;
}

/* The one place that picks an op's kernels: a call (vk_call) and a guest recording
 * (wkv_vk_record) both come here. */
static wkv_status run_op(wkv_vk_state* st, const wkv_problem* p, wkv_message* msg) {
    if (p->backward)
        return p->op == WKV_OP_RWKV4 ? wkv_vk_rwkv4_backward(st, p, msg) : wkv_vk_rwkv7_backward(st, p, msg);
    return p->op == WKV_OP_RWKV4 ? wkv_vk_rwkv4_forward(st, p, msg) : wkv_vk_rwkv7_forward(st, p, msg);
}

/* Guest mode: the op recorded into the host's command buffer, with the recording's own
 * staging, mirror, scratch, parameters and descriptor pool swapped in. */
static void swap_record_objects(wkv_vk_state* st) {
    WKV_VK_SWAP(vkw_buffer, st->staging, st->rec_staging);
    WKV_VK_SWAP(vkw_buffer, st->mirror, st->rec_mirror);
    WKV_VK_SWAP(vkw_buffer, st->scratch, st->rec_scratch);
    WKV_VK_SWAP(vkw_buffer, st->params, st->rec_params);
    WKV_VK_SWAP(VkDescriptorPool, st->desc_pool, st->rec_desc_pool);
    WKV_VK_SWAP(uint32_t, st->desc_pool_sets, st->rec_desc_pool_sets);
}

wkv_status wkv_vk_record(wkv_vk_state* st, void* cmd, const wkv_problem* p, wkv_message* msg) {
    /* The host's command buffer may run on another queue: our enqueued work first. */
    wkv_status s = vkw_drain(st, msg);
    if (s) return s;
    const VkCommandBuffer own = st->cmd;
    swap_record_objects(st);
    st->cmd = (VkCommandBuffer)cmd;
    st->recording = 1;
    s = run_op(st, p, msg);
    st->recording = 0;
    st->cmd = own;
    swap_record_objects(st);
    return s;
}

static wkv_status vk_call(wkv_vk_state* st, const wkv_problem* p, wkv_message* msg) {
    vkw_prof_enter(st, WKV_VK_PROF_BEGIN);
    st->prof.calls++;
    /* a forward may go into the open command buffer of earlier ones (vk_internal.h, ASYNC CALLS) */
    wkv_status s = vkw_call_begin_append(st, buffers_only(p), p->backward ? 0 : wkv_vk_params_bytes(p), msg);
    vkw_prof_enter(st, WKV_VK_PROF_PLAN);
    if (s == WKV_OK) s = run_op(st, p, msg);
    st->call_async = st->appending = st->batching = 0;
    vkw_prof_enter(st, WKV_VK_PROF_GAP);
    return s;
}

static wkv_status vk_forward(void* state, const wkv_problem* p, wkv_message* msg) {
    return vk_call((wkv_vk_state*)state, p, msg);
}

static wkv_status vk_backward(void* state, const wkv_problem* p, wkv_message* msg) {
    return vk_call((wkv_vk_state*)state, p, msg);
}

static wkv_status vk_synchronize(void* state, wkv_message* msg) {
    wkv_vk_state* st = (wkv_vk_state*)state;
    vkw_prof_enter(st, WKV_VK_PROF_SYNC);
    wkv_status s = vkw_call_begin(st, 0, msg); /* a deferred failure, or the wait for every pending call */
    if (st->profiling) {
        vkw_prof_enter(st, WKV_VK_PROF_GAP);
        vkw_prof_report(st);
    }
    return s;
}

static wkv_status vk_control(void* state, int32_t request, void* data, wkv_message* msg) {
    wkv_vk_state* st = (wkv_vk_state*)state;
    switch (request) {
    case WKV_CONTROL_VULKAN_VALIDATION_COUNT:
        *(uint64_t*)data = st->validation ? (uint64_t)atomic_load(&st->validation_count) : 0;
        return WKV_OK;
    case WKV_CONTROL_VULKAN_BUFFER_IMPORT: {
        wkv_vulkan_import_args* a = (wkv_vulkan_import_args*)data;
        return wkv_vk_buffer_import(st, a->vk_buffer, a->size, &a->out_handle, msg);
    }
    case WKV_CONTROL_VULKAN_RECORD: {
        const wkv_vulkan_record_args* a = (const wkv_vulkan_record_args*)data;
        return wkv_vk_record(st, a->cmd, a->p, msg);
    }
    default:
        return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED, "control request %d is not known", (int)request);
    }
}

static const wkv_backend_iface k_iface = {
    /* .abi_version    = */ WKV_BACKEND_ABI_VERSION,
    /* .struct_size    = */ (uint32_t)sizeof(wkv_backend_iface),
    /* .kind           = */ WKV_BACKEND_VULKAN,
    /* .name           = */ "vulkan",
    /* .probe          = */ wkv_vk_probe,
    /* .device_info    = */ wkv_vk_device_info,
    /* .create         = */ wkv_vk_create,
    /* .destroy        = */ wkv_vk_destroy,
    /* .workspace_size = */ vk_workspace_size,
    /* .forward        = */ vk_forward,
    /* .backward       = */ vk_backward,
    /* .control        = */ vk_control,
    /* .buffer_create  = */ wkv_vk_buffer_create,
    /* .buffer_destroy = */ wkv_vk_buffer_destroy,
    /* .buffer_write   = */ wkv_vk_buffer_write,
    /* .buffer_read    = */ wkv_vk_buffer_read,
    /* .auto_skip      = */ wkv_vk_auto_skip,
    /* .synchronize    = */ vk_synchronize, /* WKV_CONTEXT_ASYNC: waits for the enqueued calls */
    /* .saves_checkpoints = */ NULL, /* the forward ignores a workspace; backward recomputes */
    /* .forward_scratch_size = */ NULL, /* the forwards need no scratch */
    /* .attention      = */ wkv_vk_attention,
    /* .attention_configs = */ wkv_vk_attention_configs,
    /* .attention_backward = */ wkv_vk_attention_backward,
};

__attribute__((visibility("default"))) const wkv_backend_iface* wkv_plugin_entry(uint32_t core_abi) {
    if (core_abi < WKV_BACKEND_ABI_VERSION) return NULL; /* a core older than this plugin */
    return &k_iface;
}
