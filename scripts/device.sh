#!/usr/bin/env bash
# One call on a GPU machine: build everything with CUDA (Release, sm_90, fault injection compiled
# in for the CUDA fault tests: a branch per call, nothing in the kernels), run ctest (the CUDA
# tests included), scripts/cuda_sanitize.sh (compute-sanitizer memcheck, racecheck, initcheck,
# synccheck over the CUDA tests and wkv-bench golden; logs sanitize-<tool>.log),
# `wkv-bench golden --backend cuda` in f32/f16/bf16, and the RWKV-7 anchor shapes with
# device-side timing (wkv-cuda-bench: CUDA events) and with `wkv-bench perf --backend cuda`.
# Logs go to $OUT (default build-device/out); a summary is printed last.
#
#   scripts/device.sh prep   here, once: copies the doctest header (a Debian package that the
#                            GPU machine lacks) into build-deps/ (ignored by git), to be carried
#   scripts/device.sh        there: everything above
#
# With the device tool: run(command="scripts/device.sh", carry=["build-deps", ".vk", ".gl"],
# timeout_s=600). For the Vulkan part, here first: build with -DWKV_VULKAN=ON into build-vk and
#   mkdir -p .vk && cp -a build-vk/libwkv.so* build-vk/libwkv_vulkan.so \
#     build-vk/tools/wkv-bench/wkv-bench build-vk/backends/vulkan/tests/wkv_vulkan_tests \
#     build-vk/examples/vulkan_engine/wkv_example_vulkan_engine .vk/
# and download the loader and the GL dispatch libraries NVIDIA's Vulkan driver needs, with the
# amd64 options of the device tool's README: (cd .gl && apt-get download libvulkan1 libegl1
# libglvnd0 libopengl0 libgl1 libglx0 libgles2). .vk, .gl and build-deps are ignored by git.
# Environment: WKV_DEVICE_ARCH (default 90), WKV_DEVICE_QUICK=1 (skip the sanitizers and the
# wkv-bench perf run; here each sanitizer run gets WKV_SANITIZE_TIMEOUT=60 s, racecheck 200 s.
# For the full-length sanitizer runs use a second call on the same machine, which keeps
# build-device: scripts/cuda_sanitize.sh build-device, 240 s per run by default), WKV_DEVICE_PERF=0 (skip the device-timed perf runs), WKV_DEVICE_NCU=0
# (skip Nsight Compute). The shortest full check (build, ctest, golden, demo):
#   WKV_DEVICE_QUICK=1 WKV_DEVICE_PERF=0 WKV_DEVICE_NCU=0 scripts/device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

if [ "${1:-}" = "prep" ]; then
  src=/usr/include/doctest/doctest.h
  [ -f "$src" ] || { echo "device.sh prep: $src not found (apt-get install doctest-dev)"; exit 1; }
  mkdir -p build-deps/doctest
  cp "$src" build-deps/doctest/doctest.h
  echo "device.sh prep: build-deps/doctest/doctest.h ready; carry \"build-deps\""
  exit 0
fi

out=${OUT:-$root/build-device/out}
mkdir -p "$out"
build=$root/build-device
arch=${WKV_DEVICE_ARCH:-90}
summary=$out/summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
t_start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t_start ))s] $*"; }

{
  stamp "machine"
  nvidia-smi -L 2>&1 || true
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1 || true
  nvcc --version 2>&1 | tail -2
  cmake --version 2>&1 | head -1
  nproc
} >"$out/build.log" 2>&1

# ------------------------------------------------------------------------------- build
doctest_args=()
if [ -f "$root/build-deps/doctest/doctest.h" ]; then
  doctest_args=(-DDOCTEST_INCLUDE_DIR="$root/build-deps")
elif [ ! -f /usr/include/doctest/doctest.h ]; then
  note "WARNING: no doctest header (run 'scripts/device.sh prep' here and carry build-deps)"
fi
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
stamp "configure + build" >>"$out/build.log"
if ! cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DWKV_CUDA=ON -DWKV_FAULT_INJECTION=ON \
      -DCMAKE_CUDA_ARCHITECTURES="$arch" -DWKV_CUDA_PTXAS_VERBOSE=ON "${doctest_args[@]}" \
      >>"$out/build.log" 2>&1 ||
   ! cmake --build "$build" -j"$(nproc)" >>"$out/build.log" 2>&1; then
  note "BUILD FAILED (see build.log)"
  tail -40 "$out/build.log"
  exit 1
