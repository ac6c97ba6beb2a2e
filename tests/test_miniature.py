"""scripts/miniature.sh end to end at toy size (a few steps, one seed, one item per depth), with our
debug binaries: one shared base, four adaptation arms from it on the same batches, every arm
evaluated teacher-forced on the same items at three lengths, the paired comparisons, the
pre-registered bar enforced, and a rerun that continues instead of starting over. (Pairing over
several seeds is tested in rsd-eval's `paired` unit tests, on records with known differences.)"""
import json
import os
import subprocess
from pathlib import Path

from rsd_cli import exe

REPO = Path(__file__).resolve().parents[1]
ARMS = ("standard", "rsd", "standard-matched", "two-view-clm")
EVALS = ("eval-1024", "eval-2048-yarn2", "eval-4096-yarn4")


def miniature(out, ignore_bar=True):
    env = {**os.environ, "RSD_MINI_BIN": str(Path(exe("rsd-train")).parent), "RSD_MINI_OUT": str(out),
           "RSD_MINI_SEEDS": "0", "RSD_MINI_PAIRS_STEPS": "2", "RSD_MINI_BLOCK_STEPS": "3",
           "RSD_MINI_MAX_BLOCKS": "1", "RSD_MINI_ADAPT_STEPS": "2", "RSD_MINI_ITEMS": "1", "RSD_MINI_DEPTHS": "2",
           "RSD_MINI_TRAIN_DOCS": "30"}
    if ignore_bar:
        env["RSD_MINI_IGNORE_BAR"] = "1"
    return subprocess.run(["bash", str(REPO / "scripts/miniature.sh")], env=env, capture_output=True,
                          text=True, timeout=1800)


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_miniature_runs_the_preregistered_design_and_resumes(tmp_path):
    out = tmp_path / "mini"
    p = miniature(out)
    assert p.returncode == 0, p.stderr[-4000:]
    assert "panicked" not in p.stderr
    # The base's recall at 256 tokens, per depth, against the bar (a 3-step base misses it).
    bar = (out / "base/bar.md").read_text()
    assert "bar: 0.80 at every depth: NOT met" in bar, bar
    base_config = json.loads((out / "base/model/config.json").read_text())
    assert base_config["rope_theta"] == 10000.0  # raised only for the adaptation
    # The base's two stages: pair lists alone, then the mix, each continued in blocks until its
    # held-out items are recalled (a toy base never is: one block each, the most allowed).
    assert len(lines(out / "base-pairs/metrics.jsonl")) == 2
    for stage, items in (("base-pairs", 64), ("base-mix", 88)):
        block = lines(out / f"{stage}-b1/metrics.jsonl")
        assert len(block) == 3 and {r["lr"] for r in block} == {1e-3}, block  # constant lr
        assert len(lines(out / f"{stage}-b1/eval-before/results.jsonl")) == items
        assert not (out / f"{stage}-b2").exists()
    assert (out / "base/model").resolve() == (out / "base-mix-b1/model").resolve()
    base_items = lines(out / "base/eval-256/results.jsonl")
    assert len(base_items) == 2 and {r["task"] for r in base_items} == {"kv_multikey"}

    for seed in (0,):
        s = out / f"seed-{seed}"
        m = {arm: lines(s / arm / "metrics.jsonl") for arm in ARMS}
        assert [len(m[a]) for a in ARMS] == [2, 2, 3, 2]  # compute-matched: 1.5× the steps
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
                assert (run["rope_scaling"] is None) == (name == "eval-1024"), run
                results = lines(s / arm / name / "results.jsonl")
                assert len(results) == 2 and all(r["candidates"] == 4 for r in results)
        # Every arm is scored on the same items.
        prompts = {arm: [r["expected"] for r in lines(s / arm / "eval-1024/results.jsonl")]
                   for arm in ARMS}
        assert all(prompts[a] == prompts["standard"] for a in ARMS)

    for base in ("standard", "standard-matched"):
        cmp = json.loads((out / f"compare-vs-{base}/compare.json").read_text())
        assert cmp["lengths"] == [1024, 2048, 4096]
        paired = cmp["paired"]
        assert paired["baseline"] == base
        assert [a["label"] for a in paired["arms"]] == [a for a in ARMS if a != base]
        for arm in paired["arms"]:
            assert arm["replicas"] == ["0"] and arm["items"] == 6, arm
            names = [m["name"] for m in arm["measures"]]
            assert names[:3] == ["accuracy@1024", "accuracy@2048", "accuracy@4096"], names
            assert "depth_sd@1024" in names and "drop@1024→4096" in names
            assert all(m["ci"][0] <= m["ci"][1] for m in arm["measures"])
        assert (out / f"compare-vs-{base}/accuracy_by_depth.png").stat().st_size > 0

    for run in ("1024", "2048-yarn2", "4096-yarn4"):
        cmp = json.loads((out / f"by-depth-{run}/compare.json").read_text())
        assert [r["label"] for r in cmp["rows"]] == list(ARMS)
        assert (out / f"by-depth-{run}/accuracy_by_depth.png").stat().st_size > 0

    # A rerun keeps what finished: no training step is repeated, no item is scored again.
    before = (out / "seed-0/rsd/metrics.jsonl").read_text()
    scored = (out / "seed-0/two-view-clm/eval-4096-yarn4/results.jsonl").read_text()
    p = miniature(out)
    assert p.returncode == 0, p.stderr[-4000:]
    assert "base-mix-b1: done" in p.stderr and "seed-0/two-view-clm: done" in p.stderr
    assert (out / "seed-0/rsd/metrics.jsonl").read_text() == before
    assert (out / "seed-0/two-view-clm/eval-4096-yarn4/results.jsonl").read_text() == scored

    # Without RSD_MINI_IGNORE_BAR a base under the bar stops the study, saying what to do.
    p = miniature(out, ignore_bar=False)
    assert p.returncode == 1
    assert "misses the pre-registered bar" in p.stderr and "not the bar" in p.stderr, p.stderr[-2000:]


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
