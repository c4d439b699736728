/* Probe, device info, and the per-context instance + device (with the Khronos validation
 * layer and a counting debug messenger when WKV_VULKAN_VALIDATION=1). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"
#include "wkv/wkv_vulkan.h"

/* ------------------------------------------------------------------------------ helpers */

wkv_status wkv_vk_fail(wkv_message* msg, wkv_status status, const char* fmt, ...) {
    if (!msg) return status;
    int n = snprintf(msg->text, sizeof msg->text, "vulkan backend: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg->text + n, sizeof msg->text - (size_t)n, fmt, ap);
    va_end(ap);
    return status;
}

const char* wkv_vk_result_name(VkResult r) {
    switch (r) {
#define WKV_VK_RESULT_(x) case x: return #x;
    WKV_VK_RESULT_(VK_SUCCESS)
    WKV_VK_RESULT_(VK_NOT_READY)
    WKV_VK_RESULT_(VK_TIMEOUT)
    WKV_VK_RESULT_(VK_INCOMPLETE)
    WKV_VK_RESULT_(VK_ERROR_OUT_OF_HOST_MEMORY)
    WKV_VK_RESULT_(VK_ERROR_OUT_OF_DEVICE_MEMORY)
    WKV_VK_RESULT_(VK_ERROR_INITIALIZATION_FAILED)
    WKV_VK_RESULT_(VK_ERROR_DEVICE_LOST)
    WKV_VK_RESULT_(VK_ERROR_MEMORY_MAP_FAILED)
    WKV_VK_RESULT_(VK_ERROR_LAYER_NOT_PRESENT)
    WKV_VK_RESULT_(VK_ERROR_EXTENSION_NOT_PRESENT)
    WKV_VK_RESULT_(VK_ERROR_FEATURE_NOT_PRESENT)
    WKV_VK_RESULT_(VK_ERROR_INCOMPATIBLE_DRIVER)
    WKV_VK_RESULT_(VK_ERROR_TOO_MANY_OBJECTS)
    WKV_VK_RESULT_(VK_ERROR_FORMAT_NOT_SUPPORTED)
    WKV_VK_RESULT_(VK_ERROR_FRAGMENTED_POOL)
    WKV_VK_RESULT_(VK_ERROR_OUT_OF_POOL_MEMORY)
#undef WKV_VK_RESULT_
    default: return "VkResult";
    }
}

wkv_status wkv_vk_result(wkv_message* msg, VkResult r, const char* what) {
    wkv_status st = WKV_ERROR_INTERNAL;
    if (r == VK_ERROR_OUT_OF_HOST_MEMORY || r == VK_ERROR_OUT_OF_DEVICE_MEMORY ||
        r == VK_ERROR_OUT_OF_POOL_MEMORY || r == VK_ERROR_FRAGMENTED_POOL)
        st = WKV_ERROR_OUT_OF_MEMORY;
    else if (r == VK_ERROR_DEVICE_LOST)
        st = WKV_ERROR_DEVICE_LOST;
    return wkv_vk_fail(msg, st, "%s failed: %s (%d)", what, wkv_vk_result_name(r), (int)r);
}

static int env_flag(const char* name) {
    const char* v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

/* The physical device ordinal: WKV_VULKAN_DEVICE when set, else the context's. */
static int32_t device_ordinal(int32_t requested) {
    const char* v = getenv("WKV_VULKAN_DEVICE");
    if (v && *v) {
        char* end = NULL;
        long n = strtol(v, &end, 10);
        if (end && *end == '\0' && n >= 0 && n < 1 << 20) return (int32_t)n;
    }
    return requested;
}

static int has_layer(const wkv_vk_global* g, const char* name) {
    uint32_t n = 0;
    if (g->vkEnumerateInstanceLayerProperties(&n, NULL) != VK_SUCCESS || n == 0) return 0;
    VkLayerProperties* props = (VkLayerProperties*)calloc(n, sizeof *props);
    if (!props) return 0;
    int found = 0;
    if (g->vkEnumerateInstanceLayerProperties(&n, props) == VK_SUCCESS)
        for (uint32_t i = 0; i < n; ++i) found |= strcmp(props[i].layerName, name) == 0;
    free(props);
    return found;
}

static int has_instance_extension(const wkv_vk_global* g, const char* name) {
    uint32_t n = 0;
    if (g->vkEnumerateInstanceExtensionProperties(NULL, &n, NULL) != VK_SUCCESS || n == 0) return 0;
    VkExtensionProperties* props = (VkExtensionProperties*)calloc(n, sizeof *props);
    if (!props) return 0;
    int found = 0;
    if (g->vkEnumerateInstanceExtensionProperties(NULL, &n, props) == VK_SUCCESS)
        for (uint32_t i = 0; i < n; ++i) found |= strcmp(props[i].extensionName, name) == 0;
    free(props);
    return found;
}

static VKAPI_ATTR VkBool32 VKAPI_CALL on_validation_message(
    VkDebugUtilsMessageSeverityFlagBitsEXT severity, VkDebugUtilsMessageTypeFlagsEXT type,
    const VkDebugUtilsMessengerCallbackDataEXT* data, void* user) {
    (void)type;
    wkv_vk_state* st = (wkv_vk_state*)user;
    const char* text = data && data->pMessage ? data->pMessage : "(no text)";
    unsigned long long before = atomic_fetch_add(&st->validation_count, 1ull);
    if (before == 0) snprintf(st->validation_first, sizeof st->validation_first, "%s", text);
    /* Opted in with WKV_VULKAN_VALIDATION=1: say it where a developer looks. */
    fprintf(stderr, "libwkv vulkan validation (%s): %s\n",
            severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT ? "error" : "warning", text);
    return VK_FALSE;
}

static void messenger_info(wkv_vk_state* st, VkDebugUtilsMessengerCreateInfoEXT* ci) {
    memset(ci, 0, sizeof *ci);
    ci->sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT;
    ci->messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                          VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
    ci->messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                      VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                      VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
    ci->pfnUserCallback = on_validation_message;
    ci->pUserData = st;
}

/* An instance of Vulkan 1.1+ (1.2 when the loader has it). With st and st->validation, the
 * Khronos validation layer and a messenger counting into st. */
static wkv_status create_instance(const wkv_vk_global* g, wkv_vk_state* st, VkInstance* out,
                                  wkv_vk_instance_fns* fns, uint32_t* api, wkv_message* msg) {
    uint32_t version = VK_API_VERSION_1_0;
    if (g->vkEnumerateInstanceVersion) g->vkEnumerateInstanceVersion(&version);
    if (version < VK_API_VERSION_1_1)
        return wkv_vk_fail(msg, WKV_ERROR_BACKEND_UNAVAILABLE,
                           "the Vulkan loader is version %u.%u; libwkv needs Vulkan 1.1",
                           VK_API_VERSION_MAJOR(version), VK_API_VERSION_MINOR(version));
    *api = version >= VK_API_VERSION_1_2 ? VK_API_VERSION_1_2 : VK_API_VERSION_1_1;

    VkApplicationInfo app;
    memset(&app, 0, sizeof app);
    app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
    app.pApplicationName = "libwkv";
    app.pEngineName = "libwkv";
    app.apiVersion = *api;

    const char* layers[1];
    const char* exts[2];
    uint32_t num_layers = 0, num_exts = 0;
    VkInstanceCreateInfo ci;
    memset(&ci, 0, sizeof ci);
    ci.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
    ci.pApplicationInfo = &app;
    if (has_instance_extension(g, VK_KHR_PORTABILITY_ENUMERATION_EXTENSION_NAME)) {
        exts[num_exts++] = VK_KHR_PORTABILITY_ENUMERATION_EXTENSION_NAME;
        ci.flags |= VK_INSTANCE_CREATE_ENUMERATE_PORTABILITY_BIT_KHR;
    }
    VkDebugUtilsMessengerCreateInfoEXT mi;
    if (st && st->validation) {
        if (!has_layer(g, "VK_LAYER_KHRONOS_validation"))
            return wkv_vk_fail(msg, WKV_ERROR_BACKEND_UNAVAILABLE,
                               "WKV_VULKAN_VALIDATION is set but VK_LAYER_KHRONOS_validation is not "
                               "installed (Debian: vulkan-validationlayers)");
        if (!has_instance_extension(g, VK_EXT_DEBUG_UTILS_EXTENSION_NAME))
            return wkv_vk_fail(msg, WKV_ERROR_BACKEND_UNAVAILABLE,
                               "WKV_VULKAN_VALIDATION is set but VK_EXT_debug_utils is missing");
        layers[num_layers++] = "VK_LAYER_KHRONOS_validation";
        exts[num_exts++] = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
        messenger_info(st, &mi);
        ci.pNext = &mi; /* also covers vkCreateInstance / vkDestroyInstance */
    }
    ci.enabledLayerCount = num_layers;
    ci.ppEnabledLayerNames = num_layers ? layers : NULL;
    ci.enabledExtensionCount = num_exts;
    ci.ppEnabledExtensionNames = num_exts ? exts : NULL;
    VkResult r = g->vkCreateInstance(&ci, NULL, out);
    if (r == VK_ERROR_INCOMPATIBLE_DRIVER)
        return wkv_vk_fail(msg, WKV_ERROR_BACKEND_UNAVAILABLE,
                           "no Vulkan driver is installed (vkCreateInstance: VK_ERROR_INCOMPATIBLE_DRIVER)");
    if (r != VK_SUCCESS) {
        wkv_vk_result(msg, r, "vkCreateInstance");
        return WKV_ERROR_BACKEND_UNAVAILABLE;
    }
    const char* missing = wkv_vk_load_instance(g, *out, fns);
    if (missing) {
        PFN_vkDestroyInstance destroy;
        PFN_vkVoidFunction f = g->vkGetInstanceProcAddr(*out, "vkDestroyInstance");
        memcpy(&destroy, &f, sizeof destroy);
        if (destroy) destroy(*out, NULL);
        *out = VK_NULL_HANDLE;
        return wkv_vk_fail(msg, WKV_ERROR_BACKEND_UNAVAILABLE, "the Vulkan instance lacks %s", missing);
    }
    return WKV_OK;
}

static uint32_t compute_queue_family(const wkv_vk_instance_fns* ifn, VkPhysicalDevice pd) {
    uint32_t n = 0;
    ifn->vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, NULL);
    VkQueueFamilyProperties q[64];
    if (n > 64) n = 64;
    ifn->vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, q);
    for (uint32_t i = 0; i < n; ++i)
        if ((q[i].queueFlags & VK_QUEUE_COMPUTE_BIT) && q[i].queueCount > 0) return i;
    return UINT32_MAX;
}

