#!/usr/bin/env bash
# The main job of the README: installs dependencies, builds, and runs libgdn's generation on the
# small trained Qwen3.5-architecture model the repository ships (models/gdn-tiny: copy, reverse
# and add digits; see tools/train_tiny/README.md), plain and with MTP speculative decoding.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >/dev/null
model=models/gdn-tiny
while IFS= read -r prompt; do
  printf '%s ' "$prompt"
  build/bin/gdn generate "$model" --prompt "$prompt" --max-tokens 16 2>/dev/null
done < "$model/eval/demo_prompts.txt"
echo
echo "== the same with MTP speculative decoding (k = 2), with timings on stderr:"
build/bin/gdn generate "$model" --prompt "reverse 12478 =" --max-tokens 16 --mtp 2
