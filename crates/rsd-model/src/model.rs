//! The decoder shared by Llama and Qwen3: RMSNorm → MLP → Attention → Layer → Model.
//!
//! The two families differ only in Qwen3's per-head RMSNorm on queries and keys (applied before
//! RoPE) and in config defaults, so one decoder serves both; the differences are the
//! `Family::Qwen3` branches below. Parameter paths in the [`VarStore`] are the HF safetensors keys
//! (`model.layers.3.self_attn.q_proj.weight`), so loading and saving need no name table.
//!
//! The forward pass is shaped for training, not generation: it takes explicit position ids,
//! optional document boundaries and an optional per-layer K/V prefix from an earlier pass, and
//! returns the final hidden states (after the last norm) plus, on request, every layer's K/V.
use rsd_common::rng::SplitMix64;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::attention::{
    attend, attend_documents, attend_materialised, DocBoundaries, KvBlock, Mask, ScoreChanges,
};
use crate::config::{Family, ModelConfig};
use crate::error::{ModelError, Result, TchContext};
use crate::rope::{apply_rotary, Rope};
use crate::{kind_name, shape_str};
use rayon::prelude::*;

type TchResult<T> = std::result::Result<T, tch::TchError>;

/// Where and in which dtype the parameters live.
#[derive(Debug, Clone, Copy)]
pub struct ModelOptions {
    /// `Device::Cpu` or `Device::Cuda(n)`.
    pub device: Device,
    /// `Kind::Float` or `Kind::BFloat16` (others work but are not tested).
    pub kind: Kind,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            device: Device::Cpu,
            kind: Kind::Float,
        }
    }
}

/// `n` normal(0, `std`) values from a generator seeded by `seed` and the parameter's name. Our own
/// generator (SplitMix64 + Box–Muller) instead of libtorch's global one: the values do not depend
/// on what else ran before or concurrently (parallel tests), nor on the order parameters are made.
///
/// Drawn in parallel pieces (rayon): the generator is a counter, so each piece starts where the
/// sequence would be and the values are the same as one sequential stream's (a 1.9 B-parameter
/// model initialises in seconds on a many-core host instead of about a minute).
fn normal_values(seed: i64, name: &str, n: usize, std: f64) -> Vec<f32> {
    // FNV-1a-style fold of the name into the seed: the starting state (fixed: it pins the values).
    let mut state = seed as u64 ^ 0x9e37_79b9_7f4a_7c15;
    for b in name.bytes() {
        state = (state ^ b as u64).wrapping_mul(0x1000_0000_01b3);
    }
    // Pairs of values from pairs of draws; a piece is PIECE pairs.
    const PIECE: usize = 1 << 16;
    let mut out = vec![0f32; n + n % 2];
    out.par_chunks_mut(2 * PIECE)
        .enumerate()
        .for_each(|(i, chunk)| {
            let mut rng = SplitMix64::from_state(state);
            rng.skip((2 * i * PIECE) as u64);
            // (0, 1]: Box–Muller takes the logarithm of the first draw.
            let mut next = move || rng.uniform() + f64::EPSILON;
            for pair in chunk.chunks_exact_mut(2) {
                let (u1, u2) = (next(), next());
                let r = (-2.0 * u1.ln()).sqrt() * std;
                let a = 2.0 * std::f64::consts::PI * u2;
                pair[0] = (r * a.cos()) as f32;
                pair[1] = (r * a.sin()) as f32;
            }
        });
    out.truncate(n);
    out
}

/// How fresh parameters are filled.
#[derive(Debug, Clone, Copy)]
pub enum Init {
    /// Uninitialised memory, to be overwritten by a checkpoint.
    Empty,
    /// transformers' init: normal(0, `initializer_range`) for linear and embedding weights, zeros
    /// for biases, ones for norms; deterministic for a seed (see `normal_values`).
    Random {
        /// Seed for `tch::manual_seed`.
        seed: i64,
    },
}

/// Post-RoPE keys and values of one layer, `[B, Hkv, L, head_dim]` each.
#[derive(Debug)]
pub struct LayerKv {
    /// Keys with RoPE applied at their own positions.
    pub k: Tensor,
    /// Values.
    pub v: Tensor,
}

/// Inputs of [`Model::forward`].
#[derive(Debug, Clone, Copy)]
pub struct ForwardArgs<'a> {
    /// Token ids `[B, T]` (int64).
    pub tokens: &'a Tensor,
    /// Position ids `[B, T]` (int64): any integers, one per token.
    pub positions: &'a Tensor,
    /// Optional document boundaries; with a prefix they cover `[prefix ; tokens]`.
    pub doc_bounds: Option<&'a DocBoundaries>,
    /// Optional K/V of an earlier pass, one entry per layer, `[B, Hkv, Lp, head_dim]`: the tokens
    /// attend to all of it (within their document) and then causally to themselves.
    pub prefix: Option<&'a [LayerKv]>,
    /// Return every layer's K/V (for a later pass to reuse as its prefix).
    pub return_kv: bool,
    /// Context parallelism: the tokens are some chunks of longer sequences split over ranks
    /// (no `doc_bounds` or `prefix` with it yet).
    pub cp: Option<&'a ContextChunks<'a>>,
}

