#!/usr/bin/env bash
# The paper's comparison in miniature, on CPU, as pre-registered in docs/RESULTS.md (attempt 4):
# does attempt 3's result replicate over bases, and can it see depth?
#
#   scripts/miniature.sh [STAGE]      STAGE: data, bases, lengths, adapt, evaluate, report, or
#                                     all (the default: every stage in order)
#
#   data      attempt 3's training files (the same `scripts/miniature_kv.py` and `rsd-data pack`
#             calls) and attempt 4's evaluation items: `kv_multikey` on the fresh seed 23 at 256
#             (the bar), 384, 512, 768, 1024, 2048 and 4096 tokens (11 depths × 32 items).
#   bases     each base b of RSD_MINI_BASES (1, 2, 3) trained from scratch by attempt 3's recipe
#             (stage 1 pair lists, then blocks until held-out pair lists are recalled ≥ 0.95;
#             stage 2 the mix, in blocks until held-out kv_multikey is), with --init-seed 10+b,
#             stage 1 --seed 10+b, block k of each stage --seed 100·b+k, into base-b/; its bar
#             (recall ≥ 0.80 at every depth at 256 tokens, seed-23 items) in base-b/bar.md. A
#             base that misses is replaced by the next (4, 5, …) until as many as RSD_MINI_BASES
#             names met the bar, at most RSD_MINI_MAX_BASE_TRIES bases in all. bases.json: the
#             bases tried, which met the bar, which the study uses.
#   lengths   every accepted base, unchanged (RoPE base 10⁴, no scaling), at 384, 512, 768 and
#             1024 tokens; lengths.json: the depth lengths by the pre-registered rule.
#   adapt     for every accepted base and seed of RSD_MINI_SEEDS (0, 1), the four arms (standard,
#             rsd, standard-matched, two-view-clm) into base-b/seed-s/ARM; standard-matched takes
#             ⌈steps × F⌉ steps, F the rsd step's FLOP floor with prefix reuse (`rsd-train
#             memory`), recorded in adapt.json.
#   evaluate  every adapted model at 384, 512, 768, 1024, 2048 (YaRN ×2) and 4096 (YaRN ×4) into
#             base-b/seed-s/ARM/eval-{384,512,768,1024,2048-yarn2,4096-yarn4}/, length by length
#             (every model at 384, then at 512, …), so the in-window lengths are done first.
#   report    the tables (scripts/miniature_report.sh compare): the arms by depth per length, the
#             paired differences with hierarchical intervals (bases, then seeds, then items), the
#             primary measures and the decision rule, in report/.
#
#   keep [DIR]     copies what has finished into DIR (default docs/results/attempt-ATTEMPT), in
#                  the committed results' layout: bases.json, lengths.json, adapt.json,
#                  timings.tsv, each trained base's base.json and scored eval-*/ (results.jsonl,
#                  run.json), each adapted model's scored eval-*/ (and miniature.json), and the
#                  weights of every base the study can use (base-B/model/: config, tokenizer,
#                  safetensors). No checkpoint, no adapted model, no partly scored evaluation.
#   restore [DIR]  copies DIR (what `keep` wrote) into the output, keeping what the output has: a
#                  study carries on from it on another machine. A base with base.json is not
#                  trained again; an adapted model whose every evaluation is scored is not adapted
#                  again (its results are what the report needs). Then run the stages as usual.
#
# Every stage is resumable: a rerun skips what finished (training resumes from its newest
# checkpoint, evaluation skips scored items), and a stage whose input is missing says which stage
# makes it. Each stage appends its wall time to OUT/timings.tsv (stage, start, seconds, status).
# Remove the output to start over.
#
#   scripts/miniature.sh                       # the whole study, into runs/miniature-4/
#   RSD_MINI_BIN=target/release scripts/miniature.sh bases   # one stage, binaries already built
#   RSD_MINI_BASES=1,2 RSD_MINI_SEEDS=0 RSD_MINI_PAIRS_STEPS=20 RSD_MINI_BLOCK_STEPS=20 \
#     RSD_MINI_MAX_BLOCKS=1 RSD_MINI_ADAPT_STEPS=20 RSD_MINI_ITEMS=1 RSD_MINI_DEPTHS=2 \
#     RSD_MINI_TRAIN_DOCS=100 RSD_MINI_IGNORE_BAR=1 scripts/miniature.sh      # a look
#
# Attempt 5 (RSD_MINI_ATTEMPT=5, into runs/miniature-5/) runs the same stages with its own
# settings, as docs/RESULTS.md pre-registers them: bases 11-15 (a base that misses the bar is
# replaced by 16, 17, …, at most 10 tried), evaluation items on seed 31 at 256 (the bar), 640,
# 768, 896 and 1024 tokens; the lengths stage writes the depth lengths the pilot fixed (640, 768,
# 896) instead of scoring the bases; evaluate scores every adapted model at those lengths and at
# 1024, no YaRN lengths; report adds the t-interval over the base means to the primary measure
# (scripts/miniature_attempt5.py).
#
#   RSD_MINI_ATTEMPT=5 scripts/miniature.sh    # attempt 5, every stage; a rerun continues
#   RSD_MINI_ATTEMPT=5 scripts/miniature.sh keep      # into docs/results/attempt-5/
#   RSD_MINI_ATTEMPT=5 scripts/miniature.sh restore   # elsewhere, then: … miniature.sh
#
# Environment: RSD_MINI_ATTEMPT (4 or 5, default 4), RSD_MINI_OUT (output, default
# runs/miniature-ATTEMPT), RSD_MINI_BASES (the bases, comma-separated, default 1,2,3; attempt 5:
# 11,12,13,14,15), RSD_MINI_MAX_BASE_TRIES (bases tried at most, default 6; attempt 5: 10),
# RSD_MINI_SEEDS (adaptation seeds, default 0,1), RSD_MINI_PAIRS_STEPS (a base's first run, 1500),
# RSD_MINI_BLOCK_STEPS and RSD_MINI_MAX_BLOCKS (its stages' blocks, 500 steps, at most 8 per
# stage), RSD_MINI_ADAPT_STEPS (200), RSD_MINI_ITEMS (per depth, 32), RSD_MINI_DEPTHS (11),
# RSD_MINI_TRAIN_DOCS (documents per training file; default: the design's), RSD_MINI_THREADS (2),
# RSD_MINI_BIN (binaries already built; default: build release ones), RSD_MINI_IGNORE_BAR=1 (take
# the first bases whether or not they meet the bar: smoke runs only).
#
# Attempt 3 (one shared base, seed-7 items, 1024/2048/4096 only) is in git history; its per-item
# results are in docs/results/attempt-3 and scripts/miniature_report.sh reproduces its tables.
#
# The whole body is in functions and `main` is called on the last line: bash reads a script as
# it runs, and a function is read whole before it runs, so editing this file while a long run is
# under way cannot change what that run does.

