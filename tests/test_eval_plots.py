"""rsd-eval plot, compare and ppl through the binary.

plot/compare: hand-made results.jsonl records; the JSON written beside every figure, and the
comparison table, must equal the aggregates this file computes itself (mean score per cell; spread =
population standard deviation over sample indices of each sample index's mean); the PNGs and SVGs
must be well-formed. Bad input must fail with a message naming the file (and line).

ppl: a tiny random Llama (transformers) on shards packed from a slice of the bundled books; per
position bucket the mean NLL and the view gap KL(standard ‖ skip view) over rows i ≥ s must equal
transformers' fp64 computation to 1e-4 (`--dtype fp64`), with the (s, y) that ppl.json records per
row; the default fp32 stays within 1e-3 of it.

Binaries: $RSD_BIN_DIR (default <repo>/target/debug).
"""
import json
import math
import shutil
import struct
import xml.etree.ElementTree as ET
import zlib
from collections import defaultdict
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from rsd_cli import fails, run

REPO = Path(__file__).resolve().parent.parent
rsd_eval = partial(run, "rsd-eval", timeout=600)
STEMS = {"accuracy_by_depth", "depth_length_heatmap", "accuracy_by_length"}


def record(task, length, depth, sample, score):
    return dict(task=task, length=length, depth=depth, sample=sample, expected=["4821"],
                output="4821" if score else "", score=score, prompt_tokens=length - 3)


def fixture_records(seed=0, lengths=(1024, 2048, 4096), tasks=("niah_single_1", "niah_multikey_1", "vt")):
    rng = np.random.default_rng(seed)
    out = []
    for task in tasks:
        for length in lengths:
            depths = [None] if task == "vt" else [0.0, 0.25, 0.5, 0.75, 1.0]
            for d in depths:
                for s in range(3):
                    out.append(record(task, length, d, s, float(rng.choice([0.0, 0.5, 1.0]))))
    return out


def write_run(path, records):
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "results.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return path


def mean(xs):
    return sum(xs) / len(xs) if xs else None


def spread(records):
    by = defaultdict(list)
    for r in records:
        by[r["sample"]].append(r["score"])
    ms = [sum(v) / len(v) for v in by.values()]
    m = sum(ms) / len(ms)
    return math.sqrt(sum((x - m) ** 2 for x in ms) / len(ms))


def assert_values(got, want):
    assert len(got) == len(want), (got, want)
    for g, w in zip(got, want):
        if w is None:
            assert g is None, (got, want)
        else:
            assert g == pytest.approx(w, abs=1e-12), (got, want)


