"""Why the RWKV-7 backward replays instead of stepping back: a float32 numpy model of both ways of
getting the states S_{t-1} a backward needs, checked against the float64 reference by
test_rwkv7_inverse_step.py (backends/cuda/DESIGN.md, "The training step against BlinkDL's kernel").

The B = 8 training anchor's backward keeps no replay: its forward saves the state every K = 16
tokens and sa_t = S_{t-1} a_t for every token, and its backward walks each K tokens back from the
saved state by the inverse step
    S_{t-1} = (S_t - v_t k_t^T - sa_t b_t^T) diag(1 / d_t),
one reciprocal of the decay per token and key column. libwkv's backward instead replays each
segment forward from a saved checkpoint, so every state it uses is the forward's own float32
recurrence, whatever the decays. The inverse step multiplies the rounding of S_t by 1 / d_t at
every step back: nothing where the decays are ~1, up to 1.83x per token at CLAMPW's floor
(e^-0.6065 = 0.545). This module computes a float32 backward from either set of states, with the
reference's formulas in the library's order of sums, so the test can compare their errors.
"""

from __future__ import annotations

import numpy as np


def forward_states(k, v, a, b, s0, decay, dtype=np.float32):
    """The float32 forward: the states S_0 .. S_T (S_0 = s0) and sa_1 .. sa_T."""
    k, v, a, b = (x.astype(dtype) for x in (k, v, a, b))
    d = decay.astype(dtype)
    T = v.shape[1]
    S = s0.astype(dtype).copy()
    states, sas = [S], []
    for t in range(T):
        sa = np.einsum("bhij,bhj->bhi", S, a[:, t])
        sas.append(sa)
        S = S * d[:, t, :, None, :] + sa[..., None] * b[:, t, :, None, :] + v[:, t, :, :, None] * k[:, t, :, None, :]
        states.append(S.astype(dtype))
    return states, sas


def inverse_states(k, v, b, states, sas, decay, K=16, dtype=np.float32):
    """The states as the inverse step rebuilds them: the saved ones every K tokens (and the last),
    the others stepped back from the next saved one with sa saved by the forward."""
    k, v, b = (x.astype(dtype) for x in (k, v, b))
    d = decay.astype(dtype)
    T = len(sas)
    out = list(states)
    for c0 in range(0, T, K):
        c1 = min(T, c0 + K)
        S = states[c1]
        for t in range(c1 - 1, c0, -1):  # S_{c0} is saved
            inv = (1.0 / d[:, t]).astype(dtype)
            S = ((S - v[:, t, :, :, None] * k[:, t, :, None, :] - sas[t][..., None] * b[:, t, :, None, :])
                 * inv[:, :, None, :]).astype(dtype)
            out[t] = S
    return out


def backward(r, a, b, dy, states, sas, decay, dtype=np.float32):
    """A float32 backward (no state gradients in or out) from the given states: dr, the gradient
    with respect to the decay, da (the reference's formulas; the others need no state)."""
    r, a, b, dy = (x.astype(dtype) for x in (r, a, b, dy))
    d = decay.astype(dtype)
    B, T, H, N = r.shape
    g = {n: np.zeros((B, T, H, N), dtype) for n in ("dr", "ddecay", "da")}
    dS = np.zeros((B, H, N, N), dtype)
    for t in range(T - 1, -1, -1):
        S_new, S_old, sa = states[t + 1], states[t], sas[t]
        g["dr"][:, t] = np.einsum("bhij,bhi->bhj", S_new, dy[:, t])
        dS = dS + dy[:, t][..., None] * r[:, t][:, :, None, :]
        dsa = np.einsum("bhij,bhj->bhi", dS, b[:, t])
        g["ddecay"][:, t] = np.einsum("bhij,bhij->bhj", dS, S_old)
        g["da"][:, t] = np.einsum("bhi,bhil->bhl", dsa, S_old)
        dS = (dS * d[:, t][:, :, None, :] + dsa[..., None] * a[:, t][:, :, None, :]).astype(dtype)
    return g
