/* Softmax attention forward on Vulkan: the host side of shaders/attn_fwd.comp (its top comment
 * has the algorithm); vk_op.c binds and stages the tensors.
 *
 * CONFIGURATIONS. Two, differing in how many invocations share a query row:
 *   vulkan.tiled.q16.kv16  4 lanes per row (D split four ways, dot products summed by subgroup
 *                          shuffles), 16 rows per workgroup of 64: the default where compute
 *                          shaders have subgroup shuffles and subgroups of at least 4;
 *   vulkan.tiled.q64.kv16  1 lane per row, 64 rows per workgroup: any device (the default
 *                          without shuffles).
 * Keys go through shared memory in blocks of 16 (8 for D > 128): 2 * 16 * 128 * 4 = 16 KiB at
 * most, the smallest maxComputeSharedMemorySize Vulkan allows, so both fit every device with
 * shuffles; q64 fits every device.
 *
 * PARAMETER BLOCK (std430, attn_fwd.comp Params): gpu_attn_header (48 bytes), gpu_tensor td[5]
 * (q, k, v, o, lse), then per sequence two ivec4: (q0, q1, k0, k1), (batch, tiles before it,
 * 0, 0). Items: (tile, query head), item = tile * Hq + head, tiles over every sequence.
 *
 * BACKWARD (shaders/attn_bwd.comp): two dispatches in one submission, independent of each
 * other (each writes its own outputs, both only read): attn_bwd_kv over (key tile of 64, kv
 * head) writes dk and dv, attn_bwd_q over (query tile of 64, query head) writes dq. One
 * invocation per key / row, no subgroup operations, so one configuration for every device.
 * Its parameter block: the same header, td[10] (q k v o lse dout dlse dq dk dv), per sequence
 * (q0, q1, k0, k1), (batch, query tiles before it, key tiles before it, 0). */
#include <stdio.h>
#include <string.h>

#include "vk_internal.h"

typedef struct gpu_attn_header {
    int32_t B, Tq, Tk, Hq, Hkv, D, causal, num_seqs;
    float scale;
    int32_t pad[3];
} gpu_attn_header;

enum { ATTN_MAX_D = 256, ATTN_SLOTS = 5, ATTN_WG = 64 };

typedef struct attn_config {
    const char* name;
    int lanes;
} attn_config;

static const attn_config k_configs[] = {
    {"vulkan.tiled.q16.kv16", 4},
    {"vulkan.tiled.q64.kv16", 1},
};
enum { NUM_CONFIGS = (int)(sizeof k_configs / sizeof k_configs[0]) };

/* 4 lanes need subgroupShuffleXor within groups of 4 consecutive invocations. */
static int lanes_fit(const wkv_vk_state* st, int lanes) {
    return lanes == 1 || (st->subgroup_shuffle && st->subgroup_size >= lanes);
}

static int keys_per_block(int64_t D) { return D > 128 ? 8 : 16; }

int32_t wkv_vk_attention_configs(void* state, wkv_attention_config* out, int32_t capacity) {
    const wkv_vk_state* st = (const wkv_vk_state*)state;
    const int def = lanes_fit(st, 4) ? 0 : 1;
    for (int32_t i = 0; i < capacity && i < NUM_CONFIGS; ++i) {
        const attn_config* c = &k_configs[i];
        wkv_attention_config* o = &out[i];
        snprintf(o->name, sizeof o->name, "%s", c->name);
        o->max_head_dim = ATTN_MAX_D;
        o->block_q = ATTN_WG / c->lanes;
        o->block_kv = keys_per_block(128);
        o->warps = st->subgroup_size > 0 ? (ATTN_WG + st->subgroup_size - 1) / st->subgroup_size : 0;
        o->shared_bytes = 2u * (uint64_t)keys_per_block(128) * 128u * 4u;
        o->fits = lanes_fit(st, c->lanes) && o->shared_bytes <= st->props.limits.maxComputeSharedMemorySize;
        o->is_default = i == def;
    }
    return NUM_CONFIGS;
}

