/* The CUDA backend's internals shared by the host side (cuda_backend.cpp) and the kernels
 * (rwkv7.cu, rwkv7_bwd.cu, ...). Plain structs only: they travel to the GPU by value as kernel
 * parameters, so nothing here may point into host memory.
 *
 * Launch parameters stay under the classic 4 KB kernel-parameter limit: packed sequences are
 * split into launches of at most kMaxSeqsPerLaunch sequences whose offsets ride in the
 * parameters (no device copy of the host offsets is ever needed, which keeps every call
 * capturable in a CUDA graph). */
#ifndef WKV_BACKENDS_CUDA_INTERNAL_H
#define WKV_BACKENDS_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <initializer_list>
#include <type_traits>

namespace wkv_cuda {

/* One tensor: base pointer (byte offset applied), element type (wkv_elem: 0 f32, 1 f16,
 * 2 bf16) and four element strides, exactly the core's wkv_view. data == nullptr: absent. */
struct DevView {
    char* data;
    int64_t s[4];
    int32_t elem;
    int32_t pad_;
};

enum { kMaxSeqsPerLaunch = 128 };

/* Which sequences one launch covers. Block b of the launch is local sequence b / H, head
 * b % H. Unpacked: sequence s = first + local is batch s over [0, T). Packed: batch 0 over
 * [off[local], off[local + 1]), and the state index is first + local. */
struct SeqInfo {
    int64_t first;   /* global index of the launch's first sequence */
    int32_t count;   /* sequences in this launch */
    int32_t packed;  /* 1: off[] holds count + 1 absolute token offsets */
    int64_t off[kMaxSeqsPerLaunch + 1];
};

struct Rwkv7FwdParams {
    DevView r, w, k, v, a, b, y, state_in, state_out;
    int64_t T;
    int32_t H;
    int32_t form; /* wkv_decay_form */
    SeqInfo seq;
    /* Forward-saved checkpoints (wkv_problem.save_checkpoints): ckpt, K1 and seg0 exactly as
       the backward's (Rwkv7BwdParams); ckpt == nullptr: not saving. */
    float* ckpt;
    int32_t K1;
    int32_t ck_smem; /* host side: a saving N = 64 launch's dynamic shared memory (rwkv7_prepare_saving_forward) */
    int64_t seg0[kMaxSeqsPerLaunch + 1];
};

struct Rwkv7BwdParams {
    DevView r, w, k, v, a, b, state_in;
    DevView dy, dstate_out;
    DevView dr, dw, dk, dv, da, db, dstate_in;
    float* ckpt;    /* checkpoints: segment c of head h of sequence s at
                       ((seg0(s) * H + h * nseg(s) + c) * N * N) floats */
    int64_t T;
    int32_t H;
    int32_t form;
    int32_t K1;     /* tokens per checkpointed segment (a multiple of K2) */
    int32_t K2;     /* tokens replayed into shared memory at once */
    int32_t reuse;  /* 1: ckpt holds a forward's checkpoints (wkv_problem.reuse_checkpoints):
                       skip pass A */
    int32_t pad_;
    /* seg0 of the launch's sequences: packed, absolute prefix sums of the segment counts
       (count + 1 entries); unpacked, unused (seg0(s) = s * ceil(T / K1)). */
    int64_t seg0[kMaxSeqsPerLaunch + 1];
    SeqInfo seq;
};

/* Shared-memory bytes of one backward block for head size N with segment K1 and replay K2
 * (see rwkv7_bwd.cu). */
size_t rwkv7_bwd_smem_bytes(int N, int K1, int K2);
/* The largest K1 the backward kernel takes. */
int rwkv7_max_k1();

/* The contiguous fast path's choice (rwkv6.cu; used by the RWKV-6 scans, the RWKV-7 forward's
 * producers and the RWKV-7 backward's staging and write-out): wkv_elem + 1 when every present
 * view in `all` has that dtype and every view in `vec` has 4 consecutive, 4-element-aligned
 * elements along N (unit N stride, the other strides multiples of 4 where their index varies,
 * aligned data); 0 (the generic element path) otherwise. */
bool vec_view(const DevView& v, const SeqInfo& q, int64_t T, int32_t H);
int vec_type(std::initializer_list<const DevView*> all, std::initializer_list<const DevView*> vec,
             const SeqInfo& q, int64_t T, int32_t H);
/* Calls f(std::integral_constant<int, VT>()) with VT = vt (1-3; anything else the generic 0) and
 * returns its result: the one place a launch's vec_type becomes a kernel's template argument
 * (f reads it as constexpr int VT = decltype(arg)::value). */
template <class F>
int with_vec_type(int vt, F&& f) {
    switch (vt) {
    case 1: return f(std::integral_constant<int, 1>());
    case 2: return f(std::integral_constant<int, 2>());
    case 3: return f(std::integral_constant<int, 3>());
    default: return f(std::integral_constant<int, 0>());
    }
}

/* Launchers (rwkv7.cu forward, rwkv7_bwd.cu backward). They only enqueue; they return the
 * cudaError_t of the launch as int. */
/* sms: the device's SM count (the forward picks its lanes per row from it, see rwkv7.cu). */
int rwkv7_launch_forward(int N, const Rwkv7FwdParams& p, int64_t blocks, int sms, void* stream);
int rwkv7_launch_backward(int N, const Rwkv7BwdParams& p, int64_t blocks, size_t smem,
                          void* stream);
/* Raises the dynamic shared-memory limit of the backward kernel for N (once per device,
 * before the first launch). Returns the cudaError_t as int. */
int rwkv7_prepare_backward(int N, size_t smem);
/* The dynamic shared memory a forward saving checkpoints for head size N takes on the current
 * device (Rwkv7FwdParams::ck_smem; 0 where its kernel has no use for it), its limit raised to
 * that (once per device). Returns the cudaError_t as int. */
int rwkv7_prepare_saving_forward(int N, int* ck_smem);
/* Whether the forward can save the checkpoints of the backward for head size N with segment K1
 * so that the backward reusing them gives the same bits (see rwkv7_bwd.cu, pass A). */
bool rwkv7_forward_saves(int N, int K1);
/* cudaFuncGetAttributes on the forward kernel for N: fails when the fatbin holds no code for
 * the current device. Returns the cudaError_t as int. */
int rwkv7_check_kernel_image(int N);

/* The chunked forward (rwkv7_chunk.cu): unpacked sequences, N = 64, CLAMPW. ws: the workspace of
 * rwkv7_chunk_ws_bytes bytes (16-byte aligned); nc = ceil(T / rwkv7_chunk_len(N)). */
struct Rwkv7ChunkParams {
    DevView r, w, k, v, a, b, y, state_in, state_out;
    int64_t T, B;
    int32_t H;
    int32_t nc;
    float* ws;
};

/* Tokens per chunk for head size N; 0: no chunked forward for N. */
int rwkv7_chunk_len(int N);
/* Workspace bytes of the chunked forward (0 when it does not apply). */
size_t rwkv7_chunk_ws_bytes(int N, int64_t B, int64_t H, int64_t T);
/* Raises the chunked kernels' dynamic shared-memory limits (once per device). cudaError_t. */
int rwkv7_prepare_chunked(int N);
/* Enqueues the chunked forward (two kernels). cudaError_t of the launches as int. */
int rwkv7_launch_chunked(int N, const Rwkv7ChunkParams& p, void* stream);

/* The chunked backward (rwkv7_chunk_bwd.cu): the same restriction. ws: the forward's chunk
 * workspace (rwkv7_chunk_ws_bytes), ds: one N x N float matrix per chunk after it, both in the
 * backward's workspace (rwkv7_chunk_bwd_ws_bytes in all, 16-byte aligned). */
struct Rwkv7ChunkBwdParams {
    DevView r, w, k, v, a, b, dy, dstate_out;
    DevView dr, dw, dk, dv, da, db, dstate_in;
    int64_t T, B;
    int32_t H;
    int32_t nc;
    float* ws;
    float* ds;
};

/* Workspace bytes of the chunked backward (0 when it does not apply). */
size_t rwkv7_chunk_bwd_ws_bytes(int N, int64_t B, int64_t H, int64_t T);
/* Raises the chunked backward kernels' dynamic shared-memory limits (once per device). */
int rwkv7_prepare_chunked_bwd(int N);
/* Enqueues the chunked backward: the forward's local and state kernels on f (f.y and
 * f.state_out absent, f.ws == p.ws), then its own three. cudaError_t as int. */
int rwkv7_launch_chunked_bwd(int N, const Rwkv7ChunkParams& f, const Rwkv7ChunkBwdParams& p, void* stream);

/* ------------------------------------------------------------------------------ RWKV-6 */

enum { kRwkv6SegK = 8 }; /* backward: tokens per checkpointed segment */

struct Rwkv6FwdParams {
    DevView r, w, k, v, u, y, state_in, state_out;
    int64_t T;
    int32_t H;
    int32_t form;
    SeqInfo seq;
    /* Forward-saved checkpoints (wkv_problem.save_checkpoints): ckpt and seg0 exactly as the
       backward's (Rwkv6BwdParams); ckpt == nullptr: not saving. */
    float* ckpt;
    int64_t seg0[kMaxSeqsPerLaunch + 1];
};

struct Rwkv6BwdParams {
    DevView r, w, k, v, u, state_in;
    DevView dy, dstate_out;
    DevView dr, dw, dk, dv, dstate_in;
    float* ckpt;  /* as RWKV-7's, with K1 = kRwkv6SegK */
    float* part;  /* du partials: (s * H + h) * N floats per (sequence, head) */
    int64_t T;
    int32_t H;
    int32_t form;
    int32_t reuse; /* 1: ckpt holds a forward's checkpoints (wkv_problem.reuse_checkpoints):
                      skip the column scan's checkpoint pass */
    int32_t pad_;
    int64_t seg0[kMaxSeqsPerLaunch + 1]; /* packed: as Rwkv7BwdParams::seg0 */
    SeqInfo seq;
};

int rwkv6_launch_forward(int N, const Rwkv6FwdParams& p, int64_t blocks, void* stream);
int rwkv6_launch_backward(int N, const Rwkv6BwdParams& p, int64_t blocks, void* stream);
/* du[h][j] = sum over s = 0..S-1, in order, of part[(s * H + h) * N + j]. */
int rwkv6_launch_reduce(int N, const float* part, DevView du, int64_t S, int32_t H, void* stream);

/* ------------------------------------------------------------------------------ RWKV-4 */

enum { kRwkv4SegK = 16, kRwkv4Threads = 128 };

struct Rwkv4FwdParams {
    DevView k, v, w, u, y, state_in, state_out;
    int64_t T;
    int32_t C;
    int32_t pad_;
    SeqInfo seq;
};

struct Rwkv4BwdParams {
    DevView k, v, w, u, state_in;
    DevView dy, dstate_out;
    DevView dk, dv, dstate_in;
    float* ckpt; /* (aa, bb, ph, pl) planes: ((seg0(s) + g) * 4 + part) * C + c */
    float* part; /* dwd, du partials: (2 s + x) * C + c */
    int64_t T;
    int32_t C;
    int32_t pad_;
    int64_t seg0[kMaxSeqsPerLaunch + 1]; /* packed: absolute segment prefix sums */
    SeqInfo seq;
};

/* Grid: (ceil(C / kRwkv4Threads), sequences of the launch). */
int rwkv4_launch_forward(const Rwkv4FwdParams& p, int64_t seqs, void* stream);
int rwkv4_launch_backward(const Rwkv4BwdParams& p, int64_t seqs, void* stream);
/* dw = wd * sum_s dwd partials (0 when the sum is 0), du = sum_s du partials, s in order. */
int rwkv4_launch_reduce(const float* part, DevView w, DevView dw, DevView du, int64_t S, int32_t C,
                        void* stream);

/* ------------------------------------------------------------------------------ attention */

enum { kAttnMaxD = 256 };

/* The sequences of one attention launch (attention_plan.h): `count` from `first`, each cut in
 * tiles along the query rows (the forward, the backward's dq) or the keys (dk, dv). Block x is
 * (tile over the launch's sequences) * heads + head. Unpacked: local sequence x is batch
 * first + x, tiles_per_seq tiles each. Packed: batch 0, local sequence x has rows
 * [q_off[x], q_off[x + 1]), keys [k_off[x], k_off[x + 1]) and its tiles start at
 * tiles_before[x] (x <= count). */
struct AttnSeqs {
    int64_t first, tiles_per_seq;
    int32_t count, packed;
    int64_t q_off[kMaxSeqsPerLaunch + 1];
    int64_t k_off[kMaxSeqsPerLaunch + 1];
    int64_t tiles_before[kMaxSeqsPerLaunch + 1];
};

/* The problem's sizes, as every attention kernel takes them. */
struct AttnShape {
    int64_t Tq, Tk, Hq, Hkv;
    int32_t D, causal;
    float scale;
    /* 1: k and v rows are 16-bit, contiguous along D and 16-byte aligned (every base, and every
     * stride a multiple of 8 elements): the tensor-core kernel stages them 8 elements a load */
    int32_t kv_vec16;
};

struct AttnFwdParams {
    DevView q, k, v, o, lse;
    AttnShape sh;
    AttnSeqs seq;
};

/* The backward's two kernels (attention_bwd_kernel.cuh): dk, dv per tile of keys (sequences
 * tiled along the keys, blocks x = tile * Hkv + kv head) and dq per tile of rows (tiled along
 * the rows, x = tile * Hq + head). dlse absent: 0. */
struct AttnBwdParams {
    DevView q, k, v, o, lse, dout, dlse, dq, dk, dv;
    AttnShape sh;
    int32_t qd_vec16; /* as AttnShape::kv_vec16, for q and dout */
    int32_t pad_;
    AttnSeqs seq;
};

/* The forward's kernels: the SIMT one (every dtype, D <= kAttnMaxD) and the tensor-core one
 * (f16/bf16, D = 64 or 128). */
enum { kAttnSimt = 0, kAttnMma = 1 };
/* Query rows per block of a forward kernel. */
int attn_rows_per_tile(int kernel);
/* Dynamic shared memory of the SIMT forward at head dim D (<= kAttnMaxD), of the mma one. */
size_t attn_smem_bytes(int D);
size_t attn_mma_smem_bytes(int D);
/* Raises the SIMT forward's shared-memory limit to what D = kAttnMaxD needs, when the device's
 * opt-in limit max_smem allows it (once per device). cudaError_t as int. */
int attn_prepare(size_t max_smem);
/* Enqueues a forward kernel: `blocks` = the launch's tiles * Hq. cudaError_t as int. */
int attn_launch_forward(int kernel, const AttnFwdParams& p, int64_t blocks, void* stream);

/* The backward, SIMT (kAttnSimt: every dtype) or tensor-core (kAttnMma: f16/bf16 at D = 64,
 * 128) kernels: keys per dk/dv tile and rows per dq tile; the largest D whose SIMT kernels fit
 * max_smem bytes of shared memory per block, every limit raised (0: none fits, or an error). */
int attn_bwd_keys_per_tile(int kernel);
int attn_bwd_rows_per_tile(int kernel);
int attn_bwd_prepare(size_t max_smem);
/* Enqueues the dk/dv kernel (blocks = key tiles * Hkv) or the dq kernel (row tiles * Hq). */
int attn_launch_backward_kv(int kernel, const AttnBwdParams& p, int64_t blocks, void* stream);
int attn_launch_backward_q(int kernel, const AttnBwdParams& p, int64_t blocks, void* stream);
} // namespace wkv_cuda

#endif
