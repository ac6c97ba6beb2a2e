//! Inputs written by a stranger, through the `rsd-data` binary: indexes and manifests that name
//! files outside their directory, links planted where pack writes its temporary files, FIFOs in
//! place of inputs, zstd bombs, sizes near u64::MAX. Every answer is a clear error or a counted
//! skip, in bounded time and memory, with nothing outside the data touched.

mod common;
use common::{p, pack_args};

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rsd_shard::ShardSet;
use serde_json::{json, Value};

/// What a finished child run left: its exit code, output, and peak resident memory.
struct Finished {
    success: bool,
    stdout: String,
    stderr: String,
    max_rss_mib: f64,
}

/// Run `rsd-data args`, failing the test if it runs longer than `timeout` (a read that blocks on
/// a FIFO would never end); the peak RSS comes from the child's own rusage (`wait4`), so other
/// tests' children running at the same time do not count.
// `wait4` reaps the child (and `kill` + `wait` on a timeout); clippy sees no `wait()` call.
#[allow(clippy::zombie_processes)]
fn run_bounded(args: &[&str], timeout: Duration) -> Finished {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rsd-data"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rsd-data");
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let pid = child.id() as libc::pid_t;
    let deadline = Instant::now() + timeout;
    let (status, usage) = loop {
        let mut status = 0;
        // SAFETY: rusage is plain data; zeroed is a valid value for wait4 to overwrite.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: waits for our own child; both pointers are valid for the call.
        let got = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if got == pid {
            break (status, usage);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("rsd-data {args:?} did not finish within {timeout:?}: it hangs");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let finished = Finished {
        success: libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
        // ru_maxrss is in KiB on Linux.
        max_rss_mib: usage.ru_maxrss as f64 / 1024.0,
    };
    eprintln!(
        "rsd-data {}: peak RSS {:.0} MiB",
        args[0], finished.max_rss_mib
    );
    assert!(
        !finished.stderr.contains("panicked"),
        "a panic is never an answer: {}",
        finished.stderr
    );
    finished
}

const TIMEOUT: Duration = Duration::from_secs(120);

fn ok(args: &[&str]) -> Finished {
    let f = run_bounded(args, TIMEOUT);
    assert!(f.success, "rsd-data {args:?} failed:\n{}", f.stderr);
    f
}

fn fails(args: &[&str]) -> Finished {
    let f = run_bounded(args, TIMEOUT);
    assert!(!f.success, "rsd-data {args:?} should fail:\n{}", f.stdout);
    f
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(p(path)).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

fn write_jsonl(path: &Path, n: usize) {
    let lines: String = (0..n)
        .map(|i| json!({ "text": format!("document {i}: the quick brown fox") }).to_string() + "\n")
        .collect();
    std::fs::write(path, lines).unwrap();
}

/// Content and modification time: what a write through a link would change.
fn fingerprint(path: &Path) -> (Vec<u8>, std::time::SystemTime) {
    (
        std::fs::read(path).unwrap(),
        std::fs::metadata(path).unwrap().modified().unwrap(),
    )
}

// ---- MDS, written by hand (the layout is in src/source/mds.rs) ----

/// An ndarray column value: shape byte (u32 dims), shape, uint32 values.
fn ndarray_u32(shape: &[u32], values: &[u32]) -> Vec<u8> {
    let mut out = vec![((shape.len() as u8) << 2) | 2];
    shape.iter().for_each(|d| out.extend(d.to_le_bytes()));
    values.iter().for_each(|v| out.extend(v.to_le_bytes()));
    out
}

/// A shard of `n` samples of 8 ids, each one document; columns `indices`, `input_ids`.
fn mds_shard(n: u32) -> Vec<u8> {
    let samples: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            let ids: Vec<u32> = (0..8).map(|j| 100 + i * 8 + j).collect();
            let indices = ndarray_u32(&[1, 2], &[0, 8]);
            let ids = ndarray_u32(&[8], &ids);
            let mut out = vec![];
            out.extend((indices.len() as u32).to_le_bytes());
            out.extend((ids.len() as u32).to_le_bytes());
            out.extend(indices);
            out.extend(ids);
            out
        })
        .collect();
    let mut out = n.to_le_bytes().to_vec();
    let mut offset = 4 + 4 * (n + 1);
    out.extend(offset.to_le_bytes());
    for s in &samples {
        offset += s.len() as u32;
        out.extend(offset.to_le_bytes());
    }
    samples.into_iter().for_each(|s| out.extend(s));
    out
}

fn mds_index(samples: u32, basename: &str, raw_bytes: usize) -> Value {
    json!({"version": 2, "shards": [{
        "format": "mds", "version": 2,
        "column_names": ["indices", "input_ids"],
        "column_encodings": ["ndarray:uint32", "ndarray:uint32"],
        "column_sizes": [null, null],
        "compression": null, "hashes": [], "size_limit": 1 << 26, "zip_data": null,
        "raw_data": {"basename": basename, "bytes": raw_bytes, "hashes": {}},
        "samples": samples,
    }]})
}

fn write_json(path: &Path, value: &Value) {
    std::fs::write(path, serde_json::to_string_pretty(value).unwrap()).unwrap();
}

/// `rsd-data pack` of MDS `src` into `out`, keeping the ids (the bundled tokenizer as the source
/// tokenizer, so no download is needed).
fn pack_mds_args<'a>(src: &'a str, out: &'a str) -> Vec<&'a str> {
    vec![
        "pack",
        "--len",
        "8",
        "--source-tokenizer",
        "bundled:qwen3",
        "--src",
        src,
        "--out",
        out,
        "--progress",
        "none",
    ]
}

/// How much more than the same pack of a small honest input a pack of a zstd bomb may use at its
/// peak (the baseline, mostly the tokenizer, is measured in each test: about 180 MiB in a debug
/// build). The bombs decompress to `BOMB_BYTES`, eight times this: a reader that held the decoded
/// data would exceed it many times over.
const BOMB_RSS_HEADROOM_MIB: f64 = 64.0;
const BOMB_BYTES: usize = 512 << 20;
/// A `--max-expansion` that lets the bombs decode in full (they are far past the default), so
/// what is tested is what reading them through costs.
const BOMB_EXPANSION: &str = "1000000";

/// zstd frames of `head`, then `BOMB_BYTES` of `fill`, then `tail`: a few KB on disk.
fn zstd_bomb(head: &[u8], fill: u8, tail: &[u8]) -> Vec<u8> {
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    enc.write_all(head).unwrap();
    let chunk = vec![fill; 1 << 20];
    for _ in 0..BOMB_BYTES / chunk.len() {
        enc.write_all(&chunk).unwrap();
    }
    enc.write_all(tail).unwrap();
    let bytes = enc.finish().unwrap();
    assert!(bytes.len() < 64 << 10, "{} bytes is no bomb", bytes.len());
    bytes
}

