"""The attention backward (wkv.attention_backward, and autograd through wkv.torch.attention)
against torch's autograd of its math attention in float64 (the oracle): the gradients of
o . g + lse . gl w.r.t. q, k, v; causal and not, grouped-query heads, packed sequences, rows that
see no key; float32 to 2e-5 and bf16 to 1e-2 rel-RMS; opcheck and torch.compile of the op with
its backward; the fake implementation's device and dtype checks; bad inputs named."""

from __future__ import annotations

import numpy as np
import pytest

import wkv

torch = pytest.importorskip("torch", reason="torch (the oracle: its math attention) is not installed")
import wkv.torch as wt  # noqa: E402


def oracle(q, k, v, causal, scale=None, q_offsets=None, k_offsets=None):
    """(o, lse) of float64 softmax attention by torch's math backend, differentiable; rows that
    see no key give o = 0 and lse = -inf."""
    B, Tq, Hq, D = q.shape
    g = Hq // k.shape[2]
    if q_offsets is None:
        seqs = [(b, 0, Tq, 0, k.shape[1]) for b in range(B)]
    else:
        seqs = [(0, q_offsets[s], q_offsets[s + 1], k_offsets[s], k_offsets[s + 1]) for s in range(len(q_offsets) - 1)]
    o_seqs, lse_seqs = [], []
    sc = scale if scale is not None else 1.0 / np.sqrt(D)
    for b, q0, q1, k0, k1 in seqs:
        tq, tk = q1 - q0, k1 - k0
        qs = q[b, q0:q1].transpose(0, 1)  # [H, tq, D]
        ks = k[b, k0:k1].transpose(0, 1).repeat_interleave(g, 0)
        vs = v[b, k0:k1].transpose(0, 1).repeat_interleave(g, 0)
        s = (qs @ ks.transpose(1, 2)) * sc
        if causal:
            s = s.masked_fill(~torch.ones(tq, tk, dtype=torch.bool).tril(diagonal=tk - tq), -float("inf"))
        lse = torch.logsumexp(s, -1) if tk else torch.full((Hq, tq), -float("inf"), dtype=q.dtype)
        seen = torch.isfinite(lse)
        p = torch.where(seen[..., None], torch.exp(s - torch.where(seen, lse, 0.0)[..., None]), 0.0)
        o_seqs.append((p @ vs).transpose(0, 1))
        lse_seqs.append(lse)
    if q_offsets is None:
        return torch.stack(o_seqs), torch.stack(lse_seqs)
    o, lse = torch.cat(o_seqs, 0).unsqueeze(0), torch.cat(lse_seqs, -1).unsqueeze(0)
    return o, lse


def rel_rms(a, b):
    """rms(a - b) / rms(b), where rms(b) counts as at least 0.1 (the gradients here are O(1)): one zero by
    cancellation (one key: ds = p (dp - delta) = 0) is compared in absolute terms."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(((a - b) ** 2).mean() / max((b ** 2).mean(), 1e-2)))


def oracle_grads(q, k, v, g, gl, causal, scale=None, q_offsets=None, k_offsets=None):
    """dq, dk, dv of o . g + lse . gl (finite lse only) in float64."""
    leaves = [torch.tensor(np.asarray(x, np.float64), requires_grad=True) for x in (q, k, v)]
    o, lse = oracle(*leaves, causal, scale, q_offsets, k_offsets)
    loss = (o * torch.as_tensor(np.asarray(g, np.float64))).sum()
    if gl is not None:
        loss = loss + torch.where(torch.isfinite(lse), lse * torch.as_tensor(np.asarray(gl, np.float64)), 0.0).sum()
    loss.backward()
    return [x.grad.numpy() for x in leaves]


CASES = [  # B, Tq, Tk, Hq, Hkv, D
    (2, 37, 37, 4, 2, 64),
    (1, 1, 1, 2, 2, 32),
    (1, 1, 300, 8, 1, 128),
    (1, 20, 9, 2, 2, 64),   # causal rows before the first key see nothing
    (2, 129, 131, 3, 1, 96),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("causal", [False, True])
def test_numpy_backward_against_torch_autograd_float64(rng, case, causal):
    B, Tq, Tk, Hq, Hkv, D = case
    f = lambda x: x.astype(np.float32)  # noqa: E731
    q, k, v = (f(rng.standard_normal(s)) for s in ((B, Tq, Hq, D), (B, Tk, Hkv, D), (B, Tk, Hkv, D)))
    g, gl = f(rng.standard_normal((B, Tq, Hq, D))), f(rng.standard_normal((B, Hq, Tq)))
    o, lse = wkv.attention(q, k, v, causal=causal, return_lse=True)
    for dlse in (None, gl):
        got = wkv.attention_backward(q, k, v, o, lse, g, dlse=dlse, causal=causal)
        want = oracle_grads(q, k, v, g, dlse, causal)
        for name, a, b in zip(("dq", "dk", "dv"), got, want):
            assert a.dtype == np.float32 and a.shape == b.shape
            assert rel_rms(a, b) <= 2e-5, (name, rel_rms(a, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_torch_autograd_against_torch_math_float64(rng, dtype, causal):
    """loss.backward() through wkv.torch.attention (o and lse both used) equals the oracle's."""
    q, k, v = (torch.tensor(rng.standard_normal(s), dtype=torch.float32).to(dtype)
               for s in ((2, 45, 4, 64), (2, 60, 2, 64), (2, 60, 2, 64)))
    g = torch.tensor(rng.standard_normal((2, 45, 4, 64)), dtype=torch.float32)
    gl = torch.tensor(rng.standard_normal((2, 4, 45)), dtype=torch.float32)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    o, lse = wt.attention(*leaves, causal=causal, scale=0.2)
    ((o.float() * g).sum() + (lse * gl).sum()).backward()
    want = oracle_grads(*(x.float().numpy() for x in (q, k, v)), g.numpy(), gl.numpy(), causal, scale=0.2)
    tol = 2e-5 if dtype == torch.float32 else 1e-2
    for name, leaf, b in zip(("dq", "dk", "dv"), leaves, want):
        assert leaf.grad.dtype == dtype
        assert rel_rms(leaf.grad.float().numpy(), b) <= tol, (name, rel_rms(leaf.grad.float().numpy(), b))


