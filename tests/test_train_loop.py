"""rsd-train's training loop on real packed data (the bundled corpus, Qwen3 tokenizer).

* the loss of a tiny Qwen3 (real 151,669-token vocabulary, 2 layers, 64 wide) decreases;
  (the tests that only compare runs with runs use the 1,024-token vocabulary of conftest's
  mini_shards, ~10× faster);
* N steps + resume + N steps gives exactly the losses and gradient norms of 2N steps;
* Ctrl-C writes a checkpoint and exits 130, and the run resumes from it;
* a NaN gradient stops the run with a clear message and leaves the last good checkpoint alone,
  or skips the update with on_nonfinite = "skip";
* the final model directory loads in transformers;
* with heldout_every, the held-out slice's CLM and view gap are logged at those steps and equal
  `rsd-train probe` on the saved model, the same rows and the same view.

Binaries: $RSD_BIN_DIR (default <repo>/target/debug): rsd-data and rsd-train.
"""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rsd_cli import exe, run

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "configs" / "model" / "tiny-qwen3-64.json"


def train_args(shards, out, *extra):
    # The small vocabulary's shards (conftest's mini_shards) come with the tiny model's config at
    # that vocabulary; Qwen3's shards train the tiny model at Qwen3's.
    small = shards.parent / "tiny-1k.json"
    init = small if small.exists() else TINY
    return ["--config", REPO / "configs" / "tiny-cpu.toml", "--shards", shards, "--init", init,
            "--out", out, "--progress", "false", "--threads", "2", *extra]


def train(shards, out, *extra, check=True, env=None):
    return run("rsd-train", *train_args(shards, out, *extra), check=check, env=env)


def metrics(out):
    return [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]


def test_loss_decreases_and_model_loads_in_transformers(shards, tmp_path):
    out = tmp_path / "run"
    train(shards, out, "--steps", 10, "--lr", 5e-3)
    m = metrics(out)
    assert len(m) == 10 and all(r["kl"] >= 0 and r["tokens"] == 128 for r in m)
    assert m[0]["loss"] > 11.5  # ≈ ln(151669) at init
    assert sum(r["loss"] for r in m[-3:]) / 3 < m[0]["loss"] - 0.5, [r["loss"] for r in m]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 10 and not summary["interrupted"]
    from transformers import AutoModelForCausalLM
    import torch

    model = AutoModelForCausalLM.from_pretrained(out / "model")
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()
    # A model trained from `init` carries the shards' tokenizer, in the final model and in every
    # checkpoint: transformers loads it and encodes as the tokenizer the shards were packed with.
    from transformers import AutoTokenizer
    from tokenizers import Tokenizer

    text = "Call me Ishmael. Some years ago <|endoftext|> 東京 🚀"
    packed_with = Tokenizer.from_file(str(shards / "tokenizer.json"))
    for d in [out / "model", *sorted((out / "checkpoints").iterdir())]:
        model_dir = d if d.name == "model" else d / "model"
        tok = AutoTokenizer.from_pretrained(model_dir)
        assert tok.encode(text, add_special_tokens=False) == packed_with.encode(text, add_special_tokens=False).ids
        assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 151643


def test_resume_is_exact(mini_shards, tmp_path):
    shards = mini_shards  # runs compared with runs: the small vocabulary
    a, b = tmp_path / "a", tmp_path / "b"
    common = ("--steps", 6, "--lr", 5e-3, "--tokens-per-step", 256, "--save-every", 2, "--keep", 2)
    train(shards, a, *common)
    train(shards, b, *common, "--stop-at", 3)
    ck = sorted(p.name for p in (b / "checkpoints").iterdir())
    assert ck == ["step-00000002", "step-00000003"], ck  # last K kept, stop writes one
    train(shards, b, *common, "--resume")
    ma, mb = metrics(a), metrics(b)
    assert [r["step"] for r in mb] == [1, 2, 3, 4, 5, 6]
    for x, y in zip(ma, mb):
        for k in ("loss", "clm", "kl", "grad_norm", "lr"):
            assert x[k] == y[k], (x["step"], k, x[k], y[k])
    assert ma[0]["tokens"] == 256  # two micro-batches of one 128-token row