impl<'a> ForwardArgs<'a> {
    /// Plain causal forward at the given positions.
    pub fn new(tokens: &'a Tensor, positions: &'a Tensor) -> Self {
        ForwardArgs {
            tokens,
            positions,
            doc_bounds: None,
            prefix: None,
            return_kv: false,
            cp: None,
        }
    }
}

/// Gathers a `[B, Hkv, Llocal, D]` tensor of every rank of a context-parallel group into
/// `[B, Hkv, L, D]`, rows in sequence order, differentiably (its backward sums each rank's rows'
/// gradients over the ranks). The model does not know the process group; the trainer does.
pub type KvGather<'a> = dyn Fn(&Tensor) -> Result<Tensor> + 'a;

/// This rank's share of context-parallel sequences: which chunks of each sequence it holds (the
/// same for every row of the batch), and how to gather the other ranks' keys and values.
///
/// A chunk's queries attend to the keys of every earlier row of the sequence (gathered) and
/// causally to their own chunk, through the same LSE-merged primitive as prefix reuse, so the
/// result is the single-process attention of those rows.
pub struct ContextChunks<'a> {
    /// `(first row in the sequence, rows)` of each local chunk, in local order.
    pub chunks: Vec<(i64, i64)>,
    /// Document boundaries of each whole sequence (`[0, …, L]` per batch row), for
    /// document-masked attention: a query sees earlier keys of its own document only.
    pub doc_bounds: Option<Vec<Vec<i64>>>,
    /// The K/V gather.
    pub gather: &'a KvGather<'a>,
}

impl std::fmt::Debug for ContextChunks<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContextChunks")
            .field("chunks", &self.chunks)
            .finish_non_exhaustive()
    }
}

/// RoPE cos/sin tables for one pass at explicit positions (see [`Model::rotary`]), or none: a
/// pass without rotary embeddings (NoPE, [`Rotary::none`]).
#[derive(Debug)]
pub struct Rotary {
    tables: Option<(Tensor, Tensor)>,
}

impl Rotary {
    /// No rotation: queries and keys enter the attention as projected (NoPE). Not RoPE at
    /// position 0: with YaRN that would still scale them by the attention factor.
    pub fn none() -> Self {
        Rotary { tables: None }
    }
}

/// Outputs of [`Model::forward`].
#[derive(Debug)]
pub struct ForwardOutput {
    /// Final hidden states `[B, T, hidden_size]` (after the final norm), in the model dtype.
    pub hidden: Tensor,
    /// Per-layer K/V when `return_kv` was set.
    pub kv: Option<Vec<LayerKv>>,
}

fn linear(x: &Tensor, w: &Tensor, b: &Option<Tensor>) -> TchResult<Tensor> {
    x.f_linear(w, b.as_ref())
}

/// RMSNorm over the last dimension of `x` with `weight` (of that size).
///
/// Half precision on CUDA: libtorch's fused kernel (`rms_norm`, one kernel forward and one
/// backward instead of about eight and a dozen elementwise ones; statistics in fp32). It
/// multiplies by the weight in fp32 and rounds once, where transformers rounds the normalised
/// value to the input dtype first and then multiplies: the two differ by at most one rounding of
/// the input dtype. Everywhere else exactly as transformers computes it: statistics in fp32, the
/// weight applied after casting back to the input dtype (so CPU runs and every fp32/fp64 run match
/// transformers to the bit pattern they always did).
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> TchResult<Tensor> {
    let kind = x.kind();
    let half = matches!(kind, Kind::BFloat16 | Kind::Half);
    if half && x.device().is_cuda() && weight.kind() == kind {
        let d = x.size().last().copied().unwrap_or(0);
        return x.f_rms_norm([d], Some(weight), eps);
    }
    let xf = x.f_to_kind(Kind::Float)?;
    let var = xf
        .f_pow_tensor_scalar(2)?
        .f_mean_dim(-1, true, Kind::Float)?;
    let normed = xf.f_mul(&var.f_add_scalar(eps)?.f_rsqrt()?)?;
    weight.f_mul(&normed.f_to_kind(kind)?)
}

/// A model's RMSNorm: its weight and ε ([`rms_norm`]).
#[derive(Debug)]
struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    fn forward(&self, x: &Tensor) -> TchResult<Tensor> {
        rms_norm(x, &self.weight, self.eps)
    }
}

#[derive(Debug)]
struct Mlp {
    gate: (Tensor, Option<Tensor>),
    up: (Tensor, Option<Tensor>),
    down: (Tensor, Option<Tensor>),
}

impl Mlp {
    fn forward(&self, x: &Tensor) -> TchResult<Tensor> {
        let g = linear(x, &self.gate.0, &self.gate.1)?.f_silu()?;
        let u = linear(x, &self.up.0, &self.up.1)?;
        linear(&g.f_mul(&u)?, &self.down.0, &self.down.1)
    }
}

#[derive(Debug)]
struct SelfAttention {
    q: (Tensor, Option<Tensor>),
    k: (Tensor, Option<Tensor>),
    v: (Tensor, Option<Tensor>),
    o: (Tensor, Option<Tensor>),
    /// Qwen3 only: RMSNorm over each head of q and k.
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
}

