/* RWKV-7 WKV on the CPU, forward and backward.
 *
 * Per (sequence s, head h) item, with S the N x N float32 state S[i][j] (i value row, j key
 * column), per token t:
 *     sa[i]   = sum_l S[i][l] * a[l]                         (S before the update)
 *     S[i][j] = S[i][j] * decay[j] + sa[i] * b[j] + v[i] * k[j]
 *     y[i]    = sum_j S[i][j] * r[j]                         (S after the update)
 * Every item is computed on its own with a fixed order of operations, so results do not depend
 * on the thread count or on how parallel_for splits the work.
 *
 * ------------------------------------------------------------------------------ BACKWARD
 * Checkpoint + replay; the decay is never divided by. K = kRwkv7CheckpointInterval = 32.
 * For an item whose sequence has L tokens, split into G = ceil(L / K) segments of K tokens
 * (the last may be shorter):
 *   1. run the forward once, storing the state before each segment: checkpoints C_0..C_{G-1}
 *      (C_0 = state_in or zeros);
 *   2. for g = G-1 down to 0: replay segment g from C_g, storing its m <= K per-step states
 *      S_t in the chunk's replay scratch, then walk t backward through the segment with dS
 *      (the gradient w.r.t. S_t, starting from dstate_out or zero):
 *        dS      += dy_t r_t^T
 *        dr[j]    = sum_i S_t[i][j] dy[i]          dv[i] = sum_j dS[i][j] k[j]
 *        dk[j]    = sum_i dS[i][j] v[i]            sa[i] = sum_l S_{t-1}[i][l] a[l]
 *        dsa[i]   = sum_j dS[i][j] b[j]            db[j] = sum_i dS[i][j] sa[i]
 *        da[l]    = sum_i S_{t-1}[i][l] dsa[i]     dd[j] = sum_i dS[i][j] S_{t-1}[i][j]
 *        dw[j]    = dd[j] * (d decay / d w)(w[j])  (for the decay form as given)
 *        dS[i][j] = dS[i][j] decay[j] + dsa[i] a[j]           (now the gradient w.r.t. S_{t-1})
 *   3. dstate_in = dS.
 *
 * WORKSPACE (bytes), all from the problem and the context's num_threads:
 *   N2     = N * N
 *   items  = num_seqs * H
 *   G      = sum over sequences s of ceil(L_s / K)          (unpacked: B * ceil(T / K))
 *   R      = min(K, max_s L_s)                              (replay states per chunk)
 *   chunks = min(items, 4 * max(1, num_threads))            (see cpu_internal.h)
 *   workspace = 64                                          (to align the base to 64 bytes)
 *             + A64(8 * (num_seqs + 1))      if packed, else 0   (segment prefix sums)
 *             + A64(4 * H * G * N2)                              (checkpoints)
 *             + chunks * A64(4 * ((R + 1) * N2 + 16 * N))        (replay states, dS, 16 rows)
 *   where A64(x) rounds x up to a multiple of 64. Computed in checked 64-bit arithmetic;
 *   WKV_ERROR_OVERFLOW if it does not fit in size_t. (The layout, shared by every op, is
 *   op_common.h's; this file gives the sizes.)
 *   E.g. B=1 T=4096 H=32 N=64: 64 MiB of checkpoints + chunks x 532 KiB (1 thread: 66.1 MiB).
 *
 * The forward allocates chunks * A64(4 * (2 * N2 + 8 * N)) bytes of its own scratch (malloc)
 * before it writes anything, so an allocation failure leaves every output untouched (the context
 * keeps it for its next call: op_common.h). This is the portable scalar path; the vector paths
 * (isa.h) run rwkv7_simd.inl's forward, with this file's backward. */
#include "rwkv7.h"

#include <cstdint>
#include <cstring>

#include "op_common.h"
#include "tensor_access.h"

