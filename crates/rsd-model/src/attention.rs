//! The one attention primitive.
//!
//! Queries attend to a list of key/value blocks; each block is either unmasked (a key prefix: an
//! earlier part of the sequence, K/V reused from an earlier pass, or K/V gathered from another
//! context-parallel rank) or causal (the queries' own block, same span). Each block runs through
//! libtorch's fused kernel, which returns the block output and its log-sum-exp; the blocks are
//! merged by LSE in fp32:
//!
//! ```text
//! lse = logsumexp_b(lse_b)        out = Σ_b exp(lse_b − lse) · out_b
//! ```
//!
//! which equals one softmax over all keys. The merged LSE is returned for callers that merge
//! further (context parallelism).
//!
//! **Kernels.** CPU: `_scaled_dot_product_flash_attention_for_cpu`. CUDA, fp16/bf16 with a
//! head_dim of at most 256: the kernel libtorch's `scaled_dot_product_attention` would pick for the
//! call, cuDNN's (`_scaled_dot_product_cudnn_attention`, Hopper and Blackwell; LSE `[B, H, Lq, 1]`)
//! or flash (`_scaled_dot_product_flash_attention`, elsewhere; LSE `[B, H, Lq]`); cuDNN only for
//! shapes it has taken before or while fewer than `RSD_CUDNN_SHAPES` (4) have gone to it, since
//! it builds a plan per shape and perturbed suffixes change shape every step;
//! `RSD_ATTENTION_KERNEL=flash|cudnn` forces one. Otherwise `_scaled_dot_product_efficient_attention`
//! (fp32; its LSE is padded to a multiple of 32 rows and cut back). A head_dim that is not a
//! multiple of 8 is zero-padded to one for flash and memory-efficient, exactly (zero columns change
//! no score), and never goes to cuDNN. There is never dropout. The choice is made per block in the
//! forward and kept for its backward (`kernel_for` in the C++ file).
//!
//! **GQA, never expanded.** Queries are `[B, H, Lq, D]`, every K/V block `[B, Hkv, Lk, D]`, and
//! query head `h` uses KV head `h / G` (`G = H / Hkv`). K/V are never copied to the query heads.
//! cuDNN's and flash take Hkv < H natively: one kernel call per block, forward and backward (the
//! kernel sums dK/dV over the query heads). For the CPU and memory-efficient kernels the queries
//! are viewed as `[B, Hkv, G, Lq, D]`: the unmasked prefix folds the G query heads of a KV head
//! into its query rows, `[B, Hkv, G·Lq, D]` (a copy of q when its layout needs it), and runs one
//! kernel call against the unexpanded prefix K/V; the causal block runs one kernel call per `g`
//! with `q[:, :, g]` (`[B, Hkv, Lq, D]`, the same span as the keys, so the kernels' top-left
//! causal alignment is right) and writes into one `[B, H, Lq, D]` output; in the backward its
//! dK/dV are summed over `g` into one `[B, Hkv, Lq, D]` buffer. Exact, in the same order of heads
//! as expanding with `unsqueeze(2).expand(..).reshape(..)` would give.
//!
//! **Gradients.** The fused kernels do not differentiate their LSE output, and tch cannot define
//! autograd functions, so every case (plain CLM = one causal block; prefix only; prefix + causal)
//! is one C++ autograd function (`csrc/merged_attention.cpp`, compiled by build.rs against the
//! same libtorch): its backward runs each block's fused backward against the *merged* output and
//! LSE, which is exactly that block's share of the gradient of one softmax over all keys. Forward
//! and backward therefore cost one fused call per block (per `g` for the causal block on the
//! kernels without GQA), as one call over the visible keys would. With the phase clock on
//! ([`crate::phases`]) every call is timed as `attention forward` / `attention backward`. The returned LSE is a value (for diagnostics and for merging
//! across context-parallel ranks in the forward); it carries no gradient.
//!
//! **What [`attend`] saves for backward** (the C++ function's `save_for_backward`, exactly; `Lp`
//! is the joined prefix length, `acc` fp32, fp64 for fp64 queries):
//!
//! | case | saved |
//! |---|---|
//! | causal only | `q [B,H,Lq,D]`, `k, v [B,Hkv,Lq,D]`, `out [B,H,Lq,D]`, `lse [B,H,Lq] acc` |
//! | prefix only | `q [B,H,Lq,D]`, `kp, vp [B,Hkv,Lp,D]`, `out [B,H,Lq,D]`, `lse [B,H,Lq] acc` |
//! | prefix + causal | `q`, `kp, vp [B,Hkv,Lp,D]`, `k, v [B,Hkv,Lq,D]`, `out`, `lse` as above |
//!
//! q, K/V and `out` in the query dtype. The tensors are the caller's own (no copy) except `out`
//! and `lse`, which are the function's outputs, and a prefix given as several blocks, which is
//! joined (`cat`, `[B,Hkv,Lp,D]`, unexpanded) first; an absent block is saved as a 0-element
//! placeholder (`[0]`, autograd functions take no undefined inputs). On CUDA each kernel call
//! also keeps its RNG state (two or four tiny tensors: seed, offset, and flash's empty `cum_seq`
//! tensors). Nothing else is saved by tch ops around it: the callers pass q, K/V straight in.
//! [`attend_documents`] calls [`attend`] once per document segment, so it saves the above per
//! segment, on narrowed views of the caller's tensors (`cat` of the per-segment outputs saves
//! nothing). [`attend_materialised`] runs tch ops (the score changes need them); autograd saves
//! `q` folded `[B,Hkv,G·L,D] acc` and `k [B,Hkv,L,D] acc` (first matmul), the mask
//! `[B or 1,1,L,L] bool` (masked_fill), the softmax output `[B,H,L,L] acc`, with dropout also
//! `keep [B,H,L,L] acc`, then the (dropped) probabilities `[B,H,L,L] acc` (the softmax output
//! itself without dropout) and `v [B,Hkv,L,D] acc` (second matmul) — never K/V at H heads. The
//! `acc` conversions are copies only when q/K/V are not `acc` already.
//!
//! [`attend_reference`] materialises the scores and expands K/V (test-only); tests compare the
//! paths to it, values and gradients.
use tch::{Device, Kind, Tensor};

