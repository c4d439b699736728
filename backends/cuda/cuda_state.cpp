/* The CUDA plugin's shared host helpers (cuda_state.h): messages, CUDA errors as statuses. */
#include "cuda_state.h"

#include <cstdarg>
#include <cstdio>

namespace wkv_cuda {

bool fault_hit(const CudaState* st, int32_t kind, const char* site) {
    return wkv_fault_hit(&st->fault, kind, site);
}

void set_message(wkv_message* msg, const char* fmt, ...) {
    if (!msg) return;
    const int prefix = std::snprintf(msg->text, sizeof msg->text, "cuda backend: ");
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(msg->text + prefix, sizeof msg->text - (size_t)prefix, fmt, ap);
    va_end(ap);
}

const char* op_name(wkv_op op) {
    switch (op) {
    case WKV_OP_RWKV4: return "RWKV-4";
    case WKV_OP_RWKV6: return "RWKV-6";
    case WKV_OP_RWKV7: return "RWKV-7";
    default: return "unknown";
    }
}

wkv_status cuda_fail(CudaState* st, cudaError_t e, wkv_message* msg, const char* what) {
    set_message(msg, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
    switch (e) {
    case cudaErrorMemoryAllocation: return WKV_ERROR_OUT_OF_MEMORY;
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorAssert:
    case cudaErrorDevicesUnavailable:
    case cudaErrorUnknown:
        if (st) st->lost = true;
        return WKV_ERROR_DEVICE_LOST;
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidDeviceFunction: return WKV_ERROR_UNSUPPORTED;
    default: return WKV_ERROR_INTERNAL;
    }
}

wkv_status context_lost(wkv_message* msg) {
    set_message(msg, "an earlier call failed on the device; destroy this context");
    return WKV_ERROR_DEVICE_LOST;
}

} // namespace wkv_cuda
