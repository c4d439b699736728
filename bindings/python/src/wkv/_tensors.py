"""Arrays in, ``wkv_tensor`` out: zero-copy views of numpy arrays, PyTorch tensors and DLPack
producers, and allocation of outputs of the caller's array type.

Rules (the package never copies behind the caller's back):

* numpy: float32, float16 and bfloat16 (``ml_dtypes.bfloat16``, or ``uint16`` bit patterns
  when the call says ``dtype="bf16"``) go in as they are, with any strides that are whole
  multiples of the item size (0 and negative included). Anything else raises, unless the call
  passed ``convert=True``, which allows a float32 (or contiguous) *copy of an input*. Outputs
  are never converted.
* torch: CPU and CUDA tensors go in through ``data_ptr()`` and ``stride()``.
* other objects with ``__dlpack__`` / ``__dlpack_device__``: the capsule is consumed and its
  deleter called once the call no longer needs the memory.
* other dtypes that DLPack can name (float64, ints) are passed on as they are, so the library
  itself rejects them with its message naming the argument.
"""

from __future__ import annotations

import ctypes
import sys
from ctypes import c_int64
from typing import Any, List, Optional, Sequence, Tuple

from . import _dlpack
from ._lib import (
    WKV_DEVICE_CPU,
    WKV_DEVICE_CUDA,
    WKV_DEVICE_CUDA_HOST,
    WKV_DEVICE_CUDA_MANAGED,
    WKV_DTYPE_CODE_BFLOAT,
    WKV_DTYPE_CODE_FLOAT,
    WKV_DTYPE_CODE_INT,
    WKV_DTYPE_CODE_UINT,
    wkv_tensor,
)
from ._lib import WKV_DEVICE_VULKAN as _WKV_DEVICE_VULKAN
from .errors import DeviceMismatchError, DTypeError, InvalidArgumentError

F32 = (WKV_DTYPE_CODE_FLOAT, 32)
F16 = (WKV_DTYPE_CODE_FLOAT, 16)
BF16 = (WKV_DTYPE_CODE_BFLOAT, 16)
SUPPORTED = (F32, F16, BF16)
DTYPE_NAMES = {F32: "float32", F16: "float16", BF16: "bfloat16"}


def _np():
    import numpy

    return numpy


def torch_module():
    """The torch module when it is already imported (never imports it), else None."""
    return sys.modules.get("torch")


def is_torch_tensor(obj: Any) -> bool:
    t = torch_module()
    return t is not None and isinstance(obj, t.Tensor)


