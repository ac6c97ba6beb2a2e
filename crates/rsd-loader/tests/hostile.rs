//! Pipeline and loader-state files written by a stranger (or edited by hand): they must be
//! regular files of bounded size, and a state's counters must be ones a stream can reach. Every
//! answer is an error naming the file (and the field), or a loader that streams — never a panic
//! or a wrapped counter. Property tests (256 cases each) feed random and damaged bytes, and
//! random counters, to the pipeline parser and to the state parser and restore.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proptest::prelude::*;
use rsd_common::safe_fs::FsError;
use rsd_loader::synth::{self, SynthSpec};
use rsd_loader::{
    Batch, Batching, Dataset, Loader, LoaderConfig, LoaderError, LoaderState, Pipeline,
};
use serde_json::{json, Value};

/// Two small synthetic shard directories, written once for all tests of this file.
fn data() -> &'static (tempfile::TempDir, PathBuf, PathBuf) {
    static DATA: OnceLock<(tempfile::TempDir, PathBuf, PathBuf)> = OnceLock::new();
    DATA.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        let spec = |samples, seed| SynthSpec {
            samples,
            seq_len: 8,
            seed,
            ..Default::default()
        };
        synth::write(&a, &spec(10, 1)).unwrap();
        synth::write(&b, &spec(7, 2)).unwrap();
        (tmp, a, b)
    })
}

fn cfg() -> LoaderConfig {
    let (_, a, b) = data();
    LoaderConfig {
        datasets: vec![Dataset::new(a, 1.0), Dataset::new(b, 2.0)],
        seed: 5,
        workers: 0,
        batching: Batching::Samples(2),
        ..LoaderConfig::default()
    }
}

/// The state after `steps` batches of [`cfg`], as JSON.
fn saved_after(steps: usize) -> Value {
    let mut loader = Loader::new(cfg()).unwrap();
    for b in loader.by_ref().take(steps) {
        b.unwrap();
    }
    serde_json::to_value(loader.state()).unwrap()
}

fn write_json(path: &Path, v: &Value) {
    std::fs::write(path, serde_json::to_vec_pretty(v).unwrap()).unwrap();
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// A change to a saved state's JSON.
type Edit = Box<dyn Fn(&mut Value)>;

/// A resumed loader's first few batches: each is a batch or an error, never a panic.
fn drain(mut loader: Loader) -> Vec<Result<Batch, String>> {
    loader
        .by_ref()
        .take(4)
        .map(|b| b.map_err(|e| e.to_string()))
        .collect()
}

#[test]
fn fifos_directories_and_oversized_files_are_refused_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("state.json");
    mkfifo(&fifo);
    // Reading a FIFO with no writer would block forever: refused before it is opened.
    let err = LoaderState::read(&fifo).unwrap_err();
    assert!(
        matches!(err, LoaderError::Fs(FsError::NotRegularFile { .. })),
        "{err}"
    );
    assert!(err.to_string().contains(fifo.to_str().unwrap()), "{err}");
    let err = Pipeline::read(&fifo, tmp.path()).unwrap_err();
    assert!(err.to_string().contains("FIFO"), "{err}");
    let err = Loader::resume_file(cfg(), tmp.path()).err().unwrap();
    assert!(err.to_string().contains("a directory"), "{err}");

    // A sparse file past the bound: refused from its size, nothing read.
    let big = tmp.path().join("big.json");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(LoaderState::MAX_FILE_BYTES + 1).unwrap();
    for err in [
        LoaderState::read(&big).unwrap_err(),
        Pipeline::read(&big, tmp.path()).unwrap_err(),
    ] {
        assert!(
            matches!(err, LoaderError::Fs(FsError::TooLarge { .. })),
            "{err}"
        );
        assert!(err.to_string().contains("big.json"), "{err}");
    }
}

