/* Softmax attention backward on CUDA: the launchers of attention_bwd_kernel.cuh's two kernels
 * (how they work is described there), their shared memory and its limits. */
#include <cuda_runtime.h>

#include "attention_bwd_kernel.cuh"

namespace wkv_cuda {
using attn::kAttnKeys;
using attn::kBwdKeys;
using attn::kBwdRows;
using attn::kBwdWarps;
namespace {

int dpl_of(int D) { return D <= 64 ? 2 : D <= 128 ? 4 : 8; }

size_t kv_smem(int D) { return sizeof(float) * (4 * (size_t)kBwdKeys * (D + 1) + 2 * (size_t)D); }
size_t q_smem(int D) { return sizeof(float) * (2 * (size_t)kBwdRows * D + 2 * (size_t)kAttnKeys * (D + 1)); }

template <int DPL>
int set_q_limit(size_t bytes) {
    return (int)cudaFuncSetAttribute(attn::attn_bwd_q_simt<DPL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)bytes);
}

} // namespace

int attn_bwd_keys_per_tile() { return kBwdKeys; }
int attn_bwd_rows_per_tile() { return kBwdRows; }

int attn_bwd_prepare(size_t max_smem) {
    /* the largest D of each dq kernel (DPL) whose two kernels fit, limits raised to it */
    int max_d = 0;
    for (const int D : {64, 128, 256}) {
        const size_t kv = kv_smem(D), q = q_smem(D);
        if (kv > max_smem || q > max_smem) break;
        int e = (int)cudaFuncSetAttribute(attn::attn_bwd_kv_simt, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kv);
        if (e == 0) e = D == 64 ? set_q_limit<2>(q) : D == 128 ? set_q_limit<4>(q) : set_q_limit<8>(q);
        if (e != 0) break;
        max_d = D;
    }
    return max_d;
}

int attn_launch_backward_kv(const AttnBwdParams& p, int64_t blocks, void* stream) {
    attn::attn_bwd_kv_simt<<<(unsigned)blocks, 32, kv_smem(p.sh.D), static_cast<cudaStream_t>(stream)>>>(p);
    return (int)cudaGetLastError();
}

int attn_launch_backward_q(const AttnBwdParams& p, int64_t blocks, void* stream) {
    const size_t smem = q_smem(p.sh.D);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const unsigned grid = (unsigned)blocks;
    switch (dpl_of(p.sh.D)) {
    case 2: attn::attn_bwd_q_simt<2><<<grid, kBwdWarps * 32, smem, s>>>(p); break;
    case 4: attn::attn_bwd_q_simt<4><<<grid, kBwdWarps * 32, smem, s>>>(p); break;
    default: attn::attn_bwd_q_simt<8><<<grid, kBwdWarps * 32, smem, s>>>(p); break;
    }
    return (int)cudaGetLastError();
}

} // namespace wkv_cuda
