//! SplitMix64 (Steele, Lea, Flood 2014): 64-bit state, passes BigCrush, trivially seekable.
//!
//! rsd derives a fresh generator from a key wherever it needs randomness (a shuffle's epoch, a
//! parameter's name, a training row at a step) instead of carrying one stream: results then never
//! depend on what ran before, so resumed and parallel runs draw exactly what a single run would.

/// The golden-ratio increment SplitMix64 adds to its state before every output.
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// SplitMix64's output function applied to `z + GOLDEN`: a cheap, well-mixing 64-bit hash. It is
/// the first output of a generator whose state is `z`.
pub fn mix(z: u64) -> u64 {
    let mut z = z.wrapping_add(GOLDEN);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A SplitMix64 generator.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator starting from a raw state.
    pub fn from_state(state: u64) -> Self {
        SplitMix64 { state }
    }

    /// A generator for the given key parts (mixed so that nearby keys give unrelated streams).
    pub fn keyed(parts: &[u64]) -> Self {
        let mut g = SplitMix64::from_state(0x243f_6a88_85a3_08d3);
        for &p in parts {
            g.state ^= p;
            g.next_u64();
        }
        g
    }

    /// Jumps `n` outputs ahead, as `n` calls of [`SplitMix64::next_u64`] would (the state is a
    /// counter): a long stream can be drawn in parallel pieces with the same values.
    pub fn skip(&mut self, n: u64) {
        self.state = self.state.wrapping_add(GOLDEN.wrapping_mul(n));
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let out = mix(self.state);
        self.state = self.state.wrapping_add(GOLDEN);
        out
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

    /// Uniform float in `[0, 1)` (53 random bits).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_jumps_exactly_n_outputs() {
        let mut a = SplitMix64::from_state(12345);
        let mut b = a.clone();
        for _ in 0..1000 {
            a.next_u64();
        }
        b.skip(1000);
        assert_eq!(a.next_u64(), b.next_u64());
    }

    #[test]
    fn matches_the_reference_sequence() {
        // First outputs of SplitMix64 seeded with 0 (the reference C implementation).
        let mut g = SplitMix64::from_state(0);
        assert_eq!(g.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(g.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(g.next_u64(), 0x06c4_5d18_8009_454f);
        assert_eq!(mix(0), 0xe220_a839_7b1d_cdaf);
    }

    #[test]
    fn keyed_streams_differ_and_repeat() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut g = SplitMix64::keyed(&[1, 2]);
                move |_| g.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..4)
            .map({
                let mut g = SplitMix64::keyed(&[1, 2]);
                move |_| g.next_u64()
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(
            SplitMix64::keyed(&[1, 2]).next_u64(),
            SplitMix64::keyed(&[1, 3]).next_u64()
        );
    }

    #[test]
    fn range_and_uniform_stay_in_bounds() {
        let mut g = SplitMix64::keyed(&[7]);
        let mut seen = [false; 5];
        for _ in 0..1000 {
            let x = g.range(3, 7);
            assert!((3..=7).contains(&x));
            seen[(x - 3) as usize] = true;
            let u = g.uniform();
            assert!((0.0..1.0).contains(&u));
        }
        assert!(
            seen.iter().all(|&s| s),
            "every value of a 5-wide range appears in 1000 draws"
        );
    }
}
