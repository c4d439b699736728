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

// Element index of (batch, t, h, column e) of a per-token slot, e clamped into the row.
int tok_clamped(int slot, int b, int t, int h, int e) { return tok(slot, b, t, h, min(e, N - 1)); }

// The state row of (s, h, i) into this lane's registers (zeros without state_in). Columns
// past N are zero.
void load_row(out vec4 S[NQ], int s, int h, int i, int l) {
    const bool have = present(SLOT_SIN);
    WKV_FOR_COUNT(m, NQ)
        const int c0 = (m * C + l) * 4;
        vec4 x;
        x.x = ld_sin(sti(SLOT_SIN, s, h, i, min(c0 + 0, N - 1)));
        x.y = ld_sin(sti(SLOT_SIN, s, h, i, min(c0 + 1, N - 1)));
        x.z = ld_sin(sti(SLOT_SIN, s, h, i, min(c0 + 2, N - 1)));
        x.w = ld_sin(sti(SLOT_SIN, s, h, i, min(c0 + 3, N - 1)));
        S[m] = have ? vec4(c0 + 0 < N ? x.x : 0.0, c0 + 1 < N ? x.y : 0.0, c0 + 2 < N ? x.z : 0.0,
                           c0 + 3 < N ? x.w : 0.0)
                    : vec4(0.0);
    WKV_END
}

// This lane's columns of the state row back to state_out (when present).
void store_row(in vec4 S[NQ], int s, int h, int i, int l) {
    if (!present(SLOT_SOUT)) return;
    WKV_FOR_COUNT(m, NQ)
        const int c0 = (m * C + l) * 4;
        if (c0 + 0 < N) st_sout(sti(SLOT_SOUT, s, h, i, c0 + 0), S[m].x);
        if (c0 + 1 < N) st_sout(sti(SLOT_SOUT, s, h, i, c0 + 1), S[m].y);
        if (c0 + 2 < N) st_sout(sti(SLOT_SOUT, s, h, i, c0 + 2), S[m].z);
        if (c0 + 3 < N) st_sout(sti(SLOT_SOUT, s, h, i, c0 + 3), S[m].w);
    WKV_END
}
