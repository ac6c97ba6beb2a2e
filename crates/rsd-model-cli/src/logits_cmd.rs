//! `rsd-model logits`: one forward pass, its fp32 logits as .npy.
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use rsd_model::cli::{DeviceArgs, ModelDirArgs};
use rsd_model::{kind_name, shape_str, DocBoundaries, ForwardArgs, Model};
use tch::{Kind, Tensor};

#[derive(Args)]
pub struct LogitsArgs {
    /// --model.
    #[command(flatten)]
    pub checkpoint: ModelDirArgs,
    /// Token ids, int32/int64 .npy of shape [B, T].
    #[arg(long)]
    pub tokens: PathBuf,
    /// Position ids, int .npy [B, T]; default 0..T for every row.
    #[arg(long)]
    pub positions: Option<PathBuf>,
    /// Document boundaries, cu_seqlens style: "0,5,12" for every row, or "0,5,12;0,3,12"
    /// per row. Tokens attend only within their document.
    #[arg(long)]
    pub doc_boundaries: Option<String>,
    #[command(flatten)]
    pub runtime: DeviceArgs,
    /// Override the RoPE base (ABF).
    #[arg(long)]
    pub rope_theta: Option<f64>,
    /// Output .npy (fp32).
    #[arg(long)]
    pub out: PathBuf,
}

pub fn read_ids(path: &Path, what: &str) -> Result<Tensor> {
    // rsd's own reader: the header is checked against the file before anything is read.
    let t = rsd_model::npy::read(path).with_context(|| format!("reading {what}"))?;
    if t.dim() != 2 {
        bail!(
            "{what} {}: expected shape [B, T], got {}",
            path.display(),
            shape_str(&t.size())
        );
    }
    match t.kind() {
        Kind::Int64 | Kind::Int | Kind::Int16 | Kind::Uint8 | Kind::Int8 => {
            Ok(t.to_kind(Kind::Int64))
        }
        k => bail!(
            "{what} {}: expected integer ids, got {}",
            path.display(),
            kind_name(k)
        ),
    }
}

pub fn logits(a: LogitsArgs) -> Result<()> {
    // Phase 1: plain values, no I/O.
    let options = a.runtime.options()?;
    // Phase 2: read and build.
    let tokens = read_ids(&a.tokens, "tokens")?;
    let (b, t) = (tokens.size()[0], tokens.size()[1]);
    let positions = match &a.positions {
        Some(p) => read_ids(p, "positions")?,
        None => Tensor::arange(t, (Kind::Int64, tch::Device::Cpu))
            .unsqueeze(0)
            .repeat([b, 1]),
    };
    let doc_bounds = a
        .doc_boundaries
        .as_deref()
        .map(|s| DocBoundaries::parse(s, b as usize, t))
        .transpose()
        .context("--doc-boundaries")?;
    let mut m = Model::load(&a.checkpoint.model, options)
        .with_context(|| format!("loading {}", a.checkpoint.model.display()))?;
    if let Some(theta) = a.rope_theta {
        m.set_rope_theta(theta)?;
    }
    let _guard = tch::no_grad_guard();
    let (tokens, positions) = (
        tokens.to_device(options.device),
        positions.to_device(options.device),
    );
    let args = ForwardArgs {
        doc_bounds: doc_bounds.as_ref(),
        ..ForwardArgs::new(&tokens, &positions)
    };
    let hidden = m.forward(&args)?.hidden;
    let logits = m
        .logits(&hidden)?
        .to_kind(Kind::Float)
        .to_device(tch::Device::Cpu);
    // A file of NaN looks like any other .npy: refuse it rather than write it.
    let not_finite = logits
        .isfinite()
        .logical_not()
        .sum(Kind::Int64)
        .int64_value(&[]);
    if not_finite > 0 {
        anyhow::bail!(
            "{} of {} logits are not finite (NaN or ±inf); {} not written: the weights or \
             config.json of {} give values fp32 cannot hold",
            not_finite,
            logits.numel(),
            a.out.display(),
            a.checkpoint.model.display()
        );
    }
    rsd_common::safe_fs::write_atomic_by_path(&a.out, |tmp| {
        logits
            .write_npy(tmp)
            .with_context(|| format!("writing {}", a.out.display()))
    })?;
    eprintln!(
        "rsd-model: wrote {} (fp32 logits, shape {:?})",
        a.out.display(),
        logits.size()
    );
    Ok(())
}
