#!/usr/bin/env python3
"""Renders BENCHMARKS.md from the result files in benchmarks/*.json: one table per backend.

    python3 benchmarks/render.py           # rewrites BENCHMARKS.md
    python3 benchmarks/render.py --check   # exits 1 if BENCHMARKS.md is not what the files give

Every number in the table comes from a result file; ratios are computed here, never typed.
CI runs --check (ctest: benchmarks_table), so a hand-edited BENCHMARKS.md fails.

A result file is one run on one machine: backend, machine, commit, date, the commands, whether
the anchor was measured in the same run, and rows. GPU rows: case, shape, dtype, libwkv_us
(the parts of the case, summed), timer, anchor, anchor_us. CPU rows: op, B, T, H, N, dtype,
threads, libwkv_us {forward, backward, forward_saving, backward_reusing, forward_decays_in},
anchor_us {ggml_forward}.
"""
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks"
TARGET = ROOT / "BENCHMARKS.md"
ORDER = ["cuda", "vulkan", "cpu", "attention-cuda", "attention-cpu", "model-cuda", "model-cpu", "python-cuda",
         "python-cpu", "context-parallel-cuda", "context-parallel-cpu"]
TITLES = {"cuda": "CUDA plugin", "vulkan": "Vulkan plugin", "cpu": "CPU backend",
          "model-cuda": "RWKV-7 model (wkv.model), CUDA", "model-cpu": "RWKV-7 model (wkv.model), CPU",
          "python-cuda": "Python call overhead, CUDA tensors", "python-cpu": "Python call overhead, CPU",
          "attention-cuda": "Attention (wkv_attention), CUDA", "attention-cpu": "Attention (wkv_attention), CPU",
          "context-parallel-cpu": "Context parallelism on one device (wkv.torch.rwkv7_segmented), CPU",
          "context-parallel-cuda": "Context parallelism on one device (wkv.torch.rwkv7_segmented), CUDA"}


def us(x):
    """A time in microseconds, printed with the unit that reads best."""
    if x is None:
        return "—"
    if x >= 1e6:
        return "%.3g s" % (x / 1e6)
    if x >= 1000:
        return "%.3g ms" % (x / 1000)
    return "%.4g µs" % x


def ratio(anchor, ours):
    """How many times faster libwkv is (below 1: slower), from the two medians."""
    if anchor is None or ours is None:
        return "—"
    r = anchor / ours
    return "**%.2f× faster**" % r if r >= 1 else "%.2f× slower" % (1 / r)


def header(doc):
    same = "measured in the same run" if doc["anchor_same_run"] else "NOT measured in this run"
    lines = [
        "Machine: %s. libwkv at %s, %s. Anchors: %s." % (doc["machine"], doc["commit"], doc["date"], same),
        "",
        "- libwkv: `%s`" % doc["libwkv_command"],
    ]
    if "anchor" in doc:
        lines.append("- anchor: %s" % doc["anchor"])
    if "method" in doc:
        lines.append("- method: %s" % doc["method"])
    if "timers" in doc:
        for name, what in doc["timers"].items():
            lines.append("- timer `%s`: %s" % (name, what))
    if "same_run_checks" in doc:
        lines.append("- correctness in the same run: %s" % doc["same_run_checks"])
    if "note" in doc:
        lines.append("- note: %s" % doc["note"])
    if "source" in doc:
        lines.append("- source: %s" % doc["source"])
    return lines


def gpu_table(doc):
    out = ["| case | shape | dtype | libwkv median | timer | anchor | anchor median | libwkv vs anchor |",
           "|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        parts = r["libwkv_us"]
        total = sum(parts.values())
        cell = us(total)
        if len(parts) > 1:
            cell = " + ".join(us(v) for v in parts.values()) + " = **%s**" % us(total)
        out.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["case"], r["shape"], r["dtype"], cell, r["timer"], r["anchor"] or "—",
            us(r["anchor_us"]), ratio(r["anchor_us"], total)))
    return out


