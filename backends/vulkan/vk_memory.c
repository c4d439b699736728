/* Buffers and one-shot submission. Every buffer has its own allocation (a sub-allocator is
 * a later increment). Library-owned buffers (wkv_buffer) are device-local; every transfer
 * between host memory and them goes through the context's host-visible staging buffer and a
 * vkCmdCopyBuffer, so the same code serves discrete GPUs and unified-memory devices. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vk_internal.h"

static uint32_t pick_memory_type(const wkv_vk_state* st, uint32_t allowed, int where) {
    const VkPhysicalDeviceMemoryProperties* mp = &st->mem_props;
    VkMemoryPropertyFlags need = where != WKV_VK_DEVICE_LOCAL
                                     ? VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
                                     : 0;
    if (where == WKV_VK_HOST_DEVICE) need |= VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
    VkMemoryPropertyFlags prefer = where == WKV_VK_HOST_VISIBLE ? VK_MEMORY_PROPERTY_HOST_CACHED_BIT
                                                                : VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
    uint32_t fallback = UINT32_MAX;
    for (uint32_t i = 0; i < mp->memoryTypeCount; ++i) {
        if (!(allowed & (1u << i))) continue;
        VkMemoryPropertyFlags f = mp->memoryTypes[i].propertyFlags;
        if ((f & need) != need) continue;
        if ((f & prefer) == prefer) return i;
        if (fallback == UINT32_MAX) fallback = i;
    }
    return fallback;
}

wkv_status vkw_buffer_create(wkv_vk_state* st, VkDeviceSize bytes, int where, vkw_buffer* out,
                             wkv_message* msg) {
    memset(out, 0, sizeof *out);
    VkDeviceSize size = (bytes + 3) & ~(VkDeviceSize)3;
    if (size < 16) size = 16;
    VkBufferCreateInfo bci;
    memset(&bci, 0, sizeof bci);
    bci.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
    bci.size = size;
    bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    VkResult r = st->fn.vkCreateBuffer(st->device, &bci, NULL, &out->buffer);
    if (r != VK_SUCCESS) return wkv_vk_result(msg, r, "vkCreateBuffer");
    VkMemoryRequirements req;
    st->fn.vkGetBufferMemoryRequirements(st->device, out->buffer, &req);
    uint32_t type = pick_memory_type(st, req.memoryTypeBits, where);
    if (type == UINT32_MAX) {
        vkw_buffer_destroy(st, out);
        return wkv_vk_fail(msg, WKV_ERROR_UNSUPPORTED, "no suitable memory type for a %s buffer",
                           where == WKV_VK_DEVICE_LOCAL ? "device" : "host-visible");
    }
    VkMemoryAllocateInfo mai;
    memset(&mai, 0, sizeof mai);
    mai.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
    mai.allocationSize = req.size;
    mai.memoryTypeIndex = type;
    r = st->fn.vkAllocateMemory(st->device, &mai, NULL, &out->memory);
    if (r != VK_SUCCESS) {
        vkw_buffer_destroy(st, out);
        return wkv_vk_result(msg, r, "vkAllocateMemory");
    }
    if ((r = st->fn.vkBindBufferMemory(st->device, out->buffer, out->memory, 0)) != VK_SUCCESS) {
        vkw_buffer_destroy(st, out);
        return wkv_vk_result(msg, r, "vkBindBufferMemory");
    }
    if (where != WKV_VK_DEVICE_LOCAL &&
        (r = st->fn.vkMapMemory(st->device, out->memory, 0, VK_WHOLE_SIZE, 0, &out->mapped)) != VK_SUCCESS) {
        vkw_buffer_destroy(st, out);
        return wkv_vk_result(msg, r, "vkMapMemory");
    }
    out->size = size;
    return WKV_OK;
}

void vkw_buffer_destroy(wkv_vk_state* st, vkw_buffer* b) {
    ++st->buffer_epoch; /* its handle may come back: a recorded command buffer must not match */
    if (b->mapped) st->fn.vkUnmapMemory(st->device, b->memory);
    if (b->buffer) st->fn.vkDestroyBuffer(st->device, b->buffer, NULL);
    if (b->memory) st->fn.vkFreeMemory(st->device, b->memory, NULL);
    memset(b, 0, sizeof *b);
}

