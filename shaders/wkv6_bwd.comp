#version 450
// RWKV-6 backward (RWKV-5 included): checkpoint + replay, never dividing by the decay (the
// algorithm and gradient formulas of backends/cpu/rwkv6.cpp).
//
// One workgroup per item (sequence s, head h), N invocations; invocation x is both value row
// x and key column x (as wkv7_bwd.comp). For a sequence of L tokens in G = ceil(L / K)
// segments of K = WKV_K:
//   1. forward from state_in in row form, writing the state before each segment to the
//      checkpoint binding: C_0 .. C_{G-1};
//   2. for g = G-1 down to 0: replay segment g from C_g, writing its states (rep[0] = C_g,
//      rep[u+1] = the state after token u, row-major [i][j]) to this item's replay scratch;
//      then walk the tokens backward with dS (w.r.t. the state after token t) held as
//      dR = row x and dC = column x, Sp = the state before token t:
//        dyv = sum_i dy[i] v[i];  ruk = sum_j r[j] u[j] k[j]   (each invocation, same order)
//        row x:    dv[x] = dR . k + dy[x] ruk;          dR = dR decay + dy[x] r
//        column x: dr[x] = Sp[.][x] . dy + u[x] k[x] dyv;  dk[x] = dC . v + r[x] u[x] dyv
//                  dd[x] = dC . Sp[.][x];  dw[x] = dd[x] ddecay/dw;  du_x += r[x] k[x] dyv
//                  dC = dC decay[x] + dy r[x]
//   3. dstate_in = dR; the item's du partial (N floats) to the partials binding at item * N.
// wkv_reduce.comp then sums the partials over sequences in order (deterministic).
//
// Specialisation constant: N (head size, workgroup size).
#extension GL_GOOGLE_include_directive : require
#include "wkv_common.glsl"

layout(constant_id = 0) const int N = 64;
layout(local_size_x_id = 0) in;

WKV_INPUT(r, SLOT_R)
WKV_INPUT(w, SLOT_W)
WKV_INPUT(k, SLOT_K)
WKV_INPUT(v, SLOT_V)
WKV_INPUT(u, SLOT_U)
WKV_STATE_IN(sin, SLOT_SIN)
WKV_INPUT(dy, SLOT_DY)
WKV_STATE_IN(dsout, SLOT_DSOUT)
WKV_OUTPUT(dr, SLOT_DR)
WKV_OUTPUT(dw, SLOT_DW)
WKV_OUTPUT(dk, SLOT_DK)
WKV_OUTPUT(dv, SLOT_DV)
WKV_STATE_OUT(dsin, SLOT_DSIN)

layout(std430, set = 0, binding = BINDING_CKPT) coherent buffer Ckpt { float ck[]; };
layout(std430, set = 0, binding = BINDING_REPLAY) coherent buffer Replay { float rep[]; };
// vec4 views of the same bindings: a thread's row in 16-byte pieces (WKV_ROW_STORE)
layout(std430, set = 0, binding = BINDING_CKPT) coherent buffer Ckpt4 { vec4 ck4[]; };
layout(std430, set = 0, binding = BINDING_REPLAY) coherent buffer Replay4 { vec4 rep4[]; };
#define S6_(j) S_a[j]
layout(std430, set = 0, binding = BINDING_PART) buffer Part { float part[]; };

shared float s_r[N], s_d[N], s_ddw[N], s_k[N], s_v[N], s_u[N], s_dy[N];

// A forward step's inputs (w, k, v of one token, element x) are loaded one token ahead into
// registers (prefetch), so that their memory latency overlaps the current token's work; stage
// puts w's decay and k into shared memory and returns v at the start of the step that uses them.
float pf_w, pf_k, pf_v;
void prefetch(int batch, int t, int h, int x) {
    pf_w = ld_w(tok(SLOT_W, batch, t, h, x));
    pf_k = ld_k(tok(SLOT_K, batch, t, h, x));
    pf_v = ld_v(tok(SLOT_V, batch, t, h, x));
}
float stage(int x) {
    float ddw;
    s_d[x] = decay_of(pf_w, ddw);
    s_k[x] = pf_k;
    return pf_v;
}

