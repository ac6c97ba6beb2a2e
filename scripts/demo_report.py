"""What scripts/demo.sh prints at its end: the recall of the base and both adapted models at
1,024 tokens, rsd − standard with its paired interval and what it means, and each stage's time.
Everything is read from `rsd-eval compare`'s compare.json and the demo's timings.tsv.

    python3 scripts/demo_report.py OUT TIMINGS TOTAL_SECONDS
"""
import json
import sys


def measure(arm, name):
    for m in arm["measures"]:
        if m["name"] == name:
            return m
    sys.exit(f"demo_report: compare.json has no {name} for {arm['label']}")


def meaning(m):
    lo, hi = m["ci"]
    if lo > 0:
        return ("the interval lies above 0: on these items rsd's adaptation carries the base's "
                "recall across the 1,024-token window far better than standard adaptation of the "
                "same base does.")
    if hi < 0:
        return "the interval lies below 0: here rsd's adaptation recalls less than standard's."
    return ("the interval includes 0: no difference is detected between the two adaptations on "
            "these items.")


def main(out, timings, total):
    cmp = json.load(open(f"{out}/compare.json"))
    length = max(cmp["lengths"])
    name = f"accuracy@{length}"
    arms = {a["label"]: a for a in cmp["paired"]["arms"]}
    rsd, base = measure(arms["rsd"], name), measure(arms["base"], name)
    items = arms["rsd"]["items"]
    print(f"recall at {length} tokens ({items} items, {len(cmp['depths'])} depths; chance 0.25):")
    print(f"  base (trained at 256)  {base['arm']:.3f}")
    print(f"  standard adaptation    {rsd['baseline']:.3f}")
    print(f"  rsd adaptation         {rsd['arm']:.3f}")
    lo, hi = rsd["ci"]
    print(f"rsd − standard: {rsd['diff']:+.3f}, 95% paired bootstrap interval [{lo:+.3f}, {hi:+.3f}]"
          f" (noise floor {rsd['noise_floor']:.3f})")
    print(f"  {meaning(rsd)}")
    print("  One base and one seed; the study's three bases × two seeds: docs/RESULTS.md.")
    sd = measure(arms["rsd"], f"depth_sd@{length}")
    print(f"depth_sd@{length} (spread of recall over depths): rsd {sd['arm']:.3f}, standard "
          f"{sd['baseline']:.3f}, difference {sd['diff']:+.3f} [{sd['ci'][0]:+.3f}, {sd['ci'][1]:+.3f}]")
    print("time per stage (s):")
    for line in open(timings).read().splitlines()[1:]:
        stage, seconds = line.split("\t")
        print(f"  {stage:<32} {int(seconds):>5}")
    print(f"  {'total':<32} {total:>5}")
    print()
    print(f"figure:  {out}/accuracy_by_depth.png (recall by depth: base, standard, rsd)")
    print(f"tables:  {out}/compare.md (every measure, paired against standard)")
    print(f"models:  {out}/standard/model, {out}/rsd/model (Hugging Face directories)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
