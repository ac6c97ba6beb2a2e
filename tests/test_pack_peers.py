"""rsd-data pack against real peers: Hugging Face tokenizers (the oracle for token ids), megatron-core
(reads our .bin/.idx unchanged), mosaicml-streaming (writes the MDS we repack), pyarrow and datasets
(write the Parquet and Arrow we read), and the zstd CLI (writes the .zst we read).

Run with the project venv: scripts/test.sh (or `pytest tests/test_pack_peers.py` after it)."""

import json
import os
import subprocess
import shutil
from pathlib import Path

import numpy as np
import pytest

from rsd_cli import rsd
import zstandard
from tokenizers import Tokenizer
from megatron.core.datasets.indexed_dataset import IndexedDataset

ROOT = Path(__file__).resolve().parents[1]
LLAMA3 = Path(os.environ.get("RSD_ASSETS", Path.home() / ".cache/rsd/assets")) / "llama3-tokenizer.json"


@pytest.fixture(scope="session")
def qwen3_path(tmp_path_factory):
    """The bundled Qwen3 tokenizer.json, decompressed."""
    out = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    raw = (ROOT / "assets/tokenizers/qwen3/tokenizer.json.zst").read_bytes()
    out.write_bytes(zstandard.ZstdDecompressor().decompress(raw, max_output_size=64 << 20))
    return out


def megatron_read(out_dir):
    """Every shard through megatron-core's IndexedDataset: (all tokens, per-sample piece lengths)."""
    manifest = json.loads((out_dir / "index.json").read_text())
    tokens, samples = [], []
    for shard in manifest["shards"]:
        ds = IndexedDataset(str(out_dir / shard["prefix"]))
        assert len(ds) == shard["pieces"]
        docs = ds.document_indices
        assert docs[0] == 0 and docs[-1] == len(ds) and len(docs) == shard["samples"] + 1
        lengths = ds.sequence_lengths
        for k in range(len(docs) - 1):
            samples.append([int(x) for x in lengths[docs[k]:docs[k + 1]]])
        for i in range(len(ds)):
            tokens.append(np.asarray(ds[i], dtype=np.int64))
    return np.concatenate(tokens), samples, manifest


def expected_stream(tokenizer_path, docs, bos, eos):
    tok = Tokenizer.from_file(str(tokenizer_path))
    out = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        out.extend(([bos] if bos is not None else []) + enc.ids + ([eos] if eos is not None else []))
    return np.array(out, dtype=np.int64)


def tricky_docs():
    docs = [
        "Special literals stay special: <|endoftext|> and <|im_start|>user and <|begin_of_text|> here.",
        "Unicode: naïve café — 東京 🚀 \u200b zero-width, tabs\tand\r\nCRLF",
        "def f(x):\n    return x ** 2  # code\n",
        "   leading and trailing whitespace   ",
    ]
    docs += [f"Row {i}: " + "All work and no play makes Jack a dull boy. " * (i % 5 + 1) for i in range(60)]
    return docs


@pytest.mark.parametrize("which", ["qwen3", "llama3"])
def test_real_corpus_ids_match_hf_tokenizers_and_megatron_reads_them(tmp_path, qwen3_path, which):
    tok_path = qwen3_path if which == "qwen3" else LLAMA3
    books = sorted((ROOT / "corpus/books").glob("*.txt"))
    out = tmp_path / "out"
    rsd("pack", "--len", 4096, "--tail", "keep", "--shard-size", "2MiB", "--tokenizer", tok_path,
        "--src", ROOT / "corpus/books", "--out", out, "--progress", "none")
    got, samples, manifest = megatron_read(out)
    bos, eos = (None, 151643) if which == "qwen3" else (128000, 128001)
    assert manifest["tokenizer"]["bos_id"] == bos and manifest["tokenizer"]["eos_id"] == eos
    assert len(manifest["shards"]) > 1
    want = expected_stream(tok_path, [b.read_text() for b in books], bos, eos)
    assert len(got) == len(want)
    assert np.array_equal(got, want), f"first difference at token {np.argmax(got != want)}"
    assert all(sum(s) == 4096 for s in samples[:-1])


