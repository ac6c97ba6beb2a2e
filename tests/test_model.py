"""rsd-model against transformers (the real peer).

Tiny random Llama-3 and Qwen3 models are created and saved by transformers; our `rsd-model logits`
must reproduce transformers' logits within 1e-4 (fp32) at standard, skip- and cyclic-perturbed
positions, with document masking (compared with per-document runs), after our own save, and bad
checkpoints must fail with errors naming the problem.

The binary is found in $RSD_BIN_DIR (default <repo>/target/debug).
Note: transformers treats position-id jumps as packed-sequence starts unless an attention_mask is
passed, so every reference call passes attention_mask=ones.
"""
import json
import shutil
import subprocess
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from rsd_cli import exe, run

REPO = Path(__file__).resolve().parent.parent
TOL = 1e-4
T = 24
rsd_model = partial(run, "rsd-model")


def llama_config(**kw):
    from transformers import LlamaConfig

    base = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                rope_theta=10000.0, tie_word_embeddings=False, rms_norm_eps=1e-5)
    base.update(kw)
    return LlamaConfig(**base)


def qwen3_config(**kw):
    from transformers import Qwen3Config

    base = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                max_position_embeddings=256, rope_theta=1e6, tie_word_embeddings=True,
                rms_norm_eps=1e-6)
    base.update(kw)
    return Qwen3Config(**base)


