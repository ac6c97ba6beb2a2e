"""rsd-train across two SLURM nodes (the local cluster's two slurmd, scripts/slurm-local.sh): the
shipped sbatch script with `--nodes=2 --ntasks-per-node=1` runs a tiny data-parallel run of one
CPU task per node, as on two machines.

* The run reaches its end: rank 0 on the first node takes the rendezvous from the job's node list
  (its first host, which must resolve) and rank 1 on the second node connects to it; the final
  weights are bit-identical to a local `rsd-train --nproc 2` run of the same flags.
* A loopback MASTER_ADDR left in the job's environment (as from a one-node test) is refused on two
  nodes with exit 2 before any rank waits for the others: the other node's ranks would connect to
  themselves. (A rank that srun's --kill-on-bad-exit SIGTERM reaches after the first rank's exit
  ends 143 instead, and so does the job: rsd-train handles no signal that early.)

The two nodes are one machine: rsd-train's placement, which names a rank's host by gethostname,
sees both ranks on one host; what crosses "nodes" here is SLURM's side (the node list, the tasks
per node, a slurmd per node) and the rendezvous at the node list's first host.

Every wait is for the job's end, with deadlines that only guard against a hang. Binaries:
$RSD_BIN_DIR (default <repo>/target/debug).
"""
import json
import re
import subprocess
from pathlib import Path

import pytest
from safetensors.numpy import load_file

from rsd_cli import exe, run
from slurm_local import slurm  # noqa: F401  (a fixture)

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "pipelines" / "slurm" / "llama3-8b-64k.sbatch"
STEPS = 3


@pytest.fixture(scope="module")
def shards(mini_shards):
    return mini_shards


def train_flags(shards):
    """The tiny run's flags beside the script's --config, --out and --resume auto (those of
    tests/test_train_slurm_real.py)."""
    return ["--shards", shards, "--init", shards.parent / "tiny-1k.json", "--progress", "false",
            "--threads", 1, "--steps", STEPS, "--tokens-per-step", 256, "--save-every", 0,
            "--dist-liveness", 60]


def submit(slurm, tmp_path, name, out, flags, env=None):
    """The shipped script on one CPU task on each of the two nodes (its GPU and task options
    overridden, a 5-minute limit); returns the job id and its output file."""
    assert len(slurm.nodes) == 2, f"the local SLURM has nodes {slurm.nodes}, not two"
    log = tmp_path / f"{name}.out"
    job = slurm.sbatch(
        SCRIPT, f"--job-name=rsd-test-{name}", "--nodes=2", "--ntasks-per-node=1",
        "--gpus-per-node=0", "--cpus-per-task=1", "--time=5", "--signal=USR1@60",
        f"--output={log}",
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


def params(out):
    (f,) = (out / "model").glob("*.safetensors")
    return load_file(f)


def test_a_run_across_two_nodes_ends_bit_identical_to_a_local_one(slurm, shards, tmp_path):
    out = tmp_path / "run"
    job, log = submit(slurm, tmp_path, "nodes", out, train_flags(shards))
    # Seconds here; the rest only guards against a hang.
    state, code = slurm.wait_job(job, timeout=300)
    output = text(log)
    assert (state, code) == ("COMPLETED", "0:0"), output
    # Both nodes, one task on each.
    hosts = subprocess.run(["scontrol", "show", "hostnames", slurm.job_field(job, "NodeList")],
                           capture_output=True, text=True, check=True, env=slurm.env())
    assert hosts.stdout.split() == slurm.nodes, output
    first = slurm.nodes[0]
    assert (f"rsd-train: SLURM job {job} (no torchrun): rank 0 of 2 "
            "(SLURM_PROCID/SLURM_STEP_NUM_TASKS), 1 on this node") in output, output
    # Rank 0 on the first host of the node list, the rendezvous there.
    assert f"rendezvous {first}:" in output, output
    assert steps_logged(out) == list(range(1, STEPS + 1)), output
    reference = tmp_path / "reference"
    run("rsd-train", "--config", REPO / "configs" / "tiny-cpu.toml", "--out", reference,
        *train_flags(shards), "--nproc", 2, timeout=600)
    a, b = params(out), params(reference)
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_a_loopback_master_addr_is_refused_on_two_nodes(slurm, shards, tmp_path):
    out = tmp_path / "run"
    job, log = submit(slurm, tmp_path, "loopback", out, train_flags(shards),
                      env={"MASTER_ADDR": "127.0.0.1"})
    state, code = slurm.wait_job(job, timeout=300)
    output = text(log)
    assert "SLURM variable MASTER_ADDR=127.0.0.1 is invalid" in output, output
    assert "not a loopback address" in output, output
    # Each rank exits 2 (a usage error), unless srun's --kill-on-bad-exit SIGTERM (after the
    # first rank's exit 2) ends it first: rsd-train handles no signal yet at that point, and
    # srun's status, the job's, is the highest of its tasks' (143 = 128 + SIGTERM).
    tasks = re.findall(r"srun: error: \S+: task (\d): Exited with exit code (\d+)", output)
    assert "2" in {rc for _, rc in tasks} and {rc for _, rc in tasks} <= {"2", "143"}, output
    assert (state, code) == ("FAILED", f"{max(int(rc) for _, rc in tasks)}:0"), output
    assert steps_logged(out) == [], output
