"""rsd-train data parallel: N processes train exactly what one process trains.

* `--nproc 2` on the same global batch (tokens_per_step) logs the losses of one process and ends
  with the same parameters: with one row per micro-batch and 2 micro-batches per rank, and with
  2-row micro-batches (each rank's rows interleaved in the global batch, so the perturbations
  must be keyed by the global row), over several gradient buckets;
* the same on mixed-length shards (document-masked, document-scoped perturbations);
* `torchrun --no-python --nproc-per-node 2 rsd-train …` gives the same run as `--nproc 2`;
* a rank that fails makes the launcher stop the others and exit non-zero naming it, in seconds;
* Ctrl-C reaches every rank, rank 0 checkpoints, exit 130;
* a 2-rank checkpoint resumes with 2 ranks or 1 to the losses of an uninterrupted run;
* ranks that would resume different checkpoints (one host's lagging view, by a fault hook) all
  refuse, naming both steps; a rank that fails to load or to write a checkpoint stops every rank
  at once, also when the ranks were started by hand with no launcher to stop the others;
* a global batch the ranks cannot share equally is refused, saying what to set.

Measured (tiny Qwen3, 3 steps of rsd, 2 CPU cores): each rank sums its own micro-batches'
gradients before the ranks' sums are added, so float sums round differently: parameters differ by
at most 1.3e-6 (1-row micro-batches), 1.0e-6 (2-row) and 6.1e-6 (mixed shards, whose
micro-batches group rows differently), losses by about 1e-9 relative; the
tests allow 1e-5. torchrun and --nproc give bit-identical runs. The file runs in about 90 s.

Binaries: $RSD_BIN_DIR (default <repo>/target/debug): rsd-data and rsd-train (built with the
`fault-injection` feature for the failing-rank test, as scripts/test.sh builds it).
"""
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from rsd_cli import exe, run
from test_train_zero import sharded_state

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def shards(mini_shards):
    """These tests compare runs with each other: the small vocabulary's shards (conftest)."""
    return mini_shards


def train_args(shards, out, *extra, steps=3):
    return ["--config", REPO / "configs" / "tiny-cpu.toml", "--shards", shards, "--init",
            shards.parent / "tiny-1k.json",
            "--out", out, "--progress", "false", "--threads", "1", "--steps", steps,
            "--save-every", 0, *extra]


def metrics(out):
    return [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]


def params(out):
    (f,) = (out / "model").glob("*.safetensors")
    return load_file(f)


def assert_same_run(one, many, loss_rel, param_abs):
    m1, mn = metrics(one), metrics(many)
    assert [r["step"] for r in m1] == [r["step"] for r in mn] == [1, 2, 3]
    for a, b in zip(m1, mn):
        for k in ("loss", "clm", "grad_norm"):
            assert b[k] == pytest.approx(a[k], rel=loss_rel, abs=1e-12), (k, a, b)
        # The KL (≈1e-4 here) is a difference of log-probabilities of the loss's size: its
        # rounding error is absolute, on the loss's scale.
        assert b["kl"] == pytest.approx(a["kl"], rel=0, abs=loss_rel * a["loss"]), (a, b)
        assert a["tokens"] == b["tokens"]
    p1, pn = params(one), params(many)
    assert p1.keys() == pn.keys()
    worst = max(float(np.abs(p1[k].astype(np.float64) - pn[k]).max()) for k in p1)
    print(f"max |Δparam| {worst:.3g}")
    assert worst <= param_abs, worst


@pytest.mark.parametrize("micro_batch", [1, 2])
def test_two_ranks_train_what_one_process_trains(shards, tmp_path, micro_batch):
    # 512 tokens of 128-token rows: 4 one-row or 2 two-row micro-batches, shared by 2 ranks.
    batch = ["--micro-batch", micro_batch, "--tokens-per-step", 512]
    run("rsd-train", *train_args(shards, tmp_path / "one", *batch))
    p = run("rsd-train", *train_args(shards, tmp_path / "two", *batch, "--grad-bucket-mb", 1),
            "--nproc", 2)
    assert "[rank 0] done: 3 steps" in p.stderr, p.stderr
    # Each rank sums its own micro-batches' gradients before the ranks' sums are added, and
    # two-row micro-batches group rows differently: float sums round differently, nothing more.
    assert_same_run(tmp_path / "one", tmp_path / "two", loss_rel=1e-5, param_abs=1e-5)


