/* RWKV-4 forward and backward on Vulkan: the host side of shaders/wkv4_fwd.comp,
 * shaders/wkv4_bwd.comp and (backward) shaders/wkv_reduce.comp; vk_op.c binds and stages the
 * tensors.
 *
 * One invocation per item (sequence s, channel c), item = s * C + c, 64 per workgroup. The
 * arithmetic is backends/cpu/rwkv4.cpp's step for step: float32 exponentials, pp carried as
 * an exact float32 pair (ph + pl, TwoSum) inside a call so that it does not drift at large k;
 * state_out holds ph.
 *
 * BACKWARD WORKSPACE (bytes; K = 32, items = sequences * C):
 *   G     = sum over sequences of ceil(L_s / K)
 *   ckpt  = A256(16 * C * G)                      (the state before each segment: aa bb ph pl)
 *   P     = min(items, 65536)                     (items per dispatch; a barrier between)
 *   rep   = A256(16 * K * P)                      (each in-flight item's K replay states)
 *   part  = A256(8 * sequences * C)               (dwd and du partials per sequence)
 *   workspace = ckpt + rep + part
 * each region at most maxStorageBufferRange (else WKV_ERROR_UNSUPPORTED). wkv_reduce.comp then
 * sums the partials over sequences in order (deterministic): dw = wd * sum dwd (0 when the sum
 * is 0), du = sum.
 * E.g. B=1 T=4096 C=4096: 8 MiB of checkpoints + 2 MiB of replay + 32 KiB. */
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

static wkv_status check4(const wkv_vk_state* st, const wkv_problem* p, int backward, wkv_message* msg) {
    if (p->decay_form != WKV_DECAY_EXP_NEG_EXP)
        return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED, "RWKV-4 needs decay_form WKV_DECAY_EXP_NEG_EXP");
    if (p->T > INT32_MAX || p->B > INT32_MAX || p->num_seqs * p->N > INT32_MAX / 2)
        return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED, "T, B or sequences x channels beyond 2^30");
    /* lavapipe stops every loop of an invocation after 65535 iterations in total (see
     * vk_rwkv7.c): ~1 per token forward, ~3 per token backward (+ replay per segment). */
    if (strncmp(st->props.deviceName, "llvmpipe", 8) == 0) {
        const int64_t longest = wkv_vk_longest(p);
        const int64_t count = backward ? 3 * longest + 2 * ((longest + WKV_VK_K - 1) / WKV_VK_K) + 8 : longest + 4;
        if (count > 60000)
            return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED,
                               "a sequence of %lld tokens needs ~%lld loop iterations in one shader invocation; "
                               "lavapipe stops at 65535 (a software-rasteriser limit): split the sequence or use "
                               "another device", (long long)longest, (long long)count);
    }
    return WKV_OK;
}

static void dispatch_items(wkv_vk_state* st, const vkw_kernel* kern, int64_t i0, int64_t n) {
    const int64_t max_items = 64 * (int64_t)st->props.limits.maxComputeWorkGroupCount[0];
    for (int64_t e0 = i0; e0 < i0 + n; e0 += max_items) {
        const int64_t m = i0 + n - e0 < max_items ? i0 + n - e0 : max_items;
        gpu_push pc = {(int32_t)e0, 0, 0, 0};
        st->fn.vkCmdPushConstants(st->cmd, kern->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof pc, &pc);
        st->fn.vkCmdDispatch(st->cmd, (uint32_t)((m + 63) / 64), 1, 1);
    }
}

wkv_status wkv_vk_rwkv4_forward(wkv_vk_state* st, const wkv_problem* p, wkv_message* msg) {
    wkv_status s = check4(st, p, 0, msg);
    if (s) return s;
    static const int ins[] = {S_W, S_K, S_V, S_U, S_SIN};
    static const int outs[] = {S_Y, S_SOUT};
    const int kernel = WKV_VK_KERNEL_RWKV4_FWD;
    VkPipeline pipe;
    if ((s = wkv_vk_pipeline(st, kernel, wkv_vk_spec_n(0), &pipe, msg))) return s;
    op_plan op;
    if ((s = wkv_vk_prepare(st, p, &op, ins, 5, outs, 2, NULL, msg))) return s;
    VkDescriptorSet set;
    if ((s = wkv_vk_descriptor_sets(st, kernel, 1, -1, &set, msg))) return s;
    wkv_vk_write_set(st, kernel, set, &op, NULL, NULL, NULL);
    if ((s = wkv_vk_record_upload(st, &op, msg))) return s;
    const vkw_kernel* kern = &st->kernels[kernel];
    st->fn.vkCmdBindPipeline(st->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
    st->fn.vkCmdBindDescriptorSets(st->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, kern->layout, 0, 1, &set, 0, NULL);
    dispatch_items(st, kern, 0, op.S * p->N);
    return wkv_vk_finish_and_download(st, &op, msg);
}

typedef struct layout4 {
    int64_t items, P, G;
    uint64_t ck, rep, part, total;
} layout4;

static wkv_status plan4(const wkv_vk_state* st, const wkv_problem* p, layout4* L, wkv_message* msg) {
    int64_t G = 0;
    for (int64_t q = 0; q < p->num_seqs; ++q) {
        int64_t batch, t0, t1;
        wkv_problem_sequence(p, q, &batch, &t0, &t1);
        G += (t1 - t0 + WKV_VK_K - 1) / WKV_VK_K;
    }
    const uint64_t C = (uint64_t)p->N, range = st->props.limits.maxStorageBufferRange;
    L->items = p->num_seqs * p->N;
    L->G = G;
    L->P = L->items < 65536 ? L->items : 65536;
    if (L->P < 1) L->P = 1;
    L->ck = wkv_vk_align_up(16u * C * (uint64_t)G, 256);
    if (L->ck < 256) L->ck = 256;
    L->rep = wkv_vk_align_up(16u * WKV_VK_K * (uint64_t)L->P, 256);
    L->part = wkv_vk_align_up(8u * (uint64_t)p->num_seqs * C, 256);
    if (L->part < 256) L->part = 256;
    if (L->ck > range || L->rep > range || L->part > range || 4u * C * (uint64_t)G > INT32_MAX)
        return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED,
                           "the backward's checkpoints (%llu bytes) exceed one binding of this device "
                           "(maxStorageBufferRange %llu bytes)", (unsigned long long)L->ck,
                           (unsigned long long)range);
    L->total = L->ck + L->rep + L->part;
    return WKV_OK;
}

