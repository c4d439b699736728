// Decoding fuzz bytes into wkv_forward_desc / wkv_backward_desc, placing every tensor in the
// guarded arena, classifying the descriptor and checking the outcome (fuzz_common.h says what
// is checked; README.md gives the byte layout).
#ifndef WKV_TESTS_FUZZ_DESC_H
#define WKV_TESTS_FUZZ_DESC_H

#include <pthread.h>

#include "fuzz_common.h"

namespace fz {

typedef __int128 i128;

// ------------------------------------------------------------------------------ contexts

// A host job system for context 2: runs the ranges serially, in reverse, in uneven pieces; and
// once per call, when asked, tries a re-entrant call on the same context, which must be BUSY.
struct HostPf {
    wkv_context* ctx = nullptr;
    const wkv_forward_desc* probe = nullptr;  // set for the busy probe
    int probes_done = 0;
    uint32_t split = 1;
};
inline HostPf& host_pf_state() {
    static HostPf s;
    return s;
}
inline void host_parallel_for(void* user, int64_t n, wkv_task_fn fn, void* task) {
    HostPf* s = (HostPf*)user;
    if (s->probe && s->ctx) {
        wkv_status st = wkv_forward(s->ctx, s->probe);
        FZ_CHECK(st == WKV_ERROR_BUSY, "a re-entrant wkv_forward on a running context returned %d, "
                 "expected WKV_ERROR_BUSY", (int)st);
        s->probe = nullptr;
        s->probes_done++;
    }
    int64_t piece = 1 + (int64_t)(s->split % 7);
    for (int64_t end = n; end > 0;) {
        int64_t begin = end > piece ? end - piece : 0;
        fn(task, begin, end);
        end = begin;
    }
}

enum { kContexts = 4 };
// 0: 1 thread; 1: 2 threads; 2: the host job system above; 3: 3 threads.
inline wkv_context* context(int i) {
    static wkv_context* ctx[kContexts];
    if (!ctx[i]) {
        wkv_context_options o;
        memset(&o, 0, sizeof o);
        o.struct_size = sizeof o;
        o.backend = WKV_BACKEND_CPU;
        o.cpu_threads = i == 0 ? 1 : i == 1 ? 2 : 3;
        if (i == 2) {
            o.parallel_for = host_parallel_for;
            o.parallel_for_user_data = &host_pf_state();
        }
        if (wkv_context_create(&o, &ctx[i]) != WKV_OK)
            die("cannot create the CPU context %d: %s", i, wkv_last_error(nullptr));
        if (i == 2) host_pf_state().ctx = ctx[i];
    }
    return ctx[i];
}

// ------------------------------------------------------------------------------ a case

struct Plan {
    int role = 0;
    bool validated = false;  // the library must check it (not: y, state_out in a backward)
    bool natural = false;    // the op uses it (required) / optional and asked for
    bool optional = false;
    bool output = false;
    bool state = false;
    bool present = false;
    int nat_ndim = 0;
    int64_t nat_shape[4] = {0, 0, 0, 0};

    wkv_dtype dtype{};
    int es = 4;
    int32_t ndim = 0;
    int shape_len = 0;
    int64_t shape[8] = {};
    bool shape_null = false;
    bool shape_changed = false;
    bool strides_null = true;
    int64_t strides[8] = {};
    uint64_t byte_offset = 0;
    wkv_device device{WKV_DEVICE_CPU, 0};
    bool garbage_absent = false;

    // analysis (natural shapes only)
    bool span_ok = false;  // lo/hi computed without overflow
    bool ovf = false;      // the span cannot exist: must be rejected
    i128 lo_b = 0, hi_b = 0;
    int mis = 0;
    int offset_sel = 0;
    int alias_of = -1;     // role whose region this tensor shares
    int64_t alias_delta = 0;
    int region = -1;       // index in Regions (big slot), -1: none
    uint8_t* first = nullptr;
    bool fits = false;
    bool leader = false;   // the region was made for this tensor

    wkv_tensor t{};
};

class Case {
public:
    Bytes in;
    bool backward;
    Arena& A = Arena::get();
    Regions regs;
    Verdict verdict;
    Plan p[R_COUNT];

    int32_t op = WKV_OP_RWKV7, lay_op = WKV_OP_RWKV7;
    int32_t form = WKV_DECAY_CLAMPW;
    uint32_t flags = 0;
    int64_t B = 1, T = 1, H = 1, N = 1, S = 1;
    int64_t num_seqs = 0;
    std::vector<int64_t> offsets;
    bool offsets_null = true;
    int ctx_index = 0;
    wkv_context* ctx = nullptr;
    bool ctx_null = false, desc_null = false, fdesc_forward_null = false;
    bool busy_probe = false, twice = false;
    int data_mode = 0, global_dtype = 0;
    uint32_t seed = 0;
    bool inplace = false, inplace_active = false;

    wkv_forward_desc* fdesc = nullptr;
    int fdesc_region = -1;
    // Regions led by an input that an output shares (state_out placed exactly on state_in by
    // an alias, not by the in-place flag): their contents as drawn, so that a repeated call
    // starts from the same inputs (repoison_outputs).
    std::vector<std::pair<int, std::vector<uint8_t>>> fed_inputs;
    int small_used = 0, big_used = 0;

    Case(const uint8_t* d, size_t n, bool bwd) : in{d, n}, backward(bwd) {}

    uint8_t* next_big() {
        if (big_used == kBigSlots) die("harness: out of big slots");
        return A.big[big_used++];
    }
    uint8_t* next_small() {
        if (small_used == kSmallSlots) die("harness: out of small slots");
        return A.small[small_used++];
    }