wkv_status vkw_buffer_reserve(wkv_vk_state* st, vkw_buffer* b, VkDeviceSize bytes, int where,
                              wkv_message* msg) {
    if (b->buffer && b->size >= bytes) return WKV_OK;
    if (wkv_fault_hit(&st->fault, WKV_FAULT_OOM, "scratch"))
        return wkv_vk_result(msg, VK_ERROR_OUT_OF_DEVICE_MEMORY, "vkAllocateMemory (injected fault: WKV_FAULT=oom)");
    VkDeviceSize want = b->size ? b->size : 1u << 16;
    while (want < bytes) want *= 2;
    vkw_buffer_destroy(st, b);
    wkv_status s = vkw_buffer_create(st, want, where, b, msg);
    if (s == WKV_ERROR_OUT_OF_MEMORY && want > bytes) s = vkw_buffer_create(st, bytes, where, b, msg);
    return s;
}

/* ------------------------------------------------------------------------- submission */

void vkw_barrier(wkv_vk_state* st, VkPipelineStageFlags src, VkAccessFlags src_access,
                 VkPipelineStageFlags dst, VkAccessFlags dst_access) {
    VkMemoryBarrier mb;
    memset(&mb, 0, sizeof mb);
    mb.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
    mb.srcAccessMask = src_access;
    mb.dstAccessMask = dst_access;
    st->fn.vkCmdPipelineBarrier(st->cmd, src, dst, 0, 1, &mb, 0, NULL, 0, NULL);
}

wkv_status vkw_begin(wkv_vk_state* st, wkv_message* msg) {
    if (st->recording) { /* the host's command buffer, already recording */
        vkw_barrier(st, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_ACCESS_MEMORY_WRITE_BIT,
                    VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                    VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT);
        return WKV_OK;
    }
    st->replay_valid = 0;
    if (st->appending) { /* the open command buffer of earlier calls: ordered after them */
        vkw_barrier(st, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_ACCESS_MEMORY_WRITE_BIT, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
                    VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT);
        ++st->batch_calls;
        return WKV_OK;
    }
    if (!st->call_async) { /* the shared buffers (staging, mirror, scratch) must be free */
        wkv_status s = vkw_drain(st, msg);
        if (s) return s;
    }
    st->batch_calls = 1;
    VkResult r = st->fn.vkResetCommandBuffer(st->cmd, 0);
    if (r != VK_SUCCESS) return wkv_vk_result(msg, r, "vkResetCommandBuffer");
    VkCommandBufferBeginInfo bi;
    memset(&bi, 0, sizeof bi);
    bi.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
    bi.flags = 0; /* not one-time: a forward's may be submitted again (replay_key) */
    if ((r = st->fn.vkBeginCommandBuffer(st->cmd, &bi)) != VK_SUCCESS)
        return wkv_vk_result(msg, r, "vkBeginCommandBuffer");
    /* Earlier submissions (outputs in buffers, uploads) and host writes to the staging buffer
     * are visible to everything this command buffer does. */
    vkw_barrier(st, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT | VK_PIPELINE_STAGE_HOST_BIT,
                VK_ACCESS_MEMORY_WRITE_BIT | VK_ACCESS_HOST_WRITE_BIT, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
                VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT);
    return WKV_OK;
}

wkv_status vkw_submit_wait(wkv_vk_state* st, wkv_message* msg) { return vkw_submit_wait_reads(st, 1, msg); }

static wkv_status finish_async(wkv_vk_state* st, wkv_message* msg);

