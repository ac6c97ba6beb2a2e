"""rsd-data pack on broken inputs: each kind of damage is an error naming the file (and the line, row,
sample or byte), or with --skip-bad is skipped, counted per file and cause, listed at the end and
recorded in the manifest (totals.bad_inputs), keeping what is readable.

The broken files are made here with the peers that write them (zstandard, pyarrow,
mosaicml-streaming); every file is tiny, so the whole module runs in seconds."""

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from rsd_cli import rsd

GOOD_DOCS = 3


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    """A byte-level tokenizer of 257 ids (bytes and <|endoftext|>): it loads in milliseconds where a
    real vocabulary takes seconds, and the MDS ids below are all inside it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    t = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.add_special_tokens(["<|endoftext|>"])
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    t.save(str(path))
    return path


def jsonl(n, tag):
    return "".join(json.dumps({"text": f"{tag} document {i}, a few words long"}) + "\n" for i in range(n)).encode()


def zst_blocks(data, blocks=8):
    """One zstd frame of several blocks, as a large file has: damage late in it leaves the blocks
    before it decodable."""
    c = zstandard.ZstdCompressor(write_checksum=True).compressobj()
    step = len(data) // blocks + 1
    out = b"".join(c.compress(data[k:k + step]) + c.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
                   for k in range(0, len(data), step))
    return out + c.flush()


ZST_LINES = 8000  # about 400 KB: several of the decoder's 128 KB reads
TABLE = pa.table({"text": [f"row {i} has some text" for i in range(300)]})


def write_mds(d, n=4, compression=None):
    from streaming import MDSWriter

    columns = {"input_ids": "ndarray:uint32", "indices": "ndarray:uint32"}
    with MDSWriter(out=str(d), columns=columns, compression=compression) as w:
        for k in range(n):
            w.write({"input_ids": np.arange(100 + k, 164 + k, dtype=np.uint32),
                     "indices": np.array([[0, 64]], dtype=np.uint32)})


# Each case: (file name, a writer of the broken file, expected cause, words the error must hold,
# whether some of its documents are kept).
def zst_truncated(p):
    z = zst_blocks(jsonl(ZST_LINES, "zst"))
    p.write_bytes(z[: len(z) * 3 // 4])


def zst_corrupt(p):
    z = bytearray(zst_blocks(jsonl(ZST_LINES, "zst")))
    for k in range(len(z) * 3 // 4, len(z) * 3 // 4 + 16):
        z[k] ^= 0xA5
    p.write_bytes(bytes(z))


def zst_not_zstd(p):
    p.write_bytes(jsonl(3, "plain"))


def zst_trailing_garbage(p):
    p.write_bytes(zst_blocks(jsonl(ZST_LINES, "zst")) + b"these bytes are not zstd")


def parquet_truncated_footer(p):
    pq.write_table(TABLE, p)
    p.write_bytes(p.read_bytes()[:-30])


def parquet_corrupt_page(p):
    pq.write_table(TABLE, p, compression="snappy", write_statistics=False)
    b = bytearray(p.read_bytes())
    for k in range(40, 120):
        b[k] ^= 0x5A
    p.write_bytes(bytes(b))


def parquet_not_parquet(p):
    p.write_bytes(b"just some text, not Parquet at all\n" * 4)


def parquet_text_of_another_type(p):
    pq.write_table(pa.table({"text": pa.array([1, 2, 3], pa.int64())}), p)


def arrow_truncated_stream(p):
    with pa.ipc.new_stream(p, TABLE.schema) as w:
        w.write_table(TABLE, max_chunksize=50)
    b = p.read_bytes()
    p.write_bytes(b[: len(b) * 2 // 3])


def text_dangling_symlink(p):
    os.symlink(p.parent / "gone.txt", p)


def text_unreadable(p):
    # A link to itself fails to open (ELOOP) for every user, root included (a chmod 0 file is
    # readable by root); a link out of the directory, such as to /proc/self/mem, is refused
    # before anything is read (crates/rsd-data/tests/hostile.rs).
    os.symlink(p.name, p)


CASES = {
    "zst_truncated": ("b.jsonl.zst", zst_truncated, "truncated", ["line"], True),
    "zst_corrupt": ("b.jsonl.zst", zst_corrupt, "corrupt", ["line"], True),
    "zst_not_zstd": ("b.jsonl.zst", zst_not_zstd, "wrong-format", ["not zstd", "starts with bytes"], False),
    "zst_trailing_garbage": ("b.jsonl.zst", zst_trailing_garbage, "corrupt", ["not zstd", f"line {ZST_LINES + 1}"], True),
    "parquet_truncated_footer": ("b.parquet", parquet_truncated_footer, "truncated", ["PAR1"], False),
    "parquet_corrupt_page": ("b.parquet", parquet_corrupt_page, "corrupt", ["row 0"], False),
    "parquet_not_parquet": ("b.parquet", parquet_not_parquet, "wrong-format", ["not a Parquet file"], False),
    "parquet_text_of_another_type": ("b.parquet", parquet_text_of_another_type, "schema",
                                     ["has type Int64, expected a string"], False),
    "arrow_truncated_stream": ("b.arrow", arrow_truncated_stream, "truncated", ["after row"], True),
    "text_dangling_symlink": ("b.txt", text_dangling_symlink, "unreadable", ["No such file"], False),
    "text_unreadable": ("b.txt", text_unreadable, "unreadable", ["Too many levels of symbolic links"], False),
}


def good_file(d, name):
    """A readable file of GOOD_DOCS documents in the broken file's format, sorting before it."""
    if name.endswith(".jsonl.zst"):
        (d / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl(GOOD_DOCS, "good")))
    elif name.endswith(".parquet"):
        pq.write_table(TABLE.slice(0, GOOD_DOCS), d / "a.parquet")
    elif name.endswith(".arrow"):
        with pa.ipc.new_stream(d / "a.arrow", TABLE.schema) as w:
            w.write_table(TABLE.slice(0, GOOD_DOCS))
    else:
        for k in range(GOOD_DOCS):
            (d / f"a{k}.txt").write_text(f"good text document {k}")


