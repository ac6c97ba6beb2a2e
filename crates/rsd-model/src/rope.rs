//! Rotary position embeddings with explicit position ids.
//!
//! Positions are an input (any integers per token, not only `0..T`): the perturbed views of RSD
//! (skip, cyclic) are nothing but different position ids. The inverse frequencies are computed with
//! the same fp32 tensor operations, in the same order, as transformers' `modeling_rope_utils`, so a
//! model agrees with transformers bit-for-bit in its angles, not only approximately; at positions of
//! tens of thousands, a one-ulp difference in a frequency is a visible phase error.
use tch::{Device, Kind, Tensor};

use crate::config::{ModelConfig, RopeScaling};
use crate::error::{ModelError, Result, TchContext};

/// Inverse frequencies and attention scaling for one model.
#[derive(Debug)]
pub struct Rope {
    /// `[head_dim / 2]`, fp32.
    inv_freq: Tensor,
    /// Multiplies cos and sin (YaRN's temperature; 1 otherwise).
    attention_scaling: f64,
}

fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

impl Rope {
    /// Builds the frequencies for `cfg` on `device`.
    pub fn new(cfg: &ModelConfig, device: Device) -> Result<Self> {
        let dim = cfg.head_dim;
        let base = cfg.rope_theta;
        // base ** (arange(0, dim, 2).float() / dim), in fp32 as transformers does.
        let exponents = Tensor::f_arange_start_step(0, dim, 2, (Kind::Int64, Device::Cpu))
            .and_then(|t| t.f_to_kind(Kind::Float))
            .and_then(|t| t.f_div_scalar(dim))
            .ctx("rope: exponents")?;
        let pos_freqs = Tensor::f_pow_scalar(base, &exponents).ctx("rope: base ** exponents")?;
        let inv_freq = pos_freqs.f_reciprocal().ctx("rope: inv_freq")?;
        let (inv_freq, attention_scaling) = match &cfg.rope_scaling {
            RopeScaling::None => (inv_freq, 1.0),
            RopeScaling::Linear { factor } => {
                (inv_freq.f_div_scalar(*factor).ctx("rope: linear")?, 1.0)
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let f = llama3_inv_freq(
                    &inv_freq,
                    *factor,
                    *low_freq_factor,
                    *high_freq_factor,
                    *original_max_position_embeddings,
                );
                (f.ctx("rope: llama3 scaling")?, 1.0)
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: orig,
                attention_factor,
                beta_fast,
                beta_slow,
                mscale,
                mscale_all_dim,
                truncate,
            } => {
                let attention_factor =
                    attention_factor.unwrap_or_else(|| match (mscale, mscale_all_dim) {
                        (Some(m), Some(ma)) if *m != 0.0 && *ma != 0.0 => {
                            yarn_mscale(*factor, *m) / yarn_mscale(*factor, *ma)
                        }
                        _ => yarn_mscale(*factor, 1.0),
                    });
                let d = dim as f64;
                let correction_dim = |rot: f64| {
                    d * (orig / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
                };
                let (mut low, mut high) = (correction_dim(*beta_fast), correction_dim(*beta_slow));
                if *truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let low = low.max(0.0);
                let mut high = high.min(d - 1.0);
                if low == high {
                    high += 0.001;
                }
                let f = yarn_inv_freq(&pos_freqs, *factor, low, high);
                (f.ctx("rope: yarn scaling")?, attention_factor)
            }
        };
        check_frequencies(cfg, &inv_freq, attention_scaling)?;
        Ok(Rope {
            inv_freq: inv_freq.f_to_device(device).ctx("rope: to device")?,
            attention_scaling,
        })
    }

    /// cos and sin for `positions` `[B, T]` (int), each `[B, 1, T, head_dim]` in `kind`, ready to
    /// broadcast over heads.
    pub fn cos_sin(&self, positions: &Tensor, kind: Kind) -> Result<(Tensor, Tensor)> {
        let f = || -> std::result::Result<(Tensor, Tensor), tch::TchError> {
            // (B, T, 1) * (D/2) -> (B, T, D/2): one fp32 product per element, like HF's k=1 matmul.
            let freqs = positions
                .f_to_kind(Kind::Float)?
                .f_unsqueeze(-1)?
                .f_mul(&self.inv_freq)?;
            let emb = Tensor::f_cat(&[&freqs, &freqs], -1)?;
            let cos = emb.f_cos()?.f_mul_scalar(self.attention_scaling)?;
            let sin = emb.f_sin()?.f_mul_scalar(self.attention_scaling)?;
            Ok((
                cos.f_to_kind(kind)?.f_unsqueeze(1)?,
                sin.f_to_kind(kind)?.f_unsqueeze(1)?,
            ))
        };
        f().ctx("rope: cos/sin")
    }

    /// The inverse frequencies, `[head_dim / 2]` fp32.
    pub fn inv_freq(&self) -> &Tensor {
        &self.inv_freq
    }

    /// The cos/sin multiplier (YaRN temperature; 1.0 otherwise).
    pub fn attention_scaling(&self) -> f64 {
        self.attention_scaling
    }
}

/// Refuses a RoPE whose frequencies fp32 cannot hold at every position of the window: each
/// finite and not negative, the largest angle (`max_position_embeddings` × the largest
/// frequency) finite, and the YaRN temperature finite and positive. Every key is finite on its
/// own by then; this catches their combinations (`rope_theta: 1e-300` makes `1/θ^(2i/d)`
/// overflow fp32 and every cos/sin NaN), before a forward pass writes NaN as if it were a result.
fn check_frequencies(cfg: &ModelConfig, inv_freq: &Tensor, attention_scaling: f64) -> Result<()> {
    let values: Vec<f32> = Vec::try_from(inv_freq).ctx("rope: inv_freq values")?;
    let largest = values.iter().copied().fold(0f32, f32::max);
    let angle = largest as f64 * cfg.max_position_embeddings as f64;
    let bad = values.iter().any(|f| !f.is_finite() || *f < 0.0)
        || !(angle as f32).is_finite()
        || !attention_scaling.is_finite()
        || attention_scaling <= 0.0;
    if bad {
        return Err(ModelError::InvalidConfig(format!(
            "config.json: rope_theta = {:e} with head_dim {} and rope_scaling {} gives RoPE \
             frequencies fp32 cannot hold (largest {largest:e}, times max_position_embeddings \
             {} = {angle:e}; attention scaling {attention_scaling}): every cos/sin would be NaN \
             or meaningless; use a rope_theta of at least 1 (Llama-3: 500000, Qwen3: 1000000)",
            cfg.rope_theta, cfg.head_dim, cfg.rope_scaling, cfg.max_position_embeddings
        )));
    }
    Ok(())
}

/// Llama-3.1's frequency-dependent interpolation of `inv_freq` (transformers'
/// `_compute_llama3_parameters`): long wavelengths divided by `factor`, short ones kept, a smooth
/// blend between.
fn llama3_inv_freq(
    inv_freq: &Tensor,
    factor: f64,
    low_freq_factor: f64,
    high_freq_factor: f64,
    old_ctx: f64,
) -> std::result::Result<Tensor, tch::TchError> {
    let low_freq_wavelen = old_ctx / low_freq_factor;
    let high_freq_wavelen = old_ctx / high_freq_factor;
    let wavelen = inv_freq
        .f_reciprocal()?
        .f_mul_scalar(2.0 * std::f64::consts::PI)?;
    let low = wavelen.f_gt(low_freq_wavelen)?;
    let scaled = inv_freq.f_div_scalar(factor)?;
    let inv_llama = scaled.f_where_self(&low, inv_freq)?;
    // smooth = (old_ctx / wavelen - low_freq_factor) / (high - low)
    let smooth = wavelen
        .f_reciprocal()?
        .f_mul_scalar(old_ctx)?
        .f_sub_scalar(low_freq_factor)?
        .f_div_scalar(high_freq_factor - low_freq_factor)?;
    let smoothed = smooth
        .f_neg()?
        .f_add_scalar(1.0)?
        .f_mul(&inv_llama)?
        .f_div_scalar(factor)?
        .f_add(&smooth.f_mul(&inv_llama)?)?;
    let medium = wavelen
        .f_lt(high_freq_wavelen)?
        .f_logical_not()?
        .f_logical_and(&low.f_logical_not()?)?;
    smoothed.f_where_self(&medium, &inv_llama)
}

/// YaRN's NTK-by-parts frequencies from `pos_freqs = base ** (2i / dim)`: extrapolated above the
/// correction range `[low, high]` (in frequency-index units), interpolated by `factor` below it,
/// linearly blended inside (transformers' `_compute_yarn_parameters`).
fn yarn_inv_freq(
    pos_freqs: &Tensor,
    factor: f64,
    low: f64,
    high: f64,
) -> std::result::Result<Tensor, tch::TchError> {
    let half = pos_freqs.size().first().copied().unwrap_or(0);
    let extrapolation = pos_freqs.f_reciprocal()?;
    let interpolation = pos_freqs.f_mul_scalar(factor)?.f_reciprocal()?;
    let ramp = Tensor::f_arange(half, (Kind::Float, Device::Cpu))?
        .f_sub_scalar(low)?
        .f_div_scalar(high - low)?
        .f_clamp(0.0, 1.0)?;
    let extra_factor = ramp.f_neg()?.f_add_scalar(1.0)?;
    interpolation
        .f_mul(&extra_factor.f_neg()?.f_add_scalar(1.0)?)?
        .f_add(&extrapolation.f_mul(&extra_factor)?)
}

/// Applies rotary embeddings to `x` `[B, H, T, D]` (HF's rotate-half layout, not interleaved).
pub fn apply_rotary(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let f = || -> std::result::Result<Tensor, tch::TchError> {
        let half = x.size().last().copied().unwrap_or(0) / 2;
        let x1 = x.f_narrow(-1, 0, half)?;
        let x2 = x.f_narrow(-1, half, half)?;
        let rotated = Tensor::f_cat(&[&x2.f_neg()?, &x1], -1)?;
        x.f_mul(cos)?.f_add(&rotated.f_mul(sin)?)
    };
    f().ctx("rope: apply")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg(scaling: serde_json::Value) -> ModelConfig {
        ModelConfig::from_hf_json(
            json!({"architectures": ["LlamaForCausalLM"], "vocab_size": 8,
            "hidden_size": 64, "intermediate_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 4, "rope_theta": 500000.0, "max_position_embeddings": 8192,
            "rope_scaling": scaling}),
        )
        .unwrap()
    }

    #[test]
    fn frequencies_fp32_cannot_hold_are_refused_naming_rope_theta() {
        let with_theta = |theta: f64| {
            ModelConfig::from_hf_json(json!({"architectures": ["LlamaForCausalLM"],
                "vocab_size": 8, "hidden_size": 64, "intermediate_size": 8,
                "num_hidden_layers": 1, "num_attention_heads": 4, "rope_theta": theta,
                "max_position_embeddings": 8192}))
            .unwrap()
        };
        // 1/θ^(14/16) overflows fp32: every cos/sin would be NaN.
        let e = Rope::new(&with_theta(1e-300), Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rope_theta = 1e-300") && e.contains("fp32 cannot hold"),
            "{e}"
        );
        // Small but sound, and the usual ones, are accepted.
        for theta in [0.5, 1.0, 1e4, 5e5, 1e7] {
            Rope::new(&with_theta(theta), Device::Cpu).unwrap();
        }
    }

    #[test]
    fn default_frequencies_follow_the_formula() {
        let r = Rope::new(&cfg(json!(null)), Device::Cpu).unwrap();
        let f: Vec<f32> = Vec::try_from(r.inv_freq()).unwrap();
        assert_eq!(f.len(), 8);
        for (i, v) in f.iter().enumerate() {
            let want = 1.0 / 500000f64.powf(2.0 * i as f64 / 16.0);
            assert!(
                (*v as f64 - want).abs() <= 1e-6 * want,
                "{i}: {v} vs {want}"
            );
        }
    }

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let base = Rope::new(&cfg(json!(null)), Device::Cpu).unwrap();
        let r = Rope::new(
            &cfg(
                json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
            ),
            Device::Cpu,
        )
        .unwrap();
        let b: Vec<f32> = Vec::try_from(base.inv_freq()).unwrap();
        let s: Vec<f32> = Vec::try_from(r.inv_freq()).unwrap();
        assert_eq!(s[0], b[0], "highest frequency is untouched");
        assert!(
            (s[7] - b[7] / 8.0).abs() <= 1e-6 * b[7],
            "lowest frequency is divided by 8"
        );
    }

    #[test]
    fn rotation_preserves_norm_and_position_zero_is_identity() {
        let r = Rope::new(
            &cfg(json!({"rope_type": "yarn", "factor": 4.0})),
            Device::Cpu,
        )
        .unwrap();
        assert!(r.attention_scaling() > 1.0);
        let plain = Rope::new(&cfg(json!(null)), Device::Cpu).unwrap();
        let x = Tensor::randn([1, 2, 3, 16], (Kind::Float, Device::Cpu));
        let pos = Tensor::from_slice(&[0i64, 7, 100000]).view([1, 3]);
        let (c, s) = plain.cos_sin(&pos, Kind::Float).unwrap();
        let y = apply_rotary(&x, &c, &s).unwrap();
        let diff = (y.norm_scalaropt_dim(2, [-1], false) - x.norm_scalaropt_dim(2, [-1], false))
            .abs()
            .max()
            .double_value(&[]);
        assert!(diff < 1e-4, "{diff}");
        let d0 = (y.narrow(2, 0, 1) - x.narrow(2, 0, 1))
            .abs()
            .max()
            .double_value(&[]);
        assert_eq!(d0, 0.0);
    }
}