typedef struct attn_params {
    const wkv_attention_problem* p;
    int64_t block_q;
} attn_params;

/* The header, `slots` tensor descriptors, and per sequence (q0, q1, k0, k1), (batch, query
 * tiles of bq rows before it, key tiles of bk keys before it (bk 0: 0), 0). */
static void write_params(char* base, const op_plan* op, const wkv_attention_problem* p, int slots, int64_t bq,
                         int64_t bk) {
    gpu_attn_header h;
    memset(&h, 0, sizeof h);
    h.B = (int32_t)p->B, h.Tq = (int32_t)p->Tq, h.Tk = (int32_t)p->Tk;
    h.Hq = (int32_t)p->Hq, h.Hkv = (int32_t)p->Hkv, h.D = (int32_t)p->D;
    h.causal = p->causal, h.num_seqs = (int32_t)p->num_seqs, h.scale = p->scale;
    memcpy(base, &h, sizeof h);
    gpu_tensor* td = (gpu_tensor*)(base + sizeof h);
    for (int s = 0; s < slots; ++s) td[s] = op->slot[s].d;
    int32_t* seqs = (int32_t*)(td + slots);
    int64_t q_tiles = 0, k_tiles = 0;
    for (int64_t s = 0; s < p->num_seqs; ++s) {
        int64_t b, q0, q1, k0, k1;
        wkv_attention_sequence(p, s, &b, &q0, &q1, &k0, &k1);
        int32_t* e = seqs + 8 * s;
        e[0] = (int32_t)q0, e[1] = (int32_t)q1, e[2] = (int32_t)k0, e[3] = (int32_t)k1;
        e[4] = (int32_t)b, e[5] = (int32_t)q_tiles, e[6] = (int32_t)k_tiles, e[7] = 0;
        q_tiles += (q1 - q0 + bq - 1) / bq;
        if (bk) k_tiles += (k1 - k0 + bk - 1) / bk;
    }
}

static void write_attn_params(char* base, const op_plan* op, const void* data) {
    const attn_params* a = (const attn_params*)data;
    write_params(base, op, a->p, ATTN_SLOTS, a->block_q, 0);
}

static int buffers_only(const wkv_attention_problem* p) {
    const wkv_view* v[ATTN_SLOTS] = {&p->q, &p->k, &p->v, &p->o, &p->lse};
    for (int i = 0; i < ATTN_SLOTS; ++i)
        if (v[i]->data && !p->mem[i].buffer) return 0;
    return 1;
}

