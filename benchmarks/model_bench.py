#!/usr/bin/env python3
"""Tokens/s of the RWKV-7 model (wkv.model) beside the `rwkv` pip package, in one run.

    WKV_LIBRARY=build/libwkv.so PYTHONPATH=bindings/python/src \
        python3 benchmarks/model_bench.py --sizes 0.1b --device cpu --out benchmarks/model-cpu-zen4.json

For each size: a random-init model (the shape of RWKV-7's 0.1B / 1.5B, vocabulary 65536), saved
as a .pth for the rwkv package ("cpu fp32" / "cuda fp32" strategy, the same dtype as ours), then
on both: a prefill of --prefill tokens and --decode single-token steps, in --repeats rounds that
alternate the two (medians over the rounds).
libwkv's share is the time inside its op calls (wall clock around each call; on CUDA each timed
call synchronises, so that share is an upper bound there). Writes a result file for
benchmarks/render.py.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.update(RWKV_V7_ON="1", RWKV_JIT_ON="1", RWKV_CUDA_ON="0")  # the package's own default: JIT on

import torch  # noqa: E402

import wkv  # noqa: E402
import wkv.model as wm  # noqa: E402
import wkv.model.rwkv7 as r7  # noqa: E402


class OpTimer:
    """Wraps the two op entry points the model calls and sums the wall time inside them."""

    def __init__(self, device: str) -> None:
        self.seconds, self.device = 0.0, device
        self._orig = (r7._ops.rwkv7, r7._wt.rwkv7)
        r7._ops.rwkv7, r7._wt.rwkv7 = self._wrap(self._orig[0]), self._wrap(self._orig[1])

    def _wrap(self, fn):
        def timed(*a, **k):
            sync = torch.cuda.synchronize if self.device == "cuda" else (lambda: None)
            sync()
            t = time.perf_counter()
            out = fn(*a, **k)
            sync()
            self.seconds += time.perf_counter() - t
            return out
        return timed

    def close(self) -> None:
        r7._ops.rwkv7, r7._wt.rwkv7 = self._orig


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def bench_ours(model, prompt, decode, repeats, device):
    timer = OpTimer(device)
    pre, dec, share_pre, share_dec = [], [], [], []
    try:
        with torch.no_grad():
            x = torch.tensor([prompt], device=device)
            model(x[:, :16], last_only=True)  # warm-up
            for _ in range(repeats):
                timer.seconds = 0.0
                sync(device)
                t = time.perf_counter()
                _, state = model(x, last_only=True)
                sync(device)
                pre.append(time.perf_counter() - t)
                share_pre.append(timer.seconds / pre[-1])
                step = torch.zeros((1, 1), dtype=torch.long, device=device)
                timer.seconds = 0.0
                sync(device)
                t = time.perf_counter()
                for i in range(decode):
                    step.fill_(prompt[i % len(prompt)])
                    logits, state = model(step, state)
                    logits[0, -1].argmax().item()  # what a sampler needs: the logits on the host side
                dec.append((time.perf_counter() - t) / decode)
                share_dec.append(timer.seconds / (dec[-1] * decode))
    finally:
        timer.close()
    return (statistics.median(pre), statistics.median(dec), statistics.median(share_pre),
            statistics.median(share_dec))


def load_rwkv(path, strategy):
    from rwkv.model import RWKV

    return RWKV(path[:-4], strategy)


def bench_rwkv(ref, prompt, decode, repeats, device):
    pre, dec = [], []
    with torch.no_grad():
        ref.forward(prompt[:16], None)
        for _ in range(repeats):
            sync(device)
            t = time.perf_counter()
            _, state = ref.forward(list(prompt), None)
            sync(device)
            pre.append(time.perf_counter() - t)
            t = time.perf_counter()
            for i in range(decode):
                logits, state = ref.forward([prompt[i % len(prompt)]], state)
                logits.argmax().item()
            dec.append((time.perf_counter() - t) / decode)
    return statistics.median(pre), statistics.median(dec)


def alternate(ours_fn, theirs_fn, rounds):
    """Rounds of one repeat each, ours then theirs (the VM's speed drifts between minutes);
    the medians over the rounds of every figure."""
    a, b = [], []
    for _ in range(rounds):
        a.append(ours_fn())
        b.append(theirs_fn())
    return tuple(statistics.median(x) for x in zip(*a)), tuple(statistics.median(x) for x in zip(*b))


def bench_c(binary, path, prompt, decode, repeats):
    """The C example (examples/rwkv7_model) on the same weights: its printed tokens/s, medians."""
    import re

    pre, dec = [], []
    for _ in range(repeats):
        out = subprocess.run([binary, path, "--tokens", ",".join(map(str, prompt)), "--generate", str(decode + 1)],
                             capture_output=True, text=True, check=True).stdout
        m = re.search(r"prefill: .*\(([\d.]+) tokens/s\); decode: .*\(([\d.]+) tokens/s\)", out)
        pre.append(float(m.group(1)))
        dec.append(float(m.group(2)))
    return statistics.median(pre), statistics.median(dec)


def machine() -> str:
    try:
        name = [ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")][0]
    except (OSError, IndexError):
        name = platform.processor()
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name() + " (host: %s)" % name
    return "%s, %d CPUs, %s" % (name, os.cpu_count(), platform.platform())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="0.1b", help="comma list of wkv.model.SIZES names (default 0.1b)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--c-example", help="also run this build of examples/rwkv7_model on the same weights")
    ap.add_argument("--out", help="write the result file here (JSON)")
    args = ap.parse_args()
    import rwkv

    rows = []
    prompt = [int(t) for t in torch.randint(0, 65536, (args.prefill,), generator=torch.Generator().manual_seed(0))]
    for size in args.sizes.split(","):
        n_layer, n_embd = wm.SIZES[size]
        model = wm.random_init(wm.RWKV7Config(n_layer=n_layer, n_embd=n_embd), seed=0, device=args.device)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "model.pth")
            torch.save(model.state_dict(), path)
            c_rates = None
            if args.c_example:
                st_path = os.path.join(d, "model.safetensors")
                wm.save_safetensors(model.state_dict(), st_path)
                c_rates = bench_c(args.c_example, st_path, prompt, args.decode, args.repeats)
            ref = load_rwkv(path, "%s fp32" % args.device)
            ours, theirs = alternate(lambda: bench_ours(model, prompt, args.decode, 1, args.device),
                                     lambda: bench_rwkv(ref, prompt, args.decode, 1, args.device), args.repeats)
            model = ref = None  # free them before the next size
        row = {"size": size, "n_layer": n_layer, "n_embd": n_embd, "dtype": "fp32", "prefill_tokens": args.prefill,
               "libwkv_prefill_tok_s": args.prefill / ours[0], "libwkv_decode_tok_s": 1.0 / ours[1],
               "op_share_prefill": ours[2], "op_share_decode": ours[3],
               "anchor_prefill_tok_s": args.prefill / theirs[0], "anchor_decode_tok_s": 1.0 / theirs[1]}
        if c_rates:
            row.update(c_example_prefill_tok_s=c_rates[0], c_example_decode_tok_s=c_rates[1])
        rows.append(row)
        print(json.dumps(row), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    doc = {"backend": "model-" + args.device, "machine": machine(), "commit": commit,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "libwkv_command": "python3 benchmarks/model_bench.py " + " ".join(sys.argv[1:]),
           "anchor": "rwkv %s (pip), RWKV_x070, strategy '%s fp32', JIT on; torch %s, %d threads"
                     % (rwkv.__version__ if hasattr(rwkv, "__version__") else _dist_version("rwkv"), args.device,
                        torch.__version__, torch.get_num_threads()),
           "anchor_same_run": True, "libwkv": wkv.version(),
           "method": "random-init models, fp32 weights; prefill of %d tokens in one call, %d decode steps "
                     "(each ends with the argmax on the host); %d rounds alternating the two, medians" % (
                         args.prefill, args.decode, args.repeats),
           "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    return 0


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    sys.exit(main())
