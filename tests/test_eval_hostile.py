"""`rsd-eval` on hostile input, through the binary.

Every file rsd-eval writes is written atomically or appended without following a link: a link
planted at its name is replaced (or, for the results it appends to, refused) and its target is
never written. Files it reads are regular files read within stated bounds: a sparse file that
claims 60 GB gets a clear error naming the file and the bound, quickly and within a 4 GB address
space (RLIMIT_AS, so an attempt to allocate shows as a failure, not a slow swap). Figures and
comparisons cost their input: many distinct (depth, length) pairs are plotted in linear time or
refused by count.

Binaries: $RSD_BIN_DIR (default <repo>/target/debug).
"""
import json
import resource
import shutil
import subprocess
import time
from functools import partial
from pathlib import Path

import pytest

from rsd_cli import exe, fails, run

REPO = Path(__file__).resolve().parent.parent
rsd_eval = partial(run, "rsd-eval", timeout=300)
eval_fails = partial(fails, "rsd-eval", timeout=300)
TOKENIZER = REPO / "assets" / "tokenizers" / "mini-1k" / "tokenizer.json"
LIMIT = 4_000_000_000


def limited(*args, timeout=120):
    """rsd-eval ARGS under RLIMIT_AS = 4 GB: a huge allocation aborts instead of succeeding."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))

    p = subprocess.run([exe("rsd-eval"), *map(str, args)], capture_output=True, text=True,
                       preexec_fn=cap, timeout=timeout)
    assert "panicked" not in p.stderr, p.stderr
    assert p.returncode == 1, f"exit {p.returncode} (an abort is negative):\n{p.stderr}"
    return p


def record(task, length, depth, sample, score):
    return dict(task=task, length=length, depth=depth, sample=sample, expected=["4821"],
                output="4821" if score else "", score=score, prompt_tokens=length - 3)


def write_run(path, records):
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "results.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return path


def small_records():
    return [record(t, n, d, s, float((s + n) % 2))
            for t in ("niah_single_1", "vt") for n in (1024, 2048)
            for d in ((None,) if t == "vt" else (0.0, 0.5, 1.0)) for s in range(2)]


def precious(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    return target


def plant(path, target):
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to(target)


def assert_replaced(path, target):
    assert not path.is_symlink(), f"{path} is still a link"
    assert path.is_file()
    assert target.read_text() == "keep me", f"{target} was written through {path}"


def sparse(path, size=60 << 30):
    with open(path, "wb") as f:
        f.truncate(size)
    return path


# ------------------------------------------------------------------------ planted links (writes)

def test_plot_replaces_planted_links_and_never_writes_their_targets(tmp_path):
    target = precious(tmp_path)
    run_dir = write_run(tmp_path / "run", small_records())
    names = [f"{stem}.{ext}" for stem in ("accuracy_by_depth", "depth_length_heatmap", "accuracy_by_length")
             for ext in ("png", "svg", "json")]
    for name in names:
        plant(run_dir / "plots" / name, target)
    rsd_eval("plot", run_dir)
    for name in names:
        assert_replaced(run_dir / "plots" / name, target)
    # A link at a temporary name stops the write, naming it; its target stays.
    plant(run_dir / "plots" / "accuracy_by_depth.png.tmp", target)
    p = eval_fails("plot", run_dir)
    assert "accuracy_by_depth.png.tmp: a symbolic link where rsd writes its temporary file" in p.stderr
    assert target.read_text() == "keep me"


def test_plot_refuses_a_plots_directory_planted_as_a_link(tmp_path):
    """RUN/plots is the run's own directory: a link planted there (to another directory) is
    refused, naming it, and nothing is written where it points."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run_dir = write_run(tmp_path / "run", small_records())
    (run_dir / "plots").symlink_to(elsewhere)
    p = eval_fails("plot", run_dir)
    assert "plots: a symbolic link where rsd keeps a directory of its own" in p.stderr, p.stderr
    assert list(elsewhere.iterdir()) == []


