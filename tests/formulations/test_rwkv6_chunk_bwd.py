"""The chunked RWKV-6 design (rwkv6_chunk_bwd.py) against the wkv6 golden files (float64, third
party) and against a sequential float64 back-propagation written here, with tails, states and
decays down to 1e-6 (each tiny decay's gradient exact elementwise)."""

import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "bindings" / "python" / "tests"))

import reference as ref  # noqa: E402
import rwkv6_chunk_bwd as c6  # noqa: E402
from test_rwkv7_chunk_bwd import load_golden  # noqa: E402

GRADS = ("dr", "dw", "dk", "dv", "du", "ds0")


def sequential(r, w, k, v, u, dy, s0, dsT, form):
    """y_t = (S_{t-1} + v_t (u o k_t)^T) r_t, S_t = S_{t-1} diag(d_t) + v_t k_t^T, and plain
    back-propagation through time (dd_t = sum_i dS_t S_{t-1}, as the sequential kernels)."""
    B, T, H, N = v.shape
    d = ref.decay_of(w, form)
    y, sT = np.zeros((B, T, H, N)), np.zeros_like(s0)
    g = {n: np.zeros((B, T, H, N)) for n in ("dr", "dk", "dv", "dd")}
    du, ds0 = np.zeros((H, N)), np.zeros_like(s0)
    for bi in range(B):
        for h in range(H):
            S = [s0[bi, h]]
            for t in range(T):
                y[bi, t, h] = S[-1] @ r[bi, t, h] + v[bi, t, h] * (u[h] * k[bi, t, h] * r[bi, t, h]).sum()
                S.append(S[-1] * d[bi, t, h] + np.outer(v[bi, t, h], k[bi, t, h]))
            sT[bi, h] = S[-1]
            dS = dsT[bi, h]
            for t in reversed(range(T)):
                rt, kt, vt, dyt = r[bi, t, h], k[bi, t, h], v[bi, t, h], dy[bi, t, h]
                g["dv"][bi, t, h] = dS @ kt + dyt * (u[h] * kt * rt).sum()
                g["dk"][bi, t, h] = dS.T @ vt + u[h] * rt * (vt @ dyt)
                g["dr"][bi, t, h] = S[t].T @ dyt + u[h] * kt * (vt @ dyt)
                g["dd"][bi, t, h] = (dS * S[t]).sum(0)
                du[h] += rt * kt * (vt @ dyt)
                dS = dS * d[bi, t, h] + np.outer(dyt, rt)
            ds0[bi, h] = dS
    g["dw"] = g.pop("dd") * ref.ddecay_dw(w, form)
    g.update(du=du, ds0=ds0)
    return y, sT, g


@pytest.mark.parametrize("C", [32, 16, 5])
@pytest.mark.parametrize("path", sorted((HERE.parents[1] / "tests" / "golden").glob("wkv6_*.safetensors")),
                         ids=lambda p: p.stem)
def test_golden(path, C):
    meta, g = load_golden(path)
    y, sT, out = c6.rwkv6_chunked(*(g[n] for n in "rwkvu"), g["dy"], g["s0"], g["dsT"], meta["decay_form"], C)
    errs = {"y": ref.rel_err(y, g["y"]), "sT": ref.rel_err(sT, g["sT"])}
    errs.update({n: ref.rel_err(out[n], g[n]) for n in GRADS})
    assert max(errs.values()) < 1e-10, errs


@pytest.mark.parametrize("form", ["exp_neg_exp", "log", "direct"])
@pytest.mark.parametrize("T,tiny", [(1, False), (32, False), (33, False), (70, True)])
def test_matches_sequential(form, T, tiny):
    rng = np.random.default_rng(30 + T)
    B, H, N = 1, 2, 8
    x = ref.random_inputs(rng, B, T, H, N, form, np.float64)
    d = ref.decay_of(x["w"], form)
    if tiny:
        d[:, :T // 2] = np.where(rng.random(d[:, :T // 2].shape) < 0.7, 1e-6, d[:, :T // 2])
    w = {"log": np.log, "exp_neg_exp": lambda z: np.log(-np.log(z)), "direct": lambda z: z}[form](d)
    u = rng.standard_normal((H, N))
    s0, dsT = rng.standard_normal((2, B, H, N, N))
    dy = rng.standard_normal((B, T, H, N))
    args = (x["r"], w, x["k"], x["v"], u, dy, s0, dsT, form)
    y0, sT0, g0 = sequential(*args)
    y, sT, g = c6.rwkv6_chunked(*args, C=32)
    errs = {"y": ref.rel_err(y, y0), "sT": ref.rel_err(sT, sT0)}
    errs.update({n: ref.rel_err(g[n], g0[n]) for n in GRADS})
    assert max(errs.values()) < 1e-10, errs
    small = d < 1e-4
    if small.any():
        assert np.max(np.abs(g["dw"][small] - g0["dw"][small]) / np.abs(g0["dw"][small])) < 1e-11
