//! Checkpoint directories, `.npy` files and configs written by strangers: every hostile file gets
//! a clear error naming the file (and the field), never a read outside the directory, a hang on a
//! FIFO, or an allocation the file's header asks for. See docs/UNTRUSTED.md.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use rsd_common::safe_fs::FsError;
use rsd_model::checkpoint::{safetensors_files, INDEX_FILE};
use rsd_model::{Model, ModelConfig, ModelError, ModelOptions, SaveOptions};
use serde_json::{json, Value};

/// Runs `f` on a thread and fails the test if it does not answer in `secs`: a read that blocks
/// on a FIFO would otherwise hang the whole test run.
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .expect("no answer in time: the read blocked")
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

fn tiny_config() -> ModelConfig {
    ModelConfig::from_hf_json(
        json!({"architectures": ["LlamaForCausalLM"], "vocab_size": 40,
        "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
        "num_attention_heads": 2}),
    )
    .unwrap()
}

/// A saved tiny model under `root/name`; sharded (with an index) when `sharded`.
fn saved(root: &Path, name: &str, sharded: bool) -> PathBuf {
    let dir = root.join(name);
    let opts = SaveOptions {
        max_shard_bytes: if sharded { 4000 } else { u64::MAX },
        ..Default::default()
    };
    Model::random(tiny_config(), ModelOptions::default(), 0)
        .unwrap()
        .save(&dir, &opts)
        .unwrap();
    assert_eq!(dir.join(INDEX_FILE).exists(), sharded);
    dir
}

fn read_index(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join(INDEX_FILE)).unwrap()).unwrap()
}

/// Points the index's entry for `tensor` at `file`.
fn point(dir: &Path, tensor: &str, file: &str) {
    let mut index = read_index(dir);
    index["weight_map"][tensor] = json!(file);
    std::fs::write(dir.join(INDEX_FILE), index.to_string()).unwrap();
}

const TENSOR: &str = "model.embed_tokens.weight";

#[test]
fn a_weight_map_name_that_leaves_the_directory_is_refused_naming_index_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = saved(tmp.path(), "ckpt", true);
    // A valid safetensors file outside the checkpoint: a loader that followed the index would
    // open it without complaint.
    let outside_dir = saved(tmp.path(), "outside", false);
    let outside = outside_dir.join("model.safetensors");
    let before = std::fs::read(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("escape.safetensors")).unwrap();
    let absolute = outside.to_str().unwrap().to_string();
    let cases = [
        ("../outside/model.safetensors", "`..`"),
        (absolute.as_str(), "absolute"),
        ("escape.safetensors", "outside the directory"),
        ("", "empty"),
    ];
    for (name, why) in cases {
        point(&dir, TENSOR, name);
        for err in [
            safetensors_files(&dir).expect_err("the index must be refused"),
            Model::load(&dir, ModelOptions::default()).expect_err("loading must be refused"),
        ] {
            let text = err.to_string();
            assert!(
                matches!(err, ModelError::File(FsError::UnsafeName(_))),
                "{text}"
            );
            assert!(
                text.contains(&dir.join(INDEX_FILE).display().to_string())
                    && text.contains(&format!("weight_map[\"{TENSOR}\"]"))
                    && text.contains(why),
                "{name}: {text}"
            );
        }
    }
    assert_eq!(
        std::fs::read(&outside).unwrap(),
        before,
        "outside untouched"
    );
}

#[test]
fn a_weight_map_entry_that_is_not_a_string_is_refused_naming_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = saved(tmp.path(), "ckpt", true);
    let mut index = read_index(&dir);
    index["weight_map"][TENSOR] = json!(7);
    std::fs::write(dir.join(INDEX_FILE), index.to_string()).unwrap();
    let text = safetensors_files(&dir).unwrap_err().to_string();
    assert!(
        text.contains(INDEX_FILE) && text.contains(&format!("weight_map[\"{TENSOR}\"]")),
        "{text}"
    );
}

#[test]
fn a_link_inside_the_checkpoint_directory_is_fine() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = saved(tmp.path(), "ckpt", true);
    let first = read_index(&dir)["weight_map"][TENSOR]
        .as_str()
        .unwrap()
        .to_string();
    std::fs::create_dir(dir.join("sub")).unwrap();
    std::fs::rename(dir.join(&first), dir.join("sub").join(&first)).unwrap();
    std::os::unix::fs::symlink(Path::new("sub").join(&first), dir.join(&first)).unwrap();
    Model::load(&dir, ModelOptions::default()).expect("a link that stays inside is followed");
}

