//! The attention kernels on a CUDA device against the materialised reference on the CPU in fp64:
//! flash attention (bf16, fp16), memory-efficient attention (fp32), a head size not a multiple of
//! 8 (zero-padded), GQA, a key prefix, documents. Values and the gradients of q, k, v. And the
//! fused RMSNorm the model uses in half precision on CUDA.
//!
//! Every test returns at once, saying so, where libtorch sees no CUDA device: the CPU suite builds
//! these and `scripts/gpu-check.sh` runs them on a GPU machine.
use rsd_model::attention::{attend_documents, attend_reference};
use rsd_model::model::rms_norm;
use rsd_model::{DocBoundaries, KvBlock, Mask};
use tch::{Device, Kind, Tensor};

fn cuda() -> Option<Device> {
    if tch::Cuda::is_available() {
        Some(Device::Cuda(0))
    } else {
        eprintln!("no CUDA device: skipped");
        None
    }
}

/// Largest |a − b| over max |b| (both moved to the CPU in fp64).
fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    let a = a.to_device(Device::Cpu).to_kind(Kind::Double);
    let b = b.to_device(Device::Cpu).to_kind(Kind::Double);
    let diff = (&a - &b).abs().max().double_value(&[]);
    let scale = b.abs().max().double_value(&[]).max(1e-12);
    diff / scale
}

struct Case {
    batch: i64,
    heads: i64,
    kv_heads: i64,
    len: i64,
    prefix: i64,
    head_dim: i64,
    doc_bounds: Option<Vec<i64>>,
}

/// Runs `case` on CUDA in `kind` and on the CPU in fp64 (the reference: scores materialised,
/// K/V expanded), and returns the largest relative error of out, dq, dk, dv (and the prefix's
/// dk, dv when there is one).
fn compare(case: &Case, kind: Kind, device: Device) -> Vec<(String, f64)> {
    tch::manual_seed(7);
    let shape = |h: i64, l: i64| [case.batch, h, l, case.head_dim];
    let q0 = Tensor::randn(shape(case.heads, case.len), (Kind::Double, Device::Cpu));
    let k0 = Tensor::randn(shape(case.kv_heads, case.len), (Kind::Double, Device::Cpu));
    let v0 = Tensor::randn(shape(case.kv_heads, case.len), (Kind::Double, Device::Cpu));
    let pk0 = Tensor::randn(
        shape(case.kv_heads, case.prefix),
        (Kind::Double, Device::Cpu),
    );
    let pv0 = Tensor::randn(
        shape(case.kv_heads, case.prefix),
        (Kind::Double, Device::Cpu),
    );
    let grad0 = Tensor::randn(shape(case.heads, case.len), (Kind::Double, Device::Cpu));
    let scale = 1.0 / (case.head_dim as f64).sqrt();
    let total = case.prefix + case.len;
    let doc_bounds = case.doc_bounds.as_ref().map(|cu| {
        DocBoundaries::same_for_all(cu.clone(), case.batch as usize, total).expect("boundaries")
    });

    // The device run, through the path a decoder layer takes.
    let leaf = |t: &Tensor| t.to_device(device).to_kind(kind).set_requires_grad(true);
    let (q, k, v, pk, pv) = (leaf(&q0), leaf(&k0), leaf(&v0), leaf(&pk0), leaf(&pv0));
    let prefix = (case.prefix > 0).then_some((&pk, &pv));
    let got =
        attend_documents(&q, &k, &v, prefix, doc_bounds.as_ref(), scale).expect("device attention");
    // d(Σ out·g)/d out = g: the backward receives g as the upstream gradient.
    let g = grad0.to_device(device).to_kind(Kind::Float);
    (got.out.to_kind(Kind::Float) * g)
        .sum(Kind::Float)
        .backward();

    // The reference: per document, the prefix unmasked and the document's own keys causal.
    let leaf64 = |t: &Tensor| t.copy().set_requires_grad(true);
    let (rq, rk, rv, rpk, rpv) = (
        leaf64(&q0),
        leaf64(&k0),
        leaf64(&v0),
        leaf64(&pk0),
        leaf64(&pv0),
    );
    let bounds = match &case.doc_bounds {
        Some(cu) => cu.clone(),
        None => vec![0, total],
    };
    let mut outs = Vec::new();
    for w in bounds.windows(2) {
        // Boundaries count the prefix's positions first; a document lies in the queries' span
        // from max(start, prefix) on, and sees the prefix's part that falls inside it.
        let (start, end) = (w[0].max(case.prefix), w[1]);
        if end <= start {
            continue;
        }
        let (qs, qe) = (start - case.prefix, end - case.prefix);
        let qd = rq.narrow(2, qs, qe - qs);
        let (kd, vd) = (rk.narrow(2, qs, qe - qs), rv.narrow(2, qs, qe - qs));
        let pstart = w[0].min(case.prefix);
        let plen = (w[1].min(case.prefix) - pstart).max(0);
        let (pkd, pvd) = (rpk.narrow(2, pstart, plen), rpv.narrow(2, pstart, plen));
        let mut blocks = Vec::new();
        if plen > 0 {
            blocks.push(KvBlock {
                k: &pkd,
                v: &pvd,
                mask: Mask::None,
            });
        }
        blocks.push(KvBlock {
            k: &kd,
            v: &vd,
            mask: Mask::Causal,
        });
        outs.push(
            attend_reference(&qd, &blocks, scale)
                .expect("reference")
                .out,
        );
    }
    let want = Tensor::cat(&outs, 2);
    (&want * &grad0).sum(Kind::Double).backward();

    let mut errs = vec![
        ("out".to_owned(), rel_err(&got.out, &want)),
        ("dq".to_owned(), rel_err(&q.grad(), &rq.grad())),
        ("dk".to_owned(), rel_err(&k.grad(), &rk.grad())),
        ("dv".to_owned(), rel_err(&v.grad(), &rv.grad())),
    ];
    if case.prefix > 0 {
        errs.push(("prefix dk".to_owned(), rel_err(&pk.grad(), &rpk.grad())));
        errs.push(("prefix dv".to_owned(), rel_err(&pv.grad(), &rpv.grad())));
    }
    errs
}

