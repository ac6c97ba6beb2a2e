"""rsd-train memory: the plan per category against libtorch's CPU allocator.

* the CI entries of benches/memory-matrix.toml (both architectures, standard and rsd, one and
  several ranks, checkpointing and sharding on and off) run one measured step each through
  `rsd-train memory --measure 1 --json`; every category the plan or the measurement puts above
  64 KiB, and the peak, must be within ±10% (scripts/memory_matrix.py runs the whole matrix);
* a layout that cannot fit is refused, by `rsd-train memory` and by a CUDA training run, naming
  the smallest change that fits.

Binaries: $RSD_BIN_DIR (default <repo>/target/debug). The file runs in about a minute.
"""
import importlib.util
import json
from pathlib import Path

import pytest

from rsd_cli import exe, run

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("memory_matrix", REPO / "scripts" / "memory_matrix.py")
matrix = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(matrix)

LLAMA = REPO / "configs" / "model" / "llama3-8b.json"


@pytest.mark.parametrize("entry", matrix.entries(ci=True), ids=lambda e: e["name"])
def test_the_plan_is_within_ten_percent_of_the_measured_bytes(entry):
    p = run("rsd-train", *matrix.command(exe("rsd-train"), entry)[1:], timeout=600)
    report = json.loads(p.stdout)
    assert report["measured"]["weights"] > 0, report
    # Independent of the plan: the weights are the parameters' bytes (fp32), plus the RoPE
    # inverse frequencies (head_dim / 2 fp32 values).
    extra = report["measured"]["weights"] - report["plan"]["parameters"] * 4
    assert 0 <= extra <= 1024, extra
    missed = matrix.misses(report)
    assert not missed, "\n".join(
        f"{c}: plan {p / 2**20:.3f} MiB, measured {m / 2**20:.3f} MiB" for c, p, m in missed)


def test_a_layout_that_cannot_fit_is_refused_naming_the_smallest_change():
    p = run("rsd-train", "memory", "--config", REPO / "configs" / "llama3-8b-64k.toml",
            "--arch", LLAMA, "--dp", 16, "--cp", 1, "--shard-optimizer", "false", check=False)
    assert p.returncode == 1, p.stderr
    assert "DOES NOT FIT" in p.stdout, p.stdout
    assert "the memory plan needs" in p.stderr and "turn on shard_optimizer" in p.stderr, p.stderr
    # A CUDA training run stops before it starts anything (no GPU needed to be refused).
    p = run("rsd-train", "--config", REPO / "configs" / "llama3-8b-64k.toml", "--model", "",
            "--init", LLAMA, "--nproc", 16, "--cp", 1, "--shard-optimizer", "false",
            "--out", "/nonexistent/never-written", check=False)
    assert p.returncode == 1 and "the memory plan needs" in p.stderr, p.stderr
    assert "turn on shard_optimizer" in p.stderr, p.stderr
