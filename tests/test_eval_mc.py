"""`rsd-eval mc`: MMLU, HellaSwag, WinoGrande and OpenBookQA from files in their published formats,
scored by log-likelihood as lm-evaluation-harness scores them. The prompts are rebuilt here from
lm-eval's task definitions (doc_to_text, doc_to_choice, HellaSwag's preprocess, WinoGrande's
partial scoring), the log-likelihoods computed with transformers on SmolLM2-135M, and acc and
acc_norm (log-likelihood per character of the choice) compared question by question."""
import json
import re
from functools import partial

import pytest

from rsd_cli import fails, run

rsd_eval = partial(run, "rsd-eval")


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


HELLASWAG = [
    {"ind": 4, "activity_label": "Removing ice from car", "ctx_a": "Then, the man writes over the "
     "snow covering the window of a car, and a woman wearing winter clothes smiles.",
     "ctx_b": "then", "ctx": "", "endings": [
         ", the man adds wax to the windshield and cuts it.",
         ", a person board a ski lift, while two men supporting the head of the person wearing "
         "winter clothes snow as the we girls sled.",
         ", the man puts on a christmas coat, knitted with netting.",
         ", the man continues removing the snow on his car."], "label": 3, "split": "val"},
    {"ind": 9, "activity_label": "Home and Garden", "ctx_a": "[header] How to fix a leaky tap "
     "[title] Turn off the water.", "ctx_b": "[step] Close the valve under the sink.",
     "endings": ["Then  unscrew the handle.", "Paint the tap [substeps] red.",
                 "Sing to the tap.", "Sell the house."], "label": "0", "split": "val"},
]
WINOGRANDE = [
    {"qID": "1", "sentence": "Sarah was a much better surgeon than Maria so _ always got the "
     "harder cases.", "option1": "Sarah", "option2": "Maria", "answer": "1"},
    {"qID": "2", "sentence": "The trophy doesn't fit into the brown suitcase because the _ is too "
     "large.", "option1": "trophy", "option2": "suitcase", "answer": "1"},
    {"qID": "3", "sentence": "The café served crêpes, but _ was closed.", "option1": "the bakery",
     "option2": "the café", "answer": "2"},
]
OPENBOOKQA = [
    {"id": "7-980", "question": {"stem": "The sun is responsible for", "choices": [
        {"text": "puppies learning new tricks", "label": "A"},
        {"text": "children growing up and getting old", "label": "B"},
        {"text": "flowers wilting in a vase", "label": "C"},
        {"text": "plants sprouting, blooming and wilting", "label": "D"}]}, "answerKey": "D"},
    {"id": "7-584", "question": {"stem": "When food is reduced in the stomach", "choices": [
        {"text": "the mind needs time to digest", "label": "A"},
        {"text": "take a second to digest what I said", "label": "B"},
        {"text": "nutrients are being deconstructed", "label": "C"},
        {"text": "reader's digest is a body of works", "label": "D"}]}, "answerKey": "C"},
]
MMLU = {
    "high_school_geography_test.csv": [
        ['Which of the following is the largest "ocean"?', "Atlantic", "Indian", "Pacific",
         "Arctic", "C"],
        ["The capital of France is", "Paris", "Rome", "Berlin", "Madrid", "A"]],
    "astronomy_test.csv": [["What is closest to the Sun?", "Venus", "Mercury", "Earth", "Mars",
                            "B"]],
}


def hellaswag_preprocess(text):
    """lm-eval's hellaswag/utils.py preprocess."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def lm_eval_requests(task, doc):
    """(contexts, continuations, choices, gold) as lm-eval's task yaml builds them."""
    if task == "hellaswag":
        query = hellaswag_preprocess(doc["activity_label"] + ": " + doc["ctx_a"] + " "
                                     + doc["ctx_b"].capitalize())
        choices = [hellaswag_preprocess(e) for e in doc["endings"]]
        return [query] * 4, [" " + c for c in choices], choices, int(doc["label"])
    if task == "winogrande":
        idx = doc["sentence"].index("_")
        target = doc["sentence"][idx + 1:].strip()
        ctxs = [doc["sentence"][:idx] + o for o in (doc["option1"], doc["option2"])]
        return ctxs, [" " + target] * 2, [doc["option1"], doc["option2"]], int(doc["answer"]) - 1
    if task == "openbookqa":
        q = doc["question"]
        texts = [c["text"] for c in q["choices"]]
        labels = [c["label"] for c in q["choices"]]
        return [q["stem"]] * 4, [" " + t for t in texts], texts, labels.index(doc["answerKey"])
    subject, row = doc
    ctx = (f"The following are multiple choice questions (with answers) about {subject}.\n\n"
           f"{row[0].strip()}\nA. {row[1]}\nB. {row[2]}\nC. {row[3]}\nD. {row[4]}\nAnswer:")
    return [ctx] * 4, [" A", " B", " C", " D"], list("ABCD"), "ABCD".index(row[5])


