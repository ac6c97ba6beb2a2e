"""rsd-data pack on inputs written to hurt it: one huge document, a damaged resume journal. Each
answer is a clear error, or a pack in bounded memory, never an abort.

Memory bounds are enforced with an address-space limit on the child (RLIMIT_AS): an allocation
past it fails, and Rust aborts, which shows here as a failed run instead of a slow machine."""

import json
import resource
import subprocess

import pytest
import zstandard

from rsd_cli import ROOT as REPO, exe

# Far more than the pack below needs (about 1 GiB: a debug build, its threads' stacks and malloc
# arenas, a 200 MiB line held twice and its ids), far less than the ~9 GB that tokenizing the
# whole word at once took.
ADDRESS_SPACE = 4_000_000_000


def limited(*args, limit=ADDRESS_SPACE, env=None, timeout=600):
    """`rsd-data ARGS` under an address-space limit; the CompletedProcess."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    p = subprocess.run([exe("rsd-data"), *map(str, args)], capture_output=True, text=True,
                       preexec_fn=cap, env=env, timeout=timeout)
    assert "panicked" not in p.stderr, p.stderr
    return p


def test_one_document_of_one_200_mib_word_packs_in_bounded_memory(tmp_path):
    # A few KB on disk, 200 MiB decoded: under the default --max-doc-bytes (256MiB).
    c = zstandard.ZstdCompressor(level=3).compressobj()
    parts = [c.compress(b'{"text": "')]
    chunk = b"a" * (1 << 20)
    parts += [c.compress(chunk) for _ in range(200)]
    parts += [c.compress(b'"}\n'), c.flush()]
    src = tmp_path / "word.jsonl.zst"
    src.write_bytes(b"".join(parts))
    assert src.stat().st_size < 64 << 10
    out = tmp_path / "out"
    # 32,000× its stored size: a bomb by the default --max-expansion, so raised (what is
    # measured here is memory, not the bound).
    p = limited("pack", "--src", src, "--out", out, "--len", "4096", "--tail", "keep",
                "--workers", "1", "--read-threads", "1", "--progress", "none",
                "--max-expansion", "1000000")
    assert p.returncode == 0, f"exit {p.returncode}:\n{p.stderr[-2000:]}"
    manifest = json.loads((out / "index.json").read_text())
    assert manifest["totals"]["documents"] == 1
    assert manifest["totals"]["tokens"] > 0


def write_corpus(path, n=400):
    path.write_text("".join(json.dumps({"text": f"document {i}: the quick brown fox"}) + "\n"
                            for i in range(n)))


def crashed_pack(src, out):
    """A pack stopped (as by a crash) after two shards: its journal is left in `out`."""
    args = pack_args(src, out)
    p = subprocess.run([exe("rsd-data"), *args], capture_output=True, text=True,
                       env={"RSD_PACK_CRASH_AFTER_SHARDS": "2", "PATH": "/usr/bin:/bin"})
    assert p.returncode != 0
    assert (out / "pack.journal.json").exists()


def pack_args(src, out):
    return ["pack", "--src", str(src), "--out", str(out), "--len", "16", "--shard-size", "256",
            "--progress", "none"]


def test_force_starts_over_from_a_damaged_journal(tmp_path):
    src = tmp_path / "c.jsonl"
    write_corpus(src)
    out = tmp_path / "out"
    crashed_pack(src, out)
    (out / "pack.journal.json").write_text("{ damaged")
    p = limited(*pack_args(src, out))
    assert p.returncode != 0 and "pass --force" in p.stderr, p.stderr
    p = limited(*pack_args(src, out), "--force")
    assert p.returncode == 0, p.stderr
    assert not (out / "pack.journal.json").exists()
    assert limited("verify", out).returncode == 0


def test_a_journal_claiming_8e9_tokens_over_a_sparse_file_is_an_error(tmp_path):
    src = tmp_path / "c.jsonl"
    write_corpus(src)
    out = tmp_path / "out"
    crashed_pack(src, out)
    journal = json.loads((out / "pack.journal.json").read_text())
    journal["queued"] = [[4_000_000_000, 4_000_000_000]]
    journal["open"] = []
    (out / "pack.journal.json").write_text(json.dumps(journal))
    with open(out / "pack.journal.bin", "wb") as f:
        f.truncate(32_000_000_000)
    # 60 s: ~2 s a command idle, ~6 s with both cores of a 2-core machine busy: a 10x margin.
    p = limited(*pack_args(src, out), timeout=60)
    assert p.returncode != 0
    assert "pack.journal.json: field queued[0]: a saved sample of 8000000000 tokens" in p.stderr, p.stderr
    # --force means start over, whatever the journal claims.
    p = limited(*pack_args(src, out), "--force", timeout=60)
    assert p.returncode == 0, p.stderr
    assert limited("verify", out).returncode == 0


def test_a_journal_naming_shards_outside_out_is_refused(tmp_path):
    src = tmp_path / "c.jsonl"
    write_corpus(src)
    out = tmp_path / "out"
    crashed_pack(src, out)
    outside = tmp_path / "outside"
    outside.mkdir()
    for ext in ("bin", "idx"):
        (outside / f"shard-00001.{ext}").write_bytes((out / f"shard-00001.{ext}").read_bytes())
    journal = json.loads((out / "pack.journal.json").read_text())
    journal["shards"][1]["prefix"] = "../outside/shard-00001"
    (out / "pack.journal.json").write_text(json.dumps(journal))
    p = limited(*pack_args(src, out))
    assert p.returncode != 0
    assert "pack.journal.json: field shards[1].prefix" in p.stderr and "../outside" in p.stderr, p.stderr
    assert not (out / "index.json").exists()


def small_parquet(path):
    """A Parquet file of 50 short documents written by pyarrow, uncompressed and without a
    dictionary, whose data page header carries statistics (the smallest and largest value)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": [f"value {i:04} of a document" for i in range(50)]}), path,
                   use_dictionary=False, compression="none")


