#!/usr/bin/env bash
# The GPU check of the CUDA backend, in one run (docs/cuda.md): build the kernels, run their test
# suite against the CPU reference, benchmark the decode step and GDN prefill at 0.8B and 27B
# shapes against the HBM roofline, and, where their wheels were carried, time flash-linear-
# attention's and FlashInfer's chunked GDN on the same shapes. Results go to $OUT (the folder
# whose files the device tool brings back), or to /tmp/gdn-device-out when OUT is unset.
#
# Two steps, because the GPU machine has no network and none of libgdn's Debian dependencies:
#
#   1. here, on the development machine:
#        scripts/device-check.sh --prepare [--with-wheels]
#      builds the CUDA-only project (cmake -S cuda) and puts into .device/ (ignored by git):
#      Catch2's header, the three test/benchmark binaries with a stamp of the sources they were
#      built from, and with --with-wheels the flash-linear-attention and FlashInfer wheels.
#   2. on the GPU machine, through the device tool:
#        run(command="bash scripts/device-check.sh", carry=[".device"], timeout_s=600)
#      uses the carried binaries when their stamp matches the tree (else builds there, ~3 min on
#      16 cores), then tests, benchmarks and compares. About 3–6 minutes in all.
#
# Environment: GDN_DEVICE_BUILD=1 always builds on the device; GDN_DEVICE_SHAPES (default
# 0.8b,27b), GDN_DEVICE_BATCHES (1,8,32), GDN_DEVICE_CONTEXT (4096), GDN_DEVICE_PREFILL (4096).
set -euo pipefail
export LC_ALL=C  # the same glob order (and so the same source stamp) on both machines
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DEV="$ROOT/.device"
say() { printf '\n[%s] == %s\n' "$(date +%H:%M:%S)" "$*"; }

