/* The float64 reference of the RWKV-7 WKV recurrence, forward and backward.
 *
 * This file *defines* the op: plain loops over the formulas of include/wkv/wkv.h, in float64,
 * one (batch, head) pair at a time. Per token t, with S indexed S[i = value][j = key]:
 *
 *     sa[i]   = sum_l S[i][l] * a_t[l]                          (S = S_{t-1})
 *     S[i][j] = S[i][j] * decay_t[j] + sa[i] * b_t[j] + v_t[i] * k_t[j]
 *     y_t[i]  = sum_j S[i][j] * r_t[j]                          (S = S_t)
 *
 * The backward walks t from T-1 down to 0 carrying dS = dL/dS_t (dsT or zero at the start).
 * It needs S_t and S_{t-1} at every step. Rather than keeping all T+1 states of a (b,h) pair
 * (T*N*N doubles: 0.5 GB at T=4096, N=128), it keeps every WKV_REF_CHUNK-th state as a
 * checkpoint and recomputes the states inside one chunk at a time with the very same forward
 * step, so the recomputed states are bit-identical to the forward ones. It never divides by
 * the decay, so tiny decays are fine.
 *
 * This is test/tool code, never part of libwkv: it assumes allocations succeed, and if one
 * fails it prints a message and calls abort() (it never returns with outputs half written). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_alloc.h"
#include "wkv_reference.h"

/* Tokens per recomputation chunk of the backward. */
enum { WKV_REF_CHUNK = 64 };

/* Offset of element [b][t][h][0] of a contiguous [B,T,H,N] tensor. */
static int64_t ref_tok(const wkv_ref_rwkv7* in, int64_t b, int64_t t, int64_t h) {
    return ((b * in->T + t) * in->H + h) * in->N;
}

/* Offset of element [b][h][0][0] of a contiguous [B,H,N,N] state. */
static int64_t ref_st(const wkv_ref_rwkv7* in, int64_t b, int64_t h) {
    return (b * in->H + h) * in->N * in->N;
}

/* One forward step at token offset `o`: S_next from S_prev (distinct arrays), and y (may be
 * NULL). `sa` and `decay` are scratch of N doubles. */
static void ref_step(const wkv_ref_rwkv7* in, int64_t o, const double* S_prev, double* S_next,
                     double* y, double* sa, double* decay) {
    const int64_t N = in->N;
    const double *r = in->r + o, *w = in->w + o, *k = in->k + o, *v = in->v + o;
    const double *a = in->a + o, *b = in->b + o;
    for (int64_t j = 0; j < N; j++) decay[j] = wkv_ref_decay(in->decay_form, w[j]);
    for (int64_t i = 0; i < N; i++) {
        double s = 0.0;
        for (int64_t l = 0; l < N; l++) s += S_prev[i * N + l] * a[l];
        sa[i] = s;
    }
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < N; j++)
            S_next[i * N + j] = S_prev[i * N + j] * decay[j] + sa[i] * b[j] + v[i] * k[j];
    if (y) {
        for (int64_t i = 0; i < N; i++) {
            double s = 0.0;
            for (int64_t j = 0; j < N; j++) s += S_next[i * N + j] * r[j];
            y[i] = s;
        }
    }
}

/* The state a (b,h) pair starts from: s0's slice or zeros. */
static void ref_initial_state(const wkv_ref_rwkv7* in, int64_t b, int64_t h, double* S) {
    const int64_t NN = in->N * in->N;
    if (in->s0)
        memcpy(S, in->s0 + ref_st(in, b, h), (size_t)NN * sizeof(double));
    else
        memset(S, 0, (size_t)NN * sizeof(double));
}

