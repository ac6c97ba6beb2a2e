//! Hugging Face checkpoint directories: `config.json` plus `model.safetensors`, or shards listed in
//! `model.safetensors.index.json`.
//!
//! Loading memory-maps each file, checks every tensor against the model (missing, unexpected, shape)
//! before copying anything, and converts to the requested dtype. Saving writes shards of at most
//! `max_shard_bytes` with an index, the config with our changes (RoPE base, context length, dtype)
//! and the tokenizer files of a source directory, into a temporary sibling directory that is renamed
//! into place at the end, so a crash never leaves a half-written checkpoint under the final name.
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use rsd_common::safe_fs::{self, NamedBy};
use safetensors::tensor::{Dtype, SafeTensors};
use tch::{Kind, Tensor};

use crate::config::ModelConfig;
use crate::error::{io_err, ModelError, Result, TchContext};
use crate::model::{Init, Model, ModelOptions};

/// Files copied from a source checkpoint on save (those that exist).
pub const TOKENIZER_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
];

/// Default shard size limit, as the issue asks (≤ 5 GB per file).
pub const DEFAULT_MAX_SHARD_BYTES: u64 = 5_000_000_000;

fn kind_of(dtype: Dtype) -> Option<Kind> {
    Some(match dtype {
        Dtype::F32 => Kind::Float,
        Dtype::BF16 => Kind::BFloat16,
        Dtype::F16 => Kind::Half,
        Dtype::F64 => Kind::Double,
        _ => return None,
    })
}

fn dtype_of(kind: Kind) -> Option<(Dtype, &'static str)> {
    Some(match kind {
        Kind::Float => (Dtype::F32, "float32"),
        Kind::BFloat16 => (Dtype::BF16, "bfloat16"),
        Kind::Half => (Dtype::F16, "float16"),
        Kind::Double => (Dtype::F64, "float64"),
        _ => return None,
    })
}

/// Tensors present in a checkpoint that belong to no parameter but are harmless: rotary buffers of
/// old exports, and the LM head of tied models (transformers ignores it too).
fn ignorable(name: &str, cfg: &ModelConfig) -> bool {
    name.ends_with("rotary_emb.inv_freq") || (cfg.tie_word_embeddings && name == "lm_head.weight")
}

/// The index of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// The safetensors files of a checkpoint directory, in a stable order.
///
/// The index's `weight_map` names files that are opened; the index may come from anyone, so each
/// name must be a plain relative name that stays inside `dir` (links included) and names a
/// regular file, checked before anything is opened. A refused name is an error naming the index
/// and the field (`weight_map["<tensor>"]`).
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join(INDEX_FILE);
    // `symlink_metadata`: anything at the name (a FIFO, a dangling link) is the index and is
    // refused or reported by the read below, never silently passed over for `model.safetensors`.
    if index.symlink_metadata().is_ok() {
        let bytes = safe_fs::read_regular(&index, safe_fs::MAX_METADATA_BYTES, INDEX_FILE)?;
        let v: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|source| ModelError::Json {
                path: index.clone(),
                source,
            })?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| {
                ModelError::InvalidConfig(format!("{}: no weight_map object", index.display()))
            })?;
        // Each file once, with the first tensor that names it (for the error message).
        let mut files: BTreeMap<&str, &str> = BTreeMap::new();
        for (tensor, file) in map {
            let file = file.as_str().ok_or_else(|| {
                ModelError::InvalidConfig(format!(
                    "{}: field weight_map[{tensor:?}]: expected a file name (a string), found {file}",
                    index.display()
                ))
            })?;
            files.entry(file).or_insert(tensor);
        }
        return files
            .into_iter()
            .map(|(file, tensor)| {
                let named_by = NamedBy::new(&index, format!("weight_map[{tensor:?}]"));
                Ok(safe_fs::confined_file(dir, file, &named_by)?)
            })
            .collect();
    }
    let single = dir.join("model.safetensors");
    if single.symlink_metadata().is_ok() {
        // Checked here too, not only when mapped: callers that read the file otherwise (inspect)
        // must not block on a FIFO either.
        safe_fs::open_regular(&single)?;
        return Ok(vec![single]);
    }
    Err(ModelError::Io {
        path: dir.to_path_buf(),
        source: std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no model.safetensors or model.safetensors.index.json",
        ),
    })
}

