/* RWKV-7 and RWKV-6 (RWKV-5: w with a T-stride of 0) forward and backward on Vulkan: the host
 * side of shaders/wkv7_{fwd,bwd}.comp and shaders/wkv6_{fwd,bwd}.comp. Both ops have the same
 * structure (an N x N float32 state per (sequence, head) item, one workgroup of N invocations
 * per item), so they share the plan below; vk_op.c binds and stages the tensors.
 *
 * LIMITS. T, items (sequences x heads) or checkpoint counts beyond INT32_MAX return
 * WKV_ERROR_UNSUPPORTED, as does any span beyond maxStorageBufferRange (vk_op.c). Head sizes
 * 1..max_n (the device's shared memory and workgroup limits, at most 256).
 *
 * BACKWARD WORKSPACE (bytes; K = 32, NN = N*N, items = sequences * H):
 *   G          = sum over sequences of ceil(L_s / K)               (checkpoint matrices / H)
 *   ckpt       = A256(4 * NN * H * G) + 256                        (every item's checkpoints)
 *   rep_item   = 4 * A64f((K + 1) * NN + K * N)                    (one item's replay states +
 *                                                                    its K sa rows (RWKV-7);
 *                                                                    A64f: up to a multiple of
 *                                                                    64 floats)
 *   P          = min(items, 1024, maxStorageBufferRange / rep_item, max(1, 256 MiB / rep_item))
 *   part       = RWKV-6: A256(4 * items * N) (the du partial of each item), RWKV-7: 0
 *   workspace  = ckpt + P * rep_item + part
 * Items run in batches of at most P (one dispatch each, in order, a barrier between), so that
 * the replay scratch is P items' worth; each batch's checkpoints are bound as their own range.
 * RWKV-6 then runs shaders/wkv_reduce.comp: du[h] = the partials of (s, h) summed over s in
 * order (deterministic).
 * E.g. B=1 T=4096 H=32 N=64: 64 MiB of checkpoints + 32 x 532 KiB (P = items = 32) = 81 MiB.
 * It depends on the device's limits: ask wkv_workspace_size on the context that will run it. */
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

static wkv_status check_problem(wkv_vk_state* st, const wkv_problem* p, wkv_message* msg) {
    if (p->op != WKV_OP_RWKV7 && p->op != WKV_OP_RWKV6)
        return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED, "op %d is not implemented", (int)p->op);
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
 * about 1500 tokens per sequence for the backward and 4600 for the forward at N = 64 (RWKV-7;
 * RWKV-6 about the same). */
static wkv_status lavapipe_budget(const wkv_vk_state* st, const wkv_problem* p, int backward, wkv_message* msg) {
    if (strncmp(st->props.deviceName, "llvmpipe", 8) != 0) return WKV_OK;
    const int64_t longest = wkv_vk_longest(p);
    const int64_t L = st->rolled ? (p->N + 15) / 16 + 1 : 1;
    const int64_t nseg = (longest + WKV_VK_K - 1) / WKV_VK_K;
    /* RWKV-6's backward has one more loop over a row per token than RWKV-7's */
    const int64_t count = backward ? longest * ((p->op == WKV_OP_RWKV6 ? 8 : 7) * L + 3) + nseg * (2 * L + 2) + 6 * L
                                   : longest * (2 * L + 4) + 4 * L;
    if (count <= 60000) return WKV_OK;
    return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED,
                       "a sequence of %lld tokens at N=%lld needs ~%lld loop iterations in one shader "
                       "invocation; lavapipe stops at 65535 (a software-rasteriser limit): split the "
                       "sequence or use another device", (long long)longest, (long long)p->N, (long long)count);
}

/* A knob read once per context (WKV_VULKAN_LANES, WKV_VULKAN_TC): 1..1024, else 0 (unset). */
int wkv_vk_env_knob(const char* name) {
    const char* v = getenv(name);
    if (!v || !*v) return 0;
    char* end = NULL;
    long x = strtol(v, &end, 10);
    return end && *end == '\0' && x > 0 && x <= 1024 ? (int)x : 0;
}

