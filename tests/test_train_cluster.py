"""rsd-train on a cluster: nothing lost when a job is stopped, a checkpoint is damaged, or a rank
is lost before its first step.

* SIGTERM or SIGUSR1 reaching one rank of a dp-2 ZeRO-2 run stops both at the same step
  boundary with a checkpoint and exit status 75; `--resume auto` then ends with weights
  bit-identical to the run never interrupted (the signal sent by a fault hook on one rank, and
  by the test to the launcher as a cluster would);
* `save_every_minutes` writes checkpoints by the clock, every rank saving the same step;
* `--resume auto` verifies the newest checkpoint's files on every rank and, when one rank finds a
  byte flipped in its optimizer shard (constant size), every rank falls back to the checkpoint
  before it and the run still ends bit-identical; `--resume DIR` on it is refused naming the file;
* a rank frozen while it loads the model stops every rank within `dist_liveness`, long before
  the collective's timeout;
* store errors of the failure watch are retried, and a whole job suspended and resumed (every
  rank stopped together for longer than `dist_liveness`) is not a failure.

Binaries: $RSD_BIN_DIR (default <repo>/target/debug), built with the `fault-injection` feature
(scripts/test.sh builds them so).
"""
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from safetensors.numpy import load_file

from rsd_cli import exe, fails, run
from test_train_dp import start_two_ranks

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def shards(mini_shards):
    return mini_shards


def args(shards, out, *extra, steps=6, save_every=0):
    """A dp-2, ZeRO-2 run of the tiny model: one 128-token row per rank and step."""
    return ["--config", REPO / "configs" / "tiny-cpu.toml", "--shards", shards, "--init",
            shards.parent / "tiny-1k.json", "--out", out, "--progress", "false", "--threads", 1,
            "--steps", steps, "--tokens-per-step", 256, "--shard-optimizer", "--save-every", save_every,
            *extra]


def params(out):
    (f,) = (out / "model").glob("*.safetensors")
    return load_file(f)


def steps_logged(out):
    return [json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines()]


def checkpoints(out):
    return sorted(p.name for p in (out / "checkpoints").glob("step-*"))


def assert_bit_identical(a, b):
    pa, pb = params(a), params(b)
    assert pa.keys() == pb.keys()
    for k in pa:
        assert (pa[k] == pb[k]).all(), k


