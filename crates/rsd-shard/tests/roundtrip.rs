//! Write shards, read them back, and damage them in the ways disks and users do.

use std::path::Path;

use rsd_shard::*;

fn manifest(
    dir: &Path,
    dtype: TokenDtype,
    seq_len: u64,
    mode: PackMode,
    shards: Vec<ShardInfo>,
) -> Manifest {
    let mut totals = Totals::default();
    for s in &shards {
        totals.samples += s.samples;
        totals.tokens += s.tokens;
        totals.pieces += s.pieces;
    }
    let m = Manifest {
        format: FORMAT_NAME.into(),
        version: FORMAT_VERSION,
        tokenizer: TokenizerInfo {
            name: "test".into(),
            sha256: "0".repeat(64),
            vocab_size: 70_000,
            bos_id: None,
            eos_id: Some(1),
        },
        source_tokenizer: None,
        dtype,
        seq_len,
        mode,
        pad_id: None,
        shards,
        totals,
        sources: vec![],
        loss_mask: None,
        command: vec!["test".into()],
        created_by: "test".into(),
    };
    m.write(dir).unwrap();
    m
}

/// Samples of 8 tokens with assorted piece splits; ids exercise both halves of the u16 range.
fn samples(n: usize) -> Vec<(Vec<u32>, Vec<u32>)> {
    (0..n)
        .map(|i| {
            let tokens: Vec<u32> = (0..8)
                .map(|j| ((i * 7919 + j * 104_729) % 65_000) as u32)
                .collect();
            let pieces = match i % 3 {
                0 => vec![8],
                1 => vec![3, 5],
                _ => vec![1, 2, 5],
            };
            (tokens, pieces)
        })
        .collect()
}

fn write_set(
    dir: &Path,
    dtype: TokenDtype,
    target_bytes: u64,
    data: &[(Vec<u32>, Vec<u32>)],
) -> Vec<ShardInfo> {
    let mut w = ShardSetWriter::new(dir, dtype, target_bytes, 0);
    let mut infos = vec![];
    for (t, p) in data {
        if let Some(info) = w.add_sample(t, p).unwrap() {
            infos.push(info);
        }
    }
    infos.extend(w.close_current().unwrap());
    infos
}

#[test]
fn round_trip_both_dtypes_and_rolling() {
    for dtype in [TokenDtype::Uint16, TokenDtype::Int32] {
        let tmp = tempfile::tempdir().unwrap();
        let data = samples(25);
        // 8 tokens × 2 or 4 bytes; a 40-byte target rolls every 3 (u16) or 2 (i32) samples.
        let infos = write_set(tmp.path(), dtype, 40, &data);
        assert!(
            infos.len() > 5,
            "expected several shards, got {}",
            infos.len()
        );
        manifest(tmp.path(), dtype, 8, PackMode::Fixed, infos);
        let set = ShardSet::open(tmp.path()).unwrap();
        assert_eq!(set.num_samples(), 25);
        for (i, (tokens, pieces)) in data.iter().enumerate() {
            let s = set.sample(i as u64).unwrap();
            assert_eq!(&s.tokens.to_vec(), tokens, "sample {i}");
            assert_eq!(&s.pieces, pieces, "sample {i}");
        }
        assert!(set.sample(25).is_err());
        let report = verify(tmp.path(), VerifyOptions::default()).unwrap();
        assert_eq!((report.samples, report.tokens), (25, 200));
        // No temporary files are left behind.
        let leftovers: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty());
    }
}

