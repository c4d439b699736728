"""The functional API: ``rwkv7``, ``rwkv6``, ``rwkv4`` and their ``*_backward``.

All three ops run through one engine (:func:`forward` / :func:`backward`) driven by an
:class:`OpSpec`; adding an op to the C library needs no new code here beyond its spec and its
two thin public functions.

Arrays in and out (see :mod:`wkv._tensors` for the exact rules):

* numpy in → numpy out; torch in → torch out (same device); objects that only speak DLPack →
  numpy on the host (torch on CUDA, which needs PyTorch installed to allocate the outputs).
* Nothing is copied or converted unless ``convert=True`` (which only ever copies *inputs*:
  to float32, or to a contiguous layout when numpy strides are not whole elements).
* ``out=`` / ``state_out=`` (and ``out={...}`` for the gradients) write into arrays you give;
  ``state_out`` may be the very array passed as ``state`` (stepping in place).
* Outputs you do not give are allocated: ``y`` with ``v``'s dtype, each gradient with its
  input's dtype, states as float32.
* On a CUDA context the call is enqueued on ``torch.cuda.current_stream()`` and returns
  without synchronising, like a PyTorch op.
"""

from __future__ import annotations

import importlib
from ctypes import POINTER, byref, c_int64, c_size_t, cast, pointer, sizeof
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from . import _fast, _lib
from ._lib import (
    DECAY_CODES,
    DECAY_NAMES,
    WKV_BACKWARD_REUSE_CHECKPOINTS,
    WKV_DEVICE_CPU,
    WKV_DEVICE_CUDA_HOST,
    WKV_ERROR_NULL_POINTER,
    WKV_FLAG_RWKV4_STATE_INTERLEAVED,
    WKV_FLAG_STATE_KEY_MAJOR,
    WKV_OP_RWKV4,
    WKV_OP_RWKV6,
    WKV_OP_RWKV7,
    check,
    load,
)
from ._tensors import (
    F32,
    Allocator,
    View,
    absent,
    buffer_address,
    device_of,
    from_any,
    host_int64,
    kind_of,
    torch_module,
)
from .context import Context, resolve_context
from .errors import InvalidArgumentError, OutOfMemoryError

__all__ = [
    "rwkv7", "rwkv7_backward", "rwkv6", "rwkv6_backward", "rwkv4", "rwkv4_backward",
    "WkvOutput", "Rwkv7Grads", "Rwkv6Grads", "Rwkv4Grads", "OpSpec", "SPECS",
]

ArrayLike = Any


class WkvOutput(NamedTuple):
    """What a forward call returns: ``y`` and the final ``state`` (float32)."""

    y: Any
    state: Any


class Rwkv7Grads(NamedTuple):
    """Gradients of an RWKV-7 call, each the shape and dtype of its input; ``dstate0`` is the
    gradient with respect to the initial state (float32; of the zero state when none was
    given)."""

    dr: Any
    dw: Any
    dk: Any
    dv: Any
    da: Any
    db: Any
    dstate0: Any


class Rwkv6Grads(NamedTuple):
    """Gradients of an RWKV-6 call (``du`` has u's shape [H, N])."""

    dr: Any
    dw: Any
    dk: Any
    dv: Any
    du: Any
    dstate0: Any


class Rwkv4Grads(NamedTuple):
    """Gradients of an RWKV-4 call (``dw``, ``du`` have shape [C])."""

    dw: Any
    du: Any
    dk: Any
    dv: Any
    dstate0: Any


class OpSpec(NamedTuple):
    """What the engine needs to know about an op."""

    name: str
    code: int
    inputs: Tuple[str, ...]  # in the op's public argument order
    default_decay: str
    layouts: Tuple[str, ...]  # state_layout names; the second sets `layout_flag`
    layout_flag: int
    grads: Any  # the NamedTuple class of its gradients


SPECS: Dict[str, OpSpec] = {
    "rwkv7": OpSpec("rwkv7", WKV_OP_RWKV7, ("r", "w", "k", "v", "a", "b"), "clampw", ("vk", "kv"),
                    WKV_FLAG_STATE_KEY_MAJOR, Rwkv7Grads),
    "rwkv6": OpSpec("rwkv6", WKV_OP_RWKV6, ("r", "w", "k", "v", "u"), "exp_neg_exp", ("vk", "kv"),
                    WKV_FLAG_STATE_KEY_MAJOR, Rwkv6Grads),
    "rwkv4": OpSpec("rwkv4", WKV_OP_RWKV4, ("w", "u", "k", "v"), "exp_neg_exp", ("planar", "interleaved"),
                    WKV_FLAG_RWKV4_STATE_INTERLEAVED, Rwkv4Grads),
}


