"""scripts/miniature.sh end to end at toy size (a few steps, two bases, one adaptation seed, one
item per depth), with our debug binaries, stage by stage as docs/RESULTS.md pre-registers attempt
4: the bases with their own seeds and bars, the replacement of a base that misses the bar, the
depth lengths by the rule, the four arms from each base on the same batches, compute-matched
standard at rsd's FLOP floor, every arm evaluated teacher-forced on the same items at six lengths,
the hierarchical paired comparisons, the timings, and a rerun that continues instead of starting
over. (The bootstrap's grouped draw is tested in rsd-eval's `paired` unit tests.)"""
import collections
import json
import math
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from rsd_cli import exe

REPO = Path(__file__).resolve().parents[1]
ARMS = ("standard", "rsd", "standard-matched", "two-view-clm")
EVALS = ("eval-384", "eval-512", "eval-768", "eval-1024", "eval-2048-yarn2", "eval-4096-yarn4")
WINDOW = (384, 512, 768, 1024)
STAGES = ("data", "bases", "lengths", "adapt", "evaluate", "report")
BASES = (1, 2)
STEPS = 2


def miniature(out, *stage, ignore_bar=True, **env):
    env = {**os.environ, "RSD_MINI_BIN": str(Path(exe("rsd-train")).parent), "RSD_MINI_OUT": str(out),
           "RSD_MINI_BASES": ",".join(map(str, BASES)), "RSD_MINI_SEEDS": "0",
           "RSD_MINI_PAIRS_STEPS": "2", "RSD_MINI_BLOCK_STEPS": "3", "RSD_MINI_MAX_BLOCKS": "1",
           "RSD_MINI_ADAPT_STEPS": str(STEPS), "RSD_MINI_ITEMS": "1", "RSD_MINI_DEPTHS": "2",
           "RSD_MINI_TRAIN_DOCS": "30", **env}
    if ignore_bar:
        env["RSD_MINI_IGNORE_BAR"] = "1"
    else:
        env.pop("RSD_MINI_IGNORE_BAR", None)
    p = subprocess.run(["bash", str(REPO / "scripts/miniature.sh"), *stage], env=env,
                       capture_output=True, text=True, timeout=1800)
    assert "panicked" not in p.stderr, p.stderr[-4000:]
    return p


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def recall(path):
    """Mean recall of a results.jsonl, every depth weighing the same."""
    by = collections.defaultdict(list)
    for r in lines(path):
        by[r["depth"]].append(r["score"])
    return sum(sum(v) / len(v) for v in by.values()) / len(by)


def depth_lengths(results, bases):
    """The pre-registered rule, read from the base-only results: the in-window lengths whose mean
    base-only recall over the bases lies in [0.35, 0.85]; if none, the one closest to 0.60."""
    mean = {l: sum(recall(results / f"base-{b}/eval-{l}/results.jsonl") for b in bases) / len(bases)
            for l in WINDOW}
    chosen = [l for l in WINDOW if 0.35 <= mean[l] <= 0.85]
    if chosen:
        return mean, chosen, False
    return mean, [min(WINDOW, key=lambda l: (abs(mean[l] - 0.6), l))], True


def prefix_reuse_floor(cfg, seq_len):
    """rsd-train's FLOP floor of the rsd skip step with prefix reuse (crates/rsd-train/src/step/
    prefix_reuse.rs), for an independent check of the number the script takes from rsd-train."""
    d, q = cfg["hidden_size"], cfg["num_attention_heads"] * cfg["head_dim"]
    kv, layers = cfg["num_key_value_heads"] * cfg["head_dim"], cfg["num_hidden_layers"]
    lin = layers * 2 * (d * (q + 2 * kv) + q * d + 3 * d * cfg["intermediate_size"])
    head, att = 2 * d * cfg["vocab_size"], layers * 4 * (seq_len / 2) * q
    return 1 + (0.5 * (lin + head) + 2 / 3 * att) / (lin + head + att)


def report(results, out):
    env = {"RSD_MINI_BIN": str(Path(exe("rsd-eval")).parent), "PATH": os.environ["PATH"]}
    return subprocess.run(["bash", str(REPO / "scripts/miniature_report.sh"), "compare", str(results),
                           str(out)], env=env, capture_output=True, text=True, check=True, timeout=600)


