"""scripts/demo.sh's default run and the base it bundles (assets/miniature-base):

* the bundled base's files match its SHA256SUMS, and README states the same sha256 of its weights;
* scripts/demo_base.sh at toy size makes a base twice, bit for bit the same (its check passes),
  and its check fails on a base that differs by one byte;
* the default demo at toy size (a few steps, two items per depth) adapts the bundled base with
  standard and rsd, scores the base and both models on the same items, writes compare.md, the
  paired interval and the figure, and prints numbers that equal the per-item results (recomputed
  here independently).

Binaries: $RSD_BIN_DIR (default <repo>/target/debug).
"""
import collections
import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

from rsd_cli import exe

REPO = Path(__file__).resolve().parents[1]
BASE = REPO / "assets" / "miniature-base"
TOY = {"RSD_MINI_PAIRS_STEPS": "2", "RSD_MINI_BLOCK_STEPS": "3", "RSD_MINI_MAX_BLOCKS": "1",
       "RSD_MINI_ADAPT_STEPS": "2", "RSD_MINI_ITEMS": "1", "RSD_MINI_DEPTHS": "2",
       "RSD_MINI_TRAIN_DOCS": "30"}


def script(name, *args, **env):
    bins = str(Path(exe("rsd-train")).parent)
    env = {**os.environ, "RSD_MINI_BIN": bins, "RSD_DEMO_BIN": bins, **TOY, **env}
    return subprocess.run(["bash", str(REPO / "scripts" / name), *args], env=env,
                          capture_output=True, text=True, timeout=1800)


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_bundled_base_matches_its_sha256_and_the_one_readme_states():
    sums = dict(reversed(line.split()) for line in (BASE / "SHA256SUMS").read_text().splitlines())
    assert set(sums) == {"model.safetensors", "config.json"}
    for name, digest in sums.items():
        assert sha256(BASE / name) == digest, name
    assert sums["model.safetensors"] in (REPO / "README.md").read_text()
    # What it is: base 4 of the study, with the study's seeds.
    assert json.loads((BASE / "base.json").read_text())["init_seed"] == 14
    assert re.search(r"Worst depth: [0-9.]+; bar: 0.80 at every depth: met\.", (BASE / "bar.md").read_text())
    assert json.loads((BASE / "config.json").read_text())["max_position_embeddings"] == 1024


def test_demo_base_makes_the_same_base_twice_and_its_check_sees_one_byte(tmp_path):
    bundle = tmp_path / "bundle"
    env = {"RSD_DEMO_BASE_ASSETS": str(bundle), "RSD_MINI_IGNORE_BAR": "1"}
    p = script("demo_base.sh", "--write", RSD_DEMO_BASE_OUT=str(tmp_path / "first"), **env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert sorted(x.name for x in bundle.iterdir()) == sorted(
        ["SHA256SUMS", "bar.md", "base.json", "config.json", "model.safetensors",
         "rsd_training.json", "tokenizer.json"])
    first = sha256(bundle / "model.safetensors")
    # Trained again from nothing into another directory: the check compares it with the bundle.
    p = script("demo_base.sh", RSD_DEMO_BASE_OUT=str(tmp_path / "second"), **env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "equals the bundled one, bit for bit" in p.stdout
    assert sha256(tmp_path / "second" / "base-4" / "model" / "model.safetensors") == first

    # One byte of the bundled weights changed (same size): the check fails, naming both.
    w = bytearray((bundle / "model.safetensors").read_bytes())
    w[-5] ^= 0x01
    (bundle / "model.safetensors").write_bytes(bytes(w))
    (bundle / "SHA256SUMS").write_text(
        f"{hashlib.sha256(bytes(w)).hexdigest()}  model.safetensors\n"
        f"{sha256(bundle / 'config.json')}  config.json\n")
    p = script("demo_base.sh", RSD_DEMO_BASE_OUT=str(tmp_path / "second"), **env)
    assert p.returncode == 1 and "differs from the bundled one" in p.stderr, p.stderr[-3000:]


def recall(run):
    """Mean recall of a results.jsonl, every depth weighing the same."""
    by = collections.defaultdict(list)
    for line in (run / "results.jsonl").read_text().splitlines():
        r = json.loads(line)
        by[r["depth"]].append(r["score"])
    return sum(sum(v) / len(v) for v in by.values()) / len(by)


def test_the_default_demo_compares_standard_and_rsd_from_the_bundled_base(tmp_path):
    out = tmp_path / "demo"
    p = script("demo.sh", RSD_DEMO_OUT=str(out))
    assert p.returncode == 0, p.stderr[-4000:]
    # Both arms adapted from the bundled base, for the steps asked, with their own objective.
    for arm in ("standard", "rsd"):
        record = json.loads((out / arm / "model" / "rsd_training.json").read_text())
        assert (record["objective"], record["steps"], record["seed"]) == (arm, 2, 0), record
        assert record["model"] == "assets/miniature-base"
        assert record["rope_theta"] == 80000.0
    # The same items for the three models: 2 depths × 1 item at 1,024 tokens.
    keys = {}
    for name in ("base", "standard", "rsd"):
        rows = [json.loads(l) for l in (out / f"eval-{name}" / "results.jsonl").read_text().splitlines()]
        keys[name] = sorted((r["length"], r["depth"], r["sample"]) for r in rows)
        assert {r["length"] for r in rows} == {1024}
    assert keys["base"] == keys["standard"] == keys["rsd"] and len(keys["rsd"]) == 2
    cmp = json.loads((out / "compare.json").read_text())
    (rsd,) = [a for a in cmp["paired"]["arms"] if a["label"] == "rsd"]
    (acc,) = [m for m in rsd["measures"] if m["name"] == "accuracy@1024"]
    assert acc["arm"] == recall(out / "eval-rsd") and acc["baseline"] == recall(out / "eval-standard")
    assert (out / "compare.md").read_text().count("rsd − standard") >= 1
    assert (out / "accuracy_by_depth.png").stat().st_size > 1000
    # What it prints: the three recalls, the difference with its interval, the stages' times.
    got = dict(re.findall(r"^  (base|standard|rsd)\S* .*?(\d\.\d{3})$", p.stdout, re.M))
    assert got == {"base": f"{recall(out / 'eval-base'):.3f}",
                   "standard": f"{recall(out / 'eval-standard'):.3f}",
                   "rsd": f"{recall(out / 'eval-rsd'):.3f}"}, p.stdout
    lo, hi = acc["ci"]
    assert f"rsd − standard: {acc['diff']:+.3f}, 95% paired bootstrap interval [{lo:+.3f}, {hi:+.3f}]" \
        in p.stdout, p.stdout
    for stage in ("data", "adapt: standard", "adapt: rsd", "evaluate (3 models)", "total"):
        assert re.search(rf"^  {re.escape(stage)} +\d+$", p.stdout, re.M), (stage, p.stdout)