/// Per-forward state every layer needs.
struct Ctx<'a> {
    rotary: &'a Rotary,
    doc_bounds: Option<&'a DocBoundaries>,
    cp: Option<&'a ContextChunks<'a>>,
    /// Changes to the attention scores or probabilities (materialised attention).
    scores: Option<&'a ScoreChanges<'a>>,
}

impl SelfAttention {
    fn forward(
        &self,
        x: &Tensor,
        ctx: &Ctx<'_>,
        prefix: Option<&LayerKv>,
    ) -> Result<(Tensor, LayerKv)> {
        let (b, t, _) = x.size3().ctx("attention input")?;
        // 1. Projections, (B, T, H·D) -> (B, T, H, D); Qwen3 normalises each head here.
        let proj = || -> TchResult<(Tensor, Tensor, Tensor)> {
            let mut q =
                linear(x, &self.q.0, &self.q.1)?.f_view([b, t, self.heads, self.head_dim])?;
            let mut k =
                linear(x, &self.k.0, &self.k.1)?.f_view([b, t, self.kv_heads, self.head_dim])?;
            let v =
                linear(x, &self.v.0, &self.v.1)?.f_view([b, t, self.kv_heads, self.head_dim])?;
            if let Some((qn, kn)) = &self.qk_norm {
                q = qn.forward(&q)?;
                k = kn.forward(&k)?;
            }
            // 2. (B, T, H, D) -> (B, H, T, D)
            Ok((
                q.f_transpose(1, 2)?,
                k.f_transpose(1, 2)?,
                v.f_transpose(1, 2)?,
            ))
        };
        let (q, k, v) = proj().ctx("attention projections")?;
        // 3. RoPE at the explicit positions (none for a NoPE pass).
        let (q, k) = match &ctx.rotary.tables {
            Some((cos, sin)) => (apply_rotary(&q, cos, sin)?, apply_rotary(&k, cos, sin)?),
            None => (q, k),
        };
        // 4. The one primitive: [prefix, unmasked] + [own block, causal], per document; changed
        // scores or probabilities need them materialised.
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let attn = match (ctx.cp, ctx.scores) {
            (Some(cc), _) => attend_context(&q, &k, &v, cc, scale)?,
            (None, Some(sc)) => attend_materialised(&q, &k, &v, ctx.doc_bounds, scale, sc)?,
            (None, None) => {
                attend_documents(
                    &q,
                    &k,
                    &v,
                    prefix.map(|p| (&p.k, &p.v)),
                    ctx.doc_bounds,
                    scale,
                )?
                .out
            }
        };
        // 5. (B, H, T, D) -> (B, T, H·D) -> o_proj
        let out = attn
            .f_transpose(1, 2)
            .and_then(|o| o.f_reshape([b, t, self.heads * self.head_dim]))
            .and_then(|o| linear(&o, &self.o.0, &self.o.1))
            .ctx("attention output")?;
        Ok((out, LayerKv { k, v }))
    }
}

/// Attention of this rank's chunks (`q`, `k`, `v` `[B, H(kv), Llocal, D]`, chunks in local
/// order): each chunk's queries see the gathered keys of all earlier rows, unmasked, and their own
/// chunk causally — within their documents when the sequences have document boundaries (the
/// gathered keys are the chunk's prefix, and the boundaries up to the chunk's end cover
/// `[prefix ; chunk]`, exactly what [`attend_documents`] takes).
fn attend_context(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cc: &ContextChunks<'_>,
    scale: f64,
) -> Result<Tensor> {
    let local: i64 = cc.chunks.iter().map(|&(_, n)| n).sum();
    if local != q.size()[2] {
        return Err(ModelError::Input(format!(
            "context parallelism: the chunks hold {local} rows, the input {}",
            q.size()[2]
        )));
    }
    let k_all = (cc.gather)(k)?;
    let v_all = (cc.gather)(v)?;
    let mut outs = Vec::with_capacity(cc.chunks.len());
    let mut off = 0;
    for &(start, n) in &cc.chunks {
        let part = |t: &Tensor, at: i64, len: i64| t.f_narrow(2, at, len).ctx("context chunk");
        let (qc, kc, vc) = (part(q, off, n)?, part(k, off, n)?, part(v, off, n)?);
        let (kp, vp) = (part(&k_all, 0, start)?, part(&v_all, 0, start)?);
        if let Some(doc_bounds) = &cc.doc_bounds {
            let end = start + n;
            let clipped = doc_bounds
                .iter()
                .map(|cu| {
                    let mut c: Vec<i64> = cu.iter().copied().take_while(|&o| o < end).collect();
                    c.push(end);
                    c
                })
                .collect();
            let doc_bounds = DocBoundaries::new(clipped, end)?;
            let prefix = (start > 0).then_some((&kp, &vp));
            outs.push(attend_documents(&qc, &kc, &vc, prefix, Some(&doc_bounds), scale)?.out);
            off += n;
            continue;
        }
        let blocks = [
            KvBlock {
                k: &kp,
                v: &vp,
                mask: Mask::None,
            },
            KvBlock {
                k: &kc,
                v: &vc,
                mask: Mask::Causal,
            },
        ];
        outs.push(attend(&qc, &blocks, scale)?.out);
        off += n;
    }
    let out = Tensor::f_cat(&outs, 2).ctx("context chunks")?;
    if cc.doc_bounds.is_none() {
        return Ok(out);
    }
    // The gather's backward is a collective that every rank of the group must run. Under
    // document masking, a rank whose chunks all begin documents never reads the gathered keys;
    // autograd would then skip its gather's backward while the other ranks wait in theirs. An
    // empty slice of each gathered tensor, summed (exactly 0) into the output, keeps both in
    // every rank's graph.
    let empty_sum = |t: &Tensor| t.f_narrow(2, 0, 0).and_then(|e| e.f_sum(t.kind()));
    (|| out.f_add(&empty_sum(&k_all)?)?.f_add(&empty_sum(&v_all)?))()
        .ctx("context: keeping the gathers in the graph")
}