@pytest.fixture(scope="module")
def uninterrupted(shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "run"
    run("rsd-train", *args(shards, out), "--nproc", 2, timeout=300)
    assert steps_logged(out) == [1, 2, 3, 4, 5, 6]
    return out


@pytest.mark.parametrize("sig", ["TERM", "USR1"])
def test_a_signal_on_one_rank_stops_both_at_one_step_with_a_checkpoint(shards, uninterrupted,
                                                                         tmp_path, sig):
    out = tmp_path / "run"
    p = run("rsd-train", *args(shards, out), "--nproc", 2, check=False, timeout=300,
            env={"RSD_TRAIN_FAULT_SIGNAL_AT": f"4:1:{sig}"})
    assert p.returncode == 75, p.stderr
    assert f"[rank 1] rsd-train: SIG{sig} received" in p.stderr, p.stderr
    assert "[rank 0] rsd-train: stopped on a signal at step 3 with a checkpoint" in p.stderr
    assert "rank 1 of 2 failed" not in p.stderr, p.stderr
    # Rank 1 saw the signal as step 4 began: both ranks stopped there, after step 3.
    assert steps_logged(out) == [1, 2, 3]
    assert checkpoints(out) == ["step-00000003"]
    manifest = json.loads((out / "checkpoints" / "step-00000003" / "manifest.json").read_text())
    assert {f["path"] for f in manifest["files"]} >= {"optimizer-00000-of-00002.safetensors",
                                                      "optimizer-00001-of-00002.safetensors"}
    assert not (out / "model").exists()

    p = run("rsd-train", *args(shards, out), "--nproc", 2, "--resume", "auto", timeout=300)
    assert steps_logged(out) == [1, 2, 3, 4, 5, 6]
    assert_bit_identical(uninterrupted, out)


def test_sigterm_from_outside_reaches_every_rank_through_the_launcher(shards, uninterrupted,
                                                                        tmp_path):
    # As scancel or a preemption would: the signal comes at an arbitrary moment.
    out = tmp_path / "run"
    proc = subprocess.Popen([exe("rsd-train"), *map(str, args(shards, out, steps=6)),
                             "--nproc", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 120
        while not ((out / "metrics.jsonl").exists() and steps_logged(out)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    if proc.returncode == 0:
        # The signal came during the last step: the run was complete, and says so.
        assert steps_logged(out)[-1] == 6
    else:
        assert proc.returncode == 75, err
        stopped = steps_logged(out)[-1]
        assert checkpoints(out)[-1] == f"step-{stopped:08d}", err
        run("rsd-train", *args(shards, out), "--nproc", 2, "--resume", "auto", timeout=300)
    assert steps_logged(out) == [1, 2, 3, 4, 5, 6]
    assert_bit_identical(uninterrupted, out)


def test_checkpoints_by_the_clock_are_the_same_step_on_every_rank(shards, uninterrupted,
                                                                  tmp_path):
    out = tmp_path / "run"
    # 60 ns: due at every step boundary, so the test does not depend on how fast a step is (a
    # step, with its all-reduce over a socket, takes microseconds at the very least; 6 ms was
    # within reach of a fast machine's step of this tiny model).
    p = run("rsd-train", *args(shards, out), "--nproc", 2, "--save-every-minutes", "0.000000001",
            "--keep", 10, "--stop-at", 4, check=False, timeout=300)
    assert p.returncode == 0, p.stderr
    # Steps 1-3 saved by the clock (at the boundary after each), step 4 at the stop.
    assert checkpoints(out) == [f"step-0000000{k}" for k in (1, 2, 3, 4)]
    for ck in (out / "checkpoints").glob("step-*"):
        manifest = json.loads((ck / "manifest.json").read_text())
        assert manifest["world"] == 2 and len(manifest["files"]) > 2
    run("rsd-train", *args(shards, out), "--nproc", 2, "--resume", "auto", timeout=300)
    assert_bit_identical(uninterrupted, out)


def flip_a_byte(path, at_fraction=0.75):
    """Flips one byte of the file's data (its size unchanged), past the safetensors header."""
    data = bytearray(path.read_bytes())
    i = int(len(data) * at_fraction)
    data[i] ^= 0x40
    path.write_bytes(bytes(data))


def test_a_damaged_newest_checkpoint_falls_back_on_every_rank(shards, uninterrupted, tmp_path):
    out = tmp_path / "run"
    run("rsd-train", *args(shards, out, save_every=2), "--nproc", 2, "--keep", 3, "--stop-at", 4,
        timeout=300)
    assert checkpoints(out) == ["step-00000002", "step-00000004"]
    shard = out / "checkpoints" / "step-00000004" / "optimizer-00001-of-00002.safetensors"
    size = shard.stat().st_size
    flip_a_byte(shard)
    assert shard.stat().st_size == size

    # Named explicitly, the damaged checkpoint is refused (no fallback).
    p = fails("rsd-train", *args(shards, out), "--nproc", 2, "--resume",
              out / "checkpoints" / "step-00000004", timeout=300)
    assert "optimizer-00001-of-00002.safetensors" in p.stderr, p.stderr

    # The requeued job's command: it falls back to step 2 and finishes the run.
    p = run("rsd-train", *args(shards, out), "--nproc", 2, "--resume", "auto", timeout=300)
    assert re.search(r"\[rank 1\] rsd-train: warning: rank 1: checkpoint \S*step-00000004 is "
                     r"damaged: .*optimizer-00001-of-00002.safetensors: {size} bytes with sha256 .*\(the file "
                     r"changed after it was written\)".replace("{size}", str(size)), p.stderr), \
        p.stderr
    assert re.search(r"\[rank 0\] rsd-train: --resume auto: checkpoint \S*step-00000004 failed "
                     r"verification on rank 1 .* every rank falls back to \S*step-00000002",
                     p.stderr), p.stderr
    assert steps_logged(out) == [1, 2, 3, 4, 5, 6]
    assert_bit_identical(uninterrupted, out)


def test_a_rank_frozen_while_loading_stops_every_rank_within_the_liveness_period(shards,
                                                                                 tmp_path):
    out = tmp_path / "run"
    t0 = time.monotonic()
    p = run("rsd-train", *args(shards, out), "--nproc", 2, "--dist-liveness", 3,
            "--dist-timeout", 300, check=False, timeout=200,
            env={"RSD_TRAIN_FAULT_FREEZE_LOAD_RANK": "1"})
    waited = time.monotonic() - t0
    assert p.returncode != 0, p.stderr
    assert "rank 1 freezes while loading" in p.stderr, p.stderr
    assert "rsd-train: error: rank 1 failed: stopped answering: its heartbeat" in p.stderr, p.stderr
    # The liveness period, a poll and the grace (and start-up): far below the 300 s timeout.
    # ~15 s, 13 of them fixed periods (liveness, a poll, the grace, the launcher's 6 s before it
    # kills the frozen rank); ~20 s with both cores of a 2-core machine busy: a wide margin.
    assert waited < 90, (waited, p.stderr)
    assert not (out / "metrics.jsonl").exists() or steps_logged(out) == []


def test_store_errors_of_the_watch_are_retried(shards, tmp_path):
    out = tmp_path / "run"
    release = tmp_path / "release"
    # The ranks hold before step 2 (a fault hook) until the watch's two failed polls and their
    # retries are logged (1 s, then 2 s apart: the back-off), however fast the steps run; the
    # deadline only guards against a hang.
    env = {**os.environ, "RSD_DIST_FAULT_STORE_ERRORS": "1:2",
           "RSD_TRAIN_FAULT_HOLD_AT": f"2:{release}"}
    with open(tmp_path / "stderr", "w+") as err:
        p = subprocess.Popen([exe("rsd-train"), *map(str, args(shards, out, steps=20)), "--nproc",
                              "2", "--dist-liveness", "30"], env=env, stdout=subprocess.PIPE,
                             stderr=err, text=True)
        try:
            deadline = time.monotonic() + 120
            while Path(err.name).read_text().count("retrying") < 2:
                assert time.monotonic() < deadline and p.poll() is None, Path(err.name).read_text()
                time.sleep(0.1)
            release.touch()
            p.communicate(timeout=240)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
        stderr = Path(err.name).read_text()
    assert p.returncode == 0, stderr
    assert "[rank 1] rank 1: the rendezvous store did not answer the failure watch" in stderr
    assert stderr.count("retrying") == 2, stderr
    assert "rsd-train: error" not in stderr and "stopped answering" not in stderr, stderr
    assert steps_logged(out) == list(range(1, 21))


def test_a_whole_job_suspended_longer_than_liveness_is_not_a_failure(shards, tmp_path):
    out = tmp_path / "run"
    # 100,000 steps: still running when suspended and when stopped, on any machine (the test
    # waits for a few steps only); the deadlines only guard against a hang.
    procs = start_two_ranks(args(shards, out, "--dist-liveness", 3, steps=100000), {})
    try:
        deadline = time.monotonic() + 120
        while not ((out / "metrics.jsonl").exists() and len(steps_logged(out)) >= 2):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                [p.communicate()[1] for p in procs if p.poll() is not None]
            time.sleep(0.1)
        for p in procs:
            os.kill(p.pid, signal.SIGSTOP)
        time.sleep(8)  # well past the 3 s liveness period
        for p in procs:
            os.kill(p.pid, signal.SIGCONT)
        # Back: a few more steps, then stopped cleanly with SIGTERM on both (as scancel does).
        seen = len(steps_logged(out))
        deadline = time.monotonic() + 60
        while len(steps_logged(out)) < seen + 3:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                [p.communicate()[1] for p in procs if p.poll() is not None]
            time.sleep(0.1)
        for p in procs:
            p.send_signal(signal.SIGTERM)
        errs = [p.communicate(timeout=120)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert [p.returncode for p in procs] == [75, 75], errs
    assert all("stopped answering" not in e for e in errs), errs


def start_ranks(arguments, per_rank_env):
    """Ranks started by hand, each with its own extra variables (a host name of its own)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    n = len(per_rank_env)
    return [subprocess.Popen(
        [exe("rsd-train"), *map(str, arguments)],
        env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
             "RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r),
             "LOCAL_WORLD_SIZE": str(n), **extra},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r, extra in enumerate(per_rank_env)]


def finish(procs):
    errs = [p.communicate(timeout=240)[1] for p in procs]
    return [p.returncode for p in procs], errs


def test_a_context_parallel_group_across_hosts_is_refused_unless_allowed(shards, tmp_path):
    # Rank 1 says it runs on another host (the fault hook), as a cyclic task distribution would
    # place it: the cp-2 group's K/V gathers would cross the network.
    hosts = [{}, {"RSD_DIST_FAULT_HOST": "otherhost"}]
    cp = ["--cp", 2, "--dp", 1]
    codes, errs = finish(start_ranks(args(shards, tmp_path / "refused", *cp, steps=2), hosts))
    assert codes[0] != 0 and codes[1] != 0, errs
    for e in errs:
        assert "context parallelism across hosts" in e and "otherhost" in e, e
        assert "cp_across_nodes = true" in e, e
    assert "rsd-train: placement: 2 nodes × 1 rank" in errs[0], errs[0]

    codes, errs = finish(start_ranks(args(shards, tmp_path / "allowed", *cp, "--cp-across-nodes",
                                          steps=2), hosts))
    assert codes == [0, 0], errs
    assert "rsd-train: warning: context parallelism across hosts, allowed by" in errs[0], errs[0]

    # Data parallelism alone may span hosts freely.
    codes, errs = finish(start_ranks(args(shards, tmp_path / "dp", steps=2), hosts))
    assert codes == [0, 0], errs
    assert "placement: 2 nodes × 1 rank" in errs[0] and "warning" not in errs[0], errs[0]


@pytest.mark.skipif(Path("/proc/driver/nvidia").exists(), reason="a machine with an NVIDIA driver")
def test_cuda_without_a_driver_stops_before_anything_naming_what_is_missing(shards, tmp_path):
    # On a GPU node whose driver is older than the torch build's CUDA the same check names both
    # versions and the fix (unit-tested in rsd-train's driver module); here there is no driver.
    out = tmp_path / "run"
    p = fails("rsd-train", *args(shards, out, steps=1), "--device", "cuda", timeout=120)
    assert "no NVIDIA driver found (libcuda.so.1 could not be loaded" in p.stderr, p.stderr
    assert not (out / "metrics.jsonl").exists()


def start_one(shards, out, env, *extra):
    """A one-process run of many steps, its stderr in a file the test reads as it goes."""
    err = open(out.parent / f"{out.name}.stderr", "w+")
    proc = subprocess.Popen([exe("rsd-train"), *map(str, args(shards, out, *extra, steps=100000)),
                             "--dp", "1"], env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=err, text=True)
    return proc, Path(err.name)


def wait_for_text(proc, path, text, count=1):
    """Waits until `text` appears `count` times in the file; the deadline only guards a hang."""
    deadline = time.monotonic() + 120
    while path.read_text().count(text) < count:
        assert proc.poll() is None and time.monotonic() < deadline, path.read_text()
        time.sleep(0.05)


def wait_for_first_step(proc, out, err):
    """Waits until step 1 is logged (the run then holds before step 2)."""
    deadline = time.monotonic() + 120
    while not ((out / "metrics.jsonl").exists() and steps_logged(out)):
        assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
        time.sleep(0.05)


def test_repeated_terms_are_one_stop_and_a_second_interrupt_exits_at_once(shards, tmp_path):
    # SLURM at a time limit: SIGTERM, SIGCONT, SIGTERM. The run is held before step 2 (a fault
    # hook) until the first signal, so both arrive while it runs, however fast it trains.
    out = tmp_path / "term"
    proc, err = start_one(shards, out, {"RSD_TRAIN_FAULT_HOLD_AT": f"2:{tmp_path / 'never'}"})
    try:
        wait_for_first_step(proc, out, err)
        proc.send_signal(signal.SIGTERM)
        wait_for_text(proc, err, "SIGTERM received")
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGUSR1)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = err.read_text()
    assert proc.returncode == 75, text
    assert "exiting now" not in text and "received again: already stopping" in text, text
    assert checkpoints(out) == ["step-00000001"], text
    assert "stopped on a signal at step 1 with a checkpoint" in text, text

    # Ctrl-C twice: the second, while the checkpoint is being written (held there by a fault
    # hook for far longer than the test waits), exits at once without one.
    out = tmp_path / "int"
    proc, err = start_one(shards, out, {"RSD_TRAIN_FAULT_HOLD_AT": f"2:{tmp_path / 'never'}",
                                         "RSD_TRAIN_FAULT_SLOW_SAVE_S": "600"})
    try:
        wait_for_first_step(proc, out, err)
        proc.send_signal(signal.SIGINT)
        wait_for_text(proc, err, "SIGINT (Ctrl-C) received")
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = err.read_text()
    assert proc.returncode == 128 + signal.SIGINT, text
    assert "second interrupt (SIGINT): exiting now without a checkpoint" in text, text
    assert checkpoints(out) == [], text
