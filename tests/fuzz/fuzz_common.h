// Shared machinery of the libFuzzer harnesses (tests/fuzz/README.md has the input format).
//
// The harnesses turn arbitrary bytes into wkv_forward / wkv_backward descriptors and check one
// property on every call: the library returns a status and touches nothing it was not given.
//
//   - Every byte the harness hands the library (tensor data, shape and stride arrays, packed
//     offsets, the descriptors themselves, the workspace) lives in a slot of a guarded arena:
//     a PROT_NONE page after every slot, the unused bytes of the slot poisoned for ASan and
//     filled with a canary. A read or write outside what was given is a crash or an ASan
//     report.
//   - Pointers that are never valid (tensors whose byte span overflows, wraps the address space
//     or is larger than any slot) point into a PROT_NONE trap region: the library must reject
//     the call before it dereferences them.
//   - Every given byte is snapshotted before the call. After it, only the bytes of the output
//     tensors' elements (and the workspace) may differ, and only when the status is WKV_OK.
//     Output elements are poisoned with a signalling-NaN pattern first: after WKV_OK every
//     output element must have been written.
//   - Each decoded descriptor is classified VALID (the header's rules say it must run),
//     INVALID (they say it must be rejected) or UNKNOWN (corner cases the header leaves open).
//     VALID must return WKV_OK and INVALID must not.
//   - Valid descriptors are capped so a call costs <= ~1e6 flops: a valid (or possibly valid)
//     descriptor that is larger than that, or than a slot, is skipped by the harness (the input
//     is rejected from the corpus) instead of being called. Invalid ones of any size are called.
#ifndef WKV_TESTS_FUZZ_COMMON_H
#define WKV_TESTS_FUZZ_COMMON_H

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "wkv/wkv.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#include <sanitizer/asan_interface.h>
#define FZ_ASAN 1
#endif
#endif
#if !defined(FZ_ASAN) && defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define FZ_ASAN 1
#endif
#ifndef FZ_ASAN
#define ASAN_POISON_MEMORY_REGION(a, s) ((void)(a), (void)(s))
#define ASAN_UNPOISON_MEMORY_REGION(a, s) ((void)(a), (void)(s))
#endif

// The harness's own per-byte loops are not worth coverage feedback (and would dominate the run
// time with comparison tracing): they carry FZ_NOCOV.
#if defined(__clang__) && __clang_major__ >= 13
#define FZ_NOCOV __attribute__((no_sanitize("coverage")))
#else
#define FZ_NOCOV
#endif

namespace fz {

[[noreturn]] inline void die(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "\n==wkv-fuzz== PROPERTY VIOLATED: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
    abort();
}
#define FZ_CHECK(cond, ...) \
    do {                     \
        if (!(cond)) ::fz::die(__VA_ARGS__); \
    } while (0)

// ------------------------------------------------------------------------------ input bytes

// Fixed-offset reads; bytes past the end read as 0, and 0 is always the "plain, valid" choice,
// so an empty input is a valid 1x1x1x1 RWKV-7 call.
struct Bytes {
    const uint8_t* p;
    size_t n;
    uint8_t u8(size_t i) const { return i < n ? p[i] : 0; }
    uint16_t u16(size_t i) const { return (uint16_t)(u8(i) | u8(i + 1) << 8); }
    uint32_t u32(size_t i) const { return (uint32_t)u16(i) | (uint32_t)u16(i + 2) << 16; }
    uint64_t u64(size_t i) const { return (uint64_t)u32(i) | (uint64_t)u32(i + 4) << 32; }
};

// The layout (README.md): a 48-byte header, then one 24-byte spec per tensor role, in kRole
// order, then the 24-byte backward/workspace spec.
enum { kHeader = 48, kSpec = 24 };
enum Role {
    R_R, R_W, R_K, R_V, R_A, R_B, R_U, R_Y, R_SIN, R_SOUT,        // forward
    R_DY, R_DSOUT, R_DR, R_DW, R_DK, R_DV, R_DA, R_DB, R_DU, R_DSIN, // backward
    R_COUNT
};
inline const char* role_name(int r) {
    static const char* const n[] = {"r", "w", "k", "v", "a", "b", "u", "y", "state_in", "state_out",
                                    "dy", "dstate_out", "dr", "dw", "dk", "dv", "da", "db", "du",
                                    "dstate_in"};
    return r >= 0 && r < R_COUNT ? n[r] : "?";
}
inline size_t spec_at(int role) { return kHeader + (size_t)role * kSpec; }
inline size_t bwd_spec_at() { return spec_at(R_COUNT); }

// ------------------------------------------------------------------------------ the arena

constexpr size_t kPage = 4096;
constexpr size_t kBig = 512 * 1024;           // tensors, descriptors
constexpr int kBigSlots = 2 * R_COUNT + 4;
constexpr size_t kSmall = kPage;              // shape / stride / offset arrays, out params
constexpr int kSmallSlots = 2 * R_COUNT + 8;
constexpr size_t kWorkspace = 32u << 20;      // the backward workspace (touched lazily)
constexpr size_t kTrap = 1u << 20;            // PROT_NONE: never-valid pointers point here
constexpr size_t kCanary = 256;               // canary bytes checked before each buffer
constexpr uint8_t kCanaryByte = 0xCB;

struct Arena {
    uint8_t* base = nullptr;
    size_t total = 0;
    uint8_t* big[kBigSlots];
    uint8_t* small[kSmallSlots];
    uint8_t* workspace = nullptr;
    uint8_t* trap = nullptr;