#[derive(Debug)]
struct Layer {
    input_layernorm: RmsNorm,
    self_attn: SelfAttention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

impl Layer {
    fn forward(
        &self,
        x: &Tensor,
        ctx: &Ctx<'_>,
        prefix: Option<&LayerKv>,
    ) -> Result<(Tensor, LayerKv)> {
        let h = self.input_layernorm.forward(x).ctx("input_layernorm")?;
        let (a, kv) = self.self_attn.forward(&h, ctx, prefix)?;
        let f = || -> TchResult<Tensor> {
            let x = x.f_add(&a)?;
            let m = self
                .mlp
                .forward(&self.post_attention_layernorm.forward(&x)?)?;
            x.f_add(&m)
        };
        Ok((f().ctx("mlp")?, kv))
    }
}

/// A Llama or Qwen3 causal LM.
#[derive(Debug)]
pub struct Model {
    config: ModelConfig,
    options: ModelOptions,
    vs: VarStore,
    embed_tokens: Tensor,
    layers: Vec<Layer>,
    norm: RmsNorm,
    /// The embedding matrix itself when embeddings are tied.
    lm_head: Tensor,
    rope: Rope,
}

/// Creates one parameter under `path` (its full name is the safetensors key).
struct Builder<'a> {
    vs: &'a VarStore,
    options: ModelOptions,
    init: Init,
    std: f64,
}

#[derive(Clone, Copy)]
enum Fill {
    Normal,
    Zeros,
    Ones,
}

impl Builder<'_> {
    fn param(&self, path: &str, dims: &[i64], fill: Fill) -> Result<Tensor> {
        let dev = self.options.device;
        let t = match (self.init, fill) {
            (Init::Empty, _) => Tensor::f_empty(dims, (self.options.kind, dev)),
            (Init::Random { seed }, Fill::Normal) => {
                let n: i64 = dims.iter().product();
                let values = normal_values(seed, path, n as usize, self.std);
                Tensor::f_from_slice(&values)
                    .and_then(|t| t.f_reshape(dims))
                    .and_then(|t| t.f_to_device(dev))
            }
            (Init::Random { .. }, Fill::Zeros) => Tensor::f_zeros(dims, (Kind::Float, dev)),
            (Init::Random { .. }, Fill::Ones) => Tensor::f_ones(dims, (Kind::Float, dev)),
        }
        .and_then(|t| t.f_to_kind(self.options.kind))
        .ctx("allocating parameters")?;
        // tch joins path components with '.', so the full name is the safetensors key.
        let mut parts: Vec<&str> = path.split('.').collect();
        let name = parts.pop().unwrap_or(path);
        let dir = parts.iter().fold(self.vs.root(), |p, c| p.sub(*c));
        Ok(dir.add(name, t, true))
    }

    fn linear(
        &self,
        path: &str,
        out: i64,
        inp: i64,
        bias: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let w = self.param(&format!("{path}.weight"), &[out, inp], Fill::Normal)?;
        let b = if bias {
            Some(self.param(&format!("{path}.bias"), &[out], Fill::Zeros)?)
        } else {
            None
        };
        Ok((w, b))
    }

    fn norm(&self, path: &str, dim: i64, eps: f64) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: self.param(&format!("{path}.weight"), &[dim], Fill::Ones)?,
            eps,
        })
    }

    /// Decoder layer `i` (`model.layers.{i}.*`).
    fn layer(&self, c: &ModelConfig, i: i64) -> Result<Layer> {
        let p = format!("model.layers.{i}");
        let (d, hd, eps) = (c.hidden_size, c.head_dim, c.rms_norm_eps);
        let ab = c.attention_bias;
        let qk_norm = match c.family {
            Family::Qwen3 => Some((
                self.norm(&format!("{p}.self_attn.q_norm"), hd, eps)?,
                self.norm(&format!("{p}.self_attn.k_norm"), hd, eps)?,
            )),
            Family::Llama => None,
        };
        let (nq, nkv) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
        let self_attn = SelfAttention {
            q: self.linear(&format!("{p}.self_attn.q_proj"), nq, d, ab)?,
            k: self.linear(&format!("{p}.self_attn.k_proj"), nkv, d, ab)?,
            v: self.linear(&format!("{p}.self_attn.v_proj"), nkv, d, ab)?,
            o: self.linear(&format!("{p}.self_attn.o_proj"), d, nq, ab)?,
            qk_norm,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: hd,
        };
        let (ff, mb) = (c.intermediate_size, c.mlp_bias);
        Ok(Layer {
            input_layernorm: self.norm(&format!("{p}.input_layernorm"), d, eps)?,
            self_attn,
            post_attention_layernorm: self.norm(
                &format!("{p}.post_attention_layernorm"),
                d,
                eps,
            )?,
            mlp: Mlp {
                gate: self.linear(&format!("{p}.mlp.gate_proj"), ff, d, mb)?,
                up: self.linear(&format!("{p}.mlp.up_proj"), ff, d, mb)?,
                down: self.linear(&format!("{p}.mlp.down_proj"), d, ff, mb)?,
            },
        })
    }
}