# ------------------------------------------------------------------------------ arguments


def decay_code(fn: str, decay: Union[str, int]) -> int:
    """A decay form name (``"direct"``, ``"log"``, ``"exp_neg_exp"``, ``"clampw"``) or its
    ``wkv_decay_form`` value, as the value."""
    if isinstance(decay, str):
        code = DECAY_CODES.get(decay.lower())
        if code is None:
            raise InvalidArgumentError("%s: decay is %r: expected one of %s" % (
                fn, decay, ", ".join(repr(n) for n in DECAY_NAMES.values())))
        return code
    return int(decay)  # an int goes to the library as it is (it validates the range)


def layout_flags(spec: OpSpec, fn: str, state_layout: str) -> int:
    if state_layout == spec.layouts[0]:
        return 0
    if state_layout == spec.layouts[1]:
        return spec.layout_flag
    raise InvalidArgumentError("%s: state_layout is %r: expected %r or %r" % (fn, state_layout, *spec.layouts))


def _bf16(fn: str, dtype: Optional[str]) -> bool:
    if dtype is None:
        return False
    if dtype in ("bf16", "bfloat16"):
        return True
    raise InvalidArgumentError("%s: dtype is %r: the only value is 'bf16' (numpy uint16 arrays hold "
                               "bfloat16 bit patterns)" % (fn, dtype))


def _array_context(obj: Any) -> Optional[Context]:
    """The context a wkv.DeviceArray belongs to (calls on it default to that context)."""
    return obj.context if kind_of(obj) == "device" else None


def _plan(fn: str, named: Sequence[Tuple[str, Any]], v: Any) -> Tuple[str, Tuple[int, int]]:
    """The kind of arrays to return ("numpy", "torch" or "device") and the device of v."""
    if kind_of(v) == "device":
        return "device", device_of(v)
    np_names = [n for n, o in named if o is not None and kind_of(o) == "numpy"]
    th_names = [n for n, o in named if o is not None and kind_of(o) == "torch"]
    if np_names and th_names:
        raise TypeError("%s: mixes numpy arrays (%s) and torch tensors (%s); pass one kind" % (
            fn, ", ".join(np_names), ", ".join(th_names)))
    device = device_of(v) if v is not None else (WKV_DEVICE_CPU, 0)
    if th_names or device[0] not in (WKV_DEVICE_CPU, WKV_DEVICE_CUDA_HOST):
        if torch_module() is None:
            try:
                importlib.import_module("torch")
            except ImportError as e:
                raise TypeError("%s: arrays on device type %d need PyTorch to allocate the outputs; "
                                "install torch" % (fn, device[0])) from e
        return "torch", device
    return "numpy", device


def _dlpack_stream(ctx: Context) -> Optional[int]:
    """Points a CUDA context at torch's current stream (before every call) and returns the
    stream to hand DLPack producers (1 = the legacy default stream); None off CUDA."""
    if ctx.backend != "cuda":
        return None
    torch = torch_module()
    if torch is None:
        try:
            torch = importlib.import_module("torch")
        except ImportError:
            torch = None
    if torch is None:
        s = ctx.cuda_stream()
        return s if s else 1
    s = int(torch.cuda.current_stream(ctx.device).cuda_stream)
    ctx.set_cuda_stream(s)
    return s if s else 1


