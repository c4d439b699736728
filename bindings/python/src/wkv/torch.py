"""PyTorch integration: differentiable ``rwkv7`` / ``rwkv6`` / ``rwkv4`` for torch tensors.

Two equivalent routes, both giving gradients for every input and for the initial state:

* custom operators (torch >= 2.4): ``torch.ops.wkv.rwkv7`` (and ``wkv::rwkv6``,
  ``wkv::rwkv4``), each with a fake (meta) implementation and an autograd formula whose
  backward is the custom operator ``wkv::rwkv7_backward``; they work under
  ``torch.compile`` and pass ``torch.library.opcheck``. Schema::

      wkv::rwkv7(Tensor r, Tensor w, Tensor k, Tensor v, Tensor a, Tensor b, Tensor? state,
                 Tensor? seq_offsets, int decay, int flags, int context_id) -> (Tensor, Tensor)

  ``decay`` is a ``wkv_decay_form`` value, ``flags`` the ``WKV_FLAG_*`` bits,
  ``seq_offsets`` a host int64 tensor, ``context_id`` the ``id`` of a live
  :class:`wkv.Context` (0: the default context for the tensors' device).
* ``torch.autograd.Function`` classes (any torch): :class:`RWKV7Function`,
  :class:`RWKV6Function`, :class:`RWKV4Function`.

:func:`rwkv7` & co. pick the custom op when available. On CUDA tensors the library runs on
``torch.cuda.current_stream()`` (set with ``wkv_cuda_set_stream`` before each call), so it
orders with the surrounding torch work without synchronising.

The library computes in float32 (inputs float32, float16 or bfloat16): float64 tensors are
refused (``DTypeError``), so ``torch.autograd.gradcheck`` runs in float32 with loose
tolerances (see the tests).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple, Union

import torch

from . import _tensors
from . import ops as _ops
from .context import Context, context_by_id, current_context
from .errors import DeviceMismatchError, DTypeError, InvalidArgumentError

__all__ = ["rwkv7", "rwkv6", "rwkv4", "attention", "context_parallel_rwkv7", "context_parallel_rwkv6",
           "context_parallel_rwkv4", "rwkv7_segmented", "rwkv6_segmented", "rwkv4_segmented",
           "segment_transition_rwkv7", "segment_transition_rwkv6", "segment_transition_rwkv4", "RWKV7Function", "RWKV6Function", "RWKV4Function",
           "HAS_CUSTOM_OP", "custom_ops"]

#: True when torch has ``torch.library.custom_op`` (2.4+); the ops are then registered.
HAS_CUSTOM_OP = all(hasattr(torch.library, n) for n in ("custom_op", "register_fake", "register_autograd"))


def _context(cid: int) -> Optional[Context]:
    if not cid:
        return None
    c = context_by_id(cid)
    if c is None:
        raise InvalidArgumentError("wkv torch op: context_id %d is not a live wkv.Context (keep a reference "
                                   "to the Context while the graph that uses it runs)" % cid)
    return c


def _layout(spec: _ops.OpSpec, flags: int) -> str:
    return spec.layouts[1] if flags & spec.layout_flag else spec.layouts[0]


def _num_seqs(seq_offsets: Optional[torch.Tensor]) -> Any:
    return 0 if seq_offsets is None else seq_offsets.shape[0] - 1


def _is_compiling() -> bool:
    f = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    if f is None:
        f = getattr(getattr(torch, "_dynamo", None), "is_compiling", None)
    return bool(f()) if f is not None else False


def _fwd(spec: _ops.OpSpec, tensors: Sequence[torch.Tensor], state: Optional[torch.Tensor],
         seq_offsets: Optional[torch.Tensor], decay: int, flags: int, context: Optional[Context]):
    y, s = _ops.forward(spec, "wkv.torch." + spec.name, dict(zip(spec.inputs, tensors)), state, decay=decay,
                        state_layout=_layout(spec, flags), seq_offsets=seq_offsets, context=context)
    return y, s


def _bwd(spec: _ops.OpSpec, tensors: Sequence[torch.Tensor], state: Optional[torch.Tensor],
         seq_offsets: Optional[torch.Tensor], dy: Optional[torch.Tensor], dstate: Optional[torch.Tensor], decay: int,
         flags: int, context: Optional[Context]) -> Tuple[torch.Tensor, ...]:
    if dy is None:
        dy = torch.zeros_like(tensors[spec.inputs.index("v")])
    g = _ops.backward(spec, "wkv.torch.%s_backward" % spec.name, dict(zip(spec.inputs, tensors)), dy, state, dstate,
                      decay=decay, state_layout=_layout(spec, flags), seq_offsets=seq_offsets, context=context)
    return tuple(g)


# ------------------------------------------------------------------------------ autograd.Function


def _make_function(spec: _ops.OpSpec) -> type:
    n = len(spec.inputs)

    def forward(ctx: Any, *args: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        tensors, (state, seq_offsets, decay, flags, context) = args[:n], args[n:]
        y, s = _fwd(spec, tensors, state, seq_offsets, decay, flags, context)
        ctx.save_for_backward(*tensors, state)
        ctx.wkv = (seq_offsets, decay, flags, context)
        return y, s

    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, dy: Optional[torch.Tensor], dstate: Optional[torch.Tensor]):
        saved = ctx.saved_tensors
        tensors, state = saved[:n], saved[n]
        seq_offsets, decay, flags, context = ctx.wkv
        grads = _bwd(spec, tensors, state, seq_offsets, dy, dstate, decay, flags, context)
        return (*grads[:n], grads[n] if state is not None else None, None, None, None, None)

    name = spec.name.upper() + "Function"
    doc = ("torch.autograd.Function for %s: ``%s.apply(%s, state, seq_offsets, decay, flags, context)`` → "
           "(y, final_state); ``state``/``seq_offsets``/``context`` may be None, ``decay`` is a wkv_decay_form "
           "value and ``flags`` the WKV_FLAG_* bits. Gradients flow to every input and the initial state."
           % (spec.name, name, ", ".join(spec.inputs)))
    return type(name, (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward), "__doc__": doc,
                 "__module__": __name__})


RWKV7Function = _make_function(_ops.SPECS["rwkv7"])
RWKV6Function = _make_function(_ops.SPECS["rwkv6"])
RWKV4Function = _make_function(_ops.SPECS["rwkv4"])
_FUNCTIONS = {"rwkv7": RWKV7Function, "rwkv6": RWKV6Function, "rwkv4": RWKV4Function}

# ------------------------------------------------------------------------------ custom ops

#: name -> (forward op, backward op), when HAS_CUSTOM_OP.
custom_ops: dict = {}


def _check_fake(spec: _ops.OpSpec, fn: str, tensors: Sequence[torch.Tensor], states: dict,
                dy: Optional[torch.Tensor] = None) -> None:
    """What the real op refuses before it runs, refused by its fake (meta) implementation too:
    tensors on more than one device (one meta tensor among CPU ones would otherwise "run" and
    return uninitialised memory), a dtype libwkv does not take, a state that is not float32."""
    def dtype_name(t: torch.Tensor) -> str:
        return str(t.dtype).replace("torch.", "")

    named = list(zip(spec.inputs, tensors)) + ([("dy", dy)] if dy is not None else [])
    first_name, first = named[0]
    for name, t in named + [(k, t) for k, t in states.items() if t is not None]:
        if t.device != first.device:
            raise DeviceMismatchError("%s: %s is on %s but %s is on %s; every tensor of a call must be on one "
                                      "device" % (fn, name, t.device, first_name, first.device))
    for name, t in named:
        if _tensors.torch_code(t.dtype) not in _tensors.SUPPORTED:
            raise DTypeError("%s: %s is %s; libwkv takes float32, float16 or bfloat16" % (fn, name, dtype_name(t)))
    for name, t in states.items():
        if t is not None and t.dtype != torch.float32:
            raise DTypeError("%s: %s is %s; the state is always float32" % (fn, name, dtype_name(t)))


def _define_custom_op(spec: _ops.OpSpec) -> None:
    n = len(spec.inputs)
    targs = ", ".join("Tensor " + name for name in spec.inputs)
    fwd_schema = "(%s, Tensor? state, Tensor? seq_offsets, int decay, int flags, int context_id) -> (Tensor, Tensor)" % targs
    bwd_schema = ("(%s, Tensor? state, Tensor? seq_offsets, Tensor dy, Tensor? dstate, int decay, int flags, "
                  "int context_id) -> (%s)" % (targs, ", ".join(["Tensor"] * (n + 1))))

    def fwd_impl(*args: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        tensors, (state, seq_offsets, decay, flags, cid) = args[:n], args[n:]
        return _fwd(spec, tensors, state, seq_offsets, decay, flags, _context(cid))

    def bwd_impl(*args: Any) -> Tuple[torch.Tensor, ...]:
        tensors, (state, seq_offsets, dy, dstate, decay, flags, cid) = args[:n], args[n:]
        return _bwd(spec, tensors, state, seq_offsets, dy, dstate, decay, flags, _context(cid))

    fwd_impl.__name__ = spec.name
    bwd_impl.__name__ = spec.name + "_backward"
    fwd_op = torch.library.custom_op("wkv::" + spec.name, fwd_impl, mutates_args=(), schema=fwd_schema)
    bwd_op = torch.library.custom_op("wkv::%s_backward" % spec.name, bwd_impl, mutates_args=(), schema=bwd_schema)

    def state_like(v: torch.Tensor, seq_offsets: Optional[torch.Tensor], flags: int) -> torch.Tensor:
        shape = _ops._state_shape(spec, tuple(v.shape), _num_seqs(seq_offsets), flags)
        return v.new_empty(shape if shape is not None else (1,), dtype=torch.float32)

    def fwd_fake(*args: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        tensors, state, seq_offsets, flags = args[:n], args[n], args[n + 1], args[n + 3]
        _check_fake(spec, "wkv.torch." + spec.name, tensors, {"state": state})
        v = tensors[spec.inputs.index("v")]
        return v.new_empty(v.shape), state_like(v, seq_offsets, flags)

    def bwd_fake(*args: Any) -> Tuple[torch.Tensor, ...]:
        tensors, (state, seq_offsets, dy, dstate, _, flags) = args[:n], args[n:n + 6]
        _check_fake(spec, "wkv.torch.%s_backward" % spec.name, tensors, {"state": state, "dstate": dstate}, dy)
        v = tensors[spec.inputs.index("v")]
        return (*(t.new_empty(t.shape) for t in tensors), state_like(v, seq_offsets, flags))

    fwd_op.register_fake(fwd_fake)
    bwd_op.register_fake(bwd_fake)

    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Any) -> None:
        tensors, (state, seq_offsets, decay, flags, cid) = inputs[:n], inputs[n:]
        ctx.save_for_backward(*tensors, state, seq_offsets)
        ctx.wkv = (decay, flags, cid)

    def backward(ctx: Any, dy: Optional[torch.Tensor], dstate: Optional[torch.Tensor]):
        saved = ctx.saved_tensors
        tensors, state, seq_offsets = saved[:n], saved[n], saved[n + 1]
        decay, flags, cid = ctx.wkv
        if dy is None:
            dy = torch.zeros_like(tensors[spec.inputs.index("v")])
        grads = getattr(torch.ops.wkv, spec.name + "_backward")(*tensors, state, seq_offsets, dy, dstate, decay,
                                                                  flags, cid)
        return (*grads[:n], grads[n] if state is not None else None, None, None, None, None)

    fwd_op.register_autograd(backward, setup_context=setup_context)
    custom_ops[spec.name] = (fwd_op, bwd_op)


if HAS_CUSTOM_OP:
    for _name in ("rwkv7", "rwkv6", "rwkv4"):
        _define_custom_op(_ops.SPECS[_name])


def _attention_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: Optional[torch.Tensor],
                    k_offsets: Optional[torch.Tensor], causal: bool, scale: float,
                    context_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
    from .attention import attention as _attention

    with torch.no_grad():  # the autograd formula is registered on the op (below)
        o, lse = _attention(q, k, v, causal=causal, scale=scale if scale != 0.0 else None, q_offsets=q_offsets,
                            k_offsets=k_offsets, return_lse=True, context=_context(context_id))
    return o, lse


def _attention_backward_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                             dout: torch.Tensor, dlse: Optional[torch.Tensor], q_offsets: Optional[torch.Tensor],
                             k_offsets: Optional[torch.Tensor], causal: bool, scale: float,
                             context_id: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from .attention import attention_backward as _backward

    return _backward(q, k, v, o, lse, dout, dlse=dlse, causal=causal, scale=scale if scale != 0.0 else None,
                     q_offsets=q_offsets, k_offsets=k_offsets, context=_context(context_id))


def _check_attention_fake(fn: str, q: torch.Tensor, named: Sequence[Tuple[str, Optional[torch.Tensor]]]) -> None:
    """What the real path refuses, for meta/fake tensors: devices and dtypes (q's; lse, dlse
    float32)."""
    for name, t in named:
        if t is None:
            continue
        if t.device != q.device:
            raise DeviceMismatchError("%s: %s is on %s but q is on %s" % (fn, name, t.device, q.device))
        want = torch.float32 if name in ("lse", "dlse") else q.dtype
        if t.dtype != want:
            raise DTypeError("%s: %s is %s but must be %s (q, k, v and the gradients share q's dtype; lse is "
                             "float32)" % (fn, name, t.dtype, want))
    if _tensors.torch_code(q.dtype) not in _tensors.SUPPORTED:
        raise DTypeError("%s: q is %s; libwkv takes float32, float16 or bfloat16" % (fn, q.dtype))


def _attention_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: Optional[torch.Tensor],
                    k_offsets: Optional[torch.Tensor], causal: bool, scale: float,
                    context_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
    _check_attention_fake("wkv.torch.attention", q, (("k", k), ("v", v)))
    return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


def _attention_backward_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                             dout: torch.Tensor, dlse: Optional[torch.Tensor], q_offsets: Optional[torch.Tensor],
                             k_offsets: Optional[torch.Tensor], causal: bool, scale: float,
                             context_id: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_attention_fake("wkv.torch.attention_backward", q,
                          (("k", k), ("v", v), ("o", o), ("lse", lse), ("dout", dout), ("dlse", dlse)))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _attention_setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Any) -> None:
    q, k, v, q_offsets, k_offsets, causal, scale, cid = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, q_offsets, k_offsets)
    ctx.wkv = (causal, scale, cid)


def _attention_autograd(ctx: Any, dout: Optional[torch.Tensor], dlse: Optional[torch.Tensor]):
    q, k, v, o, lse, q_offsets, k_offsets = ctx.saved_tensors
    causal, scale, cid = ctx.wkv
    if dout is None:
        dout = torch.zeros_like(o)
    dq, dk, dv = torch.ops.wkv.attention_backward(q, k, v, o, lse, dout, dlse, q_offsets, k_offsets, causal, scale,
                                                  cid)
    return dq, dk, dv, None, None, None, None, None


if HAS_CUSTOM_OP:
    _attention_op = torch.library.custom_op(
        "wkv::attention", _attention_impl, mutates_args=(),
        schema="(Tensor q, Tensor k, Tensor v, Tensor? q_offsets, Tensor? k_offsets, bool causal, float scale, "
               "int context_id) -> (Tensor, Tensor)")
    _attention_bwd_op = torch.library.custom_op(
        "wkv::attention_backward", _attention_backward_impl, mutates_args=(),
        schema="(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor dout, Tensor? dlse, Tensor? q_offsets, "
               "Tensor? k_offsets, bool causal, float scale, int context_id) -> (Tensor, Tensor, Tensor)")
    _attention_op.register_fake(_attention_fake)
    _attention_bwd_op.register_fake(_attention_backward_fake)
    _attention_op.register_autograd(_attention_autograd, setup_context=_attention_setup_context)
    custom_ops["attention"] = (_attention_op, _attention_bwd_op)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: Optional[float] = None, q_offsets: Any = None, k_offsets: Any = None,
              context: Optional[Context] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention on torch tensors through the custom op ``torch.ops.wkv.attention``
    (traceable by ``torch.compile``) → ``(o, lse)``; arguments as :func:`wkv.attention`.
    Differentiable in q, k and v (through o and lse) where the backend has the backward (the
    CPU; :func:`wkv.attention_backward`)."""
    if context is None and not _is_compiling():
        context = current_context()
    qo, ko = _offsets_tensor(q_offsets), _offsets_tensor(k_offsets)
    cid = context.id if context is not None else 0
    if not HAS_CUSTOM_OP:
        return _attention_impl(q, k, v, qo, ko, bool(causal), float(scale or 0.0), cid)
    return torch.ops.wkv.attention(q, k, v, qo, ko, bool(causal), float(scale or 0.0), cid)

