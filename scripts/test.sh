#!/usr/bin/env bash
# Set up, build, and run every test: the reliability checks (docs/RELIABILITY.md) and then
# ctest on the release build (the doctest suites, the plugin loader test, the golden files
# through wkv-bench, the installed-package consumer check, the Python suite, the threading
# stress test, the exported-symbol and ABI checks, the float64 numpy specs of the kernels'
# formulations in tests/formulations, and BENCHMARKS.md against benchmarks/*.json).
#
# Reliability checks, each in its own build directory:
#   asan      wkv_tests and wkv_plugin_tests (the fault-injection cases included: the preset is a
#             Debug build, WKV_FAULT_INJECTION on) under ASan + UBSan (halt on the first report,
#             leaks included), and the Python suite against the ASan libwkv with the ASan runtime
#             preloaded
#   tsan      the threading stress test (tests/stress) under ThreadSanitizer
#   valgrind  memcheck over the CPU doctest suite's validation and op-level cases
#   fuzz      the four libFuzzer harnesses at once, WKV_FUZZ_SECONDS (default 50) each, from the
#             seed corpus (scripts/fuzz.sh)
#   aarch64   the CPU backend's NEON and scalar paths, cross-compiled for AArch64
#             (cmake/aarch64-linux-gnu.cmake, build-aarch64) and run under qemu-user: the golden
#             files and the random-input cases against the float64 reference (correctness only)
# Steps that use one core run two at a time (CI has 2). WKV_TEST_SKIP="asan tsan valgrind fuzz aarch64"
# (any subset) skips some, for a quick local run; CI runs them all. Arguments go to the final
# ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The build CI tests has fault injection compiled in (src/fault.h, WKV_FAULT): the release
# ctest, valgrind and the Vulkan suite run the fault tests; a default Release build leaves it out.
scripts/build.sh -DWKV_FAULT_INJECTION=ON

skip=" ${WKV_TEST_SKIP:-} "
t0=$(date +%s)
step() { echo; echo "==== $* [$(( $(date +%s) - t0 ))s]"; }
want() { [[ "$skip" != *" $1 "* ]]; }
logs=$PWD/build/reliability
mkdir -p "$logs"
bg_pid=
bg() {  # runs "$@" in the background, output to $logs/$1.log
  local name=$1
  shift
  ("$@") >"$logs/$name.log" 2>&1 &
  bg_pid=$!
}
join() {  # waits for the background step, prints its output, fails with it
  local name=$1 rc=0
  wait "$bg_pid" || rc=$?
  step "$name (ran in the background)"
  cat "$logs/$name.log"
  [ $rc -eq 0 ] || { echo "$name FAILED (exit status $rc)"; exit 1; }
}

asan_tests() {
  ctest --preset asan -R '^(wkv_tests|wkv_plugin_tests|wkv_plugin_tests_no_driver)$'
  echo "-- the Python suite against build-asan/libwkv.so, libasan preloaded"
  # libstdc++ is preloaded too: python is not linked against it, and ASan's __cxa_throw
  # interceptor aborts on the first C++ exception (torch's) when it is loaded after ASan.
  local libasan libstdcxx
  libasan=$(gcc -print-file-name=libasan.so)
  libstdcxx=$(g++ -print-file-name=libstdc++.so.6)
  WKV_LIBRARY=$PWD/build-asan/libwkv.so WKV_GOLDEN_DIR=$PWD/tests/golden PYTHONDONTWRITEBYTECODE=1 \
    LD_PRELOAD="$libasan $libstdcxx" ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=1:allocator_may_return_null=1 \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    python3 -m pytest -q -p no:cacheprovider bindings/python/tests
}

valgrind_tests() {
  # The whole CPU suite under memcheck takes too long for CI (the random and golden sweeps, the
  # safetensors reader's malformed-file sweep); these cases cover every entry point, every
  # failure path (the injected faults too), and each op forward + backward with states,
  # packing and strides.
  local cases='bad*,*valid fixture*,overflowing*,aliasing*,in-place*,*struct is accepted*,null context*'
  cases+=',wkv_context_synchronize*,status strings*,failures are silent*,*busy context*'
  cases+=',rwkv4: packed*,rwkv6: packed*,rwkv7 random: packed*,rwkv7 random: strided*'
  cases+=',rwkv4: bad inputs*,rwkv6: bad inputs*,rwkv7 random: key-major*,rwkv7 random: in-place*'
  cases+=',golden: files that are valid*'
  # forward-saved checkpoints: every misuse the context refuses, old descriptor sizes
  cases+=',checkpoints: misuse*,checkpoints: callers*'
  # fault injection: every allocation and device-lost point, a lost context's calls, destroy
  cases+=',fault*'
  # NaN and Inf in every input of every op (the policy of wkv.h's NUMERICS)
  cases+=',rwkv nonfinite*'
  # attention: every refusal, packed sequences, rows that see no key
  cases+=',attention: bad inputs*,attention: packed*,attention: fully masked*'
  # glibc 2.36's ld.so reads a word past a short RPATH string while dlopen loads a GPU plugin
  # (libwkv_cuda.so, when nvcc built it): not libwkv's, and Debian's suppressions miss it.
  cat >"$logs/valgrind-ldso.supp" <<'SUPP'
{
   ld.so SSE2 strncmp over-read of an RPATH string (dl-load.c is_dst)
   Memcheck:Addr8
   fun:strncmp
   fun:is_dst
}
SUPP
  valgrind --tool=memcheck --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite \
    --show-leak-kinds=definite --track-origins=no --quiet --suppressions="$logs/valgrind-ldso.supp" \
    build/tests/wkv_tests -tc="$cases" -tce="*WKV_BACKEND*" --no-intro
}

