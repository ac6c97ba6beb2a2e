"""`rsd-eval mc`: MMLU, HellaSwag, WinoGrande and OpenBookQA from files in their published formats,
scored by log-likelihood as lm-evaluation-harness scores them. The prompts are rebuilt here from
lm-eval's task definitions (doc_to_text, doc_to_choice, HellaSwag's preprocess, WinoGrande's
partial scoring), split into context and continuation tokens as lm-eval's `_encode_pair` splits
them (hf backend, no BOS), the log-likelihoods computed with transformers on SmolLM2-135M, and
every choice's log-likelihood, acc and acc_norm (first maximum, as `np.argmax`) compared question
by question."""
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
    # The cleaned context ends in a space (a trailing "[step]" is removed after the strip):
    # lm-eval moves that space to the front of each ending.
    {"ind": 11, "activity_label": "Food and Entertaining", "ctx_a": "[header] How to bake bread "
     "[title] Mix the flour and the water.", "ctx_b": "[step] Knead the dough for ten minutes. "
     "[step]", "endings": ["Let it rise for an hour.", "Paint the oven blue.",
                           "Throw the dough away.", "Call a plumber."], "label": 0,
     "split": "val"},
    # Two identical endings, the right one first (an exact tie counts for it) ...
    {"ind": 12, "activity_label": "Removing ice from car", "ctx_a": "A man scrapes the snow off "
     "the windshield of his car.", "ctx_b": "he", "endings": [
         "continues removing the snow on his car.", "continues removing the snow on his car.",
         "zq xv blorp.", "qqq zzz."], "label": 0, "split": "val"},
    # ... and second (the tie counts against it, as np.argmax takes the first).
    {"ind": 13, "activity_label": "Removing ice from car", "ctx_a": "A man scrapes the snow off "
     "the windshield of his car.", "ctx_b": "he", "endings": [
         "continues removing the snow on his car.", "continues removing the snow on his car.",
         "zq xv blorp.", "qqq zzz."], "label": 1, "split": "val"},
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
    # A stem ending in a space, and a choice beginning with one.
    {"id": "8-376", "question": {"stem": "Which of these would let the most heat travel through? ",
                                 "choices": [
        {"text": " a new pair of jeans", "label": "A"},
        {"text": "a steel spoon in a cafeteria", "label": "B"},
        {"text": "a cotton candy at a store", "label": "C"},
        {"text": "a calvin klein cotton hat", "label": "D"}]}, "answerKey": "B"},
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


def encode_pair(tok, context, continuation, add_bos_token=False):
    """lm-eval's `_encode_pair` (lm_eval/api/model.py) with the hf backend's `tok_encode` for a
    causal model (add_special_tokens=add_bos_token, False by default)."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tok.encode(context + continuation, add_special_tokens=add_bos_token)
    context_enc = tok.encode(context, add_special_tokens=add_bos_token)
    return context_enc, whole[len(context_enc):]


def loglikelihood(tok, model, context, continuation, add_bos_token=False):
    """The continuation's summed log-probability after the context, over lm-eval's split."""
    ctx, cont = encode_pair(tok, context, continuation, add_bos_token)
    return loglikelihood_of_ids(model, ctx, cont)


def loglikelihood_of_ids(model, ctx, cont):
    import torch

    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ctx + cont])).logits[0].double(), -1)
    return sum(logp[len(ctx) - 1 + i, t].item() for i, t in enumerate(cont))


def first_max(values):
    """np.argmax: the index of the first of the largest values."""
    return max(range(len(values)), key=lambda j: (values[j], -j))


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
        assert r["choice_logprobs"] == pytest.approx(lls, abs=2e-4, rel=1e-5), (task, doc)
        acc = float(first_max(lls) == gold)
        assert r["score"] == acc and r["candidates"] == len(choices)
        if norm:
            per_char = [ll / len(c) for ll, c in zip(lls, choices)]
            assert r["choice_logprobs_norm"] == pytest.approx(per_char, abs=2e-5, rel=1e-5)
            assert r["score_norm"] == float(first_max(per_char) == gold)
        else:
            assert "score_norm" not in r and "choice_logprobs_norm" not in r
    if task == "hellaswag":
        by_ind = {d["ind"]: r for d, r in zip(docs, results)}
        # A cleaned context ending in a space: lm-eval's split scores that space with the ending,
        # which tokenizing the context as it is would not.
        ctxs, conts, _, gold = lm_eval_requests(task, docs[2])
        assert ctxs[0].endswith(" ")
        naive_ctx = tok.encode(ctxs[0], add_special_tokens=False)
        naive = loglikelihood_of_ids(model, naive_ctx,
                                     tok.encode(conts[gold], add_special_tokens=False))
        assert abs(by_ind[11]["logprob"] - naive) > 1e-2
        # Two identical endings tie exactly; the first of them counts (np.argmax), for acc and
        # acc_norm alike.
        for ind, gold in ((12, 0), (13, 1)):
            r = by_ind[ind]
            assert r["choice_logprobs"][0] == r["choice_logprobs"][1]
            assert r["choice_logprobs_norm"][0] == r["choice_logprobs_norm"][1]
            # The repeated ending is the likeliest, so the tie decides.
            assert first_max(r["choice_logprobs"]) == 0 == first_max(r["choice_logprobs_norm"])
            assert r["score"] == r["score_norm"] == float(gold == 0)
            assert r["rank"] == gold + 1
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


def mmlu_doc(row):
    """An MMLU row as lm-eval's document (question, choices, answer): what it compares."""
    return {"question": row[0], "choices": row[1:5], "answer": row[5]}


