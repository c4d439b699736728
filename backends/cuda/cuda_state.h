/* The CUDA plugin's host side, shared by its files (cuda_backend.cpp: the function table and the
 * calls; cuda_memory.cpp: where a call's tensors live): a context's state, messages, CUDA errors
 * as statuses, the device guard. */
#ifndef WKV_CUDA_STATE_H
#define WKV_CUDA_STATE_H

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend.h"

namespace wkv_cuda {

constexpr int kHeadSizes[] = {32, 64, 128};
constexpr int kNumHeadSizes = 3;

/* N's index in kHeadSizes, or -1. */
inline int head_index(int64_t N) {
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
    /* RWKV-7's saving forward (rwkv7_prepare_saving_forward): ready (its shared-memory limit
     * raised; if not, the forward does not save and the backward recomputes), and the dynamic
     * shared memory its N = 64 launches take. */
    bool fwd_saves = false;
    int fwd_ck_smem = 0;
    bool lost = false;
    char* scratch = nullptr; /* device scratch for staged host memory (cuda_memory.cpp) */
    size_t scratch_bytes = 0;
    /* The chunked RWKV-7 forward (rwkv7_chunk.cu, chosen by rwkv7_use_chunked): its kernels
     * are ready (shared-memory limits raised); without them, the sequential forward everywhere. */
    bool chunk_ready = false;
    /* Its workspace when the caller gives no scratch: this stream-ordered pool
     * (cudaMallocFromPoolAsync / cudaFreeAsync on the call's stream: no synchronisation,
     * capturable); nullptr: none could be made (such calls run the sequential forward). */
    cudaMemPool_t chunk_pool = nullptr;
    uint64_t chunk_keep = 0; /* the pool's release threshold: twice the last pool call's bytes */
    int chunk_mode = -1; /* WKV_CUDA_RWKV7_CHUNKED at context creation: -1 unset, 0 never, 1 always */
    /* The chunked RWKV-7 backward (rwkv7_chunk_bwd.cu, chosen by rwkv7_use_chunked_bwd): ready,
     * and WKV_CUDA_RWKV7_CHUNKED_BWD at context creation (-1 unset, 0 never, 1 always). */
    bool chunk_bwd_ready = false;
    int chunk_bwd_mode = -1;
    /* Softmax attention (attention.cu): its kernel's shared-memory limit raised (attn_prepare),
     * and WKV_CUDA_ATTENTION=1 at context creation: the kernel has not yet run on a GPU, so it
     * is opt-in until the device suite has passed (cuda_attention). */
    bool attn_ready = false;
    bool attn_enabled = false;
    int attn_bwd_max_d = 0; /* the backward's largest head dim on this device (attn_bwd_prepare) */
    wkv_fault_hook fault{nullptr, nullptr}; /* WKV_FAULT (src/fault.h): test builds only */
};


/* WKV_FAULT's points (src/fault.h): a hit stands for the CUDA error the real failure gives. */
bool fault_hit(const CudaState* st, int32_t kind, const char* site);

/* "cuda backend: " + the formatted text into msg (if any). */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
void set_message(wkv_message* msg, const char* fmt, ...);

const char* op_name(wkv_op op);

/* A CUDA error as a wkv_status; errors that leave the context unusable mark it lost. */
wkv_status cuda_fail(CudaState* st, cudaError_t e, wkv_message* msg, const char* what);

/* What every call of a lost context returns (an earlier call failed on the device). */
wkv_status context_lost(wkv_message* msg);

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

} // namespace wkv_cuda

#endif
