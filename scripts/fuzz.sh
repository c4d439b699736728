#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz, the `fuzz` preset: clang + libFuzzer + ASan +
# UBSan) and runs each one for a bounded time from the committed seed corpus. Fails on any
# crash, sanitizer report or property violation; the input that did it is left in the log
# directory as crash-*/leak-*/timeout-* (replay: build-fuzz/tests/fuzz/wkv_fuzz_<h> <file>).
#
#   scripts/fuzz.sh                 # 50 s per harness (CI: scripts/test.sh)
#   WKV_FUZZ_SECONDS=3600 WKV_FUZZ_JOBS=2 scripts/fuzz.sh forward   # a long run of one harness
#
# Environment: WKV_FUZZ_SECONDS (default 50), WKV_FUZZ_JOBS (parallel fuzzing processes per
# harness, default 1), WKV_FUZZ_OUT (logs and the grown corpus; default build-fuzz/runs).
# Arguments: the harnesses to run (forward backward context; default all three).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${WKV_FUZZ_SECONDS:-50}
jobs=${WKV_FUZZ_JOBS:-1}
out=${WKV_FUZZ_OUT:-$PWD/build-fuzz/runs}
harnesses=("$@")
[ ${#harnesses[@]} -gt 0 ] || harnesses=(forward backward context)

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j"$(nproc)" >/dev/null
mkdir -p "$out"
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export WKV_FUZZ_STATS=1
rc=0
for h in "${harnesses[@]}"; do
  bin=build-fuzz/tests/fuzz/wkv_fuzz_$h
  grown=$out/corpus-$h
  mkdir -p "$grown"
  log=$out/$h.log
  args=(-max_total_time="$secs" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1
        -artifact_prefix="$out/$h-")
  [ "$jobs" -gt 1 ] && args+=(-fork="$jobs" -ignore_crashes=0)
  set +e
  "$bin" "${args[@]}" "$grown" "tests/fuzz/corpus/$h" >"$log" 2>&1
  hrc=$?
  set -e
  execs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{s += $2} END {print s + 0}')
  rate=$(grep -E '^stat::average_exec_per_sec' "$log" | awk '{s += $2} END {print s + 0}')
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1)
  echo "fuzz $h: rc=$hrc, $execs execs in ${secs}s ($rate/s), $cov, corpus $(ls "$grown" | wc -l) grown + $(ls "tests/fuzz/corpus/$h" | wc -l) seeds"
  grep -E 'wkv-fuzz stats|^  (VALID|UNKNOWN|INVALID)' "$log" | sed 's/^/    /' || true
  if [ "$hrc" -ne 0 ]; then
    rc=1
    echo "fuzz $h FAILED; the end of $log:"
    grep -E 'PROPERTY VIOLATED|ERROR:|SUMMARY|runtime error|Test unit written' "$log" | head -20
    tail -40 "$log"
  fi
done
exit $rc
