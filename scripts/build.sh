#!/usr/bin/env bash
# Configures and builds libgdn into build/ (Release). The CUDA backend is compiled when nvcc is
# found (default /usr/local/cuda); it needs no GPU to build.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=${GDN_JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${GDN_CMAKE_ARGS:-} >/dev/null
cmake --build build -j "$jobs"
