// Threading stress test (docs/RELIABILITY.md): the thread-safety contract of wkv.h under real
// concurrency. Run by ctest in every build, and under ThreadSanitizer by scripts/test.sh (the
// tsan preset).
//
//  1. Distinct contexts: 8 threads, each with its own CPU context (1 or 2 pool threads), run a
//     mixed list of calls (RWKV-7/6/4, forward and backward, f32/bf16, state, packing) in a
//     shuffled order, many times; every result must be bit-identical to the same call run
//     single-threaded beforehand (one host thread, one context per pool size).
//  2. One context, two threads hammering it: every call returns WKV_OK or WKV_ERROR_BUSY; a
//     BUSY call leaves its outputs untouched (poisoned); an OK call's outputs are bit-identical
//     to the reference.
//
// Environment: WKV_STRESS_ROUNDS (rounds of the whole list per thread in part 1, default 20),
// WKV_STRESS_HAMMER (calls per thread in part 2, default 2000).
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "wkv/wkv.h"

namespace {

std::atomic<int> g_failures{0};

void fail(const char* fmt, const std::string& what, long a = 0, long b = 0) {
    if (g_failures.fetch_add(1) < 20) {
        fprintf(stderr, "FAIL: %s: ", what.c_str());
        fprintf(stderr, fmt, a, b);
        fprintf(stderr, "\n");
    }
}

uint16_t to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    x += 0x7FFF + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

// One call: its inputs (shared, read-only) and how to build its descriptor over a given set of
// outputs.
struct Call {
    std::string name;
    int op = 7;
    bool backward = false;
    bool bf16 = false;
    bool state = false;
    int64_t B = 1, T = 1, H = 1, N = 1, num_seqs = 0;
    std::vector<int64_t> offsets;
    // shapes
    int64_t tok[4], par[2], st[4];
    int tok_nd = 4, par_nd = 2, st_nd = 4;
    // inputs, as bytes
    std::vector<uint8_t> r, w, k, v, a, b, u, s0, dy, ds;

    int64_t S() const { return num_seqs ? num_seqs : B; }
    int64_t tok_n() const { return op == 4 ? B * T * N : B * T * H * N; }
    int64_t par_n() const { return op == 4 ? N : H * N; }
    int64_t st_n() const { return op == 4 ? S() * 3 * N : S() * H * N * N; }
    size_t es() const { return bf16 ? 2 : 4; }

    std::vector<uint8_t> make(int64_t n, float lo, float hi, std::mt19937_64& g, bool f32 = false) const {
        std::uniform_real_distribution<float> d(lo, hi);
        size_t e = f32 ? 4 : es();
        std::vector<uint8_t> out((size_t)n * e);
        for (int64_t i = 0; i < n; ++i) {
            float f = d(g);
            if (e == 4) memcpy(&out[(size_t)i * 4], &f, 4);
            else {
                uint16_t h = to_bf16(f);
                memcpy(&out[(size_t)i * 2], &h, 2);
            }
        }
        return out;
    }

    void init(uint64_t seed) {
        std::mt19937_64 g(seed);
        if (op == 4) {
            H = 1;
            tok_nd = 3, tok[0] = B, tok[1] = T, tok[2] = N;
            par_nd = 1, par[0] = N;
            st_nd = 3, st[0] = S(), st[1] = 3, st[2] = N;
        } else {
            tok[0] = B, tok[1] = T, tok[2] = H, tok[3] = N;
            par[0] = H, par[1] = N;
            st[0] = S(), st[1] = H, st[2] = N, st[3] = N;
        }
        r = make(tok_n(), -1, 1, g);
        k = make(tok_n(), op == 4 ? -3.f : -1.f, op == 4 ? 3.f : 1.f, g);
        v = make(tok_n(), -1, 1, g);
        if (op == 7) {
            w = make(tok_n(), -3, 3, g);  // CLAMPW
            a = make(tok_n(), -0.3f, 0.3f, g);
            b = make(tok_n(), -0.3f, 0.3f, g);
        } else if (op == 6) {
            w = make(tok_n(), -3, 0, g);  // EXP_NEG_EXP
            u = make(par_n(), -1, 1, g);
        } else {
            w = make(par_n(), -3, 0, g);
            u = make(par_n(), -1, 1, g);
        }
        if (state) {
            s0 = make(st_n(), 0.1f, 0.9f, g, true);
            ds = make(st_n(), -1, 1, g, true);
        }
        dy = make(tok_n(), -1, 1, g);
    }

