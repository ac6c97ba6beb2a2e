#!/usr/bin/env python3
"""Forward+backward time of rsd-model vs transformers (PyTorch eager and SDPA attention) for the
same config, threads and sequence length, plus the attention primitive vs plain causal SDPA.

    python benches/model_bench.py [--config configs/model/bench-llama-4l.json] [--seq-len 2048]
        [--threads 2] [--iters 5] [--bin target/debug] [--out REPORT.md]

Prints a Markdown report (docs/BENCHMARKS.md, "rsd-model", holds the latest); --out also writes it.

One step = forward, full-logit next-token CE, backward, zero grads (fp32, batch 1, CPU). Times are
medians after one warm-up. Not a test: numbers depend on the machine.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def hf_step_time(config_path, seq_len, threads, iters, attn):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.set_num_threads(threads)
    cfg = AutoConfig.from_pretrained(config_path)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32)
    model.train()
    tokens = torch.randint(0, cfg.vocab_size, (1, seq_len))
    pos = torch.arange(seq_len)[None]
    mask = torch.ones_like(tokens)

    def step():
        logits = model(input_ids=tokens, position_ids=pos, attention_mask=mask).logits
        loss = torch.nn.functional.cross_entropy(
            logits[0, :-1].reshape(-1, cfg.vocab_size), tokens[0, 1:])
        loss.backward()
        model.zero_grad(set_to_none=False)

    step()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(REPO / "configs/model/bench-llama-4l.json"))
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--bin", default=os.environ.get("RSD_BIN_DIR", str(REPO / "target/debug")))
    ap.add_argument("--out", help="also write the report to this file")
    a = ap.parse_args()

    with tempfile.TemporaryDirectory() as cfg_dir:
        (Path(cfg_dir) / "config.json").write_text(Path(a.config).read_text())
        eager = hf_step_time(cfg_dir, a.seq_len, a.threads, a.iters, "eager")
        sdpa = hf_step_time(cfg_dir, a.seq_len, a.threads, a.iters, "sdpa")
    ours = json.loads(subprocess.run(
        [str(Path(a.bin) / "rsd-model"), "bench", "--config", a.config, "--seq-len", str(a.seq_len),
         "--threads", str(a.threads), "--iters", str(a.iters)],
        check=True, capture_output=True, text=True).stdout)
    cmd = (f"python benches/model_bench.py --config {os.path.relpath(a.config, REPO)} "
           f"--seq-len {a.seq_len} --threads {a.threads} --iters {a.iters}")
    m = ours["model_fwd_bwd_s"]
    rows = [
        ("rsd-model (tch, fused attention)", m, 1.0),
        ("transformers, eager attention", eager, eager / m),
        ("transformers, SDPA attention", sdpa, sdpa / m),
    ]
    text = [
        "# rsd-model benchmarks",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs, "
        f"torch {torch.__version__}, {a.threads} threads, fp32, batch 1, L = {a.seq_len}, "
        f"config `{os.path.relpath(a.config, REPO)}` ({ours['parameters'] / 1e6:.1f} M parameters). "
        f"Median of {a.iters} after one warm-up. One step = forward + full-logit CE + backward.",
        "",
        "Reproduce (after `cargo build -p rsd-model-cli`):",
        "",
        "```",
        cmd,
        "```",
        "",
        "| implementation | s / step | time ÷ rsd-model |",
        "|---|---:|---:|",
        *[f"| {n} | {t:.3f} | {r:.2f} |" for n, t, r in rows],
        "",
        "Attention alone (forward + backward, q/k/v `[1, H, L, D]` = "
        f"`[1, {json.loads(Path(a.config).read_text())['num_attention_heads']}, {a.seq_len}, "
        f"{json.loads(Path(a.config).read_text()).get('head_dim')}]`):",
        "",
        "| path | s | ÷ SDPA |",
        "|---|---:|---:|",
        f"| libtorch causal SDPA | {ours['sdpa_fwd_bwd_s']:.4f} | 1.00 |",
        f"| primitive, one causal block | {ours['primitive_fwd_bwd_s']:.4f} | "
        f"{ours['primitive_fwd_bwd_s'] / ours['sdpa_fwd_bwd_s']:.2f} |",
        f"| primitive, [prefix L/2] + [own L/2] merged by LSE (+ first half) | "
        f"{ours['primitive_split_fwd_bwd_s']:.4f} | "
        f"{ours['primitive_split_fwd_bwd_s'] / ours['sdpa_fwd_bwd_s']:.2f} |",
        "",
    ]
    if a.out:
        Path(a.out).write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    sys.exit(main())
