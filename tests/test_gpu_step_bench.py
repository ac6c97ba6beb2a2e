"""benches/gpu_step.py, the GPU benchmark of rsd-train's step against a PyTorch reference, runs on
the CPU with a tiny model: every code path it takes on a GPU (rsd-train with --profile and
--save-at-end false, transformers' reference with fused-optimizer fallbacks, torch.profiler, the
report and the JSON) is exercised here, so on a GPU machine it only has to be run. Times are not
checked; what the phases add up to, and the FLOP count at the paper's widths, are."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rsd_cli import BIN_DIR, run

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benches" / "gpu_step.py"


def bench_module():
    spec = importlib.util.spec_from_file_location("gpu_step", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_model_flops_at_llama3_8b_widths_are_the_stated_count():
    """6 × 1.40 B matmul parameters × 32768 + causal attention = 3.80·10¹⁴ (docs/BENCHMARKS.md)."""
    mod = bench_module()
    c = mod.model_config(REPO / "configs" / "model" / "llama3-8b.json", 4)
    matmul = 4 * (4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336) + 4096 * 128256
    assert matmul == pytest.approx(1.397e9, rel=1e-3)
    want = 6 * matmul * 32768 + 4 * 6 * 32768**2 * 4096
    assert mod.model_flops(c, 32768) == want
    assert want == pytest.approx(3.80e14, rel=5e-3)


def tiny_model_and_shards(d, shards):
    """The bundled books in 128-token rows of the 1,024-token tokenizer at `shards`, and the tiny
    Qwen3 at that vocabulary as `d/tiny.json`."""
    run("rsd-data", "pack", "--len", "128", "--src", REPO / "corpus" / "books", "--tokenizer",
        REPO / "assets" / "tokenizers" / "mini-1k" / "tokenizer.json", "--out", shards)
    config = json.loads((REPO / "configs" / "model" / "tiny-qwen3-64.json").read_text())
    config.update(vocab_size=1024, bos_token_id=0, eos_token_id=0)
    (d / "tiny.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu_step")
    tiny_model_and_shards(d, d / "data" / "shards-128")
    p = subprocess.run([sys.executable, str(BENCH), "--bin", str(BIN_DIR), "--data", str(d / "data"),
                        "--device", "cpu", "--dtype", "fp32", "--shape", f"{d / 'tiny.json'}:2:128",
                        "--steps", "3", "--warmup", "1", "--threads", "1", "--torch-profile",
                        "--json", str(d / "out.json")], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout, json.loads((d / "out.json").read_text())


def test_the_bench_reports_rsd_and_the_reference_side_by_side(bench_run):
    stdout, results = bench_run
    assert results["device"] == "cpu" and results["steps"] == 3
    (shape,) = results["shapes"]
    assert shape["L"] == 128 and shape["layers"] == 2
    runs = shape["runs"]
    assert set(runs) == {"rsd standard", "rsd rsd", "reference"}
    for name, r in runs.items():
        assert len(r["steps_s"]) == 3 and all(s > 0 for s in r["steps_s"]), (name, r)
    for name in runs:
        assert f"| {name} |" in stdout, stdout
    assert "rsd objective ÷ rsd standard" in stdout
    # torch.profiler's table of a reference step.
    assert "Self CPU" in runs["reference"]["profile_table"]


def test_rsd_phases_cover_the_step(bench_run):
    _, results = bench_run
    for objective in ("standard", "rsd"):
        r = results["shapes"][0]["runs"][f"rsd {objective}"]
        phases = r["phases"]
        # Layers are checkpointed (the paper config the bench starts from): the attention's own
        # spans appear in the forward, in the recomputation and in the backward.
        for path in ("data", "forward", "forward/attention forward", "loss", "backward",
                     "backward/recompute", "backward/recompute/attention forward",
                     "backward/attention backward", "optimizer", "optimizer/gradient norm", "idle"):
            assert path in phases, (objective, sorted(phases))
        top = sum(v for k, v in phases.items() if "/" not in k)
        # Medians of each path need not add up exactly to the median step; within a tenth.
        assert top == pytest.approx(r["step_s"], rel=0.1), (objective, phases, r["step_s"])
        # A phase holds the phases under it.
        assert phases["forward/attention forward"] <= phases["forward"]
        assert phases["backward/recompute"] <= phases["backward"]
        assert "phases, median of 2 step(s)" in r["profile_table"], r["profile_table"]


def test_nothing_is_saved_at_the_end_of_a_benchmark_run(tmp_path, bench_run):
    """--save-at-end false: no checkpoint and no final model (a 1.9 B-parameter run would
    otherwise write ~26 GB after every measurement)."""
    d = tmp_path
    tiny_model_and_shards(d, d / "shards")
    res = run("rsd-train", "--config", REPO / "configs" / "tiny-cpu.toml", "--init", d / "tiny.json",
              "--shards", d / "shards", "--steps", "2", "--save-every", "0", "--save-at-end", "false",
              "--progress", "false", "--out", d / "run")
    assert not (d / "run" / "checkpoints").exists() or not any((d / "run" / "checkpoints").iterdir())
    assert not (d / "run" / "model").exists()
    assert "not saved: save_at_end = false" in res.stderr, res.stderr
    lines = (d / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and "phases" not in json.loads(lines[0])  # profile is off by default


def test_variants_rerun_rsd_with_their_environment_and_bad_ones_are_refused(tmp_path):
    d = tmp_path
    tiny_model_and_shards(d, d / "data" / "shards-128")
    base = [sys.executable, str(BENCH), "--bin", str(BIN_DIR), "--data", str(d / "data"), "--device", "cpu",
            "--dtype", "fp32", "--shape", f"{d / 'tiny.json'}:2:128", "--steps", "2", "--warmup", "1",
            "--threads", "1", "--objectives", "standard", "--no-reference"]
    # A run that fails (here by the fault hook that stops rank 0 before its first step, as an
    # out-of-memory would) is reported in its row; the others go on.
    p = subprocess.run(base + ["--variant", "flash:RSD_ATTENTION_KERNEL=flash",
                               "--variant", "broken:RSD_TRAIN_FAULT_FAIL_RANK=0", "--json", str(d / "v.json")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    runs = json.loads((d / "v.json").read_text())["shapes"][0]["runs"]
    assert set(runs) == {"rsd standard", "rsd standard (flash)", "rsd standard (broken)"}
    assert runs["rsd standard (flash)"]["step_s"] > 0
    assert runs["rsd standard (broken)"]["step_s"] is None
    assert "fault injection" in runs["rsd standard (broken)"]["error"], runs
    assert "÷ rsd standard (time)" in p.stdout, p.stdout
    assert "| rsd standard (broken) | — | rsd-train exited" in p.stdout, p.stdout
    bad = subprocess.run(base + ["--variant", "flash"], capture_output=True, text=True)
    assert bad.returncode == 2 and "expected NAME:KEY=VALUE" in bad.stderr, bad.stderr
    missing = subprocess.run(base[:5] + [str(d / "nowhere")] + base[6:], capture_output=True, text=True)
    assert missing.returncode != 0 and "no shards for L=128" in missing.stderr, missing.stderr
