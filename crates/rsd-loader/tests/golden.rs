//! The loader's output is part of its contract: a resumed or re-run stream must give the same
//! batches. This pins a digest of every array of many batches, over both layouts, both read
//! methods, CP and DP ranks, shuffled and in order, fixed and mixed shards with tail padding.

use std::path::Path;

use rsd_loader::synth::{self, SynthSpec};
use rsd_loader::{
    Batch, BatchLayout, Batching, Dataset, Loader, LoaderConfig, Parallel, Rank, ReadMethod,
};

/// FNV-1a over 64-bit words.
struct Digest(u64);

impl Digest {
    fn add(&mut self, x: u64) {
        for b in x.to_le_bytes() {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn all<T: Copy + Into<i64>>(&mut self, xs: &[T]) {
        self.add(xs.len() as u64);
        for &x in xs {
            self.add(x.into() as u64);
        }
    }
    fn batch(&mut self, b: &Batch) {
        self.add(b.step);
        self.all(&b.tokens);
        self.all(&b.labels);
        self.all(&b.position_ids);
        self.all(&b.row_offsets);
        self.all(&b.doc_offsets);
        self.all(&b.full_row_offsets);
        for c in &b.chunks {
            self.all(c);
        }
        for s in &b.samples {
            self.all(&[
                s.dataset as i64,
                s.shard as i64,
                s.index as i64,
                s.global as i64,
            ]);
            self.add(s.epoch);
        }
        self.add(b.num_tokens);
        self.add(b.num_label_tokens);
        for i in 0..b.raw_tokens.len() {
            self.add(b.raw_tokens.get(i) as u64);
        }
        self.all(&b.next_ids);
        for m in &b.row_meta {
            self.all(&[m.len, m.tail_pad, m.cp_pad]);
            self.add(m.pad_id as u64);
            self.add(m.doc_positions as u64 * 2 + m.mask_doc_boundaries as u64);
        }
    }
}

fn set_tail_padding(dir: &Path, n: u64, pad_id: u64) {
    let path = dir.join(rsd_shard::MANIFEST_FILE);
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    m["totals"]["padding_tokens"] = n.into();
    m["pad_id"] = pad_id.into();
    std::fs::write(&path, serde_json::to_string(&m).unwrap()).unwrap();
}

#[test]
fn batches_match_the_pinned_digest() {
    let tmp = tempfile::tempdir().unwrap();
    let fixed = tmp.path().join("fixed");
    synth::write(
        &fixed,
        &SynthSpec {
            samples: 29,
            seq_len: 37,
            shard_bytes: 700,
            ..Default::default()
        },
    )
    .unwrap();
    set_tail_padding(&fixed, 5, 7);
    let mixed = tmp.path().join("mixed");
    synth::write(
        &mixed,
        &SynthSpec {
            samples: 23,
            seq_len: 37,
            mixed: true,
            seed: 3,
            shard_bytes: 1500,
            ..Default::default()
        },
    )
    .unwrap();
    let mut d = Digest(0xcbf2_9ce4_8422_2325);
    let mut batches = 0;
    for datasets in [
        vec![Dataset::new(&fixed, 1.0)],
        vec![Dataset::new(&mixed, 1.0)],
        vec![Dataset::new(&fixed, 0.4), Dataset::new(&mixed, 0.6)],
    ] {
        for layout in [BatchLayout::Full, BatchLayout::Compact] {
            for read in [ReadMethod::Pread, ReadMethod::Map] {
                for (cp_rank, cp_size) in [(0, 1), (0, 2), (1, 2), (2, 3)] {
                    for shuffle in [true, false] {
                        for batching in [Batching::Samples(3), Batching::Tokens(120)] {
                            let cfg = LoaderConfig {
                                datasets: datasets.clone(),
                                seed: 11,
                                parallel: Parallel {
                                    dp: Rank::new(1, 2),
                                    cp: Rank::new(cp_rank, cp_size),
                                },
                                layout,
                                read,
                                shuffle,
                                batching,
                                workers: 0,
                                ..LoaderConfig::default()
                            };
                            for b in Loader::new(cfg).unwrap().take(12) {
                                d.batch(&b.unwrap());
                                batches += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert_eq!(batches, 2304);
    assert_eq!(d.0, 0xa9c1_127e_19d3_3845, "digest {:#x}", d.0);
}
