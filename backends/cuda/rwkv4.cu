/* RWKV-4 WKV on CUDA, forward and backward, in the numerically stable (aa, bb, pp) form.
 *
 * Semantics are the CPU backend's (backends/cpu/rwkv4.cpp), operation for operation: per
 * channel c, wd = -exp(w[c]), per token t:
 *     ww = u + k;  q = max(pp, ww);  e1 = exp(pp - q);  e2 = exp(ww - q)
 *     y  = (e1 aa + e2 v) / (e1 bb + e2)
 *     q2 = max(pp + wd, k);  A = exp(pp + wd - q2);  Bk = exp(k - q2)
 *     aa' = A aa + Bk v;  bb' = A bb + Bk;  pp' = q2
 * with pp carried inside a call as an unevaluated float32 pair ph + pl (TwoSum), u + k formed
 * the same way; state_out holds ph. An absent state_in is aa = bb = 0, pp = -1e38. Backward
 * differentiates the max-tracking form (a max passes its gradient to the larger argument, half
 * to each on a tie).
 *
 * LAYOUT: one thread per (sequence, channel), sequential over the tokens; blocks of 128
 * channels (grid.x) times the launch's sequences (grid.y). Loads of consecutive channels are
 * coalesced when the channel stride is 1. The recurrence is a short dependent chain per token;
 * with only B C threads the kernels are bound by how many loads are in flight, so tokens are
 * loaded a chunk ahead into registers (forward kFC, backward one segment of K with its
 * checkpoint; dy at the segment's start, first used after its replay), never one load per
 * token on the chain; token loops are unrolled and branch-free (selects, predicated stores).
 *
 * BACKWARD: K = kRwkv4SegK = 16 tokens per checkpointed segment.
 *   A. run the forward (no y), storing (aa, bb, ph, pl) before each segment in the workspace;
 *   B. for each segment, last first: replay it from its checkpoint into registers (the state
 *      before each of its tokens; fully unrolled, so the arrays stay in registers), then walk
 *      it backwards with
 *      (gaa, gbb, gpp) exactly as backends/cpu/rwkv4.cpp's backward_step;
 *   dstate_in = (gaa, gbb, gpp); the thread's sums over its tokens of dwd and du go to the
 *   workspace, and a second kernel sums them over sequences 0, 1, ... in that order
 *   (deterministic: no atomics): dw = wd * sum dwd (0 when that sum is 0), du = sum du.
 *
 * WORKSPACE (bytes), K = 16:
 *     256 + A256(4 * 4 * C * G)              checkpoints (aa bb ph pl), G = sum_s ceil(L_s / K)
 *         + A256(4 * 2 * num_seqs * C)       dwd, du partials
 * where A256 rounds up to a multiple of 256. E.g. B=8 T=4096 C=2048: 64 MiB + 128 KiB.
 */
#include "cuda_elem.cuh"