static wkv_status run(wkv_vk_state* st, const wkv_attention_problem* p, wkv_message* msg) {
    if (p->D > ATTN_MAX_D)
        return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED, "attention head dim D = %lld: this backend takes D <= %d",
                           (long long)p->D, ATTN_MAX_D);
    int lanes = k_configs[lanes_fit(st, 4) ? 0 : 1].lanes;
    for (int i = 0; i < NUM_CONFIGS; ++i)
        if (p->config && strcmp(p->config, k_configs[i].name) == 0) lanes = k_configs[i].lanes;
    const int64_t bq = ATTN_WG / lanes, bk = keys_per_block(p->D);
    int64_t tiles = 0, longest_k = 0;
    for (int64_t s = 0; s < p->num_seqs; ++s) {
        int64_t b, q0, q1, k0, k1;
        wkv_attention_sequence(p, s, &b, &q0, &q1, &k0, &k1);
        tiles += (q1 - q0 + bq - 1) / bq;
        if (k1 - k0 > longest_k) longest_k = k1 - k0;
    }
    if (p->Tq > INT32_MAX / 2 || p->Tk > INT32_MAX / 2 || p->num_seqs > INT32_MAX / 8 || tiles * p->Hq > INT32_MAX / 2)
        return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED, "attention: Tq, Tk or the number of query tiles beyond 2^30");
    /* lavapipe stops every loop of an invocation after 65535 iterations in total (vk_rwkv7.c):
     * per key block the load loop, the rolled loops over a row's components, the block loop */
    if (strncmp(st->props.deviceName, "llvmpipe", 8) == 0) {
        const int64_t dl = (p->D + lanes - 1) / lanes, blocks = (longest_k + bk - 1) / bk;
        const int64_t count = blocks * (2 + (bk * p->D + ATTN_WG - 1) / ATTN_WG + 2 * bk * ((dl + 15) / 16)) + 64;
        if (count > 60000)
            return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED,
                               "attention over %lld keys at D = %lld needs ~%lld loop iterations in one shader "
                               "invocation; lavapipe stops at 65535 (a software-rasteriser limit): split the keys "
                               "or use another device", (long long)longest_k, (long long)p->D, (long long)count);
    }
    const int64_t items = tiles * p->Hq;
    if (items == 0) return WKV_OK; /* no query row: nothing to write */

    op_plan op;
    memset(&op, 0, sizeof op);
    op.S = p->num_seqs;
    op.params_bytes = sizeof(gpu_attn_header) + ATTN_SLOTS * sizeof(gpu_tensor) + 32u * (uint64_t)p->num_seqs;
    const wkv_view* views[ATTN_SLOTS] = {&p->q, &p->k, &p->v, &p->o, &p->lse};
    static const char* names[ATTN_SLOTS] = {"q", "k", "v", "o", "lse"};
    const int64_t ext[ATTN_SLOTS][4] = {{p->B, p->Tq, p->Hq, p->D}, {p->B, p->Tk, p->Hkv, p->D},
                                        {p->B, p->Tk, p->Hkv, p->D}, {p->B, p->Tq, p->Hq, p->D},
                                        {p->B, p->Tq, p->Hq, 1}};
    wkv_status s;
    for (int i = 0; i < ATTN_SLOTS; ++i)
        if ((s = wkv_vk_plan_view(st, views[i], &p->mem[i], ext[i], &op.slot[i], names[i], i >= 3, msg))) return s;
    const vkw_spec spec = {(int)p->D, (int)bk, lanes, -1};
    VkPipeline pipe;
    if ((s = wkv_vk_pipeline(st, WKV_VK_KERNEL_ATTN, spec, &pipe, msg))) return s;
    const attn_params data = {p, bq};
    if ((s = wkv_vk_stage(st, &op, write_attn_params, &data, msg))) return s;
    VkDescriptorSet set;
    if ((s = wkv_vk_descriptor_sets(st, WKV_VK_KERNEL_ATTN, 1, -1, &set, msg))) return s;
    wkv_vk_write_set(st, WKV_VK_KERNEL_ATTN, set, &op, NULL, NULL, NULL);
    if ((s = wkv_vk_record_upload(st, &op, msg))) return s;
    const vkw_kernel* kern = &st->kernels[WKV_VK_KERNEL_ATTN];
    st->fn.vkCmdBindPipeline(st->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
    st->fn.vkCmdBindDescriptorSets(st->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, kern->layout, 0, 1, &set, 0, NULL);
    const int64_t max_groups = (int64_t)st->props.limits.maxComputeWorkGroupCount[0];
    for (int64_t i0 = 0; i0 < items; i0 += max_groups) {
        const int64_t n = items - i0 < max_groups ? items - i0 : max_groups;
        gpu_push pc = {(int32_t)i0, 0, 0, 0};
        st->fn.vkCmdPushConstants(st->cmd, kern->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof pc, &pc);
        st->fn.vkCmdDispatch(st->cmd, (uint32_t)n, 1, 1);
    }
    return wkv_vk_finish_and_download(st, &op, msg);
}

wkv_status wkv_vk_attention(void* state, const wkv_attention_problem* p, wkv_message* msg) {
    wkv_vk_state* st = (wkv_vk_state*)state;
    wkv_status s = vkw_call_begin(st, buffers_only(p), msg);
    if (s == WKV_OK) s = run(st, p, msg);
    st->call_async = st->appending = st->batching = 0;
    return s;
}

