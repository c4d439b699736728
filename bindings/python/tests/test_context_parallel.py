"""Context parallelism (wkv/context_parallel.py): a sequence split into segments, stitched by
composing state transitions, equals the one-call op — outputs, final state and gradients — in
one process (segments as a batch) and across two gloo processes (torch.distributed)."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import reference as ref  # noqa: E402
import wkv.torch as wt  # noqa: E402
from wkv.context_parallel import compose, segment_transition_rwkv7  # noqa: E402

TOL = 2e-5


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def inputs(seed, T, H=2, N=16, grad=False):
    rng = np.random.default_rng(seed)
    x = ref.random_inputs(rng, 1, T, H, N, "clampw")
    return {n: torch.tensor(a, requires_grad=grad) for n, a in x.items()}


def test_transition_maps_any_initial_state(rng):
    x = inputs(int(rng.integers(1 << 31)), 40)
    A, B = segment_transition_rwkv7(*x.values())
    s0 = torch.randn(1, 2, 16, 16)
    _, want = wt.rwkv7(*x.values(), s0)
    assert rel(s0 @ A + B, want) <= TOL
    # composing the transitions of two halves gives the whole one's
    h1 = {n: t[:, :17] for n, t in x.items()}
    h2 = {n: t[:, 17:] for n, t in x.items()}
    A12, B12 = compose(segment_transition_rwkv7(*h1.values()), segment_transition_rwkv7(*h2.values()))
    assert rel(A12, A) <= TOL and rel(B12, B) <= TOL


@pytest.mark.parametrize("segments", [2, 4, 8])
def test_segmented_equals_the_whole_sequence_with_gradients(rng, segments):
    seed = int(rng.integers(1 << 31))
    x = inputs(seed, 64, grad=True)
    s0 = torch.randn(1, 2, 16, 16, requires_grad=True)
    y, s = wt.rwkv7_segmented(*x.values(), s0, segments=segments)
    y_ref, s_ref = wt.rwkv7(*x.values(), s0)
    assert rel(y, y_ref) <= TOL and rel(s, s_ref) <= TOL
    dy, ds = torch.randn_like(y), torch.randn_like(s)
    grads = torch.autograd.grad((y * dy).sum() + (s * ds).sum(), [*x.values(), s0])
    want = torch.autograd.grad((y_ref * dy).sum() + (s_ref * ds).sum(), [*x.values(), s0])
    for name, g, gw in zip([*x, "state"], grads, want):
        assert rel(g, gw) <= 1e-4, name


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, seed, out_dir):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)
    try:
        x = inputs(seed, 48, grad=True)
        s0 = torch.randn(1, 2, 16, 16, generator=torch.Generator().manual_seed(seed))
        bounds = [0, 20, 48] if world == 2 else None  # uneven segments
        mine = {n: t[:, bounds[rank]:bounds[rank + 1]].detach().requires_grad_() for n, t in x.items()}
        y, s = wt.context_parallel_rwkv7(*mine.values(), s0)
        g = torch.Generator().manual_seed(seed + 1)
        dy_all = torch.randn(1, 48, 2, 16, generator=g)
        (y * dy_all[:, bounds[rank]:bounds[rank + 1]]).sum().backward()
        torch.save({"y": y.detach(), "s": s.detach(), "grads": {n: t.grad for n, t in mine.items()}},
                   os.path.join(out_dir, "rank%d.pt" % rank))
    finally:
        dist.destroy_process_group()


def test_two_processes_over_gloo_equal_one(tmp_path, rng):
    import torch.multiprocessing as mp

    seed = int(rng.integers(1 << 30))
    mp.spawn(_worker, args=(2, _free_port(), seed, str(tmp_path)), nprocs=2, join=True)
    parts = [torch.load(tmp_path / ("rank%d.pt" % r)) for r in range(2)]
    x = inputs(seed, 48, grad=True)
    s0 = torch.randn(1, 2, 16, 16, generator=torch.Generator().manual_seed(seed))
    y_ref, s_ref = wt.rwkv7(*x.values(), s0)
    dy_all = torch.randn(1, 48, 2, 16, generator=torch.Generator().manual_seed(seed + 1))
    (y_ref * dy_all).sum().backward()
    assert rel(torch.cat([p["y"] for p in parts], 1), y_ref) <= TOL
    assert rel(parts[1]["s"], s_ref) <= TOL  # the last rank ends with the sequence's final state
    for name, t in x.items():
        got = torch.cat([p["grads"][name] for p in parts], 1)
        assert rel(got, t.grad) <= 1e-4, name


@pytest.mark.parametrize("segments", [2, 5])
def test_rwkv6_segmented_equals_the_whole_sequence(rng, segments):
    x = {n: torch.tensor(a, requires_grad=True)
         for n, a in ref.random_inputs(rng, 1, 40, 2, 16, "exp_neg_exp").items() if n in "rwkv"}
    u = torch.tensor(rng.standard_normal((2, 16)).astype(np.float32) * 0.3, requires_grad=True)
    s0 = torch.randn(1, 2, 16, 16)
    y, s = wt.rwkv6_segmented(*x.values(), u, s0, segments=segments)
    y_ref, s_ref = wt.rwkv6(*x.values(), u, s0)
    assert rel(y, y_ref) <= TOL and rel(s, s_ref) <= TOL
    dy = torch.randn_like(y)
    g = torch.autograd.grad((y * dy).sum(), [*x.values(), u])
    gw = torch.autograd.grad((y_ref * dy).sum(), [*x.values(), u])
    for name, a, b in zip([*x, "u"], g, gw):
        assert rel(a, b) <= 1e-4, name


def test_segmented_refuses_what_it_cannot_split(rng):
    x = inputs(int(rng.integers(1 << 31)), 30)
    with pytest.raises(ValueError, match=r"T \(30\) a multiple of segments \(4\)"):
        wt.rwkv7_segmented(*x.values(), segments=4)
    two = {n: t.expand(2, -1, -1, -1) for n, t in x.items()}
    with pytest.raises(ValueError, match="needs B = 1"):
        wt.rwkv7_segmented(*two.values(), segments=2)