    // -------------------------------------------------------------- header
    void decode_header() {
        uint8_t c = in.u8(0);
        ctx_index = c & 3;
        busy_probe = (c & 4) && ctx_index == 2 && !backward;
        twice = (c & 8) != 0;
        switch (in.u8(1) & 3) {
        case 0: op = WKV_OP_RWKV7; break;
        case 1: op = WKV_OP_RWKV6; break;
        case 2: op = WKV_OP_RWKV4; break;
        default: op = (int32_t)in.u32(2); break;
        }
        bool op_ok = op == WKV_OP_RWKV4 || op == WKV_OP_RWKV6 || op == WKV_OP_RWKV7;
        lay_op = op_ok ? op : WKV_OP_RWKV7;
        if (!op_ok) verdict.invalid("op");
        uint8_t fs = in.u8(6) & 7;
        if (fs == 0) form = lay_op == WKV_OP_RWKV7 ? WKV_DECAY_CLAMPW : WKV_DECAY_EXP_NEG_EXP;
        else if (fs <= 4) form = fs;
        else if (fs == 5) form = 0;
        else if (fs == 6) form = 5;
        else form = (int32_t)in.u32(7);
        if (form < 1 || form > 4) verdict.invalid("decay_form");
        else if (op == WKV_OP_RWKV4 && form != WKV_DECAY_EXP_NEG_EXP) verdict.invalid("RWKV-4 decay_form");
        uint8_t fl = in.u8(11);
        if (fl & 0x80) flags = in.u32(12);
        else flags = fl & 3;
        if (flags & ~3u) verdict.invalid("unknown flags");
        if (op == WKV_OP_RWKV4 && (flags & WKV_FLAG_STATE_KEY_MAJOR)) verdict.invalid("KEY_MAJOR on RWKV-4");
        if (op_ok && op != WKV_OP_RWKV4 && (flags & WKV_FLAG_RWKV4_STATE_INTERLEAVED))
            verdict.invalid("INTERLEAVED on RWKV-7/6");
        B = 1 + in.u8(16) % 4;
        T = 1 + in.u8(17) % 64;
        H = 1 + in.u8(18) % 4;
        N = 1 + in.u8(19) % 64;
        if (lay_op == WKV_OP_RWKV4) H = 1;
        decode_packing();
        seed = in.u32(40);
        data_mode = in.u8(44) & 3;
        global_dtype = in.u8(45) & 3;
        uint8_t ss = in.u8(39);
        inplace = (ss & 4) && (ss & 3) == 3;
    }

    void decode_packing() {
        uint8_t sel = in.u8(20);
        uint8_t ns_b = in.u8(21);
        auto cuts = [&](int64_t ns) {
            offsets.assign((size_t)ns + 1, 0);
            Rng rng(in.u64(22) ^ (uint64_t)ns);
            for (int64_t i = 1; i < ns; ++i) offsets[(size_t)i] = (int64_t)(rng.next() % (uint64_t)(T + 1));
            offsets[(size_t)ns] = T;
            std::sort(offsets.begin() + 1, offsets.end() - 1);
            for (int i = 0; i < 8 && i + 1 < ns; ++i)  // a few bytes pin cut points exactly
                if (in.u8(22 + (size_t)i) & 0x80) offsets[(size_t)i + 1] = offsets[(size_t)i];
            offsets_null = false;
        };
        num_seqs = 0;
        offsets_null = true;
        switch (sel) {
        case 0: break;
        case 1: B = 1; num_seqs = 1 + ns_b % 8; cuts(num_seqs); break;
        case 2: B = 1; num_seqs = 1 + ns_b % 8; cuts(num_seqs); offsets[0] = 1;
            for (auto& o : offsets) o = std::max<int64_t>(o, 1);
            offsets.back() = T; verdict.invalid("seq_offsets[0] != 0"); break;
        case 3: B = 1; num_seqs = 2 + ns_b % 7; cuts(num_seqs);
            offsets[1] = T; offsets[2] = T > 0 ? T - 1 : 0;
            if (num_seqs == 2) offsets[2] = T;  // keep the last == T; then 1 > 2 needs T - 1
            if (offsets[1] > offsets[2] || (num_seqs > 2)) verdict.invalid("decreasing seq_offsets");
            else verdict.unknown("seq_offsets");
            break;
        case 4: B = 1; num_seqs = 1 + ns_b % 8; cuts(num_seqs); offsets.back() = T + 1 + ns_b;
            verdict.invalid("seq_offsets[num_seqs] != T"); break;
        case 5: num_seqs = (int64_t)(in.u64(30) | (1ull << 63)); if (ns_b & 1) { offsets.assign(4, 0); offsets_null = false; }
            verdict.invalid("num_seqs < 0"); break;
        case 6: offsets.assign(2, 0); offsets[1] = T; offsets_null = false; num_seqs = 0;
            verdict.invalid("seq_offsets without num_seqs"); break;
        case 7: B = 1; num_seqs = 1 + ns_b % 8; verdict.invalid("num_seqs without seq_offsets"); break;
        case 8: B = 2 + in.u8(16) % 3; num_seqs = 1 + ns_b % 8; cuts(num_seqs);
            verdict.invalid("packed with B > 1"); break;
        case 9: B = 1; num_seqs = 1 + in.u16(30) % 512; cuts(num_seqs); break;
        case 10: num_seqs = (int64_t)((in.u64(30) | (1ull << 40)) & ~(1ull << 63));
            verdict.invalid("huge num_seqs without seq_offsets"); break;
        default: break;
        }
        S = num_seqs > 0 && num_seqs < (1 << 20) ? num_seqs : B;
    }