/// A directory whose shards carry a loss mask (chat data): written beside the tokens, read
/// back sample by sample, verified, and found when damaged or missing.
#[test]
fn loss_masks_round_trip_and_are_verified() {
    let tmp = tempfile::tempdir().unwrap();
    let data = samples(25);
    let mask_of = |i: usize| -> Vec<u8> {
        (0..8)
            .map(|j| u8::from((i + j).is_multiple_of(3)))
            .collect()
    };
    let mut w = ShardSetWriter::new(tmp.path(), TokenDtype::Uint16, 40, 0).with_loss_mask();
    let mut infos = vec![];
    for (i, (t, p)) in data.iter().enumerate() {
        infos.extend(w.add_masked_sample(t, p, &mask_of(i)).unwrap());
    }
    infos.extend(w.close_current().unwrap());
    assert!(infos.len() > 5);
    let trained: u64 = (0..25)
        .map(|i| mask_of(i).iter().map(|&m| m as u64).sum::<u64>())
        .sum();
    assert_eq!(
        infos
            .iter()
            .map(|s| s.loss_mask.as_ref().unwrap().trained_tokens)
            .sum::<u64>(),
        trained
    );
    let mut m = manifest(
        tmp.path(),
        TokenDtype::Uint16,
        8,
        PackMode::Mixed,
        infos.clone(),
    );
    m.loss_mask = Some(LossMaskInfo {
        train_on: "assistant".into(),
        chat_template: "t.jinja".into(),
        chat_template_sha256: "0".repeat(64),
        trained_tokens: trained,
    });
    m.write(tmp.path()).unwrap();
    let set = ShardSet::open(tmp.path()).unwrap();
    for i in 0..25 {
        let s = set.sample(i as u64).unwrap();
        let (k, _) = set.locate(i as u64).unwrap();
        let shard = &set.shards()[k];
        assert_eq!(
            shard.mask_of(s.bytes.start, s.bytes.end).unwrap(),
            &mask_of(i)[..]
        );
    }
    verify(tmp.path(), VerifyOptions::default()).unwrap();
    // The mask's .idx is the token .idx with uint8 elements (Megatron's code 1, byte pointers).
    let idx = std::fs::read(tmp.path().join("shard-00000-mask.idx")).unwrap();
    let tok_idx = std::fs::read(tmp.path().join("shard-00000.idx")).unwrap();
    assert_eq!((idx[17], tok_idx[17]), (1, 8));
    assert_eq!(idx.len(), tok_idx.len());
    // A mask value other than 0/1, then a missing mask, are named.
    let bin = tmp.path().join("shard-00001-mask.bin");
    let mut bytes = std::fs::read(&bin).unwrap();
    bytes[3] = 7;
    std::fs::write(&bin, &bytes).unwrap();
    let e = verify(
        tmp.path(),
        VerifyOptions {
            checksums: false,
            token_range: true,
        },
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("shard-00001-mask.bin") && e.to_string().contains("mask value 7"),
        "{e}"
    );
    std::fs::remove_file(&bin).unwrap();
    let e = ShardSet::open(tmp.path()).err().unwrap().to_string();
    assert!(e.contains("shard-00001-mask.bin"), "{e}");
    // A shard without its mask and a mask on a writer without one are refused.
    let mut plain = ShardWriter::create(tmp.path(), "plain", TokenDtype::Uint16).unwrap();
    assert!(plain.add_masked_sample(&[1, 2], &[2], &[0, 1]).is_err());
    let mut masked =
        ShardWriter::create_with_mask(tmp.path(), "masked", TokenDtype::Uint16).unwrap();
    assert!(masked.add_sample(&[1, 2], &[2]).is_err());
    assert!(masked.add_masked_sample(&[1, 2], &[2], &[1]).is_err());
    assert!(masked.add_masked_sample(&[1, 2], &[2], &[1, 2]).is_err());
}

#[test]
fn writer_rejects_bad_samples() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = ShardWriter::create(tmp.path(), "x", TokenDtype::Uint16).unwrap();
    assert!(
        w.add_sample(&[1, 2, 3], &[2]).is_err(),
        "pieces must sum to the token count"
    );
    assert!(
        w.add_sample(&[1, 2, 3], &[3, 0]).is_err(),
        "zero-length piece"
    );
    assert!(
        w.add_sample(&[70_000], &[1]).is_err(),
        "id does not fit in uint16"
    );
    drop(w);
    assert!(
        !tmp.path().join("x.bin.tmp").exists(),
        "an unfinished writer removes its temp file"
    );
    assert!(!tmp.path().join("x.bin").exists());
}

fn packed_dir(dtype: TokenDtype) -> (tempfile::TempDir, Vec<ShardInfo>) {
    let tmp = tempfile::tempdir().unwrap();
    let infos = write_set(tmp.path(), dtype, 1 << 20, &samples(10));
    manifest(tmp.path(), dtype, 8, PackMode::Fixed, infos.clone());
    (tmp, infos)
}

fn flip_byte(path: &Path, offset: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[offset as usize] ^= 0x5a;
    std::fs::write(path, bytes).unwrap();
}

