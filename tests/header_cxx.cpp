// The public header must compile as C++ with every warning an error.
#include "wkv/wkv.h"

int wkv_header_cxx_probe();
int wkv_header_cxx_probe() {
    wkv_forward_desc d{};
    d.struct_size = sizeof d;
    int64_t shape[1] = {1};
    d.r = wkv_tensor_make(nullptr, WKV_DTYPE_F32, 1, shape);
    return static_cast<int>(d.op) + static_cast<int>(WKV_OK);
}
