"""An RWKV-7 ("x070") language model whose WKV recurrence runs in libwkv (needs torch).

    import wkv.model as wm
    model = wm.load("RWKV-x070-World-0.1B.pth")              # or .safetensors; sizes inferred
    model = wm.random_init(wm.RWKV7Config(n_layer=2, n_embd=128, vocab_size=256))
    tok = wm.tokenizer_for(model)                              # World (pip install rwkv) or bytes
    g = wm.generate(model, tok.encode("Hello"), 32, temperature=1.0, top_p=0.85)
    print(tok.decode_bytes(g.tokens).decode("utf-8", "replace"), g.decode_tokens_per_second)

The modules (:class:`RWKV7TimeMix`, :class:`RWKV7ChannelMix`, :class:`RWKV7Block`,
:class:`RWKV7Model`) carry BlinkDL's parameter names, so ``state_dict()`` is an official
checkpoint. ``model(tokens, state)`` → ``(logits, state)``; training goes through autograd
(:mod:`wkv.model.train`: infctx chunks, state tuning). ``python -m wkv.model --help`` runs it.
"""

from .checkpoint import (SIZES, CheckpointError, from_state_dict, infer_config, load, random_init, read_state_dict,
                         save_safetensors)
from .generate import ByteTokenizer, Generation, generate, sample, tokenizer_for, world_tokenizer
from .rwkv7 import RWKV7Block, RWKV7ChannelMix, RWKV7Config, RWKV7Model, RWKV7State, RWKV7TimeMix
from .train import StateTuner, chunked_loss, train_on_text

__all__ = ["RWKV7Config", "RWKV7State", "RWKV7TimeMix", "RWKV7ChannelMix", "RWKV7Block", "RWKV7Model",
           "CheckpointError", "read_state_dict", "infer_config", "load", "from_state_dict", "random_init",
           "save_safetensors", "SIZES", "ByteTokenizer", "world_tokenizer", "tokenizer_for", "sample", "generate",
           "Generation", "StateTuner", "chunked_loss", "train_on_text"]
