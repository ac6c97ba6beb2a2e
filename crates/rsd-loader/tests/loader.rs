//! End-to-end tests of the loader on synthetic shard directories written in the real format.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use rsd_loader::synth::{self, SynthSpec};
use rsd_loader::{
    Batch, BatchLayout, Batching, Dataset, Loader, LoaderConfig, LoaderError, LoaderState,
    Parallel, Positions, Rank, RawTokens, ReadMethod, RowRules, IGNORE_INDEX,
};
use rsd_shard::ShardSet;

fn make(dir: &Path, name: &str, spec: SynthSpec) -> PathBuf {
    let d = dir.join(name);
    synth::write(&d, &spec).expect("write synthetic shards");
    d
}

fn cfg(dirs: &[(&Path, f64)]) -> LoaderConfig {
    LoaderConfig {
        datasets: dirs.iter().map(|(d, w)| Dataset::new(*d, *w)).collect(),
        seed: 42,
        workers: 0,
        ..LoaderConfig::default()
    }
}

fn collect(c: LoaderConfig, n: usize) -> Vec<Batch> {
    Loader::new(c)
        .expect("open")
        .take(n)
        .map(|b| b.expect("batch"))
        .collect()
}

/// (source, global) of every row, in order.
fn ids(batches: &[Batch]) -> Vec<(u32, u64)> {
    batches
        .iter()
        .flat_map(|b| b.samples.iter().map(|s| (s.dataset, s.global)))
        .collect()
}

#[test]
fn one_epoch_covers_every_sample_once_across_dp_ranks() {
    let tmp = tempfile::tempdir().unwrap();
    let d = make(
        tmp.path(),
        "a",
        SynthSpec {
            samples: 103,
            seq_len: 16,
            shard_bytes: 700,
            ..Default::default()
        },
    );
    assert!(
        ShardSet::open(&d).unwrap().shards().len() > 3,
        "want several shards"
    );
    // dp = 1, batch 1: a permutation of all 103 samples, then the stream ends.
    let mut c = cfg(&[(&d, 1.0)]);
    c.epochs = Some(1);
    let all = ids(&collect(c.clone(), usize::MAX));
    assert_eq!(all.len(), 103);
    assert_eq!(all.iter().collect::<HashSet<_>>().len(), 103);
    assert_ne!(
        all.iter().map(|x| x.1).collect::<Vec<_>>(),
        (0..103).collect::<Vec<_>>(),
        "not shuffled"
    );
    // dp = 4, batch 2: disjoint ranks; 12 full global steps of 8 (the partial 13th is dropped).
    let mut seen = HashSet::new();
    for r in 0..4 {
        let mut c = c.clone();
        (c.parallel.dp, c.batching) = (Rank::new(r, 4), Batching::Samples(2));
        let batches = collect(c, usize::MAX);
        assert_eq!(batches.len(), 12);
        for (t, b) in batches.iter().enumerate() {
            assert_eq!(b.step, t as u64);
            // Rank r holds global positions 8t + r and 8t + r + 4 of the dp = 1 stream.
            assert_eq!(
                ids(std::slice::from_ref(b)),
                vec![all[8 * t + r], all[8 * t + r + 4]]
            );
        }
        for id in ids(&batches) {
            assert!(seen.insert(id), "{id:?} seen by two ranks");
        }
    }
    assert_eq!(seen.len(), 96);
}

#[test]
fn threads_and_inline_give_the_same_stream_and_seed_changes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let d = make(
        tmp.path(),
        "a",
        SynthSpec {
            samples: 50,
            seq_len: 32,
            mixed: true,
            ..Default::default()
        },
    );
    let mut c = cfg(&[(&d, 1.0)]);
    c.batching = Batching::Samples(3);
    let inline = collect(c.clone(), 30);
    for workers in [1, 3] {
        let mut t = c.clone();
        (t.workers, t.prefetch) = (workers, 5);
        assert_eq!(collect(t, 30), inline, "workers={workers}");
    }
    // Recycled batches are refilled from scratch: the stream is unchanged.
    for workers in [0, 2] {
        let mut t = c.clone();
        t.workers = workers;
        let mut l = Loader::new(t).unwrap();
        let mut got = vec![];
        for _ in 0..30 {
            let b = l.next().unwrap().unwrap();
            got.push(b.clone());
            l.recycle(b);
        }
        assert_eq!(got, inline, "recycling, workers={workers}");
    }
    c.seed = 43;
    assert_ne!(ids(&collect(c, 30)), ids(&inline));
}

#[test]
fn batch_contents_match_the_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = SynthSpec {
        samples: 20,
        seq_len: 40,
        mixed: true,
        ..Default::default()
    };
    let d = make(tmp.path(), "a", spec.clone());
    let set = ShardSet::open(&d).unwrap();
    let mut c = cfg(&[(&d, 1.0)]);
    c.batching = Batching::Samples(2);
    for b in collect(c, 5) {
        assert_eq!(b.row_offsets.len(), 3);
        let mut docs = b.doc_offsets.iter().peekable();
        docs.next();
        for (row, id) in b.samples.iter().enumerate() {
            let want = set.sample(id.global).unwrap();
            let (lo, hi) = (b.row_offsets[row] as usize, b.row_offsets[row + 1] as usize);
            let toks: Vec<u32> = b.tokens[lo..hi].iter().map(|&t| t as u32).collect();
            assert_eq!(toks, want.tokens.to_vec());
            let (len, pieces) = synth::shape(&spec, id.global);
            assert_eq!((hi - lo, &pieces), (len as usize, &want.pieces));
            // Mixed shards: positions restart per document, document-final labels are ignored.
            let mut start = 0usize;
            for &p in &pieces {
                let end = start + p as usize;
                for j in start..end {
                    assert_eq!(b.position_ids[lo + j], (j - start) as i32);
                    let want_label = if j + 1 == end {
                        IGNORE_INDEX
                    } else {
                        toks[j + 1] as i32
                    };
                    assert_eq!(b.labels[lo + j], want_label, "row {row} pos {j}");
                }
                assert_eq!(*docs.next().unwrap() as usize, lo + end);
                start = end;
            }
        }
        let pieces: usize = b
            .samples
            .iter()
            .map(|id| synth::shape(&spec, id.global).1.len())
            .sum();
        assert_eq!(b.num_label_tokens, b.num_tokens - pieces as u64);
    }
    // Fixed shards: row positions, only the row's last label ignored.
    let f = make(
        tmp.path(),
        "f",
        SynthSpec {
            samples: 8,
            seq_len: 24,
            ..Default::default()
        },
    );
    let b = collect(cfg(&[(&f, 1.0)]), 1).remove(0);
    assert_eq!(b.position_ids, (0..24).collect::<Vec<i32>>());
    assert_eq!(&b.labels[..23], &b.tokens[1..]);
    assert_eq!(b.labels[23], IGNORE_INDEX);
    assert_eq!(b.num_label_tokens, 23);
}

