"""Softmax attention forward (``wkv_attention``): numpy arrays or torch tensors in, ``o`` out.

    o = wkv.attention(q, k, v, causal=True)                 # q [B, Tq, Hq, D], k, v [B, Tk, Hkv, D]
    o, lse = wkv.attention(q, k, v, return_lse=True)        # lse [B, Hq, Tq] float32

The C header's attention section is the definition (online softmax; causal masks aligned
bottom-right; a row that sees no key gives zeros and lse = -inf). Not differentiable yet (the
backward is to come): a torch tensor that requires grad is refused under grad mode.
"""

from __future__ import annotations

from ctypes import POINTER, byref, c_int32, c_int64, cast, sizeof
from typing import Any, Dict, List, Optional

from . import _lib
from ._lib import load
from ._tensors import F32, Allocator, host_int64
from .context import Context, resolve_context
from .errors import InvalidArgumentError
from .ops import _array_context, _Call, _dlpack_stream, _plan

__all__ = ["attention", "attention_configs"]

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
    if torch is not None:
        for name, t in (("q", q), ("k", k), ("v", v)):
            if isinstance(t, torch.Tensor) and t.requires_grad:
                raise InvalidArgumentError("%s: %s requires grad; wkv.attention has no backward yet (call it "
                                           "under torch.no_grad())" % (fn, name))
    if (q_offsets is None) != (k_offsets is None):
        raise InvalidArgumentError("%s: packed sequences need both q_offsets and k_offsets" % fn)
    named = [("q", q), ("k", k), ("v", v), ("out", out), ("lse_out", lse_out)]
    kind, device = _plan(fn, named, q)
    ctx = resolve_context(context if context is not None else _array_context(q), device)
    lib = load()
    with ctx.lock:
        call = _Call(fn, ctx, False, False, _dlpack_stream(ctx))
        try:
            d = _lib.wkv_attention_desc()
            d.struct_size = sizeof(d)
            d.flags = WKV_ATTENTION_CAUSAL if causal else 0
            d.scale = 0.0 if scale is None else float(scale)
            views = {}
            for name, obj in (("q", q), ("k", k), ("v", v)):
                if obj is None:
                    raise TypeError("%s: %s is required" % (fn, name))
                views[name] = call.view(obj, name)
                setattr(d, name, views[name].tensor)
            keep: List[Any] = []
            if q_offsets is not None:
                qa, qaddr = host_int64(q_offsets, "q_offsets", fn, False)
                ka, kaddr = host_int64(k_offsets, "k_offsets", fn, False)
                if len(qa) != len(ka):
                    raise InvalidArgumentError("%s: q_offsets has %d entries, k_offsets %d: one per sequence + 1 "
                                               "each" % (fn, len(qa), len(ka)))
                keep += [qa, ka]
                d.q_offsets, d.k_offsets = cast(qaddr, POINTER(c_int64)), cast(kaddr, POINTER(c_int64))
                d.num_seqs = len(qa) - 1
            if config is not None:
                keep.append(config.encode("utf-8"))
                d.config = keep[-1]
            qv = views["q"]
            alloc = Allocator(kind, qv.device, ctx)
            o_obj, d.o = call.output(out, "out", alloc, qv.shape, qv)
            lse_obj = None
            if return_lse or lse_out is not None:
                shape = (qv.shape[0], qv.shape[2], qv.shape[1]) if len(qv.shape) == 4 else None
                lse_obj, d.lse = call.output(lse_out, "lse_out", alloc, shape, None, F32)
            call.check(lib.wkv_attention(ctx.handle, byref(d)))
            del keep
        finally:
            call.release()
    return (o_obj, lse_obj) if return_lse else o_obj


def attention_configs(context: Optional[Context] = None) -> List[Dict[str, Any]]:
    """The attention kernel configurations of a context's backend (default: the CPU context):
    dicts with ``name``, ``block_q``, ``block_kv``, ``head_dim`` (0: any), ``max_head_dim``,
    ``warps``, ``async_copy``, ``eager_load``, ``swizzle``, ``double_buffer``, ``softmax``,
    ``shared_bytes``, ``fits``, ``is_default``."""
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
        out.append(item)
    return out


def _torch_if_grad():
    import sys

    torch = sys.modules.get("torch")
    return torch if torch is not None and torch.is_grad_enabled() else None