# ------------------------------------------------------------------------------ public


def _offsets_tensor(seq_offsets: Any) -> Optional[torch.Tensor]:
    if seq_offsets is None:
        return None
    if isinstance(seq_offsets, torch.Tensor):
        if seq_offsets.device.type != "cpu":
            raise InvalidArgumentError("wkv.torch: seq_offsets must be a host (CPU) tensor; the library reads it "
                                       "on the CPU")
        return seq_offsets.to(torch.int64)
    return torch.as_tensor(list(seq_offsets), dtype=torch.int64)


def _call(spec_name: str, tensors: Sequence[Any], state: Any, decay: Union[str, int], state_layout: str,
          seq_offsets: Any, context: Optional[Context], use_custom_op: Optional[bool]):
    spec = _ops.SPECS[spec_name]
    fn = "wkv.torch." + spec_name
    for name, t in zip(spec.inputs + ("state",), list(tensors) + [state]):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError("%s: %s is a %s; the differentiable op takes torch tensors" % (fn, name, type(t).__name__))
    decay_c = _ops.decay_code(fn, decay)
    flags = _ops.layout_flags(spec, fn, state_layout)
    offsets = _offsets_tensor(seq_offsets)
    if context is None and not _is_compiling():
        # Eagerly, pin the use_context() context into the op (its backward may run on another
        # thread). While compiling, the op resolves it when it runs instead.
        context = current_context()
    if use_custom_op is None:
        use_custom_op = HAS_CUSTOM_OP
    if use_custom_op:
        if not HAS_CUSTOM_OP:
            raise RuntimeError("torch %s has no torch.library.custom_op (needs 2.4+)" % torch.__version__)
        op = getattr(torch.ops.wkv, spec_name)
        return op(*tensors, state, offsets, decay_c, flags, context.id if context is not None else 0)
    return _FUNCTIONS[spec_name].apply(*tensors, state, offsets, decay_c, flags, context)


