"""`rsd-eval longbench`: LongBench v2's prompts, middle truncation and chat rendering compared with
LongBench's pred.py steps done here with transformers' tokenizer (encode, keep the first and
last halves, decode without special tokens, apply_chat_template as the chat server does); its
extract_answer and result.py re-implemented here and compared on crafted responses; a short
generation run with SmolLM2 that resumes."""
import json
import re
from functools import partial

import pytest

from rsd_cli import fails, run

rsd_eval = partial(run, "rsd-eval")

TEMPLATE = ("Please read the following text and answer the question below.\n\n<text>\n$DOC$\n"
            "</text>\n\nWhat is the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n"
            "(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\nFormat your response as follows: \"The correct "
            "answer is (insert answer here)\".")


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def data(tmp_path):
    words = ("The lighthouse keeper counted ships every night and wrote their names in a book. "
             "Café owners remembered him. ")
    items = []
    for i, (diff, length) in enumerate([("easy", "short"), ("hard", "medium"), ("hard", "long"),
                                        ("easy", "long")]):
        items.append({"_id": f"id{i}", "domain": "Single-Document QA", "sub_domain": "Novel",
                      "difficulty": diff, "length": length,
                      "question": f"  What did the keeper count ({i})? ",
                      "choice_A": " ships ", "choice_B": "stars", "choice_C": "waves",
                      "choice_D": "birds", "answer": "A",
                      "context": ("\n" + words * (5 + 60 * i)).rstrip() + "\n"})
    path = tmp_path / "data.json"
    path.write_text(json.dumps(items, ensure_ascii=False))
    return path, items


def fill(item):
    return (TEMPLATE.replace("$DOC$", item["context"].strip())
            .replace("$Q$", item["question"].strip())
            .replace("$C_A$", item["choice_A"].strip()).replace("$C_B$", item["choice_B"].strip())
            .replace("$C_C$", item["choice_C"].strip()).replace("$C_D$", item["choice_D"].strip()))


def extract_answer(response):
    """LongBench v2's pred.py extract_answer."""
    response = response.replace("*", "")
    match = re.search(r"The correct answer is \(([A-D])\)", response)
    if match:
        return match.group(1)
    match = re.search(r"The correct answer is ([A-D])", response)
    return match.group(1) if match else None


