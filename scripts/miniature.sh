#!/usr/bin/env bash
# A miniature of the paper on CPU: tiny models trained from scratch at 256 tokens, adapted to 1024
# tokens once with the standard objective and once with rsd (same tokens, same seed), then
# evaluated by needle depth at 1024 and beyond it (2048 tokens with YaRN applied at evaluation
# only), for several seeds. Writes the comparison tables and figures; docs/RESULTS.md reports a run.
#
#   scripts/miniature.sh                          # runs/miniature/, 3 seeds
#   RSD_MINI_SEEDS=0 RSD_MINI_PRETRAIN_STEPS=100 RSD_MINI_ADAPT_STEPS=20 scripts/miniature.sh
#   (also RSD_MINI_OUT; RSD_MINI_SAMPLES, RSD_MINI_DEPTHS: evaluation items per length and depth, and
#   depths; RSD_MINI_TRAIN_SAMPLES: training documents per length and depth; RSD_MINI_THREADS)
#
# Stages that finished are kept (a rerun continues where the last one stopped: training resumes
# from its newest checkpoint, evaluation skips scored items); remove the output to start over.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
# shellcheck disable=SC1091
source .rsd-env
out="${RSD_MINI_OUT:-runs/miniature}"
seeds="${RSD_MINI_SEEDS:-0,1,2}"
pretrain_steps="${RSD_MINI_PRETRAIN_STEPS:-1500}"
adapt_steps="${RSD_MINI_ADAPT_STEPS:-200}"
samples="${RSD_MINI_SAMPLES:-3}"   # evaluation items per (length, depth)
depths="${RSD_MINI_DEPTHS:-10}"
train_samples="${RSD_MINI_TRAIN_SAMPLES:-150}"
threads="${RSD_MINI_THREADS:-2}"
tok=assets/tokenizers/mini-1k/tokenizer.json
data="$out/data"
mkdir -p "$data"

# RSD_MINI_BIN: binaries already built (the test suite passes its debug build).
bin="${RSD_MINI_BIN:-}"
if [ -z "$bin" ]; then
  echo "==> building (release)" >&2
  cargo build --release -q --bin rsd-data --bin rsd-train --bin rsd-eval
  bin=target/release
fi

# Shards and weights of a pipeline file, as rsd-train's --shards/--weights.
mix() {
  python - "$1" "$data" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))
print(",".join(f"{sys.argv[2]}/{d['dir']}" for d in p["datasets"]),
      ",".join(str(d["weight"]) for d in p["datasets"]))
EOF
}

echo "==> data: passkey documents and the bundled books, with the miniature's tokenizer" >&2
# Training items use seeds 1001/1002; evaluation uses seed 7, so no evaluated prompt was trained on.
if [ ! -f "$data/passkey-256/index.json" ]; then
  # Short documents pack several to a row: more keys to copy per token, which is what makes
  # copying (an induction head) appear within the pretraining budget.
  "$bin/rsd-eval" run --tasks passkey --lengths 100,128,192,256 --depths 10 --samples "$train_samples" \
    --max-new-tokens 8 --seed 1001 --tokenizer "$tok" --dump-prompts "$data/passkey-256.jsonl"
  "$bin/rsd-data" pack --len 256 --mode mixed --src "$data/passkey-256.jsonl" --tokenizer "$tok" \
    --out "$data/passkey-256" --force --progress none
fi
if [ ! -f "$data/passkey-1024/index.json" ]; then
  "$bin/rsd-eval" run --tasks passkey --lengths 512,1024 --depths 10 \
    --samples $(((train_samples + 2) / 3)) --seed 1002 \
    --tokenizer "$tok" --dump-prompts "$data/passkey-1024.jsonl"
  "$bin/rsd-data" pack --len 1024 --mode mixed --src "$data/passkey-1024.jsonl" --tokenizer "$tok" \
    --out "$data/passkey-1024" --force --progress none
fi
for len in 256 1024; do
  if [ ! -f "$data/books-$len/index.json" ]; then
    "$bin/rsd-data" pack --len "$len" --mode mixed --src corpus/books --tokenizer "$tok" \
      --out "$data/books-$len" --force --progress none
  fi
done
# Held out: the bundled code corpus, never trained on, for perplexity by position and the view gap.
if [ ! -f "$data/heldout-code-1024/index.json" ]; then
  "$bin/rsd-data" pack --len 1024 --src corpus/code --tokenizer "$tok" \
    --out "$data/heldout-code-1024" --force --progress none
