#include "validate.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "message.h"
#include "registry.h"

/* ------------------------------------------------------------------------ struct sizes */

enum { WKV_MAX_STRUCT_SIZE = 1 << 16 };

wkv_status wkv_check_struct_size(const void* s, size_t known, const char* name, wkv_message* msg) {
    return wkv_check_struct_size_since(s, known, known, name, msg);
}

wkv_status wkv_check_struct_size_since(const void* s, size_t oldest, size_t known, const char* name,
                                       wkv_message* msg) {
    size_t size;
    memcpy(&size, s, sizeof size);
    if (size == oldest) return WKV_OK; /* an older version: the caller defaults the rest */
    if (size < known)
        return wkv_fail(msg, WKV_ERROR_STRUCT_SIZE,
                        "%s->struct_size is %zu; this libwkv %s needs %zu%s (set it to sizeof(*%s))",
                        name, size, wkv_version_string(), known, oldest < known ? " or an older version's size" : "",
                        name);
    if (size > WKV_MAX_STRUCT_SIZE)
        return wkv_fail(msg, WKV_ERROR_STRUCT_SIZE, "%s->struct_size is %zu: not a struct size",
                        name, size);
    const unsigned char* bytes = (const unsigned char*)s;
    for (size_t i = known; i < size; ++i)
        if (bytes[i] != 0)
            return wkv_fail(msg, WKV_ERROR_STRUCT_SIZE,
                            "%s has fields set beyond the %zu bytes this libwkv %s knows (struct_size "
                            "%zu): a newer header's feature this library does not have",
                            name, known, wkv_version_string(), size);
    return WKV_OK;
}

/* ------------------------------------------------------------------------ one tensor */

/* How a tensor's dims map onto the four axes of its wkv_view (see backend.h); -1 = unused. */
typedef struct tensor_rule {
    int ndim;
    int64_t shape[4];
    int8_t view_axis[4];
    int state; /* float32 only, 1 */
    int output;
} tensor_rule;

typedef struct checker {
    const wkv_target* target;
    wkv_message* msg;
    wkv_spans* spans;
    /* the argument being checked: prefix + k_names[name_idx], e.g. "desc->forward->r", spelled
     * out into `name` only when a message needs it (formatting it on every call was a third of
     * a tiny call's validation: backends/cpu/NOTES.md, step 19) */
    const char* prefix;
    int name_idx;
    char name[48];
} checker;

/* The target's device buffers (validate.h, wkv_target). */
static int find_buffer(const wkv_target* target, const void* ptr, void** handle, uint64_t* size) {
    return target->ctx && target->find_buffer && target->find_buffer(target->ctx, ptr, handle, size);
}
static int buffer_is_live(const wkv_target* target, const void* ptr) {
    return target->buffer_is_live && target->buffer_is_live(ptr);
}

/* Names of the tensors, with storage that outlives the spans. */
/* The RWKV problems' views in wkv_problem's order, then attention's own (k, v, dk, dv are
 * shared). */
static const char* const k_names[WKV_PROBLEM_VIEWS + 6] = {"r", "w", "k", "v", "a", "b", "u", "y", "state_in",
                                      "state_out", "dy", "dstate_out", "dr", "dw", "dk", "dv",
                                      "da", "db", "du", "dstate_in", "q", "o", "lse", "dout", "dq", "dlse"};
enum { N_R, N_W, N_K, N_V, N_A, N_B, N_U, N_Y, N_SIN, N_SOUT, N_DY, N_DSOUT, N_DR, N_DW, N_DK,
       N_DV, N_DA, N_DB, N_DU, N_DSIN, N_Q, N_O, N_LSE, N_DOUT, N_DQ, N_DLSE, N_NAMES };

/* The argument being checked, for a message. */
static const char* cname(checker* c) {
    snprintf(c->name, sizeof c->name, "%s%s", c->prefix, k_names[c->name_idx]);
    return c->name;
}

static int dtype_to_elem(wkv_dtype d, wkv_elem* e) {
    if (d.lanes != 1) return 0;
    if (d.code == WKV_DTYPE_CODE_FLOAT && d.bits == 32) *e = WKV_ELEM_F32;
    else if (d.code == WKV_DTYPE_CODE_FLOAT && d.bits == 16) *e = WKV_ELEM_F16;
    else if (d.code == WKV_DTYPE_CODE_BFLOAT && d.bits == 16) *e = WKV_ELEM_BF16;
    else return 0;
    return 1;
}

static int64_t abs64(int64_t x) { return x < 0 ? -x : x; }

/* 1 when a dimension is 0 (attention with Tq or Tk = 0): the tensor has no element, so it
 * overlaps nothing, itself included; its span is empty (hi = lo). */
static int empty_shape(int ndim, const int64_t* shape) {
    for (int d = 0; d < ndim; ++d)
        if (shape[d] == 0) return 1;
    return 0;
}

/* 1 when the byte ranges [alo, ahi) and [blo, bhi) share a byte (an empty range shares none). */
static int ranges_overlap(uintptr_t alo, uintptr_t ahi, uintptr_t blo, uintptr_t bhi) {
    return alo < ahi && blo < bhi && alo < bhi && blo < ahi;
}

/* An output must not write one element twice: sorted by |stride|, every stride must step over
 * everything the smaller ones reach. */
static int self_overlaps(int ndim, const int64_t* shape, const int64_t* stride) {
    if (empty_shape(ndim, shape)) return 0;
    int order[4];
    for (int d = 0; d < ndim; ++d) order[d] = d;
    for (int a = 1; a < ndim; ++a)
        for (int b = a; b > 0 && abs64(stride[order[b]]) < abs64(stride[order[b - 1]]); --b) {
            int tmp = order[b];
            order[b] = order[b - 1];
            order[b - 1] = tmp;
        }
    int64_t reach = 0; /* largest element offset the smaller axes reach */
    for (int k = 0; k < ndim; ++k) {
        int d = order[k];
        if (shape[d] == 1) continue;
        if (abs64(stride[d]) <= reach) return 1;
        reach += (shape[d] - 1) * abs64(stride[d]); /* cannot overflow: checked by the caller */
    }
    return 0;
}

/* ---- device buffers (wkv.h's DEVICE BUFFERS section) ---------------------------------- */

/* The device type of wkv_buffer tensors on this backend (0: it has no buffers). On Vulkan
 * every tensor of that type is a buffer; on CUDA the type is shared with device pointers, and
 * a tensor is a buffer when its data is one of the context's live wkv_buffer objects (whose
 * addresses are host addresses, never device pointers: unified addressing keeps them apart). */
static int32_t buffer_device_type(wkv_backend backend) {
    return backend == WKV_BACKEND_VULKAN ? WKV_DEVICE_VULKAN
         : backend == WKV_BACKEND_CUDA   ? WKV_DEVICE_CUDA
                                         : 0;
}

static int is_buffer_tensor(const wkv_target* target, const wkv_tensor* t) {
    int32_t type = buffer_device_type(target->backend);
    if (type == 0 || t->device.type != type) return 0;
    if (target->backend != WKV_BACKEND_CUDA) return 1;
    /* CUDA: a buffer of this context, or of another one (refused by check_buffer_span) */
    return find_buffer(target, t->data, NULL, NULL) || buffer_is_live(target, t->data);
}

/* A tensor in a wkv_buffer: data must be a live buffer of the context, byte_offset a multiple
 * of the element size, and every byte the view reaches, [byte_offset + lo, byte_offset + hi),
 * inside the buffer. */
