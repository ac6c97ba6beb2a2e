//! Where this process sits in the data-parallel × context-parallel mesh.
//!
//! The loader deals each global step to DP ranks and cuts every row into zigzag chunks for the CP
//! ranks of a group; both need this process's rank and the size of its group in that dimension.

use serde::{Deserialize, Serialize};

use crate::error::{LoaderError, Result};

/// This process's rank in one parallel dimension, and the number of ranks in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rank {
    /// 0-based rank, below `size`.
    pub rank: usize,
    /// Ranks in the dimension (the degree of parallelism).
    pub size: usize,
}

impl Rank {
    /// Rank 0 of 1: the dimension is not parallel.
    pub const SINGLE: Rank = Rank { rank: 0, size: 1 };

    /// Rank `rank` of `size`.
    pub fn new(rank: usize, size: usize) -> Rank {
        Rank { rank, size }
    }

    /// Whether the dimension has more than one rank.
    pub fn is_parallel(self) -> bool {
        self.size > 1
    }

    fn check(self, name: &str) -> Result<()> {
        if self.size == 0 || self.rank >= self.size {
            return Err(LoaderError::Config(format!(
                "{name}_rank {} of {name}_size {}: need 0 <= rank < size",
                self.rank, self.size
            )));
        }
        Ok(())
    }
}

impl Default for Rank {
    fn default() -> Self {
        Rank::SINGLE
    }
}

/// This process's ranks in the parallel dimensions the loader serves. Serialized as the four flat
/// fields `dp_rank`, `dp_size`, `cp_rank`, `cp_size` (the form saved configs have).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "FlatParallel", into = "FlatParallel")]
pub struct Parallel {
    /// Data parallel: ranks that get different rows of each global step.
    pub dp: Rank,
    /// Context parallel: ranks of one group that share each row, in zigzag chunks.
    pub cp: Rank,
}

impl Parallel {
    /// Reject a rank outside its dimension or an empty dimension.
    pub fn check(&self) -> Result<()> {
        self.dp.check("dp")?;
        self.cp.check("cp")
    }
}

/// The serialized form of [`Parallel`].
#[derive(Serialize, Deserialize)]
struct FlatParallel {
    dp_rank: usize,
    dp_size: usize,
    cp_rank: usize,
    cp_size: usize,
}

impl From<FlatParallel> for Parallel {
    fn from(f: FlatParallel) -> Self {
        Parallel {
            dp: Rank::new(f.dp_rank, f.dp_size),
            cp: Rank::new(f.cp_rank, f.cp_size),
        }
    }
}

impl From<Parallel> for FlatParallel {
    fn from(p: Parallel) -> Self {
        FlatParallel {
            dp_rank: p.dp.rank,
            dp_size: p.dp.size,
            cp_rank: p.cp.rank,
            cp_size: p.cp.size,
        }
    }
}
