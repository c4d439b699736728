/* The scaffolding every CPU op (rwkv7.cpp, rwkv6.cpp, rwkv4.cpp) shares, so that an op file
 * holds only its own math: how many work items a problem has, the forward's scratch, the
 * backward's workspace (layout, checked sizes, packed-sequence prefix sums), the parallel_for
 * tasks over chunks of items, and the messages. An op describes itself with an OpDesc (its
 * sizes and its per-item functions); run_forward / backward_workspace_size / run_backward do
 * the rest. Internal to backends/cpu/.
 *
 * FORWARD SCRATCH (bytes): 64 (to align the base) + chunks * A64(4 * forward_chunk_floats),
 * allocated (malloc) before anything is written, so an allocation failure leaves every output
 * untouched, and kept by the context for its next call (BackendState::scratch: it grows to the
 * largest forward the context has run and is freed with it). Chunk c's scratch starts at
 * base + c * A64(...).
 *
 * BACKWARD WORKSPACE (bytes), from its 64-byte aligned base:
 *   64                                                  (to align the base to 64 bytes)
 *   + A64(8 * (num_seqs + 1))      if packed, else 0    (segment prefix sums)
 *   + A64(4 * ckpt_floats)                              (checkpoints)
 *   + A64(4 * part_floats)                              (per-item partial sums; 0 if none)
 *   + chunks * A64(4 * chunk_floats)                    (one scratch region per chunk)
 * where A64(x) rounds x up to a multiple of 64, chunks = chunk_count(items) (cpu_internal.h),
 * and the op gives ckpt_floats, part_floats and chunk_floats (backward_sizes). Computed in
 * checked 64-bit arithmetic; WKV_ERROR_OVERFLOW if it does not fit in size_t.
 *
 * Checkpoints: a sequence of L tokens has G = ceil(L / K) segments of K tokens (K the op's
 * checkpoint interval); the segments of every sequence are numbered consecutively (sequence
 * s starts at BackwardJob::first_segment(s)), so the checkpoint region holds, per item, G
 * states of its sequence. Where the region is does not depend on the thread count (only the
 * chunk regions after it do), so a forward that saves checkpoints (wkv_problem.
 * save_checkpoints) writes the prefix sums and the checkpoints at the same places in the same
 * workspace, and the backward that reuses them (reuse_checkpoints) skips its checkpoint pass. */
#ifndef WKV_BACKENDS_CPU_OP_COMMON_H
#define WKV_BACKENDS_CPU_OP_COMMON_H

#include <cstddef>
#include <cstdint>

#include "backend.h"
#include "cpu_internal.h"
#include "tensor_access.h"

namespace wkv_cpu {

/* Alignment of the scratch/workspace base and of every region in it, in bytes. */
constexpr uint64_t kAlign = 64;

/* Segments of K tokens in a sequence of len tokens: ceil(len / K). */
constexpr int64_t segment_count(int64_t len, int64_t K) noexcept { return (len + K - 1) / K; }

/* Where the backward's regions are (offsets from the aligned base, in bytes). */
struct BackwardLayout {
    int64_t items = 0, chunks = 0;
    int64_t group = 1; /* units per item (OpDesc::backward_group) */
    int64_t replay_states = 0; /* the op's R (BackwardSizes::replay_states) */
    uint64_t prefix_off = 0, ckpt_off = 0, part_off = 0, chunk_off = 0;
    uint64_t chunk_bytes = 0;
    uint64_t total = 0; /* including the alignment slack */
};

/* What the shared planner hands the op to size its regions. */
struct BackwardShape {
    uint64_t items;    /* num_seqs * ceil(items_per_seq / group) (checked) */
    int64_t group;     /* units per item (OpDesc::backward_group; 1 without) */
    uint64_t segments; /* G: the sum over sequences of ceil(L_s / K) (checked) */
    int64_t max_len;   /* the longest sequence, in tokens */
};

/* The op's backward regions, in floats (computed in the planner's CheckedSize). */
struct BackwardSizes {
    int64_t replay_states = 0; /* replay states per chunk, for the op's own use */
    uint64_t ckpt_floats = 0;
    uint64_t part_floats = 0; /* partial sums reduced after every item (0: none) */
    uint64_t chunk_floats = 0;
};

struct OpDesc;

/* What a backward item sees: the problem and the carved workspace. */
struct BackwardJob {
    const wkv_problem* p;
    const OpDesc* op;
    BackwardLayout layout;
    const int64_t* seg_prefix; /* packed: first segment of each sequence; else NULL */
    float* ckpt;
    float* part; /* the partial sums (part_floats of them) */
    char* chunks;

