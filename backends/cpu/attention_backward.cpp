/* The backward of softmax attention on the CPU (wkv.h, wkv_attention_backward), in the flash
 * form: P is recomputed from the forward's lse one key block at a time, never stored whole.
 *
 * No item accumulates into memory another item writes (no atomics, no workspace, results
 * independent of the thread count). Two ways, chosen by the shape alone:
 *   - the single pass (single_item, below), when there are at least kSingleMinItems
 *     (sequence, kv head) items, or as many items of slices of a kv head's query heads (GQA,
 *     MQA: each slice's dk, dv summed in slice order afterwards), and their rows fit the
 *     scratch: 5 products of rows x keys x D;
 *   - three passes otherwise (few items, no heads to slice: MHA with B H < 8), parallel over
 *     key blocks and row tiles at the price of P and dS computed twice (7 products):
 *     0. delta = rowsum(dout * o) - dlse per (batch, query head, row).
 *     1. dk, dv: an item is (sequence, kv head, block of Bc keys). It packs its keys and values
 *        transposed once, then walks every query row (of each of the kv head's query heads)
 *        that sees one of its keys, Br rows at a time: P and dS of the rows against the block,
 *        then dk += dS^T q, dv += P^T dout, and stores its Bc rows of dk and dv.
 *     2. dq: an item is (sequence, query head, tile of Br rows), as in the forward. It walks
 *        the key blocks its rows see: P and dS again, then dq += dS k; dq *= scale at the end.
 * Measured: backends/cpu/DESIGN.md, "Attention backward".
 *
 * float32 arithmetic for every dtype; q is scaled when loaded, so dk needs no scale and dq one at
 * the end. A row whose lse is -inf (it saw no key) adds nothing; a key no row sees gets zeros. */
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "attention.h"
#include "tensor_access.h"

namespace wkv_cpu {
namespace {

constexpr int64_t kBr = 64;         /* query rows per group */
constexpr int64_t kBc = 64;         /* keys per block */
constexpr int64_t kDeltaRows = 256; /* rows per item of pass 0 */
/* The single pass (single_item) takes calls of at least this many (sequence, kv head) items
 * whose per-item scratch is at most kSingleMaxFloats floats (16 MiB: about 20,000 rows of
 * D = 64), with at most kSingleBudgetFloats floats (64 MiB) of scratch in all. */
constexpr int64_t kSingleMinItems = 8;
constexpr int64_t kSingleMaxFloats = int64_t(4) << 20;
constexpr int64_t kSingleBudgetFloats = int64_t(16) << 20;
/* Fewer (sequence, kv head) items than kSingleMinItems but several query heads per kv head
 * (GQA, MQA at small B): the items split the query heads into slices, each slice's dk and dv go
 * to a partial buffer of at most kSlicePartialFloats floats (256 MiB), summed in slice order. */
constexpr int64_t kSlicePartialFloats = int64_t(64) << 20;


/* Floats of one chunk's scratch at head dim D (both passes' layouts fit in it). */
int64_t chunk_floats(int64_t D) {
    const int64_t Dp = attn_padded_dim(D);
    return 2 * D * kBc /* kt, vt */ + 2 * kBc * Dp /* dk, dv (pass 1) or k rows (pass 2) */ +
           3 * kBr * Dp /* q, dout, dq */ + 2 * kBr /* lse, delta */ + 2 * kBr /* seen: int64 */ +
           2 * kBr * kBc /* p, ds */ + Dp /* a row in transit */;
}

/* ---- the scalar steps (attention.h's contracts) */

bool scalar_probs(const float* q, const float* dout, int64_t rows, int64_t Dp, int64_t D, const float* kt,
                  const float* vt, int64_t kt_stride, int64_t bc, const float* lse, const float* delta,
                  const int64_t* seen, float* p, float* ds) {
    for (int64_t r = 0; r < rows; ++r) {
        float* pr = p + r * bc;
        float* dr = ds + r * bc;
        for (int64_t j = 0; j < bc; ++j) pr[j] = dr[j] = 0.0f;
        const int64_t n = std::min(bc, seen[r]);
        if (n <= 0) continue;
        const float* qr = q + r * Dp;
        const float* gr = dout + r * Dp;
        for (int64_t d = 0; d < D; ++d) {
            const float qd = qr[d], gd = gr[d];
            const float* kd = kt + d * kt_stride;
            const float* vd = vt + d * kt_stride;
            for (int64_t j = 0; j < n; ++j) pr[j] += qd * kd[j], dr[j] += gd * vd[j];
        }
        for (int64_t j = 0; j < n; ++j) {
            pr[j] = std::exp(pr[j] - lse[r]);
            dr[j] = pr[j] * (dr[j] - delta[r]);
        }
    }
    return true;
}

bool scalar_kv(const float* q, const float* dout, int64_t rows, int64_t Dp, const float* p, const float* ds,
               int64_t bc, float* dkt, float* dvt) {
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t d = 0; d < Dp; ++d) {
            const float qd = q[r * Dp + d], gd = dout[r * Dp + d];
            float* kd = dkt + d * bc;
            float* vd = dvt + d * bc;
            for (int64_t j = 0; j < bc; ++j) kd[j] += ds[r * bc + j] * qd, vd[j] += p[r * bc + j] * gd;
        }
    return true;
}

bool scalar_q(const float* ds, int64_t rows, int64_t Dp, const float* krows, int64_t nb, int64_t bc, float* dq) {
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < nb; ++j) {
            const float sj = ds[r * bc + j];
            for (int64_t d = 0; d < Dp; ++d) dq[r * Dp + d] += sj * krows[j * Dp + d];
        }
    return true;
}

