//! The memory one rank needs for a training config, by category, before launch
//! (`rsd-train memory`, alias `rsd-train --print-memory-plan`), and the layout change that makes
//! a config fit when it does not.
//!
//! Every item is counted from the architecture and the config, following what the code
//! allocates (docs/MEMORY.md derives each formula; `rsd-train memory --measure` checks them
//! against libtorch's CPU allocator). A rank holds, over a step:
//!
//! * **static**: weights, gradients (kept from step to step, zeroed) and the optimizer state;
//! * then the largest of four phases, which never overlap: the forward and backward (the saved
//!   activations at the end of the forward, plus the transient working set above them, LongCE's
//!   short-context pass included), the gradient reduction (communication buffers), the optimizer
//!   update (its temporaries), and the held-out evaluation between steps (`heldout_every`).
//!
//! On CUDA the runtime (context, allocator slack, and on several ranks NCCL's own buffers) comes
//! on top; it is listed apart and is not part of the CPU comparison. fp32 and bf16 differ by the dtype's bytes, except where the code
//! upcasts (RMSNorm statistics, losses, optimizer state: fp32 whatever the model's dtype).
use std::fmt;
use std::path::Path;

use serde::Serialize;

use rsd_model::{Family, ModelConfig};

use crate::config::TrainConfig;
use crate::step::Objective;
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
    /// Optimizer state sharded over all ranks.
    pub shard_optimizer: bool,
    /// Per-layer activation checkpointing.
    pub checkpoint_layers: bool,
    /// Sharded: a bucket's reduce-scatter stays in flight during the next part's backward.
    pub overlap_grad_reduce: bool,
    /// Sharded: the gradient is summed locally over the step's micro-batches and reduce-scattered
    /// once per step (`grad_reduce = "step"`), in a whole-model fp32 buffer.
    pub reduce_per_step: bool,
    /// The objective (which views run, which loss terms a chunk forms).
    pub objective: Objective,
    /// The perturbed view starts from the shared prefix.
    pub prefix_reuse: bool,
    /// Rows per loss chunk.
    pub loss_chunk: u64,
    /// Largest gradient bucket, bytes (fp32).
    pub bucket_bytes: u64,
    /// Memory of one GPU, bytes.
    pub gpu_bytes: u64,
    /// The ranks talk over Gloo (CPU runs), not NCCL.
    pub gloo: bool,
    /// Attention stays inside each document (`doc_mask`).
    pub doc_mask: bool,
    /// LongCE's reference length and stride (`long_ce_window`, `long_ce_stride`); `None` when
    /// LongCE is off.
    pub long_ce: Option<(u64, u64)>,
    /// Micro-batches in the held-out slice (`heldout_batches`, one loader batch each) when
    /// `heldout_every > 0`; 0 when there is no held-out evaluation.
    pub heldout_batches: u64,
    /// NCCL's buffer sizes and channel bound (its environment, read when the plan is made).
    pub nccl: NcclSizes,
}

/// What NCCL allocates per connection and how many channels it may use, from NCCL's defaults or
/// the variables that change them (NCCL reads the same ones when it creates a communicator).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclSizes {
    /// The Simple protocol's buffer per connection, bytes (`NCCL_BUFFSIZE`).
    pub simple: u64,
    /// The LL protocol's, bytes (`NCCL_LL_BUFFSIZE`).
    pub ll: u64,
    /// The LL128 protocol's, bytes (`NCCL_LL128_BUFFSIZE`).
    pub ll128: u64,
    /// Channels of a communicator at most (`NCCL_MAX_NCHANNELS`).
    pub channels: u64,
}

impl NcclSizes {
    /// NCCL's defaults: Simple `1 << 22`; LL `NCCL_LL_LINES_PER_THREAD` (8) ×
    /// `NCCL_LL_MAX_NTHREADS` (512) × `NCCL_STEPS` (8) × 16 B; LL128
    /// `NCCL_LL128_ELEMS_PER_THREAD` (120) × `NCCL_LL128_MAX_NTHREADS` (640) × `NCCL_STEPS` (8)
    /// × 8 B; and 32 channels, the bound taken when `NCCL_MAX_NCHANNELS` is not set.
    pub const DEFAULT: NcclSizes = NcclSizes {
        simple: 1 << 22,
        ll: 8 * 512 * 8 * 16,
        ll128: 120 * 640 * 8 * 8,
        channels: 32,
    };

    /// The sizes `get` (a variable's value by name) gives: a variable that is unset, not a
    /// number or not positive leaves NCCL's default, as NCCL itself does.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Self {
        let read = |name: &str, default: u64| -> u64 {
            get(name)
                .and_then(|v| v.trim().parse::<i64>().ok())
                .filter(|&v| v > 0)
                .map_or(default, |v| v as u64)
        };
        let d = NcclSizes::DEFAULT;
        NcclSizes {
            simple: read("NCCL_BUFFSIZE", d.simple),
            ll: read("NCCL_LL_BUFFSIZE", d.ll),
            ll128: read("NCCL_LL128_BUFFSIZE", d.ll128),
            channels: read("NCCL_MAX_NCHANNELS", d.channels),
        }
    }

    /// The sizes of this process's environment.
    pub fn from_env() -> Self {
        NcclSizes::from_vars(|name| std::env::var(name).ok())
    }

    /// One connection's buffers: one per protocol.
    pub fn per_connection(&self) -> u64 {
        self.simple + self.ll + self.ll128
    }
}

/// What an item of the plan is, as `rsd-train memory --measure` measures it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// The parameters.
    Weights,
    /// The parameters' gradients, kept between steps.
    Gradients,
    /// AdamW's state (and the sharded optimizer's summed-gradient block).
    OptimizerState,
    /// What the step holds at the end of its forward.
    SavedActivations,
    /// The forward and backward's working set above the saved activations.
    Transient,
    /// The gradient reduction's buffers.
    Communication,
    /// The optimizer update's temporaries (gradient norm, AdamW).
    OptimizerUpdate,
    /// The held-out evaluation's working set: between steps, a phase of its own.
    Evaluation,
    /// CUDA context, allocator slack and NCCL's buffers (not on CPU).
    Runtime,
}

impl Category {
    /// Every category, in the order the plan prints them.
    pub const ALL: [Category; 9] = [
        Category::Weights,
        Category::Gradients,
        Category::OptimizerState,
        Category::SavedActivations,
        Category::Transient,
        Category::Communication,
        Category::OptimizerUpdate,
        Category::Evaluation,
        Category::Runtime,
    ];

    /// The name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Category::Weights => "weights",
            Category::Gradients => "gradients",
            Category::OptimizerState => "optimizer_state",
            Category::SavedActivations => "saved_activations",
            Category::Transient => "transient",
            Category::Communication => "communication",
            Category::OptimizerUpdate => "optimizer_update",
            Category::Evaluation => "evaluation",
            Category::Runtime => "runtime",
        }
    }
}

/// One line of the plan.
#[derive(Debug, Clone, Serialize)]
pub struct PlanItem {
    /// What it is.
    pub name: &'static str,
    /// Its category.
    pub category: Category,
    /// Bytes per rank.
    pub bytes: u64,
    /// How it is counted.
    pub how: String,
}