def test_fewshot_examples_come_first_answered_as_lm_eval_joins_them(smollm2_dir, smollm2_hf,
                                                                     tmp_path):
    """--fewshot 2: MMLU's description once, the subject's first dev questions with their answer
    letters and a blank line each, then the question; the log-probability is transformers' on
    that text. A dev question equal to the test question is dropped without a replacement, as
    lm-eval's sampler does when the few-shot split is not the test split (`x != doc` over the
    first k): that question gets one example."""
    import csv

    tok, model = smollm2_hf
    data, docs = write_data("mmlu", tmp_path)
    dev = tmp_path / "dev"
    dev.mkdir()
    shots = {"high_school_geography_dev.csv": [MMLU["high_school_geography_test.csv"][1],
                                               ["Which is a continent?", "Asia", "Paris", "Nile",
                                                "Alps", "A"]],
             "astronomy_dev.csv": [["Which is a planet?", "Moon", "Sun", "Mars", "Comet", "C"],
                                   ["Which is a star?", "Sun", "Moon", "Mars", "Venus", "A"]]}
    for name, rows in shots.items():
        with open(dev / name, "w", newline="") as f:
            csv.writer(f).writerows(rows)
    out = tmp_path / "few"
    rsd_eval("mc", "--task", "mmlu", "--data", data, "--model", smollm2_dir, "--out", out,
             "--fewshot", "2", "--fewshot-data", dev, "--quiet")
    results = sorted(lines(out / "results.jsonl"), key=lambda r: r["sample"])
    counts = []
    for (subject, row), r in zip(docs, results):
        pool = shots[subject.replace(" ", "_") + "_dev.csv"]
        examples = [x for x in pool[:2] if mmlu_doc(x) != mmlu_doc(row)][:2]
        counts.append(len(examples))
        ctxs, conts, _, gold = lm_eval_requests("mmlu", (subject, row))
        head, question = ctxs[0].split("\n\n", 1)
        shown = "".join(f"{ex[0]}\nA. {ex[1]}\nB. {ex[2]}\nC. {ex[3]}\nD. {ex[4]}\nAnswer: {ex[5]}"
                        "\n\n" for ex in examples)
        context = f"{head}\n\n{shown}{question}"
        assert r["logprob"] == pytest.approx(loglikelihood(tok, model, context, conts[gold]),
                                             abs=2e-4, rel=1e-5)
    assert sorted(counts) == [1, 2, 2], counts
    assert json.loads((out / "run.json").read_text())["benchmark"] == "mmlu, 2-shot"
    e = fails("rsd-eval", "mc", "--task", "mmlu", "--data", data, "--model", smollm2_dir, "--out",
              tmp_path / "o", "--fewshot", "3", "--fewshot-data", dev).stderr
    assert "--fewshot 3 but --fewshot-data has 2 example(s)" in e, e
    e = fails("rsd-eval", "mc", "--task", "mmlu", "--data", data, "--model", smollm2_dir, "--out",
              tmp_path / "o", "--fewshot", "1").stderr
    assert "--fewshot-data" in e, e


