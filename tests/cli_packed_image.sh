#!/usr/bin/env bash
# gdn pack, then every load maps the image: gdn logits from it equals --pack and --in-place bit for
# bit, `gdn info` says so, and a damaged image is refused with one line and the checkpoint used.
#   cli_packed_image.sh GDN MODEL_DIR WORK_DIR
set -euo pipefail
gdn=$1 src=$2 work=$3
rm -rf "$work" && mkdir -p "$work" && cp -r "$src" "$work/model"
m="$work/model"
if ! "$gdn" pack "$m" > "$work/pack.txt" 2>&1; then
  if grep -q "reads the weights in place" "$work/pack.txt"; then echo "SKIPPED: this CPU's kernel reads no image"; exit 77; fi
  cat "$work/pack.txt"; exit 1
fi
cat "$work/pack.txt"
"$gdn" info "$m" | tee "$work/info.txt" | grep -q "mapped from the packed image"
"$gdn" logits "$m" --tokens 1,2,3,4,5 --stats > "$work/image.txt" 2> "$work/image.err"
grep -q "weights image" "$work/image.err"
"$gdn" logits "$m" --tokens 1,2,3,4,5 --pack --stats > "$work/packed.txt" 2> "$work/packed.err"
# --pack packs at load although the image is there.
grep -q "weights packed" "$work/packed.err"
"$gdn" logits "$m" --tokens 1,2,3,4,5 --in-place > "$work/in_place.txt"
cmp "$work/image.txt" "$work/packed.txt"
cmp "$work/image.txt" "$work/in_place.txt"
# Damaged: one byte of the header's JSON.
img=$(ls "$m"/gdn-packed.*.gdnimg)
printf 'X' | dd of="$img" bs=1 seek=40 conv=notrunc status=none
"$gdn" logits "$m" --tokens 1,2,3,4,5 > "$work/fallback.txt" 2> "$work/fallback.err"
grep -q "not using the packed image.*checksum mismatch" "$work/fallback.err"
cmp "$work/image.txt" "$work/fallback.txt"
echo "packed image: mapped == packed == in place; a corrupt one refused and the checkpoint used"