#[test]
fn context_parallel_ranks_hold_zigzag_chunks_of_the_full_row() {
    let tmp = tempfile::tempdir().unwrap();
    let d = make(
        tmp.path(),
        "m",
        SynthSpec {
            samples: 30,
            seq_len: 50,
            mixed: true,
            ..Default::default()
        },
    );
    let mut c = cfg(&[(&d, 1.0)]);
    c.batching = Batching::Samples(2);
    c.positions = Positions::Row;
    let full = collect(c.clone(), 4);
    for p in [2usize, 3] {
        let ranks: Vec<Vec<Batch>> = (0..p)
            .map(|r| {
                let mut c = c.clone();
                c.parallel.cp = Rank::new(r, p);
                collect(c, 4)
            })
            .collect();
        for (t, whole) in full.iter().enumerate() {
            for row in 0..whole.rows() {
                let (lo, hi) = (
                    whole.row_offsets[row] as usize,
                    whole.row_offsets[row + 1] as usize,
                );
                let len = hi - lo;
                let padded = len.div_ceil(2 * p) * 2 * p;
                let chunk = padded / (2 * p);
                // Rebuild the padded row from every rank's two chunks.
                let mut toks = vec![i32::MIN; padded];
                let mut labels = vec![i32::MIN; padded];
                let mut pos = vec![i32::MIN; padded];
                for (r, rb) in ranks.iter().enumerate() {
                    let b = &rb[t];
                    assert_eq!(
                        b.samples, whole.samples,
                        "CP ranks must see the same samples"
                    );
                    let (llo, lhi) = (b.row_offsets[row] as usize, b.row_offsets[row + 1] as usize);
                    assert_eq!(lhi - llo, 2 * chunk);
                    let base = b.full_row_offsets[row] as usize;
                    let [a0, a1] = b.chunks[2 * row];
                    let [z0, z1] = b.chunks[2 * row + 1];
                    assert_eq!(
                        (a0 as usize - base, z0 as usize - base),
                        (r * chunk, (2 * p - 1 - r) * chunk)
                    );
                    assert_eq!((a1 - a0, z1 - z0), (chunk as u32, chunk as u32));
                    for (k, j) in (a0..a1).chain(z0..z1).enumerate() {
                        let j = j as usize - base;
                        toks[j] = b.tokens[llo + k];
                        labels[j] = b.labels[llo + k];
                        pos[j] = b.position_ids[llo + k];
                    }
                }
                assert_eq!(&toks[..len], &whole.tokens[lo..hi]);
                assert_eq!(
                    &labels[..len],
                    &whole.labels[lo..hi],
                    "labels are shifted before slicing"
                );
                assert_eq!(&pos[..len], &whole.position_ids[lo..hi]);
                assert!(labels[len..].iter().all(|&l| l == IGNORE_INDEX));
                assert_eq!(
                    pos[len..].to_vec(),
                    (len as i32..padded as i32).collect::<Vec<_>>()
                );
            }
            assert_eq!(ranks[0][t].num_label_tokens, whole.num_label_tokens);
        }
    }
}

#[test]
fn resume_continues_the_exact_stream_with_threads() {
    let tmp = tempfile::tempdir().unwrap();
    let a = make(
        tmp.path(),
        "a",
        SynthSpec {
            samples: 17,
            seq_len: 16,
            ..Default::default()
        },
    );
    let b = make(
        tmp.path(),
        "b",
        SynthSpec {
            samples: 29,
            seq_len: 16,
            seed: 9,
            ..Default::default()
        },
    );
    let mut c = cfg(&[(&a, 1.0), (&b, 2.0)]);
    (c.workers, c.prefetch, c.batching) = (2, 4, Batching::Samples(3));
    let whole = collect(c.clone(), 40); // several epochs of both sources
    let mut first = Loader::new(c.clone()).unwrap();
    let head: Vec<Batch> = first.by_ref().take(13).map(|b| b.unwrap()).collect();
    let state = first.state();
    drop(first);
    assert_eq!(state.step, 13);
    // Through JSON, as a checkpoint would store it.
    let state: LoaderState = serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    let tail: Vec<Batch> = Loader::resume(c, &state)
        .unwrap()
        .take(27)
        .map(|b| b.unwrap())
        .collect();
    assert_eq!([head, tail].concat(), whole);
}

