"""The numpy path against the float64 reference (tests/reference.py): fresh random inputs,
every decay form, states, packing, layouts, 16-bit dtypes, strides, poisoned outputs."""

from __future__ import annotations

import numpy as np
import pytest

import wkv
import reference as ref

FORMS = ["clampw", "log", "exp_neg_exp", "direct"]
TOL32 = 1e-5  # float32 vs float64, norm-wise (the library lands near 1e-7)
TOL16 = 1e-2


def poisoned(shape, dtype=np.float32):
    a = np.empty(shape, dtype)
    a.view(np.uint8).fill(0xFF)  # NaN in every float format
    return a


def check_forward(got, want, tol=TOL32):
    y, s = got
    ry, rs = want
    assert ref.rel_err(y, ry) < tol, ref.rel_err(y, ry)
    assert ref.rel_err(s, rs) < tol, ref.rel_err(s, rs)


def check_grads(g, want, names=("dr", "dw", "dk", "dv", "da", "db"), tol=TOL32):
    for n in names:
        e = ref.rel_err(getattr(g, n), want[n])
        assert e < tol, (n, e)
    e = ref.rel_err(g.dstate0, want["ds0"])
    assert e < tol, ("dstate0", e)


@pytest.mark.parametrize("form", FORMS)
def test_forward_backward_match_reference(rng, form):
    B, T, H, N = 2, 9, 2, 8
    x = ref.random_inputs(rng, B, T, H, N, form)
    s0 = (rng.standard_normal((B, H, N, N)) * 0.3).astype(np.float32)
    dy = rng.standard_normal((B, T, H, N)).astype(np.float32)
    dsT = rng.standard_normal((B, H, N, N)).astype(np.float32)
    y_out, s_out = poisoned((B, T, H, N)), poisoned((B, H, N, N))
    res = wkv.rwkv7(*x.values(), state=s0, decay=form, out=y_out, state_out=s_out)
    assert res.y is y_out and res.state is s_out
    check_forward(res, ref.rwkv7_forward(*x.values(), s0=s0, form=form))
    out = {n: poisoned((B, T, H, N)) for n in ("dr", "dw", "dk", "dv", "da", "db")}
    out["dstate0"] = poisoned((B, H, N, N))
    g = wkv.rwkv7_backward(*x.values(), dy=dy, state=s0, dstate=dsT, decay=form, out=out)
    assert g.dr is out["dr"] and g.dstate0 is out["dstate0"]
    check_grads(g, ref.rwkv7_backward(*x.values(), dy, s0=s0, dsT=dsT, form=form))


def test_defaults_allocate_numpy_and_zero_state(rng):
    B, T, H, N = 1, 5, 3, 4
    x = ref.random_inputs(rng, B, T, H, N)
    y, s = wkv.rwkv7(*x.values())
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (B, T, H, N)
    assert isinstance(s, np.ndarray) and s.dtype == np.float32 and s.shape == (B, H, N, N)
    check_forward((y, s), ref.rwkv7_forward(*x.values()))
    dy = rng.standard_normal(y.shape).astype(np.float32)
    g = wkv.rwkv7_backward(*x.values(), dy=dy)
    assert isinstance(g, wkv.Rwkv7Grads) and all(isinstance(t, np.ndarray) for t in g)
    check_grads(g, ref.rwkv7_backward(*x.values(), dy))


def test_key_major_state_layout(rng):
    B, T, H, N = 2, 6, 1, 5
    x = ref.random_inputs(rng, B, T, H, N)
    s0 = (rng.standard_normal((B, H, N, N)) * 0.3).astype(np.float32)
    y, s = wkv.rwkv7(*x.values(), state=np.ascontiguousarray(s0.swapaxes(-1, -2)), state_layout="kv")
    ry, rs = ref.rwkv7_forward(*x.values(), s0=s0)
    assert ref.rel_err(y, ry) < TOL32
    assert ref.rel_err(s.swapaxes(-1, -2), rs) < TOL32
    # a transposed *view* is the same thing, through strides
    y2, _ = wkv.rwkv7(*x.values(), state=s0.swapaxes(-1, -2).swapaxes(-1, -2))
    assert ref.rel_err(y2, ry) < TOL32