    // -------------------------------------------------------------- roles
    void natural_layout(Plan& q) {
        int r = q.role;
        bool rw4 = lay_op == WKV_OP_RWKV4;
        int base = r >= R_DR && r <= R_DU ? r - R_DR : r;  // gradient -> its input
        uint8_t ss = in.u8(39);
        q.output = r == R_Y || r == R_SOUT || (r >= R_DR && r <= R_DSIN && r != R_DSOUT && r != R_DY) ||
                   r == R_DSIN;
        q.state = r == R_SIN || r == R_SOUT || r == R_DSOUT || r == R_DSIN;
        bool used;
        if (r == R_SIN || r == R_DSIN) {
            q.optional = true;
            used = (ss & 1) != 0;
            if (r == R_DSIN) used = used && (in.u8(bwd_spec_at() + 4) & 1);
        } else if (r == R_SOUT || r == R_DSOUT) {
            q.optional = true;
            used = r == R_SOUT ? (ss & 2) != 0 : (in.u8(bwd_spec_at() + 4) & 2) != 0;
        } else if (r == R_Y || r == R_DY) {
            used = true;
        } else {
            switch (base) {
            case R_R: used = !rw4; break;
            case R_A: case R_B: used = lay_op == WKV_OP_RWKV7; break;
            case R_U: used = lay_op != WKV_OP_RWKV7; break;
            default: used = true; break;  // w k v
            }
        }
        q.natural = used;
        q.validated = backward ? (r != R_Y && r != R_SOUT) : r <= R_SOUT;
        if (q.state) {
            if (rw4) {
                q.nat_ndim = 3;
                bool il = flags & WKV_FLAG_RWKV4_STATE_INTERLEAVED;
                int64_t s3[3] = {S, il ? N : 3, il ? 3 : N};
                memcpy(q.nat_shape, s3, sizeof s3);
            } else {
                q.nat_ndim = 4;
                int64_t s4[4] = {S, H, N, N};
                memcpy(q.nat_shape, s4, sizeof s4);
            }
        } else if ((base == R_U || (rw4 && base == R_W)) && r != R_Y && r != R_DY) {
            if (rw4) q.nat_ndim = 1, q.nat_shape[0] = N;
            else q.nat_ndim = 2, q.nat_shape[0] = H, q.nat_shape[1] = N;
        } else if (rw4) {
            q.nat_ndim = 3;
            q.nat_shape[0] = B, q.nat_shape[1] = T, q.nat_shape[2] = N;
        } else {
            q.nat_ndim = 4;
            int64_t s4[4] = {B, T, H, N};
            memcpy(q.nat_shape, s4, sizeof s4);
        }
    }

    static bool dtype_ok(wkv_dtype d, int* es) {
        if (d.lanes != 1) return false;
        if (d.code == WKV_DTYPE_CODE_FLOAT && d.bits == 32) return *es = 4, true;
        if (d.code == WKV_DTYPE_CODE_FLOAT && d.bits == 16) return *es = 2, true;
        if (d.code == WKV_DTYPE_CODE_BFLOAT && d.bits == 16) return *es = 2, true;
        return false;
    }

    void decode_spec(Plan& q) {
        size_t o = spec_at(q.role);
        Verdict& V = verdict;
        bool check = q.validated;
        // presence
        uint8_t pres = in.u8(o + 5);
        q.present = q.natural;
        if (pres == 1) q.present = !q.present;
        q.garbage_absent = pres == 2;
        if (check) {
            if (!q.present && q.natural && !q.optional) V.invalid("a required tensor is absent");
            if (q.present && !q.natural && !q.optional) V.invalid("a tensor the op does not use is present");
        }
        // dtype
        uint8_t ds = in.u8(o + 0);
        int g = global_dtype == 3 ? (int)((seed >> (q.role % 16 * 2)) & 3) % 3 : global_dtype;
        if (q.state) g = 0;
        switch (ds) {
        case 1: q.dtype = WKV_DTYPE_F32; break;
        case 2: q.dtype = WKV_DTYPE_F16; break;
        case 3: q.dtype = WKV_DTYPE_BF16; break;
        case 4: q.dtype.code = in.u8(o + 1); q.dtype.bits = in.u8(o + 2); q.dtype.lanes = in.u16(o + 3); break;
        case 5: q.dtype = wkv_dtype_make(WKV_DTYPE_CODE_FLOAT, 64); break;
        case 6: q.dtype = WKV_DTYPE_I64; break;
        case 7: q.dtype = WKV_DTYPE_F32; q.dtype.lanes = 2; break;
        default: q.dtype = g == 0 ? WKV_DTYPE_F32 : g == 1 ? WKV_DTYPE_F16 : WKV_DTYPE_BF16; break;
        }
        int es = 4;
        bool dok = dtype_ok(q.dtype, &es);
        if (!dok) es = q.dtype.bits == 8 ? 1 : q.dtype.bits == 16 ? 2 : q.dtype.bits == 64 ? 8 : 4;
        q.es = es;
        if (check && q.present) {
            if (!dok) V.invalid("dtype");
            else if (q.state && !(q.dtype.code == WKV_DTYPE_CODE_FLOAT && q.dtype.bits == 32))
                V.invalid("state dtype");
        }
        // ndim and shape
        uint8_t ns = in.u8(o + 6);
        int32_t nd = q.nat_ndim;
        switch (ns) {
        case 1: nd = q.nat_ndim - 1; break;
        case 2: nd = q.nat_ndim + 1; break;
        case 3: nd = 0; break;
        case 4: nd = -1; break;
        case 5: nd = INT32_MAX; break;
        case 6: nd = INT32_MIN; break;
        case 7: nd = (int8_t)in.u8(o + 7); break;
        default: break;
        }
        q.ndim = nd;
        q.shape_len = std::max(0, std::min(nd, 8));
        for (int d = 0; d < 8; ++d) q.shape[d] = d < q.nat_ndim ? q.nat_shape[d] : 1;
        uint8_t sh = in.u8(o + 8);
        q.shape_null = sh == 1;
        if (sh >= 2 && sh <= 8) {
            int k = q.shape_len > 0 ? in.u8(o + 9) % q.shape_len : 0;
            int64_t orig = q.shape[k], v = orig;
            switch (sh) {
            case 2: v = orig + 1; break;
            case 3: v = 0; break;
            case 4: v = -1; break;
            case 5: v = INT64_MAX; break;
            case 6: v = INT64_MIN; break;
            case 7: v = orig + (1ll << 32); break;
            case 8: v = orig * (1ll << 33); break;
            }
            q.shape[k] = v;
            q.shape_changed = v != orig && k < q.nat_ndim;
        }
        if (check && q.present) {
            if (nd != q.nat_ndim) V.invalid("ndim");
            else if (q.shape_null) V.invalid("shape NULL");
            else if (q.shape_changed) V.invalid("shape");
        }
        // strides (over the natural dims; extra entries 1)
        decode_strides(q, in.u8(o + 10), in.u8(o + 11), in.u8(o + 12));
        // byte offset: handled at placement
        q.offset_sel = in.u8(o + 13) & 7;
        // device
        switch (in.u8(o + 15) & 7) {
        case 1: q.device = {WKV_DEVICE_CUDA_HOST, 0}; break;
        case 2: q.device = {WKV_DEVICE_CUDA_MANAGED, 0}; break;
        case 3: q.device = {WKV_DEVICE_CUDA_MANAGED, 1}; break;
        case 4: q.device = {WKV_DEVICE_CUDA, 0}; break;
        case 5: q.device = {WKV_DEVICE_VULKAN, 0}; break;
        case 6: q.device = {(int32_t)(int8_t)in.u8(o + 16), 0}; break;
        case 7: q.device = {WKV_DEVICE_CPU, 3}; break;
        default: q.device = {WKV_DEVICE_CPU, 0}; break;
        }
        if (check && q.present) {
            int32_t ty = q.device.type;
            if (ty == WKV_DEVICE_CPU || ty == WKV_DEVICE_CUDA_HOST) {
                if (q.device.id != 0) V.unknown("device.id of a host tensor");
            } else if (ty == WKV_DEVICE_CUDA_MANAGED) {
                if (q.device.id != 0) V.invalid("device.id");
            } else {
                V.invalid("device.type");
            }
        }
        // aliasing
        uint8_t as = in.u8(o + 17) & 3;
        if (as) {
            q.alias_of = in.u8(o + 18) % R_COUNT;
            int8_t dl = (int8_t)in.u8(o + 19);
            q.alias_delta = as == 1 ? (int64_t)dl * es : as == 2 ? 0 : dl;
        }
    }