#[test]
fn mds_index_names_that_leave_the_directory_are_refused_naming_file_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let shard = mds_shard(2);
    let outside = tmp.path().join("outside.mds");
    std::fs::write(&outside, &shard).unwrap();
    let before = fingerprint(&outside);
    let ds = tmp.path().join("ds");
    std::fs::create_dir_all(&ds).unwrap();
    std::fs::write(ds.join("shard.00000.mds"), &shard).unwrap();

    // The same dataset with an honest name packs: the refusals below are about the names.
    write_json(
        &ds.join("index.json"),
        &mds_index(2, "shard.00000.mds", shard.len()),
    );
    let out = tmp.path().join("ok");
    ok(&pack_mds_args(p(&ds), p(&out)));
    assert_eq!(ShardSet::open(&out).unwrap().num_samples(), 2);

    for (k, name) in ["../outside.mds", p(&outside)].into_iter().enumerate() {
        write_json(&ds.join("index.json"), &mds_index(2, name, shard.len()));
        let out = tmp.path().join(format!("o{k}"));
        let f = fails(&pack_mds_args(p(&ds), p(&out)));
        assert!(
            f.stderr
                .contains(&ds.join("index.json").display().to_string())
                && f.stderr.contains("shards[0].raw_data.basename")
                && f.stderr.contains(name),
            "{}",
            f.stderr
        );
        assert!(!out.join("index.json").exists());
    }
    assert_eq!(fingerprint(&outside), before);
}

#[test]
fn a_planted_link_at_a_temporary_name_in_out_is_never_written_through() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("c.jsonl");
    write_jsonl(&src, 40);
    let victim = tmp.path().join("victim.txt");
    std::fs::write(&victim, "precious\n").unwrap();
    let before = fingerprint(&victim);
    let pack = |out: &Path| {
        vec![
            "pack".to_string(),
            "--len".into(),
            "16".into(),
            "--tail".into(),
            "keep".into(),
            "--shard-size".into(),
            "64".into(),
            "--src".into(),
            p(&src).into(),
            "--out".into(),
            p(out).into(),
            "--progress".into(),
            "none".into(),
        ]
    };

    // The journal's temporary name: pack keeps journal files between runs, so a link there
    // survives until the first journal write, which refuses it.
    let out = tmp.path().join("o1");
    std::fs::create_dir_all(&out).unwrap();
    std::os::unix::fs::symlink(&victim, out.join("pack.journal.json.tmp")).unwrap();
    let args = pack(&out);
    let f = fails(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        f.stderr.contains("pack.journal.json.tmp") && f.stderr.contains("symbolic link"),
        "{}",
        f.stderr
    );
    assert_eq!(fingerprint(&victim), before);

    // The shard, tokenizer and manifest temporaries: stale names of ours, removed (the link,
    // not its target) before the pack starts; the pack then succeeds.
    let out = tmp.path().join("o2");
    std::fs::create_dir_all(&out).unwrap();
    for name in [
        "shard-00000.bin.tmp",
        "shard-00000.idx.tmp",
        "tokenizer.json.tmp",
        "index.json.tmp",
    ] {
        std::os::unix::fs::symlink(&victim, out.join(name)).unwrap();
    }
    let args = pack(&out);
    ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(fingerprint(&victim), before);
    assert!(ShardSet::open(&out).unwrap().num_samples() > 1);
    for entry in std::fs::read_dir(&out).unwrap().flatten() {
        assert!(
            !entry.file_type().unwrap().is_symlink(),
            "{:?} is still a link",
            entry.path()
        );
    }
}

#[test]
fn fifos_in_place_of_inputs_are_clear_errors_not_hangs() {
    let tmp = tempfile::tempdir().unwrap();
    // A corpus file.
    let fifo = tmp.path().join("corpus.jsonl");
    mkfifo(&fifo);
    let out = tmp.path().join("o");
    let f = fails(&pack_args("8", &fifo, &out, &[]));
    assert!(
        f.stderr.contains("corpus.jsonl") && f.stderr.contains("FIFO"),
        "{}",
        f.stderr
    );
    // A tokenizer.
    let src = tmp.path().join("c.jsonl");
    write_jsonl(&src, 20);
    let tok = tmp.path().join("tokenizer.json");
    mkfifo(&tok);
    let f = fails(&pack_args("8", &src, &out, &["--tokenizer", p(&tok)]));
    assert!(f.stderr.contains("FIFO"), "{}", f.stderr);
    // A shard of a finished directory, for verify and inspect.
    ok(&pack_args("8", &src, &out, &["--progress", "none"]));
    std::fs::remove_file(out.join("shard-00000.bin")).unwrap();
    mkfifo(&out.join("shard-00000.bin"));
    for command in ["verify", "inspect"] {
        let f = fails(&[command, p(&out)]);
        assert!(
            f.stderr.contains("shard-00000.bin") && f.stderr.contains("FIFO"),
            "{command}: {}",
            f.stderr
        );
    }
}

#[test]
fn a_zstd_bomb_line_is_a_clear_error_or_a_counted_skip_in_bounded_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let good = |i: usize| json!({ "text": format!("good document {i}") }).to_string() + "\n";
    let head = good(1) + "{\"text\": \"";
    let bomb = zstd_bomb(
        head.as_bytes(),
        b'a',
        ("\"}\n".to_string() + &good(3)).as_bytes(),
    );
    let src = tmp.path().join("bomb.jsonl.zst");
    std::fs::write(&src, &bomb).unwrap();
    let honest = tmp.path().join("honest.jsonl.zst");
    let lines = good(1) + &good(2) + &good(3);
    std::fs::write(&honest, zstd::encode_all(lines.as_bytes(), 3).unwrap()).unwrap();
    // Every pack here keeps the tail and caps a document at 1 MiB.
    let bounded =
        |more: &[&'static str]| [&["--tail", "keep", "--max-doc-bytes", "1MiB"][..], more].concat();
    let baseline = ok(&pack_args(
        "4",
        &honest,
        &tmp.path().join("o0"),
        &bounded(&["--progress", "none"]),
    ))
    .max_rss_mib;
    let limit = baseline + BOMB_RSS_HEADROOM_MIB;

    let out = tmp.path().join("o1");
    let f = fails(&pack_args(
        "4",
        &src,
        &out,
        &bounded(&["--max-expansion", BOMB_EXPANSION]),
    ));
    assert!(
        f.stderr.contains("bomb.jsonl.zst:line 2") && f.stderr.contains("--max-doc-bytes"),
        "{}",
        f.stderr
    );
    assert!(
        f.max_rss_mib < limit,
        "peak RSS {:.0} MiB on a {} MiB line (an honest pack: {baseline:.0} MiB)",
        f.max_rss_mib,
        BOMB_BYTES >> 20
    );

    let out = tmp.path().join("o2");
    let f = ok(&pack_args(
        "4",
        &src,
        &out,
        &bounded(&[
            "--max-expansion",
            BOMB_EXPANSION,
            "--skip-bad",
            "--progress",
            "none",
        ]),
    ));
    assert!(
        f.max_rss_mib < limit,
        "peak RSS {:.0} MiB (an honest pack: {baseline:.0} MiB)",
        f.max_rss_mib
    );
    let m = ShardSet::open(&out).unwrap().manifest().clone();
    assert_eq!((m.totals.documents, m.totals.skipped_documents), (2, 1));
    assert_eq!(m.totals.bad_inputs.len(), 1);
    assert!(
        m.totals.bad_inputs[0].first.contains("line 2"),
        "{:?}",
        m.totals.bad_inputs
    );
}

