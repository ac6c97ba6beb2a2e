//! `rsd-eval plot RUN/`: the figures of one run, from `RUN/results.jsonl` (and `RUN/ppl.json`
//! when `rsd-eval ppl` wrote one there) into `RUN/plots/`.
//!
//! Every figure pools the tasks: a cell's accuracy is the mean `score` of all its records, each
//! record weighing the same ([`cell`]). The figures (docs/EVAL.md, "Plots"):
//!
//! | file stem | shows |
//! |---|---|
//! | `accuracy_by_depth` | accuracy vs needle depth, one line per context length (records with a depth) |
//! | `depth_length_heatmap` | the same cells as a depth × length matrix, values written in the cells |
//! | `accuracy_by_length` | accuracy vs context length, all records |
//! | `ppl_by_position`, `view_gap_by_position` | from `ppl.json` (drawn by [`crate::ppl`]) |
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::EvalError;
use crate::figure::{Figure, FigureError, Heatmap, Lines, Series};
use crate::lines::json_message;
use crate::ppl::{write_ppl_figures, PplReport};
use crate::results::{read_results, ItemResult};

/// The aggregate of one cell (a set of records): what every figure and table shows.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Cell {
    /// Mean score over the cell's records.
    pub mean: f64,
    /// Spread over samples: the population standard deviation, over the sample indices present,
    /// of each sample index's mean score within the cell (0 with one sample index).
    pub spread: f64,
    /// Records in the cell.
    pub items: usize,
    /// Distinct sample indices in the cell.
    pub samples: usize,
}

/// The aggregate of some records; `None` when there are none.
pub fn cell<'a>(items: impl IntoIterator<Item = &'a ItemResult>) -> Option<Cell> {
    let mut by_sample: BTreeMap<usize, (f64, usize)> = BTreeMap::new();
    let (mut sum, mut n) = (0.0, 0usize);
    for it in items {
        sum += it.score;
        n += 1;
        let e = by_sample.entry(it.sample).or_insert((0.0, 0));
        e.0 += it.score;
        e.1 += 1;
    }
    if n == 0 {
        return None;
    }
    let means: Vec<f64> = by_sample.values().map(|&(s, k)| s / k as f64).collect();
    let m = means.iter().sum::<f64>() / means.len() as f64;
    let var = means.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / means.len() as f64;
    Some(Cell {
        mean: sum / n as f64,
        spread: var.sqrt(),
        items: n,
        samples: means.len(),
    })
}

/// Distinct values, sorted (depths compare by value; they come from a fixed grid).
pub fn sorted_unique(values: impl IntoIterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = values.into_iter().collect();
    v.sort_by(f64::total_cmp);
    v.dedup();
    v
}

