//! AdamW with its state sharded over the data-parallel ranks (`shard_optimizer`, ZeRO-2 style).
//!
//! Replicated AdamW keeps, on every rank, fp32 master weights and two fp32 moments of every
//! parameter: 12 bytes per parameter (96 GB for an 8B model), the largest item of the memory
//! budget. Here each of N ranks keeps 1/N of them, and the summed fp32 gradient is held sharded
//! too:
//!
//! * the parameters are laid out, in `named_parameters` order, in buckets of at most
//!   `grad_bucket_mb` (padded to a multiple of N); rank r owns block r of every bucket;
//! * after the backward each bucket's gradients are reduce-scattered (summed): each rank receives
//!   the global gradient of its block only;
//! * the global gradient norm is the sum of the ranks' block norms (one all-reduce of a scalar),
//!   so clipping is the same as with a replicated optimizer;
//! * each rank applies AdamW to its block (the same arithmetic as [`AdamW`](crate::optim::AdamW),
//!   [`Update`]), then every bucket's new parameters are all-gathered in the model's dtype and
//!   copied into the model.
//!
//! With the same gradients this is the replicated update bit for bit; the one numerical
//! difference is the order of the sums in the norm (last bits of the clip factor) and, for
//! bf16/fp16 models, that the summed gradient stays fp32 instead of being rounded to the model's
//! dtype first. Traffic per step: a reduce-scatter and an all-gather, together the volume of one
//! all-reduce.
//!
//! Checkpoints do not depend on the layout: [`ShardedAdamW::state_tensors`] gathers the full
//! state onto rank 0, which writes the same `optimizer.safetensors` a replicated run writes, and
//! [`ShardedAdamW::load`] reads only this rank's block of each tensor from a memory map of it, so
//! a run saved with N ranks resumes with any number, sharded or not.
use std::path::Path;

use safetensors::{Dtype, SafeTensors};
use tch::{Device, Kind, Tensor};

use rsd_dist::{ProcessGroup, ReduceOp};
use rsd_model::Model;

use crate::optim::{shape as shape_str, AdamWConfig, Update};
use crate::{io_err, Error, Result};

/// One parameter's place in its bucket.
struct Member {
    name: String,
    param: Tensor,
    /// First element in the bucket's flat layout.
    offset: i64,
    numel: i64,
}

/// A run of parameters laid out flat, and this rank's block of it.
struct Bucket {
    members: Vec<Member>,
    /// Elements of the members together.
    used: i64,
    /// Elements per rank: `used` padded to a multiple of the ranks, divided by them.
    block: i64,
    /// Ranks sharing the bucket.
    ranks: i64,
    /// First element of this rank's block in the flat layout.
    start: i64,
    /// Master weights, moments and summed gradient of the block (fp32; fp64 for fp64 models).
    master: Tensor,
    m: Tensor,
    v: Tensor,
    grad: Tensor,
    /// `(start, len)` ranges of the block that belong to decayed parameters (matrices).
    decayed: Vec<(i64, i64)>,
}

/// AdamW over this rank's block of every bucket.
pub struct ShardedAdamW {
    cfg: AdamWConfig,
    buckets: Vec<Bucket>,
    /// Whether the model's dtype is below fp32 (then checkpoints hold `master.*` tensors, as a
    /// replicated optimizer's do).
    low_precision: bool,
    /// Updates applied so far (for the bias corrections).
    pub steps: u64,
}

impl ShardedAdamW {
    /// Zero moments and this rank's block of master weights for every parameter of `model`,
    /// sharded over `group` in buckets of at most `bucket_elems` elements.
    pub fn new(
        model: &Model,
        cfg: AdamWConfig,
        group: &ProcessGroup,
        bucket_elems: usize,
    ) -> Result<Self> {
        let (rank, ranks) = (group.rank() as i64, group.size() as i64);
        let params = model.named_parameters();
        let low_precision = params
            .iter()
            .any(|(_, p)| !matches!(p.kind(), Kind::Float | Kind::Double));
        let state_kind = match params.first() {
            Some((_, p)) if p.kind() == Kind::Double => Kind::Double,
            _ => Kind::Float,
        };
        let mut runs: Vec<Vec<(String, Tensor)>> = Vec::new();
        let mut elems = 0usize;
        for (name, param) in params {
            let n = param.numel();
            match runs.last_mut() {
                Some(run) if elems + n <= bucket_elems => run.push((name, param)),
                _ => {
                    runs.push(vec![(name, param)]);
                    elems = 0;
                }
            }
            elems += n;
        }
        let buckets = tch::no_grad(|| {
            runs.into_iter()
                .map(|run| Bucket::new(run, rank, ranks, state_kind))
                .collect::<Result<Vec<_>>>()
        })?;
        Ok(ShardedAdamW {
            cfg,
            buckets,
            low_precision,
            steps: 0,
        })
    }

