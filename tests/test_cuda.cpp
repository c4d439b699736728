// The CUDA backend plugin's self-description, with or without a GPU: a reason whenever it is
// unavailable, never a crash, and AUTO falling back to the CPU; the ops, dtypes and head sizes
// when it is there. Part of wkv_tests, which links only libwkv and has no CUDA header. The GPU
// tests are backends/cuda/tests/ (wkv_cuda_tests, with the CUDA runtime).
#include "wkv_doctest.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <dlfcn.h>

#include "wkv/wkv.h"

TEST_CASE("cuda: the backend describes itself, with or without a GPU") {
    wkv_backend_info info{};
    info.struct_size = sizeof info;
    REQUIRE(wkv_backend_get_info(WKV_BACKEND_CUDA, &info) == WKV_OK);
    REQUIRE(info.reason != nullptr);
    CHECK(std::strlen(info.reason) > 0);
    if (!info.available) {
        MESSAGE("cuda backend unavailable: " << std::string(info.reason));
        // Missing plugin, or the plugin without a usable device: never a crash, always a reason.
        const std::string why = info.reason;
        CHECK((why.find("not found") != std::string::npos ||
               why.find("no NVIDIA") != std::string::npos ||
               why.find("no CUDA device") != std::string::npos ||
               why.find("older than") != std::string::npos ||
               why.find("cannot run") != std::string::npos));
        // A machine without the driver is told so, not that its driver is too old.
        void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
        if (driver)
            dlclose(driver);
        else
            CHECK((why.find("not found") != std::string::npos || why.find("no NVIDIA driver") != std::string::npos));
        CHECK(why.find("insufficient") == std::string::npos);
        CHECK(info.device_count == 0);
        wkv_context_options o{};
        o.struct_size = sizeof o;
        o.backend = WKV_BACKEND_CUDA;
        wkv_context* ctx = nullptr;
        CHECK(wkv_context_create(&o, &ctx) == WKV_ERROR_BACKEND_UNAVAILABLE);
        CHECK(ctx == nullptr);
        // AUTO still works: it falls back to the CPU.
        o.backend = WKV_BACKEND_AUTO;
        REQUIRE(wkv_context_create(&o, &ctx) == WKV_OK);
        CHECK(wkv_context_backend(ctx) != WKV_BACKEND_CUDA);
        wkv_context_destroy(ctx);
    } else {
        CHECK(info.device_count >= 1);
        CHECK((info.ops & (1u << WKV_OP_RWKV7)) != 0);
        CHECK((info.ops & (1u << WKV_OP_RWKV6)) != 0);
        CHECK((info.ops & (1u << WKV_OP_RWKV4)) != 0);
        CHECK(info.dtypes == 7u);
        CHECK(info.any_head_size == 0);
        std::vector<int> sizes(info.head_sizes, info.head_sizes + info.num_head_sizes);
        for (int n : {32, 64, 128}) CHECK(std::find(sizes.begin(), sizes.end(), n) != sizes.end());
        wkv_device_info di{};
        di.struct_size = sizeof di;
        CHECK(wkv_device_get_info(WKV_BACKEND_CUDA, 0, &di) == WKV_OK);
        CHECK(di.memory_bytes > 0);
        CHECK(di.compute_units > 0);
    }
}

