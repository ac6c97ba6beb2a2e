//! Text generation with a K/V cache, built on [`Model::forward`]'s K/V prefix and explicit
//! positions (no second copy of the layer code).
//!
//! 1. **Batch.** Prompts of different lengths are *left-padded* to the longest. Each row's pad
//!    tokens form a document of their own ([`DocBoundaries`]), so the real tokens never attend to
//!    them, and positions count from 0 at each row's first real token: a row computes exactly what
//!    it computes alone. Rows without padding take the plain (document-free) path.
//! 2. **Prefill** in chunks of `prefill_chunk` tokens: a chunk attends to the cache (the earlier
//!    chunks, unmasked) and causally to itself, so a long prompt never needs an `L × L` score
//!    matrix; its K/V are appended to the cache.
//! 3. **Decode** one token per step at position `prompt length + step`, attending to the cache.
//!    Greedy (argmax, first index on ties, as torch) or sampling (temperature, nucleus `top_p`)
//!    with a generator keyed by the seed and the prompt's index, so a prompt draws the same tokens
//!    whatever else is in its batch.
//! 4. **Stop** on an EOS id (the id is kept, as transformers does), on a stop string (the text is
//!    cut before it; the ids keep the token that completed it) or after `max_new_tokens`.
//!
//! RoPE scaling (`rope_scaling` in `config.json`, or [`Model::set_rope_scaling`]) applies as in
//! every forward pass: the positions given here are the ones RoPE sees.
use std::path::{Path, PathBuf};

use rsd_common::rng::SplitMix64;
use serde_json::Value;
use tch::{Device, Kind, Tensor};

use crate::error::TchContext;
use crate::{DocBoundaries, ForwardArgs, LayerKv, Model, ModelError, Result};

/// Default prompt tokens per prefill chunk.
pub const DEFAULT_PREFILL_CHUNK: i64 = 4096;

/// Token id written into left padding (any valid id: padding is never attended to).
const PAD_ID: i64 = 0;

/// Sampling settings; generation is greedy without them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// Softmax temperature, > 0.
    pub temperature: f64,
    /// Nucleus sampling: draw from the smallest set of most likely tokens whose probability
    /// reaches `top_p` (in (0, 1]; 1 = the whole vocabulary).
    pub top_p: f64,
    /// Seed; each prompt's generator is keyed by it and the prompt's index.
    pub seed: u64,
}

/// What [`generate`] does.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Most tokens generated per prompt.
    pub max_new_tokens: usize,
    /// `None`: greedy.
    pub sampling: Option<Sampling>,
    /// Token ids that end a generation (see [`eos_token_ids`]).
    pub eos: Vec<i64>,
    /// Strings that end a generation (needs a tokenizer).
    pub stop: Vec<String>,
    /// Prompt tokens per prefill chunk.
    pub prefill_chunk: i64,
    /// Prompts per batch.
    pub batch_size: usize,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_new_tokens: 128,
            sampling: None,
            eos: Vec::new(),
            stop: Vec::new(),
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            batch_size: 8,
        }
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// An EOS id was generated (it is the last id).
    Eos,
    /// The text contains this stop string (the text is cut before it).
    Stop(String),
    /// `max_new_tokens` were generated.
    Length,
}

impl StopReason {
    /// `eos`, `stop` or `length`.
    pub fn name(&self) -> &'static str {
        match self {
            StopReason::Eos => "eos",
            StopReason::Stop(_) => "stop",
            StopReason::Length => "length",
        }
    }
}

/// One prompt's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The generated ids (not the prompt).
    pub ids: Vec<i64>,
    /// The decoded text (special tokens skipped, cut before a stop string), when a tokenizer was
    /// given.
    pub text: Option<String>,
    /// Why it ended.
    pub stop: StopReason,
}

/// A model directory's `tokenizer.json`, for prompts and generated text.
pub struct TextTokenizer {
    inner: tokenizers_v0::Tokenizer,
    path: PathBuf,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl TextTokenizer {
    /// Loads a `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let err = |reason: String| ModelError::Tokenizer {
            path: path.to_path_buf(),
            reason,
        };
        if !path.is_file() {
            return Err(err(
                "no tokenizer.json here (generation from text needs the model's tokenizer; \
                 pass token ids with --tokens otherwise)"
                    .into(),
            ));
        }
        // Checked as a bounded regular file first: the tokenizers crate reads whatever it is given.
        let bytes = rsd_common::safe_fs::read_regular(
            path,
            rsd_common::safe_fs::MAX_METADATA_BYTES,
            "tokenizer",
        )?;
        let inner = tokenizers_v0::Tokenizer::from_bytes(bytes)
            .map_err(|e| err(format!("not a usable tokenizer.json: {e}")))?;
        Ok(TextTokenizer {
            inner,
            path: path.to_path_buf(),
        })
    }

    /// Loads `<dir>/tokenizer.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        Self::from_file(&dir.join("tokenizer.json"))
    }

    /// Token ids of `text`; `special` adds the tokenizer's special tokens (e.g. BOS), as
    /// transformers' `tokenizer(text)` does.
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<i64>> {
        let enc = self
            .inner
            .encode(text, special)
            .map_err(|e| ModelError::Tokenizer {
                path: self.path.clone(),
                reason: format!("encoding failed: {e}"),
            })?;
        Ok(enc.get_ids().iter().map(|&i| i as i64).collect())
    }

    /// Number of ids the tokenizer can produce (its vocabulary with added tokens): a model's
    /// embedding needs at least this many rows.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[i64]) -> Result<String> {
        // Ids outside u32 cannot be in any vocabulary; the tokenizer skips unknown ids too.
        let ids: Vec<u32> = ids.iter().filter_map(|&i| u32::try_from(i).ok()).collect();
        self.inner
            .decode(&ids, true)
            .map_err(|e| ModelError::Tokenizer {
                path: self.path.clone(),
                reason: format!("decoding failed: {e}"),
            })
    }
}

