"""rsd-train's training step against a PyTorch reference of the same shape, side by side in one run.

For each shape (an HF config.json cut to `--layers` layers, and a row length L) it runs, one after
the other on the same device:

- `rsd-train` with the standard and the rsd objective (bf16 on CUDA, fp32 master weights and
  AdamW state, layers checkpointed, document masking off, one row of L tokens per step, no
  checkpoints written), with `--profile`: the step split by phase on the device;
- the reference a user would write in an afternoon: transformers' model of the same config
  (`attn_implementation="sdpa"`, gradient checkpointing, bf16), `torch.optim.AdamW(fused=True)`,
  gradient clipping at 1.0, the same row length; optionally with its decoder layers
  `torch.compile`d (`--compile`); and one step under `torch.profiler` (`--torch-profile`).

It prints seconds per step (median, the first `--warmup` steps dropped), model TFLOP/s (6 ×
matmul parameters × L plus causal attention, 6·L²·H·D per layer; recomputation not counted), MFU
against the card's dense bf16 peak, peak memory (the caching allocator's peak reserved bytes, on
both sides), and the ratios rsd ÷ reference. `--json FILE` keeps everything.

    # on a CUDA machine (docs/GPU.md): binaries built against its torch, shards packed with
    # Llama-3's tokenizer at each length (shards-32k, shards-64k: scripts/gpu-build.sh makes them)
    python benches/gpu_step.py --bin DIR --data DIR --device cuda \\
        --shape configs/model/llama3-8b.json:4:32768 --shape configs/model/llama3-8b.json:4:65536 \\
        --shape configs/model/qwen3-4b.json:4:65536 --compile --torch-profile --json out.json
    # on the CPU, a smoke test of the same code paths (tests/test_gpu_step_bench.py runs it)
    python benches/gpu_step.py --bin target/debug --data DIR --device cpu --dtype fp32 \\
        --shape configs/model/tiny-llama.json:2:256 --steps 3 --warmup 1

`--data DIR` holds `shards-<L>` (or `shards-<L/1024>k`) for every length, `rsd-data pack` output of
any corpus whose token ids fit the model's vocabulary.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Dense bf16 tensor-core peaks (TFLOP/s, without sparsity), by a substring of the device name.
PEAKS = [("H200", 989.0), ("H100", 989.0), ("A100", 312.0), ("L40S", 362.0), ("A10", 125.0)]


def parse_shape(s):
    path, layers, length = s.rsplit(":", 2)
    return Path(path), int(layers), int(length)


def model_config(path, layers):
    c = json.loads(Path(path).read_text())
    c["num_hidden_layers"] = layers
    return c


def head_dim(c):
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def model_flops(c, L):
    """Model FLOPs of one standard step (forward + backward) on one row of L tokens."""
    d, hd = c["hidden_size"], head_dim(c)
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    per_layer = d * (q + 2 * kv) + q * d + 3 * d * c["intermediate_size"]
    matmul = c["num_hidden_layers"] * per_layer + d * c["vocab_size"]
    # Causal attention: QKᵀ and PV over half the L² scores, 2·L²·q forward, ×3 with the backward.
    attention = c["num_hidden_layers"] * 6 * L * L * q
    return 6 * matmul * L + attention


def shards_for(data, L):
    for name in (f"shards-{L}", f"shards-{L // 1024}k"):
        if (Path(data) / name).is_dir():
            return Path(data) / name
    sys.exit(f"gpu_step: no shards for L={L} under {data} (expected shards-{L} or shards-{L // 1024}k: "
             f"rsd-data pack --len {L} --src corpus/books --tokenizer <Llama-3 tokenizer.json> --out ...)")


def median_after(values, warmup):
    kept = values[warmup:] if len(values) > warmup else values
    return statistics.median(kept)


def parse_variant(s):
    """NAME:KEY=VALUE[,KEY=VALUE…] -> (NAME, {KEY: VALUE})."""
    name, _, assignments = s.partition(":")
    env = dict(a.split("=", 1) for a in assignments.split(",") if "=" in a)
    if not name or not env:
        raise argparse.ArgumentTypeError(f"--variant {s!r}: expected NAME:KEY=VALUE[,KEY=VALUE…]")
    return name, env


def run_rsd(args, cfg_path, L, objective, out, env=None):
    cmd = [str(Path(args.bin) / "rsd-train"), "--config", str(REPO / "configs/llama3-8b-64k.toml"),
           "--init", str(cfg_path), "--shards", str(shards_for(args.data, L)),
           "--dp", "1", "--cp", "1", "--shard-optimizer", "false", "--doc-mask", "false",
           "--max-position-embeddings", str(L), "--tokens-per-step", str(L), "--micro-batch", "1",
           "--device", args.device, "--dtype", args.dtype, "--objective", objective,
           "--steps", str(args.steps), "--heldout-every", "0", "--progress", "false",
           "--save-every", "0", "--save-at-end", "false", "--profile", "--out", str(out)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if p.returncode != 0:
        # Reported in its row (an out-of-memory on a smaller card, say); the other runs go on.
        last = (p.stderr.strip().splitlines() or ["no message"])[-1]
        print(f"gpu_step: rsd-train failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-4000:]}",
              file=sys.stderr)
        return {"step_s": None, "error": f"rsd-train exited {p.returncode}: {last}"}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step_s"] for r in rows]
    kept = rows[args.warmup:] if len(rows) > args.warmup else rows
    paths = sorted({k for r in kept for k in r.get("phases", {})})
    phases = {k: statistics.median(r["phases"].get(k, 0.0) for r in kept) for k in paths}
    peak = max((r.get("device_peak_reserved") or 0) for r in rows) or None
    return {"step_s": median_after(steps, args.warmup), "steps_s": steps, "phases": phases,
            "peak_bytes": peak, "peak_rss": max(r["peak_rss"] for r in rows),
            "profile_table": profile_table(p.stderr)}


def profile_table(stderr):
    """rsd-train's table of phase medians, from its stderr."""
    lines = stderr.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("phases, median")), None)
    if start is None:
        return ""
    end = start + 1
    while end < len(lines) and lines[end].startswith("  "):
        end += 1
    return "\n".join(lines[start:end])