fn expect_corrupt(dir: &Path, file: &str, offset: Option<u64>, needle: &str) {
    let err = verify(dir, VerifyOptions::default()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(file), "error should name {file}: {msg}");
    assert!(msg.contains(needle), "error should say {needle:?}: {msg}");
    if let Some(off) = offset {
        match err {
            ShardError::Corrupt { offset: got, .. } => assert_eq!(got, off, "{msg}"),
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }
}

#[test]
fn verify_finds_a_flipped_token_byte_by_checksum() {
    let (tmp, _) = packed_dir(TokenDtype::Uint16);
    flip_byte(&tmp.path().join("shard-00000.bin"), 37);
    expect_corrupt(tmp.path(), "shard-00000.bin", None, "checksum");
}

#[test]
fn verify_finds_truncation_and_header_damage() {
    let (tmp, infos) = packed_dir(TokenDtype::Int32);
    let bin = tmp.path().join("shard-00000.bin");
    let f = std::fs::OpenOptions::new().write(true).open(&bin).unwrap();
    f.set_len(infos[0].bin_bytes - 4).unwrap();
    expect_corrupt(
        tmp.path(),
        "shard-00000.bin",
        Some(infos[0].bin_bytes - 4),
        "manifest says",
    );

    let (tmp, _) = packed_dir(TokenDtype::Int32);
    flip_byte(&tmp.path().join("shard-00000.idx"), 2);
    let err = Shard::open(&tmp.path().join("shard-00000"))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("shard-00000.idx") && err.contains("magic"),
        "{err}"
    );

    let (tmp, _) = packed_dir(TokenDtype::Int32);
    flip_byte(&tmp.path().join("shard-00000.idx"), 17);
    let err = Shard::open(&tmp.path().join("shard-00000"))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("at byte 17") && err.contains("dtype code"),
        "{err}"
    );
}

