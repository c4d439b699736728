/* RWKV-7 forward and backward on Vulkan: the host side of shaders/wkv7_fwd.comp and
 * shaders/wkv7_bwd.comp.
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
 * The parameter block (shapes, decay form, per-tensor base/stride/dtype, the sequence table)
 * goes through the mirror as well, at offset 0. The whole call is one command buffer:
 * copy in, barrier, dispatches, barrier, copy out, then a fence wait.
 *
 * LIMITS. A descriptor covers at most maxStorageBufferRange bytes (<= 4 GiB; 128 MiB on
 * lavapipe), which is what lets every shader index be a 32-bit int: a tensor whose span is
 * larger returns WKV_ERROR_UNSUPPORTED, as do T, items (sequences x heads) or checkpoint
 * counts beyond INT32_MAX. Head sizes 1..max_n (the device's shared memory and workgroup
 * limits, at most 256).
 *
 * BACKWARD WORKSPACE (bytes; K = 32, NN = N*N, items = sequences * H):
 *   G          = sum over sequences of ceil(L_s / K)               (checkpoint matrices / H)
 *   ckpt       = A256(4 * NN * H * G) + 256                        (every item's checkpoints)
 *   rep_item   = 4 * A64f((K + 1) * NN + K * N)                    (one item's replay states +
 *                                                                    its K sa rows; A64f: up to
 *                                                                    a multiple of 64 floats)
 *   P          = min(items, 1024, maxStorageBufferRange / rep_item, max(1, 256 MiB / rep_item))
 *   workspace  = ckpt + P * rep_item
 * Items run in batches of at most P (one dispatch each, in order, a barrier between), so that
 * the replay scratch is P items' worth; each batch's checkpoints are bound as their own range.
 * E.g. B=1 T=4096 H=32 N=64: 64 MiB of checkpoints + 32 x 532 KiB (P = items = 32) = 81 MiB.
 * It depends on the device's limits: ask wkv_workspace_size on the context that will run it. */
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

enum { S_R, S_W, S_K, S_V, S_A, S_B, S_U, S_Y, S_SIN, S_SOUT, S_DY, S_DSOUT, S_DR, S_DW, S_DK,
       S_DV, S_DA, S_DB, S_DU, S_DSIN };

/* shaders/wkv_common.glsl: TensorDesc and the Params header (std430). */
typedef struct gpu_tensor {
    int32_t base, dtype, present, pad;
    int32_t stride[4];
} gpu_tensor;
typedef struct gpu_header {
    int32_t B, T, H, N, num_seqs, form, flags, pad;
} gpu_header;
typedef struct gpu_push {
    int32_t item_base, ck_first, ck_shift, rep_stride;
} gpu_push;

typedef struct slot_plan {
    int used, present, host, output;
    const char* host_lo; /* host: the address of the span's first byte */
    uint64_t bytes;      /* host: span length */
    uint64_t region;     /* host: offset of the span in staging / mirror */
    VkBuffer buffer;     /* bound buffer (mirror for host tensors) */
    VkDeviceSize offset, range;
    gpu_tensor d;
} slot_plan;

typedef struct op_plan {
    slot_plan slot[WKV_PROBLEM_VIEWS];
    int64_t S;
    uint64_t params_bytes, total; /* staging / mirror layout */
} op_plan;

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }

