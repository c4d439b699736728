/*
 * libwkv — the WKV recurrences of RWKV-4, RWKV-5/6 and RWKV-7, forward and backward,
 * on the CPU, CUDA or Vulkan, behind one C99 ABI.
 *
 * ============================================================================ USAGE
 *
 *   wkv_context* ctx = NULL;
 *   wkv_context_options opt = {0};                 // zeroed = defaults: AUTO backend
 *   opt.struct_size = sizeof opt;
 *   if (wkv_context_create(&opt, &ctx) != WKV_OK) { puts(wkv_last_error(NULL)); ... }
 *
 *   int64_t shape[4] = {B, T, H, N};               // every per-token tensor is [B,T,H,N]
 *   wkv_forward_desc f = {0};
 *   f.struct_size = sizeof f;
 *   f.op = WKV_OP_RWKV7;  f.decay_form = WKV_DECAY_CLAMPW;
 *   f.r = wkv_tensor_make(r_ptr, WKV_DTYPE_F32, 4, shape);   // contiguous host tensor
 *   ...  same for w, k, v, a, b and the output y
 *   f.state_in  = wkv_tensor_make(s0, WKV_DTYPE_F32, 4, sshape);   // optional, [B,H,N,N]
 *   f.state_out = wkv_tensor_make(s1, WKV_DTYPE_F32, 4, sshape);   // optional
 *   if (wkv_forward(ctx, &f) != WKV_OK) puts(wkv_last_error(ctx));
 *   wkv_context_destroy(ctx);
 *
 * Training: fill a wkv_backward_desc that points at the same forward descriptor, give it dy
 * (and optionally d state_out), ask wkv_workspace_size() for the scratch it needs, and call
 * wkv_backward(). Backward recomputes the forward from the checkpointed states it writes into
 * that workspace; it never divides by the decay.
 *   To skip that recomputation, let the forward leave the checkpoints behind: give the forward
 * descriptor the backward's workspace (f.workspace, f.workspace_size: wkv_workspace_size() of
 * the backward descriptor, same memory-space rules), and set WKV_BACKWARD_REUSE_CHECKPOINTS in
 * the backward's flags. You promise that between the two calls neither the workspace's bytes
 * nor the forward's input data changed (the library cannot see changed data). The context
 * checks the rest: a backward with the flag must run on the same context, with a workspace at
 * the same address that a forward saved into, whose descriptor matches the one the forward ran
 * with (op, decay form, flags, dtypes, shapes, strides, packing, state_in present or not);
 * otherwise it fails with WKV_ERROR_INVALID_ARGUMENT naming `workspace`. Where a backend does
 * not save checkpoints (today the CPU backend does; CUDA for RWKV-6/5 and RWKV-7 at
 * N = 32 and 64, with the workspace in device memory), the forward ignores its workspace and
 * such a backward recomputes them as without the flag: the flag never changes a result.
 *
 * ============================================================================ CONVENTIONS
 *
 * - Every function returns a wkv_status; WKV_OK is 0. On any other status nothing was written
 *   to any output tensor (but after WKV_ERROR_DEVICE_LOST the failing call's outputs are
 *   undefined: a GPU may have written part of them), and wkv_last_error(ctx) holds a message
 *   that names the argument.
 *   The library never aborts, never prints (unless a log callback asks for it) and never
 *   throws across this boundary.
 * - Out-parameters come first after the context. _create/_destroy come in pairs; destroy
 *   functions accept NULL.
 * - Every struct that crosses the ABI starts with `struct_size` (set it to sizeof the struct
 *   you compiled against). A zeroed struct with struct_size set means "all defaults".
 * - Enum values are pinned forever; new values are only ever added.
 * - Thread safety: distinct contexts may be used from distinct threads at the same time. One
 *   context is externally synchronised: a second call that overlaps a running call on the same
 *   context returns WKV_ERROR_BUSY and touches nothing. The functions without a context
 *   (version, info, status strings) are safe from any thread.
 *
 * ============================================================================ THE OPS
 *
 * Indices: i = value channel, j, l = key channels (0..N-1), per batch b and head h. The state
 * S is [N][N] float32 indexed S[i][j] (value row, key column); WKV_FLAG_STATE_KEY_MAJOR flips
 * that to S[j][i] (flash-linear-attention's order). Without state_in, S starts at zero.
 * decay_t[j] is computed from w_t[j] by the descriptor's decay_form.
 *
 * RWKV-7 (WKV_OP_RWKV7): inputs r, w, k, v, a, b, output y, all [B,T,H,N]. Per token t:
 *     sa[i]   = sum_l S[i][l] * a_t[l]                        (S before the update)
 *     S[i][j] = S[i][j] * decay_t[j] + sa[i] * b_t[j] + v_t[i] * k_t[j]
 *     y_t[i]  = sum_j S[i][j] * r_t[j]                        (S after the update)
 *
 * RWKV-6 (WKV_OP_RWKV6): inputs r, w, k, v [B,T,H,N] and the bonus u [H,N]; y [B,T,H,N]:
 *     y_t[i]  = sum_j r_t[j] * (S[i][j] + u[j] * k_t[j] * v_t[i])   (S before the update)
 *     S[i][j] = S[i][j] * decay_t[j] + k_t[j] * v_t[i]
 *   RWKV-5 is RWKV-6 with a decay that does not change over time: pass w with a T-stride 0.
 *
 * Segments of one sequence (context parallelism): for RWKV-7 and RWKV-6 a segment's final
 * state is affine in its initial one, S_end = S_start * A + B (A acting on the key axis). B is
 * the segment's final state from a zero state; A is its final state from the identity
 * (S[i][j] = 1 if i == j) with v = 0. So segments can run at the same time, their (A, B)
 * compose in order ((A1, B1) then (A2, B2) = (A1 A2, B1 A2 + B2)), and y is linear in the
 * initial state S too: y_t[i] = y0_t[i] + sum_m S[i][m] y1_t[m] (y0: the run from zeros;
 * y1: the run from the identity with v = 0), so no third run is needed. RWKV-4 (y is a
 * ratio): each segment runs once more from its true initial state, and a segment of L tokens
 * maps a start (aa0, bb0, pp0) to its end from the zero state (aaS, bbS, ppS) plus the start
 * decayed by e^(L wd): p = max(pp0 + L wd, ppS), aa = aa0 e^(pp0 + L wd - p) + aaS e^(ppS - p), bb alike,
 * pp = p. examples/c/segments.c does it with wkv_forward alone (the segments as the batch of a
 * strided view, v = 0 as a broadcast zero); the Python package does it across processes and
 * devices (wkv.torch.context_parallel_rwkv7, _rwkv6, _rwkv4).
 *
 * RWKV-4 (WKV_OP_RWKV4): per channel c of C: k, v, y are [B,T,C], w (time_decay) and u
 *   (time_first) are [C]; the per-step decay is exp(-exp(w)) (wd = -exp(w), the usual
 *   -exp(time_decay) convention), so decay_form must be WKV_DECAY_EXP_NEG_EXP. The state is
 *   the numerically stable (aa, bb, pp) triple (numerator, denominator, running max exponent:
 *   the true numerator is aa * exp(pp)), [B,3,C] planar (part 0 aa, 1 bb, 2 pp), or [B,C,3]
 *   with WKV_FLAG_RWKV4_STATE_INTERLEAVED. Per token t:
 *     q  = max(pp, u + k_t)
 *     y_t = (e^(pp-q) aa + e^(u+k_t-q) v_t) / (e^(pp-q) bb + e^(u+k_t-q))
 *     q2 = max(pp + wd, k_t)
 *     aa = e^(pp+wd-q2) aa + e^(k_t-q2) v_t;  bb = e^(pp+wd-q2) bb + e^(k_t-q2);  pp = q2
 *   Without state_in the state starts at aa = 0, bb = 0, pp = -1e38. Every exponent is <= 0,
 *   so no k overflows. Backward differentiates these formulas as written: the state gradients
 *   (dstate_out, dstate_in) are with respect to this max-tracking representation (a max
 *   passes its gradient to the larger argument), and dw, du sum over all batches and tokens.
 *
 * Not every backend implements every op; wkv_backend_get_info() says which, and a call for a
 * missing one returns WKV_ERROR_UNSUPPORTED.
 *
 * ============================================================================ NUMERICS
 *
 * Inputs and outputs may be float32, float16 or bfloat16 (each tensor its own dtype); the state
 * is always float32 and all arithmetic accumulates in float32. float32 paths match the float64
 * reference to ~1e-5 (norm-wise relative error); 16-bit inputs to ~1e-2. A result is never NaN
 * where the reference is finite.
 *
 * NaN and Inf: propagated, never invented. A NaN or infinite input is not an error (no call
 * scans its inputs). Against the float64 reference (the formulas above, evaluated as written):
 * every output the reference keeps finite comes out finite, with the usual accuracy; a NaN
 * input makes NaN exactly the outputs the reference makes NaN; an infinite input makes
 * non-finite the outputs the reference makes infinite. Where the reference turns an infinity
 * into NaN (inf - inf, 0 * inf) a backend may give NaN, an infinity or the formula's limit
 * (e.g. 0 for the derivative of exp(-exp(w)) at w = +Inf). E.g. a NaN in k at token t of one
 * (sequence, head) makes that head's y NaN from t on, and its state_out; other heads and
 * sequences are untouched.
 */