#[test]
fn fifos_in_a_checkpoint_are_refused_not_waited_on() {
    let tmp = tempfile::tempdir().unwrap();
    // A shard the index names.
    let dir = saved(tmp.path(), "sharded", true);
    mkfifo(&dir.join("fifo.safetensors"));
    point(&dir, TENSOR, "fifo.safetensors");
    // The index itself, config.json, and a single model.safetensors.
    let index_fifo = saved(tmp.path(), "index", true);
    std::fs::remove_file(index_fifo.join(INDEX_FILE)).unwrap();
    mkfifo(&index_fifo.join(INDEX_FILE));
    let config_fifo = saved(tmp.path(), "config", false);
    std::fs::remove_file(config_fifo.join("config.json")).unwrap();
    mkfifo(&config_fifo.join("config.json"));
    let single_fifo = saved(tmp.path(), "single", false);
    std::fs::remove_file(single_fifo.join("model.safetensors")).unwrap();
    mkfifo(&single_fifo.join("model.safetensors"));
    let cases = [
        (dir, "fifo.safetensors"),
        (index_fifo, INDEX_FILE),
        (config_fifo, "config.json"),
        (single_fifo, "model.safetensors"),
    ];
    for (dir, file) in cases {
        let d = dir.clone();
        let err = within(20, move || {
            Model::load(&d, ModelOptions::default())
                .err()
                .map(|e| e.to_string())
        })
        .expect("a FIFO must be refused");
        assert!(
            err.contains("FIFO") && err.contains(&dir.join(file).display().to_string()),
            "{err}"
        );
        if file != "config.json" {
            let d = dir.clone();
            let err = within(20, move || {
                safetensors_files(&d).err().map(|e| e.to_string())
            })
            .expect("a FIFO must be refused");
            assert!(err.contains("FIFO"), "{err}");
        }
    }
}

#[test]
fn summarize_reads_the_header_of_a_regular_file_only() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = saved(tmp.path(), "ckpt", false);
    let file = dir.join("model.safetensors");
    let summary = rsd_model::checkpoint::summarize(&file).unwrap();
    let params = Model::random(tiny_config(), ModelOptions::default(), 0)
        .unwrap()
        .named_parameters()
        .len();
    assert_eq!(summary.dtypes, vec!["F32".to_string(); params]);
    assert_eq!(summary.bytes, std::fs::metadata(&file).unwrap().len());
    std::fs::remove_file(&file).unwrap();
    mkfifo(&file);
    let err = within(20, move || {
        rsd_model::checkpoint::summarize(&file)
            .err()
            .map(|e| e.to_string())
    })
    .expect("a FIFO must be refused");
    assert!(err.contains("FIFO"), "{err}");
}

// ---- .npy files ----

/// The bytes `np.save` writes for an array with header dict `dict` and raw `data`: format
/// `version` (1 → 2-byte header length, 2 or 3 → 4-byte), header padded to a multiple of 64.
fn npy_bytes(version: u8, dict: &str, data: &[u8]) -> Vec<u8> {
    let len_bytes = if version == 1 { 2 } else { 4 };
    let mut header = dict.as_bytes().to_vec();
    let total = 8 + len_bytes + header.len() + 1;
    header.resize(header.len() + (64 - total % 64) % 64, b' ');
    header.push(b'\n');
    let mut out = b"\x93NUMPY".to_vec();
    out.extend([version, 0]);
    if version == 1 {
        out.extend((header.len() as u16).to_le_bytes());
    } else {
        out.extend((header.len() as u32).to_le_bytes());
    }
    out.extend(header);
    out.extend(data);
    out
}

