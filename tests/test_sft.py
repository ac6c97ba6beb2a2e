"""Instruction SFT: chat data packed with `rsd-data pack --chat`, trained with `rsd-train
--objective sft`, checked against transformers.

* The ids of every packed conversation equal transformers' `apply_chat_template(…,
  tokenize=True)`, for SmolLM2-135M-Instruct's, Qwen3's and Llama-3's templates (multi-turn, with
  and without a system message, non-ASCII content).
* The loss mask equals one computed independently: render growing prefixes of the conversation
  with transformers and mark the tokens each assistant turn adds. Where a template renders an
  earlier turn differently once later turns follow (Qwen3), that turn's trained text is its
  answer and `<|im_end|>\\n`.
* Tokens and mask are read with megatron-core's `IndexedDataset` (the mask is a uint8 pair).
* Parquet (`list<struct<role, content>>`, pyarrow) and Arrow (JSON strings) give the same bytes.
* Unknown roles, no assistant turn, a refusing template, a conversation longer than the row and
  malformed messages stop the pack naming file and line, or are counted skips by cause.
* A crashed chat pack resumes to the same shards and masks, byte for byte.
* One SFT step's loss and gradients equal transformers with labels −100 outside the mask
  (SmolLM2-135M, fp64); a few hundred SFT steps on the bundled chat set lower the held-out
  assistant-token loss; `sft-rsd` over dp 2 × cp 2 with the sharded optimizer trains what one
  process trains.
"""
import json
import os
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import zstandard
from megatron.core.datasets.indexed_dataset import IndexedDataset

from rsd_cli import rsd, run

REPO = Path(__file__).resolve().parent.parent
ASSETS = Path(os.environ.get("RSD_ASSETS", Path.home() / ".cache/rsd/assets"))
CHAT = REPO / "corpus" / "chat"
MINI = REPO / "assets" / "tokenizers" / "mini-1k" / "tokenizer.json"
rsd_train = partial(run, "rsd-train")

# Meta-Llama-3-8B-Instruct's template, as in its tokenizer_config.json.
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] "
          "| trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
          "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")


def m(role, content):
    return {"role": role, "content": content}


CONVERSATIONS = [
    [m("user", "What is the capital of France?"), m("assistant", "Paris.")],
    [m("system", "You are terse."), m("user", "Say hi"), m("assistant", "Hi.")],
    [m("system", "Answer in one line."), m("user", "2+2?"), m("assistant", "4"),
     m("user", "And 3+3?"), m("assistant", "6, since 3+3 = 6.")],
    [m("user", "Name a colour."), m("assistant", "Blue."), m("user", "Another?"),
     m("assistant", "Green."), m("user", "One more."), m("assistant", "Red!")],
    [m("user", "Traduis « café » en chinois, s'il te plaît 🙂"),
     m("assistant", "咖啡 ☕ — « café » se dit kāfēi.")],
    [m("user", "  spaced out  \n"), m("assistant", "\n  an answer between newlines\n")],
]


@pytest.fixture(scope="module")
def tokenizers_dirs(tmp_path_factory, smollm2_dir):
    """A model directory (tokenizer.json + its chat template) per template family."""
    root = tmp_path_factory.mktemp("chat-tokenizers")
    qwen3 = root / "qwen3"
    qwen3.mkdir()
    raw = (REPO / "assets/tokenizers/qwen3/tokenizer.json.zst").read_bytes()
    (qwen3 / "tokenizer.json").write_bytes(
        zstandard.ZstdDecompressor().decompress(raw, max_output_size=64 << 20))
    shutil.copy(REPO / "assets/tokenizers/qwen3/tokenizer_config.json", qwen3)
    llama3 = root / "llama3"
    llama3.mkdir()
    shutil.copy(ASSETS / "llama3-tokenizer.json", llama3 / "tokenizer.json")
    (llama3 / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": LLAMA3, "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
        "tokenizer_class": "PreTrainedTokenizerFast"}))
    return {"smollm2": Path(smollm2_dir), "qwen3": qwen3, "llama3": llama3}


def write_jsonl(path, conversations, extra=None):
    with open(path, "w", encoding="utf-8") as f:
        for c in conversations:
            f.write(json.dumps({"messages": c, **(extra or {})}, ensure_ascii=False) + "\n")
    return path


