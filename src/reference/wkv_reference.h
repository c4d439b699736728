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

/* ---------------------------------------------------------------------------- RWKV-6 / 5 */

/* RWKV-6 (RWKV-5: the same with w equal at every t). Per token t, S = S_{t-1} [i][j]:
 *     y_t[i]  = sum_j r_t[j] * (S[i][j] + u[j] * k_t[j] * v_t[i])
 *     S[i][j] = S[i][j] * decay_t[j] + k_t[j] * v_t[i]                                    */
typedef struct wkv_ref_rwkv6 {
    int64_t B, T, H, N;
    wkv_decay_form decay_form;
    const double *r, *w, *k, *v; /* [B,T,H,N] */
    const double* u;             /* [H,N] */
    const double* s0;            /* [B,H,N,N] or NULL (zeros) */
} wkv_ref_rwkv6;

/* y [B,T,H,N]; sT [B,H,N,N] (may be NULL). */
void wkv_ref_rwkv6_forward(const wkv_ref_rwkv6* in, double* y, double* sT);

/* Gradients of L = sum(y * dy) + sum(sT * dsT). dsT may be NULL (zero); ds0 may be NULL.
 * du [H,N] sums over every batch and token. */
void wkv_ref_rwkv6_backward(const wkv_ref_rwkv6* in, const double* dy, const double* dsT,
                            double* dr, double* dw, double* dk, double* dv, double* du,
                            double* ds0);

/* ------------------------------------------------------------------------------- RWKV-4 */

/* The initial pp of an absent RWKV-4 state (aa = bb = 0): "minus infinity", as HF does. */
#define WKV_REF_RWKV4_PP_EMPTY (-1e38)

/* RWKV-4 per channel c, in the numerically stable (aa, bb, pp) form of
 * tests/golden/README.md, with wd = -exp(w[c]) (decay exp(-exp(w))) and ww = u[c] + k_t:
 *     q  = max(pp, ww)
 *     y_t = (e^(pp-q) aa + e^(ww-q) v_t) / (e^(pp-q) bb + e^(ww-q))
 *     q2 = max(pp + wd, k_t)
 *     aa = e^(pp+wd-q2) aa + e^(k_t-q2) v_t;  bb = e^(pp+wd-q2) bb + e^(k_t-q2);  pp = q2
 * States are [B,3,C]: part 0 aa, 1 bb, 2 pp (the library's planar layout). */
typedef struct wkv_ref_rwkv4 {
    int64_t B, T, C;
    const double* w;      /* [C] time_decay */
    const double* u;      /* [C] time_first */
    const double *k, *v;  /* [B,T,C] */
    const double* s0;     /* [B,3,C], or NULL: aa = bb = 0, pp = WKV_REF_RWKV4_PP_EMPTY */
} wkv_ref_rwkv4;

/* y [B,T,C]; sT [B,3,C] (may be NULL). */
void wkv_ref_rwkv4_forward(const wkv_ref_rwkv4* in, double* y, double* sT);

/* Gradients of L = sum(y * dy) + sum over the three parts of sT * dsT, through the recurrence
 * exactly as written above (the max-tracking representation: a max passes its gradient to the
 * larger argument, half to each on a tie, as torch.maximum does). dsT [B,3,C] may be NULL
 * (zero); ds0 [B,3,C] may be NULL. dw, du [C] sum over every batch and token. */
void wkv_ref_rwkv4_backward(const wkv_ref_rwkv4* in, const double* dy, const double* dsT,
                            double* dw, double* du, double* dk, double* dv, double* ds0);

/* ---------------------------------------------------------------------------- attention */

/* Softmax attention (wkv.h, attention), two passes per row (max, then sums): q [B,Tq,Hq,D],
 * k, v [B,Tk,Hkv,D] contiguous; packed when num_seqs > 0 (B = 1). o [B,Tq,Hq,D]; lse
 * [B,Hq,Tq] (may be NULL). A row that sees no key: o = 0, lse = -inf. */
typedef struct wkv_ref_attention {
    int64_t B, Tq, Tk, Hq, Hkv, D;
    int causal;
    double scale;
    const double *q, *k, *v;
    int64_t num_seqs;
    const int64_t *q_offsets, *k_offsets;
} wkv_ref_attention;

void wkv_ref_attention_forward(const wkv_ref_attention* in, double* o, double* lse);
/* Its gradients from dout [B,Tq,Hq,D] and dlse [B,Hq,Tq] (may be NULL: zero), the softmax
 * recomputed exactly: dq [B,Tq,Hq,D], dk and dv [B,Tk,Hkv,D]; a kv head's gradients sum over its
 * query heads. */
void wkv_ref_attention_backward(const wkv_ref_attention* in, const double* dout, const double* dlse, double* dq,
                                double* dk, double* dv);

#ifdef __cplusplus
}
#endif

#endif /* WKV_SRC_REFERENCE_H */