def test_compare_replaces_planted_links(tmp_path):
    target = precious(tmp_path)
    a = write_run(tmp_path / "a", small_records())
    b = write_run(tmp_path / "b", small_records())
    out = tmp_path / "cmp"
    names = ["compare.md", "compare.json", "accuracy_by_depth.png", "accuracy_by_depth_and_length.svg"]
    for name in names:
        plant(out / name, target)
    rsd_eval("compare", a, b, "--out", out)
    for name in names:
        assert_replaced(out / name, target)


def test_score_pred_replaces_planted_results_and_summaries(tmp_path):
    target = precious(tmp_path)
    pred = tmp_path / "niah_single_1.jsonl"
    pred.write_text(json.dumps({"pred": "the 7342", "outputs": ["7342"], "length": 1024, "index": 0}) + "\n")
    out = tmp_path / "out"
    for name in ("results.jsonl", "summary.md", "summary.json"):
        plant(out / name, target)
    rsd_eval("score", "--pred", pred, "--out", out)
    for name in ("results.jsonl", "summary.md", "summary.json"):
        assert_replaced(out / name, target)


def test_dump_prompts_replaces_a_planted_link(tmp_path):
    target = precious(tmp_path)
    dump = tmp_path / "dump.jsonl"
    plant(dump, target)
    rsd_eval("run", "--tokenizer", TOKENIZER, "--dump-prompts", dump, "--tasks", "niah_single_1",
             "--lengths", "512", "--depths", "1", "--samples", "1")
    assert_replaced(dump, target)
    assert json.loads(dump.read_text().splitlines()[0])["task"] == "niah_single_1"


# ------------------------------------------------------------------------- bounded reads (sparse)

def test_score_pred_refuses_a_sparse_prediction_file_quickly(tmp_path):
    pred = sparse(tmp_path / "niah_single_1.jsonl")
    t = time.time()
    p = limited("score", "--pred", pred, "--out", tmp_path / "out")
    assert f"{pred}: 64424509440 bytes, more than the 1073741824 bytes a prediction file may have" in p.stderr
    # Refused from its size, before a byte is read: ~1 s of start-up idle, ~3 s with both cores
    # of a 2-core machine busy: a 20x margin.
    assert time.time() - t < 60
    # Under the file bound, a file without newlines stops at the line bound.
    sparse(pred, 200 << 20)
    p = limited("score", "--pred", pred, "--out", tmp_path / "out")
    assert f"{pred}:1: a line of more than 67108864 bytes" in p.stderr


def test_longbench_refuses_sparse_data_and_prediction_files(tmp_path):
    data = sparse(tmp_path / "data.json")
    p = limited("longbench", "--data", data, "--tokenizer", TOKENIZER, "--dump-prompts", tmp_path / "d.jsonl")
    assert f"{data}: more than 1073741824 bytes, the most a LongBench data file may have" in p.stderr
    responses = sparse(tmp_path / "responses.jsonl")
    p = limited("longbench", "--score", responses, "--out", tmp_path / "out")
    assert f"{responses}: 64424509440 bytes, more than the 1073741824 bytes a LongBench predictions file" in p.stderr


def test_a_huge_haystack_file_is_refused_with_the_cap(tmp_path):
    hay = tmp_path / "hay"
    hay.mkdir()
    sparse(hay / "big.txt", 200 << 20)
    p = limited("run", "--tokenizer", TOKENIZER, "--dump-prompts", tmp_path / "d.jsonl", "--haystack", hay,
                "--tasks", "niah_single_1", "--lengths", "512", "--depths", "1", "--samples", "1")
    assert "big.txt: more than 33554432 bytes, the most a haystack file may have" in p.stderr


# ----------------------------------------------------------------------------- values in range

