/* The CUDA backend plugin (libwkv_cuda.so): its function table and host side.
 *
 * Contract (src/backend.h) and what this file adds to it:
 * - probe() never fails hard: without a driver or a device it reports available = 0 and why
 *   ("no CUDA device: cudaGetDeviceCount: ..."). cudart is linked statically, so the plugin
 *   loads on machines with no CUDA installed at all.
 * - A context owns one non-blocking stream on its device (created at create, destroyed at
 *   destroy). WKV_CONTROL_CUDA_SET_STREAM replaces it with the caller's stream (NULL = the
 *   legacy default stream, only when asked for); GET_STREAM reads it. Every kernel is enqueued
 *   on that stream and the calls return without synchronising.
 * - No allocation and no host<->device copy happens in a call: the forward needs no scratch,
 *   the backward's only scratch is the caller's workspace, and packed-sequence offsets travel as
 *   kernel parameters (launches of at most kMaxSeqsPerLaunch sequences). So forward and
 *   backward can be captured in a CUDA graph.
 * - The calling thread's current device is switched to the context's device for a call and
 *   restored afterwards.
 *
 * BACKWARD WORKSPACE (bytes), for head size N and the context's checkpoint interval K1:
 *     256 + 4 * H * N * N * G,   G = sum over sequences s of ceil(L_s / K1)
 *                                   (unpacked: B * ceil(T / K1))
 * (K1, K2) (segment, replay window) is chosen per device at context creation: the longest
 * segment whose shared memory lets two blocks share an SM (K1 >= 8), else the longest that fits
 * one block (see cuda_create). On an H100: N = 32 and 64: K1 = 8, K2 = 4; N = 128: K1 = 8, K2 = 2.
 * E.g. B=8 T=4096 H=32 N=64: 2 GiB. Query wkv_workspace_size on the context that will run the
 * backward.
 *
 * Supported: RWKV-7, N in {32, 64, 128}, float32/float16/bfloat16 per tensor, every decay form,
 * any strides, packed sequences. RWKV-6/RWKV-4 and other N return WKV_ERROR_UNSUPPORTED. */
#include <cuda_runtime_api.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>

#include "backend.h"
#include "cuda_internal.h"

#ifndef WKV_CUDA_ARCHS
#define WKV_CUDA_ARCHS "?"
#endif

