//! `rsd-train probe`: one batch through the step, its loss terms and gradient norm as JSON.
use anyhow::{bail, Result};

use rsd_train::probe::{PerturbParams, ProbeModel, ProbeRequest};
use rsd_train::step::{LongCe, SecondView, StepOptions};

use crate::args::ProbeArgs;
use crate::launch;

/// A comma-separated list of values (`--split 5,9`); `None` when the flag is absent.
fn list<T: std::str::FromStr>(s: &Option<String>, flag: &str) -> Result<Option<Vec<T>>> {
    let Some(s) = s else { return Ok(None) };
    let v = s
        .split(',')
        .map(|x| x.trim().parse::<T>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| anyhow::anyhow!("--{flag} \"{s}\": expected a comma-separated list"))?;
    Ok(Some(v))
}

/// `rsd-train probe`.
pub fn run(a: ProbeArgs) -> Result<()> {
    if let Some(n) = a.ranks.nproc {
        rsd_dist::layout(
            n,
            rsd_dist::MeshShape {
                dp: 1,
                cp: a.cp.max(1),
            },
        )?;
        match launch::run(n)? {
            0 => return Ok(()),
            code => std::process::exit(code),
        }
    }
    // Phase 1: plain values, no I/O.
    if a.threads > 0 {
        tch::set_num_threads(a.threads);
    }
    let model = match (a.model, a.init) {
        (Some(dir), None) => ProbeModel::Dir(dir),
        (None, Some(config)) => ProbeModel::Init {
            config,
            seed: a.init_seed,
        },
        _ => bail!("give exactly one of --model DIR or --init CONFIG"),
    };
    let params = PerturbParams {
        split: list(&a.split, "split")?,
        skip: list(&a.skip, "skip")?,
        shift: list(&a.shift, "shift")?,
        factor: list(&a.factor, "factor")?,
        order: list(&a.order, "order")?,
    };
    let request = ProbeRequest {
        model,
        tokens: a.tokens,
        doc_bounds: a.doc_bounds,
        perturb: a.perturb,
        kl_norm: a.kl_norm,
        real_len: list(&a.real_len, "real-len")?,
        mask_doc_starts: a.mask_doc_starts,
        loss_mask: a.loss_mask,
        params,
        dtype: a.dtype,
        step: StepOptions {
            objective: a.objective.loss(),
            kl: a.kl,
            lambda: a.lambda,
            prefix_reuse: !a.no_prefix_reuse,
            loss_chunk: a.loss_chunk,
            checkpoint_layers: a.checkpoint_layers,
            long_ce: match a.long_ce_window {
                0 => None,
                w => Some(LongCe::new(w, a.long_ce_stride, a.long_ce_gamma)?),
            },
            view: SecondView::of(a.perturb, a.attn_noise_sigma, a.attn_dropout),
        },
        reference: a.reference,
        grads_out: a.grads_out,
        repeat: a.repeat,
        cp: a.cp,
        seed: a.seed,
        dump: a.dump,
    };
    // Phase 2: the library does the work.
    let report = rsd_train::probe::run(&request)?;
    if std::env::var("RANK").is_ok_and(|r| r != "0") {
        // One report per run: rank 0's (every rank holds the same values).
        return Ok(());
    }
    // Through a JSON value, so the keys print sorted as they always have.
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::to_value(&report)?)?
    );
    Ok(())
}
