/* The float64 reference of the RWKV-4 WKV recurrence, forward and backward, in the numerically
 * stable (aa, bb, pp) form of tests/golden/README.md (Hugging Face transformers'
 * rwkv_linear_attention_cpu).
 *
 * Per channel c, with wd = -exp(w[c]) (the per-step decay is exp(-exp(w))), state (aa, bb, pp)
 * (numerator, denominator, running max exponent: the true numerator is aa e^pp), per token t:
 *
 *     ww  = u[c] + k_t
 *     q   = max(pp, ww);         e1 = e^(pp - q);        e2 = e^(ww - q)
 *     y_t = (e1 aa + e2 v_t) / (e1 bb + e2)
 *     q2  = max(pp + wd, k_t);   A  = e^(pp + wd - q2);  Bk = e^(k_t - q2)
 *     aa' = A aa + Bk v_t;       bb' = A bb + Bk;        pp' = q2
 *
 * An absent initial state is aa = bb = 0, pp = WKV_REF_RWKV4_PP_EMPTY (-1e38).
 *
 * The backward differentiates exactly these formulas, carrying (gaa, gbb, gpp) = dL/d(state
 * after token t), dsT (or zero) at the start:
 *   through y (q cancels out of y, so its gradient there is exactly zero and is left out):
 *     g = dy_t / (e1 bb + e2)
 *     gaa_prev = g e1,  gbb_prev = -g y e1,  gpp_prev = g e1 (aa - y bb),
 *     dv = g e2,        dk = du_t = g e2 (v - y)
 *   through the update (with dA = gaa aa + gbb bb, dB = gaa v + gbb, and
 *   dq2 = gpp - dA A - dB Bk, the gradient that reaches q2 = max(pp + wd, k)):
 *     gaa_prev += gaa A,  gbb_prev += gbb A,  gpp_prev += dA A,  dwd += dA A,
 *     dv += gaa Bk,       dk += dB Bk,
 *     and dq2 goes to pp_prev and wd when pp + wd > k, to k when k > pp + wd, half to each on
 *     a tie (torch.maximum's rule).
 *   dw[c] = (sum over batches and tokens of dwd) * wd (d wd / d w = -exp(w) = wd);
 *   du[c] = the sum of the y-part dk over batches and tokens.
 *
 * The states of one (batch, channel) pair are all kept (3 (T+1) doubles), so nothing is
 * recomputed and nothing is inverted.
 *
 * This is test/tool code, never part of libwkv: it assumes allocations succeed, and if one
 * fails it prints a message and calls abort() (it never returns with outputs half written). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ref_alloc.h"
#include "wkv_reference.h"

static double ref4_max(double a, double b) { return a >= b ? a : b; }

/* Runs the forward of (batch b, channel c): fills aa/bb/pp[0..T] (the states before each
 * token, and after the last) and y (stride C, may be NULL). */
static void ref4_channel(const wkv_ref_rwkv4* in, int64_t b, int64_t c, double* aa, double* bb,
                         double* pp, double* y) {
    const int64_t T = in->T, C = in->C;
    if (in->s0) {
        aa[0] = in->s0[(b * 3 + 0) * C + c];
        bb[0] = in->s0[(b * 3 + 1) * C + c];
        pp[0] = in->s0[(b * 3 + 2) * C + c];
    } else {
        aa[0] = 0.0;
        bb[0] = 0.0;
        pp[0] = WKV_REF_RWKV4_PP_EMPTY;
    }
    const double wd = -exp(in->w[c]), u = in->u[c];
    for (int64_t t = 0; t < T; t++) {
        const int64_t o = (b * T + t) * C + c;
        const double k = in->k[o], v = in->v[o];
        const double ww = u + k;
        const double q = ref4_max(pp[t], ww);
        const double e1 = exp(pp[t] - q), e2 = exp(ww - q);
        if (y) y[o] = (e1 * aa[t] + e2 * v) / (e1 * bb[t] + e2);
        const double q2 = ref4_max(pp[t] + wd, k);
        const double A = exp(pp[t] + wd - q2), Bk = exp(k - q2);
        aa[t + 1] = A * aa[t] + Bk * v;
        bb[t + 1] = A * bb[t] + Bk;
        pp[t + 1] = q2;
    }
}

