/* The CUDA backend plugin (libwkv_cuda.so): its function table and host side.
 *
 * Contract (src/backend.h) and what this file adds to it:
 * - probe() never fails hard: without a driver or a device it reports available = 0 and why
 *   ("no NVIDIA driver/GPU found ..."). cudart is linked statically, so the plugin
 *   loads on machines with no CUDA installed at all.
 * - A context owns one non-blocking stream on its device (created at create, destroyed at
 *   destroy). WKV_CONTROL_CUDA_SET_STREAM replaces it with the caller's stream (NULL = the
 *   legacy default stream, only when asked for); GET_STREAM reads it. Every kernel is enqueued
 *   on that stream and the calls return without synchronising.
 * - With device memory only (device pointers, managed memory, wkv_buffers, a device or buffer
 *   workspace) no host<->device copy happens in a call, and no allocation but one: the chunked
 *   RWKV-7 forward's workspace, which is the caller's scratch (wkv_forward_desc.scratch) when
 *   given and otherwise comes from the context's stream-ordered pool (kChunkWsMax below). The
 *   backward's only scratch is the caller's workspace, and packed-sequence offsets travel as
 *   kernel parameters (launches of at most kMaxSeqsPerLaunch sequences). So forward and
 *   backward can be captured in a CUDA graph.
 * - Host memory and buffers: cuda_memory.cpp (the staging of host tensors through a device
 *   scratch; buffers as cudaMalloc allocations).
 * - The calling thread's current device is switched to the context's device for a call and
 *   restored afterwards.
 *
 * BACKWARD WORKSPACE (bytes). RWKV-6 and RWKV-4: the formulas at the top of rwkv6.cu and rwkv4.cu
 * (checkpoints, per-sequence partial sums of du / dw reduced in a fixed order by a second
 * kernel, and for RWKV-6 the replay states of one launch). RWKV-7, for head size N and the
 * context's checkpoint interval K1:
 *     256 + 4 * H * N * N * G,   G = sum over sequences s of ceil(L_s / K1)
 *                                   (unpacked: B * ceil(T / K1))
 * (K1, K2) (segment, replay window) is chosen per device at context creation: the longest
 * segment whose shared memory lets two blocks share an SM (K1 >= 8), else the longest that fits
 * one block (see cuda_create). On an H100: N = 32 and 64: K1 = 8, K2 = 4; N = 128: K1 = 8, K2 = 2.
 * E.g. B=8 T=4096 H=32 N=64: 2 GiB. Where the chunked RWKV-7 backward runs
 * (rwkv7_use_chunked_bwd), the larger of that and its own workspace, ~66 KB per 32 tokens and
 * head (B=1 T=4096 H=32: 270 MB; rwkv7_chunk_bwd.cu). Query wkv_workspace_size on the context
 * that will run the backward.
 *
 * Supported: RWKV-7 and RWKV-6/5 with N in {32, 64, 128}, RWKV-4 with any C; float32/float16/
 * bfloat16 per tensor, every decay form, any strides, packed sequences, both state orders
 * (RWKV-4: planar or interleaved). Other N return WKV_ERROR_UNSUPPORTED. */
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "backend.h"
#include "attention_plan.h"
#include "cuda_internal.h"
#include "cuda_memory.h"
#include "cuda_state.h"

#ifndef WKV_CUDA_ARCHS
#define WKV_CUDA_ARCHS "?"
#endif

namespace {

using namespace wkv_cuda;

/* The chunked RWKV-7 forward's workspace (rwkv7_use_chunked): 1.5 KB per token and head
 * (B = 1, H = 32, T = 4096: 202 MB). Calls needing more than kChunkWsMax bytes take the
 * sequential forward (B x H = 32: T up to ~21k tokens). It is the caller's scratch
 * (wkv_forward_desc.scratch, wkv_forward_scratch_size bytes: the workspace plus kScratchAlign
 * to align it), else it comes from the context's pool, which keeps what the last call needed
 * between calls (until the context is destroyed): a fixed smaller threshold made every B = 2,
 * T = 4096 call (404 MB) give its memory back at the synchronisation and allocate it again
 * (+0.2 ms of host time per call, measured); keeping the last call's need avoids that for
 * repeated shapes without holding 1 GiB after one long call. */
constexpr size_t kChunkWsMax = (size_t)1 << 30;

/* ----------------------------------------------------------------------------------- probe */

char g_probe_reason[512];

/* Why cudaGetDeviceCount found nothing, in a user's words: the static cudart reports a missing
 * driver as "driver version is insufficient", which misleads on a machine without any. */
static void no_device_reason(cudaError_t e, char* out, size_t size) {
    if (e == cudaErrorInsufficientDriver) {
        void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
        if (!driver) {
            std::snprintf(out, size, "no NVIDIA driver/GPU found (libcuda.so.1 cannot be loaded)");
            return;
        }
        dlclose(driver);
        std::snprintf(out, size, "the NVIDIA driver is older than this plugin's CUDA runtime (%s)",
                      cudaGetErrorString(e));
        return;
    }
    if (e == cudaErrorNoDevice) {
        std::snprintf(out, size, "no NVIDIA GPU found (the driver is installed; cudaErrorNoDevice)");
        return;
    }
    std::snprintf(out, size, "no CUDA device: cudaGetDeviceCount: %s (%s)", cudaGetErrorName(e),
                  cudaGetErrorString(e));
}

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
        no_device_reason(e, g_probe_reason, sizeof g_probe_reason);
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
    out->ops = (1u << WKV_OP_RWKV7) | (1u << WKV_OP_RWKV6) | (1u << WKV_OP_RWKV4);
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
        char why[160];
        no_device_reason(e, why, sizeof why);
        set_message(msg, "%s", why);
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
    if (st->own_stream || st->scratch || st->chunk_pool) {
        DeviceGuard guard(st->device);
        if (st->scratch) cudaFree(st->scratch); /* staged calls finish before they return */
        /* frees still queued on a stream complete first: the runtime releases the pool then */
        if (st->chunk_pool) cudaMemPoolDestroy(st->chunk_pool);
        if (st->own_stream) cudaStreamDestroy(st->own_stream);
        cudaGetLastError();
    }
    delete st;
}

