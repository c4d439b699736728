/* The attention kernels' launches (cuda_attention and cuda_attention_backward in
 * cuda_backend.cpp; the CPU emulation test, tests/emu, runs the kernels through the same plan):
 * one launch per at most kMaxSeqsPerLaunch sequences (their offsets ride in the parameters),
 * as many as keep a launch's tiles * heads blocks a 31-bit grid. Host code only. */
#ifndef WKV_BACKENDS_CUDA_ATTENTION_PLAN_H
#define WKV_BACKENDS_CUDA_ATTENTION_PLAN_H

#include <cstdint>
#include <cstring>

#include "backend.h"
#include "cuda_internal.h"

namespace wkv_cuda {

/* Tiles of `unit` query rows (by_keys false) or keys (true) of sequence s. */
inline int64_t attn_tiles(const wkv_attention_problem* p, int64_t s, int64_t unit, bool by_keys) {
    int64_t b, q0, q1, k0, k1;
    wkv_attention_sequence(p, s, &b, &q0, &q1, &k0, &k1);
    return by_keys ? (k1 - k0 + unit - 1) / unit : (q1 - q0 + unit - 1) / unit;
}

/* The most tiles of one sequence; 0 when there is nothing to do. */
inline int64_t attn_max_tiles(const wkv_attention_problem* p, int64_t unit, bool by_keys) {
    int64_t m = 0;
    for (int64_t s = 0; s < p->num_seqs; ++s) {
        const int64_t t = attn_tiles(p, s, unit, by_keys);
        m = t > m ? t : m;
    }
    return m;
}

inline AttnShape attn_shape(const wkv_attention_problem* p) {
    AttnShape sh;
    std::memset(&sh, 0, sizeof sh);
    sh.Tq = p->Tq, sh.Tk = p->Tk, sh.Hq = p->Hq, sh.Hkv = p->Hkv;
    sh.D = (int32_t)p->D;
    sh.causal = p->causal ? 1 : 0;
    sh.scale = p->scale;
    return sh;
}

/* AttnShape::kv_vec16 (AttnBwdParams::qd_vec16) for two views placed at a, b: both 16-bit,
 * contiguous along D, 16-byte aligned rows. */
inline int32_t attn_rows_vec16(const wkv_attention_problem* p, const DevView& a, const DevView& b) {
    for (const DevView* x : {&a, &b}) {
        if (x->elem == 0 || x->s[3] != 1 || reinterpret_cast<uintptr_t>(x->data) % 16) return 0;
        for (int axis = 0; axis < 3; ++axis)
            if (x->s[axis] % 8) return 0;
    }
    return p->D % 8 == 0 ? 1 : 0;
}

/* Calls launch(seq, blocks) for each launch of p's sequences cut in tiles of `unit` rows or
 * keys, `heads` blocks per tile (blocks = the launch's tiles * heads); max_tiles is
 * attn_max_tiles(p, unit, by_keys), which the caller has already checked against the grid.
 * Returns 0, the first nonzero value a launch returned, or -1 when one sequence's tiles *
 * heads exceed a launch's grid (nothing launched). */
template <class Launch>
int attn_plan_launches(const wkv_attention_problem* p, int64_t unit, bool by_keys, int64_t heads, int64_t max_tiles,
                       Launch&& launch) {
    if (max_tiles == 0 || heads == 0) return 0;
    if (max_tiles * heads > 0x7fffffff) return -1;
    int64_t per = 0x7fffffff / (max_tiles * heads);
    per = per < (int64_t)kMaxSeqsPerLaunch ? per : (int64_t)kMaxSeqsPerLaunch;
    AttnSeqs seq;
    std::memset(&seq, 0, sizeof seq);
    seq.packed = p->q_offsets ? 1 : 0;
    seq.tiles_per_seq = by_keys ? (p->Tk + unit - 1) / unit : (p->Tq + unit - 1) / unit;
    for (int64_t first = 0; first < p->num_seqs; first += per) {
        const int64_t count = p->num_seqs - first < per ? p->num_seqs - first : per;
        seq.first = first;
        seq.count = (int32_t)count;
        int64_t tiles = 0;
        for (int64_t x = 0; x < count; ++x) {
            int64_t b, q0, q1, k0, k1;
            wkv_attention_sequence(p, first + x, &b, &q0, &q1, &k0, &k1);
            seq.q_off[x] = q0, seq.k_off[x] = k0, seq.tiles_before[x] = tiles;
            seq.q_off[x + 1] = q1, seq.k_off[x + 1] = k1;
            tiles += attn_tiles(p, first + x, unit, by_keys);
        }
        seq.tiles_before[count] = tiles;
        if (tiles == 0) continue;
        const int e = launch(seq, tiles * heads);
        if (e != 0) return e;
    }
    return 0;
}

} // namespace wkv_cuda

#endif
