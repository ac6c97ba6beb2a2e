//! `rsd-model bench`: forward+backward of a random model, and the attention primitive against
//! plain causal SDPA, timed; one JSON line (benches/model_bench.py runs it).
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use rsd_model::{ForwardArgs, Model, ModelOptions};
use tch::{Kind, Tensor};

use crate::checkpoint_cmd::read_config;

#[derive(Args)]
pub struct BenchArgs {
    /// An HF config.json.
    #[arg(long)]
    pub config: PathBuf,
    /// Sequence length.
    #[arg(long, default_value_t = 2048)]
    pub seq_len: i64,
    /// Intra-op threads.
    #[arg(long, default_value_t = 2)]
    pub threads: i32,
    /// Timed iterations (after one warm-up).
    #[arg(long, default_value_t = 5)]
    pub iters: usize,
}

/// Median seconds of `iters` runs of `f` after one warm-up.
fn time_it(iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = std::time::Instant::now();
        f()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    Ok(rsd_common::stats::median(&times))
}

pub fn bench(a: BenchArgs) -> Result<()> {
    let BenchArgs {
        config,
        seq_len,
        threads,
        iters,
    } = a;
    tch::set_num_threads(threads);
    let cfg = read_config(&config)?;
    // A random fp32 model on the CPU: refused with its byte count if it cannot fit.
    cfg.check_fits_in_memory(&config, "fp32", 4, rsd_model::alloc::available_bytes())?;
    let m = Model::random(cfg.clone(), ModelOptions::default(), 0)?;
    let cpu = (Kind::Int64, tch::Device::Cpu);
    tch::manual_seed(0);
    let tokens = Tensor::randint(cfg.vocab_size, [1, seq_len], cpu);
    let positions = Tensor::arange(seq_len, cpu).unsqueeze(0);
    let params = m.var_store().trainable_variables();
    let step = || -> Result<()> {
        let h = m.forward(&ForwardArgs::new(&tokens, &positions))?.hidden;
        let logits = m.logits(&h)?;
        let v = cfg.vocab_size;
        let loss = logits
            .narrow(1, 0, seq_len - 1)
            .reshape([-1, v])
            .cross_entropy_for_logits(&tokens.narrow(1, 1, seq_len - 1).reshape([-1]));
        loss.backward();
        for p in &params {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
        Ok(())
    };
    let model_s = time_it(iters, step)?;
    // The attention primitive alone, forward+backward, vs libtorch's plain causal SDPA.
    let (h, hd) = (cfg.num_attention_heads, cfg.head_dim);
    let f = (Kind::Float, tch::Device::Cpu);
    let q = Tensor::randn([1, h, seq_len, hd], f).set_requires_grad(true);
    let k = Tensor::randn([1, h, seq_len, hd], f).set_requires_grad(true);
    let v = Tensor::randn([1, h, seq_len, hd], f).set_requires_grad(true);
    let scale = 1.0 / (hd as f64).sqrt();
    let backward = |out: Tensor| {
        out.sum(Kind::Float).backward();
        for t in [&q, &k, &v] {
            let _ = t.grad().zero_();
        }
    };
    let sdpa_s = time_it(iters, || {
        backward(Tensor::scaled_dot_product_attention(
            &q,
            &k,
            &v,
            None::<Tensor>,
            0.0,
            true,
            scale,
            false,
        ));
        Ok(())
    })?;
    let prim_s = time_it(iters, || {
        backward(rsd_model::attention::attend_documents(&q, &k, &v, None, None, scale)?.out);
        Ok(())
    })?;
    // Same keys split into [prefix | own block] and merged by LSE (the prefix-reuse path).
    let half = seq_len / 2;
    let split_s = time_it(iters, || {
        let (pk, pv) = (k.narrow(2, 0, half), v.narrow(2, 0, half));
        let tail = |t: &Tensor| t.narrow(2, half, seq_len - half);
        let a = rsd_model::attention::attend_documents(
            &tail(&q),
            &tail(&k),
            &tail(&v),
            Some((&pk, &pv)),
            None,
            scale,
        )?;
        let head = rsd_model::attention::attend_documents(
            &q.narrow(2, 0, half),
            &pk,
            &pv,
            None,
            None,
            scale,
        )?;
        backward(Tensor::cat(&[head.out, a.out], 2));
        Ok(())
    })?;
    let j = serde_json::json!({
        "seq_len": seq_len, "threads": threads, "iters": iters,
        "model_fwd_bwd_s": model_s, "sdpa_fwd_bwd_s": sdpa_s, "primitive_fwd_bwd_s": prim_s,
        "primitive_split_fwd_bwd_s": split_s, "parameters": cfg.num_parameters(),
    });
    println!("{j}");
    Ok(())
}
