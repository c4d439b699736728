"""The DLPack path: numpy's own producer and a ctypes producer (versioned and legacy
capsules), ownership (capsules renamed, deleters called once), read-only flags, DLPack
outputs."""

from __future__ import annotations

import numpy as np
import pytest

import wkv
import reference as ref
from dlpack_producer import NumpyDLPackOnly, Producer
from wkv import _dlpack

TOL32 = 1e-5


def test_numpy_dlpack_producer_gives_numpy_outputs(rng):
    B, T, H, N = 2, 7, 2, 4
    x = ref.random_inputs(rng, B, T, H, N)
    s0 = (rng.standard_normal((B, H, N, N)) * 0.3).astype(np.float32)
    wrapped = [NumpyDLPackOnly(a) for a in x.values()]
    y, s = wkv.rwkv7(*wrapped, state=NumpyDLPackOnly(s0))
    assert type(y) is np.ndarray and type(s) is np.ndarray
    ry, rs = ref.rwkv7_forward(*x.values(), s0=s0)
    assert ref.rel_err(y, ry) < TOL32 and ref.rel_err(s, rs) < TOL32
    dy = rng.standard_normal(y.shape).astype(np.float32)
    g = wkv.rwkv7_backward(*wrapped, dy=NumpyDLPackOnly(dy), state=NumpyDLPackOnly(s0))
    want = ref.rwkv7_backward(*x.values(), dy, s0=s0)
    for n in ("dr", "dw", "dk", "dv", "da", "db"):
        assert ref.rel_err(getattr(g, n), want[n]) < TOL32


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_capsules_are_consumed_and_deleted_once(rng, versioned):
    B, T, H, N = 1, 5, 2, 4
    x = ref.random_inputs(rng, B, T, H, N)
    # strided inputs through DLPack too: every other channel of a wider array
    prods = []
    for a in x.values():
        big = np.zeros((B, T, H, 2 * N), np.float32)
        big[..., ::2] = a
        prods.append(Producer(big[..., ::2], versioned=versioned))
    y, s = wkv.rwkv7(*prods)
    assert ref.rel_err(y, ref.rwkv7_forward(*x.values())[0]) < TOL32
    for p in prods:
        assert len(p.capsules) == 1 and p.all_consumed() and p.deleted == 1
        if versioned:
            assert p.calls[0]["max_version"] == _dlpack.MAX_VERSION and p.calls[0]["copy"] is False
        assert p.calls[0]["stream"] is None  # host memory: no stream


def test_deleters_run_when_the_call_fails(rng):
    x = ref.random_inputs(rng, 1, 4, 1, 4)
    prods = [Producer(a) for a in x.values()]
    prods[0] = Producer(x["r"][:, :3].copy())  # wrong T
    with pytest.raises(wkv.ShapeError, match=r"r\.shape\[1\] is 3, expected 4"):
        wkv.rwkv7(*prods)
    assert all(p.deleted == 1 and p.all_consumed() for p in prods)


def test_dlpack_output_is_written_and_returned(rng):
    x = ref.random_inputs(rng, 1, 4, 2, 4)
    buf = np.full((1, 4, 2, 4), np.nan, np.float32)
    out = Producer(buf)
    y, _ = wkv.rwkv7(*x.values(), out=out)
    assert y is out and out.deleted == 1
    assert ref.rel_err(buf, ref.rwkv7_forward(*x.values())[0]) < TOL32


def test_read_only_dlpack_cannot_be_an_output(rng):
    x = ref.random_inputs(rng, 1, 4, 2, 4)
    out = Producer(np.zeros((1, 4, 2, 4), np.float32), read_only=True)
    with pytest.raises(wkv.InvalidArgumentError, match="out is read-only"):
        wkv.rwkv7(*x.values(), out=out)
    assert out.deleted == 1
    # as an input, read-only is fine
    y, _ = wkv.rwkv7(*[Producer(a, read_only=True) for a in x.values()])
    assert np.isfinite(y).all()


def test_unknown_major_version_is_left_unconsumed(rng):
    p = Producer(np.zeros((1, 2, 1, 4), np.float32), major=2)
    with pytest.raises(BufferError, match="version 2.0"):
        _dlpack.export(p, None)
    assert not p.all_consumed() and p.deleted == 0  # the producer's capsule destructor owns it


def test_a_consumed_capsule_is_refused():
    p = Producer(np.zeros((1, 2, 1, 4), np.float32))
    mt = _dlpack.export(p, None)
    with pytest.raises(BufferError, match="already consumed"):
        _dlpack.consume_capsule(p.capsules[0])
    mt.release()
    mt.release()  # idempotent
    assert p.deleted == 1


def test_device_the_backend_cannot_read_is_the_librarys_error(rng):
    x = ref.random_inputs(rng, 1, 3, 1, 4)
    fake_cuda = Producer(x["a"], device=(_dlpack.kDLCUDA, 0))  # never dereferenced: validation rejects it
    args = list(x.values())
    args[4] = fake_cuda
    with pytest.raises(wkv.DeviceMismatchError) as e:
        wkv.rwkv7(*args)
    assert "a.device.type is 2, which the cpu backend cannot read" in e.value.message
    assert fake_cuda.deleted == 1
