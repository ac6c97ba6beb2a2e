//! Hostile input to every parser of a file rsd-eval reads: crafted files get a clear error naming
//! the file (and the line and field), and random or damaged bytes get an error or a correct
//! value, never a panic (proptest, 256 cases each).
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use rsd_eval::results::{parse_line, read_results, ItemResult};

fn record(length: usize, depth: Option<f64>, sample: usize, score: f64) -> ItemResult {
    ItemResult {
        task: "niah_single_1".into(),
        length,
        depth,
        sample,
        expected: vec!["7342".into()],
        output: "7342".into(),
        score,
        prompt_tokens: length.saturating_sub(5),
        logprob: None,
        rank: None,
        candidates: None,
        greedy: None,
        score_norm: None,
    }
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn tokenizer() -> rsd_model::generate::TextTokenizer {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../assets/tokenizers/mini-1k/tokenizer.json");
    rsd_model::generate::TextTokenizer::from_file(&p).unwrap()
}

/// A file of `size` bytes that holds none (sparse): what a 60 GB download claims.
fn sparse(dir: &Path, name: &str, size: u64) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().set_len(size).unwrap();
    p
}

// ------------------------------------------------------------------------------ results.jsonl

#[test]
fn out_of_range_result_values_name_the_line_and_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let good = serde_json::to_string(&record(1024, Some(0.5), 0, 1.0)).unwrap();
    let cases: [(&str, serde_json::Value, &str); 10] = [
        (
            "depth",
            1.5.into(),
            "field depth: 1.5 is not a fraction in [0, 1]",
        ),
        (
            "depth",
            (-0.25).into(),
            "field depth: -0.25 is not a fraction in [0, 1]",
        ),
        (
            "score",
            2.0.into(),
            "field score: 2 is not a score in [0, 1]",
        ),
        (
            "length",
            0.into(),
            "field length: 0 is not a token count in 1..=1073741824",
        ),
        (
            "length",
            (1u64 << 40).into(),
            "field length: 1099511627776 is not a token count",
        ),
        (
            "logprob",
            3.0.into(),
            "field logprob: 3 is not a log-probability",
        ),
        (
            "candidates",
            0.into(),
            "field candidates: 0 is not a count of candidates",
        ),
        (
            "score_norm",
            (-1.0).into(),
            "field score_norm: -1 is not a score in [0, 1]",
        ),
        (
            "task",
            "".into(),
            "field task: \"\" must be a name of 1 to 256 characters",
        ),
        (
            "prompt_tokens",
            (1u64 << 40).into(),
            "field prompt_tokens: 1099511627776 is more",
        ),
    ];
    for (field, value, want) in cases {
        let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
        v[field] = value;
        let p = write(
            dir.path(),
            "results.jsonl",
            format!("{good}\n{v}\n").as_bytes(),
        );
        let e = read_results(&p).unwrap_err().to_string();
        assert!(e.contains("results.jsonl:2: "), "{e}");
        assert!(e.contains(want), "{field}: {e}");
    }
    // A rank beyond the candidates ranked.
    let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
    v["rank"] = 5.into();
    v["candidates"] = 4.into();
    let p = write(dir.path(), "results.jsonl", format!("{v}\n").as_bytes());
    let e = read_results(&p).unwrap_err().to_string();
    assert!(
        e.contains("results.jsonl:1: field rank: 5 is not a rank in 1..=4"),
        "{e}"
    );
}

