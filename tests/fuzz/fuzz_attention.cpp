// libFuzzer harness: wkv_attention and wkv_attention_backward on the CPU backend (the input
// layout is in README.md here).
//
// The property of every harness (fuzz_common.h): a status and a message, nothing touched that
// was not given, every output element written after WKV_OK, VALID calls run and INVALID ones are
// refused. On top, every call that runs on sane data is checked against a float64 softmax
// attention (and its gradients, for the backward) computed here from the bytes the library was
// given.
#include "fuzz_common.h"

using namespace fz;

namespace {

enum Tensor { T_Q, T_K, T_V, T_O, T_LSE, T_COUNT };
const char* const kNames[T_COUNT] = {"q", "k", "v", "o", "lse"};
enum { kAttHeader = 40, kAttSpec = 8 };
// The backward's bytes, after the five tensor specs: mode, defect, defect axis, data seed.
enum { kBwd = kAttHeader + T_COUNT * kAttSpec };
enum Grad { G_DOUT, G_DLSE, G_DQ, G_DK, G_DV, G_COUNT };
const char* const kGradNames[G_COUNT] = {"dout", "dlse", "dq", "dk", "dv"};

wkv_context* context(int threads) {
    static wkv_context* ctx[3];
    int i = threads - 1;
    if (!ctx[i]) {
        wkv_context_options o;
        memset(&o, 0, sizeof o);
        o.struct_size = sizeof o;
        o.backend = WKV_BACKEND_CPU;
        o.cpu_threads = threads;
        if (wkv_context_create(&o, &ctx[i]) != WKV_OK) die("cannot create a CPU context: %s", wkv_last_error(nullptr));
    }
    return ctx[i];
}

// One tensor of the call as planned: its shape, strides and where its elements are.
struct Plan {
    bool present = true, output = false, real = false;  // real: its elements are memory here
    wkv_dtype dtype = WKV_DTYPE_F32;
    int es = 4, ndim = 4;
    int64_t shape[4] = {1, 1, 1, 1}, strides[4] = {0, 0, 0, 0};
    bool explicit_strides = false;
    int64_t lo = 0, bytes = 0;  // the span: lowest element offset (elements), bytes
    int region = -1;
    uint8_t* first = nullptr;  // element (0, 0, 0, 0)
    wkv_tensor t{};
};

FZ_NOCOV float to_float(const uint8_t* p, wkv_dtype dt) {
    if (dt.bits == 32) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    if (dt.code == WKV_DTYPE_CODE_BFLOAT) {
        uint32_t x = (uint32_t)h << 16;
        float f;
        memcpy(&f, &x, 4);
        return f;
    }
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu, x;
    if (e == 0) {
        float f = (float)m * 0x1p-24f;
        return sign ? -f : f;
    }
    x = e == 31 ? sign | 0x7f800000u | m << 13 : sign | (e + 112) << 23 | m << 13;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

FZ_NOCOV void from_float(uint8_t* p, wkv_dtype dt, float f) {
    double g = f;
    if (dt.bits == 64) memcpy(p, &g, 8);
    else if (dt.bits == 32) memcpy(p, &f, 4);
    else {
        uint16_t h = dt.code == WKV_DTYPE_CODE_BFLOAT ? f32_to_bf16(f) : f32_to_f16(f);
        memcpy(p, &h, 2);
    }
}

struct Case {
    Bytes in;
    Regions regs;
    Verdict verdict;
    Plan p[T_COUNT];
    wkv_context* ctx = nullptr;
    wkv_attention_desc* desc = nullptr;
    bool desc_null = false, twice = false, sane = true;
    int64_t B = 1, Tq = 1, Tk = 1, Hq = 1, Hkv = 1, D = 1, num_seqs = 0;
    int64_t qoff[8] = {0}, koff[8] = {0};
    bool causal = false;
    float scale = 0;
    uint32_t seed = 0;
    int next_big = 0, next_small = 0;

    Case(const uint8_t* d, size_t n) : in{d, n} {}

    uint8_t* big() {
        if (next_big >= kBigSlots) die("harness: out of big slots");
        return Arena::get().big[next_big++];
    }
    uint8_t* small() {
        if (next_small >= kSmallSlots) die("harness: out of small slots");
        return Arena::get().small[next_small++];
    }

    // Header byte 16 and on: the packed sequences (B forced to 1 for the valid ones).
    void decode_packing(uint8_t mode) {
        if (mode == 0) return;
        int n = 1 + in.u8(17) % 4;
        auto cuts = [&](int64_t* off, int64_t T, int at) {
            off[0] = 0, off[n] = T;
            for (int s = 1; s < n; ++s) off[s] = in.u8((size_t)(at + s)) % (T + 1);
            std::sort(off + 1, off + n);
        };
        cuts(qoff, Tq, 18);
        cuts(koff, Tk, 22);
        num_seqs = n;
        if (mode != 9) B = 1;
        switch (mode) {
        case 1: break;
        case 2: num_seqs = -1, verdict.invalid("num_seqs < 0"); break;
        case 3: verdict.invalid("q_offsets NULL"); break;
        case 4: verdict.invalid("k_offsets NULL"); break;
        // these three: classify_shapes() judges the offsets against the final Tq and Tk
        case 5: qoff[0] = 1; break;
        case 6: koff[1] = -1; break;
        case 7: qoff[n] = Tq + 1; break;
        case 8: num_seqs = 0, verdict.invalid("offsets with num_seqs 0"); break;
        default: B = 2; break;  // packing needs B = 1: classify_shapes()
        }
    }

    // A tensor spec: layout, one defect (aliasing and misalignment are read by place()).
    void decode_tensor(int i, bool lse_wanted) {
        Plan& q = p[i];
        size_t at = kAttHeader + (size_t)i * kAttSpec;
        uint8_t layout = in.u8(at) % 8, axis = in.u8(at + 1) % 4, defect = in.u8(at + 2) % 8;
        const bool lse = i == T_LSE;
        q.output = i >= T_O;
        q.ndim = lse ? 3 : 4;
        q.present = !(lse && (!lse_wanted || defect == 4));  // an absent lse is no defect
        auto invalid = [&](const char* why) { if (q.present) verdict.invalid(why); };
        auto unknown = [&](const char* why) { if (q.present) verdict.unknown(why); };
        const int64_t T = i == T_K || i == T_V ? Tk : Tq, H = i == T_K || i == T_V ? Hkv : Hq;
        if (lse) q.shape[0] = B, q.shape[1] = Hq, q.shape[2] = Tq;
        else q.shape[0] = B, q.shape[1] = T, q.shape[2] = H, q.shape[3] = D;
        axis %= q.ndim;
        // before the strides, which follow the given shape: a changed dimension, lse's wrong length
        if (defect == 1) q.shape[axis] += 1;
        if (lse && in.u8(15) % 6 == 3) q.shape[2] += 1;
        // contiguous strides of the natural layout, or of [B, H, T, D] (a framework's transpose)
        int order[4] = {0, 1, 2, 3};
        if (layout == 2 && !lse) order[1] = 2, order[2] = 1;
        int64_t s = 1;
        for (int d = q.ndim - 1; d >= 0; --d) q.strides[order[d]] = s, s *= std::max<int64_t>(q.shape[order[d]], 1);
        switch (layout) {
        case 1: case 2: q.explicit_strides = true; break;
        case 3:  // padded: the axes outside `axis` step over a gap
            q.explicit_strides = true;
            for (int d = 0; d < q.ndim; ++d)
                if (q.strides[d] > q.strides[axis]) q.strides[d] += q.strides[d] / q.strides[axis] * 3;
            break;
        case 4:  // broadcast
            q.explicit_strides = true, q.strides[axis] = 0;
            if (q.output && q.shape[axis] > 1 && std::find(q.shape, q.shape + q.ndim, 0) == q.shape + q.ndim)
                invalid("an output with stride 0");  // (an empty output overlaps nothing)
            break;
        case 5: q.explicit_strides = true, q.strides[axis] = -q.strides[axis], unknown("a negative stride"); break;
        case 6:
            q.explicit_strides = true, q.strides[axis] = INT64_MAX / 2;
            if (q.shape[axis] > 1) invalid("a stride whose span overflows");
            else unknown("a huge stride on an axis of size 1");
            break;
        default: break;
        }
        switch (defect) {
        case 1: break;  // the shape changed above; classify_shapes() judges it
        case 2: q.ndim = lse ? 4 : 3, invalid("a wrong ndim"); break;
        case 3: invalid("a NULL shape"); break;
        case 4: if (!lse) q.present = false, verdict.invalid("a NULL data pointer"); break;
        case 5: invalid("a CUDA device tensor"); break;
        default: break;
        }
    }

    // The call's sizes come from q and k (wkv.h); every other tensor must agree with them.
    void classify_shapes() {
        const Plan &q = p[T_Q], &k = p[T_K];
        if (!q.present || !k.present || q.ndim != 4 || k.ndim != 4) return;  // refused already
        B = q.shape[0], Tq = q.shape[1], Hq = q.shape[2], D = q.shape[3], Tk = k.shape[1], Hkv = k.shape[2];
        if (Hq % Hkv) verdict.invalid("Hq not a multiple of Hkv");
        if (D > 256) verdict.invalid("D > 256 (unsupported on the CPU)");
        const int64_t want[T_COUNT][4] = {{B, Tq, Hq, D}, {B, Tk, Hkv, D}, {B, Tk, Hkv, D}, {B, Tq, Hq, D}, {B, Hq, Tq, 1}};
        for (int i = 0; i < T_COUNT; ++i)
            if (p[i].present && p[i].ndim == (i == T_LSE ? 3 : 4) && memcmp(p[i].shape, want[i], 8 * (size_t)p[i].ndim))
                verdict.invalid("a dimension that disagrees with q and k");
        if (num_seqs > 0) {
            if (B != 1) verdict.invalid("packed sequences with B != 1");
            bool ok = qoff[0] == 0 && koff[0] == 0 && qoff[num_seqs] == Tq && koff[num_seqs] == Tk;
            for (int64_t i = 0; i < num_seqs; ++i) ok &= qoff[i] <= qoff[i + 1] && koff[i] <= koff[i + 1];
            if (!ok) verdict.invalid("offsets that are not 0 ... Tq (Tk), non-decreasing");
        }
    }

    // false: a valid call too large to run cheaply (skipped).
    bool setup() {
        uint8_t h0 = in.u8(0);
        ctx = context(1 + (h0 & 3) % 3);
        twice = (h0 >> 2) & 1;
        B = 1 + in.u8(8) % 3;
        Tq = in.u8(9) % 48;
        Tk = in.u8(10) % 48;
        Hkv = 1 + in.u8(11) % 3;
        Hq = Hkv * (1 + in.u8(12) % 3);
        uint8_t db = in.u8(13);
        D = db == 250 ? 64 : db == 251 ? 128 : db == 252 ? 256 : db == 253 ? 257 : 1 + db % 40;
        decode_packing(in.u8(16) % 10);
        for (int i = 0; i < T_COUNT; ++i) decode_tensor(i, in.u8(15) % 6 != 0);
        // dtypes: byte 14
        uint8_t dm = in.u8(14) % 5;
        wkv_dtype io = dm == 1 ? WKV_DTYPE_F16 : dm == 2 ? WKV_DTYPE_BF16 : WKV_DTYPE_F32;
        for (int i = 0; i < T_LSE; ++i) p[i].dtype = io;
        if (dm == 3) p[T_K].dtype = WKV_DTYPE_F16, verdict.invalid("k's dtype differs");
        if (dm == 4) p[T_Q].dtype = wkv_dtype{WKV_DTYPE_CODE_FLOAT, 64, 1}, verdict.invalid("a float64 q");
        switch (p[T_LSE].present ? in.u8(15) % 6 : 0) {
        case 2: p[T_LSE].dtype = WKV_DTYPE_F16, verdict.invalid("lse not float32"); break;
        default: break;
        }
        for (Plan& q : p) q.es = q.dtype.bits / 8;
        classify_shapes();
        uint32_t flags_raw = in.u32(36);
        uint8_t fl = in.u8(2) % 3;
        causal = fl == 1;
        uint8_t sc = in.u8(7) % 7;
        const float scales[7] = {0.0f, 0.37f, -1.5f, NAN, INFINITY, -INFINITY, 1e-30f};
        scale = scales[sc];
        if (sc >= 3 && sc <= 5) verdict.invalid("a scale that is not finite");
        seed = in.u32(28);
        sane = in.u8(32) % 4 != 2;
        // cost: a valid call does B*Hq*Tq*Tk*D*4 flops at most
        double flops = 4.0 * (double)B * (double)Hq * (double)Tq * (double)Tk * (double)D;
        if (verdict.v != INVALID && flops > 1.2e6) return false;
        if (!place()) return false;
        build_desc(fl == 2 ? flags_raw | 2u : causal ? WKV_ATTENTION_CAUSAL : 0u);
        if (fl == 2) verdict.invalid("unknown flag bits");
        return true;
    }

    // Places every tensor that the call may read or write at the end of an arena slot.
    bool place() {
        Arena& A = Arena::get();
        for (int i = 0; i < T_COUNT; ++i) {
            Plan& q = p[i];
            __int128 lo = 0, hi = 0;
            bool empty = false;
            for (int d = 0; d < q.ndim && d < 4; ++d) {
                if (q.shape[d] <= 0) empty = true;
                __int128 ext = (__int128)(q.shape[d] - 1) * q.strides[d];
                (ext < 0 ? lo : hi) += ext;
            }
            __int128 bytes = empty ? 0 : (hi - lo + 1) * q.es;
            q.lo = (int64_t)lo, q.bytes = (int64_t)std::min(bytes, (__int128)INT64_MAX);
            if (bytes > (__int128)(kBig - 64)) {
                q.first = A.trap + 512 * (size_t)i;  // only a refused call may get here
                if (verdict.v != INVALID) return false;
                continue;
            }
            uint8_t mis = in.u8(kAttHeader + (size_t)i * kAttSpec + 4) % 4;
            if (mis && q.es > 1) verdict.unknown("a misaligned tensor");
            int ri = regs.place(big(), kBig, (size_t)bytes, q.es > 1 ? mis % q.es : 0, kNames[i]);
            q.region = ri;
            q.first = regs.r[(size_t)ri].start - (intptr_t)(lo * q.es);
            q.real = !empty;
        }
        // aliasing (o's byte 3): o onto q's memory, o onto k shifted by one element, lse onto o,
        // v onto k's memory; only where the moved tensor's span fits the other's region
        uint8_t al = in.u8(kAttHeader + (size_t)T_O * kAttSpec + 3) % 5;
        auto share = [&](int a, int b, int64_t shift) {
            const Plan &x = p[a], &y = p[b];
            if (!x.real || !y.real || !x.present || !y.present || x.lo || y.lo) return false;
            if (x.bytes + shift * x.es > (int64_t)regs.r[(size_t)y.region].len) return false;
            p[a].first = y.first + shift * x.es, p[a].region = y.region;
            return true;
        };
        if (al == 1 && p[T_O].es == p[T_Q].es && share(T_O, T_Q, 0)) verdict.invalid("o aliases q");
        if (al == 2 && p[T_O].es == p[T_K].es && share(T_O, T_K, 1)) verdict.invalid("o overlaps k");
        if (al == 3 && p[T_O].es == 4 && share(T_LSE, T_O, 0)) verdict.invalid("lse aliases o");
        if (al == 4 && p[T_V].es == p[T_K].es && !memcmp(p[T_V].strides, p[T_K].strides, sizeof p[T_K].strides) &&
            !memcmp(p[T_V].shape, p[T_K].shape, sizeof p[T_K].shape))
            share(T_V, T_K, 0);  // inputs may share memory
        fill();
        return true;
    }

    template <class F>
    FZ_NOCOV void for_each(const Plan& q, F f) const {
        if (!q.real) return;
        int64_t sh[4] = {1, 1, 1, 1};
        for (int d = 0; d < q.ndim; ++d) sh[d] = q.shape[d];
        for (int64_t a = 0; a < sh[0]; ++a)
            for (int64_t b = 0; b < sh[1]; ++b)
                for (int64_t c = 0; c < sh[2]; ++c)
                    for (int64_t d = 0; d < sh[3]; ++d)
                        f(q.first + q.es * (a * q.strides[0] + b * q.strides[1] + c * q.strides[2] +
                                            (q.ndim > 3 ? d * q.strides[3] : 0)));
    }

    FZ_NOCOV void fill() {
        Rng rng(seed);
        uint8_t mode = in.u8(32) % 4;
        float mag = mode == 1 ? 6.0f : 1.0f;  // mode 1: logits up to ~36 D: exp overflows without the running max
        for (int i = 0; i < T_COUNT; ++i) {
            Plan& q = p[i];
            if (q.region < 0) continue;
            if (q.output) {
                uint8_t pat[8];
                poison_pattern(q.es, q.dtype.code, pat);
                for_each(q, [&](uint8_t* at) FZ_NOCOV { memcpy(at, pat, (size_t)q.es); });
                continue;
            }
            for_each(q, [&](uint8_t* at) FZ_NOCOV {
                float f = mode == 3 ? 0.0f : rng.uniform(-mag, mag);
                if (mode == 2 && rng.next() % 97 == 0) f = (rng.next() & 1) ? NAN : INFINITY;
                from_float(at, q.dtype, f);
            });
        }
    }

    const int64_t* array(const int64_t* v, int n, const char* what) {
        int ri = regs.place(small(), kSmall, (size_t)n * 8, 0, what);
        memcpy(regs.r[(size_t)ri].start, v, (size_t)n * 8);
        return (const int64_t*)regs.r[(size_t)ri].start;
    }

    void build_desc(uint32_t flags) {
        Arena& A = Arena::get();
        for (int i = 0; i < T_COUNT; ++i) {
            Plan& q = p[i];
            uint8_t defect = in.u8(kAttHeader + (size_t)i * kAttSpec + 2) % 8;
            wkv_tensor& t = q.t;
            t = wkv_tensor{};
            if (!q.present) {
                if (i == T_LSE && defect == 4) {  // absent, with garbage in the other fields
                    t.shape = (const int64_t*)(A.trap + 8), t.ndim = 7;
                }
                continue;
            }
            t.data = q.first;
            t.device = wkv_device{defect == 5 ? WKV_DEVICE_CUDA : WKV_DEVICE_CPU, 0};
            t.ndim = q.ndim;
            t.dtype = q.dtype;
            t.shape = defect == 3 ? nullptr : array(q.shape, q.ndim, kNames[i]);
            t.strides = q.explicit_strides ? array(q.strides, q.ndim, kNames[i]) : nullptr;
        }
        // the descriptor and its struct_size (byte 1)
        uint8_t ssm = in.u8(1) % 8;
        size_t sz = sizeof(wkv_attention_desc), field = sz, bytes = sz;
        switch (ssm) {
        case 1: field = sz - 1, verdict.invalid("struct_size - 1"); break;
        case 2: field = 0, verdict.invalid("struct_size 0"); break;
        case 3: field = bytes = sz + 16; break;
        case 4: field = bytes = sz + 16, verdict.invalid("a non-zero tail past struct_size"); break;
        case 5: field = SIZE_MAX, verdict.invalid("struct_size SIZE_MAX"); break;
        case 6: desc_null = true, verdict.invalid("desc NULL"); break;
        case 7: ctx = nullptr, verdict.invalid("ctx NULL"); break;
        default: break;
        }
        int ri = regs.place(big(), kBig, bytes, 0, "the attention descriptor");
        desc = (wkv_attention_desc*)regs.r[(size_t)ri].start;
        memset((void*)desc, 0, bytes);
        if (ssm == 4) ((uint8_t*)desc)[sz + 5] = 1;
        desc->struct_size = field;
        desc->flags = flags;
        desc->scale = scale;
        desc->q = p[T_Q].t, desc->k = p[T_K].t, desc->v = p[T_V].t, desc->o = p[T_O].t, desc->lse = p[T_LSE].t;
        uint8_t pk = in.u8(16) % 10;
        if (pk) {
            desc->num_seqs = num_seqs;
            int n = (int)(num_seqs > 0 ? num_seqs : 1 + in.u8(17) % 4);
            if (pk != 3) desc->q_offsets = array(qoff, n + 1, "q_offsets");
            if (pk != 4) desc->k_offsets = array(koff, n + 1, "k_offsets");
        }
        // the configuration (byte 26): NULL, a listed one, an unknown name, ""
        uint8_t cm = in.u8(26) % 4;
        const char* name = nullptr;
        char listed[64] = "";
        if (cm == 1 && ctx) {
            wkv_attention_config cfg[16];
            for (auto& c : cfg) memset(&c, 0, sizeof c), c.struct_size = sizeof c;
            int32_t count = 0;
            if (wkv_attention_configs(ctx, cfg, 16, &count) != WKV_OK || count < 1) die("no attention configs on the CPU");
            memcpy(listed, cfg[in.u8(27) % std::min(count, 16)].name, 63);
            name = listed;
        }
        if (cm == 2) name = "no.such.config", verdict.invalid("an unknown config");
        if (cm == 3) name = "", verdict.invalid("an empty config name");
        if (name) {
            size_t n = strlen(name) + 1;
            int ci = regs.place(small(), kSmall, n, 0, "config");
            memcpy(regs.r[(size_t)ci].start, name, n);
            desc->config = (const char*)regs.r[(size_t)ci].start;
        }
    }

    // WKV_FUZZ_DUMP=1: the decoded call (for reproducers).
    void dump() const {
        if (!getenv("WKV_FUZZ_DUMP")) return;
        fprintf(stderr, "wkv_attention: B=%lld Tq=%lld Tk=%lld Hq=%lld Hkv=%lld D=%lld causal %d scale %g num_seqs %lld "
                "config %s verdict %s (%s)\n", (long long)B, (long long)Tq, (long long)Tk, (long long)Hq,
                (long long)Hkv, (long long)D, (int)causal, (double)scale, (long long)num_seqs,
                desc && desc->config ? desc->config : "NULL", vname(verdict.v), verdict.why);
        for (int i = 0; i < T_COUNT; ++i) {
            const Plan& q = p[i];
            fprintf(stderr, "  %-3s %s dtype %d/%d device %d shape", kNames[i], q.present ? "given " : "absent",
                    q.dtype.code, q.dtype.bits, (int)q.t.device.type);
            for (int d = 0; d < q.ndim; ++d) fprintf(stderr, " %lld", (long long)q.shape[d]);
            fprintf(stderr, " strides%s", q.explicit_strides ? "" : " (NULL)");
            for (int d = 0; d < q.ndim; ++d) fprintf(stderr, " %lld", (long long)q.strides[d]);
            fprintf(stderr, " span %lld bytes from %lld, first %p\n", (long long)q.bytes, (long long)q.lo, (void*)q.first);
        }
    }

    // After WKV_OK: the output elements may have changed and must all have been written.
    FZ_NOCOV void allow_outputs() {
        for (int i = T_O; i < T_COUNT; ++i) {
            Plan& q = p[i];
            if (!q.present || !q.real) continue;
            Region& g = regs.r[(size_t)q.region];
            uint8_t pat[8];
            poison_pattern(q.es, q.dtype.code, pat);
            int64_t unwritten = 0, total = 0;
            for_each(q, [&](uint8_t* at) FZ_NOCOV {
                for (int k = 0; k < q.es; ++k) g.may_write[(size_t)(at - g.start) + (size_t)k] = 1;
                ++total;
                if (memcmp(at, pat, (size_t)q.es) == 0) ++unwritten;
            });
            FZ_CHECK(unwritten == 0, "wkv_attention returned WKV_OK but left %lld of %lld elements of %s unwritten",
                     (long long)unwritten, (long long)total, kNames[i]);
        }
    }

    FZ_NOCOV float at(int i, int64_t b, int64_t t, int64_t h, int64_t d) const {
        const Plan& q = p[i];
        return to_float(q.first + q.es * (b * q.strides[0] + t * q.strides[1] + h * q.strides[2] + d * q.strides[3]),
                        q.dtype);
    }

    // The float64 definition (wkv.h) against the output, on sane data.
    FZ_NOCOV void check_values() {
        if (!sane || !p[T_O].real) return;
        const double tol = p[T_O].dtype.bits == 32 ? 2e-5 : p[T_O].dtype.code == WKV_DTYPE_CODE_BFLOAT ? 1.6e-2 : 2e-3;
        const double sc = scale != 0.0f ? (double)scale : 1.0 / std::sqrt((double)D);
        const int64_t seqs = num_seqs > 0 ? num_seqs : B, group = Hq / Hkv;
        std::vector<double> s((size_t)Tk + 1), acc((size_t)D);
        for (int64_t sq = 0; sq < seqs; ++sq) {
            const int64_t b = num_seqs > 0 ? 0 : sq;
            const int64_t q0 = num_seqs > 0 ? qoff[sq] : 0, q1 = num_seqs > 0 ? qoff[sq + 1] : Tq;
            const int64_t k0 = num_seqs > 0 ? koff[sq] : 0, k1 = num_seqs > 0 ? koff[sq + 1] : Tk;
            for (int64_t h = 0; h < Hq; ++h)
                for (int64_t t = q0; t < q1; ++t) {
                    int64_t last = causal ? std::min(k1 - 1, k0 + (t - q0) + ((k1 - k0) - (q1 - q0))) : k1 - 1;
                    // float32 logits carry an error of about eps * |scale| * sum |q_d k_d|: the
                    // tolerance grows with it (and with |v|), a wrong key or mask is off by O(1)
                    double m = -INFINITY, sum = 0, mag = 0, vmax = 0;
                    for (int64_t j = k0; j <= last; ++j) {
                        double dot = 0, absdot = 0;
                        for (int64_t d = 0; d < D; ++d) {
                            double x = (double)at(T_Q, b, t, h, d) * at(T_K, b, j, h / group, d);
                            dot += x, absdot += std::fabs(x);
                            vmax = std::max(vmax, (double)std::fabs(at(T_V, b, j, h / group, d)));
                        }
                        s[(size_t)(j - k0)] = sc * dot;
                        m = std::max(m, sc * dot);
                        mag = std::max(mag, std::fabs(sc) * absdot);
                    }
                    const double slack = 4e-7 * mag * (1 + vmax);
                    std::fill(acc.begin(), acc.end(), 0.0);
                    for (int64_t j = k0; j <= last; ++j) {
                        double e = std::exp(s[(size_t)(j - k0)] - m);
                        sum += e;
                        for (int64_t d = 0; d < D; ++d) acc[(size_t)d] += e * at(T_V, b, j, h / group, d);
                    }
                    for (int64_t d = 0; d < D; ++d) {
                        double want = last < k0 ? 0.0 : acc[(size_t)d] / sum, got = at(T_O, b, t, h, d);
                        FZ_CHECK(std::fabs(got - want) <= tol * (1 + std::fabs(want)) + slack,
                                 "wkv_attention: o[%lld, %lld, %lld, %lld] = %.8g, the float64 definition "
                                 "gives %.8g (B=%lld Tq=%lld Tk=%lld Hq=%lld Hkv=%lld D=%lld causal %d, "
                                 "num_seqs %lld)", (long long)b, (long long)t, (long long)h, (long long)d, got,
                                 want, (long long)B, (long long)Tq, (long long)Tk, (long long)Hq,
                                 (long long)Hkv, (long long)D, (int)causal, (long long)num_seqs);
                    }
                    if (p[T_LSE].present && p[T_LSE].real) {
                        const Plan& l = p[T_LSE];
                        float got;
                        memcpy(&got, l.first + 4 * (b * l.strides[0] + h * l.strides[1] + t * l.strides[2]), 4);
                        if (last < k0) FZ_CHECK(std::isinf(got) && got < 0, "lse of a row without keys is %g, not -inf", got);
                        else FZ_CHECK(std::fabs(got - (m + std::log(sum))) <= 1e-5 * (1 + std::fabs(m)) + 4e-7 * mag,
                                      "lse[%lld, %lld, %lld] = %.8g, the float64 definition gives %.8g",
                                      (long long)b, (long long)h, (long long)t, (double)got, m + std::log(sum));
                    }
                }
        }
    }

    // ------------------------------------------------------------------------ the backward
    // After a forward that returned WKV_OK: wkv_attention_backward on the same descriptor (its o
    // and lse now inputs), with dout / dlse / dq / dk / dv as byte kBwd and on ask.
    Plan g[G_COUNT];
    Verdict bverdict;
    wkv_attention_backward_desc* bdesc = nullptr;
    bool bdesc_null = false;

    bool backward_wanted() const { return in.u8(kBwd) % 4 != 0; }

    static void contiguous(Plan& t, bool heads_first) {
        int order[4] = {0, 1, 2, 3};
        if (heads_first && t.ndim == 4) order[1] = 2, order[2] = 1;  // [B, H, T, D] in memory
        int64_t s = 1;
        for (int d = t.ndim - 1; d >= 0; --d) t.strides[order[d]] = s, s *= std::max<int64_t>(t.shape[order[d]], 1);
        t.explicit_strides = heads_first && t.ndim == 4;
    }

    // false: skip the backward (a valid call whose tensor does not fit a slot).
    bool setup_backward() {
        const uint8_t mode = in.u8(kBwd) % 4, defect = in.u8(kBwd + 1) % 14, axis = in.u8(kBwd + 2) % 4;
        bverdict = verdict;  // the forward's, VALID or UNKNOWN: it returned WKV_OK
        if (!p[T_LSE].present) bverdict.invalid("a backward of a forward without lse");
        const wkv_dtype io = p[T_Q].dtype;
        const int64_t qs[4] = {B, Tq, Hq, D}, kvs[4] = {B, Tk, Hkv, D}, ls[3] = {B, Hq, Tq};
        for (int i = 0; i < G_COUNT; ++i) {
            Plan& t = g[i];
            t.output = i >= G_DQ;
            t.ndim = i == G_DLSE ? 3 : 4;
            memcpy(t.shape, i == G_DLSE ? ls : i == G_DK || i == G_DV ? kvs : qs, 8 * (size_t)t.ndim);
            t.dtype = i == G_DLSE ? WKV_DTYPE_F32 : io;
        }
        g[G_DLSE].present = mode >= 2;
        const bool f16 = io.code == WKV_DTYPE_CODE_FLOAT && io.bits == 16;
        switch (defect) {
        case 1: g[G_DQ].shape[axis] += 1, bverdict.invalid("dq's shape is not q's"); break;
        case 2: g[G_DK].dtype = f16 ? WKV_DTYPE_BF16 : WKV_DTYPE_F16, bverdict.invalid("dk's dtype is not q's"); break;
        case 3: g[G_DOUT].present = false, bverdict.invalid("dout.data NULL"); break;
        case 4: if (g[G_DLSE].present) g[G_DLSE].dtype = WKV_DTYPE_F16, bverdict.invalid("dlse not float32"); break;
        case 5: if (g[G_DLSE].present) g[G_DLSE].shape[2] += 1, bverdict.invalid("dlse one row too long"); break;
        case 9: bverdict.invalid("struct_size - 1"); break;
        case 10: bverdict.invalid("forward NULL"); break;
        case 11: bdesc_null = true, bverdict.invalid("desc NULL"); break;
        case 12: bverdict.invalid("dv on a CUDA device"); break;
        case 13: g[G_DQ].ndim = 3, bverdict.invalid("dq.ndim 3"); break;
        default: break;
        }
        Arena& A = Arena::get();
        for (int i = 0; i < G_COUNT; ++i) {
            Plan& t = g[i];
            t.es = t.dtype.bits / 8;
            contiguous(t, mode == 3 && i != G_DLSE);
            if (!t.present) continue;
            int64_t n = 1;
            for (int d = 0; d < t.ndim; ++d) n *= std::max<int64_t>(t.shape[d], 0);
            t.bytes = n * t.es;
            if (t.bytes > (int64_t)(kBig - 64)) {
                if (bverdict.v != INVALID) return false;
                t.first = A.trap + 512 * (size_t)i;
                continue;
            }
            t.region = regs.place(big(), kBig, (size_t)t.bytes, 0, kGradNames[i]);
            t.first = regs.r[(size_t)t.region].start;
            t.real = n > 0;
        }
        // aliasing: dq on q, dv on dout, dk on dv (where the moved tensor fits)
        auto share = [&](Plan& x, const Plan& y, int region) {
            if (!x.real || !y.real || x.es != y.es || region < 0 || x.bytes > (int64_t)regs.r[(size_t)region].len)
                return false;
            x.first = y.first, x.region = region;
            return true;
        };
        if (defect == 6 && p[T_Q].lo == 0 && share(g[G_DQ], p[T_Q], p[T_Q].region)) bverdict.invalid("dq aliases q");
        if (defect == 7 && share(g[G_DV], g[G_DOUT], g[G_DOUT].region)) bverdict.invalid("dv aliases dout");
        if (defect == 8 && share(g[G_DK], g[G_DV], g[G_DV].region)) bverdict.invalid("dk aliases dv");
        Rng rng(in.u32(kBwd + 4));
        const uint8_t data = in.u8(32) % 4;
        for (int i = 0; i < G_COUNT; ++i) {
            Plan& t = g[i];
            if (!t.real || !t.present) continue;
            uint8_t pat[8];
            poison_pattern(t.es, t.dtype.code, pat);
            for_each(t, [&](uint8_t* at) FZ_NOCOV {
                if (t.output) {
                    memcpy(at, pat, (size_t)t.es);
                    return;
                }
                float f = rng.uniform(-1.0f, 1.0f);
                if (data == 2 && rng.next() % 97 == 0) f = (rng.next() & 1) ? NAN : INFINITY;
                from_float(at, t.dtype, f);
            });
        }
        // the descriptor
        for (int i = 0; i < G_COUNT; ++i) {
            Plan& t = g[i];
            t.t = wkv_tensor{};
            if (!t.present) continue;
            t.t.data = t.first;
            t.t.device = wkv_device{i == G_DV && defect == 12 ? WKV_DEVICE_CUDA : WKV_DEVICE_CPU, 0};
            t.t.ndim = t.ndim;
            t.t.dtype = t.dtype;
            t.t.shape = array(t.shape, t.ndim, kGradNames[i]);
            t.t.strides = t.explicit_strides ? array(t.strides, t.ndim, kGradNames[i]) : nullptr;
        }
        const size_t sz = sizeof(wkv_attention_backward_desc);
        int ri = regs.place(big(), kBig, sz, 0, "the attention backward descriptor");
        bdesc = (wkv_attention_backward_desc*)regs.r[(size_t)ri].start;
        memset((void*)bdesc, 0, sz);
        bdesc->struct_size = defect == 9 ? sz - 1 : sz;
        bdesc->forward = defect == 10 ? nullptr : desc;
        bdesc->dout = g[G_DOUT].t, bdesc->dlse = g[G_DLSE].t;
        bdesc->dq = g[G_DQ].t, bdesc->dk = g[G_DK].t, bdesc->dv = g[G_DV].t;
        return true;
    }

    FZ_NOCOV void allow_gradients() {
        for (int i = G_DQ; i < G_COUNT; ++i) {
            Plan& t = g[i];
            if (!t.real) continue;
            Region& r = regs.r[(size_t)t.region];
            uint8_t pat[8];
            poison_pattern(t.es, t.dtype.code, pat);
            int64_t unwritten = 0, total = 0;
            for_each(t, [&](uint8_t* at) FZ_NOCOV {
                for (int k = 0; k < t.es; ++k) r.may_write[(size_t)(at - r.start) + (size_t)k] = 1;
                ++total;
                if (memcmp(at, pat, (size_t)t.es) == 0) ++unwritten;
            });
            FZ_CHECK(unwritten == 0, "wkv_attention_backward returned WKV_OK but left %lld of %lld elements of %s "
                     "unwritten", (long long)unwritten, (long long)total, kGradNames[i]);
        }
    }

    FZ_NOCOV double grad_at(int i, int64_t b, int64_t t, int64_t h, int64_t d) const {
        const Plan& q = g[i];
        if (i == G_DLSE) {
            if (!q.present || !q.real) return 0.0;
            return to_float(q.first + 4 * (b * q.strides[0] + h * q.strides[1] + t * q.strides[2]), q.dtype);
        }
        return to_float(q.first + q.es * (b * q.strides[0] + t * q.strides[1] + h * q.strides[2] + d * q.strides[3]),
                        q.dtype);
    }

    // The gradients of the float64 definition against dq, dk, dv, on sane data: with P the
    // softmax, delta = dout . o - dlse per row, dS = P (dout . v - delta):
    // dq = scale dS k, dk = scale dS^T q, dv = P^T dout.
    FZ_NOCOV void check_gradients() {
        if (!sane) return;
        const bool f32 = p[T_Q].dtype.bits == 32, bf16 = p[T_Q].dtype.code == WKV_DTYPE_CODE_BFLOAT;
        const double tol = f32 ? (in.u8(32) % 4 == 1 ? 1e-3 : 1e-4) : bf16 ? 6e-2 : 1e-2;
        const double sc = scale != 0.0f ? (double)scale : 1.0 / std::sqrt((double)D);
        const int64_t seqs = num_seqs > 0 ? num_seqs : B, group = Hq / Hkv;
        auto qi = [&](int64_t b, int64_t t, int64_t h) { return (size_t)(((b * Tq + t) * Hq + h) * D); };
        auto ki = [&](int64_t b, int64_t t, int64_t h) { return (size_t)(((b * Tk + t) * Hkv + h) * D); };
        std::vector<double> dq((size_t)(B * Tq * Hq * D)), dk((size_t)(B * Tk * Hkv * D)), dv(dk.size());
        // The backward reads o as the forward stored it, rounded to the I/O dtype: delta is off
        // by up to eps * sum |dout o|, and dS by P times that; slack_* carry what that does to
        // dq and dk, element by element.
        const double eps = f32 ? 1e-6 : bf16 ? 8e-3 : 1e-3;
        std::vector<double> slack_dq(dq.size()), slack_dk(dk.size());
        std::vector<double> s((size_t)Tk + 1), o((size_t)D);
        for (int64_t sq = 0; sq < seqs; ++sq) {
            const int64_t b = num_seqs > 0 ? 0 : sq;
            const int64_t q0 = num_seqs > 0 ? qoff[sq] : 0, q1 = num_seqs > 0 ? qoff[sq + 1] : Tq;
            const int64_t k0 = num_seqs > 0 ? koff[sq] : 0, k1 = num_seqs > 0 ? koff[sq + 1] : Tk;
            for (int64_t h = 0; h < Hq; ++h) {
                const int64_t hk = h / group;
                for (int64_t t = q0; t < q1; ++t) {
                    const int64_t last = causal ? std::min(k1 - 1, k0 + (t - q0) + ((k1 - k0) - (q1 - q0))) : k1 - 1;
                    if (last < k0) continue;
                    double m = -INFINITY, sum = 0;
                    for (int64_t j = k0; j <= last; ++j) {
                        double dot = 0;
                        for (int64_t d = 0; d < D; ++d) dot += (double)at(T_Q, b, t, h, d) * at(T_K, b, j, hk, d);
                        s[(size_t)(j - k0)] = sc * dot, m = std::max(m, sc * dot);
                    }
                    for (int64_t j = k0; j <= last; ++j) sum += std::exp(s[(size_t)(j - k0)] - m);
                    std::fill(o.begin(), o.end(), 0.0);
                    for (int64_t j = k0; j <= last; ++j) {
                        double pj = std::exp(s[(size_t)(j - k0)] - m) / sum;
                        s[(size_t)(j - k0)] = pj;
                        for (int64_t d = 0; d < D; ++d) o[(size_t)d] += pj * at(T_V, b, j, hk, d);
                    }
                    double delta = -grad_at(G_DLSE, b, t, h, 0), delta_err = 0;
                    for (int64_t d = 0; d < D; ++d) {
                        delta += grad_at(G_DOUT, b, t, h, d) * o[(size_t)d];
                        delta_err += eps * std::fabs(grad_at(G_DOUT, b, t, h, d) * o[(size_t)d]);
                    }
                    for (int64_t j = k0; j <= last; ++j) {
                        const double pj = s[(size_t)(j - k0)];
                        double dp = 0;
                        for (int64_t d = 0; d < D; ++d) dp += grad_at(G_DOUT, b, t, h, d) * at(T_V, b, j, hk, d);
                        const double ds = pj * (dp - delta);
                        for (int64_t d = 0; d < D; ++d) {
                            dq[qi(b, t, h) + (size_t)d] += sc * ds * at(T_K, b, j, hk, d);
                            dk[ki(b, j, hk) + (size_t)d] += sc * ds * at(T_Q, b, t, h, d);
                            slack_dq[qi(b, t, h) + (size_t)d] += std::fabs(sc * pj * delta_err * at(T_K, b, j, hk, d));
                            slack_dk[ki(b, j, hk) + (size_t)d] += std::fabs(sc * pj * delta_err * at(T_Q, b, t, h, d));
                            dv[ki(b, j, hk) + (size_t)d] += pj * grad_at(G_DOUT, b, t, h, d);
                        }
                    }
                }
            }
        }
        // each gradient against its own largest element: a missing or extra key is off by a
        // share of it; rounding of the 16-bit outputs and of the stored o stays well inside
        const std::vector<double>* want[3] = {&dq, &dk, &dv};
        const std::vector<double>* slack[3] = {&slack_dq, &slack_dk, nullptr};
        for (int k = 0; k < 3; ++k) {
            const int i = G_DQ + k;
            if (!g[i].real) continue;
            const int64_t T = i == G_DQ ? Tq : Tk, H = i == G_DQ ? Hq : Hkv;
            double top = 0;
            for (double x : *want[k]) top = std::max(top, std::fabs(x));
            for (int64_t b = 0; b < B; ++b)
                for (int64_t t = 0; t < T; ++t)
                    for (int64_t h = 0; h < H; ++h)
                        for (int64_t d = 0; d < D; ++d) {
                            const size_t e = (size_t)(((b * T + t) * H + h) * D + d);
                            const double w = (*want[k])[e], got = grad_at(i, b, t, h, d);
                            const double sl = slack[k] ? 2 * (*slack[k])[e] : 0.0;
                            FZ_CHECK(std::fabs(got - w) <= tol * top + sl + 1e-6,
                                     "wkv_attention_backward: %s[%lld, %lld, %lld, %lld] = %.8g, the float64 "
                                     "gradient gives %.8g (largest %.3g; B=%lld Tq=%lld Tk=%lld Hq=%lld Hkv=%lld "
                                     "D=%lld causal %d, num_seqs %lld, dlse %d)", kGradNames[i], (long long)b,
                                     (long long)t, (long long)h, (long long)d, got, w, top, (long long)B,
                                     (long long)Tq, (long long)Tk, (long long)Hq, (long long)Hkv, (long long)D,
                                     (int)causal, (long long)num_seqs, (int)g[G_DLSE].present);
                        }
        }
    }

    FZ_NOCOV void run_backward(Stats& stats) {
        regs.disarm();
        if (!setup_backward()) return stats.skipped++, void();
        regs.arm();  // every region again: the forward's outputs are inputs now
        if (getenv("WKV_FUZZ_DUMP"))
            fprintf(stderr, "wkv_attention_backward: mode %d defect %d dlse %s verdict %s (%s)\n",
                    in.u8(kBwd) % 4, in.u8(kBwd + 1) % 14, g[G_DLSE].present ? "given" : "absent",
                    vname(bverdict.v), bverdict.why);
        wkv_status st = wkv_attention_backward(ctx, bdesc_null ? nullptr : bdesc);
        check_status(st, "wkv_attention_backward");
        check_message(wkv_last_error(ctx), st == WKV_OK, "wkv_attention_backward");
        stats.calls[bverdict.v][st]++;
        if (bverdict.v == VALID)
            FZ_CHECK(st == WKV_OK, "wkv_attention_backward refused a valid call (%s): %s", wkv_status_string(st),
                     wkv_last_error(ctx));
        if (bverdict.v == INVALID)
            FZ_CHECK(st != WKV_OK, "wkv_attention_backward accepted an invalid call (%s)", bverdict.why);
        if (st == WKV_OK) {
            allow_gradients();
            check_gradients();
        }
        regs.verify(st == WKV_OK, "wkv_attention_backward");
    }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    Stats& stats = Stats::get();
    Case c(data, size);
    if (!c.setup()) return stats.skipped++, -1;
    c.regs.arm();
    c.dump();
    wkv_status st = wkv_attention(c.ctx, c.desc_null ? nullptr : c.desc);
    check_status(st, "wkv_attention");
    check_message(wkv_last_error(c.ctx), st == WKV_OK, "wkv_attention");
    stats.calls[c.verdict.v][st]++;
    if (c.verdict.v == VALID)
        FZ_CHECK(st == WKV_OK, "wkv_attention refused a valid call (%s): %s", wkv_status_string(st), wkv_last_error(c.ctx));
    if (c.verdict.v == INVALID)
        FZ_CHECK(st != WKV_OK, "wkv_attention accepted an invalid call (%s)", c.verdict.why);
    if (st == WKV_OK) {
        c.allow_outputs();
        c.check_values();
    }
    c.regs.verify(st == WKV_OK, "wkv_attention");
    if (st == WKV_OK && c.twice && c.p[T_O].real) {  // the same call again: bit-identical outputs
        const Region& o = c.regs.r[(size_t)c.p[T_O].region];
        std::vector<uint8_t> first(o.start, o.start + o.len);
        st = wkv_attention(c.ctx, c.desc);
        FZ_CHECK(st == WKV_OK, "wkv_attention: the same call failed the second time (%d)", (int)st);
        FZ_CHECK(!memcmp(first.data(), o.start, o.len), "wkv_attention: o differs between two identical calls");
    }
    if (st == WKV_OK && c.ctx && c.backward_wanted()) c.run_backward(stats);
    c.regs.disarm();
    return 0;
}
