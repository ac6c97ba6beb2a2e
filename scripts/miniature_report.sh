#!/usr/bin/env bash
# The miniature study's tables, from its per-item results alone (each run directory's
# results.jsonl). scripts/miniature.sh calls it; on the committed results it reproduces every
# number of docs/RESULTS.md's study 2:
#
#   scripts/miniature_report.sh bar RESULTS BAR          # a base's recall per depth against BAR
#   scripts/miniature_report.sh lengths RESULTS BASES    # attempt 4's depth lengths, as JSON
#   scripts/miniature_report.sh lengths-table RESULTS BASES   # the same as a Markdown table
#   scripts/miniature_report.sh compare RESULTS OUT      # the arms by depth, paired differences
#   scripts/miniature_report.sh compare docs/results/attempt-3 runs/attempt-3-report
#
# bar: RESULTS is a base's directory holding eval-256/ (attempt 4: base-B/), or an attempt's
# holding base/eval-256/ (attempts 1-3). Prints a Markdown table and a verdict line ("met" /
# "NOT met"). For an attempt's directory holding base-B/eval-256/ (attempt 4): every base's,
# each under a "Base B" heading.
#
# lengths: RESULTS holds base-B/eval-{384,512,768,1024}/ for each base B of BASES (comma-separated):
# each base's recall there, unchanged, every depth weighing the same; their mean over the bases;
# the depth lengths by the pre-registered rule (those whose mean lies in [0.35, 0.85]; if none,
# the one closest to 0.60, with "fallback": true).
#
# compare, attempt 3's layout (RESULTS/seed-S/ARM/eval-{1024,2048-yarn2,4096-yarn4}/): writes
# OUT/by-depth-{1024,2048-yarn2,4096-yarn4}/ (every arm by depth, seeds pooled) and
# OUT/compare-vs-{standard,standard-matched}/ (paired differences, 95% bootstrap intervals over
# seeds and items), each with compare.md and compare.json.
#
# compare, attempt 5's layout (RESULTS/base-B/seed-S/ARM/eval-{640,768,896,1024}/ and
# RESULTS/lengths.json with "chosen_by": "pilot", the depth lengths fixed before any base):
# OUT/by-depth-L/ for every length, OUT/compare-vs-{standard,standard-matched}/ as for attempt 4
# with the depth lengths' mean depth_sd (--depth-lengths) and no drop, and OUT/primary.md: the
# primary measure with its bootstrap interval, noise floor and t-interval over the base means
# (scripts/miniature_attempt5.py), the decision rule, and the secondary measures.
#
# compare, attempt 4's layout (RESULTS/base-B/seed-S/ARM/eval-{384,512,768,1024,2048-yarn2,
# 4096-yarn4}/, and each base's base-only runs base-B/eval-{384,…,1024}/): writes
# OUT/by-depth-L/ for every length; OUT/compare-vs-{standard,standard-matched}/ with replicas
# named base-B/seed-S (resampled hierarchically: bases, then seeds, then items) at every length,
# with the pre-registered depth_sd (the mean over the depth lengths: --depth-lengths) and drop
# (from the longest in-window length where standard is above 0.35: --drop-from); OUT/lengths.json
# (the depth lengths, recomputed from the base-only runs); and OUT/primary.md: the three primary
# measures for every arm against both baselines, and the decision rule for rsd.
#
# rsd-eval is taken from RSD_MINI_BIN, else from target/release, else from PATH.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() {
  sed -n '2,/^# rsd-eval is taken/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