wkv_status wkv_vk_rwkv4_workspace_size(wkv_vk_state* st, const wkv_problem* p, size_t* out, wkv_message* msg) {
    wkv_status s = check4(st, p, 1, msg);
    if (s) return s;
    layout4 L;
    if ((s = plan4(st, p, &L, msg))) return s;
    if (L.total > SIZE_MAX) return wkv_vk_fail(msg, WKV_ERROR_OVERFLOW, "the workspace overflows size_t");
    *out = (size_t)L.total;
    return WKV_OK;
}

wkv_status wkv_vk_rwkv4_backward(wkv_vk_state* st, const wkv_problem* p, wkv_message* msg) {
    wkv_status s = check4(st, p, 1, msg);
    if (s) return s;
    layout4 L;
    if ((s = plan4(st, p, &L, msg))) return s;
    int64_t* seg0 = (int64_t*)malloc(sizeof(int64_t) * (size_t)(p->num_seqs + 1));
    if (!seg0) return wkv_vk_fail(msg, WKV_ERROR_OUT_OF_MEMORY, "out of memory");
    int64_t acc = 0;
    for (int64_t q = 0; q < p->num_seqs; ++q) {
        int64_t batch, t0, t1;
        wkv_problem_sequence(p, q, &batch, &t0, &t1);
        seg0[q] = acc;
        acc += (t1 - t0 + WKV_VK_K - 1) / WKV_VK_K;
    }
    static const int ins[] = {S_W, S_K, S_V, S_U, S_SIN, S_DY, S_DSOUT};
    static const int outs[] = {S_DW, S_DK, S_DV, S_DU, S_DSIN};
    const int kernel = WKV_VK_KERNEL_RWKV4_BWD;
    VkPipeline pipe, reduce;
    VkBuffer ws;
    op_plan op;
    VkDescriptorSet sets[2];
    if ((s = wkv_vk_pipeline(st, kernel, wkv_vk_spec_n(0), &pipe, msg))) goto done;
    if ((s = wkv_vk_pipeline(st, WKV_VK_KERNEL_REDUCE, wkv_vk_spec_n(0), &reduce, msg))) goto done;
    if (p->workspace_mem.buffer) {
        ws = ((const vkw_buffer*)p->workspace_mem.buffer)->buffer;
    } else {
        if ((s = vkw_buffer_reserve(st, &st->scratch, L.total, WKV_VK_DEVICE_LOCAL, msg))) goto done;
        ws = st->scratch.buffer;
    }
    if ((s = wkv_vk_prepare(st, p, &op, ins, 7, outs, 5, seg0, msg))) goto done;
    if ((s = wkv_vk_descriptor_sets(st, kernel, 1, WKV_VK_KERNEL_REDUCE, sets, msg))) goto done;
    {
        VkDescriptorBufferInfo ck = {ws, 0, L.ck}, rep = {ws, L.ck, L.rep}, part = {ws, L.ck + L.rep, L.part};
        wkv_vk_write_set(st, kernel, sets[0], &op, &ck, &rep, &part);
        wkv_vk_write_set(st, WKV_VK_KERNEL_REDUCE, sets[1], &op, NULL, NULL, &part);
        if ((s = wkv_vk_record_upload(st, &op, msg))) goto done;
        const vkw_kernel* kern = &st->kernels[kernel];
        st->fn.vkCmdBindPipeline(st->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
        st->fn.vkCmdBindDescriptorSets(st->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, kern->layout, 0, 1, &sets[0], 0, NULL);
        /* batches of P items: the replay scratch is reused, a barrier between */
        for (int64_t i0 = 0; i0 < L.items; i0 += L.P) {
            if (i0 > 0) wkv_vk_compute_barrier(st);
            dispatch_items(st, kern, i0, L.items - i0 < L.P ? L.items - i0 : L.P);
        }
        wkv_vk_compute_barrier(st);
        const vkw_kernel* rk = &st->kernels[WKV_VK_KERNEL_REDUCE];
        st->fn.vkCmdBindPipeline(st->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, reduce);
        st->fn.vkCmdBindDescriptorSets(st->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, rk->layout, 0, 1, &sets[1], 0, NULL);
        dispatch_items(st, rk, 0, p->N);
        s = wkv_vk_finish_and_download(st, &op, msg);
    }
done:
    free(seg0);
    return s;
}