impl Model {
    /// Builds a model for `config` with parameters filled per `init`.
    pub fn new(config: ModelConfig, options: ModelOptions, init: Init) -> Result<Self> {
        let vs = VarStore::new(options.device);
        let c = &config;
        let bld = Builder {
            vs: &vs,
            options,
            init,
            std: c.initializer_range,
        };
        let d = c.hidden_size;
        let embed_tokens = bld.param(
            "model.embed_tokens.weight",
            &[c.vocab_size, d],
            Fill::Normal,
        )?;
        let layers = (0..c.num_hidden_layers)
            .map(|i| bld.layer(c, i))
            .collect::<Result<Vec<_>>>()?;
        let norm = bld.norm("model.norm", d, c.rms_norm_eps)?;
        let lm_head = if c.tie_word_embeddings {
            embed_tokens.shallow_clone()
        } else {
            bld.param("lm_head.weight", &[c.vocab_size, d], Fill::Normal)?
        };
        let rope = Rope::new(c, options.device)?;
        Ok(Model {
            config,
            options,
            vs,
            embed_tokens,
            layers,
            norm,
            lm_head,
            rope,
        })
    }

    /// A seeded random model (tiny models for tests and demos).
    pub fn random(config: ModelConfig, options: ModelOptions, seed: i64) -> Result<Self> {
        Self::new(config, options, Init::Random { seed })
    }

    /// The resolved config.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Device and dtype.
    pub fn options(&self) -> ModelOptions {
        self.options
    }

    /// The variable store (for optimizers: `vs.trainable_variables()`).
    pub fn var_store(&self) -> &VarStore {
        &self.vs
    }

    /// Parameters by safetensors key, sorted by key.
    pub fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Replaces the RoPE base (ABF) and rebuilds the frequencies.
    pub fn set_rope_theta(&mut self, theta: f64) -> Result<()> {
        self.config.set_rope_theta(theta)?;
        self.rope = Rope::new(&self.config, self.options.device)?;
        Ok(())
    }

    /// Replaces `rope_scaling` (an HF dict or `null`, e.g. YaRN for evaluation) and rebuilds the
    /// frequencies.
    pub fn set_rope_scaling(&mut self, value: serde_json::Value) -> Result<()> {
        self.config.set_rope_scaling(value)?;
        self.rope = Rope::new(&self.config, self.options.device)?;
        Ok(())
    }

    /// Mutable config access for fields that do not change the computation (e.g.
    /// `max_position_embeddings` before saving).
    pub fn config_mut_for_save(&mut self) -> &mut ModelConfig {
        &mut self.config
    }

    fn check_args(&self, args: &ForwardArgs<'_>) -> Result<(i64, i64)> {
        let ts = args.tokens.size();
        let [b, t] = ts[..] else {
            return Err(ModelError::Input(format!(
                "tokens must be [B, T], got {}",
                shape_str(&ts)
            )));
        };
        if args.positions.size() != ts {
            return Err(ModelError::Input(format!(
                "positions {} must have the shape of tokens {}",
                shape_str(&args.positions.size()),
                shape_str(&ts)
            )));
        }
        for (name, t) in [("tokens", args.tokens), ("positions", args.positions)] {
            if !matches!(
                t.kind(),
                Kind::Int64 | Kind::Int | Kind::Int16 | Kind::Uint8 | Kind::Int8
            ) {
                return Err(ModelError::Input(format!(
                    "{name} must be integers, got {}",
                    kind_name(t.kind())
                )));
            }
        }
        // A range check is a host sync on GPU; the loader guarantees ids there. On CPU it is free
        // and turns a libtorch index error into a message naming the id.
        if args.tokens.device() == Device::Cpu && b * t > 0 {
            let lo = args.tokens.min().int64_value(&[]);
            let hi = args.tokens.max().int64_value(&[]);
            if lo < 0 || hi >= self.config.vocab_size {
                return Err(ModelError::Input(format!(
                    "token ids must lie in [0, {}), got min {lo}, max {hi}",
                    self.config.vocab_size
                )));
            }
        }
        if let Some(prefix) = args.prefix {
            if prefix.len() != self.layers.len() {
                return Err(ModelError::Input(format!(
                    "prefix has K/V for {} layers, the model has {}",
                    prefix.len(),
                    self.layers.len()
                )));
            }
            let c = &self.config;
            for (i, p) in prefix.iter().enumerate() {
                let ks = p.k.size();
                let ok = ks.len() == 4
                    && ks[0] == b
                    && ks[1] == c.num_key_value_heads
                    && ks[3] == c.head_dim
                    && p.v.size() == ks;
                if !ok {
                    return Err(ModelError::Input(format!(
                        "prefix of layer {i}: k {}, v {}; expected [{b}, {}, Lp, {}]",
                        shape_str(&ks),
                        shape_str(&p.v.size()),
                        c.num_key_value_heads,
                        c.head_dim
                    )));
                }
            }
        }
        Ok((b, t))
    }

