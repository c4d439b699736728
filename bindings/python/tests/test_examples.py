"""The Python examples run and reach what they claim (examples/python), and the fuzzers' seed
corpus is what tests/fuzz/make_corpus.py writes: every Python file in the tree is run here or by
another test."""

from __future__ import annotations

import filecmp
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, SRC


def run(script, *args):
    env = dict(os.environ, PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, str(REPO / script), *args], capture_output=True, text=True,
                       env=env, timeout=600)
    assert p.returncode == 0, "%s failed:\n%s\n%s" % (script, p.stdout, p.stderr)
    return p.stdout


def test_rnn_numpy_decodes_like_one_call():
    out = run("examples/python/rnn_numpy.py")
    err = float(re.search(r"max relative difference ([0-9.e+-]+)", out).group(1))
    assert err < 1e-5, out


def test_train_torch_learns():
    pytest.importorskip("torch", reason="torch is not installed")
    out = run("examples/python/train_torch.py")
    first, last = map(float, re.search(r"loss ([0-9.]+) -> ([0-9.]+) in", out).groups())
    assert last < 0.1 * first, out


def test_fuzz_corpus_is_what_make_corpus_writes(tmp_path):
    run("tests/fuzz/make_corpus.py", str(tmp_path))
    committed = REPO / "tests" / "fuzz" / "corpus"
    for name in ("forward", "backward", "context"):
        ours = sorted(os.listdir(tmp_path / name))
        assert ours == sorted(os.listdir(committed / name)), name
        match, mismatch, errors = filecmp.cmpfiles(tmp_path / name, committed / name, ours, shallow=False)
        assert not mismatch and not errors, (name, mismatch, errors)


def test_info_json_is_wkv_bench_s_schema():
    """python -m wkv info --json and wkv-bench info --json describe the same library alike."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import wkv

    env = dict(os.environ, PYTHONPATH=str(Path(wkv.__file__).parent.parent))
    py = json.loads(subprocess.run([sys.executable, "-m", "wkv", "info", "--json"], capture_output=True, text=True,
                                   env=env, timeout=120, check=True).stdout)
    assert py["kind"] == "info" and py["libwkv"] == wkv.version()
    cpu = [b for b in py["backends"] if b["backend"] == "cpu"][0]
    assert cpu["available"] and "rwkv7" in cpu["ops"] and cpu["attention_configs"]
    bench = Path(wkv.library_path()).parent / "tools" / "wkv-bench" / "wkv-bench"
    if not bench.exists():
        pytest.skip("no wkv-bench next to the library (%s)" % bench)
    c = json.loads(subprocess.run([str(bench), "info", "--json"], capture_output=True, text=True, timeout=120,
                                  check=True).stdout)
    assert set(c) == set(py)
    for a, b in zip(c["backends"], py["backends"]):
        assert set(a) == set(b) and a["backend"] == b["backend"]
        for key in ("available", "ops", "dtypes", "decay_forms", "head_sizes", "attention_configs"):
            assert a[key] == b[key], (a["backend"], key)
    assert c["libwkv"] == py["libwkv"] and c["version_code"] == py["version_code"] and c["build"] == py["build"]


def test_context_parallel_example_matches_one_process():
    pytest.importorskip("torch", reason="torch is not installed")
    out = run("examples/python/context_parallel.py", "--spawn", "2", "--T", "300", "--repeats", "1")
    assert "PASS" in out and "worst rel err" in out, out


def test_golden_json_is_wkv_bench_s_schema(golden_dir):
    """python -m wkv golden --json and wkv-bench golden --json: one schema, the same verdicts."""
    import json
    from pathlib import Path

    import wkv

    env = dict(os.environ, PYTHONPATH=str(SRC), WKV_GOLDEN_DIR=str(golden_dir))
    lines = subprocess.run([sys.executable, "-m", "wkv", "golden", "--json", "--backend", "cpu"], capture_output=True,
                           text=True, env=env, timeout=600).stdout.splitlines()
    py = [json.loads(ln) for ln in lines]
    assert py[-1]["kind"] == "golden_summary" and py[-1]["passed"] == py[-1]["total"] > 0
    bench = Path(wkv.library_path()).parent / "tools" / "wkv-bench" / "wkv-bench"
    if not bench.exists():
        pytest.skip("no wkv-bench next to the library")
    c = [json.loads(ln) for ln in subprocess.run([str(bench), "golden", "--json", "--backend", "cpu"],
                                                   capture_output=True, text=True, env=env, timeout=600).stdout.splitlines()]
    assert [r["kind"] for r in c] == [r["kind"] for r in py]
    for a, b in zip(c, py):
        assert set(a) == set(b)
        if a["kind"] == "golden":
            assert a["file"] == b["file"] and a["status"] == b["status"] == "pass" and a["op"] == b["op"]
