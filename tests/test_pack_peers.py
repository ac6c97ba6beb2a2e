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

from rsd_cli import rsd, run
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


# --- Re-tokenizing pre-tokenized (MDS) data, and one window per source sample (--truncate) ------

def llama3_docs(n_tokens, start=0):
    """ProLong-style documents: Llama-3 ids of pieces of the bundled books (3,000 to 15,000
    characters), each as BOS ids EOS, until `n_tokens` are made; `start` picks the first book."""
    tok = Tokenizer.from_file(str(LLAMA3))
    books = sorted((ROOT / "corpus/books").glob("*.txt"))
    text = "".join(b.read_text() for b in books[start % len(books):] + books[:start % len(books)])
    rng = np.random.default_rng(start)
    docs, total, at = [], 0, 0
    while total < n_tokens:
        n = int(rng.integers(3000, 15000))
        part, at = text[at:at + n], (at + n) % len(text)
        ids = [128000] + tok.encode(part, add_special_tokens=False).ids + [128001]
        docs.append(np.array(ids, dtype=np.uint32))
        total += len(ids)
    return docs


def mds_samples(docs, seq):
    """The document stream cut into samples of `seq` ids with ProLong's `indices` (a document that
    crosses a sample edge is cut there, as ProLong's are: the cut can fall inside a UTF-8 character)."""
    stream = np.concatenate(docs)
    ends = np.cumsum([len(d) for d in docs])
    samples = []
    for s0 in range(0, len(stream) - seq + 1, seq):
        bounds = sorted({s0, s0 + seq, *[int(e) for e in ends if s0 < e < s0 + seq]})
        indices = np.array([[a - s0, b - s0] for a, b in zip(bounds, bounds[1:])], dtype=np.uint32)
        samples.append((stream[s0:s0 + seq].copy(), indices))
    return samples


def write_mds(d, samples):
    from streaming import MDSWriter

    columns = {"input_ids": "ndarray:uint32", "indices": "ndarray:uint32", "domain": "str"}
    with MDSWriter(out=str(d), columns=columns, size_limit=1 << 22) as w:
        for ids, indices in samples:
            w.write({"input_ids": ids, "indices": indices, "domain": "book"})


def retokenized(samples, source_path, target_path, eos):
    """What re-tokenizing means, with HF tokenizers: per source sample, the list of its documents
    decoded with the source tokenizer (special tokens dropped) and encoded with the target one,
    EOS after each (empty documents skipped)."""
    src, tgt = Tokenizer.from_file(str(source_path)), Tokenizer.from_file(str(target_path))
    out = []
    for ids, indices in samples:
        docs = []
        for a, b in indices:
            text = src.decode([int(x) for x in ids[a:b]], skip_special_tokens=True)
            if text:
                docs.append(tgt.encode(text, add_special_tokens=False).ids + [eos])
        out.append(docs)
    return out


def sha256(path):
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.mark.skipif(not LLAMA3.exists(), reason="the Llama-3 tokenizer is fetched by scripts/setup.sh")
def test_mds_retokenized_for_another_tokenizer_matches_hf_tokenizers(tmp_path, qwen3_path):
    samples = mds_samples(llama3_docs(40_000), 8192)
    assert len(samples) >= 4 and all(len(ix) >= 2 for _, ix in samples)
    write_mds(tmp_path / "mds", samples)
    out = tmp_path / "out"
    res = rsd("pack", "--len", 4096, "--tail", "keep", "--src", tmp_path / "mds", "--tokenizer", qwen3_path,
              "--out", out, "--progress", "none")
    assert "re-tokenizing MDS ids" in res.stderr and "llama3-tokenizer.json" in res.stderr, res.stderr
    got, pieces, manifest = megatron_read(out)
    docs = [d for sample in retokenized(samples, LLAMA3, qwen3_path, 151643) for d in sample]
    want = np.array([t for d in docs for t in d], dtype=np.int64)
    assert len(got) == len(want)
    assert np.array_equal(got, want), f"first difference at token {np.argmax(got != want)}"
    assert manifest["totals"]["documents"] == len(docs), "document boundaries kept: one EOS per document"
    # The manifest says what the ids are and what they were made from; the directory carries the
    # tokenizer its ids belong to.
    assert manifest["tokenizer"]["sha256"] == sha256(qwen3_path) and manifest["tokenizer"]["vocab_size"] == 151669
    assert manifest["source_tokenizer"]["sha256"] == sha256(LLAMA3)
    assert manifest["source_tokenizer"]["vocab_size"] == 128256
    assert (out / "tokenizer.json").read_bytes() == qwen3_path.read_bytes()
    assert sum(sum(p) for p in pieces) == len(want)


