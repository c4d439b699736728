// Shared by the WKV compute shaders: the call's parameter block, tensor access for float32 /
// float16 / bfloat16 storage, and the decay forms. Included by every wkv*.comp; the host
// side of every layout here is backends/vulkan/vk_op.c + vk_rwkv{7,6,4}.c (keep them in step).
//
// TENSORS. Every tensor binding is declared as an array of 32-bit words. A tensor's element
// (i0, i1, i2, i3) is element  base + i0*stride.x + i1*stride.y + i2*stride.z + i3*stride.w
// of its binding, counted in its own element size (4 bytes for float32, 2 for the 16-bit
// types). The host binds each tensor with a descriptor range that starts at most
// minStorageBufferOffsetAlignment bytes before the tensor and covers every byte it reaches
// (at most maxStorageBufferRange <= 4 GiB, so every index fits in 32 bits: no int64 is
// needed; larger tensors are refused on the host). A 16-bit element e is half (e & 1) of
// word e >> 1 (little-endian). Without 16-bit storage (the default build variant) 16-bit
// outputs are written with atomicAnd/atomicOr on that word so that the neighbouring half,
// which may belong to another thread, is kept. With WKV_STORAGE16 (the device has
// storageBuffer16BitAccess) the same binding is also declared as uint16_t and 16-bit
// elements are read and written directly.
//
// Arithmetic is float32 throughout; 16-bit values are converted on load and rounded to
// nearest-even on store (bfloat16 in code, float16 by packHalf2x16).
#extension GL_EXT_control_flow_attributes : enable
#ifdef WKV_STORAGE16
#extension GL_EXT_shader_16bit_storage : require
#endif

