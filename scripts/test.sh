#!/usr/bin/env bash
# The test command of the README: installs dependencies, builds, runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure -j "${GDN_JOBS:-$(nproc)}"
