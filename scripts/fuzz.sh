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
# harness, default 1), WKV_FUZZ_PARALLEL=1 (the harnesses at the same time instead of one after
# the other: CI's 2 cores), WKV_FUZZ_OUT (logs and the grown corpus; default build-fuzz/runs).
# Arguments: the harnesses to run (forward backward context attention; default all four).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${WKV_FUZZ_SECONDS:-50}
jobs=${WKV_FUZZ_JOBS:-1}
out=${WKV_FUZZ_OUT:-$PWD/build-fuzz/runs}
harnesses=("$@")
[ ${#harnesses[@]} -gt 0 ] || harnesses=(forward backward context attention)

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j"$(nproc)" >/dev/null
mkdir -p "$out"
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export WKV_FUZZ_STATS=1
run_one() {  # harness -> its log; returns the fuzzer's status
  local h=$1 bin=build-fuzz/tests/fuzz/wkv_fuzz_$1
  local grown=$out/corpus-$1
  mkdir -p "$grown"
  local args=(-max_total_time="$secs" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1
              -artifact_prefix="$out/$h-")
  [ "$jobs" -gt 1 ] && args+=(-fork="$jobs" -ignore_crashes=0)
  "$bin" "${args[@]}" "$grown" "tests/fuzz/corpus/$h" >"$out/$h.log" 2>&1
}
report() {  # harness status -> summary lines; returns non-zero on failure
  local h=$1 hrc=$2 log=$out/$1.log grown=$out/corpus-$1
  # (the last stats block: a crash prints it twice)
  local execs rate cov
  execs=$(grep -E '^stat::number_of_executed_units' "$log" | tail -1 | awk '{print $2 + 0}' || true)
  rate=$(grep -E '^stat::average_exec_per_sec' "$log" | tail -1 | awk '{print $2 + 0}' || true)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | awk '{print $2}' || true)
  echo "fuzz $h: exit status $hrc; $execs inputs run in ${secs}s ($rate/s); $cov code edges covered;" \
    "corpus: $(ls "$grown" | wc -l) inputs grown this run + $(ls "tests/fuzz/corpus/$h" | wc -l) committed seeds"
  grep -E 'wkv-fuzz stats|^  (VALID|UNKNOWN|INVALID)' "$log" | sed 's/^/    /' || true
  if [ "$hrc" -ne 0 ]; then
    echo "fuzz $h FAILED; from $log:"
    grep -E 'PROPERTY VIOLATED|ERROR:|SUMMARY|runtime error|Test unit written' "$log" | head -20 || true
    grep -vE '^ +#[0-9]+ ' "$log" | tail -25 || true
    return 1
  fi
}
rc=0
declare -A status
if [ "${WKV_FUZZ_PARALLEL:-0}" = 1 ]; then
  declare -A pid
  for h in "${harnesses[@]}"; do run_one "$h" & pid[$h]=$!; done
  for h in "${harnesses[@]}"; do set +e; wait "${pid[$h]}"; status[$h]=$?; set -e; done
else
  for h in "${harnesses[@]}"; do set +e; run_one "$h"; status[$h]=$?; set -e; done
fi
for h in "${harnesses[@]}"; do report "$h" "${status[$h]}" || rc=1; done
exit $rc