def read_chat(out):
    """Every packed conversation as (ids, mask), in order, through megatron-core."""
    manifest = json.loads((out / "index.json").read_text())
    rows = []
    for shard in manifest["shards"]:
        tokens = IndexedDataset(str(out / shard["prefix"]))
        mask = IndexedDataset(str(out / (shard["prefix"] + "-mask")))
        assert len(mask) == len(tokens) and mask.index.dtype == np.uint8
        for i in range(len(tokens)):
            rows.append((tokens[i].tolist(), mask[i].tolist()))
    return rows, manifest


def prefix_mask(tok, conv, turns):
    """Mark, for each assistant turn i in `turns`, the text that rendering conv[:i+1] adds to
    rendering conv[:i] with the generation prompt (transformers' renderings), then the tokens of
    the whole rendering (transformers' tokenizer, with offsets) that start inside that text. A
    token that straddles a boundary (a newline merged across it) belongs to the text it starts
    in."""
    text = tok.apply_chat_template(conv, tokenize=False)
    spans = []
    for i in turns:
        before = tok.apply_chat_template(conv[:i], tokenize=False, add_generation_prompt=True)
        upto = tok.apply_chat_template(conv[:i + 1], tokenize=False)
        assert upto.startswith(before) and text.startswith(upto), "prefixes must nest"
        spans.append((len(before), len(upto)))
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(a <= start < b for a, b in spans)) for start, _ in enc["offset_mapping"]]
    return enc["input_ids"], mask


def runs(tok, ids, mask):
    """The trained runs of a row, decoded."""
    out, start = [], None
    for k, v in enumerate(mask + [0]):
        if v and start is None:
            start = k
        if not v and start is not None:
            out.append(tok.decode(ids[start:k]))
            start = None
    return out


@pytest.mark.parametrize("family", ["smollm2", "qwen3", "llama3"])
def test_ids_and_masks_equal_transformers(family, tokenizers_dirs, tmp_path):
    from transformers import AutoTokenizer

    d = tokenizers_dirs[family]
    tok = AutoTokenizer.from_pretrained(d)
    src = write_jsonl(tmp_path / "chat.jsonl", CONVERSATIONS)
    for train_on in ["assistant", "last-assistant"]:
        out = tmp_path / f"out-{train_on}"
        rsd("pack", "--chat", "--train-on", train_on, "--src", src, "--tokenizer",
            d / "tokenizer.json", "--len", 8192, "--out", out)
        rows, manifest = read_chat(out)
        assert len(rows) == len(CONVERSATIONS) and manifest["mode"] == "mixed"
        assert manifest["loss_mask"]["train_on"] == train_on
        assert manifest["loss_mask"]["trained_tokens"] == sum(sum(mk) for _, mk in rows)
        for conv, (ids, mask) in zip(CONVERSATIONS, rows):
            turns = [i for i, x in enumerate(conv) if x["role"] == "assistant"]
            assert ids == tok.apply_chat_template(conv, tokenize=True), conv
            nested = family != "qwen3" or len(turns) == 1 or train_on == "last-assistant"
            if nested:
                _, want = prefix_mask(tok, conv, turns if train_on == "assistant" else turns[-1:])
                assert mask == want, (family, train_on, conv)
            else:
                # Qwen3 drops the think block of answers before the last question: those turns
                # train on their answer and its end, the last as it is generated.
                got = runs(tok, ids, mask)
                want = [conv[i]["content"] + "<|im_end|>\n" for i in turns[:-1]]
                _, last = prefix_mask(tok, conv, turns[-1:])
                assert got[:-1] == want and got[-1] == runs(tok, ids, last)[0], got
                assert got[-1].startswith("<think>\n\n</think>\n\n")
    rsd("verify", out)
    shown = rsd("inspect", out, "--sample", 0, "--chars", 4000).stdout
    assert "loss mask" in shown and "⟦" in shown, shown