fi
read -r shards256 weights256 < <(mix pipelines/miniature-256.json)
read -r shards1024 weights1024 < <(mix pipelines/miniature-1024.json)

# train DIR ARGS…: one rsd-train run, skipped when DIR holds a finished one.
train() {
  local dir="$1"; shift
  if [ -f "$dir/summary.json" ]; then
    echo "    $dir: done" >&2
    return
  fi
  "$bin/rsd-train" --config configs/miniature.toml --out "$dir" --resume auto --progress false \
    --threads "$threads" "$@"
}

# evaluate MODEL RUN ARGS…: passkey by depth ($depths depths, $samples items each, seed 7).
evaluate() {
  local model="$1" run="$2"; shift 2
  "$bin/rsd-eval" run --model "$model" --tasks passkey --depths "$depths" --samples "$samples" --seed 7 \
    --out "$run" --quiet "$@"
}

labels=()
pretrained=()
runs1024=()
runs2048=()
for seed in ${seeds//,/ }; do
  s="$out/seed-$seed"
  echo "==> seed $seed: pretraining at 256 tokens ($pretrain_steps steps, standard objective)" >&2
  train "$s/pretrain" --shards "$shards256" --weights "$weights256" --objective standard \
    --steps "$pretrain_steps" --seed "$seed" --init-seed "$seed"
  echo "==> seed $seed: evaluating the pretrained model at 256" >&2
  evaluate "$s/pretrain/model" "$s/pretrain/eval-256" --lengths 256
  pretrained+=("$s/pretrain/eval-256")
  for objective in standard rsd; do
    echo "==> seed $seed: adapting to 1024 tokens with $objective ($adapt_steps steps)" >&2
    train "$s/$objective" --init "" --model "$s/pretrain/model" --shards "$shards1024" --weights "$weights1024" \
      --objective "$objective" --steps "$adapt_steps" --lr 1e-3 --micro-batch 2 --seed "$seed"
    echo "==> seed $seed: evaluating $objective at 1024, and at 2048 with YaRN ×2" >&2
    evaluate "$s/$objective/model" "$s/$objective/eval-1024" --lengths 1024
    evaluate "$s/$objective/model" "$s/$objective/eval-2048-yarn2" --lengths 2048 --rope-scaling yarn:2
    "$bin/rsd-eval" ppl --model "$s/$objective/model" --shards "$data/heldout-code-1024" \
      --batches 8 --buckets 8 --seed 7 --out "$s/$objective/ppl" > /dev/null
    labels+=("$objective")
    runs1024+=("$s/$objective/eval-1024")
    runs2048+=("$s/$objective/eval-2048-yarn2")
  done
done

label_list=$(IFS=,; echo "${labels[*]}")
echo "==> comparing (runs with one label are pooled as seeds: mean ± spread over seeds)" >&2
pretrained_labels=$(printf 'pretrained,%.0s' "${pretrained[@]}")
"$bin/rsd-eval" compare "${pretrained[@]}" --labels "${pretrained_labels%,}" --out "$out/compare-256-pretrained"
"$bin/rsd-eval" compare "${runs1024[@]}" --labels "$label_list" --out "$out/compare-1024"
"$bin/rsd-eval" compare "${runs2048[@]}" --labels "$label_list" --out "$out/compare-2048-yarn2"
# Perplexity and view gap on the held-out code, per objective: mean ± population std over seeds.
python - "$out" "$seeds" > "$out/ppl.md" <<'EOF'
import json, statistics, sys
out, seeds = sys.argv[1], sys.argv[2].split(",")
print("| objective | held-out ppl | view gap (nats/token) |")
print("|---|---|---|")
for objective in ("standard", "rsd"):
    runs = [json.load(open(f"{out}/seed-{s}/{objective}/ppl/ppl.json")) for s in seeds]
    cells = []
    for key in ("ppl", "view_gap"):
        v = [r[key] for r in runs]
        cells.append(f"{statistics.fmean(v):.4g} ± {statistics.pstdev(v):.2g}")
    print(f"| {objective} | {' | '.join(cells)} |")
EOF
echo
echo "tables:  $out/compare-256-pretrained/compare.md (before adaptation), $out/compare-1024/compare.md,"
echo "         $out/compare-2048-yarn2/compare.md, $out/ppl.md"
echo "figures: $out/compare-1024/accuracy_by_depth.png, $out/compare-2048-yarn2/accuracy_by_depth.png"
