//! The per-GPU memory a training config needs at a given world size, before launch
//! (`rsd-train --print-memory-plan`).
//!
//! Every item is counted from the architecture and the config, for one rank. The peak is what is
//! held through the whole step plus the larger of two phases' working sets, which are never live
//! together: the loss (one chunk's logits) and the backward (one layer's recompute).
//!
//! * **weights** and **gradients** in the model's dtype, whole on every rank (gradients accumulate
//!   over the step's micro-batches before the ranks' sum);
//! * **optimizer state**: fp32 master weights (bf16/fp16 models) and two fp32 AdamW moments:
//!   12 bytes per parameter (8 for fp32 models), divided by all dp × cp ranks with
//!   `shard_optimizer` (every rank holds the same parameters); plus the summed fp32 gradient (its block, sharded; one bucket otherwise);
//! * **checkpointed activations** (`checkpoint_layers`): each layer's input for both views, the
//!   perturbed view at its largest (a split at row 0 recomputes every row);
//! * **one layer's recompute**: the tensors autograd saves in a decoder layer, both views:
//!   `6·d + 2·kv + 4·ffn` values per token (norm inputs and outputs, q/k/v, attention output,
//!   residual, gate/up/activation/product), flash attention's O(L) statistics, no `L×L` matrix —
//!   the CUDA path; without checkpointing every layer's;
//! * **loss chunk**: the perturbed chunk's logits, log-probabilities, probabilities and the
//!   teacher's log-probabilities, fp32 (4 tensors of `loss_chunk × vocab`);
//! * **runtime**: the CUDA context and allocator slack, 1 GiB plus 5% of the rest.
//!
//! Context parallelism divides the activation items by the CP degree (each rank holds `L / cp`
//! rows of both views; under context parallelism the perturbed view runs whole, as counted). The numbers are estimates for planning, as accurate as the list above; the
//! `peak_rss`/CUDA peak of a real step is the measurement.
use std::fmt;
use std::path::Path;

use rsd_model::ModelConfig;

use crate::config::TrainConfig;
use crate::{Error, Result};

/// What the plan is computed for.
#[derive(Debug, Clone)]
pub struct PlanInput {
    /// The architecture.
    pub model: ModelConfig,
    /// Bytes per value of the model's dtype (2 for bf16).
    pub dtype_bytes: u64,
    /// Tokens per sequence.
    pub seq_len: u64,
    /// Sequences per micro-batch.
    pub micro_batch: u64,
    /// Data-parallel ranks.
    pub dp: u64,
    /// Context-parallel degree (ranks sharing one sequence).
    pub cp: u64,
    /// Optimizer state sharded over the data-parallel ranks.
    pub shard_optimizer: bool,
    /// Per-layer activation checkpointing.
    pub checkpoint_layers: bool,
    /// Whether the objective runs a second (perturbed) view.
    pub two_views: bool,
    /// Rows per loss chunk.
    pub loss_chunk: u64,
    /// Largest gradient bucket, bytes.
    pub bucket_bytes: u64,
    /// Memory of one GPU, bytes.
    pub gpu_bytes: u64,
}

/// One line of the plan.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PlanItem {
    /// What it is.
    pub name: &'static str,
    /// Bytes per GPU.
    pub bytes: u64,
    /// How it is counted.
    pub how: String,
    /// Live during one phase of the step only (the peak counts the largest of these).
    pub transient: bool,
}

/// The plan: items, their sum, and the GPU they must fit.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MemoryPlan {
    /// The items, largest first as computed.
    pub items: Vec<PlanItem>,
    /// Their sum, bytes.
    pub total: u64,
    /// One GPU's memory, bytes.
    pub gpu_bytes: u64,
    /// World size (dp × cp).
    pub world: u64,
    /// Parameters.
    pub parameters: u64,
}

impl MemoryPlan {
    /// Whether the total fits one GPU.
    pub fn fits(&self) -> bool {
        self.total <= self.gpu_bytes
    }
}