def test_parquet_and_arrow_conversations_pack_to_the_same_bytes(tokenizers_dirs, tmp_path):
    import pyarrow as pa
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    tok_json = tokenizers_dirs["smollm2"] / "tokenizer.json"
    outs = {}
    jsonl = write_jsonl(tmp_path / "chat.jsonl", CONVERSATIONS)
    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    pq.write_table(pa.table({"id": list(range(len(CONVERSATIONS))),
                             "messages": pa.array(CONVERSATIONS, type=pa.list_(message))}),
                   tmp_path / "chat.parquet")
    with ipc.new_file(tmp_path / "chat.arrow", pa.schema([("messages", pa.string())])) as w:
        w.write_table(pa.table({"messages": [json.dumps(c) for c in CONVERSATIONS]}))
    for name in ["chat.jsonl", "chat.parquet", "chat.arrow"]:
        outs[name] = tmp_path / f"out-{name}"
        rsd("pack", "--chat", "--src", tmp_path / name, "--tokenizer", tok_json, "--len", 4096,
            "--out", outs[name])
    for f in ["shard-00000.bin", "shard-00000.idx", "shard-00000-mask.bin", "shard-00000-mask.idx"]:
        contents = {n: (o / f).read_bytes() for n, o in outs.items()}
        assert len(set(contents.values())) == 1, f
    assert jsonl.exists()


def test_bad_conversations_stop_the_pack_or_are_counted_by_cause(tmp_path):
    refusing = tmp_path / "refusing.jinja"
    refusing.write_text((CHAT / "chatml.jinja").read_text().replace(
        "{% for message in messages %}",
        "{% for message in messages %}{% if 'FORBIDDEN' in message['content'] %}"
        "{{ raise_exception('forbidden content') }}{% endif %}", 1))
    good = [m("user", "hi"), m("assistant", "hello")]
    lines = [
        json.dumps({"messages": good}),                                          # 1
        json.dumps({"messages": [m("user", "x"), m("tool", "y"), m("assistant", "z")]}),  # 2
        json.dumps({"messages": [m("system", "s"), m("user", "no answer")]}),    # 3
        json.dumps({"messages": [m("user", "long " * 600), m("assistant", "ok")]}),  # 4
        json.dumps({"messages": [m("user", "q"), {"role": "assistant", "content": None}]}),  # 5
        "{not json",                                                              # 6
        json.dumps({"messages": [m("user", "FORBIDDEN"), m("assistant", "no")]}),  # 7
        json.dumps({"messages": good}),                                          # 8
    ]
    src = tmp_path / "bad.jsonl"
    src.write_text("\n".join(lines) + "\n")
    args = ["pack", "--chat", "--src", src, "--tokenizer", MINI, "--chat-template-file", refusing,
            "--len", 256]
    e = rsd(*args, "--out", tmp_path / "stop", ok=False).stderr
    assert f"{src}:line 2" in e and 'role "tool"' in e, e
    assert not (tmp_path / "stop" / "index.json").exists()
    out = tmp_path / "skip"
    rsd(*args, "--out", out, "--skip-bad")
    manifest = json.loads((out / "index.json").read_text())
    causes = {b["cause"]: (b["count"], b["first"]) for b in manifest["totals"]["bad_inputs"]}
    assert {k: v[0] for k, v in causes.items()} == {
        "unknown-role": 1, "no-assistant": 1, "too-long": 1, "bad-record": 2, "template": 1}, causes
    assert "line 4" in causes["too-long"][1] and "longer than --len 256" in causes["too-long"][1]
    assert "messages[1].content is null" in causes["bad-record"][1]
    assert "forbidden content" in causes["template"][1]
    assert manifest["totals"]["documents"] == 2 and manifest["totals"]["skipped_documents"] == 6
    # Only a mixed pack keeps conversations whole.
    e = rsd(*args, "--mode", "fixed", "--out", tmp_path / "fixed", ok=False).stderr
    assert "--mode mixed" in e, e


def test_a_crashed_chat_pack_resumes_to_the_same_shards_and_masks(tmp_path):
    args = ["pack", "--chat", "--src", CHAT / "train.jsonl", "--tokenizer", MINI,
            "--chat-template-file", CHAT / "chatml.jinja", "--len", 512, "--shard-size", "8KiB"]
    rsd(*args, "--out", tmp_path / "reference")
    p = run("rsd-data", *args, "--out", tmp_path / "out", check=False,
            env={"RSD_PACK_CRASH_AFTER_SHARDS": "3"}, timeout=300)
    assert p.returncode != 0 and not (tmp_path / "out" / "index.json").exists()
    resumed = rsd(*args, "--out", tmp_path / "out")
    assert "resumed after 3 shards" in resumed.stdout + resumed.stderr
    names = sorted(f.name for f in (tmp_path / "reference").iterdir())
    assert "shard-00005-mask.bin" in names and names == sorted(f.name for f in (tmp_path / "out").iterdir())
    for name in names:
        a, b = (tmp_path / "reference" / name), (tmp_path / "out" / name)
        if name == "index.json":
            a, b = json.loads(a.read_text()), json.loads(b.read_text())
            a.pop("command"), b.pop("command")
            assert a == b
        else:
            assert a.read_bytes() == b.read_bytes(), name