def test_miniature_runs_attempt_4_stage_by_stage_and_resumes(tmp_path):
    out = tmp_path / "mini"
    p = miniature(out, "--help")
    assert p.returncode == 0 and not out.exists()
    assert all(f"  {stage} " in p.stdout for stage in STAGES) and "RSD_MINI_MAX_BASE_TRIES" in p.stdout
    # A stage whose input is missing names the stage that makes it.
    p = miniature(tmp_path / "empty", "lengths")
    assert p.returncode == 1 and "run `scripts/miniature.sh data` first" in p.stderr, p.stderr[-2000:]
    p = miniature(out)
    assert p.returncode == 0, p.stderr[-4000:]

    # The bases: each from its own init seed, its stage-1 run and its blocks on their own seeds.
    first_loss = {}
    for b in BASES:
        base = out / f"base-{b}"
        seeds = {run: json.loads((base / run / "model/rsd_training.json").read_text())["seed"]
                 for run in ("pairs", "pairs-b1", "mix-b1")}
        assert seeds == {"pairs": 10 + b, "pairs-b1": 100 * b + 1, "mix-b1": 100 * b + 1}, seeds
        (checkpoint,) = (base / "pairs/checkpoints").iterdir()
        assert tomllib.loads((checkpoint / "config.toml").read_text())["init_seed"] == 10 + b
        assert json.loads((base / "base.json").read_text())["init_seed"] == 10 + b
        assert len(lines(base / "pairs/metrics.jsonl")) == 2
        first_loss[b] = lines(base / "pairs/metrics.jsonl")[0]["clm"]
        # Each stage continued in blocks at a constant lr until held-out items are recalled (a toy
        # base never is: one block each, the most allowed).
        for stage, items in (("pairs", 64), ("mix", 88)):
            block = lines(base / f"{stage}-b1/metrics.jsonl")
            assert len(block) == 3 and {r["lr"] for r in block} == {1e-3}, block
            assert len(lines(base / f"{stage}-b1/eval-before/results.jsonl")) == items
            assert not (base / f"{stage}-b2").exists()
        assert (base / "model").resolve() == (base / "mix-b1/model").resolve()
        assert json.loads((base / "model/config.json").read_text())["rope_theta"] == 10000.0
        # The bar on the seed-23 items at 256 tokens (a 3-step base misses it).
        assert "bar: 0.80 at every depth: NOT met" in (base / "bar.md").read_text()
        bar_items = lines(base / "eval-256/results.jsonl")
        assert len(bar_items) == 2 and {r["length"] for r in bar_items} == {256}
    assert first_loss[1] != first_loss[2]  # two inits
    # The report's bar for the whole attempt: every base's table, under its heading.
    every = subprocess.run(["bash", str(REPO / "scripts/miniature_report.sh"), "bar", str(out), "0.8"],
                           capture_output=True, text=True, check=True).stdout
    assert every == "\n".join(f"#### Base {b}\n\n" + (out / f"base-{b}/bar.md").read_text()
                             for b in BASES), every
    bases = json.loads((out / "bases.json").read_text())
    assert [t["base"] for t in bases["tried"]] == [1, 2] and bases["accepted"] == [1, 2]
    assert not any(t["met"] for t in bases["tried"]) and bases["ignore_bar"] and bases["complete"]

    # The depth lengths, by the rule, from the bases scored unchanged before any adaptation.
    lengths = json.loads((out / "lengths.json").read_text())
    mean, chosen, fallback = depth_lengths(out, BASES)
    assert lengths["depth_lengths"] == chosen and lengths["fallback"] == fallback, lengths
    assert {int(l): m for l, m in lengths["mean"].items()} == mean
    for b in BASES:
        for l in WINDOW:
            run = json.loads((out / f"base-{b}/eval-{l}/run.json").read_text())
            assert run["rope_scaling"] is None and run["model_provenance"]["rope_theta"] == 10000.0
            assert {r["length"] for r in lines(out / f"base-{b}/eval-{l}/results.jsonl")} == {l}
        adapted = min((out / f"base-{b}/seed-0").glob("*/summary.json"), key=os.path.getmtime)
        assert os.path.getmtime(out / "lengths.json") < os.path.getmtime(adapted)

    # standard-matched: ⌈steps × rsd's FLOP floor with prefix reuse⌉, the floor as rsd-train
    # computes it for this model at 1024 tokens (1.56: 200 steps → 312).
    adapt = json.loads((out / "adapt.json").read_text())
    cfg = json.loads((out / "base-1/model/config.json").read_text())
    assert adapt["flop_floor"] == round(prefix_reuse_floor(cfg, 1024), 2) == 1.56
    assert adapt["matched_steps"] == math.ceil(STEPS * 1.56) == 4
    assert math.ceil(200 * 1.56) == 312

    items = {}
    for b in BASES:
        s = out / f"base-{b}/seed-0"
        m = {arm: lines(s / arm / "metrics.jsonl") for arm in ARMS}
        assert [len(m[a]) for a in ARMS] == [STEPS, STEPS, 4, STEPS]
        # One base, the same first batch: the standard view's CLM is the same number in every arm.
        first = [m[a][0]["clm"] for a in ARMS]
        assert max(first) - min(first) < 1e-5 * abs(first[0]), first
        assert all(r["kl"] == 0 for a in ("standard", "standard-matched", "two-view-clm")
                   for r in m[a])
        assert all(r["kl"] > 0 for r in m["rsd"])
        assert all(r["clm_pert"] > 0 for r in m["two-view-clm"])
        for arm in ARMS:
            config = json.loads((s / arm / "model/config.json").read_text())
            assert (config["rope_theta"], config["max_position_embeddings"]) == (80000.0, 1024)
            for name in EVALS:
                run = json.loads((s / arm / name / "run.json").read_text())
                assert run["scoring"] == "teacher-forced"
                yarn = int(name.split("yarn")[1]) if "yarn" in name else None
                assert (run["rope_scaling"] or {}).get("factor") == yarn, run
                if yarn:
                    assert run["rope_scaling"]["rope_type"] == "yarn"
                prov = run["model_provenance"]
                assert prov["rope_theta"] == 80000.0 and len(prov["weights_sha256"]) == 64
                assert (prov["training"]["seed"], prov["training"]["steps"]) == (0, len(m[arm]))
                assert prov["training"]["model"].endswith(f"base-{b}/model")
                mine = json.loads((s / arm / name / "miniature.json").read_text())
                assert (mine["base"], mine["base_init_seed"], mine["adaptation_seed"]) == (b, 10 + b, 0)
                assert (mine["steps"], mine["yarn_factor"], mine["arm"]) == (len(m[arm]), yarn, arm)
                results = lines(s / arm / name / "results.jsonl")
                assert len(results) == 2 and all(r["candidates"] == 4 for r in results)
                # Every arm of every base is scored on the same items.
                got = [(r["length"], r["depth"], r["expected"]) for r in results]
                assert items.setdefault(name, got) == got, (b, arm, name)
    assert {n: {l for l, _, _ in v} for n, v in items.items()} == {
        e: {int(e.split("-")[1])} for e in EVALS}

    # The report: every arm by depth per length, and the paired differences with replicas named
    # base-B/seed-S (bootstrapped bases first).
    rep = out / "report"
    for e in EVALS:
        cmp = json.loads((rep / f"by-depth-{e[5:]}/compare.json").read_text())
        assert [r["label"] for r in cmp["rows"]] == list(ARMS)
        assert (rep / f"by-depth-{e[5:]}/accuracy_by_depth.png").stat().st_size > 0
    for base in ("standard", "standard-matched"):
        cmp = json.loads((rep / f"compare-vs-{base}/compare.json").read_text())
        assert cmp["lengths"] == [384, 512, 768, 1024, 2048, 4096]
        paired = cmp["paired"]
        assert paired["baseline"] == base
        assert [a["label"] for a in paired["arms"]] == [a for a in ARMS if a != base]
        for arm in paired["arms"]:
            assert arm["replicas"] == ["base-1/seed-0", "base-2/seed-0"] and arm["items"] == 12, arm
            names = [m["name"] for m in arm["measures"]]
            assert "accuracy@1024" in names and all(f"depth_sd@{l}" in names for l in chosen)
            if len(chosen) > 1:
                assert f"depth_sd@{'+'.join(map(str, chosen))}" in names
            assert all(m["ci"][0] <= m["ci"][1] for m in arm["measures"])
    primary = (rep / "primary.md").read_text()
    assert f"Depth lengths: {', '.join(map(str, chosen))}" in primary, primary
    standard = {l: sum(recall(out / f"base-{b}/seed-0/standard/eval-{l}/results.jsonl") for b in BASES) / 2
                for l in WINDOW}  # one item per depth: the cells' mean is the replicas' mean
    above = [l for l in WINDOW if standard[l] > 0.35]
    drops = {m["name"] for m in json.loads((rep / "compare-vs-standard/compare.json").read_text())
             ["paired"]["arms"][0]["measures"] if m["name"].startswith("drop@")}
    if above:
        assert f"drop@{above[-1]}→4096" in primary and drops == {f"drop@{above[-1]}→4096"}
    else:
        assert "**not measurable**" in primary and drops == {"drop@384→4096"}

    timings = [line.split("\t") for line in (out / "timings.tsv").read_text().splitlines()]
    assert timings[0] == ["stage", "start", "seconds", "status"]
    assert [t[0] for t in timings[1:]] == list(STAGES) and {t[3] for t in timings[1:]} == {"ok"}

    # A rerun keeps what finished: no training step is repeated, no item is scored again.
    before = {p: p.read_text() for p in out.glob("base-*/**/metrics.jsonl")}
    scored = {p: p.read_text() for p in out.glob("base-*/**/results.jsonl")}
    p = miniature(out)
    assert p.returncode == 0, p.stderr[-4000:]
    assert "base 2: trained" in p.stderr and "base-2/seed-0/two-view-clm: evaluated" in p.stderr
    assert "report: done" in p.stderr
    assert {p: p.read_text() for p in out.glob("base-*/**/metrics.jsonl")} == before
    assert {p: p.read_text() for p in out.glob("base-*/**/results.jsonl")} == scored
    assert len((out / "timings.tsv").read_text().splitlines()) == 1 + 2 * len(STAGES)

    keep_and_restore(out, tmp_path)

    # Without RSD_MINI_IGNORE_BAR a base under the bar is replaced by the next one (base 2 after
    # base 1), until the tries run out: then the study stops, naming the bases tried.
    p = miniature(out, "bases", ignore_bar=False, RSD_MINI_BASES="1", RSD_MINI_MAX_BASE_TRIES="2")
    assert p.returncode == 1
    assert "base 2 replaces a base that missed the bar" in p.stderr
    assert "after 2 tried (bases 1 2; RSD_MINI_MAX_BASE_TRIES=2)" in p.stderr, p.stderr[-2000:]
    assert "not the bar" in p.stderr
    bases = json.loads((out / "bases.json").read_text())
    assert [(t["base"], t["met"], t["accepted"]) for t in bases["tried"]] == [(1, False, False), (2, False, False)]
    assert not bases["complete"]
    p = miniature(out, "adapt", ignore_bar=False)
    assert p.returncode == 1 and "run `scripts/miniature.sh bases`" in p.stderr, p.stderr[-2000:]