def test_packed_sequences(rng):
    H, N = 2, 4
    offsets = [0, 3, 3, 10]  # an empty middle sequence passes its state through
    T = offsets[-1]
    x = ref.random_inputs(rng, 1, T, H, N)
    s0 = (rng.standard_normal((3, H, N, N)) * 0.3).astype(np.float32)
    y, s = wkv.rwkv7(*x.values(), state=s0, seq_offsets=offsets)
    assert s.shape == (3, H, N, N)
    ry, rs = ref.rwkv7_forward(*x.values(), s0=s0, seq_offsets=offsets)
    check_forward((y, s), (ry, rs))
    np.testing.assert_array_equal(s[1], s0[1])
    dy = rng.standard_normal(y.shape).astype(np.float32)
    g = wkv.rwkv7_backward(*x.values(), dy=dy, state=s0, seq_offsets=np.array(offsets))
    check_grads(g, ref.rwkv7_backward(*x.values(), dy, s0=s0, seq_offsets=offsets))


def test_rnn_stepping_in_place_equals_one_call(rng):
    B, T, H, N = 2, 7, 2, 4
    x = ref.random_inputs(rng, B, T, H, N)
    y_all, s_all = wkv.rwkv7(*x.values())
    state = np.zeros((B, H, N, N), np.float32)
    for t in range(T):
        step = [a[:, t:t + 1] for a in x.values()]
        y_t, s_ret = wkv.rwkv7(*step, state=state, state_out=state)  # in place
        assert s_ret is state
        np.testing.assert_allclose(y_t[:, 0], y_all[:, t], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state, s_all, rtol=1e-5, atol=1e-6)


def test_strided_inputs(rng):
    B, T, H, N = 2, 6, 2, 4
    x = ref.random_inputs(rng, B, T, H, N)
    want = ref.rwkv7_forward(*x.values())
    # every input a non-contiguous view: inside a bigger buffer, time reversed twice, permuted
    views = []
    for a in x.values():
        big = np.full((B, 2 * T, H, 3 * N), np.nan, np.float32)
        big[:, ::2, :, 1::3] = a
        views.append(big[:, ::2, :, 1::3])
    r, w, k, v, a_, b = views
    v_perm = np.ascontiguousarray(np.transpose(x["v"], (2, 0, 3, 1))).transpose(1, 3, 0, 2)  # strides permuted
    r_rev = np.ascontiguousarray(x["r"][:, ::-1])[:, ::-1]  # negative T stride
    assert not v_perm.flags.c_contiguous and r_rev.strides[1] < 0
    check_forward(wkv.rwkv7(r, w, k, v, a_, b), want)
    check_forward(wkv.rwkv7(r_rev, w, k, v_perm, a_, b), want)
    # a strided output
    out_big = poisoned((B, T, H, 2 * N))
    y, _ = wkv.rwkv7(r, w, k, v, a_, b, out=out_big[..., ::2])
    assert ref.rel_err(y, want[0]) < TOL32
    assert np.isnan(out_big[..., 1::2]).all()  # untouched


def test_broadcast_stride_zero_input(rng):
    B, T, H, N = 1, 5, 2, 4
    x = ref.random_inputs(rng, B, T, H, N)
    w_const = x["w"][:, :1]
    x["w"] = np.broadcast_to(w_const, (B, T, H, N))  # T-stride 0
    assert x["w"].strides[1] == 0
    check_forward(wkv.rwkv7(*x.values()), ref.rwkv7_forward(*x.values()))
    dy = rng.standard_normal((B, T, H, N)).astype(np.float32)
    g = wkv.rwkv7_backward(*x.values(), dy=dy)
    assert g.dw.shape == (B, T, H, N)  # a broadcast input gets a full-shape gradient
    check_grads(g, ref.rwkv7_backward(*x.values(), dy))