    /// Runs the decoder. See [`ForwardArgs`]; returns final hidden states and optionally K/V.
    pub fn forward(&self, args: &ForwardArgs<'_>) -> Result<ForwardOutput> {
        self.check_args(args)?;
        if args.cp.is_some() && (args.doc_bounds.is_some() || args.prefix.is_some()) {
            return Err(ModelError::Input(
                "context parallelism with document boundaries or a K/V prefix is not supported \
                 yet"
                .into(),
            ));
        }
        let mut x = self.embed(args.tokens)?;
        let rotary = self.rotary(args.positions)?;
        let mut kvs = args
            .return_kv
            .then(|| Vec::with_capacity(self.layers.len()));
        for i in 0..self.layers.len() {
            let prefix = args.prefix.map(|p| &p[i]);
            let (y, kv) = match args.cp {
                Some(cc) => self.layer_forward_split(i, &x, &rotary, cc)?,
                None => self.layer_forward(i, &x, &rotary, args.doc_bounds, prefix)?,
            };
            x = y;
            if let Some(kvs) = kvs.as_mut() {
                kvs.push(kv);
            }
        }
        let hidden = self.final_norm(&x)?;
        Ok(ForwardOutput { hidden, kv: kvs })
    }

    // The pieces of `forward`, public for callers that drive the layers themselves (the trainer's
    // per-layer activation checkpointing and its interleaved two-view pass). `forward` is exactly
    // embed → rotary → layer_forward for every layer → final_norm, and does the input checks.

    /// Number of decoder layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Token embeddings `[B, T, hidden]` for ids `[B, T]` (no range check; see [`Model::forward`]).
    pub fn embed(&self, tokens: &Tensor) -> Result<Tensor> {
        let tokens = tokens.f_to_kind(Kind::Int64).ctx("tokens")?;
        Tensor::f_embedding(&self.embed_tokens, &tokens, -1, false, false).ctx("embedding")
    }

    /// RoPE tables at explicit positions `[B, T]`, shared by every layer of one pass.
    pub fn rotary(&self, positions: &Tensor) -> Result<Rotary> {
        let (cos, sin) = self.rope.cos_sin(positions, self.options.kind)?;
        Ok(Rotary {
            tables: Some((cos, sin)),
        })
    }

    /// Decoder layer `i` on `x` `[B, T, hidden]`: returns its output and its post-RoPE K/V.
    /// `doc_bounds` and `prefix` mean what they mean in [`ForwardArgs`].
    pub fn layer_forward(
        &self,
        i: usize,
        x: &Tensor,
        rotary: &Rotary,
        doc_bounds: Option<&DocBoundaries>,
        prefix: Option<&LayerKv>,
    ) -> Result<(Tensor, LayerKv)> {
        let ctx = Ctx {
            rotary,
            doc_bounds,
            cp: None,
            scores: None,
        };
        self.layer(i)?.forward(x, &ctx, prefix)
    }

    /// [`Model::layer_forward`] with changed attention scores or probabilities (`changes`: score
    /// noise, probability dropout), through the materialised attention (`[B, H, T, T]` scores;
    /// no key prefix).
    pub fn layer_forward_changed(
        &self,
        i: usize,
        x: &Tensor,
        rotary: &Rotary,
        doc_bounds: Option<&DocBoundaries>,
        changes: &ScoreChanges<'_>,
    ) -> Result<Tensor> {
        let ctx = Ctx {
            rotary,
            doc_bounds,
            cp: None,
            scores: Some(changes),
        };
        Ok(self.layer(i)?.forward(x, &ctx, None)?.0)
    }

    fn layer(&self, i: usize) -> Result<&Layer> {
        self.layers
            .get(i)
            .ok_or_else(|| ModelError::Input(format!("no layer {i}")))
    }

    /// Decoder layer `i` on this rank's chunks `x` of context-parallel sequences (see
    /// [`ContextChunks`]); a collective: every rank of the group runs it, and its backward.
    pub fn layer_forward_split(
        &self,
        i: usize,
        x: &Tensor,
        rotary: &Rotary,
        cp: &ContextChunks<'_>,
    ) -> Result<(Tensor, LayerKv)> {
        let ctx = Ctx {
            rotary,
            doc_bounds: None,
            cp: Some(cp),
            scores: None,
        };
        self.layer(i)?.forward(x, &ctx, None)
    }

    /// The final RMSNorm (what [`ForwardOutput::hidden`] is taken after).
    pub fn final_norm(&self, x: &Tensor) -> Result<Tensor> {
        self.norm.forward(x).ctx("final norm")
    }

    /// The output projection `[vocab, hidden]` (the embedding matrix when tied). Losses that form
    /// their own logits (chunked, with closed-form gradients) read it here.
    pub fn lm_head_weight(&self) -> &Tensor {
        &self.lm_head
    }

