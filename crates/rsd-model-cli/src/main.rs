//! `rsd-model`: check checkpoints and conversions.
//!
//! ```text
//! rsd-model inspect DIR
//! rsd-model logits --model DIR --tokens T.npy [--positions P.npy] [--doc-boundaries 0,5,12] --out L.npy
//! rsd-model convert --model DIR --out DIR2 [--dtype bf16] [--rope-theta 8e6] [--max-positions N]
//! rsd-model init --config config.json --seed 0 --out DIR
//! rsd-model bench --config config.json [--seq-len 2048] [--threads 2] [--iters 5]
//! rsd-model generate --model DIR (--prompt TEXT… | --prompts P.jsonl | --tokens T.npy…) [--max-new-tokens N]
//!     [--temperature T --top-p P --seed S] [--stop STR…] [--prefill-chunk N] [--batch-size B]
//! ```
//! The binary only parses arguments and calls the `rsd_model` library (docs/MODEL.md).
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use rsd_model::cli::{DeviceArgs, RopeScalingArgs};
use rsd_model::generate::{self as gen, GenerateOptions, Sampling, TextTokenizer};
use rsd_model::{
    checkpoint::safetensors_files, kind_name, parse_kind, shape_str, DocBoundaries, ForwardArgs,
    Model, ModelConfig, ModelOptions, SaveOptions,
};
use tch::{Kind, Tensor};

#[derive(Parser)]
#[command(
    name = "rsd-model",
    version,
    about = "Inspect Llama/Qwen3 checkpoints, compute logits and generate text",
    after_help = "Environment: RSD_BACKTRACE=1 prints libtorch's full error text (with its C++ \
                  backtrace); by default an error is one line."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Architecture, sizes, parameter count, RoPE settings and dtypes of an HF checkpoint dir.
    Inspect {
        /// Checkpoint directory (config.json + safetensors).
        dir: PathBuf,
    },
    /// Run a forward pass and write fp32 logits [B, T, V] as .npy.
    Logits(LogitsArgs),
    /// Load a checkpoint and save it again: change dtype, RoPE base (ABF), recorded context length
    /// or shard size; tokenizer files are carried over.
    Convert(ConvertArgs),
    /// Time forward+backward (full-logit CE) of a random model, and the attention primitive vs
    /// plain causal SDPA; prints one JSON line. Used by benches/model_bench.py.
    Bench(BenchArgs),
    /// Create a seeded random model from an HF config.json and save it as a checkpoint dir.
    Init(InitArgs),
    /// Generate continuations of prompts with a K/V cache (greedy by default); prints one JSON
    /// line per prompt: {"index", "text", "ids", "stop_reason": "eos"|"stop"|"length", "stop"}.
    #[command(after_help = GENERATE_HELP)]
    Generate(GenerateArgs),
}

const GENERATE_HELP: &str = "Prompts are numbered in the order given: --prompt values, then the \
lines of --prompts, then the rows of each --tokens file. A batch is left-padded to its longest \
prompt; padding is masked out and positions start at 0 at each prompt's first token, so a prompt \
generates the same tokens alone or in any batch. The prompt is run in chunks of --prefill-chunk \
tokens (each chunk attends to the cache and causally to itself). Generation stops at an EOS id \
(eos_token_id of generation_config.json, else config.json; kept as the last id), when the text \
contains a --stop string (the text is cut before it), or after --max-new-tokens. The text is \
decoded with the model's tokenizer.json, special tokens skipped; with --tokens and no \
tokenizer.json it is null. RoPE scaling in config.json applies (and --rope-scaling replaces it).";