def keep_and_restore(out, tmp_path):
    """`keep` copies what finished (no checkpoint, no adapted model, no partly scored run), in the
    committed results' layout; `restore` into a new output carries the study on from it: nothing
    is trained or scored again and the report is the same."""
    partial = out / "base-2/eval-384-unfinished"
    partial.mkdir()
    (partial / "results.jsonl").write_text((out / "base-2/eval-384/results.jsonl").read_text().splitlines()[0] + "\n")
    (partial / "run.json").write_text("{}")
    kept = tmp_path / "kept"
    p = miniature(out, "keep", str(kept))
    assert p.returncode == 0, p.stderr[-2000:]
    shutil.rmtree(partial)
    files = {str(f.relative_to(kept)) for f in kept.rglob("*") if f.is_file()}
    want = {"bases.json", "lengths.json", "adapt.json", "timings.tsv"}
    for b in BASES:
        want |= {f"base-{b}/base.json"}
        want |= {f"base-{b}/model/{f.name}" for f in (out / f"base-{b}/model").iterdir()}
        want |= {f"base-{b}/eval-{l}/{f}" for l in (256, *WINDOW) for f in ("results.jsonl", "run.json")}
        want |= {f"base-{b}/seed-0/{arm}/{e}/{f}" for arm in ARMS for e in EVALS
                 for f in ("results.jsonl", "run.json", "miniature.json")}
    assert files == want, sorted(files ^ want)
    assert all((kept / f).read_bytes() == (out / f).read_bytes() for f in files)

    again = tmp_path / "again"
    p = miniature(again, "restore", str(kept))
    assert p.returncode == 0 and f"restored {len(files)} file(s)" in p.stderr, p.stderr[-2000:]
    p = miniature(again)
    assert p.returncode == 0, p.stderr[-4000:]
    assert "base 1: trained" in p.stderr and "base-1/seed-0/rsd: evaluated" in p.stderr
    assert not list(again.glob("base-*/**/metrics.jsonl"))  # nothing trained
    assert not list(again.glob("base-*/seed-0/*/model"))  # nor adapted
    for f in files:
        if f.endswith("results.jsonl"):
            assert (again / f).read_bytes() == (out / f).read_bytes(), f
    assert (again / "report/primary.md").read_text() == (out / "report/primary.md").read_text()
    rows = (again / "timings.tsv").read_text().splitlines()
    assert rows[:len(rows) - len(STAGES)] == (out / "timings.tsv").read_text().splitlines()

    # A base recorded as trained whose weights and scored items are both gone is refused.
    shutil.rmtree(again / "base-1/model")
    shutil.rmtree(again / "base-1/eval-256")
    p = miniature(again, "bases")
    assert p.returncode == 1 and "remove" in p.stderr and "base-1/base.json to train it again" in p.stderr, p.stderr[-2000:]
    p = miniature(again, "restore", str(tmp_path / "nothing"))
    assert p.returncode == 1 and "nothing to restore" in p.stderr