    Arena() {
        total = kPage + kBigSlots * (kBig + kPage) + kSmallSlots * (kSmall + kPage) +
                (kWorkspace + kPage) + kTrap + kPage;
        void* m = mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) die("mmap of the arena failed");
        base = (uint8_t*)m;
        uint8_t* at = base + kPage;
        auto take = [&](size_t size) {
            if (mprotect(at, size, PROT_READ | PROT_WRITE) != 0) die("mprotect failed");
            uint8_t* s = at;
            at += size + kPage;  // the guard page after it stays PROT_NONE
            return s;
        };
        for (int i = 0; i < kBigSlots; ++i) big[i] = take(kBig);
        for (int i = 0; i < kSmallSlots; ++i) small[i] = take(kSmall);
        workspace = take(kWorkspace);
        trap = at;  // PROT_NONE
    }
    static Arena& get() {
        static Arena a;
        return a;
    }
};

// A region the harness gave the library: a buffer placed at the end of a slot (within 7 bytes
// of the guard page that follows), the rest of the slot poisoned.
struct Region {
    uint8_t* slot = nullptr;
    size_t slot_size = 0;
    uint8_t* start = nullptr;
    size_t len = 0;
    bool writable_always = false;   // the workspace
    bool snapshot = true;
    std::vector<uint8_t> snap;
    std::vector<uint8_t> may_write;  // per byte: an output element lives here
    const char* what = "";
};

class Regions {
public:
    std::vector<Region> r;
    Regions() { r.reserve(kBigSlots + kSmallSlots + 2); }

