/* RWKV-4 WKV on the CPU, forward and backward, in the numerically stable (aa, bb, pp) form.
 *
 * Per channel c, wd = -exp(w[c]) (the per-step decay is exp(-exp(w))), u = u[c], state
 * (aa, bb, pp) (numerator, denominator, running max exponent), per token t, all float32:
 *     ww  = u + k;         q  = max(pp, ww);      e1 = exp(pp - q);   e2 = exp(ww - q)
 *     y   = (e1 aa + e2 v) / (e1 bb + e2)
 *     q2  = max(pp + wd, k);                      A  = exp(pp + wd - q2);  Bk = exp(k - q2)
 *     aa' = A aa + Bk v;   bb' = A bb + Bk;       pp' = q2
 * Every exponent is <= 0, so nothing overflows for any k (k = +-60 included) or any T. An
 * absent state_in is aa = bb = 0, pp = -1e38 (kRwkv4EmptyPP).
 *
 * Exponents without drift: pp can be far larger than wd (k ~ 60 makes pp ~ 60, where a
 * float32 ulp is 4e-6 while wd may be -0.007), so rounding pp + wd to float32 on every step
 * would let pp drift from the exact recurrence by a random walk of half-ulps (1e-4 relative
 * in every later y and gradient after 1000 steps). Inside a call pp is therefore carried as an
 * unevaluated float32 pair ph + pl (|pl| <= ulp(ph) / 2), stepped with TwoSum, and u + k is
 * formed the same way; every exponential takes its argument as (hi difference) + lo parts. The
 * exponentials stay float32. state_out, checkpoints aside, holds ph, the float32 nearest the
 * exact pp; the next call continues from it.
 *
 * Channels come in blocks of kRwkv4ChannelBlock = 32. A forward item is (sequence s, block)
 * here (the vector paths walk runs of blocks); a backward item is (sequence s, a run of up to
 * GB = kRwkv4BackwardBlocks = 16 blocks: BG below), walked token by token so that each token's
 * rows of the run are one contiguous read (NOTES.md, step 28). Channels are independent, every
 * channel is computed with a fixed order of operations whatever its item, and the sums over
 * sequences (dw, du) are reduced in a fixed order afterwards, so results do not depend on the
 * thread count or on how parallel_for splits the work.
 *
 * ------------------------------------------------------------------------------ BACKWARD
 * Checkpoint + replay of (aa, bb, ph, pl); the recurrence is never inverted. K =
 * kRwkv4CheckpointInterval = 32. For an item whose sequence has L tokens, G = ceil(L / K)
 * segments:
 *   1. run the forward once, storing the state before each segment (C_0 = state_in or empty);
 *   2. for g = G-1 down to 0: replay segment g (m <= K tokens) from C_g, storing the m-1
 *      states before its tokens after the first (the vector paths copy C_g itself into the
 *      item's first state slot: its blocks' checkpoints are not adjacent), then walk t backward with (gaa, gbb, gpp) =
 *      dL/d(state after token t) (dstate_out or zero at the start); with (aa, bb, pp) the
 *      state before token t and the quantities above:
 *        through y (q cancels out of y: its gradient there is exactly zero and left out):
 *          gy = dy / (e1 bb + e2)
 *          gaa_prev = gy e1;  gbb_prev = -gy y e1;  gpp_prev = gy e1 (aa - y bb)
 *          dv = gy e2;        dk = du_t = gy e2 (v - y)
 *        through the update, dA = gaa aa + gbb bb, dB = gaa v + gbb,
 *        dq2 = gpp - dA A - dB Bk (what reaches q2 = max(pp + wd, k)):
 *          gaa_prev += gaa A;  gbb_prev += gbb A;  gpp_prev += dA A;  dwd += dA A
 *          dv += gaa Bk;       dk += dB Bk
 *          dq2 goes to gpp_prev and dwd when pp + wd > k, to dk when k > pp + wd, half to
 *          each on a tie (torch.maximum's rule: the max-tracking representation)
 *   3. dstate_in = (gaa, gbb, gpp); the item's partial sums of dwd and du_t go to the
 *      workspace;
 *   4. after every item: dw[c] = wd[c] * sum over s = 0, 1, ... of the dwd partials (0 when
 *      that sum is 0, so that an infinite wd never makes a NaN), du[c] = the sum of the du
 *      partials, in that order.
 *
 * WORKSPACE (bytes), all from the problem and the context's num_threads:
 *   CB     = 32, nb = ceil(C / CB), GB = 16
 *   P      = ceil(max(1, num_threads) / max(1, num_seqs))   (items wanted per sequence)
 *   BG     = min(GB, ceil(nb / P))                          (blocks per backward item)
 *   Wm     = min(BG * CB, C)                                (channels per item, at most)
 *   items  = num_seqs * ceil(nb / BG)
 *   G      = sum over sequences s of ceil(L_s / K)          (unpacked: B * ceil(T / K))
 *   R      = min(K, max_s L_s)                              (state slots per chunk)
 *   chunks = min(items, 4 * max(1, num_threads))            (see cpu_internal.h)
 *   workspace = 64                                          (to align the base to 64 bytes)
 *             + A64(8 * (num_seqs + 1))      if packed, else 0   (segment prefix sums)
 *             + A64(4 * 4 * C * G)                               (checkpoints: aa bb ph pl)
 *             + A64(4 * 2 * num_seqs * C)                        (dw, du partials)
 *             + chunks * A64(4 * (4 * R + 11) * Wm)              (state slots, 11 rows)
 *   where A64(x) rounds x up to a multiple of 64. Computed in checked 64-bit arithmetic;
 *   WKV_ERROR_OVERFLOW if it does not fit in size_t. (The layout, shared by every op, is
 *   op_common.h's; this file gives the sizes.)
 *   E.g. B=1 T=4096 C=4096, 1 thread: 8 MiB of checkpoints + 32 KiB of partials + 4 chunks
 *   x 278 KiB.
 *
 * The forward allocates chunks * A64(4 * 10 * Wm) bytes of its own scratch (malloc) before it
 * writes anything, so an allocation failure leaves every output untouched. */
