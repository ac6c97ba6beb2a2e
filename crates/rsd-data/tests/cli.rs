//! The `rsd-data` binary end to end: round trips, determinism, resume after a crash, and every kind
//! of bad input a user can hand it.

mod common;
use common::{p, pack_args};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rsd_data::tokenizer::{Delimiter, Tokenizer, BUNDLED_NAME};
use rsd_shard::ShardSet;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rsd-data"))
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("run rsd-data")
}

fn ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "rsd-data {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn fails(args: &[&str]) -> String {
    let out = run(args);
    assert!(!out.status.success(), "rsd-data {args:?} should fail");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !err.contains("panicked"),
        "a panic is never an answer: {err}"
    );
    err
}

/// Documents with punctuation, Unicode, code, blank lines and a special-token literal.
fn sample_docs() -> Vec<String> {
    let mut docs = vec![
        "Call me Ishmael. Some years ago—never mind how long precisely—".to_string(),
        "fn main() {\n    println!(\"héllo, wörld 🌍\");\n}\n".to_string(),
        "Line one\n\n\nLine four with <|endoftext|> inside and trailing spaces   ".to_string(),
        "数字 1234567890 and émojis 🚀🚀".to_string(),
    ];
    for i in 0..40 {
        docs.push(format!(
            "Document {i}: {}",
            "the quick brown fox jumps over the lazy dog. ".repeat(i % 7 + 1)
        ));
    }
    docs
}

fn write_text_dir(dir: &Path, docs: &[String]) {
    std::fs::create_dir_all(dir).unwrap();
    for (i, d) in docs.iter().enumerate() {
        std::fs::write(dir.join(format!("doc-{i:03}.txt")), d).unwrap();
    }
}

