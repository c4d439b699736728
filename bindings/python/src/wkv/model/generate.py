"""Tokenisers, sampling and the prefill + decode loop for :class:`wkv.model.RWKV7Model`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence

import torch

from .rwkv7 import RWKV7Model, RWKV7State

__all__ = ["ByteTokenizer", "world_tokenizer", "tokenizer_for", "sample", "generate", "Generation"]


class ByteTokenizer:
    """UTF-8 bytes as tokens (vocabulary 256): works with any model whose vocabulary has at
    least 256 entries; what the random-init demos use."""

    vocab_size = 256

    def encode(self, text: str) -> List[int]:
        return list(text.encode("utf-8"))

    def decode_bytes(self, tokens: Sequence[int]) -> bytes:
        return bytes(int(t) & 0xFF for t in tokens)


class _WorldTokenizer:
    """The RWKV World tokenizer (vocabulary 65536) shipped by the ``rwkv`` pip package."""

    vocab_size = 65536

    def __init__(self) -> None:
        import os

        from rwkv import rwkv_tokenizer  # the package's tokenizer module imports nothing heavy

        self._t = rwkv_tokenizer.TRIE_TOKENIZER(os.path.join(os.path.dirname(rwkv_tokenizer.__file__),
                                                             "rwkv_vocab_v20230424.txt"))

    def encode(self, text: str) -> List[int]:
        return list(self._t.encodeBytes(text.encode("utf-8")))

    def decode_bytes(self, tokens: Sequence[int]) -> bytes:
        return self._t.decodeBytes([int(t) for t in tokens])


def world_tokenizer() -> _WorldTokenizer:
    """The RWKV World tokenizer; needs ``pip install rwkv`` (ImportError otherwise)."""
    return _WorldTokenizer()


def tokenizer_for(model: RWKV7Model, kind: str = "auto"):
    """``"world"``, ``"bytes"``, or ``"auto"``: World for a 65536-token vocabulary when the
    ``rwkv`` package is installed, bytes otherwise."""
    if kind == "auto":
        kind = "bytes"
        if model.config.vocab_size == 65536:
            try:
                return world_tokenizer()
            except ImportError:
                pass
    if kind == "world":
        return world_tokenizer()
    if kind == "bytes":
        if model.config.vocab_size < 256:
            raise ValueError("the byte tokenizer needs a vocabulary of at least 256; the model has %d"
                             % model.config.vocab_size)
        return ByteTokenizer()
    raise ValueError("tokenizer %r: expected 'auto', 'world' or 'bytes'" % kind)


def sample(logits: torch.Tensor, temperature: float = 1.0, top_p: float = 0.85,
           generator: Optional[torch.Generator] = None) -> int:
    """One token from logits [vocab]: nucleus (top-p) sampling at a temperature; temperature 0
    (or top_p 0) is greedy."""
    logits = logits.float().reshape(-1)
    if temperature <= 0 or top_p <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / temperature, dim=-1)
    sorted_p, order = torch.sort(probs, descending=True)
    keep = torch.cumsum(sorted_p, 0) - sorted_p < top_p  # the smallest prefix reaching top_p
    sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
    pick = torch.multinomial(sorted_p.cpu() / sorted_p.sum().cpu(), 1, generator=generator)
    return int(order.cpu()[pick])


@dataclass
class Generation:
    """What :func:`generate` produced, and how fast."""

    prompt_tokens: List[int]
    tokens: List[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    state: Optional[RWKV7State] = None

    @property
    def prefill_tokens_per_second(self) -> float:
        return len(self.prompt_tokens) / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        # the first new token comes from the prefill's logits; each later one costs a decode step
        steps = max(len(self.tokens) - 1, 0)
        return steps / self.decode_seconds if self.decode_seconds else 0.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def generate(model: RWKV7Model, prompt_tokens: Sequence[int], max_new_tokens: int, *, temperature: float = 1.0,
             top_p: float = 0.85, seed: Optional[int] = None, state: Optional[RWKV7State] = None,
             stop_tokens: Sequence[int] = (), on_token: Optional[Callable[[int], None]] = None) -> Generation:
    """Prefills the prompt in one call per layer, then decodes one token at a time, stepping the
    state in place. ``on_token`` sees each token as it is sampled."""
    if not prompt_tokens:
        raise ValueError("generate: the prompt has no tokens")
    device = model.emb.weight.device
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    out = Generation(prompt_tokens=[int(t) for t in prompt_tokens])
    _sync(device)
    t0 = time.perf_counter()
    logits, state = model(torch.tensor([out.prompt_tokens], device=device), state, last_only=True)
    tok = sample(logits[0, -1], temperature, top_p, gen)
    _sync(device)
    t1 = time.perf_counter()
    out.prefill_seconds = t1 - t0
    step = torch.empty((1, 1), dtype=torch.long, device=device)
    for i in range(max_new_tokens):
        out.tokens.append(tok)
        if on_token is not None:
            on_token(tok)
        if tok in stop_tokens or i + 1 == max_new_tokens:
            break
        step.fill_(tok)
        logits, state = model(step, state)
        tok = sample(logits[0, -1], temperature, top_p, gen)
    _sync(device)
    out.decode_seconds = time.perf_counter() - t1
    out.state = state
    return out
