#define _GNU_SOURCE /* dladdr */
#include "registry.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../backends/cpu/cpu_backend.h"
#include "fault.h"

/* One generated list of backends: kind, name, plugin file (NULL = built in). */
#define WKV_BACKEND_LIST(X)                      \
    X(WKV_BACKEND_CPU, "cpu", NULL)              \
    X(WKV_BACKEND_CUDA, "cuda", "libwkv_cuda.so") \
    X(WKV_BACKEND_VULKAN, "vulkan", "libwkv_vulkan.so")

typedef struct backend_slot {
    wkv_backend kind;
    const char* name;
    const char* plugin_file;
    int loaded; /* tried already */
    const wkv_backend_iface* iface;
    wkv_backend_info info;
    char reason[8192];
} backend_slot;

static backend_slot g_slots[] = {
#define WKV_SLOT_(kind, name, file) {kind, name, file, 0, NULL, {0}, {0}},
    WKV_BACKEND_LIST(WKV_SLOT_)
#undef WKV_SLOT_
};
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static backend_slot* slot_of(wkv_backend kind) {
    for (size_t i = 0; i < sizeof g_slots / sizeof g_slots[0]; ++i)
        if (g_slots[i].kind == kind) return &g_slots[i];
    return NULL;
}

const char* wkv_backend_name(wkv_backend kind) {
    backend_slot* s = slot_of(kind);
    return s ? s->name : (kind == WKV_BACKEND_AUTO ? "auto" : "unknown");
}

int wkv_backend_accepts_device(wkv_backend kind, int32_t t) {
    switch (kind) {
    case WKV_BACKEND_CPU:
        return t == WKV_DEVICE_CPU || t == WKV_DEVICE_CUDA_HOST || t == WKV_DEVICE_CUDA_MANAGED;
    case WKV_BACKEND_CUDA: /* host memory is staged by the plugin (wkv.h's memory model) */
        return t == WKV_DEVICE_CUDA || t == WKV_DEVICE_CUDA_MANAGED || t == WKV_DEVICE_CPU ||
               t == WKV_DEVICE_CUDA_HOST;
    case WKV_BACKEND_VULKAN:
        return t == WKV_DEVICE_VULKAN || t == WKV_DEVICE_CPU;
    default:
        return 0;
    }
}