/* Shared memory per head size: forward 6 rows of N floats per token (at least one token),
 * backward 10 rows. One invocation per value row. */
int wkv_vk_head_size_ok(const VkPhysicalDeviceLimits* lim, int64_t n) {
    if (n < 1 || n > 256) return 0; /* the state rows live in registers */
    if ((uint64_t)n > lim->maxComputeWorkGroupInvocations || (uint64_t)n > lim->maxComputeWorkGroupSize[0])
        return 0;
    return (uint64_t)n * 4u * 10u <= lim->maxComputeSharedMemorySize;
}

/* ------------------------------------------------------------------------------- probe */

typedef struct probe_result {
    int done;
    int only_software; /* every device is VK_PHYSICAL_DEVICE_TYPE_CPU (lavapipe, SwiftShader) */
    wkv_backend_info info;
    char reason[512];
} probe_result;
static probe_result g_probe;

void wkv_vk_probe(wkv_backend_info* out) {
    if (g_probe.done) {
        size_t keep = out->struct_size;
        *out = g_probe.info;
        out->struct_size = keep;
        return;
    }
    wkv_backend_info* info = &g_probe.info;
    memset(info, 0, sizeof *info);
    const char* why = NULL;
    const wkv_vk_global* g = wkv_vk_load(&why);
    wkv_message m;
    m.text[0] = '\0';
    VkInstance inst = VK_NULL_HANDLE;
    wkv_vk_instance_fns ifn;
    uint32_t api = 0;
    if (!g) {
        snprintf(g_probe.reason, sizeof g_probe.reason, "%s", why);
    } else if (create_instance(g, NULL, &inst, &ifn, &api, &m) != WKV_OK) {
        snprintf(g_probe.reason, sizeof g_probe.reason, "%s", m.text);
    } else {
        uint32_t count = 0;
        ifn.vkEnumeratePhysicalDevices(inst, &count, NULL);
        if (count == 0) {
            snprintf(g_probe.reason, sizeof g_probe.reason,
                     "the Vulkan loader found no device (no driver/ICD for this machine; on a CPU-only "
                     "machine install mesa-vulkan-drivers for lavapipe)");
        } else {
            VkPhysicalDevice devs[16];
            if (count > 16) count = 16;
            ifn.vkEnumeratePhysicalDevices(inst, &count, devs);
            g_probe.only_software = 1;
            for (uint32_t i = 0; i < count; ++i) {
                VkPhysicalDeviceProperties p;
                ifn.vkGetPhysicalDeviceProperties(devs[i], &p);
                if (p.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU) g_probe.only_software = 0;
            }
            int32_t ord = device_ordinal(0);
            VkPhysicalDeviceProperties props;
            ifn.vkGetPhysicalDeviceProperties(devs[ord < (int32_t)count ? ord : 0], &props);
            info->available = 1;
            info->device_count = (int32_t)count;
            info->ops = (1u << WKV_OP_RWKV7) | (1u << WKV_OP_RWKV6) | (1u << WKV_OP_RWKV4);
            info->dtypes = 7u;
            info->decay_forms = (1u << WKV_DECAY_DIRECT) | (1u << WKV_DECAY_LOG) |
                                (1u << WKV_DECAY_EXP_NEG_EXP) | (1u << WKV_DECAY_CLAMPW);
            /* Every N from 1 to the limit works; these are the ones listed. */
            static const int listed[] = {8, 16, 32, 48, 64, 96, 128, 192, 256};
            info->any_head_size = 0;
            for (size_t i = 0; i < sizeof listed / sizeof listed[0]; ++i)
                if (wkv_vk_head_size_ok(&props.limits, listed[i]) && info->num_head_sizes < WKV_MAX_HEAD_SIZES)
                    info->head_sizes[info->num_head_sizes++] = listed[i];
            snprintf(g_probe.reason, sizeof g_probe.reason, "Vulkan %u.%u, %u device(s), first: %s",
                     VK_API_VERSION_MAJOR(api), VK_API_VERSION_MINOR(api), count, props.deviceName);
        }
        ifn.vkDestroyInstance(inst, NULL);
    }
    info->reason = g_probe.reason;
    g_probe.done = 1;
    size_t keep = out->struct_size;
    *out = *info;
    out->struct_size = keep;
}

