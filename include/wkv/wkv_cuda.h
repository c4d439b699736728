/* libwkv interop with the CUDA runtime: run a context's work on the caller's stream.
 *
 * Include after <cuda_runtime_api.h> (or <cuda_runtime.h>), which defines cudaStream_t. libwkv
 * itself does not link CUDA: these calls go to the CUDA plugin when the context runs on it. */
#ifndef WKV_WKV_CUDA_H
#define WKV_WKV_CUDA_H

#include "wkv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every later call on ctx enqueues its work on `stream` and returns without synchronising
 * (the outputs are ready when the stream reaches that point; wkv_context_synchronize waits
 * for it) — except calls with a host tensor or a host workspace, which copy through the stream
 * and synchronise it before they return (wkv.h's memory model). NULL means the legacy default
 * stream. The stream must belong to the context's device and outlive its use by ctx.
 * Work on other streams is not ordered with it — the legacy default stream included, which a
 * non-blocking stream does not wait for: device memory you fill with cudaMemcpy / cudaMemset
 * (both may still be running when they return) must be complete, or filled on this stream,
 * before a call reads it.
 * Returns WKV_ERROR_INVALID_ARGUMENT when ctx is not on the CUDA backend. */
WKV_API wkv_status wkv_cuda_set_stream(wkv_context* ctx, cudaStream_t stream);
/* MEMORY. A call on device memory copies nothing and allocates nothing, with one exception:
 * the chunked RWKV-7 forward (N = 64, WKV_DECAY_CLAMPW, unpacked, few heads and long T: where
 * wkv_forward_scratch_size is nonzero) needs ~1.5 KB per token and head of device memory while
 * it runs. Given as wkv_forward_desc.scratch (device memory or a wkv_buffer of ctx, at least
 * wkv_forward_scratch_size bytes), that is all it uses. Without it the context takes it from a
 * stream-ordered memory pool of its own (cudaMallocFromPoolAsync / cudaFreeAsync on the stream:
 * no synchronisation; in a captured graph an allocation node), which keeps up to twice what the
 * last such call needed between calls and gives it back when the context is destroyed; if the pool
 * cannot give it, the call runs the sequential kernel instead (same results within rounding).
 * WKV_CUDA_RWKV7_CHUNKED=0 in the environment at context creation never chunks (no scratch).
 * The chunked RWKV-7 backward (the same shapes) allocates nothing: it runs in the backward's
 * workspace, which wkv_workspace_size sizes for it (~66 KB per 32 tokens and head);
 * WKV_CUDA_RWKV7_CHUNKED_BWD=0 at context creation never chunks the backward. */

/* The stream ctx enqueues on (as created: a non-blocking stream of the library's own). */
WKV_API wkv_status wkv_cuda_get_stream(wkv_context* ctx, cudaStream_t* out_stream);

#ifdef __cplusplus
}
#endif

#endif /* WKV_WKV_CUDA_H */