#[test]
fn elastic_resume_on_another_dp_size_continues_the_global_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let d = make(
        tmp.path(),
        "a",
        SynthSpec {
            samples: 64,
            seq_len: 8,
            ..Default::default()
        },
    );
    let base = cfg(&[(&d, 1.0)]);
    let global = ids(&collect(base.clone(), 200)); // dp = 1, batch 1: the global order
                                                   // Two ranks, batch 2, three steps: 12 global positions.
    let mut states = vec![];
    for r in 0..2 {
        let mut c = base.clone();
        (c.parallel.dp, c.batching) = (Rank::new(r, 2), Batching::Samples(2));
        let mut l = Loader::new(c).unwrap();
        l.by_ref().take(3).for_each(|b| drop(b.unwrap()));
        states.push(l.state());
    }
    assert_eq!(states[0], states[1], "all ranks save the same state");
    assert_eq!(states[0].cursor, 12);
    // Resume on three ranks with batch 1: step t gives rank r global position 12 + 3t + r.
    for r in 0..3 {
        let mut c = base.clone();
        (c.parallel.dp, c.workers) = (Rank::new(r, 3), 2);
        let got = ids(&Loader::resume(c, &states[0])
            .unwrap()
            .take(20)
            .map(|b| b.unwrap())
            .collect::<Vec<_>>());
        let want: Vec<_> = (0..20).map(|t| global[12 + 3 * t + r]).collect();
        assert_eq!(got, want, "rank {r}");
    }
}

#[test]
fn mixture_follows_the_weights_and_each_source_cycles_its_epochs() {
    let tmp = tempfile::tempdir().unwrap();
    let a = make(
        tmp.path(),
        "a",
        SynthSpec {
            samples: 10,
            seq_len: 8,
            ..Default::default()
        },
    );
    let b = make(
        tmp.path(),
        "b",
        SynthSpec {
            samples: 37,
            seq_len: 8,
            seed: 1,
            ..Default::default()
        },
    );
    let got = collect(cfg(&[(&a, 0.3), (&b, 0.7)]), 1000);
    let rows: Vec<_> = got.iter().flat_map(|b| b.samples.clone()).collect();
    for n in [10usize, 100, 1000] {
        let from_a = rows[..n].iter().filter(|s| s.dataset == 0).count() as f64;
        assert!(
            (from_a - 0.3 * n as f64).abs() <= 1.0,
            "{from_a} of {n} from a"
        );
    }
    // Source a (10 samples) has gone through 30 epochs: every epoch is a permutation.
    let a_rows: Vec<_> = rows.iter().filter(|s| s.dataset == 0).collect();
    for (e, chunk) in a_rows.chunks(10).enumerate() {
        assert!(chunk.iter().all(|s| s.epoch == e as u64));
        assert_eq!(
            chunk.iter().map(|s| s.global).collect::<HashSet<_>>().len(),
            10
        );
    }
    assert_ne!(
        a_rows[..10].iter().map(|s| s.global).collect::<Vec<_>>(),
        a_rows[10..20].iter().map(|s| s.global).collect::<Vec<_>>()
    );
}

#[test]
fn token_budget_batches_agree_across_ranks() {
    let tmp = tempfile::tempdir().unwrap();
    let d = make(
        tmp.path(),
        "m",
        SynthSpec {
            samples: 300,
            seq_len: 64,
            mixed: true,
            ..Default::default()
        },
    );
    let budget = 200;
    let mut c = cfg(&[(&d, 1.0)]);
    (c.parallel.dp.size, c.batching, c.epochs) = (3, Batching::Tokens(budget), Some(1));
    let per_rank: Vec<Vec<Batch>> = (0..3)
        .map(|r| {
            let mut c = c.clone();
            c.parallel.dp.rank = r;
            collect(c, usize::MAX)
        })
        .collect();
    let steps = per_rank[0].len();
    assert!(steps > 10);
    let mut seen = HashSet::new();
    for t in 0..steps {
        let rows = per_rank[0][t].rows();
        for rank in &per_rank {
            let b = &rank[t];
            assert_eq!(b.rows(), rows, "ranks must agree on rows per step");
            assert!(b.tokens.len() <= budget);
            seen.extend(ids(std::slice::from_ref(b)));
        }
    }
    let covered = seen.len();
    assert!(
        covered > 300 - 3 * 4,
        "only {covered} of 300 samples covered"
    );
}

#[test]
fn refuses_mismatched_sources_and_foreign_states() {
    let tmp = tempfile::tempdir().unwrap();
    let a = make(
        tmp.path(),
        "a",
        SynthSpec {
            samples: 10,
            seq_len: 8,
            ..Default::default()
        },
    );
    let b = make(
        tmp.path(),
        "b",
        SynthSpec {
            samples: 10,
            seq_len: 16,
            ..Default::default()
        },
    );
    let t = make(
        tmp.path(),
        "t",
        SynthSpec {
            samples: 10,
            seq_len: 8,
            tokenizer: "other".into(),
            ..Default::default()
        },
    );
    for (other, what) in [
        (&b, "packing lengths 8 vs 16"),
        (&t, "different tokenizers"),
    ] {
        let err = Loader::new(cfg(&[(&a, 1.0), (other, 1.0)]))
            .err()
            .expect("must refuse");
        let msg = err.to_string();
        assert!(matches!(err, LoaderError::Mismatch { .. }), "{msg}");
        assert!(
            msg.contains(what)
                && msg.contains(a.to_str().unwrap())
                && msg.contains(other.to_str().unwrap()),
            "{msg}"
        );
    }
    let mut l = Loader::new(cfg(&[(&a, 1.0)])).unwrap();
    l.next().unwrap().unwrap();
    let state = l.state();
    let mut other_seed = cfg(&[(&a, 1.0)]);
    other_seed.seed = 1;
    assert!(matches!(
        Loader::resume(other_seed, &state),
        Err(LoaderError::Resume(_))
    ));
    let mut future = state.clone();
    future.version = 99;
    let err = Loader::resume(cfg(&[(&a, 1.0)]), &future)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("state version 99"), "{err}");
    let mut bad = cfg(&[(&a, 1.0)]);
    bad.parallel.dp.rank = 2;
    assert!(matches!(Loader::new(bad), Err(LoaderError::Config(_))));
}