def test_packed_sequences_and_rows_that_see_nothing(rng):
    """Packed: an empty sequence, keys without queries (their dk, dv: exactly 0)."""
    qo, ko = [0, 5, 5, 25, 26, 26], [0, 9, 12, 32, 33, 40]
    f = lambda x: x.astype(np.float32)  # noqa: E731
    q, k, v = (f(rng.standard_normal(s)) for s in ((1, 26, 4, 32), (1, 40, 2, 32), (1, 40, 2, 32)))
    g = f(rng.standard_normal((1, 26, 4, 32)))
    for causal in (False, True):
        o, lse = wkv.attention(q, k, v, causal=causal, q_offsets=qo, k_offsets=ko, return_lse=True)
        dq, dk, dv = wkv.attention_backward(q, k, v, o, lse, g, causal=causal, q_offsets=qo, k_offsets=ko)
        want = oracle_grads(q, k, v, g, None, causal, q_offsets=qo, k_offsets=ko)
        for a, b in zip((dq, dk, dv), want):
            assert rel_rms(a, b) <= 2e-5
        assert (dk[:, 33:] == 0).all() and (dv[:, 33:] == 0).all()
    # causal Tq > Tk: the first rows see no key; their dq is exactly zero
    q2, k2, v2 = (f(rng.standard_normal(s)) for s in ((1, 12, 2, 16), (1, 4, 2, 16), (1, 4, 2, 16)))
    o, lse = wkv.attention(q2, k2, v2, causal=True, return_lse=True)
    dq, dk, dv = wkv.attention_backward(q2, k2, v2, o, lse, np.ones_like(q2), causal=True)
    assert (dq[:, :8] == 0).all() and np.isfinite(dq).all()


def test_wkv_attention_is_differentiable_for_torch_tensors(rng):
    """wkv.attention with tensors that require grad takes the autograd path; out= is refused there."""
    q, k, v = (torch.randn(1, 10, 2, 16, requires_grad=True) for _ in range(3))
    o = wkv.attention(q, k, v, causal=True)
    o.sum().backward()
    want = oracle_grads(q.detach().numpy(), k.detach().numpy(), v.detach().numpy(), np.ones((1, 10, 2, 16)), None,
                        True)
    assert rel_rms(q.grad.numpy(), want[0]) <= 2e-5 and rel_rms(v.grad.numpy(), want[2]) <= 2e-5
    with pytest.raises(wkv.InvalidArgumentError, match="out cannot be given when q, k or v requires grad"):
        wkv.attention(q, k, v, out=torch.empty(1, 10, 2, 16))


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="needs torch >= 2.4")
def test_opcheck_and_compile_with_backward(rng):
    q, k, v = (torch.randn(*s, requires_grad=True) for s in ((1, 9, 4, 16), (1, 12, 2, 16), (1, 12, 2, 16)))
    torch.library.opcheck(torch.ops.wkv.attention.default, (q, k, v, None, None, True, 0.0, 0))
    off = torch.tensor([0, 4, 9]), torch.tensor([0, 5, 12])
    torch.library.opcheck(torch.ops.wkv.attention.default, (q, k, v, off[0], off[1], False, 0.3, 0))
    with torch.no_grad():
        o, lse = wt.attention(q, k, v, causal=True)
    dout, dlse = torch.randn_like(o), torch.randn_like(lse)
    torch.library.opcheck(torch.ops.wkv.attention_backward.default,
                          (q.detach(), k.detach(), v.detach(), o, lse, dout, dlse, None, None, True, 0.0, 0))

    def step(a, b, c):
        o, lse = wt.attention(a, b, c, causal=True)
        return (o * 2).sum() + lse.sum()

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    compiled(*leaves).backward()
    step(q, k, v).backward()
    for a, b in zip(leaves, (q, k, v)):
        assert torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-6)