def grads(path):
    from safetensors.numpy import load_file
    return load_file(str(path))


def test_one_sft_step_equals_transformers_with_labels_masked(smollm2_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    src = write_jsonl(tmp_path / "chat.jsonl", CONVERSATIONS[2:3])
    out = tmp_path / "packed"
    rsd("pack", "--chat", "--src", src, "--tokenizer", Path(smollm2_dir) / "tokenizer.json",
        "--len", 1024, "--out", out)
    (ids, mask), = read_chat(out)[0]
    np.save(tmp_path / "T.npy", np.array([ids], dtype=np.int64))
    np.save(tmp_path / "M.npy", np.array([mask], dtype=np.int64))
    got = json.loads(rsd_train(
        "probe", "--model", smollm2_dir, "--tokens", tmp_path / "T.npy", "--loss-mask",
        tmp_path / "M.npy", "--objective", "sft", "--dtype", "fp64", "--grads-out",
        tmp_path / "g.safetensors", timeout=600).stdout)

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir).double()
    # SmolLM2's pad id is <|im_end|>'s (2), and transformers builds the embedding with
    # padding_idx = pad id, which drops that row's gradient from the input side. Chat data trains
    # on <|im_end|> like any token (rsd does not treat it as padding): the reference neither.
    assert model.model.embed_tokens.padding_idx == 2 and 2 in ids
    model.model.embed_tokens.padding_idx = None
    x = torch.tensor([ids])
    labels = torch.tensor([[t if mk else -100 for t, mk in zip(ids, mask)]])
    # transformers' own loss upcasts the logits to fp32: the same shifted, masked mean in fp64.
    logits = model(input_ids=x).logits[0, :-1]
    loss = torch.nn.functional.cross_entropy(logits, labels[0, 1:], ignore_index=-100)
    loss.backward()
    assert got["clm"] == pytest.approx(loss.item(), rel=1e-6)
    assert got["loss"] == pytest.approx(loss.item(), rel=1e-6)
    ours = grads(tmp_path / "g.safetensors")
    compared = 0
    for name, p in model.named_parameters():
        if name not in ours:
            continue
        ref = p.grad.numpy()
        err = np.abs(ours[name].astype(np.float64) - ref).max()
        assert err <= 1e-6 * np.abs(ref).max() + 1e-12, (name, err, np.abs(ref).max())
        compared += 1
    assert compared >= 20, sorted(ours)


def test_sft_lowers_heldout_assistant_loss_on_the_bundled_chat_set(tmp_path):
    packed = {}
    for part in ["train", "heldout"]:
        packed[part] = tmp_path / part
        rsd("pack", "--chat", "--src", CHAT / f"{part}.jsonl", "--tokenizer", MINI,
            "--chat-template-file", CHAT / "chatml.jinja", "--len", 512, "--out", packed[part])
    config = json.loads((REPO / "configs/model/tiny-qwen3-64.json").read_text())
    config.update(vocab_size=1024, bos_token_id=0, eos_token_id=0)
    (tmp_path / "tiny-1k.json").write_text(json.dumps(config))
    out = tmp_path / "run"
    rsd_train("--config", REPO / "configs" / "tiny-cpu.toml", "--shards", packed["train"],
              "--init", tmp_path / "tiny-1k.json", "--out", out, "--objective", "sft",
              "--steps", 200, "--lr", 3e-3, "--micro-batch", 2, "--heldout-shards", packed["heldout"],
              "--heldout-every", 25, "--heldout-batches", 4, "--save-every", 0,
              "--progress", "false", "--threads", "2", timeout=900)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    held = [r["heldout_clm"] for r in rows if r.get("heldout_clm") is not None]
    # ln(1024) ≈ 6.9 nats at init; the answers' tokens become predictable.
    print("held-out assistant-token CLM every 25 steps:", [round(h, 3) for h in held])
    assert len(held) == 8 and held[-1] < held[0] / 2 and held[-1] < 1.0, held
    assert all(r["kl"] == 0 for r in rows)
    # Shards without a loss mask are refused by the SFT objective, naming the directory.
    plain = tmp_path / "plain"
    rsd("pack", "--src", REPO / "corpus/books/sotu-1790_george_washington_n.txt", "--tokenizer",
        MINI, "--len", 256, "--out", plain)
    e = rsd_train("--config", REPO / "configs" / "tiny-cpu.toml", "--shards", plain, "--init",
                  tmp_path / "tiny-1k.json", "--out", tmp_path / "bad", "--objective", "sft",
                  "--steps", 1, "--progress", "false", check=False).stderr
    assert f"{plain} has no loss mask" in e and "rsd-data pack --chat" in e, e


