//! `rsd-model init` of a config that declares a model larger than memory: a clear error naming
//! the config file and the bytes, not an aborted process. See docs/UNTRUSTED.md.
use std::process::Command;

#[test]
fn init_refuses_a_model_larger_than_memory_before_allocating() {
    let dir = std::env::temp_dir().join(format!("rsd-model-init-huge-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("config.json");
    // Every key within its documented bound, and the parameters within 2^41: about 2^40
    // parameters (2 TiB in bf16).
    std::fs::write(
        &config,
        r#"{"architectures": ["LlamaForCausalLM"], "vocab_size": 1048576,
            "hidden_size": 524288, "intermediate_size": 1024, "num_hidden_layers": 4,
            "num_attention_heads": 512, "num_key_value_heads": 32, "head_dim": 64}"#,
    )
    .unwrap();
    let out = dir.join("out");
    let started = std::time::Instant::now();
    let run = Command::new(env!("CARGO_BIN_EXE_rsd-model"))
        .args(["init", "--dtype", "bf16", "--config"])
        .arg(&config)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr).to_string();
    std::fs::remove_dir_all(&dir).ok();
    // An abort (allocation failure) is a signal, not exit status 1.
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("{}: declares ", config.display()))
            && stderr.contains("GiB in bf16")
            && stderr.contains("this machine has available"),
        "{stderr}"
    );
    assert!(started.elapsed().as_secs() < 30);
    assert!(!out.exists());
}