namespace {

using namespace wkv_cuda;

constexpr int kHeadSizes[] = {32, 64, 128};
constexpr int kNumHeadSizes = 3;

int head_index(int64_t N) {
    for (int x = 0; x < kNumHeadSizes; ++x)
        if (kHeadSizes[x] == N) return x;
    return -1;
}

struct CudaState {
    int device = 0;
    cudaStream_t own_stream = nullptr;
    cudaStream_t stream = nullptr;
    int sm_count = 0;
    int smem_optin = 0;
    int K1[kNumHeadSizes] = {0, 0, 0}; /* 0: backward does not fit this device */
    int K2[kNumHeadSizes] = {0, 0, 0};
    size_t smem[kNumHeadSizes] = {0, 0, 0};
    size_t smem_min[kNumHeadSizes] = {0, 0, 0}; /* what K2 = 1 would need */
    bool lost = false;
};

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
void set_message(wkv_message* msg, const char* fmt, ...) {
    if (!msg) return;
    const int prefix = std::snprintf(msg->text, sizeof msg->text, "cuda backend: ");
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(msg->text + prefix, sizeof msg->text - (size_t)prefix, fmt, ap);
    va_end(ap);
}

const char* op_name(wkv_op op) {
    switch (op) {
    case WKV_OP_RWKV4: return "RWKV-4";
    case WKV_OP_RWKV6: return "RWKV-6";
    case WKV_OP_RWKV7: return "RWKV-7";
    default: return "unknown";
    }
}

/* A CUDA error as a wkv_status; errors that leave the context unusable mark it lost. */
wkv_status cuda_fail(CudaState* st, cudaError_t e, wkv_message* msg, const char* what) {
    set_message(msg, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
    switch (e) {
    case cudaErrorMemoryAllocation: return WKV_ERROR_OUT_OF_MEMORY;
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorAssert:
    case cudaErrorDevicesUnavailable:
    case cudaErrorUnknown:
        if (st) st->lost = true;
        return WKV_ERROR_DEVICE_LOST;
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidDeviceFunction: return WKV_ERROR_UNSUPPORTED;
    default: return WKV_ERROR_INTERNAL;
    }
}

/* Makes `device` current for the scope, restoring the caller's device afterwards. */
struct DeviceGuard {
    int prev = -1;
    bool changed = false;
    cudaError_t error = cudaSuccess;
    explicit DeviceGuard(int device) {
        error = cudaGetDevice(&prev);
        if (error == cudaSuccess && prev != device) {
            error = cudaSetDevice(device);
            changed = error == cudaSuccess;
        }
    }
    ~DeviceGuard() {
        if (changed) cudaSetDevice(prev);
    }
    DeviceGuard(const DeviceGuard&) = delete;
    DeviceGuard& operator=(const DeviceGuard&) = delete;
};

/* ----------------------------------------------------------------------------------- probe */

char g_probe_reason[512];

void cuda_probe(wkv_backend_info* out) {
    out->available = 0;
    out->device_count = 0;
    out->ops = 0;
    out->dtypes = 0;
    out->decay_forms = 0;
    out->any_head_size = 0;
    out->num_head_sizes = 0;
    for (int x = 0; x < WKV_MAX_HEAD_SIZES; ++x) out->head_sizes[x] = 0;
    out->reason = g_probe_reason;

    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        std::snprintf(g_probe_reason, sizeof g_probe_reason, "no CUDA device: cudaGetDeviceCount: %s (%s)",
                      cudaGetErrorName(e), cudaGetErrorString(e));
        cudaGetLastError();
        return;
    }
    if (count <= 0) {
        std::snprintf(g_probe_reason, sizeof g_probe_reason,
                      "no CUDA device: cudaGetDeviceCount found 0 devices");
        return;
    }
    /* The fatbin must hold code for device 0 (each context checks its own device again). */
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
    {
        DeviceGuard guard(0);
        e = guard.error != cudaSuccess ? guard.error : (cudaError_t)rwkv7_check_kernel_image(64);
    }
    if (e != cudaSuccess) {
        std::snprintf(g_probe_reason, sizeof g_probe_reason,
                      "CUDA device 0 (sm_%d%d) cannot run this plugin (built for CUDA architectures "
                      "%s): %s (%s)",
                      major, minor, WKV_CUDA_ARCHS, cudaGetErrorName(e), cudaGetErrorString(e));
        cudaGetLastError();
        return;
    }
    std::snprintf(g_probe_reason, sizeof g_probe_reason,
                  "%d CUDA device(s); device 0 is sm_%d%d; built for %s", count, major, minor,
                  WKV_CUDA_ARCHS);
    out->available = 1;
    out->device_count = count;
    out->ops = 1u << WKV_OP_RWKV7;
    out->dtypes = 7u;
    out->decay_forms = (1u << WKV_DECAY_DIRECT) | (1u << WKV_DECAY_LOG) |
                       (1u << WKV_DECAY_EXP_NEG_EXP) | (1u << WKV_DECAY_CLAMPW);
    out->any_head_size = 0;
    out->num_head_sizes = kNumHeadSizes;
    for (int x = 0; x < kNumHeadSizes; ++x) out->head_sizes[x] = kHeadSizes[x];
}

wkv_status cuda_device_info(int32_t index, wkv_device_info* out, wkv_message* msg) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        cudaGetLastError();
        set_message(msg, "no CUDA device: cudaGetDeviceCount: %s", cudaGetErrorString(e));
        return WKV_ERROR_BACKEND_UNAVAILABLE;
    }
    if (index < 0 || index >= count) {
        set_message(msg, "device index %d is out of range (%d CUDA device(s))", (int)index, count);
        return WKV_ERROR_INVALID_ARGUMENT;
    }
    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, index);
    if (e != cudaSuccess) {
        cudaGetLastError();
        set_message(msg, "cudaGetDeviceProperties(%d): %s", (int)index, cudaGetErrorString(e));
        return WKV_ERROR_INTERNAL;
    }
    std::snprintf(out->name, sizeof out->name, "%s", prop.name);
    out->memory_bytes = (uint64_t)prop.totalGlobalMem;
    out->compute_units = prop.multiProcessorCount;
    return WKV_OK;
}

/* ---------------------------------------------------------------------------- create/destroy */