def test_resume_restores_the_runs_config_and_refuses_changes_it_is_not_told_of(mini_shards, tmp_path):
    shards = mini_shards  # runs compared with runs: the small vocabulary
    import tomllib

    out = tmp_path / "run"
    train(shards, out, "--steps", 3, "--lambda", 0.5, "--lr", 5e-3, "--stop-at", 1)
    # Only the run directory: λ, the steps and the data come from the checkpoint (a config file
    # or the defaults would say λ 1, 200 steps); stop_at belongs to the first invocation.
    p = run("rsd-train", "--out", out, "--resume")
    assert re.search(r"resuming from \S*step-00000001 \(step 1 of 3\) with the run's config "
                     r"\(\S*config.toml\), unchanged", p.stderr), p.stderr
    assert [r["step"] for r in metrics(out)] == [1, 2, 3]
    last = sorted((out / "checkpoints").iterdir())[-1]
    saved = tomllib.loads((last / "config.toml").read_text())
    assert (saved["lambda"], saved["steps"], saved["shards"]) == (0.5, 3, str(shards)), saved
    # A change of what the run computes is refused, naming each key, its source and the flag...
    config = REPO / "configs" / "tiny-cpu.toml"
    p = run("rsd-train", "--config", config, "--out", out, "--resume", "--objective", "standard",
            check=False)
    assert p.returncode == 1 and "the command changes the run" in p.stderr, p.stderr
    assert 'objective: "rsd" → "standard" (--objective)' in p.stderr, p.stderr
    assert f"lambda: 0.5 → 1.0 ({config})" in p.stderr and f"steps: 3 → 200 ({config})" in p.stderr
    # The config file names its own data, model and schedule: each a change, named.
    assert "--allow-change shards,init,objective,lambda,steps,lr" in p.stderr, p.stderr
    assert "seed" not in p.stderr and len(metrics(out)) == 3
    # ... the seed never changes, and what is named changes, reported.
    p = run("rsd-train", "--out", out, "--resume", "--seed", 5, "--allow-change", "seed",
            check=False)
    assert p.returncode == 1 and "seed: 0 → 5 (--seed): cannot change on resume" in p.stderr
    p = run("rsd-train", "--out", out, "--resume", "--objective", "standard", "--steps", 4,
            "--save-every", 2, "--allow-change", "objective,steps")
    for line in ['objective: "rsd" → "standard" (--objective)', "steps: 3 → 4 (--steps)",
                 "save_every: 50 → 2 (--save-every)"]:
        assert line in p.stderr, p.stderr
    assert [r["step"] for r in metrics(out)] == [1, 2, 3, 4]
    assert metrics(out)[-1]["lr"] != metrics(out)[-2]["lr"]


def test_a_used_out_is_refused_overwritten_or_continued_never_mixed(mini_shards, tmp_path):
    shards = mini_shards  # runs compared with runs: the small vocabulary
    out, other = tmp_path / "run", tmp_path / "other"
    common = ("--steps", 3, "--lr", 5e-3, "--save-every", 1, "--keep", 5)
    train(shards, out, *common)
    before = {p.name: p.stat().st_mtime_ns for p in (out / "checkpoints").iterdir()}
    # A new run into it, or another run's checkpoint branched into it: refused, nothing touched.
    train(shards, other, *common)
    branch = ("--resume", other / "checkpoints" / "step-00000002", "--allow-change", "out")
    for extra in [(), branch]:
        p = train(shards, out, *common, *extra, check=False)
        assert p.returncode != 0 and "already holds a run" in p.stderr, p.stderr
        assert "--overwrite" in p.stderr and "--resume auto" in p.stderr, p.stderr
        assert {p.name: p.stat().st_mtime_ns for p in (out / "checkpoints").iterdir()} == before
        assert [r["step"] for r in metrics(out)] == [1, 2, 3]
    # --overwrite: a new run with its own log and checkpoints only.
    train(shards, out, "--steps", 2, "--lr", 5e-3, "--save-every", 1, "--overwrite")
    assert [r["step"] for r in metrics(out)] == [1, 2]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000001", "step-00000002"]
    # Continued from its own checkpoint (step 2) with a log that ran ahead of it (a run killed
    # after logging steps 3 and 4): every step is logged once.
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 3}\n{"step": 4}\n')
    train(shards, out, "--steps", 4, "--lr", 5e-3, "--save-every", 1, "--resume", "auto",
          "--allow-change", "steps")
    steps = [r["step"] for r in metrics(out)]
    assert steps == [1, 2, 3, 4] and "loss" in metrics(out)[2], steps
    # `--resume auto` with no checkpoint and only a partial log (a job restarted before its first
    # checkpoint): a fresh start whose log holds only its own steps.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "metrics.jsonl").write_text('{"step": 1}\n')
    train(shards, fresh, "--steps", 2, "--lr", 5e-3, "--resume", "auto")
    assert [r["step"] for r in metrics(fresh)] == [1, 2] and "loss" in metrics(fresh)[0]