fi
grep -E "ptxas info *: (Compiling|Used)|spill" "$out/build.log" | sed 's/_ZN8wkv_cuda[^ ]*kernelILi/kernel<N=/' |
  tail -18 >>"$summary"
stamp "build done" | tee -a "$summary"
bench=$build/tools/wkv-bench/wkv-bench
cbench=$build/tools/wkv-cuda-bench/wkv-cuda-bench
"$bench" info >>"$summary" 2>&1

# ------------------------------------------------------------------------------- tests
exclude=()
command -v pkg-config >/dev/null 2>&1 || { exclude=(-E wkv_consumer); note "note: no pkg-config here: wkv_consumer not run"; }
(cd "$build" && ctest --output-on-failure -j4 --timeout 300 "${exclude[@]}") >"$out/ctest.log" 2>&1
ctest_rc=$?
grep -E "tests passed|Test +#|Skipped|Failed" "$out/ctest.log" | tee -a "$summary"
stamp "ctest rc=$ctest_rc" | tee -a "$summary"

# per-file golden results of the CUDA tests (device memory, both state orders)
"$build/backends/cuda/tests/wkv_cuda_tests" -tc="*golden*" -s >"$out/cuda_tests.log" 2>&1
grep -E "MESSAGE: golden" "$out/cuda_tests.log" | sed 's/.*MESSAGE: //' | tee -a "$summary"
"$build/backends/cuda/tests/wkv_cuda_tests" -tc="*info*" -s 2>&1 | grep "MESSAGE: device" | tee -a "$summary"
# RWKV-7's decode kernel with two rows per thread everywhere (by default only large batches
# take it; results must be the same bits, backends/cuda/rwkv7.cu)
WKV_CUDA_RWKV7_ROWS=2 "$build/backends/cuda/tests/wkv_cuda_tests" >"$out/cuda_tests_rows2.log" 2>&1
note "wkv_cuda_tests with WKV_CUDA_RWKV7_ROWS=2: rc=$? $(grep -E 'test cases:' "$out/cuda_tests_rows2.log")"

# the command-line checker on the CUDA backend: host tensors, staged by the plugin
: >"$out/golden_bench.log"
for dt in f32 f16 bf16; do
  echo "== wkv-bench golden --backend cuda --dtype $dt" >>"$out/golden_bench.log"
  "$bench" golden --backend cuda --dtype "$dt" "$root"/tests/golden/wkv7_*.safetensors \
    "$root"/tests/golden/wkv6_*.safetensors "$root"/tests/golden/wkv4_*.safetensors >>"$out/golden_bench.log" 2>&1
  echo "rc=$?" >>"$out/golden_bench.log"
done
cat "$out/golden_bench.log" >>"$summary"
note "wkv-bench golden --backend cuda: $(grep -c ' PASS ' "$out/golden_bench.log") PASS lines, $(grep -c ' FAIL ' "$out/golden_bench.log") FAIL lines (golden_bench.log)"
# RWKV-7's chunked forward and backward wherever they apply (by default only small batches with
# long T take them; backends/cuda/rwkv7_chunk.cu, rwkv7_chunk_bwd.cu). The CUDA tests force them
# in their own cases too.
: >"$out/golden_chunked.log"
for dt in f32 f16 bf16; do
  WKV_CUDA_RWKV7_CHUNKED=1 WKV_CUDA_RWKV7_CHUNKED_BWD=1 "$bench" golden --backend cuda --dtype "$dt" "$root"/tests/golden/wkv7_*.safetensors \
    >>"$out/golden_chunked.log" 2>&1
done
note "wkv-bench golden --backend cuda, WKV_CUDA_RWKV7_CHUNKED=1 WKV_CUDA_RWKV7_CHUNKED_BWD=1: $(grep -c ' PASS ' "$out/golden_chunked.log") PASS lines, $(grep -c ' FAIL ' "$out/golden_chunked.log") FAIL lines"
stamp "golden done" | tee -a "$summary"

# the demo on the best backend present (AUTO: CUDA here), host tensors; f32 and bf16
for args in "" "--dtype bf16"; do
  # shellcheck disable=SC2086
  { echo "== wkv-bench demo $args"; "$bench" demo $args 2>&1; echo "rc=$?"; } >>"$out/demo.log"
done
cat "$out/demo.log" >>"$summary"
stamp "demo done" | tee -a "$summary"