/// Truncate the first shard's `.bin` of `dir` to `keep(its length)` bytes.
fn cut_first_bin(dir: &Path, keep: impl FnOnce(u64) -> u64) {
    let bin = dir.join("shard-00000.bin");
    let len = std::fs::metadata(&bin).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&bin)
        .unwrap()
        .set_len(keep(len))
        .unwrap();
}

#[test]
fn damaged_shards_give_errors_naming_the_file_and_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = SynthSpec {
        samples: 40,
        seq_len: 16,
        ..Default::default()
    };
    // Truncated .bin: refused at open.
    let d = make(tmp.path(), "trunc", spec.clone());
    cut_first_bin(&d, |len| len - 2);
    let msg = Loader::new(cfg(&[(&d, 1.0)])).err().unwrap().to_string();
    assert!(
        msg.contains("shard-00000.bin") && msg.contains("byte"),
        "{msg}"
    );

    // Flipped token byte: only checksum verification sees it.
    let d = make(tmp.path(), "flip", spec.clone());
    let bin = d.join("shard-00000.bin");
    let mut bytes = std::fs::read(&bin).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&bin, &bytes).unwrap();
    assert!(Loader::new(cfg(&[(&d, 1.0)])).is_ok());
    let mut c = cfg(&[(&d, 1.0)]);
    c.verify = true;
    let msg = Loader::new(c).err().unwrap().to_string();
    assert!(
        msg.contains("shard-00000.bin") && msg.contains("checksum"),
        "{msg}"
    );

    // A damaged length in the middle of the .idx: found when that sample is read, by a worker
    // thread, and delivered to the consumer as an error; then the stream ends (no hang, no panic).
    let d = make(tmp.path(), "idx", spec.clone());
    let idx = d.join("shard-00000.idx");
    let mut bytes = std::fs::read(&idx).unwrap();
    let seq = 20usize; // a sequence (document piece) in the middle of the first shard
    let n = u64::from_le_bytes(bytes[18..26].try_into().unwrap()) as usize;
    assert!(n > seq);
    bytes[34 + 4 * seq..34 + 4 * seq + 4].copy_from_slice(&(-5i32).to_le_bytes());
    std::fs::write(&idx, &bytes).unwrap();
    let mut c = cfg(&[(&d, 1.0)]);
    (c.workers, c.shuffle) = (2, false);
    let results: Vec<_> = Loader::new(c).unwrap().collect();
    let err = results
        .last()
        .unwrap()
        .as_ref()
        .expect_err("the stream ends with the error")
        .to_string();
    assert!(
        err.contains("shard-00000.idx") && err.contains("at byte"),
        "{err}"
    );
    assert!(results[..results.len() - 1].iter().all(|r| r.is_ok()));

    // The .bin shrinks after the loader opened it: with `pread` (the default) the read of a sample
    // past the new end is an error naming the file and byte, in both layouts, inline and threaded
    // (a read through the map would be killed by SIGBUS instead).
    for (layout, workers) in [(BatchLayout::Full, 0), (BatchLayout::Compact, 2)] {
        let d = make(tmp.path(), &format!("shrunk-{workers}"), spec.clone());
        let mut c = cfg(&[(&d, 1.0)]);
        (c.layout, c.workers, c.shuffle, c.prefetch) = (layout, workers, false, 1);
        let mut loader = Loader::new(c).unwrap();
        cut_first_bin(&d, |len| len / 2);
        let err = loader
            .by_ref()
            .find_map(|r| r.err())
            .expect("a read past the new end fails")
            .to_string();
        assert!(
            err.contains("shard-00000.bin") && err.contains("at byte") && err.contains("truncated"),
            "{err}"
        );
        assert!(loader.next().is_none(), "the stream ends after the error");
    }
}

#[test]
fn dropping_a_loader_with_full_channels_stops_its_threads() {
    let tmp = tempfile::tempdir().unwrap();
    let d = make(
        tmp.path(),
        "a",
        SynthSpec {
            samples: 64,
            seq_len: 64,
            ..Default::default()
        },
    );
    for _ in 0..20 {
        let mut c = cfg(&[(&d, 1.0)]);
        (c.workers, c.prefetch) = (3, 2);
        let mut l = Loader::new(c).unwrap();
        l.next().unwrap().unwrap();
        // Gives the workers time to block on full channels. Not an event the test waits for: on a
        // loaded machine a round may drop a loader whose workers are still reading, which must
        // join too; the outcome never depends on which.
        std::thread::sleep(std::time::Duration::from_millis(2));
        drop(l); // joins; a leak or deadlock would hang this test
    }
}

/// `--tail pad` (fixed mode) pads the set's last sample; those pad tokens get no targets and do
/// not count as tokens, and the last real token does not predict a pad. Other rows are untouched.
#[test]
fn tail_padding_of_the_last_sample_has_no_labels() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = SynthSpec {
        samples: 7,
        seq_len: 16,
        ..Default::default()
    };
    let d = make(tmp.path(), "padded", spec);
    // Mark the last 5 tokens of the last sample as the pack's tail padding, as `rsd-data pack
    // --tail pad` records it in the manifest.
    let path = d.join("index.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    m["totals"]["padding_tokens"] = 5.into();
    m["pad_id"] = 0.into();
    std::fs::write(&path, serde_json::to_string(&m).unwrap()).unwrap();

    let batches = collect(cfg(&[(&d, 1.0)]), 7);
    let mut seen_last = false;
    for b in &batches {
        let (s, t, l) = (&b.samples[0], &b.tokens, &b.labels);
        assert_eq!(t.len(), 16);
        let real = if s.global == 6 { 11 } else { 16 };
        for j in 0..16 {
            let want = if j + 1 < real { t[j + 1] } else { IGNORE_INDEX };
            assert_eq!(l[j], want, "sample {} position {j}", s.global);
        }
        assert_eq!(b.num_tokens, real as u64);
        assert_eq!(b.num_label_tokens, real as u64 - 1);
        seen_last |= s.global == 6;
    }
    assert!(seen_last, "one epoch includes the padded sample");
}

