//! What one optimizer step hands to collectives, analytically: the payload bytes that
//! [`rsd_dist::CommStats`] counts (each call's tensor as this rank hands it: an all-reduce's
//! whole buffer, an all-gather's block, a reduce-scatter's whole input), summed over the step's
//! calls on one rank. docs/DIST.md states the formula and projects it onto the paper's clusters;
//! the test of the trainer's logged `comm_bytes` compares against [`expected_step_bytes`].
//!
//! The step's calls, in order (world: all dp·cp ranks; cp: the rank's context-parallel group):
//!
//! | what | group | payload |
//! |---|---|---|
//! | interrupt decision (`any`) | world | 4 B (i32) |
//! | loss normalisers + tokens | world | 3 × 8 B |
//! | per micro-batch, cp > 1 and a perturbed view: the rows' positions | cp | B·L/cp × 8 B |
//! | per micro-batch, cp > 1 and a perturbed view or LongCE: the rows' tokens | cp | B·L/cp × 8 B |
//! | per micro-batch and pass, cp > 1: each layer's K and V gather, forward | cp | rows·kv·L/cp × e |
//! | the same gathers' backward (reduce-scatter, inside autograd) | cp | rows·kv·L × e |
//! | loss sums | world | 3 × 8 B |
//! | gradients, replicated: one all-reduce per bucket | world | Σ params × g |
//! | sharded: the ranks' micro-batch count (max) | world | 8 B (i64) |
//! | gradients, sharded: one reduce-scatter per bucket, per micro-batch (`grad_reduce = "micro-batch"`) or per step (`"step"`) | world | Σ buckets ⌈n_b/W⌉·W × s |
//! | sharded: the gradient norm | world | 8 B |
//! | non-finite decision (`any`) | world | 4 B |
//! | sharded: the parameters' all-gather per bucket | world | Σ buckets ⌈n_b/W⌉ × e |
//!
//! (`e`: the model dtype's bytes; `g`: the gradient sum's, 4, or 8 for fp64 models; `s`: the sharded state's, 4, or 8 for fp64 models; `kv`: the
//! key/value width `Hkv·head_dim`; `L`: the row length after CP padding.) Held-out evaluation
//! (`heldout_every`) adds one all-reduce of 4 × 8 B after its steps and is not part of a step.

use crate::parallel::buckets;

/// The second (perturbed) view of a step, as its K/V gathers see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecondViewRows {
    /// `standard`: no second view.
    None,
    /// A second pass over whole rows (`prefix_reuse = false`): this many rows of each
    /// micro-batch (those whose view changed).
    Whole(usize),
}

/// The sharded optimizer's part of the formula.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sharded {
    /// Bytes per element of the optimizer state the gradient is reduce-scattered in (4; 8 for
    /// fp64 models).
    pub state_bytes: usize,
    /// Reduce-scatters of the gradient per step and bucket: the local micro-batches with
    /// `grad_reduce = "micro-batch"`, 1 with `"step"`.
    pub reduce_scatters: usize,
}

/// Everything the payload of a step depends on.
#[derive(Clone, Debug, PartialEq)]
pub struct StepLayout {
    /// Every parameter's element count, in the model's order.
    pub param_sizes: Vec<usize>,
    /// Bytes per element of the model's dtype (K/V and parameter all-gathers).
    pub param_bytes: usize,
    /// Largest gradient bucket, elements (`grad_bucket_mb` of fp32).
    pub bucket_elems: usize,
    /// Data-parallel ranks.
    pub dp: usize,
    /// Context-parallel ranks.
    pub cp: usize,
    /// Micro-batches this rank runs per step.
    pub local_micro_batches: usize,
    /// Rows per micro-batch.
    pub rows: usize,
    /// Whole row length after context-parallel padding (a multiple of 2·cp).
    pub seq_len: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Key/value width per token: KV heads × head dim.
    pub kv_width: usize,
    /// The perturbed view.
    pub second_view: SecondViewRows,
    /// LongCE (gathers the rows' tokens under context parallelism).
    pub long_ce: bool,
    /// Activation checkpointing: every layer's forward runs twice.
    pub checkpoint_layers: bool,
    /// The sharded optimizer, if on.
    pub sharded: Option<Sharded>,
}

