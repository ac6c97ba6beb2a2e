//! Context parallelism: the N ranks of a context-parallel group share every sequence.
//!
//! A sequence of L rows is cut into 2N equal chunks and rank r holds chunks r and 2N−1−r
//! ("zigzag", as the loader cuts rows): under causal attention an early chunk is cheap and a late
//! one expensive, so each rank gets one of each and the same work. Every layer gathers the
//! group's keys and values (Llama-3's context parallelism: all-gather K/V, here only the KV
//! heads under GQA) and each local chunk attends to the keys of every earlier row, unmasked, and
//! causally to itself, through rsd-model's LSE-merged attention; the gather's backward
//! reduce-scatters the K/V gradients, so the per-rank gradients sum to the single-process one.
//! [`ContextParallel::chunks`] and [`ContextParallel::gather_kv`] are what the model needs
//! ([`rsd_model::ContextChunks`]).
use std::rc::Rc;

use tch::{Kind, Tensor};

use rsd_dist::{Mesh, ProcessGroup};

use crate::perturb::RowView;

use crate::{Error, Result};

/// This rank's place in its context-parallel group, and the K/V gather.
pub struct ContextParallel {
    group: Rc<ProcessGroup>,
}

impl ContextParallel {
    /// Context parallelism over `group` (its ranks share every sequence).
    pub fn new(group: Rc<ProcessGroup>) -> Self {
        ContextParallel { group }
    }

    /// Context parallelism over the mesh's context-parallel group; an error when it has none
    /// (`cp = 1`).
    pub fn of(mesh: &Mesh) -> Result<Self> {
        mesh.cp_group_shared().map(Self::new).ok_or_else(|| {
            Error::Input(format!(
                "context parallelism needs --cp > 1 (the mesh has dp {} × cp {})",
                mesh.dp_size(),
                mesh.cp_size()
            ))
        })
    }

    /// This rank in the group.
    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    /// Ranks sharing a sequence.
    pub fn size(&self) -> usize {
        self.group.size()
    }

    /// The group.
    pub fn group(&self) -> &ProcessGroup {
        &self.group
    }

    /// `(first row, rows)` of this rank's two chunks of a sequence of `len` rows, in local order.
    pub fn chunks(&self, len: i64) -> Result<Vec<(i64, i64)>> {
        zigzag(self.rank() as i64, self.size() as i64, len)
    }

