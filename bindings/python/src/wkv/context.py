"""Contexts (a backend, a device, CPU threads, a log callback) and introspection."""

from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager
from ctypes import byref, c_size_t, c_void_p, sizeof
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from . import _lib
from ._lib import (
    BACKEND_CODES,
    BACKEND_NAMES,
    DECAY_NAMES,
    DTYPE_BITS_NAMES,
    LOG_LEVEL_CODES,
    LOG_LEVEL_NAMES,
    OP_NAMES,
    WKV_BACKEND_CPU,
    WKV_BACKEND_CUDA,
    WKV_BACKEND_VULKAN,
    WKV_DEVICE_CUDA,
    WKV_DEVICE_CUDA_MANAGED,
    WKV_DEVICE_VULKAN,
    check,
    load,
)
from .errors import InvalidArgumentError, UnsupportedError

__all__ = ["Context", "default_context", "use_context", "current_context", "info", "backend_info",
           "device_info"]

LogCallback = Callable[[str, str], None]

_registry: "weakref.WeakValueDictionary[int, Context]" = weakref.WeakValueDictionary()
_next_id = [1]
_id_lock = threading.Lock()


class Context:
    """A libwkv context: the backend it runs on, its device and CPU threads.

    Args:
        backend: ``"auto"`` (CUDA, else Vulkan, else CPU; the ``WKV_BACKEND`` environment
            variable overrides), ``"cpu"``, ``"cuda"`` or ``"vulkan"``.
        device: GPU ordinal.
        threads: CPU backend threads; 0 means ``WKV_NUM_THREADS`` or every core.
        log: optional ``log(level, message)`` callable, ``level`` one of ``"error"``,
            ``"warn"``, ``"info"``, ``"debug"``; called on the thread making the call.
        log_level: the most verbose level passed to ``log`` (default ``"warn"``; ``"info"``
            also reports which backend was chosen and why).

    Raises:
        BackendUnavailableError: the backend asked for is not present (the message says why).
        InvalidArgumentError: an option is out of range.

    A native context is externally synchronised; this object holds a lock around every call,
    so one Context may be shared by Python threads (their calls then run one at a time). It is
    closed by :meth:`close`, by ``with``, or when garbage-collected.
    """

    def __init__(self, backend: str = "auto", device: int = 0, threads: int = 0,
                 log: Optional[LogCallback] = None, log_level: Optional[str] = None) -> None:
        lib = load()
        if isinstance(backend, str):
            if backend.lower() not in BACKEND_CODES:
                raise InvalidArgumentError("wkv.Context: backend is %r: expected 'auto', 'cpu', 'cuda' or "
                                           "'vulkan'" % backend)
            code = BACKEND_CODES[backend.lower()]
        else:
            code = int(backend)
        opts = _lib.wkv_context_options()
        opts.struct_size = sizeof(opts)
        opts.backend = code
        opts.device_index = int(device)
        opts.cpu_threads = int(threads)
        self._log_user = log
        self._log_cb = None
        if log is not None:
            if not callable(log):
                raise TypeError("wkv.Context: log must be callable as log(level, message)")
            self._log_cb = _lib.wkv_log_fn(self._on_log)
            opts.log = self._log_cb
        if log_level is not None:
            if log_level not in LOG_LEVEL_CODES:
                raise InvalidArgumentError("wkv.Context: log_level is %r: expected 'error', 'warn', 'info' "
                                           "or 'debug'" % (log_level,))
            opts.log_level = LOG_LEVEL_CODES[log_level]
        handle = c_void_p()
        check(lib.wkv_context_create(byref(opts), byref(handle)), None, "wkv_context_create")
        self._handle: Optional[int] = handle.value
        self._lock = threading.RLock()
        self.backend: str = BACKEND_NAMES.get(lib.wkv_context_backend(self._handle), "?")
        self.device: int = int(device)
        self.threads: int = int(threads)
        with _id_lock:
            self.id: int = _next_id[0]
            _next_id[0] += 1
        _registry[self.id] = self

    def _on_log(self, user_data: Any, level: int, message: bytes) -> None:
        try:
            cb = self._log_user
            if cb is not None:
                cb(LOG_LEVEL_NAMES.get(level, str(level)), message.decode("utf-8", "replace") if message else "")
        except BaseException:  # never unwind into C
            import traceback

            traceback.print_exc()

    @property
    def handle(self) -> int:
        """The native ``wkv_context*`` as an int (raises ValueError once closed)."""
        if self._handle is None:
            raise ValueError("this wkv.Context is closed")
        return self._handle

    @property
    def closed(self) -> bool:
        return self._handle is None

    @property
    def lock(self) -> "threading.RLock":
        """Held around every native call on this context."""
        return self._lock

    @property
    def last_error(self) -> str:
        """The message of the last failing call on this context ("" after a success)."""
        return _lib.last_error(self.handle)

    def health(self) -> str:
        """``"ok"`` while the context can run calls; ``"lost"`` once a call on it raised
        :class:`DeviceLostError` (the GPU failed or was reset): from then on every call raises
        DeviceLostError and the context can only be closed; a new Context may work
        (``wkv_context_health``). Out-of-memory and argument errors leave it ``"ok"``. Needs no
        lock: safe while another thread runs a call on it."""
        f = getattr(load(), "wkv_context_health", None)
        if f is None:
            raise UnsupportedError("wkv.Context.health: the loaded libwkv has no wkv_context_health")
        return "ok" if f(self.handle) == 0 else "lost"

    def close(self) -> None:
        """Destroys the native context (idempotent)."""
        lock = getattr(self, "_lock", None)
        if lock is None:
            return
        with lock:
            h, self._handle = getattr(self, "_handle", None), None
            if h is not None and _lib._lib is not None:
                _lib._lib.wkv_context_destroy(h)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "backend=%r" % self.backend
        return "wkv.Context(%s, device=%d, threads=%d)" % (state, self.device, self.threads)

    # --------------------------------------------------------------------------- CUDA streams

    def set_cuda_stream(self, stream: Any) -> None:
        """Makes later calls enqueue on ``stream`` (``wkv_cuda_set_stream``): a
        ``torch.cuda.Stream``, a raw ``cudaStream_t`` as an int, or None / 0 for the legacy
        default stream. The op functions do this themselves before each call on a CUDA context
        (with ``torch.cuda.current_stream()``). Raises InvalidArgumentError on a non-CUDA
        context."""
        handle = getattr(stream, "cuda_stream", stream)
        with self._lock:
            check(load().wkv_cuda_set_stream(self.handle, c_void_p(int(handle) if handle else None)), self.handle)

    def cuda_stream(self) -> int:
        """The ``cudaStream_t`` this context enqueues on, as an int (``wkv_cuda_get_stream``)."""
        out = c_void_p()
        with self._lock:
            check(load().wkv_cuda_get_stream(self.handle, byref(out)), self.handle)
        return out.value or 0

    def workspace_size(self, backward_desc: Any) -> int:
        """``wkv_workspace_size`` for a filled ``_lib.wkv_backward_desc`` (low level)."""
        n = c_size_t()
        with self._lock:
            check(load().wkv_workspace_size(self.handle, byref(n), byref(backward_desc)), self.handle)
        return n.value


