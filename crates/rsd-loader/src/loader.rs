//! The prefetching iterator: worker threads assemble batches ahead of the consumer.
//!
//! Worker w of n owns steps i ≡ w (mod n) and sends them on its own bounded channel; the consumer
//! receives from channel i mod n, so batches arrive in order without a reorder buffer, and a full
//! channel blocks its worker (backpressure). Each worker replays the planner itself (planning is
//! metadata only), which keeps the workers independent. Dropping the loader drops the receivers,
//! which unblocks every sender, and joins the threads.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, Receiver, Sender};

use crate::batch::{assemble, AssemblyConfig, Batch, RawTokens};
use crate::datasets::{open_all, OpenDataset};
use crate::error::{LoaderError, Result};
use crate::plan::{self, Planner, Position};
use crate::state::LoaderState;
use crate::LoaderConfig;

enum Msg {
    Batch(Box<Batch>, Position),
    Err(LoaderError),
    End,
}

enum Engine {
    /// `workers = 0`: plan and assemble on the caller's thread.
    Inline(Box<Planner>),
    Threads {
        pool: Sender<Batch>,
        rxs: Vec<Receiver<Msg>>,
        handles: Vec<JoinHandle<()>>,
        stop: Arc<AtomicBool>,
    },
}

/// A deterministic, resumable stream of [`Batch`]es for one (DP, CP) rank.
pub struct Loader {
    cfg: LoaderConfig,
    datasets: Arc<Vec<OpenDataset>>,
    assembly: AssemblyConfig,
    engine: Engine,
    /// Position after the last batch handed out.
    pos: Position,
    received: u64,
    /// A returned batch kept for reuse (inline engine).
    spare: Option<Batch>,
    /// Row buffer for `assemble` (inline engine).
    scratch: RawTokens,
    done: bool,
    /// Ids at or above this fail the batch ([`Loader::reject_ids_outside`]).
    vocab_size: Option<u64>,
}

impl Loader {
    /// Open the datasets and start the stream at its beginning.
    pub fn new(cfg: LoaderConfig) -> Result<Loader> {
        Self::start(cfg, None)
    }

    /// Continue the stream saved in `state`. DP/CP sizes, ranks, batching and prefetch may differ
    /// from the run that saved it; seed, start epoch, shuffle, datasets and weights may not.
    pub fn resume(cfg: LoaderConfig, state: &LoaderState) -> Result<Loader> {
        Self::start(cfg, Some((state, None)))
    }

    /// [`Loader::resume`] from a state file ([`LoaderState::read`]): every error about the
    /// state names the file, and the field where there is one.
    pub fn resume_file(cfg: LoaderConfig, path: &Path) -> Result<Loader> {
        let state = LoaderState::read(path)?;
        Self::start(cfg, Some((&state, Some(path))))
    }

    fn start(cfg: LoaderConfig, state: Option<(&LoaderState, Option<&Path>)>) -> Result<Loader> {
        plan::check(&cfg)?;
        let datasets = Arc::new(open_all(&cfg.datasets, cfg.verify)?);
        let pos = match state {
            Some((s, None)) => s.position_for(&cfg, &datasets)?,
            Some((s, Some(path))) => s.position_from_file(path, &cfg, &datasets)?,
            None => plan::start(datasets.len()),
        };
        let assembly = AssemblyConfig::new(&cfg);
        let planner = Planner::new(datasets.clone(), &cfg, pos.clone());
        let engine = if cfg.workers == 0 {
            Engine::Inline(Box::new(planner))
        } else {
            spawn(&cfg, &datasets, assembly, planner)?
        };
        Ok(Loader {
            cfg,
            datasets,
            assembly,
            engine,
            pos,
            received: 0,
            spare: None,
            scratch: RawTokens::default(),
            done: false,
            vocab_size: None,
        })
    }

    /// The state after the last batch returned by the iterator (prefetched batches not counted).
    pub fn state(&self) -> LoaderState {
        LoaderState::new(&self.cfg, &self.datasets, &self.pos)
    }

    /// Hand a consumed batch back so its allocations are reused for a later batch (optional: call it
    /// once the batch has been copied into tensors). Saves a page fault per 4 KiB of fresh memory,
    /// which matters for 512K-token rows.
    pub fn recycle(&mut self, batch: Batch) {
        match &self.engine {
            Engine::Inline(_) => self.spare = Some(batch),
            // A full pool means enough spares are waiting; dropping this one is fine.
            Engine::Threads { pool, .. } => {
                let _ = pool.try_send(batch);
            }
        }
    }

    /// From now on, a batch holding a token id outside `0..vocab_size` is returned as
    /// [`LoaderError::IdOutOfVocab`] (naming shard, sample and token) instead of the batch, and
    /// ends the stream. For a model whose embedding has `vocab_size` rows: an id beyond it would
    /// otherwise fail inside the embedding, or on a GPU as a device-side assert. Costs one
    /// vectorised pass over the batch's ids ([`Batch::find_id_outside`]).
    pub fn reject_ids_outside(&mut self, vocab_size: u64) {
        self.vocab_size = Some(vocab_size);
    }