#[test]
fn impossible_counters_are_errors_naming_file_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("state.json");
    let good = saved_after(3);
    assert_eq!(good["cursor"], json!(6));
    let try_state = |edit: &dyn Fn(&mut Value)| -> String {
        let mut v = good.clone();
        edit(&mut v);
        write_json(&path, &v);
        match Loader::resume_file(cfg(), &path) {
            Ok(_) => panic!("resumed from {v}"),
            Err(e) => e.to_string(),
        }
    };
    let cases: Vec<(&str, Edit)> = vec![
        // Draw counts whose sum overflows a u64.
        (
            "field drawn[1]",
            Box::new(|v| v["drawn"] = json!([u64::MAX, 1u64])),
        ),
        ("field cursor", Box::new(|v| v["cursor"] = json!(13))),
        ("field step", Box::new(|v| v["step"] = json!(7))),
        ("field drawn:", Box::new(|v| v["drawn"] = json!([6]))),
        ("field version", Box::new(|v| v["version"] = json!(7))),
        (
            "field sources[0].weight",
            Box::new(|v| v["sources"][0]["weight"] = json!(5.0)),
        ),
        (
            "field sources[1].samples",
            Box::new(|v| v["sources"][1]["samples"] = json!(0)),
        ),
        // Adds up, but the mixture (weights 1/3, 2/3) never draws 6 of 6 from the first source.
        ("field drawn[0]", Box::new(|v| v["drawn"] = json!([6, 0]))),
    ];
    for (field, edit) in cases {
        let text = try_state(&*edit);
        assert!(
            text.contains(path.to_str().unwrap()) && text.contains(field),
            "want {field}: {text}"
        );
    }
    // The file's own checks come first, through `LoaderState::read` alone too.
    let mut v = good.clone();
    v["drawn"] = json!([u64::MAX, 1u64]);
    write_json(&path, &v);
    let err = LoaderState::read(&path).unwrap_err().to_string();
    assert!(
        err.contains("state.json") && err.contains("field drawn[1]"),
        "{err}"
    );

    // A state far into the stream (many epochs) that the mixture can reach resumes; from a start
    // epoch near u64::MAX the same counters are an epoch beyond 2^64, refused naming the field.
    let mut far = good.clone();
    let n = 3_000_000_000u64; // cursor: 1/3 and 2/3 of it are whole numbers
    far["step"] = json!(n / 2);
    far["cursor"] = json!(n);
    far["drawn"] = json!([n / 3, 2 * n / 3]);
    write_json(&path, &far);
    let batches = drain(Loader::resume_file(cfg(), &path).unwrap());
    assert!(batches.iter().all(Result::is_ok), "{batches:?}");
    far["epoch"] = json!(u64::MAX - 5);
    write_json(&path, &far);
    let err = Loader::resume_file(
        LoaderConfig {
            epoch: u64::MAX - 5,
            ..cfg()
        },
        &path,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains("state.json") && err.contains("field drawn[0]") && err.contains("2^64"),
        "{err}"
    );
}

#[test]
fn a_stream_that_reaches_the_last_epoch_ends_with_an_error_not_a_wrap() {
    let (_, a, _) = data();
    let c = LoaderConfig {
        datasets: vec![Dataset::new(a, 1.0)],
        epoch: u64::MAX,
        batching: Batching::Samples(1),
        workers: 0,
        ..LoaderConfig::default()
    };
    let got: Vec<_> = Loader::new(c).unwrap().take(12).collect();
    // Ten samples in epoch u64::MAX, then no epoch after it.
    assert_eq!(got.len(), 11);
    assert!(got[..10].iter().all(Result::is_ok));
    let err = got[10].as_ref().unwrap_err().to_string();
    assert!(err.contains("epoch would pass 2^64"), "{err}");
}

#[test]
fn pipeline_fields_are_checked_naming_file_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("p.json");
    for (body, field) in [
        (json!({"datasets": []}), "field datasets:"),
        (
            json!({"datasets": [{"dir": "a", "weight": 1.0}, {"dir": "b", "weight": -1.0}]}),
            "field datasets[1].weight",
        ),
        (
            json!({"datasets": [{"dir": "", "weight": 1.0}]}),
            "field datasets[0].dir",
        ),
        (
            json!({"datasets": [{"dir": "a", "weight": 1e308}, {"dir": "b", "weight": 1e308}]}),
            "field datasets:",
        ),
    ] {
        write_json(&path, &body);
        let err = Pipeline::read(&path, tmp.path()).unwrap_err().to_string();
        assert!(
            err.contains("p.json") && err.contains(field),
            "want {field}: {err}"
        );
    }
    write_json(
        &path,
        &json!({"name": "mix", "sources": [{"dir": "a", "weight": 0.5}, {"dir": "/abs", "weight": 2}]}),
    );
    let p = Pipeline::read(&path, Path::new("/root")).unwrap();
    assert_eq!(
        p.datasets,
        vec![Dataset::new("/root/a", 0.5), Dataset::new("/abs", 2.0)]
    );
}

