#!/usr/bin/env python3
"""libwkv's attention against torch.nn.functional.scaled_dot_product_attention in the same
process: on the CPU (float32), or on CUDA (--device cuda: bfloat16 CUDA tensors, the CUDA plugin
with WKV_CUDA_ATTENTION=1, since its kernels are opt-in until proven on a GPU).

    WKV_LIBRARY=build/libwkv.so PYTHONPATH=bindings/python/src \
        python3 benchmarks/attention_bench.py --out benchmarks/attention-cpu-zen4.json
    ... --device cuda --out benchmarks/attention-cuda-h100.json

CPU, each case: float32 (and bfloat16 / float16 rows: prefill, a 16-bit KV cache's decode) inputs in one memory for both (torch's contiguous [B, H, T, D] tensors,
libwkv their [B, T, H, D] strided views), libwkv with its default configuration and with every
configuration, torch SDPA (its CPU flash kernel), medians over --repeats rounds that each time
all of them in a rotating order (interleaved_ms); TFLOP/s = 4 B H Tq Tk D
(halved when causal with Tq = Tk). Decode steps (Tq = 1 against a long KV cache) run 8x as many
calls. Training steps: libwkv's forward (with lse) and wkv.attention_backward against SDPA's
forward and autograd backward (TFLOP/s counted as the 7 products of a flash forward + backward:
14 B H Tq Tk D, halved when causal).
CUDA: the speed table's shapes (B=4 H=32, D 64/128, T 1024/4096/16384, causal and not, bf16),
libwkv's default and every configuration built for bf16 at that D, against SDPA with each of
its flash and cuDNN backends that runs there; synchronised wall-clock medians; TFLOP/s and the
fraction of the GPU's dense bf16 tensor-core peak where the GPU is known; one training row.
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

import wkv

# B, Hq, Tq, Tk, Hkv, D, causal; the last three are decode steps (one query row against a KV
# cache), with grouped-query heads (Hkv = 8) and without
CASES = [(1, 32, 1024, 1024, 32, 64, False), (1, 32, 1024, 1024, 32, 64, True), (1, 32, 1024, 1024, 32, 128, True),
         (4, 32, 1024, 1024, 32, 64, True), (1, 32, 4096, 4096, 32, 64, True),
         (1, 32, 1, 4096, 32, 64, False), (1, 32, 1, 4096, 8, 64, False), (1, 32, 1, 16384, 8, 64, False)]
# the same prefill shapes in bfloat16 (both sides take bf16 tensors), and a decode step
BF16_CASES = [(1, 32, 1024, 1024, 32, 64, False), (1, 32, 1024, 1024, 32, 64, True), (1, 32, 1, 4096, 8, 64, False)]
# decode steps against a float16 KV cache
F16_CASES = [(1, 32, 1, 4096, 32, 64, False), (1, 32, 1, 4096, 8, 64, False)]

# training steps (forward + backward)
TRAIN_CASES = [(1, 32, 1024, 1024, 32, 64, True), (1, 32, 1024, 1024, 32, 64, False), (1, 32, 1024, 1024, 32, 128, True),
               (1, 32, 1024, 1024, 4, 64, True)]


def interleaved_ms(fns, repeats, inner=1):
    """Median ms per call of each of fns (name -> callable): one warm-up call each, then
    `repeats` rounds that time `inner` calls of every one, the order rotated each round. Timing
    one after another instead biased the table: whatever ran right after another library's
    threads had run came out up to 50% slower (two configurations doing the same work at Tq = 1
    read 0.60 and 0.92 ms), on a 2-core machine shared with neighbours."""
    names = list(fns)
    for name in names:
        fns[name]()
    ts = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            for _ in range(inner):
                t = time.perf_counter()
                fns[name]()
                ts[name].append(time.perf_counter() - t)
    return {name: statistics.median(t) * 1e3 for name, t in ts.items()}


# CUDA: the speed table's rows (bf16), and one training step
CUDA_CASES = [(4, 32, T, T, 32, D, causal) for D in (64, 128) for T in (1024, 4096, 16384) for causal in (False, True)]
CUDA_TRAIN_CASES = [(4, 32, 1024, 1024, 32, 64, True)]
# dense bf16 tensor-core peak, TFLOP/s (NVIDIA's data sheets, SXM parts)
BF16_PEAK = {"H100": 989.4, "H200": 989.4, "A100": 312.0}


def median_ms_cuda(fn, repeats):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def main_cuda(args) -> int:
    os.environ.setdefault("WKV_CUDA_ATTENTION", "1")  # read when the CUDA context is created
    from torch.nn.attention import SDPBackend, sdpa_kernel
    ctx = wkv.Context(backend="cuda")
    gpu = torch.cuda.get_device_name()
    peak = next((v for k, v in BF16_PEAK.items() if k in gpu), None)
    all_cfg = wkv.attention_configs(ctx)
    rows = []
    for B, H, Tq, Tk, Hkv, D, causal in CUDA_CASES:
        qt, kt, vt = (torch.randn(B, h, T, D, device="cuda", dtype=torch.bfloat16) for h, T in ((H, Tq), (Hkv, Tk), (Hkv, Tk)))
        q, k, v = (x.transpose(1, 2) for x in (qt, kt, vt))
        names = [c["name"] for c in all_cfg if c["fits"] and c["dtype"] in ("any", "bfloat16") and c["head_dim"] in (0, D)]
        default = [c["name"] for c in all_cfg if c["is_default"] and c["name"] in names][0]
        anchors = {}
        with torch.no_grad():
            for label, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                try:
                    with sdpa_kernel(backend):
                        anchors[label] = median_ms_cuda(lambda: torch.nn.functional.scaled_dot_product_attention(
                            qt, kt, vt, is_causal=causal), args.repeats)
                except RuntimeError as e:  # that backend does not run here
                    print("torch SDPA %s: %s" % (label, str(e).splitlines()[0]), file=sys.stderr)
            per = {name: median_ms_cuda(lambda: wkv.attention(q, k, v, causal=causal, config=name, context=ctx),
                                        args.repeats) for name in names}
        best = min(anchors, key=anchors.get) if anchors else None
        flops = 4.0 * B * H * Tq * Tk * D * (0.5 if causal else 1.0)
        tflops = flops / per[default] / 1e9
        row = {"case": "attention fwd%s" % (" causal" if causal else ""), "shape": "B=%d H=%d T=%d D=%d" % (B, H, Tq, D),
               "dtype": "bf16", "libwkv_ms": per[default], "config": default, "configs_ms": per,
               "anchor": "torch SDPA %s" % best if best else "none ran", "anchor_ms": anchors.get(best),
               "anchors_ms": anchors, "libwkv_tflops": tflops,
               "peak_fraction": tflops / peak if peak else None}
        rows.append(row)
        print(json.dumps(row), flush=True)
    for B, H, Tq, Tk, Hkv, D, causal in CUDA_TRAIN_CASES:
        qt, kt, vt = (torch.randn(B, h, T, D, device="cuda", dtype=torch.bfloat16) for h, T in ((H, Tq), (Hkv, Tk), (Hkv, Tk)))
        q, k, v = (x.transpose(1, 2) for x in (qt, kt, vt))
        gt = torch.randn(B, H, Tq, D, device="cuda", dtype=torch.bfloat16)
        g = gt.transpose(1, 2)
        leaves = [x.clone().requires_grad_() for x in (qt, kt, vt)]

        def torch_step():
            for x in leaves:
                x.grad = None
            torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal).backward(gt)

        def wkv_step():
            o, lse = wkv.attention(q, k, v, causal=causal, return_lse=True, context=ctx)
            wkv.attention_backward(q, k, v, o, lse, g, causal=causal, context=ctx)

        t_torch, t_wkv = median_ms_cuda(torch_step, args.repeats), median_ms_cuda(wkv_step, args.repeats)
        flops = 14.0 * B * H * Tq * Tk * D * (0.5 if causal else 1.0)
        row = {"case": "attention fwd+bwd%s" % (" causal" if causal else ""), "shape": "B=%d H=%d T=%d D=%d" % (B, H, Tq, D),
               "dtype": "bf16", "libwkv_ms": t_wkv, "config": "(default)", "configs_ms": {"(default)": t_wkv},
               "anchor": "torch SDPA + autograd (its default backend)", "anchor_ms": t_torch,
               "libwkv_tflops": flops / t_wkv / 1e9}
        rows.append(row)
        print(json.dumps(row), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    doc = {"backend": "attention-cuda", "machine": "%s; torch %s" % (gpu, torch.__version__), "commit": commit,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "libwkv_command": "python3 benchmarks/attention_bench.py " + " ".join(sys.argv[1:]),
           "anchor": "torch.nn.functional.scaled_dot_product_attention (flash and cuDNN backends), same process",
           "anchor_same_run": True,
           "method": "medians of %d synchronised calls after one warm-up; bf16 CUDA tensors (libwkv: torch's "
                     "[B, H, T, D] memory as [B, T, H, D] views); the anchor column is torch's faster backend"
                     % args.repeats,
           "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.device == "cuda":
        return main_cuda(args)
    configs = [c["name"] for c in wkv.attention_configs()]
    default = [c["name"] for c in wkv.attention_configs() if c["is_default"]][0]
    rows = []
    for (B, H, Tq, Tk, Hkv, D, causal), dtype in ([(c, torch.float32) for c in CASES] +
                                                 [(c, torch.bfloat16) for c in BF16_CASES] +
                                                 [(c, torch.float16) for c in F16_CASES]):
        # the same memory for both: torch's contiguous [B, H, T, D] tensors, libwkv their
        # [B, T, H, D] views (strides; a KV cache laid out per head, as torch's SDPA wants it)
        qt, kt, vt = (torch.randn(B, h, T, D).to(dtype) for h, T in ((H, Tq), (Hkv, Tk), (Hkv, Tk)))
        q, k, v = (x.transpose(1, 2) for x in (qt, kt, vt))
        decode = Tq <= 2
        fns = {name: (lambda name=name: wkv.attention(q, k, v, causal=causal, config=name)) for name in configs}
        fns["torch"] = lambda: torch.nn.functional.scaled_dot_product_attention(
            qt, kt, vt, is_causal=causal, enable_gqa=Hkv != H)
        with torch.no_grad():
            per = interleaved_ms(fns, args.repeats, 8 if decode else 1)  # short calls: more of them
        t_torch = per.pop("torch")
        flops = 4.0 * B * H * Tq * Tk * D * (0.5 if causal and Tq == Tk else 1.0)
        if decode:
            shape = "B=%d H=%d/%d Tq=%d Tk=%d D=%d" % (B, H, Hkv, Tq, Tk, D)
        else:
            shape = "B=%d H=%d T=%d D=%d" % (B, H, Tq, D)
        row = {"case": "attention %s%s" % ("decode" if decode else "fwd", " causal" if causal else ""), "shape": shape,
               "dtype": {torch.bfloat16: "bf16", torch.float16: "f16"}.get(dtype, "f32"), "libwkv_ms": per[default], "config": default,
               "configs_ms": per, "anchor": "torch SDPA (CPU)", "anchor_ms": t_torch,
               "libwkv_tflops": flops / per[default] / 1e9}
        rows.append(row)
        print(json.dumps(row), flush=True)
    # training steps (forward + backward; the loss's gradient dout given): libwkv's forward with
    # lse then wkv.attention_backward, against torch SDPA's forward and autograd backward
    for B, H, Tq, Tk, Hkv, D, causal in TRAIN_CASES:
        qt, kt, vt = (torch.randn(B, h, T, D) for h, T in ((H, Tq), (Hkv, Tk), (Hkv, Tk)))
        q, k, v = (x.transpose(1, 2) for x in (qt, kt, vt))
        gt = torch.randn(B, H, Tq, D)
        g = gt.transpose(1, 2)
        leaves = [x.clone().requires_grad_() for x in (qt, kt, vt)]

        def torch_step():
            for x in leaves:
                x.grad = None
            torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal,
                                                             enable_gqa=Hkv != H).backward(gt)

        def wkv_step():
            o, lse = wkv.attention(q, k, v, causal=causal, return_lse=True)
            wkv.attention_backward(q, k, v, o, lse, g, causal=causal)

        t = interleaved_ms({"torch": torch_step, "libwkv": wkv_step}, args.repeats)
        t_torch, t_wkv = t["torch"], t["libwkv"]
        flops = 14.0 * B * H * Tq * Tk * D * (0.5 if causal and Tq == Tk else 1.0)  # 2 + 5 products
        row = {"case": "attention fwd+bwd%s" % (" causal" if causal else ""),
               "shape": ("B=%d H=%d T=%d D=%d" % (B, H, Tq, D) if Hkv == H else
                         "B=%d H=%d/%d T=%d D=%d" % (B, H, Hkv, Tq, D)), "dtype": "f32", "libwkv_ms": t_wkv,
               "config": default, "configs_ms": {default: t_wkv}, "anchor": "torch SDPA + autograd (CPU)",
               "anchor_ms": t_torch, "libwkv_tflops": flops / t_wkv / 1e9}
        rows.append(row)
        print(json.dumps(row), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    try:
        cpu = [ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")][0]
    except (OSError, IndexError):
        cpu = platform.processor()
    doc = {"backend": "attention-cpu", "machine": "%s, %d CPUs; torch %s (%d threads)" % (
               cpu, os.cpu_count(), torch.__version__, torch.get_num_threads()),
           "commit": commit, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "libwkv_command": "python3 benchmarks/attention_bench.py " + " ".join(sys.argv[1:]),
           "anchor": "torch.nn.functional.scaled_dot_product_attention on CPU tensors, same process, alternating",
           "anchor_same_run": True,
           "method": "medians over %d rounds (8 calls a round for decode rows) after one warm-up, torch and every "
                     "libwkv configuration timed in each round in a rotating order; libwkv with its default "
                     "configuration (%s); the CPU context's 2 threads, torch's %d"
                     % (args.repeats, default, torch.get_num_threads()),
           "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
