/* A test plugin: the CPU backend's kernels behind another backend's slot, built as a separate
 * shared object so the tests exercise the real loader (search path, dlopen, entry symbol, ABI
 * version check, routing). TEST_PLUGIN_KIND picks the slot; TEST_PLUGIN_ABI the ABI version it
 * claims (a wrong one must be refused with a message). */
#include <string.h>

#include "../../backends/cpu/cpu_backend.h"

#ifndef TEST_PLUGIN_KIND
#error "define TEST_PLUGIN_KIND"
#endif
#ifndef TEST_PLUGIN_ABI
#define TEST_PLUGIN_ABI WKV_BACKEND_ABI_VERSION
#endif

static wkv_backend_iface g_iface;

static void probe(wkv_backend_info* out) {
    wkv_cpu_backend_iface()->probe(out);
    out->reason = "test plugin: cpu kernels in another backend's slot";
}

__attribute__((visibility("default"))) const wkv_backend_iface* wkv_plugin_entry(uint32_t core_abi) {
    if (core_abi < 1) return NULL;
    g_iface = *wkv_cpu_backend_iface();
    g_iface.abi_version = TEST_PLUGIN_ABI;
    g_iface.kind = TEST_PLUGIN_KIND;
    g_iface.name = "test";
    g_iface.probe = probe;
    return &g_iface;
}
