/* The vector paths' entry points (cpu_avx2.cpp, cpu_avx512.cpp, cpu_neon.cpp; see isa.h). Each
 * fills in the functions it vectorizes into copies of the scalar op descriptions; a function it
 * leaves alone stays scalar. Internal to backends/cpu/. */
#ifndef WKV_BACKENDS_CPU_SIMD_OPS_H
#define WKV_BACKENDS_CPU_SIMD_OPS_H

#include "attention.h"
#include "isa.h"
#include "op_common.h"

namespace wkv_cpu {

/* The op descriptions a context runs: the scalar ones with the path's kernels put in. */
struct OpSet {
    OpDesc rwkv7, rwkv6, rwkv4;
    AttnBlockFn attention_block = nullptr; /* NULL: attention.cpp's scalar step */
    AttnRowsFn attention_rows = nullptr;   /* NULL: attention.cpp's scalar step */
    AttnBlockBf16Fn attention_block_bf16 = nullptr; /* NULL: bf16 inputs take attention_block */
    AttnBwdFns attention_backward;          /* NULL members: attention_backward.cpp's scalar steps */
};

/* The op set of a path (isa_compiled(isa) must hold). */
void make_op_set(Isa isa, OpSet* out) noexcept;

#if WKV_CPU_X86_SIMD
void install_avx2(OpSet* ops) noexcept;
void install_avx512(OpSet* ops) noexcept;
#endif
#if WKV_CPU_NEON_SIMD
void install_neon(OpSet* ops) noexcept;
#endif

} // namespace wkv_cpu

#endif