namespace wkv_cpu {
namespace {

constexpr int64_t K = kRwkv7CheckpointInterval;
constexpr int64_t kForwardRows = 8;  /* r w k v a b decay y */
constexpr int64_t kBackwardRows = 16; /* r w k v a b dy decay ddw dr dw dk dv da db dd */

/* Inner loops run over j in blocks of kLanes with lanes_sum() (op_common.h). */

/* One forward step, src -> dst (distinct matrices). y may be NULL:
 *   sa = src[i] . a;  dst[i][j] = src[i][j] decay[j] + sa b[j] + v[i] k[j];  y[i] = dst[i] . r */
void step(const float* __restrict src, float* __restrict dst, int64_t N,
          const float* __restrict decay, const float* __restrict k, const float* __restrict v,
          const float* __restrict a, const float* __restrict b, const float* __restrict r,
          float* __restrict y) noexcept {
    for (int64_t i = 0; i < N; ++i) {
        const float* __restrict s = src + i * N;
        float* __restrict d = dst + i * N;

        float acc[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t j = 0;
        for (; j + kLanes <= N; j += kLanes)
            for (int64_t u = 0; u < kLanes; ++u) acc[u] += s[j + u] * a[j + u];
        for (int64_t u = 0; j < N; ++j, ++u) acc[u] += s[j] * a[j];
        const float sa = lanes_sum(acc);
        const float vi = v[i];

        if (y) {
            for (int64_t u = 0; u < kLanes; ++u) acc[u] = 0.0f;
            j = 0;
            for (; j + kLanes <= N; j += kLanes)
                for (int64_t u = 0; u < kLanes; ++u) {
                    const float x = s[j + u] * decay[j + u] + sa * b[j + u] + vi * k[j + u];
                    d[j + u] = x;
                    acc[u] += x * r[j + u];
                }
            for (int64_t u = 0; j < N; ++j, ++u) {
                const float x = s[j] * decay[j] + sa * b[j] + vi * k[j];
                d[j] = x;
                acc[u] += x * r[j];
            }
            y[i] = lanes_sum(acc);
        } else {
            j = 0;
            for (; j + kLanes <= N; j += kLanes)
                for (int64_t u = 0; u < kLanes; ++u)
                    d[j + u] = s[j + u] * decay[j + u] + sa * b[j + u] + vi * k[j + u];
            for (; j < N; ++j) d[j] = s[j] * decay[j] + sa * b[j] + vi * k[j];
        }
    }
}

/* One backward step. On entry dS is the gradient w.r.t. S_t (St), on exit w.r.t. S_{t-1} (Sp).
 * Writes dr dk dv da db and dd = d loss / d decay (see the top of the file). All pointers are
 * distinct arrays (restrict parameters, so that the compiler vectorizes without alias checks). */
void backward_step(float* __restrict dS, const float* __restrict St, const float* __restrict Sp,
                   int64_t N, const float* __restrict r, const float* __restrict k,
                   const float* __restrict v, const float* __restrict a,
                   const float* __restrict b, const float* __restrict decay,
                   const float* __restrict dy, float* __restrict dr, float* __restrict dk,
                   float* __restrict dv, float* __restrict da, float* __restrict db,
                   float* __restrict dd) noexcept {
    for (int64_t j = 0; j < N; ++j) {
        dr[j] = 0.0f;
        dk[j] = 0.0f;
        da[j] = 0.0f;
        db[j] = 0.0f;
        dd[j] = 0.0f;
    }
    for (int64_t i = 0; i < N; ++i) {
        float* __restrict g = dS + i * N;
        const float* __restrict st = St + i * N;
        const float* __restrict sp = Sp + i * N;
        const float dyi = dy[i], vi = v[i];

        /* g += dy[i] r;  dr += St[i] dy[i];  dv[i] = g . k;  sa = Sp[i] . a;  dsa = g . b */
        float acc_k[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
        float acc_a[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
        float acc_b[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t j = 0;
        for (; j + kLanes <= N; j += kLanes)
            for (int64_t u = 0; u < kLanes; ++u) {
                const float gj = g[j + u] + dyi * r[j + u];
                g[j + u] = gj;
                dr[j + u] += st[j + u] * dyi;
                acc_k[u] += gj * k[j + u];
                acc_a[u] += sp[j + u] * a[j + u];
                acc_b[u] += gj * b[j + u];
            }
        for (int64_t u = 0; j < N; ++j, ++u) {
            const float gj = g[j] + dyi * r[j];
            g[j] = gj;
            dr[j] += st[j] * dyi;
            acc_k[u] += gj * k[j];
            acc_a[u] += sp[j] * a[j];
            acc_b[u] += gj * b[j];
        }
        dv[i] = lanes_sum(acc_k);
        const float sa = lanes_sum(acc_a);
        const float dsa = lanes_sum(acc_b);

        /* dk += g v[i];  db += g sa;  da += Sp[i] dsa;  dd += g Sp[i];  g = g decay + dsa a */
        j = 0;
        for (; j + kLanes <= N; j += kLanes)
            for (int64_t u = 0; u < kLanes; ++u) {
                const float gj = g[j + u], pj = sp[j + u];
                dk[j + u] += gj * vi;
                db[j + u] += gj * sa;
                da[j + u] += pj * dsa;
                dd[j + u] += gj * pj;
                g[j + u] = gj * decay[j + u] + dsa * a[j + u];
            }
        for (; j < N; ++j) {
            const float gj = g[j], pj = sp[j];
            dk[j] += gj * vi;
            db[j] += gj * sa;
            da[j] += pj * dsa;
            dd[j] += gj * pj;
            g[j] = gj * decay[j] + dsa * a[j];
        }
    }
}

/* Per-token input rows: r w k v decay (op_common.h) and a b. */
struct TokenRows : HeadRows {
    float *a, *b;
};

/* The input rows at rows[0 .. 7N): r w k v a b decay. */
inline TokenRows carve_rows(float* rows, int64_t N) noexcept {
    TokenRows x;
    static_cast<HeadRows&>(x) = carve_head_rows(rows, N, 6);
    x.a = rows + 4 * N;
    x.b = rows + 5 * N;
    return x;
}

/* Loads w k v a b (and r when `with_r`) of token (batch, t, h) and computes decay (and ddw). */
inline void load_inputs(const wkv_problem* p, int64_t batch, int64_t t, int64_t h, bool with_r,
                        const TokenRows& x, float* ddw) noexcept {
    load_head_rows(p, batch, t, h, with_r, x, ddw);
    load_token(p->a, batch, t, h, p->N, x.a);
    load_token(p->b, batch, t, h, p->N, x.b);
}

/* --------------------------------------------------------------------------------- forward */

/* Forward scratch per chunk: the state twice (ping-pong) and kForwardRows rows. */
uint64_t forward_chunk_floats(const wkv_problem* p, int64_t /* group: 1 */,
                              CheckedSize& c) {
    return matrices_and_rows(p, 2, kForwardRows, c);
}

void forward_item(const wkv_problem* p, int64_t /* group: 1 */, int64_t item,
                  float* scratch, const BackwardJob* save) noexcept {
    const int64_t H = p->H, N = p->N;
    const int64_t s = item / H, h = item % H;
    int64_t batch, t0, t1;
    wkv_problem_sequence(p, s, &batch, &t0, &t1);

    float* S = scratch;       /* the state, ping-ponging between S and S2 */
    float* S2 = S + N * N;
    float* rows = S2 + N * N;
    const TokenRows x = carve_rows(rows, N);
    float* y = rows + 7 * N;

    /* Read the whole state first: state_out may be the same memory. */
    load_state(p->state_in, s, h, N, S);
    /* save: the backward's checkpoints ck[g] = the state before token t0 + g K */
    const size_t n2 = (size_t)N * (size_t)N;
    float* ck = save && t1 > t0 ? save->ckpt + ((size_t)save->first_segment(s) * (size_t)H +
                                                (size_t)h * (size_t)segment_count(t1 - t0, K)) * n2
                                : nullptr;
    if (ck) std::memcpy(ck, S, n2 * sizeof(float));
    const bool want_y = view_present(p->y);
    for (int64_t t = t0; t < t1; ++t) {
        load_inputs(p, batch, t, h, want_y, x, nullptr);
        step(S, S2, N, x.decay, x.k, x.v, x.a, x.b, x.r, want_y ? y : nullptr);
        if (want_y) store_token(p->y, batch, t, h, N, y);
        float* tmp = S;
        S = S2;
        S2 = tmp;
        if (ck && (t + 1 - t0) % K == 0 && t + 1 < t1)
            std::memcpy(ck + (size_t)((t + 1 - t0) / K) * n2, S, n2 * sizeof(float));
    }
    store_state(p->state_out, s, h, N, S);
}

/* -------------------------------------------------------------------------------- backward */

/* The backward regions (see the top of the file): R = min(K, max_s L_s) replay states, H * G
 * checkpoints, and per chunk dS, the R replay states and kBackwardRows rows. */
BackwardSizes backward_sizes(const wkv_problem* p, const BackwardShape& shape, CheckedSize& c) {
    BackwardSizes z;
    z.replay_states = shape.max_len < K ? shape.max_len : K;
    z.ckpt_floats = matrices_and_rows(p, c.mul((uint64_t)p->H, shape.segments), 0, c);
    z.chunk_floats = matrices_and_rows(p, (uint64_t)z.replay_states + 1, kBackwardRows, c);
    return z;
}

void backward_item(const BackwardJob* job, int64_t item, float* scratch) noexcept {
    const wkv_problem* p = job->p;
    const int64_t H = p->H, N = p->N;
    const size_t n2 = (size_t)N * (size_t)N;
    const int64_t s = item / H, h = item % H;
    int64_t batch, t0, t1;
    wkv_problem_sequence(p, s, &batch, &t0, &t1);
    const int64_t len = t1 - t0;

    float* dS = scratch;
    float* replay = dS + n2; /* replay_states matrices */
    float* rows = replay + (size_t)job->layout.replay_states * n2;
    const TokenRows x = carve_rows(rows, N);
    float* dy = rows + 7 * N;
    float* ddw = rows + 8 * N;
    float* dr = rows + 9 * N;
    float* dw = rows + 10 * N;
    float* dk = rows + 11 * N;
    float* dv = rows + 12 * N;
    float* da = rows + 13 * N;
    float* db = rows + 14 * N;
    float* dd = rows + 15 * N;

    if (len == 0) { /* nothing flows through but the state gradient */
        if (view_present(p->dstate_in)) {
            load_state(p->dstate_out, s, h, N, dS);
            store_state(p->dstate_in, s, h, N, dS);
        }
        return;
    }

    const int64_t nseg = segment_count(len, K);
    const int64_t seg0 = job->first_segment(s);
    float* ck = job->ckpt + ((size_t)seg0 * (size_t)H + (size_t)h * (size_t)nseg) * n2;

    /* Runs the m tokens from ts on from state `start`, storing S_{ts+u} in replay[u]. */
    auto run_segment = [&](int64_t ts, int64_t m, const float* start) {
        for (int64_t u = 0; u < m; ++u) {
            load_inputs(p, batch, ts + u, h, false, x, nullptr);
            step(u == 0 ? start : replay + (size_t)(u - 1) * n2, replay + (size_t)u * n2, N,
                 x.decay, x.k, x.v, x.a, x.b, nullptr, nullptr);
        }
    };

    /* 1. checkpoints: ck[g] = the state before token t0 + g * K. (nseg > 1 means len > K,
     *    so the replay scratch holds K states.) */
    if (!p->reuse_checkpoints) { /* else the forward saved them (saves() below) */
        load_state(p->state_in, s, h, N, ck);
        for (int64_t g = 0; g + 1 < nseg; ++g) {
            run_segment(t0 + g * K, K, ck + (size_t)g * n2);
            std::memcpy(ck + (size_t)(g + 1) * n2, replay + (size_t)(K - 1) * n2,
                        n2 * sizeof(float));
        }
    }

    /* 2. segments in reverse: replay, then sweep backward */
    load_state(p->dstate_out, s, h, N, dS);
    for (int64_t g = nseg - 1; g >= 0; --g) {
        const int64_t ts = t0 + g * K;
        const int64_t m = t1 - ts < K ? t1 - ts : K;
        const float* start = ck + (size_t)g * n2;
        run_segment(ts, m, start);
        for (int64_t u = m - 1; u >= 0; --u) {
            const int64_t t = ts + u;
            const float* St = replay + (size_t)u * n2;                        /* S_t */
            const float* Sp = u == 0 ? start : replay + (size_t)(u - 1) * n2; /* S_{t-1} */
            load_inputs(p, batch, t, h, true, x, ddw);
            load_token(p->dy, batch, t, h, N, dy);
            backward_step(dS, St, Sp, N, x.r, x.k, x.v, x.a, x.b, x.decay, dy, dr, dk, dv, da,
                          db, dd);
            for (int64_t j = 0; j < N; ++j) dw[j] = dd[j] * ddw[j];

            store_token(p->dr, batch, t, h, N, dr);
            store_token(p->dw, batch, t, h, N, dw);
            store_token(p->dk, batch, t, h, N, dk);
            store_token(p->dv, batch, t, h, N, dv);
            store_token(p->da, batch, t, h, N, da);
            store_token(p->db, batch, t, h, N, db);
        }
    }

    /* 3. */
    store_state(p->dstate_in, s, h, N, dS);
}

/* The forward's state sequence is the checkpoint pass's (the same step on the same values). */
bool saves(const wkv_problem*) { return true; }

} // namespace

const OpDesc kRwkv7Op = {
    "RWKV-7", K, /* by_channel */ false, check_decay_form, items_per_head, forward_chunk_floats,
    forward_item, backward_sizes, backward_item, /* backward_reduce: none */ nullptr,
    /* forward_group: 1 */ nullptr, /* backward_group: 1 */ nullptr, saves,
};

} // namespace wkv_cpu
