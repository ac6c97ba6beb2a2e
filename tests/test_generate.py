"""`rsd-model generate` against transformers' `generate` (the real peer).

Tiny random Llama-3 and Qwen3 models are saved by transformers with a small byte-level BPE
tokenizer trained here; our greedy output must equal `generate(do_sample=False)` token for token,
whatever the batch (left-padded prompts of different lengths) and the prefill chunk size; EOS, stop
strings and --max-new-tokens end generations; bad inputs are one-line errors.
"""
import json
import shutil
from functools import partial

import numpy as np
import pytest
import torch

from rsd_cli import fails, run

rsd_model = partial(run, "rsd-model")
NEW = 12
PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Once",
    "In a hole in the ground there lived a hobbit, not a nasty dirty wet hole.",
]
CORPUS = PROMPTS + [
    "It was the best of times, it was the worst of times.",
    "Call me Ishmael. Some years ago, never mind how long precisely.",
] * 3


def train_tokenizer(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(path))
    return tok


def build(kind, path):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    path.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(path / "tokenizer.json")
    eos = tok.token_to_id("<eos>")
    common = dict(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=96,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=256, eos_token_id=eos, bos_token_id=None)
    cfg = (LlamaConfig(rope_theta=10000.0, tie_word_embeddings=False, **common) if kind == "llama"
           else Qwen3Config(head_dim=24, rope_theta=1e6, tie_word_embeddings=True, **common))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15)
    model.save_pretrained(path, safe_serialization=True)
    return model, tok


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def peer(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / "model"
    model, tok = build(request.param, path)
    return model, tok, path


def generate(path, *args):
    out = rsd_model("generate", "--model", path, *args).stdout
    return [json.loads(line) for line in out.splitlines()]


def prompt_args():
    return [a for p in PROMPTS for a in ("--prompt", p)]


def hf_greedy(model, ids, new=NEW):
    x = torch.tensor([ids])
    with torch.no_grad():
        y = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                           max_new_tokens=new, pad_token_id=0)
    return y[0, len(ids):].tolist()


def test_greedy_matches_transformers_in_any_batch_and_chunking(peer, tmp_path):
    model, tok, path = peer
    want = [hf_greedy(model, tok.encode(p).ids) for p in PROMPTS]
    assert max(len(w) for w in want) > 4, "the comparison needs real continuations"
    runs = {
        "batched, chunk 3": generate(path, *prompt_args(), "--max-new-tokens", NEW,
                                     "--prefill-chunk", 3),
        "alone, unchunked": generate(path, *prompt_args(), "--max-new-tokens", NEW,
                                     "--batch-size", 1),
        "batched, chunk 1": generate(path, *prompt_args(), "--max-new-tokens", NEW,
                                     "--prefill-chunk", 1, "--batch-size", 2),
    }
    eos = tok.token_to_id("<eos>")
    for name, got in runs.items():
        assert [g["index"] for g in got] == [0, 1, 2]
        for g, w in zip(got, want):
            assert g["ids"] == w, f"{name}: ours {g['ids']} vs transformers {w}"
            assert g["stop_reason"] == ("eos" if w[-1] == eos else "length")
            assert g["text"] == tok.decode(w, skip_special_tokens=True)
    # Token files give the same as text: [T] and [B, T] arrays.
    np.save(tmp_path / "one.npy", np.array(tok.encode(PROMPTS[0]).ids, dtype=np.int64))
    np.save(tmp_path / "two.npy", np.array([tok.encode(PROMPTS[1]).ids] * 2, dtype=np.int32))
    got = generate(path, "--tokens", tmp_path / "one.npy", "--tokens", tmp_path / "two.npy",
                   "--max-new-tokens", NEW)
    assert [g["ids"] for g in got] == [want[0], want[1], want[1]]


