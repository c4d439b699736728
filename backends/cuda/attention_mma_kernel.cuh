/* Softmax attention forward on CUDA with tensor cores, device code: cuda.mma.{f16,bf16}.d{64,128}
 * (f16/bf16 I/O, D = 64 or 128; float32 scores, softmax and accumulators).
 *
 * A block is 64 query rows of one sequence x one query head: 4 warps, 16 rows each. Per block of
 * 64 keys, K and V are staged in shared memory as 16-bit rows padded by 8 elements (row strides
 * of 36 / 68 words: the fragment loads below hit 32 distinct banks). Each warp then:
 *   S = Q K^T by mma.sync.m16n8k16 (Q's A fragments held in registers for the whole walk, K's B
 *     fragments one 32-bit load each: two consecutive d of one key), 8 tiles of 16 x 8;
 *   scale, mask (keys past the row's last -> -inf), the row max over the 4 lanes that share a row
 *     (two shuffles), P = exp(S - m), the accumulator rescaled by exp(m_old - m_new);
 *   O += P V: S's accumulator layout is the A fragment layout of two adjacent 16 x 8 tiles, so P
 *     is packed to 16 bits in registers and fed straight back (the flash-attention-2 trick);
 *     V's B fragments pair two keys of one d (two 16-bit loads); bf16 P goes as hi + lo parts
 *     (below), f16 P as one.
 * The row sums l stay per lane (partial over its columns) and are summed over the row's 4 lanes
 * at the end; o = O / l, lse = m + log l; a row that sees no key: o = 0, lse = -inf.
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16 with .f16/.bf16 A and B, .f32 C/D), g = lane / 4,
 * t = lane % 4: A (16 x 16, row-major) a0,a1: (g, 2t + {0,1}), a2,a3: (g + 8, 2t + {0,1}),
 * a4,a5: (g, 2t + 8 + {0,1}), a6,a7: (g + 8, 2t + 8 + {0,1}); B (16 x 8) b0,b1: (2t + {0,1}, g),
 * b2,b3: (2t + 8 + {0,1}, g); C (16 x 8) c0,c1: (g, 2t + {0,1}), c2,c3: (g + 8, 2t + {0,1}).
 * Two 16-bit elements share a 32-bit register, the lower index in the lower half.
 *
 * Included by attention.cu and by the CPU emulation test (tests/emu, whose mma follows those
 * layouts), as attention_kernel.cuh. */
#ifndef WKV_BACKENDS_CUDA_ATTENTION_MMA_KERNEL_CUH
#define WKV_BACKENDS_CUDA_ATTENTION_MMA_KERNEL_CUH

#include "attention_kernel.cuh"

