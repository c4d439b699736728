/* The built-in CPU backend: its function table. Dispatches by op to the op's description
 * (rwkv7.cpp, rwkv6.cpp, rwkv4.cpp), run by op_common.cpp; catches every exception at this
 * boundary. */
#include "cpu_backend.h"

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <new>

#if defined(_WIN32)
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>
#elif defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

#include "attention.h"
#include "cpu_internal.h"
#include "isa.h"
#include "op_common.h"
#include "rwkv4.h"
#include "rwkv6.h"
#include "rwkv7.h"
#include "simd_ops.h"

namespace wkv_cpu {

void make_op_set(Isa isa, OpSet* out) noexcept {
    out->rwkv7 = kRwkv7Op;
    out->rwkv6 = kRwkv6Op;
    out->rwkv4 = kRwkv4Op;
    out->attention_block = nullptr; /* the scalar step */
    out->attention_rows = nullptr;
    out->attention_block_bf16 = nullptr;
    out->attention_backward = wkv_cpu::AttnBwdFns();
#if WKV_CPU_X86_SIMD
    if (isa == Isa::kAvx2) install_avx2(out);
    if (isa == Isa::kAvx512) install_avx512(out);
#elif WKV_CPU_NEON_SIMD
    if (isa == Isa::kNeon) install_neon(out);
#else
    (void)isa;
#endif
}

} // namespace wkv_cpu

namespace {

using wkv_cpu::BackendState;
using wkv_cpu::set_message;

/* A context's state: the core's arguments, its instruction-set path and that path's ops. */
struct CpuState : BackendState {
    wkv_cpu::Isa isa = wkv_cpu::Isa::kScalar;
    wkv_cpu::OpSet ops;
};

const char* op_name(wkv_op op) noexcept {
    switch (op) {
    case WKV_OP_RWKV4: return "RWKV-4";
    case WKV_OP_RWKV6: return "RWKV-6";
    case WKV_OP_RWKV7: return "RWKV-7";
    default: return "unknown";
    }
}

wkv_status unsupported_op(const wkv_problem* p, wkv_message* msg) noexcept {
    set_message(msg, "op %s (%d) is not implemented", op_name(p->op), (int)p->op);
    return WKV_ERROR_UNSUPPORTED;
}

void cpu_probe(wkv_backend_info* out) {
    out->available = 1;
    out->reason = wkv_cpu::isa_description(); /* "built in; SIMD path ..." */
    out->device_count = 1;
    out->ops = (1u << WKV_OP_RWKV7) | (1u << WKV_OP_RWKV6) | (1u << WKV_OP_RWKV4);
    out->dtypes = 7u; /* f32, f16, bf16 */
    out->decay_forms = (1u << WKV_DECAY_DIRECT) | (1u << WKV_DECAY_LOG) |
                       (1u << WKV_DECAY_EXP_NEG_EXP) | (1u << WKV_DECAY_CLAMPW);
    out->any_head_size = 1;
    out->num_head_sizes = 0;
    for (int i = 0; i < WKV_MAX_HEAD_SIZES; ++i) out->head_sizes[i] = 0;
}

/* The "model name" of /proc/cpuinfo, trimmed, into name; false when there is none. */
bool cpu_model_name(char* name, size_t size) noexcept {
#if defined(__linux__)
    std::FILE* f = std::fopen("/proc/cpuinfo", "r");
    if (!f) return false;
    char line[512];
    bool found = false;
    while (!found && std::fgets(line, sizeof line, f)) {
        if (std::strncmp(line, "model name", 10) != 0) continue;
        const char* colon = std::strchr(line, ':');
        if (!colon) continue;
        const char* begin = colon + 1;
        while (*begin == ' ' || *begin == '\t') ++begin;
        size_t len = std::strlen(begin);
        while (len > 0 && (begin[len - 1] == '\n' || begin[len - 1] == '\r' ||
                           begin[len - 1] == ' ' || begin[len - 1] == '\t'))
            --len;
        if (len == 0) continue;
        std::snprintf(name, size, "%.*s", (int)len, begin);
        found = true;
    }
    std::fclose(f);
    return found;
#else
    (void)name;
    (void)size;
    return false;
#endif
}

wkv_status cpu_device_info(int32_t index, wkv_device_info* out, wkv_message* msg) {
    if (index != 0) {
        set_message(msg, "device index %d is out of range (the CPU backend has one device, 0)",
                    (int)index);
        return WKV_ERROR_INVALID_ARGUMENT;
    }
    if (!cpu_model_name(out->name, sizeof out->name))
        std::snprintf(out->name, sizeof out->name, "cpu");
    out->memory_bytes = 0;
    out->compute_units = 1;
#if defined(_WIN32)
    MEMORYSTATUSEX ms;
    ms.dwLength = sizeof ms;
    if (GlobalMemoryStatusEx(&ms)) out->memory_bytes = (uint64_t)ms.ullTotalPhys;
    SYSTEM_INFO si;
    GetSystemInfo(&si);
    if (si.dwNumberOfProcessors > 0) out->compute_units = (int32_t)si.dwNumberOfProcessors;
#elif defined(__unix__) || defined(__APPLE__)
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page_size = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page_size > 0) out->memory_bytes = (uint64_t)pages * (uint64_t)page_size;
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores > 0) out->compute_units = cores > INT32_MAX ? INT32_MAX : (int32_t)cores;
#endif
    return WKV_OK;
}