/// The plan: items, category sums, the peak, and the GPU it must fit.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryPlan {
    /// The items.
    pub items: Vec<PlanItem>,
    /// The peak without the runtime: what the CPU measurement compares with, bytes.
    pub peak_cpu: u64,
    /// The peak with the runtime, bytes.
    pub total: u64,
    /// One GPU's memory, bytes.
    pub gpu_bytes: u64,
    /// World size (dp × cp).
    pub world: u64,
    /// Data-parallel ranks.
    pub dp: u64,
    /// Context-parallel degree.
    pub cp: u64,
    /// Parameters.
    pub parameters: u64,
    /// The layout: optimizer sharded.
    pub shard_optimizer: bool,
    /// The layout: activation checkpointing.
    pub checkpoint_layers: bool,
}

impl MemoryPlan {
    /// Whether the total fits one GPU.
    pub fn fits(&self) -> bool {
        self.total <= self.gpu_bytes
    }

    /// Whether the total leaves at least `fraction` of the GPU free.
    pub fn fits_with_headroom(&self, fraction: f64) -> bool {
        (self.total as f64) <= self.gpu_bytes as f64 * (1.0 - fraction)
    }

    /// The bytes of one category.
    pub fn category(&self, c: Category) -> u64 {
        self.items
            .iter()
            .filter(|i| i.category == c)
            .map(|i| i.bytes)
            .sum()
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
    let model = read_arch(&arch_file(cfg, arch)?)?;
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
        overlap_grad_reduce: cfg.overlap_grad_reduce,
        reduce_per_step: cfg.grad_reduce == crate::config::GradReduce::Step,
        objective: cfg.objective.loss(),
        prefix_reuse: cfg.prefix_reuse,
        loss_chunk: cfg.loss_chunk.max(1) as u64,
        bucket_bytes: (cfg.grad_bucket_mb.max(1) as u64) << 20,
        gpu_bytes,
        gloo: !cfg.device.starts_with("cuda"),
        doc_mask: cfg.doc_mask,
        long_ce: (cfg.long_ce_window > 0)
            .then(|| (cfg.long_ce_window as u64, cfg.long_ce_stride.max(1) as u64)),
        heldout_batches: if cfg.heldout_every > 0 {
            cfg.heldout_batches as u64
        } else {
            0
        },
        nccl: NcclSizes::from_env(),
    })
}

/// The `config.json` the architecture is read from: `arch`, else the config's model directory's,
/// else its `init` file.
pub fn arch_file(cfg: &TrainConfig, arch: Option<&Path>) -> Result<std::path::PathBuf> {
    match (arch, &cfg.model, &cfg.init) {
        (Some(file), _, _) => Ok(file.to_path_buf()),
        (None, Some(dir), _) => {
            let file = Path::new(dir).join("config.json");
            if !file.exists() {
                return Err(Error::Input(format!(
                    "{}: not found; to plan before the model is downloaded, give its \
                     architecture: --arch path/to/config.json (rsd-train memory) or \
                     --print-memory-plan path/to/config.json (configs/model/ has Llama-3-8B's \
                     and Qwen3-4B's)",
                    file.display()
                )));
            }
            Ok(file)
        }
        (None, None, Some(init)) => Ok(Path::new(init).to_path_buf()),
        (None, None, None) => Err(Error::Input(
            "config key model/init: the plan needs the architecture".into(),
        )),
    }
}

fn read_arch(file: &Path) -> Result<ModelConfig> {
    Ok(ModelConfig::from_file(file)?)
}

/// The widths the formulas use.
struct Widths {
    /// Hidden size.
    d: u64,
    /// Query width: heads × head_dim (not the hidden size: Qwen3-4B's is 4096 against 2560).
    q: u64,
    /// K/V width: KV heads × head_dim.
    kv: u64,
    /// MLP width.
    f: u64,
    heads: u64,
    head_dim: u64,
    layers: u64,
    vocab: u64,
    /// Qwen3's per-head RMSNorm of q and k.
    qk_norm: bool,
    /// The largest parameter (embedding or LM head), elements.
    largest: u64,
}

impl Widths {
    fn of(m: &ModelConfig) -> Self {
        let hd = m.head_dim as u64;
        let d = m.hidden_size as u64;
        let f = m.intermediate_size as u64;
        let q = m.num_attention_heads as u64 * hd;
        let vocab = m.vocab_size as u64;
        Widths {
            d,
            q,
            kv: m.num_key_value_heads as u64 * hd,
            f,
            heads: m.num_attention_heads as u64,
            head_dim: hd,
            layers: m.num_hidden_layers as u64,
            vocab,
            qk_norm: m.family == Family::Qwen3,
            largest: (vocab * d).max(d * f).max(d * q),
        }
    }
}

/// Bytes autograd keeps for one decoder layer per token of a pass (model dtype `b`), the K/V of
/// other rows aside. With `b` = 4 an RMSNorm keeps its input itself (the fp32 "copy" is the
/// same tensor) and its normalised value; below fp32 it keeps an fp32 copy of its input and the
/// normalised value in the model's dtype.
fn layer_saved_per_token(w: &Widths, b: u64) -> u64 {
    // Per normalised value: the input (fp32: shared with the tensor the layer already holds).
    let norm = |width: u64| {
        if b == 4 {
            4 * width
        } else {
            4 * width + b * width
        }
    };
    // The layer's input (fp32 only: bf16 norms keep their own fp32 copy instead).
    let input = if b == 4 { b * w.d } else { 0 };
    // Residual after attention (fp32 only, as the input).
    let x1 = if b == 4 { b * w.d } else { 0 };
    // input_layernorm: normalised value, output (read by q/k/v).
    let norm1 = norm(w.d) + b * w.d;
    // q and k after RoPE, v as projected: the attention keeps them, K/V never expanded to the
    // query heads.
    let qkv = b * (w.q + 2 * w.kv);
    // Qwen3: q and k as projected (nothing else keeps them: fp32 keeps them, bf16 an fp32 copy)
    // and normalised.
    let qk = if w.qk_norm {
        (4 + if b == 4 { 4 } else { b }) * (w.q + w.kv)
    } else {
        0
    };
    // Attention output, its log-sum-exp (fp32 per head), and o_proj's input: a copy (the
    // output, [B, H, T, D], transposed back to [B, T, H·D]).
    let attn = 2 * b * w.q + 4 * w.heads;
    // post_attention_layernorm, its output (read by gate/up), gate, silu(gate), up, product.
    let mlp = norm(w.d) + b * w.d + b * 4 * w.f;
    input + norm1 + qkv + qk + attn + x1 + mlp
}

/// Losses, norms' statistics and optimizer state are fp32 for bf16 and fp32 models alike.
const ACC: u64 = 4;

/// What every item of the plan is counted from: the widths, and the sizes the config implies.
struct Shape {
    /// The architecture's widths.
    w: Widths,
    /// Parameters.
    params: u64,
    /// Bytes per value of the model's dtype.
    b: u64,
    cp: u64,
    dp: u64,
    world: u64,
    /// Passes per step: 1 for the objectives with one view, else 2.
    views: u64,
    /// Rows per view on this rank.
    rows: u64,
    /// Rows over all views on this rank.
    view_rows: u64,
    /// The optimizer state is sharded (asked for, and more than one rank).
    sharded: bool,
    /// The largest gradient bucket, elements.
    bucket_elems: u64,
}