fn check(name: &str, case: Case, kind: Kind, tolerance: f64) {
    let Some(device) = cuda() else { return };
    let errs = compare(&case, kind, device);
    eprintln!("{name} {kind:?}: {errs:?}");
    for (what, err) in errs {
        assert!(
            err <= tolerance,
            "{name} {kind:?}: {what} differs from the fp64 reference by {err:.3e} (> {tolerance:.0e})"
        );
    }
}

// bf16 keeps 8 bits of mantissa: its rounding of q, k, v alone moves the output by ~1e-2 of its
// largest value; fp16 keeps 11 (~2e-3); fp32 kernels accumulate in fp32 (~1e-5 over 512 keys).
const BF16: f64 = 3e-2;
const FP16: f64 = 5e-3;
const FP32: f64 = 1e-4;

impl Case {
    /// `batch` rows, `heads` query heads over `kv_heads`, `len` queries after a `prefix`.
    fn new(batch: i64, heads: i64, kv_heads: i64, len: i64, prefix: i64, head_dim: i64) -> Case {
        Case {
            batch,
            heads,
            kv_heads,
            len,
            prefix,
            head_dim,
            doc_bounds: None,
        }
    }
}

fn causal_gqa() -> Case {
    Case::new(2, 8, 2, 384, 0, 64)
}

/// Boundaries over [prefix 100 ; 300 queries]: one document straddles the prefix's end, one has
/// a single token.
fn documents_with_prefix() -> Case {
    Case {
        doc_bounds: Some(vec![0, 60, 170, 171, 400]),
        ..Case::new(2, 4, 1, 300, 100, 64)
    }
}

#[test]
fn flash_attention_causal_gqa_matches_the_reference() {
    check("causal GQA", causal_gqa(), Kind::BFloat16, BF16);
    check("causal GQA", causal_gqa(), Kind::Half, FP16);
}

#[test]
fn efficient_attention_causal_gqa_matches_the_reference() {
    check("causal GQA", causal_gqa(), Kind::Float, FP32);
}

#[test]
fn a_key_prefix_and_the_own_causal_block_match_the_reference() {
    let case = || Case::new(1, 8, 4, 256, 320, 128);
    check("prefix + causal", case(), Kind::BFloat16, BF16);
    check("prefix + causal", case(), Kind::Float, FP32);
}

#[test]
fn documents_with_a_prefix_match_the_reference() {
    check("documents", documents_with_prefix(), Kind::BFloat16, BF16);
    check("documents", documents_with_prefix(), Kind::Float, FP32);
}

