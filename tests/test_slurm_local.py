"""The local SLURM itself (scripts/slurm-local.sh, tests/slurm_local.py): what a job sees and
receives there, which the tests of rsd under SLURM rely on.

* A step of two tasks: SLURM_PROCID 0 and 1, SLURM_NTASKS 2, one job and step id, and the
  step's reserved ports (MpiParams=ports: ntasks + 1 of them).
* A step over both nodes (`-N2`): a task on each, each told its own node (SLURMD_NODENAME), the
  node list compressed as on a real cluster, and every node's name resolving (rank 0's host is
  taken from that list and connected to).
* A job at its 1-minute time limit: its step's task gets SIGTERM 0-30 s after the job's EndTime
  (on SLURM 22.05 twice: SIGTERM, SIGCONT, SIGTERM within ~20 ms), lives on while it handles
  them, and is killed (SIGKILL) KillWait (15 s) after the first; the job ends TIMEOUT.
* `scontrol requeue` from the batch script: the job runs again with SLURM_RESTART_COUNT=1 (unset
  on the first run), no sooner than 11 s later (AuthInfo=cred_expire=10, plus 1).

Each takes a few CPUs of the node's 8 (more than the machine has), so both pytest workers' jobs
run at once.
"""
import subprocess

from slurm_local import clean_env, slurm  # noqa: F401  (slurm is a fixture)

KILL_WAIT = 15         # slurm.conf's KillWait (scripts/slurm-local.sh)
TIMELIMIT_CHECK = 30   # slurmctld checks time limits every 30 s (PERIODIC_TIMEOUT, not configurable)

# A task that logs each catchable signal it gets ("<epoch> SIG") and ticks every 0.2 s; bash runs
# a trap only between commands, so it waits on a background sleep to take signals at once. The
# time is bash's own $EPOCHREALTIME, not `$(date)`: SLURM signals every process of the step, and a
# `date` child killed by the second SIGTERM would leave a line without its time.
TASK = r"""#!/bin/bash
log() { echo "$EPOCHREALTIME $1" >> "$OUT.task$SLURM_PROCID"; }
for s in TERM USR1 CONT INT HUP; do trap "log $s" $s; done
log start
while :; do sleep 0.2 & wait $!; echo "$EPOCHREALTIME" > "$OUT.tick$SLURM_PROCID"; done
"""


def _events(path):
    return [(float(t), what) for t, what in (line.split(maxsplit=1)
                                            for line in path.read_text().splitlines())]


def test_srun_two_tasks(slurm):
    p = subprocess.run(["srun", "-n2", "--time=1", "bash", "-c",
                        "echo $SLURM_PROCID $SLURM_NTASKS $SLURM_JOB_ID $SLURM_STEP_ID "
                        "$SLURM_STEP_NUM_TASKS $SLURM_JOB_NODELIST $SLURM_STEP_RESV_PORTS"],
                       # A deadline against a hang only (under a second here).
                       capture_output=True, text=True, timeout=120, env=clean_env())
    assert p.returncode == 0, p.stderr
    rows = sorted(line.split() for line in p.stdout.splitlines())
    assert [r[0] for r in rows] == ["0", "1"], p.stdout
    assert {tuple(r[1:]) for r in rows} == {tuple(rows[0][1:])}, "tasks disagree:\n" + p.stdout
    ntasks, job_id, step_id, step_tasks, nodelist, ports = rows[0][1:]
    assert (ntasks, step_id, step_tasks) == ("2", "0", "2"), p.stdout
    # One node: the first while it has 2 CPUs free (its lower Weight), else the other.
    assert nodelist in slurm.nodes, p.stdout
    assert int(job_id) > 0
    lo, hi = map(int, ports.split("-"))
    assert 12000 <= lo and hi - lo + 1 == 3 and hi <= 12999, ports


