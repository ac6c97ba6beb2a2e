"""Context parallelism: 2 processes, each holding its zigzag chunks of every row, compute what one
process computes.

* `rsd-train probe --nproc 2 --cp 2` against the one-process probe on the same batch, fp64: CLM,
  KL, perturbed CLM, total and gradient norm to 1e-10 relative (a "close enough" bug would show
  far above that), every parameter gradient (written as fp32) to 1e-6; for standard, rsd with
  the skip view with s in the first chunk, on a chunk boundary, in the last chunk and s = 0,
  cyclic, forward KL, PoSE, two-view CLM, with checkpointed layers and small loss chunks; Llama
  and Qwen3; one fp32 case to 1e-5. Each case both with prefix reuse (the perturbed suffix
  re-sharded zigzag over the ranks, attending to the standard view's gathered prefix K/V) and
  without (`--no-prefix-reuse`: both views whole), against the one-process run in the same mode
  (the two modes differ by ~1e-9 from each other: RMSNorm computes in fp32 even in fp64 models;
  see tests/test_train.py). With reuse, every rank computes the same number of perturbed
  tokens whatever the split.
* `rsd-train --cp 2` trains what one process trains (and what `--nproc 2` data parallelism
  trains), also with the sharded optimizer.
* The same on mixed-length shards with documents crossing the chunk boundaries.
* LongCE: each rank runs the short-context windows of its own rows (cut at its chunks).
* A probe asking for --cp without the processes is refused with a clear message.

Binaries: $RSD_BIN_DIR (default <repo>/target/debug).
"""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from rsd_cli import fails, run

REPO = Path(__file__).resolve().parent.parent
MINI_TOKENIZER = REPO / "assets" / "tokenizers" / "mini-1k" / "tokenizer.json"
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


def probe(inputs, family, args, dtype, cp, out, reuse=False):
    grads = out / f"grads-{cp}.safetensors"
    nproc = ["--nproc", 2, "--cp", 2] if cp == 2 else []
    mode = [] if reuse else ["--no-prefix-reuse"]
    p = run("rsd-train", "probe", "--init", inputs / f"{family}.json", "--tokens",
            inputs / "tokens.npy", "--dtype", dtype, "--threads", 1, "--grads-out", grads,
            *args, *nproc, *mode, timeout=300)
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
    # LongCE: short-context windows crossing the chunk boundaries, cut per rank.
    ("llama", ["--objective", "standard", "--long-ce-window", 5, "--long-ce-stride", 3]),
    ("qwen3", ["--objective", "rsd", "--perturb", "skip", "--split", "3,20", "--skip", "50,7",
               "--long-ce-window", 6, "--long-ce-stride", 4, "--docs", "0,5,19,32;0,12,32"]),
]


