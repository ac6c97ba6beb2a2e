//! Model configuration, read straight from a Hugging Face `config.json`.
//!
//! A lenient [`RawConfig`] mirrors the HF field names (every field optional, unknown fields kept), and
//! [`ModelConfig::from_hf_json`] resolves it into a strict config, applying each family's defaults
//! (they differ: Qwen3's `head_dim` defaults to 128, Llama's to `hidden_size / heads`) and refusing
//! whatever we do not implement instead of silently computing something else than transformers.
//! The original JSON is kept so that a saved checkpoint carries every field we did not touch.
use serde::Deserialize;
use serde_json::Value;

use crate::error::{ModelError, Result};

/// The architecture families this crate implements. They share the whole decoder; Qwen3 adds a
/// per-head RMSNorm on queries and keys before RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `LlamaForCausalLM` (Llama 2/3, SmolLM2, …).
    Llama,
    /// `Qwen3ForCausalLM` (dense Qwen3).
    Qwen3,
}

impl Family {
    /// The HF `architectures` entry.
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Llama => "LlamaForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
        }
    }

    /// The HF `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen3 => "qwen3",
        }
    }
}

/// RoPE frequency scaling, as `rope_scaling` in `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE (`rope_scaling: null` or `rope_type: "default"`).
    None,
    /// Position interpolation: every frequency divided by `factor`.
    Linear {
        /// Interpolation factor.
        factor: f64,
    },
    /// Llama-3.1's frequency-dependent interpolation.
    Llama3 {
        /// Interpolation factor for low frequencies.
        factor: f64,
        /// Wavelength boundary (in units of the original context) for "low" frequencies.
        low_freq_factor: f64,
        /// Wavelength boundary for "high" frequencies.
        high_freq_factor: f64,
        /// The context the model was pre-trained with.
        original_max_position_embeddings: f64,
    },
    /// YaRN (NTK-by-parts interpolation plus attention temperature).
    Yarn {
        /// Context extension factor.
        factor: f64,
        /// The context the model was trained with.
        original_max_position_embeddings: f64,
        /// Explicit attention temperature; derived from `factor` when absent.
        attention_factor: Option<f64>,
        /// Rotations above which frequencies are extrapolated (default 32).
        beta_fast: f64,
        /// Rotations below which frequencies are interpolated (default 1).
        beta_slow: f64,
        /// DeepSeek-style mscale (optional).
        mscale: Option<f64>,
        /// DeepSeek-style mscale_all_dim (optional).
        mscale_all_dim: Option<f64>,
        /// Round the correction range to integers (transformers' default: true).
        truncate: bool,
    },
}

/// The HF `rope_type` and parameters, e.g. `yarn (factor 4, original_max_position_embeddings 4096,
/// beta_fast 32, beta_slow 1, truncate true)`; `none` for plain RoPE.
impl std::fmt::Display for RopeScaling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RopeScaling::None => write!(f, "none"),
            RopeScaling::Linear { factor } => write!(f, "linear (factor {factor})"),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => write!(
                f,
                "llama3 (factor {factor}, low_freq_factor {low_freq_factor}, high_freq_factor \
                 {high_freq_factor}, original_max_position_embeddings \
                 {original_max_position_embeddings})"
            ),
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                attention_factor,
                beta_fast,
                beta_slow,
                mscale,
                mscale_all_dim,
                truncate,
            } => {
                write!(
                    f,
                    "yarn (factor {factor}, original_max_position_embeddings \
                     {original_max_position_embeddings}, beta_fast {beta_fast}, beta_slow \
                     {beta_slow}, truncate {truncate}"
                )?;
                let optional = [
                    ("attention_factor", attention_factor),
                    ("mscale", mscale),
                    ("mscale_all_dim", mscale_all_dim),
                ];
                for (name, value) in optional {
                    if let Some(v) = value {
                        write!(f, ", {name} {v}")?;
                    }
                }
                write!(f, ")")
            }
        }
    }
}

