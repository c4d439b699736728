// The fiber scheduler of cuda_emu.h.
#include "cuda_emu.h"

#include <ucontext.h>

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

namespace wkv_emu {
namespace {

constexpr size_t kStackBytes = 256 * 1024;

struct Fiber {
    ucontext_t ctx;
    std::unique_ptr<char[]> stack;
    bool done = false;
    bool waiting = false;
    int scope = 0;      // the barrier waited on: warp w is w, the block is warps
    uint64_t gen = 0;   // its generation when the wait began
    unsigned bank = 0;  // its current shuffle's bank of the exchange buffer
};

struct Block {
    unsigned threads = 0, warps = 0;
    std::vector<Fiber> fibers;
    std::vector<uint64_t> gen;      // per scope: barriers completed
    std::vector<unsigned> arrived;  // per scope: threads at the current barrier
    std::vector<uint64_t> slots;    // two banks of a 64-byte exchange slot per thread
    std::vector<unsigned char> smem;
    ucontext_t scheduler;
    unsigned current = 0;
    const std::function<void()>* kernel = nullptr;
    Index3 tid, bid, dim;
};

Block* g_block = nullptr;

unsigned participants(const Block& b, int scope) {
    if (scope == (int)b.warps) return b.threads;
    const unsigned first = (unsigned)scope * 32;
    return std::min(32u, b.threads - first);
}

void barrier(int scope) {
    Block& b = *g_block;
    Fiber& f = b.fibers[b.current];
    const uint64_t g = b.gen[(size_t)scope];
    if (++b.arrived[(size_t)scope] == participants(b, scope)) {
        b.arrived[(size_t)scope] = 0;
        ++b.gen[(size_t)scope];
        return; // the last to arrive goes on; the others are runnable now
    }
    f.waiting = true;
    f.scope = scope;
    f.gen = g;
    swapcontext(&f.ctx, &b.scheduler);
}

void trampoline();

// Apart from launch(): getcontext returns twice as far as GCC knows, which would make it warn
// about every local of the caller (the second return never happens: makecontext follows).
__attribute__((noinline)) void init_fiber(Fiber& f, ucontext_t* link) {
    f.done = f.waiting = false;
    f.bank = 0;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.get();
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = link;
    makecontext(&f.ctx, trampoline, 0);
}

void trampoline() {
    Block& b = *g_block;
    (*b.kernel)();
    b.fibers[b.current].done = true;
    // returns to b.scheduler through uc_link
}

}  // namespace

const Index3& thread_idx() { return g_block->tid; }
const Index3& block_idx() { return g_block->bid; }
const Index3& block_dim() { return g_block->dim; }
void* dynamic_shared() { return g_block->smem.data(); }
void sync_block() { barrier((int)g_block->warps); }
void sync_warp() { barrier((int)(g_block->tid.x / 32)); }
void* shuffle_slot(unsigned lane) {
    Block& b = *g_block;
    return &b.slots[((size_t)b.fibers[b.current].bank * b.warps * 32 + b.tid.x / 32 * 32 + lane) * 8];
}
void shuffle_done() {
    Fiber& f = g_block->fibers[g_block->current];
    f.bank ^= 1u;
}

namespace {

float from16(uint16_t x, bool bf16) {
    if (!bf16) return wkv_cuda::elem::half_to_float(x);
    const uint32_t u = (uint32_t)x << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

}  // namespace

void mma_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2], bool bf16) {
    const unsigned lane = thread_idx().x % 32;
    uint32_t mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    std::memcpy(shuffle_slot(lane), mine, sizeof mine);
    sync_warp();
    float A[16][16], B[16][8];
    for (unsigned l = 0; l < 32; ++l) {
        uint32_t r[6];
        std::memcpy(r, shuffle_slot(l), sizeof r);
        const unsigned g = l / 4, t = l % 4;
        for (unsigned i = 0; i < 8; ++i) { /* a_i: register i / 2, half i % 2 */
            const uint16_t x = (uint16_t)(r[i / 2] >> (16 * (i % 2)));
            const unsigned row = g + ((i / 2) % 2) * 8, col = 2 * t + (i % 2) + (i / 4) * 8;
            A[row][col] = from16(x, bf16);
        }
        for (unsigned i = 0; i < 4; ++i) { /* b_i */
            const uint16_t x = (uint16_t)(r[4 + i / 2] >> (16 * (i % 2)));
            B[2 * t + (i % 2) + (i / 2) * 8][g] = from16(x, bf16);
        }
    }
    const unsigned g = lane / 4, t = lane % 4;
    for (unsigned i = 0; i < 4; ++i) {
        const unsigned row = g + (i / 2) * 8, col = 2 * t + (i % 2);
        float acc = d[i];
        for (unsigned k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];
        d[i] = acc;
    }
    shuffle_done();
}