#ifndef WKV_WKV_H
#define WKV_WKV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(WKV_STATIC)
#define WKV_API
#elif defined(_WIN32)
#ifdef WKV_BUILDING
#define WKV_API __declspec(dllexport)
#else
#define WKV_API __declspec(dllimport)
#endif
#else
#define WKV_API __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------------------- version */

#define WKV_VERSION_MAJOR 0
#define WKV_VERSION_MINOR 1
#define WKV_VERSION_PATCH 0
/* major * 10000 + minor * 100 + patch, of the header you compiled against. */
#define WKV_VERSION (WKV_VERSION_MAJOR * 10000 + WKV_VERSION_MINOR * 100 + WKV_VERSION_PATCH)

/* The version of the loaded library, encoded as WKV_VERSION. Compare with WKV_VERSION. */
WKV_API uint32_t wkv_version(void);
/* "0.1.0"; and one line on how the library was built (compiler, backends compiled). Static
 * strings, never freed. */
WKV_API const char* wkv_version_string(void);
WKV_API const char* wkv_build_info(void);

/* -------------------------------------------------------------------------------- status */

/* X(name, value, message). Values are pinned forever. */
#define WKV_STATUS_LIST(X)                                                                    \
    X(WKV_OK, 0, "success")                                                                   \
    X(WKV_ERROR_NULL_POINTER, 1, "a required pointer is NULL")                                \
    X(WKV_ERROR_INVALID_ARGUMENT, 2, "an argument has a value outside its domain")           \
    X(WKV_ERROR_STRUCT_SIZE, 3, "struct_size does not match a known version of the struct")  \
    X(WKV_ERROR_SHAPE, 4, "tensor shapes are non-positive or inconsistent")                   \
    X(WKV_ERROR_DTYPE, 5, "a tensor has a dtype this argument does not accept")               \
    X(WKV_ERROR_OVERFLOW, 6, "a size or byte offset overflows 64-bit arithmetic")             \
    X(WKV_ERROR_ALIASING, 7, "an output overlaps another tensor")                             \
    X(WKV_ERROR_DEVICE_MISMATCH, 8, "a tensor lives in a memory space the backend cannot use")\
    X(WKV_ERROR_SEQUENCE_OFFSETS, 9, "packed-sequence offsets are invalid")                   \
    X(WKV_ERROR_WORKSPACE_TOO_SMALL, 10, "the workspace is smaller than wkv_workspace_size")  \
    X(WKV_ERROR_UNSUPPORTED, 11, "the backend does not implement this op/dtype/size")        \
    X(WKV_ERROR_BACKEND_UNAVAILABLE, 12, "the requested backend is not present or usable")   \
    X(WKV_ERROR_OUT_OF_MEMORY, 13, "an allocation failed")                                    \
    X(WKV_ERROR_BUSY, 14, "another call is running on this context")                          \
    X(WKV_ERROR_DEVICE_LOST, 15, "the device failed; the context can only be destroyed")      \
    X(WKV_ERROR_INTERNAL, 16, "an internal error (a bug in libwkv: please report it)")