def test_time_limit_sigterm_then_kill(slurm, tmp_path):
    (tmp_path / "task.sh").write_text(TASK)
    out = tmp_path / "log"
    job = slurm.sbatch(f"""#!/bin/bash
SLURM_TIME_FORMAT=%s squeue -h -j $SLURM_JOB_ID -o %e > {out}.end
srun -n1 bash {tmp_path}/task.sh
""", "--time=1", "-o", tmp_path / "slurm.out", env={"OUT": out})
    # The limit, the check's period, KillWait, and 120 s against a hang only.
    state, exit_code = slurm.wait_job(job, timeout=60 + TIMELIMIT_CHECK + KILL_WAIT + 120)
    assert state == "TIMEOUT", (state, exit_code, (tmp_path / "slurm.out").read_text())
    end = float((tmp_path / "log.end").read_text())
    events = _events(tmp_path / "log.task0")
    terms = [t for t, what in events if what == "TERM"]
    assert terms, f"the task never got SIGTERM: {events}"
    # Never before EndTime (1 s: EndTime is in whole seconds); after it, at slurmctld's first
    # time-limit check (every 30 s: 0-30 s late, ~0.5-27 s seen idle). The 30 s beyond that only
    # guards against a signal that never comes, with a wide margin for a loaded machine.
    assert end - 1 <= terms[0] <= end + TIMELIMIT_CHECK + 30, (end, events)
    # Twice in every run seen on SLURM 22.05: a handler must not take a second SIGTERM for
    # "exit now".
    assert len(terms) in (1, 2), events
    # The task handled them and lived on until SIGKILL, which slurmd sends KillWait after the
    # SIGTERM (4.6-4.7 s between the first SIGTERM and the last 0.2 s tick, seen idle). A lower
    # bound only: 1 s below KillWait is the margin for a tick delayed on a loaded machine; the
    # job's end (TIMEOUT, above) is what says the task was killed.
    last_tick = float((tmp_path / "log.tick0").read_text())
    assert last_tick >= terms[0] + KILL_WAIT - 1, (terms, last_tick)
    assert "DUE TO TIME LIMIT" in (tmp_path / "slurm.out").read_text()


def test_requeue_counts_restarts(slurm, tmp_path):
    log = tmp_path / "runs"
    job = slurm.sbatch(f"""#!/bin/bash
echo "$(date +%s.%N) ${{SLURM_RESTART_COUNT:-unset}}" >> {log}
if [ -z "${{SLURM_RESTART_COUNT:-}}" ]; then
  scontrol requeue $SLURM_JOB_ID
  sleep 60   # SIGTERM from the requeue ends it
fi
""", "--time=5", "-o", tmp_path / "slurm.out")
    # ~12 s here; 180 s only guards against a hang.
    state, exit_code = slurm.wait_job(job, timeout=180)
    assert (state, exit_code) == ("COMPLETED", "0:0"), (tmp_path / "slurm.out").read_text()
    runs = [line.split() for line in log.read_text().splitlines()]
    assert [count for _, count in runs] == ["unset", "1"], runs
    assert slurm.job_field(job, "Restarts") == "1"
    assert slurm.job_field(job, "Requeue") == "1"
    # Eligible again cred_expire + 1 = 11 s after the job has finished completing (12 s between
    # the runs, seen idle); a lower bound only.
    assert float(runs[1][0]) - float(runs[0][0]) >= 10, runs


def test_srun_across_both_nodes(slurm):
    assert len(slurm.nodes) == 2, slurm.nodes
    # Each task: its rank, its node, the job's node list expanded, the step's node count and
    # tasks per node, its reserved ports, and how many of the listed hosts resolve.
    p = subprocess.run(["srun", "-N2", "-n2", "--time=1", "bash", "-c",
                        "hosts=$(scontrol show hostnames $SLURM_JOB_NODELIST | paste -sd,); "
                        "echo $SLURM_PROCID $SLURMD_NODENAME $hosts $SLURM_STEP_NUM_NODES "
                        "$SLURM_TASKS_PER_NODE $SLURM_STEP_RESV_PORTS "
                        "$(getent hosts ${hosts//,/ } | wc -l)"],
                       # A deadline against a hang only (about a second here).
                       capture_output=True, text=True, timeout=120, env=clean_env())
    assert p.returncode == 0, p.stderr
    rows = sorted(line.split() for line in p.stdout.splitlines())
    assert [r[:2] for r in rows] == [["0", slurm.nodes[0]], ["1", slurm.nodes[1]]], p.stdout
    both = ",".join(slurm.nodes)
    assert {tuple(r[2:]) for r in rows} == {(both, "2", "1(x2)", rows[0][5], "2")}, p.stdout
