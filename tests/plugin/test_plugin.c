/* A test plugin: the CPU backend's kernels behind another backend's slot, built as a separate
 * shared object so the tests exercise the real loader (search path, dlopen, entry symbol, ABI
 * version check, routing). TEST_PLUGIN_KIND picks the slot; TEST_PLUGIN_ABI the ABI version it
 * claims (a wrong one must be refused with a message). */
#include <stdlib.h>
#include <string.h>

#include "../../backends/cpu/cpu_backend.h"

#ifndef TEST_PLUGIN_KIND
#error "define TEST_PLUGIN_KIND"
#endif
#ifndef TEST_PLUGIN_ABI
#define TEST_PLUGIN_ABI WKV_BACKEND_ABI_VERSION
#endif

static wkv_backend_iface g_iface;

/* The forward's scratch (ABI v3), so that the core's handling of it is tested without a GPU:
 * the plugin claims TEST_SCRATCH_PER_TOKEN bytes per token and head for RWKV-7 (none for the
 * other ops), and its forward fills what it was given with TEST_SCRATCH_BYTE (tests/plugin/
 * test_plugins.cpp checks both). */
#define TEST_SCRATCH_PER_TOKEN 16
#define TEST_SCRATCH_BYTE 0x5a

static size_t scratch_bytes(const wkv_problem* p) {
    return p->op == WKV_OP_RWKV7 ? (size_t)(p->B * p->T * p->H) * TEST_SCRATCH_PER_TOKEN : 0;
}

static wkv_status forward_scratch_size(void* state, const wkv_problem* p, size_t* out, wkv_message* msg) {
    (void)state;
    (void)msg;
    *out = scratch_bytes(p);
    return WKV_OK;
}

static wkv_status forward(void* state, const wkv_problem* p, wkv_message* msg) {
    if (p->scratch) {
        char* at = p->scratch_mem.buffer ? (char*)p->scratch_mem.buffer + p->scratch_mem.offset : (char*)p->scratch;
        memset(at, TEST_SCRATCH_BYTE, scratch_bytes(p));
    }
    return wkv_cpu_backend_iface()->forward(state, p, msg);
}

/* Device buffers in host memory (the handle is the calloc'd address), so that a scratch in a
 * wkv_buffer can be tested; tensors in buffers are not (the CPU kernels read addresses). */
static wkv_status buffer_create(void* state, uint64_t bytes, void** out, wkv_message* msg) {
    (void)state;
    (void)msg;
    *out = calloc(1, (size_t)bytes);
    return *out ? WKV_OK : WKV_ERROR_OUT_OF_MEMORY;
}

static void buffer_destroy(void* state, void* buffer) {
    (void)state;
    free(buffer);
}

static wkv_status buffer_write(void* state, void* buffer, uint64_t offset, const void* src, uint64_t bytes,
                               wkv_message* msg) {
    (void)state;
    (void)msg;
    memcpy((char*)buffer + offset, src, (size_t)bytes);
    return WKV_OK;
}

static wkv_status buffer_read(void* state, void* buffer, uint64_t offset, void* dst, uint64_t bytes,
                              wkv_message* msg) {
    (void)state;
    (void)msg;
    memcpy(dst, (char*)buffer + offset, (size_t)bytes);
    return WKV_OK;
}

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
#if TEST_PLUGIN_ABI == 2
    /* an ABI v2 plugin: its iface ends before forward_scratch_size */
    g_iface.struct_size = (uint32_t)WKV_BACKEND_IFACE_V2_SIZE;
    (void)forward;
    (void)forward_scratch_size;
#else
    g_iface.forward = forward;
    g_iface.forward_scratch_size = forward_scratch_size;
#endif
    g_iface.buffer_create = buffer_create;
    g_iface.buffer_destroy = buffer_destroy;
    g_iface.buffer_write = buffer_write;
    g_iface.buffer_read = buffer_read;
    return &g_iface;
}