static wkv_status check_buffer_span(checker* c, const wkv_tensor* t, int64_t es, int64_t lo_bytes,
                                    int64_t hi_bytes, wkv_buffer_ref* mem) {
    void* handle = NULL;
    uint64_t size = 0;
    if (!find_buffer(c->target, t->data, &handle, &size)) {
        if (buffer_is_live(c->target, t->data))
            return wkv_fail(c->msg, WKV_ERROR_DEVICE_MISMATCH,
                            "%s.data is a wkv_buffer of another context (buffers belong to the "
                            "context that created them)", cname(c));
        return wkv_fail(c->msg, WKV_ERROR_DEVICE_MISMATCH,
                        "%s.data is not a wkv_buffer of this context (a tensor with device.type %d "
                        "must point at one: wkv_tensor_make_buffer)", cname(c), (int)t->device.type);
    }
    if (t->byte_offset % (uint64_t)es != 0)
        return wkv_fail(c->msg, WKV_ERROR_INVALID_ARGUMENT,
                        "%s.byte_offset %llu is not a multiple of the element size %lld", cname(c),
                        (unsigned long long)t->byte_offset, (long long)es);
    uint64_t end;
    if ((uint64_t)(-lo_bytes) > t->byte_offset ||
        __builtin_add_overflow(t->byte_offset, (uint64_t)hi_bytes, &end) || end > size)
        return wkv_fail(c->msg, WKV_ERROR_SHAPE,
                        "%s reaches bytes [%lld, %llu) of its wkv_buffer, which has %llu bytes", cname(c),
                        (long long)((int64_t)t->byte_offset + lo_bytes),
                        (unsigned long long)(t->byte_offset + (uint64_t)hi_bytes),
                        (unsigned long long)size);
    mem->buffer = handle;
    mem->offset = t->byte_offset;
    return WKV_OK;
}

void wkv_problem_fill_mem(const wkv_spans* spans, wkv_problem* p) {
    for (int i = 0; i < spans->count; ++i) {
        const wkv_span* s = &spans->span[i];
        if (s->role >= 0 && s->role < WKV_PROBLEM_VIEWS) p->mem[s->role] = s->mem;
    }
}

static wkv_status check_tensor(checker* c, const wkv_tensor* t, const tensor_rule* rule,
                               wkv_view* out) {
    wkv_message* msg = c->msg;
    if (!t->data) return wkv_fail(msg, WKV_ERROR_NULL_POINTER, "%s.data is NULL", cname(c));
    if (t->ndim != rule->ndim)
        return wkv_fail(msg, WKV_ERROR_SHAPE, "%s.ndim is %d, expected %d", cname(c), (int)t->ndim, rule->ndim);
    if (!t->shape) return wkv_fail(msg, WKV_ERROR_NULL_POINTER, "%s.shape is NULL", cname(c));
    for (int d = 0; d < rule->ndim; ++d)
        if (t->shape[d] != rule->shape[d])
            return wkv_fail(msg, WKV_ERROR_SHAPE, "%s.shape[%d] is %lld, expected %lld", cname(c), d,
                            (long long)t->shape[d], (long long)rule->shape[d]);
    wkv_elem elem;
    if (!dtype_to_elem(t->dtype, &elem))
        return wkv_fail(msg, WKV_ERROR_DTYPE,
                        "%s.dtype (code %u, bits %u, lanes %u) is not float32, float16 or bfloat16",
                        cname(c), t->dtype.code, t->dtype.bits, t->dtype.lanes);
    if (rule->state && elem != WKV_ELEM_F32)
        return wkv_fail(msg, WKV_ERROR_DTYPE, "%s must be float32 (the state is always float32)", cname(c));
    if (!wkv_backend_accepts_device(c->target->backend, t->device.type))
        return wkv_fail(msg, WKV_ERROR_DEVICE_MISMATCH,
                        "%s.device.type is %d, which the %s backend cannot read (see wkv_device_type)",
                        cname(c), (int)t->device.type, wkv_backend_name(c->target->backend));
    if (t->device.type != WKV_DEVICE_CPU && t->device.type != WKV_DEVICE_CUDA_HOST &&
        t->device.id != c->target->device_index)
        return wkv_fail(msg, WKV_ERROR_DEVICE_MISMATCH, "%s is on device %d, the context on device %d",
                        cname(c), (int)t->device.id, (int)c->target->device_index);

    /* strides in elements (contiguous when NULL), and the byte span they reach */
    int64_t stride[4];
    int64_t contiguous = 1;
    for (int d = rule->ndim - 1; d >= 0; --d) {
        stride[d] = t->strides ? t->strides[d] : contiguous;
        if (__builtin_mul_overflow(contiguous, t->shape[d], &contiguous))
            return wkv_fail(msg, WKV_ERROR_OVERFLOW, "%s has more elements than fit in int64", cname(c));
    }
    int64_t es = wkv_elem_size(elem);
    int64_t lo = 0, hi = 0; /* element offsets reached, relative to the first element */
    int64_t reach[4];
    int widest = 0; /* the axis reaching farthest: the one to blame when the sum overflows */
    for (int d = 0; d < rule->ndim; ++d) {
        if (stride[d] == INT64_MIN || __builtin_mul_overflow(t->shape[d] - 1, stride[d], &reach[d]) ||
            reach[d] == INT64_MIN)
            return wkv_fail(msg, WKV_ERROR_OVERFLOW, "%s.strides[%d] = %lld overflows the byte offsets",
                            cname(c), d, (long long)stride[d]);
        if (abs64(reach[d]) > abs64(reach[widest])) widest = d;
    }
    for (int d = 0; d < rule->ndim; ++d)
        if (__builtin_add_overflow(reach[d] < 0 ? lo : hi, reach[d], reach[d] < 0 ? &lo : &hi))
            return wkv_fail(msg, WKV_ERROR_OVERFLOW, "%s.strides[%d] = %lld overflows the byte offsets",
                            cname(c), widest, (long long)stride[widest]);
    int64_t lo_bytes, hi_bytes;
    if (__builtin_mul_overflow(lo, es, &lo_bytes) || __builtin_mul_overflow(hi, es, &hi_bytes) ||
        __builtin_add_overflow(hi_bytes, es, &hi_bytes) || lo_bytes == INT64_MIN ||
        t->byte_offset > (uint64_t)INT64_MAX) {
        if (t->byte_offset > (uint64_t)INT64_MAX)
            return wkv_fail(msg, WKV_ERROR_OVERFLOW, "%s.byte_offset %llu does not fit in int64", cname(c),
                            (unsigned long long)t->byte_offset);
        if (t->strides)
            return wkv_fail(msg, WKV_ERROR_OVERFLOW,
                            "%s.strides[%d] = %lld reaches more bytes than fit in int64", cname(c), widest,
                            (long long)stride[widest]);
        return wkv_fail(msg, WKV_ERROR_OVERFLOW, "%s spans more bytes than fit in int64", cname(c));
    }
    const void* in_buffer = NULL;
    wkv_buffer_ref mem;
    memset(&mem, 0, sizeof mem);
    mem.lo = lo_bytes;
    mem.hi = hi_bytes;
    mem.host = t->device.type == WKV_DEVICE_CPU || t->device.type == WKV_DEVICE_CUDA_HOST;
    uintptr_t base = (uintptr_t)t->data, first, span_lo, span_hi;
    if (is_buffer_tensor(c->target, t)) {
        /* device buffers: the span is checked inside the buffer, as byte offsets */
        wkv_status bst = check_buffer_span(c, t, es, lo_bytes, hi_bytes, &mem);
        if (bst) return bst;
        in_buffer = t->data;
        first = (uintptr_t)t->data + (uintptr_t)t->byte_offset; /* not an address: see backend.h */
        span_lo = (uintptr_t)(t->byte_offset - (uint64_t)(-lo_bytes));
        span_hi = (uintptr_t)(t->byte_offset + (uint64_t)hi_bytes);
    } else if (__builtin_add_overflow(base, (uintptr_t)t->byte_offset, &first) ||
        (uintptr_t)(-lo_bytes) > first ||
        __builtin_add_overflow(first, (uintptr_t)hi_bytes, &span_hi))
        return wkv_fail(msg, WKV_ERROR_OVERFLOW, "%s: data + byte_offset + strides wrap the address space", cname(c));
    else
        span_lo = first - (uintptr_t)(-lo_bytes);
    if (rule->output && self_overlaps(rule->ndim, t->shape, stride))
        return wkv_fail(msg, WKV_ERROR_ALIASING,
                        "%s is an output whose strides make elements overlap (a zero or too small stride)", cname(c));

    out->data = (char*)first;
    out->elem = elem;
    for (int a = 0; a < 4; ++a) out->stride[a] = 0;
    for (int d = 0; d < rule->ndim; ++d) out->stride[rule->view_axis[d]] = stride[d];

    if (c->spans->count == WKV_MAX_SPANS)
        return wkv_fail(msg, WKV_ERROR_INTERNAL, "too many tensors for the aliasing check");
    wkv_span* s = &c->spans->span[c->spans->count++];
    s->prefix = c->prefix;
    s->role = c->name_idx;
    s->lo = span_lo;
    s->hi = empty_shape(rule->ndim, t->shape) ? span_lo : span_hi; /* no element: no bytes */
    s->output = rule->output;
    s->tensor = t;
    s->buffer = in_buffer;
    s->mem = mem;
    return WKV_OK;
}