/// An MDS dataset of one zstd shard of 2 samples under `tmp/ds`, first compressed honestly and
/// packed (the baseline's peak RSS), then replaced by a bomb: the honest shard followed by half
/// a GiB of zeros its index does not declare; `declared`: whether the index says the shard's
/// decoded size (`raw_data.bytes`). Returns the failed pack of the bomb, the baseline's peak,
/// the honest shard's and the bomb's sizes.
fn pack_an_mds_zstd_bomb(tmp: &Path, declared: bool) -> (Finished, f64, usize, usize) {
    let shard = mds_shard(2);
    let bomb = zstd_bomb(&shard, 0, &[]);
    let ds = tmp.join("ds");
    std::fs::create_dir_all(&ds).unwrap();
    let mut index = mds_index(2, "shard.00000.mds", shard.len());
    index["shards"][0]["compression"] = json!("zstd");
    if !declared {
        index["shards"][0]["raw_data"] = json!(null);
    }
    index["shards"][0]["zip_data"] =
        json!({"basename": "shard.00000.mds.zstd", "bytes": bomb.len(), "hashes": {}});
    write_json(&ds.join("index.json"), &index);
    std::fs::write(
        ds.join("shard.00000.mds.zstd"),
        zstd::encode_all(&shard[..], 3).unwrap(),
    )
    .unwrap();
    let out = tmp.join("o0");
    let baseline = ok(&pack_mds_args(p(&ds), p(&out))).max_rss_mib;
    assert_eq!(ShardSet::open(&out).unwrap().num_samples(), 2);
    std::fs::write(ds.join("shard.00000.mds.zstd"), &bomb).unwrap();
    let failed = fails(&pack_mds_args(p(&ds), p(&tmp.join("o1"))));
    (failed, baseline, shard.len(), bomb.len())
}

#[test]
fn an_mds_zstd_bomb_is_refused_naming_the_shard_in_bounded_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let (f, baseline, shard, _) = pack_an_mds_zstd_bomb(tmp.path(), true);
    assert!(
        f.stderr.contains("shard.00000.mds.zstd")
            && f.stderr.contains(&format!("more than {shard} bytes")),
        "{}",
        f.stderr
    );
    assert!(
        f.max_rss_mib < baseline + BOMB_RSS_HEADROOM_MIB,
        "peak RSS {:.0} MiB on a {} MiB shard (an honest pack: {baseline:.0} MiB)",
        f.max_rss_mib,
        BOMB_BYTES >> 20
    );
}

#[test]
fn an_mds_column_size_near_u64_max_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let shard = mds_shard(2);
    let ds = tmp.path().join("ds");
    std::fs::create_dir_all(&ds).unwrap();
    std::fs::write(ds.join("shard.00000.mds"), &shard).unwrap();
    let mut index = mds_index(2, "shard.00000.mds", shard.len());
    index["shards"][0]["column_sizes"] = json!([null, u64::MAX - 1]);
    write_json(&ds.join("index.json"), &index);
    let f = fails(&pack_mds_args(p(&ds), p(&tmp.path().join("o"))));
    assert!(
        f.stderr.contains("index.json")
            && f.stderr.contains("shards[0].column_sizes[1]")
            && f.stderr.contains(&(u64::MAX - 1).to_string()),
        "{}",
        f.stderr
    );
}

#[test]
fn a_manifest_tokenizer_name_outside_the_directory_is_not_opened() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("c.jsonl");
    write_jsonl(&src, 20);
    let out = tmp.path().join("o");
    ok(&pack_args("8", &src, &out, &["--progress", "none"]));
    // The right tokenizer, outside the directory: following the manifest's name would find it.
    let outside: PathBuf = tmp.path().join("tokenizer.json");
    std::fs::rename(out.join("tokenizer.json"), &outside).unwrap();
    let manifest_path = out.join("index.json");
    let mut m: Value = serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    for name in ["../tokenizer.json", p(&outside)] {
        m["tokenizer"]["name"] = json!(name);
        write_json(&manifest_path, &m);
        let f = ok(&["inspect", p(&out)]);
        assert!(
            f.stderr.contains("not decoding") && f.stderr.contains("tokenizer.name"),
            "{}",
            f.stderr
        );
    }
    // Given explicitly, the same file is used.
    let f = ok(&["inspect", p(&out), "--tokenizer", p(&outside)]);
    assert!(f.stdout.contains("document"), "{}", f.stdout);

    // Values the reader does not check (they only describe) are printed, never trusted: a
    // digest of multi-byte characters, counts whose product overflows.
    // ("a" then two-byte characters: byte 12 falls inside one.)
    m["tokenizer"]["sha256"] = json!(format!("a{}", "é".repeat(20)));
    m["totals"]["samples"] = json!(u64::MAX);
    m["seq_len"] = json!(u64::MAX / 2);
    write_json(&manifest_path, &m);
    let f = ok(&["inspect", p(&out), "--tokenizer", p(&outside)]);
    assert!(
        f.stdout.contains(&format!("sha256 a{}…", "é".repeat(11))),
        "{}",
        f.stdout
    );
}

#[test]
fn terminal_control_sequences_from_a_manifest_are_printed_escaped() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("c.jsonl");
    write_jsonl(&src, 20);
    let out = tmp.path().join("o");
    ok(&pack_args("8", &src, &out, &["--progress", "none"]));
    let manifest_path = out.join("index.json");
    let mut m: Value = serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    let clear = "\x1b[2J";
    m["created_by"] = json!(format!("rsd-data{clear}"));
    m["command"] = json!(["rsd-data", "pack", "\x1b]0;title\x07", "\r"]);
    m["tokenizer"]["name"] = json!(format!("tok{clear}"));
    m["sources"][0]["spec"] = json!(format!("\x1b[31mred{clear}"));
    m["sources"][0]["path"] = json!("a\u{202e}txt.exe");
    // A shard prefix with the sequence in it (and its files renamed to match).
    let prefix = m["shards"][0]["prefix"].as_str().unwrap().to_string();
    let evil = format!("{prefix}{clear}");
    for ext in ["bin", "idx"] {
        std::fs::rename(
            out.join(format!("{prefix}.{ext}")),
            out.join(format!("{evil}.{ext}")),
        )
        .unwrap();
    }
    m["shards"][0]["prefix"] = json!(evil);
    write_json(&manifest_path, &m);

    let f = ok(&["inspect", p(&out)]);
    for text in [&f.stdout, &f.stderr] {
        assert!(
            !text.contains('\x1b') && !text.contains('\x07') && !text.contains('\r'),
            "a raw control character was printed: {text:?}"
        );
    }
    for shown in [
        "rsd-data\\u{1b}[2J",
        "\\u{1b}]0;title\\u{7} \\r",
        "tok\\u{1b}[2J",
        "\\u{1b}[31mred\\u{1b}[2J",
        "a\\u{202e}txt.exe",
        &format!("(shard {prefix}\\u{{1b}}[2J, index 0)"),
    ] {
        assert!(f.stdout.contains(shown), "want {shown:?} in {}", f.stdout);
    }
    // Errors quote names too: a missing shard file is named escaped.
    std::fs::remove_file(out.join(format!("{evil}.bin"))).unwrap();
    for args in [
        vec!["verify", p(&out)],
        vec!["stream", p(&out), "--batches", "1"],
    ] {
        let f = fails(&args);
        assert!(
            f.stderr.contains(&format!("{prefix}\\u{{1b}}[2J.bin")) && !f.stderr.contains('\x1b'),
            "{args:?}: {}",
            f.stderr
        );
    }
}