struct Mapped {
    path: PathBuf,
    mmap: memmap2::Mmap,
}

fn map_file(path: &Path) -> Result<Mapped> {
    // Only a regular file: a FIFO would block the open, a device cannot be mapped sensibly.
    let file = safe_fs::open_regular(path)?;
    // SAFETY: the mapping is read-only and lives only for the load; a concurrent writer truncating
    // the file is outside what any checkpoint reader can defend against.
    let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err(path))?;
    Ok(Mapped {
        path: path.to_path_buf(),
        mmap,
    })
}

/// What a safetensors file holds, from its header alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSummary {
    /// The dtype of each tensor (safetensors' names: `F32`, `BF16`, …), in no particular order.
    pub dtypes: Vec<String>,
    /// The file's size in bytes.
    pub bytes: u64,
}

/// The header of the safetensors file `path`, checked by the `safetensors` crate (header size,
/// tensor offsets against the file size). The file is memory-mapped, not read: only the header's
/// pages are touched, so summarizing a checkpoint costs no memory for its weights.
pub fn summarize(path: &Path) -> Result<FileSummary> {
    let m = map_file(path)?;
    let (_, meta) = SafeTensors::read_metadata(&m.mmap).map_err(|e| ModelError::Safetensors {
        file: m.path.clone(),
        reason: e.to_string(),
    })?;
    Ok(FileSummary {
        dtypes: meta
            .tensors()
            .values()
            .map(|info| info.dtype.to_string())
            .collect(),
        bytes: m.mmap.len() as u64,
    })
}

fn parse(m: &Mapped) -> Result<SafeTensors<'_>> {
    SafeTensors::deserialize(&m.mmap).map_err(|e| ModelError::Safetensors {
        file: m.path.clone(),
        reason: e.to_string(),
    })
}

impl Model {
    /// Loads an HF checkpoint directory into `options.device` / `options.kind`.
    pub fn load(dir: &Path, options: ModelOptions) -> Result<Self> {
        let config = ModelConfig::from_dir(dir)?;
        let maps: Vec<Mapped> = safetensors_files(dir)?
            .iter()
            .map(|p| map_file(p))
            .collect::<Result<_>>()?;
        let parsed: Vec<SafeTensors<'_>> = maps.iter().map(parse).collect::<Result<_>>()?;
        // 0. The config against the headers before the model is allocated: a config.json that
        // declares far more parameters than the files hold values is not these weights' (or is
        // forged to make rsd allocate what the data does not justify). A few missing tensors are
        // left to the check below, which names them.
        let held: u64 = parsed
            .iter()
            .flat_map(|st| st.iter())
            .map(|(_, v)| {
                v.shape()
                    .iter()
                    .fold(1u64, |n, &d| n.saturating_mul(d as u64))
            })
            .fold(0u64, u64::saturating_add);
        let declared = config.num_parameters().max(0) as u64;
        if declared > held.saturating_mul(2).saturating_add(1 << 20) {
            return Err(ModelError::InvalidConfig(format!(
                "{}: declares {declared} parameters, but the weight files hold {held} values: \
                 the config is not these weights' (nothing was allocated)",
                dir.join("config.json").display()
            )));
        }
        let model = Model::new(config, options, Init::Empty)?;
        let params: HashMap<String, Tensor> = model.named_parameters().into_iter().collect();
        // 1. Check everything before copying anything.
        let found = locate(dir, &params, &maps, &parsed, model.config())?;
        // 2. Copy, converting dtype and device.
        let _guard = tch::no_grad_guard();
        for (name, p) in &params {
            let i = found[name];
            let view = parsed[i]
                .tensor(name)
                .map_err(|e| ModelError::Safetensors {
                    file: maps[i].path.clone(),
                    reason: e.to_string(),
                })?;
            let kind = kind_of(view.dtype()).unwrap_or(Kind::Float);
            let src = Tensor::f_from_data_size(view.data(), &p.size(), kind)
                .and_then(|t| t.f_to_device(options.device))
                .and_then(|t| t.f_to_kind(options.kind))
                .ctx("loading a tensor")?;
            let mut dst = p.shallow_clone();
            dst.f_copy_(&src).ctx("loading a tensor")?;
        }
        Ok(model)
    }
}