/// Lenient view of an HF `config.json`: every field optional, names as HF writes them.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RawConfig {
    /// e.g. `["LlamaForCausalLM"]`.
    #[serde(default)]
    pub architectures: Option<Vec<String>>,
    /// e.g. `"llama"`.
    #[serde(default)]
    pub model_type: Option<String>,
    /// Vocabulary size.
    pub vocab_size: Option<i64>,
    /// Model width.
    pub hidden_size: Option<i64>,
    /// MLP width.
    pub intermediate_size: Option<i64>,
    /// Decoder layers.
    pub num_hidden_layers: Option<i64>,
    /// Query heads.
    pub num_attention_heads: Option<i64>,
    /// Key/value heads (GQA); defaults to the query heads.
    pub num_key_value_heads: Option<i64>,
    /// Per-head width.
    pub head_dim: Option<i64>,
    /// MLP activation; only `silu` is implemented.
    pub hidden_act: Option<String>,
    /// Trained context length.
    pub max_position_embeddings: Option<i64>,
    /// RMSNorm epsilon.
    pub rms_norm_eps: Option<f64>,
    /// RoPE base.
    pub rope_theta: Option<f64>,
    /// RoPE scaling dict.
    pub rope_scaling: Option<Value>,
    /// Bias on q/k/v/o projections.
    pub attention_bias: Option<bool>,
    /// Bias on the MLP projections (Llama only).
    pub mlp_bias: Option<bool>,
    /// Share the embedding matrix with the LM head.
    pub tie_word_embeddings: Option<bool>,
    /// Init std for random initialisation.
    pub initializer_range: Option<f64>,
    /// Fraction of the head dim that is rotated (only 1.0 is implemented).
    pub partial_rotary_factor: Option<f64>,
    /// Qwen3 sliding-window switch (only `false` is implemented).
    pub use_sliding_window: Option<bool>,
    /// Qwen3 per-layer attention types (only `full_attention` is implemented).
    pub layer_types: Option<Vec<String>>,
    /// Storage dtype (`torch_dtype` before transformers 4.56, `dtype` after).
    pub torch_dtype: Option<String>,
    /// Storage dtype (new name).
    pub dtype: Option<String>,
}

/// A resolved, validated model configuration.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// Architecture family.
    pub family: Family,
    /// Vocabulary size.
    pub vocab_size: i64,
    /// Model width.
    pub hidden_size: i64,
    /// MLP width.
    pub intermediate_size: i64,
    /// Decoder layers.
    pub num_hidden_layers: i64,
    /// Query heads.
    pub num_attention_heads: i64,
    /// Key/value heads.
    pub num_key_value_heads: i64,
    /// Per-head width.
    pub head_dim: i64,
    /// Trained context length.
    pub max_position_embeddings: i64,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base (ABF raises it, e.g. 8e6 for Llama-3 at 64K).
    pub rope_theta: f64,
    /// RoPE scaling.
    pub rope_scaling: RopeScaling,
    /// Bias on attention projections.
    pub attention_bias: bool,
    /// Bias on MLP projections.
    pub mlp_bias: bool,
    /// Tied embeddings.
    pub tie_word_embeddings: bool,
    /// Init std.
    pub initializer_range: f64,
    /// Storage dtype named by the config, if any (`"bfloat16"`, `"float32"`, …).
    pub torch_dtype: Option<String>,
    /// The JSON this config came from; written back (with our changes) on save.
    raw: Value,
}

/// The most layers a config may have (real models have at most a few hundred).
pub const MAX_LAYERS: i64 = 1024;
/// The most any width (vocabulary, hidden, MLP, heads, head size) may be: 2^20, above every real
/// model's.
pub const MAX_WIDTH: i64 = 1 << 20;
/// The most parameters a config may imply: 2^41 (2.2 trillion), above every dense model.
pub const MAX_PARAMETERS: i64 = 1 << 41;

fn need<T>(v: Option<T>, field: &str) -> Result<T> {
    v.ok_or_else(|| ModelError::InvalidConfig(format!("missing required field {field}")))
}

fn num(v: &Value, key: &str) -> Result<Option<f64>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_f64().map(Some).ok_or_else(|| {
            ModelError::InvalidConfig(format!("rope_scaling.{key} is not a number: {x}"))
        }),
    }
}