static int file_exists(const char* path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The directory libwkv itself was loaded from, without a trailing slash. */
static int own_directory(char* out, size_t size) {
    Dl_info info;
    if (!dladdr((void*)&own_directory, &info) || !info.dli_fname) return 0;
    const char* slash = strrchr(info.dli_fname, '/');
    if (!slash) return 0;
    size_t len = (size_t)(slash - info.dli_fname);
    if (len + 1 > size) return 0;
    memcpy(out, info.dli_fname, len);
    out[len] = '\0';
    return 1;
}

/* Finds the plugin file: each directory of WKV_PLUGIN_PATH (':'-separated), then libwkv's own. */
static int find_plugin(const char* file, char* path, size_t size) {
    const char* env = getenv("WKV_PLUGIN_PATH");
    while (env && *env) {
        const char* end = strchr(env, ':');
        size_t len = end ? (size_t)(end - env) : strlen(env);
        if (len > 0 && (size_t)snprintf(path, size, "%.*s/%s", (int)len, env, file) < size &&
            file_exists(path))
            return 1;
        env = end ? end + 1 : NULL;
    }
    char dir[4096];
    if (own_directory(dir, sizeof dir) && (size_t)snprintf(path, size, "%s/%s", dir, file) < size &&
        file_exists(path))
        return 1;
    return 0;
}

static const wkv_backend_iface* load_plugin(backend_slot* s) {
    char path[4096];
    if (!find_plugin(s->plugin_file, path, sizeof path)) {
        snprintf(s->reason, sizeof s->reason,
                 "plugin %s not found (searched WKV_PLUGIN_PATH and libwkv's directory)", s->plugin_file);
        return NULL;
    }
    /* RTLD_LOCAL: a plugin's symbols (and its CUDA/Vulkan dependencies) stay its own.
     * WKV_FAULT=no_driver (fault.h) makes the load fail as a missing driver library would. */
    const int injected = wkv_fault_process_hit(WKV_FAULT_NO_DRIVER, s->name);
    void* handle = injected ? NULL : dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char* err = injected ? "injected fault (WKV_FAULT=no_driver): as if its driver library were missing"
                                   : dlerror();
        snprintf(s->reason, sizeof s->reason, "cannot load %s: %s", path, err ? err : "dlopen failed");
        return NULL;
    }
    wkv_plugin_entry_fn entry;
    void* sym = dlsym(handle, WKV_PLUGIN_ENTRY_SYMBOL);
    memcpy(&entry, &sym, sizeof entry); /* object pointer -> function pointer, without a cast warning */
    if (!sym) {
        snprintf(s->reason, sizeof s->reason, "%s does not export %s: not a libwkv plugin", path,
                 WKV_PLUGIN_ENTRY_SYMBOL);
        dlclose(handle);
        return NULL;
    }
    const wkv_backend_iface* iface = entry(WKV_BACKEND_ABI_VERSION);
    if (!iface) {
        snprintf(s->reason, sizeof s->reason, "%s refused backend ABI v%u of this libwkv", path,
                 WKV_BACKEND_ABI_VERSION);
        dlclose(handle);
        return NULL;
    }
    if (iface->abi_version < WKV_BACKEND_ABI_MIN || iface->abi_version > WKV_BACKEND_ABI_VERSION ||
        iface->struct_size < (iface->abi_version >= 5   ? sizeof(wkv_backend_iface)
                              : iface->abi_version == 4 ? WKV_BACKEND_IFACE_V4_SIZE
                              : iface->abi_version == 3 ? WKV_BACKEND_IFACE_V3_SIZE
                              : iface->abi_version == 2 ? WKV_BACKEND_IFACE_V2_SIZE
                                                        : WKV_BACKEND_IFACE_V1_SIZE)) {
        snprintf(s->reason, sizeof s->reason,
                 "%s was built for backend ABI v%u; this libwkv %s accepts v%u..v%u", path,
                 iface->abi_version, wkv_version_string(), WKV_BACKEND_ABI_MIN, WKV_BACKEND_ABI_VERSION);
        dlclose(handle);
        return NULL;
    }
    if (iface->kind != s->kind || !iface->probe || !iface->create || !iface->destroy ||
        !iface->forward || !iface->backward || !iface->workspace_size) {
        snprintf(s->reason, sizeof s->reason, "%s is not a complete %s backend", path, s->name);
        dlclose(handle);
        return NULL;
    }
    /* The handle stays open for the life of the process: contexts may hold its code. */
    snprintf(s->reason, sizeof s->reason, "loaded from %s", path);
    return iface;
}

/* Loads and probes once. Called with g_lock held. */
static void ensure_loaded(backend_slot* s) {
    if (s->loaded) return;
    s->loaded = 1;
    s->iface = s->plugin_file ? load_plugin(s) : wkv_cpu_backend_iface();
    memset(&s->info, 0, sizeof s->info);
    if (!s->iface) return;
    s->info.struct_size = sizeof s->info;
    s->iface->probe(&s->info);
    if (!s->info.available) {
        snprintf(s->reason, sizeof s->reason, "%s", s->info.reason ? s->info.reason : "unavailable");
        s->iface = NULL;
    } else if (!s->plugin_file && s->info.reason) {
        snprintf(s->reason, sizeof s->reason, "%s", s->info.reason);
    }
}

const wkv_backend_iface* wkv_registry_get(wkv_backend kind, const char** why) {
    backend_slot* s = slot_of(kind);
    if (!s) {
        if (why) *why = "no such backend";
        return NULL;
    }
    pthread_mutex_lock(&g_lock);
    ensure_loaded(s);
    pthread_mutex_unlock(&g_lock);
    if (why) *why = s->reason;
    return s->iface;
}

void wkv_registry_info(wkv_backend kind, wkv_backend_info* out) {
    backend_slot* s = slot_of(kind);
    if (!s) return;
    pthread_mutex_lock(&g_lock);
    ensure_loaded(s);
    *out = s->info;
    pthread_mutex_unlock(&g_lock);
    out->struct_size = sizeof *out;
    out->backend = kind;
    out->name = s->name;
    out->available = s->iface != NULL;
    out->reason = s->reason;
    if (!out->available) {
        out->device_count = 0;
    }
}
