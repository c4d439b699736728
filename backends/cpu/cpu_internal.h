/* Shared pieces of the CPU backend: its per-context state, messages, checked size arithmetic,
 * how work is split for parallel_for, and the decay forms. Internal to backends/cpu/. */
#ifndef WKV_BACKENDS_CPU_INTERNAL_H
#define WKV_BACKENDS_CPU_INTERNAL_H

#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "backend.h"

namespace wkv_cpu {

/* What create() keeps: a copy of the core's arguments, and the forward's scratch, kept from one
 * call to the next (calls on one context never overlap: the core makes sure of that). */
struct BackendState {
    wkv_backend_create_args args;

    BackendState() noexcept = default;
    BackendState(const BackendState&) = delete;
    BackendState& operator=(const BackendState&) = delete;
    ~BackendState() { std::free(scratch_mem); }

    /* At least `bytes` bytes of scratch (the largest asked for so far), or NULL when they
     * cannot be allocated (WKV_FAULT=oom:scratch fails a growth). Its contents are undefined. */
    void* scratch(size_t bytes) const noexcept {
        if (bytes > scratch_cap) {
            std::free(scratch_mem);
            const wkv_fault_hook fault = wkv_fault_hook_from(&args);
            scratch_mem = wkv_fault_hit(&fault, WKV_FAULT_OOM, "scratch") ? nullptr : std::malloc(bytes);
            scratch_cap = scratch_mem ? bytes : 0;
        }
        return scratch_mem;
    }

private:
    mutable void* scratch_mem = nullptr;
    mutable size_t scratch_cap = 0;
};

/* printf into msg (if any), always NUL-terminated, prefixed with "cpu backend: ". */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
inline void set_message(wkv_message* msg, const char* fmt, ...) noexcept {
    if (!msg) return;
    const int prefix = std::snprintf(msg->text, sizeof msg->text, "cpu backend: ");
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(msg->text + prefix, sizeof msg->text - (size_t)prefix, fmt, ap);
    va_end(ap);
}

/* ---------------------------------------------------------------- checked size arithmetic */

/* Unsigned 64-bit arithmetic that remembers whether anything overflowed. */
struct CheckedSize {
    bool overflow = false;

    uint64_t mul(uint64_t a, uint64_t b) noexcept {
        if (a != 0 && b > UINT64_MAX / a) {
            overflow = true;
            return 0;
        }
        return a * b;
    }
    uint64_t add(uint64_t a, uint64_t b) noexcept {
        if (b > UINT64_MAX - a) {
            overflow = true;
            return 0;
        }
        return a + b;
    }
    /* Rounds up to a multiple of `align` (a power of two). */
    uint64_t align_up(uint64_t a, uint64_t align) noexcept {
        const uint64_t x = add(a, align - 1);
        return x & ~(align - 1);
    }
    /* The value as a size_t, flagging overflow when it does not fit. */
    size_t to_size(uint64_t a) noexcept {
        if (a > (uint64_t)SIZE_MAX) {
            overflow = true;
            return 0;
        }
        return (size_t)a;
    }
};

/* ------------------------------------------------------------------------ work splitting */

/* Parallel work is a list of independent items (one per (sequence, head)), grouped into
 * `chunks` contiguous runs that each own one scratch region; parallel_for runs over chunks.
 * Each item's result depends only on the item, never on its chunk or thread, so results are
 * bit-identical for every thread count and every way parallel_for splits the range. */
constexpr int64_t kChunksPerThread = 4;

inline int64_t chunk_count(const BackendState* st, int64_t items) noexcept {
    int64_t threads = st->args.num_threads > 0 ? st->args.num_threads : 1;
    if (threads > 4096) threads = 4096;
    int64_t c = threads * kChunksPerThread;
    return c < items ? c : items;
}

/* Items [*begin, *end) of chunk c of `chunks` over `items` items (sizes differ by at most 1). */
inline void chunk_items(int64_t items, int64_t chunks, int64_t c, int64_t* begin,
                        int64_t* end) noexcept {
    const int64_t q = items / chunks, r = items % chunks;
    *begin = c * q + (c < r ? c : r);
    *end = *begin + q + (c < r ? 1 : 0);
}

/* ---------------------------------------------------------------------------- decay forms */

/* exp(-0.5), the CLAMPW scale. */
constexpr float kClampwScale = 0.60653065971263342f;

/* decay[j] from w[j] for the form; if ddw is not NULL also ddw[j] = d decay / d w.
 * float32 throughout; no overflow to NaN for large |w|:
 *   DIRECT       decay = w                         ddw = 1
 *   LOG          decay = exp(w)                    ddw = decay
 *   EXP_NEG_EXP  decay = exp(-e), e = exp(w)       ddw = -e * decay   (0 once e is infinite)
 *   CLAMPW       decay = exp(-c * sig(w))          ddw = -c * sig(w) * (1 - sig(w)) * decay
 *                with sig(w) = 1/(1+z) and 1-sig(w) = z/(1+z) for w >= 0, z = exp(-w), and the
 *                mirrored forms for w < 0, so that neither ever computes exp of a large number. */
inline void decay_row(wkv_decay_form form, const float* w, float* decay, float* ddw,
                      int64_t n) noexcept {
    switch (form) {
    case WKV_DECAY_DIRECT:
        for (int64_t j = 0; j < n; ++j) decay[j] = w[j];
        if (ddw)
            for (int64_t j = 0; j < n; ++j) ddw[j] = 1.0f;
        return;
    case WKV_DECAY_LOG:
        for (int64_t j = 0; j < n; ++j) decay[j] = std::exp(w[j]);
        if (ddw)
            for (int64_t j = 0; j < n; ++j) ddw[j] = decay[j];
        return;
    case WKV_DECAY_EXP_NEG_EXP:
        for (int64_t j = 0; j < n; ++j) {
            const float e = std::exp(w[j]);
            const float d = std::exp(-e);
            decay[j] = d;
            if (ddw) ddw[j] = std::isinf(e) ? -0.0f : -e * d;
        }
        return;
    case WKV_DECAY_CLAMPW:
        for (int64_t j = 0; j < n; ++j) {
            const float x = w[j];
            const float z = std::exp(-std::fabs(x)); /* in (0, 1] */
            const float inv = 1.0f / (1.0f + z);
            const float sig = x >= 0.0f ? inv : z * inv;
            const float d = std::exp(-kClampwScale * sig);
            decay[j] = d;
            if (ddw) ddw[j] = -kClampwScale * (z * inv * inv) * d; /* sig*(1-sig) = z/(1+z)^2 */
        }
        return;
    default:
        for (int64_t j = 0; j < n; ++j) decay[j] = NAN;
        if (ddw)
            for (int64_t j = 0; j < n; ++j) ddw[j] = NAN;
        return;
    }
}

inline bool decay_form_supported(wkv_decay_form form) noexcept {
    return form == WKV_DECAY_DIRECT || form == WKV_DECAY_LOG || form == WKV_DECAY_EXP_NEG_EXP ||
           form == WKV_DECAY_CLAMPW;
}

} // namespace wkv_cpu

#endif