def run_reference(args, c, L, compiled):
    """The afternoon PyTorch reference: seconds per step and peak memory, or the error (an
    out-of-memory: it holds the whole [L × vocab] logits) in its row."""
    import torch

    try:
        return reference_steps(args, c, L, compiled)
    except torch.OutOfMemoryError as e:
        message = str(e).splitlines()[0]
    # Out of the handler, the failed step's tensors are unreachable: give their memory back.
    import gc

    gc.collect()
    torch.cuda.empty_cache()
    return {"step_s": None, "error": f"out of memory: {message}"}


def new_model(config, dtype):
    """transformers' model of `config` in `dtype` (the keyword is `dtype` since 4.56; older
    releases take `torch_dtype`)."""
    import transformers

    try:
        return transformers.AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    except TypeError:
        return transformers.AutoModelForCausalLM.from_config(config, torch_dtype=dtype,
                                                              attn_implementation="sdpa")


def reference_steps(args, c, L, compiled):
    import torch
    import transformers

    torch.manual_seed(0)
    dev = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    if args.threads and args.device == "cpu":
        torch.set_num_threads(args.threads)
    config = transformers.AutoConfig.for_model(**{k: v for k, v in c.items() if k != "architectures"})
    config._attn_implementation = "sdpa"
    model = new_model(config, dtype).to(dev)
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    model.train()
    if compiled:
        for layer in model.model.layers:
            layer.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=args.device == "cuda")
    gen = torch.Generator().manual_seed(1)
    vocab = c["vocab_size"]

    def step():
        ids = torch.randint(0, vocab, (1, L), generator=gen).to(dev)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t)
    out = {"step_s": median_after(times, args.warmup), "steps_s": times,
           "peak_bytes": torch.cuda.max_memory_reserved(dev) if dev.type == "cuda" else None}
    if args.torch_profile and not compiled:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        with profile(activities=acts) as prof:
            step()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
        key = "cuda_time_total" if dev.type == "cuda" else "cpu_time_total"
        out["profile_table"] = prof.key_averages().table(sort_by=key, row_limit=25)
    del model, opt
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return out


def peak_tflops(args):
    if args.peak_tflops:
        return args.peak_tflops
    if args.device != "cuda":
        return None
    import torch

    name = torch.cuda.get_device_name(0)
    return next((p for k, p in PEAKS if k in name), None)


def device_name(args):
    if args.device != "cuda":
        return "cpu"
    import torch

    return torch.cuda.get_device_name(0)


