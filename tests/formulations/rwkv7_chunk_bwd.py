"""RWKV-7 forward and backward in chunks of C tokens, float64 numpy: the spec of the chunked CUDA
backward (backends/cuda/DESIGN.md, "RWKV-7 backward"). Each function below is one step
of that design; the kernels are checked against it, and it is checked against the sequential
float64 reference (bindings/python/tests/reference.py) by test_rwkv7_chunk_bwd.py.

Per head, value-major state S (N x N, row i = value, column j = key), per token t:
    S_t = S_{t-1} (diag(d_t) + a_t b_t^T) + v_t k_t^T,    y_t = S_t r_t.
Token vectors are rows of C x N matrices (R, K, V, A, B, dY, ...). Inside a chunk, g_t = log d_t
(taken straight from w, never as log of the decay), G_t = sum_{u<=t} g_u, Gp_t = G_{t-1}.

Decays: every factor is exp(G_t - G_s) for s <= t, exp(G_t) or exp(G_L - G_s), with the exponent
summed over the factor's own span (from s, from the chunk start, from the chunk end), so it is
<= 0: nothing overflows, nothing is divided by a decay, a zero decay (DIRECT w = 0, log = -inf)
is an exact zero, and a factor near 1 after tiny decays keeps its relative precision. This
prototype forms the relative decays pairwise (the [t, s, j] tensors Drb, Dab); a kernel may
factorise them through a reference point m between s and t (exp(G_t - G_m) exp(G_m - G_s), both
<= 1, each summed from m), and for CLAMPW (decay >= 0.545) as the forward's exp(G_t) exp(-G_s).
The decay gradient is dL/d decay_u itself (decay_grad), as the sequential backward computes it,
so all four decay forms are chunked, DIRECT included, and small decays stay exact elementwise.
"""

from __future__ import annotations

import numpy as np

_CLAMPW = float(np.exp(-0.5))  # a Python float: keeps float32 models float32


def log_decay(w, form):
    """g = log(decay(w)), computed from w (DIRECT: log w, -inf for a zero decay, which the
    exponent sums carry as exact zeros)."""
    if form == "log":
        return w
    if form == "exp_neg_exp":
        return -np.exp(w)
    if form == "clampw":
        return -_CLAMPW * 0.5 * (1.0 + np.tanh(0.5 * w))  # -e^-1/2 sigmoid(w)
    if form == "direct":
        with np.errstate(divide="ignore"):
            return np.log(w)
    raise ValueError("decay_form %r" % form)


def ddecay_dw(w, form):
    """d decay / d w: dw = d_decay * this."""
    d = np.exp(log_decay(w, form))
    if form == "log":
        return d
    if form == "exp_neg_exp":
        return -np.exp(w) * d
    if form == "clampw":
        s = 0.5 * (1.0 + np.tanh(0.5 * w))
        return -_CLAMPW * s * (1.0 - s) * d
    return np.ones_like(w)


def dlog_decay_dw(w, form):
    """d g / d w for the log-space route (no division: DIRECT has none, it is refused there)."""
    if form == "log":
        return np.ones_like(w)
    if form == "exp_neg_exp":
        return -np.exp(w)
    if form == "clampw":
        s = 0.5 * (1.0 + np.tanh(0.5 * w))
        return -_CLAMPW * s * (1.0 - s)
    raise ValueError("decay_form %r: dL/dw = dL/dg / decay, a division; use the exact route" % form)


# ---- per chunk: the forward's WY quantities --------------------------------------------------

