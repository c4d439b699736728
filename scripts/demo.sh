#!/usr/bin/env bash
# The main job: set up (scripts/setup.sh demo), build the library, wkv-bench and the plugins a
# demo can use into build-demo/, and run the RWKV-7 demo on the best backend present. Set-up and
# build output go to build-demo/demo-setup.log; the demo's result is printed first, then what
# this machine's backends are. The CUDA plugin is built only when nvidia-smi finds a GPU (or
# WKV_DEMO_CUDA=1): compiling it takes minutes and without a GPU it cannot run. Arguments go to
# `wkv-bench demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build-demo
log=$PWD/build-demo/demo-setup.log
cuda=OFF
if [ "${WKV_DEMO_CUDA:-}" = 1 ] || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; }; then
  cuda=ON
fi
echo "demo: setting up and building (CUDA plugin $cuda; output in build-demo/demo-setup.log)"
if ! {
  scripts/setup.sh demo &&
    cmake -S . -B build-demo -DCMAKE_BUILD_TYPE=Release -DWKV_CUDA=$cuda -DWKV_BUILD_TESTS=OFF \
      -DWKV_BUILD_EXAMPLES=OFF &&
    cmake --build build-demo -j"$(nproc)"
} >"$log" 2>&1; then
  tail -n 30 "$log"
  echo "demo: set-up or build failed; the whole output is in $log" >&2
  exit 1
fi
build-demo/tools/wkv-bench/wkv-bench demo "$@"
echo
# An RWKV-7 language model (random weights, 4 layers, width 256) generating through libwkv, when
# this python3 has torch (the test set-up installs it; the demo does not: it is gigabytes).
if python3 -c "import torch" >/dev/null 2>&1; then
  echo "demo: an untrained RWKV-7 model (wkv.model) generating through libwkv:"
  WKV_LIBRARY=$PWD/build-demo/libwkv.so PYTHONPATH=$PWD/bindings/python/src \
    python3 -m wkv.model generate --random-init small --tokenizer bytes --tokens 64 --seed 1
else
  echo "demo: for an RWKV-7 model generating through libwkv: pip install torch, then"
  echo "  WKV_LIBRARY=build-demo/libwkv.so PYTHONPATH=bindings/python/src python3 -m wkv.model generate --random-init small"
fi
echo
build-demo/tools/wkv-bench/wkv-bench info