/// The most bytes a model directory's JSON config files may have (real ones hold a few KB).
const JSON_LIMIT: u64 = 64 << 20;

/// The EOS ids of a model directory: `eos_token_id` (a number or a list) of
/// `generation_config.json`, else of `config.json` (transformers' precedence); empty if neither
/// sets one.
pub fn eos_token_ids(dir: &Path) -> Result<Vec<i64>> {
    for name in ["generation_config.json", "config.json"] {
        let path = dir.join(name);
        if !path.is_file() {
            continue;
        }
        let text = rsd_common::safe_fs::read_text(&path, JSON_LIMIT, "model config file")?;
        let value: Value = serde_json::from_str(&text).map_err(|source| ModelError::Json {
            path: path.clone(),
            source,
        })?;
        let bad = || {
            ModelError::InvalidConfig(format!(
                "{}: eos_token_id must be an integer or a list of integers",
                path.display()
            ))
        };
        match value.get("eos_token_id") {
            None | Some(Value::Null) => continue,
            Some(Value::Array(items)) => {
                return items.iter().map(|v| v.as_i64().ok_or_else(bad)).collect()
            }
            Some(v) => return Ok(vec![v.as_i64().ok_or_else(bad)?]),
        }
    }
    Ok(Vec::new())
}

/// The `prompt` field of every non-blank line of a JSONL file.
pub fn read_prompts_jsonl(path: &Path) -> Result<Vec<String>> {
    let text = rsd_common::safe_fs::read_text(
        path,
        rsd_common::safe_fs::MAX_METADATA_BYTES,
        "prompt file",
    )?;
    let mut prompts = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let err = |reason: String| ModelError::PromptFile {
            path: path.to_path_buf(),
            line: i + 1,
            reason,
        };
        let value: Value =
            serde_json::from_str(line).map_err(|e| err(format!("not valid JSON: {e}")))?;
        match value.get("prompt") {
            Some(Value::String(s)) => prompts.push(s.clone()),
            Some(_) => return Err(err("field \"prompt\" is not a string".into())),
            None => return Err(err("missing field \"prompt\"".into())),
        }
    }
    Ok(prompts)
}

/// Per-layer K/V of a batch, preallocated for the prompt and every new token (appending is a copy
/// into place, not a re-concatenation of the whole cache each step).
#[derive(Debug)]
pub struct KvCache {
    layers: Vec<LayerKv>,
    len: i64,
}

impl KvCache {
    /// An empty cache for `batch` rows of up to `capacity` tokens.
    pub fn new(model: &Model, batch: i64, capacity: i64) -> Result<Self> {
        let c = model.config();
        let o = model.options();
        let shape = [batch, c.num_key_value_heads, capacity, c.head_dim];
        let layers = (0..model.num_layers())
            .map(|_| {
                Ok(LayerKv {
                    k: Tensor::f_zeros(shape, (o.kind, o.device))?,
                    v: Tensor::f_zeros(shape, (o.kind, o.device))?,
                })
            })
            .collect::<std::result::Result<_, tch::TchError>>()
            .ctx("allocating the K/V cache")?;
        Ok(KvCache { layers, len: 0 })
    }

    /// Tokens held.
    pub fn len(&self) -> i64 {
        self.len
    }

    /// Whether no token is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The held K/V, per layer `[B, Hkv, len, D]` (views), as a forward pass's prefix.
    pub fn prefix(&self) -> Result<Vec<LayerKv>> {
        self.layers
            .iter()
            .map(|l| {
                Ok(LayerKv {
                    k: l.k.f_narrow(2, 0, self.len)?,
                    v: l.v.f_narrow(2, 0, self.len)?,
                })
            })
            .collect::<std::result::Result<_, tch::TchError>>()
            .ctx("K/V cache view")
    }

