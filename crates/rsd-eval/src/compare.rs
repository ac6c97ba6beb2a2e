//! `rsd-eval compare RUN_A RUN_B … --out DIR`: several runs (say a standard and an RSD
//! checkpoint) on the same items, in one figure and one table.
//!
//! Only the (task, length) pairs present in **every** run are compared, so each run is measured on
//! the same kind of items; runs that share none are refused, by name. Within those pairs:
//!
//! * `accuracy_by_depth.{png,svg,json}`: one line per run, accuracy vs needle depth, the lengths
//!   pooled (each record weighs the same: a long-context checkpoint is compared on its average
//!   over the shared lengths, per-length lines would multiply the lines by the lengths).
//! * `accuracy_by_depth_and_length.{png,svg,json}`: one line per run and shared length, each
//!   named with its items per point ("before, L=1024 (n=4)"): a window's own length next to the
//!   lengths beyond it.
//! * `compare.md`: rows = runs; columns = each shared length (all depths), each depth (all shared
//!   lengths), `all`; cells `mean ± spread` as [`crate::plot::cell`] defines them.
//! * `compare.json`: the same table as numbers.
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{io_err, EvalError};
use crate::figure::{Figure, Lines, Series};
use crate::paired::{paired, Arms, Chosen, Paired};
use crate::plot::{cell, sorted_unique, Cell};
use crate::results::{read_results, ItemResult};
use crate::run::write_atomic;
use rsd_common::printable::{printable, shortened};

/// Arguments of `rsd-eval compare`.
#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    /// Run directories, each holding a results.jsonl.
    #[arg(required = true, num_args = 1..)]
    pub runs: Vec<PathBuf>,
    /// Where compare.md, compare.json and the figure go.
    #[arg(long)]
    pub out: PathBuf,
    /// Names of the runs in the table and legend, comma-separated, one per run (default: each
    /// run directory's name). Runs given the same name are replicas (e.g. training seeds) and
    /// become one row: the mean over all their records, ± the spread over the replicas' means.
    #[arg(long, value_delimiter = ',')]
    pub labels: Option<Vec<String>>,
    /// Replica names, comma-separated, one per run (default: each run's position among the runs
    /// of its label). Runs with the same label and replica are one replica's records (say, the
    /// evaluations of one seed's model at several lengths); with --baseline, replica `r` of an
    /// arm is paired with replica `r` of the baseline.
    #[arg(long, value_delimiter = ',')]
    pub replicas: Option<Vec<String>>,
    /// The label every other label is compared with: paired differences (same replicas, same
    /// items) of accuracy per length, its standard deviation over depths, the drop from the
    /// shortest to the longest length and (secondary) the answer's log-probability, each with a
    /// 95% bootstrap interval over replicas and items.
    #[arg(long)]
    pub baseline: Option<String>,
    /// With --baseline: the length the drop is measured from, to the longest (default: the
    /// shortest), e.g. the longest trained length where the baseline is above chance.
    #[arg(long, value_name = "LENGTH")]
    pub drop_from: Option<usize>,
    /// With --baseline: two or more lengths whose depth_sd is also compared as one measure,
    /// their mean (`depth_sd@512+768`), e.g. the lengths a design chose for depth in advance.
    #[arg(long, value_delimiter = ',', value_name = "LENGTHS")]
    pub depth_lengths: Option<Vec<usize>>,
    /// Bootstrap resamples for --baseline's intervals.
    #[arg(long, default_value_t = 2000)]
    pub bootstrap: usize,
    /// Seed of the bootstrap's resampling.
    #[arg(long, default_value_t = 0)]
    pub bootstrap_seed: u64,
}

/// One run's row of the table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// The run's label.
    pub label: String,
    /// The run directory.
    pub run: PathBuf,
    /// One entry per column; `null` where the run has no records for it.
    pub cells: Vec<Option<Cell>>,
}