    /// Sums the model's gradients over `group`, keeping this rank's block of each bucket (the
    /// model's own gradients are left as they are: the caller zeroes them).
    pub fn reduce_gradients(&mut self, group: &ProcessGroup) -> Result<()> {
        tch::no_grad(|| {
            for b in &mut self.buckets {
                let flat = b.flat(|p| {
                    let g = p.grad();
                    if g.defined() {
                        Ok(g)
                    } else {
                        Ok(p.f_zeros_like()?)
                    }
                })?;
                let block = group.reduce_scatter(&flat, ReduceOp::Sum)?;
                b.grad.f_copy_(&block)?;
            }
            Ok(())
        })
    }

    /// The norm of the summed gradient over all ranks' blocks (every rank gets the same value).
    pub fn grad_norm(&self, group: &ProcessGroup) -> Result<f64> {
        let mut sq = 0f64;
        for b in &self.buckets {
            sq += b
                .grad
                .f_to_kind(Kind::Double)?
                .f_square()?
                .f_sum(Kind::Double)?
                .double_value(&[]);
        }
        let mut t = Tensor::from_slice(&[sq]).f_to_device(group.device())?;
        group.all_reduce(&mut t, ReduceOp::Sum)?;
        Ok(t.f_double_value(&[0])?.sqrt())
    }

    /// One update at rate `lr` with the gradient scaled by `clip` (if any), then the model's
    /// parameters made the new ones everywhere.
    pub fn step(&mut self, group: &ProcessGroup, lr: f64, clip: Option<f64>) -> Result<()> {
        self.steps += 1;
        let update = Update::new(&self.cfg, lr, self.steps);
        tch::no_grad(|| {
            for b in &mut self.buckets {
                if let Some(coef) = clip {
                    let _ = b.grad.f_mul_scalar_(coef)?;
                }
                for &(start, len) in &b.decayed {
                    update.decay(&mut b.master.f_narrow(0, start, len)?)?;
                }
                update.apply(&mut b.master, &b.grad, &mut b.m, &mut b.v)?;
                b.gather_parameters(group)?;
            }
            Ok(())
        })
    }

    /// The whole state, as the replicated optimizer names it (`m.<name>`, `v.<name>`, and
    /// `master.<name>` for bf16/fp16 models), on rank 0 (CPU); an empty list on the others. A
    /// collective: every rank must call it.
    pub fn state_tensors(&self, group: &ProcessGroup) -> Result<Vec<(String, Tensor)>> {
        let mut named = Vec::new();
        for b in &self.buckets {
            let mut parts = vec![("m", &b.m), ("v", &b.v)];
            if self.low_precision {
                parts.push(("master", &b.master));
            }
            for (what, block) in parts {
                let full = group.all_gather(block)?;
                if group.rank() != 0 {
                    continue;
                }
                let full = full.f_to_device(Device::Cpu)?;
                for m in &b.members {
                    let t = full.f_narrow(0, m.offset, m.numel)?.f_view_as(&m.param)?;
                    named.push((format!("{what}.{}", m.name), t.f_contiguous()?));
                }
            }
        }
        Ok(named)
    }

