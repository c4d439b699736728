/* Softmax attention forward on CUDA: the launchers of attention_kernel.cuh's kernel (how it
 * works is described there), its shared memory and its limit. */
#include <cuda_runtime.h>

#include "attention_kernel.cuh"

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

int attn_rows_per_tile() { return kAttnRows; }

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

int attn_launch_forward(const AttnFwdParams& p, int64_t blocks, void* stream) {
    const size_t smem = attn_smem_bytes(p.sh.D);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const unsigned grid = (unsigned)blocks;
    switch (dpl_of(p.sh.D)) {
    case 2: attn_fwd_simt<2><<<grid, kAttnWarps * 32, smem, s>>>(p); break;
    case 4: attn_fwd_simt<4><<<grid, kAttnWarps * 32, smem, s>>>(p); break;
    default: attn_fwd_simt<8><<<grid, kAttnWarps * 32, smem, s>>>(p); break;
    }
    return (int)cudaGetLastError();
}

} // namespace wkv_cuda
