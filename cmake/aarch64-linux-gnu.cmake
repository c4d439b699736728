# Cross-compiling for AArch64 Linux with Debian's cross toolchain (g++-aarch64-linux-gnu
# libc6-dev-arm64-cross); the binaries run under qemu-user (CMAKE_CROSSCOMPILING_EMULATOR),
# which is how scripts/test.sh tests the NEON path of the CPU backend on an x86-64 machine:
#   cmake -B build-aarch64 --toolchain cmake/aarch64-linux-gnu.cmake -DDOCTEST_INCLUDE_DIR=...
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# Only the target's headers: -I/usr/include would put the host's libc headers before the
# target's. Header-only host packages (doctest) are passed in a folder of their own:
#   -DDOCTEST_INCLUDE_DIR=<dir holding doctest/doctest.h> (scripts/test.sh makes one).
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/aarch64-linux-gnu)