@pytest.fixture(scope="module")
def smollm2_hf(smollm2_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, torch_dtype=torch.float32).eval()
    return tok, model


def loglikelihood(tok, model, context, continuation):
    """The continuation's summed log-probability after the context: the context with the
    tokenizer's special tokens, the continuation tokenized alone and appended (as rsd does)."""
    import torch

    ctx = tok(context)["input_ids"]
    cont = tok(continuation, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].double(), -1)
    return sum(logp[len(ctx) - 1 + i, t].item() for i, t in enumerate(cont))


def write_data(task, d):
    import csv

    if task == "mmlu":
        (d / "test").mkdir()
        for name, rows in MMLU.items():
            with open(d / "test" / name, "w", newline="") as f:
                csv.writer(f).writerows(rows)
        docs = [(name.removesuffix("_test.csv").replace("_", " "), row)
                for name in sorted(MMLU) for row in MMLU[name]]
        return d, docs
    docs = {"hellaswag": HELLASWAG, "winogrande": WINOGRANDE, "openbookqa": OPENBOOKQA}[task]
    path = d / f"{task}.jsonl"
    path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in docs))
    return path, docs


@pytest.mark.parametrize("task", ["mmlu", "hellaswag", "winogrande", "openbookqa"])
def test_multiple_choice_equals_lm_evals_requests_scored_by_transformers(
        task, smollm2_dir, smollm2_hf, tmp_path):
    tok, model = smollm2_hf
    data, docs = write_data(task, tmp_path)
    out = tmp_path / "run"
    said = rsd_eval("mc", "--task", task, "--data", data, "--model", smollm2_dir, "--out", out,
                    "--quiet").stdout
    assert f"{len(docs)} {task} questions: {len(docs)} scored" in said, said
    results = sorted(lines(out / "results.jsonl"), key=lambda r: r["sample"])
    assert [r["sample"] for r in results] == list(range(len(docs)))
    norm = task in ("hellaswag", "openbookqa")
    for doc, r in zip(docs, results):
        ctxs, conts, choices, gold = lm_eval_requests(task, doc)
        lls = [loglikelihood(tok, model, c, x) for c, x in zip(ctxs, conts)]
        assert r["logprob"] == pytest.approx(lls[gold], abs=2e-4, rel=1e-5), (task, doc)
        acc = float(max(range(len(lls)), key=lambda j: (lls[j], -j)) == gold)
        assert r["score"] == acc and r["candidates"] == len(choices)
        if norm:
            per_char = [ll / len(c) for ll, c in zip(lls, choices)]
            assert r["score_norm"] == float(max(range(len(lls)), key=lambda j: (per_char[j], -j)) == gold)
        else:
            assert "score_norm" not in r
    summary = json.loads((out / "summary.json").read_text())
    (cell,) = summary["by_task_length"]
    assert cell["task"] == task and cell["n"] == len(docs)
    assert cell["mean"] == pytest.approx(sum(r["score"] for r in results) / len(docs))
    assert bool(summary.get("acc_norm")) == norm
    settings = json.loads((out / "run.json").read_text())
    assert settings["benchmark"] == task and len(settings["items_sha256"]) == 64
    if task == "hellaswag":
        # A rerun scores nothing again; --limit on another run scores the first questions only.
        again = rsd_eval("mc", "--task", task, "--data", data, "--model", smollm2_dir, "--out",
                         out, "--quiet").stdout
        assert f"0 scored, {len(docs)} already done" in again, again
        part = tmp_path / "part"
        rsd_eval("mc", "--task", task, "--data", data, "--model", smollm2_dir, "--out", part,
                 "--limit", "1", "--quiet")
        assert [r["sample"] for r in lines(part / "results.jsonl")] == [0]
        assert json.loads((part / "run.json").read_text())["benchmark"] == "hellaswag (first 1)"


