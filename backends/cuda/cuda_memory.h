/* The CUDA plugin: where a call's tensors live (cuda_memory.cpp). A call's views are placed once
 * (place_plan): device and buffer views at their addresses, host views in the context's device
 * scratch, copied in (stage_in) and back (stage_out) around the kernels. And the library's
 * buffers (the backend table's buffer_* functions). */
#ifndef WKV_CUDA_MEMORY_H
#define WKV_CUDA_MEMORY_H

#include <cstddef>
#include <cstdint>

#include "cuda_internal.h"
#include "cuda_state.h"

namespace wkv_cuda {

/* Indices of wkv_problem's views (its mem[] order) that the calls name. */
enum { kY = 7, kStateIn = 8, kStateOut = 9, kDy = 10, kDstateOut = 11, kDr = 12, kDstateIn = 19 };

constexpr size_t kScratchAlign = 256;

inline size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }
inline char* align_up_ptr(char* p, size_t a) { return p + (align_up(reinterpret_cast<uintptr_t>(p), a) - reinterpret_cast<uintptr_t>(p)); }

/* One host byte span staged in the scratch. */
struct Region {
    const char* host; /* its first byte */
    size_t bytes;
    size_t off;       /* in the scratch; off == host (mod kScratchAlign) */
    bool in, out;     /* copied in before the kernels / back after them */
};

/* Where each view of a call is on the device, and what is staged. */
struct Placement {
    DevView v[WKV_PROBLEM_VIEWS];
    Region reg[WKV_PROBLEM_VIEWS];
    int nreg = 0;
    int view_reg[WKV_PROBLEM_VIEWS]; /* the region of a staged view, else -1 */
    const char* host_data[WKV_PROBLEM_VIEWS]; /* each view's own data pointer */
    int nviews = 0;
    char* workspace = nullptr;       /* the backward's workspace on the device */
    bool ws_staged = false;
    size_t ws_bytes = 0;             /* staged workspace: bytes at scratch offset 0 */
    size_t total = 0;                /* scratch bytes the call needs */
    bool staged() const { return total > 0; }
};

/* One view of a call for place_views: its memory (wkv_buffer_ref), whether the kernels write
 * it, and its element count (0: empty, never read or written). */
struct ViewSpec {
    const wkv_view* view;
    const wkv_buffer_ref* mem;
    bool out;
    int64_t numel;
};

/* Fills pl for n <= WKV_PROBLEM_VIEWS views (pl->v[i] is views[i]): device addresses of device
 * and buffer views now, offsets of the staged spans (addresses once the scratch exists:
 * stage_in). ws_stage: the workspace is host memory, replaced by ws_bytes of scratch. */
wkv_status place_views(const ViewSpec* views, int n, bool ws_stage, size_t ws_bytes, Placement* pl,
                       wkv_message* msg);
/* place_views on an RWKV problem's views (wkv_problem's mem[] order). */
wkv_status place_plan(const wkv_problem* p, bool ws_stage, size_t ws_bytes, Placement* pl,
                      wkv_message* msg);

/* Synchronises the stream on scope exit once host copies may be in flight (error paths: the
 * caller's host memory must not be read or written after the call has returned). */
struct StreamDrain {
    cudaStream_t stream;
    bool armed = false;
    explicit StreamDrain(cudaStream_t s) : stream(s) {}
    ~StreamDrain() {
        if (armed && cudaStreamSynchronize(stream) != cudaSuccess) cudaGetLastError();
    }
    StreamDrain(const StreamDrain&) = delete;
    StreamDrain& operator=(const StreamDrain&) = delete;
};

/* Staged call, before the kernels: scratch, addresses, copies in. */
wkv_status stage_in(CudaState* st, Placement* pl, StreamDrain* drain, wkv_message* msg);

/* Staged call, after the kernels: copies out, then waits for the stream. */
wkv_status stage_out(CudaState* st, Placement* pl, StreamDrain* drain, wkv_message* msg);

/* A caller's memory (the workspace or the forward's scratch) as device memory: a wkv_buffer's
 * or a device (or managed) pointer; nullptr for host memory (pageable or pinned) or none. */
char* device_memory(void* ptr, const wkv_buffer_ref& mem);

/* The workspace as device memory, or nullptr for host memory, which a backward replaces by
 * scratch. */
char* device_workspace(const wkv_problem* p);

/* The backward's checkpoints in a workspace: kScratchAlign-aligned (the size formula's slack). */
float* checkpoint_area(char* ws);

/* The backend table's buffer functions (src/backend.h). */
wkv_status cuda_buffer_create(void* state, uint64_t bytes, void** out_buffer, wkv_message* msg);
void cuda_buffer_destroy(void* state, void* buffer);
wkv_status cuda_buffer_write(void* state, void* buffer, uint64_t offset, const void* src, uint64_t bytes,
                             wkv_message* msg);
wkv_status cuda_buffer_read(void* state, void* buffer, uint64_t offset, void* dst, uint64_t bytes,
                            wkv_message* msg);

} // namespace wkv_cuda

#endif