class _Call:
    """The views of one call, released (DLPack deleters called) when it ends."""

    def __init__(self, fn: str, ctx: Context, convert: bool, bf16: bool, stream: Optional[int]) -> None:
        self.fn = fn
        self.ctx = ctx
        self.convert = convert
        self.bf16 = bf16
        self.stream = stream
        self.views: List[View] = []
        self.alloc_errors: List[str] = []

    def view(self, obj: Any, name: str, output: bool = False, bf16: bool = False) -> View:
        v = from_any(obj, name, self.fn, output=output, convert=self.convert and not output,
                     bf16=self.bf16 or bf16, stream=self.stream)
        self.views.append(v)
        return v

    def output(self, given: Any, name: str, alloc: Allocator, shape: Optional[Sequence[int]],
               like: Optional[View], code_bits: Optional[Tuple[int, int]] = None,
               poison: bool = False) -> Tuple[Any, Any]:
        """(object to return, wkv_tensor) for an output: `given`, or a new array."""
        if given is not None:
            return given, self.view(given, name, output=True).tensor
        if shape is None:  # v has the wrong rank: the library reports it before this output
            return None, absent()
        try:
            obj = alloc.empty(shape, like, code_bits, fill_nan=poison)
        except (MemoryError, ValueError, RuntimeError) as e:
            self.alloc_errors.append("%s %s: %s" % (name, tuple(shape), e))
            return None, absent()
        uint16_bf16 = like is not None and like.uint16_bf16 and (code_bits is None or code_bits == like.code_bits)
        return obj, self.view(obj, name, output=True, bf16=uint16_bf16).tensor

    def check(self, status: int) -> None:
        if status != 0 and self.alloc_errors and status == WKV_ERROR_NULL_POINTER:
            raise OutOfMemoryError("%s: could not allocate %s" % (self.fn, "; ".join(self.alloc_errors)))
        check(status, self.ctx.handle, fn=self.fn)

    def release(self) -> None:
        cuda_dlpack = self.ctx.backend == "cuda" and any(v.managed is not None for v in self.views)
        if cuda_dlpack and torch_module() is not None:
            # Foreign CUDA memory goes back to its producer only once our work on it is done.
            torch_module().cuda.current_stream(self.ctx.device).synchronize()
        for v in self.views:
            v.release()
        self.views = []


def _state_shape(spec: OpSpec, vshape: Tuple[int, ...], num_seqs: int, flags: int) -> Optional[Tuple[int, ...]]:
    if spec.code == WKV_OP_RWKV4:
        if len(vshape) != 3:
            return None
        S = num_seqs if num_seqs > 0 else vshape[0]
        C = vshape[2]
        return (S, C, 3) if flags & WKV_FLAG_RWKV4_STATE_INTERLEAVED else (S, 3, C)
    if len(vshape) != 4:
        return None
    S = num_seqs if num_seqs > 0 else vshape[0]
    return (S, vshape[2], vshape[3], vshape[3])


def _forward_desc(spec: OpSpec, call: _Call, inputs: Mapping[str, Any], state: Any, decay: int, flags: int,
                  seq_offsets: Any) -> Tuple[Any, Dict[str, View], int, List[Any]]:
    """A filled forward descriptor (inputs, state_in, packing; no outputs)."""
    desc = _lib.wkv_forward_desc()
    desc.struct_size = sizeof(desc)
    desc.op = spec.code
    desc.decay_form = decay
    desc.flags = flags
    views: Dict[str, View] = {}
    for name in spec.inputs:
        obj = inputs[name]
        if obj is None:
            raise TypeError("%s: %s is required" % (call.fn, name))
        views[name] = call.view(obj, name)
        setattr(desc, name, views[name].tensor)
    if state is not None:
        views["state"] = call.view(state, "state")
        desc.state_in = views["state"].tensor
    keep: List[Any] = []
    num_seqs = 0
    if seq_offsets is not None:
        arr, addr = host_int64(seq_offsets, "seq_offsets", call.fn, call.convert)
        keep.append(arr)
        num_seqs = len(arr) - 1
        desc.seq_offsets = cast(addr, POINTER(c_int64))
        desc.num_seqs = num_seqs
    return desc, views, num_seqs, keep


def _want_autograd(objs: Sequence[Any]) -> bool:
    torch = torch_module()
    if torch is None or not torch.is_grad_enabled():
        return False
    tensor = torch.Tensor
    for o in objs:  # a plain loop: this runs on every call (the fast path's budget is ~15 µs)
        if isinstance(o, tensor) and o.requires_grad:
            return True
    return False


# ------------------------------------------------------------------------------ the engine