    // Places `bytes` bytes at the end of a slot; `mis` (0..7) shifts the start off 8-alignment.
    // Returns the region index.
    int place(uint8_t* slot, size_t slot_size, size_t bytes, size_t mis, const char* what) {
        if (bytes + 16 > slot_size) die("harness: %zu bytes do not fit a slot of %zu", bytes, slot_size);
        uintptr_t end = (uintptr_t)slot + slot_size;
        uintptr_t start = ((end - bytes - mis) & ~(uintptr_t)7) + mis;
        Region g;
        g.slot = slot;
        g.slot_size = slot_size;
        g.start = (uint8_t*)start;
        g.len = bytes;
        g.what = what;
        r.push_back(std::move(g));
        return (int)r.size() - 1;
    }
    // Canary and ASan poison around each region; snapshots. Call after filling.
    FZ_NOCOV void arm(size_t from = 0) {
        for (size_t i = from; i < r.size(); ++i) {
            Region& g = r[i];
            uint8_t* c0 = std::max(g.slot, g.start - kCanary);
            memset(c0, kCanaryByte, (size_t)(g.start - c0));
            uint8_t* tail = g.start + g.len;
            uint8_t* slot_end = g.slot + g.slot_size;
            memset(tail, kCanaryByte, (size_t)(slot_end - tail));
            size_t front = (size_t)(g.start - g.slot);
            // a big front: poison only the part near the buffer (cost), the guard page does the rest
            uint8_t* p0 = front > (64u << 10) ? g.start - (64u << 10) : g.slot;
            ASAN_POISON_MEMORY_REGION(p0, (size_t)(g.start - p0));
            ASAN_POISON_MEMORY_REGION(tail, (size_t)(slot_end - tail));
            if (g.snapshot && !g.writable_always) g.snap.assign(g.start, g.start + g.len);
            g.may_write.assign(g.writable_always ? 0 : g.len, 0);
        }
    }
    void resnap(int i) {
        Region& g = r[(size_t)i];
        if (g.snapshot && !g.writable_always) g.snap.assign(g.start, g.start + g.len);
    }
    void clear_writes() {
        for (Region& g : r) std::fill(g.may_write.begin(), g.may_write.end(), 0);
    }
    void disarm() {
        for (Region& g : r) {
            size_t front = (size_t)(g.start - g.slot);
            uint8_t* p0 = front > (64u << 10) ? g.start - (64u << 10) : g.slot;
            ASAN_UNPOISON_MEMORY_REGION(p0, (size_t)(g.start - p0));
            uint8_t* tail = g.start + g.len;
            ASAN_UNPOISON_MEMORY_REGION(tail, (size_t)(g.slot + g.slot_size - tail));
        }
    }
    // The canary bytes are ASan-poisoned: read them without instrumentation.
    FZ_NOCOV __attribute__((no_sanitize("address"))) static const uint8_t* bad_canary(const uint8_t* p,
                                                                           const uint8_t* e) {
        for (; p < e; ++p)
            if (*(const volatile uint8_t*)p != kCanaryByte) return p;
        return nullptr;
    }
    // After a call: canaries intact, and nothing but the allowed bytes changed.
    FZ_NOCOV void verify(bool ok, const char* call) {
        for (const Region& g : r) {
            uint8_t* c0 = std::max(g.slot, g.start - kCanary);
            if (const uint8_t* b = bad_canary(c0, g.start))
                die("%s: canary %td bytes before %s overwritten", call, g.start - b, g.what);
            if (const uint8_t* b = bad_canary(g.start + g.len, g.slot + g.slot_size))
                die("%s: canary %td bytes after %s overwritten", call, b - (g.start + g.len), g.what);
            if (g.writable_always || !g.snapshot || g.len == 0) continue;
            if (memcmp(g.start, g.snap.data(), g.len) == 0) continue;
            for (size_t i = 0; i < g.len; ++i)
                if (g.start[i] != g.snap[i] && !(ok && g.may_write[i]))
                    die("%s returned %s and changed byte %zu of %s (%zu bytes), which %s", call,
                        ok ? "WKV_OK" : "an error", i, g.what, g.len,
                        ok ? "is not an element of any output" : "it must not touch on failure");
        }
    }
};

// ------------------------------------------------------------------------------ values

struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
    FZ_NOCOV uint64_t next() {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        return s * 0x2545F4914F6CDD1Dull;
    }
    FZ_NOCOV float uniform(float lo, float hi) { return lo + (hi - lo) * (float)((next() >> 40) * 0x1p-24); }
};

FZ_NOCOV inline uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    int32_t e = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t m = x & 0x7fffffu;
    if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00u | (m ? 0x200u : 0));
    if (e >= 31) return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10) return (uint16_t)sign;
        m |= 0x800000u;
        return (uint16_t)(sign | (m >> (14 - e)));
    }
    return (uint16_t)(sign | (uint32_t)e << 10 | m >> 13);
}
FZ_NOCOV inline uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);  // quiet NaN
    return (uint16_t)(x >> 16);
}

