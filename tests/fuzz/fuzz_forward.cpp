// libFuzzer harness: wkv_forward on the CPU backend (fuzz_desc.h decodes the bytes; README.md).
#include "fuzz_desc.h"

using namespace fz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    Case c(data, size, false);
    if (!c.setup()) return Stats::get().skipped++, -1;  // a valid descriptor too large to run cheaply: not called
    c.build_forward();
    c.regs.arm();
    HostPf& pf = host_pf_state();
    pf.split = c.seed;
    pf.probe = c.busy_probe && c.ctx ? c.fdesc : nullptr;
    const wkv_forward_desc* d = c.desc_null ? nullptr : c.fdesc;
    c.dump("wkv_forward");
    wkv_status st = wkv_forward(c.ctx, d);
    pf.probe = nullptr;
    c.check_expectation(st, "wkv_forward");
    if (st == WKV_OK) c.allow_outputs("wkv_forward", true);
    c.regs.verify(st == WKV_OK, "wkv_forward");

    // The same call again, into freshly poisoned outputs: bit-identical results.
    if (st == WKV_OK && c.twice && !c.inplace) {
        auto first = c.repoison_outputs();
        st = wkv_forward(c.ctx, d);
        FZ_CHECK(st == WKV_OK, "wkv_forward: the same call failed the second time (%d)", (int)st);
        c.compare_outputs(first, "wkv_forward");
        c.regs.verify(true, "wkv_forward (second call)");
    }
    return 0;
}