/* ------------------------------------------------------------------------ the ops */

enum { AX_B = 0, AX_T = 1, AX_H = 2, AX_N = 3 };

typedef struct op_shape {
    int64_t B, T, H, N; /* RWKV-4: H = 1, N = C */
    int64_t S;          /* state slots: num_seqs when packed, else B */
} op_shape;

const char* wkv_span_name(const wkv_span* s, char out[48]) {
    snprintf(out, 48, "%s%s", s->prefix, s->role >= 0 && s->role < N_NAMES ? k_names[s->role] : "?");
    return out;
}

static wkv_status check_named(checker* c, const char* prefix, int name, const wkv_tensor* t,
                              const tensor_rule* rule, wkv_view* out) {
    c->prefix = prefix;
    c->name_idx = name;
    return check_tensor(c, t, rule, out);
}

static wkv_status check_absent(checker* c, const char* prefix, int name, const wkv_tensor* t,
                               wkv_op op) {
    if (t->data)
        return wkv_fail(c->msg, WKV_ERROR_INVALID_ARGUMENT,
                        "%s%s must be absent (data = NULL): op %d does not use it", prefix,
                        k_names[name], (int)op);
    return WKV_OK;
}

/* Rules for each role, given the resolved shape. */
static tensor_rule token_rule(wkv_op op, const op_shape* s, int output) {
    tensor_rule r;
    memset(&r, 0, sizeof r);
    r.output = output;
    if (op == WKV_OP_RWKV4) {
        r.ndim = 3;
        r.shape[0] = s->B, r.shape[1] = s->T, r.shape[2] = s->N;
        r.view_axis[0] = AX_B, r.view_axis[1] = AX_T, r.view_axis[2] = AX_N;
    } else {
        r.ndim = 4;
        r.shape[0] = s->B, r.shape[1] = s->T, r.shape[2] = s->H, r.shape[3] = s->N;
        for (int d = 0; d < 4; ++d) r.view_axis[d] = (int8_t)d;
    }
    return r;
}

/* RWKV-6 u [H,N]; RWKV-4 w and u [C]. */
static tensor_rule param_rule(wkv_op op, const op_shape* s, int output) {
    tensor_rule r;
    memset(&r, 0, sizeof r);
    r.output = output;
    if (op == WKV_OP_RWKV4) {
        r.ndim = 1;
        r.shape[0] = s->N;
        r.view_axis[0] = AX_N;
    } else {
        r.ndim = 2;
        r.shape[0] = s->H, r.shape[1] = s->N;
        r.view_axis[0] = AX_H, r.view_axis[1] = AX_N;
    }
    return r;
}

static tensor_rule state_rule(wkv_op op, uint32_t flags, const op_shape* s, int output) {
    tensor_rule r;
    memset(&r, 0, sizeof r);
    r.output = output;
    r.state = 1;
    if (op == WKV_OP_RWKV4) {
        /* view axes: [s, part, -, c] */
        r.ndim = 3;
        r.shape[0] = s->S;
        r.view_axis[0] = 0;
        if (flags & WKV_FLAG_RWKV4_STATE_INTERLEAVED) {
            r.shape[1] = s->N, r.shape[2] = 3;
            r.view_axis[1] = 3, r.view_axis[2] = 1;
        } else {
            r.shape[1] = 3, r.shape[2] = s->N;
            r.view_axis[1] = 1, r.view_axis[2] = 3;
        }
    } else {
        /* view axes: [s, h, i (value), j (key)] */
        r.ndim = 4;
        r.shape[0] = s->S, r.shape[1] = s->H, r.shape[2] = s->N, r.shape[3] = s->N;
        r.view_axis[0] = 0, r.view_axis[1] = 1;
        int key_major = (flags & WKV_FLAG_STATE_KEY_MAJOR) != 0;
        r.view_axis[2] = (int8_t)(key_major ? 3 : 2);
        r.view_axis[3] = (int8_t)(key_major ? 2 : 3);
    }
    return r;
}

/* Which per-op tensors exist: bit per name. */
static uint32_t op_inputs(wkv_op op) {
    switch (op) {
    case WKV_OP_RWKV7: return 1u << N_R | 1u << N_W | 1u << N_K | 1u << N_V | 1u << N_A | 1u << N_B;
    case WKV_OP_RWKV6: return 1u << N_R | 1u << N_W | 1u << N_K | 1u << N_V | 1u << N_U;
    case WKV_OP_RWKV4: return 1u << N_W | 1u << N_K | 1u << N_V | 1u << N_U;
    default: return 0;
    }
}

static int is_param(wkv_op op, int name) {
    return name == N_U || (op == WKV_OP_RWKV4 && name == N_W);
}

static const wkv_tensor* input_of(const wkv_forward_desc* d, int name) {
    switch (name) {
    case N_R: return &d->r;
    case N_W: return &d->w;
    case N_K: return &d->k;
    case N_V: return &d->v;
    case N_A: return &d->a;
    case N_B: return &d->b;
    default: return &d->u;
    }
}

static wkv_view* input_view(wkv_problem* p, int name) {
    switch (name) {
    case N_R: return &p->r;
    case N_W: return &p->w;
    case N_K: return &p->k;
    case N_V: return &p->v;
    case N_A: return &p->a;
    case N_B: return &p->b;
    default: return &p->u;
    }
}

static const wkv_tensor* grad_of(const wkv_backward_desc* d, int name) {
    switch (name) {
    case N_R: return &d->dr;
    case N_W: return &d->dw;
    case N_K: return &d->dk;
    case N_V: return &d->dv;
    case N_A: return &d->da;
    case N_B: return &d->db;
    default: return &d->du;
    }
}

