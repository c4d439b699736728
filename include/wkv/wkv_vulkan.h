/* libwkv interop with Vulkan: the Vulkan backend's memory model, diagnostics, and guest mode
 * (running inside an application that owns its own VkDevice, such as a game engine).
 *
 * Include after <vulkan/vulkan.h> (or <vulkan/vulkan_core.h>), which defines the Vk types.
 * libwkv itself links no Vulkan library: these calls go to the Vulkan plugin
 * (libwkv_vulkan.so, which loads libvulkan.so.1 at run time).
 *
 * ============================================================================ MEMORY MODEL
 *
 * On a Vulkan context a tensor is one of (see also wkv.h, DEVICE BUFFERS):
 *  (a) host memory, device.type WKV_DEVICE_CPU: the library copies each input's byte span
 *      into a staging buffer and on to the device, and each output's span back after the
 *      dispatches, inside the call. Simple, and slow for large tensors (two copies each way).
 *  (b) a library-owned device buffer, device.type WKV_DEVICE_VULKAN, data = the wkv_buffer*
 *      from wkv_buffer_create(ctx, ...), byte_offset inside it. Device-local memory; nothing
 *      is copied; the state can stay on the GPU across calls. wkv_buffer_upload/download move
 *      bytes (synchronously, through staging).
 *  (c) guest mode (below): the host's own VkBuffer, imported as a wkv_buffer.
 * Tensors of one call may mix (a) and (b). The backward workspace may be a wkv_buffer (used
 * in place) or host memory (then the library uses device scratch of its own, cached per
 * context). Every call of the core API is synchronous: when it returns, the work is done and
 * its outputs are visible to the host and to later Vulkan work.
 *
 * Limits of this version: a tensor's span, and the checkpoints of one sequence of the
 * backward, must each fit one descriptor range (VkPhysicalDeviceLimits::maxStorageBufferRange:
 * 4 GiB on most desktop GPUs, 128 MiB on lavapipe); larger ones return WKV_ERROR_UNSUPPORTED.
 * That bound is also why the shaders index with 32-bit integers. Each wkv_buffer is its own
 * VkDeviceMemory allocation (mind maxMemoryAllocationCount when creating thousands).
 *
 * ============================================================================ ENVIRONMENT
 *
 *   WKV_VULKAN_DEVICE=i            physical device ordinal (vkEnumeratePhysicalDevices order),
 *                                  overriding wkv_context_options.device_index
 *   WKV_VULKAN_VALIDATION=1        enable VK_LAYER_KHRONOS_validation with a debug messenger:
 *                                  each message is printed to stderr and counted, and the call
 *                                  during which one arrived fails with WKV_ERROR_INTERNAL
 *   WKV_VULKAN_NO_16BIT_STORAGE=1  do not use 16-bit storage even when the device has it
 *                                  (float16/bfloat16 then go through 32-bit words)
 *   WKV_VULKAN_SPIN=0|1            how a call waits for its fence: 1 spins on the fence status
 *                                  (the default on GPUs: the calling thread's core is busy
 *                                  while a call runs, and a short call returns ~20 us sooner),
 *                                  0 blocks in vkWaitForFences (the default on CPU devices)
 *   WKV_VULKAN_NO_SUBGROUP=1       forwards without subgroup operations (one invocation per
 *                                  state row; what a device without subgroup shuffles gets)
 *   WKV_VULKAN_LANES=c, WKV_VULKAN_TC=t   the forwards' lanes per state row (1, 2, 4, 8) and
 *                                  tokens per chunk, overriding the choice by shape (tuning and
 *                                  tests; backends/vulkan/DESIGN.md)
 *   WKV_VULKAN_BATCH=n             WKV_CONTEXT_ASYNC: at most n forwards share one command
 *                                  buffer (default 64; 1: each has its own; tuning and tests)
 *   WKV_VULKAN_PROFILE=1           where the host's time per call goes: wkv_context_synchronize
 *                                  prints one line to stderr for the calls since the last one
 *                                  (8 or more; backends/vulkan/DESIGN.md)
 * All of them are read when a context is created.
 *
 * ============================================================================ GUEST MODE
 *
 * libwkv runs on the host's VkDevice (an engine's): examples/vulkan_engine/engine.c is a
 * complete program, backends/vulkan/tests/test_vulkan_guest.cpp the test.
 *
 *   wkv_vulkan_guest_options g = {0};  g.struct_size = sizeof g;
 *   g.instance = inst;  g.physical_device = pd;  g.device = dev;
 *   g.queue_family_index = qf;  g.queue_index = 0;    // used by the synchronous calls only
 *   g.get_instance_proc_addr = vkGetInstanceProcAddr; // optional: the host's loader
 *   wkv_vulkan_context_create(&opt, &g, &ctx);
 *   wkv_vulkan_buffer_import(ctx, state_vkbuffer, state_bytes, &state);   // no copy, not owned
 *   ... tensors as in (b), data = the imported wkv_buffer*
 *   wkv_vulkan_record_forward(ctx, cmd, &fwd);       // records, does not submit or wait
 *
 * The device must have been created with Vulkan 1.1+. Which features the host enabled cannot
 * be queried, so a guest context always uses the shaders that need none (float16/bfloat16
 * tensors through 32-bit words and atomics). Imported buffers need
 * VK_BUFFER_USAGE_STORAGE_BUFFER_BIT (and TRANSFER_SRC/DST for upload/download). The library
 * creates pipelines, descriptor pools and its parameter buffers on the host's device; it never
 * submits to a queue from the record_* entry points.
 *
 * BARRIERS around wkv_vulkan_record_forward / _backward (what the host must do):
 *   before: the tensors' last writes (transfer, compute, ...) made available and visible to
 *           VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT with VK_ACCESS_SHADER_READ_BIT (inputs) and
 *           VK_ACCESS_SHADER_WRITE_BIT (outputs: write-after-read hazards);
 *   after:  the outputs are written by VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT /
 *           VK_ACCESS_SHADER_WRITE_BIT: a barrier from there to the stage that reads them.
 * Inside the recording the library places the barriers its own dispatches need (between
 * workspace batches; and, on a device without host-visible device-local memory, between the
 * parameter block's vkCmdCopyBuffer and the dispatches). Where the device has such memory
 * (discrete GPUs with resizable BAR, integrated GPUs) the parameter block is written there by
 * the record_* call itself, and a forward records no barrier at all: the host's "before"
 * barrier is the only one, so it is required. Host-memory tensors (a) are refused by the record_* entry points
 * (WKV_ERROR_DEVICE_MISMATCH): everything must be in buffers. The command buffer must stay
 * valid until it has executed, and so must the recorded call's buffers; the library's own
 * per-call objects (parameter block, descriptor sets, device scratch for a host-memory
 * workspace) are kept until the next record_* call on ctx: a ring of size 1. Call
 * wkv_vulkan_record_* again only after the previous recording finished executing (so at most
 * one recorded op per command buffer and context), or use one context per op in flight. The
 * synchronous calls (wkv_forward, wkv_backward, wkv_buffer_upload/download) stay available on
 * a guest context; they submit to queue_index of queue_family_index and wait, and use objects
 * of their own, so they do not disturb a recording that has not executed yet.
 * The validation layer is the host's business in guest mode (WKV_VULKAN_VALIDATION applies to
 * the instances libwkv creates; wkv_vulkan_validation_message_count reports 0). */
