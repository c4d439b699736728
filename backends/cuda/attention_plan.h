/* The attention forward's launches (cuda_attention in cuda_backend.cpp; the CPU emulation test,
 * tests/emu, runs the kernel through the same plan): the launch-independent parameters, then
 * one launch per at most kMaxSeqsPerLaunch sequences (their offsets ride in the parameters), as
 * many as keep a launch's tiles * Hq blocks a 31-bit grid. Host code only. */
#ifndef WKV_BACKENDS_CUDA_ATTENTION_PLAN_H
#define WKV_BACKENDS_CUDA_ATTENTION_PLAN_H

#include <cstring>

#include "backend.h"
#include "cuda_internal.h"

namespace wkv_cuda {

/* Query tiles of sequence s. */
inline int64_t attn_tiles(const wkv_attention_problem* p, int64_t s, int64_t rows) {
    int64_t b, q0, q1, k0, k1;
    wkv_attention_sequence(p, s, &b, &q0, &q1, &k0, &k1);
    return (q1 - q0 + rows - 1) / rows;
}

/* Calls launch(prm, blocks) for each launch of p, whose views q, k, v, o, lse are placed at
 * `views` (device addresses); `rows` = query rows per tile. Returns 0, the first nonzero value
 * a launch returned, or -1 when one sequence's tiles * Hq exceed a launch's grid (nothing
 * launched). */
template <class Launch>
int attn_plan_launches(const wkv_attention_problem* p, const DevView views[5], int64_t rows, Launch&& launch) {
    int64_t max_tiles = 0;
    for (int64_t s = 0; s < p->num_seqs; ++s) {
        const int64_t t = attn_tiles(p, s, rows);
        max_tiles = t > max_tiles ? t : max_tiles;
    }
    if (max_tiles == 0 || p->Hq == 0) return 0; /* no query rows */
    if (max_tiles * p->Hq > 0x7fffffff) return -1;
    int64_t per = 0x7fffffff / (max_tiles * p->Hq);
    per = per < (int64_t)kMaxSeqsPerLaunch ? per : (int64_t)kMaxSeqsPerLaunch;
    AttnFwdParams prm;
    std::memset(&prm, 0, sizeof prm);
    prm.q = views[0], prm.k = views[1], prm.v = views[2], prm.o = views[3], prm.lse = views[4];
    prm.Tq = p->Tq, prm.Tk = p->Tk, prm.Hq = p->Hq, prm.Hkv = p->Hkv;
    prm.D = (int32_t)p->D;
    prm.causal = p->causal ? 1 : 0;
    prm.scale = p->scale;
    prm.packed = p->q_offsets ? 1 : 0;
    prm.tiles_per_seq = (p->Tq + rows - 1) / rows;
    for (int64_t first = 0; first < p->num_seqs; first += per) {
        const int64_t count = p->num_seqs - first < per ? p->num_seqs - first : per;
        prm.first = first;
        prm.count = (int32_t)count;
        int64_t tiles = 0;
        for (int64_t x = 0; x < count; ++x) {
            int64_t b, q0, q1, k0, k1;
            wkv_attention_sequence(p, first + x, &b, &q0, &q1, &k0, &k1);
            prm.q_off[x] = q0, prm.k_off[x] = k0, prm.tiles_before[x] = tiles;
            prm.q_off[x + 1] = q1, prm.k_off[x + 1] = k1;
            tiles += (q1 - q0 + rows - 1) / rows;
        }
        prm.tiles_before[count] = tiles;
        if (tiles == 0) continue;
        const int e = launch(prm, tiles * p->Hq);
        if (e != 0) return e;
    }
    return 0;
}

} // namespace wkv_cuda

#endif