def context_by_id(cid: int) -> Optional[Context]:
    """The live Context with this ``id`` (used by the torch custom op, whose arguments cannot
    carry Python objects), or None."""
    return _registry.get(cid)


# ------------------------------------------------------------------------------ defaults

_defaults: Dict[Tuple[int, int], Context] = {}
_defaults_lock = threading.Lock()
_local = threading.local()


def default_context(device: Tuple[int, int] = (1, 0)) -> Context:
    """The process-wide context used when a call passes no ``context`` and no
    :func:`use_context` is active: the CUDA backend for CUDA memory, Vulkan for Vulkan memory,
    the CPU backend otherwise. Created on first use; shared by all threads (calls on it run one
    at a time)."""
    dtype_, index = device
    if dtype_ in (WKV_DEVICE_CUDA, WKV_DEVICE_CUDA_MANAGED):
        key = (WKV_BACKEND_CUDA, index)
    elif dtype_ == WKV_DEVICE_VULKAN:
        key = (WKV_BACKEND_VULKAN, index)
    else:
        key = (WKV_BACKEND_CPU, 0)
    ctx = _defaults.get(key)
    if ctx is None or ctx.closed:
        with _defaults_lock:
            ctx = _defaults.get(key)
            if ctx is None or ctx.closed:
                ctx = Context(BACKEND_NAMES[key[0]], device=key[1])
                _defaults[key] = ctx
    return ctx