/// Context lengths present, sorted.
pub fn lengths(items: &[ItemResult]) -> Vec<usize> {
    let mut v: Vec<usize> = items.iter().map(|r| r.length).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Depths present (records with a depth), sorted.
pub fn depths(items: &[ItemResult]) -> Vec<f64> {
    sorted_unique(items.iter().filter_map(|r| r.depth))
}

/// The records grouped by (length, depth bits) in one pass, so that every figure looks its cells
/// up instead of scanning all records per cell: the figures cost the records plus their cells.
pub(crate) fn by_length_depth(
    items: &[ItemResult],
) -> HashMap<(usize, Option<u64>), Vec<&ItemResult>> {
    let mut m: HashMap<(usize, Option<u64>), Vec<&ItemResult>> = HashMap::new();
    for r in items {
        m.entry((r.length, r.depth.map(f64::to_bits)))
            .or_default()
            .push(r);
    }
    m
}

/// The mean of the cell (length `l`, depth `d`) of `groups`, if it has records.
fn mean_at(
    groups: &HashMap<(usize, Option<u64>), Vec<&ItemResult>>,
    l: usize,
    d: f64,
) -> Option<f64> {
    groups
        .get(&(l, Some(d.to_bits())))
        .and_then(|v| cell(v.iter().copied()))
        .map(|c| c.mean)
}

/// Lengths present among records with a depth, sorted.
fn lengths_with_depth(items: &[ItemResult]) -> Vec<usize> {
    let mut v: Vec<usize> = items
        .iter()
        .filter(|r| r.depth.is_some())
        .map(|r| r.length)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Accuracy vs depth, one series per length (named `L=<length>`).
pub fn accuracy_by_depth(items: &[ItemResult]) -> Lines {
    let ds = depths(items);
    let groups = by_length_depth(items);
    let series = lengths_with_depth(items)
        .into_iter()
        .map(|l| Series {
            name: format!("L={l}"),
            x: ds.clone(),
            y: ds.iter().map(|&d| mean_at(&groups, l, d)).collect(),
        })
        .collect();
    Lines {
        title: "Accuracy by needle depth".into(),
        x_label: "needle depth (fraction of the context)".into(),
        y_label: "accuracy (mean score)".into(),
        y_range: Some((0.0, 1.05)),
        series,
    }
}

/// The depth × length matrix of mean scores (records with a depth).
pub fn depth_length_heatmap(items: &[ItemResult]) -> Heatmap {
    let ds = depths(items);
    let ls = lengths_with_depth(items);
    let groups = by_length_depth(items);
    let values = ds
        .iter()
        .map(|&d| ls.iter().map(|&l| mean_at(&groups, l, d)).collect())
        .collect();
    Heatmap {
        title: "Accuracy by depth and context length".into(),
        x_label: "context length (tokens)".into(),
        y_label: "needle depth (fraction of the context)".into(),
        columns: ls.iter().map(|&l| l as f64).collect(),
        rows: ds,
        values,
    }
}

/// Accuracy vs context length over all records (one series, `all tasks`).
pub fn accuracy_by_length(items: &[ItemResult]) -> Lines {
    let mut by_length: BTreeMap<usize, Vec<&ItemResult>> = BTreeMap::new();
    for r in items {
        by_length.entry(r.length).or_default().push(r);
    }
    let y = by_length
        .values()
        .map(|v| cell(v.iter().copied()).map(|c| c.mean))
        .collect();
    Lines {
        title: "Accuracy by context length".into(),
        x_label: "context length (tokens)".into(),
        y_label: "accuracy (mean score)".into(),
        y_range: Some((0.0, 1.05)),
        series: vec![Series {
            name: "all tasks".into(),
            x: by_length.keys().map(|&l| l as f64).collect(),
            y,
        }],
    }
}

/// Writes the figures of `items` into `dir`; returns the files written.
pub fn write_result_figures(items: &[ItemResult], dir: &Path) -> Result<Vec<PathBuf>, FigureError> {
    let mut out = Vec::new();
    if items.iter().any(|r| r.depth.is_some()) {
        out.extend(Figure::Lines(accuracy_by_depth(items)).write(dir, "accuracy_by_depth")?);
        out.extend(
            Figure::Heatmap(depth_length_heatmap(items)).write(dir, "depth_length_heatmap")?,
        );
    }
    out.extend(Figure::Lines(accuracy_by_length(items)).write(dir, "accuracy_by_length")?);
    Ok(out)
}

/// Arguments of `rsd-eval plot`.
#[derive(Debug, Clone, clap::Args)]
pub struct PlotArgs {
    /// The run directory: reads RUN/results.jsonl (and RUN/ppl.json if present), writes RUN/plots/.
    pub run: PathBuf,
    /// Write the figures here instead of RUN/plots.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// The largest `ppl.json` read (its per-row views take a few dozen bytes a row).
pub const MAX_PPL_JSON_BYTES: u64 = 256 << 20;

/// Reads `RUN/ppl.json` (a regular file of at most [`MAX_PPL_JSON_BYTES`]), every value checked
/// ([`PplReport::invalid_field`]).
pub fn read_ppl(path: &Path) -> Result<PplReport, EvalError> {
    let text = rsd_common::safe_fs::read_text(path, MAX_PPL_JSON_BYTES, "ppl.json")
        .map_err(|e| EvalError::Input(e.to_string()))?;
    let report: PplReport = serde_json::from_str(&text).map_err(|e| EvalError::Json {
        path: path.to_path_buf(),
        reason: json_message(&e),
    })?;
    match report.invalid_field() {
        Some((field, message)) => Err(EvalError::Input(format!(
            "{}: field {field}: {message}",
            path.display()
        ))),
        None => Ok(report),
    }
}

/// `rsd-eval plot`: writes the figures; returns a line per file written, for the user.
pub fn command(args: &PlotArgs) -> Result<String, EvalError> {
    let out = match &args.out {
        Some(out) => out.clone(),
        None => {
            // The run's own plots directory: a link planted there is not written through.
            let plots = args.run.join("plots");
            rsd_common::safe_fs::create_own_dir(&plots)
                .map_err(|e| EvalError::Input(e.to_string()))?;
            plots
        }
    };
    let results = args.run.join("results.jsonl");
    let ppl = args.run.join("ppl.json");
    let mut written = Vec::new();
    // A ppl-only directory (`rsd-eval ppl --out RUN`) plots without results.jsonl.
    if results.exists() || !ppl.exists() {
        let items = read_results(&results)?;
        if items.is_empty() {
            return Err(EvalError::Input(format!(
                "{}: no result records to plot",
                results.display()
            )));
        }
        written.extend(write_result_figures(&items, &out)?);
    }
    if ppl.exists() {
        written.extend(write_ppl_figures(&read_ppl(&ppl)?, &out)?);
    }
    Ok(written
        .iter()
        .map(|p| format!("wrote {}", p.display()))
        .collect::<Vec<_>>()
        .join("\n"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn item(length: usize, depth: Option<f64>, sample: usize, score: f64) -> ItemResult {
        ItemResult {
            task: "niah_single_1".into(),
            length,
            depth,
            sample,
            expected: vec!["1".into()],
            output: String::new(),
            score,
            prompt_tokens: length,
            logprob: None,
            rank: None,
            candidates: None,
            greedy: None,
            score_norm: None,
        }
    }

    #[test]
    fn cell_mean_and_spread_over_samples() {
        // Sample 0 means 1.0 (two records), sample 1 means 0.0: spread 0.5; mean over records.
        let items = [
            item(8, Some(0.0), 0, 1.0),
            item(8, Some(0.5), 0, 1.0),
            item(8, Some(0.0), 1, 0.0),
        ];
        let c = cell(&items).unwrap();
        assert!((c.mean - 2.0 / 3.0).abs() < 1e-12);
        assert!((c.spread - 0.5).abs() < 1e-12);
        assert_eq!((c.items, c.samples), (3, 2));
        assert!(cell(&[]).is_none());
    }

    #[test]
    fn depth_figures_pool_tasks_and_leave_empty_cells_empty() {
        let mut items = vec![
            item(8, Some(0.0), 0, 1.0),
            item(8, Some(1.0), 0, 0.0),
            item(16, Some(0.0), 0, 0.5),
            item(16, None, 0, 0.25),
        ];
        items[1].task = "niah_multikey_1".into();
        let lines = accuracy_by_depth(&items);
        assert_eq!(lines.series.len(), 2);
        assert_eq!(lines.series[0].x, vec![0.0, 1.0]);
        assert_eq!(lines.series[0].y, vec![Some(1.0), Some(0.0)]);
        assert_eq!(lines.series[1].y, vec![Some(0.5), None]);
        let heat = depth_length_heatmap(&items);
        assert_eq!(heat.columns, vec![8.0, 16.0]);
        assert_eq!(
            heat.values,
            vec![vec![Some(1.0), Some(0.5)], vec![Some(0.0), None]]
        );
        let by_len = accuracy_by_length(&items);
        assert_eq!(by_len.series[0].y, vec![Some(0.5), Some(0.375)]);
    }
}
