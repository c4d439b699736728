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

    def __init__(self, message: str, status: Optional[int] = None) -> None:
        if status is None:
            status = self.STATUS if self.STATUS is not None else 16
        self.status: int = int(status)
        self.status_name: str = STATUS_NAMES.get(self.status, "WKV_STATUS_%d" % self.status)
        self.message: str = message
        super().__init__(message)

    def __str__(self) -> str:
        return "[%s] %s" % (self.status_name, self.message)

    def __reduce__(self):  # picklable across processes (e.g. DataLoader workers)
        return (make_error, (self.status, self.message))


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


def make_error(status: int, message: str) -> WkvError:
    """An exception instance for ``status`` carrying ``message``."""
    return error_class(status)(message, status)