def test_attempt_4_report_applies_the_rules_to_the_results(tmp_path):
    """scripts/miniature_report.sh on attempt 4's layout, on results whose scores are set so that
    the rules have answers: two depth lengths (512 and 768, mean base-only recall 0.5; 384 at 0
    and 1024 at 1 are outside [0.35, 0.85]), and the drop from 768 (the longest in-window length
    where standard's mean recall is above 0.35) to 4096 with YaRN ×4."""
    src = tmp_path / "src"
    rng = 0
    for b in BASES:
        for l in WINDOW:
            score = {384: 0.0, 512: float(b == 1), 768: float(b == 1), 1024: 1.0}[l]
            write(src / f"base-{b}/eval-{l}", l, lambda i: score)
        for arm in ARMS:
            for e in EVALS:
                l = int(e.split("-")[1])
                if arm == "standard":
                    rule = {768: lambda i: 1.0, 1024: lambda i: 0.0}.get(l, lambda i: float(i % 2))
                else:
                    rng += 1
                    rule = lambda i, k=rng: float((i + k) % 3 == 0)  # noqa: E731
                write(src / f"base-{b}/seed-0/{arm}/{e}", l, rule)
    out = tmp_path / "report"
    report(src, out)
    lengths = json.loads((out / "lengths.json").read_text())
    assert lengths["depth_lengths"] == [512, 768] and not lengths["fallback"]
    assert lengths["mean"] == {"384": 0.0, "512": 0.5, "768": 0.5, "1024": 1.0}
    table = subprocess.run(["bash", str(REPO / "scripts/miniature_report.sh"), "lengths-table", str(src),
                            "1,2"], capture_output=True, text=True, check=True, timeout=60).stdout
    assert table.splitlines() == [
        "| base | 384 | 512 | 768 | 1024 |", "|---|---|---|---|---|",
        "| 1 | 0.000 | 1.000 | 1.000 | 1.000 |", "| 2 | 0.000 | 0.000 | 0.000 | 1.000 |",
        "| mean | 0.000 | 0.500 | 0.500 | 1.000 |", "",
        "Depth lengths: 512, 768 (mean base-only recall in [0.35, 0.85])."], table
    for base in ("standard", "standard-matched"):
        cmp = json.loads((out / f"compare-vs-{base}/compare.json").read_text())
        assert cmp["lengths"] == [384, 512, 768, 1024, 2048, 4096]
        for arm in cmp["paired"]["arms"]:
            assert arm["replicas"] == ["base-1/seed-0", "base-2/seed-0"]
            by = {m["name"]: m for m in arm["measures"]}
            # The drop from 768, and the depth lengths' mean depth_sd, each one measure.
            assert "drop@768→4096" in by and "drop@384→4096" not in by
            sd = by["depth_sd@512+768"]
            for side in ("arm", "baseline"):
                assert sd[side] == pytest.approx((by["depth_sd@512"][side] + by["depth_sd@768"][side]) / 2)
            assert sd["primary"] and len(sd["depth_shuffle_floor"]) == 2
    primary = (out / "primary.md").read_text()
    assert "Depth lengths: 512, 768 (mean base-only recall in [0.35, 0.85])" in primary
    assert "| drop@768→4096 |" in primary and "The drop runs from 768 tokens" in primary
    assert "| depth_sd@512+768 |" in primary and "mean over the depth lengths (512, 768)" in primary
    rows = [r for r in primary.splitlines() if r.startswith("| rsd − standard |")]
    assert len(rows) == 1 and rows[0].count("[") == 3  # accuracy@1024, depth_sd@512+768, the drop