/// Mark the last `n` tokens of the set's last sample as the pack's `--tail pad` padding, as
/// `rsd-data pack` records it in the manifest, and set the pad id.
fn set_tail_padding(dir: &Path, n: u64, pad_id: u64) {
    let path = dir.join("index.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    m["totals"]["padding_tokens"] = n.into();
    m["pad_id"] = pad_id.into();
    std::fs::write(&path, serde_json::to_string(&m).unwrap()).unwrap();
}

/// The stored ids of a batch's rows, widened, from the shards themselves.
fn stored_row(set: &ShardSet, s: &rsd_loader::SampleId) -> (Vec<i32>, bool) {
    let sample = set.shards()[s.shard as usize]
        .sample(s.index as usize)
        .unwrap();
    let wide = matches!(sample.tokens, rsd_shard::Tokens::I32(_));
    (
        sample
            .tokens
            .to_vec()
            .into_iter()
            .map(|x| x as i32)
            .collect(),
        wide,
    )
}

/// The compact layout hands over the ids as stored plus the row facts; `materialize` must
/// reproduce the full layout exactly — fixed and mixed shards, with and without CP (every rank),
/// DP ranks, shuffled and sequential, sample and token batching, with the pack's tail padding —
/// and every other field must equal the full layout's. Both read methods give identical batches in
/// both layouts (`pread` reads each CP chunk with the id after it; the map path slices the row).
#[test]
fn compact_layout_materialises_to_the_full_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let fixed = make(
        tmp.path(),
        "fixed",
        SynthSpec {
            samples: 13,
            seq_len: 23,
            ..Default::default()
        },
    );
    set_tail_padding(&fixed, 4, 7);
    let mixed = make(
        tmp.path(),
        "mixed",
        SynthSpec {
            samples: 17,
            seq_len: 40,
            mixed: true,
            vocab: 100_000, // int32 storage
            ..Default::default()
        },
    );
    set_tail_padding(&mixed, 3, 9);
    let mut compared = 0;
    for dir in [&fixed, &mixed] {
        let set = ShardSet::open(dir).unwrap();
        let batchings = [Batching::Samples(3), Batching::Tokens(100)];
        for batching in batchings {
            for cp in [1usize, 2, 3] {
                for cp_rank in 0..cp {
                    for dp_rank in 0..2 {
                        for shuffle in [true, false] {
                            let base = LoaderConfig {
                                parallel: Parallel {
                                    dp: Rank::new(dp_rank, 2),
                                    cp: Rank::new(cp_rank, cp),
                                },
                                shuffle,
                                batching,
                                ..cfg(&[(dir.as_path(), 1.0)])
                            };
                            let what = format!(
                                "{} {batching:?} cp {cp_rank}/{cp} dp {dp_rank}/2 shuffle {shuffle}",
                                dir.display()
                            );
                            let run = |layout, read| {
                                collect(
                                    LoaderConfig {
                                        layout,
                                        read,
                                        ..base.clone()
                                    },
                                    6,
                                )
                            };
                            let full = run(BatchLayout::Full, ReadMethod::Map);
                            let compact = run(BatchLayout::Compact, ReadMethod::Pread);
                            assert_eq!(full.len(), compact.len(), "{what}");
                            for (f, c) in full.iter().zip(&compact) {
                                compare_layouts(f, c, &set, &what);
                                compared += 1;
                            }
                            let full_pread = run(BatchLayout::Full, ReadMethod::Pread);
                            assert_eq!(full_pread, full, "{what}: full layout, pread vs map");
                            let compact_map = run(BatchLayout::Compact, ReadMethod::Map);
                            assert_eq!(compact_map, compact, "{what}: compact, map vs pread");
                        }
                    }
                }
            }
        }
    }
    assert!(compared > 300, "{compared} batches compared");
}

fn compare_layouts(f: &Batch, c: &Batch, set: &ShardSet, what: &str) {
    assert_eq!(f.layout, BatchLayout::Full);
    assert_eq!(c.layout, BatchLayout::Compact);
    assert!(f.raw_tokens.is_empty() && f.next_ids.is_empty(), "{what}");
    assert!(!f.tokens.is_empty(), "{what}");
    assert!(
        c.tokens.is_empty() && c.labels.is_empty() && c.position_ids.is_empty(),
        "{what}"
    );
    // Every other field is the full layout's.
    assert_eq!(c.step, f.step, "{what}");
    assert_eq!(c.row_offsets, f.row_offsets, "{what}");
    assert_eq!(c.doc_offsets, f.doc_offsets, "{what}");
    assert_eq!(c.full_row_offsets, f.full_row_offsets, "{what}");
    assert_eq!(c.chunks, f.chunks, "{what}");
    assert_eq!(c.samples, f.samples, "{what}");
    assert_eq!(c.row_meta, f.row_meta, "{what}");
    assert_eq!(
        (c.num_tokens, c.num_label_tokens),
        (f.num_tokens, f.num_label_tokens),
        "{what}"
    );
    // Materialised, it is the full layout, array for array (into dirty buffers: they are cleared).
    let (mut t, mut l, mut p) = (vec![1, 2], vec![3], vec![4]);
    c.materialize(&mut t, &mut l, &mut p);
    assert_eq!(t, f.tokens, "{what}: tokens");
    assert_eq!(l, f.labels, "{what}: labels");
    assert_eq!(p, f.position_ids, "{what}: positions");
    // A full batch materialises to itself.
    f.materialize(&mut t, &mut l, &mut p);
    assert_eq!((&t, &l, &p), (&f.tokens, &f.labels, &f.position_ids));
    // The raw ids are the stored ids of each chunk in the shards' dtype, then CP padding (pad id);
    // `next_ids` is the id after each chunk while it is real, else IGNORE_INDEX.
    assert_eq!(c.raw_tokens.len(), f.tokens.len(), "{what}");
    assert_eq!(c.next_ids.len(), c.chunks.len(), "{what}");
    let per_row = c.chunks.len() / c.rows();
    let mut i = 0;
    for (r, s) in c.samples.iter().enumerate() {
        let (stored, wide) = stored_row(set, s);
        let m = c.row_meta[r];
        assert_eq!(m.len as usize, stored.len(), "{what}");
        let base = c.full_row_offsets[r] as usize;
        for k in r * per_row..(r + 1) * per_row {
            let [lo, hi] = c.chunks[k];
            let (lo, hi) = (lo as usize - base, hi as usize - base);
            for j in lo..hi {
                let want = stored.get(j).copied().unwrap_or(m.pad_id);
                assert_eq!(c.raw_tokens.get(i), want, "{what}: row {r} position {j}");
                i += 1;
            }
            let real_end = stored.len() - m.tail_pad as usize;
            let next = if hi < real_end {
                stored[hi]
            } else {
                IGNORE_INDEX
            };
            assert_eq!(c.next_ids[k], next, "{what}: chunk {k}");
        }
        match &c.raw_tokens {
            RawTokens::U16(_) => assert!(!wide, "{what}"),
            RawTokens::I32(_) => assert!(wide, "{what}"),
        }
    }
    full_rows_follow_the_row_rules(f, set, what);
}

