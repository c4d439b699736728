"""wkv.DeviceArray: the library's own device buffers from Python (Vulkan here, on lavapipe):
calls on them equal the host path, decode steps a state in place on the device, outputs stay
on the device, misuse is refused."""

from __future__ import annotations

import numpy as np
import pytest

import wkv
import reference as ref

VULKAN = wkv.backend_info("vulkan")["available"]
pytestmark = pytest.mark.skipif(not VULKAN, reason="no Vulkan device (lavapipe) here")


@pytest.fixture(scope="module")
def ctx():
    c = wkv.Context("vulkan")
    yield c
    c.close()


def test_forward_and_backward_on_device_arrays_equal_the_host_path(ctx, rng):
    x = ref.random_inputs(rng, 2, 7, 2, 16)
    s0 = rng.standard_normal((2, 2, 16, 16)).astype(np.float32)
    dy = rng.standard_normal((2, 7, 2, 16)).astype(np.float32)
    want = wkv.rwkv7(*x.values(), s0, context=ctx)
    g_want = wkv.rwkv7_backward(*x.values(), dy=dy, state=s0, context=ctx)
    d = {n: wkv.DeviceArray.from_numpy(a, context=ctx) for n, a in x.items()}
    ds0 = wkv.DeviceArray.from_numpy(s0, context=ctx)
    y, s = wkv.rwkv7(*d.values(), ds0)  # the arrays' context is the default
    assert isinstance(y, wkv.DeviceArray) and isinstance(s, wkv.DeviceArray) and y.context is ctx
    np.testing.assert_array_equal(y.numpy(), want.y)
    np.testing.assert_array_equal(s.numpy(), want.state)
    g = wkv.rwkv7_backward(*d.values(), dy=wkv.DeviceArray.from_numpy(dy, context=ctx), state=ds0)
    for name in ("dr", "dw", "dk", "dv", "da", "db", "dstate0"):
        np.testing.assert_allclose(getattr(g, name).numpy(), getattr(g_want, name), rtol=1e-5, atol=1e-6)


def test_decode_steps_the_state_in_place_on_the_device(ctx, rng):
    x = ref.random_inputs(rng, 1, 5, 2, 32)
    want_y, want_s = wkv.rwkv7(*x.values(), context=ctx)
    state = wkv.DeviceArray((1, 2, 32, 32), context=ctx)  # zero-filled
    out = wkv.DeviceArray((1, 1, 2, 32), context=ctx)
    ys = []
    for t in range(5):
        step = [wkv.DeviceArray.from_numpy(a[:, t:t + 1], context=ctx) for a in x.values()]
        y, s = wkv.rwkv7(*step, state, out=out, state_out=state)
        assert y is out and s is state
        ys.append(y.numpy())
    np.testing.assert_allclose(np.concatenate(ys, 1), want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state.numpy(), want_s, rtol=1e-5, atol=1e-6)


def test_bfloat16_round_trip_and_misuse(ctx, rng):
    ml = pytest.importorskip("ml_dtypes")
    a = rng.standard_normal((3, 5)).astype(ml.bfloat16)
    d = wkv.DeviceArray.from_numpy(a, context=ctx)
    assert d.dtype == "bfloat16" and d.nbytes == 30
    np.testing.assert_array_equal(d.numpy(), a)
    with pytest.raises(wkv.InvalidArgumentError, match="got float32 \\(3, 5\\), the array is bfloat16"):
        d.upload(np.zeros((3, 5), np.float32))
    with pytest.raises(wkv.InvalidArgumentError, match="dtype is 'float64'"):
        wkv.DeviceArray((2,), "float64", context=ctx)
    d.close()
    with pytest.raises(ValueError, match="closed"):
        d.numpy()
    with pytest.raises(wkv.UnsupportedError, match="cpu backend has no device buffers"):
        wkv.DeviceArray((2, 2), context=wkv.Context("cpu"))
    with pytest.raises(wkv.InvalidArgumentError, match="pass context="):
        wkv.DeviceArray((2, 2))
