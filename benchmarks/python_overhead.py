#!/usr/bin/env python3
"""Python-side cost of one wkv.rwkv7 call: the call through the package against the same C call
made directly on the descriptor the package built (so the difference is the Python overhead).

    WKV_LIBRARY=build/libwkv.so PYTHONPATH=bindings/python/src \
        python3 benchmarks/python_overhead.py --out benchmarks/python-cpu-zen4.json

Cases: decode shapes (B = T = 1), CPU tensors; torch and numpy, with the outputs given (a decode
loop stepping its state in place) or allocated by the call, and the general path that strided,
packed or mixed-dtype calls take. Medians of --rounds rounds of --calls calls each. CUDA tensors take the general path
(their calls set the stream); they are timed only where a GPU is present (--cuda).
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

import numpy as np

import wkv
import wkv._fast as fast
from wkv._lib import load


def per_call(fn, calls: int, rounds: int) -> float:
    for _ in range(200):
        fn()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(times)


def general(fn):
    """fn with the fast path switched off: the general path (views, DLPack rules, checks)."""
    def run():
        saved = fast.forward
        fast.forward = lambda *a, **k: None
        try:
            return fn()
        finally:
            fast.forward = saved
    return run


def c_only(plan_key_shape, calls: int, rounds: int) -> float:
    """The library call alone, on the cached descriptor of the last fast-path call of this shape
    (the caller keeps the arrays its pointers name alive)."""
    lib, ctx = load(), wkv.default_context()
    plan = [p for k, p in fast._PLANS.items() if k[5][0] == plan_key_shape][-1]
    return per_call(lambda: lib.wkv_forward(ctx.handle, plan.desc_ref), calls, rounds)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch

    rows = []
    for H, N in ((32, 64), (1, 16)):
        shape = (1, 1, H, N)
        xt = [torch.randn(shape) * 0.3 for _ in range(6)]
        st, yt = torch.zeros(1, H, N, N), torch.empty(shape)
        xn = [t.numpy().copy() for t in xt]
        sn, yn = np.zeros((1, H, N, N), np.float32), np.empty(shape, np.float32)
        fast._PLANS.clear()
        with torch.no_grad():
            cases = [
                ("torch, out= and state_out= given (in place)", lambda: wkv.rwkv7(*xt, st, out=yt, state_out=st)),
                ("torch, outputs allocated", lambda: wkv.rwkv7(*xt, st)),
                ("numpy, out= and state_out= given (in place)", lambda: wkv.rwkv7(*xn, sn, out=yn, state_out=sn)),
                ("numpy, outputs allocated", lambda: wkv.rwkv7(*xn, sn)),
                ("torch, in place, the general path (what any other call pays)", general(
                    lambda: wkv.rwkv7(*xt, st, out=yt, state_out=st))),
            ]
            t_c = None
            for name, fn in cases:
                t_py = per_call(fn, args.calls, args.rounds)
                if t_c is None:  # the first case leaves the plan's pointers on live arrays (xt, st, yt)
                    t_c = c_only(shape, args.calls, args.rounds)
                row = {"case": name, "shape": "B=1 T=1 H=%d N=%d f32" % (H, N), "python_us": t_py, "c_us": t_c}
                rows.append(row)
                print(json.dumps(row), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    try:
        cpu = [ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")][0]
    except (OSError, IndexError):
        cpu = platform.processor()
    doc = {"backend": "python-cpu", "machine": "%s, %d CPUs, Python %s, torch %s, numpy %s" % (
               cpu, os.cpu_count(), platform.python_version(), torch.__version__, np.__version__),
           "commit": commit, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "libwkv_command": "python3 benchmarks/python_overhead.py " + " ".join(sys.argv[1:]),
           "anchor": "the same C call on the package's cached descriptor (ctypes, no Python around it)",
           "anchor_same_run": True,
           "method": "medians of %d rounds of %d calls, after 200 warm-up calls; the default CPU context (2 threads)"
                     % (args.rounds, args.calls),
           "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