def check_png(path, size=(900, 560)):
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    pos, chunks, idat = 8, [], b""
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        assert zlib.crc32(kind + body) == crc, f"{path}: bad CRC in {kind}"
        chunks.append(kind)
        idat += body if kind == b"IDAT" else b""
        pos += 12 + n
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND", chunks
    w, h, depth, color = struct.unpack(">IIBB", data[16:26])
    assert (w, h) == size
    channels = {2: 3, 6: 4}[color]
    raw = zlib.decompress(idat)
    assert len(raw) == h * (1 + w * channels * depth // 8)
    # Not a blank canvas: some pixel differs from the first.
    assert len(set(raw[1:1 + w * channels])) > 1 or len(set(raw)) > 2


def svg_texts(path):
    root = ET.parse(path).getroot()
    assert root.tag.endswith("svg")
    return [t.text.strip() for t in root.iter() if t.tag.endswith("text") and t.text]


def check_figures(plots, stems):
    for stem in stems:
        for ext in ("png", "svg", "json"):
            assert (plots / f"{stem}.{ext}").stat().st_size > 0, f"{stem}.{ext}"
        check_png(plots / f"{stem}.png")
        svg_texts(plots / f"{stem}.svg")


# ---------------------------------------------------------------------------------------------- plot


def test_plot_writes_figures_whose_values_are_the_records_aggregates(tmp_path):
    records = fixture_records()
    rundir = write_run(tmp_path / "run", records)
    rsd_eval("plot", rundir)
    plots = rundir / "plots"
    check_figures(plots, STEMS)

    depths = sorted({r["depth"] for r in records if r["depth"] is not None})
    lengths = sorted({r["length"] for r in records})

    def cell(length=None, depth=None, needs_depth=True):
        return mean([r["score"] for r in records
                     if (length is None or r["length"] == length)
                     and (depth is None or r["depth"] == depth)
                     and (r["depth"] is not None or not needs_depth)])

    by_depth = json.loads((plots / "accuracy_by_depth.json").read_text())
    assert by_depth["kind"] == "lines"
    assert [s["name"] for s in by_depth["series"]] == [f"L={n}" for n in lengths]
    for s, n in zip(by_depth["series"], lengths):
        assert s["x"] == depths
        assert_values(s["y"], [cell(n, d) for d in depths])

    heat = json.loads((plots / "depth_length_heatmap.json").read_text())
    assert heat["kind"] == "heatmap"
    assert heat["columns"] == lengths and heat["rows"] == depths
    for row, d in zip(heat["values"], depths):
        assert_values(row, [cell(n, d) for n in lengths])
    # The values are written in the cells.
    texts = svg_texts(plots / "depth_length_heatmap.svg")
    for row in heat["values"]:
        for v in row:
            assert f"{v:.2f}" in texts

    by_len = json.loads((plots / "accuracy_by_length.json").read_text())
    (series,) = by_len["series"]
    assert series["x"] == lengths
    assert_values(series["y"], [cell(n, needs_depth=False) for n in lengths])


def test_plot_leaves_empty_cells_empty(tmp_path):
    records = [record("niah_single_1", 8, 0.0, 0, 1.0), record("niah_single_1", 8, 1.0, 0, 0.0),
               record("niah_single_1", 16, 0.0, 0, 0.5)]
    rundir = write_run(tmp_path / "run", records)
    rsd_eval("plot", rundir, "--out", tmp_path / "figs")
    heat = json.loads((tmp_path / "figs" / "depth_length_heatmap.json").read_text())
    assert heat["values"] == [[1.0, 0.5], [0.0, None]]


def test_plot_errors_name_the_file_and_line(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    p = fails("rsd-eval", "plot", empty)
    assert str(empty / "results.jsonl") in p.stderr

    rundir = write_run(tmp_path / "bad", fixture_records()[:2])
    with open(rundir / "results.jsonl", "a") as f:
        f.write('{"task": "niah_single_1", "length": "long"}\n')
    p = fails("rsd-eval", "plot", rundir)
    assert f"{rundir / 'results.jsonl'}:3:" in p.stderr, p.stderr


# ------------------------------------------------------------------------------------------- compare


def parse_table(md):
    lines = [l for l in md.splitlines() if l.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header[1:], cells[1:]))
    return header[1:], rows


def test_compare_table_and_figure_are_the_shared_records_aggregates(tmp_path):
    a = fixture_records(seed=1)
    # Run b lacks length 4096 and has an extra task: both are left out of the comparison.
    b = [r for r in fixture_records(seed=2) if r["length"] != 4096]
    b += [record("cwe", 1024, None, 0, 1.0)]
    ra, rb = write_run(tmp_path / "std", a), write_run(tmp_path / "rsd", b)
    out = tmp_path / "cmp"
    rsd_eval("compare", ra, rb, "--out", out, "--labels", "standard,rsd")

    shared = {(r["task"], r["length"]) for r in a} & {(r["task"], r["length"]) for r in b}
    lengths = sorted({n for _, n in shared})
    assert lengths == [1024, 2048]
    runs = {"standard": [r for r in a if (r["task"], r["length"]) in shared],
            "rsd": [r for r in b if (r["task"], r["length"]) in shared]}
    depths = sorted({r["depth"] for rs in runs.values() for r in rs if r["depth"] is not None})

    def columns(rs):
        cols = {f"L={n}": [r for r in rs if r["length"] == n] for n in lengths}
        cols.update({f"d={d:g}": [r for r in rs if r["depth"] == d] for d in depths})
        cols["all"] = rs
        return cols

    header, table = parse_table((out / "compare.md").read_text())
    assert header == list(columns(runs["rsd"]))
    numbers = json.loads((out / "compare.json").read_text())
    assert [r["label"] for r in numbers["rows"]] == ["standard", "rsd"]
    for row in numbers["rows"]:
        for (name, rs), got, text in zip(columns(runs[row["label"]]).items(), row["cells"],
                                         table[row["label"]].values()):
            want_mean, want_spread = mean([r["score"] for r in rs]), spread(rs)
            assert got["mean"] == pytest.approx(want_mean, abs=1e-12), name
            assert got["spread"] == pytest.approx(want_spread, abs=1e-12), name
            assert got["items"] == len(rs)
            assert text == f"{want_mean:.3f} ± {want_spread:.3f}", name

    fig = json.loads((out / "accuracy_by_depth.json").read_text())
    assert [s["name"] for s in fig["series"]] == ["standard", "rsd"]
    for s in fig["series"]:
        rs = runs[s["name"]]
        assert s["x"] == depths
        assert_values(s["y"], [mean([r["score"] for r in rs if r["depth"] == d]) for d in depths])
    # one line per run and length, each named with its items per point
    fig = json.loads((out / "accuracy_by_depth_and_length.json").read_text())
    want = []
    for label in ("standard", "rsd"):
        for n in lengths:
            cells = [[r["score"] for r in runs[label] if r["length"] == n and r["depth"] == d] for d in depths]
            counts = sorted({len(c) for c in cells if c})
            k = f"n={counts[0]}" if len(counts) == 1 else f"n={counts[0]}–{counts[-1]}"
            want.append((f"{label}, L={n} ({k})", [mean(c) for c in cells]))
    assert [s["name"] for s in fig["series"]] == [name for name, _ in want]
    for s, (_, ys) in zip(fig["series"], want):
        assert_values(s["y"], ys)
    check_figures(out, ["accuracy_by_depth", "accuracy_by_depth_and_length"])


def test_compare_refuses_runs_that_share_nothing(tmp_path):
    ra = write_run(tmp_path / "short", fixture_records(lengths=(1024,)))
    rb = write_run(tmp_path / "long", fixture_records(lengths=(8192,)))
    p = fails("rsd-eval", "compare", ra, rb, "--out", tmp_path / "cmp")
    assert str(ra) in p.stderr and str(rb) in p.stderr and "share no" in p.stderr, p.stderr
    p = fails("rsd-eval", "compare", ra, tmp_path / "nowhere", "--out", tmp_path / "cmp")
    assert str(tmp_path / "nowhere" / "results.jsonl") in p.stderr
    p = fails("rsd-eval", "compare", ra, ra, "--out", tmp_path / "cmp", "--labels", "one")
    assert "--labels" in p.stderr


# ----------------------------------------------------------------------------------------------- ppl

SEQ = 48


@pytest.fixture(scope="module")
def ppl_setup(tmp_path_factory):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    d = tmp_path_factory.mktemp("ppl")
    src = d / "src"
    src.mkdir()
    text = (REPO / "corpus" / "books" / "moby-dick.txt").read_text()[:12000]
    (src / "slice.txt").write_text(text)
    run("rsd-data", "pack", "--len", SEQ, "--src", src, "--out", d / "shards", timeout=300)
    torch.manual_seed(0)
    # The bundled Qwen3 tokenizer's ids (< 151,669) fit Qwen3's embedding size.
    cfg = LlamaConfig(vocab_size=151936, hidden_size=32,
                      intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, rope_theta=10000.0, tie_word_embeddings=True,
                      max_position_embeddings=512)
    m = LlamaForCausalLM(cfg)
    with torch.no_grad():  # larger weights: the views really differ
        for p in m.parameters():
            if p.dim() == 2:
                p.mul_(5.0)
    m.save_pretrained(d / "llama")
    return d


def shard_rows(shards):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    manifest = json.loads((shards / "index.json").read_text())
    tokens = []
    for shard in manifest["shards"]:
        ds = IndexedDataset(str(shards / shard["prefix"]))
        tokens += [np.asarray(ds[i], dtype=np.int64) for i in range(len(ds))]
    return np.concatenate(tokens).reshape(-1, manifest["seq_len"])


def reference(model_dir, rows, views, buckets):
    """Per bucket: mean NLL over rows i < L−1, mean KL(std ‖ skip view) over rows i ≥ s (fp64)."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float64, attn_implementation="eager")
    n = rows.shape[1]
    nll, kl = [[] for _ in range(buckets)], [[] for _ in range(buckets)]
    with torch.no_grad():
        for v in views:
            x = torch.from_numpy(rows[v["sample"]])[None]
            i = torch.arange(n)
            lp = F.log_softmax(m(input_ids=x, position_ids=i[None]).logits[0], -1)
            pos = torch.where(i >= v["split"], i + v["skip"], i)
            lq = F.log_softmax(m(input_ids=x, position_ids=pos[None]).logits[0], -1)
            k = (lp.exp() * (lp - lq)).sum(-1)
            assert k[:v["split"]].abs().max().item() < 1e-9 if v["split"] else True  # identical rows
            ce = -lp[:-1].gather(1, x[0, 1:, None])[:, 0]
            for r in range(n):
                b = r * buckets // n
                if r < n - 1:
                    nll[b].append(ce[r].item())
                if r >= v["split"]:
                    kl[b].append(k[r].item())
    return [mean(x) for x in nll], [mean(x) for x in kl]


def test_ppl_and_view_gap_match_transformers(ppl_setup):
    d = ppl_setup
    out = d / "out"
    args = ["ppl", "--model", d / "llama", "--shards", d / "shards", "--buckets", 4, "--seed", 7]
    p = rsd_eval(*args, "--batches", 2, "--batch-size", 2, "--dtype", "fp64", "--out", out)
    assert "view gap" in p.stdout
    report = json.loads((out / "ppl.json").read_text())
    assert report["rows"] == 4 and report["seq_len"] == SEQ
    views = report["views"]
    assert [v["sample"] for v in views] == [0, 1, 2, 3]
    for v in views:
        assert 0 <= v["split"] <= SEQ - 1 and 1 <= v["skip"] <= SEQ
    nll, gap = reference(d / "llama", shard_rows(d / "shards"), views, 4)
    for k, b in enumerate(report["buckets"]):
        assert (b["start"], b["end"]) == (k * SEQ // 4, (k + 1) * SEQ // 4)
        assert b["nll"] == pytest.approx(nll[k], rel=1e-4)
        assert b["ppl"] == pytest.approx(math.exp(nll[k]), rel=1e-4)
        if gap[k] is None:
            assert b["view_gap"] is None
        else:
            assert b["view_gap"] == pytest.approx(gap[k], rel=1e-4)
    assert any(g for g in gap if g and g > 1e-3), "the views should differ"

    # The figures beside ppl.json hold the same numbers.
    fig = json.loads((out / "plots" / "ppl_by_position.json").read_text())
    assert_values(fig["series"][0]["y"], [b["ppl"] for b in report["buckets"]])
    fig = json.loads((out / "plots" / "view_gap_by_position.json").read_text())
    assert_values(fig["series"][0]["y"], [b["view_gap"] for b in report["buckets"]])
    check_figures(out / "plots", ["ppl_by_position", "view_gap_by_position"])

    # The same seed draws the same views whatever the batch size; the default fp32 stays close
    # (the gap, a sum of small differences over 152k-entry distributions, to ~1e-4 relative);
    # plot re-draws from ppl.json.
    again = d / "again"
    rsd_eval(*args, "--batches", 4, "--batch-size", 1, "--out", again)
    report1 = json.loads((again / "ppl.json").read_text())
    assert report1["views"] == views
    for b, b1 in zip(report["buckets"], report1["buckets"]):
        assert b1["nll"] == pytest.approx(b["nll"], rel=1e-6)
        assert b1["view_gap"] == pytest.approx(b["view_gap"], rel=1e-3)
    rsd_eval("plot", again)
    check_figures(again / "plots", ["ppl_by_position", "view_gap_by_position"])


def test_ppl_refuses_what_it_cannot_evaluate(ppl_setup, tmp_path):
    d = ppl_setup
    p = fails("rsd-eval", "ppl", "--model", d / "llama", "--shards", tmp_path, "--out", tmp_path / "o")
    assert str(tmp_path) in p.stderr
    p = fails("rsd-eval", "ppl", "--model", d / "llama", "--shards", d / "shards", "--buckets", SEQ + 1,
              "--out", tmp_path / "o")
    assert "position buckets" in p.stderr


def test_ppl_refuses_a_manifest_seq_len_beyond_its_data(ppl_setup, tmp_path):
    """A manifest claiming rows of 2^40 tokens is an error naming the shards, not an allocation."""
    d = ppl_setup
    shards = tmp_path / "shards"
    shutil.copytree(d / "shards", shards)
    manifest = json.loads((shards / "index.json").read_text())
    manifest["seq_len"] = 1 << 40
    (shards / "index.json").write_text(json.dumps(manifest))
    p = fails("rsd-eval", "ppl", "--model", d / "llama", "--shards", shards, "--out", tmp_path / "o")
    assert p.returncode == 1, p.stderr
    assert f"{shards}: the manifest's seq_len 1099511627776 is more than the 16777216 tokens" in p.stderr, \
        p.stderr
    manifest["seq_len"] = SEQ * 2
    (shards / "index.json").write_text(json.dumps(manifest))
    p = fails("rsd-eval", "ppl", "--model", d / "llama", "--shards", shards, "--out", tmp_path / "o")
    assert p.returncode == 1, p.stderr
    assert f"{shards}: sample 0 has {SEQ} tokens, the manifest's seq_len is {2 * SEQ}" in p.stderr, p.stderr
