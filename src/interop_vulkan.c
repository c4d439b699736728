/* wkv_vulkan.h: forwarded to the Vulkan plugin's control hook. The Vk handle types are only
 * opaque here (the same definitions as vulkan_core.h on 64-bit platforms), so the core needs
 * no Vulkan header. */
#include <stdint.h>

typedef struct VkInstance_T* VkInstance;
typedef struct VkPhysicalDevice_T* VkPhysicalDevice;
typedef struct VkDevice_T* VkDevice;
typedef struct VkCommandBuffer_T* VkCommandBuffer;
typedef struct VkBuffer_T* VkBuffer;
typedef void (*PFN_vkVoidFunction)(void);
typedef PFN_vkVoidFunction (*PFN_vkGetInstanceProcAddr)(VkInstance instance, const char* name);
#include "wkv/wkv_vulkan.h"

#include "context.h"

wkv_status wkv_vulkan_validation_message_count(wkv_context* ctx, uint64_t* out_count) {
    return wkv_context_control(ctx, "wkv_vulkan_validation_message_count", WKV_BACKEND_VULKAN,
                               WKV_CONTROL_VULKAN_VALIDATION_COUNT, (void*)out_count, "out_count");
}

/* ---- guest mode (the design and the contract: wkv_vulkan.h) ---- */

wkv_status wkv_vulkan_context_create(const wkv_context_options* options, const wkv_vulkan_guest_options* guest,
                                     wkv_context** out) {
    if (!out) return wkv_fail_context_free(WKV_ERROR_NULL_POINTER, "wkv_vulkan_context_create", "out is NULL");
    *out = NULL;
    if (guest && (guest->struct_size < sizeof *guest || !guest->instance || !guest->physical_device ||
                  !guest->device))
        return wkv_fail_context_free(WKV_ERROR_INVALID_ARGUMENT, "wkv_vulkan_context_create",
                                     "guest: struct_size, instance, physical_device and device must be set");
    return wkv_context_create_guest(options, guest, "wkv_vulkan_context_create", out);
}

wkv_status wkv_vulkan_buffer_import(wkv_context* ctx, VkBuffer buffer, uint64_t size, wkv_buffer** out) {
    if (out) *out = NULL;
    if (!buffer || size == 0)
        return wkv_fail_context_free(WKV_ERROR_INVALID_ARGUMENT, "wkv_vulkan_buffer_import",
                                     "buffer is VK_NULL_HANDLE or size is 0");
    wkv_vulkan_import_args a;
    a.vk_buffer = (uint64_t)(uintptr_t)buffer;
    a.size = size;
    a.out_handle = NULL;
    return wkv_buffer_create_imported(ctx, "wkv_vulkan_buffer_import", size, WKV_CONTROL_VULKAN_BUFFER_IMPORT, &a,
                                      out);
}

wkv_status wkv_vulkan_record_forward(wkv_context* ctx, VkCommandBuffer cmd, const wkv_forward_desc* desc) {
    return wkv_context_record(ctx, "wkv_vulkan_record_forward", WKV_BACKEND_VULKAN, WKV_CONTROL_VULKAN_RECORD,
                              (void*)cmd, desc, 0);
}

wkv_status wkv_vulkan_record_backward(wkv_context* ctx, VkCommandBuffer cmd, const wkv_backward_desc* desc) {
    return wkv_context_record(ctx, "wkv_vulkan_record_backward", WKV_BACKEND_VULKAN, WKV_CONTROL_VULKAN_RECORD,
                              (void*)cmd, desc, 1);
}