def pack(tok, src, out, *extra, ok=True, length=8):
    return rsd("pack", "--len", length, "--tail", "keep", "--progress", "none", "--tokenizer", tok, "--src", src,
               "--out", out, *extra, ok=ok)


def manifest(out):
    return json.loads((out / "index.json").read_text())


@pytest.mark.parametrize("case", CASES)
def test_broken_file_is_an_error_or_skipped_keeping_what_is_readable(tmp_path, tok, case):
    name, write, cause, words, keeps_some = CASES[case]
    d = tmp_path / "src"
    d.mkdir()
    good_file(d, name)
    broken = d / name
    write(broken)

    res = pack(tok, d, tmp_path / "o1", ok=False)
    err = res.stderr
    assert str(broken) in err and all(w in err for w in words), err
    assert not (tmp_path / "o1" / "index.json").exists()
    # An OS error is printed once, not once per layer of the error chain.
    assert err.count("(os error") <= 1, err

    res = pack(tok, d, tmp_path / "o2", "--skip-bad")
    m = manifest(tmp_path / "o2")
    [bad] = m["totals"]["bad_inputs"]
    assert (bad["path"], bad["cause"], bad["count"]) == (str(broken), cause, 1), bad
    assert all(w in bad["first"] for w in words), bad
    assert f"1 {cause}" in res.stdout and str(broken) in res.stdout, res.stdout
    kept = m["totals"]["documents"] - GOOD_DOCS
    assert (kept > 0) == keeps_some, f"{kept} documents of the broken file kept"