// ---- The resume journal, edited by a stranger ----

/// `pack` of `src` into `out` with small shards, so a crash leaves a journal after a few.
fn pack_small_shards_args<'a>(src: &'a str, out: &'a str) -> Vec<&'a str> {
    vec![
        "pack",
        "--len",
        "16",
        "--shard-size",
        "256",
        "--max-doc-bytes",
        "4KiB",
        "--src",
        src,
        "--out",
        out,
        "--progress",
        "none",
    ]
}

/// An interrupted pack of 400 small documents in `tmp/out`, stopped (as by a crash) after two
/// shards: its source, its output directory and its journal.
fn interrupted_pack(tmp: &Path) -> (PathBuf, PathBuf, Value) {
    let src = tmp.join("c.jsonl");
    write_jsonl(&src, 400);
    let out = tmp.join("out");
    let crashed = Command::new(env!("CARGO_BIN_EXE_rsd-data"))
        .args(pack_small_shards_args(p(&src), p(&out)))
        .env("RSD_PACK_CRASH_AFTER_SHARDS", "2")
        .output()
        .unwrap();
    assert!(
        !crashed.status.success(),
        "the simulated crash stops the run"
    );
    let journal: Value =
        serde_json::from_slice(&std::fs::read(out.join("pack.journal.json")).unwrap()).unwrap();
    assert_eq!(journal["shards"].as_array().unwrap().len(), 2);
    (src, out, journal)
}

#[test]
fn journal_shard_names_outside_out_are_refused_naming_the_journal_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, out, journal) = interrupted_pack(tmp.path());
    let saved = std::fs::read(out.join("pack.journal.json")).unwrap();
    // Copies of shard 1 outside --out, so that a resume that followed the names would find
    // intact shards there and carry on.
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    for ext in ["bin", "idx"] {
        std::fs::copy(
            out.join(format!("shard-00001.{ext}")),
            outside.join(format!("shard-00001.{ext}")),
        )
        .unwrap();
    }
    let before = fingerprint(&outside.join("shard-00001.bin"));
    let absolute = outside.join("shard-00001").display().to_string();
    for (name, why) in [
        ("../outside/shard-00001", "has a `..` component"),
        (absolute.as_str(), "is an absolute path"),
        ("shard-00007", "is not the name pack gives shard 1"),
    ] {
        let mut edited = journal.clone();
        edited["shards"][1]["prefix"] = json!(name);
        write_json(&out.join("pack.journal.json"), &edited);
        let f = fails(&pack_small_shards_args(p(&src), p(&out)));
        assert!(
            f.stderr
                .contains(&out.join("pack.journal.json").display().to_string())
                && f.stderr.contains("shards[1].prefix")
                && f.stderr.contains(name)
                && f.stderr.contains(why),
            "{}",
            f.stderr
        );
        assert!(!out.join("index.json").exists());
    }
    assert_eq!(fingerprint(&outside.join("shard-00001.bin")), before);
    // The journal as written resumes.
    std::fs::write(out.join("pack.journal.json"), saved).unwrap();
    ok(&pack_small_shards_args(p(&src), p(&out)));
    ok(&["verify", p(&out)]);
}

#[test]
fn journal_counts_beyond_the_bytes_and_settings_are_errors_not_allocations() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, out, journal) = interrupted_pack(tmp.path());
    let tokens = out.join("pack.journal.bin");
    // 8e9 tokens in two pieces, over a sparse token file of exactly the size they need.
    let mut huge = journal.clone();
    huge["queued"] = json!([[4_000_000_000u32, 4_000_000_000u32]]);
    huge["open"] = json!([]);
    // Many samples of --len tokens each: more than one document of --max-doc-bytes leaves.
    let mut many = journal.clone();
    many["queued"] = json!(vec![vec![16u32]; 100_000]);
    many["open"] = json!([]);
    // A counter a resumed run would overflow adding to.
    let mut counter = journal.clone();
    counter["totals"]["tokens"] = json!(u64::MAX);
    // A completed shard claiming a size no shard of these settings has.
    let mut shard = journal.clone();
    shard["shards"][0]["bin_bytes"] = json!(32_000_000_000u64);
    for (edited, need, words) in [
        (
            &huge,
            32_000_000_000u64,
            "field queued[0]: a saved sample of 8000000000 tokens, longer than --len (16)",
        ),
        (
            &many,
            6_400_000,
            "field queued: saved samples of 1600000 tokens, more than a pack",
        ),
        (
            &counter,
            0,
            "field totals.tokens: 18446744073709551615 is more than any pack counts",
        ),
        (
            &shard,
            0,
            "field shards[0].bin_bytes: 32000000000 bytes, more than a shard of --shard-size 256",
        ),
    ] {
        write_json(&out.join("pack.journal.json"), edited);
        if need > 0 {
            let f = std::fs::File::create(&tokens).unwrap();
            f.set_len(need).unwrap();
        }
        let started = Instant::now();
        let f = fails(&pack_small_shards_args(p(&src), p(&out)));
        assert!(
            f.stderr
                .contains(&out.join("pack.journal.json").display().to_string())
                && f.stderr.contains(words)
                && f.stderr.contains("pass --force to start over"),
            "{}",
            f.stderr
        );
        // Refused from the journal and the file sizes, nothing read: ~2 s of start-up in a debug
        // build, ~6 s with both cores of a 2-core machine busy: a 5x margin.
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{:?}",
            started.elapsed()
        );
        assert!(f.max_rss_mib < 1024.0, "peak RSS {:.0} MiB", f.max_rss_mib);
    }
    // A token file shorter than the journal needs: its size is named, nothing is allocated.
    write_json(&out.join("pack.journal.json"), &journal);
    std::fs::File::create(&tokens).unwrap().set_len(3).unwrap();
    let f = fails(&pack_small_shards_args(p(&src), p(&out)));
    assert!(
        f.stderr
            .contains("pack.journal.bin: 3 bytes, the journal needs"),
        "{}",
        f.stderr
    );
}