wkv_status wkv_vk_device_info(int32_t index, wkv_device_info* out, wkv_message* msg) {
    const char* why = NULL;
    const wkv_vk_global* g = wkv_vk_load(&why);
    if (!g) return wkv_vk_fail(msg, WKV_ERROR_BACKEND_UNAVAILABLE, "%s", why);
    VkInstance inst;
    wkv_vk_instance_fns ifn;
    uint32_t api;
    wkv_status s = create_instance(g, NULL, &inst, &ifn, &api, msg);
    if (s) return s;
    uint32_t count = 0;
    ifn.vkEnumeratePhysicalDevices(inst, &count, NULL);
    VkPhysicalDevice devs[16];
    if (count > 16) count = 16;
    ifn.vkEnumeratePhysicalDevices(inst, &count, devs);
    if (index < 0 || (uint32_t)index >= count) {
        ifn.vkDestroyInstance(inst, NULL);
        return wkv_vk_fail(msg, WKV_ERROR_INVALID_ARGUMENT, "device %d: there are %u", (int)index, count);
    }
    VkPhysicalDeviceProperties props;
    VkPhysicalDeviceMemoryProperties mem;
    ifn.vkGetPhysicalDeviceProperties(devs[index], &props);
    ifn.vkGetPhysicalDeviceMemoryProperties(devs[index], &mem);
    snprintf(out->name, sizeof out->name, "%.200s (Vulkan %u.%u)", props.deviceName,
             VK_API_VERSION_MAJOR(props.apiVersion), VK_API_VERSION_MINOR(props.apiVersion));
    out->memory_bytes = 0;
    for (uint32_t i = 0; i < mem.memoryHeapCount; ++i)
        if (mem.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) out->memory_bytes += mem.memoryHeaps[i].size;
    out->compute_units = 0; /* core Vulkan does not say */
    ifn.vkDestroyInstance(inst, NULL);
    return WKV_OK;
}

