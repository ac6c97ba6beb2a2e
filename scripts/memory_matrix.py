#!/usr/bin/env python3
"""Runs the memory matrix (benches/memory-matrix.toml) through `rsd-train memory --measure`, and
writes the plan-against-measured table: as JSON (benches/memory-matrix.json) and as the Markdown
table between the `memory-matrix` markers of docs/MEMORY.md.

    scripts/memory_matrix.py [--bin target/release/rsd-train] [--only NAME,…] [--ci]
                             [--steps 1] [--no-write]

Every entry must be within ±10% of the measured bytes per category and at the peak; the script
exits 1 when one is not (and names it). With --only, the named entries' results replace their
earlier ones in the JSON and the table; --ci and --no-write write nothing.
"""
import argparse
import json
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MATRIX = ROOT / "benches" / "memory-matrix.toml"
BASE = ROOT / "configs" / "memory-cpu.toml"
CATEGORIES = ["weights", "gradients", "optimizer_state", "saved_activations", "transient",
              "communication", "optimizer_update", "peak"]
TOLERANCE = 0.10
# A category smaller than this (bytes) on both sides is not compared: nothing to plan.
NEGLIGIBLE = 64 << 10


def entries(only=None, ci=False):
    """The matrix's entries, optionally only the named ones or the CI ones."""
    es = tomllib.loads(MATRIX.read_text())["entry"]
    if only:
        es = [e for e in es if e["name"] in only]
    if ci:
        es = [e for e in es if e.get("ci")]
    return es


def command(binary, e, steps=1):
    """The command line measuring entry `e`."""
    return [str(binary), "memory", "--config", str(BASE), "--init", str(ROOT / e["arch"]),
            "--objective", e["objective"], "--max-position-embeddings", str(e["seq_len"]),
            "--dp", str(e["dp"]), "--cp", str(e["cp"]),
            "--shard-optimizer", str(e["shard_optimizer"]).lower(),
            "--checkpoint-layers", str(e["checkpoint_layers"]).lower(),
            "--doc-mask", str(e.get("doc_mask", False)).lower(),
            "--measure", str(steps), "--json"]


def measure(binary, e, steps=1, timeout=1800):
    """Runs entry `e`; its report (plan, measured, ratio) with the wall time."""
    t0 = time.time()
    p = subprocess.run(command(binary, e, steps), capture_output=True, text=True, cwd=ROOT,
                       timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{e['name']}: exit {p.returncode}\n{p.stderr}")
    report = json.loads(p.stdout)
    report["wall_s"] = time.time() - t0
    return report


def plan_bytes(report, category):
    """The plan's bytes of a category (or its CPU peak)."""
    plan = report["plan"]
    if category == "peak":
        return plan["peak_cpu"]
    return sum(i["bytes"] for i in plan["items"] if i["category"] == category)


def misses(report):
    """The categories outside ±10%: (category, plan, measured)."""
    out = []
    for c in CATEGORIES:
        p, m = plan_bytes(report, c), report["measured"][c]
        if max(p, m) < NEGLIGIBLE:
            continue
        if m == 0 or abs(p / m - 1) > TOLERANCE:
            out.append((c, p, m))
    return out


def table(rows):
    """Markdown: one row per entry, plan/measured MiB and the ratio per category."""
    mib = lambda b: f"{b / 2**20:.1f}"
    head = "| entry | " + " | ".join(CATEGORIES) + " | s |"
    sep = "|---|" + "---|" * (len(CATEGORIES) + 1)
    lines = [head, sep]
    for e, r in rows:
        cells = []
        for c in CATEGORIES:
            p, m = plan_bytes(r, c), r["measured"][c]
            if max(p, m) < NEGLIGIBLE:
                cells.append(f"{mib(p)} / {mib(m)}")
            else:
                cells.append(f"{mib(p)} / {mib(m)} ({p / m:.2f})" if m else f"{mib(p)} / 0")
        lines.append(f"| {e['name']} | " + " | ".join(cells) + f" | {r['wall_s']:.0f} |")
    return "\n".join(lines)


def write_doc(text):
    """Replaces the table between the markers of docs/MEMORY.md."""
    doc = ROOT / "docs" / "MEMORY.md"
    s = doc.read_text()
    begin, end = "<!-- memory-matrix:begin -->", "<!-- memory-matrix:end -->"
    if begin not in s or end not in s:
        raise SystemExit(f"{doc}: the {begin} … {end} markers are missing")
    head, rest = s.split(begin, 1)
    _, tail = rest.split(end, 1)
    doc.write_text(f"{head}{begin}\n{text}\n{end}{tail}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "rsd-train"))
    ap.add_argument("--only", default="")
    ap.add_argument("--ci", action="store_true")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    rows, bad = [], []
    for e in entries([n for n in a.only.split(",") if n], a.ci):
        r = measure(a.bin, e, a.steps)
        rows.append((e, r))
        m = misses(r)
        status = "ok" if not m else "MISS " + ", ".join(
            f"{c} {p / 2**20:.2f}/{x / 2**20:.2f} MiB" for c, p, x in m)
        print(f"{e['name']}: {status} ({r['wall_s']:.0f} s)", file=sys.stderr, flush=True)
        if m:
            bad.append(e["name"])
    print(table(rows))
    if not a.no_write and not a.ci:
        # Entries run now replace their earlier results; the others keep theirs.
        out = ROOT / "benches" / "memory-matrix.json"
        done = {e["name"]: (e, r) for e, r in rows}
        kept = json.loads(out.read_text()) if out.exists() else []
        kept = {k["entry"]["name"]: (k["entry"], k["report"]) for k in kept}
        merged = [done.get(e["name"]) or kept.get(e["name"]) for e in entries()]
        merged = [m for m in merged if m is not None]
        out.write_text(json.dumps([{"entry": e, "report": r} for e, r in merged], indent=1) + "\n")
        write_doc(table(merged))
    if bad:
        print(f"outside ±{TOLERANCE:.0%}: {', '.join(bad)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