    void decode_strides(Plan& q, uint8_t sel, uint8_t arg, uint8_t arg2) {
        int nd = q.nat_ndim;
        for (int d = 0; d < 8; ++d) q.strides[d] = 1;
        if (sel == 0 || sel > 7) {
            q.strides_null = true;
            return;
        }
        q.strides_null = false;
        int order[4] = {0, 1, 2, 3};  // order[0] outermost
        if (sel == 2 || sel == 7) {
            // a permutation from arg (Lehmer code)
            int pool[4] = {0, 1, 2, 3}, left = nd;
            unsigned a = arg;
            for (int i = 0; i < nd; ++i) {
                int k = (int)(a % (unsigned)left);
                a /= (unsigned)left;
                order[i] = pool[k];
                for (int j = k; j + 1 < left; ++j) pool[j] = pool[j + 1];
                --left;
            }
        }
        int64_t run = 1;
        for (int i = nd - 1; i >= 0; --i) {
            int d = order[i];
            int64_t st = run;
            if (sel == 3 || sel == 7) st = run + ((arg2 >> (i * 2)) & 3) * (i == nd - 1 ? 1 : run);
            if (sel == 3 && i == nd - 1) st = 1 + (arg & 1);
            q.strides[d] = st;
            run = st * q.nat_shape[d] + ((sel == 3 || sel == 7) ? (arg >> 4) % 4 : 0);
        }
        if (sel == 4 || sel == 7) {
            uint8_t mask = sel == 4 ? arg : arg2 >> 4;
            for (int d = 0; d < nd; ++d)
                if (mask & (1 << d)) q.strides[d] = -q.strides[d];
        }
        if (sel == 5)
            for (int d = 0; d < nd; ++d)
                if (arg & (1 << d)) q.strides[d] = 0;
        if (sel == 6 && nd > 0) {
            static const int64_t special[8] = {INT64_MAX, INT64_MIN, 1ll << 62, -(1ll << 62),
                                               1ll << 40, 1ll << 31, -1, 3};
            q.strides[arg % nd] = special[arg2 % 8];
        }
    }

    // The byte span [lo, hi) of a tensor with its natural shape, relative to its first element.
    void analyse_span(Plan& q) {
        i128 lo = 0, hi = 0;
        q.span_ok = false;
        q.ovf = false;
        for (int d = 0; d < q.nat_ndim; ++d) {
            int64_t st = q.strides_null ? 0 : q.strides[d];
            if (!q.strides_null && st == INT64_MIN) verdict_if(q, UNKNOWN, "INT64_MIN stride");
            if (q.strides_null) {
                st = 1;
                for (int e = d + 1; e < q.nat_ndim; ++e) st *= q.nat_shape[e];
            }
            i128 reach = (i128)(q.nat_shape[d] - 1) * st;
            if (reach < 0) lo += reach;
            else hi += reach;
        }
        i128 lo_b = lo * q.es, hi_b = (hi + 1) * q.es;
        const i128 M = INT64_MAX;
        if (lo_b < -M || hi_b > M) {
            q.ovf = true;
            return;
        }
        q.lo_b = lo_b;
        q.hi_b = hi_b;
        q.span_ok = true;
    }

    void verdict_if(const Plan& q, Validity v, const char* why) {
        if (!q.validated || !q.present) return;
        if (v == INVALID) verdict.invalid(why);
        else if (v == UNKNOWN) verdict.unknown(why);
    }