def forward(spec: OpSpec, fn: str, inputs: Mapping[str, Any], state: Any = None, *,
            decay: Union[str, int, None] = None, state_layout: Optional[str] = None, seq_offsets: Any = None,
            out: Any = None, state_out: Any = None, context: Optional[Context] = None, convert: bool = False,
            dtype: Optional[str] = None, poison: bool = False, workspace: Any = None,
            scratch: Any = None) -> WkvOutput:
    """Runs ``wkv_forward`` for `spec` (the public op functions call this). With `workspace`
    (the backward's), the forward also saves its checkpoints there for a backward with
    ``reuse_checkpoints=True``; with `scratch`, the forward's temporary memory is the caller's."""
    decay_c = decay_code(fn, spec.default_decay if decay is None else decay)
    flags = layout_flags(spec, fn, state_layout or spec.layouts[0])
    if seq_offsets is None and workspace is None and scratch is None and not convert and dtype is None \
            and not poison and _fast.host_array(inputs.get("v")):
        done = _fast.forward(spec, inputs, state, decay_c, flags, out, state_out,
                             resolve_context(context, (WKV_DEVICE_CPU, 0)), _state_shape, load(), fn)
        if done is not None:
            return WkvOutput(*done)
    bf16 = _bf16(fn, dtype)
    named = [(n, inputs.get(n)) for n in spec.inputs] + [("state", state), ("out", out), ("state_out", state_out)]
    kind, device = _plan(fn, named, inputs.get("v"))
    ctx = resolve_context(context if context is not None else _array_context(inputs.get("v")), device)
    lib = load()
    with ctx.lock:
        call = _Call(fn, ctx, convert, bf16, _dlpack_stream(ctx))
        try:
            desc, views, num_seqs, keep = _forward_desc(spec, call, inputs, state, decay_c, flags, seq_offsets)
            v = views["v"]
            alloc = Allocator(kind, v.device, ctx)
            y_obj, desc.y = call.output(out, "out", alloc, v.shape, v, poison=poison)
            s_shape = _state_shape(spec, v.shape, num_seqs, flags)
            s_obj, desc.state_out = call.output(state_out, "state_out", alloc, s_shape, None, F32, poison=poison)
            if workspace is not None:
                desc.workspace, desc.workspace_size = buffer_address(workspace, "workspace", fn)
            if scratch is not None:
                desc.scratch, desc.scratch_size = buffer_address(scratch, "scratch", fn)
            call.check(lib.wkv_forward(ctx.handle, byref(desc)))
            del keep
        finally:
            call.release()
    return WkvOutput(y_obj, s_obj)


def backward(spec: OpSpec, fn: str, inputs: Mapping[str, Any], dy: Any, state: Any = None, dstate: Any = None, *,
             decay: Union[str, int, None] = None, state_layout: Optional[str] = None, seq_offsets: Any = None,
             out: Optional[Mapping[str, Any]] = None, workspace: Any = None, context: Optional[Context] = None,
             convert: bool = False, dtype: Optional[str] = None, poison: bool = False,
             reuse_checkpoints: bool = False) -> Any:
    """Runs ``wkv_workspace_size`` + ``wkv_backward`` for `spec`."""
    if reuse_checkpoints and workspace is None:
        raise InvalidArgumentError("%s: reuse_checkpoints=True needs workspace= (the one the forward "
                                   "saved its checkpoints into)" % fn)
    decay_c = decay_code(fn, spec.default_decay if decay is None else decay)
    flags = layout_flags(spec, fn, state_layout or spec.layouts[0])
    bf16 = _bf16(fn, dtype)
    out = dict(out or {})
    grad_names = list(spec.grads._fields)
    unknown = set(out) - set(grad_names)
    if unknown:
        raise InvalidArgumentError("%s: out has unknown keys %s; the gradients are %s" % (
            fn, sorted(unknown), ", ".join(grad_names)))
    if dy is None:
        raise TypeError("%s: dy is required" % fn)
    named = [(n, inputs.get(n)) for n in spec.inputs] + [("state", state), ("dy", dy), ("dstate", dstate)] + \
        [(k, o) for k, o in out.items()]
    kind, device = _plan(fn, named, inputs.get("v"))
    ctx = resolve_context(context if context is not None else _array_context(inputs.get("v")), device)
    lib = load()
    with ctx.lock:
        call = _Call(fn, ctx, convert, bf16, _dlpack_stream(ctx))
        try:
            fdesc, views, num_seqs, keep = _forward_desc(spec, call, inputs, state, decay_c, flags, seq_offsets)
            v = views["v"]
            alloc = Allocator(kind, v.device, ctx)
            bd = _lib.wkv_backward_desc()
            bd.struct_size = sizeof(bd)
            bd.forward = pointer(fdesc)
            bd.dy = call.view(dy, "dy").tensor
            if dstate is not None:
                bd.dstate_out = call.view(dstate, "dstate").tensor
            results: Dict[str, Any] = {}
            for name in spec.inputs:
                g = "d" + name
                iv = views[name]
                results[g], t = call.output(out.get(g), g, alloc, iv.shape, iv, poison=poison)
                setattr(bd, g, t)
            s_shape = _state_shape(spec, v.shape, num_seqs, flags)
            results["dstate0"], bd.dstate_in = call.output(out.get("dstate0"), "dstate0", alloc, s_shape, None, F32,
                                                           poison=poison)
            if workspace is not None:
                addr, size = buffer_address(workspace, "workspace", fn)
                bd.workspace, bd.workspace_size = addr, size
            else:
                n = c_size_t()
                call.check(lib.wkv_workspace_size(ctx.handle, byref(n), byref(bd)))
                if n.value:
                    ws = alloc.bytes(n.value)
                    keep.append(ws)
                    bd.workspace, _ = buffer_address(ws, "workspace", fn)
                    bd.workspace_size = n.value
            if reuse_checkpoints:
                bd.flags = WKV_BACKWARD_REUSE_CHECKPOINTS
            call.check(lib.wkv_backward(ctx.handle, byref(bd)))
            del keep
        finally:
            call.release()
    return spec.grads(**results)


