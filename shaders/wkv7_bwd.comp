#version 450
// RWKV-7 backward: checkpoint + replay, never dividing by the decay (the algorithm of
// backends/cpu/rwkv7.cpp, whose top comment has the gradient formulas).
//
// One workgroup per item (sequence s, head h), N invocations; invocation x is both value row
// x and key column x. For a sequence of L tokens in G = ceil(L / K) segments of K = WKV_K:
//   1. forward from state_in in row form (invocation x owns S[x][.]), writing the state
//      before each segment to the checkpoint binding: C_0 .. C_{G-1};
//   2. for g = G-1 down to 0: replay segment g from C_g, writing its m+1 states
//      (rep[0] = C_g, rep[u+1] = the state after token u, row-major [i][j]) and each token's
//      sa = S_{t-1} a to this item's replay scratch; then walk the tokens backward. The
//      gradient dS is held twice: dR = row x of dS, dC = column x of dS (BlinkDL's trick), so
//      that every sum is local to an invocation:
//        row x:    dR += dy[x] r;  dv[x] = dR . k;  dsa[x] = dR . b;  dR = dR decay + dsa[x] a
//        column x: dC += dy r[x];  dr[x] = S_t[.][x] . dy;  dk[x] = dC . v;  db[x] = dC . sa;
//                  da[x] = S_{t-1}[.][x] . dsa;  dd[x] = dC . S_{t-1}[.][x];
//                  dw[x] = dd[x] * ddecay/dw;  dC = dC decay[x] + dsa a[x]
//      (dsa goes from the row owners to the column owners through shared memory);
//   3. dstate_in = dR (row x).
// The replay states are written by their row owner and read back by the column owners: the
// workspace bindings are coherent, with memoryBarrierBuffer + barrier in between.
//
// Specialisation constant: N (the head size, also the workgroup size).
#extension GL_GOOGLE_include_directive : require
#include "wkv_common.glsl"

layout(constant_id = 0) const int N = 64;
layout(local_size_x_id = 0) in;

WKV_INPUT(r, SLOT_R)
WKV_INPUT(w, SLOT_W)
WKV_INPUT(k, SLOT_K)
WKV_INPUT(v, SLOT_V)
WKV_INPUT(a, SLOT_A)
WKV_INPUT(b, SLOT_B)
WKV_STATE_IN(sin, SLOT_SIN)
WKV_INPUT(dy, SLOT_DY)
WKV_STATE_IN(dsout, SLOT_DSOUT)
WKV_OUTPUT(dr, SLOT_DR)
WKV_OUTPUT(dw, SLOT_DW)
WKV_OUTPUT(dk, SLOT_DK)
WKV_OUTPUT(dv, SLOT_DV)
WKV_OUTPUT(da, SLOT_DA)
WKV_OUTPUT(db, SLOT_DB)
WKV_STATE_OUT(dsin, SLOT_DSIN)

layout(std430, set = 0, binding = BINDING_CKPT) coherent buffer Ckpt { float ck[]; };
layout(std430, set = 0, binding = BINDING_REPLAY) coherent buffer Replay { float rep[]; };
// vec4 views of the same bindings: a thread's row in 16-byte pieces (WKV_ROW_STORE)
layout(std430, set = 0, binding = BINDING_CKPT) coherent buffer Ckpt4 { vec4 ck4[]; };
layout(std430, set = 0, binding = BINDING_REPLAY) coherent buffer Replay4 { vec4 rep4[]; };

// Per-invocation rows: S (the state row x), dR (row x of dS), dC (column x of dS).
#define WKV_DECL_ROWS float S_a[N], DR_a[N], DC_a[N];
#define S_(j) S_a[j]
#define DR_(j) DR_a[j]
#define DC_(j) DC_a[j]

shared float s_r[N], s_d[N], s_ddw[N], s_k[N], s_v[N], s_a[N], s_b[N], s_dy[N], s_sa[N], s_dsa[N];