    uint64_t byte_offset_of(const Plan& q) const {
        uint64_t arg = in.u8(spec_at(q.role) + 14);
        switch (q.offset_sel) {
        case 1: return (1 + arg) * (uint64_t)q.es;
        case 3: return (1ull << 40) + arg * (uint64_t)q.es;
        case 4: return (1ull << 63) + arg;
        case 5: return ~0ull - arg;
        case 6: return 128;
        default: return 0;
        }
    }

    // -------------------------------------------------------------- placement
    // Returns false when a tensor that must be real memory does not fit (skip the input).
    bool place_all() {
        // groups: leaders own a region; members alias a leader
        for (Plan& q : p) {
            if (!q.present || !q.validated) continue;
            analyse_span(q);
            int os = q.offset_sel;
            if (q.ovf) verdict_if(q, INVALID, "span overflows int64");
            if (os == 4) verdict_if(q, INVALID, "byte_offset > INT64_MAX");
            if (os == 5 || os == 6) verdict_if(q, INVALID, "data + byte_offset wraps");
            if (os == 7) {
                if (q.span_ok && q.lo_b < -8) verdict_if(q, INVALID, "span below address 0");
                else q.ovf = true;  // address 8: not memory; cannot be called unless invalid
            }
            if (q.ovf || os >= 4) q.span_ok = false;
            if (os == 2) q.mis = 1 + in.u8(spec_at(q.role) + 14) % 7;
            q.byte_offset = byte_offset_of(q);
        }
        if (inplace_active) {
            p[R_SIN].alias_of = -1;  // its own region, which state_out shares exactly
            p[R_SOUT].byte_offset = p[R_SIN].byte_offset;
            p[R_SOUT].mis = p[R_SIN].mis;
            p[R_SOUT].span_ok = p[R_SIN].span_ok;
            p[R_SOUT].ovf = p[R_SIN].ovf;
        }
        // resolve aliases: the target must be a real, non-alias tensor
        for (Plan& q : p) {
            if (q.alias_of < 0) continue;
            const Plan& t = p[q.alias_of];
            if (!q.present || !q.validated || !q.span_ok || &t == &q || !t.present || !t.validated ||
                !t.span_ok || t.alias_of >= 0)
                q.alias_of = -1;
        }
        for (Plan& L : p) {
            if (!L.present || !L.validated || !L.span_ok || L.alias_of >= 0) continue;
            i128 lo = L.lo_b, hi = L.hi_b;
            for (const Plan& m : p)
                if (m.alias_of == L.role) {
                    lo = std::min(lo, (i128)m.alias_delta + m.lo_b);
                    hi = std::max(hi, (i128)m.alias_delta + m.hi_b);
                }
            if (hi - lo > (i128)(kBig - 64)) continue;  // does not fit: left without memory
            int ri = regs.place(next_big(), kBig, (size_t)(hi - lo), (size_t)L.mis, role_name(L.role));
            uint8_t* first = regs.r[(size_t)ri].start - (intptr_t)lo;
            L.region = ri, L.first = first, L.fits = true, L.leader = true;
            for (Plan& m : p)
                if (m.alias_of == L.role)
                    m.region = ri, m.first = first + m.alias_delta, m.fits = true;
        }
        // anything validated and present without memory: only an invalid call may go on
        for (const Plan& q : p)
            if (q.present && q.validated && !q.fits && verdict.v != INVALID) return false;
        return true;
    }

    // Element byte offsets (relative to first) of a tensor with its natural shape.
    template <class F>
    FZ_NOCOV void for_each_element(const Plan& q, F f) const {
        int64_t st[4] = {0, 0, 0, 0}, sh[4] = {1, 1, 1, 1};
        for (int d = 0; d < q.nat_ndim; ++d) {
            sh[d] = q.nat_shape[d];
            if (q.strides_null) {
                st[d] = 1;
                for (int e = d + 1; e < q.nat_ndim; ++e) st[d] *= q.nat_shape[e];
            } else {
                st[d] = q.strides[d];
            }
        }
        for (int64_t a = 0; a < sh[0]; ++a)
            for (int64_t b = 0; b < sh[1]; ++b)
                for (int64_t c = 0; c < sh[2]; ++c)
                    for (int64_t d = 0; d < sh[3]; ++d)
                        f((a * st[0] + b * st[1] + c * st[2] + d * st[3]) * q.es);
    }
    static int64_t numel(const Plan& q) {
        int64_t n = 1;
        for (int d = 0; d < q.nat_ndim; ++d) n *= q.nat_shape[d];
        return n;
    }

    // Library-like "nested" layout test: sorted by |stride|, each steps over the smaller ones.
    static bool nested(const Plan& q) {
        if (q.strides_null) return true;
        int ord[4] = {0, 1, 2, 3};
        int nd = q.nat_ndim;
        std::sort(ord, ord + nd, [&](int x, int y) {
            return std::llabs(q.strides[x]) < std::llabs(q.strides[y]);
        });
        i128 reach = 0;
        for (int k = 0; k < nd; ++k) {
            int d = ord[k];
            if (q.nat_shape[d] == 1) continue;
            if ((i128)std::llabs(q.strides[d]) <= reach) return false;
            reach += (i128)(q.nat_shape[d] - 1) * std::llabs(q.strides[d]);
        }
        return true;
    }

    static bool same_layout(const Plan& a, const Plan& b) {
        if (a.strides_null != b.strides_null) return false;
        if (a.strides_null) return true;
        return memcmp(a.strides, b.strides, sizeof(int64_t) * (size_t)std::max(0, a.ndim < 8 ? a.ndim : 8)) == 0;
    }