def workspace_size(op: str, inputs: Mapping[str, Any], dy: Any, state: Any = None, dstate: Any = None, *,
                   decay: Union[str, int, None] = None, state_layout: Optional[str] = None,
                   seq_offsets: Any = None, context: Optional[Context] = None, dtype: Optional[str] = None) -> int:
    """The bytes of scratch ``<op>_backward`` needs for these arguments on `context` (to
    allocate a ``workspace=`` once and reuse it across steps)."""
    spec = SPECS[op]
    fn = "wkv.workspace_size"
    decay_c = decay_code(fn, spec.default_decay if decay is None else decay)
    flags = layout_flags(spec, fn, state_layout or spec.layouts[0])
    named = [(n, inputs.get(n)) for n in spec.inputs] + [("state", state), ("dy", dy)]
    kind, device = _plan(fn, named, inputs.get("v"))
    ctx = resolve_context(context if context is not None else _array_context(inputs.get("v")), device)
    lib = load()
    with ctx.lock:
        call = _Call(fn, ctx, False, _bf16(fn, dtype), _dlpack_stream(ctx))
        try:
            fdesc, views, num_seqs, keep = _forward_desc(spec, call, inputs, state, decay_c, flags, seq_offsets)
            v = views["v"]
            bd = _lib.wkv_backward_desc()
            bd.struct_size = sizeof(bd)
            bd.forward = pointer(fdesc)
            bd.dy = call.view(dy, "dy").tensor
            if dstate is not None:
                bd.dstate_out = call.view(dstate, "dstate").tensor
            # The gradient outputs must be valid, distinct memory even for the size query.
            alloc = Allocator(kind, v.device, ctx)
            for name in spec.inputs:
                iv = views[name]
                _, t = call.output(None, "d" + name, alloc, iv.shape, iv)
                setattr(bd, "d" + name, t)
            n = c_size_t()
            call.check(lib.wkv_workspace_size(ctx.handle, byref(n), byref(bd)))
            del keep
        finally:
            call.release()
    return int(n.value)


def forward_scratch_size(op: str, inputs: Mapping[str, Any], state: Any = None, *,
                         decay: Union[str, int, None] = None, state_layout: Optional[str] = None,
                         seq_offsets: Any = None, workspace: Any = None, context: Optional[Context] = None,
                         dtype: Optional[str] = None) -> int:
    """The bytes of scratch ``<op>`` can use for these arguments on `context` (to allocate a
    ``scratch=`` once and reuse it); 0 when the call needs none (the CPU and Vulkan backends;
    CUDA wherever its sequential kernel runs). Pass the `workspace` the forward will get, if
    any: a forward that saves checkpoints may run another kernel."""
    spec = SPECS[op]
    fn = "wkv.forward_scratch_size"
    decay_c = decay_code(fn, spec.default_decay if decay is None else decay)
    flags = layout_flags(spec, fn, state_layout or spec.layouts[0])
    named = [(n, inputs.get(n)) for n in spec.inputs] + [("state", state)]
    kind, device = _plan(fn, named, inputs.get("v"))
    ctx = resolve_context(context if context is not None else _array_context(inputs.get("v")), device)
    lib = load()
    if not hasattr(lib, "wkv_forward_scratch_size"):
        return 0  # an older libwkv: its forwards take no scratch
    with ctx.lock:
        call = _Call(fn, ctx, False, _bf16(fn, dtype), _dlpack_stream(ctx))
        try:
            desc, views, _, keep = _forward_desc(spec, call, inputs, state, decay_c, flags, seq_offsets)
            v = views["v"]
            # y must be valid, distinct memory even for the size query
            _, desc.y = call.output(None, "out", Allocator(kind, v.device, ctx), v.shape, v)
            if workspace is not None:
                desc.workspace, desc.workspace_size = buffer_address(workspace, "workspace", fn)
            n = c_size_t()
            call.check(lib.wkv_forward_scratch_size(ctx.handle, byref(n), byref(desc)))
            del keep
        finally:
            call.release()
    return int(n.value)