    /// This rank's rows of `t` along `dim` (`len` rows there): its chunks, concatenated.
    pub fn local_rows(&self, t: &Tensor, dim: i64) -> Result<Tensor> {
        let len = t.size()[dim as usize];
        let parts = self
            .chunks(len)?
            .into_iter()
            .map(|(start, n)| t.f_narrow(dim, start, n))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Tensor::f_cat(&parts, dim)?)
    }

    /// This rank's entries of a whole row (its chunks, concatenated).
    pub fn local_of<T: Clone>(&self, full: &[T]) -> Result<Vec<T>> {
        Ok(self
            .chunks(full.len() as i64)?
            .into_iter()
            .flat_map(|(start, n)| full[start as usize..(start + n) as usize].iter().cloned())
            .collect())
    }

    /// This rank's part of a whole row's perturbed view: its chunks of the positions and of the
    /// KL mask. `kl_rows` stays the whole row's count (the KL's per-sample normaliser);
    /// `shared_prefix` is 0 because it is a whole-row quantity: prefix reuse reads it from the
    /// whole view ([`CpBatch`]).
    pub fn local_view(&self, v: &RowView) -> Result<RowView> {
        Ok(RowView {
            positions: self.local_of(&v.positions)?,
            kl_mask: self.local_of(&v.kl_mask)?,
            kl_rows: v.kl_rows,
            shared_prefix: 0,
            kl_norm: v.kl_norm,
            seed: v.seed,
        })
    }

    /// The whole rows of which each rank holds its chunks (`local`: this rank's, `[B][Llocal]`);
    /// a collective.
    pub fn full_rows(&self, local: &[Vec<i64>]) -> Result<Vec<Vec<i64>>> {
        let (b, l_local) = (local.len(), local.first().map_or(0, Vec::len));
        let n = self.size();
        let flat: Vec<i64> = local.iter().flatten().copied().collect();
        // Host integers (positions, token ids the host needs for the views): the group stages
        // them on its device and brings the result back.
        let t = Tensor::f_from_slice(&flat)?.f_view([b as i64, l_local as i64])?;
        let all = Vec::<i64>::try_from(&self.group.all_gather(&t)?.f_reshape([-1])?)?;
        // `all` is [rank][row][local entry]; rank q holds chunks q and 2N−1−q.
        let c = l_local / 2;
        let mut full = vec![vec![0i64; l_local * n]; b];
        for q in 0..n {
            for (row, out) in full.iter_mut().enumerate() {
                let base = (q * b + row) * l_local;
                for (half, chunk) in [(0, q), (1, 2 * n - 1 - q)] {
                    out[chunk * c..(chunk + 1) * c]
                        .copy_from_slice(&all[base + half * c..base + (half + 1) * c]);
                }
            }
        }
        Ok(full)
    }

    /// Every rank's `[B, Hkv, Llocal, D]` rows gathered into `[B, Hkv, L, D]` in sequence order;
    /// differentiable (backward: reduce-scatter of the gradient).
    pub fn gather_kv(&self, t: &Tensor) -> Result<Tensor> {
        let n = self.size() as i64;
        let local = t.size()[2];
        if local % 2 != 0 {
            return Err(Error::Input(format!(
                "context parallelism: {local} local rows are not two equal chunks"
            )));
        }
        // Rank order: [rank 0: chunk 0, chunk 2N−1 | rank 1: chunk 1, chunk 2N−2 | …]. The
        // chunk at rank-order slot `s` is chunk `order[s]`; sequence order takes, for each chunk,
        // its slot.
        let gathered = self.group.all_gather_autograd(t, 2)?;
        let c = local / 2;
        let mut slot_of_chunk = vec![0i64; (2 * n) as usize];
        for r in 0..n {
            slot_of_chunk[r as usize] = 2 * r;
            slot_of_chunk[(2 * n - 1 - r) as usize] = 2 * r + 1;
        }
        let rows: Vec<i64> = slot_of_chunk
            .iter()
            .flat_map(|&slot| slot * c..(slot + 1) * c)
            .collect();
        let index = Tensor::from_slice(&rows)
            .f_to_kind(Kind::Int64)?
            .f_to_device(t.device())?;
        Ok(gathered.f_index_select(2, &index)?)
    }
}

/// A context-parallel micro-batch as the step sees it: the micro-batch itself holds this rank's
/// chunks; this holds what the perturbed view needs of the whole rows. With prefix reuse the
/// perturbed view runs only the rows after the shared prefix, and those rows are re-sharded over
/// the group (zigzag over the suffix itself, see [`suffix_chunks`]), so a rank computes rows
/// whose tokens and perturbed positions it does not hold in its standard-view chunks.
pub struct CpBatch<'a> {
    cp: &'a ContextParallel,
    /// Whole rows' token ids.
    tokens: Vec<Vec<i64>>,
    /// Whole rows' perturbed views (`None` when the objective has none).
    views: Option<Vec<RowView>>,
}

impl<'a> CpBatch<'a> {
    /// From whole rows every rank already holds (the probe reads the whole batch).
    pub fn from_whole(
        cp: &'a ContextParallel,
        tokens: Vec<Vec<i64>>,
        views: Option<Vec<RowView>>,
    ) -> Self {
        CpBatch { cp, tokens, views }
    }

    /// From this rank's chunks `local_tokens` (`[B][Llocal]`): the whole rows are gathered from
    /// the group (a collective; host integers, `L` per row).
    pub fn gather(
        cp: &'a ContextParallel,
        local_tokens: &Tensor,
        views: Option<Vec<RowView>>,
    ) -> Result<Self> {
        let (b, l) = local_tokens.size2()?;
        let flat = Vec::<i64>::try_from(
            &local_tokens
                .f_to_device(tch::Device::Cpu)?
                .f_to_kind(Kind::Int64)?
                .f_reshape([-1])?,
        )?;
        let rows: Vec<Vec<i64>> = flat
            .chunks(l.max(1) as usize)
            .map(<[i64]>::to_vec)
            .collect();
        debug_assert_eq!(rows.len() as i64, b);
        let tokens = cp.full_rows(&rows)?;
        Ok(CpBatch { cp, tokens, views })
    }

    /// The group.
    pub fn cp(&self) -> &ContextParallel {
        self.cp
    }