def write(run, length, score, depths=(0.0, 0.5, 1.0), per=2):
    """A results.jsonl of `per` items at each depth, item i scored score(i)."""
    run.mkdir(parents=True, exist_ok=True)
    rows = []
    for d in depths:
        for k in range(per):
            i = len(rows)
            s = score(i)
            rows.append({"task": "kv_multikey", "length": length, "depth": d, "sample": i,
                         "expected": [f" v{i}"], "output": " x", "score": s, "prompt_tokens": length - 8,
                         "logprob": -1.0 - s, "rank": 1 if s else 2, "candidates": 4, "greedy": bool(s)})
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_dense_recall_documents_ask_for_every_needle_within_the_budget(tmp_path):
    """scripts/miniature_dense.py: each dumped item's prompt and answer, then other needles'
    sentences (RULER's answer, or the needle repeated), each with its own needle's value, none
    past the token budget."""
    import re
    import sys
    from tokenizers import Tokenizer

    tok_path = REPO / "assets/tokenizers/mini-1k/tokenizer.json"
    dump = tmp_path / "dump.jsonl"
    subprocess.run([exe("rsd-eval"), "run", "--tasks", "niah_multikey_2", "--lengths", "160,200",
                    "--depths", "3", "--samples", "2", "--max-new-tokens", "8", "--seed", "1",
                    "--tokenizer", str(tok_path), "--dump-prompts", str(dump)], check=True,
                   capture_output=True)
    items = lines(dump)
    tok = Tokenizer.from_file(str(tok_path))
    for form, added in (("answer", r"The special magic number for ([\w-]+) mentioned in the "
                                   r"provided text is (\d+)\."),
                        ("needle", r"One of the special magic numbers for ([\w-]+) is: (\d+)\.")):
        out = tmp_path / f"{form}.jsonl"
        subprocess.run([sys.executable, str(REPO / "scripts/miniature_dense.py"), str(dump),
                        str(out), "--seed", "3", "--tokenizer", str(tok_path), "--max-tokens",
                        "230", "--form", form], check=True, capture_output=True)
        docs = [d["text"] for d in lines(out)]
        assert len(docs) == len(items)
        extra = 0
        for item, text in zip(items, docs):
            assert text.startswith(f"{item['prompt']} {item['expected'][0]}."), text
            needles = dict(re.findall(r"One of the special magic numbers for ([\w-]+) is: (\d+)\.",
                                      item["prompt"]))
            tail = text[len(item["prompt"]):]
            for key, value in re.findall(added, tail):
                assert needles[key] == value and value != item["expected"][0], (key, text)
                extra += 1
            assert len(tok.encode(text, add_special_tokens=False).ids) <= max(
                230, len(tok.encode(f"{item['prompt']} {item['expected'][0]}.",
                                    add_special_tokens=False).ids)), text
        assert extra >= len(items), (form, extra)
    # Drill: the needles alone, then each one's answer once, in another order, within the budget.
    out = tmp_path / "drill.jsonl"
    subprocess.run([sys.executable, str(REPO / "scripts/miniature_dense.py"), str(dump), str(out),
                    "--seed", "3", "--tokenizer", str(tok_path), "--max-tokens", "230", "--form",
                    "drill"], check=True, capture_output=True)
    for item, text in zip(items, (d["text"] for d in lines(out))):
        needles_part, answers_part = text.split("\n", 1)
        shown = re.findall(r"One of the special magic numbers for ([\w-]+) is: (\d+)\.", needles_part)
        assert needles_part == " ".join(f"One of the special magic numbers for {k} is: {v}."
                                        for k, v in shown)
        context = dict(re.findall(r"One of the special magic numbers for ([\w-]+) is: (\d+)\.",
                                  item["prompt"]))
        assert shown and all(context[k] == v for k, v in shown)
        answers = re.findall(r"The special magic number for ([\w-]+) mentioned in the provided "
                             r"text is (\d+)\.", answers_part)
        assert sorted(answers) == sorted(shown) and len(answers_part.split("\n")) == len(shown)
        assert len(tok.encode(text, add_special_tokens=False).ids) <= 230