/// The plan's input for `cfg` on `world` GPUs of `gpu_bytes` each. The architecture comes from
/// `arch` (a `config.json`) if given, else from the config's `model` directory or `init` file;
/// the sequence length from the first shard directory's manifest, else from
/// `max_position_embeddings`.
pub fn input_for(
    cfg: &TrainConfig,
    arch: Option<&Path>,
    world: u64,
    gpu_bytes: u64,
) -> Result<PlanInput> {
    let model = match (arch, &cfg.model, &cfg.init) {
        (Some(file), _, _) => read_arch(file)?,
        (None, Some(dir), _) => {
            let file = Path::new(dir).join("config.json");
            if !file.exists() {
                return Err(Error::Input(format!(
                    "{}: not found; to plan before the model is downloaded, give its \
                     architecture: --print-memory-plan path/to/config.json \
                     (configs/model/ has Llama-3-8B's and Qwen3-4B's)",
                    file.display()
                )));
            }
            read_arch(&file)?
        }
        (None, None, Some(init)) => read_arch(Path::new(init))?,
        (None, None, None) => {
            return Err(Error::Input(
                "config key model/init: the plan needs the architecture".into(),
            ))
        }
    };
    let first = cfg.shards.split(',').map(str::trim).find(|s| !s.is_empty());
    let seq_len = match first.map(|d| rsd_shard::Manifest::read(Path::new(d))) {
        Some(Ok(m)) => m.seq_len,
        _ => match cfg.max_position_embeddings {
            Some(n) if n > 0 => n as u64,
            _ => {
                return Err(Error::Input(format!(
                    "config key shards: {} has no readable manifest and max_position_embeddings \
                     is not set; give the training length with --max-position-embeddings N",
                    first.unwrap_or("(none)")
                )))
            }
        },
    };
    let cp = cfg.cp.max(1) as u64;
    if !world.is_multiple_of(cp) {
        return Err(Error::Input(format!(
            "config key cp: {world} GPUs cannot be split into groups of {cp}"
        )));
    }
    let dtype_bytes = match rsd_model::parse_kind(&cfg.dtype)? {
        tch::Kind::Double => 8,
        tch::Kind::Float => 4,
        _ => 2,
    };
    Ok(PlanInput {
        model,
        dtype_bytes,
        seq_len,
        micro_batch: cfg.micro_batch as u64,
        dp: world / cp,
        cp,
        shard_optimizer: cfg.shard_optimizer,
        checkpoint_layers: cfg.checkpoint_layers,
        two_views: cfg.objective.needs_perturbed(),
        loss_chunk: cfg.loss_chunk.max(1) as u64,
        bucket_bytes: (cfg.grad_bucket_mb as u64) << 20,
        gpu_bytes,
    })
}

fn read_arch(file: &Path) -> Result<ModelConfig> {
    let text = std::fs::read_to_string(file).map_err(crate::io_err(file))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::Input(format!("{}: {e}", file.display())))?;
    Ok(ModelConfig::from_hf_json(v)?)
}