def cpu_table(doc):
    out = ["| op | B×T | dtype | threads | forward | backward | fwd saving | bwd reusing | bwd reusing ÷ fwd "
           "| ggml fwd | libwkv fwd vs ggml | fwd, decays in | that vs ggml |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        t, a = r["libwkv_us"], r["anchor_us"]
        bf = "%.2f×" % (t["backward_reusing"] / t["forward"])
        out.append("| %s | %d×%d | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["op"], r["B"], r["T"], r["dtype"], r["threads"], us(t["forward"]), us(t["backward"]),
            us(t["forward_saving"]), us(t["backward_reusing"]), bf, us(a["ggml_forward"]),
            ratio(a["ggml_forward"], t["forward"]), us(t["forward_decays_in"]),
            ratio(a["ggml_forward"], t["forward_decays_in"])))
    return out


def model_table(doc):
    """wkv.model's tokens/s beside the rwkv package's (higher is better)."""
    out = ["| model shape | dtype | prefill | libwkv tok/s | anchor tok/s | libwkv vs anchor | decode tok/s "
           "| anchor decode tok/s | libwkv vs anchor | op share prefill / decode |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        out.append("| %s (%d layers, C=%d) | %s | %d tokens | %.1f | %.1f | %s | %.1f | %.1f | %s | %.0f%% / %.0f%% |" % (
            r["size"], r["n_layer"], r["n_embd"], r["dtype"], r["prefill_tokens"], r["libwkv_prefill_tok_s"],
            r["anchor_prefill_tok_s"], ratio(1 / r["anchor_prefill_tok_s"], 1 / r["libwkv_prefill_tok_s"]),
            r["libwkv_decode_tok_s"], r["anchor_decode_tok_s"],
            ratio(1 / r["anchor_decode_tok_s"], 1 / r["libwkv_decode_tok_s"]),
            100 * r["op_share_prefill"], 100 * r["op_share_decode"]))
        if "c_example_prefill_tok_s" in r:
            c_pre, c_dec = r["c_example_prefill_tok_s"], r["c_example_decode_tok_s"]
            out.append("| %s, C example (examples/rwkv7_model) | %s | %d tokens | %.1f | %.1f | %s | %.1f | %.1f | %s | — |" % (
                r["size"], r["dtype"], r["prefill_tokens"], c_pre, r["anchor_prefill_tok_s"],
                ratio(1 / r["anchor_prefill_tok_s"], 1 / c_pre), c_dec, r["anchor_decode_tok_s"],
                ratio(1 / r["anchor_decode_tok_s"], 1 / c_dec)))
    return out


def attention_table(doc):
    out = ["| case | shape | dtype | libwkv median (config) | TFLOP/s | anchor | anchor median | libwkv vs anchor "
           "| every config |", "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        every = ", ".join("%s %s" % (n.replace("cpu.tiled.", ""), us(t * 1000)) for n, t in r["configs_ms"].items())
        out.append("| %s | %s | %s | %s (%s) | %.3f | %s | %s | %s | %s |" % (
            r["case"], r["shape"], r["dtype"], us(r["libwkv_ms"] * 1000), r["config"], r["libwkv_tflops"],
            r["anchor"], us(r["anchor_ms"] * 1000), ratio(r["anchor_ms"], r["libwkv_ms"]), every))
    return out


def python_table(doc):
    """A wkv call from Python against the same C call: the difference is the package's cost."""
    out = ["| case | shape | Python call | the C call alone | Python overhead |", "|---|---|---|---|---|"]
    for r in doc["rows"]:
        out.append("| %s | %s | %s | %s | **%s** |" % (r["case"], r["shape"], us(r["python_us"]), us(r["c_us"]),
                                                      us(r["python_us"] - r["c_us"])))
    return out


def context_parallel_table(doc):
    """A sequence in P segments on one device against the one call: the work the split adds."""
    out = ["| case | shape | dtype | P segments, one device | one call | one call vs split |", "|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        out.append("| %s | %s | %s | %s | %s | %s |" % (r["case"], r["shape"], r["dtype"], us(r["libwkv_ms"] * 1000),
                                                       us(r["anchor_ms"] * 1000), ratio(r["anchor_ms"], r["libwkv_ms"])))
    return out