void wkv_ref_rwkv7_forward(const wkv_ref_rwkv7* in, double* y, double* sT) {
    const int64_t N = in->N, NN = N * N;
    double* S = (double*)wkv_ref_alloc(NN, sizeof(double));
    double* S_next = (double*)wkv_ref_alloc(NN, sizeof(double));
    double* sa = (double*)wkv_ref_alloc(N, sizeof(double));
    double* decay = (double*)wkv_ref_alloc(N, sizeof(double));
    for (int64_t b = 0; b < in->B; b++) {
        for (int64_t h = 0; h < in->H; h++) {
            ref_initial_state(in, b, h, S);
            for (int64_t t = 0; t < in->T; t++) {
                int64_t o = ref_tok(in, b, t, h);
                ref_step(in, o, S, S_next, y + o, sa, decay);
                double* tmp = S;
                S = S_next;
                S_next = tmp;
            }
            if (sT) memcpy(sT + ref_st(in, b, h), S, (size_t)NN * sizeof(double));
        }
    }
    free(S);
    free(S_next);
    free(sa);
    free(decay);
}

void wkv_ref_rwkv7_backward(const wkv_ref_rwkv7* in, const double* dy, const double* dsT,
                            double* dr, double* dw, double* dk, double* dv, double* da,
                            double* db, double* ds0) {
    const int64_t N = in->N, NN = N * N, T = in->T;
    const int64_t num_chunks = (T + WKV_REF_CHUNK - 1) / WKV_REF_CHUNK;
    /* ckpt[c] = S_{c * CHUNK}, the state before token c * CHUNK. */
    double* ckpt = (double*)wkv_ref_alloc((num_chunks + 1) * NN, sizeof(double));
    /* states[u] = S_{t0 + u} for u = 0..CHUNK within the current chunk [t0, t1). */
    double* states = (double*)wkv_ref_alloc((WKV_REF_CHUNK + 1) * NN, sizeof(double));
    double* dS = (double*)wkv_ref_alloc(NN, sizeof(double));
    double* dS_prev = (double*)wkv_ref_alloc(NN, sizeof(double));
    double* S_tmp = (double*)wkv_ref_alloc(NN, sizeof(double));
    double* sa = (double*)wkv_ref_alloc(N, sizeof(double));
    double* dsa = (double*)wkv_ref_alloc(N, sizeof(double));
    double* decay = (double*)wkv_ref_alloc(N, sizeof(double));
    double* d_decay = (double*)wkv_ref_alloc(N, sizeof(double));

    for (int64_t bi = 0; bi < in->B; bi++) {
        for (int64_t h = 0; h < in->H; h++) {
            /* Forward, keeping the checkpoints. */
            ref_initial_state(in, bi, h, ckpt);
            memcpy(S_tmp, ckpt, (size_t)NN * sizeof(double));
            for (int64_t t = 0; t < T; t++) {
                ref_step(in, ref_tok(in, bi, t, h), S_tmp, states, NULL, sa, decay);
                memcpy(S_tmp, states, (size_t)NN * sizeof(double));
                if ((t + 1) % WKV_REF_CHUNK == 0)
                    memcpy(ckpt + ((t + 1) / WKV_REF_CHUNK) * NN, S_tmp,
                           (size_t)NN * sizeof(double));
            }

            /* dS = dL/dS_T. */
            if (dsT)
                memcpy(dS, dsT + ref_st(in, bi, h), (size_t)NN * sizeof(double));
            else
                memset(dS, 0, (size_t)NN * sizeof(double));

            for (int64_t c = num_chunks - 1; c >= 0; c--) {
                const int64_t t0 = c * WKV_REF_CHUNK;
                const int64_t t1 = t0 + WKV_REF_CHUNK < T ? t0 + WKV_REF_CHUNK : T;
                /* Recompute S_{t0} .. S_{t1} of this chunk. */
                memcpy(states, ckpt + c * NN, (size_t)NN * sizeof(double));
                for (int64_t t = t0; t < t1; t++)
                    ref_step(in, ref_tok(in, bi, t, h), states + (t - t0) * NN,
                             states + (t - t0 + 1) * NN, NULL, sa, decay);

                for (int64_t t = t1 - 1; t >= t0; t--) {
                    const int64_t o = ref_tok(in, bi, t, h);
                    const double* S_t = states + (t - t0 + 1) * NN;  /* after token t */
                    const double* S_p = states + (t - t0) * NN;      /* before token t */
                    const double *r = in->r + o, *w = in->w + o, *k = in->k + o;
                    const double *v = in->v + o, *a = in->a + o, *b = in->b + o;
                    const double* dyt = dy + o;

                    /* y_t = S_t r_t: dS_t += dy_t r_t^T, dr_t = S_t^T dy_t. */
                    for (int64_t i = 0; i < N; i++)
                        for (int64_t j = 0; j < N; j++) dS[i * N + j] += dyt[i] * r[j];
                    for (int64_t j = 0; j < N; j++) dr[o + j] = 0.0;
                    for (int64_t i = 0; i < N; i++)
                        for (int64_t j = 0; j < N; j++) dr[o + j] += S_t[i * N + j] * dyt[i];
                    /* S_t = S_p diag(decay) + sa b^T + v k^T, with sa = S_p a. */
                    for (int64_t i = 0; i < N; i++) {
                        double s = 0.0;
                        for (int64_t j = 0; j < N; j++) s += dS[i * N + j] * k[j];
                        dv[o + i] = s;
                    }
                    for (int64_t j = 0; j < N; j++) dk[o + j] = 0.0;
                    for (int64_t i = 0; i < N; i++)
                        for (int64_t j = 0; j < N; j++) dk[o + j] += dS[i * N + j] * v[i];
                    for (int64_t i = 0; i < N; i++) {
                        double s = 0.0;
                        for (int64_t l = 0; l < N; l++) s += S_p[i * N + l] * a[l];
                        sa[i] = s;
                    }
                    for (int64_t i = 0; i < N; i++) {
                        double s = 0.0;
                        for (int64_t j = 0; j < N; j++) s += dS[i * N + j] * b[j];
                        dsa[i] = s;
                    }
                    for (int64_t j = 0; j < N; j++) db[o + j] = 0.0;
                    for (int64_t i = 0; i < N; i++)
                        for (int64_t j = 0; j < N; j++) db[o + j] += dS[i * N + j] * sa[i];
                    for (int64_t l = 0; l < N; l++) da[o + l] = 0.0;
                    for (int64_t i = 0; i < N; i++)
                        for (int64_t l = 0; l < N; l++) da[o + l] += S_p[i * N + l] * dsa[i];
                    /* d_decay[j] = sum_i dS[i][j] S_p[i][j]; dw = d_decay * d decay / d w. */
                    for (int64_t j = 0; j < N; j++) d_decay[j] = 0.0;
                    for (int64_t i = 0; i < N; i++)
                        for (int64_t j = 0; j < N; j++) d_decay[j] += dS[i * N + j] * S_p[i * N + j];
                    for (int64_t j = 0; j < N; j++) {
                        decay[j] = wkv_ref_decay(in->decay_form, w[j]);
                        dw[o + j] = d_decay[j] * wkv_ref_decay_grad(in->decay_form, w[j]);
                    }
                    /* dS_{t-1} = dS_t diag(decay) + dsa a^T. */
                    for (int64_t i = 0; i < N; i++)
                        for (int64_t j = 0; j < N; j++)
                            dS_prev[i * N + j] = dS[i * N + j] * decay[j] + dsa[i] * a[j];
                    double* tmp = dS;
                    dS = dS_prev;
                    dS_prev = tmp;
                }
            }
            if (ds0) memcpy(ds0 + ref_st(in, bi, h), dS, (size_t)NN * sizeof(double));
        }
    }
    free(ckpt);
    free(states);
    free(dS);
    free(dS_prev);
    free(S_tmp);
    free(sa);
    free(dsa);
    free(decay);
    free(d_decay);
}
