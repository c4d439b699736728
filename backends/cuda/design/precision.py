"""How the chunked design rounds in the kernels' arithmetic: runs the spec (rwkv7_chunk_bwd.py)
in float32, and in float32 with every matrix product's operands rounded to TF32 (10 mantissa
bits, as mma.sync's TF32 inputs; float32 accumulation in numpy's order, not the tensor cores'),
and prints the relative error of y, sT and each gradient against the float64 reference.
NOTES.md ("Chunked backward: design", precision by engine) quotes its output.

    python3 backends/cuda/design/precision.py        (~10 s; not part of CI)
"""

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[2] / "bindings" / "python" / "tests"))

import reference as ref  # noqa: E402
import rwkv7_chunk_bwd as cb  # noqa: E402


def tf32(x):
    """Round float32 values to TF32 (round to nearest even on the 13 dropped bits)."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0xFFF + ((b >> 13) & 1)) & 0xFFFFE000
    return b.astype(np.uint32).view(np.float32)


class TF32(np.ndarray):
    """A float32 array whose matmul / einsum products take TF32-rounded operands."""

    def __array_ufunc__(self, uf, method, *args, **kw):
        args = [np.asarray(a) for a in args]
        if uf is np.matmul:
            args = [tf32(a) for a in args]
        outs = kw.pop("out", None)
        if outs is not None:  # in-place updates (+=) write through the plain views
            kw["out"] = tuple(np.asarray(o) for o in outs)
        out = getattr(uf, method)(*args, **kw)
        if outs is not None:
            return outs[0] if len(outs) == 1 else outs
        return out.view(TF32) if isinstance(out, np.ndarray) else out

    def __array_function__(self, func, types, args, kw):
        if func is not np.einsum:  # vstack, cumsum, ...: stay TF32 so later products round
            out = super().__array_function__(func, types, args, kw)
            return out.view(TF32) if isinstance(out, np.ndarray) else out
        return np.einsum(args[0], *[tf32(a) for a in args[1:]], **kw).view(TF32)


def main():
    rng = np.random.default_rng(5)
    B, H, N = 1, 1, 64
    for form, T, tiny in [("clampw", 256, False), ("clampw", 1024, False), ("log", 256, True), ("direct", 256, True)]:
        x = ref.random_inputs(rng, B, T, H, N, form, np.float32)
        if tiny:  # 30% of the first half's decays at 1e-6
            d = ref.decay_of(x["w"], form)
            d[:, :T // 2] = np.where(rng.random(d[:, :T // 2].shape) < 0.3, 1e-6, d[:, :T // 2])
            x["w"] = (np.log(d) if form == "log" else d).astype(np.float32)
        s0, dsT = rng.standard_normal((2, B, H, N, N)).astype(np.float32)
        dy = rng.standard_normal((B, T, H, N)).astype(np.float32)
        y0, sT0 = ref.rwkv7_forward(**x, s0=s0, form=form)
        g0 = ref.rwkv7_backward(**x, dy=dy, s0=s0, dsT=dsT, form=form)
        for name, wrap in (("float32", lambda a: a), ("TF32 products", lambda a: a.view(TF32))):
            xs = {n: wrap(a) for n, a in x.items()}
            y, sT, g = cb.rwkv7_chunked(**xs, dy=wrap(dy), s0=wrap(s0), dsT=wrap(dsT), form=form, C=32,
                                        route="log" if form == "clampw" else "exact", dtype=np.float32)
            errs = [("y", ref.rel_err(y, y0)), ("sT", ref.rel_err(sT, sT0))]
            errs += [(n, ref.rel_err(g[n], g0[n])) for n in ("dr", "dw", "dk", "dv", "da", "db", "ds0")]
            print("%-7s T=%-5d %-5s %-14s" % (form, T, "tiny" if tiny else "", name),
                  " ".join("%s %.1e" % e for e in errs))


if __name__ == "__main__":
    main()