impl Shape {
    fn of(p: &PlanInput) -> Self {
        let m = &p.model;
        let w = Widths::of(m);
        let params = m.num_parameters() as u64;
        let cp = p.cp.max(1);
        let dp = p.dp.max(1);
        let world = dp * cp;
        let views: u64 = match p.objective.loss() {
            Objective::Standard | Objective::Pose => 1,
            _ => 2,
        };
        // Rows per view on this rank: the standard view's chunks, and the perturbed view at its
        // largest (a split after the first token runs every row but one; under context
        // parallelism the re-sharded suffix spreads them evenly).
        let rows = p.micro_batch * p.seq_len.div_ceil(cp);
        let sharded = p.shard_optimizer && world > 1;
        // Replicated, one all-reduce bucket of at most grad_bucket_mb (a larger parameter is a
        // bucket of its own); sharded, the buckets follow the model's parts (top, layers,
        // embedding).
        let bucket_elems = if sharded {
            w.largest.min(params) + w.d
        } else {
            (p.bucket_bytes / 4).max(w.largest.min(params))
        };
        Shape {
            params,
            b: p.dtype_bytes,
            cp,
            dp,
            world,
            views,
            rows,
            view_rows: views * rows,
            sharded,
            bucket_elems,
            w,
        }
    }

    /// The K/V a layer gathers from its context-parallel group (whole sequence, every view);
    /// 0 without context parallelism.
    fn gathered_kv(&self, p: &PlanInput) -> u64 {
        if self.cp > 1 {
            self.views * 2 * p.micro_batch * p.seq_len * self.w.kv * self.b
        } else {
            0
        }
    }
}

/// Appends one item to the plan.
fn add(items: &mut Vec<PlanItem>, name: &'static str, category: Category, bytes: u64, how: String) {
    items.push(PlanItem {
        name,
        category,
        bytes,
        how,
    })
}

/// Computes the plan (see the module docs and docs/MEMORY.md for every formula): the static
/// items, then each phase's, then the sums and the runtime on top.
pub fn plan(p: &PlanInput) -> MemoryPlan {
    let s = Shape::of(p);
    let mut items: Vec<PlanItem> = Vec::new();
    weights_and_gradients(p, &s, &mut items);
    optimizer_state(&s, &mut items);
    saved_activations(p, &s, &mut items);
    transient(p, &s, &mut items);
    gradient_buckets(&s, &mut items);
    update_temporaries(p, &s, &mut items);
    heldout_evaluation(p, &s, &mut items);
    with_totals(p, &s, items)
}

/// The weights, the gradients kept between steps, and cuBLAS's workspaces.
fn weights_and_gradients(p: &PlanInput, s: &Shape, items: &mut Vec<PlanItem>) {
    let (params, b) = (s.params, s.b);
    add(
        items,
        "weights",
        Category::Weights,
        params * b,
        format!("{params} parameters × {b} B"),
    );
    if s.sharded && p.reduce_per_step {
        // Each rank's own sum of its micro-batches, flat in fp32 and padded to the ranks, lives
        // through the step; the parameters' .grad are freed into it part by part.
        let padded = s.params.div_ceil(s.world) * s.world;
        add(
            items,
            "gradients",
            Category::Gradients,
            padded * 4,
            format!("{padded} × 4 B (the local fp32 sum over the step's micro-batches, grad_reduce = step)"),
        );
    } else if s.sharded {
        // ZeRO-2: each part's gradients are reduce-scattered into the fp32 block (optimizer
        // state) and freed as the backward completes them: none stays from step to step.
        add(
            items,
            "gradients",
            Category::Gradients,
            0,
            "0 (each part's .grad freed once reduce-scattered into the fp32 block)".into(),
        );
    } else {
        add(
            items,
            "gradients",
            Category::Gradients,
            params * b,
            format!("{params} × {b} B (.grad, kept and zeroed between steps)"),
        );
    }
    // cuBLAS's workspaces come from the caching allocator with the first backward: measured on
    // an H100 and an H200 as 64 MiB above the gradients at every model size, and as none with
    // CUBLAS_WORKSPACE_CONFIG=:0:0 CUBLASLT_WORKSPACE_SIZE=0 (docs/GPU.md).
    if !p.gloo {
        add(
            items,
            "cuBLAS workspaces",
            Category::Gradients,
            64 << 20,
            "the backward's cuBLAS workspaces (measured, torch 2.11 on Hopper)".into(),
        );
    }
}

/// AdamW's state: sharded over the ranks with the summed gradient block, or replicated.
fn optimizer_state(s: &Shape, items: &mut Vec<PlanItem>) {
    let (params, b, world) = (s.params, s.b, s.world);
    if s.sharded {
        add(
            items,
            "AdamW state",
            Category::OptimizerState,
            (params * 12).div_ceil(world),
            format!("12 B/parameter (fp32 master + 2 moments) ÷ {world} ranks (sharded)"),
        );
        add(
            items,
            "summed gradient block",
            Category::OptimizerState,
            (params * 4).div_ceil(world),
            format!("4 B/parameter ÷ {world} ranks (fp32)"),
        );
    } else {
        let state_per_param = if b < 4 { 12 } else { 8 };
        add(
            items,
            "AdamW state",
            Category::OptimizerState,
            params * state_per_param,
            format!(
                "{state_per_param} B/parameter ({}2 fp32 moments), replicated",
                if b < 4 { "fp32 master + " } else { "" }
            ),
        );
    }
}

/// What the step holds at the end of its forward: every layer's saved tensors (or, checkpointed,
/// only the layers' inputs) and the RoPE tables.
fn saved_activations(p: &PlanInput, s: &Shape, items: &mut Vec<PlanItem>) {
    let (w, b, views, rows, view_rows) = (&s.w, s.b, s.views, s.rows, s.view_rows);
    let per_token = layer_saved_per_token(w, b);
    // Context parallelism, per layer and view: the chunks attend to views of the K/V gathered
    // from the group (the whole sequence's, unexpanded; the perturbed suffix's pieces to the
    // standard view's first P rows joined with the gathered suffix, again the whole row), and
    // the attention keeps those views, so the gathered K/V stay.
    let context_per_layer = s.gathered_kv(p);
    if p.checkpoint_layers {
        add(
            items,
            "checkpointed layer inputs",
            Category::SavedActivations,
            view_rows * (w.layers + 1) * w.d * b,
            format!(
                "{views} view(s) × ({} layers + final) × {rows} rows × {} × {b} B",
                w.layers, w.d
            ),
        );
    } else {
        add(
            items,
            "saved tensors of every layer",
            Category::SavedActivations,
            view_rows * (w.layers * per_token + 3 * w.d * b) + w.layers * context_per_layer,
            format!(
                "{views} view(s) × {rows} rows × ({} layers × {per_token} B/token + the final \
                 norm's input, normalised value and output){}",
                w.layers,
                if s.cp > 1 {
                    " + per layer the gathered K/V"
                } else {
                    ""
                }
            ),
        );
    }
    let rotary = views * 2 * rows * w.head_dim * b;
    add(
        items,
        "RoPE tables",
        Category::SavedActivations,
        rotary,
        format!(
            "{views} pass(es) × cos, sin × {rows} rows × {} × {b} B",
            w.head_dim
        ),
    );
}

