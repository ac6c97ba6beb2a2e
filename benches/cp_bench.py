#!/usr/bin/env python3
"""Context parallelism on CPU: one `rsd-train probe` step in one process vs split over 2 ranks
(`--nproc 2 --cp 2`), same batch, same 2 cores (docs/BENCHMARKS.md).

    python benches/cp_bench.py [--config configs/model/bench-llama-4l.json] [--len 4096] [--bin target/debug]

Per layout and objective (standard; rsd with the skip view at s = L/2, with prefix reuse and
without): the step time (fastest of `--repeat 3`, forward + backward, fp32), rank 0's peak RSS,
and the payload rank 0 hands to the gathers against the analytic volume — per layer the
standard view's K and V of this rank's L/N rows (2 · L/N · kv_heads · head_dim · 4 bytes); the
perturbed view's the same whole (no reuse) or for its share of the re-sharded suffix (reuse),
plus one all-to-all of the suffix's d-wide final hidden states; and the backward's collectives,
counted inside autograd: per layer the reduce-scatter of the whole rows' K and V gradient of each
gather, and the all-to-all's inverse. One process gets `--threads 2`, each rank `--threads 1`.

Then the balance of the perturbed pass under context parallelism: the ranks' planned matmul
FLOPs (`perturbed_flops_per_rank` of the probe: the real plan) for splits s over the whole row at
a small L, and at the paper's scale, from the same formula recomputed here, the re-sharded
suffix against leaving the suffix on the standard view's zigzag chunks. Not a test: the times
depend on the machine.
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


def probe(bin_dir, cfg, tokens, cp, objective, reuse=False, split=None, repeat=3):
    args = [bin_dir / "rsd-train", "probe", "--init", cfg, "--tokens", tokens, "--repeat", repeat,
            "--objective", objective, "--checkpoint-layers"]
    if not reuse:
        args.append("--no-prefix-reuse")
    if objective == "rsd":
        L = np.load(tokens).shape[1]
        args += ["--perturb", "skip", "--split", str(L // 2 if split is None else split),
                 "--skip", str(L)]
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
    print("| objective | layout | step | vs 1 process | rank 0 peak RSS | rank 0 payload / step | analytic | in collectives |")
    print("|---|---|---|---|---|---|---|---|")
    d = cfg["hidden_size"]
    for objective, reuse in (("standard", False), ("rsd", False), ("rsd", True)):
        name = objective if objective == "standard" else f"rsd, {'reuse' if reuse else 'no reuse'}"
        base = None
        for cp in (1, 2):
            r = probe(Path(a.bin), a.config, tokens, cp, objective, reuse)
            base = base or r["seconds"]
            # The forward runs twice (the checkpointed forward and the recompute before the
            # backward), each gathering K and V per layer and view.
            std = 2 * (a.len // cp) * kv * 4
            if objective == "standard":
                pert = 0
            elif not reuse:
                pert = std
            else:
                # This rank's share of the padded suffix; at the top, one all-to-all of d-wide
                # rows: cp blocks of the largest rank-to-rank set (at s = L/2 and cp = 2, every
                # block holds a quarter of the suffix).
                suffix = ((a.len - a.len // 2 + 2 * cp - 1) // (2 * cp)) * 2
                pert = 2 * suffix * kv * 4 + cp * (suffix // 2) * d * 4 / (2 * layers)
            # The backward, once: each gather's reduce-scatter of the whole rows' K and V
            # gradient (and, with reuse, the all-to-all's own inverse), counted inside autograd.
            whole = 0 if objective == "standard" else (a.len if not reuse else cp * suffix)
            back = layers * 2 * (a.len + whole) * kv * 4
            if reuse:
                back += cp * (suffix // 2) * d * 4
            analytic = 2 * layers * (std + pert) + back if cp > 1 else 0
            measured = r["comm_bytes_per_run"] if cp > 1 else 0
            comm = f"{r['comm_s_per_run'] / r['seconds']:.0%}" if cp > 1 else "–"
            print(f"| {name} | {'1 process' if cp == 1 else 'cp 2'} | {r['seconds']:.2f} s | "
                  f"{r['seconds'] / base:.2f}× | {r['peak_rss'] / 2**20:.0f} MiB | "
                  f"{measured / 1e6:.2f} MB | {analytic / 1e6:.2f} MB | {comm} |")
    balance(Path(a.bin), cfg, a.config, work)


def zigzag(r, n, start, count):
    c = count // (2 * n)
    return [(start + r * c, c), (start + (2 * n - 1 - r) * c, c)]


def rank_flops(cfg, L, n, s, resharded):
    """Per-rank perturbed-pass FLOPs for split s, closed form (sums of arithmetic series)."""
    d, ffn, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    hd = cfg.get("head_dim", d // cfg["num_attention_heads"])
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    lin, pair = layers * 2 * (d * (q + 2 * kv) + q * d + 3 * d * ffn), layers * 4 * q
    out = []
    for r in range(n):
        if resharded:
            c = -(-(L - s) // (2 * n))
            pieces = zigzag(r, n, s, 2 * n * c)
        else:
            pieces = [(max(a, s), a + c - max(a, s)) for a, c in zigzag(r, n, 0, L) if a + c > s]
        rows = sum(c for _, c in pieces)
        pairs = sum(c * (2 * a + c + 1) // 2 for a, c in pieces)
        out.append(rows * lin + pairs * pair)
    return out


def balance(bin_dir, cfg, cfg_path, work):
    L = 64
    tokens = work / "tokens-64.npy"
    np.save(tokens, np.random.default_rng(1).integers(0, cfg["vocab_size"], size=(1, L)))
    worst = 1.0
    for s in range(1, L):
        r = probe(bin_dir, cfg_path, tokens, 2, "rsd", reuse=True, split=s, repeat=1)
        f = r["perturbed_flops_per_rank"]
        assert f == rank_flops(cfg, L, 2, s, True), (s, f, rank_flops(cfg, L, 2, s, True))
        worst = max(worst, max(f) / (sum(f) / len(f)))
    print(f"\nBalance, measured: the probe's planned perturbed-pass FLOPs per rank, cp 2, L = {L}, "
          f"every s in 1..{L - 1}: slowest rank / mean ≤ {worst:.4f} (and equal to the formula "
          "below at every s)\n")
    print("| model, L, cp | layout of the suffix | slowest / mean, worst s | E_s[slowest] / E_s[mean] |")
    print("|---|---|---|---|")
    for name, path, L, n in (("Llama-3-8B", "llama3-8b.json", 65536, 2),
                             ("Qwen3-4B", "qwen3-4b.json", 262144, 4)):
        arch = json.loads((REPO / "configs" / "model" / path).read_text())
        for resharded in (False, True):
            ratios, slow, mean = [], 0.0, 0.0
            for s in range(1, L, max(1, L // 4096)):
                f = rank_flops(arch, L, n, s, resharded)
                m = sum(f) / n
                ratios.append(max(f) / m)
                slow, mean = slow + max(f), mean + m
            layout = "re-sharded zigzag over [s, L)" if resharded else "standard view's zigzag chunks"
            print(f"| {name}, {L // 1024}K, cp {n} | {layout} | {max(ratios):.3f} | {slow / mean:.3f} |")


if __name__ == "__main__":
    main()
