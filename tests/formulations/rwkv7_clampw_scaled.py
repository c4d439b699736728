"""RWKV-7 forward, CLAMPW decays, in the scaled form: a float32 numpy model of a planned CPU kernel
(backends/cpu/DESIGN.md, RWKV-7 forward: the scaled CLAMPW form), checked against the float64
reference by test_rwkv7_clampw_scaled.py.

The sequential forward spends five vector operations per state element and token: sa = S a (one
FMA), S <- S diag(d) + sa b^T + v k^T (a multiply and two FMAs), y = S r (one FMA). Within a block
of C tokens keep S' = S diag(1 / P) instead, P_t = d_{t0} ... d_t the block's running product of
decays per key column; then
    sa_t = S'_{t-1} (P_{t-1} o a_t),   S'_t = S'_{t-1} + sa_t (b_t / P_t)^T + v_t (k_t / P_t)^T,
    y_t  = S'_t (P_t o r_t),           and S = S' diag(P) at the end of the block:
four FMAs per element and token, the per-token vectors (N operations each) aside. S' grows by up to
1 / P over a block; CLAMPW decays are >= exp(-e^-0.5) = 0.545, so 1 / P <= 0.545^-C (128 at C = 8),
far inside float32's range, and every product keeps float32's relative rounding. Other decay
forms (decays down to 1e-6 or 0) must keep the sequential form.
"""

from __future__ import annotations

import numpy as np

_C = float(np.exp(-0.5))


def clampw_decay(w, dtype):
    return np.exp(-_C / (1.0 + np.exp(-w.astype(dtype)))).astype(dtype)


def forward_sequential(r, w, k, v, a, b, s0, dtype=np.float32):
    """The library's order of operations per token, in dtype: returns (y [B,T,H,N], sT [B,H,N,N])."""
    r, k, v, a, b = (x.astype(dtype) for x in (r, k, v, a, b))
    d = clampw_decay(w, dtype)
    B, T, H, N = v.shape
    y = np.zeros((B, T, H, N), dtype)
    S = s0.astype(dtype).copy()
    for t in range(T):
        sa = np.einsum("bhij,bhj->bhi", S, a[:, t])
        S = S * d[:, t, :, None, :] + sa[..., None] * b[:, t, :, None, :] + v[:, t, :, :, None] * k[:, t, :, None, :]
        y[:, t] = np.einsum("bhij,bhj->bhi", S, r[:, t])
    return y, S


def forward_scaled(r, w, k, v, a, b, s0, C, dtype=np.float32):
    """The scaled form in blocks of C tokens (a tail block shorter), in dtype."""
    r, k, v, a, b = (x.astype(dtype) for x in (r, k, v, a, b))
    d = clampw_decay(w, dtype)
    B, T, H, N = v.shape
    y = np.zeros((B, T, H, N), dtype)
    S = s0.astype(dtype).copy()
    for t0 in range(0, T, C):
        Sp = S  # S' = S diag(1 / P) with P = 1 at the block's start
        P = np.ones((B, H, N), dtype)
        for t in range(t0, min(T, t0 + C)):
            sa = np.einsum("bhij,bhj->bhi", Sp, P * a[:, t])
            P = P * d[:, t]
            invP = (1.0 / P).astype(dtype)
            Sp = Sp + sa[..., None] * (b[:, t] * invP)[:, :, None, :] + v[:, t, :, :, None] * (k[:, t] * invP)[:, :, None, :]
            y[:, t] = np.einsum("bhij,bhj->bhi", Sp, P * r[:, t])
        S = Sp * P[:, :, None, :]
    return y, S
