"""The golden files (``tests/golden/*.safetensors``) through the Python API.

Each file holds one case — inputs in float32, the float64 outputs and gradients of a
third-party reference (see the golden README). :func:`run_file` reads it with numpy only,
runs the forward (state in and out) and the backward (``dy``, ``dsT``, ``ds0``) with every
output poisoned with NaN first, and compares each output with the file by the norm-wise
relative error ``||out - ref|| / ||ref||`` (limit 1e-4 for float32, as ``wkv-bench golden``).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

TOL_F32 = 1e-4

#: safetensors dtype -> numpy dtype (BF16 as its uint16 bit patterns)
_SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
                       "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


def read_safetensors(path: "os.PathLike[str] | str") -> Tuple[Dict[str, str], Dict[str, Tuple[str, Any]]]:
    """(metadata, {name: (safetensors dtype, numpy array)}) of a safetensors file, every part
    checked (header length, JSON, each entry's dtype, shape and data range) with a ValueError
    naming the file and the key; numpy only. The arrays share one writable buffer of the file's
    bytes (BF16 tensors come back as their uint16 bit patterns)."""
    import numpy as np

    path = os.fspath(path)
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    size = len(raw)
    if size < 8:
        raise ValueError("%s: truncated safetensors file (%d bytes, no header length)" % (path, size))
    (n,) = struct.unpack("<Q", raw[:8])
    if n > size - 8:
        raise ValueError("%s: truncated safetensors file: the header says %d bytes, the file has %d after the "
                         "length" % (path, n, size - 8))
    try:
        header = json.loads(bytes(raw[8:8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError("%s: the safetensors header is not valid JSON (%s)" % (path, e)) from None
    if not isinstance(header, dict):
        raise ValueError("%s: the safetensors header is not a JSON object" % path)
    meta = header.pop("__metadata__", {}) or {}
    base, data_len = 8 + n, size - 8 - n
    out = {}
    for name, entry in header.items():
        try:
            st_dtype = entry["dtype"]
            dt = np.dtype(_SAFETENSORS_DTYPES[st_dtype])
            shape = [int(d) for d in entry["shape"]]
            begin, end = (int(o) for o in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError("%s: key %r: bad safetensors entry %r (dtype %s)" % (
                path, name, entry, "unknown" if not isinstance(entry, dict) else entry.get("dtype"))) from None
        count = 1
        for d in shape:
            count *= d
        if any(d < 0 for d in shape) or begin < 0 or end - begin != count * dt.itemsize:
            raise ValueError("%s: key %r: data_offsets [%d, %d) do not hold shape %s of %s" % (
                path, name, begin, end, shape, st_dtype))
        if end > data_len:
            raise ValueError("%s: key %r: truncated file (its data ends at byte %d of %d)" % (path, name, end, data_len))
        arr = np.frombuffer(raw, dtype=dt, count=count, offset=base + begin)
        if count and arr.ctypes.data % dt.itemsize:  # keep every array aligned for the library
            arr = arr.copy()
        out[name] = (st_dtype, arr.reshape(shape))
    return meta, out


def load_safetensors(path: "os.PathLike[str] | str") -> Tuple[Dict[str, str], Dict[str, Any]]:
    """(metadata, {name: numpy array}) of a safetensors file, read with numpy alone
    (:func:`read_safetensors`)."""
    meta, tensors = read_safetensors(path)
    return meta, {name: arr for name, (_, arr) in tensors.items()}


def rel_err(out: Any, ref: Any) -> float:
    """Norm-wise relative error in float64; inf when out has a NaN or Inf."""
    import numpy as np

    o = np.asarray(out, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if o.shape != r.shape:
        return float("inf")
    if not np.all(np.isfinite(o)):
        return float("inf")
    den = float(np.linalg.norm(r.ravel()))
    num = float(np.linalg.norm((o - r).ravel()))
    return num / den if den > 0 else num


class GoldenResult(NamedTuple):
    """One file's verdict: ``status`` is "PASS", "FAIL", "UNSUPPORTED" or "ERROR"."""

    file: str
    status: str
    max_rel_err: float
    worst: str
    errors: Dict[str, float]
    message: str
    backend: str


def golden_dir() -> Path:
    """``$WKV_GOLDEN_DIR``, else ``<repo>/tests/golden``, else ``./tests/golden``."""
    env = os.environ.get("WKV_GOLDEN_DIR")
    if env:
        return Path(env)
    from ._lib import repo_root

    root = repo_root()
    if root is not None:
        return root / "tests" / "golden"
    return Path("tests") / "golden"


def golden_files(folder: Optional[Path] = None) -> List[Path]:
    folder = golden_dir() if folder is None else Path(folder)
    return sorted(folder.glob("*.safetensors"))


def _state4(t: Dict[str, Any], prefix: str, interleaved: bool):
    import numpy as np

    parts = [t[prefix + "_aa"], t[prefix + "_bb"], t[prefix + "_pp"]]
    return np.ascontiguousarray(np.stack(parts, axis=2 if interleaved else 1))


def run_file(path: "os.PathLike[str] | str", context: Any = None, key_major: bool = False) -> GoldenResult:
    """Runs one golden file's case (float32) through the API and checks every output."""
    import numpy as np

    from . import ops
    from .errors import UnsupportedError, WkvError

    name = Path(path).name
    if context is None:
        from .context import current_context, default_context

        context = current_context() or default_context()
    backend = context.backend
    try:
        meta, t = load_safetensors(path)
    except (OSError, ValueError, KeyError) as e:
        return GoldenResult(name, "ERROR", float("nan"), "", {}, "cannot read: %s" % e, backend)
    op = meta.get("op", "")
    form = meta.get("decay_form", "")
    refs: Dict[str, Any] = {}
    got: Dict[str, Any] = {}
    if context.backend == "cuda":  # the files are host arrays: the harness moves them explicitly
        try:
            import torch
        except ImportError:
            return GoldenResult(name, "ERROR", float("nan"), "", {}, "a CUDA context needs PyTorch to hold the "
                                "tensors (pip install torch, or --backend cpu)", backend)

        def dev(x: Any) -> Any:
            return torch.from_numpy(np.array(x)).to("cuda:%d" % context.device)

        def host(x: Any) -> Any:
            return x.cpu().numpy()
    else:
        def dev(x: Any) -> Any:
            return x

        def host(x: Any) -> Any:
            return x
    try:
        if op in ("wkv7", "wkv6"):
            spec = ops.SPECS["rwkv7" if op == "wkv7" else "rwkv6"]
            inputs = {n: dev(t[n]) for n in spec.inputs}
            layout = "kv" if key_major else "vk"
            tr = (lambda s: np.ascontiguousarray(np.swapaxes(s, -1, -2))) if key_major else (lambda s: s)
            s0 = dev(np.array(tr(t["s0"]), dtype=np.float32))
            y, sT = ops.forward(spec, "wkv.golden", inputs, s0, decay=form, state_layout=layout, context=context,
                                poison=True)
            g = ops.backward(spec, "wkv.golden", inputs, dev(t["dy"]), s0, dev(np.array(tr(t["dsT"]), np.float32)),
                             decay=form, state_layout=layout, context=context, poison=True)
            g = type(g)(*(host(x) for x in g))
            got.update(y=host(y), sT=tr(host(sT)))
            refs.update(y=t["y"], sT=t["sT"])
            for n in spec.inputs:
                got["d" + n] = getattr(g, "d" + n)
                refs["d" + n] = t["d" + n]
            got["ds0"] = tr(g.dstate0)
            refs["ds0"] = t["ds0"]
        elif op == "wkv4":
            spec = ops.SPECS["rwkv4"]
            inputs = {n: dev(t[n]) for n in spec.inputs}
            s0 = dev(_state4(t, "s0", False))
            y, sT = ops.forward(spec, "wkv.golden", inputs, s0, decay="exp_neg_exp", context=context, poison=True)
            g = ops.backward(spec, "wkv.golden", inputs, dev(t["dy"]), s0, dev(_state4(t, "dsT", False)),
                             decay="exp_neg_exp", context=context, poison=True)
            g = type(g)(*(host(x) for x in g))
            y, sT = host(y), host(sT)
            got["y"], refs["y"] = y, t["y"]
            for i, part in enumerate(("aa", "bb", "pp")):
                got["sT_" + part], refs["sT_" + part] = sT[:, i], t["sT_" + part]
                got["ds0_" + part], refs["ds0_" + part] = g.dstate0[:, i], t["ds0_" + part]
            for n in spec.inputs:
                got["d" + n], refs["d" + n] = getattr(g, "d" + n), t["d" + n]
        else:
            return GoldenResult(name, "ERROR", float("nan"), "", {}, "unknown op %r in the metadata" % op, backend)
    except UnsupportedError as e:
        return GoldenResult(name, "UNSUPPORTED", float("nan"), "", {}, "unsupported: %s" % e.message, backend)
    except WkvError as e:
        return GoldenResult(name, "FAIL", float("nan"), "", {}, "%s: %s" % (e.status_name, e.message), backend)
    except KeyError as e:
        return GoldenResult(name, "ERROR", float("nan"), "", {}, "missing tensor %s" % e, backend)
    errors = {n: rel_err(got[n], refs[n]) for n in refs}
    worst = max(errors, key=lambda n: errors[n])
    worst_err = errors[worst]
    failing = [n for n, e in errors.items() if not (e <= TOL_F32)]
    if failing:
        return GoldenResult(name, "FAIL", worst_err, worst, errors,
                            "over %.0e: %s" % (TOL_F32, ", ".join(failing)), backend)
    return GoldenResult(name, "PASS", worst_err, worst, errors, "", backend)


def format_result(r: GoldenResult, width: int = 0) -> str:
    """One line as ``wkv-bench golden`` prints it."""
    label = "%s f32" % r.backend
    if r.status == "PASS":
        line = "PASS  max_rel_err=%.1e (%s)  %s" % (r.max_rel_err, r.worst, label)
    elif r.status == "FAIL" and r.errors:
        line = "FAIL  max_rel_err=%.1e (%s)  %s  %s" % (r.max_rel_err, r.worst, label, r.message)
    elif r.status == "FAIL":
        line = "FAIL  %s  %s" % (r.message, label)
    elif r.status == "UNSUPPORTED":
        line = "FAIL %s  %s" % (r.message, label)
    else:
        line = "FAIL error: %s  %s" % (r.message, label)
    return "%-*s  %s" % (width, r.file, line)