#[test]
fn a_head_size_not_a_multiple_of_8_runs_zero_padded() {
    // 20 is not a multiple of 8: flash (bf16, fp16) and the efficient kernel (fp32) on a
    // zero-padded head, with GQA (the case the efficient kernel's half-precision backward got
    // wrong) and a key prefix.
    for (kind, tolerance) in [
        (Kind::BFloat16, BF16),
        (Kind::Half, FP16),
        (Kind::Float, FP32),
    ] {
        check(
            "head_dim 20",
            Case::new(1, 4, 2, 200, 0, 20),
            kind,
            tolerance,
        );
    }
    check(
        "head_dim 20",
        Case::new(2, 4, 2, 96, 40, 20),
        Kind::BFloat16,
        BF16,
    );
}

#[test]
fn the_same_comparison_on_the_cpu_holds_which_checks_this_files_reference() {
    // Runs everywhere: the CPU flash kernel in fp32 against the same reference, so a wrong
    // reference (or a wrong reading of the document boundaries) fails here, not only on a GPU.
    let cases = [
        causal_gqa(),
        Case::new(1, 8, 4, 96, 80, 32),
        documents_with_prefix(),
    ];
    for case in cases {
        for (what, err) in compare(&case, Kind::Float, Device::Cpu) {
            assert!(err <= FP32, "cpu fp32: {what} differs by {err:.3e}");
        }
    }
}

/// RMSNorm in bf16 on CUDA runs libtorch's fused kernel (`rsd_model::model::rms_norm`): its
/// values and gradients (input and weight) against the fp64 inputs through the eager path on the
/// CPU, within bf16's precision.
#[test]
fn the_fused_rms_norm_matches_the_eager_reference() {
    let Some(device) = cuda() else { return };
    tch::manual_seed(11);
    let x0 = Tensor::randn([3, 17, 256], (Kind::Double, Device::Cpu));
    let w0 = Tensor::randn([256], (Kind::Double, Device::Cpu)) * 0.1 + 1.0;
    let g0 = Tensor::randn([3, 17, 256], (Kind::Double, Device::Cpu));
    let leaf = |t: &Tensor| {
        t.to_device(device)
            .to_kind(Kind::BFloat16)
            .set_requires_grad(true)
    };
    let (x, w) = (leaf(&x0), leaf(&w0));
    let y = rms_norm(&x, &w, 1e-5).expect("fused rms_norm");
    (y.to_kind(Kind::Float) * g0.to_device(device).to_kind(Kind::Float))
        .sum(Kind::Float)
        .backward();
    let (xr, wr) = (
        x0.copy().set_requires_grad(true),
        w0.copy().set_requires_grad(true),
    );
    let yr = rms_norm(&xr, &wr, 1e-5).expect("eager rms_norm");
    (&yr * &g0).sum(Kind::Double).backward();
    for (what, got, want, tol) in [
        ("values", &y, &yr, BF16),
        ("d input", &x.grad(), &xr.grad(), 2.0 * BF16),
        ("d weight", &w.grad(), &wr.grad(), 2.0 * BF16),
    ] {
        let err = rel_err(got, want);
        eprintln!("fused rms_norm {what}: {err:.2e}");
        assert!(err <= tol, "fused rms_norm {what} differs by {err:.3e}");
    }
}

/// The caching allocator's counters (`rsd_model::alloc::cuda_memory`) move by exactly a new
/// tensor's bytes (a multiple of the allocator's 512-byte rounding), and the peak restarts.
#[test]
fn the_cuda_allocator_counts_a_tensor_exactly() {
    use rsd_model::alloc::{cuda_memory, cuda_reset_peak};
    let Some(device) = cuda() else {
        assert_eq!(cuda_memory(0), None, "no CUDA: no counts");
        assert!(!cuda_reset_peak(0));
        return;
    };
    // CUDA is initialised by the first tensor put on it.
    let warm = Tensor::zeros([1], (Kind::Float, device));
    let before = cuda_memory(0).expect("counts once CUDA is up");
    let n: i64 = 3 << 20;
    let t = Tensor::zeros([n], (Kind::Float, device));
    let with = cuda_memory(0).expect("counts");
    assert_eq!(with.allocated - before.allocated, 4 * n as u64);
    assert!(with.peak_allocated >= with.allocated);
    assert!(with.reserved >= with.allocated);
    drop(t);
    let after = cuda_memory(0).expect("counts");
    assert_eq!(after.allocated, before.allocated);
    assert_eq!(after.peak_allocated, with.peak_allocated, "the peak stays");
    assert!(cuda_reset_peak(0));
    let reset = cuda_memory(0).expect("counts");
    assert_eq!(reset.peak_allocated, reset.allocated);
    assert_eq!(cuda_memory(1 << 20), None, "no such device");
    drop(warm);
}
