#!/usr/bin/env bash
# wkv-bench perf and golden show "[i/n] ..." progress on stderr when it is a terminal, and never
# when it is a file or a pipe (logs and CI output stay clean). `script` (util-linux) gives the
# command a pseudo-terminal.
set -euo pipefail
bench=$1
golden_file=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
perf=(perf --backend cpu --op rwkv7 --B 1 --T 4,8 --H 1 --N 8 --repeat 2 --warmup 1)

script -qec "$bench ${perf[*]}" /dev/null >"$tmp/tty" </dev/null
grep -q "\[2/2\] rwkv7 f32 B=1 T=8" "$tmp/tty" || { echo "no perf progress on a terminal:"; cat -v "$tmp/tty"; exit 1; }
grep -q "rwkv7 forward  cpu f32  B=1 T=8" "$tmp/tty" || { echo "perf results missing:"; cat -v "$tmp/tty"; exit 1; }
script -qec "$bench golden --backend cpu $golden_file" /dev/null >"$tmp/tty" </dev/null
grep -q "\[1/1\] " "$tmp/tty" || { echo "no golden progress on a terminal:"; cat -v "$tmp/tty"; exit 1; }
WKV_BENCH_PROGRESS=0 script -qec "$bench ${perf[*]}" /dev/null >"$tmp/off" </dev/null
if grep -q "\[1/2\]" "$tmp/off"; then echo "WKV_BENCH_PROGRESS=0 still shows progress"; exit 1; fi

"$bench" "${perf[@]}" >"$tmp/out" 2>"$tmp/err"
"$bench" golden --backend cpu "$golden_file" >>"$tmp/out" 2>>"$tmp/err"
if grep -q $'\033' "$tmp/out" "$tmp/err"; then echo "terminal escapes in redirected output"; exit 1; fi
if grep -q "\[1/" "$tmp/err"; then echo "progress in a redirected stderr"; exit 1; fi
grep -q "1 of 1 passed" "$tmp/out"
echo "progress: shown on a terminal, absent from files and pipes"