CONFIGS = {
    "llama": lambda: llama_config(),
    "llama-gqa-bias-llama3rope": lambda: llama_config(
        attention_bias=True, mlp_bias=True, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "llama-yarn": lambda: llama_config(
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
    "qwen3": lambda: qwen3_config(),
}


def build(kind, path):
    """A transformers model with weights large enough that every part matters, saved to path."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = CONFIGS[kind]()
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
            else:
                p.normal_(0.0, 0.15)
    model.save_pretrained(path, safe_serialization=True)
    return model


@pytest.fixture(scope="module", params=list(CONFIGS))
def peer(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return request.param, build(request.param, path), path


def tokens(b=2, t=T, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 97, (b, t), generator=g)


def positions(kind, b=2, t=T):
    i = torch.arange(t).repeat(b, 1)
    if kind == "standard":
        return i
    if kind == "skip":  # r_i = i for i < s, i + y for i >= s (per row s, y)
        s, y = torch.tensor([[9], [3]]), torch.tensor([[50], [200]])
        return torch.where(i < s, i, i + y)
    if kind == "cyclic":  # r_i = (i + u) mod L
        return (i + torch.tensor([[7], [17]])) % t
    raise ValueError(kind)


def reference(model, tok, pos):
    with torch.no_grad():
        return model(input_ids=tok, position_ids=pos, attention_mask=torch.ones_like(tok)).logits.numpy()


def ours(path, tok, pos, tmp, *extra):
    np.save(tmp / "tok.npy", tok.numpy().astype(np.int64))
    np.save(tmp / "pos.npy", pos.numpy().astype(np.int64))
    rsd_model("logits", "--model", path, "--tokens", tmp / "tok.npy", "--positions",
              tmp / "pos.npy", "--out", tmp / "out.npy", *extra)
    return np.load(tmp / "out.npy")


@pytest.mark.parametrize("view", ["standard", "skip", "cyclic"])
def test_logits_match_transformers(peer, view, tmp_path):
    kind, model, path = peer
    tok, pos = tokens(), positions(view)
    want = reference(model, tok, pos)
    got = ours(path, tok, pos, tmp_path)
    assert got.shape == want.shape == (2, T, 97)
    assert np.abs(got - want).max() < TOL, f"{kind}/{view}: max diff {np.abs(got - want).max()}"
    # The comparison means something: logits are O(1) and positions change them.
    assert np.abs(want).max() > 1.0
    if view != "standard":
        std = reference(model, tok, positions("standard"))
        assert np.abs(std - want).max() > 1e-2, "perturbed positions did not change the logits"


@pytest.mark.parametrize("view", ["standard", "skip"])
def test_document_masking_equals_per_document_runs(peer, view, tmp_path):
    kind, model, path = peer
    tok, pos = tokens(), positions(view)
    cu = [[0, 7, 16, T], [0, 11, T]]
    got = ours(path, tok, pos, tmp_path, "--doc-boundaries", ";".join(",".join(map(str, r)) for r in cu))
    for row, bounds in enumerate(cu):
        for s, e in zip(bounds, bounds[1:]):
            want = reference(model, tok[row:row + 1, s:e], pos[row:row + 1, s:e])[0]
            assert np.abs(got[row, s:e] - want).max() < TOL, f"{kind} row {row} doc [{s},{e})"
    # And masking is not a no-op: the unmasked run differs after the first boundary.
    full = reference(model, tok, pos)
    assert np.abs(full[0, 7:] - got[0, 7:]).max() > 1e-2


def test_our_save_loads_in_transformers(tmp_path):
    """rsd-model convert (load + sharded save with a new RoPE base) -> transformers -> same logits."""
    from transformers import AutoModelForCausalLM

    src = tmp_path / "src"
    build("qwen3", src)
    (src / "tokenizer_config.json").write_text('{"model_max_length": 256}')
    out = tmp_path / "out"
    rsd_model("convert", "--model", src, "--out", out, "--rope-theta", "8e6",
              "--max-positions", "1024", "--max-shard-mb", "0.05")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1, "expected several shards"
    assert (out / "tokenizer_config.json").exists(), "tokenizer files are carried over"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_theta"] == 8e6 and cfg["max_position_embeddings"] == 1024
    model = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    assert model.config.rope_theta == 8e6
    tok, pos = tokens(), positions("skip")
    want = reference(model, tok, pos)
    got = ours(out, tok, pos, tmp_path)
    assert np.abs(got - want).max() < TOL
    # rsd-model init: a seeded random model transformers loads too.
    init = tmp_path / "init"
    rsd_model("init", "--config", REPO / "configs/model/tiny-llama.json", "--seed", "3",
              "--out", init)
    m = AutoModelForCausalLM.from_pretrained(init, attn_implementation="eager").eval()
    assert m.config.vocab_size == 128256
    small = torch.tensor([[1, 5, 128000, 42]])
    sp = torch.arange(4)[None]
    assert np.abs(ours(init, small, sp, tmp_path) - reference(m, small, sp)).max() < TOL


@pytest.fixture(scope="module")
def good_ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("good")
    build("llama", path)
    return path


def broken(good, tmp, edit_tensors=None, edit_config=None, truncate=False):
    from safetensors.torch import load_file, save_file

    bad = tmp / "bad"
    shutil.copytree(good, bad)
    if edit_tensors:
        t = load_file(bad / "model.safetensors")
        edit_tensors(t)
        save_file(t, bad / "model.safetensors", metadata={"format": "pt"})
    if edit_config:
        c = json.loads((bad / "config.json").read_text())
        edit_config(c)
        (bad / "config.json").write_text(json.dumps(c))
    if truncate:
        data = (bad / "model.safetensors").read_bytes()
        (bad / "model.safetensors").write_bytes(data[: len(data) // 2])
    return bad


@pytest.mark.parametrize("case,expect", [
    ("missing", "missing tensor model.layers.1.mlp.up_proj.weight"),
    ("shape", "shape mismatch for model.layers.0.self_attn.k_proj.weight: checkpoint has [16, 64], model expects [32, 64]"),
    ("unexpected", "unexpected tensor model.layers.0.self_attn.extra.weight"),
    ("architecture", "unsupported architecture"),
    ("truncated", "not a valid safetensors file"),
])
def test_bad_checkpoints_give_named_errors(good_ckpt, tmp_path, case, expect):
    def drop(t):
        del t["model.layers.1.mlp.up_proj.weight"]

    def reshape(t):
        t["model.layers.0.self_attn.k_proj.weight"] = t["model.layers.0.self_attn.k_proj.weight"][:16].clone()

    def extra(t):
        t["model.layers.0.self_attn.extra.weight"] = torch.zeros(3)

    def arch(c):
        c["architectures"] = ["MistralForCausalLM"]
        c["model_type"] = "mistral"

    bad = broken(good_ckpt, tmp_path, **{
        "missing": dict(edit_tensors=drop), "shape": dict(edit_tensors=reshape),
        "unexpected": dict(edit_tensors=extra), "architecture": dict(edit_config=arch),
        "truncated": dict(truncate=True)}[case])
    np.save(tmp_path / "tok.npy", np.zeros((1, 4), dtype=np.int64))
    p = rsd_model("logits", "--model", bad, "--tokens", tmp_path / "tok.npy",
                  "--out", tmp_path / "o.npy", check=False)
    assert p.returncode != 0
    assert expect in p.stderr, p.stderr
    assert "panicked" not in p.stderr, p.stderr


@pytest.mark.parametrize("case,expect", [
    ("rope_theta", "rope_theta = 1e-300 with head_dim"),
    ("nan_weight", "logits are not finite (NaN or ±inf)"),
])
def test_numbers_that_would_give_nan_are_refused_and_nothing_is_written(good_ckpt, tmp_path,
                                                                         case, expect):
    """A config.json whose values are each finite but give RoPE frequencies fp32 cannot hold is
    refused at load, naming rope_theta; weights holding a NaN give NaN logits, which are not
    written as if they were a result."""
    def tiny_theta(c):
        c["rope_theta"] = 1e-300

    def nan_weight(t):
        t["model.norm.weight"][0] = float("nan")

    bad = broken(good_ckpt, tmp_path, **{"rope_theta": dict(edit_config=tiny_theta),
                                          "nan_weight": dict(edit_tensors=nan_weight)}[case])
    np.save(tmp_path / "tok.npy", np.zeros((1, 4), dtype=np.int64))
    p = rsd_model("logits", "--model", bad, "--tokens", tmp_path / "tok.npy",
                  "--out", tmp_path / "o.npy", check=False)
    assert p.returncode != 0 and expect in p.stderr, p.stderr
    assert not (tmp_path / "o.npy").exists()


def test_inspect_reports_the_model(good_ckpt):
    out = rsd_model("inspect", good_ckpt).stdout
    n = sum(int(np.prod(v.shape)) for v in __import__("safetensors.torch").torch.load_file(
        good_ckpt / "model.safetensors").values())
    assert "LlamaForCausalLM" in out and f"parameters       {n} " in out, out
    assert "rope_theta       10000" in out


def test_binary_links_libtorch_cuda():
    """Without libtorch_cuda as NEEDED, --device cuda silently finds no GPU."""
    tl = Path(torch.__file__).parent / "lib"
    out = subprocess.run(["readelf", "-d", exe("rsd-model")], capture_output=True, text=True).stdout
    assert "RUNPATH" in out or "RPATH" in out
    if (tl / "libtorch_cuda.so").exists():
        assert "[libtorch_cuda.so]" in out, out