@pytest.mark.parametrize("reuse", [True, False], ids=["reuse", "no-reuse"])
@pytest.mark.parametrize("family,args", CASES, ids=lambda c: c if isinstance(c, str) else None)
def test_two_context_parallel_ranks_compute_one_process_step(inputs, tmp_path, family, args,
                                                             reuse):
    one, g1 = probe(inputs, family, args, "fp64", 1, tmp_path, reuse)
    two, g2 = probe(inputs, family, args, "fp64", 2, tmp_path, reuse)
    for k in ("clm", "kl", "clm_pert", "loss", "grad_norm"):
        assert two[k] == pytest.approx(one[k], rel=1e-10, abs=1e-14), (k, one[k], two[k])
    assert one["label_tokens"] == two["label_tokens"] and one["samples"] == two["samples"]
    if "rsd" in args:
        assert one["kl"] > 0
    assert g1.keys() == g2.keys() and len(g1) > 0
    for k in g1:
        scale = max(float(np.abs(g1[k]).max()), 1e-30)
        assert float(np.abs(g1[k] - g2[k]).max()) / scale <= 1e-6, k
    # The perturbed view's work: one rank alone, two ranks sharing it evenly. With reuse each
    # row's suffix is padded to a multiple of 2 ranks × 2 pieces (at most 3 rows a row).
    (alone,) = one["perturbed_tokens_per_rank"]
    per_rank = two["perturbed_tokens_per_rank"]
    assert len(per_rank) == 2 and alone == one["perturbed_tokens"]
    if reuse and "--split" in args and "pose" not in args:
        assert per_rank[0] == per_rank[1], per_rank
        assert alone <= sum(per_rank) <= alone + 3 * B, (alone, per_rank)
        flops = two["perturbed_flops_per_rank"]
        assert flops[0] == flops[1] > 0, flops
    elif alone:
        # Both views whole: every row's chunks on every rank.
        assert per_rank == [B * L // 2] * 2, per_rank


def test_perturbed_work_is_balanced_for_every_split(inputs, tmp_path):
    # The balance figure: every s in 0..L−1 on one row; per-rank matmul FLOPs of the perturbed
    # pass equal (suffix re-sharded zigzag), where the standard view's zigzag chunks would give
    # one rank all of a late suffix.
    for s in range(0, L, 3):
        p = run("rsd-train", "probe", "--init", inputs / "qwen3.json", "--tokens",
                inputs / "tokens.npy", "--threads", 1, "--objective", "rsd", "--perturb", "skip",
                "--split", s, "--skip", 5, "--nproc", 2, "--cp", 2, timeout=300)
        two = json.loads(p.stdout)
        t, f = two["perturbed_tokens_per_rank"], two["perturbed_flops_per_rank"]
        if s == 0:
            assert t == [0, 0]   # nothing changes: no perturbed pass at all
            continue
        assert t[0] == t[1] and f[0] == f[1] > 0, (s, t, f)


def test_fp32_context_parallel_step(inputs, tmp_path):
    args = ["--objective", "rsd", "--perturb", "skip", "--split", "5,20", "--skip", "33"]
    one, g1 = probe(inputs, "qwen3", args, "fp32", 1, tmp_path, reuse=True)
    two, g2 = probe(inputs, "qwen3", args, "fp32", 2, tmp_path, reuse=True)
    for k in ("clm", "kl", "loss", "grad_norm"):
        assert two[k] == pytest.approx(one[k], rel=1e-5, abs=1e-9), (k, one[k], two[k])
    for k in g1:
        scale = max(float(np.abs(g1[k]).max()), 1e-30)
        assert float(np.abs(g1[k] - g2[k]).max()) / scale <= 1e-5, k


@pytest.fixture(scope="module")
def shards(mini_shards):
    """These tests compare runs with each other: the small vocabulary's shards (conftest)."""
    return mini_shards


def train(shards, out, *extra, steps=3, tokens=256):
    run("rsd-train", "--config", REPO / "configs" / "tiny-cpu.toml", "--shards", shards, "--init",
        shards.parent / "tiny-1k.json", "--out", out, "--progress", "false",
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
    # Sharding the optimizer (ZeRO-2) over the 2 ranks sums the same gradients in another order.
    worst = max(float(np.abs(pc[k].astype(np.float64) - ps[k]).max()) for k in pc)
    assert worst <= 1e-4, worst


def test_cp_2_on_mixed_shards_with_documents_trains_what_one_process_trains(mini_shards, tmp_path):
    # Rows of different lengths, documents crossing the chunk boundaries, a perturbation per
    # document, the perturbed suffix re-sharded over the ranks (prefix reuse).
    mixed = tmp_path / "mixed"
    run("rsd-data", "pack", "--len", "256", "--mode", "mixed", "--src", REPO / "corpus" / "books",
        "--src", REPO / "corpus" / "code", "--out", mixed, "--tokenizer", MINI_TOKENIZER)
    shutil.copy(mini_shards.parent / "tiny-1k.json", tmp_path / "tiny-1k.json")
    batch = ["--micro-batch", 2, "--perturb-scope", "document", "--prefix-reuse", "true"]
    one, _ = train(mixed, tmp_path / "one", *batch, steps=2, tokens=1024)
    cp, _ = train(mixed, tmp_path / "cp", *batch, "--cp", 2, steps=2, tokens=1024)
    for a, b in zip(one, cp):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6), (a, b)
        assert b["kl"] == pytest.approx(a["kl"], rel=0, abs=1e-6 * a["loss"]), (a, b)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5), (a, b)
        assert a["tokens"] == b["tokens"]


def test_a_context_parallel_probe_without_its_processes_is_refused(inputs, tmp_path):
    p = run("rsd-train", "probe", "--init", REPO / "configs" / "model" / "tiny-qwen3-64.json",
            "--tokens", inputs / "tokens.npy", "--objective", "standard", "--cp", 2, check=False)
    assert p.returncode != 0 and "--nproc 2 --cp 2" in p.stderr, p.stderr