# ------------------------------------------------------------------------------- perf
perf=$out/perf.jsonl
: >"$perf"
if [ "${WKV_DEVICE_PERF:-1}" = 1 ]; then
pt() { "$cbench" --json "$@" >>"$perf" 2>>"$out/build.log" || note "wkv-cuda-bench $* failed"; }
# anchors (H=32, N=64): train fwd / bwd / fwd+bwd bf16 B=8 T=4096; prefill f16 B=1 T=4096;
# decode T=1 at B=256 and B=1 (CUDA graph)
pt --B 8 --T 4096 --dtype bf16 --pass all --repeat 10
pt --B 8 --T 4096 --dtype bf16 --pass forward --no-state --repeat 10
pt --B 1 --T 4096 --dtype f16 --pass forward --repeat 10
pt --B 256 --T 1 --dtype f32,bf16 --pass forward --graph --inner 20 --repeat 20
pt --B 256 --T 1 --dtype f32 --pass forward --inner 20 --repeat 20
pt --B 1 --T 1 --dtype f32 --pass forward --graph --inner 200 --repeat 20
pt --B 1 --T 1 --dtype f32 --pass forward --inner 200 --repeat 20
# other head sizes
pt --B 8 --T 1024 --H 64 --N 32 --dtype bf16 --pass all --repeat 5
pt --B 8 --T 1024 --H 16 --N 128 --dtype bf16 --pass all --repeat 5
stamp "device-timed perf done" | tee -a "$summary"
fi
if [ "${WKV_DEVICE_PERF:-1}" = 1 ]; then
  # the same anchors through the public API: wkv-bench perf keeps every tensor in wkv_buffers
  # and times batched calls + wkv_context_synchronize
  wb() { "$bench" perf --backend "$@" --H 32 --N 64 --repeat 10 --json >>"$perf" 2>>"$out/golden_bench.log" ||
         note "wkv-bench perf --backend $* failed (golden_bench.log)"; }
  wb cuda --B 8 --T 4096 --dtype bf16
  # training with the forward's checkpoints reused (RWKV-7 N=64 saves them; passes fwd+save and
  # bwd-reuse, interleaved with the plain forward and backward in each sample)
  wb cuda --B 8 --T 4096 --dtype bf16 --reuse
  # B=1: prefill (the chunked forward) and a training step (the chunked backward)
  wb cuda --B 1 --T 4096 --dtype f16 --reuse
  wb cuda --B 1,256 --T 1 --dtype f32 --pass forward
  stamp "wkv-bench perf cuda done" | tee -a "$summary"
fi
# Softmax attention on CUDA (the SIMT kernels, opt-in until this run's wkv_cuda_tests pass:
# WKV_CUDA_ATTENTION=1): bf16, the speed table's shapes, tensors in wkv_buffers
if [ "${WKV_DEVICE_PERF:-1}" = 1 ]; then
  for D in 64 128; do for T in 1024 4096; do for c in "" --causal; do
    # shellcheck disable=SC2086
    WKV_CUDA_ATTENTION=1 "$bench" perf --op attention --backend cuda --B 4 --T "$T" --H 32 --D "$D" $c --dtype bf16 \
      --config all --repeat 10 --json >>"$perf" 2>>"$out/golden_bench.log" || note "cuda attention D=$D T=$T $c failed (golden_bench.log)"
  done; done; done
  # its backward, the CPU table's training shapes (bf16 and f32)
  for dt in bf16 f32; do
    WKV_CUDA_ATTENTION=1 "$bench" perf --op attention --backend cuda --B 4 --T 1024 --H 32 --D 64 --causal --dtype "$dt" \
      --pass backward --repeat 10 --json >>"$perf" 2>>"$out/golden_bench.log" || note "cuda attention backward $dt failed (golden_bench.log)"
  done
  stamp "wkv-bench perf cuda attention done" | tee -a "$summary"
fi
# The Python benchmarks against torch on CUDA tensors, where torch with CUDA is installed (carry
# its wheel, see the device tool's README): attention vs SDPA's flash and cuDNN backends, and
# context parallelism's split on one device. Result files in $out, to copy into benchmarks/.
if [ "${WKV_DEVICE_PERF:-1}" = 1 ] && python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  for b in attention context_parallel; do
    WKV_LIBRARY=$build/libwkv.so PYTHONPATH=$root/bindings/python/src WKV_CUDA_ATTENTION=1 \
      python3 "$root/benchmarks/${b}_bench.py" --device cuda --out "$out/${b}-cuda.json" >>"$out/python_bench.log" 2>&1
    note "benchmarks/${b}_bench.py --device cuda: rc=$? ($out/${b}-cuda.json, python_bench.log)"
  done
else
  note "no torch with CUDA here: the Python benchmarks (attention vs SDPA, context parallelism) not run"
