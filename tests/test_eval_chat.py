"""`rsd-eval run --chat-template`: prompts rendered with the model's Jinja chat template.

The rendered prompts (`--dump-prompts`) must equal transformers' `apply_chat_template` (one user
message, add_generation_prompt=True) on the task's question, followed by RULER's answer prefix,
for SmolLM2-135M-Instruct's template (from its GGUF, via scripts/convert_smollm2.py) and for a
Llama-3-style template with a BOS token (from tokenizer_config.json); the wrapper's tokens count
toward the length and the BOS is not doubled. SmolLM2 must still find the needle with its template,
and missing or broken templates are clear errors naming the file.
"""
import hashlib
import json
import shutil
from functools import partial
from pathlib import Path

import pytest

from rsd_cli import fails, run

REPO = Path(__file__).resolve().parent.parent
rsd_eval = partial(run, "rsd-eval")
eval_fails = partial(fails, "rsd-eval")

# Meta-Llama-3-8B-Instruct's template, as in its tokenizer_config.json.
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] "
          "| trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
          "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

# Where each task's question starts and ends, and where RULER's answer prefix starts.
QUESTION = {
    "niah_single_1": ("A special magic number is hidden", "mentioned in the provided text?",
                      " The special magic number for"),
    "vt": ("Memorize and track the chain(s)", "in the text above.", " Answer: According to"),
    "cwe": ("Below is a numbered list of words.", "in the above list?", " Answer: The top 10"),
    "fwe": ("Read the following coded text", "in the above coded text?", " Answer: According to"),
}
TASKS = ["--tasks", ",".join(QUESTION), "--lengths", "2048", "--depths", "2", "--samples", "1"]


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def llama3_style(tmp_path_factory):
    """A small byte-level BPE tokenizer with Llama-3's special tokens, a post-processor that adds
    <|begin_of_text|>, and LLAMA3 in tokenizer_config.json (BOS as an AddedToken dict)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    d = tmp_path_factory.mktemp("llama3")
    specials = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = (REPO / "corpus/books/sotu-1790_george_washington_n.txt").read_text()
    tok.train_from_iterator([x for x in text.splitlines() if x.strip()], trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)])
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": {"__type": "AddedToken", "content": "<|begin_of_text|>", "lstrip": False,
                      "normalized": False, "rstrip": False, "single_word": False},
        "eos_token": "<|eot_id|>",
        "chat_template": LLAMA3,
        "model_max_length": 1000000,
    }))
    return d


@pytest.mark.parametrize("which", ["smollm2", "llama3_style"])
def test_rendered_prompts_are_transformers_apply_chat_template(which, request, tmp_path):
    from transformers import AutoTokenizer

    d = request.getfixturevalue("smollm2_dir" if which == "smollm2" else "llama3_style")
    dump = tmp_path / "chat.jsonl"
    rsd_eval("run", "--tokenizer", d / "tokenizer.json", "--chat-template", "--dump-prompts", dump,
             *TASKS)
    tok = AutoTokenizer.from_pretrained(d)
    items = lines(dump)
    assert len(items) == 5
    for it in items:
        start, end, answer = QUESTION[it["task"]]
        p = it["prompt"]
        question = p[p.index(start):p.rindex(end) + len(end)]
        at = p.rindex(answer)
        expected = tok.apply_chat_template([{"role": "user", "content": question}],
                                           tokenize=False, add_generation_prompt=True)
        assert p[:at] == expected, it["task"]
        assert p[at:].startswith(answer) and p.startswith(tok.bos_token)
        source = "chat_template.jinja" if which == "smollm2" else "tokenizer_config.json"
        assert it["chat_template"].endswith(source)
        # The wrapper's tokens count; the BOS the template writes is the only one.
        ids = tok(p, add_special_tokens=False)["input_ids"]
        assert len(ids) == it["prompt_tokens"]
        assert ids[0] == tok.bos_token_id and ids[1] != tok.bos_token_id
        assert it["length"] - 200 <= it["prompt_tokens"] + it["max_new_tokens"] <= it["length"]
    # Plain prompts (the default) are unchanged: no template, no chat tokens.
    plain = tmp_path / "plain.jsonl"
    rsd_eval("run", "--tokenizer", d / "tokenizer.json", "--dump-prompts", plain, *TASKS)
    for it in lines(plain):
        assert it["chat_template"] is None
        assert it["prompt"].startswith(QUESTION[it["task"]][0])


FACTS = [("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
          "It was completed in 1889.", "In which city is the Eiffel Tower?", "Paris"),
         ("Mount Kilimanjaro is a dormant volcano in Tanzania. It is the highest mountain in "
          "Africa.", "In which country is Mount Kilimanjaro?", "Tanzania")]


def squad_of_facts(dir):
    """A SQuAD v2.0 dev file: the FACTS' paragraphs with their questions, and filler articles
    (text of the bundled books) without questions, whose paragraphs are the distractors."""
    words = (REPO / "corpus/books/sotu-1790_george_washington_n.txt").read_text().split()
    data = [{"title": f"Fact {i}", "paragraphs": [{"context": c, "qas": [
        {"question": q, "id": str(i), "is_impossible": False,
         "answers": [{"text": a, "answer_start": c.index(a)}]}]}]}
        for i, (c, q, a) in enumerate(FACTS)]
    data += [{"title": f"Filler {j}", "paragraphs": [
        {"context": " ".join(words[j * 50:(j + 1) * 50]), "qas": []}]} for j in range(40)]
    dir.mkdir()
    (dir / "squad.json").write_text(json.dumps({"version": "v2.0", "data": data}))
    return dir


def test_smollm2_with_its_template_finds_the_needle(smollm2_dir, tmp_path):
    """SmolLM2-135M-Instruct with its chat template on niah_single_1 and on qa_1 (RULER's QA
    prompt, SQuAD-format questions among other paragraphs) at 1K tokens."""
    out = tmp_path / "run"
    args = ["--model", smollm2_dir, "--out", out, "--tasks", "niah_single_1,qa_1", "--lengths",
            "1024", "--depths", "1", "--samples", "2", "--max-new-tokens", "12", "--batch-size",
            "4", "--qa-dir", squad_of_facts(tmp_path / "qa"), "--quiet"]
    rsd_eval("run", *args, "--chat-template")
    summary = json.loads((out / "summary.json").read_text())
    score = {c["task"]: c["mean"] for c in summary["by_task_length"]}
    outputs = [(r["task"], r["expected"], r["output"]) for r in lines(out / "results.jsonl")]
    assert score["niah_single_1"] == 1.0, f"SmolLM2 with its chat template: {outputs}"
    assert score["qa_1"] >= 0.5, f"SmolLM2 with its chat template: {outputs}"
    settings = json.loads((out / "run.json").read_text())
    jinja = (smollm2_dir / "chat_template.jinja").resolve()
    assert settings["chat_template"] == {
        "source": str(jinja), "sha256": hashlib.sha256(jinja.read_bytes()).hexdigest()}
    # The template is a setting: a rerun with it resumes (nothing left to do), one with plain
    # prompts into the same directory is refused.
    assert "4 items: 0 generated, 4 already done" in rsd_eval("run", *args, "--chat-template").stdout
    e = eval_fails("run", *args).stderr
    assert "different settings: chat_template" in e


def test_missing_and_broken_templates_are_clear_errors(smollm2_dir, tmp_path):
    tmp_path = tmp_path.resolve()
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(smollm2_dir / "tokenizer.json", bare / "tokenizer.json")
    args = ["--tokenizer", bare / "tokenizer.json", "--dump-prompts", tmp_path / "p.jsonl",
            "--tasks", "niah_single_1", "--lengths", "1024", "--depths", "1"]
    e = eval_fails("run", *args, "--chat-template").stderr
    assert f"{bare} has no chat template" in e
    assert "chat_template.jinja" in e and "tokenizer_config.json" in e and "--chat-template-file" in e

    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m['content'] }}\n")
    e = eval_fails("run", *args, "--chat-template-file", broken).stderr
    assert f"chat template {broken}:" in e and "syntax error" in e

    refusing = tmp_path / "refusing.jinja"
    refusing.write_text("{% if messages[0]['role'] == 'user' %}"
                        "{{ raise_exception('only system messages here') }}{% endif %}")
    e = eval_fails("run", *args, "--chat-template-file", refusing).stderr
    assert f"chat template {refusing}:" in e and "only system messages here" in e

    (bare / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages[0] "}))
    e = eval_fails("run", *args, "--chat-template").stderr
    assert f"{bare / 'tokenizer_config.json'}" in e and "syntax error" in e
    assert not (tmp_path / "p.jsonl").exists()