/// Each chunk the full layout holds is that slice of the row [`RowRules`] defines from the stored
/// sample (its pieces as document boundaries, the row facts in `row_meta`), CP padding included.
fn full_rows_follow_the_row_rules(f: &Batch, set: &ShardSet, what: &str) {
    let per_row = f.chunks.len() / f.rows();
    let mut i = 0;
    for (r, s) in f.samples.iter().enumerate() {
        let m = f.row_meta[r];
        let sample = set.shards()[s.shard as usize]
            .sample(s.index as usize)
            .unwrap();
        let mut bounds = vec![0usize];
        for &p in &sample.pieces {
            bounds.push(bounds.last().unwrap() + p as usize);
        }
        let rules = RowRules {
            real_len: (m.len - m.tail_pad) as usize,
            doc_bounds: Some(&bounds),
            mask_doc_boundaries: m.mask_doc_boundaries,
            doc_positions: m.doc_positions,
            trained: None,
        };
        let (mut tokens, _) = stored_row(set, s);
        let padded = (m.len + m.cp_pad) as usize;
        tokens.resize(padded, m.pad_id);
        let (labels, positions) = (rules.labels(&tokens), rules.positions(padded));
        let base = f.full_row_offsets[r] as usize;
        for k in r * per_row..(r + 1) * per_row {
            let [lo, hi] = f.chunks[k];
            for j in lo as usize - base..hi as usize - base {
                let got = (f.tokens[i], f.labels[i], f.position_ids[i] as i64);
                let want = (tokens[j], labels[j], positions[j]);
                assert_eq!(got, want, "{what}: row {r} position {j}");
                i += 1;
            }
        }
    }
    assert_eq!(i, f.tokens.len(), "{what}");
}

/// Without CP, a compact row is the sample's stored ids, slice for slice (a memcpy of the map).
#[test]
fn compact_rows_are_the_stored_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, vocab, mixed) in [("u16", 50_000, false), ("i32", 100_000, true)] {
        let d = make(
            tmp.path(),
            name,
            SynthSpec {
                samples: 9,
                seq_len: 64,
                vocab,
                mixed,
                ..Default::default()
            },
        );
        let set = ShardSet::open(&d).unwrap();
        let c = LoaderConfig {
            layout: BatchLayout::Compact,
            batching: Batching::Samples(2),
            ..cfg(&[(d.as_path(), 1.0)])
        };
        for b in collect(c, 4) {
            for (r, s) in b.samples.iter().enumerate() {
                let (a, z) = (b.row_offsets[r] as usize, b.row_offsets[r + 1] as usize);
                let stored = set.shards()[s.shard as usize]
                    .sample(s.index as usize)
                    .unwrap()
                    .tokens;
                match (&b.raw_tokens, stored) {
                    (RawTokens::U16(raw), rsd_shard::Tokens::U16(t)) => assert_eq!(&raw[a..z], t),
                    (RawTokens::I32(raw), rsd_shard::Tokens::I32(t)) => assert_eq!(&raw[a..z], t),
                    other => panic!("{name}: dtype differs from the shards: {other:?}"),
                }
            }
        }
    }
}

/// `recycle` works for compact batches: the stream is unchanged (inline and threaded), and inline
/// the next batch is assembled into the returned batch's allocation (no fresh memory per batch).
#[test]
fn compact_batches_recycle_without_new_allocations() {
    let tmp = tempfile::tempdir().unwrap();
    let d = make(
        tmp.path(),
        "a",
        SynthSpec {
            samples: 40,
            seq_len: 96,
            ..Default::default()
        },
    );
    let mut c = cfg(&[(&d, 1.0)]);
    (c.layout, c.batching, c.parallel.cp) =
        (BatchLayout::Compact, Batching::Samples(2), Rank::new(1, 2));
    let plain = collect(c.clone(), 25);
    let ptr = |b: &Batch| match &b.raw_tokens {
        RawTokens::U16(v) => (v.as_ptr() as usize, v.capacity()),
        RawTokens::I32(v) => (v.as_ptr() as usize, v.capacity()),
    };
    for workers in [0, 2] {
        let mut t = c.clone();
        t.workers = workers;
        let mut l = Loader::new(t).unwrap();
        let mut got = vec![];
        let mut last = None;
        for _ in 0..25 {
            let b = l.next().unwrap().unwrap();
            // The ids' storage starts on 64 bytes (see `IdBuf`): rows that start on a page of the
            // file are copied by the kernel at full speed.
            assert_eq!(ptr(&b).0 % 64, 0, "raw_tokens aligned to 64 bytes");
            if workers == 0 {
                if let Some(prev) = last {
                    assert_eq!(ptr(&b), prev, "the recycled allocation is reused");
                }
                last = Some(ptr(&b));
            }
            got.push(b.clone());
            l.recycle(b);
        }
        assert_eq!(got, plain, "recycling, workers={workers}");
    }
}

