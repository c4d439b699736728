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

/* The tile shapes this backend has (any D up to kMaxHeadDim, any dtype). q16 x kv64 is the
 * default: 16 rows share each transposed key block (64 keys x D) while their scores (16 x 64)
 * and accumulators (16 x D) stay in L1/L2 at D <= 128. */
constexpr AttnConfig kConfigs[] = {
    {"cpu.tiled.q16.kv64", 16, 64, true},
    {"cpu.tiled.q4.kv128", 4, 128, false},
    {"cpu.tiled.q64.kv64", 64, 64, false},
};
constexpr int kNumConfigs = (int)(sizeof kConfigs / sizeof kConfigs[0]);
constexpr int64_t kMaxHeadDim = 256;

/* Floats of one chunk's scratch for a config at head dim D. */
int64_t scratch_floats(const AttnConfig& c, int64_t D) {
    const int64_t br = c.block_q, bc = c.block_kv;
    return br * D /* q */ + D * bc /* Kt */ + bc * D /* V */ + br * bc /* scores */ + br * D /* acc */ +
           2 * br /* m, l */ + D /* a row in transit */;
}

struct AttnJob {
    const wkv_attention_problem* p;
    const AttnConfig* cfg;
    const int64_t* tiles_before; /* [num_seqs + 1]: query tiles of the sequences before s */
    int64_t items, chunks;
    float* scratch; /* chunk c at scratch + c * chunk_floats */
    int64_t chunk_floats;
};

void run_item(const AttnJob& job, int64_t item, float* mem) {
    const wkv_attention_problem& p = *job.p;
    const int64_t D = p.D, Hq = p.Hq, br = job.cfg->block_q, bc = job.cfg->block_kv;
    /* item = (tile index over all sequences) * Hq + head */
    const int64_t h = item % Hq, tile = item / Hq;
    const int64_t s = std::upper_bound(job.tiles_before, job.tiles_before + p.num_seqs + 1, tile) - job.tiles_before - 1;
    int64_t b, q0, q1, k0, k1;
    wkv_attention_sequence(&p, s, &b, &q0, &q1, &k0, &k1);
    const int64_t r0 = q0 + (tile - job.tiles_before[s]) * br, r1 = std::min(q1, r0 + br), rows = r1 - r0;
    const int64_t g = h / (Hq / p.Hkv);
    /* the last key row r sees (causal: bottom-right aligned within its sequence) */
    const int64_t shift = (k1 - k0) - (q1 - q0);
    auto last_key = [&](int64_t r) { return p.causal ? std::min(k1 - 1, k0 + (r - q0) + shift) : k1 - 1; };
    const int64_t kend = last_key(r1 - 1) + 1; /* keys [k0, kend) reach some row of the tile */

    float* q = mem;
    float* kt = q + br * D;
    float* vb = kt + D * bc;
    float* sc = vb + bc * D;
    float* acc = sc + br * bc;
    float* m = acc + br * D;
    float* l = m + br;
    float* row = l + br;
    const float neg_inf = -std::numeric_limits<float>::infinity();
    for (int64_t r = 0; r < rows; ++r) {
        load_row(p.q, view_offset(p.q, b, r0 + r, h), D, q + r * D);
        for (int64_t d = 0; d < D; ++d) q[r * D + d] *= p.scale;
        m[r] = neg_inf;
        l[r] = 0.0f;
    }
    std::memset(acc, 0, sizeof(float) * (size_t)(rows * D));

    for (int64_t j0 = k0; j0 < kend; j0 += bc) {
        const int64_t nb = std::min(bc, kend - j0);
        for (int64_t j = 0; j < nb; ++j) {
            load_row(p.k, view_offset(p.k, b, j0 + j, g), D, row);
            for (int64_t d = 0; d < D; ++d) kt[d * bc + j] = row[d];
            load_row(p.v, view_offset(p.v, b, j0 + j, g), D, vb + j * D);
        }
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t seen = std::min(nb, last_key(r0 + r) - j0 + 1); /* keys [j0, j0 + seen) */
            if (seen <= 0) continue;
            float* srow = sc + r * bc;
            const float* qr = q + r * D;
            for (int64_t j = 0; j < seen; ++j) srow[j] = 0.0f;
            for (int64_t d = 0; d < D; ++d) {
                const float qd = qr[d];
                const float* kd = kt + d * bc;
                for (int64_t j = 0; j < seen; ++j) srow[j] += qd * kd[j];
            }
            float mx = m[r];
            for (int64_t j = 0; j < seen; ++j) mx = std::max(mx, srow[j]);
            /* a row that has seen only -inf scores so far keeps m = -inf (NaN-free: corr and p
             * are computed from finite differences only) */
            if (mx == neg_inf) continue;
            const float corr = m[r] == neg_inf ? 0.0f : std::exp(m[r] - mx);
            float sum = 0.0f;
            for (int64_t j = 0; j < seen; ++j) {
                srow[j] = std::exp(srow[j] - mx);
                sum += srow[j];
            }
            l[r] = l[r] * corr + sum;
            m[r] = mx;
            float* ar = acc + r * D;
            if (corr != 1.0f)
                for (int64_t d = 0; d < D; ++d) ar[d] *= corr;
            for (int64_t j = 0; j < seen; ++j) {
                const float pj = srow[j];
                const float* vj = vb + j * D;
                for (int64_t d = 0; d < D; ++d) ar[d] += pj * vj[d];
            }
        }
    }
    for (int64_t r = 0; r < rows; ++r) {
        float* ar = acc + r * D;
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        for (int64_t d = 0; d < D; ++d) ar[d] *= inv;
        store_row(p.o, view_offset(p.o, b, r0 + r, h), D, ar);
        if (p.lse.data) {
            const float lse = l[r] > 0.0f ? m[r] + std::log(l[r]) : neg_inf;
            std::memcpy(p.lse.data + 4 * view_offset(p.lse, b, r0 + r, h), &lse, 4);
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
        o.max_head_dim = (int32_t)kMaxHeadDim;
        o.block_q = c.block_q;
        o.block_kv = c.block_kv;
        o.shared_bytes = (uint64_t)scratch_floats(c, kMaxHeadDim) * 4;
        o.fits = 1;
        o.is_default = c.is_default ? 1 : 0;
    }
    return kNumConfigs;
}

