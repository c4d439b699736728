/* The float64 reference recurrences: plain, obviously correct loops that define each op.
 * Used by the tests and by wkv-bench's checker; never by a backend at run time.
 *
 * All arrays are contiguous float64: per-token tensors [B,T,H,N], states [B,H,N,N] indexed
 * [b][h][i = value][j = key]. A NULL initial state means zeros; a NULL d(final state) means
 * zero. See include/wkv/wkv.h for the recurrences themselves. */
#ifndef WKV_SRC_REFERENCE_H
#define WKV_SRC_REFERENCE_H

#include <stdint.h>

#include "wkv/wkv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The per-step multiplier from w, and its derivative d decay / d w, for each decay form. */
double wkv_ref_decay(wkv_decay_form form, double w);
double wkv_ref_decay_grad(wkv_decay_form form, double w);

typedef struct wkv_ref_rwkv7 {
    int64_t B, T, H, N;
    wkv_decay_form decay_form;
    const double *r, *w, *k, *v, *a, *b; /* [B,T,H,N] */
    const double* s0;                    /* [B,H,N,N] or NULL */
} wkv_ref_rwkv7;

/* y [B,T,H,N]; sT [B,H,N,N] (may be NULL). */
void wkv_ref_rwkv7_forward(const wkv_ref_rwkv7* in, double* y, double* sT);

/* Gradients of L = sum(y * dy) + sum(sT * dsT). dsT may be NULL (zero); ds0 may be NULL. */
void wkv_ref_rwkv7_backward(const wkv_ref_rwkv7* in, const double* dy, const double* dsT,
                            double* dr, double* dw, double* dk, double* dv, double* da,
                            double* db, double* ds0);

#ifdef __cplusplus
}
#endif

#endif /* WKV_SRC_REFERENCE_H */