static wkv_view* grad_view(wkv_problem* p, int name) {
    switch (name) {
    case N_R: return &p->dr;
    case N_W: return &p->dw;
    case N_K: return &p->dk;
    case N_V: return &p->dv;
    case N_A: return &p->da;
    case N_B: return &p->db;
    default: return &p->du;
    }
}

static wkv_status check_outputs_alias(const wkv_spans* spans, wkv_message* msg) {
    for (int i = 0; i < spans->count; ++i) {
        const wkv_span* o = &spans->span[i];
        if (!o->output) continue;
        for (int j = 0; j < spans->count; ++j) {
            const wkv_span* x = &spans->span[j];
            if (i == j || (x->output && j < i)) continue; /* each output pair once */
            if (o->buffer != x->buffer) continue;         /* different memory: host vs buffers */
            if (!ranges_overlap(o->lo, o->hi, x->lo, x->hi)) continue;
            /* state_out may be exactly state_in: same memory, same layout */
            const wkv_tensor* a = o->tensor;
            const wkv_tensor* b = x->tensor;
            int same = a->data == b->data && a->byte_offset == b->byte_offset && a->ndim == b->ndim &&
                       ((a->strides == NULL && b->strides == NULL) ||
                        (a->strides && b->strides &&
                         memcmp(a->strides, b->strides, sizeof(int64_t) * (size_t)a->ndim) == 0));
            int state_pair = (o->role == N_SOUT && x->role == N_SIN) ||
                             (o->role == N_SIN && x->role == N_SOUT);
            if (state_pair && same) continue;
            char on[48], xn[48];
            return wkv_fail(msg, WKV_ERROR_ALIASING, "%s overlaps %s in memory%s", wkv_span_name(o, on),
                            wkv_span_name(x, xn),
                            state_pair ? " (state_out may alias state_in only exactly: same data, "
                                         "offset and strides)"
                                       : "");
        }
    }
    return WKV_OK;
}

/* The shape comes from v; when v alone disagrees with the other per-token inputs, which agree
 * among themselves (at least two of them), v is the one to blame, not the first one checked. */
static wkv_status check_v_agrees(wkv_message* msg, const wkv_forward_desc* d, const char* prefix,
                                 uint32_t inputs, int ndim) {
    const wkv_tensor* first = NULL;
    int agree = 0, first_name = 0;
    for (int name = N_R; name <= N_B; ++name) {
        const wkv_tensor* t = input_of(d, name);
        if (name == N_V || !(inputs & (1u << name)) || is_param(d->op, name)) continue;
        if (!t->data || !t->shape || t->ndim != ndim) return WKV_OK; /* check_tensor's to report */
        if (!first) {
            first = t;
            first_name = name;
        } else if (memcmp(t->shape, first->shape, (size_t)ndim * sizeof *t->shape) != 0) {
            return WKV_OK; /* no agreement to go by */
        }
        ++agree;
    }
    if (agree < 2) return WKV_OK;
    for (int i = 0; i < ndim; ++i)
        if (first->shape[i] != d->v.shape[i])
            return wkv_fail(msg, WKV_ERROR_SHAPE,
                            "%sv.shape[%d] is %lld, but the other per-token inputs (%s%s and the rest) have %lld",
                            prefix, i, (long long)d->v.shape[i], prefix, k_names[first_name],
                            (long long)first->shape[i]);
    return WKV_OK;
}

/* Packed-sequence offsets (prefix + name, e.g. "desc->seq_offsets"): n + 1 non-decreasing values
 * from 0 to total (the length called `what` in the message). */
static wkv_status check_offsets(wkv_message* msg, const char* prefix, const char* name, const int64_t* off,
                                int64_t n, int64_t total, const char* what) {
    if (off[0] != 0)
        return wkv_fail(msg, WKV_ERROR_SEQUENCE_OFFSETS, "%s%s[0] is %lld, expected 0", prefix, name,
                        (long long)off[0]);
    for (int64_t i = 0; i < n; ++i)
        if (off[i + 1] < off[i])
            return wkv_fail(msg, WKV_ERROR_SEQUENCE_OFFSETS, "%s%s[%lld] = %lld is less than %s[%lld] = %lld",
                            prefix, name, (long long)(i + 1), (long long)off[i + 1], name, (long long)i,
                            (long long)off[i]);
    if (off[n] != total)
        return wkv_fail(msg, WKV_ERROR_SEQUENCE_OFFSETS, "%s%s[%lld] is %lld but the total %s is %lld", prefix, name,
                        (long long)n, (long long)off[n], what, (long long)total);
    return WKV_OK;
}

/* Checks the op, form, flags, packing and every forward input; fills p and the spans.
 * With for_backward, y and state_out are not looked at. */