/* ---- the passes */

struct BwdJob {
    const wkv_attention_backward_problem* p;
    AttnBwdFns fns;
    float* delta; /* [B][Hq][Tq] */
    const int64_t* q_tiles_before; /* [num_seqs + 1]: pass 2's query tiles before sequence s */
    const int64_t* k_blocks_before; /* [num_seqs + 1]: pass 1's key blocks before sequence s */
    int64_t items, chunks;
    float* scratch; /* chunk c at scratch + c * floats */
    int64_t floats;
    int64_t single_rows; /* the single pass: rows of the packed q, dout, dq per chunk */
    int64_t slices;      /* the single pass: query-head slices per kv head (1: dk, dv stored directly) */
    float* partial;      /* slices > 1: [slices][B * Tk][Hkv][2][D] dk, dv of each slice */
};

struct Scratch {
    float *kt, *vt, *kbuf, *q, *dout, *dq, *lse, *delta, *p, *ds, *row;
    int64_t* seen;
    explicit Scratch(float* m, int64_t D) {
        const int64_t Dp = attn_padded_dim(D);
        kt = m, vt = kt + D * kBc, kbuf = vt + D * kBc;
        q = kbuf + 2 * kBc * Dp, dout = q + kBr * Dp, dq = dout + kBr * Dp;
        lse = dq + kBr * Dp, delta = lse + kBr;
        seen = reinterpret_cast<int64_t*>(delta + kBr); /* 8-byte aligned: every offset above is even */
        p = reinterpret_cast<float*>(seen + kBr), ds = p + kBr * kBc, row = ds + kBr * kBc;
    }
};

/* Keys [j0, j0 + nb) of kv head g: rows of dk and dv from their transposed accumulators. */
void store_kv(const BwdJob& job, int64_t b, int64_t g, int64_t j0, int64_t nb, const float* dkt, const float* dvt,
              float* row) {
    const int64_t D = job.p->fwd.D;
    for (int64_t j = 0; j < nb; ++j) {
        for (int64_t d = 0; d < D; ++d) row[d] = dkt[d * kBc + j];
        store_row(job.p->dk, view_offset(job.p->dk, b, j0 + j, g), D, row);
        for (int64_t d = 0; d < D; ++d) row[d] = dvt[d * kBc + j];
        store_row(job.p->dv, view_offset(job.p->dv, b, j0 + j, g), D, row);
    }
}

/* store_kv's rows into slice sl's partial dk, dv (slices > 1). */
void store_kv_partial(const BwdJob& job, int64_t sl, int64_t b, int64_t g, int64_t j0, int64_t nb, const float* dkt,
                      const float* dvt) {
    const wkv_attention_problem& f = job.p->fwd;
    const int64_t D = f.D;
    for (int64_t j = 0; j < nb; ++j) {
        float* out = job.partial + (((sl * f.B + b) * f.Tk + j0 + j) * f.Hkv + g) * 2 * D;
        for (int64_t d = 0; d < D; ++d) out[d] = dkt[d * kBc + j], out[D + d] = dvt[d * kBc + j];
    }
}