def test_stop_strings_max_new_tokens_and_sampling(peer, tmp_path):
    model, tok, path = peer
    full = generate(path, "--prompt", PROMPTS[0], "--max-new-tokens", 20, "--ignore-eos")[0]
    assert len(full["ids"]) == 20 and full["stop_reason"] == "length"
    short = generate(path, *prompt_args(), "--max-new-tokens", 5, "--ignore-eos")
    assert all(len(g["ids"]) == 5 and g["stop_reason"] == "length" for g in short)
    assert short[0]["ids"] == full["ids"][:5]

    text = full["text"]
    at = next(i for i in range(3, len(text) - 2) if text[i:i + 2].isascii() and text[i:i + 2].strip())
    stop = text[at:at + 2]
    got = generate(path, "--prompt", PROMPTS[0], "--max-new-tokens", 20, "--ignore-eos",
                   "--stop", "never-generated", "--stop", stop)[0]
    assert got["stop_reason"] == "stop" and got["stop"] == stop
    assert got["text"] == text[:text.find(stop)]
    n = len(got["ids"])
    assert got["ids"] == full["ids"][:n]
    assert stop in tok.decode(got["ids"]) and stop not in tok.decode(got["ids"][:-1])

    # Sampling: reproducible for a seed, independent of the batch, and not greedy.
    sample = ["--max-new-tokens", 16, "--ignore-eos", "--temperature", 1.5, "--top-p", 0.95]
    a = generate(path, *prompt_args(), *sample, "--seed", 1)
    b = generate(path, *prompt_args(), *sample, "--seed", 1, "--batch-size", 1)
    c = generate(path, *prompt_args(), *sample, "--seed", 2)
    assert a == b
    assert a != c
    assert a[0]["ids"] != full["ids"][:16]


def test_bad_inputs_are_one_line_errors(peer, tmp_path):
    _, _, path = peer
    bare = tmp_path / "bare"
    shutil.copytree(path, bare)
    (bare / "tokenizer.json").unlink()
    err = fails("rsd-model", "generate", "--model", bare, "--prompt", "hi").stderr
    assert "tokenizer.json: no tokenizer.json here" in err and len(err.strip().splitlines()) == 1

    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "a"}\n{"text": "b"}\n')
    err = fails("rsd-model", "generate", "--model", path, "--prompts", bad).stderr
    assert f"{bad}:2: missing field \"prompt\"" in err
    bad.write_text('{"prompt": "a"}\n\n{"prompt": 3}\nnot json\n')
    err = fails("rsd-model", "generate", "--model", path, "--prompts", bad).stderr
    assert f"{bad}:3: field \"prompt\" is not a string" in err
    bad.write_text('{"prompt": "a"}\nnot json\n')
    err = fails("rsd-model", "generate", "--model", path, "--prompts", bad).stderr
    assert f"{bad}:2: not valid JSON" in err

    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({"prompt": p, "id": i}) + "\n" for i, p in enumerate(PROMPTS)))
    a = generate(path, "--prompts", good, "--max-new-tokens", 3)
    assert a == generate(path, *prompt_args(), "--max-new-tokens", 3)

    err = fails("rsd-model", "generate", "--model", path).stderr
    assert "no prompts" in err
    np.save(tmp_path / "f.npy", np.zeros((1, 3), dtype=np.float32))
    err = fails("rsd-model", "generate", "--model", path, "--tokens", tmp_path / "f.npy").stderr
    assert "f.npy: expected integer ids, got fp32" in err
    np.save(tmp_path / "big.npy", np.array([1, 10**6], dtype=np.int64))
    err = fails("rsd-model", "generate", "--model", path, "--tokens", tmp_path / "big.npy").stderr
    assert "token ids must lie in" in err

    rsd_model("generate", "--model", path, "--prompts", good, "--max-new-tokens", 3,
              "--out", tmp_path / "out.jsonl")
    assert [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()] == a


def test_rope_scaling_from_config_and_flag_matches_transformers(tmp_path):
    """YaRN from config.json, and the same given with --rope-scaling to a plain checkpoint, equal
    transformers' greedy generation with that config (prompt + generation run past the original
    context, so the scaled frequencies matter)."""
    from transformers import AutoModelForCausalLM

    plain = tmp_path / "plain"
    build("llama", plain)
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    scaled = tmp_path / "yarn"
    shutil.copytree(plain, scaled)
    cfg = json.loads((scaled / "config.json").read_text())
    (scaled / "config.json").write_text(json.dumps({**cfg, "rope_scaling": yarn}))
    model = AutoModelForCausalLM.from_pretrained(scaled, attn_implementation="eager",
                                                 dtype=torch.float32).eval()
    tok = train_tokenizer(tmp_path / "tok.json")
    want = [hf_greedy(model, tok.encode(p).ids, new=20) for p in PROMPTS]
    args = [*prompt_args(), "--max-new-tokens", 20]
    assert [g["ids"] for g in generate(scaled, *args)] == want
    assert [g["ids"] for g in generate(plain, *args, "--rope-scaling", json.dumps(yarn))] == want
    assert [g["ids"] for g in generate(plain, *args)] != want