def decays(g):
    """The chunk's decay sums from its log decays g (C x N): G, Gp, GL_G = G_L - G (summed from the
    end), and the relative decays Drb[t,s] = e^(G_t - G_s) (s <= t), Dab[t,s] = e^(G_{t-1} - G_s)
    (s < t), zero elsewhere. X[t,s] = G_t - G_s is summed from s on (sum of g_u, s < u <= t), not
    taken as a difference of two sums from the chunk start: a factor near 1 after tiny decays
    keeps its relative precision."""
    C = len(g)
    G = np.cumsum(g, 0)
    Gp = np.vstack([np.zeros_like(G[:1]), G[:-1]])
    GL_G = np.vstack([np.cumsum(g[::-1], 0)[::-1][1:], np.zeros_like(G[:1])])
    t = np.arange(C)
    X = np.cumsum(np.where((t[:, None] > t[None, :])[:, :, None], g[:, None, :], 0.0), 0)
    Xp = np.vstack([np.zeros_like(X[:1]), X[:-1]])  # G_{t-1} - G_s
    return dict(G=G, Gp=Gp, GL_G=GL_G,
                Drb=np.exp(np.where((t[:, None] >= t[None, :])[:, :, None], X, -np.inf)),
                Dab=np.exp(np.where((t[:, None] > t[None, :])[:, :, None], Xp, -np.inf)))


def chunk_quantities(x):
    """x: the chunk's r g k v a b (C x N each). Returns decays(g) and the four C x C matrices,
    and the scaled vectors:
        Aab[t,s] = sum_j a_t b_s exp(Gp_t - G_s)  (s < t),   Aak: k_s for b_s
        Arb[t,s] = sum_j r_t b_s exp(G_t - G_s)   (s <= t),  Ark: k_s for b_s
        Ae = A o exp(Gp),  Re = R o exp(G),  Bh = B o exp(G_L - G),  Kh likewise,  gam = exp(G_L)."""
    q = decays(x["g"])
    G, Gp, GL_G = q["G"], q["Gp"], q["GL_G"]
    pair = lambda p, D, s: np.einsum("tj,tsj,sj->ts", p, D, s)
    q.update(Aab=pair(x["a"], q["Dab"], x["b"]), Aak=pair(x["a"], q["Dab"], x["k"]),
             Arb=pair(x["r"], q["Drb"], x["b"]), Ark=pair(x["r"], q["Drb"], x["k"]))
    q.update(Ae=x["a"] * np.exp(Gp), Re=x["r"] * np.exp(G), Bh=x["b"] * np.exp(GL_G),
             Kh=x["k"] * np.exp(GL_G), gam=np.exp(G[-1]))
    return q


def solve_lower(A, X):
    """(I - A) Y = X for strictly lower A: forward substitution (the kernels' right-looking
    solve, a chain of C steps)."""
    Y = np.array(X, copy=True)
    for t in range(len(Y)):
        Y[t] += A[t, :t] @ Y[:t]
    return Y


def solve_upper_t(A, X):
    """(I - A)^T Y = X for strictly lower A: back substitution, last token first."""
    Y = np.array(X, copy=True)
    for t in reversed(range(len(Y))):
        Y[t] += A[t + 1:, t] @ Y[t + 1:]
    return Y


# ---- forward: F1 local (all chunks), F2 walk, F3 outputs -------------------------------------

def forward_local(x):
    """F1. W = (I - Aab)^-1 Ae, Ul = (I - Aab)^-1 Aak V (so the sa rows are U = W S_e^T + Ul),
    Z = Re + Arb W, Yl = Arb Ul + Ark V, L = Ul^T Bh + V^T Kh. Saved for the backward: W, Z, Bh,
    gam (and F2's S_e)."""
    q = chunk_quantities(x)
    W = solve_lower(q["Aab"], q["Ae"])
    Ul = solve_lower(q["Aab"], q["Aak"] @ x["v"])
    return dict(W=W, Z=q["Re"] + q["Arb"] @ W, Yl=q["Arb"] @ Ul + q["Ark"] @ x["v"],
                L=Ul.T @ q["Bh"] + x["v"].T @ q["Kh"], Bh=q["Bh"], gam=q["gam"])


def forward_walk(f, S0):
    """F2. S_exit = S_e o gam + (S_e W^T) Bh + L, chunk after chunk; returns every S_e and S_T."""
    S_e, S = [], S0
    for fc in f:
        S_e.append(S)
        S = S * fc["gam"] + (S @ fc["W"].T) @ fc["Bh"] + fc["L"]
    return S_e, S


def forward_output(fc, S_e):
    """F3. Y = Z S_e^T + Yl."""
    return fc["Z"] @ S_e.T + fc["Yl"]