def test_copy_documents_repeat_their_random_numbers(tmp_path):
    """scripts/miniature_copy.py: each document is a sequence of random 7-digit numbers, then the
    same sequence again; a seed repeats the file, another seed changes it."""
    import sys

    def write(name, seed):
        out = tmp_path / name
        subprocess.run([sys.executable, str(REPO / "scripts/miniature_copy.py"), str(out),
                        "--docs", "20", "--numbers", "5", "--seed", str(seed)], check=True)
        return [d["text"] for d in lines(out)]

    docs = write("a.jsonl", 1)
    assert len(docs) == 20 and len(set(docs)) == 20
    for text in docs:
        first, second = text.split("\n")
        assert first == second and first.endswith(".")
        numbers = first[:-1].split(" ")
        assert len(numbers) == 5 and all(len(n) == 7 and n.isdigit() for n in numbers)
    assert write("b.jsonl", 1) == docs and write("c.jsonl", 2) != docs
    # --shuffle: the same numbers again, in another order.
    out = tmp_path / "s.jsonl"
    subprocess.run([sys.executable, str(REPO / "scripts/miniature_copy.py"), str(out), "--docs",
                    "20", "--numbers", "8", "--seed", "1", "--shuffle"], check=True)
    pairs = [d["text"][:-1].split(".\n") for d in lines(out)]
    assert all(sorted(a.split()) == sorted(b.split()) for a, b in pairs)
    assert sum(a != b for a, b in pairs) >= 18


