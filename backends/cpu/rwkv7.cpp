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
 *   WKV_ERROR_OVERFLOW if it does not fit in size_t.
 *   E.g. B=1 T=4096 H=32 N=64: 64 MiB of checkpoints + chunks x 532 KiB (1 thread: 66.1 MiB).
 *
 * The forward allocates chunks * A64(4 * (2 * N2 + 8 * N)) bytes of its own scratch (malloc)
 * before it writes anything, so an allocation failure leaves every output untouched. */
#include "rwkv7.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "tensor_access.h"

namespace wkv_cpu {
namespace {

constexpr int64_t K = kRwkv7CheckpointInterval;
constexpr uint64_t kAlign = 64;
constexpr int64_t kForwardRows = 8;  /* r w k v a b decay y */
constexpr int64_t kBackwardRows = 16; /* r w k v a b dy decay ddw dr dw dk dv da db dd */

/* Inner loops run over j in blocks of kLanes with a scalar tail; every sum over j keeps
 * kLanes partial sums (lane u takes j = u, u + kLanes, ...; the tail continues from lane 0)
 * combined by lanes_sum(). The order is fixed by the code, not by the thread count, and the
 * fixed-size blocks let the compiler vectorize at -O2 without runtime alias checks. */
constexpr int64_t kLanes = 8;

inline float lanes_sum(const float* acc) noexcept {
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

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

/* Per-token input rows. */
struct TokenRows {
    float *r, *w, *k, *v, *a, *b, *decay;
};

/* Loads w k v a b (and r when `with_r`) of token (batch, t, h) and computes decay. */
inline void load_inputs(const wkv_problem* p, int64_t batch, int64_t t, int64_t h, bool with_r,
                        const TokenRows& x, float* ddw) noexcept {
    const int64_t N = p->N;
    if (with_r) load_token(p->r, batch, t, h, N, x.r);
    load_token(p->w, batch, t, h, N, x.w);
    load_token(p->k, batch, t, h, N, x.k);
    load_token(p->v, batch, t, h, N, x.v);
    load_token(p->a, batch, t, h, N, x.a);
    load_token(p->b, batch, t, h, N, x.b);
    decay_row(p->decay_form, x.w, x.decay, ddw, N);
}

/* --------------------------------------------------------------------------------- forward */

struct ForwardJob {
    const wkv_problem* p;
    char* scratch;      /* chunk c at scratch + c * chunk_bytes */
    size_t chunk_bytes;
    int64_t items, chunks;
};

void forward_item(const wkv_problem* p, int64_t item, float* scratch) noexcept {
    const int64_t H = p->H, N = p->N;
    const int64_t s = item / H, h = item % H;
    int64_t batch, t0, t1;
    wkv_problem_sequence(p, s, &batch, &t0, &t1);

    float* S = scratch;       /* the state, ping-ponging between S and S2 */
    float* S2 = S + N * N;
    float* rows = S2 + N * N;
    TokenRows x;
    x.r = rows;
    x.w = rows + N;
    x.k = rows + 2 * N;
    x.v = rows + 3 * N;
    x.a = rows + 4 * N;
    x.b = rows + 5 * N;
    x.decay = rows + 6 * N;
    float* y = rows + 7 * N;

    /* Read the whole state first: state_out may be the same memory. */
    load_state(p->state_in, s, h, N, S);
    const bool want_y = view_present(p->y);
    for (int64_t t = t0; t < t1; ++t) {
        load_inputs(p, batch, t, h, want_y, x, nullptr);
        step(S, S2, N, x.decay, x.k, x.v, x.a, x.b, x.r, want_y ? y : nullptr);
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
    uint64_t prefix_off = 0, ckpt_off = 0, chunk_off = 0; /* from the aligned base */
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
    const int64_t R = max_len < K ? max_len : K;

    BackwardLayout L;
    const uint64_t items = c.mul((uint64_t)p->num_seqs, H);
    L.items = items > (uint64_t)INT64_MAX ? 0 : (int64_t)items;
    if (items > (uint64_t)INT64_MAX) c.overflow = true;
    L.chunks = chunk_count(st, L.items);
    L.replay_states = R;

    const uint64_t prefix_bytes =
        packed ? c.align_up(c.mul(8, c.add((uint64_t)p->num_seqs, 1)), kAlign) : 0;
    const uint64_t ckpt_bytes = c.align_up(c.mul(4, c.mul(c.mul(H, G), n2)), kAlign);
    const uint64_t chunk_floats =
        c.add(c.mul((uint64_t)R + 1, n2), c.mul((uint64_t)kBackwardRows, N));
    L.chunk_bytes = c.align_up(c.mul(4, chunk_floats), kAlign);

    L.prefix_off = 0;
    L.ckpt_off = prefix_bytes;
    L.chunk_off = c.add(prefix_bytes, ckpt_bytes);
    L.total = c.add(c.add(kAlign, L.chunk_off), c.mul((uint64_t)L.chunks, L.chunk_bytes));
    (void)c.to_size(L.total);
    if (c.overflow) {
        set_message(msg,
                    "the RWKV-7 backward workspace for B=%lld T=%lld H=%lld N=%lld overflows "
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
    x.a = rows + 4 * N;
    x.b = rows + 5 * N;
    x.decay = rows + 6 * N;
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

    const int64_t nseg = segments(len);
    const int64_t seg0 = job->seg_prefix ? job->seg_prefix[s] : s * segments(p->T);
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
    load_state(p->state_in, s, h, N, ck);
    for (int64_t g = 0; g + 1 < nseg; ++g) {
        run_segment(t0 + g * K, K, ck + (size_t)g * n2);
        std::memcpy(ck + (size_t)(g + 1) * n2, replay + (size_t)(K - 1) * n2, n2 * sizeof(float));
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

inline char* align_ptr(void* ptr) noexcept {
    const uintptr_t u = reinterpret_cast<uintptr_t>(ptr);
    return reinterpret_cast<char*>((u + (kAlign - 1)) & ~(uintptr_t)(kAlign - 1));
}

} // namespace

/* -------------------------------------------------------------------------------- entries */

wkv_status rwkv7_forward(const BackendState* st, const wkv_problem* p, wkv_message* msg) {
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
    const uint64_t chunk_bytes =
        c.align_up(c.mul(4, c.add(c.mul(2, c.mul(N, N)), c.mul((uint64_t)kForwardRows, N))), kAlign);
    const size_t total = c.to_size(c.add(kAlign, c.mul((uint64_t)chunks, chunk_bytes)));
    if (c.overflow) {
        set_message(msg, "the RWKV-7 forward scratch for H=%lld N=%lld overflows size_t",
                    (long long)p->H, (long long)p->N);
        return WKV_ERROR_OVERFLOW;
    }
    if (items == 0) return WKV_OK;

    void* mem = std::malloc(total);
    if (!mem) {
        set_message(msg, "cannot allocate %zu bytes of RWKV-7 forward scratch", total);
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

wkv_status rwkv7_workspace_size(const BackendState* st, const wkv_problem* p, size_t* out_bytes,
                                wkv_message* msg) {
    BackwardLayout L;
    const wkv_status status = plan_backward(st, p, &L, msg);
    if (status != WKV_OK) return status;
    *out_bytes = (size_t)L.total;
    return WKV_OK;
}

wkv_status rwkv7_backward(const BackendState* st, const wkv_problem* p, wkv_message* msg) {
    if (!decay_form_supported(p->decay_form)) {
        set_message(msg, "decay_form %d is not supported", (int)p->decay_form);
        return WKV_ERROR_UNSUPPORTED;
    }
    BackwardJob job;
    const wkv_status status = plan_backward(st, p, &job.layout, msg);
    if (status != WKV_OK) return status;
    if (p->workspace == nullptr || p->workspace_size < (size_t)job.layout.total) {
        set_message(msg, "the workspace has %zu bytes; RWKV-7 backward needs %zu",
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
    job.chunks = base + job.layout.chunk_off;
    st->args.parallel_for(st->args.parallel_for_user_data, job.layout.chunks, backward_task, &job);
    return WKV_OK;
}

} // namespace wkv_cpu