/* ------------------------------------------------------------------------------ create */

wkv_status wkv_vk_check_validation(wkv_vk_state* st, wkv_message* msg) {
    if (!st->validation) return WKV_OK;
    unsigned long long n = atomic_load(&st->validation_count);
    if (n == st->validation_seen) return WKV_OK;
    unsigned long long fresh = n - st->validation_seen;
    st->validation_seen = n;
    return wkv_vk_fail(msg, WKV_ERROR_INTERNAL,
                       "the Vulkan validation layer reported %llu message(s) (WKV_VULKAN_VALIDATION); "
                       "first: %.300s", fresh, st->validation_first);
}

static wkv_status setup_physical(wkv_vk_state* st, wkv_message* msg) {
    st->ifn.vkGetPhysicalDeviceProperties(st->phys, &st->props);
    st->ifn.vkGetPhysicalDeviceMemoryProperties(st->phys, &st->mem_props);
    if (st->props.apiVersion < VK_API_VERSION_1_1)
        return wkv_vk_fail(msg, WKV_ERROR_BACKEND_UNAVAILABLE, "%s supports Vulkan %u.%u; libwkv needs 1.1",
                           st->props.deviceName, VK_API_VERSION_MAJOR(st->props.apiVersion),
                           VK_API_VERSION_MINOR(st->props.apiVersion));
    const VkPhysicalDeviceLimits* lim = &st->props.limits;
    if (lim->maxPerStageDescriptorStorageBuffers < 19 || lim->maxDescriptorSetStorageBuffers < 19 ||
        lim->maxBoundDescriptorSets < 1 || lim->maxPushConstantsSize < 16)
        return wkv_vk_fail(msg, WKV_ERROR_BACKEND_UNAVAILABLE,
                           "%s allows %u storage buffers per stage; the kernels need 19",
                           st->props.deviceName, lim->maxPerStageDescriptorStorageBuffers);
    /* Subgroup shuffles in compute shaders (Vulkan 1.1 core, no feature to enable): the
     * forwards' lanes per state row. WKV_VULKAN_NO_SUBGROUP=1 takes the *_nosg path (tests). */
    VkPhysicalDeviceSubgroupProperties sg;
    memset(&sg, 0, sizeof sg);
    sg.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES;
    VkPhysicalDeviceProperties2 p2;
    memset(&p2, 0, sizeof p2);
    p2.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2;
    p2.pNext = &sg;
    st->ifn.vkGetPhysicalDeviceProperties2(st->phys, &p2);
    st->subgroup_size = (int)sg.subgroupSize;
    st->subgroup_shuffle = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                           (sg.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT) && sg.subgroupSize >= 1 &&
                           !env_flag("WKV_VULKAN_NO_SUBGROUP");
    const char* spin = getenv("WKV_VULKAN_SPIN");
    st->spin_wait = spin && (spin[0] == '0' || spin[0] == '1') && spin[1] == '\0'
                        ? spin[0] == '1'
                        : st->props.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU;
    st->max_n = 0;
    for (int n = 256; n >= 1 && !st->max_n; --n)
        if (wkv_vk_head_size_ok(lim, n)) st->max_n = n;
    return WKV_OK;
}