def render():
    docs = {}
    for path in sorted(RESULTS.glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        doc["_file"] = path.relative_to(ROOT).as_posix()
        docs.setdefault(doc["backend"], []).append(doc)
    out = [
        "# Benchmarks",
        "",
        "<!-- Rendered by benchmarks/render.py from benchmarks/*.json; edit those, not this file. -->",
        "",
        "One table per backend, from the result files of the run it shows (each section names its",
        "file). \"vs anchor\" is the ratio of the two medians: above 1× libwkv is faster. A ratio is",
        "a measurement only where the anchor was measured in the same run on the same machine; the",
        "sections say which. Older runs are in git history.",
    ]
    for backend in ORDER + sorted(set(docs) - set(ORDER)):
        for doc in docs.get(backend, []):
            out += ["", "## %s — %s" % (TITLES.get(backend, backend), doc["_file"]), ""]
            out += header(doc)
            out.append("")
            table = {"cpu": cpu_table, "model-cpu": model_table, "model-cuda": model_table,
                     "python-cpu": python_table, "python-cuda": python_table,
                     "attention-cpu": attention_table, "attention-cuda": attention_table,
                     "context-parallel-cpu": context_parallel_table,
                     "context-parallel-cuda": context_parallel_table}.get(backend, gpu_table)
            out += table(doc)
    out += [
        "",
        "## How to reproduce",
        "",
        "- CPU: `build/tools/wkv-bench/wkv-bench perf --backend cpu --op all --H 32 --N 64 --dtype f32,bf16"
        " --threads 1,2 --reuse --json` (and `--op rwkv7 --pass forward --decay direct`); the anchor is"
        " ggml's `ggml_rwkv_wkv7` / `ggml_rwkv_wkv6`, built outside this repository, timed on the same"
        " shapes in alternating rounds.",
        "- GPU: `scripts/device.sh` on the GPU machine builds, tests and runs `wkv-bench perf --backend"
        " cuda|vulkan` and `wkv-cuda-bench`.",
        "- Model: `WKV_LIBRARY=build/libwkv.so PYTHONPATH=bindings/python/src python3"
        " benchmarks/model_bench.py --sizes 0.1b --device cpu --out benchmarks/model-cpu-zen4.json`"
        " (needs torch and the rwkv package, the anchor, in the same process).",
        "- Attention: `WKV_LIBRARY=build/libwkv.so PYTHONPATH=bindings/python/src python3"
        " benchmarks/attention_bench.py --out benchmarks/attention-cpu-zen4.json` (torch SDPA in the same process).",
        "- Python overhead: `WKV_LIBRARY=build/libwkv.so PYTHONPATH=bindings/python/src python3"
        " benchmarks/python_overhead.py --out benchmarks/python-cpu-zen4.json`.",
        "- Context parallelism: `WKV_LIBRARY=build/libwkv.so PYTHONPATH=bindings/python/src python3"
        " benchmarks/context_parallel_bench.py --out benchmarks/context-parallel-cpu-zen4.json`.",
        "- A new run: put its figures in a `benchmarks/<backend>-<machine>.json` (the fields above),"
        " delete the file it replaces, and run `python3 benchmarks/render.py`.",
        "",
    ]
    return "\n".join(out)


def main():
    text = render()
    if sys.argv[1:] == ["--check"]:
        current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
        if current != text:
            sys.stderr.write("BENCHMARKS.md differs from what benchmarks/*.json render to: "
                             "run python3 benchmarks/render.py (and edit the JSON, not the table)\n")
            return 1
        print("BENCHMARKS.md matches benchmarks/*.json")
        return 0
    if sys.argv[1:]:
        sys.stderr.write(__doc__)
        return 2
    TARGET.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