#[test]
fn a_long_or_control_laden_value_is_cut_and_escaped_in_the_message() {
    let dir = tempfile::tempdir().unwrap();
    // serde quotes the offending string: 1 MB of it, with a terminal escape.
    let long = format!("\u{1b}[2J{}", "x".repeat(1 << 20));
    let line = serde_json::json!({"task": 3, "length": long}).to_string();
    let p = write(dir.path(), "results.jsonl", format!("{line}\n").as_bytes());
    let e = read_results(&p).unwrap_err().to_string();
    assert!(e.contains("results.jsonl:1: not a result record"), "{e}");
    assert!(e.len() < 2000, "message of {} bytes", e.len());
    assert!(!e.contains('\u{1b}'), "{e}");
    let mut v = serde_json::to_value(record(8, None, 0, 0.0)).unwrap();
    v["task"] = format!("\u{1b}]0;owned\u{7}{}", "t".repeat(5000)).into();
    let p = write(dir.path(), "results.jsonl", format!("{v}\n").as_bytes());
    let e = read_results(&p).unwrap_err().to_string();
    assert!(
        e.contains("field task:") && e.contains("more characters"),
        "{e}"
    );
    assert!(
        e.len() < 2000 && !e.contains('\u{1b}') && !e.contains('\u{7}'),
        "{e}"
    );
}

#[test]
fn a_sparse_results_file_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let p = sparse(dir.path(), "results.jsonl", 60 << 30);
    let t = std::time::Instant::now();
    let e = read_results(&p).unwrap_err().to_string();
    assert!(
        e.contains("results.jsonl: 64424509440 bytes, more than the 4294967296 bytes a results file may have"),
        "{e}"
    );
    // Refused from its size: a metadata call, microseconds (a loaded machine leaves a margin of
    // thousands under 5 s); reading the 60 GB, even of holes, takes seconds.
    assert!(t.elapsed().as_secs() < 5);
    // Under the file bound, a line without a newline ends at the line bound, not in memory.
    let p = sparse(dir.path(), "results.jsonl", 100 << 20);
    let e = read_results(&p).unwrap_err().to_string();
    assert!(
        e.contains("results.jsonl:1: a line of more than 67108864 bytes"),
        "{e}"
    );
}

#[test]
fn records_spanning_too_many_depths_or_lengths_are_refused_by_count() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::new();
    for i in 0..300 {
        let r = record(1024 + i, Some(i as f64 / 300.0), 0, 1.0);
        text += &serde_json::to_string(&r).unwrap();
        text.push('\n');
    }
    let p = write(dir.path(), "results.jsonl", text.as_bytes());
    let e = read_results(&p).unwrap_err().to_string();
    assert!(
        e.contains(
            "results.jsonl: 300 distinct lengths, more than the 256 rsd-eval tabulates and plots"
        ),
        "{e}"
    );
}

fn arb_record() -> impl Strategy<Value = ItemResult> {
    (
        "[a-z_0-9]{0,12}",
        0usize..(1 << 31),
        prop::option::of(-0.5f64..1.5),
        0usize..1000,
        -0.5f64..1.5,
        0usize..(1 << 31),
        prop::option::of(-100.0f64..1.0),
        prop::option::of(0usize..10),
        prop::option::of(0usize..10),
    )
        .prop_map(
            |(task, length, depth, sample, score, pt, logprob, rank, candidates)| ItemResult {
                task,
                length,
                depth,
                sample,
                expected: vec!["1".into()],
                output: String::new(),
                score,
                prompt_tokens: pt,
                logprob,
                rank,
                candidates,
                greedy: None,
                score_norm: None,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random bytes as a results line: an error or a record whose values are all in range.
    #[test]
    fn random_result_lines_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let text = String::from_utf8_lossy(&bytes);
        if let Ok(r) = parse_line(Path::new("r.jsonl"), 1, &text) {
            prop_assert!(rsd_eval::results::invalid_field(&r).is_none());
        }
    }

    /// Any record's values: accepted exactly when every one is in its range.
    #[test]
    fn records_are_accepted_exactly_when_in_range(r in arb_record()) {
        let line = serde_json::to_string(&r).unwrap();
        let in_range = !r.task.is_empty()
            && (1..=1 << 30).contains(&r.length)
            && r.depth.is_none_or(|d| (0.0..=1.0).contains(&d))
            && (0.0..=1.0).contains(&r.score)
            && r.prompt_tokens <= 1 << 30
            && r.logprob.is_none_or(|lp| lp <= 0.01)
            && r.candidates.is_none_or(|c| c >= 1)
            && r.rank.is_none_or(|k| k >= 1 && k <= r.candidates.unwrap_or(1 << 20));
        match parse_line(Path::new("r.jsonl"), 7, &line) {
            Ok(back) => {
                prop_assert!(in_range, "accepted {line}");
                prop_assert_eq!(back.length, r.length);
            }
            Err(e) => {
                prop_assert!(!in_range, "refused {line}: {e}");
                prop_assert!(e.to_string().starts_with("r.jsonl:7: "));
            }
        }
    }

    /// A valid results file cut or with a byte changed: an error or records, never a panic.
    #[test]
    fn damaged_results_files_never_panic(cut in 0usize..400, at in 0usize..400, byte in any::<u8>()) {
        let dir = tempfile::tempdir().unwrap();
        let mut text = Vec::new();
        for s in 0..3 {
            text.extend(serde_json::to_string(&record(1024, Some(0.25), s, 0.5)).unwrap().bytes());
            text.push(b'\n');
        }
        let n = text.len();
        text[at % n] = byte;
        text.truncate(cut.min(n));
        let p = write(dir.path(), "results.jsonl", &text);
        if let Ok(items) = read_results(&p) {
            prop_assert!(items.iter().all(|r| rsd_eval::results::invalid_field(r).is_none()));
        }
    }
}

// ------------------------------------------------------------------------- items (score --items)

#[test]
fn a_sparse_items_file_is_refused_quickly() {
    let dir = tempfile::tempdir().unwrap();
    let p = sparse(dir.path(), "items.jsonl", 60 << 30);
    let e = rsd_eval::items::read_items(&p, &tokenizer())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("items.jsonl: 64424509440 bytes, more than the 1073741824 bytes a file of items may have"),
        "{e}"
    );
    let p = sparse(dir.path(), "items.jsonl", 100 << 20);
    let e = rsd_eval::items::read_items(&p, &tokenizer())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("items.jsonl:1: a line of more than 67108864 bytes"),
        "{e}"
    );
}