#[test]
fn errors_quote_long_values_cut_short() {
    let tmp = tempfile::tempdir().unwrap();
    let long = "x".repeat(300_000);
    let state = tmp.path().join("state.json");
    let pipeline = tmp.path().join("p.json");
    let mut saved = saved_after(2);
    let mut answers = vec![];
    // A value of the wrong type: serde_json quotes it.
    saved["version"] = json!(long);
    write_json(&state, &saved);
    answers.push(LoaderState::read(&state).unwrap_err().to_string());
    // A source directory: quoted when the data does not match it.
    let mut saved = saved_after(2);
    saved["sources"][0]["dir"] = json!(long);
    saved["sources"][0]["samples"] = json!(11);
    write_json(&state, &saved);
    let err = match Loader::resume_file(cfg(), &state) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a state for other data resumes"),
    };
    answers.push(err);
    // A pipeline's weight of the wrong type, and a directory no path can be.
    write_json(
        &pipeline,
        &json!({"datasets": [{"dir": "a", "weight": long}]}),
    );
    answers.push(
        Pipeline::read(&pipeline, tmp.path())
            .unwrap_err()
            .to_string(),
    );
    write_json(
        &pipeline,
        &json!({"datasets": [{"dir": long, "weight": 1.0}]}),
    );
    let err = Pipeline::read(&pipeline, tmp.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("field datasets[0].dir"), "{err}");
    answers.push(err);
    for err in answers {
        assert!(
            err.len() < 1000 && err.contains("xxxx") && err.contains("more characters"),
            "{} characters: {}",
            err.len(),
            &err[..err.len().min(600)]
        );
        assert!(
            err.contains("state.json") || err.contains("p.json"),
            "{err:.600}"
        );
    }
}

/// A damage to a JSON text: overwrite, insert or delete bytes, or cut it short.
#[derive(Debug, Clone)]
enum Damage {
    Set(usize, u8),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Truncate(usize),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Damage::Set(i, b)),
        (
            any::<usize>(),
            prop::sample::select(vec![
                b"9".to_vec(),
                b"-".to_vec(),
                b"99999999999999999999".to_vec(),
                b"1e400".to_vec(),
                b",".to_vec(),
                b"\"".to_vec(),
                b"0".to_vec(),
                b"null".to_vec(),
            ])
        )
            .prop_map(|(i, s)| Damage::Insert(i, s)),
        (any::<usize>(), 1usize..8).prop_map(|(i, n)| Damage::Delete(i, n)),
        any::<usize>().prop_map(Damage::Truncate),
    ]
}

fn apply(bytes: &mut Vec<u8>, d: &Damage) {
    let at = |i: usize, len: usize| if len == 0 { 0 } else { i % len };
    match d {
        Damage::Set(i, b) => {
            let i = at(*i, bytes.len());
            if let Some(x) = bytes.get_mut(i) {
                *x = *b;
            }
        }
        Damage::Insert(i, s) => {
            let i = at(*i, bytes.len() + 1);
            bytes.splice(i..i, s.iter().copied());
        }
        Damage::Delete(i, n) => {
            let i = at(*i, bytes.len());
            let end = (i + n).min(bytes.len());
            bytes.drain(i..end);
        }
        Damage::Truncate(i) => bytes.truncate(at(*i, bytes.len() + 1)),
    }
}

