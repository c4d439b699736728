/* Softmax attention forward on CUDA: the launchers of the SIMT kernel (attention_kernel.cuh)
 * and the tensor-core one (attention_mma_kernel.cuh; how each works is described there), their
 * shared memory and its limit. */
#include <cuda_runtime.h>

#include "attention_kernel.cuh"
#include "attention_mma_kernel.cuh"

namespace wkv_cuda {
using attn::kAttnKeys;
using attn::kAttnRows;
using attn::kAttnWarps;
using attn::attn_fwd_simt;
namespace {

template <int DPL>
size_t smem_of(int D) {
    return sizeof(float) * ((size_t)kAttnRows * D + (size_t)kAttnKeys * (D + 1) + (size_t)kAttnKeys * 32 * DPL);
}

int dpl_of(int D) { return D <= 64 ? 2 : D <= 128 ? 4 : 8; }

} // namespace

int attn_rows_per_tile(int kernel) { return kernel == kAttnMma ? attn::kMmaRows : kAttnRows; }

size_t attn_mma_smem_bytes(int D) { return 2 * sizeof(uint16_t) * attn::kMmaKeys * (size_t)(D + attn::kMmaPad); }

size_t attn_smem_bytes(int D) {
    switch (dpl_of(D)) {
    case 2: return smem_of<2>(D);
    case 4: return smem_of<4>(D);
    default: return smem_of<8>(D);
    }
}

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
    switch (dpl_of(p.sh.D)) {
    case 2: attn_fwd_simt<2><<<grid, kAttnWarps * 32, smem, s>>>(p); break;
    case 4: attn_fwd_simt<4><<<grid, kAttnWarps * 32, smem, s>>>(p); break;
    default: attn_fwd_simt<8><<<grid, kAttnWarps * 32, smem, s>>>(p); break;
    }
    return (int)cudaGetLastError();
}

} // namespace wkv_cuda
