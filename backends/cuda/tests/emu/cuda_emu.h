// Runs the device code of a CUDA kernel on the CPU, so that its logic (indexing, masking, tails,
// the online softmax, shared-memory staging) is tested where no GPU is: the kernel's own source
// (a .cuh written for it, see attention_kernel.cuh) compiled as host C++ with WKV_CUDA_EMULATION.
//
// A block's threads are fibers (ucontext) on the calling thread: each runs until it reaches a
// barrier — __syncthreads (the block) or a warp shuffle (its warp: lanes write, wait for the
// warp, read; two banks of slots alternate) — and the scheduler resumes the threads whose barrier has been
// reached by all of its participants: each pass lets one warp (drawn at random) run ahead as far
// as it can, then the rest in a shuffled order (a seeded generator), so warps drift apart and a
// missing barrier between a shared-memory write and another thread's read shows as wrong data.
// A pass in which no thread can move is a deadlock (divergent barriers): launch() reports it.
// A thread only yields at barriers, so a race shows only where some schedule lets a write land
// before another thread's read of the same phase; the GPU suite's racecheck is the wider net.
// Shared memory starts as NaN bytes, so a read of an element never written shows.
//
// Not emulated: timing, memory ordering beyond barriers, atomics, cp.async, ldmatrix, the
// PTX asm of cuda_elem.cuh (elem:: below does the same conversions on the host); of tensor
// cores, the one mma shape the kernels use (mma_m16n8k16, from the PTX ISA's fragment layouts).
#ifndef WKV_CUDA_EMU_H
#define WKV_CUDA_EMU_H

#define WKV_CUDA_EMULATION 1

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

#include "cuda_internal.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

namespace wkv_emu {

struct Index3 {
    unsigned x = 0, y = 0, z = 0;
};

// The running thread's coordinates (set by the scheduler before it resumes a thread).
const Index3& thread_idx();
const Index3& block_idx();
const Index3& block_dim();
// The running block's dynamic shared memory.
void* dynamic_shared();
// Barriers: the block's, and the running thread's warp's.
void sync_block();
void sync_warp();
// A lane's slot of the running thread's warp's exchange buffer for its current shuffle, and
// the step to its next shuffle. Two banks, alternating: a lane may write the next shuffle's
// value while slower lanes still read this one's, and cannot reach the one after before every
// lane has passed the next one's barrier — so one barrier per shuffle is enough.
void* shuffle_slot(unsigned lane); // 64 bytes
void shuffle_done();

template <class T>
T shfl(T v, unsigned src_lane) {
    static_assert(sizeof(T) <= 8, "shuffles move up to 8 bytes");
    std::memcpy(shuffle_slot(thread_idx().x % 32), &v, sizeof v);
    sync_warp();
    T r;
    std::memcpy(&r, shuffle_slot(src_lane % 32), sizeof r);
    shuffle_done();
    return r;
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16} of the running thread's warp, as the PTX ISA
// lays the fragments out (attention_mma_kernel.cuh repeats the layouts): each lane's A (4
// registers of two 16-bit values), B (2) and its 4 accumulators d, which get d += A B in
// float32, the products summed in k order.
void mma_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2], bool bf16);

// Runs kernel() for every block of a 1-D grid of `threads` threads per block with `smem` bytes
// of dynamic shared memory. Returns "" or what went wrong (a deadlock).
std::string launch(unsigned grid, unsigned threads, size_t smem, const std::function<void()>& kernel,
                   uint64_t seed = 1);

}  // namespace wkv_emu

#define threadIdx (wkv_emu::thread_idx())
#define blockIdx (wkv_emu::block_idx())
#define blockDim (wkv_emu::block_dim())
#define WKV_DYNAMIC_SHARED(T, name) T* name = static_cast<T*>(wkv_emu::dynamic_shared())

inline void __syncthreads() { wkv_emu::sync_block(); }
template <class T>
T __shfl_sync(unsigned, T v, int src) {
    return wkv_emu::shfl(v, (unsigned)src);
}
template <class T>
T __shfl_xor_sync(unsigned, T v, int mask) {
    return wkv_emu::shfl(v, (wkv_emu::thread_idx().x % 32) ^ (unsigned)mask);
}

// cuda_elem.cuh's element access, on the host: f32, f16 (IEEE half) and bf16 by their bits,
// stores rounding to nearest even (NaN stays NaN).
namespace wkv_cuda {
namespace elem {

float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
uint16_t float_to_bf16(float f);

inline float load(const DevView& v, int64_t off) {
    if (v.elem == 0) {
        float f;
        std::memcpy(&f, v.data + off * 4, 4);
        return f;
    }
    uint16_t h;
    std::memcpy(&h, v.data + off * 2, 2);
    if (v.elem == 1) return half_to_float(h);
    const uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline void store(const DevView& v, int64_t off, float x) {
    if (v.elem == 0) {
        std::memcpy(v.data + off * 4, &x, 4);
        return;
    }
    const uint16_t h = v.elem == 1 ? float_to_half(x) : float_to_bf16(x);
    std::memcpy(v.data + off * 2, &h, 2);
}

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

}  // namespace elem
}  // namespace wkv_cuda

#endif  // WKV_CUDA_EMU_H
