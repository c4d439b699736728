#version 450
// The backward's deterministic reduction of the broadcast parameters' gradients: each
// element sums its per-sequence partials (BINDING_PART) over s = 0, 1, ..., num_seqs-1 in that
// order (as the CPU backend), after the op's backward dispatches.
//   RWKV-6 (P.op == 6): du[h][n] = sum_s part[(s H + h) N + n]
//   RWKV-4 (P.op == 4): dwd = sum_s part[2 s C + c], du[c] = sum_s part[2 s C + C + c];
//                       dw[c] = dwd == 0 ? 0 : dwd * -exp(w[c])
// One invocation per element, 64 per workgroup.
#extension GL_GOOGLE_include_directive : require
#include "wkv_common.glsl"

layout(local_size_x = 64) in;

WKV_INPUT(w, SLOT_W)
WKV_OUTPUT(dw, SLOT_DW)
WKV_OUTPUT(du, SLOT_DU)
layout(std430, set = 0, binding = BINDING_PART) readonly buffer Part { float part[]; };

void main() {
    const int e = pc.item_base + int(gl_GlobalInvocationID.x);
    const int S = P.num_seqs, N = P.N_;
    if (P.op == 6) {
        const int H = P.H;
        if (e >= H * N) return;
        const int h = e / N, n = e - (e / N) * N;
        float acc = 0.0;
        for (int s = 0; s < S; ++s) acc += part[(s * H + h) * N + n];
        st_du(tok(SLOT_DU, 0, 0, h, n), acc);
    } else {
        const int C = N;
        if (e >= C) return;
        float gw = 0.0, gu = 0.0;
        for (int s = 0; s < S; ++s) {
            gw += part[2 * s * C + e];
            gu += part[2 * s * C + C + e];
        }
        const float wv = ld_w(tok(SLOT_W, 0, 0, 0, e));
        st_dw(tok(SLOT_DW, 0, 0, 0, e), gw == 0.0 ? 0.0 : gw * -exp(wv));
        st_du(tok(SLOT_DU, 0, 0, 0, e), gu);
    }
}
