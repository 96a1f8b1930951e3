#!/usr/bin/env bash
# Fuzzing: builds the libFuzzer targets of tests/fuzz (clang, ASan + UBSan, -DGDN_FUZZ=ON) in
# $GDN_FUZZ_BUILD (default build-fuzz/) and runs each for SECONDS (default 30) from its committed
# seed corpus tests/fuzz/corpus/<target>/ (new inputs go to the build folder, never into the tree).
# Any crash, sanitizer report, leak, timeout (> 10 s for one input) or out-of-memory (> 2 GB) fails
# the script; the input that caused it is kept as $GDN_FUZZ_BUILD/artifacts/<target>-crash-*, and
# `$GDN_FUZZ_BUILD/bin/<target> <that file>` replays it.
#
#   scripts/fuzz.sh [SECONDS]         GDN_FUZZ_TARGETS="fuzz_config ..." runs only those;
#                                     GDN_JOBS targets run at once (one core each)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
build=${GDN_FUZZ_BUILD:-build-fuzz}
jobs=${GDN_JOBS:-$(nproc)}

# libFuzzer ships with clang's compiler-rt.
need=()
command -v clang++ >/dev/null 2>&1 || need+=(clang)
ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 || need+=(libclang-rt-dev)
if ((${#need[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "fuzz: installing ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

cmake -S . -B "$build" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only" -DGDN_CUDA=OFF -DGDN_FUZZ=ON \
  -DGDN_BUILD_TESTS=OFF -DGDN_BUILD_TOOLS=OFF -DGDN_BUILD_EXAMPLES=OFF -DGDN_BUILD_PYTHON=OFF >/dev/null
cmake --build "$build" -j "$jobs" --target gdn_fuzzers

read -r -a targets <<< "${GDN_FUZZ_TARGETS:-$(tr '\n' ' ' < "$build/fuzz_targets.txt")}"
mkdir -p "$build/artifacts" "$build/fuzz-logs"

run_one() {  # target -> log; exit status of libFuzzer
  local t=$1
  mkdir -p "$build/fuzz-corpus/$t"
  "$build/bin/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -dict="tests/fuzz/dicts/$t.dict" -artifact_prefix="$build/artifacts/$t-" \
    "$build/fuzz-corpus/$t" "tests/fuzz/corpus/$t" >"$build/fuzz-logs/$t.log" 2>&1
}

report() {  # target exit-status -> one line; returns 1 on a finding
  local t=$1 rc=$2 log="$build/fuzz-logs/$1.log" status execs rate
  # The last status line carries coverage (cov), features (ft) and the corpus size.
  status=$(grep -E '^#[0-9]+' "$log" | tail -n 1 | sed -E 's/^#([0-9]+)\s+\S+\s+(cov: [0-9]+ ft: [0-9]+ corp: \S+).*/\2/' || true)
  execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$log" || true)
  rate=$(sed -nE 's/^stat::average_exec_per_sec: *([0-9]+)/\1/p' "$log" || true)
  if [ "$rc" -ne 0 ]; then
    echo "fuzz: $t FAILED (exit $rc) after ${execs:-?} runs; log: $log"
    grep -E 'ERROR|SUMMARY|fuzz check failed|runtime error|Test unit written|ParseDictionaryFile' "$log" | head -n 20 || true
    return 1
  fi
  # The seeds alone reach well over a thousand edges of the library; a few dozen means only the
  # harness is instrumented (the build lost the library's flags) and the run proves nothing.
  local edges
  edges=$(sed -nE 's/^cov: ([0-9]+).*/\1/p' <<< "$status")
  if [ "${edges:-0}" -lt 300 ]; then
    echo "fuzz: $t FAILED: only ${edges:-0} edges covered; is the library built with -fsanitize=fuzzer-no-link?"
    return 1
  fi
  echo "fuzz: $t ok: ${execs:-?} runs in ${secs}s (${rate:-?}/s), $status"
}

failed=0
pending=("${targets[@]}")
while ((${#pending[@]})); do
  batch=("${pending[@]:0:$jobs}")
  pending=("${pending[@]:$jobs}")
  pids=()
  for t in "${batch[@]}"; do
    run_one "$t" &
    pids+=($!)
  done
  for i in "${!batch[@]}"; do
    rc=0
    wait "${pids[$i]}" || rc=$?
    report "${batch[$i]}" "$rc" || failed=1
  done
done
exit "$failed"
