#version 450
// Softmax attention forward (include/wkv/wkv.h, attention) in the online-softmax form; the host
// side is backends/vulkan/vk_attention.c, the CPU sibling backends/cpu/attention.cpp.
//
// One workgroup of 64 invocations per item (query tile of BQ rows, query head), item = tile * Hq
// + head, tiles counted over every sequence. LANES invocations share a query row: lane l holds
// components d = i * LANES + l of the row's q (pre-scaled) and of its accumulator, and the
// partial dot products are summed over the row's lanes by subgroup shuffles (LANES is 1 on a
// device without them). The keys the tile sees go through shared memory in blocks of BK keys
// (k and v as float32, loaded by the whole workgroup); per block each row takes its scores,
// the running max m, rescales its sum l and accumulator by exp(m_old - m), and adds p_j v_j.
// Causal rows see keys up to row + (Tk - Tq) of their sequence (bottom-right aligned); a row
// that sees no key ends with l = 0: o = 0 and lse = -inf. float32 arithmetic for every dtype.
#extension GL_GOOGLE_include_directive : require
#ifndef WKV_NO_SUBGROUP
#extension GL_KHR_shader_subgroup_shuffle : require
#endif

// The parameter block (vk_attention.c, gpu_attn_header): sizes, the resolved scale, the five
// tensors (q, k, v, o, lse), then per sequence two ivec4: (q0, q1, k0, k1), (batch, tiles
// before it, 0, 0).
#define WKV_PARAMS_BLOCK                                                  \
    layout(std430, set = 0, binding = 0) readonly buffer Params {         \
        int B, Tq, Tk, Hq, Hkv, D_, causal, num_seqs;                     \
        float scale;                                                      \
        int pad0_, pad1_, pad2_;                                          \
        TensorDesc td[5];                                                 \
        ivec4 seqs[];                                                     \
    } P;
#include "wkv_common.glsl"

layout(constant_id = 0) const int D = 64;    // head dim (vkw_spec.n)
layout(constant_id = 1) const int BK = 16;   // keys per shared-memory block (vkw_spec.tc)
layout(constant_id = 2) const int LANES = 4; // invocations per query row (vkw_spec.lanes)
layout(local_size_x = 64) in;
const int BQ = 64 / LANES;               // query rows per workgroup
const int DL = (D + LANES - 1) / LANES;  // components of a row per invocation

#define A_Q 0
#define A_K 1
#define A_V 2
#define A_O 3
#define A_LSE 4
WKV_INPUT(q, A_Q)
WKV_INPUT(k, A_K)
WKV_INPUT(v, A_V)
WKV_OUTPUT(o, A_O)
WKV_OUTPUT(lse, A_LSE)

shared float ks[BK * D];
shared float vs[BK * D];

#define NEG_INF uintBitsToFloat(0xff800000u)

// The row's partial dot product summed over its LANES invocations (all of them take part).
float row_sum(float x) {
#ifndef WKV_NO_SUBGROUP
    if (LANES >= 2) x += subgroupShuffleXor(x, 1);
    if (LANES >= 4) x += subgroupShuffleXor(x, 2);
#endif
    return x;
}

void main() {
    const int item = pc.item_base + int(gl_WorkGroupID.x);
    const int h = item % P.Hq, tile = item / P.Hq;
    // the sequence of the tile: the last s whose first tile is <= tile
    int s = 0, hi = P.num_seqs - 1;
    while (s < hi) {
        const int mid = (s + hi + 1) >> 1;
        if (P.seqs[2 * mid + 1].y <= tile) s = mid;
        else hi = mid - 1;
    }
    const ivec4 sq = P.seqs[2 * s];
    const int batch = P.seqs[2 * s + 1].x;
    const int q0 = sq.x, q1 = sq.y, k0 = sq.z, k1 = sq.w;
    const int r0 = q0 + (tile - P.seqs[2 * s + 1].y) * BQ;
    const int lid = int(gl_LocalInvocationID.x), lane = lid % LANES, row = r0 + lid / LANES;
    const bool live = row < q1;
    const int g = h / (P.Hq / P.Hkv);
    const int shift = (k1 - k0) - (q1 - q0);
    const int last = P.causal != 0 ? min(k1 - 1, k0 + (row - q0) + shift) : k1 - 1;
    const int tile_last = min(q1, r0 + BQ) - 1;
    const int kend = (P.causal != 0 ? min(k1 - 1, k0 + (tile_last - q0) + shift) : k1 - 1) + 1;

    float qv[DL], acc[DL];
    WKV_FOR_COUNT(i, DL)
        const int d = i * LANES + lane;
        qv[i] = live && d < D ? ld_q(tok(A_Q, batch, row, h, d)) * P.scale : 0.0;
        acc[i] = 0.0;
    WKV_END
    float m = NEG_INF, l = 0.0;
    for (int j0 = k0; j0 < kend; j0 += BK) {
        barrier(); // every row is done with the previous block
        for (int e = lid; e < BK * D; e += 64) {
            const int jj = e / D, d = e - jj * D, j = j0 + jj;
            ks[e] = j < kend ? ld_k(tok(A_K, batch, j, g, d)) : 0.0;
            vs[e] = j < kend ? ld_v(tok(A_V, batch, j, g, d)) : 0.0;
        }
        barrier();
        float sc[BK];
        float bm = NEG_INF;
        [[unroll]] for (int jj = 0; jj < BK; ++jj) {
            float part = 0.0;
            WKV_FOR_COUNT(i, DL)
                const int d = i * LANES + lane;
                if (d < D) part += qv[i] * ks[jj * D + d];
            WKV_END
            part = row_sum(part); // uniform control flow: every lane of the row is here
            sc[jj] = j0 + jj <= last ? part : NEG_INF;
            bm = max(bm, sc[jj]);
        }
        if (bm != NEG_INF) {
            const float mn = max(m, bm);
            const float corr = m == NEG_INF ? 0.0 : exp(m - mn);
            l *= corr;
            WKV_FOR_COUNT(i, DL) acc[i] *= corr; WKV_END
            [[unroll]] for (int jj = 0; jj < BK; ++jj) {
                const float p = sc[jj] == NEG_INF ? 0.0 : exp(sc[jj] - mn);
                l += p;
                WKV_FOR_COUNT(i, DL)
                    const int d = i * LANES + lane;
                    if (d < D) acc[i] += p * vs[jj * D + d];
                WKV_END
            }
            m = mn;
        }
    }
    if (!live) return; // after the last barrier
    const float inv = l > 0.0 ? 1.0 / l : 0.0;
    WKV_FOR_COUNT(i, DL)
        const int d = i * LANES + lane;
        if (d < D) st_o(tok(A_O, batch, row, h, d), acc[i] * inv);
    WKV_END
    if (lane == 0 && present(A_LSE)) st_lse(tok(A_LSE, batch, row, h, 0), l > 0.0 ? m + log(l) : NEG_INF);
}