/// The working set above the saved activations: the larger of the loss phase and one layer's
/// backward.
fn transient(p: &PlanInput, s: &Shape, items: &mut Vec<PlanItem>) {
    let (w, b, view_rows) = (&s.w, s.b, s.view_rows);
    let (chunk_tensors, chunk, loss_chunk) = loss_chunk(p, s);
    // The LM head's gradient, accumulated over the chunks (fp32), and the hidden states'
    // gradients the chunked loss hands the backward.
    let head_grad = w.vocab * w.d * ACC;
    let hidden_grad = view_rows * w.d * b;
    // After the chunks, the LM head's surrogate backward: its weight times the accumulated
    // gradient (fp32) and that gradient back through the product (cast to the model's dtype).
    let surrogate = w.vocab * w.d * ACC + if b < 4 { w.vocab * w.d * b } else { 0 };
    let loss_phase = head_grad + hidden_grad + loss_chunk.max(surrogate);
    let final_norm = if p.checkpoint_layers {
        2 * view_rows * w.d * b
    } else {
        0
    };
    let flash_backward = flash_backward(p, s);
    let in_flight = in_flight_bucket(p, s);
    let layer_phase = layer_backward(p, s, hidden_grad) + flash_backward + in_flight;
    let transient = (loss_phase + final_norm).max(layer_phase);
    add(
        items,
        "loss phase",
        Category::Transient,
        transient,
        format!(
            "the larger of the loss (LM-head gradient {}×{} fp32, hidden gradients, \
             {chunk_tensors} × {chunk} rows × {} vocab fp32) and one layer's backward{}{}",
            w.vocab,
            w.d,
            w.vocab,
            if p.checkpoint_layers {
                " (recomputed)"
            } else {
                ""
            },
            if in_flight > 0 {
                " with a gradient bucket's reduce-scatter in flight"
            } else {
                ""
            }
        ) + if flash_backward > 0 {
            " and flash attention's backward workspace"
        } else {
            ""
        },
    );
    if let Some(short) = long_ce_pass(p, s) {
        // The short-context pass runs at the start of the loss phase, with the final norm's
        // graph kept; its log-probabilities stay through the chunked loss (not through the
        // surrogate backward, which runs after them: counted with the chunks, where they are
        // live). The item is what it adds to the transient's largest moment.
        let with_long_ce = (loss_phase + final_norm + short.held)
            .max(final_norm + short.peak)
            .max(layer_phase);
        add(
            items,
            "LongCE short context",
            Category::Transient,
            with_long_ce - transient,
            format!(
                "forwards without a graph of {} tokens of short-context windows ({} + {} − 1 \
                 tokens each) and their {} × vocab log-softmax chunks: {} at their largest, with \
                 the {} rows' fp32 log-probabilities kept through the loss; what that adds \
                 above the step's transient",
                short.tokens,
                short.window,
                short.stride,
                short.chunk,
                gib(final_norm + short.peak),
                s.rows
            ),
        );
    }
}

/// LongCE's short-context pass (`step/long_ce.rs`), at its largest, for this rank's rows.
struct ShortPass {
    window: u64,
    stride: u64,
    /// Tokens per forward.
    tokens: u64,
    /// Rows per log-softmax chunk.
    chunk: u64,
    /// Kept through the loss: the labels' short-context log-probabilities and the 0/1 `scored`
    /// mask, fp32 per row of this rank.
    held: u64,
    /// The pass at its largest, `held` included.
    peak: u64,
}

/// LongCE's pass: the rank's short-context windows (each `window … window + stride − 1` tokens
/// of context, `window + stride − 1` tokens at most) stacked ⌊n / longest⌋ to a forward without
/// a graph, so a forward runs at most max(n, window + stride − 1) tokens (n = this rank's rows);
/// then the labels' log-probabilities formed `loss_chunk` rows at a time. `None` when LongCE is
/// off or no row has a short context of its own (rows shorter than window + stride).
fn long_ce_pass(p: &PlanInput, s: &Shape) -> Option<ShortPass> {
    let (window, stride) = p.long_ce?;
    let span = window + stride - 1;
    if p.seq_len < window + stride {
        return None;
    }
    let (w, b, n) = (&s.w, s.b, s.rows);
    let tokens = n.max(span);
    let held = 2 * n * ACC;
    // int64 indices of a forward: the windows' tokens, the scored rows' source and destination,
    // the stacked input; under context parallelism the whole rows' tokens, uploaded once.
    let whole_rows = if s.cp > 1 {
        8 * p.micro_batch * p.seq_len
    } else {
        0
    };
    let indices = 4 * 8 * tokens + whole_rows;
    // The forward: one layer at its largest moment, and the pass's RoPE tables.
    let forward = tokens * forward_layer_per_token(w, b) + 2 * tokens * w.head_dim * b;
    // Then: the final hidden states, a chunk's rows gathered from them, its logits in the model's
    // dtype, their fp32 copy and log-softmax.
    let chunk = p.loss_chunk.min(tokens);
    let logits = tokens * w.d * b + chunk * w.d * b + chunk * w.vocab * (b + 2 * ACC);
    Some(ShortPass {
        window,
        stride,
        tokens,
        chunk,
        held,
        peak: held + indices + forward.max(logits),
    })
}

/// A forward without a graph holds, per token, at one layer's largest moment: the MLP's (the
/// layer's input, the input norm's output, the attention's output and the residual, the
/// post-attention norm's output, the layer's K/V after RoPE (returned with its output), silu(gate),
/// up, their product and down's output) or the attention's (input, normalised value, q and k as
/// projected and after RoPE, v, the attention's output), whichever is larger.
fn forward_layer_per_token(w: &Widths, b: u64) -> u64 {
    let mlp = b * (6 * w.d + 2 * w.kv + 3 * w.f);
    let attention = b * (2 * w.d + 3 * w.q + 3 * w.kv);
    mlp.max(attention)
}

/// One loss chunk's temporaries: how many fp32 tensors of the chunk's logits, its rows, and
/// the bytes they take at their largest.
fn loss_chunk(p: &PlanInput, s: &Shape) -> (u64, u64, u64) {
    let chunk = p.loss_chunk.min(s.rows);
    // Loss chunk temporaries, fp32: rsd keeps the teacher's log-probabilities while the
    // perturbed chunk forms logits, log-probabilities and probabilities.
    let chunk_tensors: u64 = match p.objective.loss() {
        Objective::Rsd => 4,
        _ => 3,
    };
    (
        chunk_tensors,
        chunk,
        chunk_bytes(&s.w, s.b, chunk, chunk_tensors),
    )
}

/// A loss chunk of `chunk` rows with `tensors` fp32 tensors of its logits, at its largest.
fn chunk_bytes(w: &Widths, b: u64, chunk: u64, tensors: u64) -> u64 {
    let bytes = tensors * chunk * w.vocab * ACC;
    if b < 4 {
        // Below fp32 the LM head's backward casts the chunk's logit gradient to the model's
        // dtype and forms the weight gradient there before adding it in fp32, next to the
        // teacher and the gradient itself.
        bytes.max(2 * chunk * w.vocab * ACC + chunk * w.vocab * b + w.vocab * w.d * (b + ACC))
    } else {
        bytes
    }
}

