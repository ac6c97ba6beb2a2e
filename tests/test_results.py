"""docs/RESULTS.md's numbers come from the committed per-item results, and nothing else.

Each directory under docs/results/ holds one attempt of the miniature study as the study wrote
it: base/eval-256/results.jsonl (the base's recall at 256 tokens) and, where the adaptation ran,
seed-S/ARM/eval-{1024,2048-yarn2,4096-yarn4}/results.jsonl; from attempt 4 on, one base-B/ per
base, holding eval-256 and the adapted arms under seed-S/ (and the report's primary.md, whose
block is `ATTEMPT:primary`). scripts/miniature_report.sh
recomputes the tables from them: the base's recall per depth against the bar, and the paired
differences with their bootstrap intervals (seeded, so they repeat exactly). Each block of
RESULTS.md between `<!-- results:NAME -->` and `<!-- /results:NAME -->` must equal what the
script writes now (headings compared without their level, so the page may nest them), and every
committed attempt must have its blocks.
"""
import hashlib
import json
import re
import subprocess
from pathlib import Path

import pytest

from rsd_cli import BIN_DIR

REPO = Path(__file__).resolve().parent.parent
ATTEMPTS = sorted(p for p in (REPO / "docs" / "results").iterdir() if p.is_dir())
PAGE = REPO / "docs" / "RESULTS.md"
BAR = "0.8"  # the pre-registered bar (scripts/miniature.sh)


def block(name):
    text = PAGE.read_text()
    m = re.search(rf"<!-- results:{name} -->\n(.*?)<!-- /results:{name} -->", text, re.S)
    assert m, f"docs/RESULTS.md has no results:{name} block"
    return m.group(1)


def normal(md):
    """Headings without their level; no blank runs at the ends."""
    return re.sub(r"^#+ ", "", md, flags=re.M).strip()


def report(*args):
    env = {"RSD_MINI_BIN": str(BIN_DIR), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["bash", str(REPO / "scripts" / "miniature_report.sh"), *args],
                          capture_output=True, text=True, env=env, check=True, timeout=600)


def test_there_are_committed_results():
    assert ATTEMPTS, "docs/results/ holds no attempt"
    for a in ATTEMPTS:
        bars = [a / "base" / "eval-256" / "results.jsonl", *a.glob("base-*/eval-256/results.jsonl")]
        assert any(b.is_file() for b in bars), a


def weights_digest(model):
    """rsd's digest of a model directory's weights: the sha256 of its safetensors files' hex
    sha256s in name order (what run.json records as weights_sha256)."""
    files = sorted(model.glob("*.safetensors"))
    return hashlib.sha256("".join(hashlib.sha256(f.read_bytes()).hexdigest() for f in files)
                          .encode()).hexdigest()


@pytest.mark.parametrize("model", sorted((REPO / "docs" / "results").glob("attempt-*/base-*/model")),
                         ids=lambda p: str(p.relative_to(REPO / "docs" / "results")))
def test_committed_base_weights_are_the_ones_scored(model):
    """A base committed with its weights (attempt 5 on) is the model its bar results scored: the
    weights and tokenizer digests in eval-256/run.json, and the training record beside it."""
    run = json.loads((model.parent / "eval-256" / "run.json").read_text())
    assert run["model_provenance"]["weights_sha256"] == weights_digest(model)
    assert run["tokenizer_sha256"] == hashlib.sha256((model / "tokenizer.json").read_bytes()).hexdigest()
    base = json.loads((model.parent / "base.json").read_text())
    record = json.loads((model / "rsd_training.json").read_text())
    assert record["steps"] > 0 and record["objective"] == "standard"
    first = record
    while first.get("started_from"):
        first = first["started_from"]
    assert first["init_seed"] == base["init_seed"] == 10 + base["base"]


def adapted(attempt):
    """Whether the attempt's adaptation ran (one base's seeds, or several bases' seeds)."""
    return any(attempt.glob("seed-*")) or any(attempt.glob("base-*/seed-*"))


@pytest.mark.parametrize("attempt", ATTEMPTS, ids=lambda p: p.name)
def test_the_bar_table_is_the_committed_base_results(attempt):
    got = report("bar", str(attempt), BAR).stdout
    assert normal(block(f"{attempt.name}:base-bar")) == normal(got)


@pytest.mark.parametrize("attempt", [a for a in ATTEMPTS if any(a.glob("base-*/eval-384"))],
                         ids=lambda p: p.name)
def test_the_depth_lengths_are_the_committed_base_only_results(attempt):
    """Attempt 4 on: the bases' recall at the in-window lengths and the depth lengths the
    pre-registered rule reads from them (`ATTEMPT:lengths`)."""
    bases = sorted(int(p.parent.name.split("-")[1]) for p in attempt.glob("base-*/eval-384"))
    got = report("lengths-table", str(attempt), ",".join(map(str, bases))).stdout
    assert normal(block(f"{attempt.name}:lengths")) == normal(got)


@pytest.mark.parametrize("attempt", [a for a in ATTEMPTS if adapted(a)], ids=lambda p: p.name)
def test_the_paired_differences_are_the_committed_results(attempt, tmp_path):
    report("compare", str(attempt), str(tmp_path))
    for baseline in ("standard", "standard-matched"):
        md = (tmp_path / f"compare-vs-{baseline}" / "compare.md").read_text()
        section = md[md.index("## Paired differences"):]
        assert normal(block(f"{attempt.name}:vs-{baseline}")) == normal(section), baseline
    if (tmp_path / "primary.md").exists():
        assert normal(block(f"{attempt.name}:primary")) == normal((tmp_path / "primary.md").read_text())


def test_pilot_cells_are_the_committed_pilot_results():
    """Each rsd pilot whose per-item results are committed under docs/pilot-results/ appears in
    RESULTS.md with the cells those results give: the share ranked first (three decimals) and the
    answer's mean log-probability (two), for each of its item files."""
    page = PAGE.read_text()
    runs = sorted(p for p in (REPO / "docs" / "pilot-results").glob("*/*") if p.is_dir())
    assert runs, "docs/pilot-results/ holds no pilot"
    for run in runs:
        for items in sorted(run.glob("*.jsonl")):
            rows = [json.loads(line) for line in items.read_text().splitlines()]
            score = sum(r["score"] for r in rows) / len(rows)
            logprob = sum(r["logprob"] for r in rows) / len(rows)
            cell = f"{score:.3f}, {logprob:.2f}".replace("-", "−")
            assert cell in page, f"{items.relative_to(REPO)}: {cell} is not in docs/RESULTS.md"
