//! An exact port of the parts of CPython's `random.Random` that `Random.sample` needs, so that
//! rsd can reproduce lm-evaluation-harness's few-shot draws bit for bit.
//!
//! lm-eval (0.4.x) gives every task one `random.Random(fewshot_random_seed)` (default 1234) and
//! its default few-shot sampler calls `rnd.sample(fewshot_docs, n)` once per evaluated document,
//! in document order, on that one shared generator. Matching its prompts therefore needs the same
//! Mersenne Twister, the same integer seeding, the same `getrandbits`, the same rejection
//! sampling in `_randbelow` and the same two-branch `sample`, all consuming the stream in the
//! same order. [`PyRandom`] is that generator; [`PyRandom::sample`] returns the indices that
//! `Random.sample(range(n), k)` returns, so `sample(docs, k)` is `[docs[i] for i in indices]`.
//!
//! What is followed, from CPython 3.11 (`Modules/_randommodule.c` and `Lib/random.py`):
//! - MT19937 (`genrand_uint32`, `init_genrand`, `init_by_array`) exactly as in `_randommodule.c`
//!   (Matsumoto and Nishimura's 2002 reference code);
//! - `random_seed` for an int: the absolute value split into 32-bit words, least significant
//!   first, as many words as its bit length needs (one zero word for 0), fed to
//!   `init_by_array`;
//! - `getrandbits(k)`: for `k <= 32` one 32-bit output shifted right by `32 - k` (its top `k`
//!   bits); for larger `k` one output per 32-bit word, least significant word first, the last
//!   (most significant) word keeping the top `k % 32` bits of its output; `k == 0` is 0 and draws
//!   nothing;
//! - `_randbelow_with_getrandbits(n)`: `getrandbits(n.bit_length())` until below `n`;
//! - `sample(population, k)`: the pool branch when `n <= setsize`, else the set branch, with
//!   `setsize = 21`, plus `4 ** ceil(log(k * 3, 4))` when `k > 5`.
//!
//! This module seeds only from integers; CPython's other seed kinds (None, str, bytes, float)
//! are not ported.

use std::collections::HashSet;

/// MT19937's state length in 32-bit words.
const N: usize = 624;
/// MT19937's middle word offset.
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER_MASK: u32 = 0x8000_0000;
const LOWER_MASK: u32 = 0x7fff_ffff;

/// What [`PyRandom`] refuses, where CPython raises `ValueError`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PyRandomError {
    /// `sample` asked for more elements than the population has.
    #[error("sample larger than population: k={k} > n={n}")]
    SampleLargerThanPopulation {
        /// Elements asked for.
        k: usize,
        /// Population size.
        n: usize,
    },
    /// `getrandbits` asked for more bits than a `u64` holds (CPython returns a big int).
    #[error("getrandbits({0}): at most 64 bits are supported")]
    TooManyBits(u32),
    /// `randbelow(0)`: the range is empty (CPython's `_randbelow(0)` would loop forever).
    #[error("randbelow(0): empty range")]
    EmptyRange,
}

/// CPython's `random.Random` (Mersenne Twister MT19937) seeded from an integer; consecutive
/// calls continue one stream, as consecutive calls on one Python `Random` do.
#[derive(Clone)]
pub struct PyRandom {
    mt: [u32; N],
    index: usize,
}

