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


def bf16_round(x):
    """float64 -> the nearest bfloat16 (round to nearest even), back as float64: bf16 inputs."""
    u = x.astype(np.float32).view(np.uint32)
    u = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)).astype(np.uint32)
    return u.view(np.float32).astype(np.float64)


def errors(extreme, seed=5, B=1, T=48, H=2, N=32, intervals=(16,), bf16=False):
    """The largest rel-RMS against float64 of dr, d decay and da: of the replay ("replay") and
    of the inverse step re-anchored every L tokens (key L, for each L in intervals)."""
    rng = np.random.default_rng(seed)
    x = ref.random_inputs(rng, B, T, H, N, "clampw", np.float64)
    if extreme == "smallest":  # every decay at its floor, 0.545
        x["w"] = np.full_like(x["w"], 30.0)
    elif extreme == "one":  # decays ~1
        x["w"] = np.full_like(x["w"], -30.0)
    if bf16:  # bf16 I/O: the inputs are bf16 values (the state and arithmetic stay float32)
        x = {n: bf16_round(v) for n, v in x.items()}
    s0 = 0.1 * rng.standard_normal((B, H, N, N))
    dy = rng.standard_normal((B, T, H, N))
    g64 = ref.rwkv7_backward(**x, dy=dy, s0=s0, form="clampw")
    g64["ddecay"] = g64["dw"] / ref.ddecay_dw(x["w"], "clampw")
    decay = ref.decay_of(x["w"], "clampw")
    states, sas = inv.forward_states(x["k"], x["v"], x["a"], x["b"], s0, decay)
    sets = {"replay": states}
    for L in intervals:
        sets[L] = inv.inverse_states(x["k"], x["v"], x["b"], states, sas, decay, K=L)
    grads = {}
    for name, st in sets.items():
        g = inv.backward(x["r"], x["a"], x["b"], dy, st, sas, decay)
        grads[name] = max(ref.rel_err(g[n], g64[n]) for n in ("dr", "ddecay", "da"))
    if len(intervals) == 1:
        grads["inverse"] = grads[intervals[0]]
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


# The interval L of an inverse-step backward (backends/cuda/DESIGN.md, "The inverse step's
# error"): at N = 64, T = 1024, the head size and length of the training anchor's shape. The
# error of a re-anchored walk depends on L, not on T (the table there has T = 4096 too).
BF16_GRAD_TOL = 8e-3  # the bf16 gradient tolerance of the golden tests


@pytest.mark.parametrize("extreme", [None, "smallest"])
def test_interval_16_stays_far_inside_the_bf16_tolerance(extreme):
    e = errors(extreme, T=1024, N=64, intervals=(8, 16, 32))
    assert e[8] < 1e-5, e  # within 10x of the replay's float32 rounding
    assert e[16] < BF16_GRAD_TOL / 20, e
    if extreme == "smallest":  # 32 tokens back at the floor: 1.83^32 of rounding, unusable
        assert e[32] > BF16_GRAD_TOL, e


def test_inverse_step_error_does_not_grow_with_length():
    short, long = errors("smallest", T=128, N=64), errors("smallest", T=1024, N=64)
    assert long["inverse"] < 2 * short["inverse"], (short, long)


if __name__ == "__main__":  # the design note's table
    for T in (1024, 4096):
        for bf16 in (False, True):
            for extreme in (None, "smallest"):
                e = errors(extreme, T=T, N=64, intervals=(8, 16, 32, 64), bf16=bf16)
                print("T=%d %s decays=%s: %s" % (T, "bf16" if bf16 else "f32", extreme or "drawn",
                                                ", ".join("%s %.1e" % (k, v) for k, v in e.items())))