void wkv_ref_rwkv4_forward(const wkv_ref_rwkv4* in, double* y, double* sT) {
    const int64_t T = in->T, C = in->C;
    double* aa = (double*)wkv_ref_alloc(T + 1, sizeof(double));
    double* bb = (double*)wkv_ref_alloc(T + 1, sizeof(double));
    double* pp = (double*)wkv_ref_alloc(T + 1, sizeof(double));
    for (int64_t b = 0; b < in->B; b++)
        for (int64_t c = 0; c < C; c++) {
            ref4_channel(in, b, c, aa, bb, pp, y);
            if (sT) {
                sT[(b * 3 + 0) * C + c] = aa[T];
                sT[(b * 3 + 1) * C + c] = bb[T];
                sT[(b * 3 + 2) * C + c] = pp[T];
            }
        }
    free(aa);
    free(bb);
    free(pp);
}

void wkv_ref_rwkv4_backward(const wkv_ref_rwkv4* in, const double* dy, const double* dsT,
                            double* dw, double* du, double* dk, double* dv, double* ds0) {
    const int64_t T = in->T, C = in->C;
    double* aa = (double*)wkv_ref_alloc(T + 1, sizeof(double));
    double* bb = (double*)wkv_ref_alloc(T + 1, sizeof(double));
    double* pp = (double*)wkv_ref_alloc(T + 1, sizeof(double));
    double* dwd = (double*)wkv_ref_alloc(C, sizeof(double));
    for (int64_t c = 0; c < C; c++) du[c] = 0.0;
    for (int64_t b = 0; b < in->B; b++) {
        for (int64_t c = 0; c < C; c++) {
            ref4_channel(in, b, c, aa, bb, pp, NULL);
            const double wd = -exp(in->w[c]), u = in->u[c];
            double gaa = dsT ? dsT[(b * 3 + 0) * C + c] : 0.0;
            double gbb = dsT ? dsT[(b * 3 + 1) * C + c] : 0.0;
            double gpp = dsT ? dsT[(b * 3 + 2) * C + c] : 0.0;
            for (int64_t t = T - 1; t >= 0; t--) {
                const int64_t o = (b * T + t) * C + c;
                const double k = in->k[o], v = in->v[o];
                const double a = aa[t], bv = bb[t], p = pp[t];
                /* through y */
                const double ww = u + k;
                const double q = ref4_max(p, ww);
                const double e1 = exp(p - q), e2 = exp(ww - q);
                const double den = e1 * bv + e2;
                const double y = (e1 * a + e2 * v) / den;
                const double g = dy[o] / den;
                const double dk_y = g * e2 * (v - y);
                double ga = g * e1, gb = -g * y * e1, gp = g * e1 * (a - y * bv);
                double dkt = dk_y, dvt = g * e2, dwdt = 0.0;
                /* through the update */
                const double q2 = ref4_max(p + wd, k);
                const double A = exp(p + wd - q2), Bk = exp(k - q2);
                const double dA = gaa * a + gbb * bv, dB = gaa * v + gbb;
                const double dq2 = gpp - dA * A - dB * Bk;
                ga += gaa * A;
                gb += gbb * A;
                gp += dA * A;
                dwdt += dA * A;
                dvt += gaa * Bk;
                dkt += dB * Bk;
                if (p + wd > k) {
                    gp += dq2;
                    dwdt += dq2;
                } else if (k > p + wd) {
                    dkt += dq2;
                } else {
                    gp += 0.5 * dq2;
                    dwdt += 0.5 * dq2;
                    dkt += 0.5 * dq2;
                }
                dk[o] = dkt;
                dv[o] = dvt;
                du[c] += dk_y;
                dwd[c] += dwdt;
                gaa = ga;
                gbb = gb;
                gpp = gp;
            }
            if (ds0) {
                ds0[(b * 3 + 0) * C + c] = gaa;
                ds0[(b * 3 + 1) * C + c] = gbb;
                ds0[(b * 3 + 2) * C + c] = gpp;
            }
        }
    }
    for (int64_t c = 0; c < C; c++) dw[c] = dwd[c] * -exp(in->w[c]);
    free(aa);
    free(bb);
    free(pp);
    free(dwd);
}
