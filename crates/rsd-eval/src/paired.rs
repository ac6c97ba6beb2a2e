//! Paired differences between arms evaluated on the same items, with bootstrap intervals over
//! replicas (training seeds) and items: what `rsd-eval compare --baseline LABEL` adds to the
//! comparison.
//!
//! An **arm** is a label; each arm has **replicas** (say, training seeds), each replica the
//! records of one or more runs (say, one run per evaluated length). Arm and baseline are paired
//! twice: replica `r` of the arm with replica `r` of the baseline (the same seed: the same
//! adaptation data order), and item with item (the same task, length, depth and sample index).
//! Only replicas both have, and items every one of those replicas has, are used.
//!
//! **Measures**, each per arm and as the difference arm − baseline:
//! * `accuracy@L`: the mean score at length L, every (depth) cell weighing the same;
//! * `depth_sd@L`: the population standard deviation over depths of the per-depth accuracy at
//!   L: how much accuracy depends on where the evidence sits;
//! * `drop@L1→L2`: accuracy at the shortest length (or the one [`Chosen::drop_from`] names)
//!   minus accuracy at the longest (with two or more lengths);
//! * `depth_sd@L1+L2+…` when [`Chosen::depth_lengths`] names two or more lengths: the mean of
//!   their `depth_sd` (a design that fixes its depth lengths in advance compares them as one
//!   measure);
//! * `logprob@L` (secondary): the mean log-probability of the expected answer, when the records
//!   carry one (teacher-forced runs);
//! * `greedy@L` (secondary): how often greedy decoding would produce the expected answer
//!   (greedy exact match), when the records say (teacher-forced runs).
//!
//! **Intervals**: a percentile bootstrap. Each of `B` resamples draws the replicas with
//! replacement (as many as there are), and within every (length, depth) cell its items with
//! replacement (as many as there are); the arm and the baseline are measured on the same draw,
//! so the interval is of the paired difference. The point estimate is on all the data.
//!
//! **Groups of replicas**: replicas named `GROUP/NAME` (say `base1/seed0`: adaptation seeds of
//! one base model) are resampled hierarchically: the groups with replacement, then within each
//! drawn group its replicas with replacement, then the items. Replicas without a `/` are each a
//! group of their own, which is the plain draw above.
//!
//! **Noise floors**, beside each measure: how large a value chance alone makes on these items.
//! For the difference, the 95th percentile of |arm − baseline| over `B` relabellings that swap
//! the arm's and the baseline's record of each (replica, item) by a fair coin (a difference
//! inside it is one a relabelling makes as easily). For `depth_sd`, also each side's own floor:
//! the 95th percentile of its depth_sd when, within each replica and length, the items' depth
//! labels are shuffled (an arm whose depth_sd is inside it shows no depth dependence these
//! items can detect).
use std::collections::{BTreeMap, BTreeSet};

use rsd_common::rng::SplitMix64;
use serde::Serialize;

use crate::error::EvalError;
use crate::results::ItemResult;

/// An item's identity across runs: task, length, depth bits, sample.
type Key = (String, usize, Option<u64>, usize);

/// A replica's records by key: (score, log-probability, greedy match as 0/1).
type Records = BTreeMap<Key, (f64, Option<f64>, Option<f64>)>;

/// One measure of one arm against the baseline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measure {
    /// `accuracy@1024`, `depth_sd@1024`, `drop@1024→4096`, `logprob@1024`.
    pub name: String,
    /// Whether it is one of the primary measures (accuracy, depth_sd, drop) or secondary.
    pub primary: bool,
    /// The arm's value on all the data.
    pub arm: f64,
    /// The baseline's value on all the data.
    pub baseline: f64,
    /// `arm − baseline`.
    pub diff: f64,
    /// The bootstrap interval of the difference, `[lower, upper]`.
    pub ci: [f64; 2],
    /// The 95th percentile of |difference| under arm/baseline relabelling (see the module docs).
    pub noise_floor: f64,
    /// For `depth_sd`: the arm's and the baseline's 95th percentile under depth shuffling.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub depth_shuffle_floor: Option<[f64; 2]>,
}

/// One arm's measures against the baseline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArmDiff {
    /// The arm's label.
    pub label: String,
    /// Replicas paired with the baseline's.
    pub replicas: Vec<String>,
    /// Items per replica used (shared by every paired replica of both).
    pub items: usize,
    /// The measures.
    pub measures: Vec<Measure>,
}

/// Everything `--baseline` adds to `compare.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Paired {
    /// The baseline's label.
    pub baseline: String,
    /// Bootstrap resamples.
    pub resamples: usize,
    /// Interval coverage (0.95).
    pub level: f64,
    /// Seed of the resampling (each arm draws from its own stream: the seed and the arm's
    /// position among the compared arms).
    pub seed: u64,
    /// One entry per other arm, in the order the arms were given.
    pub arms: Vec<ArmDiff>,
}