usage() {
  sed -n '2,/^# Attempt 3 (one shared base/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
}

say() { printf '==> %s\n' "$*" >&2; }
die() { printf 'miniature: %s\n' "$*" >&2; exit 1; }

settings() {
  attempt="${RSD_MINI_ATTEMPT:-4}"
  case "$attempt" in
    4)
      default_bases=1,2,3 default_tries=6
      # The evaluation items' seed: used by no pilot, no training file, no earlier attempt.
      eval_seed=23
      # The in-window lengths (base-only recall picks the depth lengths among them) and the
      # evaluations.
      window_lengths=(384 512 768 1024)
      evals=(eval-384 eval-512 eval-768 eval-1024 eval-2048-yarn2 eval-4096-yarn4)
      ;;
    5)
      default_bases=11,12,13,14,15 default_tries=10
      eval_seed=31
      # Fixed by the pilot before any base was trained (docs/RESULTS.md, attempt 5): no base-only
      # rule, no YaRN lengths.
      window_lengths=()
      depth_lengths=(640 768 896)
      evals=(eval-640 eval-768 eval-896 eval-1024)
      ;;
    *) die "RSD_MINI_ATTEMPT=$attempt: this script runs attempt 4 or 5" ;;
  esac
  out="${RSD_MINI_OUT:-runs/miniature-$attempt}"
  bases="${RSD_MINI_BASES:-$default_bases}"
  max_tries="${RSD_MINI_MAX_BASE_TRIES:-$default_tries}"
  seeds="${RSD_MINI_SEEDS:-0,1}"
  pairs_steps="${RSD_MINI_PAIRS_STEPS:-1500}"
  block_steps="${RSD_MINI_BLOCK_STEPS:-500}"
  max_blocks="${RSD_MINI_MAX_BLOCKS:-8}"
  # A stage of a base ends when its held-out items are recalled this well.
  criterion=0.95
  adapt_steps="${RSD_MINI_ADAPT_STEPS:-200}"
  items="${RSD_MINI_ITEMS:-32}"
  depths="${RSD_MINI_DEPTHS:-11}"
  train_docs="${RSD_MINI_TRAIN_DOCS:-}"
  threads="${RSD_MINI_THREADS:-2}"
  ignore_bar="${RSD_MINI_IGNORE_BAR:-}"
  # The pre-registered bar: teacher-forced recall of a base at 256 tokens, at every depth.
  bar=0.8
  # RoPE base for the 4× longer window: 10⁴ → 8·10⁴ (the paper: Llama-3 500K → 8M for 8×).
  theta=80000
  arms=(standard rsd standard-matched two-view-clm)
  tok=assets/tokenizers/mini-1k/tokenizer.json
  data="$out/data"
  bin="${RSD_MINI_BIN:-}"
}