fn dict(descr: &str, shape: &str) -> String {
    format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}")
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn npy_files_as_numpy_writes_them_read_back_exactly() {
    use tch::Kind;
    let tmp = tempfile::tempdir().unwrap();
    let ids: Vec<i64> = vec![0, 1, -2, 1 << 40, i64::MAX, 7];
    let data: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
    for version in [1, 2, 3] {
        let path = write(
            tmp.path(),
            "ids.npy",
            &npy_bytes(version, &dict("<i8", "(2, 3)"), &data),
        );
        let t = rsd_model::npy::read(&path).unwrap();
        assert_eq!((t.kind(), t.size()), (Kind::Int64, vec![2, 3]));
        assert_eq!(Vec::<i64>::try_from(t.reshape([-1])).unwrap(), ids);
    }
    let small: Vec<i32> = vec![5, -6, 7];
    let data: Vec<u8> = small.iter().flat_map(|v| v.to_le_bytes()).collect();
    let path = write(
        tmp.path(),
        "i4.npy",
        &npy_bytes(1, &dict("<i4", "(3,)"), &data),
    );
    let t = rsd_model::npy::read(&path).unwrap();
    assert_eq!((t.kind(), t.size()), (Kind::Int, vec![3]));
    assert_eq!(Vec::<i32>::try_from(t).unwrap(), small);
    let floats: Vec<f32> = vec![0.5, -1.25];
    let data: Vec<u8> = floats.iter().flat_map(|v| v.to_le_bytes()).collect();
    let path = write(
        tmp.path(),
        "f4.npy",
        &npy_bytes(1, &dict("<f4", "(1, 2)"), &data),
    );
    let t = rsd_model::npy::read(&path).unwrap();
    assert_eq!((t.kind(), t.size()), (Kind::Float, vec![1, 2]));
    assert_eq!(Vec::<f32>::try_from(t.reshape([-1])).unwrap(), floats);
    let path = write(
        tmp.path(),
        "u1.npy",
        &npy_bytes(1, &dict("|u1", "(0, 4)"), &[]),
    );
    let t = rsd_model::npy::read(&path).unwrap();
    assert_eq!((t.kind(), t.size()), (Kind::Uint8, vec![0, 4]));
}

#[test]
fn npy_files_that_do_not_hold_what_they_declare_are_refused_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    // Short: 2×3 int64 declared, 5 elements present.
    let path = write(
        tmp.path(),
        "short.npy",
        &npy_bytes(1, &dict("<i8", "(2, 3)"), &[0; 40]),
    );
    let e = rsd_model::npy::read(&path).unwrap_err().to_string();
    assert!(
        e.contains(&path.display().to_string()) && e.contains("48 bytes") && e.contains("holds 40"),
        "{e}"
    );
    // Huge: 2^40 int64 declared over 8 bytes of data. Allocating what the header asks (8 TiB)
    // would abort the test; the reader answers from the header and the file size alone.
    let path = write(
        tmp.path(),
        "huge.npy",
        &npy_bytes(1, &dict("<i8", "(1099511627776,)"), &[0; 8]),
    );
    let e = rsd_model::npy::read(&path).unwrap_err().to_string();
    assert!(
        e.contains("huge.npy") && e.contains("8796093022208 bytes"),
        "{e}"
    );
    // Fortran order.
    let fortran = "{'descr': '<i8', 'fortran_order': True, 'shape': (2, 1), }";
    let path = write(tmp.path(), "f.npy", &npy_bytes(1, fortran, &[0; 16]));
    let e = rsd_model::npy::read(&path).unwrap_err().to_string();
    assert!(e.contains("f.npy") && e.contains("Fortran order"), "{e}");
    // Big-endian.
    let path = write(
        tmp.path(),
        "be.npy",
        &npy_bytes(1, &dict(">i8", "(1,)"), &[0; 8]),
    );
    let e = rsd_model::npy::read(&path).unwrap_err().to_string();
    assert!(
        e.contains("be.npy") && e.contains("\">i8\" is not supported"),
        "{e}"
    );
    // A FIFO is refused, not waited on.
    let fifo = tmp.path().join("fifo.npy");
    mkfifo(&fifo);
    let f = fifo.clone();
    let e = within(20, move || {
        rsd_model::npy::read(&f).err().map(|e| e.to_string())
    })
    .expect("a FIFO must be refused");
    assert!(e.contains("FIFO") && e.contains("fifo.npy"), "{e}");
}

mod npy_properties {
    use super::*;
    use proptest::prelude::*;