wkv_status cpu_create(const wkv_backend_create_args* args, void** out_state, wkv_message* msg) {
    *out_state = nullptr;
    wkv_cpu::Isa isa;
    const wkv_status isa_ok = wkv_cpu::isa_from_env(&isa, msg);
    if (isa_ok != WKV_OK) return isa_ok;
    const wkv_fault_hook fault = wkv_fault_hook_from(args);
    CpuState* st = wkv_fault_hit(&fault, WKV_FAULT_OOM, "state") ? nullptr : new (std::nothrow) CpuState;
    if (!st) {
        set_message(msg, "cannot allocate the backend state");
        return WKV_ERROR_OUT_OF_MEMORY;
    }
    std::memset(&st->args, 0, sizeof st->args);
    size_t n = args->struct_size < sizeof st->args ? args->struct_size : sizeof st->args;
    std::memcpy(&st->args, args, n);
    st->args.struct_size = (uint32_t)sizeof st->args;
    if (n < offsetof(wkv_backend_create_args, num_threads) + sizeof(int32_t) ||
        st->args.num_threads < 1)
        st->args.num_threads = 1;
    if (!st->args.parallel_for) {
        delete st;
        set_message(msg, "parallel_for is NULL");
        return WKV_ERROR_INTERNAL;
    }
    st->isa = isa;
    wkv_cpu::make_op_set(isa, &st->ops);
    *out_state = st;
    return WKV_OK;
}

void cpu_destroy(void* state) { delete static_cast<CpuState*>(state); }

template <class F>
wkv_status guarded(wkv_message* msg, F&& f) noexcept {
    try {
        return f();
    } catch (const std::bad_alloc&) {
        set_message(msg, "out of memory");
        return WKV_ERROR_OUT_OF_MEMORY;
    } catch (...) {
        set_message(msg, "unexpected internal exception");
        return WKV_ERROR_INTERNAL;
    }
}

/* The context's description of op (on its instruction-set path), or NULL when the CPU backend
 * does not implement it. */
const wkv_cpu::OpDesc* find_op(void* state, wkv_op op) noexcept {
    const CpuState* st = static_cast<const CpuState*>(state);
    switch (op) {
    case WKV_OP_RWKV7: return &st->ops.rwkv7;
    case WKV_OP_RWKV6: return &st->ops.rwkv6;
    case WKV_OP_RWKV4: return &st->ops.rwkv4;
    default: return nullptr;
    }
}

