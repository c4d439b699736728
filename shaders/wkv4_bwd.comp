#version 450
// RWKV-4 backward: checkpoint + replay of (aa, bb, ph, pl), the recurrence never inverted
// (backends/cpu/rwkv4.cpp's algorithm and formulas, step for step).
//
// One invocation per item (sequence s, channel c), item = s * C + c, 64 per workgroup.
// Workspace (float32):
//   checkpoints: item's state before segment g at ((seg0(s) * C + c * nseg + g) * 4), 4 floats
//                (aa bb ph pl); seg0(s) = the segments of the sequences before s (P.seqs[s].w)
//   replay:      item's K states at ((item - item_base) * K * 4), 4 floats each
//   partials:    dwd at (2 s C + c), du at (2 s C + C + c): summed over s in order by
//                wkv_reduce.comp, which also writes dw = wd * sum dwd
#extension GL_GOOGLE_include_directive : require
#include "wkv_common.glsl"
#include "wkv4_token.glsl"

layout(local_size_x = 64) in;

WKV_INPUT(w, SLOT_W)
WKV_INPUT(k, SLOT_K)
WKV_INPUT(v, SLOT_V)
WKV_INPUT(u, SLOT_U)
WKV_STATE_IN(sin, SLOT_SIN)
WKV_INPUT(dy, SLOT_DY)
WKV_STATE_IN(dsout, SLOT_DSOUT)
WKV_OUTPUT(dk, SLOT_DK)
WKV_OUTPUT(dv, SLOT_DV)
WKV_STATE_OUT(dsin, SLOT_DSIN)

layout(std430, set = 0, binding = BINDING_CKPT) buffer Ckpt { float ck[]; };
layout(std430, set = 0, binding = BINDING_REPLAY) buffer Replay { float rep[]; };
layout(std430, set = 0, binding = BINDING_PART) buffer Part { float part[]; };

void main() {
    const int C = P.N_;
    const int item = pc.item_base + int(gl_GlobalInvocationID.x);
    if (item >= P.num_seqs * C) return;
    const int s = item / C, c = item - (item / C) * C;
    const ivec4 sq = P.seqs[s];
    const int batch = sq.x, t0 = sq.y, t1 = sq.z;
    const int nseg = (t1 - t0 + WKV_K - 1) / WKV_K;
    const int ck0 = pc.ck_shift + (sq.w * C + c * nseg) * 4;
    const int rp = (item - pc.item_base) * WKV_K * 4;

    float aa = 0.0, bb = 0.0, ph = EMPTY_PP, pl = 0.0;
    if (present(SLOT_SIN)) {
        aa = ld_sin(sti(SLOT_SIN, s, 0, 0, c));
        bb = ld_sin(sti(SLOT_SIN, s, 1, 0, c));
        ph = ld_sin(sti(SLOT_SIN, s, 2, 0, c));
    }
    const float uu = ld_u(tok(SLOT_U, 0, 0, 0, c));
    const float wd = -exp(ld_w(tok(SLOT_W, 0, 0, 0, c)));

    // 1. checkpoints
    for (int g = 0; g < nseg; ++g) {
        const int o = ck0 + g * 4;
        ck[o] = aa; ck[o + 1] = bb; ck[o + 2] = ph; ck[o + 3] = pl;
        if (g + 1 == nseg) break;
        for (int t = t0 + g * WKV_K; t < t0 + (g + 1) * WKV_K; ++t) {
            const float kk = ld_k(tok(SLOT_K, batch, t, 0, c));
            const float vv = ld_v(tok(SLOT_V, batch, t, 0, c));
            const Tok z = token4(aa, bb, ph, pl, kk, vv, uu, wd, false);
            aa = z.A * aa + z.Bk * vv;
            bb = z.A * bb + z.Bk;
            ph = z.qh;
            pl = z.ql;
        }
    }

    // 2. segments in reverse
    float gaa = 0.0, gbb = 0.0, gpp = 0.0;
    if (present(SLOT_DSOUT)) {
        gaa = ld_dsout(sti(SLOT_DSOUT, s, 0, 0, c));
        gbb = ld_dsout(sti(SLOT_DSOUT, s, 1, 0, c));
        gpp = ld_dsout(sti(SLOT_DSOUT, s, 2, 0, c));
    }
    float dwd = 0.0, du = 0.0;
    for (int g = nseg - 1; g >= 0; --g) {
        const int ts = t0 + g * WKV_K;
        const int m = min(WKV_K, t1 - ts);
        // rep[q] = the state before token ts + q
        aa = ck[ck0 + g * 4]; bb = ck[ck0 + g * 4 + 1]; ph = ck[ck0 + g * 4 + 2]; pl = ck[ck0 + g * 4 + 3];
        for (int q = 0; q < m; ++q) {
            const int o = rp + q * 4;
            rep[o] = aa; rep[o + 1] = bb; rep[o + 2] = ph; rep[o + 3] = pl;
            if (q + 1 == m) break;
            const float kk = ld_k(tok(SLOT_K, batch, ts + q, 0, c));
            const float vv = ld_v(tok(SLOT_V, batch, ts + q, 0, c));
            const Tok z = token4(aa, bb, ph, pl, kk, vv, uu, wd, false);
            aa = z.A * aa + z.Bk * vv;
            bb = z.A * bb + z.Bk;
            ph = z.qh;
            pl = z.ql;
        }
        for (int q = m - 1; q >= 0; --q) {
            const int t = ts + q, o = rp + q * 4;
            const float a = rep[o], b = rep[o + 1], sph = rep[o + 2], spl = rep[o + 3];
            const float kk = ld_k(tok(SLOT_K, batch, t, 0, c));
            const float vv = ld_v(tok(SLOT_V, batch, t, 0, c));
            const Tok z = token4(a, b, sph, spl, kk, vv, uu, wd, true);
            // through y
            const float gy = ld_dy(tok(SLOT_DY, batch, t, 0, c)) * z.inv;
            const float dk_y = gy * z.e2 * (vv - z.y);
            float ga = gy * z.e1, gb = -gy * z.y * z.e1, gp = gy * z.e1 * (a - z.y * b);
            float dkt = dk_y, dvt = gy * z.e2, dwt = 0.0;
            // through the update
            const float dA = gaa * a + gbb * b, dB = gaa * vv + gbb;
            const float dAA = dA * z.A;
            const float dq2 = gpp - dAA - dB * z.Bk;
            ga += gaa * z.A;
            gb += gbb * z.A;
            gp += dAA;
            dwt += dAA;
            dvt += gaa * z.Bk;
            dkt += dB * z.Bk;
            if (z.side > 0.0) {
                gp += dq2;
                dwt += dq2;
            } else if (z.side < 0.0) {
                dkt += dq2;
            } else {
                gp += 0.5 * dq2;
                dwt += 0.5 * dq2;
                dkt += 0.5 * dq2;
            }
            gaa = ga;
            gbb = gb;
            gpp = gp;
            st_dk(tok(SLOT_DK, batch, t, 0, c), dkt);
            st_dv(tok(SLOT_DV, batch, t, 0, c), dvt);
            dwd += dwt;
            du += dk_y;
        }
    }

    // 3.
    if (present(SLOT_DSIN)) {
        st_dsin(sti(SLOT_DSIN, s, 0, 0, c), gaa);
        st_dsin(sti(SLOT_DSIN, s, 1, 0, c), gbb);
        st_dsin(sti(SLOT_DSIN, s, 2, 0, c), gpp);
    }
    part[2 * s * C + c] = dwd;
    part[2 * s * C + C + c] = du;
}