sanitizer_jobs() {  # background: ASan tests, then valgrind
  if want asan; then echo "---- asan: wkv_tests, wkv_plugin_tests under ASan + UBSan"; asan_tests; fi
  if want valgrind; then echo "---- valgrind: memcheck over the CPU suite's validation and op cases"; valgrind_tests; fi
}

if want asan; then
  step "asan: configure + build (build-asan)"
  cmake --preset asan -DWKV_VULKAN=OFF -DWKV_CUDA=OFF -DWKV_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build --preset asan -j"$(nproc)" --target wkv_tests wkv_plugin_tests >/dev/null
fi
step "asan tests + valgrind in the background; tsan and the fuzzers' build meanwhile"
bg sanitizers sanitizer_jobs
if want tsan; then
  step "tsan: configure + build (build-tsan)"
  cmake --preset tsan -DWKV_BUILD_TOOLS=OFF -DWKV_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build --preset tsan -j1 --target wkv_stress >/dev/null
  step "tsan: the threading stress test"
  ctest --preset tsan
fi
if want fuzz; then
  step "fuzz: configure + build (build-fuzz)"
  cmake --preset fuzz >/dev/null
  cmake --build --preset fuzz -j1 >/dev/null
fi
join sanitizers

if want fuzz; then
  step "fuzz: libFuzzer harnesses, ${WKV_FUZZ_SECONDS:-50} s each, at the same time"
  WKV_FUZZ_PARALLEL=1 scripts/fuzz.sh
fi

if want aarch64; then
  step "aarch64: cross build (build-aarch64)"
  # doctest is header-only: its host header goes in a folder of its own (-I/usr/include would put
  # the host's libc headers before the target's)
  mkdir -p build-aarch64/deps/doctest
  cp /usr/include/doctest/doctest.h build-aarch64/deps/doctest/
  cmake -S . -B build-aarch64 --toolchain cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
    -DWKV_VULKAN=OFF -DWKV_CUDA=OFF -DWKV_BUILD_EXAMPLES=OFF \
    -DDOCTEST_INCLUDE_DIR="$PWD/build-aarch64/deps" >/dev/null
  cmake --build build-aarch64 -j"$(nproc)" --target wkv_tests >/dev/null
  step "aarch64: NEON and scalar paths under qemu-aarch64, at the same time"
  # the golden files (every op, f32/f16/bf16) and the random inputs of RWKV-7/6/4 against the
  # float64 reference (RWKV-7's: the case that covers every path, N = 7..128, every decay form
  # and dtype; its full sweep takes 100 s there); about 2 minutes under qemu on 2 cores
  aarch64_cases='cpu isa*,golden: every file*,rwkv7 random: every CPU path*'
  aarch64_cases+=',rwkv6: golden*,rwkv6: random*,rwkv4: golden*,rwkv4: random*'
  # a reusing backward equals a recomputing one bit for bit (needs -ffp-contract=off there)
  aarch64_cases+=',checkpoints: a backward reusing*'
  pids=()
  for isa in neon scalar; do
    WKV_CPU_ISA=$isa qemu-aarch64 -L /usr/aarch64-linux-gnu build-aarch64/tests/wkv_tests \
      -tc="$aarch64_cases" --no-intro >"$logs/aarch64-$isa.log" 2>&1 &
    pids+=($!)
  done
  rc=0
  for i in 0 1; do wait "${pids[$i]}" || rc=1; done
  tail -n 4 "$logs/aarch64-neon.log" "$logs/aarch64-scalar.log"
  [ $rc -eq 0 ] || { cat "$logs/aarch64-neon.log" "$logs/aarch64-scalar.log"; echo "aarch64 FAILED"; exit 1; }
  step "aarch64: NEON with RWKV-7's two other walks (WKV_RWKV7_WALK=blocks, rows), at the same time"
  walk_cases='golden: every file*,rwkv7 random: every CPU path*,rwkv7 random: decays near zero*'
  walk_cases+=',checkpoints: a backward reusing*'
  pids=()
  for walk in blocks rows; do
    WKV_CPU_ISA=neon WKV_RWKV7_WALK=$walk qemu-aarch64 -L /usr/aarch64-linux-gnu \
      build-aarch64/tests/wkv_tests -tc="$walk_cases" --no-intro >"$logs/aarch64-neon-$walk.log" 2>&1 &
    pids+=($!)
  done
  for i in 0 1; do wait "${pids[$i]}" || rc=1; done
  tail -n 4 "$logs/aarch64-neon-blocks.log" "$logs/aarch64-neon-rows.log"
  [ $rc -eq 0 ] || { cat "$logs/aarch64-neon-blocks.log" "$logs/aarch64-neon-rows.log"; echo "aarch64 FAILED"; exit 1; }
fi

step "ctest (release build)"
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
