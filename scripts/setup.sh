#!/usr/bin/env bash
# Installs what libwkv needs on Debian, and nothing that is already there. Idempotent: a second
# run installs nothing. Run as root (or with sudo available).
#   scripts/setup.sh demo   what scripts/demo.sh needs: the compiler, CMake, the Vulkan loader's
#                           headers and the shader tools (about a minute on a fresh machine)
#   scripts/setup.sh        everything scripts/test.sh needs as well (several minutes the first time)
set -euo pipefail
mode=${1:-test}
case "$mode" in demo|test) ;; *) echo "setup: unknown mode '$mode' (demo or test)" >&2; exit 2;; esac

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}
pip_install() {  # pip_install <packages>: each package imports under its own name
  python3 -c "import $(IFS=,; echo "$*")" >/dev/null 2>&1 && return 0
  echo "setup: pip installing $*"
  python3 -m pip install -q "$@" 2>/dev/null || python3 -m pip install -q --break-system-packages "$@"
}

# The library, its tools, and the Vulkan plugin: headers to build it (it loads libvulkan.so.1 at
# run time), the shader compiler and validator.
packages=(cmake g++ make pkg-config libvulkan-dev libvulkan1 glslang-tools spirv-tools)
if [ "$mode" = test ]; then
  # The test framework, and for the Vulkan tests a CPU Vulkan device (Mesa's lavapipe) with the
  # Khronos validation layer.
  packages+=(doctest-dev mesa-vulkan-drivers vulkan-validationlayers)
  # Reliability checks (docs/RELIABILITY.md): clang with libFuzzer and its sanitizer
  # runtimes (and llvm-symbolizer for readable reports), valgrind, abigail-tools for the ABI
  # baseline.
  packages+=(clang libclang-rt-dev llvm valgrind abigail-tools)
  # OpenBLAS for the C RWKV-7 model example's prefill products (examples/rwkv7_model; it falls
  # back to plain loops without it).
  packages+=(libopenblas-dev)
  # The CPU backend's NEON path, cross-compiled for AArch64 and run under qemu-user.
  packages+=(g++-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)
fi
apt_install "${packages[@]}"
[ "$mode" = test ] || exit 0

# Python for the bindings' tests: the python3 on PATH (a system or pyenv one) with numpy, pytest
# and ml_dtypes, and torch for the PyTorch integration's tests (autograd, torch.library.opcheck,
# torch.compile), all from PyPI. torch is large (~3 GB installed); pip keeps its download in its
# cache (~/.cache/pip), so a second machine set-up does not fetch it again.
command -v python3 >/dev/null 2>&1 || apt_install python3 python3-pip
pip_install numpy pytest ml_dtypes
pip_install torch
# The oracle of the RWKV-7 model tests (wkv.model against ChatRWKV's RWKV_x070), pure Python;
# auditwheel names the wheel's manylinux tag (tests/consumer/wheel.sh).
pip_install rwkv
pip_install auditwheel