// Output poison: signalling NaNs, which arithmetic never produces.
// (Other element sizes, of invalid dtypes, get 0xA5 bytes.)
inline void poison_pattern(int es, int code, uint8_t out[8]) {
    uint32_t p32 = 0x7FA5A5A5u;
    uint16_t p16 = code == WKV_DTYPE_CODE_BFLOAT ? 0x7FA5 : 0x7DA5;
    memset(out, 0xA5, 8);
    if (es == 4) memcpy(out, &p32, 4);
    else if (es == 2) memcpy(out, &p16, 2);
}

// ------------------------------------------------------------------------------ validity

enum Validity { VALID = 0, UNKNOWN = 1, INVALID = 2 };
struct Verdict {
    Validity v = VALID;
    const char* why = "";  // the first reason for INVALID / UNKNOWN, for messages
    void invalid(const char* w) {
        if (v != INVALID) why = w;
        v = INVALID;
    }
    void unknown(const char* w) {
        if (v == VALID) v = UNKNOWN, why = w;
    }
};

inline const char* vname(Validity v) { return v == VALID ? "VALID" : v == INVALID ? "INVALID" : "UNKNOWN"; }

// Per-run tallies, printed at exit with WKV_FUZZ_STATS=1: how many inputs were skipped, and
// for the others the verdict against the status returned.
struct Stats {
    long skipped = 0;
    long calls[3][17] = {};
    static Stats& get() {
        static Stats s;
        static bool once = [] {
            if (getenv("WKV_FUZZ_STATS")) atexit([] { Stats::get().print(); });
            return true;
        }();
        (void)once;
        return s;
    }
    // One line per verdict: the harness's own reading of wkv.h says the call must run (VALID),
    // must be refused (INVALID), or either (UNKNOWN); then how many calls returned each status.
    void print() const {
        static const char* names[17] = {};
#define FZ_STATUS_NAME_(name, value, message) names[value] = #name;
        WKV_STATUS_LIST(FZ_STATUS_NAME_)
#undef FZ_STATUS_NAME_
        fprintf(stderr, "wkv-fuzz stats: %ld inputs skipped (valid but too large to run); per verdict "
                        "(VALID must run, INVALID must be refused, UNKNOWN either) the calls and the "
                        "statuses they returned\n", skipped);
        const char* vn[3] = {"VALID", "UNKNOWN", "INVALID"};
        for (int v = 0; v < 3; ++v) {
            long total = 0;
            for (int st = 0; st < 17; ++st) total += calls[v][st];
            fprintf(stderr, "  %-8s %8ld calls:", vn[v], total);
            for (int st = 0; st < 17; ++st)
                if (calls[v][st]) fprintf(stderr, " %s %ld", names[st] ? names[st] : "?", calls[v][st]);
            fprintf(stderr, "\n");
        }
    }
};

// Status sanity shared by every harness.
inline void check_status(wkv_status st, const char* call) {
    FZ_CHECK((int)st >= 0 && (int)st <= (int)WKV_ERROR_INTERNAL, "%s returned %d, not a wkv_status",
             call, (int)st);
    FZ_CHECK(st != WKV_ERROR_INTERNAL, "%s returned WKV_ERROR_INTERNAL (a bug by its own definition)", call);
    const char* s = wkv_status_string(st);
    FZ_CHECK(s && strlen(s) < 512, "wkv_status_string(%d) is NULL or unterminated", (int)st);
}

inline void check_message(const char* msg, bool ok, const char* call) {
    FZ_CHECK(msg != nullptr, "%s: wkv_last_error returned NULL", call);
    size_t n = strnlen(msg, 4096);
    FZ_CHECK(n < 4096, "%s: wkv_last_error is not terminated", call);
    if (ok) FZ_CHECK(n == 0, "%s: WKV_OK but wkv_last_error is \"%s\"", call, msg);
    else FZ_CHECK(n > 0, "%s: failed but wkv_last_error is empty", call);
}

}  // namespace fz

#endif  // WKV_TESTS_FUZZ_COMMON_H