static wkv_status check_forward(checker* c, const wkv_forward_desc* d, const char* prefix,
                                int for_backward, wkv_problem* p, op_shape* s) {
    wkv_message* msg = c->msg;
    wkv_status st;
    if (op_inputs(d->op) == 0)
        return wkv_fail(msg, WKV_ERROR_INVALID_ARGUMENT,
                        "%sop is %d: expected WKV_OP_RWKV4 (4), WKV_OP_RWKV6 (6) or WKV_OP_RWKV7 (7)",
                        prefix, (int)d->op);
    if (d->decay_form < WKV_DECAY_DIRECT || d->decay_form > WKV_DECAY_CLAMPW)
        return wkv_fail(msg, WKV_ERROR_INVALID_ARGUMENT,
                        "%sdecay_form is %d: expected a wkv_decay_form (1..4; 0 means not set)", prefix,
                        (int)d->decay_form);
    if (d->op == WKV_OP_RWKV4 && d->decay_form != WKV_DECAY_EXP_NEG_EXP)
        return wkv_fail(msg, WKV_ERROR_INVALID_ARGUMENT,
                        "%sdecay_form must be WKV_DECAY_EXP_NEG_EXP for WKV_OP_RWKV4 (its decay is "
                        "exp(-exp(w)))", prefix);
    uint32_t known = WKV_FLAG_STATE_KEY_MAJOR | WKV_FLAG_RWKV4_STATE_INTERLEAVED;
    if (d->flags & ~known)
        return wkv_fail(msg, WKV_ERROR_INVALID_ARGUMENT, "%sflags has unknown bits 0x%x", prefix,
                        d->flags & ~known);
    if (d->op == WKV_OP_RWKV4 && (d->flags & WKV_FLAG_STATE_KEY_MAJOR))
        return wkv_fail(msg, WKV_ERROR_INVALID_ARGUMENT,
                        "%sflags: WKV_FLAG_STATE_KEY_MAJOR does not apply to WKV_OP_RWKV4", prefix);
    if (d->op != WKV_OP_RWKV4 && (d->flags & WKV_FLAG_RWKV4_STATE_INTERLEAVED))
        return wkv_fail(msg, WKV_ERROR_INVALID_ARGUMENT,
                        "%sflags: WKV_FLAG_RWKV4_STATE_INTERLEAVED applies to WKV_OP_RWKV4 only", prefix);

    /* The shape comes from v (present in every op); everything else must agree. */
    const wkv_tensor* v = &d->v;
    int want_ndim = d->op == WKV_OP_RWKV4 ? 3 : 4;
    if (!v->data) return wkv_fail(msg, WKV_ERROR_NULL_POINTER, "%sv.data is NULL", prefix);
    if (!v->shape) return wkv_fail(msg, WKV_ERROR_NULL_POINTER, "%sv.shape is NULL", prefix);
    if (v->ndim != want_ndim)
        return wkv_fail(msg, WKV_ERROR_SHAPE, "%sv.ndim is %d, expected %d (%s)", prefix, (int)v->ndim,
                        want_ndim, want_ndim == 3 ? "[B,T,C]" : "[B,T,H,N]");
    for (int i = 0; i < want_ndim; ++i)
        if (v->shape[i] <= 0)
            return wkv_fail(msg, WKV_ERROR_SHAPE, "%sv.shape[%d] is %lld: every size must be >= 1",
                            prefix, i, (long long)v->shape[i]);
    s->B = v->shape[0];
    s->T = v->shape[1];
    s->H = want_ndim == 3 ? 1 : v->shape[2];
    s->N = v->shape[want_ndim - 1];
    int64_t numel;
    if (__builtin_mul_overflow(s->B, s->T, &numel) || __builtin_mul_overflow(numel, s->H, &numel) ||
        __builtin_mul_overflow(numel, s->N, &numel) || numel > INT64_MAX / 4)
        return wkv_fail(msg, WKV_ERROR_OVERFLOW, "%sv: B*T*H*N bytes overflow int64", prefix);
    int64_t state_numel;
    if (d->op != WKV_OP_RWKV4 &&
        (__builtin_mul_overflow(s->N, s->N, &state_numel) ||
         __builtin_mul_overflow(state_numel, s->H, &state_numel) || state_numel > INT64_MAX / 4))
        return wkv_fail(msg, WKV_ERROR_OVERFLOW, "%sv: the state H*N*N overflows int64", prefix);

    /* packing */
    if (d->num_seqs < 0)
        return wkv_fail(msg, WKV_ERROR_SEQUENCE_OFFSETS, "%snum_seqs is %lld: must be >= 0", prefix,
                        (long long)d->num_seqs);
    if (d->num_seqs == 0 && d->seq_offsets)
        return wkv_fail(msg, WKV_ERROR_SEQUENCE_OFFSETS,
                        "%sseq_offsets is set but num_seqs is 0 (set num_seqs to pack sequences)", prefix);
    s->S = s->B;
    if (d->num_seqs > 0) {
        const int64_t* off = d->seq_offsets;
        if (!off) return wkv_fail(msg, WKV_ERROR_NULL_POINTER, "%sseq_offsets is NULL but num_seqs is %lld",
                                  prefix, (long long)d->num_seqs);
        if (s->B != 1)
            return wkv_fail(msg, WKV_ERROR_SEQUENCE_OFFSETS,
                            "%sv.shape[0] is %lld: packed sequences need B = 1 ([1, total_T, ...])", prefix,
                            (long long)s->B);
        if ((st = check_offsets(msg, prefix, "seq_offsets", off, d->num_seqs, s->T, "length T"))) return st;
        s->S = d->num_seqs;
    }

    memset(p, 0, sizeof *p);
    p->op = d->op;
    p->decay_form = d->decay_form;
    p->flags = d->flags;
    p->backward = for_backward;
    p->B = s->B, p->T = s->T, p->H = s->H, p->N = s->N;
    p->num_seqs = s->S;
    p->seq_offsets = d->num_seqs > 0 ? d->seq_offsets : NULL;

    uint32_t inputs = op_inputs(d->op);
    if ((st = check_v_agrees(msg, d, prefix, inputs, want_ndim))) return st;
    for (int name = N_R; name <= N_U; ++name) {
        const wkv_tensor* t = input_of(d, name);
        if (!(inputs & (1u << name))) {
            if ((st = check_absent(c, prefix, name, t, d->op))) return st;
            continue;
        }
        tensor_rule rule = is_param(d->op, name) ? param_rule(d->op, s, 0) : token_rule(d->op, s, 0);
        if ((st = check_named(c, prefix, name, t, &rule, input_view(p, name)))) return st;
    }
    if (d->state_in.data) {
        tensor_rule rule = state_rule(d->op, d->flags, s, 0);
        if ((st = check_named(c, prefix, N_SIN, &d->state_in, &rule, &p->state_in))) return st;
    }
    if (!for_backward) {
        tensor_rule rule = token_rule(d->op, s, 1);
        if ((st = check_named(c, prefix, N_Y, &d->y, &rule, &p->y))) return st;
        if (d->state_out.data) {
            rule = state_rule(d->op, d->flags, s, 1);
            if ((st = check_named(c, prefix, N_SOUT, &d->state_out, &rule, &p->state_out))) return st;
        }
    }
    return WKV_OK;
}

wkv_status wkv_read_forward_desc(const wkv_forward_desc* desc, const char* name,
                                  wkv_forward_desc* out, wkv_message* msg) {
    /* three versions: without workspace, without scratch (both accepted here), and this one */
    size_t size;
    memcpy(&size, desc, sizeof size);
    if (size != offsetof(wkv_forward_desc, scratch)) {
        wkv_status st = wkv_check_struct_size_since(desc, offsetof(wkv_forward_desc, workspace),
                                                    sizeof *desc, name, msg);
        if (st) return st;
    }
    memset(out, 0, sizeof *out);
    memcpy(out, desc, size < sizeof *out ? size : sizeof *out);
    return WKV_OK;
}

wkv_status wkv_read_backward_desc(const wkv_backward_desc* desc, wkv_backward_desc* out,
                                  wkv_message* msg) {
    wkv_status st = wkv_check_struct_size_since(desc, offsetof(wkv_backward_desc, flags),
                                                sizeof *desc, "desc", msg);
    if (st) return st;
    size_t size;
    memcpy(&size, desc, sizeof size);
    memset(out, 0, sizeof *out);
    memcpy(out, desc, size < sizeof *out ? size : sizeof *out);
    return WKV_OK;
}

wkv_status wkv_validate_forward_spans(const wkv_target* target, const wkv_forward_desc* desc_in,
                                      wkv_problem* out, wkv_spans* spans, wkv_message* msg) {
    if (!desc_in) return wkv_fail(msg, WKV_ERROR_NULL_POINTER, "desc is NULL");
    wkv_forward_desc d; /* the caller's version, defaulted to this one */
    wkv_status st = wkv_read_forward_desc(desc_in, "desc", &d, msg);
    if (st) return st;
    const wkv_forward_desc* desc = &d;
    spans->count = 0;
    checker c = {target, msg, spans, NULL, 0, {0}};
    op_shape s;
    if ((st = check_forward(&c, desc, "desc->", 0, out, &s))) return st;
    if ((st = check_outputs_alias(spans, msg))) return st;
    if (!desc->workspace && desc->workspace_size)
        return wkv_fail(msg, WKV_ERROR_NULL_POINTER,
                        "desc->workspace is NULL but desc->workspace_size is %zu", desc->workspace_size);
    if (!desc->scratch && desc->scratch_size)
        return wkv_fail(msg, WKV_ERROR_NULL_POINTER,
                        "desc->scratch is NULL but desc->scratch_size is %zu", desc->scratch_size);
    wkv_problem_fill_mem(spans, out);
    /* The workspace is only handed on when the backend saves checkpoints, the scratch when the
     * backend can use some (api.c decides, and checks them with wkv_validate_workspace_mem and
     * wkv_validate_scratch_mem). */
    out->workspace = desc->workspace;
    out->workspace_size = desc->workspace_size;
    out->scratch = desc->scratch;
    out->scratch_size = desc->scratch_size;
    for (int i = 0; i < spans->count; ++i) spans->span[i].tensor = NULL; /* pointed into d */
    return WKV_OK;
}

