"""``python -m wkv.model``: run an RWKV-7 model through libwkv.

    python -m wkv.model generate --weights RWKV-x070-World-0.1B.pth --prompt "The capital of France is"
    python -m wkv.model generate --random-init 0.1b --tokens 64          # an untrained model of that shape
    python -m wkv.model train --text README.md --random-init tiny --steps 300 --save tiny.safetensors

``generate`` prints tokens as they come, then prefill and decode tokens/s. ``train`` fits a
byte-level model to a text file and reports the loss. Exit status 0, 1 on an error (a bad
checkpoint, say), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional


def _device(name: str) -> str:
    import torch

    import wkv

    if name != "auto":
        return name
    return "cuda" if torch.cuda.is_available() and wkv.backend_info("cuda")["available"] else "cpu"


def _dtype(name: str):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def _model(args: argparse.Namespace, vocab: int):
    import wkv.model as wm

    if args.weights:
        return wm.load(args.weights, dtype=_dtype(args.dtype), device=_device(args.device))
    size = args.random_init
    if size in wm.SIZES:
        n_layer, n_embd = wm.SIZES[size]
    else:
        try:
            n_layer, n_embd = (int(p) for p in size.lower().split("x"))
        except ValueError:
            raise SystemExit("--random-init %r: expected one of %s or LAYERSxWIDTH (e.g. 4x256)" % (
                size, ", ".join(wm.SIZES))) from None
    config = wm.RWKV7Config(n_layer=n_layer, n_embd=n_embd, head_size=args.head_size, vocab_size=vocab)
    return wm.random_init(config, seed=args.seed, dtype=_dtype(args.dtype), device=_device(args.device))


class _Printer:
    """Prints decoded text as tokens arrive, holding back bytes of an incomplete UTF-8 character."""

    def __init__(self, tok) -> None:
        self.tok, self.pending = tok, b""

    def __call__(self, t: int) -> None:
        self.pending += self.tok.decode_bytes([t])
        try:
            text, self.pending = self.pending.decode("utf-8"), b""
        except UnicodeDecodeError as e:
            if e.start == 0 and len(self.pending) < 4:
                return
            text, self.pending = self.pending.decode("utf-8", "replace"), b""
        sys.stdout.write(text)
        sys.stdout.flush()


def cmd_generate(args: argparse.Namespace) -> int:
    import wkv
    import wkv.model as wm

    model = _model(args, 256 if args.tokenizer == "bytes" else args.vocab)
    tok = wm.tokenizer_for(model, args.tokenizer)
    prompt = tok.encode(args.prompt)
    c = model.config
    print("RWKV-7 %s: %d layers, width %d, head size %d, vocabulary %d, %s %s; libwkv %s"
          % (os.path.basename(args.weights) if args.weights else "random-init " + args.random_init, c.n_layer,
             c.n_embd, c.head_size, c.vocab_size, str(model.emb.weight.dtype).replace("torch.", ""),
             model.emb.weight.device, wkv.version()), file=sys.stderr)
    sys.stdout.write(args.prompt)
    g = wm.generate(model, prompt, args.tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                    on_token=_Printer(tok))
    print()
    print("prefill: %d tokens in %.3f s (%.1f tokens/s); decode: %d tokens in %.3f s (%.1f tokens/s)"
          % (len(g.prompt_tokens), g.prefill_seconds, g.prefill_tokens_per_second, max(len(g.tokens) - 1, 0),
             g.decode_seconds, g.decode_tokens_per_second))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    import math

    import torch

    import wkv.model as wm

    with open(args.text, "rb") as f:
        data = torch.tensor(list(f.read()), dtype=torch.long)
    torch.manual_seed(args.seed)
    model = _model(args, 256)
    if model.config.vocab_size < 256:
        raise SystemExit("train: the byte-level loop needs a vocabulary of at least 256")
    print("training a %d-layer width-%d model on %s (%d bytes); chance is ln 256 = %.2f"
          % (model.config.n_layer, model.config.n_embd, args.text, data.numel(), math.log(256)))
    losses = wm.train_on_text(model, data, steps=args.steps, batch=args.batch, seq_len=args.seq, lr=args.lr,
                              chunk_len=args.chunk, seed=args.seed)
    if args.save:
        wm.save_safetensors(model.state_dict(), args.save)
        print("saved %s" % args.save)
    return 0 if losses[-1] < losses[0] else 1


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wkv.model", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, doc in (("generate", "prefill a prompt, then sample tokens"),
                      ("train", "train a byte-level model on a text file")):
        p = sub.add_parser(name, help=doc)
        src = p.add_mutually_exclusive_group(required=name == "generate")
        src.add_argument("--weights", help="a .pth or .safetensors RWKV-7 checkpoint (BlinkDL's key names)")
        src.add_argument("--random-init", metavar="SIZE",
                         help="an untrained model: tiny, small, 0.1b, 0.4b, 1.5b or LAYERSxWIDTH")
        p.add_argument("--head-size", type=int, default=64, help="head size of a random-init model (default 64)")
        p.add_argument("--device", default="auto", help="cpu, cuda or auto (default)")
        p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
        p.add_argument("--seed", type=int, default=0)
    g = sub.choices["generate"]
    g.add_argument("--prompt", default="The quick brown fox")
    g.add_argument("--tokens", type=int, default=64, help="tokens to generate (default 64)")
    g.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    g.add_argument("--top-p", type=float, default=0.85)
    g.add_argument("--tokenizer", default="auto", choices=("auto", "world", "bytes"))
    g.add_argument("--vocab", type=int, default=65536, help="vocabulary of a random-init model (default 65536; "
                                                             "256 with --tokenizer bytes)")
    t = sub.choices["train"]
    t.add_argument("--text", required=True, help="the training text (read as bytes)")
    t.add_argument("--steps", type=int, default=300)
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--seq", type=int, default=64)
    t.add_argument("--chunk", type=int, default=None, help="infctx: run each window in chunks of this many tokens")
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--save", help="write the trained weights here (.safetensors)")
    args = ap.parse_args(argv)
    if args.cmd == "train" and not (args.weights or args.random_init):
        args.random_init = "tiny"
    try:
        return cmd_generate(args) if args.cmd == "generate" else cmd_train(args)
    except Exception as e:  # a bad checkpoint, an unavailable device: say it, no traceback
        from .checkpoint import CheckpointError

        import wkv

        if isinstance(e, (CheckpointError, wkv.WkvError, OSError, ValueError)):
            print("python -m wkv.model: %s" % e, file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
