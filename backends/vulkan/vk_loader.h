/* The Vulkan functions the plugin uses, loaded at run time (volk-style, written for libwkv):
 * libvulkan.so.1 is opened with dlopen, vkGetInstanceProcAddr found with dlsym, and every other
 * function fetched through it (instance level) or vkGetDeviceProcAddr (device level). Neither
 * libwkv nor this plugin links the Vulkan loader.
 *
 * One X-macro list per level is the single place a function is named: the table struct, the
 * loading code and the "missing function" messages all expand from it. */
#ifndef WKV_VK_LOADER_H
#define WKV_VK_LOADER_H

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan_core.h>

#define WKV_VK_GLOBAL_FUNCS(X)                  \
    X(vkCreateInstance)                         \
    X(vkEnumerateInstanceExtensionProperties)   \
    X(vkEnumerateInstanceLayerProperties)

#define WKV_VK_INSTANCE_FUNCS(X)                \
    X(vkDestroyInstance)                        \
    X(vkEnumeratePhysicalDevices)               \
    X(vkGetPhysicalDeviceProperties)            \
    X(vkGetPhysicalDeviceFeatures2)             \
    X(vkGetPhysicalDeviceProperties2)           \
    X(vkGetPhysicalDeviceQueueFamilyProperties) \
    X(vkGetPhysicalDeviceMemoryProperties)      \
    X(vkEnumerateDeviceExtensionProperties)     \
    X(vkCreateDevice)                           \
    X(vkGetDeviceProcAddr)

/* Optional instance functions (VK_EXT_debug_utils, for the validation messenger). */
#define WKV_VK_INSTANCE_OPTIONAL_FUNCS(X)       \
    X(vkCreateDebugUtilsMessengerEXT)           \
    X(vkDestroyDebugUtilsMessengerEXT)

#define WKV_VK_DEVICE_FUNCS(X)                  \
    X(vkDestroyDevice)                          \
    X(vkGetDeviceQueue)                         \
    X(vkCreateBuffer)                           \
    X(vkDestroyBuffer)                          \
    X(vkGetBufferMemoryRequirements)            \
    X(vkAllocateMemory)                         \
    X(vkFreeMemory)                             \
    X(vkBindBufferMemory)                       \
    X(vkMapMemory)                              \
    X(vkUnmapMemory)                            \
    X(vkCreateShaderModule)                     \
    X(vkDestroyShaderModule)                    \
    X(vkCreateDescriptorSetLayout)              \
    X(vkDestroyDescriptorSetLayout)             \
    X(vkCreatePipelineLayout)                   \
    X(vkDestroyPipelineLayout)                  \
    X(vkCreateComputePipelines)                 \
    X(vkDestroyPipeline)                        \
    X(vkCreateDescriptorPool)                   \
    X(vkDestroyDescriptorPool)                  \
    X(vkResetDescriptorPool)                    \
    X(vkAllocateDescriptorSets)                 \
    X(vkUpdateDescriptorSets)                   \
    X(vkCreateCommandPool)                      \
    X(vkDestroyCommandPool)                     \
    X(vkAllocateCommandBuffers)                 \
    X(vkResetCommandBuffer)                     \
    X(vkBeginCommandBuffer)                     \
    X(vkEndCommandBuffer)                       \
    X(vkCmdBindPipeline)                        \
    X(vkCmdBindDescriptorSets)                  \
    X(vkCmdPushConstants)                       \
    X(vkCmdDispatch)                            \
    X(vkCmdPipelineBarrier)                     \
    X(vkCmdCopyBuffer)                          \
    X(vkCmdFillBuffer)                          \
    X(vkQueueSubmit)                            \
    X(vkCreateFence)                            \
    X(vkDestroyFence)                           \
    X(vkWaitForFences)                          \
    X(vkGetFenceStatus)                         \
    X(vkResetFences)                            \
    X(vkDeviceWaitIdle)

#define WKV_VK_MEMBER_(name) PFN_##name name;

/* Process-wide: the loader library and its global functions. */
typedef struct wkv_vk_global {
    void* lib;
    PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr;
    WKV_VK_GLOBAL_FUNCS(WKV_VK_MEMBER_)
    PFN_vkEnumerateInstanceVersion vkEnumerateInstanceVersion; /* NULL on a Vulkan 1.0 loader */
} wkv_vk_global;

typedef struct wkv_vk_instance_fns {
    WKV_VK_INSTANCE_FUNCS(WKV_VK_MEMBER_)
    WKV_VK_INSTANCE_OPTIONAL_FUNCS(WKV_VK_MEMBER_)
} wkv_vk_instance_fns;

typedef struct wkv_vk_device_fns {
    WKV_VK_DEVICE_FUNCS(WKV_VK_MEMBER_)
} wkv_vk_device_fns;

/* Opens libvulkan.so.1 once per process (thread-safe) and returns the table, or NULL with
 * the reason in why (a static string). */
const wkv_vk_global* wkv_vk_load(const char** why);

/* Fills the instance table; returns the name of a missing required function, or NULL. */
const char* wkv_vk_load_instance(const wkv_vk_global* g, VkInstance instance, wkv_vk_instance_fns* out);
/* Fills the device table; returns the name of a missing function, or NULL. */
const char* wkv_vk_load_device(const wkv_vk_instance_fns* ifn, VkDevice device, wkv_vk_device_fns* out);

#endif
