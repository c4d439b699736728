#!/usr/bin/env bash
# Installs the built libwkv into a temporary prefix and builds the C example against it twice:
# through find_package(wkv CONFIG) and through pkg-config. Both programs must run.
set -euo pipefail
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
libdir=$(find "$tmp/prefix" -name 'libwkv.so.0' -printf '%h\n' | head -n1)

cmake -S "$src/tests/consumer" -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  -DWKV_EXAMPLE_SOURCE="$src/examples/c/hello_wkv.c" >/dev/null
cmake --build "$tmp/cmake" >/dev/null
LD_LIBRARY_PATH="$libdir" "$tmp/cmake/hello_wkv" | grep -q "y\[3\]"

export PKG_CONFIG_PATH="$libdir/pkgconfig"
cc -std=c99 -Wall -Werror "$src/examples/c/hello_wkv.c" $(pkg-config --cflags --libs wkv) -o "$tmp/hello_pc"
LD_LIBRARY_PATH="$libdir" "$tmp/hello_pc" | grep -q "y\[3\]"

# The installed wkv-bench finds the installed libwkv by itself (its RUNPATH), no LD_LIBRARY_PATH,
# and the golden files installed with it (not the source tree's), from any working directory.
if [ -x "$tmp/prefix/bin/wkv-bench" ]; then
  env -u LD_LIBRARY_PATH "$tmp/prefix/bin/wkv-bench" info | grep -q "cpu     available"
  ldd "$tmp/prefix/bin/wkv-bench" | grep "libwkv.so" | grep -q "$tmp/prefix"
  golden=$(cd / && env -u WKV_GOLDEN_DIR "$tmp/prefix/bin/wkv-bench" info --json |
           sed -n 's/.*"golden_dir":"\([^"]*\)".*/\1/p')
  case "$golden" in
    "$tmp/prefix/"*/wkv/golden) ;;
    *) echo "the installed wkv-bench reads golden files from '$golden', not the prefix"; exit 1 ;;
  esac
  (cd / && env -u WKV_GOLDEN_DIR "$tmp/prefix/bin/wkv-bench" golden --backend cpu wkv7_clampw_N64.safetensors) |
    grep -q "1 of 1 passed"
fi

# libwkv itself links neither CUDA nor Vulkan.
if ldd "$libdir/libwkv.so.0" | grep -Eiq 'cuda|vulkan'; then
  echo "libwkv.so links a GPU runtime:"; ldd "$libdir/libwkv.so.0"; exit 1
fi
echo "consumer: find_package and pkg-config builds run, the installed wkv-bench finds libwkv and its golden files; libwkv has no GPU dependency"