/// Computes the plan (see the module docs for what each item counts).
pub fn plan(p: &PlanInput) -> MemoryPlan {
    let m = &p.model;
    let params = m.num_parameters() as u64;
    let b = p.dtype_bytes;
    let (d, ffn) = (m.hidden_size as u64, m.intermediate_size as u64);
    let kv = (m.num_key_value_heads * m.head_dim) as u64;
    let layers = m.num_hidden_layers as u64;
    let views = if p.two_views { 2 } else { 1 };
    let rows = p.micro_batch * p.seq_len.div_ceil(p.cp.max(1));
    let dp = p.dp.max(1);
    let mut items = Vec::new();
    let mut add = |name, bytes, how: String| {
        items.push(PlanItem {
            name,
            bytes,
            how,
            transient: false,
        })
    };

    add(
        "weights",
        params * b,
        format!("{params} parameters × {b} B"),
    );
    add(
        "gradients",
        params * b,
        format!("{params} × {b} B, accumulated over the micro-batches"),
    );
    let state_per_param = if b < 4 { 12 } else { 8 };
    // Every rank of the dp × cp mesh holds the same parameters, so the state shards over all.
    let shards = dp * p.cp.max(1);
    let (state, state_how) = if p.shard_optimizer && shards > 1 {
        (
            (params * state_per_param).div_ceil(shards),
            format!("{state_per_param} B/parameter ÷ {shards} ranks (sharded)"),
        )
    } else {
        (
            params * state_per_param,
            format!("{state_per_param} B/parameter (fp32 master + 2 moments), replicated"),
        )
    };
    add("optimizer state", state, state_how);
    let (summed, summed_how) = if p.shard_optimizer && shards > 1 {
        (
            (params * 4).div_ceil(shards) + p.bucket_bytes,
            format!("fp32 block ÷ {shards} ranks + one bucket"),
        )
    } else {
        (
            2 * p.bucket_bytes.min(params * 4),
            "one fp32 bucket and its cast".to_string(),
        )
    };
    add("summed gradient", summed, summed_how);
    let per_layer_values = 6 * d + 2 * kv + 4 * ffn;
    // Context parallelism: a layer holds the whole sequence's K/V (and their gradients).
    let gathered = if p.cp > 1 {
        views * 2 * 2 * p.micro_batch * p.seq_len * kv * b
    } else {
        0
    };
    if p.checkpoint_layers {
        add(
            "checkpointed inputs",
            views * (layers + 1) * rows * d * b,
            format!("{views} view(s) × ({layers} layers + final) × {rows} rows × {d} × {b} B"),
        );
        items.push(PlanItem {
            name: "layer recompute",
            bytes: views * rows * per_layer_values * b + gathered,
            how: format!(
                "{views} view(s) × {rows} rows × (6·{d} + 2·{kv} + 4·{ffn}) × {b} B, one layer{}",
                if gathered > 0 {
                    " + the gathered K/V and their gradients"
                } else {
                    ""
                }
            ),
            transient: true,
        });
    } else {
        add(
            "activations",
            views * layers * rows * per_layer_values * b,
            format!(
                "{views} view(s) × {layers} layers × {rows} rows × (6·{d} + 2·{kv} + 4·{ffn}) × {b} B"
            ),
        );
    }
    let chunk = p.loss_chunk.min(rows);
    let vocab = m.vocab_size as u64;
    items.push(PlanItem {
        name: "loss chunk",
        bytes: 4 * chunk * vocab * 4,
        how: format!("4 × {chunk} rows × {vocab} vocab × 4 B (fp32)"),
        transient: true,
    });
    let held: u64 = items.iter().filter(|i| !i.transient).map(|i| i.bytes).sum();
    let phase = items
        .iter()
        .filter(|i| i.transient)
        .map(|i| i.bytes)
        .max()
        .unwrap_or(0);
    let runtime = (1u64 << 30) + (held + phase) / 20;
    items.push(PlanItem {
        name: "runtime",
        bytes: runtime,
        how: "CUDA context + allocator slack: 1 GiB + 5%".into(),
        transient: false,
    });
    MemoryPlan {
        total: held + phase + runtime,
        items,
        gpu_bytes: p.gpu_bytes,
        world: dp * p.cp.max(1),
        parameters: params,
    }
}

/// When `input` does not fit: the first of sharding the optimizer, then context parallelism of
/// 2, 4, 8… (dividing the same GPUs) that does, and its plan.
pub fn suggestion(input: &PlanInput) -> Option<(String, MemoryPlan)> {
    let world = input.dp * input.cp;
    let mut tries = Vec::new();
    if !input.shard_optimizer {
        tries.push((true, input.cp));
    }
    let mut cp = input.cp * 2;
    while cp <= world {
        if world.is_multiple_of(cp) {
            tries.push((true, cp));
        }
        cp *= 2;
    }
    tries.into_iter().find_map(|(shard, cp)| {
        let p = plan(&PlanInput {
            shard_optimizer: shard,
            cp,
            dp: world / cp,
            ..input.clone()
        });
        p.fits().then(|| {
            let how = if cp == input.cp {
                "--shard-optimizer true".to_string()
            } else {
                format!("--shard-optimizer true --cp {cp} (dp {})", world / cp)
            };
            (how, p)
        })
    })
}