void main() {
    const int x = int(gl_LocalInvocationID.x);
    const int item = pc.item_base + int(gl_WorkGroupID.x);
    const int H = P.H;
    const int s = item / H, h = item - (item / H) * H;
    const ivec4 sq = P.seqs[s];
    const int batch = sq.x, t0 = sq.y, t1 = sq.z;
    const int nseg = (t1 - t0 + WKV_K - 1) / WKV_K;
    const int NN = N * N;
    const int ck0 = pc.ck_shift + (sq.w * H + h * nseg - pc.ck_first) * NN;
    const int rp = (item - pc.item_base) * pc.rep_stride;

    s_u[x] = ld_u(tok(SLOT_U, 0, 0, h, x));
    float S_a[N], DR_a[N], DC_a[N];
    if (present(SLOT_SIN)) {
        WKV_FOR_N(j) S_a[j] = ld_sin(sti(SLOT_SIN, s, h, x, j)); WKV_END
    } else {
        WKV_FOR_N(j) S_a[j] = 0.0; WKV_END
    }
    // 1. checkpoints
    if (nseg > 1) prefetch(batch, t0, h, x);
    for (int g = 0; g + 1 < nseg; ++g) {
        WKV_ROW_STORE(ck, ck4, ck0 + g * NN + x * N, S6_)
        for (int t = t0 + g * WKV_K; t < t0 + (g + 1) * WKV_K; ++t) {
            const float vx = stage(x);
            prefetch(batch, t + 1, h, x); // t + 1 < t1: this loop stops a segment short
            barrier();
            WKV_FOR_N(j) S_a[j] = S_a[j] * s_d[j] + vx * s_k[j]; WKV_END
            barrier();
        }
    }
    if (nseg > 0) {
        WKV_ROW_STORE(ck, ck4, ck0 + (nseg - 1) * NN + x * N, S6_)
    }

    // 2. segments in reverse
    if (present(SLOT_DSOUT)) {
        WKV_FOR_N(j) DR_a[j] = ld_dsout(sti(SLOT_DSOUT, s, h, x, j)); WKV_END
        WKV_FOR_N(i) DC_a[i] = ld_dsout(sti(SLOT_DSOUT, s, h, i, x)); WKV_END
    } else {
        WKV_FOR_N(j) { DR_a[j] = 0.0; DC_a[j] = 0.0; } WKV_END
    }
    float du_acc = 0.0;
    for (int g = nseg - 1; g >= 0; --g) {
        const int ts = t0 + g * WKV_K;
        const int m = min(WKV_K, t1 - ts);
        WKV_ROW_LOAD(ck, ck4, ck0 + g * NN + x * N, S6_)
        WKV_ROW_STORE(rep, rep4, rp + x * N, S6_)
        if (m > 1) prefetch(batch, ts, h, x);
        for (int q = 0; q + 1 < m; ++q) {
            const float vx = stage(x);
            prefetch(batch, ts + min(q + 1, m - 2), h, x);
            barrier();
            const int o = rp + (q + 1) * NN + x * N;
            WKV_FOR_N(j) S_a[j] = S_a[j] * s_d[j] + vx * s_k[j]; WKV_END
            WKV_ROW_STORE(rep, rep4, o, S6_)
            barrier();
        }
        memoryBarrierBuffer();
        barrier();

        for (int q = m - 1; q >= 0; --q) {
            const int t = ts + q;
            s_r[x] = ld_r(tok(SLOT_R, batch, t, h, x));
            s_d[x] = decay_of(ld_w(tok(SLOT_W, batch, t, h, x)), s_ddw[x]);
            s_k[x] = ld_k(tok(SLOT_K, batch, t, h, x));
            s_v[x] = ld_v(tok(SLOT_V, batch, t, h, x));
            s_dy[x] = ld_dy(tok(SLOT_DY, batch, t, h, x));
            barrier();

            float dyv = 0.0, ruk = 0.0;
            WKV_FOR_N(j) {
                dyv += s_dy[j] * s_v[j];
                ruk += s_r[j] * s_u[j] * s_k[j];
            } WKV_END
            // row x
            const float dyx = s_dy[x];
            float dv = 0.0;
            WKV_FOR_N(j) {
                dv += DR_a[j] * s_k[j];
                DR_a[j] = DR_a[j] * s_d[j] + dyx * s_r[j];
            } WKV_END
            // column x
            const float rx = s_r[x], dx = s_d[x], kx = s_k[x], ux = s_u[x];
            const int sp_ = rp + q * NN + x; // Sp[i][x] at sp_ + i * N
            float dr = 0.0, dk = 0.0, dd = 0.0;
            WKV_FOR_N(i) {
                const float spi = rep[sp_ + i * N];
                dr += spi * s_dy[i];
                dk += DC_a[i] * s_v[i];
                dd += DC_a[i] * spi;
                DC_a[i] = DC_a[i] * dx + s_dy[i] * rx;
            } WKV_END
            du_acc += rx * kx * dyv;

            st_dr(tok(SLOT_DR, batch, t, h, x), dr + ux * kx * dyv);
            st_dw(tok(SLOT_DW, batch, t, h, x), dd * s_ddw[x]);
            st_dk(tok(SLOT_DK, batch, t, h, x), dk + rx * ux * dyv);
            st_dv(tok(SLOT_DV, batch, t, h, x), dv + dyx * ruk);
            barrier();
        }
    }

    // 3.
    if (present(SLOT_DSIN)) {
        WKV_FOR_N(j) st_dsin(sti(SLOT_DSIN, s, h, x, j), DR_a[j]); WKV_END
    }
    part[item * N + x] = du_acc;
}
