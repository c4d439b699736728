#version 450
// RWKV-6 forward (RWKV-5: w with a T-stride of 0; the recurrence in include/wkv/wkv.h; CPU
// sibling backends/cpu/rwkv6.cpp).
//
// One workgroup per item (sequence s, head h), N invocations; invocation i owns value row i
// of the state, S[i][0..N-1], in registers (float32). Per token:
//     ruk     = sum_j r[j] u[j] k[j]
//     y[i]    = S[i] . r + v[i] ruk                 (S before the update)
//     S[i][j] = S[i][j] * decay[j] + v[i] * k[j]
// Inputs are staged TC tokens at a time in shared memory, as in wkv7_fwd.comp; each
// invocation reads its whole row before it writes and writes only its own row, so state_out
// may be the memory of state_in.
//
// Specialisation constants: N (head size, workgroup size), TC (tokens per chunk).
#extension GL_GOOGLE_include_directive : require
#include "wkv_common.glsl"

layout(constant_id = 0) const int N = 64;
layout(constant_id = 1) const int TC = 8;
layout(local_size_x_id = 0) in;

WKV_INPUT(r, SLOT_R)
WKV_INPUT(w, SLOT_W)
WKV_INPUT(k, SLOT_K)
WKV_INPUT(v, SLOT_V)
WKV_INPUT(u, SLOT_U)
WKV_STATE_IN(sin, SLOT_SIN)
WKV_OUTPUT(y, SLOT_Y)
WKV_STATE_OUT(sout, SLOT_SOUT)

shared float s_r[TC * N], s_d[TC * N], s_k[TC * N], s_v[TC * N], s_u[N];

void main() {
    const int i = int(gl_LocalInvocationID.x);
    const int item = pc.item_base + int(gl_WorkGroupID.x);
    const int H = P.H;
    const int s = item / H, h = item - (item / H) * H;
    const ivec4 sq = P.seqs[s];
    const int batch = sq.x, t0 = sq.y, t1 = sq.z;

    float S[N];
    if (present(SLOT_SIN)) {
        WKV_FOR_N(j) S[j] = ld_sin(sti(SLOT_SIN, s, h, i, j)); WKV_END
    } else {
        WKV_FOR_N(j) S[j] = 0.0; WKV_END
    }
    s_u[i] = ld_u(tok(SLOT_U, 0, 0, h, i));

    for (int tc = t0; tc < t1; tc += TC) {
        const int m = min(TC, t1 - tc);
        for (int q = 0; q < m; ++q) {
            const int t = tc + q, x = q * N + i;
            float ddw;
            s_r[x] = ld_r(tok(SLOT_R, batch, t, h, i));
            s_d[x] = decay_of(ld_w(tok(SLOT_W, batch, t, h, i)), ddw);
            s_k[x] = ld_k(tok(SLOT_K, batch, t, h, i));
            s_v[x] = ld_v(tok(SLOT_V, batch, t, h, i));
        }
        barrier();
        for (int q = 0; q < m; ++q) {
            const int o = q * N;
            const float vi = s_v[o + i];
            float y = 0.0, ruk = 0.0;
            WKV_FOR_N(j) {
                const float rj = s_r[o + j], kj = s_k[o + j];
                y += S[j] * rj;
                ruk += rj * s_u[j] * kj;
                S[j] = S[j] * s_d[o + j] + vi * kj;
            } WKV_END
            st_y(tok(SLOT_Y, batch, tc + q, h, i), y + vi * ruk);
        }
        barrier();
    }

    if (present(SLOT_SOUT)) {
        WKV_FOR_N(j) st_sout(sti(SLOT_SOUT, s, h, i, j), S[j]); WKV_END
    }
}
