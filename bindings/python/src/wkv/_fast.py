"""The forward's fast path: host arrays of one kind and one dtype, contiguous, no extras.

A decode loop calls the op once per layer and token with the same shapes every time, and the
general path (views, DLPack rules, per-argument checks; ``ops.forward``) costs ~200 µs of
Python per call. Here a call whose arguments are all contiguous CPU torch tensors (or all
contiguous numpy arrays) of one supported dtype, with a float32 state, no packing, workspace,
scratch or conversion, reuses a descriptor built once for its signature (op, decay, flags,
dtype, shapes, context) and only writes the data pointers. Nothing is checked here that the
library checks anyway (shapes, aliasing): a call the library refuses raises the library's
message, as the general path would. Anything unusual (strides, other devices, mixed dtypes,
an address that is not element-aligned) returns None and takes the general path.
"""

from __future__ import annotations

import sys
from ctypes import POINTER, addressof as _addressof, byref, c_byte, c_int64, cast, sizeof
from typing import Any, Dict, Optional, Sequence, Tuple

from ._lib import WKV_DEVICE_CPU, check, wkv_forward_desc
from ._tensors import F32, SUPPORTED, numpy_code, torch_code

_from_buffer = c_byte.from_buffer

#: descriptors by signature; bounded (a model has a handful of shapes: prefill, decode)
_PLANS: Dict[Tuple[Any, ...], "_Plan"] = {}
_MAX_PLANS = 64


class _Plan:
    """A forward descriptor for one signature, its tensors' shape arrays, and direct handles on
    the ``data`` field of each tensor it fills."""

    __slots__ = ("desc", "desc_ref", "inputs", "y", "state_in", "state_out", "keep", "y_shape", "s_shape")

    def __init__(self, spec: Any, decay: int, flags: int, code: Tuple[int, int], shapes: Sequence[Tuple[int, ...]],
                 y_shape: Tuple[int, ...], s_shape: Optional[Tuple[int, ...]], has_state: bool) -> None:
        d = wkv_forward_desc()
        d.struct_size = sizeof(d)
        d.op, d.decay_form, d.flags = spec.code, decay, flags
        self.keep = []

        def fill(t: Any, shape: Tuple[int, ...], cb: Tuple[int, int]) -> Any:
            arr = (c_int64 * max(len(shape), 1))(*shape)
            self.keep.append(arr)
            t.device.type, t.device.id = WKV_DEVICE_CPU, 0
            t.ndim = len(shape)
            t.dtype.code, t.dtype.bits, t.dtype.lanes = cb[0], cb[1], 1
            t.shape = cast(arr, POINTER(c_int64))
            t.strides = None  # contiguous
            return t

        self.inputs = [fill(getattr(d, n), s, code) for n, s in zip(spec.inputs, shapes)]
        self.y = fill(d.y, y_shape, code)
        self.state_in = fill(d.state_in, s_shape, F32) if has_state else None
        self.state_out = fill(d.state_out, s_shape, F32) if s_shape is not None else None
        self.desc, self.desc_ref = d, byref(d)
        self.y_shape, self.s_shape = y_shape, s_shape


def host_array(obj: Any) -> bool:
    """A CPU torch tensor or a numpy array (the only kinds this path takes)."""
    torch = sys.modules.get("torch")
    if torch is not None and type(obj) is torch.Tensor:
        return obj.is_cpu
    np = sys.modules.get("numpy")
    return np is not None and type(obj) is np.ndarray


def _numpy_address(a: Any) -> int:
    """The array's data address: through the buffer protocol (0.3 µs) where the array is
    writable and non-empty, else numpy's ctypes attribute (1 µs)."""
    try:
        return _addressof(_from_buffer(a))
    except (TypeError, ValueError, BufferError):
        return a.ctypes.data


def forward(spec: Any, inputs: Any, state: Any, decay: int, flags: int, out: Any, state_out: Any,
            ctx: Any, state_shape_of: Any, lib: Any, fn: str) -> Optional[Tuple[Any, Any]]:
    """(y, final state) through a cached descriptor, or None for the general path."""
    if ctx.backend == "cuda":  # the general path points the context at torch's stream
        return None
    arrays = [inputs[n] for n in spec.inputs]
    first = arrays[0]
    torch = sys.modules.get("torch")
    if torch is not None and type(first) is torch.Tensor:
        dt = first.dtype
        tensor = torch.Tensor
        for t in arrays:
            if type(t) is not tensor or t.dtype is not dt or not t.is_cpu or not t.is_contiguous() or t.is_neg():
                return None
        for t in (state, out, state_out):
            if t is not None and (type(t) is not torch.Tensor or not t.is_cpu or not t.is_contiguous()):
                return None
        if state is not None and state.dtype is not torch.float32:
            return None
        if (out is not None or state_out is not None) and torch.is_grad_enabled() and any(
                t is not None and t.requires_grad for t in (out, state_out)):
            return None
        code = torch_code(dt)
        ptr = lambda t: t.data_ptr()  # noqa: E731
        kind = 0
    else:
        np = sys.modules.get("numpy")
        if np is None or type(first) is not np.ndarray:
            return None
        dt = first.dtype
        for t in arrays:
            if type(t) is not np.ndarray or t.dtype != dt or not t.flags.c_contiguous:
                return None
        for t in (state, out, state_out):
            if t is not None and (type(t) is not np.ndarray or not t.flags.c_contiguous):
                return None
        for t in (out, state_out):
            if t is not None and not t.flags.writeable:
                return None
        if state is not None and state.dtype != np.float32:
            return None
        code = numpy_code(dt, False)
        ptr = _numpy_address
        kind = 1
    if code not in SUPPORTED:
        return None
    shapes = tuple(tuple(t.shape) for t in arrays)
    v_shape = tuple(inputs["v"].shape)
    s_shape = state_shape_of(spec, v_shape, 0, flags)
    if s_shape is None or (state is not None and tuple(state.shape) != s_shape):
        return None
    if out is not None and (tuple(out.shape) != v_shape or out.dtype != dt):
        return None
    if state_out is not None and (tuple(state_out.shape) != s_shape or
                                  (state_out.dtype is not torch.float32 if kind == 0 else state_out.dtype != np.float32)):
        return None
    key = (spec.code, decay, flags, kind, code, shapes, state is not None, ctx.handle)
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[key] = _Plan(spec, decay, flags, code, shapes, v_shape, s_shape, state is not None)
    if out is None:
        out = torch.empty(v_shape, dtype=dt) if kind == 0 else np.empty(v_shape, dtype=dt)
    if state_out is None:
        state_out = torch.empty(s_shape, dtype=torch.float32) if kind == 0 else np.empty(s_shape, dtype=np.float32)
    ptrs = [ptr(t) for t in arrays]
    y_ptr, s_ptr = ptr(out), ptr(state_out)
    in_ptr = ptr(state) if state is not None else 0
    if kind == 1 and (any(p % dt.itemsize for p in ptrs) or y_ptr % dt.itemsize or (s_ptr | in_ptr) % 4):
        return None  # an address that is not a whole number of elements: the general path says so
    with ctx.lock:  # the plan is the context's: filled and called under its lock
        for slot, p in zip(plan.inputs, ptrs):
            slot.data = p
        plan.y.data = y_ptr
        if state is not None:
            plan.state_in.data = in_ptr
        plan.state_out.data = s_ptr
        status = lib.wkv_forward(ctx.handle, plan.desc_ref)
        if status != 0:  # the library's own message (it names the argument), read under the lock
            check(status, ctx.handle, fn=fn)
    return out, state_out