/// A config serialized before `layout` and `read` existed still loads: full layout, pread.
#[test]
fn configs_serialized_without_a_layout_load_as_full() {
    let mut v = serde_json::to_value(LoaderConfig {
        read: ReadMethod::Map,
        ..LoaderConfig::default()
    })
    .unwrap();
    assert_eq!(v["read"], "map");
    for field in ["layout", "read", "prefetch_bytes"] {
        v.as_object_mut().unwrap().remove(field);
    }
    let c: LoaderConfig = serde_json::from_value(v).unwrap();
    assert_eq!(c.layout, BatchLayout::Full);
    assert_eq!(c.read, ReadMethod::Pread);
    assert_eq!(c.prefetch_bytes, 8 << 20);
    let v = serde_json::to_value(LoaderConfig {
        layout: BatchLayout::Compact,
        ..LoaderConfig::default()
    })
    .unwrap();
    assert_eq!(v["layout"], "compact");
}

/// The prefetch depth covers `prefetch_bytes` of this rank's largest batches, never less than
/// `prefetch` batches, and the stream does not depend on it.
#[test]
fn prefetch_depth_covers_the_byte_floor() {
    let c = LoaderConfig::default(); // 4 batches, 8 MiB, full layout, one row per batch
                                     // 64K-token rows: full layout 12 B/token = 768 KiB per batch → 11 batches; compact u16 → 64.
    assert_eq!(c.prefetch_depth(65_536, 2), 11);
    let compact = LoaderConfig {
        layout: BatchLayout::Compact,
        ..c.clone()
    };
    assert_eq!(compact.prefetch_depth(65_536, 2), 64);
    assert_eq!(compact.prefetch_depth(65_536, 4), 32);
    // CP ranks hold 1/P of each row: more of them fit.
    let cp = LoaderConfig {
        parallel: Parallel {
            cp: Rank::new(0, 4),
            ..Parallel::default()
        },
        ..compact.clone()
    };
    assert_eq!(cp.prefetch_depth(65_536, 2), 256);
    // Large batches: the batch count rules.
    let big = LoaderConfig {
        batching: Batching::Samples(8),
        ..c.clone()
    };
    assert_eq!(big.prefetch_depth(524_288, 2), 4);
    // A token budget bounds the batch (at least one full row).
    let budget = LoaderConfig {
        batching: Batching::Tokens(1 << 20),
        layout: BatchLayout::Compact,
        ..c.clone()
    };
    assert_eq!(budget.prefetch_depth(4096, 2), 4);
    assert_eq!(budget.prefetch_depth(4 << 20, 2), 4);
    let tiny = LoaderConfig {
        batching: Batching::Tokens(16),
        layout: BatchLayout::Compact,
        ..c.clone()
    };
    assert_eq!(tiny.prefetch_depth(16, 2), 1024, "capped");
    let off = LoaderConfig {
        prefetch_bytes: 0,
        ..compact
    };
    assert_eq!(off.prefetch_depth(65_536, 2), 4);

    // Same stream with a shallow and a deep window, threaded.
    let tmp = tempfile::tempdir().unwrap();
    let d = make(
        tmp.path(),
        "a",
        SynthSpec {
            samples: 30,
            seq_len: 64,
            ..Default::default()
        },
    );
    let base = LoaderConfig {
        workers: 2,
        ..cfg(&[(&d, 1.0)])
    };
    let shallow = LoaderConfig {
        prefetch: 1,
        prefetch_bytes: 0,
        ..base.clone()
    };
    assert_eq!(collect(shallow, 40), collect(base, 40));
}