typedef enum wkv_status {
#define WKV_STATUS_ENUM_(name, value, message) name = value,
    WKV_STATUS_LIST(WKV_STATUS_ENUM_)
#undef WKV_STATUS_ENUM_
    WKV_STATUS_FORCE32_ = 0x7fffffff
} wkv_status;

/* "WKV_ERROR_SHAPE: tensor shapes are ..." for any value; never NULL, never freed. */
WKV_API const char* wkv_status_string(wkv_status status);

/* ------------------------------------------------------------------------------- tensors */

/* Device and dtype codes are DLPack's (DLDeviceType, DLDataTypeCode), so a DLTensor can be
 * reinterpreted as a wkv_tensor field for field. */
typedef enum wkv_device_type {
    WKV_DEVICE_CPU = 1,
    WKV_DEVICE_CUDA = 2,
    WKV_DEVICE_CUDA_HOST = 3,
    WKV_DEVICE_VULKAN = 7,
    WKV_DEVICE_CUDA_MANAGED = 13,
    WKV_DEVICE_FORCE32_ = 0x7fffffff
} wkv_device_type;

typedef struct wkv_device {
    int32_t type; /* a wkv_device_type */
    int32_t id;   /* device ordinal; 0 for the CPU */
} wkv_device;

enum { WKV_DTYPE_CODE_INT = 0, WKV_DTYPE_CODE_UINT = 1, WKV_DTYPE_CODE_FLOAT = 2,
       WKV_DTYPE_CODE_BFLOAT = 4 };

typedef struct wkv_dtype {
    uint8_t code;   /* WKV_DTYPE_CODE_* */
    uint8_t bits;   /* 16, 32 or 64 */
    uint16_t lanes; /* always 1 */
} wkv_dtype;

#define WKV_DTYPE_F32 wkv_dtype_make(WKV_DTYPE_CODE_FLOAT, 32)
#define WKV_DTYPE_F16 wkv_dtype_make(WKV_DTYPE_CODE_FLOAT, 16)
#define WKV_DTYPE_BF16 wkv_dtype_make(WKV_DTYPE_CODE_BFLOAT, 16)
#define WKV_DTYPE_I64 wkv_dtype_make(WKV_DTYPE_CODE_INT, 64)

/* A strided view of memory, laid out exactly like DLPack's DLTensor.
 * Element (i0, i1, ...) lives at (char*)data + byte_offset + sizeof(elem) * sum(ik * strides[k]).
 * strides == NULL means C-contiguous (row-major). A stride of 0 broadcasts an input.
 * The library never keeps the pointers after the call returns.
 * A tensor whose data is NULL is "absent" (allowed only where a field says optional). */
typedef struct wkv_tensor {
    void* data;
    wkv_device device;
    int32_t ndim;
    wkv_dtype dtype;
    const int64_t* shape;   /* ndim entries */
    const int64_t* strides; /* ndim entries, in elements; NULL = contiguous */
    uint64_t byte_offset;
} wkv_tensor;

static inline wkv_dtype wkv_dtype_make(uint8_t code, uint8_t bits) {
    wkv_dtype d;
    d.code = code;
    d.bits = bits;
    d.lanes = 1;
    return d;
}

/* A contiguous host tensor. `shape` must outlive every call that uses the tensor. */
static inline wkv_tensor wkv_tensor_make(void* data, wkv_dtype dtype, int32_t ndim,
                                         const int64_t* shape) {
    wkv_tensor t;
    t.data = data;
    t.device.type = WKV_DEVICE_CPU;
    t.device.id = 0;
    t.ndim = ndim;
    t.dtype = dtype;
    t.shape = shape;
    t.strides = NULL;
    t.byte_offset = 0;
    return t;
}

/* ------------------------------------------------------------------------------- context */

typedef enum wkv_backend {
    WKV_BACKEND_AUTO = 0, /* CUDA, else Vulkan, else CPU; WKV_BACKEND=cpu|cuda|vulkan overrides */
    WKV_BACKEND_CPU = 1,
    WKV_BACKEND_CUDA = 2,
    WKV_BACKEND_VULKAN = 3,
    WKV_BACKEND_COUNT_ = 4,
    WKV_BACKEND_FORCE32_ = 0x7fffffff
} wkv_backend;