static wkv_status create_objects(wkv_vk_state* st, wkv_message* msg);

static wkv_status create_device(wkv_vk_state* st, int32_t ordinal, uint32_t api, wkv_message* msg) {
    uint32_t count = 0;
    st->ifn.vkEnumeratePhysicalDevices(st->instance, &count, NULL);
    VkPhysicalDevice devs[16];
    if (count > 16) count = 16;
    st->ifn.vkEnumeratePhysicalDevices(st->instance, &count, devs);
    if (count == 0) return wkv_vk_fail(msg, WKV_ERROR_BACKEND_UNAVAILABLE, "no Vulkan device");
    if (ordinal < 0 || (uint32_t)ordinal >= count)
        return wkv_vk_fail(msg, WKV_ERROR_INVALID_ARGUMENT,
                           "device %d requested (device_index or WKV_VULKAN_DEVICE), there are %u",
                           (int)ordinal, count);
    st->phys = devs[ordinal];
    wkv_status s = setup_physical(st, msg);
    if (s) return s;
    st->queue_family = compute_queue_family(&st->ifn, st->phys);
    if (st->queue_family == UINT32_MAX)
        return wkv_vk_fail(msg, WKV_ERROR_BACKEND_UNAVAILABLE, "%s has no compute queue", st->props.deviceName);
    VkPhysicalDevice16BitStorageFeatures s16;
    memset(&s16, 0, sizeof s16);
    s16.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES;
    VkPhysicalDeviceFeatures2 f2;
    memset(&f2, 0, sizeof f2);
    f2.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2;
    f2.pNext = &s16;
    st->ifn.vkGetPhysicalDeviceFeatures2(st->phys, &f2);
    st->storage16 = s16.storageBuffer16BitAccess && !env_flag("WKV_VULKAN_NO_16BIT_STORAGE");

    VkPhysicalDevice16BitStorageFeatures want16;
    memset(&want16, 0, sizeof want16);
    want16.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES;
    want16.storageBuffer16BitAccess = st->storage16 ? VK_TRUE : VK_FALSE;
    float priority = 1.0f;
    VkDeviceQueueCreateInfo qci;
    memset(&qci, 0, sizeof qci);
    qci.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
    qci.queueFamilyIndex = st->queue_family;
    qci.queueCount = 1;
    qci.pQueuePriorities = &priority;
    VkDeviceCreateInfo dci;
    memset(&dci, 0, sizeof dci);
    dci.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
    dci.pNext = &want16;
    dci.queueCreateInfoCount = 1;
    dci.pQueueCreateInfos = &qci;
    (void)api;
    VkResult r = st->ifn.vkCreateDevice(st->phys, &dci, NULL, &st->device);
    if (r != VK_SUCCESS) return wkv_vk_result(msg, r, "vkCreateDevice");
    const char* missing = wkv_vk_load_device(&st->ifn, st->device, &st->fn);
    if (missing) return wkv_vk_fail(msg, WKV_ERROR_BACKEND_UNAVAILABLE, "the Vulkan device lacks %s", missing);
    st->fn.vkGetDeviceQueue(st->device, st->queue_family, 0, &st->queue);
    return create_objects(st, msg);
}

