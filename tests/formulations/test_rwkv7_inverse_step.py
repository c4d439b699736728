"""The inverse step against the replay (rwkv7_inverse_step.py), both in float32, against the float64
reference of the Python tests (bindings/python/tests/reference.py): the states and the gradients
that depend on them (dr, d decay, da). The replay's error stays at float32's rounding whatever the
decays; the inverse step's grows where decays are small (every decay at CLAMPW's floor: hundreds of
times the replay's) and matches it where decays are ~1. Fixed seeds: a spec, not a fuzzer."""

import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "bindings" / "python" / "tests"))

import reference as ref  # noqa: E402
import rwkv7_inverse_step as inv  # noqa: E402


def errors(extreme, seed=5, B=1, T=48, H=2, N=32):
    rng = np.random.default_rng(seed)
    x = ref.random_inputs(rng, B, T, H, N, "clampw", np.float64)
    if extreme == "smallest":  # every decay at its floor, 0.545
        x["w"] = np.full_like(x["w"], 30.0)
    elif extreme == "one":  # decays ~1
        x["w"] = np.full_like(x["w"], -30.0)
    s0 = 0.1 * rng.standard_normal((B, H, N, N))
    dy = rng.standard_normal((B, T, H, N))
    g64 = ref.rwkv7_backward(**x, dy=dy, s0=s0, form="clampw")
    g64["ddecay"] = g64["dw"] / ref.ddecay_dw(x["w"], "clampw")
    decay = ref.decay_of(x["w"], "clampw")
    states, sas = inv.forward_states(x["k"], x["v"], x["a"], x["b"], s0, decay)
    rebuilt = inv.inverse_states(x["k"], x["v"], x["b"], states, sas, decay)
    grads = {}
    for name, st in (("replay", states), ("inverse", rebuilt)):
        g = inv.backward(x["r"], x["a"], x["b"], dy, st, sas, decay)
        grads[name] = max(ref.rel_err(g[n], g64[n]) for n in ("dr", "ddecay", "da"))
    return grads


@pytest.mark.parametrize("extreme", [None, "smallest", "one"])
def test_replay_keeps_float32_rounding(extreme):
    e = errors(extreme)
    assert e["replay"] < 1e-6, e


def test_inverse_step_loses_accuracy_at_small_decays():
    spread, floor, one = errors(None), errors("smallest"), errors("one")
    # the library's inputs (decays spread down to the floor): already several times the replay's
    assert spread["inverse"] > 5 * spread["replay"], spread
    # every decay at the floor: the rounding grows by up to 1 / 0.545 per step back
    assert floor["inverse"] > 100 * floor["replay"], floor
    # decays ~1: nothing to amplify, the two agree (so the loss above is the decays', not a bug)
    assert one["inverse"] < 2 * one["replay"] + 1e-8, one