impl std::fmt::Debug for PyRandom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PyRandom")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl PyRandom {
    /// `random.Random(seed)` for a non-negative integer seed.
    pub fn new(seed: u64) -> Self {
        // Truncations intended: the low and high 32-bit words.
        Self::from_le_words(&[seed as u32, (seed >> 32) as u32])
    }

    /// `random.Random(seed)` for a non-negative integer seed below 2**128. A negative Python
    /// seed `s` seeds as `abs(s)` does (CPython takes the absolute value): pass
    /// `s.unsigned_abs()`.
    pub fn from_u128(seed: u128) -> Self {
        let words: Vec<u32> = (0..4).map(|i| (seed >> (32 * i)) as u32).collect();
        Self::from_le_words(&words)
    }

    /// `random.Random(seed)` for any non-negative integer given as its 32-bit words, least
    /// significant first (what CPython's `random_seed` builds from the int). Zero words at the
    /// most significant end are ignored, as they are not part of the int's bit length.
    pub fn from_le_words(words: &[u32]) -> Self {
        let used = words.iter().rposition(|&w| w != 0).map_or(0, |i| i + 1);
        let key: &[u32] = if used == 0 { &[0] } else { &words[..used] };
        let mut r = PyRandom {
            mt: [0; N],
            index: N,
        };
        r.init_by_array(key);
        r
    }

    /// `init_genrand` of the reference code.
    fn init_genrand(&mut self, s: u32) {
        self.mt[0] = s;
        for i in 1..N {
            let prev = self.mt[i - 1];
            self.mt[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        self.index = N;
    }

    /// `init_by_array` of the reference code (`key` is never empty).
    fn init_by_array(&mut self, key: &[u32]) {
        self.init_genrand(19_650_218);
        let mt = &mut self.mt;
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..N.max(key.len()) {
            let prev = mt[i - 1];
            mt[i] = (mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..N - 1 {
            let prev = mt[i - 1];
            mt[i] =
                (mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_566_083_941)).wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
        }
        mt[0] = 0x8000_0000;
    }

    /// The next 32-bit output (`genrand_uint32`; Python's `getrandbits(32)`).
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            let mt = &mut self.mt;
            let twist = |a: u32, b: u32, c: u32| {
                let y = (a & UPPER_MASK) | (b & LOWER_MASK);
                c ^ (y >> 1) ^ if y & 1 == 1 { MATRIX_A } else { 0 }
            };
            for kk in 0..N - M {
                mt[kk] = twist(mt[kk], mt[kk + 1], mt[kk + M]);
            }
            for kk in N - M..N - 1 {
                mt[kk] = twist(mt[kk], mt[kk + 1], mt[kk + M - N]);
            }
            mt[N - 1] = twist(mt[N - 1], mt[0], mt[M - 1]);
            self.index = 0;
        }
        let mut y = self.mt[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// Python's `getrandbits(k)` for `k <= 64` (see the module notes for how it draws).
    pub fn getrandbits(&mut self, k: u32) -> Result<u64, PyRandomError> {
        if k > 64 {
            return Err(PyRandomError::TooManyBits(k));
        }
        Ok(self.bits(k))
    }

    /// `getrandbits(k)` for `k <= 64` (callers check).
    fn bits(&mut self, k: u32) -> u64 {
        match k {
            0 => 0,
            1..=32 => u64::from(self.next_u32() >> (32 - k)),
            _ => {
                // Least significant word first; the last word keeps its top `k - 32` bits.
                let lo = u64::from(self.next_u32());
                let hi = u64::from(self.next_u32() >> (64 - k));
                lo | (hi << 32)
            }
        }
    }

    /// Python's `_randbelow_with_getrandbits(n)`: a uniform integer in `[0, n)` by rejection,
    /// drawing `getrandbits(n.bit_length())` until it is below `n`. `n == 0` is an error.
    pub fn randbelow(&mut self, n: u64) -> Result<u64, PyRandomError> {
        if n == 0 {
            return Err(PyRandomError::EmptyRange);
        }
        Ok(self.randbelow_nonzero(n))
    }

    /// [`PyRandom::randbelow`] for `n >= 1`.
    fn randbelow_nonzero(&mut self, n: u64) -> u64 {
        let k = u64::BITS - n.leading_zeros(); // n.bit_length(): 1..=64 for n >= 1
        loop {
            let r = self.bits(k);
            if r < n {
                return r;
            }
        }
    }

    /// The indices `random.Random.sample(range(n), k)` returns, in selection order (so
    /// `sample(population, k)` is `[population[i] for i in indices]`), advancing the stream as
    /// that call does. `k > n` is an error (CPython's `ValueError`), checked before anything is
    /// drawn.
    pub fn sample(&mut self, n: usize, k: usize) -> Result<Vec<usize>, PyRandomError> {
        if k > n {
            return Err(PyRandomError::SampleLargerThanPopulation { k, n });
        }
        let mut result = Vec::with_capacity(k);
        if (n as u128) <= sample_setsize(k) {
            // The pool branch: the not yet selected items stay in pool[0 .. n - i].
            let mut pool: Vec<usize> = (0..n).collect();
            for i in 0..k {
                let j = self.randbelow_nonzero((n - i) as u64) as usize;
                result.push(pool[j]);
                pool[j] = pool[n - i - 1];
            }
        } else {
            // The set branch: redraw any index already selected.
            let mut selected = HashSet::with_capacity(k);
            for _ in 0..k {
                let mut j = self.randbelow_nonzero(n as u64) as usize;
                while !selected.insert(j) {
                    j = self.randbelow_nonzero(n as u64) as usize;
                }
                result.push(j);
            }
        }
        Ok(result)
    }
}

/// CPython's `setsize` in `Random.sample`: `21`, plus `4 ** ceil(log(k * 3, 4))` when `k > 5`,
/// with `math.log`'s floating-point `log(x) / log(4)` as CPython computes it. The pool branch
/// is taken when `n <= setsize`.
fn sample_setsize(k: usize) -> u128 {
    let mut setsize: u128 = 21;
    if k > 5 {
        let x = (k as u128 * 3) as f64;
        // ceil of a positive finite value below 40 (k < 2**64): the cast is exact.
        let e = (x.ln() / 4f64.ln()).ceil() as u32;
        setsize = setsize.saturating_add(4u128.saturating_pow(e));
    }
    setsize
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Runs `script` under the real CPython (`python3`) and returns its stdout.
    fn python(script: &str, args: &[String]) -> String {
        let out = Command::new("python3")
            .arg("-c")
            .arg(script)
            .args(args)
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "these tests compare with the real CPython and need `python3` on PATH \
                     (could not run it: {e})"
                )
            });
        assert!(
            out.status.success(),
            "python3 failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("python3 printed UTF-8")
    }

    /// Prints one line per call on one generator per seed: the call, then its result (lists
    /// longer than 10 000 as `#sha256` of their comma-joined decimal text).
    const SCRIPT: &str = r##"
import hashlib, random, sys
seeds = [eval(s) for s in sys.argv[1].split(",")]  # "2**70", "-1234"
calls = [c.split(":") for c in sys.argv[2].split(",")]
def show(xs):
    text = ",".join(map(str, xs))
    return "#" + hashlib.sha256(text.encode()).hexdigest() if len(xs) > 10000 else text
for seed in seeds:
    r = random.Random(seed)
    for c in calls:
        if c[0] == "s":
            n, k = int(c[1]), int(c[2])
            try:
                print("s", n, k, show(r.sample(range(n), k)))
            except ValueError:
                print("s", n, k, "ValueError")
        elif c[0] == "r":
            n, count = int(c[1]), int(c[2])
            print("r", n, count, show([r._randbelow(n) for _ in range(count)]))
        else:
            bits, count = int(c[1]), int(c[2])
            print("b", bits, count, show([r.getrandbits(bits) for _ in range(count)]))
"##;

    fn show(xs: &[u64]) -> String {
        let text = xs
            .iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(",");
        if xs.len() > 10_000 {
            use sha2::Digest;
            format!("#{}", crate::hex(&sha2::Sha256::digest(text.as_bytes())))
        } else {
            text
        }
    }

    enum Call {
        Sample(usize, usize),
        Bits(u32, usize),
        Below(u64, usize),
    }

    /// The same calls under CPython and under [`PyRandom`], compared line by line.
    fn compare(seeds: &[(&str, u128)], calls: &[Call]) {
        let arg_calls = calls
            .iter()
            .map(|c| match c {
                Call::Sample(n, k) => format!("s:{n}:{k}"),
                Call::Bits(b, c) => format!("b:{b}:{c}"),
                Call::Below(n, c) => format!("r:{n}:{c}"),
            })
            .collect::<Vec<_>>()
            .join(",");
        let arg_seeds = seeds.iter().map(|s| s.0).collect::<Vec<_>>().join(",");
        let expected = python(SCRIPT, &[arg_seeds, arg_calls]);
        let mut expected = expected.lines();
        for &(py_seed, seed) in seeds {
            let mut r = PyRandom::from_u128(seed);
            for (i, c) in calls.iter().enumerate() {
                let got = match *c {
                    Call::Sample(n, k) => {
                        let res = match r.sample(n, k) {
                            Ok(v) => show(&v.iter().map(|&x| x as u64).collect::<Vec<_>>()),
                            Err(PyRandomError::SampleLargerThanPopulation { .. }) => {
                                "ValueError".to_string()
                            }
                            Err(e) => panic!("unexpected error {e}"),
                        };
                        format!("s {n} {k} {res}")
                    }
                    Call::Bits(b, count) => {
                        let xs: Vec<u64> = (0..count)
                            .map(|_| r.getrandbits(b).expect("k <= 64"))
                            .collect();
                        format!("b {b} {count} {}", show(&xs))
                    }
                    Call::Below(n, count) => {
                        let xs: Vec<u64> = (0..count)
                            .map(|_| r.randbelow(n).expect("n >= 1"))
                            .collect();
                        format!("r {n} {count} {}", show(&xs))
                    }
                };
                let want = expected.next().expect("python printed a line per call");
                if got != want {
                    let (g, w): (Vec<&str>, Vec<&str>) =
                        (got.split(',').collect(), want.split(',').collect());
                    let first = g.iter().zip(&w).position(|(a, b)| a != b);
                    panic!(
                        "seed {py_seed}, call #{i}: differs from CPython (first differing \
                         element: {first:?})\n  rust:    {:.300}\n  cpython: {:.300}",
                        got, want
                    );
                }
            }
        }
        assert!(expected.next().is_none(), "python printed extra lines");
    }

    const SEEDS: &[(&str, u128)] = &[
        ("0", 0),
        ("1", 1),
        ("1234", 1234),
        ("2**32+5", (1 << 32) + 5),
        ("2**70", 1 << 70),
        ("2**32-1", (1 << 32) - 1),
        ("-1234", 1234), // CPython seeds with abs(seed)
    ];

    #[test]
    fn getrandbits_streams_match_cpython() {
        let calls = [
            Call::Bits(32, 2000), // crosses the 624-word regeneration more than once
            Call::Bits(64, 1000),
            Call::Bits(1, 50),
            Call::Bits(31, 50),
            Call::Bits(33, 50),
            Call::Bits(63, 50),
            Call::Bits(0, 5),
            Call::Bits(32, 10),
        ];
        compare(SEEDS, &calls);
    }

    #[test]
    fn consecutive_samples_match_cpython() {
        let mut calls = Vec::new();
        for n in [1usize, 5, 21, 22, 100, 10_000, 1_000_000] {
            for k in [0usize, 1, 5, 6, 20, n] {
                if k <= n {
                    calls.push(Call::Sample(n, k));
                }
            }
            // k > n: an error in both, drawing nothing (the next call must still agree).
            calls.push(Call::Sample(n, n + 1));
        }
        // lm-eval's shape: many documents, each drawing num_fewshot + 1 from a large train split.
        for _ in 0..20 {
            calls.push(Call::Sample(39_905, 11));
            calls.push(Call::Sample(4_957, 5));
        }
        // Populations past 2**32 (two-word getrandbits in _randbelow) and at CPython's size limit.
        calls.push(Call::Sample(1 << 40, 7));
        calls.push(Call::Sample(isize::MAX as usize, 3)); // CPython's len() limit
                                                          // _randbelow itself, with rejection-heavy bounds (just above a power of two) and at
                                                          // the 64-bit limit.
        for n in [1u64, 2, 3, 5, 17, (1 << 32) + 1, (1 << 63) + 1, u64::MAX] {
            calls.push(Call::Below(n, 200));
        }
        calls.push(Call::Bits(32, 3));
        compare(SEEDS, &calls);
    }

    #[test]
    fn both_branches_are_exercised() {
        // setsize 21 for k <= 5; 21 + 4**3 = 85 for k = 20; 21 + 4**5 for k = 100.
        assert_eq!(sample_setsize(5), 21);
        assert_eq!(sample_setsize(20), 85);
        assert_eq!(sample_setsize(100), 21 + 1024);
        let python_setsizes = python(
            "import math\nprint(*[21 + (4 ** math.ceil(math.log(k * 3, 4)) if k > 5 else 0) \
             for k in range(0, 5000)])",
            &[],
        );
        let ours: Vec<String> = (0..5000).map(|k| sample_setsize(k).to_string()).collect();
        assert_eq!(python_setsizes.split_whitespace().collect::<Vec<_>>(), ours);
    }

    #[test]
    fn errors_instead_of_panics() {
        let mut r = PyRandom::new(1234);
        assert_eq!(
            r.sample(3, 4),
            Err(PyRandomError::SampleLargerThanPopulation { k: 4, n: 3 })
        );
        assert_eq!(r.getrandbits(65), Err(PyRandomError::TooManyBits(65)));
        assert_eq!(r.randbelow(0), Err(PyRandomError::EmptyRange));
        assert_eq!(r.sample(0, 0), Ok(vec![]));
    }

    #[test]
    fn seed_constructors_agree() {
        let a = PyRandom::new(0x1_2345_6789).next_u32();
        assert_eq!(PyRandom::from_u128(0x1_2345_6789).next_u32(), a);
        assert_eq!(
            PyRandom::from_le_words(&[0x2345_6789, 1, 0, 0]).next_u32(),
            a
        );
        assert_eq!(
            PyRandom::from_le_words(&[]).next_u32(),
            PyRandom::new(0).next_u32()
        );
    }
}
