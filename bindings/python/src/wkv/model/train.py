"""Training an RWKV-7 model through libwkv: the language-model loss, infinite-context chunks,
state tuning, and a small loop on a text file.

* **infctx** (:func:`chunked_loss`): a long sequence in chunks of ``chunk_len`` tokens, the
  state carried from chunk to chunk *with* its autograd history, so the gradient is the
  full-sequence gradient while each chunk's activations are the only ones alive per forward.
  (Pass ``detach=True`` for truncated backpropagation instead.)
* **state tuning** (:class:`StateTuner`): a learnable initial WKV state per layer, trained
  while the model's weights stay frozen; its gradient is libwkv's state gradient.
"""

from __future__ import annotations

import math
import time
from typing import Callable, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .rwkv7 import RWKV7Model, RWKV7State

__all__ = ["StateTuner", "chunked_loss", "train_on_text"]


class StateTuner(nn.Module):
    """The initial WKV state of every layer as a parameter ``wkv0`` [L, H, N, N] (zeros at
    first: the model's own behaviour), shared by every sequence of a batch. Train it with the
    model frozen (``model.requires_grad_(False)``); save ``tuner.state_dict()``."""

    def __init__(self, model: RWKV7Model) -> None:
        super().__init__()
        c = model.config
        self.wkv0 = nn.Parameter(torch.zeros(c.n_layer, c.n_head, c.head_size, c.head_size,
                                             device=model.emb.weight.device))

    def initial_state(self, model: RWKV7Model, batch: int) -> RWKV7State:
        s = model.zero_state(batch)
        s.wkv = [self.wkv0[i].unsqueeze(0).expand(batch, -1, -1, -1).contiguous() for i in range(len(s.wkv))]
        return s


def chunked_loss(model: RWKV7Model, tokens: torch.Tensor, targets: torch.Tensor, chunk_len: int,
                 state: Optional[RWKV7State] = None, detach: bool = False):
    """Mean next-token cross entropy over [B, T] ``tokens`` / ``targets`` (-100: ignored), run in
    chunks of ``chunk_len`` tokens carrying the state → ``(loss, final state)``. With
    ``detach=False`` its gradient equals the one-call gradient."""
    if chunk_len <= 0:
        raise ValueError("chunked_loss: chunk_len must be positive, got %d" % chunk_len)
    total = torch.zeros((), device=tokens.device)
    count = (targets != -100).sum()
    for t0 in range(0, tokens.shape[1], chunk_len):
        if detach and state is not None:
            state = state.detach()
        logits, state = model(tokens[:, t0:t0 + chunk_len], state)
        total = total + F.cross_entropy(logits.float().flatten(0, 1), targets[:, t0:t0 + chunk_len].flatten(),
                                        ignore_index=-100, reduction="sum")
    return total / count.clamp(min=1), state


def train_on_text(model: RWKV7Model, data: torch.Tensor, *, steps: int = 300, batch: int = 8, seq_len: int = 64,
                  lr: float = 3e-3, chunk_len: Optional[int] = None, seed: int = 0,
                  log: Optional[Callable[[str], None]] = print, log_every: int = 50) -> List[float]:
    """AdamW on random windows of a token stream ``data`` (1-D long tensor, e.g. a text file's
    bytes); ``chunk_len`` runs each window in infctx chunks. Returns the loss of every step."""
    if data.dim() != 1 or data.numel() < seq_len + 2:
        raise ValueError("train_on_text: need a 1-D token stream longer than seq_len + 1 = %d; got %d tokens"
                         % (seq_len + 1, data.numel()))
    device = model.emb.weight.device
    gen = torch.Generator().manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    model.train()
    losses: List[float] = []
    t_start = time.perf_counter()
    for step in range(1, steps + 1):
        starts = torch.randint(0, data.numel() - seq_len - 1, (batch,), generator=gen)
        window = torch.stack([data[s:s + seq_len + 1] for s in starts.tolist()]).to(device)
        x, y = window[:, :-1], window[:, 1:]
        if chunk_len:
            loss, _ = chunked_loss(model, x, y, chunk_len)
        else:
            logits, _ = model(x)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if log is not None and (step % log_every == 0 or step == 1 or step == steps):
            log("step %4d  loss %.3f  (%.1f bits/token)  %.1f s" % (step, losses[-1], losses[-1] / math.log(2),
                                                                  time.perf_counter() - t_start))
    model.eval()
    return losses
