"""rsd-train on bad input and faults, through the binaries.

* token ids beyond the model's vocabulary: shards of a tokenizer with more ids than the model are
  refused at start-up; a damaged shard fails the batch, naming shard, sample and token, before the
  ids reach the embedding;
* libtorch errors print one line, the C++ backtrace only with RSD_BACKTRACE=1 (rsd-train probe,
  which passes ids to the model unchecked);
* --resume without a checkpoint is an error, --resume auto starts fresh (and resumes next time);
* damaged checkpoints are skipped by --resume auto with a warning naming the file, and refused by
  an explicit --resume DIR;
* a full disk while writing a checkpoint stops the run with a clear error and leaves no partial
  checkpoint (the fault hook RSD_TRAIN_FAULT_DISK_FULL_AT of the `fault-injection` build).

Binaries: $RSD_BIN_DIR (default <repo>/target/debug), built with rsd-train/fault-injection.
"""
import json
import re
import shutil
from pathlib import Path

import numpy as np

from rsd_cli import fails, run

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "configs" / "model" / "tiny-qwen3-64.json"
VOCAB = 151669  # the bundled Qwen3 tokenizer's ids and the tiny model's vocabulary


def train_args(shards, out, *extra, init=TINY):
    return ["--config", REPO / "configs" / "tiny-cpu.toml", "--shards", shards, "--init", init,
            "--out", out, "--progress", "false", "--threads", "2", *extra]


def train(shards, out, *extra, env=None, **kw):
    return run("rsd-train", *train_args(shards, out, *extra, **kw), env=env)


def train_fails(shards, out, *extra, env=None, **kw):
    return fails("rsd-train", *train_args(shards, out, *extra, **kw), env=env)


def steps_logged(out):
    return [json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines()]


