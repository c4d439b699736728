#!/usr/bin/env python3
"""One long sequence in P segments on one device (wkv.torch.rwkv7_segmented: the segments as the
batch of each call) against the one call that walks it whole, in the same process, alternating.

    WKV_LIBRARY=build/libwkv.so PYTHONPATH=bindings/python/src \
        python3 benchmarks/context_parallel_bench.py --out benchmarks/context-parallel-cpu-zen4.json
        ... --device cuda --out benchmarks/context-parallel-cuda-h100.json   # CUDA tensors, CUDA plugin

The split costs each segment two forwards (its transition runs from zeros and from the identity,
whose outputs also give its y) and, in training, two backwards: on one device that is about
twice the work of the one call. The ratio says what P devices must win back: with the segments
on P devices, the wall time is about (segmented time) / P plus the exchange.
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
import time

import torch

import wkv.torch as wt

# (case, T, dtype, segment counts): H = 32, N = 64, B = 1
CASES = [("forward", 65536, torch.float32, (2, 8)), ("forward", 65536, torch.bfloat16, (2, 8)),
         ("forward + backward", 16384, torch.float32, (2, 8))]
H, N = 32, 64


def inputs(T, dtype, grad, device="cpu"):
    g = torch.Generator().manual_seed(T)
    shape = (1, T, H, N)
    r, k, v = [torch.randn(shape, generator=g) * 0.5 for _ in range(3)]
    w = -torch.rand(shape, generator=g) * 0.5 - 0.05  # w for the clampw decay form (wkv.h)
    kk = torch.nn.functional.normalize(torch.randn(shape, generator=g), dim=-1)
    a = -kk
    b = kk * torch.rand(shape, generator=g)
    return [t.to(device=device, dtype=dtype).requires_grad_(grad) for t in (r, w, k, v, a, b)]


def median_s(fn, repeats, device="cpu"):
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    fn()
    sync()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = []
    for case, T, dtype, segments in CASES:
        train = case != "forward"
        x = inputs(T, dtype, train, args.device)

        def one():
            y, s = wt.rwkv7(*x)
            if train:
                (y.float().sum() + s.sum()).backward()

        for P in segments:
            def split():
                y, s = wt.rwkv7_segmented(*x, segments=P)
                if train:
                    (y.float().sum() + s.sum()).backward()

            with torch.set_grad_enabled(train):
                t_split, t_one = median_s(split, args.repeats, args.device), median_s(one, args.repeats, args.device)
            row = {"case": "RWKV-7 %s, %d segments on one device" % (case, P),
                   "shape": "B=1 T=%d H=%d N=%d" % (T, H, N), "dtype": {torch.float32: "f32"}.get(dtype, "bf16"),
                   "segments": P, "libwkv_ms": t_split * 1e3, "anchor": "one call (wkv.torch.rwkv7)",
                   "anchor_ms": t_one * 1e3}
            rows.append(row)
            print(json.dumps(row), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    try:
        cpu = [ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")][0]
    except (OSError, IndexError):
        cpu = platform.processor()
    machine = "%s, %d CPUs; torch %s" % (cpu, os.cpu_count(), torch.__version__)
    if args.device == "cuda":
        machine = "%s; %s" % (torch.cuda.get_device_name(), machine)
    doc = {"backend": "context-parallel-" + args.device, "machine": machine,
           "commit": commit, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "libwkv_command": "python3 benchmarks/context_parallel_bench.py " + " ".join(sys.argv[1:]),
           "anchor": "the one call that walks the whole sequence, same process, alternating",
           "anchor_same_run": True,
           "method": "medians of %d after one warm-up (CUDA: synchronised); the default context (CPU: every "
                     "thread); training: loss = sum(y) + sum(final state), forward + backward" % args.repeats,
           "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
