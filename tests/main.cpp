#define DOCTEST_CONFIG_IMPLEMENT
#include "wkv_doctest.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "wkv/wkv.h"

// WKV_CPU_ISA=<path> runs the suite on that CPU backend path (ctest's wkv_tests_isa_* entries).
// When this build or this CPU cannot run the path, the run is reported as skipped (exit code 77,
// ctest's SKIP_RETURN_CODE) instead of failing in every test case.
int main(int argc, char** argv) {
    const char* isa = std::getenv("WKV_CPU_ISA");
    if (isa && *isa) {
        wkv_context_options o{};
        o.struct_size = sizeof o;
        o.backend = WKV_BACKEND_CPU;
        wkv_context* ctx = nullptr;
        if (wkv_context_create(&o, &ctx) != WKV_OK) {
            const char* why = wkv_last_error(nullptr);
            std::printf("WKV_CPU_ISA=%s: %s\n", isa, why);
            if (std::strstr(why, "cannot execute") || std::strstr(why, "has no")) {
                std::printf("skipped: this machine cannot run the %s path\n", isa);
                return 77;
            }
            return 1;
        }
        wkv_context_destroy(ctx);
    }
    doctest::Context context(argc, argv);
    return context.run();
}