fn parse_rope_scaling(v: Option<&Value>, max_pos: i64) -> Result<RopeScaling> {
    let scaling = parse_rope_scaling_fields(v, max_pos)?;
    check_rope_scaling(&scaling)?;
    Ok(scaling)
}

/// `value` of `config.json`'s `key` must be finite and positive (or, with `zero_ok`, ≥ 0): a
/// zero or negative factor divides frequencies by zero or flips them, NaN poisons every logit.
fn finite_positive(key: &str, value: f64, zero_ok: bool) -> Result<()> {
    if !value.is_finite() || value < 0.0 || (value == 0.0 && !zero_ok) {
        let want = if zero_ok {
            "finite and ≥ 0"
        } else {
            "finite and > 0"
        };
        return Err(ModelError::InvalidConfig(format!(
            "config.json: {key} = {value}: must be {want}"
        )));
    }
    Ok(())
}

/// The RoPE scaling parameters are usable numbers (see [`finite_positive`]).
fn check_rope_scaling(scaling: &RopeScaling) -> Result<()> {
    match *scaling {
        RopeScaling::None => Ok(()),
        RopeScaling::Linear { factor } => finite_positive("rope_scaling.factor", factor, false),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            finite_positive("rope_scaling.factor", factor, false)?;
            finite_positive("rope_scaling.low_freq_factor", low_freq_factor, false)?;
            finite_positive("rope_scaling.high_freq_factor", high_freq_factor, false)?;
            finite_positive(
                "rope_scaling.original_max_position_embeddings",
                original_max_position_embeddings,
                false,
            )
        }
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            attention_factor,
            beta_fast,
            beta_slow,
            mscale,
            mscale_all_dim,
            ..
        } => {
            finite_positive("rope_scaling.factor", factor, false)?;
            finite_positive(
                "rope_scaling.original_max_position_embeddings",
                original_max_position_embeddings,
                false,
            )?;
            finite_positive("rope_scaling.beta_fast", beta_fast, false)?;
            finite_positive("rope_scaling.beta_slow", beta_slow, false)?;
            if let Some(a) = attention_factor {
                finite_positive("rope_scaling.attention_factor", a, false)?;
            }
            if let Some(m) = mscale {
                finite_positive("rope_scaling.mscale", m, true)?;
            }
            if let Some(m) = mscale_all_dim {
                finite_positive("rope_scaling.mscale_all_dim", m, true)?;
            }
            Ok(())
        }
    }
}

fn parse_rope_scaling_fields(v: Option<&Value>, max_pos: i64) -> Result<RopeScaling> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(RopeScaling::None);
    };
    // `"rope_scaling": "yarn"` has no factor: taking it as plain RoPE would score a model
    // trained with YaRN without it, silently.
    if !v.is_object() {
        return Err(ModelError::InvalidConfig(format!(
            "config.json: rope_scaling = {}: must be null or an object such as \
             {{\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 4096}}",
            rsd_common::printable::shortened(&v.to_string())
        )));
    }
    // transformers accepts both the new "rope_type" and the legacy "type" key; a type that is
    // there but not a string is an error, not "default".
    let kind = match v.get("rope_type").or_else(|| v.get("type")) {
        None => "default",
        Some(t) => t.as_str().ok_or_else(|| {
            ModelError::InvalidConfig(format!(
                "config.json: rope_scaling.rope_type = {t}: must be a string"
            ))
        })?,
    };
    let factor = || {
        num(v, "factor")?
            .ok_or_else(|| ModelError::InvalidConfig("rope_scaling.factor is required".into()))
    };
    Ok(match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: factor()? },
        "llama3" => RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: need(num(v, "low_freq_factor")?, "rope_scaling.low_freq_factor")?,
            high_freq_factor: need(num(v, "high_freq_factor")?, "rope_scaling.high_freq_factor")?,
            original_max_position_embeddings: need(
                num(v, "original_max_position_embeddings")?,
                "rope_scaling.original_max_position_embeddings",
            )?,
        },
        "yarn" => RopeScaling::Yarn {
            factor: factor()?,
            original_max_position_embeddings: num(v, "original_max_position_embeddings")?
                .unwrap_or(max_pos as f64),
            attention_factor: num(v, "attention_factor")?,
            beta_fast: num(v, "beta_fast")?.unwrap_or(32.0),
            beta_slow: num(v, "beta_slow")?.unwrap_or(1.0),
            mscale: num(v, "mscale")?,
            mscale_all_dim: num(v, "mscale_all_dim")?,
            truncate: v.get("truncate").and_then(Value::as_bool).unwrap_or(true),
        },
        other => {
            return Err(ModelError::UnsupportedConfig {
                field: "rope_scaling.rope_type",
                value: other.to_string(),
                reason: "implemented: default, linear, llama3, yarn",
            })
        }
    })
}

