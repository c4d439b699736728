#!/usr/bin/env bash
# compute-sanitizer over the CUDA backend (docs/RELIABILITY.md): memcheck (with its leak
# check), racecheck, initcheck and synccheck, each over
#   - wkv_cuda_tests (backends/cuda/tests), the cases in $WKV_SANITIZE_CASES: between them every
#     kernel (RWKV-7, RWKV-6/5, RWKV-4, forward, backward, reductions), every dtype and decay
#     form, packed sequences, host-memory staging, buffers, streams and graph capture, the
#     injected faults and the NaN/Inf cases;
#   - wkv-bench golden --backend cuda --dtype all on a few golden files (host tensors, staged).
# Exit status: 0 when every tool ran both programs to a successful end with nothing reported; 1
# when any tool reported anything (an error, a hazard, a leak), a program failed or was skipped
# (no CUDA device: a run that tested nothing is not clean) or ran out of time; 2 when it cannot
# run at all (no compute-sanitizer, binaries missing).
#
#   scripts/cuda_sanitize.sh [build dir]     default build-device (scripts/device.sh builds it)
#
# Logs: $OUT/sanitize-<tool>.log (both programs, the sanitizer's reports in full) and
# $OUT/sanitize-summary.txt (one line per tool, also printed); OUT defaults to <build>/sanitize.
# Environment:
#   WKV_SANITIZE_TOOLS      the tools, default "memcheck racecheck initcheck synccheck"
#   WKV_SANITIZE_TIMEOUT    seconds per tool and program (default 240; a timeout is a failure)
#                           WKV_SANITIZE_TIMEOUT_<tool> overrides it for one tool
#   WKV_SANITIZE_CASES      doctest -tc filter for wkv_cuda_tests (default below);
#                           WKV_SANITIZE_CASES_<tool> overrides it for one tool
#   WKV_SANITIZE_GOLDEN     golden files (names in tests/golden) for wkv-bench, space-separated
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${1:-$root/build-device}
[[ "$build" = /* ]] || build=$root/$build
out=${OUT:-$build/sanitize}
mkdir -p "$out"
summary=$out/sanitize-summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

tools=${WKV_SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}
limit=${WKV_SANITIZE_TIMEOUT:-240}
default_cases='*every dtype and decay form*,*packed sequences*,*graph*,cuda rwkv6: layouts*'
default_cases+=',cuda rwkv6/rwkv4: two device runs*,*host tensors, wkv_buffers*,cuda: buffers*'
default_cases+=',cuda fault*,cuda nonfinite*,cuda attention: fully masked*,cuda attention: against*,cuda attention backward: against*'
cases=${WKV_SANITIZE_CASES:-$default_cases}
golden=${WKV_SANITIZE_GOLDEN:-wkv7_log_N32.safetensors wkv7_clampw_decode_T1.safetensors wkv6_log_N64.safetensors wkv4_C96.safetensors}

tests_bin=$build/backends/cuda/tests/wkv_cuda_tests
bench=$build/tools/wkv-bench/wkv-bench
if ! command -v compute-sanitizer >/dev/null 2>&1; then
  note "cuda_sanitize: compute-sanitizer not found (it comes with the CUDA toolkit): nothing checked"
  exit 2
fi
for f in "$tests_bin" "$bench"; do
  [ -x "$f" ] || { note "cuda_sanitize: $f is missing: build with -DWKV_CUDA=ON first (scripts/device.sh)"; exit 2; }
done
golden_paths=()
for g in $golden; do golden_paths+=("$root/tests/golden/$g"); done
export WKV_GOLDEN_DIR=$root/tests/golden WKV_PLUGIN_PATH=$build

# The number after "<what> SUMMARY:" on the sanitizer's summary lines, summed (0 when absent).
count() { grep -Eo "$1 SUMMARY: [0-9]+" "$2" | awk '{s += $NF} END {print s + 0}'; }

rc_all=0
for tool in $tools; do
  log=$out/sanitize-$tool.log
  : >"$log"
  opts=(--tool "$tool" --error-exitcode 9)
  case $tool in
    memcheck) opts+=(--leak-check full) ;;
    racecheck) opts+=(--racecheck-report all) ;;
  esac
  var=WKV_SANITIZE_CASES_$tool
  tool_cases=${!var:-$cases}
  var=WKV_SANITIZE_TIMEOUT_$tool
  tool_limit=${!var:-$limit}
  t0=$(date +%s)
  results=()
  failed=0
  run() {  # run <label> <program> <args...>: one program under the tool, appended to the log
    local label=$1 rc
    shift
    {
      echo "===== $label: compute-sanitizer ${opts[*]} $*"
      timeout --kill-after=15 "$tool_limit" compute-sanitizer "${opts[@]}" "$@"
      rc=$?
      echo "===== $label: exit status $rc"
    } >>"$log" 2>&1
    case $rc in
      0) results+=("$label ok") ;;
      9) results+=("$label REPORTED"); failed=1 ;;
      77) results+=("$label SKIPPED (no CUDA device)"); failed=1 ;;
      124|137) results+=("$label TIMED OUT after ${tool_limit}s"); failed=1 ;;
      *) results+=("$label FAILED (exit $rc)"); failed=1 ;;
    esac
  }
  run tests "$tests_bin" "-tc=$tool_cases" --no-intro
  run golden "$bench" golden --backend cuda --dtype all "${golden_paths[@]}"
  errors=$(count "ERROR" "$log")
  hazards=$(count "RACECHECK" "$log")
  leaks=$(grep -c "Leaked [0-9]* bytes" "$log")
  [ $((errors + hazards + leaks)) -eq 0 ] || failed=1
  # a sanitizer that reported nothing because it never ran is not clean
  grep -q "SUMMARY:" "$log" || { failed=1; results+=("no sanitizer summary in the log"); }
  verdict=CLEAN
  [ $failed -eq 0 ] || { verdict=FAILED; rc_all=1; }
  note "compute-sanitizer $tool: $verdict ($(IFS=';'; echo "${results[*]}" | sed 's/;/, /g'); $errors errors, $hazards hazards, $leaks leaks; $(( $(date +%s) - t0 ))s) -> $log"
done
if [ $rc_all -eq 0 ]; then note "cuda_sanitize: every tool clean ($tools)"; else note "cuda_sanitize: FAILED (see the logs in $out)"; fi
exit $rc_all
