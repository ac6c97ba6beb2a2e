"""Attempt 5's primary measure and decision rule (docs/RESULTS.md), from the per-item results and
the hierarchical comparisons `scripts/miniature_report.sh compare` wrote.

    python3 scripts/miniature_attempt5.py RESULTS OUT > OUT/primary.md

RESULTS holds base-B/seed-S/ARM/eval-L/results.jsonl and lengths.json (the depth lengths the
pilot fixed); OUT holds compare-vs-standard/ and compare-vs-standard-matched/ (rsd-eval compare
with --replicas base-B/seed-S and --depth-lengths). Beside each bootstrap interval this computes,
from the per-item files alone, the pre-registered t-interval over the base means: for each base,
the mean over its seeds of the paired difference (arm − baseline) of the measure computed on
that replica's items; then mean ± t(0.975, bases − 1) × sd / √bases. The decision needs both
intervals on the same side of 0, for both baselines.
"""

import collections
import json
import math
import os
import sys

BASELINES = ("standard", "standard-matched")
# Two-sided 95% quantiles of Student's t, by degrees of freedom (df 4: the pre-registered 2.776).
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120,
        17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086}


def fmt(x):
    return f"{x:+.3f}".replace("-", "−")


def items(path):
    """depth → the scores and log-probabilities of a results.jsonl."""
    by = collections.defaultdict(list)
    for line in open(path):
        r = json.loads(line)
        by[r["depth"]].append((r["score"], r.get("logprob")))
    return by


def accuracy(by):
    """Mean recall, every depth weighing the same (as rsd-eval compare weighs them)."""
    return sum(sum(s for s, _ in v) / len(v) for v in by.values()) / len(by)


def depth_sd(by):
    """Population standard deviation over the depths of per-depth recall."""
    per = [sum(s for s, _ in v) / len(v) for v in by.values()]
    mean = sum(per) / len(per)
    return math.sqrt(sum((p - mean) ** 2 for p in per) / len(per))


def logprob(by):
    return sum(sum(lp for _, lp in v) / len(v) for v in by.values()) / len(by)


def replicas(results):
    """{base: [seed, …]} from the directories present."""
    out = {}
    for name in sorted(os.listdir(results)):
        if name.startswith("base-") and os.path.isdir(os.path.join(results, name)):
            seeds = sorted(int(s[len("seed-"):]) for s in os.listdir(os.path.join(results, name))
                           if s.startswith("seed-"))
            if seeds:
                out[int(name[len("base-"):])] = seeds
    return dict(sorted(out.items()))


def measure(results, b, seed, arm, name):
    """One measure of one replica's arm, from its per-item files."""
    kind, _, at = name.partition("@")
    lengths = [int(x) for x in at.split("+")]
    values = []
    for length in lengths:
        by = items(os.path.join(results, f"base-{b}", f"seed-{seed}", arm, f"eval-{length}",
                                "results.jsonl"))
        values.append({"accuracy": accuracy, "depth_sd": depth_sd, "logprob": logprob}[kind](by))
    return sum(values) / len(values)


def t_interval(results, reps, arm, baseline, name):
    """(per-base mean differences, mean, (lo, hi)) over the bases; no interval for one base."""
    per_base = []
    for b, seeds in reps.items():
        diffs = [measure(results, b, s, arm, name) - measure(results, b, s, baseline, name)
                 for s in seeds]
        per_base.append(sum(diffs) / len(diffs))
    n = len(per_base)
    mean = sum(per_base) / n
    if n < 2:
        return per_base, mean, None
    sd = math.sqrt(sum((d - mean) ** 2 for d in per_base) / (n - 1))
    if n - 1 not in T975:
        sys.exit(f"miniature_attempt5: {n} bases: no t quantile for {n - 1} degrees of freedom")
    half = T975[n - 1] * sd / math.sqrt(n)
    return per_base, mean, (mean - half, mean + half)


def compared(out, baseline):
    path = os.path.join(out, f"compare-vs-{baseline}", "compare.json")
    return {a["label"]: {m["name"]: m for m in a["measures"]}
            for a in json.load(open(path))["paired"]["arms"]}


def side(lo, hi):
    """Below 0 (less depth dependence), above 0, or neither."""
    return "below" if hi < 0 else "above" if lo > 0 else "neither"


