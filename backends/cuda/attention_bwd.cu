/* Softmax attention backward on CUDA: the launchers of the SIMT kernels (attention_bwd_kernel.cuh)
 * and the tensor-core ones (attention_mma_bwd_kernel.cuh; how each works is described there),
 * their shared memory and its limits. */
#include <cuda_runtime.h>

#include <type_traits>

#include "attention_bwd_kernel.cuh"
#include "attention_mma_bwd_kernel.cuh"

namespace wkv_cuda {
using attn::kBwdKeys;
using attn::kBwdRows;
using attn::kBwdWarps;
namespace {

template <int DPL>
int set_q_limit(size_t bytes) {
    return (int)cudaFuncSetAttribute(attn::attn_bwd_q_simt<DPL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)bytes);
}

} // namespace

int attn_bwd_keys_per_tile(int kernel) { return kernel == kAttnMma ? 64 : kBwdKeys; }
int attn_bwd_rows_per_tile(int kernel) { return kernel == kAttnMma ? 64 : kBwdRows; }

int attn_bwd_prepare(size_t max_smem) {
    /* the tensor-core kernels at D = 128 need more than the default 48 KB */
    const size_t mma = attn::mma_bwd_smem_bytes(128);
    if (mma > max_smem) return 0;
    const void* mma_128[] = {(const void*)attn::attn_bwd_kv_mma<128, true>, (const void*)attn::attn_bwd_kv_mma<128, false>,
                             (const void*)attn::attn_bwd_q_mma<128, true>, (const void*)attn::attn_bwd_q_mma<128, false>};
    for (const void* f : mma_128)
        if (cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)mma) != cudaSuccess) return 0;
    /* the largest D of each SIMT dq kernel (DPL) whose two kernels fit, limits raised to it */
    int max_d = 0;
    for (const int D : {64, 128, 256}) {
        const size_t kv = attn::bwd_kv_simt_smem_bytes(D), q = attn::bwd_q_simt_smem_bytes(D);
        if (kv > max_smem || q > max_smem) break;
        int e = (int)cudaFuncSetAttribute(attn::attn_bwd_kv_simt, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kv);
        if (e == 0) e = D == 64 ? set_q_limit<2>(q) : D == 128 ? set_q_limit<4>(q) : set_q_limit<8>(q);
        if (e != 0) break;
        max_d = D;
    }
    return max_d;
}

namespace {

/* f(std::integral_constant<int, D>, std::bool_constant<BF16>) for the mma kernels' D and dtype */
template <class F>
void with_mma(const AttnBwdParams& p, F&& f) {
    const bool bf16 = p.q.elem == 2;
    if (p.sh.D == 64 && bf16) f(std::integral_constant<int, 64>(), std::true_type());
    else if (p.sh.D == 64) f(std::integral_constant<int, 64>(), std::false_type());
    else if (bf16) f(std::integral_constant<int, 128>(), std::true_type());
    else f(std::integral_constant<int, 128>(), std::false_type());
}

} // namespace

int attn_launch_backward_kv(int kernel, const AttnBwdParams& p, int64_t blocks, void* stream) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (kernel == kAttnMma) {
        with_mma(p, [&](auto d, auto bf) {
            attn::attn_bwd_kv_mma<decltype(d)::value, decltype(bf)::value>
                <<<(unsigned)blocks, attn::kMmaWarps * 32, attn::mma_bwd_smem_bytes(decltype(d)::value), s>>>(p);
        });
        return (int)cudaGetLastError();
    }
    attn::attn_bwd_kv_simt<<<(unsigned)blocks, 32, attn::bwd_kv_simt_smem_bytes(p.sh.D), s>>>(p);
    return (int)cudaGetLastError();
}

int attn_launch_backward_q(int kernel, const AttnBwdParams& p, int64_t blocks, void* stream) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (kernel == kAttnMma) {
        with_mma(p, [&](auto d, auto bf) {
            attn::attn_bwd_q_mma<decltype(d)::value, decltype(bf)::value>
                <<<(unsigned)blocks, attn::kMmaWarps * 32, attn::mma_bwd_smem_bytes(decltype(d)::value), s>>>(p);
        });
        return (int)cudaGetLastError();
    }
    const size_t smem = attn::bwd_q_simt_smem_bytes(p.sh.D);
    const unsigned grid = (unsigned)blocks;
    switch (attn::attn_dpl(p.sh.D)) {
    case 2: attn::attn_bwd_q_simt<2><<<grid, kBwdWarps * 32, smem, s>>>(p); break;
    case 4: attn::attn_bwd_q_simt<4><<<grid, kBwdWarps * 32, smem, s>>>(p); break;
    default: attn::attn_bwd_q_simt<8><<<grid, kBwdWarps * 32, smem, s>>>(p); break;
    }
    return (int)cudaGetLastError();
}

} // namespace wkv_cuda
