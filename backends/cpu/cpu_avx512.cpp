/* The AVX-512 path (F, BW, DQ, VL; isa.h): the vector kernels of *_simd.inl compiled for it.
 * Only the code after the target pragma uses AVX-512; everything included before it (the standard
 * library, the shared headers' inline functions) keeps the build's baseline ISA, so no inline
 * function compiled here for AVX-512 can be picked by the linker for another path. */
#include "simd_ops.h"

#if WKV_CPU_X86_SIMD
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cpu_internal.h"
#include "half.h"
#include "op_common.h"
#include "rwkv4.h"
#include "rwkv6.h"
#include "rwkv7.h"
#include "tensor_access.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl"))), apply_to = function)
#else
#pragma GCC push_options
/* GCC 12's avx512fintrin.h trips -W(maybe-)uninitialized on its own _mm512_undefined_*()
 * (GCC bug 105593) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl")
#endif

namespace wkv_cpu {
namespace isa_avx512 {
namespace {
#include "simd_avx512.inl"
#include "simd_common.inl"
#include "rwkv7_simd.inl"
#include "rwkv6_simd.inl"
#include "rwkv4_simd.inl"
#define WKV_ATTN_BF16_DOT 1 /* attention_simd.inl's attn_block_bf16 (its own target: + avx512bf16) */
#include "attention_simd.inl"
} // namespace
} // namespace isa_avx512

void install_avx512(OpSet* ops) noexcept {
    ops->attention_block = isa_avx512::attn_block;
    ops->attention_rows = isa_avx512::attn_rows;
    if (__builtin_cpu_supports("avx512bf16")) ops->attention_block_bf16 = isa_avx512::attn_block_bf16;
    ops->attention_backward.probs = isa_avx512::attn_bwd_probs;
    ops->attention_backward.kv = isa_avx512::attn_bwd_kv;
    ops->attention_backward.q = isa_avx512::attn_bwd_q;
    isa_avx512::install_rwkv7(&ops->rwkv7);
    isa_avx512::install_rwkv6(&ops->rwkv6);
    isa_avx512::install_rwkv4(&ops->rwkv4);
}

} // namespace wkv_cpu

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

#endif