/// A layer's backward, flash attention's workspace and a bucket in flight aside: the MLP's two
/// gradients at its width (one pass at a time), the layer's gathered K/V and the gradients
/// flowing down; checkpointed, the layer recomputed as well.
fn layer_backward(p: &PlanInput, s: &Shape, hidden_grad: u64) -> u64 {
    let mlp_grads = 2 * s.rows * s.w.f * s.b;
    // The K/V gathered for a layer (whole sequence, both views) while it runs.
    let gathered = s.gathered_kv(p);
    let recomputed = if p.checkpoint_layers {
        // One layer recomputed (both views) with its gathered K/V (the attention keeps its
        // views of them, as saved_activations counts per layer), its gradients flowing down
        // (two hidden-width tensors per view) and the final norm's output kept.
        s.view_rows * layer_saved_per_token(&s.w, s.b) + gathered
    } else {
        0
    };
    mlp_grads + recomputed + gathered + 3 * hidden_grad
}

/// On CUDA in half precision the attention's backward is flash attention's, which accumulates
/// dq in fp32 over rows rounded to 128 and a head size rounded to 32 (64 above 128), with an
/// fp32 row statistic per head; per KV group the call's dk/dv come next to the group's sums.
/// (Measured on an H200 at Llama-3-8B's widths, 32K tokens: 624 MiB above the CPU-derived
/// transient; this term is 644 MiB there.) 0 elsewhere.
fn flash_backward(p: &PlanInput, s: &Shape) -> u64 {
    let w = &s.w;
    if !p.gloo && s.b < 4 {
        let rows_r = p.micro_batch * (p.seq_len.div_ceil(s.cp)).div_ceil(128) * 128;
        let d_r = if w.head_dim <= 128 {
            w.head_dim.div_ceil(32) * 32
        } else {
            w.head_dim.div_ceil(64) * 64
        };
        rows_r * w.heads * (d_r + 1) * ACC + 2 * s.rows * w.kv * s.b
    } else {
        0
    }
}

/// Sharded and overlapped, each part's gradients are reduce-scattered during the next part's
/// backward: with per-layer hooks, the largest bucket (the LM head's) is still in flight — flat
/// in fp32, Gloo's copy of it, the reduced block — while a layer's backward runs. Without the
/// hooks every bucket is reduced after the backward, when nothing else is: 0.
fn in_flight_bucket(p: &PlanInput, s: &Shape) -> u64 {
    if s.sharded && p.overlap_grad_reduce && p.checkpoint_layers {
        let bucket = s.bucket_elems.min(s.params) * 4;
        bucket * if p.gloo { 2 } else { 1 } + bucket.div_ceil(s.world)
    } else {
        0
    }
}

/// The gradient reduction, replicated on several ranks: one fp32 bucket flattened for the
/// all-reduce. (Sharded, the reduce-scatters run during the backward, counted there.)
fn gradient_buckets(s: &Shape, items: &mut Vec<PlanItem>) {
    if s.world > 1 && !s.sharded {
        let bucket = s.bucket_elems.min(s.params) * 4;
        add(
            items,
            "gradient buckets",
            Category::Communication,
            bucket,
            format!("one fp32 bucket flattened ({} MiB)", bucket >> 20),
        );
    }
}

/// The optimizer update: the gradient norm reads each gradient where it is (a reduction, no
/// copy); the fused AdamW kernel runs in the state's dtype, so a half-precision model's gradient
/// is copied to fp32 one parameter at a time (replicated; a sharded bucket's summed gradient is
/// fp32 already); sharded, each bucket's new parameters are all-gathered whole.
fn update_temporaries(p: &PlanInput, s: &Shape, items: &mut Vec<PlanItem>) {
    let (params, sharded) = (s.params, s.sharded);
    let upcast = if !sharded && s.b < 4 {
        4 * s.w.largest.min(params)
    } else {
        0
    };
    // Sharded, each bucket's new parameters are all-gathered whole in the model's dtype (Gloo
    // gathers through a copy of its own).
    let gather = if sharded {
        s.bucket_elems.min(params) * s.b * if p.gloo { 2 } else { 1 }
    } else {
        0
    };
    add(
        items,
        "update temporaries",
        Category::OptimizerUpdate,
        upcast.max(gather),
        match (sharded, upcast > 0) {
            (true, _) => "the all-gathered bucket of new parameters".into(),
            (false, true) => format!(
                "the fp32 copy of the largest parameter's gradient ({} elements) the fused AdamW \
                 kernel reads",
                s.w.largest.min(params)
            ),
            (false, false) => "none: the fused AdamW kernel reads the gradients in place".into(),
        },
    );
}

/// The held-out evaluation (`heldout_every > 0`, `step::evaluate`), between steps: each rank
/// runs its share of the slice (micro-batches `rank, rank + world, …`) one micro-batch at a time
/// as whole rows — no context parallelism, no graph — through both views (the standard one and
/// the run's perturbed one, with the step's prefix reuse), then the chunked loss of `rsd`. The
/// step's saved activations and transients are gone by then; the weights, the optimizer state and
/// replicated gradients stay (the static items), so this is a phase of its own.
fn heldout_evaluation(p: &PlanInput, s: &Shape, items: &mut Vec<PlanItem>) {
    if p.heldout_batches == 0 {
        return;
    }
    let (w, b) = (&s.w, s.b);
    let t = p.micro_batch * p.seq_len;
    // The rank's share of the slice stays on the device for the whole run: tokens and labels,
    // int64 (a few MiB; during the step it is left to the runtime's slack).
    let slice = p.heldout_batches.div_ceil(s.world) * 2 * 8 * t;
    // The forward runs a layer for both views before the next: while the perturbed view's layer
    // runs, the standard view's input and output of that layer stay (and its K/V, the perturbed
    // rows' prefix under prefix reuse), with both views' RoPE tables.
    let prefix_kv = if p.prefix_reuse { 2 * t * w.kv * b } else { 0 };
    let forward = 2 * t * w.d * b
        + prefix_kv
        + t * forward_layer_per_token(w, b)
        + 2 * 2 * t * w.head_dim * b;
    // The loss: both views' final hidden states and the zeroed gradients the chunked loss fills
    // (it forms them even without a graph), the LM head's fp32 gradient, and one chunk of rsd's
    // four fp32 tensors.
    let chunk = p.loss_chunk.min(t);
    let loss = 4 * t * w.d * b + w.vocab * w.d * ACC + chunk_bytes(w, b, chunk, 4);
    add(
        items,
        "held-out evaluation",
        Category::Evaluation,
        slice + forward.max(loss),
        format!(
            "whole rows ({t} tokens, no context parallelism), both views without a graph: the \
             larger of a layer's forward ({}) and the chunked loss ({}), with the rank's {} \
             held-out micro-batch(es) kept on the device",
            gib(forward),
            gib(loss),
            p.heldout_batches.div_ceil(s.world)
        ),
    );
}

