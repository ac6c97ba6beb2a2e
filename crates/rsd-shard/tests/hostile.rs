//! Shard directories written by a stranger: manifests that name files outside the directory,
//! FIFOs in place of shards, headers that disagree with the manifest, and random damage. The
//! answer is always a clear error (or a correct value), never a panic, a hang or a read elsewhere.

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use proptest::prelude::*;
use rsd_common::safe_fs::FsError;
use rsd_shard::*;

/// A one-shard directory of `n` samples of 8 uint16 tokens; its manifest.
fn write_set(dir: &Path, n: usize) -> Manifest {
    let mut w = ShardWriter::create(dir, "shard-00000", TokenDtype::Uint16).unwrap();
    for i in 0..n {
        let tokens: Vec<u32> = (0..8).map(|j| (i * 8 + j) as u32).collect();
        w.add_sample(&tokens, &[3, 5]).unwrap();
    }
    let info = w.finish().unwrap();
    let totals = Totals {
        samples: info.samples,
        tokens: info.tokens,
        pieces: info.pieces,
        documents: n as u64,
        ..Totals::default()
    };
    let m = Manifest {
        format: FORMAT_NAME.into(),
        version: FORMAT_VERSION,
        tokenizer: TokenizerInfo {
            name: "test".into(),
            sha256: "0".repeat(64),
            vocab_size: 1000,
            bos_id: None,
            eos_id: None,
        },
        source_tokenizer: None,
        dtype: TokenDtype::Uint16,
        seq_len: 8,
        mode: PackMode::Fixed,
        pad_id: None,
        shards: vec![info],
        totals,
        sources: vec![],
        loss_mask: None,
        command: vec![],
        created_by: "test".into(),
    };
    m.write(dir).unwrap();
    m
}

/// Run `f` on another thread and fail the test if it takes longer than `secs` (a FIFO opened
/// for reading would block forever).
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .expect("no answer in time: the read blocked")
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

#[test]
fn a_manifest_prefix_that_leaves_the_directory_is_refused_naming_file_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    // A valid shard pair outside the shard directory: a reader that followed the manifest would
    // open it without complaint.
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    write_set(&outside, 2);
    let before = std::fs::read(outside.join("shard-00000.bin")).unwrap();

    let dir = tmp.path().join("set");
    std::fs::create_dir_all(&dir).unwrap();
    let mut m = write_set(&dir, 2);
    let absolute = outside.join("shard-00000");
    for prefix in ["../outside/shard-00000", absolute.to_str().unwrap()] {
        m.shards[0].prefix = prefix.to_string();
        m.write(&dir).unwrap();
        let errors = [
            ShardSet::open(&dir).err().expect("open must refuse"),
            verify(&dir, VerifyOptions::default()).expect_err("verify must refuse"),
        ];
        for err in errors {
            let text = err.to_string();
            assert!(
                matches!(err, ShardError::File(FsError::UnsafeName(_))),
                "{text}"
            );
            assert!(
                text.contains(&dir.join("index.json").display().to_string())
                    && text.contains("shards[0].prefix")
                    && text.contains(prefix),
                "{text}"
            );
        }
    }
    assert_eq!(
        std::fs::read(outside.join("shard-00000.bin")).unwrap(),
        before
    );

    // A link inside the directory that leads out is refused the same way.
    m.shards[0].prefix = "escape".into();
    m.write(&dir).unwrap();
    std::os::unix::fs::symlink(outside.join("shard-00000.bin"), dir.join("escape.bin")).unwrap();
    std::os::unix::fs::symlink(outside.join("shard-00000.idx"), dir.join("escape.idx")).unwrap();
    let err = ShardSet::open(&dir)
        .err()
        .expect("a link out must be refused");
    assert!(err.to_string().contains("outside the directory"), "{err}");
}

#[test]
fn a_fifo_in_place_of_a_shard_is_a_clear_error_not_a_hang() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    write_set(&dir, 2);
    std::fs::remove_file(dir.join("shard-00000.bin")).unwrap();
    mkfifo(&dir.join("shard-00000.bin"));
    let d = dir.clone();
    let err = within(10, move || ShardSet::open(&d).err().map(|e| e.to_string()))
        .expect("a FIFO must be refused");
    assert!(
        err.contains("FIFO") && err.contains("shard-00000.bin"),
        "{err}"
    );
    let d = dir.clone();
    let err = within(10, move || {
        verify(&d, VerifyOptions::default())
            .err()
            .map(|e| e.to_string())
    })
    .expect("a FIFO must be refused");
    assert!(err.contains("FIFO"), "{err}");
    // The manifest itself as a FIFO.
    std::fs::remove_file(dir.join("index.json")).unwrap();
    mkfifo(&dir.join("index.json"));
    let d = dir.clone();
    let err = within(10, move || Manifest::read(&d).err().map(|e| e.to_string()))
        .expect("a FIFO manifest must be refused");
    assert!(err.contains("FIFO"), "{err}");
}

