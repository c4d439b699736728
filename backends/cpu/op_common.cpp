/* The scaffolding the CPU ops share: see op_common.h. */
#include "op_common.h"

#include <cstdint>
#include <cstdlib>

namespace wkv_cpu {
namespace {

inline char* align_ptr(void* ptr) noexcept {
    const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
    return reinterpret_cast<char*>((a + (kAlign - 1)) & ~(uintptr_t)(kAlign - 1));
}

/* num_seqs * items_per_seq; overflow (also past INT64_MAX) is flagged in c. */
uint64_t item_count(const wkv_problem* p, const OpDesc& op, CheckedSize& c,
                    int64_t group = 1) noexcept {
    const uint64_t units = op.items_per_seq(p);
    const uint64_t per_seq = group > 1 ? (units + (uint64_t)group - 1) / (uint64_t)group : units;
    const uint64_t items = c.mul((uint64_t)p->num_seqs, per_seq);
    if (items > (uint64_t)INT64_MAX) c.overflow = true;
    return items;
}

/* Below this many state-element updates (tokens x heads x N x N; tokens x C for RWKV-4) a
 * call runs on the caller's thread: under 4 token-heads at N = 64, a few microseconds, less than
 * what handing items to other threads costs (NOTES.md, step 12). */
constexpr uint64_t kInlineWork = 16384;

uint64_t call_work(const wkv_problem* p, const OpDesc& op) noexcept {
    CheckedSize c;
    const uint64_t tokens = p->seq_offsets ? (uint64_t)(p->seq_offsets[p->num_seqs] - p->seq_offsets[0])
                                           : c.mul((uint64_t)p->B, (uint64_t)p->T);
    const uint64_t per_token = c.mul((uint64_t)p->H, op.by_channel ? (uint64_t)p->N
                                                                    : c.mul((uint64_t)p->N, (uint64_t)p->N));
    const uint64_t w = c.mul(tokens, per_token);
    return c.overflow ? UINT64_MAX : w;
}

/* parallel_for over `chunks`, or (with the core's own pool) the whole range on this thread
 * when the work is small. */
void run_chunks(const BackendState* st, const wkv_problem* p, const OpDesc& op, int64_t chunks,
                wkv_task_fn task, void* job) noexcept {
    if (st->args.own_pool && (chunks <= 1 || call_work(p, op) < kInlineWork)) {
        task(job, 0, chunks);
        return;
    }
    st->args.parallel_for(st->args.parallel_for_user_data, chunks, task, job);
}

/* ------------------------------------------------------------------------------- forward */

struct ForwardJob {
    const wkv_problem* p;
    const OpDesc* op;
    const BackwardJob* save; /* where to save checkpoints, or NULL */
    char* scratch; /* chunk c at scratch + c * chunk_bytes */
    size_t chunk_bytes;
    int64_t group; /* units per item (OpDesc::forward_group) */
    int64_t items, chunks;
};

void forward_task(void* data, int64_t begin, int64_t end) noexcept {
    const ForwardJob* job = static_cast<const ForwardJob*>(data);
    for (int64_t c = begin; c < end; ++c) {
        float* scratch = reinterpret_cast<float*>(job->scratch + (size_t)c * job->chunk_bytes);
        int64_t i0, i1;
        chunk_items(job->items, job->chunks, c, &i0, &i1);
        for (int64_t item = i0; item < i1; ++item)
            job->op->forward_item(job->p, job->group, item, scratch, job->save);
    }
}

/* ------------------------------------------------------------------------------ backward */

wkv_status plan_backward(const BackendState* st, const wkv_problem* p, const OpDesc& op,
                         BackwardLayout* out, wkv_message* msg) noexcept {
    CheckedSize c;
    const int64_t K = op.checkpoint_interval;
    const bool packed = p->seq_offsets != nullptr;

    BackwardShape shape;
    shape.segments = 0;
    shape.max_len = 0;
    if (packed) {
        for (int64_t s = 0; s < p->num_seqs; ++s) {
            const int64_t len = p->seq_offsets[s + 1] - p->seq_offsets[s];
            shape.segments = c.add(shape.segments, (uint64_t)segment_count(len, K));
            if (len > shape.max_len) shape.max_len = len;
        }
    } else {
        shape.segments = c.mul((uint64_t)p->B, (uint64_t)segment_count(p->T, K));
        shape.max_len = p->T;
    }
    shape.group = op.backward_group ? op.backward_group(p, st->args.num_threads) : 1;
    if (shape.group < 1) shape.group = 1;
    shape.items = item_count(p, op, c, shape.group);

    BackwardLayout L;
    L.items = shape.items > (uint64_t)INT64_MAX ? 0 : (int64_t)shape.items;
    L.group = shape.group;
    L.chunks = chunk_count(st, L.items);
    const BackwardSizes sz = op.backward_sizes(p, shape, c);
    L.replay_states = sz.replay_states;

    const uint64_t prefix_bytes =
        packed ? c.align_up(c.mul(8, c.add((uint64_t)p->num_seqs, 1)), kAlign) : 0;
    const uint64_t ckpt_bytes = c.align_up(c.mul(4, sz.ckpt_floats), kAlign);
    const uint64_t part_bytes = c.align_up(c.mul(4, sz.part_floats), kAlign);
    L.chunk_bytes = c.align_up(c.mul(4, sz.chunk_floats), kAlign);

    L.prefix_off = 0;
    L.ckpt_off = prefix_bytes;
    L.part_off = c.add(prefix_bytes, ckpt_bytes);
    L.chunk_off = c.add(L.part_off, part_bytes);
    L.total = c.add(c.add(kAlign, L.chunk_off), c.mul((uint64_t)L.chunks, L.chunk_bytes));
    (void)c.to_size(L.total);
    if (c.overflow) {
        if (op.by_channel)
            set_message(msg, "the %s backward workspace for B=%lld T=%lld C=%lld overflows size_t",
                        op.name, (long long)p->B, (long long)p->T, (long long)p->N);
        else
            set_message(msg,
                        "the %s backward workspace for B=%lld T=%lld H=%lld N=%lld overflows "
                        "size_t",
                        op.name, (long long)p->B, (long long)p->T, (long long)p->H,
                        (long long)p->N);
        return WKV_ERROR_OVERFLOW;
    }
    *out = L;
    return WKV_OK;
}

void backward_task(void* data, int64_t begin, int64_t end) noexcept {
    const BackwardJob* job = static_cast<const BackwardJob*>(data);
    for (int64_t c = begin; c < end; ++c) {
        float* scratch =
            reinterpret_cast<float*>(job->chunks + (size_t)c * (size_t)job->layout.chunk_bytes);
        int64_t i0, i1;
        chunk_items(job->layout.items, job->layout.chunks, c, &i0, &i1);
        for (int64_t item = i0; item < i1; ++item) job->op->backward_item(job, item, scratch);
    }
}

/* Carves job's regions out of the workspace p->workspace (planned into job->layout), writing
 * the packed prefix sums. The same places for a saving forward and for the backward. */
void carve_workspace(const wkv_problem* p, const OpDesc& op, BackwardJob* job) noexcept {
    char* base = align_ptr(p->workspace);
    job->p = p;
    job->op = &op;
    job->seg_prefix = nullptr;
    if (p->seq_offsets) {
        int64_t* prefix = reinterpret_cast<int64_t*>(base + job->layout.prefix_off);
        int64_t acc = 0;
        for (int64_t s = 0; s < p->num_seqs; ++s) {
            prefix[s] = acc;
            acc += segment_count(p->seq_offsets[s + 1] - p->seq_offsets[s],
                                 op.checkpoint_interval);
        }
        prefix[p->num_seqs] = acc;
        job->seg_prefix = prefix;
    }
    job->ckpt = reinterpret_cast<float*>(base + job->layout.ckpt_off);
    job->part = reinterpret_cast<float*>(base + job->layout.part_off);
    job->chunks = base + job->layout.chunk_off;
}

/* The workspace holds at least the planned bytes (checked by the core; kept as a guard). */
wkv_status check_workspace(const wkv_problem* p, const OpDesc& op, const BackwardLayout& L,
                           wkv_message* msg) noexcept {
    if (p->workspace == nullptr || p->workspace_size < (size_t)L.total) {
        set_message(msg, "the workspace has %zu bytes; %s backward needs %zu",
                    p->workspace ? p->workspace_size : (size_t)0, op.name, (size_t)L.total);
        return WKV_ERROR_WORKSPACE_TOO_SMALL;
    }
    return WKV_OK;
}

} // namespace

bool op_saves(const wkv_problem* p, const OpDesc& op) { return op.saves && op.saves(p); }

int64_t BackwardJob::first_segment(int64_t s) const noexcept {
    return seg_prefix ? seg_prefix[s] : s * segment_count(p->T, op->checkpoint_interval);
}

wkv_status check_decay_form(const wkv_problem* p, wkv_message* msg) {
    if (!decay_form_supported(p->decay_form)) {
        set_message(msg, "decay_form %d is not supported", (int)p->decay_form);
        return WKV_ERROR_UNSUPPORTED;
    }
    return WKV_OK;
}

uint64_t items_per_head(const wkv_problem* p) { return (uint64_t)p->H; }

wkv_status run_forward(const BackendState* st, const wkv_problem* p, const OpDesc& op,
                       wkv_message* msg) {
    const wkv_status ok = op.check(p, msg);
    if (ok != WKV_OK) return ok;
    CheckedSize c;
    int64_t group = op.forward_group ? op.forward_group(p, st->args.num_threads) : 1;
    if (group < 1) group = 1;
    const uint64_t items_u = item_count(p, op, c, group);
    const int64_t items = c.overflow ? 0 : (int64_t)items_u;
    const int64_t chunks = chunk_count(st, items);
    const uint64_t chunk_bytes =
        c.align_up(c.mul(4, op.forward_chunk_floats(p, group, c)), kAlign);
    const size_t total = c.to_size(c.add(kAlign, c.mul((uint64_t)chunks, chunk_bytes)));
    if (c.overflow) {
        if (op.by_channel)
            set_message(msg, "the %s forward scratch for B=%lld C=%lld overflows size_t",
                        op.name, (long long)p->B, (long long)p->N);
        else
            set_message(msg, "the %s forward scratch for H=%lld N=%lld overflows size_t",
                        op.name, (long long)p->H, (long long)p->N);
        return WKV_ERROR_OVERFLOW;
    }
    if (items == 0) return WKV_OK;

    void* mem = st->scratch(total); /* the context's, reused from call to call */
    if (!mem) {
        set_message(msg, "cannot allocate %zu bytes of %s forward scratch", total, op.name);
        return WKV_ERROR_OUT_OF_MEMORY;
    }
    BackwardJob save; /* the checkpoints' places, when saving */
    if (p->save_checkpoints && op_saves(p, op)) {
        wkv_status status = plan_backward(st, p, op, &save.layout, msg);
        if (status == WKV_OK) status = check_workspace(p, op, save.layout, msg);
        if (status != WKV_OK) return status;
        carve_workspace(p, op, &save);
    }
    ForwardJob job;
    job.p = p;
    job.op = &op;
    job.save = p->save_checkpoints && op_saves(p, op) ? &save : nullptr;
    job.scratch = align_ptr(mem);
    job.chunk_bytes = (size_t)chunk_bytes;
    job.group = group;
    job.items = items;
    job.chunks = chunks;
    run_chunks(st, p, op, chunks, forward_task, &job);
    return WKV_OK;
}

wkv_status backward_workspace_size(const BackendState* st, const wkv_problem* p,
                                   const OpDesc& op, size_t* out_bytes, wkv_message* msg) {
    BackwardLayout L;
    const wkv_status status = plan_backward(st, p, op, &L, msg);
    if (status != WKV_OK) return status;
    *out_bytes = (size_t)L.total;
    return WKV_OK;
}

wkv_status run_backward(const BackendState* st, const wkv_problem* p, const OpDesc& op,
                        wkv_message* msg) {
    const wkv_status ok = op.check(p, msg);
    if (ok != WKV_OK) return ok;
    BackwardJob job;
    const wkv_status status = plan_backward(st, p, op, &job.layout, msg);
    if (status != WKV_OK) return status;
    const wkv_status ws = check_workspace(p, op, job.layout, msg);
    if (ws != WKV_OK) return ws;
    if (job.layout.items == 0) return WKV_OK;
    carve_workspace(p, op, &job);
    run_chunks(st, p, op, job.layout.chunks, backward_task, &job);
    if (op.backward_reduce) op.backward_reduce(&job);
    return WKV_OK;
}

} // namespace wkv_cpu
