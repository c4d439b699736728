"""The forward's fast path (wkv/_fast.py: contiguous host arrays through a cached descriptor)
gives exactly what the general path gives, is taken where it should be, and leaves every error
to the library's message."""

from __future__ import annotations

import numpy as np
import pytest

import wkv
import wkv._fast as fast
import reference as ref

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - test extra
    ml_dtypes = None


def general_only(monkeypatch):
    monkeypatch.setattr(fast, "forward", lambda *a, **k: None)


def run_both(monkeypatch, call):
    fast._PLANS.clear()
    got = call()
    assert fast._PLANS, "the fast path was not taken"
    with monkeypatch.context() as m:
        general_only(m)
        want = call()
    return got, want


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("with_state", [False, True])
def test_numpy_fast_path_equals_the_general_path(rng, monkeypatch, dtype, with_state):
    if dtype == "bfloat16" and ml_dtypes is None:
        pytest.skip("ml_dtypes is not installed")
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    x = {n: a.astype(dt) for n, a in ref.random_inputs(rng, 2, 5, 3, 16).items()}
    s0 = rng.standard_normal((2, 3, 16, 16)).astype(np.float32) if with_state else None
    got, want = run_both(monkeypatch, lambda: wkv.rwkv7(*x.values(), s0))
    assert got.y.dtype == dt and got.state.dtype == np.float32
    np.testing.assert_array_equal(got.y.astype(np.float32), want.y.astype(np.float32))
    np.testing.assert_array_equal(got.state, want.state)


def test_numpy_fast_path_in_place_and_out(rng, monkeypatch):
    x = ref.random_inputs(rng, 1, 1, 4, 32)
    s0 = rng.standard_normal((1, 4, 32, 32)).astype(np.float32)

    def step():
        s = s0.copy()
        y = np.full_like(x["v"], np.nan)
        res = wkv.rwkv7(*x.values(), s, out=y, state_out=s)
        assert res.y is y and res.state is s
        return y, s

    (y1, s1), (y2, s2) = run_both(monkeypatch, step)
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(s1, s2)
    assert np.isfinite(y1).all()


@pytest.mark.parametrize("op", ["rwkv6", "rwkv4"])
def test_other_ops_take_it_too(rng, monkeypatch, op):
    if op == "rwkv6":
        x = ref.random_inputs(rng, 2, 6, 2, 8, "exp_neg_exp")
        args = [x[n] for n in ("r", "w", "k", "v")] + [rng.standard_normal((2, 8)).astype(np.float32) * 0.3]
        call = lambda: wkv.rwkv6(*args)  # noqa: E731
    else:
        C = 12
        args = [rng.standard_normal(C).astype(np.float32) * 0.5 - 1, rng.standard_normal(C).astype(np.float32),
                rng.standard_normal((2, 7, C)).astype(np.float32), rng.standard_normal((2, 7, C)).astype(np.float32)]
        call = lambda: wkv.rwkv4(*args)  # noqa: E731
    got, want = run_both(monkeypatch, call)
    np.testing.assert_array_equal(got.y, want.y)
    np.testing.assert_array_equal(got.state, want.state)


def test_what_the_fast_path_leaves_to_the_general_one(rng):
    x = ref.random_inputs(rng, 1, 4, 2, 8)
    fast._PLANS.clear()
    strided = {n: np.asfortranarray(a) for n, a in x.items()}
    wkv.rwkv7(*strided.values())
    mixed = dict(x, r=x["r"].astype(np.float16))
    wkv.rwkv7(*mixed.values())
    wkv.rwkv7(*x.values(), seq_offsets=[0, 4])
    assert not fast._PLANS  # none of these went through it


def test_errors_through_the_fast_path_name_the_argument(rng):
    x = ref.random_inputs(rng, 1, 4, 2, 8)
    bad = dict(x, k=x["k"][:, :3].copy())  # contiguous, wrong T
    with pytest.raises(wkv.ShapeError, match=r"\bk\b"):
        wkv.rwkv7(*bad.values())
    s = np.zeros((1, 2, 8, 8), np.float32)
    with pytest.raises(wkv.AliasingError):
        wkv.rwkv7(*x.values(), s, out=s.reshape(-1)[:64].reshape(1, 4, 2, 8))


def test_torch_fast_path_equals_the_general_path(rng, monkeypatch):
    torch = pytest.importorskip("torch")
    x = {n: torch.tensor(a) for n, a in ref.random_inputs(rng, 2, 3, 2, 16).items()}
    s0 = torch.randn(2, 2, 16, 16)
    with torch.no_grad():
        got, want = run_both(monkeypatch, lambda: wkv.rwkv7(*x.values(), s0))
    assert isinstance(got.y, torch.Tensor) and got.y.dtype == torch.float32
    assert torch.equal(got.y, want.y) and torch.equal(got.state, want.state)
    xb = {n: t.to(torch.bfloat16) for n, t in x.items()}
    got, want = run_both(monkeypatch, lambda: wkv.rwkv7(*xb.values(), s0))
    assert got.y.dtype == torch.bfloat16 and torch.equal(got.y, want.y)
