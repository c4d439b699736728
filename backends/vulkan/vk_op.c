/* What every op of the Vulkan plugin shares (RWKV-7/6 in vk_rwkv7.c, RWKV-4 in vk_rwkv4.c).
 *
 * ONE CALL. Every tensor of the kernel gets a descriptor (binding = slot + 1):
 *   - a tensor in a wkv_buffer is bound in place: the descriptor starts at the tensor's lowest
 *     byte rounded down to minStorageBufferOffsetAlignment and covers every byte it reaches;
 *   - a host tensor is staged: its byte span is copied into the context's host-visible staging
 *     buffer, then (one vkCmdCopyBuffer) into a device-local mirror with the same layout, and
 *     bound there. Outputs are staged too, so the bytes between their elements (gaps of a
 *     strided view) go back unchanged; after the dispatches the output spans are copied back
 *     to staging and then to the caller's memory. Nothing reaches the caller's memory unless
 *     every step succeeded;
 *   - an absent optional tensor is bound to a 16-byte dummy and flagged absent.
 * The parameter block (shapes, op, decay form, per-tensor base/stride/dtype, the sequence
 * table) goes through the mirror as well, at offset 0 — unless no tensor is in host memory and
 * the device has host-visible device-local memory: then it is written there in place. The whole call is one command buffer:
 * copy in, barrier, dispatches, barrier, copy out, then a fence wait.
 *
 * LIMITS. A descriptor covers at most maxStorageBufferRange bytes (<= 4 GiB; 128 MiB on
 * lavapipe), which is what lets every shader index be a 32-bit int: a tensor whose span is
 * larger returns WKV_ERROR_UNSUPPORTED. */
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

uint64_t wkv_vk_align_up(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }

uint64_t wkv_vk_offset_alignment(const wkv_vk_state* st) {
    uint64_t a = st->props.limits.minStorageBufferOffsetAlignment;
    return a < 16 ? 16 : a;
}

static int is_state_slot(int slot) {
    return slot == S_SIN || slot == S_SOUT || slot == S_DSOUT || slot == S_DSIN;
}

static const char* slot_name(int slot) {
    static const char* names[] = {"r", "w", "k", "v", "a", "b", "u", "y", "state_in", "state_out", "dy",
                                  "dstate_out", "dr", "dw", "dk", "dv", "da", "db", "du", "dstate_in"};
    return names[slot];
}

/* Plans one tensor: its span (ext: its extent along the view's four axes), where it is bound,
 * its descriptor for the shader. */
wkv_status wkv_vk_plan_view(wkv_vk_state* st, const wkv_view* v, const wkv_buffer_ref* mem, const int64_t ext[4],
                            slot_plan* sp, const char* name, int output, wkv_message* msg) {
    sp->used = 1;
    sp->output = output;
    if (!v->data) {
        sp->buffer = st->dummy.buffer;
        sp->offset = 0;
        sp->range = st->dummy.size;
        return WKV_OK;
    }
    sp->present = 1;
    const int64_t es = wkv_elem_size(v->elem);
    int64_t lo = 0, hi = 0;
    for (int d = 0; d < 4; ++d) {
        const int64_t stride = ext[d] > 1 ? v->stride[d] : 0;
        const int64_t reach = (ext[d] - 1) * stride; /* no overflow: checked by the core */
        if (reach < 0) lo += reach;
        else hi += reach;
        if (stride > INT32_MAX || stride < -INT32_MAX)
            return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED, "%s: stride %lld does not fit 32 bits", name,
                               (long long)stride);
        sp->d.stride[d] = (int32_t)stride;
    }
    const uint64_t bytes = (uint64_t)(hi - lo + 1) * (uint64_t)es;
    const uint64_t max_range = st->props.limits.maxStorageBufferRange;
    if (bytes + 2 * wkv_vk_offset_alignment(st) > max_range || (hi - lo + 1) > INT32_MAX / 2)
        return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED,
                           "%s spans %llu bytes; one binding of this device covers at most %llu "
                           "(maxStorageBufferRange)", name, (unsigned long long)bytes,
                           (unsigned long long)max_range);
    sp->d.present = 1;
    sp->d.dtype = (int32_t)v->elem;
    if (!mem->buffer) {
        sp->host = 1;
        sp->host_lo = v->data + lo * es;
        sp->bytes = bytes;
        sp->range = wkv_vk_align_up(bytes, 4);
        sp->d.base = (int32_t)(-lo);
        return WKV_OK; /* buffer, offset: once the mirror layout is known */
    }
    const vkw_buffer* vb = (const vkw_buffer*)mem->buffer;
    const uint64_t start = mem->offset + (uint64_t)(lo * es); /* >= 0: checked by the core */
    const uint64_t aligned = start & ~(wkv_vk_offset_alignment(st) - 1);
    uint64_t range = wkv_vk_align_up(mem->offset + (uint64_t)((hi + 1) * es) - aligned, 4);
    if (range > vb->size - aligned) range = vb->size - aligned;
    sp->buffer = vb->buffer;
    sp->offset = aligned;
    sp->range = range;
    sp->d.base = (int32_t)((mem->offset - aligned) / (uint64_t)es);
    return WKV_OK;
}