def test_fewshot_examples_come_first_answered_as_lm_eval_joins_them(smollm2_dir, smollm2_hf,
                                                                     tmp_path):
    """--fewshot 1: MMLU's description once, the subject's first dev question with its answer
    letter and a blank line, then the question; the log-probability is transformers' on that
    text."""
    import csv

    tok, model = smollm2_hf
    data, docs = write_data("mmlu", tmp_path)
    dev = tmp_path / "dev"
    dev.mkdir()
    shots = {"high_school_geography_dev.csv": [["Which is a continent?", "Asia", "Paris", "Nile",
                                               "Alps", "A"]],
             "astronomy_dev.csv": [["Which is a planet?", "Moon", "Sun", "Mars", "Comet", "C"]]}
    for name, rows in shots.items():
        with open(dev / name, "w", newline="") as f:
            csv.writer(f).writerows(rows)
    out = tmp_path / "few"
    rsd_eval("mc", "--task", "mmlu", "--data", data, "--model", smollm2_dir, "--out", out,
             "--fewshot", "1", "--fewshot-data", dev, "--quiet")
    results = sorted(lines(out / "results.jsonl"), key=lambda r: r["sample"])
    for (subject, row), r in zip(docs, results):
        ex = shots[subject.replace(" ", "_") + "_dev.csv"][0]
        ctxs, conts, _, gold = lm_eval_requests("mmlu", (subject, row))
        head, question = ctxs[0].split("\n\n", 1)
        example = (f"{ex[0]}\nA. {ex[1]}\nB. {ex[2]}\nC. {ex[3]}\nD. {ex[4]}\nAnswer: {ex[5]}"
                   "\n\n")
        context = f"{head}\n\n{example}{question}"
        assert r["logprob"] == pytest.approx(loglikelihood(tok, model, context, conts[gold]),
                                             abs=2e-4, rel=1e-5)
    assert json.loads((out / "run.json").read_text())["benchmark"] == "mmlu, 1-shot"
    e = fails("rsd-eval", "mc", "--task", "mmlu", "--data", data, "--model", smollm2_dir, "--out",
              tmp_path / "o", "--fewshot", "2", "--fewshot-data", dev).stderr
    assert "--fewshot 2 but --fewshot-data has 1 example(s)" in e, e
    e = fails("rsd-eval", "mc", "--task", "mmlu", "--data", data, "--model", smollm2_dir, "--out",
              tmp_path / "o", "--fewshot", "1").stderr
    assert "--fewshot-data" in e, e


def test_bad_benchmark_files_name_the_file_line_and_field(smollm2_dir, tmp_path):
    bad = tmp_path / "w.jsonl"
    bad.write_text(json.dumps(WINOGRANDE[0]) + "\n" + json.dumps({**WINOGRANDE[1], "answer": "3"})
                   + "\n")
    e = fails("rsd-eval", "mc", "--task", "winogrande", "--data", bad, "--model", smollm2_dir,
              "--out", tmp_path / "o").stderr
    assert f"{bad}:2" in e and '"answer"' in e and '"1" or "2"' in e, e
    bad.write_text(json.dumps({"question": {"stem": "x", "choices": []}}) + "\n")
    e = fails("rsd-eval", "mc", "--task", "openbookqa", "--data", bad, "--model", smollm2_dir,
              "--out", tmp_path / "o").stderr
    assert f"{bad}:1" in e and "answerKey" in e, e
    csv_file = tmp_path / "x_test.csv"
    csv_file.write_text("q,a,b,c\n")
    e = fails("rsd-eval", "mc", "--task", "mmlu", "--data", csv_file, "--model", smollm2_dir,
              "--out", tmp_path / "o").stderr
    assert f"{csv_file}:1" in e and "expected 6" in e, e
    empty = tmp_path / "empty"
    empty.mkdir()
    e = fails("rsd-eval", "mc", "--task", "mmlu", "--data", empty, "--model", smollm2_dir,
              "--out", tmp_path / "o").stderr
    assert "no *.csv files" in e, e