    /// Appends one pass's per-layer K/V (`[B, Hkv, T, D]`).
    pub fn append(&mut self, kv: &[LayerKv]) -> Result<()> {
        let t = kv.first().map(|l| l.k.size()[2]).unwrap_or(0);
        let cap = self.layers.first().map(|l| l.k.size()[2]).unwrap_or(0);
        if kv.len() != self.layers.len() || self.len + t > cap {
            return Err(ModelError::Input(format!(
                "K/V cache: appending {} layers of {t} tokens to {} layers holding {} of {cap}",
                kv.len(),
                self.layers.len(),
                self.len
            )));
        }
        for (dst, src) in self.layers.iter().zip(kv) {
            let mut k = dst.k.f_narrow(2, self.len, t).ctx("K/V cache append")?;
            k.f_copy_(&src.k).ctx("K/V cache append")?;
            let mut v = dst.v.f_narrow(2, self.len, t).ctx("K/V cache append")?;
            v.f_copy_(&src.v).ctx("K/V cache append")?;
        }
        self.len += t;
        Ok(())
    }
}

/// Document boundaries over `total` cached + new tokens that keep each row's left padding
/// (`pads[r]` tokens) apart from its real tokens; `None` when no row is padded.
fn pad_documents(pads: &[i64], total: i64) -> Result<Option<DocBoundaries>> {
    if pads.iter().all(|&p| p == 0) {
        return Ok(None);
    }
    let rows = pads
        .iter()
        .map(|&p| {
            if p == 0 || p >= total {
                vec![0, total]
            } else {
                vec![0, p, total]
            }
        })
        .collect();
    DocBoundaries::new(rows, total).map(Some)
}

/// One forward pass of `tokens`/`positions` `[B, T]` after the cache; appends their K/V and
/// returns the last position's fp32 logits `[B, V]`.
fn step(
    model: &Model,
    cache: &mut KvCache,
    tokens: &Tensor,
    positions: &Tensor,
    pads: &[i64],
) -> Result<Tensor> {
    let t = tokens.size()[1];
    let doc_bounds = pad_documents(pads, cache.len() + t)?;
    let prefix = if cache.is_empty() {
        None
    } else {
        Some(cache.prefix()?)
    };
    let out = model.forward(&ForwardArgs {
        doc_bounds: doc_bounds.as_ref(),
        prefix: prefix.as_deref(),
        return_kv: true,
        ..ForwardArgs::new(tokens, positions)
    })?;
    let kv = out
        .kv
        .ok_or_else(|| ModelError::Input("forward returned no K/V".into()))?;
    cache.append(&kv)?;
    let last = out.hidden.f_select(1, t - 1).ctx("last position")?;
    model
        .logits(&last)?
        .f_to_kind(Kind::Float)
        .ctx("logits to fp32")
}

/// Runs `tokens`/`positions` `[B, P]` (rows left-padded by `pads`) through the model in chunks of
/// `chunk` tokens, filling `cache`; returns the last position's fp32 logits `[B, V]`.
pub fn prefill(
    model: &Model,
    cache: &mut KvCache,
    tokens: &Tensor,
    positions: &Tensor,
    pads: &[i64],
    chunk: i64,
) -> Result<Tensor> {
    if chunk <= 0 {
        return Err(ModelError::Input(format!(
            "prefill chunk must be positive, got {chunk}"
        )));
    }
    let p = tokens.size()[1];
    let mut logits = None;
    let mut start = 0;
    while start < p {
        let n = chunk.min(p - start);
        let part = |t: &Tensor| t.f_narrow(1, start, n).ctx("prefill chunk");
        logits = Some(step(model, cache, &part(tokens)?, &part(positions)?, pads)?);
        start += n;
    }
    logits.ok_or_else(|| ModelError::Input("prefill of an empty prompt".into()))
}

/// Draws a token from fp32 `logits` (temperature, then nucleus).
fn sample(logits: &[f32], s: &Sampling, rng: &mut SplitMix64) -> i64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut p: Vec<(f64, usize)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (((l as f64 - max) / s.temperature).exp(), i))
        .collect();
    let z: f64 = p.iter().map(|x| x.0).sum();
    let kept = if s.top_p < 1.0 {
        p.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut mass = 0.0;
        let mut kept = 0;
        for (w, _) in &p {
            kept += 1;
            mass += w / z;
            if mass >= s.top_p {
                break;
            }
        }
        kept
    } else {
        p.len()
    };
    let total: f64 = p[..kept].iter().map(|x| x.0).sum();
    let mut u = rng.uniform() * total;
    for &(w, i) in &p[..kept] {
        if u < w {
            return i as i64;
        }
        u -= w;
    }
    p[kept - 1].1 as i64
}

/// The earliest stop string in `text`: (byte offset, string).
fn find_stop<'a>(text: &str, stops: &'a [String]) -> Option<(usize, &'a String)> {
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()).map(|at| (at, s)))
        .min_by_key(|&(at, _)| at)
}

fn check_options(opts: &GenerateOptions, has_tokenizer: bool) -> Result<()> {
    let bad = |m: String| Err(ModelError::Input(m));
    if opts.prefill_chunk <= 0 {
        return bad(format!(
            "prefill chunk must be positive, got {}",
            opts.prefill_chunk
        ));
    }
    if opts.batch_size == 0 {
        return bad("batch size must be positive".into());
    }
    if !opts.stop.is_empty() && !has_tokenizer {
        return bad("stop strings need a tokenizer (to decode the generated ids)".into());
    }
    if let Some(s) = &opts.sampling {
        if !(s.temperature.is_finite() && s.temperature > 0.0) {
            return bad(format!(
                "temperature must be positive, got {}",
                s.temperature
            ));
        }
        if !(s.top_p > 0.0 && s.top_p <= 1.0) {
            return bad(format!("top_p must lie in (0, 1], got {}", s.top_p));
        }
    }
    Ok(())
}

