"""scripts/miniature.sh end to end at toy size (a few steps, two seeds, one item per depth), with our
debug binaries: both objectives adapt the same pretrained model on the same batches, the seeds are
pooled in the comparison, and a rerun continues instead of starting over."""
import json
import os
import subprocess
from pathlib import Path

from rsd_cli import exe

REPO = Path(__file__).resolve().parents[1]


def miniature(out):
    env = {**os.environ, "RSD_MINI_BIN": str(Path(exe("rsd-train")).parent), "RSD_MINI_OUT": str(out),
           "RSD_MINI_SEEDS": "0,1", "RSD_MINI_PRETRAIN_STEPS": "3", "RSD_MINI_ADAPT_STEPS": "2",
           "RSD_MINI_SAMPLES": "1", "RSD_MINI_DEPTHS": "3", "RSD_MINI_TRAIN_SAMPLES": "3"}
    p = subprocess.run(["bash", str(REPO / "scripts/miniature.sh")], env=env, capture_output=True,
                       text=True, timeout=1800)
    assert p.returncode == 0, p.stderr[-4000:]
    assert "panicked" not in p.stderr
    return p


def metrics(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_miniature_compares_objectives_on_the_same_tokens_over_seeds(tmp_path):
    out = tmp_path / "mini"
    miniature(out)
    for seed in (0, 1):
        s = out / f"seed-{seed}"
        std, rsd = metrics(s / "standard/metrics.jsonl"), metrics(s / "rsd/metrics.jsonl")
        assert len(std) == len(rsd) == 2
        # Same starting weights, same first batch: the standard view's CLM is the same number.
        assert abs(std[0]["clm"] - rsd[0]["clm"]) < 1e-5 * abs(std[0]["clm"]), (std[0], rsd[0])
        assert [m["tokens"] for m in std] == [m["tokens"] for m in rsd]
        assert all(m["kl"] == 0 for m in std) and all(m["kl"] > 0 for m in rsd)
        for objective in ("standard", "rsd"):
            run = json.loads((s / objective / "eval-2048-yarn2/run.json").read_text())
            assert run["rope_scaling"] is not None, run
            assert len((s / objective / "eval-1024/results.jsonl").read_text().splitlines()) == 3
    for name, length in (("compare-256-pretrained", 256), ("compare-1024", 1024),
                         ("compare-2048-yarn2", 2048)):
        cmp = json.loads((out / name / "compare.json").read_text())
        assert cmp["tasks"] == ["passkey"] and cmp["lengths"] == [length]
        labels = ["pretrained"] if length == 256 else ["standard", "rsd"]
        assert [r["label"] for r in cmp["rows"]] == labels
        for row in cmp["rows"]:
            everything = row["cells"][-1]
            assert (everything["items"], everything["samples"]) == (6, 2), row
        assert (out / name / "accuracy_by_depth.png").stat().st_size > 0
    table = (out / "ppl.md").read_text().splitlines()
    assert [line.split("|")[1].strip() for line in table[2:]] == ["standard", "rsd"]

    # A rerun keeps what finished: no training step is repeated.
    before = (out / "seed-0/rsd/metrics.jsonl").read_text()
    p = miniature(out)
    assert "seed-0/pretrain: done" in p.stderr and "seed-1/rsd: done" in p.stderr
    assert (out / "seed-0/rsd/metrics.jsonl").read_text() == before