// Loops over the N elements of a state row: WKV_FOR_N(j) statement WKV_END.
// GPUs: fully unrolled, so that the row stays in registers. WKV_ROLLED (CPU implementations
// such as lavapipe): blocks of WKV_BLOCK unrolled iterations, because (1) their compiler would
// spend minutes on the fully unrolled code and (2) lavapipe's gallivm stops every loop of a
// shader invocation after 65535 iterations in total (LP_MAX_TGSI_LOOP_ITERATIONS), silently:
// unrolled iterations do not count, so blocks cut the count 16-fold. The host refuses problems
// that would still exceed it on llvmpipe (vk_rwkv7.c, lavapipe_budget).
// WKV_FOR_COUNT(j, COUNT) is the same over 0..COUNT-1 (COUNT a constant expression).
#define WKV_BLOCK 16
#ifdef WKV_ROLLED
#define WKV_FOR_COUNT(j, COUNT)                                          \
    for (int j##_b = 0; j##_b < (COUNT); j##_b += WKV_BLOCK)             \
        [[unroll]] for (int j##_u = 0; j##_u < WKV_BLOCK; ++j##_u) {     \
            const int j = j##_b + j##_u;                                 \
            if (j < (COUNT)) {
#define WKV_END }}
#else
#define WKV_FOR_COUNT(j, COUNT) [[unroll]] for (int j = 0; j < (COUNT); ++j) {
#define WKV_END }
#endif
#define WKV_FOR_N(j) WKV_FOR_COUNT(j, N)

// A thread's own row of N floats, R(j), stored to / loaded from elements base .. base + N - 1 of
// a float[] buffer B, through B4, a vec4[] alias of the same binding, when N is a multiple of 4
// (base then is too: every row's offset is a multiple of N from a 16-byte aligned binding).
// Rows of consecutive threads lie N floats apart, so a warp's scalar access touches 32 separate
// lines per instruction; as vec4 it takes 4x fewer instructions. The backwards' replay stores
// were most of their time (RWKV-7 B=8 T=4096: 56 of 95 ms; backends/vulkan/DESIGN.md, "Backward").
#define WKV_ROW_STORE(B, B4, base, R)                                                          \
    if (N % 4 == 0) {                                                                          \
        [[unroll]] for (int q_ = 0; q_ < N / 4; ++q_)                                          \
            B4[((base) >> 2) + q_] = vec4(R(4 * q_), R(4 * q_ + 1), R(4 * q_ + 2), R(4 * q_ + 3)); \
    } else {                                                                                   \
        WKV_FOR_N(jr) B[(base) + jr] = R(jr); WKV_END                                          \
    }
#define WKV_ROW_LOAD(B, B4, base, R)                                                           \
    if (N % 4 == 0) {                                                                          \
        [[unroll]] for (int q_ = 0; q_ < N / 4; ++q_) {                                        \
            const vec4 v_ = B4[((base) >> 2) + q_];                                            \
            R(4 * q_) = v_.x; R(4 * q_ + 1) = v_.y; R(4 * q_ + 2) = v_.z; R(4 * q_ + 3) = v_.w;  \
        }                                                                                      \
    } else {                                                                                   \
        WKV_FOR_N(jr) R(jr) = B[(base) + jr]; WKV_END                                          \
    }

// The dtype of a tensor slot. A shader may define WKV_SLOT_DTYPE(slot) before including this
// file to make it a specialisation constant where the host knows it (no branch per load).
#ifndef WKV_SLOT_DTYPE
#define WKV_SLOT_DTYPE(slot) P.td[slot].dtype
#endif

// Tensor slots: the order of the wkv_view members of wkv_problem (src/backend.h).
#define SLOT_R 0
#define SLOT_W 1
#define SLOT_K 2
#define SLOT_V 3
#define SLOT_A 4
#define SLOT_B 5
#define SLOT_U 6
#define SLOT_Y 7
#define SLOT_SIN 8
#define SLOT_SOUT 9
#define SLOT_DY 10
#define SLOT_DSOUT 11
#define SLOT_DR 12
#define SLOT_DW 13
#define SLOT_DK 14
#define SLOT_DV 15
#define SLOT_DA 16
#define SLOT_DB 17
#define SLOT_DU 18
#define SLOT_DSIN 19
#define NUM_SLOTS 20
// binding = slot + 1; binding 0 is the parameter block; the backward workspace follows.
#define BINDING_CKPT 21
#define BINDING_REPLAY 22
// backward partial sums of the broadcast parameters' gradients (RWKV-6 du; RWKV-4 dw, du),
// summed over sequences in order by wkv_reduce.comp
#define BINDING_PART 23

// Checkpoint interval of the backward (tokens per segment). Host: WKV_VK_K.
#define WKV_K 32

// dtype codes (wkv_elem)
#define DT_F32 0
#define DT_F16 1
#define DT_BF16 2

// decay forms (wkv_decay_form)
#define FORM_DIRECT 1
#define FORM_LOG 2
#define FORM_EXP_NEG_EXP 3
#define FORM_CLAMPW 4

struct TensorDesc {
    int base;    // element index of element (0,0,0,0) inside the binding
    int dtype;   // DT_*
    int present; // 0: absent (the binding is a dummy)
    int pad_;
    ivec4 stride; // in elements, per logical axis (0 where the extent is 1)
};

// The parameter block P. A kernel with another one (attn_fwd.comp) defines WKV_PARAMS_BLOCK as
// its declaration of P, which must have a TensorDesc td[] member (the tensor helpers below use
// P.td); the WKV recurrences share this one.
#ifdef WKV_PARAMS_BLOCK
WKV_PARAMS_BLOCK
#else
layout(std430, set = 0, binding = 0) readonly buffer Params {
    int B, T, H, N_;
    int num_seqs, form, flags, op; // op: 4, 6 or 7 (wkv_op)
    TensorDesc td[NUM_SLOTS];
    ivec4 seqs[]; // per sequence: batch, t0, t1, first checkpoint segment (backward)
} P;
#endif

// Per dispatch (one batch of items).
layout(push_constant) uniform PushConstants {
    int item_base;  // first item (sequence * H + head) of this dispatch
    int ck_first;   // backward: global checkpoint matrix index that sits at ck_shift
    int ck_shift;   // backward: element index of that matrix inside the checkpoint binding
    int rep_stride; // backward: floats of replay scratch per item
} pc;

uint f32_to_bf16(float x) {
    uint u = floatBitsToUint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u; // NaN stays NaN
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

uint f32_to_16(int dt, float x) {
    return dt == DT_F16 ? (packHalf2x16(vec2(x, 0.0)) & 0xffffu) : f32_to_bf16(x);
}

float f16bits_to_f32(int dt, uint bits) {
    return dt == DT_F16 ? unpackHalf2x16(bits).x : uintBitsToFloat(bits << 16);
}

#ifdef WKV_STORAGE16
#define WKV_ALIAS16(NAME, BIND, QUAL) \
    layout(std430, set = 0, binding = BIND) QUAL buffer NAME##_b16 { uint16_t h[]; } NAME##_16;
#define WKV_LD16(NAME, e) uint(NAME##_16.h[e])
#define WKV_ST16(NAME, e, bits) NAME##_16.h[e] = uint16_t(bits);
#else
#define WKV_ALIAS16(NAME, BIND, QUAL)
#define WKV_LD16(NAME, e) ((NAME##_32.w[(e) >> 1] >> (uint((e) & 1) * 16u)) & 0xffffu)
#define WKV_ST16(NAME, e, bits)                                                    \
    {                                                                              \
        uint sh_ = uint((e) & 1) * 16u;                                            \
        atomicAnd(NAME##_32.w[(e) >> 1], ~(0xffffu << sh_));                       \
        atomicOr(NAME##_32.w[(e) >> 1], (bits) << sh_);                            \
    }
#endif

// An input tensor: float ld_NAME(element index).
#define WKV_INPUT(NAME, SLOT)                                                                \
    layout(std430, set = 0, binding = SLOT + 1) readonly buffer NAME##_b32 { uint w[]; }     \
        NAME##_32;                                                                           \
    WKV_ALIAS16(NAME, SLOT + 1, readonly)                                                    \
    float ld_##NAME(int e) {                                                                 \
        int dt = WKV_SLOT_DTYPE(SLOT);                                                       \
        if (dt == DT_F32) return uintBitsToFloat(NAME##_32.w[e]);                            \
        return f16bits_to_f32(dt, WKV_LD16(NAME, e));                                        \
    }

// An output tensor: st_NAME(element index, value).
#define WKV_OUTPUT(NAME, SLOT)                                                               \
    layout(std430, set = 0, binding = SLOT + 1) buffer NAME##_b32 { uint w[]; } NAME##_32;   \
    WKV_ALIAS16(NAME, SLOT + 1, )                                                            \
    void st_##NAME(int e, float x) {                                                         \
        int dt = WKV_SLOT_DTYPE(SLOT);                                                       \
        if (dt == DT_F32) {                                                                  \
            NAME##_32.w[e] = floatBitsToUint(x);                                             \
        } else {                                                                             \
            uint bits_ = f32_to_16(dt, x);                                                   \
            WKV_ST16(NAME, e, bits_)                                                         \
        }                                                                                    \
    }

// A float32 state tensor (never 16-bit): read-only or read-write words.
// ld4_NAME / st4_NAME: four consecutive elements from element e, a multiple of 4 (one 16-byte
// access; the caller checks the alignment and that all four are inside the tensor).
#define WKV_STATE_IN(NAME, SLOT)                                                             \
    layout(std430, set = 0, binding = SLOT + 1) readonly buffer NAME##_b32 { uint w[]; }     \
        NAME##_32;                                                                           \
    layout(std430, set = 0, binding = SLOT + 1) readonly buffer NAME##_b128 { uvec4 q[]; }   \
        NAME##_128;                                                                          \
    float ld_##NAME(int e) { return uintBitsToFloat(NAME##_32.w[e]); }                       \
    vec4 ld4_##NAME(int e) { return uintBitsToFloat(NAME##_128.q[e >> 2]); }
#define WKV_STATE_OUT(NAME, SLOT)                                                            \
    layout(std430, set = 0, binding = SLOT + 1) buffer NAME##_b32 { uint w[]; } NAME##_32;   \
    layout(std430, set = 0, binding = SLOT + 1) buffer NAME##_b128 { uvec4 q[]; } NAME##_128; \
    void st_##NAME(int e, float x) { NAME##_32.w[e] = floatBitsToUint(x); }                  \
    void st4_##NAME(int e, vec4 x) { NAME##_128.q[e >> 2] = floatBitsToUint(x); }

bool present(int slot) { return P.td[slot].present != 0; }

// Element index of per-token element (b, t, h, n) of slot.
int tok(int slot, int b, int t, int h, int n) {
    ivec4 s = P.td[slot].stride;
    return P.td[slot].base + b * s.x + t * s.y + h * s.z + n * s.w;
}

// Element index of state element (s, h, i = value, j = key) of slot.
int sti(int slot, int s, int h, int i, int j) {
    ivec4 st = P.td[slot].stride;
    return P.td[slot].base + s * st.x + h * st.y + i * st.z + j * st.w;
}

// exp(-0.5), the CLAMPW scale.
const float CLAMPW_SCALE = 0.60653065971263342;

// decay from w for the call's form, and d decay / d w (as backends/cpu/cpu_internal.h).
float decay_of_form(float w, int form, out float ddw) {
    if (form == FORM_DIRECT) {
        ddw = 1.0;
        return w;
    }
    if (form == FORM_LOG) {
        float d = exp(w);
        ddw = d;
        return d;
    }
    if (form == FORM_EXP_NEG_EXP) {
        float e = exp(w);
        float d = exp(-e);
        ddw = isinf(e) ? -0.0 : -e * d;
        return d;
    }
    // FORM_CLAMPW: sigmoid without exp of a large number
    float z = exp(-abs(w));
    float inv = 1.0 / (1.0 + z);
    float sig = w >= 0.0 ? inv : z * inv;
    float d = exp(-CLAMPW_SCALE * sig);
    ddw = -CLAMPW_SCALE * (z * inv * inv) * d;
    return d;
}

#ifndef WKV_PARAMS_BLOCK
float decay_of(float w, out float ddw) { return decay_of_form(w, P.form, ddw); }
#endif
