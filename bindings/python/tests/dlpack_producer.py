"""A DLPack producer written with ctypes for the tests: it exports a numpy array's memory (or
any pointer, device and shape it is told) as a versioned or legacy capsule, counts deleter
calls, and keeps every capsule it made so the tests can check they were consumed."""

from __future__ import annotations

import ctypes
from ctypes import c_char_p, c_int, c_int64, c_void_p, py_object

import numpy as np

from wkv import _dlpack as D

_new = ctypes.pythonapi.PyCapsule_New
_new.restype = py_object
_new.argtypes = [c_void_p, c_char_p, c_void_p]
_valid = ctypes.pythonapi.PyCapsule_IsValid
_valid.restype = c_int
_valid.argtypes = [py_object, c_char_p]


def capsule_name_is(capsule, name: bytes) -> bool:
    return bool(_valid(capsule, name))


_CODES = {np.dtype(np.float32): (2, 32), np.dtype(np.float16): (2, 16), np.dtype(np.float64): (2, 64),
          np.dtype(np.uint16): (1, 16)}


class Producer:
    """Exports `arr` (kept alive here) through __dlpack__.

    versioned: export DLManagedTensorVersioned (else DLManagedTensor, and refuse max_version
    like a pre-1.0 producer). read_only: set the read-only flag. device/shape/strides/major:
    override what the DLTensor says (for the error tests)."""

    def __init__(self, arr, versioned=True, read_only=False, device=(D.kDLCPU, 0), shape=None, strides="auto",
                 major=1):
        self.arr = arr
        self.versioned = versioned
        self.read_only = read_only
        self.device = device
        self.shape = tuple(arr.shape) if shape is None else tuple(shape)
        if strides == "auto":
            strides = None if shape is not None else tuple(s // arr.itemsize for s in arr.strides)
        self.strides = strides
        self.major = major
        self.deleted = 0
        self.capsules = []
        self.calls = []
        self._keep = []

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None, max_version=None, copy=None, dl_device=None):
        if not self.versioned and max_version is not None:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        self.calls.append(dict(stream=stream, max_version=max_version, copy=copy))
        nd = len(self.shape)
        shape = (c_int64 * max(nd, 1))(*self.shape)
        strides = (c_int64 * max(nd, 1))(*self.strides) if self.strides is not None else None
        code = _CODES[self.arr.dtype]
        if self.versioned:
            mt = D.DLManagedTensorVersioned()
            mt.version.major, mt.version.minor = self.major, 0
            mt.flags = D.DLPACK_FLAG_BITMASK_READ_ONLY if self.read_only else 0
            deleter = D.DLManagedTensorVersionedDeleter(self._on_delete)
            name = b"dltensor_versioned"
        else:
            mt = D.DLManagedTensor()
            deleter = D.DLManagedTensorDeleter(self._on_delete)
            name = b"dltensor"
        t = mt.dl_tensor
        t.data = self.arr.ctypes.data
        t.device.device_type, t.device.device_id = self.device
        t.ndim = nd
        t.dtype.code, t.dtype.bits, t.dtype.lanes = code[0], code[1], 1
        t.shape = ctypes.cast(shape, ctypes.POINTER(c_int64))
        t.strides = ctypes.cast(strides, ctypes.POINTER(c_int64)) if strides is not None else None
        mt.deleter = deleter
        self._keep += [mt, shape, strides, deleter]
        cap = _new(ctypes.addressof(mt), name, None)
        self.capsules.append(cap)
        return cap

    def _on_delete(self, ptr):
        self.deleted += 1

    def all_consumed(self) -> bool:
        used = b"used_dltensor_versioned" if self.versioned else b"used_dltensor"
        return all(capsule_name_is(c, used) for c in self.capsules)


class NumpyDLPackOnly:
    """Hides a numpy array behind __dlpack__/__dlpack_device__ alone (numpy's own producer)."""

    def __init__(self, arr):
        self._arr = arr

    def __dlpack__(self, **kwargs):
        return self._arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()