    // Output overlap rules (only when everything else is still possibly valid).
    FZ_NOCOV void analyse_outputs() {
        if (verdict.v == INVALID) return;
        for (const Plan& o : p) {
            if (!o.present || !o.validated || !o.output || !o.fits) continue;
            const Region& g = regs.r[(size_t)o.region];
            int64_t n = numel(o);
            // self overlap
            if ((i128)n * o.es > (i128)g.len) {
                verdict.invalid("an output's elements overlap");
                return;
            }
            std::vector<uint8_t> mine(g.len, 0);
            intptr_t base = o.first - g.start;
            bool dup = false;
            for_each_element(o, [&](int64_t off) FZ_NOCOV {
                size_t at = (size_t)(base + off);
                if (mine[at]) dup = true;
                for (int k = 0; k < o.es; ++k) mine[at + (size_t)k] = 1;
            });
            if (dup) {
                verdict.invalid("an output's elements overlap");
                return;
            }
            if (!nested(o)) verdict.unknown("an output with interleaved strides");
            // other tensors in the same region
            for (const Plan& x : p) {
                if (&x == &o || !x.present || !x.validated || !x.fits || x.region != o.region) continue;
                i128 olo = base + o.lo_b, ohi = base + o.hi_b;
                intptr_t xb = x.first - g.start;
                i128 xlo = xb + x.lo_b, xhi = xb + x.hi_b;
                if (ohi <= xlo || xhi <= olo) continue;
                bool pair = (o.role == R_SOUT && x.role == R_SIN) || (o.role == R_SIN && x.role == R_SOUT);
                if (pair && o.first == x.first && o.ndim == x.ndim && same_layout(o, x)) {
                    // "the very same memory": same data, byte_offset and strides
                    if (o.byte_offset != x.byte_offset) verdict.unknown("state pair: same memory, other offsets");
                    continue;
                }
                bool shared = false;
                for_each_element(x, [&](int64_t off) FZ_NOCOV {
                    size_t at = (size_t)(xb + off);
                    for (int k = 0; k < x.es; ++k)
                        if (mine[at + (size_t)k]) shared = true;
                });
                if (shared) {
                    verdict.invalid("an output shares memory with another tensor");
                    return;
                }
                verdict.unknown("an output's span overlaps another tensor's without sharing elements");
            }
        }
    }

    // -------------------------------------------------------------- cost cap
    bool affordable() const {
        if (verdict.v == INVALID) return true;
        i128 cells = lay_op == WKV_OP_RWKV4 ? (i128)B * T * N : (i128)B * T * H * N * N;
        i128 state = lay_op == WKV_OP_RWKV4 ? (i128)S * N * 3 : (i128)S * H * N * N;
        i128 flops = (cells + state) * (backward ? 24 : 6);
        return flops <= 1200000;
    }

    // -------------------------------------------------------------- memory contents
    FZ_NOCOV float value_for(int role, Rng& rng) const {
        if (data_mode == 2) return 0.0f;
        if (data_mode == 1 && (rng.next() & 15) == 0) {
            static const float sp[8] = {NAN, INFINITY, -INFINITY, 1e30f, -1e30f, 1e-40f, -0.0f, 65504.0f};
            return sp[rng.next() & 7];
        }
        float scale = data_mode == 3 ? 1e20f : 1.0f;
        int base = role >= R_DR && role <= R_DU ? role - R_DR : role;
        if (base == R_W && role != R_DW) {
            if (lay_op == WKV_OP_RWKV4) return rng.uniform(-4, 1);
            switch (form) {
            case WKV_DECAY_DIRECT: return rng.uniform(0.05f, 1.0f);
            case WKV_DECAY_LOG: return rng.uniform(-3, 0);
            case WKV_DECAY_EXP_NEG_EXP: return rng.uniform(-4, 1);
            default: return rng.uniform(-4, 4);
            }
        }
        if (lay_op == WKV_OP_RWKV4 && base == R_K) return rng.uniform(-5, 5) * scale;
        return rng.uniform(-1, 1) * scale;
    }

    FZ_NOCOV void fill_region(Plan& L) {
        Region& g = regs.r[(size_t)L.region];
        intptr_t phase = ((L.first - g.start) % L.es + L.es) % L.es;
        if (L.output) {
            uint8_t pat[8];
            poison_pattern(L.es, L.dtype.code, pat);
            for (size_t i = 0; i < g.len; ++i) g.start[i] = pat[(size_t)((intptr_t)i - phase + 8) % (size_t)L.es];
            return;
        }
        Rng rng(seed ^ (uint64_t)L.role * 0x100000001b3ull);
        memset(g.start, 0, g.len);
        for (size_t i = (size_t)phase; i + (size_t)L.es <= g.len; i += (size_t)L.es) {
            float f = value_for(L.role, rng);
            if (L.es == 4) memcpy(g.start + i, &f, 4);
            else if (L.es == 2) {
                uint16_t h = L.dtype.code == WKV_DTYPE_CODE_BFLOAT ? f32_to_bf16(f) : f32_to_f16(f);
                memcpy(g.start + i, &h, 2);
            } else {
                g.start[i] = (uint8_t)rng.next();
            }
        }
    }

    FZ_NOCOV void fill_elements(const Plan& q) {
        Region& g = regs.r[(size_t)q.region];
        Rng rng(seed ^ (uint64_t)q.role * 0x100000001b3ull);
        intptr_t base = q.first - g.start;
        for_each_element(q, [&](int64_t off) FZ_NOCOV {
            float f = value_for(q.role, rng);
            uint8_t* at = g.start + base + off;
            if (q.es == 4) memcpy(at, &f, 4);
            else if (q.es == 2) {
                uint16_t h = q.dtype.code == WKV_DTYPE_CODE_BFLOAT ? f32_to_bf16(f) : f32_to_f16(f);
                memcpy(at, &h, 2);
            } else {
                memset(at, 0x3C, (size_t)q.es);
            }
        });
    }

