//! A tiny deterministic generator (SplitMix64) for perturbation sampling.
//!
//! The trainer derives one generator per (seed, step, row) instead of carrying a stream: the
//! perturbation of step k never depends on what ran before, so a resumed run samples exactly what
//! an uninterrupted one would, and the "RNG state" in a checkpoint is just the seed and the step.

/// SplitMix64 (Steele, Lea, Flood 2014): 64-bit state, passes BigCrush, trivially seekable.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator for the given key parts (mixed so that nearby keys give unrelated streams).
    pub fn keyed(parts: &[u64]) -> Self {
        let mut g = SplitMix64 {
            state: 0x243f_6a88_85a3_08d3,
        };
        for &p in parts {
            g.state ^= p;
            g.next_u64();
        }
        g
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform integer in `[lo, hi]` (inclusive; `hi >= lo`), by rejection (no modulo bias).
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        debug_assert!(hi >= lo);
        let n = (hi - lo) as u64 + 1;
        let zone = u64::MAX - u64::MAX % n;
        loop {
            let x = self.next_u64();
            if x < zone {
                return lo + (x % n) as i64;
            }
        }
    }

    /// Uniform float in `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_is_inclusive_and_covers() {
        let mut g = SplitMix64::keyed(&[1, 2]);
        let mut seen = [false; 5];
        for _ in 0..500 {
            let x = g.range(3, 7);
            assert!((3..=7).contains(&x));
            seen[(x - 3) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
        assert_ne!(
            SplitMix64::keyed(&[1, 2]).next_u64(),
            SplitMix64::keyed(&[1, 3]).next_u64()
        );
    }
}