# eval_lengths: every length the study scores items at (the bar's 256 first), one per line.
eval_lengths() {
  local e
  echo 256
  for e in "${window_lengths[@]}" "${evals[@]}"; do
    e="${e#eval-}"
    echo "${e%%-*}"
  done | sort -nu
}

binaries() {
  if [ -z "$bin" ]; then
    say "building (release)"
    cargo build --release -q --bin rsd-data --bin rsd-train --bin rsd-eval
    bin=target/release
  fi
  local b
  for b in rsd-data rsd-train rsd-eval; do
    [ -x "$bin/$b" ] || die "$bin/$b: not built (RSD_MINI_BIN names the directory of the binaries)"
  done
}

# need PATH STAGE WHAT: stops, naming the stage that makes PATH, when it is not there.
need() {
  [ -e "$1" ] || die "$1: missing ($3): run \`scripts/miniature.sh $2\` first"
}

# ---------------------------------------------------------------------------------------- data

# kv NAME DOCS ARGS…: a file of `scripts/miniature_kv.py` (documents, or with `items` first,
# evaluation items), kept once written. RSD_MINI_TRAIN_DOCS caps the documents (toy runs).
kv() {
  local name="$1" docs="$2"; shift 2
  [ -s "$data/$name.jsonl" ] && return
  python3 scripts/miniature_kv.py "$1" "$data/$name.jsonl" --docs "${train_docs:-$docs}" \
    --tokenizer "$tok" "${@:2}"
}
# items_file LENGTH: the attempt's kv_multikey items at LENGTH tokens (its evaluation seed: none
# trained on).
items_file() { echo "$data/items-$1-seed$eval_seed.jsonl"; }
# pack SRC LEN NAME: mixed-mode shards (short documents several to a row, boundaries recorded).
pack() {
  [ -f "$data/$3/index.json" ] && return
  "$bin/rsd-data" pack --len "$2" --mode mixed --src "$1" --tokenizer "$tok" --out "$data/$3" \
    --force --progress none >/dev/null
}

stage_data() {
  mkdir -p "$data"
  say "data: key→value lists, drills and documents, the bundled books (attempt 3's files)"
  kv pairs 40000 docs --seed 2001 --pairs 4
  kv gaps 40000 docs --seed 2006 --pairs 4 --gap 6
  kv drills 40000 docs --seed 2002 --drill --most 4
  kv kv-base 9900 docs --seed 1001
  kv kv-adapt 9900 docs --seed 1002
  # Held-out items that end a base's stages (other seeds than the bar's and the training data's).
  kv pair-items 0 items --pairs 4 --items 64 --seed 79
  kv kv-items-256-seed17 0 items --lengths 256 --items 8 --depths 11 --seed 17
  for name in pairs gaps drills kv-base; do pack "$data/$name.jsonl" 256 "$name-256"; done
  pack "$data/kv-adapt.jsonl" 1024 kv-adapt-1024
  pack corpus/books 256 books-256
  pack corpus/books 1024 books-1024
  say "data: the evaluation's kv_multikey items, seed $eval_seed, $depths depths × $items items"
  local length
  for length in $(eval_lengths); do
    kv "items-$length-seed$eval_seed" 0 items --lengths "$length" --items "$items" \
      --depths "$depths" --seed "$eval_seed"
  done
}

need_data() {
  local f
  for f in pairs-256/index.json gaps-256/index.json drills-256/index.json kv-base-256/index.json \
      books-256/index.json kv-adapt-1024/index.json books-1024/index.json pair-items.jsonl \
      kv-items-256-seed17.jsonl; do
    need "$data/$f" data "the training data"
  done
  for f in $(eval_lengths); do
    need "$(items_file "$f")" data "the evaluation items"
  done
}