/* The context's own objects on st->device: command pool and buffer, fence, dummy buffer,
 * kernels. */
static wkv_status create_objects(wkv_vk_state* st, wkv_message* msg) {
    VkResult r;
    VkCommandPoolCreateInfo pci;
    memset(&pci, 0, sizeof pci);
    pci.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
    pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pci.queueFamilyIndex = st->queue_family;
    if ((r = st->fn.vkCreateCommandPool(st->device, &pci, NULL, &st->cmd_pool)) != VK_SUCCESS)
        return wkv_vk_result(msg, r, "vkCreateCommandPool");
    VkCommandBufferAllocateInfo cai;
    memset(&cai, 0, sizeof cai);
    cai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
    cai.commandPool = st->cmd_pool;
    cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cai.commandBufferCount = 1;
    if ((r = st->fn.vkAllocateCommandBuffers(st->device, &cai, &st->cmd)) != VK_SUCCESS)
        return wkv_vk_result(msg, r, "vkAllocateCommandBuffers");
    VkFenceCreateInfo fci;
    memset(&fci, 0, sizeof fci);
    fci.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
    if ((r = st->fn.vkCreateFence(st->device, &fci, NULL, &st->fence)) != VK_SUCCESS)
        return wkv_vk_result(msg, r, "vkCreateFence");
    wkv_status s = vkw_buffer_create(st, 16, WKV_VK_DEVICE_LOCAL, &st->dummy, msg);
    if (s) return s;
    return wkv_vk_kernels_create(st, msg);
}