wkv_status attention(const BackendState& st, const wkv_attention_problem* p, wkv_message* msg) noexcept {
    const AttnConfig* cfg = &kConfigs[0];
    if (p->config) {
        cfg = nullptr;
        for (const AttnConfig& c : kConfigs)
            if (std::strcmp(c.name, p->config) == 0) cfg = &c;
        if (!cfg) {
            set_message(msg, "desc->config \"%.64s\" is not an attention configuration of this backend "
                             "(wkv_attention_configs lists them)", p->config);
            return WKV_ERROR_INVALID_ARGUMENT;
        }
    }
    if (p->D > kMaxHeadDim) {
        set_message(msg, "attention head dim D = %lld: this backend takes D <= %lld", (long long)p->D,
                    (long long)kMaxHeadDim);
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
    job.items = tiles * p->Hq;
    if (job.items == 0) return WKV_OK;
    job.chunks = chunk_count(&st, job.items);
    job.chunk_floats = scratch_floats(*cfg, p->D);
    const uint64_t work_bytes = cs.mul(cs.mul((uint64_t)job.chunks, (uint64_t)job.chunk_floats), 4);
    const uint64_t total = cs.add(cs.align_up(prefix_bytes, 64), work_bytes);
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
    const wkv_fault_hook fault = wkv_fault_hook_from(&st.args);
    if (wkv_fault_hit(&fault, WKV_FAULT_DEVICE_LOST, "submit")) {
        set_message(msg, "the device was lost (fault injection)");
        return WKV_ERROR_DEVICE_LOST;
    }
    if (st.args.own_pool && job.chunks <= 1)
        run_chunk(&job, 0, job.chunks);
    else
        st.args.parallel_for(st.args.parallel_for_user_data, job.chunks, run_chunk, &job);
    return WKV_OK;
}

} // namespace wkv_cpu