/// Generates a continuation of every prompt (token ids), `batch_size` prompts at a time. See the
/// module docs for padding, chunked prefill, sampling and stopping. `tokenizer` decodes the text
/// and is needed for stop strings.
pub fn generate(
    model: &Model,
    prompts: &[Vec<i64>],
    opts: &GenerateOptions,
    tokenizer: Option<&TextTokenizer>,
) -> Result<Vec<Generation>> {
    check_options(opts, tokenizer.is_some())?;
    if let Some(i) = prompts.iter().position(Vec::is_empty) {
        return Err(ModelError::Input(format!("prompt {i} has no tokens")));
    }
    let _guard = tch::no_grad_guard();
    let mut out = Vec::with_capacity(prompts.len());
    for (b, batch) in prompts.chunks(opts.batch_size).enumerate() {
        out.extend(generate_batch(
            model,
            batch,
            b * opts.batch_size,
            opts,
            tokenizer,
        )?);
    }
    Ok(out)
}

fn generate_batch(
    model: &Model,
    prompts: &[Vec<i64>],
    first_index: usize,
    opts: &GenerateOptions,
    tokenizer: Option<&TextTokenizer>,
) -> Result<Vec<Generation>> {
    let n = prompts.len();
    let mut ids: Vec<Vec<i64>> = vec![Vec::new(); n];
    let mut done: Vec<Option<StopReason>> = vec![None; n];
    if opts.max_new_tokens > 0 {
        let device = model.options().device;
        let padded = LeftPadded::of(prompts);
        let (lens, width, pads) = (&padded.lens, padded.width, &padded.pads);
        let to_batch =
            |v: &[i64], cols: i64| batch_on(device, v, n as i64, cols, "batch to device");
        let mut cache = KvCache::new(model, n as i64, width + opts.max_new_tokens as i64)?;
        let mut logits = prefill(
            model,
            &mut cache,
            &to_batch(&padded.tokens, width)?,
            &to_batch(&padded.positions, width)?,
            pads,
            opts.prefill_chunk,
        )?;
        let mut rngs: Vec<SplitMix64> = (0..n)
            .map(|r| {
                let seed = opts.sampling.map(|s| s.seed).unwrap_or(0);
                SplitMix64::keyed(&[seed, (first_index + r) as u64])
            })
            .collect();
        for s in 0..opts.max_new_tokens {
            let next = next_tokens(&logits, opts.sampling.as_ref(), &mut rngs)?;
            append_tokens(&mut ids, &mut done, &next, opts, tokenizer)?;
            if s + 1 == opts.max_new_tokens || done.iter().all(Option::is_some) {
                break;
            }
            // Finished rows keep stepping (their tokens are ignored): the batch keeps its shape.
            let step_pos: Vec<i64> = lens.iter().map(|&l| l + s as i64).collect();
            logits = step(
                model,
                &mut cache,
                &to_batch(&next, 1)?,
                &to_batch(&step_pos, 1)?,
                pads,
            )?;
        }
    }
    ids.into_iter()
        .zip(done)
        .map(|(ids, stop)| generation(ids, stop.unwrap_or(StopReason::Length), tokenizer))
        .collect()
}

/// `v` as a `[rows, cols]` tensor on `device`; `what` names it in an error.
fn batch_on(device: Device, v: &[i64], rows: i64, cols: i64, what: &'static str) -> Result<Tensor> {
    Tensor::f_from_slice(v)
        .and_then(|t| t.f_view([rows, cols]))
        .and_then(|t| t.f_to_device(device))
        .ctx(what)
}

/// A batch of prompts left-padded to the longest, row-major.
struct LeftPadded {
    /// The prompts' lengths.
    lens: Vec<i64>,
    /// The longest prompt's length: the batch's width.
    width: i64,
    /// Padding before each prompt.
    pads: Vec<i64>,
    /// Token ids, `PAD_ID` in the padding.
    tokens: Vec<i64>,
    /// Each prompt's positions from 0 (0 in the padding).
    positions: Vec<i64>,
}

impl LeftPadded {
    fn of(prompts: &[Vec<i64>]) -> Self {
        let n = prompts.len();
        let lens: Vec<i64> = prompts.iter().map(|p| p.len() as i64).collect();
        let width = lens.iter().copied().max().unwrap_or(0);
        let pads: Vec<i64> = lens.iter().map(|&l| width - l).collect();
        let mut tokens = vec![PAD_ID; n * width as usize];
        let mut positions = vec![0i64; n * width as usize];
        for (r, p) in prompts.iter().enumerate() {
            let row = r * width as usize + pads[r] as usize;
            tokens[row..row + p.len()].copy_from_slice(p);
            for (j, x) in positions[row..row + p.len()].iter_mut().enumerate() {
                *x = j as i64;
            }
        }
        LeftPadded {
            lens,
            width,
            pads,
            tokens,
            positions,
        }
    }
}