# ---- backward: B1 (all chunks, after a sequential forward), B2 walk (last chunk first), B3 ---

def backward_prep(fc, dY):
    """Ld = dY^T Z (N x N): the part of dS_e that does not depend on the walk (formed by B2's
    producer warps one chunk ahead)."""
    return dY.T @ fc["Z"]


def backward_walk(f, Ld, dST):
    """B2. dS_e = dS_x o gam + (dS_x Bh^T) W + Ld (the transpose of F2's map, in reverse):
    returns each chunk's exit-state gradient dS_x and dstate_in."""
    dS_x, dS = [None] * len(f), dST
    for c in reversed(range(len(f))):
        dS_x[c] = dS
        dS = dS * f[c]["gam"] + (dS @ f[c]["Bh"].T) @ f[c]["W"] + Ld[c]
    return dS_x, dS


def _pair_grads(dM, p, s, D):
    """M[t,s] = sum_j p_t s_s D[t,s,j] -> dp, ds (D held fixed: the decays are done apart)."""
    return np.einsum("ts,sj,tsj->tj", dM, s, D), np.einsum("ts,tj,tsj->sj", dM, p, D)


def decay_grad(x, q, dRe, dAe, dBh, dKh, dgam, dArb, dArk, dAab, dAak):
    """dL/d decay_u directly, as the sequential backward's sum_i dS_u S_{u-1} is: every term
    keeps its own decay products, so nothing is divided by d_u and nothing cancels (the cheaper
    route, dL/dg as suffix sums of per-token exponent gradients, subtracts terms that do not
    contain d_u: its error is absolute, ~eps x the chunk's largest term, and it would need a
    division for DIRECT). With X[t,u] = G_t - G_u (Drb[t,u] = e^X, Dab[t,u] = e^X[t-1,u]):
      Re_t, Ae_t (t >= u, t > u):  e^{G_{u-1}} F_u,   F_u = dRe_u r_u + dAe_{u+1} a_{u+1} + d_{u+1} F_{u+1}
      Bh_s, Kh_s (s < u):          e^{G_L-G_u} P_u,   P_{u+1} = d_u P_u + dBh_u b_u + dKh_u k_u
      gam:                         dgam e^{G_{u-1}} e^{G_L-G_u}
      Arb, Ark (s < u <= t):       sum_{t>=u} r_t e^{X[t,u]} Qr_u[t],  Qr_{u+1}[t] = d_u Qr_u[t] + dArb[t,u] b_u + dArk[t,u] k_u
      Aab, Aak (s < u < t):        sum_{t>u}  a_t e^{X[t-1,u]} Qa_u[t], Qa likewise from dAab, dAak.
    Walks over u (C steps) with C x N work in each; in a kernel a thread per column j."""
    r, k, a, b = x["r"], x["k"], x["a"], x["b"]
    C, N = r.shape
    d = np.exp(x["g"])
    eGp, eGL = np.exp(q["Gp"]), np.exp(q["GL_G"])
    F = np.zeros_like(r)
    for u in reversed(range(C)):
        F[u] = dRe[u] * r[u] + (dAe[u + 1] * a[u + 1] + d[u + 1] * F[u + 1] if u + 1 < C else 0.0)
    dd = eGp * F + dgam * eGp * eGL
    P, Qr, Qa = np.zeros_like(r[0]), np.zeros_like(r), np.zeros_like(r)
    for u in range(C):
        dd[u] += eGL[u] * P + np.einsum("tj,tj,tj->j", r[u:], q["Drb"][u:, u], Qr[u:]) \
            + np.einsum("tj,tj,tj->j", a[u + 1:], q["Dab"][u + 1:, u], Qa[u + 1:])
        P = d[u] * P + dBh[u] * b[u] + dKh[u] * k[u]
        Qr = d[u] * Qr + dArb[:, u, None] * b[u] + dArk[:, u, None] * k[u]
        Qa = d[u] * Qa + dAab[:, u, None] * b[u] + dAak[:, u, None] * k[u]
    return dd


