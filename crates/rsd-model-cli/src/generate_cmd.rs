//! `rsd-model generate`: continuations of prompts with a K/V cache, one JSON line each.
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use rsd_model::cli::{DeviceArgs, ModelDirArgs, RopeScalingArgs};
use rsd_model::generate::{self as gen, GenerateOptions, Sampling, TextTokenizer};
use rsd_model::{kind_name, shape_str, Model};
use tch::Kind;

pub const GENERATE_HELP: &str =
    "Prompts are numbered in the order given: --prompt values, then the \
lines of --prompts, then the rows of each --tokens file. A batch is left-padded to its longest \
prompt; padding is masked out and positions start at 0 at each prompt's first token, so a prompt \
generates the same tokens alone or in any batch. The prompt is run in chunks of --prefill-chunk \
tokens (each chunk attends to the cache and causally to itself). Generation stops at an EOS id \
(eos_token_id of generation_config.json, else config.json; kept as the last id), when the text \
contains a --stop string (the text is cut before it), or after --max-new-tokens. The text is \
decoded with the model's tokenizer.json, special tokens skipped; with --tokens and no \
tokenizer.json it is null. RoPE scaling in config.json applies (and --rope-scaling replaces it).";

#[derive(Args)]
pub struct GenerateArgs {
    /// --model.
    #[command(flatten)]
    pub checkpoint: ModelDirArgs,
    /// A prompt text (repeatable).
    #[arg(long)]
    pub prompt: Vec<String>,
    /// A JSONL file of prompts, one object per line with a string field "prompt".
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// Prompt token ids, int .npy [T] (one prompt) or [B, T] (one prompt per row); repeatable.
    #[arg(long)]
    pub tokens: Vec<PathBuf>,
    /// Most tokens generated per prompt.
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: usize,
    /// Sample at this temperature (> 0); without it (or with 0) decoding is greedy.
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Nucleus sampling: keep the most likely tokens up to this probability mass.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    /// Sampling seed (each prompt's draws depend on it and the prompt's index only).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop when the generated text contains this string (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Do not stop at EOS ids.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Encode text prompts without the tokenizer's special tokens (e.g. BOS).
    #[arg(long)]
    pub no_special_tokens: bool,
    /// Prompt tokens per prefill chunk.
    #[arg(long, default_value_t = gen::DEFAULT_PREFILL_CHUNK)]
    pub prefill_chunk: i64,
    /// Prompts per batch.
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    #[command(flatten)]
    pub runtime: DeviceArgs,
    /// Override the RoPE base (ABF).
    #[arg(long)]
    pub rope_theta: Option<f64>,
    #[command(flatten)]
    pub rope: RopeScalingArgs,
    /// Write the JSONL here instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// The prompts of a .npy token file: a [T] array is one prompt, a [B, T] array one per row.
fn read_prompt_ids(path: &Path) -> Result<Vec<Vec<i64>>> {
    let t = rsd_model::npy::read(path).context("reading tokens")?;
    let t = match t.dim() {
        1 => t.unsqueeze(0),
        2 => t,
        _ => bail!(
            "tokens {}: expected shape [T] or [B, T], got {}",
            path.display(),
            shape_str(&t.size())
        ),
    };
    if !matches!(
        t.kind(),
        Kind::Int64 | Kind::Int | Kind::Int16 | Kind::Uint8 | Kind::Int8
    ) {
        bail!(
            "tokens {}: expected integer ids, got {}",
            path.display(),
            kind_name(t.kind())
        );
    }
    let (b, w) = (t.size()[0], t.size()[1]);
    let flat = Vec::<i64>::try_from(&t.to_kind(Kind::Int64).reshape([-1]))
        .with_context(|| format!("reading tokens {}", path.display()))?;
    Ok((0..b as usize)
        .map(|r| flat[r * w as usize..(r + 1) * w as usize].to_vec())
        .collect())
}

pub fn generate(a: GenerateArgs) -> Result<()> {
    // Phase 1: plain values, no I/O.
    let options = a.runtime.options()?;
    let sampling = a
        .temperature
        .filter(|&t| t != 0.0)
        .map(|temperature| Sampling {
            temperature,
            top_p: a.top_p,
            seed: a.seed,
        });
    if a.prompt.is_empty() && a.prompts.is_none() && a.tokens.is_empty() {
        bail!("no prompts: pass --prompt TEXT, --prompts FILE.jsonl or --tokens T.npy");
    }
    // Phase 2: read and build.
    let mut texts = a.prompt.clone();
    if let Some(p) = &a.prompts {
        texts.extend(gen::read_prompts_jsonl(p)?);
    }
    let tokenizer_path = a.checkpoint.model.join("tokenizer.json");
    let tokenizer = if !texts.is_empty() || !a.stop.is_empty() || tokenizer_path.exists() {
        Some(TextTokenizer::from_file(&tokenizer_path)?)
    } else {
        None
    };
    let mut prompts = Vec::new();
    if let Some(tk) = &tokenizer {
        for t in &texts {
            prompts.push(tk.encode(t, !a.no_special_tokens)?);
        }
    }
    for f in &a.tokens {
        prompts.extend(read_prompt_ids(f)?);
    }
    let eos = if a.ignore_eos {
        Vec::new()
    } else {
        gen::eos_token_ids(&a.checkpoint.model)?
    };
    let mut m = Model::load(&a.checkpoint.model, options)
        .with_context(|| format!("loading {}", a.checkpoint.model.display()))?;
    if let Some(theta) = a.rope_theta {
        m.set_rope_theta(theta)?;
    }
    if let Some(request) = &a.rope.rope_scaling {
        let window = m.config().max_position_embeddings;
        m.set_rope_scaling(request.to_dict(window))?;
    }
    let opts = GenerateOptions {
        max_new_tokens: a.max_new_tokens,
        sampling,
        eos,
        stop: a.stop.clone(),
        prefill_chunk: a.prefill_chunk,
        batch_size: a.batch_size,
    };
    let results = gen::generate(&m, &prompts, &opts, tokenizer.as_ref())?;
    let mut out = String::new();
    for (i, g) in results.iter().enumerate() {
        let stop = match &g.stop {
            gen::StopReason::Stop(s) => serde_json::Value::from(s.as_str()),
            _ => serde_json::Value::Null,
        };
        let line = serde_json::json!({"index": i, "text": g.text, "ids": g.ids,
            "stop_reason": g.stop.name(), "stop": stop});
        out.push_str(&line.to_string());
        out.push('\n');
    }
    match &a.out {
        Some(p) => {
            rsd_common::safe_fs::write_file_atomic(p, out.as_bytes())
                .with_context(|| format!("writing {}", p.display()))?;
            eprintln!(
                "rsd-model: wrote {} ({} generation(s), one JSON line each)",
                p.display(),
                results.len()
            );
        }
        None => print!("{out}"),
    }
    Ok(())
}