def test_truncated_mds_shard_keeps_its_intact_samples(tmp_path, tok):
    d = tmp_path / "mds"
    write_mds(d, n=4)
    shard = d / "shard.00000.mds"
    shard.write_bytes(shard.read_bytes()[:-100])  # cuts into the last sample only
    res = pack(tok, d, tmp_path / "o1", ok=False, length=64)
    assert str(shard) in res.stderr and "truncated" in res.stderr and "samples 3.." in res.stderr, res.stderr

    res = pack(tok, d, tmp_path / "o2", "--skip-bad", length=64)
    m = manifest(tmp_path / "o2")
    assert m["totals"]["documents"] == 3
    assert [(b["path"], b["cause"]) for b in m["totals"]["bad_inputs"]] == [(str(shard), "truncated")]


def test_truncated_zstd_mds_shard_is_an_error_or_skipped(tmp_path, tok):
    d = tmp_path / "mds"
    write_mds(d, n=4, compression="zstd")
    [shard] = d.glob("*.mds.zstd")
    shard.write_bytes(shard.read_bytes()[:-20])
    write_mds(tmp_path / "good")
    res = pack(tok, d, tmp_path / "o1", ok=False, length=64)
    assert str(shard) in res.stderr and "truncated zstd data" in res.stderr, res.stderr
    res = pack(tok, d, tmp_path / "o2", "--skip-bad", "--src", tmp_path / "good", length=64)
    m = manifest(tmp_path / "o2")
    assert m["totals"]["documents"] == 4, "the good dataset's"
    assert [(b["path"], b["cause"]) for b in m["totals"]["bad_inputs"]] == [(str(shard), "truncated")]


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_null_text_is_a_bad_record_naming_file_row_and_column(tmp_path, tok, fmt):
    d = tmp_path / "src"
    d.mkdir()
    table = pa.table({"body": ["first text", None, "third text", None]})
    path = d / f"n.{fmt}"
    if fmt == "parquet":
        pq.write_table(table, path)
    else:
        with pa.ipc.new_file(path, table.schema) as w:
            w.write_table(table)
    res = pack(tok, d, tmp_path / "o1", "--text-field", "body", ok=False)
    assert f"{path}:row 1" in res.stderr and 'column "body" is null' in res.stderr, res.stderr

    res = pack(tok, d, tmp_path / "o2", "--text-field", "body", "--skip-bad")
    m = manifest(tmp_path / "o2")
    assert (m["totals"]["documents"], m["totals"]["skipped_documents"]) == (2, 2)
    [bad] = m["totals"]["bad_inputs"]
    assert (bad["cause"], bad["count"]) == ("bad-record", 2) and ":row 1:" in bad["first"], bad
    assert "2 bad-record" in res.stdout
    shown = rsd("inspect", tmp_path / "o2").stdout
    assert f"bad input    bad-record ×2 skipped with --skip-bad: {path}:row 1:" in shown, shown


def test_mds_index_that_is_not_json_says_where_it_breaks_or_is_skipped(tmp_path, tok):
    d = tmp_path / "mds"
    write_mds(d)
    index = d / "index.json"
    index.write_text('{"version": 2,\n  "shards": [,]\n}')
    res = pack(tok, d, tmp_path / "o", ok=False)
    assert f"{index}: not valid JSON at line 2 column 14: expected value\n" in res.stderr, res.stderr
    assert "no files of a known format" not in res.stderr
    # With --skip-bad the damaged dataset is skipped like a broken file, beside a good one.
    write_mds(tmp_path / "good")
    res = pack(tok, d, tmp_path / "o2", "--skip-bad", "--src", tmp_path / "good", length=64)
    [bad] = manifest(tmp_path / "o2")["totals"]["bad_inputs"]
    assert (bad["path"], bad["cause"]) == (str(index), "corrupt"), bad


