"""pytest set-up: import the package from this source tree (unless WKV_TEST_INSTALLED=1, to
test an installed wheel), and fail early with a clear message when libwkv cannot be found."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
REPO = HERE.parents[2]

if os.environ.get("WKV_TEST_INSTALLED") != "1":
    sys.path.insert(0, str(SRC))
sys.path.insert(0, str(HERE))  # reference.py

import wkv  # noqa: E402

#: Fresh random inputs every run; WKV_TEST_SEED=<n> repeats a run (the header prints n).
SEED = int(os.environ.get("WKV_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))


def pytest_report_header(config):
    try:
        lib = str(wkv.library_path())
    except OSError as e:
        lib = "NOT FOUND (%s)" % e
    try:
        import torch

        th = "torch %s (cuda: %s)" % (torch.__version__, torch.cuda.is_available())
    except ImportError:
        th = "torch not installed: torch tests skip"
    return ["WKV_TEST_SEED=%d" % SEED, "wkv package: %s" % Path(wkv.__file__).parent, "libwkv: %s" % lib, th]


def pytest_sessionstart(session):
    try:
        wkv.library_path()
    except OSError as e:
        raise pytest.UsageError("libwkv not found: %s" % e)


@pytest.fixture
def rng(request):
    import numpy as np

    import zlib

    return np.random.default_rng([SEED, zlib.crc32(request.node.nodeid.encode())])


@pytest.fixture(scope="session")
def golden_dir():
    from wkv.golden import golden_dir as gd

    return gd()
