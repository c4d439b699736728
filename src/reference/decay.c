/* The decay forms of the float64 reference: the per-step multiplier decay(w) and its
 * derivative d decay / d w, one plain formula per wkv_decay_form (see include/wkv/wkv.h).
 *
 * This is test/tool code, never part of libwkv: an invalid decay_form is a bug in the caller,
 * so it prints a message and calls abort() instead of returning a value nobody checks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "wkv_reference.h"

/* exp(-0.5), the largest -log(decay) of the CLAMPW form. */
static const double WKV_REF_CLAMPW_SCALE = 0.60653065971263342360; /* e^-0.5 */

/* 1 / (1 + e^-w) without overflow for large |w|. */
static double ref_sigmoid(double w) {
    if (w >= 0) return 1.0 / (1.0 + exp(-w));
    double e = exp(w);
    return e / (1.0 + e);
}

static void ref_bad_form(const char* fn, wkv_decay_form form) {
    fprintf(stderr, "libwkv reference: %s: invalid decay_form %d\n", fn, (int)form);
    abort();
}

double wkv_ref_decay(wkv_decay_form form, double w) {
    switch (form) {
    case WKV_DECAY_DIRECT: return w;
    case WKV_DECAY_LOG: return exp(w);
    case WKV_DECAY_EXP_NEG_EXP: return exp(-exp(w));
    case WKV_DECAY_CLAMPW: return exp(-WKV_REF_CLAMPW_SCALE * ref_sigmoid(w));
    default: ref_bad_form("wkv_ref_decay", form); return 0.0;
    }
}

double wkv_ref_decay_grad(wkv_decay_form form, double w) {
    switch (form) {
    case WKV_DECAY_DIRECT: /* d w / d w */
        return 1.0;
    case WKV_DECAY_LOG: /* d exp(w) = exp(w) */
        return exp(w);
    case WKV_DECAY_EXP_NEG_EXP: { /* d exp(-e^w) = -e^w * exp(-e^w) */
        double e = exp(w);
        return -e * exp(-e);
    }
    case WKV_DECAY_CLAMPW: { /* d exp(-c*s(w)) = -c * s(w) * (1 - s(w)) * exp(-c*s(w)) */
        double s = ref_sigmoid(w);
        double one_minus_s = ref_sigmoid(-w); /* 1 - s(w), without cancellation */
        return -WKV_REF_CLAMPW_SCALE * s * one_minus_s * exp(-WKV_REF_CLAMPW_SCALE * s);
    }
    default: ref_bad_form("wkv_ref_decay_grad", form); return 0.0;
    }
}