/* The keys and values [j0, j0 + nb) of kv head g, transposed into kt, vt (columns past nb zero),
 * and the keys as rows into krows when it is not NULL. */
void pack_block(const wkv_attention_problem& f, int64_t b, int64_t g, int64_t j0, int64_t nb, Scratch& s,
                float* krows) {
    const int64_t D = f.D, Dp = attn_padded_dim(D);
    for (int64_t j = 0; j < kBc; ++j) {
        if (j >= nb) {
            for (int64_t d = 0; d < D; ++d) s.kt[d * kBc + j] = s.vt[d * kBc + j] = 0.0f;
            continue;
        }
        load_row(f.k, view_offset(f.k, b, j0 + j, g), D, s.row);
        for (int64_t d = 0; d < D; ++d) s.kt[d * kBc + j] = s.row[d];
        if (krows) {
            std::memcpy(krows + j * Dp, s.row, sizeof(float) * (size_t)D);
            std::memset(krows + j * Dp + D, 0, sizeof(float) * (size_t)(Dp - D));
        }
        load_row(f.v, view_offset(f.v, b, j0 + j, g), D, s.row);
        for (int64_t d = 0; d < D; ++d) s.vt[d * kBc + j] = s.row[d];
    }
}

/* Query row t of head h into slot r: q scaled, dout, lse and delta (zeros past D). */
void load_query(const BwdJob& job, int64_t b, int64_t t, int64_t h, int64_t r, Scratch& s) {
    const wkv_attention_problem& f = job.p->fwd;
    const int64_t D = f.D, Dp = attn_padded_dim(D);
    float* q = s.q + r * Dp;
    float* g = s.dout + r * Dp;
    load_row(f.q, view_offset(f.q, b, t, h), D, q);
    for (int64_t d = 0; d < D; ++d) q[d] *= f.scale;
    load_row(job.p->dout, view_offset(job.p->dout, b, t, h), D, g);
    for (int64_t d = D; d < Dp; ++d) q[d] = g[d] = 0.0f;
    std::memcpy(&s.lse[r], f.lse.data + 4 * view_offset(f.lse, b, t, h), 4);
    s.delta[r] = job.delta[(b * f.Hq + h) * f.Tq + t];
}

/* The keys of row t that the block [j0, j0 + nb) holds, counted from j0 (<= 0: none). */
int64_t seen_in_block(const wkv_attention_problem& f, int64_t t, int64_t q0, int64_t q1, int64_t k0, int64_t k1,
                      int64_t j0, int64_t nb, float lse) {
    if (lse == -std::numeric_limits<float>::infinity()) return 0;
    const int64_t last = f.causal ? std::min(k1 - 1, k0 + (t - q0) + ((k1 - k0) - (q1 - q0))) : k1 - 1;
    return std::min(nb, last - j0 + 1);
}

void probs(const BwdJob& job, int64_t rows, int64_t D, Scratch& s) {
    const int64_t Dp = attn_padded_dim(D);
    if (!job.fns.probs ||
        !job.fns.probs(s.q, s.dout, rows, Dp, D, s.kt, s.vt, kBc, kBc, s.lse, s.delta, s.seen, s.p, s.ds))
        scalar_probs(s.q, s.dout, rows, Dp, D, s.kt, s.vt, kBc, kBc, s.lse, s.delta, s.seen, s.p, s.ds);
}