fn write_jsonl(path: &Path, docs: &[String]) {
    let lines: Vec<String> = docs
        .iter()
        .map(|d| serde_json::json!({"id": 1, "text": d}).to_string())
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

fn bundled() -> Tokenizer {
    Tokenizer::load(BUNDLED_NAME, &Delimiter::None, &Delimiter::None).unwrap()
}

/// All tokens of a shard directory, in order.
fn all_tokens(dir: &Path) -> Vec<u32> {
    let set = ShardSet::open(dir).unwrap();
    let mut out = vec![];
    for g in 0..set.num_samples() {
        set.sample(g).unwrap().tokens.extend_into(&mut out);
    }
    out
}

fn dir_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

/// Shard files byte for byte, and the manifest minus the command line.
fn pack_identity(dir: &Path) -> Vec<(String, Vec<u8>)> {
    dir_files(dir)
        .into_iter()
        .map(|(name, bytes)| {
            if name == "index.json" {
                let mut m: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                m["command"] = serde_json::Value::Null;
                (name, m.to_string().into_bytes())
            } else {
                (name, bytes)
            }
        })
        .collect()
}

#[test]
fn fixed_round_trip_decodes_to_the_documents() {
    let tmp = tempfile::tempdir().unwrap();
    let docs = sample_docs();
    let src = tmp.path().join("books");
    write_text_dir(&src, &docs);
    let out = tmp.path().join("out");
    let report = ok(&pack_args(
        "64",
        &src,
        &out,
        &["--tail", "keep", "--progress", "none"],
    ));
    // The summary splits CPU time by stage (tokenize, read, pack+write) and gives the tokenize share.
    let cpu_line = report
        .lines()
        .find(|l| l.trim_start().starts_with("cpu"))
        .unwrap_or_else(|| panic!("no cpu line in:\n{report}"));
    let seconds: Vec<f64> = cpu_line
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(
        seconds.len() == 4
            && seconds.iter().all(|s| s.is_finite() && *s >= 0.0)
            && seconds[3] <= 100.0,
        "{cpu_line}"
    );
    let tok = bundled();
    let text = tok.decode(&all_tokens(&out)).unwrap();
    let expected: String = docs.iter().map(|d| format!("{d}<|endoftext|>")).collect();
    assert_eq!(text, expected);
    let set = ShardSet::open(&out).unwrap();
    let m = set.manifest();
    assert_eq!(m.totals.documents, docs.len() as u64);
    assert_eq!(
        (m.dtype, m.mode.name(), m.seq_len),
        (rsd_shard::TokenDtype::Int32, "fixed", 64)
    );
    assert_eq!(m.tokenizer.eos_id, Some(151643));
    for g in 0..set.num_samples() - 1 {
        assert_eq!(set.sample(g).unwrap().tokens.len(), 64);
    }
    ok(&["verify", p(&out)]);
}

#[test]
fn mixed_mode_keeps_documents_whole_and_recorded_as_pieces() {
    let tmp = tempfile::tempdir().unwrap();
    let docs = sample_docs();
    let src = tmp.path().join("d.jsonl");
    write_jsonl(&src, &docs);
    let out = tmp.path().join("out");
    ok(&pack_args(
        "256",
        &src,
        &out,
        &["--mode", "mixed", "--progress", "none"],
    ));
    let tok = bundled();
    let set = ShardSet::open(&out).unwrap();
    let mut decoded = vec![];
    for g in 0..set.num_samples() {
        let s = set.sample(g).unwrap();
        let ids = s.tokens.to_vec();
        assert!(ids.len() <= 256);
        let mut at = 0;
        for &piece in &s.pieces {
            let piece_ids = &ids[at..at + piece as usize];
            assert_eq!(
                *piece_ids.last().unwrap(),
                151643,
                "every piece is a whole document ending in EOS"
            );
            decoded.push(tok.decode(&piece_ids[..piece_ids.len() - 1]).unwrap());
            at += piece as usize;
        }
    }
    let mut expected = docs.clone();
    expected.sort();
    decoded.sort();
    assert_eq!(decoded, expected);
    let out_text = ok(&["inspect", p(&out), "--sample", "0"]);
    assert!(
        out_text.contains("mixed mode") && out_text.contains("document pieces per sample"),
        "{out_text}"
    );
}

#[test]
fn code_repositories_become_one_document_each_skipping_vendored_and_binary_files() {
    let tmp = tempfile::tempdir().unwrap();
    let repos = tmp.path().join("repos");
    std::fs::create_dir_all(repos.join("alpha/src")).unwrap();
    std::fs::create_dir_all(repos.join("alpha/node_modules/x")).unwrap();
    std::fs::create_dir_all(repos.join("alpha/.git")).unwrap();
    std::fs::create_dir_all(repos.join("beta")).unwrap();
    std::fs::write(repos.join("alpha/src/main.rs"), "fn main() {}\n").unwrap();
    std::fs::write(repos.join("alpha/README.md"), "# Alpha\n").unwrap();
    std::fs::write(repos.join("alpha/node_modules/x/index.js"), "vendored();\n").unwrap();
    std::fs::write(repos.join("alpha/.git/HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(
        repos.join("alpha/logo.png"),
        [0x89u8, b'P', b'N', b'G', 0, 0, 1],
    )
    .unwrap();
    std::fs::write(repos.join("beta/lib.py"), "def f():\n    return 1").unwrap();
    let out = tmp.path().join("out");
    ok(&pack_args(
        "4096",
        &repos,
        &out,
        &["--mode", "mixed", "--format", "code", "--progress", "none"],
    ));
    let tok = bundled();
    let set = ShardSet::open(&out).unwrap();
    assert_eq!(set.manifest().totals.documents, 2);
    let s = set.sample(0).unwrap();
    let text = tok.decode(&s.tokens.to_vec()).unwrap();
    assert_eq!(
        text,
        "--- README.md ---\n# Alpha\n--- src/main.rs ---\nfn main() {}\n<|endoftext|>--- lib.py ---\ndef f():\n    return 1\n<|endoftext|>"
    );
}

/// A file whose name is not UTF-8 (fine on Linux) is packed like any other: it is only
/// opened by its path. Where its name is written into a document (a code repository's file
/// headers), the bytes that are not UTF-8 are written `\xNN`.
#[test]
fn files_whose_names_are_not_utf8_are_packed_not_dropped() {
    use std::os::unix::ffi::OsStrExt;
    let tmp = tempfile::tempdir().unwrap();
    let odd = std::ffi::OsStr::from_bytes(b"bad\xff\\name.txt");
    let src = tmp.path().join("texts");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("good.txt"), "the good one").unwrap();
    std::fs::write(src.join(odd), "the odd one").unwrap();
    let out = tmp.path().join("out");
    let report = ok(&pack_args(
        "64",
        &src,
        &out,
        &["--tail", "keep", "--progress", "none"],
    ));
    assert!(report.contains(" 2 packed, 0 skipped"), "{report}");
    let text = bundled().decode(&all_tokens(&out)).unwrap();
    // Sorted by the names' bytes: 'b' before 'g'.
    assert_eq!(text, "the odd one<|endoftext|>the good one<|endoftext|>");
    assert_eq!(ShardSet::open(&out).unwrap().manifest().totals.documents, 2);

    let repos = tmp.path().join("repos");
    std::fs::create_dir_all(repos.join("alpha")).unwrap();
    std::fs::write(repos.join("alpha/good.rs"), "fn good() {}\n").unwrap();
    std::fs::write(repos.join("alpha").join(odd), "odd\n").unwrap();
    let out = tmp.path().join("out-code");
    ok(&pack_args(
        "4096",
        &repos,
        &out,
        &["--mode", "mixed", "--format", "code", "--progress", "none"],
    ));
    let text = bundled().decode(&all_tokens(&out)).unwrap();
    assert_eq!(
        text,
        "--- bad\\xff\\\\name.txt ---\nodd\n--- good.rs ---\nfn good() {}\n<|endoftext|>"
    );
}

#[test]
fn output_is_identical_for_any_worker_and_read_thread_count() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("books");
    write_text_dir(&src, &sample_docs());
    // Several JSONL files of a few hundred lines each: read threads hand documents over in
    // messages of at most 256, so each file spans several messages.
    let jsonl = tmp.path().join("jsonl");
    std::fs::create_dir_all(&jsonl).unwrap();
    for f in 0..5 {
        let docs: Vec<String> = (0..(150 + 70 * f))
            .map(|i| format!("File {f}, line {i}: {}", "lorem ipsum ".repeat(i % 5 + 1)))
            .collect();
        write_jsonl(&jsonl.join(format!("part-{f}.jsonl")), &docs);
    }
    let mut identities = vec![];
    for (workers, read_threads) in [("1", "1"), ("2", "1"), ("3", "3"), ("2", "8")] {
        let out = tmp.path().join(format!("out{workers}-{read_threads}"));
        ok(&[
            "pack",
            "--len",
            "32",
            "--mode",
            "mixed",
            "--shard-size",
            "6000",
            "--src",
            p(&src),
            "--src",
            p(&jsonl),
            "--out",
            p(&out),
            "--workers",
            workers,
            "--read-threads",
            read_threads,
            "--progress",
            "none",
        ]);
        identities.push(pack_identity(&out));
    }
    assert!(
        identities[0].len() > 6,
        "several shards expected: {:?}",
        identities[0].iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    for other in &identities[1..] {
        assert_eq!(&identities[0], other);
    }
    // Every file and document was read, and counted under its source.
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("out2-8/index.json")).unwrap())
            .unwrap();
    assert_eq!(m["sources"][0]["files"], 44);
    assert_eq!(m["sources"][1]["files"], 5);
    assert_eq!(m["sources"][1]["documents"], 150 * 5 + 70 * 10);
}

