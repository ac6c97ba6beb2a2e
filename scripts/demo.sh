#!/usr/bin/env bash
# The main job end to end on the bundled data: install, build, pack the bundled corpus (books and code
# repositories) into shards, inspect and verify them, train a tiny Qwen3-shaped model with the RSD
# objective (skip perturbation, reverse KL) for a few minutes on CPU, save a Hugging Face
# checkpoint, evaluate it by needle depth (RULER's single-needle task) and draw the figures.
# Idempotent: a second run repacks, retrains and re-evaluates from scratch.
#
#   scripts/demo.sh                      # output under runs/demo/
#   RSD_DEMO_OUT=/tmp/x RSD_DEMO_STEPS=50 scripts/demo.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
# shellcheck disable=SC1091
source .rsd-env
out="${RSD_DEMO_OUT:-runs/demo}"
steps="${RSD_DEMO_STEPS:-150}"
mkdir -p "$out"

echo "==> building (release)" >&2
# By binary name, not package: which crate holds a binary is not the demo's concern.
cargo build --release -q --bin rsd-data --bin rsd-train --bin rsd-model --bin rsd-eval
bin=target/release

echo "==> packing corpus/books and corpus/code into $out/shards (fixed mode, 512 tokens)" >&2
"$bin/rsd-data" pack --len 512 --src corpus/books --src corpus/code --out "$out/shards" --force
echo "==> inspect" >&2
"$bin/rsd-data" inspect "$out/shards" --sample 0 --chars 300
echo "==> verify" >&2
"$bin/rsd-data" verify "$out/shards"

echo "==> training configs/tiny-cpu.toml with the rsd objective for $steps steps" >&2
rm -rf "$out/train"
"$bin/rsd-train" --config configs/tiny-cpu.toml --shards "$out/shards" --out "$out/train" --steps "$steps"

echo "==> the trained checkpoint" >&2
final="$out/train/model"
"$bin/rsd-model" inspect "$final"

echo "==> evaluating by needle depth: niah_single_1 at 256 and 512 tokens, 5 depths, 2 samples each" >&2
# 16 new tokens hold the 7-digit answer. A model this small, trained this briefly, is not expected
# to retrieve anything: the demo shows the pipeline, not the method's effect (docs/EVAL.md).
rm -rf "$out/eval"
"$bin/rsd-eval" run --model "$final" --tasks niah_single_1 --lengths 256,512 --depths 5 \
  --samples 2 --seed 0 --max-new-tokens 16 --out "$out/eval" --quiet
"$bin/rsd-eval" plot "$out/eval"

echo
echo "shards:      $out/shards (index.json, shard-*.bin/.idx; megatron-core's IndexedDataset opens them too)"
echo "training:    $out/train (metrics.jsonl, summary.json, checkpoints/)"
echo "checkpoint:  $final (config.json + model.safetensors + the shards' tokenizer: loads in transformers, AutoTokenizer too)"
echo "evaluation:  $out/eval (results.jsonl, summary.md); figures: $out/eval/plots/accuracy_by_depth.png and the rest"