wkv_status wkv_validate_forward(const wkv_target* target, const wkv_forward_desc* desc,
                                wkv_problem* out, wkv_message* msg) {
    wkv_spans spans;
    wkv_status st = wkv_validate_forward_spans(target, desc, out, &spans, msg);
    out->workspace = NULL; /* callers of this one never pass them on */
    out->workspace_size = 0;
    out->scratch = NULL;
    out->scratch_size = 0;
    return st;
}

wkv_status wkv_validate_backward(const wkv_target* target, const wkv_backward_desc* desc_in,
                                 wkv_problem* p, wkv_spans* spans, wkv_message* msg) {
    if (!desc_in) return wkv_fail(msg, WKV_ERROR_NULL_POINTER, "desc is NULL");
    wkv_backward_desc bd; /* the caller's versions, defaulted to these */
    wkv_forward_desc fd;
    wkv_status st = wkv_read_backward_desc(desc_in, &bd, msg);
    if (st) return st;
    const wkv_backward_desc* desc = &bd;
    if (!desc->forward) return wkv_fail(msg, WKV_ERROR_NULL_POINTER, "desc->forward is NULL");
    if ((st = wkv_read_forward_desc(desc->forward, "desc->forward", &fd, msg))) return st;
    if (desc->flags & ~(uint32_t)WKV_BACKWARD_REUSE_CHECKPOINTS)
        return wkv_fail(msg, WKV_ERROR_INVALID_ARGUMENT, "desc->flags has unknown bits 0x%x",
                        desc->flags & ~(uint32_t)WKV_BACKWARD_REUSE_CHECKPOINTS);
    spans->count = 0;
    checker c = {target, msg, spans, NULL, 0, {0}};
    op_shape s;
    const wkv_forward_desc* f = &fd;
    if ((st = check_forward(&c, f, "desc->forward->", 1, p, &s))) return st;

    tensor_rule rule = token_rule(f->op, &s, 0);
    if ((st = check_named(&c, "desc->", N_DY, &desc->dy, &rule, &p->dy))) return st;
    if (desc->dstate_out.data) {
        rule = state_rule(f->op, f->flags, &s, 0);
        if ((st = check_named(&c, "desc->", N_DSOUT, &desc->dstate_out, &rule, &p->dstate_out))) return st;
    }
    uint32_t inputs = op_inputs(f->op);
    for (int name = N_R; name <= N_U; ++name) {
        const wkv_tensor* g = grad_of(desc, name);
        if (!(inputs & (1u << name))) {
            if ((st = check_absent(&c, "desc->d", name, g, f->op))) return st;
            continue;
        }
        rule = is_param(f->op, name) ? param_rule(f->op, &s, 1) : token_rule(f->op, &s, 1);
        if ((st = check_named(&c, "desc->", name + (N_DR - N_R), g, &rule, grad_view(p, name)))) return st;
    }
    if (desc->dstate_in.data) {
        rule = state_rule(f->op, f->flags, &s, 1);
        if ((st = check_named(&c, "desc->", N_DSIN, &desc->dstate_in, &rule, &p->dstate_in))) return st;
    }
    if ((st = check_outputs_alias(spans, msg))) return st;
    wkv_problem_fill_mem(spans, p);
    p->workspace = desc->workspace;
    p->workspace_size = desc->workspace_size;
    /* requested; api.c keeps it only where a saving forward's record matches */
    p->reuse_checkpoints = (desc->flags & WKV_BACKWARD_REUSE_CHECKPOINTS) != 0;
    for (int i = 0; i < spans->count; ++i) spans->span[i].tensor = NULL; /* pointed into bd, fd */
    return WKV_OK;
}

/* A memory argument of the caller's that the library uses `needed` bytes of: the backward's
 * workspace or the forward's scratch. name: the argument ("desc->workspace"; its size is
 * name + "_size"); query: the function that tells the size ("wkv_workspace_size"). */
typedef struct mem_arg {
    const char* name;
    const char* query;
} mem_arg;
static const mem_arg k_workspace_arg = {"desc->workspace", "wkv_workspace_size"};
static const mem_arg k_scratch_arg = {"desc->scratch", "wkv_forward_scratch_size"};

/* A pointer (ptr, size): present, large enough, its first `needed` bytes overlapping no
 * tensor of the problem. Nothing to check when nothing is needed. */
static wkv_status check_mem_ptr(const mem_arg* a, void* ptr, size_t size, const wkv_spans* spans,
                                size_t needed, wkv_message* msg) {
    if (needed == 0) return WKV_OK;
    if (!ptr)
        return wkv_fail(msg, WKV_ERROR_NULL_POINTER, "%s is NULL; this call needs %zu bytes (%s)", a->name,
                        needed, a->query);
    if (size < needed)
        return wkv_fail(msg, WKV_ERROR_WORKSPACE_TOO_SMALL, "%s_size is %zu bytes; this call needs %zu (%s)",
                        a->name, size, needed, a->query);
    uintptr_t lo = (uintptr_t)ptr, hi;
    if (__builtin_add_overflow(lo, (uintptr_t)needed, &hi))
        return wkv_fail(msg, WKV_ERROR_OVERFLOW, "%s + its size wraps the address space", a->name);
    for (int i = 0; i < spans->count; ++i)
        if (!spans->span[i].buffer && ranges_overlap(lo, hi, spans->span[i].lo, spans->span[i].hi))
            return wkv_fail(msg, WKV_ERROR_ALIASING, "%s overlaps %s", a->name,
                            wkv_span_name(&spans->span[i], (char[48]){0}));
    return WKV_OK;
}

wkv_status wkv_validate_workspace(const wkv_backward_desc* desc, const wkv_spans* spans,
                                  size_t needed, wkv_message* msg) {
    return check_mem_ptr(&k_workspace_arg, desc->workspace, desc->workspace_size, spans, needed, msg);
}

/* ---- device buffers ---- */

/* The kind of the memory at ptr (size bytes) into *mem: a wkv_buffer of target->ctx (its
 * handle; its size in *buffer_size when not NULL) or a pointer (host memory, except on CUDA,
 * where it may be either: see backend.h). */
static void mem_kind(const wkv_target* target, void* ptr, size_t size, wkv_buffer_ref* mem,
                     uint64_t* buffer_size) {
    void* handle = NULL;
    uint64_t bytes = 0;
    memset(mem, 0, sizeof *mem);
    mem->hi = (int64_t)size;
    if (ptr && buffer_device_type(target->backend) && find_buffer(target, ptr, &handle, &bytes)) {
        mem->buffer = handle;
    } else {
        mem->host = target->backend != WKV_BACKEND_CUDA;
    }
    if (buffer_size) *buffer_size = bytes;
}

void wkv_workspace_mem_kind(const wkv_target* target, wkv_problem* p, uint64_t* buffer_size) {
    mem_kind(target, p->workspace, p->workspace_size, &p->workspace_mem, buffer_size);
}

/* check_mem_ptr on any backend: on one with device buffers the memory may also be a wkv_buffer
 * of target->ctx (then [0, size) of it, checked inside the buffer). Fills *mem. */