/// The crash is simulated by the binary itself, which only a build with the `fault-injection`
/// feature can do (`cargo test -p rsd-data --features fault-injection`).
#[test]
#[cfg_attr(
    not(feature = "fault-injection"),
    ignore = "needs --features fault-injection"
)]
fn a_crashed_pack_resumes_to_the_same_bytes() {
    for mode in ["fixed", "mixed"] {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("d.jsonl");
        write_jsonl(&src, &sample_docs());
        let args = |out: &Path| -> Vec<String> {
            [
                "pack",
                "--len",
                "48",
                "--mode",
                mode,
                "--shard-size",
                "400",
                "--src",
                p(&src),
                "--out",
                p(out),
                "--progress",
                "none",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect()
        };
        let reference = tmp.path().join("reference");
        ok(&args(&reference)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>());

        let out = tmp.path().join("out");
        let crashed = bin()
            .args(args(&out))
            .env("RSD_PACK_CRASH_AFTER_SHARDS", "3")
            .output()
            .unwrap();
        assert!(
            !crashed.status.success(),
            "the simulated crash must stop the run"
        );
        let names: Vec<String> = dir_files(&out).into_iter().map(|f| f.0).collect();
        assert!(
            !names.contains(&"index.json".to_string()),
            "no manifest after a crash: {names:?}"
        );
        assert!(
            names.iter().any(|n| n.ends_with(".tmp")),
            "the crash left a partial shard: {names:?}"
        );
        let err = fails(&["verify", p(&out)]);
        assert!(err.contains("no manifest"), "{err}");

        let resumed = ok(&args(&out).iter().map(String::as_str).collect::<Vec<_>>());
        assert!(resumed.contains("resumed after 3 shards"), "{resumed}");
        assert_eq!(
            pack_identity(&out),
            pack_identity(&reference),
            "{mode}: resumed output differs"
        );
    }
}

#[test]
#[cfg_attr(
    not(feature = "fault-injection"),
    ignore = "needs --features fault-injection"
)]
fn a_crashed_pack_with_skipped_input_resumes_to_the_same_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("src");
    std::fs::create_dir_all(&dir).unwrap();
    // Bad input before and after the crash: a malformed line early, a broken file at the end.
    let docs = sample_docs();
    let mut lines: Vec<String> = docs
        .iter()
        .map(|d| serde_json::json!({ "text": d }).to_string())
        .collect();
    lines.insert(1, "{\"text\": broken".into());
    std::fs::write(dir.join("a.jsonl"), lines.join("\n") + "\n").unwrap();
    std::fs::write(dir.join("b.jsonl.zst"), b"not zstd at all").unwrap();
    let out = tmp.path().join("out");
    let reference = tmp.path().join("reference");
    let args = |out: &Path| {
        [
            "pack",
            "--len",
            "48",
            "--shard-size",
            "400",
            "--skip-bad",
            "--src",
            p(&dir),
            "--out",
            p(out),
            "--progress",
            "none",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
    };
    ok(&args(&reference)
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>());
    let crashed = bin()
        .args(args(&out))
        .env("RSD_PACK_CRASH_AFTER_SHARDS", "2")
        .output()
        .unwrap();
    assert!(!crashed.status.success());
    let resumed = ok(&args(&out).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(resumed.contains("resumed after 2 shards"), "{resumed}");
    assert_eq!(pack_identity(&out), pack_identity(&reference));
    let bad = ShardSet::open(&out)
        .unwrap()
        .manifest()
        .totals
        .bad_inputs
        .clone();
    let got: Vec<(&str, u64)> = bad.iter().map(|b| (b.cause.as_str(), b.count)).collect();
    assert_eq!(got, [("bad-record", 1), ("wrong-format", 1)], "{bad:?}");
}

#[test]
fn complete_output_is_not_overwritten_without_force() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("d.jsonl");
    write_jsonl(&src, &sample_docs());
    let out = tmp.path().join("out");
    let args = [
        "pack",
        "--len",
        "64",
        "--src",
        p(&src),
        "--out",
        p(&out),
        "--progress",
        "none",
    ];
    ok(&args);
    let before = dir_files(&out);
    let err = fails(&args);
    assert!(
        err.contains("already holds a complete pack") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(dir_files(&out), before);
    let mut forced = args.to_vec();
    forced.push("--force");
    ok(&forced);

    let foreign = tmp.path().join("foreign");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::write(foreign.join("notes.txt"), "mine").unwrap();
    let err = fails(&pack_args("64", &src, &foreign, &[]));
    assert!(
        err.contains("not an rsd shard directory") && err.contains("notes.txt"),
        "{err}"
    );
}

#[test]
fn malformed_json_names_file_and_line_or_is_skipped_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("bad.jsonl");
    std::fs::write(
        &src,
        "{\"text\": \"good one\"}\n{\"text\": \"broken\n{\"text\": \"good two\"}\n",
    )
    .unwrap();
    let out = tmp.path().join("out");
    let err = fails(&pack_args("4", &src, &out, &[]));
    assert!(
        err.contains("bad.jsonl:line 2") && err.contains("malformed JSON"),
        "{err}"
    );
    assert!(!out.join("index.json").exists());

    let out2 = tmp.path().join("out2");
    let stdout = ok(&pack_args(
        "4",
        &src,
        &out2,
        &["--skip-bad", "--tail", "keep", "--progress", "none"],
    ));
    assert!(
        stdout.contains("1 skipped") && stdout.contains("line 2"),
        "{stdout}"
    );
    let m = ShardSet::open(&out2).unwrap().manifest().clone();
    assert_eq!((m.totals.documents, m.totals.skipped_documents), (2, 1));

    // The same file second of three, each read by its own thread: still named, line and all.
    let dir = tmp.path().join("parts");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.jsonl"), "{\"text\": \"fine\"}\n").unwrap();
    std::fs::copy(&src, dir.join("b.jsonl")).unwrap();
    std::fs::write(dir.join("c.jsonl"), "{\"text\": \"fine too\"}\n").unwrap();
    let out3 = tmp.path().join("out3");
    let err = fails(&pack_args("4", &dir, &out3, &["--read-threads", "3"]));
    assert!(
        err.contains("b.jsonl:line 2") && err.contains("malformed JSON"),
        "{err}"
    );
    assert!(!out3.join("index.json").exists());
}

