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
from wkv.context_parallel import compose, compose_rwkv4, segment_transition_rwkv4, segment_transition_rwkv7  # noqa: E402

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
        s0 = torch.randn(1, 2, 16, 16, generator=torch.Generator().manual_seed(seed)).requires_grad_()
        bounds = [0, 20, 48] if world == 2 else None  # uneven segments
        mine = {n: t[:, bounds[rank]:bounds[rank + 1]].detach().requires_grad_() for n, t in x.items()}
        y, s = wt.context_parallel_rwkv7(*mine.values(), s0)
        g = torch.Generator().manual_seed(seed + 1)
        dy_all = torch.randn(1, 48, 2, 16, generator=g)
        ds = torch.randn(world, 1, 2, 16, 16, generator=g)  # every rank's loss sees its end state too
        ((y * dy_all[:, bounds[rank]:bounds[rank + 1]]).sum() + (s * ds[rank]).sum()).backward()
        dist.all_reduce(s0.grad)  # each rank holds its share of the initial state's gradient
        torch.save({"y": y.detach(), "s": s.detach(), "grads": {n: t.grad for n, t in mine.items()},
                    "ds0": s0.grad}, os.path.join(out_dir, "rank%d.pt" % rank))
    finally:
        dist.destroy_process_group()


def test_two_processes_over_gloo_equal_one(tmp_path, rng):
    import torch.multiprocessing as mp

    seed = int(rng.integers(1 << 30))
    mp.spawn(_worker, args=(2, _free_port(), seed, str(tmp_path)), nprocs=2, join=True)
    parts = [torch.load(tmp_path / ("rank%d.pt" % r)) for r in range(2)]
    x = inputs(seed, 48, grad=True)
    s0 = torch.randn(1, 2, 16, 16, generator=torch.Generator().manual_seed(seed)).requires_grad_()
    y_ref, s_ref = wt.rwkv7(*x.values(), s0)
    _, s_mid = wt.rwkv7(*(t[:, :20] for t in x.values()), s0)  # rank 0's end state
    g = torch.Generator().manual_seed(seed + 1)
    dy_all = torch.randn(1, 48, 2, 16, generator=g)
    ds = torch.randn(2, 1, 2, 16, 16, generator=g)
    ((y_ref * dy_all).sum() + (s_mid * ds[0]).sum() + (s_ref * ds[1]).sum()).backward()
    assert rel(torch.cat([p["y"] for p in parts], 1), y_ref) <= TOL
    assert rel(parts[0]["s"], s_mid) <= TOL
    assert rel(parts[1]["s"], s_ref) <= TOL  # the last rank ends with the sequence's final state
    for name, t in x.items():
        got = torch.cat([p["grads"][name] for p in parts], 1)
        assert rel(got, t.grad) <= 1e-4, name
    assert rel(parts[0]["ds0"], s0.grad) <= 1e-4 and rel(parts[1]["ds0"], s0.grad) <= 1e-4


def test_bf16_segmented_within_bf16_rounding_of_the_one_call(rng):
    """bf16 inputs: y is the zero run's plus the correction from the identity run's (both bf16
    outputs, summed in float32), so it differs from the one call's by about two bf16 roundings;
    the final state is float32 arithmetic throughout."""
    x = {n: torch.tensor(a).bfloat16().requires_grad_()
         for n, a in ref.random_inputs(rng, 1, 128, 2, 16, "clampw").items()}
    y, s = wt.rwkv7_segmented(*x.values(), segments=4)
    y_ref, s_ref = wt.rwkv7(*x.values())
    assert y.dtype == torch.bfloat16
    assert rel(y, y_ref) <= 1e-2 and rel(s, s_ref) <= 1e-5
    dy = torch.randn(y.shape).bfloat16()
    g = torch.autograd.grad((y.float() * dy.float()).sum(), list(x.values()))
    gw = torch.autograd.grad((y_ref.float() * dy.float()).sum(), list(x.values()))
    for name, a, b in zip(x, g, gw):
        assert rel(a, b) <= 1e-2, name


@pytest.mark.parametrize("segments", [2, 5])
def test_rwkv6_segmented_equals_the_whole_sequence(rng, segments):
    x = {n: torch.tensor(a, requires_grad=True)
         for n, a in ref.random_inputs(rng, 1, 40, 2, 16, "exp_neg_exp").items() if n in "rwkv"}
    u = torch.tensor(rng.standard_normal((2, 16)).astype(np.float32) * 0.3, requires_grad=True)
    s0 = torch.randn(1, 2, 16, 16, requires_grad=True)
    y, s = wt.rwkv6_segmented(*x.values(), u, s0, segments=segments)
    y_ref, s_ref = wt.rwkv6(*x.values(), u, s0)
    assert rel(y, y_ref) <= TOL and rel(s, s_ref) <= TOL
    dy, ds = torch.randn_like(y), torch.randn_like(s)
    g = torch.autograd.grad((y * dy).sum() + (s * ds).sum(), [*x.values(), u, s0])
    gw = torch.autograd.grad((y_ref * dy).sum() + (s_ref * ds).sum(), [*x.values(), u, s0])
    for name, a, b in zip([*x, "u", "state"], g, gw):
        assert rel(a, b) <= 1e-4, name


