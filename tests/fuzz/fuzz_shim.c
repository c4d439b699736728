/* C shims: pass raw int32 values as enum arguments (an out-of-range enum value is fine in C,
 * undefined in C++, and UBSan checks the harnesses' C++). */
#include <stdint.h>

#include "wkv/wkv.h"

wkv_status fz_backend_get_info(int32_t backend, wkv_backend_info* out) {
    return wkv_backend_get_info((wkv_backend)backend, out);
}
wkv_status fz_device_get_info(int32_t backend, int32_t index, wkv_device_info* out) {
    return wkv_device_get_info((wkv_backend)backend, index, out);
}
const char* fz_status_string(int32_t status) { return wkv_status_string((wkv_status)status); }
