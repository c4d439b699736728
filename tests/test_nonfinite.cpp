// The NaN/Inf policy on the CPU backend (wkv.h, NUMERICS: propagate, never invent): NaN, +Inf
// and -Inf in every input of every op, forward and backward, against the float64 reference
// element by element (tests/test_nonfinite.h). The name starts with "rwkv" so that ctest runs
// it on every instruction-set path (wkv_tests_isa_scalar/avx2/avx512).
#include "wkv_doctest.h"

#include "test_nonfinite.h"

using namespace wkvtest;

TEST_CASE("rwkv nonfinite: NaN and Inf inputs propagate as in the float64 reference, every op") {
    const uint64_t seed = test_seed();
    CAPTURE(seed);
    CpuCtx cpu(2);
    REQUIRE(cpu.status == WKV_OK);
    int cases = 0;
    // N = 16 and C = 32: whole vectors on the AVX2 and AVX-512 paths
    for (wkv_op op : {WKV_OP_RWKV7, WKV_OP_RWKV6, WKV_OP_RWKV4}) {
        for (const NonfiniteCase& c : nonfinite_cases(seed, op, op == WKV_OP_RWKV4 ? 32 : 16)) {
            CAPTURE(c.name);
            const AnyRun run = any_run(cpu.ctx, c.p);
            const std::string why = nonfinite_disagreement(run, c, 1e-4);
            CHECK_MESSAGE(why.empty(), why);
            ++cases;
        }
    }
    MESSAGE(cases << " NaN/Inf cases, forward and backward");
}