/// The comparison: what `compare.json` holds and `compare.md` shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// Tasks shared by every run (within the shared pairs).
    pub tasks: Vec<String>,
    /// Lengths shared by every run (within the shared pairs).
    pub lengths: Vec<usize>,
    /// Depths present in the shared records.
    pub depths: Vec<f64>,
    /// Column names: `L=<length>`…, `d=<depth>`…, `all`.
    pub columns: Vec<String>,
    /// One row per run, in the order given.
    pub rows: Vec<Row>,
    /// Per run, the (task, length) pairs left out because another run lacks them.
    pub left_out: Vec<Vec<(String, usize)>>,
    /// With `--baseline`: the paired differences.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paired: Option<Paired>,
    /// Per run, per shared length, per depth: the cell (the per-length figure's points).
    #[serde(skip)]
    pub by_length_depth: Vec<Vec<Vec<Option<Cell>>>>,
}

type Pairs = BTreeSet<(String, usize)>;

fn pairs(items: &[ItemResult]) -> Pairs {
    items.iter().map(|r| (r.task.clone(), r.length)).collect()
}

fn describe(run: &Path, p: &Pairs) -> String {
    let tasks: BTreeSet<&str> = p.iter().map(|(t, _)| t.as_str()).collect();
    let lengths: BTreeSet<usize> = p.iter().map(|(_, l)| *l).collect();
    let tasks: Vec<&str> = tasks.into_iter().collect();
    let lengths: Vec<String> = lengths.iter().map(usize::to_string).collect();
    // Task names come from the records: escaped, and the lists cut to a readable length.
    format!(
        "{} has tasks {} at lengths {}",
        run.display(),
        shortened(&tasks.join(", ")),
        shortened(&lengths.join(", "))
    )
}