    // Fresh poison in every output-led region (its input members keep their values); returns
    // those regions' contents after the previous call, to compare a repeated call with.
    std::vector<std::vector<uint8_t>> repoison_outputs() {
        for (const auto& f : fed_inputs) /* the inputs the first call's outputs overwrote */
            memcpy(regs.r[(size_t)f.first].start, f.second.data(), f.second.size());
        std::vector<std::vector<uint8_t>> before;
        for (Plan& q : p)
            if (q.leader && q.output) {
                Region& g = regs.r[(size_t)q.region];
                before.emplace_back(g.start, g.start + g.len);
                fill_region(q);
            }
        for (Plan& q : p)
            if (q.fits && !q.leader && !q.output && p[q.alias_of].output) fill_elements(q);
        return before;
    }
    void compare_outputs(const std::vector<std::vector<uint8_t>>& before, const char* call) {
        size_t i = 0;
        for (Plan& q : p)
            if (q.leader && q.output) {
                Region& g = regs.r[(size_t)q.region];
                FZ_CHECK(memcmp(g.start, before[i].data(), g.len) == 0,
                         "%s: %s differs between two identical calls (not deterministic, or it depends "
                         "on the workspace's previous contents)", call, role_name(q.role));
                ++i;
            }
    }

    // An int64 array in a small slot, ending at its guard page.
    const int64_t* small_array(const int64_t* v, int n, const char* what) {
        int ri = (size_t)n * 8 + 16 <= kSmall ? regs.place(next_small(), kSmall, (size_t)n * 8, 0, what)
                                              : regs.place(next_big(), kBig, (size_t)n * 8, 0, what);
        if (n) memcpy(regs.r[(size_t)ri].start, v, (size_t)n * 8);
        return (const int64_t*)regs.r[(size_t)ri].start;
    }

    void make_tensor(Plan& q) {
        wkv_tensor& t = q.t;
        memset(&t, 0, sizeof t);
        if (!q.present) {
            if (q.garbage_absent) {  // absent: every other field must be ignored
                t.ndim = -7;
                t.shape = (const int64_t*)(A.trap + 64);
                t.strides = (const int64_t*)(A.trap + 128);
                t.dtype.code = 99;
                t.byte_offset = ~0ull;
                t.device.type = 77;
            }
            return;
        }
        t.ndim = q.ndim;
        t.dtype = q.dtype;
        t.device = q.device;
        uint8_t arg = in.u8(spec_at(q.role) + 14);
        if (!q.validated) {  // y / state_out of a backward: ignored, so never memory
            t.data = A.trap + 256 * (size_t)q.role;
            t.shape = (const int64_t*)(A.trap + 8);
            t.strides = (arg & 1) ? (const int64_t*)(A.trap + 16) : nullptr;
            return;
        }
        t.shape = q.shape_null ? nullptr : small_array(q.shape, q.shape_len, "shape array");
        t.strides = q.strides_null ? nullptr : small_array(q.strides, q.shape_len, "strides array");
        if (q.role == R_SOUT && inplace_active) {
            t.shape = p[R_SIN].t.shape;
            t.strides = p[R_SIN].t.strides;
        }
        uint64_t off = byte_offset_of(q);
        q.byte_offset = off;
        t.byte_offset = off;
        if (q.fits) {
            t.data = (void*)((uintptr_t)q.first - (uintptr_t)off);
        } else if (q.offset_sel == 6) {
            t.data = (void*)(UINTPTR_MAX - 64);
        } else if (q.offset_sel == 7) {
            t.data = (void*)(uintptr_t)8;
        } else if (q.offset_sel == 5 || q.offset_sel == 4) {
            t.data = A.trap + 4096;
        } else {
            t.data = A.trap + 512 * (size_t)q.role;  // the call is invalid: must not be touched
        }
        if (q.role == R_SOUT && inplace_active) t.byte_offset = p[R_SIN].t.byte_offset, t.data = p[R_SIN].t.data;
    }

    // The forward descriptor in a big slot, with struct_size from header[38].
    void build_forward() {
        uint8_t ss = in.u8(38);
        size_t sz = sizeof(wkv_forward_desc), bytes = sz, field = sz;
        bool tail_nonzero = false;
        switch (ss) {
        case 1: field = sz - 1; verdict.invalid("struct_size too small"); break;
        case 2: field = 0; verdict.invalid("struct_size 0"); break;
        case 3: field = bytes = sz + 16; break;
        case 4: field = bytes = sz + 16; tail_nonzero = true; verdict.invalid("fields beyond struct_size set"); break;
        case 5: field = 65537; verdict.invalid("struct_size huge"); break;
        case 6: field = SIZE_MAX; verdict.invalid("struct_size SIZE_MAX"); break;
        case 7: field = bytes = 65536; break;
        case 8: desc_null = true; verdict.invalid("desc NULL"); break;
        case 9: ctx_null = true; verdict.invalid("ctx NULL"); break;
        default: break;
        }
        if (ctx_null) ctx = nullptr;
        int ri = regs.place(next_big(), kBig, bytes, 0, "the forward descriptor");
        fdesc_region = ri;
        uint8_t* mem = regs.r[(size_t)ri].start;
        memset(mem, 0, bytes);
        wkv_forward_desc f;
        memset(&f, 0, sizeof f);
        f.struct_size = field;
        memcpy(&f.op, &op, sizeof op);  // raw int32s: C++ may not hold out-of-range enums
        memcpy(&f.decay_form, &form, sizeof form);
        f.flags = flags;
        wkv_tensor* slots[R_SOUT + 1] = {&f.r, &f.w, &f.k, &f.v, &f.a, &f.b, &f.u, &f.y, &f.state_in, &f.state_out};
        for (int r = 0; r <= R_SOUT; ++r) *slots[r] = p[r].t;
        f.num_seqs = num_seqs;
        if (!offsets_null) {
            int n = (int)offsets.size();
            f.seq_offsets = small_array(offsets.data(), n, "seq_offsets");
        }
        memcpy(mem, &f, sizeof f);
        if (tail_nonzero) mem[sz + in.u8(39) % 16] = (uint8_t)(1 + in.u8(46) % 255);
        fdesc = (wkv_forward_desc*)mem;
    }