wkv_status vkw_submit_wait_reads(wkv_vk_state* st, int host_reads, wkv_message* msg) {
    if (st->recording) return WKV_OK; /* the host submits */
    /* Everything written is visible to the host once the fence has signalled. Not needed when
     * the host reads nothing this command buffer wrote: wkv_buffers are read only through a
     * download, whose command buffer begins with a full barrier of its own. */
    if (host_reads)
        vkw_barrier(st, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_ACCESS_MEMORY_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
                    VK_ACCESS_HOST_READ_BIT);
    if (st->call_async) return finish_async(st, msg); /* ended now or by a later call */
    VkResult r = st->fn.vkEndCommandBuffer(st->cmd);
    if (r != VK_SUCCESS) return wkv_vk_result(msg, r, "vkEndCommandBuffer");
    return vkw_resubmit_wait(st, msg);
}

/* Waits for fence and resets it. A GPU's driver may put a blocking vkWaitForFences to sleep
 * and wake it well after the fence signals (NVIDIA's: 22 us of a 61 us decode call on the
 * H100, DESIGN.md), which is most of a decode step's time. So on a GPU the wait spins on the
 * fence status, as CUDA's default synchronisation does; on a CPU implementation (lavapipe)
 * spinning would take a core from the threads doing the work, so it blocks.
 * WKV_VULKAN_SPIN=0|1 overrides. */
static wkv_status wait_fence(wkv_vk_state* st, VkFence fence, wkv_message* msg) {
    VkResult r = VK_NOT_READY;
    if (st->spin_wait)
        while ((r = st->fn.vkGetFenceStatus(st->device, fence)) == VK_NOT_READY) {
        }
    if (r == VK_NOT_READY) r = st->fn.vkWaitForFences(st->device, 1, &fence, VK_TRUE, UINT64_MAX);
    VkResult r2 = st->fn.vkResetFences(st->device, 1, &fence);
    if (r != VK_SUCCESS) return wkv_vk_result(msg, r, "vkWaitForFences");
    if (r2 != VK_SUCCESS) return wkv_vk_result(msg, r2, "vkResetFences");
    return WKV_OK;
}

static wkv_status enqueue(wkv_vk_state* st, wkv_message* msg);

wkv_status vkw_resubmit_wait(wkv_vk_state* st, wkv_message* msg) {
    VkResult r;
    VkSubmitInfo si;
    memset(&si, 0, sizeof si);
    si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    si.commandBufferCount = 1;
    si.pCommandBuffers = &st->cmd;
    if (st->call_async) return enqueue(st, msg); /* submitted now or with later calls */
    if (wkv_fault_hit(&st->fault, WKV_FAULT_DEVICE_LOST, "submit"))
        return wkv_vk_result(msg, VK_ERROR_DEVICE_LOST, "vkQueueSubmit (injected fault: WKV_FAULT=device_lost)");
    int phase = vkw_prof_enter(st, WKV_VK_PROF_SUBMIT);
    r = st->fn.vkQueueSubmit(st->queue, 1, &si, st->fence);
    vkw_prof_enter(st, phase);
    if (r != VK_SUCCESS) return wkv_vk_result(msg, r, "vkQueueSubmit");
    st->prof.submits++;
    st->prof.submitted_cmds++;
    phase = vkw_prof_enter(st, WKV_VK_PROF_WAIT);
    wkv_status s = wait_fence(st, st->fence, msg);
    vkw_prof_enter(st, phase);
    if (s) return s;
    return wkv_vk_check_validation(st, msg);
}

/* ------------------------------------------------------------------------ async calls */