#[test]
fn missing_field_lists_the_fields_there_are() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("d.jsonl");
    std::fs::write(&src, "{\"content\": \"x\", \"meta\": 1}\n").unwrap();
    let err = fails(&pack_args("4", &src, &tmp.path().join("o"), &[]));
    assert!(
        err.contains("d.jsonl:line 1")
            && err.contains("no field \"text\"")
            && err.contains("content, meta"),
        "{err}"
    );
    ok(&pack_args(
        "4",
        &src,
        &tmp.path().join("o2"),
        &[
            "--text-field",
            "content",
            "--tail",
            "keep",
            "--progress",
            "none",
        ],
    ));
}

#[test]
fn invalid_utf8_names_file_and_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("books");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a.txt"), b"fine text").unwrap();
    std::fs::write(src.join("b.txt"), b"abc\xff\xfedef").unwrap();
    let err = fails(&pack_args("4", &src, &tmp.path().join("o"), &[]));
    assert!(
        err.contains("b.txt:byte 3") && err.contains("invalid UTF-8"),
        "{err}"
    );
    let jsonl = tmp.path().join("d.jsonl");
    std::fs::write(&jsonl, b"{\"text\": \"ok\"}\n{\"text\": \"\xff\"}\n").unwrap();
    let err = fails(&pack_args("4", &jsonl, &tmp.path().join("o2"), &[]));
    assert!(
        err.contains("d.jsonl:line 2") && err.contains("invalid UTF-8"),
        "{err}"
    );
}