    /// Reads this rank's block of every tensor from `path` (an `optimizer.safetensors` of any
    /// run, sharded or not, at any number of ranks). The model must already hold the
    /// checkpoint's parameters (they are the master weights of an fp32 model).
    pub fn load(&mut self, path: &Path, steps: u64) -> Result<()> {
        let bad = |reason: String| Error::Checkpoint {
            path: path.to_path_buf(),
            reason,
        };
        let file = std::fs::File::open(path).map_err(io_err(path))?;
        // SAFETY: the checkpoint is read-only while the run resumes from it (checkpoints are
        // written to a temporary directory and renamed into place, never modified in place).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err(path))?;
        let st = SafeTensors::deserialize(&map).map_err(|e| bad(e.to_string()))?;
        let low_precision = self.low_precision;
        tch::no_grad(|| {
            for b in &mut self.buckets {
                let kind = b.m.kind();
                b.m.f_copy_(&b.read_block(&st, "m", kind, &bad)?)?;
                b.v.f_copy_(&b.read_block(&st, "v", kind, &bad)?)?;
                let master = if low_precision {
                    b.read_block(&st, "master", kind, &bad)?
                } else {
                    b.flat(|p| Ok(p.shallow_clone()))?
                        .f_narrow(0, b.start, b.block)?
                };
                b.master.f_copy_(&master)?;
            }
            Ok::<(), Error>(())
        })?;
        self.steps = steps;
        Ok(())
    }
}

impl Bucket {
    fn new(run: Vec<(String, Tensor)>, rank: i64, ranks: i64, kind: Kind) -> Result<Self> {
        let mut members = Vec::with_capacity(run.len());
        let mut offset = 0i64;
        for (name, param) in run {
            let numel = param.numel() as i64;
            members.push(Member {
                name,
                param,
                offset,
                numel,
            });
            offset += numel;
        }
        let used = offset;
        let block = (used + ranks - 1) / ranks;
        let start = rank * block;
        let mut decayed = Vec::new();
        for m in &members {
            // Weight decay applies to matrices, as in the replicated optimizer.
            if m.param.dim() < 2 {
                continue;
            }
            let (lo, hi) = (m.offset.max(start), (m.offset + m.numel).min(start + block));
            if lo < hi {
                decayed.push((lo - start, hi - lo));
            }
        }
        let device = members.first().map_or(Device::Cpu, |m| m.param.device());
        let zeros = || Tensor::f_zeros([block], (kind, device));
        let mut bucket = Bucket {
            members,
            used,
            block,
            ranks,
            start,
            master: zeros()?,
            m: zeros()?,
            v: zeros()?,
            grad: zeros()?,
            decayed,
        };
        let master = bucket
            .flat(|p| Ok(p.shallow_clone()))?
            .f_narrow(0, start, block)?;
        bucket.master.f_copy_(&master)?;
        Ok(bucket)
    }

    /// `of(param)` of every member, in the state's dtype, laid out flat and zero-padded to
    /// `block · ranks` elements.
    fn flat(&self, of: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
        let kind = self.m.kind();
        let mut parts = Vec::with_capacity(self.members.len() + 1);
        for m in &self.members {
            parts.push(of(&m.param)?.f_reshape([-1])?.f_to_kind(kind)?);
        }
        let total = self.block * self.ranks;
        if total > self.used {
            parts.push(Tensor::f_zeros(
                [total - self.used],
                (kind, self.m.device()),
            )?);
        }
        Ok(Tensor::f_cat(&parts, 0)?)
    }

    /// All-gathers the ranks' blocks of master weights in the model's dtype and copies them into
    /// the model's parameters.
    fn gather_parameters(&self, group: &ProcessGroup) -> Result<()> {
        let Some(first) = self.members.first() else {
            return Ok(());
        };
        let block = self
            .master
            .f_to_kind(first.param.kind())?
            .f_to_device(first.param.device())?;
        let full = group
            .all_gather(&block)?
            .f_to_device(first.param.device())?;
        for m in &self.members {
            let new = full.f_narrow(0, m.offset, m.numel)?.f_view_as(&m.param)?;
            m.param.shallow_clone().f_copy_(&new)?;
        }
        Ok(())
    }

