"""A float64 numpy reference of RWKV-7 forward and backward (the recurrence of wkv.h),
written independently of libwkv for the tests.

State S[b, h, i, j]: i = value channel, j = key channel. Per token t::

    sa[i]   = sum_l S[i, l] * a_t[l]                     (S before the update)
    S[i, j] = S[i, j] * decay_t[j] + sa[i] * b_t[j] + v_t[i] * k_t[j]
    y_t[i]  = sum_j S[i, j] * r_t[j]                     (S after the update)

The backward is plain back-propagation through time of the scalar
L = sum(y * dy) + sum(S_T * dS_T).
"""

from __future__ import annotations

import numpy as np

_C = np.exp(-0.5)


def decay_of(w: np.ndarray, form: str) -> np.ndarray:
    w = np.asarray(w, np.float64)
    if form == "direct":
        return w
    if form == "log":
        return np.exp(w)
    if form == "exp_neg_exp":
        return np.exp(-np.exp(w))
    if form == "clampw":
        return np.exp(-_C / (1.0 + np.exp(-w)))
    raise ValueError(form)


def ddecay_dw(w: np.ndarray, form: str) -> np.ndarray:
    w = np.asarray(w, np.float64)
    d = decay_of(w, form)
    if form == "direct":
        return np.ones_like(w)
    if form == "log":
        return d
    if form == "exp_neg_exp":
        return -np.exp(w) * d
    if form == "clampw":
        s = 1.0 / (1.0 + np.exp(-w))
        return d * (-_C * s * (1.0 - s))
    raise ValueError(form)


def _f64(*xs):
    return [np.asarray(x, np.float64) for x in xs]


def rwkv7_forward(r, w, k, v, a, b, s0=None, form="clampw", seq_offsets=None):
    """Returns (y [B,T,H,N], sT [S,H,N,N]); all float64."""
    r, w, k, v, a, b = _f64(r, w, k, v, a, b)
    B, T, H, N = v.shape
    dec = decay_of(w, form)
    segs = _segments(B, T, seq_offsets)
    S_slots = len(segs)
    S_all = np.zeros((S_slots, H, N, N)) if s0 is None else np.array(s0, np.float64, copy=True)
    y = np.zeros((B, T, H, N))
    for slot, (bi, t0, t1) in enumerate(segs):
        S = S_all[slot]
        for t in range(t0, t1):
            sa = np.einsum("hil,hl->hi", S, a[bi, t])
            S = S * dec[bi, t][:, None, :] + sa[:, :, None] * b[bi, t][:, None, :] + \
                v[bi, t][:, :, None] * k[bi, t][:, None, :]
            y[bi, t] = np.einsum("hij,hj->hi", S, r[bi, t])
        S_all[slot] = S
    return y, S_all


def _segments(B, T, seq_offsets):
    if seq_offsets is None:
        return [(bi, 0, T) for bi in range(B)]
    off = list(seq_offsets)
    return [(0, off[s], off[s + 1]) for s in range(len(off) - 1)]


def rwkv7_backward(r, w, k, v, a, b, dy, s0=None, dsT=None, form="clampw", seq_offsets=None):
    """Returns dict dr dw dk dv da db ds0 (float64) of L = sum(y*dy) + sum(sT*dsT)."""
    r, w, k, v, a, b, dy = _f64(r, w, k, v, a, b, dy)
    B, T, H, N = v.shape
    dec = decay_of(w, form)
    segs = _segments(B, T, seq_offsets)
    S0 = np.zeros((len(segs), H, N, N)) if s0 is None else np.asarray(s0, np.float64)
    g = {n: np.zeros((B, T, H, N)) for n in ("dr", "ddecay", "dk", "dv", "da", "db")}
    ds0 = np.zeros_like(S0)
    for slot, (bi, t0, t1) in enumerate(segs):
        # forward, keeping every state
        states = [S0[slot]]
        sas = []
        S = S0[slot]
        for t in range(t0, t1):
            sa = np.einsum("hil,hl->hi", S, a[bi, t])
            sas.append(sa)
            S = S * dec[bi, t][:, None, :] + sa[:, :, None] * b[bi, t][:, None, :] + \
                v[bi, t][:, :, None] * k[bi, t][:, None, :]
            states.append(S)
        dS = np.zeros((H, N, N)) if dsT is None else np.array(dsT[slot], np.float64)
        for idx in range(t1 - t0 - 1, -1, -1):
            t = t0 + idx
            S_new, S_old, sa = states[idx + 1], states[idx], sas[idx]
            g["dr"][bi, t] = np.einsum("hij,hi->hj", S_new, dy[bi, t])
            dS = dS + dy[bi, t][:, :, None] * r[bi, t][:, None, :]
            g["dv"][bi, t] = np.einsum("hij,hj->hi", dS, k[bi, t])
            g["dk"][bi, t] = np.einsum("hij,hi->hj", dS, v[bi, t])
            dsa = np.einsum("hij,hj->hi", dS, b[bi, t])
            g["db"][bi, t] = np.einsum("hij,hi->hj", dS, sa)
            g["ddecay"][bi, t] = np.einsum("hij,hij->hj", dS, S_old)
            g["da"][bi, t] = np.einsum("hi,hil->hl", dsa, S_old)
            dS = dS * dec[bi, t][:, None, :] + dsa[:, :, None] * a[bi, t][:, None, :]
        ds0[slot] = dS
    out = {n: g[n] for n in ("dr", "dk", "dv", "da", "db")}
    out["dw"] = g["ddecay"] * ddecay_dw(w, form)
    out["ds0"] = ds0
    return out


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64 (inf on NaN)."""
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf")
    den = np.linalg.norm(ref.ravel())
    num = np.linalg.norm((out - ref).ravel())
    return float(num / den) if den > 0 else float(num)


def random_inputs(rng, B, T, H, N, form="clampw", dtype=np.float32):
    """RWKV-7-like inputs: a = -kk, b = kk * iclr with kk L2-normalised per head."""
    r = rng.standard_normal((B, T, H, N)) * 0.5
    k = rng.standard_normal((B, T, H, N)) * 0.5
    v = rng.standard_normal((B, T, H, N)) * 0.5
    kk = rng.standard_normal((B, T, H, N))
    kk /= np.linalg.norm(kk, axis=-1, keepdims=True)
    iclr = 1.0 / (1.0 + np.exp(-(1.5 * rng.standard_normal((B, T, H, N)) - 0.2)))
    a, b = -kk, kk * iclr
    z = rng.standard_normal((B, T, H, N)) + np.linspace(-5, 3, N)
    dec = np.exp(-_C / (1.0 + np.exp(-z)))
    w = {"clampw": z, "direct": dec, "log": np.log(dec), "exp_neg_exp": np.log(-np.log(dec))}[form]
    return {n: x.astype(dtype) for n, x in dict(r=r, w=w, k=k, v=v, a=a, b=b).items()}
