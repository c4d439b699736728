"""The benchmark scripts (benchmarks/*.py) run on tiny shapes and write result files that
benchmarks/render.py turns into its tables: a script whose fields drift from the renderer's, or
that no longer runs, fails here rather than on the next measuring day."""

from __future__ import annotations

import importlib
import json
import sys

import pytest

from conftest import REPO

from test_examples import run

torch = pytest.importorskip("torch", reason="torch is not installed")

sys.path.insert(0, str(REPO / "benchmarks"))
render = importlib.import_module("render")


def rendered(doc, table):
    """The section render.py writes for a result file: its header and one table line per row."""
    lines = render.header(doc) + table(doc)
    assert len(table(doc)) == 2 + len(doc["rows"])
    return "\n".join(lines)


def run_in_process(monkeypatch, name, out, cases):
    """benchmarks/<name>.py's main() with its module-level case lists replaced by `cases`."""
    mod = importlib.import_module(name)
    for attr, value in cases.items():
        monkeypatch.setattr(mod, attr, value)
    monkeypatch.setattr(sys, "argv", [name, "--repeats", "1", "--out", str(out)])
    assert mod.main() == 0
    return json.loads(out.read_text())


def test_attention_bench(monkeypatch, tmp_path):
    doc = run_in_process(monkeypatch, "attention_bench", tmp_path / "a.json", {
        "CASES": [(1, 2, 40, 40, 2, 16, True), (1, 4, 1, 70, 2, 16, False)], "BF16_CASES": [(1, 2, 300, 300, 2, 16, False)],
        "F16_CASES": [(1, 4, 1, 50, 2, 16, False)], "TRAIN_CASES": [(1, 4, 33, 33, 2, 16, True)]})
    assert [r["case"] for r in doc["rows"]] == ["attention fwd causal", "attention decode", "attention fwd",
                                               "attention decode", "attention fwd+bwd causal"]
    assert [r["dtype"] for r in doc["rows"]] == ["f32", "f32", "bf16", "f16", "f32"]
    for r in doc["rows"]:
        assert r["libwkv_ms"] > 0 and r["anchor_ms"] > 0 and r["config"] in r["configs_ms"]
    text = rendered(doc, render.attention_table)
    assert "B=1 H=4/2 T=33 D=16" in text  # the grouped-query training row names its kv heads


def test_context_parallel_bench(monkeypatch, tmp_path):
    doc = run_in_process(monkeypatch, "context_parallel_bench", tmp_path / "c.json", {
        "CASES": [("forward", 64, torch.float32, (2,)), ("forward + backward", 64, torch.bfloat16, (4,))],
        "H": 2, "N": 16})
    assert [(r["segments"], r["dtype"]) for r in doc["rows"]] == [(2, "f32"), (4, "bf16")]
    assert all(r["libwkv_ms"] > 0 and r["anchor_ms"] > 0 for r in doc["rows"])
    assert "4 segments on one device" in rendered(doc, render.context_parallel_table)


def test_python_overhead(tmp_path):
    out = tmp_path / "p.json"
    run("benchmarks/python_overhead.py", "--calls", "20", "--rounds", "1", "--out", str(out))
    doc = json.loads(out.read_text())
    assert doc["rows"] and all(r["python_us"] > 0 and r["c_us"] > 0 for r in doc["rows"])
    rendered(doc, render.python_table)


def test_model_bench(tmp_path):
    pytest.importorskip("rwkv", reason="the rwkv package (the anchor) is not installed")
    out = tmp_path / "m.json"
    run("benchmarks/model_bench.py", "--sizes", "tiny", "--prefill", "8", "--decode", "2", "--repeats", "1",
        "--out", str(out))
    doc = json.loads(out.read_text())
    assert [r["size"] for r in doc["rows"]] == ["tiny"]
    rendered(doc, render.model_table)