namespace wkv_cuda {
namespace {

using elem::load;
using elem::min64;
using elem::store;

constexpr float kEmptyPP = -1e38f;

__device__ __forceinline__ void two_sum(float a, float b, float* s, float* e) {
    const float sum = __fadd_rn(a, b);
    const float bv = __fsub_rn(sum, a);
    const float err = __fadd_rn(__fsub_rn(a, __fsub_rn(sum, bv)), __fsub_rn(b, bv));
    *s = sum;
    *e = isfinite(sum) ? err : 0.0f;
}

/* 1 / x without the division's slow-path call (a call per token would cut the unrolled token
 * loops into basic blocks): the hardware reciprocal refined by one Newton step, on x scaled by
 * an exact power of two into [2^-64, 2^64] (where the approximation is defined for every
 * input), scaled back. Exact reciprocal up to the final rounding in that range; the
 * denominators here are >= 1 for any state reached from the documented initial ones, and
 * +-0 / +-Inf give IEEE's +-Inf / +-0 (a state with bb = +Inf must give y = 0, not NaN). */
__device__ __forceinline__ float rcp_nr(float x) {
    const float ax = fabsf(x);
    const float sc = ax > 0x1p+64f ? 0x1p-64f : (ax < 0x1p-64f ? 0x1p+64f : 1.0f);
    const float xs = x * sc;
    float r0;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(xs));
    const float e = fmaf(-xs, r0, 1.0f);
    /* 1/(+-0) and 1/(+-Inf) are exact from the approximation (+-Inf, +-0); the Newton step
     * would turn them into NaN (0 * Inf), so they skip it (a select, not a branch) */
    const float r = (xs == 0.0f || isinf(xs)) ? r0 : fmaf(r0, e, r0);
    return r * sc;
}

struct Token {
    float e1, e2, inv, y;
    float A, Bk;
    float qh, ql;
    float side;
};

__device__ __forceinline__ Token token(float a, float b, float ph, float pl, float kk, float vv,
                                       float uu, float wdd, bool want_y) {
    Token o;
    o.e1 = o.e2 = o.inv = o.y = 0.0f;
    if (want_y) {
        float wh, wl;
        two_sum(uu, kk, &wh, &wl);
        const float q = ph >= wh ? ph : wh;
        o.e1 = expf(__fadd_rn(__fsub_rn(ph, q), pl));
        o.e2 = expf(__fadd_rn(__fsub_rn(wh, q), wl));
        o.inv = rcp_nr(__fadd_rn(__fmul_rn(o.e1, b), o.e2));
        o.y = __fmul_rn(__fadd_rn(__fmul_rn(o.e1, a), __fmul_rn(o.e2, vv)), o.inv);
    }
    float sh, sl;
    two_sum(ph, wdd, &sh, &sl);
    const float lo = __fadd_rn(sl, pl);
    const float hi = isfinite(sh) ? __fadd_rn(sh, lo) : sh;
    const float rl = isfinite(sh) ? __fsub_rn(lo, __fsub_rn(hi, sh)) : 0.0f;
    o.side = __fadd_rn(__fsub_rn(hi, kk), rl);
    /* branch-free (selects), one exp: a branch here would end the basic block every token and
     * keep the compiler from overlapping consecutive tokens */
    const bool keep = o.side >= 0.0f;
    const float ex = expf(keep ? __fsub_rn(__fsub_rn(kk, hi), rl) : __fadd_rn(__fsub_rn(hi, kk), rl));
    o.qh = keep ? hi : kk;
    o.ql = keep ? rl : 0.0f;
    o.A = keep ? 1.0f : ex;
    o.Bk = keep ? ex : 1.0f;
    return o;
}

__device__ __forceinline__ int64_t tok(const DevView& x, int64_t b, int64_t t, int64_t c) {
    return b * x.s[0] + t * x.s[1] + c * x.s[3];
}
__device__ __forceinline__ int64_t st_off(const DevView& x, int64_t s, int64_t part, int64_t c) {
    return s * x.s[0] + part * x.s[1] + c * x.s[3];
}

/* Tokens per forward chunk: the next chunk's k, v (2 kFC floats per thread) are loaded while
 * this one is computed. With 128 threads per SM (B C = 16384 channels over 132 SMs) this keeps
 * ~32 KiB of loads in flight per SM, about what DRAM latency x bandwidth needs. */
constexpr int kFC = 32;

__global__ void __launch_bounds__(kRwkv4Threads) rwkv4_forward_kernel(const Rwkv4FwdParams p) {
    const int64_t c = (int64_t)blockIdx.x * kRwkv4Threads + threadIdx.x;
    if (c >= p.C) return;
    const elem::Seq q = elem::seq_of(p.seq, blockIdx.y, p.T);
    float a = 0.0f, b = 0.0f, ph = kEmptyPP, pl = 0.0f;
    if (p.state_in.data) {
        a = load(p.state_in, st_off(p.state_in, q.s, 0, c));
        b = load(p.state_in, st_off(p.state_in, q.s, 1, c));
        ph = load(p.state_in, st_off(p.state_in, q.s, 2, c));
    }
    const float wd = -expf(load(p.w, c * p.w.s[3]));
    const float u = load(p.u, c * p.u.s[3]);
    const bool want_y = p.y.data != nullptr;
    /* the next chunk's k, v are loaded before this one is computed (indices clamped, so no
     * load sits under a branch) */
    float kn[kFC], vn[kFC];
    auto fetch = [&](int64_t tc) {
#pragma unroll
        for (int x = 0; x < kFC; ++x) {
            const int64_t t = min64(tc + x, q.t1 - 1);
            kn[x] = load(p.k, tok(p.k, q.batch, t, c));
            vn[x] = load(p.v, tok(p.v, q.batch, t, c));
        }
    };
    if (q.t1 > q.t0) fetch(q.t0);
    for (int64_t tc = q.t0; tc < q.t1; tc += kFC) {
        float kc[kFC], vc[kFC];
#pragma unroll
        for (int x = 0; x < kFC; ++x) {
            kc[x] = kn[x];
            vc[x] = vn[x];
        }
        fetch(tc + kFC < q.t1 ? tc + kFC : tc);
        const int n = (int)min64(kFC, q.t1 - tc);
        auto step = [&](int x) {
            const Token o = token(a, b, ph, pl, kc[x], vc[x], u, wd, true); /* y even when unused: no branch */
            elem::store_if(p.y, tok(p.y, q.batch, tc + x, c), o.y, want_y);
            a = __fadd_rn(__fmul_rn(o.A, a), __fmul_rn(o.Bk, vc[x]));
            b = __fadd_rn(__fmul_rn(o.A, b), o.Bk);
            ph = o.qh;
            pl = o.ql;
        };
        if (n == kFC) { /* a whole chunk: straight-line code */
#pragma unroll
            for (int x = 0; x < kFC; ++x) step(x);
        } else {
#pragma unroll
            for (int x = 0; x < kFC; ++x)
                if (x < n) step(x);
        }
    }
    if (p.state_out.data) {
        store(p.state_out, st_off(p.state_out, q.s, 0, c), a);
        store(p.state_out, st_off(p.state_out, q.s, 1, c), b);
        store(p.state_out, st_off(p.state_out, q.s, 2, c), ph);
    }
}

__global__ void __launch_bounds__(kRwkv4Threads) rwkv4_backward_kernel(const Rwkv4BwdParams p) {
    constexpr int K = kRwkv4SegK;
    const int64_t c = (int64_t)blockIdx.x * kRwkv4Threads + threadIdx.x;
    if (c >= p.C) return;
    const int64_t C = p.C;
    const int64_t local = blockIdx.y;
    const elem::Seq q = elem::seq_of(p.seq, local, p.T);
    const int64_t len = q.t1 - q.t0;
    const int64_t nseg = (len + K - 1) / K;
    const int64_t seg0 = p.seq.packed ? p.seg0[local] : q.s * ((p.T + K - 1) / K);
    float* ck = p.ckpt + (size_t)seg0 * 4 * (size_t)C + (size_t)c;

    const float wd = -expf(load(p.w, c * p.w.s[3]));
    const float u = load(p.u, c * p.u.s[3]);

    /* segment g's tokens (and, backward, its dy and checkpoint) are loaded one segment ahead
     * into registers; indices clamped to the sequence, so no load sits under a branch */
    float kn[K], vn[K], cn[4];
    auto fetch = [&](int64_t g, bool bw) {
#pragma unroll
        for (int x = 0; x < K; ++x) {
            const int64_t t = min64(q.t0 + g * K + x, q.t1 - 1);
            kn[x] = load(p.k, tok(p.k, q.batch, t, c));
            vn[x] = load(p.v, tok(p.v, q.batch, t, c));
        }
        if (bw) {
            const float* x = ck + (size_t)g * 4 * (size_t)C;
            cn[0] = x[0];
            cn[1] = x[C];
            cn[2] = x[2 * C];
            cn[3] = x[3 * C];
        }
    };

    /* A. checkpoints */
    {
        float a = 0.0f, b = 0.0f, ph = kEmptyPP, pl = 0.0f;
        if (p.state_in.data) {
            a = load(p.state_in, st_off(p.state_in, q.s, 0, c));
            b = load(p.state_in, st_off(p.state_in, q.s, 1, c));
            ph = load(p.state_in, st_off(p.state_in, q.s, 2, c));
        }
        if (nseg > 1) fetch(0, false);
        for (int64_t g = 0; g < nseg; ++g) {
            float* x = ck + (size_t)g * 4 * (size_t)C;
            x[0] = a;
            x[C] = b;
            x[2 * C] = ph;
            x[3 * C] = pl;
            if (g + 1 == nseg) break;
            float kc[K], vc[K];
#pragma unroll
            for (int i = 0; i < K; ++i) {
                kc[i] = kn[i];
                vc[i] = vn[i];
            }
            fetch(g + 2 < nseg ? g + 1 : g, false);
#pragma unroll
            for (int i = 0; i < K; ++i) {
                const Token o = token(a, b, ph, pl, kc[i], vc[i], u, wd, false);
                a = __fadd_rn(__fmul_rn(o.A, a), __fmul_rn(o.Bk, vc[i]));
                b = __fadd_rn(__fmul_rn(o.A, b), o.Bk);
                ph = o.qh;
                pl = o.ql;
            }
        }
    }

    /* B. segments in reverse */
    float gaa = 0.0f, gbb = 0.0f, gpp = 0.0f;
    if (p.dstate_out.data) {
        gaa = load(p.dstate_out, st_off(p.dstate_out, q.s, 0, c));
        gbb = load(p.dstate_out, st_off(p.dstate_out, q.s, 1, c));
        gpp = load(p.dstate_out, st_off(p.dstate_out, q.s, 2, c));
    }
    float dwd = 0.0f, du = 0.0f;
    if (nseg > 0) fetch(nseg - 1, true);
    for (int64_t g = nseg - 1; g >= 0; --g) {
        const int64_t ts = q.t0 + g * K;
        const int m = (int)min64(K, q.t1 - ts);
        float kc[K], vc[K], dc[K];
#pragma unroll
        for (int i = 0; i < K; ++i) {
            kc[i] = kn[i];
            vc[i] = vn[i];
            /* dy is first needed after the replay: loaded now, it arrives meanwhile */
            dc[i] = load(p.dy, tok(p.dy, q.batch, min64(ts + i, q.t1 - 1), c));
        }
        float a = cn[0], b = cn[1], ph = cn[2], pl = cn[3];
        fetch(g > 0 ? g - 1 : 0, true);
        /* replay: the state before each token of the segment (slots past m hold clamped copies
         * of real tokens: finite, never used) */
        float ra[K], rb[K], rh[K], rl[K];
#pragma unroll
        for (int i = 0; i < K; ++i) {
            ra[i] = a;
            rb[i] = b;
            rh[i] = ph;
            rl[i] = pl;
            if (i + 1 < K) {
                const Token o = token(a, b, ph, pl, kc[i], vc[i], u, wd, false);
                a = __fadd_rn(__fmul_rn(o.A, a), __fmul_rn(o.Bk, vc[i]));
                b = __fadd_rn(__fmul_rn(o.A, b), o.Bk);
                ph = o.qh;
                pl = o.ql;
            }
        }
        auto back = [&](int i) {
            const float kk = kc[i], vv = vc[i], dy = dc[i];
            const float sa = ra[i], sb = rb[i];
            const Token o = token(sa, sb, rh[i], rl[i], kk, vv, u, wd, true);
            /* through y */
            const float gg = dy * o.inv;
            const float dk_y = gg * o.e2 * (vv - o.y);
            float ga = gg * o.e1, gb = -gg * o.y * o.e1, gp = gg * o.e1 * (sa - o.y * sb);
            float dkt = dk_y, dvt = gg * o.e2, dwt = 0.0f;
            /* through the update */
            const float dA = gaa * sa + gbb * sb, dB = gaa * vv + gbb;
            const float dAA = dA * o.A;
            const float dq2 = gpp - dAA - dB * o.Bk;
            ga += gaa * o.A;
            gb += gbb * o.A;
            gp += dAA;
            dwt += dAA;
            dvt += gaa * o.Bk;
            dkt += dB * o.Bk;
            /* the max's gradient: to pp (and w) when pp + wd won, to k when k won, half each on
             * a tie (selects, not branches: see token()) */
            const float half = 0.5f * dq2;
            const float to_p = o.side > 0.0f ? dq2 : (o.side < 0.0f ? 0.0f : half);
            const float to_k = o.side < 0.0f ? dq2 : (o.side > 0.0f ? 0.0f : half);
            gp += to_p;
            dwt += to_p;
            dkt += to_k;
            gaa = ga;
            gbb = gb;
            gpp = gp;
            dwd += dwt;
            du += dk_y;
            store(p.dk, tok(p.dk, q.batch, ts + i, c), dkt);
            store(p.dv, tok(p.dv, q.batch, ts + i, c), dvt);
        };
        if (m == K) { /* a whole segment: straight-line code */
#pragma unroll
            for (int i = K - 1; i >= 0; --i) back(i);
        } else {
#pragma unroll
            for (int i = K - 1; i >= 0; --i)
                if (i < m) back(i);
        }
    }
    if (p.dstate_in.data) {
        store(p.dstate_in, st_off(p.dstate_in, q.s, 0, c), gaa);
        store(p.dstate_in, st_off(p.dstate_in, q.s, 1, c), gbb);
        store(p.dstate_in, st_off(p.dstate_in, q.s, 2, c), gpp);
    }
    p.part[(size_t)(2 * q.s) * (size_t)C + (size_t)c] = dwd;
    p.part[(size_t)(2 * q.s + 1) * (size_t)C + (size_t)c] = du;
}

__global__ void rwkv4_reduce_kernel(const float* part, DevView w, DevView dw, DevView du, int64_t S,
                                    int32_t C) {
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float gw = 0.0f, gu = 0.0f;
    for (int64_t s = 0; s < S; ++s) {
        gw += part[(2 * s) * C + c];
        gu += part[(2 * s + 1) * C + c];
    }
    const float wv = load(w, c * w.s[3]);
    store(dw, c * dw.s[3], gw == 0.0f ? 0.0f : gw * -expf(wv));
    store(du, c * du.s[3], gu);
}

} // namespace

int rwkv4_launch_forward(const Rwkv4FwdParams& p, int64_t seqs, void* stream) {
    const dim3 grid((unsigned)((p.C + kRwkv4Threads - 1) / kRwkv4Threads), (unsigned)seqs);
    rwkv4_forward_kernel<<<grid, kRwkv4Threads, 0, static_cast<cudaStream_t>(stream)>>>(p);
    return (int)cudaGetLastError();
}

int rwkv4_launch_backward(const Rwkv4BwdParams& p, int64_t seqs, void* stream) {
    const dim3 grid((unsigned)((p.C + kRwkv4Threads - 1) / kRwkv4Threads), (unsigned)seqs);
    rwkv4_backward_kernel<<<grid, kRwkv4Threads, 0, static_cast<cudaStream_t>(stream)>>>(p);
    return (int)cudaGetLastError();
}

int rwkv4_launch_reduce(const float* part, DevView w, DevView dw, DevView du, int64_t S, int32_t C,
                        void* stream) {
    rwkv4_reduce_kernel<<<(unsigned)((C + 127) / 128), 128, 0, static_cast<cudaStream_t>(stream)>>>(
        part, w, dw, du, S, C);
    return (int)cudaGetLastError();
}

} // namespace wkv_cuda