/* Makes slot the active one (the active one goes into its place in the ring). */
static void swap_slot(wkv_vk_state* st, vkw_slot* slot) {
    WKV_VK_SWAP(VkCommandBuffer, st->cmd, slot->cmd);
    WKV_VK_SWAP(VkFence, st->fence, slot->fence);
    WKV_VK_SWAP(VkDescriptorPool, st->desc_pool, slot->desc_pool);
    WKV_VK_SWAP(uint32_t, st->desc_pool_sets, slot->desc_pool_sets);
    WKV_VK_SWAP(vkw_buffer, st->params, slot->params);
    WKV_VK_SWAP(int, st->pending, slot->pending);
    WKV_VK_SWAP(VkFence, st->wait, slot->wait);
    WKV_VK_SWAP(int, st->replay_valid, slot->replay_valid);
    WKV_VK_SWAP(vkw_replay_key, st->replay_key, slot->replay_key);
    WKV_VK_SWAP(uint32_t, st->batch_calls, slot->batch_calls);
    WKV_VK_SWAP(uint32_t, st->batch_sets, slot->batch_sets);
    WKV_VK_SWAP(uint64_t, st->batch_params, slot->batch_params);
}

/* The slots in call order: the ring from ring_next on (oldest first), then the active one. */
static void slots_in_order(wkv_vk_state* st, int** pending, VkFence** own, VkFence** wait,
                           VkCommandBuffer** cmd) {
    for (int i = 0; i < WKV_VK_SLOTS; ++i) {
        vkw_slot* slot = i < WKV_VK_SLOTS - 1 ? &st->ring[(st->ring_next + i) % (WKV_VK_SLOTS - 1)] : NULL;
        pending[i] = slot ? &slot->pending : &st->pending;
        own[i] = slot ? &slot->fence : &st->fence;
        wait[i] = slot ? &slot->wait : &st->wait;
        cmd[i] = slot ? &slot->cmd : &st->cmd;
    }
}

/* 1 while the newest submission runs (forgotten once seen done: the next poll is free). */
static int gpu_busy(wkv_vk_state* st) {
    if (!st->newest) return 0;
    const int phase = vkw_prof_enter(st, WKV_VK_PROF_POLL);
    const VkResult r = st->fn.vkGetFenceStatus(st->device, st->newest);
    vkw_prof_enter(st, phase);
    st->prof.polls++;
    if (r == VK_NOT_READY) return 1;
    if (r == VK_SUCCESS) st->newest = VK_NULL_HANDLE; /* its owner still resets it when it waits */
    return 0;                                         /* an error: the wait reports it */
}

/* Ends the active slot's open command buffer: it becomes queued. */
static wkv_status close_open(wkv_vk_state* st, wkv_message* msg) {
    if (st->pending != WKV_VK_OPEN) return WKV_OK;
    const int phase = vkw_prof_enter(st, WKV_VK_PROF_SUBMIT);
    const VkResult r = st->fn.vkEndCommandBuffer(st->cmd);
    vkw_prof_enter(st, phase);
    if (r != VK_SUCCESS) { /* its calls are lost: reported here */
        st->pending = 0;
        return wkv_vk_result(msg, r, "vkEndCommandBuffer");
    }
    st->pending = WKV_VK_QUEUED;
    return WKV_OK;
}

/* Submits every queued slot (ending an open one first) in one vkQueueSubmit, in call order,
 * with the newest's fence. */
static wkv_status flush(wkv_vk_state* st, wkv_message* msg) {
    wkv_status s = close_open(st, msg);
    if (s) return s;
    int* pending[WKV_VK_SLOTS];
    VkFence *own[WKV_VK_SLOTS], *wait[WKV_VK_SLOTS];
    VkCommandBuffer* cmd[WKV_VK_SLOTS];
    slots_in_order(st, pending, own, wait, cmd);
    VkCommandBuffer list[WKV_VK_SLOTS];
    uint32_t n = 0;
    int newest = -1;
    for (int i = 0; i < WKV_VK_SLOTS; ++i)
        if (*pending[i] == WKV_VK_QUEUED) {
            list[n++] = *cmd[i];
            newest = i;
        }
    if (!n) return WKV_OK;
    const VkFence fence = *own[newest];
    for (int i = 0; i < WKV_VK_SLOTS; ++i)
        if (*pending[i] == WKV_VK_QUEUED) {
            *pending[i] = WKV_VK_SUBMITTED;
            *wait[i] = fence;
        }
    VkSubmitInfo si;
    memset(&si, 0, sizeof si);
    si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    si.commandBufferCount = n;
    si.pCommandBuffers = list;
    VkResult r = VK_ERROR_DEVICE_LOST;
    const int phase = vkw_prof_enter(st, WKV_VK_PROF_SUBMIT);
    if (!wkv_fault_hit(&st->fault, WKV_FAULT_DEVICE_LOST, "submit"))
        r = st->fn.vkQueueSubmit(st->queue, 1, &si, fence);
    vkw_prof_enter(st, phase);
    if (r != VK_SUCCESS) { /* nothing was submitted: nothing to wait for */
        for (int i = 0; i < WKV_VK_SLOTS; ++i)
            if (*pending[i] == WKV_VK_SUBMITTED && *wait[i] == fence) *pending[i] = 0;
        return wkv_vk_result(msg, r, "vkQueueSubmit");
    }
    st->prof.submits++;
    st->prof.submitted_cmds += n;
    st->newest = fence;
    return WKV_OK;
}

