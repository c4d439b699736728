/* The public header must compile as strict C99 with every warning an error. */
#include "wkv/wkv.h"

int wkv_header_c99_probe(void);
int wkv_header_c99_probe(void) {
    wkv_forward_desc d = {0};
    d.struct_size = sizeof d;
    int64_t shape[1] = {1};
    d.r = wkv_tensor_make(0, WKV_DTYPE_F32, 1, shape);
    return (int)d.op + (int)WKV_OK;
}