void delta_chunk(void* data, int64_t begin, int64_t end) {
    const BwdJob& job = *static_cast<const BwdJob*>(data);
    const wkv_attention_problem& f = job.p->fwd;
    const int64_t rows = f.B * f.Tq * f.Hq, D = f.D;
    float o[kAttnMaxHeadDim], g[kAttnMaxHeadDim];
    for (int64_t i = begin; i < end; ++i)
        for (int64_t x = i * kDeltaRows; x < std::min(rows, (i + 1) * kDeltaRows); ++x) {
            const int64_t h = x % f.Hq, t = (x / f.Hq) % f.Tq, b = x / (f.Hq * f.Tq);
            load_row(f.o, view_offset(f.o, b, t, h), D, o);
            load_row(job.p->dout, view_offset(job.p->dout, b, t, h), D, g);
            float sum = 0.0f;
            for (int64_t d = 0; d < D; ++d) sum += o[d] * g[d];
            if (job.p->dlse.data) { /* d lse_i / d s_j = p_j: dlse_i joins delta */
                float dl;
                std::memcpy(&dl, job.p->dlse.data + 4 * view_offset(job.p->dlse, b, t, h), 4);
                sum -= dl;
            }
            job.delta[(b * f.Hq + h) * f.Tq + t] = sum;
        }
}

/* Pass 1: item = (key block over all sequences) * Hkv + kv head. */
void kv_item(const BwdJob& job, int64_t item, Scratch& s) {
    const wkv_attention_problem& f = job.p->fwd;
    const int64_t D = f.D, Dp = attn_padded_dim(D), g = item % f.Hkv, blk = item / f.Hkv, group = f.Hq / f.Hkv;
    const int64_t sq = std::upper_bound(job.k_blocks_before, job.k_blocks_before + f.num_seqs + 1, blk) -
                       job.k_blocks_before - 1;
    int64_t b, q0, q1, k0, k1;
    wkv_attention_sequence(&f, sq, &b, &q0, &q1, &k0, &k1);
    const int64_t j0 = k0 + (blk - job.k_blocks_before[sq]) * kBc, nb = std::min(kBc, k1 - j0);
    pack_block(f, b, g, j0, nb, s, nullptr);
    float* dk = s.kbuf;
    float* dv = s.kbuf + kBc * Dp;
    std::memset(dk, 0, sizeof(float) * (size_t)(2 * kBc * Dp));
    /* the first row that sees key j0: causal rows see keys up to k0 + (t - q0) + shift */
    int64_t t0 = q0;
    if (f.causal) t0 = std::max(q0, q0 + (j0 - k0) - ((k1 - k0) - (q1 - q0)));
    for (int64_t h = g * group; h < (g + 1) * group; ++h)
        for (int64_t r0 = t0; r0 < q1; r0 += kBr) {
            const int64_t rows = std::min(kBr, q1 - r0);
            for (int64_t r = 0; r < rows; ++r) {
                load_query(job, b, r0 + r, h, r, s);
                s.seen[r] = seen_in_block(f, r0 + r, q0, q1, k0, k1, j0, nb, s.lse[r]);
            }
            probs(job, rows, D, s);
            if (!job.fns.kv || !job.fns.kv(s.q, s.dout, rows, Dp, s.p, s.ds, kBc, dk, dv))
                scalar_kv(s.q, s.dout, rows, Dp, s.p, s.ds, kBc, dk, dv);
        }
    store_kv(job, b, g, j0, nb, dk, dv, s.row);
}

/* Pass 2: item = (query tile over all sequences) * Hq + head. */
void q_item(const BwdJob& job, int64_t item, Scratch& s) {
    const wkv_attention_problem& f = job.p->fwd;
    const int64_t D = f.D, Dp = attn_padded_dim(D), h = item % f.Hq, tile = item / f.Hq, g = h / (f.Hq / f.Hkv);
    const int64_t sq = std::upper_bound(job.q_tiles_before, job.q_tiles_before + f.num_seqs + 1, tile) -
                       job.q_tiles_before - 1;
    int64_t b, q0, q1, k0, k1;
    wkv_attention_sequence(&f, sq, &b, &q0, &q1, &k0, &k1);
    const int64_t r0 = q0 + (tile - job.q_tiles_before[sq]) * kBr, rows = std::min(kBr, q1 - r0);
    for (int64_t r = 0; r < rows; ++r) load_query(job, b, r0 + r, h, r, s);
    std::memset(s.dq, 0, sizeof(float) * (size_t)(rows * Dp));
    const int64_t shift = (k1 - k0) - (q1 - q0);
    const int64_t kend = f.causal ? std::min(k1, k0 + (r0 + rows - 1 - q0) + shift + 1) : k1;
    for (int64_t j0 = k0; j0 < kend; j0 += kBc) {
        const int64_t nb = std::min(kBc, kend - j0);
        pack_block(f, b, g, j0, nb, s, s.kbuf);
        for (int64_t r = 0; r < rows; ++r) s.seen[r] = seen_in_block(f, r0 + r, q0, q1, k0, k1, j0, nb, s.lse[r]);
        probs(job, rows, D, s);
        if (!job.fns.q || !job.fns.q(s.ds, rows, Dp, s.kbuf, nb, kBc, s.dq))
            scalar_q(s.ds, rows, Dp, s.kbuf, nb, kBc, s.dq);
    }
    for (int64_t r = 0; r < rows; ++r) {
        float* dq = s.dq + r * Dp;
        for (int64_t d = 0; d < D; ++d) dq[d] *= f.scale;
        store_row(job.p->dq, view_offset(job.p->dq, b, r0 + r, h), D, dq);
    }
}