@pytest.mark.skipif(not LLAMA3.exists(), reason="the Llama-3 tokenizer is fetched by scripts/setup.sh")
def test_mds_repack_states_the_source_tokenizer(tmp_path, qwen3_path):
    samples = mds_samples(llama3_docs(20_000), 4096)
    write_mds(tmp_path / "mds", samples)
    # No --tokenizer: a repack, ids kept, recorded as the Llama-3 tokenizer's (the default source).
    rsd("pack", "--len", 4096, "--src", tmp_path / "mds", "--out", tmp_path / "a", "--progress", "none")
    got, _, manifest = megatron_read(tmp_path / "a")
    assert np.array_equal(got, np.concatenate([ids for ids, _ in samples]).astype(np.int64))
    assert manifest["tokenizer"]["sha256"] == sha256(LLAMA3) and manifest["tokenizer"]["vocab_size"] == 128256
    assert "source_tokenizer" not in manifest
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == LLAMA3.read_bytes()
    # --tokenizer naming the source tokenizer is a repack too.
    rsd("pack", "--len", 4096, "--src", tmp_path / "mds", "--tokenizer", LLAMA3, "--out", tmp_path / "b",
        "--progress", "none")
    assert (tmp_path / "b" / "shard-00000.bin").read_bytes() == (tmp_path / "a" / "shard-00000.bin").read_bytes()
    # Ids made with another tokenizer: --source-tokenizer says which, and the manifest records it.
    rsd("pack", "--len", 4096, "--src", tmp_path / "mds", "--source-tokenizer", qwen3_path, "--out",
        tmp_path / "c", "--progress", "none")
    manifest = json.loads((tmp_path / "c" / "index.json").read_text())
    assert manifest["tokenizer"]["sha256"] == sha256(qwen3_path) and "source_tokenizer" not in manifest
    # --source-tokenizer with no MDS source is a mistake, named.
    res = rsd("pack", "--len", 64, "--src", ROOT / "corpus/books", "--source-tokenizer", qwen3_path,
              "--out", tmp_path / "d", ok=False)
    assert "--source-tokenizer" in res.stderr and not (tmp_path / "d" / "index.json").exists()


@pytest.mark.skipif(not LLAMA3.exists(), reason="the Llama-3 tokenizer is fetched by scripts/setup.sh")
def test_truncate_keeps_the_first_window_of_each_source_sample(tmp_path, qwen3_path):
    samples = mds_samples(llama3_docs(30_000), 4096)
    write_mds(tmp_path / "mds", samples)
    out = tmp_path / "out"
    res = rsd("pack", "--len", 1024, "--truncate", "--src", tmp_path / "mds", "--out", out, "--progress", "none")
    got, pieces, manifest = megatron_read(out)
    assert len(pieces) == len(samples), "one window per source sample"
    want = np.concatenate([ids[:1024] for ids, _ in samples]).astype(np.int64)
    assert np.array_equal(got, want)
    for (_, ix), p in zip(samples, pieces):  # the document boundaries inside each window
        ends = [int(e) for _, e in ix if e < 1024]
        assert np.cumsum(p).tolist() == ends + [1024]
    assert manifest["totals"]["truncated_tokens"] == len(samples) * (4096 - 1024)
    assert f"truncated  {len(samples) * 3072} tokens" in res.stdout
    # Plain fixed packing cuts every sample into four windows instead.
    rsd("pack", "--len", 1024, "--src", tmp_path / "mds", "--out", tmp_path / "fixed", "--progress", "none")
    assert json.loads((tmp_path / "fixed" / "index.json").read_text())["totals"]["samples"] == 4 * len(samples)
    res = rsd("pack", "--len", 1024, "--truncate", "--mode", "mixed", "--src", tmp_path / "mds",
              "--out", tmp_path / "m", ok=False)
    assert "--truncate" in res.stderr and "mixed" in res.stderr