#[test]
fn empty_documents_are_skipped_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("d.jsonl");
    std::fs::write(
        &src,
        "{\"text\": \"\"}\n{\"text\": \"hello world\"}\n\n{\"text\": \"\"}\n",
    )
    .unwrap();
    let out = tmp.path().join("o");
    ok(&pack_args(
        "4",
        &src,
        &out,
        &["--tail", "keep", "--progress", "none"],
    ));
    let m = ShardSet::open(&out).unwrap().manifest().clone();
    assert_eq!((m.totals.documents, m.totals.skipped_documents), (1, 2));
    // Nothing but empty documents is an error, not an empty success.
    let empty = tmp.path().join("e.jsonl");
    std::fs::write(&empty, "{\"text\": \"\"}\n").unwrap();
    let err = fails(&pack_args("4", &empty, &tmp.path().join("o2"), &[]));
    assert!(
        err.contains("nothing to write") && err.contains("1 skipped"),
        "{err}"
    );
}

#[test]
fn corrupt_zstd_names_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let docs = sample_docs();
    let lines: String = docs
        .iter()
        .map(|d| serde_json::json!({"text": d}).to_string() + "\n")
        .collect();
    let compressed = zstd::encode_all(lines.as_bytes(), 3).unwrap();
    let good = tmp.path().join("good.jsonl.zst");
    std::fs::write(&good, &compressed).unwrap();
    let out = tmp.path().join("o");
    ok(&pack_args(
        "16",
        &good,
        &out,
        &["--tail", "keep", "--progress", "none"],
    ));
    assert_eq!(
        ShardSet::open(&out).unwrap().manifest().totals.documents,
        docs.len() as u64
    );

    let truncated = tmp.path().join("trunc.jsonl.zst");
    std::fs::write(&truncated, &compressed[..compressed.len() / 2]).unwrap();
    let err = fails(&pack_args("16", &truncated, &tmp.path().join("o2"), &[]));
    assert!(
        err.contains("trunc.jsonl.zst") && err.contains("truncated") && err.contains("line 1"),
        "{err}"
    );

    let mut garbled = compressed.clone();
    for b in garbled.iter_mut().skip(20).take(40) {
        *b ^= 0xa5;
    }
    let bad = tmp.path().join("garbled.jsonl.zst");
    std::fs::write(&bad, &garbled).unwrap();
    let err = fails(&pack_args("16", &bad, &tmp.path().join("o3"), &[]));
    assert!(err.contains("garbled.jsonl.zst"), "{err}");
}