/* ---- the single pass: item = (sequence, kv head), everything of it on one thread
 *
 * The kv head's query rows (of each of its query heads) are packed once: q scaled, dout, lse
 * and delta (pass 0 folded in), with a float32 dq accumulator per row. Then per key block: K and
 * V packed (transposed, and K as rows), and for the rows that see the block P and dS once, then
 * dk += dS^T q, dv += P^T dout and dq += dS K: 5 products instead of the passes' 7, and no row
 * loaded more than once. dk and dv are stored after their block, dq at the end. */

struct SingleLayout {
    int64_t rows;   /* the longest sequence's rows times the query heads per kv head */
    int64_t floats; /* per chunk */
};

SingleLayout single_layout(const wkv_attention_problem& f, int64_t longest_q, int64_t slices) {
    const int64_t Dp = attn_padded_dim(f.D), group = f.Hq / f.Hkv;
    SingleLayout l;
    l.rows = (longest_q * ((group + slices - 1) / slices) + 15) / 16 * 16; /* every region 64-byte aligned for the vector steps */
    l.floats = 3 * l.rows * Dp /* q, dout, dq */ + 2 * l.rows /* lse, delta */ + chunk_floats(f.D);
    return l;
}

void single_item(const BwdJob& job, int64_t item, float* m) {
    const wkv_attention_problem& f = job.p->fwd;
    const int64_t D = f.D, Dp = attn_padded_dim(D), group = f.Hq / f.Hkv;
    const int64_t sl = item % job.slices, g = item / job.slices % f.Hkv, sq = item / job.slices / f.Hkv;
    const int64_t h_lo = sl * group / job.slices, h_hi = (sl + 1) * group / job.slices; /* this slice's heads */
    int64_t b, q0, q1, k0, k1;
    wkv_attention_sequence(&f, sq, &b, &q0, &q1, &k0, &k1);
    const int64_t T = q1 - q0, R = T * (h_hi - h_lo);
    float* Q = m;
    float* G = Q + job.single_rows * Dp;
    float* DQ = G + job.single_rows * Dp;
    float* LSE = DQ + job.single_rows * Dp;
    float* DELTA = LSE + job.single_rows;
    Scratch s(DELTA + job.single_rows, D);
    /* row x = (h - g * group - h_lo) * T + (t - q0) */
    for (int64_t hh = h_lo; hh < h_hi; ++hh)
        for (int64_t t = q0; t < q1; ++t) {
            const int64_t h = g * group + hh, x = (hh - h_lo) * T + (t - q0);
            float* q = Q + x * Dp;
            float* gr = G + x * Dp;
            load_row(f.q, view_offset(f.q, b, t, h), D, q);
            for (int64_t d = 0; d < D; ++d) q[d] *= f.scale;
            load_row(job.p->dout, view_offset(job.p->dout, b, t, h), D, gr);
            for (int64_t d = D; d < Dp; ++d) q[d] = gr[d] = 0.0f;
            load_row(f.o, view_offset(f.o, b, t, h), D, s.row);
            float sum = 0.0f;
            for (int64_t d = 0; d < D; ++d) sum += s.row[d] * gr[d];
            if (job.p->dlse.data) {
                float dl;
                std::memcpy(&dl, job.p->dlse.data + 4 * view_offset(job.p->dlse, b, t, h), 4);
                sum -= dl;
            }
            DELTA[x] = sum;
            std::memcpy(&LSE[x], f.lse.data + 4 * view_offset(f.lse, b, t, h), 4);
        }
    std::memset(DQ, 0, sizeof(float) * (size_t)(R * Dp));
    const int64_t shift = (k1 - k0) - (q1 - q0);
    for (int64_t j0 = k0; j0 < k1; j0 += kBc) {
        const int64_t nb = std::min(kBc, k1 - j0);
        pack_block(f, b, g, j0, nb, s, s.q); /* K as rows where the passes keep q */
        float* dk = s.kbuf;
        float* dv = s.kbuf + kBc * Dp;
        std::memset(dk, 0, sizeof(float) * (size_t)(2 * kBc * Dp));
        const int64_t t0 = f.causal ? std::max(q0, q0 + (j0 - k0) - shift) : q0;
        for (int64_t hh = h_lo; hh < h_hi; ++hh)
            for (int64_t r0 = t0; r0 < q1; r0 += kBr) {
                const int64_t rows = std::min(kBr, q1 - r0), x0 = (hh - h_lo) * T + (r0 - q0);
                for (int64_t r = 0; r < rows; ++r)
                    s.seen[r] = seen_in_block(f, r0 + r, q0, q1, k0, k1, j0, nb, LSE[x0 + r]);
                const float* q = Q + x0 * Dp;
                const float* gr = G + x0 * Dp;
                if (!job.fns.probs || !job.fns.probs(q, gr, rows, Dp, D, s.kt, s.vt, kBc, kBc, LSE + x0, DELTA + x0,
                                                     s.seen, s.p, s.ds))
                    scalar_probs(q, gr, rows, Dp, D, s.kt, s.vt, kBc, kBc, LSE + x0, DELTA + x0, s.seen, s.p, s.ds);
                if (!job.fns.kv || !job.fns.kv(q, gr, rows, Dp, s.p, s.ds, kBc, dk, dv))
                    scalar_kv(q, gr, rows, Dp, s.p, s.ds, kBc, dk, dv);
                float* dq = DQ + x0 * Dp;
                if (!job.fns.q || !job.fns.q(s.ds, rows, Dp, s.q, nb, kBc, dq))
                    scalar_q(s.ds, rows, Dp, s.q, nb, kBc, dq);
            }
        if (job.slices > 1) store_kv_partial(job, sl, b, g, j0, nb, dk, dv);
        else store_kv(job, b, g, j0, nb, dk, dv, s.row);
    }
    for (int64_t hh = h_lo; hh < h_hi; ++hh)
        for (int64_t t = q0; t < q1; ++t) {
            float* dq = DQ + ((hh - h_lo) * T + (t - q0)) * Dp;
            for (int64_t d = 0; d < D; ++d) dq[d] *= f.scale;
            store_row(job.p->dq, view_offset(job.p->dq, b, t, g * group + hh), D, dq);
        }
}