def main(results, out):
    lengths = json.load(open(os.path.join(results, "lengths.json")))
    depth_lengths = lengths["depth_lengths"]
    reps = replicas(results)
    primary = "depth_sd@" + "+".join(map(str, depth_lengths))
    secondary = ([f"accuracy@{l}" for l in depth_lengths] + ["accuracy@1024", "depth_sd@1024"]
                 + [f"logprob@{l}" for l in depth_lengths] + ["logprob@1024"])
    got = {b: compared(out, b) for b in BASELINES}
    n = len(reps)
    lines = ["# Attempt 5: the primary measure", ""]
    lines.append(f"Bases: {', '.join(map(str, reps))}; adaptation seeds "
                 f"{', '.join(map(str, next(iter(reps.values()))))}. Depth lengths: "
                 f"{', '.join(map(str, depth_lengths))}, fixed by the pilot before any base was "
                 "trained.")
    lines.append("")
    lines.append(f"The primary measure is {primary}: the mean over the depth lengths of depth_sd "
                 "(the population standard deviation over the depths of per-depth recall); lower "
                 "means recall depends less on depth. Each difference is arm − baseline with its "
                 "95% hierarchical bootstrap interval (bases, then seeds, then items; 2,000 "
                 "resamples), its noise floor (relabelling), and the 95% t-interval over the "
                 f"{n} base means ({n - 1} degrees of freedom"
                 + (f", t = {T975[n - 1]}" if n - 1 in T975 else "") + "). The bootstrap's "
                 "difference is the measure's on the items pooled over bases and seeds; the t "
                 "column's mean is over the replicas' own differences, and for depth_sd the two "
                 "differ (a standard deviation of pooled recall is not the mean of the replicas' "
                 "standard deviations).")

    def row(arm, baseline, name):
        m = got[baseline][arm][name]
        per_base, mean, t = t_interval(results, reps, arm, baseline, name)
        t_text = f"[{fmt(t[0])}, {fmt(t[1])}]" if t else "— (one base)"
        bases_text = " ".join(fmt(d) for d in per_base)
        return (f"| {arm} − {baseline} | {fmt(m['diff'])} [{fmt(m['ci'][0])}, {fmt(m['ci'][1])}] "
                f"| {m['noise_floor']:.3f} | {fmt(mean)} {t_text} | {bases_text} |", m, t)

    header = ["| comparison | bootstrap: difference [95%] | noise floor | t over base means: "
              "mean [95%] | per base |", "|---|---|---|---|---|"]
    decided = {}
    for baseline in BASELINES:
        lines += ["", f"## {primary}, against {baseline}", ""] + header
        for arm in got[baseline]:
            text, m, t = row(arm, baseline, primary)
            lines.append(text)
            if arm == "rsd":
                decided[baseline] = (m, t)
    lines += ["", "## The decision rule", ""]
    sides = set()
    for baseline, (m, t) in decided.items():
        sides.add(side(*m["ci"]))
        sides.add(side(*t) if t else "neither")
    if sides == {"below"}:
        verdict = ("**rsd makes recall depend less on depth**: rsd − standard and rsd − "
                   "standard-matched are below 0 by both intervals.")
    elif sides == {"above"}:
        verdict = ("**rsd makes recall depend more on depth**: rsd − standard and rsd − "
                   "standard-matched are above 0 by both intervals.")
    else:
        widths = "; ".join(
            f"against {b}: bootstrap {m['ci'][1] - m['ci'][0]:.3f}, t "
            + (f"{t[1] - t[0]:.3f}" if t else "none")
            for b, (m, t) in decided.items())
        verdict = f"**No detected difference** in {primary} (interval widths: {widths})."
    lines.append(verdict)
    lines += ["", "## Secondary measures (rsd)", "",
              "| measure | baseline | bootstrap: difference [95%] | noise floor | t over base "
              "means: mean [95%] | per base |", "|---|---|---|---|---|---|"]
    for name in secondary:
        for baseline in BASELINES:
            text, _, _ = row("rsd", baseline, name)
            lines.append(text.replace(f"| rsd − {baseline} |", f"| {name} | {baseline} |", 1))
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