void cuda_destroy(void* state) {
    CudaState* st = static_cast<CudaState*>(state);
    if (!st) return;
    if (st->own_stream) {
        DeviceGuard guard(st->device);
        cudaStreamDestroy(st->own_stream);
    }
    delete st;
}

wkv_status cuda_create(const wkv_backend_create_args* args, void** out_state, wkv_message* msg) {
    *out_state = nullptr;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count <= 0) {
        cudaGetLastError();
        set_message(msg, "no CUDA device: cudaGetDeviceCount: %s",
                    e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return WKV_ERROR_BACKEND_UNAVAILABLE;
    }
    const int device = args->device_index;
    if (device < 0 || device >= count) {
        set_message(msg, "device_index %d is out of range (%d CUDA device(s))", device, count);
        return WKV_ERROR_INVALID_ARGUMENT;
    }
    CudaState* st = new (std::nothrow) CudaState;
    if (!st) {
        set_message(msg, "cannot allocate the backend state");
        return WKV_ERROR_OUT_OF_MEMORY;
    }
    st->device = device;
    DeviceGuard guard(device);
    if (guard.error != cudaSuccess) {
        wkv_status s = cuda_fail(nullptr, guard.error, msg, "cudaSetDevice");
        cudaGetLastError();
        delete st;
        return s == WKV_ERROR_INTERNAL ? WKV_ERROR_BACKEND_UNAVAILABLE : s;
    }
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    e = (cudaError_t)rwkv7_check_kernel_image(64);
    if (e != cudaSuccess) {
        cudaGetLastError();
        set_message(msg, "CUDA device %d (sm_%d%d) cannot run this plugin (built for CUDA "
                    "architectures %s): %s", device, major, minor, WKV_CUDA_ARCHS, cudaGetErrorString(e));
        delete st;
        return WKV_ERROR_BACKEND_UNAVAILABLE;
    }
    cudaDeviceGetAttribute(&st->sm_count, cudaDevAttrMultiProcessorCount, device);
    cudaDeviceGetAttribute(&st->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    int smem_sm = 0, smem_reserved = 0;
    cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
    cudaDeviceGetAttribute(&smem_reserved, cudaDevAttrReservedSharedMemoryPerBlock, device);
    /* Backward (K1, K2) per head size: the longest segment (fewest checkpoints) whose shared
     * memory lets two blocks share an SM, if one with K1 >= 8 does; else the longest that fits
     * one block. Longer windows (K2) first among equal K1. */
    static const int kCand[][2] = {{16, 8}, {16, 4}, {8, 4}, {8, 2}, {4, 2}, {4, 1}, {2, 1}};
    const size_t two_blocks = smem_sm > 2 * smem_reserved ? (size_t)(smem_sm / 2 - smem_reserved) : 0;
    for (int x = 0; x < kNumHeadSizes; ++x) {
        const int N = kHeadSizes[x];
        st->smem_min[x] = rwkv7_bwd_smem_bytes(N, 2, 1);
        int pick = -1;
        for (int pass = 0; pass < 2 && pick < 0; ++pass)
            for (int c = 0; c < (int)(sizeof kCand / sizeof kCand[0]) && pick < 0; ++c) {
                const int K1 = kCand[c][0], K2 = kCand[c][1];
                const size_t bytes = rwkv7_bwd_smem_bytes(N, K1, K2);
                const bool fits = pass == 0 ? (K1 >= 8 && bytes <= two_blocks)
                                            : bytes <= (size_t)st->smem_optin;
                if (fits && K1 <= rwkv7_max_k1()) pick = c;
            }
        if (pick < 0) continue;
        const size_t bytes = rwkv7_bwd_smem_bytes(N, kCand[pick][0], kCand[pick][1]);
        e = (cudaError_t)rwkv7_prepare_backward(N, bytes);
        if (e != cudaSuccess) {
            cudaGetLastError();
            continue;
        }
        st->K1[x] = kCand[pick][0];
        st->K2[x] = kCand[pick][1];
        st->smem[x] = bytes;
    }
    e = cudaStreamCreateWithFlags(&st->own_stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        wkv_status s = cuda_fail(nullptr, e, msg, "cudaStreamCreateWithFlags");
        cudaGetLastError();
        delete st;
        return s;
    }
    st->stream = st->own_stream;
    *out_state = st;
    return WKV_OK;
}

wkv_status cuda_control(void* state, int32_t request, void* data, wkv_message* msg) {
    CudaState* st = static_cast<CudaState*>(state);
    switch (request) {
    case WKV_CONTROL_CUDA_SET_STREAM:
        st->stream = static_cast<cudaStream_t>(data);
        return WKV_OK;
    case WKV_CONTROL_CUDA_GET_STREAM:
        *static_cast<cudaStream_t*>(data) = st->stream;
        return WKV_OK;
    default:
        set_message(msg, "unknown control request %d", (int)request);
        return WKV_ERROR_UNSUPPORTED;
    }
}

/* ------------------------------------------------------------------------------ the problem */

DevView to_dev(const wkv_view& v) {
    DevView d;
    d.data = v.data;
    for (int x = 0; x < 4; ++x) d.s[x] = v.stride[x];
    d.elem = (int32_t)v.elem;
    d.pad_ = 0;
    return d;
}

/* Checks what the core does not: op, head size, decay form, element alignment. */
wkv_status check_problem(const CudaState* st, const wkv_problem* p, wkv_message* msg, int* hidx) {
    if (st->lost) {
        set_message(msg, "an earlier call failed on the device; destroy this context");
        return WKV_ERROR_DEVICE_LOST;
    }
    if (p->op != WKV_OP_RWKV7) {
        set_message(msg, "op %s (%d) is not implemented by the CUDA backend yet", op_name(p->op),
                    (int)p->op);
        return WKV_ERROR_UNSUPPORTED;
    }
    *hidx = head_index(p->N);
    if (*hidx < 0) {
        set_message(msg, "head size N=%lld is not supported by the CUDA backend (supported: 32, 64, 128)",
                    (long long)p->N);
        return WKV_ERROR_UNSUPPORTED;
    }
    if (p->decay_form < WKV_DECAY_DIRECT || p->decay_form > WKV_DECAY_CLAMPW) {
        set_message(msg, "decay_form %d is not supported", (int)p->decay_form);
        return WKV_ERROR_UNSUPPORTED;
    }
    if (p->H > INT32_MAX) {
        set_message(msg, "H=%lld is too large for the CUDA backend", (long long)p->H);
        return WKV_ERROR_UNSUPPORTED;
    }
    const struct {
        const char* name;
        const wkv_view* v;
    } views[] = {{"r", &p->r},           {"w", &p->w},       {"k", &p->k},
                 {"v", &p->v},           {"a", &p->a},       {"b", &p->b},
                 {"y", &p->y},           {"state_in", &p->state_in}, {"state_out", &p->state_out},
                 {"dy", &p->dy},         {"dstate_out", &p->dstate_out}, {"dr", &p->dr},
                 {"dw", &p->dw},         {"dk", &p->dk},     {"dv", &p->dv},
                 {"da", &p->da},         {"db", &p->db},     {"dstate_in", &p->dstate_in}};
    for (const auto& x : views) {
        if (!x.v->data) continue;
        const uintptr_t a = reinterpret_cast<uintptr_t>(x.v->data);
        if (a % (uintptr_t)wkv_elem_size(x.v->elem) != 0) {
            set_message(msg, "%s is not aligned to its element size (%lld bytes): the CUDA backend "
                        "needs naturally aligned tensors", x.name, (long long)wkv_elem_size(x.v->elem));
            return WKV_ERROR_UNSUPPORTED;
        }
    }
    return WKV_OK;
}

/* Sequences per launch: packed problems carry their offsets in the parameters. */
int64_t seqs_per_launch(const wkv_problem* p) {
    if (p->seq_offsets) return kMaxSeqsPerLaunch;
    const int64_t max_blocks = 0x7fffffff;
    int64_t n = max_blocks / p->H;
    return n < 1 ? 1 : n;
}

void fill_seq(const wkv_problem* p, int64_t first, int64_t count, SeqInfo* q) {
    q->first = first;
    q->count = (int32_t)(count < (int64_t)kMaxSeqsPerLaunch ? count : (int64_t)kMaxSeqsPerLaunch);
    q->packed = p->seq_offsets ? 1 : 0;
    if (p->seq_offsets) {
        for (int64_t x = 0; x <= count; ++x) q->off[x] = p->seq_offsets[first + x];
    }
}

wkv_status cuda_forward(void* state, const wkv_problem* p, wkv_message* msg) {
    CudaState* st = static_cast<CudaState*>(state);
    int hidx = -1;
    wkv_status s = check_problem(st, p, msg, &hidx);
    if (s != WKV_OK) return s;
    if (p->num_seqs == 0 || p->H == 0) return WKV_OK;
    DeviceGuard guard(st->device);
    if (guard.error != cudaSuccess) return cuda_fail(st, guard.error, msg, "cudaSetDevice");

    Rwkv7FwdParams prm;
    std::memset(&prm, 0, sizeof prm);
    prm.r = to_dev(p->r);
    prm.w = to_dev(p->w);
    prm.k = to_dev(p->k);
    prm.v = to_dev(p->v);
    prm.a = to_dev(p->a);
    prm.b = to_dev(p->b);
    prm.y = to_dev(p->y);
    prm.state_in = to_dev(p->state_in);
    prm.state_out = to_dev(p->state_out);
    prm.T = p->T;
    prm.H = (int32_t)p->H;
    prm.form = (int32_t)p->decay_form;
    const int64_t per = seqs_per_launch(p);
    for (int64_t first = 0; first < p->num_seqs; first += per) {
        const int64_t count = p->num_seqs - first < per ? p->num_seqs - first : per;
        fill_seq(p, first, count, &prm.seq);
        const cudaError_t e = (cudaError_t)rwkv7_launch_forward((int)p->N, prm, count * p->H, st->stream);
        if (e != cudaSuccess) return cuda_fail(st, e, msg, "RWKV-7 forward launch");
    }
    return WKV_OK;
}

/* Checkpoint count G of the backward (see the top of the file), in checked arithmetic. */
bool checkpoint_bytes(const wkv_problem* p, int K1, uint64_t* bytes) {
    const uint64_t N = (uint64_t)p->N, H = (uint64_t)p->H;
    uint64_t G = 0;
    if (p->seq_offsets) {
        for (int64_t s = 0; s < p->num_seqs; ++s)
            G += (uint64_t)((p->seq_offsets[s + 1] - p->seq_offsets[s] + K1 - 1) / K1);
    } else {
        const uint64_t per = (uint64_t)((p->T + K1 - 1) / K1);
        if (per && (uint64_t)p->B > UINT64_MAX / per) return false;
        G = (uint64_t)p->B * per;
    }
    uint64_t x = 4 * N * N; /* N <= 128 */
    if (H && x > UINT64_MAX / H) return false;
    x *= H;
    if (G && x > UINT64_MAX / G) return false;
    x *= G;
    if (x > UINT64_MAX - 256) return false;
    x += 256;
    if (x > (uint64_t)SIZE_MAX) return false;
    *bytes = x;
    return true;
}

wkv_status plan_backward(const CudaState* st, const wkv_problem* p, int hidx, size_t* bytes,
                         wkv_message* msg) {
    if (st->K1[hidx] == 0) {
        set_message(msg, "RWKV-7 backward with N=%lld needs %zu bytes of shared memory per block; "
                    "this GPU offers %d", (long long)p->N, st->smem_min[hidx], st->smem_optin);
        return WKV_ERROR_UNSUPPORTED;
    }
    uint64_t b = 0;
    if (!checkpoint_bytes(p, st->K1[hidx], &b)) {
        set_message(msg, "the RWKV-7 backward workspace for B=%lld T=%lld H=%lld N=%lld overflows size_t",
                    (long long)p->B, (long long)p->T, (long long)p->H, (long long)p->N);
        return WKV_ERROR_OVERFLOW;
    }
    *bytes = (size_t)b;
    return WKV_OK;
}

wkv_status cuda_workspace_size(void* state, const wkv_problem* p, size_t* out_bytes, wkv_message* msg) {
    CudaState* st = static_cast<CudaState*>(state);
    int hidx = -1;
    wkv_status s = check_problem(st, p, msg, &hidx);
    if (s != WKV_OK) return s;
    return plan_backward(st, p, hidx, out_bytes, msg);
}

wkv_status cuda_backward(void* state, const wkv_problem* p, wkv_message* msg) {
    CudaState* st = static_cast<CudaState*>(state);
    int hidx = -1;
    wkv_status s = check_problem(st, p, msg, &hidx);
    if (s != WKV_OK) return s;
    size_t need = 0;
    s = plan_backward(st, p, hidx, &need, msg);
    if (s != WKV_OK) return s;
    if (!p->workspace || p->workspace_size < need) {
        set_message(msg, "the workspace has %zu bytes; RWKV-7 backward needs %zu",
                    p->workspace ? p->workspace_size : (size_t)0, need);
        return WKV_ERROR_WORKSPACE_TOO_SMALL;
    }
    if (p->num_seqs == 0 || p->H == 0) return WKV_OK;
    DeviceGuard guard(st->device);
    if (guard.error != cudaSuccess) return cuda_fail(st, guard.error, msg, "cudaSetDevice");

    /* The workspace must be memory the GPU can address (device, managed or pinned host). */
    cudaPointerAttributes attr;
    cudaError_t e = cudaPointerGetAttributes(&attr, p->workspace);
    if (e != cudaSuccess || attr.type == cudaMemoryTypeUnregistered) {
        cudaGetLastError();
        set_message(msg, "the workspace is not CUDA memory (allocate it with cudaMalloc, %zu bytes)", need);
        return WKV_ERROR_DEVICE_MISMATCH;
    }

    Rwkv7BwdParams prm;
    std::memset(&prm, 0, sizeof prm);
    prm.r = to_dev(p->r);
    prm.w = to_dev(p->w);
    prm.k = to_dev(p->k);
    prm.v = to_dev(p->v);
    prm.a = to_dev(p->a);
    prm.b = to_dev(p->b);
    prm.state_in = to_dev(p->state_in);
    prm.dy = to_dev(p->dy);
    prm.dstate_out = to_dev(p->dstate_out);
    prm.dr = to_dev(p->dr);
    prm.dw = to_dev(p->dw);
    prm.dk = to_dev(p->dk);
    prm.dv = to_dev(p->dv);
    prm.da = to_dev(p->da);
    prm.db = to_dev(p->db);
    prm.dstate_in = to_dev(p->dstate_in);
    const uintptr_t base = reinterpret_cast<uintptr_t>(p->workspace);
    prm.ckpt = reinterpret_cast<float*>((base + 255u) & ~(uintptr_t)255u);
    prm.T = p->T;
    prm.H = (int32_t)p->H;
    prm.form = (int32_t)p->decay_form;
    prm.K1 = st->K1[hidx];
    prm.K2 = st->K2[hidx];
    const int64_t per = seqs_per_launch(p);
    int64_t seg = 0; /* packed: segments of the sequences before `first` */
    for (int64_t first = 0; first < p->num_seqs; first += per) {
        const int64_t count = p->num_seqs - first < per ? p->num_seqs - first : per;
        fill_seq(p, first, count, &prm.seq);
        if (p->seq_offsets) {
            for (int64_t x = 0; x <= count; ++x) {
                prm.seg0[x] = seg;
                if (x < count) {
                    const int64_t len = p->seq_offsets[first + x + 1] - p->seq_offsets[first + x];
                    seg += (len + prm.K1 - 1) / prm.K1;
                }
            }
        }
        e = (cudaError_t)rwkv7_launch_backward((int)p->N, prm, count * p->H, st->smem[hidx], st->stream);
        if (e != cudaSuccess) return cuda_fail(st, e, msg, "RWKV-7 backward launch");
    }
    return WKV_OK;
}

/* Named assignments on a zeroed table: members appended to the interface later stay NULL. */
wkv_backend_iface make_iface() {
    wkv_backend_iface f;
    std::memset(&f, 0, sizeof f);
    f.abi_version = WKV_BACKEND_ABI_VERSION;
    f.struct_size = (uint32_t)sizeof(wkv_backend_iface);
    f.kind = WKV_BACKEND_CUDA;
    f.name = "cuda";
    f.probe = cuda_probe;
    f.device_info = cuda_device_info;
    f.create = cuda_create;
    f.destroy = cuda_destroy;
    f.workspace_size = cuda_workspace_size;
    f.forward = cuda_forward;
    f.backward = cuda_backward;
    f.control = cuda_control;
    return f;
}

const wkv_backend_iface kCudaIface = make_iface();

} // namespace

extern "C" __attribute__((visibility("default"))) const wkv_backend_iface* wkv_plugin_entry(
    uint32_t core_abi_version) {
    if (core_abi_version < 1u) return nullptr;
    return &kCudaIface;
}