/// Arm label → replica name → records.
pub type Arms = Vec<(String, Vec<(String, Vec<ItemResult>)>)>;

fn key(r: &ItemResult) -> Key {
    (
        r.task.clone(),
        r.length,
        r.depth.map(f64::to_bits),
        r.sample,
    )
}

fn records(label: &str, replica: &str, items: &[ItemResult]) -> Result<Records, EvalError> {
    let mut out = Records::new();
    for r in items {
        let greedy = r.greedy.map(|g| if g { 1.0 } else { 0.0 });
        if out.insert(key(r), (r.score, r.logprob, greedy)).is_some() {
            return Err(EvalError::Input(format!(
                "{label}, replica {replica}: the item {} at length {}, depth {:?}, sample {} is \
                 recorded twice (two runs of one replica must hold different items)",
                rsd_common::printable::printable(&r.task),
                r.length,
                r.depth,
                r.sample
            )));
        }
    }
    Ok(out)
}

/// The measures a design names in advance beyond the default ones (`compare --drop-from`,
/// `--depth-lengths`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chosen {
    /// The length the drop starts from (default: the shortest).
    pub drop_from: Option<usize>,
    /// Lengths whose depth_sd is also compared as one mean (two or more).
    pub depth_lengths: Vec<usize>,
}

/// [`Chosen`] as indices into an arm pair's lengths.
#[derive(Clone, Default)]
struct ChosenAt {
    drop_from: usize,
    depth_lengths: Vec<usize>,
}