#[test]
fn item_values_out_of_range_name_the_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer();
    let base = r#""context": "c", "candidates": [" a", " b"], "answer": " a""#;
    let cases = [
        (
            format!("{{{base}, \"length\": 1099511627776}}"),
            "\"length\" 1099511627776 is not a positive token count",
        ),
        (
            format!("{{{base}, \"task\": \"\"}}"),
            "\"task\" \"\" must be a name of 1 to 256 characters",
        ),
        (
            format!(
                r#"{{"context": "c", "candidates": [" a", " b"], "answer": "{}"}}"#,
                "\\u001b[2J".repeat(300)
            ),
            "more characters",
        ),
    ];
    for (line, want) in cases {
        let p = write(dir.path(), "items.jsonl", format!("\n{line}\n").as_bytes());
        let e = rsd_eval::items::read_items(&p, &tok)
            .unwrap_err()
            .to_string();
        assert!(e.contains("items.jsonl:2: "), "{e}");
        assert!(e.contains(want), "{want}: {e}");
        assert!(!e.contains('\u{1b}') && e.len() < 2000, "{e}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random and damaged item lines: an error or items whose values are in range.
    #[test]
    fn random_items_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200), at in 0usize..200, byte in any::<u8>()) {
        let dir = tempfile::tempdir().unwrap();
        let tok = tokenizer();
        let p = write(dir.path(), "items.jsonl", &bytes);
        let _ = rsd_eval::items::read_items(&p, &tok);
        let mut good = br#"{"context": "the key is", "candidates": [" red", " blue"], "answer": " red", "depth": 0.5, "length": 64}"#.to_vec();
        let n = good.len();
        good[at % n] = byte;
        let p = write(dir.path(), "items.jsonl", &good);
        if let Ok(items) = rsd_eval::items::read_items(&p, &tok) {
            for it in items {
                prop_assert!(it.depth.is_none_or(|d| (0.0..=1.0).contains(&d)));
                prop_assert!(it.length >= 1 && it.gold < it.candidates.len());
            }
        }
    }
}

// -------------------------------------------------------------------- predictions (score --pred)