    /// Reads `bytes` as a file: an error or a tensor exactly the size of the data, never a panic.
    fn read_bytes(bytes: &[u8]) {
        let tmp = tempfile::tempdir().unwrap();
        let path = write(tmp.path(), "p.npy", bytes);
        if let Ok(t) = rsd_model::npy::read(&path) {
            let data = t.numel() * t.kind().elt_size_in_bytes();
            assert!(data <= bytes.len(), "a tensor larger than the file");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn any_bytes_are_an_error_or_a_tensor(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            read_bytes(&bytes);
        }

        #[test]
        fn any_header_text_is_an_error_or_a_tensor(text in "[{}()',: a-z_0-9<|TrueFals]{0,120}", data in proptest::collection::vec(any::<u8>(), 0..64)) {
            read_bytes(&npy_bytes(1, &text, &data));
        }

        #[test]
        fn damaged_files_are_an_error_or_a_tensor(
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
            cut in any::<prop::sample::Index>(),
            truncate in any::<bool>(),
        ) {
            let mut bytes = npy_bytes(1, &dict("<i4", "(2, 3)"), &[1; 24]);
            for (at, b) in edits {
                let i = at.index(bytes.len());
                bytes[i] = b;
            }
            if truncate {
                bytes.truncate(cut.index(bytes.len() + 1));
            }
            read_bytes(&bytes);
        }
    }
}

#[test]
fn a_config_inflated_past_its_weights_is_refused_before_anything_is_allocated() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = saved(tmp.path(), "ckpt", false);
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    // Within the config bounds, but ~40 G parameters over files of a few KB: building the model
    // first would ask for 160 GB.
    config["num_hidden_layers"] = json!(1000);
    config["hidden_size"] = json!(2048);
    config["intermediate_size"] = json!(8192);
    config["num_attention_heads"] = json!(16);
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    let Err(err) = Model::load(&dir, ModelOptions::default()) else {
        panic!("an inflated config must be refused");
    };
    let err = err.to_string();
    assert!(
        err.contains(&path.display().to_string())
            && err.contains("parameters")
            && err.contains("nothing was allocated"),
        "{err}"
    );
}

/// A config within every bound (each key's and the 2^41 parameters') that declares a model no
/// machine holds: about 2^40 parameters, 2 TiB in bf16.
fn huge_config() -> ModelConfig {
    ModelConfig::from_hf_json(json!({"architectures": ["LlamaForCausalLM"],
        "vocab_size": 1 << 20, "hidden_size": 1 << 19, "intermediate_size": 1 << 10,
        "num_hidden_layers": 4, "num_attention_heads": 1 << 9, "num_key_value_heads": 1 << 5,
        "head_dim": 64}))
    .unwrap()
}

#[test]
fn a_model_larger_than_memory_is_refused_naming_the_config_and_the_bytes() {
    let cfg = huge_config();
    let params = cfg.num_parameters();
    assert!(params > 1 << 40, "{params}");
    let path = Path::new("/models/huge/config.json");
    let available = rsd_model::alloc::available_bytes();
    assert!(available.is_some(), "this machine reports its memory");
    let err = cfg
        .check_fits_in_memory(path, "bf16", 2, available)
        .unwrap_err()
        .to_string();
    let expected = format!("/models/huge/config.json: declares {params} parameters (");
    assert!(err.contains(&expected), "{err}");
    assert!(
        err.contains("GiB in bf16") && err.contains("this machine has available"),
        "{err}"
    );
    // The count in bytes is exact: parameters × 2 plus the two fp32 copies of the embedding.
    let needed = cfg.init_bytes(2).unwrap();
    assert_eq!(needed, params as u64 * 2 + (1u64 << 39) * 8);
    // At exactly the bytes it needs it fits; one byte less does not.
    assert!(cfg
        .check_fits_in_memory(path, "bf16", 2, Some(needed))
        .is_ok());
    let err = cfg
        .check_fits_in_memory(path, "bf16", 2, Some(needed - 1))
        .unwrap_err()
        .to_string();
    assert!(err.contains(&format!("({} bytes)", needed - 1)), "{err}");
    // Unknown memory (not Linux): not checked.
    assert!(cfg.check_fits_in_memory(path, "bf16", 2, None).is_ok());
    // A tiny model fits on any machine that runs the tests.
    assert!(tiny_config()
        .check_fits_in_memory(path, "fp32", 4, available)
        .is_ok());
}

mod config_and_header_properties {
    use super::*;
    use proptest::prelude::*;