typedef enum wkv_log_level {
    WKV_LOG_ERROR = 1, /* every failing call, with its message */
    WKV_LOG_WARN = 2,  /* a fallback: a backend asked for was unavailable */
    WKV_LOG_INFO = 3,  /* which backend a context chose and why */
    WKV_LOG_DEBUG = 4,
    WKV_LOG_FORCE32_ = 0x7fffffff
} wkv_log_level;

typedef void (*wkv_log_fn)(void* user_data, wkv_log_level level, const char* message);

/* Runs fn(task_data, i) for every i in [begin, end). */
typedef void (*wkv_task_fn)(void* task_data, int64_t begin, int64_t end);
/* A host job system: must call fn over [0, n) — split into any ranges, on any threads — and
 * return only when every range has finished. The library never calls it re-entrantly. */
typedef void (*wkv_parallel_for_fn)(void* user_data, int64_t n, wkv_task_fn fn, void* task_data);

typedef struct wkv_context_options {
    size_t struct_size;           /* sizeof(wkv_context_options) */
    wkv_backend backend;          /* default AUTO */
    int32_t device_index;         /* GPU ordinal; default 0 */
    int32_t cpu_threads;          /* CPU threads, 1..1024; 0 = WKV_NUM_THREADS or all cores */
    wkv_parallel_for_fn parallel_for; /* optional: run CPU work on the host's threads instead */
    void* parallel_for_user_data;
    wkv_log_fn log;               /* optional; the library is silent without it */
    void* log_user_data;
    wkv_log_level log_level;      /* the most verbose level passed to `log`; default WARN */
    /* WKV_CONTEXT_* bits; 0 = defaults. Appended: a struct_size without it means 0. (64 bits so
     * that it starts past the end of the older struct instead of in its tail padding, which an
     * older caller may have left uninitialised.) Unknown bits: WKV_ERROR_INVALID_ARGUMENT. */
    uint64_t flags;
} wkv_context_options;

/* wkv_context_options.flags */
enum {
    /* Vulkan: a call whose tensors (and workspace) are all wkv_buffers returns once its work is
     * submitted instead of when it has finished, so that consecutive calls (a decode loop) queue
     * back to back on the GPU; its outputs are complete after wkv_context_synchronize. See WHEN
     * OUTPUTS ARE READY below. CUDA calls on device memory are asynchronous anyway (the bit is
     * accepted and changes nothing); the CPU backend ignores it. */
    WKV_CONTEXT_ASYNC = 1u << 0
};

typedef struct wkv_context wkv_context;

/* Creates a context on the backend the options ask for. On failure *out is NULL and
 * wkv_last_error(NULL) says why. Destroy with wkv_context_destroy. */
WKV_API wkv_status wkv_context_create(const wkv_context_options* options, wkv_context** out);
WKV_API void wkv_context_destroy(wkv_context* ctx);
/* The backend this context runs on (never AUTO). */
WKV_API wkv_backend wkv_context_backend(const wkv_context* ctx);
/* The message of the last failing call on ctx ("" after a success), or with ctx == NULL of the
 * last failing context-free call (wkv_context_create, queries) on this thread. Valid until the
 * next call on the same context / thread. */
WKV_API const char* wkv_last_error(const wkv_context* ctx);
/* Waits until all work ctx has enqueued has finished (see the memory model below: on CUDA,
 * and on Vulkan with WKV_CONTEXT_ASYNC, calls whose tensors are all on the device return before
 * their work finishes). Then every output of every earlier call on ctx is complete. Cheap when
 * there is nothing to wait for; on the CPU backend, and on Vulkan without WKV_CONTEXT_ASYNC,
 * every call is complete when it returns, and this is a no-op. WKV_ERROR_DEVICE_LOST when
 * enqueued work failed on the device. */
WKV_API wkv_status wkv_context_synchronize(wkv_context* ctx);
/* WKV_OK while ctx can run calls; WKV_ERROR_DEVICE_LOST once a call on it has returned
 * WKV_ERROR_DEVICE_LOST (the GPU failed or was reset): from then on every call on ctx returns
 * WKV_ERROR_DEVICE_LOST without touching anything, and ctx can only be destroyed (destroy still
 * frees everything; a new context may work). Other contexts are not affected. Failures such as
 * WKV_ERROR_OUT_OF_MEMORY leave the context healthy. WKV_ERROR_NULL_POINTER for NULL. Safe from
 * any thread, even while a call runs on ctx. */
WKV_API wkv_status wkv_context_health(const wkv_context* ctx);

/* ----------------------------------------------------------------------------- the ops */

typedef enum wkv_op {
    WKV_OP_RWKV4 = 4,
    WKV_OP_RWKV6 = 6, /* also RWKV-5: w with a T-stride of 0 */
    WKV_OP_RWKV7 = 7,
    WKV_OP_FORCE32_ = 0x7fffffff
} wkv_op;

/* How w gives the per-step multiplier decay (0 is "not set", an error). */
typedef enum wkv_decay_form {
    WKV_DECAY_DIRECT = 1,      /* decay = w */
    WKV_DECAY_LOG = 2,         /* decay = exp(w)            (w = log-decay, w <= 0) */
    WKV_DECAY_EXP_NEG_EXP = 3, /* decay = exp(-exp(w))      (RWKV-4/5/6 checkpoints) */
    WKV_DECAY_CLAMPW = 4,      /* decay = exp(-exp(-0.5) * sigmoid(w))  (RWKV-7 models) */
    WKV_DECAY_FORCE32_ = 0x7fffffff
} wkv_decay_form;