def test_segmented_refuses_what_it_cannot_split(rng):
    x = inputs(int(rng.integers(1 << 31)), 30)
    with pytest.raises(ValueError, match=r"T \(30\) a multiple of segments \(4\)"):
        wt.rwkv7_segmented(*x.values(), segments=4)
    two = {n: t.expand(2, -1, -1, -1) for n, t in x.items()}
    with pytest.raises(ValueError, match="needs B = 1"):
        wt.rwkv7_segmented(*two.values(), segments=2)


def rwkv4_inputs(seed, T, C=24, grad=False):
    """w, u [C], k, v [1, T, C] and a state (aa, bb > 0, pp) [1, 3, C]; k spans a wide range so
    that the running max pp moves both ways."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(C, generator=g) * 0.7 - 0.5
    u = torch.randn(C, generator=g) * 0.5
    k = torch.randn(1, T, C, generator=g) * 3
    v = torch.randn(1, T, C, generator=g)
    s0 = torch.stack([torch.randn(1, C, generator=g), torch.rand(1, C, generator=g) + 0.5,
                      torch.randn(1, C, generator=g) * 2], 1)
    return [t.requires_grad_(grad) for t in (w, u, k, v, s0)]


def test_rwkv4_transition_maps_any_initial_state_and_composes(rng):
    w, u, k, v, s0 = rwkv4_inputs(int(rng.integers(1 << 31)), 50)
    tr = segment_transition_rwkv4(w, u, k, v)
    _, want = wt.rwkv4(w, u, k, v, s0)
    from wkv.context_parallel import _apply

    got = _apply("rwkv4", s0, tr)
    # compare the linear-space numerator and denominator (the triple itself is not unique)
    lin = lambda s: torch.stack([s[:, 0] * torch.exp(s[:, 2]), s[:, 1] * torch.exp(s[:, 2])])  # noqa: E731
    assert rel(lin(got), lin(want)) <= TOL
    t12 = compose_rwkv4(segment_transition_rwkv4(w, u, k[:, :23], v[:, :23]),
                        segment_transition_rwkv4(w, u, k[:, 23:], v[:, 23:]))
    assert rel(lin(_apply("rwkv4", s0, t12)), lin(want)) <= TOL
    assert rel(t12[:, 3], tr[:, 3]) <= 1e-6  # the decays add up


@pytest.mark.parametrize("segments", [2, 5])
@pytest.mark.parametrize("with_state", [False, True])
def test_rwkv4_segmented_equals_the_whole_sequence_with_gradients(rng, segments, with_state):
    w, u, k, v, s0 = rwkv4_inputs(int(rng.integers(1 << 31)), 40, grad=True)
    state = s0 if with_state else None
    y, s = wt.rwkv4_segmented(w, u, k, v, state, segments=segments)
    y_ref, s_ref = wt.rwkv4(w, u, k, v, state)
    assert rel(y, y_ref) <= TOL and rel(s, s_ref) <= TOL
    dy = torch.randn_like(y)
    inputs = [w, u, k, v] + ([s0] if with_state else [])
    g = torch.autograd.grad((y * dy).sum(), inputs)
    gw = torch.autograd.grad((y_ref * dy).sum(), inputs)
    for name, a, b in zip("w u k v state".split(), g, gw):
        assert rel(a, b) <= 1e-4, name


def _worker3(rank, world, port, seed, out_dir):
    """Three ranks: RWKV-7 with an empty middle shard, then RWKV-4 on uneven shards."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)
    try:
        out = {}
        x = inputs(seed, 30, grad=True)
        b7 = [0, 13, 13, 30]  # rank 1 has no tokens
        mine = {n: t[:, b7[rank]:b7[rank + 1]].detach().requires_grad_() for n, t in x.items()}
        y, s = wt.context_parallel_rwkv7(*mine.values())
        dy = torch.randn(1, 30, 2, 16, generator=torch.Generator().manual_seed(seed + 1))
        (y * dy[:, b7[rank]:b7[rank + 1]]).sum().backward()
        out["rwkv7"] = {"y": y.detach(), "s": s.detach(), "grads": {n: t.grad for n, t in mine.items()}}
        w, u, k, v, s0 = rwkv4_inputs(seed, 41)
        b4 = [0, 7, 30, 41]
        w, u, s0 = w.requires_grad_(), u.requires_grad_(), s0.requires_grad_()
        k4, v4 = [t[:, b4[rank]:b4[rank + 1]].detach().requires_grad_() for t in (k, v)]
        y, s = wt.context_parallel_rwkv4(w, u, k4, v4, s0)
        g = torch.Generator().manual_seed(seed + 2)
        dy = torch.randn(1, 41, 24, generator=g)
        ds = torch.randn(3, 1, 3, 24, generator=g)  # each rank's end state in its loss
        ((y * dy[:, b4[rank]:b4[rank + 1]]).sum() + (s * ds[rank]).sum()).backward()
        for t in (w.grad, u.grad, s0.grad):  # each rank holds its share of a shared input's gradient
            dist.all_reduce(t)
        out["rwkv4"] = {"y": y.detach(), "s": s.detach(), "dk": k4.grad, "dv": v4.grad, "dw": w.grad, "du": u.grad,
                        "ds0": s0.grad}
        torch.save(out, os.path.join(out_dir, "rank%d.pt" % rank))
    finally:
        dist.destroy_process_group()


