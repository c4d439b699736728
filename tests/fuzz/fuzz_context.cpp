// libFuzzer harness: wkv_context_create / wkv_context_destroy with arbitrary options, then the
// calls a fresh context must survive (a small forward, the buffer API the CPU backend lacks,
// synchronize), and the context-free queries (wkv_backend_get_info, wkv_device_get_info,
// wkv_status_string) with arbitrary arguments. No plugin is present in the fuzz build, so
// CUDA and Vulkan are unavailable and AUTO means the CPU. Leaks are LeakSanitizer reports.
#include <dlfcn.h>

#include "fuzz_common.h"

using namespace fz;

extern "C" {
wkv_status fz_backend_get_info(int32_t backend, wkv_backend_info* out);
wkv_status fz_device_get_info(int32_t backend, int32_t index, wkv_device_info* out);
const char* fz_status_string(int32_t status);
}

namespace {

struct LogSink {
    int calls = 0;
};
void log_fn(void* user, wkv_log_level level, const char* msg) {
    FZ_CHECK(user != nullptr, "log: user_data lost");
    FZ_CHECK(level >= WKV_LOG_ERROR && level <= WKV_LOG_DEBUG, "log: level %d", (int)level);
    FZ_CHECK(msg && strnlen(msg, 8192) < 8192, "log: message NULL or unterminated");
    ((LogSink*)user)->calls++;
}

struct Pf {
    int calls = 0;
    uint32_t piece = 1;
};
Pf g_pf_null;  // parallel_for_user_data may be NULL
void pf_fn(void* user, int64_t n, wkv_task_fn fn, void* task) {
    Pf* pf = user ? (Pf*)user : &g_pf_null;
    FZ_CHECK(n >= 0, "parallel_for: n = %lld", (long long)n);
    pf->calls++;
    for (int64_t b = 0; b < n; b += pf->piece) fn(task, b, std::min<int64_t>(n, b + pf->piece));
}

// A valid 1x3x2x4 RWKV-7 forward on ctx; must succeed.
void small_forward(wkv_context* ctx) {
    enum { B = 1, T = 3, H = 2, N = 4, E = B * T * H * N };
    static float r[E], w[E], k[E], v[E], a[E], b[E], y[E];
    for (int i = 0; i < E; ++i) r[i] = k[i] = v[i] = 0.1f * (float)(i % 7), w[i] = 0.9f, a[i] = b[i] = 0;
    int64_t shape[4] = {B, T, H, N};
    wkv_forward_desc f;
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof f;
    f.op = WKV_OP_RWKV7;
    f.decay_form = WKV_DECAY_DIRECT;
    f.r = wkv_tensor_make(r, WKV_DTYPE_F32, 4, shape);
    f.w = wkv_tensor_make(w, WKV_DTYPE_F32, 4, shape);
    f.k = wkv_tensor_make(k, WKV_DTYPE_F32, 4, shape);
    f.v = wkv_tensor_make(v, WKV_DTYPE_F32, 4, shape);
    f.a = wkv_tensor_make(a, WKV_DTYPE_F32, 4, shape);
    f.b = wkv_tensor_make(b, WKV_DTYPE_F32, 4, shape);
    f.y = wkv_tensor_make(y, WKV_DTYPE_F32, 4, shape);
    wkv_status st = wkv_forward(ctx, &f);
    FZ_CHECK(st == WKV_OK, "a small valid forward on a fresh context failed: %s", wkv_last_error(ctx));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    Bytes in{data, size};
    Arena& A = Arena::get();
    Regions regs;
    Verdict V;

    // ---- options, in a guarded slot (struct_size may claim more bytes than the struct)
    wkv_context_options o;
    memset(&o, 0, sizeof o);
    size_t sz = sizeof o, bytes = sz, field = sz;
    bool tail = false, opts_null = false, out_null = false;
    switch (in.u8(0) & 15) {
    case 1: field = sz - 1; V.invalid("struct_size small"); break;
    case 2: field = 0; V.invalid("struct_size 0"); break;
    case 3: field = bytes = sz + 32; break;
    case 4: field = bytes = sz + 32; tail = true; V.invalid("tail set"); break;
    case 5: field = (size_t)1 << 17; V.invalid("struct_size huge"); break;
    case 6: opts_null = true; break;  // defaults
    case 7: out_null = true; V.invalid("out NULL"); break;
    case 8: field = SIZE_MAX; V.invalid("struct_size SIZE_MAX"); break;
    default: break;
    }
    o.struct_size = field;
    bool unavailable = false;
    int32_t backend = WKV_BACKEND_CPU;
    switch (in.u8(1) & 7) {
    case 0: backend = WKV_BACKEND_CPU; break;
    case 1: backend = WKV_BACKEND_AUTO; break;
    case 2: backend = WKV_BACKEND_CUDA; unavailable = true; break;
    case 3: backend = WKV_BACKEND_VULKAN; unavailable = true; break;
    case 4: backend = WKV_BACKEND_COUNT_; V.invalid("backend 4"); break;
    case 5: backend = -1; V.invalid("backend -1"); break;
    default:
        backend = (int32_t)in.u32(2);
        if (backend == 2 || backend == 3) unavailable = true;
        else if (backend != 0 && backend != 1) V.invalid("backend raw");
    }
    memcpy(&o.backend, &backend, sizeof backend);
    switch (in.u8(6) & 3) {
    case 0: o.device_index = 0; break;
    case 1: o.device_index = 1; V.unknown("device_index 1 on the CPU"); break;
    case 2: o.device_index = -1; V.invalid("device_index -1"); break;
    default: o.device_index = (int32_t)in.u32(7); if (o.device_index < 0) V.invalid("device_index < 0");
        else if (o.device_index) V.unknown("device_index on the CPU"); break;
    }
    int32_t threads = 1;
    switch (in.u8(11) & 7) {
    case 0: threads = 1; break;
    case 1: threads = 2; break;
    case 2: threads = 0; break;  // WKV_NUM_THREADS or all cores
    case 3: threads = 1025; V.invalid("cpu_threads 1025"); break;
    case 4: threads = -1; V.invalid("cpu_threads -1"); break;
    case 5: threads = 1024; break;  // valid, but 1024 threads per input is too slow: skipped below
    case 6: threads = 3; break;
    default: threads = (int32_t)in.u32(12); if (threads < 0 || threads > 1024) V.invalid("cpu_threads raw"); break;
    }
    o.cpu_threads = threads;
    Pf pf;
    pf.piece = 1 + in.u8(16) % 5;
    switch (in.u8(17) & 3) {
    case 1: o.parallel_for = pf_fn; o.parallel_for_user_data = &pf; break;
    case 2: o.parallel_for_user_data = &pf; V.invalid("user_data without parallel_for"); break;
    case 3: o.parallel_for = pf_fn; o.parallel_for_user_data = nullptr; break;  // user_data may be NULL
    default: break;
    }
    LogSink sink;
    if (in.u8(18) & 1) o.log = log_fn, o.log_user_data = &sink;
    int32_t level = 0;  // raw int32s, stored with memcpy: C++ may not hold out-of-range enums
    switch ((in.u8(18) >> 1) & 7) {
    case 0: level = 0; break;
    case 1: case 2: case 3: case 4: level = (in.u8(18) >> 1) & 7; break;
    case 5: level = 5; V.invalid("log_level 5"); break;
    case 6: level = -1; V.invalid("log_level -1"); break;
    default: level = (int32_t)in.u32(19); if (level < 0 || level > 4) V.invalid("log_level raw"); break;
    }
    memcpy(&o.log_level, &level, sizeof level);
    if (opts_null) {  // NULL options: defaults, whatever was decoded
        V = Verdict();
        threads = 0;
        unavailable = false;
    }
    int effective_threads = threads == 0 ? 2 : threads;
    if (V.v != INVALID && (effective_threads > 8 || (o.parallel_for && effective_threads > 64)))
        return -1;  // valid but too many threads to start per input

    int ri = regs.place(A.big[0], kBig, bytes, 0, "the options");
    uint8_t* mem = regs.r[(size_t)ri].start;
    memset(mem, 0, bytes);
    memcpy(mem, &o, sizeof o);
    if (tail) mem[sz + in.u8(23) % 32] = (uint8_t)(1 + in.u8(24) % 255);
    int oi = regs.place(A.small[0], kSmall, sizeof(wkv_context*), 0, "*out");
    memset(regs.r[(size_t)oi].start, 0xA5, sizeof(wkv_context*));
    regs.arm();

    wkv_context** outp = out_null ? nullptr : (wkv_context**)regs.r[(size_t)oi].start;
    wkv_status st = wkv_context_create(opts_null ? nullptr : (const wkv_context_options*)mem, outp);
    check_status(st, "wkv_context_create");
    check_message(wkv_last_error(nullptr), st == WKV_OK, "wkv_context_create");
    if (V.v == INVALID) FZ_CHECK(st != WKV_OK, "wkv_context_create accepted invalid options (%s)", V.why);
    else if (unavailable) FZ_CHECK(st == WKV_ERROR_BACKEND_UNAVAILABLE, "wkv_context_create: a backend "
                                   "without its plugin gave %d, expected BACKEND_UNAVAILABLE", (int)st);
    else if (V.v == VALID) FZ_CHECK(st == WKV_OK, "wkv_context_create rejected valid options: %s",
                                    wkv_last_error(nullptr));
    // *out: NULL on failure (documented), the context on success; nothing else touched
    std::fill(regs.r[(size_t)oi].may_write.begin(), regs.r[(size_t)oi].may_write.end(), 1);
    regs.verify(true, "wkv_context_create");
    if (outp) {
        if (st != WKV_OK) FZ_CHECK(*outp == nullptr, "wkv_context_create failed but *out is not NULL");
        else FZ_CHECK(*outp != nullptr, "wkv_context_create: WKV_OK but *out is NULL");
    }
    wkv_context* ctx = st == WKV_OK && outp ? *outp : nullptr;
    regs.disarm();

    if (ctx) {
        FZ_CHECK(wkv_context_backend(ctx) == WKV_BACKEND_CPU, "a context without GPU plugins is on backend %d",
                 (int)wkv_context_backend(ctx));
        check_message(wkv_last_error(ctx), true, "a fresh context");
        if (in.u8(25) & 1) small_forward(ctx);
        wkv_buffer* buf = (wkv_buffer*)0x1;
        wkv_status bs = wkv_buffer_create(ctx, 1 + in.u8(26), &buf);
        check_status(bs, "wkv_buffer_create");
        FZ_CHECK(bs == WKV_ERROR_UNSUPPORTED, "wkv_buffer_create on the CPU backend returned %d", (int)bs);
        wkv_buffer_destroy(nullptr);
        FZ_CHECK(wkv_buffer_size(nullptr) == 0, "wkv_buffer_size(NULL) != 0");
        check_message(wkv_last_error(ctx), false, "wkv_buffer_create");
        // wkv_context_synchronize, where this libwkv has it: a no-op on the CPU backend
        typedef wkv_status (*sync_fn)(wkv_context*);
        static sync_fn sync = (sync_fn)dlsym(RTLD_DEFAULT, "wkv_context_synchronize");
        if (sync) FZ_CHECK(sync(ctx) == WKV_OK, "wkv_context_synchronize on the CPU failed");
        if (in.u8(25) & 2) small_forward(ctx);
    }
    wkv_context_destroy(ctx);
    wkv_context_destroy(nullptr);

    // ---- context-free queries with arbitrary arguments
    {
        int32_t be_raw = in.u8(27) < 8 ? in.u8(27) % 5 : (int32_t)in.u32(28);
        wkv_backend_info info;
        memset(&info, 0, sizeof info);
        uint8_t iss = in.u8(32) & 3;
        info.struct_size = iss == 0 ? sizeof info : iss == 1 ? sizeof info - 1 : iss == 2 ? 0 : sizeof info;
        wkv_status is = fz_backend_get_info(be_raw, iss == 3 ? nullptr : &info);
        check_status(is, "wkv_backend_get_info");
        check_message(wkv_last_error(nullptr), is == WKV_OK, "wkv_backend_get_info");
        if (is == WKV_OK) {
            FZ_CHECK(info.name && strnlen(info.name, 256) < 256, "backend info: name");
            FZ_CHECK(info.reason && strnlen(info.reason, 4096) < 4096, "backend info: reason");
            FZ_CHECK(info.num_head_sizes >= 0 && info.num_head_sizes <= WKV_MAX_HEAD_SIZES, "head sizes");
        } else {
            FZ_CHECK(iss != 0 || (be_raw != WKV_BACKEND_CPU && be_raw != WKV_BACKEND_CUDA &&
                                  be_raw != WKV_BACKEND_VULKAN),
                     "wkv_backend_get_info(%d) failed with a correct struct", (int)be_raw);
        }
        wkv_device_info dev;
        memset(&dev, 0, sizeof dev);
        uint8_t dss = in.u8(33) & 3;
        dev.struct_size = dss == 1 ? 3 : sizeof dev;
        int32_t idx = (in.u8(34) & 0x80) ? (int32_t)in.u32(35) : in.u8(34) % 3;
        wkv_status ds = fz_device_get_info(be_raw, idx, dss == 2 ? nullptr : &dev);
        check_status(ds, "wkv_device_get_info");
        check_message(wkv_last_error(nullptr), ds == WKV_OK, "wkv_device_get_info");
        if (ds == WKV_OK) FZ_CHECK(strnlen(dev.name, sizeof dev.name) < sizeof dev.name, "device name unterminated");
        const char* s = fz_status_string((int32_t)in.u32(39));
        FZ_CHECK(s && strnlen(s, 512) < 512, "wkv_status_string of an unknown value");
        FZ_CHECK(wkv_version() == WKV_VERSION, "wkv_version");
        FZ_CHECK(wkv_version_string() && wkv_build_info(), "version strings");
    }
    return 0;
}