    fn value() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            (-1e30f64..1e30).prop_map(Value::from),
            "[a-zA-Z_]{0,12}".prop_map(Value::from),
            prop::sample::select(vec![0i64, 1, 2, 4, 16, 1 << 20, (1 << 20) + 1, 1 << 40])
                .prop_map(Value::from),
            // Degenerate reals: what gives NaN or ±inf once raised to a power or multiplied.
            prop::sample::select(vec![1e-300, 5e-324, 1e300, f64::MAX, -1e-300, 1e-7, 0.5])
                .prop_map(Value::from),
        ]
    }

    /// A parsed config's RoPE tables: finite, non-negative frequencies and a finite scaling, or an
    /// error naming config.json (never NaN or ±inf passed on to every cos/sin). A frequency too
    /// small for fp32 is 0: that pair is not rotated, the limit of a huge rope_theta, as
    /// transformers computes it too.
    fn rope_is_finite_or_refused(c: &ModelConfig) -> Result<(), TestCaseError> {
        match rsd_model::rope::Rope::new(c, tch::Device::Cpu) {
            Ok(rope) => {
                let f = rope.inv_freq();
                prop_assert!(f.isfinite().all().int64_value(&[]) == 1, "{c:?}");
                prop_assert!(f.ge(0.0).all().int64_value(&[]) == 1, "{c:?}");
                prop_assert!(rope.attention_scaling().is_finite(), "{c:?}");
            }
            Err(e) => prop_assert!(e.to_string().contains("config.json"), "{e}"),
        }
        Ok(())
    }

    /// `rope_scaling` as an object of random fields, or as something that is not an object.
    fn scaling() -> impl Strategy<Value = Value> {
        prop_oneof![
            ("[a-z0-9]{0,8}", value(), value()).prop_map(|(kind, factor, original)| json!({
                "rope_type": kind, "factor": factor,
                "original_max_position_embeddings": original})),
            (value(), value()).prop_map(|(kind, factor)| json!({"type": kind, "factor": factor})),
            value(),
            Just(json!(["yarn", 4])),
        ]
    }

    const KEYS: &[&str] = &[
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "rms_norm_eps",
        "rope_theta",
        "tie_word_embeddings",
        "initializer_range",
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any values for the keys a model is built from: an error, or a config whose parameter
        /// count is a number (never a panic, never an overflow).
        #[test]
        fn any_config_json_is_an_error_or_a_bounded_config(
            values in proptest::collection::vec(value(), KEYS.len()),
            family in prop::sample::select(vec!["LlamaForCausalLM", "Qwen3ForCausalLM", "Other"]),
            scaling in prop::option::of(scaling()),
        ) {
            let mut config = json!({"architectures": [family]});
            for (k, v) in KEYS.iter().zip(values) {
                config[*k] = v;
            }
            if let Some(scaling) = scaling {
                config["rope_scaling"] = scaling;
            }
            if let Ok(c) = ModelConfig::from_hf_json(config) {
                rope_is_finite_or_refused(&c)?;
                prop_assert!(c.num_parameters() > 0 && c.num_parameters() <= 1 << 41);
                // The bytes to create it are a number (bounded configs never overflow u64), and
                // the memory check answers without allocating.
                let needed = c.init_bytes(8);
                prop_assert!(needed.is_some());
                let fits = c.check_fits_in_memory(Path::new("c.json"), "fp64", 8, Some(1 << 34));
                prop_assert_eq!(fits.is_ok(), needed.is_some_and(|n| n <= 1 << 34));
            }
        }

        /// A valid small model's RoPE keys (`rope_theta`, `head_dim`, `max_position_embeddings`,
        /// `rope_scaling`) at random, degenerate reals among them: refused at load naming
        /// config.json, or RoPE tables of finite, non-negative frequencies and a finite scaling.
        #[test]
        fn random_rope_keys_are_refused_or_give_finite_tables(
            theta in value(),
            head_dim in prop::option::of(prop::sample::select(vec![2i64, 4, 8, 16, 3, 0, -2])),
            max_pos in prop::option::of(value()),
            scaling in prop::option::of(scaling()),
        ) {
            let mut config = json!({"architectures": ["LlamaForCausalLM"], "vocab_size": 40,
                "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
                "num_attention_heads": 2, "rope_theta": theta});
            if let Some(d) = head_dim {
                config["head_dim"] = json!(d);
            }
            if let Some(m) = max_pos {
                config["max_position_embeddings"] = m;
            }
            if let Some(s) = scaling {
                config["rope_scaling"] = s;
            }
            if let Ok(c) = ModelConfig::from_hf_json(config) {
                rope_is_finite_or_refused(&c)?;
            }
        }

        /// A safetensors file damaged anywhere: `summarize` and `Model::load` answer with an error
        /// or (undamaged tensors) a model, never a panic.
        #[test]
        fn damaged_safetensors_are_an_error_or_the_model(
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
            in_header in any::<bool>(),
            cut in prop::option::of(any::<prop::sample::Index>()),
        ) {
            let tmp = tempfile::tempdir().unwrap();
            let dir = saved(tmp.path(), "ckpt", false);
            let file = dir.join("model.safetensors");
            let mut bytes = std::fs::read(&file).unwrap();
            let header = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            for (at, b) in edits {
                let i = if in_header { at.index(header) } else { at.index(bytes.len()) };
                bytes[i] = b;
            }
            if let Some(cut) = cut {
                bytes.truncate(cut.index(bytes.len() + 1));
            }
            std::fs::write(&file, &bytes).unwrap();
            let _ = rsd_model::checkpoint::summarize(&file);
            let _ = Model::load(&dir, ModelOptions::default());
        }
    }
}