    /// [`LoaderError::IdOutOfVocab`] for the first id of `batch` outside `0..vocab_size`.
    pub fn check_ids(&self, batch: &Batch, vocab_size: u64) -> Result<()> {
        let Some(bad) = batch.find_id_outside(vocab_size) else {
            return Ok(());
        };
        let s = batch.samples.get(bad.row).copied();
        let path = s
            .and_then(|s| {
                self.datasets
                    .get(s.dataset as usize)?
                    .set
                    .shards()
                    .get(s.shard as usize)
            })
            .map(|sh| sh.bin_path().to_path_buf())
            .unwrap_or_default();
        Err(LoaderError::IdOutOfVocab {
            path,
            sample: s.map_or(0, |s| s.index),
            token: bad.token,
            id: bad.id,
            vocab: vocab_size,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LoaderConfig {
        &self.cfg
    }

    /// Samples in each dataset, in config order.
    pub fn dataset_sizes(&self) -> Vec<u64> {
        self.datasets.iter().map(|s| s.samples).collect()
    }

    /// The packing length of the datasets (they all agree).
    pub fn seq_len(&self) -> u64 {
        self.datasets[0].set.manifest().seq_len
    }

    /// The manifest of dataset `k`.
    pub fn manifest(&self, k: usize) -> Option<&rsd_shard::Manifest> {
        self.datasets.get(k).map(|s| s.set.manifest())
    }

    fn next_inline(
        planner: &mut Planner,
        datasets: &[OpenDataset],
        assembly: &AssemblyConfig,
        spare: Option<Batch>,
        scratch: &mut RawTokens,
    ) -> Option<Result<(Batch, Position)>> {
        match planner.plan_step() {
            Ok(Some(p)) => {
                Some(assemble(datasets, &p, assembly, spare, scratch).map(|b| (b, p.after)))
            }
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

fn spawn(
    cfg: &LoaderConfig,
    datasets: &Arc<Vec<OpenDataset>>,
    assembly: AssemblyConfig,
    planner: Planner,
) -> Result<Engine> {
    let n = cfg.workers;
    let manifest = datasets[0].set.manifest();
    let prefetch = cfg.prefetch_depth(manifest.seq_len, manifest.dtype.size() as u64);
    // Returned batches wait here for a worker to refill them; bounded so an unused pool stays small.
    let (pool_tx, pool_rx) = bounded::<Batch>(prefetch + n);
    let depth = prefetch.div_ceil(n).max(1);
    let stop = Arc::new(AtomicBool::new(false));
    let mut rxs = Vec::with_capacity(n);
    let mut handles = Vec::with_capacity(n);
    for w in 0..n {
        let (tx, rx) = bounded::<Msg>(depth);
        let pool = pool_rx.clone();
        let (datasets, stop, planner) = (datasets.clone(), stop.clone(), planner.clone());
        let handle = std::thread::Builder::new()
            .name(format!("rsd-loader-{w}"))
            .spawn(move || worker(w, n, planner, &datasets, assembly, &tx, &pool, &stop))
            .map_err(|e| LoaderError::Config(format!("cannot start loader thread: {e}")))?;
        rxs.push(rx);
        handles.push(handle);
    }
    Ok(Engine::Threads {
        pool: pool_tx,
        rxs,
        handles,
        stop,
    })
}

// The worker's inputs are all distinct roles; bundling them in a struct would only rename them.
#[allow(clippy::too_many_arguments)]
fn worker(
    w: usize,
    n: usize,
    mut planner: Planner,
    datasets: &[OpenDataset],
    assembly: AssemblyConfig,
    tx: &Sender<Msg>,
    pool: &Receiver<Batch>,
    stop: &AtomicBool,
) {
    let mut i = 0usize;
    let mut scratch = RawTokens::default();
    while !stop.load(Ordering::Relaxed) {
        let mine = i % n == w;
        // Every worker hits the same end or planning error at the same step; only its owner reports it.
        let msg = match planner.plan_step() {
            Ok(Some(p)) if mine => {
                match assemble(datasets, &p, &assembly, pool.try_recv().ok(), &mut scratch) {
                    Ok(b) => Msg::Batch(Box::new(b), p.after),
                    Err(e) => Msg::Err(e),
                }
            }
            Ok(Some(_)) => {
                i += 1;
                continue;
            }
            Ok(None) => Msg::End,
            Err(e) => Msg::Err(e),
        };
        let last = !matches!(msg, Msg::Batch(..));
        if !mine || tx.send(msg).is_err() || last {
            return;
        }
        i += 1;
    }
}

impl Iterator for Loader {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if self.done {
            return None;
        }
        let got = match &mut self.engine {
            Engine::Inline(planner) => {
                let spare = self.spare.take();
                Self::next_inline(
                    planner,
                    &self.datasets,
                    &self.assembly,
                    spare,
                    &mut self.scratch,
                )
            }
            Engine::Threads { rxs, .. } => {
                let w = (self.received % rxs.len() as u64) as usize;
                match rxs[w].recv() {
                    Ok(Msg::Batch(b, p)) => Some(Ok((*b, p))),
                    Ok(Msg::Err(e)) => Some(Err(e)),
                    Ok(Msg::End) => None,
                    Err(_) => Some(Err(LoaderError::WorkerDied(w))),
                }
            }
        };
        match got {
            Some(Ok((b, p))) => {
                if let Some(v) = self.vocab_size {
                    if let Err(e) = self.check_ids(&b, v) {
                        self.done = true;
                        return Some(Err(e));
                    }
                }
                self.pos = p;
                self.received += 1;
                Some(Ok(b))
            }
            Some(Err(e)) => {
                self.done = true;
                Some(Err(e))
            }
            None => {
                self.done = true;
                None
            }
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        if let Engine::Threads {
            rxs, handles, stop, ..
        } = &mut self.engine
        {
            stop.store(true, Ordering::Relaxed);
            // Dropping the receivers makes any blocked `send` fail, so every worker exits promptly.
            rxs.clear();
            for h in handles.drain(..) {
                let _ = h.join();
            }
        }
    }
}