/// Payload bytes of one optimizer step on one rank ([`rsd_dist::CommStats::bytes`]); 0 for one
/// process.
pub fn expected_step_bytes(s: &StepLayout) -> u64 {
    let world = s.dp * s.cp;
    if world <= 1 {
        return 0;
    }
    let w = world as u64;
    let (i32_b, f64_b, f32_b) = (4u64, 8u64, 4u64);
    // Decisions, normalisers, loss sums.
    let mut bytes = 2 * i32_b + 3 * f64_b + 3 * f64_b;
    if s.cp > 1 {
        bytes += s.local_micro_batches as u64 * context_bytes_per_micro_batch(s);
    }
    let bucket_sizes: Vec<u64> = buckets(s.param_sizes.iter().copied(), s.bucket_elems)
        .into_iter()
        .map(|r| s.param_sizes[r].iter().map(|&n| n as u64).sum())
        .collect();
    match s.sharded {
        None => {
            let g = if s.param_bytes == 8 { 8 } else { f32_b };
            bytes += bucket_sizes.iter().sum::<u64>() * g
        }
        Some(sh) => {
            let blocks: Vec<u64> = bucket_sizes.iter().map(|n| n.div_ceil(w)).collect();
            let padded: u64 = blocks.iter().map(|b| b * w).sum();
            // The micro-batch count agreed on (i64), then the reduce-scatters and the norm.
            bytes += 8;
            bytes += sh.reduce_scatters as u64 * padded * sh.state_bytes as u64;
            bytes += f64_b;
            bytes += blocks.iter().sum::<u64>() * s.param_bytes as u64;
        }
    }
    bytes
}

/// Context parallelism's payload for one micro-batch on one rank.
fn context_bytes_per_micro_batch(s: &StepLayout) -> u64 {
    let (cp, rows, len) = (s.cp as u64, s.rows as u64, s.seq_len as u64);
    let local = len / cp;
    let mut bytes = 0u64;
    let perturbed = match s.second_view {
        SecondViewRows::None => 0,
        SecondViewRows::Whole(r) => r as u64,
    };
    if s.second_view != SecondViewRows::None {
        // The rows' positions, gathered to draw the whole rows' perturbations.
        bytes += rows * local * 8;
    }
    if s.second_view != SecondViewRows::None || s.long_ce {
        // The rows' token ids.
        bytes += rows * local * 8;
    }
    // Per layer and pass: K and V, each an all-gather of this rank's rows (forward) and the
    // reduce-scatter of the whole rows' gradient (backward).
    let forwards = if s.checkpoint_layers { 2 } else { 1 };
    let per_row = 2 * s.layers as u64 * s.kv_width as u64 * s.param_bytes as u64;
    let gathered_rows = rows + perturbed;
    bytes += gathered_rows * per_row * (forwards * local + len);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> StepLayout {
        StepLayout {
            param_sizes: vec![100, 7, 50],
            param_bytes: 4,
            bucket_elems: 120,
            dp: 2,
            cp: 1,
            local_micro_batches: 2,
            rows: 1,
            seq_len: 16,
            layers: 2,
            kv_width: 8,
            second_view: SecondViewRows::None,
            long_ce: false,
            checkpoint_layers: false,
            sharded: None,
        }
    }

    #[test]
    fn data_parallel_is_the_gradient_plus_the_scalars() {
        let s = layout();
        assert_eq!(expected_step_bytes(&s), 157 * 4 + 56);
        let one = StepLayout { dp: 1, ..s };
        assert_eq!(expected_step_bytes(&one), 0);
    }

    #[test]
    fn sharded_buckets_are_padded_to_the_world() {
        let s = StepLayout {
            sharded: Some(Sharded {
                state_bytes: 4,
                reduce_scatters: 1,
            }),
            ..layout()
        };
        // Buckets [100, 7] and [50]: blocks 54 and 25 over 2 ranks.
        let want = 56 + 8 + (54 * 2 + 25 * 2) * 4 + 8 + (54 + 25) * 4;
        assert_eq!(expected_step_bytes(&s), want);
    }

    #[test]
    fn context_parallel_gathers_each_layers_kv() {
        let s = StepLayout {
            dp: 1,
            cp: 2,
            ..layout()
        };
        // Per micro-batch: 2 layers × (K, V) × 8 wide × 4 B × (8 local rows + 16 rows).
        let kv = 2 * 2 * 8 * 4 * (8 + 16);
        assert_eq!(expected_step_bytes(&s), 56 + 157 * 4 + 2 * kv);
        let rsd = StepLayout {
            second_view: SecondViewRows::Whole(1),
            ..s
        };
        assert_eq!(
            expected_step_bytes(&rsd),
            56 + 157 * 4 + 2 * (2 * kv + 2 * 8 * 8)
        );
    }
}
