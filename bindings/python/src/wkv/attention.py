"""Softmax attention (``wkv_attention``, ``wkv_attention_backward``): numpy arrays or torch
tensors in, ``o`` out, and its gradients.

    o = wkv.attention(q, k, v, causal=True)                 # q [B, Tq, Hq, D], k, v [B, Tk, Hkv, D]
    o, lse = wkv.attention(q, k, v, return_lse=True)        # lse [B, Hq, Tq] float32
    dq, dk, dv = wkv.attention_backward(q, k, v, o, lse, dout, causal=True)

The C header's attention section is the definition (online softmax; causal masks aligned
bottom-right; a row that sees no key gives zeros and lse = -inf). Torch tensors that require grad
(under grad mode) go through wkv.torch.attention, whose autograd runs the backward.
"""

from __future__ import annotations

from ctypes import POINTER, byref, c_int32, c_int64, cast, pointer, sizeof
from typing import Any, Dict, List, Optional, Tuple

from . import _lib
from ._lib import load
from ._tensors import F32, Allocator, host_int64
from .context import Context, resolve_context
from .errors import InvalidArgumentError
from .ops import _array_context, _Call, _dlpack_stream, _plan

__all__ = ["attention", "attention_backward", "attention_configs"]

WKV_ATTENTION_CAUSAL = 1


def attention(q: Any, k: Any, v: Any, *, causal: bool = False, scale: Optional[float] = None,
              q_offsets: Any = None, k_offsets: Any = None, return_lse: bool = False, out: Any = None,
              lse_out: Any = None, config: Optional[str] = None, context: Optional[Context] = None) -> Any:
    """Softmax attention: ``o`` (like q), or ``(o, lse)`` with ``return_lse=True``.

    Args:
        q: [B, Tq, Hq, D]; k, v: [B, Tk, Hkv, D] (Hq a multiple of Hkv: grouped-query heads).
            float32, float16 or bfloat16, one dtype for all (and o); any strides.
        causal: mask keys after each row's position, aligned bottom-right (row i sees keys
            j <= i + Tk - Tq).
        scale: the logits' scale; default 1 / sqrt(D).
        q_offsets, k_offsets: packed variable-length sequences (B = 1): host sequences of
            num_seqs + 1 non-decreasing ints from 0 to Tq, resp. Tk.
        out, lse_out: arrays to write o and lse into.
        config: a kernel configuration name of the context's backend (:func:`attention_configs`).
        context: a :class:`wkv.Context`; default as the RWKV ops.
    """
    fn = "wkv.attention"
    torch = _torch_if_grad()
    if torch is not None and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v)):
        for name, given in (("out", out), ("lse_out", lse_out), ("config", config)):
            if given is not None:
                raise InvalidArgumentError("%s: %s cannot be given when q, k or v requires grad (the "
                                           "differentiable path is wkv.torch.attention)" % (fn, name))
        from . import torch as wt  # differentiable: the torch custom op with its backward

        o, lse = wt.attention(q, k, v, causal=causal, scale=scale, q_offsets=q_offsets, k_offsets=k_offsets,
                              context=context)
        return (o, lse) if return_lse else o
    if (q_offsets is None) != (k_offsets is None):
        raise InvalidArgumentError("%s: packed sequences need both q_offsets and k_offsets" % fn)
    named = [("q", q), ("k", k), ("v", v), ("out", out), ("lse_out", lse_out)]
    kind, device = _plan(fn, named, q)
    ctx = resolve_context(context if context is not None else _array_context(q), device)
    lib = load()
    with ctx.lock:
        call = _Call(fn, ctx, False, False, _dlpack_stream(ctx))
        try:
            keep: List[Any] = []
            d, views = _forward_desc(call, q, k, v, causal, scale, q_offsets, k_offsets, keep)
            if config is not None:
                keep.append(config.encode("utf-8"))
                d.config = keep[-1]
            qv = views["q"]
            alloc = Allocator(kind, qv.device, ctx)
            o_obj, d.o = call.output(out, "out", alloc, qv.shape, qv)
            lse_obj = None
            if return_lse or lse_out is not None:
                lse_obj, d.lse = call.output(lse_out, "lse_out", alloc, _lse_shape(qv), None, F32)
            call.check(lib.wkv_attention(ctx.handle, byref(d)))
            del keep
        finally:
            call.release()
    return (o_obj, lse_obj) if return_lse else o_obj


