"""``python -m wkv``: ``info`` and ``golden``, mirroring ``wkv-bench``.

    python -m wkv info [--json]             library, build, backends, devices, support
    python -m wkv golden [options] [FILE...]  golden files through the Python API

Exit status: 0 on success (golden: every file passed), 1 on failure, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional


def _gib(n: int) -> str:
    if not n:
        return ""
    g = n / 1024.0 ** 3
    return ", %.1f GiB" % g if g >= 1 else ", %.0f MiB" % (n / 1024.0 ** 2)


def _attention_config_names(backend: str) -> List[str]:
    import wkv

    try:
        with wkv.Context(backend) as ctx:
            return [c["name"] for c in wkv.attention_configs(ctx)]
    except (wkv.WkvError, OSError):
        return []


def info_json(d: dict) -> dict:
    """wkv.info() in the schema of ``wkv-bench info --json`` (one JSON object, the same keys)."""
    backends = []
    for name in ("cpu", "cuda", "vulkan"):
        b = d["backends"][name]
        backends.append({
            "backend": name, "available": bool(b["available"]), "reason": b["reason"] or "",
            "devices": [{"device": dev["name"], "memory_bytes": dev["memory_bytes"],
                         "compute_units": dev["compute_units"]} for dev in b["devices"]],
            "ops": b["ops"], "dtypes": b["dtypes"], "decay_forms": b["decay_forms"], "head_sizes": b["head_sizes"],
            "attention_configs": _attention_config_names(name) if b["available"] else [],
        })
    return {"kind": "info", "libwkv": d["version"], "version_code": d["version_code"], "build": d["build"],
            "backends": backends, "auto": d.get("auto") or None, "golden_dir": str(_golden_dir())}


def _golden_dir():
    from . import golden

    return golden.golden_dir()


def cmd_info(args: argparse.Namespace) -> int:
    """Prints what ``wkv.info()`` returns, in wkv-bench's layout."""
    import wkv

    try:
        d = wkv.info()
    except OSError as e:
        print("libwkv could not be loaded: %s" % e, file=sys.stderr)
        return 1
    if getattr(args, "json", False):
        print(json.dumps(info_json(d)))
        return 0
    code = d["version_code"]
    print("libwkv %s (library %d.%d.%d), Python package wkv %s" % (
        d["version"], code // 10000, code // 100 % 100, code % 100, d["package_version"]))
    print("library: %s" % d["library"])
    print("build: %s" % d["build"])
    print("backends:")
    for name, b in d["backends"].items():
        if not b["available"]:
            print("  %-7s unavailable: %s" % (name, b["reason"] or "(no reason given)"))
            continue
        n = b["device_count"]
        print("  %-7s available (%s), %d device%s" % (name, b["reason"], n, "" if n == 1 else "s"))
        for i, dev in enumerate(b["devices"]):
            cu = ", %d compute units" % dev["compute_units"] if dev["compute_units"] > 0 else ""
            print("      device %d: %s%s%s" % (i, dev["name"] or "(unnamed)", _gib(dev["memory_bytes"]), cu))
        print("      ops: %s" % (" ".join(b["ops"]) or "(none)"))
        print("      dtypes: %s" % (" ".join(b["dtypes"]) or "(none)"))
        print("      decay forms: %s" % (" ".join(b["decay_forms"]) or "(none)"))
        hs = b["head_sizes"]
        print("      head sizes: %s" % (hs if isinstance(hs, str) else " ".join(map(str, hs)) or "(none)"))
    if d.get("auto"):
        print("auto: a context with backend AUTO runs on %s" % d["auto"])
    else:
        print("auto: no context could be created: %s" % d.get("auto_error", ""))
    print("golden files: %s" % _golden_dir())
    extras = []
    for mod in ("numpy", "ml_dtypes", "torch"):
        try:
            m = __import__(mod)
            extras.append("%s %s" % (mod, getattr(m, "__version__", "?")))
        except ImportError:
            extras.append("%s (not installed)" % mod)
    print("python %s: %s" % (sys.version.split()[0], ", ".join(extras)))
    return 0


def cmd_golden(args: argparse.Namespace) -> int:
    """Runs golden files and prints one PASS/FAIL line per file, then a count."""
    import wkv
    from wkv import golden

    files = [golden.Path(f) for f in args.files] if args.files else golden.golden_files()
    if not files:
        print("wkv golden: no *.safetensors files in %s" % golden.golden_dir(), file=sys.stderr)
        return 1
    try:
        ctx = wkv.Context(args.backend, device=args.device, threads=args.threads)
    except wkv.WkvError as e:
        print("wkv golden: cannot create a %s context: %s" % (args.backend, e), file=sys.stderr)
        return 1
    width = max(len(f.name) for f in files)
    passed = 0
    with ctx:
        for f in files:
            r = golden.run_file(f, context=ctx, key_major=args.key_major)
            passed += r.status == "PASS"
            if args.json:  # the schema of wkv-bench golden --json
                finite = lambda x: x if x == x and x - x == 0 else None  # noqa: E731
                print(json.dumps({
                    "kind": "golden", "file": f.name, "op": f.name.split("_")[0], "backend": ctx.backend,
                    "device": "", "dtype": "f32", "status": r.status.lower(),
                    "max_rel_err": finite(r.max_rel_err), "worst": r.worst,
                    "message": r.message,
                    "tensors": [{"name": n, "err": finite(e), "tol": golden.TOL_F32, "pass": e <= golden.TOL_F32}
                                for n, e in r.errors.items()]}), flush=True)
                continue
            print(golden.format_result(r, width), flush=True)
            if args.verbose:
                for name, err in r.errors.items():
                    flag = "" if err <= golden.TOL_F32 else "  FAIL"
                    print("%*s    %-8s %.3e  (tol %.0e)%s" % (width, "", name, err, golden.TOL_F32, flag))
    if args.json:
        print(json.dumps({"kind": "golden_summary", "passed": passed, "total": len(files)}))
    else:
        print("%d of %d passed" % (passed, len(files)))
    return 0 if passed == len(files) else 1


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m wkv", description="libwkv from Python: info and golden checks.")
    sub = p.add_subparsers(dest="cmd")
    sp = sub.add_parser("info", help="library, build, backends, devices and what they support")
    sp.add_argument("--json", action="store_true", help="one JSON object, the schema of wkv-bench info --json")
    sp.set_defaults(func=cmd_info)
    sp = sub.add_parser("golden", help="run golden files through the Python API (float32, limit 1e-4)",
                        description="Runs each golden file's case through wkv.rwkv7/6/4 and their backward "
                                    "(state in and out, dy, d state_out, d state_in; outputs poisoned with "
                                    "NaN first) and compares every output with the file's float64 tensors by "
                                    "||out - ref|| / ||ref|| (limit 1e-4). Prints PASS or FAIL per file.")
    sp.add_argument("files", nargs="*", metavar="FILE",
                    help="golden files (default: every *.safetensors in $WKV_GOLDEN_DIR, else <repo>/tests/golden)")
    sp.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda", "vulkan"])
    sp.add_argument("--device", type=int, default=0, help="GPU ordinal")
    sp.add_argument("--threads", type=int, default=0, help="CPU threads (default: the library's)")
    sp.add_argument("--key-major", action="store_true", help="pass the states key-major")
    sp.add_argument("--verbose", "-v", action="store_true", help="also print every tensor's error")
    sp.add_argument("--json", action="store_true", help="one JSON object per file (wkv-bench golden --json's schema)")
    sp.set_defaults(func=cmd_golden)
    args = p.parse_args(argv)
    if not getattr(args, "func", None):
        p.print_help()
        return 2
    return int(args.func(args))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `python -m wkv info | head`
        sys.exit(0)
