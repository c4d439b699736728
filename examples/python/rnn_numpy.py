#!/usr/bin/env python3
"""RNN-style inference with numpy: prefill a prompt in one call, then decode token by token,
keeping the RWKV-7 state in a numpy array that each call steps in place.

A toy "layer" (random RWKV-7-shaped projections, no trained weights) stands in for a model;
the point is the state handling: the tokens decoded one at a time give exactly what one call
over the whole sequence gives.

    pip install bindings/python          # or: WKV_LIBRARY=build/libwkv.so PYTHONPATH=bindings/python/src
    python examples/python/rnn_numpy.py [--heads 4] [--head-size 64] [--prompt 32] [--new 16]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import wkv


class ToyTimeMix:
    """Per-token inputs of an RWKV-7 time-mix from a token embedding (random weights)."""

    def __init__(self, vocab: int, H: int, N: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        C = H * N
        self.H, self.N = H, N
        self.emb = rng.standard_normal((vocab, C)).astype(np.float32)
        self.W = {n: (rng.standard_normal((C, C)) / np.sqrt(C)).astype(np.float32) for n in "rwkvab"}
        self.w0 = np.tile(np.linspace(-5, 3, N), H).astype(np.float32)  # per-channel decay offsets
        self.out = (rng.standard_normal((C, vocab)) / np.sqrt(C)).astype(np.float32)

    def inputs(self, tokens: np.ndarray):
        """[B, T] tokens -> r, w, k, v, a, b, each [B, T, H, N] float32."""
        x = self.emb[tokens]
        B, T, _ = x.shape
        shape = (B, T, self.H, self.N)
        r = (x @ self.W["r"]).reshape(shape)
        k = (x @ self.W["k"]).reshape(shape) * 0.2
        v = (x @ self.W["v"]).reshape(shape) * 0.2
        w = (x @ self.W["w"] * 0.1 + self.w0).reshape(shape)  # "clampw" form
        kk = (x @ self.W["a"]).reshape(shape)
        kk /= np.linalg.norm(kk, axis=-1, keepdims=True) + 1e-6
        iclr = 1 / (1 + np.exp(-(x @ self.W["b"]).reshape(shape)))
        return [np.ascontiguousarray(t, dtype=np.float32) for t in (r, w, k, v, -kk, kk * iclr)]

    def logits(self, y: np.ndarray) -> np.ndarray:
        B, T = y.shape[:2]
        return y.reshape(B, T, -1) @ self.out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-size", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--batch", type=int, default=2)
    args = ap.parse_args()
    H, N, B = args.heads, args.head_size, args.batch
    layer = ToyTimeMix(args.vocab, H, N)
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, args.vocab, size=(B, args.prompt))

    # One context for the whole session (CPU backend; the numpy arrays live on the host).
    ctx = wkv.Context("cpu")
    print("libwkv %s on %s" % (wkv.version(), ctx.backend))

    # Prefill: the prompt in one call, from a zero state; the final state comes back.
    state = np.zeros((B, H, N, N), np.float32)
    x = layer.inputs(prompt)
    t0 = time.perf_counter()
    y, _ = wkv.rwkv7(*x, state=state, state_out=state, decay="clampw", context=ctx)
    print("prefill: %d tokens x %d sequences in %.2f ms" % (args.prompt, B, 1e3 * (time.perf_counter() - t0)))

    # Decode: one token per call, greedy on the toy logits; the state is stepped in place.
    tokens = prompt
    nxt = layer.logits(y)[:, -1].argmax(-1)
    step_times = []
    for _ in range(args.new):
        tokens = np.concatenate([tokens, nxt[:, None]], axis=1)
        x = layer.inputs(nxt[:, None])
        t0 = time.perf_counter()
        y_t, _ = wkv.rwkv7(*x, state=state, state_out=state, decay="clampw", context=ctx)
        step_times.append(time.perf_counter() - t0)
        nxt = layer.logits(y_t)[:, -1].argmax(-1)
    print("decode: %d tokens, %.3f ms per step (B=%d, H=%d, N=%d)" % (
        args.new, 1e3 * float(np.median(step_times)), B, H, N))
    print("generated:", tokens[:, args.prompt:].tolist())

    # The same sequence in one call from scratch gives the same final state.
    full_state = np.zeros_like(state)
    wkv.rwkv7(*layer.inputs(tokens), state_out=full_state, decay="clampw", context=ctx)
    err = float(np.abs(full_state - state).max() / np.abs(full_state).max())
    print("token-by-token state vs one call: max relative difference %.1e" % err)
    assert err < 1e-4, err
    ctx.close()


if __name__ == "__main__":
    main()