/// Each row's next token from its last logits `[rows, vocab]`: the argmax, or drawn with
/// `sampling` from the row's own generator.
fn next_tokens(
    logits: &Tensor,
    sampling: Option<&Sampling>,
    rngs: &mut [SplitMix64],
) -> Result<Vec<i64>> {
    Ok(match sampling {
        None => Vec::<i64>::try_from(
            &logits
                .f_argmax(-1, false)
                .and_then(|t| t.f_to_device(Device::Cpu))
                .ctx("argmax")?,
        )
        .ctx("argmax")?,
        Some(sp) => {
            let cpu = logits.f_to_device(Device::Cpu).ctx("logits to cpu")?;
            let v = cpu.size()[1] as usize;
            let flat = Vec::<f32>::try_from(&cpu.f_reshape([-1]).ctx("logits")?).ctx("logits")?;
            flat.chunks(v)
                .zip(rngs.iter_mut())
                .map(|(row, rng)| sample(row, sp, rng))
                .collect()
        }
    })
}

/// Appends `next` to the rows not done yet, marking those it ends (an end-of-sequence token, or
/// a stop string in the decoded text).
fn append_tokens(
    ids: &mut [Vec<i64>],
    done: &mut [Option<StopReason>],
    next: &[i64],
    opts: &GenerateOptions,
    tokenizer: Option<&TextTokenizer>,
) -> Result<()> {
    for r in 0..ids.len() {
        if done[r].is_some() {
            continue;
        }
        ids[r].push(next[r]);
        if opts.eos.contains(&next[r]) {
            done[r] = Some(StopReason::Eos);
        } else if let (Some(tk), false) = (tokenizer, opts.stop.is_empty()) {
            if let Some((_, s)) = find_stop(&tk.decode(&ids[r])?, &opts.stop) {
                done[r] = Some(StopReason::Stop(s.clone()));
            }
        }
    }
    Ok(())
}

/// A row's generation: its ids and, with a tokenizer, its text up to the stop string.
fn generation(
    ids: Vec<i64>,
    stop: StopReason,
    tokenizer: Option<&TextTokenizer>,
) -> Result<Generation> {
    let text = match tokenizer {
        None => None,
        Some(tk) => {
            let mut text = tk.decode(&ids)?;
            if let StopReason::Stop(s) = &stop {
                if let Some(at) = text.find(s.as_str()) {
                    text.truncate(at);
                }
            }
            Some(text)
        }
    };
    Ok(Generation { ids, text, stop })
}

/// The teacher-forced score of one continuation of a prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct ContinuationScore {
    /// `log p(token | prompt, earlier continuation tokens)` per continuation token (natural log).
    pub token_logprobs: Vec<f64>,
    /// Their sum: the continuation's log-probability.
    pub logprob: f64,
    /// Whether every token is the argmax of its distribution (first index on ties, as greedy
    /// decoding picks): greedy decoding would produce this continuation first.
    pub greedy: bool,
}

/// Scores each of `continuations` (token ids, non-empty) after `prompt` by teacher forcing: the
/// prompt runs once (prefill in chunks of `prefill_chunk`, into a K/V cache), then the
/// continuations run in batches of `batch_size` rows over that cache, each at positions
/// `prompt.len()…`. A continuation's first token is scored from the prompt's last position;
/// continuations are right-padded to the longest in their batch, and padding (after a row's
/// tokens, under a causal mask) changes nothing before it. The result equals one forward pass of
/// `prompt ++ continuation` per continuation.
pub fn score_continuations(
    model: &Model,
    prompt: &[i64],
    continuations: &[Vec<i64>],
    batch_size: usize,
    prefill_chunk: i64,
) -> Result<Vec<ContinuationScore>> {
    if prompt.is_empty() {
        return Err(ModelError::Input(
            "teacher forcing: the prompt has no tokens".into(),
        ));
    }
    if let Some(i) = continuations.iter().position(Vec::is_empty) {
        return Err(ModelError::Input(format!(
            "teacher forcing: continuation {i} has no tokens"
        )));
    }
    if batch_size == 0 {
        return Err(ModelError::Input(
            "teacher forcing: batch size must be at least 1".into(),
        ));
    }
    let _guard = tch::no_grad_guard();
    let device = model.options().device;
    let p = prompt.len() as i64;
    let positions: Vec<i64> = (0..p).collect();
    let mut cache = KvCache::new(model, 1, p)?;
    let what = "teacher forcing: ids to device";
    let first = prefill(
        model,
        &mut cache,
        &batch_on(device, prompt, 1, p, what)?,
        &batch_on(device, &positions, 1, p, what)?,
        &[0],
        prefill_chunk,
    )?
    .f_log_softmax(-1, Kind::Double)
    .and_then(|t| t.f_to_device(Device::Cpu))
    .ctx("teacher forcing: first-token distribution")?;
    let first_argmax = first.f_argmax(-1, false).ctx("argmax")?.int64_value(&[0]);
    let prefix = cache.prefix()?;
    let mut out = Vec::with_capacity(continuations.len());
    for batch in continuations.chunks(batch_size) {
        let later = later_distributions(model, &prefix, batch, p)?;
        for (r, c) in batch.iter().enumerate() {
            let mut token_logprobs = Vec::with_capacity(c.len());
            let mut greedy = true;
            for (j, &t) in c.iter().enumerate() {
                let (lp, best) = if j == 0 {
                    (first.double_value(&[0, t]), first_argmax)
                } else {
                    let (lp, argmax) = later.as_ref().expect("width > 0 when a row has 2+ tokens");
                    let (r, j) = (r as i64, j as i64 - 1);
                    (lp.double_value(&[r, j, t]), argmax.int64_value(&[r, j]))
                };
                token_logprobs.push(lp);
                greedy &= best == t;
            }
            out.push(ContinuationScore {
                logprob: token_logprobs.iter().sum(),
                token_logprobs,
                greedy,
            });
        }
    }
    Ok(out)
}