#[derive(Args)]
struct GenerateArgs {
    /// Checkpoint directory (config.json, safetensors, tokenizer.json for text).
    #[arg(long)]
    model: PathBuf,
    /// A prompt text (repeatable).
    #[arg(long)]
    prompt: Vec<String>,
    /// A JSONL file of prompts, one object per line with a string field "prompt".
    #[arg(long)]
    prompts: Option<PathBuf>,
    /// Prompt token ids, int .npy [T] (one prompt) or [B, T] (one prompt per row); repeatable.
    #[arg(long)]
    tokens: Vec<PathBuf>,
    /// Most tokens generated per prompt.
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// Sample at this temperature (> 0); without it (or with 0) decoding is greedy.
    #[arg(long)]
    temperature: Option<f64>,
    /// Nucleus sampling: keep the most likely tokens up to this probability mass.
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    /// Sampling seed (each prompt's draws depend on it and the prompt's index only).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop when the generated text contains this string (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Do not stop at EOS ids.
    #[arg(long)]
    ignore_eos: bool,
    /// Encode text prompts without the tokenizer's special tokens (e.g. BOS).
    #[arg(long)]
    no_special_tokens: bool,
    /// Prompt tokens per prefill chunk.
    #[arg(long, default_value_t = gen::DEFAULT_PREFILL_CHUNK)]
    prefill_chunk: i64,
    /// Prompts per batch.
    #[arg(long, default_value_t = 8)]
    batch_size: usize,
    #[command(flatten)]
    runtime: DeviceArgs,
    /// Override the RoPE base (ABF).
    #[arg(long)]
    rope_theta: Option<f64>,
    #[command(flatten)]
    rope: RopeScalingArgs,
    /// Write the JSONL here instead of stdout.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Args)]
struct LogitsArgs {
    /// Checkpoint directory.
    #[arg(long)]
    model: PathBuf,
    /// Token ids, int32/int64 .npy of shape [B, T].
    #[arg(long)]
    tokens: PathBuf,
    /// Position ids, int .npy [B, T]; default 0..T for every row.
    #[arg(long)]
    positions: Option<PathBuf>,
    /// Document boundaries, cu_seqlens style: "0,5,12" for every row, or "0,5,12;0,3,12"
    /// per row. Tokens attend only within their document.
    #[arg(long)]
    doc_boundaries: Option<String>,
    #[command(flatten)]
    runtime: DeviceArgs,
    /// Override the RoPE base (ABF).
    #[arg(long)]
    rope_theta: Option<f64>,
    /// Output .npy (fp32).
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
struct ConvertArgs {
    /// Source checkpoint directory.
    #[arg(long)]
    model: PathBuf,
    /// Output directory (written atomically).
    #[arg(long)]
    out: PathBuf,
    /// Storage dtype of the output: fp32, bf16 or fp16 (default: the source's, when all its
    /// floating-point tensors share one; else fp32).
    #[arg(long)]
    dtype: Option<String>,
    /// New RoPE base.
    #[arg(long)]
    rope_theta: Option<f64>,
    /// New max_position_embeddings.
    #[arg(long)]
    max_positions: Option<i64>,
    /// Largest shard in MB (fractions allowed).
    #[arg(long, default_value_t = 5000.0)]
    max_shard_mb: f64,
    /// Replace --out if it exists.
    #[arg(long)]
    overwrite: bool,
}

#[derive(Args)]
struct BenchArgs {
    /// An HF config.json.
    #[arg(long)]
    config: PathBuf,
    /// Sequence length.
    #[arg(long, default_value_t = 2048)]
    seq_len: i64,
    /// Intra-op threads.
    #[arg(long, default_value_t = 2)]
    threads: i32,
    /// Timed iterations (after one warm-up).
    #[arg(long, default_value_t = 5)]
    iters: usize,
}

#[derive(Args)]
struct InitArgs {
    /// An HF config.json (e.g. configs/model/tiny-llama.json).
    #[arg(long)]
    config: PathBuf,
    /// Seed of the initialisation.
    #[arg(long, default_value_t = 0)]
    seed: i64,
    /// Storage dtype.
    #[arg(long, default_value = "fp32")]
    dtype: String,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
}

fn read_ids(path: &Path, what: &str) -> Result<Tensor> {
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

fn inspect(dir: &Path) -> Result<()> {
    let cfg = ModelConfig::from_dir(dir)?;
    println!("directory        {}", dir.display());
    println!(
        "architecture     {} (model_type {})",
        cfg.family.architecture(),
        cfg.family.model_type()
    );
    println!("vocab            {}", cfg.vocab_size);
    println!(
        "hidden / mlp     {} / {}",
        cfg.hidden_size, cfg.intermediate_size
    );
    println!("layers           {}", cfg.num_hidden_layers);
    println!(
        "heads            {} query, {} key/value, head_dim {}",
        cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    );
    println!("tied embeddings  {}", cfg.tie_word_embeddings);
    println!(
        "parameters       {} ({:.1} M)",
        cfg.num_parameters(),
        cfg.num_parameters() as f64 / 1e6
    );
    println!("max positions    {}", cfg.max_position_embeddings);
    println!("rope_theta       {}", cfg.rope_theta);
    println!("rope_scaling     {}", cfg.rope_scaling);
    println!(
        "config dtype     {}",
        cfg.torch_dtype.as_deref().unwrap_or("(unset)")
    );
    let mut dtypes = std::collections::BTreeMap::<String, usize>::new();
    let mut bytes = 0u64;
    let files = safetensors_files(dir)?;
    for f in &files {
        // The header only: the weights are not read into memory.
        let summary = rsd_model::checkpoint::summarize(f)?;
        for dtype in summary.dtypes {
            *dtypes.entry(dtype).or_default() += 1;
        }
        bytes += summary.bytes;
    }
    let dtypes: Vec<String> = dtypes
        .iter()
        .map(|(dtype, n)| format!("{dtype} ({n} tensors)"))
        .collect();
    println!("stored dtypes    {}", dtypes.join(", "));
    println!(
        "files            {} ({:.1} MB)",
        files.len(),
        bytes as f64 / 1e6
    );
    Ok(())
}

/// Median seconds of `iters` runs of `f` after one warm-up.
fn time_it(iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = std::time::Instant::now();
        f()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    Ok(rsd_common::stats::median(&times))
}

fn bench(a: BenchArgs) -> Result<()> {
    let BenchArgs {
        config,
        seq_len,
        threads,
        iters,
    } = a;
    tch::set_num_threads(threads);
    let cfg = read_config(&config)?;
    let m = Model::random(cfg.clone(), ModelOptions::default(), 0)?;
    let cpu = (Kind::Int64, tch::Device::Cpu);
    tch::manual_seed(0);
    let tokens = Tensor::randint(cfg.vocab_size, [1, seq_len], cpu);
    let positions = Tensor::arange(seq_len, cpu).unsqueeze(0);
    let params = m.var_store().trainable_variables();
    let step = || -> Result<()> {
        let h = m.forward(&ForwardArgs::new(&tokens, &positions))?.hidden;
        let logits = m.logits(&h)?;
        let v = cfg.vocab_size;
        let loss = logits
            .narrow(1, 0, seq_len - 1)
            .reshape([-1, v])
            .cross_entropy_for_logits(&tokens.narrow(1, 1, seq_len - 1).reshape([-1]));
        loss.backward();
        for p in &params {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
        Ok(())
    };
    let model_s = time_it(iters, step)?;
    // The attention primitive alone, forward+backward, vs libtorch's plain causal SDPA.
    let (h, hd) = (cfg.num_attention_heads, cfg.head_dim);
    let f = (Kind::Float, tch::Device::Cpu);
    let q = Tensor::randn([1, h, seq_len, hd], f).set_requires_grad(true);
    let k = Tensor::randn([1, h, seq_len, hd], f).set_requires_grad(true);
    let v = Tensor::randn([1, h, seq_len, hd], f).set_requires_grad(true);
    let scale = 1.0 / (hd as f64).sqrt();
    let backward = |out: Tensor| {
        out.sum(Kind::Float).backward();
        for t in [&q, &k, &v] {
            let _ = t.grad().zero_();
        }
    };
    let sdpa_s = time_it(iters, || {
        backward(Tensor::scaled_dot_product_attention(
            &q,
            &k,
            &v,
            None::<Tensor>,
            0.0,
            true,
            scale,
            false,
        ));
        Ok(())
    })?;
    let prim_s = time_it(iters, || {
        backward(rsd_model::attention::attend_documents(&q, &k, &v, None, None, scale)?.out);
        Ok(())
    })?;
    // Same keys split into [prefix | own block] and merged by LSE (the prefix-reuse path).
    let half = seq_len / 2;
    let split_s = time_it(iters, || {
        let (pk, pv) = (k.narrow(2, 0, half), v.narrow(2, 0, half));
        let tail = |t: &Tensor| t.narrow(2, half, seq_len - half);
        let a = rsd_model::attention::attend_documents(
            &tail(&q),
            &tail(&k),
            &tail(&v),
            Some((&pk, &pv)),
            None,
            scale,
        )?;
        let head = rsd_model::attention::attend_documents(
            &q.narrow(2, 0, half),
            &pk,
            &pv,
            None,
            None,
            scale,
        )?;
        backward(Tensor::cat(&[head.out, a.out], 2));
        Ok(())
    })?;
    let j = serde_json::json!({
        "seq_len": seq_len, "threads": threads, "iters": iters,
        "model_fwd_bwd_s": model_s, "sdpa_fwd_bwd_s": sdpa_s, "primitive_fwd_bwd_s": prim_s,
        "primitive_split_fwd_bwd_s": split_s, "parameters": cfg.num_parameters(),
    });
    println!("{j}");
    Ok(())
}

/// An HF config.json file, resolved.
fn read_config(path: &Path) -> Result<ModelConfig> {
    Ok(ModelConfig::from_file(path)?)
}

fn logits(a: LogitsArgs) -> Result<()> {
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
    let docs = a
        .doc_boundaries
        .as_deref()
        .map(|s| DocBoundaries::parse(s, b as usize, t))
        .transpose()
        .context("--doc-boundaries")?;
    let mut m =
        Model::load(&a.model, options).with_context(|| format!("loading {}", a.model.display()))?;
    if let Some(theta) = a.rope_theta {
        m.set_rope_theta(theta)?;
    }
    let _guard = tch::no_grad_guard();
    let (tokens, positions) = (
        tokens.to_device(options.device),
        positions.to_device(options.device),
    );
    let args = ForwardArgs {
        docs: docs.as_ref(),
        ..ForwardArgs::new(&tokens, &positions)
    };
    let hidden = m.forward(&args)?.hidden;
    let logits = m
        .logits(&hidden)?
        .to_kind(Kind::Float)
        .to_device(tch::Device::Cpu);
    logits
        .write_npy(&a.out)
        .with_context(|| format!("writing {}", a.out.display()))?;
    eprintln!(
        "rsd-model: wrote {} (fp32 logits, shape {:?})",
        a.out.display(),
        logits.size()
    );
    Ok(())
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

fn convert(a: ConvertArgs) -> Result<()> {
    let dtype = match &a.dtype {
        Some(d) => d.clone(),
        None => {
            let stored = stored_float_dtype(&a.model)?;
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
        &a.model,
        ModelOptions {
            kind,
            ..Default::default()
        },
    )
    .with_context(|| format!("loading {}", a.model.display()))?;
    if let Some(theta) = a.rope_theta {
        m.set_rope_theta(theta)?;
    }
    if let Some(n) = a.max_positions {
        m.config_mut_for_save().set_max_position_embeddings(n);
    }
    let opts = SaveOptions {
        kind: Some(kind),
        max_shard_bytes: (a.max_shard_mb * 1e6).max(1.0) as u64,
        tokenizer_from: Some(a.model.clone()),
        overwrite: a.overwrite,
    };
    m.save(&a.out, &opts)?;
    println!("wrote {}", a.out.display());
    Ok(())
}

fn init(a: InitArgs) -> Result<()> {
    let kind = parse_kind(&a.dtype)?;
    let cfg = read_config(&a.config)?;
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

fn generate(a: GenerateArgs) -> Result<()> {
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
    let tokenizer_path = a.model.join("tokenizer.json");
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
        gen::eos_token_ids(&a.model)?
    };
    let mut m =
        Model::load(&a.model, options).with_context(|| format!("loading {}", a.model.display()))?;
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

fn main() {
    let r = match Cli::parse().cmd {
        Cmd::Inspect { dir } => inspect(&dir),
        Cmd::Logits(a) => logits(a),
        Cmd::Convert(a) => convert(a),
        Cmd::Bench(a) => bench(a),
        Cmd::Init(a) => init(a),
        Cmd::Generate(a) => generate(a),
    };
    if let Err(e) = r {
        let line = rsd_common::report::one_line(e.chain().map(|c| c.to_string()));
        eprintln!("rsd-model: error: {line}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    /// The binary must list libtorch_cuda as NEEDED when the wheel ships it, or CUDA is silently
    /// unavailable (the linker's --as-needed drops it). Cheap: readelf on our own test binary,
    /// which is linked with the same flags as the CLI.
    #[test]
    fn links_libtorch_cuda_when_available() {
        let lib = std::path::Path::new(env!("RSD_LIBTORCH_LIB"));
        let exe = std::env::current_exe().expect("test binary path");
        let out = std::process::Command::new("readelf")
            .arg("-d")
            .arg(&exe)
            .output();
        let Ok(out) = out else {
            eprintln!("readelf not available; skipping");
            return;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(&lib.display().to_string()),
            "no rpath to {}:\n{text}",
            lib.display()
        );
        if lib.join("libtorch_cuda.so").exists() {
            assert!(
                text.contains("[libtorch_cuda.so]"),
                "libtorch_cuda.so is not NEEDED:\n{text}"
            );
        }
    }
}
