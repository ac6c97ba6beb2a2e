"""rsd-train under SLURM without torchrun, the lock on a run directory, and the sbatch scripts.

* Two processes started with only the variables srun gives its tasks (SLURM_PROCID,
  SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE,
  SLURM_JOB_ID; no RANK, WORLD_SIZE or MASTER_*) train one data-parallel run of 2 ranks: the
  rendezvous port is derived from the job id (15000 + (16·job + step) mod 14983), rank 0 says what
  it took from where, and the run equals `--nproc 2` bit for bit, with one metrics.jsonl.
* `--nproc` in a step of several tasks, and a malformed SLURM variable, exit 2 with one line.
* A second run into a directory a running run holds is refused at once, naming the holder; the
  lock goes with the process (kill -9), and the same command then continues.
* pipelines/slurm/*.sbatch under a fake `srun` (N local tasks with SLURM's variables) and a fake
  `scontrol` (records its arguments): a tiny run trains to the end; a step that stops with exit 75
  is requeued (`scontrol requeue JOBID`), also when srun's own status is another one (srun's
  --kill-on-bad-exit stops the ranks still running when the first exits 75); a failure is not.

Binaries: $RSD_BIN_DIR (default <repo>/target/debug): rsd-data and rsd-train.
"""
import json
import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from rsd_cli import exe, run
from test_train_dp import assert_same_run, metrics, train_args

REPO = Path(__file__).resolve().parent.parent
SBATCH = sorted((REPO / "pipelines" / "slurm").glob("*.sbatch"))

# What torchrun (or an outer launcher, or a test run under SLURM) may have set: none of it may
# reach the tasks these tests start.
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT", "RSD_TRAIN_NOTES_SHOWN")


@pytest.fixture(scope="module")
def shards(mini_shards):
    """Runs compared with each other: the small vocabulary's shards (conftest)."""
    return mini_shards


def clean_env():
    return {k: v for k, v in os.environ.items()
            if k not in LAUNCH_VARS and not k.startswith(("SLURM", "TORCHELASTIC_"))}


def port_is_free(port):
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def slurm_job_with_free_port():
    """A SLURM job id whose derived port, 15000 + (16·job + step 0) mod 14983, is free here."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(15000, 29983)
        if port_is_free(port):
            # 16 · 8428 ≡ 1 (mod 14983): the job id whose port this is, plus whole periods.
            job = (port - 15000) * 8428 % 14983 + 14983 * rng.randrange(1, 1000)
            assert 15000 + 16 * job % 14983 == port
            return job, port
    raise AssertionError("no free port in 15000..29982")


def task_env(rank, ntasks, job, **extra):
    """The variables srun gives task `rank` of `ntasks` on one node, and nothing of torchrun's."""
    env = clean_env()
    env.update(SLURM_JOB_NODELIST="localhost", SLURM_NTASKS=str(ntasks),
               SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank), SLURM_NODEID="0",
               SLURM_TASKS_PER_NODE=str(ntasks), SLURM_JOB_ID=str(job), SLURM_STEP_ID="0")
    env.update(extra)
    return env