def test_two_ranks_on_mixed_shards_train_what_one_process_trains(mini_shards, tmp_path):
    # Rows of different lengths split a loader batch into several micro-batches; documents get
    # their own perturbations, drawn by global row.
    mixed = tmp_path / "mixed"
    run("rsd-data", "pack", "--len", "256", "--mode", "mixed", "--src", REPO / "corpus" / "books",
        "--src", REPO / "corpus" / "code", "--out", mixed, "--tokenizer",
        REPO / "assets" / "tokenizers" / "mini-1k" / "tokenizer.json")
    shutil.copy(mini_shards.parent / "tiny-1k.json", tmp_path / "tiny-1k.json")
    batch = ["--micro-batch", 2, "--tokens-per-step", 1024, "--perturb-scope", "document"]
    run("rsd-train", *train_args(mixed, tmp_path / "one", *batch))
    run("rsd-train", *train_args(mixed, tmp_path / "two", *batch), "--nproc", 2)
    # Parameters: 6.1e-6 measured on one machine, 1.01e-5 on an AMD EPYC (the fp32 kernels'
    # rounding of near-zero gradients, turned into ±lr moves by AdamW's first steps).
    assert_same_run(tmp_path / "one", tmp_path / "two", loss_rel=1e-5, param_abs=2e-5)


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
def test_torchrun_runs_the_same_as_nproc(shards, tmp_path):
    batch = ["--micro-batch", 2, "--tokens-per-step", 512]
    run("rsd-train", *train_args(shards, tmp_path / "nproc", *batch), "--nproc", 2)
    p = subprocess.run(
        ["torchrun", "--no-python", "--nproc-per-node", "2", exe("rsd-train"),
         *map(str, train_args(shards, tmp_path / "torchrun", *batch))],
        capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert_same_run(tmp_path / "nproc", tmp_path / "torchrun", loss_rel=0, param_abs=0.0)


def test_a_failing_rank_stops_the_run_and_is_named(shards, tmp_path):
    t0 = time.monotonic()
    p = run("rsd-train", *train_args(shards, tmp_path / "x", "--tokens-per-step", 256),
            "--nproc", 2, check=False, env={"RSD_TRAIN_FAULT_FAIL_RANK": "1"}, timeout=120)
    elapsed = time.monotonic() - t0
    assert p.returncode != 0
    assert "[rank 1] rsd-train: error: fault injection: rank 1 fails" in p.stderr, p.stderr
    assert "rank 1 of 2 failed" in p.stderr, p.stderr
    # Start-up and the failure: ~6 s, ~9 s with both cores of a 2-core machine busy: a 7x
    # margin, and still far below what a launcher that left rank 0 to its collective's timeout
    # (300 s) would take.
    assert elapsed < 60, elapsed


def test_ctrl_c_reaches_every_rank_and_rank_0_checkpoints(shards, tmp_path):
    out = tmp_path / "run"
    # The ranks hold before step 2 (a fault hook) until the signal comes, so the run is still
    # going when it does, however fast the machine; the deadline only guards against a hang.
    p = subprocess.Popen([exe("rsd-train"), *map(str, train_args(
        shards, out, "--tokens-per-step", 256, steps=1000)), "--nproc", "2"],
        env={**os.environ, "RSD_TRAIN_FAULT_HOLD_AT": f"2:{tmp_path / 'never'}"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not ((out / "metrics.jsonl").exists()
               and (out / "metrics.jsonl").read_text().count("\n") >= 1):
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    for rank in (0, 1):
        assert f"[rank {rank}] rsd-train: SIGINT (Ctrl-C) received: every rank finishes its step" in err, err
    done = len(metrics(out))
    ck = sorted((out / "checkpoints").iterdir())
    assert ck and ck[-1].name == f"step-{done:08d}", (ck, done)


def test_a_batch_the_ranks_cannot_share_is_refused(shards, tmp_path):
    # 384 tokens = 3 micro-batches of 128: not divisible by 2 ranks.
    p = run("rsd-train", *train_args(shards, tmp_path / "x", "--tokens-per-step", 384),
            "--nproc", 2, check=False, timeout=120)
    assert p.returncode != 0
    assert "tokens_per_step" in p.stderr and "multiple of 256" in p.stderr, p.stderr
    assert "failed" in p.stderr


def test_a_checkpoint_resumes_at_the_same_or_another_dp_size(shards, tmp_path):
    # The loader's state is the global stream's position, whatever the number of ranks.
    def args(out, *extra):
        return train_args(shards, tmp_path / out, "--tokens-per-step", 256, *extra, steps=4)

    run("rsd-train", *args("ref"))
    run("rsd-train", *args("two", "--stop-at", 2), "--nproc", 2, check=False)
    shutil.copytree(tmp_path / "two", tmp_path / "one")
    run("rsd-train", *args("two"), "--nproc", 2, "--resume")
    run("rsd-train", *args("one"), "--resume")
    ref = metrics(tmp_path / "ref")
    for out in ("two", "one"):
        got = metrics(tmp_path / out)
        assert [r["step"] for r in got] == [1, 2, 3, 4]
        for a, b in zip(ref, got):
            assert b["loss"] == pytest.approx(a["loss"], rel=1e-5), (out, a, b)


def test_a_sharded_optimizer_trains_what_a_replicated_one_trains(shards, tmp_path):
    # 1 MiB buckets: the (tied) embedding is a bucket of its own whose two blocks split the
    # matrix; each layer and the final norm are buckets of their own. Clipping is active from
    # step 2 (|g| > 1).
    batch = ["--micro-batch", 1, "--tokens-per-step", 512, "--grad-bucket-mb", 1]
    run("rsd-train", *train_args(shards, tmp_path / "replicated", *batch), "--nproc", 2)
    run("rsd-train", *train_args(shards, tmp_path / "sharded", *batch, "--shard-optimizer", "true"),
        "--nproc", 2)
    # The same AdamW arithmetic on the same summed gradient, summed in another order (each
    # micro-batch's reduce-scatter, then the micro-batches): fp32 rounding, nothing more (fp64
    # runs agree to 1e-10: tests/test_train_zero.py).
    assert_same_run(tmp_path / "replicated", tmp_path / "sharded", loss_rel=1e-5, param_abs=1e-5)
    # The checkpoint holds each rank's blocks; reassembled, they are the replicated state.
    step3 = Path("checkpoints") / "step-00000003"
    rep = load_file(tmp_path / "replicated" / step3 / "optimizer.safetensors")
    _, sh = sharded_state(tmp_path / "sharded" / step3)
    assert rep.keys() == sh.keys() and len(rep) == 2 * len(params(tmp_path / "sharded"))
    for k in rep:
        scale = float(np.abs(rep[k]).max())
        assert float(np.abs(rep[k] - sh[k]).max()) <= 1e-3 * scale + 1e-12, k
    assert any(np.abs(v).max() > 0 for v in sh.values())


def test_a_sharded_checkpoint_resumes_sharded_or_not_at_another_dp_size(shards, tmp_path):
    def args(out, *extra):
        return train_args(shards, tmp_path / out, "--tokens-per-step", 256, "--grad-bucket-mb", 1,
                          *extra, steps=4)

    run("rsd-train", *args("ref"))
    run("rsd-train", *args("sharded", "--stop-at", 2, "--shard-optimizer", "true"), "--nproc", 2)
    shutil.copytree(tmp_path / "sharded", tmp_path / "one")
    shutil.copytree(tmp_path / "sharded", tmp_path / "again")
    # Saved sharded at 2 ranks: resumed replicated in one process, and sharded at 2 ranks.
    run("rsd-train", *args("one", "--shard-optimizer", "false", "--allow-change",
                           "shard_optimizer"), "--resume")
    run("rsd-train", *args("again"), "--nproc", 2, "--resume")
    for out in ("one", "again"):
        assert_same_run_4(tmp_path / "ref", tmp_path / out)


def assert_same_run_4(ref, got):
    m_ref, m_got = metrics(ref), metrics(got)
    assert [r["step"] for r in m_got] == [1, 2, 3, 4]
    for a, b in zip(m_ref, m_got):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5), (got, a, b)
    p_ref, p_got = params(ref), params(got)
    worst = max(float(np.abs(p_ref[k].astype(np.float64) - p_got[k]).max()) for k in p_ref)
    assert worst <= 1e-5, (got, worst)


def test_dp_alone_starts_its_ranks_and_must_match_the_world(shards, tmp_path):
    p = run("rsd-train", *train_args(shards, tmp_path / "dp", "--tokens-per-step", 256, "--dp", 2,
                                     steps=1))
    assert "[rank 0] rsd-train: 2 data-parallel ranks" in p.stderr, p.stderr
    p = run("rsd-train", *train_args(shards, tmp_path / "x", "--tokens-per-step", 256, "--dp", 2,
                                     steps=1), "--nproc", 3, check=False, timeout=60)
    assert p.returncode != 0 and "--dp 2 × --cp 1 = 2 processes" in p.stderr, p.stderr
    assert "has 3" in p.stderr and "--nproc" in p.stderr, p.stderr


def memory_plan(config, *args):
    return run("rsd-train", "--config", REPO / "configs" / config, *args).stdout


def test_the_paper_configs_print_a_memory_plan_that_fits_their_gpus():
    llama = REPO / "configs" / "model" / "llama3-8b.json"
    qwen = REPO / "configs" / "model" / "qwen3-4b.json"
    # Each paper config carries its layout (dp × cp, sharding, checkpointing): the plan of one
    # rank fits 80 GiB with at least 10% to spare, on the paper's GPU count.
    # The SFT stage's shards are not there: its row length is given.
    sft_rows = ["--max-position-embeddings", 16384]
    for config, arch, gpus, params, extra in [
            ("llama3-8b-64k.toml", llama, 16, 8030261248, []),
            ("llama3-8b-64k-bookrepo.toml", llama, 16, 8030261248, []),
            ("llama3-8b-64k-standard.toml", llama, 16, 8030261248, []),
            ("qwen3-4b-256k.toml", qwen, 32, 4022468096, []),
            ("qwen3-4b-256k-sft.toml", qwen, 32, 4022468096, sft_rows)]:
        report = json.loads(run("rsd-train", "memory", "--config", REPO / "configs" / config,
                                "--arch", arch, "--json", *extra).stdout)
        plan = report["plan"]
        assert plan["world"] == gpus and plan["parameters"] == params, (config, plan)
        assert plan["gpu_bytes"] == 80 << 30, (config, plan)
        assert plan["total"] <= 0.9 * plan["gpu_bytes"], (config, plan["total"] / 2**30)
        # The alias prints the same plan.
        out = memory_plan(config, "--print-memory-plan", arch, *extra)
        assert f"{params} parameters, dp {plan['dp']} × cp {plan['cp']}" in out, out
        assert "per GPU: fits" in out, out
    # The same Llama run without sharding or context parallelism does not fit, and says what does.
    p = run("rsd-train", "memory", "--config", REPO / "configs" / "llama3-8b-64k.toml", "--arch",
            llama, "--dp", 16, "--cp", 1, "--shard-optimizer", "false", check=False)
    assert p.returncode == 1 and "DOES NOT FIT" in p.stdout, p.stdout
    assert "turn on shard_optimizer" in p.stderr, p.stderr
    # Without the model directory and without an architecture file: say what to pass.
    p = run("rsd-train", "--config", REPO / "configs" / "llama3-8b-64k.toml",
            "--print-memory-plan", check=False)
    assert p.returncode != 0 and "config.json: not found" in p.stderr, p.stderr
    assert "--arch path/to/config.json" in p.stderr, p.stderr

def two_checkpoints(shards, out):
    """A 2-rank run with checkpoints at steps 2 and 3 (the run stopped at 2, then at 3)."""
    args = train_args(shards, out, "--tokens-per-step", 256, steps=6)
    run("rsd-train", *args, "--stop-at", 2, "--nproc", 2, check=False)
    run("rsd-train", *args, "--stop-at", 3, "--nproc", 2, "--resume", check=False)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000002", "step-00000003"]
    return args


def test_ranks_that_would_resume_different_checkpoints_all_refuse(shards, tmp_path):
    """Rank 1 sees an older checkpoint (a lagging view of a shared run directory, by the fault
    hook): every rank stops, naming both steps, before anything is trained."""
    out = tmp_path / "run"
    args = two_checkpoints(shards, out)
    lines = len(metrics(out))
    p = run("rsd-train", *args, "--nproc", 2, "--resume", "auto", check=False, timeout=120,
            env={"RSD_TRAIN_FAULT_OLDER_CHECKPOINT_RANK": "1"})
    assert p.returncode != 0
    for rank in (0, 1):
        assert f"[rank {rank}] rsd-train: error: ranks disagree on where to start: rank 0 resumes " \
               "step 3" in p.stderr, p.stderr
    assert "rank 1 resumes step 2" in p.stderr and "step-00000002" in p.stderr, p.stderr
    assert len(metrics(out)) == lines  # nothing trained
    # Without the fault the same command resumes step 3 on both.
    run("rsd-train", *args, "--nproc", 2, "--resume", "auto", "--stop-at", 4, check=False)
    assert [r["step"] for r in metrics(out)][-1] == 4


def test_a_rank_that_cannot_load_the_checkpoint_stops_every_rank_at_once(shards, tmp_path):
    """Ranks started by hand (as on several hosts, with no launcher to stop the others): rank 1
    fails to load the checkpoint; rank 0 stops too, naming rank 1, long before its collective
    timeout (300 s) would end it."""
    out = tmp_path / "run"
    args = two_checkpoints(shards, out)
    errs = two_ranks_by_hand([*args, "--resume", "auto"], {"RSD_TRAIN_FAULT_LOAD_FAIL_RANK": "1"})
    assert "fault injection: rank 1 fails to load the checkpoint" in errs[1], errs[1]
    assert "loading the checkpoint failed on rank 1" in errs[0] and "every rank stops" in errs[0], errs[0]


def test_a_rank_that_cannot_write_the_checkpoint_stops_every_rank_at_once(shards, tmp_path):
    """Rank 0's disk fills while it writes step 2's checkpoint (the fault hook): rank 1, waiting
    for it, stops too, naming rank 0, instead of waiting out its collective timeout."""
    args = train_args(shards, tmp_path / "run", "--tokens-per-step", 256, steps=4)
    args[args.index("--save-every") + 1] = 2
    errs = two_ranks_by_hand(args, {"RSD_TRAIN_FAULT_DISK_FULL_AT": "2:optimizer.safetensors"})
    assert "No space left on device" in errs[0], errs[0]
    assert "writing the checkpoint's model and state failed on rank 0" in errs[1], errs[1]


def test_a_rank_whose_data_fails_stops_every_rank_at_the_steps_first_collective(shards,
                                                                                 tmp_path):
    """Rank 1 cannot read its first step's data (the fault hook): it still joins the step's
    first collective, so rank 0 stops there too, naming the failure, within seconds."""
    args = train_args(shards, tmp_path / "run", "--tokens-per-step", 256, steps=2)
    errs = two_ranks_by_hand(args, {"RSD_TRAIN_FAULT_DATA_FAIL_RANK": "1"})
    assert "fault injection: rank 1 fails to read its data" in errs[1], errs[1]
    assert "reading step 1's data failed on another rank" in errs[0], errs[0]


def test_a_rank_that_fails_inside_a_step_stops_the_others_through_the_store(shards, tmp_path):
    """Rank 1 fails inside its first step, after its backward, and stays alive 40 s with its
    connections open (the fault hooks; that is how an NCCL peer's failure looks to the others).
    Rank 0, waiting for it in the gradients' all-reduce under a 300 s timeout, hears of it through
    the rendezvous store and stops while rank 1 is still alive, naming rank 1 and its error."""
    args = train_args(shards, tmp_path / "run", "--tokens-per-step", 256, steps=2)
    # A margin, not an event: rank 0 hears of the failure within a poll and the grace (1 s + 3 s),
    # so rank 1's 40 s leave a 10x margin for a loaded machine before it could end first.
    procs = start_two_ranks(args, {"RSD_TRAIN_FAULT_STEP_FAIL_RANK": "1",
                                   "RSD_TRAIN_FAULT_HOLD_S": "40"})
    err0 = procs[0].communicate(timeout=120)[1]
    rank1_alive = procs[1].poll() is None
    err1 = procs[1].communicate(timeout=120)[1]
    assert procs[0].returncode == 1, err0
    assert rank1_alive, (err0, err1)
    assert "rank 1 failed: fault injection: rank 1 fails inside step 1; every rank stops (this " \
        "is rank 0" in err0, err0
    assert "fault injection: rank 1 fails inside step 1" in err1 and procs[1].returncode != 0, err1
    assert not (tmp_path / "run" / "model").exists()


@pytest.mark.parametrize("frozen", [1, 0])
def test_a_rank_that_stops_answering_stops_the_others(shards, tmp_path, frozen):
    """One rank is frozen mid-run (SIGSTOP: its sockets stay open and it answers nothing, as a
    hung or lost node looks; a rank the OOM killer ends is the same to an NCCL peer). The other,
    waiting for it in a collective under a 300 s timeout, stops within seconds of `dist_liveness`
    (3 s), naming it: rank 1 through its heartbeat in the store, rank 0 (whose process hosts the
    store) through the store not answering."""
    import os
    import signal
    import time

    out = tmp_path / "run"
    args = train_args(shards, out, "--tokens-per-step", 256, "--dist-liveness", 3, steps=100000)
    procs = start_two_ranks(args, {})
    try:
        deadline = time.monotonic() + 120
        while not ((out / "metrics.jsonl").exists()
                   and len((out / "metrics.jsonl").read_text().splitlines()) >= 2):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                [p.communicate()[1] for p in procs if p.poll() is not None]
            time.sleep(0.2)
        os.kill(procs[frozen].pid, signal.SIGSTOP)
        t0 = time.monotonic()
        other = procs[1 - frozen]
        err = other.communicate(timeout=120)[1]
        waited = time.monotonic() - t0
        assert procs[frozen].poll() is None, "the frozen rank ended"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert other.returncode == 1, err
    # The liveness period, a poll and the grace: far below the collective's 300 s. The lower
    # bound holds on any machine (the 3 s grace alone follows the freeze being noticed); the
    # upper one is a margin: ~7 s, also with both cores of a 2-core machine busy.
    assert 3 <= waited < 60, (waited, err)
    how = "its heartbeat in the rendezvous store stood still for 3 s" if frozen == 1 else \
        "the rendezvous store its process hosts (127.0.0.1:"
    assert f"rsd-train: error: rank {frozen} failed: stopped answering: " in err, err
    assert how in err, err
    assert f"every rank stops (this is rank {1 - frozen}, which was waiting for it)" in err, err


def start_two_ranks(args, fault_env):
    """Two rsd-train ranks started by hand (the rendezvous variables set here, as a multi-host
    launch would, with no launcher to stop the others)."""
    import os
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2", **fault_env}
        procs.append(subprocess.Popen([exe("rsd-train"), *map(str, args)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def two_ranks_by_hand(args, fault_env):
    """Two ranks as [`start_two_ranks`] starts them; both must fail, each within 120 s (the
    collective timeout is 300 s). Returns their stderr."""
    procs = start_two_ranks(args, fault_env)
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode != 0 for p in procs), errs
    return errs


def test_a_checkpoints_phases_wait_checkpoint_timeout_not_the_steps(shards, tmp_path):
    """Rank 0 takes 4 s more to write each checkpoint (the fault hook, as a large model on a slow
    filesystem would) while the step's collectives may wait 2 s: rank 1 waits it out under
    `checkpoint_timeout` (30 s), and fails, naming the timeout, when that is 3 s (and rank 0
    takes 20 s)."""
    # Margins: the ranks, in step with each other, meet in a step's collectives within far less
    # than the 2 s `dist_timeout`, and rank 0's 4 s save stays far below the 30 s.
    args = train_args(shards, tmp_path / "ok", "--tokens-per-step", 256, "--dist-timeout", 2, steps=2)
    args[args.index("--save-every") + 1] = 1
    slow = {"RSD_TRAIN_FAULT_SLOW_SAVE_S": "4"}
    run("rsd-train", *args, "--checkpoint-timeout", 30, "--nproc", 2, env=slow, timeout=120)
    assert sorted(p.name for p in (tmp_path / "ok" / "checkpoints").iterdir()) == \
        ["step-00000001", "step-00000002"]
    args[args.index("--out") + 1] = tmp_path / "short"
    # A 20 s save against the 3 s timeout: rank 1 times out even if a loaded machine keeps it
    # from reaching the save's first wait for most of the save (4 s left 1 s of slack). The
    # launcher then stops rank 0: the test does not wait out its save.
    p = run("rsd-train", *args, "--checkpoint-timeout", 3, "--nproc", 2, check=False,
            env={"RSD_TRAIN_FAULT_SLOW_SAVE_S": "20"}, timeout=120)
    assert p.returncode != 0, p.stderr
    assert "[rank 1]" in p.stderr and "timed out" in p.stderr.lower(), p.stderr