# The sources the binaries depend on, hashed: a carried build is used only for the same sources.
source_stamp() {
  { cat cuda/CMakeLists.txt cuda/*.cu cuda/*.cuh cuda/*.hpp cuda/*.cpp tests/test_cuda_kernels.cpp tests/test_main.cpp \
      include/gdn/layers/*.hpp include/gdn/backend/cpu/*.hpp include/gdn/runtime/sampling.hpp 2>/dev/null || true; } |
    sha256sum | cut -c1-16
}

if [[ "${1:-}" == "--prepare" ]]; then
  with_wheels=0
  [[ "${2:-}" == "--with-wheels" ]] && with_wheels=1
  mkdir -p "$DEV/catch2" "$DEV/bin"
  grep -qxF '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
  say "Catch2 header → .device/catch2"
  if [[ ! -f /usr/include/catch2/catch.hpp ]]; then
    apt-get install -y catch2 >/dev/null
  fi
  cp /usr/include/catch2/catch.hpp "$DEV/catch2/"
  build=${GDN_DEVICE_BUILD_DIR:-/tmp/gdn-build-device}  # outside the tree: it must not travel
  say "building the CUDA-only project (sm_90a + compute_90 PTX) in $build"
  cmake -S cuda -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGDN_CATCH2_DIR="$DEV" >/dev/null
  cmake --build "$build" -j "${GDN_JOBS:-$(nproc)}" --target test_cuda_kernels test_cuda_emulated gdn_cuda_bench
  cp "$build"/bin/test_cuda_kernels "$build"/bin/test_cuda_emulated "$build"/bin/gdn_cuda_bench "$DEV/bin/"
  source_stamp > "$DEV/bin/STAMP"
  say "the kernels on the CPU emulator here, as a last check before the device run"
  "$build"/bin/test_cuda_emulated | tail -3
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
  cmake --version 2>&1 | head -1 || true
  echo "cores: $(nproc)"
  echo '```'
} | tee -a "$SUMMARY"

BIN=""
if [[ "${GDN_DEVICE_BUILD:-0}" != 1 && -x "$DEV/bin/test_cuda_kernels" && -f "$DEV/bin/STAMP" && "$(cat "$DEV/bin/STAMP")" == "$(source_stamp)" ]]; then
  say "trying the carried binaries (built from these sources)"
  # Each must load its libraries and answer: the bench refuses a bad flag, the tests list themselves.
  probe_bench=$(timeout 60 "$DEV/bin/gdn_cuda_bench" --bad-flag 2>&1 || true)
  probe_tests=$(timeout 60 "$DEV/bin/test_cuda_kernels" --list-test-names-only 2>&1 || true)
  if [[ $probe_bench == *"unknown argument"* && $probe_tests == *"CUDA causal conv1d"* ]]; then
    BIN="$DEV/bin"
    echo "- binaries: carried, built on the development machine" >> "$SUMMARY"
  else
    echo "  they do not run here; building instead"
  fi
fi
if [[ -z "$BIN" ]]; then
  say "building the CUDA-only project for sm_90a"
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
         timeout 420 cmake --build "$BUILD" -j "$(nproc)" --target test_cuda_kernels test_cuda_emulated gdn_cuda_bench; } \
       > "$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"
    echo "- build: FAILED (build.log)" >> "$SUMMARY"
    exit 1
  fi
  tail -3 "$OUT/build.log"
  BIN="$BUILD/bin"
  echo "- binaries: built on the device (build.log)" >> "$SUMMARY"
fi

say "kernel tests against the CPU reference (tolerances are printed beside each measured difference)"
if timeout 300 "$BIN/test_cuda_kernels" 2>&1 | tee "$OUT/tests.log"; then
  echo "- kernel tests on the GPU: passed ($(grep -E '^(All tests passed|test cases)' "$OUT/tests.log" | tail -1))" >> "$SUMMARY"
else
  status=1
  echo "- kernel tests on the GPU: FAILED ($(grep -E '^test cases' "$OUT/tests.log" | tail -1)), see tests.log" >> "$SUMMARY"
fi
grep -q "SKIPPED" "$OUT/tests.log" && { echo "- WARNING: tests skipped: no device seen" >> "$SUMMARY"; status=1; }
if timeout 120 "$BIN/test_cuda_emulated" > /tmp/gdn-emulated.log 2>&1; then
  echo "- the same tests on the CPU emulator: passed" >> "$SUMMARY"
else
  echo "- the same tests on the CPU emulator: FAILED" >> "$SUMMARY"
  { echo '```'; tail -30 /tmp/gdn-emulated.log; echo '```'; } >> "$SUMMARY"
  status=1
fi

say "benchmark: decode step (CUDA graph) and GDN prefill vs the HBM roofline"
shapes=${GDN_DEVICE_SHAPES:-0.8b,27b}
if timeout 300 "$BIN/gdn_cuda_bench" --shapes "$shapes" --batches "${GDN_DEVICE_BATCHES:-1,8,32}" \
     --context "${GDN_DEVICE_CONTEXT:-4096}" --prefill "${GDN_DEVICE_PREFILL:-4096}" --out "$OUT" 2>&1 | tee /tmp/gdn-bench.log; then
  { echo; echo "## Benchmark"; echo; cat "$OUT/bench.md"; } >> "$SUMMARY"
else
  status=1
  { echo "- benchmark: FAILED:"; echo '```'; tail -20 /tmp/gdn-bench.log; echo '```'; } >> "$SUMMARY"
fi

# Optional: flash-linear-attention's and FlashInfer's chunked GDN on the same shapes, when wheels
# were carried (no network here). Each runs in its own process with a time limit and is skipped
# cleanly when it cannot be imported or run.
if compgen -G "$DEV/wheels/*.whl" >/dev/null; then
  say "reference kernels from the carried wheels"
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$DEV"/wheels/*.whl; then
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    cat > /tmp/gdn_reference_bench.py <<'PY'
import json, sys, time
import torch
which, shapes, T = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
cfg = {"0.8b": (16, 16), "27b": (16, 48)}  # (key heads, value heads); dk = dv = 128
def timed(f, iters=10):
    f(); torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters): f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e3
for name in shapes:
    if name not in cfg: continue
    Hk, Hv = cfg[name]
    for nseq in (1, 4):
        per = T // nseq
        cu = torch.arange(0, nseq + 1, device="cuda", dtype=torch.int32) * per
        n = per * nseq
        q = torch.randn(n, Hk, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(n, Hk, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(n, Hv, 128, device="cuda", dtype=torch.bfloat16)
        g = -torch.rand(n, Hv, device="cuda", dtype=torch.float32)  # log decay
        beta = torch.rand(n, Hv, device="cuda", dtype=torch.float32)
        h0 = torch.zeros(nseq, Hv, 128, 128, device="cuda", dtype=torch.float32)
        if which == "fla":
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule
            qq, kk = q, k
            try:
                f = lambda: chunk_gated_delta_rule(qq[None], kk[None], v[None], g[None], beta[None].to(torch.bfloat16),
                                                   initial_state=h0, output_final_state=True, cu_seqlens=cu.long(),
                                                   use_qk_l2norm_in_kernel=True)
                f()
            except Exception:  # older FLA: no grouped value heads, repeat q/k
                qq, kk = q.repeat_interleave(Hv // Hk, 1), k.repeat_interleave(Hv // Hk, 1)
                f = lambda: chunk_gated_delta_rule(qq[None], kk[None], v[None], g[None], beta[None].to(torch.bfloat16),
                                                   initial_state=h0, output_final_state=True, cu_seqlens=cu.long(),
                                                   use_qk_l2norm_in_kernel=True)
        else:
            from flashinfer.gdn_prefill import chunk_gated_delta_rule
            alpha = torch.exp(g)
            f = lambda: chunk_gated_delta_rule(q, k, v, alpha, beta, initial_state=h0, output_final_state=True,
                                               cu_seqlens=cu.long(), use_qk_l2norm_in_kernel=True)
        ms = timed(f)
        print(json.dumps({"kind": "gdn_prefill_reference", "library": which, "shape": name, "tokens": n,
                          "sequences": nseq, "ms": round(ms, 4), "tokens_per_s": round(n / ms * 1e3)}), flush=True)
PY
    for lib in fla flashinfer; do
      echo "  $lib:"
      if timeout 240 python3 /tmp/gdn_reference_bench.py "$lib" "$shapes" "${GDN_DEVICE_PREFILL:-4096}" >> "$OUT/reference.json" 2>> /tmp/gdn-reference.log; then
        echo "  $lib: done"
      else
        echo "  $lib: skipped:"; tail -5 /tmp/gdn-reference.log
        echo "{\"kind\": \"gdn_prefill_reference\", \"library\": \"$lib\", \"skipped\": true}" >> "$OUT/reference.json"
      fi
    done
    { echo; echo "## Reference GDN prefill (same shapes, one layer)"; echo; echo '```'; cat "$OUT/reference.json"; echo '```'; } >> "$SUMMARY"
  else
    echo "- reference wheels: could not be installed, comparison skipped" >> "$SUMMARY"
  fi
else
  say "no wheels carried (.device/wheels): flash-linear-attention / FlashInfer comparison skipped"
  echo "- flash-linear-attention / FlashInfer comparison: skipped (no wheels carried)" >> "$SUMMARY"
fi

say "done: $(ls "$OUT" | tr '\n' ' ')"
cat "$SUMMARY"
exit $status