# ------------------------------------------------------------------------------ public ops

_COMMON_DOC = """
    Keyword args:
        state: optional initial state, float32 (see the shape above); zeros when None.
        state_layout: how the state is indexed (see above).
        seq_offsets: optional packed variable-length sequences: a host sequence of num_seqs + 1
            non-decreasing ints from 0 to T; the per-token tensors are then [1, T, ...] and the
            states have one slot per sequence.
        out: optional array to write y into (same shape as v).
        state_out: optional array for the final state; may be `state` itself (in place).
        workspace: optional, for training: the workspace the backward will get (at least
            :func:`wkv.workspace_size` bytes); the forward also saves its state checkpoints
            there, so that ``<op>_backward(..., workspace=it, reuse_checkpoints=True)`` skips
            recomputing them. Backends that do not save checkpoints ignore it.
        scratch: optional temporary memory for the forward, owned by the caller (a contiguous
            numpy uint8 array, or a torch tensor on the context's device) of at least
            :func:`wkv.forward_scratch_size` bytes; without it a backend that needs some (CUDA's
            chunked RWKV-7 forward) takes it from a pool of the context. Ignored where 0.
        context: a :class:`wkv.Context`; default: the one of :func:`wkv.use_context`, else a
            shared context for the memory the tensors live in (CPU backend for host arrays).
        convert: allow float32 / contiguous *copies of inputs* that are not float32, float16,
            bfloat16 or whose numpy strides are not whole elements (default: raise).
        dtype: ``"bf16"`` to read numpy ``uint16`` arrays as bfloat16 bit patterns (only needed
            without ml_dtypes; ``ml_dtypes.bfloat16`` arrays are recognised as they are).

    Returns:
        ``WkvOutput(y, state)``: y like v (v's dtype) and the final state (float32), as the
        caller's array type.

    Raises:
        WkvError subclasses with the library's message naming the argument (ShapeError,
        DTypeError, AliasingError, DeviceMismatchError, SequenceOffsetsError,
        UnsupportedError, BackendUnavailableError, ...).
"""


def _doc(text: str) -> str:
    return text + _COMMON_DOC


def rwkv7(r: ArrayLike, w: ArrayLike, k: ArrayLike, v: ArrayLike, a: ArrayLike, b: ArrayLike,
          state: Optional[ArrayLike] = None, *, decay: Union[str, int] = "clampw", state_layout: str = "vk",
          seq_offsets: Any = None, out: Any = None, state_out: Any = None, context: Optional[Context] = None,
          convert: bool = False, dtype: Optional[str] = None,
          workspace: Any = None, scratch: Any = None) -> WkvOutput:
    if _want_autograd((r, w, k, v, a, b, state)):
        if out is not None or state_out is not None or workspace is not None or scratch is not None:
            raise InvalidArgumentError("wkv.rwkv7: out= and state_out= do not support autograd "
                                       "(inputs require grad)")
        from . import torch as _t

        return WkvOutput(*_t.rwkv7(r, w, k, v, a, b, state, decay=decay, state_layout=state_layout,
                                   seq_offsets=seq_offsets, context=context))
    return forward(SPECS["rwkv7"], "wkv.rwkv7", dict(r=r, w=w, k=k, v=v, a=a, b=b), state, decay=decay,
                   state_layout=state_layout, seq_offsets=seq_offsets, out=out, state_out=state_out,
                   context=context, convert=convert, dtype=dtype, workspace=workspace,
                   scratch=scratch)


rwkv7.__doc__ = _doc("""RWKV-7 WKV forward.

    Per token t, for each batch b and head h, with the state S[i][j] (i value, j key)::

        sa[i]   = sum_l S[i][l] * a_t[l]
        S[i][j] = S[i][j] * decay_t[j] + sa[i] * b_t[j] + v_t[i] * k_t[j]
        y_t[i]  = sum_j S[i][j] * r_t[j]

    Args:
        r, w, k, v, a, b: [B, T, H, N] arrays (float32, float16 or bfloat16; each its own
            dtype; any strides).
        decay: how w gives decay_t: ``"clampw"`` (exp(-exp(-0.5)*sigmoid(w)), RWKV-7 models;
            default), ``"log"`` (exp(w)), ``"exp_neg_exp"`` (exp(-exp(w))), ``"direct"`` (w).
        state: [B, H, N, N] (or [num_seqs, H, N, N] when packed).
        state_layout: ``"vk"`` (S[i][j], value-major; default) or ``"kv"`` (key-major,
            flash-linear-attention's order).

    With torch tensors that require grad (and grad mode on) this is differentiable: it runs
    through :func:`wkv.torch.rwkv7`.
""")


