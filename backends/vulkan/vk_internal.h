/* The Vulkan backend's shared pieces: per-context state, buffers, submission, pipelines.
 * Internal to backends/vulkan/. Layout of the files:
 *   vk_loader.c     dlopen of libvulkan.so.1 and the function tables
 *   vk_device.c     probe, device info, instance/device creation, validation messenger
 *   vk_memory.c     buffers (library-owned, staging, scratch), one-shot submission
 *   vk_pipeline.c   the embedded SPIR-V table, descriptor layouts, pipelines per variant
 *   vk_rwkv7.c      the RWKV-7 op: binding plan, parameter block, workspace, dispatch
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
} vkw_buffer;

/* ---------------------------------------------------------------------------- kernels */

enum { WKV_VK_KERNEL_RWKV7_FWD = 0, WKV_VK_KERNEL_RWKV7_BWD = 1, WKV_VK_KERNELS = 2 };
/* Bindings beyond the tensor slots (binding = slot + 1; 0 is the parameter block). */
enum { WKV_VK_BINDING_CKPT = 21, WKV_VK_BINDING_REPLAY = 22, WKV_VK_MAX_BINDINGS = 23 };
/* The backward's checkpoint interval; shaders/wkv_common.glsl WKV_K. */
enum { WKV_VK_K = 32 };

typedef struct vkw_pipeline {
    int kernel, n, tc;
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

    VkCommandPool cmd_pool;
    VkCommandBuffer cmd;
    VkFence fence;
    VkDescriptorPool desc_pool;
    uint32_t desc_pool_sets;

    vkw_kernel kernels[WKV_VK_KERNELS];
    vkw_pipeline* pipelines;
    size_t num_pipelines, cap_pipelines;

    /* Cached, grown on demand: host-visible staging, its device mirror for host tensors and
     * the parameter block, device scratch for a host-memory workspace, a 16-byte dummy. */
    vkw_buffer staging, mirror, scratch, dummy;

    /* WKV_VULKAN_VALIDATION=1: messages counted by the messenger; an op fails on a new one. */
    int validation;
    atomic_ullong validation_count;
    unsigned long long validation_seen;
    char validation_first[512];
} wkv_vk_state;

/* vk_device.c */
void wkv_vk_probe(wkv_backend_info* out);
int32_t wkv_vk_auto_skip(const char** why);
wkv_status wkv_vk_device_info(int32_t index, wkv_device_info* out, wkv_message* msg);
wkv_status wkv_vk_create(const wkv_backend_create_args* args, void** out_state, wkv_message* msg);
void wkv_vk_destroy(void* state);
/* WKV_ERROR_INTERNAL when the validation layer has said something since the last check. */
wkv_status wkv_vk_check_validation(wkv_vk_state* st, wkv_message* msg);
/* The head sizes the device's limits allow (shared memory, workgroup size). */
int wkv_vk_head_size_ok(const VkPhysicalDeviceLimits* lim, int64_t n);

/* vk_memory.c */
enum { WKV_VK_DEVICE_LOCAL = 0, WKV_VK_HOST_VISIBLE = 1 };
wkv_status vkw_buffer_create(wkv_vk_state* st, VkDeviceSize bytes, int where, vkw_buffer* out, wkv_message* msg);
void vkw_buffer_destroy(wkv_vk_state* st, vkw_buffer* b);
/* Makes a cached buffer at least `bytes` big (contents are lost when it grows). */
wkv_status vkw_buffer_reserve(wkv_vk_state* st, vkw_buffer* b, VkDeviceSize bytes, int where, wkv_message* msg);
/* Command buffer: begin (after a full barrier from earlier work), then submit + wait. */
wkv_status vkw_begin(wkv_vk_state* st, wkv_message* msg);
wkv_status vkw_submit_wait(wkv_vk_state* st, wkv_message* msg);
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
/* The pipeline of kernel for head size n (and tokens per chunk tc, forward), created on first use. */
wkv_status wkv_vk_pipeline(wkv_vk_state* st, int kernel, int n, int tc, VkPipeline* out, wkv_message* msg);
/* Descriptor sets for one op: `count` sets of kernel's layout (the pool is reset first). */
wkv_status wkv_vk_descriptor_sets(wkv_vk_state* st, int kernel, uint32_t count, VkDescriptorSet* out, wkv_message* msg);

/* vk_rwkv7.c */
wkv_status wkv_vk_rwkv7_forward(wkv_vk_state* st, const wkv_problem* p, wkv_message* msg);
wkv_status wkv_vk_rwkv7_backward(wkv_vk_state* st, const wkv_problem* p, wkv_message* msg);
wkv_status wkv_vk_rwkv7_workspace_size(wkv_vk_state* st, const wkv_problem* p, size_t* out, wkv_message* msg);
/* Tokens per shared-memory chunk of the forward for head size n. */
int wkv_vk_forward_tc(const VkPhysicalDeviceLimits* lim, int64_t n);

#endif
