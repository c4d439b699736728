/* Softmax attention forward on CUDA: the launchers of the SIMT kernel (attention_kernel.cuh)
 * and the tensor-core one (attention_mma_kernel.cuh; how each works is described there), their
 * shared memory and its limit. */
#include <cuda_runtime.h>

#include "attention_kernel.cuh"
#include "attention_mma_kernel.cuh"

namespace wkv_cuda {
using attn::kAttnRows;
using attn::kAttnWarps;
using attn::attn_fwd_simt;

int attn_rows_per_tile(int kernel) { return kernel == kAttnMma ? attn::kMmaRows : kAttnRows; }

size_t attn_mma_smem_bytes(int D) { return attn::mma_fwd_smem_bytes(D); }

size_t attn_smem_bytes(int D) { return attn::attn_simt_smem_bytes(D); }

int attn_prepare(size_t max_smem) {
    const int need = (int)attn_smem_bytes(kAttnMaxD);
    if ((size_t)need > max_smem) return (int)cudaErrorInvalidValue;
    /* the D <= 64 and <= 128 kernels stay under the default 48 KB */
    return (int)cudaFuncSetAttribute(attn_fwd_simt<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, need);
}

int attn_launch_forward(int kernel, const AttnFwdParams& p, int64_t blocks, void* stream) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const unsigned grid = (unsigned)blocks;
    if (kernel == kAttnMma) {
        const size_t smem = attn_mma_smem_bytes(p.sh.D);
        const bool bf16 = p.q.elem == 2;
        constexpr int threads = attn::kMmaWarps * 32;
        if (p.sh.D == 64 && bf16) attn::attn_fwd_mma<64, true><<<grid, threads, smem, s>>>(p);
        else if (p.sh.D == 64) attn::attn_fwd_mma<64, false><<<grid, threads, smem, s>>>(p);
        else if (bf16) attn::attn_fwd_mma<128, true><<<grid, threads, smem, s>>>(p);
        else attn::attn_fwd_mma<128, false><<<grid, threads, smem, s>>>(p);
        return (int)cudaGetLastError();
    }
    const size_t smem = attn_smem_bytes(p.sh.D);
    switch (attn::attn_dpl(p.sh.D)) {
    case 2: attn_fwd_simt<2><<<grid, kAttnWarps * 32, smem, s>>>(p); break;
    case 4: attn_fwd_simt<4><<<grid, kAttnWarps * 32, smem, s>>>(p); break;
    default: attn_fwd_simt<8><<<grid, kAttnWarps * 32, smem, s>>>(p); break;
    }
    return (int)cudaGetLastError();
}

} // namespace wkv_cuda
