#version 450
// Softmax attention backward (include/wkv/wkv.h, wkv_attention_backward) in the flash form: P is
// recomputed from the forward's lse, never stored. The host side is backends/vulkan/vk_attention.c,
// the CPU sibling backends/cpu/attention_backward.cpp (same formulas, same item split).
//
// Two kernels from this file, neither of which accumulates into memory another workgroup writes
// (no atomics on gradients; results independent of scheduling):
//   attn_bwd_q  (default)       item = (query tile of 64 rows, query head): one invocation per
//                               row holds q (pre-scaled), dout and dq; the keys its rows see go
//                               through shared memory BK at a time; per key: s = q.k,
//                               p = exp(s - lse), dp = dout.v, ds = p (dp - delta), dq += ds k.
//   attn_bwd_kv (WKV_ATTN_KV)   item = (key tile of 64 keys, kv head): one invocation per key
//                               holds k, v, dk, dv; the query rows (of each query head of the
//                               kv head) that see the tile go through shared memory BK at a
//                               time, with their lse and delta; per row: the same p and ds,
//                               dv += p dout, dk += ds q.
// delta = dout . o - dlse per row is computed where a row is loaded (D products; the key or row
// loop it feeds is BK * D). Rows whose lse is -inf saw no key and add nothing; keys no row sees
// get zeros. q is scaled when loaded, so dk needs no scale and dq one at the end. float32
// arithmetic for every dtype. One invocation per row / key (no subgroup operations: any device).
#extension GL_GOOGLE_include_directive : require

// The parameter block (vk_attention.c, gpu_attn_header): sizes, the resolved scale, the ten
// tensors, then per sequence two ivec4: (q0, q1, k0, k1), (batch, query tiles before it, key
// tiles before it, 0).
#define WKV_PARAMS_BLOCK                                                  \
    layout(std430, set = 0, binding = 0) readonly buffer Params {         \
        int B, Tq, Tk, Hq, Hkv, D_, causal, num_seqs;                     \
        float scale;                                                      \
        int pad0_, pad1_, pad2_;                                          \
        TensorDesc td[10];                                                \
        ivec4 seqs[];                                                     \
    } P;
#include "wkv_common.glsl"

layout(constant_id = 0) const int D = 64;  // head dim (vkw_spec.n)
layout(constant_id = 1) const int BK = 16; // rows or keys per shared-memory block (vkw_spec.tc)
layout(local_size_x = 64) in;
const int TILE = 64; // rows (attn_bwd_q) or keys (attn_bwd_kv) per workgroup

#define A_Q 0
#define A_K 1
#define A_V 2
#define A_O 3
#define A_LSE 4
#define A_DOUT 5
#define A_DLSE 6
#define A_DQ 7
#define A_DK 8
#define A_DV 9
WKV_INPUT(q, A_Q)
WKV_INPUT(k, A_K)
WKV_INPUT(v, A_V)
WKV_INPUT(o, A_O)
WKV_INPUT(lse, A_LSE)
WKV_INPUT(dout, A_DOUT)
WKV_INPUT(dlse, A_DLSE)
#ifdef WKV_ATTN_KV
WKV_OUTPUT(dk, A_DK)
WKV_OUTPUT(dv, A_DV)
#else
WKV_OUTPUT(dq, A_DQ)
#endif

#define NEG_INF uintBitsToFloat(0xff800000u)

// blocks of BK rows (kv kernel: q scaled, dout) or keys (q kernel: k, v), float32
shared float sa[BK * D];
shared float sb[BK * D];
shared float srow[2 * BK]; // kv kernel: lse, delta of the block's rows

// The sequence s of an item's tile: the last s whose first tile (.y for query tiles, .z for key
// tiles) is <= tile.
int sequence_of(int tile, bool keys) {
    int s = 0, hi = P.num_seqs - 1;
    while (s < hi) {
        const int mid = (s + hi + 1) >> 1;
        const int first = keys ? P.seqs[2 * mid + 1].z : P.seqs[2 * mid + 1].y;
        if (first <= tile) s = mid;
        else hi = mid - 1;
    }
    return s;
}

// delta of row t of head h: dout . o - dlse.
float row_delta(int batch, int t, int h) {
    float s = 0.0;
    WKV_FOR_COUNT(d, D)
        s += ld_dout(tok(A_DOUT, batch, t, h, d)) * ld_o(tok(A_O, batch, t, h, d));
    WKV_END
    if (present(A_DLSE)) s -= ld_dlse(tok(A_DLSE, batch, t, h, 0));
    return s;
}