# ---- The dp × cp matrix, fp64 ----
#
# With fp64, AdamW's eps = lr = 1e6 and neither weight decay nor clipping, one step moves every
# parameter by −lr·g/(|g| + eps) ≈ −g: the parameters after the step carry the step's gradient to
# fp64 precision, so comparing them (minus the initial ones) compares every parameter gradient.

MATRIX_MODEL = {**ARCH["qwen3"], "vocab_size": 1024, "bos_token_id": 0, "eos_token_id": 0,
                "hidden_size": 32,
                "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 4096,
                "rms_norm_eps": 1e-6, "initializer_range": 0.05}


@pytest.fixture(scope="module")
def matrix_init(tmp_path_factory):
    p = tmp_path_factory.mktemp("matrix") / "model.json"
    p.write_text(json.dumps(MATRIX_MODEL))
    return p


def exact_step(shards, init, out, *extra, lr=1e6, tokens=512):
    # lr 1e6 with eps 1e6: AdamW's first update is ≈ −gradient; lr 1e-300 (lr must be > 0):
    # an update that rounds to nothing, i.e. the initial parameters.
    run("rsd-train", "--config", REPO / "configs" / "tiny-cpu.toml", "--shards", shards,
        "--init", init, "--out", out, "--progress", "false", "--threads", 1, "--steps", 1,
        "--save-every", 0, "--tokens-per-step", tokens, "--dtype", "fp64", "--lr", lr,
        "--eps", 1e6, "--weight-decay", 0, "--clip", 0, "--warmup-ratio", 0, *extra,
        timeout=600)
    recs = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    (f,) = (out / "model").glob("*.safetensors")
    return recs, load_file(f)


def assert_same_gradients(p0, a, b):
    """Every parameter's update (≈ its gradient) within 1e-10 relative."""
    assert a.keys() == b.keys() == p0.keys()
    for k in a:
        da, db = p0[k] - a[k], p0[k] - b[k]
        scale = float(np.abs(da).max())
        assert scale > 0, k
        assert float(np.abs(da - db).max()) <= 1e-10 * scale, (k, float(np.abs(da - db).max()),
                                                                scale)


@pytest.mark.parametrize("objective", ["standard", "rsd"])
def test_dp_2_by_cp_2_computes_the_one_process_step_in_fp64(shards, matrix_init, tmp_path,
                                                              objective):
    _, p0 = exact_step(shards, matrix_init, tmp_path / "init", lr=1e-300)
    args = ["--objective", objective]
    one, p1 = exact_step(shards, matrix_init, tmp_path / "one", *args)
    four, p4 = exact_step(shards, matrix_init, tmp_path / "four", *args, "--dp", 2, "--cp", 2)
    assert_same_gradients(p0, p1, p4)
    (a,), (b,) = one, four
    for k in ("loss", "clm", "kl", "grad_norm"):
        assert b[k] == pytest.approx(a[k], rel=1e-10, abs=1e-14), (k, a[k], b[k])
    if objective == "rsd":
        assert a["kl"] > 0
    assert a["tokens"] == b["tokens"] == 512
    assert a["comm_bytes"] == 0 < b["comm_bytes"]


def test_held_out_evaluation_under_context_parallelism_is_refused_before_any_rank_starts(
        shards, matrix_init, tmp_path):
    # Held-out rows are not split over a context-parallel group: one rank would hold whole rows
    # (256K tokens at the paper's setting) while the others wait under the collective timeout.
    out = tmp_path / "run"
    p = fails("rsd-train", "--config", REPO / "configs" / "tiny-cpu.toml", "--shards", shards,
              "--init", matrix_init, "--out", out, "--steps", 1, "--cp", 2, "--heldout-every", 1,
              "--heldout-shards", shards, timeout=120)
    assert "heldout_every = 1 with cp = 2" in p.stderr, p.stderr
    assert "rsd-eval" in p.stderr and "[rank" not in p.stderr, p.stderr
    assert not out.exists() or not (out / "metrics.jsonl").exists()


