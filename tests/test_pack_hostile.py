"""rsd-data pack on inputs written to hurt it: one huge document, a damaged resume journal. Each
answer is a clear error, or a pack in bounded memory, never an abort.

Memory bounds are enforced with an address-space limit on the child (RLIMIT_AS): an allocation
past it fails, and Rust aborts, which shows here as a failed run instead of a slow machine."""

import json
import resource
import subprocess

import zstandard

from rsd_cli import exe

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
    p = limited("pack", "--src", src, "--out", out, "--len", "4096", "--tail", "keep",
                "--workers", "1", "--read-threads", "1", "--progress", "none")
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
