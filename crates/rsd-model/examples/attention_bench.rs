//! CPU timing of the attention primitive, forward and backward, on a GQA shape.
//!
//! ```text
//! cargo run --release -p rsd-model --example attention_bench -- [LAYERS L H HKV D PREFIX]
//! ```
//! Defaults: 4 layers of Llama-3-8B attention (H 32, Hkv 8, D 128) over L = 1024 queries, no
//! prefix. Every layer's graph is kept until one backward over all of them, as in a training
//! step, so peak RSS (`/usr/bin/time -v`) shows what autograd saves.
use std::time::Instant;

use rsd_model::{attend, KvBlock, Mask};
use tch::{Device, Kind, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<i64> = std::env::args()
        .skip(1)
        .map(|a| a.parse::<i64>())
        .collect::<Result<_, _>>()?;
    let arg = |i: usize, default: i64| args.get(i).copied().unwrap_or(default);
    let (layers, l, h, hkv, d, lp) = (
        arg(0, 4),
        arg(1, 1024),
        arg(2, 32),
        arg(3, 8),
        arg(4, 128),
        arg(5, 0),
    );
    tch::manual_seed(0);
    let rand = |heads: i64, len: i64| {
        Tensor::randn([1, heads, len, d], (Kind::Float, Device::Cpu)).set_requires_grad(true)
    };
    let inputs: Vec<[Tensor; 5]> = (0..layers)
        .map(|_| {
            [
                rand(h, l),
                rand(hkv, l),
                rand(hkv, l),
                rand(hkv, lp),
                rand(hkv, lp),
            ]
        })
        .collect();
    let scale = 1.0 / (d as f64).sqrt();
    for rep in 0..3 {
        let t0 = Instant::now();
        let mut loss = Tensor::zeros([], (Kind::Float, Device::Cpu));
        for [q, k, v, pk, pv] in &inputs {
            let mut blocks = Vec::new();
            if lp > 0 {
                blocks.push(KvBlock {
                    k: pk,
                    v: pv,
                    mask: Mask::None,
                });
            }
            blocks.push(KvBlock {
                k,
                v,
                mask: Mask::Causal,
            });
            loss += attend(q, &blocks, scale)?.out.square().mean(Kind::Float);
        }
        let fwd = t0.elapsed().as_secs_f64();
        loss.backward();
        let total = t0.elapsed().as_secs_f64();
        println!(
            "rep {rep}: {layers} layers, L {l}, prefix {lp}, H {h}, Hkv {hkv}, D {d}: forward {:.3} s, backward {:.3} s",
            fwd,
            total - fwd
        );
    }
    Ok(())
}
