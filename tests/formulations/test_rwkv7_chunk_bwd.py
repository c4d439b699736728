"""The chunked RWKV-7 design (rwkv7_chunk_bwd.py) against the sequential float64 reference of the
Python tests (bindings/python/tests/reference.py): outputs, final state and every gradient to
1e-10 relative (measured ~1e-15), for every decay form, tails (T not a multiple of C), chunk
lengths 32, 16 and 5, states in and out, packed sequences, and decays down to 1e-6 and 0.
Also the golden files (float64 gradients from third-party code). Fixed seeds: this is a spec, not
a fuzzer. Needs only numpy (no libwkv)."""

import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "bindings" / "python" / "tests"))

import reference as ref  # noqa: E402
import rwkv7_chunk_bwd as cb  # noqa: E402

FORMS = ("clampw", "log", "exp_neg_exp", "direct")
GRADS = ("dr", "dw", "dk", "dv", "da", "db", "ds0")


def case(seed, B, T, H, N, form, tiny=False, packed=None):
    rng = np.random.default_rng(seed)
    x = ref.random_inputs(rng, B, T, H, N, form, np.float64)
    if tiny:  # decays of 1e-6 on most channels of the first half, then ordinary ones
        d = ref.decay_of(x["w"], form)
        d[:, :T // 2] = np.where(rng.random(d[:, :T // 2].shape) < 0.7, 1e-6, d[:, :T // 2])
        if form == "direct" and T > 3:
            d[:, 2, :, :2] = 0.0  # exact zeros: log = -inf
        x["w"] = {"log": np.log, "exp_neg_exp": lambda z: np.log(-np.log(z)), "direct": lambda z: z}[form](d)
    S = B if packed is None else len(packed) - 1
    s0, dsT = rng.standard_normal((2, S, H, N, N))
    dy = rng.standard_normal((B, T, H, N))
    return x, dict(dy=dy, s0=s0, dsT=dsT, form=form, seq_offsets=packed)


def check(x, kw, C, tol=1e-10):
    y0, sT0 = ref.rwkv7_forward(**x, s0=kw["s0"], form=kw["form"], seq_offsets=kw["seq_offsets"])
    g0 = ref.rwkv7_backward(**x, **kw)
    y, sT, g = cb.rwkv7_chunked(**x, **kw, C=C)
    errs = {"y": ref.rel_err(y, y0), "sT": ref.rel_err(sT, sT0)}
    errs.update({n: ref.rel_err(g[n], g0[n]) for n in GRADS})
    assert max(errs.values()) < tol, errs
    return g, g0


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("T", [1, 31, 32, 33, 100])
def test_matches_sequential(form, T):
    x, kw = case(10 + T, 2, T, 2, 8, form)
    check(x, kw, C=32)


@pytest.mark.parametrize("C", [16, 5])
def test_other_chunk_lengths(C):
    x, kw = case(7, 1, 37, 2, 8, "clampw")
    check(x, kw, C=C)


@pytest.mark.parametrize("form", ["log", "exp_neg_exp", "direct"])
@pytest.mark.parametrize("T", [33, 100])
def test_small_decays_stay_exact(form, T):
    """Not only the tensor's norm: the gradient of each tiny decay (itself ~1e-10) is exact to
    1e-11 relative elementwise, because decay_grad never subtracts terms nor divides."""
    x, kw = case(20 + T, 1, T, 2, 8, form, tiny=True)
    g, g0 = check(x, kw, C=32)
    tiny = ref.decay_of(x["w"], form) < 1e-4
    assert np.all(np.isfinite(g["dw"]))
    assert np.max(np.abs(g["dw"][tiny] - g0["dw"][tiny]) / np.abs(g0["dw"][tiny])) < 1e-11


def test_packed_sequences_and_empty_one():
    x, kw = case(5, 1, 106, 2, 8, "clampw", packed=[0, 0, 1, 33, 65, 106])
    check(x, kw, C=32)


def test_no_state_in_or_gradient_out():
    x, kw = case(6, 1, 40, 1, 8, "log")
    kw.update(s0=None, dsT=None)
    check(x, kw, C=32)


def test_head_size_64():
    x, kw = case(8, 1, 40, 1, 64, "clampw")
    check(x, kw, C=32)


@pytest.mark.parametrize("form", ["clampw", "log"])
def test_log_space_decay_route(form):
    """The cheaper decay gradient (suffix sums of exponent gradients) the CLAMPW kernels use."""
    x, kw = case(9, 2, 100, 2, 8, form)
    y0, sT0 = ref.rwkv7_forward(**x, s0=kw["s0"], form=form)
    g0 = ref.rwkv7_backward(**x, **kw)
    _, _, g = cb.rwkv7_chunked(**x, **kw, C=32, route="log")
    assert max(ref.rel_err(g[n], g0[n]) for n in GRADS) < 1e-10
    x, kw = case(9, 1, 5, 1, 8, "direct")
    with pytest.raises(ValueError):  # DIRECT would need dL/dg / decay
        cb.rwkv7_chunked(**x, **kw, route="log")


def test_backward_from_sequential_checkpoints():
    """The training path after the sequential forward: S_e are that forward's states every C
    tokens (here the reference's), B1 recomputes W, Z, Bh, gam (f=None)."""
    x, kw = case(11, 1, 70, 1, 8, "clampw")
    g0 = ref.rwkv7_backward(**x, **kw)
    C, dec = 32, ref.decay_of(x["w"], "clampw")[0, :, 0]
    S, S_e = kw["s0"][0, 0].copy(), []
    for t in range(70):  # the sequential recurrence, keeping the state at each chunk start
        if t % C == 0:
            S_e.append(S.copy())
        a, b, k, v = (x[n][0, t, 0] for n in "abkv")
        S = S * dec[t] + np.outer(S @ a, b) + np.outer(v, k)
    xs = {n: np.asarray(x[n][0, :, 0], np.float64) for n in "rkvab"}
    xs["g"] = cb.log_decay(np.asarray(x["w"][0, :, 0], np.float64), "clampw")
    g, ds0 = cb.backward(xs, kw["dy"][0, :, 0], S_e, kw["dsT"][0, 0], C)
    assert ref.rel_err(ds0, g0["ds0"][0, 0]) < 1e-10
    for n in ("dr", "dk", "dv", "da", "db"):
        assert ref.rel_err(g[n], g0[n][0, :, 0]) < 1e-10, n
    assert ref.rel_err(g["dd"] * cb.ddecay_dw(x["w"][0, :, 0], "clampw"), g0["dw"][0, :, 0]) < 1e-10


def load_golden(path):
    """tests/golden/README.md's reader: metadata and name -> array."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    meta = hdr.pop("__metadata__", {})
    dt = {"F32": np.float32, "F64": np.float64}
    return meta, {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]],
                                   dtype=dt[v["dtype"]]).reshape(v["shape"]) for k, v in hdr.items()}


@pytest.mark.parametrize("path", sorted((HERE.parents[1] / "tests" / "golden").glob("wkv7_*.safetensors")),
                         ids=lambda p: p.stem)
def test_golden(path):
    meta, g = load_golden(path)
    ins = {n: g[n] for n in "rwkvab"}
    y, sT, out = cb.rwkv7_chunked(**ins, dy=g["dy"], s0=g["s0"], dsT=g["dsT"], form=meta["decay_form"], C=16)
    errs = {"y": ref.rel_err(y, g["y"]), "sT": ref.rel_err(sT, g["sT"])}
    errs.update({n: ref.rel_err(out[n], g[n]) for n in GRADS})
    assert max(errs.values()) < 1e-10, errs
