"""rsd-train under a real SLURM (the one-node cluster scripts/slurm-local.sh starts): the shipped
sbatch script, through its RSD_* overrides, runs a tiny data-parallel run of 2 CPU tasks, and
every way SLURM ends a job leaves a complete checkpoint at the last finished step.

* A 1-minute time limit and no `--signal`: rsd-train reads the job's end time, stops with a
  checkpoint before it, the script requeues, and the run reaches its end over several starts
  with weights bit-identical to an uninterrupted run's.
* A 2-minute limit with `--signal=USR1@60` and the job clock off: the signal stops each start
  with a checkpoint, the script requeues, the run reaches its end.
* The 1-minute limit with the job clock off (`end_margin_s = 0`): SLURM's SIGTERM, SIGCONT, SIGTERM
  at the limit are one stop; the checkpoint holds the last logged step (nothing but the step in
  flight is lost) and is written within KillWait.
* `scancel --signal=USR1` stops with a checkpoint and the job is requeued and goes on; a plain
  `scancel` then stops it with a checkpoint for good (no requeue).
* A second job into a running job's `--out` is refused while the first is writing a checkpoint,
  leaves the unfinished checkpoint alone, and is not requeued; the first publishes it.
* A start that makes no progress (its job already too near its end, and the script's
  `--signal=USR1@900`, a lead longer than the 1-minute limit) is not requeued.

Each run's steps take at least STEP_S (a fault hook), so a time limit is a lower bound on the
steps a start can run, whatever the machine's speed; every wait is for an event, with deadlines
that only guard against a hang. Binaries: $RSD_BIN_DIR (default <repo>/target/debug), built with
the `fault-injection` feature.
"""
import json
import subprocess
import time
from pathlib import Path

import pytest
from safetensors.numpy import load_file

from rsd_cli import exe, run
from slurm_local import slurm  # noqa: F401  (a fixture)

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "pipelines" / "slurm" / "llama3-8b-64k.sbatch"
# A floor under each step's time (RSD_TRAIN_FAULT_STEP_SLEEP_S).
STEP_S = 1.5


@pytest.fixture(scope="module")
def shards(mini_shards):
    return mini_shards


def train_flags(shards, steps, *extra, save_every=0):
    """The tiny run's flags beside the script's --config, --out and --resume auto."""
    return ["--shards", shards, "--init", shards.parent / "tiny-1k.json", "--progress", "false",
            "--threads", 1, "--steps", steps, "--tokens-per-step", 256, "--save-every",
            save_every, "--dist-liveness", 60, *extra]


def without_signal(tmp_path):
    """The shipped script without its `#SBATCH --signal` line: a job whose only guard before
    its time limit is rsd-train's own clock (or none)."""
    copy = tmp_path / SCRIPT.name
    lines = SCRIPT.read_text().splitlines(keepends=True)
    kept = [l for l in lines if not l.startswith("#SBATCH --signal")]
    assert len(kept) == len(lines) - 1
    copy.write_text("".join(kept))
    return copy


# The tasks: 2 on one node (the default), or one on each of the cluster's two nodes.
ONE_NODE = ("--nodes=1", "--ntasks=2", "--ntasks-per-node=2")
TWO_NODES = ("--nodes=2", "--ntasks=2", "--ntasks-per-node=1")


def submit(slurm, tmp_path, name, out, flags, *options, env=None, time_limit="1",
           signal=None, script=SCRIPT, layout=ONE_NODE):
    """The shipped script on 2 CPU tasks (its GPU and node options overridden; `--signal` as
    the script has it unless given); returns the job id and its output file."""
    log = tmp_path / f"{name}.out"
    if signal is not None:
        options = (f"--signal={signal}", *options)
    job = slurm.sbatch(
        script, f"--job-name=rsd-test-{name}", *layout,
        "--gpus-per-node=0", "--cpus-per-task=1", f"--time={time_limit}", f"--output={log}",
        *options,
        env={"RSD_BIN": exe("rsd-train"), "RSD_CONFIG": REPO / "configs" / "tiny-cpu.toml",
             "RSD_OUT": out, "RSD_WORKDIR": tmp_path,
             "RSD_TRAIN_ARGS": " ".join(map(str, flags)), **(env or {})},
        cwd=tmp_path)
    return job, log


def text(log):
    return log.read_text() if log.exists() else ""