def test_ctrl_c_checkpoints_and_resumes(mini_shards, tmp_path):
    shards = mini_shards  # runs compared with runs: the small vocabulary
    out = tmp_path / "run"
    # The run holds before step 2 (a fault hook) until the signal comes, so it is still running
    # when it does, however fast the machine; the deadline only guards against a hang.
    p = subprocess.Popen([exe("rsd-train"), *map(str, train_args(shards, out, "--steps", 1000))],
                         env={**os.environ, "RSD_TRAIN_FAULT_HOLD_AT": f"2:{tmp_path / 'never'}"},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not ((out / "metrics.jsonl").exists()
               and (out / "metrics.jsonl").read_text().count("\n") >= 1):
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 130, err
    done = len(metrics(out))
    ck = sorted((out / "checkpoints").iterdir())
    assert ck and ck[-1].name == f"step-{done:08d}", (ck, done)
    assert json.loads((ck[-1] / "state.json").read_text())["step"] == done
    train(shards, out, "--steps", done + 1, "--allow-change", "steps", "--resume")
    assert len(metrics(out)) == done + 1


def test_nonfinite_gradient_stops_or_skips(mini_shards, tmp_path):
    shards = mini_shards  # runs compared with runs: the small vocabulary
    out = tmp_path / "stop"
    p = train(shards, out, "--steps", 4, "--save-every", 1, check=False,
              env={"RSD_TRAIN_FAULT_NAN_AT_STEP": "3"})
    assert p.returncode == 1 and "non-finite gradient norm at step 3" in p.stderr, p.stderr
    ck = sorted(x.name for x in (out / "checkpoints").iterdir())
    assert ck == ["step-00000001", "step-00000002"]
    out = tmp_path / "skip"
    train(shards, out, "--steps", 4, "--on-nonfinite", "skip",
          env={"RSD_TRAIN_FAULT_NAN_AT_STEP": "3"})
    m = metrics(out)
    assert [r["skipped"] for r in m] == [False, False, True, False]
    assert json.loads((out / "summary.json").read_text())["skipped"] == 1


def test_config_errors_name_the_key(shards, tmp_path):
    p = train(shards, tmp_path / "x", "--on-nonfinite", "maybe", check=False)
    assert p.returncode == 1 and "on_nonfinite" in p.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text('lr = 1e-3\nlearning_rat = 2\n')
    p = run("rsd-train", "--config", bad, "--init", TINY, "--out", tmp_path / "y", check=False)
    assert p.returncode == 1 and "learning_rat" in p.stderr


@pytest.mark.parametrize("cfg", sorted((REPO / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_configs_resolve_and_flags_override(cfg):
    p = run("rsd-train", "--config", cfg, "--lambda", "0.5", "--print-config")
    assert "lambda = 0.5" in p.stdout and "beta2 = 0.95" in p.stdout


def test_mixed_shards_train_document_masked_with_document_scope(tmp_path):
    """Mixed-length shards (documents kept whole, attention masked per document) through the whole
    loop: token-budget batches, KL only where a document's two views differ."""
    mixed = tmp_path / "mixed"
    run("rsd-data", "pack", "--len", "256", "--mode", "mixed", "--src", REPO / "corpus" / "books",
        "--src", REPO / "corpus" / "code", "--out", mixed)
    manifest = json.loads((mixed / "index.json").read_text())
    assert manifest["mode"] == "mixed"
    for scope in ("document", "sequence"):
        out = tmp_path / scope
        train(mixed, out, "--steps", 8, "--lr", 5e-3, "--perturb-scope", scope)
        m = metrics(out)
        assert len(m) == 8
        assert all(r["kl"] >= 0 and r["loss"] == r["loss"] for r in m), m  # no NaN
        assert any(r["kl"] > 0 for r in m), "no step had a KL term"
        assert sum(r["loss"] for r in m[-3:]) / 3 < m[0]["loss"] - 0.3, [r["loss"] for r in m]


def test_long_ce_trains_and_bad_settings_are_named(shards, tmp_path):
    out = tmp_path / "longce"
    train(shards, out, "--steps", 4, "--lr", 5e-3, "--long-ce-window", 32, "--long-ce-stride", 16)
    m = metrics(out)
    assert len(m) == 4 and all(r["loss"] == r["loss"] and r["clm"] > 0 for r in m), m
    # The sliding windows really reweight the first step's CLM (same init, same batch).
    plain = tmp_path / "plain"
    train(shards, plain, "--steps", 1, "--lr", 5e-3)
    assert abs(metrics(plain)[0]["clm"] - m[0]["clm"]) > 1e-4, (metrics(plain)[0], m[0])
    cfg = run("rsd-train", *train_args(shards, tmp_path / "cfg", "--long-ce-window", 4096, "--print-config")).stdout
    assert "long_ce_stride = 1024" in cfg, cfg  # the paper's stride by default
    p = train(shards, tmp_path / "bad3", "--steps", 1, "--long-ce-window", 32, "--long-ce-stride", 0, check=False)
    assert p.returncode != 0 and "long_ce_stride" in p.stderr, p.stderr
    p = train(shards, tmp_path / "bad", "--steps", 1, "--objective", "pose", "--long-ce-window", 32, check=False)
    assert p.returncode != 0 and "long_ce_window" in p.stderr, p.stderr
    p = train(shards, tmp_path / "bad2", "--steps", 1, "--long-ce-window", 32, "--long-ce-gamma", 0, check=False)
    assert p.returncode != 0 and "long_ce_gamma" in p.stderr, p.stderr


LLAMA3 = Path(os.environ.get("RSD_ASSETS", Path.home() / ".cache/rsd/assets")) / "llama3-tokenizer.json"


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def train_from(model, shards, out, *extra, check=True):
    """Train from a model directory (or, with model = an init config, from a random model)."""
    start = ["--init", model, "--model", ""] if str(model).endswith(".json") else ["--init", "", "--model", model]
    return run("rsd-train", "--config", REPO / "configs" / "tiny-cpu.toml", "--shards", shards, *start,
               "--out", out, "--progress", "false", "--threads", "2", *extra, check=check)


@pytest.mark.skipif(not LLAMA3.exists(), reason="the Llama-3 tokenizer is fetched by scripts/setup.sh")
def test_shards_of_another_tokenizer_are_refused_before_anything_is_written(shards, tmp_path):
    # A model directory with Qwen3's tokenizer (a tiny model trained from init on Qwen3 shards).
    base = tmp_path / "base"
    train(shards, base, "--steps", 1)
    model = base / "model"
    # The same books packed with Llama-3's tokenizer: ids the Qwen3 model would misread.
    llama = tmp_path / "llama-shards"
    run("rsd-data", "pack", "--len", "128", "--src", REPO / "corpus" / "books", "--tokenizer", LLAMA3,
        "--out", llama)
    out = tmp_path / "refused"
    p = train_from(model, llama, out, check=False)
    assert p.returncode == 1
    err = p.stderr
    assert str(llama / "index.json") in err and "tokenizer.sha256" in err, err
    assert sha256(LLAMA3) in err and sha256(model / "tokenizer.json") in err, err
    assert str(model / "tokenizer.json") in err and "--allow-tokenizer-mismatch" in err, err
    assert not out.exists(), "nothing is written before the refusal"
    # Allowed: it trains, with a warning naming the same.
    p = train_from(model, llama, out, "--steps", 1, "--allow-tokenizer-mismatch")
    assert "warning" in p.stderr and sha256(LLAMA3) in p.stderr
    # The saved model carries the starting model's tokenizer files.
    for f in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / "model" / f).read_bytes() == (model / f).read_bytes()

    # A random init has no tokenizer: only the vocabulary sizes are compared.
    out = tmp_path / "small-vocab"
    p = train_from(REPO / "configs" / "model" / "tiny-llama.json", shards, out, check=False)
    assert p.returncode == 1
    assert str(shards / "index.json") in p.stderr and "tokenizer.vocab_size is 151669" in p.stderr, p.stderr
    assert "tiny-llama.json: vocab_size is 128256" in p.stderr and not out.exists()

    # The same tokenizer written differently (another copy of Qwen3's tokenizer.json) matches.
    other = tmp_path / "reformatted"
    shutil.copytree(model, other)
    tok = json.loads((other / "tokenizer.json").read_text())
    (other / "tokenizer.json").write_text(json.dumps(tok, indent=1, ensure_ascii=False))
    assert sha256(other / "tokenizer.json") != sha256(shards / "tokenizer.json")
    train_from(other, shards, tmp_path / "same", "--steps", 1)

    # Everywhere else shards meet the model, the same check and the same override: held-out
    # shards in training, rsd-eval ppl, and a haystack of shards in rsd-eval run.
    out = tmp_path / "heldout"
    p = train_from(model, shards, out, "--steps", 1, "--heldout-every", 1, "--heldout-shards",
                   llama, check=False)
    assert p.returncode == 1 and str(llama / "index.json") in p.stderr, p.stderr
    assert "tokenizer.sha256" in p.stderr and not out.exists(), p.stderr
    ppl = ["ppl", "--model", model, "--shards", llama, "--batches", 1, "--out", tmp_path / "ppl"]
    p = run("rsd-eval", *ppl, check=False)
    assert p.returncode == 1 and str(llama / "index.json") in p.stderr, p.stderr
    assert "--allow-tokenizer-mismatch" in p.stderr and not (tmp_path / "ppl").exists(), p.stderr
    p = run("rsd-eval", *ppl, "--allow-tokenizer-mismatch")
    assert "warning" in p.stderr and sha256(LLAMA3) in p.stderr, p.stderr
    hay = ["run", "--model", model, "--haystack", llama, "--tasks", "niah_single_1", "--lengths",
           256, "--depths", 1, "--samples", 1, "--max-new-tokens", 4, "--out", tmp_path / "eval"]
    p = run("rsd-eval", *hay, check=False)
    assert p.returncode == 1 and str(llama / "index.json") in p.stderr, p.stderr
    assert "--allow-tokenizer-mismatch" in p.stderr and not (tmp_path / "eval").exists(), p.stderr


def test_heldout_clm_and_view_gap_equal_the_probe_on_the_saved_model(shards, tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    import numpy as np

    held = tmp_path / "held"
    run("rsd-data", "pack", "--len", "128", "--src", REPO / "corpus" / "code", "--out", held)
    out = tmp_path / "run"
    # A fixed view (s = 40, y = 300) so the probe can ask for the same one; rows without
    # document masking so the probe's plain rows are the trainer's.
    train(shards, out, "--steps", 4, "--heldout-every", 2, "--heldout-shards", held,
          "--heldout-batches", 2, "--fixed-split", "40,300", "--doc-mask", "false")
    recs = metrics(out)
    assert [r["step"] for r in recs if "view_gap" in r] == [2, 4]
    assert all("heldout_clm" not in r for r in recs if r["step"] in (1, 3))
    last = recs[-1]
    assert last["heldout_clm"] > 0 and last["view_gap"] > 0
    # The slice is the held-out shards' first 2 samples (micro_batch = 1, read in order).
    manifest = json.loads((held / "index.json").read_text())
    ds = IndexedDataset(str(held / manifest["shards"][0]["prefix"]))
    docs = ds.document_indices
    rows = [np.concatenate([np.asarray(ds[i], dtype=np.int64) for i in range(docs[k], docs[k + 1])])
            for k in range(2)]
    np.save(tmp_path / "held.npy", np.stack(rows))
    p = run("rsd-train", "probe", "--model", out / "model", "--tokens", tmp_path / "held.npy",
            "--objective", "rsd", "--perturb", "skip", "--split", 40, "--skip", 300,
            "--threads", 2)
    probe = json.loads(p.stdout)
    assert probe["clm"] == pytest.approx(last["heldout_clm"], rel=1e-5)
    assert probe["kl"] == pytest.approx(last["view_gap"], rel=1e-4)
    # Without heldout_shards the key is refused, naming both.
    p = train(shards, tmp_path / "bad", "--steps", 1, "--heldout-every", 1, check=False)
    assert p.returncode != 0 and "heldout_every" in p.stderr and "heldout_shards" in p.stderr


def test_an_evaluation_records_which_run_seed_and_step_its_model_came_from(shards, tmp_path):
    """rsd-train saves its training record with the model (rsd_training.json: seed, steps,
    objective, what it started from) and every checkpoint's model; rsd-eval score copies it into
    run.json with the sha256 of the weights and the model's RoPE base."""
    out = tmp_path / "run"
    train(shards, out, "--steps", 2, "--seed", 5)
    record = json.loads((out / "model" / "rsd_training.json").read_text())
    assert (record["seed"], record["steps"], record["objective"]) == (5, 2, "rsd"), record
    assert (record["init_seed"], record["started_from"]) == (0, None), record
    (ckpt,) = (out / "checkpoints").iterdir()
    assert json.loads((ckpt / "model" / "rsd_training.json").read_text())["steps"] == 2
    # A run from that model records the model's own record (and so its seeds), not an init seed.
    nxt = tmp_path / "next"
    args = train_args(shards, nxt, "--steps", 1, "--seed", 6, "--model", out / "model")
    at = args.index("--init")
    run("rsd-train", *args[:at], *args[at + 2:])
    child = json.loads((nxt / "model" / "rsd_training.json").read_text())
    assert (child["seed"], child["init_seed"], child["started_from"]) == (6, None, record), child
    # And the weights it started from by their digest (the path alone could name other weights
    # later), computed as rsd-eval's run.json computes it (checked below).
    digests = b"".join(hashlib.sha256(f.read_bytes()).hexdigest().encode()
                       for f in sorted((out / "model").glob("*.safetensors")))
    assert child["started_from_weights_sha256"] == hashlib.sha256(digests).hexdigest(), child
    assert record["started_from_weights_sha256"] is None, record
    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps({"context": "The answer is", "candidates": [" yes", " no"],
                                 "answer": " yes"}) + "\n")
    ev = tmp_path / "eval"
    run("rsd-eval", "score", "--model", out / "model", "--items", items, "--out", ev, "--quiet")
    got = json.loads((ev / "run.json").read_text())["model_provenance"]
    digests = b"".join(hashlib.sha256(f.read_bytes()).hexdigest().encode()
                       for f in sorted((out / "model").glob("*.safetensors")))
    assert got["weights_sha256"] == hashlib.sha256(digests).hexdigest()
    assert got["training"] == record
    assert got["rope_theta"] == json.loads((out / "model" / "config.json").read_text())["rope_theta"]


@pytest.mark.parametrize("key,value", [
    ("tokens-per-step", 2 ** 62), ("micro-batch", 2 ** 40), ("steps", 2 ** 50),
    ("loader-workers", 10 ** 6), ("heldout-batches", 2 ** 30), ("save-every", 2 ** 63),
])
def test_counts_a_config_derives_sizes_from_are_bounded_naming_the_key(shards, tmp_path, key,
                                                                        value):
    """Integers the trainer sizes loops and buffers by are refused out of range before anything
    is built (tokens_per_step = 2^62 made 3.6e16 micro-batches, then an abort), naming the key."""
    p = train(shards, tmp_path / "run", f"--{key}", value, check=False)
    name = key.replace("-", "_")
    assert p.returncode != 0 and re.search(rf"config key {name}: {value}; must lie in \[\d+, \d+\]",
                                           p.stderr), p.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_step_of_more_micro_batches_than_any_run_takes_is_refused(shards, tmp_path):
    # 2^40 tokens in micro-batches of one 128-token row: 2^33 micro-batches per step.
    p = train(shards, tmp_path / "run", "--tokens-per-step", 2 ** 40, "--micro-batch", 1,
              "--steps", 1, check=False)
    assert p.returncode != 0, p.stderr
    assert "config key tokens_per_step: 1099511627776 tokens make 8589934592 micro-batches" \
        in p.stderr, p.stderr