/* A replayed command buffer of an async call (the active slot): submitted at once when the GPU
 * has run dry, else queued for the next submission (ASYNC CALLS in vk_internal.h). */
static wkv_status enqueue(wkv_vk_state* st, wkv_message* msg) {
    st->pending = WKV_VK_QUEUED;
    if (gpu_busy(st)) return wkv_vk_check_validation(st, msg);
    wkv_status s = flush(st, msg);
    if (s) return s;
    return wkv_vk_check_validation(st, msg);
}

/* The end of a recorded async call: while the GPU is busy a batching call leaves its command
 * buffer open for the next calls (until it holds batch_max); otherwise it is ended, and
 * submitted at once when the GPU is dry or it is full (so that the GPU finds it queued). */
static wkv_status finish_async(wkv_vk_state* st, wkv_message* msg) {
    st->pending = WKV_VK_OPEN;
    const int busy = gpu_busy(st), full = st->batch_calls >= st->batch_max;
    if (st->batching && busy && !full) return wkv_vk_check_validation(st, msg);
    wkv_status s = busy && !full ? close_open(st, msg) : flush(st, msg);
    if (s) return s;
    return wkv_vk_check_validation(st, msg);
}

/* Waits until slot i (slots_in_order) is done: submits it first if it is queued; resets its
 * fence only when the submission was its own (the newest of its batch, reused last). */
static wkv_status wait_slot(wkv_vk_state* st, int* pending, VkFence own, VkFence wait, wkv_message* msg) {
    *pending = 0;
    /* (inside wkv_context_synchronize the wait is the synchronize's) */
    const int in_sync = st->prof.phase == WKV_VK_PROF_SYNC;
    const int phase = in_sync ? WKV_VK_PROF_SYNC : vkw_prof_enter(st, WKV_VK_PROF_WAIT);
    st->prof.waits += !in_sync;
    wkv_status s = WKV_OK;
    if (wait != own) { /* an older call of a batch: the batch's fence, reset by its owner */
        VkResult r = VK_NOT_READY;
        if (st->spin_wait)
            while ((r = st->fn.vkGetFenceStatus(st->device, wait)) == VK_NOT_READY) {
            }
        if (r == VK_NOT_READY) r = st->fn.vkWaitForFences(st->device, 1, &wait, VK_TRUE, UINT64_MAX);
        if (r != VK_SUCCESS) s = wkv_vk_result(msg, r, "vkWaitForFences");
    } else {
        if (st->newest == own) st->newest = VK_NULL_HANDLE;
        s = wait_fence(st, own, msg);
    }
    vkw_prof_enter(st, phase);
    return s;
}