namespace wkv_cuda {
namespace attn {

constexpr int kMmaRows = 64;  /* query rows per block: 4 warps x 16 */
constexpr int kMmaKeys = 64;  /* keys per shared-memory block */
constexpr int kMmaWarps = 4;
constexpr int kMmaPad = 8;    /* 16-bit elements after each staged row */

/* Dynamic shared memory of attn_fwd_mma: K and V blocks of 16-bit rows. */
__host__ __device__ constexpr size_t mma_fwd_smem_bytes(int D) {
    return 2 * sizeof(uint16_t) * kMmaKeys * (size_t)(D + kMmaPad);
}

/* Two floats as one register of two 16-bit values (round to nearest even), lo in the low half. */
template <bool BF16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
#ifdef WKV_CUDA_EMULATION
    const uint16_t a = BF16 ? elem::float_to_bf16(lo) : elem::float_to_half(lo);
    const uint16_t b = BF16 ? elem::float_to_bf16(hi) : elem::float_to_half(hi);
#else
    const uint16_t a = BF16 ? __bfloat16_as_ushort(__float2bfloat16_rn(lo)) : __half_as_ushort(__float2half_rn(lo));
    const uint16_t b = BF16 ? __bfloat16_as_ushort(__float2bfloat16_rn(hi)) : __half_as_ushort(__float2half_rn(hi));
#endif
    return (uint32_t)a | ((uint32_t)b << 16);
}

/* A 16-bit value (in the low half of x) as float. */
template <bool BF16>
__device__ __forceinline__ float from16(uint32_t x) {
#ifdef WKV_CUDA_EMULATION
    if (!BF16) return elem::half_to_float((uint16_t)x);
    const uint32_t u = x << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
#else
    return BF16 ? __uint_as_float(x << 16) : __half2float(__ushort_as_half((unsigned short)x));
#endif
}

template <bool BF16>
__device__ __forceinline__ uint16_t to16(float x) {
    return (uint16_t)(pack2<BF16>(x, 0.0f) & 0xFFFFu);
}

/* 16 bytes from global src (16-byte aligned; NULL: zeros) to shared dst (16-byte aligned). */
__device__ __forceinline__ void copy16(uint16_t* dst, const char* src) {
#ifdef WKV_CUDA_EMULATION
    if (src) std::memcpy(dst, src, 16);
    else std::memset(dst, 0, 16);
#else
    *reinterpret_cast<uint4*>(dst) = src ? *reinterpret_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
#endif
}

/* d += A B for one m16n8k16 tile (the layouts above). */
template <bool BF16>
__device__ __forceinline__ void mma16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
#ifdef WKV_CUDA_EMULATION
    wkv_emu::mma_m16n8k16(d, a, b, BF16);
#else
    if (BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/* Rows t0 .. t0 + 63 of view v (batch b, head h; rows from n on are zeros) into shared dst as
 * 16-bit rows of D + kMmaPad elements, by the block's 128 threads: 16 bytes a load when vec
 * (16-bit, contiguous along D, 16-byte aligned rows), else element by element. */
template <int D, bool BF16>
__device__ __forceinline__ void stage_rows(uint16_t* dst, const DevView& v, int64_t b, int64_t t0, int64_t n,
                                           int64_t h, bool vec, int tid) {
    constexpr int S = D + kMmaPad;
    if (vec) {
        for (int i = tid; i < 64 * (D / 8); i += kMmaWarps * 32) {
            const int j = i / (D / 8), d = 8 * (i % (D / 8));
            copy16(dst + j * S + d, j < n ? v.data + 2 * offset(v, b, t0 + j, h, d) : nullptr);
        }
    } else {
        for (int i = tid; i < 64 * D; i += kMmaWarps * 32) {
            const int j = i / D, d = i % D;
            dst[j * S + d] = to16<BF16>(j < n ? elem::load(v, offset(v, b, t0 + j, h, d)) : 0.0f);
        }
    }
}

/* Fragments from staged rows (stride S): the A fragment of rows row0 .. row0 + 15 at k-step kk
 * (d = 16 kk ..); the B fragment with the rows as n (n-tile at row0) and d as k (k-step kk):
 * B(k = d, n = row) = M[row][d], a register per two consecutive d; the B fragment with the rows
 * as k (k-step at row0) and d as n (n-tile dt): B(k = row, n = d) = M[row][d], two rows a
 * register. */
template <int S>
__device__ __forceinline__ void frag_a(uint32_t a[4], const uint16_t* m, int row0, int kk, int g, int t) {
    const uint16_t* p = m + (row0 + g) * S + 16 * kk + 2 * t;
    a[0] = *reinterpret_cast<const uint32_t*>(p);
    a[1] = *reinterpret_cast<const uint32_t*>(p + 8 * S);
    a[2] = *reinterpret_cast<const uint32_t*>(p + 8);
    a[3] = *reinterpret_cast<const uint32_t*>(p + 8 * S + 8);
}
template <int S>
__device__ __forceinline__ void frag_b_rows_n(uint32_t b[2], const uint16_t* m, int row0, int kk, int g, int t) {
    const uint16_t* p = m + (row0 + g) * S + 16 * kk + 2 * t;
    b[0] = *reinterpret_cast<const uint32_t*>(p);
    b[1] = *reinterpret_cast<const uint32_t*>(p + 8);
}
template <int S>
__device__ __forceinline__ void frag_b_rows_k(uint32_t b[2], const uint16_t* m, int row0, int dt, int g, int t) {
    const uint16_t* p = m + (row0 + 2 * t) * S + 8 * dt + g;
    b[0] = (uint32_t)p[0] | ((uint32_t)p[S] << 16);
    b[1] = (uint32_t)p[8 * S] | ((uint32_t)p[9 * S] << 16);
}

/* The A fragment (hi, and for bf16 the lo part: x - hi rounded again) of k-step j of a 16 x 64
 * product from its accumulator tiles c[2j] and c[2j + 1] (the flash-attention-2 trick: the
 * accumulator layout of two adjacent 16 x 8 tiles is the A layout of one 16 x 16). */
template <bool BF16>
__device__ __forceinline__ void frag_a_from_acc(uint32_t hi[4], uint32_t lo[4], const float (*c)[4], int j) {
    const float* p4[4] = {&c[2 * j][0], &c[2 * j][2], &c[2 * j + 1][0], &c[2 * j + 1][2]};
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        hi[r] = pack2<BF16>(p4[r][0], p4[r][1]);
        lo[r] = BF16 ? pack2<BF16>(p4[r][0] - from16<BF16>(hi[r] & 0xFFFFu), p4[r][1] - from16<BF16>(hi[r] >> 16)) : 0u;
    }
}

/* d += A B, and for bf16 also A_lo B (frag_a_from_acc's pair). */
template <bool BF16>
__device__ __forceinline__ void mma_pair(float d[4], const uint32_t hi[4], const uint32_t lo[4], const uint32_t b[2]) {
    mma16816<BF16>(d, hi, b);
    if (BF16) mma16816<BF16>(d, lo, b);
}

template <int D, bool BF16>
__global__ void __launch_bounds__(kMmaWarps * 32) attn_fwd_mma(const AttnFwdParams p) {
    WKV_DYNAMIC_SHARED(uint16_t, smem16);
    constexpr int S = D + kMmaPad;   /* staged row stride, 16-bit elements */
    constexpr int KD = D / 16;       /* k-steps of Q K^T */
    constexpr int NT = kMmaKeys / 8; /* 16 x 8 score tiles per block */
    constexpr int DT = D / 8;        /* 16 x 8 output tiles */
    uint16_t* k_s = smem16;          /* [kMmaKeys][S] */
    uint16_t* v_s = k_s + kMmaKeys * S;
    const AttnShape& sh = p.sh;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;

    const int64_t h = blockIdx.x % sh.Hq;
    int64_t b, q0, q1, k0, k1, tile;
    attn_locate(p.seq, sh, blockIdx.x / sh.Hq, &b, &q0, &q1, &k0, &k1, &tile);
    const int64_t r0 = q0 + tile * kMmaRows;
    const int64_t r1 = elem::min64(q1, r0 + kMmaRows);
    const int64_t kvh = h / (sh.Hq / sh.Hkv);
    const int64_t kend = attn_last_key(sh, r1 - 1, q0, q1, k0, k1) + 1;
    /* this lane's two rows: g and g + 8 of the warp's 16 */
    const int64_t row[2] = {r0 + warp * 16 + g, r0 + warp * 16 + g + 8};
    const bool row_in[2] = {row[0] < r1, row[1] < r1};
    int64_t last[2];
#pragma unroll
    for (int x = 0; x < 2; ++x) last[x] = row_in[x] ? attn_last_key(sh, row[x], q0, q1, k0, k1) : k0 - 1;

    /* Q's A fragments: k-step kk holds d = 16 kk + 2t + {0, 1} (a0..a3) and + 8 (a4..a7) */
    uint32_t qa[KD][4];
#pragma unroll
    for (int kk = 0; kk < KD; ++kk)
#pragma unroll
        for (int half = 0; half < 2; ++half) { /* half 0: a0..a3 (d), half 1: a4..a7 (d + 8) */
            const int d = 16 * kk + 2 * t + 8 * half;
            float x[2][2];
#pragma unroll
            for (int rr = 0; rr < 2; ++rr)
#pragma unroll
                for (int c = 0; c < 2; ++c)
                    x[rr][c] = row_in[rr] ? elem::load(p.q, offset(p.q, b, row[rr], h, d + c)) : 0.0f;
            qa[kk][2 * half] = pack2<BF16>(x[0][0], x[0][1]);
            qa[kk][2 * half + 1] = pack2<BF16>(x[1][0], x[1][1]);
        }

    float o[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int i = 0; i < 4; ++i) o[dt][i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* l: this lane's columns only */

    for (int64_t j0 = k0; j0 < kend; j0 += kMmaKeys) {
        __syncthreads(); /* the previous block's reads are done */
        stage_rows<D, BF16>(k_s, p.k, b, j0, kend - j0, kvh, sh.kv_vec16, tid);
        stage_rows<D, BF16>(v_s, p.v, b, j0, kend - j0, kvh, sh.kv_vec16, tid);
        __syncthreads();

        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int i = 0; i < 4; ++i) s[nt][i] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KD; ++kk) {
                uint32_t kb[2];
                frag_b_rows_n<S>(kb, k_s, nt * 8, kk, g, t);
                mma16816<BF16>(s[nt], qa[kk], kb);
            }
        }
        /* scale, mask, row max (over the 4 lanes of a row: xor 1, 2) */
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int x = i >> 1;
                const int64_t key = j0 + nt * 8 + 2 * t + (i & 1);
                const bool valid = key < kend && key <= last[x];
                s[nt][i] = valid ? s[nt][i] * sh.scale : -INFINITY;
                mx[x] = fmaxf(mx[x], s[nt][i]);
            }
        float corr[2], base[2];
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 1));
            mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 2));
            const float m_new = fmaxf(m[x], mx[x]);
            /* no key seen yet: p = 0 below (exp(-inf)), nothing to rescale */
            base[x] = m_new == -INFINITY ? 0.0f : m_new;
            corr[x] = m[x] == -INFINITY ? 0.0f : expf(m[x] - m_new);
            m[x] = m_new;
            l[x] *= corr[x];
        }
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
            o[dt][0] *= corr[0], o[dt][1] *= corr[0];
            o[dt][2] *= corr[1], o[dt][3] *= corr[1];
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                s[nt][i] = expf(s[nt][i] - base[i >> 1]);
                l[i >> 1] += s[nt][i];
            }
        /* O += P V: keys 16 kk2 .. 16 kk2 + 15 are score tiles 2 kk2 and 2 kk2 + 1. bf16: P as
         * hi + lo (hi = bf16(p), lo = bf16(p - hi)), two products: one bf16 rounding of p (2^-9)
         * took o's error to 2.1e-3 rel-RMS against the 2e-3 bound (tests/emu). */
