/* Device helpers shared by every kernel file: element loads/stores of any dtype, the decay
 * forms, sequence bounds of a block (RWKV-7's sequential kernels keep their own row-wise stores
 * in rwkv7_step.cuh); asynchronous copies (rwkv7_bwd.cu, rwkv7_chunk*.cu, rwkv6.cu). */
#ifndef WKV_BACKENDS_CUDA_ELEM_CUH
#define WKV_BACKENDS_CUDA_ELEM_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda_internal.h"

namespace wkv_cuda {
namespace elem {

/* Element load of any dtype, branch-free: two 16-bit loads (the same one twice for 16-bit
 * types) and selects. A switch around each load makes the compiler retire every load before the
 * next one (the scoreboard state must agree where the branches join), which serialises the
 * prefetches. */
__device__ __forceinline__ float load(const DevView& v, int64_t off) {
    const int es = v.elem == 0 ? 4 : 2;
    const unsigned short* ptr = reinterpret_cast<const unsigned short*>(v.data + off * es);
    const unsigned lo = ptr[0];
    const unsigned hi = ptr[es >> 2];
    const float f32 = __uint_as_float(lo | (hi << 16));
    const float bf16 = __uint_as_float(lo << 16);
    const float f16 = __half2float(__ushort_as_half((unsigned short)lo));
    return v.elem == 0 ? f32 : (v.elem == 2 ? bf16 : f16);
}

/* Store of any dtype, and only when `en`: both conversions computed, one of two predicated
 * stores issued, no branch (a branch per store would cut unrolled token loops into basic blocks
 * the scheduler cannot overlap; nvcc turns an if/else of two stores into one). Outputs are
 * never read back by the kernel that writes them, so no memory clobber is needed. */
__device__ __forceinline__ void store_if(const DevView& v, int64_t off, float x, bool en) {
    const unsigned short h = v.elem == 1 ? __half_as_ushort(__float2half_rn(x))
                                          : __bfloat16_as_ushort(__float2bfloat16_rn(x));
    float* pf = reinterpret_cast<float*>(v.data) + off;
    unsigned short* ph = reinterpret_cast<unsigned short*>(v.data) + off;
    const int f32 = en && v.elem == 0, f16 = en && v.elem != 0;
    asm volatile("{\n\t.reg .pred p, q;\n\t"
                 "setp.ne.s32 p, %4, 0;\n\tsetp.ne.s32 q, %5, 0;\n\t"
                 "@p st.global.f32 [%0], %2;\n\t@q st.global.u16 [%1], %3;\n\t}"
                 :
                 : "l"(pf), "l"(ph), "f"(x), "h"(h), "r"(f32), "r"(f16));
}

__device__ __forceinline__ void store(const DevView& v, int64_t off, float x) { store_if(v, off, x, true); }

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* 1 / x for x in [1, 2] (or NaN), correctly rounded: the same bits as 1.0f / x. ptxas compiles
 * the IEEE division into exactly this (MUFU.RCP, one FMA Newton step) behind a test of x's
 * exponent and a branch to a slow-path subroutine for denormal, huge and special x, which x in
 * [1, 2] never takes. Checked on an H100 for every float in [1, 2] and, through decay_of, every
 * clampw w (NOTES v33). */
__device__ __forceinline__ float recip_1_2(float x) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return fmaf(r, fmaf(-x, r, 1.0f), r);
}

/* decay and d decay / d w from w: the CPU backend's decay_row. FastRcp: clampw's 1 / (1 + z)
 * (1 + z in [1, 2]) by recip_1_2, the same bits without the division's branch (the decode
 * kernel: its two columns' transforms then interleave, NOTES v33); the other kernels keep the
 * division, so the decode test's comparison with the sequential kernel checks those bits. */
template <bool FastRcp = false>
__device__ __forceinline__ float decay_of(int form, float w, float* ddw) {
    switch (form) {
    case 1: /* DIRECT */
        *ddw = 1.0f;
        return w;
    case 2: { /* LOG */
        const float d = expf(w);
        *ddw = d;
        return d;
    }
    case 3: { /* EXP_NEG_EXP */
        const float e = expf(w);
        const float d = expf(-e);
        *ddw = isinf(e) ? -0.0f : -e * d;
        return d;
    }
    default: { /* CLAMPW */
        const float kScale = 0.60653065971263342f; /* exp(-0.5) */
        const float z = expf(-fabsf(w));
        const float inv = FastRcp ? recip_1_2(1.0f + z) : 1.0f / (1.0f + z);
        const float sig = w >= 0.0f ? inv : z * inv;
        const float d = expf(-kScale * sig);
        *ddw = -kScale * (z * inv * inv) * d;
        return d;
    }
    }
}

/* Sequence of local index `local` of a launch: global index, batch, token range. */
struct Seq {
    int64_t s, batch, t0, t1;
};

__device__ __forceinline__ Seq seq_of(const SeqInfo& q, int64_t local, int64_t T) {
    Seq p;
    p.s = q.first + local;
    if (q.packed) {
        p.batch = 0;
        p.t0 = q.off[local];
        p.t1 = q.off[local + 1];
    } else {
        p.batch = p.s;
        p.t0 = 0;
        p.t1 = T;
    }
    return p;
}

/* 16-byte asynchronous global -> shared copy (sm_80+; both addresses 16-byte aligned), the
 * group commit, and the waits: for all of a thread's committed groups, or for all but the
 * newest `pending` (groups complete in order). Each is a compiler memory barrier, so a thread
 * may read back its own copies after a wait with no __syncthreads (rwkv6.cu's column scan);
 * copies read by other threads still need one. */
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { cp_async_wait<0>(); }

/* sm_90 bulk copies (the TMA unit, no tensor map): `bytes` (a multiple of 16) from shared to
 * global memory, both 16-byte aligned, issued by one thread and tracked in its bulk groups. The
 * writers of the shared source make their stores visible to the copy's (async) proxy first
 * (fence_proxy_async), then meet the issuing thread at a barrier. Compiled for sm_90 only
 * (elsewhere empty): a caller keeps them behind kBulkCopies. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr bool kBulkCopies = true;
#else
constexpr bool kBulkCopies = false;
#endif
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void bulk_store(void* gdst, const void* ssrc, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned s = (unsigned)__cvta_generic_to_shared(ssrc);
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
                 "cp.async.bulk.commit_group;\n" ::"l"(gdst), "r"(s), "r"(bytes) : "memory");
#endif
}
/* the thread's bulk copies have read their sources (which may then be written again) */
__device__ __forceinline__ void bulk_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}
/* the thread's bulk copies are complete (their writes performed) */
__device__ __forceinline__ void bulk_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}