use crate::error::{ModelError, Result, TchContext};
use crate::shape_str;

/// How a key block is masked against the queries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mask {
    /// Every query sees every key (a prefix that precedes all queries).
    None,
    /// The block covers the same span as the queries: query i sees keys 0..=i.
    Causal,
}

impl Mask {
    /// `unmasked` or `causal`, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Mask::None => "unmasked",
            Mask::Causal => "causal",
        }
    }
}

/// One block of keys and values, `[B, Hkv, Lk, D]` each (Hkv divides the query heads: GQA; the
/// same Hkv for every block).
#[derive(Debug, Clone, Copy)]
pub struct KvBlock<'a> {
    /// Keys (RoPE already applied).
    pub k: &'a Tensor,
    /// Values.
    pub v: &'a Tensor,
    /// Masking against the queries.
    pub mask: Mask,
}

/// Attention output.
#[derive(Debug)]
pub struct Attended {
    /// `[B, H, Lq, D]` in the query dtype.
    pub out: Tensor,
    /// `[B, H, Lq]` fp32 (fp64 for fp64 queries) log-sum-exp of the scaled scores over all keys.
    /// A value: not differentiable (see the module docs).
    pub lse: Tensor,
}

fn check_shapes(q: &Tensor, blocks: &[KvBlock<'_>]) -> Result<()> {
    let qs = q.size();
    if qs.len() != 4 {
        return Err(ModelError::Input(format!(
            "attention: queries must be [B, H, L, D], got {}",
            shape_str(&qs)
        )));
    }
    if blocks.is_empty() {
        return Err(ModelError::Input("attention: no key blocks".into()));
    }
    for (i, b) in blocks.iter().enumerate() {
        let (ks, vs) = (b.k.size(), b.v.size());
        let ok = ks.len() == 4
            && ks == vs
            && ks[0] == qs[0]
            && ks[3] == qs[3]
            && ks[1] > 0
            && qs[1] % ks[1] == 0
            && ks[1] == blocks[0].k.size().get(1).copied().unwrap_or(0)
            && (b.mask == Mask::None || ks[2] == qs[2]);
        if !ok {
            return Err(ModelError::Input(format!(
                "attention: block {i} ({}) has k {}, v {}, incompatible with queries {}",
                b.mask.name(),
                shape_str(&ks),
                shape_str(&vs),
                shape_str(&qs)
            )));
        }
    }
    Ok(())
}

/// The C++ autograd function of `csrc/merged_attention.cpp` (compiled by build.rs).
mod shim {
    use std::ffi::{c_char, c_int};
    use torch_sys::C_tensor;

    extern "C" {
        pub fn rsd_gqa_attention(
            q: *const C_tensor,
            kp: *const C_tensor,
            vp: *const C_tensor,
            ks: *const C_tensor,
            vs: *const C_tensor,
            scale: f64,
            out: *mut *mut C_tensor,
            lse: *mut *mut C_tensor,
            err: *mut c_char,
            err_len: usize,
        ) -> c_int;
    }
}

/// Queries `[B, H, Lq, D]` over an unmasked `prefix` and/or their own causal block `own` (K/V
/// `[B, Hkv, L, D]` each, unexpanded) in one autograd node (see the module docs).
fn fused(
    q: &Tensor,
    prefix: Option<(&Tensor, &Tensor)>,
    own: Option<(&Tensor, &Tensor)>,
    scale: f64,
) -> Result<Attended> {
    let ptr = |t: Option<&Tensor>| t.map_or(std::ptr::null(), |t| t.as_ptr());
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    let mut lse: *mut torch_sys::C_tensor = std::ptr::null_mut();
    let mut err = vec![0u8; 1024];
    // SAFETY: the tensors are live for the call (null stands for an absent block); on success the
    // shim hands over two new `torch::Tensor*` that `Tensor::from_ptr` owns (and frees) from then
    // on.
    let rc = unsafe {
        shim::rsd_gqa_attention(
            q.as_ptr(),
            ptr(prefix.map(|p| p.0)),
            ptr(prefix.map(|p| p.1)),
            ptr(own.map(|o| o.0)),
            ptr(own.map(|o| o.1)),
            scale,
            &mut out,
            &mut lse,
            err.as_mut_ptr().cast(),
            err.len(),
        )
    };
    if rc != 0 || out.is_null() || lse.is_null() {
        let end = err.iter().position(|&c| c == 0).unwrap_or(err.len());
        return Err(ModelError::Input(format!(
            "attention: fused kernel failed: {}",
            String::from_utf8_lossy(&err[..end])
        )));
    }
    // SAFETY: both pointers were just created by the shim for us (see above).
    let (out, lse) = unsafe { (Tensor::from_ptr(out), Tensor::from_ptr(lse)) };
    Ok(Attended { out, lse })
}

/// Attends `q` `[B, H, Lq, D]` to `blocks` (K/V `[B, Hkv, Lk, D]`, Hkv dividing H): unmasked
/// blocks (concatenated into one key prefix) and at most one causal block. See the module docs.
pub fn attend(q: &Tensor, blocks: &[KvBlock<'_>], scale: f64) -> Result<Attended> {
    check_shapes(q, blocks)?;
    let blocks: Vec<&KvBlock<'_>> = blocks.iter().filter(|b| b.k.size()[2] > 0).collect();
    let causal: Vec<&&KvBlock<'_>> = blocks.iter().filter(|b| b.mask == Mask::Causal).collect();
    if causal.len() > 1 {
        return Err(ModelError::Input(format!(
            "attention: {} causal key blocks; the queries' own span can only be given once",
            causal.len()
        )));
    }
    let prefix: Vec<&&KvBlock<'_>> = blocks.iter().filter(|b| b.mask == Mask::None).collect();
    let joined = match prefix.as_slice() {
        [] => None,
        [b] => Some((b.k.shallow_clone(), b.v.shallow_clone())),
        _ => {
            let ks: Vec<&Tensor> = prefix.iter().map(|b| b.k).collect();
            let vs: Vec<&Tensor> = prefix.iter().map(|b| b.v).collect();
            let k = Tensor::f_cat(&ks, 2).ctx("attention: join key prefix")?;
            let v = Tensor::f_cat(&vs, 2).ctx("attention: join key prefix")?;
            Some((k, v))
        }
    };
    if joined.is_none() && causal.is_empty() {
        return Err(ModelError::Input(
            "attention: all key blocks are empty".into(),
        ));
    }
    fused(
        q,
        joined.as_ref().map(|(k, v)| (k, v)),
        causal.first().map(|b| (b.k, b.v)),
        scale,
    )
}

/// Slow reference: materialised fp32 (fp64 for fp64 queries) scores, the same masks. For tests
/// and debugging only: unlike every other path here it expands K/V to the query heads (copies),
/// the most direct statement of GQA.
pub fn attend_reference(q: &Tensor, blocks: &[KvBlock<'_>], scale: f64) -> Result<Attended> {
    check_shapes(q, blocks)?;
    let heads = q.size()[1];
    let lq = q.size()[2];
    let acc = crate::accum_kind(q.kind());
    // Query head h uses KV head h / (H / Hkv).
    let repeat_kv = |x: &Tensor, heads: i64| -> std::result::Result<Tensor, tch::TchError> {
        let (b, hkv, l, d) = x.size4()?;
        x.f_unsqueeze(2)?
            .f_expand([b, hkv, heads / hkv, l, d], false)?
            .f_reshape([b, heads, l, d])
    };
    let f = || -> std::result::Result<Attended, tch::TchError> {
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        let mut masks = Vec::new();
        for b in blocks {
            let lk = b.k.size()[2];
            ks.push(repeat_kv(b.k, heads)?.f_to_kind(acc)?);
            vs.push(repeat_kv(b.v, heads)?.f_to_kind(acc)?);
            let allowed = match b.mask {
                Mask::None => Tensor::f_ones([lq, lk], (Kind::Bool, q.device()))?,
                Mask::Causal => Tensor::f_ones([lq, lk], (Kind::Bool, q.device()))?.f_tril(0)?,
            };
            masks.push(allowed);
        }
        let k = Tensor::f_cat(&ks, 2)?;
        let v = Tensor::f_cat(&vs, 2)?;
        let allowed = Tensor::f_cat(&masks, 1)?;
        let scores = q
            .f_to_kind(acc)?
            .f_matmul(&k.f_transpose(-1, -2)?)?
            .f_mul_scalar(scale)?
            .f_masked_fill(&allowed.f_logical_not()?, f64::NEG_INFINITY)?;
        let lse = scores.f_logsumexp(-1, false)?;
        let p = scores.f_sub(&lse.f_unsqueeze(-1)?)?.f_exp()?;
        Ok(Attended {
            out: p.f_matmul(&v)?.f_to_kind(q.kind())?,
            lse,
        })
    };
    f().ctx("attention: reference")
}

/// Changes to one pass's attention that the fused kernels cannot express (the trainer's control
/// views): noise added to the scaled scores before the softmax, and dropout of the probabilities
/// after it. Both are given, not drawn here, so the caller decides the randomness.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScoreChanges<'a> {
    /// Added to the scaled scores `q·kᵀ/√d`, `[B, H, Lq, Lk]` (masked entries stay masked).
    pub score_noise: Option<&'a Tensor>,
    /// Dropout of the probabilities: `(keep, p)` with `keep` `[B, H, Lq, Lk]` (nonzero = kept);
    /// kept probabilities are scaled by `1/(1 − p)`, as `torch.nn.functional.dropout`.
    pub dropout: Option<(&'a Tensor, f64)>,
}

/// Causal self-attention (within documents) through materialised scores `[B, H, L, L]` in fp32
/// (fp64 for fp64 queries), with [`ScoreChanges`] applied: `softmax(q·kᵀ/√d + noise + mask)`,
/// then dropout, then `· v`. Costs `O(L²)` memory per head, unlike [`attend`]; the fused kernels
/// take no additive noise or probability mask with a gradient, so the control views use this.
pub fn attend_materialised(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    doc_bounds: Option<&DocBoundaries>,
    scale: f64,
    changes: &ScoreChanges<'_>,
) -> Result<Tensor> {
    let causal = [KvBlock {
        k,
        v,
        mask: Mask::Causal,
    }];
    check_shapes(q, &causal)?;
    let (b, heads, l) = (q.size()[0], q.size()[1], q.size()[2]);
    let expect = [b, heads, l, l];
    for (name, t) in [
        ("score noise", changes.score_noise),
        ("dropout mask", changes.dropout.map(|d| d.0)),
    ] {
        if let Some(t) = t.filter(|t| t.size() != expect) {
            return Err(ModelError::Input(format!(
                "attention: {name} {} must be {}",
                shape_str(&t.size()),
                shape_str(&expect)
            )));
        }
    }
    if let Some((_, p)) = changes.dropout.filter(|d| !(0.0..1.0).contains(&d.1)) {
        return Err(ModelError::Input(format!(
            "attention: dropout rate {p} must lie in [0, 1)"
        )));
    }
    let allowed = allowed_keys(doc_bounds, b, l, q.device())?;
    let acc = crate::accum_kind(q.kind());
    let (hkv, d) = (k.size()[1], q.size()[3]);
    let f = || -> std::result::Result<Tensor, tch::TchError> {
        // GQA without expanding K/V: the G query heads of a KV head become its query rows,
        // [B, Hkv, G·L, D] · [B, Hkv, D, L] (see the module docs).
        let k = k.f_to_kind(acc)?;
        let v = v.f_to_kind(acc)?;
        let mut scores = q
            .f_to_kind(acc)?
            .f_reshape([b, hkv, -1, d])?
            .f_matmul(&k.f_transpose(-1, -2)?)?
            .f_reshape([b, heads, l, l])?
            .f_mul_scalar(scale)?;
        if let Some(noise) = changes.score_noise {
            scores = scores.f_add(&noise.f_to_kind(acc)?)?;
        }
        let scores = scores.f_masked_fill(&allowed.f_logical_not()?, f64::NEG_INFINITY)?;
        let mut p = scores.f_softmax(-1, acc)?;
        if let Some((keep, rate)) = changes.dropout {
            let keep = keep.f_ne(0)?.f_to_kind(acc)?;
            p = p.f_mul(&keep)?.f_mul_scalar(1.0 / (1.0 - rate))?;
        }
        p.f_reshape([b, hkv, -1, l])?
            .f_matmul(&v)?
            .f_reshape([b, heads, l, d])?
            .f_to_kind(q.kind())
    };
    f().ctx("attention: materialised")
}

/// `[B, 1, L, L]` booleans: query i sees key j ≤ i of its own document.
fn allowed_keys(
    doc_bounds: Option<&DocBoundaries>,
    b: i64,
    l: i64,
    device: Device,
) -> Result<Tensor> {
    let causal = Tensor::f_ones([l, l], (Kind::Bool, device))
        .and_then(|t| t.f_tril(0))
        .ctx("attention: causal mask")?;
    let Some(doc_bounds) = doc_bounds else {
        return causal.f_view([1, 1, l, l]).ctx("attention: causal mask");
    };
    if doc_bounds.rows.len() as i64 != b || doc_bounds.rows.iter().any(|cu| cu.last() != Some(&l)) {
        return Err(ModelError::Input(format!(
            "document boundaries of {} rows for {b} rows of {l} tokens",
            doc_bounds.rows.len()
        )));
    }
    let ids: Vec<i64> = doc_bounds
        .rows
        .iter()
        .flat_map(|cu| {
            cu.windows(2)
                .enumerate()
                .flat_map(|(d, w)| std::iter::repeat_n(d as i64, (w[1] - w[0]) as usize))
        })
        .collect();
    let f = || -> std::result::Result<Tensor, tch::TchError> {
        let ids = Tensor::f_from_slice(&ids)?
            .f_view([b, l])?
            .f_to_device(device)?;
        let same = ids.f_unsqueeze(2)?.f_eq_tensor(&ids.f_unsqueeze(1)?)?;
        same.f_logical_and(&causal)?.f_unsqueeze(1)
    };
    f().ctx("attention: document mask")
}

/// Document boundaries per batch row, cu_seqlens-style: `[0, e1, e2, …, L]`, strictly increasing.
/// Tokens attend only within their document. With a key prefix the boundaries cover the whole
/// sequence `[prefix ; queries]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocBoundaries {
    rows: Vec<Vec<i64>>,
}

impl DocBoundaries {
    /// One boundary list per batch row; each must start at 0 and end at `total_len`.
    pub fn new(rows: Vec<Vec<i64>>, total_len: i64) -> Result<Self> {
        for (r, cu) in rows.iter().enumerate() {
            let ok = cu.len() >= 2
                && cu[0] == 0
                && cu.last() == Some(&total_len)
                && cu.windows(2).all(|w| w[0] < w[1]);
            if !ok {
                return Err(ModelError::Input(format!(
                    "document boundaries of row {r} must be strictly increasing from 0 to the \
                     sequence length {total_len}, got {}",
                    shape_str(cu)
                )));
            }
        }
        Ok(DocBoundaries { rows })
    }

    /// The same boundaries for each of `batch` rows.
    pub fn same_for_all(cu: Vec<i64>, batch: usize, total_len: i64) -> Result<Self> {
        Self::new(vec![cu; batch], total_len)
    }

    /// Parses a boundaries spec for `batch` rows of `total_len` tokens: `"0,5,12"` (the same list
    /// for every row) or `"0,5,12;0,3,12"` (one list per row, separated by `;`).
    pub fn parse(spec: &str, batch: usize, total_len: i64) -> Result<Self> {
        let rows: Vec<Vec<i64>> = spec
            .split(';')
            .map(|r| {
                r.split(',')
                    .map(|x| x.trim().parse::<i64>())
                    .collect::<std::result::Result<Vec<_>, _>>()
            })
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| {
                ModelError::Input(format!(
                    "document boundaries \"{spec}\": expected integers like 0,5,12 (every row) \
                     or 0,5,12;0,3,12 (one list per row)"
                ))
            })?;
        let rows = match rows.len() {
            1 => vec![rows[0].clone(); batch],
            n if n == batch => rows,
            n => {
                return Err(ModelError::Input(format!(
                    "document boundaries \"{spec}\" have {n} rows, the batch has {batch}"
                )))
            }
        };
        Self::new(rows, total_len)
    }

    /// Boundaries of each row.
    pub fn rows(&self) -> &[Vec<i64>] {
        &self.rows
    }
}

/// Causal self-attention of `q` over its own `k`, `v` (`[B, Hkv, Lq, D]`), optionally after a key
/// `prefix` (`[B, Hkv, Lp, D]` each, unmasked), optionally restricted to documents. This is what a
/// decoder layer calls; everything goes through [`attend`].
pub fn attend_documents(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    prefix: Option<(&Tensor, &Tensor)>,
    doc_bounds: Option<&DocBoundaries>,
    scale: f64,
) -> Result<Attended> {
    let lp = prefix
        .map(|(pk, _)| pk.size().get(2).copied().unwrap_or(0))
        .unwrap_or(0);
    let Some(doc_bounds) = doc_bounds else {
        let mut blocks = Vec::with_capacity(2);
        if let Some((pk, pv)) = prefix {
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
        return attend(q, &blocks, scale);
    };
    let (batch, lq) = (q.size()[0], q.size()[2]);
    if doc_bounds.rows.len() as i64 != batch {
        return Err(ModelError::Input(format!(
            "document boundaries have {} rows, the batch has {batch}",
            doc_bounds.rows.len()
        )));
    }
    let mut row_outs = Vec::with_capacity(batch as usize);
    let mut row_lses = Vec::with_capacity(batch as usize);
    for (b, cu) in doc_bounds.rows.iter().enumerate() {
        let end = cu.last().copied().unwrap_or(0);
        if end != lp + lq {
            return Err(ModelError::Input(format!(
                "document boundaries of row {b} end at {end}, the sequence (prefix {lp} + {lq}) \
                 has {} tokens",
                lp + lq
            )));
        }
        let a = attend_row_documents(q, k, v, prefix, b as i64, cu, scale)?;
        row_outs.push(a.out);
        row_lses.push(a.lse);
    }
    Ok(Attended {
        out: Tensor::f_cat(&row_outs, 0).ctx("docs: concat rows")?,
        lse: Tensor::f_cat(&row_lses, 0).ctx("docs: concat rows")?,
    })
}

/// Row `b` of [`attend_documents`] with boundaries `cu` over `[prefix ; queries]`: each document
/// is its own query block, over its own keys (causal) and its part of the prefix (unmasked).
fn attend_row_documents(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    prefix: Option<(&Tensor, &Tensor)>,
    b: i64,
    cu: &[i64],
    scale: f64,
) -> Result<Attended> {
    let lp = prefix
        .map(|(pk, _)| pk.size().get(2).copied().unwrap_or(0))
        .unwrap_or(0);
    let row = |t: &Tensor| t.f_narrow(0, b, 1).ctx("docs");
    let (qb, kb, vb) = (row(q)?, row(k)?, row(v)?);
    let mut outs = Vec::new();
    let mut lses = Vec::new();
    for w in cu.windows(2) {
        let (start, end) = (w[0], w[1]);
        if end <= lp {
            continue; // a document entirely inside the prefix has no queries here
        }
        let qs = start.max(lp) - lp;
        let n = end - lp - qs;
        let seg = |t: &Tensor| t.f_narrow(2, qs, n).ctx("docs: segment");
        let (sq, sk, sv) = (seg(&qb)?, seg(&kb)?, seg(&vb)?);
        let mut blocks = Vec::with_capacity(2);
        let pre;
        if let (Some((pk, pv)), true) = (prefix, start < lp) {
            let pseg = |t: &Tensor| {
                t.f_narrow(0, b, 1)
                    .and_then(|t| t.f_narrow(2, start, lp - start))
                    .ctx("docs: prefix segment")
            };
            pre = (pseg(pk)?, pseg(pv)?);
            blocks.push(KvBlock {
                k: &pre.0,
                v: &pre.1,
                mask: Mask::None,
            });
        }
        blocks.push(KvBlock {
            k: &sk,
            v: &sv,
            mask: Mask::Causal,
        });
        let a = attend(&sq, &blocks, scale)?;
        outs.push(a.out);
        lses.push(a.lse);
    }
    Ok(Attended {
        out: Tensor::f_cat(&outs, 2).ctx("docs: concat")?,
        lse: Tensor::f_cat(&lses, 2).ctx("docs: concat")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).abs().max().double_value(&[])
    }

    fn rand_of(shape: &[i64], kind: Kind) -> Tensor {
        Tensor::randn(shape, (kind, Device::Cpu)).set_requires_grad(true)
    }

    /// Values, LSE and all gradients of the merged path (the C++ autograd function) against the
    /// materialised reference, with GQA, a prefix block and a causal own block, in fp32 and fp64.
    #[test]
    fn merged_blocks_match_reference_values_and_gradients() {
        merged_matches_reference(Kind::Float, 1e-5);
        merged_matches_reference(Kind::Double, 1e-12);
    }

    fn merged_matches_reference(kind: Kind, tol: f64) {
        tch::manual_seed(0);
        let (b, h, hkv, lp, lq, d) = (2, 4, 2, 5, 7, 8);
        let rand = |s: &[i64]| rand_of(s, kind);
        let q = rand(&[b, h, lq, d]);
        let (pk, pv) = (rand(&[b, hkv, lp, d]), rand(&[b, hkv, lp, d]));
        let (k, v) = (rand(&[b, hkv, lq, d]), rand(&[b, hkv, lq, d]));
        let blocks = [
            KvBlock {
                k: &pk,
                v: &pv,
                mask: Mask::None,
            },
            KvBlock {
                k: &k,
                v: &v,
                mask: Mask::Causal,
            },
        ];
        let scale = 1.0 / (d as f64).sqrt();
        let g = Tensor::randn([b, h, lq, d], (kind, Device::Cpu));
        let grads = |a: Attended| {
            (a.out * &g).sum(kind).backward();
            let gs: Vec<Tensor> = [&q, &pk, &pv, &k, &v]
                .iter()
                .map(|t| t.grad().copy())
                .collect();
            for t in [&q, &pk, &pv, &k, &v] {
                let _ = t.grad().zero_();
            }
            gs
        };
        let fast = attend(&q, &blocks, scale).unwrap();
        let slow = attend_reference(&q, &blocks, scale).unwrap();
        assert!(max_diff(&fast.out, &slow.out) < tol);
        assert!(max_diff(&fast.lse, &slow.lse) < tol);
        assert!(
            !fast.lse.requires_grad(),
            "the LSE is a value, not differentiable"
        );
        let gf = grads(fast);
        let gs = grads(slow);
        for (name, (a, b)) in ["q", "prefix k", "prefix v", "k", "v"]
            .iter()
            .zip(gf.iter().zip(&gs))
        {
            let d = max_diff(a, b);
            assert!(
                d < tol,
                "gradient of {name} differs by {d} ({})",
                crate::kind_name(kind)
            );
            assert!(
                b.abs().max().double_value(&[]) > 1e-3,
                "gradient of {name} is trivially 0"
            );
        }
    }

    /// Head layouts under test: (H, Hkv) with H / Hkv ∈ {1, 2, 4}, Hkv = H included.
    const GQA_HEADS: [(i64, i64); 4] = [(4, 4), (4, 2), (4, 1), (8, 2)];
    const FP64_TOL: f64 = 1e-10;

    /// Gradients of `Σ out·g` with respect to `inputs` (not accumulated into `.grad()`).
    fn grads(out: &Tensor, g: &Tensor, inputs: &[&Tensor]) -> Vec<Tensor> {
        let loss = (out * g).sum(Kind::Double);
        Tensor::run_backward(&[loss], inputs, false, false)
    }

    /// `what`: every gradient (and the values) within `FP64_TOL` of the reference and not
    /// trivially 0.
    fn assert_close(what: &str, names: &[&str], fast: &[Tensor], slow: &[Tensor]) {
        assert_eq!(fast.len(), slow.len());
        for ((name, a), b) in names.iter().zip(fast).zip(slow) {
            assert_eq!(a.size(), b.size(), "{what}: {name} shape");
            let d = max_diff(a, b);
            assert!(d < FP64_TOL, "{what}: {name} differs by {d}");
            assert!(
                b.abs().max().double_value(&[]) > 1e-3,
                "{what}: {name} is trivially 0"
            );
        }
    }

    /// Every block combination of [`attend`] (causal only = plain CLM, prefix only, prefix +
    /// causal) with GQA never expanded equals the expanding reference: values, LSE and the
    /// gradients of q and every K/V, in fp64.
    #[test]
    fn gqa_paths_match_reference_values_and_gradients() {
        tch::manual_seed(5);
        let (b, lp, lq, d) = (2, 6, 7, 8);
        let rand = |s: &[i64]| rand_of(s, Kind::Double);
        for (h, hkv) in GQA_HEADS {
            let q = rand(&[b, h, lq, d]);
            let (pk, pv) = (rand(&[b, hkv, lp, d]), rand(&[b, hkv, lp, d]));
            let (k, v) = (rand(&[b, hkv, lq, d]), rand(&[b, hkv, lq, d]));
            let g = Tensor::randn([b, h, lq, d], (Kind::Double, Device::Cpu));
            let prefix = KvBlock {
                k: &pk,
                v: &pv,
                mask: Mask::None,
            };
            let own = KvBlock {
                k: &k,
                v: &v,
                mask: Mask::Causal,
            };
            let cases: [(&str, Vec<KvBlock<'_>>, Vec<&Tensor>); 3] = [
                ("causal only", vec![own], vec![&q, &k, &v]),
                ("prefix only", vec![prefix], vec![&q, &pk, &pv]),
                (
                    "prefix + causal",
                    vec![prefix, own],
                    vec![&q, &pk, &pv, &k, &v],
                ),
            ];
            for (name, blocks, inputs) in cases {
                let what = format!("{name}, H {h}, Hkv {hkv}");
                let fast = attend(&q, &blocks, 0.35).unwrap();
                let slow = attend_reference(&q, &blocks, 0.35).unwrap();
                assert!(!fast.lse.requires_grad(), "{what}: the LSE is a value");
                assert_close(
                    &what,
                    &["out", "lse"],
                    &[fast.out.shallow_clone(), fast.lse.shallow_clone()],
                    &[slow.out.shallow_clone(), slow.lse.shallow_clone()],
                );
                let names = ["dq", "dk (first block)", "dv (first block)", "dk", "dv"];
                assert_close(
                    &what,
                    &names[..inputs.len()],
                    &grads(&fast.out, &g, &inputs),
                    &grads(&slow.out, &g, &inputs),
                );
            }
        }
    }

    /// The reference for documents: each document segment's queries over its part of the prefix
    /// (unmasked) and its own keys (causal), through [`attend_reference`], row by row.
    fn documents_reference(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        prefix: Option<(&Tensor, &Tensor)>,
        doc_bounds: &DocBoundaries,
    ) -> Tensor {
        let lp = prefix.map_or(0, |(pk, _)| pk.size()[2]);
        let mut rows = Vec::new();
        for (r, cu) in doc_bounds.rows().iter().enumerate() {
            let row = |t: &Tensor| t.narrow(0, r as i64, 1);
            let mut segs = Vec::new();
            for w in cu.windows(2).filter(|w| w[1] > lp) {
                let (qs, n) = (w[0].max(lp) - lp, w[1] - w[0].max(lp));
                let seg = |t: &Tensor| row(t).narrow(2, qs, n);
                let (sk, sv) = (seg(k), seg(v));
                let pre = prefix.filter(|_| w[0] < lp).map(|(pk, pv)| {
                    (
                        row(pk).narrow(2, w[0], lp - w[0]),
                        row(pv).narrow(2, w[0], lp - w[0]),
                    )
                });
                let mut blocks = Vec::new();
                if let Some((pk, pv)) = &pre {
                    blocks.push(KvBlock {
                        k: pk,
                        v: pv,
                        mask: Mask::None,
                    });
                }
                blocks.push(KvBlock {
                    k: &sk,
                    v: &sv,
                    mask: Mask::Causal,
                });
                segs.push(attend_reference(&seg(q), &blocks, 0.35).unwrap().out);
            }
            rows.push(Tensor::cat(&segs, 2));
        }
        Tensor::cat(&rows, 0)
    }

    /// Documents (with and without a prefix, a document straddling it) with GQA never expanded
    /// equal the expanding reference per document: values and gradients in fp64.
    #[test]
    fn gqa_documents_match_reference_values_and_gradients() {
        tch::manual_seed(6);
        let (lp, lq, d) = (4, 9, 8);
        let rand = |s: &[i64]| rand_of(s, Kind::Double);
        for (h, hkv) in GQA_HEADS {
            let q = rand(&[2, h, lq, d]);
            let (pk, pv) = (rand(&[2, hkv, lp, d]), rand(&[2, hkv, lp, d]));
            let (k, v) = (rand(&[2, hkv, lq, d]), rand(&[2, hkv, lq, d]));
            let g = Tensor::randn([2, h, lq, d], (Kind::Double, Device::Cpu));
            let what = format!("documents, H {h}, Hkv {hkv}");
            let doc_bounds = DocBoundaries::new(vec![vec![0, 3, 7, 9], vec![0, 9]], lq).unwrap();
            let fast = attend_documents(&q, &k, &v, None, Some(&doc_bounds), 0.35)
                .unwrap()
                .out;
            let slow = documents_reference(&q, &k, &v, None, &doc_bounds);
            let names = ["out", "dq", "dk", "dv"];
            let mut f = vec![fast.shallow_clone()];
            f.extend(grads(&fast, &g, &[&q, &k, &v]));
            let mut s = vec![slow.shallow_clone()];
            s.extend(grads(&slow, &g, &[&q, &k, &v]));
            assert_close(&what, &names, &f, &s);
            // Over [prefix ; queries] = 13 tokens; the document [2, 6) straddles the prefix.
            let doc_bounds =
                DocBoundaries::new(vec![vec![0, 2, 6, 13], vec![0, 13]], lp + lq).unwrap();
            let prefix = Some((&pk, &pv));
            let fast = attend_documents(&q, &k, &v, prefix, Some(&doc_bounds), 0.35)
                .unwrap()
                .out;
            let slow = documents_reference(&q, &k, &v, prefix, &doc_bounds);
            let inputs = [&q, &pk, &pv, &k, &v];
            let names = ["out", "dq", "dpk", "dpv", "dk", "dv"];
            let mut f = vec![fast.shallow_clone()];
            f.extend(grads(&fast, &g, &inputs));
            let mut s = vec![slow.shallow_clone()];
            s.extend(grads(&slow, &g, &inputs));
            assert_close(&format!("{what}, prefix"), &names, &f, &s);
        }
    }

    /// The materialised path with GQA never expanded equals the expanding reference (plain and per
    /// document), values and gradients in fp64; with score noise and dropout it equals itself
    /// run on K/V expanded beforehand, so each query head meets its own KV head's scores.
    #[test]
    fn gqa_materialised_matches_reference_values_and_gradients() {
        tch::manual_seed(7);
        let (b, l, d) = (2, 9, 8);
        let rand = |s: &[i64]| rand_of(s, Kind::Double);
        for (h, hkv) in GQA_HEADS {
            let q = rand(&[b, h, l, d]);
            let (k, v) = (rand(&[b, hkv, l, d]), rand(&[b, hkv, l, d]));
            let g = Tensor::randn([b, h, l, d], (Kind::Double, Device::Cpu));
            let inputs = [&q, &k, &v];
            let names = ["out", "dq", "dk", "dv"];
            let what = format!("materialised, H {h}, Hkv {hkv}");
            let doc_bounds = DocBoundaries::new(vec![vec![0, 4, 9], vec![0, 2, 9]], l).unwrap();
            for doc_bounds in [None, Some(&doc_bounds)] {
                let none = ScoreChanges::default();
                let fast = attend_materialised(&q, &k, &v, doc_bounds, 0.35, &none).unwrap();
                let slow = match doc_bounds {
                    None => {
                        let own = KvBlock {
                            k: &k,
                            v: &v,
                            mask: Mask::Causal,
                        };
                        attend_reference(&q, &[own], 0.35).unwrap().out
                    }
                    Some(doc_bounds) => documents_reference(&q, &k, &v, None, doc_bounds),
                };
                let mut f = vec![fast.shallow_clone()];
                f.extend(grads(&fast, &g, &inputs));
                let mut s = vec![slow.shallow_clone()];
                s.extend(grads(&slow, &g, &inputs));
                assert_close(
                    &format!("{what}, doc_bounds {}", doc_bounds.is_some()),
                    &names,
                    &f,
                    &s,
                );
            }
            let noise = Tensor::randn([b, h, l, l], (Kind::Double, Device::Cpu));
            let keep = Tensor::rand([b, h, l, l], (Kind::Double, Device::Cpu)).gt(0.3);
            let changes = ScoreChanges {
                score_noise: Some(&noise),
                dropout: Some((&keep, 0.3)),
            };
            let expand = |x: &Tensor| {
                x.unsqueeze(2)
                    .expand([b, hkv, h / hkv, l, d], false)
                    .reshape([b, h, l, d])
            };
            let fast = attend_materialised(&q, &k, &v, None, 0.35, &changes).unwrap();
            let slow =
                attend_materialised(&q, &expand(&k), &expand(&v), None, 0.35, &changes).unwrap();
            let mut f = vec![fast.shallow_clone()];
            f.extend(grads(&fast, &g, &inputs));
            let mut s = vec![slow.shallow_clone()];
            s.extend(grads(&slow, &g, &inputs));
            assert_close(&format!("{what}, noise and dropout"), &names, &f, &s);
        }
    }

    /// Several unmasked blocks are one prefix (joined); two causal blocks are refused.
    #[test]
    fn prefix_blocks_join_and_two_causal_blocks_are_refused() {
        tch::manual_seed(3);
        let (h, lp, lq, d) = (2, 6, 5, 8);
        let t = |l: i64| Tensor::randn([1, h, l, d], (Kind::Float, Device::Cpu));
        let (q, k, v, pk, pv) = (t(lq), t(lq), t(lq), t(lp), t(lp));
        let blk = |k, v, mask| KvBlock { k, v, mask };
        let (pk1, pk2) = (pk.narrow(2, 0, 2), pk.narrow(2, 2, lp - 2));
        let (pv1, pv2) = (pv.narrow(2, 0, 2), pv.narrow(2, 2, lp - 2));
        let split = [
            blk(&pk1, &pv1, Mask::None),
            blk(&pk2, &pv2, Mask::None),
            blk(&k, &v, Mask::Causal),
        ];
        let one = [blk(&pk, &pv, Mask::None), blk(&k, &v, Mask::Causal)];
        let a = attend(&q, &split, 0.3).unwrap();
        let b = attend_reference(&q, &one, 0.3).unwrap();
        assert!(max_diff(&a.out, &b.out) < 1e-5);
        let two = [blk(&k, &v, Mask::Causal), blk(&k, &v, Mask::Causal)];
        let e = attend(&q, &two, 0.3).unwrap_err().to_string();
        assert!(e.contains("2 causal key blocks"), "{e}");
    }

    /// Prefix + own block equals one causal pass over the concatenation (the skip-view reuse).
    #[test]
    fn prefix_reuse_equals_full_causal_pass() {
        tch::manual_seed(1);
        let (h, l, s, d) = (2, 9, 4, 8);
        let q = Tensor::randn([1, h, l, d], (Kind::Float, Device::Cpu));
        let k = Tensor::randn([1, h, l, d], (Kind::Float, Device::Cpu));
        let v = Tensor::randn([1, h, l, d], (Kind::Float, Device::Cpu));
        let full = attend_documents(&q, &k, &v, None, None, 0.3).unwrap();
        let tail = |t: &Tensor| t.narrow(2, s, l - s);
        let head = |t: &Tensor| t.narrow(2, 0, s);
        let part = attend_documents(
            &tail(&q),
            &tail(&k),
            &tail(&v),
            Some((&head(&k), &head(&v))),
            None,
            0.3,
        )
        .unwrap();
        assert!(max_diff(&part.out, &tail(&full.out)) < 1e-6);
        assert!(max_diff(&part.lse, &tail(&full.lse)) < 1e-6);
    }

    /// Document masking equals separate runs per document, also across a prefix boundary.
    #[test]
    fn documents_equal_separate_runs() {
        tch::manual_seed(2);
        let (h, l, d) = (2, 10, 8);
        let t = || Tensor::randn([1, h, l, d], (Kind::Float, Device::Cpu));
        let (q, k, v) = (t(), t(), t());
        let cu = vec![0, 3, 8, 10];
        let doc_bounds = DocBoundaries::same_for_all(cu.clone(), 1, l).unwrap();
        let masked = attend_documents(&q, &k, &v, None, Some(&doc_bounds), 0.3).unwrap();
        for w in cu.windows(2) {
            let seg = |x: &Tensor| x.narrow(2, w[0], w[1] - w[0]);
            let alone = attend_documents(&seg(&q), &seg(&k), &seg(&v), None, None, 0.3).unwrap();
            assert!(max_diff(&seg(&masked.out), &alone.out) < 1e-6);
        }
        // Same documents, first 5 tokens as a prefix: the document [3, 8) straddles it.
        let (head, tail) = (
            |x: &Tensor| x.narrow(2, 0, 5),
            |x: &Tensor| x.narrow(2, 5, 5),
        );
        let part = attend_documents(
            &tail(&q),
            &tail(&k),
            &tail(&v),
            Some((&head(&k), &head(&v))),
            Some(&doc_bounds),
            0.3,
        )
        .unwrap();
        assert!(max_diff(&part.out, &tail(&masked.out)) < 1e-6);
    }

    /// The materialised path equals the fused one without changes (with GQA and documents);
    /// noise of 0 and dropout of 0 change nothing; a dropout mask zeroes exactly its entries.
    #[test]
    fn materialised_attention_equals_fused_and_applies_changes() {
        tch::manual_seed(4);
        let (b, h, hkv, l, d) = (2, 4, 2, 9, 8);
        let t = |heads| Tensor::randn([b, heads, l, d], (Kind::Float, Device::Cpu));
        let (q, k, v) = (t(h), t(hkv), t(hkv));
        let doc_bounds = DocBoundaries::new(vec![vec![0, 4, 9], vec![0, 9]], l).unwrap();
        for doc_bounds in [None, Some(&doc_bounds)] {
            let fused = attend_documents(&q, &k, &v, None, doc_bounds, 0.3)
                .unwrap()
                .out;
            let none = attend_materialised(&q, &k, &v, doc_bounds, 0.3, &ScoreChanges::default());
            assert!(max_diff(&fused, &none.unwrap()) < 1e-5);
            let zeros = Tensor::zeros([b, h, l, l], (Kind::Float, Device::Cpu));
            let ones = Tensor::ones([b, h, l, l], (Kind::Float, Device::Cpu));
            let changes = ScoreChanges {
                score_noise: Some(&zeros),
                dropout: Some((&ones, 0.0)),
            };
            let same = attend_materialised(&q, &k, &v, doc_bounds, 0.3, &changes).unwrap();
            assert!(max_diff(&fused, &same) < 1e-5);
        }
        // Dropping every key of query row 3 (rate ½) zeroes its output; the rest doubles.
        let keep = Tensor::ones([b, h, l, l], (Kind::Float, Device::Cpu));
        let _ = keep.narrow(2, 3, 1).fill_(0.0);
        let changes = ScoreChanges {
            score_noise: None,
            dropout: Some((&keep, 0.5)),
        };
        let dropped = attend_materialised(&q, &k, &v, None, 0.3, &changes).unwrap();
        let plain = attend_documents(&q, &k, &v, None, None, 0.3).unwrap().out;
        assert!(dropped.narrow(2, 3, 1).abs().max().double_value(&[]) == 0.0);
        assert!(max_diff(&dropped.narrow(2, 0, 3), &(plain.narrow(2, 0, 3) * 2.0)) < 1e-5);
        let e = attend_materialised(
            &q,
            &k,
            &v,
            None,
            0.3,
            &ScoreChanges {
                score_noise: Some(&keep.narrow(3, 0, 2)),
                dropout: None,
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("score noise"), "{e}");
    }

    #[test]
    fn bad_inputs_are_errors() {
        let q = Tensor::zeros([1, 2, 4, 8], (Kind::Float, Device::Cpu));
        let k = Tensor::zeros([1, 2, 3, 8], (Kind::Float, Device::Cpu));
        let e = attend(
            &q,
            &[KvBlock {
                k: &k,
                v: &k,
                mask: Mask::Causal,
            }],
            1.0,
        )
        .unwrap_err();
        assert!(e.to_string().contains("incompatible"), "{e}");
        assert!(DocBoundaries::new(vec![vec![0, 5, 5, 10]], 10).is_err());
        assert!(DocBoundaries::new(vec![vec![0, 9]], 10).is_err());
    }

    #[test]
    fn boundary_specs_parse_for_every_row_or_per_row() {
        let d = DocBoundaries::parse("0,2,5", 2, 5).unwrap();
        assert_eq!(d.rows(), &[vec![0, 2, 5], vec![0, 2, 5]]);
        let d = DocBoundaries::parse("0,2,5; 0, 5", 2, 5).unwrap();
        assert_eq!(d.rows(), &[vec![0, 2, 5], vec![0, 5]]);
        let e = DocBoundaries::parse("0,2,5;0,5;0,5", 2, 5).unwrap_err();
        assert!(e.to_string().contains("3 rows, the batch has 2"), "{e}");
        let e = DocBoundaries::parse("0,x", 1, 5).unwrap_err();
        assert!(e.to_string().contains("expected integers"), "{e}");
        let e = DocBoundaries::parse("0,3", 1, 5).unwrap_err();
        assert!(e.to_string().contains("got [0, 3]"), "{e}");
    }
}