#[test]
fn force_starts_over_whatever_journal_is_there() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, out, _) = interrupted_pack(tmp.path());
    let elsewhere = tmp.path().join("elsewhere.json");
    std::fs::write(&elsewhere, "not ours").unwrap();
    for damage in ["garbage", "link", "sparse"] {
        let journal = out.join("pack.journal.json");
        let _ = std::fs::remove_file(&journal);
        match damage {
            "garbage" => std::fs::write(&journal, "{ not json").unwrap(),
            "link" => std::os::unix::fs::symlink(&elsewhere, &journal).unwrap(),
            _ => {
                std::fs::write(
                    &journal,
                    r#"{"version":1,"queued":[[4000000000,4000000000]]}"#,
                )
                .unwrap();
                let f = std::fs::File::create(out.join("pack.journal.bin")).unwrap();
                f.set_len(32_000_000_000).unwrap();
            }
        }
        let f = fails(&pack_small_shards_args(p(&src), p(&out)));
        assert!(f.stderr.contains("pass --force"), "{}", f.stderr);
        let mut args = pack_small_shards_args(p(&src), p(&out));
        args.push("--force");
        let f = ok(&args);
        assert!(f.max_rss_mib < 1024.0, "peak RSS {:.0} MiB", f.max_rss_mib);
        ok(&["verify", p(&out)]);
        assert!(!journal.exists() && !out.join("pack.journal.bin").exists());
        // Start the next round from an interrupted pack again.
        std::fs::remove_dir_all(&out).unwrap();
        let crashed = Command::new(env!("CARGO_BIN_EXE_rsd-data"))
            .args(pack_small_shards_args(p(&src), p(&out)))
            .env("RSD_PACK_CRASH_AFTER_SHARDS", "2")
            .output()
            .unwrap();
        assert!(!crashed.status.success());
    }
    assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "not ours");
}

/// Borrowed arguments.
fn strs(a: &[String]) -> Vec<&str> {
    a.iter().map(String::as_str).collect()
}

/// A shard of one sample: `ids`, and `indices` holding the (start, end) pairs `spans`.
fn mds_shard_of(ids: &[u32], spans: &[(u32, u32)]) -> Vec<u8> {
    let flat: Vec<u32> = spans.iter().flat_map(|&(s, e)| [s, e]).collect();
    let indices = ndarray_u32(&[spans.len() as u32, 2], &flat);
    let ids = ndarray_u32(&[ids.len() as u32], ids);
    let mut sample = vec![];
    sample.extend((indices.len() as u32).to_le_bytes());
    sample.extend((ids.len() as u32).to_le_bytes());
    sample.extend(indices);
    sample.extend(ids);
    let mut out = 1u32.to_le_bytes().to_vec();
    out.extend(12u32.to_le_bytes());
    out.extend((12 + sample.len() as u32).to_le_bytes());
    out.extend(sample);
    out
}

#[test]
fn mds_spans_that_overlap_are_refused_not_copied_once_per_document() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("ds");
    std::fs::create_dir_all(&ds).unwrap();
    let ids: Vec<u32> = (100..356).collect();
    // Spans that tile the ids pack; 20,000 spans of all of them (a 240 KB shard that would
    // copy 20 MB) are refused, naming the shard, the sample and the column.
    let tiled = mds_shard_of(&ids, &[(0, 100), (100, 256)]);
    std::fs::write(ds.join("shard.00000.mds"), &tiled).unwrap();
    write_json(
        &ds.join("index.json"),
        &mds_index(1, "shard.00000.mds", tiled.len()),
    );
    ok(&pack_mds_args(p(&ds), p(&tmp.path().join("o0"))));

    let overlapping = mds_shard_of(&ids, &vec![(0, 256); 20_000]);
    std::fs::write(ds.join("shard.00000.mds"), &overlapping).unwrap();
    write_json(
        &ds.join("index.json"),
        &mds_index(1, "shard.00000.mds", overlapping.len()),
    );
    let f = fails(&pack_mds_args(p(&ds), p(&tmp.path().join("o1"))));
    assert!(
        f.stderr.contains("shard.00000.mds:sample 0")
            && f.stderr
                .contains("column \"indices\": document 1 spans tokens 0..256")
            && f.stderr
                .contains("more than the 256 of input_ids: spans overlap"),
        "{}",
        f.stderr
    );
}

#[test]
fn an_mds_zstd_shard_without_a_declared_size_is_decoded_only_so_far() {
    let tmp = tempfile::tempdir().unwrap();
    let (f, baseline, _, bomb) = pack_an_mds_zstd_bomb(tmp.path(), false);
    let cap = bomb as u64 * 64 + (1 << 20);
    assert!(
        f.stderr.contains("shard.00000.mds.zstd")
            && f.stderr.contains(&format!(
                "decompresses to more than {cap} bytes, 64 times its {bomb} compressed bytes + 1 MiB"
            ))
            && f.stderr.contains("index.json declares no raw_data.bytes"),
        "{}",
        f.stderr
    );
    assert!(
        f.max_rss_mib < baseline + BOMB_RSS_HEADROOM_MIB,
        "peak RSS {:.0} MiB (an honest pack: {baseline:.0} MiB)",
        f.max_rss_mib
    );
}

#[test]
fn an_arrow_stream_with_a_bad_first_message_is_a_bad_file_not_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let good = tmp.path().join("good.jsonl");
    write_jsonl(&good, 3);
    for (k, length) in [-8i32, i32::MAX, 7].into_iter().enumerate() {
        let bad = tmp.path().join(format!("bad{k}.arrow"));
        let mut bytes = vec![0xff; 4];
        bytes.extend(length.to_le_bytes());
        bytes.extend([0x5a; 16]);
        std::fs::write(&bad, &bytes).unwrap();
        let args = |out: &Path, skip: bool| -> Vec<String> {
            let mut a: Vec<String> = [
                "pack",
                "--len",
                "4",
                "--tail",
                "keep",
                "--read-threads",
                "1",
                "--progress",
                "none",
            ]
            .map(str::to_string)
            .to_vec();
            for path in [&bad, &good] {
                a.extend(["--src".to_string(), p(path).to_string()]);
            }
            a.extend(["--out".to_string(), p(out).to_string()]);
            if skip {
                a.push("--skip-bad".into());
            }
            a
        };
        let stop = args(&tmp.path().join(format!("stop{k}")), false);
        let f = fails(&strs(&stop));
        assert!(f.stderr.contains(&format!("bad{k}.arrow")), "{}", f.stderr);
        if length != 7 {
            assert!(
                f.stderr.contains(&format!(
                    "message 0 at byte 0 declares {length} bytes of metadata"
                )),
                "{}",
                f.stderr
            );
        }
        let out_skip = tmp.path().join(format!("skip{k}"));
        ok(&strs(&args(&out_skip, true)));
        let m = ShardSet::open(&out_skip).unwrap().manifest().clone();
        assert_eq!(m.totals.documents, 3);
        assert_eq!(m.totals.bad_inputs.len(), 1, "{:?}", m.totals.bad_inputs);
        assert!(m.totals.bad_inputs[0]
            .path
            .ends_with(&format!("bad{k}.arrow")));
    }
}

