#!/usr/bin/env python3
"""One long RWKV-7 sequence split over processes (context parallelism), checked against one
process running the whole sequence.

    torchrun --nproc-per-node 2 examples/python/context_parallel.py            # CPU, gloo
    torchrun --nproc-per-node 8 examples/python/context_parallel.py --device cuda --T 1048576 --bf16
    python examples/python/context_parallel.py --spawn 2                        # without torchrun

Each rank draws the same inputs (a fixed seed), keeps its segment, runs
wkv.torch.context_parallel_rwkv7 forward and backward, and rank 0 compares the gathered outputs,
final state and gradients with wkv.torch.rwkv7 of the whole sequence, then prints the time per
step (forward + backward, medians) of both.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import wkv.torch as wt


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def run(rank: int, world: int, args: argparse.Namespace) -> None:
    device = torch.device(args.device, rank % max(torch.cuda.device_count(), 1)) if args.device == "cuda" else \
        torch.device("cpu")
    if args.device == "cuda":
        torch.cuda.set_device(device)
    g = torch.Generator().manual_seed(0)
    dt = torch.bfloat16 if args.bf16 else torch.float32
    T, H, N = args.T, args.H, args.N
    full = {n: torch.randn(1, T, H, N, generator=g) * 0.5 for n in "rkvab"}
    full["w"] = torch.randn(1, T, H, N, generator=g) - 1.0
    kk = torch.nn.functional.normalize(full["k"], dim=-1)  # a stable in-context rule: a = -kk, b = kk * 0.5
    full["a"], full["b"] = -kk, kk * 0.5
    full = {n: full[n].to(device, dt) for n in "rwkvab"}
    bounds = [T * i // world for i in range(world + 1)]
    mine = {n: t[:, bounds[rank]:bounds[rank + 1]].detach().clone().requires_grad_() for n, t in full.items()}
    dy = torch.randn(1, T, H, N, generator=g).to(device, dt)

    def step():
        for t in mine.values():
            t.grad = None
        y, s = wt.context_parallel_rwkv7(*mine.values())
        (y.float() * dy[:, bounds[rank]:bounds[rank + 1]].float()).sum().backward()
        return y, s

    times = []
    for _ in range(args.repeats):
        dist.barrier()
        t0 = time.perf_counter()
        y, s = step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        times.append(time.perf_counter() - t0)

    def from_every_rank(t: torch.Tensor):
        """Each rank's segment of t, on every rank (segments may differ in length)."""
        out = []
        for q in range(world):
            buf = t.detach().clone() if q == rank else \
                torch.empty((1, bounds[q + 1] - bounds[q], H, N), device=device, dtype=t.dtype)
            dist.broadcast(buf, q)
            out.append(buf)
        return out

    gathered = from_every_rank(y)
    grads = {n: from_every_rank(t.grad) for n, t in mine.items()}
    s_last = s.detach().clone()
    dist.broadcast(s_last, world - 1)
    if rank == 0:
        check(args, full, dy, gathered, grads, s_last, times, world)
    # Every rank leaves together: a rank that tears its gloo connections down while rank 0 still
    # computes the reference can abort in gloo's destructor.
    dist.barrier()


def check(args, full, dy, gathered, grads, s_last, times, world) -> None:
    """Rank 0: the whole sequence in one process, compared with the gathered segments."""
    T, H, N = args.T, args.H, args.N
    ref = {n: t.detach().clone().requires_grad_() for n, t in full.items()}
    one = []
    for _ in range(args.repeats):
        for t in ref.values():
            t.grad = None
        t0 = time.perf_counter()
        y_ref, s_ref = wt.rwkv7(*ref.values())
        (y_ref.float() * dy.float()).sum().backward()
        if args.device == "cuda":
            torch.cuda.synchronize()
        one.append(time.perf_counter() - t0)
    tol = 2e-2 if args.bf16 else 1e-4
    errs = {"y": rel(torch.cat(gathered, 1), y_ref.detach()), "final state": rel(s_last, s_ref.detach())}
    errs.update({"d" + n: rel(torch.cat(grads[n], 1), ref[n].grad) for n in ref})
    worst = max(errs.values())
    print("context parallel over %d ranks, T = %d H = %d N = %d %s on %s: worst rel err %.2e (%s)" % (
        world, T, H, N, "bf16" if args.bf16 else "f32", args.device, worst,
        ", ".join("%s %.1e" % kv for kv in errs.items())))
    t1, tn = statistics.median(one), statistics.median(times)
    print("step (fwd+bwd): %d ranks %.1f ms, one process %.1f ms: efficiency t1 / (n tn) = %.2f" % (
        world, tn * 1e3, t1 * 1e3, t1 / (world * tn)))
    print("PASS" if worst <= tol else "FAIL (tolerance %.0e)" % tol)


def worker(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)
    run(rank, world, args)
    # A spawned worker ends here: skip the interpreter's and gloo's teardown (which can abort on
    # a peer's closed socket) once the output is out; an exception above still reports normally.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", type=int, default=512)
    ap.add_argument("--H", type=int, default=2)
    ap.add_argument("--N", type=int, default=32)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--spawn", type=int, default=0, help="run this many processes here (gloo) instead of torchrun")
    args = ap.parse_args()
    if args.spawn:
        import socket

        import torch.multiprocessing as mp

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(worker, args=(args.spawn, port, args), nprocs=args.spawn, join=True)
        return
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    try:
        run(dist.get_rank(), dist.get_world_size(), args)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
