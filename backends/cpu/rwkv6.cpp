/* RWKV-6 WKV on the CPU, forward and backward. RWKV-5 is the same op with w given a T-stride of
 * 0 (the decay does not change over time): it needs no path of its own, every w is read
 * through its strides.
 *
 * Per (sequence s, head h) item, with S the N x N float32 state S[i][j] (i value row, j key
 * column) and u the head's bonus row, per token t:
 *     y[i]    = sum_j r[j] S[i][j]  +  v[i] * ruk,   ruk = sum_j r[j] u[j] k[j]   (S before)
 *     S[i][j] = S[i][j] * decay[j] + v[i] * k[j]
 * Every item is computed on its own with a fixed order of operations, so results do not depend
 * on the thread count or on how parallel_for splits the work.
 *
 * ------------------------------------------------------------------------------ BACKWARD
 * Checkpoint + replay; the decay is never divided by. K = kRwkv6CheckpointInterval = 32.
 * For an item whose sequence has L tokens, split into G = ceil(L / K) segments of K tokens
 * (the last may be shorter):
 *   1. run the forward once, storing the state before each segment: checkpoints C_0..C_{G-1}
 *      (C_0 = state_in or zeros);
 *   2. for g = G-1 down to 0: replay segment g (m <= K tokens) from C_g, storing the m-1 states
 *      S_{t-1} of its tokens after the first in the chunk's replay scratch, then walk t backward
 *      through the segment with dS (the gradient w.r.t. S_t, the state after token t, starting
 *      from dstate_out or zero), Sp = S_{t-1}:
 *        dyv      = sum_i dy[i] v[i]                ruk = sum_j r[j] u[j] k[j]
 *        dr[j]    = sum_i Sp[i][j] dy[i]  +  u[j] k[j] dyv
 *        dk[j]    = sum_i dS[i][j] v[i]   +  r[j] u[j] dyv
 *        dv[i]    = sum_j dS[i][j] k[j]   +  dy[i] ruk
 *        du[j]   += r[j] k[j] dyv                  (the item's partial sum, over its tokens)
 *        dd[j]    = sum_i dS[i][j] Sp[i][j]        dw[j] = dd[j] * (d decay / d w)(w[j])
 *        dS[i][j] = dS[i][j] decay[j] + dy[i] r[j]   (now the gradient w.r.t. S_{t-1})
 *   3. dstate_in = dS; the item's du partial goes to the workspace.
 *   4. after every item: du[h] = sum over s = 0, 1, ..., num_seqs-1 of the partials of (s, h),
 *      in that order (deterministic).
 *
 * WORKSPACE (bytes), all from the problem and the context's num_threads:
 *   N2     = N * N
 *   items  = num_seqs * H
 *   G      = sum over sequences s of ceil(L_s / K)          (unpacked: B * ceil(T / K))
 *   R      = min(K, max_s L_s) - 1, or 0 if that is < 0     (replay states per chunk)
 *   chunks = min(items, 4 * max(1, num_threads))            (see cpu_internal.h)
 *   workspace = 64                                          (to align the base to 64 bytes)
 *             + A64(8 * (num_seqs + 1))      if packed, else 0   (segment prefix sums)
 *             + A64(4 * H * G * N2)                              (checkpoints)
 *             + A64(4 * items * N)                               (du partials)
 *             + chunks * A64(4 * ((R + 1) * N2 + 14 * N))        (replay states, dS, 14 rows)
 *   where A64(x) rounds x up to a multiple of 64. Computed in checked 64-bit arithmetic;
 *   WKV_ERROR_OVERFLOW if it does not fit in size_t. (The layout, shared by every op, is
 *   op_common.h's; this file gives the sizes.)
 *   E.g. B=1 T=4096 H=32 N=64: 64 MiB of checkpoints + 8 KiB of du partials + chunks x 516 KiB.
 *
 * The forward allocates chunks * A64(4 * (2 * N2 + 7 * N)) bytes of its own scratch (malloc)
 * before it writes anything, so an allocation failure leaves every output untouched. This is the
 * portable scalar path; the vector paths (isa.h) run rwkv6_simd.inl's forward, and its backward
 * where N is a multiple of the vector width (items of up to 4 heads, a workspace of its own,
 * given there; the du partials and the checkpoints are this file's), this file's otherwise. */
