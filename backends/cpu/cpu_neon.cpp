/* The AArch64 NEON path (isa.h): the vector kernels of *_simd.inl compiled for it. NEON is part
 * of the AArch64 baseline, so unlike cpu_avx2.cpp this needs no target pragma, and the build
 * compiles the file only for AArch64 (CMakeLists.txt). */
#include "simd_ops.h"

#if WKV_CPU_NEON_SIMD
#include <arm_neon.h>

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

namespace wkv_cpu {
namespace isa_neon {
namespace {
#include "simd_neon.inl"
#include "simd_common.inl"
#include "rwkv7_simd.inl"
#include "rwkv6_simd.inl"
#include "rwkv4_simd.inl"
#include "attention_simd.inl"
} // namespace
} // namespace isa_neon

void install_neon(OpSet* ops) noexcept {
    ops->attention_block = isa_neon::attn_block;
    ops->attention_rows = isa_neon::attn_rows;
    ops->attention_backward.probs = isa_neon::attn_bwd_probs;
    ops->attention_backward.kv = isa_neon::attn_bwd_kv;
    ops->attention_backward.q = isa_neon::attn_bwd_q;
    isa_neon::install_rwkv7(&ops->rwkv7);
    isa_neon::install_rwkv6(&ops->rwkv6);
    isa_neon::install_rwkv4(&ops->rwkv4);
}

} // namespace wkv_cpu

#endif