/* Guest mode: the host's instance, physical device, device and queue (wkv_vulkan.h). */
static wkv_status create_guest(wkv_vk_state* st, const wkv_vulkan_guest_options* g, wkv_message* msg) {
    st->guest = 1;
    st->validation = 0; /* the host's instance: its validation is the host's business */
    if (g->get_instance_proc_addr) {
        st->guest_g = *st->g;
        st->guest_g.vkGetInstanceProcAddr = g->get_instance_proc_addr;
        st->g = &st->guest_g;
    }
    st->instance = g->instance;
    const char* missing = wkv_vk_load_instance(st->g, st->instance, &st->ifn);
    if (missing) return wkv_vk_fail(msg, WKV_ERROR_BACKEND_UNAVAILABLE, "the host's VkInstance lacks %s", missing);
    st->phys = g->physical_device;
    wkv_status s = setup_physical(st, msg);
    if (s) return s;
    uint32_t nq = 0;
    st->ifn.vkGetPhysicalDeviceQueueFamilyProperties(st->phys, &nq, NULL);
    VkQueueFamilyProperties qp[64];
    if (nq > 64) nq = 64;
    st->ifn.vkGetPhysicalDeviceQueueFamilyProperties(st->phys, &nq, qp);
    if (g->queue_family_index >= nq || !(qp[g->queue_family_index].queueFlags & VK_QUEUE_COMPUTE_BIT) ||
        g->queue_index >= qp[g->queue_family_index].queueCount)
        return wkv_vk_fail(msg, WKV_ERROR_INVALID_ARGUMENT,
                           "guest: queue family %u (queue %u) is not a compute queue of %s",
                           g->queue_family_index, g->queue_index, st->props.deviceName);
    st->queue_family = g->queue_family_index;
    /* Which features the host enabled cannot be queried: the 32-bit-word shaders work on any
     * device (16-bit tensors through atomics). */
    st->storage16 = 0;
    st->device = g->device;
    if ((missing = wkv_vk_load_device(&st->ifn, st->device, &st->fn)))
        return wkv_vk_fail(msg, WKV_ERROR_BACKEND_UNAVAILABLE, "the host's VkDevice lacks %s", missing);
    st->fn.vkGetDeviceQueue(st->device, st->queue_family, g->queue_index, &st->queue);
    return create_objects(st, msg);
}