wkv_status cpu_workspace_size(void* state, const wkv_problem* p, size_t* out_bytes,
                              wkv_message* msg) {
    return guarded(msg, [&]() -> wkv_status {
        const wkv_cpu::OpDesc* op = find_op(state, p->op);
        if (!op) return unsupported_op(p, msg);
        return wkv_cpu::backward_workspace_size(static_cast<const BackendState*>(state), p, *op,
                                                out_bytes, msg);
    });
}

/* WKV_FAULT=device_lost:submit (src/fault.h): the CPU's stand-in for a GPU that fails when
 * work is handed to it. Reached before anything is written. */
bool device_lost(void* state, wkv_message* msg) noexcept {
    const wkv_fault_hook fault = wkv_fault_hook_from(&static_cast<const BackendState*>(state)->args);
    if (!wkv_fault_hit(&fault, WKV_FAULT_DEVICE_LOST, "submit")) return false;
    set_message(msg, "the device was lost (injected fault: WKV_FAULT=device_lost)");
    return true;
}

wkv_status cpu_forward(void* state, const wkv_problem* p, wkv_message* msg) {
    if (device_lost(state, msg)) return WKV_ERROR_DEVICE_LOST;
    return guarded(msg, [&]() -> wkv_status {
        const wkv_cpu::OpDesc* op = find_op(state, p->op);
        if (!op) return unsupported_op(p, msg);
        return wkv_cpu::run_forward(static_cast<const BackendState*>(state), p, *op, msg);
    });
}

wkv_status cpu_backward(void* state, const wkv_problem* p, wkv_message* msg) {
    if (device_lost(state, msg)) return WKV_ERROR_DEVICE_LOST;
    return guarded(msg, [&]() -> wkv_status {
        const wkv_cpu::OpDesc* op = find_op(state, p->op);
        if (!op) return unsupported_op(p, msg);
        return wkv_cpu::run_backward(static_cast<const BackendState*>(state), p, *op, msg);
    });
}

int32_t cpu_saves_checkpoints(void* state, const wkv_problem* p) {
    const wkv_cpu::OpDesc* op = find_op(state, p->op);
    return op && wkv_cpu::op_saves(p, *op) ? 1 : 0;
}

wkv_status cpu_attention(void* state, const wkv_attention_problem* p, wkv_message* msg) {
    const CpuState* st = static_cast<const CpuState*>(state);
    return wkv_cpu::attention(*st, st->ops.attention_block, st->ops.attention_rows, st->ops.attention_block_bf16, p,
                              msg);
}

wkv_status cpu_attention_backward(void* state, const wkv_attention_backward_problem* p, wkv_message* msg) {
    const CpuState* st = static_cast<const CpuState*>(state);
    return wkv_cpu::attention_backward(*st, st->ops.attention_backward, p, msg);
}

int32_t cpu_attention_configs(void*, wkv_attention_config* out, int32_t capacity) {
    return wkv_cpu::attention_configs(out, capacity);
}

const wkv_backend_iface kCpuIface = {
    WKV_BACKEND_ABI_VERSION,
    (uint32_t)sizeof(wkv_backend_iface),
    WKV_BACKEND_CPU,
    "cpu",
    cpu_probe,
    cpu_device_info,
    cpu_create,
    cpu_destroy,
    cpu_workspace_size,
    cpu_forward,
    cpu_backward,
    nullptr, /* control: the CPU backend has no backend-specific requests */
    nullptr, /* buffer_create: host memory only, no device buffers */
    nullptr, /* buffer_destroy */
    nullptr, /* buffer_write */
    nullptr, /* buffer_read */
    nullptr, /* auto_skip: the CPU backend is always a candidate */
    nullptr, /* synchronize: every call is complete when it returns */
    cpu_saves_checkpoints,
    nullptr, /* forward_scratch_size: the CPU forward needs no scratch */
    cpu_attention,
    cpu_attention_configs,
    cpu_attention_backward,
};

} // namespace

extern "C" const wkv_backend_iface* wkv_cpu_backend_iface(void) { return &kCpuIface; }
