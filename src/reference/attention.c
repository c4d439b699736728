/* Softmax attention in float64: the definition the backends are checked against. */
#include <math.h>
#include <string.h>

#include "wkv_reference.h"

void wkv_ref_attention_forward(const wkv_ref_attention* in, double* o, double* lse) {
    const int64_t Hq = in->Hq, Hkv = in->Hkv, D = in->D, group = Hq / Hkv;
    const int64_t seqs = in->num_seqs > 0 ? in->num_seqs : in->B;
    for (int64_t s = 0; s < seqs; ++s) {
        const int64_t b = in->num_seqs > 0 ? 0 : s;
        const int64_t q0 = in->num_seqs > 0 ? in->q_offsets[s] : 0, q1 = in->num_seqs > 0 ? in->q_offsets[s + 1] : in->Tq;
        const int64_t k0 = in->num_seqs > 0 ? in->k_offsets[s] : 0, k1 = in->num_seqs > 0 ? in->k_offsets[s + 1] : in->Tk;
        for (int64_t h = 0; h < Hq; ++h) {
            const int64_t g = h / group;
            for (int64_t t = q0; t < q1; ++t) {
                const double* q = in->q + ((b * in->Tq + t) * Hq + h) * D;
                double* out = o + ((b * in->Tq + t) * Hq + h) * D;
                /* keys this row sees: all of its sequence, or (causal, bottom-right aligned) up to
                 * row + (keys - rows) */
                int64_t last = k1 - 1;
                if (in->causal) last = k0 + (t - q0) + ((k1 - k0) - (q1 - q0));
                if (last > k1 - 1) last = k1 - 1;
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
