//! `rsd-model convert` and `rsd-model init`: write checkpoint directories.
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use rsd_model::cli::ModelDirArgs;
use rsd_model::{
    checkpoint::safetensors_files, parse_kind, Model, ModelConfig, ModelOptions, SaveOptions,
};

#[derive(Args)]
pub struct ConvertArgs {
    /// --model: the source checkpoint.
    #[command(flatten)]
    pub checkpoint: ModelDirArgs,
    /// Output directory (written atomically).
    #[arg(long)]
    pub out: PathBuf,
    /// Storage dtype of the output: fp32, bf16 or fp16 (default: the source's, when all its
    /// floating-point tensors share one; else fp32).
    #[arg(long)]
    pub dtype: Option<String>,
    /// New RoPE base.
    #[arg(long)]
    pub rope_theta: Option<f64>,
    /// New max_position_embeddings.
    #[arg(long)]
    pub max_positions: Option<i64>,
    /// Largest shard in MB (fractions allowed).
    #[arg(long, default_value_t = 5000.0)]
    pub max_shard_mb: f64,
    /// Replace --out if it exists.
    #[arg(long)]
    pub overwrite: bool,
}

#[derive(Args)]
pub struct InitArgs {
    /// An HF config.json (e.g. configs/model/tiny-llama.json).
    #[arg(long)]
    pub config: PathBuf,
    /// Seed of the initialisation.
    #[arg(long, default_value_t = 0)]
    pub seed: i64,
    /// Storage dtype.
    #[arg(long, default_value = "fp32")]
    pub dtype: String,
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
}

/// An HF config.json file, resolved.
pub fn read_config(path: &Path) -> Result<ModelConfig> {
    Ok(ModelConfig::from_file(path)?)
}

/// The one floating-point dtype every tensor of checkpoint `dir` is stored in, as `--dtype`
/// spells it; `None` when they differ (or are of another type).
fn stored_float_dtype(dir: &Path) -> Result<Option<&'static str>> {
    let mut seen = std::collections::BTreeSet::new();
    for f in safetensors_files(dir)? {
        seen.extend(rsd_model::checkpoint::summarize(&f)?.dtypes);
    }
    let spelled = |d: &str| match d {
        "F32" => Some("fp32"),
        "BF16" => Some("bf16"),
        "F16" => Some("fp16"),
        _ => None,
    };
    Ok(match seen.iter().collect::<Vec<_>>()[..] {
        [one] => spelled(one),
        _ => None,
    })
}

pub fn convert(a: ConvertArgs) -> Result<()> {
    let dtype = match &a.dtype {
        Some(d) => d.clone(),
        None => {
            let stored = stored_float_dtype(&a.checkpoint.model)?;
            let d = stored.unwrap_or("fp32");
            eprintln!(
                "rsd-model: writing {d} ({}; --dtype chooses another)",
                if stored.is_some() {
                    "the dtype the source is stored in"
                } else {
                    "the source mixes dtypes"
                }
            );
            d.to_string()
        }
    };
    let kind = parse_kind(&dtype)?;
    let mut m = Model::load(
        &a.checkpoint.model,
        ModelOptions {
            kind,
            ..Default::default()
        },
    )
    .with_context(|| format!("loading {}", a.checkpoint.model.display()))?;
    if let Some(theta) = a.rope_theta {
        m.set_rope_theta(theta)?;
    }
    if let Some(n) = a.max_positions {
        m.config_mut_for_save().set_max_position_embeddings(n);
    }
    let opts = SaveOptions {
        kind: Some(kind),
        max_shard_bytes: (a.max_shard_mb * 1e6).max(1.0) as u64,
        tokenizer_from: Some(a.checkpoint.model.clone()),
        overwrite: a.overwrite,
    };
    m.save(&a.out, &opts)?;
    println!("wrote {}", a.out.display());
    Ok(())
}

pub fn init(a: InitArgs) -> Result<()> {
    let kind = parse_kind(&a.dtype)?;
    let cfg = read_config(&a.config)?;
    // A config within every per-key bound may still declare trillions of parameters: refuse it
    // here with the byte count, before allocating aborts the process.
    let dtype_bytes = kind.elt_size_in_bytes() as u64;
    cfg.check_fits_in_memory(
        &a.config,
        rsd_model::kind_name(kind),
        dtype_bytes,
        rsd_model::alloc::available_bytes(),
    )?;
    let options = ModelOptions {
        kind,
        ..Default::default()
    };
    let m = Model::random(cfg, options, a.seed)?;
    m.save(&a.out, &SaveOptions::default())?;
    println!(
        "wrote {} ({} parameters)",
        a.out.display(),
        m.config().num_parameters()
    );
    Ok(())
}