/// NCCL's own buffers (CUDA, several ranks): allocated by NCCL outside the caching allocator when
/// a communicator first runs a collective, and kept until the end, so on top of every phase.
/// Per channel, each connection holds one buffer per protocol (Simple, LL, LL128). The
/// communicators of a dp × cp run (`rsd_dist::Mesh`; torch's ProcessGroupNCCL creates them lazily,
/// at a group's first collective):
///
/// * the world: all-reduces (losses, flags, a replicated run's gradient buckets), the sharded
///   optimizer's reduce-scatters and all-gathers, the first broadcast — ring connections (a send
///   and a receive peer) and tree ones (all-reduce: a parent and up to three children,
///   `NCCL_MAX_TREE_ARITY`);
/// * with cp > 1 and dp > 1, the rank's context-parallel subgroup: the K/V all-gathers (their
///   backward a reduce-scatter), ring only; with dp = 1 the world is that group;
/// * prefix reuse under context parallelism re-shards the perturbed suffix with an all-to-all in
///   that group: NCCL sends and receives to each other rank of it on the group's communicator
///   (ProcessGroupNCCL makes its extra two-rank communicators only for send/recv, which rsd-train
///   never calls);
/// * the data-parallel subgroup is created but runs no collective: no communicator.
///
/// An upper bound: every connection on every channel up to the bound, and a buffer set for the
/// send and the receive side alike (NCCL puts most of a connection's buffers on one side).
fn nccl_buffers(p: &PlanInput, s: &Shape, items: &mut Vec<PlanItem>) {
    if p.gloo || s.world <= 1 {
        return;
    }
    const RING: u64 = 2;
    const TREE: u64 = 4;
    let all_to_all = if s.cp > 1 && p.prefix_reuse && p.objective.needs_perturbed() {
        2 * (s.cp - 1)
    } else {
        0
    };
    let (world, cp_group) = match (s.dp, s.cp) {
        (_, 1) => (RING + TREE, 0),
        (1, _) => (RING + TREE + all_to_all, 0),
        _ => (RING + TREE, RING + all_to_all),
    };
    let n = &p.nccl;
    let bytes = (world + cp_group) * n.channels * n.per_connection();
    add(
        items,
        "NCCL buffers",
        Category::Runtime,
        bytes,
        format!(
            "upper bound from NCCL's settings, not measured: {} connections × {} channels × \
             (Simple {} + LL {} + LL128 {} B); per channel, the world: ring 2 + tree 4{}{}",
            world + cp_group,
            n.channels,
            n.simple,
            n.ll,
            n.ll128,
            if s.dp == 1 && all_to_all > 0 {
                format!(" + all-to-all {all_to_all}")
            } else {
                String::new()
            },
            if cp_group > 0 {
                format!(
                    "; the context-parallel group: ring 2{}",
                    if all_to_all > 0 {
                        format!(" + all-to-all {all_to_all}")
                    } else {
                        String::new()
                    }
                )
            } else {
                String::new()
            }
        ),
    );
}

/// The plan from its items: the static items plus the largest phase (the CPU peak), and the
/// CUDA runtime on top.
fn with_totals(p: &PlanInput, s: &Shape, mut items: Vec<PlanItem>) -> MemoryPlan {
    let sum = |c: Category, items: &[PlanItem]| -> u64 {
        items
            .iter()
            .filter(|i| i.category == c)
            .map(|i| i.bytes)
            .sum()
    };
    let held = sum(Category::Weights, &items)
        + sum(Category::Gradients, &items)
        + sum(Category::OptimizerState, &items);
    let phase = (sum(Category::SavedActivations, &items) + sum(Category::Transient, &items))
        .max(sum(Category::Communication, &items))
        .max(sum(Category::OptimizerUpdate, &items))
        .max(sum(Category::Evaluation, &items));
    let peak_cpu = held + phase;
    // Measured on an H200 (docs/GPU.md): the context and the libraries' workspaces took 0.74
    // GiB, the caching allocator (expandable segments) held 2.8–5.7% above the live peak, on one
    // GPU. NCCL's buffers are an item of their own: NCCL allocates them outside the caching
    // allocator, so no slack is counted on them.
    let runtime = (1u64 << 30) + peak_cpu * 2 / 25;
    items.push(PlanItem {
        name: "runtime",
        category: Category::Runtime,
        bytes: runtime,
        how: "CUDA context + allocator slack: 1 GiB + 8% (not on CPU)".into(),
    });
    nccl_buffers(p, s, &mut items);
    let runtime = sum(Category::Runtime, &items);
    MemoryPlan {
        items,
        peak_cpu,
        total: peak_cpu + runtime,
        gpu_bytes: p.gpu_bytes,
        world: s.world,
        dp: s.dp,
        cp: s.cp,
        parameters: s.params,
        shard_optimizer: p.shard_optimizer,
        checkpoint_layers: p.checkpoint_layers,
    }
}

/// When `input` does not fit: the smallest change of layout over the same GPUs that does —
/// one key before two, two before three (turning on `shard_optimizer`, turning on
/// `checkpoint_layers`, raising `cp` by the least factor) — and its plan. `None` when none does.
pub fn suggestion(input: &PlanInput) -> Option<(String, MemoryPlan)> {
    let world = input.dp.max(1) * input.cp.max(1);
    let mut cps = Vec::new();
    let mut c = input.cp.max(1) * 2;
    while c <= world {
        if world.is_multiple_of(c) {
            cps.push(c);
        }
        c *= 2;
    }
    let shard = [input.shard_optimizer, true];
    let ckpt = [input.checkpoint_layers, true];
    let mut tries: Vec<(usize, PlanInput, String)> = Vec::new();
    for &s in &shard[..if input.shard_optimizer { 1 } else { 2 }] {
        for &k in &ckpt[..if input.checkpoint_layers { 1 } else { 2 }] {
            for c in std::iter::once(input.cp.max(1)).chain(cps.iter().copied()) {
                let mut what = Vec::new();
                if s != input.shard_optimizer {
                    what.push("turn on shard_optimizer".to_string());
                }
                if k != input.checkpoint_layers {
                    what.push("turn on checkpoint_layers".to_string());
                }
                if c != input.cp.max(1) {
                    what.push(format!("raise cp to {c} (dp {})", world / c));
                }
                if what.is_empty() {
                    continue;
                }
                let changed = PlanInput {
                    shard_optimizer: s,
                    checkpoint_layers: k,
                    cp: c,
                    dp: world / c,
                    ..input.clone()
                };
                // Fewer keys first; among as many, the smaller cp (less communication).
                tries.push((what.len() * 1000 + c as usize, changed, what.join(" and ")));
            }
        }
    }
    tries.sort_by_key(|t| t.0);
    tries.into_iter().find_map(|(_, p, how)| {
        let plan = plan(&p);
        plan.fits().then_some((how, plan))
    })
}

/// The error for a layout that does not fit: the plan's peak, the GPU, and the smallest change
/// that fits (or that none does).
pub fn not_fitting(input: &PlanInput, plan: &MemoryPlan) -> Error {
    let fix = match suggestion(input) {
        Some((how, p)) => format!("{how} (peak {} per GPU)", gib(p.total)),
        None => format!(
            "no sharding / checkpointing / context-parallel split of {} GPUs fits; use more \
             GPUs or lower loss_chunk",
            plan.world
        ),
    };
    Error::Input(format!(
        "the memory plan needs {} per GPU (dp {} × cp {}), more than the {} of one GPU: {fix} \
         (rsd-train memory prints the plan)",
        gib(plan.total),
        plan.dp,
        plan.cp,
        gib(plan.gpu_bytes)
    ))
}

