"""The ctypes layer: finds and loads libwkv, mirrors every struct of ``wkv.h`` and
``wkv_cuda.h``, and declares argtypes/restype for every exported function.

Where the library comes from, first match wins:

1. the package's own folder (``wkv/lib/libwkv.so*``, put there by ``pip install``);
2. the ``WKV_LIBRARY`` environment variable: a path to the library file (or to a folder
   holding it);
3. the build tree of the repository this package sits in: ``<repo>/build/libwkv.so`` (also
   ``build-debug``, ``build-asan``, ``build-release``).

Nothing here copies or converts data; the structs are laid out exactly as the C compiler lays
out the header's (``tests/test_abi.py`` compares every size and offset with a compiled C
snippet).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_int32,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path
from typing import List, Optional

from .errors import make_error

# --------------------------------------------------------------------------- constants (wkv.h)

WKV_OK = 0
WKV_ERROR_NULL_POINTER = 1
WKV_ERROR_BUSY = 14

WKV_DEVICE_CPU = 1
WKV_DEVICE_CUDA = 2
WKV_DEVICE_CUDA_HOST = 3
WKV_DEVICE_VULKAN = 7
WKV_DEVICE_CUDA_MANAGED = 13

WKV_DTYPE_CODE_INT = 0
WKV_DTYPE_CODE_UINT = 1
WKV_DTYPE_CODE_FLOAT = 2
WKV_DTYPE_CODE_BFLOAT = 4

WKV_BACKEND_AUTO = 0
WKV_BACKEND_CPU = 1
WKV_BACKEND_CUDA = 2
WKV_BACKEND_VULKAN = 3

WKV_LOG_ERROR = 1
WKV_LOG_WARN = 2
WKV_LOG_INFO = 3
WKV_LOG_DEBUG = 4

WKV_OP_RWKV4 = 4
WKV_OP_RWKV6 = 6
WKV_OP_RWKV7 = 7

WKV_DECAY_DIRECT = 1
WKV_DECAY_LOG = 2
WKV_DECAY_EXP_NEG_EXP = 3
WKV_DECAY_CLAMPW = 4

WKV_FLAG_STATE_KEY_MAJOR = 1 << 0
WKV_BACKWARD_REUSE_CHECKPOINTS = 1 << 0
WKV_FLAG_RWKV4_STATE_INTERLEAVED = 1 << 1

WKV_MAX_HEAD_SIZES = 16

BACKEND_NAMES = {WKV_BACKEND_AUTO: "auto", WKV_BACKEND_CPU: "cpu", WKV_BACKEND_CUDA: "cuda",
                 WKV_BACKEND_VULKAN: "vulkan"}
BACKEND_CODES = {v: k for k, v in BACKEND_NAMES.items()}
OP_NAMES = {WKV_OP_RWKV4: "rwkv4", WKV_OP_RWKV6: "rwkv6", WKV_OP_RWKV7: "rwkv7"}
DECAY_NAMES = {WKV_DECAY_DIRECT: "direct", WKV_DECAY_LOG: "log",
               WKV_DECAY_EXP_NEG_EXP: "exp_neg_exp", WKV_DECAY_CLAMPW: "clampw"}
DECAY_CODES = {v: k for k, v in DECAY_NAMES.items()}
LOG_LEVEL_NAMES = {WKV_LOG_ERROR: "error", WKV_LOG_WARN: "warn", WKV_LOG_INFO: "info",
                   WKV_LOG_DEBUG: "debug"}
LOG_LEVEL_CODES = {v: k for k, v in LOG_LEVEL_NAMES.items()}
DTYPE_BITS_NAMES = {0: "f32", 1: "f16", 2: "bf16"}  # wkv_backend_info.dtypes bits

# ------------------------------------------------------------------------------ structs (wkv.h)

# C enums are int-sized on every ABI libwkv supports; the header forces 32 bits with
# *_FORCE32_ = 0x7fffffff.
c_enum = c_int32


class wkv_device(Structure):
    """``wkv_device``: a DLPack ``DLDevice``."""

    _fields_ = [("type", c_int32), ("id", c_int32)]


class wkv_dtype(Structure):
    """``wkv_dtype``: a DLPack ``DLDataType``."""

    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class wkv_tensor(Structure):
    """``wkv_tensor``: laid out exactly like DLPack's ``DLTensor``. Strides in elements."""

    _fields_ = [
        ("data", c_void_p),
        ("device", wkv_device),
        ("ndim", c_int32),
        ("dtype", wkv_dtype),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


#: void (*)(void* user_data, wkv_log_level level, const char* message)
wkv_log_fn = CFUNCTYPE(None, c_void_p, c_enum, c_char_p)
#: void (*)(void* task_data, int64_t begin, int64_t end)
wkv_task_fn = CFUNCTYPE(None, c_void_p, c_int64, c_int64)
#: void (*)(void* user_data, int64_t n, wkv_task_fn fn, void* task_data)
wkv_parallel_for_fn = CFUNCTYPE(None, c_void_p, c_int64, wkv_task_fn, c_void_p)


class wkv_context_options(Structure):
    """``wkv_context_options``."""

    _fields_ = [
        ("struct_size", c_size_t),
        ("backend", c_enum),
        ("device_index", c_int32),
        ("cpu_threads", c_int32),
        ("parallel_for", wkv_parallel_for_fn),
        ("parallel_for_user_data", c_void_p),
        ("log", wkv_log_fn),
        ("log_user_data", c_void_p),
        ("log_level", c_enum),
        # WKV_CONTEXT_* bits. The package sets none: WKV_CONTEXT_ASYNC changes only Vulkan calls
        # whose tensors are all wkv_buffers, and the package passes host / DLPack tensors.
        ("flags", c_uint64),
    ]


class wkv_forward_desc(Structure):
    """``wkv_forward_desc``."""

    _fields_ = [
        ("struct_size", c_size_t),
        ("op", c_enum),
        ("decay_form", c_enum),
        ("flags", c_uint32),
        ("r", wkv_tensor),
        ("w", wkv_tensor),
        ("k", wkv_tensor),
        ("v", wkv_tensor),
        ("a", wkv_tensor),
        ("b", wkv_tensor),
        ("u", wkv_tensor),
        ("y", wkv_tensor),
        ("state_in", wkv_tensor),
        ("state_out", wkv_tensor),
        ("seq_offsets", POINTER(c_int64)),
        ("num_seqs", c_int64),
        ("workspace", c_void_p),
        ("workspace_size", c_size_t),
        ("scratch", c_void_p),
        ("scratch_size", c_size_t),
    ]


class wkv_backward_desc(Structure):
    """``wkv_backward_desc``."""

    _fields_ = [
        ("struct_size", c_size_t),
        ("forward", POINTER(wkv_forward_desc)),
        ("dy", wkv_tensor),
        ("dstate_out", wkv_tensor),
        ("dr", wkv_tensor),
        ("dw", wkv_tensor),
        ("dk", wkv_tensor),
        ("dv", wkv_tensor),
        ("da", wkv_tensor),
        ("db", wkv_tensor),
        ("du", wkv_tensor),
        ("dstate_in", wkv_tensor),
        ("workspace", c_void_p),
        ("workspace_size", c_size_t),
        ("flags", c_uint32),
    ]


class wkv_backend_info(Structure):
    """``wkv_backend_info``."""

    _fields_ = [
        ("struct_size", c_size_t),
        ("backend", c_enum),
        ("name", c_char_p),
        ("available", c_int32),
        ("reason", c_char_p),
        ("device_count", c_int32),
        ("ops", c_uint32),
        ("dtypes", c_uint32),
        ("decay_forms", c_uint32),
        ("any_head_size", c_int32),
        ("num_head_sizes", c_int32),
        ("head_sizes", c_int32 * WKV_MAX_HEAD_SIZES),
    ]


class wkv_device_info(Structure):
    """``wkv_device_info``."""

    _fields_ = [
        ("struct_size", c_size_t),
        ("name", c_char * 256),
        ("memory_bytes", c_uint64),
        ("compute_units", c_int32),
    ]


class wkv_attention_desc(Structure):
    """``wkv_attention_desc``."""

    _fields_ = [
        ("struct_size", c_size_t),
        ("flags", c_uint32),
        ("scale", ctypes.c_float),
        ("q", wkv_tensor),
        ("k", wkv_tensor),
        ("v", wkv_tensor),
        ("o", wkv_tensor),
        ("lse", wkv_tensor),
        ("q_offsets", POINTER(c_int64)),
        ("k_offsets", POINTER(c_int64)),
        ("num_seqs", c_int64),
        ("config", c_char_p),
    ]


class wkv_attention_backward_desc(Structure):
    """``wkv_attention_backward_desc``."""

    _fields_ = [
        ("struct_size", c_size_t),
        ("forward", POINTER(wkv_attention_desc)),
        ("dout", wkv_tensor),
        ("dlse", wkv_tensor),
        ("dq", wkv_tensor),
        ("dk", wkv_tensor),
        ("dv", wkv_tensor),
    ]


class wkv_attention_config(Structure):
    """``wkv_attention_config``."""

    _fields_ = [
        ("struct_size", c_size_t),
        ("name", c_char * 64),
        ("dtype", wkv_dtype),
        ("head_dim", c_int32),
        ("max_head_dim", c_int32),
        ("block_q", c_int32),
        ("block_kv", c_int32),
        ("warps", c_int32),
        ("async_copy", c_int32),
        ("eager_load", c_int32),
        ("swizzle", c_int32),
        ("double_buffer", c_int32),
        ("softmax", c_int32),
        ("shared_bytes", c_uint64),
        ("fits", c_int32),
        ("is_default", c_int32),
    ]


#: Every struct of the public headers, by its C name (the ABI test walks this).
STRUCTS = {
    cls.__name__: cls
    for cls in (wkv_device, wkv_dtype, wkv_tensor, wkv_context_options, wkv_forward_desc,
                wkv_backward_desc, wkv_backend_info, wkv_device_info, wkv_attention_desc,
                wkv_attention_backward_desc, wkv_attention_config)
}

# ------------------------------------------------------------------------------------ loading


def _lib_names() -> List[str]:
    if sys.platform == "win32":
        return ["wkv.dll", "libwkv.dll"]
    if sys.platform == "darwin":
        return ["libwkv.dylib", "libwkv.0.dylib"]
    return ["libwkv.so", "libwkv.so.0"]


def _find_in(folder: Path) -> Optional[Path]:
    for name in _lib_names():
        p = folder / name
        if p.is_file():
            return p
    if folder.is_dir() and sys.platform.startswith("linux"):
        for p in sorted(folder.glob("libwkv.so.*")):
            if p.is_file():
                return p
    return None


def package_dir() -> Path:
    """The folder of the installed ``wkv`` package."""
    return Path(__file__).resolve().parent


def repo_root() -> Optional[Path]:
    """The libwkv repository this package's source sits in (``bindings/python/src/wkv``), or
    None when the package is installed elsewhere."""
    here = package_dir()
    if len(here.parents) < 4:
        return None
    root = here.parents[3]
    return root if (root / "include" / "wkv" / "wkv.h").is_file() else None


def candidate_paths() -> List[str]:
    """Where :func:`load` looks, in order (for messages and ``python -m wkv info``)."""
    out = []
    pkg = package_dir()
    for sub in ("lib", "lib64", "bin", "."):
        out.append(str(pkg / sub))
    env = os.environ.get("WKV_LIBRARY")
    if env:
        out.append("$WKV_LIBRARY=" + env)
    root = repo_root()
    if root is not None:
        for b in ("build", "build-release", "build-debug", "build-asan"):
            out.append(str(root / b))
    return out


def find_library() -> Path:
    """The path of the libwkv to load (see the module docstring for the order)."""
    pkg = package_dir()
    for sub in ("lib", "lib64", "bin", "."):
        p = _find_in(pkg / sub)
        if p is not None:
            return p
    env = os.environ.get("WKV_LIBRARY")
    if env:
        p = Path(env).expanduser()
        if p.is_dir():
            found = _find_in(p)
            if found is None:
                raise OSError("WKV_LIBRARY=%s is a folder without %s" % (env, " or ".join(_lib_names())))
            return found
        if not p.is_file():
            raise OSError("WKV_LIBRARY=%s: no such file" % env)
        return p
    root = repo_root()
    if root is not None:
        for b in ("build", "build-release", "build-debug", "build-asan"):
            p = _find_in(root / b)
            if p is not None:
                return p
    raise OSError(
        "libwkv not found. Install the package (pip install bindings/python), set WKV_LIBRARY to "
        "the path of libwkv.so, or build the repository into build/ (scripts/build.sh). Looked in: "
        + ", ".join(candidate_paths()))


def _declare(lib: ctypes.CDLL) -> None:
    """argtypes/restype for every function libwkv exports."""
    ctx_p = c_void_p
    f = lib.wkv_version
    f.argtypes, f.restype = [], c_uint32
    f = lib.wkv_version_string
    f.argtypes, f.restype = [], c_char_p
    f = lib.wkv_build_info
    f.argtypes, f.restype = [], c_char_p
    f = lib.wkv_status_string
    f.argtypes, f.restype = [c_enum], c_char_p
    f = lib.wkv_context_create
    f.argtypes, f.restype = [POINTER(wkv_context_options), POINTER(ctx_p)], c_enum
    f = lib.wkv_context_destroy
    f.argtypes, f.restype = [ctx_p], None
    f = lib.wkv_context_backend
    f.argtypes, f.restype = [ctx_p], c_enum
    f = lib.wkv_last_error
    f.argtypes, f.restype = [ctx_p], c_char_p
    f = lib.wkv_forward
    f.argtypes, f.restype = [ctx_p, POINTER(wkv_forward_desc)], c_enum
    f = lib.wkv_backward
    f.argtypes, f.restype = [ctx_p, POINTER(wkv_backward_desc)], c_enum
    f = lib.wkv_workspace_size
    f.argtypes, f.restype = [ctx_p, POINTER(c_size_t), POINTER(wkv_backward_desc)], c_enum
    f = lib.wkv_backend_get_info
    f.argtypes, f.restype = [c_enum, POINTER(wkv_backend_info)], c_enum
    f = lib.wkv_device_get_info
    f.argtypes, f.restype = [c_enum, c_int32, POINTER(wkv_device_info)], c_enum
    # wkv_cuda.h: cudaStream_t is an opaque pointer.
    f = lib.wkv_cuda_set_stream
    f.argtypes, f.restype = [ctx_p, c_void_p], c_enum
    f = lib.wkv_cuda_get_stream
    f.argtypes, f.restype = [ctx_p, POINTER(c_void_p)], c_enum


#: Functions declared when the loaded library has them (newer API, e.g. the device buffers).
OPTIONAL_FUNCTIONS = ("wkv_context_synchronize", "wkv_context_health", "wkv_buffer_create", "wkv_buffer_destroy", "wkv_buffer_upload", "wkv_buffer_download",
                      "wkv_buffer_size", "wkv_tensor_make_buffer", "wkv_forward_scratch_size",
                      "wkv_attention", "wkv_attention_configs", "wkv_attention_backward",
                      # wkv_vulkan.h (Vulkan handles are opaque pointers here)
                      "wkv_vulkan_validation_message_count", "wkv_vulkan_context_create",
                      "wkv_vulkan_buffer_import", "wkv_vulkan_record_forward", "wkv_vulkan_record_backward")


def _declare_optional(lib: ctypes.CDLL) -> None:
    ctx_p, buf_p = c_void_p, c_void_p
    table = {
        "wkv_context_synchronize": ([ctx_p], c_enum),
        "wkv_context_health": ([ctx_p], c_enum),
        "wkv_buffer_create": ([ctx_p, c_uint64, POINTER(buf_p)], c_enum),
        "wkv_buffer_destroy": ([buf_p], None),
        "wkv_buffer_upload": ([ctx_p, buf_p, c_uint64, c_void_p, c_uint64], c_enum),
        "wkv_buffer_download": ([ctx_p, buf_p, c_uint64, c_void_p, c_uint64], c_enum),
        "wkv_buffer_size": ([buf_p], c_uint64),
        "wkv_tensor_make_buffer": ([buf_p, c_uint64, wkv_dtype, c_int32, POINTER(c_int64)], wkv_tensor),
        "wkv_forward_scratch_size": ([ctx_p, POINTER(c_size_t), POINTER(wkv_forward_desc)], c_enum),
        "wkv_attention": ([ctx_p, POINTER(wkv_attention_desc)], c_enum),
        "wkv_attention_configs": ([ctx_p, POINTER(wkv_attention_config), c_int32, POINTER(c_int32)], c_enum),
        "wkv_attention_backward": ([ctx_p, POINTER(wkv_attention_backward_desc)], c_enum),
        "wkv_vulkan_validation_message_count": ([ctx_p, POINTER(c_uint64)], c_enum),
        # (options, const wkv_vulkan_guest_options*, wkv_context** out)
        "wkv_vulkan_context_create": ([POINTER(wkv_context_options), c_void_p, POINTER(ctx_p)], c_enum),
        "wkv_vulkan_buffer_import": ([ctx_p, c_void_p, c_uint64, POINTER(buf_p)], c_enum),
        "wkv_vulkan_record_forward": ([ctx_p, c_void_p, POINTER(wkv_forward_desc)], c_enum),
        "wkv_vulkan_record_backward": ([ctx_p, c_void_p, POINTER(wkv_backward_desc)], c_enum),
    }
    for name, (args, res) in table.items():
        if hasattr(lib, name):
            f = getattr(lib, name)
            f.argtypes, f.restype = args, res


#: Every function _declare sets up (the tests check the library exports exactly these).
FUNCTIONS = (
    "wkv_version", "wkv_version_string", "wkv_build_info", "wkv_status_string",
    "wkv_context_create", "wkv_context_destroy", "wkv_context_backend", "wkv_last_error",
    "wkv_forward", "wkv_backward", "wkv_workspace_size", "wkv_backend_get_info",
    "wkv_device_get_info", "wkv_cuda_set_stream", "wkv_cuda_get_stream",
)

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[Path] = None


def load() -> ctypes.CDLL:
    """The loaded library (loaded on first use, then cached). Raises OSError when not found."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = find_library()
            # RTLD_LOCAL (the default): libwkv's symbols stay out of the global namespace; its
            # plugins are found next to it by libwkv's own loader.
            lib = ctypes.CDLL(str(path))
            _declare(lib)
            _declare_optional(lib)
            _lib_path = path
            _lib = lib
    return _lib


def library_path() -> Path:
    """The file the loaded libwkv came from."""
    load()
    assert _lib_path is not None
    return _lib_path


def last_error(ctx: Optional[int]) -> str:
    """``wkv_last_error(ctx)`` as text (ctx None: the thread's context-free message)."""
    msg = load().wkv_last_error(ctx)
    return msg.decode("utf-8", "replace") if msg else ""


def check(status: int, ctx: Optional[int] = None, fallback: str = "", fn: Optional[str] = None) -> None:
    """Raises the exception of ``status`` (nothing for WKV_OK), with the library's message:
    ``wkv_last_error(ctx)``, or the thread's context-free one for BUSY / a NULL context. With
    ``fn`` (the Python function that made the call) the message is reworded in Python's terms
    (:func:`wkv.errors.pythonic`; the original stays in ``.library_message``)."""
    if status == WKV_OK:
        return
    msg = ""
    if ctx is not None and status != WKV_ERROR_BUSY:
        msg = last_error(ctx)
    if not msg:
        msg = last_error(None)
    if not msg:
        s = load().wkv_status_string(status)
        msg = (fallback + ": " if fallback else "") + (s.decode() if s else "status %d" % status)
    if fn:
        from .errors import pythonic

        raise make_error(status, pythonic(msg, fn), msg)
    raise make_error(status, msg)


def status_string(status: int) -> str:
    """``wkv_status_string(status)``."""
    s = load().wkv_status_string(status)
    return s.decode("utf-8", "replace") if s else ""
