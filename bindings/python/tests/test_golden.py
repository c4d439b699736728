"""The golden files through the Python API, and the `python -m wkv` commands."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import wkv
from wkv import golden

from conftest import SRC

FILES = golden.golden_files()


def test_golden_files_are_present():
    assert FILES, "no golden files in %s (set WKV_GOLDEN_DIR)" % golden.golden_dir()


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_golden_file(path):
    r = golden.run_file(path)
    if r.status == "UNSUPPORTED":
        pytest.skip("%s: %s (runs once the C side implements the op)" % (path.name, r.message))
    assert r.status == "PASS", golden.format_result(r)
    assert r.max_rel_err <= golden.TOL_F32


def test_golden_key_major():
    path = next((p for p in FILES if p.name.startswith("wkv7")), None)
    if path is None:
        pytest.skip("no wkv7 golden file")
    r = golden.run_file(path, key_major=True)
    assert r.status == "PASS", golden.format_result(r)


def test_safetensors_reader_matches_the_header(tmp_path):
    import json
    import struct

    import numpy as np

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.linspace(0, 1, 5)
    hdr = {"__metadata__": {"op": "x"}, "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
           "b": {"dtype": "F64", "shape": [5], "data_offsets": [24, 64]}}
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    (tmp_path / "t.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + a.tobytes() + b.tobytes())
    meta, t = golden.load_safetensors(tmp_path / "t.safetensors")
    assert meta == {"op": "x"}
    np.testing.assert_array_equal(t["a"], a)
    np.testing.assert_array_equal(t["b"], b)


def _run(*args):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    if "WKV_LIBRARY" not in env:
        env["WKV_LIBRARY"] = str(wkv.library_path())
    return subprocess.run([sys.executable, "-m", "wkv", *args], capture_output=True, text=True, env=env, timeout=120)


def test_cli_info():
    p = _run("info")
    assert p.returncode == 0, p.stderr
    assert "libwkv %s" % wkv.__version__ in p.stdout
    assert "  cpu     available" in p.stdout
    assert any(line.strip().startswith("ops:") and "rwkv7" in line for line in p.stdout.splitlines())
    assert "auto: a context with backend AUTO runs on" in p.stdout


def test_cli_golden():
    w7 = [str(p) for p in FILES if p.name.startswith("wkv7")][:2]
    if not w7:
        pytest.skip("no wkv7 golden file")
    p = _run("golden", "--backend", "cpu", *w7)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert all("  PASS  max_rel_err=" in line and line.endswith("cpu f32") for line in lines[:-1]), p.stdout
    assert lines[-1] == "%d of %d passed" % (len(w7), len(w7))


def test_cli_golden_reports_failures_with_exit_1(tmp_path):
    bad = tmp_path / "broken.safetensors"
    bad.write_bytes(b"\x01")
    p = _run("golden", str(bad))
    assert p.returncode == 1
    assert "broken.safetensors  FAIL error: cannot read" in p.stdout
    assert p.stdout.splitlines()[-1] == "0 of 1 passed"


def test_cli_usage_error():
    p = _run()
    assert p.returncode == 2
    p = _run("golden", "--backend", "tpu")
    assert p.returncode == 2
