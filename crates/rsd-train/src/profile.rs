//! Where a training step's time goes (config key `profile`): the step's phases timed on the device
//! by the phase clock ([`rsd_model::phases`]), one record per step, and a table of medians.
//!
//! The phases, as their paths read (a path's time includes the paths under it):
//!
//! | path | what |
//! |---|---|
//! | `data` | the loader's batches, made into tensors on the device |
//! | `forward` | both views through the decoder (no graph when layers are checkpointed) |
//! | `forward/attention forward` | the attention kernels within it |
//! | `loss` | the chunked CE/KL: logits, their closed-form gradients, the LM head's gradient |
//! | `backward` | everything back-propagated below the loss |
//! | `backward/recompute` | checkpointed layers run again with a graph |
//! | `backward/recompute/attention forward` | the attention kernels within that |
//! | `backward/attention backward` | the attention kernels' backward |
//! | `reduce` | the gradient sum over data-parallel ranks (replicated optimizer) |
//! | `optimizer` | gradient norm, clipping, AdamW, zeroing the gradients |
//! | `optimizer/gradient norm` | the norm, read by the host |
//! | `idle` | the step's wall time not covered by a top-level phase: the device waiting for the host |
//!
//! On CUDA the times are the device's (events on the current stream), so host work that overlaps
//! device work costs nothing here, and `idle` is what the host left the device without work.
use std::collections::BTreeMap;

use rsd_model::phases::PhaseTime;

use crate::Result;

/// The path of the time not covered by a top-level phase.
pub const IDLE: &str = "idle";

/// Seconds per phase path of one step, with [`IDLE`] from the step's wall time.
pub fn step_phases(times: &[PhaseTime], step_s: f64) -> BTreeMap<String, f64> {
    let mut out: BTreeMap<String, f64> =
        times.iter().map(|t| (t.path.clone(), t.seconds)).collect();
    let top: f64 = times
        .iter()
        .filter(|t| !t.path.contains('/'))
        .map(|t| t.seconds)
        .sum();
    out.insert(IDLE.into(), (step_s - top).max(0.0));
    out
}

/// Turns the clock on for this step's device.
pub fn start(device: tch::Device) -> Result<()> {
    Ok(rsd_model::phases::enable(device)?)
}

/// The phases recorded since the last call (waits for the device).
pub fn take() -> Result<Vec<PhaseTime>> {
    Ok(rsd_model::phases::take()?)
}

/// A table of each path's median over `steps` (the first step dropped when there are more than
/// two: it carries one-time costs such as the kernels' autotuning), with its share of the median
/// step time.
pub fn table(steps: &[(f64, BTreeMap<String, f64>)]) -> String {
    let used = if steps.len() > 2 { &steps[1..] } else { steps };
    let mut paths: Vec<&String> = used.iter().flat_map(|(_, p)| p.keys()).collect();
    paths.sort();
    paths.dedup();
    let step_s = rsd_common::stats::median(&used.iter().map(|(s, _)| *s).collect::<Vec<_>>());
    let mut out = format!(
        "phases, median of {} step(s){}: step {:.4} s\n",
        used.len(),
        if used.len() < steps.len() {
            " (the first dropped)"
        } else {
            ""
        },
        step_s
    );
    for path in paths {
        let m = rsd_common::stats::median(
            &used
                .iter()
                .map(|(_, p)| p.get(path).copied().unwrap_or(0.0))
                .collect::<Vec<_>>(),
        );
        let depth = path.matches('/').count();
        let name = path.rsplit('/').next().unwrap_or(path);
        out.push_str(&format!(
            "  {:<40} {:>9.4} s {:>6.1}%\n",
            format!("{}{}", "  ".repeat(depth), name),
            m,
            100.0 * m / step_s.max(1e-12)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(path: &str, seconds: f64) -> PhaseTime {
        PhaseTime {
            path: path.into(),
            seconds,
            count: 1,
        }
    }

    #[test]
    fn idle_is_the_wall_time_no_top_level_phase_covers() {
        let p = step_phases(
            &[
                t("data", 0.1),
                t("forward", 0.5),
                t("forward/attention forward", 0.3),
                t("optimizer", 0.2),
            ],
            1.0,
        );
        assert!((p[IDLE] - 0.2).abs() < 1e-12, "{p:?}");
        assert_eq!(p["forward/attention forward"], 0.3);
        // Never negative (clock granularity can put the phases' sum above the wall time).
        assert_eq!(step_phases(&[t("forward", 1.5)], 1.0)[IDLE], 0.0);
    }

    #[test]
    fn the_table_takes_medians_without_the_first_step_and_indents_by_depth() {
        let step = |fwd: f64, attn: f64| {
            (
                1.0,
                step_phases(
                    &[t("forward", fwd), t("forward/attention forward", attn)],
                    1.0,
                ),
            )
        };
        let s = table(&[
            step(0.9, 0.8),
            step(0.5, 0.2),
            step(0.6, 0.3),
            step(0.4, 0.1),
        ]);
        assert!(s.contains("median of 3 step(s) (the first dropped)"), "{s}");
        let line = |name: &str| {
            s.lines()
                .find(|l| l.trim_start().starts_with(name))
                .unwrap()
        };
        assert!(
            line("forward").contains("0.5000 s") && line("forward").contains("50.0%"),
            "{s}"
        );
        assert!(
            line("attention forward").starts_with("    attention"),
            "{s}"
        );
        assert!(line("attention forward").contains("0.2000 s"), "{s}");
        assert!(line("idle").contains("0.5000 s"), "{s}");
    }
}
