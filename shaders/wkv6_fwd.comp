#version 450
// RWKV-6 forward (RWKV-5: w with a T-stride of 0; the recurrence in include/wkv/wkv.h; CPU
// sibling backends/cpu/rwkv6.cpp).
//
// Value rows of the state are independent: for row i, per token
//     y[i]    = S[i] . r + v[i] (sum_j r[j] u[j] k[j]) = sum_j r[j] (S[i][j] + v[i] u[j] k[j])
//     S[i][j] = S[i][j] * decay[j] + v[i] * k[j]          (S before the update in y)
// so each row lives in registers of its C lanes (wkv_rows.glsl: work split, chunk staging,
// as wkv7_fwd.comp), one lane reduction per token, two barriers per chunk of TC tokens. Each
// lane reads its columns of the state before it writes them and writes only those, so
// state_out may be the memory of state_in.
#extension GL_GOOGLE_include_directive : require

layout(constant_id = 0) const int N = 64;
layout(constant_id = 1) const int TC = 8;
layout(constant_id = 2) const int C = 1;
layout(constant_id = 3) const int WG = 64;
layout(constant_id = 4) const int DT = -1;
layout(local_size_x_id = 3) in;
#define WKV_SLOT_DTYPE(slot) (DT >= 0 ? DT : P.td[slot].dtype)

#include "wkv_common.glsl"

WKV_INPUT(r, SLOT_R)
WKV_INPUT(w, SLOT_W)
WKV_INPUT(k, SLOT_K)
WKV_INPUT(v, SLOT_V)
WKV_INPUT(u, SLOT_U)
WKV_STATE_IN(sin, SLOT_SIN)
WKV_OUTPUT(y, SLOT_Y)
WKV_STATE_OUT(sout, SLOT_SOUT)

#include "wkv_rows.glsl"

shared vec4 s_r[TC * NP], s_d[TC * NP], s_k[TC * NP];
shared float s_v[TC * NP4];

float p_r[NL], p_w[NL], p_k[NL], p_v[NL];

TokAt A_r, A_w, A_k, A_v; // set once in main()
int form_; // P.form, read once

void prefetch(int tc, int t1) {
    [[unroll]] for (int q = 0; q < NL; ++q) {
        int uu, e;
        staged_slot(q, uu, e);
        const int t = min(tc + uu, t1 - 1); /* in range: loads are never under a branch */
        p_r[q] = ld_r(at(A_r, t, e));
        p_w[q] = ld_w(at(A_w, t, e));
        p_k[q] = ld_k(at(A_k, t, e));
        p_v[q] = ld_v(at(A_v, t, e));
    }
}

void stage() {
    [[unroll]] for (int q = 0; q < NL; ++q) {
        int uu, e;
        staged_slot(q, uu, e);
        if (uu < TC) {
            const bool col = e < N; /* padding columns are zero */
            const int x = uu * NP + (e >> 2), c = e & 3;
            float ddw;
            s_r[x][c] = col ? p_r[q] : 0.0;
            s_d[x][c] = col ? decay_of_form(p_w[q], form_, ddw) : 0.0;
            s_k[x][c] = col ? p_k[q] : 0.0;
            s_v[uu * NP4 + e] = col ? p_v[q] : 0.0;
        }
    }
}

void main() {
    const int tid = int(gl_LocalInvocationID.x);
    const int i = tid / C, l = tid - (tid / C) * C;
    const int item = pc.item_base + int(gl_WorkGroupID.x);
    const int H = P.H;
    const int s = item / H, h = item - (item / H) * H;
    const ivec4 sq = P.seqs[s];
    const int batch = sq.x, t0 = sq.y, t1 = sq.z;

    vec4 S[NQ], U[NQ];
    load_row(S, s, h, i, l);
    const int ubase = tok(SLOT_U, 0, 0, h, 0), un = P.td[SLOT_U].stride.w;
    WKV_FOR_COUNT(q, NQ)
        const int c0 = (q * C + l) * 4;
        vec4 x;
        x.x = ld_u(ubase + un * min(N - 1, c0 + 0));
        x.y = ld_u(ubase + un * min(N - 1, c0 + 1));
        x.z = ld_u(ubase + un * min(N - 1, c0 + 2));
        x.w = ld_u(ubase + un * min(N - 1, c0 + 3));
        U[q] = x; /* padding columns: k and r are zero there */
    WKV_END
    const int ybase = tok(SLOT_Y, batch, 0, h, i), ystep = P.td[SLOT_Y].stride.y;
    A_r = tok_at(SLOT_R, batch, h);
    A_w = tok_at(SLOT_W, batch, h);
    A_k = tok_at(SLOT_K, batch, h);
    A_v = tok_at(SLOT_V, batch, h);
    form_ = P.form;

    if (t0 < t1) prefetch(t0, t1);
    for (int tc = t0; tc < t1; tc += TC) {
        barrier(); /* the previous chunk is done with shared memory */
        stage();
        barrier();
        prefetch(tc + TC, t1); /* the next chunk (past the end: the last token again) */
        const int m = min(TC, t1 - tc);
        for (int uu = 0; uu < m; ++uu) {
            const int o = uu * NP + l;
            const float vi = s_v[uu * NP4 + i];
            vec4 y0 = vec4(0.0), y1 = vec4(0.0);
            WKV_FOR_COUNT(q, NQ)
                const int x = o + q * C;
                const vec4 kq = s_k[x];
                const vec4 term = s_r[x] * (S[q] + vi * (U[q] * kq));
                if ((q & 1) == 0) y0 += term;
                else y1 += term;
                S[q] = S[q] * s_d[x] + vi * kq;
            WKV_END
            const vec4 t4 = y0 + y1;
            const float y = lane_sum((t4.x + t4.y) + (t4.z + t4.w));
            if (l == 0) st_y(ybase + (tc + uu) * ystep, y);
        }
    }

    store_row(S, s, h, i, l);
}
