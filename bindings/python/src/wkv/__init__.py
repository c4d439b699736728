"""wkv: Python bindings of libwkv, the WKV recurrences of RWKV-4, RWKV-5/6 and RWKV-7.

Quick start::

    import numpy as np, wkv
    B, T, H, N = 1, 16, 2, 64
    r, w, k, v, a, b = (np.random.randn(B, T, H, N).astype(np.float32) for _ in range(6))
    y, state = wkv.rwkv7(r, w, k, v, a, b, decay="clampw")          # numpy in, numpy out
    g = wkv.rwkv7_backward(r, w, k, v, a, b, dy=np.ones_like(y))     # g.dr ... g.dstate0

The same functions take PyTorch tensors (CPU or CUDA; differentiable when they require
grad; see :mod:`wkv.torch`) and any object speaking DLPack. Nothing is copied or converted
behind your back: see :mod:`wkv.ops` for the rules and the ``convert=`` escape hatch.

Errors raise :class:`WkvError` subclasses carrying the library's status and message.
``python -m wkv info`` shows the library, its backends and devices.
"""

from __future__ import annotations

__version__ = "0.1.0"

from ._lib import candidate_paths, library_path
from .context import (
    Context,
    backend_info,
    current_context,
    default_context,
    device_info,
    info,
    use_context,
)
from .errors import (
    AliasingError,
    BackendUnavailableError,
    BusyError,
    DeviceLostError,
    DeviceMismatchError,
    DTypeError,
    InternalError,
    InvalidArgumentError,
    NullPointerError,
    OutOfMemoryError,
    SequenceOffsetsError,
    ShapeError,
    SizeOverflowError,
    StructSizeError,
    UnsupportedError,
    WkvError,
    WorkspaceTooSmallError,
    error_class,
)
from .attention import attention, attention_backward, attention_configs
from .device import DeviceArray
from .ops import (
    Rwkv4Grads,
    Rwkv6Grads,
    Rwkv7Grads,
    WkvOutput,
    forward_scratch_size,
    rwkv4,
    rwkv4_backward,
    rwkv6,
    rwkv6_backward,
    rwkv7,
    rwkv7_backward,
    workspace_size,
)


def version() -> str:
    """The loaded libwkv's version string, e.g. ``"0.1.0"``."""
    from ._lib import load

    return load().wkv_version_string().decode()


__all__ = [
    "DeviceArray",
    "attention",
    "attention_backward",
    "attention_configs",
    "__version__", "version", "library_path", "candidate_paths",
    "Context", "default_context", "use_context", "current_context", "info", "backend_info", "device_info",
    "rwkv7", "rwkv7_backward", "rwkv6", "rwkv6_backward", "rwkv4", "rwkv4_backward", "workspace_size",
    "forward_scratch_size",
    "WkvOutput", "Rwkv7Grads", "Rwkv6Grads", "Rwkv4Grads",
    "WkvError", "NullPointerError", "InvalidArgumentError", "StructSizeError", "ShapeError", "DTypeError",
    "SizeOverflowError", "AliasingError", "DeviceMismatchError", "SequenceOffsetsError",
    "WorkspaceTooSmallError", "UnsupportedError", "BackendUnavailableError", "OutOfMemoryError", "BusyError",
    "DeviceLostError", "InternalError", "error_class",
]