enum {
    /* state_in / state_out / their gradients are [.., N(key), N(value)] instead of [.., value, key] */
    WKV_FLAG_STATE_KEY_MAJOR = 1u << 0,
    /* RWKV-4 state is [B, C, 3] instead of [B, 3, C] */
    WKV_FLAG_RWKV4_STATE_INTERLEAVED = 1u << 1
};

typedef struct wkv_forward_desc {
    size_t struct_size; /* sizeof(wkv_forward_desc) */
    wkv_op op;
    wkv_decay_form decay_form;
    uint32_t flags; /* WKV_FLAG_* */
    /* Inputs, [B,T,H,N] (RWKV-4: k, v [B,T,C]). Unused ones for the op must be absent. */
    wkv_tensor r, w, k, v, a, b;
    wkv_tensor u; /* RWKV-6 bonus [H,N]; RWKV-4 time_first [C]. RWKV-4 w is [C]. */
    wkv_tensor y; /* output, same shape as v */
    /* Optional float32 state, [S,H,N,N] where S = B, or the number of sequences when packed.
     * state_out may be the very same memory as state_in (in-place stepping). */
    wkv_tensor state_in;
    wkv_tensor state_out;
    /* Optional packed variable-length sequences: B must be 1, and sequence s covers tokens
     * [seq_offsets[s], seq_offsets[s+1]) of the T axis. seq_offsets is a host array of
     * num_seqs + 1 non-decreasing int64 values from 0 to T (an empty sequence passes its state
     * through). num_seqs = 0 means "not packed". */
    const int64_t* seq_offsets;
    int64_t num_seqs;
    /* Optional (training): the workspace of the wkv_backward that will differentiate this call
     * (wkv_workspace_size() of that backward descriptor, in the backward's memory space).
     * When set, the forward also writes into it the state checkpoints the backward needs, and
     * that backward may skip recomputing them (WKV_BACKWARD_REUSE_CHECKPOINTS; see USAGE).
     * NULL (with size 0) = not training; NULL with a size -> WKV_ERROR_NULL_POINTER. It is
     * checked on every backend before anything is written: too small ->
     * WKV_ERROR_WORKSPACE_TOO_SMALL, overlapping a tensor -> WKV_ERROR_ALIASING; a backend that
     * does not save for this shape (see USAGE) then leaves it untouched and the backward
     * recomputes. A later backward without the flag, or a forward,
     * that writes into the workspace makes the context forget the checkpoints. (Appended
     * fields: a struct_size without them means NULL, 0.) */
    void* workspace;
    size_t workspace_size;
    /* Optional: temporary memory the forward may use while it runs, owned by the caller
     * (unrelated to `workspace`, which is the backward's). wkv_forward_scratch_size() says how
     * many bytes this descriptor's call can use on this context: 0 where it needs none (always
     * on the CPU and Vulkan backends; on CUDA wherever the sequential kernel runs). Where it is
     * nonzero and scratch is NULL, the backend takes that memory itself (CUDA: a stream-ordered
     * pool of the context, wkv_cuda.h); give scratch to keep the library from allocating.
     * Memory space: what a GPU backend addresses, i.e. on CUDA a device (or managed) pointer or a
     * wkv_buffer of the context (its first scratch_size bytes are used); any alignment. Its
     * first wkv_forward_scratch_size() bytes must not overlap any tensor of the call. Checked
     * before anything runs: NULL with a size -> WKV_ERROR_NULL_POINTER; a wkv_buffer of another
     * context -> WKV_ERROR_DEVICE_MISMATCH, or scratch_size beyond its buffer -> WKV_ERROR_SHAPE
     * (on every backend); and where the call uses scratch: scratch_size smaller than it ->
     * WKV_ERROR_WORKSPACE_TOO_SMALL, overlapping a tensor -> WKV_ERROR_ALIASING, host memory
     * on CUDA -> WKV_ERROR_DEVICE_MISMATCH; each message names desc->scratch(_size). Where the
     * call uses none, the scratch is otherwise ignored (never read or written). Contents are
     * undefined after the call; like the tensors, the memory must stay valid until an enqueued
     * call has finished. (Appended: a struct_size without them means NULL, 0.) */
    void* scratch;
    size_t scratch_size;
} wkv_forward_desc;

enum {
    /* desc->workspace holds what wkv_forward saved into it (forward_desc->workspace) on this
     * context, with a descriptor equal to desc->forward, and neither the workspace nor the
     * forward's input data changed since: the backward reuses those checkpoints instead of
     * recomputing them. See USAGE (Training). */
    WKV_BACKWARD_REUSE_CHECKPOINTS = 1u << 0
};