impl Chosen {
    fn at(&self, lengths: &[usize], label: &str) -> Result<ChosenAt, EvalError> {
        let index = |l: usize, flag: &str| {
            lengths.iter().position(|&x| x == l).ok_or_else(|| {
                EvalError::Input(format!(
                    "{flag} {l}: {label} and the baseline share no item at that length (their \
                     lengths: {})",
                    lengths
                        .iter()
                        .map(usize::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
        };
        let drop_from = self
            .drop_from
            .map(|l| index(l, "--drop-from"))
            .transpose()?
            .unwrap_or(0);
        let depth_lengths = self
            .depth_lengths
            .iter()
            .map(|&l| index(l, "--depth-lengths"))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ChosenAt {
            drop_from,
            depth_lengths: if depth_lengths.len() > 1 {
                depth_lengths
            } else {
                Vec::new()
            },
        })
    }
}

/// Scores as dense arrays: `[replica][cell][item]`, cells being (length, depth) in order.
#[derive(Clone)]
struct Dense {
    lengths: Vec<usize>,
    /// The measures chosen beyond the default ones.
    chosen: ChosenAt,
    /// Per cell: its length's index.
    cell_length: Vec<usize>,
    /// `[replica][cell][item]`.
    score: Vec<Vec<Vec<f64>>>,
    /// Present when every record has one.
    logprob: Option<Vec<Vec<Vec<f64>>>>,
    /// Present when every record has one.
    greedy: Option<Vec<Vec<Vec<f64>>>>,
}

fn dense(reps: &[&Records], keys: &[Vec<Key>], lengths: &[usize], chosen: &ChosenAt) -> Dense {
    let cell_length = keys
        .iter()
        .map(|k| lengths.iter().position(|&l| l == k[0].1).unwrap_or(0))
        .collect();
    type Value = (f64, Option<f64>, Option<f64>);
    let pick = |f: &dyn Fn(&Value) -> Option<f64>| -> Option<Vec<Vec<Vec<f64>>>> {
        reps.iter()
            .map(|rec| {
                keys.iter()
                    .map(|cell| cell.iter().map(|k| rec.get(k).and_then(f)).collect())
                    .collect()
            })
            .collect()
    };
    Dense {
        lengths: lengths.to_vec(),
        chosen: chosen.clone(),
        cell_length,
        score: pick(&|v| Some(v.0)).unwrap_or_default(),
        logprob: pick(&|v| v.1),
        greedy: pick(&|v| v.2),
    }
}

/// One draw: which replicas, and per cell which items (indices, with repetition).
struct Draw {
    replicas: Vec<usize>,
    items: Vec<Vec<usize>>,
}

impl Draw {
    fn all(replicas: usize, cells: &[Vec<Key>]) -> Draw {
        Draw {
            replicas: (0..replicas).collect(),
            items: cells.iter().map(|c| (0..c.len()).collect()).collect(),
        }
    }

    /// One bootstrap draw: the groups of replicas (indices), then their replicas, then the
    /// items of every cell, each with replacement. With only single-replica groups it draws
    /// exactly what a plain draw of the replicas does, from the same random numbers.
    fn resample(rng: &mut SplitMix64, groups: &[Vec<usize>], cells: &[Vec<Key>]) -> Draw {
        let mut pick = |n: usize| -> Vec<usize> {
            (0..n)
                .map(|_| rng.range(0, n as i64 - 1) as usize)
                .collect()
        };
        let replicas = if groups.iter().all(|g| g.len() == 1) {
            pick(groups.len())
                .into_iter()
                .map(|g| groups[g][0])
                .collect()
        } else {
            let mut drawn = Vec::new();
            for g in pick(groups.len()) {
                drawn.extend(pick(groups[g].len()).into_iter().map(|r| groups[g][r]));
            }
            drawn
        };
        Draw {
            replicas,
            items: cells.iter().map(|c| pick(c.len())).collect(),
        }
    }
}

/// The measures of one arm on a draw, in `names` order.
fn measures(d: &Dense, draw: &Draw) -> Vec<f64> {
    let cell_mean = |values: &Vec<Vec<Vec<f64>>>, c: usize| -> f64 {
        let mut sum = 0.0;
        for &r in &draw.replicas {
            for &i in &draw.items[c] {
                sum += values[r][c][i];
            }
        }
        sum / (draw.replicas.len() * draw.items[c].len()) as f64
    };
    let per_length = |values: &Vec<Vec<Vec<f64>>>| -> Vec<Vec<f64>> {
        let mut out = vec![Vec::new(); d.lengths.len()];
        for c in 0..d.cell_length.len() {
            out[d.cell_length[c]].push(cell_mean(values, c));
        }
        out
    };
    let acc = per_length(&d.score);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let mut out = Vec::new();
    for cells in &acc {
        out.push(mean(cells));
    }
    let depth_sd: Vec<f64> = acc
        .iter()
        .map(|cells| {
            let m = mean(cells);
            (cells.iter().map(|x| (x - m).powi(2)).sum::<f64>() / cells.len() as f64).sqrt()
        })
        .collect();
    out.extend(&depth_sd);
    let group = &d.chosen.depth_lengths;
    if !group.is_empty() {
        out.push(group.iter().map(|&l| depth_sd[l]).sum::<f64>() / group.len() as f64);
    }
    if d.lengths.len() > 1 {
        out.push(mean(&acc[d.chosen.drop_from]) - mean(&acc[acc.len() - 1]));
    }
    for secondary in [&d.logprob, &d.greedy].into_iter().flatten() {
        for cells in per_length(secondary) {
            out.push(mean(&cells));
        }
    }
    out
}

fn names(lengths: &[usize], chosen: &ChosenAt, logprob: bool, greedy: bool) -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = Vec::new();
    out.extend(lengths.iter().map(|l| (format!("accuracy@{l}"), true)));
    out.extend(lengths.iter().map(|l| (format!("depth_sd@{l}"), true)));
    if !chosen.depth_lengths.is_empty() {
        let group: Vec<String> = chosen
            .depth_lengths
            .iter()
            .map(|&l| lengths[l].to_string())
            .collect();
        out.push((format!("depth_sd@{}", group.join("+")), true));
    }
    if lengths.len() > 1 {
        let (a, b) = (lengths[chosen.drop_from], lengths[lengths.len() - 1]);
        out.push((format!("drop@{a}→{b}"), true));
    }
    if logprob {
        out.extend(lengths.iter().map(|l| (format!("logprob@{l}"), false)));
    }
    if greedy {
        out.extend(lengths.iter().map(|l| (format!("greedy@{l}"), false)));
    }
    out
}

/// The `q` quantile of sorted `v` (linear interpolation between order statistics).
fn quantile(v: &[f64], q: f64) -> f64 {
    let pos = q * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

/// The confidence level of the intervals.
const LEVEL: f64 = 0.95;

/// The key that sets the noise floors' random stream apart from the intervals'.
const FLOOR_STREAM: u64 = 0xF100_0000;

/// The shared replicas' groups, as indices into `shared`: replicas named `GROUP/NAME` share
/// their group; a name without `/` is a group of its own. Groups in order of first appearance.
fn replica_groups(shared: &[&str]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, name) in shared.iter().enumerate() {
        let group = match name.split_once('/') {
            Some((g, _)) => g.to_string(),
            None => format!("\0{name}"),
        };
        match groups.iter_mut().find(|(g, _)| *g == group) {
            Some((_, members)) => members.push(i),
            None => groups.push((group, vec![i])),
        }
    }
    groups.into_iter().map(|(_, m)| m).collect()
}

/// Paired differences of every arm against `baseline` (see the module docs).
pub fn paired(
    arms: &Arms,
    baseline: &str,
    chosen: &Chosen,
    resamples: usize,
    seed: u64,
) -> Result<Paired, EvalError> {
    let labels: Vec<&str> = arms.iter().map(|(l, _)| l.as_str()).collect();
    let Some(base) = arms.iter().find(|(l, _)| l == baseline) else {
        return Err(EvalError::Input(format!(
            "--baseline {baseline}: no run has that label (labels: {})",
            labels.join(", ")
        )));
    };
    if resamples < 100 {
        return Err(EvalError::Input(format!(
            "--bootstrap {resamples}: use at least 100 resamples (2000 is the default)"
        )));
    }
    let base_recs = replica_records(baseline, &base.1)?;
    let mut out = Vec::new();
    for (label, reps) in arms.iter().filter(|(l, _)| l != baseline) {
        let recs = replica_records(label, reps)?;
        let rng = SplitMix64::keyed(&[seed, out.len() as u64]);
        // The floors draw from a stream of their own, so the intervals do not depend on them.
        let floor_rng = SplitMix64::keyed(&[seed, out.len() as u64, FLOOR_STREAM]);
        out.push(arm_diff(
            label,
            &recs,
            baseline,
            &base_recs,
            chosen,
            resamples,
            (rng, floor_rng),
        )?);
    }
    Ok(Paired {
        baseline: baseline.to_string(),
        resamples,
        level: LEVEL,
        seed,
        arms: out,
    })
}

/// The records of each replica of the arm `label`, by replica name.
fn replica_records<'a>(
    label: &str,
    reps: &'a [(String, Vec<ItemResult>)],
) -> Result<BTreeMap<&'a str, Records>, EvalError> {
    reps.iter()
        .map(|(r, items)| Ok((r.as_str(), records(label, r, items)?)))
        .collect()
}

/// The paired differences of the arm `label` (its replicas' records `recs`) against the
/// baseline's (`base_recs`), over the replicas and items both have, with intervals from
/// `resamples` draws of `rng`.
fn arm_diff(
    label: &str,
    recs: &BTreeMap<&str, Records>,
    baseline: &str,
    base_recs: &BTreeMap<&str, Records>,
    chosen: &Chosen,
    resamples: usize,
    rngs: (SplitMix64, SplitMix64),
) -> Result<ArmDiff, EvalError> {
    let (mut rng, mut floor_rng) = rngs;
    let shared: Vec<&str> = recs
        .keys()
        .filter(|r| base_recs.contains_key(*r))
        .copied()
        .collect();
    if shared.is_empty() {
        return Err(EvalError::Input(format!(
            "{label} and the baseline {baseline} share no replica to pair: {label} has {}, \
             {baseline} has {} (name them alike with --replicas)",
            recs.keys().copied().collect::<Vec<_>>().join(", "),
            base_recs.keys().copied().collect::<Vec<_>>().join(", ")
        )));
    }
    let all: Vec<&Records> = shared
        .iter()
        .flat_map(|r| [&recs[r], &base_recs[r]])
        .collect();
    let keys: BTreeSet<&Key> = all[0]
        .keys()
        .filter(|k| all.iter().all(|rec| rec.contains_key(*k)))
        .collect();
    if keys.is_empty() {
        return Err(EvalError::Input(format!(
            "{label} and the baseline {baseline} share no item (the same task, length, \
             depth and sample in every paired replica)"
        )));
    }
    // Cells: (length, depth), items in key order.
    let mut cells: BTreeMap<(usize, Option<u64>), Vec<Key>> = BTreeMap::new();
    for k in &keys {
        cells.entry((k.1, k.2)).or_default().push((*k).clone());
    }
    let lengths: Vec<usize> = cells
        .keys()
        .map(|(l, _)| *l)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let cells: Vec<Vec<Key>> = cells.into_values().collect();
    let chosen = chosen.at(&lengths, label)?;
    let arm_reps: Vec<&Records> = shared.iter().map(|r| &recs[r]).collect();
    let base_reps: Vec<&Records> = shared.iter().map(|r| &base_recs[r]).collect();
    let (a, b) = (
        dense(&arm_reps, &cells, &lengths, &chosen),
        dense(&base_reps, &cells, &lengths, &chosen),
    );
    // A secondary measure is compared only when both sides carry it.
    let with_lp = a.logprob.is_some() && b.logprob.is_some();
    let with_greedy = a.greedy.is_some() && b.greedy.is_some();
    let keep = |d: Dense| Dense {
        logprob: d.logprob.filter(|_| with_lp),
        greedy: d.greedy.filter(|_| with_greedy),
        ..d
    };
    let (a, b) = (keep(a), keep(b));
    let names = names(&lengths, &chosen, with_lp, with_greedy);
    let groups = replica_groups(&shared);
    let mut measures = bootstrap(&a, &b, names, &groups, &cells, resamples, &mut rng);
    noise_floors(&a, &b, &mut measures, resamples, &mut floor_rng);
    Ok(ArmDiff {
        label: label.to_string(),
        replicas: shared.iter().map(|r| r.to_string()).collect(),
        items: keys.len(),
        measures,
    })
}

/// The measures `names` of arm `a` and baseline `b` on all of their `replicas` and `cells`,
/// with percentile intervals of their differences over `resamples` draws of both.
fn bootstrap(
    a: &Dense,
    b: &Dense,
    names: Vec<(String, bool)>,
    groups: &[Vec<usize>],
    cells: &[Vec<Key>],
    resamples: usize,
    rng: &mut SplitMix64,
) -> Vec<Measure> {
    let replicas = groups.iter().map(Vec::len).sum();
    let full = Draw::all(replicas, cells);
    let (point_a, point_b) = (measures(a, &full), measures(b, &full));
    let mut diffs: Vec<Vec<f64>> = vec![Vec::with_capacity(resamples); point_a.len()];
    for _ in 0..resamples {
        let draw = Draw::resample(rng, groups, cells);
        let (ma, mb) = (measures(a, &draw), measures(b, &draw));
        for (j, (x, y)) in ma.iter().zip(&mb).enumerate() {
            diffs[j].push(x - y);
        }
    }
    names
        .into_iter()
        .zip(diffs.iter_mut())
        .enumerate()
        .map(|(j, ((name, primary), ds))| {
            ds.sort_by(f64::total_cmp);
            let tail = (1.0 - LEVEL) / 2.0;
            Measure {
                name,
                primary,
                arm: point_a[j],
                baseline: point_b[j],
                diff: point_a[j] - point_b[j],
                ci: [quantile(ds, tail), quantile(ds, 1.0 - tail)],
                noise_floor: f64::NAN,
                depth_shuffle_floor: None,
            }
        })
        .collect()
}

/// Sets every measure's noise floors (see the module docs) from `shuffles` relabellings.
fn noise_floors(a: &Dense, b: &Dense, out: &mut [Measure], shuffles: usize, rng: &mut SplitMix64) {
    // Every replica and item once: the floors are of the measures on all the data.
    let full = Draw {
        replicas: (0..a.score.len()).collect(),
        items: a.score.first().map_or_else(Vec::new, |cells| {
            cells.iter().map(|c| (0..c.len()).collect()).collect()
        }),
    };
    let mut swapped: Vec<Vec<f64>> = vec![Vec::with_capacity(shuffles); out.len()];
    let mut depth: Vec<[Vec<f64>; 2]> = vec![[Vec::new(), Vec::new()]; out.len()];
    for _ in 0..shuffles {
        let (x, y) = swap_labels(a, b, rng);
        for (j, (p, q)) in measures(&x, &full)
            .iter()
            .zip(&measures(&y, &full))
            .enumerate()
        {
            swapped[j].push((p - q).abs());
        }
        for (side, d) in [a, b].into_iter().enumerate() {
            let shuffled = shuffle_depths(d, rng);
            for (j, v) in measures(&shuffled, &full).into_iter().enumerate() {
                depth[j][side].push(v);
            }
        }
    }
    for (j, m) in out.iter_mut().enumerate() {
        swapped[j].sort_by(f64::total_cmp);
        m.noise_floor = quantile(&swapped[j], LEVEL);
        if m.name.starts_with("depth_sd@") {
            let [da, db] = &mut depth[j];
            da.sort_by(f64::total_cmp);
            db.sort_by(f64::total_cmp);
            m.depth_shuffle_floor = Some([quantile(da, LEVEL), quantile(db, LEVEL)]);
        }
    }
}

/// `a` and `b` with the records of each (replica, cell, item) swapped between them by a coin.
fn swap_labels(a: &Dense, b: &Dense, rng: &mut SplitMix64) -> (Dense, Dense) {
    let (mut x, mut y) = (a.clone(), b.clone());
    for r in 0..a.score.len() {
        for c in 0..a.score[r].len() {
            for i in 0..a.score[r][c].len() {
                if rng.next_u64() & 1 == 1 {
                    swap_at(&mut x, &mut y, r, c, i);
                }
            }
        }
    }
    (x, y)
}

fn swap_at(x: &mut Dense, y: &mut Dense, r: usize, c: usize, i: usize) {
    std::mem::swap(&mut x.score[r][c][i], &mut y.score[r][c][i]);
    for (p, q) in [
        (&mut x.logprob, &mut y.logprob),
        (&mut x.greedy, &mut y.greedy),
    ] {
        if let (Some(p), Some(q)) = (p.as_mut(), q.as_mut()) {
            std::mem::swap(&mut p[r][c][i], &mut q[r][c][i]);
        }
    }
}

/// `d` with, in each replica and length, its items' values dealt to that length's depth cells
/// at random (each cell keeps its number of items).
fn shuffle_depths(d: &Dense, rng: &mut SplitMix64) -> Dense {
    let mut out = d.clone();
    for r in 0..d.score.len() {
        for l in 0..d.lengths.len() {
            let cells: Vec<usize> = (0..d.cell_length.len())
                .filter(|&c| d.cell_length[c] == l)
                .collect();
            let mut pool: Vec<f64> = cells.iter().flat_map(|&c| d.score[r][c].clone()).collect();
            for k in (1..pool.len()).rev() {
                let j = rng.range(0, k as i64) as usize;
                pool.swap(k, j);
            }
            let mut at = 0;
            for &c in &cells {
                let n = out.score[r][c].len();
                out.score[r][c].copy_from_slice(&pool[at..at + n]);
                at += n;
            }
        }
    }
    out
}

impl Paired {
    /// The Markdown section: one table per arm.
    pub fn markdown(&self) -> String {
        let mut s = format!(
            "## Paired differences against {}\n\n{:.0}% percentile bootstrap intervals, {} \
             resamples of the paired replicas (by group first, for replicas named GROUP/NAME) \
             and of the items within each (length, depth) cell. Primary measures first; \
             `logprob` and `greedy` (greedy exact match) are secondary. Noise floor: the 95th \
             percentile of |difference| when each item's arm and baseline labels are swapped at \
             random (for depth_sd also each side's own, with depths shuffled).\n",
            self.baseline,
            self.level * 100.0,
            self.resamples
        );
        for arm in &self.arms {
            s += &format!(
                "\n### {} − {} ({} replica(s): {}; {} items each)\n\n| measure | {} | {} | \
                 difference | {:.0}% interval | noise floor |\n|---|---|---|---|---|---|\n",
                arm.label,
                self.baseline,
                arm.replicas.len(),
                arm.replicas.join(", "),
                arm.items,
                arm.label,
                self.baseline,
                self.level * 100.0
            );
            for m in &arm.measures {
                let name = if m.primary {
                    m.name.clone()
                } else {
                    format!("{} (secondary)", m.name)
                };
                let (arm, base) = match m.depth_shuffle_floor {
                    Some([fa, fb]) => (
                        format!("{:.4} (floor {fa:.4})", m.arm),
                        format!("{:.4} (floor {fb:.4})", m.baseline),
                    ),
                    None => (format!("{:.4}", m.arm), format!("{:.4}", m.baseline)),
                };
                s += &format!(
                    "| {name} | {arm} | {base} | {:+.4} | [{:+.4}, {:+.4}] | {:.4} |\n",
                    m.diff, m.ci[0], m.ci[1], m.noise_floor
                );
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plot::tests::item;

    fn with_lp(mut r: ItemResult, lp: f64) -> ItemResult {
        r.logprob = Some(lp);
        r.greedy = Some(r.score > 0.5);
        r
    }

    /// Two lengths × two depths × `n` samples; `score(length, depth, sample)`.
    fn records(n: usize, score: impl Fn(usize, f64, usize) -> f64) -> Vec<ItemResult> {
        let mut out = Vec::new();
        for l in [8, 16] {
            for d in [0.0, 1.0] {
                for s in 0..n {
                    out.push(with_lp(item(l, Some(d), s, score(l, d, s)), -(s as f64)));
                }
            }
        }
        out
    }

    #[test]
    fn noise_floors_separate_real_effects_from_what_relabelling_makes() {
        // The baseline depends on depth completely (1 at depth 0, 0 at depth 1); the arm is a
        // coin per item at every depth; 20 items per cell, 3 replicas.
        let coin = |s: usize| ((s * 2654435761) >> 7).is_multiple_of(2);
        let base = records(20, |_, d, _| if d == 0.0 { 1.0 } else { 0.0 });
        let arm = records(20, |l, d, s| {
            f64::from(u8::from(coin(s + l + (d * 7.0) as usize)))
        });
        let reps = |r: &Vec<ItemResult>| -> Vec<(String, Vec<ItemResult>)> {
            (0..3).map(|i| (i.to_string(), r.clone())).collect()
        };
        let arms: Arms = vec![("std".into(), reps(&base)), ("rsd".into(), reps(&arm))];
        let p = paired(&arms, "std", &Chosen::default(), 400, 1).unwrap();
        let by: BTreeMap<&str, &Measure> = p.arms[0]
            .measures
            .iter()
            .map(|m| (m.name.as_str(), m))
            .collect();
        let sd = by["depth_sd@8"];
        let [arm_floor, base_floor] = sd.depth_shuffle_floor.expect("depth_sd has floors");
        // The baseline's depth dependence (0.5) is far above what shuffling depths makes; the
        // coin arm's is within its own floor.
        assert!(sd.baseline == 0.5 && base_floor < 0.2, "{sd:?}");
        assert!(sd.arm <= arm_floor + 1e-12, "{sd:?}");
        // The difference in depth_sd (−0.5) is beyond what swapping labels makes.
        assert!(sd.diff.abs() > sd.noise_floor, "{sd:?}");
        // Accuracy: both near 0.5, so the difference is inside its floor.
        let acc = by["accuracy@8"];
        assert!(acc.diff.abs() <= acc.noise_floor + 1e-12, "{acc:?}");
        assert!(by["accuracy@8"].depth_shuffle_floor.is_none());
        // The floors draw from their own stream: the intervals are those of a run without them.
        assert_eq!(paired(&arms, "std", &Chosen::default(), 400, 1).unwrap(), p);
    }

    #[test]
    fn identical_arms_have_zero_floors_of_difference() {
        let base = records(6, |_, d, s| if d == 0.0 || s % 3 == 0 { 1.0 } else { 0.0 });
        let arms: Arms = vec![
            ("std".into(), vec![("0".into(), base.clone())]),
            ("same".into(), vec![("0".into(), base)]),
        ];
        let p = paired(&arms, "std", &Chosen::default(), 200, 0).unwrap();
        for m in &p.arms[0].measures {
            assert_eq!((m.diff, m.noise_floor), (0.0, 0.0), "{}", m.name);
        }
    }

    #[test]
    fn grouped_replicas_are_drawn_group_first() {
        let cells = vec![vec![("t".to_string(), 8, None, 0)]; 1];
        // Two groups of three replicas each (indices 0–2 and 3–5).
        let groups = replica_groups(&["b1/s0", "b1/s1", "b1/s2", "b2/s0", "b2/s1", "b2/s2"]);
        assert_eq!(groups, vec![vec![0, 1, 2], vec![3, 4, 5]]);
        let mut rng = SplitMix64::keyed(&[5]);
        let mut mixed = 0;
        for _ in 0..200 {
            let d = Draw::resample(&mut rng, &groups, &cells);
            assert_eq!(d.replicas.len(), 6);
            // Each drawn group contributes its own replicas, three at a time.
            for block in d.replicas.chunks(3) {
                assert!(block.iter().all(|&r| r < 3) || block.iter().all(|&r| r >= 3));
            }
            mixed += usize::from(
                d.replicas[..3].iter().all(|&r| r < 3) != d.replicas[3..].iter().all(|&r| r < 3),
            );
        }
        assert!(mixed > 0, "both groups are drawn");
        // Ungrouped names: one group each, drawn as plain replicas from the same numbers.
        let singles = replica_groups(&["0", "1", "2"]);
        assert_eq!(singles, vec![vec![0], vec![1], vec![2]]);
        let (mut r1, mut r2) = (SplitMix64::keyed(&[9]), SplitMix64::keyed(&[9]));
        let d = Draw::resample(&mut r1, &singles, &cells);
        let plain: Vec<usize> = (0..3).map(|_| r2.range(0, 2) as usize).collect();
        assert_eq!(d.replicas, plain);
    }

    #[test]
    fn a_chosen_drop_and_depth_lengths_are_measured_as_named() {
        // Three lengths; the baseline depends on depth at 8 and 16 only, and its accuracy goes
        // 1 → 0.5 → 0.25; the arm holds 0.5 everywhere with no depth dependence.
        let mut base = Vec::new();
        let mut arm = Vec::new();
        for (l, acc) in [(8, 1.0), (16, 0.5), (32, 0.25)] {
            for d in [0.0, 1.0] {
                for s in 0..4 {
                    let b = match l {
                        32 => f64::from(s == 0),
                        _ if acc == 1.0 => 1.0,
                        _ => f64::from(d == 0.0),
                    };
                    base.push(item(l, Some(d), s, b));
                    arm.push(item(l, Some(d), s, f64::from(s % 2 == 0)));
                }
            }
        }
        let arms: Arms = vec![
            ("std".into(), vec![("0".into(), base)]),
            ("rsd".into(), vec![("0".into(), arm)]),
        ];
        let chosen = Chosen {
            drop_from: Some(16),
            depth_lengths: vec![8, 16],
        };
        let p = paired(&arms, "std", &chosen, 200, 0).unwrap();
        let by: BTreeMap<&str, &Measure> = p.arms[0]
            .measures
            .iter()
            .map(|m| (m.name.as_str(), m))
            .collect();
        // The drop from 16 (0.5) to 32 (0.25), not from the shortest.
        assert!(!by.contains_key("drop@8→32"));
        assert_eq!(
            (by["drop@16→32"].baseline, by["drop@16→32"].arm),
            (0.25, 0.0)
        );
        // depth_sd at 8 is 0 and at 16 is 0.5 for the baseline: their mean is 0.25.
        let sd = by["depth_sd@8+16"];
        assert!(sd.primary && sd.depth_shuffle_floor.is_some());
        assert_eq!((sd.baseline, sd.arm, sd.diff), (0.25, 0.0, -0.25));
        // One depth length is its own depth_sd: no mean is added.
        let one = Chosen {
            drop_from: None,
            depth_lengths: vec![16],
        };
        let p = paired(&arms, "std", &one, 200, 0).unwrap();
        let names: Vec<&str> = p.arms[0].measures.iter().map(|m| m.name.as_str()).collect();
        assert!(names.contains(&"drop@8→32") && !names.iter().any(|n| n.contains('+')));
        // A length no item has is named in the error.
        let bad = Chosen {
            drop_from: Some(24),
            depth_lengths: vec![],
        };
        let e = paired(&arms, "std", &bad, 200, 0).unwrap_err().to_string();
        assert!(
            e.contains("--drop-from 24") && e.contains("8, 16, 32"),
            "{e}"
        );
    }

    #[test]
    fn measures_and_their_differences_on_all_the_data() {
        // Baseline: 1 at depth 0, 0 at depth 1 (depth matters); arm: 0.5 everywhere.
        let base = records(4, |_, d, _| if d == 0.0 { 1.0 } else { 0.0 });
        let arm = records(4, |_, _, s| if s % 2 == 0 { 1.0 } else { 0.0 });
        let arms: Arms = vec![
            (
                "std".into(),
                vec![("0".into(), base.clone()), ("1".into(), base)],
            ),
            (
                "rsd".into(),
                vec![("0".into(), arm.clone()), ("1".into(), arm)],
            ),
        ];
        let p = paired(&arms, "std", &Chosen::default(), 500, 0).unwrap();
        assert_eq!(p.arms.len(), 1);
        let a = &p.arms[0];
        assert_eq!(
            (a.label.as_str(), a.items, a.replicas.len()),
            ("rsd", 16, 2)
        );
        let by: BTreeMap<&str, &Measure> =
            a.measures.iter().map(|m| (m.name.as_str(), m)).collect();
        assert_eq!(by["accuracy@8"].diff, 0.0);
        assert_eq!(by["depth_sd@8"].baseline, 0.5);
        assert_eq!(by["depth_sd@8"].arm, 0.0);
        assert_eq!(by["depth_sd@16"].diff, -0.5);
        assert_eq!(by["drop@8→16"].diff, 0.0);
        assert!(!by["logprob@8"].primary && by["logprob@8"].diff == 0.0);
        assert!(!by["greedy@16"].primary);
        assert_eq!((by["greedy@16"].arm, by["greedy@16"].baseline), (0.5, 0.5));
        // Equal accuracies: resampled items move the difference both ways around 0.
        let acc = by["accuracy@8"];
        assert!(acc.ci[0] <= 0.0 && acc.ci[1] >= 0.0, "{acc:?}");
        let md = p.markdown();
        assert!(md.contains("| depth_sd@16 | 0.0000 (floor "), "{md}");
        assert!(
            md.contains(" | 0.5000 (floor ") && md.contains(") | -0.5000 | ["),
            "{md}"
        );
        assert!(md.contains("logprob@8 (secondary)"), "{md}");
    }

    #[test]
    fn the_interval_covers_a_known_difference_and_is_paired() {
        // The arm is the baseline plus 0.25 on every item of replica 0 and nothing else: the
        // difference is 0.125 overall, and pairing makes the items' own variation cancel.
        let noisy = |s: usize| ((s * 7919) % 13) as f64 / 13.0;
        let base = records(32, |_, _, s| noisy(s));
        let up = records(32, |_, _, s| noisy(s) + 0.25);
        let arms: Arms = vec![
            (
                "std".into(),
                vec![("0".into(), base.clone()), ("1".into(), base.clone())],
            ),
            ("rsd".into(), vec![("0".into(), up), ("1".into(), base)]),
        ];
        let p = paired(&arms, "std", &Chosen::default(), 2000, 3).unwrap();
        let acc = &p.arms[0].measures[0];
        assert_eq!(acc.name, "accuracy@8");
        assert!((acc.diff - 0.125).abs() < 1e-12, "{acc:?}");
        // Replica resampling alone moves it (0, 0.125 or 0.25): the interval spans that, and
        // the items' variation (which pairing removes) adds nothing.
        assert!(acc.ci[0] >= -1e-12 && acc.ci[1] <= 0.25 + 1e-12, "{acc:?}");
        assert!(acc.ci[0] < 0.1 && acc.ci[1] > 0.15, "{acc:?}");
        // The same seed gives the same interval.
        assert_eq!(
            paired(&arms, "std", &Chosen::default(), 2000, 3).unwrap(),
            p
        );
    }

    #[test]
    fn unpairable_inputs_are_refused_by_name() {
        let r = records(2, |_, _, _| 1.0);
        let arms: Arms = vec![
            ("std".into(), vec![("0".into(), r.clone())]),
            ("rsd".into(), vec![("7".into(), r.clone())]),
        ];
        let e = paired(&arms, "std", &Chosen::default(), 200, 0)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("share no replica") && e.contains("--replicas"),
            "{e}"
        );
        let e = paired(&arms, "base", &Chosen::default(), 200, 0)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--baseline base") && e.contains("std, rsd"),
            "{e}"
        );
        let e = paired(&arms, "std", &Chosen::default(), 10, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least 100"), "{e}");
        let mut twice = r.clone();
        twice.push(r[0].clone());
        let arms: Arms = vec![
            ("std".into(), vec![("0".into(), twice)]),
            ("rsd".into(), vec![("0".into(), r)]),
        ];
        let e = paired(&arms, "std", &Chosen::default(), 200, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("recorded twice"), "{e}");
    }
}