#pragma unroll
        for (int kk2 = 0; kk2 < kMmaKeys / 16; ++kk2) {
            uint32_t pa[4], pl[4];
            frag_a_from_acc<BF16>(pa, pl, s, kk2);
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
                uint32_t vb[2];
                frag_b_rows_k<S>(vb, v_s, 16 * kk2, dt, g, t);
                mma_pair<BF16>(o[dt], pa, pl, vb);
            }
        }
    }

    float inv[2];
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        l[x] += __shfl_xor_sync(0xffffffffu, l[x], 1);
        l[x] += __shfl_xor_sync(0xffffffffu, l[x], 2);
        inv[x] = l[x] > 0.0f ? 1.0f / l[x] : 0.0f;
    }
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int x = i >> 1;
            if (row_in[x])
                elem::store(p.o, offset(p.o, b, row[x], h, 8 * dt + 2 * t + (i & 1)), o[dt][i] * inv[x]);
        }
    if (p.lse.data && t == 0)
#pragma unroll
        for (int x = 0; x < 2; ++x)
            if (row_in[x])
                elem::store(p.lse, offset(p.lse, b, row[x], h, 0), l[x] > 0.0f ? m[x] + logf(l[x]) : -INFINITY);
}

} // namespace attn
} // namespace wkv_cuda

#endif
