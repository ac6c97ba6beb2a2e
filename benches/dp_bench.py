#!/usr/bin/env python3
"""Data-parallel training on CPU: one process vs 2 ranks (replicated and sharded optimizer), on
the same global batch and the same 2 cores, from each run's metrics.jsonl (docs/BENCHMARKS.md).

    python benches/dp_bench.py [--steps 8] [--len 256] [--tokens-per-step 2048] [--bin target/debug]

Per run: the median step time (the first step, which pays one-off allocations, left out), the
share of it spent in collectives (`comm_s`, waiting for the other rank included), and the payload
handed to collectives per step (`comm_bytes`) against the analytic volume: the fp32 gradient
(4·P bytes) for the all-reduce; for ZeRO-2 (`--shard-optimizer`) the fp32 gradient once per
local micro-batch m plus this rank's block of new parameters (m·4·P + 4·P/N) for reduce-scatter +
all-gather, blocking or overlapped with the backward (`--overlap-grad-reduce`; with
`--checkpoint-layers` each layer's gradient is on the wire during the next layer's backward). On the wire a ring all-reduce moves 2·(N−1)/N of its
payload per rank, reduce-scatter + all-gather (N−1)/N of each: the same total. One process gets
`--threads 2`, each of 2 ranks `--threads 1`. Not a test: the times depend on the machine.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--len", type=int, default=256)
    ap.add_argument("--tokens-per-step", type=int, default=2048)
    ap.add_argument("--init", default=str(REPO / "configs" / "model" / "tiny-qwen3-64.json"))
    ap.add_argument("--bin", default=os.environ.get("RSD_BIN_DIR", str(REPO / "target" / "debug")))
    a = ap.parse_args()
    bin_dir = Path(a.bin)
    work = Path(tempfile.mkdtemp(prefix="rsd-dp-bench-"))
    shards = work / "shards"
    subprocess.run([bin_dir / "rsd-data", "pack", "--len", str(a.len), "--src", REPO / "corpus" / "books",
                    "--out", shards], check=True, capture_output=True)
    shard = ["--shard-optimizer", "true"]
    ckpt = ["--checkpoint-layers", "true"]
    runs = {
        "1 process": (1, []),
        "2 ranks, replicated AdamW": (2, []),
        "2 ranks, ZeRO-2, blocking": (2, shard + ["--overlap-grad-reduce", "false"]),
        "2 ranks, ZeRO-2, overlapped": (2, shard),
        "2 ranks, ZeRO-2 + checkpoint_layers, blocking": (2, shard + ckpt + ["--overlap-grad-reduce", "false"]),
        "2 ranks, ZeRO-2 + checkpoint_layers, overlapped": (2, shard + ckpt),
    }
    # Local micro-batches per rank and step: ZeRO-2 reduce-scatters the gradient after each.
    micro = a.tokens_per_step // a.len // 2
    rows = []
    params = None
    for name, (n, extra) in runs.items():
        out = work / name.replace(" ", "_").replace(",", "")
        cmd = [bin_dir / "rsd-train", "--config", REPO / "configs" / "tiny-cpu.toml", "--shards", shards,
               "--init", a.init, "--out", out, "--progress", "false", "--steps", str(a.steps),
               "--save-every", "0", "--tokens-per-step", str(a.tokens_per_step),
               "--threads", "2" if n == 1 else "1", *extra]
        if n > 1:
            cmd += ["--nproc", str(n)]
        p = subprocess.run(list(map(str, cmd)), capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"{name} failed:\n{p.stderr}")
        if params is None:
            params = int(next(l for l in p.stderr.splitlines() if " params, " in l)
                         .split("rsd-train: ")[1].split(" params")[0])
        recs = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()][1:]
        step = statistics.median(r["step_s"] for r in recs)
        comm = statistics.median(r["comm_s"] for r in recs)
        sent = statistics.median(r["comm_bytes"] for r in recs)
        analytic = 0 if n == 1 else (4 * params if not extra else micro * 4 * params + 4 * params // n)
        rows.append((name, step, comm, sent, analytic))
    base = rows[0][1]
    print(f"tiny Qwen3 ({params:,} parameters, fp32), seq_len {a.len}, {a.tokens_per_step} tokens/step, "
          f"{a.steps} steps (median of steps 2–{a.steps}), 2 CPU cores\n")
    print("| run | step time | vs 1 process | in collectives | payload/step | analytic | ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, step, comm, sent, analytic in rows:
        ratio = f"{sent / analytic:.3f}" if analytic else "–"
        print(f"| {name} | {step:.2f} s | {step / base:.2f}× | {comm / step:.0%} ({comm:.2f} s) | "
              f"{sent / 1e6:.1f} MB | {analytic / 1e6:.1f} MB | {ratio} |")


if __name__ == "__main__":
    main()