#[test]
fn one_huge_document_costs_a_small_multiple_of_its_size() {
    let tmp = tempfile::tempdir().unwrap();
    // One document of 64 MiB of one letter, a few KB compressed: the tokenizer would hold tens
    // of bytes per byte of this one word if it saw it whole.
    const DOC: usize = 64 << 20;
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    enc.write_all(b"{\"text\": \"").unwrap();
    let chunk = vec![b'a'; 1 << 20];
    for _ in 0..DOC / chunk.len() {
        enc.write_all(&chunk).unwrap();
    }
    enc.write_all(b"\"}\n").unwrap();
    let src = tmp.path().join("long.jsonl.zst");
    std::fs::write(&src, enc.finish().unwrap()).unwrap();
    let honest = tmp.path().join("honest.jsonl");
    write_jsonl(&honest, 3);
    let args = |src: &Path, out: &Path| {
        [
            "pack",
            "--len",
            "4096",
            "--tail",
            "keep",
            "--workers",
            "1",
            // 64 MiB from a few KB is far past the default expansion: what is measured here is
            // what the document costs once it is read.
            "--max-expansion",
            BOMB_EXPANSION,
            "--src",
            p(src),
            "--out",
            p(out),
            "--progress",
            "none",
        ]
        .map(str::to_string)
    };
    let run = |src: &Path, out: &Path| {
        let a = args(src, out);
        ok(&a.iter().map(String::as_str).collect::<Vec<_>>()).max_rss_mib
    };
    let baseline = run(&honest, &tmp.path().join("o0"));
    let rss = run(&src, &tmp.path().join("o1"));
    // The line, its decoded text, and the ids and samples made of it: about four times the
    // document (docs/UNTRUSTED.md); the whole word in the tokenizer took over 40.
    let limit = baseline + 4.0 * (DOC >> 20) as f64;
    assert!(
        rss < limit,
        "peak RSS {rss:.0} MiB for a {} MiB document (an honest pack: {baseline:.0} MiB)",
        DOC >> 20
    );
}

#[test]
fn errors_quote_long_values_from_data_cut_short() {
    let tmp = tempfile::tempdir().unwrap();
    let long = "y".repeat(300_000);
    let mut answers = vec![];
    // An MDS index's format.
    let ds = tmp.path().join("ds");
    std::fs::create_dir_all(&ds).unwrap();
    std::fs::write(ds.join("shard.00000.mds"), mds_shard(1)).unwrap();
    let mut index = mds_index(1, "shard.00000.mds", mds_shard(1).len());
    index["shards"][0]["format"] = json!(long);
    write_json(&ds.join("index.json"), &index);
    answers.push(fails(&pack_mds_args(p(&ds), p(&tmp.path().join("o0")))).stderr);
    // A JSONL line without the text field, with a long key; one with a long value of the
    // wrong type for a chat record.
    let src = tmp.path().join("k.jsonl");
    std::fs::write(&src, json!({ long.as_str(): 1 }).to_string() + "\n").unwrap();
    let out = tmp.path().join("o1");
    answers.push(fails(&pack_args("4", &src, &out, &[])).stderr);
    // A resume journal with a long value of the wrong type.
    std::fs::create_dir_all(tmp.path().join("j")).unwrap();
    let (src, out, mut journal) = interrupted_pack(&tmp.path().join("j"));
    journal["version"] = json!(long);
    write_json(&out.join("pack.journal.json"), &journal);
    // pack's own journal is not data: its error quotes none of it.
    let err = fails(&pack_small_shards_args(p(&src), p(&out))).stderr;
    assert!(
        err.len() < 2000 && err.contains("pack.journal.json") && !err.contains("yyyy"),
        "{} characters: {:.600}",
        err.len(),
        err
    );
    for err in answers {
        assert!(
            err.len() < 2000 && err.contains("yyyy") && err.contains("more characters"),
            "{} characters: {:.600}",
            err.len(),
            err
        );
    }
}

// ---- Small files that expand without limit ----

/// `pack` of `src` into `out`, short samples, whatever the documents' length.
fn short_sample_args<'a>(src: &'a Path, out: &'a Path, more: &[&'a str]) -> Vec<&'a str> {
    let mut args = pack_args("64", src, out, &["--tail", "keep", "--progress", "none"]);
    args.extend_from_slice(more);
    args
}

/// A Parquet file of one `text` column holding `values`, zstd-compressed, without statistics,
/// `rows_per_group` rows to a row group, optionally `DELTA_BYTE_ARRAY`-encoded.
fn write_parquet(path: &Path, values: &[String], rows_per_group: usize, delta: bool) {
    use parquet::basic::{Compression, Encoding, ZstdLevel};
    use parquet::file::properties::{EnabledStatistics, WriterProperties};
    let array = arrow::array::StringArray::from_iter_values(values);
    let batch =
        arrow::array::RecordBatch::try_from_iter([("text", std::sync::Arc::new(array) as _)])
            .unwrap();
    let mut props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_dictionary_enabled(false)
        .set_statistics_enabled(EnabledStatistics::None)
        .set_max_row_group_size(rows_per_group);
    if delta {
        props = props.set_encoding(Encoding::DELTA_BYTE_ARRAY);
    }
    let file = std::fs::File::create(path).unwrap();
    let mut w =
        parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(props.build())).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

#[test]
fn a_tiny_delta_encoded_parquet_file_stops_at_its_expansion_bound() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("delta.parquet");
    // Each value repeats the previous one whole (a prefix of 1 MiB, no suffix): a few bytes of
    // page per MiB of text. 64 of them are 64 MiB from a file of a few KB.
    let value = "the same words again ".repeat(50_000);
    write_parquet(&src, &vec![value; 64], 64, true);
    let stored = std::fs::metadata(&src).unwrap().len();
    assert!(stored < 16 << 10, "{stored} bytes is not tiny");
    let bound = stored * 1000 + (16 << 20);

    let f = fails(&short_sample_args(&src, &tmp.path().join("o1"), &[]));
    for part in [
        "delta.parquet",
        &format!(
            "decodes to more than {bound} bytes, 1000 times its {stored} stored bytes + 16 MiB"
        ),
        "--max-expansion 1000",
    ] {
        assert!(f.stderr.contains(part), "want {part:?}: {}", f.stderr);
    }

    let out = tmp.path().join("o2");
    ok(&short_sample_args(&src, &out, &["--skip-bad"]));
    let m = ShardSet::open(&out).unwrap().manifest().clone();
    // The documents before the bound are kept; the rest of the file is not read.
    let per_doc = 1_050_000 + 1;
    assert_eq!(m.totals.documents, bound / per_doc);
    assert_eq!(m.totals.bad_inputs.len(), 1, "{:?}", m.totals.bad_inputs);
}

/// zstd frames of `head`, then `n` newlines, then `tail`.
fn zstd_of_blank_lines(head: &str, n: usize, tail: &str) -> Vec<u8> {
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    enc.write_all(head.as_bytes()).unwrap();
    let chunk = vec![b'\n'; 1 << 20];
    for _ in 0..n / chunk.len() {
        enc.write_all(&chunk).unwrap();
    }
    enc.write_all(tail.as_bytes()).unwrap();
    enc.finish().unwrap()
}

