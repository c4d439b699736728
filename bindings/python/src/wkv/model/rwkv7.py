"""The RWKV-7 ("x070") language model as torch modules whose WKV recurrence is libwkv's op.

Parameter names and shapes are those of BlinkDL's RWKV-7 checkpoints (``blocks.N.att.w0`` …
``head.weight``), so ``model.state_dict()`` is such a checkpoint and ``load_state_dict`` takes
one. Everything around the recurrence (projections, token shift, norms) is ordinary torch; the
recurrence runs on whatever backend the context has (the tensors' device by default):

* with autograd (training, state tuning) through :func:`wkv.torch.rwkv7`: gradients reach every
  input and the initial state;
* without it (``torch.no_grad()``, inference) through :func:`wkv.rwkv7` stepping each layer's
  state in place, so a decode step allocates no state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import ops as _ops
from .. import torch as _wt
from ..context import Context, current_context

__all__ = ["RWKV7Config", "RWKV7State", "RWKV7TimeMix", "RWKV7ChannelMix", "RWKV7Block", "RWKV7Model"]

#: ln_x's epsilon in the official model (64e-5 = 1e-5 * head size 64, kept for every head size).
LN_X_EPS = 64e-5


@dataclass(frozen=True)
class RWKV7Config:
    """The sizes of an RWKV-7 model; :func:`wkv.model.infer_config` reads them from weights."""

    n_layer: int
    n_embd: int
    head_size: int = 64
    vocab_size: int = 65536
    dim_ffn: int = 0          # 0: 4 * n_embd
    decay_lora: int = 64      # w1/w2 rank
    iclr_lora: int = 64       # a1/a2 rank
    value_lora: int = 32      # v1/v2 rank (layers > 0)
    gate_lora: int = 128      # g1/g2 rank
    layer0_value_lora: bool = False  # checkpoints that also carry (unused) v0/v1/v2 in layer 0

    @property
    def n_head(self) -> int:
        return self.n_embd // self.head_size

    @property
    def ffn(self) -> int:
        return self.dim_ffn or 4 * self.n_embd

    def check(self) -> None:
        for name in ("n_layer", "n_embd", "head_size", "vocab_size", "decay_lora", "iclr_lora", "value_lora",
                     "gate_lora"):
            if int(getattr(self, name)) <= 0:
                raise ValueError("RWKV7Config: %s is %r; it must be a positive int" % (name, getattr(self, name)))
        if self.n_embd % self.head_size:
            raise ValueError("RWKV7Config: n_embd %d is not a multiple of head_size %d" % (self.n_embd,
                                                                                        self.head_size))


class RWKV7State:
    """The recurrent state of a batch of B sequences: per layer the time mix's previous token
    ``att_shift[l]`` [B, C], the WKV state ``wkv[l]`` [B, H, N, N] (float32, libwkv's "vk"
    layout: S[value index][key index]) and the channel mix's previous token ``ffn_shift[l]``.

    Carry it from one call to the next (prefill, then decode; or chunk after chunk in training:
    it keeps its autograd history unless you :meth:`detach` it)."""

    def __init__(self, att_shift: List[torch.Tensor], wkv: List[torch.Tensor], ffn_shift: List[torch.Tensor]):
        if not (len(att_shift) == len(wkv) == len(ffn_shift)):
            raise ValueError("RWKV7State: att_shift, wkv and ffn_shift need one entry per layer")
        self.att_shift, self.wkv, self.ffn_shift = list(att_shift), list(wkv), list(ffn_shift)

    @classmethod
    def zeros(cls, config: RWKV7Config, batch: int, *, device=None, dtype=torch.float32) -> "RWKV7State":
        C, H, N = config.n_embd, config.n_head, config.head_size
        L = config.n_layer
        z = lambda *s, dt=dtype: torch.zeros(*s, device=device, dtype=dt)  # noqa: E731
        return cls([z(batch, C) for _ in range(L)], [z(batch, H, N, N, dt=torch.float32) for _ in range(L)],
                   [z(batch, C) for _ in range(L)])

    @property
    def batch(self) -> int:
        return self.wkv[0].shape[0]

    def detach(self) -> "RWKV7State":
        """The same values without autograd history (truncated backpropagation)."""
        return RWKV7State([t.detach() for t in self.att_shift], [t.detach() for t in self.wkv],
                          [t.detach() for t in self.ffn_shift])

    def clone(self) -> "RWKV7State":
        return RWKV7State([t.clone() for t in self.att_shift], [t.clone() for t in self.wkv],
                          [t.clone() for t in self.ffn_shift])


def _shifted(x: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """x[t-1] - x[t] with the previous call's last token in front: the token shift."""
    return torch.cat((prev.unsqueeze(1).to(x.dtype), x[:, :-1]), dim=1) - x