def is_numpy_array(obj: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(obj, np.ndarray)


def has_dlpack(obj: Any) -> bool:
    return hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__")


def kind_of(obj: Any) -> Optional[str]:
    """"numpy", "torch", "dlpack", "device" (a wkv.DeviceArray), or None for anything else."""
    if getattr(obj, "_wkv_device_array", False) is True:
        return "device"
    if is_numpy_array(obj):
        return "numpy"
    if is_torch_tensor(obj):
        return "torch"
    if has_dlpack(obj):
        return "dlpack"
    return None


def device_of(obj: Any) -> Tuple[int, int]:
    """(wkv_device_type, id) of an array without exporting it; CPU for anything unknown."""
    if getattr(obj, "_wkv_device_array", False) is True:
        return (WKV_DEVICE_CUDA if obj.context.backend == "cuda" else _WKV_DEVICE_VULKAN, obj.context.device)
    if is_torch_tensor(obj):
        dev = obj.device
        if dev.type == "cuda":
            return (WKV_DEVICE_CUDA, dev.index if dev.index is not None else 0)
        if dev.type == "cpu":
            return (WKV_DEVICE_CPU, 0)
        return (-1, 0)
    if is_numpy_array(obj) or not has_dlpack(obj):
        return (WKV_DEVICE_CPU, 0)
    return _dlpack.device_of(obj)


# ------------------------------------------------------------------------------ numpy dtypes


def numpy_code(dt: Any, bf16: bool) -> Optional[Tuple[int, int]]:
    """(DLPack code, bits) of a numpy dtype, or None when DLPack cannot name it."""
    if dt.byteorder == ">" or (dt.byteorder == "<" and sys.byteorder == "big"):
        return None
    k = dt.kind  # before dt.name, which builds a string (~2 µs: this runs on every call)
    if k == "f":
        return (WKV_DTYPE_CODE_FLOAT, dt.itemsize * 8)
    if k == "u":
        if bf16 and dt.itemsize == 2:
            return BF16
        return (WKV_DTYPE_CODE_UINT, dt.itemsize * 8)
    if k == "i":
        return (WKV_DTYPE_CODE_INT, dt.itemsize * 8)
    if dt.name == "bfloat16" and dt.itemsize == 2:  # ml_dtypes (kind "V")
        return BF16
    return None


def numpy_dtype_for(code_bits: Tuple[int, int]) -> Tuple[Any, bool]:
    """A numpy dtype to allocate for a DLPack (code, bits), and whether it is a uint16 stand-in
    for bfloat16 (no ml_dtypes)."""
    np = _np()
    if code_bits == BF16:
        try:
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16), False
        except ImportError:
            return np.dtype(np.uint16), True
    code, bits = code_bits
    try:
        if code == WKV_DTYPE_CODE_FLOAT:
            return np.dtype("f%d" % (bits // 8)), False
        if code == WKV_DTYPE_CODE_INT:
            return np.dtype("i%d" % (bits // 8)), False
        if code == WKV_DTYPE_CODE_UINT:
            return np.dtype("u%d" % (bits // 8)), False
    except TypeError:
        pass
    return np.dtype(np.float32), False


_TORCH_CODES: Optional[dict] = None


def torch_code(dtype: Any) -> Optional[Tuple[int, int]]:
    global _TORCH_CODES
    if _TORCH_CODES is None:  # built once: this runs for every tensor of every call
        torch = torch_module()
        _TORCH_CODES = {
            torch.float32: F32, torch.float16: F16, torch.bfloat16: BF16,
            torch.float64: (WKV_DTYPE_CODE_FLOAT, 64),
            torch.int8: (WKV_DTYPE_CODE_INT, 8), torch.int16: (WKV_DTYPE_CODE_INT, 16),
            torch.int32: (WKV_DTYPE_CODE_INT, 32), torch.int64: (WKV_DTYPE_CODE_INT, 64),
            torch.uint8: (WKV_DTYPE_CODE_UINT, 8),
        }
    return _TORCH_CODES.get(dtype)


def torch_dtype_for(code_bits: Tuple[int, int]) -> Any:
    torch = torch_module()
    table = {F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16,
             (WKV_DTYPE_CODE_FLOAT, 64): torch.float64}
    return table.get(tuple(code_bits), torch.float32)


# ------------------------------------------------------------------------------ the view


class View:
    """One argument as the library sees it: a filled ``wkv_tensor`` plus what keeps its memory
    valid. ``obj`` is the caller's object (returned when it was an output)."""

    __slots__ = ("name", "obj", "kind", "device", "code_bits", "shape", "tensor", "_keep",
                 "managed", "np_dtype", "uint16_bf16", "torch_dtype")

    def __init__(self, name: str, obj: Any, kind: str) -> None:
        self.name = name
        self.obj = obj
        self.kind = kind
        self.device: Tuple[int, int] = (WKV_DEVICE_CPU, 0)
        self.code_bits: Tuple[int, int] = F32
        self.shape: Tuple[int, ...] = ()
        self.tensor = wkv_tensor()
        self._keep: List[Any] = []
        self.managed: Optional[_dlpack.ManagedTensor] = None
        self.np_dtype: Any = None
        self.uint16_bf16 = False
        self.torch_dtype: Any = None

    def fill(self, data: int, device: Tuple[int, int], code_bits: Tuple[int, int],
             shape: Sequence[int], strides: Optional[Sequence[int]], byte_offset: int = 0) -> None:
        ndim = len(shape)
        shape_arr = (c_int64 * max(ndim, 1))(*shape)
        self._keep.append(shape_arr)
        t = self.tensor
        t.data = data or None
        t.device.type, t.device.id = device
        t.ndim = ndim
        t.dtype.code, t.dtype.bits, t.dtype.lanes = code_bits[0], code_bits[1], 1
        t.shape = ctypes.cast(shape_arr, ctypes.POINTER(c_int64))
        if strides is None:
            t.strides = None
        else:
            st_arr = (c_int64 * max(ndim, 1))(*strides)
            self._keep.append(st_arr)
            t.strides = ctypes.cast(st_arr, ctypes.POINTER(c_int64))
        t.byte_offset = byte_offset
        self.device = device
        self.code_bits = code_bits
        self.shape = tuple(int(s) for s in shape)

    def release(self) -> None:
        if self.managed is not None:
            self.managed.release()
            self.managed = None
        self._keep = []


def absent() -> wkv_tensor:
    """An absent tensor (data NULL)."""
    return wkv_tensor()


# ------------------------------------------------------------------------------ adapters


def _err_prefix(fn: str, name: str) -> str:
    return "%s: %s" % (fn, name)


def from_numpy(arr: Any, name: str, fn: str, output: bool, convert: bool, bf16: bool) -> View:
    np = _np()
    where = _err_prefix(fn, name)
    if output and not arr.flags.writeable:
        raise InvalidArgumentError("%s is a read-only numpy array and cannot take an output" % where)
    code = numpy_code(arr.dtype, bf16)
    if code not in SUPPORTED:
        if convert and not output:
            arr = arr.astype(np.float32)
            code = F32
        elif code is None:
            raise DTypeError("%s has numpy dtype %s, which DLPack cannot name (libwkv takes float32, "
                             "float16 or bfloat16)%s" % (where, arr.dtype.str,
                                                          "" if output else "; pass convert=True for a float32 copy"))
        # else: a dtype DLPack can name (float64, ints): the library rejects it with its message
    item = arr.dtype.itemsize
    misaligned = any(s % item for s in arr.strides) or arr.ctypes.data % item
    if misaligned:
        if convert and not output:
            arr = np.ascontiguousarray(arr)
        else:
            raise InvalidArgumentError(
                "%s: numpy byte strides %s (or its address) are not multiples of the item size %d, "
                "so they cannot be given in elements%s" % (where, tuple(arr.strides), item,
                                                           "" if output else "; pass convert=True for a contiguous copy"))
    v = View(name, arr, "numpy")
    v.fill(arr.ctypes.data, (WKV_DEVICE_CPU, 0), code, arr.shape, [s // item for s in arr.strides])
    v._keep.append(arr)
    v.np_dtype = arr.dtype
    v.uint16_bf16 = code == BF16 and arr.dtype.kind == "u"
    return v


def from_torch(t: Any, name: str, fn: str, output: bool, convert: bool) -> View:
    torch = torch_module()
    where = _err_prefix(fn, name)
    if t.layout != torch.strided:
        raise InvalidArgumentError("%s is a %s torch tensor; libwkv takes strided tensors" % (where, t.layout))
    dev = t.device
    if dev.type == "cuda":
        device = (WKV_DEVICE_CUDA, dev.index if dev.index is not None else torch.cuda.current_device())
    elif dev.type == "cpu":
        device = (WKV_DEVICE_CPU, 0)
    else:
        raise DeviceMismatchError("%s is on torch device '%s'; libwkv reads CPU and CUDA memory" % (where, dev))
    if output and t.requires_grad and torch.is_grad_enabled():
        raise InvalidArgumentError("%s requires grad; outputs written outside autograd must not "
                                   "(use torch.no_grad() or a tensor without requires_grad)" % where)
    if t.is_neg() or t.is_conj():
        if convert and not output:
            t = t.resolve_neg().resolve_conj()
        else:
            raise InvalidArgumentError("%s is a lazily negated/conjugated view%s" % (
                where, "" if output else "; pass convert=True to materialise it"))
    code = torch_code(t.dtype)
    if code not in SUPPORTED:
        if convert and not output:
            t = t.to(torch.float32)
            code = F32
        elif code is None:
            raise DTypeError("%s has torch dtype %s, which libwkv does not take (float32, float16 or "
                             "bfloat16)%s" % (where, t.dtype, "" if output else "; pass convert=True for a float32 copy"))
    v = View(name, t, "torch")
    v.fill(t.data_ptr(), device, code, tuple(t.shape), tuple(t.stride()))
    v._keep.append(t)
    v.torch_dtype = t.dtype
    return v


def from_dlpack(obj: Any, name: str, fn: str, output: bool, stream: Optional[int]) -> View:
    where = _err_prefix(fn, name)
    try:
        mt = _dlpack.export(obj, stream)
    except BufferError as e:
        raise InvalidArgumentError("%s: %s" % (where, e)) from e
    dl = mt.tensor
    v = View(name, obj, "dlpack")
    v.managed = mt
    try:
        if output and mt.read_only:
            raise InvalidArgumentError("%s is read-only (its DLPack export says so) and cannot take an output" % where)
        ndim = int(dl.ndim)
        if ndim < 0 or ndim > 64:
            raise InvalidArgumentError("%s: DLPack ndim is %d" % (where, ndim))
        shape = [int(dl.shape[i]) for i in range(ndim)] if ndim else []
        strides = [int(dl.strides[i]) for i in range(ndim)] if (ndim and dl.strides) else None
        if int(dl.dtype.lanes) != 1:
            raise DTypeError("%s: DLPack dtype has %d lanes; libwkv takes scalars" % (where, dl.dtype.lanes))
        v.fill(dl.data or 0, (int(dl.device.device_type), int(dl.device.device_id)),
               (int(dl.dtype.code), int(dl.dtype.bits)), shape, strides, int(dl.byte_offset))
    except BaseException:
        v.release()
        raise
    return v


def from_any(obj: Any, name: str, fn: str, *, output: bool = False, convert: bool = False,
             bf16: bool = False, stream: Optional[int] = None) -> View:
    """A :class:`View` of obj (see the module docstring for what is accepted)."""
    k = kind_of(obj)
    if k == "device":
        v = View(name, obj, "device")
        t, shape = obj.tensor()
        v.tensor = t
        v._keep += [shape, obj]
        v.device = (t.device.type, t.device.id)
        v.code_bits = obj.code_bits
        v.shape = obj.shape
        return v
    if k == "numpy":
        return from_numpy(obj, name, fn, output, convert, bf16)
    if k == "torch":
        return from_torch(obj, name, fn, output, convert)
    if k == "dlpack":
        return from_dlpack(obj, name, fn, output, stream)
    if convert and not output:
        np = _np()
        try:
            arr = np.asarray(obj, dtype=np.float32)
        except (TypeError, ValueError) as e:
            raise TypeError("%s: cannot make a float32 array of %s: %s" % (_err_prefix(fn, name),
                                                                           type(obj).__name__, e)) from e
        return from_numpy(arr, name, fn, output, False, bf16)
    raise TypeError("%s is a %s; expected a numpy array, a torch tensor or an object with __dlpack__%s"
                    % (_err_prefix(fn, name), type(obj).__name__,
                       "" if output else " (convert=True makes a float32 array of sequences)"))


# ------------------------------------------------------------------------------ allocation


class Allocator:
    """Makes outputs of the caller's array type: numpy on the host, torch on CUDA (or when the
    inputs were torch tensors)."""

    def __init__(self, kind: str, device: Tuple[int, int], context: Any = None) -> None:
        self.kind = kind  # "numpy" | "torch" | "device" (wkv.DeviceArray of `context`)
        self.device = device
        self.context = context

    def torch_device(self) -> Any:
        torch = torch_module()
        if self.device[0] in (WKV_DEVICE_CUDA, WKV_DEVICE_CUDA_MANAGED):
            return torch.device("cuda", self.device[1])
        return torch.device("cpu")

    def empty(self, shape: Sequence[int], like: Optional[View], code_bits: Optional[Tuple[int, int]] = None,
              fill_nan: bool = False) -> Any:
        """An uninitialised array of `shape` with `like`'s dtype (or code_bits)."""
        if code_bits is None:
            code_bits = like.code_bits if like is not None else F32
        if self.kind == "device":
            from .device import DeviceArray

            return DeviceArray(shape, DTYPE_NAMES.get(tuple(code_bits), "float32"), context=self.context)
        if self.kind == "torch":
            torch = torch_module()
            if like is not None and like.torch_dtype is not None and like.code_bits == code_bits:
                dt = like.torch_dtype
            else:
                dt = torch_dtype_for(code_bits)
            out = torch.empty(tuple(shape), dtype=dt, device=self.torch_device())
            if fill_nan:
                out.fill_(float("nan"))
            return out
        np = _np()
        if like is not None and like.np_dtype is not None and like.code_bits == code_bits:
            dt = like.np_dtype
        else:
            dt, _ = numpy_dtype_for(code_bits)
        out = np.empty(tuple(shape), dtype=dt)
        if fill_nan:
            out.view(np.uint8).fill(0xFF)
        return out

    def bytes(self, n: int) -> Any:
        """A scratch buffer of n bytes in the backend's memory space."""
        if self.kind == "torch":
            torch = torch_module()
            return torch.empty(max(n, 1), dtype=torch.uint8, device=self.torch_device())
        np = _np()
        return np.empty(max(n, 1), dtype=np.uint8)


def buffer_address(buf: Any, name: str, fn: str) -> Tuple[int, int]:
    """(address, size in bytes) of a contiguous scratch buffer (numpy array or torch tensor)."""
    if is_numpy_array(buf):
        if not buf.flags.c_contiguous or not buf.flags.writeable:
            raise InvalidArgumentError("%s: %s must be a writable C-contiguous numpy array" % (fn, name))
        return buf.ctypes.data, buf.nbytes
    if is_torch_tensor(buf):
        if not buf.is_contiguous():
            raise InvalidArgumentError("%s: %s must be a contiguous torch tensor" % (fn, name))
        return buf.data_ptr(), buf.numel() * buf.element_size()
    raise TypeError("%s: %s must be a numpy array or a torch tensor, not %s" % (fn, name, type(buf).__name__))


def host_int64(seq: Any, name: str, fn: str, convert: bool) -> Tuple[Any, int]:
    """seq_offsets as a host int64 numpy array (kept alive by the caller) and its address.

    Offsets are small host metadata: any sequence of ints is accepted and made an int64 array;
    only a tensor on a GPU, which would need a device-to-host copy, is refused unless
    convert=True."""
    np = _np()
    if is_torch_tensor(seq):
        if seq.device.type != "cpu":
            if not convert:
                raise DeviceMismatchError("%s: %s is on %s; it must be a host array (the library reads it "
                                          "on the CPU); pass convert=True to copy it" % (fn, name, seq.device))
            seq = seq.cpu()
        seq = seq.numpy()
    elif kind_of(seq) == "dlpack" and device_of(seq)[0] not in (WKV_DEVICE_CPU, WKV_DEVICE_CUDA_HOST):
        raise DeviceMismatchError("%s: %s must be a host array" % (fn, name))
    try:
        arr = np.ascontiguousarray(np.asarray(seq), dtype=np.int64)
    except (TypeError, ValueError) as e:
        raise TypeError("%s: %s must be a sequence of ints: %s" % (fn, name, e)) from e
    if arr.ndim != 1:
        raise InvalidArgumentError("%s: %s must be one-dimensional (num_seqs + 1 offsets), got shape %s"
                                   % (fn, name, arr.shape))
    return arr, arr.ctypes.data