static uint64_t offset_alignment(const wkv_vk_state* st) {
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

/* Plans one slot: its span, where it is bound, its descriptor for the shader. */
static wkv_status plan_slot(wkv_vk_state* st, const wkv_problem* p, op_plan* op, int slot, int output,
                            wkv_message* msg) {
    slot_plan* sp = &op->slot[slot];
    const wkv_view* v = &p->r + slot;
    sp->used = 1;
    sp->output = output;
    if (!v->data) {
        sp->buffer = st->dummy.buffer;
        sp->offset = 0;
        sp->range = st->dummy.size;
        return WKV_OK;
    }
    sp->present = 1;
    const int64_t ext[4] = {is_state_slot(slot) ? op->S : p->B, is_state_slot(slot) ? p->H : p->T,
                            is_state_slot(slot) ? p->N : p->H, p->N};
    const int64_t es = wkv_elem_size(v->elem);
    int64_t lo = 0, hi = 0;
    for (int d = 0; d < 4; ++d) {
        const int64_t stride = ext[d] > 1 ? v->stride[d] : 0;
        const int64_t reach = (ext[d] - 1) * stride; /* no overflow: checked by the core */
        if (reach < 0) lo += reach;
        else hi += reach;
        if (stride > INT32_MAX || stride < -INT32_MAX)
            return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED, "%s: stride %lld does not fit 32 bits", slot_name(slot),
                               (long long)stride);
        sp->d.stride[d] = (int32_t)stride;
    }
    const uint64_t bytes = (uint64_t)(hi - lo + 1) * (uint64_t)es;
    const uint64_t max_range = st->props.limits.maxStorageBufferRange;
    if (bytes + 2 * offset_alignment(st) > max_range || (hi - lo + 1) > INT32_MAX / 2)
        return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED,
                           "%s spans %llu bytes; one binding of this device covers at most %llu "
                           "(maxStorageBufferRange)", slot_name(slot), (unsigned long long)bytes,
                           (unsigned long long)max_range);
    sp->d.present = 1;
    sp->d.dtype = (int32_t)v->elem;
    const wkv_buffer_ref* mem = wkv_problem_mem(p, v);
    if (!mem->buffer) {
        sp->host = 1;
        sp->host_lo = v->data + lo * es;
        sp->bytes = bytes;
        sp->range = align_up(bytes, 4);
        sp->d.base = (int32_t)(-lo);
        return WKV_OK; /* buffer, offset: once the mirror layout is known */
    }
    const vkw_buffer* vb = (const vkw_buffer*)mem->buffer;
    const uint64_t start = mem->offset + (uint64_t)(lo * es); /* >= 0: checked by the core */
    const uint64_t aligned = start & ~(offset_alignment(st) - 1);
    uint64_t range = align_up(mem->offset + (uint64_t)((hi + 1) * es) - aligned, 4);
    if (range > vb->size - aligned) range = vb->size - aligned;
    sp->buffer = vb->buffer;
    sp->offset = aligned;
    sp->range = range;
    sp->d.base = (int32_t)((mem->offset - aligned) / (uint64_t)es);
    return WKV_OK;
}

/* The staging / mirror layout: the parameter block, then each host tensor's span. */
static void layout_host(wkv_vk_state* st, op_plan* op) {
    const uint64_t a = offset_alignment(st);
    uint64_t at = align_up(op->params_bytes, a);
    for (int s = 0; s < WKV_PROBLEM_VIEWS; ++s) {
        slot_plan* sp = &op->slot[s];
        if (!sp->used || !sp->host) continue;
        sp->region = at;
        sp->offset = at;
        at = align_up(at + sp->range, a);
    }
    op->total = at;
}

static wkv_status check_problem(wkv_vk_state* st, const wkv_problem* p, wkv_message* msg) {
    if (p->op != WKV_OP_RWKV7)
        return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED, "op %d is not implemented (RWKV-7 only so far)", (int)p->op);
    if (p->decay_form < WKV_DECAY_DIRECT || p->decay_form > WKV_DECAY_CLAMPW)
        return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED, "decay_form %d is not supported", (int)p->decay_form);
    if (p->N > st->max_n || !wkv_vk_head_size_ok(&st->props.limits, p->N))
        return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED,
                           "head size N=%lld: %s allows 1..%d (workgroup size, shared memory; the state "
                           "rows live in registers)", (long long)p->N, st->props.deviceName, st->max_n);
    if (p->T > INT32_MAX || p->B > INT32_MAX || p->num_seqs * p->H > INT32_MAX)
        return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED, "T, B or sequences x heads beyond 2^31");
    return WKV_OK;
}

/* lavapipe (llvmpipe) ends every loop of a shader invocation after 65535 iterations in total,
 * without an error (gallivm's LP_MAX_TGSI_LOOP_ITERATIONS). The rolled shader variants count
 * ceil(N / 16) + 1 per loop over a row; a problem whose longest sequence would need more than
 * a safe 60000 is refused there (WKV_ERROR_UNSUPPORTED) instead of being computed wrongly:
 * about 1500 tokens per sequence for the backward and 4600 for the forward at N = 64. */