def declare_4_gib(data, where):
    """`data` (a small_parquet file) with one Thrift length or count patched in place: the page
    header's min_value statistic made 4 GiB - 1 bytes long, or the footer's schema list made
    2**31 - 1 elements long. What the error names for it."""
    data = bytearray(data)
    if where == "page header":
        at = data.index(b"value 0000 of a document") - 1
        assert data[at] == len(b"value 0000 of a document"), "the min value's length, one byte"
        data[at:at + 5] = b"\xff\xff\xff\xff\x0f"
        want = ["page 0: bad page header at byte 4 of the file",
                "a binary field declares 4294967295 bytes, but only"]
    else:
        length = int.from_bytes(data[-8:-4], "little")
        start = len(data) - 8 - length
        # FileMetaData: field 1 (version, an i32), then field 2 (the schema, a list of structs).
        assert (data[start], data[start + 2], data[start + 3] & 0x0F) == (0x15, 0x19, 0x0C)
        data[start + 3:start + 9] = b"\xfc\xff\xff\xff\xff\x07"
        want = ["corrupt Parquet footer: a list declares 2147483647 elements",
                f"(at byte 3 of its FileMetaData, which is {length} bytes at byte {start} of the file)"]
    return bytes(data), want


# A small Parquet pack needs about 320 MB of address space (measured: 313 MB for the file below);
# 2 GiB more is room to spare, and far less than the 4 GiB an unchecked field declares.
PARQUET_ADDRESS_SPACE = 2_500_000_000


@pytest.mark.parametrize("where", ["page header", "footer"])
def test_a_parquet_file_declaring_a_4_gib_thrift_field_is_an_error_not_an_abort(tmp_path, where):
    # The thrift crate allocates a page header's binary field at its declared length before reading
    # it, and the parquet crate reserves a footer list's declared count of elements: 4 GiB, which
    # PARQUET_ADDRESS_SPACE does not hold. rsd checks both against the bytes present first.
    good = tmp_path / "good" / "g.parquet"
    small_parquet(good)

    def pack(*srcs, out):
        return limited("pack", *srcs, "--out", out, "--len", "16", "--tail", "keep", "--workers",
                       "1", "--read-threads", "1", "--progress", "none", limit=PARQUET_ADDRESS_SPACE)

    p = pack("--src", good.parent, out=tmp_path / "o0")
    assert p.returncode == 0, f"exit {p.returncode}:\n{p.stderr[-2000:]}"

    bad = tmp_path / "bad" / "b.parquet"
    bad.parent.mkdir()
    data, want = declare_4_gib(good.read_bytes(), where)
    bad.write_bytes(data)
    p = pack("--src", bad, out=tmp_path / "o1")
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and all(w in errors[0] for w in [f"error: {bad}: ", *want]), p.stderr
    # The exit status of any other bad input: a Parquet file cut short.
    cut = tmp_path / "cut" / "c.parquet"
    cut.parent.mkdir()
    cut.write_bytes(good.read_bytes()[:-20])
    other = pack("--src", cut, out=tmp_path / "o2")
    assert other.returncode != 0 and p.returncode == other.returncode, (p.returncode, other.stderr)

    p = pack("--src", bad, "--src", good.parent, "--skip-bad", out=tmp_path / "o3")
    assert p.returncode == 0, p.stderr
    manifest = json.loads((tmp_path / "o3" / "index.json").read_text())
    assert manifest["totals"]["documents"] == 50
    [skipped] = manifest["totals"]["bad_inputs"]
    assert (skipped["path"], skipped["cause"]) == (str(bad), "corrupt"), skipped


