#!/usr/bin/env bash
# Set up, build, and run every test (ctest: the doctest suites, the plugin loader test, the
# golden files through wkv-bench, the installed-package consumer check).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