    // Common set-up: decode, place, classify. False: skip this input.
    bool setup() {
        decode_header();
        for (int r = 0; r < R_COUNT; ++r) {
            p[r].role = r;
            if (!backward && r > R_SOUT) continue;
            natural_layout(p[r]);
            if (r == R_SOUT && inplace && p[R_SIN].present && p[R_SOUT].natural && p[R_SOUT].validated) {
                // in-place stepping: state_out is state_in exactly (same data, offset, arrays)
                Plan so = p[R_SIN];
                so.role = R_SOUT;
                so.output = true;
                so.alias_of = R_SIN;
                so.alias_delta = 0;
                p[R_SOUT] = so;
                inplace_active = true;
                continue;
            }
            decode_spec(p[r]);
        }
        if (!place_all()) return false;
        analyse_outputs();
        if (!affordable()) return false;
        for (Plan& q : p)
            if (q.leader) fill_region(q);
        for (Plan& q : p)  // inputs sharing an output's region get values, not poison
            if (q.fits && !q.leader && !q.output && p[q.alias_of].output) fill_elements(q);
        for (const Plan& q : p)  // outputs in an input's region: keep that region as drawn
            if (q.fits && !q.leader && q.output && !p[q.alias_of].output) {
                const Region& g = regs.r[(size_t)q.region];
                bool kept = false;
                for (const auto& f : fed_inputs) kept = kept || f.first == q.region;
                if (!kept) fed_inputs.emplace_back(q.region, std::vector<uint8_t>(g.start, g.start + g.len));
            }
        for (int r = 0; r < R_COUNT; ++r) {
            if (!backward && r > R_SOUT) continue;
            make_tensor(p[r]);
        }
        ctx = ctx_null ? nullptr : context(ctx_index);
        return true;
    }

    // The output elements may change; poisoned outputs must all have been written.
    FZ_NOCOV void allow_outputs(const char* call, bool check_written) {
        for (const Plan& o : p) {
            if (!o.present || !o.validated || !o.output || !o.fits) continue;
            Region& g = regs.r[(size_t)o.region];
            intptr_t base = o.first - g.start;
            bool own = o.leader;  // and alone in its region: no input values mixed in
            for (const Plan& m : p)
                if (m.fits && m.region == o.region && &m != &o) own = false;
            uint8_t pat[8];
            poison_pattern(o.es, o.dtype.code, pat);
            int64_t unwritten = 0;
            for_each_element(o, [&](int64_t off) FZ_NOCOV {
                size_t at = (size_t)(base + off);
                for (int k = 0; k < o.es; ++k) g.may_write[at + (size_t)k] = 1;
                if (own && check_written && memcmp(g.start + at, pat, (size_t)o.es) == 0) ++unwritten;
            });
            FZ_CHECK(unwritten == 0, "%s returned WKV_OK but left %lld of %lld elements of %s unwritten "
                     "(op %d, B=%lld T=%lld H=%lld N=%lld, num_seqs %lld)", call, (long long)unwritten,
                     (long long)numel(o), role_name(o.role), (int)op, (long long)B, (long long)T,
                     (long long)H, (long long)N, (long long)num_seqs);
        }
    }

    // WKV_FUZZ_DUMP=1: print the decoded call (for reproducers).
    void dump(const char* call) const {
        if (!getenv("WKV_FUZZ_DUMP")) return;
        fprintf(stderr, "%s: ctx %d%s op %d form %d flags %u B=%lld T=%lld H=%lld N=%lld num_seqs %lld "
                "verdict %s (%s)\n", call, ctx_index, ctx ? "" : " (NULL)", (int)op, (int)form, flags,
                (long long)B, (long long)T, (long long)H, (long long)N, (long long)num_seqs,
                vname(verdict.v), verdict.why);
        for (const Plan& q : p) {
            if (!q.present) continue;
            const wkv_tensor& t = q.t;
            fprintf(stderr, "  %-10s data %p +%llu dtype %u/%u/%u dev %d/%d ndim %d shape", role_name(q.role),
                    t.data, (unsigned long long)t.byte_offset, t.dtype.code, t.dtype.bits, t.dtype.lanes,
                    t.device.type, t.device.id, t.ndim);
            if (!q.validated) {
                fprintf(stderr, " (ignored by a backward: points into the trap)\n");
                continue;
            }
            for (int d = 0; d < q.shape_len && t.shape; ++d) fprintf(stderr, " %lld", (long long)t.shape[d]);
            fprintf(stderr, " strides");
            if (!t.strides) fprintf(stderr, " NULL");
            for (int d = 0; d < q.shape_len && t.strides; ++d) fprintf(stderr, " %lld", (long long)t.strides[d]);
            fprintf(stderr, "%s%s\n", q.fits ? "" : " (no memory)", q.alias_of >= 0 ? " (aliased)" : "");
        }
    }

    void check_expectation(wkv_status st, const char* call) {
        check_status(st, call);
        Stats::get().calls[verdict.v][(int)st]++;
        if (verdict.v == VALID)
            FZ_CHECK(st == WKV_OK, "%s rejected a valid descriptor with %s: \"%s\" (op %d form %d flags %u "
                     "B=%lld T=%lld H=%lld N=%lld num_seqs %lld)", call, wkv_status_string(st),
                     ctx ? wkv_last_error(ctx) : wkv_last_error(nullptr), (int)op, (int)form, flags,
                     (long long)B, (long long)T, (long long)H, (long long)N, (long long)num_seqs);
        if (verdict.v == INVALID)
            FZ_CHECK(st != WKV_OK, "%s accepted a descriptor that must be rejected (%s)", call, verdict.why);
        if (ctx) check_message(wkv_last_error(ctx), st == WKV_OK, call);
        else check_message(wkv_last_error(nullptr), false, call);
    }

    ~Case() { regs.disarm(); }
};

}  // namespace fz

#endif  // WKV_TESTS_FUZZ_DESC_H