#[test]
fn a_sparse_prediction_file_is_refused_quickly() {
    let dir = tempfile::tempdir().unwrap();
    let p = sparse(dir.path(), "niah_single_1.jsonl", 60 << 30);
    let e = rsd_eval::ruler::read_predictions(&p)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("niah_single_1.jsonl: 64424509440 bytes, more than the 1073741824 bytes"),
        "{e}"
    );
}

#[test]
fn a_link_loop_in_a_prediction_directory_ends() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("pred");
    std::fs::create_dir_all(d.join("4096")).unwrap();
    std::os::unix::fs::symlink(&d, d.join("4096").join("loop")).unwrap();
    let line = r#"{"pred": "7", "outputs": ["7"], "length": 4096, "index": 0}"#;
    write(
        &d.join("4096"),
        "niah_single_1.jsonl",
        format!("{line}\n").as_bytes(),
    );
    let got = rsd_eval::ruler::read_predictions(&d).unwrap();
    assert_eq!(got.len(), 1);
}

#[test]
fn prediction_values_out_of_range_name_the_field() {
    let cases = [
        (
            r#"{"pred": "7", "outputs": ["7"], "length": 0, "index": 0}"#,
            "field length: 0 is not a token count",
        ),
        (
            r#"{"pred": "7", "outputs": ["7"], "length": 8, "index": 0, "depth": 2}"#,
            "\"depth\" is not a number in [0, 1]",
        ),
        (
            r#"{"pred": "7", "outputs": ["7"], "length": 8, "index": 0, "task": ""}"#,
            "field task: \"\" must be a name",
        ),
    ];
    for (line, want) in cases {
        let e = rsd_eval::ruler::prediction_of(line, "niah_single_1").unwrap_err();
        assert!(e.contains(want), "{want}: {e}");
    }
    let many: Vec<String> = (0..101).map(|i| i.to_string()).collect();
    let line =
        serde_json::json!({"pred": "7", "outputs": many, "length": 8, "index": 0}).to_string();
    let e = rsd_eval::ruler::prediction_of(&line, "x").unwrap_err();
    assert!(
        e.contains("field outputs: 101 strings, more than the 100"),
        "{e}"
    );
    let line =
        serde_json::json!({"pred": "7".repeat(2 << 20), "outputs": ["7"], "length": 8, "index": 0})
            .to_string();
    let e = rsd_eval::ruler::prediction_of(&line, "x").unwrap_err();
    assert!(
        e.contains("field pred: 2097152 bytes, more than the 1048576"),
        "{e}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random and damaged prediction lines: an error or an in-range record.
    #[test]
    fn random_predictions_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200), at in 0usize..120, byte in any::<u8>()) {
        let text = String::from_utf8_lossy(&bytes);
        if let Ok(r) = rsd_eval::ruler::prediction_of(&text, "niah_single_1") {
            prop_assert!(rsd_eval::results::invalid_field(&r).is_none());
        }
        let mut good = br#"{"pred": "the 7342", "outputs": ["7342"], "length": 4096, "others": {"depth": 0.5, "id": 3}, "index": 3}"#.to_vec();
        let n = good.len();
        good[at % n] = byte;
        if let Ok(r) = rsd_eval::ruler::prediction_of(&String::from_utf8_lossy(&good), "niah_single_1") {
            prop_assert!(rsd_eval::results::invalid_field(&r).is_none());
        }
    }
}

// ------------------------------------------------------------------------------------ LongBench

#[test]
fn a_sparse_longbench_data_file_is_refused_quickly() {
    let dir = tempfile::tempdir().unwrap();
    let p = sparse(dir.path(), "data.json", 60 << 30);
    let e = rsd_eval::longbench::read_data(&p).unwrap_err().to_string();
    assert!(
        e.contains(
            "data.json: more than 1073741824 bytes, the most a LongBench data file may have"
        ),
        "{e}"
    );
}