wkv_status vkw_drain(wkv_vk_state* st, wkv_message* msg) {
    wkv_status first = flush(st, msg);
    int* pending[WKV_VK_SLOTS];
    VkFence *own[WKV_VK_SLOTS], *wait[WKV_VK_SLOTS];
    VkCommandBuffer* cmd[WKV_VK_SLOTS];
    slots_in_order(st, pending, own, wait, cmd);
    for (int i = 0; i < WKV_VK_SLOTS; ++i) { /* oldest first: a batch's owner comes last */
        if (*pending[i] != WKV_VK_SUBMITTED) {
            *pending[i] = 0;
            continue;
        }
        wkv_status s = wait_slot(st, pending[i], *own[i], *wait[i], first ? NULL : msg);
        if (s && !first) first = s;
    }
    if (first) return first;
    return wkv_vk_check_validation(st, msg);
}

/* Keeps a failure of pending work for the next call (where none can be returned). */
static void drain_deferred(wkv_vk_state* st) {
    wkv_message m;
    m.text[0] = '\0';
    wkv_status s = vkw_drain(st, &m);
    if (s && !st->deferred) {
        st->deferred = s;
        snprintf(st->deferred_text, sizeof st->deferred_text, "%s", m.text);
    }
}

wkv_status vkw_call_begin(wkv_vk_state* st, int async, wkv_message* msg) {
    return vkw_call_begin_append(st, async, 0, msg);
}

/* Whether the active slot's open command buffer takes one more call with a parameter block of
 * params_bytes (one descriptor set, vk_op.c's region of params). */
static int has_room(const wkv_vk_state* st, uint64_t params_bytes) {
    return st->batch_calls < st->batch_max && st->batch_sets < st->desc_pool_sets &&
           wkv_vk_align_up(st->batch_params, wkv_vk_offset_alignment(st)) + params_bytes <= st->params.size;
}

wkv_status vkw_call_begin_append(wkv_vk_state* st, int async, uint64_t params_bytes, wkv_message* msg) {
    st->call_async = st->appending = st->batching = 0;
    if (st->deferred) {
        wkv_status s = st->deferred;
        st->deferred = WKV_OK;
        return wkv_vk_fail(msg, s, "earlier enqueued work failed: %s", st->deferred_text);
    }
    if (!async || !st->async || st->recording) return vkw_drain(st, msg);
    st->call_async = 1;
    if (st->pending == WKV_VK_OPEN) {
        if (params_bytes && has_room(st, params_bytes)) {
            st->appending = st->batching = 1;
            st->prof.appended++;
            return WKV_OK;
        }
        wkv_status s = close_open(st, msg);
        if (s) {
            st->call_async = 0;
            return s;
        }
    }
    st->batching = params_bytes && st->batch_max > 1 && gpu_busy(st);
    if (!st->pending) return WKV_OK;
    vkw_slot* slot = &st->ring[st->ring_next];
    st->ring_next = (st->ring_next + 1) % (WKV_VK_SLOTS - 1);
    swap_slot(st, slot);
    VkResult r;
    if (!st->cmd) { /* first use of this slot */
        VkCommandBufferAllocateInfo cai;
        memset(&cai, 0, sizeof cai);
        cai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
        cai.commandPool = st->cmd_pool;
        cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
        cai.commandBufferCount = 1;
        if ((r = st->fn.vkAllocateCommandBuffers(st->device, &cai, &st->cmd)) != VK_SUCCESS) {
            st->cmd = VK_NULL_HANDLE;
            swap_slot(st, slot); /* back to the pending one: a later call retries */
            st->call_async = st->batching = 0;
            wkv_status s = wkv_vk_result(msg, r, "vkAllocateCommandBuffers");
            wkv_status s2 = vkw_drain(st, NULL);
            return s2 ? s2 : s;
        }
    }
    if (!st->fence) {
        VkFenceCreateInfo fci;
        memset(&fci, 0, sizeof fci);
        fci.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
        if ((r = st->fn.vkCreateFence(st->device, &fci, NULL, &st->fence)) != VK_SUCCESS) {
            st->fence = VK_NULL_HANDLE;
            swap_slot(st, slot);
            st->call_async = st->batching = 0;
            wkv_status s = wkv_vk_result(msg, r, "vkCreateFence");
            wkv_status s2 = vkw_drain(st, NULL);
            return s2 ? s2 : s;
        }
    }
    if (st->pending) { /* every slot is in flight: wait for the oldest */
        wkv_status s = st->pending == WKV_VK_QUEUED ? flush(st, msg) : WKV_OK;
        if (!s) s = wait_slot(st, &st->pending, st->fence, st->wait, msg);
        if (s) {
            st->call_async = st->batching = 0;
            return s;
        }
    }
    return WKV_OK;
}