    /// Whole rows' token ids.
    pub fn tokens(&self) -> &[Vec<i64>] {
        &self.tokens
    }

    /// Whole rows' perturbed views.
    pub fn views(&self) -> Option<&[RowView]> {
        self.views.as_deref()
    }

    /// This rank's parts of the views (what the loss reads, next to the local rows).
    pub fn local_views(&self) -> Result<Option<Vec<RowView>>> {
        self.views
            .as_ref()
            .map(|vs| vs.iter().map(|v| self.cp.local_view(v)).collect())
            .transpose()
    }
}

/// The perturbed suffix `[p, len)` of one row re-sharded over `n` ranks: padded at its end to
/// `padded = 2n·c` rows (`c = ⌈(len − p) / 2n⌉`) and cut zigzag like a sequence of its own, rank
/// `r` taking pieces `r` and `2n−1−r`. Every rank computes `2c` rows and the same causal
/// attention work over the suffix (plus `p` prefix keys per row, the same for all), whatever `p`
/// is; the padding rows come after every real row, so causal attention never lets a real row
/// see them. Returns `(padded, [(first row, rows)])` in whole-row coordinates (`p + …`).
pub fn suffix_chunks(r: i64, n: i64, p: i64, len: i64) -> (i64, Vec<(i64, i64)>) {
    let c = ((len - p).max(1) + 2 * n - 1) / (2 * n);
    let pieces = [(p + r * c, c), (p + (2 * n - 1 - r) * c, c)];
    (2 * n * c, pieces.to_vec())
}

/// Chunks `r` and `2n−1−r` of `len` rows cut into `2n`.
fn zigzag(r: i64, n: i64, len: i64) -> Result<Vec<(i64, i64)>> {
    if len % (2 * n) != 0 {
        return Err(Error::Input(format!(
            "context parallelism over {n} ranks cuts a sequence into {} equal chunks; {len} rows \
             do not divide (the loader pads rows to a multiple)",
            2 * n
        )));
    }
    let c = len / (2 * n);
    Ok(vec![(r * c, c), ((2 * n - 1 - r) * c, c)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zigzag_chunks_tile_the_sequence_and_balance_causal_work() {
        for n in [1i64, 2, 4] {
            let len = 8 * n;
            let mut rows: Vec<i64> = (0..n)
                .flat_map(|r| zigzag(r, n, len).unwrap())
                .flat_map(|(s, c)| s..s + c)
                .collect();
            rows.sort();
            assert_eq!(rows, (0..len).collect::<Vec<_>>());
            // Causal work of a chunk ∝ its keys: every rank's two chunks sum to the same.
            let work: Vec<i64> = (0..n)
                .map(|r| {
                    zigzag(r, n, len)
                        .unwrap()
                        .iter()
                        .map(|&(s, c)| (s..s + c).map(|i| i + 1).sum::<i64>())
                        .sum()
                })
                .collect();
            assert!(work.iter().all(|&w| w == work[0]), "{work:?}");
        }
        assert!(zigzag(0, 2, 10).is_err());
    }

    #[test]
    fn suffix_chunks_tile_the_padded_suffix_with_equal_work() {
        for n in [1i64, 2, 4] {
            for (p, len) in [(0, 16), (5, 16), (15, 16), (3, 40), (39, 40)] {
                let (padded, _) = suffix_chunks(0, n, p, len);
                assert!(
                    padded >= len - p && padded < len - p + 2 * n,
                    "{n} {p} {len}"
                );
                let all: Vec<Vec<(i64, i64)>> =
                    (0..n).map(|r| suffix_chunks(r, n, p, len).1).collect();
                let mut rows: Vec<i64> =
                    all.iter().flatten().flat_map(|&(s, c)| s..s + c).collect();
                rows.sort();
                assert_eq!(rows, (p..p + padded).collect::<Vec<_>>());
                // Causal work over the suffix (keys from p on) and row counts: equal per rank.
                let work: Vec<(i64, i64)> = all
                    .iter()
                    .map(|ch| {
                        let rows: i64 = ch.iter().map(|&(_, c)| c).sum();
                        let pairs = ch
                            .iter()
                            .flat_map(|&(s, c)| s..s + c)
                            .map(|i| i - p + 1)
                            .sum();
                        (rows, pairs)
                    })
                    .collect();
                assert!(work.iter().all(|&w| w == work[0]), "{work:?}");
            }
        }
    }
}