def test_prompts_truncation_and_chat_rendering_equal_longbench(smollm2_dir, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    path, items = data(tmp_path)
    max_len = 301
    for chat in (False, True):
        dump = tmp_path / f"p{chat}.jsonl"
        rsd_eval("longbench", "--data", path, "--tokenizer", smollm2_dir / "tokenizer.json",
                 "--max-len", str(max_len), "--dump-prompts", dump,
                 *(["--chat-template"] if chat else []))
        got = lines(dump)
        assert [g["_id"] for g in got] == [it["_id"] for it in items]
        for it, g in zip(items, got):
            prompt = fill(it)
            ids = tok.encode(prompt)
            cut = len(ids) > max_len
            if cut:
                ids = ids[:max_len // 2] + ids[-max_len // 2:]
                prompt = tok.decode(ids, skip_special_tokens=True)
            if chat:
                prompt = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                                 tokenize=False, add_generation_prompt=True)
            assert g["prompt"] == prompt and g["truncated"] == cut, it["_id"]
            assert g["prompt_token_ids"] == tok(prompt, add_special_tokens=not chat)["input_ids"]
        assert [g["truncated"] for g in got] == [False, True, True, True]


def test_responses_made_elsewhere_are_judged_and_summarised_as_longbench_does(tmp_path):
    path, items = data(tmp_path)
    responses = ["The correct answer is (A)", "**The correct answer is (B)**",
                 "I think The correct answer is A.", "no idea"]
    preds = tmp_path / "preds.jsonl"
    preds.write_text("".join(
        json.dumps({**{k: v for k, v in it.items() if k != "context"}, "response": r}) + "\n"
        for it, r in zip(items, responses)))
    out = tmp_path / "scored"
    said = rsd_eval("longbench", "--score", preds, "--out", out).stdout
    assert "4 responses scored" in said, said
    got = lines(out / "longbench.jsonl")
    for it, r, g in zip(items, responses, got):
        assert g["pred"] == extract_answer(r) and g["judge"] == (extract_answer(r) == it["answer"])
    # result.py: Overall, Easy, Hard, Short, Medium, Long, each round(100 * acc, 1).
    judge = [g["judge"] for g in got]
    acc = lambda sel: round(100 * sum(j for j, s in zip(judge, sel) if s) / sum(sel), 1)
    diff = [it["difficulty"] for it in items]
    length = [it["length"] for it in items]
    want = [acc([True] * 4), acc([d == "easy" for d in diff]), acc([d != "easy" for d in diff]),
            acc([l == "short" for l in length]), acc([l == "medium" for l in length]),
            acc([l not in ("short", "medium") for l in length])]
    s = json.loads((out / "summary.json").read_text())
    assert [s["overall"]] + [c[1] for c in s["columns"]] == want
    md = (out / "summary.md").read_text()
    assert "| Overall | Easy | Hard | Short | Medium | Long |" in md
    assert "| difficulty × length | Short | Medium | Long |" in md
    # The difficulty × length cells: easy/short, hard/medium, hard/long, easy/long.
    cross = {(row, col): cell for row, cells in s["cross"]
             for col, cell in zip(("short", "medium", "long"), cells)}
    assert cross[("Easy", "short")] == [100.0 if judge[0] else 0.0, 1]
    assert cross[("Hard", "long")] == [100.0 if judge[2] else 0.0, 1]
    assert cross[("Hard", "short")] == [None, 0]


def test_a_generation_run_answers_and_resumes(smollm2_dir, tmp_path):
    path, items = data(tmp_path)
    out = tmp_path / "run"
    args = ["longbench", "--data", path, "--model", smollm2_dir, "--out", out, "--max-len", "300",
            "--max-new-tokens", "12", "--chat-template", "--limit", "2", "--quiet"]
    said = rsd_eval(*args).stdout
    assert "2 questions: 2 answered now, 0 already done" in said, said
    got = lines(out / "longbench.jsonl")
    assert [g["_id"] for g in got] == ["id0", "id1"]
    for g in got:
        assert g["pred"] == extract_answer(g["response"]) and "context" not in g
        assert g["prompt_tokens"] <= 300 + 60  # the chat template (and its system prompt) come on top
    assert got[1]["truncated"] is True and got[0]["truncated"] is False
    again = rsd_eval(*args).stdout
    assert "0 answered now, 2 already done" in again, again
    e = fails("rsd-eval", *[a if a != "300" else "400" for a in args]).stderr
    assert "max_len" in e, e


COT = ("Please read the following text and answer the questions below.\n\n<text>\n$DOC$\n"
       "</text>\n\nWhat is the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n"
       "(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\nLet\u2019s think step by step:")


def test_chain_of_thought_prompts_and_two_steps(smollm2_dir, tmp_path):
    """--cot: LongBench's 0shot_cot.txt first (dumped exactly), then an answer step whose
    reasoning is recorded as response_cot."""
    path, items = data(tmp_path)
    dump = tmp_path / "cot.jsonl"
    rsd_eval("longbench", "--data", path, "--tokenizer", smollm2_dir / "tokenizer.json", "--cot",
             "--dump-prompts", dump)
    for it, g in zip(items, lines(dump)):
        want = (COT.replace("$DOC$", it["context"].strip())
                .replace("$Q$", it["question"].strip())
                .replace("$C_A$", it["choice_A"].strip()).replace("$C_B$", it["choice_B"].strip())
                .replace("$C_C$", it["choice_C"].strip()).replace("$C_D$", it["choice_D"].strip()))
        assert g["prompt"] == want
    out = tmp_path / "cot-run"
    rsd_eval("longbench", "--data", path, "--model", smollm2_dir, "--out", out, "--cot",
             "--cot-max-new-tokens", "6", "--max-new-tokens", "6", "--limit", "1", "--quiet")
    (g,) = lines(out / "longbench.jsonl")
    assert isinstance(g["response_cot"], str) and g["pred"] == extract_answer(g["response"])
    assert json.loads((out / "run.json").read_text())["cot_max_new_tokens"] == 6


def test_bad_data_names_the_file_question_and_field(smollm2_dir, tmp_path):
    path, items = data(tmp_path)
    items[2]["answer"] = "E"
    path.write_text(json.dumps(items))
    e = fails("rsd-eval", "longbench", "--data", path, "--tokenizer",
              smollm2_dir / "tokenizer.json", "--dump-prompts", tmp_path / "d.jsonl").stderr
    assert str(path) in e and "question 2" in e and '"answer"' in e, e
    del items[2]["answer"]
    items[1].pop("choice_C")
    path.write_text(json.dumps(items))
    e = fails("rsd-eval", "longbench", "--data", path, "--tokenizer",
              smollm2_dir / "tokenizer.json", "--dump-prompts", tmp_path / "d.jsonl").stderr
    assert "question 1" in e and "choice_C" in e, e
