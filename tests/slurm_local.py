"""The real two-node SLURM that scripts/slurm-local.sh starts (scripts/test.sh runs its `start`
before pytest), for tests that submit real jobs.

A test takes the `slurm` fixture (import it into the test module: `from slurm_local import slurm`)
and submits with the helpers below. The fixture skips only when RSD_TEST_NO_SLURM=1; otherwise a
SLURM that is not up FAILS the test with the reason: a suite that quietly skips the real SLURM
hides the defects these tests are there to find.

What the local cluster does (docs/TESTS.md, "The real SLURM in the suite"): two nodes on this
host, the first named after it (`slurm.node`, where a one-node job runs while it has CPUs), the
second the same with "-2" (`slurm.nodes` holds both, first the first), each with its own slurmd
and more CPUs declared than the machine has (8 each on a 2-core box, CR_CPU), so both pytest
workers' jobs run side by side and `--nodes=2` spreads a job over two "machines"; KillWait=15
(SIGTERM to SIGKILL); MinJobAge=300 (a finished job's record, read here with scontrol since there
is no accounting and so no sacct, stays 300 s); a requeued job is eligible again 11 s after it
has finished completing. slurmctld checks time limits every 30 s, so a job's SIGTERM at its limit
lands 0-30 s after its EndTime, and a `--signal=SIG@N` warning N to N+30 s before it (at the
first check after EndTime - N - 30; one due before the job's script or step has started is
lost).
"""

import os
import re
import shutil
import subprocess
import time
import types
from pathlib import Path

import pytest

# Every state a job ends in (a requeued job passes through PENDING again; it is not final).
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "PREEMPTED", "BOOT_FAIL", "DEADLINE")
# A node that takes jobs; the other pytest worker's jobs may be running on it.
READY_NODE_STATES = ("idle", "mixed", "allocated", "completing")
START_HINT = ("start it with `bash scripts/slurm-local.sh start` (scripts/test.sh does), "
              "or set RSD_TEST_NO_SLURM=1 to skip the tests that need it")


def clean_env(env=None):
    """This process's environment without what an enclosing SLURM job or allocation set
    (SLURM_*, SBATCH_*, SRUN_*, SALLOC_*: they would make sbatch and srun act on that job), plus
    `env`."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
    return {**base, **{k: str(v) for k, v in (env or {}).items()}}


def _slurm(*cmd, timeout=30, check=True, **kwargs):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                       env=kwargs.pop("env", clean_env()), **kwargs)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed (exit {p.returncode}):\n"
                             f"{p.stdout}{p.stderr}")
    return p


def _why_not_available():
    """None when SLURM answers and a node takes jobs, else the reason."""
    if shutil.which("sinfo") is None:
        return "sinfo is not installed (no SLURM on this machine)"
    try:
        p = _slurm("sinfo", "-h", "-o", "%n %T", timeout=15, check=False)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer in 15 s (slurmctld down or hung)"
    if p.returncode != 0:
        return f"sinfo failed (exit {p.returncode}): {p.stderr.strip()}"
    nodes = [line.split() for line in p.stdout.splitlines() if line.strip()]
    if not any(state in READY_NODE_STATES for _, state in nodes):
        return f"no node takes jobs (sinfo: {p.stdout.strip() or 'no nodes'})"
    return None


def slurm_available():
    """True when sinfo answers and a node is idle (or already running jobs)."""
    return _why_not_available() is None


def sbatch(script, *args, env=None, cwd=None):
    """Submit `script` (a path, or the text of a script, which goes to sbatch on stdin) with
    sbatch's ARGS; return the job id (int). env: variables added to the clean environment
    (clean_env), which sbatch exports to the job. cwd: the job's working directory (sbatch's own
    default is the directory it runs in)."""
    text = None
    if isinstance(script, str) and "\n" in script:
        text = script
        cmd = ["sbatch", "--parsable", *args]
    else:
        cmd = ["sbatch", "--parsable", *args, str(script)]
    p = _slurm(*cmd, input=text, env=clean_env(env), cwd=cwd)
    # --parsable prints "jobid" or "jobid;cluster".
    return int(p.stdout.strip().split(";")[0])


def _parse_job_line(line):
    # `scontrol show job -o`: Key=Value pairs separated by spaces on one line. Keys may hold ':'
    # or '/' (AllocNode:Sid, Socks/Node); a value may itself hold spaces (Command with arguments),
    # so split only before a space that starts a new Key=.
    fields = {}
    for part in re.split(r" (?=[A-Za-z][\w:/]*=)", line.strip()):
        key, _, value = part.partition("=")
        fields[key] = value
    return fields


def job_info(job_id):
    """Every field of `scontrol show job -o JOB` as a dict of strings (times as this machine's
    local time, 2026-12-08T00:06:12, unless SLURM_TIME_FORMAT says otherwise). Raises LookupError
    once the job's record is gone (MinJobAge=300 s after it ended)."""
    p = _slurm("scontrol", "show", "job", "-o", job_id, check=False)
    if p.returncode != 0 or not p.stdout.strip():
        raise LookupError(f"job {job_id}: no record in slurmctld ({(p.stderr or p.stdout).strip()};"
                          " records of finished jobs are kept MinJobAge=300 s)")
    return _parse_job_line(p.stdout.splitlines()[0])


