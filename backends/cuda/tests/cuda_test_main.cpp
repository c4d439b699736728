// main() of wkv_cuda_tests: doctest, plus exit code 77 ("skipped" for ctest) when every case
// skipped for want of a CUDA device and none failed.
#define DOCTEST_CONFIG_IMPLEMENT
#include "wkv_doctest.h"

int g_wkv_cuda_skipped = 0;
int g_wkv_cuda_ran = 0;

int main(int argc, char** argv) {
    doctest::Context context(argc, argv);
    const int rc = context.run();
    if (context.shouldExit()) return rc;
    if (rc == 0 && g_wkv_cuda_skipped > 0 && g_wkv_cuda_ran == 0) return 77;
    return rc;
}
