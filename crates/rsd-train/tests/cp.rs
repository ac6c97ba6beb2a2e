//! Context parallelism against one process, over Gloo on 127.0.0.1: a test launches 2 copies of
//! this test binary, each running one `rank_*` function (ignored in normal runs) as one rank with
//! torchrun's variables set. Each rank computes the single-process forward and backward itself,
//! then its zigzag share with K/V gathered from the other rank, and exits non-zero on a mismatch.
use std::time::Duration;

use rsd_dist::testing::{launch_ranks as launch, rank_world};
use rsd_dist::ReduceOp;
use rsd_model::{ContextChunks, ForwardArgs, Model, ModelConfig, ModelOptions};
use rsd_train::cp::ContextParallel;
use tch::{Device, Kind, Tensor};

/// A tiny config of the repository with a 512-token vocabulary.
fn tiny(file: &str) -> ModelConfig {
    let path = format!("{}/../../configs/model/{file}", env!("CARGO_MANIFEST_DIR"));
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["vocab_size"] = 512.into();
    ModelConfig::from_hf_json(v).unwrap()
}

/// Gradients of every parameter, detached copies.
fn grads(model: &Model) -> Vec<(String, Tensor)> {
    model
        .named_parameters()
        .into_iter()
        .map(|(n, p)| (n, p.grad().detach().copy()))
        .collect()
}

fn zero_grads(model: &Model) {
    for (_, p) in model.named_parameters() {
        let mut g = p.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
}

/// Largest |a − b| relative to max |b|.
fn rel(a: &Tensor, b: &Tensor) -> f64 {
    let scale = b.abs().max().double_value(&[]).max(1e-300);
    (a - b).abs().max().double_value(&[]) / scale
}

#[test]
fn context_parallel_forward_and_backward_equal_one_process() {
    launch("rank_cp_model", 2);
}

#[test]
#[ignore = "one rank of context_parallel_forward_and_backward_equal_one_process"]
fn rank_cp_model() {
    let Some(group) = rank_world("rank_cp_model", Duration::from_secs(30)) else {
        return;
    };
    let cp = ContextParallel::new(std::rc::Rc::new(group));
    // Documents crossing the chunk boundaries (chunks of 6 rows), different in each row.
    let documents = vec![vec![0, 5, 13, 24], vec![0, 16, 17, 24]];
    for (file, kind, tol, doc_bounds) in [
        ("tiny-llama.json", Kind::Double, 1e-10, None),
        ("tiny-qwen3.json", Kind::Double, 1e-10, None),
        ("tiny-qwen3.json", Kind::Float, 1e-5, None),
        (
            "tiny-llama.json",
            Kind::Double,
            1e-10,
            Some(documents.clone()),
        ),
        ("tiny-qwen3.json", Kind::Float, 1e-5, Some(documents)),
    ] {
        let options = ModelOptions {
            device: Device::Cpu,
            kind,
        };
        let model = Model::random(tiny(file), options, 7).unwrap();
        let (b, l) = (2i64, 24i64);
        let tokens = (Tensor::arange(b * l, (Kind::Int64, Device::Cpu)) * 37)
            .remainder(512)
            .view([b, l]);
        // Explicit, non-contiguous positions: a skip of 100 from row 9 on (the perturbed view's
        // shape), so every chunk's RoPE comes from the positions given, not from its rows.
        let rows = Tensor::arange(l, (Kind::Int64, Device::Cpu));
        let positions = (&rows + rows.ge(9).to_kind(Kind::Int64) * 100)
            .unsqueeze(0)
            .repeat([b, 1]);
        tch::manual_seed(11);
        let d = model.config().hidden_size;
        let w = Tensor::randn([b, l, d], (kind, Device::Cpu));

        // One process: the whole sequences.
        let boundaries = doc_bounds
            .clone()
            .map(|d| rsd_model::DocBoundaries::new(d, l).unwrap());
        let full = model
            .forward(&ForwardArgs {
                doc_bounds: boundaries.as_ref(),
                ..ForwardArgs::new(&tokens, &positions)
            })
            .unwrap()
            .hidden;
        (&full * &w).sum(kind).backward();
        let want = grads(&model);
        zero_grads(&model);

        // This rank's zigzag chunks, K/V gathered from the group.
        let gather = |t: &Tensor| {
            cp.gather_kv(t)
                .map_err(|e| rsd_model::ModelError::Input(e.to_string()))
        };
        let chunks = ContextChunks {
            chunks: cp.chunks(l).unwrap(),
            doc_bounds: doc_bounds.clone(),
            gather: &gather,
        };
        let local = model
            .forward(&ForwardArgs {
                cp: Some(&chunks),
                ..ForwardArgs::new(
                    &cp.local_rows(&tokens, 1).unwrap(),
                    &cp.local_rows(&positions, 1).unwrap(),
                )
            })
            .unwrap()
            .hidden;
        let r = rel(&local, &cp.local_rows(&full, 1).unwrap());
        let what = format!("{file} {kind:?} documents {}", doc_bounds.is_some());
        assert!(r <= tol, "{what}: hidden states differ by {r:e}");
        (&local * cp.local_rows(&w, 1).unwrap())
            .sum(kind)
            .backward();
        for ((name, g), (_, want)) in grads(&model).iter_mut().zip(&want) {
            cp.group().all_reduce(g, ReduceOp::Sum).unwrap();
            let r = rel(g, want);
            assert!(
                r <= tol,
                "{file} {kind:?}: gradient of {name} differs by {r:e}"
            );
        }
        zero_grads(&model);
    }
}