def rwkv7_backward(r: ArrayLike, w: ArrayLike, k: ArrayLike, v: ArrayLike, a: ArrayLike, b: ArrayLike,
                   dy: ArrayLike, state: Optional[ArrayLike] = None, dstate: Optional[ArrayLike] = None, *,
                   decay: Union[str, int] = "clampw", state_layout: str = "vk", seq_offsets: Any = None,
                   out: Optional[Mapping[str, Any]] = None, workspace: Any = None,
                   context: Optional[Context] = None, convert: bool = False,
                   dtype: Optional[str] = None,
                   reuse_checkpoints: bool = False) -> Rwkv7Grads:
    """RWKV-7 WKV backward: the gradients of a loss L given dL/dy (``dy``, shape of v) and
    optionally dL/d(final state) (``dstate``).

    The forward is recomputed from checkpoints inside the library (pass the same inputs,
    ``state``, ``decay``, ``state_layout`` and ``seq_offsets`` as the forward call).

    Args:
        out: optional dict of arrays to write gradients into, keys ``dr dw dk dv da db
            dstate0``; the others are allocated.
        workspace: optional scratch (a contiguous numpy uint8 array, or a torch tensor on the
            context's device) of at least :func:`wkv.workspace_size` bytes, to reuse across
            calls; allocated per call when None.
        reuse_checkpoints: the forward was called with ``workspace=`` this same workspace (on
            the same context, with the same inputs and arguments, nothing written to the
            workspace since): reuse the state checkpoints it saved there instead of
            recomputing them (faster on the CPU backend; the results are the same bit for
            bit). The library checks the workspace's address and the arguments (raises
            InvalidArgumentError naming ``workspace`` otherwise) but cannot see changed data.
        other arguments: as :func:`wkv.rwkv7`.

    Returns:
        ``Rwkv7Grads(dr, dw, dk, dv, da, db, dstate0)``: dw is with respect to w in its decay
        form; dstate0 (float32) is with respect to the initial state (the zero state when
        ``state`` is None).
    """
    return backward(SPECS["rwkv7"], "wkv.rwkv7_backward", dict(r=r, w=w, k=k, v=v, a=a, b=b), dy, state, dstate,
                    decay=decay, state_layout=state_layout, seq_offsets=seq_offsets, out=out, workspace=workspace,
                    context=context, convert=convert, dtype=dtype,
                    reuse_checkpoints=reuse_checkpoints)


def rwkv6(r: ArrayLike, w: ArrayLike, k: ArrayLike, v: ArrayLike, u: ArrayLike, state: Optional[ArrayLike] = None,
          *, decay: Union[str, int] = "exp_neg_exp", state_layout: str = "vk", seq_offsets: Any = None,
          out: Any = None, state_out: Any = None, context: Optional[Context] = None, convert: bool = False,
          dtype: Optional[str] = None,
          workspace: Any = None, scratch: Any = None) -> WkvOutput:
    if _want_autograd((r, w, k, v, u, state)):
        if out is not None or state_out is not None or workspace is not None or scratch is not None:
            raise InvalidArgumentError("wkv.rwkv6: out= and state_out= do not support autograd")
        from . import torch as _t

        return WkvOutput(*_t.rwkv6(r, w, k, v, u, state, decay=decay, state_layout=state_layout,
                                   seq_offsets=seq_offsets, context=context))
    return forward(SPECS["rwkv6"], "wkv.rwkv6", dict(r=r, w=w, k=k, v=v, u=u), state, decay=decay,
                   state_layout=state_layout, seq_offsets=seq_offsets, out=out, state_out=state_out,
                   context=context, convert=convert, dtype=dtype, workspace=workspace,
                   scratch=scratch)


