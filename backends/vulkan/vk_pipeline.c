/* Kernels (shader module + descriptor-set layout + pipeline layout) and their pipelines, one
 * per (kernel, specialisation: head size N; for the forwards also tokens per chunk, lanes per
 * row and dtype), all specialisation constants of the one SPIR-V module of the kernel; the
 * module is the *_s16 variant when the device has 16-bit storage (*_nosg for the forwards on
 * a device without subgroup shuffles). Pipelines are created on first use and kept for the context's life. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"
#include "vk_spirv.h"

typedef struct kernel_def {
    const char* shader;
    int slots[WKV_PROBLEM_VIEWS];
    int num_slots;
    int workspace; /* WS_*: which workspace regions it binds */
} kernel_def;

enum { WS_CKPT = 1, WS_REPLAY = 2, WS_PART = 4 };

/* Indexed by WKV_VK_KERNEL_*. */
static const kernel_def k_kernels[WKV_VK_KERNELS] = {
    {"wkv7_fwd", {S_R, S_W, S_K, S_V, S_A, S_B, S_Y, S_SIN, S_SOUT}, 9, 0},
    {"wkv7_bwd", {S_R, S_W, S_K, S_V, S_A, S_B, S_SIN, S_DY, S_DSOUT, S_DR, S_DW, S_DK, S_DV, S_DA, S_DB, S_DSIN},
     16, WS_CKPT | WS_REPLAY},
    {"wkv6_fwd", {S_R, S_W, S_K, S_V, S_U, S_Y, S_SIN, S_SOUT}, 8, 0},
    {"wkv6_bwd", {S_R, S_W, S_K, S_V, S_U, S_SIN, S_DY, S_DSOUT, S_DR, S_DW, S_DK, S_DV, S_DSIN}, 13,
     WS_CKPT | WS_REPLAY | WS_PART},
    {"wkv4_fwd", {S_W, S_K, S_V, S_U, S_Y, S_SIN, S_SOUT}, 7, 0},
    {"wkv4_bwd", {S_W, S_K, S_V, S_U, S_SIN, S_DY, S_DSOUT, S_DK, S_DV, S_DSIN}, 10, WS_CKPT | WS_REPLAY | WS_PART},
    {"wkv_reduce", {S_W, S_DW, S_DU}, 3, WS_PART},
    {"attn_fwd", {0, 1, 2, 3, 4}, 5, 0}, /* q k v o lse (vk_attention.c), bindings 1..5 */
    /* q k v o lse dout dlse dq dk dv (vk_attention.c), bindings 1..10 */
    {"attn_bwd_kv", {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 10, 0},
    {"attn_bwd_q", {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 10, 0},
};

static const wkv_vk_spirv* find_spirv(const char* name) {
    for (size_t i = 0; i < wkv_vk_spirv_count; ++i)
        if (strcmp(wkv_vk_spirv_table[i].name, name) == 0) return &wkv_vk_spirv_table[i];
    return NULL;
}

/* The *_rolled variants on CPU implementations (lavapipe); WKV_VULKAN_ROLLED=0|1 overrides. */
static int use_rolled(const wkv_vk_state* st) {
    const char* v = getenv("WKV_VULKAN_ROLLED");
    if (v && (v[0] == '0' || v[0] == '1') && v[1] == '\0') return v[0] == '1';
    return st->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
}

wkv_status wkv_vk_kernels_create(wkv_vk_state* st, wkv_message* msg) {
    const int rolled = st->rolled = use_rolled(st);
    for (int k = 0; k < WKV_VK_KERNELS; ++k) {
        const kernel_def* d = &k_kernels[k];
        vkw_kernel* kern = &st->kernels[k];
        char name[64];
        if (!st->subgroup_shuffle &&
            (k == WKV_VK_KERNEL_RWKV7_FWD || k == WKV_VK_KERNEL_RWKV6_FWD || k == WKV_VK_KERNEL_ATTN))
            snprintf(name, sizeof name, "%s_nosg", d->shader); /* 32-bit words: any device */
        else
            snprintf(name, sizeof name, "%s%s%s", d->shader, st->storage16 ? "_s16" : "", rolled ? "_rolled" : "");
        const wkv_vk_spirv* spv = find_spirv(name);
        if (!spv) return wkv_vk_fail(msg, WKV_ERROR_INTERNAL, "shader %s is not embedded", name);

        VkShaderModuleCreateInfo smi;
        memset(&smi, 0, sizeof smi);
        smi.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO;
        smi.codeSize = spv->size;
        smi.pCode = spv->code;
        VkResult r = st->fn.vkCreateShaderModule(st->device, &smi, NULL, &kern->module);
        if (r != VK_SUCCESS) return wkv_vk_result(msg, r, "vkCreateShaderModule");

        kern->num_bindings = 0;
        kern->bindings[kern->num_bindings++] = 0; /* parameter block */
        for (int i = 0; i < d->num_slots; ++i) kern->bindings[kern->num_bindings++] = (uint32_t)d->slots[i] + 1;
        if (d->workspace & WS_CKPT) kern->bindings[kern->num_bindings++] = WKV_VK_BINDING_CKPT;
        if (d->workspace & WS_REPLAY) kern->bindings[kern->num_bindings++] = WKV_VK_BINDING_REPLAY;
        if (d->workspace & WS_PART) kern->bindings[kern->num_bindings++] = WKV_VK_BINDING_PART;
        VkDescriptorSetLayoutBinding b[WKV_VK_MAX_BINDINGS];
        memset(b, 0, sizeof b);
        for (uint32_t i = 0; i < kern->num_bindings; ++i) {
            b[i].binding = kern->bindings[i];
            b[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
            b[i].descriptorCount = 1;
            b[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
        }
        VkDescriptorSetLayoutCreateInfo li;
        memset(&li, 0, sizeof li);
        li.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO;
        li.bindingCount = kern->num_bindings;
        li.pBindings = b;
        if ((r = st->fn.vkCreateDescriptorSetLayout(st->device, &li, NULL, &kern->set_layout)) != VK_SUCCESS)
            return wkv_vk_result(msg, r, "vkCreateDescriptorSetLayout");
        VkPushConstantRange pcr;
        pcr.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
        pcr.offset = 0;
        pcr.size = 16;
        VkPipelineLayoutCreateInfo pli;
        memset(&pli, 0, sizeof pli);
        pli.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO;
        pli.setLayoutCount = 1;
        pli.pSetLayouts = &kern->set_layout;
        pli.pushConstantRangeCount = 1;
        pli.pPushConstantRanges = &pcr;
        if ((r = st->fn.vkCreatePipelineLayout(st->device, &pli, NULL, &kern->layout)) != VK_SUCCESS)
            return wkv_vk_result(msg, r, "vkCreatePipelineLayout");
    }
    return WKV_OK;
}

void wkv_vk_kernels_destroy(wkv_vk_state* st) {
    for (size_t i = 0; i < st->num_pipelines; ++i) st->fn.vkDestroyPipeline(st->device, st->pipelines[i].pipeline, NULL);
    free(st->pipelines);
    st->pipelines = NULL;
    st->num_pipelines = st->cap_pipelines = 0;
    for (int k = 0; k < WKV_VK_KERNELS; ++k) {
        vkw_kernel* kern = &st->kernels[k];
        if (kern->layout) st->fn.vkDestroyPipelineLayout(st->device, kern->layout, NULL);
        if (kern->set_layout) st->fn.vkDestroyDescriptorSetLayout(st->device, kern->set_layout, NULL);
        if (kern->module) st->fn.vkDestroyShaderModule(st->device, kern->module, NULL);
        memset(kern, 0, sizeof *kern);
    }
}

vkw_spec wkv_vk_spec_n(int n) {
    vkw_spec s = {n, 0, 1, -1};
    return s;
}

wkv_status wkv_vk_pipeline(wkv_vk_state* st, int kernel, vkw_spec sp, VkPipeline* out, wkv_message* msg) {
    for (size_t i = 0; i < st->num_pipelines; ++i) {
        const vkw_pipeline* p = &st->pipelines[i];
        if (p->kernel == kernel && p->spec.n == sp.n && p->spec.tc == sp.tc && p->spec.lanes == sp.lanes &&
            p->spec.dtype == sp.dtype) {
            *out = p->pipeline;
            return WKV_OK;
        }
    }
    if (st->num_pipelines == st->cap_pipelines) {
        size_t cap = st->cap_pipelines ? 2 * st->cap_pipelines : 8;
        vkw_pipeline* grown = (vkw_pipeline*)realloc(st->pipelines, cap * sizeof *grown);
        if (!grown) return wkv_vk_fail(msg, WKV_ERROR_OUT_OF_MEMORY, "out of memory");
        st->pipelines = grown;
        st->cap_pipelines = cap;
    }
    /* constant_id 0..4: N, TC, C (lanes per row), WG = N * C (the forwards' workgroup size),
     * DT. The backward shaders use only 0 (N, also their workgroup size), RWKV-4 and reduce
     * none: an entry for an absent constant ID is ignored. */
    int32_t values[5] = {sp.n, sp.tc, sp.lanes, sp.n * sp.lanes, sp.dtype};
    VkSpecializationMapEntry entries[5];
    for (uint32_t i = 0; i < 5; ++i) {
        entries[i].constantID = i;
        entries[i].offset = i * 4;
        entries[i].size = 4;
    }
    VkSpecializationInfo spec;
    spec.mapEntryCount = 5;
    spec.pMapEntries = entries;
    spec.dataSize = sizeof values;
    spec.pData = values;
    VkComputePipelineCreateInfo ci;
    memset(&ci, 0, sizeof ci);
    ci.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO;
    ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
    ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    ci.stage.module = st->kernels[kernel].module;
    ci.stage.pName = "main";
    ci.stage.pSpecializationInfo = &spec;
    ci.layout = st->kernels[kernel].layout;
    VkPipeline pipe;
    VkResult r = st->fn.vkCreateComputePipelines(st->device, VK_NULL_HANDLE, 1, &ci, NULL, &pipe);
    if (r != VK_SUCCESS) return wkv_vk_result(msg, r, "vkCreateComputePipelines");
    vkw_pipeline* p = &st->pipelines[st->num_pipelines++];
    p->kernel = kernel;
    p->spec = sp;
    p->pipeline = pipe;
    *out = pipe;
    return WKV_OK;
}

wkv_status wkv_vk_descriptor_sets(wkv_vk_state* st, int kernel, uint32_t count, int last_kernel,
                                  VkDescriptorSet* out, wkv_message* msg) {
    VkResult r;
    const uint32_t total = count + (last_kernel >= 0 ? 1u : 0u);
    st->replay_valid = 0; /* the sets a recorded command buffer uses are about to go */
    if (st->appending) { /* the pool's earlier sets belong to the open command buffer: kept */
        /* room for one: vkw_call_begin_append */
    } else if (!st->desc_pool || st->desc_pool_sets < total) {
        if (st->desc_pool) st->fn.vkDestroyDescriptorPool(st->device, st->desc_pool, NULL);
        st->desc_pool = VK_NULL_HANDLE;
        /* an async context's pools hold a full command buffer's worth (batch_max calls) */
        const uint32_t least = st->async && st->batch_max > 16 ? st->batch_max : 16;
        uint32_t sets = total < least ? least : total;
        VkDescriptorPoolSize size;
        size.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        size.descriptorCount = sets * WKV_VK_MAX_BINDINGS;
        VkDescriptorPoolCreateInfo pci;
        memset(&pci, 0, sizeof pci);
        pci.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO;
        pci.maxSets = sets;
        pci.poolSizeCount = 1;
        pci.pPoolSizes = &size;
        if ((r = st->fn.vkCreateDescriptorPool(st->device, &pci, NULL, &st->desc_pool)) != VK_SUCCESS)
            return wkv_vk_result(msg, r, "vkCreateDescriptorPool");
        st->desc_pool_sets = sets;
    } else if ((r = st->fn.vkResetDescriptorPool(st->device, st->desc_pool, 0)) != VK_SUCCESS) {
        return wkv_vk_result(msg, r, "vkResetDescriptorPool");
    }
    VkDescriptorSetLayout layouts[64];
    for (uint32_t done = 0; done < total;) {
        uint32_t n = total - done < 64 ? total - done : 64;
        for (uint32_t i = 0; i < n; ++i)
            layouts[i] = st->kernels[done + i < count ? kernel : last_kernel].set_layout;
        VkDescriptorSetAllocateInfo ai;
        memset(&ai, 0, sizeof ai);
        ai.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO;
        ai.descriptorPool = st->desc_pool;
        ai.descriptorSetCount = n;
        ai.pSetLayouts = layouts;
        if ((r = st->fn.vkAllocateDescriptorSets(st->device, &ai, out + done)) != VK_SUCCESS)
            return wkv_vk_result(msg, r, "vkAllocateDescriptorSets");
        done += n;
    }
    st->batch_sets = (st->appending ? st->batch_sets : 0) + total;
    return WKV_OK;
}
