#!/usr/bin/env bash
# The main job of the README: installs dependencies, builds, and runs a model shipped in the
# repository through libgdn.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >/dev/null
model=tests/fixtures/models/qwen35_cond_mtp
echo "== gdn info $model"
build/bin/gdn info "$model"
echo "== gdn logits $model --tokens 1,2,3 (first 8 of each row)"
build/bin/gdn logits "$model" --tokens 1,2,3 | cut -d' ' -f1-8