/// Checks the tensors of the checkpoint files against the model's parameters (unexpected, shape,
/// dtype, missing) and returns, for each parameter, the index of the file that holds it.
fn locate(
    dir: &Path,
    params: &HashMap<String, Tensor>,
    maps: &[Mapped],
    parsed: &[SafeTensors<'_>],
    cfg: &ModelConfig,
) -> Result<HashMap<String, usize>> {
    let mut found: HashMap<String, usize> = HashMap::new();
    for (i, st) in parsed.iter().enumerate() {
        for (name, view) in st.iter() {
            let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
            let file = || maps[i].path.clone();
            let Some(p) = params.get(name) else {
                if ignorable(name, cfg) {
                    continue;
                }
                return Err(ModelError::UnexpectedTensor {
                    file: file(),
                    name: name.into(),
                    shape,
                });
            };
            if p.size() != shape {
                return Err(ModelError::ShapeMismatch {
                    file: file(),
                    name: name.into(),
                    found: shape,
                    expected: p.size(),
                });
            }
            if kind_of(view.dtype()).is_none() {
                return Err(ModelError::UnsupportedDtype {
                    file: file(),
                    name: name.into(),
                    dtype: view.dtype().to_string(),
                });
            }
            found.insert(name.to_string(), i);
        }
    }
    let mut missing: Vec<(&String, &Tensor)> = params
        .iter()
        .filter(|(n, _)| !found.contains_key(*n))
        .collect();
    missing.sort_by(|a, b| a.0.cmp(b.0));
    if let Some((name, p)) = missing.first() {
        return Err(ModelError::MissingTensor {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            expected: p.size(),
        });
    }
    Ok(found)
}

/// Options for [`Model::save`].
#[derive(Debug, Clone)]
pub struct SaveOptions {
    /// Storage dtype; `None` keeps the model's.
    pub kind: Option<Kind>,
    /// Largest shard in bytes (a single tensor larger than this gets its own shard).
    pub max_shard_bytes: u64,
    /// Copy [`TOKENIZER_FILES`] from this directory.
    pub tokenizer_from: Option<PathBuf>,
    /// Replace an existing directory.
    pub overwrite: bool,
}

impl Default for SaveOptions {
    fn default() -> Self {
        SaveOptions {
            kind: None,
            max_shard_bytes: DEFAULT_MAX_SHARD_BYTES,
            tokenizer_from: None,
            overwrite: false,
        }
    }
}

/// Elements converted at a time while saving (64 MiB of fp32): saving never holds more than this
/// beyond the model itself, whatever the size of a tensor or of a shard.
const SAVE_CHUNK_ELEMS: i64 = 16 << 20;

/// Writes `tensors` as one safetensors file at `path`, stored as `kind` (`dtype`): the header
/// first (the layout follows from the shapes), then each tensor's bytes, converted and copied to
/// the host `chunk_elems` elements at a time. The same file `safetensors::serialize`
/// writes for these tensors in this order, without a second copy of them in memory.
fn write_safetensors_incrementally(
    path: &Path,
    tensors: &[(String, Tensor)],
    kind: Kind,
    dtype: Dtype,
    meta: &HashMap<String, String>,
    chunk_elems: i64,
) -> Result<()> {
    use std::io::Write;
    let width = kind.elt_size_in_bytes();
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!(meta));
    let mut offset = 0usize;
    for (name, t) in tensors {
        let bytes = t.numel() * width;
        header.insert(
            name.clone(),
            serde_json::json!({
                "dtype": dtype,
                "shape": t.size(),
                "data_offsets": [offset, offset + bytes],
            }),
        );
        offset += bytes;
    }
    let mut text = serde_json::to_vec(&header).map_err(|source| ModelError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    // The data starts 8-byte aligned, as safetensors' own writer pads it.
    while text.len() % 8 != 0 {
        text.push(b' ');
    }
    let file = std::fs::File::create(path).map_err(io_err(path))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
    w.write_all(&(text.len() as u64).to_le_bytes())
        .and_then(|()| w.write_all(&text))
        .map_err(io_err(path))?;
    let mut buf: Vec<u8> = Vec::new();
    for (_, t) in tensors {
        let flat = t
            .f_detach()
            .and_then(|t| t.f_reshape([-1]))
            .ctx("saving a tensor")?;
        let n = flat.size()[0];
        let mut at = 0;
        while at < n {
            let len = chunk_elems.max(1).min(n - at);
            let host = flat
                .f_narrow(0, at, len)
                .and_then(|c| c.f_to_kind(kind))
                .and_then(|c| c.f_to_device(tch::Device::Cpu))
                .and_then(|c| c.f_contiguous())
                .ctx("saving a tensor")?;
            buf.resize(len as usize * width, 0);
            host.f_copy_data_u8(&mut buf, len as usize)
                .ctx("saving a tensor")?;
            w.write_all(&buf).map_err(io_err(path))?;
            at += len;
        }
    }
    w.flush().map_err(io_err(path))?;
    Ok(())
}

impl Model {
    /// Saves an HF checkpoint directory (atomically: temp dir, then rename).
    pub fn save(&self, dir: &Path, opts: &SaveOptions) -> Result<()> {
        let kind = opts.kind.unwrap_or(self.options().kind);
        let (dtype, dtype_name) = dtype_of(kind).ok_or_else(|| {
            ModelError::InvalidConfig(format!(
                "cannot save parameters as {} (fp32, bf16, fp16, fp64)",
                crate::kind_name(kind)
            ))
        })?;
        if dir.exists() && !opts.overwrite {
            return Err(ModelError::Exists(dir.to_path_buf()));
        }
        let parent = dir
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).map_err(io_err(parent))?;
        let base = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = parent.join(format!(".{base}.tmp-{}", std::process::id()));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(io_err(&tmp))?;
        }
        std::fs::create_dir(&tmp).map_err(io_err(&tmp))?;
        let result = self.write_into(&tmp, kind, dtype, dtype_name, opts);
        if let Err(e) = result {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        Ok(safe_fs::publish_dir(&tmp, dir)?)
    }

    fn write_into(
        &self,
        tmp: &Path,
        kind: Kind,
        dtype: Dtype,
        dtype_name: &str,
        opts: &SaveOptions,
    ) -> Result<()> {
        // 1. Group parameters into shards in key order; each file is written tensor by tensor
        //    (header first), converting a chunk at a time: no second copy of the model.
        let (shards, total) = plan_shards(self.named_parameters(), kind, opts.max_shard_bytes);
        let n = shards.len();
        let mut weight_map = BTreeMap::new();
        let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
        for (i, shard) in shards.iter().enumerate() {
            let fname = if n == 1 {
                "model.safetensors".to_string()
            } else {
                format!("model-{:05}-of-{:05}.safetensors", i + 1, n)
            };
            let path = tmp.join(&fname);
            write_safetensors_incrementally(&path, shard, kind, dtype, &meta, SAVE_CHUNK_ELEMS)?;
            for (name, _) in shard {
                weight_map.insert(name.clone(), fname.clone());
            }
        }
        if n > 1 {
            let index =
                serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
            write_json(&tmp.join(INDEX_FILE), &index)?;
        }
        // 2. Config with our changes, then tokenizer files.
        let mut cfg = self.config().clone();
        cfg.set_torch_dtype(dtype_name);
        write_json(&tmp.join("config.json"), &cfg.to_hf_json())?;
        if let Some(src) = &opts.tokenizer_from {
            for f in TOKENIZER_FILES {
                let from = src.join(f);
                if from.exists() {
                    // Read as data (a regular file, bounded), so a FIFO planted among the
                    // tokenizer files stops the save with its name instead of blocking it.
                    let bytes = safe_fs::read_regular(&from, safe_fs::MAX_METADATA_BYTES, f)?;
                    std::fs::write(tmp.join(f), bytes).map_err(io_err(&from))?;
                }
            }
        }
        Ok(())
    }
}

