"""Exceptions: one class per ``wkv_status``, all derived from :class:`WkvError`.

Every failing libwkv call raises the class of its status, carrying the status value and the
library's own message (``wkv_last_error``), which names the offending argument, e.g.::

    wkv.ShapeError: [WKV_ERROR_SHAPE] wkv_forward: desc->r.shape[1] is 5, expected 4

Each class also derives from the closest built-in exception (``ShapeError`` is a
``ValueError``, ``DTypeError`` a ``TypeError``, ``UnsupportedError`` a
``NotImplementedError``, ...), so generic ``except ValueError`` handlers keep working.

The Python layer raises the same classes for the problems it finds itself before calling the
library (an array it cannot hand over without a copy, an unknown decay name, ...); their
message starts with the Python function and argument, e.g. ``wkv.rwkv7: r: ...``.
"""

from __future__ import annotations

import re
from typing import Dict, Optional, Type

__all__ = [
    "WkvError",
    "NullPointerError",
    "InvalidArgumentError",
    "StructSizeError",
    "ShapeError",
    "DTypeError",
    "SizeOverflowError",
    "AliasingError",
    "DeviceMismatchError",
    "SequenceOffsetsError",
    "WorkspaceTooSmallError",
    "UnsupportedError",
    "BackendUnavailableError",
    "OutOfMemoryError",
    "BusyError",
    "DeviceLostError",
    "InternalError",
    "STATUS_NAMES",
    "error_class",
    "make_error",
    "pythonic",
]

#: wkv_status values (pinned forever by the C ABI) and their names.
STATUS_NAMES: Dict[int, str] = {
    0: "WKV_OK",
    1: "WKV_ERROR_NULL_POINTER",
    2: "WKV_ERROR_INVALID_ARGUMENT",
    3: "WKV_ERROR_STRUCT_SIZE",
    4: "WKV_ERROR_SHAPE",
    5: "WKV_ERROR_DTYPE",
    6: "WKV_ERROR_OVERFLOW",
    7: "WKV_ERROR_ALIASING",
    8: "WKV_ERROR_DEVICE_MISMATCH",
    9: "WKV_ERROR_SEQUENCE_OFFSETS",
    10: "WKV_ERROR_WORKSPACE_TOO_SMALL",
    11: "WKV_ERROR_UNSUPPORTED",
    12: "WKV_ERROR_BACKEND_UNAVAILABLE",
    13: "WKV_ERROR_OUT_OF_MEMORY",
    14: "WKV_ERROR_BUSY",
    15: "WKV_ERROR_DEVICE_LOST",
    16: "WKV_ERROR_INTERNAL",
}


class WkvError(Exception):
    """Base class of every libwkv error.

    Attributes:
        status: the ``wkv_status`` value (an ``int``; ``WkvError.STATUS`` of the class).
        status_name: its name, e.g. ``"WKV_ERROR_SHAPE"``.
        message: the library's message (``wkv_last_error``) or the Python layer's, naming the
            argument that was wrong.
    """

    #: The wkv_status this class stands for (None only for the base class).
    STATUS: Optional[int] = None

    def __init__(self, message: str, status: Optional[int] = None, library_message: Optional[str] = None) -> None:
        if status is None:
            status = self.STATUS if self.STATUS is not None else 16
        self.status: int = int(status)
        self.status_name: str = STATUS_NAMES.get(self.status, "WKV_STATUS_%d" % self.status)
        self.message: str = message
        #: the C library's wording (``desc->state_in``, DLPack codes) when ``message`` was
        #: reworded for Python; else the same as ``message``
        self.library_message: str = library_message if library_message is not None else message
        super().__init__(message)

    def __str__(self) -> str:
        return "[%s] %s" % (self.status_name, self.message)

    def __reduce__(self):  # picklable across processes (e.g. DataLoader workers)
        return (make_error, (self.status, self.message, self.library_message))


class NullPointerError(WkvError):
    """WKV_ERROR_NULL_POINTER: a required pointer is NULL."""

    STATUS = 1


class InvalidArgumentError(WkvError, ValueError):
    """WKV_ERROR_INVALID_ARGUMENT: an argument has a value outside its domain."""

    STATUS = 2


class StructSizeError(WkvError):
    """WKV_ERROR_STRUCT_SIZE: struct_size does not match a known version of the struct
    (the package and the loaded library disagree about the ABI)."""

    STATUS = 3


class ShapeError(WkvError, ValueError):
    """WKV_ERROR_SHAPE: tensor shapes are non-positive or inconsistent."""

    STATUS = 4


class DTypeError(WkvError, TypeError):
    """WKV_ERROR_DTYPE: a tensor has a dtype this argument does not accept."""

    STATUS = 5


