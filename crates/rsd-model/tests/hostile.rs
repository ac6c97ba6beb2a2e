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
    ModelConfig::from_hf_json(json!({"architectures": ["LlamaForCausalLM"], "vocab_size": 40,
        "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
        "num_attention_heads": 2}))
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
    assert_eq!(std::fs::read(&outside).unwrap(), before, "outside untouched");
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
