// What the matrix-state forwards (wkv7_fwd.comp, wkv6_fwd.comp) share: the work split, the
// per-token staging of chunks through registers and shared memory, the state row in
// registers, the lane reduction. Included after wkv_common.glsl. Host side: vk_rwkv7.c.
//
// WORK SPLIT. One workgroup per item (sequence s, head h) with N * C invocations: C lanes
// per value row i (C a power of two, at most the subgroup size, so that a row's lanes are
// adjacent lanes of one subgroup). A row is held as NQ = ceil(ceil(N/4) / C) vec4 per lane:
// lane l owns the vec4 columns q = m*C + l (interleaved, so that the C lanes of a row read
// C consecutive vec4 of a shared vector: no bank conflict); columns past N are zero in the
// state and in every staged vector, so they stay zero and add nothing. C = 1 gives one
// invocation per row (many items: decode); C = 2, 4, 8 give C times the warps and 1/C of
// the instructions per token per warp (few items: the per-token dependency chain, not the
// arithmetic, is then the time).
//
// CHUNKS. The per-token vectors of TC tokens are loaded cooperatively (every invocation
// loads NL elements of each vector, spread over tokens and columns) into registers one
// chunk ahead, i.e. while the current chunk is being computed, and moved to shared memory
// between two barriers: the loads' latency hides behind a chunk of arithmetic, and there is
// no global load under a branch (indices are clamped, values of padding zeroed).
//
// Specialisation constants: N (head size), TC (tokens per chunk), C (lanes per row),
// WG = N * C (the workgroup size), DT (dtype of every per-token tensor when the host knows
// it is one dtype, else -1: read per slot from the parameter block).
#ifndef WKV_NO_SUBGROUP
#extension GL_KHR_shader_subgroup_shuffle : require
#endif

const int N4 = (N + 3) / 4;    // vec4 columns of a row
const int NQ = (N4 + C - 1) / C; // vec4 per lane
const int NP = NQ * C;         // vec4 per staged vector (padded)
const int NP4 = NP * 4;        // floats per staged vector
const int NL = (TC * NP4 + WG - 1) / WG; // staged elements per vector per invocation

// Sum over the C lanes of a row (each gets the total).
float lane_sum(float x) {
#ifndef WKV_NO_SUBGROUP
    [[unroll]] for (int m = 1; m < C; m <<= 1) x += subgroupShuffleXor(x, uint(m));
#endif
    return x;
}

// This invocation's slot k of a chunk: token u (0..TC-1) and column e (0..NP4-1) of it.
void staged_slot(int k, out int u, out int e) {
    const int g = int(gl_LocalInvocationID.x) + k * WG;
    u = g / NP4;
    e = g - u * NP4;
}

// A per-token slot's addressing for one (batch, head), read from the parameter block once:
// the compiler cannot keep parameter-block reads in registers across the loop (the output
// bindings might alias it), and a reload per element is a load instruction per element.
struct TokAt {
    int base; // element (batch, 0, h, 0)
    int st;   // stride over t
    int sn;   // stride over the column
};

TokAt tok_at(int slot, int b, int h) {
    TokAt a;
    a.base = tok(slot, b, 0, h, 0);
    a.st = P.td[slot].stride.y;
    a.sn = P.td[slot].stride.w;
    return a;
}

// Element index of (t, column e) with e clamped into the row (padding columns load column N-1).
int at(TokAt a, int t, int e) { return a.base + t * a.st + min(e, N - 1) * a.sn; }

// The state row of (s, h, i) into this lane's registers (zeros without state_in): 16-byte
// loads when the row is contiguous and aligned, else one element at a time. Columns past N
// are zero.
void load_row(out vec4 S[NQ], int s, int h, int i, int l) {
    const bool have = present(SLOT_SIN);
    const int e0 = sti(SLOT_SIN, s, h, i, 0), sj = P.td[SLOT_SIN].stride.w;
    if (N % 4 == 0 && sj == 1 && (e0 & 3) == 0) {
        WKV_FOR_COUNT(m, NQ)
            const int c0 = min((m * C + l) * 4, N - 4);
            S[m] = have && (m * C + l) * 4 < N ? ld4_sin(e0 + c0) : vec4(0.0);
        WKV_END
    } else {
        WKV_FOR_COUNT(m, NQ)
            const int c0 = (m * C + l) * 4;
            vec4 x;
            x.x = ld_sin(e0 + min(c0 + 0, N - 1) * sj);
            x.y = ld_sin(e0 + min(c0 + 1, N - 1) * sj);
            x.z = ld_sin(e0 + min(c0 + 2, N - 1) * sj);
            x.w = ld_sin(e0 + min(c0 + 3, N - 1) * sj);
            S[m] = have ? vec4(c0 + 0 < N ? x.x : 0.0, c0 + 1 < N ? x.y : 0.0, c0 + 2 < N ? x.z : 0.0,
                               c0 + 3 < N ? x.w : 0.0)
                        : vec4(0.0);
        WKV_END
    }
}

// This lane's columns of the state row back to state_out (when present), as load_row.
void store_row(in vec4 S[NQ], int s, int h, int i, int l) {
    if (!present(SLOT_SOUT)) return;
    const int e0 = sti(SLOT_SOUT, s, h, i, 0), sj = P.td[SLOT_SOUT].stride.w;
    if (N % 4 == 0 && sj == 1 && (e0 & 3) == 0) {
        WKV_FOR_COUNT(m, NQ)
            const int c0 = (m * C + l) * 4;
            if (c0 < N) st4_sout(e0 + c0, S[m]);
        WKV_END
    } else {
        WKV_FOR_COUNT(m, NQ)
            const int c0 = (m * C + l) * 4;
            if (c0 + 0 < N) st_sout(e0 + (c0 + 0) * sj, S[m].x);
            if (c0 + 1 < N) st_sout(e0 + (c0 + 1) * sj, S[m].y);
            if (c0 + 2 < N) st_sout(e0 + (c0 + 2) * sj, S[m].z);
            if (c0 + 3 < N) st_sout(e0 + (c0 + 3) * sj, S[m].w);
        WKV_END
    }
}
