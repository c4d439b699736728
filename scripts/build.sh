#!/usr/bin/env bash
# Configures and builds libwkv, its tools, examples and tests into build/ (Release).
# Extra arguments go to the CMake configure step, e.g. -DWKV_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
