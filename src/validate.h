/* Descriptor validation: the one place that checks what a caller passed. It turns a public
 * descriptor into a wkv_problem (see backend.h) or returns a status with a message naming the
 * argument. Nothing is written to any tensor here. */
#ifndef WKV_SRC_VALIDATE_H
#define WKV_SRC_VALIDATE_H

#include "backend.h"

/* Where the call will run: tensors must be in memory this backend can use. */
typedef struct wkv_target {
    wkv_backend backend;
    int32_t device_index;
    /* Device buffers: the context whose wkv_buffer objects tensors may refer to (NULL: none),
     * and how to ask about them (the context's owner fills these in, so that validation needs
     * nothing of the context's layout): find_buffer is 1 when ptr is a live wkv_buffer of ctx,
     * with the backend's handle and the buffer's size; buffer_is_live is 1 when ptr is a live
     * wkv_buffer of any context. Neither dereferences ptr. */
    const wkv_context* ctx;
    int (*find_buffer)(const wkv_context* ctx, const void* ptr, void** backend_buffer, uint64_t* size);
    int (*buffer_is_live)(const void* ptr);
} wkv_target;

/* The byte ranges of every tensor of a call, for the aliasing checks. */
enum { WKV_MAX_SPANS = 24 };
typedef struct wkv_span {
    const char* prefix; /* the argument is prefix + the role's name, e.g. "desc->forward->" "k" */
    int role;         /* which tensor of the op (validate.c's names) */
    uintptr_t lo, hi; /* [lo, hi) */
    int output;
    const wkv_tensor* tensor;
    /* Device buffers: the wkv_buffer the span is in (lo, hi are then byte offsets inside it),
     * or NULL for host memory; and the backend's handle of it with the view's byte offset. */
    const void* buffer;
    wkv_buffer_ref mem;
} wkv_span;
typedef struct wkv_spans {
    wkv_span span[WKV_MAX_SPANS];
    int count;
} wkv_spans;

/* The span's argument name ("desc->forward->k") in out; returns out. */
const char* wkv_span_name(const wkv_span* s, char out[48]);

wkv_status wkv_validate_forward(const wkv_target* target, const wkv_forward_desc* desc,
                                wkv_problem* out, wkv_message* msg);
/* The same, also giving the spans (for checking the workspace) and the caller's workspace in
 * out->workspace / workspace_size and scratch / scratch_size (not yet checked but for NULL with
 * a size: see wkv_validate_workspace_mem, wkv_validate_scratch_mem). */
wkv_status wkv_validate_forward_spans(const wkv_target* target, const wkv_forward_desc* desc,
                                      wkv_problem* out, wkv_spans* spans, wkv_message* msg);
/* Copies a descriptor of the caller's version (struct_size) into *out, the fields that version
 * lacks defaulted to zero. name: for messages ("desc", "desc->forward"). */
wkv_status wkv_read_forward_desc(const wkv_forward_desc* desc, const char* name,
                                  wkv_forward_desc* out, wkv_message* msg);
wkv_status wkv_read_backward_desc(const wkv_backward_desc* desc, wkv_backward_desc* out,
                                  wkv_message* msg);
/* Validates everything but the workspace size (the backend tells the size, see
 * wkv_validate_workspace). */
wkv_status wkv_validate_backward(const wkv_target* target, const wkv_backward_desc* desc,
                                 wkv_problem* out, wkv_spans* spans, wkv_message* msg);
/* The workspace is present, large enough and overlaps no tensor of the problem. (The spans'
 * tensor pointers are NULL after validation: only the byte ranges are kept.) */
wkv_status wkv_validate_workspace(const wkv_backward_desc* desc, const wkv_spans* spans,
                                  size_t needed, wkv_message* msg);

/* Softmax attention (wkv.h): checks the descriptor, fills p (p->config is the caller's string). */
wkv_status wkv_validate_attention(const wkv_target* target, const wkv_attention_desc* desc,
                                  wkv_attention_problem* p, wkv_message* msg);
/* The backward of attention (wkv.h): checks the descriptor and its forward, fills p. */
wkv_status wkv_validate_attention_backward(const wkv_target* target, const wkv_attention_backward_desc* desc,
                                           wkv_attention_backward_problem* p, wkv_message* msg);

/* ---- device buffers ----
 * The kind of p->workspace's memory, unchecked, into p->workspace_mem: a wkv_buffer of
 * target->ctx (its handle; its size in *buffer_size when not NULL) or a pointer (host memory,
 * except on CUDA, where it may be either: see backend.h). What a backend's saves_checkpoints
 * may look at before the workspace's size is known; wkv_validate_workspace_mem redoes it. */
void wkv_workspace_mem_kind(const wkv_target* target, wkv_problem* p, uint64_t* buffer_size);
/* Like wkv_validate_workspace, for p->workspace / p->workspace_size (as the validation read
 * them from the backward's or the forward's descriptor), on any backend: on one with device
 * buffers the workspace may also be a wkv_buffer of target->ctx (then its range is checked
 * inside that buffer). Fills p->workspace_mem (p->mem was filled by the validation). */
wkv_status wkv_validate_workspace_mem(const wkv_target* target, const wkv_backward_desc* desc,
                                      const wkv_spans* spans, size_t needed, wkv_problem* p,
                                      wkv_message* msg);
/* The forward's scratch p->scratch / scratch_size (as the validation read them) of which the
 * backend uses `needed` bytes (0: none): NULL is fine (the backend finds memory itself);
 * otherwise checked like the workspace ("desc->scratch" in messages; a wkv_buffer of another
 * context, or a size beyond its buffer, are refused even when nothing is needed). Fills
 * p->scratch_mem. */
wkv_status wkv_validate_scratch_mem(const wkv_target* target, const wkv_spans* spans, size_t needed,
                                    wkv_problem* p, wkv_message* msg);
/* Copies the spans' buffer references into p->mem (called by the wkv_validate_* functions). */
void wkv_problem_fill_mem(const wkv_spans* spans, wkv_problem* p);

/* A struct whose first member is its size: older sizes than `known` are refused (this is the
 * first version of every struct); newer, larger ones are accepted when the bytes this library
 * does not know are all zero. */
wkv_status wkv_check_struct_size(const void* s, size_t known, const char* name, wkv_message* msg);
/* The same for a struct that grew: `oldest` (the first version's size) is accepted too. */
wkv_status wkv_check_struct_size_since(const void* s, size_t oldest, size_t known, const char* name,
                                       wkv_message* msg);

#endif