/* The forward's shape (shaders/wkv_rows.glsl). Lanes per state row C: the per-token chain of
 * dependent steps bounds the kernel, so with few (sequence, head) items it pays to give each
 * row C lanes (C times the warps, 1/C of the instructions per token per warp, one more
 * shuffle level per reduction and doubling); with many items one lane per row keeps the
 * arithmetic minimal. Decode (a few tokens) is the state's load and store: 8 lanes make each
 * row's 16-byte loads one contiguous 128-byte line. Thresholds (threads = items x N) were
 * set on the H100 (DESIGN.md); at least N/64
 * lanes so that a lane holds at most 64 state floats in registers; at most the subgroup size
 * and the workgroup limits. WKV_VULKAN_LANES forces C (tests, tuning). Tokens per chunk TC:
 * about 8 x C (about 8 staged values per vector per invocation), within shared memory, no
 * more than the longest sequence needs. DT: one specialised dtype when every per-token tensor
 * (and u) has it. */
vkw_spec wkv_vk_forward_spec(const wkv_vk_state* st, const wkv_problem* p) {
    const VkPhysicalDeviceLimits* lim = &st->props.limits;
    const int64_t N = p->N, items = p->num_seqs * p->H, threads = items * N;
    int c = 1;
    if (st->subgroup_shuffle) {
        const int64_t longest = wkv_vk_longest(p);
        c = longest <= 4 ? 8 : threads <= 65536 ? 2 : 1;
        while ((int64_t)c * 64 < N) c *= 2;
        if (st->knob_lanes) c = st->knob_lanes;
        int pow2 = 1;
        while (pow2 * 2 <= c) pow2 *= 2;
        c = pow2;
        while (c > 1 && (c > st->subgroup_size || (uint64_t)(N * c) > lim->maxComputeWorkGroupInvocations ||
                         (uint64_t)(N * c) > lim->maxComputeWorkGroupSize[0]))
            c /= 2;
    }
    const int64_t n4 = (N + 3) / 4, np4 = (n4 + c - 1) / c * c * 4;
    int64_t tc = st->knob_tc ? st->knob_tc : 8 * c;
    while (tc > 1 && 24 * tc * np4 > (int64_t)lim->maxComputeSharedMemorySize) tc /= 2;
    const int64_t longest = wkv_vk_longest(p);
    while (tc > 1 && tc / 2 >= longest) tc /= 2;
    const wkv_view* tok[] = {&p->r, &p->w, &p->k, &p->v, &p->a, &p->b, &p->u, &p->y};
    int dt = -2;
    for (size_t i = 0; i < sizeof tok / sizeof tok[0]; ++i) {
        if (!tok[i]->data) continue;
        if (dt == -2) dt = (int)tok[i]->elem;
        else if (dt != (int)tok[i]->elem) dt = -1;
    }
    vkw_spec sp = {(int)N, (int)(tc < 1 ? 1 : tc), c, dt < 0 ? -1 : dt};
    return sp;
}

/* ------------------------------------------------------------------------------ forward */

/* What a recorded forward depends on besides the parameter block (rewritten in place every
 * call): the kernel variant, the dispatch, and every binding. */
static void replay_key(const wkv_vk_state* st, int kernel, VkPipeline pipe, int64_t items, const op_plan* op,
                       vkw_replay_key* k) {
    memset(k, 0, sizeof *k);
    k->kernel = kernel;
    k->pipeline = pipe;
    k->items = items;
    k->epoch = st->buffer_epoch;
    k->params_bytes = op->params_bytes;
    k->params_offset = op->params_offset;
    k->params_buffer = op->params_buffer;
    for (int i = 0; i < WKV_PROBLEM_VIEWS; ++i) {
        k->buffer[i] = op->slot[i].buffer;
        k->offset[i] = op->slot[i].offset;
        k->range[i] = op->slot[i].range;
    }
}