#[test]
fn truncated_parquet_and_arrow_name_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let pq = tmp.path().join("t.parquet");
    std::fs::write(&pq, b"PAR1\x00\x00\x00garbage").unwrap();
    let err = fails(&pack_args("16", &pq, &tmp.path().join("o"), &[]));
    assert!(
        err.contains("t.parquet") && err.contains("Parquet"),
        "{err}"
    );
    let arrow = tmp.path().join("t.arrow");
    std::fs::write(&arrow, b"ARROW1\x00\x00garbage").unwrap();
    let err = fails(&pack_args("16", &arrow, &tmp.path().join("o2"), &[]));
    assert!(err.contains("t.arrow") && err.contains("Arrow"), "{err}");
}

#[test]
fn prolong_sources_say_where_they_looked() {
    let tmp = tempfile::tempdir().unwrap();
    let err = fails(&[
        "pack",
        "--src",
        "prolong/book",
        "--data-root",
        p(tmp.path()),
        "--out",
        p(&tmp.path().join("o")),
    ]);
    assert!(
        err.contains("prolong-data-64K/book-65536") && err.contains("procNN-64"),
        "{err}"
    );
}

#[test]
fn disk_full_is_a_clean_error_with_no_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("d.jsonl");
    let docs: Vec<String> = (0..300)
        .map(|i| format!("{i} {}", "lorem ipsum dolor sit amet ".repeat(40)))
        .collect();
    write_jsonl(&src, &docs);
    let out = tmp.path().join("o");
    // RLIMIT_FSIZE makes writes past 64 KiB fail with EFBIG, as a full disk fails them with ENOSPC.
    let script = format!(
        "trap '' XFSZ; ulimit -f 64; exec {} pack --len 256 --src {} --out {} --progress none",
        env!("CARGO_BIN_EXE_rsd-data"),
        p(&src),
        p(&out)
    );
    let res = Command::new("sh").arg("-c").arg(&script).output().unwrap();
    let err = String::from_utf8_lossy(&res.stderr);
    assert!(!res.status.success(), "must fail: {err}");
    assert!(
        err.contains("error:") && err.contains("shard-00000.bin") && err.contains("too large"),
        "{err}"
    );
    assert!(!out.join("index.json").exists());
    assert!(!PathBuf::from(&out).join("shard-00000.bin").exists());
}