/// Parameters grouped into shards of at most `max_bytes` when stored as `kind`, in the given order
/// (a tensor larger than the limit gets a shard of its own), and the total byte count.
fn plan_shards(
    params: Vec<(String, Tensor)>,
    kind: Kind,
    max_bytes: u64,
) -> (Vec<Vec<(String, Tensor)>>, u64) {
    let mut shards: Vec<Vec<(String, Tensor)>> = vec![Vec::new()];
    let mut size = 0u64;
    let mut total = 0u64;
    for (name, t) in params {
        let bytes = (t.numel() * kind.elt_size_in_bytes()) as u64;
        if size > 0 && size + bytes > max_bytes {
            shards.push(Vec::new());
            size = 0;
        }
        size += bytes;
        total += bytes;
        if let Some(s) = shards.last_mut() {
            s.push((name, t));
        }
    }
    (shards, total)
}

fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v).map_err(|source| ModelError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    std::fs::write(path, text + "\n").map_err(io_err(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ForwardArgs;
    use serde_json::json;
    use tch::Device;

    fn cfg(tied: bool) -> ModelConfig {
        ModelConfig::from_hf_json(
            json!({"architectures": ["LlamaForCausalLM"], "vocab_size": 40,
            "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
            "num_attention_heads": 2, "tie_word_embeddings": tied, "custom_field": 7}),
        )
        .unwrap()
    }

    fn hidden(m: &Model) -> Tensor {
        let tok = Tensor::arange(10, (Kind::Int64, Device::Cpu)).view([1, 10]);
        m.forward(&ForwardArgs::new(&tok, &tok)).unwrap().hidden
    }

    #[test]
    fn save_load_roundtrip_sharded_and_bf16() {
        let tmp = tempfile::tempdir().unwrap();
        let m = Model::random(cfg(false), ModelOptions::default(), 0).unwrap();
        let dir = tmp.path().join("ckpt");
        let opts = SaveOptions {
            max_shard_bytes: 4000,
            ..Default::default()
        };
        m.save(&dir, &opts).unwrap();
        assert!(dir.join("model.safetensors.index.json").exists());
        assert!(safetensors_files(&dir).unwrap().len() > 2);
        let cfg_json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(cfg_json["custom_field"], json!(7), "unknown fields survive");
        let back = Model::load(&dir, ModelOptions::default()).unwrap();
        assert_eq!(
            (hidden(&m) - hidden(&back)).abs().max().double_value(&[]),
            0.0
        );
        // Existing directory: refused unless overwrite.
        assert!(matches!(
            m.save(&dir, &SaveOptions::default()),
            Err(ModelError::Exists(_))
        ));
        let opts = SaveOptions {
            kind: Some(Kind::BFloat16),
            overwrite: true,
            ..Default::default()
        };
        m.save(&dir, &opts).unwrap();
        assert!(!dir.join("model.safetensors.index.json").exists());
        let b = Model::load(&dir, ModelOptions::default()).unwrap();
        let d = (hidden(&m) - hidden(&b)).abs().max().double_value(&[]);
        assert!(d > 0.0 && d < 0.1, "{d}");
        let leftovers: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temp dirs left behind");
    }

    #[test]
    fn the_incremental_writer_writes_what_safetensors_reads_back() {
        let tmp = tempfile::tempdir().unwrap();
        let a = Tensor::arange(23, (Kind::Double, Device::Cpu)).reshape([23]) / 7.0;
        let b = Tensor::arange(12, (Kind::Double, Device::Cpu)).reshape([3, 4]) * -0.5;
        let named = vec![("z.b".to_string(), b.shallow_clone()), ("a".to_string(), a)];
        let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
        for (kind, dtype) in [(Kind::Float, Dtype::F32), (Kind::BFloat16, Dtype::BF16)] {
            let path = tmp.path().join("t.safetensors");
            // Chunks of 5 elements: tensors cut mid-row and at their ends.
            write_safetensors_incrementally(&path, &named, kind, dtype, &meta, 5).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            let st = SafeTensors::deserialize(&bytes).unwrap();
            assert_eq!(st.len(), 2);
            for (name, t) in &named {
                let view = st.tensor(name).unwrap();
                assert_eq!(view.dtype(), dtype);
                let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
                assert_eq!(shape, t.size());
                let back = Tensor::from_data_size(view.data(), &shape, kind);
                let want = t.to_kind(kind);
                assert!(back.equal(&want), "{name} as {kind:?}");
            }
        }
    }

    #[test]
    fn bad_checkpoints_name_the_problem() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("c");
        Model::random(cfg(false), ModelOptions::default(), 0)
            .unwrap()
            .save(&dir, &SaveOptions::default())
            .unwrap();
        // A config with a different MLP width: shape mismatch naming the tensor.
        let other = tmp.path().join("o");
        std::fs::create_dir(&other).unwrap();
        std::fs::copy(
            dir.join("model.safetensors"),
            other.join("model.safetensors"),
        )
        .unwrap();
        let mut c = cfg(false).to_hf_json();
        c["intermediate_size"] = json!(20);
        std::fs::write(other.join("config.json"), c.to_string()).unwrap();
        let e = Model::load(&other, ModelOptions::default()).unwrap_err();
        assert!(
            matches!(&e, ModelError::ShapeMismatch { name, found, expected, .. }
                if name.contains(".mlp.") && found != expected),
            "{e}"
        );
        // Two layers in the file, three in the config: missing tensor.
        c["intermediate_size"] = json!(24);
        c["num_hidden_layers"] = json!(3);
        std::fs::write(other.join("config.json"), c.to_string()).unwrap();
        let e = Model::load(&other, ModelOptions::default()).unwrap_err();
        assert!(
            e.to_string().contains("missing tensor model.layers.2."),
            "{e}"
        );
        // One layer: unexpected tensor.
        c["num_hidden_layers"] = json!(1);
        std::fs::write(other.join("config.json"), c.to_string()).unwrap();
        let e = Model::load(&other, ModelOptions::default()).unwrap_err();
        assert!(
            e.to_string().contains("unexpected tensor model.layers.1."),
            "{e}"
        );
        // A tied config ignores the file's lm_head.weight, as transformers does.
        c["tie_word_embeddings"] = json!(true);
        c["num_hidden_layers"] = json!(2);
        std::fs::write(other.join("config.json"), c.to_string()).unwrap();
        let tied = Model::load(&other, ModelOptions::default()).unwrap();
        assert!(tied
            .named_parameters()
            .iter()
            .all(|(n, _)| n != "lm_head.weight"));
        c["tie_word_embeddings"] = json!(false);
        // Truncated file.
        c["num_hidden_layers"] = json!(2);
        std::fs::write(other.join("config.json"), c.to_string()).unwrap();
        let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
        std::fs::write(other.join("model.safetensors"), &bytes[..bytes.len() - 100]).unwrap();
        let e = Model::load(&other, ModelOptions::default()).unwrap_err();
        assert!(matches!(e, ModelError::Safetensors { .. }), "{e}");
    }
}