def fmt_bytes(b):
    return "—" if not b else f"{b / 2**30:.1f} GiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("RSD_BIN_DIR", str(REPO / "target" / "release")),
                    help="directory holding rsd-train")
    ap.add_argument("--data", required=True, help="directory of shards-<L> / shards-<L/1024>k")
    ap.add_argument("--shape", action="append", type=parse_shape, required=True,
                    help="CONFIG.json:LAYERS:L (repeatable)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians")
    ap.add_argument("--objectives", default="standard,rsd")
    ap.add_argument("--compile", action="store_true", help="also the reference with its layers compiled")
    ap.add_argument("--torch-profile", action="store_true", help="torch.profiler's table of one reference step")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for both (0 = default)")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="the card's dense bf16 peak (default: by name)")
    ap.add_argument("--variant", action="append", type=parse_variant, default=[],
                    help="NAME:KEY=VALUE[,…]: rsd-train's runs again with these environment variables "
                         "(e.g. flash:RSD_ATTENTION_KERNEL=flash), reported as 'rsd OBJECTIVE (NAME)'")
    ap.add_argument("--no-reference", action="store_true",
                    help="rsd-train only (ratios are then to the first rsd run)")
    ap.add_argument("--json", type=Path, help="write every measurement here")
    args = ap.parse_args()
    if args.warmup >= args.steps:
        sys.exit(f"gpu_step: --warmup {args.warmup} leaves no step of --steps {args.steps} to measure")
    peak = peak_tflops(args)
    results = {"device": device_name(args), "peak_tflops": peak, "dtype": args.dtype, "steps": args.steps,
               "warmup": args.warmup, "shapes": []}
    print(f"# device: {results['device']}; peak {peak or '—'} dense bf16 TFLOP/s; "
          f"{args.steps} steps each, medians without the first {args.warmup}\n")
    for cfg_path, layers, L in args.shape:
        c = model_config(cfg_path, layers)
        flops = model_flops(c, L)
        with tempfile.TemporaryDirectory() as tmp:
            arch = Path(tmp) / "config.json"
            arch.write_text(json.dumps(c))
            shape = {"config": str(cfg_path), "layers": layers, "L": L, "model_flops": flops, "runs": {}}
            for objective in args.objectives.split(","):
                shape["runs"][f"rsd {objective}"] = run_rsd(args, arch, L, objective, Path(tmp) / objective)
                for name, env in args.variant:
                    shape["runs"][f"rsd {objective} ({name})"] = run_rsd(
                        args, arch, L, objective, Path(tmp) / f"{objective}-{name}", env)
            if not args.no_reference:
                shape["runs"]["reference"] = run_reference(args, c, L, compiled=False)
                if args.compile:
                    shape["runs"]["reference compiled"] = run_reference(args, c, L, compiled=True)
        results["shapes"].append(shape)
        report(shape, peak)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


def report(shape, peak):
    runs, flops = shape["runs"], shape["model_flops"]
    ref = runs.get("reference") or next(iter(runs.values()))
    print(f"## {Path(shape['config']).stem} × {shape['layers']} layers, L = {shape['L']}\n")
    against = "reference" if "reference" in runs else next(iter(runs))
    print(f"| run | s/step | TFLOP/s | MFU | peak memory | ÷ {against} (time) | ÷ {against} (memory) |")
    print("|---|---|---|---|---|---|---|")
    for name, r in runs.items():
        s = r["step_s"]
        if s is None or not ref.get("step_s"):
            why = r.get("error") or f"(no time for {against}: {ref.get('error')})"
            print(f"| {name} | {'—' if s is None else f'{s:.3f}'} | {why} | | | | |")
            continue
        # The rsd objective does more than a standard step's model FLOPs: TFLOP/s and MFU are
        # stated for standard steps only.
        if name.startswith("rsd rsd"):
            tf, mfu = "—", "—"
        else:
            tflops = flops / s / 1e12
            tf, mfu = f"{tflops:.3g}", (f"{100 * tflops / peak:.0f}%" if peak else "—")
        mem_ratio = (f"{r['peak_bytes'] / ref['peak_bytes']:.2f}"
                     if r.get("peak_bytes") and ref.get("peak_bytes") else "—")
        print(f"| {name} | {s:.3f} | {tf} | {mfu} | {fmt_bytes(r.get('peak_bytes'))} "
              f"| {s / ref['step_s']:.2f} | {mem_ratio} |")
    if runs.get("rsd rsd", {}).get("step_s") and runs.get("rsd standard", {}).get("step_s"):
        print(f"\nrsd objective ÷ rsd standard: {runs['rsd rsd']['step_s'] / runs['rsd standard']['step_s']:.2f}")
    for name, r in runs.items():
        if r.get("profile_table"):
            print(f"\n### {name}: profile\n\n```\n{r['profile_table']}\n```")
    print()


if __name__ == "__main__":
    main()