def test_fake_checks_devices_and_dtypes_like_the_real_path():
    q, k, v, o, g = (torch.zeros(1, 4, 2, 8, device="meta") for _ in range(5))
    lse = torch.zeros(1, 2, 4, device="meta")
    with pytest.raises(wkv.DTypeError, match="dout is torch.float16 but must be torch.float32"):
        torch.ops.wkv.attention_backward(q, k, v, o, lse, g.half(), None, None, None, False, 0.0, 0)
    with pytest.raises(wkv.DTypeError, match="lse is torch.float16"):
        torch.ops.wkv.attention_backward(q, k, v, o, lse.half(), g, None, None, None, False, 0.0, 0)
    with pytest.raises(wkv.DeviceMismatchError, match="dout is on cpu but q is on meta"):
        torch.ops.wkv.attention_backward(q, k, v, o, lse, torch.zeros(1, 4, 2, 8), None, None, None, False, 0.0, 0)
    with pytest.raises(wkv.DeviceMismatchError, match="k is on meta but q is on cpu"):
        torch.ops.wkv.attention(torch.zeros(1, 4, 2, 8), k, torch.zeros(1, 4, 2, 8), None, None, False, 0.0, 0)


def test_bad_inputs_are_named(rng):
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, 4, 4, 8), (1, 6, 2, 8), (1, 6, 2, 8)))
    o, lse = wkv.attention(q, k, v, return_lse=True)
    with pytest.raises(wkv.ShapeError, match=r"wkv\.attention_backward: dout\.shape\[1\] is 5, expected 4"):
        wkv.attention_backward(q, k, v, o, lse, np.zeros((1, 5, 4, 8), np.float32))
    with pytest.raises(wkv.DTypeError, match="lse must be float32"):
        wkv.attention_backward(q, k, v, o, lse.astype(np.float16), q)
    with pytest.raises(wkv.DTypeError, match="dout has another dtype than q"):
        wkv.attention_backward(q, k, v, o, lse, q.astype(np.float16))
    with pytest.raises(wkv.AliasingError, match="dq overlaps dout"):
        g = rng.standard_normal((1, 4, 4, 8)).astype(np.float32)
        wkv.attention_backward(q, k, v, o, lse, g, dq_out=g)
    with pytest.raises(TypeError, match="lse is required"):
        wkv.attention_backward(q, k, v, o, None, q)


def _vulkan():
    try:
        return wkv.Context("vulkan")
    except (wkv.WkvError, OSError):
        return None


@pytest.mark.parametrize("causal", [False, True])
def test_vulkan_context_against_torch_autograd_float64(rng, causal):
    """The backward on the Vulkan backend (lavapipe in CI): numpy float32 with dlse against the
    oracle, and autograd through wkv.torch.attention in bf16 under use_context."""
    ctx = _vulkan()
    if ctx is None:
        pytest.skip("no Vulkan device")
    f = lambda x: x.astype(np.float32)  # noqa: E731
    q, k, v = (f(rng.standard_normal(s)) for s in ((2, 37, 4, 64), (2, 45, 2, 64), (2, 45, 2, 64)))
    g, gl = f(rng.standard_normal((2, 37, 4, 64))), f(rng.standard_normal((2, 4, 37)))
    o, lse = wkv.attention(q, k, v, causal=causal, return_lse=True, context=ctx)
    got = wkv.attention_backward(q, k, v, o, lse, g, dlse=gl, causal=causal, context=ctx)
    want = oracle_grads(q, k, v, g, gl, causal)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        assert rel_rms(a, b) <= 2e-5, (name, rel_rms(a, b))
    leaves = [torch.tensor(x).to(torch.bfloat16).requires_grad_() for x in (q, k, v)]
    with wkv.use_context(ctx):
        ob, lb = wt.attention(*leaves, causal=causal)
        ((ob.float() * torch.tensor(g)).sum() + (lb * torch.tensor(gl)).sum()).backward()
    want = oracle_grads(*(x.detach().float().numpy() for x in leaves), g, gl, causal)
    for name, leaf, b in zip(("dq", "dk", "dv"), leaves, want):
        assert leaf.grad.dtype == torch.bfloat16
        assert rel_rms(leaf.grad.float().numpy(), b) <= 1e-2, (name, rel_rms(leaf.grad.float().numpy(), b))
