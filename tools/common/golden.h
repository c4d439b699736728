/* The golden-file checker: one piece of code behind `wkv-bench golden` and tests/test_golden.cpp.
 *
 * wkv_golden_run() opens a golden safetensors file (format: tests/golden/README.md), runs its
 * case through the PUBLIC API on the requested backend — wkv_forward with state_in = s0 and a
 * state_out, then wkv_backward with dy, dstate_out = dsT, a workspace of wkv_workspace_size()
 * bytes and a dstate_in — and compares every output with the reference by the norm-wise
 * relative error ||out - ref||_2 / ||ref||_2 (a NaN or infinity anywhere: an infinite error).
 *
 *   dtype f32:      inputs are the file's float32 tensors; the reference is the file's float64
 *                   outputs and gradients. Tolerance 1e-4 on everything.
 *   dtype f16/bf16: inputs (and the outputs y, d<input>) are 16-bit; the inputs are the file's
 *                   rounded to 16 bits, and the reference is libwkv's own float64 reference
 *                   (src/reference) run on those rounded values (s0, dy, dsT stay float32, as
 *                   does the state the library gets). Tolerance 5e-3 on y and sT, 1e-2 on the
 *                   gradients.
 *
 * Before the calls every output (and the workspace) is filled with NaN, so an element the
 * backend forgets to write fails. Every buffer has guard zones before and after it that must
 * come back untouched, and the inputs must come back unchanged.
 *
 * Ops are described by a table in golden.c (inputs, their gradients, shapes, state parts, the
 * float64 reference): RWKV-7, RWKV-6 and RWKV-4 are all in it. A case whose op, dtype or shape
 * the backend does not implement yet comes back WKV_GOLDEN_UNSUPPORTED with the library's
 * message (so does a 16-bit run of an op that has no float64 reference yet). */
#ifndef WKV_TOOLS_GOLDEN_H
#define WKV_TOOLS_GOLDEN_H

#include <stddef.h>
#include <stdint.h>

#include "wkv/wkv.h"

#ifdef __cplusplus
extern "C" {
#endif

#define WKV_GOLDEN_TOL_F32 1e-4
#define WKV_GOLDEN_TOL_16BIT_FORWARD 5e-3
#define WKV_GOLDEN_TOL_16BIT_GRAD 1e-2
/* wkv_golden_run_reference: float64 against float64 */
#define WKV_GOLDEN_TOL_REFERENCE 1e-9

typedef enum wkv_golden_status {
    WKV_GOLDEN_PASS = 0,
    WKV_GOLDEN_FAIL = 1,        /* ran, and an output is off (or a call failed) */
    WKV_GOLDEN_UNSUPPORTED = 2, /* the backend (or the float64 reference) lacks this case */
    WKV_GOLDEN_ERROR = 3        /* unreadable or invalid file, no such backend, out of memory */
} wkv_golden_status;

enum { WKV_GOLDEN_MAX_TENSORS = 24, WKV_GOLDEN_NAME_LEN = 16 };

typedef struct wkv_golden_tensor {
    char name[WKV_GOLDEN_NAME_LEN]; /* "y", "sT", "dk", "ds0", "sT_aa", ... */
    double err;                     /* norm-wise relative error (INFINITY for NaN) */
    double tol;
    int pass;
} wkv_golden_tensor;

typedef struct wkv_golden_result {
    wkv_golden_status status;
    char op_name[16];     /* the file's "op": "wkv7", "wkv6", "wkv4" ("" if unread) */
    wkv_op op;            /* 0 when the file could not be read */
    wkv_decay_form decay_form;
    int per_channel;      /* 1 for RWKV-4 (C channels: H = 1, N = C) */
    int64_t B, T, H, N;
    wkv_backend backend;  /* the backend that ran (AUTO resolved), else the one asked for */
    wkv_dtype dtype;
    char device[256];     /* device name, when known */
    int num_tensors;
    wkv_golden_tensor tensors[WKV_GOLDEN_MAX_TENSORS];
    double max_rel_err;   /* the error of the worst tensor: the largest err / tol */
    char worst[WKV_GOLDEN_NAME_LEN];
    char message[512];    /* why it failed / is unsupported; a summary on PASS */
} wkv_golden_result;

typedef struct wkv_golden_options {
    wkv_backend backend;
    wkv_dtype dtype;       /* f32, f16 or bf16 */
    int32_t device_index;
    int32_t cpu_threads;   /* 0 = the library's default */
    int state_key_major;   /* pass states as [.., key, value] with WKV_FLAG_STATE_KEY_MAJOR */
} wkv_golden_options;

/* Runs one golden file on `backend` with inputs in `dtype`. Never aborts; returns out->status. */
wkv_golden_status wkv_golden_run(const char* path, wkv_backend backend, wkv_dtype dtype,
                                 wkv_golden_result* out);
wkv_golden_status wkv_golden_run_ex(const char* path, const wkv_golden_options* options,
                                    wkv_golden_result* out);

/* Checks libwkv's float64 reference itself against the file (its float32 inputs, unrounded):
 * the 16-bit checks trust that reference. Tolerance WKV_GOLDEN_TOL_REFERENCE. */
wkv_golden_status wkv_golden_run_reference(const char* path, wkv_golden_result* out);

/* 1 when `info` (of the backend that would run it) claims the op, dtype, decay form and head
 * size of the case in `r` (as read by a run: r->op != 0); otherwise 0 and `why` says what it
 * lacks. */
int wkv_golden_backend_claims(const wkv_backend_info* info, const wkv_golden_result* r,
                              char* why, size_t whylen);

/* "PASS", "FAIL", "UNSUPPORTED", "ERROR". */
const char* wkv_golden_status_name(wkv_golden_status s);

/* One line: "PASS  max_rel_err=3.1e-07 (dk)  cpu f32", "FAIL unsupported: ...", ... */
void wkv_golden_format(const wkv_golden_result* r, char* buf, size_t len);

/* The golden directory: $WKV_GOLDEN_DIR if set and not empty; else, for an installed tool,
 * the golden files installed with it (WKV_INSTALLED_GOLDEN_DIR, relative to the executable's
 * folder, when that directory exists); else WKV_DEFAULT_GOLDEN_DIR (the source tree's, set by
 * CMake); else "tests/golden". */
const char* wkv_golden_dir(void);

/* The sorted full paths of every *.safetensors file in dir. Returns 0 (then free with
 * wkv_golden_list_free), or -1 with the reason in err. */
int wkv_golden_list(const char* dir, char*** paths, size_t* count, char* err, size_t errlen);
void wkv_golden_list_free(char** paths, size_t count);

#ifdef __cplusplus
}
#endif

#endif /* WKV_TOOLS_GOLDEN_H */