wkv_status cuda_create(const wkv_backend_create_args* args, void** out_state, wkv_message* msg) {
    *out_state = nullptr;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count <= 0) {
        cudaGetLastError();
        char why[160];
        no_device_reason(e != cudaSuccess ? e : cudaErrorNoDevice, why, sizeof why);
        set_message(msg, "%s", why);
        return WKV_ERROR_BACKEND_UNAVAILABLE;
    }
    const int device = args->device_index;
    if (device < 0 || device >= count) {
        set_message(msg, "device_index %d is out of range (%d CUDA device(s))", device, count);
        return WKV_ERROR_INVALID_ARGUMENT;
    }
    const wkv_fault_hook fault = wkv_fault_hook_from(args);
    CudaState* st = wkv_fault_hit(&fault, WKV_FAULT_OOM, "state") ? nullptr : new (std::nothrow) CudaState;
    if (!st) {
        set_message(msg, "cannot allocate the backend state");
        return WKV_ERROR_OUT_OF_MEMORY;
    }
    st->device = device;
    st->fault = fault;
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
    st->fwd_saves = rwkv7_prepare_saving_forward(64, &st->fwd_ck_smem) == (int)cudaSuccess;
    cudaGetLastError();
    /* The chunked RWKV-7 forward: its kernels' shared memory and the pool of its workspace
     * (release threshold 0 until a call sets it, see chunk_pool_keep). */
    if (rwkv7_prepare_chunked(64) == (int)cudaSuccess) {
        st->chunk_ready = true;
        cudaMemPoolProps props;
        std::memset(&props, 0, sizeof props);
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = device;
        if (cudaMemPoolCreate(&st->chunk_pool, &props) != cudaSuccess) st->chunk_pool = nullptr;
    }
    cudaGetLastError();
    if (const char* env = std::getenv("WKV_CUDA_RWKV7_CHUNKED"))
        st->chunk_mode = env[0] == '1' ? 1 : env[0] == '0' ? 0 : -1;
    st->chunk_bwd_ready = st->chunk_ready && rwkv7_prepare_chunked_bwd(64) == (int)cudaSuccess;
    cudaGetLastError();
    if (const char* env = std::getenv("WKV_CUDA_RWKV7_CHUNKED_BWD"))
        st->chunk_bwd_mode = env[0] == '1' ? 1 : env[0] == '0' ? 0 : -1;
    st->attn_ready = attn_prepare((size_t)st->smem_optin) == (int)cudaSuccess;
    st->attn_bwd_max_d = attn_bwd_prepare((size_t)st->smem_optin);
    cudaGetLastError();
    if (const char* env = std::getenv("WKV_CUDA_ATTENTION")) st->attn_enabled = env[0] == '1' && env[1] == 0;
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