def test_fewshot_from_the_evaluated_file_skips_the_question_itself(smollm2_dir, smollm2_hf,
                                                                    tmp_path):
    """--fewshot-data the --data file itself (lm-eval's few-shot split = test split): k + 1
    questions drawn, as lm-eval's sampler draws them (one random.Random(1234) for the task, a
    sample per question in file order), the evaluated one dropped, k kept."""
    import random

    tok, model = smollm2_hf
    data, docs = write_data("openbookqa", tmp_path)
    out = tmp_path / "same"
    rsd_eval("mc", "--task", "openbookqa", "--data", data, "--model", smollm2_dir, "--out", out,
             "--fewshot", "1", "--fewshot-data", data, "--quiet")
    results = sorted(lines(out / "results.jsonl"), key=lambda r: r["sample"])
    rnd = random.Random(1234)
    for doc, r in zip(docs, results):
        (example,) = [x for x in rnd.sample(docs, 2) if x != doc][:1]
        ex_ctxs, ex_conts, _, ex_gold = lm_eval_requests("openbookqa", example)
        ctxs, conts, _, gold = lm_eval_requests("openbookqa", doc)
        context = ex_ctxs[0] + ex_conts[ex_gold] + "\n\n" + ctxs[0]
        assert r["logprob"] == pytest.approx(loglikelihood(tok, model, context, conts[gold]),
                                             abs=2e-4, rel=1e-5)


@pytest.mark.parametrize("seed", [1234, 7])
def test_hellaswag_fewshot_draws_as_lm_evals_seeded_sampler(smollm2_dir, smollm2_hf, tmp_path,
                                                            seed):
    """HellaSwag --fewshot 2 from a training file, as lm-eval 0.4 draws them: one
    random.Random(fewshot_random_seed) for the task, `rnd.sample(training_docs, k + 1)` per
    question in file order (HellaSwag's config sets neither fewshot_split nor test_split, so they
    compare equal and one more is drawn), any equal to the question dropped, k kept. The
    training file holds the evaluated questions too, so some draws include the question."""
    import random

    tok, model = smollm2_hf
    data, docs = write_data("hellaswag", tmp_path)
    pool = docs + [{**d, "ctx_a": "Earlier, " + d["ctx_a"]} for d in docs] + docs[:2]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(x) + "\n" for x in pool))
    out = tmp_path / f"few-{seed}"
    rsd_eval("mc", "--task", "hellaswag", "--data", data, "--model", smollm2_dir, "--out", out,
             "--fewshot", "2", "--fewshot-data", train, "--fewshot-seed", seed, "--quiet")
    results = sorted(lines(out / "results.jsonl"), key=lambda r: r["sample"])
    rnd = random.Random(seed)
    dropped = 0
    for doc, r in zip(docs, results):
        drawn = rnd.sample(pool, 3)
        examples = [x for x in drawn if x != doc][:2]
        dropped += len(drawn) - len([x for x in drawn if x != doc])
        shots = ""
        for ex in examples:
            ex_ctxs, ex_conts, _, ex_gold = lm_eval_requests("hellaswag", ex)
            shots += ex_ctxs[0] + ex_conts[ex_gold] + "\n\n"
        ctxs, conts, _, gold = lm_eval_requests("hellaswag", doc)
        lls = [loglikelihood(tok, model, shots + ctxs[0], c) for c in conts]
        assert r["choice_logprobs"] == pytest.approx(lls, abs=2e-4, rel=1e-5), (doc["ind"], seed)
    # Both seeds draw a question's own copy somewhere (3 and 1 times): the drop is exercised.
    assert dropped >= 1, dropped
    assert json.loads((out / "run.json").read_text())["benchmark"] == \
        f"hellaswag, 2-shot, fewshot seed {seed}"
    # Another seed is another run: a rerun into the same directory with it is refused.
    e = fails("rsd-eval", "mc", "--task", "hellaswag", "--data", data, "--model", smollm2_dir,
              "--out", out, "--fewshot", "2", "--fewshot-data", train, "--fewshot-seed",
              seed + 1).stderr
    assert "fewshot seed" in e, e


def test_add_bos_token_tokenizes_with_the_special_tokens(smollm2_dir, smollm2_hf, tmp_path):
    """--add-bos-token: lm-eval's add_bos_token=True, the tokenizer's BOS before the context and
    before the whole."""
    tok, model = smollm2_hf
    data, docs = write_data("openbookqa", tmp_path)
    out = tmp_path / "bos"
    rsd_eval("mc", "--task", "openbookqa", "--data", data, "--model", smollm2_dir, "--out", out,
             "--limit", "1", "--add-bos-token", "--quiet")
    (r,) = lines(out / "results.jsonl")
    ctxs, conts, _, _ = lm_eval_requests("openbookqa", docs[0])
    lls = [loglikelihood(tok, model, c, x, add_bos_token=True) for c, x in zip(ctxs, conts)]
    assert r["choice_logprobs"] == pytest.approx(lls, abs=2e-4, rel=1e-5)
    assert json.loads((out / "run.json").read_text())["benchmark"] == \
        "openbookqa (first 1), add_bos_token"


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
