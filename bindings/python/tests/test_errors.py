"""Every status maps to its exception class, raised with the library's message naming the
argument; and the Python layer's own refusals."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import wkv
import reference as ref
from dlpack_producer import Producer
from wkv import _lib
from wkv.errors import STATUS_NAMES


def _x(rng, B=1, T=4, H=1, N=4):
    return ref.random_inputs(rng, B, T, H, N)


def _raises(cls, status, *needles):
    """pytest.raises that also checks the status and that the message names things."""

    class _Ctx:
        def __enter__(self):
            self.cm = pytest.raises(cls)
            self.info = self.cm.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = self.cm.__exit__(*exc)
            e = self.info.value
            assert e.status == status and e.status_name == STATUS_NAMES[status]
            assert str(e).startswith("[%s] " % STATUS_NAMES[status])
            for n in needles:
                assert n in e.message, (n, e.message)
            if e.library_message != e.message:  # reworded for Python: no C field names left
                assert "desc->" not in e.message and "desc->" in e.library_message
            return handled

    return _Ctx()


def test_class_per_status():
    assert wkv.error_class(4) is wkv.ShapeError
    seen = set()
    for status, name in STATUS_NAMES.items():
        if status == 0:
            continue
        cls = wkv.error_class(status)
        assert issubclass(cls, wkv.WkvError) and cls is not wkv.WkvError
        assert cls.STATUS == status
        seen.add(cls)
    assert len(seen) == 16
    assert wkv.error_class(999) is wkv.WkvError  # a status from a newer library
    assert issubclass(wkv.ShapeError, ValueError) and issubclass(wkv.DTypeError, TypeError)
    assert issubclass(wkv.UnsupportedError, NotImplementedError)
    assert issubclass(wkv.OutOfMemoryError, MemoryError)


def test_shape(rng):
    x = _x(rng)
    x["k"] = x["k"][:, :3]
    with _raises(wkv.ShapeError, 4, "wkv.rwkv7: k.shape[1] is 3, expected 4"):
        wkv.rwkv7(*x.values())
    x = _x(rng)
    with _raises(wkv.ShapeError, 4, "v.ndim is 3, expected 4"):
        wkv.rwkv7(*(a[0] for a in x.values()))
    x = _x(rng)
    with _raises(wkv.ShapeError, 4, "state.shape[2] is 3, expected 4"):
        wkv.rwkv7(*x.values(), state=np.zeros((1, 1, 3, 4), np.float32))
    with _raises(wkv.ShapeError, 4, "dy.shape[1] is 2, expected 4"):
        wkv.rwkv7_backward(*x.values(), dy=np.zeros((1, 2, 1, 4), np.float32))


def test_dtype(rng):
    x = _x(rng)
    x["b"] = x["b"].astype(np.int32)
    with _raises(wkv.DTypeError, 5, "b.dtype int32 is not float32, float16 or bfloat16"):
        wkv.rwkv7(*x.values())
    x = _x(rng)
    with _raises(wkv.DTypeError, 5, "state must be float32"):
        wkv.rwkv7(*x.values(), state=np.zeros((1, 1, 4, 4), np.float16))
    with _raises(wkv.DTypeError, 5, "wkv.rwkv7: r has numpy dtype <c8"):  # the Python layer's own
        wkv.rwkv7(x["r"].astype(np.complex64), *list(x.values())[1:])


def test_aliasing(rng):
    x = _x(rng)
    with _raises(wkv.AliasingError, 7, "out overlaps r"):
        wkv.rwkv7(*x.values(), out=x["r"])
    s = np.zeros((1, 1, 4, 4), np.float32)
    with _raises(wkv.AliasingError, 7, "state_out may alias state_in only exactly"):
        wkv.rwkv7(*x.values(), state=s, state_out=s.swapaxes(2, 3))  # same memory, other strides
    self_overlapping = np.lib.stride_tricks.as_strided(np.zeros(4, np.float32), (1, 4, 1, 4), (0, 0, 0, 4))
    with _raises(wkv.AliasingError, 7, "out is an output whose strides make elements overlap"):
        wkv.rwkv7(*x.values(), out=self_overlapping)


def test_device_mismatch(rng):
    x = _x(rng)
    args = list(x.values())
    args[0] = Producer(x["r"], device=(2, 0))
    with _raises(wkv.DeviceMismatchError, 8, "r.device.type is 2"):
        wkv.rwkv7(*args)


def test_sequence_offsets(rng):
    x = _x(rng, T=6)
    with _raises(wkv.SequenceOffsetsError, 9, "seq_offsets[2] = 1 is less than seq_offsets[1] = 3"):
        wkv.rwkv7(*x.values(), seq_offsets=[0, 3, 1, 6])
    with _raises(wkv.SequenceOffsetsError, 9, "seq_offsets[2] is 5 but the total length T is 6"):
        wkv.rwkv7(*x.values(), seq_offsets=[0, 3, 5])
    x = _x(rng, B=2, T=6)
    with _raises(wkv.SequenceOffsetsError, 9, "packed sequences need B = 1"):
        wkv.rwkv7(*x.values(), seq_offsets=[0, 6])


def test_workspace_too_small(rng):
    x = _x(rng, T=40)
    dy = np.ones((1, 40, 1, 4), np.float32)
    with _raises(wkv.WorkspaceTooSmallError, 10, "workspace_size is 16 bytes; this call needs"):
        wkv.rwkv7_backward(*x.values(), dy=dy, workspace=np.empty(16, np.uint8))


def test_reuse_checkpoints_without_a_saving_forward(rng):
    x = _x(rng, T=40)
    dy = np.ones((1, 40, 1, 4), np.float32)
    ws = np.empty(wkv.workspace_size("rwkv7", x, dy), np.uint8)
    with _raises(wkv.InvalidArgumentError, 2, "workspace holds no checkpoints"):
        wkv.rwkv7_backward(*x.values(), dy=dy, workspace=ws, reuse_checkpoints=True)
    with pytest.raises(wkv.InvalidArgumentError, match="needs workspace="):
        wkv.rwkv7_backward(*x.values(), dy=dy, reuse_checkpoints=True)
    with _raises(wkv.WorkspaceTooSmallError, 10, "workspace_size is 16 bytes; this call needs"):
        wkv.rwkv7(*x.values(), workspace=np.empty(16, np.uint8))


def test_backend_unavailable():
    for name in ("cuda", "vulkan"):
        if not wkv.backend_info(name)["available"]:
            with _raises(wkv.BackendUnavailableError, 12, "wkv_context_create: backend %s is unavailable" % name):
                wkv.Context(name)
            return
    pytest.skip("every backend is available here")


def test_invalid_argument(rng):
    with _raises(wkv.InvalidArgumentError, 2, "options->cpu_threads is 5000"):
        wkv.Context("cpu", threads=5000)
    with _raises(wkv.InvalidArgumentError, 2, "options->device_index is -1"):
        wkv.Context("cpu", device=-1)
    x = _x(rng)
    with _raises(wkv.InvalidArgumentError, 2, "decay is 9"):
        wkv.rwkv7(*x.values(), decay=9)
    with _raises(wkv.InvalidArgumentError, 2, "wkv.rwkv7: decay is 'tanh'"):  # the Python layer's own
        wkv.rwkv7(*x.values(), decay="tanh")
    with _raises(wkv.InvalidArgumentError, 2, "wkv.rwkv7: state_layout is 'ij'"):
        wkv.rwkv7(*x.values(), state_layout="ij")


def test_size_overflow(rng):
    x = _x(rng)
    huge = Producer(np.zeros(4, np.float32), shape=(1 << 40, 1 << 40, 1, 4))
    args = list(x.values())
    args[3] = huge
    with _raises(wkv.SizeOverflowError, 6, "v: B*T*H*N bytes overflow int64"):
        wkv.rwkv7(*args)
    assert huge.deleted == 1


def test_null_pointer_and_struct_size_through_the_raw_abi():
    lib = _lib.load()
    opts = _lib.wkv_context_options()
    opts.struct_size = ctypes.sizeof(opts)
    with _raises(wkv.NullPointerError, 1, "wkv_context_create: out is NULL"):
        _lib.check(lib.wkv_context_create(ctypes.byref(opts), None))
    opts.struct_size = 8
    h = ctypes.c_void_p()
    with _raises(wkv.StructSizeError, 3, "options->struct_size is 8"):
        _lib.check(lib.wkv_context_create(ctypes.byref(opts), ctypes.byref(h)))
    with wkv.Context("cpu") as ctx:
        desc = _lib.wkv_forward_desc()  # struct_size 0
        with _raises(wkv.StructSizeError, 3, "desc->struct_size is 0"):
            _lib.check(lib.wkv_forward(ctx.handle, ctypes.byref(desc)), ctx.handle)
        assert "desc->struct_size is 0" in ctx.last_error


@pytest.mark.parametrize("status,cls", [(13, wkv.OutOfMemoryError), (14, wkv.BusyError),
                                        (15, wkv.DeviceLostError), (16, wkv.InternalError)])
def test_statuses_python_cannot_provoke(status, cls):
    # No public call can make the CPU backend run out of memory, lose its device, hit a bug, or
    # (Context serialises calls) be busy: check the mapping with the library's status text.
    with pytest.raises(cls) as e:
        _lib.check(status, fallback="wkv_forward")
    assert e.value.status == status and _lib.status_string(status).split(": ", 1)[1] in e.value.message


def test_python_layer_refusals(rng):
    x = _x(rng)
    with pytest.raises(TypeError, match="wkv.rwkv7: r is a list; expected a numpy array"):
        wkv.rwkv7(x["r"].tolist(), *list(x.values())[1:])
    with pytest.raises(TypeError, match="wkv.rwkv7_backward: dy is required"):
        wkv.rwkv7_backward(*x.values(), dy=None)
    with _raises(wkv.InvalidArgumentError, 2, "out has unknown keys ['dq']"):
        wkv.rwkv7_backward(*x.values(), dy=x["v"], out={"dq": x["v"]})
    with _raises(wkv.InvalidArgumentError, 2, "dtype is 'fp8'"):
        wkv.rwkv7(*x.values(), dtype="fp8")


def test_errors_pickle():
    import pickle

    e = wkv.ShapeError("desc->r.shape[1] is 3, expected 4")
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is wkv.ShapeError and e2.status == 4 and e2.message == e.message