void single_chunk(void* data, int64_t begin, int64_t end) {
    const BwdJob& job = *static_cast<const BwdJob*>(data);
    for (int64_t c = begin; c < end; ++c) {
        int64_t i0, i1;
        chunk_items(job.items, job.chunks, c, &i0, &i1);
        for (int64_t i = i0; i < i1; ++i) single_item(job, i, job.scratch + c * job.floats);
    }
}

/* slices > 1: dk, dv of key rows [begin, end) of B * Tk * Hkv, the slices summed in order. */
void slice_sum_chunk(void* data, int64_t begin, int64_t end) {
    const BwdJob& job = *static_cast<const BwdJob*>(data);
    const wkv_attention_problem& f = job.p->fwd;
    const int64_t D = f.D, rows = f.B * f.Tk * f.Hkv;
    float* sum = job.scratch; /* unused by now: the items have finished */
    for (int64_t c = begin; c < end; ++c) {
        int64_t i0, i1;
        chunk_items(rows, job.chunks, c, &i0, &i1);
        float* acc = sum + c * 2 * D;
        for (int64_t i = i0; i < i1; ++i) {
            for (int64_t d = 0; d < 2 * D; ++d) acc[d] = 0.0f;
            for (int64_t sl = 0; sl < job.slices; ++sl) {
                const float* pr = job.partial + (sl * rows + i) * 2 * D;
                for (int64_t d = 0; d < 2 * D; ++d) acc[d] += pr[d];
            }
            const int64_t g = i % f.Hkv, j = i / f.Hkv % f.Tk, b = i / f.Hkv / f.Tk;
            store_row(job.p->dk, view_offset(job.p->dk, b, j, g), D, acc);
            store_row(job.p->dv, view_offset(job.p->dv, b, j, g), D, acc + D);
        }
    }
}