std::string launch(unsigned grid, unsigned threads, size_t smem, const std::function<void()>& kernel, uint64_t seed) {
    Block b;
    b.threads = threads;
    b.warps = (threads + 31) / 32;
    b.fibers.resize(threads);
    for (Fiber& f : b.fibers) f.stack.reset(new char[kStackBytes]);
    b.slots.assign(2 * b.warps * 32 * 8, 0);
    b.kernel = &kernel;
    b.dim.x = threads;
    std::mt19937_64 rng(seed);
    std::vector<unsigned> order(threads);
    for (unsigned i = 0; i < threads; ++i) order[i] = i;
    g_block = &b;
    std::string error;
    for (unsigned blk = 0; blk < grid && error.empty(); ++blk) {
        b.bid.x = blk;
        b.gen.assign(b.warps + 1, 0);
        b.arrived.assign(b.warps + 1, 0);
        b.smem.assign(smem, 0xFF); // NaN floats: an element read before written shows
        for (Fiber& f : b.fibers) init_fiber(f, &b.scheduler);
        unsigned done = 0;
        // resumes thread i if it can move; whether it did
        auto step = [&](unsigned i) {
            Fiber& f = b.fibers[i];
            if (f.done || (f.waiting && b.gen[(size_t)f.scope] == f.gen)) return false;
            f.waiting = false;
            b.current = i;
            b.tid.x = i;
            swapcontext(&b.scheduler, &f.ctx);
            if (f.done) ++done;
            return true;
        };
        while (done < threads) {
            bool moved = false;
            // one warp, drawn at random, runs ahead as far as it can (to a block barrier or its
            // end) before the others move: warps drift apart as on a GPU, so a write a warp
            // makes after its last barrier can overtake another warp's pending reads
            const unsigned lead = (unsigned)(rng() % b.warps), first = lead * 32, last = std::min(threads, first + 32);
            for (bool again = true; again;) {
                again = false;
                for (unsigned i = first; i < last; ++i) again = step(i) || again;
                moved = moved || again;
            }
            std::shuffle(order.begin(), order.end(), rng);
            for (unsigned i : order) moved = step(i) || moved;
            if (!moved) {
                error = "deadlock in block " + std::to_string(blk) + ": " + std::to_string(threads - done) +
                        " threads wait at barriers the others never reach";
                break;
            }
        }
    }
    g_block = nullptr;
    return error;
}

}  // namespace wkv_emu

namespace wkv_cuda {
namespace elem {

float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31u, man = h & 1023u;
    uint32_t u;
    if (exp == 31) {
        u = sign | 0x7F800000u | (man << 13);
    } else if (exp == 0) {
        const float f = std::ldexp((float)man, -24);
        std::memcpy(&u, &f, 4);
        u |= sign;
    } else {
        u = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

uint16_t float_to_half(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const float a = std::fabs(f);
    if (std::isnan(f)) return (uint16_t)(sign | 0x7E00u);
    if (a >= 65520.0f) return (uint16_t)(sign | 0x7C00u); // rounds to infinity
    if (a < 6.103515625e-05f) { // subnormal half: a multiple of 2^-24, rounded to nearest even
        const float q = std::nearbyint(a * 16777216.0f);
        return (uint16_t)(sign | (uint16_t)q);
    }
    uint32_t ua;
    std::memcpy(&ua, &a, 4);
    const uint32_t exp = (ua >> 23) - 112, man = ua & 0x7FFFFFu;
    uint32_t h = (exp << 10) | (man >> 13);
    const uint32_t rest = man & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h; // may carry into the exponent: right
    return (uint16_t)(sign | h);
}

uint16_t float_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (std::isnan(f)) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

}  // namespace elem
}  // namespace wkv_cuda