def test_out_of_range_records_are_refused_naming_line_and_field(tmp_path):
    recs = small_records()
    recs[3]["depth"] = 1.5
    run_dir = write_run(tmp_path / "run", recs)
    p = eval_fails("plot", run_dir)
    assert f"{run_dir / 'results.jsonl'}:4: field depth: 1.5 is not a fraction in [0, 1]" in p.stderr
    recs = small_records()
    recs[0]["score"] = 7
    write_run(run_dir, recs)
    p = eval_fails("compare", run_dir, run_dir, "--out", tmp_path / "cmp")
    assert f"{run_dir / 'results.jsonl'}:1: field score: 7 is not a score in [0, 1]" in p.stderr


def test_messages_cut_and_escape_values_from_files(tmp_path):
    recs = small_records()
    recs[0]["task"] = "\x1b]0;pwned\x07" + "t" * 100_000
    run_dir = write_run(tmp_path / "run", recs)
    p = eval_fails("plot", run_dir)
    assert "\x1b" not in p.stderr and "\x07" not in p.stderr
    assert len(p.stderr) < 2000, len(p.stderr)
    assert "more characters" in p.stderr


# --------------------------------------------------------------------- plot and compare: linear

def test_plot_refuses_too_many_distinct_pairs_quickly(tmp_path):
    # 290 KB of records, every one its own (depth, length) pair: was cubic, wrote 118 MB.
    recs = [record("niah_single_1", 1024 + i, i / 2000, 0, 1.0) for i in range(2000)]
    run_dir = write_run(tmp_path / "run", recs)
    t = time.time()
    p = eval_fails("plot", run_dir)
    # ~1 s idle, ~3 s with both cores of a 2-core machine busy (the cubic version wrote 118 MB
    # first): a 10x margin.
    assert time.time() - t < 30
    assert "2000 distinct lengths, more than the 256 rsd-eval tabulates and plots" in p.stderr
    p = eval_fails("compare", run_dir, run_dir, "--out", tmp_path / "cmp")
    assert "2000 distinct lengths" in p.stderr


def test_plot_and_compare_of_many_pairs_within_the_caps_are_fast_and_small(tmp_path):
    recs = [record("niah_single_1", 1024 * (1 + l), d / 99, s, float((l + d + s) % 2))
            for l in range(100) for d in range(100) for s in range(2)]
    run_dir = write_run(tmp_path / "run", recs)
    t = time.time()
    rsd_eval("plot", run_dir)
    rsd_eval("compare", run_dir, run_dir, "--labels", "a,b", "--out", tmp_path / "cmp")
    # ~2.5 s for both idle, ~10 s with both cores of a 2-core machine busy: a 12x margin.
    assert time.time() - t < 120, time.time() - t
    written = sum(f.stat().st_size for d in (run_dir / "plots", tmp_path / "cmp") for f in d.iterdir())
    assert written < 64 << 20, written
    heat = json.loads((run_dir / "plots" / "depth_length_heatmap.json").read_text())
    assert len(heat["rows"]) == 100 and len(heat["columns"]) == 100


def test_a_300_digit_number_in_a_message_is_written_with_its_exponent(tmp_path):
    """Rust prints a float without an exponent: a `1e300` read from a file would be quoted as 301
    digits. Every binary's error line writes such a number as 1e300 (and 1e-300 likewise)."""
    for value, shown in (("1e300", "1e300"), ("-1e300", "-1e300"), ("1e-300", None)):
        run_dir = tmp_path / value
        run_dir.mkdir()
        (run_dir / "results.jsonl").write_text(json.dumps(
            {"task": "niah_single_1", "length": 1024, "depth": 0.5, "sample": 0,
             "expected": ["1"], "output": "1", "score": float(value), "prompt_tokens": 10}) + "\n")
        p = run("rsd-eval", "plot", run_dir, "--out", tmp_path / f"plot-{value}", check=False)
        if shown is None:  # 1e-300 is a valid score
            assert p.returncode == 0, p.stderr
            continue
        assert p.returncode == 1
        assert f"results.jsonl:1: field score: {shown} is not a score in [0, 1]" in p.stderr, p.stderr
        assert "0" * 50 not in p.stderr