/* Checks what the core does not: op, head size, decay form, element alignment. */
wkv_status check_problem(const CudaState* st, const wkv_problem* p, wkv_message* msg, int* hidx) {
    if (st->lost) return context_lost(msg);
    if (p->op != WKV_OP_RWKV7 && p->op != WKV_OP_RWKV6 && p->op != WKV_OP_RWKV4) {
        set_message(msg, "op %s (%d) is not implemented by the CUDA backend", op_name(p->op),
                    (int)p->op);
        return WKV_ERROR_UNSUPPORTED;
    }
    if (p->op == WKV_OP_RWKV4) {
        *hidx = -1;
        if (p->decay_form != WKV_DECAY_EXP_NEG_EXP) {
            set_message(msg, "RWKV-4 needs decay_form WKV_DECAY_EXP_NEG_EXP, not %d", (int)p->decay_form);
            return WKV_ERROR_UNSUPPORTED;
        }
        if (p->N > INT32_MAX || p->H != 1) {
            set_message(msg, "RWKV-4 with C=%lld channels is too large for the CUDA backend",
                        (long long)p->N);
            return WKV_ERROR_UNSUPPORTED;
        }
    }
    if (p->op != WKV_OP_RWKV4) *hidx = head_index(p->N);
    if (p->op != WKV_OP_RWKV4 && *hidx < 0) {
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
    if (p->op == WKV_OP_RWKV4) return 65535; /* grid.y */
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

/* Packed sequences: seg0[x] = the checkpoint segments (of K tokens) of every sequence before
 * first + x, for x = 0..count; seg is that count for `first`. Returns it for first + count. */
int64_t fill_seg0(const wkv_problem* p, int64_t first, int64_t count, int64_t K, int64_t seg, int64_t* seg0) {
    if (!p->seq_offsets) return seg;
    for (int64_t x = 0; x <= count; ++x) {
        seg0[x] = seg;
        if (x < count) seg += (p->seq_offsets[first + x + 1] - p->seq_offsets[first + x] + K - 1) / K;
    }
    return seg;
}

/* Enqueues the RWKV-6 or RWKV-4 forward on the placed views; the cudaError_t as int. */
int forward_rwkv64(CudaState* st, const wkv_problem* p, const Placement& pl) {
    const int64_t per = seqs_per_launch(p);
    if (p->op == WKV_OP_RWKV6) {
        Rwkv6FwdParams prm;
        std::memset(&prm, 0, sizeof prm);
        prm.r = pl.v[0];
        prm.w = pl.v[1];
        prm.k = pl.v[2];
        prm.v = pl.v[3];
        prm.u = pl.v[6];
        prm.y = pl.v[kY];
        prm.state_in = pl.v[kStateIn];
        prm.state_out = pl.v[kStateOut];
        prm.T = p->T;
        prm.H = (int32_t)p->H;
        prm.form = (int32_t)p->decay_form;
        if (p->save_checkpoints) prm.ckpt = checkpoint_area(device_workspace(p)); /* cuda_saves_checkpoints said yes */
        int64_t seg = 0; /* saving, packed: segments of the sequences before `first` */
        for (int64_t first = 0; first < p->num_seqs; first += per) {
            const int64_t count = p->num_seqs - first < per ? p->num_seqs - first : per;
            fill_seq(p, first, count, &prm.seq);
            if (prm.ckpt) seg = fill_seg0(p, first, count, kRwkv6SegK, seg, prm.seg0);
            const int e = rwkv6_launch_forward((int)p->N, prm, count * p->H, st->stream);
            if (e != 0) return e;
        }
        return 0;
    }
    Rwkv4FwdParams prm;
    std::memset(&prm, 0, sizeof prm);
    prm.k = pl.v[2];
    prm.v = pl.v[3];
    prm.w = pl.v[1];
    prm.u = pl.v[6];
    prm.y = pl.v[kY];
    prm.state_in = pl.v[kStateIn];
    prm.state_out = pl.v[kStateOut];
    prm.T = p->T;
    prm.C = (int32_t)p->N;
    for (int64_t first = 0; first < p->num_seqs; first += per) {
        const int64_t count = p->num_seqs - first < per ? p->num_seqs - first : per;
        fill_seq(p, first, count, &prm.seq);
        const int e = rwkv4_launch_forward(prm, count, st->stream);
        if (e != 0) return e;
    }
    return 0;
}

/* Which RWKV-7 backward runs: the one place that decides.
 * - sequential (rwkv7_bwd.cu): checkpoints, then a replay per segment, one block per (sequence, head).
 * - chunked (rwkv7_chunk_bwd.cu): recomputes the chunked forward's per-chunk quantities and
 *   entry states, walks the chunks backwards for the state gradients at their boundaries, then
 *   all chunks' token gradients in parallel; more work than the sequential replay (B3's products
 *   on tensor cores), so it wins only where the (sequence, head) blocks leave SMs idle or
 *   unevenly loaded (NOTES.md v20, v31). The chunked forward's restriction: N = 64, CLAMPW,
 *   unpacked; it ignores saved checkpoints. Its workspace (rwkv7_chunk_bwd_ws_bytes: ~66 KB per
 *   chunk and head) is the caller's.
 * WKV_CUDA_RWKV7_CHUNKED_BWD=0 never, =1 wherever it applies (tests, measurements). */
bool rwkv7_use_chunked_bwd(const CudaState* st, const wkv_problem* p) {
    if (!st->chunk_bwd_ready || st->chunk_bwd_mode == 0) return false;
    if (p->op != WKV_OP_RWKV7 || p->N != 64 || p->decay_form != WKV_DECAY_CLAMPW || p->seq_offsets || p->T < 1)
        return false;
    const size_t bytes = rwkv7_chunk_bwd_ws_bytes(64, p->B, p->H, p->T);
    if (bytes == 0 || bytes > (size_t)4 * kChunkWsMax || p->B * p->H * ((p->T + 31) / 32) > 0x7fffffff) return false;
    if (st->chunk_bwd_mode == 1) return true;
    /* Chosen for the training step: where the chunked backward runs, the forward saves nothing
     * and is the one rwkv7_use_chunked picks (chunked to SMs / 2 heads, else the plain sequential
     * forward); elsewhere the sequential forward saves the checkpoints and this backward reuses
     * them. H100 (132 SMs), bf16 H = 32, ms, forward + backward as `wkv-bench perf --reuse`
     * times them (NOTES v36, after v34/v35's faster sequential kernels; v31 before them):
     *   heads B x H         32    64    96    128    160    192
     *   T = 4096 chunked   2.52  4.45  5.91  7.37   9.43  10.92
     *            saved                 6.70  6.79   9.86   9.85
     *   T = 1024 chunked         ~1.2  1.57  1.95   2.45   2.81
     *            saved     1.67  1.69  1.71  1.72   2.51   2.49
     * (the chunked backward as v31 measured it where this run did not; T = 4096 saved at 32 and
     * 64 heads not kept, flat as at T = 1024.)
     * The sequential step is flat while every (sequence, head) block has an SM to itself and
     * steps up once some SMs hold two; the chunked one grows ~1.45 ms (T = 4096) per 32 heads.
     * So the chunked path wins to ~0.82-0.87 SMs (crossing between 96 and 128 heads; 3/4 keeps a
     * margin) and again just past the step, to ~1.25-1.28 SMs (crossing between 160 and 192, 2-4%
     * left at 160 heads; 5/4). Measured at T = 1024 and 4096 (f16 as bf16); T >= 256 as the chunked
     * forward. */
    const int64_t heads4 = p->B * p->H * 4, sm = (int64_t)st->sm_count;
    return p->T >= 256 && (heads4 <= 3 * sm || (heads4 > 4 * sm && heads4 <= 5 * sm));
}

/* ABI v2: a forward saves the backward's checkpoints into a device workspace for RWKV-7 at
 * N = 32 / 64 (the backward's checkpoint pass runs in the forward's arithmetic there, rwkv7_bwd.cu)
 * and for RWKV-6 at every N (each state element is a scalar recurrence with the same fmaf in
 * both scans, rwkv6.cu). A host workspace would be replaced by scratch: not saved, the
 * backward recomputes. */
int32_t cuda_saves_checkpoints(void* state, const wkv_problem* p) {
    const CudaState* st = static_cast<const CudaState*>(state);
    if (st->lost || p->backward) return 0;
    /* RWKV-6 saves at N <= 64 only: at N = 128 the saving row scan ran 2.2x slower than the
     * plain one (H100), which ate the backward's gain (training step 0.99x; NOTES, RWKV-6 v6) */
    if (p->op == WKV_OP_RWKV6) return p->N <= 64 && device_workspace(p) != nullptr ? 1 : 0;
    if (p->op != WKV_OP_RWKV7) return 0;
    /* the chunked backward recomputes its chunks' entry states: saving would only slow the
     * forward (and keep it off the chunked forward) */
    if (rwkv7_use_chunked_bwd(st, p)) return 0;
    const int hidx = head_index(p->N);
    if (hidx < 0 || st->K1[hidx] == 0 || !st->fwd_saves || !rwkv7_forward_saves((int)p->N, st->K1[hidx])) return 0;
    return device_workspace(p) != nullptr ? 1 : 0;
}

/* Which RWKV-7 forward runs: the one place that decides.
 * - sequential (rwkv7.cu): one block per (sequence, head) walks T. Everything it supports.
 * - chunked (rwkv7_chunk.cu): chunks of 32 tokens computed in parallel, then a short walk over
 *   the chunk states; ~2.5x the flops of the sequential walk, but parallel over time, so it
 *   wins only where (sequence, head) blocks alone cannot fill the GPU and T is long (NOTES.md,
 *   "chunked forward" for the measurements behind the thresholds). It handles N = 64, CLAMPW
 *   (decay >= 0.545 keeps exp(-cumulative log decay) finite over a chunk; the other forms can
 *   decay to ~0), unpacked sequences, any T, strides and state options; not the checkpoint-
 *   saving forward (whose checkpoints are the sequential walk's states). Its rounding differs
 *   from the sequential kernel's (within the tests' tolerances), so T one-token calls equal
 *   one T-token call bit for bit only where the T-token call is not chunked.
 * WKV_CUDA_RWKV7_CHUNKED=0 never chunks, =1 chunks wherever it applies (tests, measurements). */
bool rwkv7_use_chunked(const CudaState* st, const wkv_problem* p) {
    if (!st->chunk_ready || st->chunk_mode == 0) return false;
    if (p->N != 64 || p->decay_form != WKV_DECAY_CLAMPW || p->seq_offsets || p->save_checkpoints || p->T < 2)
        return false;
    const size_t bytes = rwkv7_chunk_ws_bytes(64, p->B, p->H, p->T);
    if (bytes == 0 || bytes > kChunkWsMax || p->B * p->H * ((p->T + 31) / 32) > 0x7fffffff) return false;
    if (st->chunk_mode == 1) return true;
    /* H100 (132 SMs), f16 B = 1, chunked vs sequential (NOTES v36, after v34's faster
     * sequential forward): T = 1024 32 / 40 / 48 / 64 heads 0.215 / 0.284 / 0.313 / 0.368 vs
     * 0.364 / 0.377 / 0.382 / 0.376 ms; T = 4096 32 heads 0.76 vs 1.49, 64 heads 1.46 vs 1.52,
     * 128 heads ~2.8 vs 1.51 (the chunked work grows with the heads, the sequential time does
     * not until they fill the SMs): the chunked forward still wins to 64 heads, so SMs / 2.
     * B x H = 32, T = 512 0.116 vs 0.244 (before v34) */
    return p->B * p->H * 2 <= (int64_t)st->sm_count && p->T >= 256;
}

/* ABI v3: the scratch a forward of p can use: the chunked forward's workspace and room to
 * align it (the caller's memory may have any alignment), wherever it is chosen; else 0. */
wkv_status cuda_forward_scratch_size(void* state, const wkv_problem* p, size_t* out_bytes, wkv_message*) {
    const CudaState* st = static_cast<const CudaState*>(state);
    *out_bytes = p->op == WKV_OP_RWKV7 && rwkv7_use_chunked(st, p)
                     ? rwkv7_chunk_ws_bytes(64, p->B, p->H, p->T) + kScratchAlign
                     : 0;
    return WKV_OK;
}

/* What every RWKV-7 kernel's parameters take, the rest zeroed: the six placed inputs (the core's
 * first six views), T and H. */
template <class Params>
void set_rwkv7_inputs(Params* prm, const wkv_problem* p, const Placement& pl) {
    std::memset(prm, 0, sizeof *prm);
    prm->r = pl.v[0];
    prm->w = pl.v[1];
    prm->k = pl.v[2];
    prm->v = pl.v[3];
    prm->a = pl.v[4];
    prm->b = pl.v[5];
    prm->T = p->T;
    prm->H = (int32_t)p->H;
}

/* The parameters the sequential and the chunked RWKV-7 forwards share (the rest zeroed). */
template <class Params>
void set_rwkv7_forward_views(Params* prm, const wkv_problem* p, const Placement& pl) {
    set_rwkv7_inputs(prm, p, pl);
    prm->y = pl.v[kY];
    prm->state_in = pl.v[kStateIn];
    prm->state_out = pl.v[kStateOut];
}

/* The tensor views and sizes both RWKV-7 backwards take (the sequential one's Rwkv7BwdParams,
 * the chunked one's Rwkv7ChunkBwdParams), zeroing the rest. */
template <class Params>
void set_rwkv7_backward_views(Params* prm, const wkv_problem* p, const Placement& pl) {
    set_rwkv7_inputs(prm, p, pl);
    prm->dy = pl.v[kDy];
    prm->dstate_out = pl.v[kDstateOut];
    prm->dr = pl.v[kDr];
    prm->dw = pl.v[kDr + 1];
    prm->dk = pl.v[kDr + 2];
    prm->dv = pl.v[kDr + 3];
    prm->da = pl.v[kDr + 4];
    prm->db = pl.v[kDr + 5];
    prm->dstate_in = pl.v[kDstateIn];
}

/* The pool keeps twice a call's `bytes` between calls. Kept at exactly `bytes`, it gave its
 * memory back at every other synchronisation and cudaMallocFromPoolAsync mapped it again, 55-85
 * us of host time before the kernels (H100, B=1 H=32 f16, 202 MB at T=4096: `wkv-bench perf`
 * 0.784 -> 0.718 ms with 2x, T=1024 0.241 -> 0.204 ms; 1.25x still re-mapped at T=1024; cuda
 * NOTES, "The chunked forward's pool"). Not while the stream is being captured: setting an
 * attribute is no stream work, and the graph's own allocation does not come from the pool. */
void chunk_pool_keep(CudaState* st, uint64_t bytes) {
    bytes = bytes > UINT64_MAX / 2 ? UINT64_MAX : 2 * bytes;
    if (bytes == st->chunk_keep) return;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st->stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
        cudaGetLastError();
        return;
    }
    if (cudaMemPoolSetAttribute(st->chunk_pool, cudaMemPoolAttrReleaseThreshold, &bytes) == cudaSuccess)
        st->chunk_keep = bytes;
    else
        cudaGetLastError();
}

/* The chunked forward of an unpacked RWKV-7 problem: two kernels on a workspace that is the
 * caller's scratch (device memory: cuda_forward checked it), else comes from the context's pool
 * and is freed in stream order. Returns false (nothing enqueued) when the pool cannot give it:
 * the caller runs the sequential forward. */
bool forward_rwkv7_chunked(CudaState* st, const wkv_problem* p, const Placement& pl, char* scratch,
                           cudaError_t* err) {
    const size_t bytes = rwkv7_chunk_ws_bytes(64, p->B, p->H, p->T);
    void* ws = nullptr;
    if (scratch) {
        ws = align_up_ptr(scratch, kScratchAlign); /* the core checked bytes + kScratchAlign */
    } else if (!st->chunk_pool) {
        return false;
    } else {
        chunk_pool_keep(st, bytes);
        if (cudaMallocFromPoolAsync(&ws, bytes, st->chunk_pool, st->stream) != cudaSuccess) {
            cudaGetLastError();
            return false;
        }
    }
    Rwkv7ChunkParams prm;
    set_rwkv7_forward_views(&prm, p, pl);
    prm.B = p->B;
    prm.nc = (int32_t)((p->T + rwkv7_chunk_len(64) - 1) / rwkv7_chunk_len(64));
    prm.ws = static_cast<float*>(ws);
    *err = (cudaError_t)rwkv7_launch_chunked(64, prm, st->stream);
    if (!scratch) {
        const cudaError_t f = cudaFreeAsync(ws, st->stream);
        if (*err == cudaSuccess) *err = f;
    }
    return true;
}

wkv_status cuda_forward(void* state, const wkv_problem* p, wkv_message* msg) {
    CudaState* st = static_cast<CudaState*>(state);
    int hidx = -1;
    wkv_status s = check_problem(st, p, msg, &hidx);
    if (s != WKV_OK) return s;
    if (p->num_seqs == 0 || p->H == 0) return WKV_OK;
    DeviceGuard guard(st->device);
    if (guard.error != cudaSuccess) return cuda_fail(st, guard.error, msg, "cudaSetDevice");
    /* The caller's scratch (the core hands it on only where cuda_forward_scratch_size said the
     * chunked forward runs, and checked its size): device memory only, which the core cannot
     * tell from host memory. */
    char* scratch = nullptr;
    if (p->scratch && !(scratch = device_memory(p->scratch, p->scratch_mem))) {
        set_message(msg, "desc->scratch is host memory; it must be device (or managed) memory or a "
                         "wkv_buffer of the context (or NULL: the context's pool)");
        return WKV_ERROR_DEVICE_MISMATCH;
    }

    Placement pl;
    s = place_plan(p, false, 0, &pl, msg);
    if (s != WKV_OK) return s;
    StreamDrain drain(st->stream);
    s = stage_in(st, &pl, &drain, msg);
    if (s != WKV_OK) return s;

    if (fault_hit(st, WKV_FAULT_DEVICE_LOST, "submit"))
        return cuda_fail(st, cudaErrorLaunchFailure, msg, "forward launch (injected fault: WKV_FAULT=device_lost)");
    if (p->op == WKV_OP_RWKV6 || p->op == WKV_OP_RWKV4) {
        const int e = forward_rwkv64(st, p, pl);
        if (e != 0) return cuda_fail(st, (cudaError_t)e, msg,
                                     p->op == WKV_OP_RWKV6 ? "RWKV-6 forward launch" : "RWKV-4 forward launch");
        return stage_out(st, &pl, &drain, msg);
    }
    if (rwkv7_use_chunked(st, p)) {
        cudaError_t e = cudaSuccess;
        if (forward_rwkv7_chunked(st, p, pl, scratch, &e)) {
            if (e != cudaSuccess) return cuda_fail(st, e, msg, "RWKV-7 chunked forward launch");
            return stage_out(st, &pl, &drain, msg);
        }
    }
    Rwkv7FwdParams prm;
    set_rwkv7_forward_views(&prm, p, pl);
    prm.form = (int32_t)p->decay_form;
    if (p->save_checkpoints) { /* the core asked cuda_saves_checkpoints first */
        prm.ckpt = checkpoint_area(device_workspace(p));
        prm.K1 = st->K1[hidx];
        prm.ck_smem = st->fwd_ck_smem; /* read by the N = 64 kernel only */
    }
    const int64_t per = seqs_per_launch(p);
    int64_t seg = 0; /* saving, packed: segments of the sequences before `first` */
    for (int64_t first = 0; first < p->num_seqs; first += per) {
        const int64_t count = p->num_seqs - first < per ? p->num_seqs - first : per;
        fill_seq(p, first, count, &prm.seq);
        if (prm.ckpt) seg = fill_seg0(p, first, count, prm.K1, seg, prm.seg0);
        const cudaError_t e = (cudaError_t)rwkv7_launch_forward((int)p->N, prm, count * p->H, st->sm_count, st->stream);
        if (e != cudaSuccess) return cuda_fail(st, e, msg, "RWKV-7 forward launch");
    }
    return stage_out(st, &pl, &drain, msg);
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

/* The RWKV-6 / RWKV-4 backward workspace (the formulas at the top of rwkv6.cu / rwkv4.cu):
 * offsets from the 256-aligned base. */
struct Plan64 {
    uint64_t ckpt_off = 0, part_off = 0, seg_off = 0, total = 0;
};

uint64_t a256(uint64_t x) { return (x + 255u) / 256u * 256u; }

bool plan_rwkv64(const wkv_problem* p, Plan64* out) {
    const bool r6 = p->op == WKV_OP_RWKV6;
    const int64_t K = r6 ? (int64_t)kRwkv6SegK : (int64_t)kRwkv4SegK;
    uint64_t G = 0;
    if (p->seq_offsets) {
        for (int64_t s = 0; s < p->num_seqs; ++s)
            G += (uint64_t)((p->seq_offsets[s + 1] - p->seq_offsets[s] + K - 1) / K);
    } else if (__builtin_mul_overflow((uint64_t)p->B, (uint64_t)((p->T + K - 1) / K), &G)) {
        return false;
    }
    const uint64_t N = (uint64_t)p->N, H = (uint64_t)p->H, S = (uint64_t)p->num_seqs;
    uint64_t ckpt = 0, part = 0, seg = 0;
    bool ovf = false;
    if (r6) {
        ovf |= __builtin_mul_overflow(4 * N * N, H, &ckpt) || __builtin_mul_overflow(ckpt, G, &ckpt);
        ovf |= __builtin_mul_overflow(4 * N * H, S, &part);
    } else {
        ovf |= __builtin_mul_overflow(16 * N, G, &ckpt);
        ovf |= __builtin_mul_overflow(8 * N, S, &part);
    }
    if (ovf || ckpt > (UINT64_MAX >> 2) || part > (UINT64_MAX >> 2) || seg > (UINT64_MAX >> 2)) return false;
    out->ckpt_off = 0;
    out->part_off = a256(ckpt);
    out->seg_off = out->part_off + a256(part);
    out->total = 256 + out->seg_off + seg;
    return out->total <= (uint64_t)SIZE_MAX;
}

wkv_status plan_backward(const CudaState* st, const wkv_problem* p, int hidx, size_t* bytes,
                         wkv_message* msg) {
    if (p->op != WKV_OP_RWKV7) {
        Plan64 pl;
        if (!plan_rwkv64(p, &pl)) {
            set_message(msg, "the %s backward workspace for B=%lld T=%lld H=%lld N=%lld overflows size_t",
                        op_name(p->op), (long long)p->B, (long long)p->T, (long long)p->H, (long long)p->N);
            return WKV_ERROR_OVERFLOW;
        }
        *bytes = (size_t)pl.total;
        return WKV_OK;
    }
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
    /* the chunked backward's workspace and room to align it, where it runs */
    if (rwkv7_use_chunked_bwd(st, p)) {
        const uint64_t c = (uint64_t)rwkv7_chunk_bwd_ws_bytes(64, p->B, p->H, p->T) + kScratchAlign;
        if (c > b) b = c;
    }
    *bytes = (size_t)b;
    return WKV_OK;
}

/* Enqueues the RWKV-6 or RWKV-4 backward (and its reduction) on the placed views with the
 * device workspace ws; the cudaError_t as int. */
int backward_rwkv64(CudaState* st, const wkv_problem* p, const Placement& pl, char* ws) {
    Plan64 plan;
    if (!plan_rwkv64(p, &plan)) return (int)cudaErrorInvalidValue; /* checked before */
    const uintptr_t base = (reinterpret_cast<uintptr_t>(ws) + 255u) & ~(uintptr_t)255u;
    float* ckpt = reinterpret_cast<float*>(base + plan.ckpt_off);
    float* part = reinterpret_cast<float*>(base + plan.part_off);
    const int64_t per = seqs_per_launch(p);
    const bool r6 = p->op == WKV_OP_RWKV6;
    const int64_t K = r6 ? (int64_t)kRwkv6SegK : (int64_t)kRwkv4SegK;
    int64_t seg = 0; /* packed: segments of the sequences before `first` */
    if (r6) {
        Rwkv6BwdParams prm;
        std::memset(&prm, 0, sizeof prm);
        prm.r = pl.v[0];
        prm.w = pl.v[1];
        prm.k = pl.v[2];
        prm.v = pl.v[3];
        prm.u = pl.v[6];
        prm.state_in = pl.v[kStateIn];
        prm.dy = pl.v[kDy];
        prm.dstate_out = pl.v[kDstateOut];
        prm.dr = pl.v[kDr];
        prm.dw = pl.v[kDr + 1];
        prm.dk = pl.v[kDr + 2];
        prm.dv = pl.v[kDr + 3];
        prm.dstate_in = pl.v[kDstateIn];
        prm.ckpt = ckpt;
        prm.part = part;
        prm.T = p->T;
        prm.H = (int32_t)p->H;
        prm.form = (int32_t)p->decay_form;
        prm.reuse = p->reuse_checkpoints ? 1 : 0;
        for (int64_t first = 0; first < p->num_seqs; first += per) {
            const int64_t count = p->num_seqs - first < per ? p->num_seqs - first : per;
            fill_seq(p, first, count, &prm.seq);
            seg = fill_seg0(p, first, count, K, seg, prm.seg0);
            const int e = rwkv6_launch_backward((int)p->N, prm, count * p->H, st->stream);
            if (e != 0) return e;
        }
        return rwkv6_launch_reduce((int)p->N, part, pl.v[kDr + 6], p->num_seqs, (int32_t)p->H, st->stream);
    }
    Rwkv4BwdParams prm;
    std::memset(&prm, 0, sizeof prm);
    prm.k = pl.v[2];
    prm.v = pl.v[3];
    prm.w = pl.v[1];
    prm.u = pl.v[6];
    prm.state_in = pl.v[kStateIn];
    prm.dy = pl.v[kDy];
    prm.dstate_out = pl.v[kDstateOut];
    prm.dk = pl.v[kDr + 2];
    prm.dv = pl.v[kDr + 3];
    prm.dstate_in = pl.v[kDstateIn];
    prm.ckpt = ckpt;
    prm.part = part;
    prm.T = p->T;
    prm.C = (int32_t)p->N;
    for (int64_t first = 0; first < p->num_seqs; first += per) {
        const int64_t count = p->num_seqs - first < per ? p->num_seqs - first : per;
        fill_seq(p, first, count, &prm.seq);
        seg = fill_seg0(p, first, count, K, seg, prm.seg0);
        const int e = rwkv4_launch_backward(prm, count, st->stream);
        if (e != 0) return e;
    }
    return rwkv4_launch_reduce(part, pl.v[1], pl.v[kDr + 1], pl.v[kDr + 6], p->num_seqs, (int32_t)p->N,
                               st->stream);
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
        set_message(msg, "the workspace has %zu bytes; %s backward needs %zu",
                    p->workspace ? p->workspace_size : (size_t)0, op_name(p->op), need);
        return WKV_ERROR_WORKSPACE_TOO_SMALL;
    }
    if (p->num_seqs == 0 || p->H == 0) return WKV_OK;
    DeviceGuard guard(st->device);
    if (guard.error != cudaSuccess) return cuda_fail(st, guard.error, msg, "cudaSetDevice");

    /* The workspace: a wkv_buffer, device (or managed) memory used in place, or host memory
     * (pageable or pinned) replaced by device scratch. */
    char* ws = device_workspace(p);
    const bool ws_stage = ws == nullptr;
    Placement pl;
    s = place_plan(p, ws_stage, need, &pl, msg);
    if (s != WKV_OK) return s;
    StreamDrain drain(st->stream);
    s = stage_in(st, &pl, &drain, msg);
    if (s != WKV_OK) return s;
    if (ws_stage) ws = pl.workspace;
    if (fault_hit(st, WKV_FAULT_DEVICE_LOST, "submit"))
        return cuda_fail(st, cudaErrorLaunchFailure, msg, "backward launch (injected fault: WKV_FAULT=device_lost)");

    if (p->op != WKV_OP_RWKV7) {
        const int e = backward_rwkv64(st, p, pl, ws);
        if (e != 0) return cuda_fail(st, (cudaError_t)e, msg,
                                     p->op == WKV_OP_RWKV6 ? "RWKV-6 backward launch" : "RWKV-4 backward launch");
        return stage_out(st, &pl, &drain, msg);
    }
    cudaError_t e = cudaSuccess;
    if (rwkv7_use_chunked_bwd(st, p)) {
        Rwkv7ChunkParams f;
        set_rwkv7_forward_views(&f, p, pl);
        f.y = DevView{};
        f.state_out = DevView{};
        f.B = p->B;
        f.nc = (int32_t)((p->T + rwkv7_chunk_len(64) - 1) / rwkv7_chunk_len(64));
        f.ws = reinterpret_cast<float*>(align_up_ptr(ws, kScratchAlign)); /* need has the slack */
        Rwkv7ChunkBwdParams b;
        set_rwkv7_backward_views(&b, p, pl);
        b.B = p->B;
        b.nc = f.nc;
        b.ws = f.ws;
        b.ds = f.ws + rwkv7_chunk_ws_bytes(64, p->B, p->H, p->T) / sizeof(float);
        e = (cudaError_t)rwkv7_launch_chunked_bwd(64, f, b, st->stream);
        if (e != cudaSuccess) return cuda_fail(st, e, msg, "RWKV-7 chunked backward launch");
        return stage_out(st, &pl, &drain, msg);
    }
    Rwkv7BwdParams prm;
    set_rwkv7_backward_views(&prm, p, pl);
    prm.state_in = pl.v[kStateIn];
    prm.ckpt = checkpoint_area(ws);
    prm.reuse = p->reuse_checkpoints ? 1 : 0;
    prm.form = (int32_t)p->decay_form;
    prm.K1 = st->K1[hidx];
    prm.K2 = st->K2[hidx];
    const int64_t per = seqs_per_launch(p);
    int64_t seg = 0; /* packed: segments of the sequences before `first` */
    for (int64_t first = 0; first < p->num_seqs; first += per) {
        const int64_t count = p->num_seqs - first < per ? p->num_seqs - first : per;
        fill_seq(p, first, count, &prm.seq);
        seg = fill_seg0(p, first, count, prm.K1, seg, prm.seg0);
        e = (cudaError_t)rwkv7_launch_backward((int)p->N, prm, count * p->H, st->smem[hidx], st->stream);
        if (e != cudaSuccess) return cuda_fail(st, e, msg, "RWKV-7 backward launch");
    }
    return stage_out(st, &pl, &drain, msg);
}

/* ------------------------------------------------------------------------------ synchronize */

wkv_status cuda_synchronize(void* state, wkv_message* msg) {
    CudaState* st = static_cast<CudaState*>(state);
    if (st->lost) return context_lost(msg);
    DeviceGuard guard(st->device);
    if (guard.error != cudaSuccess) return cuda_fail(st, guard.error, msg, "cudaSetDevice");
    cudaError_t e = cudaStreamSynchronize(st->stream);
    /* an asynchronous failure of enqueued work, as a real one shows itself */
    if (e == cudaSuccess && fault_hit(st, WKV_FAULT_DEVICE_LOST, "sync")) e = cudaErrorLaunchFailure;
    if (e != cudaSuccess) return cuda_fail(st, e, msg, "cudaStreamSynchronize");
    return WKV_OK;
}

/* ------------------------------------------------------------------------------ attention */

/* The forward's configurations (wkv_attention_configs). Unpinned, a call takes the first whose
 * dtype and head dim match (elem -1 / D 0: any): the tensor-core kernel for f16/bf16 at
 * D = 64 and 128, the SIMT kernel otherwise. */
struct CudaAttnConfig {
    const char* name;
    int kernel;   /* kAttnSimt, kAttnMma */
    int elem;     /* wkv_elem, or -1: any */
    int D;        /* 0: any up to kAttnMaxD */
    int block_q, block_kv, warps;
};
constexpr CudaAttnConfig kAttnConfigs[] = {
    {"cuda.mma.f16.d64.q64.kv64", kAttnMma, WKV_ELEM_F16, 64, 64, 64, 4},
    {"cuda.mma.bf16.d64.q64.kv64", kAttnMma, WKV_ELEM_BF16, 64, 64, 64, 4},
    {"cuda.mma.f16.d128.q64.kv64", kAttnMma, WKV_ELEM_F16, 128, 64, 64, 4},
    {"cuda.mma.bf16.d128.q64.kv64", kAttnMma, WKV_ELEM_BF16, 128, 64, 64, 4},
    {"cuda.simt.q16.kv32", kAttnSimt, -1, 0, 16, 32, 4},
};
constexpr int kNumAttnConfigs = (int)(sizeof kAttnConfigs / sizeof kAttnConfigs[0]);

bool attn_config_takes(const CudaAttnConfig& c, const wkv_attention_problem* p) {
    return (c.elem < 0 || c.elem == (int)p->q.elem) && (c.D == 0 ? p->D <= kAttnMaxD : p->D == c.D);
}

int32_t cuda_attention_configs(void* state, wkv_attention_config* out, int32_t capacity) {
    const CudaState* st = static_cast<const CudaState*>(state);
    for (int32_t i = 0; i < capacity && i < kNumAttnConfigs; ++i) {
        const CudaAttnConfig& k = kAttnConfigs[i];
        wkv_attention_config& c = out[i];
        std::snprintf(c.name, sizeof c.name, "%s", k.name);
        c.dtype = k.elem == WKV_ELEM_F16 ? WKV_DTYPE_F16 : k.elem == WKV_ELEM_BF16 ? WKV_DTYPE_BF16 : wkv_dtype{0, 0, 0};
        c.head_dim = k.D;
        c.max_head_dim = k.D ? k.D : kAttnMaxD;
        c.block_q = k.block_q;
        c.block_kv = k.block_kv;
        c.warps = k.warps;
        c.shared_bytes = (uint64_t)(k.kernel == kAttnMma ? attn_mma_smem_bytes(k.D) : attn_smem_bytes(kAttnMaxD));
        c.fits = st->attn_enabled && (k.kernel == kAttnMma || st->attn_ready) ? 1 : 0;
        c.is_default = 1; /* each is what an unpinned call of its dtype and head dim takes */
    }
    return kNumAttnConfigs;
}

wkv_status cuda_attention(void* state, const wkv_attention_problem* p, wkv_message* msg) {
    CudaState* st = static_cast<CudaState*>(state);
    if (st->lost) return context_lost(msg);
    if (!st->attn_enabled) {
        set_message(msg, "softmax attention: the CUDA kernels have not yet been validated on a GPU; "
                         "set WKV_CUDA_ATTENTION=1 before creating the context to run them anyway, or use "
                         "the CPU or Vulkan backend");
        return WKV_ERROR_UNSUPPORTED;
    }
    if (p->D > kAttnMaxD) {
        set_message(msg, "attention head dim D = %lld: this backend takes D <= %d", (long long)p->D, (int)kAttnMaxD);
        return WKV_ERROR_UNSUPPORTED;
    }
    const CudaAttnConfig* cfg = nullptr;
    for (const CudaAttnConfig& c : kAttnConfigs)
        if (p->config ? std::strcmp(c.name, p->config) == 0 : attn_config_takes(c, p)) {
            cfg = &c;
            break;
        }
    if (!cfg || !attn_config_takes(*cfg, p)) { /* the core checked a pinned name is listed */
        set_message(msg, "attention configuration %s is built for %s at D = %d, not this call's %s at D = %lld",
                    cfg ? cfg->name : "(none)", cfg && cfg->elem == WKV_ELEM_BF16 ? "bf16" : "f16", cfg ? cfg->D : 0,
                    p->q.elem == WKV_ELEM_F32 ? "f32" : p->q.elem == WKV_ELEM_F16 ? "f16" : "bf16", (long long)p->D);
        return WKV_ERROR_UNSUPPORTED;
    }
    if (cfg->kernel == kAttnSimt && !st->attn_ready) {
        set_message(msg, "attention: this device cannot give the kernel %zu bytes of shared memory",
                    attn_smem_bytes(kAttnMaxD));
        return WKV_ERROR_UNSUPPORTED;
    }
    const int64_t rows = attn_rows_per_tile(cfg->kernel);
    const int64_t max_tiles = attn_max_tiles(p, rows, false);
    if (max_tiles == 0 || p->Hq == 0) return WKV_OK; /* no query rows */
    if (max_tiles * p->Hq > 0x7fffffff) {
        set_message(msg, "attention: %lld query tiles x %lld heads of one sequence exceed one launch's grid",
                    (long long)max_tiles, (long long)p->Hq);
        return WKV_ERROR_UNSUPPORTED;
    }
    DeviceGuard guard(st->device);
    if (guard.error != cudaSuccess) return cuda_fail(st, guard.error, msg, "cudaSetDevice");
    const int64_t nq = p->B * p->Tq * p->Hq * p->D, nk = p->B * p->Tk * p->Hkv * p->D;
    const ViewSpec spec[5] = {{&p->q, &p->mem[0], false, nq}, {&p->k, &p->mem[1], false, nk},
                              {&p->v, &p->mem[2], false, nk}, {&p->o, &p->mem[3], true, nq},
                              {&p->lse, &p->mem[4], true, p->B * p->Tq * p->Hq}};
    Placement pl;
    wkv_status s = place_views(spec, 5, false, 0, &pl, msg);
    if (s != WKV_OK) return s;
    StreamDrain drain(st->stream);
    s = stage_in(st, &pl, &drain, msg);
    if (s != WKV_OK) return s;
    if (fault_hit(st, WKV_FAULT_DEVICE_LOST, "submit"))
        return cuda_fail(st, cudaErrorLaunchFailure, msg, "attention launch (injected fault: WKV_FAULT=device_lost)");
    AttnFwdParams prm;
    std::memset(&prm, 0, sizeof prm);
    prm.q = pl.v[0], prm.k = pl.v[1], prm.v = pl.v[2], prm.o = pl.v[3], prm.lse = pl.v[4];
    prm.sh = attn_shape(p);
    prm.sh.kv_vec16 = attn_rows_vec16(p, prm.k, prm.v);
    const int e = attn_plan_launches(p, rows, false, p->Hq, max_tiles, [&](const AttnSeqs& seq, int64_t blocks) {
        prm.seq = seq;
        return attn_launch_forward(cfg->kernel, prm, blocks, st->stream);
    });
    if (e != 0) return cuda_fail(st, (cudaError_t)e, msg, "attention launch");
    return stage_out(st, &pl, &drain, msg);
}

wkv_status cuda_attention_backward(void* state, const wkv_attention_backward_problem* bp, wkv_message* msg) {
    CudaState* st = static_cast<CudaState*>(state);
    if (st->lost) return context_lost(msg);
    const wkv_attention_problem* p = &bp->fwd;
    if (!st->attn_enabled) {
        set_message(msg, "softmax attention backward: the CUDA kernels have not yet been validated on a GPU; "
                         "set WKV_CUDA_ATTENTION=1 before creating the context to run them anyway, or use "
                         "the CPU or Vulkan backend");
        return WKV_ERROR_UNSUPPORTED;
    }
    if (p->D > st->attn_bwd_max_d) {
        set_message(msg, "attention backward head dim D = %lld: this device takes D <= %d", (long long)p->D,
                    st->attn_bwd_max_d);
        return WKV_ERROR_UNSUPPORTED;
    }
    /* the tensor-core kernels where they apply (f16/bf16 at D = 64, 128), else the SIMT ones */
    const int kernel = p->q.elem != WKV_ELEM_F32 && (p->D == 64 || p->D == 128) ? kAttnMma : kAttnSimt;
    const int64_t keys = attn_bwd_keys_per_tile(kernel), rows = attn_bwd_rows_per_tile(kernel);
    const int64_t kv_tiles = attn_max_tiles(p, keys, true), q_tiles = attn_max_tiles(p, rows, false);
    if (kv_tiles * p->Hkv > 0x7fffffff || q_tiles * p->Hq > 0x7fffffff) {
        set_message(msg, "attention backward: the tiles x heads of one sequence exceed one launch's grid");
        return WKV_ERROR_UNSUPPORTED;
    }
    if ((kv_tiles == 0 || p->Hkv == 0) && (q_tiles == 0 || p->Hq == 0)) return WKV_OK; /* nothing to write */
    DeviceGuard guard(st->device);
    if (guard.error != cudaSuccess) return cuda_fail(st, guard.error, msg, "cudaSetDevice");
    const int64_t nq = p->B * p->Tq * p->Hq * p->D, nk = p->B * p->Tk * p->Hkv * p->D, nl = p->B * p->Tq * p->Hq;
    const ViewSpec spec[10] = {{&p->q, &p->mem[0], false, nq},      {&p->k, &p->mem[1], false, nk},
                               {&p->v, &p->mem[2], false, nk},      {&p->o, &p->mem[3], false, nq},
                               {&p->lse, &p->mem[4], false, nl},    {&bp->dout, &bp->mem[0], false, nq},
                               {&bp->dlse, &bp->mem[4], false, nl}, {&bp->dq, &bp->mem[1], true, nq},
                               {&bp->dk, &bp->mem[2], true, nk},    {&bp->dv, &bp->mem[3], true, nk}};
    Placement pl;
    wkv_status s = place_views(spec, 10, false, 0, &pl, msg);
    if (s != WKV_OK) return s;
    StreamDrain drain(st->stream);
    s = stage_in(st, &pl, &drain, msg);
    if (s != WKV_OK) return s;
    if (fault_hit(st, WKV_FAULT_DEVICE_LOST, "submit"))
        return cuda_fail(st, cudaErrorLaunchFailure, msg,
                         "attention backward launch (injected fault: WKV_FAULT=device_lost)");
    AttnBwdParams prm;
    std::memset(&prm, 0, sizeof prm);
    prm.q = pl.v[0], prm.k = pl.v[1], prm.v = pl.v[2], prm.o = pl.v[3], prm.lse = pl.v[4];
    prm.dout = pl.v[5], prm.dlse = pl.v[6], prm.dq = pl.v[7], prm.dk = pl.v[8], prm.dv = pl.v[9];
    prm.sh = attn_shape(p);
    prm.sh.kv_vec16 = attn_rows_vec16(p, prm.k, prm.v);
    prm.qd_vec16 = attn_rows_vec16(p, prm.q, prm.dout);
    int e = attn_plan_launches(p, keys, true, p->Hkv, kv_tiles, [&](const AttnSeqs& seq, int64_t blocks) {
        prm.seq = seq;
        return attn_launch_backward_kv(kernel, prm, blocks, st->stream);
    });
    if (e == 0)
        e = attn_plan_launches(p, rows, false, p->Hq, q_tiles, [&](const AttnSeqs& seq, int64_t blocks) {
            prm.seq = seq;
            return attn_launch_backward_q(kernel, prm, blocks, st->stream);
        });
    if (e != 0) return cuda_fail(st, (cudaError_t)e, msg, "attention backward launch");
    return stage_out(st, &pl, &drain, msg);
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
    f.buffer_create = cuda_buffer_create;
    f.buffer_destroy = cuda_buffer_destroy;
    f.buffer_write = cuda_buffer_write;
    f.buffer_read = cuda_buffer_read;
    f.synchronize = cuda_synchronize;
    f.saves_checkpoints = cuda_saves_checkpoints;
    f.forward_scratch_size = cuda_forward_scratch_size;
    f.attention = cuda_attention;
    f.attention_configs = cuda_attention_configs;
    f.attention_backward = cuda_attention_backward;
    return f;
}

const wkv_backend_iface kCudaIface = make_iface();

} // namespace

extern "C" __attribute__((visibility("default"))) const wkv_backend_iface* wkv_plugin_entry(
    uint32_t core_abi_version) {
    /* a core older than this plugin would hand it shorter wkv_problems than it reads */
    if (core_abi_version < WKV_BACKEND_ABI_VERSION) return nullptr;
    return &kCudaIface;
}
