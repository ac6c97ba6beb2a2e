//! Command-line argument groups every tool that loads a model shares (`rsd-eval`'s commands,
//! `rsd-model`), defined once so a flag means the same thing, with the same grammar and the same
//! help, wherever it appears. Built with the `cli` feature.
use std::str::FromStr;

use serde_json::Value;

use crate::{check_device, parse_device, parse_kind, ModelOptions, Result};

/// `--model`: the checkpoint a command loads.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct ModelDirArgs {
    /// Checkpoint directory: an HF model directory (config.json, *.safetensors; tokenizer.json
    /// where text is read or written), Llama or Qwen3.
    #[arg(long, value_name = "DIR")]
    pub model: std::path::PathBuf,
}

/// `--device` and `--dtype`: where the model runs and the dtype of its parameters.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct DeviceArgs {
    /// cpu, cuda, cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Parameter dtype: fp32, bf16, fp16 (or fp64, for checks against a reference).
    /// Reductions (softmax merges, log-softmax, KL) run in fp32 (fp64 for fp64).
    #[arg(long, default_value = "fp32")]
    pub dtype: String,
}

impl DeviceArgs {
    /// The model options these flags name, with the device checked to exist (a missing CUDA
    /// device otherwise fails deep inside libtorch).
    pub fn options(&self) -> Result<ModelOptions> {
        let options = ModelOptions {
            device: parse_device(&self.device)?,
            kind: parse_kind(&self.dtype)?,
        };
        check_device(options.device)?;
        Ok(options)
    }
}

/// `--rope-scaling`: RoPE scaling applied on top of the checkpoint's config.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct RopeScalingArgs {
    /// RoPE scaling applied on top of the checkpoint: TYPE:FACTOR (yarn:4, linear:2, llama3:8;
    /// the factor scales the model's max_position_embeddings), an HF rope_scaling dict as JSON ('{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":4096}'),
    /// or null to remove the config's.
    #[arg(long, value_name = "TYPE:FACTOR|JSON")]
    pub rope_scaling: Option<ScalingRequest>,
}

/// What `--rope-scaling` names, before the model's window is known.
#[derive(Debug, Clone, PartialEq)]
pub enum ScalingRequest {
    /// An HF `rope_scaling` dict (or `null`), used as given.
    Dict(Value),
    /// `TYPE:FACTOR`: scaling of that type over the model's trained window.
    Factor {
        /// `rope_type`: yarn, linear, llama3 (what rsd-model implements; others are refused when applied).
        rope_type: String,
        /// How many times the trained window the model should reach.
        factor: f64,
    },
}

impl FromStr for ScalingRequest {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s.trim_start().starts_with('{') || s.trim() == "null" {
            return serde_json::from_str(s)
                .map(ScalingRequest::Dict)
                .map_err(|e| format!("not valid JSON: {e}"));
        }
        let (rope_type, factor) = s.split_once(':').ok_or_else(|| {
            format!("\"{s}\": expected TYPE:FACTOR (e.g. yarn:4, linear:2) or an HF dict as JSON")
        })?;
        let factor = factor
            .parse()
            .ok()
            .filter(|f: &f64| f.is_finite() && *f > 0.0)
            .ok_or_else(|| format!("\"{s}\": the factor must be a positive number"))?;
        Ok(ScalingRequest::Factor {
            rope_type: rope_type.to_string(),
            factor,
        })
    }
}

impl ScalingRequest {
    /// The HF `rope_scaling` dict for a model trained to `max_positions` tokens (what
    /// `Model::set_rope_scaling` takes and a run's settings record).
    pub fn to_dict(&self, max_positions: i64) -> Value {
        match self {
            ScalingRequest::Dict(v) => v.clone(),
            ScalingRequest::Factor { rope_type, factor } => {
                let mut v = serde_json::json!({"rope_type": rope_type, "factor": factor,
                    "original_max_position_embeddings": max_positions});
                if rope_type == "llama3" {
                    // transformers' defaults for Llama-3.1's scaling.
                    v["low_freq_factor"] = 1.0.into();
                    v["high_freq_factor"] = 4.0.into();
                }
                v
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn scaling_requests_parse_both_grammars() {
        let yarn: ScalingRequest = "yarn:4".parse().unwrap();
        assert_eq!(
            yarn.to_dict(2048),
            json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048})
        );
        let llama3: ScalingRequest = "llama3:8".parse().unwrap();
        assert_eq!(llama3.to_dict(8192)["high_freq_factor"], json!(4.0));
        let dict: ScalingRequest = r#"{"rope_type":"linear","factor":2.0}"#.parse().unwrap();
        assert_eq!(
            dict.to_dict(99),
            json!({"rope_type": "linear", "factor": 2.0})
        );
        assert_eq!(
            "null".parse::<ScalingRequest>().unwrap(),
            ScalingRequest::Dict(Value::Null)
        );
        for bad in ["yarn", "yarn:0", "yarn:-1", "yarn:inf", "yarn:x", "{"] {
            let e = bad.parse::<ScalingRequest>().unwrap_err();
            assert!(
                e.contains("TYPE:FACTOR") || e.contains("positive") || e.contains("JSON"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn device_args_name_the_bad_value() {
        let bad = DeviceArgs {
            device: "gpu".into(),
            dtype: "fp32".into(),
        };
        assert!(bad.options().unwrap_err().to_string().contains("gpu"));
        let bad = DeviceArgs {
            device: "cpu".into(),
            dtype: "int8".into(),
        };
        assert!(bad.options().unwrap_err().to_string().contains("int8"));
        let ok = DeviceArgs {
            device: "cpu".into(),
            dtype: "bf16".into(),
        };
        assert_eq!(ok.options().unwrap().kind, tch::Kind::BFloat16);
    }
}