// A forward step's inputs (w, k, v, a, b of one token, element x) are loaded one token ahead
// into registers (prefetch), so that their memory latency overlaps the current token's work,
// and staged into shared memory (stage) at the start of the step that uses them.
float pf_w, pf_k, pf_v, pf_a, pf_b;
void prefetch(int batch, int t, int h, int x) {
    pf_w = ld_w(tok(SLOT_W, batch, t, h, x));
    pf_k = ld_k(tok(SLOT_K, batch, t, h, x));
    pf_v = ld_v(tok(SLOT_V, batch, t, h, x));
    pf_a = ld_a(tok(SLOT_A, batch, t, h, x));
    pf_b = ld_b(tok(SLOT_B, batch, t, h, x));
}
void stage(int x) {
    float ddw;
    s_d[x] = decay_of(pf_w, ddw);
    s_k[x] = pf_k;
    s_v[x] = pf_v;
    s_a[x] = pf_a;
    s_b[x] = pf_b;
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
    // this item's checkpoints, as element indices in the checkpoint binding
    const int ck0 = pc.ck_shift + (sq.w * H + h * nseg - pc.ck_first) * NN;
    const int rp = (item - pc.item_base) * pc.rep_stride; // replay states
    const int rsa = rp + (WKV_K + 1) * NN;                 // replay sa rows

    // 1. checkpoints
    WKV_DECL_ROWS
    if (present(SLOT_SIN)) {
        WKV_FOR_N(j) S_(j) = ld_sin(sti(SLOT_SIN, s, h, x, j)); WKV_END
    } else {
        WKV_FOR_N(j) S_(j) = 0.0; WKV_END
    }
    if (nseg > 1) prefetch(batch, t0, h, x);
    for (int g = 0; g + 1 < nseg; ++g) {
        WKV_ROW_STORE(ck, ck4, ck0 + g * NN + x * N, S_)
        for (int t = t0 + g * WKV_K; t < t0 + (g + 1) * WKV_K; ++t) {
            stage(x);
            prefetch(batch, t + 1, h, x); // t + 1 < t1: this loop stops a segment short
            barrier();
            float sa = 0.0;
            WKV_FOR_N(j) sa += S_(j) * s_a[j]; WKV_END
            const float vx = s_v[x];
            WKV_FOR_N(j) S_(j) = S_(j) * s_d[j] + sa * s_b[j] + vx * s_k[j]; WKV_END
            barrier();
        }
    }
    if (nseg > 0) {
        WKV_ROW_STORE(ck, ck4, ck0 + (nseg - 1) * NN + x * N, S_)
    }

    // 2. segments in reverse
    if (present(SLOT_DSOUT)) {
        WKV_FOR_N(j) DR_(j) = ld_dsout(sti(SLOT_DSOUT, s, h, x, j)); WKV_END
        WKV_FOR_N(i) DC_(i) = ld_dsout(sti(SLOT_DSOUT, s, h, i, x)); WKV_END
    } else {
        WKV_FOR_N(j) { DR_(j) = 0.0; DC_(j) = 0.0; } WKV_END
    }
    for (int g = nseg - 1; g >= 0; --g) {
        const int ts = t0 + g * WKV_K;
        const int m = min(WKV_K, t1 - ts);
        // replay: rep[0] = C_g, rep[u + 1] = S after token ts + u
        WKV_ROW_LOAD(ck, ck4, ck0 + g * NN + x * N, S_)
        WKV_ROW_STORE(rep, rep4, rp + x * N, S_)
        prefetch(batch, ts, h, x);
        for (int u = 0; u < m; ++u) {
            stage(x);
            prefetch(batch, ts + min(u + 1, m - 1), h, x);
            barrier();
            float sa = 0.0;
            WKV_FOR_N(j) sa += S_(j) * s_a[j]; WKV_END
            rep[rsa + u * N + x] = sa;
            const float vx = s_v[x];
            const int o = rp + (u + 1) * NN + x * N;
            WKV_FOR_N(j) S_(j) = S_(j) * s_d[j] + sa * s_b[j] + vx * s_k[j]; WKV_END
            WKV_ROW_STORE(rep, rep4, o, S_)
            barrier();
        }
        memoryBarrierBuffer();
        barrier();

        for (int u = m - 1; u >= 0; --u) {
            const int t = ts + u;
            s_r[x] = ld_r(tok(SLOT_R, batch, t, h, x));
            s_d[x] = decay_of(ld_w(tok(SLOT_W, batch, t, h, x)), s_ddw[x]);
            s_k[x] = ld_k(tok(SLOT_K, batch, t, h, x));
            s_v[x] = ld_v(tok(SLOT_V, batch, t, h, x));
            s_a[x] = ld_a(tok(SLOT_A, batch, t, h, x));
            s_b[x] = ld_b(tok(SLOT_B, batch, t, h, x));
            s_dy[x] = ld_dy(tok(SLOT_DY, batch, t, h, x));
            s_sa[x] = rep[rsa + u * N + x];
            barrier();

            // row x
            const float dyx = s_dy[x];
            float dv = 0.0, dsa = 0.0;
            WKV_FOR_N(j) {
                DR_(j) += dyx * s_r[j];
                dv += DR_(j) * s_k[j];
                dsa += DR_(j) * s_b[j];
            } WKV_END
            s_dsa[x] = dsa;
            st_dv(tok(SLOT_DV, batch, t, h, x), dv);
            barrier();

            // column x
            const float rx = s_r[x], dx = s_d[x], ax = s_a[x];
            const int st_ = rp + (u + 1) * NN + x; // S_t[i][x] at st_ + i * N
            const int sp_ = rp + u * NN + x;       // S_{t-1}[i][x] at sp_ + i * N
            float dr = 0.0, dk = 0.0, db = 0.0, da = 0.0, dd = 0.0;
            WKV_FOR_N(i) {
                const float sti_ = rep[st_ + i * N], spi = rep[sp_ + i * N];
                const float gi = DC_(i) + s_dy[i] * rx;
                dr += sti_ * s_dy[i];
                dk += gi * s_v[i];
                db += gi * s_sa[i];
                da += spi * s_dsa[i];
                dd += gi * spi;
                DC_(i) = gi * dx + s_dsa[i] * ax;
            } WKV_END
            WKV_FOR_N(j) DR_(j) = DR_(j) * s_d[j] + dsa * s_a[j]; WKV_END

            st_dr(tok(SLOT_DR, batch, t, h, x), dr);
            st_dw(tok(SLOT_DW, batch, t, h, x), dd * s_ddw[x]);
            st_dk(tok(SLOT_DK, batch, t, h, x), dk);
            st_da(tok(SLOT_DA, batch, t, h, x), da);
            st_db(tok(SLOT_DB, batch, t, h, x), db);
            barrier();
        }
        // the next segment's replay overwrites rep: every read above is done (barrier)
    }

    // 3.
    if (present(SLOT_DSIN)) {
        WKV_FOR_N(j) st_dsin(sti(SLOT_DSIN, s, h, x, j), DR_(j)); WKV_END
    }
}