#[test]
fn a_jsonl_zst_of_endless_blank_lines_stops_at_its_bound_unless_raised() {
    let tmp = tempfile::tempdir().unwrap();
    let good = |i: usize| json!({ "text": format!("good document {i}") }).to_string() + "\n";
    // Blank lines are no documents at all: only the decoder's output can count them.
    let bytes = zstd_of_blank_lines(&good(1), 32 << 20, &good(2));
    let src = tmp.path().join("blank.jsonl.zst");
    std::fs::write(&src, &bytes).unwrap();
    let stored = bytes.len() as u64;
    assert!(stored < 8 << 10, "{stored} bytes");

    let f = fails(&short_sample_args(&src, &tmp.path().join("o1"), &[]));
    for part in [
        "blank.jsonl.zst",
        &format!("1000 times its {stored} stored bytes + 16 MiB"),
        "--max-expansion 1000",
    ] {
        assert!(f.stderr.contains(part), "want {part:?}: {}", f.stderr);
    }

    let out = tmp.path().join("o2");
    ok(&short_sample_args(
        &src,
        &out,
        &["--max-expansion", "100000"],
    ));
    let m = ShardSet::open(&out).unwrap().manifest().clone();
    assert_eq!(m.totals.documents, 2);

    let f = fails(&short_sample_args(
        &src,
        &tmp.path().join("o3"),
        &["--max-expansion", "0"],
    ));
    assert!(f.stderr.contains("--max-expansion"), "{}", f.stderr);
}

#[test]
fn parquet_row_groups_sharing_one_column_chunk_are_refused_naming_them() {
    use parquet::thrift::TSerializable;
    use thrift::protocol::{TCompactInputProtocol, TCompactOutputProtocol, TOutputProtocol};
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("shared.parquet");
    let values: Vec<String> = (0..4).map(|i| format!("row {i} of the file")).collect();
    write_parquet(&src, &values, 2, false);
    let bytes = std::fs::read(&src).unwrap();
    let n = bytes.len();
    let len = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
    let start = n - 8 - len;
    let mut input = TCompactInputProtocol::new(&bytes[start..n - 8]);
    let mut meta = parquet::format::FileMetaData::read_from_in_protocol(&mut input).unwrap();
    assert_eq!(meta.row_groups.len(), 2);
    let honest = meta.clone();

    // Row group 1 repeated 1000 times: the second row group's bytes, read once per copy.
    let write_footer = |meta: &parquet::format::FileMetaData, to: &Path| {
        let mut footer = vec![];
        let mut out = TCompactOutputProtocol::new(&mut footer);
        meta.write_to_out_protocol(&mut out).unwrap();
        out.flush().unwrap();
        let mut file = bytes[..start].to_vec();
        file.extend(&footer);
        file.extend((footer.len() as u32).to_le_bytes());
        file.extend(b"PAR1");
        std::fs::write(to, file).unwrap();
    };
    meta.row_groups = vec![honest.row_groups[0].clone()];
    meta.row_groups
        .extend(std::iter::repeat_n(honest.row_groups[1].clone(), 1000));
    meta.num_rows = 2 * 1001;
    write_footer(&meta, &src);
    let f = fails(&short_sample_args(&src, &tmp.path().join("o1"), &[]));
    for part in [
        "shared.parquet",
        "row group 2 (first row 4), column \"text\"",
        "overlaps that of leaf \"text\" in row group 1",
    ] {
        assert!(f.stderr.contains(part), "want {part:?}: {}", f.stderr);
    }

    // A chunk that starts inside another is refused the same way.
    let mut meta = honest.clone();
    let chunk = &mut meta.row_groups[1].columns[0];
    let first = &honest.row_groups[0].columns[0];
    let first_start = first.meta_data.as_ref().unwrap().data_page_offset;
    chunk.meta_data.as_mut().unwrap().data_page_offset = first_start + 1;
    chunk.meta_data.as_mut().unwrap().dictionary_page_offset = None;
    let overlapping = tmp.path().join("overlapping.parquet");
    write_footer(&meta, &overlapping);
    let f = fails(&short_sample_args(
        &overlapping,
        &tmp.path().join("o2"),
        &[],
    ));
    assert!(
        f.stderr.contains("overlapping.parquet") && f.stderr.contains("overlaps that of"),
        "{}",
        f.stderr
    );

    // The honest footer, written back the same way, packs its 4 rows.
    let rewritten = tmp.path().join("honest.parquet");
    write_footer(&honest, &rewritten);
    let out = tmp.path().join("o3");
    ok(&short_sample_args(&rewritten, &out, &[]));
    assert_eq!(ShardSet::open(&out).unwrap().manifest().totals.documents, 4);
}

/// An Arrow IPC stream of one `text` column holding `values`.
fn arrow_stream(values: &[&str]) -> Vec<u8> {
    let array = arrow::array::StringArray::from_iter_values(values);
    let batch =
        arrow::array::RecordBatch::try_from_iter([("text", std::sync::Arc::new(array) as _)])
            .unwrap();
    let mut w = arrow::ipc::writer::StreamWriter::try_new(Vec::new(), &batch.schema()).unwrap();
    w.write(&batch).unwrap();
    w.into_inner().unwrap()
}

#[test]
fn a_datasets_state_json_naming_one_file_twice_is_refused_naming_both_entries() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("ds");
    std::fs::create_dir(&ds).unwrap();
    std::fs::write(
        ds.join("data-00000-of-00002.arrow"),
        arrow_stream(&["one", "two"]),
    )
    .unwrap();
    std::fs::write(
        ds.join("data-00001-of-00002.arrow"),
        arrow_stream(&["three"]),
    )
    .unwrap();
    std::os::unix::fs::symlink("data-00000-of-00002.arrow", ds.join("again.arrow")).unwrap();
    let state = |names: &[&str]| {
        let files: Vec<Value> = names.iter().map(|n| json!({ "filename": n })).collect();
        write_json(&ds.join("state.json"), &json!({ "_data_files": files }));
    };

    state(&["data-00000-of-00002.arrow", "data-00001-of-00002.arrow"]);
    let out = tmp.path().join("o0");
    ok(&short_sample_args(&ds, &out, &[]));
    assert_eq!(ShardSet::open(&out).unwrap().manifest().totals.documents, 3);

    let cases: [(&[&str], &str); 3] = [
        (
            &["data-00000-of-00002.arrow", "data-00001-of-00002.arrow", "data-00000-of-00002.arrow"],
            "field _data_files[2].filename: data-00000-of-00002.arrow names the same file as _data_files[0].filename",
        ),
        (
            &["data-00001-of-00002.arrow", "./data-00001-of-00002.arrow"],
            "field _data_files[1].filename: ./data-00001-of-00002.arrow names the same file as _data_files[0].filename",
        ),
        (
            &["data-00000-of-00002.arrow", "again.arrow"],
            "field _data_files[1].filename: again.arrow names the same file as _data_files[0].filename",
        ),
    ];
    for (k, (names, want)) in cases.iter().enumerate() {
        state(names);
        let f = fails(&short_sample_args(
            &ds,
            &tmp.path().join(format!("o{}", k + 1)),
            &[],
        ));
        assert!(
            f.stderr.contains("state.json") && f.stderr.contains(want),
            "want {want:?}: {}",
            f.stderr
        );
    }
}

