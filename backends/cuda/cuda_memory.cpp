/* The CUDA plugin: where a call's tensors live, and the library's buffers.
 *
 * - HOST MEMORY (wkv.h's memory model: mem[i].host, tensors of device.type CPU / CUDA_HOST, and
 *   a workspace the driver does not know as device memory) is staged: each host view's byte
 *   span [data + lo, data + hi) gets a place in the context's device scratch (grown as needed,
 *   freed at destroy) at the same address modulo 256 (so alignment-dependent paths are the
 *   same), views with the very same span share it (state_in == state_out in place); the spans
 *   of inputs, and of outputs with gaps (strided: so the gaps go back unchanged), are copied in
 *   with cudaMemcpyAsync on the context's stream, the kernels run on the scratch copies, the
 *   output spans are copied back and the stream is synchronised before the call returns. A host
 *   workspace is replaced by scratch of the size the backward needs; its bytes are never
 *   touched. Such a call is synchronous and cannot be captured.
 * - Buffers (wkv_buffer_create): a cudaMalloc allocation, zero-filled; the backend's handle is
 *   the device pointer. Upload/download are cudaMemcpyAsync on the context's stream followed by
 *   a stream synchronisation. A buffer view's address is handle + mem.offset.
 * The backward's workspace and the forward's scratch are the caller's memory: device memory
 * (a wkv_buffer's, or a device or managed pointer) is used in place, host memory replaced by
 * scratch (device_memory). */
#include "cuda_memory.h"

#include <cstdint>