static wkv_status check_mem(const wkv_target* target, const mem_arg* a, void* ptr, size_t size,
                            const wkv_spans* spans, size_t needed, wkv_buffer_ref* mem, wkv_message* msg) {
    uint64_t bytes = 0;
    mem_kind(target, ptr, size, mem, &bytes);
    if (!mem->buffer) {
        if (ptr && buffer_is_live(target, ptr))
            return wkv_fail(msg, WKV_ERROR_DEVICE_MISMATCH, "%s is a wkv_buffer of another context", a->name);
        return check_mem_ptr(a, ptr, size, spans, needed, msg);
    }
    if (size < needed)
        return wkv_fail(msg, WKV_ERROR_WORKSPACE_TOO_SMALL, "%s_size is %zu bytes; this call needs %zu (%s)",
                        a->name, size, needed, a->query);
    if ((uint64_t)size > bytes)
        return wkv_fail(msg, WKV_ERROR_SHAPE, "%s_size is %zu bytes but its wkv_buffer has %llu", a->name,
                        size, (unsigned long long)bytes);
    uintptr_t hi = (uintptr_t)needed;
    for (int i = 0; i < spans->count; ++i)
        if (spans->span[i].buffer == ptr && spans->span[i].lo < hi)
            return wkv_fail(msg, WKV_ERROR_ALIASING, "%s (a wkv_buffer) overlaps %s", a->name,
                            wkv_span_name(&spans->span[i], (char[48]){0}));
    return WKV_OK;
}

wkv_status wkv_validate_workspace_mem(const wkv_target* target, const wkv_backward_desc* desc,
                                      const wkv_spans* spans, size_t needed, wkv_problem* p,
                                      wkv_message* msg) {
    (void)desc; /* p->workspace, p->workspace_size are the caller's (read by the validation) */
    return check_mem(target, &k_workspace_arg, p->workspace, p->workspace_size, spans, needed,
                     &p->workspace_mem, msg);
}

wkv_status wkv_validate_scratch_mem(const wkv_target* target, const wkv_spans* spans, size_t needed,
                                    wkv_problem* p, wkv_message* msg) {
    if (!p->scratch) { /* optional: the backend finds memory itself */
        memset(&p->scratch_mem, 0, sizeof p->scratch_mem);
        return WKV_OK;
    }
    return check_mem(target, &k_scratch_arg, p->scratch, p->scratch_size, spans, needed, &p->scratch_mem, msg);
}

/* ------------------------------------------------------------------------ attention */

static wkv_status check_attention_offsets(wkv_message* msg, const char* pre, const char* name, const int64_t* off,
                                          int64_t n, int64_t total, const char* what) {
    if (!off) return wkv_fail(msg, WKV_ERROR_NULL_POINTER, "%s%s is NULL but %snum_seqs is %lld", pre, name, pre,
                              (long long)n);
    return check_offsets(msg, pre, name, off, n, total, what);
}

static wkv_status check_attention_tensor(checker* c, const char* pre, int name, const wkv_tensor* t, int ndim,
                                         const int64_t* shape, const int8_t* axes, int output, int f32_only,
                                         wkv_view* out) {
    tensor_rule rule;
    memset(&rule, 0, sizeof rule);
    rule.ndim = ndim;
    for (int d = 0; d < ndim; ++d) rule.shape[d] = shape[d], rule.view_axis[d] = axes[d];
    rule.output = output;
    rule.state = f32_only;
    c->prefix = pre;
    c->name_idx = name;
    wkv_status st = check_tensor(c, t, &rule, out);
    if (st == WKV_ERROR_DTYPE && f32_only)
        return wkv_fail(c->msg, WKV_ERROR_DTYPE, "%s%s must be float32", pre, k_names[name]);
    return st;
}

static const int8_t k_tok_axes[4] = {AX_B, AX_T, AX_H, AX_N};
static const int8_t k_lse_axes[3] = {AX_B, AX_H, AX_T};

/* The forward descriptor d (named pre: "desc->", or "desc->forward->" for a backward, where o
 * and lse are inputs and lse is required) into p, its tensors' spans added to c's. */
static wkv_status check_attention_forward(checker* c, const wkv_attention_desc* d, const char* pre, int backward,
                                          wkv_attention_problem* p) {
    wkv_message* msg = c->msg;
    if (d->flags & ~(uint32_t)WKV_ATTENTION_CAUSAL)
        return wkv_fail(msg, WKV_ERROR_INVALID_ARGUMENT, "%sflags has unknown bits 0x%x", pre,
                        (unsigned)(d->flags & ~(uint32_t)WKV_ATTENTION_CAUSAL));
    if (!(d->scale == d->scale) || d->scale == __builtin_inff() || d->scale == -__builtin_inff())
        return wkv_fail(msg, WKV_ERROR_INVALID_ARGUMENT, "%sscale is not finite", pre);
    /* the shapes come from q and k; the other tensors must agree */
    const wkv_tensor* q = &d->q;
    const wkv_tensor* k = &d->k;
    if (!q->data) return wkv_fail(msg, WKV_ERROR_NULL_POINTER, "%sq.data is NULL", pre);
    if (!q->shape) return wkv_fail(msg, WKV_ERROR_NULL_POINTER, "%sq.shape is NULL", pre);
    if (q->ndim != 4)
        return wkv_fail(msg, WKV_ERROR_SHAPE, "%sq.ndim is %d, expected 4 ([B, Tq, Hq, D])", pre, (int)q->ndim);
    if (!k->data) return wkv_fail(msg, WKV_ERROR_NULL_POINTER, "%sk.data is NULL", pre);
    if (!k->shape) return wkv_fail(msg, WKV_ERROR_NULL_POINTER, "%sk.shape is NULL", pre);
    if (k->ndim != 4)
        return wkv_fail(msg, WKV_ERROR_SHAPE, "%sk.ndim is %d, expected 4 ([B, Tk, Hkv, D])", pre, (int)k->ndim);
    const int64_t B = q->shape[0], Tq = q->shape[1], Hq = q->shape[2], D = q->shape[3];
    const int64_t Tk = k->shape[1], Hkv = k->shape[2];
    if (B < 1 || Tq < 0 || Hq < 1 || D < 1)
        return wkv_fail(msg, WKV_ERROR_SHAPE, "%sq.shape is [%lld, %lld, %lld, %lld]: B, Hq and D must be >= 1, "
                        "Tq >= 0", pre, (long long)B, (long long)Tq, (long long)Hq, (long long)D);
    if (Tk < 0 || Hkv < 1)
        return wkv_fail(msg, WKV_ERROR_SHAPE, "%sk.shape[%d] is %lld: Tk must be >= 0 and Hkv >= 1", pre,
                        Tk < 0 ? 1 : 2, (long long)(Tk < 0 ? Tk : Hkv));
    if (Hq % Hkv)
        return wkv_fail(msg, WKV_ERROR_SHAPE, "%sq has %lld heads, not a multiple of %sk's %lld "
                        "(grouped-query heads: Hq = g * Hkv)", pre, (long long)Hq, pre, (long long)Hkv);
    int64_t numel;
    if (__builtin_mul_overflow(B, Tq > Tk ? Tq : Tk, &numel) || __builtin_mul_overflow(numel, Hq, &numel) ||
        __builtin_mul_overflow(numel, D, &numel) || numel > INT64_MAX / 4)
        return wkv_fail(msg, WKV_ERROR_OVERFLOW, "%sq: B*T*H*D bytes overflow int64", pre);

    memset(p, 0, sizeof *p);
    p->B = B, p->Tq = Tq, p->Tk = Tk, p->Hq = Hq, p->Hkv = Hkv, p->D = D;
    p->causal = (d->flags & WKV_ATTENTION_CAUSAL) != 0;
    p->scale = d->scale != 0.0f ? d->scale : (float)(1.0 / __builtin_sqrt((double)D));
    p->config = backward ? NULL : d->config;
    p->num_seqs = B;
    wkv_status st;
    if (d->num_seqs < 0)
        return wkv_fail(msg, WKV_ERROR_SEQUENCE_OFFSETS, "%snum_seqs is %lld: must be >= 0", pre,
                        (long long)d->num_seqs);
    if (d->num_seqs == 0 && (d->q_offsets || d->k_offsets))
        return wkv_fail(msg, WKV_ERROR_SEQUENCE_OFFSETS, "%s%s is set but num_seqs is 0 (set num_seqs to pack "
                        "sequences)", pre, d->q_offsets ? "q_offsets" : "k_offsets");
    if (d->num_seqs > 0) {
        if (B != 1)
            return wkv_fail(msg, WKV_ERROR_SEQUENCE_OFFSETS,
                            "%sq.shape[0] is %lld: packed sequences need B = 1", pre, (long long)B);
        if ((st = check_attention_offsets(msg, pre, "q_offsets", d->q_offsets, d->num_seqs, Tq, "Tq"))) return st;
        if ((st = check_attention_offsets(msg, pre, "k_offsets", d->k_offsets, d->num_seqs, Tk, "Tk"))) return st;
        p->num_seqs = d->num_seqs;
        p->q_offsets = d->q_offsets;
        p->k_offsets = d->k_offsets;
    }

    const int64_t q_shape[4] = {B, Tq, Hq, D}, kv_shape[4] = {B, Tk, Hkv, D}, lse_shape[3] = {B, Hq, Tq};
    const int out = !backward;
    if ((st = check_attention_tensor(c, pre, N_Q, &d->q, 4, q_shape, k_tok_axes, 0, 0, &p->q))) return st;
    if ((st = check_attention_tensor(c, pre, N_K, &d->k, 4, kv_shape, k_tok_axes, 0, 0, &p->k))) return st;
    if ((st = check_attention_tensor(c, pre, N_V, &d->v, 4, kv_shape, k_tok_axes, 0, 0, &p->v))) return st;
    if ((st = check_attention_tensor(c, pre, N_O, &d->o, 4, q_shape, k_tok_axes, out, 0, &p->o))) return st;
    if (backward && !d->lse.data)
        return wkv_fail(msg, WKV_ERROR_NULL_POINTER, "%slse.data is NULL: the backward reads the lse its forward "
                        "wrote (ask the forward for it)", pre);
    if (d->lse.data &&
        (st = check_attention_tensor(c, pre, N_LSE, &d->lse, 3, lse_shape, k_lse_axes, out, 1, &p->lse)))
        return st;
    if (p->k.elem != p->q.elem || p->v.elem != p->q.elem || p->o.elem != p->q.elem)
        return wkv_fail(msg, WKV_ERROR_DTYPE, "%s%s has another dtype than %sq (q, k, v and o share one)", pre,
                        p->k.elem != p->q.elem ? "k" : p->v.elem != p->q.elem ? "v" : "o", pre);
    return WKV_OK;
}

