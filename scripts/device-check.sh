#!/usr/bin/env bash
# The GPU check of the CUDA backend, in one run (docs/cuda.md): the kernel tests against the CPU
# reference, the whole model through Context on Backend::cuda against the CPU backend and
# transformers (tests/test_cuda_context.cpp, the same checks CI runs on the emulator), gdn doctor
# on the GPU, `gdn bench --backend cuda` on random-weight 0.8B- and 27B-shaped checkpoints against
# the HBM roofline, and the kernel benchmark (GDN chunked prefill TFLOP/s, components). Results go
# to $OUT (the folder whose files the device tool brings back), or /tmp/gdn-device-out.
#
# Two steps, because the GPU machine has no network and none of libgdn's Debian dependencies:
#
#   1. here, on the development machine:
#        scripts/device-check.sh --prepare [--with-wheels]
#      builds libgdn with its CUDA backend (sm_90a) in /tmp/gdn-build-device and puts into .device/
#      (ignored by git): the test and benchmark binaries with a stamp of the sources they were built
#      from, the shared libraries they need that the GPU machine lacks (fmt, PCRE2, utf8proc),
#      Catch2's header (for the fallback build), and with --with-wheels flash-linear-attention's and
#      FlashInfer's wheels.
#   2. on the GPU machine, through the device tool:
#        run(command="bash scripts/device-check.sh", carry=[".device"], timeout_s=600)
#      runs the carried binaries when their stamp matches the tree and they start there; otherwise
#      it builds the CUDA-only project (cmake -S cuda: kernel tests and kernel benchmark only; the
#      whole-model steps are then skipped and say so). About 5–7 minutes in all.
#
# It writes summary.md (a short report), device.json (every figure), and the logs tests.log,
# context.log, doctor.log, bench.log. Exit status 1 when a test failed or was skipped.
#
# Environment: GDN_DEVICE_BUILD=1 always builds on the device; GDN_DEVICE_SHAPES (0.8b,27b),
# GDN_DEVICE_BATCHES (1,8,32), GDN_DEVICE_CONTEXT (4096), GDN_DEVICE_PREFILL (512,8192).
set -uo pipefail
export LC_ALL=C  # the same glob order (and so the same source stamp) on both machines
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DEV="$ROOT/.device"
say() { printf '\n[%s] == %s\n' "$(date +%H:%M:%S)" "$*"; }

# The sources the binaries depend on, hashed: a carried build is used only for the same sources.
source_stamp() {
  git ls-files -co --exclude-standard -- CMakeLists.txt cmake cuda include src capi tests/CMakeLists.txt \
      tests/test_cuda_kernels.cpp tests/test_cuda_context.cpp tests/test_main.cpp tests/test_util.hpp tools/gdn 2>/dev/null |
    sort | while read -r f; do [[ -f "$f" ]] && { echo "$f"; cat "$f"; }; done | sha256sum | cut -c1-16
}

