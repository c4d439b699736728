/* RWKV-6 (and RWKV-5: w with a T-stride of 0) WKV on CUDA: forward and backward (checkpoint +
 * replay; never divides by the decay).
 *
 * Semantics are the CPU backend's (backends/cpu/rwkv6.cpp): per (sequence s, head h), S the
 * N x N float32 state S[i][j] (i value row, j key column), u the head's bonus row, per token t:
 *     y[i]    = sum_j r[j] S[i][j]  +  v[i] ruk,   ruk = sum_j r[j] u[j] k[j]   (S before)
 *     S[i][j] = S[i][j] decay[j] + v[i] k[j]
 * Inputs of any dtype are converted to float32 on load; arithmetic and the state are float32.
 * N in {32, 64, 128}; one block of N threads per (sequence, head).
 *
 * ------------------------------------------------------------------------------ FORWARD
 * Thread i owns value row i of S in registers. Tokens are staged in shared memory in chunks of
 * TC = 16 (r, k, decay; ruk per token computed once per chunk); y[i] is a row sum the thread
 * does alone. The state is read once and written once, so state_out may be state_in. No
 * workspace.
 *
 * ------------------------------------------------------------------------------ BACKWARD
 * Thread j owns key column j of S and of the state gradient dS. K = kRwkv6SegK = 16 tokens per
 * checkpointed segment. Per (sequence, head) of L tokens, G = ceil(L / K) segments:
 *   A. run the forward from state_in (column form, no y), storing the state before each
 *      segment in the workspace (checkpoints);
 *   B. for each segment, last first: replay it from its checkpoint, storing the K - 1 states
 *      after its tokens but the last in the block's replay area of the workspace (each thread
 *      writes and reads back only its own column: no synchronisation); then walk it backwards:
 *        dr[j] = sum_i Sp[i][j] dy[i] + u[j] k[j] dyv       (column sums: the thread's own)
 *        dk[j] = sum_i dS[i][j] v[i]  + r[j] u[j] dyv
 *        dd[j] = sum_i dS[i][j] Sp[i][j];  dw[j] = dd[j] d decay / d w
 *        dv[i] = sum_j dS[i][j] k[j]  + dy[i] ruk           (row sums: through shared memory,
 *                 32 rows at a time, a fixed order of additions)
 *        du_acc[j] += r[j] k[j] dyv                         (per thread, token order)
 *        dS[i][j] = dS[i][j] decay[j] + dy[i] r[j]
 *   dstate_in = dS; the (sequence, head)'s du partial goes to the workspace, and a second
 *   kernel sums the partials over sequences 0, 1, ... in that order (deterministic: no atomics).
 *
 * WORKSPACE (bytes), K = 16:
 *     256 + A256(4 * H * G * N * N)          checkpoints, G = sum_s ceil(L_s / K)
 *         + A256(4 * num_seqs * H * N)       du partials
 *         + 4 * Bl * (K - 1) * N * N         replay states, Bl = H * (sequences per launch:
 *                                            num_seqs unpacked, min(num_seqs, 128) packed)
 * where A256 rounds up to a multiple of 256. E.g. B=8 T=4096 H=32 N=64: 1 GiB + 64 KiB +
 * 60 MiB.
 */
#include "cuda_elem.cuh"