def dlog_decay_suffix(x, q, d, dRe, dAe, dBh, dKh, dgam):
    """The cheap route (CLAMPW in the kernels): dL/dg_u as suffix sums of the per-token exponent
    gradients, all elementwise from the vector gradients (d = the pair parts dr, da, db, dk with
    the decays held fixed: sum_s of an exponent's gradient is p_t o dp_t on its t side and
    -s_s o ds_s on its s side). Terms wholly after u cancel in the suffix sum, so its error is
    absolute (~eps x the chunk's largest term): fine where decay >= 0.545 (CLAMPW), not for the
    elementwise exactness of tiny decays."""
    bh, kh = dBh * q["Bh"], dKh * q["Kh"]
    dG = x["r"] * d["r"] + dRe * q["Re"] - x["b"] * d["b"] - x["k"] * d["k"] - bh - kh
    dGp = x["a"] * d["a"] + dAe * q["Ae"]
    dG[-1] += bh.sum(0) + kh.sum(0) + dgam * q["gam"]
    suffix = lambda z: np.cumsum(z[::-1], 0)[::-1]
    return suffix(dG) + np.vstack([suffix(dGp)[1:], np.zeros_like(dGp[:1])])  # Gp_t holds g_u, u < t


def backward_local(x, dY, S_e, dS_x, route="exact"):
    """B3. The chunk's token gradients from its entry state S_e and exit-state gradient dS_x."""
    q = chunk_quantities(x)
    v = x["v"]
    C = len(v)
    U = solve_lower(q["Aab"], q["Ae"] @ S_e.T + q["Aak"] @ v)  # sa rows, recomputed
    dU = q["Arb"].T @ dY + q["Bh"] @ dS_x.T                     # U's own uses (Y, S_x)
    dX = solve_upper_t(q["Aab"], dU)                             # dL/d sa_t, all paths
    dV = q["Ark"].T @ dY + q["Aak"].T @ dX + q["Kh"] @ dS_x.T
    dRe, dAe = dY @ S_e, dX @ S_e
    dBh, dKh = U @ dS_x, v @ dS_x
    dgam = (S_e * dS_x).sum(0)
    le, lt = np.tril(np.ones((C, C), v.dtype)), np.tril(np.ones((C, C), v.dtype), -1)
    dArb, dArk, dAab, dAak = le * (dY @ U.T), le * (dY @ v.T), lt * (dX @ U.T), lt * (dX @ v.T)
    dr1, db1 = _pair_grads(dArb, x["r"], x["b"], q["Drb"])
    dr2, dk1 = _pair_grads(dArk, x["r"], x["k"], q["Drb"])
    da1, db2 = _pair_grads(dAab, x["a"], x["b"], q["Dab"])
    da2, dk2 = _pair_grads(dAak, x["a"], x["k"], q["Dab"])
    eL = np.exp(q["GL_G"])
    out = dict(dr=dr1 + dr2 + dRe * np.exp(q["G"]), da=da1 + da2 + dAe * np.exp(q["Gp"]),
               db=db1 + db2 + dBh * eL, dk=dk1 + dk2 + dKh * eL, dv=dV)
    if route == "exact":
        out["dd"] = decay_grad(x, q, dRe, dAe, dBh, dKh, dgam, dArb, dArk, dAab, dAak)
    else:
        pairs = dict(r=dr1 + dr2, a=da1 + da2, b=db1 + db2, k=dk1 + dk2)
        out["dg"] = dlog_decay_suffix(x, q, pairs, dRe, dAe, dBh, dKh, dgam)
    return out


# ---- one sequence and head, and the whole op ---------------------------------------------------

def _chunks(x, C):
    """Cut T tokens into chunks of C; the last one padded with identity tokens (g = 0 and zero
    vectors: decay 1, no update, no output)."""
    T, N = next(iter(x.values())).shape
    out = []
    for c0 in range(0, T, C):
        n = min(C, T - c0)
        out.append({k: np.vstack([a[c0:c0 + n], np.zeros((C - n, N), a.dtype)]) for k, a in x.items()})
    return out


