/* What the interop entry points (interop_*.c) need from a context, without its layout. */
#ifndef WKV_SRC_CONTEXT_H
#define WKV_SRC_CONTEXT_H

#include "backend.h"

/* Runs the backend's control hook on ctx with the usual bookkeeping (busy check, last error,
 * log): fails with WKV_ERROR_INVALID_ARGUMENT naming `fn` when ctx is not on `backend`, and
 * with WKV_ERROR_NULL_POINTER when `required` names data as an out-parameter and it is NULL. */
wkv_status wkv_context_control(wkv_context* ctx, const char* fn, wkv_backend backend, int32_t request,
                               void* data, const char* required);

/* ---- device buffers ----
 * When ptr is a live wkv_buffer of ctx: 1, with the backend's handle and the buffer's size;
 * otherwise 0. Never dereferences ptr. */
int wkv_context_find_buffer(const wkv_context* ctx, const void* ptr, void** backend_buffer,
                            uint64_t* size);
/* 1 when ptr is a live wkv_buffer of any context (0 at once while no buffer exists). Never
 * dereferences ptr. */
int wkv_buffer_is_live(const void* ptr);
/* Records "fn: message" as the last context-free error of this thread (wkv_last_error(NULL))
 * and returns st. */
wkv_status wkv_fail_context_free(wkv_status st, const char* fn, const char* message);

/* ---- Vulkan guest mode (interop_vulkan.c) ----
 * wkv_context_create on the Vulkan backend with args.guest = guest (fn names the entry point). */
wkv_status wkv_context_create_guest(const wkv_context_options* options, const void* guest, const char* fn,
                                    wkv_context** out);
/* A wkv_buffer of `bytes` whose backend handle comes from the control `request` (data: a
 * wkv_vulkan_import_args whose out_handle the backend fills). */
wkv_status wkv_buffer_create_imported(wkv_context* ctx, const char* fn, uint64_t bytes, int32_t request,
                                      wkv_vulkan_import_args* data, wkv_buffer** out);
/* Validates desc (a wkv_forward_desc, or a wkv_backward_desc when backward) as wkv_forward /
 * wkv_backward do, refuses host-memory tensors (WKV_ERROR_DEVICE_MISMATCH), and hands the
 * problem to the backend's control `request` with the command buffer. */
wkv_status wkv_context_record(wkv_context* ctx, const char* fn, wkv_backend backend, int32_t request, void* cmd,
                              const void* desc, int backward);

#endif