def test_srun_tasks_without_torchrun_train_one_run_as_nproc_does(shards, tmp_path):
    batch = ["--micro-batch", 2, "--tokens-per-step", 512]
    run("rsd-train", *train_args(shards, tmp_path / "nproc", *batch), "--nproc", 2)
    out = tmp_path / "slurm"
    job, port = slurm_job_with_free_port()
    argv = [exe("rsd-train"), *map(str, train_args(shards, out, *batch))]
    tasks = [subprocess.Popen(argv, env=task_env(rank, 2, job), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    try:
        ends = [t.communicate(timeout=240) for t in tasks]
    finally:
        for t in tasks:
            t.kill()
    for rank, (t, (_, err)) in enumerate(zip(tasks, ends)):
        assert "panicked" not in err, err
        assert t.returncode == 0, f"rank {rank} exited {t.returncode}:\n{err}"
    err0, err1 = ends[0][1], ends[1][1]
    assert (f"rsd-train: SLURM job {job} (no torchrun): rank 0 of 2 (SLURM_PROCID/SLURM_NTASKS), "
            f"2 on this node (SLURM_TASKS_PER_NODE), rendezvous localhost:{port} (first host of "
            f"SLURM_JOB_NODELIST; port from the job and step ids, set MASTER_PORT to choose)") \
        in err0, err0
    assert "SLURM job" not in err1, err1
    # One run of 2 data-parallel ranks (what `--nproc 2` prints), not two runs of one.
    assert "rsd-train: 2 data-parallel ranks" in err0, err0
    assert "done: 3 steps" in err0, err0
    assert sorted(p.relative_to(out) for p in out.rglob("metrics.jsonl")) == [Path("metrics.jsonl")]
    assert_same_run(tmp_path / "nproc", out, loss_rel=0, param_abs=0.0)
    # Rank 0 held the run directory's lock and named itself in it.
    holder = json.loads((out / ".rsd-train.lock").read_text())
    assert holder["pid"] == tasks[0].pid and holder["slurm_job"] == str(job), holder


def test_nproc_in_a_step_of_several_tasks_is_refused(shards, tmp_path):
    p = run("rsd-train", *train_args(shards, tmp_path / "x"), "--nproc", 2, check=False,
            env=task_env(0, 2, 1234), timeout=60)
    assert p.returncode == 2, p.stderr
    assert ("--nproc 2 in a SLURM step of 2 tasks (SLURM_NTASKS): srun already started a rank per "
            "task: either use one task per GPU") in p.stderr, p.stderr
    assert not (tmp_path / "x").exists()


def test_slurm_variables_outside_a_job_step_are_left_alone(shards, tmp_path):
    # The batch script's own shell (or a login shell that inherited a job's variables): no
    # SLURM_STEP_ID, so rsd-train is one process, as anywhere else, whatever SLURM_NTASKS says.
    env = {k: v for k, v in task_env(0, 16, 1234).items() if k != "SLURM_STEP_ID"}
    p = run("rsd-train", "--help", env=env, timeout=60)
    assert "Usage" in p.stdout, p.stdout + p.stderr
    p = run("rsd-train", *train_args(shards, tmp_path / "x", steps=1), env=env, timeout=120)
    assert "rsd-train: SLURM job" not in p.stderr and "done: 1 steps" in p.stderr, p.stderr


@pytest.mark.parametrize("name,value,why", [
    ("SLURM_JOB_NODELIST", "gpu[01-", "a '[' is never closed"),
    ("SLURM_TASKS_PER_NODE", "2(x3", "the tasks on each node, e.g. 4(x2),3"),
    ("SLURM_PROCID", "2", "a rank below SLURM_NTASKS=2"),
])
def test_a_malformed_slurm_variable_exits_2_naming_it(shards, tmp_path, name, value, why):
    p = subprocess.run([exe("rsd-train"), *map(str, train_args(shards, tmp_path / "x"))],
                       env={**task_env(0, 2, 1234), name: value}, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"rsd-train: error: SLURM variable {name}={value} is invalid; expected "), p.stderr
    assert why in lines[0], p.stderr


def test_a_second_run_into_a_running_runs_directory_is_refused(shards, tmp_path):
    out = tmp_path / "run"
    log = open(tmp_path / "first.log", "w")
    first = subprocess.Popen(
        [exe("rsd-train"), *map(str, train_args(shards, out, "--tokens-per-step", 128,
                                                steps=100000))],
        env=clean_env(), stdout=subprocess.DEVNULL, stderr=log)
    try:
        lock = out / ".rsd-train.lock"
        # The deadline only guards against a hang; 100,000 steps outlast the test on any machine.
        deadline = time.monotonic() + 120
        while True:
            assert first.poll() is None, (tmp_path / "first.log").read_text()
            assert time.monotonic() < deadline, "the first run never took its lock"
            try:
                if json.loads(lock.read_text())["pid"] == first.pid:
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.1)
        t0 = time.monotonic()
        p = run("rsd-train", *train_args(shards, out, steps=1), check=False, env=clean_env(),
                timeout=60)
        assert p.returncode == 1, p.stderr
        # Refused at once, not after a wait for the lock (which the first run's 100,000 steps
        # hold for minutes at the least): ~2 s, ~4 s with both cores of a 2-core machine busy.
        assert time.monotonic() - t0 < 30
        assert (f"rsd-train: error: {out} is in use by another rsd-train run (pid {first.pid} on "
                f"host {socket.gethostname()}, since ") in p.stderr, p.stderr
        assert (" UTC): two jobs writing one run directory would mix their checkpoints; wait for "
                "it to end, or choose another --out") in p.stderr, p.stderr
        assert first.poll() is None, "the first run goes on"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
        log.close()
    # kill -9 released the lock with the process: the same command continues (it restarts the
    # run, which had no checkpoint yet).
    p = run("rsd-train", *train_args(shards, out, steps=1), "--resume", "auto", env=clean_env(),
            timeout=120)
    assert [r["step"] for r in metrics(out)] == [1], p.stderr


FAKE_SRUN = r"""#!/bin/bash
# srun on one machine: starts $FAKE_SRUN_NTASKS tasks of the command (options before it are
# recorded, not used) with the variables srun gives its tasks, waits for them, and exits with
# the highest status, as srun does.
echo "$*" >> "$FAKE_LOG/srun.args"
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
n=${FAKE_SRUN_NTASKS:-2}
pids=()
for ((i = 0; i < n; i++)); do
    SLURM_PROCID=$i SLURM_LOCALID=$i SLURM_NODEID=0 SLURM_NTASKS=$n SLURM_TASKS_PER_NODE=$n \
        SLURM_STEP_ID=0 SLURM_STEP_NODELIST=localhost SLURM_STEP_TASKS_PER_NODE=$n \
        SLURMD_NODENAME=localhost "$@" &
    pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do
    wait "$pid"
    s=$?
    if [ "$s" -gt "$rc" ]; then rc=$s; fi
done
exit "$rc"
"""

FAKE_SCONTROL = """#!/bin/bash
echo "$*" >> "$FAKE_LOG/scontrol.args"
"""


def fake_slurm(tmp_path):
    """A directory holding the fake srun and scontrol, and one for what they record."""
    bin_dir, log = tmp_path / "fakebin", tmp_path / "fakelog"
    bin_dir.mkdir()
    log.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir, log


def sbatch(script, tmp_path, job, **env):
    """Runs an sbatch script as SLURM would start it (its job's variables, this directory),
    with the fake srun and scontrol first on PATH."""
    bin_dir, log = fake_slurm(tmp_path)
    full = {**clean_env(), "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(log),
            "SLURM_JOB_ID": str(job), "SLURM_JOB_NODELIST": "localhost",
            "SLURM_SUBMIT_DIR": str(tmp_path), **env}
    p = subprocess.run(["bash", str(script)], cwd=tmp_path, env=full, capture_output=True,
                       text=True, timeout=240)
    requeues = (log / "scontrol.args").read_text() if (log / "scontrol.args").exists() else ""
    return p, (log / "srun.args").read_text(), requeues


@pytest.mark.parametrize("script", SBATCH, ids=lambda p: p.name)
def test_an_sbatch_script_trains_a_tiny_run_to_the_end(shards, tmp_path, script):
    job, _ = slurm_job_with_free_port()
    out = tmp_path / "run"
    flags = train_args(shards, out, "--micro-batch", 2, "--tokens-per-step", 512)
    # The config and --out come from the script (RSD_CONFIG, RSD_OUT); the rest are extra flags.
    extra = [str(a) for a in flags[2:] if str(a) not in ("--out", str(out))]
    p, srun_args, requeues = sbatch(
        script, tmp_path, job, RSD_BIN=exe("rsd-train"),
        RSD_CONFIG=str(REPO / "configs" / "tiny-cpu.toml"), RSD_OUT=str(out),
        RSD_TRAIN_ARGS=" ".join(extra))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "panicked" not in p.stderr, p.stderr
    assert srun_args.startswith("--kill-on-bad-exit=1 bash -c"), srun_args
    assert (f"rsd-task {exe('rsd-train')} --config {REPO / 'configs' / 'tiny-cpu.toml'} --out "
            f"{out} --resume auto ") in srun_args, srun_args
    assert requeues == ""
    assert f"rsd-train: SLURM job {job} (no torchrun): rank 0 of 2" in p.stderr, p.stderr
    assert "rsd-train: 2 data-parallel ranks" in p.stderr, p.stderr
    assert [r["step"] for r in metrics(out)] == [1, 2, 3]
    assert list((out / "model").glob("*.safetensors")), list(out.iterdir())
    assert not list(out.glob(".slurm-stopped-*"))


FAKE_RSD_TRAIN = """#!/bin/bash
# rsd-train's exit statuses without its work: rank 0 exits $RANK0_EXIT, the others $OTHERS_EXIT;
# with PROGRESS=1 rank 0 first publishes a checkpoint one step past the newest (as a run that
# trained before it stopped does).
out=$4
if [ "$SLURM_PROCID" = 0 ]; then
    if [ "${PROGRESS:-0}" = 1 ]; then
        n=$(ls -1d "$out"/checkpoints/step-* 2>/dev/null | wc -l)
        mkdir -p "$out/checkpoints/$(printf 'step-%08d' $((n + 1)))"
    fi
    exit "$RANK0_EXIT"
fi
sleep 0.2
exit "$OTHERS_EXIT"
"""


@pytest.mark.parametrize("script", SBATCH, ids=lambda p: p.name)
@pytest.mark.parametrize("rank0,others,progress,requeued,status", [
    (75, 75, True, True, 0),     # every rank stopped with a checkpoint, after progress
    (143, 75, True, True, 0),    # --kill-on-bad-exit sent SIGTERM to rank 0 as the others exited 75
    (75, 75, False, False, 75),  # stopped, but no step since the start: not requeued (no loop)
    (1, 3, True, False, 3),      # a failure is not retried (srun: the highest status)
    (0, 0, True, False, 0),      # the run ended
])
def test_an_sbatch_script_requeues_a_run_stopped_with_a_checkpoint(tmp_path, script, rank0,
                                                                   others, progress, requeued,
                                                                   status):
    fake = tmp_path / "rsd-train"
    fake.write_text(FAKE_RSD_TRAIN)
    fake.chmod(0o755)
    p, srun_args, requeues = sbatch(script, tmp_path, 4242, RSD_BIN=str(fake),
                                    RSD_OUT=str(tmp_path / "run"), RANK0_EXIT=str(rank0),
                                    OTHERS_EXIT=str(others), PROGRESS=str(int(progress)))
    assert p.returncode == status, p.stdout + p.stderr
    assert requeues == ("requeue 4242\n" if requeued else ""), p.stdout + p.stderr
    if (rank0, progress) == (75, False):
        assert "this start made no progress" in p.stdout and "not requeueing" in p.stdout
    # The same command every time: the script's config, its run directory, --resume auto.
    default = script.name.removesuffix(".sbatch")
    assert f" --config configs/{default}.toml --out {tmp_path / 'run'} --resume auto" in srun_args


@pytest.mark.parametrize("script", SBATCH, ids=lambda p: p.name)
def test_an_sbatch_script_stops_requeueing_at_its_cap(tmp_path, script):
    fake = tmp_path / "rsd-train"
    fake.write_text(FAKE_RSD_TRAIN)
    fake.chmod(0o755)
    p, _, requeues = sbatch(script, tmp_path, 4242, RSD_BIN=str(fake),
                            RSD_OUT=str(tmp_path / "run"), RANK0_EXIT="75", OTHERS_EXIT="75",
                            PROGRESS="1", SLURM_RESTART_COUNT="3", RSD_MAX_RESTARTS="3")
    assert p.returncode == 75 and requeues == "", p.stdout + p.stderr
    assert "after 3 restarts (RSD_MAX_RESTARTS=3): not requeueing" in p.stdout, p.stdout
    assert not list((tmp_path / "run").glob(".slurm-stopped-*"))
