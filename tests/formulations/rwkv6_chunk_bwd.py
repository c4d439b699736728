"""RWKV-6/5 forward and backward in chunks of C tokens, float64 numpy: rwkv7_chunk_bwd.py without
the a b^T term (no triangular solves, no sa rows U, no W) plus the bonus u (the chunked
backward in backends/cuda/DESIGN.md, RWKV-6/5's variant). Per head, value-major S, per token t:
    y_t = (S_{t-1} + v_t (u o k_t)^T) r_t,    S_t = S_{t-1} diag(d_t) + v_t k_t^T.
Inside a chunk with entry state S_e (decays as in rwkv7_chunk_bwd.decays):
    A[t,s] = sum_j r_t k_s e^(G_{t-1} - G_s) (s < t),  beta_t = sum_j r_t u k_t,  Rp = R o e^Gp,
    Y = Rp S_e^T + (A + diag(beta)) V,   S_x = S_e o gam + V^T Kh,  Kh = K o e^(G_L - G).
The backward walk is elementwise plus a per-chunk product: dS_e = dS_x o gam + dY^T Rp.
"""

from __future__ import annotations

import numpy as np

from rwkv7_chunk_bwd import _chunks, _pair_grads, ddecay_dw, decays, log_decay


def local(x, u):
    """The chunk's decays, A, beta and the scaled vectors (all chunks in parallel)."""
    q = decays(x["g"])
    q.update(A=np.einsum("tj,tsj,sj->ts", x["r"], q["Dab"], x["k"]), beta=(x["r"] * u * x["k"]).sum(1),
             Rp=x["r"] * np.exp(q["Gp"]), Kh=x["k"] * np.exp(q["GL_G"]), gam=np.exp(q["G"][-1]))
    return q


def backward_local(x, u, q, dY, S_e, dS_x):
    """The chunk's token gradients (dd: w.r.t. the decay) and its share of du."""
    r, k, v = x["r"], x["k"], x["v"]
    C, N = r.shape
    dV = (q["A"] + np.diag(q["beta"])).T @ dY + q["Kh"] @ dS_x.T
    dRp, dKh, dgam = dY @ S_e, v @ dS_x, (S_e * dS_x).sum(0)
    dA = np.tril(np.ones((C, C), v.dtype), -1) * (dY @ v.T)
    dr1, dk1 = _pair_grads(dA, r, k, q["Dab"])
    dbeta = (dY * v).sum(1)[:, None]
    eGp, eGL = np.exp(q["Gp"]), np.exp(q["GL_G"])
    # the exact decay gradient (rwkv7_chunk_bwd.decay_grad with one family and no Re term):
    # Rp_t (u < t): e^Gp_u F_u, F_u = dRp_{u+1} r_{u+1} + d_{u+1} F_{u+1}; Kh_s (s < u): e^(G_L - G_u)
    # P_u; gam; A (s < u < t): sum_{t>u} r_t e^X[t-1,u] Q_u[t], Q_{u+1}[t] = d_u Q_u[t] + dA[t,u] k_u
    d = np.exp(x["g"])
    F = np.zeros_like(r)
    for t in reversed(range(C - 1)):
        F[t] = dRp[t + 1] * r[t + 1] + d[t + 1] * F[t + 1]
    dd = eGp * F + dgam * eGp * eGL
    P, Q = np.zeros_like(r[0]), np.zeros_like(r)
    for t in range(C):
        dd[t] += eGL[t] * P + np.einsum("sj,sj,sj->j", r[t + 1:], q["Dab"][t + 1:, t], Q[t + 1:])
        P = d[t] * P + dKh[t] * k[t]
        Q = d[t] * Q + dA[:, t, None] * k[t]
    grads = dict(dr=dr1 + dRp * eGp + dbeta * u * k, dk=dk1 + dKh * eGL + dbeta * u * r, dv=dV, dd=dd)
    return grads, (dbeta * r * k).sum(0)


def sequence(x, u, dY, S0, dST, C):
    """One (sequence, head): forward (local, walk, outputs), then backward (walk last chunk first,
    local). Returns y, S_T, the token gradients, du and dS0."""
    T, N = x["v"].shape
    xs, dYs = _chunks(x, C), [d["dy"] for d in _chunks({"dy": dY}, C)]
    qs = [local(xc, u) for xc in xs]
    S_e, S = [], S0
    for xc, q in zip(xs, qs):                      # forward walk
        S_e.append(S)
        S = S * q["gam"] + xc["v"].T @ q["Kh"]
    y = [q["Rp"] @ s.T + (q["A"] + np.diag(q["beta"])) @ xc["v"] for xc, q, s in zip(xs, qs, S_e)]
    Ld = [d.T @ q["Rp"] for q, d in zip(qs, dYs)]  # the walk-independent part of dS_e
    dS_x, dS = [None] * len(xs), dST
    for c in reversed(range(len(xs))):             # backward walk: elementwise plus Ld
        dS_x[c] = dS
        dS = dS * qs[c]["gam"] + Ld[c]
    out = [backward_local(xc, u, q, d, s, ds) for xc, q, d, s, ds in zip(xs, qs, dYs, S_e, dS_x)]
    cat = lambda z: np.vstack(z)[:T] if z else np.zeros((0, N), S0.dtype)
    grads = {n: cat([g[n] for g, _ in out]) for n in ("dr", "dk", "dv", "dd")}
    return cat(y), S, grads, sum((du for _, du in out), np.zeros(N)), dS


def rwkv6_chunked(r, w, k, v, u, dy, s0=None, dsT=None, form="exp_neg_exp", C=32):
    """[B,T,H,N] inputs, u [H,N]: y, sT and dr dw dk dv du ds0 of L = sum(y dy) + sum(sT dsT)."""
    r, w, k, v, u, dy = (np.asarray(t, np.float64) for t in (r, w, k, v, u, dy))
    B, T, H, N = v.shape
    g = log_decay(w, form)
    s0 = np.zeros((B, H, N, N)) if s0 is None else np.asarray(s0, np.float64)
    dsT = np.zeros((B, H, N, N)) if dsT is None else np.asarray(dsT, np.float64)
    y, sT, ds0, du = np.zeros((B, T, H, N)), np.zeros_like(s0), np.zeros_like(s0), np.zeros((H, N))
    out = {n: np.zeros((B, T, H, N)) for n in ("dr", "dk", "dv", "dd")}
    for bi in range(B):
        for h in range(H):
            x = dict(r=r[bi, :, h], g=g[bi, :, h], k=k[bi, :, h], v=v[bi, :, h])
            y[bi, :, h], sT[bi, h], gr, du_h, ds0[bi, h] = sequence(x, u[h], dy[bi, :, h], s0[bi, h], dsT[bi, h], C)
            du[h] += du_h
            for n in out:
                out[n][bi, :, h] = gr[n]
    out["dw"] = out.pop("dd") * ddecay_dw(w, form)
    out.update(du=du, ds0=ds0)
    return y, sT, out