#[test]
fn verify_compares_the_idx_dtype_with_the_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut m = write_set(dir, 2);
    verify(dir, VerifyOptions::default()).unwrap();
    m.dtype = TokenDtype::Int32;
    m.write(dir).unwrap();
    let err = verify(dir, VerifyOptions::default()).unwrap_err();
    match &err {
        ShardError::Corrupt { path, offset, what } => {
            assert!(path.ends_with("shard-00000.idx"), "{err}");
            assert_eq!(*offset, 17);
            assert!(what.contains("uint16") && what.contains("int32"), "{err}");
        }
        other => panic!("expected a Corrupt error, got {other}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any bytes as an `.idx` header: an error or a header whose sizes match the bytes.
    #[test]
    fn idx_header_parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
        if let Ok(h) = IdxHeader::parse(&bytes, Path::new("x.idx")) {
            prop_assert_eq!(h.file_len(), Some(bytes.len() as u64));
        }
    }

    /// A valid `.idx` with bytes overwritten anywhere (headers and arrays): opening the shard and
    /// reading every sample gives errors or samples inside the `.bin`, never a panic.
    #[test]
    fn damaged_idx_never_panics_the_reader(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        widen in any::<bool>(),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        write_set(dir, 3);
        let idx_path = dir.join("shard-00000.idx");
        let mut idx = std::fs::read(&idx_path).unwrap();
        for (at, byte) in &edits {
            let i = at.index(idx.len());
            // Either a random byte, or 0xff: the largest counts and offsets.
            idx[i] = if widen { 0xff } else { *byte };
        }
        std::fs::write(&idx_path, &idx).unwrap();
        if let Ok(shard) = Shard::open(&dir.join("shard-00000")) {
            for i in 0..shard.num_samples().min(16) {
                if let Ok(s) = shard.sample(i) {
                    prop_assert!(s.bytes.end <= shard.bin_bytes().len());
                }
            }
        }
        let _ = verify(dir, VerifyOptions::default());
    }

    /// Any bytes as a manifest: an error or a manifest, never a panic.
    #[test]
    fn manifest_parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = Manifest::parse(&bytes, Path::new("index.json"));
    }

    /// A valid manifest whose counts, sizes and length are replaced by any values: opening and
    /// verifying answer with an error or a correct value, never a panic (no sum or product of
    /// these values is trusted to fit).
    #[test]
    fn any_manifest_counts_never_panic(
        samples in any::<u64>(),
        pieces in any::<u64>(),
        tokens in any::<u64>(),
        bin_bytes in prop_oneof![any::<u64>(), Just(32u64)],
        idx_bytes in any::<u64>(),
        seq_len in prop_oneof![any::<u64>(), 0u64..16],
        total_samples in any::<u64>(),
        vocab_size in prop_oneof![any::<u64>(), 0u64..64],
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let mut m = write_set(dir, 2);
        let s = &mut m.shards[0];
        (s.samples, s.pieces, s.tokens, s.bin_bytes, s.idx_bytes) =
            (samples, pieces, tokens, bin_bytes, idx_bytes);
        m.seq_len = seq_len;
        m.totals.samples = total_samples;
        m.tokenizer.vocab_size = vocab_size;
        m.write(dir).unwrap();
        if let Ok(set) = ShardSet::open(dir) {
            prop_assert_eq!(set.num_samples(), samples);
        }
        if let Ok(report) = verify(dir, VerifyOptions::default()) {
            prop_assert_eq!(report.samples, total_samples);
        }
    }

    /// A valid manifest with a random shard prefix (from a set that includes traversal, absolute
    /// paths, NUL, backslashes and Windows prefixes): a name that is not a plain relative path
    /// is refused by name, before any file is opened.
    #[test]
    fn any_shard_prefix_is_confined(prefix in prop_oneof![
        "[a-z./\\\\:-]{0,12}",
        Just("..".to_string()),
        Just("/etc/passwd".to_string()),
        Just("a\u{0}b".to_string()),
        Just("C:\\shard".to_string()),
    ]) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let mut m = write_set(dir, 1);
        m.shards[0].prefix = prefix.clone();
        m.write(dir).unwrap();
        let plain = rsd_common::safe_fs::check_relative_name(&prefix).is_ok();
        match ShardSet::open(dir) {
            Ok(set) => prop_assert!(plain && set.num_samples() == 1),
            Err(ShardError::File(FsError::UnsafeName(refused))) => {
                prop_assert_eq!(&refused.named_by.field, "shards[0].prefix");
            }
            Err(_) => prop_assert!(plain, "{prefix:?} must be refused by name"),
        }
    }
}
