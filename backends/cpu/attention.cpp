/* Softmax attention on the CPU (wkv.h, attention): online softmax over tiles, never the Tq x Tk
 * matrix.
 *
 * An item is (sequence, query head, tile of Br query rows). It loads its rows once, then walks
 * the keys the tile can see in blocks of Bc: the block's keys transposed (Kt[d][j]) so that the
 * scores of a row are a sum over d of q[d] * Kt[d][:] (the inner loop over j vectorises without
 * reassociating a reduction), then per row the running max m, the rescale of the row's sum l and
 * accumulator by exp(m_old - m_new), and acc += p_j v_j (inner loop over d). Causal rows mask the
 * keys past row + (Tk - Tq) of their sequence; a block past every row's last key is not visited.
 * A row that sees no key ends with l = 0: o = 0 and lse = -inf.
 *
 * Items go to parallel_for in chunks (cpu_internal.h); an item's result depends on nothing but
 * the item, so results do not depend on the thread count. float32 arithmetic for every dtype. */
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "attention.h"
#include "tensor_access.h"

namespace wkv_cpu {
namespace {

struct AttnConfig {
    const char* name;
    int block_q, block_kv;
    bool is_default;
};

/* The tile shapes this backend has (any D up to kAttnMaxHeadDim, any dtype); the first is the
 * default. Measured with the vector block step (benchmarks/attention_bench.py, Zen 4, 2 threads,
 * f32, H = 32; BENCHMARKS.md has the latest run, DESIGN.md the ranges): q128.kv64 the fastest or
 * within noise of it on the prefill rows, q256.kv128 up to 20% behind (its 4 x 8 score vectors
 * spill), q16 and q4 10-150% slower: a Bc = 64 key block (16 KiB of Kt + 16 KiB of V at D = 64)
 * stays in L1 while a tile's row groups walk it; larger query tiles amortise each block's loads
 * over more rows. At Tq = 1 every configuration does the same work. */
constexpr AttnConfig kConfigs[] = {
    {"cpu.tiled.q128.kv64", 128, 64, true},
    {"cpu.tiled.q256.kv128", 256, 128, false},
    {"cpu.tiled.q64.kv64", 64, 64, false},
    {"cpu.tiled.q16.kv64", 16, 64, false},
    {"cpu.tiled.q4.kv128", 4, 128, false},
};
constexpr int kNumConfigs = (int)(sizeof kConfigs / sizeof kConfigs[0]);


/* Floats of one chunk's scratch for a config at head dim D. */
int64_t scratch_floats(const AttnConfig& c, int64_t D) {
    const int64_t br = c.block_q, bc = c.block_kv, Dp = attn_padded_dim(D);
    return br * Dp /* q */ + Dp * bc /* Kt, or K as rows (few-row tiles) */ + bc * Dp /* V */ + 4 * bc /* p rows: a group of up to 4 (attention_simd.inl) */ + br * Dp /* acc */ +
           2 * br /* m, l */ + br /* seen (int64 as 2 floats: below) */ * 2 + Dp /* a row in transit */;
}

struct AttnJob {
    const wkv_attention_problem* p;
    const AttnConfig* cfg;
    AttnBlockFn block; /* the path's vector step, or NULL */
    AttnRowsFn rows;   /* the path's vector step for tiles of few rows, or NULL */
    /* bf16 q and k on a path with bf16 dot products: the keys packed as bf16 pairs (ktp_all,
     * [B][Hkv][Dh][kt_len], in kt_all's memory), the tiles' q as pairs too (attention.h) */
    AttnBlockBf16Fn block_bf16;
    int64_t heads;     /* query heads per item: 1, or Hq / Hkv for decode-shaped calls (run_item) */
    const int64_t* tiles_before; /* [num_seqs + 1]: query tiles of the sequences before s */
    int64_t items, chunks;
    float* scratch; /* chunk c at scratch + c * chunk_floats */
    int64_t chunk_floats;
    /* Keys transposed and values as float32, packed once per call (NULL: each tile packs its
     * own blocks): kt_all [B][Hkv][D][kt_len], v_all [B][Hkv][Tk][Dp]. */
    float* kt_all;
    float* v_all;
    uint32_t* ktp_all; /* bf16 pairs instead of kt_all, when block_bf16 (NULL otherwise) */
    int64_t kt_len; /* Tk + block_kv: a block's readable columns never leave the row */
};

/* The scalar block step (AttnBlockFn's contract, attention.h): scores by d-outer loops over the
 * transposed keys, the online-softmax update, acc += p_j v_j. */
bool scalar_block(const float* q, int64_t rows, int64_t Dp, int64_t D, const float* kt, int64_t kt_stride,
                  const float* vb, int64_t nb, int64_t bc, const int64_t* seen, float* p_rows, float* acc, float* m,
                  float* l) {
    (void)bc;
    const float neg_inf = -std::numeric_limits<float>::infinity();
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t n_seen = std::min(nb, seen[r]);
        if (n_seen <= 0) continue;
        float* srow = p_rows;
        const float* qr = q + r * Dp;
        for (int64_t j = 0; j < n_seen; ++j) srow[j] = 0.0f;
        for (int64_t d = 0; d < D; ++d) {
            const float qd = qr[d];
            const float* kd = kt + d * kt_stride;
            for (int64_t j = 0; j < n_seen; ++j) srow[j] += qd * kd[j];
        }
        float mx = m[r];
        for (int64_t j = 0; j < n_seen; ++j) mx = std::max(mx, srow[j]);
        if (mx == neg_inf) continue; /* only -inf scores so far: m stays -inf, nothing NaN */
        const float corr = m[r] == neg_inf ? 0.0f : std::exp(m[r] - mx);
        float sum = 0.0f;
        for (int64_t j = 0; j < n_seen; ++j) {
            srow[j] = std::exp(srow[j] - mx);
            sum += srow[j];
        }
        l[r] = l[r] * corr + sum;
        m[r] = mx;
        float* ar = acc + r * Dp;
        if (corr != 1.0f)
            for (int64_t d = 0; d < D; ++d) ar[d] *= corr;
        for (int64_t j = 0; j < n_seen; ++j) {
            const float pj = srow[j];
            const float* vj = vb + j * Dp;
            for (int64_t d = 0; d < D; ++d) ar[d] += pj * vj[d];
        }
    }
    return true;
}

/* The scalar step with the keys as rows (AttnRowsFn's contract, attention.h). */
bool scalar_rows(const float* q, int64_t rows, int64_t Dp, int64_t D, const float* kb, int64_t k_stride,
                 const float* vb, int64_t v_stride, int64_t nb, const int64_t* seen, float* p_rows, float* acc,
                 float* m, float* l) {
    const float neg_inf = -std::numeric_limits<float>::infinity();
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t n_seen = std::min(nb, seen[r]);
        if (n_seen <= 0) continue;
        const float* qr = q + r * Dp;
        float mx = m[r];
        for (int64_t j = 0; j < n_seen; ++j) {
            float s = 0.0f;
            for (int64_t d = 0; d < D; ++d) s += qr[d] * kb[j * k_stride + d];
            p_rows[j] = s;
            mx = std::max(mx, s);
        }
        if (mx == neg_inf) continue;
        const float corr = m[r] == neg_inf ? 0.0f : std::exp(m[r] - mx);
        float sum = 0.0f;
        for (int64_t j = 0; j < n_seen; ++j) sum += p_rows[j] = std::exp(p_rows[j] - mx);
        l[r] = l[r] * corr + sum;
        m[r] = mx;
        float* ar = acc + r * Dp;
        for (int64_t d = 0; d < D; ++d) ar[d] *= corr;
        for (int64_t j = 0; j < n_seen; ++j)
            for (int64_t d = 0; d < D; ++d) ar[d] += p_rows[j] * vb[j * v_stride + d];
    }
    return true;
}