// ---- Links in input directories and in --out ----

/// A text file's document count and the text of each, packed from `src` (`--format text`).
fn pack_text(src: &Path, out: &Path, format: &str) -> Finished {
    run_bounded(&short_sample_args(src, out, &["--format", format]), TIMEOUT)
}

#[test]
fn links_in_input_directories_are_followed_only_inside_the_directory_given() {
    use std::os::unix::fs::symlink;
    let tmp = tempfile::tempdir().unwrap();
    let secret = tmp.path().join("secret.txt");
    std::fs::write(&secret, "the secret contents of a file outside\n").unwrap();

    // Text: a link to a file inside is read (once, with its target); one outside is refused.
    let text = tmp.path().join("text");
    std::fs::create_dir_all(text.join("sub")).unwrap();
    std::fs::write(text.join("sub/a.txt"), "inside the directory\n").unwrap();
    symlink("sub/a.txt", text.join("b.txt")).unwrap();
    let f = pack_text(&text, &tmp.path().join("t0"), "text");
    assert!(f.success, "{}", f.stderr);
    let m = ShardSet::open(&tmp.path().join("t0"))
        .unwrap()
        .manifest()
        .clone();
    assert_eq!(
        m.totals.documents, 1,
        "the link and its target are one file"
    );
    symlink(&secret, text.join("c.txt")).unwrap();
    let f = pack_text(&text, &tmp.path().join("t1"), "text");
    assert!(!f.success);
    let want = format!(
        "{}: a symbolic link to {}, outside {}",
        text.join("c.txt").display(),
        secret.canonicalize().unwrap().display(),
        text.display()
    );
    assert!(f.stderr.contains(&want), "want {want:?}: {}", f.stderr);
    assert!(!f.stderr.contains("secret contents"), "{}", f.stderr);

    // A Hugging Face cache: the snapshot's names link to the repository's blobs, which are
    // followed; a snapshot link to another repository's blobs is not.
    let repo = tmp.path().join("hub/datasets--org--name");
    let snapshot = repo.join("snapshots/abc123");
    let snap = snapshot.join("data");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    write_jsonl(&repo.join("blobs/0f1e2d"), 4);
    symlink("../../../blobs/0f1e2d", snap.join("train.jsonl")).unwrap();
    let out = tmp.path().join("hf0");
    ok(&short_sample_args(&snapshot, &out, &[]));
    assert_eq!(ShardSet::open(&out).unwrap().manifest().totals.documents, 4);
    let other = tmp.path().join("hub/datasets--org--other/blobs");
    std::fs::create_dir_all(&other).unwrap();
    write_jsonl(&other.join("9a8b7c"), 2);
    symlink(other.join("9a8b7c"), snap.join("extra.jsonl")).unwrap();
    let f = fails(&short_sample_args(&snapshot, &tmp.path().join("hf1"), &[]));
    assert!(
        f.stderr.contains("extra.jsonl: a symbolic link to"),
        "{}",
        f.stderr
    );

    // JSONL, by a link that climbs out with `..`.
    let jsonl = tmp.path().join("jsonl");
    std::fs::create_dir(&jsonl).unwrap();
    write_jsonl(&jsonl.join("a.jsonl"), 3);
    write_jsonl(&tmp.path().join("other.jsonl"), 5);
    symlink("../other.jsonl", jsonl.join("b.jsonl")).unwrap();
    let f = fails(&short_sample_args(&jsonl, &tmp.path().join("j1"), &[]));
    assert!(
        f.stderr.contains("b.jsonl: a symbolic link to")
            && f.stderr.contains("other.jsonl, outside"),
        "{}",
        f.stderr
    );
    std::fs::remove_file(jsonl.join("b.jsonl")).unwrap();
    symlink("a.jsonl", jsonl.join("b.jsonl")).unwrap();
    let out = tmp.path().join("j2");
    ok(&short_sample_args(&jsonl, &out, &[]));
    assert_eq!(ShardSet::open(&out).unwrap().manifest().totals.documents, 3);

    // Code: a link to a file of the same --src directory is read; one outside is refused.
    let code = tmp.path().join("code");
    std::fs::create_dir_all(code.join("repo")).unwrap();
    std::fs::write(code.join("repo/main.rs"), "fn main() {}\n").unwrap();
    std::fs::write(code.join("shared.rs"), "pub fn shared() {}\n").unwrap();
    symlink("../shared.rs", code.join("repo/lib.rs")).unwrap();
    let out = tmp.path().join("c0");
    let f = pack_text(&code, &out, "code");
    assert!(f.success, "{}", f.stderr);
    assert_eq!(ShardSet::open(&out).unwrap().manifest().totals.documents, 1);
    symlink(&secret, code.join("repo/secret.rs")).unwrap();
    let f = pack_text(&code, &tmp.path().join("c1"), "code");
    assert!(!f.success);
    assert!(
        f.stderr.contains("repo/secret.rs: a symbolic link to")
            && f.stderr.contains(&format!("outside {}", code.display()))
            && !f.stderr.contains("secret contents"),
        "{}",
        f.stderr
    );
}

#[test]
fn links_at_the_names_pack_keeps_in_out_are_refused_without_quoting_what_they_point_at() {
    use std::os::unix::fs::symlink;
    let tmp = tempfile::tempdir().unwrap();
    let (src, out, _journal) = interrupted_pack(tmp.path());
    // JSON whose values serde would quote in its message.
    let secret = tmp.path().join("secret.json");
    std::fs::write(&secret, r#"{"version": "the secret contents"}"#).unwrap();
    let args = pack_small_shards_args(p(&src), p(&out));

    for name in [
        "pack.journal.json",
        "pack.journal.bin",
        "shard-00000.bin",
        "index.json",
    ] {
        let at = out.join(name);
        let saved = tmp.path().join("saved");
        std::fs::rename(&at, &saved).ok();
        symlink(&secret, &at).unwrap();
        let f = fails(&args);
        assert!(
            f.stderr
                .contains(&format!("{}: a symbolic link", at.display()))
                && f.stderr.contains("keeps a file of its own")
                && !f.stderr.contains("secret contents"),
            "{name}: {}",
            f.stderr
        );
        std::fs::remove_file(&at).unwrap();
        std::fs::rename(&saved, &at).ok();
    }
    // A journal edited into other JSON is refused without quoting it either.
    std::fs::write(
        out.join("pack.journal.json"),
        r#"{"version": "the secret contents"}"#,
    )
    .unwrap();
    let f = fails(&args);
    assert!(
        f.stderr.contains("pack.journal.json")
            && f.stderr
                .contains("not a resume journal's fields and types, at line 1")
            && !f.stderr.contains("secret contents"),
        "{}",
        f.stderr
    );
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap(),
        r#"{"version": "the secret contents"}"#
    );
}