# ----------------------------------------------------------------------------- shared helpers

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
# scored ITEMS RUN: whether RUN already holds a result for every item of ITEMS (then rsd-eval is
# not started at all; it would skip them one by one).
scored() {
  [ -s "$2/results.jsonl" ] && [ -f "$2/run.json" ] \
    && [ "$(wc -l < "$2/results.jsonl")" -eq "$(wc -l < "$1")" ]
}
# evaluated DIR: whether every evaluation of the adapted model DIR is scored and recorded (then
# the model is not needed again: `restore` brings back its results, not its weights).
evaluated() {
  local e length
  for e in "${evals[@]}"; do
    length="${e#eval-}" length="${length%%-*}"
    scored "$(items_file "$length")" "$1/$e" && [ -f "$1/$e/miniature.json" ] || return 1
  done
}
# evaluate MODEL RUN LENGTH ARGS…: attempt 4's items at LENGTH, teacher-forced (a rerun skips the
# items already scored).
evaluate() {
  local model="$1" run="$2" items; items="$(items_file "$3")"; shift 3
  scored "$items" "$run" && return
  "$bin/rsd-eval" score --model "$model" --items "$items" --batch-size 8 --out "$run" --quiet \
    "$@" >/dev/null
}
# recall MODEL ITEMS RUN: the fraction of ITEMS (a file in $data) whose answer MODEL ranks first.
recall() {
  scored "$data/$2" "$3" \
    || "$bin/rsd-eval" score --model "$1" --items "$data/$2" --batch-size 8 --out "$3" --quiet >/dev/null
  python3 -c 'import json, sys
rows = [json.loads(line)["score"] for line in open(sys.argv[1])]
print(f"{sum(rows) / len(rows):.3f}")' "$3/results.jsonl"
}
# learn DIR FROM ITEMS SEED0 ARGS…: blocks of $block_steps steps at a constant lr from the model
# FROM (DIR-b1, DIR-b2, …; block k's data order from seed SEED0+k), until the model recalls at
# least $criterion of ITEMS (held-out items of the stage's skill, never the bar's) or after
# $max_blocks blocks. Prints the model it ends with. A skill appears abruptly and at a step that
# depends on the data order, so a stage ends when it is learnt, not after a fixed number of steps.
learn() {
  local dir="$1" model="$2" items="$3" seed0="$4"; shift 4
  local k r
  for k in $(seq 1 "$max_blocks"); do
    r="$(recall "$model" "$items" "$dir-b$k/eval-before")"
    echo "    ${dir#"$out/"}: held-out recall $r before block $k" >&2
    python3 -c "import sys; sys.exit(0 if $r >= $criterion else 1)" && break
    train "$dir-b$k" --model "$model" --init "" --objective standard --lr 1e-3 \
      --warmup-ratio 0 --min-lr-ratio 1 --steps "$block_steps" --seed "$((seed0 + k))" "$@" >&2
    model="$dir-b$k/model"
  done
  echo "$model"
}

# ---------------------------------------------------------------------------------------- bases

# base B: trains base B (resumably) and scores it on the bar's items; its bar in base-B/bar.md.
base() {
  local b="$1" dir="$out/base-$1"
  mkdir -p "$dir"
  if [ -f "$dir/base.json" ]; then
    # Written once both stages had ended (or restored with the base's results): only its bar is
    # made again, from its scored items if they are there.
    echo "    base $b: trained ($dir/base.json)" >&2
  else
    train_base "$b" "$dir"
  fi
  if [ ! -e "$dir/model" ] && ! scored "$(items_file 256)" "$dir/eval-256"; then
    die "$dir/base.json: base $b is recorded as trained, but neither its model nor its scored" \
      "eval-256/ is there: remove $dir/base.json to train it again"
  fi
  evaluate "$dir/model" "$dir/eval-256" 256
  # The bar, per depth (the summary's by-depth table).
  RSD_MINI_BIN="$bin" bash scripts/miniature_report.sh bar "$dir" "$bar" > "$dir/bar.md"
  cat "$dir/bar.md" >&2
}

# train_base B DIR: base B's two stages, resumably, into DIR; DIR/model and DIR/base.json last.
train_base() {
  local b="$1" dir="$2" model
  say "base $b, stage 1: from scratch at 256 tokens on pair lists (--init-seed $((10 + b)))," \
    "$pairs_steps steps, then blocks of $block_steps until held-out pair lists reach $criterion"
  train "$dir/pairs" --shards "$data/pairs-256" --objective standard --lr 1e-3 \
    --steps "$pairs_steps" --seed "$((10 + b))" --init-seed "$((10 + b))"
  model="$(learn "$dir/pairs" "$dir/pairs/model" pair-items.jsonl "$((100 * b))" \
    --shards "$data/pairs-256")"
  say "base $b, stage 2: gap lists, pair lists, drills, kv documents and books, in blocks of" \
    "$block_steps until held-out kv_multikey items reach $criterion"
  model="$(learn "$dir/mix" "$model" kv-items-256-seed17.jsonl "$((100 * b))" \
    --shards "$data/gaps-256,$data/pairs-256,$data/drills-256,$data/kv-base-256,$data/books-256" \
    --weights 0.48,0.08,0.12,0.12,0.2)"
  # The base is the model the second stage ended with: base-B/model links to it.
  [ -e "$dir/model" ] || ln -s "${model#"$dir/"}" "$dir/model"
  python3 - "$dir/base.json" "$b" "${model#"$dir/"}" <<'EOF'
import json, sys
path, b, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]
json.dump({"base": b, "init_seed": 10 + b, "stage1_seed": 10 + b,
           "block_seeds": f"{100 * b}+k for block k of each stage", "model": model},
          open(path + ".tmp", "w"), indent=1)