def job_field(job_id, name):
    """One field of `scontrol show job JOB` (JobState, ExitCode, Restarts, EndTime, ...)."""
    info = job_info(job_id)
    if name not in info:
        raise KeyError(f"job {job_id} has no field {name!r}; it has {sorted(info)}")
    return info[name]


def wait_job(job_id, states=FINAL_STATES, timeout=300, poll=0.5):
    """Poll scontrol until the job's JobState is one of `states`; return (state, exit_code) with
    exit_code as scontrol gives it ("status:signal", e.g. "0:0", "1:0", "0:9"). A timeout raises
    with the job's last record."""
    deadline = time.monotonic() + timeout
    info = {}
    while True:
        info = job_info(job_id)
        state = info.get("JobState", "").split()[0]
        if state in states:
            return state, info.get("ExitCode", "")
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} not in {states} after {timeout} s: JobState={state} "
                               f"Reason={info.get('Reason')} (stdout: {info.get('StdOut')})")
        time.sleep(poll)


def cancel(job_id, signal=None, full=False):
    """scancel JOB; with signal, only send it (scancel --signal: to the job's steps, not the batch
    shell, unless full); full=True also signals the batch shell (scancel --full)."""
    cmd = ["scancel"]
    if signal is not None:
        cmd.append(f"--signal={signal}")
    if full:
        cmd.append("--full")
    _slurm(*cmd, job_id)


@pytest.fixture(scope="session")
def slurm():
    """The local SLURM: skipped only with RSD_TEST_NO_SLURM=1, a failure when it is not up.
    Gives the first node's name (node) and CPU count (cpus), every node's name (nodes, the first
    node first: in order of Weight, then name) and the helpers of this module."""
    if os.environ.get("RSD_TEST_NO_SLURM") == "1":
        pytest.skip("RSD_TEST_NO_SLURM=1: the tests that need a real SLURM are not run")
    why = _why_not_available()
    if why is not None:
        pytest.fail(f"no usable SLURM: {why}; {START_HINT}", pytrace=False)
    p = _slurm("sinfo", "-h", "-N", "-o", "%w %N %c")
    # One line per node (and partition it is in): weight, name, CPUs.
    lines = [line.split() for line in p.stdout.splitlines() if line.strip()]
    rows = sorted({(int(w), name, int(c)) for w, name, c in lines})
    return types.SimpleNamespace(node=rows[0][1], nodes=[name for _, name, _ in rows],
                                 cpus=rows[0][2], sbatch=sbatch, wait_job=wait_job,
                                 job_field=job_field, job_info=job_info, cancel=cancel,
                                 env=clean_env, repo=Path(__file__).resolve().parent.parent)