/* An RWKV op's slot: its extent from the problem's shape. */
static wkv_status plan_slot(wkv_vk_state* st, const wkv_problem* p, op_plan* op, int slot, int output,
                            wkv_message* msg) {
    const wkv_view* v = &p->r + slot;
    /* RWKV-4's state is [s, part (aa bb pp), 0, c] */
    const int r4 = p->op == WKV_OP_RWKV4;
    const int64_t ext[4] = {is_state_slot(slot) ? op->S : p->B,
                            is_state_slot(slot) ? (r4 ? 3 : p->H) : p->T,
                            is_state_slot(slot) ? (r4 ? 1 : p->N) : p->H, p->N};
    return wkv_vk_plan_view(st, v, wkv_problem_mem(p, v), ext, &op->slot[slot], slot_name(slot), output, msg);
}

/* The staging / mirror layout: the parameter block, then each host tensor's span. */
static void layout_host(wkv_vk_state* st, op_plan* op) {
    const uint64_t a = wkv_vk_offset_alignment(st);
    uint64_t at = wkv_vk_align_up(op->params_bytes, a);
    for (int s = 0; s < WKV_PROBLEM_VIEWS; ++s) {
        slot_plan* sp = &op->slot[s];
        if (!sp->used || !sp->host) continue;
        sp->region = at;
        sp->offset = at;
        at = wkv_vk_align_up(at + sp->range, a);
    }
    op->total = at;
}

/* An RWKV op's parameter block (and seg0 per sequence for the backward). */
typedef struct rwkv_params {
    const wkv_problem* p;
    const int64_t* seg0;
} rwkv_params;

static void write_params(char* base, const op_plan* op, const void* data) {
    const wkv_problem* p = ((const rwkv_params*)data)->p;
    const int64_t* seg0 = ((const rwkv_params*)data)->seg0;
    gpu_header h;
    memset(&h, 0, sizeof h);
    h.B = (int32_t)p->B;
    h.T = (int32_t)p->T;
    h.H = (int32_t)p->H;
    h.N = (int32_t)p->N;
    h.num_seqs = (int32_t)op->S;
    h.form = (int32_t)p->decay_form;
    h.flags = (int32_t)p->flags;
    h.op = (int32_t)p->op;
    memcpy(base, &h, sizeof h);
    gpu_tensor* td = (gpu_tensor*)(base + sizeof h);
    for (int s = 0; s < WKV_PROBLEM_VIEWS; ++s) td[s] = op->slot[s].d;
    int32_t* seqs = (int32_t*)(td + WKV_PROBLEM_VIEWS);
    for (int64_t s = 0; s < op->S; ++s) {
        int64_t batch, t0, t1;
        wkv_problem_sequence(p, s, &batch, &t0, &t1);
        seqs[4 * s + 0] = (int32_t)batch;
        seqs[4 * s + 1] = (int32_t)t0;
        seqs[4 * s + 2] = (int32_t)t1;
        seqs[4 * s + 3] = seg0 ? (int32_t)seg0[s] : 0;
    }
}

uint64_t wkv_vk_params_bytes(const wkv_problem* p) {
    return sizeof(gpu_header) + WKV_PROBLEM_VIEWS * sizeof(gpu_tensor) + 16 * (uint64_t)p->num_seqs;
}

/* The parameter block of a call without host tensors, in place (host-visible device-local
 * memory): at offset 0 of params, or, appended to an open command buffer (vk_internal.h, ASYNC
 * CALLS), in the next free region of it. A call that may open a command buffer for others
 * reserves room for them: batch_max blocks like its own, at most 1 MiB. */