typedef struct wkv_backward_desc {
    size_t struct_size; /* sizeof(wkv_backward_desc) */
    /* The forward call to differentiate: its inputs, state_in, packing and forms are read;
     * its y and state_out are ignored (they need not be valid). */
    const wkv_forward_desc* forward;
    wkv_tensor dy;         /* gradient of the loss w.r.t. y, shape of y */
    wkv_tensor dstate_out; /* optional: gradient w.r.t. the final state (absent = zero) */
    /* Outputs: gradients w.r.t. each input as given (dw is w.r.t. w in its decay_form). The
     * ones of the op are required (RWKV-7: dr dw dk dv da db; RWKV-6: dr dw dk dv du;
     * RWKV-4: dw du dk dv); a broadcast input (stride 0) gets a gradient of the full shape. */
    wkv_tensor dr, dw, dk, dv, da, db, du;
    wkv_tensor dstate_in; /* optional: gradient w.r.t. state_in (shape of the state) */
    void* workspace;      /* scratch of at least wkv_workspace_size() bytes, memory space of
                             the backend; contents undefined on return (but checkpoints a
                             forward saved in it stay reusable by further backwards) */
    size_t workspace_size;
    uint32_t flags;       /* WKV_BACKWARD_* (appended: a struct_size without it means 0) */
} wkv_backward_desc;

/* Runs the forward recurrence. */
WKV_API wkv_status wkv_forward(wkv_context* ctx, const wkv_forward_desc* desc);
/* Runs the backward pass; needs desc->workspace of wkv_workspace_size() bytes. */
WKV_API wkv_status wkv_backward(wkv_context* ctx, const wkv_backward_desc* desc);
/* The workspace wkv_backward needs for this descriptor, in bytes (validates it first). The
 * size may depend on the context (its backend, its thread count): ask the context that will
 * run the backward. Any alignment works; the library aligns inside it. */
WKV_API wkv_status wkv_workspace_size(wkv_context* ctx, size_t* out_bytes,
                                      const wkv_backward_desc* desc);
/* The scratch (desc->scratch) wkv_forward can use for this descriptor on ctx, in bytes; 0 when
 * the call needs none. Validates desc as wkv_forward does (its scratch only for NULL with a
 * size and wkv_buffer ownership: the size is what is being asked). The answer depends on the
 * context (backend, device) and on the whole descriptor (shapes, dtypes, decay form, packing,
 * whether its workspace makes the forward save checkpoints): ask with the descriptor you will
 * run. It does not change while the context lives, so a caller may size its arena once per
 * shape. */
WKV_API wkv_status wkv_forward_scratch_size(wkv_context* ctx, size_t* out_bytes,
                                            const wkv_forward_desc* desc);

/* ------------------------------------------------------------------------------ attention
 *
 * Softmax attention, for hybrid models (RWKV blocks with a few attention layers), in the
 * online-softmax ("flash") form: the Tq x Tk matrix is never formed (its backward:
 * wkv_attention_backward, below). Per batch b, query head h
 * (key/value head g = h / (Hq / Hkv): grouped-query and multi-query heads) and query row i:
 *     s_j = scale * q_i . k_j            over the keys j the mask allows
 *     o_i = sum_j softmax(s)_j v_j       lse_i = log sum_j exp(s_j)   (natural log)
 * Causal masking is bottom-right aligned: row i sees keys j <= i + (Tk - Tq). A row that sees
 * no key (causal with Tq > Tk) gets o_i = 0 and lse_i = -inf, never NaN.
 * Packed variable-length sequences: B = 1, and sequence s has query rows [q_offsets[s],
 * q_offsets[s+1]) and keys [k_offsets[s], k_offsets[s+1]) (both host arrays of num_seqs + 1
 * non-decreasing values from 0 to Tq, resp. Tk; the mask is aligned per sequence).
 * Computed in float32 whatever the I/O dtype (float32, float16, bfloat16; q, k, v, o share one).
 * Backends: CPU, Vulkan and CUDA (D up to 256). The CUDA kernels have not yet run on a GPU, so
 * they are opt-in: WKV_CUDA_ATTENTION=1 in the environment when the context is created, else
 * WKV_ERROR_UNSUPPORTED (and the configuration is listed with fits = 0). A pinned configuration (desc->config) that the
 * backend does not list is WKV_ERROR_INVALID_ARGUMENT, one listed with fits = 0
 * WKV_ERROR_UNSUPPORTED. */
enum { WKV_ATTENTION_CAUSAL = 1u << 0 };

typedef struct wkv_attention_desc {
    size_t struct_size; /* sizeof(wkv_attention_desc) */
    uint32_t flags;     /* WKV_ATTENTION_* */
    float scale;        /* the logits' scale; 0 means 1 / sqrt(D) */
    wkv_tensor q;       /* [B, Tq, Hq, D] */
    wkv_tensor k, v;    /* [B, Tk, Hkv, D], Hq a multiple of Hkv */
    wkv_tensor o;       /* output, [B, Tq, Hq, D] */
    wkv_tensor lse;     /* optional float32 output [B, Hq, Tq] (data NULL: not written) */
    const int64_t* q_offsets; /* packed sequences (num_seqs > 0), else NULL */
    const int64_t* k_offsets;
    int64_t num_seqs;
    /* Optional: the name of a kernel configuration of this context's backend
     * (wkv_attention_configs) to use for this call; NULL = the backend's own choice. */
    const char* config;
} wkv_attention_desc;

WKV_API wkv_status wkv_attention(wkv_context* ctx, const wkv_attention_desc* desc);

/* The backward of a wkv_attention call: given dout = dL/do (and optionally dlse = dL/dlse), the
 * gradients dq, dk, dv.
 *     p_j = exp(s_j - lse_i)    delta_i = dout_i . o_i - dlse_i    ds_j = p_j (dout_i . v_j - delta_i)
 *     dq_i = scale sum_j ds_j k_j     dk_j += scale ds_j q_i     dv_j += p_j dout_i
 * (sums over the rows and keys the mask pairs; a kv head sums over its Hq / Hkv query heads).
 * It reads the forward descriptor's q, k, v, flags, scale and packing, and its o and lse as that
 * forward call wrote them (so the forward must have asked for lse); forward->config is not read
 * (the backward has its own tiles). dout, dq, dk, dv share q's dtype; computed in float32; no
 * workspace; the result does not depend on the thread count (no atomics). A key no row sees
 * gets dk = dv = 0; a row that sees no key gets dq = 0. Backends: CPU and Vulkan (D <= 256);
 * CUDA (D <= 256 where the device's shared memory allows, 128 or 64 elsewhere) opt-in like its
 * forward (WKV_CUDA_ATTENTION=1 at context creation). */
