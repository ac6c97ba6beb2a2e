#!/usr/bin/env python3
"""Context parallelism on CPU: one `rsd-train probe` step in one process vs split over 2 ranks
(`--nproc 2 --cp 2`), same batch, same 2 cores (docs/BENCHMARKS.md).

    python benches/cp_bench.py [--config configs/model/bench-llama-4l.json] [--len 4096] [--bin target/debug]

Per layout and objective (standard; rsd with the skip view at s = L/2, prefix reuse off in both
layouts, as under context parallelism): the step time (fastest of `--repeat 3`, forward +
backward, fp32), rank 0's peak RSS, and the K/V payload rank 0 hands to the per-layer gathers
against the analytic volume: per layer and view, K and V of this rank's L/N rows
(2 · L/N · kv_heads · head_dim · 4 bytes); their backward reduce-scatters move as much again
inside autograd (not counted). One process gets `--threads 2`, each rank `--threads 1`. Not a
test: the times depend on the machine.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def probe(bin_dir, cfg, tokens, cp, objective):
    args = [bin_dir / "rsd-train", "probe", "--init", cfg, "--tokens", tokens, "--repeat", "3",
            "--objective", objective, "--no-prefix-reuse", "--checkpoint-layers"]
    if objective == "rsd":
        L = np.load(tokens).shape[1]
        args += ["--perturb", "skip", "--split", str(L // 2), "--skip", str(L)]
    args += ["--threads", "2"] if cp == 1 else ["--threads", "1", "--nproc", "2", "--cp", "2"]
    p = subprocess.run(list(map(str, args)), capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"probe failed:\n{p.stderr}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(REPO / "configs" / "model" / "bench-llama-4l.json"))
    ap.add_argument("--len", type=int, default=4096)
    ap.add_argument("--bin", default=os.environ.get("RSD_BIN_DIR", str(REPO / "target" / "debug")))
    a = ap.parse_args()
    cfg = json.loads(Path(a.config).read_text())
    work = Path(tempfile.mkdtemp(prefix="rsd-cp-bench-"))
    tokens = work / "tokens.npy"
    rng = np.random.default_rng(0)
    np.save(tokens, rng.integers(0, cfg["vocab_size"], size=(1, a.len)).astype(np.int64))
    kv = cfg["num_key_value_heads"] * cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    layers = cfg["num_hidden_layers"]
    print(f"{Path(a.config).name} ({layers} layers), L = {a.len}, fp32, checkpointed layers, "
          f"2 CPU cores\n")
    print("| objective | layout | step | vs 1 process | rank 0 peak RSS | K/V payload/layer/view | analytic | in collectives |")
    print("|---|---|---|---|---|---|---|---|")
    for objective in ("standard", "rsd"):
        views = 2 if objective == "rsd" else 1
        base = None
        for cp in (1, 2):
            r = probe(Path(a.bin), a.config, tokens, cp, objective)
            base = base or r["seconds"]
            # Per layer and view the forward runs twice (the checkpointed forward and the
            # recompute before the backward), each gathering K and V.
            gathers = layers * views * 2
            per = r["comm_bytes_per_run"] / gathers if cp > 1 else 0
            analytic = 2 * (a.len // cp) * kv * 4 if cp > 1 else 0
            comm = f"{r['comm_s_per_run'] / r['seconds']:.0%}" if cp > 1 else "–"
            print(f"| {objective} | {'1 process' if cp == 1 else 'cp 2'} | {r['seconds']:.2f} s | "
                  f"{r['seconds'] / base:.2f}× | {r['peak_rss'] / 2**20:.0f} MiB | "
                  f"{per / 1e6:.2f} MB | {analytic / 1e6:.2f} MB | {comm} |")


if __name__ == "__main__":
    main()