def test_one_token_recall_documents_and_items(tmp_path):
    """scripts/miniature_kv.py: pair lists repeat their pairs in another order; drills hold at most
    --most needles, then each needle's answer with its own value; items put four needles in the
    books, ask for one, fill the length less room for the answer, and offer the four values."""
    import sys
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(REPO / "assets/tokenizers/mini-1k/tokenizer.json"))

    def run(*args):
        out = tmp_path / f"{len(list(tmp_path.iterdir()))}.jsonl"
        subprocess.run([sys.executable, str(REPO / "scripts/miniature_kv.py"), *args[:1], str(out),
                        *map(str, args[1:])], check=True, cwd=REPO)
        return lines(out)

    for doc in run("docs", "--docs", 30, "--pairs", 4, "--seed", 1):
        first, second = (part.rstrip(".").split(". ") for part in doc["text"].split("\n"))
        assert len(first) == 4 and sorted(first) == sorted(second)
        keys, values = zip(*(p.split(" ") for p in first))
        assert len(set(keys)) == 4 and not set(keys) & set(values)
        assert all(len(tok.encode(" " + w, add_special_tokens=False).ids) == 1 for w in keys + values)
    for it in run("items", "--pairs", 4, "--items", 20, "--seed", 3):
        first, rest = it["context"].split("\n")
        pairs = dict(p.split(" ") for p in first.rstrip(".").split(". "))
        *shown, key = rest.split(". ")
        assert all(pairs[p.split(" ")[0]] == p.split(" ")[1] for p in shown)
        assert it["answer"] == " " + pairs[key] and sorted(it["candidates"]) == sorted(" " + v for v in pairs.values())
    gap = "in the provided text is"
    for it in run("items", "--pairs", 3, "--gap", 5, "--items", 10, "--seed", 4):
        first, rest = it["context"].split("\n")
        entries = first.rstrip(".").split(". ")
        assert len(entries) == 3 and all(e.split(" ", 1)[1].rsplit(" ", 1)[0] == gap for e in entries)
        assert rest.endswith(" " + gap) and it["answer"] in it["candidates"]
        key = rest.split(". ")[-1].split(" ")[0]
        assert f"{key} {gap}{it['answer']}." in first
    gaps = {doc["text"].count(" is ") // 6 for doc in run("docs", "--docs", 40, "--pairs", 3, "--gap", 2, "--seed", 5)}
    assert gaps == {0, 1}  # gap 0 has no " is ", gaps 1 and 2 have one in each of the 6 entries
    for doc in run("docs", "--docs", 30, "--drill", "--most", 3, "--seed", 2):
        needles, answers = doc["text"].split("\n")
        given = dict(s.split(" for ")[1].rstrip(".").split(" is: ") for s in needles.split(". "))
        asked = {s.split(" for ")[1].split(" mentioned")[0]: s.rstrip(".").rsplit(" ", 1)[1]
                 for s in answers.split(". ")}
        assert 1 <= len(given) <= 3 and asked == given
    items = run("items", "--lengths", 256, "--depths", 3, "--items", 2, "--seed", 7)
    assert [it["depth"] for it in items] == [0.0, 0.0, 0.5, 0.5, 1.0, 1.0]
    for it in items:
        assert len(it["candidates"]) == 4 and it["answer"] in it["candidates"]
        key = it["context"].rsplit(" for ", 1)[1].split(" mentioned")[0]
        assert f"for {key} is:{it['answer']}." in it["context"]
        assert 256 - 8 - 12 <= len(tok.encode(it["context"]).ids) <= 256 - 8


def t_quantile_975(df):
    """Student's t 0.975 quantile by bisection on its CDF (Simpson's rule on the density): an
    independent check of the script's table."""
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    pdf = lambda x: c * (1 + x * x / df) ** (-(df + 1) / 2)  # noqa: E731

    def cdf(x, n=20000):
        h = x / n
        s = pdf(0) + pdf(x) + sum((4 if k % 2 else 2) * pdf(k * h) for k in range(1, n))
        return 0.5 + s * h / 3
    lo, hi = 0.0, 50.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < 0.975 else (lo, mid)
    return lo


def test_attempt_5_report_applies_its_rule_with_both_intervals(tmp_path):
    """scripts/miniature_report.sh on attempt 5's layout (the pilot's depth lengths in
    lengths.json): the primary depth_sd over the depth lengths with its bootstrap interval and the
    t-interval over the base means (recomputed here from the per-item files), and the decision
    rule, which needs both intervals on one side for both baselines."""
    depths, per, bases, seeds = (0.0, 0.5, 1.0), 16, (11, 12, 13), (0, 1)

    def make(src, rsd_flat):
        for b in bases:
            for s in seeds:
                for arm in ARMS:
                    for l in (640, 768, 1024):
                        if arm == "rsd" and rsd_flat:
                            rule = lambda i: float(i % 2)  # noqa: E731  every depth at 0.5
                        else:
                            # 1 at the ends; in the middle 2·(b − 11 + s) of the 16 recalled.
                            rule = lambda i, b=b, s=s: float(i // per != 1 or i % per < 2 * (b - 11 + s))  # noqa: E731
                        write(src / f"base-{b}/seed-{s}/{arm}/eval-{l}", l, rule, depths, per)
        (src / "lengths.json").write_text(json.dumps(
            {"chosen_by": "pilot", "depth_lengths": [640, 768], "bases": list(bases),
             "fallback": False}))

    def sd(by_depth):
        m = sum(by_depth) / len(by_depth)
        return math.sqrt(sum((x - m) ** 2 for x in by_depth) / len(by_depth))

    for rsd_flat in (True, False):
        src, out = tmp_path / f"src-{rsd_flat}", tmp_path / f"report-{rsd_flat}"
        make(src, rsd_flat)
        report(src, out)
        assert json.loads((out / "lengths.json").read_text())["depth_lengths"] == [640, 768]
        cmp = json.loads((out / "compare-vs-standard/compare.json").read_text())
        assert cmp["lengths"] == [640, 768, 1024]
        rsd = {m["name"]: m for m in next(a for a in cmp["paired"]["arms"] if a["label"] == "rsd")["measures"]}
        assert "depth_sd@640+768" in rsd
        primary = (out / "primary.md").read_text()
        # The t-interval over the base means, recomputed: per base, the mean over its seeds of
        # rsd's depth_sd minus standard's (the same at both depth lengths here).
        diffs = []
        for b in bases:
            per_seed = []
            for s in seeds:
                middle = 2 * (b - 11 + s) / per
                standard = sd([1.0, middle, 1.0])
                per_seed.append((0.0 if rsd_flat else standard) - standard)
            diffs.append(sum(per_seed) / len(per_seed))
        mean = sum(diffs) / len(diffs)
        half = t_quantile_975(len(bases) - 1) * math.sqrt(
            sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)) / math.sqrt(len(diffs))
        f = lambda x: f"{x:+.3f}".replace("-", "−")  # noqa: E731
        row = next(r for r in primary.splitlines() if r.startswith("| rsd − standard |"))
        m = rsd["depth_sd@640+768"]
        assert row.startswith(f"| rsd − standard | {f(m['diff'])} [{f(m['ci'][0])}, {f(m['ci'][1])}] "
                              f"| {m['noise_floor']:.3f} |"), row
        if rsd_flat:
            assert f"| {f(mean)} [{f(mean - half)}, {f(mean + half)}] |" in row, (row, mean, half)
            assert " ".join(f(d) for d in diffs) in row
            assert m["ci"][1] < 0 and mean + half < 0
            assert "**rsd makes recall depend less on depth**" in primary
        else:
            assert "| +0.000 — " not in row and "**No detected difference** in depth_sd@640+768" in primary
        assert "t = 4.303" in primary
        assert "| accuracy@1024 | standard |" in primary and "| depth_sd@1024 | standard-matched |" in primary


def test_attempt_5_settings_make_its_items_and_take_the_pilots_depth_lengths(tmp_path):
    """RSD_MINI_ATTEMPT=5: the data stage writes the evaluation items on seed 31 at the bar's 256
    and at 640, 768, 896 and 1024 tokens (no YaRN lengths), and the lengths stage takes the depth
    lengths the pilot fixed, without scoring the bases."""
    out = tmp_path / "mini5"
    p = miniature(out, "data", RSD_MINI_ATTEMPT="5", RSD_MINI_BASES="11,12")
    assert p.returncode == 0, p.stderr[-4000:]
    items = sorted(f.name for f in (out / "data").glob("items-*.jsonl"))
    assert items == [f"items-{l}-seed31.jsonl" for l in (1024, 256, 640, 768, 896)], items
    for l in (256, 640, 768, 896, 1024):
        rows = lines(out / f"data/items-{l}-seed31.jsonl")
        assert len(rows) == 2 and all(r["length"] == l for r in rows)  # 2 depths × 1 item
    # Not attempt 4's items: another seed.
    four = tmp_path / "mini4"
    assert miniature(four, "data").returncode == 0
    assert lines(four / "data/items-1024-seed23.jsonl") != lines(out / "data/items-1024-seed31.jsonl")
    (out / "bases.json").write_text(json.dumps({"complete": True, "accepted": [11, 12]}))
    p = miniature(out, "lengths", RSD_MINI_ATTEMPT="5", RSD_MINI_BASES="11,12")
    assert p.returncode == 0, p.stderr[-4000:]
    lengths = json.loads((out / "lengths.json").read_text())
    assert lengths["depth_lengths"] == [640, 768, 896] and lengths["chosen_by"] == "pilot"
    assert lengths["bases"] == [11, 12] and not any((out / "base-11").glob("eval-*"))
    p = miniature(out, "data", RSD_MINI_ATTEMPT="6")
    assert p.returncode == 1 and "RSD_MINI_ATTEMPT=6: this script runs attempt 4 or 5" in p.stderr