    /// LM-head logits `[.., vocab]` for hidden states `[.., hidden_size]`, in the model dtype.
    /// Training computes these in chunks; this is for inspection and tests.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        hidden
            .f_linear(&self.lm_head, None::<&Tensor>)
            .ctx("lm_head")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn tiny(arch: &str, tied: bool) -> ModelConfig {
        ModelConfig::from_hf_json(json!({"architectures": [arch], "vocab_size": 50,
            "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
            "tie_word_embeddings": tied, "rope_theta": 10000.0}))
        .unwrap()
    }

    fn ids(b: i64, t: i64) -> (Tensor, Tensor) {
        let tok = Tensor::randint(50, [b, t], (Kind::Int64, Device::Cpu));
        let pos = Tensor::arange(t, (Kind::Int64, Device::Cpu))
            .unsqueeze(0)
            .repeat([b, 1]);
        (tok, pos)
    }

    /// Seeded initial weights are part of what a run reproduces: these values were computed by
    /// the original generator and must not change.
    /// Under document masking, the gathered K/V stay in the graph even on a rank whose chunks
    /// all begin documents, so the gather's backward collective runs on every rank.
    #[test]
    fn context_gather_gets_a_gradient_when_no_document_crosses_a_chunk() {
        let (b, h, hkv, d, len) = (1, 4, 2, 8, 16);
        let opts = (Kind::Double, Device::Cpu);
        let q = Tensor::randn([b, h, 8, d], opts);
        let k = Tensor::randn([b, hkv, 8, d], opts);
        let v = Tensor::randn([b, hkv, 8, d], opts);
        // The "gathered" rows are a leaf of their own: its gradient is what the gather's
        // backward would reduce-scatter.
        let gathered_k = Tensor::randn([b, hkv, len, d], opts).set_requires_grad(true);
        let gathered_v = Tensor::randn([b, hkv, len, d], opts).set_requires_grad(true);
        let gather = |t: &Tensor| -> Result<Tensor> {
            Ok(if t.data_ptr() == k.data_ptr() {
                gathered_k.shallow_clone()
            } else {
                gathered_v.shallow_clone()
            })
        };
        // Chunks [0, 4) and [12, 16) of 16 rows; documents start at 0, 4, 12: neither chunk
        // reads a key before its own start.
        let cc = ContextChunks {
            chunks: vec![(0, 4), (12, 4)],
            doc_bounds: Some(vec![vec![0, 4, 12, 16]]),
            gather: &gather,
        };
        let out = attend_context(&q, &k, &v, &cc, 0.3).unwrap();
        out.sum(Kind::Double).backward();
        for (name, t) in [("k", &gathered_k), ("v", &gathered_v)] {
            let g = t.grad();
            assert!(g.defined(), "the gathered {name} left the graph");
            assert_eq!(g.abs().sum(Kind::Double).double_value(&[]), 0.0);
        }
    }

