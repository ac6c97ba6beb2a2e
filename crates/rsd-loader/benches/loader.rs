//! Criterion benchmarks of the loader on synthetic shards (written once per run into a temp dir):
//! one batch of one 64K- or 512K-token sample, sequential and shuffled, inline and with 1–2
//! workers, in the full layout (i32 tokens, labels, positions) and the compact one (ids as stored:
//! `compact-sequential`, `compact-shuffled`; `compact-map-…` copies out of the memory map instead
//! of `pread`), against a plain memcpy of the same bytes (the physical limit) and a `pread` of
//! them (the kernel's copy).
//!
//! `cargo bench -p rsd-loader` (set RSD_BENCH_TOKENS to change the dataset size, default 256M tokens).
// `criterion_group!` defines an undocumented `pub fn`; the workspace denies missing docs.
#![allow(missing_docs)]

use std::path::Path;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, Throughput,
};
use rsd_loader::synth::{self, SynthSpec};
use rsd_loader::{BatchLayout, Batching, Dataset, Loader, LoaderConfig, ReadMethod};

fn bench(c: &mut Criterion) {
    let tokens: u64 = std::env::var("RSD_BENCH_TOKENS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256 << 20);
    let tmp = tempfile::tempdir().expect("tempdir");
    for len in [65_536u32, 524_288] {
        let dir = tmp.path().join(format!("len{len}"));
        let spec = SynthSpec {
            samples: (tokens / len as u64).max(4),
            seq_len: len,
            ..SynthSpec::default()
        };
        synth::write(&dir, &spec).expect("write synthetic shards");
        let mut g = c.benchmark_group(format!("sample{}k", len / 1024));
        g.throughput(Throughput::Bytes(len as u64 * 2));
        g.measurement_time(Duration::from_secs(4))
            .warm_up_time(Duration::from_secs(1))
            .sample_size(20);
        bench_copies(&mut g, &dir, len as usize);
        bench_loaders(&mut g, &dir);
        g.finish();
        // First batch on a fresh loader (open + plan + assemble).
        let cfg = LoaderConfig {
            datasets: vec![Dataset::new(&dir, 1.0)],
            workers: 0,
            ..LoaderConfig::default()
        };
        c.bench_function(&format!("first_batch_{}k", len / 1024), |b| {
            b.iter(|| {
                Loader::new(cfg.clone())
                    .expect("loader")
                    .next()
                    .expect("batch")
                    .expect("ok")
            })
        });
    }
}

/// The references: `len` uint16 tokens copied out of the page-cached map (the limit), and read
/// with `pread` (the kernel's copy, what `ReadMethod::Pread` is made of).
fn bench_copies(g: &mut BenchmarkGroup<'_, WallTime>, dir: &Path, len: usize) {
    let bytes = len * 2;
    let set = rsd_shard::ShardSet::open(dir).expect("open");
    let bin = set.shards()[0].bin_bytes();
    let mut buf = vec![0u8; bytes];
    let mut at = 0usize;
    g.bench_function("memcpy", |b| {
        b.iter(|| {
            if at + buf.len() > bin.len() {
                at = 0;
            }
            buf.copy_from_slice(&bin[at..at + bytes]);
            at += bytes;
            std::hint::black_box(&buf);
        })
    });
    let shard = &set.shards()[0];
    let mut ids: Vec<u16> = Vec::with_capacity(len);
    let mut at = 0usize;
    g.bench_function("pread", |b| {
        b.iter(|| {
            if at + bytes > bin.len() {
                at = 0;
            }
            ids.clear();
            shard
                .append_tokens(at, at + bytes, &mut ids)
                .expect("pread");
            at += bytes;
            std::hint::black_box(&ids);
        })
    });
}

/// One batch of one sample from a running loader, per layout, read method, order and worker count.
fn bench_loaders(g: &mut BenchmarkGroup<'_, WallTime>, dir: &Path) {
    let variants = [
        (BatchLayout::Full, ReadMethod::Pread),
        (BatchLayout::Compact, ReadMethod::Pread),
        (BatchLayout::Compact, ReadMethod::Map),
    ];
    for (layout, read) in variants {
        for shuffle in [false, true] {
            for workers in [0usize, 1, 2] {
                let cfg = LoaderConfig {
                    datasets: vec![Dataset::new(dir, 1.0)],
                    batching: Batching::Samples(1),
                    shuffle,
                    workers,
                    layout,
                    read,
                    ..LoaderConfig::default()
                };
                let mut loader = Loader::new(cfg).expect("loader");
                let order = if shuffle { "shuffled" } else { "sequential" };
                // Full keeps its old ids so earlier criterion baselines still compare.
                let name = match (layout, read) {
                    (BatchLayout::Full, _) => order.to_string(),
                    (BatchLayout::Compact, ReadMethod::Pread) => format!("compact-{order}"),
                    (BatchLayout::Compact, ReadMethod::Map) => format!("compact-map-{order}"),
                };
                let id = BenchmarkId::new(name, format!("workers{workers}"));
                g.bench_function(id, |b| {
                    b.iter(|| {
                        let batch = loader.next().expect("endless").expect("batch");
                        loader.recycle(std::hint::black_box(batch));
                    })
                });
            }
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