def test_mds_column_in_an_unsupported_encoding_names_both_and_is_never_unpickled(tmp_path, tok):
    from streaming import MDSWriter

    d = tmp_path / "mds"
    with MDSWriter(out=str(d), columns={"input_ids": "pkl", "indices": "ndarray:uint32"}) as w:
        w.write({"input_ids": [1, 2, 3], "indices": np.array([[0, 3]], dtype=np.uint32)})
    res = pack(tok, d, tmp_path / "o", ok=False)
    assert str(d / "index.json") in res.stderr, res.stderr
    assert 'column "input_ids" is encoded "pkl", expected "ndarray"' in res.stderr, res.stderr


def test_code_repositories_with_a_symlink_loop_pack_each_file_once(tmp_path, tok):
    repos = tmp_path / "repos"
    (repos / "r1" / "src").mkdir(parents=True)
    (repos / "r1" / "src" / "main.rs").write_text("fn main() {}\n")
    os.symlink("loop", repos / "r1" / "loop")  # a link to itself: ELOOP when followed
    os.symlink("..", repos / "r1" / "src" / "up")  # a directory cycle
    os.symlink("main.rs", repos / "r1" / "src" / "again.rs")
    (repos / "r2").mkdir()
    (repos / "r2" / "lib.py").write_text("x = 1\n")
    os.symlink(".", repos / "r3")  # a repository that is a link to the directory of repositories
    out = tmp_path / "o"
    res = pack(tok, repos, out, length=64)
    for link, why in [("r1/loop", "a link that leads nowhere (dangling, or a loop); not followed"),
                      ("r1/src/up", "a link to a directory; not followed"),
                      ("r1/src/again.rs", "a link to a file of the same repository; read once, under its own name"),
                      ("r3", "a link to a directory; not followed")]:
        assert f"warning: {repos / link}: {why}" in res.stderr, res.stderr
    assert "Too many levels" not in res.stderr
    m = manifest(out)
    assert m["sources"][0]["format"] == "code" and m["totals"]["documents"] == 2
    shown = rsd("inspect", out, "--sample", 0, "--chars", 400).stdout
    assert shown.count("fn main() {}") == 1 and "again.rs" not in shown, shown


def test_text_directory_links_files_once_and_not_directories(tmp_path, tok):
    d = tmp_path / "books"
    (d / "real").mkdir(parents=True)
    (d / "real" / "a.txt").write_text("the one real book")
    os.symlink("real/a.txt", d / "link.txt")
    os.symlink("real", d / "dirlink")
    os.symlink(d, tmp_path / "books-link")
    out = tmp_path / "o"
    res = pack(tok, tmp_path / "books-link", out)  # a --src that is itself a link is followed
    assert f"{tmp_path / 'books-link' / 'dirlink'}: a link to a directory; not followed" in res.stderr, res.stderr
    assert res.stderr.count("warning:") == 2 and "the same file as" in res.stderr, res.stderr
    assert manifest(out)["totals"]["documents"] == 1


@pytest.mark.parametrize("value", ["0", "-5", "lots"])
def test_len_that_is_not_a_positive_number_says_what_is_wrong(tmp_path, tok, value):
    (tmp_path / "a.txt").write_text("text")
    res = rsd("pack", "--len", value, "--tokenizer", tok, "--src", tmp_path / "a.txt", "--out", tmp_path / "o",
              ok=False)
    assert "--len" in res.stderr and value in res.stderr and "at least 1" in res.stderr, res.stderr
    assert "unexpected argument" not in res.stderr


def test_an_empty_zst_is_an_empty_input_not_a_broken_one(tmp_path, tok):
    d = tmp_path / "src"
    d.mkdir()
    good_file(d, "x.jsonl.zst")
    (d / "b.jsonl.zst").write_bytes(b"")
    pack(tok, d, tmp_path / "o")
    m = manifest(tmp_path / "o")
    assert (m["totals"]["documents"], m["totals"]["bad_inputs"]) == (GOOD_DOCS, [])