EOF
  mv "$dir/base.json.tmp" "$dir/base.json"
}

stage_bases() {
  need_data
  local want tried=() met=() accepted=() b next
  IFS=, read -r -a want <<< "$bases"
  next=$(printf '%s\n' "${want[@]}" | sort -n | tail -1)
  local queue=("${want[@]}")
  while [ ${#accepted[@]} -lt ${#want[@]} ] && [ ${#tried[@]} -lt "$max_tries" ]; do
    if [ ${#queue[@]} -gt 0 ]; then
      b="${queue[0]}"
      queue=("${queue[@]:1}")
    else
      next=$((next + 1))
      b=$next
      say "base $b replaces a base that missed the bar"
    fi
    base "$b"
    tried+=("$b")
    if grep -q "NOT met" "$out/base-$b/bar.md"; then
      say "base $b misses the pre-registered bar (docs/RESULTS.md)"
      if [ -n "$ignore_bar" ]; then accepted+=("$b"); fi
    else
      met+=("$b") accepted+=("$b")
    fi
  done
  python3 - "$out" "${#want[@]}" "$max_tries" "$bar" "$ignore_bar" "${tried[*]}" "${met[*]}" \
    "${accepted[*]}" <<'EOF'
import json, re, sys
out, need, tries, bar, ignore = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), bool(sys.argv[5])
tried, met, accepted = ([int(x) for x in a.split()] for a in sys.argv[6:9])
rows = []
for b in tried:
    text = open(f"{out}/base-{b}/bar.md").read()
    worst = float(re.search(r"Worst depth: ([0-9.]+)", text).group(1))
    rows.append({"base": b, "init_seed": 10 + b, "worst_depth": worst, "met": b in met,
                 "accepted": b in accepted, "model": f"base-{b}/model"})
json.dump({"bar": bar, "bases_needed": need, "max_tries": tries, "ignore_bar": ignore,
           "tried": rows, "accepted": accepted, "complete": len(accepted) == need},
          open(f"{out}/bases.json.tmp", "w"), indent=1)
EOF
  # Replaced only when it changes: the report is redone when the bases are.
  if cmp -s "$out/bases.json.tmp" "$out/bases.json"; then
    rm "$out/bases.json.tmp"
  else
    mv "$out/bases.json.tmp" "$out/bases.json"
  fi
  if [ ${#accepted[@]} -lt ${#want[@]} ]; then
    die "only ${#accepted[@]} of ${#want[@]} bases met the pre-registered bar after" \
      "${#tried[@]} tried (bases ${tried[*]}; RSD_MINI_MAX_BASE_TRIES=$max_tries); see" \
      "$out/bases.json and $out/base-*/bar.md. Report them in docs/RESULTS.md; change the model" \
      "or the data, not the bar; RSD_MINI_IGNORE_BAR=1 goes on anyway (smoke runs only)"
  fi
  say "bases: ${accepted[*]} (tried: ${tried[*]}; met the bar: ${met[*]:-none})"
}

# accepted_bases: the bases the study uses (bases.json), one per line.
accepted_bases() {
  need "$out/bases.json" bases "which bases met the bar"
  python3 - "$out/bases.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
if not d["complete"]:
    sys.exit(f"{sys.argv[1]}: the bases stage did not finish with enough bases: run `scripts/miniature.sh bases`")
print("\n".join(map(str, d["accepted"])))
EOF
}

# -------------------------------------------------------------------------------------- lengths

stage_lengths() {
  need_data
  local list b length
  list="$(accepted_bases)" || exit 1
  if [ ${#window_lengths[@]} -eq 0 ]; then
    # Attempt 5: the pilot fixed the depth lengths before any base was trained.
    say "depth lengths ${depth_lengths[*]}: fixed by the pilot (docs/RESULTS.md), not by the bases"
    python3 - "$out/lengths.json" "$list" "${depth_lengths[@]}" <<'EOF'
import json, sys
path, bases, lengths = sys.argv[1], [int(b) for b in sys.argv[2].split()], [int(l) for l in sys.argv[3:]]
json.dump({"rule": "fixed before any base of the study was trained: the lengths where a pilot "
                   "model (standard adaptation of a base outside the study) recalled 0.35-0.85 "
                   "of its own items at the middle depths 0.3-0.7",
           "chosen_by": "pilot", "bases": bases, "depth_lengths": lengths, "fallback": False},
          open(path + ".tmp", "w"), indent=1)
EOF
    mv "$out/lengths.json.tmp" "$out/lengths.json"
    return
  fi
  for b in $list; do
    need "$out/base-$b/model" bases "base $b"
    for length in "${window_lengths[@]}"; do
      say "base $b unchanged (RoPE base 10⁴, no scaling) at $length tokens"
      # As the checkpoint is: trained on 256-token rows, its config.json keeps the architecture's
      # max_position_embeddings (1024), so rsd-eval scores up to 1024 without any scaling.
      evaluate "$out/base-$b/model" "$out/base-$b/eval-$length" "$length"
    done
  done
  RSD_MINI_BIN="$bin" bash scripts/miniature_report.sh lengths "$out" "$(echo $list | tr ' ' ,)" \
    > "$out/lengths.json.tmp"
  mv "$out/lengths.json.tmp" "$out/lengths.json"
  python3 - "$out/lengths.json" <<'EOF' >&2
import json, sys
d = json.load(open(sys.argv[1]))
print("    base-only recall, mean over bases: " + ", ".join(f"{l}: {d['mean'][l]:.3f}" for l in d["mean"]))
print(f"    depth lengths: {d['depth_lengths']}" + (" (fallback: none in [0.35, 0.85], the closest to 0.60)" if d["fallback"] else ""))
EOF
}

# ---------------------------------------------------------------------------------------- adapt

# adapt_args MODEL: the adaptation's arguments from the base MODEL, every arm's (attempt 3's).
adapt_args() {
  adapt=(--model "$1" --init "" --shards "$data/kv-adapt-1024,$data/books-1024"
    --weights 0.8,0.2 --rope-theta "$theta" --max-position-embeddings 1024 --doc-mask true
    --lr 1e-3 --micro-batch 2)
}

# flop_floor B: rsd's FLOP floor with prefix reuse for the adaptation from base B, as rsd-train
# prints it (two decimals: the pre-registered 1.56), from its memory plan (nothing is trained).
flop_floor() {
  adapt_args "$out/base-$1/model"
  "$bin/rsd-train" memory --config configs/miniature.toml "${adapt[@]}" --objective rsd \
    --threads "$threads" | sed -n 's/.*FLOP floor is \([0-9.]*\)×.*/\1/p'
}

stage_adapt() {
  need_data
  need "$out/lengths.json" lengths "the base-only lengths, fixed before any adapted model exists"
  local list b seed arm dir floor floors=() matched args
  list="$(accepted_bases)" || exit 1
  for b in $list; do
    floor="$(flop_floor "$b")"
    [ -n "$floor" ] || die "rsd-train memory printed no FLOP floor for base $b"
    floors+=("$floor")
  done
  [ "$(printf '%s\n' "${floors[@]}" | sort -u | wc -l)" -eq 1 ] \
    || die "the bases' FLOP floors differ (${floors[*]}): they share one architecture"
  floor="${floors[0]}"
  # ⌈steps × F⌉ in integers (F has two decimals): 200 × 1.56 → 312.
  matched=$(python3 -c "import sys; from decimal import Decimal; from math import ceil
print(ceil(int(sys.argv[1]) * Decimal(sys.argv[2])))" "$adapt_steps" "$floor")
  python3 -c 'import json, sys
json.dump({"adapt_steps": int(sys.argv[1]), "flop_floor": float(sys.argv[2]),
           "matched_steps": int(sys.argv[3]),
           "flop_floor_from": "rsd-train memory (the rsd skip step with prefix reuse, two decimals)"},
          open(sys.argv[4], "w"), indent=1)' "$adapt_steps" "$floor" "$matched" "$out/adapt.json"
  say "standard-matched: ⌈$adapt_steps × $floor⌉ = $matched steps (rsd's FLOP floor with prefix reuse)"
  for b in $list; do
    adapt_args "$out/base-$b/model"
    for seed in ${seeds//,/ }; do
      for arm in "${arms[@]}"; do
        dir="$out/base-$b/seed-$seed/$arm"
        case "$arm" in
          standard) args=(--objective standard --steps "$adapt_steps") ;;
          rsd) args=(--objective rsd --steps "$adapt_steps") ;;
          standard-matched) args=(--objective standard --steps "$matched") ;;
          two-view-clm) args=(--objective two-view-clm --steps "$adapt_steps") ;;
        esac
        if evaluated "$dir"; then
          echo "    ${dir#"$out/"}: evaluated (its results are here; the model is not needed)" >&2
          continue
        fi
        say "base $b, seed $seed: adapting to 1024 tokens, $arm (${args[*]})"
        train "$dir" "${adapt[@]}" "${args[@]}" --seed "$seed"
      done
    done
  done
}

# ------------------------------------------------------------------------------------- evaluate

# record DIR B SEED ARM EVAL: the study's own record in the evaluation directory DIR/EVAL of the
# adapted model DIR, beside rsd-eval's run.json (which carries the model's sha256, RoPE base and
# scaling and its training record with the adaptation seed and steps, but not the base's seeds).
record() {
  RSD_MINI_ATTEMPT_RECORD="$attempt" python3 - "$@" <<'EOF'
import json, os, sys
d, b, seed, arm, ev = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
training = json.load(open(os.path.join(d, "model", "rsd_training.json")))
_, length, *scaling = ev.split("-")
json.dump({"attempt": int(os.environ["RSD_MINI_ATTEMPT_RECORD"]), "base": b,
           "base_init_seed": 10 + b, "base_stage1_seed": 10 + b,
           "base_block_seeds": f"{100 * b}+k for block k of each stage",
           "adaptation_seed": seed, "arm": arm, "objective": training["objective"],
           "steps": training["steps"], "length": int(length),
           "rope_theta": training["rope_theta"],
           "yarn_factor": int(scaling[0][len("yarn"):]) if scaling else None,
           "model": f"base-{b}/seed-{seed}/{arm}/model"},
          open(os.path.join(d, ev, "miniature.json.tmp"), "w"), indent=1)
os.replace(os.path.join(d, ev, "miniature.json.tmp"), os.path.join(d, ev, "miniature.json"))
EOF
}

stage_evaluate() {
  need_data
  local list b seed arm dir e length label
  list="$(accepted_bases)" || exit 1
  for b in $list; do
    for seed in ${seeds//,/ }; do
      for arm in "${arms[@]}"; do
        dir="$out/base-$b/seed-$seed/$arm"
        evaluated "$dir" || need "$dir/summary.json" adapt "base $b, seed $seed, $arm"
      done
    done
  done
  # Length by length, every model at each: the in-window lengths (which hold the primary measures
  # at 1024 and at the depth lengths) are complete for every arm long before the costly 4096.
  for e in "${evals[@]}"; do
    length="${e#eval-}" length="${length%%-*}"
    label="$length tokens"
    [[ $e != *-yarn* ]] || label+=" (YaRN ×${e##*-yarn})"
    say "every adapted model at $label"
    for b in $list; do
      for seed in ${seeds//,/ }; do
        for arm in "${arms[@]}"; do
          dir="$out/base-$b/seed-$seed/$arm"
          case "$e" in
            *-yarn*) evaluate "$dir/model" "$dir/$e" "$length" --rope-scaling "yarn:${e##*-yarn}" ;;
            *) evaluate "$dir/model" "$dir/$e" "$length" ;;
          esac
          [ -f "$dir/$e/miniature.json" ] || record "$dir" "$b" "$seed" "$arm" "$e"
        done
      done
    done
  done
}

# --------------------------------------------------------------------------------------- report

stage_report() {
  need "$out/lengths.json" lengths "the depth lengths"
  local list b seed arm e
  list="$(accepted_bases)" || exit 1
  for b in $list; do
    for seed in ${seeds//,/ }; do
      for arm in "${arms[@]}"; do
        for e in "${evals[@]}"; do
          need "$out/base-$b/seed-$seed/$arm/$e/results.jsonl" evaluate "base $b, seed $seed, $arm, $e"
        done
      done
    done
  done
  # Up to date when written after every result it reads (a rerun repeats nothing).
  if [ -s "$out/report/primary.md" ] && [ -z "$(find "$out" -path "$out/data" -prune -o \
      \( -name results.jsonl -o -name bases.json \) -newer "$out/report/primary.md" -print \
      | head -1)" ]; then
    echo "    $out/report: done (newer than every result)" >&2
  else
    say "tables: the arms by depth, paired differences against standard and standard-matched"
    RSD_MINI_BIN="$bin" bash scripts/miniature_report.sh compare "$out" "$out/report"
  fi
  echo
  echo "the bases and their bars:  $out/bases.json, $out/base-*/bar.md"
  echo "the depth lengths:         $out/lengths.json"
  echo "primary measures, rule:    $out/report/primary.md"
  echo "tables and intervals:      $out/report/compare-vs-standard/compare.md, …/compare-vs-standard-matched/compare.md"
  echo "figures by depth:          $out/report/by-depth-*/accuracy_by_depth.png"
}

# ---------------------------------------------------------------------------------- keep, restore

# copy_file FROM TO: TO written whole or not at all.
copy_file() {
  mkdir -p "$(dirname "$2")"
  cp "$1" "$2.tmp"
  mv "$2.tmp" "$2"
}

# keep_eval RUN DEST LENGTH: RUN's results, run.json and miniature.json into DEST, if RUN scored
# every item at LENGTH (a partly scored run is left to finish where it is).
keep_eval() {
  local f
  need "$(items_file "$3")" data "the evaluation items, to tell a finished evaluation"
  scored "$(items_file "$3")" "$1" || return 0
  for f in results.jsonl run.json miniature.json; do
    [ ! -f "$1/$f" ] || copy_file "$1/$f" "$2/$f"
  done
}

# keep DEST: what has finished, into DEST (the layout of docs/results/attempt-*).
keep() {
  local dest="$1" f d rel e length kept=0
  [ -d "$out" ] || die "$out: no study here to keep (RSD_MINI_OUT names it)"
  for f in bases.json lengths.json adapt.json timings.tsv; do
    [ ! -f "$out/$f" ] || copy_file "$out/$f" "$dest/$f"
  done
  for d in "$out"/base-*; do
    [ -f "$d/base.json" ] || continue   # still training
    rel="${d#"$out/"}"
    copy_file "$d/base.json" "$dest/$rel/base.json"
    for e in "$d"/eval-* "$d"/seed-*/*/eval-*; do
      [ -d "$e" ] || continue
      length="${e##*/eval-}" length="${length%%-*}"
      keep_eval "$e" "$dest/${e#"$out/"}" "$length"
    done
    # The weights of a base the study can use: one that met the bar (or any, past the bar).
    if [ -e "$d/model/model.safetensors" ] && [ -f "$d/bar.md" ] \
        && { [ -n "$ignore_bar" ] || ! grep -q "NOT met" "$d/bar.md"; }; then
      for f in "$d"/model/*; do
        [ ! -f "$f" ] || copy_file "$f" "$dest/$rel/model/${f##*/}"
      done
    fi
    kept=$((kept + 1))
  done
  say "kept $kept trained base(s) and every finished evaluation of $out in $dest"
}

# restore SRC: what `keep` wrote, into the output; nothing the output has is replaced.
restore() {
  [ -d "$1" ] || die "$1: nothing to restore (\`scripts/miniature.sh keep\` writes it)"
  local f n=0
  mkdir -p "$out"
  while IFS= read -r -d '' f; do
    [ ! -e "$out/$f" ] || continue
    copy_file "$1/$f" "$out/$f"
    n=$((n + 1))
  done < <(cd "$1" && find . -type f -print0)
  say "restored $n file(s)"
  say "restored $1 into $out; run the stages to carry on"
}

# ----------------------------------------------------------------------------------------- main

# timed STAGE: runs stage STAGE in a subshell (its `exit` ends the stage, not the caller), then
# appends its wall time to OUT/timings.tsv.
timed() {
  local stage="$1" start t0 rc
  start="$(date -u +%Y-%m-%dT%H:%M:%SZ)" t0="$(date +%s)"
  mkdir -p "$out"
  [ -s "$out/timings.tsv" ] || printf 'stage\tstart\tseconds\tstatus\n' > "$out/timings.tsv"
  # Not `( … ) || …`: bash ignores `set -e` in a command whose status is tested.
  set +e
  ( set -e; "stage_$stage" )
  rc=$?
  set -e
  printf '%s\t%s\t%s\t%s\n' "$stage" "$start" "$(( $(date +%s) - t0 ))" \
    "$([ "$rc" -eq 0 ] && echo ok || echo "failed ($rc)")" >> "$out/timings.tsv"
  return "$rc"
}

main() {
  set -euo pipefail
  shopt -s inherit_errexit   # a failure inside $(…) fails the command that uses it
  local stage="${1:-all}" stages=(data bases lengths adapt evaluate report) s
  case "$stage" in
    -h|--help|help) usage; return 0 ;;
    keep|restore)
      [ $# -le 2 ] || { printf 'miniature: %s takes one directory (got: %s)\n' "$stage" "$*" >&2; return 2; }
      cd "$(dirname "${BASH_SOURCE[0]}")/.."
      settings
      "$stage" "${2:-docs/results/attempt-$attempt}"
      return 0 ;;
    all|data|bases|lengths|adapt|evaluate|report) ;;
    *) usage >&2; printf '\nminiature: unknown stage "%s"\n' "$stage" >&2; return 2 ;;
  esac
  [ $# -le 1 ] || { printf 'miniature: one stage at a time (got: %s)\n' "$*" >&2; return 2; }
  cd "$(dirname "${BASH_SOURCE[0]}")/.."
  bash scripts/setup.sh
  # shellcheck disable=SC1091
  source .rsd-env
  settings
  binaries
  if [ "$stage" = all ]; then
    for s in "${stages[@]}"; do
      timed "$s"   # a failed stage ends the run here (set -e)
    done
  else
    timed "$stage"
  fi
}

# Sourced (scripts/demo.sh reuses the data, training and evaluation helpers): functions only.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"; exit $?
fi
