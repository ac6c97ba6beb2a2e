"""Context parallelism: 2 processes, each holding its zigzag chunks of every row, compute what one
process computes.

* `rsd-train probe --nproc 2 --cp 2` against the one-process probe on the same batch, fp64: CLM,
  KL, perturbed CLM, total and gradient norm to 1e-10 relative (a "close enough" bug would show
  far above that), every parameter gradient (written as fp32) to 1e-6; for standard, rsd with
  the skip view with s in the first chunk, on a chunk boundary, in the last chunk and s = 0,
  cyclic, forward KL, PoSE, two-view CLM, with checkpointed layers and small loss chunks; Llama
  and Qwen3; one fp32 case to 1e-5. Under context parallelism both views run whole, so the
  one-process run it matches bit for bit is the one without prefix reuse (`--no-prefix-reuse`);
  with prefix reuse it agrees to ~1e-9 (RMSNorm computes in fp32 even in fp64 models, and the
  two orders of operations round differently: see tests/test_train.py).
* `rsd-train --cp 2` trains what one process trains (and what `--nproc 2` data parallelism
  trains), also with the sharded optimizer.
* The same on mixed-length shards with documents crossing the chunk boundaries.
* What is not supported yet (LongCE) is refused with a clear message.

Binaries: $RSD_BIN_DIR (default <repo>/target/debug).
"""
import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from rsd_cli import run

REPO = Path(__file__).resolve().parent.parent
B, L, V = 2, 32, 97   # 2 ranks cut each 32-row sequence into 4 chunks of 8

ARCH = {
    "llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "head_dim": 12,
              "rope_theta": 10000.0, "tie_word_embeddings": False},
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 16,
              "rope_theta": 1e6, "tie_word_embeddings": True},
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("cp")
    rng = np.random.default_rng(0)
    np.save(d / "tokens.npy", rng.integers(0, V, size=(B, L)).astype(np.int64))
    for family, arch in ARCH.items():
        cfg = {**arch, "vocab_size": V, "hidden_size": 48, "intermediate_size": 80,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "initializer_range": 0.2}
        (d / f"{family}.json").write_text(json.dumps(cfg))
    return d


def probe(inputs, family, args, dtype, cp, out):
    grads = out / f"grads-{cp}.safetensors"
    nproc = ["--nproc", 2, "--cp", 2] if cp == 2 else ["--no-prefix-reuse"]
    p = run("rsd-train", "probe", "--init", inputs / f"{family}.json", "--tokens",
            inputs / "tokens.npy", "--dtype", dtype, "--threads", 1, "--grads-out", grads,
            *args, *nproc, timeout=300)
    return json.loads(p.stdout), load_file(grads)


CASES = [
    ("qwen3", ["--objective", "standard"]),
    ("qwen3", ["--objective", "rsd", "--perturb", "skip", "--split", "3,8", "--skip", "50,7"]),
    ("llama", ["--objective", "rsd", "--perturb", "skip", "--split", "16,27", "--skip", "400"]),
    ("qwen3", ["--objective", "rsd", "--perturb", "skip", "--split", "0,24", "--skip", "9",
               "--kl", "forward", "--lambda", "0.5"]),
    ("qwen3", ["--objective", "rsd", "--perturb", "cyclic", "--shift", "5,19"]),
    ("llama", ["--objective", "pose", "--perturb", "skip", "--split", "11", "--skip", "60"]),
    ("qwen3", ["--objective", "two-view-clm", "--perturb", "skip", "--split", "8", "--skip", "30",
               "--checkpoint-layers", "--loss-chunk", 5]),
    ("llama", ["--objective", "rsd", "--perturb", "skip", "--split", "13", "--skip", "100",
               "--checkpoint-layers", "--loss-chunk", 7]),
    # Documents crossing the chunk boundaries (chunks of 8 rows); positions restart per document.
    ("qwen3", ["--objective", "rsd", "--perturb", "skip", "--split", "4,20", "--skip", "40",
               "--docs", "0,5,19,32;0,12,32"]),
]


@pytest.mark.parametrize("family,args", CASES, ids=lambda c: c if isinstance(c, str) else None)
def test_two_context_parallel_ranks_compute_one_process_step(inputs, tmp_path, family, args):
    one, g1 = probe(inputs, family, args, "fp64", 1, tmp_path)
    two, g2 = probe(inputs, family, args, "fp64", 2, tmp_path)
    for k in ("clm", "kl", "clm_pert", "loss", "grad_norm"):
        assert two[k] == pytest.approx(one[k], rel=1e-10, abs=1e-14), (k, one[k], two[k])
    assert one["label_tokens"] == two["label_tokens"] and one["samples"] == two["samples"]
    if "rsd" in args:
        assert one["kl"] > 0
    assert g1.keys() == g2.keys() and len(g1) > 0
    for k in g1:
        scale = max(float(np.abs(g1[k]).max()), 1e-30)
        assert float(np.abs(g1[k] - g2[k]).max()) / scale <= 1e-6, k