template <void (*Item)(const BwdJob&, int64_t, Scratch&)>
void item_chunk(void* data, int64_t begin, int64_t end) {
    const BwdJob& job = *static_cast<const BwdJob*>(data);
    for (int64_t c = begin; c < end; ++c) {
        int64_t i0, i1;
        chunk_items(job.items, job.chunks, c, &i0, &i1);
        Scratch s(job.scratch + c * job.floats, job.p->fwd.D);
        for (int64_t i = i0; i < i1; ++i) Item(job, i, s);
    }
}

void run_pass(const BackendState& st, BwdJob& job, int64_t items, void (*chunk)(void*, int64_t, int64_t),
              int64_t max_chunks) {
    job.items = items;
    job.chunks = std::min(chunk_count(&st, items), max_chunks);
    if (items == 0) return;
    if (st.args.own_pool && job.chunks <= 1)
        chunk(&job, 0, job.chunks);
    else
        st.args.parallel_for(st.args.parallel_for_user_data, job.chunks, chunk, &job);
}

} // namespace

wkv_status attention_backward(const BackendState& st, const AttnBwdFns& fns, const wkv_attention_backward_problem* p,
                              wkv_message* msg) noexcept {
    const wkv_attention_problem& f = p->fwd;
    if (f.D > kAttnMaxHeadDim) {
        set_message(msg, "attention head dim D = %lld: this backend takes D <= %lld", (long long)f.D,
                    (long long)kAttnMaxHeadDim);
        return WKV_ERROR_UNSUPPORTED;
    }
    CheckedSize cs;
    int64_t q_tiles = 0, k_blocks = 0, longest_q = 0;
    for (int64_t sq = 0; sq < f.num_seqs; ++sq) {
        int64_t b, q0, q1, k0, k1;
        wkv_attention_sequence(&f, sq, &b, &q0, &q1, &k0, &k1);
        q_tiles += (q1 - q0 + kBr - 1) / kBr;
        k_blocks += (k1 - k0 + kBc - 1) / kBc;
        longest_q = std::max(longest_q, q1 - q0);
    }
    /* The single pass when the shape alone says it is parallel enough and its per-item rows fit
     * (the choice never depends on the thread count, so neither do the bits) */
    const int64_t group = f.Hq / f.Hkv, kv_items = f.num_seqs * f.Hkv;
    int64_t slices = 1;
    if (kv_items > 0 && kv_items < kSingleMinItems && group > 1) {
        slices = std::min(group, (kSingleMinItems + kv_items - 1) / kv_items);
        if (slices * 2 * f.B * f.Tk * f.Hkv * f.D > kSlicePartialFloats) slices = 1; /* the three passes */
    }
    const SingleLayout single = single_layout(f, longest_q, slices);
    const int64_t single_items = kv_items * slices;
    if (single_items >= kSingleMinItems && single.floats <= kSingleMaxFloats) {
        BwdJob job;
        job.p = p;
        job.fns = fns;
        job.floats = single.floats;
        job.single_rows = single.rows;
        job.slices = slices;
        job.items = single_items;
        job.chunks = std::min(chunk_count(&st, single_items), std::max<int64_t>(1, kSingleBudgetFloats / single.floats));
        const uint64_t partial_floats = slices > 1 ? (uint64_t)(slices * 2 * f.B * f.Tk * f.Hkv * f.D) : 0;
        const uint64_t bytes = cs.mul(cs.add(cs.mul((uint64_t)job.chunks, (uint64_t)single.floats), partial_floats), 4);
        job.scratch = cs.overflow ? nullptr : static_cast<float*>(st.scratch((size_t)bytes));
        job.partial = job.scratch ? job.scratch + job.chunks * single.floats : nullptr;
        if (!job.scratch) {
            set_message(msg, "out of memory for %llu bytes of attention backward scratch", (unsigned long long)bytes);
            return WKV_ERROR_OUT_OF_MEMORY;
        }
        const wkv_fault_hook fault = wkv_fault_hook_from(&st.args);
        if (wkv_fault_hit(&fault, WKV_FAULT_DEVICE_LOST, "submit")) {
            set_message(msg, "the device was lost (fault injection)");
            return WKV_ERROR_DEVICE_LOST;
        }
        if (st.args.own_pool && job.chunks <= 1) single_chunk(&job, 0, job.chunks);
        else st.args.parallel_for(st.args.parallel_for_user_data, job.chunks, single_chunk, &job);
        if (slices > 1) { /* the slices' dk, dv summed; job.chunks * 2 D floats of sums fit the chunks' scratch */
            const int64_t rows = f.B * f.Tk * f.Hkv;
            job.chunks = std::min(job.chunks, std::max<int64_t>(1, rows));
            if (st.args.own_pool && job.chunks <= 1) slice_sum_chunk(&job, 0, job.chunks);
            else if (rows > 0) st.args.parallel_for(st.args.parallel_for_user_data, job.chunks, slice_sum_chunk, &job);
        }
        return WKV_OK;
    }
    const uint64_t prefix_bytes = cs.align_up(cs.mul(2 * ((uint64_t)f.num_seqs + 1), sizeof(int64_t)), 64);
    const uint64_t delta_bytes = cs.align_up(cs.mul(cs.mul(cs.mul((uint64_t)f.B, (uint64_t)f.Hq), (uint64_t)f.Tq), 4), 64);
    const int64_t floats = chunk_floats(f.D);
    const int64_t max_chunks = chunk_count(&st, std::max<int64_t>({q_tiles * f.Hq, k_blocks * f.Hkv, 1}));
    const uint64_t total = cs.add(cs.add(prefix_bytes, delta_bytes), cs.mul(cs.mul((uint64_t)max_chunks, (uint64_t)floats), 4));
    char* mem = cs.overflow ? nullptr : static_cast<char*>(st.scratch((size_t)total));
    if (!mem) {
        set_message(msg, "out of memory for %llu bytes of attention backward scratch", (unsigned long long)total);
        return WKV_ERROR_OUT_OF_MEMORY;
    }
    int64_t* q_before = reinterpret_cast<int64_t*>(mem);
    int64_t* k_before = q_before + f.num_seqs + 1;
    q_before[0] = k_before[0] = 0;
    for (int64_t sq = 0; sq < f.num_seqs; ++sq) {
        int64_t b, q0, q1, k0, k1;
        wkv_attention_sequence(&f, sq, &b, &q0, &q1, &k0, &k1);
        q_before[sq + 1] = q_before[sq] + (q1 - q0 + kBr - 1) / kBr;
        k_before[sq + 1] = k_before[sq] + (k1 - k0 + kBc - 1) / kBc;
    }
    BwdJob job;
    job.p = p;
    job.fns = fns;
    job.delta = reinterpret_cast<float*>(mem + prefix_bytes);
    job.q_tiles_before = q_before;
    job.k_blocks_before = k_before;
    job.scratch = reinterpret_cast<float*>(mem + prefix_bytes + delta_bytes);
    job.floats = floats;
    const wkv_fault_hook fault = wkv_fault_hook_from(&st.args);
    if (wkv_fault_hit(&fault, WKV_FAULT_DEVICE_LOST, "submit")) {
        set_message(msg, "the device was lost (fault injection)");
        return WKV_ERROR_DEVICE_LOST;
    }
    /* pass 0 items are rows, not chunks of scratch: parallel_for over them directly */
    const int64_t delta_items = (f.B * f.Tq * f.Hq + kDeltaRows - 1) / kDeltaRows;
    if (delta_items > 0) st.args.parallel_for(st.args.parallel_for_user_data, delta_items, delta_chunk, &job);
    run_pass(st, job, k_blocks * f.Hkv, item_chunk<kv_item>, max_chunks);
    run_pass(st, job, q_tiles * f.Hq, item_chunk<q_item>, max_chunks);
    return WKV_OK;
}

} // namespace wkv_cpu