def test_a_length_2cp_does_not_divide_is_padded_and_trains_the_one_process_step(matrix_init,
                                                                               tmp_path):
    # 126-token rows: cp = 2 cuts rows into 4 chunks, so each row is padded to 128; the padding
    # has no labels and comes after every real token, and the logged tokens leave it out.
    odd = tmp_path / "odd"
    run("rsd-data", "pack", "--len", "126", "--src", REPO / "corpus" / "books", "--out", odd,
        "--tokenizer", MINI_TOKENIZER)
    _, p0 = exact_step(odd, matrix_init, tmp_path / "init", lr=1e-300, tokens=504)
    one, p1 = exact_step(odd, matrix_init, tmp_path / "one", tokens=504)
    cp, pc = exact_step(odd, matrix_init, tmp_path / "cp", "--cp", 2, tokens=504)
    assert_same_gradients(p0, p1, pc)
    (a,), (b,) = one, cp
    for k in ("loss", "clm", "kl", "grad_norm"):
        assert b[k] == pytest.approx(a[k], rel=1e-10, abs=1e-14), (k, a[k], b[k])
    assert a["tokens"] == b["tokens"] == 504


@pytest.mark.parametrize("family,args", [CASES[0], CASES[1]], ids=["standard", "rsd"])
def test_four_context_parallel_ranks_compute_one_process_step(inputs, tmp_path, family, args):
    # 32-row sequences over 4 ranks: 8 chunks of 4 rows.
    one, g1 = probe(inputs, family, args, "fp64", 1, tmp_path, reuse=True)
    grads = tmp_path / "grads-4.safetensors"
    p = run("rsd-train", "probe", "--init", inputs / f"{family}.json", "--tokens",
            inputs / "tokens.npy", "--dtype", "fp64", "--threads", 1, "--grads-out", grads,
            *args, "--nproc", 4, "--cp", 4, timeout=300)
    four, g4 = json.loads(p.stdout), load_file(grads)
    for k in ("clm", "kl", "clm_pert", "loss", "grad_norm"):
        assert four[k] == pytest.approx(one[k], rel=1e-10, abs=1e-14), (k, one[k], four[k])
    assert len(four["perturbed_tokens_per_rank"]) == 4
    for k in g1:
        scale = max(float(np.abs(g1[k]).max()), 1e-30)
        assert float(np.abs(g1[k] - g4[k]).max()) / scale <= 1e-6, k


def test_a_layout_the_world_does_not_fit_is_refused_naming_the_flags(inputs, tmp_path):
    # 3 processes cannot be context-parallel groups of 2.
    p = run("rsd-train", "probe", "--init", inputs / "qwen3.json", "--tokens",
            inputs / "tokens.npy", "--objective", "standard", "--nproc", 3, "--cp", 2,
            check=False, timeout=300)
    assert p.returncode != 0 and "--cp 2" in p.stderr and "3 processes" in p.stderr, p.stderr


def test_a_dp2_by_cp2_checkpoint_resumes_as_dp1_by_cp2_and_dp4_by_cp1(shards, tmp_path):
    """A sharded checkpoint written by 4 ranks as dp 2 × cp 2 resumes under another layout of
    data and context parallelism, and the resumed run trains what one process trains from the
    start, to fp64 rounding: the optimizer blocks re-sharded, the loader position and schedule
    the same whatever the layout."""
    common = ["--dtype", "fp64", "--shard-optimizer", "true", "--micro-batch", 1]

    def metrics_and_params(out, *extra, steps=4):
        return train(shards, out, *common, *extra, steps=steps, tokens=512)

    ref, p_ref = metrics_and_params(tmp_path / "one")
    run("rsd-train", "--config", REPO / "configs" / "tiny-cpu.toml", "--shards", shards, "--init",
        shards.parent / "tiny-1k.json", "--out", tmp_path / "first", "--progress", "false",
        "--threads", 1, "--steps", 4, "--save-every", 0, "--tokens-per-step", 512, *common,
        "--dp", 2, "--cp", 2, "--stop-at", 2, timeout=600)
    for layout in (["--dp", 1, "--cp", 2], ["--dp", 4, "--cp", 1]):
        name = f"dp{layout[1]}xcp{layout[3]}"
        shutil.copytree(tmp_path / "first", tmp_path / name)
        change = ["--allow-change", "dp,cp"]
        got, p_got = metrics_and_params(tmp_path / name, *layout, *change, "--resume", "auto")
        assert [r["step"] for r in got] == [1, 2, 3, 4], name
        for a, b in zip(ref, got):
            for k in ("loss", "clm", "kl", "grad_norm"):
                assert b[k] == pytest.approx(a[k], rel=1e-10, abs=1e-14), (name, k, a, b)
            assert a["tokens"] == b["tokens"], name
        worst = max(float(np.abs(p_ref[k] - p_got[k]).max() / max(np.abs(p_ref[k]).max(), 1e-300))
                    for k in p_ref)
        assert worst <= 1e-10, (name, worst)