/* ------------------------------------------------------------------------- profiling */

static uint64_t wkv_vk_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int vkw_prof_switch(wkv_vk_state* st, int phase) {
    const uint64_t t = wkv_vk_now_ns();
    const int old = st->prof.phase;
    if (st->prof.t) st->prof.ns[old] += t - st->prof.t;
    st->prof.t = t;
    st->prof.phase = phase;
    return old;
}

void vkw_prof_report(wkv_vk_state* st) {
    vkw_profile* p = &st->prof;
    if (p->calls >= 8) {
        const double c = 1e3 * (double)p->calls;
        fprintf(stderr,
                "wkv vulkan profile: %llu calls (%llu appended, %llu replayed), %llu submissions of %llu command "
                "buffers, %llu fence polls, %llu fence waits; host us per call: between calls %.2f, begin %.2f, "
                "plan %.2f, record %.2f, polls %.2f, end+submit %.2f, fence waits %.2f; synchronize %.2f\n",
                (unsigned long long)p->calls, (unsigned long long)p->appended, (unsigned long long)p->replayed,
                (unsigned long long)p->submits, (unsigned long long)p->submitted_cmds, (unsigned long long)p->polls,
                (unsigned long long)p->waits, p->ns[WKV_VK_PROF_GAP] / c, p->ns[WKV_VK_PROF_BEGIN] / c,
                p->ns[WKV_VK_PROF_PLAN] / c, p->ns[WKV_VK_PROF_RECORD] / c, p->ns[WKV_VK_PROF_POLL] / c,
                p->ns[WKV_VK_PROF_SUBMIT] / c, p->ns[WKV_VK_PROF_WAIT] / c, p->ns[WKV_VK_PROF_SYNC] / c);
    }
    const uint64_t t = p->t;
    const int phase = p->phase;
    memset(p, 0, sizeof *p);
    p->t = t;
    p->phase = phase;
}

void vkw_ring_destroy(wkv_vk_state* st) {
    for (int i = 0; i < WKV_VK_SLOTS - 1; ++i) {
        vkw_slot* slot = &st->ring[i];
        vkw_buffer_destroy(st, &slot->params);
        if (slot->desc_pool) st->fn.vkDestroyDescriptorPool(st->device, slot->desc_pool, NULL);
        if (slot->fence) st->fn.vkDestroyFence(st->device, slot->fence, NULL);
        /* slot->cmd goes with the command pool */
        memset(slot, 0, sizeof *slot);
    }
}

/* --------------------------------------------------------------- wkv_buffer entry points */

wkv_status wkv_vk_buffer_create(void* state, uint64_t bytes, void** out, wkv_message* msg) {
    wkv_vk_state* st = (wkv_vk_state*)state;
    *out = NULL;
    if (bytes > (uint64_t)SIZE_MAX - 64) return wkv_vk_fail(msg, WKV_ERROR_OUT_OF_MEMORY, "%llu bytes", (unsigned long long)bytes);
    if (wkv_fault_hit(&st->fault, WKV_FAULT_OOM, "buffer"))
        return wkv_vk_result(msg, VK_ERROR_OUT_OF_DEVICE_MEMORY, "vkAllocateMemory (injected fault: WKV_FAULT=oom)");
    vkw_buffer* b = (vkw_buffer*)calloc(1, sizeof *b);
    if (!b) return wkv_vk_fail(msg, WKV_ERROR_OUT_OF_MEMORY, "out of memory");
    wkv_status s = vkw_buffer_create(st, bytes, WKV_VK_DEVICE_LOCAL, b, msg);
    if (!s) s = vkw_begin(st, msg);
    if (!s) {
        st->fn.vkCmdFillBuffer(st->cmd, b->buffer, 0, VK_WHOLE_SIZE, 0u);
        s = vkw_submit_wait(st, msg);
    }
    if (s) {
        if (b->buffer) vkw_buffer_destroy(st, b);
        free(b);
        return s;
    }
    *out = b;
    return WKV_OK;
}