#include "rwkv6.h"

#include <cstdint>
#include <cstring>

#include "op_common.h"
#include "tensor_access.h"

namespace wkv_cpu {
namespace {

constexpr int64_t K = kRwkv6CheckpointInterval;
constexpr int64_t kForwardRows = 7;   /* r w k v u decay y */
constexpr int64_t kBackwardRows = 14; /* r w k v u decay ddw dy dr dw dk dv dd du */

/* Inner loops run over j in blocks of kLanes with lanes_sum() (op_common.h). */

/* sum_j a[j] b[j] */
inline float dot2(const float* __restrict a, const float* __restrict b, int64_t n) noexcept {
    float acc[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes)
        for (int64_t l = 0; l < kLanes; ++l) acc[l] += a[j + l] * b[j + l];
    for (int64_t l = 0; j < n; ++j, ++l) acc[l] += a[j] * b[j];
    return lanes_sum(acc);
}

/* sum_j a[j] b[j] c[j] */
inline float dot3(const float* __restrict a, const float* __restrict b,
                  const float* __restrict c, int64_t n) noexcept {
    float acc[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes)
        for (int64_t l = 0; l < kLanes; ++l) acc[l] += a[j + l] * b[j + l] * c[j + l];
    for (int64_t l = 0; j < n; ++j, ++l) acc[l] += a[j] * b[j] * c[j];
    return lanes_sum(acc);
}

/* One forward step, src -> dst (distinct matrices). y may be NULL (then r and ruk are unused):
 *   y[i] = src[i] . r + v[i] ruk;   dst[i][j] = src[i][j] decay[j] + v[i] k[j] */
void step(const float* __restrict src, float* __restrict dst, int64_t N,
          const float* __restrict decay, const float* __restrict k, const float* __restrict v,
          const float* __restrict r, float ruk, float* __restrict y) noexcept {
    for (int64_t i = 0; i < N; ++i) {
        const float* __restrict s = src + i * N;
        float* __restrict d = dst + i * N;
        const float vi = v[i];
        if (y) {
            float acc[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
            int64_t j = 0;
            for (; j + kLanes <= N; j += kLanes)
                for (int64_t l = 0; l < kLanes; ++l) {
                    const float x = s[j + l];
                    acc[l] += x * r[j + l];
                    d[j + l] = x * decay[j + l] + vi * k[j + l];
                }
            for (int64_t l = 0; j < N; ++j, ++l) {
                const float x = s[j];
                acc[l] += x * r[j];
                d[j] = x * decay[j] + vi * k[j];
            }
            y[i] = lanes_sum(acc) + vi * ruk;
        } else {
            int64_t j = 0;
            for (; j + kLanes <= N; j += kLanes)
                for (int64_t l = 0; l < kLanes; ++l) d[j + l] = s[j + l] * decay[j + l] + vi * k[j + l];
            for (; j < N; ++j) d[j] = s[j] * decay[j] + vi * k[j];
        }
    }
}

/* One backward step. On entry dS is the gradient w.r.t. S_t, on exit w.r.t. S_{t-1} (Sp).
 * Writes dr dk dv and dd = d loss / d decay, and adds the token's share to du_acc (see the top
 * of the file). All pointers are distinct arrays. */
void backward_step(float* __restrict dS, const float* __restrict Sp, int64_t N,
                   const float* __restrict r, const float* __restrict k,
                   const float* __restrict v, const float* __restrict u,
                   const float* __restrict decay, const float* __restrict dy,
                   float* __restrict dr, float* __restrict dk, float* __restrict dv,
                   float* __restrict dd, float* __restrict du_acc) noexcept {
    const float dyv = dot2(dy, v, N);
    const float ruk = dot3(r, u, k, N);
    for (int64_t j = 0; j < N; ++j) {
        dr[j] = 0.0f;
        dk[j] = 0.0f;
        dd[j] = 0.0f;
    }
    for (int64_t i = 0; i < N; ++i) {
        float* __restrict g = dS + i * N;
        const float* __restrict sp = Sp + i * N;
        const float dyi = dy[i], vi = v[i];
        /* dv[i] = g . k;  dk += g v[i];  dd += g Sp[i];  dr += Sp[i] dy[i];
         * g = g decay + dy[i] r */
        float acc[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t j = 0;
        for (; j + kLanes <= N; j += kLanes)
            for (int64_t l = 0; l < kLanes; ++l) {
                const float gj = g[j + l], pj = sp[j + l];
                acc[l] += gj * k[j + l];
                dk[j + l] += gj * vi;
                dd[j + l] += gj * pj;
                dr[j + l] += pj * dyi;
                g[j + l] = gj * decay[j + l] + dyi * r[j + l];
            }
        for (int64_t l = 0; j < N; ++j, ++l) {
            const float gj = g[j], pj = sp[j];
            acc[l] += gj * k[j];
            dk[j] += gj * vi;
            dd[j] += gj * pj;
            dr[j] += pj * dyi;
            g[j] = gj * decay[j] + dyi * r[j];
        }
        dv[i] = lanes_sum(acc) + dyi * ruk;
    }
    for (int64_t j = 0; j < N; ++j) {
        const float ud = u[j] * dyv;
        dr[j] += k[j] * ud;
        dk[j] += r[j] * ud;
        du_acc[j] += r[j] * k[j] * dyv;
    }
}

/* The per-token input rows are r w k v at rows[0 .. 4N), u (the head's, not a token row) at
 * rows[4N ..) and decay at rows[5N ..): carve_head_rows(rows, N, 5), loaded by
 * load_head_rows() (op_common.h). */

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

    float* S = scratch; /* the state, ping-ponging between S and S2 */
    float* S2 = S + N * N;
    float* rows = S2 + N * N;
    const HeadRows x = carve_head_rows(rows, N, 5);
    float* u = rows + 4 * N;
    float* y = rows + 6 * N;

    /* Read the whole state first: state_out may be the same memory. */
    load_state(p->state_in, s, h, N, S);
    load_token(p->u, 0, 0, h, N, u);
    /* save: the backward's checkpoints ck[g] = the state before token t0 + g K */
    const size_t n2 = (size_t)N * (size_t)N;
    float* ck = save && t1 > t0 ? save->ckpt + ((size_t)save->first_segment(s) * (size_t)H +
                                                (size_t)h * (size_t)segment_count(t1 - t0, K)) * n2
                                : nullptr;
    if (ck) std::memcpy(ck, S, n2 * sizeof(float));
    const bool want_y = view_present(p->y);
    for (int64_t t = t0; t < t1; ++t) {
        load_head_rows(p, batch, t, h, want_y, x, nullptr);
        const float ruk = want_y ? dot3(x.r, u, x.k, N) : 0.0f;
        step(S, S2, N, x.decay, x.k, x.v, x.r, ruk, want_y ? y : nullptr);
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

/* The backward regions (see the top of the file): R = min(K, max_s L_s) - 1 replay states
 * (0 if that is < 0), H * G checkpoints, items * N du partials, and per chunk dS, the R replay
 * states and kBackwardRows rows. */
BackwardSizes backward_sizes(const wkv_problem* p, const BackwardShape& shape, CheckedSize& c) {
    const uint64_t N = (uint64_t)p->N, H = (uint64_t)p->H;
    const int64_t max_len = shape.max_len;
    BackwardSizes z;
    z.replay_states = max_len < 1 ? 0 : (max_len < K ? max_len : K) - 1;
    z.ckpt_floats = matrices_and_rows(p, c.mul(H, shape.segments), 0, c);
    z.part_floats = c.mul(shape.items, N);
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
    const HeadRows x = carve_head_rows(rows, N, 5);
    float* u = rows + 4 * N;
    float* ddw = rows + 6 * N;
    float* dy = rows + 7 * N;
    float* dr = rows + 8 * N;
    float* dw = rows + 9 * N;
    float* dk = rows + 10 * N;
    float* dv = rows + 11 * N;
    float* dd = rows + 12 * N;
    float* du_acc = job->part + (size_t)item * (size_t)N;

    for (int64_t j = 0; j < N; ++j) du_acc[j] = 0.0f;
    if (len == 0) { /* nothing flows through but the state gradient */
        if (view_present(p->dstate_in)) {
            load_state(p->dstate_out, s, h, N, dS);
            store_state(p->dstate_in, s, h, N, dS);
        }
        return;
    }
    load_token(p->u, 0, 0, h, N, u);

    const int64_t nseg = segment_count(len, K);
    const int64_t seg0 = job->first_segment(s);
    float* ck = job->ckpt + ((size_t)seg0 * (size_t)H + (size_t)h * (size_t)nseg) * n2;

    /* Runs the m >= 1 tokens from ts on from state `start`, storing the state after token
     * ts + q in replay[q] for q < m - 1, and the state after the last token in `last` (when
     * not NULL; else it is not computed). */
    auto run_tokens = [&](int64_t ts, int64_t m, const float* start, float* last) {
        const int64_t steps = last ? m : m - 1;
        for (int64_t q = 0; q < steps; ++q) {
            load_head_rows(p, batch, ts + q, h, false, x, nullptr);
            const float* src = q == 0 ? start : replay + (size_t)(q - 1) * n2;
            float* dst = q == m - 1 ? last : replay + (size_t)q * n2;
            step(src, dst, N, x.decay, x.k, x.v, nullptr, 0.0f, nullptr);
        }
    };

    /* 1. checkpoints: ck[g] = the state before token t0 + g * K. (nseg > 1 means len > K, so
     *    the replay scratch holds K - 1 states.) */
    if (!p->reuse_checkpoints) { /* else the forward saved them (saves() below) */
        load_state(p->state_in, s, h, N, ck);
        for (int64_t g = 0; g + 1 < nseg; ++g)
            run_tokens(t0 + g * K, K, ck + (size_t)g * n2, ck + (size_t)(g + 1) * n2);
    }

    /* 2. segments in reverse: replay, then sweep backward */
    load_state(p->dstate_out, s, h, N, dS);
    for (int64_t g = nseg - 1; g >= 0; --g) {
        const int64_t ts = t0 + g * K;
        const int64_t m = t1 - ts < K ? t1 - ts : K;
        const float* start = ck + (size_t)g * n2;
        run_tokens(ts, m, start, nullptr);
        for (int64_t q = m - 1; q >= 0; --q) {
            const int64_t t = ts + q;
            const float* Sp = q == 0 ? start : replay + (size_t)(q - 1) * n2; /* S_{t-1} */
            load_head_rows(p, batch, t, h, true, x, ddw);
            load_token(p->dy, batch, t, h, N, dy);
            backward_step(dS, Sp, N, x.r, x.k, x.v, u, x.decay, dy, dr, dk, dv, dd, du_acc);
            for (int64_t j = 0; j < N; ++j) dw[j] = dd[j] * ddw[j];

            store_token(p->dr, batch, t, h, N, dr);
            store_token(p->dw, batch, t, h, N, dw);
            store_token(p->dk, batch, t, h, N, dk);
            store_token(p->dv, batch, t, h, N, dv);
        }
    }

    /* 3. */
    store_state(p->dstate_in, s, h, N, dS);
}

/* 4. du[h] = the partials of (0, h), (1, h), ... summed in that order into (0, h). */
void backward_reduce(const BackwardJob* job) {
    const wkv_problem* p = job->p;
    const int64_t H = p->H, N = p->N;
    for (int64_t h = 0; h < H; ++h) {
        float* acc = job->part + (size_t)h * (size_t)N;
        for (int64_t s = 1; s < p->num_seqs; ++s) {
            const float* part = job->part + ((size_t)s * (size_t)H + (size_t)h) * (size_t)N;
            for (int64_t j = 0; j < N; ++j) acc[j] += part[j];
        }
        store_token(p->du, 0, 0, h, N, acc);
    }
}

/* The forward's state sequence is the checkpoint pass's (the same step on the same values). */
bool saves(const wkv_problem*) { return true; }

} // namespace

const OpDesc kRwkv6Op = {
    "RWKV-6", K, /* by_channel */ false, check_decay_form, items_per_head, forward_chunk_floats,
    forward_item, backward_sizes, backward_item, backward_reduce,
    /* forward_group: 1 */ nullptr, /* backward_group: 1 */ nullptr, saves,
};

} // namespace wkv_cpu
