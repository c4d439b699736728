"""PyTorch: zero-copy tensors, the custom op and the autograd.Function (gradients for every
input and the initial state, against a float64 torch reference), gradcheck in float32,
opcheck, torch.compile, CUDA tensors and streams."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the PyTorch integration is not tested here "
                                            "(pip install torch to run these)")

import wkv  # noqa: E402
import wkv.torch as wt  # noqa: E402
import wkv.ops as _ops  # noqa: E402
import reference as ref  # noqa: E402

TOL32 = 1e-5
TOL16 = 1e-2
INPUTS = ("r", "w", "k", "v", "a", "b")
ROUTES = ["custom_op", "function"] if wt.HAS_CUSTOM_OP else ["function"]
CUDA = torch.cuda.is_available()
CUDA_BACKEND = wkv.backend_info("cuda")["available"]
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA GPU here")
needs_cuda_backend = pytest.mark.skipif(not (CUDA and CUDA_BACKEND),
                                        reason="no CUDA GPU, or libwkv's CUDA plugin is not built/loadable")


def rel(a, b):
    return ref.rel_err(a.detach().double().cpu().numpy(), b.detach().double().cpu().numpy()
                       if isinstance(b, torch.Tensor) else b)


def inputs(rng, B, T, H, N, form="clampw", device="cpu", dtype=torch.float32, grad=False):
    x = ref.random_inputs(rng, B, T, H, N, form)
    return {n: torch.tensor(a, dtype=dtype, device=device, requires_grad=grad) for n, a in x.items()}


def torch_reference(x, s0=None, form="clampw"):
    """The recurrence in float64 torch ops, differentiable by autograd."""
    r, w, k, v, a, b = (x[n].double() for n in INPUTS)
    if form == "clampw":
        dec = torch.exp(-np.exp(-0.5) * torch.sigmoid(w))
    elif form == "log":
        dec = torch.exp(w)
    elif form == "exp_neg_exp":
        dec = torch.exp(-torch.exp(w))
    else:
        dec = w
    B, T, H, N = v.shape
    S = s0.double() if s0 is not None else torch.zeros(B, H, N, N, dtype=torch.float64, device=v.device)
    ys = []
    for t in range(T):
        sa = torch.einsum("bhil,bhl->bhi", S, a[:, t])
        S = S * dec[:, t, :, None, :] + sa[..., None] * b[:, t, :, None, :] + v[:, t, :, :, None] * k[:, t, :, None, :]
        ys.append(torch.einsum("bhij,bhj->bhi", S, r[:, t]))
    return torch.stack(ys, 1), S


def leaf_grads(loss, leaves):
    return torch.autograd.grad(loss, leaves, allow_unused=True)


# ------------------------------------------------------------------------------ CPU


def test_torch_in_torch_out_zero_copy(rng):
    x = inputs(rng, 2, 6, 2, 8)
    y, s = wkv.rwkv7(*x.values())
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32 and y.device.type == "cpu"
    assert isinstance(s, torch.Tensor) and s.shape == (2, 2, 8, 8)
    ry, rs = torch_reference(x)
    assert rel(y, ry) < TOL32 and rel(s, rs) < TOL32
    # out= writes into the given tensor (no copy), including a non-contiguous view
    buf = torch.full((2, 6, 2, 16), float("nan"))
    y2, _ = wkv.rwkv7(*x.values(), out=buf[..., ::2])
    assert y2.data_ptr() == buf.data_ptr() and rel(buf[..., ::2], ry) < TOL32
    assert torch.isnan(buf[..., 1::2]).all()


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("form", ["clampw", "log", "exp_neg_exp", "direct"])
def test_autograd_matches_float64_reference(rng, route, form):
    B, T, H, N = 2, 7, 2, 4
    x = inputs(rng, B, T, H, N, form, grad=True)
    s0 = torch.tensor(rng.standard_normal((B, H, N, N)) * 0.3, dtype=torch.float32, requires_grad=True)
    dy = torch.randn(B, T, H, N, dtype=torch.float64)
    dsT = torch.randn(B, H, N, N, dtype=torch.float64)
    y, sT = wt.rwkv7(*x.values(), s0, decay=form, use_custom_op=(route == "custom_op"))
    assert y.grad_fn is not None
    got = leaf_grads((y.double() * dy).sum() + (sT.double() * dsT).sum(), [*x.values(), s0])
    ry, rsT = torch_reference(x, s0, form)
    want = leaf_grads((ry * dy).sum() + (rsT * dsT).sum(), [*x.values(), s0])
    assert rel(y, ry) < TOL32 and rel(sT, rsT) < TOL32
    for name, g, w in zip(INPUTS + ("state",), got, want):
        assert g is not None and g.dtype == torch.float32, name
        assert rel(g, w) < TOL32, (name, rel(g, w))


@pytest.mark.parametrize("route", ROUTES)
def test_grads_without_initial_state_and_unused_final_state(rng, route):
    x = inputs(rng, 1, 5, 1, 4, grad=True)
    y, _ = wt.rwkv7(*x.values(), use_custom_op=(route == "custom_op"))
    y.square().sum().backward()
    xr = {n: t.detach().requires_grad_() for n, t in x.items()}
    ry, _ = torch_reference(xr)
    ry.square().sum().backward()
    for n in INPUTS:
        assert rel(x[n].grad, xr[n].grad) < TOL32, n


def test_public_function_routes_to_autograd(rng):
    x = inputs(rng, 1, 4, 1, 4, grad=True)
    y, s = wkv.rwkv7(*x.values())
    assert y.requires_grad and s.requires_grad
    with pytest.raises(wkv.InvalidArgumentError, match="do not support autograd"):
        wkv.rwkv7(*x.values(), out=torch.empty(1, 4, 1, 4))
    with torch.no_grad():
        y2, _ = wkv.rwkv7(*x.values(), out=torch.empty(1, 4, 1, 4))
    assert not y2.requires_grad and torch.equal(y2, y.detach())


def test_gradcheck_float32(rng):
    # The library computes in float32 only (float64 tensors are refused), so this is gradcheck
    # in float32 with a step and tolerances a float32 finite difference can meet.
    B, T, H, N = 1, 3, 1, 3
    x = inputs(rng, B, T, H, N, "log", grad=True)
    s0 = torch.tensor(rng.standard_normal((B, H, N, N)) * 0.3, dtype=torch.float32, requires_grad=True)
    for route in ROUTES:
        def f(*args, route=route):
            return wt.rwkv7(*args, decay="log", use_custom_op=(route == "custom_op"))

        with pytest.warns(UserWarning, match="double precision"):
            assert torch.autograd.gradcheck(f, (*x.values(), s0), eps=1e-3, atol=2e-3, rtol=2e-2)
    with pytest.raises(wkv.DTypeError, match=r"r\.dtype float64"):
        wt.rwkv7(*(t.double() for t in x.values()))


@pytest.mark.skipif(not wt.HAS_CUSTOM_OP or not hasattr(torch.library, "opcheck"), reason="needs torch >= 2.4")
@pytest.mark.parametrize("with_state", [True, False])
def test_opcheck(rng, with_state):
    x = inputs(rng, 1, 5, 2, 4, grad=True)
    s0 = torch.tensor(rng.standard_normal((1, 2, 4, 4)) * 0.3, dtype=torch.float32, requires_grad=True) \
        if with_state else None
    torch.library.opcheck(torch.ops.wkv.rwkv7.default, (*x.values(), s0, None, 4, 0, 0))
    dy = torch.randn(1, 5, 2, 4)
    torch.library.opcheck(torch.ops.wkv.rwkv7_backward.default,
                          (*(t.detach() for t in x.values()), s0.detach() if s0 is not None else None, None, dy,
                           None, 4, 0, 0))


@pytest.mark.skipif(not wt.HAS_CUSTOM_OP, reason="needs torch >= 2.4")
def test_opcheck_packed(rng):
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("needs torch >= 2.4")
    x = inputs(rng, 1, 7, 1, 4, grad=True)
    s0 = torch.zeros(3, 1, 4, 4, requires_grad=True)
    off = torch.tensor([0, 2, 2, 7])
    torch.library.opcheck(torch.ops.wkv.rwkv7.default, (*x.values(), s0, off, 4, 1, 0))


@pytest.mark.skipif(not wt.HAS_CUSTOM_OP, reason="needs torch >= 2.4")
def test_torch_compile(rng):
    x = inputs(rng, 1, 6, 2, 4, grad=True)

    def step(r, w, k, v, a, b):
        y, s = wt.rwkv7(r, w, k, v, a, b, decay="clampw")
        return (y * y).sum() + s.sum()

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    loss = compiled(*x.values())
    got = torch.autograd.grad(loss, list(x.values()))
    want = torch.autograd.grad(step(*x.values()), list(x.values()))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("route", ROUTES)
def test_packed_sequences_and_key_major(rng, route):
    H, N = 2, 4
    offsets = [0, 3, 3, 8]
    xs = ref.random_inputs(rng, 1, 8, H, N)
    x = {n: torch.tensor(a, requires_grad=True) for n, a in xs.items()}
    s0 = np.asarray(rng.standard_normal((3, H, N, N)) * 0.3, np.float32)
    s0_km = torch.tensor(np.ascontiguousarray(s0.swapaxes(-1, -2)), requires_grad=True)
    y, sT = wt.rwkv7(*x.values(), s0_km, seq_offsets=offsets, state_layout="kv",
                     use_custom_op=(route == "custom_op"))
    dy = rng.standard_normal(y.shape)
    ((y.double() * torch.tensor(dy)).sum()).backward()
    ry, rs = ref.rwkv7_forward(*xs.values(), s0=s0, seq_offsets=offsets)
    assert rel(y, ry) < TOL32 and rel(sT.transpose(-1, -2), rs) < TOL32
    want = ref.rwkv7_backward(*xs.values(), dy, s0=s0, seq_offsets=offsets)
    for n in INPUTS:
        assert rel(x[n].grad, want["d" + n]) < TOL32, n
    assert rel(s0_km.grad.transpose(-1, -2), want["ds0"]) < TOL32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_tensors(rng, dtype):
    x = inputs(rng, 1, 8, 2, 8, dtype=dtype, grad=True)
    y, s = wt.rwkv7(*x.values())
    assert y.dtype == dtype and s.dtype == torch.float32
    ry, rs = torch_reference(x)
    assert rel(y, ry) < TOL16 and rel(s, rs) < TOL16
    y.float().sum().backward()
    assert x["k"].grad.dtype == dtype


def test_contexts_reach_the_op(rng):
    x = inputs(rng, 1, 4, 1, 4, grad=True)
    lines = []
    ctx = wkv.Context("cpu", threads=1, log=lambda lvl, msg: lines.append(msg), log_level="debug")
    with wkv.use_context(ctx):
        y, _ = wt.rwkv7(*x.values())
    y.sum().backward()  # the backward runs on the forward's context
    y2, _ = wt.rwkv7(*x.values(), context=ctx)
    assert torch.equal(y.detach(), y2.detach())
    if wt.HAS_CUSTOM_OP:
        with pytest.raises(wkv.InvalidArgumentError, match="context_id 999999 is not a live wkv.Context"):
            torch.ops.wkv.rwkv7(*x.values(), None, None, 4, 0, 999999)
    ctx.close()


def test_numpy_and_torch_do_not_mix(rng):
    x = inputs(rng, 1, 3, 1, 4)
    args = list(x.values())
    args[1] = args[1].numpy()
    with pytest.raises(TypeError, match=r"mixes numpy arrays \(w\) and torch tensors \(r, k, v, a, b\)"):
        wkv.rwkv7(*args)


def test_torch_dlpack_producer(rng):
    from dlpack_producer import NumpyDLPackOnly

    x = inputs(rng, 1, 5, 2, 4)
    y, _ = wkv.rwkv7(*(NumpyDLPackOnly(t) for t in x.values()))  # torch's own __dlpack__
    assert type(y) is np.ndarray  # DLPack-only host objects come back as numpy
    assert rel(torch.from_numpy(y), torch_reference(x)[0]) < TOL32


def _op_inputs(op, device="cpu"):
    """Small valid inputs of each op, positional as torch.ops.wkv.<op> takes them."""
    B, T, H, N = 1, 3, 1, 4
    g = torch.Generator().manual_seed(0)
    if op == "rwkv7":
        x = [torch.rand(B, T, H, N, generator=g) * 0.5 for _ in range(6)]
        x[1] = x[1] * 0.5 + 0.5  # decays in (0.5, 1): direct form below
        state = torch.zeros(B, H, N, N)
    elif op == "rwkv6":
        x = [torch.rand(B, T, H, N, generator=g) * 0.5 for _ in range(4)] + [torch.rand(H, N, generator=g)]
        x[1] = x[1] * 0.5 + 0.5
        state = torch.zeros(B, H, N, N)
    else:
        C = H * N
        x = [torch.rand(C, generator=g), torch.rand(C, generator=g)] + [torch.rand(B, T, C, generator=g) for _ in range(2)]
        state = torch.zeros(B, 3, C)
    return [t.to(device) for t in x], state.to(device)


@pytest.mark.skipif(not wt.HAS_CUSTOM_OP, reason="needs torch >= 2.4")
@pytest.mark.parametrize("op", ["rwkv7", "rwkv6", "rwkv4"])
def test_fake_impl_refuses_what_the_op_refuses(op):
    fwd, bwd = getattr(torch.ops.wkv, op), getattr(torch.ops.wkv, op + "_backward")
    decay = _ops.decay_code("test", "direct" if op != "rwkv4" else "exp_neg_exp")
    x, state = _op_inputs(op)
    y, s = fwd(*x, state, None, decay, 0, 0)  # the real op runs
    assert torch.isfinite(y).all() and y.device.type == "cpu"
    # every tensor meta: the fake runs, shapes and devices as the real op's
    xm, sm = _op_inputs(op, "meta")
    ym, smo = fwd(*xm, sm, None, decay, 0, 0)
    assert ym.device.type == "meta" and ym.shape == y.shape and smo.shape == s.shape
    g = bwd(*xm, sm, None, torch.empty(y.shape, device="meta"), None, decay, 0, 0)
    assert [t.shape for t in g] == [t.shape for t in x] + [state.shape]
    # one meta tensor among CPU tensors, in each position: refused, never an uninitialised result
    for i in range(len(x)):
        mixed = list(x)
        mixed[i] = mixed[i].to("meta")
        with pytest.raises(wkv.DeviceMismatchError, match="every tensor of a call must be on one device"):
            fwd(*mixed, state, None, decay, 0, 0)
        with pytest.raises(wkv.DeviceMismatchError):
            bwd(*mixed, state, None, torch.ones_like(y), None, decay, 0, 0)
    with pytest.raises(wkv.DeviceMismatchError, match="state is on meta"):
        fwd(*x, state.to("meta"), None, decay, 0, 0)
    # dtypes the real op refuses: a float64 input, a state that is not float32 (meta and real alike)
    for dev in ("meta", "cpu"):
        xd, sd = _op_inputs(op, dev)
        xd[-1] = xd[-1].double()
        with pytest.raises(wkv.DTypeError):
            fwd(*xd, sd, None, decay, 0, 0)
        xd, sd = _op_inputs(op, dev)
        with pytest.raises(wkv.DTypeError):
            fwd(*xd, sd.half(), None, decay, 0, 0)


# ------------------------------------------------------------------------------ CUDA


def cuda_head_size():
    """The smallest head size the CUDA backend takes (it may not take every N)."""
    hs = wkv.backend_info("cuda")["head_sizes"]
    return 4 if hs == "any" else min(hs)


@needs_cuda
def test_cuda_tensors_without_the_cuda_plugin(rng):
    if CUDA_BACKEND:
        pytest.skip("the CUDA backend is available: the CUDA tests below run instead")
    x = inputs(rng, 1, 4, 1, 4, device="cuda")
    with pytest.raises(wkv.BackendUnavailableError, match="backend cuda is unavailable"):
        wkv.rwkv7(*x.values())
    with wkv.Context("cpu") as ctx:  # the CPU backend refuses device memory, by its own check
        with pytest.raises(wkv.DeviceMismatchError, match="r.device.type is 2, which the cpu backend cannot read"):
            wkv.rwkv7(*x.values(), context=ctx)


@needs_cuda_backend
@pytest.mark.parametrize("route", ROUTES)
def test_cuda_matches_cpu(rng, route):
    N = cuda_head_size()
    x = inputs(rng, 2, 9, 2, N, device="cuda", grad=True)
    s0 = torch.tensor(rng.standard_normal((2, 2, N, N)) * 0.3, dtype=torch.float32, device="cuda",
                      requires_grad=True)
    y, sT = wt.rwkv7(*x.values(), s0, use_custom_op=(route == "custom_op"))
    assert y.device.type == "cuda"
    (y.sum() + sT.square().sum()).backward()
    xc = {n: t.detach().cpu().requires_grad_() for n, t in x.items()}
    s0c = s0.detach().cpu().requires_grad_()
    yc, sTc = wt.rwkv7(*xc.values(), s0c)
    (yc.sum() + sTc.square().sum()).backward()
    assert rel(y, yc) < TOL32 and rel(sT, sTc) < TOL32
    for n in INPUTS:
        assert rel(x[n].grad, xc[n].grad) < 1e-4, n
    assert rel(s0.grad, s0c.grad) < 1e-4


@needs_cuda_backend
def test_cuda_runs_on_the_current_stream(rng):
    x = inputs(rng, 1, 64, 4, 64, device="cuda")
    want, _ = wkv.rwkv7(*x.values())
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y, _ = wkv.rwkv7(*x.values())
        ctx = wkv.default_context((2, torch.cuda.current_device()))
        assert ctx.cuda_stream() == side.cuda_stream
    side.synchronize()
    torch.testing.assert_close(y, want)


@needs_cuda_backend
def test_cuda_gradcheck_and_opcheck(rng):
    x = inputs(rng, 1, 2, 1, cuda_head_size(), "log", device="cuda", grad=True)
    with pytest.warns(UserWarning):
        assert torch.autograd.gradcheck(lambda *a: wt.rwkv7(*a, decay="log"), tuple(x.values()), eps=1e-3,
                                        atol=2e-3, rtol=2e-2, fast_mode=True)
    if wt.HAS_CUSTOM_OP and hasattr(torch.library, "opcheck"):
        torch.library.opcheck(torch.ops.wkv.rwkv7.default, (*x.values(), None, None, 2, 0, 0))


@needs_cuda_backend
def test_cuda_dlpack_producer_runs_on_the_current_stream(rng):
    from dlpack_producer import NumpyDLPackOnly

    class Recorder(NumpyDLPackOnly):
        streams = []

        def __dlpack__(self, **kwargs):
            Recorder.streams.append(kwargs.get("stream"))
            return super().__dlpack__(**kwargs)

    N = cuda_head_size()
    x = inputs(rng, 1, 5, 2, N, device="cuda")
    want, _ = wkv.rwkv7(*x.values())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y, s = wkv.rwkv7(*(Recorder(t) for t in x.values()))
    side.synchronize()
    assert isinstance(y, torch.Tensor) and y.device.type == "cuda"  # CUDA DLPack objects come back as torch
    assert Recorder.streams == [side.cuda_stream] * 6  # producers were asked to sync with our stream
    torch.testing.assert_close(y, want)
