"""rsd-train ZeRO-2 (`--shard-optimizer true`) and sharded checkpoints, through the binaries.

* 2 ranks × 2 micro-batches with the gradients reduce-scattered micro-batch by micro-batch (with
  and without activation checkpointing, whose backward reduces each layer's buckets right after
  that layer) train what one process trains: fp64, parameters within 1e-10 relative;
* sharded == replicated at 2 ranks (fp64 model; losses 1e-6, parameters 5e-5 relative: the
  replicated all-reduce rounds the gradients to fp32 buckets);
* a sharded checkpoint is one file per rank plus a manifest (sizes and sha256 of every file, the
  world and the bucket layout); reassembled here from the rank files, its state is the
  replicated run's;
* a checkpoint resumes at another data-parallel size: sharded 2 → replicated 1, replicated 1 →
  sharded 2, sharded 2 → sharded 3 (re-sharded on load), to the parameters of an uninterrupted
  run (fp64, 1e-10 relative);
* kill -9 of a rank at a point of the checkpoint write (the fault hook RSD_TRAIN_FAULT_DIE_AT of
  the `fault-injection` build), then `--resume auto`: bit-identical final parameters to an
  uninterrupted run at the same world size; a checkpoint whose manifest is gone is skipped;
* a checkpoint of another bucket layout (`grad_bucket_mb`) is refused naming the key.

Why 1e-10 and not bit-identical: a rank adds its micro-batches' reduced gradients in another order
than one process sums them (and a replicated run sums its micro-batches first, then the ranks), so
the fp64 sums differ in their last bits (~1e-16 relative); AdamW's first steps divide by
sqrt(v) ~ |g|, which magnifies rounding in near-zero gradients. Measured: see docs/TRAIN.md.

Binaries: $RSD_BIN_DIR (default <repo>/target/debug), built with rsd-train/fault-injection.
"""
import json
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from rsd_cli import run

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def shards(mini_shards):
    """These tests compare runs with each other: the small vocabulary's shards (conftest)."""
    return mini_shards


def train_args(shards, out, *extra, steps=3, dtype="fp64", bucket_mb=1, save_every=0):
    init = shards.parent / "tiny-1k.json"
    return ["--config", REPO / "configs" / "tiny-cpu.toml", "--shards", shards, "--init", init,
            "--out", out, "--progress", "false", "--threads", "1", "--steps", steps,
            "--save-every", save_every, "--dtype", dtype, "--grad-bucket-mb", bucket_mb, *extra]


def metrics(out):
    return [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]


def params(out):
    (f,) = (out / "model").glob("*.safetensors")
    return load_file(f)


def worst_relative(a, b):
    """max over tensors of max|a − b| / max|a|."""
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k] - b[k]).max() / max(np.abs(a[k]).max(), 1e-300)) for k in a)


def assert_close_runs(ref, got, rel=1e-10, param_rel=None):
    m_ref, m_got = metrics(ref), metrics(got)
    assert [r["step"] for r in m_got][-len(m_ref):] == [r["step"] for r in m_ref]
    for a, b in zip(m_ref, m_got[-len(m_ref):]):
        for k in ("loss", "clm", "grad_norm"):
            assert b[k] == pytest.approx(a[k], rel=rel, abs=1e-14), (k, a, b)
    worst = worst_relative(params(ref), params(got))
    print(f"{got.name}: max relative |Δparam| {worst:.3g}")
    assert worst <= (param_rel or rel), worst


BATCH = ["--micro-batch", 1, "--tokens-per-step", 512]  # 4 micro-batches: 2 per rank at dp = 2