namespace wkv_cuda {
namespace {

using elem::load;
using elem::min64;
using elem::store;

constexpr int kTC = 16; /* forward staging chunk */
constexpr int kBC = 8;  /* backward staging chunk (divides kRwkv6SegK) */
constexpr int kRC = 32; /* rows per shared-memory row-sum pass */
static_assert(kRwkv6SegK % kBC == 0, "chunk");

__device__ __forceinline__ int64_t tok(const DevView& v, int64_t b, int64_t t, int64_t h, int64_t n) {
    return b * v.s[0] + t * v.s[1] + h * v.s[2] + n * v.s[3];
}
__device__ __forceinline__ int64_t st_off(const DevView& v, int64_t s, int64_t h, int64_t i, int64_t j) {
    return s * v.s[0] + h * v.s[1] + i * v.s[2] + j * v.s[3];
}

template <int N>
__global__ void __launch_bounds__(N) rwkv6_forward_kernel(const Rwkv6FwdParams p) {
    __shared__ float su[N];
    __shared__ float sr[kTC][N], sk[kTC][N], sd[kTC][N];
    __shared__ float sruk[kTC];
    const int H = p.H;
    const int64_t local = blockIdx.x / H, h = blockIdx.x % H;
    const elem::Seq q = elem::seq_of(p.seq, local, p.T);
    const int i = threadIdx.x;

    float S[N];
    if (p.state_in.data) {
        const float* sp = reinterpret_cast<const float*>(p.state_in.data);
#pragma unroll
        for (int j = 0; j < N; ++j) S[j] = sp[st_off(p.state_in, q.s, h, i, j)];
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j) S[j] = 0.0f;
    }
    su[i] = load(p.u, h * p.u.s[2] + i * p.u.s[3]);
    const bool want_y = p.y.data != nullptr;
    for (int64_t tc = q.t0; tc < q.t1; tc += kTC) {
        const int n = (int)min64(kTC, q.t1 - tc);
        __syncthreads();
        for (int x = 0; x < n; ++x) {
            const int64_t t = tc + x;
            sr[x][i] = load(p.r, tok(p.r, q.batch, t, h, i));
            sk[x][i] = load(p.k, tok(p.k, q.batch, t, h, i));
            float ddw;
            sd[x][i] = elem::decay_of(p.form, load(p.w, tok(p.w, q.batch, t, h, i)), &ddw);
        }
        __syncthreads();
        if (i < n) {
            float a = 0.0f;
            for (int j = 0; j < N; ++j) a = fmaf(sr[i][j] * su[j], sk[i][j], a);
            sruk[i] = a;
        }
        __syncthreads();
        for (int x = 0; x < n; ++x) {
            const int64_t t = tc + x;
            const float vi = load(p.v, tok(p.v, q.batch, t, h, i));
            float y0 = 0.0f, y1 = 0.0f;
#pragma unroll
            for (int j = 0; j < N; j += 2) {
                y0 = fmaf(S[j], sr[x][j], y0);
                y1 = fmaf(S[j + 1], sr[x][j + 1], y1);
                S[j] = fmaf(S[j], sd[x][j], vi * sk[x][j]);
                S[j + 1] = fmaf(S[j + 1], sd[x][j + 1], vi * sk[x][j + 1]);
            }
            if (want_y) store(p.y, tok(p.y, q.batch, t, h, i), (y0 + y1) + vi * sruk[x]);
        }
    }
    if (p.state_out.data) {
        float* sp = reinterpret_cast<float*>(p.state_out.data);
#pragma unroll
        for (int j = 0; j < N; ++j) sp[st_off(p.state_out, q.s, h, i, j)] = S[j];
    }
}

template <int N>
__global__ void __launch_bounds__(N) rwkv6_backward_kernel(const Rwkv6BwdParams p) {
    constexpr int K = kRwkv6SegK;
    constexpr int NP = N / 32;
    constexpr size_t N2 = (size_t)N * N;
    __shared__ float su[N];
    __shared__ float sr[kBC][N], sk[kBC][N], sv[kBC][N], sd[kBC][N], sg[kBC][N], sdy[kBC][N];
    __shared__ float sruk[kBC], sdyv[kBC];
    __shared__ float sP[kRC][N + 1];
    __shared__ float sQ[N / kRC][NP][32];
    const int H = p.H;
    const int64_t local = blockIdx.x / H, h = blockIdx.x % H;
    const elem::Seq q = elem::seq_of(p.seq, local, p.T);
    const int j = threadIdx.x;
    const int64_t len = q.t1 - q.t0;
    const int64_t nseg = (len + K - 1) / K;
    const int64_t seg0 = p.seq.packed ? p.seg0[local] : q.s * ((p.T + K - 1) / K);
    float* ck = p.ckpt + ((size_t)seg0 * (size_t)H + (size_t)h * (size_t)nseg) * N2;
    float* rep = p.seg + (size_t)blockIdx.x * (size_t)(K - 1) * N2;
    su[j] = load(p.u, h * p.u.s[2] + j * p.u.s[3]);

    /* A. checkpoints */
    {
        float S[N];
        if (p.state_in.data) {
            const float* sp = reinterpret_cast<const float*>(p.state_in.data);
#pragma unroll
            for (int i = 0; i < N; ++i) S[i] = sp[st_off(p.state_in, q.s, h, i, j)];
        } else {
#pragma unroll
            for (int i = 0; i < N; ++i) S[i] = 0.0f;
        }
        if (nseg > 0) {
#pragma unroll
            for (int i = 0; i < N; ++i) ck[i * N + j] = S[i];
        }
        for (int64_t g = 0; g + 1 < nseg; ++g) {
            for (int64_t tc = q.t0 + g * K; tc < q.t0 + (g + 1) * K; tc += kBC) {
                __syncthreads();
                for (int x = 0; x < kBC; ++x) {
                    const int64_t t = tc + x;
                    sk[x][j] = load(p.k, tok(p.k, q.batch, t, h, j));
                    sv[x][j] = load(p.v, tok(p.v, q.batch, t, h, j));
                    float ddw;
                    sd[x][j] = elem::decay_of(p.form, load(p.w, tok(p.w, q.batch, t, h, j)), &ddw);
                }
                __syncthreads();
                for (int x = 0; x < kBC; ++x) {
                    const float dj = sd[x][j], kj = sk[x][j];
#pragma unroll
                    for (int i = 0; i < N; ++i) S[i] = fmaf(S[i], dj, sv[x][i] * kj);
                }
            }
            float* c = ck + (size_t)(g + 1) * N2;
#pragma unroll
            for (int i = 0; i < N; ++i) c[i * N + j] = S[i];
        }
    }

    /* B. segments in reverse */
    float dS[N];
    if (p.dstate_out.data) {
        const float* sp = reinterpret_cast<const float*>(p.dstate_out.data);
#pragma unroll
        for (int i = 0; i < N; ++i) dS[i] = sp[st_off(p.dstate_out, q.s, h, i, j)];
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) dS[i] = 0.0f;
    }
    float du_acc = 0.0f;
    for (int64_t g = nseg - 1; g >= 0; --g) {
        const int64_t ts = q.t0 + g * K;
        const int m = (int)min64(K, q.t1 - ts);
        const float* start = ck + (size_t)g * N2;
        /* replay: rep[x] = the state after token ts + x, x < m - 1 */
        for (int c0 = 0; c0 + 1 < m; c0 += kBC) {
            const int n = min(kBC, m - 1 - c0);
            __syncthreads();
            for (int x = 0; x < n; ++x) {
                const int64_t t = ts + c0 + x;
                sk[x][j] = load(p.k, tok(p.k, q.batch, t, h, j));
                sv[x][j] = load(p.v, tok(p.v, q.batch, t, h, j));
                float ddw;
                sd[x][j] = elem::decay_of(p.form, load(p.w, tok(p.w, q.batch, t, h, j)), &ddw);
            }
            __syncthreads();
            for (int x = 0; x < n; ++x) {
                const int qq = c0 + x;
                const float* src = qq == 0 ? start : rep + (size_t)(qq - 1) * N2;
                float* dst = rep + (size_t)qq * N2;
                const float dj = sd[x][j], kj = sk[x][j];
#pragma unroll 16
                for (int i = 0; i < N; ++i) dst[i * N + j] = fmaf(src[i * N + j], dj, sv[x][i] * kj);
            }
        }
        /* sweep */
        for (int c0 = ((m - 1) / kBC) * kBC; c0 >= 0; c0 -= kBC) {
            const int n = min(kBC, m - c0);
            __syncthreads();
            for (int x = 0; x < n; ++x) {
                const int64_t t = ts + c0 + x;
                sr[x][j] = load(p.r, tok(p.r, q.batch, t, h, j));
                sk[x][j] = load(p.k, tok(p.k, q.batch, t, h, j));
                sv[x][j] = load(p.v, tok(p.v, q.batch, t, h, j));
                sdy[x][j] = load(p.dy, tok(p.dy, q.batch, t, h, j));
                float ddw;
                sd[x][j] = elem::decay_of(p.form, load(p.w, tok(p.w, q.batch, t, h, j)), &ddw);
                sg[x][j] = ddw;
            }
            __syncthreads();
            if (j < n) {
                float a = 0.0f, b = 0.0f;
                for (int l = 0; l < N; ++l) {
                    a = fmaf(sr[j][l] * su[l], sk[j][l], a);
                    b = fmaf(sdy[j][l], sv[j][l], b);
                }
                sruk[j] = a;
                sdyv[j] = b;
            }
            for (int x = n - 1; x >= 0; --x) {
                const int qq = c0 + x;
                const int64_t t = ts + qq;
                const float* Sp = qq == 0 ? start : rep + (size_t)(qq - 1) * N2;
                const float rj = sr[x][j], kj = sk[x][j], dj = sd[x][j], uj = su[j];
                float dk = 0.0f, dd = 0.0f, dr = 0.0f;
#pragma unroll
                for (int c2 = 0; c2 < N / kRC; ++c2) {
#pragma unroll
                    for (int ii = 0; ii < kRC; ++ii) {
                        const int i = c2 * kRC + ii;
                        const float gg = dS[i], pv = Sp[i * N + j];
                        dk = fmaf(gg, sv[x][i], dk);
                        dd = fmaf(gg, pv, dd);
                        dr = fmaf(pv, sdy[x][i], dr);
                        sP[ii][j] = gg * kj;
                        dS[i] = fmaf(gg, dj, sdy[x][i] * rj);
                    }
                    __syncthreads(); /* also publishes sruk / sdyv on the first pass */
                    {
                        const int r = j & 31, pp = j >> 5;
                        float a = 0.0f;
#pragma unroll 8
                        for (int cc = 0; cc < 32; ++cc) a += sP[r][pp * 32 + cc];
                        sQ[c2][pp][r] = a;
                    }
                    __syncthreads();
                }
                const float dyv = sdyv[x], ruk = sruk[x];
                float dv = 0.0f;
#pragma unroll
                for (int pp = 0; pp < NP; ++pp) dv += sQ[j >> 5][pp][j & 31];
                dv = fmaf(sdy[x][j], ruk, dv);
                dr = fmaf(uj * kj, dyv, dr);
                dk = fmaf(rj * uj, dyv, dk);
                du_acc = fmaf(rj * kj, dyv, du_acc);
                store(p.dr, tok(p.dr, q.batch, t, h, j), dr);
                store(p.dw, tok(p.dw, q.batch, t, h, j), dd * sg[x][j]);
                store(p.dk, tok(p.dk, q.batch, t, h, j), dk);
                store(p.dv, tok(p.dv, q.batch, t, h, j), dv);
            }
        }
    }
    if (p.dstate_in.data) {
        float* sp = reinterpret_cast<float*>(p.dstate_in.data);
#pragma unroll
        for (int i = 0; i < N; ++i) sp[st_off(p.dstate_in, q.s, h, i, j)] = dS[i];
    }
    p.part[((size_t)q.s * (size_t)H + (size_t)h) * N + j] = du_acc;
}

