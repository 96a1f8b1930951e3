#!/usr/bin/env bash
# Reproduces docs/performance.md: builds libgdn (Release), installs llama-cpp-python in a venv
# (first run only: pip builds llama.cpp from its source distribution, which takes a while), then
# runs `gdn bench` with llama.cpp as its peer on the same random-weight checkpoint, and plots it.
#
#   bench/run.sh                  # Qwen3.5-0.8B shape, all cores
#   SHAPE=2b bench/run.sh         # the 2B shape
#   bench/run.sh --runs 7         # extra arguments go to gdn bench
#
# Environment: BUILD (default build/), VENV (default ~/venv-bench), THREADS (default: all cores),
# SHAPE (0.8b | 2b). Outputs: $BUILD/bench/bench-$SHAPE.{json,txt} and docs/performance-$SHAPE.png.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build}
VENV=${VENV:-$HOME/venv-bench}
THREADS=${THREADS:-$(nproc)}
SHAPE=${SHAPE:-0.8b}
OUT=$BUILD/bench

cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target gdn_cli
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q numpy gguf matplotlib
if ! "$VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
  CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$VENV/bin/pip" install --no-binary llama-cpp-python "llama-cpp-python==0.3.36"
fi
mkdir -p "$OUT"
"$BUILD/bin/gdn" bench --shape "$SHAPE" --cache "${CACHE:-$BUILD/bench-models}" --threads "$THREADS" \
  --json "$OUT/bench-$SHAPE.json" --peer-python "$VENV/bin/python" --peer-script "$ROOT/bench/peer.py" "$@" \
  | tee "$OUT/bench-$SHAPE.txt"
"$VENV/bin/python" "$ROOT/bench/plot.py" "$OUT/bench-$SHAPE.json" "$ROOT/docs/performance-$SHAPE.png"
