"""DLPack consumption through ctypes: the structs of ``dlpack.h`` (written from the DLPack
specification, versions 0.8 and 1.x) and the capsule protocol.

The protocol, as this module follows it:

* ``obj.__dlpack_device__()`` gives ``(device_type, device_id)``;
* ``obj.__dlpack__(stream=..., max_version=(1, 1), copy=False)`` gives a ``PyCapsule`` named
  ``"dltensor_versioned"`` holding a ``DLManagedTensorVersioned*`` (producers that predate
  DLPack 1.0 do not accept ``max_version`` and give ``"dltensor"`` holding a
  ``DLManagedTensor*``). ``copy=False`` asks the producer never to copy; producers too old to
  know the keyword are asked without it;
* the consumer takes ownership by renaming the capsule to ``"used_dltensor_versioned"`` /
  ``"used_dltensor"`` (so the capsule's destructor no longer frees it) and calls the managed
  tensor's ``deleter`` exactly once when it no longer needs the memory. A capsule this module
  refuses (an unknown major version) is left unconsumed: its own destructor frees it.
"""

from __future__ import annotations

import ctypes
from ctypes import CFUNCTYPE, POINTER, Structure, c_char_p, c_int, c_int32, c_int64, c_uint8, \
    c_uint16, c_uint32, c_uint64, c_void_p, py_object
from typing import Any, Optional, Tuple

# DLDeviceType values used here (the full enum is larger).
kDLCPU = 1
kDLCUDA = 2
kDLCUDAHost = 3
kDLVulkan = 7
kDLCUDAManaged = 13

# DLDataTypeCode
kDLInt = 0
kDLUInt = 1
kDLFloat = 2
kDLBfloat = 4

# DLManagedTensorVersioned.flags
DLPACK_FLAG_BITMASK_READ_ONLY = 1 << 0
DLPACK_FLAG_BITMASK_IS_COPIED = 1 << 1
DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED = 1 << 2

#: The newest DLPack version whose layout this module reads.
MAX_VERSION = (1, 1)


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", DLDevice),
        ("ndim", c_int32),
        ("dtype", DLDataType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),  # in elements; NULL = compact row-major
        ("byte_offset", c_uint64),
    ]


class DLPackVersion(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class DLManagedTensor(Structure):
    pass


DLManagedTensorDeleter = CFUNCTYPE(None, POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", c_void_p),
    ("deleter", DLManagedTensorDeleter),
]


class DLManagedTensorVersioned(Structure):
    pass


DLManagedTensorVersionedDeleter = CFUNCTYPE(None, POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion),
    ("manager_ctx", c_void_p),
    ("deleter", DLManagedTensorVersionedDeleter),
    ("flags", c_uint64),
    ("dl_tensor", DLTensor),
]

# ----------------------------------------------------------------------------- capsule API

_api = ctypes.pythonapi
_api.PyCapsule_IsValid.argtypes = [py_object, c_char_p]
_api.PyCapsule_IsValid.restype = c_int
_api.PyCapsule_GetPointer.argtypes = [py_object, c_char_p]
_api.PyCapsule_GetPointer.restype = c_void_p
_api.PyCapsule_SetName.argtypes = [py_object, c_void_p]
_api.PyCapsule_SetName.restype = c_int


def _static_cstring(s: bytes) -> int:
    """A NUL-terminated copy of s that is never freed: PyCapsule_SetName stores the pointer,
    not the text, and a capsule may outlive any Python object holding the name."""
    buf = ctypes.create_string_buffer(s)
    _keep.append(buf)  # module-lifetime; see also the note in _consume
    return ctypes.addressof(buf)


_keep: list = []
_USED_VERSIONED = _static_cstring(b"used_dltensor_versioned")
_USED_LEGACY = _static_cstring(b"used_dltensor")