__global__ void rwkv6_reduce_kernel(const float* part, DevView du, int64_t S, int32_t H, int32_t N) {
    const int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= (int64_t)H * N) return;
    const int64_t h = x / N, j = x % N;
    float a = 0.0f;
    for (int64_t s = 0; s < S; ++s) a += part[(s * H + h) * N + j];
    store(du, h * du.s[2] + j * du.s[3], a);
}

template <int N>
int launch_fwd(const Rwkv6FwdParams& p, int64_t blocks, cudaStream_t s) {
    rwkv6_forward_kernel<N><<<(unsigned)blocks, N, 0, s>>>(p);
    return (int)cudaGetLastError();
}
template <int N>
int launch_bwd(const Rwkv6BwdParams& p, int64_t blocks, cudaStream_t s) {
    rwkv6_backward_kernel<N><<<(unsigned)blocks, N, 0, s>>>(p);
    return (int)cudaGetLastError();
}

} // namespace

int rwkv6_launch_forward(int N, const Rwkv6FwdParams& p, int64_t blocks, void* stream) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    switch (N) {
    case 32: return launch_fwd<32>(p, blocks, s);
    case 64: return launch_fwd<64>(p, blocks, s);
    case 128: return launch_fwd<128>(p, blocks, s);
    default: return (int)cudaErrorInvalidValue;
    }
}

int rwkv6_launch_backward(int N, const Rwkv6BwdParams& p, int64_t blocks, void* stream) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    switch (N) {
    case 32: return launch_bwd<32>(p, blocks, s);
    case 64: return launch_bwd<64>(p, blocks, s);
    case 128: return launch_bwd<128>(p, blocks, s);
    default: return (int)cudaErrorInvalidValue;
    }
}

int rwkv6_launch_reduce(int N, const float* part, DevView du, int64_t S, int32_t H, void* stream) {
    const int64_t n = (int64_t)H * N;
    rwkv6_reduce_kernel<<<(unsigned)((n + 127) / 128), 128, 0, static_cast<cudaStream_t>(stream)>>>(
        part, du, S, H, N);
    return (int)cudaGetLastError();
}

} // namespace wkv_cuda