wkv_status wkv_vk_rwkv7_forward(wkv_vk_state* st, const wkv_problem* p, wkv_message* msg) {
    wkv_status s = check_problem(st, p, msg);
    if (s) return s;
    if ((s = lavapipe_budget(st, p, 0, msg))) return s;
    static const int ins7[] = {S_R, S_W, S_K, S_V, S_A, S_B, S_SIN};
    static const int ins6[] = {S_R, S_W, S_K, S_V, S_U, S_SIN};
    static const int outs[] = {S_Y, S_SOUT};
    const int r6 = p->op == WKV_OP_RWKV6;
    const int kernel = r6 ? WKV_VK_KERNEL_RWKV6_FWD : WKV_VK_KERNEL_RWKV7_FWD;
    VkPipeline pipe;
    if ((s = wkv_vk_pipeline(st, kernel, wkv_vk_forward_spec(st, p), &pipe, msg))) return s;
    op_plan op;
    if ((s = wkv_vk_prepare(st, p, &op, r6 ? ins6 : ins7, r6 ? 6 : 7, outs, 2, NULL, msg))) return s;
    const int64_t items = op.S * p->H;
    /* A decode loop on buffers: the same bindings as the last forward, so its command buffer
     * runs again as recorded (the parameter block was just rewritten in place). Only when
     * nothing is staged (op.total == 0), not while recording into the host's buffer, and not
     * when this call goes into a command buffer with others (batching: vk_internal.h, ASYNC
     * CALLS; a command buffer of its own would cost the GPU more than the recording saves). */
    vkw_replay_key key;
    const int replayable = !st->recording && op.total == 0 && !st->batching;
    if (replayable) {
        replay_key(st, kernel, pipe, items, &op, &key);
        if (st->replay_valid && memcmp(&key, &st->replay_key, sizeof key) == 0) {
            st->prof.replayed++;
            s = vkw_resubmit_wait(st, msg);
            if (s) st->replay_valid = 0;
            return s;
        }
    }
    VkDescriptorSet set;
    if ((s = wkv_vk_descriptor_sets(st, kernel, 1, -1, &set, msg))) return s;
    wkv_vk_write_set(st, kernel, set, &op, NULL, NULL, NULL);
    if ((s = wkv_vk_record_upload(st, &op, msg))) return s;
    const vkw_kernel* kern = &st->kernels[kernel];
    st->fn.vkCmdBindPipeline(st->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
    st->fn.vkCmdBindDescriptorSets(st->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, kern->layout, 0, 1, &set, 0, NULL);
    const int64_t max_groups = st->props.limits.maxComputeWorkGroupCount[0];
    for (int64_t i0 = 0; i0 < items; i0 += max_groups) {
        const int64_t count = items - i0 < max_groups ? items - i0 : max_groups;
        gpu_push pc = {(int32_t)i0, 0, 0, 0};
        st->fn.vkCmdPushConstants(st->cmd, kern->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof pc, &pc);
        st->fn.vkCmdDispatch(st->cmd, (uint32_t)count, 1, 1);
    }
    s = wkv_vk_finish_and_download(st, &op, msg);
    if (s == WKV_OK && replayable && st->batch_calls == 1) { /* this call alone, ended */
        st->replay_key = key;
        st->replay_valid = 1;
    }
    return s;
}

/* ----------------------------------------------------------------------------- backward */

typedef struct bwd_layout {
    int64_t items, P;
    int64_t total_mats;     /* checkpoint matrices: H * G */
    uint64_t ck_region;     /* bytes */
    uint64_t rep_item;      /* bytes per item */
    int32_t rep_stride;     /* floats per item */
    int64_t max_item_mats;  /* the most checkpoints of one item */
    uint64_t part;          /* RWKV-6: bytes of du partials (items * N floats) */
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
    L->ck_region = wkv_vk_align_up((uint64_t)L->total_mats * (uint64_t)NN * 4u, 256) + 256;
    L->rep_stride = (int32_t)wkv_vk_align_up((uint64_t)((WKV_VK_K + 1) * NN + WKV_VK_K * N), 64);
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
    L->part = p->op == WKV_OP_RWKV6 ? wkv_vk_align_up((uint64_t)L->items * (uint64_t)N * 4u, 256) : 0;
    if (L->part > range)
        return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED, "the du partials (%lld items x N=%lld) exceed "
                           "maxStorageBufferRange", (long long)L->items, (long long)N);
    L->total = L->ck_region + (uint64_t)P * L->rep_item + L->part;
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
    VkDescriptorSet* sets = (VkDescriptorSet*)malloc(sizeof(VkDescriptorSet) * (size_t)(L.items + 1));
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
    const uint64_t ck_align = wkv_vk_offset_alignment(st);
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

    static const int ins7[] = {S_R, S_W, S_K, S_V, S_A, S_B, S_SIN, S_DY, S_DSOUT};
    static const int outs7[] = {S_DR, S_DW, S_DK, S_DV, S_DA, S_DB, S_DSIN};
    static const int ins6[] = {S_R, S_W, S_K, S_V, S_U, S_SIN, S_DY, S_DSOUT};
    static const int outs6[] = {S_DR, S_DW, S_DK, S_DV, S_DU, S_DSIN};
    const int r6 = p->op == WKV_OP_RWKV6;
    const int kernel = r6 ? WKV_VK_KERNEL_RWKV6_BWD : WKV_VK_KERNEL_RWKV7_BWD;
    VkPipeline pipe, reduce = VK_NULL_HANDLE;
    if ((s = wkv_vk_pipeline(st, kernel, wkv_vk_spec_n((int)p->N), &pipe, msg))) goto done;
    if (r6 && (s = wkv_vk_pipeline(st, WKV_VK_KERNEL_REDUCE, wkv_vk_spec_n(0), &reduce, msg))) goto done;
    /* the workspace: the caller's wkv_buffer, or device scratch of ours */
    VkBuffer ws;
    if (p->workspace_mem.buffer) {
        ws = ((const vkw_buffer*)p->workspace_mem.buffer)->buffer;
    } else {
        if ((s = vkw_buffer_reserve(st, &st->scratch, L.total, WKV_VK_DEVICE_LOCAL, msg))) goto done;
        ws = st->scratch.buffer;
    }
    op_plan op;
    if ((s = wkv_vk_prepare(st, p, &op, r6 ? ins6 : ins7, r6 ? 8 : 9, r6 ? outs6 : outs7, r6 ? 6 : 7, seg0, msg)))
        goto done;
    if ((s = wkv_vk_descriptor_sets(st, kernel, (uint32_t)nb, r6 ? WKV_VK_KERNEL_REDUCE : -1, sets, msg))) goto done;
    VkDescriptorBufferInfo rep = {ws, L.ck_region, (VkDeviceSize)L.P * L.rep_item};
    VkDescriptorBufferInfo part = {ws, L.ck_region + (VkDeviceSize)L.P * L.rep_item, r6 ? L.part : 16};
    if (r6) wkv_vk_write_set(st, WKV_VK_KERNEL_REDUCE, sets[nb], &op, NULL, NULL, &part);
    for (int64_t b = 0; b < nb; ++b) {
        const uint64_t off = (uint64_t)mats[bounds[b]] * (uint64_t)NN * 4u;
        const uint64_t aligned = off & ~(ck_align - 1);
        uint64_t len = (uint64_t)mats[bounds[b + 1]] * (uint64_t)NN * 4u - aligned;
        if (len < 16) len = 16;
        VkDescriptorBufferInfo ck = {ws, aligned, len};
        wkv_vk_write_set(st, kernel, sets[b], &op, &ck, &rep, &part);
    }
    if ((s = wkv_vk_record_upload(st, &op, msg))) goto done;
    const vkw_kernel* kern = &st->kernels[kernel];
    st->fn.vkCmdBindPipeline(st->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
    for (int64_t b = 0; b < nb; ++b) {
        const int64_t i0 = bounds[b], i1 = bounds[b + 1];
        const uint64_t off = (uint64_t)mats[i0] * (uint64_t)NN * 4u;
        const uint64_t aligned = off & ~(ck_align - 1);
        gpu_push pc = {(int32_t)i0, (int32_t)mats[i0], (int32_t)((off - aligned) / 4u), L.rep_stride};
        if (b > 0) /* the replay scratch is reused: the previous batch must be done with it */
            wkv_vk_compute_barrier(st);
        st->fn.vkCmdBindDescriptorSets(st->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, kern->layout, 0, 1, &sets[b], 0, NULL);
        st->fn.vkCmdPushConstants(st->cmd, kern->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof pc, &pc);
        st->fn.vkCmdDispatch(st->cmd, (uint32_t)(i1 - i0), 1, 1);
    }
    if (r6) { /* du = the partials summed over sequences, in order */
        wkv_vk_compute_barrier(st);
        const vkw_kernel* rk = &st->kernels[WKV_VK_KERNEL_REDUCE];
        const int64_t elems = H * p->N;
        st->fn.vkCmdBindPipeline(st->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, reduce);
        st->fn.vkCmdBindDescriptorSets(st->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, rk->layout, 0, 1, &sets[nb], 0, NULL);
        for (int64_t e0 = 0; e0 < elems; e0 += 64 * max_groups) {
            const int64_t n = elems - e0 < 64 * max_groups ? elems - e0 : 64 * max_groups;
            gpu_push pc = {(int32_t)e0, 0, 0, 0};
            st->fn.vkCmdPushConstants(st->cmd, rk->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof pc, &pc);
            st->fn.vkCmdDispatch(st->cmd, (uint32_t)((n + 63) / 64), 1, 1);
        }
    }
    s = wkv_vk_finish_and_download(st, &op, msg);
done:
    free(seg0);
    free(mats);
    free(sets);
    free(bounds);
    return s;
}
