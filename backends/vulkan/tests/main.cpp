// The Vulkan suite's entry point: without a usable Vulkan device the whole suite is SKIPPED
// (exit 77, ctest's SKIP_RETURN_CODE), never passed. The shared contexts are destroyed here,
// after the run and before main returns (suite_contexts.h says why).
#define DOCTEST_CONFIG_IMPLEMENT
#include "wkv_doctest.h"

#include <cstdio>

#include "suite_contexts.h"
#include "wkv/wkv.h"

int main(int argc, char** argv) {
    wkv_backend_info info{};
    info.struct_size = sizeof info;
    if (wkv_backend_get_info(WKV_BACKEND_VULKAN, &info) != WKV_OK || !info.available) {
        std::printf("SKIPPED: the Vulkan backend is unavailable: %s\n", info.reason ? info.reason : "?");
        return 77;
    }
    std::printf("Vulkan backend: %s\n", info.reason ? info.reason : "");
    int rc;
    {
        doctest::Context ctx(argc, argv);
        rc = ctx.run();
    }
    // Before main returns: the driver's exit-time teardown must find no context (suite_contexts.h).
    wkvtest::suite_contexts_destroy();
    return rc;
}
