//! The traffic a training step logs (`comm_bytes` in metrics.jsonl, counted by rsd-dist on
//! every group, the backward collectives inside autograd included) equals the analytic formula
//! `rsd_train::comm::expected_step_bytes` exactly, for data parallelism, context parallelism,
//! both, the sharded optimizer, `standard` and `rsd`. Each case runs the `rsd-train` binary as
//! 2 or 4 local ranks (Gloo) for two steps of a tiny model on synthetic shards.
use std::path::Path;
use std::process::Command;

use rsd_model::{Model, ModelConfig, ModelOptions};
use rsd_train::comm::{expected_step_bytes, SecondViewRows, Sharded, StepLayout};
use tch::{Device, Kind};

const VOCAB: u64 = 512;
const SEQ: u32 = 32;

fn model_json() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": VOCAB,
        "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "tie_word_embeddings": false, "initializer_range": 0.02
    })
}

struct Case {
    dp: usize,
    cp: usize,
    objective: &'static str,
    sharded: bool,
    /// `grad_reduce`: micro-batch or step.
    grad_reduce: &'static str,
}

/// Runs `case` for 2 steps and returns each step's logged `comm_bytes`.
fn measured(dir: &Path, shards: &Path, init: &Path, case: &Case) -> Vec<u64> {
    let out = dir.join(format!(
        "run-{}x{}-{}-{}-{}",
        case.dp, case.cp, case.objective, case.sharded, case.grad_reduce
    ));
    let nproc = (case.dp * case.cp).to_string();
    let status = Command::new(env!("CARGO_BIN_EXE_rsd-train"))
        .args(["--device", "cpu", "--dtype", "fp32", "--threads", "1"])
        .args(["--progress", "false", "--save-every", "0", "--steps", "2"])
        .args([
            "--micro-batch",
            "1",
            "--tokens-per-step",
            &(4 * SEQ).to_string(),
        ])
        .args(["--objective", case.objective, "--perturb", "skip"])
        // Every row's view changes (s ≥ 1), and the perturbed pass runs whole rows.
        .args(["--fixed-split", "5,40", "--prefix-reuse", "false"])
        .args([
            "--shard-optimizer",
            if case.sharded { "true" } else { "false" },
        ])
        .args(["--grad-bucket-mb", "1", "--grad-reduce", case.grad_reduce])
        .args(["--dp", &case.dp.to_string(), "--cp", &case.cp.to_string()])
        .args(["--nproc", &nproc])
        .arg("--shards")
        .arg(shards)
        .arg("--init")
        .arg(init)
        .arg("--out")
        .arg(&out)
        .status()
        .expect("running rsd-train");
    assert!(status.success(), "rsd-train failed for {}", out.display());
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["comm_bytes"].as_u64().unwrap()
        })
        .collect()
}

#[test]
fn logged_step_traffic_is_the_formula() {
    let dir = tempfile::tempdir().unwrap();
    let shards = dir.path().join("shards");
    let spec = rsd_loader::synth::SynthSpec {
        samples: 64,
        seq_len: SEQ,
        vocab: VOCAB,
        ..Default::default()
    };
    rsd_loader::synth::write(&shards, &spec).unwrap();
    let init = dir.path().join("model.json");
    std::fs::write(&init, model_json().to_string()).unwrap();
    let config = ModelConfig::from_hf_json(model_json()).unwrap();
    let model = Model::random(
        config,
        ModelOptions {
            device: Device::Cpu,
            kind: Kind::Float,
        },
        0,
    )
    .unwrap();
    let param_sizes: Vec<usize> = model
        .named_parameters()
        .iter()
        .map(|(_, p)| p.numel())
        .collect();
    let cases = [
        (2, 1, "standard", false, "micro-batch"),
        (2, 1, "rsd", false, "micro-batch"),
        (2, 1, "rsd", true, "micro-batch"),
        (2, 1, "standard", true, "micro-batch"),
        (2, 1, "standard", true, "step"),
        (1, 2, "standard", false, "micro-batch"),
        (1, 2, "rsd", false, "micro-batch"),
        (1, 2, "rsd", true, "micro-batch"),
        (2, 2, "rsd", true, "micro-batch"),
        (2, 2, "rsd", true, "step"),
    ];
    for (dp, cp, objective, sharded, grad_reduce) in cases {
        let case = Case {
            dp,
            cp,
            objective,
            sharded,
            grad_reduce,
        };
        let got = measured(dir.path(), &shards, &init, &case);
        let rows = 1;
        let layout = StepLayout {
            param_sizes: param_sizes.clone(),
            param_bytes: 4,
            bucket_elems: (1 << 20) / 4,
            dp,
            cp,
            // 4 one-row micro-batches per step, shared by the data-parallel ranks.
            local_micro_batches: 4 / dp,
            rows,
            seq_len: SEQ as usize,
            layers: 2,
            kv_width: 2 * 8,
            second_view: if objective == "rsd" {
                SecondViewRows::Whole(rows)
            } else {
                SecondViewRows::None
            },
            long_ce: false,
            checkpoint_layers: false,
            sharded: sharded.then_some(Sharded {
                state_bytes: 4,
                reduce_scatters: if grad_reduce == "step" { 1 } else { 4 / dp },
            }),
        };
        let want = expected_step_bytes(&layout);
        assert!(want > 0);
        assert_eq!(
            got,
            vec![want, want],
            "dp {dp} × cp {cp}, {objective}, sharded {sharded}, grad_reduce {grad_reduce}"
        );
    }
}
