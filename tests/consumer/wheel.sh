#!/usr/bin/env bash
# The Python wheel as a user gets it: `pip wheel bindings/python` (the CUDA plugin off, for
# time), then checks that the wheel stores libwkv once (wheels cannot hold symlinks: one file
# under its SONAME), that it installs and runs an op from the installed package, and which
# manylinux tag it is consistent with (auditwheel show, when installed).
#   tests/consumer/wheel.sh <source dir> <scratch dir>
set -euo pipefail
src=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
python3 -m pip wheel "$src/bindings/python" -w "$work/dist" --no-deps -q \
  --config-settings=cmake.define.WKV_CUDA=OFF --config-settings=build-dir="$work/build" >"$work/pip.log" 2>&1 ||
  { tail -n 30 "$work/pip.log"; echo "wheel: pip wheel failed"; exit 1; }
whl=$(ls "$work"/dist/wkv-*.whl)
python3 - "$whl" <<'PY'
import sys, zipfile
names = [n for n in zipfile.ZipFile(sys.argv[1]).namelist() if "/lib/libwkv." in n]
assert names == ["wkv/lib/libwkv.so.0"], "libwkv in the wheel: %s (expected one file, its SONAME)" % names
print("wheel: libwkv stored once (%s)" % names[0])
PY
python3 -m pip install -q --no-deps --target "$work/site" "$whl" >/dev/null 2>&1
(cd "$work" && PYTHONPATH="$work/site" WKV_LIBRARY= python3 - <<'PY'
import numpy as np, wkv
lib = str(wkv.library_path())
assert "/site/wkv/lib/" in lib, lib
x = [np.random.default_rng(0).standard_normal((1, 3, 2, 8)).astype(np.float32) for _ in range(6)]
y, s = wkv.rwkv7(*x)
assert y.shape == (1, 3, 2, 8) and np.isfinite(y).all()
print("wheel: the installed package runs from", lib)
PY
)
if python3 -c "import auditwheel" 2>/dev/null; then
  tag=$(python3 -m auditwheel show "$whl" 2>&1 | tr '\n' ' ' | grep -o 'platform tag: "[^"]*"' || true)
  [ -n "$tag" ] || { python3 -m auditwheel show "$whl"; echo "wheel: auditwheel found no manylinux tag"; exit 1; }
  echo "wheel: auditwheel: consistent with $tag"
fi
