#!/usr/bin/env bash
# The miniature study's tables, from its per-item results alone (each run directory's
# results.jsonl). scripts/miniature.sh calls it; on the committed results it reproduces every
# number of docs/RESULTS.md's study 2:
#
#   scripts/miniature_report.sh bar RESULTS BAR      # the base's recall per depth against BAR
#   scripts/miniature_report.sh compare RESULTS OUT  # the arms by depth, and paired differences
#   scripts/miniature_report.sh compare docs/results/miniature runs/miniature-report
#
# RESULTS holds base/eval-256/ and seed-S/ARM/eval-{1024,2048-yarn2,4096-yarn4}/, each with a
# results.jsonl. `bar` prints a Markdown table and a verdict line ("met" / "NOT met"). `compare`
# writes OUT/by-depth-{1024,2048-yarn2,4096-yarn4}/ (every arm by depth, seeds pooled) and
# OUT/compare-vs-{standard,standard-matched}/ (paired differences, 95% bootstrap intervals over
# seeds and items), each with compare.md and compare.json. rsd-eval is taken from RSD_MINI_BIN,
# else from target/release, else from PATH.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() {
  sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
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
evals=(eval-1024 eval-2048-yarn2 eval-4096-yarn4)

case "$mode" in
bar)
  base="$results/base/eval-256/results.jsonl"
  [ -s "$base" ] || { echo "miniature_report: $base: no results" >&2; exit 1; }
  python3 - "$base" "$3" <<'EOF'
import collections, json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
bar = float(sys.argv[2])
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
compare)
  out="$3"
  mkdir -p "$out"
  seeds=()
  for d in "$results"/seed-*; do
    [ -d "$d" ] && seeds+=("${d##*/seed-}")
  done
  [ ${#seeds[@]} -gt 0 ] || { echo "miniature_report: $results: no seed-*/ directories" >&2; exit 1; }
  mapfile -t seeds < <(printf '%s\n' "${seeds[@]}" | sort -n)
  runs=() labels=() replicas=()
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
  for e in "${evals[@]}"; do
    these=() these_labels=()
    for i in "${!runs[@]}"; do
      if [ "${runs[$i]##*/}" = "$e" ]; then
        these+=("${runs[$i]}") these_labels+=("${labels[$i]}")
      fi
    done
    "$rsd_eval" compare "${these[@]}" --labels "$(IFS=,; echo "${these_labels[*]}")" \
      --out "$out/by-depth-${e#eval-}" >/dev/null
  done
  for base in standard standard-matched; do
    "$rsd_eval" compare "${runs[@]}" --labels "$(IFS=,; echo "${labels[*]}")" \
      --replicas "$(IFS=,; echo "${replicas[*]}")" --baseline "$base" \
      --out "$out/compare-vs-$base" >/dev/null
  done
  ;;
*) usage ;;
esac
