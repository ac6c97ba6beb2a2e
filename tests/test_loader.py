"""rsd-loader through `rsd-data stream`: DP disjointness and coverage, zigzag CP slices, exact and
elastic resume against an uninterrupted run, mixture proportions, error messages, the tokens
checked against megatron-core's IndexedDataset reading the same shards, and `rsd-data bench`
reporting both batch layouts.

Run with the project venv (`source .rsd-env`), binaries from $RSD_BIN_DIR (default target/debug):
    pytest tests/test_loader.py"""

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from rsd_cli import rsd

ROOT = Path(__file__).resolve().parents[1]


def stream(*dirs, **opts):
    args = ["stream", *dirs]
    for k, v in opts.items():
        flag = "--" + k.replace("_", "-")
        args += [flag] if v is True else [flag, v]
    return [json.loads(line) for line in rsd(*args).stdout.splitlines()]


def ident(row):
    return (row["source"], row["shard"], row["index"])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Real shards from the bundled corpus: books fixed 256, books mixed 512, code mixed 512, code fixed 128."""
    tmp = tmp_path_factory.mktemp("loader")
    out = {}
    for name, src, length, mode in [
        ("books", "books", 256, "fixed"),
        ("books_mixed", "books", 512, "mixed"),
        ("code_mixed", "code", 512, "mixed"),
        ("code128", "code", 128, "fixed"),
    ]:
        d = tmp / name
        rsd("pack", "--len", length, "--mode", mode, "--src", ROOT / "corpus" / src, "--out", d,
            "--shard-size", "256KiB", "--progress", "none")
        out[name] = d
    return out


def n_samples(d):
    return json.loads((d / "index.json").read_text())["totals"]["samples"]


def test_dp_ranks_are_disjoint_and_cover_the_epoch(data):
    d = data["books"]
    n = n_samples(d)
    assert n > 100 and len(json.loads((d / "index.json").read_text())["shards"]) > 1
    whole = stream(d, seed=7)
    assert len(whole) == n and len({ident(r) for r in whole}) == n, "one epoch = every sample once"
    assert [r["index"] for r in whole[:20]] != sorted(r["index"] for r in whole[:20]), "shuffled"
    world, batch = 3, 2
    per_rank = [stream(d, seed=7, dp_rank=r, dp_size=world, batch_size=batch) for r in range(world)]
    steps = n // (world * batch)
    seen = set()
    for r, rows in enumerate(per_rank):
        assert len(rows) == steps * batch
        for k, row in enumerate(rows):
            step, i = divmod(k, batch)
            assert row["step"] == step
            # The i-th sample of rank r in a step is global position step·W·B + i·W + r.
            assert ident(row) == ident(whole[step * world * batch + i * world + r])
            assert ident(row) not in seen
            seen.add(ident(row))
    assert len(seen) == steps * world * batch


def test_tokens_match_megatron_indexed_dataset(data):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    d = data["books_mixed"]
    manifest = json.loads((d / "index.json").read_text())
    rows = stream(d, seed=3, batches=40, edge=6)
    for row in rows:
        ds = IndexedDataset(str(d / manifest["shards"][row["shard"]]["prefix"]))
        docs = ds.document_indices
        lo, hi = docs[row["index"]], docs[row["index"] + 1]
        toks = np.concatenate([np.asarray(ds[i], dtype=np.int64) for i in range(lo, hi)])
        lens = [int(x) for x in ds.sequence_lengths[lo:hi]]
        assert row["tokens"] == len(toks)
        assert row["first"] == toks[:6].tolist() and row["last"] == toks[-6:].tolist()
        assert row["docs"] == np.cumsum(lens).tolist(), "document boundaries are Megatron's sequences"
        # Mixed shards: positions restart per document; document-final labels are ignored.
        assert row["pos"] == [0, max(lens) - 1]
        assert row["labels"] == len(toks) - len(lens)


def test_context_parallel_zigzag_slices(data):
    d = data["books_mixed"]
    full = stream(d, seed=1, batches=12, positions="row")
    for p in (2, 4):
        ranks = [stream(d, seed=1, batches=12, positions="row", cp_rank=c, cp_size=p) for c in range(p)]
        for k, whole in enumerate(full):
            padded = -(-whole["tokens"] // (2 * p)) * 2 * p
            chunk = padded // (2 * p)
            held = []
            for c, rows in enumerate(ranks):
                row = rows[k]
                assert ident(row) == ident(whole), "every CP rank gets the same sample"
                assert row["chunks"] == [[c * chunk, (c + 1) * chunk], [(2 * p - 1 - c) * chunk, (2 * p - c) * chunk]]
                assert row["tokens"] == 2 * chunk and row["row_len"] == padded
                held += [tuple(x) for x in row["chunks"]]
            assert sorted(held) == [(i * chunk, (i + 1) * chunk) for i in range(2 * p)], "the chunks tile the row"
            assert ranks[0][k]["first"] == whole["first"], "rank 0 starts the row"
            assert ranks[0][k]["pos"][0] == 0 and ranks[0][k]["pos"][1] == padded - 1


def test_resume_matches_an_uninterrupted_run(data, tmp_path):
    a, b = data["books_mixed"], data["code_mixed"]
    common = dict(weights="1,3", seed=5, token_budget=1500, workers=3)
    whole = stream(a, b, batches=30, **common)
    state = tmp_path / "state.json"
    head = stream(a, b, batches=11, save_state=state, **common)
    saved = json.loads(state.read_text())
    assert saved["version"] == 1 and saved["step"] == 11 and sum(saved["drawn"]) == saved["cursor"]
    tail = stream(a, b, batches=19, resume=state, **common)
    assert head + tail == whole


def test_elastic_resume_on_another_dp_size(data, tmp_path):
    d = data["code128"]
    whole = stream(d, seed=9)  # dp = 1, batch 1: the global order
    states = []
    for r in range(2):
        s = tmp_path / f"rank{r}.json"
        stream(d, seed=9, dp_rank=r, dp_size=2, batch_size=3, batches=5, save_state=s)
        states.append(json.loads(s.read_text()))
    assert states[0] == states[1] and states[0]["cursor"] == 30
    for r in range(4):
        rows = stream(d, seed=9, dp_rank=r, dp_size=4, batches=25, resume=tmp_path / "rank0.json")
        assert [ident(x) for x in rows] == [ident(whole[30 + 4 * t + r]) for t in range(25)]
        assert rows[0]["step"] == 5


def test_mixture_proportions(data):
    a, b = data["books_mixed"], data["code_mixed"]
    rows = stream(a, b, weights="0.3,0.7", seed=2, batches=400)
    counts = Counter(r["source"] for r in rows)
    assert abs(counts[0] - 120) <= 1 and abs(counts[1] - 280) <= 1, counts
    for n in (10, 50, 200):
        assert abs(sum(r["source"] == 0 for r in rows[:n]) - 0.3 * n) <= 1, "interleaved, not blocked"


def test_pipeline_file_and_refusals(data, tmp_path):
    pipe = tmp_path / "mix.json"
    pipe.write_text(json.dumps({"name": "t", "sources": [{"dir": "books_mixed", "weight": 1}, {"dir": "code_mixed", "weight": 1}]}))
    rows = stream(pipeline=pipe, data_root=data["books_mixed"].parent, batches=10)
    assert Counter(r["source"] for r in rows) == {0: 5, 1: 5}
    # Different packing lengths: refused, naming both directories.
    err = rsd("stream", data["books"], data["code128"], ok=False).stderr
    assert "packing lengths 256 vs 128" in err and str(data["books"]) in err and str(data["code128"]) in err
    # Resuming with another seed is refused.
    s = tmp_path / "s.json"
    stream(data["books"], seed=1, batches=2, save_state=s)
    err = rsd("stream", data["books"], "--seed", "2", "--resume", s, ok=False).stderr
    assert "cannot resume" in err and "seed 1" in err


def test_damaged_shard_errors_name_the_file(data, tmp_path):
    import shutil

    d = tmp_path / "broken"
    shutil.copytree(data["books"], d)
    bin0 = d / "shard-00000.bin"
    raw = bytearray(bin0.read_bytes())
    raw[1000] ^= 0xFF
    bin0.write_bytes(bytes(raw))
    stream(d, batches=1)  # structure is intact: reads work without verification
    err = rsd("stream", d, "--verify", "--batches", "1", ok=False).stderr
    assert "shard-00000.bin" in err and "checksum" in err
    with open(bin0, "r+b") as f:
        f.truncate(len(raw) - 4)
    err = rsd("stream", d, "--batches", "1", ok=False).stderr
    assert "shard-00000.bin" in err and "byte" in err


def test_bench_reports_both_layouts(data):
    """`rsd-data bench` measures the full and the compact layout, each read with pread and through
    the map, in one run; each line names its layout, read method and fraction of the memcpy limit,
    with one pass per round."""
    out = rsd("bench", data["books"], "--json", "--workers", "0,1", "--seconds", "0.2",
              "--rounds", "2", "--memcpy-bytes", "1MiB").stdout
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[0]["what"] == "memcpy_limit" and lines[0]["bytes_per_s"] > 0
    assert lines[0]["pread_1mib_bytes_per_s"] > 0
    copies = [r for r in lines if r["what"] == "sample_copies"]
    assert len(copies) == 2 and all(r["pread_bytes_per_s"] > 0 for r in copies)
    runs = [r for r in lines if r["what"] == "loader"]
    seen = {(r["layout"], r["read"], r["order"], r["workers"]) for r in runs}
    assert seen == {(lay, read, order, w) for lay in ("full", "compact") for read in ("pread", "map")
                    for order in ("sequential", "shuffled") for w in (0, 1)}
    for r in runs:
        assert len(r["rounds"]) == 2, r
        assert r["fraction_of_memcpy"] > 0 and all(x["report"]["tokens"] > 0 for x in r["rounds"]), r
        rates = sorted(x["report"]["bytes_per_s"] for x in r["rounds"])
        assert rates[0] <= r["bytes_per_s"] <= rates[-1], r
    human = rsd("bench", data["books"], "--workers", "0", "--seconds", "0.1", "--layout", "compact",
                "--read", "pread", "--rounds", "1", "--memcpy-bytes", "1MiB").stdout
    assert " map " not in human and "pread" in human
    assert "compact" in human and " full " not in human and "% of memcpy" in human
