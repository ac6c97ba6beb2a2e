"""rsd-train across two SLURM nodes (the local cluster's two slurmd, scripts/slurm-local.sh): the
shipped sbatch script with `--nodes=2 --ntasks-per-node=1` runs a tiny data-parallel run of one
CPU task per node, as on two machines.

* The run reaches its end: rank 0 on the first node takes the rendezvous from the job's node list
  (its first host, which must resolve) and rank 1 on the second node connects to it; the final
  weights are bit-identical to a local `rsd-train --nproc 2` run of the same flags.
* A loopback MASTER_ADDR left in the job's environment (as from a one-node test) is refused on two
  nodes with exit 2 before any rank waits for the others: the other node's ranks would connect to
  themselves. (A rank that srun's --kill-on-bad-exit SIGTERM reaches while it is still loading,
  after the first rank's exit, ends 143 instead, and so does the job.)

The two nodes are one machine: rsd-train's placement, which names a rank's host by gethostname,
sees both ranks on one host; what crosses "nodes" here is SLURM's side (the node list, the tasks
per node, a slurmd per node) and the rendezvous at the node list's first host.

Every wait is for the job's end, with deadlines that only guard against a hang. Binaries:
$RSD_BIN_DIR (default <repo>/target/debug).
"""
import re
import subprocess

import pytest

from slurm_local import slurm  # noqa: F401  (a fixture)
from test_train_slurm_real import (TWO_NODES, assert_equals_nproc_2, assert_ran_to_the_end,
                                   steps_logged, submit, text, train_flags)

STEPS = 3


@pytest.fixture(scope="module")
def shards(mini_shards):
    return mini_shards


def submit_to_both(slurm, tmp_path, name, out, shards, env=None):
    """The shipped script on one CPU task on each of the two nodes, a 5-minute limit."""
    assert len(slurm.nodes) == 2, f"the local SLURM has nodes {slurm.nodes}, not two"
    return submit(slurm, tmp_path, name, out, train_flags(shards, STEPS), env=env,
                  time_limit="5", signal="USR1@60", layout=TWO_NODES)


def test_a_run_across_two_nodes_ends_bit_identical_to_a_local_one(slurm, shards, tmp_path):
    out = tmp_path / "run"
    job, log = submit_to_both(slurm, tmp_path, "nodes", out, shards)
    # Seconds here; the rest only guards against a hang.
    output = assert_ran_to_the_end(slurm, job, log, out, STEPS, timeout=300)
    # Both nodes, one task on each.
    hosts = subprocess.run(["scontrol", "show", "hostnames", slurm.job_field(job, "NodeList")],
                           capture_output=True, text=True, check=True, env=slurm.env())
    assert hosts.stdout.split() == slurm.nodes, output
    first = slurm.nodes[0]
    assert (f"rsd-train: SLURM job {job} (no torchrun): rank 0 of 2 "
            "(SLURM_PROCID/SLURM_STEP_NUM_TASKS), 1 on this node") in output, output
    # Rank 0 on the first host of the node list, the rendezvous there.
    assert f"rendezvous {first}:" in output, output
    assert_equals_nproc_2(shards, out, tmp_path, STEPS)


def test_a_loopback_master_addr_is_refused_on_two_nodes(slurm, shards, tmp_path):
    out = tmp_path / "run"
    job, log = submit_to_both(slurm, tmp_path, "loopback", out, shards,
                              env={"MASTER_ADDR": "127.0.0.1"})
    state, code = slurm.wait_job(job, timeout=300)
    output = text(log)
    assert "SLURM variable MASTER_ADDR=127.0.0.1 is invalid" in output, output
    assert "not a loopback address" in output, output
    # Each rank exits 2 (a usage error, SIGTERM ignored on the way out), unless srun's
    # --kill-on-bad-exit SIGTERM (after the first rank's exit 2) reaches it while it is still
    # loading, before rsd-train's main runs; srun's status, the job's, is the highest of its
    # tasks' (143 = 128 + SIGTERM).
    tasks = re.findall(r"srun: error: \S+: task (\d): Exited with exit code (\d+)", output)
    assert "2" in {rc for _, rc in tasks} and {rc for _, rc in tasks} <= {"2", "143"}, output
    assert (state, code) == ("FAILED", f"{max(int(rc) for _, rc in tasks)}:0"), output
    assert steps_logged(out) == [], output
