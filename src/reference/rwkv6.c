/* The float64 reference of the RWKV-6 WKV recurrence (RWKV-5: w the same at every t), forward
 * and backward.
 *
 * This file *defines* the op: plain loops over the formulas of include/wkv/wkv.h, in float64,
 * one (batch, head) pair at a time. Per token t, with S indexed S[i = value][j = key] and
 * S = S_{t-1} (the state before the token):
 *
 *     y_t[i]  = sum_j r_t[j] * (S[i][j] + u[j] * k_t[j] * v_t[i])
 *     S_t[i][j] = S[i][j] * decay_t[j] + k_t[j] * v_t[i]
 *
 * The backward walks t from T-1 down to 0 carrying dS = dL/dS_t (dsT or zero at the start):
 *
 *     dr_t[j]   = sum_i dy_t[i] * (S_{t-1}[i][j] + u[j] k_t[j] v_t[i])
 *     dk_t[j]   = sum_i dS[i][j] v_t[i]  +  r_t[j] u[j] (dy_t . v_t)
 *     dv_t[i]   = sum_j dS[i][j] k_t[j]  +  dy_t[i] (sum_j r_t[j] u[j] k_t[j])
 *     du[j]    += r_t[j] k_t[j] (dy_t . v_t)                  (summed over batches and tokens)
 *     dw_t[j]   = (sum_i dS[i][j] S_{t-1}[i][j]) * (d decay / d w)(w_t[j])
 *     dS[i][j]  = dS[i][j] decay_t[j] + dy_t[i] r_t[j]         (now dL/dS_{t-1})
 *
 * It needs S_{t-1} at every step: every WKV_REF6_CHUNK-th state is kept as a checkpoint and the
 * states inside one chunk are recomputed with the very same forward step, so they are
 * bit-identical to the forward ones. It never divides by the decay.
 *
 * This is test/tool code, never part of libwkv: it assumes allocations succeed, and if one
 * fails it prints a message and calls abort() (it never returns with outputs half written). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_alloc.h"
#include "wkv_reference.h"

/* Tokens per recomputation chunk of the backward. */
enum { WKV_REF6_CHUNK = 64 };

/* Offset of element [b][t][h][0] of a contiguous [B,T,H,N] tensor. */
static int64_t ref6_tok(const wkv_ref_rwkv6* in, int64_t b, int64_t t, int64_t h) {
    return ((b * in->T + t) * in->H + h) * in->N;
}

/* Offset of element [b][h][0][0] of a contiguous [B,H,N,N] state. */
static int64_t ref6_st(const wkv_ref_rwkv6* in, int64_t b, int64_t h) {
    return (b * in->H + h) * in->N * in->N;
}

/* One forward step of head h at token offset `o`: y (may be NULL) from S_prev, then S_next from
 * S_prev (distinct arrays). `decay` is scratch of N doubles. */
static void ref6_step(const wkv_ref_rwkv6* in, int64_t h, int64_t o, const double* S_prev,
                      double* S_next, double* y, double* decay) {
    const int64_t N = in->N;
    const double *r = in->r + o, *w = in->w + o, *k = in->k + o, *v = in->v + o;
    const double* u = in->u + h * N;
    for (int64_t j = 0; j < N; j++) decay[j] = wkv_ref_decay(in->decay_form, w[j]);
    if (y) {
        for (int64_t i = 0; i < N; i++) {
            double s = 0.0;
            for (int64_t j = 0; j < N; j++) s += r[j] * (S_prev[i * N + j] + u[j] * k[j] * v[i]);
            y[i] = s;
        }
    }
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < N; j++)
            S_next[i * N + j] = S_prev[i * N + j] * decay[j] + k[j] * v[i];
}

static void ref6_initial_state(const wkv_ref_rwkv6* in, int64_t b, int64_t h, double* S) {
    const int64_t NN = in->N * in->N;
    if (in->s0)
        memcpy(S, in->s0 + ref6_st(in, b, h), (size_t)NN * sizeof(double));
    else
        memset(S, 0, (size_t)NN * sizeof(double));
}

void wkv_ref_rwkv6_forward(const wkv_ref_rwkv6* in, double* y, double* sT) {
    const int64_t N = in->N, NN = N * N;
    double* S = (double*)wkv_ref_alloc(NN, sizeof(double));
    double* S_next = (double*)wkv_ref_alloc(NN, sizeof(double));
    double* decay = (double*)wkv_ref_alloc(N, sizeof(double));
    for (int64_t b = 0; b < in->B; b++) {
        for (int64_t h = 0; h < in->H; h++) {
            ref6_initial_state(in, b, h, S);
            for (int64_t t = 0; t < in->T; t++) {
                int64_t o = ref6_tok(in, b, t, h);
                ref6_step(in, h, o, S, S_next, y + o, decay);
                double* tmp = S;
                S = S_next;
                S_next = tmp;
            }
            if (sT) memcpy(sT + ref6_st(in, b, h), S, (size_t)NN * sizeof(double));
        }
    }
    free(S);
    free(S_next);
    free(decay);
}