#[test]
fn verify_without_checksums_still_finds_index_damage() {
    let (tmp, _) = packed_dir(TokenDtype::Uint16);
    // Sequence 1's pointer lives at 34 + 4n + 8; n = 20 pieces for 10 samples of the pattern above.
    let shard = Shard::open(&tmp.path().join("shard-00000")).unwrap();
    let n = shard.num_pieces() as u64;
    drop(shard);
    let ptr_offset = 34 + 4 * n + 8;
    flip_byte(&tmp.path().join("shard-00000.idx"), ptr_offset);
    let opts = VerifyOptions {
        checksums: false,
        token_range: true,
    };
    let err = verify(tmp.path(), opts).unwrap_err();
    match &err {
        ShardError::Corrupt { path, offset, .. } => {
            assert!(path.ends_with("shard-00000.idx"));
            assert_eq!(*offset, ptr_offset, "{err}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn token_ids_outside_the_vocab_are_found_with_their_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let infos = write_set(
        tmp.path(),
        TokenDtype::Int32,
        1 << 20,
        &[(vec![5, 6, 70_001, 7], vec![4])],
    );
    manifest(tmp.path(), TokenDtype::Int32, 4, PackMode::Fixed, infos);
    let err = verify(
        tmp.path(),
        VerifyOptions {
            checksums: true,
            token_range: true,
        },
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("shard-00000.bin: at byte 8") && msg.contains("70001"),
        "{msg}"
    );
}

#[test]
fn missing_manifest_says_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let msg = ShardSet::open(tmp.path()).err().unwrap().to_string();
    assert!(
        msg.contains("index.json") && msg.contains("rsd-data pack"),
        "{msg}"
    );
}

/// `append_tokens` reads what the map holds, appends after what `out` has, maps nothing, refuses
/// a wrong dtype or a misaligned range, and names the file and offset when the `.bin` shrank after
/// it was opened (where a read through the map would die with SIGBUS).
#[test]
fn append_tokens_reads_the_stored_ids_without_mapping_them() {
    for dtype in [TokenDtype::Uint16, TokenDtype::Int32] {
        let tmp = tempfile::tempdir().unwrap();
        let data = samples(12);
        let infos = write_set(tmp.path(), dtype, 1 << 20, &data);
        manifest(tmp.path(), dtype, 8, PackMode::Fixed, infos);
        let set = ShardSet::open(tmp.path()).unwrap();
        let shard = &set.shards()[0];
        let size = dtype.size();
        assert_eq!(shard.num_samples(), data.len());
        for (i, (want, _)) in data.iter().enumerate() {
            let (_, _, lo, hi) = shard.sample_span(i).unwrap();
            // Appended after existing contents, and a sub-range (tokens 2..7).
            match dtype {
                TokenDtype::Uint16 => {
                    let mut out = vec![7u16];
                    shard.append_tokens(lo, hi, &mut out).unwrap();
                    shard
                        .append_tokens(lo + 2 * size, lo + 7 * size, &mut out)
                        .unwrap();
                    let got: Vec<u32> = out.iter().map(|&x| x as u32).collect();
                    assert_eq!(got[0], 7);
                    assert_eq!(&got[1..9], &want[..], "sample {i}");
                    assert_eq!(&got[9..], &want[2..7], "sample {i}");
                    let mut wrong: Vec<i32> = vec![];
                    let e = shard.append_tokens(lo, hi, &mut wrong).unwrap_err();
                    assert!(e.to_string().contains("holds uint16"), "{e}");
                    // Into caller storage: the same ids; a misaligned start is refused.
                    let mut dst = [0u16; 8];
                    shard.read_tokens(lo, &mut dst).unwrap();
                    let got: Vec<u32> = dst.iter().map(|&x| x as u32).collect();
                    assert_eq!(&got, want, "sample {i}");
                    let e = shard.read_tokens(lo + 1, &mut dst[..2]).unwrap_err();
                    assert!(e.to_string().contains("cannot read bytes"), "{e}");
                }
                TokenDtype::Int32 => {
                    let mut out: Vec<i32> = vec![];
                    shard.append_tokens(lo, hi, &mut out).unwrap();
                    let got: Vec<u32> = out.iter().map(|&x| x as u32).collect();
                    assert_eq!(&got, want, "sample {i}");
                    let e = shard.append_tokens(lo + 1, hi, &mut out).unwrap_err();
                    assert!(e.to_string().contains(&format!("bytes {}", lo + 1)), "{e}");
                }
            }
        }
        // Past the end of the file: refused, nothing appended.
        let len = shard.bin_bytes().len();
        let mut out: Vec<i32> = vec![];
        let mut out16: Vec<u16> = vec![];
        let e = match dtype {
            TokenDtype::Uint16 => shard.append_tokens(len - 2, len + 2, &mut out16),
            TokenDtype::Int32 => shard.append_tokens(len - 4, len + 4, &mut out),
        }
        .unwrap_err();
        assert!(e.to_string().contains("past the end"), "{e}");
        assert!(out.is_empty() && out16.is_empty());
        // Nothing of the `.bin` was mapped by the reads (smaps, where there is one).
        let bin = std::fs::canonicalize(shard.bin_path()).unwrap();
        if let Some(kib) = rsd_common::mem::mapped_kib(&bin) {
            assert_eq!(kib, 0, "pread must not map the .bin");
        }
        // The file shrinks while open: the read that reaches past the new end names file and byte.
        let cut = len - 3 * size;
        std::fs::OpenOptions::new()
            .write(true)
            .open(shard.bin_path())
            .unwrap()
            .set_len(cut as u64)
            .unwrap();
        let e = match dtype {
            TokenDtype::Uint16 => shard.append_tokens(len - 8 * size, len, &mut out16),
            TokenDtype::Int32 => shard.append_tokens(len - 8 * size, len, &mut out),
        }
        .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains(shard.bin_path().to_str().unwrap())
                && msg.contains(&format!("at byte {cut}"))
                && msg.contains("truncated"),
            "{msg}"
        );
        assert!(
            out.is_empty() && out16.is_empty(),
            "nothing half-read is kept"
        );
    }
}

#[test]
fn a_manifest_written_before_bad_inputs_were_recorded_still_loads() {
    let tmp = tempfile::tempdir().unwrap();
    manifest(tmp.path(), TokenDtype::Uint16, 8, PackMode::Fixed, vec![]);
    let path = tmp.path().join(MANIFEST_FILE);
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert!(json["totals"]["bad_inputs"].is_array());
    json["totals"].as_object_mut().unwrap().remove("bad_inputs");
    std::fs::write(&path, json.to_string()).unwrap();
    let m = Manifest::read(tmp.path()).unwrap();
    assert!(m.totals.bad_inputs.is_empty());
}