/* A float32 tensor, 4-byte aligned (the API allows any address), whose D elements are
 * contiguous: its key / value rows can be read in place as floats. */
bool rows_in_place(const wkv_view& v, int64_t D) {
    return v.elem == WKV_ELEM_F32 && (v.stride[3] == 1 || D == 1) && reinterpret_cast<uintptr_t>(v.data) % 4 == 0;
}

/* The bf16 bits of a float that came from a bf16 (load_row converts exactly): its top half. */
inline uint32_t bf16_bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u >> 16;
}

/* Tiles of at most this many rows take the keys as rows (AttnRowsFn). */
constexpr int64_t kRowsTile = 2;

void run_item(const AttnJob& job, int64_t item, float* mem) {
    const wkv_attention_problem& p = *job.p;
    const int64_t D = p.D, Dp = attn_padded_dim(D), Hq = p.Hq, br = job.cfg->block_q, bc = job.cfg->block_kv;
    /* item = (tile index over all sequences) * Hq + head; with grouped heads (job.heads > 1: a
     * decode-shaped call) item = tile * Hkv + kv head, and the item's rows are every query row
     * of the tile in each of the kv head's heads (head h0 + i / tile_rows, row i % tile_rows) */
    const int64_t heads = job.heads;
    const int64_t h0 = heads > 1 ? (item % p.Hkv) * heads : item % Hq, tile = item / (heads > 1 ? p.Hkv : Hq);
    const int64_t s = std::upper_bound(job.tiles_before, job.tiles_before + p.num_seqs + 1, tile) - job.tiles_before - 1;
    int64_t b, q0, q1, k0, k1;
    wkv_attention_sequence(&p, s, &b, &q0, &q1, &k0, &k1);
    const int64_t r0 = q0 + (tile - job.tiles_before[s]) * br, r1 = std::min(q1, r0 + br), tile_rows = r1 - r0;
    const int64_t rows = tile_rows * heads;
    const int64_t g = h0 / (Hq / p.Hkv);
    /* the last key row r sees (causal: bottom-right aligned within its sequence) */
    const int64_t shift = (k1 - k0) - (q1 - q0);
    auto last_key = [&](int64_t r) { return p.causal ? std::min(k1 - 1, k0 + (r - q0) + shift) : k1 - 1; };
    auto row_of = [&](int64_t i) { return r0 + i % tile_rows; }; /* query row of item row i */
    auto head_of = [&](int64_t i) { return h0 + i / tile_rows; };
    const int64_t kend = last_key(r1 - 1) + 1; /* keys [k0, kend) reach some row of the tile */

    float* q = mem;
    float* kt = q + br * Dp;
    float* vb = kt + Dp * bc;
    float* prow = vb + bc * Dp;
    float* acc = prow + 4 * bc;
    float* m = acc + br * Dp;
    float* l = m + br;
    int64_t* seen = reinterpret_cast<int64_t*>(l + br); /* 2 floats each, 8-byte aligned: see below */
    float* row = reinterpret_cast<float*>(seen + br);
    const bool as_rows = tile_rows <= kRowsTile; /* the rows step reads D floats of a row, no padding */
    const bool bf16_dot = job.ktp_all && !as_rows;
    const int64_t Dh = (D + 1) / 2;
    uint32_t* qp = reinterpret_cast<uint32_t*>(q); /* bf16_dot: rows of Dh pairs in q's memory */
    std::memset(q, 0, sizeof(float) * (size_t)(rows * Dp));
    for (int64_t r = 0; r < rows; ++r) {
        load_row(p.q, view_offset(p.q, b, row_of(r), head_of(r)), D, row);
        if (bf16_dot) /* float from bf16 and back: the same bits; not scaled (the step scales) */
            for (int64_t d = 0; d < Dh; ++d)
                qp[r * Dh + d] = (uint32_t)bf16_bits(row[2 * d]) | ((uint32_t)(2 * d + 1 < D ? bf16_bits(row[2 * d + 1]) : 0) << 16);
        else
            for (int64_t d = 0; d < D; ++d) q[r * Dp + d] = row[d] * p.scale;
        m[r] = -std::numeric_limits<float>::infinity();
        l[r] = 0.0f;
    }
    std::memset(acc, 0, sizeof(float) * (size_t)(rows * Dp));
    if (Dp > D && !as_rows)
        for (int64_t j = 0; j < bc; ++j) std::memset(vb + j * Dp + D, 0, sizeof(float) * (size_t)(Dp - D));

    const bool k_in_place = as_rows && rows_in_place(p.k, D), v_in_place = as_rows && rows_in_place(p.v, D);
    for (int64_t j0 = k0; j0 < kend; j0 += bc) {
        const int64_t nb = std::min(bc, kend - j0);
        if (as_rows) { /* a decode step: no transposition; rows read in place where they can be */
            const float* kb = kt;
            const float* vr = vb;
            int64_t ks = Dp, vs = Dp;
            if (k_in_place) kb = reinterpret_cast<const float*>(p.k.data) + view_offset(p.k, b, j0, g), ks = p.k.stride[1];
            else
                for (int64_t j = 0; j < nb; ++j) load_row(p.k, view_offset(p.k, b, j0 + j, g), D, kt + j * Dp);
            if (v_in_place) vr = reinterpret_cast<const float*>(p.v.data) + view_offset(p.v, b, j0, g), vs = p.v.stride[1];
            else
                for (int64_t j = 0; j < nb; ++j) load_row(p.v, view_offset(p.v, b, j0 + j, g), D, vb + j * Dp);
            for (int64_t r = 0; r < rows; ++r) seen[r] = std::min(nb, last_key(row_of(r)) - j0 + 1);
            if (!job.rows || !job.rows(q, rows, Dp, D, kb, ks, vr, vs, nb, seen, prow, acc, m, l))
                scalar_rows(q, rows, Dp, D, kb, ks, vr, vs, nb, seen, prow, acc, m, l);
            continue;
        }
        const float* kblk = kt;
        const float* vblk = vb;
        int64_t kstride = bc;
        if (job.kt_all) {
            kblk = job.kt_all + (b * p.Hkv + g) * D * job.kt_len + j0;
            vblk = job.v_all + ((b * p.Hkv + g) * p.Tk + j0) * Dp;
            kstride = job.kt_len;
        } else {
            for (int64_t j = 0; j < nb; ++j) {
                load_row(p.k, view_offset(p.k, b, j0 + j, g), D, row);
                for (int64_t d = 0; d < D; ++d) kt[d * bc + j] = row[d];
                load_row(p.v, view_offset(p.v, b, j0 + j, g), D, vb + j * Dp);
            }
        }
        for (int64_t r = 0; r < rows; ++r) seen[r] = std::min(nb, last_key(r0 + r) - j0 + 1);
        if (bf16_dot) { /* attention() checked the step takes this bc and Dp */
            job.block_bf16(qp, rows, Dh, Dp, job.ktp_all + (b * p.Hkv + g) * Dh * job.kt_len + j0, job.kt_len, vblk, nb,
                           bc, seen, p.scale, prow, acc, m, l);
            continue;
        }
        if (!job.block || !job.block(q, rows, Dp, D, kblk, kstride, vblk, nb, bc, seen, prow, acc, m, l))
            scalar_block(q, rows, Dp, D, kblk, kstride, vblk, nb, bc, seen, prow, acc, m, l);
    }
    const float neg_inf = -std::numeric_limits<float>::infinity();
    for (int64_t r = 0; r < rows; ++r) {
        float* ar = acc + r * Dp;
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        for (int64_t d = 0; d < D; ++d) ar[d] *= inv;
        store_row(p.o, view_offset(p.o, b, row_of(r), head_of(r)), D, ar);
        if (p.lse.data) {
            const float lse = l[r] > 0.0f ? m[r] + std::log(l[r]) : neg_inf;
            std::memcpy(p.lse.data + 4 * view_offset(p.lse, b, row_of(r), head_of(r)), &lse, 4);
        }
    }
}