rwkv6.__doc__ = _doc("""RWKV-6 (and RWKV-5) WKV forward.

    Per token t::

        y_t[i]  = sum_j r_t[j] * (S[i][j] + u[j] * k_t[j] * v_t[i])
        S[i][j] = S[i][j] * decay_t[j] + k_t[j] * v_t[i]

    Args:
        r, w, k, v: [B, T, H, N]; RWKV-5 is w with a T-stride of 0 (e.g. numpy
            ``np.broadcast_to``).
        u: the bonus, [H, N].
        decay: default ``"exp_neg_exp"`` (RWKV-6 checkpoints); see :func:`wkv.rwkv7`.
        state: [B, H, N, N]; state_layout ``"vk"`` or ``"kv"``.

    Raises UnsupportedError while the loaded backend has no RWKV-6 kernel.
""")


def rwkv6_backward(r: ArrayLike, w: ArrayLike, k: ArrayLike, v: ArrayLike, u: ArrayLike, dy: ArrayLike,
                   state: Optional[ArrayLike] = None, dstate: Optional[ArrayLike] = None, *,
                   decay: Union[str, int] = "exp_neg_exp", state_layout: str = "vk", seq_offsets: Any = None,
                   out: Optional[Mapping[str, Any]] = None, workspace: Any = None,
                   context: Optional[Context] = None, convert: bool = False,
                   dtype: Optional[str] = None,
                   reuse_checkpoints: bool = False) -> Rwkv6Grads:
    """RWKV-6 backward; returns ``Rwkv6Grads(dr, dw, dk, dv, du, dstate0)``. Arguments as
    :func:`wkv.rwkv7_backward`."""
    return backward(SPECS["rwkv6"], "wkv.rwkv6_backward", dict(r=r, w=w, k=k, v=v, u=u), dy, state, dstate,
                    decay=decay, state_layout=state_layout, seq_offsets=seq_offsets, out=out, workspace=workspace,
                    context=context, convert=convert, dtype=dtype,
                    reuse_checkpoints=reuse_checkpoints)


def rwkv4(w: ArrayLike, u: ArrayLike, k: ArrayLike, v: ArrayLike, state: Optional[ArrayLike] = None, *,
          state_layout: str = "planar", seq_offsets: Any = None, out: Any = None, state_out: Any = None,
          context: Optional[Context] = None, convert: bool = False, dtype: Optional[str] = None,
          workspace: Any = None, scratch: Any = None) -> WkvOutput:
    if _want_autograd((w, u, k, v, state)):
        if out is not None or state_out is not None or workspace is not None or scratch is not None:
            raise InvalidArgumentError("wkv.rwkv4: out= and state_out= do not support autograd")
        from . import torch as _t

        return WkvOutput(*_t.rwkv4(w, u, k, v, state, state_layout=state_layout, seq_offsets=seq_offsets,
                                   context=context))
    return forward(SPECS["rwkv4"], "wkv.rwkv4", dict(w=w, u=u, k=k, v=v), state, decay="exp_neg_exp",
                   state_layout=state_layout, seq_offsets=seq_offsets, out=out, state_out=state_out,
                   context=context, convert=convert, dtype=dtype, workspace=workspace,
                   scratch=scratch)


rwkv4.__doc__ = _doc("""RWKV-4 WKV forward (numerically stable form).

    Args:
        w: time_decay, [C] (the per-step decay is exp(-exp(w))).
        u: time_first (the bonus), [C].
        k, v: [B, T, C].
        state: the (aa, bb, pp) triple, [B, 3, C] (``state_layout="planar"``, default) or
            [B, C, 3] (``"interleaved"``).

    Raises UnsupportedError while the loaded backend has no RWKV-4 kernel.
""")


def rwkv4_backward(w: ArrayLike, u: ArrayLike, k: ArrayLike, v: ArrayLike, dy: ArrayLike,
                   state: Optional[ArrayLike] = None, dstate: Optional[ArrayLike] = None, *,
                   state_layout: str = "planar", seq_offsets: Any = None, out: Optional[Mapping[str, Any]] = None,
                   workspace: Any = None, context: Optional[Context] = None, convert: bool = False,
                   dtype: Optional[str] = None,
                   reuse_checkpoints: bool = False) -> Rwkv4Grads:
    """RWKV-4 backward; returns ``Rwkv4Grads(dw, du, dk, dv, dstate0)``. Arguments as
    :func:`wkv.rwkv7_backward`."""
    return backward(SPECS["rwkv4"], "wkv.rwkv4_backward", dict(w=w, u=u, k=k, v=v), dy, state, dstate,
                    decay="exp_neg_exp", state_layout=state_layout, seq_offsets=seq_offsets, out=out,
                    workspace=workspace, context=context, convert=convert, dtype=dtype,
                    reuse_checkpoints=reuse_checkpoints)