/* The spans' buffer references into the problem's slots. */
static void attention_mem(const wkv_spans* spans, wkv_attention_problem* p, wkv_buffer_ref* grads) {
    for (int i = 0; i < spans->count; ++i) {
        const int role = spans->span[i].role;
        const wkv_buffer_ref mem = spans->span[i].mem;
        switch (role) {
        case N_Q: p->mem[0] = mem; break;
        case N_K: p->mem[1] = mem; break;
        case N_V: p->mem[2] = mem; break;
        case N_O: p->mem[3] = mem; break;
        case N_LSE: p->mem[4] = mem; break;
        case N_DOUT: grads[0] = mem; break;
        case N_DQ: grads[1] = mem; break;
        case N_DK: grads[2] = mem; break;
        case N_DV: grads[3] = mem; break;
        case N_DLSE: grads[4] = mem; break;
        default: break;
        }
    }
}

wkv_status wkv_validate_attention(const wkv_target* target, const wkv_attention_desc* desc_in,
                                  wkv_attention_problem* p, wkv_message* msg) {
    if (!desc_in) return wkv_fail(msg, WKV_ERROR_NULL_POINTER, "desc is NULL");
    wkv_status st = wkv_check_struct_size(desc_in, sizeof(wkv_attention_desc), "desc", msg);
    if (st) return st;
    wkv_spans spans;
    spans.count = 0;
    checker c = {target, msg, &spans, NULL, 0, {0}};
    if ((st = check_attention_forward(&c, desc_in, "desc->", 0, p))) return st;
    if ((st = check_outputs_alias(&spans, msg))) return st;
    attention_mem(&spans, p, NULL);
    return WKV_OK;
}

wkv_status wkv_validate_attention_backward(const wkv_target* target, const wkv_attention_backward_desc* desc,
                                           wkv_attention_backward_problem* p, wkv_message* msg) {
    if (!desc) return wkv_fail(msg, WKV_ERROR_NULL_POINTER, "desc is NULL");
    wkv_status st = wkv_check_struct_size(desc, sizeof(wkv_attention_backward_desc), "desc", msg);
    if (st) return st;
    if (!desc->forward) return wkv_fail(msg, WKV_ERROR_NULL_POINTER, "desc->forward is NULL");
    if ((st = wkv_check_struct_size(desc->forward, sizeof(wkv_attention_desc), "desc->forward", msg))) return st;
    memset(p, 0, sizeof *p);
    wkv_spans spans;
    spans.count = 0;
    checker c = {target, msg, &spans, NULL, 0, {0}};
    wkv_attention_problem* f = &p->fwd;
    if ((st = check_attention_forward(&c, desc->forward, "desc->forward->", 1, f))) return st;
    const int64_t q_shape[4] = {f->B, f->Tq, f->Hq, f->D}, kv_shape[4] = {f->B, f->Tk, f->Hkv, f->D};
    if ((st = check_attention_tensor(&c, "desc->", N_DOUT, &desc->dout, 4, q_shape, k_tok_axes, 0, 0, &p->dout)))
        return st;
    if ((st = check_attention_tensor(&c, "desc->", N_DQ, &desc->dq, 4, q_shape, k_tok_axes, 1, 0, &p->dq))) return st;
    if ((st = check_attention_tensor(&c, "desc->", N_DK, &desc->dk, 4, kv_shape, k_tok_axes, 1, 0, &p->dk))) return st;
    if ((st = check_attention_tensor(&c, "desc->", N_DV, &desc->dv, 4, kv_shape, k_tok_axes, 1, 0, &p->dv))) return st;
    const int64_t lse_shape[3] = {f->B, f->Hq, f->Tq};
    if (desc->dlse.data &&
        (st = check_attention_tensor(&c, "desc->", N_DLSE, &desc->dlse, 3, lse_shape, k_lse_axes, 0, 1, &p->dlse)))
        return st;
    const wkv_view* grads[4] = {&p->dout, &p->dq, &p->dk, &p->dv};
    static const char* const grad_names[4] = {"dout", "dq", "dk", "dv"};
    for (int i = 0; i < 4; ++i)
        if (grads[i]->elem != f->q.elem)
            return wkv_fail(msg, WKV_ERROR_DTYPE, "desc->%s has another dtype than desc->forward->q (the gradients "
                            "share the forward's dtype)", grad_names[i]);
    if ((st = check_outputs_alias(&spans, msg))) return st;
    attention_mem(&spans, f, p->mem);
    return WKV_OK;
}