/* The pack pass: items of 64 keys of one (batch, kv head); the tail columns of each kt row (past
 * Tk, up to kt_len) are zeroed by the item that holds the last keys. */
constexpr int64_t kPackKeys = 64;

void pack_chunk(void* data, int64_t begin, int64_t end) {
    const AttnJob& job = *static_cast<const AttnJob*>(data);
    const wkv_attention_problem& p = *job.p;
    const int64_t D = p.D, Dp = attn_padded_dim(D), per_head = (p.Tk + kPackKeys - 1) / kPackKeys;
    for (int64_t i = begin; i < end; ++i) {
        const int64_t bg = i / per_head, j0 = (i % per_head) * kPackKeys, j1 = std::min(p.Tk, j0 + kPackKeys);
        const int64_t b = bg / p.Hkv, g = bg % p.Hkv;
        const int64_t Dh = (D + 1) / 2;
        float* kt = job.kt_all + bg * D * job.kt_len;
        uint32_t* ktp = job.ktp_all ? job.ktp_all + bg * Dh * job.kt_len : nullptr;
        float* v = job.v_all + bg * p.Tk * Dp;
        float row[kAttnMaxHeadDim + 1];
        for (int64_t j = j0; j < j1; ++j) {
            load_row(p.k, view_offset(p.k, b, j, g), D, row);
            if (ktp) {
                row[D] = 0.0f; /* an odd D's last pair */
                for (int64_t d = 0; d < Dh; ++d)
                    ktp[d * job.kt_len + j] = (uint32_t)bf16_bits(row[2 * d]) | ((uint32_t)bf16_bits(row[2 * d + 1]) << 16);
            } else {
                for (int64_t d = 0; d < D; ++d) kt[d * job.kt_len + j] = row[d];
            }
            load_row(p.v, view_offset(p.v, b, j, g), D, v + j * Dp);
            for (int64_t d = D; d < Dp; ++d) v[j * Dp + d] = 0.0f;
        }
        if (j1 == p.Tk) {
            if (ktp)
                for (int64_t d = 0; d < Dh; ++d)
                    std::memset(ktp + d * job.kt_len + p.Tk, 0, sizeof(uint32_t) * (size_t)(job.kt_len - p.Tk));
            else
                for (int64_t d = 0; d < D; ++d)
                    std::memset(kt + d * job.kt_len + p.Tk, 0, sizeof(float) * (size_t)(job.kt_len - p.Tk));
        }
    }
}