def attention_backward(q: Any, k: Any, v: Any, o: Any, lse: Any, dout: Any, *, dlse: Any = None,
                       causal: bool = False, scale: Optional[float] = None, q_offsets: Any = None,
                       k_offsets: Any = None, dq_out: Any = None, dk_out: Any = None, dv_out: Any = None,
                       context: Optional[Context] = None) -> Tuple[Any, Any, Any]:
    """The gradients ``(dq, dk, dv)`` of an :func:`attention` call (``wkv_attention_backward``).

    Args:
        q, k, v, causal, scale, q_offsets, k_offsets: as the forward call.
        o, lse: what that forward returned (``return_lse=True``).
        dout: the gradient of the loss w.r.t. o (like q); dlse: optionally w.r.t. lse (float32).
        dq_out, dk_out, dv_out: arrays to write the gradients into (like q, k, v).
    """
    fn = "wkv.attention_backward"
    if (q_offsets is None) != (k_offsets is None):
        raise InvalidArgumentError("%s: packed sequences need both q_offsets and k_offsets" % fn)
    named = [("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse), ("dout", dout), ("dlse", dlse),
             ("dq_out", dq_out), ("dk_out", dk_out), ("dv_out", dv_out)]
    kind, device = _plan(fn, named, q)
    ctx = resolve_context(context if context is not None else _array_context(q), device)
    lib = load()
    with ctx.lock:
        call = _Call(fn, ctx, False, False, _dlpack_stream(ctx))
        try:
            keep: List[Any] = []
            d, views = _forward_desc(call, q, k, v, causal, scale, q_offsets, k_offsets, keep)
            for name, obj in (("o", o), ("lse", lse)):
                if obj is None:
                    raise TypeError("%s: %s is required (what the forward returned)" % (fn, name))
                setattr(d, name, call.view(obj, name).tensor)
            b = _lib.wkv_attention_backward_desc()
            b.struct_size = sizeof(b)
            b.forward = pointer(d)
            if dout is None:
                raise TypeError("%s: dout is required" % fn)
            b.dout = call.view(dout, "dout").tensor
            if dlse is not None:
                b.dlse = call.view(dlse, "dlse").tensor
            qv, kv = views["q"], views["k"]
            alloc = Allocator(kind, qv.device, ctx)
            dq_obj, b.dq = call.output(dq_out, "dq_out", alloc, qv.shape, qv)
            dk_obj, b.dk = call.output(dk_out, "dk_out", alloc, kv.shape, kv)
            dv_obj, b.dv = call.output(dv_out, "dv_out", alloc, views["v"].shape, views["v"])
            call.check(lib.wkv_attention_backward(ctx.handle, byref(b)))
            del keep
        finally:
            call.release()
    return dq_obj, dk_obj, dv_obj


def _lse_shape(qv: Any) -> Optional[Tuple[int, ...]]:
    return (qv.shape[0], qv.shape[2], qv.shape[1]) if len(qv.shape) == 4 else None


def _forward_desc(call: _Call, q: Any, k: Any, v: Any, causal: bool, scale: Optional[float], q_offsets: Any,
                  k_offsets: Any, keep: List[Any]) -> Tuple[Any, Dict[str, Any]]:
    """The forward descriptor's inputs (q, k, v, mask, scale, packing); `keep` holds what its
    pointers point at."""
    d = _lib.wkv_attention_desc()
    d.struct_size = sizeof(d)
    d.flags = WKV_ATTENTION_CAUSAL if causal else 0
    d.scale = 0.0 if scale is None else float(scale)
    views = {}
    for name, obj in (("q", q), ("k", k), ("v", v)):
        if obj is None:
            raise TypeError("%s: %s is required" % (call.fn, name))
        views[name] = call.view(obj, name)
        setattr(d, name, views[name].tensor)
    if q_offsets is not None:
        qa, qaddr = host_int64(q_offsets, "q_offsets", call.fn, False)
        ka, kaddr = host_int64(k_offsets, "k_offsets", call.fn, False)
        if len(qa) != len(ka):
            raise InvalidArgumentError("%s: q_offsets has %d entries, k_offsets %d: one per sequence + 1 "
                                       "each" % (call.fn, len(qa), len(ka)))
        keep += [qa, ka]
        d.q_offsets, d.k_offsets = cast(qaddr, POINTER(c_int64)), cast(kaddr, POINTER(c_int64))
        d.num_seqs = len(qa) - 1
    return d, views


def attention_configs(context: Optional[Context] = None) -> List[Dict[str, Any]]:
    """The attention kernel configurations of a context's backend (default: the CPU context):
    dicts with ``name``, ``dtype`` (``"float32"``, ``"float16"``, ``"bfloat16"``, or ``"any"``),
    ``block_q``, ``block_kv``, ``head_dim`` (0: any), ``max_head_dim``, ``warps``, ``async_copy``,
    ``eager_load``, ``swizzle``, ``double_buffer``, ``softmax``, ``shared_bytes``, ``fits``,
    ``is_default`` (where a configuration is built for one dtype or head dim, it is the default
    of those calls only)."""
    ctx = resolve_context(context, (1, 0))
    lib = load()
    n = c_int32(0)
    with ctx.lock:
        _lib.check(lib.wkv_attention_configs(ctx.handle, None, 0, byref(n)), ctx.handle, fn="wkv.attention_configs")
        arr = (_lib.wkv_attention_config * max(n.value, 1))()
        for c in arr:
            c.struct_size = sizeof(_lib.wkv_attention_config)
        _lib.check(lib.wkv_attention_configs(ctx.handle, arr, n.value, byref(n)), ctx.handle,
                   fn="wkv.attention_configs")
    out = []
    for c in arr[:n.value]:
        item = {f: getattr(c, f) for f, _ in _lib.wkv_attention_config._fields_ if f not in ("struct_size", "dtype")}
        item["name"] = c.name.decode("utf-8", "replace")
        item["fits"], item["is_default"] = bool(c.fits), bool(c.is_default)
        item["dtype"] = {(0, 0): "any", (2, 32): "float32", (2, 16): "float16", (4, 16): "bfloat16"}.get(
            (c.dtype.code, c.dtype.bits), "code %d bits %d" % (c.dtype.code, c.dtype.bits))
        out.append(item)
    return out


def _torch_if_grad():
    import sys

    torch = sys.modules.get("torch")
    return torch if torch is not None and torch.is_grad_enabled() else None