    int64_t out_bytes_total() const {
        return (int64_t)(tok_n() * es() * 6 + par_n() * es() * 2 + st_n() * 4 * 2);
    }
};

// The outputs of one call (and its workspace), owned by one thread.
struct Out {
    std::vector<uint8_t> y, sout, dr, dw, dk, dv, da, db, du, dsin, ws;
    void poison() {
        for (auto* x : {&y, &sout, &dr, &dw, &dk, &dv, &da, &db, &du, &dsin}) memset(x->data(), 0xA5, x->size());
    }
    bool equal(const Out& o) const {
        return y == o.y && sout == o.sout && dr == o.dr && dw == o.dw && dk == o.dk && dv == o.dv &&
               da == o.da && db == o.db && du == o.du && dsin == o.dsin;
    }
    bool all_poison() const {
        for (auto* x : {&y, &sout, &dr, &dw, &dk, &dv, &da, &db, &du, &dsin})
            for (uint8_t c : *x)
                if (c != 0xA5) return false;
        return true;
    }
};

wkv_tensor tensor(const std::vector<uint8_t>& data, bool bf16, int nd, const int64_t* shape) {
    if (data.empty()) return wkv_tensor{};
    return wkv_tensor_make((void*)data.data(), bf16 ? WKV_DTYPE_BF16 : WKV_DTYPE_F32, nd, shape);
}

void alloc(const Call& c, Out& o) {
    size_t es = c.es(), tn = (size_t)c.tok_n(), pn = (size_t)c.par_n(), sn = (size_t)c.st_n();
    o.y.assign(c.backward ? 0 : tn * es, 0);
    o.sout.assign(!c.backward && c.state ? sn * 4 : 0, 0);
    bool bw = c.backward;
    o.dr.assign(bw && c.op != 4 ? tn * es : 0, 0);
    o.dw.assign(bw ? (c.op == 4 ? pn : tn) * es : 0, 0);
    o.dk.assign(bw ? tn * es : 0, 0);
    o.dv.assign(bw ? tn * es : 0, 0);
    o.da.assign(bw && c.op == 7 ? tn * es : 0, 0);
    o.db.assign(bw && c.op == 7 ? tn * es : 0, 0);
    o.du.assign(bw && c.op != 7 ? pn * es : 0, 0);
    o.dsin.assign(bw && c.state ? sn * 4 : 0, 0);
}

// Runs c on ctx into o. Returns the status.
wkv_status run(wkv_context* ctx, const Call& c, Out& o) {
    wkv_forward_desc f;
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof f;
    f.op = (wkv_op)c.op;
    f.decay_form = c.op == 7 ? WKV_DECAY_CLAMPW : WKV_DECAY_EXP_NEG_EXP;
    bool h = c.bf16;
    if (c.op != 4) f.r = tensor(c.r, h, c.tok_nd, c.tok);
    f.w = c.op == 4 ? tensor(c.w, h, c.par_nd, c.par) : tensor(c.w, h, c.tok_nd, c.tok);
    f.k = tensor(c.k, h, c.tok_nd, c.tok);
    f.v = tensor(c.v, h, c.tok_nd, c.tok);
    if (c.op == 7) f.a = tensor(c.a, h, c.tok_nd, c.tok), f.b = tensor(c.b, h, c.tok_nd, c.tok);
    else f.u = tensor(c.u, h, c.par_nd, c.par);
    if (c.state) f.state_in = tensor(c.s0, false, c.st_nd, c.st);
    if (c.num_seqs) f.num_seqs = c.num_seqs, f.seq_offsets = c.offsets.data();
    if (!c.backward) {
        f.y = tensor(o.y, h, c.tok_nd, c.tok);
        if (c.state) f.state_out = tensor(o.sout, false, c.st_nd, c.st);
        return wkv_forward(ctx, &f);
    }
    wkv_backward_desc b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.forward = &f;
    b.dy = tensor(c.dy, h, c.tok_nd, c.tok);
    if (c.state) b.dstate_out = tensor(c.ds, false, c.st_nd, c.st), b.dstate_in = tensor(o.dsin, false, c.st_nd, c.st);
    if (c.op != 4) b.dr = tensor(o.dr, h, c.tok_nd, c.tok);
    b.dw = c.op == 4 ? tensor(o.dw, h, c.par_nd, c.par) : tensor(o.dw, h, c.tok_nd, c.tok);
    b.dk = tensor(o.dk, h, c.tok_nd, c.tok);
    b.dv = tensor(o.dv, h, c.tok_nd, c.tok);
    if (c.op == 7) b.da = tensor(o.da, h, c.tok_nd, c.tok), b.db = tensor(o.db, h, c.tok_nd, c.tok);
    else b.du = tensor(o.du, h, c.par_nd, c.par);
    size_t need = 0;
    wkv_status st = wkv_workspace_size(ctx, &need, &b);
    if (st != WKV_OK) return st;
    if (o.ws.size() < need) o.ws.resize(need);
    b.workspace = need ? o.ws.data() : nullptr;
    b.workspace_size = o.ws.size();
    return wkv_backward(ctx, &b);
}

wkv_context* make_ctx(int threads) {
    wkv_context_options opt;
    memset(&opt, 0, sizeof opt);
    opt.struct_size = sizeof opt;
    opt.backend = WKV_BACKEND_CPU;
    opt.cpu_threads = threads;
    wkv_context* ctx = nullptr;
    if (wkv_context_create(&opt, &ctx) != WKV_OK) {
        fprintf(stderr, "cannot create a CPU context: %s\n", wkv_last_error(nullptr));
        exit(1);
    }
    return ctx;
}

std::vector<Call> make_calls() {
    std::vector<Call> calls;
    uint64_t seed = 1000;
    for (int op : {7, 6, 4})
        for (int bw = 0; bw < 2; ++bw)
            for (int variant = 0; variant < 3; ++variant) {
                Call c;
                c.op = op;
                c.backward = bw;
                c.bf16 = variant == 1;
                c.state = variant != 0;
                c.B = variant == 2 ? 1 : 2;
                c.T = 19 + 7 * variant;
                c.H = 2;
                c.N = op == 4 ? 12 : 8;
                if (variant == 2) {  // packed: 3 sequences, one empty
                    c.num_seqs = 3;
                    c.offsets = {0, 9, 9, c.T};
                }
                c.init(seed++);
                c.name = "rwkv" + std::to_string(op) + (bw ? " backward" : " forward") +
                         (c.bf16 ? " bf16" : " f32") + (c.state ? " state" : "") +
                         (c.num_seqs ? " packed" : "");
                calls.push_back(std::move(c));
            }
    return calls;
}

}  // namespace