void wkv_ref_rwkv6_backward(const wkv_ref_rwkv6* in, const double* dy, const double* dsT,
                            double* dr, double* dw, double* dk, double* dv, double* du,
                            double* ds0) {
    const int64_t N = in->N, NN = N * N, T = in->T;
    const int64_t num_chunks = (T + WKV_REF6_CHUNK - 1) / WKV_REF6_CHUNK;
    /* ckpt[c] = S_{c * CHUNK - 1}, the state before token c * CHUNK. */
    double* ckpt = (double*)wkv_ref_alloc((num_chunks + 1) * NN, sizeof(double));
    /* states[u] = the state before token t0 + u, u = 0..CHUNK, within the chunk [t0, t1). */
    double* states = (double*)wkv_ref_alloc((WKV_REF6_CHUNK + 1) * NN, sizeof(double));
    double* dS = (double*)wkv_ref_alloc(NN, sizeof(double));
    double* S_tmp = (double*)wkv_ref_alloc(NN, sizeof(double));
    double* decay = (double*)wkv_ref_alloc(N, sizeof(double));
    double* d_decay = (double*)wkv_ref_alloc(N, sizeof(double));

    for (int64_t x = 0; x < in->H * N; x++) du[x] = 0.0;
    for (int64_t bi = 0; bi < in->B; bi++) {
        for (int64_t h = 0; h < in->H; h++) {
            const double* u = in->u + h * N;
            /* Forward, keeping the checkpoints. */
            ref6_initial_state(in, bi, h, ckpt);
            memcpy(S_tmp, ckpt, (size_t)NN * sizeof(double));
            for (int64_t t = 0; t < T; t++) {
                ref6_step(in, h, ref6_tok(in, bi, t, h), S_tmp, states, NULL, decay);
                memcpy(S_tmp, states, (size_t)NN * sizeof(double));
                if ((t + 1) % WKV_REF6_CHUNK == 0)
                    memcpy(ckpt + ((t + 1) / WKV_REF6_CHUNK) * NN, S_tmp,
                           (size_t)NN * sizeof(double));
            }

            if (dsT)
                memcpy(dS, dsT + ref6_st(in, bi, h), (size_t)NN * sizeof(double));
            else
                memset(dS, 0, (size_t)NN * sizeof(double));

            for (int64_t c = num_chunks - 1; c >= 0; c--) {
                const int64_t t0 = c * WKV_REF6_CHUNK;
                const int64_t t1 = t0 + WKV_REF6_CHUNK < T ? t0 + WKV_REF6_CHUNK : T;
                memcpy(states, ckpt + c * NN, (size_t)NN * sizeof(double));
                for (int64_t t = t0; t < t1; t++)
                    ref6_step(in, h, ref6_tok(in, bi, t, h), states + (t - t0) * NN,
                              states + (t - t0 + 1) * NN, NULL, decay);

                for (int64_t t = t1 - 1; t >= t0; t--) {
                    const int64_t o = ref6_tok(in, bi, t, h);
                    const double* S_p = states + (t - t0) * NN; /* before token t */
                    const double *r = in->r + o, *w = in->w + o, *k = in->k + o;
                    const double* v = in->v + o;
                    const double* dyt = dy + o;

                    double dyv = 0.0, ruk = 0.0;
                    for (int64_t i = 0; i < N; i++) dyv += dyt[i] * v[i];
                    for (int64_t j = 0; j < N; j++) ruk += r[j] * u[j] * k[j];

                    /* y_t = (S_p + v (u.k)^T) r */
                    for (int64_t j = 0; j < N; j++) {
                        double s = 0.0;
                        for (int64_t i = 0; i < N; i++)
                            s += dyt[i] * (S_p[i * N + j] + u[j] * k[j] * v[i]);
                        dr[o + j] = s;
                    }
                    /* S_t = S_p diag(decay) + v k^T */
                    for (int64_t j = 0; j < N; j++) {
                        double s = 0.0;
                        for (int64_t i = 0; i < N; i++) s += dS[i * N + j] * v[i];
                        dk[o + j] = s + r[j] * u[j] * dyv;
                    }
                    for (int64_t i = 0; i < N; i++) {
                        double s = 0.0;
                        for (int64_t j = 0; j < N; j++) s += dS[i * N + j] * k[j];
                        dv[o + i] = s + dyt[i] * ruk;
                    }
                    for (int64_t j = 0; j < N; j++) du[h * N + j] += r[j] * k[j] * dyv;
                    for (int64_t j = 0; j < N; j++) {
                        double s = 0.0;
                        for (int64_t i = 0; i < N; i++) s += dS[i * N + j] * S_p[i * N + j];
                        d_decay[j] = s;
                        decay[j] = wkv_ref_decay(in->decay_form, w[j]);
                        dw[o + j] = d_decay[j] * wkv_ref_decay_grad(in->decay_form, w[j]);
                    }
                    /* dS_{t-1} = dS_t diag(decay) + dy_t r_t^T (y_t reads S_{t-1}) */
                    for (int64_t i = 0; i < N; i++)
                        for (int64_t j = 0; j < N; j++)
                            dS[i * N + j] = dS[i * N + j] * decay[j] + dyt[i] * r[j];
                }
            }
            if (ds0) memcpy(ds0 + ref6_st(in, bi, h), dS, (size_t)NN * sizeof(double));
        }
    }
    free(ckpt);
    free(states);
    free(dS);
    free(S_tmp);
    free(decay);
    free(d_decay);
}