def test_non_element_byte_strides_raise_unless_convert(rng):
    B, T, H, N = 1, 3, 1, 4
    x = ref.random_inputs(rng, B, T, H, N)
    raw = np.zeros(B * T * H * N * 4 + 2, np.uint8)
    odd = np.ndarray((B, T, H, N), np.float32, buffer=raw, offset=2)  # misaligned by 2 bytes
    odd[...] = x["r"]
    packed = np.lib.stride_tricks.as_strided(raw[:-2].view(np.float32), (B, T, H, N), (48, 16, 16, 4))
    bad = np.ndarray((B, T, H, N), np.float32, buffer=np.zeros(200, np.uint8), strides=(96, 30, 30, 6))
    for arr in (odd, bad):
        with pytest.raises(wkv.InvalidArgumentError, match=r"wkv.rwkv7: r: numpy byte strides"):
            wkv.rwkv7(arr, *list(x.values())[1:])
    y, _ = wkv.rwkv7(odd, *list(x.values())[1:], convert=True)
    assert ref.rel_err(y, ref.rwkv7_forward(*x.values())[0]) < TOL32
    del packed


def test_float64_is_refused_by_the_library_unless_convert(rng):
    x = ref.random_inputs(rng, 1, 4, 1, 4, dtype=np.float64)
    with pytest.raises(wkv.DTypeError) as e:
        wkv.rwkv7(*x.values())
    assert "r.dtype float64" in e.value.message and "desc->r.dtype (code 2, bits 64" in e.value.library_message  # the library's own message
    y, s = wkv.rwkv7(*x.values(), convert=True)
    assert y.dtype == np.float32
    check_forward((y, s), ref.rwkv7_forward(*x.values()))
    # sequences, with convert
    y2, _ = wkv.rwkv7(*(a.tolist() for a in x.values()), convert=True)
    np.testing.assert_array_equal(y, y2)


def test_float16_inputs(rng):
    B, T, H, N = 2, 8, 2, 8
    x = ref.random_inputs(rng, B, T, H, N, dtype=np.float16)
    y, s = wkv.rwkv7(*x.values())
    assert y.dtype == np.float16 and s.dtype == np.float32
    check_forward((y, s), ref.rwkv7_forward(*x.values()), TOL16)
    dy = rng.standard_normal(y.shape).astype(np.float16)
    g = wkv.rwkv7_backward(*x.values(), dy=dy)
    assert g.dr.dtype == np.float16 and g.dstate0.dtype == np.float32
    check_grads(g, ref.rwkv7_backward(*x.values(), dy), tol=TOL16)


def test_mixed_dtypes_each_its_own(rng):
    B, T, H, N = 1, 6, 1, 4
    x = ref.random_inputs(rng, B, T, H, N)
    x["r"] = x["r"].astype(np.float16)
    y, _ = wkv.rwkv7(*x.values())
    assert y.dtype == np.float32  # y follows v
    assert ref.rel_err(y, ref.rwkv7_forward(*x.values())[0]) < TOL16


def _to_bf16_bits(a):
    u = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even