class SizeOverflowError(WkvError, OverflowError):
    """WKV_ERROR_OVERFLOW: a size or byte offset overflows 64-bit arithmetic."""

    STATUS = 6


class AliasingError(WkvError, ValueError):
    """WKV_ERROR_ALIASING: an output overlaps another tensor."""

    STATUS = 7


class DeviceMismatchError(WkvError, ValueError):
    """WKV_ERROR_DEVICE_MISMATCH: a tensor lives in a memory space the backend cannot use."""

    STATUS = 8


class SequenceOffsetsError(WkvError, ValueError):
    """WKV_ERROR_SEQUENCE_OFFSETS: packed-sequence offsets are invalid."""

    STATUS = 9


class WorkspaceTooSmallError(WkvError, ValueError):
    """WKV_ERROR_WORKSPACE_TOO_SMALL: the workspace is smaller than wkv_workspace_size."""

    STATUS = 10


class UnsupportedError(WkvError, NotImplementedError):
    """WKV_ERROR_UNSUPPORTED: the backend does not implement this op/dtype/size."""

    STATUS = 11


class BackendUnavailableError(WkvError, RuntimeError):
    """WKV_ERROR_BACKEND_UNAVAILABLE: the requested backend is not present or usable."""

    STATUS = 12


class OutOfMemoryError(WkvError, MemoryError):
    """WKV_ERROR_OUT_OF_MEMORY: an allocation failed."""

    STATUS = 13


class BusyError(WkvError, RuntimeError):
    """WKV_ERROR_BUSY: another call is running on this context.

    :class:`wkv.Context` serialises its own calls with a lock, so Python code only sees this
    when the same native context is also driven from elsewhere."""

    STATUS = 14


class DeviceLostError(WkvError, RuntimeError):
    """WKV_ERROR_DEVICE_LOST: the device failed; the context can only be destroyed."""

    STATUS = 15


class InternalError(WkvError, RuntimeError):
    """WKV_ERROR_INTERNAL: a bug in libwkv (please report it)."""

    STATUS = 16


_BY_STATUS: Dict[int, Type[WkvError]] = {
    cls.STATUS: cls  # type: ignore[misc]
    for cls in (
        NullPointerError,
        InvalidArgumentError,
        StructSizeError,
        ShapeError,
        DTypeError,
        SizeOverflowError,
        AliasingError,
        DeviceMismatchError,
        SequenceOffsetsError,
        WorkspaceTooSmallError,
        UnsupportedError,
        BackendUnavailableError,
        OutOfMemoryError,
        BusyError,
        DeviceLostError,
        InternalError,
    )
}


def error_class(status: int) -> Type[WkvError]:
    """The exception class for a ``wkv_status`` value (:class:`WkvError` for unknown ones,
    i.e. statuses added by a newer library)."""
    return _BY_STATUS.get(int(status), WkvError)


def make_error(status: int, message: str, library_message: Optional[str] = None) -> WkvError:
    """An exception instance for ``status`` carrying ``message``."""
    return error_class(status)(message, status, library_message)


#: C descriptor fields whose Python argument has another name
_PY_NAMES = {"state_in": "state", "y": "out", "dstate_out": "dstate", "dstate_in": "dstate0",
             "decay_form": "decay"}
_DL_KINDS = {0: "int", 1: "uint", 2: "float", 4: "bfloat"}


def _dtype_name(m: "re.Match[str]") -> str:
    code, bits, lanes = int(m.group(1)), int(m.group(2)), int(m.group(3))
    kind = _DL_KINDS.get(code)
    name = "%s%d" % (kind, bits) if kind and lanes == 1 else "DLPack code %d, bits %d, lanes %d" % (code, bits, lanes)
    return "dtype %s" % name


def pythonic(message: str, fn: str) -> str:
    """The library's message for a call made by the Python function ``fn``, in Python's terms:
    the function's name for the C entry point, the argument names (``state`` for
    ``desc->state_in``, ``out`` for ``desc->y``, ``dstate`` for ``desc->dstate_out``), dtypes by
    name (``float64``, not ``code 2, bits 64``), and for a 16-bit unsigned array how to pass
    bfloat16."""
    msg = re.sub(r"^wkv_(?:forward|backward|workspace_size|forward_scratch_size|attention_backward|attention|attention_configs): ", fn + ": ",
                 message, count=1)
    msg = re.sub(r"desc->(?:forward->)?([A-Za-z_0-9]+)", lambda m: _PY_NAMES.get(m.group(1), m.group(1)), msg)
    msg = re.sub(r"dtype \(code (\d+), bits (\d+), lanes (\d+)\)", _dtype_name, msg)
    if "dtype uint16" in msg:
        msg += " (bfloat16 bit patterns in a numpy uint16 array: pass dtype='bf16', or use ml_dtypes.bfloat16)"
    return msg
