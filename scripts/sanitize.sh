#!/usr/bin/env bash
# Sanitizer builds (GCC, CUDA backend off):
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer (-O1), then the whole ctest suite, except
#         the tests that load the instrumented library into another program's runtime (the Python
#         module and ctypes tests, the examples run from Python, the out-of-tree install consumer):
#         those need the ASan runtime preloaded and are covered by the normal build. The suite runs
#         the gdn tool's commands too (ctest label cli: info, logits, generate and doctor --quick on
#         models/gdn-tiny, bench --quick on a fixture), so the tool's allocator stays ASan's own.
#   tsan  ThreadSanitizer (-O1), then the concurrency tests (ctest label "concurrency").
# Any sanitizer report fails the test that triggered it (halt_on_error / -fno-sanitize-recover).
#
#   scripts/sanitize.sh [asan|tsan|all]     build folders: $GDN_ASAN_BUILD (build-asan),
#                                           $GDN_TSAN_BUILD (build-tsan); GDN_JOBS parallel jobs
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
jobs=${GDN_JOBS:-$(nproc)}
common=(-G Ninja -DCMAKE_BUILD_TYPE=Debug -DGDN_CUDA=OFF -DGDN_BUILD_PYTHON=OFF)
# Tests that run the library inside Python or an external build (see above), and the 27B-shaped
# sparse step (tens of GB of zero pages through the mapping: minutes under ASan, and the same code the
# small models run here).
asan_exclude='^(python_|example_python|examples_agree|install_consumer|gdn_cli_27b_sparse$)'

if [ "$what" = asan ] || [ "$what" = all ]; then
  build=${GDN_ASAN_BUILD:-build-asan}
  flags="-O1 -g1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined"
  cmake -S . -B "$build" "${common[@]}" -DCMAKE_C_FLAGS_DEBUG="$flags" -DCMAKE_CXX_FLAGS_DEBUG="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
    >/dev/null
  cmake --build "$build" -j "$jobs"
  ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$build" --output-on-failure -j "$jobs" -E "$asan_exclude"
fi

if [ "$what" = tsan ] || [ "$what" = all ]; then
  build=${GDN_TSAN_BUILD:-build-tsan}
  flags="-O1 -g1 -fno-omit-frame-pointer -fsanitize=thread"
  cmake -S . -B "$build" "${common[@]}" -DGDN_BUILD_EXAMPLES=OFF -DGDN_BUILD_TOOLS=OFF \
    -DCMAKE_C_FLAGS_DEBUG="$flags" -DCMAKE_CXX_FLAGS_DEBUG="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" >/dev/null
  # Only what the concurrency tests need.
  mapfile -t targets < <(ctest --test-dir "$build" -N -L concurrency 2>/dev/null | sed -nE 's/^ *Test +#[0-9]+: +(\S+)$/\1/p')
  if ((${#targets[@]} == 0)); then echo "sanitize: no tests labelled concurrency"; exit 1; fi
  cmake --build "$build" -j "$jobs" --target "${targets[@]}"
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    ctest --test-dir "$build" --output-on-failure -j "$jobs" -L concurrency
fi