fi
# RWKV-6 and RWKV-4 anchors (issue 5): fwd+bwd B=8 T=4096, RWKV-6 H=32 N=64 bf16 (fla 7.29 ms),
# RWKV-4 C=2048 fp32 (fla 5.53 ms). WKV_DEVICE_PERF64=1 runs them even with WKV_DEVICE_PERF=0.
if [ "${WKV_DEVICE_PERF64:-${WKV_DEVICE_PERF:-1}}" = 1 ]; then
  p64() { "$bench" perf --backend cuda "$@" --repeat 5 --json >>"$perf" 2>>"$out/golden_bench.log" ||
          note "wkv-bench perf --backend cuda $* failed (golden_bench.log)"; }
  p64 --op rwkv6,rwkv4 --B 8 --T 4096 --H 32 --N 64 --dtype bf16
  # the RWKV-6 training step with the forward's checkpoints reused (fwd+save, bwd-reuse)
  p64 --op rwkv6 --B 8 --T 4096 --H 32 --N 64 --dtype bf16 --reuse
  p64 --op rwkv4 --B 8 --T 4096 --H 32 --N 64 --dtype f32
  stamp "wkv-bench perf cuda rwkv6/rwkv4 done" | tee -a "$summary"
fi

# ------------------------------------------------------------------------------- vulkan
# The Vulkan plugin is built on the development machine (glslang is not here) and carried in
# .vk/ with the Vulkan loader's .deb in .gl/ (see the header of this script).
if [ -d "$root/.vk" ]; then
  for f in "$root"/.gl/*.deb; do [ -f "$f" ] && dpkg -x "$f" /; done
  ldconfig 2>/dev/null
  icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  [ -f "$icd" ] && export VK_DRIVER_FILES=$icd
  vk=$root/.vk
  vkrun() { LD_LIBRARY_PATH=$vk WKV_GOLDEN_DIR=$root/tests/golden WKV_VULKAN_VALIDATION=0 "$@"; }
  {
    vkrun "$vk/wkv-bench" info
    for dt in f32 f16 bf16; do vkrun "$vk/wkv-bench" golden --backend vulkan --dtype "$dt" "$root"/tests/golden/*.safetensors; echo "rc=$?"; done
    vkrun "$vk/wkv_vulkan_tests"; echo "wkv_vulkan_tests rc=$?"
    [ -x "$vk/wkv_example_vulkan_engine" ] && { vkrun "$vk/wkv_example_vulkan_engine"; echo "vulkan engine example rc=$?"; }
    vkrun "$vk/wkv-bench" demo --backend vulkan; echo "vulkan demo rc=$?"
  } >"$out/vulkan.log" 2>&1
  note "vulkan: $(grep -c ' PASS ' "$out/vulkan.log") golden PASS, $(grep -c ' FAIL ' "$out/vulkan.log") FAIL; $(grep -E 'wkv_vulkan_tests rc|test cases:|engine example rc|demo rc' "$out/vulkan.log" | tr '\n' ' ')"
  grep -E '^  (backend|prefill|decode|check) ' "$out/vulkan.log" >>"$summary"
  if [ "${WKV_DEVICE_PERF:-1}" = 1 ]; then
    # the SM clock every 100 ms while Vulkan is timed: the H100 idles at ~345 MHz and a
    # Vulkan run timed before it ramps up reads ~5.5x slow (backends/vulkan/DESIGN.md, "Measuring")
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 100 >"$out/vulkan_clocks.csv" 2>&1 &
    clk=$!
    vb() { vkrun "$vk/wkv-bench" perf --backend vulkan "$@" --H 32 --N 64 --dtype f32 --repeat 5 --json >>"$perf" 2>>"$out/vulkan.log" ||
           note "wkv-bench perf --backend vulkan $* failed (vulkan.log)"; }
    vb --B 1,8 --T 4096 --pass forward
    vb --B 8 --T 512
    vb --B 1,64,256 --T 1 --pass forward
    # the same decode steps on an asynchronous context (WKV_CONTEXT_ASYNC): per step = loop / steps
    vb --B 1,64,256 --T 1 --pass forward --async
    vb --B 8 --T 4096 --pass backward --repeat 3
    vb --op rwkv6 --B 8 --T 4096
    # where the forward's per-token cost jumps with the tensors' footprint (backends/vulkan/
    # DESIGN.md, Forward): the knee in B at T=4096 and in T at B=8
    vb --B 2,4 --T 4096 --pass forward
    vb --B 8 --T 1024,2048 --pass forward
    # attention (the CUDA rows above are the same shapes): every configuration
    for D in 64 128; do for T in 1024 4096; do
      vkrun "$vk/wkv-bench" perf --op attention --backend vulkan --B 4 --T "$T" --H 32 --D "$D" --causal \
        --config all --repeat 5 --json >>"$perf" 2>>"$out/vulkan.log" || note "vulkan attention D=$D T=$T failed (vulkan.log)"
    done; done
    # its backward (bf16 and f32, the training shapes of BENCHMARKS.md's CPU attention table)
    for dt in bf16 f32; do
      vkrun "$vk/wkv-bench" perf --op attention --backend vulkan --B 4 --T 1024 --H 32 --D 64 --causal --dtype "$dt" \
        --pass backward --repeat 5 --json >>"$perf" 2>>"$out/vulkan.log" || note "vulkan attention backward $dt failed (vulkan.log)"
    done
    kill "$clk" 2>/dev/null
    note "vulkan perf SM clock (MHz): $(awk -F', ' '{print $2}' "$out/vulkan_clocks.csv" | sort -n | awk '{a[NR]=$1} END {if (NR) print "min " a[1] ", median " a[int((NR+1)/2)] ", max " a[NR] " over " NR " samples"}')"
  fi
  stamp "vulkan done" | tee -a "$summary"
fi

# ------------------------------------------------------------------------------- sanitizers
if [ "${WKV_DEVICE_QUICK:-0}" != 1 ]; then
  # memcheck, racecheck, initcheck, synccheck: one line each in the summary, a log each in $out
  # racecheck over the default case list takes ~145 s on the H100, the other tools ~15 s each
  OUT=$out WKV_SANITIZE_TIMEOUT=${WKV_SANITIZE_TIMEOUT:-60} WKV_SANITIZE_TIMEOUT_racecheck=${WKV_SANITIZE_TIMEOUT_racecheck:-200} \
    scripts/cuda_sanitize.sh "$build" >/dev/null 2>&1
  note "cuda_sanitize: rc=$?"
  cat "$out/sanitize-summary.txt" >>"$summary" 2>/dev/null
  stamp "sanitizers done" | tee -a "$summary"
fi

# ------------------------------------------------------------------------------- profile
# One launch each of the forward and backward kernels under Nsight Compute (B=8 T=1024).
if [ "${WKV_DEVICE_NCU:-1}" = 1 ] && command -v ncu >/dev/null 2>&1; then
  timeout 180 ncu --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats -k regex:rwkv7_ -c 2 \
    "$cbench" --B 8 --T 1024 --dtype bf16 --pass fwdbwd --repeat 1 --warmup 0 >"$out/ncu.txt" 2>&1
  note "ncu: rc=$? (ncu.txt)"
  grep -E "rwkv7_|Duration|Compute \(SM\) Throughput|Memory Throughput|Warp Cycles Per Issued|Issued Warp|No Eligible|Achieved Occupancy|Registers Per|Stall" "$out/ncu.txt" | head -40 >>"$summary"
fi

# ------------------------------------------------------------------------------- summary
echo
echo "==================== perf (median ms, CUDA events) ===================="
python3 - "$perf" <<'EOF' | tee -a "$summary"
import json, sys
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith("{"): continue
    r = json.loads(line)
    if r.get("op") == "attention":
        print(f"attn   {r['pass']:8s} {r['dtype']:4s} {r['backend']:6s} B={r['B']:<4} T={r['T']:<5} H={r['H']}/{r['kv_heads']} D={r['D']}"
              f"{' causal' if r['causal'] else '':7s} {r['config']:24s} {r['median_ms']:10.4f} ms (min {r['min_ms']:.4f})"
              f"  {r['tflops']:.3f} TFLOP/s")
        continue
    extra = (" graph" if r.get("graph") else "") + ("" if r.get("state", True) else " no-state")
    timing = r.get("timing", "wall") if "batch" not in r else f"{r['backend']} batch {r['batch']}"
    print(f"{r.get('op', ''):6s} {r['pass']:8s} {r['dtype']:4s} B={r['B']:<4} T={r['T']:<5} H={r['H']} N={r['N']}{extra:10s}"
          f" {r['median_ms']:10.4f} ms (min {r['min_ms']:.4f})  {r['gbps']:8.1f} GB/s"
          f"  host {r.get('host_us', float('nan')):.2f} us  [{timing}]")
EOF
echo "==================== summary ===================="
cat "$summary"
exit $ctest_rc