@pytest.mark.skipif(not LLAMA3.exists(), reason="the Llama-3 tokenizer is fetched by scripts/setup.sh")
def test_the_qwen_pipeline_builds_the_papers_data(tmp_path, qwen3_path):
    """pipelines/prolong-512k-qwen3-256k.json, run as written on a miniature ProLong-512K (one
    524,288-id sample per subset): ProLong's Llama-3 ids re-tokenized for Qwen3, the first 256K
    tokens of each 512K sample kept (the paper's §4.1), the rest counted."""
    pipeline = json.loads((ROOT / "pipelines/prolong-512k-qwen3-256k.json").read_text())
    root = tmp_path / "datasets"
    subsets = {"book-524288": 0, "thestackv1_concat_by_repo-524288": 7}
    written = {}
    for subset, start in subsets.items():
        samples = mds_samples(llama3_docs(524_288, start), 524_288)[:1]
        write_mds(root / "prolong-data-512K" / subset / "proc00-64", samples)
        written[subset] = samples
    # The model directory the pipeline names holds Qwen3's tokenizer.
    (tmp_path / "models/Qwen3-4B").mkdir(parents=True)
    shutil.copy(qwen3_path, tmp_path / "models/Qwen3-4B/tokenizer.json")
    local = lambda a: str(tmp_path / a) if a.startswith(("data/", "models/")) else a
    for cmd in pipeline["build"]:
        assert cmd[:2] == ["rsd-data", "pack"]
        run("rsd-data", *map(local, cmd[1:]), "--progress", "none", env={"RSD_DATA_ROOT": str(root)},
            timeout=600)
    assert [d["dir"] for d in pipeline["datasets"]] == [c[c.index("--out") + 1] for c in pipeline["build"]]
    for cmd, subset in zip(pipeline["build"], subsets):
        out = Path(local(cmd[cmd.index("--out") + 1]))
        got, pieces, manifest = megatron_read(out)
        docs = retokenized(written[subset], LLAMA3, qwen3_path, 151643)[0]
        stream = [t for d in docs for t in d]
        assert len(stream) > 262_144
        assert len(pieces) == 1 and np.array_equal(got, np.array(stream[:262_144], dtype=np.int64))
        assert manifest["totals"]["truncated_tokens"] == len(stream) - 262_144
        assert manifest["tokenizer"]["sha256"] == sha256(qwen3_path)
        assert manifest["source_tokenizer"]["sha256"] == sha256(LLAMA3)


@pytest.mark.parametrize("path", sorted((ROOT / "pipelines").glob("*.json")), ids=lambda p: p.name)
def test_shipped_pipelines_build_what_they_list(tmp_path, path):
    """Each pipeline's `build` commands write exactly its datasets, and every flag in them is one
    rsd-data accepts (run against an empty data root they stop at the missing corpus, not at a
    usage error)."""
    pipeline = json.loads(path.read_text())
    build = pipeline.get("build", [])
    if not build:
        pytest.skip("no build commands (packed from the bundled corpus, see its about)")
    assert [d["dir"] for d in pipeline["datasets"]] == [c[c.index("--out") + 1] for c in build]
    for cmd in build:
        assert cmd[:2] == ["rsd-data", "pack"]
        local = [str(tmp_path / a) if a.startswith(("data/", "models/")) else a for a in cmd[1:]]
        p = run("rsd-data", *local, check=False, env={"RSD_DATA_ROOT": str(tmp_path / "empty")})
        assert p.returncode == 1 and "no ProLong data found" in p.stderr, p.stderr


def test_mds_retokenized_with_the_repos_own_tokenizers_matches_hf_tokenizers(tmp_path, qwen3_path):
    """Needs no fetched asset: MDS of Qwen3 ids (the bundled tokenizer, as --source-tokenizer)
    re-tokenized with a small byte-level BPE trained here, against HF tokenizers doing the same."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    books = [b.read_text() for b in sorted((ROOT / "corpus/books").glob("*.txt"))[:12]]
    small = Tokenizer(models.BPE())
    small.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    small.decoder = decoders.ByteLevel()
    small.train_from_iterator(books, trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>"],
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    small_path = tmp_path / "small.json"
    small.save(str(small_path))
    eos = small.token_to_id("<|endoftext|>")
    qwen = Tokenizer.from_file(str(qwen3_path))
    text = "".join(books)
    docs = [np.array(qwen.encode(text[a:a + 4000], add_special_tokens=False).ids + [151643], dtype=np.uint32)
            for a in range(0, 120_000, 4000)]
    samples = mds_samples(docs, 2048)
    write_mds(tmp_path / "mds", samples)
    out = tmp_path / "out"
    rsd("pack", "--len", 1024, "--tail", "keep", "--src", tmp_path / "mds", "--source-tokenizer", qwen3_path,
        "--tokenizer", small_path, "--out", out, "--progress", "none")
    got, _, manifest = megatron_read(out)
    want = [t for sample in retokenized(samples, qwen3_path, small_path, eos) for d in sample for t in d]
    assert np.array_equal(got, np.array(want, dtype=np.int64))
    assert manifest["source_tokenizer"]["sha256"] == sha256(qwen3_path)
    assert manifest["tokenizer"]["sha256"] == sha256(small_path) and manifest["tokenizer"]["eos_id"] == eos