wkv_status wkv_vk_create(const wkv_backend_create_args* args, void** out_state, wkv_message* msg) {
    *out_state = NULL;
    const char* why = NULL;
    const wkv_vk_global* g = wkv_vk_load(&why);
    if (!g) return wkv_vk_fail(msg, WKV_ERROR_BACKEND_UNAVAILABLE, "%s", why);
    const wkv_fault_hook fault = wkv_fault_hook_from(args);
    wkv_vk_state* st = wkv_fault_hit(&fault, WKV_FAULT_OOM, "state") ? NULL : (wkv_vk_state*)calloc(1, sizeof *st);
    if (!st) return wkv_vk_fail(msg, WKV_ERROR_OUT_OF_MEMORY, "cannot allocate the backend state");
    st->g = g;
    st->fault = fault;
    atomic_init(&st->validation_count, 0ull);
    st->validation = env_flag("WKV_VULKAN_VALIDATION");
    st->params_direct = 1;
    st->async = (wkv_create_flags(args) & WKV_CONTEXT_ASYNC) != 0;
    st->profiling = env_flag("WKV_VULKAN_PROFILE");
    st->knob_lanes = wkv_vk_env_knob("WKV_VULKAN_LANES");
    st->knob_tc = wkv_vk_env_knob("WKV_VULKAN_TC");
    st->batch_max = WKV_VK_BATCH_MAX;
    const char* batch = getenv("WKV_VULKAN_BATCH"); /* calls per command buffer (tests, tuning) */
    if (batch && *batch) {
        const long b = strtol(batch, NULL, 10);
        if (b >= 1 && b <= 4096) st->batch_max = (uint32_t)b;
    }
    const wkv_vulkan_guest_options* guest =
        args->struct_size >= offsetof(wkv_backend_create_args, guest) + sizeof(args->guest)
            ? (const wkv_vulkan_guest_options*)args->guest
            : NULL;
    if (guest) {
        wkv_status gs = create_guest(st, guest, msg);
        if (gs) wkv_vk_destroy(st);
        else *out_state = st;
        return gs;
    }
    uint32_t api = 0;
    wkv_status s = create_instance(g, st, &st->instance, &st->ifn, &api, msg);
    if (!s && st->validation) {
        if (!st->ifn.vkCreateDebugUtilsMessengerEXT) {
            s = wkv_vk_fail(msg, WKV_ERROR_BACKEND_UNAVAILABLE, "vkCreateDebugUtilsMessengerEXT is missing");
        } else {
            VkDebugUtilsMessengerCreateInfoEXT mi;
            messenger_info(st, &mi);
            VkResult r = st->ifn.vkCreateDebugUtilsMessengerEXT(st->instance, &mi, NULL, &st->messenger);
            if (r != VK_SUCCESS) s = wkv_vk_result(msg, r, "vkCreateDebugUtilsMessengerEXT");
        }
    }
    int32_t requested = args->device_index;
    if (!s) s = create_device(st, device_ordinal(requested), api, msg);
    if (!s) s = wkv_vk_check_validation(st, msg);
    if (s) {
        wkv_vk_destroy(st);
        return s;
    }
    *out_state = st;
    return WKV_OK;
}

void wkv_vk_destroy(void* state) {
    wkv_vk_state* st = (wkv_vk_state*)state;
    if (!st) return;
    if (st->device) {
        st->fn.vkDeviceWaitIdle(st->device); /* enqueued calls (WKV_CONTEXT_ASYNC) included */
        vkw_ring_destroy(st);
        wkv_vk_kernels_destroy(st);
        vkw_buffer_destroy(st, &st->staging);
        vkw_buffer_destroy(st, &st->mirror);
        vkw_buffer_destroy(st, &st->scratch);
        vkw_buffer_destroy(st, &st->dummy);
        vkw_buffer_destroy(st, &st->params);
        if (st->desc_pool) st->fn.vkDestroyDescriptorPool(st->device, st->desc_pool, NULL);
        vkw_buffer_destroy(st, &st->rec_staging);
        vkw_buffer_destroy(st, &st->rec_mirror);
        vkw_buffer_destroy(st, &st->rec_scratch);
        vkw_buffer_destroy(st, &st->rec_params);
        if (st->rec_desc_pool) st->fn.vkDestroyDescriptorPool(st->device, st->rec_desc_pool, NULL);
        if (st->fence) st->fn.vkDestroyFence(st->device, st->fence, NULL);
        if (st->cmd_pool) st->fn.vkDestroyCommandPool(st->device, st->cmd_pool, NULL);
        if (!st->guest) st->fn.vkDestroyDevice(st->device, NULL);
    }
    if (st->messenger) st->ifn.vkDestroyDebugUtilsMessengerEXT(st->instance, st->messenger, NULL);
    if (st->instance && !st->guest) st->ifn.vkDestroyInstance(st->instance, NULL);
    free(st);
}

int32_t wkv_vk_auto_skip(const char** why) {
    if (!g_probe.done || !g_probe.only_software) return 0;
    *why = "its only devices are software rasterisers (e.g. lavapipe), slower than the CPU backend; "
           "ask for WKV_BACKEND_VULKAN (WKV_BACKEND=vulkan) to use them";
    return 1;
}