def test_special_token_literals_and_parquet_from_pyarrow(tmp_path, qwen3_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = tricky_docs()
    table = pa.table({"id": list(range(len(docs))), "body": docs})
    path = tmp_path / "d.parquet"
    pq.write_table(table, path, row_group_size=7)
    assert pq.ParquetFile(path).num_row_groups > 5
    out = tmp_path / "out"
    res = rsd("pack", "--len", 100, "--src", path, "--out", tmp_path / "bad", ok=False)
    assert "d.parquet" in res.stderr and "no column \"text\"" in res.stderr and "body" in res.stderr and "id" in res.stderr
    rsd("pack", "--len", 100, "--tail", "keep", "--text-field", "body", "--src", path, "--out", out, "--progress", "none")
    got, _, _ = megatron_read(out)
    assert np.array_equal(got, expected_stream(qwen3_path, docs, None, 151643))

    # A Parquet file cut short (an interrupted download) is refused, naming the file.
    truncated = tmp_path / "cut.parquet"
    data = path.read_bytes()
    truncated.write_bytes(data[: len(data) * 2 // 3])
    res = rsd("pack", "--len", 100, "--text-field", "body", "--src", truncated, "--out", tmp_path / "o3", ok=False)
    assert "cut.parquet" in res.stderr and "Parquet" in res.stderr


def test_arrow_written_by_datasets_save_to_disk_and_pyarrow_ipc_file(tmp_path, qwen3_path):
    import datasets
    import pyarrow as pa

    docs = tricky_docs()
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": docs, "n": list(range(len(docs)))}).save_to_disk(str(saved), num_shards=3)
    out = tmp_path / "out"
    rsd("pack", "--len", 128, "--tail", "keep", "--src", saved, "--out", out, "--progress", "none")
    got, _, manifest = megatron_read(out)
    assert manifest["sources"][0]["format"] == "arrow" and manifest["sources"][0]["files"] == 3
    assert np.array_equal(got, expected_stream(qwen3_path, docs, None, 151643))

    ipc = tmp_path / "file.arrow"
    table = pa.table({"text": docs})
    with pa.ipc.new_file(str(ipc), table.schema) as w:
        for batch in table.to_batches(max_chunksize=9):
            w.write_batch(batch)
    out2 = tmp_path / "out2"
    rsd("pack", "--len", 128, "--tail", "keep", "--src", ipc, "--out", out2, "--progress", "none")
    got2, _, _ = megatron_read(out2)
    assert np.array_equal(got2, got)


def test_jsonl_zst_written_by_the_zstd_cli(tmp_path, qwen3_path):
    docs = tricky_docs()
    plain = tmp_path / "d.jsonl"
    plain.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    subprocess.run(["zstd", "-q", "-19", str(plain), "-o", str(tmp_path / "d.jsonl.zst")], check=True)
    plain.unlink()
    out = tmp_path / "out"
    rsd("pack", "--len", 50, "--tail", "keep", "--src", tmp_path / "d.jsonl.zst", "--out", out, "--progress", "none")
    got, _, _ = megatron_read(out)
    assert np.array_equal(got, expected_stream(qwen3_path, docs, None, 151643))


def write_prolong_mds(root, samples_per_dir=6, seq=1024, seed=0, compression=None):
    """ProLong-style MDS (book-65536/procNN-64) written by mosaicml-streaming's MDSWriter."""
    from streaming import MDSWriter

    rng = np.random.default_rng(seed)
    columns = {"input_ids": "ndarray:uint32", "indices": "ndarray:uint32", "domain": "str", "length": "int"}
    written = []
    for proc in range(2):
        d = root / "prolong-data-64K" / "book-65536" / f"proc{proc:02d}-64"
        with MDSWriter(out=str(d), columns=columns, compression=compression, size_limit=1 << 14) as w:
            for _ in range(samples_per_dir):
                cuts = np.sort(rng.choice(np.arange(1, seq), size=rng.integers(0, 4), replace=False))
                bounds = np.concatenate([[0], cuts, [seq]])
                ids = rng.integers(0, 128000, size=seq, dtype=np.uint32)
                indices = np.stack([bounds[:-1], bounds[1:]], axis=1).astype(np.uint32)
                for s, _ in indices:
                    ids[s] = 128000  # each document starts with BOS, as in ProLong
                w.write({"input_ids": ids, "indices": indices, "domain": "book", "length": seq})
                written.append((ids, [int(e - s) for s, e in indices]))
    return written


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_prolong_mds_from_streaming_is_repacked_with_its_boundaries(tmp_path, compression):
    written = write_prolong_mds(tmp_path / "root", compression=compression)
    assert len(list((tmp_path / "root").rglob("*.mds*"))) > 2, "several MDS shards per directory"
    out = tmp_path / "out"
    res = rsd("pack", "--len", 1024, "--src", "prolong/book", "--data-root", tmp_path / "root",
              "--out", out, "--progress", "none")
    assert "llama3-tokenizer.json" in res.stderr  # the default tokenizer for ProLong ids
    got, samples, manifest = megatron_read(out)
    assert manifest["tokenizer"]["vocab_size"] == 128256 and manifest["dtype"] == "int32"
    assert len(samples) == len(written)
    assert np.array_equal(got, np.concatenate([ids for ids, _ in written]).astype(np.int64))
    assert samples == [pieces for _, pieces in written], "document boundaries kept exactly"
    # The repack adds nothing: no BOS/EOS of its own.
    assert manifest["totals"]["tokens"] == 1024 * len(written)


def test_mds_ids_outside_the_vocab_and_truncated_shards_are_refused(tmp_path, qwen3_path):
    from streaming import MDSWriter

    d = tmp_path / "mds"
    with MDSWriter(out=str(d), columns={"input_ids": "ndarray:uint32", "indices": "ndarray:uint32"}) as w:
        ids = np.arange(100, dtype=np.uint32)
        ids[57] = 200000
        w.write({"input_ids": ids, "indices": np.array([[0, 100]], dtype=np.uint32)})
    res = rsd("pack", "--len", 64, "--src", d, "--tokenizer", qwen3_path, "--out", tmp_path / "o", ok=False)
    assert "shard.00000.mds:sample 0 document 0" in res.stderr and "200000" in res.stderr and "vocabulary" in res.stderr

    written = write_prolong_mds(tmp_path / "root", samples_per_dir=3)
    shard = sorted((tmp_path / "root").rglob("shard.00000.mds"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    res = rsd("pack", "--len", 1024, "--src", tmp_path / "root", "--tokenizer", LLAMA3, "--out", tmp_path / "o2", ok=False)
    assert str(shard) in res.stderr and "truncated" in res.stderr
    assert written  # the fixture wrote real samples


def test_tokenizer_the_fast_encoder_cannot_run_falls_back_to_tokenizers_022(tmp_path):
    """A `Split` pre-tokenizer with a look-behind loads in tokenizers 1.0.0-rc.3 but cannot encode
    there; pack must say so, fall back to 0.22 and still produce exactly HF tokenizers' ids."""
    from tokenizers import Regex, models, pre_tokenizers

    words = ["the", "whale", "ab", "call", "me", "ishmael", "sea", "b", "a", "s", " ", ".", ","]
    vocab = {"[UNK]": 0, "</s>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"(?<=a)b|(?!b)\w+|\s+|[.,]"), behavior="isolated")
    tok.add_special_tokens(["</s>"])
    path = tmp_path / "lookbehind.json"
    tok.save(str(path))
    docs = [f"call me ishmael {i}. the whale ab, the sea" * (i % 3 + 1) for i in range(40)]
    src = tmp_path / "d.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    out = tmp_path / "out"
    res = rsd("pack", "--len", 32, "--tail", "keep", "--src", src, "--tokenizer", path, "--out", out,
              "--progress", "none")
    assert "using tokenizers 0.22" in res.stderr and "cannot encode" in res.stderr, res.stderr
    got, _, _ = megatron_read(out)
    assert np.array_equal(got, expected_stream(path, docs, None, 1))