/// The distributions (log-probabilities `[rows, width, vocab]`, fp64, on the CPU) and their
/// argmaxes that score a batch of continuations' tokens after the first, from one forward pass
/// over the prompt's K/V `prefix` (`p` tokens); `None` when every continuation has one token.
fn later_distributions(
    model: &Model,
    prefix: &[LayerKv],
    batch: &[Vec<i64>],
    p: i64,
) -> Result<Option<(Tensor, Tensor)>> {
    let device = model.options().device;
    let rows = batch.len() as i64;
    // Inputs are each continuation without its last token; the outputs at input j score
    // token j + 1.
    let width = batch.iter().map(|c| c.len() as i64 - 1).max().unwrap_or(0);
    if width == 0 {
        return Ok(None);
    }
    let mut tok = vec![PAD_ID; (rows * width) as usize];
    for (r, c) in batch.iter().enumerate() {
        let row = r * width as usize;
        tok[row..row + c.len() - 1].copy_from_slice(&c[..c.len() - 1]);
    }
    let pos: Vec<i64> = (0..rows).flat_map(|_| p..p + width).collect();
    let expanded: Vec<LayerKv> = prefix
        .iter()
        .map(|l| {
            let shape = |t: &Tensor| {
                let s = t.size();
                [rows, s[1], s[2], s[3]]
            };
            Ok(LayerKv {
                k: l.k.f_expand(shape(&l.k), false)?.f_contiguous()?,
                v: l.v.f_expand(shape(&l.v), false)?.f_contiguous()?,
            })
        })
        .collect::<std::result::Result<_, tch::TchError>>()
        .ctx("teacher forcing: prompt K/V per row")?;
    let what = "teacher forcing: ids to device";
    let fwd = model.forward(&ForwardArgs {
        prefix: Some(&expanded),
        ..ForwardArgs::new(
            &batch_on(device, &tok, rows, width, what)?,
            &batch_on(device, &pos, rows, width, what)?,
        )
    })?;
    let lp = model
        .logits(&fwd.hidden)?
        .f_log_softmax(-1, Kind::Double)
        .and_then(|t| t.f_to_device(Device::Cpu))
        .ctx("teacher forcing: continuation distributions")?;
    let argmax = lp.f_argmax(-1, false).ctx("argmax")?;
    Ok(Some((lp, argmax)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ModelConfig, ModelOptions};
    use serde_json::json;

    fn model_kv(arch: &str, kv_heads: i64) -> Model {
        let cfg = ModelConfig::from_hf_json(json!({"architectures": [arch], "vocab_size": 61,
            "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": kv_heads, "head_dim": 8,
            "initializer_range": 0.2, "rope_theta": 10000.0}))
        .unwrap();
        Model::random(cfg, ModelOptions::default(), 7).unwrap()
    }

    fn model(arch: &str) -> Model {
        model_kv(arch, 2)
    }

    fn prompt(len: usize, salt: usize) -> Vec<i64> {
        (0..len)
            .map(|i| ((i * 7 + salt * 13) % 61) as i64)
            .collect()
    }

    fn batch_of(p: &[i64], pad: i64) -> (Tensor, Tensor) {
        let mut tok = vec![PAD_ID; pad as usize];
        tok.extend_from_slice(p);
        let mut pos = vec![0; pad as usize];
        pos.extend(0..p.len() as i64);
        (
            Tensor::from_slice(&tok).view([1, -1]),
            Tensor::from_slice(&pos).view([1, -1]),
        )
    }

    /// Chunked prefill equals one pass: last logits and every cached K/V, chunk sizes that do
    /// and do not divide the prompt, with and without left padding.
    #[test]
    fn chunked_prefill_equals_unchunked() {
        let _g = tch::no_grad_guard();
        for arch in ["LlamaForCausalLM", "Qwen3ForCausalLM"] {
            let m = model(arch);
            let p = prompt(23, 1);
            for pad in [0, 5] {
                let (tok, pos) = batch_of(&p, pad);
                let run = |chunk| {
                    let mut cache = KvCache::new(&m, 1, 23 + pad).unwrap();
                    let l = prefill(&m, &mut cache, &tok, &pos, &[pad], chunk).unwrap();
                    (l, cache)
                };
                let (full, full_cache) = run(4096);
                let direct = m
                    .forward(&ForwardArgs::new(
                        &tok.narrow(1, pad, 23),
                        &pos.narrow(1, pad, 23),
                    ))
                    .unwrap()
                    .hidden;
                let direct = m.logits(&direct.select(1, 22)).unwrap();
                let d = (&full - direct).abs().max().double_value(&[]);
                assert!(d < 1e-5, "{arch} pad {pad}: {d}");
                for chunk in [1, 4, 7, 23] {
                    let (l, cache) = run(chunk);
                    let d = (&full - l).abs().max().double_value(&[]);
                    assert!(d < 1e-5, "{arch} pad {pad} chunk {chunk}: logits {d}");
                    for (a, b) in full_cache.layers.iter().zip(&cache.layers) {
                        let real = |t: &Tensor| t.narrow(2, pad, 23);
                        let d = (real(&a.k) - real(&b.k)).abs().max().double_value(&[])
                            + (real(&a.v) - real(&b.v)).abs().max().double_value(&[]);
                        assert!(d < 1e-5, "{arch} pad {pad} chunk {chunk}: kv {d}");
                    }
                }
            }
        }
    }

    /// The cache path equals recomputing the whole sequence every step (greedy), with grouped
    /// and with one K/V head per query head (the cache views then reach the kernel unrepeated).
    #[test]
    fn cached_greedy_equals_full_recompute() {
        for kv_heads in [2, 4] {
            cached_greedy_equals_full_recompute_with(kv_heads);
        }
    }

    fn cached_greedy_equals_full_recompute_with(kv_heads: i64) {
        let m = model_kv("Qwen3ForCausalLM", kv_heads);
        let p = prompt(9, 2);
        let opts = GenerateOptions {
            max_new_tokens: 6,
            ..Default::default()
        };
        let g = generate(&m, std::slice::from_ref(&p), &opts, None).unwrap();
        let mut seq = p.clone();
        let _g = tch::no_grad_guard();
        for _ in 0..6 {
            let t = seq.len() as i64;
            let tok = Tensor::from_slice(&seq).view([1, t]);
            let pos = Tensor::arange(t, (Kind::Int64, Device::Cpu)).view([1, t]);
            let h = m.forward(&ForwardArgs::new(&tok, &pos)).unwrap().hidden;
            let next = m.logits(&h.select(1, t - 1)).unwrap().argmax(-1, false);
            seq.push(next.int64_value(&[0]));
        }
        assert_eq!(g[0].ids, seq[9..]);
        assert_eq!(g[0].stop, StopReason::Length);
    }

    /// Batches of different prompt lengths, greedy and sampled, give what each prompt gives alone;
    /// an EOS id ends a row and is kept.
    #[test]
    fn batched_equals_alone_and_eos_stops() {
        let m = model("LlamaForCausalLM");
        let prompts: Vec<Vec<i64>> = [5, 12, 1, 8].iter().map(|&l| prompt(l, l)).collect();
        for sampling in [
            None,
            Some(Sampling {
                temperature: 0.8,
                top_p: 0.9,
                seed: 3,
            }),
        ] {
            let opts = GenerateOptions {
                max_new_tokens: 7,
                sampling,
                prefill_chunk: 3,
                ..Default::default()
            };
            let batched = generate(&m, &prompts, &opts, None).unwrap();
            for (i, p) in prompts.iter().enumerate() {
                // Alone, but with the same index (the sampler is keyed by it).
                let mut alone = vec![vec![0]; i];
                alone.push(p.clone());
                let one = GenerateOptions {
                    batch_size: 1,
                    ..opts.clone()
                };
                let a = generate(&m, &alone, &one, None).unwrap();
                assert_eq!(a[i], batched[i], "prompt {i}");
            }
            let eos = batched[1].ids[3];
            let first = batched[1].ids.iter().position(|&t| t == eos).unwrap();
            let e = generate(
                &m,
                &prompts,
                &GenerateOptions {
                    eos: vec![eos],
                    ..opts.clone()
                },
                None,
            )
            .unwrap();
            assert_eq!(e[1].ids, batched[1].ids[..=first]);
            assert_eq!(e[1].stop, StopReason::Eos);
        }
    }

    #[test]
    fn sampling_is_seeded_and_top_p_keeps_the_nucleus() {
        let logits = [0.0f32, 5.0, 4.9, -3.0];
        let s = Sampling {
            temperature: 1.0,
            top_p: 0.5,
            seed: 0,
        };
        let mut rng = SplitMix64::keyed(&[1]);
        // p(1) ≈ 0.51 ≥ 0.5: the nucleus is token 1 alone.
        assert!((0..50).all(|_| sample(&logits, &s, &mut rng) == 1));
        let wide = Sampling { top_p: 1.0, ..s };
        let draws: Vec<i64> = (0..200).map(|_| sample(&logits, &wide, &mut rng)).collect();
        assert!(draws.contains(&1) && draws.contains(&2));
        let again = |seed| {
            let mut r = SplitMix64::keyed(&[seed]);
            (0..20)
                .map(|_| sample(&logits, &wide, &mut r))
                .collect::<Vec<_>>()
        };
        assert_eq!(again(5), again(5));
    }

    #[test]
    fn teacher_forced_scores_equal_one_forward_of_prompt_and_continuation() {
        for arch in ["LlamaForCausalLM", "Qwen3ForCausalLM"] {
            let m = model_kv(arch, 1);
            let p = prompt(23, 3);
            let conts = vec![vec![5], vec![9, 1, 60], vec![0, 33], vec![12, 12, 12, 12]];
            // Batches of 3 (a short second batch) and a prefill in chunks of 8 (not dividing 23).
            let got = score_continuations(&m, &p, &conts, 3, 8).unwrap();
            let _g = tch::no_grad_guard();
            for (c, s) in conts.iter().zip(&got) {
                let full: Vec<i64> = p.iter().chain(c).copied().collect();
                let n = full.len() as i64;
                let tok = Tensor::from_slice(&full).view([1, n]);
                let pos = Tensor::arange(n, (Kind::Int64, Device::Cpu)).view([1, n]);
                let h = m.forward(&ForwardArgs::new(&tok, &pos)).unwrap().hidden;
                let lp = m.logits(&h).unwrap().log_softmax(-1, Kind::Double);
                let mut want = Vec::new();
                let mut greedy = true;
                for (j, &t) in c.iter().enumerate() {
                    let at = p.len() as i64 - 1 + j as i64;
                    want.push(lp.double_value(&[0, at, t]));
                    greedy &= lp.get(0).get(at).argmax(-1, false).int64_value(&[]) == t;
                }
                assert_eq!(s.token_logprobs.len(), c.len());
                for (a, b) in s.token_logprobs.iter().zip(&want) {
                    assert!((a - b).abs() < 1e-4, "{arch} {c:?}: {a} vs {b}");
                }
                assert!((s.logprob - want.iter().sum::<f64>()).abs() < 1e-4);
                assert_eq!(s.greedy, greedy, "{arch} {c:?}");
            }
            // Greedy decoding's own output is greedy under teacher forcing.
            let opts = GenerateOptions {
                max_new_tokens: 4,
                ..Default::default()
            };
            let gen = generate(&m, std::slice::from_ref(&p), &opts, None).unwrap();
            let s = score_continuations(&m, &p, &[gen[0].ids.clone()], 1, 64).unwrap();
            assert!(
                s[0].greedy,
                "{arch}: greedy output {:?} not greedy",
                gen[0].ids
            );
        }
    }

    #[test]
    fn teacher_forcing_refuses_empty_inputs() {
        let m = model("LlamaForCausalLM");
        let err = |r: Result<Vec<ContinuationScore>>| r.unwrap_err().to_string();
        assert!(
            err(score_continuations(&m, &[], &[vec![1]], 1, 8)).contains("prompt has no tokens")
        );
        assert!(
            err(score_continuations(&m, &[1], &[vec![1], vec![]], 1, 8)).contains("continuation 1")
        );
        assert!(err(score_continuations(&m, &[1], &[vec![1]], 0, 8)).contains("batch size"));
    }

    #[test]
    fn bad_inputs_are_clear_errors() {
        let m = model("LlamaForCausalLM");
        let e = generate(&m, &[vec![]], &GenerateOptions::default(), None).unwrap_err();
        assert!(e.to_string().contains("prompt 0 has no tokens"), "{e}");
        let stop = GenerateOptions {
            stop: vec!["x".into()],
            ..Default::default()
        };
        let e = generate(&m, &[vec![1]], &stop, None).unwrap_err();
        assert!(e.to_string().contains("tokenizer"), "{e}");

        let dir = tempfile::tempdir().unwrap();
        let e = TextTokenizer::from_dir(dir.path()).unwrap_err();
        assert!(e.to_string().contains("tokenizer.json"), "{e}");
        let f = dir.path().join("p.jsonl");
        std::fs::write(&f, "{\"prompt\": \"a\"}\n\n{\"text\": \"b\"}\n").unwrap();
        let e = read_prompts_jsonl(&f).unwrap_err().to_string();
        assert!(e.ends_with("p.jsonl:3: missing field \"prompt\""), "{e}");
        std::fs::write(&f, "{\"prompt\": 3}\n").unwrap();
        let e = read_prompts_jsonl(&f).unwrap_err().to_string();
        assert!(e.contains(":1: field \"prompt\" is not a string"), "{e}");

        std::fs::write(dir.path().join("config.json"), "{\"eos_token_id\": [2, 7]}").unwrap();
        assert_eq!(eos_token_ids(dir.path()).unwrap(), [2, 7]);
        std::fs::write(
            dir.path().join("generation_config.json"),
            "{\"eos_token_id\": 5}",
        )
        .unwrap();
        assert_eq!(eos_token_ids(dir.path()).unwrap(), [5]);
    }
}