namespace wkv_cuda {
namespace {

DevView to_dev(const wkv_view& v) {
    DevView d;
    d.data = v.data;
    for (int x = 0; x < 4; ++x) d.s[x] = v.stride[x];
    d.elem = (int32_t)v.elem;
    d.pad_ = 0;
    return d;
}

/* The views of p in wkv_problem order: index i belongs to p->mem[i]. */
void problem_views(const wkv_problem* p, const wkv_view* out[WKV_PROBLEM_VIEWS]) {
    const wkv_view* v[WKV_PROBLEM_VIEWS] = {
        &p->r,  &p->w,  &p->k,  &p->v,  &p->a,  &p->b,  &p->u,  &p->y,  &p->state_in,
        &p->state_out, &p->dy, &p->dstate_out, &p->dr, &p->dw, &p->dk, &p->dv, &p->da, &p->db,
        &p->du, &p->dstate_in};
    for (int i = 0; i < WKV_PROBLEM_VIEWS; ++i) out[i] = v[i];
}

bool is_output_view(int i) { return i == kY || i == kStateOut || i >= kDr; }
bool is_state_view(int i) {
    return i == kStateIn || i == kStateOut || i == kDstateOut || i == kDstateIn;
}

/* Elements of view i of p (per-token views B*T*H*N, states S*H*N*N; RWKV-6 u, du: H*N;
 * RWKV-4 w, u, dw, du: C = N, states S*3*C). */
int64_t view_numel(const wkv_problem* p, int i) {
    const bool rwkv4 = p->op == WKV_OP_RWKV4;
    if (is_state_view(i)) return rwkv4 ? p->num_seqs * 3 * p->N : p->num_seqs * p->H * p->N * p->N;
    if (i == 6 || i == 18) return rwkv4 ? p->N : p->H * p->N;           /* u, du */
    if (rwkv4 && (i == 1 || i == 13)) return p->N;                       /* w, dw */
    return p->B * p->T * p->H * p->N;
}

} // namespace

wkv_status place_views(const ViewSpec* views, int n, bool ws_stage, size_t ws_bytes, Placement* pl,
                       wkv_message* msg) {
    size_t cursor = 0;
    if (ws_stage) {
        pl->ws_staged = true;
        pl->ws_bytes = ws_bytes;
        cursor = align_up(ws_bytes, kScratchAlign);
    }
    for (int i = 0; i < n; ++i) {
        const wkv_view& v = *views[i].view;
        const wkv_buffer_ref& m = *views[i].mem;
        pl->view_reg[i] = -1;
        pl->v[i] = to_dev(v);
        pl->host_data[i] = v.data;
        if (!v.data || views[i].numel == 0) continue; /* absent, or empty: never read */
        if (m.buffer) {
            pl->v[i].data = static_cast<char*>(m.buffer) + m.offset;
            continue;
        }
        if (!m.host) continue; /* a device (or managed) pointer, used in place */
        if (m.lo > 0 || m.hi <= m.lo) {
            set_message(msg, "view %d: byte span [%lld, %lld) is not a span (a bug in libwkv)", i,
                        (long long)m.lo, (long long)m.hi);
            return WKV_ERROR_INTERNAL;
        }
        const char* host = v.data + m.lo;
        const size_t bytes = (size_t)(m.hi - m.lo);
        const bool out = views[i].out;
        /* an output without gaps need not be copied in; one with gaps goes back unchanged */
        const bool dense = (int64_t)bytes == views[i].numel * wkv_elem_size(v.elem);
        int r = 0;
        while (r < pl->nreg && !(pl->reg[r].host == host && pl->reg[r].bytes == bytes)) ++r;
        if (r == pl->nreg) {
            Region& g = pl->reg[pl->nreg++];
            g.host = host;
            g.bytes = bytes;
            g.off = align_up(cursor, kScratchAlign) + (size_t)(reinterpret_cast<uintptr_t>(host) % kScratchAlign);
            g.in = g.out = false;
            cursor = g.off + bytes;
        }
        Region& g = pl->reg[r];
        g.in = g.in || !out || !dense;
        g.out = g.out || out;
        pl->view_reg[i] = r;
    }
    pl->nviews = n;
    pl->total = cursor;
    return WKV_OK;
}

wkv_status place_plan(const wkv_problem* p, bool ws_stage, size_t ws_bytes, Placement* pl,
                      wkv_message* msg) {
    const wkv_view* views[WKV_PROBLEM_VIEWS];
    problem_views(p, views);
    ViewSpec spec[WKV_PROBLEM_VIEWS];
    for (int i = 0; i < WKV_PROBLEM_VIEWS; ++i)
        spec[i] = ViewSpec{views[i], &p->mem[i], is_output_view(i), view_numel(p, i)};
    return place_views(spec, WKV_PROBLEM_VIEWS, ws_stage, ws_bytes, pl, msg);
}

namespace {

/* The scratch holds at least `bytes` (its contents are not kept). */
wkv_status ensure_scratch(CudaState* st, size_t bytes, wkv_message* msg) {
    if (bytes <= st->scratch_bytes) return WKV_OK;
    if (st->scratch) {
        cudaFree(st->scratch);
        st->scratch = nullptr;
        st->scratch_bytes = 0;
    }
    size_t want = align_up(bytes, (size_t)1 << 20);
    void* d = nullptr;
    cudaError_t e = fault_hit(st, WKV_FAULT_OOM, "scratch") ? cudaErrorMemoryAllocation : cudaMalloc(&d, want);
    if (e != cudaSuccess) {
        cudaGetLastError();
        set_message(msg, "cannot allocate %zu bytes of device scratch to stage host tensors: %s "
                    "(keep the tensors on the device: device pointers or wkv_buffers)",
                    want, cudaGetErrorString(e));
        return e == cudaErrorMemoryAllocation ? WKV_ERROR_OUT_OF_MEMORY : cuda_fail(st, e, msg, "cudaMalloc");
    }
    st->scratch = static_cast<char*>(d);
    st->scratch_bytes = want;
    return WKV_OK;
}

/* Addresses of the staged views and workspace in the scratch. */
void place_finish(const CudaState* st, Placement* pl) {
    for (int i = 0; i < pl->nviews; ++i) {
        if (pl->view_reg[i] < 0) continue;
        const Region& g = pl->reg[pl->view_reg[i]];
        /* element (0,0,0,0) is -lo bytes into the span */
        pl->v[i].data = st->scratch + g.off + (pl->host_data[i] - g.host);
    }
    if (pl->ws_staged) pl->workspace = st->scratch;
}

} // namespace

wkv_status stage_in(CudaState* st, Placement* pl, StreamDrain* drain, wkv_message* msg) {
    if (!pl->staged()) return WKV_OK;
    wkv_status s = ensure_scratch(st, pl->total, msg);
    if (s != WKV_OK) return s;
    place_finish(st, pl);
    for (int r = 0; r < pl->nreg; ++r) {
        const Region& g = pl->reg[r];
        if (!g.in) continue;
        drain->armed = true;
        const cudaError_t e = cudaMemcpyAsync(st->scratch + g.off, g.host, g.bytes,
                                              cudaMemcpyHostToDevice, st->stream);
        if (e != cudaSuccess) return cuda_fail(st, e, msg, "cudaMemcpyAsync (staging a host tensor in)");
    }
    return WKV_OK;
}

wkv_status stage_out(CudaState* st, Placement* pl, StreamDrain* drain, wkv_message* msg) {
    if (!pl->staged()) return WKV_OK;
    drain->armed = false;
    for (int r = 0; r < pl->nreg; ++r) {
        const Region& g = pl->reg[r];
        if (!g.out) continue;
        const cudaError_t e = cudaMemcpyAsync(const_cast<char*>(g.host), st->scratch + g.off, g.bytes,
                                              cudaMemcpyDeviceToHost, st->stream);
        if (e != cudaSuccess) {
            drain->armed = true;
            return cuda_fail(st, e, msg, "cudaMemcpyAsync (copying a host output back)");
        }
    }
    cudaError_t e = cudaStreamSynchronize(st->stream);
    if (e == cudaSuccess && fault_hit(st, WKV_FAULT_DEVICE_LOST, "sync")) e = cudaErrorLaunchFailure;
    if (e != cudaSuccess) return cuda_fail(st, e, msg, "cudaStreamSynchronize (after a call with host tensors)");
    return WKV_OK;
}

char* device_memory(void* ptr, const wkv_buffer_ref& mem) {
    if (mem.buffer) return static_cast<char*>(mem.buffer) + mem.offset;
    if (mem.host || !ptr) return nullptr;
    cudaPointerAttributes attr;
    const cudaError_t ae = cudaPointerGetAttributes(&attr, ptr);
    if (ae != cudaSuccess) cudaGetLastError(); /* older drivers: unknown host memory */
    if (ae == cudaSuccess && (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged))
        return static_cast<char*>(ptr);
    return nullptr;
}

char* device_workspace(const wkv_problem* p) { return device_memory(p->workspace, p->workspace_mem); }

float* checkpoint_area(char* ws) {
    return reinterpret_cast<float*>(align_up_ptr(ws, kScratchAlign));
}

/* ----------------------------------------------------------------------------- buffers */

wkv_status cuda_buffer_create(void* state, uint64_t bytes, void** out_buffer, wkv_message* msg) {
    CudaState* st = static_cast<CudaState*>(state);
    *out_buffer = nullptr;
    if (st->lost) return context_lost(msg);
    if (bytes > (uint64_t)SIZE_MAX) {
        set_message(msg, "%llu bytes do not fit size_t", (unsigned long long)bytes);
        return WKV_ERROR_OUT_OF_MEMORY;
    }
    DeviceGuard guard(st->device);
    if (guard.error != cudaSuccess) return cuda_fail(st, guard.error, msg, "cudaSetDevice");
    void* d = nullptr;
    cudaError_t e = fault_hit(st, WKV_FAULT_OOM, "buffer") ? cudaErrorMemoryAllocation : cudaMalloc(&d, (size_t)bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        set_message(msg, "cudaMalloc(%llu bytes): %s", (unsigned long long)bytes, cudaGetErrorString(e));
        return e == cudaErrorMemoryAllocation ? WKV_ERROR_OUT_OF_MEMORY : WKV_ERROR_INTERNAL;
    }
    e = cudaMemsetAsync(d, 0, (size_t)bytes, st->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st->stream);
    if (e != cudaSuccess) {
        const wkv_status s = cuda_fail(st, e, msg, "zero-filling a new buffer");
        cudaFree(d);
        return s;
    }
    *out_buffer = d;
    return WKV_OK;
}

void cuda_buffer_destroy(void* state, void* buffer) {
    CudaState* st = static_cast<CudaState*>(state);
    if (!buffer) return;
    DeviceGuard guard(st->device);
    /* work enqueued on the context's stream may still use it */
    if (cudaStreamSynchronize(st->stream) != cudaSuccess) cudaGetLastError();
    if (cudaFree(buffer) != cudaSuccess) cudaGetLastError();
}

namespace {

wkv_status buffer_copy(CudaState* st, char* dev, void* host, uint64_t bytes, bool to_device,
                       wkv_message* msg) {
    if (st->lost) return context_lost(msg);
    DeviceGuard guard(st->device);
    if (guard.error != cudaSuccess) return cuda_fail(st, guard.error, msg, "cudaSetDevice");
    if (fault_hit(st, WKV_FAULT_DEVICE_LOST, "submit"))
        return cuda_fail(st, cudaErrorLaunchFailure, msg, to_device ? "buffer upload (injected fault: WKV_FAULT=device_lost)"
                                                                    : "buffer download (injected fault: WKV_FAULT=device_lost)");
    cudaError_t e = to_device ? cudaMemcpyAsync(dev, host, (size_t)bytes, cudaMemcpyHostToDevice, st->stream)
                              : cudaMemcpyAsync(host, dev, (size_t)bytes, cudaMemcpyDeviceToHost, st->stream);
    const cudaError_t e2 = cudaStreamSynchronize(st->stream); /* also on failure: host memory */
    if (e == cudaSuccess) e = e2;
    if (e != cudaSuccess) return cuda_fail(st, e, msg, to_device ? "buffer upload" : "buffer download");
    return WKV_OK;
}

} // namespace

wkv_status cuda_buffer_write(void* state, void* buffer, uint64_t offset, const void* src, uint64_t bytes,
                             wkv_message* msg) {
    return buffer_copy(static_cast<CudaState*>(state), static_cast<char*>(buffer) + offset,
                       const_cast<void*>(src), bytes, true, msg);
}

wkv_status cuda_buffer_read(void* state, void* buffer, uint64_t offset, void* dst, uint64_t bytes,
                            wkv_message* msg) {
    return buffer_copy(static_cast<CudaState*>(state), static_cast<char*>(buffer) + offset, dst, bytes,
                       false, msg);
}

} // namespace wkv_cuda