void main() {
    const int item = pc.item_base + int(gl_WorkGroupID.x);
    const int lid = int(gl_LocalInvocationID.x);
#ifdef WKV_ATTN_KV
    const int g = item % P.Hkv, tile = item / P.Hkv;
    const int s = sequence_of(tile, true);
#else
    const int h = item % P.Hq, tile = item / P.Hq;
    const int s = sequence_of(tile, false);
#endif
    const ivec4 sq = P.seqs[2 * s];
    const int batch = P.seqs[2 * s + 1].x;
    const int q0 = sq.x, q1 = sq.y, k0 = sq.z, k1 = sq.w;
    const int shift = (k1 - k0) - (q1 - q0); // causal: row t sees keys up to k0 + (t - q0) + shift
#ifdef WKV_ATTN_KV
    // ---- dk, dv of key j: every row of the kv head's query heads that sees it
    const int j0 = k0 + (tile - P.seqs[2 * s + 1].z) * TILE, j = j0 + lid;
    const bool live = j < k1;
    float kv[D], vv[D], dk[D], dv[D];
    WKV_FOR_COUNT(d, D)
        kv[d] = live ? ld_k(tok(A_K, batch, j, g, d)) : 0.0;
        vv[d] = live ? ld_v(tok(A_V, batch, j, g, d)) : 0.0;
        dk[d] = 0.0;
        dv[d] = 0.0;
    WKV_END
    // the first row that sees key j0 (the tile's first key)
    const int t_first = P.causal != 0 ? max(q0, q0 + (j0 - k0) - shift) : q0;
    const int group = P.Hq / P.Hkv;
    for (int h = g * group; h < (g + 1) * group; ++h)
        for (int r0 = t_first; r0 < q1; r0 += BK) {
            barrier(); // every key is done with the previous block
            for (int e = lid; e < BK * D; e += TILE) {
                const int rr = e / D, d = e - rr * D, t = r0 + rr;
                sa[e] = t < q1 ? ld_q(tok(A_Q, batch, t, h, d)) * P.scale : 0.0;
                sb[e] = t < q1 ? ld_dout(tok(A_DOUT, batch, t, h, d)) : 0.0;
            }
            if (lid < BK) {
                const int t = r0 + lid;
                srow[lid] = t < q1 ? ld_lse(tok(A_LSE, batch, t, h, 0)) : NEG_INF;
                srow[BK + lid] = t < q1 ? row_delta(batch, t, h) : 0.0;
            }
            barrier();
            if (!live) continue;
            for (int rr = 0; rr < BK; ++rr) {
                const int t = r0 + rr;
                const float l = srow[rr];
                if (l == NEG_INF || (P.causal != 0 && j > k0 + (t - q0) + shift)) continue;
                float sc = 0.0, dp = 0.0;
                WKV_FOR_COUNT(d, D)
                    sc += sa[rr * D + d] * kv[d];
                    dp += sb[rr * D + d] * vv[d];
                WKV_END
                const float p = exp(sc - l);
                const float ds = p * (dp - srow[BK + rr]);
                WKV_FOR_COUNT(d, D)
                    dv[d] += p * sb[rr * D + d];
                    dk[d] += ds * sa[rr * D + d];
                WKV_END
            }
        }
    if (!live) return; // after the last barrier
    WKV_FOR_COUNT(d, D)
        st_dk(tok(A_DK, batch, j, g, d), dk[d]);
        st_dv(tok(A_DV, batch, j, g, d), dv[d]);
    WKV_END
#else
    // ---- dq of row t: every key it sees
    const int r0 = q0 + (tile - P.seqs[2 * s + 1].y) * TILE, t = r0 + lid;
    const bool live = t < q1;
    const int g = h / (P.Hq / P.Hkv);
    const float l = live ? ld_lse(tok(A_LSE, batch, t, h, 0)) : NEG_INF;
    const float delta = live ? row_delta(batch, t, h) : 0.0;
    const int last = P.causal != 0 ? min(k1 - 1, k0 + (t - q0) + shift) : k1 - 1;
    const int tile_last = min(q1, r0 + TILE) - 1;
    const int kend = (P.causal != 0 ? min(k1 - 1, k0 + (tile_last - q0) + shift) : k1 - 1) + 1;
    float qv[D], gv[D], dq[D];
    WKV_FOR_COUNT(d, D)
        qv[d] = live ? ld_q(tok(A_Q, batch, t, h, d)) * P.scale : 0.0;
        gv[d] = live ? ld_dout(tok(A_DOUT, batch, t, h, d)) : 0.0;
        dq[d] = 0.0;
    WKV_END
    for (int jb = k0; jb < kend; jb += BK) {
        barrier(); // every row is done with the previous block
        for (int e = lid; e < BK * D; e += TILE) {
            const int jj = e / D, d = e - jj * D, jk = jb + jj;
            sa[e] = jk < kend ? ld_k(tok(A_K, batch, jk, g, d)) : 0.0;
            sb[e] = jk < kend ? ld_v(tok(A_V, batch, jk, g, d)) : 0.0;
        }
        barrier();
        if (l == NEG_INF) continue;
        for (int jj = 0; jj < BK; ++jj) {
            if (jb + jj > last) break;
            float sc = 0.0, dp = 0.0;
            WKV_FOR_COUNT(d, D)
                sc += qv[d] * sa[jj * D + d];
                dp += gv[d] * sb[jj * D + d];
            WKV_END
            const float ds = exp(sc - l) * (dp - delta);
            WKV_FOR_COUNT(d, D) dq[d] += ds * sa[jj * D + d]; WKV_END
        }
    }
    if (!live) return; // after the last barrier
    WKV_FOR_COUNT(d, D) st_dq(tok(A_DQ, batch, t, h, d), dq[d] * P.scale); WKV_END
#endif
}