/* ---------------------------------------------------------------------------- backward */

enum { BWD_SLOTS = 10, BWD_TILE = ATTN_WG };

static void write_bwd_params(char* base, const op_plan* op, const void* data) {
    write_params(base, op, &((const wkv_attention_backward_problem*)data)->fwd, BWD_SLOTS, BWD_TILE, BWD_TILE);
}

static int bwd_buffers_only(const wkv_attention_backward_problem* bp) {
    const wkv_view* v[5] = {&bp->dout, &bp->dq, &bp->dk, &bp->dv, &bp->dlse};
    for (int i = 0; i < 5; ++i)
        if (v[i]->data && !bp->mem[i].buffer) return 0;
    return buffers_only(&bp->fwd);
}

static wkv_status run_backward(wkv_vk_state* st, const wkv_attention_backward_problem* bp, wkv_message* msg) {
    const wkv_attention_problem* p = &bp->fwd;
    if (p->D > ATTN_MAX_D)
        return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED, "attention head dim D = %lld: this backend takes D <= %d",
                           (long long)p->D, ATTN_MAX_D);
    const int64_t bk = keys_per_block(p->D), group = p->Hq / p->Hkv;
    int64_t q_tiles = 0, k_tiles = 0, longest_q = 0, longest_k = 0;
    for (int64_t s = 0; s < p->num_seqs; ++s) {
        int64_t b, q0, q1, k0, k1;
        wkv_attention_sequence(p, s, &b, &q0, &q1, &k0, &k1);
        q_tiles += (q1 - q0 + BWD_TILE - 1) / BWD_TILE;
        k_tiles += (k1 - k0 + BWD_TILE - 1) / BWD_TILE;
        if (q1 - q0 > longest_q) longest_q = q1 - q0;
        if (k1 - k0 > longest_k) longest_k = k1 - k0;
    }
    if (p->Tq > INT32_MAX / 2 || p->Tk > INT32_MAX / 2 || p->num_seqs > INT32_MAX / 8 ||
        q_tiles * p->Hq > INT32_MAX / 2 || k_tiles * p->Hkv > INT32_MAX / 2)
        return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED, "attention: Tq, Tk or the number of tiles beyond 2^30");
    /* lavapipe's 65535 loop iterations per invocation (the forward's run()): per block of bk
     * keys (dq) or rows (dk, dv) the load loop and bk times the rolled loops over D */
    if (strncmp(st->props.deviceName, "llvmpipe", 8) == 0) {
        const int64_t dr = (p->D + 15) / 16, load = (bk * p->D + ATTN_WG - 1) / ATTN_WG;
        const int64_t q_count = ((longest_k + bk - 1) / bk) * (2 + load + bk * (1 + 3 * dr)) + 8 * dr;
        const int64_t kv_count = group * ((longest_q + bk - 1) / bk) * (2 + load + dr + bk * (1 + 4 * dr)) + 8 * dr;
        const int64_t count = q_count > kv_count ? q_count : kv_count;
        if (count > 60000)
            return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED,
                               "attention backward over %lld rows x %lld keys (%lld query heads per kv head) at "
                               "D = %lld needs ~%lld loop iterations in one shader invocation; lavapipe stops at "
                               "65535 (a software-rasteriser limit): split the sequence or use another device",
                               (long long)longest_q, (long long)longest_k, (long long)group, (long long)p->D,
                               (long long)count);
    }
    const int64_t kv_items = k_tiles * p->Hkv, q_items = q_tiles * p->Hq;
    if (kv_items == 0 && q_items == 0) return WKV_OK; /* no key and no row: nothing to write */

    op_plan op;
    memset(&op, 0, sizeof op);
    op.S = p->num_seqs;
    op.params_bytes = sizeof(gpu_attn_header) + BWD_SLOTS * sizeof(gpu_tensor) + 32u * (uint64_t)p->num_seqs;
    const wkv_view* views[BWD_SLOTS] = {&p->q, &p->k, &p->v, &p->o, &p->lse,
                                        &bp->dout, &bp->dlse, &bp->dq, &bp->dk, &bp->dv};
    const wkv_buffer_ref* mems[BWD_SLOTS] = {&p->mem[0], &p->mem[1], &p->mem[2], &p->mem[3], &p->mem[4],
                                             &bp->mem[0], &bp->mem[4], &bp->mem[1], &bp->mem[2], &bp->mem[3]};
    static const char* names[BWD_SLOTS] = {"q", "k", "v", "o", "lse", "dout", "dlse", "dq", "dk", "dv"};
    const int64_t qx[4] = {p->B, p->Tq, p->Hq, p->D}, kx[4] = {p->B, p->Tk, p->Hkv, p->D};
    const int64_t lx[4] = {p->B, p->Tq, p->Hq, 1};
    const int64_t* ext[BWD_SLOTS] = {qx, kx, kx, qx, lx, qx, lx, qx, kx, kx};
    wkv_status s;
    for (int i = 0; i < BWD_SLOTS; ++i)
        if ((s = wkv_vk_plan_view(st, views[i], mems[i], ext[i], &op.slot[i], names[i], i >= 7, msg))) return s;
    const vkw_spec spec = {(int)p->D, (int)bk, 1, -1};
    VkPipeline pipes[2];
    if ((s = wkv_vk_pipeline(st, WKV_VK_KERNEL_ATTN_BWD_KV, spec, &pipes[0], msg))) return s;
    if ((s = wkv_vk_pipeline(st, WKV_VK_KERNEL_ATTN_BWD_Q, spec, &pipes[1], msg))) return s;
    if ((s = wkv_vk_stage(st, &op, write_bwd_params, bp, msg))) return s;
    VkDescriptorSet sets[2];
    if ((s = wkv_vk_descriptor_sets(st, WKV_VK_KERNEL_ATTN_BWD_KV, 1, WKV_VK_KERNEL_ATTN_BWD_Q, sets, msg))) return s;
    wkv_vk_write_set(st, WKV_VK_KERNEL_ATTN_BWD_KV, sets[0], &op, NULL, NULL, NULL);
    wkv_vk_write_set(st, WKV_VK_KERNEL_ATTN_BWD_Q, sets[1], &op, NULL, NULL, NULL);
    if ((s = wkv_vk_record_upload(st, &op, msg))) return s;
    const int kernels[2] = {WKV_VK_KERNEL_ATTN_BWD_KV, WKV_VK_KERNEL_ATTN_BWD_Q};
    const int64_t items[2] = {kv_items, q_items};
    const int64_t max_groups = (int64_t)st->props.limits.maxComputeWorkGroupCount[0];
    for (int k = 0; k < 2; ++k) {
        if (items[k] == 0) continue;
        const vkw_kernel* kern = &st->kernels[kernels[k]];
        st->fn.vkCmdBindPipeline(st->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipes[k]);
        st->fn.vkCmdBindDescriptorSets(st->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, kern->layout, 0, 1, &sets[k], 0, NULL);
        for (int64_t i0 = 0; i0 < items[k]; i0 += max_groups) {
            const int64_t n = items[k] - i0 < max_groups ? items[k] - i0 : max_groups;
            gpu_push pc = {(int32_t)i0, 0, 0, 0};
            st->fn.vkCmdPushConstants(st->cmd, kern->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof pc, &pc);
            st->fn.vkCmdDispatch(st->cmd, (uint32_t)n, 1, 1);
        }
    }
    return wkv_vk_finish_and_download(st, &op, msg);
}

wkv_status wkv_vk_attention_backward(void* state, const wkv_attention_backward_problem* p, wkv_message* msg) {
    wkv_vk_state* st = (wkv_vk_state*)state;
    wkv_status s = vkw_call_begin(st, bwd_buffers_only(p), msg);
    if (s == WKV_OK) s = run_backward(st, p, msg);
    st->call_async = st->appending = st->batching = 0;
    return s;
}
