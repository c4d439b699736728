/* wkv_cuda.h: forwarded to the CUDA plugin's control hook. cudaStream_t is only an opaque
 * pointer here, so the core needs no CUDA header. */
typedef struct CUstream_st* cudaStream_t;
#include "wkv/wkv_cuda.h"

#include "context.h"

wkv_status wkv_cuda_set_stream(wkv_context* ctx, cudaStream_t stream) {
    return wkv_context_control(ctx, "wkv_cuda_set_stream", WKV_BACKEND_CUDA, WKV_CONTROL_CUDA_SET_STREAM,
                               (void*)stream, NULL);
}

wkv_status wkv_cuda_get_stream(wkv_context* ctx, cudaStream_t* out_stream) {
    return wkv_context_control(ctx, "wkv_cuda_get_stream", WKV_BACKEND_CUDA, WKV_CONTROL_CUDA_GET_STREAM,
                               (void*)out_stream, "out_stream");
}