/// Bytes as GiB (GPUs sold as "80 GB" hold 80 GiB).
fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "memory per GPU, {} parameters, {} GPU(s):",
            self.parameters, self.world
        )?;
        for i in &self.items {
            let phase = if i.transient { " (one phase)" } else { "" };
            writeln!(
                f,
                "  {:<20} {:>10}   {}{phase}",
                i.name,
                gib(i.bytes),
                i.how
            )?;
        }
        writeln!(
            f,
            "  {:<20} {:>10}   held + the larger phase + runtime, of {} per GPU: {}",
            "peak",
            gib(self.total),
            gib(self.gpu_bytes),
            if self.fits() { "fits" } else { "DOES NOT FIT" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama3_8b() -> ModelConfig {
        ModelConfig::from_hf_json(serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "tie_word_embeddings": false
        }))
        .unwrap()
    }

    fn input(dp: u64, cp: u64, shard: bool) -> PlanInput {
        PlanInput {
            model: llama3_8b(),
            dtype_bytes: 2,
            seq_len: 65536,
            micro_batch: 1,
            dp,
            cp,
            shard_optimizer: shard,
            checkpoint_layers: true,
            two_views: true,
            loss_chunk: 4096,
            bucket_bytes: 25 << 20,
            gpu_bytes: 80 << 30,
        }
    }

    fn item(p: &MemoryPlan, name: &str) -> u64 {
        p.items.iter().find(|i| i.name == name).unwrap().bytes
    }

    #[test]
    fn llama3_8b_counts_as_published() {
        let p = plan(&input(16, 1, false));
        // Llama-3-8B has 8,030,261,248 parameters.
        assert_eq!(p.parameters, 8_030_261_248);
        assert_eq!(item(&p, "weights"), 2 * 8_030_261_248);
        // Replicated AdamW state alone is ~96 GB: more than a GPU.
        assert_eq!(item(&p, "optimizer state"), 12 * 8_030_261_248);
        assert!(!p.fits());
    }

    #[test]
    fn sharding_and_context_parallelism_divide_what_they_should() {
        let base = plan(&input(16, 1, false));
        let sharded = plan(&input(16, 1, true));
        assert_eq!(
            item(&sharded, "optimizer state"),
            (12 * 8_030_261_248u64).div_ceil(16)
        );
        assert_eq!(item(&sharded, "weights"), item(&base, "weights"));
        let cp2 = plan(&input(8, 2, true));
        assert_eq!(
            item(&cp2, "checkpointed inputs") * 2,
            item(&sharded, "checkpointed inputs")
        );
        assert_eq!(cp2.world, 16);
        // The paper's Llama-3-8B run at 64K on 16 GPUs fits with both.
        assert!(cp2.fits(), "{cp2}");
        let (how, _) = suggestion(&input(16, 1, false)).unwrap();
        assert_eq!(how, "--shard-optimizer true --cp 2 (dp 8)");
    }

    #[test]
    fn weights_are_the_models_parameter_bytes() {
        let json: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../configs/model/tiny-qwen3.json"
            ))
            .unwrap(),
        )
        .unwrap();
        let cfg = ModelConfig::from_hf_json(json).unwrap();
        let model = rsd_model::Model::random(
            cfg.clone(),
            rsd_model::ModelOptions {
                device: tch::Device::Cpu,
                kind: tch::Kind::Float,
            },
            0,
        )
        .unwrap();
        let bytes: usize = model
            .named_parameters()
            .iter()
            .map(|(_, p)| p.numel() * 4)
            .sum();
        let p = plan(&PlanInput {
            model: cfg,
            dtype_bytes: 4,
            ..input(2, 1, true)
        });
        assert_eq!(item(&p, "weights"), bytes as u64);
        // fp32 models keep no master copy: 8 B per parameter, halved over 2 ranks.
        assert_eq!(item(&p, "optimizer state"), (2 * bytes as u64).div_ceil(2));
    }
}