if [[ "${1:-}" == "--prepare" ]]; then
  set -e
  with_wheels=0
  [[ "${2:-}" == "--with-wheels" ]] && with_wheels=1
  rm -rf "$DEV/bin" "$DEV/lib"
  mkdir -p "$DEV/catch2" "$DEV/bin" "$DEV/lib"
  grep -qxF '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
  scripts/install-deps.sh
  cp /usr/include/catch2/catch.hpp "$DEV/catch2/"
  build=${GDN_DEVICE_BUILD_DIR:-/tmp/gdn-build-device}  # outside the tree: it must not travel
  say "building libgdn with the CUDA backend (sm_90a) in $build"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGDN_BUILD_PYTHON=OFF -DGDN_BUILD_EXAMPLES=OFF \
    -DCMAKE_CUDA_ARCHITECTURES=90a-real >/dev/null
  cmake --build "$build" -j "${GDN_JOBS:-$(nproc)}" \
    --target test_cuda_kernels test_cuda_emulated test_cuda_context test_cuda_context_emulated gdn_cli gdn_bench gdn_cuda_bench
  for b in test_cuda_kernels test_cuda_context gdn gdn-bench gdn_cuda_bench; do cp "$build/bin/$b" "$DEV/bin/"; done
  # Shared libraries the GPU machine's image lacks (not libc / libstdc++: theirs is newer).
  for b in "$DEV"/bin/*; do
    for lib in $(ldd "$b" | awk '/=> \// {print $3}' | grep -E 'libfmt|libpcre2|libutf8proc|libz\.' || true); do
      cp -L "$lib" "$DEV/lib/"
    done
  done
  source_stamp > "$DEV/bin/STAMP"
  say "last check here: the kernels and the whole model on the CPU emulator"
  "$build"/bin/test_cuda_emulated | tail -2
  "$build"/bin/test_cuda_context_emulated "~[tiny]" | tail -2
  if [[ $with_wheels == 1 ]]; then
    say "wheels → .device/wheels (flash-linear-attention, FlashInfer; Python 3.12, manylinux x86_64)"
    mkdir -p "$DEV/wheels"
    for spec in fla-core==0.6.0 flash-linear-attention==0.6.0 flashinfer-python==0.7.2.post1; do
      python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
        -d "$DEV/wheels" "$spec" || echo "  (could not fetch $spec: the comparison will skip it)"
    done
  fi
  du -sh "$DEV"
  say "ready: run(command=\"bash scripts/device-check.sh\", carry=[\".device\"], timeout_s=600)"
  exit 0
fi

# ------------------------------------------------------------------------------------------------
# On the GPU machine.
OUT=${OUT:-/tmp/gdn-device-out}
mkdir -p "$OUT"
status=0
SUMMARY="$OUT/summary.md"
JSON="$OUT/device.json"
echo "{" > "$JSON"
json() { printf '  "%s": %s,\n' "$1" "$2" >> "$JSON"; }
{
  echo "# Device check of the CUDA backend"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- tree: $(git rev-parse --short HEAD 2>/dev/null || echo unknown) + working tree, sources $(source_stamp)"
} > "$SUMMARY"

say "environment"
{
  echo
  echo '```'
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1 || echo "no nvidia-smi"
  nvcc --version 2>&1 | tail -2 || true
  echo "cores: $(nproc), memory: $(free -g | awk '/Mem:/ {print $2}') GiB, disk free: $(df -h /tmp | awk 'NR==2 {print $4}')"
  echo '```'
} | tee -a "$SUMMARY"

# cuBLASLt: the CUDA toolkit's, or the one PyTorch's wheels carry.
cublas=$(ls /usr/local/cuda/lib64/libcublasLt.so.13 2>/dev/null || find / -name 'libcublasLt.so.13' -not -path '*/proc/*' 2>/dev/null | head -1)
export LD_LIBRARY_PATH="$DEV/lib${cublas:+:$(dirname "$cublas")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GDN_SOURCE_DIR="$ROOT"  # the carried tests find the fixtures and models/gdn-tiny here

BIN="" WHOLE=0
if [[ "${GDN_DEVICE_BUILD:-0}" != 1 && -f "$DEV/bin/STAMP" && "$(cat "$DEV/bin/STAMP")" == "$(source_stamp)" ]]; then
  say "trying the carried binaries (built from these sources)"
  probe_tests=$(timeout 60 "$DEV/bin/test_cuda_kernels" --list-test-names-only 2>&1 || true)
  probe_ctx=$(timeout 60 "$DEV/bin/test_cuda_context" --list-test-names-only 2>&1 || true)
  if [[ $probe_tests == *"CUDA causal conv1d"* && $probe_ctx == *"CUDA backend"* ]]; then
    BIN="$DEV/bin" WHOLE=1
    echo "- binaries: carried, built on the development machine (libgdn with the CUDA backend)" >> "$SUMMARY"
  else
    echo "  they do not run here:"; echo "$probe_tests" | tail -3; echo "$probe_ctx" | tail -3
  fi
fi
if [[ -z "$BIN" ]]; then
  say "building the CUDA-only project for sm_90a (kernel tests and kernel benchmark; no whole-model steps)"
  catch_dir=""
  [[ -f "$DEV/catch2/catch.hpp" ]] && catch_dir="$DEV"
  [[ -z "$catch_dir" && -f /usr/include/catch2/catch.hpp ]] && catch_dir=/usr/include
  if [[ -z "$catch_dir" ]]; then
    echo "no catch2/catch.hpp: run scripts/device-check.sh --prepare first and carry .device" | tee -a "$SUMMARY"
    exit 1
  fi
  gen=(-G "Unix Makefiles")
  command -v ninja >/dev/null && gen=(-G Ninja)
  BUILD=/tmp/gdn-device-build
  if ! { timeout 120 cmake -S cuda -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
           -DGDN_CATCH2_DIR="$catch_dir" &&
         timeout 420 cmake --build "$BUILD" -j "$(nproc)" --target test_cuda_kernels gdn_cuda_bench; } \
       > "$OUT/bench.log" 2>&1; then
    tail -40 "$OUT/bench.log"
    echo "- build: FAILED (bench.log)" >> "$SUMMARY"
    exit 1
  fi
  BIN="$BUILD/bin"
  echo "- binaries: built on the device (CUDA-only project); the whole-model steps were SKIPPED" >> "$SUMMARY"
  status=1
fi

say "1. kernel tests against the CPU reference (tolerances are printed beside each measured difference)"
if timeout 300 "$BIN/test_cuda_kernels" > "$OUT/tests.log" 2>&1; then
  echo "- kernel tests: passed ($(grep -E '^(All tests passed|test cases)' "$OUT/tests.log" | tail -1))" >> "$SUMMARY"
  json kernel_tests '"passed"'
else
  status=1
  echo "- kernel tests: FAILED ($(grep -E '^test cases' "$OUT/tests.log" | tail -1)), see tests.log" >> "$SUMMARY"
  json kernel_tests '"failed"'
fi
grep -q "SKIPPED" "$OUT/tests.log" && { echo "- WARNING: kernel tests skipped: no device seen" >> "$SUMMARY"; status=1; }

if [[ $WHOLE == 1 ]]; then
  say "2. the whole model through Context on the GPU vs the CPU backend and transformers"
  if timeout 240 "$BIN/test_cuda_context" -d yes > "$OUT/context.log" 2>&1; then
    echo "- whole-model parity: passed ($(grep -E '^(All tests passed|test cases)' "$OUT/context.log" | tail -1))" >> "$SUMMARY"
    json whole_model '"passed"'
  else
    status=1
    echo "- whole-model parity: FAILED ($(grep -E '^test cases' "$OUT/context.log" | tail -1)), see context.log" >> "$SUMMARY"
    json whole_model '"failed"'
  fi
  grep -q "SKIPPED" "$OUT/context.log" && { echo "- WARNING: whole-model tests skipped: $(grep -m1 SKIPPED "$OUT/context.log")" >> "$SUMMARY"; status=1; }
  { echo; echo "Measured (context.log):"; echo '```'; grep -E "CUDA rms error|MTP head vs|gdn-tiny on CUDA" -A1 "$OUT/context.log" | grep -v "^--" | head -30; echo '```'; } >> "$SUMMARY"

  say "3. gdn doctor --backend cuda"
  : > "$OUT/doctor.log"
  for m in models/gdn-tiny tests/fixtures/models/qwen35_cond_mtp; do
    timeout 120 "$BIN/gdn" doctor "$m" --backend cuda --quick >> "$OUT/doctor.log" 2>&1
    rc=$?
    echo "- gdn doctor --backend cuda $m: exit $rc ($(grep -E '^summary' "$OUT/doctor.log" | tail -1))" >> "$SUMMARY"
    [[ $rc == 0 ]] || status=1
  done

  say "4. gdn bench --backend cuda (whole model, HBM roofline)"
  : > "$OUT/bench.log"
  IFS=, read -r -a shapes <<< "${GDN_DEVICE_SHAPES:-0.8b,27b}"
  for shape in "${shapes[@]}"; do
    limit=150
    [[ $shape == 27b ]] && limit=270
    if timeout $limit "$BIN/gdn-bench" --backend cuda --shape "$shape" --cache /tmp/gdn-models \
         --batches "${GDN_DEVICE_BATCHES:-1,8,32}" --context "${GDN_DEVICE_CONTEXT:-4096}" \
         --prefill "${GDN_DEVICE_PREFILL:-512,8192}" --json "/tmp/bench_$shape.json" >> "$OUT/bench.log" 2>&1; then
      json "bench_$shape" "$(cat "/tmp/bench_$shape.json")"
      { echo; echo "### gdn bench --backend cuda --shape $shape"; echo '```'; grep -A30 "shape\|gdn bench --backend cuda: " "$OUT/bench.log" | grep -E "^  |gdn bench" | tail -16; echo '```'; } >> "$SUMMARY"
    else
      status=1
      echo "- gdn bench --backend cuda --shape $shape: FAILED or timed out (bench.log)" >> "$SUMMARY"
    fi
  done
fi

say "5. kernel benchmark: GDN chunked prefill (TFLOP/s) and the decode step's components"
mkdir -p /tmp/gdn-kernel-bench
if timeout 200 "$BIN/gdn_cuda_bench" --shapes "${GDN_DEVICE_SHAPES:-0.8b,27b}" --batches 1 \
     --context "${GDN_DEVICE_CONTEXT:-4096}" --prefill 8192 --out /tmp/gdn-kernel-bench >> "$OUT/bench.log" 2>&1; then
  json kernel_bench "$(cat /tmp/gdn-kernel-bench/bench.json 2>/dev/null || echo null)"
  { echo; echo "## Kernel benchmark"; echo; cat /tmp/gdn-kernel-bench/bench.md; } >> "$SUMMARY"
else
  status=1
  echo "- kernel benchmark: FAILED (bench.log)" >> "$SUMMARY"
fi

# Optional: flash-linear-attention's and FlashInfer's chunked GDN on the same shapes, when wheels
# were carried (no network here), each in its own process with a time limit.
if compgen -G "$DEV/wheels/*.whl" >/dev/null; then
  say "6. reference GDN prefill kernels from the carried wheels"
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$DEV"/wheels/*.whl; then
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    for lib in fla flashinfer; do
      timeout 120 python3 scripts/gdn_reference_prefill.py "$lib" "${GDN_DEVICE_SHAPES:-0.8b,27b}" 8192 >> /tmp/reference.json 2>> "$OUT/bench.log" ||
        echo "{\"library\": \"$lib\", \"skipped\": true}" >> /tmp/reference.json
    done
    json reference_prefill "[$(paste -sd, /tmp/reference.json)]"
    { echo; echo "## Reference GDN prefill (same shapes, one layer)"; echo '```'; cat /tmp/reference.json; echo '```'; } >> "$SUMMARY"
  fi
fi

printf '  "status": %d\n}\n' "$status" >> "$JSON"
say "done: $(ls "$OUT" | tr '\n' ' ')"
cat "$SUMMARY"
exit $status