#[test]
fn longbench_predictions_must_be_consistent() {
    let base = r#""_id": "q", "difficulty": "easy", "length": "short", "response": "The correct answer is (B)""#;
    let cases = [
        (
            format!("{{{base}, \"answer\": \"E\"}}"),
            "field answer: \"E\", expected A, B, C or D",
        ),
        (
            format!("{{{base}, \"answer\": \"B\", \"pred\": \"Z\"}}"),
            "field pred: \"Z\"",
        ),
        (
            format!("{{{base}, \"answer\": \"B\", \"pred\": \"B\", \"judge\": false}}"),
            "field judge: false",
        ),
    ];
    for (line, want) in cases {
        let e = rsd_eval::longbench::parse_prediction(&line)
            .map(|_| ())
            .unwrap_err();
        assert!(e.contains(want), "{want}: {e}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random and damaged data.json text and prediction lines: an error or checked values.
    #[test]
    fn random_longbench_input_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300), at in 0usize..300, byte in any::<u8>()) {
        let text = String::from_utf8_lossy(&bytes);
        let _ = rsd_eval::longbench::parse_data(Path::new("data.json"), &text);
        if let Ok(p) = rsd_eval::longbench::parse_prediction(&text) {
            prop_assert!(["A", "B", "C", "D"].contains(&p.answer.as_str()));
        }
        let mut good = br#"[{"_id": "x", "difficulty": "easy", "length": "short", "question": "q", "choice_A": "a", "choice_B": "b", "choice_C": "c", "choice_D": "d", "answer": "C", "context": "ctx"}]"#.to_vec();
        let n = good.len();
        good[at % n] = byte;
        if let Ok(qs) = rsd_eval::longbench::parse_data(Path::new("data.json"), &String::from_utf8_lossy(&good)) {
            prop_assert!(qs.iter().all(|q| ["A", "B", "C", "D"].contains(&q.answer.as_str())));
        }
    }
}

// ------------------------------------------------------------------------------------- ppl.json

fn ppl_json() -> serde_json::Value {
    serde_json::json!({
        "model": "m", "shards": "s", "seq_len": 16, "rows": 1, "batch_size": 1, "perturb": "skip",
        "max_skip": null, "seed": 0, "nll": 2.0, "ppl": 7.389, "view_gap": 0.1,
        "buckets": [
            {"start": 0, "end": 8, "tokens": 8, "nll": 2.0, "ppl": 7.389, "gap_rows": 4, "view_gap": 0.1},
            {"start": 8, "end": 16, "tokens": 7, "nll": 2.0, "ppl": 7.389, "gap_rows": 8, "view_gap": 0.1}
        ],
        "views": [{"sample": 0, "split": 4, "skip": 3}]
    })
}

#[test]
fn ppl_json_values_out_of_range_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, serde_json::Value, &str); 3] = [
        (
            "/seq_len",
            (1u64 << 40).into(),
            "field seq_len: 1099511627776 is not a row length",
        ),
        (
            "/buckets/1/end",
            99.into(),
            "field buckets[1].end: positions 8..99 are not a non-empty range inside 0..16",
        ),
        (
            "/ppl",
            (-1.0).into(),
            "field nll: nll 2 and ppl -1 must be finite numbers, ppl positive",
        ),
    ];
    for (at, value, want) in cases {
        let mut v = ppl_json();
        *v.pointer_mut(at).unwrap() = value;
        let p = write(dir.path(), "ppl.json", v.to_string().as_bytes());
        let e = rsd_eval::plot::read_ppl(&p).unwrap_err().to_string();
        assert!(e.contains("ppl.json: ") && e.contains(want), "{want}: {e}");
    }
    let p = write(dir.path(), "ppl.json", ppl_json().to_string().as_bytes());
    assert!(rsd_eval::plot::read_ppl(&p).is_ok());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random and damaged ppl.json: an error or a report whose every value passes the check.
    #[test]
    fn random_ppl_json_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200), at in 0usize..600, byte in any::<u8>()) {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "ppl.json", &bytes);
        let _ = rsd_eval::plot::read_ppl(&p);
        let mut good = ppl_json().to_string().into_bytes();
        let n = good.len();
        good[at % n] = byte;
        let p = write(dir.path(), "ppl.json", &good);
        if let Ok(r) = rsd_eval::plot::read_ppl(&p) {
            prop_assert!(r.invalid_field().is_none());
            // What plot draws from it is drawable.
            let _ = rsd_eval::ppl::ppl_by_position(&r);
        }
    }
}