static wkv_status place_params(wkv_vk_state* st, op_plan* op, wkv_vk_params_writer write, const void* data,
                               wkv_message* msg) {
    const uint64_t a = wkv_vk_offset_alignment(st);
    uint64_t at = 0;
    if (st->appending) {
        at = wkv_vk_align_up(st->batch_params, a); /* room: checked by vkw_call_begin_append */
    } else {
        uint64_t want = op->params_bytes;
        if (st->batching) {
            const uint64_t room = wkv_vk_align_up(op->params_bytes, a) * st->batch_max;
            want = room < (1u << 20) ? room : (1u << 20);
            if (want < op->params_bytes) want = op->params_bytes;
        }
        wkv_status s = vkw_buffer_reserve(st, &st->params, want, WKV_VK_HOST_DEVICE, msg);
        if (s) return s;
    }
    op->total = 0;
    op->params_buffer = st->params.buffer;
    op->params_offset = at;
    st->batch_params = at + op->params_bytes;
    write((char*)st->params.mapped + at, op, data);
    return WKV_OK;
}

wkv_status wkv_vk_prepare(wkv_vk_state* st, const wkv_problem* p, op_plan* op, const int* in_slots, int n_in,
                          const int* out_slots, int n_out, const int64_t* seg0, wkv_message* msg) {
    memset(op, 0, sizeof *op);
    op->S = p->num_seqs;
    op->params_bytes = wkv_vk_params_bytes(p);
    wkv_status s;
    for (int i = 0; i < n_in; ++i)
        if ((s = plan_slot(st, p, op, in_slots[i], 0, msg))) return s;
    for (int i = 0; i < n_out; ++i)
        if ((s = plan_slot(st, p, op, out_slots[i], 1, msg))) return s;
    const rwkv_params data = {p, seg0};
    return wkv_vk_stage(st, op, write_params, &data, msg);
}

wkv_status wkv_vk_stage(wkv_vk_state* st, op_plan* op, wkv_vk_params_writer write, const void* data,
                        wkv_message* msg) {
    wkv_status s;
    int any_host = 0;
    for (int i = 0; i < WKV_PROBLEM_VIEWS; ++i) any_host |= op->slot[i].used && op->slot[i].host;
    /* No host tensor (a decode loop on buffers): the parameter block straight into device
     * memory the host can write, so the command buffer has no copy and no barrier for it.
     * While recording into the host's command buffer this is rec_params (swapped in, see
     * wkv_vk_record): the host runs the recording before it records with this context again
     * (wkv_vulkan.h), so rewriting it in place is safe there too. */
    if (!any_host && st->params_direct) {
        s = place_params(st, op, write, data, msg);
        if (s == WKV_OK) {
            vkw_prof_enter(st, WKV_VK_PROF_RECORD);
            return WKV_OK;
        }
        if (s != WKV_ERROR_UNSUPPORTED) return s;
        st->params_direct = 0; /* no such memory type: the mirror, from now on */
        if (msg) msg->text[0] = '\0';
    }
    /* The shared staging and mirror: an async call (no host tensor, but no direct parameter
     * block on this device) runs synchronously, after every pending call. (It cannot be
     * appending: only calls with a direct parameter block leave a command buffer open.) */
    if (st->call_async) {
        st->call_async = st->appending = st->batching = 0;
        if ((s = vkw_drain(st, msg))) return s;
    }
    layout_host(st, op);
    for (int i = 0; i < WKV_PROBLEM_VIEWS; ++i)
        if (op->slot[i].host) op->slot[i].buffer = VK_NULL_HANDLE; /* set after reserve */
    if ((s = vkw_buffer_reserve(st, &st->staging, op->total, WKV_VK_HOST_VISIBLE, msg))) return s;
    if ((s = vkw_buffer_reserve(st, &st->mirror, op->total, WKV_VK_DEVICE_LOCAL, msg))) return s;
    for (int i = 0; i < WKV_PROBLEM_VIEWS; ++i) {
        slot_plan* sp = &op->slot[i];
        if (!sp->used || !sp->host) continue;
        sp->buffer = st->mirror.buffer;
        char* dst = (char*)st->staging.mapped + sp->region;
        memcpy(dst, sp->host_lo, (size_t)sp->bytes); /* outputs too: their gaps go back unchanged */
        if (sp->range > sp->bytes) memset(dst + sp->bytes, 0, (size_t)(sp->range - sp->bytes));
    }
    write((char*)st->staging.mapped, op, data);
    op->params_buffer = st->mirror.buffer;
    vkw_prof_enter(st, WKV_VK_PROF_RECORD);
    return WKV_OK;
}