def current_context() -> Optional[Context]:
    """The context set by the innermost active :func:`use_context` on this thread, or None."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


@contextmanager
def use_context(ctx: Context) -> Iterator[Context]:
    """Within the ``with`` block, calls on this thread that pass no ``context`` use ``ctx``
    (this is how a context reaches the torch op, whose arguments cannot carry one)."""
    if not isinstance(ctx, Context):
        raise TypeError("wkv.use_context takes a wkv.Context")
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(ctx)
    try:
        yield ctx
    finally:
        stack.pop()


def resolve_context(context: Optional[Context], device: Tuple[int, int]) -> Context:
    if context is not None:
        if not isinstance(context, Context):
            raise TypeError("context must be a wkv.Context, not %s" % type(context).__name__)
        return context
    cur = current_context()
    if cur is not None:
        return cur
    return default_context(device)


# ------------------------------------------------------------------------------ introspection


def _names(mask: int, table: Dict[int, str]) -> List[str]:
    return [name for bit, name in sorted(table.items()) if mask & (1 << bit)]


def device_info(backend: str, index: int = 0) -> Dict[str, Any]:
    """``wkv_device_get_info``: ``{"name", "memory_bytes", "compute_units"}``."""
    lib = load()
    di = _lib.wkv_device_info()
    di.struct_size = sizeof(di)
    check(lib.wkv_device_get_info(BACKEND_CODES[backend], int(index), byref(di)), None, "wkv_device_get_info")
    return {"name": di.name.decode("utf-8", "replace"), "memory_bytes": int(di.memory_bytes),
            "compute_units": int(di.compute_units)}


def backend_info(backend: str) -> Dict[str, Any]:
    """``wkv_backend_get_info`` as a dict: ``name``, ``available``, ``reason``, ``device_count``,
    ``devices`` (see :func:`device_info`), ``ops``, ``dtypes``, ``decay_forms``,
    ``head_sizes`` ("any" or a list)."""
    lib = load()
    bi = _lib.wkv_backend_info()
    bi.struct_size = sizeof(bi)
    check(lib.wkv_backend_get_info(BACKEND_CODES[backend], byref(bi)), None, "wkv_backend_get_info")
    out: Dict[str, Any] = {
        "name": bi.name.decode() if bi.name else backend,
        "available": bool(bi.available),
        "reason": bi.reason.decode("utf-8", "replace") if bi.reason else "",
        "device_count": int(bi.device_count),
        "ops": _names(bi.ops, OP_NAMES),
        "dtypes": _names(bi.dtypes, DTYPE_BITS_NAMES),
        "decay_forms": _names(bi.decay_forms, DECAY_NAMES),
        "head_sizes": "any" if bi.any_head_size else
        [int(bi.head_sizes[i]) for i in range(min(max(bi.num_head_sizes, 0), _lib.WKV_MAX_HEAD_SIZES))],
        "devices": [],
    }
    if out["available"]:
        for d in range(min(out["device_count"], 64)):
            try:
                out["devices"].append(device_info(backend, d))
            except Exception as e:  # report, don't fail the whole query
                out["devices"].append({"name": "(no information: %s)" % e, "memory_bytes": 0, "compute_units": 0})
    return out


def info() -> Dict[str, Any]:
    """What the loaded libwkv is and can do: ``version`` ("0.1.0"), ``version_code``
    (major*10000 + minor*100 + patch), ``build``, ``library`` (the file loaded), ``backends``
    (name → :func:`backend_info`), and ``auto`` (the backend an AUTO context picks here, or
    None with ``auto_error``)."""
    from . import __version__

    lib = load()
    out: Dict[str, Any] = {
        "version": lib.wkv_version_string().decode(),
        "version_code": int(lib.wkv_version()),
        "package_version": __version__,
        "build": lib.wkv_build_info().decode("utf-8", "replace"),
        "library": str(_lib.library_path()),
        "backends": {name: backend_info(name) for name in ("cpu", "cuda", "vulkan")},
    }
    try:
        with Context("auto") as c:
            out["auto"] = c.backend
    except Exception as e:
        out["auto"] = None
        out["auto_error"] = str(e)
    return out
