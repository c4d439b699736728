#!/usr/bin/env python3
"""Train a small RWKV-7 time-mix layer with PyTorch on a toy sequence task.

The task needs memory: each sequence is random tokens, and the target at step t is the token
seen DELAY steps earlier, so the layer must carry information forward in its WKV state. The
WKV recurrence (forward and backward) runs in libwkv through ``wkv.torch.rwkv7``; everything
around it (projections, token shift, norms) is ordinary PyTorch. The loss falls from
ln(vocab) towards 0 within a few hundred steps (well under a minute on a CPU).

    pip install bindings/python torch     # or: WKV_LIBRARY=build/libwkv.so PYTHONPATH=bindings/python/src
    python examples/python/train_torch.py [--device cpu|cuda] [--steps 300]
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import wkv
import wkv.torch as wt


class TimeMix7(nn.Module):
    """An RWKV-7 time-mix block (the "x070" layout, trimmed): token shift, r/w/k/v/a/g from
    the mixed inputs, low-rank decay and in-context learning rate, the WKV recurrence in
    libwkv, per-head group norm, the r·k bonus, and an output gate."""

    def __init__(self, C: int, H: int, lora: int = 16) -> None:
        super().__init__()
        assert C % H == 0
        self.H, self.N = H, C // H
        N = self.N
        ratio = torch.arange(C) / C
        self.mix = nn.ParameterDict({n: nn.Parameter(1 - ratio ** (0.2 + 0.3 * i)) for i, n in enumerate("rwkvag")})
        self.receptance = nn.Linear(C, C, bias=False)
        self.key = nn.Linear(C, C, bias=False)
        self.value = nn.Linear(C, C, bias=False)
        self.output = nn.Linear(C, C, bias=False)
        # decay: w = w0 + tanh(x W1) W2, used in libwkv's "clampw" form
        self.w0 = nn.Parameter(torch.linspace(-5, 3, N).repeat(H))
        self.w1 = nn.Parameter(torch.zeros(C, lora))
        self.w2 = nn.Parameter(torch.randn(lora, C) * 0.1)
        # in-context learning rate: iclr = sigmoid(a0 + x A1 A2)
        self.a0 = nn.Parameter(torch.zeros(C))
        self.a1 = nn.Parameter(torch.zeros(C, lora))
        self.a2 = nn.Parameter(torch.randn(lora, C) * 0.1)
        self.g1 = nn.Parameter(torch.zeros(C, lora))
        self.g2 = nn.Parameter(torch.randn(lora, C) * 0.1)
        self.k_k = nn.Parameter(torch.full((C,), 0.85))
        self.k_a = nn.Parameter(torch.ones(C))
        self.r_k = nn.Parameter(torch.zeros(H, N))
        self.ln_x = nn.GroupNorm(H, C, eps=64e-5)

    def forward(self, x: torch.Tensor, state: torch.Tensor = None):
        B, T, C = x.shape
        H, N = self.H, self.N
        xx = F.pad(x, (0, 0, 1, -1)) - x  # token shift: x[t-1] - x[t]
        xr, xw, xk, xv, xa, xg = (x + xx * self.mix[n] for n in "rwkvag")
        r = self.receptance(xr)
        w = self.w0 + torch.tanh(xw @ self.w1) @ self.w2
        k = self.key(xk)
        v = self.value(xv)
        iclr = torch.sigmoid(self.a0 + (xa @ self.a1) @ self.a2)
        g = torch.sigmoid(xg @ self.g1) @ self.g2
        kk = F.normalize((k * self.k_k).view(B, T, H, N), dim=-1, p=2.0)
        k = k * (1 + (iclr - 1) * self.k_a)
        shape = (B, T, H, N)
        y, state = wt.rwkv7(r.view(shape), w.view(shape), k.view(shape), v.view(shape), -kk, kk * iclr.view(shape),
                            state, decay="clampw")
        y = self.ln_x(y.reshape(B * T, C)).view(B, T, C)
        bonus = ((r.view(shape) * k.view(shape) * self.r_k).sum(-1, keepdim=True) * v.view(shape)).view(B, T, C)
        return self.output((y + bonus) * g), state


class Model(nn.Module):
    def __init__(self, vocab: int, C: int, H: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, C)
        self.ln0 = nn.LayerNorm(C)
        self.ln1 = nn.LayerNorm(C)
        self.mix = TimeMix7(C, H)
        self.ln_out = nn.LayerNorm(C)
        self.head = nn.Linear(C, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.ln0(self.emb(tokens))
        y, _ = self.mix(self.ln1(x))
        return self.head(self.ln_out(x + y))


def batch(B: int, T: int, vocab: int, delay: int, device: torch.device):
    x = torch.randint(0, vocab, (B, T), device=device)
    target = torch.full_like(x, -100)  # nothing to predict before `delay` tokens were seen
    target[:, delay:] = x[:, :-delay]
    return x, target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda when torch and libwkv both have it)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--vocab", type=int, default=16)
    ap.add_argument("--delay", type=int, default=3)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=2)  # head size 32: one every backend takes
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.device == "auto":
        cuda_ok = torch.cuda.is_available() and wkv.backend_info("cuda")["available"]
        args.device = "cuda" if cuda_ok else "cpu"
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = Model(args.vocab, args.dim, args.heads).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.steps, pct_start=0.1)
    print("libwkv %s, torch %s, device %s; task: output the token seen %d steps earlier (chance: ln %d = %.2f)"
          % (wkv.version(), torch.__version__, device, args.delay, args.vocab, math.log(args.vocab)))
    t0 = time.perf_counter()
    first = last = None
    for step in range(1, args.steps + 1):
        x, target = batch(args.batch, args.seq, args.vocab, args.delay, device)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, args.vocab), target.view(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if first is None:
            first = loss.item()
        if step % 25 == 0 or step == 1:
            with torch.no_grad():
                mask = target >= 0
                acc = (logits.argmax(-1)[mask] == target[mask]).float().mean().item()
            print("step %4d  loss %.4f  accuracy %.3f  (%.1f s)" % (step, loss.item(), acc, time.perf_counter() - t0))
        last = loss.item()
    print("loss %.3f -> %.3f in %d steps, %.1f s" % (first, last, args.steps, time.perf_counter() - t0))
    if last > 0.5 * first:
        raise SystemExit("the loss did not fall enough")


if __name__ == "__main__":
    main()