/// The answer to a state file: an error that names it, or a loader whose batches are batches or
/// errors. Returns the batches when it resumed.
fn resume_answer(path: &Path) -> Result<Option<Vec<Result<Batch, String>>>, TestCaseError> {
    match Loader::resume_file(cfg(), path) {
        Ok(loader) => Ok(Some(drain(loader))),
        Err(e) => {
            let text = e.to_string();
            prop_assert!(
                text.contains(path.to_str().unwrap()),
                "the error must name the file: {text}"
            );
            Ok(None)
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random bytes as a state file: an error naming the file, never a panic.
    #[test]
    fn random_bytes_as_a_state_or_pipeline_are_errors(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("s.json");
        std::fs::write(&path, &bytes).unwrap();
        resume_answer(&path)?;
        match Pipeline::read(&path, tmp.path()) {
            Ok(p) => prop_assert!(p.datasets.iter().all(|d| d.weight.is_finite() && d.weight > 0.0)),
            Err(e) => prop_assert!(e.to_string().contains("s.json"), "{e}"),
        }
    }

    /// A saved state, damaged: an error naming the file, or a loader that streams. Undamaged
    /// (a damage that changes nothing), the stream continues exactly where it stopped.
    #[test]
    fn damaged_states_are_errors_or_streams(steps in 0usize..6, damages in prop::collection::vec(damage(), 1..4)) {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("s.json");
        let good = serde_json::to_vec_pretty(&saved_after(steps)).unwrap();
        let mut bytes = good.clone();
        for d in &damages {
            apply(&mut bytes, d);
        }
        std::fs::write(&path, &bytes).unwrap();
        let got = resume_answer(&path)?;
        if bytes == good {
            let whole: Vec<Batch> = Loader::new(cfg()).unwrap().skip(steps).take(4).map(Result::unwrap).collect();
            let got: Vec<Batch> = got.unwrap().into_iter().map(Result::unwrap).collect();
            prop_assert_eq!(got, whole);
        }
    }

    /// Any counters at all in an otherwise valid state: an error naming the file and a field,
    /// or counters the mixture can reach, from which the loader streams without a panic.
    #[test]
    fn random_counters_are_errors_or_reachable(
        step in prop_oneof![any::<u64>(), 0u64..50],
        cursor in prop_oneof![any::<u64>(), 0u64..100],
        drawn in prop::collection::vec(prop_oneof![any::<u64>(), 0u64..100], 0..4),
        epoch in prop_oneof![Just(0u64), any::<u64>()],
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("s.json");
        let mut v = saved_after(1);
        v["step"] = json!(step);
        v["cursor"] = json!(cursor);
        v["drawn"] = json!(drawn);
        v["epoch"] = json!(epoch);
        write_json(&path, &v);
        let c = LoaderConfig { epoch, ..cfg() };
        match Loader::resume_file(c, &path) {
            Ok(loader) => {
                let state = loader.state();
                prop_assert!(state.check().is_ok());
                prop_assert_eq!(state.drawn.iter().sum::<u64>(), cursor);
                drain(loader);
            }
            Err(e) => {
                let text = e.to_string();
                prop_assert!(text.contains("s.json") && text.contains("field "), "{}", text);
            }
        }
    }

    /// Pipelines with any weights and names: an error naming the file and field, or datasets
    /// whose weights are positive, finite and sum to a finite number.
    #[test]
    fn random_pipelines_are_errors_or_usable(
        entries in prop::collection::vec((any::<f64>(), "[a-z./]{0,6}"), 0..5),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("p.json");
        // JSON has no NaN or infinity: those are written as null, and rejected by the parser.
        let body = json!({"datasets": entries.iter().map(|(w, d)| json!({"dir": d, "weight": w})).collect::<Vec<_>>()});
        write_json(&path, &body);
        match Pipeline::read(&path, tmp.path()) {
            Ok(p) => {
                prop_assert!(!p.datasets.is_empty());
                prop_assert!(p.datasets.iter().all(|d| d.weight.is_finite() && d.weight > 0.0));
                prop_assert!(p.datasets.iter().map(|d| d.weight).sum::<f64>().is_finite());
            }
            Err(e) => {
                let text = e.to_string();
                prop_assert!(text.contains("p.json"), "{}", text);
            }
        }
    }
}
