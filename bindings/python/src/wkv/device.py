"""Arrays in the library's own device memory (``wkv_buffer``): data that stays on the GPU
between calls, so a Vulkan (or CUDA) context runs without staging host memory on every call.

    ctx = wkv.Context("vulkan")
    state = wkv.DeviceArray((B, H, N, N), "float32", context=ctx)     # zero-filled
    r = wkv.DeviceArray.from_numpy(r_host, context=ctx)                 # uploaded
    for t in range(T):
        y, _ = wkv.rwkv7(r_t, w_t, k_t, v_t, a_t, b_t, state, state_out=state)   # stepped in place
    print(state.numpy())                                                # downloaded

Outputs of a call whose ``v`` is a DeviceArray are DeviceArrays of the same context (or the
``out=`` / ``state_out=`` you pass). A DeviceArray is contiguous; its buffer is freed when the
array is (or by :meth:`close`). Buffers exist on the Vulkan and CUDA backends; on the CPU
backend creating one raises :class:`wkv.UnsupportedError`.
"""

from __future__ import annotations

import math
from ctypes import byref, c_int64, c_void_p
from typing import Any, Optional, Sequence, Tuple

from . import _lib
from ._lib import load
from ._tensors import BF16, F16, F32
from .context import Context, current_context
from .errors import InvalidArgumentError

__all__ = ["DeviceArray"]

_CODES = {"float32": F32, "float16": F16, "bfloat16": BF16}


class DeviceArray:
    """A contiguous array of ``shape`` and ``dtype`` ("float32", "float16", "bfloat16") in a
    ``wkv_buffer`` of ``context`` (default: the :func:`wkv.use_context` one), zero-filled."""

    _wkv_device_array = True  # what wkv._tensors.kind_of recognises

    def __init__(self, shape: Sequence[int], dtype: str = "float32", *, context: Optional[Context] = None) -> None:
        self._handle = None
        ctx = context if context is not None else current_context()
        if ctx is None:
            raise InvalidArgumentError("wkv.DeviceArray: pass context= (a wkv.Context on a GPU backend)")
        if dtype not in _CODES:
            raise InvalidArgumentError("wkv.DeviceArray: dtype is %r: expected float32, float16 or bfloat16" % (dtype,))
        self.shape: Tuple[int, ...] = tuple(int(s) for s in shape)
        if any(s < 0 for s in self.shape):
            raise InvalidArgumentError("wkv.DeviceArray: shape %s has a negative size" % (self.shape,))
        self.dtype = dtype
        self.code_bits = _CODES[dtype]
        self.context = ctx
        self.nbytes = math.prod(self.shape) * (4 if dtype == "float32" else 2)
        buf = c_void_p()
        _lib.check(load().wkv_buffer_create(ctx.handle, max(self.nbytes, 1), byref(buf)), ctx.handle,
                   fn="wkv.DeviceArray")
        self._handle = buf.value

    @classmethod
    def from_numpy(cls, array: Any, *, context: Optional[Context] = None) -> "DeviceArray":
        """A DeviceArray holding a copy of a host array (float32, float16 or ml_dtypes.bfloat16)."""
        import numpy as np

        a = np.ascontiguousarray(array)
        name = "bfloat16" if a.dtype.name == "bfloat16" else a.dtype.name
        out = cls(a.shape, name, context=context)
        out.upload(a)
        return out

    @property
    def handle(self) -> int:
        if self._handle is None:
            raise ValueError("this wkv.DeviceArray is closed")
        return self._handle

    def upload(self, array: Any) -> None:
        """Copies a host array of the same shape and dtype in."""
        import numpy as np

        a = np.ascontiguousarray(array)
        if tuple(a.shape) != self.shape or (a.dtype.name != self.dtype):
            raise InvalidArgumentError("wkv.DeviceArray.upload: got %s %s, the array is %s %s" % (
                a.dtype.name, tuple(a.shape), self.dtype, self.shape))
        if self.nbytes:
            _lib.check(load().wkv_buffer_upload(self.context.handle, self.handle, 0, a.ctypes.data, self.nbytes),
                       self.context.handle, fn="wkv.DeviceArray.upload")

    def numpy(self) -> Any:
        """A host copy (numpy; bfloat16 as ml_dtypes.bfloat16 when installed, else uint16 bits)."""
        import numpy as np

        from ._tensors import numpy_dtype_for

        dt, _ = numpy_dtype_for(self.code_bits)
        out = np.empty(self.shape, dtype=dt)
        if self.nbytes:
            _lib.check(load().wkv_buffer_download(self.context.handle, self.handle, 0, out.ctypes.data,
                                                  self.nbytes), self.context.handle, fn="wkv.DeviceArray.numpy")
        return out

    def tensor(self) -> Tuple[Any, Any]:
        """(wkv_tensor, the shape array it points at) for a call."""
        shape = (c_int64 * max(len(self.shape), 1))(*self.shape)
        dt = _lib.wkv_dtype(self.code_bits[0], self.code_bits[1], 1)
        t = load().wkv_tensor_make_buffer(self.handle, 0, dt, len(self.shape), shape)
        return t, shape

    def close(self) -> None:
        if self._handle is not None:
            load().wkv_buffer_destroy(self._handle)
            self._handle = None

    def __enter__(self) -> "DeviceArray":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def __repr__(self) -> str:
        return "wkv.DeviceArray(shape=%s, dtype=%s, backend=%s)" % (self.shape, self.dtype, self.context.backend)