typedef struct wkv_attention_backward_desc {
    size_t struct_size;                 /* sizeof(wkv_attention_backward_desc) */
    const wkv_attention_desc* forward;  /* the forward call (its o and lse are inputs here) */
    wkv_tensor dout;                    /* [B, Tq, Hq, D] */
    wkv_tensor dlse;                    /* optional float32 [B, Hq, Tq] (data NULL: zero) */
    wkv_tensor dq;                      /* output, [B, Tq, Hq, D] */
    wkv_tensor dk, dv;                  /* outputs, [B, Tk, Hkv, D] */
} wkv_attention_backward_desc;

WKV_API wkv_status wkv_attention_backward(wkv_context* ctx, const wkv_attention_backward_desc* desc);

/* A kernel configuration a backend has instantiated. Fields that do not apply are 0. */
typedef struct wkv_attention_config {
    size_t struct_size;  /* set by the caller (the array's element size) */
    char name[64];       /* what wkv_attention_desc.config takes */
    wkv_dtype dtype;     /* the I/O dtype it is built for; code 0 bits 0: any */
    int32_t head_dim;    /* D it is built for; 0: any (up to max_head_dim) */
    int32_t max_head_dim;
    int32_t block_q;     /* query rows per tile (Br) */
    int32_t block_kv;    /* keys per tile (Bc) */
    int32_t warps;       /* GPU warps / subgroups per block; CPU: 0 */
    int32_t async_copy, eager_load, swizzle, double_buffer; /* 1 when the kernel does it */
    int32_t softmax;     /* 0: online softmax in float32 */
    uint64_t shared_bytes; /* on-chip memory per block (CPU: the tile's scratch per thread) */
    int32_t fits;        /* 1 when this device can run it */
    int32_t is_default;  /* 1 where the backend picks it when none is pinned: for any call, or
                          * (dtype / head_dim set) for the calls of that dtype and head dim */
} wkv_attention_config;

/* Lists the configurations of ctx's backend: writes min(capacity, total) of them into out
 * (out may be NULL with capacity 0) and the total into *count. */
WKV_API wkv_status wkv_attention_configs(wkv_context* ctx, wkv_attention_config* out, int32_t capacity,
                                         int32_t* count);

/* ------------------------------------------------------------------------- introspection */

enum { WKV_MAX_HEAD_SIZES = 16 };

typedef struct wkv_backend_info {
    size_t struct_size;     /* set by the caller */
    wkv_backend backend;
    const char* name;       /* "cpu", "cuda", "vulkan" */
    int32_t available;      /* 1 when a context can be created on it */
    const char* reason;     /* why it is unavailable, or where it was loaded from */
    int32_t device_count;
    uint32_t ops;           /* bit (1u << wkv_op) per op with forward and backward */
    uint32_t dtypes;        /* bit 0 f32, bit 1 f16, bit 2 bf16 */
    uint32_t decay_forms;   /* bit (1u << wkv_decay_form) per form */
    int32_t any_head_size;  /* 1 when every N >= 1 works */
    int32_t num_head_sizes; /* otherwise the N that work: */
    int32_t head_sizes[WKV_MAX_HEAD_SIZES];
} wkv_backend_info;

/* What a backend is and supports; loads its plugin on first use. Strings are owned by the
 * library and live until the process ends. */
WKV_API wkv_status wkv_backend_get_info(wkv_backend backend, wkv_backend_info* out);

typedef struct wkv_device_info {
    size_t struct_size; /* set by the caller */
    char name[256];
    uint64_t memory_bytes; /* 0 when unknown */
    int32_t compute_units; /* cores, SMs or compute units */
} wkv_device_info;

WKV_API wkv_status wkv_device_get_info(wkv_backend backend, int32_t index, wkv_device_info* out);