def forward(x, S0, C):
    """F1-F3 for one (sequence, head); x has r g k v a b (T x N). Returns y, S_T and what the
    backward keeps: F1's W, Z, Bh, gam per chunk (f) and F2's entry states S_e."""
    xs = _chunks(x, C)
    f = [forward_local(xc) for xc in xs]                                   # F1
    S_e, S_T = forward_walk(f, S0)                                         # F2
    y = [forward_output(fc, s) for fc, s in zip(f, S_e)]                   # F3
    return (np.vstack(y)[:len(x["v"])] if y else np.zeros((0, len(S0)), S0.dtype)), S_T, f, S_e


def backward(x, dY, S_e, dST, C, f=None, route="exact"):
    """B1-B3 for one (sequence, head) from the chunks' entry states S_e: the chunked forward's, or
    a sequential forward's checkpoints every C tokens, in which case f is None and B1 recomputes
    W, Z, Bh, gam (F1's first half; this spec runs all of F1). Returns the token gradients (dd:
    w.r.t. the decay; dg: w.r.t. its log, on the "log" route) and dS0."""
    T, N = x["v"].shape
    xs, dYs = _chunks(x, C), [d["dy"] for d in _chunks({"dy": dY}, C)]
    f = [forward_local(xc) for xc in xs] if f is None else f              # B1
    Ld = [backward_prep(fc, d) for fc, d in zip(f, dYs)]                   # B2's producer warps
    dS_x, dS0 = backward_walk(f, Ld, dST)                                  # B2
    gs = [backward_local(xc, d, s, ds, route) for xc, d, s, ds in zip(xs, dYs, S_e, dS_x)]  # B3
    names = ("dr", "dk", "dv", "da", "db", "dd" if route == "exact" else "dg")
    return {k: (np.vstack([gc[k] for gc in gs])[:T] if gs else np.zeros((0, N), dST.dtype)) for k in names}, dS0


def rwkv7_chunked(r, w, k, v, a, b, dy, s0=None, dsT=None, form="clampw", C=32, seq_offsets=None,
                  route="exact", dtype=np.float64):
    """The op with the reference's interface (reference.rwkv7_forward + rwkv7_backward): [B,T,H,N]
    inputs, packed sequences by seq_offsets (B = 1). Returns y, sT and dr dw dk dv da db ds0.
    route: the decay gradient, "exact" (decay_grad) or "log" (dlog_decay_suffix). dtype: float64
    for the spec; float32 (or an array type that rounds its products) models a kernel's rounding."""
    r, w, k, v, a, b, dy = (np.asanyarray(t).astype(dtype) for t in (r, w, k, v, a, b, dy))
    B, T, H, N = v.shape
    g = log_decay(w, form)
    segs = [(bi, 0, T) for bi in range(B)] if seq_offsets is None else \
        [(0, seq_offsets[i], seq_offsets[i + 1]) for i in range(len(seq_offsets) - 1)]
    zeros = np.zeros((len(segs), H, N, N), dtype)
    s0 = zeros if s0 is None else np.asanyarray(s0).astype(dtype)
    dsT = zeros if dsT is None else np.asanyarray(dsT).astype(dtype)
    y, sT, ds0 = np.zeros((B, T, H, N), dtype), np.zeros_like(zeros), np.zeros_like(zeros)
    dname = "dd" if route == "exact" else "dg"
    scale = ddecay_dw(w, form) if route == "exact" else dlog_decay_dw(w, form)
    out = {n: np.zeros((B, T, H, N), dtype) for n in ("dr", "dk", "dv", "da", "db", dname)}
    for si, (bi, t0, t1) in enumerate(segs):
        for h in range(H):
            x = {n: t[bi, t0:t1, h] for n, t in dict(r=r, g=g, k=k, v=v, a=a, b=b).items()}
            y[bi, t0:t1, h], sT[si, h], f, S_e = forward(x, s0[si, h], C)
            gr, ds0[si, h] = backward(x, dy[bi, t0:t1, h], S_e, dsT[si, h], C, f, route)
            for n in out:
                out[n][bi, t0:t1, h] = gr[n]
    out["dw"] = out.pop(dname) * scale
    out["ds0"] = ds0
    return y, sT, out