/* The contiguous fast path (VT != 0, chosen per launch by vec_type below): every tensor a
 * kernel stages has the dtype VT (1 f32, 2 f16, 3 bf16; VT = wkv_elem + 1) and the vector ones
 * also a unit stride along N, strides that are multiples of 4 and 4-element-aligned data, so 4
 * consecutive elements are one 16-byte (f32) or 8-byte load or store. VT = 0: the generic
 * element path (any dtype per tensor, any strides). Staging by elements cost ~30-40% of the
 * scans' issue slots (ncu, NOTES v9): ~20 integer instructions of 64-bit index arithmetic and
 * dtype selects per element. */
template <int VT> struct Vec4; /* raw storage of 4 elements */
template <> struct Vec4<1> { using raw = float4; };
template <> struct Vec4<2> { using raw = uint2; };
template <> struct Vec4<3> { using raw = uint2; };
template <int VT> __host__ __device__ constexpr int elem_bytes() { return VT == 1 ? 4 : 2; }

template <int VT>
__device__ __forceinline__ typename Vec4<VT>::raw load4(const DevView& v, int64_t off) {
    return *reinterpret_cast<const typename Vec4<VT>::raw*>(v.data + off * elem_bytes<VT>());
}
__device__ __forceinline__ float lo_half(unsigned x, bool bf) {
    return bf ? __uint_as_float(x << 16) : __half2float(__ushort_as_half((unsigned short)(x & 0xffffu)));
}
__device__ __forceinline__ float hi_half(unsigned x, bool bf) {
    return bf ? __uint_as_float(x & 0xffff0000u) : __half2float(__ushort_as_half((unsigned short)(x >> 16)));
}
template <int VT>
__device__ __forceinline__ float4 to_float4(const typename Vec4<VT>::raw& r) {
    if constexpr (VT == 1) {
        return r;
    } else {
        constexpr bool bf = VT == 3;
        return make_float4(lo_half(r.x, bf), hi_half(r.x, bf), lo_half(r.y, bf), hi_half(r.y, bf));
    }
}
/* rounds like elem::store (round to nearest even per element) */
template <int VT>
__device__ __forceinline__ void store4(const DevView& v, int64_t off, float4 x) {
    if constexpr (VT == 1) {
        *reinterpret_cast<float4*>(v.data + off * 4) = x;
    } else {
        auto h = [](float f) -> unsigned {
            return VT == 3 ? __bfloat16_as_ushort(__float2bfloat16_rn(f)) : __half_as_ushort(__float2half_rn(f));
        };
        *reinterpret_cast<uint2*>(v.data + off * 2) = make_uint2(h(x.x) | (h(x.y) << 16), h(x.z) | (h(x.w) << 16));
    }
}
/* one element of the dtype VT (the generic elem::load / store when VT = 0) */
template <int VT>
__device__ __forceinline__ float load1(const DevView& v, int64_t off) {
    if constexpr (VT == 0) {
        return elem::load(v, off);
    } else if constexpr (VT == 1) {
        return reinterpret_cast<const float*>(v.data)[off];
    } else {
        const unsigned x = reinterpret_cast<const unsigned short*>(v.data)[off];
        return lo_half(x, VT == 3);
    }
}
template <int VT>
__device__ __forceinline__ void store1(const DevView& v, int64_t off, float x) {
    if constexpr (VT == 0) {
        elem::store(v, off, x);
    } else if constexpr (VT == 1) {
        reinterpret_cast<float*>(v.data)[off] = x;
    } else {
        reinterpret_cast<unsigned short*>(v.data)[off] =
            VT == 3 ? __bfloat16_as_ushort(__float2bfloat16_rn(x)) : __half_as_ushort(__float2half_rn(x));
    }
}

} // namespace elem
} // namespace wkv_cuda

#endif