def rwkv7(r: torch.Tensor, w: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
          state: Optional[torch.Tensor] = None, *, decay: Union[str, int] = "clampw", state_layout: str = "vk",
          seq_offsets: Any = None, context: Optional[Context] = None,
          use_custom_op: Optional[bool] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Differentiable RWKV-7 WKV on torch tensors → ``(y, final_state)``.

    Arguments as :func:`wkv.rwkv7` (r, w, k, v, a, b: [B, T, H, N]; state [B, H, N, N]
    float32 or None). Gradients reach every input that requires grad and ``state``.
    ``use_custom_op`` picks ``torch.ops.wkv.rwkv7`` (default when torch >= 2.4) or
    :class:`RWKV7Function`.
    """
    return _call("rwkv7", (r, w, k, v, a, b), state, decay, state_layout, seq_offsets, context, use_custom_op)


def rwkv6(r: torch.Tensor, w: torch.Tensor, k: torch.Tensor, v: torch.Tensor, u: torch.Tensor,
          state: Optional[torch.Tensor] = None, *, decay: Union[str, int] = "exp_neg_exp", state_layout: str = "vk",
          seq_offsets: Any = None, context: Optional[Context] = None,
          use_custom_op: Optional[bool] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Differentiable RWKV-6 WKV → ``(y, final_state)``; arguments as :func:`wkv.rwkv6`."""
    return _call("rwkv6", (r, w, k, v, u), state, decay, state_layout, seq_offsets, context, use_custom_op)


def rwkv4(w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: Optional[torch.Tensor] = None,
          *, state_layout: str = "planar", seq_offsets: Any = None, context: Optional[Context] = None,
          use_custom_op: Optional[bool] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Differentiable RWKV-4 WKV → ``(y, final_state)``; arguments as :func:`wkv.rwkv4`."""
    return _call("rwkv4", (w, u, k, v), state, "exp_neg_exp", state_layout, seq_offsets, context, use_custom_op)


from .context_parallel import (context_parallel_rwkv4, context_parallel_rwkv6, context_parallel_rwkv7,  # noqa: E402
                               rwkv4_segmented, rwkv6_segmented, rwkv7_segmented, segment_transition_rwkv4,
                               segment_transition_rwkv6, segment_transition_rwkv7)
