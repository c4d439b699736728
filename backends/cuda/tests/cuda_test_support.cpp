// cuda_test_support.h's definitions.
#include "cuda_test_support.h"

namespace cudatest {

const char* cuda_unavailable_reason() {
    static std::string why;
    static int state = -1;  // -1 unknown, 0 no, 1 yes
    if (state < 0) {
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        wkv_backend_info info{};
        info.struct_size = sizeof info;
        wkv_backend_get_info(WKV_BACKEND_CUDA, &info);
        if (e != cudaSuccess) cudaGetLastError();  // not left for a later check to find
        if (e != cudaSuccess || n == 0) {
            why = std::string("cudaGetDeviceCount: ") + (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
            state = 0;
        } else if (!info.available) {
            why = std::string("the cuda backend is unavailable: ") + (info.reason ? info.reason : "?");
            state = 0;
        } else {
            state = 1;
        }
    }
    return state ? nullptr : why.c_str();
}

const char* mem_name(Mem m) {
    return m == Mem::Device ? "device" : m == Mem::Host ? "host" : m == Mem::Buffer ? "buffer" : "mixed";
}

}  // namespace cudatest