/// The family named by `architectures` (its first entry) or, without it, by `model_type`.
fn resolve_family(raw: &RawConfig) -> Result<Family> {
    let arch = raw
        .architectures
        .as_ref()
        .and_then(|a| a.first())
        .map(String::as_str);
    match (arch, raw.model_type.as_deref()) {
        (Some("LlamaForCausalLM"), _) | (None, Some("llama")) => Ok(Family::Llama),
        (Some("Qwen3ForCausalLM"), _) | (None, Some("qwen3")) => Ok(Family::Qwen3),
        (a, m) => Err(ModelError::UnsupportedArchitecture {
            found: format!(
                "architectures {}, model_type {}",
                a.unwrap_or("(none)"),
                m.unwrap_or("(none)")
            ),
        }),
    }
}

/// `head_dim` as written, else the family default (Qwen3: 128; Llama: `hidden_size / heads`).
fn resolve_head_dim(raw: &RawConfig, family: Family, hidden_size: i64, heads: i64) -> Result<i64> {
    match (raw.head_dim, family) {
        (Some(h), _) => Ok(h),
        (None, Family::Qwen3) => Ok(128),
        (None, Family::Llama) => {
            if heads <= 0 || hidden_size % heads != 0 {
                return Err(ModelError::InvalidConfig(format!(
                    "hidden_size {hidden_size} is not divisible by num_attention_heads {heads}"
                )));
            }
            Ok(hidden_size / heads)
        }
    }
}

/// Refuses fields whose values we do not implement (we would compute something else than
/// transformers).
fn refuse_unsupported(raw: &RawConfig, family: Family) -> Result<()> {
    if let Some(act) = raw.hidden_act.as_deref().filter(|a| *a != "silu") {
        return Err(ModelError::UnsupportedConfig {
            field: "hidden_act",
            value: act.to_string(),
            reason: "only silu (SwiGLU) is implemented",
        });
    }
    if let Some(p) = raw.partial_rotary_factor.filter(|p| *p != 1.0) {
        return Err(ModelError::UnsupportedConfig {
            field: "partial_rotary_factor",
            value: p.to_string(),
            reason: "only full rotary embeddings are implemented",
        });
    }
    if raw.use_sliding_window == Some(true) {
        return Err(ModelError::UnsupportedConfig {
            field: "use_sliding_window",
            value: "true".into(),
            reason: "sliding-window attention is not implemented",
        });
    }
    if let Some(t) = raw
        .layer_types
        .iter()
        .flatten()
        .find(|t| *t != "full_attention")
    {
        return Err(ModelError::UnsupportedConfig {
            field: "layer_types",
            value: t.clone(),
            reason: "only full_attention layers are implemented",
        });
    }
    if family == Family::Qwen3 && raw.mlp_bias == Some(true) {
        return Err(ModelError::UnsupportedConfig {
            field: "mlp_bias",
            value: "true".into(),
            reason: "Qwen3 has no MLP bias",
        });
    }
    Ok(())
}