#[test]
fn an_unloadable_tokenizer_says_what_both_engines_found() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = tmp.path().join("tokenizer.json");
    let json = serde_json::json!({
        "version": "1.0", "added_tokens": [], "normalizer": null, "pre_tokenizer": null,
        "post_processor": {"type": "Mystery"}, "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "a": 1}, "unk_token": "[UNK]"}
    });
    std::fs::write(&tok, json.to_string()).unwrap();
    let src = tmp.path().join("d.jsonl");
    std::fs::write(&src, "{\"text\": \"a\"}\n").unwrap();
    let err = fails(&pack_args(
        "4",
        &src,
        &tmp.path().join("o"),
        &["--tokenizer", p(&tok)],
    ));
    assert!(
        err.contains("tokenizer.json")
            && err.contains("fast encoder")
            && err.contains("tokenizers 0.22")
            && err.contains("Mystery"),
        "{err}"
    );
    let err = fails(&pack_args(
        "4",
        &src,
        &tmp.path().join("o2"),
        &["--tokenizer", p(&src)],
    ));
    assert!(
        err.contains("d.jsonl") && err.contains("not a tokenizer.json"),
        "{err}"
    );
}

#[test]
fn a_progress_interval_that_is_not_a_duration_is_refused_naming_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("books");
    write_text_dir(&src, &sample_docs());
    for bad in ["inf", "NaN", "-1", "0", "1e9", "soon"] {
        let out = tmp.path().join(format!("out-{bad}"));
        let err = fails(&pack_args(
            "64",
            &src,
            &out,
            &[&format!("--progress-interval={bad}")],
        ));
        assert!(
            err.contains("--progress-interval") && err.contains("0.1 to 86400"),
            "{bad}: {err}"
        );
        assert!(!out.exists(), "{bad}: nothing is written");
    }
}

#[test]
fn inspect_says_when_ids_are_outside_the_tokenizer_it_decodes_with() {
    let tmp = tempfile::tempdir().unwrap();
    // A two-id tokenizer, and shards packed with it.
    let tok = tmp.path().join("tokenizer.json");
    let json = serde_json::json!({
        "version": "1.0", "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "a": 1}, "unk_token": "[UNK]"}
    });
    std::fs::write(&tok, json.to_string()).unwrap();
    let src = tmp.path().join("d.jsonl");
    std::fs::write(&src, "{\"text\": \"a a a a a a a a a a\"}\n").unwrap();
    let out = tmp.path().join("out");
    ok(&pack_args(
        "4",
        &src,
        &out,
        &["--tokenizer", p(&tok), "--progress", "none"],
    ));
    let clean = ok(&["inspect", p(&out), "--sample", "0"]);
    assert!(!clean.contains("outside the tokenizer"), "{clean}");
    // A damaged (or hostile) shard: its first id is one the tokenizer does not have.
    let bin = out.join("shard-00000.bin");
    let mut bytes = std::fs::read(&bin).unwrap();
    bytes[0] = 7;
    std::fs::write(&bin, bytes).unwrap();
    let text = ok(&["inspect", p(&out), "--sample", "0"]);
    assert!(
        text.contains("outside the tokenizer's 2-id vocabulary") && text.contains("e.g. 7"),
        "{text}"
    );
}