[ $# -eq 3 ] || usage
mode="$1" results="$2"
if [ -n "${RSD_MINI_BIN:-}" ]; then
  rsd_eval="$RSD_MINI_BIN/rsd-eval"
elif [ -x target/release/rsd-eval ]; then
  rsd_eval=target/release/rsd-eval
else
  rsd_eval=rsd-eval
fi
arms=(standard rsd standard-matched two-view-clm)
join() { local IFS=,; echo "$*"; }

# by_depth OUT: for each length of the caller's `evals`, every arm by depth (the caller's `runs`
# and `labels` at that length, replicas pooled) into OUT/by-depth-LENGTH/.
by_depth() {
  local e i these these_labels
  for e in "${evals[@]}"; do
    these=() these_labels=()
    for i in "${!runs[@]}"; do
      if [ "${runs[$i]##*/}" = "$e" ]; then
        these+=("${runs[$i]}") these_labels+=("${labels[$i]}")
      fi
    done
    "$rsd_eval" compare "${these[@]}" --labels "$(join "${these_labels[@]}")" \
      --out "$1/by-depth-${e#eval-}" >/dev/null
  done
}

# lengths RESULTS BASES: attempt 4's rule, as JSON on standard output.
lengths() {
  python3 - "$1" "$2" <<'EOF'
import collections, json, os, sys
results, bases = sys.argv[1], [int(b) for b in sys.argv[2].split(",")]
LENGTHS, LO, HI, TARGET = [384, 512, 768, 1024], 0.35, 0.85, 0.60

def recall(path):
    """Mean recall, every depth weighing the same."""
    by = collections.defaultdict(list)
    for line in open(path):
        r = json.loads(line)
        by[r["depth"]].append(r["score"])
    return sum(sum(v) / len(v) for v in by.values()) / len(by)

per = {}
for b in bases:
    per[str(b)] = {}
    for l in LENGTHS:
        path = os.path.join(results, f"base-{b}", f"eval-{l}", "results.jsonl")
        if not os.path.isfile(path):
            sys.exit(f"miniature_report: {path}: no results (the lengths stage scores it)")
        per[str(b)][str(l)] = recall(path)
mean = {str(l): sum(per[str(b)][str(l)] for b in bases) / len(bases) for l in LENGTHS}
depth = [l for l in LENGTHS if LO <= mean[str(l)] <= HI]
fallback = not depth
if fallback:
    depth = [min(LENGTHS, key=lambda l: (abs(mean[str(l)] - TARGET), l))]
print(json.dumps({
    "rule": f"an in-window length is a depth length when the mean over the bases of base-only "
            f"recall (RoPE base 10^4, no scaling) lies in [{LO}, {HI}]; if none, the one closest "
            f"to {TARGET} (fallback; a tie goes to the shorter)",
    "bases": bases, "lengths": LENGTHS, "recall": per, "mean": mean,
    "depth_lengths": depth, "fallback": fallback}, indent=1))
EOF
}

# attempt3 RESULTS OUT: attempt 3's tables (one shared base, replicas = seeds).
attempt3() {
  local results="$1" out="$2" seeds=() d seed arm e
  local evals=(eval-1024 eval-2048-yarn2 eval-4096-yarn4)
  for d in "$results"/seed-*; do
    [ -d "$d" ] && seeds+=("${d##*/seed-}")
  done
  mapfile -t seeds < <(printf '%s\n' "${seeds[@]}" | sort -n)
  local runs=() labels=() replicas=()
  for seed in "${seeds[@]}"; do
    for arm in "${arms[@]}"; do
      for e in "${evals[@]}"; do
        dir="$results/seed-$seed/$arm/$e"
        [ -s "$dir/results.jsonl" ] || { echo "miniature_report: $dir: no results.jsonl" >&2; exit 1; }
        runs+=("$dir") labels+=("$arm") replicas+=("$seed")
      done
    done
  done
  # Per length: the arms by depth, seeds pooled (figures and tables; the intervals are below).
  by_depth "$out"
  for base in standard standard-matched; do
    "$rsd_eval" compare "${runs[@]}" --labels "$(join "${labels[@]}")" \
      --replicas "$(join "${replicas[@]}")" --baseline "$base" \
      --out "$out/compare-vs-$base" >/dev/null
  done
}

# study_replicas RESULTS EVAL…: the caller's `bases` (bases.json's accepted ones, else the
# base-B/ directories holding seed-S/), `seeds` (those of the first base), and `runs`, `labels`
# and `replicas` (base-B/seed-S) for every base, seed, arm and evaluation given (attempts 4, 5).
study_replicas() {
  local results="$1" d b seed arm e dir; shift
  bases=() seeds=() runs=() labels=() replicas=()
  if [ -f "$results/bases.json" ]; then
    mapfile -t bases < <(python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
if not d["complete"]:
    sys.exit(f"miniature_report: {sys.argv[1]}: the bases stage did not finish with enough bases")
print("\n".join(map(str, d["accepted"])))' "$results/bases.json")
    [ ${#bases[@]} -gt 0 ] || exit 1
  else
    for d in "$results"/base-*/seed-*; do
      [ -d "$d" ] && b="${d%/seed-*}" && bases+=("${b##*/base-}")
    done
    mapfile -t bases < <(printf '%s\n' "${bases[@]}" | sort -nu)
  fi
  for d in "$results/base-${bases[0]}"/seed-*; do
    [ -d "$d" ] && seeds+=("${d##*/seed-}")
  done
  mapfile -t seeds < <(printf '%s\n' "${seeds[@]}" | sort -n)
  for b in "${bases[@]}"; do
    for seed in "${seeds[@]}"; do
      for arm in "${arms[@]}"; do
        for e in "$@"; do
          dir="$results/base-$b/seed-$seed/$arm/$e"
          [ -s "$dir/results.jsonl" ] || { echo "miniature_report: $dir: no results.jsonl" >&2; exit 1; }
          runs+=("$dir") labels+=("$arm") replicas+=("base-$b/seed-$seed")
        done
      done
    done
  done
}

# compare_replicas OUT ARGS…: the caller's `runs` against each baseline, replicas resampled
# hierarchically, into OUT/compare-vs-{standard,standard-matched}/ (ARGS: --depth-lengths, …).
compare_replicas() {
  local out="$1" base; shift
  for base in standard standard-matched; do
    "$rsd_eval" compare "${runs[@]}" --labels "$(join "${labels[@]}")" \
      --replicas "$(join "${replicas[@]}")" --baseline "$base" "$@" \
      --out "$out/compare-vs-$base" >/dev/null
  done
}

# attempt5 RESULTS OUT: attempt 5's tables (bases × seeds, hierarchical; the depth lengths the
# pilot fixed, in RESULTS/lengths.json), and primary.md with the t-interval over the base means
# beside each bootstrap interval (scripts/miniature_attempt5.py).
attempt5() {
  local results="$1" out="$2" bases seeds runs labels replicas depth_lengths chosen=() e
  local evals=()
  cp "$results/lengths.json" "$out/lengths.json"
  depth_lengths="$(python3 -c 'import json, sys; print(",".join(map(str, json.load(open(sys.argv[1]))["depth_lengths"])))' "$out/lengths.json")"
  # The depth lengths and 1024, in order.
  for e in ${depth_lengths//,/ } 1024; do evals+=("eval-$e"); done
  mapfile -t evals < <(printf '%s\n' "${evals[@]}" | sort -t- -k2 -nu)
  study_replicas "$results" "${evals[@]}"
  by_depth "$out"
  [[ "$depth_lengths" == *,* ]] && chosen+=(--depth-lengths "$depth_lengths")
  compare_replicas "$out" "${chosen[@]}"
  python3 scripts/miniature_attempt5.py "$results" "$out" > "$out/primary.md.tmp"
  mv "$out/primary.md.tmp" "$out/primary.md"
}

# attempt4 RESULTS OUT: attempt 4's tables (bases × seeds, hierarchical).
attempt4() {
  local results="$1" out="$2" bases seeds runs labels replicas
  local evals=(eval-384 eval-512 eval-768 eval-1024 eval-2048-yarn2 eval-4096-yarn4)
  study_replicas "$results" "${evals[@]}"
  # The depth lengths, from the base-only runs.
  lengths "$results" "$(join "${bases[@]}")" > "$out/lengths.json"
  # Per length: the arms by depth, bases and seeds pooled.
  by_depth "$out"
  # The drop: from the longest in-window length where standard's mean recall is above 0.35, to
  # 4096 with YaRN ×4 (none: not measurable).
  local from
  from="$(python3 - "${runs[@]}" <<'EOF'
import collections, json, sys
cells = collections.defaultdict(list)  # (length, depth) → standard's scores over bases, seeds, items
for run in sys.argv[1:]:
    parts = run.rstrip("/").split("/")
    if parts[-2] != "standard" or "yarn" in parts[-1]:
        continue
    length = int(parts[-1].split("-")[1])
    for line in open(f"{run}/results.jsonl"):
        r = json.loads(line)
        cells[(length, r["depth"])].append(r["score"])
by = collections.defaultdict(list)
for (length, _), v in cells.items():
    by[length].append(sum(v) / len(v))
above = [l for l in sorted(by) if sum(by[l]) / len(by[l]) > 0.35]
print(above[-1] if above else "")
EOF
  )"
  # Paired differences at every length (accuracy@L, depth_sd@L), the pre-registered depth_sd
  # (the mean over the depth lengths, one measure on each bootstrap draw) and the drop.
  local depth_lengths chosen=()
  depth_lengths="$(python3 -c 'import json, sys; print(",".join(map(str, json.load(open(sys.argv[1]))["depth_lengths"])))' "$out/lengths.json")"
  [ -n "$from" ] && chosen+=(--drop-from "$from")
  [[ "$depth_lengths" == *,* ]] && chosen+=(--depth-lengths "$depth_lengths")
  compare_replicas "$out" "${chosen[@]}"
  python3 - "$out" "$from" <<'EOF' > "$out/primary.md"
import json, os, sys
out, drop_from = sys.argv[1], sys.argv[2]
lengths = json.load(open(os.path.join(out, "lengths.json")))
depth_lengths = lengths["depth_lengths"]
fmt = lambda x: f"{x:+.3f}".replace("-", "−")

def measures(kind, base):
    path = os.path.join(out, f"{kind}-vs-{base}", "compare.json")
    if not os.path.exists(path):
        return {}
    return {a["label"]: {m["name"]: m for m in a["measures"]}
            for a in json.load(open(path))["paired"]["arms"]}

def cell(m):
    return f"{fmt(m['diff'])} [{fmt(m['ci'][0])}, {fmt(m['ci'][1])}] (floor {m['noise_floor']:.3f})"

def side(m, lower_is_better):
    lo, hi = m["ci"]
    good, bad = (hi < 0, lo > 0) if lower_is_better else (lo > 0, hi < 0)
    return "helps" if good else "hurts" if bad else "none"

primary = []  # (measure name, pre-registered name, lower is better)
primary.append(("accuracy@1024", "accuracy@1024", False))
primary.append((f"depth_sd@{'+'.join(map(str, depth_lengths))}", "depth_sd at the depth lengths", True))
if drop_from:
    primary.append((f"drop@{drop_from}→4096", "drop", True))

lines = ["# Attempt 4: the primary measures", ""]
lines.append(f"Bases: {', '.join(map(str, lengths['bases']))}. Base-only recall at the in-window "
             "lengths (RoPE base 10⁴, no scaling), mean over the bases: "
             + ", ".join(f"{l}: {lengths['mean'][str(l)]:.3f}" for l in lengths["lengths"]) + ".")
lines.append(f"Depth lengths: {', '.join(map(str, depth_lengths))}"
             + (" (fallback: no length's mean lies in [0.35, 0.85]; the one closest to 0.60)."
                if lengths["fallback"] else " (mean base-only recall in [0.35, 0.85])."))
lines.append(f"The drop runs from {drop_from} tokens (the longest in-window length where standard's "
             "mean recall is above 0.35) to 4096 with YaRN ×4." if drop_from else
             "The drop is **not measurable**: standard's mean recall is above 0.35 at no in-window length.")
lines.append("")
lines.append("Differences arm − baseline, 95% hierarchical bootstrap interval (bases, then seeds, "
             "then items), and the noise floor (95th percentile of |difference| under relabelling).")
for base in ("standard", "standard-matched"):
    got = measures("compare", base)
    lines += ["", f"## Against {base}", "",
              "| arm | " + " | ".join(p[0] for p in primary) + " |",
              "|---|" + "---|" * len(primary)]
    for arm in got:
        lines.append(f"| {arm} − {base} | " + " | ".join(
            cell(got[arm][name]) for name, _, _ in primary) + " |")
lines += ["", "## The decision rule for rsd", "",
          "| primary measure | rsd − standard | rsd − standard-matched | by the rule |",
          "|---|---|---|---|"]
for name, _, lower in primary:
    ms = [measures("compare", b)["rsd"][name] for b in ("standard", "standard-matched")]
    sides = {side(m, lower) for m in ms}
    verdict = ("**rsd helps**" if sides == {"helps"} else "**rsd hurts**" if sides == {"hurts"}
               else "no detected difference; interval widths "
               + ", ".join(f"{m['ci'][1] - m['ci'][0]:.3f}" for m in ms))
    lines.append(f"| {name} | {cell(ms[0])} | {cell(ms[1])} | {verdict} |")
if not drop_from:
    lines.append("| drop | not measurable | not measurable | not measurable |")
if len(depth_lengths) > 1:
    lines += ["", "The pre-registered depth_sd is the mean over the depth lengths "
              f"({', '.join(map(str, depth_lengths))}), measured on each bootstrap draw "
              "(`rsd-eval compare --depth-lengths`); each length's own depth_sd is in compare.md."]
print("\n".join(lines))
EOF
}

case "$mode" in
bar)
  # One base's table; for an attempt-4 directory, every base's, each under its heading.
  if [ -s "$results/eval-256/results.jsonl" ]; then
    set -- "$results/eval-256/results.jsonl" "$3"
  elif [ -s "$results/base/eval-256/results.jsonl" ]; then
    set -- "$results/base/eval-256/results.jsonl" "$3"
  elif compgen -G "$results/base-*/eval-256/results.jsonl" >/dev/null; then
    set -- $(printf '%s\n' "$results"/base-*/eval-256/results.jsonl | sort -V) "$3"
  else
    echo "miniature_report: $results: no eval-256/, base/eval-256/ or base-*/eval-256/ results" >&2
    exit 1
  fi
  python3 - "$@" <<'EOF'
import collections, json, sys
bar = float(sys.argv[-1])
for i, path in enumerate(sys.argv[1:-1]):
    if len(sys.argv) > 3:
        print(("\n" if i else "") + f"#### Base {path.split('/base-')[-1].split('/')[0]}\n")
    rows = [json.loads(l) for l in open(path)]
    by = collections.defaultdict(list)
    for r in rows:
        by[r["depth"]].append(r["score"])
    print("| depth | items | recall (rank 1 of the 4 values) |")
    print("|---|---|---|")
    for d in sorted(by):
        print(f"| {d:g} | {len(by[d])} | {sum(by[d]) / len(by[d]):.3f} |")
    worst = min(sum(v) / len(v) for v in by.values())
    print(f"\nWorst depth: {worst:.3f}; bar: {bar:.2f} at every depth: {'met' if worst >= bar else 'NOT met'}.")
EOF
  ;;
lengths)
  lengths "$results" "$3"
  ;;
lengths-table)
  lengths "$results" "$3" | python3 -c "$(cat <<'EOF'
import json, sys
d = json.load(sys.stdin)
ls, recall, mean = d["lengths"], d["recall"], d["mean"]
print("| base | " + " | ".join(str(l) for l in ls) + " |")
print("|---|" + "---|" * len(ls))
for b in d["bases"]:
    print(f"| {b} | " + " | ".join(f"{recall[str(b)][str(l)]:.3f}" for l in ls) + " |")
print("| mean | " + " | ".join(f"{mean[str(l)]:.3f}" for l in ls) + " |")
chosen = ", ".join(map(str, d["depth_lengths"]))
how = (" (fallback: no mean lies in [0.35, 0.85]; the closest to 0.60)." if d["fallback"]
       else " (mean base-only recall in [0.35, 0.85]).")
print()
print(f"Depth lengths: {chosen}{how}")
EOF
)"
  ;;
compare)
  out="$3"
  mkdir -p "$out"
  if compgen -G "$results/base-*/seed-*" >/dev/null && [ -f "$results/lengths.json" ] \
      && grep -q '"chosen_by": "pilot"' "$results/lengths.json"; then
    attempt5 "$results" "$out"
  elif compgen -G "$results/base-*/seed-*" >/dev/null; then
    attempt4 "$results" "$out"
  elif compgen -G "$results/seed-*" >/dev/null; then
    attempt3 "$results" "$out"
  else
    echo "miniature_report: $results: no seed-*/ or base-*/seed-*/ directories" >&2
    exit 1
  fi
  ;;
*) usage ;;
esac
