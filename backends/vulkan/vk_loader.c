#include "vk_loader.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static wkv_vk_global g_vk;
static const char* g_why;
static char g_why_buf[512];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* dlsym's object pointer to a function pointer, without a cast warning. */
#define WKV_VK_FN_(dst, ptr) memcpy(&(dst), &(ptr), sizeof(dst))

static void load_once(void) {
    const char* names[] = {"libvulkan.so.1", "libvulkan.so"};
    void* lib = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib; ++i) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char* err = dlerror();
        snprintf(g_why_buf, sizeof g_why_buf,
                 "the Vulkan loader libvulkan.so.1 cannot be loaded (%s); install it (Debian: libvulkan1) "
                 "and a driver (e.g. mesa-vulkan-drivers)", err ? err : "dlopen failed");
        g_why = g_why_buf;
        return;
    }
    void* sym = dlsym(lib, "vkGetInstanceProcAddr");
    if (!sym) {
        g_why = "libvulkan.so.1 has no vkGetInstanceProcAddr: not a Vulkan loader";
        dlclose(lib);
        return;
    }
    WKV_VK_FN_(g_vk.vkGetInstanceProcAddr, sym);
#define WKV_VK_GLOBAL_LOAD_(name)                                                   \
    {                                                                               \
        PFN_vkVoidFunction f_ = g_vk.vkGetInstanceProcAddr(VK_NULL_HANDLE, #name);  \
        WKV_VK_FN_(g_vk.name, f_);                                                  \
        if (!g_vk.name) {                                                           \
            g_why = "the Vulkan loader lacks " #name;                               \
            dlclose(lib);                                                           \
            memset(&g_vk, 0, sizeof g_vk);                                          \
            return;                                                                 \
        }                                                                           \
    }
    WKV_VK_GLOBAL_FUNCS(WKV_VK_GLOBAL_LOAD_)
#undef WKV_VK_GLOBAL_LOAD_
    PFN_vkVoidFunction ver = g_vk.vkGetInstanceProcAddr(VK_NULL_HANDLE, "vkEnumerateInstanceVersion");
    WKV_VK_FN_(g_vk.vkEnumerateInstanceVersion, ver);
    g_vk.lib = lib; /* kept open for the life of the process */
}

const wkv_vk_global* wkv_vk_load(const char** why) {
    pthread_once(&g_once, load_once);
    if (!g_vk.lib) {
        if (why) *why = g_why ? g_why : "the Vulkan loader could not be loaded";
        return NULL;
    }
    return &g_vk;
}

const char* wkv_vk_load_instance(const wkv_vk_global* g, VkInstance instance, wkv_vk_instance_fns* out) {
    memset(out, 0, sizeof *out);
#define WKV_VK_INSTANCE_LOAD_(name)                                            \
    {                                                                          \
        PFN_vkVoidFunction f_ = g->vkGetInstanceProcAddr(instance, #name);     \
        WKV_VK_FN_(out->name, f_);                                             \
        if (!out->name) return #name;                                          \
    }
    WKV_VK_INSTANCE_FUNCS(WKV_VK_INSTANCE_LOAD_)
#undef WKV_VK_INSTANCE_LOAD_
#define WKV_VK_INSTANCE_OPT_(name)                                             \
    {                                                                          \
        PFN_vkVoidFunction f_ = g->vkGetInstanceProcAddr(instance, #name);     \
        WKV_VK_FN_(out->name, f_);                                             \
    }
    WKV_VK_INSTANCE_OPTIONAL_FUNCS(WKV_VK_INSTANCE_OPT_)
#undef WKV_VK_INSTANCE_OPT_
    return NULL;
}

const char* wkv_vk_load_device(const wkv_vk_instance_fns* ifn, VkDevice device, wkv_vk_device_fns* out) {
    memset(out, 0, sizeof *out);
#define WKV_VK_DEVICE_LOAD_(name)                                              \
    {                                                                          \
        PFN_vkVoidFunction f_ = ifn->vkGetDeviceProcAddr(device, #name);       \
        WKV_VK_FN_(out->name, f_);                                             \
        if (!out->name) return #name;                                          \
    }
    WKV_VK_DEVICE_FUNCS(WKV_VK_DEVICE_LOAD_)
#undef WKV_VK_DEVICE_LOAD_
    return NULL;
}
