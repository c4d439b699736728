/* Softmax attention in float64: the definition the backends are checked against. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "wkv_reference.h"

/* The batch of sequence s and the keys [k0, *last] its row t sees (*last < k0: none): all of
 * the sequence's, or (causal, bottom-right aligned) up to row + (keys - rows). */
static void row_keys(const wkv_ref_attention* in, int64_t s, int64_t t, int64_t* b, int64_t* k0, int64_t* last) {
    const int64_t q0 = in->num_seqs > 0 ? in->q_offsets[s] : 0, q1 = in->num_seqs > 0 ? in->q_offsets[s + 1] : in->Tq;
    const int64_t k1 = in->num_seqs > 0 ? in->k_offsets[s + 1] : in->Tk;
    *b = in->num_seqs > 0 ? 0 : s;
    *k0 = in->num_seqs > 0 ? in->k_offsets[s] : 0;
    *last = k1 - 1;
    if (in->causal && *k0 + (t - q0) + ((k1 - *k0) - (q1 - q0)) < *last) *last = *k0 + (t - q0) + ((k1 - *k0) - (q1 - q0));
}

void wkv_ref_attention_forward(const wkv_ref_attention* in, double* o, double* lse) {
    const int64_t Hq = in->Hq, Hkv = in->Hkv, D = in->D, group = Hq / Hkv;
    const int64_t seqs = in->num_seqs > 0 ? in->num_seqs : in->B;
    for (int64_t s = 0; s < seqs; ++s) {
        const int64_t q0 = in->num_seqs > 0 ? in->q_offsets[s] : 0, q1 = in->num_seqs > 0 ? in->q_offsets[s + 1] : in->Tq;
        for (int64_t h = 0; h < Hq; ++h) {
            const int64_t g = h / group;
            for (int64_t t = q0; t < q1; ++t) {
                int64_t b, k0, last;
                row_keys(in, s, t, &b, &k0, &last);
                const double* q = in->q + ((b * in->Tq + t) * Hq + h) * D;
                double* out = o + ((b * in->Tq + t) * Hq + h) * D;
                memset(out, 0, (size_t)D * sizeof *out);
                double* l = lse ? lse + (b * Hq + h) * in->Tq + t : NULL;
                if (last < k0) {
                    if (l) *l = -INFINITY;
                    continue;
                }
                double m = -INFINITY;
                for (int64_t j = k0; j <= last; ++j) {
                    const double* kj = in->k + ((b * in->Tk + j) * Hkv + g) * D;
                    double dot = 0;
                    for (int64_t d = 0; d < D; ++d) dot += q[d] * kj[d];
                    if (in->scale * dot > m) m = in->scale * dot;
                }
                double sum = 0;
                for (int64_t j = k0; j <= last; ++j) {
                    const double* kj = in->k + ((b * in->Tk + j) * Hkv + g) * D;
                    const double* vj = in->v + ((b * in->Tk + j) * Hkv + g) * D;
                    double dot = 0;
                    for (int64_t d = 0; d < D; ++d) dot += q[d] * kj[d];
                    const double e = exp(in->scale * dot - m);
                    sum += e;
                    for (int64_t d = 0; d < D; ++d) out[d] += e * vj[d];
                }
                for (int64_t d = 0; d < D; ++d) out[d] /= sum;
                if (l) *l = m + log(sum);
            }
        }
    }
}

void wkv_ref_attention_backward(const wkv_ref_attention* in, const double* dout, const double* dlse, double* dq,
                                double* dk, double* dv) {
    const int64_t Hq = in->Hq, Hkv = in->Hkv, D = in->D, group = Hq / Hkv;
    const int64_t seqs = in->num_seqs > 0 ? in->num_seqs : in->B;
    const size_t nq = (size_t)(in->B * in->Tq * Hq * D), nk = (size_t)(in->B * in->Tk * Hkv * D);
    /* an empty tensor may come as NULL: memset must not see it */
    if (nq) memset(dq, 0, sizeof *dq * nq);
    if (nk) memset(dk, 0, sizeof *dk * nk), memset(dv, 0, sizeof *dv * nk);
    double* p = (double*)malloc(sizeof(double) * (size_t)(in->Tk > 0 ? in->Tk : 1));
    double* dp = (double*)malloc(sizeof(double) * (size_t)(in->Tk > 0 ? in->Tk : 1));
    if (!p || !dp) abort(); /* the reference runs in tests only */
    for (int64_t s = 0; s < seqs; ++s) {
        const int64_t q0 = in->num_seqs > 0 ? in->q_offsets[s] : 0, q1 = in->num_seqs > 0 ? in->q_offsets[s + 1] : in->Tq;
        for (int64_t h = 0; h < Hq; ++h) {
            const int64_t g = h / group;
            for (int64_t t = q0; t < q1; ++t) {
                int64_t b, k0, last;
                row_keys(in, s, t, &b, &k0, &last);
                if (last < k0) continue;
                const double* q = in->q + ((b * in->Tq + t) * Hq + h) * D;
                const double* go = dout + ((b * in->Tq + t) * Hq + h) * D;
                double m = -INFINITY, sum = 0, delta = 0;
                for (int64_t j = k0; j <= last; ++j) {
                    const double* kj = in->k + ((b * in->Tk + j) * Hkv + g) * D;
                    const double* vj = in->v + ((b * in->Tk + j) * Hkv + g) * D;
                    double dot = 0, dv_dot = 0;
                    for (int64_t d = 0; d < D; ++d) dot += q[d] * kj[d], dv_dot += go[d] * vj[d];
                    p[j - k0] = in->scale * dot, dp[j - k0] = dv_dot;
                    if (p[j - k0] > m) m = p[j - k0];
                }
                for (int64_t j = 0; j <= last - k0; ++j) sum += p[j] = exp(p[j] - m);
                for (int64_t j = 0; j <= last - k0; ++j) p[j] /= sum, delta += p[j] * dp[j];
                if (dlse) delta -= dlse[(b * Hq + h) * in->Tq + t]; /* d lse / d s_j = p_j */
                double* gq = dq + ((b * in->Tq + t) * Hq + h) * D;
                for (int64_t j = k0; j <= last; ++j) {
                    const double pj = p[j - k0], ds = pj * (dp[j - k0] - delta);
                    const double* kj = in->k + ((b * in->Tk + j) * Hkv + g) * D;
                    double* gk = dk + ((b * in->Tk + j) * Hkv + g) * D;
                    double* gv = dv + ((b * in->Tk + j) * Hkv + g) * D;
                    for (int64_t d = 0; d < D; ++d) {
                        gq[d] += in->scale * ds * kj[d];
                        gk[d] += in->scale * ds * q[d];
                        gv[d] += pj * go[d];
                    }
                }
            }
        }
    }
    free(p);
    free(dp);
}