def checkpoints(out):
    d = out / "checkpoints"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def test_shards_of_a_larger_vocabulary_are_refused_at_start_up(shards, tmp_path):
    cfg = json.loads(TINY.read_text())
    cfg["vocab_size"] = 1000
    small = tmp_path / "small.json"
    small.write_text(json.dumps(cfg))
    # The tokenizer-identity check refuses first, naming the manifest field and both sizes ...
    p = train_fails(shards, tmp_path / "run", "--steps", 1, init=small)
    assert f"tokenizer.vocab_size is {VOCAB}" in p.stderr and "1000" in p.stderr, p.stderr
    assert str(shards) in p.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    # ... and allowing a mismatched tokenizer does not allow ids past the model's embedding.
    p = train_fails(shards, tmp_path / "run", "--steps", 1, "--allow-tokenizer-mismatch",
                    init=small)
    assert f"has {VOCAB} ids, more than the model's vocabulary of 1000" in p.stderr, p.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_checkpoint_directory_given_as_init_points_at_model(shards, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    p = train_fails(shards, tmp_path / "run", "--steps", 1, init=ckpt)
    assert f"init {ckpt}: a directory" in p.stderr and f"--model {ckpt}" in p.stderr, p.stderr


def test_ids_beyond_the_vocabulary_fail_naming_shard_sample_and_token(shards, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(shards, damaged)
    # Fixed 128-token int32 samples stored back to back: token 7 of every sample gets a bad id.
    ids = np.memmap(damaged / "shard-00000.bin", dtype="<i4", mode="r+").reshape(-1, 128)
    ids[:, 7] = 1_000_000
    ids.flush()
    del ids
    p = train_fails(damaged, tmp_path / "run", "--steps", 2)
    m = re.search(r"shard-00000\.bin: sample (\d+), token 7: id 1000000 is outside the "
                  rf"vocabulary \(0\.\.{VOCAB}\)", p.stderr)
    assert m, p.stderr
    assert "torch" not in p.stderr and "frame #" not in p.stderr, p.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").read_text().strip()  # no step ran


def test_torch_errors_print_one_line_unless_rsd_backtrace(tmp_path):
    # The probe checks ids itself now; the fault hook asks libtorch for an embedding row that does
    # not exist, so libtorch's own error (and its C++ backtrace) shows.
    ok = tmp_path / "ok.npy"
    np.save(ok, np.array([[1, 2, 3, 4, 5, 6]], dtype=np.int64))
    cmd = ["rsd-train", "probe", "--init", TINY, "--tokens", ok, "--objective", "standard"]
    fault = {"RSD_TRAIN_FAULT_TORCH_ERROR": "1"}
    short = fails(*cmd, env=fault)
    lines = short.stderr.strip().splitlines()
    assert len(lines) == 1, short.stderr
    assert "index out of range in self" in lines[0] and "RSD_BACKTRACE=1" in lines[0], lines
    full = fails(*cmd, env={**fault, "RSD_BACKTRACE": "1"})
    assert "index out of range in self" in full.stderr and "frame #" in full.stderr


def test_resume_without_checkpoint_is_an_error_and_auto_starts_fresh(shards, tmp_path):
    out = tmp_path / "run"
    p = train_fails(shards, out, "--steps", 2, "--resume")
    assert "no checkpoint under" in p.stderr and "--resume auto" in p.stderr, p.stderr
    p = train(shards, out, "--steps", 4, "--stop-at", 2, "--resume", "auto")
    assert "no checkpoint under" in p.stderr and "starting fresh" in p.stderr, p.stderr
    assert checkpoints(out) == ["step-00000002"]
    # What a writer killed mid-checkpoint leaves (no process has that pid): removed on restart.
    stale = out / "checkpoints" / ".step-00000003.tmp-4294967290"
    (stale / "model").mkdir(parents=True)
    # The same command line again (a restarted job) resumes.
    p = train(shards, out, "--steps", 4, "--resume", "auto")
    assert re.search(r"resuming from \S*step-00000002 \(step 2 of", p.stderr), p.stderr
    assert f"removed unfinished checkpoint {stale}" in p.stderr and not stale.exists(), p.stderr
    assert steps_logged(out) == [1, 2, 3, 4]


def test_damaged_checkpoints_are_skipped_by_auto_and_refused_by_name(shards, tmp_path):
    out, other = tmp_path / "run", tmp_path / "other"
    common = ("--steps", 6, "--save-every", 1, "--keep", 4)
    train(shards, out, *common, "--stop-at", 4)
    train(shards, other, *common, "--stop-at", 1, "--seed", 7)
    assert checkpoints(out) == [f"step-0000000{k}" for k in (1, 2, 3, 4)]
    ck = out / "checkpoints"
    weights = ck / "step-00000004" / "model" / "model.safetensors"
    with open(weights, "r+b") as f:  # truncated
        f.truncate(weights.stat().st_size // 2)
    (ck / "step-00000003" / "optimizer.safetensors").unlink()  # missing
    # Another run's state, put in at the right step number.
    st = json.loads((other / "checkpoints" / "step-00000001" / "state.json").read_text())
    st["step"] = 2
    (ck / "step-00000002" / "state.json").write_text(json.dumps(st))

    for step, file, why in ((4, "model/model.safetensors", "truncated"),
                            (3, "optimizer.safetensors", "missing"),
                            (2, "state.json", "seed 7")):
        p = train_fails(shards, out, *common, "--resume", ck / f"step-0000000{step}")
        assert f"step-0000000{step}/{file}" in p.stderr and why in p.stderr, p.stderr

    p = train(shards, out, *common, "--resume", "auto")
    for step, file in ((4, "model/model.safetensors"), (3, "optimizer.safetensors"),
                       (2, "state.json")):
        assert re.search(rf"warning: skipping damaged checkpoint \S*step-0000000{step}: "
                         rf".*step-0000000{step}/{re.escape(file)}", p.stderr), p.stderr
    assert re.search(r"resuming from \S*step-00000001 \(step 1 of", p.stderr), p.stderr
    assert steps_logged(out)[-5:] == [2, 3, 4, 5, 6]
    assert json.loads((out / "summary.json").read_text())["steps"] == 6


def test_auto_with_only_damaged_checkpoints_is_an_error(shards, tmp_path):
    out = tmp_path / "run"
    train(shards, out, "--steps", 4, "--stop-at", 1)
    (out / "checkpoints" / "step-00000001" / "optimizer.safetensors").unlink()
    p = train_fails(shards, out, "--steps", 4, "--resume", "auto")
    assert "no complete checkpoint" in p.stderr and "1 damaged" in p.stderr, p.stderr


def test_disk_full_while_checkpointing_stops_cleanly_and_resumes(shards, tmp_path):
    out = tmp_path / "run"
    common = ("--steps", 6, "--save-every", 2, "--keep", 3)
    p = train_fails(shards, out, *common,
                    env={"RSD_TRAIN_FAULT_DISK_FULL_AT": "4:optimizer.safetensors"})
    assert "the disk is full" in p.stderr and "No space left on device" in p.stderr, p.stderr
    assert "optimizer.safetensors" in p.stderr and "step-00000002" in p.stderr, p.stderr
    # Only the complete checkpoint is there: no step-4 directory, no temporary leftovers.
    assert checkpoints(out) == ["step-00000002"]
    p = train(shards, out, *common, "--resume", "auto")
    assert re.search(r"resuming from \S*step-00000002 \(step 2 of", p.stderr), p.stderr
    assert json.loads((out / "summary.json").read_text())["steps"] == 6
    assert checkpoints(out) == ["step-00000002", "step-00000004", "step-00000006"]


def test_links_planted_at_the_runs_log_and_summary_are_not_written_through(shards, tmp_path):
    """A resumed run appends to metrics.jsonl and rewrites summary.json; a symbolic link planted
    at either name must not carry the write elsewhere: the log's is refused, naming it, and the
    summary's is replaced by the run's own file. The files they point to are untouched."""
    out = tmp_path / "run"
    train(shards, out, "--steps", 3, "--stop-at", 1)
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    # summary.json: replaced, not followed.
    (out / "summary.json").unlink()
    (out / "summary.json").symlink_to(outside)
    train(shards, out, "--steps", 3, "--stop-at", 2, "--resume", "auto")
    assert not (out / "summary.json").is_symlink()
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
    assert outside.read_text() == "keep"
    # metrics.jsonl: refused.
    (out / "metrics.jsonl").unlink()
    (out / "metrics.jsonl").symlink_to(outside)
    p = train_fails(shards, out, "--steps", 3, "--resume", "auto")
    assert "metrics.jsonl" in p.stderr and "a symbolic link" in p.stderr, p.stderr
    assert outside.read_text() == "keep"


def test_a_checkpoint_resumes_into_its_run_or_out_never_where_its_files_say(shards, tmp_path):
    """A checkpoint carries the config.toml of the run that wrote it, which names that run's
    directory. Copied out of its run, it resumes only where the command says (--out); its own
    `out` is never written to."""
    out = tmp_path / "run"
    train(shards, out, "--steps", 3, "--stop-at", 2)
    copied = tmp_path / "elsewhere" / "step-00000002"
    shutil.copytree(out / "checkpoints" / "step-00000002", copied)
    shutil.rmtree(out)
    p = fails("rsd-train", "--resume", copied, "--progress", "false", "--threads", "2")
    assert "not inside a run directory" in p.stderr and "--out DIR" in p.stderr, p.stderr
    assert not out.exists(), "the copied checkpoint's own out was written to"
    new = tmp_path / "new-run"
    run("rsd-train", "--resume", copied, "--out", new, "--progress", "false", "--threads", "2")
    assert steps_logged(new) == [3]
    assert not out.exists()


def test_a_forged_manifest_or_a_planted_fifo_stops_a_resume_at_once(shards, tmp_path):
    """A manifest naming a file outside its checkpoint (/dev/zero would be hashed forever) and a
    FIFO inside one (which would block its reader) are errors naming them, not hangs."""
    import os
    out = tmp_path / "run"
    train(shards, out, "--steps", 3, "--stop-at", 1)
    ck = out / "checkpoints" / "step-00000001"
    manifest = json.loads((ck / "manifest.json").read_text())
    manifest["files"][0]["path"] = "/dev/zero"
    (ck / "manifest.json").write_text(json.dumps(manifest))
    p = train_fails(shards, out, "--steps", 3, "--resume", ck)
    assert "files[0].path" in p.stderr and "/dev/zero" in p.stderr, p.stderr
    manifest["files"][0]["path"] = "config.toml"
    (ck / "manifest.json").write_text(json.dumps(manifest))
    os.mkfifo(ck / "model" / "model-00002-of-00002.safetensors")
    p = train_fails(shards, out, "--steps", 3, "--resume", ck)
    assert "model-00002-of-00002.safetensors" in p.stderr and "not a regular file" in p.stderr


def test_a_config_declaring_more_than_the_machine_holds_is_refused_before_allocating(shards,
                                                                                    tmp_path):
    """Every size within its per-key bound, the whole far beyond memory: an error naming the
    config and the bytes, not an abort while allocating."""
    import resource
    cfg = json.loads(TINY.read_text())
    cfg.update(hidden_size=65536, intermediate_size=65536, num_hidden_layers=4,
               num_attention_heads=512, num_key_value_heads=512, head_dim=128)
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps(cfg))

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    import subprocess
    from rsd_cli import BIN_DIR
    p = subprocess.run([str(BIN_DIR / "rsd-train"), *map(str, train_args(
        shards, tmp_path / "run", "--steps", 1, init=huge))], capture_output=True, text=True,
        preexec_fn=limit, timeout=300)
    assert p.returncode == 1, (p.returncode, p.stderr[-2000:])
    assert "huge.json" in p.stderr and "parameters" in p.stderr and "available" in p.stderr, \
        p.stderr


def test_a_checkpoints_directory_planted_as_a_link_is_refused_and_its_target_untouched(shards,
                                                                                        tmp_path):
    """<run>/checkpoints is the run's own: a link planted there would take new checkpoints,
    and the pruning of old ones, to wherever it points."""
    out = tmp_path / "run"
    train(shards, out, "--steps", 3, "--stop-at", 1)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(str(out / "checkpoints"), elsewhere)
    (out / "checkpoints").symlink_to(elsewhere)
    before = sorted(p.name for p in elsewhere.iterdir())
    p = train_fails(shards, out, "--steps", 3, "--save-every", 1, "--resume", "auto")
    assert "checkpoints: a symbolic link where rsd keeps a directory of its own" in p.stderr, \
        p.stderr
    assert sorted(p.name for p in elsewhere.iterdir()) == before