// --------------------------------------------------------------- haystack, QA and MC data files

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random bytes as RULER's essay file, SQuAD's and HotpotQA's files and each MC benchmark's
    /// file: an error, never a panic.
    #[test]
    fn random_data_files_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let dir = tempfile::tempdir().unwrap();
        let tok = tokenizer();
        let p = write(dir.path(), "essays.json", &bytes);
        let _ = rsd_eval::tasks::Haystack::from_path(&p, &tok);
        write(dir.path(), "squad.json", &bytes);
        write(dir.path(), "hotpotqa.json", &bytes);
        let _ = rsd_eval::qa::QaSet::read(rsd_eval::qa::QaSource::Squad, dir.path());
        let _ = rsd_eval::qa::QaSet::read(rsd_eval::qa::QaSource::HotpotQa, dir.path());
        let p = write(dir.path(), "bench.jsonl", &bytes);
        for task in [rsd_eval::mc::McTask::Hellaswag, rsd_eval::mc::McTask::Winogrande, rsd_eval::mc::McTask::Openbookqa] {
            let _ = rsd_eval::mc::read(task, &p);
        }
        let p = write(dir.path(), "x_test.csv", &bytes);
        let _ = rsd_eval::mc::read(rsd_eval::mc::McTask::Mmlu, &p);
    }
}

#[test]
fn a_sparse_haystack_file_is_refused_with_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let p = sparse(dir.path(), "essays.json", 200 << 20);
    let e = rsd_eval::tasks::Haystack::from_path(&p, &tokenizer())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("essays.json") && e.contains("more than 33554432 bytes"),
        "{e}"
    );
    let d = dir.path().join("hay");
    std::fs::create_dir_all(&d).unwrap();
    sparse(&d, "a.txt", 20 << 20);
    sparse(&d, "b.txt", 20 << 20);
    let e = rsd_eval::tasks::Haystack::from_path(&d, &tokenizer())
        .unwrap_err()
        .to_string();
    assert!(e.contains("more than 33554432 bytes of text"), "{e}");
}

/// A haystack directory follows a link only to a file inside it: a link to a file elsewhere is
/// refused, naming the link and its target and quoting nothing the target holds, so no other
/// file's words reach a prompt (or `--dump-prompts`). A link to a file inside is read.
#[test]
fn a_haystack_link_out_of_its_directory_is_refused_and_one_inside_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let words = |n: usize, w: &str| vec![w; n].join(" ");
    let secret = write(
        dir.path(),
        "secret.txt",
        words(2000, "SECRETWORD").as_bytes(),
    );
    let hay = dir.path().join("hay");
    std::fs::create_dir_all(hay.join("sub")).unwrap();
    write(&hay, "a.txt", words(1500, "plain").as_bytes());
    std::os::unix::fs::symlink(&secret, hay.join("b.txt")).unwrap();
    let e = rsd_eval::tasks::Haystack::from_path(&hay, &tokenizer())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("b.txt: a symbolic link to")
            && e.contains("secret.txt")
            && e.contains("outside")
            && !e.contains("SECRETWORD"),
        "{e}"
    );
    // Inside the directory (here through a subdirectory): followed, and its words are read.
    std::fs::remove_file(hay.join("b.txt")).unwrap();
    write(&hay.join("sub"), "c.md", words(10, "inner").as_bytes());
    std::os::unix::fs::symlink(hay.join("sub/c.md"), hay.join("b.txt")).unwrap();
    // A dangling link is nothing to read.
    std::os::unix::fs::symlink(hay.join("gone.txt"), hay.join("d.txt")).unwrap();
    let h = rsd_eval::tasks::Haystack::from_path(&hay, &tokenizer()).unwrap();
    let expected = rsd_eval::tasks::Haystack::from_text(
        &format!("{} {}", words(1500, "plain"), words(10, "inner")),
        "",
    );
    assert_eq!(h.sha256(), expected.sha256());
}