static wkv_status lavapipe_budget(const wkv_vk_state* st, const wkv_problem* p, int backward, wkv_message* msg) {
    if (strncmp(st->props.deviceName, "llvmpipe", 8) != 0) return WKV_OK;
    int64_t longest = 0;
    for (int64_t q = 0; q < p->num_seqs; ++q) {
        int64_t batch, t0, t1;
        wkv_problem_sequence(p, q, &batch, &t0, &t1);
        if (t1 - t0 > longest) longest = t1 - t0;
    }
    const int64_t L = st->rolled ? (p->N + 15) / 16 + 1 : 1;
    const int64_t nseg = (longest + WKV_VK_K - 1) / WKV_VK_K;
    const int64_t count = backward ? longest * (7 * L + 3) + nseg * (2 * L + 2) + 6 * L
                                   : longest * (2 * L + 4) + 4 * L;
    if (count <= 60000) return WKV_OK;
    return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED,
                       "a sequence of %lld tokens at N=%lld needs ~%lld loop iterations in one shader "
                       "invocation; lavapipe stops at 65535 (a software-rasteriser limit): split the "
                       "sequence or use another device", (long long)longest, (long long)p->N, (long long)count);
}

/* Fills staging with the parameter block (and seg0 per sequence for the backward). */
static void write_params(wkv_vk_state* st, const wkv_problem* p, const op_plan* op, const int64_t* seg0) {
    char* base = (char*)st->staging.mapped;
    gpu_header h;
    memset(&h, 0, sizeof h);
    h.B = (int32_t)p->B;
    h.T = (int32_t)p->T;
    h.H = (int32_t)p->H;
    h.N = (int32_t)p->N;
    h.num_seqs = (int32_t)op->S;
    h.form = (int32_t)p->decay_form;
    h.flags = (int32_t)p->flags;
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

/* Plans the kernel's slots, lays out and fills staging (params + host spans). */
static wkv_status prepare(wkv_vk_state* st, const wkv_problem* p, op_plan* op, const int* in_slots, int n_in,
                          const int* out_slots, int n_out, const int64_t* seg0, wkv_message* msg) {
    memset(op, 0, sizeof *op);
    op->S = p->num_seqs;
    op->params_bytes = sizeof(gpu_header) + WKV_PROBLEM_VIEWS * sizeof(gpu_tensor) + 16 * (uint64_t)op->S;
    wkv_status s;
    for (int i = 0; i < n_in; ++i)
        if ((s = plan_slot(st, p, op, in_slots[i], 0, msg))) return s;
    for (int i = 0; i < n_out; ++i)
        if ((s = plan_slot(st, p, op, out_slots[i], 1, msg))) return s;
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
    write_params(st, p, op, seg0);
    return WKV_OK;
}

/* Writes the descriptors of `set`: the parameter block, every slot of the kernel, and (backward)
 * the checkpoint and replay ranges. */
static void write_set(wkv_vk_state* st, int kernel, VkDescriptorSet set, const op_plan* op,
                      const VkDescriptorBufferInfo* ck, const VkDescriptorBufferInfo* rep) {
    const vkw_kernel* kern = &st->kernels[kernel];
    VkDescriptorBufferInfo info[WKV_VK_MAX_BINDINGS];
    VkWriteDescriptorSet w[WKV_VK_MAX_BINDINGS];
    memset(w, 0, sizeof w);
    for (uint32_t i = 0; i < kern->num_bindings; ++i) {
        uint32_t b = kern->bindings[i];
        if (b == 0) {
            info[i].buffer = st->mirror.buffer;
            info[i].offset = 0;
            info[i].range = align_up(op->params_bytes, 4);
        } else if (b == WKV_VK_BINDING_CKPT) {
            info[i] = *ck;
        } else if (b == WKV_VK_BINDING_REPLAY) {
            info[i] = *rep;
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
static wkv_status record_upload(wkv_vk_state* st, const op_plan* op, wkv_message* msg) {
    wkv_status s = vkw_begin(st, msg);
    if (s) return s;
    VkBufferCopy c = {0, 0, op->total};
    st->fn.vkCmdCopyBuffer(st->cmd, st->staging.buffer, st->mirror.buffer, 1, &c);
    vkw_barrier(st, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
    return WKV_OK;
}

/* Ends the command buffer: host outputs mirror -> staging; submits, waits, and copies them to
 * the caller's memory. */
static wkv_status finish_and_download(wkv_vk_state* st, const op_plan* op, wkv_message* msg) {
    vkw_barrier(st, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
                VK_ACCESS_TRANSFER_READ_BIT);
    VkBufferCopy c[WKV_PROBLEM_VIEWS];
    uint32_t n = 0;
    for (int i = 0; i < WKV_PROBLEM_VIEWS; ++i) {
        const slot_plan* sp = &op->slot[i];
        if (!sp->used || !sp->host || !sp->output) continue;
        c[n].srcOffset = c[n].dstOffset = sp->region;
        c[n].size = sp->range;
        ++n;
    }
    if (n) st->fn.vkCmdCopyBuffer(st->cmd, st->mirror.buffer, st->staging.buffer, n, c);
    wkv_status s = vkw_submit_wait(st, msg);
    if (s) return s;
    for (int i = 0; i < WKV_PROBLEM_VIEWS; ++i) {
        const slot_plan* sp = &op->slot[i];
        if (!sp->used || !sp->host || !sp->output) continue;
        memcpy((char*)(uintptr_t)sp->host_lo, (const char*)st->staging.mapped + sp->region, (size_t)sp->bytes);
    }
    return WKV_OK;
}

int wkv_vk_forward_tc(const VkPhysicalDeviceLimits* lim, int64_t n) {
    int64_t tc = (int64_t)lim->maxComputeSharedMemorySize / (24 * n);
    return (int)(tc < 1 ? 1 : tc > 16 ? 16 : tc);
}

/* ------------------------------------------------------------------------------ forward */

wkv_status wkv_vk_rwkv7_forward(wkv_vk_state* st, const wkv_problem* p, wkv_message* msg) {
    wkv_status s = check_problem(st, p, msg);
    if (s) return s;
    if ((s = lavapipe_budget(st, p, 0, msg))) return s;
    static const int ins[] = {S_R, S_W, S_K, S_V, S_A, S_B, S_SIN};
    static const int outs[] = {S_Y, S_SOUT};
    const int tc = wkv_vk_forward_tc(&st->props.limits, p->N);
    VkPipeline pipe;
    if ((s = wkv_vk_pipeline(st, WKV_VK_KERNEL_RWKV7_FWD, (int)p->N, tc, &pipe, msg))) return s;
    op_plan op;
    if ((s = prepare(st, p, &op, ins, 7, outs, 2, NULL, msg))) return s;
    VkDescriptorSet set;
    if ((s = wkv_vk_descriptor_sets(st, WKV_VK_KERNEL_RWKV7_FWD, 1, &set, msg))) return s;
    write_set(st, WKV_VK_KERNEL_RWKV7_FWD, set, &op, NULL, NULL);
    if ((s = record_upload(st, &op, msg))) return s;
    const vkw_kernel* kern = &st->kernels[WKV_VK_KERNEL_RWKV7_FWD];
    st->fn.vkCmdBindPipeline(st->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
    st->fn.vkCmdBindDescriptorSets(st->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, kern->layout, 0, 1, &set, 0, NULL);
    const int64_t items = op.S * p->H;
    const int64_t max_groups = st->props.limits.maxComputeWorkGroupCount[0];
    for (int64_t i0 = 0; i0 < items; i0 += max_groups) {
        const int64_t count = items - i0 < max_groups ? items - i0 : max_groups;
        gpu_push pc = {(int32_t)i0, 0, 0, 0};
        st->fn.vkCmdPushConstants(st->cmd, kern->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof pc, &pc);
        st->fn.vkCmdDispatch(st->cmd, (uint32_t)count, 1, 1);
    }
    return finish_and_download(st, &op, msg);
}

/* ----------------------------------------------------------------------------- backward */

typedef struct bwd_layout {
    int64_t items, P;
    int64_t total_mats;     /* checkpoint matrices: H * G */
    uint64_t ck_region;     /* bytes */
    uint64_t rep_item;      /* bytes per item */
    int32_t rep_stride;     /* floats per item */
    int64_t max_item_mats;  /* the most checkpoints of one item */
    uint64_t total;
} bwd_layout;

static int64_t segments(int64_t len) { return (len + WKV_VK_K - 1) / WKV_VK_K; }

static wkv_status plan_backward(wkv_vk_state* st, const wkv_problem* p, bwd_layout* L, wkv_message* msg) {
    const int64_t N = p->N, NN = N * N;
    int64_t G = 0, max_seg = 0;
    for (int64_t s = 0; s < p->num_seqs; ++s) {
        int64_t batch, t0, t1;
        wkv_problem_sequence(p, s, &batch, &t0, &t1);
        const int64_t g = segments(t1 - t0);
        G += g;
        if (g > max_seg) max_seg = g;
    }
    const uint64_t range = st->props.limits.maxStorageBufferRange;
    L->items = p->num_seqs * p->H;
    L->total_mats = G * p->H;
    L->max_item_mats = max_seg;
    if (L->total_mats > INT32_MAX || (uint64_t)max_seg * (uint64_t)NN * 4u + 256u > range)
        return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED,
                           "the backward's checkpoints of one sequence (%lld x %lld floats) exceed one "
                           "binding of this device (maxStorageBufferRange %llu bytes)",
                           (long long)max_seg, (long long)NN, (unsigned long long)range);
    L->ck_region = align_up((uint64_t)L->total_mats * (uint64_t)NN * 4u, 256) + 256;
    L->rep_stride = (int32_t)align_up((uint64_t)((WKV_VK_K + 1) * NN + WKV_VK_K * N), 64);
    L->rep_item = (uint64_t)L->rep_stride * 4u;
    if (L->rep_item > range)
        return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED, "N=%lld: the replay scratch of one item exceeds "
                           "maxStorageBufferRange", (long long)N);
    int64_t P = L->items;
    if (P > 1024) P = 1024;
    if ((uint64_t)P > range / L->rep_item) P = (int64_t)(range / L->rep_item);
    const uint64_t budget = 256ull << 20;
    const int64_t by_budget = L->rep_item >= budget ? 1 : (int64_t)(budget / L->rep_item);
    if (P > by_budget) P = by_budget;
    if (P < 1) P = 1;
    L->P = P;
    L->total = L->ck_region + (uint64_t)P * L->rep_item;
    return WKV_OK;
}

wkv_status wkv_vk_rwkv7_workspace_size(wkv_vk_state* st, const wkv_problem* p, size_t* out, wkv_message* msg) {
    wkv_status s = check_problem(st, p, msg);
    if (s) return s;
    if ((s = lavapipe_budget(st, p, 1, msg))) return s;
    bwd_layout L;
    if ((s = plan_backward(st, p, &L, msg))) return s;
    if (L.total > SIZE_MAX) return wkv_vk_fail(msg, WKV_ERROR_OVERFLOW, "the workspace overflows size_t");
    *out = (size_t)L.total;
    return WKV_OK;
}

wkv_status wkv_vk_rwkv7_backward(wkv_vk_state* st, const wkv_problem* p, wkv_message* msg) {
    wkv_status s = check_problem(st, p, msg);
    if (s) return s;
    if ((s = lavapipe_budget(st, p, 1, msg))) return s;
    bwd_layout L;
    if ((s = plan_backward(st, p, &L, msg))) return s;
    const int64_t H = p->H, NN = p->N * p->N;

    /* seg0[s]: the first checkpoint segment of sequence s; mats[i]: item i's first matrix */
    int64_t* seg0 = (int64_t*)malloc(sizeof(int64_t) * (size_t)(p->num_seqs + 1));
    int64_t* mats = (int64_t*)malloc(sizeof(int64_t) * (size_t)(L.items + 1));
    VkDescriptorSet* sets = (VkDescriptorSet*)malloc(sizeof(VkDescriptorSet) * (size_t)L.items);
    int64_t* bounds = (int64_t*)malloc(sizeof(int64_t) * (size_t)(L.items + 1));
    if (!seg0 || !mats || !sets || !bounds) {
        s = wkv_vk_fail(msg, WKV_ERROR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    int64_t acc = 0;
    for (int64_t q = 0; q < p->num_seqs; ++q) {
        int64_t batch, t0, t1;
        wkv_problem_sequence(p, q, &batch, &t0, &t1);
        seg0[q] = acc;
        const int64_t nseg = segments(t1 - t0);
        for (int64_t h = 0; h < H; ++h) mats[q * H + h] = acc * H + h * nseg;
        acc += nseg;
    }
    mats[L.items] = L.total_mats;

    /* batches: contiguous items, at most P, their checkpoints within one binding */
    const uint64_t range = st->props.limits.maxStorageBufferRange;
    const uint64_t ck_align = offset_alignment(st);
    const int64_t max_groups = st->props.limits.maxComputeWorkGroupCount[0];
    int64_t nb = 0;
    bounds[0] = 0;
    for (int64_t i0 = 0; i0 < L.items;) {
        int64_t i1 = i0 + 1;
        while (i1 < L.items && i1 - i0 < L.P && i1 - i0 < max_groups &&
               (uint64_t)(mats[i1 + 1] - mats[i0]) * (uint64_t)NN * 4u + ck_align <= range)
            ++i1;
        bounds[++nb] = i1;
        i0 = i1;
    }

    static const int ins[] = {S_R, S_W, S_K, S_V, S_A, S_B, S_SIN, S_DY, S_DSOUT};
    static const int outs[] = {S_DR, S_DW, S_DK, S_DV, S_DA, S_DB, S_DSIN};
    VkPipeline pipe;
    if ((s = wkv_vk_pipeline(st, WKV_VK_KERNEL_RWKV7_BWD, (int)p->N, 0, &pipe, msg))) goto done;
    /* the workspace: the caller's wkv_buffer, or device scratch of ours */
    VkBuffer ws;
    if (p->workspace_mem.buffer) {
        ws = ((const vkw_buffer*)p->workspace_mem.buffer)->buffer;
    } else {
        if ((s = vkw_buffer_reserve(st, &st->scratch, L.total, WKV_VK_DEVICE_LOCAL, msg))) goto done;
        ws = st->scratch.buffer;
    }
    op_plan op;
    if ((s = prepare(st, p, &op, ins, 9, outs, 7, seg0, msg))) goto done;
    if ((s = wkv_vk_descriptor_sets(st, WKV_VK_KERNEL_RWKV7_BWD, (uint32_t)nb, sets, msg))) goto done;
    VkDescriptorBufferInfo rep = {ws, L.ck_region, (VkDeviceSize)L.P * L.rep_item};
    for (int64_t b = 0; b < nb; ++b) {
        const uint64_t off = (uint64_t)mats[bounds[b]] * (uint64_t)NN * 4u;
        const uint64_t aligned = off & ~(ck_align - 1);
        uint64_t len = (uint64_t)mats[bounds[b + 1]] * (uint64_t)NN * 4u - aligned;
        if (len < 16) len = 16;
        VkDescriptorBufferInfo ck = {ws, aligned, len};
        write_set(st, WKV_VK_KERNEL_RWKV7_BWD, sets[b], &op, &ck, &rep);
    }
    if ((s = record_upload(st, &op, msg))) goto done;
    const vkw_kernel* kern = &st->kernels[WKV_VK_KERNEL_RWKV7_BWD];
    st->fn.vkCmdBindPipeline(st->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
    for (int64_t b = 0; b < nb; ++b) {
        const int64_t i0 = bounds[b], i1 = bounds[b + 1];
        const uint64_t off = (uint64_t)mats[i0] * (uint64_t)NN * 4u;
        const uint64_t aligned = off & ~(ck_align - 1);
        gpu_push pc = {(int32_t)i0, (int32_t)mats[i0], (int32_t)((off - aligned) / 4u), L.rep_stride};
        if (b > 0) /* the replay scratch is reused: the previous batch must be done with it */
            vkw_barrier(st, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT,
                        VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
        st->fn.vkCmdBindDescriptorSets(st->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, kern->layout, 0, 1, &sets[b], 0, NULL);
        st->fn.vkCmdPushConstants(st->cmd, kern->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof pc, &pc);
        st->fn.vkCmdDispatch(st->cmd, (uint32_t)(i1 - i0), 1, 1);
    }
    s = finish_and_download(st, &op, msg);
done:
    free(seg0);
    free(mats);
    free(sets);
    free(bounds);
    return s;
}