/* ======================================================================= DEVICE BUFFERS
 *
 * MEMORY MODEL. Where a tensor's memory is, is said by its device.type:
 *
 *   WKV_DEVICE_CPU     host memory: data is a host pointer. Every backend accepts it. A GPU
 *                      backend (Vulkan, CUDA) stages it through device memory of its own: it
 *                      copies each host tensor's byte span to the device before the call and
 *                      each host output's span back after it. A call with any host tensor is
 *                      therefore synchronous (complete when it returns, on CUDA too) and much
 *                      slower than keeping the tensors on the device; on CUDA it cannot be
 *                      captured into a CUDA graph. Good for tests, tools and one-off calls.
 *   WKV_DEVICE_CUDA_HOST  pinned host memory (cudaMallocHost): the CPU backend reads it, the
 *                      CUDA backend stages it like WKV_DEVICE_CPU.
 *   WKV_DEVICE_VULKAN  a library-owned device buffer: data is a wkv_buffer* (from
 *                      wkv_buffer_create on the same context), byte_offset is the offset of
 *                      element (0, 0, ...) inside it, device.id is the context's device_index.
 *                      Strides as usual; every element the tensor reaches must lie inside the
 *                      buffer (checked: WKV_ERROR_SHAPE otherwise), and the offset must be a
 *                      multiple of the element size. A decoding loop keeps its state in a
 *                      buffer and steps it in place between calls without any copy.
 *   WKV_DEVICE_CUDA    (CUDA backend) a device pointer, DLPack's meaning; or a wkv_buffer* of
 *                      the context (what wkv_tensor_make_buffer makes on a CUDA context), with
 *                      the rules of WKV_DEVICE_VULKAN above: the library recognises its own
 *                      buffers and tells them from device pointers.
 *   WKV_DEVICE_CUDA_MANAGED  (CPU and CUDA backends) managed memory, used in place.
 *
 * Buffers exist on backends that have device memory of their own (Vulkan, CUDA); on the CPU
 * backend wkv_buffer_create returns WKV_ERROR_UNSUPPORTED. So a tool can keep its data on the
 * device the same way on either GPU backend: wkv_buffer_create + wkv_tensor_make_buffer.
 *
 * WHEN OUTPUTS ARE READY. On the CPU backend, on Vulkan without WKV_CONTEXT_ASYNC, and on
 * every GPU backend for every call with a host tensor (or a host workspace), a call's outputs
 * are complete when it returns. A CUDA call whose tensors are all device pointers or buffers
 * only enqueues its kernels on the context's stream (wkv_cuda.h) and returns, and so does a
 * Vulkan call on a context created with WKV_CONTEXT_ASYNC whose tensors and workspace are all
 * wkv_buffers (or buffers of the host's, wkv_vulkan.h): its outputs are ready once the GPU
 * gets there. Enqueued calls run in call order, each after the previous one's writes (a state
 * buffer stepped in place stays correct). wkv_context_synchronize waits for all of them;
 * wkv_buffer_upload/download, wkv_buffer_create and every synchronous call are ordered after
 * the work enqueued before them and complete when they return; wkv_buffer_destroy and
 * wkv_context_destroy wait for enqueued work first. A failure of enqueued work (the device was
 * lost) is returned by wkv_context_synchronize or by the next call on the context. On Vulkan an
 * enqueued call is handed to the GPU at once when it is idle, otherwise it may wait for the next
 * call on the context (of any kind) or wkv_context_synchronize, so that calls made while the GPU
 * is busy go in one submission: don't expect it to make progress on its own. As always,
 * the descriptor and the host arrays it points at (strides, seq_offsets) are read during the
 * call only: what an enqueued call needs later is copied.
 *
 * The backward workspace on such a context may be a wkv_buffer* (its first workspace_size
 * bytes are used) or host memory (on CUDA also a device pointer); with host memory the library
 * uses device scratch of its own of that size and never touches the host bytes. The forward's
 * scratch (wkv_forward_desc.scratch) may be a wkv_buffer* or, on CUDA, a device pointer; never
 * host memory. Host memory of
 * a Vulkan context that belongs to the caller's own VkDevice (guest mode) is in wkv_vulkan.h.
 *
 *   wkv_buffer* state = NULL;
 *   wkv_buffer_create(ctx, B * H * N * N * 4, &state);       // zero-filled
 *   wkv_buffer_upload(ctx, state, 0, s0, B * H * N * N * 4);  // optional
 *   f.state_in = f.state_out = wkv_tensor_make_buffer(state, 0, WKV_DTYPE_F32, 4, sshape);
 *   for (...) wkv_forward(ctx, &f);                           // the state never leaves the GPU
 *   wkv_buffer_download(ctx, state, 0, host, B * H * N * N * 4);
 *   wkv_buffer_destroy(state);
 *
 * Buffers belong to their context: use them only with it, and destroy them before it
 * (wkv_context_destroy frees any that are left; their handles are dangling afterwards). Like
 * every call on a context, the buffer calls are externally synchronised with it. */

typedef struct wkv_buffer wkv_buffer;

/* A zero-filled device buffer of `bytes` (> 0) bytes on ctx's device (Vulkan, CUDA). Destroy
 * with wkv_buffer_destroy. WKV_ERROR_UNSUPPORTED on backends without device buffers (CPU). */
WKV_API wkv_status wkv_buffer_create(wkv_context* ctx, uint64_t bytes, wkv_buffer** out);
/* Accepts NULL. Waits for enqueued work of its context first (WKV_CONTEXT_ASYNC, CUDA). */
WKV_API void wkv_buffer_destroy(wkv_buffer* buf);
/* Copies `bytes` host bytes into / out of buf at byte `offset` (synchronously: done when the
 * call returns). [offset, offset + bytes) must lie inside the buffer. */
WKV_API wkv_status wkv_buffer_upload(wkv_context* ctx, wkv_buffer* buf, uint64_t offset,
                                     const void* src, uint64_t bytes);
WKV_API wkv_status wkv_buffer_download(wkv_context* ctx, wkv_buffer* buf, uint64_t offset,
                                       void* dst, uint64_t bytes);
/* The size it was created with (0 for NULL). */
WKV_API uint64_t wkv_buffer_size(const wkv_buffer* buf);
/* A contiguous tensor in buf starting at byte_offset, on the buffer's device (device.type
 * WKV_DEVICE_VULKAN or WKV_DEVICE_CUDA after its context's backend, device.id its context's
 * device_index). Set strides after, if needed. */
WKV_API wkv_tensor wkv_tensor_make_buffer(wkv_buffer* buf, uint64_t byte_offset, wkv_dtype dtype,
                                          int32_t ndim, const int64_t* shape);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* WKV_WKV_H */