#include "rwkv4.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "op_common.h"
#include "tensor_access.h"

namespace wkv_cpu {
namespace {

constexpr int64_t K = kRwkv4CheckpointInterval;
constexpr int64_t CB = kRwkv4ChannelBlock;
constexpr int64_t kForwardRows = 10;  /* aa bb ph pl w u wd k v y */
constexpr int64_t kBackwardRows = 11; /* w u wd k v dy dk dv gaa gbb gpp */
constexpr int64_t kStateRows = 4;     /* aa bb ph pl */
constexpr float kRwkv4EmptyPP = -1e38f;

inline int64_t min64(int64_t a, int64_t b) noexcept { return a < b ? a : b; }

/* s + e = a + b exactly (Knuth's TwoSum); e = 0 when s is not finite. */
inline void two_sum(float a, float b, float* s, float* e) noexcept {
    const float sum = a + b;
    const float bv = sum - a;
    const float err = (a - (sum - bv)) + (b - bv);
    *s = sum;
    *e = std::isfinite(sum) ? err : 0.0f;
}

/* Everything one token computes from the state before it (aa, bb, ph + pl), k, u + k and wd:
 * see the top of the file. */
struct Token {
    float e1, e2, inv, y; /* y = (e1 aa + e2 v) * inv */
    float A, Bk;          /* the update's factors */
    float qh, ql;         /* q2 = qh + ql, the new pp */
    float side;           /* the sign of (pp + wd) - k: > 0 pp + wd wins, < 0 k wins */
};

inline Token token(float a, float b, float ph, float pl, float kk, float vv, float uu, float wdd,
                   bool want_y) noexcept {
    Token o{};
    if (want_y) {
        float wh, wl;
        two_sum(uu, kk, &wh, &wl);
        const float q = ph >= wh ? ph : wh;
        o.e1 = std::exp((ph - q) + pl);
        o.e2 = std::exp((wh - q) + wl);
        o.inv = 1.0f / (o.e1 * b + o.e2);
        o.y = (o.e1 * a + o.e2 * vv) * o.inv;
    }
    float sh, sl;
    two_sum(ph, wdd, &sh, &sl);
    const float lo = sl + pl;                   /* renormalize (sh, lo): Fast2Sum */
    const float hi = std::isfinite(sh) ? sh + lo : sh;
    const float rl = std::isfinite(sh) ? lo - (hi - sh) : 0.0f;
    o.side = (hi - kk) + rl;
    if (o.side >= 0.0f) { /* q2 = pp + wd */
        o.qh = hi;
        o.ql = rl;
        o.A = 1.0f;
        o.Bk = std::exp((kk - hi) - rl);
    } else { /* q2 = k */
        o.qh = kk;
        o.ql = 0.0f;
        o.A = std::exp((hi - kk) + rl);
        o.Bk = 1.0f;
    }
    return o;
}

/* A state block is four rows of W floats: aa, bb, ph, pl. */

/* One forward step, src -> dst (may be the same block: every channel is read before it is
 * written); y may be NULL. */
void step(const float* src, float* dst, int64_t W, const float* __restrict u,
          const float* __restrict wd, const float* __restrict k, const float* __restrict v,
          float* __restrict y) noexcept {
    for (int64_t c = 0; c < W; ++c) {
        const float a = src[c], b = src[W + c], ph = src[2 * W + c], pl = src[3 * W + c];
        const float vv = v[c];
        const Token o = token(a, b, ph, pl, k[c], vv, u[c], wd[c], y != nullptr);
        if (y) y[c] = o.y;
        dst[c] = o.A * a + o.Bk * vv;
        dst[W + c] = o.A * b + o.Bk;
        dst[2 * W + c] = o.qh;
        dst[3 * W + c] = o.ql;
    }
}

/* One backward step: S is the state before the token; (gaa, gbb, gpp) go from the gradient
 * w.r.t. the state after the token to the one before it. Writes dk, dv; adds to dwd, du. */
void backward_step(const float* __restrict S, int64_t W, const float* __restrict u,
                   const float* __restrict wd, const float* __restrict k,
                   const float* __restrict v, const float* __restrict dy,
                   float* __restrict gaa, float* __restrict gbb, float* __restrict gpp,
                   float* __restrict dk, float* __restrict dv, float* __restrict dwd,
                   float* __restrict du) noexcept {
    for (int64_t c = 0; c < W; ++c) {
        const float a = S[c], b = S[W + c], ph = S[2 * W + c], pl = S[3 * W + c];
        const float vv = v[c];
        const Token o = token(a, b, ph, pl, k[c], vv, u[c], wd[c], true);
        /* through y */
        const float g = dy[c] * o.inv;
        const float dk_y = g * o.e2 * (vv - o.y);
        float ga = g * o.e1, gb = -g * o.y * o.e1, gp = g * o.e1 * (a - o.y * b);
        float dkt = dk_y, dvt = g * o.e2, dwt = 0.0f;
        /* through the update */
        const float na = gaa[c], nb = gbb[c], np = gpp[c];
        const float dA = na * a + nb * b, dB = na * vv + nb;
        const float dAA = dA * o.A;
        const float dq2 = np - dAA - dB * o.Bk;
        ga += na * o.A;
        gb += nb * o.A;
        gp += dAA;
        dwt += dAA;
        dvt += na * o.Bk;
        dkt += dB * o.Bk;
        if (o.side > 0.0f) {
            gp += dq2;
            dwt += dq2;
        } else if (o.side < 0.0f) {
            dkt += dq2;
        } else {
            gp += 0.5f * dq2;
            dwt += 0.5f * dq2;
            dkt += 0.5f * dq2;
        }
        gaa[c] = ga;
        gbb[c] = gb;
        gpp[c] = gp;
        dk[c] = dkt;
        dv[c] = dvt;
        dwd[c] += dwt;
        du[c] += dk_y;
    }
}

/* Element offsets of channel c0 in a per-token view at (batch, t), a parameter view (w, u) and
 * part `part` of state slot s in a state view. */
inline int64_t token_off(const wkv_view& x, int64_t batch, int64_t t, int64_t c0) noexcept {
    return view_offset(x, batch, t, 0) + c0 * x.stride[3];
}
inline int64_t param_off(const wkv_view& x, int64_t c0) noexcept { return c0 * x.stride[3]; }
inline int64_t state_off(const wkv_view& x, int64_t s, int64_t part, int64_t c0) noexcept {
    return s * x.stride[0] + part * x.stride[1] + c0 * x.stride[3];
}

/* The state block of slot s, channels [c0, c0 + W): from the view, or empty when absent. */
void load_state4(const wkv_view& x, int64_t s, int64_t c0, int64_t W, float* st) noexcept {
    if (!view_present(x)) {
        for (int64_t c = 0; c < W; ++c) {
            st[c] = 0.0f;
            st[W + c] = 0.0f;
            st[2 * W + c] = kRwkv4EmptyPP;
            st[3 * W + c] = 0.0f;
        }
        return;
    }
    for (int64_t part = 0; part < 3; ++part) load_row(x, state_off(x, s, part, c0), W, st + part * W);
    for (int64_t c = 0; c < W; ++c) st[3 * W + c] = 0.0f; /* pl */
}

/* The same with zeros when absent (a state gradient). */
void load_grad4(const wkv_view& x, int64_t s, int64_t c0, int64_t W, float* st) noexcept {
    if (!view_present(x)) {
        for (int64_t c = 0; c < 3 * W; ++c) st[c] = 0.0f;
        return;
    }
    for (int64_t part = 0; part < 3; ++part) load_row(x, state_off(x, s, part, c0), W, st + part * W);
}

void store_state4(const wkv_view& x, int64_t s, int64_t c0, int64_t W, const float* st) noexcept {
    if (!view_present(x)) return;
    for (int64_t part = 0; part < 3; ++part) store_row(x, state_off(x, s, part, c0), W, st + part * W);
}

/* w, u of channels [c0, c0 + W) and wd = -exp(w). */
void load_params(const wkv_problem* p, int64_t c0, int64_t W, float* w, float* u,
                 float* wd) noexcept {
    load_row(p->w, param_off(p->w, c0), W, w);
    load_row(p->u, param_off(p->u, c0), W, u);
    for (int64_t c = 0; c < W; ++c) wd[c] = -std::exp(w[c]);
}

inline int64_t blocks(int64_t C) noexcept { return (C + CB - 1) / CB; }

/* The parameter and token rows, five rows of Wm floats from `at`: w u wd k v. */
struct Rows {
    float *w, *u, *wd, *k, *v;
};
inline Rows carve_rows(float* at, int64_t Wm) noexcept {
    Rows x;
    x.w = at;
    x.u = at + Wm;
    x.wd = at + 2 * Wm;
    x.k = at + 3 * Wm;
    x.v = at + 4 * Wm;
    return x;
}

/* k and v of token (batch, t), channels [c0, c0 + W), into x.k and x.v. */
inline void load_kv(const wkv_problem* p, int64_t batch, int64_t t, int64_t c0, int64_t W,
                    const Rows& x) noexcept {
    load_row(p->k, token_off(p->k, batch, t, c0), W, x.k);
    load_row(p->v, token_off(p->v, batch, t, c0), W, x.v);
}

/* --------------------------------------------------------------------------------- forward */

/* One work item per (sequence, block of CB channels): item = s * blocks(C) + block. */
uint64_t items_per_seq(const wkv_problem* p) { return (uint64_t)blocks(p->N); }

/* Forward scratch per chunk: kForwardRows rows of min(CB, C). */
uint64_t forward_chunk_floats(const wkv_problem* p, int64_t /* group: 1 */,
                              CheckedSize& c) {
    return c.mul((uint64_t)kForwardRows, (uint64_t)min64(CB, p->N));
}

void forward_item(const wkv_problem* p, int64_t /* group: 1 */, int64_t item,
                  float* scratch, const BackwardJob* save) noexcept {
    const int64_t C = p->N, nb = blocks(C), Wm = min64(CB, C);
    const int64_t s = item / nb, c0 = (item % nb) * CB, W = min64(CB, C - c0);
    int64_t batch, t0, t1;
    wkv_problem_sequence(p, s, &batch, &t0, &t1);

    float* st = scratch; /* 4 rows: aa bb ph pl */
    const Rows x = carve_rows(scratch + 4 * Wm, Wm);
    float* y = scratch + 9 * Wm;

    /* Read the whole state first: state_out may be the same memory. */
    load_state4(p->state_in, s, c0, W, st);
    load_params(p, c0, W, x.w, x.u, x.wd);
    /* save: the backward's checkpoints ck[g] = the state before token t0 + g K */
    const size_t sz = (size_t)(kStateRows * W);
    float* ck = nullptr;
    if (save && t1 > t0) {
        ck = save->ckpt + (size_t)save->first_segment(s) * (size_t)(kStateRows * C) +
             (size_t)segment_count(t1 - t0, K) * (size_t)(kStateRows * c0);
        std::memcpy(ck, st, sz * sizeof(float));
    }
    const bool want_y = view_present(p->y);
    for (int64_t t = t0; t < t1; ++t) {
        load_kv(p, batch, t, c0, W, x);
        step(st, st, W, x.u, x.wd, x.k, x.v, want_y ? y : nullptr);
        if (want_y) store_row(p->y, token_off(p->y, batch, t, c0), W, y);
        if (ck && (t + 1 - t0) % K == 0 && t + 1 < t1)
            std::memcpy(ck + (size_t)((t + 1 - t0) / K) * sz, st, sz * sizeof(float));
    }
    store_state4(p->state_out, s, c0, W, st);
}

/* -------------------------------------------------------------------------------- backward */

/* Blocks per backward item (BG at the top of the file): as many as leave an item per thread,
 * at most kRwkv4BackwardBlocks. The same on every path, so the workspace is. */
int64_t backward_group(const wkv_problem* p, int64_t threads) {
    const int64_t seqs = p->num_seqs > 0 ? p->num_seqs : 1;
    const int64_t per_seq = ((threads > 0 ? threads : 1) + seqs - 1) / seqs;
    const int64_t g = (blocks(p->N) + per_seq - 1) / per_seq;
    return g < 1 ? 1 : g < kRwkv4BackwardBlocks ? g : kRwkv4BackwardBlocks;
}

/* The backward regions (see the top of the file): R = min(K, max_s L_s) state slots, C * G
 * checkpoint states of kStateRows floats, dwd and du partials per sequence, and per chunk the
 * R state slots and kBackwardRows rows, Wm = min(BG * CB, C) wide. */
BackwardSizes backward_sizes(const wkv_problem* p, const BackwardShape& shape, CheckedSize& c) {
    const uint64_t C = (uint64_t)p->N, Wm = (uint64_t)min64(shape.group * CB, p->N);
    BackwardSizes z;
    z.replay_states = min64(shape.max_len, K);
    z.ckpt_floats = c.mul((uint64_t)kStateRows, c.mul(C, shape.segments));
    z.part_floats = c.mul(2, c.mul((uint64_t)p->num_seqs, C));
    const uint64_t chunk_rows =
        c.add(c.mul((uint64_t)kStateRows, (uint64_t)z.replay_states), (uint64_t)kBackwardRows);
    z.chunk_floats = c.mul(chunk_rows, Wm);
    return z;
}

/* Block `blk` of sequence s. The chunk holds R state slots and 11 rows of BG blocks; one block
 * uses R - 1 slots (its replay states) and rows of min(CB, C). */
void backward_block(const BackwardJob* job, int64_t s, int64_t blk, float* scratch) noexcept {
    const wkv_problem* p = job->p;
    const int64_t C = p->N, Wm = min64(CB, C);
    const int64_t c0 = blk * CB, W = min64(CB, C - c0);
    int64_t batch, t0, t1;
    wkv_problem_sequence(p, s, &batch, &t0, &t1);
    const int64_t len = t1 - t0;
    const size_t sz = (size_t)(kStateRows * W); /* one state block */

    float* replay = scratch; /* replay_states blocks of 4 W */
    float* rows = replay + (size_t)job->layout.replay_states * (size_t)(kStateRows * Wm);
    const Rows x = carve_rows(rows, Wm);
    float* dy = rows + 5 * Wm;
    float* dk = rows + 6 * Wm;
    float* dv = rows + 7 * Wm;
    float* gs = rows + 8 * Wm; /* gaa gbb gpp: 3 rows of W */
    float* gaa = gs;
    float* gbb = gs + W;
    float* gpp = gs + 2 * W;
    float* dwd = job->part + (size_t)(2 * s) * (size_t)C + (size_t)c0;
    float* du = job->part + (size_t)(2 * s + 1) * (size_t)C + (size_t)c0;

    for (int64_t c = 0; c < W; ++c) {
        dwd[c] = 0.0f;
        du[c] = 0.0f;
    }
    if (len == 0) { /* nothing flows through but the state gradient */
        if (view_present(p->dstate_in)) {
            load_grad4(p->dstate_out, s, c0, W, gs);
            store_state4(p->dstate_in, s, c0, W, gs);
        }
        return;
    }
    load_params(p, c0, W, x.w, x.u, x.wd);

    const int64_t nseg = segment_count(len, K);
    const int64_t seg0 = job->first_segment(s);
    float* ck = job->ckpt + (size_t)seg0 * (size_t)(kStateRows * C) +
                (size_t)nseg * (size_t)(kStateRows * c0);

    /* 1. checkpoints: ck[g] = the state before token t0 + g * K */
    if (!p->reuse_checkpoints) { /* else the forward saved them (saves() below) */
        load_state4(p->state_in, s, c0, W, ck);
        for (int64_t g = 0; g + 1 < nseg; ++g) {
            const float* src = ck + (size_t)g * sz;
            float* dst = ck + (size_t)(g + 1) * sz;
            for (int64_t q = 0; q < K; ++q) {
                const int64_t t = t0 + g * K + q;
                load_kv(p, batch, t, c0, W, x);
                step(q == 0 ? src : dst, dst, W, x.u, x.wd, x.k, x.v, nullptr);
            }
        }
    }

    /* 2. segments in reverse: replay, then sweep backward */
    load_grad4(p->dstate_out, s, c0, W, gs);
    for (int64_t g = nseg - 1; g >= 0; --g) {
        const int64_t ts = t0 + g * K;
        const int64_t m = min64(t1 - ts, K);
        const float* start = ck + (size_t)g * sz;
        /* replay[q] = the state after token ts + q, q < m - 1 */
        for (int64_t q = 0; q + 1 < m; ++q) {
            load_kv(p, batch, ts + q, c0, W, x);
            step(q == 0 ? start : replay + (size_t)(q - 1) * sz, replay + (size_t)q * sz, W, x.u,
                 x.wd, x.k, x.v, nullptr);
        }
        for (int64_t q = m - 1; q >= 0; --q) {
            const int64_t t = ts + q;
            const float* S = q == 0 ? start : replay + (size_t)(q - 1) * sz;
            load_kv(p, batch, t, c0, W, x);
            load_row(p->dy, token_off(p->dy, batch, t, c0), W, dy);
            backward_step(S, W, x.u, x.wd, x.k, x.v, dy, gaa, gbb, gpp, dk, dv, dwd, du);
            store_row(p->dk, token_off(p->dk, batch, t, c0), W, dk);
            store_row(p->dv, token_off(p->dv, batch, t, c0), W, dv);
        }
    }

    /* 3. */
    store_state4(p->dstate_in, s, c0, W, gs);
}

/* Item = s * ceil(nb / BG) + i: blocks [i BG, min((i + 1) BG, nb)) of sequence s, one by one
 * (the vector paths walk them together). */
void backward_item(const BackwardJob* job, int64_t item, float* scratch) noexcept {
    const int64_t nb = blocks(job->p->N), bg = job->layout.group;
    const int64_t per_seq = (nb + bg - 1) / bg;
    const int64_t s = item / per_seq, b0 = (item % per_seq) * bg;
    for (int64_t blk = b0; blk < b0 + bg && blk < nb; ++blk) backward_block(job, s, blk, scratch);
}

/* 4. the partials of sequences 0, 1, ... summed in that order into sequence 0's; then
 * dw = wd * the dwd sum (0 when that sum is 0) and du. */
void backward_reduce(const BackwardJob* job) {
    const wkv_problem* p = job->p;
    const int64_t C = p->N;
    float* dwd = job->part;
    float* du = job->part + C;
    for (int64_t s = 1; s < p->num_seqs; ++s) {
        const float* pw = job->part + (size_t)(2 * s) * (size_t)C;
        const float* pu = pw + C;
        for (int64_t c = 0; c < C; ++c) {
            dwd[c] += pw[c];
            du[c] += pu[c];
        }
    }
    for (int64_t c0 = 0; c0 < C; c0 += CB) {
        const int64_t W = min64(CB, C - c0);
        float w[CB], dw[CB];
        load_row(p->w, param_off(p->w, c0), W, w);
        for (int64_t c = 0; c < W; ++c) {
            const float g = dwd[c0 + c];
            dw[c] = g == 0.0f ? 0.0f : g * -std::exp(w[c]);
        }
        store_row(p->dw, param_off(p->dw, c0), W, dw);
    }
    store_row(p->du, param_off(p->du, 0), C, du);
}

wkv_status check(const wkv_problem* p, wkv_message* msg) {
    if (p->decay_form != WKV_DECAY_EXP_NEG_EXP) { /* the core already guarantees it */
        set_message(msg, "RWKV-4 needs decay_form WKV_DECAY_EXP_NEG_EXP, not %d", (int)p->decay_form);
        return WKV_ERROR_UNSUPPORTED;
    }
    return WKV_OK;
}

/* The forward's state sequence is the checkpoint pass's (the same step on the same values). */
bool saves(const wkv_problem*) { return true; }

} // namespace

const OpDesc kRwkv4Op = {
    "RWKV-4", K, /* by_channel */ true, check, items_per_seq, forward_chunk_floats,
    forward_item, backward_sizes, backward_item, backward_reduce,
    /* forward_group: 1 */ nullptr, backward_group, saves,
};

} // namespace wkv_cpu