/// Compares runs given as (label, directory, records).
pub fn compare(runs: &[(String, PathBuf, Vec<ItemResult>)]) -> Result<Comparison, EvalError> {
    let sets: Vec<Pairs> = runs.iter().map(|(_, _, items)| pairs(items)).collect();
    let common = common_pairs(runs, &sets)?;
    let shared: Vec<Vec<&ItemResult>> = runs
        .iter()
        .map(|(_, _, items)| {
            items
                .iter()
                .filter(|r| common.contains(&(r.task.clone(), r.length)))
                .collect()
        })
        .collect();
    let lengths: Vec<usize> = common
        .iter()
        .map(|(_, l)| *l)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let tasks: Vec<String> = common
        .iter()
        .map(|(t, _)| t.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let depths = sorted_unique(shared.iter().flatten().filter_map(|r| r.depth));
    let mut columns: Vec<String> = lengths.iter().map(|l| format!("L={l}")).collect();
    columns.extend(depths.iter().map(|d| format!("d={d}")));
    columns.push("all".into());
    let by_length_depth = shared
        .iter()
        .map(|items| by_length_and_depth(items, &lengths, &depths))
        .collect();
    let rows = runs
        .iter()
        .zip(&shared)
        .map(|((label, dir, _), items)| Row {
            label: label.clone(),
            run: dir.clone(),
            cells: row_cells(items, &lengths, &depths),
        })
        .collect();
    let left_out = sets
        .iter()
        .map(|s| s.difference(&common).cloned().collect())
        .collect();
    Ok(Comparison {
        tasks,
        lengths,
        depths,
        columns,
        rows,
        left_out,
        paired: None,
        by_length_depth,
    })
}

/// The (task, length) pairs every run has (`sets`, one per run). Two runs that share none, or
/// runs with none common to all, are refused, naming what each has.
fn common_pairs(
    runs: &[(String, PathBuf, Vec<ItemResult>)],
    sets: &[Pairs],
) -> Result<Pairs, EvalError> {
    for i in 0..runs.len() {
        for j in i + 1..runs.len() {
            if sets[i].is_disjoint(&sets[j]) {
                return Err(EvalError::Input(format!(
                    "runs {} and {} share no (task, length) to compare: {}; {}",
                    runs[i].1.display(),
                    runs[j].1.display(),
                    describe(&runs[i].1, &sets[i]),
                    describe(&runs[j].1, &sets[j])
                )));
            }
        }
    }
    let mut common = sets[0].clone();
    for s in &sets[1..] {
        common = common.intersection(s).cloned().collect();
    }
    if common.is_empty() {
        let all: Vec<String> = runs
            .iter()
            .zip(sets)
            .map(|((_, dir, _), s)| describe(dir, s))
            .collect();
        return Err(EvalError::Input(format!(
            "no (task, length) is in every run: {}",
            all.join("; ")
        )));
    }
    Ok(common)
}

/// One run's cells per shared length, per depth (the per-length figure's points): the records
/// grouped once, then each cell looked up.
fn by_length_and_depth(
    items: &[&ItemResult],
    lengths: &[usize],
    depths: &[f64],
) -> Vec<Vec<Option<Cell>>> {
    let mut groups: HashMap<(usize, u64), Vec<&ItemResult>> = HashMap::new();
    for r in items {
        if let Some(d) = r.depth {
            groups.entry((r.length, d.to_bits())).or_default().push(r);
        }
    }
    lengths
        .iter()
        .map(|&l| {
            depths
                .iter()
                .map(|&d| {
                    groups
                        .get(&(l, d.to_bits()))
                        .and_then(|v| cell(v.iter().copied()))
                })
                .collect()
        })
        .collect()
}

/// One run's row of the table: a cell per length (all depths), per depth (all lengths), and
/// over all its shared records; the records grouped once per kind of column.
fn row_cells(items: &[&ItemResult], lengths: &[usize], depths: &[f64]) -> Vec<Option<Cell>> {
    let mut by_length: HashMap<usize, Vec<&ItemResult>> = HashMap::new();
    let mut by_depth: HashMap<u64, Vec<&ItemResult>> = HashMap::new();
    for &r in items {
        by_length.entry(r.length).or_default().push(r);
        if let Some(d) = r.depth {
            by_depth.entry(d.to_bits()).or_default().push(r);
        }
    }
    let mut cells: Vec<Option<Cell>> = lengths
        .iter()
        .map(|l| by_length.get(l).and_then(|v| cell(v.iter().copied())))
        .collect();
    cells.extend(depths.iter().map(|d| {
        by_depth
            .get(&d.to_bits())
            .and_then(|v| cell(v.iter().copied()))
    }));
    cells.push(cell(items.iter().copied()));
    cells
}

impl Comparison {
    /// The Markdown table (`mean ± spread`, three decimals; `–` for an empty cell).
    pub fn markdown(&self) -> String {
        let mut s = format!("| run | {} |\n", self.columns.join(" | "));
        s += &format!("|---|{}\n", "---|".repeat(self.columns.len()));
        for row in &self.rows {
            let cells: Vec<String> = row
                .cells
                .iter()
                .map(|c| c.map_or("–".into(), |c| format!("{:.3} ± {:.3}", c.mean, c.spread)))
                .collect();
            s += &format!("| {} | {} |\n", printable(&row.label), cells.join(" | "));
        }
        s
    }

    /// The whole `compare.md`: what was compared, the table, and how to read it.
    pub fn report(&self) -> String {
        let lengths: Vec<String> = self.lengths.iter().map(usize::to_string).collect();
        // Task names come from results.jsonl, anyone's: terminal control sequences in them would
        // run when compare.md is printed, so they are escaped as every message is.
        let tasks: Vec<String> = self.tasks.iter().map(|t| printable(t).into()).collect();
        let mut s = format!(
            "# Comparison\n\nTasks: {}. Lengths: {}.\n\n",
            shortened(&tasks.join(", ")),
            lengths.join(", ")
        );
        s += &self.markdown();
        s += "\nCells: mean score over the records ± the standard deviation, over sample \
              indices, of each sample index's mean score; for runs given one label together \
              (replicas, e.g. training seeds), over the replicas' mean scores instead. `L=` \
              columns pool all depths, `d=` columns all shared lengths.\n";
        for (row, left) in self.rows.iter().zip(&self.left_out) {
            if !left.is_empty() {
                let l: Vec<String> = left
                    .iter()
                    .map(|(t, n)| format!("{}@{n}", printable(t)))
                    .collect();
                s += &format!(
                    "\nLeft out of {} (not in every run): {}.\n",
                    row.label,
                    l.join(", ")
                );
            }
        }
        if let Some(p) = &self.paired {
            s += "\n";
            s += &p.markdown();
        }
        s
    }

    /// Accuracy vs depth, one line per run, shared lengths pooled.
    pub fn figure(&self) -> Lines {
        let first = self.lengths.len();
        let series = self
            .rows
            .iter()
            .map(|row| Series {
                name: row.label.clone(),
                x: self.depths.clone(),
                y: row.cells[first..first + self.depths.len()]
                    .iter()
                    .map(|c| c.map(|c| c.mean))
                    .collect(),
            })
            .collect();
        Lines {
            title: "Accuracy by needle depth (shared lengths pooled)".into(),
            x_label: "needle depth (fraction of the context)".into(),
            y_label: "accuracy (mean score)".into(),
            y_range: Some((0.0, 1.05)),
            series,
        }
    }
}

impl Comparison {
    /// Accuracy vs depth, one line per run and shared length, named with the items behind each
    /// point: `n=K` when every depth has K items, `n=K–M` when they differ.
    pub fn figure_by_length(&self) -> Lines {
        let mut series = Vec::new();
        for (row, per_length) in self.rows.iter().zip(&self.by_length_depth) {
            for (l, cells) in self.lengths.iter().zip(per_length) {
                let counts: Vec<usize> = cells.iter().flatten().map(|c| c.items).collect();
                let (lo, hi) = (
                    counts.iter().min().copied().unwrap_or(0),
                    counts.iter().max().copied().unwrap_or(0),
                );
                let n = if lo == hi {
                    format!("n={lo}")
                } else {
                    format!("n={lo}–{hi}")
                };
                series.push(Series {
                    name: format!("{}, L={l} ({n})", row.label),
                    x: self.depths.clone(),
                    y: cells.iter().map(|c| c.map(|c| c.mean)).collect(),
                });
            }
        }
        Lines {
            title: "Accuracy by needle depth, per length (n: items per point)".into(),
            x_label: "needle depth (fraction of the context)".into(),
            y_label: "accuracy (mean score)".into(),
            y_range: Some((0.0, 1.05)),
            series,
        }
    }
}

/// Runs given the same label are replicas of one setting (say, training seeds): they become one
/// run whose records are all of theirs, each record's `sample` replaced by its replica's index,
/// so that a cell's spread is the standard deviation over the replicas' means. Replicas must
/// hold the same (task, length) pairs; the pooled run is named by its first directory.
pub fn pool_replicas(
    runs: Vec<(String, PathBuf, Vec<ItemResult>)>,
) -> Result<Vec<(String, PathBuf, Vec<ItemResult>)>, EvalError> {
    let mut groups: Vec<Vec<(String, PathBuf, Vec<ItemResult>)>> = Vec::new();
    for run in runs {
        match groups.iter_mut().find(|g| g[0].0 == run.0) {
            Some(g) => g.push(run),
            None => groups.push(vec![run]),
        }
    }
    groups
        .into_iter()
        .map(|group| {
            if group.len() == 1 {
                // One run under its label keeps its samples: its spread is over samples.
                return Ok(group.into_iter().next().expect("a group has a run"));
            }
            let want = pairs(&group[0].2);
            let (label, dir) = (group[0].0.clone(), group[0].1.clone());
            let mut items = Vec::new();
            for (replica, (_, d, mut its)) in group.into_iter().enumerate() {
                let got = pairs(&its);
                if got != want {
                    return Err(EvalError::Input(format!(
                        "runs labelled {label} are pooled as replicas and must hold the same \
                         (task, length) pairs: {}; {}",
                        describe(&dir, &want),
                        describe(&d, &got)
                    )));
                }
                its.iter_mut().for_each(|r| r.sample = replica);
                items.extend(its);
            }
            Ok((label, dir, items))
        })
        .collect()
}

/// `rsd-eval compare`: writes the table, its numbers and the figure; returns the table.
pub fn command(args: &CompareArgs) -> Result<String, EvalError> {
    let labels: Vec<String> = match &args.labels {
        Some(l) if l.len() != args.runs.len() => {
            return Err(EvalError::Input(format!(
                "--labels names {} runs, {} were given",
                l.len(),
                args.runs.len()
            )))
        }
        Some(l) => l.clone(),
        None => args
            .runs
            .iter()
            .map(|r| {
                r.file_name()
                    .map_or_else(|| r.display().to_string(), |n| n.to_string_lossy().into())
            })
            .collect(),
    };
    let replicas: Vec<String> = match &args.replicas {
        Some(r) if r.len() != args.runs.len() => {
            return Err(EvalError::Input(format!(
                "--replicas names {} runs, {} were given",
                r.len(),
                args.runs.len()
            )))
        }
        Some(r) => r.clone(),
        None => labels
            .iter()
            .enumerate()
            .map(|(i, l)| labels[..i].iter().filter(|x| *x == l).count().to_string())
            .collect(),
    };
    // One entry per (label, replica): the records of all its runs.
    let mut merged: Vec<(String, String, PathBuf, Vec<ItemResult>)> = Vec::new();
    for ((label, replica), dir) in labels.into_iter().zip(replicas).zip(&args.runs) {
        let path = dir.join("results.jsonl");
        let items = read_results(&path)?;
        if items.is_empty() {
            return Err(EvalError::Input(format!(
                "{}: no result records",
                path.display()
            )));
        }
        match merged
            .iter_mut()
            .find(|(l, r, _, _)| *l == label && *r == replica)
        {
            Some(m) => m.3.extend(items),
            None => merged.push((label, replica, dir.clone(), items)),
        }
    }
    let paired = match &args.baseline {
        Some(base) => {
            let mut arms: Arms = Vec::new();
            for (label, replica, _, items) in &merged {
                match arms.iter_mut().find(|(l, _)| l == label) {
                    Some(a) => a.1.push((replica.clone(), items.clone())),
                    None => arms.push((label.clone(), vec![(replica.clone(), items.clone())])),
                }
            }
            let chosen = Chosen {
                drop_from: args.drop_from,
                depth_lengths: args.depth_lengths.clone().unwrap_or_default(),
            };
            Some(paired(
                &arms,
                base,
                &chosen,
                args.bootstrap,
                args.bootstrap_seed,
            )?)
        }
        None => None,
    };
    let runs = merged
        .into_iter()
        .map(|(label, _, dir, items)| (label, dir, items))
        .collect();
    let mut cmp = compare(&pool_replicas(runs)?)?;
    cmp.paired = paired;
    std::fs::create_dir_all(&args.out).map_err(io_err(&args.out))?;
    // Atomically: a link planted at a name is replaced, its target never written.
    let write = |name: &str, text: String| write_atomic(&args.out.join(name), text.as_bytes());
    write("compare.md", cmp.report())?;
    let json = serde_json::to_string_pretty(&cmp).map_err(|e| EvalError::Json {
        path: args.out.join("compare.json"),
        reason: e.to_string(),
    })?;
    write("compare.json", json + "\n")?;
    Figure::Lines(cmp.figure()).write(&args.out, "accuracy_by_depth")?;
    Figure::Lines(cmp.figure_by_length()).write(&args.out, "accuracy_by_depth_and_length")?;
    Ok(match &cmp.paired {
        Some(p) => format!("{}\n{}", cmp.markdown(), p.markdown()),
        None => cmp.markdown(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plot::tests::item;

    fn run(name: &str, items: Vec<ItemResult>) -> (String, PathBuf, Vec<ItemResult>) {
        (name.into(), PathBuf::from(name), items)
    }

    #[test]
    fn same_label_runs_pool_as_replicas_with_their_spread() {
        // Two seeds of "rsd" (means 1.0 and 0.5) and one "std" run with two samples.
        let seed0 = run(
            "rsd",
            vec![item(8, Some(0.0), 0, 1.0), item(8, Some(0.0), 1, 1.0)],
        );
        let seed1 = run(
            "rsd",
            vec![item(8, Some(0.0), 0, 0.0), item(8, Some(0.0), 1, 1.0)],
        );
        let std = run(
            "std",
            vec![item(8, Some(0.0), 0, 0.0), item(8, Some(0.0), 1, 1.0)],
        );
        let pooled = pool_replicas(vec![seed0, std, seed1]).unwrap();
        assert_eq!(pooled.len(), 2);
        let c = compare(&pooled).unwrap();
        let rsd = c.rows[0].cells[2].unwrap();
        assert_eq!(c.rows[0].label, "rsd");
        assert_eq!(
            (rsd.mean, rsd.spread, rsd.items, rsd.samples),
            (0.75, 0.25, 4, 2)
        );
        let std = c.rows[1].cells[2].unwrap();
        assert_eq!((std.mean, std.spread, std.samples), (0.5, 0.5, 2));

        let other = run("rsd", vec![item(16, Some(0.0), 0, 1.0)]);
        let seed0 = run("rsd", vec![item(8, Some(0.0), 0, 1.0)]);
        let e = pool_replicas(vec![seed0, other]).unwrap_err().to_string();
        assert!(
            e.contains("labelled rsd") && e.contains("lengths 16"),
            "{e}"
        );
    }

    #[test]
    fn task_names_and_labels_from_the_records_are_escaped_in_compare_md() {
        let hostile = "\u{1b}]0;owned\u{7}\u{1b}[31mtask";
        let with_task = |score| ItemResult {
            task: hostile.into(),
            ..item(8, Some(0.0), 0, score)
        };
        let c = compare(&[
            run("a\u{1b}[2J", vec![with_task(1.0)]),
            run("b", vec![with_task(0.0)]),
        ])
        .unwrap();
        let md = c.report();
        assert!(!md.contains('\u{1b}') && !md.contains('\u{7}'), "{md:?}");
        assert!(md.contains("task"), "{md}");
    }

    #[test]
    fn compares_only_what_every_run_has() {
        let a = run(
            "a",
            vec![
                item(8, Some(0.0), 0, 1.0),
                item(8, Some(1.0), 1, 0.0),
                item(16, Some(0.0), 0, 1.0),
            ],
        );
        let b = run(
            "b",
            vec![item(8, Some(0.0), 0, 0.5), item(8, Some(1.0), 0, 0.5)],
        );
        let c = compare(&[a, b]).unwrap();
        assert_eq!(c.lengths, vec![8]);
        assert_eq!(c.columns, vec!["L=8", "d=0", "d=1", "all"]);
        let a_all = c.rows[0].cells[3].unwrap();
        assert_eq!((a_all.mean, a_all.spread), (0.5, 0.5));
        assert_eq!(c.left_out[0], vec![("niah_single_1".to_string(), 16)]);
        assert!(c
            .markdown()
            .contains("| a | 0.500 ± 0.500 | 1.000 ± 0.000 |"));
        assert_eq!(c.figure().series[1].y, vec![Some(0.5), Some(0.5)]);
        let by_length = c.figure_by_length();
        let names: Vec<&str> = by_length.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, vec!["a, L=8 (n=1)", "b, L=8 (n=1)"]);
        assert_eq!(by_length.series[0].y, vec![Some(1.0), Some(0.0)]);
    }

    #[test]
    fn refuses_disjoint_runs_by_name() {
        let a = run("runs/std", vec![item(8, Some(0.0), 0, 1.0)]);
        let b = run("runs/rsd", vec![item(16, Some(0.0), 0, 1.0)]);
        let err = compare(&[a, b]).unwrap_err().to_string();
        assert!(
            err.contains("runs/std") && err.contains("runs/rsd"),
            "{err}"
        );
    }
}