def test_three_processes_empty_shard_and_rwkv4_over_gloo(tmp_path, rng):
    import torch.multiprocessing as mp

    seed = int(rng.integers(1 << 30))
    mp.spawn(_worker3, args=(3, _free_port(), seed, str(tmp_path)), nprocs=3, join=True)
    parts = [torch.load(tmp_path / ("rank%d.pt" % r)) for r in range(3)]
    # RWKV-7, the middle rank empty
    x = inputs(seed, 30, grad=True)
    y_ref, s_ref = wt.rwkv7(*x.values())
    dy = torch.randn(1, 30, 2, 16, generator=torch.Generator().manual_seed(seed + 1))
    (y_ref * dy).sum().backward()
    p7 = [p["rwkv7"] for p in parts]
    assert p7[1]["y"].shape == (1, 0, 2, 16)
    assert rel(torch.cat([p["y"] for p in p7], 1), y_ref) <= TOL
    assert rel(p7[2]["s"], s_ref) <= TOL
    for name, t in x.items():
        assert rel(torch.cat([p["grads"][name] for p in p7], 1), t.grad) <= 1e-4, name
    # RWKV-4, uneven shards, w and u shared
    w, u, k, v, s0 = rwkv4_inputs(seed, 41, grad=True)
    y_ref, s_ref = wt.rwkv4(w, u, k, v, s0)
    ends = [wt.rwkv4(w, u, k[:, :e], v[:, :e], s0)[1] for e in (7, 30)] + [s_ref]
    g = torch.Generator().manual_seed(seed + 2)
    dy = torch.randn(1, 41, 24, generator=g)
    ds = torch.randn(3, 1, 3, 24, generator=g)
    ((y_ref * dy).sum() + sum((e * ds[r]).sum() for r, e in enumerate(ends))).backward()
    p4 = [p["rwkv4"] for p in parts]
    assert rel(torch.cat([p["y"] for p in p4], 1), y_ref) <= TOL
    for r in range(3):
        assert rel(p4[r]["s"], ends[r]) <= TOL, r
    assert rel(torch.cat([p["dk"] for p in p4], 1), k.grad) <= 1e-4
    assert rel(torch.cat([p["dv"] for p in p4], 1), v.grad) <= 1e-4
    for r in range(3):
        assert rel(p4[r]["dw"], w.grad) <= 1e-4 and rel(p4[r]["du"], u.grad) <= 1e-4
        assert rel(p4[r]["ds0"], s0.grad) <= 1e-4


def test_segmented_on_the_vulkan_backend(rng):
    """The split on another backend (lavapipe in CI): the op's runs on Vulkan, the composition
    and the correction in torch; values and gradients against the CPU's one call."""
    import wkv

    try:
        vk = wkv.Context("vulkan")
    except (wkv.WkvError, OSError):
        pytest.skip("no Vulkan device")
    x = inputs(int(rng.integers(1 << 31)), 48, grad=True)
    s0 = torch.randn(1, 2, 16, 16, requires_grad=True)
    y, s = wt.rwkv7_segmented(*x.values(), s0, segments=4, context=vk)
    y_ref, s_ref = wt.rwkv7(*x.values(), s0)
    assert rel(y, y_ref) <= TOL and rel(s, s_ref) <= TOL
    dy = torch.randn_like(y)
    g = torch.autograd.grad((y * dy).sum() + s.sum(), [*x.values(), s0])
    gw = torch.autograd.grad((y_ref * dy).sum() + s_ref.sum(), [*x.values(), s0])
    for name, a, b in zip([*x, "state"], g, gw):
        assert rel(a, b) <= 1e-4, name
    w, u, k, v, s4 = rwkv4_inputs(int(rng.integers(1 << 31)), 40, grad=True)
    y, s = wt.rwkv4_segmented(w, u, k, v, s4, segments=5, context=vk)
    y_ref, s_ref = wt.rwkv4(w, u, k, v, s4)
    assert rel(y, y_ref) <= TOL
    dy = torch.randn_like(y)
    g = torch.autograd.grad((y * dy).sum(), [w, u, k, v, s4])
    gw = torch.autograd.grad((y_ref * dy).sum(), [w, u, k, v, s4])
    for name, a, b in zip("w u k v state".split(), g, gw):
        assert rel(a, b) <= 1e-4, name
