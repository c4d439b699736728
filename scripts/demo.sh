#!/usr/bin/env bash
# The main job: set up, build, and run the RWKV-7 demo on the best backend present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
build/tools/wkv-bench/wkv-bench info
build/tools/wkv-bench/wkv-bench demo "$@"
