#!/usr/bin/env bash
# Installs what libwkv needs to build and test on Debian, and nothing that is already there.
# Idempotent: a second run installs nothing. Run as root (or with sudo available).
set -euo pipefail

packages=(cmake g++ make pkg-config doctest-dev)
# The Vulkan plugin: headers to build it (it loads libvulkan.so.1 at run time), the shader
# compiler and validator, and for its tests a CPU Vulkan device (Mesa's lavapipe) with the
# Khronos validation layer.
packages+=(libvulkan-dev libvulkan1 mesa-vulkan-drivers glslang-tools spirv-tools vulkan-validationlayers)
# Reliability checks (README.md, "Reliability"): clang with libFuzzer and its sanitizer runtimes
# (and llvm-symbolizer for readable reports), valgrind, and abigail-tools for the ABI baseline.
packages+=(clang libclang-rt-dev llvm valgrind abigail-tools)
# The CPU backend's NEON path, cross-compiled for AArch64 and run under qemu-user (scripts/test.sh).
packages+=(g++-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python for the bindings' tests: the python3 on PATH (a system or pyenv one) with numpy,
# pytest and ml_dtypes from PyPI.
if ! command -v python3 >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3 python3-pip
fi
if ! python3 -c "import numpy, pytest, ml_dtypes" >/dev/null 2>&1; then
  echo "setup: pip installing numpy pytest ml_dtypes"
  python3 -m pip install -q numpy pytest ml_dtypes 2>/dev/null ||
    python3 -m pip install -q --break-system-packages numpy pytest ml_dtypes
fi
