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

/* ---- guest mode: designed in wkv_vulkan.h, not implemented yet ---- */

static wkv_status guest_unsupported(const char* fn) {
    return wkv_fail_context_free(WKV_ERROR_UNSUPPORTED, fn,
                                 "Vulkan guest mode is designed (wkv_vulkan.h) but not implemented yet");
}

wkv_status wkv_vulkan_context_create(const wkv_context_options* options, const wkv_vulkan_guest_options* guest,
                                     wkv_context** out) {
    (void)options;
    (void)guest;
    if (out) *out = NULL;
    return guest_unsupported("wkv_vulkan_context_create");
}

wkv_status wkv_vulkan_buffer_import(wkv_context* ctx, VkBuffer buffer, uint64_t size, wkv_buffer** out) {
    (void)ctx;
    (void)buffer;
    (void)size;
    if (out) *out = NULL;
    return guest_unsupported("wkv_vulkan_buffer_import");
}

wkv_status wkv_vulkan_record_forward(wkv_context* ctx, VkCommandBuffer cmd, const wkv_forward_desc* desc) {
    (void)ctx;
    (void)cmd;
    (void)desc;
    return guest_unsupported("wkv_vulkan_record_forward");
}

wkv_status wkv_vulkan_record_backward(wkv_context* ctx, VkCommandBuffer cmd, const wkv_backward_desc* desc) {
    (void)ctx;
    (void)cmd;
    (void)desc;
    return guest_unsupported("wkv_vulkan_record_backward");
}