void run_chunk(void* data, int64_t begin, int64_t end) {
    const AttnJob& job = *static_cast<const AttnJob*>(data);
    for (int64_t c = begin; c < end; ++c) {
        int64_t i0, i1;
        chunk_items(job.items, job.chunks, c, &i0, &i1);
        float* mem = job.scratch + c * job.chunk_floats;
        for (int64_t i = i0; i < i1; ++i) run_item(job, i, mem);
    }
}

} // namespace

int32_t attention_configs(wkv_attention_config* out, int32_t capacity) noexcept {
    for (int32_t i = 0; i < capacity && i < kNumConfigs; ++i) {
        const AttnConfig& c = kConfigs[i];
        wkv_attention_config& o = out[i];
        std::snprintf(o.name, sizeof o.name, "%s", c.name);
        o.max_head_dim = (int32_t)kAttnMaxHeadDim;
        o.block_q = c.block_q;
        o.block_kv = c.block_kv;
        o.shared_bytes = (uint64_t)scratch_floats(c, kAttnMaxHeadDim) * 4;
        o.fits = 1;
        o.is_default = c.is_default ? 1 : 0;
    }
    return kNumConfigs;
}

wkv_status attention(const BackendState& st, AttnBlockFn block, AttnRowsFn rows, AttnBlockBf16Fn block_bf16,
                     const wkv_attention_problem* p, wkv_message* msg) noexcept {
    const AttnConfig* cfg = &kConfigs[0]; /* a pinned one is listed: the core checked the name */
    if (p->config)
        for (const AttnConfig& c : kConfigs)
            if (std::strcmp(c.name, p->config) == 0) cfg = &c;
    if (p->D > kAttnMaxHeadDim) {
        set_message(msg, "attention head dim D = %lld: this backend takes D <= %lld", (long long)p->D,
                    (long long)kAttnMaxHeadDim);
        return WKV_ERROR_UNSUPPORTED;
    }
    /* tiles per sequence, then the items: (tile over all sequences) x query head */
    CheckedSize cs;
    const uint64_t prefix_bytes = cs.mul((uint64_t)p->num_seqs + 1, sizeof(int64_t));
    int64_t tiles = 0;
    for (int64_t s = 0; s < p->num_seqs; ++s) {
        int64_t b, q0, q1, k0, k1;
        wkv_attention_sequence(p, s, &b, &q0, &q1, &k0, &k1);
        tiles += (q1 - q0 + cfg->block_q - 1) / cfg->block_q;
    }
    AttnJob job;
    job.p = p;
    job.cfg = cfg;
    job.block = block;
    job.rows = rows;
    job.block_bf16 = block_bf16;
    /* A decode-shaped call (every sequence of at most kRowsTile query rows) with grouped heads:
     * one item per kv head walks its keys once for all of its query heads. */
    const int64_t group = p->Hq / p->Hkv;
    job.heads = 1;
    if (group > 1 && group * kRowsTile <= cfg->block_q) {
        bool decode = true;
        for (int64_t s = 0; s < p->num_seqs && decode; ++s) {
            int64_t b, q0, q1, k0, k1;
            wkv_attention_sequence(p, s, &b, &q0, &q1, &k0, &k1);
            decode = q1 - q0 <= kRowsTile;
        }
        if (decode) job.heads = group;
    }
    job.items = tiles * (job.heads > 1 ? p->Hkv : p->Hq);
    if (job.items == 0) return WKV_OK;
    job.chunks = chunk_count(&st, job.items);
    job.chunk_floats = scratch_floats(*cfg, p->D);
    const uint64_t work_bytes = cs.mul(cs.mul((uint64_t)job.chunks, (uint64_t)job.chunk_floats), 4);
    /* keys and values packed once per call when that is much less than the tiles would pack
     * again (several query tiles per head) and fits a sane amount of memory */
    const int64_t Dp = attn_padded_dim(p->D);
    job.kt_len = p->Tk + cfg->block_kv;
    const uint64_t heads = (uint64_t)p->B * (uint64_t)p->Hkv;
    const uint64_t pack_bytes = cs.mul(cs.mul(heads, cs.add(cs.mul((uint64_t)p->D, (uint64_t)job.kt_len),
                                                            cs.mul((uint64_t)p->Tk, (uint64_t)Dp))), 4);
    const bool pack = !cs.overflow && tiles > p->num_seqs && pack_bytes <= ((uint64_t)1 << 31);
    const uint64_t total = cs.add(cs.add(cs.align_up(prefix_bytes, 64), work_bytes), pack ? pack_bytes : 0);
    char* mem = cs.overflow ? nullptr : static_cast<char*>(st.scratch((size_t)total));
    if (!mem) {
        set_message(msg, "out of memory for %llu bytes of attention scratch", (unsigned long long)total);
        return WKV_ERROR_OUT_OF_MEMORY;
    }
    int64_t* before = reinterpret_cast<int64_t*>(mem);
    before[0] = 0;
    for (int64_t s = 0; s < p->num_seqs; ++s) {
        int64_t b, q0, q1, k0, k1;
        wkv_attention_sequence(p, s, &b, &q0, &q1, &k0, &k1);
        before[s + 1] = before[s] + (q1 - q0 + cfg->block_q - 1) / cfg->block_q;
    }
    job.tiles_before = before;
    job.scratch = reinterpret_cast<float*>(mem + cs.align_up(prefix_bytes, 64));
    job.kt_all = pack ? job.scratch + job.chunks * job.chunk_floats : nullptr;
    job.v_all = pack ? job.kt_all + heads * (uint64_t)p->D * (uint64_t)job.kt_len : nullptr;
    /* bf16 q and k with a bf16-dot step for this tile shape: the keys packed as bf16 pairs. Only
     * bc 64 / 128 with rows of whole vectors have that step (attention_simd.inl) */
    const bool bf16_dot = pack && block_bf16 && p->q.elem == WKV_ELEM_BF16 && p->k.elem == WKV_ELEM_BF16 &&
                          (cfg->block_kv == 64 || cfg->block_kv == 128) && Dp % 16 == 0;
    job.ktp_all = bf16_dot ? reinterpret_cast<uint32_t*>(job.kt_all) : nullptr;
    const wkv_fault_hook fault = wkv_fault_hook_from(&st.args);
    if (wkv_fault_hit(&fault, WKV_FAULT_DEVICE_LOST, "submit")) {
        set_message(msg, "the device was lost (fault injection)");
        return WKV_ERROR_DEVICE_LOST;
    }
    if (pack) {
        const int64_t pack_items = (int64_t)heads * ((p->Tk + kPackKeys - 1) / kPackKeys);
        if (pack_items > 0) st.args.parallel_for(st.args.parallel_for_user_data, pack_items, pack_chunk, &job);
    }
    if (st.args.own_pool && job.chunks <= 1)
        run_chunk(&job, 0, job.chunks);
    else
        st.args.parallel_for(st.args.parallel_for_user_data, job.chunks, run_chunk, &job);
    return WKV_OK;
}

} // namespace wkv_cpu