int main() {
    const int kThreads = 8;
    int rounds = getenv("WKV_STRESS_ROUNDS") ? atoi(getenv("WKV_STRESS_ROUNDS")) : 20;
    int hammer = getenv("WKV_STRESS_HAMMER") ? atoi(getenv("WKV_STRESS_HAMMER")) : 2000;
    std::vector<Call> calls = make_calls();

    // Reference: one host thread, one context per pool size (1 and 2 threads).
    std::vector<Out> ref[3];
    for (int threads = 1; threads <= 2; ++threads) {
        wkv_context* ctx = make_ctx(threads);
        ref[threads].resize(calls.size());
        for (size_t i = 0; i < calls.size(); ++i) {
            alloc(calls[i], ref[threads][i]);
            ref[threads][i].poison();
            wkv_status st = run(ctx, calls[i], ref[threads][i]);
            if (st != WKV_OK) fail("reference call failed: status %ld", calls[i].name, (long)st);
        }
        wkv_context_destroy(ctx);
    }
    for (size_t i = 0; i < calls.size(); ++i)
        if (!ref[1][i].equal(ref[2][i])) fail("1 and 2 pool threads give different results", calls[i].name);

    // 1. distinct contexts, 8 threads
    std::atomic<long> done{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < kThreads; ++t)
        pool.emplace_back([&, t] {
            int threads = 1 + t % 2;
            wkv_context* ctx = make_ctx(threads);
            std::mt19937 g((unsigned)t);
            std::vector<size_t> order(calls.size());
            for (size_t i = 0; i < order.size(); ++i) order[i] = i;
            std::vector<Out> outs(calls.size());
            for (size_t i = 0; i < calls.size(); ++i) alloc(calls[i], outs[i]);
            for (int round = 0; round < rounds; ++round) {
                std::shuffle(order.begin(), order.end(), g);
                for (size_t i : order) {
                    outs[i].poison();
                    wkv_status st = run(ctx, calls[i], outs[i]);
                    if (st != WKV_OK) fail("status %ld on thread %ld", calls[i].name, (long)st, t);
                    else if (!outs[i].equal(ref[threads][i]))
                        fail("thread %ld: result differs from the single-threaded run (round %ld)",
                             calls[i].name, t, round);
                    done++;
                }
            }
            wkv_context_destroy(ctx);
        });
    for (auto& th : pool) th.join();
    pool.clear();
    printf("distinct contexts: %d threads, %ld calls, bit-identical to the single-threaded run: %s\n",
           kThreads, done.load(), g_failures.load() ? "NO" : "yes");

    // 2. one context, two threads: OK or BUSY, never corruption
    wkv_context* shared = make_ctx(1);
    std::atomic<long> ok{0}, busy{0}, bad{0};
    std::atomic<bool> go{false};
    for (int t = 0; t < 2; ++t)
        pool.emplace_back([&, t] {
            std::vector<Out> outs(calls.size());
            for (size_t i = 0; i < calls.size(); ++i) alloc(calls[i], outs[i]);
            while (!go.load()) std::this_thread::yield();
            for (int n = 0; n < hammer; ++n) {
                size_t i = (size_t)(n * 7 + t * 3) % calls.size();
                outs[i].poison();
                wkv_status st = run(shared, calls[i], outs[i]);
                if (st == WKV_OK) {
                    ok++;
                    if (!outs[i].equal(ref[1][i])) fail("shared context: an OK result is wrong (thread %ld)",
                                                       calls[i].name, t);
                } else if (st == WKV_ERROR_BUSY) {
                    busy++;
                    if (!outs[i].all_poison()) fail("shared context: a BUSY call wrote its outputs (thread %ld)",
                                                   calls[i].name, t);
                } else {
                    bad++;
                    fail("shared context: status %ld (thread %ld), expected OK or BUSY", calls[i].name,
                         (long)st, t);
                }
            }
        });
    go = true;
    for (auto& th : pool) th.join();
    wkv_context_destroy(shared);
    printf("one context, 2 threads: %ld OK (all correct), %ld BUSY (outputs untouched), %ld other\n",
           ok.load(), busy.load(), bad.load());

    int failures = g_failures.load();
    printf("%d passed, %d failed\n", failures ? 1 : 2, failures ? 1 : 0);
    return failures ? 1 : 0;
}
