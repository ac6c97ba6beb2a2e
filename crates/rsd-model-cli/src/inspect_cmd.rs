//! `rsd-model inspect`: what a checkpoint directory holds.
use std::path::Path;

use anyhow::Result;
use rsd_model::{checkpoint::safetensors_files, ModelConfig};

pub fn inspect(dir: &Path) -> Result<()> {
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
