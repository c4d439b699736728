// libFuzzer harness: wkv_workspace_size and wkv_backward on the CPU backend (fuzz_desc.h
// decodes the bytes; README.md). The forward descriptor's y and state_out are ignored by a
// backward, so they point into the PROT_NONE trap.
#include "fuzz_desc.h"

using namespace fz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    Case c(data, size, true);
    if (!c.setup()) return Stats::get().skipped++, -1;
    c.build_forward();
    const size_t o = bwd_spec_at();
    const uint8_t bss = c.in.u8(o + 0), ws_sel = c.in.u8(o + 1) & 7, ws_arg = c.in.u8(o + 3);
    const bool outb_null = c.in.u8(o + 2) == 1;
    bool bdesc_null = false;
    if (c.desc_null) c.desc_null = false, c.fdesc_forward_null = true;

    // the backward descriptor, struct_size from its own selector
    size_t sz = sizeof(wkv_backward_desc), bytes = sz, field = sz;
    bool tail_nonzero = false;
    switch (bss) {
    case 1: field = sz - 1; c.verdict.invalid("backward struct_size too small"); break;
    case 2: field = 0; c.verdict.invalid("backward struct_size 0"); break;
    case 3: field = bytes = sz + 16; break;
    case 4: field = bytes = sz + 16; tail_nonzero = true; c.verdict.invalid("backward tail set"); break;
    case 5: field = 65537; c.verdict.invalid("backward struct_size huge"); break;
    case 6: field = SIZE_MAX; c.verdict.invalid("backward struct_size SIZE_MAX"); break;
    case 8: bdesc_null = true; c.verdict.invalid("backward desc NULL"); break;
    default: break;
    }
    int bri = c.regs.place(c.next_big(), kBig, bytes, 0, "the backward descriptor");
    uint8_t* bmem = c.regs.r[(size_t)bri].start;
    memset(bmem, 0, bytes);
    wkv_backward_desc b;
    memset(&b, 0, sizeof b);
    b.struct_size = field;
    b.forward = c.fdesc_forward_null ? nullptr : c.fdesc;
    b.dy = c.p[R_DY].t;
    b.dstate_out = c.p[R_DSOUT].t;
    b.dr = c.p[R_DR].t, b.dw = c.p[R_DW].t, b.dk = c.p[R_DK].t, b.dv = c.p[R_DV].t;
    b.da = c.p[R_DA].t, b.db = c.p[R_DB].t, b.du = c.p[R_DU].t;
    b.dstate_in = c.p[R_DSIN].t;
    memcpy(bmem, &b, sizeof b);
    if (tail_nonzero) bmem[sz + ws_arg % 16] = 1;
    wkv_backward_desc* bd = (wkv_backward_desc*)bmem;
    const wkv_backward_desc* arg = bdesc_null ? nullptr : bd;

    int oi = c.regs.place(c.next_small(), kSmall, sizeof(size_t), 0, "*out_bytes");
    memset(c.regs.r[(size_t)oi].start, 0xA5, sizeof(size_t));
    size_t* outb = outb_null ? nullptr : (size_t*)c.regs.r[(size_t)oi].start;
    c.regs.arm();

    // 1. the workspace size
    Validity before_ws = c.verdict.v;
    if (outb_null) c.verdict.invalid("out_bytes NULL");
    c.dump("wkv_workspace_size / wkv_backward");
    wkv_status st1 = wkv_workspace_size(c.ctx, outb, arg);
    c.check_expectation(st1, "wkv_workspace_size");
    if (st1 == WKV_OK) std::fill(c.regs.r[(size_t)oi].may_write.begin(), c.regs.r[(size_t)oi].may_write.end(), 1);
    c.regs.verify(st1 == WKV_OK, "wkv_workspace_size");
    c.regs.resnap(oi);
    c.regs.clear_writes();
    c.verdict.v = before_ws;  // out_bytes does not concern the backward call

    // 2. the workspace
    size_t needed = st1 == WKV_OK ? *outb : 4096;
    if (st1 != WKV_OK) {  // the size, for the backward call, from a call that can succeed
        size_t n = 0;     // (the first may have failed for its out_bytes alone)
        if (wkv_workspace_size(c.ctx, &n, arg) == WKV_OK) needed = n;
    }
    if (st1 == WKV_OK) {
        size_t again = 0;
        wkv_status st = wkv_workspace_size(c.ctx, &again, arg);
        FZ_CHECK(st == WKV_OK && again == needed, "wkv_workspace_size is not repeatable");
    }
    if (needed > kWorkspace - 4096) return 0;  // cannot give it: nothing more to call
    size_t wsize = needed;
    uint8_t* wptr = nullptr;
    bool in_tensor = false;
    switch (ws_sel) {
    case 1: wsize = needed; if (needed) c.verdict.invalid("workspace NULL"); break;
    case 2: wsize = needed ? needed - 1 : 0; if (needed) c.verdict.invalid("workspace too small"); break;
    case 3: wsize = needed + 8 * (size_t)ws_arg; break;
    case 4: in_tensor = true; break;
    case 5: wsize = 0; if (needed) c.verdict.invalid("workspace_size 0"); break;
    default: break;
    }
    if (in_tensor) {
        // point the workspace at a tensor's memory: overlapping, must be refused (if needed)
        int ri = -1;
        for (int k = 0; k < R_COUNT && ri < 0; ++k) {
            const Plan& q = c.p[(k + ws_arg) % R_COUNT];
            if (q.present && q.validated && q.fits) ri = q.region;
        }
        if (ri >= 0) {
            wptr = c.regs.r[(size_t)ri].start;
            if (needed) c.verdict.invalid("workspace overlaps a tensor");
        } else {
            in_tensor = false;
        }
    }
    if (!in_tensor && ws_sel != 1) {
        int wi = c.regs.place(c.A.workspace, kWorkspace, wsize, 0, "the workspace");
        Region& g = c.regs.r[(size_t)wi];
        g.writable_always = true;
        memset(g.start, 0xEE, wsize);  // contents undefined on input
        c.regs.arm((size_t)wi);
        wptr = g.start;
    }
    bd->workspace = wptr;
    bd->workspace_size = wsize;
    c.regs.resnap(bri);

    // 3. the backward
    wkv_status st2 = wkv_backward(c.ctx, arg);
    c.check_expectation(st2, "wkv_backward");
    if (st1 != WKV_OK && !outb_null)
        FZ_CHECK(st2 == st1, "wkv_workspace_size said %d but wkv_backward %d for one descriptor",
                 (int)st1, (int)st2);
    if (st2 == WKV_OK) c.allow_outputs("wkv_backward", true);
    c.regs.verify(st2 == WKV_OK, "wkv_backward");

    // 4. again, with other garbage in the workspace: bit-identical gradients
    if (st2 == WKV_OK && c.twice && wptr && !in_tensor) {
        auto first = c.repoison_outputs();
        memset(wptr, 0x5A, wsize);
        wkv_status st = wkv_backward(c.ctx, arg);
        FZ_CHECK(st == WKV_OK, "wkv_backward: the same call failed the second time (%d)", (int)st);
        c.compare_outputs(first, "wkv_backward");
        c.regs.verify(true, "wkv_backward (second call)");
    }
    return 0;
}