#ifndef WKV_WKV_VULKAN_H
#define WKV_WKV_VULKAN_H

#include "wkv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* With WKV_VULKAN_VALIDATION=1: how many validation messages ctx's instance has received
 * since it was created (0 when validation is off). WKV_ERROR_INVALID_ARGUMENT when ctx is
 * not on the Vulkan backend. */
WKV_API wkv_status wkv_vulkan_validation_message_count(wkv_context* ctx, uint64_t* out_count);

/* ---- guest mode ---- */

typedef struct wkv_vulkan_guest_options {
    size_t struct_size;          /* sizeof(wkv_vulkan_guest_options) */
    VkInstance instance;
    VkPhysicalDevice physical_device;
    VkDevice device;
    uint32_t queue_family_index; /* a family with VK_QUEUE_COMPUTE_BIT */
    uint32_t queue_index;        /* the queue the synchronous calls submit to; the host must not
                                    use it concurrently with a call on this context */
    PFN_vkGetInstanceProcAddr get_instance_proc_addr; /* optional: NULL = libvulkan.so.1's */
    uint32_t api_version;        /* the VkApplicationInfo::apiVersion the host asked for */
} wkv_vulkan_guest_options;

/* A context on the host's device (backend Vulkan; options->backend must be AUTO or VULKAN).
 * The host keeps ownership of every Vulkan object and destroys them after the context. */
WKV_API wkv_status wkv_vulkan_context_create(const wkv_context_options* options,
                                             const wkv_vulkan_guest_options* guest,
                                             wkv_context** out);
/* A wkv_buffer that is bytes [0, size) of the host's `buffer` (not owned: wkv_buffer_destroy
 * forgets it without destroying the VkBuffer). ctx must be a guest context on the device that
 * owns the buffer (else WKV_ERROR_INVALID_ARGUMENT). */
WKV_API wkv_status wkv_vulkan_buffer_import(wkv_context* ctx, VkBuffer buffer, uint64_t size,
                                            wkv_buffer** out);
/* Record the op into the host's command buffer (in the recording state) instead of running it;
 * see BARRIERS above. Every tensor must be a wkv_buffer (WKV_ERROR_DEVICE_MISMATCH otherwise);
 * a backward workspace may be host memory (the library then uses device scratch of its own,
 * nothing is read from or written to that memory). Works on any Vulkan context, guest or not
 * (cmd must then belong to that context's device, which only a guest context shares). */
WKV_API wkv_status wkv_vulkan_record_forward(wkv_context* ctx, VkCommandBuffer cmd,
                                             const wkv_forward_desc* desc);
WKV_API wkv_status wkv_vulkan_record_backward(wkv_context* ctx, VkCommandBuffer cmd,
                                              const wkv_backward_desc* desc);

#ifdef __cplusplus
}
#endif

#endif /* WKV_WKV_VULKAN_H */