def _from_bf16_bits(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def test_bfloat16_as_uint16_bits(rng):
    B, T, H, N = 1, 8, 2, 8
    x = ref.random_inputs(rng, B, T, H, N)
    bits = {n: _to_bf16_bits(a) for n, a in x.items()}
    rounded = {n: _from_bf16_bits(b) for n, b in bits.items()}
    with pytest.raises(wkv.DTypeError, match=r"wkv\.rwkv7: r\.dtype uint16 .*pass dtype='bf16', or use ml_dtypes"):
        wkv.rwkv7(*bits.values())  # uint16 without dtype="bf16" is just uint16: refused, with the hint
    y, s = wkv.rwkv7(*bits.values(), dtype="bf16")
    assert y.dtype == np.uint16 and s.dtype == np.float32
    check_forward((_from_bf16_bits(y), s), ref.rwkv7_forward(*rounded.values()), TOL16)
    dy = _to_bf16_bits(rng.standard_normal(y.shape))
    g = wkv.rwkv7_backward(*bits.values(), dy=dy, dtype="bf16")
    assert g.dk.dtype == np.uint16
    want = ref.rwkv7_backward(*rounded.values(), _from_bf16_bits(dy))
    for n in ("dr", "dw", "dk", "dv", "da", "db"):
        assert ref.rel_err(_from_bf16_bits(getattr(g, n)), want[n]) < TOL16, n


def test_bfloat16_with_ml_dtypes(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes not installed (bf16 via uint16 is tested)")
    B, T, H, N = 1, 8, 2, 8
    x = {n: a.astype(ml_dtypes.bfloat16) for n, a in ref.random_inputs(rng, B, T, H, N).items()}
    y, s = wkv.rwkv7(*x.values())
    assert y.dtype == np.dtype(ml_dtypes.bfloat16)
    f32 = {n: a.astype(np.float32) for n, a in x.items()}
    check_forward((y.astype(np.float32), s), ref.rwkv7_forward(*f32.values()), TOL16)


def test_read_only_inputs_are_fine_outputs_are_not(rng):
    x = ref.random_inputs(rng, 1, 3, 1, 4)
    for a in x.values():
        a.flags.writeable = False
    y, _ = wkv.rwkv7(*x.values())
    ro = np.zeros_like(y)
    ro.flags.writeable = False
    with pytest.raises(wkv.InvalidArgumentError, match="wkv.rwkv7: out is a read-only numpy array"):
        wkv.rwkv7(*x.values(), out=ro)


def test_workspace_reuse(rng):
    B, T, H, N = 1, 40, 2, 4
    x = ref.random_inputs(rng, B, T, H, N)
    dy = rng.standard_normal((B, T, H, N)).astype(np.float32)
    n = wkv.workspace_size("rwkv7", x, dy)
    assert n > 0
    ws = np.empty(n, np.uint8)
    g1 = wkv.rwkv7_backward(*x.values(), dy=dy, workspace=ws)
    g2 = wkv.rwkv7_backward(*x.values(), dy=dy, workspace=ws)
    for a, b in zip(g1, g2):
        np.testing.assert_array_equal(a, b)
    check_grads(g1, ref.rwkv7_backward(*x.values(), dy))


def test_forward_saves_checkpoints_for_the_backward(rng):
    # forward(workspace=ws) + backward(workspace=ws, reuse_checkpoints=True) gives what the
    # backward that recomputes gives, bit for bit; the forward's y does not change by saving
    B, T, H, N = 2, 70, 2, 16
    x = ref.random_inputs(rng, B, T, H, N)
    s0 = (rng.standard_normal((B, H, N, N)) * 0.3).astype(np.float32)
    dy = rng.standard_normal((B, T, H, N)).astype(np.float32)
    ws = np.empty(wkv.workspace_size("rwkv7", x, dy, state=s0), np.uint8)
    y0, _ = wkv.rwkv7(*x.values(), state=s0)
    g0 = wkv.rwkv7_backward(*x.values(), dy=dy, state=s0, workspace=ws)
    ws.fill(0xFF)
    y1, _ = wkv.rwkv7(*x.values(), state=s0, workspace=ws)
    np.testing.assert_array_equal(y0, y1)
    g1 = wkv.rwkv7_backward(*x.values(), dy=dy, state=s0, workspace=ws, reuse_checkpoints=True)
    for a, b in zip(g0, g1):
        np.testing.assert_array_equal(a, b)
    check_grads(g1, ref.rwkv7_backward(*x.values(), dy, s0=s0))


def test_forward_scratch(rng):
    # the CPU backend needs no forward scratch: the size is 0 for every op, and a scratch given
    # is neither read nor written; the results are the same bits
    B, T, H, N = 1, 40, 2, 8
    x = ref.random_inputs(rng, B, T, H, N)
    assert wkv.forward_scratch_size("rwkv7", x) == 0
    y0, s0 = wkv.rwkv7(*x.values())
    scratch = np.full(256, 0xCD, np.uint8)
    y1, s1 = wkv.rwkv7(*x.values(), scratch=scratch)
    np.testing.assert_array_equal(y0, y1)
    np.testing.assert_array_equal(s0, s1)
    assert (scratch == 0xCD).all()
    with pytest.raises(TypeError, match="scratch"):
        wkv.rwkv7(*x.values(), scratch=[0] * 8)
    with pytest.raises(wkv.ShapeError, match="wkv.forward_scratch_size"):
        wkv.forward_scratch_size("rwkv7", dict(x, k=x["k"][:, :5]))


def test_explicit_context_and_threads(rng):
    x = ref.random_inputs(rng, 2, 33, 2, 8)
    want = ref.rwkv7_forward(*x.values())
    for threads in (1, 2):
        with wkv.Context("cpu", threads=threads) as ctx:
            check_forward(wkv.rwkv7(*x.values(), context=ctx), want)
            with wkv.use_context(ctx):
                assert wkv.current_context() is ctx
                check_forward(wkv.rwkv7(*x.values()), want)
        assert wkv.current_context() is None