impl ModelConfig {
    /// Resolves an HF `config.json` value.
    pub fn from_hf_json(value: Value) -> Result<Self> {
        let raw: RawConfig = serde_json::from_value(value.clone())
            .map_err(|e| ModelError::InvalidConfig(format!("config.json: {e}")))?;
        let family = resolve_family(&raw)?;
        let hidden_size = need(raw.hidden_size, "hidden_size")?;
        let heads = need(raw.num_attention_heads, "num_attention_heads")?;
        let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
        let max_pos = raw.max_position_embeddings.unwrap_or(match family {
            Family::Llama => 2048,
            Family::Qwen3 => 32768,
        });
        let head_dim = resolve_head_dim(&raw, family, hidden_size, heads)?;
        refuse_unsupported(&raw, family)?;
        let cfg = ModelConfig {
            family,
            vocab_size: need(raw.vocab_size, "vocab_size")?,
            hidden_size,
            intermediate_size: need(raw.intermediate_size, "intermediate_size")?,
            num_hidden_layers: need(raw.num_hidden_layers, "num_hidden_layers")?,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            max_position_embeddings: max_pos,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope_theta: raw.rope_theta.unwrap_or(10000.0),
            rope_scaling: parse_rope_scaling(raw.rope_scaling.as_ref(), max_pos)?,
            attention_bias: raw.attention_bias.unwrap_or(false),
            mlp_bias: raw.mlp_bias.unwrap_or(false),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            initializer_range: raw.initializer_range.unwrap_or(0.02),
            torch_dtype: raw.dtype.or(raw.torch_dtype),
            raw: value,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads and resolves `<dir>/config.json`.
    pub fn from_dir(dir: &std::path::Path) -> Result<Self> {
        Self::from_file(&dir.join("config.json"))
    }

    /// An HF `config.json` file (a model directory's, or one to initialise a model from).
    pub fn from_file(path: &std::path::Path) -> Result<Self> {
        // A regular file of bounded size: a FIFO or a device in its place must not block or
        // exhaust memory (the directory may come from anyone).
        let bytes = rsd_common::safe_fs::read_regular(
            path,
            rsd_common::safe_fs::MAX_METADATA_BYTES,
            "config.json",
        )?;
        let value: Value = serde_json::from_slice(&bytes).map_err(|source| ModelError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_hf_json(value)
    }

    fn validate(&self) -> Result<()> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
        ];
        if let Some((name, v)) = positive.iter().find(|(_, v)| *v <= 0) {
            return Err(ModelError::InvalidConfig(format!(
                "{name} must be positive, got {v}"
            )));
        }
        // Sizes come from a file anyone may have written, and the model allocates what they say:
        // bound each, and the parameter count they imply, before anything is allocated.
        let bounded = [
            ("num_hidden_layers", self.num_hidden_layers, MAX_LAYERS),
            ("vocab_size", self.vocab_size, MAX_WIDTH),
            ("hidden_size", self.hidden_size, MAX_WIDTH),
            ("intermediate_size", self.intermediate_size, MAX_WIDTH),
            ("num_attention_heads", self.num_attention_heads, MAX_WIDTH),
            ("num_key_value_heads", self.num_key_value_heads, MAX_WIDTH),
            ("head_dim", self.head_dim, MAX_WIDTH),
        ];
        if let Some((name, v, max)) = bounded.iter().find(|(_, v, max)| v > max) {
            return Err(ModelError::InvalidConfig(format!(
                "config.json: {name} = {v}: more than {max}, the most rsd accepts"
            )));
        }
        if self.max_position_embeddings <= 0 {
            return Err(ModelError::InvalidConfig(format!(
                "config.json: max_position_embeddings = {}: must be positive",
                self.max_position_embeddings
            )));
        }
        match self.checked_num_parameters() {
            Some(n) if n <= MAX_PARAMETERS => {}
            n => {
                return Err(ModelError::InvalidConfig(format!(
                    "config.json: num_hidden_layers, hidden_size, intermediate_size, vocab_size \
                     and the heads imply {} parameters, more than {MAX_PARAMETERS}, the most rsd \
                     accepts",
                    n.map_or("more than 2^63".to_string(), |n| n.to_string())
                )))
            }
        }
        finite_positive("rms_norm_eps", self.rms_norm_eps, false)?;
        finite_positive("initializer_range", self.initializer_range, true)?;
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(ModelError::InvalidConfig(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            )));
        }
        if self.head_dim % 2 != 0 {
            return Err(ModelError::InvalidConfig(format!(
                "head_dim {} must be even for RoPE",
                self.head_dim
            )));
        }
        if !self.rope_theta.is_finite() || self.rope_theta <= 0.0 {
            return Err(ModelError::InvalidConfig(format!(
                "rope_theta must be positive, got {}",
                self.rope_theta
            )));
        }
        Ok(())
    }

    /// Number of parameters (tied embeddings counted once).
    pub fn num_parameters(&self) -> i64 {
        // A config that passed `validate` (every constructor's) has a count that fits.
        self.checked_num_parameters().unwrap_or(i64::MAX)
    }

    /// Number of parameters, `None` if it overflows i64 (a hostile config.json).
    fn checked_num_parameters(&self) -> Option<i64> {
        let (d, hd) = (self.hidden_size, self.head_dim);
        let i = self.intermediate_size;
        let mul = |a: i64, b: i64| a.checked_mul(b);
        let sum = |xs: &[Option<i64>]| {
            xs.iter()
                .try_fold(0i64, |acc, x| x.and_then(|x| acc.checked_add(x)))
        };
        let q = mul(self.num_attention_heads, hd)?;
        let kv = mul(self.num_key_value_heads, hd)?;
        let attn_bias = if self.attention_bias {
            sum(&[Some(q), mul(2, kv), Some(d)])?
        } else {
            0
        };
        let qk_norm = if self.family == Family::Qwen3 {
            mul(2, hd)?
        } else {
            0
        };
        let mlp_bias = if self.mlp_bias {
            sum(&[mul(2, i), Some(d)])?
        } else {
            0
        };
        let layer = sum(&[
            mul(d, q),
            mul(2, d).and_then(|x| mul(x, kv)),
            mul(q, d),
            Some(attn_bias),
            Some(qk_norm),
            mul(3, d).and_then(|x| mul(x, i)),
            Some(mlp_bias),
            mul(2, d),
        ])?;
        let embed = mul(self.vocab_size, d)?;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        sum(&[
            Some(embed),
            mul(self.num_hidden_layers, layer),
            Some(d),
            Some(head),
        ])
    }

    /// The most elements one parameter tensor of this config holds: the embedding, an MLP
    /// projection or an attention projection, whichever is largest. Initialising a model holds
    /// one such tensor in fp32 twice over (the values, then the tensor made from them) besides
    /// the model itself.
    pub fn largest_tensor_elements(&self) -> i64 {
        let (d, hd) = (self.hidden_size, self.head_dim);
        [
            self.vocab_size.saturating_mul(d),
            d.saturating_mul(self.intermediate_size),
            d.saturating_mul(self.num_attention_heads.saturating_mul(hd)),
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
    }

    /// The bytes creating this model takes, its parameters stored in `dtype_bytes`-byte
    /// elements: the parameters, plus the two fp32 copies of the largest tensor made while it
    /// is initialised (see [`ModelConfig::largest_tensor_elements`]). `None` when that
    /// overflows u64 (no machine has that much anyway).
    pub fn init_bytes(&self, dtype_bytes: u64) -> Option<u64> {
        let params = u64::try_from(self.checked_num_parameters()?).ok()?;
        let largest = u64::try_from(self.largest_tensor_elements()).ok()?;
        params
            .checked_mul(dtype_bytes)?
            .checked_add(largest.checked_mul(8)?)
    }

    /// Refuses, before anything is allocated, a model that would not fit in memory: a config
    /// within every per-key bound may still declare trillions of parameters, and allocating
    /// them would abort the process instead of failing. `path` (the config file) and
    /// `dtype` (its name, e.g. `bf16`) are for the message; `available` is what this process
    /// may still take (see [`crate::alloc::available_bytes`]; `None`: unknown, not checked).
    pub fn check_fits_in_memory(
        &self,
        path: &std::path::Path,
        dtype: &str,
        dtype_bytes: u64,
        available: Option<u64>,
    ) -> Result<()> {
        let Some(available) = available else {
            return Ok(());
        };
        let needed = self.init_bytes(dtype_bytes);
        if needed.is_some_and(|n| n <= available) {
            return Ok(());
        }
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let params = self.num_parameters();
        let stored = u64::try_from(params)
            .ok()
            .and_then(|p| p.checked_mul(dtype_bytes))
            .map_or("more than 2^64 bytes".to_string(), |b| {
                format!("{:.1} GiB in {dtype}", gib(b))
            });
        let total = needed.map_or("more than 2^64 bytes".to_string(), |b| {
            format!("{:.1} GiB", gib(b))
        });
        Err(ModelError::InvalidConfig(format!(
            "{}: declares {params} parameters ({stored}; {total} with the fp32 copies of its \
             largest tensor made while initialising), more than the {:.1} GiB ({available} \
             bytes) this machine has available",
            path.display(),
            gib(available)
        )))
    }

    /// Sets a new RoPE base (ABF), e.g. 8e6 before training Llama-3 at 64K.
    pub fn set_rope_theta(&mut self, theta: f64) -> Result<()> {
        if !theta.is_finite() || theta <= 0.0 {
            return Err(ModelError::InvalidConfig(format!(
                "rope_theta must be positive, got {theta}"
            )));
        }
        self.rope_theta = theta;
        self.raw["rope_theta"] = serde_json::json!(theta);
        Ok(())
    }

    /// Sets the context length recorded in the config (after long-context training).
    pub fn set_max_position_embeddings(&mut self, n: i64) {
        self.max_position_embeddings = n;
        self.raw["max_position_embeddings"] = serde_json::json!(n);
    }

    /// Replaces `rope_scaling` (e.g. YaRN for evaluation beyond the trained window). The value is an
    /// HF `rope_scaling` dict or `null`.
    pub fn set_rope_scaling(&mut self, value: Value) -> Result<()> {
        self.rope_scaling = parse_rope_scaling(Some(&value), self.max_position_embeddings)?;
        self.raw["rope_scaling"] = value;
        Ok(())
    }

    /// Records the storage dtype written by `save`.
    pub(crate) fn set_torch_dtype(&mut self, dtype: &str) {
        self.torch_dtype = Some(dtype.to_string());
        self.raw["torch_dtype"] = serde_json::json!(dtype);
        if self.raw.get("dtype").is_some() {
            self.raw["dtype"] = serde_json::json!(dtype);
        }
    }

    /// The `config.json` to write: the original fields with our changes applied.
    pub fn to_hf_json(&self) -> Value {
        let mut v = self.raw.clone();
        if v.get("architectures").is_none() {
            v["architectures"] = serde_json::json!([self.family.architecture()]);
        }
        if v.get("model_type").is_none() {
            v["model_type"] = serde_json::json!(self.family.model_type());
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tiny(arch: &str) -> Value {
        json!({"architectures": [arch], "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2})
    }

    #[test]
    fn hostile_sizes_and_numbers_are_refused_naming_config_json_and_the_key() {
        let cases = [
            ("num_hidden_layers", json!(1025), "more than 1024"),
            ("vocab_size", json!(1_048_577), "more than 1048576"),
            ("hidden_size", json!(1_i64 << 40), "more than 1048576"),
            ("intermediate_size", json!(1_048_577), "more than 1048576"),
            ("head_dim", json!(1_i64 << 21), "more than 1048576"),
            ("rms_norm_eps", json!(0.0), "must be finite and > 0"),
            ("rms_norm_eps", json!(-1e-6), "must be finite and > 0"),
            ("max_position_embeddings", json!(0), "must be positive"),
        ];
        for (key, value, want) in cases {
            let mut v = tiny("LlamaForCausalLM");
            v[key] = value.clone();
            let e = ModelConfig::from_hf_json(v).unwrap_err().to_string();
            assert!(
                e.contains(&format!("config.json: {key} = ")) && e.contains(want),
                "{key} = {value}: {e}"
            );
        }
        // Each width within bounds, their product far too large: refused before any allocation,
        // with checked arithmetic (the unchecked count overflows i64).
        let mut v = tiny("LlamaForCausalLM");
        for key in ["vocab_size", "hidden_size", "intermediate_size"] {
            v[key] = json!(1 << 20);
        }
        v["num_attention_heads"] = json!(1 << 10);
        v["num_key_value_heads"] = json!(1 << 10);
        v["num_hidden_layers"] = json!(1024);
        let e = ModelConfig::from_hf_json(v).unwrap_err().to_string();
        assert!(
            e.contains("config.json") && e.contains("parameters, more than"),
            "{e}"
        );
        // RoPE factors.
        for scaling in [
            json!({"rope_type": "linear", "factor": 0.0}),
            json!({"rope_type": "linear", "factor": -2.0}),
            json!({"rope_type": "yarn", "factor": 4.0, "beta_fast": 0.0}),
            json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": -1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
        ] {
            let mut v = tiny("LlamaForCausalLM");
            v["rope_scaling"] = scaling.clone();
            let e = ModelConfig::from_hf_json(v).unwrap_err().to_string();
            assert!(
                e.contains("config.json: rope_scaling.") && e.contains("must be finite and > 0"),
                "{scaling}: {e}"
            );
        }
        // A rope_scaling that is not an object, or a type that is not a string, is not plain
        // RoPE: a model trained with YaRN would be scored without it.
        for (scaling, want) in [
            (
                json!("yarn"),
                "rope_scaling = \"yarn\": must be null or an object",
            ),
            (json!(4.0), "rope_scaling = 4.0: must be null or an object"),
            (
                json!({"rope_type": 3, "factor": 4.0}),
                "rope_scaling.rope_type = 3: must be a string",
            ),
        ] {
            let mut v = tiny("LlamaForCausalLM");
            v["rope_scaling"] = scaling.clone();
            let e = ModelConfig::from_hf_json(v).unwrap_err().to_string();
            assert!(e.contains(want), "{scaling}: {e}");
        }
    }

    #[test]
    fn family_defaults_differ() {
        let l = ModelConfig::from_hf_json(tiny("LlamaForCausalLM")).unwrap();
        assert_eq!((l.family, l.head_dim), (Family::Llama, 8));
        let q = ModelConfig::from_hf_json(tiny("Qwen3ForCausalLM")).unwrap();
        assert_eq!((q.family, q.head_dim), (Family::Qwen3, 128));
    }

    #[test]
    fn refuses_unknown_architecture_and_fields() {
        let e = ModelConfig::from_hf_json(tiny("MistralForCausalLM")).unwrap_err();
        assert!(
            matches!(e, ModelError::UnsupportedArchitecture { .. }),
            "{e}"
        );
        let mut v = tiny("LlamaForCausalLM");
        v["rope_scaling"] = json!({"rope_type": "longrope", "factor": 2.0});
        let e = ModelConfig::from_hf_json(v).unwrap_err();
        assert!(e.to_string().contains("longrope"), "{e}");
        let mut v = tiny("LlamaForCausalLM");
        v["hidden_act"] = json!("gelu");
        assert!(ModelConfig::from_hf_json(v)
            .unwrap_err()
            .to_string()
            .contains("gelu"));
        let mut v = tiny("LlamaForCausalLM");
        v["num_key_value_heads"] = json!(3);
        assert!(matches!(
            ModelConfig::from_hf_json(v),
            Err(ModelError::InvalidConfig(_))
        ));
    }

    #[test]
    fn rope_scaling_variants_parse_and_roundtrip() {
        let mut v = tiny("LlamaForCausalLM");
        v["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        let mut c = ModelConfig::from_hf_json(v).unwrap();
        assert!(matches!(c.rope_scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
        c.set_rope_theta(8e6).unwrap();
        c.set_max_position_embeddings(65536);
        c.set_rope_scaling(json!({"type": "yarn", "factor": 4.0}))
            .unwrap();
        let out = c.to_hf_json();
        assert_eq!(out["rope_theta"], json!(8e6));
        assert_eq!(out["max_position_embeddings"], json!(65536));
        let back = ModelConfig::from_hf_json(out).unwrap();
        assert!(matches!(back.rope_scaling,
            RopeScaling::Yarn { factor, original_max_position_embeddings, .. }
            if factor == 4.0 && original_max_position_embeddings == 65536.0));
    }

    #[test]
    fn parameter_count_matches_hand_count() {
        let mut v = tiny("LlamaForCausalLM");
        v["tie_word_embeddings"] = json!(true);
        let c = ModelConfig::from_hf_json(v).unwrap();
        // embed 64*32; per layer: q 32*32, k,v 32*16 each, o 32*32, mlp 3*32*48, 2 norms of 32.
        let layer = 1024 + 2 * 512 + 1024 + 3 * 32 * 48 + 64;
        assert_eq!(c.num_parameters(), 64 * 32 + 2 * layer + 32);
    }
}