def steps_logged(out):
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(l)["step"] for l in path.read_text().splitlines() if l.strip()]


def checkpoints(out):
    return sorted(int(p.name.removeprefix("step-")) for p in (out / "checkpoints").glob("step-*"))


def wait_for(what, condition, timeout=300):
    """Waits for `condition()`; the deadline only guards against a hang."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def params(out):
    (f,) = (out / "model").glob("*.safetensors")
    return load_file(f)


def assert_ran_to_the_end(slurm, job, log, out, steps, timeout=900):
    """Waits for the job (the timeout only guards against a hang); it completed with every step
    logged once (a resumed start trims the log to its checkpoint). Returns its output."""
    state, code = slurm.wait_job(job, timeout=timeout)
    output = text(log)
    assert (state, code) == ("COMPLETED", "0:0"), output
    assert steps_logged(out) == list(range(1, steps + 1)), output
    return output


def assert_equals_nproc_2(shards, out, tmp_path, steps):
    """The final model equals, bit for bit, a local `--nproc 2` run of the same flags never
    interrupted."""
    reference = tmp_path / "reference"
    run("rsd-train", "--config", REPO / "configs" / "tiny-cpu.toml", "--out", reference,
        *train_flags(shards, steps), "--nproc", 2, timeout=600)
    a, b = params(out), params(reference)
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_a_time_limit_is_met_by_the_job_clock_and_the_requeued_run_ends_bit_identical(
        slurm, shards, tmp_path):
    steps = 45  # ≥ 45 × 1.5 s = 67.5 s of steps: more than a 1-minute start holds
    out = tmp_path / "run"
    flags = train_flags(shards, steps, "--end-margin-s", 10)
    job, log = submit(slurm, tmp_path, "limit", out, flags, script=without_signal(tmp_path),
                      env={"RSD_TRAIN_FAULT_STEP_SLEEP_S": STEP_S})
    # Each start: up to a minute, the requeue delay (11 s), start-up.
    output = assert_ran_to_the_end(slurm, job, log, out, steps)
    assert int(slurm.job_field(job, "Restarts")) >= 1, output
    assert "rsd-train: the job ends in" in output and "squeue, SLURM job" in output, output
    assert "stopped before the job's end time at step" in output, output
    assert "requeueing job" in output and "made no progress" not in output, output
    assert "exiting now" not in output and "received" not in output, output
    assert_equals_nproc_2(shards, out, tmp_path, steps)


def test_a_signal_ahead_of_the_time_limit_stops_and_requeues_to_the_end(slurm, shards, tmp_path):
    steps = 40  # ≥ 60 s of steps: the first start ends before them, by the signal
    out = tmp_path / "run"
    # The job clock off: SIGUSR1 from --signal, 60-90 s before a 2-minute limit, stops each start.
    flags = train_flags(shards, steps, "--end-margin-s", 0)
    job, log = submit(slurm, tmp_path, "usr1", out, flags, time_limit="2", signal="USR1@60",
                      env={"RSD_TRAIN_FAULT_STEP_SLEEP_S": STEP_S})
    output = assert_ran_to_the_end(slurm, job, log, out, steps)
    assert int(slurm.job_field(job, "Restarts")) >= 1, output
    assert "SIGUSR1 received" in output and "requeueing job" in output, output
    assert "SIGTERM" not in output and "exiting now" not in output, output


def test_the_time_limits_two_sigterms_are_one_stop_with_a_checkpoint(slurm, shards, tmp_path):
    out = tmp_path / "run"
    flags = train_flags(shards, 100000, "--end-margin-s", 0)
    job, log = submit(slurm, tmp_path, "sigterm", out, flags, script=without_signal(tmp_path),
                      env={"RSD_TRAIN_FAULT_STEP_SLEEP_S": STEP_S})
    wait_for("the first step", lambda: steps_logged(out), timeout=300)
    # Then the limit (1 min), slurmctld's 30 s check and KillWait; the rest guards a hang.
    state, _ = slurm.wait_job(job, states=("TIMEOUT", "COMPLETED", "FAILED", "CANCELLED",
                                           "PENDING", "REQUEUED"), timeout=600)
    output = text(log)
    assert "rsd-train: SIGTERM received" in output, output
    assert "SIGTERM received again: already stopping" in output, output
    assert "exiting now" not in output, output
    # Nothing lost but the step in flight: the newest checkpoint holds the last step logged,
    # and it is complete (no unfinished one left).
    logged = steps_logged(out)
    assert logged and checkpoints(out)[-1] == logged[-1], (logged, checkpoints(out), output)
    assert not list((out / "checkpoints").glob(".step-*")), output
    assert "stopped on a signal at step" in output, output
    # SLURM ended the job: the script keeps its checkpoint and does not requeue it.
    assert state == "TIMEOUT", output
    assert "not requeueing a job SLURM ended" in output, output


def test_scancel_usr1_requeues_and_plain_scancel_stops_for_good(slurm, shards, tmp_path):
    out = tmp_path / "run"
    flags = train_flags(shards, 100000)
    # A lead of a minute in a 10-minute limit: the warning never comes while the test runs.
    job, log = submit(slurm, tmp_path, "scancel", out, flags, time_limit="10", signal="USR1@60",
                      env={"RSD_TRAIN_FAULT_STEP_SLEEP_S": 0.5})
    wait_for("two steps", lambda: len(steps_logged(out)) >= 2)
    slurm.cancel(job, signal="USR1")
    wait_for("the requeued start", lambda: int(slurm.job_field(job, "Restarts")) == 1
             and slurm.job_field(job, "JobState") == "RUNNING")
    first = checkpoints(out)[-1]
    wait_for("a step of the second start", lambda: len(steps_logged(out)) >= first + 2)
    slurm.cancel(job)
    state, _ = slurm.wait_job(job, timeout=300)
    output = text(log)
    assert state == "CANCELLED", output
    assert int(slurm.job_field(job, "Restarts")) == 1, output
    assert "SIGUSR1 received" in output and "SIGTERM received" in output, output
    logged = steps_logged(out)
    assert logged == list(range(1, logged[-1] + 1)), logged
    assert checkpoints(out)[-1] == logged[-1] > first, (checkpoints(out), logged, output)
    assert output.count("requeueing job") == 1, output
    assert "not requeueing a job SLURM ended" in output, output


def test_a_second_job_leaves_a_running_jobs_checkpoint_alone(slurm, shards, tmp_path):
    out = tmp_path / "run"
    release = tmp_path / "release"
    flags = train_flags(shards, 4, save_every=2)
    # The first job's rank 0 holds in its first checkpoint's writing until released.
    first, first_log = submit(slurm, tmp_path, "first", out, flags, time_limit="10",
                              signal="USR1@60", env={"RSD_TRAIN_FAULT_SAVE_WAITS_FOR": release})
    wait_for("the first job's unfinished checkpoint",
             lambda: list((out / "checkpoints").glob(".step-00000002.tmp-*")))
    (unfinished,) = list((out / "checkpoints").glob(".step-00000002.tmp-*"))
    second, second_log = submit(slurm, tmp_path, "second", out, flags, time_limit="10",
                                signal="USR1@60")
    state, code = slurm.wait_job(second, timeout=300)
    output = text(second_log)
    assert state == "FAILED" and code == "1:0", output
    assert "is in use by another rsd-train run" in output and f"SLURM job {first}" in output
    assert "rm " in output and "requeueing" not in output, output
    assert int(slurm.job_field(second, "Restarts")) == 0
    assert unfinished.exists(), "the running job's unfinished checkpoint was left alone"
    release.touch()
    state, code = slurm.wait_job(first, timeout=300)
    assert (state, code) == ("COMPLETED", "0:0"), text(first_log)
    assert checkpoints(out)[-1] == 4 and steps_logged(out) == [1, 2, 3, 4], text(first_log)


def test_a_start_without_progress_is_not_requeued(slurm, shards, tmp_path):
    out = tmp_path / "run"
    # A margin longer than the whole limit: the job is too near its end from its first step.
    flags = train_flags(shards, 10, "--end-margin-s", 300)
    job, log = submit(slurm, tmp_path, "noprogress", out, flags)
    state, code = slurm.wait_job(job, timeout=300)
    output = text(log)
    assert (state, code) == ("FAILED", "75:0"), output
    assert "stopped before the job's end time at step 0" in output, output
    assert "this start made no progress" in output and "not requeueing" in output, output
    assert int(slurm.job_field(job, "Restarts")) == 0
    assert steps_logged(out) == []