    /// This rank's block of the flat layout of `<what>.<name>` over the members, read from `st`.
    fn read_block(
        &self,
        st: &SafeTensors,
        what: &str,
        kind: Kind,
        bad: &dyn Fn(String) -> Error,
    ) -> Result<Tensor> {
        let (lo, hi) = (self.start, self.start + self.block);
        let mut parts = Vec::new();
        for m in &self.members {
            let key = format!("{what}.{}", m.name);
            let view = st
                .tensor(&key)
                .map_err(|_| bad(format!("missing optimizer tensor {key}")))?;
            let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
            if shape != m.param.size() {
                return Err(bad(format!(
                    "{key}: shape {}, expected {}",
                    shape_str(&shape),
                    shape_str(&m.param.size())
                )));
            }
            let (a, b) = (m.offset.max(lo), (m.offset + m.numel).min(hi));
            if a >= b {
                continue;
            }
            let (file_kind, width) = match view.dtype() {
                Dtype::F32 => (Kind::Float, 4),
                Dtype::F64 => (Kind::Double, 8),
                other => {
                    return Err(bad(format!(
                        "{key}: dtype {other}, expected F32 or F64 (optimizer state is fp32)"
                    )))
                }
            };
            let bytes =
                &view.data()[((a - m.offset) * width) as usize..((b - m.offset) * width) as usize];
            let t = Tensor::f_from_data_size(bytes, &[b - a], file_kind)?
                .f_to_kind(kind)?
                .f_to_device(self.m.device())?;
            parts.push(t);
        }
        let have: i64 = parts.iter().map(|t| t.size()[0]).sum();
        if have < self.block {
            parts.push(Tensor::f_zeros(
                [self.block - have],
                (kind, self.m.device()),
            )?);
        }
        Ok(Tensor::f_cat(&parts, 0)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A norm (5), a matrix (3×4) and a norm (7): 24 elements; over 5 ranks blocks of 5, the
    /// last padded by one.
    fn run() -> Vec<(String, Tensor)> {
        vec![
            ("a".into(), Tensor::arange(5, (Kind::Float, Device::Cpu))),
            (
                "w".into(),
                Tensor::arange_start(100, 112, (Kind::Float, Device::Cpu)).reshape([3, 4]),
            ),
            (
                "b".into(),
                Tensor::arange_start(200, 207, (Kind::Float, Device::Cpu)),
            ),
        ]
    }

    fn flat_of(run: &[(String, Tensor)]) -> Vec<f32> {
        run.iter()
            .flat_map(|(_, t)| Vec::<f32>::try_from(t.reshape([-1])).unwrap())
            .collect()
    }

    #[test]
    fn the_ranks_blocks_tile_the_bucket_and_decay_only_matrices() {
        let flat = flat_of(&run());
        for ranks in [1, 2, 3, 5] {
            let mut joined = Vec::new();
            let mut decayed = Vec::new();
            for rank in 0..ranks {
                let b = Bucket::new(run(), rank, ranks, Kind::Float).unwrap();
                assert_eq!(b.block * ranks, (24 + ranks - 1) / ranks * ranks);
                joined.extend(Vec::<f32>::try_from(&b.master).unwrap());
                decayed.extend(b.decayed.iter().map(|&(s, n)| (b.start + s, n)));
            }
            // The blocks in rank order are the parameters, then zero padding.
            assert_eq!(&joined[..24], &flat[..], "{ranks} ranks");
            assert!(joined[24..].iter().all(|&x| x == 0.0));
            // The decayed ranges cover exactly the matrix's elements 5..17.
            let covered: Vec<i64> = decayed.iter().flat_map(|&(s, n)| s..s + n).collect();
            assert_eq!(covered, (5..17).collect::<Vec<_>>(), "{ranks} ranks");
        }
    }

    #[test]
    fn each_rank_reads_its_block_of_a_saved_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("optimizer.safetensors");
        let named: Vec<(String, Tensor)> = run()
            .into_iter()
            .map(|(n, t)| (format!("m.{n}"), t.f_mul_scalar(2.0).unwrap()))
            .collect();
        Tensor::write_safetensors(&named, &path).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let st = SafeTensors::deserialize(&map).unwrap();
        let bad = |r: String| Error::Input(r);
        let want: Vec<f32> = flat_of(&run()).iter().map(|x| 2.0 * x).collect();
        for ranks in [2, 5] {
            let mut joined = Vec::new();
            for rank in 0..ranks {
                let b = Bucket::new(run(), rank, ranks, Kind::Float).unwrap();
                let block = b.read_block(&st, "m", Kind::Float, &bad).unwrap();
                assert_eq!(block.size(), [b.block]);
                joined.extend(Vec::<f32>::try_from(&block).unwrap());
            }
            assert_eq!(&joined[..24], &want[..]);
            assert!(joined[24..].iter().all(|&x| x == 0.0));
        }
        let b = Bucket::new(run(), 0, 2, Kind::Float).unwrap();
        let e = b.read_block(&st, "v", Kind::Float, &bad).unwrap_err();
        assert!(
            e.to_string().contains("missing optimizer tensor v.a"),
            "{e}"
        );
    }
}
