"""The scaled CLAMPW forward (rwkv7_clampw_scaled.py) in float32 against the float64 reference of the
Python tests (bindings/python/tests/reference.py): its error must stay within 1.5x of the
sequential float32 recurrence's own error (the library's order), for block lengths 4 to 32,
tails, and the decays' extremes. Fixed seeds: a spec, not a fuzzer. Needs only numpy."""

import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "bindings" / "python" / "tests"))

import reference as ref  # noqa: E402
import rwkv7_clampw_scaled as sc  # noqa: E402


def case(seed, B, T, H, N, extreme=None):
    rng = np.random.default_rng(seed)
    x = ref.random_inputs(rng, B, T, H, N, "clampw", np.float64)
    if extreme == "smallest":  # every decay at its floor, 0.545: 1 / P largest
        x["w"] = np.full_like(x["w"], 30.0)
    elif extreme == "one":  # decays ~1: P stays ~1
        x["w"] = np.full_like(x["w"], -30.0)
    s0 = 0.1 * rng.standard_normal((B, H, N, N))
    return x, s0


@pytest.mark.parametrize("C", [4, 8, 16, 32])
@pytest.mark.parametrize("extreme", [None, "smallest", "one"])
def test_scaled_matches_reference(C, extreme):
    x, s0 = case(7, 2, 77, 2, 32, extreme)
    y64, s64 = ref.rwkv7_forward(**x, s0=s0, form="clampw")
    y32, s32 = sc.forward_sequential(**x, s0=s0)
    ys, ss = sc.forward_scaled(**x, s0=s0, C=C)
    e_seq = max(ref.rel_err(y32, y64), ref.rel_err(s32, s64))
    e_sc = max(ref.rel_err(ys, y64), ref.rel_err(ss, s64))
    assert np.all(np.isfinite(ys)) and np.all(np.isfinite(ss))
    assert e_seq < 1e-6
    assert e_sc <= 1.5 * e_seq + 1e-7, (e_sc, e_seq)


def test_the_check_can_fail():
    """The tolerance above catches a real error: one key column's decays off by 1e-4 in one block."""
    x, s0 = case(3, 1, 40, 1, 16)
    y64, s64 = ref.rwkv7_forward(**x, s0=s0, form="clampw")
    y32, s32 = sc.forward_sequential(**x, s0=s0)
    e_seq = max(ref.rel_err(y32, y64), ref.rel_err(s32, s64))
    w = x["w"].copy()
    w[0, 8:16, 0, 3] += 1e-3  # clampw: d (w) moves by ~1e-4 relative
    ys, ss = sc.forward_scaled(x["r"], w, x["k"], x["v"], x["a"], x["b"], s0, C=8)
    e_bad = max(ref.rel_err(ys, y64), ref.rel_err(ss, s64))
    assert e_bad > 1.5 * e_seq + 1e-7, (e_bad, e_seq)