void wkv_vk_buffer_destroy(void* state, void* buffer) {
    wkv_vk_state* st = (wkv_vk_state*)state;
    vkw_buffer* b = (vkw_buffer*)buffer;
    if (!b) return;
    drain_deferred(st); /* enqueued calls may use it */
    if (b->imported) { /* the host's VkBuffer: forget it */
        ++st->buffer_epoch;
        free(b);
        return;
    }
    st->fn.vkDeviceWaitIdle(st->device); /* nothing in flight may still use it */
    vkw_buffer_destroy(st, b);
    free(b);
}

/* Copies through the staging buffer in pieces of at most 64 MiB. */
static wkv_status transfer(wkv_vk_state* st, vkw_buffer* b, uint64_t offset, char* host, uint64_t bytes,
                           int to_device, wkv_message* msg) {
    const uint64_t piece_max = 64ull << 20;
    while (bytes > 0) {
        uint64_t piece = bytes < piece_max ? bytes : piece_max;
        wkv_status s = vkw_buffer_reserve(st, &st->staging, piece, WKV_VK_HOST_VISIBLE, msg);
        if (s) return s;
        if (to_device) memcpy(st->staging.mapped, host, (size_t)piece);
        if ((s = vkw_begin(st, msg))) return s;
        VkBufferCopy c;
        c.srcOffset = to_device ? 0 : offset;
        c.dstOffset = to_device ? offset : 0;
        c.size = piece;
        st->fn.vkCmdCopyBuffer(st->cmd, to_device ? st->staging.buffer : b->buffer,
                               to_device ? b->buffer : st->staging.buffer, 1, &c);
        if ((s = vkw_submit_wait(st, msg))) return s;
        if (!to_device) memcpy(host, st->staging.mapped, (size_t)piece);
        offset += piece;
        host += piece;
        bytes -= piece;
    }
    return WKV_OK;
}

wkv_status wkv_vk_buffer_write(void* state, void* buffer, uint64_t offset, const void* src, uint64_t bytes,
                               wkv_message* msg) {
    return transfer((wkv_vk_state*)state, (vkw_buffer*)buffer, offset, (char*)(uintptr_t)src, bytes, 1, msg);
}

wkv_status wkv_vk_buffer_read(void* state, void* buffer, uint64_t offset, void* dst, uint64_t bytes,
                              wkv_message* msg) {
    return transfer((wkv_vk_state*)state, (vkw_buffer*)buffer, offset, (char*)dst, bytes, 0, msg);
}

/* ------------------------------------------------------------------------- guest mode */

wkv_status wkv_vk_buffer_import(wkv_vk_state* st, uint64_t vk_buffer, uint64_t size, void** out, wkv_message* msg) {
    *out = NULL;
    if (!st->guest)
        return wkv_vk_fail(msg, WKV_ERROR_INVALID_ARGUMENT,
                           "buffer import needs a guest context (wkv_vulkan_context_create): the VkBuffer "
                           "must belong to the context's VkDevice");
    vkw_buffer* b = (vkw_buffer*)calloc(1, sizeof *b);
    if (!b) return wkv_vk_fail(msg, WKV_ERROR_OUT_OF_MEMORY, "out of memory");
    b->buffer = (VkBuffer)(uintptr_t)vk_buffer;
    b->size = size;
    b->imported = 1;
    *out = b;
    return WKV_OK;
}