void wkv_vk_write_set(wkv_vk_state* st, int kernel, VkDescriptorSet set, const op_plan* op,
                      const VkDescriptorBufferInfo* ck, const VkDescriptorBufferInfo* rep,
                      const VkDescriptorBufferInfo* part) {
    const vkw_kernel* kern = &st->kernels[kernel];
    VkDescriptorBufferInfo info[WKV_VK_MAX_BINDINGS];
    VkWriteDescriptorSet w[WKV_VK_MAX_BINDINGS];
    memset(w, 0, sizeof w);
    for (uint32_t i = 0; i < kern->num_bindings; ++i) {
        uint32_t b = kern->bindings[i];
        if (b == 0) {
            info[i].buffer = op->params_buffer;
            info[i].offset = op->params_offset;
            info[i].range = wkv_vk_align_up(op->params_bytes, 4);
        } else if (b == WKV_VK_BINDING_CKPT) {
            info[i] = *ck;
        } else if (b == WKV_VK_BINDING_REPLAY) {
            info[i] = *rep;
        } else if (b == WKV_VK_BINDING_PART) {
            info[i] = *part;
        } else {
            const slot_plan* sp = &op->slot[b - 1];
            info[i].buffer = sp->buffer;
            info[i].offset = sp->offset;
            info[i].range = sp->range;
        }
        w[i].sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
        w[i].dstSet = set;
        w[i].dstBinding = b;
        w[i].descriptorCount = 1;
        w[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        w[i].pBufferInfo = &info[i];
    }
    st->fn.vkUpdateDescriptorSets(st->device, kern->num_bindings, w, 0, NULL);
}

/* Starts the command buffer: staging -> mirror, then a barrier before the shaders. */
wkv_status wkv_vk_record_upload(wkv_vk_state* st, const op_plan* op, wkv_message* msg) {
    /* Recording with nothing to copy: the host's barrier before the op (wkv_vulkan.h) is all
     * the dispatches need, so no barrier of ours (each costs microseconds: DESIGN.md, decode). */
    if (st->recording && op->total == 0) return WKV_OK;
    wkv_status s = vkw_begin(st, msg);
    if (s) return s;
    if (op->total == 0) return WKV_OK; /* the parameter block is in place */
    VkBufferCopy c = {0, 0, op->total};
    st->fn.vkCmdCopyBuffer(st->cmd, st->staging.buffer, st->mirror.buffer, 1, &c);
    vkw_barrier(st, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
    return WKV_OK;
}

/* Ends the command buffer: host outputs mirror -> staging; submits, waits, and copies them to
 * the caller's memory. */
wkv_status wkv_vk_finish_and_download(wkv_vk_state* st, const op_plan* op, wkv_message* msg) {
    VkBufferCopy c[WKV_PROBLEM_VIEWS];
    uint32_t n = 0;
    for (int i = 0; i < WKV_PROBLEM_VIEWS; ++i) {
        const slot_plan* sp = &op->slot[i];
        if (!sp->used || !sp->host || !sp->output) continue;
        c[n].srcOffset = c[n].dstOffset = sp->region;
        c[n].size = sp->range;
        ++n;
    }
    if (n) { /* only then: a barrier costs microseconds (DESIGN.md, decode) */
        vkw_barrier(st, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
                    VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_READ_BIT);
        st->fn.vkCmdCopyBuffer(st->cmd, st->mirror.buffer, st->staging.buffer, n, c);
    }
    wkv_status s = vkw_submit_wait_reads(st, n != 0, msg);
    if (s) return s;
    for (int i = 0; i < WKV_PROBLEM_VIEWS; ++i) {
        const slot_plan* sp = &op->slot[i];
        if (!sp->used || !sp->host || !sp->output) continue;
        memcpy((char*)(uintptr_t)sp->host_lo, (const char*)st->staging.mapped + sp->region, (size_t)sp->bytes);
    }
    return WKV_OK;
}

void wkv_vk_compute_barrier(wkv_vk_state* st) {
    vkw_barrier(st, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT,
                VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
}

int64_t wkv_vk_longest(const wkv_problem* p) {
    int64_t longest = 0;
    for (int64_t q = 0; q < p->num_seqs; ++q) {
        int64_t batch, t0, t1;
        wkv_problem_sequence(p, q, &batch, &t0, &t1);
        if (t1 - t0 > longest) longest = t1 - t0;
    }
    return longest;
}
