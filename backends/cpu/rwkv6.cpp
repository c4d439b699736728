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
 *   WKV_ERROR_OVERFLOW if it does not fit in size_t.
 *   E.g. B=1 T=4096 H=32 N=64: 64 MiB of checkpoints + 8 KiB of du partials + chunks x 516 KiB.
 *
 * The forward allocates chunks * A64(4 * (2 * N2 + 7 * N)) bytes of its own scratch (malloc)
 * before it writes anything, so an allocation failure leaves every output untouched. */
#include "rwkv6.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "tensor_access.h"

namespace wkv_cpu {
namespace {

constexpr int64_t K = kRwkv6CheckpointInterval;
constexpr uint64_t kAlign = 64;
constexpr int64_t kForwardRows = 7;   /* r w k v u decay y */
constexpr int64_t kBackwardRows = 14; /* r w k v u decay ddw dy dr dw dk dv dd du */

/* Inner loops run over j in blocks of kLanes with a scalar tail; every sum over j keeps
 * kLanes partial sums (lane l takes j = l, l + kLanes, ...; the tail continues from lane 0)
 * combined by lanes_sum(). The order is fixed by the code, not by the thread count. */
constexpr int64_t kLanes = 8;

inline float lanes_sum(const float* acc) noexcept {
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

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

/* Per-token input rows. */
struct TokenRows {
    float *r, *w, *k, *v, *decay;
};

/* Loads w k v (and r when `with_r`) of token (batch, t, h) and computes decay (and ddw). */
inline void load_inputs(const wkv_problem* p, int64_t batch, int64_t t, int64_t h, bool with_r,
                        const TokenRows& x, float* ddw) noexcept {
    const int64_t N = p->N;
    if (with_r) load_token(p->r, batch, t, h, N, x.r);
    load_token(p->w, batch, t, h, N, x.w);
    load_token(p->k, batch, t, h, N, x.k);
    load_token(p->v, batch, t, h, N, x.v);
    decay_row(p->decay_form, x.w, x.decay, ddw, N);
}

inline char* align_ptr(void* ptr) noexcept {
    const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
    return reinterpret_cast<char*>((a + (kAlign - 1)) & ~(uintptr_t)(kAlign - 1));
}

/* --------------------------------------------------------------------------------- forward */

struct ForwardJob {
    const wkv_problem* p;
    char* scratch; /* chunk c at scratch + c * chunk_bytes */
    size_t chunk_bytes;
    int64_t items, chunks;
};

void forward_item(const wkv_problem* p, int64_t item, float* scratch) noexcept {
    const int64_t H = p->H, N = p->N;
    const int64_t s = item / H, h = item % H;
    int64_t batch, t0, t1;
    wkv_problem_sequence(p, s, &batch, &t0, &t1);

    float* S = scratch; /* the state, ping-ponging between S and S2 */
    float* S2 = S + N * N;
    float* rows = S2 + N * N;
    TokenRows x;
    x.r = rows;
    x.w = rows + N;
    x.k = rows + 2 * N;
    x.v = rows + 3 * N;
    float* u = rows + 4 * N;
    x.decay = rows + 5 * N;
    float* y = rows + 6 * N;

    /* Read the whole state first: state_out may be the same memory. */
    load_state(p->state_in, s, h, N, S);
    load_token(p->u, 0, 0, h, N, u);
    const bool want_y = view_present(p->y);
    for (int64_t t = t0; t < t1; ++t) {
        load_inputs(p, batch, t, h, want_y, x, nullptr);
        const float ruk = want_y ? dot3(x.r, u, x.k, N) : 0.0f;
        step(S, S2, N, x.decay, x.k, x.v, x.r, ruk, want_y ? y : nullptr);
        if (want_y) store_token(p->y, batch, t, h, N, y);
        float* tmp = S;
        S = S2;
        S2 = tmp;
    }
    store_state(p->state_out, s, h, N, S);
}

void forward_task(void* data, int64_t begin, int64_t end) noexcept {
    const ForwardJob* job = static_cast<const ForwardJob*>(data);
    for (int64_t c = begin; c < end; ++c) {
        float* scratch = reinterpret_cast<float*>(job->scratch + (size_t)c * job->chunk_bytes);
        int64_t i0, i1;
        chunk_items(job->items, job->chunks, c, &i0, &i1);
        for (int64_t item = i0; item < i1; ++item) forward_item(job->p, item, scratch);
    }
}

/* -------------------------------------------------------------------------------- backward */

struct BackwardLayout {
    int64_t items = 0, chunks = 0;
    int64_t replay_states = 0; /* R */
    uint64_t prefix_off = 0, ckpt_off = 0, du_off = 0, chunk_off = 0; /* from the aligned base */
    uint64_t chunk_bytes = 0;
    uint64_t total = 0; /* including the alignment slack */
};

inline int64_t segments(int64_t len) noexcept { return (len + K - 1) / K; }

wkv_status plan_backward(const BackendState* st, const wkv_problem* p, BackwardLayout* out,
                         wkv_message* msg) noexcept {
    CheckedSize c;
    const uint64_t N = (uint64_t)p->N, H = (uint64_t)p->H;
    const uint64_t n2 = c.mul(N, N);
    const bool packed = p->seq_offsets != nullptr;

    uint64_t G = 0;
    int64_t max_len = 0;
    if (packed) {
        for (int64_t s = 0; s < p->num_seqs; ++s) {
            const int64_t len = p->seq_offsets[s + 1] - p->seq_offsets[s];
            G = c.add(G, (uint64_t)segments(len));
            if (len > max_len) max_len = len;
        }
    } else {
        G = c.mul((uint64_t)p->B, (uint64_t)segments(p->T));
        max_len = p->T;
    }
    const int64_t R = max_len < 1 ? 0 : (max_len < K ? max_len : K) - 1;

    BackwardLayout L;
    const uint64_t items = c.mul((uint64_t)p->num_seqs, H);
    L.items = items > (uint64_t)INT64_MAX ? 0 : (int64_t)items;
    if (items > (uint64_t)INT64_MAX) c.overflow = true;
    L.chunks = chunk_count(st, L.items);
    L.replay_states = R;

    const uint64_t prefix_bytes =
        packed ? c.align_up(c.mul(8, c.add((uint64_t)p->num_seqs, 1)), kAlign) : 0;
    const uint64_t ckpt_bytes = c.align_up(c.mul(4, c.mul(c.mul(H, G), n2)), kAlign);
    const uint64_t du_bytes = c.align_up(c.mul(4, c.mul(items, N)), kAlign);
    const uint64_t chunk_floats =
        c.add(c.mul((uint64_t)R + 1, n2), c.mul((uint64_t)kBackwardRows, N));
    L.chunk_bytes = c.align_up(c.mul(4, chunk_floats), kAlign);

    L.prefix_off = 0;
    L.ckpt_off = prefix_bytes;
    L.du_off = c.add(prefix_bytes, ckpt_bytes);
    L.chunk_off = c.add(L.du_off, du_bytes);
    L.total = c.add(c.add(kAlign, L.chunk_off), c.mul((uint64_t)L.chunks, L.chunk_bytes));
    (void)c.to_size(L.total);
    if (c.overflow) {
        set_message(msg,
                    "the RWKV-6 backward workspace for B=%lld T=%lld H=%lld N=%lld overflows "
                    "size_t",
                    (long long)p->B, (long long)p->T, (long long)p->H, (long long)p->N);
        return WKV_ERROR_OVERFLOW;
    }
    *out = L;
    return WKV_OK;
}

struct BackwardJob {
    const wkv_problem* p;
    BackwardLayout layout;
    const int64_t* seg_prefix; /* packed: first segment of each sequence; else NULL */
    float* ckpt;
    float* du_part; /* items x N */
    char* chunks;
};

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
    TokenRows x;
    x.r = rows;
    x.w = rows + N;
    x.k = rows + 2 * N;
    x.v = rows + 3 * N;
    float* u = rows + 4 * N;
    x.decay = rows + 5 * N;
    float* ddw = rows + 6 * N;
    float* dy = rows + 7 * N;
    float* dr = rows + 8 * N;
    float* dw = rows + 9 * N;
    float* dk = rows + 10 * N;
    float* dv = rows + 11 * N;
    float* dd = rows + 12 * N;
    float* du_acc = job->du_part + (size_t)item * (size_t)N;

    for (int64_t j = 0; j < N; ++j) du_acc[j] = 0.0f;
    if (len == 0) { /* nothing flows through but the state gradient */
        if (view_present(p->dstate_in)) {
            load_state(p->dstate_out, s, h, N, dS);
            store_state(p->dstate_in, s, h, N, dS);
        }
        return;
    }
    load_token(p->u, 0, 0, h, N, u);

    const int64_t nseg = segments(len);
    const int64_t seg0 = job->seg_prefix ? job->seg_prefix[s] : s * segments(p->T);
    float* ck = job->ckpt + ((size_t)seg0 * (size_t)H + (size_t)h * (size_t)nseg) * n2;

    /* Runs the m >= 1 tokens from ts on from state `start`, storing the state after token
     * ts + q in replay[q] for q < m - 1, and the state after the last token in `last` (when
     * not NULL; else it is not computed). */
    auto run_tokens = [&](int64_t ts, int64_t m, const float* start, float* last) {
        const int64_t steps = last ? m : m - 1;
        for (int64_t q = 0; q < steps; ++q) {
            load_inputs(p, batch, ts + q, h, false, x, nullptr);
            const float* src = q == 0 ? start : replay + (size_t)(q - 1) * n2;
            float* dst = q == m - 1 ? last : replay + (size_t)q * n2;
            step(src, dst, N, x.decay, x.k, x.v, nullptr, 0.0f, nullptr);
        }
    };

    /* 1. checkpoints: ck[g] = the state before token t0 + g * K. (nseg > 1 means len > K, so
     *    the replay scratch holds K - 1 states.) */
    load_state(p->state_in, s, h, N, ck);
    for (int64_t g = 0; g + 1 < nseg; ++g)
        run_tokens(t0 + g * K, K, ck + (size_t)g * n2, ck + (size_t)(g + 1) * n2);

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
            load_inputs(p, batch, t, h, true, x, ddw);
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

void backward_task(void* data, int64_t begin, int64_t end) noexcept {
    const BackwardJob* job = static_cast<const BackwardJob*>(data);
    for (int64_t c = begin; c < end; ++c) {
        float* scratch =
            reinterpret_cast<float*>(job->chunks + (size_t)c * (size_t)job->layout.chunk_bytes);
        int64_t i0, i1;
        chunk_items(job->layout.items, job->layout.chunks, c, &i0, &i1);
        for (int64_t item = i0; item < i1; ++item) backward_item(job, item, scratch);
    }
}

} // namespace

/* -------------------------------------------------------------------------------- entries */

wkv_status rwkv6_forward(const BackendState* st, const wkv_problem* p, wkv_message* msg) {
    if (!decay_form_supported(p->decay_form)) {
        set_message(msg, "decay_form %d is not supported", (int)p->decay_form);
        return WKV_ERROR_UNSUPPORTED;
    }
    CheckedSize c;
    const uint64_t N = (uint64_t)p->N;
    const uint64_t items_u = c.mul((uint64_t)p->num_seqs, (uint64_t)p->H);
    if (items_u > (uint64_t)INT64_MAX) c.overflow = true;
    const int64_t items = c.overflow ? 0 : (int64_t)items_u;
    const int64_t chunks = chunk_count(st, items);
    const uint64_t chunk_bytes = c.align_up(
        c.mul(4, c.add(c.mul(2, c.mul(N, N)), c.mul((uint64_t)kForwardRows, N))), kAlign);
    const size_t total = c.to_size(c.add(kAlign, c.mul((uint64_t)chunks, chunk_bytes)));
    if (c.overflow) {
        set_message(msg, "the RWKV-6 forward scratch for H=%lld N=%lld overflows size_t",
                    (long long)p->H, (long long)p->N);
        return WKV_ERROR_OVERFLOW;
    }
    if (items == 0) return WKV_OK;

    void* mem = std::malloc(total);
    if (!mem) {
        set_message(msg, "cannot allocate %zu bytes of RWKV-6 forward scratch", total);
        return WKV_ERROR_OUT_OF_MEMORY;
    }
    ForwardJob job;
    job.p = p;
    job.scratch = align_ptr(mem);
    job.chunk_bytes = (size_t)chunk_bytes;
    job.items = items;
    job.chunks = chunks;
    st->args.parallel_for(st->args.parallel_for_user_data, chunks, forward_task, &job);
    std::free(mem);
    return WKV_OK;
}

wkv_status rwkv6_workspace_size(const BackendState* st, const wkv_problem* p, size_t* out_bytes,
                                wkv_message* msg) {
    BackwardLayout L;
    const wkv_status status = plan_backward(st, p, &L, msg);
    if (status != WKV_OK) return status;
    *out_bytes = (size_t)L.total;
    return WKV_OK;
}

wkv_status rwkv6_backward(const BackendState* st, const wkv_problem* p, wkv_message* msg) {
    if (!decay_form_supported(p->decay_form)) {
        set_message(msg, "decay_form %d is not supported", (int)p->decay_form);
        return WKV_ERROR_UNSUPPORTED;
    }
    BackwardJob job;
    const wkv_status status = plan_backward(st, p, &job.layout, msg);
    if (status != WKV_OK) return status;
    if (p->workspace == nullptr || p->workspace_size < (size_t)job.layout.total) {
        set_message(msg, "the workspace has %zu bytes; RWKV-6 backward needs %zu",
                    p->workspace ? p->workspace_size : (size_t)0, (size_t)job.layout.total);
        return WKV_ERROR_WORKSPACE_TOO_SMALL;
    }
    if (job.layout.items == 0) return WKV_OK;

    char* base = align_ptr(p->workspace);
    job.p = p;
    job.seg_prefix = nullptr;
    if (p->seq_offsets) {
        int64_t* prefix = reinterpret_cast<int64_t*>(base + job.layout.prefix_off);
        int64_t acc = 0;
        for (int64_t s = 0; s < p->num_seqs; ++s) {
            prefix[s] = acc;
            acc += segments(p->seq_offsets[s + 1] - p->seq_offsets[s]);
        }
        prefix[p->num_seqs] = acc;
        job.seg_prefix = prefix;
    }
    job.ckpt = reinterpret_cast<float*>(base + job.layout.ckpt_off);
    job.du_part = reinterpret_cast<float*>(base + job.layout.du_off);
    job.chunks = base + job.layout.chunk_off;
    st->args.parallel_for(st->args.parallel_for_user_data, job.layout.chunks, backward_task, &job);

    /* 4. du[h] = the partials of (0, h), (1, h), ... summed in that order into (0, h). */
    const int64_t H = p->H, N = p->N;
    for (int64_t h = 0; h < H; ++h) {
        float* acc = job.du_part + (size_t)h * (size_t)N;
        for (int64_t s = 1; s < p->num_seqs; ++s) {
            const float* part = job.du_part + ((size_t)s * (size_t)H + (size_t)h) * (size_t)N;
            for (int64_t j = 0; j < N; ++j) acc[j] += part[j];
        }
        store_token(p->du, 0, 0, h, N, acc);
    }
    return WKV_OK;
}

} // namespace wkv_cpu