/// Serialized configs keep the flat parallel fields (`dp_rank`, `dp_size`, `cp_rank`, `cp_size`)
/// and read the old `sources` key; pipeline files with `sources` still load; a saved state keeps
/// `sources` and each row's origin its `source`.
#[test]
fn serialized_forms_keep_their_field_names() {
    let c = LoaderConfig {
        datasets: vec![Dataset::new("d", 2.0)],
        parallel: Parallel {
            dp: Rank::new(1, 4),
            cp: Rank::new(2, 3),
        },
        ..LoaderConfig::default()
    };
    let mut v = serde_json::to_value(&c).unwrap();
    let o = v.as_object_mut().unwrap();
    for (k, want) in [
        ("dp_rank", 1),
        ("dp_size", 4),
        ("cp_rank", 2),
        ("cp_size", 3),
    ] {
        assert_eq!(o[k], want, "{k}");
    }
    assert!(!o.contains_key("parallel"));
    let datasets = o.remove("datasets").unwrap();
    o.insert("sources".into(), datasets);
    let back: LoaderConfig = serde_json::from_value(v).unwrap();
    assert_eq!(back, c);

    let tmp = tempfile::tempdir().unwrap();
    for key in ["sources", "datasets"] {
        let p = tmp.path().join(format!("{key}.json"));
        let text = format!(r#"{{"name": "t", "{key}": [{{"dir": "a", "weight": 0.3}}]}}"#);
        std::fs::write(&p, text).unwrap();
        let pipe = rsd_loader::Pipeline::read(&p, Path::new("/data")).unwrap();
        assert_eq!(pipe.datasets, vec![Dataset::new("/data/a", 0.3)]);
    }

    let d = make(tmp.path(), "a", SynthSpec::default());
    let mut loader = Loader::new(cfg(&[(&d, 1.0)])).unwrap();
    let b = loader.next().unwrap().unwrap();
    let state = serde_json::to_value(loader.state()).unwrap();
    assert_eq!(state["sources"][0]["samples"], 100);
    let row = serde_json::to_value(b.samples[0]).unwrap();
    assert_eq!(row["source"], 0);
}

#[test]
fn ids_outside_the_vocabulary_fail_the_batch_naming_shard_sample_and_token() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = make(
        tmp.path(),
        "v",
        SynthSpec {
            samples: 40,
            seq_len: 64,
            vocab: 50_000,
            ..SynthSpec::default()
        },
    );
    let set = ShardSet::open(&d).expect("open");
    // Every id is in range for the shards' own vocabulary: a whole epoch passes.
    let mut ok = Loader::new(LoaderConfig {
        epochs: Some(1),
        ..cfg(&[(&d, 1.0)])
    })
    .expect("open");
    ok.reject_ids_outside(50_000);
    let batches: Vec<Batch> = ok.collect::<Result<_, _>>().expect("batches");
    assert_eq!(batches.len(), 40);
    for layout in [BatchLayout::Full, BatchLayout::Compact] {
        for (cp_rank, cp) in [(0, 1), (0, 2), (1, 2)] {
            let mut l = Loader::new(LoaderConfig {
                layout,
                parallel: Parallel {
                    dp: Rank::SINGLE,
                    cp: Rank::new(cp_rank, cp),
                },
                ..cfg(&[(&d, 1.0)])
            })
            .expect("open");
            l.reject_ids_outside(1_000);
            let err = l.next().expect("an item").expect_err("ids above 1000");
            let LoaderError::IdOutOfVocab {
                path,
                sample,
                token,
                id,
                vocab,
            } = &err
            else {
                panic!("unexpected error {err}");
            };
            assert_eq!(*vocab, 1_000);
            let shard = set
                .shards()
                .iter()
                .find(|s| s.bin_path() == path.as_path())
                .expect("the named shard");
            let stored = shard.sample(*sample as usize).expect("sample");
            let at = match stored.tokens {
                rsd_shard::Tokens::U16(t) => t[*token as usize] as i64,
                rsd_shard::Tokens::I32(t) => t[*token as usize] as i64,
            };
            assert_eq!(at, *id, "{layout:?} cp {cp_rank}/{cp}");
            assert!(*id >= 1_000);
            let msg = err.to_string();
            assert!(
                msg.contains(&format!("sample {sample}, token {token}: id {id}")),
                "{msg}"
            );
            assert!(l.next().is_none(), "the stream ends after the error");
        }
    }
}

/// Chat data's loss mask: a label is kept only where the mask marks the token it predicts, on
/// top of the row end and the document boundaries; `num_label_tokens` counts exactly the kept
/// labels of the whole rows (summed over CP ranks); the compact layout materialises to the same
/// labels; and CP ranks together hold every label of the row once.
#[test]
fn loss_masked_shards_keep_only_the_marked_targets() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = SynthSpec {
        samples: 11,
        seq_len: 40,
        mixed: true,
        loss_mask: true,
        ..Default::default()
    };
    let dir = make(tmp.path(), "chat", spec.clone());
    let ignore = IGNORE_INDEX;
    for cp in [1usize, 2, 3] {
        // (sample, full-row position) → label, gathered over the CP ranks.
        let mut labels: std::collections::HashMap<(u64, u64), i32> = Default::default();
        let mut counted = 0u64;
        for cp_rank in 0..cp {
            let base = LoaderConfig {
                parallel: Parallel {
                    dp: Rank::new(0, 1),
                    cp: Rank::new(cp_rank, cp),
                },
                shuffle: false,
                batching: Batching::Samples(11),
                ..cfg(&[(dir.as_path(), 1.0)])
            };
            let full = collect(base.clone(), 1).remove(0);
            let compact = collect(
                LoaderConfig {
                    layout: BatchLayout::Compact,
                    ..base
                },
                1,
            )
            .remove(0);
            assert_eq!(compact.num_label_tokens, full.num_label_tokens);
            let (mut t, mut l, mut p) = (vec![], vec![], vec![]);
            compact.materialize(&mut t, &mut l, &mut p);
            assert_eq!(l, full.labels, "cp {cp_rank}/{cp}: compact vs full labels");
            if cp_rank == 0 {
                counted = full.num_label_tokens;
            } else {
                assert_eq!(
                    full.num_label_tokens, counted,
                    "every CP rank counts whole rows"
                );
            }
            let per_row = full.chunks.len() / full.rows();
            let mut i = 0usize;
            for (r, s) in full.samples.iter().enumerate() {
                let base = full.full_row_offsets[r];
                for c in &full.chunks[r * per_row..(r + 1) * per_row] {
                    for j in c[0]..c[1] {
                        labels.insert((s.global, (j - base) as u64), full.labels[i]);
                        i += 1;
                    }
                }
            }
        }
        let mut kept = 0u64;
        for s in 0..spec.samples {
            let (len, pieces) = synth::shape(&spec, s);
            let mut starts = vec![];
            let mut at = 0;
            for p in &pieces {
                starts.push(at);
                at += p;
            }
            for j in 0..len as u64 {
                let next = j + 1;
                let expected = if next >= len as u64
                    || starts.contains(&(next as u32))
                    || !synth::target(&spec, s, next)
                {
                    ignore
                } else {
                    synth::token(&spec, s, next) as i32
                };
                assert_eq!(
                    labels[&(s, j)],
                    expected,
                    "cp {cp}, sample {s}, position {j}"
                );
                kept += u64::from(expected != ignore);
            }
        }
        assert_eq!(counted, kept, "cp {cp}: num_label_tokens");
        assert!(kept > 0 && kept < spec.samples * spec.seq_len as u64 / 2 * 3);
    }
}
