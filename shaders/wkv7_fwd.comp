#version 450
// RWKV-7 forward (the recurrence in include/wkv/wkv.h; CPU sibling backends/cpu/rwkv7.cpp).
//
// One workgroup per item (sequence s, head h), N invocations; invocation i owns value row i
// of the state, S[i][0..N-1], in registers (float32). Per token:
//     sa      = S[i] . a
//     S[i][j] = S[i][j] * decay[j] + sa * b[j] + v[i] * k[j]
//     y[i]    = S[i] . r
// The inputs of TC tokens at a time are staged in shared memory (each invocation loads
// element i of each row, converting to float32 and computing the decay), so one pair of
// barriers serves TC tokens. Each invocation reads its whole state row before it writes
// anything and writes only its own row, so state_out may be the very memory of state_in.
//
// Specialisation constants: N (the head size, also the workgroup size) and TC (tokens per
// shared-memory chunk, chosen by the host from maxComputeSharedMemorySize).
#extension GL_GOOGLE_include_directive : require
#include "wkv_common.glsl"

layout(constant_id = 0) const int N = 64;
layout(constant_id = 1) const int TC = 8;
layout(local_size_x_id = 0) in;

WKV_INPUT(r, SLOT_R)
WKV_INPUT(w, SLOT_W)
WKV_INPUT(k, SLOT_K)
WKV_INPUT(v, SLOT_V)
WKV_INPUT(a, SLOT_A)
WKV_INPUT(b, SLOT_B)
WKV_STATE_IN(sin, SLOT_SIN)
WKV_OUTPUT(y, SLOT_Y)
WKV_STATE_OUT(sout, SLOT_SOUT)

shared float s_r[TC * N], s_d[TC * N], s_k[TC * N], s_v[TC * N], s_a[TC * N], s_b[TC * N];

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

    for (int tc = t0; tc < t1; tc += TC) {
        const int m = min(TC, t1 - tc);
        for (int u = 0; u < m; ++u) {
            const int t = tc + u, x = u * N + i;
            float ddw;
            s_r[x] = ld_r(tok(SLOT_R, batch, t, h, i));
            s_d[x] = decay_of(ld_w(tok(SLOT_W, batch, t, h, i)), ddw);
            s_k[x] = ld_k(tok(SLOT_K, batch, t, h, i));
            s_v[x] = ld_v(tok(SLOT_V, batch, t, h, i));
            s_a[x] = ld_a(tok(SLOT_A, batch, t, h, i));
            s_b[x] = ld_b(tok(SLOT_B, batch, t, h, i));
        }
        barrier();
        for (int u = 0; u < m; ++u) {
            const int o = u * N;
            float sa = 0.0;
            WKV_FOR_N(j) sa += S[j] * s_a[o + j]; WKV_END
            const float vi = s_v[o + i];
            float y = 0.0;
            WKV_FOR_N(j) {
                S[j] = S[j] * s_d[o + j] + sa * s_b[o + j] + vi * s_k[o + j];
                y += S[j] * s_r[o + j];
            } WKV_END
            st_y(tok(SLOT_Y, batch, tc + u, h, i), y);
        }
        barrier();
    }

    if (present(SLOT_SOUT)) {
        WKV_FOR_N(j) st_sout(sti(SLOT_SOUT, s, h, i, j), S[j]); WKV_END
    }
}