    #[test]
    fn init_values_are_pinned() {
        let bits = |seed, name, n, std| -> Vec<u32> {
            normal_values(seed, name, n, std)
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        assert_eq!(
            bits(0, "model.embed_tokens.weight", 4, 0.02),
            [0x3d3a_e436, 0x3aa5_627d, 0x3c1e_55f6, 0xbcfb_3c41]
        );
        assert_eq!(
            bits(7, "model.layers.0.mlp.up_proj.weight", 3, 1.0),
            [0x3fca_7fab, 0xbed8_fe3f, 0xc02c_916d]
        );
    }

    #[test]
    fn parameter_names_are_hf_keys_and_counts_match() {
        for (arch, tied) in [("LlamaForCausalLM", false), ("Qwen3ForCausalLM", true)] {
            let m = Model::random(tiny(arch, tied), ModelOptions::default(), 0).unwrap();
            let names: Vec<String> = m.named_parameters().into_iter().map(|p| p.0).collect();
            assert!(names.contains(&"model.layers.1.mlp.down_proj.weight".to_string()));
            assert_eq!(names.contains(&"lm_head.weight".to_string()), !tied);
            assert_eq!(
                names.iter().any(|n| n.contains("q_norm")),
                arch.starts_with("Qwen3")
            );
            let n: i64 = m
                .named_parameters()
                .iter()
                .map(|p| p.1.numel() as i64)
                .sum();
            assert_eq!(n, m.config().num_parameters());
        }
    }

    /// The skip view's prefix reuse: running the suffix against the standard pass's K/V gives
    /// the same hidden states as a full pass with the perturbed positions.
    #[test]
    fn prefix_kv_reuse_equals_full_perturbed_pass() {
        tch::manual_seed(3);
        let m = Model::random(tiny("Qwen3ForCausalLM", false), ModelOptions::default(), 1).unwrap();
        let (t, s, y) = (12, 5, 40);
        let (tok, pos) = ids(1, t);
        let std = m
            .forward(&ForwardArgs {
                return_kv: true,
                ..ForwardArgs::new(&tok, &pos)
            })
            .unwrap();
        let skip = pos.shallow_clone() + (pos.ge(s).to_kind(Kind::Int64) * y);
        let full = m.forward(&ForwardArgs::new(&tok, &skip)).unwrap();
        let kv = std.kv.unwrap();
        let prefix: Vec<LayerKv> = kv
            .iter()
            .map(|l| LayerKv {
                k: l.k.narrow(2, 0, s),
                v: l.v.narrow(2, 0, s),
            })
            .collect();
        let (tt, tp) = (tok.narrow(1, s, t - s), skip.narrow(1, s, t - s));
        let part = m
            .forward(&ForwardArgs {
                prefix: Some(&prefix),
                ..ForwardArgs::new(&tt, &tp)
            })
            .unwrap();
        let d = (part.hidden - full.hidden.narrow(1, s, t - s))
            .abs()
            .max()
            .double_value(&[]);
        assert!(d < 1e-5, "{d}");
    }

    #[test]
    fn gradients_reach_every_parameter() {
        let m = Model::random(tiny("LlamaForCausalLM", true), ModelOptions::default(), 2).unwrap();
        let (tok, pos) = ids(2, 6);
        let h = m.forward(&ForwardArgs::new(&tok, &pos)).unwrap().hidden;
        m.logits(&h)
            .unwrap()
            .logsumexp([-1], false)
            .sum(Kind::Float)
            .backward();
        for (name, p) in m.named_parameters() {
            let g = p.grad();
            assert!(
                g.defined() && g.abs().sum(Kind::Float).double_value(&[]) > 0.0,
                "{name}"
            );
        }
    }

    /// Evaluation applies RoPE scaling to a loaded model with `set_rope_scaling`: linear ×2 at
    /// positions 2p is plain RoPE at p; the saved config carries the scaling; `null` restores plain
    /// RoPE; a refused value leaves the model as it was.
    #[test]
    fn rope_scaling_set_after_load_changes_computation_and_saved_config() {
        let cfg = tiny("LlamaForCausalLM", false);
        let plain = Model::random(cfg.clone(), ModelOptions::default(), 4).unwrap();
        let mut scaled = Model::random(cfg, ModelOptions::default(), 4).unwrap();
        scaled
            .set_rope_scaling(json!({"rope_type": "linear", "factor": 2.0}))
            .unwrap();
        let (tok, pos) = ids(1, 6);
        let hidden = |m: &Model, p: &Tensor| m.forward(&ForwardArgs::new(&tok, p)).unwrap().hidden;
        let d = (hidden(&plain, &pos) - hidden(&scaled, &(&pos * 2)))
            .abs()
            .max()
            .double_value(&[]);
        assert!(d < 1e-6, "{d}");
        let far = (hidden(&plain, &pos) - hidden(&scaled, &pos))
            .abs()
            .max()
            .double_value(&[]);
        assert!(far > 1e-3, "scaling changes the computation: {far}");

        let tmp = tempfile::tempdir().unwrap();
        scaled
            .save(&tmp.path().join("m"), &Default::default())
            .unwrap();
        let back = Model::load(&tmp.path().join("m"), ModelOptions::default()).unwrap();
        assert_eq!(
            back.config().rope_scaling,
            crate::RopeScaling::Linear { factor: 2.0 }
        );

        assert!(scaled
            .set_rope_scaling(json!({"rope_type": "longrope", "factor": 2.0}))
            .is_err());
        assert_eq!(
            scaled.config().rope_scaling,
            crate::RopeScaling::Linear { factor: 2.0 }
        );
        scaled.set_rope_scaling(serde_json::Value::Null).unwrap();
        let d = (hidden(&plain, &pos) - hidden(&scaled, &pos))
            .abs()
            .max()
            .double_value(&[]);
        assert_eq!(d, 0.0);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let m = Model::random(tiny("LlamaForCausalLM", true), ModelOptions::default(), 2).unwrap();
        let (tok, pos) = ids(1, 4);
        let bad = tok.shallow_clone() + 100;
        let e = m.forward(&ForwardArgs::new(&bad, &pos)).unwrap_err();
        assert!(e.to_string().contains("token ids"), "{e}");
        let e = m
            .forward(&ForwardArgs::new(&tok, &pos.narrow(1, 0, 3)))
            .unwrap_err();
        assert!(e.to_string().contains("shape"), "{e}");
        let prefix = [LayerKv {
            k: Tensor::zeros([1, 2, 3, 8], (Kind::Float, Device::Cpu)),
            v: Tensor::zeros([1, 2, 3, 8], (Kind::Float, Device::Cpu)),
        }];
        let e = m.forward(&ForwardArgs {
            prefix: Some(&prefix),
            ..ForwardArgs::new(&tok, &pos)
        });
        assert!(e.unwrap_err().to_string().contains("layers"));
    }

    #[test]
    fn bf16_forward_runs_and_is_close_to_fp32() {
        let cfg = tiny("LlamaForCausalLM", false);
        let m32 = Model::random(cfg.clone(), ModelOptions::default(), 5).unwrap();
        let m16 = Model::random(
            cfg,
            ModelOptions {
                kind: Kind::BFloat16,
                ..Default::default()
            },
            5,
        )
        .unwrap();
        let (tok, pos) = ids(1, 8);
        let a = m32.forward(&ForwardArgs::new(&tok, &pos)).unwrap().hidden;
        let b = m16.forward(&ForwardArgs::new(&tok, &pos)).unwrap().hidden;
        assert_eq!(b.kind(), Kind::BFloat16);
        let d = (a - b.to_kind(Kind::Float)).abs().max().double_value(&[]);
        assert!(d < 0.1, "{d}");
    }
}