/// Bytes as GiB (GPUs sold as "80 GB" hold 80 GiB).
pub fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Bytes as MiB, for CPU-sized runs.
pub fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1u64 << 20) as f64)
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let size = |b: u64| {
            if self.gpu_bytes >= 1 << 30 && b >= 1 << 30 {
                gib(b)
            } else {
                mib(b)
            }
        };
        writeln!(
            f,
            "memory per rank, {} parameters, dp {} × cp {} = {} rank(s), shard_optimizer {}, \
             checkpoint_layers {}:",
            self.parameters,
            self.dp,
            self.cp,
            self.world,
            self.shard_optimizer,
            self.checkpoint_layers
        )?;
        for c in Category::ALL {
            for i in self.items.iter().filter(|i| i.category == c) {
                writeln!(
                    f,
                    "  {:<18} {:<28} {:>11}   {}",
                    c.name(),
                    i.name,
                    size(i.bytes),
                    i.how
                )?;
            }
        }
        writeln!(
            f,
            "  {:<47} {:>11}   weights + gradients + optimizer state + the largest phase \
             (saved + transient, communication, update, evaluation)",
            "peak (CPU, no runtime)",
            size(self.peak_cpu)
        )?;
        writeln!(
            f,
            "  {:<47} {:>11}   of {} per GPU: {}",
            "peak (GPU, with runtime)",
            size(self.total),
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
            overlap_grad_reduce: true,
            reduce_per_step: false,
            objective: Objective::Rsd,
            prefix_reuse: true,
            loss_chunk: 4096,
            bucket_bytes: 25 << 20,
            gpu_bytes: 80 << 30,
            gloo: false,
            doc_mask: true,
            long_ce: None,
            heldout_batches: 0,
            nccl: NcclSizes::DEFAULT,
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
        assert_eq!(item(&p, "AdamW state"), 12 * 8_030_261_248);
        assert!(!p.fits());
    }

    #[test]
    fn sharding_and_context_parallelism_divide_what_they_should() {
        let sharded = plan(&input(16, 1, true));
        assert_eq!(
            item(&sharded, "AdamW state"),
            (12 * 8_030_261_248u64).div_ceil(16)
        );
        let cp2 = plan(&input(8, 2, true));
        assert_eq!(
            item(&cp2, "checkpointed layer inputs") * 2,
            item(&sharded, "checkpointed layer inputs")
        );
        assert_eq!(cp2.world, 16);
        assert_eq!(item(&cp2, "weights"), item(&sharded, "weights"));
    }

    #[test]
    fn the_query_width_counts_where_it_differs_from_the_hidden_width() {
        // Qwen3-4B: 32 heads × 128 = 4096 query width against a 2560 hidden size.
        let qwen = ModelConfig::from_hf_json(serde_json::json!({
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
            "vocab_size": 151936, "hidden_size": 2560, "intermediate_size": 9728,
            "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "tie_word_embeddings": true
        }))
        .unwrap();
        let w = Widths::of(&qwen);
        assert_eq!((w.d, w.q, w.kv), (2560, 4096, 1024));
        let narrow = Widths {
            q: w.d,
            ..Widths::of(&qwen)
        };
        assert!(layer_saved_per_token(&w, 2) > layer_saved_per_token(&narrow, 2));
    }

    #[test]
    fn the_smallest_change_that_fits_is_named() {
        let p = input(16, 1, false);
        assert!(!plan(&p).fits());
        let (how, fixed) = suggestion(&p).expect("some layout of 16 GPUs fits");
        assert!(fixed.fits());
        // No single change fits here: sharding alone leaves 64K rows per rank.
        assert!(how.contains(" and "), "{how}");
        let e = not_fitting(&p, &plan(&p)).to_string();
        assert!(e.contains(&how), "{e}");
    }

    /// NCCL's default buffer set per connection: Simple 4 MiB + LL 8·512·8·16 + LL128
    /// 120·640·8·8 bytes.
    const NCCL_SET: u64 = 4_194_304 + 524_288 + 4_915_200;

    #[test]
    fn nccl_buffers_count_the_communicators_the_run_creates() {
        assert_eq!(NcclSizes::DEFAULT.per_connection(), 9_633_792);
        // dp 8 × cp 2 with prefix reuse: the world (ring 2 + tree 4) and the rank's CP group
        // (ring 2 + the all-to-all's send and receive to its one other rank).
        let llama = plan(&input(8, 2, true));
        assert_eq!(item(&llama, "NCCL buffers"), (6 + 4) * 32 * NCCL_SET);
        // cp 4: the all-to-all reaches three other ranks.
        assert_eq!(
            item(&plan(&input(8, 4, true)), "NCCL buffers"),
            (6 + 2 + 2 * 3) * 32 * NCCL_SET
        );
        // dp 1: the world is the CP group, one communicator.
        assert_eq!(
            item(&plan(&input(1, 4, true)), "NCCL buffers"),
            (6 + 2 * 3) * 32 * NCCL_SET
        );
        // cp 1: the world alone (the DP group is the world).
        assert_eq!(
            item(&plan(&input(16, 1, true)), "NCCL buffers"),
            6 * 32 * NCCL_SET
        );
        // Without prefix reuse nothing re-shards the suffix: no all-to-all.
        let no_reuse = PlanInput {
            prefix_reuse: false,
            ..input(8, 2, true)
        };
        assert_eq!(
            item(&plan(&no_reuse), "NCCL buffers"),
            (6 + 2) * 32 * NCCL_SET
        );
        // Gloo and one rank have none.
        let gloo = PlanInput {
            gloo: true,
            ..input(8, 2, true)
        };
        assert!(plan(&gloo).items.iter().all(|i| i.name != "NCCL buffers"));
        assert!(plan(&input(1, 1, false))
            .items
            .iter()
            .all(|i| i.name != "NCCL buffers"));
        // On top of the peak, beside the 1 GiB + 8% runtime.
        let runtime = (1u64 << 30) + llama.peak_cpu * 2 / 25;
        assert_eq!(llama.total, llama.peak_cpu + runtime + 10 * 32 * NCCL_SET);
    }

    #[test]
    fn nccl_buffers_follow_the_environment() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        let set = NcclSizes::from_vars(vars(&[
            ("NCCL_BUFFSIZE", "8388608"),
            ("NCCL_MAX_NCHANNELS", "16"),
        ]));
        assert_eq!(set.per_connection(), 8_388_608 + 524_288 + 4_915_200);
        let p = plan(&PlanInput {
            nccl: set,
            ..input(8, 2, true)
        });
        assert_eq!(
            item(&p, "NCCL buffers"),
            (6 + 4) * 16 * (8_388_608 + 524_288 + 4_915_200)
        );
        // Unset, not a number or not positive: NCCL's default, as NCCL reads them.
        let d = NcclSizes::from_vars(vars(&[
            ("NCCL_BUFFSIZE", "lots"),
            ("NCCL_LL_BUFFSIZE", "0"),
            ("NCCL_LL128_BUFFSIZE", "-1"),
        ]));
        assert_eq!(d, NcclSizes::DEFAULT);
        let small = NcclSizes::from_vars(vars(&[
            ("NCCL_LL_BUFFSIZE", "65536"),
            ("NCCL_LL128_BUFFSIZE", "131072"),
        ]));
        assert_eq!(small.per_connection(), 4_194_304 + 65_536 + 131_072);
    }

    #[test]
    fn long_ce_adds_its_short_context_pass_where_it_is_the_largest_moment() {
        // Llama-3-8B widths, 65536 tokens, one standard view, no checkpointing, one rank:
        // here the short-context forward is the transient's largest moment.
        let base = PlanInput {
            objective: Objective::Standard,
            checkpoint_layers: false,
            loss_chunk: 1024,
            ..input(1, 1, false)
        };
        let long_ce = PlanInput {
            long_ce: Some((4096, 1024)),
            ..base.clone()
        };
        let (n, d, f, kv, v, hd, b) = (
            65_536u64, 4096u64, 14_336u64, 1024u64, 128_256u64, 128u64, 2u64,
        );
        // The step's transient without LongCE: the loss phase (LM-head gradient, hidden
        // gradients, the head backward's casts of a 1024-row chunk) against one layer's backward
        // (MLP gradients, gradients flowing down, flash attention's dq accumulator and dk/dv).
        let loss_phase =
            v * d * 4 + n * d * b + (2 * 1024 * v * 4 + 1024 * v * b + v * d * (b + 4));
        let layer = 2 * n * f * b + 3 * n * d * b + (n * 32 * (128 + 1) * 4 + 2 * n * kv * b);
        assert!(loss_phase > layer);
        // The short pass: n tokens per forward (⌊65536 / 5119⌋ windows of 5119 at most), one
        // layer's MLP moment per token b·(6d + 2kv + 3f) and the RoPE tables; the int64
        // indices; the rows' fp32 log-probabilities and mask.
        let forward = n * b * (6 * d + 2 * kv + 3 * f) + 2 * n * hd * b;
        let short = 2 * n * 4 + 4 * 8 * n + forward;
        assert_eq!(short, 9_162_981_376);
        let without = plan(&base);
        let with = plan(&long_ce);
        assert_eq!(item(&without, "loss phase"), loss_phase);
        assert_eq!(item(&with, "LongCE short context"), short - loss_phase);
        assert_eq!(with.peak_cpu - without.peak_cpu, 2_059_403_264);
        // Rows too short for a window of their own: no pass.
        let short_rows = PlanInput {
            seq_len: 4096 + 1023,
            ..long_ce.clone()
        };
        assert!(plan(&short_rows)
            .items
            .iter()
            .all(|i| i.name != "LongCE short context"));
    }

    #[test]
    fn long_ce_at_the_papers_qwen_layout_stays_under_the_recomputed_layer() {
        let qwen = ModelConfig::from_file(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../configs/model/qwen3-4b.json"
        )))
        .unwrap();
        let base = PlanInput {
            model: qwen,
            seq_len: 262_144,
            ..input(8, 4, true)
        };
        let with = plan(&PlanInput {
            long_ce: Some((4096, 1024)),
            ..base.clone()
        });
        // 65536 rows per rank: the final norm's graph (2 views × n × d × b) with the pass at
        // its largest, the MLP moment of a 65536-token forward.
        let (n, d, f, kv, hd, b) = (65_536u64, 2560u64, 9728u64, 1024u64, 128u64, 2u64);
        let pass = 2 * 2 * n * d * b
            + 2 * n * 4
            + 4 * 8 * n
            + 8 * 262_144
            + n * b * (6 * d + 2 * kv + 3 * f)
            + 2 * n * hd * b;
        assert!(pass < item(&with, "loss phase"));
        assert_eq!(item(&with, "LongCE short context"), 0);
        assert_eq!(with.total, plan(&base).total);
    }

    #[test]
    fn heldout_evaluation_is_a_phase_of_whole_rows() {
        let (t, d, kv, v, hd, b) = (65_536u64, 4096u64, 1024u64, 128_256u64, 128u64, 2u64);
        // Llama-3-8B at 64K, 16 ranks, 2 held-out micro-batches: one per rank at most.
        let p = PlanInput {
            heldout_batches: 2,
            ..input(8, 2, true)
        };
        let slice = 2 * 8 * t;
        let forward =
            2 * t * d * b + 2 * t * kv * b + t * b * (6 * d + 2 * kv + 3 * 14_336) + 4 * t * hd * b;
        // Both views' hidden states and their gradients, the LM head's fp32 gradient, a
        // 4096-row chunk of four fp32 tensors.
        let loss = 4 * t * d * b + v * d * 4 + 4 * 4096 * v * 4;
        assert!(loss > forward);
        let with = plan(&p);
        assert_eq!(item(&with, "held-out evaluation"), slice + loss);
        assert_eq!(slice + loss, 12_655_263_744);
        // Below the step's forward and backward: the peak does not move.
        assert_eq!(with.peak_cpu, plan(&input(8, 2, true)).peak_cpu);
        // A standard run at dp 1 × cp 16 has a small step, and its evaluation (whole rows, no
        // context parallelism, both views all the same) sets the peak.
        let cp16 = plan(&PlanInput {
            heldout_batches: 2,
            objective: Objective::Standard,
            ..input(1, 16, true)
        });
        let held = cp16.category(Category::Weights)
            + cp16.category(Category::Gradients)
            + cp16.category(Category::OptimizerState);
        assert_eq!(cp16.peak_cpu, held + slice + loss);
        assert!(
            slice + loss
                > cp16.category(Category::SavedActivations) + cp16.category(Category::Transient)
        );
    }

    #[test]
    fn the_paper_configs_fit_with_ten_percent_free() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../");
        for (config, arch) in [
            ("configs/llama3-8b-64k.toml", "configs/model/llama3-8b.json"),
            ("configs/qwen3-4b-256k.toml", "configs/model/qwen3-4b.json"),
        ] {
            let cfg = TrainConfig::resolve(
                Some(&Path::new(root).join(config)),
                crate::config::ConfigOverrides::default(),
            )
            .unwrap();
            let world = (cfg.dp * cfg.cp.max(1)) as u64;
            let base = PlanInput {
                nccl: NcclSizes::DEFAULT,
                ..input_for(&cfg, Some(&Path::new(root).join(arch)), world, 80 << 30).unwrap()
            };
            for (long_ce, heldout) in [
                (None, 0),
                (Some((4096, 1024)), 0),
                (None, 2),
                (Some((4096, 1024)), 2),
            ] {
                let p = plan(&PlanInput {
                    long_ce,
                    heldout_batches: heldout,
                    ..base.clone()
                });
                assert!(
                    p.fits_with_headroom(0.10),
                    "{config} (LongCE {long_ce:?}, held-out {heldout}): {} of {}",
                    gib(p.total),
                    gib(p.gpu_bytes)
                );
            }
        }
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
        // The sharded optimizer keeps an fp32 master of its block even for fp32 models.
        assert_eq!(item(&p, "AdamW state"), (3 * bytes as u64).div_ceil(2));
    }
}