def _row_param(C: int) -> nn.Parameter:
    return nn.Parameter(torch.zeros(1, 1, C))


def _column_major(linear: nn.Linear) -> nn.Linear:
    """Stores the [out, in] weight as the transpose of a contiguous [in, out] matrix: the same
    parameter and state-dict entry, but a decode step's x @ W.T then walks W row by row, which
    torch's CPU matrix-vector product streams at 16-22 GB/s here against 13 for the [out, in]
    layout, for every shape with out >= in (measured with weights larger than the caches:
    768x768 16.0 vs 13.3, 3072x768 21.5 vs 13.5, the 65536x768 head 20.5 vs 13.3 GB/s; but
    768x3072 15.7 vs 20.4, so the channel mix's value projection keeps its layout).
    load_state_dict copies into the parameter and keeps the layout."""
    linear.weight = nn.Parameter(linear.weight.detach().t().contiguous().t())
    return linear


class RWKV7TimeMix(nn.Module):
    """RWKV-7 time mixing: token-shift lerps, r/k/v projections, low-rank decay (w), in-context
    learning rate (a), value residual (v, from layer 1 on) and gate (g), k_k / k_a
    normalisation, the WKV recurrence in libwkv, per-head group norm ``ln_x``, the r·k bonus,
    and the output projection."""

    def __init__(self, config: RWKV7Config, layer_id: int, context: Optional[Context] = None) -> None:
        super().__init__()
        c = config
        C = c.n_embd
        self.layer_id, self.n_head, self.head_size = layer_id, c.n_head, c.head_size
        self.context = context
        for name in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g", "w0", "a0", "k_k", "k_a"):
            setattr(self, name, _row_param(C))
        self.w1, self.w2 = nn.Parameter(torch.zeros(C, c.decay_lora)), nn.Parameter(torch.zeros(c.decay_lora, C))
        self.a1, self.a2 = nn.Parameter(torch.zeros(C, c.iclr_lora)), nn.Parameter(torch.zeros(c.iclr_lora, C))
        self.has_value_residual = layer_id > 0
        if layer_id > 0 or c.layer0_value_lora:  # layer 0 keeps them only to round-trip such checkpoints
            self.v0 = _row_param(C)
            self.v1, self.v2 = nn.Parameter(torch.zeros(C, c.value_lora)), nn.Parameter(torch.zeros(c.value_lora, C))
        self.g1, self.g2 = nn.Parameter(torch.zeros(C, c.gate_lora)), nn.Parameter(torch.zeros(c.gate_lora, C))
        self.r_k = nn.Parameter(torch.zeros(c.n_head, c.head_size))
        self.receptance = _column_major(nn.Linear(C, C, bias=False))
        self.key = _column_major(nn.Linear(C, C, bias=False))
        self.value = _column_major(nn.Linear(C, C, bias=False))
        self.output = _column_major(nn.Linear(C, C, bias=False))
        self.ln_x = nn.GroupNorm(c.n_head, C, eps=LN_X_EPS)

    def forward(self, x: torch.Tensor, shift: torch.Tensor, wkv_state: torch.Tensor,
                v_first: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, C], shift [B, C] (the token before x), wkv_state [B, H, N, N] float32,
        v_first (layer 0's v; None in layer 0) → (out, new shift, new WKV state, v_first).

        Without autograd the WKV state is stepped in place and returned."""
        B, T, C = x.shape
        H, N = self.n_head, self.head_size
        xx = _shifted(x, shift)
        xr, xw, xk, xv, xa, xg = (x + xx * m for m in (self.x_r, self.x_w, self.x_k, self.x_v, self.x_a, self.x_g))
        r = self.receptance(xr)
        w = self.w0 + torch.tanh(xw @ self.w1) @ self.w2  # decay = exp(-e^-0.5 sigmoid(w)): libwkv's "clampw"
        k = self.key(xk)
        v = self.value(xv)
        a = torch.sigmoid(self.a0 + (xa @ self.a1) @ self.a2)
        g = torch.sigmoid(xg @ self.g1) @ self.g2
        kk = F.normalize((k * self.k_k).view(B, T, H, N), dim=-1, p=2.0)
        k = k * (1 + (a - 1) * self.k_a)
        if self.has_value_residual:
            if v_first is None:
                raise ValueError("RWKV7TimeMix layer %d: v_first (layer 0's v) is required" % self.layer_id)
            v = v + (v_first - v) * torch.sigmoid(self.v0 + (xv @ self.v1) @ self.v2)
        else:
            v_first = v
        shape = (B, T, H, N)
        rs, ks, vs = r.view(shape), k.view(shape), v.view(shape)
        wkv_in = (rs, w.view(shape), ks, vs, -kk, (kk * a.view(shape)))
        if torch.is_grad_enabled() and (wkv_state.requires_grad or any(t.requires_grad for t in wkv_in)):
            y, wkv_state = _wt.rwkv7(*wkv_in, wkv_state, decay="clampw", context=self.context)
        else:
            y = _ops.rwkv7(*(t.contiguous() for t in wkv_in), wkv_state, decay="clampw", state_out=wkv_state,
                           context=self.context).y
        y = F.group_norm(y.reshape(B * T, C), H, self.ln_x.weight, self.ln_x.bias, eps=LN_X_EPS).view(B, T, C)
        y = y + ((rs * ks * self.r_k).sum(dim=-1, keepdim=True) * vs).view(B, T, C)
        return self.output(y * g), x[:, -1], wkv_state, v_first


class RWKV7ChannelMix(nn.Module):
    """RWKV-7 channel mixing: token shift, squared-ReLU key projection, value projection."""

    def __init__(self, config: RWKV7Config) -> None:
        super().__init__()
        self.x_k = _row_param(config.n_embd)
        self.key = _column_major(nn.Linear(config.n_embd, config.ffn, bias=False))
        self.value = nn.Linear(config.ffn, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor, shift: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        k = x + _shifted(x, shift) * self.x_k
        return self.value(torch.relu(self.key(k)) ** 2), x[:, -1]


class RWKV7Block(nn.Module):
    """One layer: (ln0 in layer 0), ln1 → time mix, ln2 → channel mix, both residual."""

    def __init__(self, config: RWKV7Config, layer_id: int, context: Optional[Context] = None) -> None:
        super().__init__()
        C = config.n_embd
        if layer_id == 0:
            self.ln0 = nn.LayerNorm(C)
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.att = RWKV7TimeMix(config, layer_id, context)
        self.ffn = RWKV7ChannelMix(config)

    def forward(self, x: torch.Tensor, state: RWKV7State, layer: int, v_first: Optional[torch.Tensor]):
        """Runs the layer on x [B, T, C], updating ``state``'s entries for ``layer``."""
        if hasattr(self, "ln0"):
            x = self.ln0(x)
        y, state.att_shift[layer], state.wkv[layer], v_first = self.att(
            self.ln1(x), state.att_shift[layer], state.wkv[layer], v_first)
        x = x + y
        y, state.ffn_shift[layer] = self.ffn(self.ln2(x), state.ffn_shift[layer])
        return x + y, v_first


class RWKV7Model(nn.Module):
    """The RWKV-7 language model: embedding, ``n_layer`` :class:`RWKV7Block`, ln_out, head.

    ``model(tokens, state)`` takes token ids [B, T] (or [T]) and an optional
    :class:`RWKV7State` (zeros when None) → ``(logits [B, T, vocab], state)``. The state passed
    in is advanced and returned (like the ``rwkv`` package's state list; without autograd its
    WKV tensors are stepped in place): ``state.clone()`` first to keep the old one. ``last_only=True`` computes the head for the last token only (what
    prefill before decoding needs). Build from weights with :func:`wkv.model.load` or
    :meth:`from_state_dict`, or untrained with :func:`wkv.model.random_init`."""

    def __init__(self, config: RWKV7Config, context: Optional[Context] = None) -> None:
        super().__init__()
        config.check()
        self.config = config
        self.emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList(RWKV7Block(config, i, context) for i in range(config.n_layer))
        self.ln_out = nn.LayerNorm(config.n_embd)
        self.head = _column_major(nn.Linear(config.n_embd, config.vocab_size, bias=False))

    def zero_state(self, batch: int = 1) -> RWKV7State:
        p = self.emb.weight
        return RWKV7State.zeros(self.config, batch, device=p.device, dtype=p.dtype)

    def forward(self, tokens: torch.Tensor, state: Optional[RWKV7State] = None, *,
                last_only: bool = False) -> Tuple[torch.Tensor, RWKV7State]:
        if tokens.dim() == 1:
            tokens = tokens.unsqueeze(0)
        if tokens.dim() != 2 or tokens.shape[1] == 0:
            raise ValueError("RWKV7Model: tokens must be [B, T] (or [T]) with T >= 1; got shape %s"
                             % (tuple(tokens.shape),))
        if state is None:
            state = self.zero_state(tokens.shape[0])
        elif state.batch != tokens.shape[0] or len(state.wkv) != self.config.n_layer:
            raise ValueError("RWKV7Model: the state holds %d sequences and %d layers; tokens have %d sequences "
                             "and the model %d layers" % (state.batch, len(state.wkv), tokens.shape[0],
                                                          self.config.n_layer))
        if tokens.shape[1] == 1 and not torch.is_grad_enabled():
            return _decode_step(self, tokens[:, 0], state).unsqueeze(1), state
        x = self.emb(tokens)
        v_first = None
        for i, block in enumerate(self.blocks):
            x, v_first = block(x, state, i, v_first)
        if last_only:
            x = x[:, -1:]
        return self.head(self.ln_out(x)), state


_decode_contexts: List[Context] = []


def _one_thread_context() -> Context:
    if not _decode_contexts or _decode_contexts[0].closed:
        _decode_contexts[:] = [Context("cpu", threads=1)]
    return _decode_contexts[0]


def _decode_step(model: RWKV7Model, tokens: torch.Tensor, state: RWKV7State) -> torch.Tensor:
    """One token per sequence without autograd: the blocks' arithmetic on [B, C] rows, written
    out here instead of through the modules' calls. A decode step's projections are
    matrix-vector products that stream the weights at memory speed; what is left is the Python
    around ~40 small ops per layer, which the module path spends about 0.5 ms per layer on
    (nn.Module calls, attribute lookups, [B, T, C] views, the token-shift concatenation) at the
    0.1B shape here. Same values as the module path (tested: prefill + decode == one prefill).

    On the CPU, with no context given, the recurrence runs on a one-thread context: a step is
    a few microseconds of work, and waking the library's second thread while torch's own
    threads hold the cores cost 2.6 ms per token against 0.65 (0.1B shape, 2 cores).

    Rejected: the products through numpy's BLAS (OpenBLAS). Alone its matrix-vector product
    streams these weights at 26-33 GB/s against torch's 15-23, but in the loop its threads share
    the two cores with torch's OpenMP workers, which spin after any parallel torch op (the
    argmax over the logits, a prefill): decode 28 -> 9 tokens/s; with one BLAS thread 29.6."""
    lin = F.linear
    decode_context = None
    if tokens.device.type == "cpu" and current_context() is None:
        decode_context = _one_thread_context()
    x = model.emb(tokens)
    v_first = None
    for i, block in enumerate(model.blocks):
        if i == 0:
            x = F.layer_norm(x, x.shape[-1:], block.ln0.weight, block.ln0.bias, block.ln0.eps)
        att, ffn = block.att, block.ffn
        B, C = x.shape
        H, N = att.n_head, att.head_size
        xa_ = F.layer_norm(x, (C,), block.ln1.weight, block.ln1.bias, block.ln1.eps)
        xx = state.att_shift[i].to(xa_.dtype) - xa_
        state.att_shift[i] = xa_
        xr, xw, xk, xv, xa, xg = (torch.addcmul(xa_, xx, m[0]) for m in (att.x_r, att.x_w, att.x_k, att.x_v,
                                                                          att.x_a, att.x_g))
        r = lin(xr, att.receptance.weight)
        w = att.w0[0] + torch.tanh(xw @ att.w1) @ att.w2
        k = lin(xk, att.key.weight)
        v = lin(xv, att.value.weight)
        a = torch.sigmoid(att.a0[0] + (xa @ att.a1) @ att.a2)
        g = torch.sigmoid(xg @ att.g1) @ att.g2
        kk = F.normalize((k * att.k_k[0]).view(B, H, N), dim=-1, p=2.0)
        k = k * (1 + (a - 1) * att.k_a[0])
        if att.has_value_residual:
            v = v + (v_first - v) * torch.sigmoid(att.v0[0] + (xv @ att.v1) @ att.v2)
        else:
            v_first = v
        shape = (B, 1, H, N)
        rs, ks, vs = r.view(shape), k.view(shape), v.view(shape)
        y = _ops.rwkv7(rs, w.view(shape), ks, vs, (-kk).view(shape), (kk * a.view(B, H, N)).view(shape),
                       state.wkv[i], decay="clampw", state_out=state.wkv[i],
                       context=att.context or decode_context).y
        y = F.group_norm(y.view(B, C), H, att.ln_x.weight, att.ln_x.bias, eps=LN_X_EPS)
        y = y + ((rs * ks * att.r_k).sum(dim=-1, keepdim=True) * vs).view(B, C)
        x = x + lin(y * g, att.output.weight)
        xf = F.layer_norm(x, (C,), block.ln2.weight, block.ln2.bias, block.ln2.eps)
        kf = torch.addcmul(xf, state.ffn_shift[i].to(xf.dtype) - xf, ffn.x_k[0])
        state.ffn_shift[i] = xf
        x = x + lin(torch.relu(lin(kf, ffn.key.weight)) ** 2, ffn.value.weight)
    x = F.layer_norm(x, x.shape[-1:], model.ln_out.weight, model.ln_out.bias, model.ln_out.eps)
    return lin(x, model.head.weight)
