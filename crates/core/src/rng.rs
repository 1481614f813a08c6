//! [`SampleRng`]: the only source of randomness a transform gets, seeded from
//! (seed, epoch, global sample index) so augmentations never depend on worker count or timing.

/// SplitMix64's finalizer: a bijective, well-mixed 64-bit hash.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Derives a 64-bit key from a list of words (seed, epoch, a domain tag, ...).
#[inline]
pub fn derive_key(words: &[u64]) -> u64 {
    let mut h = 0x6a09_e667_f3bc_c909u64;
    for &w in words {
        h = mix64(h ^ mix64(w.wrapping_add(0x9e37_79b9_7f4a_7c15)));
    }
    h
}

/// Domain tags, so the RNG streams of different purposes never coincide: one of them goes
/// into every [`derive_key`] of chute's own.
pub mod tag {
    /// Per-sample randomness ([`super::SampleRng::for_sample`]).
    pub const SAMPLE: u64 = 1;
    /// The global shuffle's permutation.
    pub const GLOBAL: u64 = 2;
    /// The order of shards under a block shuffle.
    pub const SHARDS: u64 = 3;
    /// The order of samples inside a block shuffle's window.
    pub const WINDOW: u64 = 4;
    /// A mixture's choices (component seeds, random picks).
    pub const MIX: u64 = 5;
}

/// A small, fast generator (xoshiro256++) for per-sample augmentation randomness.
///
/// ```
/// use chute_core::SampleRng;
/// let mut a = SampleRng::for_sample(7, 0, 42);
/// let mut b = SampleRng::for_sample(7, 0, 42);
/// assert_eq!(a.next_u64(), b.next_u64());
/// ```
#[derive(Debug, Clone)]
pub struct SampleRng {
    s: [u64; 4],
}

impl SampleRng {
    /// The generator for global sample `index` in `epoch` of a run seeded with `seed`.
    pub fn for_sample(seed: u64, epoch: u64, index: u64) -> Self {
        Self::from_key(derive_key(&[seed, epoch, index, tag::SAMPLE]))
    }

    /// A generator from a 64-bit key (expanded with SplitMix64, as xoshiro's authors advise).
    pub fn from_key(key: u64) -> Self {
        let mut x = key;
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            mix64(x)
        };
        SampleRng {
            s: [next(), next(), next(), next()],
        }
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = (s[0].wrapping_add(s[3])).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// A uniform float in `[0, 1)` with 53 random bits.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform float in `[lo, hi)`.
    #[inline]
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next_f64()
    }

    /// A uniform integer in `[0, n)` without modulo bias (Lemire's method). `n` must be > 0.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            let low = m as u64;
            if low >= n.wrapping_neg() % n {
                return (m >> 64) as u64;
            }
        }
    }

    /// True with probability `p`.
    #[inline]
    pub fn chance(&mut self, p: f64) -> bool {
        self.next_f64() < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_differ_by_sample_and_epoch() {
        let a = SampleRng::for_sample(1, 0, 5).next_u64();
        assert_ne!(a, SampleRng::for_sample(1, 0, 6).next_u64());
        assert_ne!(a, SampleRng::for_sample(1, 1, 5).next_u64());
        assert_ne!(a, SampleRng::for_sample(2, 0, 5).next_u64());
    }

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let mut r = SampleRng::from_key(3);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[r.below(10) as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
        let f = r.uniform(2.0, 3.0);
        assert!((2.0..3.0).contains(&f));
    }
}