def test_fp32_context_parallel_step(inputs, tmp_path):
    args = ["--objective", "rsd", "--perturb", "skip", "--split", "5,20", "--skip", "33"]
    one, g1 = probe(inputs, "qwen3", args, "fp32", 1, tmp_path)
    two, g2 = probe(inputs, "qwen3", args, "fp32", 2, tmp_path)
    for k in ("clm", "kl", "loss", "grad_norm"):
        assert two[k] == pytest.approx(one[k], rel=1e-5, abs=1e-9), (k, one[k], two[k])
    for k in g1:
        scale = max(float(np.abs(g1[k]).max()), 1e-30)
        assert float(np.abs(g1[k] - g2[k]).max()) / scale <= 1e-5, k


def train(shards, out, *extra, steps=3, tokens=256):
    run("rsd-train", "--config", REPO / "configs" / "tiny-cpu.toml", "--shards", shards, "--init",
        REPO / "configs" / "model" / "tiny-qwen3-64.json", "--out", out, "--progress", "false",
        "--threads", 1, "--steps", steps, "--save-every", 0, "--tokens-per-step", tokens, *extra,
        timeout=600)
    recs = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    (f,) = (out / "model").glob("*.safetensors")
    return recs, load_file(f)


def test_training_with_cp_2_trains_what_one_process_trains(shards, tmp_path):
    one, p1 = train(shards, tmp_path / "one")
    cp, pc = train(shards, tmp_path / "cp", "--cp", 2)
    dp, pd = train(shards, tmp_path / "dp", "--nproc", 2)
    sharded, ps = train(shards, tmp_path / "cp-sharded", "--cp", 2, "--shard-optimizer", "true")
    for other in (cp, dp, sharded):
        assert [r["step"] for r in other] == [1, 2, 3]
        for a, b in zip(one, other):
            assert b["loss"] == pytest.approx(a["loss"], rel=1e-6), (a, b)
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5), (a, b)
            assert a["tokens"] == b["tokens"]
    # AdamW's first steps move every parameter by about ±lr whatever the gradient's size, so
    # float rounding in near-zero gradients shows as parameter differences far above it.
    for other in (pc, pd, ps):
        worst = max(float(np.abs(p1[k].astype(np.float64) - other[k]).max()) for k in p1)
        assert worst <= 1e-4, worst
    # Sharding the optimizer over the 2 ranks changes nothing.
    assert all(np.array_equal(pc[k], ps[k]) for k in pc)


def test_cp_2_on_mixed_shards_with_documents_trains_what_one_process_trains(tmp_path):
    # Rows of different lengths, documents crossing the chunk boundaries, a perturbation per
    # document; the one-process run without prefix reuse is the same computation.
    mixed = tmp_path / "mixed"
    run("rsd-data", "pack", "--len", "256", "--mode", "mixed", "--src", REPO / "corpus" / "books",
        "--src", REPO / "corpus" / "code", "--out", mixed)
    batch = ["--micro-batch", 2, "--perturb-scope", "document", "--prefix-reuse", "false"]
    one, _ = train(mixed, tmp_path / "one", *batch, steps=2, tokens=1024)
    cp, _ = train(mixed, tmp_path / "cp", *batch, "--cp", 2, steps=2, tokens=1024)
    for a, b in zip(one, cp):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6), (a, b)
        assert b["kl"] == pytest.approx(a["kl"], rel=0, abs=1e-6 * a["loss"]), (a, b)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5), (a, b)
        assert a["tokens"] == b["tokens"]


def test_what_context_parallelism_does_not_support_yet_is_refused(inputs, tmp_path):
    p = run("rsd-train", "probe", "--init", REPO / "configs" / "model" / "tiny-qwen3-64.json",
            "--tokens", inputs / "tokens.npy", "--objective", "standard", "--cp", 2, check=False)
    assert p.returncode != 0 and "--nproc 2 --cp 2" in p.stderr, p.stderr
    p = run("rsd-train", "probe", "--init", inputs / "qwen3.json", "--tokens",
            inputs / "tokens.npy", "--objective", "standard", "--long-ce-window", 8, "--nproc", 2,
            "--cp", 2, check=False, timeout=120)
    assert p.returncode != 0 and "LongCE under context parallelism" in p.stderr, p.stderr