@pytest.mark.parametrize("checkpointed", [False, True])
def test_zero2_with_two_micro_batches_per_rank_trains_what_one_process_trains(
        shards, tmp_path, checkpointed):
    extra = [*BATCH, "--checkpoint-layers", str(checkpointed).lower()]
    run("rsd-train", *train_args(shards, tmp_path / "one", *extra))
    run("rsd-train", *train_args(shards, tmp_path / "zero", *extra, "--shard-optimizer", "true"),
        "--nproc", 2)
    assert_close_runs(tmp_path / "one", tmp_path / "zero")
    # Communication: per step 2 micro-batches × Σ padded buckets × 8 B (fp64) of
    # reduce-scatters + Σ blocks × 8 B of all-gathers + small scalars, on every step alike.
    comm = [r["comm_bytes"] for r in metrics(tmp_path / "zero")]
    assert len(set(comm)) == 1 and comm[0] > 0, comm
    if checkpointed:
        # Each layer's reduce-scatter in flight during the next layer's backward (the default)
        # or blocking: the same sums in the same order, bit for bit.
        run("rsd-train", *train_args(shards, tmp_path / "blocking", *extra,
                                     "--shard-optimizer", "true", "--overlap-grad-reduce", "false"),
            "--nproc", 2)
        overlapped, blocking = params(tmp_path / "zero"), params(tmp_path / "blocking")
        assert all(np.array_equal(overlapped[k], blocking[k]) for k in overlapped)
        assert [r["comm_bytes"] for r in metrics(tmp_path / "blocking")] == comm
    # Each rank sums its two micro-batches locally, then one reduce-scatter a step: the same
    # update up to the order of the fp64 additions, with less traffic (the exact payload is
    # crates/rsd-train/tests/comm.rs's).
    run("rsd-train", *train_args(shards, tmp_path / "per-step", *extra,
                                 "--shard-optimizer", "true", "--grad-reduce", "step"),
        "--nproc", 2)
    assert_close_runs(tmp_path / "one", tmp_path / "per-step")
    per_step = [r["comm_bytes"] for r in metrics(tmp_path / "per-step")]
    assert len(set(per_step)) == 1 and 0 < per_step[0] < comm[0], (per_step, comm)


def sharded_state(ckpt):
    """The optimizer state of a sharded checkpoint as the replicated file names it (`m.<name>`,
    `v.<name>`), reassembled from the ranks' files by the manifest's layout."""
    manifest = json.loads((ckpt / "manifest.json").read_text())
    layout = manifest["optimizer"]
    assert layout["kind"] == "sharded", layout
    ranks = layout["ranks"]
    files = [load_file(ckpt / f"optimizer-{r:05d}-of-{ranks:05d}.safetensors")
             for r in range(ranks)]
    state = {}
    for j, bucket in enumerate(layout["buckets"]):
        for what in ("m", "v"):
            flat = np.concatenate([f[f"{what}.{j}"] for f in files])
            assert flat.shape == (bucket["block"] * ranks,)
            offset = 0
            for p in bucket["params"]:
                n = int(np.prod(p["shape"]))
                state[f"{what}.{p['name']}"] = flat[offset:offset + n].reshape(p["shape"])
                offset += n
            assert not flat[offset:].any(), "the padding stays zero"
    return manifest, state


def test_sharded_equals_replicated_and_checkpoints_one_file_per_rank(shards, tmp_path):
    # The run's end leaves a checkpoint of step 3.
    extra = BATCH
    run("rsd-train", *train_args(shards, tmp_path / "replicated", *extra), "--nproc", 2)
    run("rsd-train", *train_args(shards, tmp_path / "sharded", *extra, "--shard-optimizer", "true"),
        "--nproc", 2)
    # The replicated all-reduce sums in fp32 buckets even for an fp64 model (rounding each
    # gradient to fp32: ~1e-8 relative), so this comparison is as tight as fp32 allows: losses
    # within 1e-6, parameters within 5e-5 relative (measured 9.9e-6: AdamW's first steps
    # magnify the rounding of near-zero gradients).
    assert_close_runs(tmp_path / "replicated", tmp_path / "sharded", rel=1e-6, param_rel=5e-5)
    ckpt = tmp_path / "sharded" / "checkpoints" / "step-00000003"
    assert not (ckpt / "optimizer.safetensors").exists()
    manifest, sh = sharded_state(ckpt)
    assert (manifest["world"], manifest["dp"], manifest["cp"]) == (2, 2, 1)
    assert manifest["optimizer"]["bucket_elems"] == (1 << 20) // 4
    listed = {f["path"]: f for f in manifest["files"]}
    on_disk = {str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file()}
    assert set(listed) | {"manifest.json"} == on_disk
    for name, f in listed.items():
        assert (ckpt / name).stat().st_size == f["bytes"], name
    rep = load_file(tmp_path / "replicated" / "checkpoints" / "step-00000003" /
                    "optimizer.safetensors")
    assert rep.keys() == sh.keys()
    for k in rep:
        scale = max(float(np.abs(rep[k]).max()), 1e-300)
        assert float(np.abs(rep[k] - sh[k]).max()) <= 1e-5 * scale, k