def test_epochs_set_the_steps_from_the_packed_rows(tmp_path):
    chat = tmp_path / "chat"
    rsd("pack", "--chat", "--src", CHAT / "heldout.jsonl", "--tokenizer", MINI,
        "--chat-template-file", CHAT / "chatml.jinja", "--len", 512, "--out", chat)
    rows = json.loads((chat / "index.json").read_text())["totals"]["samples"]
    config = json.loads((REPO / "configs/model/tiny-qwen3-64.json").read_text())
    config.update(vocab_size=1024, bos_token_id=0, eos_token_id=0)
    (tmp_path / "tiny-1k.json").write_text(json.dumps(config))
    out = tmp_path / "run"
    # 1024 tokens per step of 2-row micro-batches of 512: 2 rows per step.
    p = rsd_train("--config", REPO / "configs" / "tiny-cpu.toml", "--shards", chat, "--init",
                  tmp_path / "tiny-1k.json", "--out", out, "--objective", "sft", "--epochs", 1.5,
                  "--steps", 999, "--micro-batch", 2, "--tokens-per-step", 1024, "--save-every", 0,
                  "--progress", "false", "--threads", 2, timeout=600)
    steps = -(-3 * rows // 4)  # ⌈1.5 × rows ÷ 2⌉
    assert f"1.5 epoch(s) of {rows} rows at 2 rows per step: {steps} steps" in p.stderr, p.stderr
    assert len((out / "metrics.jsonl").read_text().splitlines()) == steps
    e = rsd_train("--config", REPO / "configs" / "tiny-cpu.toml", "--shards", chat, "--init",
                  tmp_path / "tiny-1k.json", "--out", tmp_path / "bad", "--epochs=-1",
                  check=False).stderr
    assert "config key epochs" in e, e


def test_sft_rsd_under_dp_2_by_cp_2_trains_what_one_process_trains(tmp_path):
    chat = tmp_path / "chat"
    rsd("pack", "--chat", "--src", CHAT / "train.jsonl", "--tokenizer", MINI,
        "--chat-template-file", CHAT / "chatml.jinja", "--len", 512, "--out", chat)
    config = json.loads((REPO / "configs/model/tiny-qwen3-64.json").read_text())
    config.update(vocab_size=1024, bos_token_id=0, eos_token_id=0)
    (tmp_path / "tiny-1k.json").write_text(json.dumps(config))

    def train(out, *extra):
        rsd_train("--config", REPO / "configs" / "tiny-cpu.toml", "--shards", chat, "--init",
                  tmp_path / "tiny-1k.json", "--out", out, "--objective", "sft-rsd",
                  "--progress", "false", "--threads", 1, "--steps", 2, "--save-every", 0,
                  "--micro-batch", 2, "--tokens-per-step", 2048, *extra, timeout=600)
        return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]

    one = train(tmp_path / "one")
    mesh = train(tmp_path / "mesh", "--dp", 2, "--cp", 2, "--shard-optimizer", "true")
    for a, b in zip(one, mesh):
        assert a["kl"] > 0 and a["tokens"] == b["tokens"]
        for k in ("loss", "clm", "grad_norm"):
            assert b[k] == pytest.approx(a[k], rel=1e-5), (k, a, b)
        # The KL (≈4e-4) is a difference of log-probabilities of the loss's size: its fp32
        # rounding is absolute, on the loss's scale.
        assert b["kl"] == pytest.approx(a["kl"], rel=0, abs=1e-5 * a["loss"]), (a, b)