class ManagedTensor:
    """A consumed DLPack capsule: the DLTensor it describes, plus ownership.

    ``tensor`` stays valid until :meth:`release`, which calls the producer's deleter once.
    ``read_only`` is the producer's read-only flag (always False for pre-1.0 capsules, which
    cannot say).
    """

    __slots__ = ("tensor", "read_only", "version", "_ptr", "_deleter", "_released", "source")

    def __init__(self, tensor: DLTensor, read_only: bool, version: Tuple[int, int], ptr: Any,
                 deleter: Any, source: Any) -> None:
        self.tensor = tensor
        self.read_only = read_only
        self.version = version
        self._ptr = ptr
        self._deleter = deleter
        self._released = False
        self.source = source  # the exporting object, kept alive while we hold its memory

    def release(self) -> None:
        """Calls the producer's deleter (once); the tensor must not be used afterwards."""
        if self._released:
            return
        self._released = True
        if self._deleter:
            self._deleter(self._ptr)
        self._ptr = self._deleter = self.source = None

    def __del__(self) -> None:  # a forgotten release still frees the producer's memory
        try:
            self.release()
        except Exception:
            pass


def consume_capsule(capsule: Any, source: Any = None) -> ManagedTensor:
    """Takes ownership of a DLPack capsule (versioned or legacy) and returns it as a
    :class:`ManagedTensor`. Raises BufferError for anything that is not an unused DLPack
    capsule, and for versions this module cannot read (the capsule then stays unconsumed and
    frees itself)."""
    if _api.PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        addr = _api.PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        if not addr:
            raise BufferError("DLPack: the capsule holds a NULL DLManagedTensorVersioned")
        ptr = ctypes.cast(addr, POINTER(DLManagedTensorVersioned))
        mt = ptr.contents
        version = (int(mt.version.major), int(mt.version.minor))
        if version[0] != MAX_VERSION[0]:
            raise BufferError("DLPack: the producer gave a version %d.%d capsule; this package reads "
                              "major version %d" % (version[0], version[1], MAX_VERSION[0]))
        if mt.flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED:
            raise BufferError("DLPack: sub-byte padded dtypes are not supported")
        if _api.PyCapsule_SetName(capsule, _USED_VERSIONED) != 0:
            raise BufferError("DLPack: cannot mark the capsule as consumed")
        return ManagedTensor(mt.dl_tensor, bool(mt.flags & DLPACK_FLAG_BITMASK_READ_ONLY), version,
                             ptr, mt.deleter, source)
    if _api.PyCapsule_IsValid(capsule, b"dltensor"):
        addr = _api.PyCapsule_GetPointer(capsule, b"dltensor")
        if not addr:
            raise BufferError("DLPack: the capsule holds a NULL DLManagedTensor")
        ptr = ctypes.cast(addr, POINTER(DLManagedTensor))
        mt = ptr.contents
        if _api.PyCapsule_SetName(capsule, _USED_LEGACY) != 0:
            raise BufferError("DLPack: cannot mark the capsule as consumed")
        return ManagedTensor(mt.dl_tensor, False, (0, 0), ptr, mt.deleter, source)
    if _api.PyCapsule_IsValid(capsule, b"used_dltensor_versioned") or \
            _api.PyCapsule_IsValid(capsule, b"used_dltensor"):
        raise BufferError("DLPack: this capsule was already consumed")
    raise BufferError("DLPack: __dlpack__ did not return a DLPack capsule (got %s)"
                      % type(capsule).__name__)


def export(obj: Any, stream: Optional[int]) -> ManagedTensor:
    """Calls ``obj.__dlpack__`` (newest protocol first, no copies) and consumes the capsule."""
    attempts = (
        dict(stream=stream, max_version=MAX_VERSION, copy=False),
        dict(stream=stream, max_version=MAX_VERSION),
        dict(stream=stream),
        dict(),
    )
    last: Optional[BaseException] = None
    for kwargs in attempts:
        if "stream" in kwargs and kwargs["stream"] is None and len(kwargs) == 1:
            kwargs = {}
        try:
            capsule = obj.__dlpack__(**kwargs)
        except TypeError as e:  # a producer that predates these keywords
            last = e
            continue
        return consume_capsule(capsule, obj)
    raise TypeError("%s.__dlpack__ refused every calling convention: %s" % (type(obj).__name__, last))


def device_of(obj: Any) -> Tuple[int, int]:
    """``obj.__dlpack_device__()`` as two ints."""
    t, i = obj.__dlpack_device__()
    return int(t), int(i)
