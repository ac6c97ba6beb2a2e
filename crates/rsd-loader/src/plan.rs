//! The global sample stream and how a step of it is dealt to data-parallel ranks.
//!
//! Everything here works on sample *references* and `.idx` metadata only, so every rank (and every
//! worker thread) can replay the same plan cheaply and agree on one global cursor.

use std::sync::Arc;

use crate::datasets::OpenDataset;
use crate::error::{LoaderError, Result};
use crate::perm::{key, Permutation};
use crate::{Batching, LoaderConfig, Rank};

/// One draw from the mixture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SampleRef {
    pub dataset: usize,
    /// Index within the dataset's shard set (after the permutation).
    pub global: u64,
    pub epoch: u64,
}

/// Where the stream stands: enough to continue it exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Position {
    pub step: u64,
    pub cursor: u64,
    pub drawn: Vec<u64>,
}

/// The rows this rank gets in one global step, and the position after the step.
pub(crate) struct StepPlan {
    pub step: u64,
    pub rows: Vec<SampleRef>,
    pub after: Position,
}

/// Replays the global stream. Cloning is cheap (the datasets are shared).
#[derive(Clone)]
pub(crate) struct Planner {
    datasets: Arc<Vec<OpenDataset>>,
    seed: u64,
    epoch0: u64,
    epochs: Option<u64>,
    shuffle: bool,
    dp: Rank,
    batching: Batching,
    pos: Position,
    perms: Vec<(u64, Permutation)>,
}

impl Planner {
    pub fn new(datasets: Arc<Vec<OpenDataset>>, cfg: &LoaderConfig, pos: Position) -> Planner {
        let perms = datasets
            .iter()
            .enumerate()
            .map(|(k, s)| {
                (
                    cfg.epoch,
                    Permutation::new(s.samples, key(cfg.seed, k, cfg.epoch), cfg.shuffle),
                )
            })
            .collect();
        Planner {
            datasets,
            seed: cfg.seed,
            epoch0: cfg.epoch,
            epochs: cfg.epochs,
            shuffle: cfg.shuffle,
            dp: cfg.parallel.dp,
            batching: cfg.batching,
            pos,
            perms,
        }
    }

    /// The next sample of the global stream, or `None` once the epoch limit is reached.
    ///
    /// Smooth weighted round-robin: the dataset furthest behind its share `w_k · (g + 1)` goes next.
    /// It needs no state beyond the draw counts, so a resumed stream is identical.
    ///
    /// The counters may come from a saved state (checked when it is restored) and the start epoch
    /// from the user: every sum is checked, so a stream at the end of u64 is an error, not a wrap.
    fn draw(&mut self) -> Result<Option<SampleRef>> {
        let overflow = |what: &str| {
            Err(LoaderError::Config(format!(
                "the stream cannot go on: {what} would pass 2^64"
            )))
        };
        let g = self.pos.cursor;
        let Some(next) = g.checked_add(1) else {
            return overflow("the global sample cursor");
        };
        let mut best = 0usize;
        let mut best_deficit = f64::NEG_INFINITY;
        for (k, s) in self.datasets.iter().enumerate() {
            let deficit = s.weight * next as f64 - self.pos.drawn[k] as f64;
            if deficit > best_deficit {
                best = k;
                best_deficit = deficit;
            }
        }
        let n = self.datasets[best].samples;
        let j = self.pos.drawn[best];
        let Some(epoch) = self.epoch0.checked_add(j / n) else {
            return overflow("the epoch");
        };
        if let Some(limit) = self.epochs {
            if j / n >= limit {
                return Ok(None);
            }
        }
        if self.perms[best].0 != epoch {
            self.perms[best] = (
                epoch,
                Permutation::new(n, key(self.seed, best, epoch), self.shuffle),
            );
        }
        let global = self.perms[best].1.apply(j % n);
        // `drawn[best] ≤ cursor < next`, so this cannot overflow once `next` did not.
        self.pos.drawn[best] = j + 1;
        self.pos.cursor = next;
        Ok(Some(SampleRef {
            dataset: best,
            global,
            epoch,
        }))
    }

    /// Tokens in a referenced sample, from `.idx` metadata only.
    fn sample_len(&self, r: &SampleRef) -> Result<u64> {
        let set = &self.datasets[r.dataset].set;
        let (k, i) = crate::datasets::locate(set, r.global)?;
        let (_, _, start, end) = set.shards()[k].sample_span(i)?;
        Ok(((end - start) / set.manifest().dtype.size()) as u64)
    }

    /// Plan the next global step for this rank; `None` when the stream has ended.
    pub fn plan_step(&mut self) -> Result<Option<StepPlan>> {
        let w = self.dp.size;
        let step = self.pos.step;
        let mut rows = Vec::new();
        match self.batching {
            Batching::Samples(n) => {
                for i in 0..n * w {
                    match self.draw()? {
                        Some(r) if i % w == self.dp.rank => rows.push(r),
                        Some(_) => {}
                        // A partial global step would give ranks unequal batches: drop it.
                        None => return Ok(None),
                    }
                }
            }
            Batching::Tokens(budget) => {
                let mut used = vec![0u64; w];
                loop {
                    let saved = self.pos.clone();
                    let mut round = Vec::with_capacity(w);
                    let mut ended = false;
                    for _ in 0..w {
                        match self.draw()? {
                            Some(r) => round.push(r),
                            None => {
                                ended = true;
                                break;
                            }
                        }
                    }
                    let first_round = used.iter().all(|&u| u == 0);
                    if ended {
                        self.pos = saved;
                        if first_round {
                            return Ok(None);
                        }
                        break;
                    }
                    let lens = round
                        .iter()
                        .map(|r| self.sample_len(r))
                        .collect::<Result<Vec<_>>>()?;
                    let fits = used
                        .iter()
                        .zip(&lens)
                        .all(|(&u, &l)| u + l <= budget as u64);
                    if !fits && !first_round {
                        // Put the round back: it starts the next step.
                        self.pos = saved;
                        break;
                    }
                    for (u, l) in used.iter_mut().zip(&lens) {
                        *u += l;
                    }
                    rows.push(round[self.dp.rank]);
                    if !fits {
                        break;
                    }
                }
            }
        }
        // At most `cursor` (a checked u64) steps: each draws at least one sample.
        self.pos.step = self.pos.step.saturating_add(1);
        Ok(Some(StepPlan {
            step,
            rows,
            after: self.pos.clone(),
        }))
    }
}

/// The starting position of a fresh stream.
pub(crate) fn start(datasets: usize) -> Position {
    Position {
        step: 0,
        cursor: 0,
        drawn: vec![0; datasets],
    }
}

/// Reject configurations that cannot produce batches.
pub(crate) fn check(cfg: &LoaderConfig) -> Result<()> {
    let bad = |s: String| Err(LoaderError::Config(s));
    cfg.parallel.check()?;
    match cfg.batching {
        Batching::Samples(0) => bad("batch size 0".into()),
        // A global step draws batch × DP samples: that count must be a number.
        Batching::Samples(n) if n.checked_mul(cfg.parallel.dp.size).is_none() => bad(format!(
            "batch size {n} × {} data-parallel ranks is more samples than a step can count",
            cfg.parallel.dp.size
        )),
        Batching::Tokens(0) => bad("token budget 0".into()),
        _ => Ok(()),
    }
}
