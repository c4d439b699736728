#version 450
// RWKV-4 forward in the stable (aa, bb, pp) form (include/wkv/wkv.h; CPU sibling
// backends/cpu/rwkv4.cpp, whose top comment has the formulas).
//
// One invocation per item (sequence s, channel c), item = s * C + c, 64 per workgroup; the
// channels are independent. Tensors: per-token [b, t, 0, c]; w, u [c]; the state
// [s, part (aa bb pp), 0, c] (planar or interleaved: folded into the strides). Each invocation
// reads its state before it writes it, so state_out may be the memory of state_in.
#extension GL_GOOGLE_include_directive : require
#include "wkv_common.glsl"
#include "wkv4_token.glsl"

layout(local_size_x = 64) in;

WKV_INPUT(w, SLOT_W)
WKV_INPUT(k, SLOT_K)
WKV_INPUT(v, SLOT_V)
WKV_INPUT(u, SLOT_U)
WKV_STATE_IN(sin, SLOT_SIN)
WKV_OUTPUT(y, SLOT_Y)
WKV_STATE_OUT(sout, SLOT_SOUT)

void main() {
    const int C = P.N_;
    const int item = pc.item_base + int(gl_GlobalInvocationID.x);
    if (item >= P.num_seqs * C) return;
    const int s = item / C, c = item - (item / C) * C;
    const ivec4 sq = P.seqs[s];
    const int batch = sq.x, t0 = sq.y, t1 = sq.z;

    float aa = 0.0, bb = 0.0, ph = EMPTY_PP, pl = 0.0;
    if (present(SLOT_SIN)) {
        aa = ld_sin(sti(SLOT_SIN, s, 0, 0, c));
        bb = ld_sin(sti(SLOT_SIN, s, 1, 0, c));
        ph = ld_sin(sti(SLOT_SIN, s, 2, 0, c));
    }
    const float uu = ld_u(tok(SLOT_U, 0, 0, 0, c));
    const float wd = -exp(ld_w(tok(SLOT_W, 0, 0, 0, c)));
    const bool want_y = present(SLOT_Y);
    for (int t = t0; t < t1; ++t) {
        const float kk = ld_k(tok(SLOT_K, batch, t, 0, c));
        const float vv = ld_v(tok(SLOT_V, batch, t, 0, c));
        const Tok o = token4(aa, bb, ph, pl, kk, vv, uu, wd, want_y);
        if (want_y) st_y(tok(SLOT_Y, batch, t, 0, c), o.y);
        aa = o.A * aa + o.Bk * vv;
        bb = o.A * bb + o.Bk;
        ph = o.qh;
        pl = o.ql;
    }
    if (present(SLOT_SOUT)) {
        st_sout(sti(SLOT_SOUT, s, 0, 0, c), aa);
        st_sout(sti(SLOT_SOUT, s, 1, 0, c), bb);
        st_sout(sti(SLOT_SOUT, s, 2, 0, c), ph);
    }
}
