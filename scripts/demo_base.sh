#!/usr/bin/env bash
# The demo's base model, assets/miniature-base/, made again from nothing: base 4 of the
# miniature study (docs/RESULTS.md, attempt 4), trained by `scripts/miniature.sh`'s own recipe
# with its recorded seeds (--init-seed 14, stage 1 --seed 14, block k of each stage --seed 400+k),
# then checked against the bundled weights' sha256 (assets/miniature-base/SHA256SUMS).
#
#   scripts/demo_base.sh            # into runs/demo-base/ (~30 min on 2 cores), then compare
#                                   # its weights with the bundled ones: exit 1 if they differ
#   scripts/demo_base.sh --write    # the same, then (re)write assets/miniature-base/ from it
#
# The weights are bit-for-bit the same on a machine of this kind (x86-64, PyPI torch 2.13.0, 2
# threads): training is deterministic for a given thread count (the batches, the perturbations
# and the initialisation all come from the seeds; libtorch's CPU kernels reduce in a fixed
# order for a fixed number of threads). Another thread count (RSD_MINI_THREADS) or another
# torch build may change the last bits, and then the sha256.
#
# Environment: RSD_DEMO_BASE_OUT (where it trains, default runs/demo-base), RSD_DEMO_BASE_ASSETS
# (the bundle, default assets/miniature-base); RSD_MINI_BIN and the other RSD_MINI_* settings of
# scripts/miniature.sh pass through (a toy-size run: tests/test_demo.py).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

write=""
case "${1:-}" in
  --write) write=1 ;;
  "") ;;
  -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: scripts/demo_base.sh [--write]" >&2; exit 2 ;;
esac

out="${RSD_DEMO_BASE_OUT:-runs/demo-base}"
bundle="${RSD_DEMO_BASE_ASSETS:-assets/miniature-base}"
# Base 4 of the study, alone: a base that missed the bar is not replaced here (one try).
export RSD_MINI_OUT="$out" RSD_MINI_BASES=4 RSD_MINI_MAX_BASE_TRIES=1
bash scripts/miniature.sh data
bash scripts/miniature.sh bases

model="$out/base-4/model"
# What the sha256 covers: the weights and the architecture, nothing that names a path.
digests() { (cd "$1" && sha256sum model.safetensors config.json); }

if [ -n "$write" ]; then
  mkdir -p "$bundle"
  cp -L "$model/model.safetensors" "$model/config.json" "$model/rsd_training.json" "$bundle/"
  cp assets/tokenizers/mini-1k/tokenizer.json "$bundle/tokenizer.json"
  cp "$out/base-4/base.json" "$out/base-4/bar.md" "$bundle/"
  digests "$bundle" > "$bundle/SHA256SUMS.tmp"
  mv "$bundle/SHA256SUMS.tmp" "$bundle/SHA256SUMS"
  echo "written: $bundle"
  cat "$bundle/SHA256SUMS"
  exit 0
fi

[ -f "$bundle/SHA256SUMS" ] || { echo "demo_base: $bundle/SHA256SUMS: missing (--write makes it)" >&2; exit 1; }
if diff <(digests "$model") "$bundle/SHA256SUMS"; then
  echo "the regenerated base equals the bundled one, bit for bit ($bundle/SHA256SUMS)"
else
  echo "demo_base: the regenerated base ($model) differs from the bundled one ($bundle/SHA256SUMS);" \
    "another torch build or thread count changes the last bits: see the header of this script" >&2
  exit 1
fi