    /* The number of the first checkpoint segment of sequence s. */
    int64_t first_segment(int64_t s) const noexcept;
};

/* One op, as the shared scaffolding needs it. */
struct OpDesc {
    const char* name;            /* "RWKV-7": for messages */
    int64_t checkpoint_interval; /* K */
    bool by_channel;             /* messages give the shape as C (RWKV-4), not H and N */
    /* WKV_OK, or why the problem is not for this op (checked before forward and backward). */
    wkv_status (*check)(const wkv_problem* p, wkv_message* msg);
    /* Work items per sequence; items are numbered s * items_per_seq + i. */
    uint64_t (*items_per_seq)(const wkv_problem* p);
    /* Floats of forward scratch per chunk, for forward items of `group` units (below). */
    uint64_t (*forward_chunk_floats)(const wkv_problem* p, int64_t group, CheckedSize& c);
    /* Computes forward item `item`: units [g * group, min((g + 1) * group, items_per_seq))
     * of sequence s, where item = s * ceil(items_per_seq / group) + g; scratch is the chunk's
     * (64-byte aligned). save (only where saves() said yes; else NULL): also write the item's
     * checkpoints into save->ckpt, exactly as backward_item's checkpoint pass would
     * (save->first_segment() works; its chunks and part are not for the forward). */
    void (*forward_item)(const wkv_problem* p, int64_t group, int64_t item, float* scratch,
                         const BackwardJob* save);
    /* The op's backward regions. */
    BackwardSizes (*backward_sizes)(const wkv_problem* p, const BackwardShape& shape,
                                    CheckedSize& c);
    void (*backward_item)(const BackwardJob* job, int64_t item, float* scratch);
    /* Runs once after every item (e.g. sums the partials in a fixed order); may be NULL. */
    void (*backward_reduce)(const BackwardJob* job);
    /* How many units (of items_per_seq; heads, say) one forward item walks together, for
     * `threads` workers: >= 1. NULL = 1 (the forward's items are the backward's). An op whose
     * units are independent gives the same results for every group. */
    int64_t (*forward_group)(const wkv_problem* p, int64_t threads);
    /* The same for the backward: item = s * ceil(items_per_seq / group) + g walks units
     * [g * group, ...) of sequence s. NULL = 1. */
    int64_t (*backward_group)(const wkv_problem* p, int64_t threads);
    /* Whether forward_item can save the checkpoints of p's backward (wkv_problem.
     * save_checkpoints) with results bit-identical to the backward's own pass; when it does,
     * backward_item skips that pass where p->reuse_checkpoints is set. NULL = never. */
    bool (*saves)(const wkv_problem* p);
};

wkv_status run_forward(const BackendState* st, const wkv_problem* p, const OpDesc& op,
                       wkv_message* msg);
wkv_status backward_workspace_size(const BackendState* st, const wkv_problem* p,
                                   const OpDesc& op, size_t* out_bytes, wkv_message* msg);
wkv_status run_backward(const BackendState* st, const wkv_problem* p, const OpDesc& op,
                        wkv_message* msg);
/* Whether the op saves checkpoints for p on this path (OpDesc::saves). */
bool op_saves(const wkv_problem* p, const OpDesc& op);

/* ---- helpers for the ops with an N x N state per head (RWKV-7, RWKV-6) ---- */

/* Inner loops run over j in blocks of kLanes with a scalar tail; every sum over j keeps
 * kLanes partial sums (lane u takes j = u, u + kLanes, ...; the tail continues from lane 0)
 * combined by lanes_sum(). The order is fixed by the code, not by the thread count, and the
 * fixed-size blocks let the compiler vectorize at -O2 without runtime alias checks. */
constexpr int64_t kLanes = 8;

inline float lanes_sum(const float* acc) noexcept {
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

/* Their check: any decay form decay_row() knows. */
wkv_status check_decay_form(const wkv_problem* p, wkv_message* msg);

/* One unit per (sequence, head): item = s * H + h (with forward groups of 1). */
uint64_t items_per_head(const wkv_problem* p);

/* The per-token rows both read: r w k v, and the decay made from w. */
struct HeadRows {
    float *r, *w, *k, *v, *decay;
};

/* r w k v at rows[0 .. 4N), the decay at rows[decay_at * N ..). */
inline HeadRows carve_head_rows(float* rows, int64_t N, int64_t decay_at) noexcept {
    HeadRows x;
    x.r = rows;
    x.w = rows + N;
    x.k = rows + 2 * N;
    x.v = rows + 3 * N;
    x.decay = rows + decay_at * N;
    return x;
}

/* Loads w k v (and r when `with_r`) of token (batch, t, h) and computes the decay (and, when
 * ddw is not NULL, ddw = d decay / d w) for the problem's decay form. */
inline void load_head_rows(const wkv_problem* p, int64_t batch, int64_t t, int64_t h,
                           bool with_r, const HeadRows& x, float* ddw) noexcept {
    const int64_t N = p->N;
    if (with_r) load_token(p->r, batch, t, h, N, x.r);
    load_token(p->w, batch, t, h, N, x.w);
    load_token(p->k, batch, t, h, N, x.k);
    load_token(p->v, batch, t, h, N, x.v);
    decay_row(p->decay_form, x.w, x.decay, ddw, N);
}

/* The floats of `matrices` N x N matrices and `rows` rows of N (checked). */
inline uint64_t matrices_and_rows(const wkv_problem* p, uint64_t matrices, uint64_t rows,
                                  CheckedSize& c) noexcept {
    const uint64_t N = (uint64_t)p->N;
    return c.add(c.mul(matrices, c.mul(N, N)), c.mul(rows, N));
}

} // namespace wkv_cpu

#endif