def test_checkpoints_resume_at_another_dp_size_sharded_or_not(shards, tmp_path):
    # 768 tokens: 6 micro-batches, shared by 1, 2 or 3 ranks.
    def args(out, *extra):
        return train_args(shards, tmp_path / out, "--tokens-per-step", 768, *extra, steps=4)

    zero = ("--shard-optimizer", "true")
    run("rsd-train", *args("ref"))
    run("rsd-train", *args("from2", "--stop-at", 2, *zero), "--nproc", 2)
    shutil.copytree(tmp_path / "from2", tmp_path / "from2to3")
    run("rsd-train", *args("from1", "--stop-at", 2))
    # Sharded at 2 → replicated in one process; → sharded at 3; replicated 1 → sharded 2.
    change = ("--allow-change", "shard_optimizer")
    run("rsd-train", *args("from2", "--shard-optimizer", "false", *change), "--resume")
    run("rsd-train", *args("from2to3", *zero), "--nproc", 3, "--resume")
    run("rsd-train", *args("from1", *zero, *change), "--nproc", 2, "--resume")
    for out in ("from2", "from2to3", "from1"):
        assert [r["step"] for r in metrics(tmp_path / out)] == [1, 2, 3, 4]
        assert_close_runs(tmp_path / "ref", tmp_path / out)


POINTS = [(0, "shard"), (1, "shard"), (0, "main"), (0, "manifest"), (0, "rename"),
          (0, "published"), (1, "after")]


def test_kill_9_while_checkpointing_then_resume_auto_is_bit_identical(shards, tmp_path):
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    picks = random.Random(seed).sample(POINTS, 2)

    def args(out):
        return [*train_args(shards, tmp_path / out, *BATCH, "--keep", 3, "--shard-optimizer",
                            "true", "--resume", "auto", steps=4, dtype="fp32", save_every=1),
                "--nproc", 2]

    run("rsd-train", *args("ref"))
    for i, (rank, point) in enumerate(picks):
        step = 2 + i
        out = tmp_path / f"killed{i}"
        p = run("rsd-train", *args(out.name), check=False,
                env={"RSD_TRAIN_FAULT_DIE_AT": f"{step}:{rank}:{point}"})
        assert p.returncode != 0, p.stderr
        assert f"rank {rank} killed at {point} of step {step}" in p.stderr, p.stderr
        done = sorted(d.name for d in (out / "checkpoints").glob("step-*"))
        # Killed before the rename: no step-N; after it: step-N is complete.
        assert done[-1] == f"step-{step - (point in ('shard', 'main', 'manifest', 'rename')):08d}", \
            (point, done)
        p = run("rsd-train", *args(out.name))
        assert re.search(r"resuming from \S*step-0000000\d", p.stderr), p.stderr
        ref, got = params(tmp_path / "ref"), params(out)
        assert ref.keys() == got.keys()
        for k in ref:
            assert np.array_equal(ref[k], got[k]), (point, k)
    # A checkpoint without its manifest is no checkpoint: --resume auto skips it.
    out = tmp_path / "killed0"
    newest = sorted((out / "checkpoints").glob("step-*"))[-1]
    (newest / "manifest.json").unlink()
    p = run("rsd-train", *args(out.name))
    assert re.search(rf"skipping damaged checkpoint \S*{newest.name}: .*manifest.json", p.stderr), \
        p.stderr


def test_a_checkpoint_of_another_bucket_layout_is_refused_naming_the_key(shards, tmp_path):
    zero = ("--shard-optimizer", "true")
    out = tmp_path / "run"
    run("rsd-train", *train_args(shards, out, *BATCH, *zero, "--stop-at", 1, steps=2), "--nproc", 2)
    # A resume keeps the run's buckets unless the command names the change...
    p = run("rsd-train", *train_args(shards, out, *BATCH, *zero, steps=2, bucket_mb=2), "--nproc",
            2, "--resume", check=False)
    assert p.returncode != 0
    assert "grad_bucket_mb: 1 → 2 (--grad-bucket-mb)" in p.stderr, p.stderr
    assert "--allow-change grad_bucket_mb" in p.stderr, p.stderr
    # ...and a named change meets the sharded optimizer's own check, which names the key.
    p = run("rsd-train", *train_args(shards, out, *BATCH, *zero, steps=2, bucket_mb=2), "--nproc",
            2, "--resume", "--allow-change", "grad_bucket_mb", check=False)
    assert p.returncode != 0
    assert "grad_bucket_mb = 1" in p.stderr and "grad_bucket_mb = 2" in p.stderr, p.stderr