def test_a_directory_of_more_shards_than_open_files_allowed_is_one_clear_error(tmp_path):
    """A shard directory keeps one file open per shard. rsd raises its soft limit on open files
    to the hard one, so a shell's low soft limit does not matter; where even the hard limit is
    too low, the error comes before any shard is opened, names the manifest, the count and the
    limit, and says what to do (not "Too many open files" part-way through)."""
    src = tmp_path / "book.txt"
    src.write_text((REPO / "corpus/books/moby-dick.txt").read_text()[:160_000])
    out = tmp_path / "many"
    p = subprocess.run([exe("rsd-data"), "pack", "--len", "64", "--src", src, "--out", out,
                        "--tokenizer", REPO / "assets/tokenizers/mini-1k/tokenizer.json",
                        "--shard-size", "1KiB", "--progress", "none"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    shards = len(json.loads((out / "index.json").read_text())["shards"])
    assert shards > 100
    unlimited = subprocess.run([exe("rsd-data"), "inspect", out], capture_output=True, text=True)
    assert unlimited.returncode == 0, unlimited.stderr
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def inspect_with(soft, hard):
        def cap():
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        return subprocess.run([exe("rsd-data"), "inspect", out], capture_output=True,
                              text=True, preexec_fn=cap)
    # A soft limit below the shards' count, a hard one above: raised, and read as without.
    low_soft = inspect_with(64, hard)
    assert low_soft.returncode == 0, low_soft.stderr
    assert low_soft.stdout == unlimited.stdout
    # Both low: refused up front, saying why and what to do.
    low = inspect_with(300, 300)
    assert low.returncode != 0 and "panicked" not in low.stderr
    assert (f"index.json: lists {shards} shards: reading them keeps {shards} files open, and "
            "this process may open only") in low.stderr, low.stderr
    assert "its limit on open files is 300" in low.stderr
    assert "--shard-size" in low.stderr and "Too many open files" not in low.stderr


def test_a_parquet_page_short_of_definition_levels_is_said_in_words(tmp_path):
    """A data page whose definition levels run out before the values its header declares: the
    parquet crate's own message leaves its counts unfilled ("expected {levels_to_read}"); rsd's
    error names the file and the row and says what is wrong instead."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"text": [f"document number {i} " * 3 for i in range(100)]}), good,
                   compression="NONE", use_dictionary=False, data_page_version="1.0",
                   write_statistics=False)
    data = good.read_bytes()
    # Version-1 page: the levels' 4-byte length, then one RLE run of 100 ones (varint 200, 1).
    # The same run header as a two-byte varint of 100 is a run of 50: the levels run out.
    run = bytes([3, 0, 0, 0, 0xC8, 0x01, 0x01])
    assert data.count(run) == 1
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(data.replace(run, bytes([3, 0, 0, 0, 0xE4, 0x00, 0x01])))
    p = limited("pack", "--src", bad, "--out", tmp_path / "out", "--len", "64",
                "--tokenizer", REPO / "assets/tokenizers/mini-1k/tokenizer.json",
                "--progress", "none")
    assert p.returncode != 0
    assert (f"{bad}: corrupt data after row 0:" in p.stderr
            and "a data page holds fewer definition levels than the values its header declares"
            in p.stderr), p.stderr
    assert "{levels" not in p.stderr
