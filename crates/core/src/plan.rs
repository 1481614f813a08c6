//! [`Plan`]: which samples a rank reads in an epoch, and in which order.
//!
//! The plan is a pure function of (manifest, seed, epoch, rank, world size, shuffle mode,
//! batch size, drop_last, start). Every rank computes the same epoch order independently and
//! takes its share of it, so ranks are disjoint, cover the epoch exactly once (plus the few
//! repeats `drop_last = false` needs) and all get the same number of samples and batches.
//!
//! - **Epoch order.** A bijection from positions `[0, N)` to global sample ids. `none` is the
//!   identity; `global` is a keyed Feistel network with cycle-walking, computed per position,
//!   so a billion-sample shuffle allocates nothing; `block` shuffles the shard order and then
//!   permutes samples within each window of `window` consecutive shards (memory: one word per
//!   shard), for sources that stream shards.
//! - **Rank split.** `none`/`global`: strided, like `torch.utils.data.DistributedSampler`
//!   (rank `r` takes positions `r, r + W, r + 2W, ...`), so the samples the ranks have consumed
//!   together are always a prefix of the epoch order and a checkpoint can be resumed on another
//!   world size. `block`: contiguous (rank `r` takes the `r`-th slice), so each rank streams
//!   only about `1/W` of the shards.
//! - **Equal counts.** `drop_last = true`: each rank gets `floor(floor(R / W) / B)` full
//!   batches and the rest is dropped. `false`: each rank gets `ceil(R / W)` samples (the last
//!   batch may be short, equally on every rank), the missing `< W` positions repeating the first
//!   positions of the order.
//! - **start** and **taken**: the split covers the positions from `start` on, less the
//!   `taken` ranges (0 and none normally). After an elastic resume they hold what the earlier
//!   world size had read: under the strided split that is a prefix, so `start` moves; under
//!   `block`'s contiguous one each old rank read the head of its slice, and those heads become
//!   `taken` ranges ([`Plan::rest_after`]). `R` is the number of positions left; the split's
//!   `i`-th slot is the `i`-th of them, and ranks divide the `R` slots as above.

use std::fmt;
use std::str::FromStr;

use crate::error::ConfigError;
use crate::manifest::Manifest;
use crate::rng::{SampleRng, derive_key, mix64, tag};

/// How an epoch's samples are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shuffle {
    /// Manifest order.
    None,
    /// A full random permutation of all samples, new each epoch (needs random access).
    Global,
    /// Shard order shuffled per epoch, samples shuffled within windows of `window` shards
    /// (for streaming sources). Shards a manifest groups into units
    /// ([`crate::Manifest::units`]: a Parquet row group's chunks) are read unit by unit: units
    /// in random order, a unit's shards together, in random order.
    Block {
        /// Shards per shuffle window (>= 1).
        window: u32,
    },
}

impl Shuffle {
    /// Default shards per window of `block` mode.
    pub const DEFAULT_WINDOW: u32 = 4;

    /// `block` with the default window.
    pub const fn block() -> Self {
        Shuffle::Block {
            window: Self::DEFAULT_WINDOW,
        }
    }
}

impl fmt::Display for Shuffle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shuffle::None => f.write_str("none"),
            Shuffle::Global => f.write_str("global"),
            Shuffle::Block { window } => write!(f, "block:{window}"),
        }
    }
}

impl FromStr for Shuffle {
    type Err = ConfigError;

    /// `none`, `global`, `block` or `block:W` (W shards per window). `true`/`false` are
    /// accepted as `global`/`none`, as DataLoader users would write.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            ConfigError::new(
                "shuffle",
                format!("{s:?} is not a shuffle mode; use none, global, block or block:N (N >= 1)"),
            )
        };
        match s.to_ascii_lowercase().as_str() {
            "none" | "false" => Ok(Shuffle::None),
            "global" | "true" => Ok(Shuffle::Global),
            "block" => Ok(Shuffle::block()),
            other => {
                let w = other.strip_prefix("block:").ok_or_else(bad)?;
                let window: u32 = w.parse().map_err(|_| bad())?;
                if window == 0 {
                    return Err(bad());
                }
                Ok(Shuffle::Block { window })
            }
        }
    }
}

impl serde::Serialize for Shuffle {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Shuffle {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Most ranks a plan splits an epoch among (2^24): far beyond any job, and small enough that
/// work per old rank (an elastic resume walks them) stays bounded for a hostile state.
pub const MAX_WORLD_SIZE: u64 = 1 << 24;

/// Everything besides the manifest that determines a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanConfig {
    /// Seed of the run.
    pub seed: u64,
    /// Epoch number (the order changes every epoch when shuffling).
    pub epoch: u64,
    /// This rank, in `[0, world_size)`.
    pub rank: u64,
    /// Number of ranks (>= 1).
    pub world_size: u64,
    /// Ordering mode.
    pub shuffle: Shuffle,
    /// Samples per batch (>= 1).
    pub batch_size: u64,
    /// Drop the remainder (true) or pad by repeating samples (false).
    pub drop_last: bool,
    /// Global position in the epoch order where this split begins.
    pub start: u64,
    /// Ranges `[lo, hi)` of positions after `start` that this split skips (read before an
    /// elastic resume of a block-shuffled run): sorted, disjoint and non-empty. Empty
    /// normally.
    pub taken: Vec<(u64, u64)>,
}

impl Default for PlanConfig {
    fn default() -> Self {
        PlanConfig {
            seed: 0,
            epoch: 0,
            rank: 0,
            world_size: 1,
            shuffle: Shuffle::None,
            batch_size: 1,
            drop_last: false,
            start: 0,
            taken: Vec::new(),
        }
    }
}

impl PlanConfig {
    /// Checks ranges; the message names the option and the valid range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.world_size == 0 {
            return Err(ConfigError::new("world_size", "must be at least 1, got 0"));
        }
        if self.world_size > MAX_WORLD_SIZE {
            return Err(ConfigError::new(
                "world_size",
                format!(
                    "{} ranks is more than chute plans for (at most {MAX_WORLD_SIZE})",
                    self.world_size
                ),
            ));
        }
        if self.rank >= self.world_size {
            return Err(ConfigError::new(
                "rank",
                format!(
                    "got {}, must be in [0, world_size) = [0, {})",
                    self.rank, self.world_size
                ),
            ));
        }
        if self.batch_size == 0 {
            return Err(ConfigError::new("batch_size", "must be at least 1, got 0"));
        }
        if let Shuffle::Block { window: 0 } = self.shuffle {
            return Err(ConfigError::new(
                "shuffle",
                "block window must be at least 1 shard",
            ));
        }
        Ok(())
    }
}

/// A keyed pseudo-random permutation of `[0, n)`: a balanced Feistel network over the
/// smallest even-bit domain covering `n`, with cycle-walking for values that land outside.
/// The domain is under `4n`, so a position takes fewer than 4 walks on average.
#[derive(Debug, Clone)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    mask: u64,
    keys: [u64; ROUNDS],
}

const ROUNDS: usize = 6;

impl Permutation {
    /// The permutation of `[0, n)` keyed by `key`.
    pub fn new(n: u64, key: u64) -> Self {
        let bits = if n <= 1 {
            2
        } else {
            64 - (n - 1).leading_zeros()
        };
        let half_bits = bits.div_ceil(2).max(1);
        let mask = if half_bits >= 64 {
            u64::MAX
        } else {
            (1u64 << half_bits) - 1
        };
        let mut keys = [0u64; ROUNDS];
        for (i, k) in keys.iter_mut().enumerate() {
            *k = derive_key(&[key, i as u64]);
        }
        Permutation {
            n,
            half_bits,
            mask,
            keys,
        }
    }

    /// Size of the domain.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// True for the permutation of the empty set.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    #[inline]
    fn encrypt(&self, x: u64) -> u64 {
        let (mut l, mut r) = (x >> self.half_bits, x & self.mask);
        for &k in &self.keys {
            let f = mix64(r ^ k) & self.mask;
            (l, r) = (r, l ^ f);
        }
        (l << self.half_bits) | r
    }

    /// The image of `x`.
    ///
    /// # Panics
    /// If `x >= n`.
    #[inline]
    pub fn apply(&self, x: u64) -> u64 {
        assert!(x < self.n, "position {x} outside permutation of {}", self.n);
        let mut y = self.encrypt(x);
        // Cycle-walking: the Feistel network permutes the power-of-two domain, so following
        // the cycle from x must come back into [0, n) (at the latest at x itself).
        while y >= self.n {
            y = self.encrypt(y);
        }
        y
    }

    /// Replaces each of `xs` by its image, as [`Permutation::apply`] does one by one, but
    /// eight at a time: the rounds of eight independent positions interleave, so the
    /// multiplications overlap instead of waiting on each other (a block shuffle's batch
    /// permutes thousands of positions).
    ///
    /// # Panics
    /// If an element is `>= n`.
    pub fn apply_slice(&self, xs: &mut [u64]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512dq")
        {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { self.apply_slice_avx512(xs) };
        }
        self.apply_lanes(xs);
    }

    /// [`Permutation::apply_slice`] in AVX-512: one vector holds eight positions, and each
    /// Feistel round is a handful of vector instructions (`vpmullq` takes the eight lanes'
    /// multiplies at once). Cycle-walking is a lane mask: the lanes still outside `[0, n)` take
    /// the next image until none is.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512dq")]
    fn apply_slice_avx512(&self, xs: &mut [u64]) {
        use std::arch::x86_64::*;
        let n = _mm512_set1_epi64(self.n as i64);
        let mut chunks = xs.chunks_exact_mut(8);
        for chunk in &mut chunks {
            // SAFETY: the chunk is eight u64s; unaligned loads and stores are allowed.
            let x = unsafe { _mm512_loadu_epi64(chunk.as_ptr().cast()) };
            if _mm512_cmpge_epu64_mask(x, n) != 0 {
                for &x in chunk.iter() {
                    assert!(x < self.n, "position {x} outside permutation of {}", self.n);
                }
            }
            let mut y = self.encrypt_avx512(x);
            let mut outside = _mm512_cmpge_epu64_mask(y, n);
            while outside != 0 {
                let next = self.encrypt_avx512(y);
                y = _mm512_mask_mov_epi64(y, outside, next);
                outside &= _mm512_cmpge_epu64_mask(next, n);
            }
            // SAFETY: as the load.
            unsafe { _mm512_storeu_epi64(chunk.as_mut_ptr().cast(), y) };
        }
        for x in chunks.into_remainder() {
            *x = self.apply(*x);
        }
    }

    /// [`Permutation::encrypt`] of the eight lanes of `x`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512dq")]
    #[inline]
    fn encrypt_avx512(&self, x: std::arch::x86_64::__m512i) -> std::arch::x86_64::__m512i {
        use std::arch::x86_64::*;
        let mask = _mm512_set1_epi64(self.mask as i64);
        let half = _mm_cvtsi64_si128(self.half_bits as i64);
        let m1 = _mm512_set1_epi64(0xbf58_476d_1ce4_e5b9u64 as i64);
        let m2 = _mm512_set1_epi64(0x94d0_49bb_1331_11ebu64 as i64);
        let (mut l, mut r) = (_mm512_srl_epi64(x, half), _mm512_and_si512(x, mask));
        for &k in &self.keys {
            // mix64(r ^ k), as `rng::mix64`.
            let mut z = _mm512_xor_si512(r, _mm512_set1_epi64(k as i64));
            z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64::<30>(z)), m1);
            z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64::<27>(z)), m2);
            z = _mm512_xor_si512(z, _mm512_srli_epi64::<31>(z));
            let f = _mm512_and_si512(z, mask);
            (l, r) = (r, _mm512_xor_si512(l, f));
        }
        _mm512_or_si512(_mm512_sll_epi64(l, half), r)
    }

    #[inline(always)]
    fn apply_lanes(&self, xs: &mut [u64]) {
        const LANES: usize = 8;
        let mut chunks = xs.chunks_exact_mut(LANES);
        for chunk in &mut chunks {
            let mut y = [0u64; LANES];
            for (i, &x) in chunk.iter().enumerate() {
                assert!(x < self.n, "position {x} outside permutation of {}", self.n);
                y[i] = x;
            }
            // Cycle-walking, as in `apply`, for the images outside [0, n): every lane goes
            // round again while any lane is outside, and keeps its first image inside.
            let mut done = [false; LANES];
            loop {
                let next = self.encrypt_lanes(y);
                let mut all = true;
                for i in 0..LANES {
                    if !done[i] {
                        y[i] = next[i];
                        done[i] = next[i] < self.n;
                        all &= done[i];
                    }
                }
                if all {
                    break;
                }
            }
            chunk.copy_from_slice(&y);
        }
        for x in chunks.into_remainder() {
            *x = self.apply(*x);
        }
    }

    /// [`Permutation::encrypt`] of eight positions, their rounds side by side.
    #[inline(always)]
    fn encrypt_lanes(&self, xs: [u64; 8]) -> [u64; 8] {
        let (mut l, mut r) = ([0u64; 8], [0u64; 8]);
        for i in 0..8 {
            l[i] = xs[i] >> self.half_bits;
            r[i] = xs[i] & self.mask;
        }
        for &k in &self.keys {
            for i in 0..8 {
                let f = mix64(r[i] ^ k) & self.mask;
                (l[i], r[i]) = (r[i], l[i] ^ f);
            }
        }
        let mut out = [0u64; 8];
        for i in 0..8 {
            out[i] = (l[i] << self.half_bits) | r[i];
        }
        out
    }
}

#[derive(Debug, Clone)]
enum Order {
    Identity,
    Global(Permutation),
    Block {
        /// Shard ids in this epoch's shuffled order.
        shards: Vec<u32>,
        /// `prefix[i]`: position where the i-th shard of the shuffled order begins.
        prefix: Vec<u64>,
        /// Global id of each original shard's first sample.
        starts: Vec<u64>,
        window: usize,
        key: u64,
    },
}

/// The samples one rank reads in one epoch. Cheap to build; `get` is O(1) for `none` and
/// `global`, O(log shards) for `block`.
#[derive(Debug, Clone)]
pub struct Plan {
    order: Order,
    cfg: PlanConfig,
    /// Samples in the epoch.
    total: u64,
    /// Positions in this split: total - start.
    remaining: u64,
    /// Samples this rank reads.
    len: u64,
    /// Contiguous slice length per rank (block mode).
    per_rank: u64,
    /// For each range of `cfg.taken`: the slot where it would begin, and the positions skipped
    /// up to its end (for slot -> position).
    holes: Vec<(u64, u64)>,
}

impl Plan {
    /// The plan for `cfg` over `manifest`.
    pub fn new(manifest: &Manifest, cfg: &PlanConfig) -> Result<Plan, ConfigError> {
        cfg.validate()?;
        let total = manifest.total_samples();
        if cfg.start > total {
            return Err(ConfigError::new(
                "start",
                format!(
                    "position {} is past the epoch's {} samples",
                    cfg.start, total
                ),
            ));
        }
        let mut holes = Vec::with_capacity(cfg.taken.len());
        let (mut skipped, mut after) = (0u64, cfg.start);
        for &(lo, hi) in &cfg.taken {
            if lo < after || hi <= lo || hi > total {
                return Err(ConfigError::new(
                    "taken",
                    format!(
                        "range [{lo}, {hi}) is not a sorted, disjoint, non-empty range after \
                         start = {} inside the epoch's {total} samples",
                        cfg.start
                    ),
                ));
            }
            holes.push((lo - cfg.start - skipped, skipped + (hi - lo)));
            skipped += hi - lo;
            after = hi;
        }
        let remaining = total - cfg.start - skipped;
        let w = cfg.world_size;
        let (len, per_rank) = if cfg.drop_last {
            let per = remaining / w;
            (per / cfg.batch_size * cfg.batch_size, per)
        } else {
            let per = remaining.div_ceil(w);
            (per, per)
        };
        let order = match cfg.shuffle {
            Shuffle::None => Order::Identity,
            Shuffle::Global => Order::Global(Permutation::new(
                total,
                derive_key(&[cfg.seed, cfg.epoch, tag::GLOBAL]),
            )),
            Shuffle::Block { window } => {
                let n = manifest.shards.len();
                let mut rng = SampleRng::from_key(derive_key(&[cfg.seed, cfg.epoch, tag::SHARDS]));
                let mut shuffle = |items: &mut [u32]| {
                    for i in (1..items.len()).rev() {
                        let j = rng.below(i as u64 + 1) as usize;
                        items.swap(i, j);
                    }
                };
                let shards: Vec<u32> = if manifest.units.is_empty() {
                    let mut shards: Vec<u32> = (0..n as u32).collect();
                    shuffle(&mut shards);
                    shards
                } else {
                    // Units in random order, each unit's shards together, in random order.
                    let units = manifest.unit_ranges();
                    let mut order: Vec<u32> = (0..units.len() as u32).collect();
                    shuffle(&mut order);
                    let mut shards = Vec::with_capacity(n);
                    for &u in &order {
                        let at = shards.len();
                        let r = &units[u as usize];
                        shards.extend(r.start as u32..r.end as u32);
                        shuffle(&mut shards[at..]);
                    }
                    shards
                };
                let mut prefix = Vec::with_capacity(n + 1);
                let mut acc = 0;
                prefix.push(0);
                for &s in &shards {
                    acc += manifest.shards[s as usize].samples;
                    prefix.push(acc);
                }
                let starts = (0..n).map(|i| manifest.shard_start(i)).collect();
                Order::Block {
                    shards,
                    prefix,
                    starts,
                    window: window as usize,
                    key: derive_key(&[cfg.seed, cfg.epoch, tag::WINDOW]),
                }
            }
        };
        Ok(Plan {
            order,
            cfg: cfg.clone(),
            total,
            remaining,
            len,
            per_rank,
            holes,
        })
    }

    /// The configuration this plan was built from.
    pub fn config(&self) -> &PlanConfig {
        &self.cfg
    }

    /// Samples in the whole epoch (all ranks, before dropping or padding).
    pub fn epoch_samples(&self) -> u64 {
        self.total
    }

    /// Samples this rank reads in this epoch (equal on every rank).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when this rank reads nothing this epoch.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Batches this rank delivers in this epoch (equal on every rank).
    pub fn num_batches(&self) -> u64 {
        self.len.div_ceil(self.cfg.batch_size)
    }

    /// True when ranks take contiguous slices (block mode) rather than strided positions.
    pub fn is_contiguous(&self) -> bool {
        matches!(self.order, Order::Block { .. })
    }

    /// The slot of the split (see the module doc) holding this rank's `i`-th sample, before
    /// padding wraps it; `>= R` for a padding slot.
    fn slot(&self, i: u64) -> u64 {
        if self.is_contiguous() {
            self.cfg.rank * self.per_rank + i
        } else {
            i * self.cfg.world_size + self.cfg.rank
        }
    }

    /// The position (in the epoch order) of slot `v`; padding slots repeat the first slots.
    #[inline]
    fn position(&self, v: u64) -> u64 {
        let v = if v >= self.remaining {
            (v - self.remaining) % self.remaining
        } else {
            v
        };
        let k = self.holes.partition_point(|&(at, _)| at <= v);
        self.cfg.start + v + k.checked_sub(1).map_or(0, |k| self.holes[k].1)
    }

    /// Slots `[a, b)` (all `< R`) as runs of consecutive positions, appended to `out`.
    fn positions_of(&self, a: u64, b: u64, out: &mut Vec<(u64, u64)>) {
        let mut v = a;
        while v < b {
            let k = self.holes.partition_point(|&(at, _)| at <= v);
            let end = self.holes.get(k).map_or(b, |&(at, _)| at.min(b));
            let p = self.position(v);
            out.push((p, p + (end - v)));
            v = end;
        }
    }

    /// Samples per rank's contiguous slice of the split (block mode); the strided split's
    /// share otherwise.
    pub fn slice_len(&self) -> u64 {
        self.per_rank
    }

    /// The split that is left once every rank of this plan's world size has delivered its
    /// first `delivered` samples, as `(start, taken)` for a [`PlanConfig`] of any world size
    /// (an elastic resume). Strided split: the ranks have read a prefix of the slots, so
    /// `start` moves on. Contiguous (block): each rank has read the head of its slice, and
    /// those heads join `taken` (at most one range per old rank, merged where they touch).
    /// Positions read as padding count as read.
    pub fn rest_after(&self, delivered: u64) -> (u64, Vec<(u64, u64)>) {
        let (w, r) = (self.cfg.world_size, self.remaining);
        let mut read: Vec<(u64, u64)> = self.cfg.taken.clone();
        let mut slots = Vec::new();
        if self.is_contiguous() {
            for rank in 0..w {
                let a = rank.saturating_mul(self.per_rank);
                let b = a.saturating_add(delivered);
                slots.push((a.min(r), b.min(r)));
                if b > r {
                    // Padding slots repeat the first ones (slot s reads s - R).
                    slots.push(((a.max(r) - r).min(r), (b - r).min(r)));
                }
            }
        } else {
            slots.push((0, delivered.saturating_mul(w).min(r)));
        }
        for (a, b) in slots {
            self.positions_of(a, b, &mut read);
        }
        read.retain(|&(lo, hi)| lo < hi);
        read.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(read.len());
        for (lo, hi) in read {
            match merged.last_mut() {
                Some(last) if lo <= last.1 => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        let mut start = self.cfg.start;
        if merged.first().is_some_and(|&(lo, _)| lo <= start) {
            start = start.max(merged.remove(0).1);
        }
        (start, merged)
    }

    /// Global sample id of this rank's `i`-th sample.
    ///
    /// # Panics
    /// If `i >= len()`.
    #[inline]
    pub fn get(&self, i: u64) -> u64 {
        assert!(
            i < self.len,
            "sample {i} of a plan with {} samples",
            self.len
        );
        self.order_at(self.position(self.slot(i)))
    }

    /// The global sample id at position `p` of the epoch order (all ranks).
    ///
    /// # Panics
    /// If `p >= epoch_samples()`.
    #[inline]
    pub fn order_at(&self, p: u64) -> u64 {
        assert!(p < self.total, "position {p} of an epoch of {}", self.total);
        match &self.order {
            Order::Identity => p,
            Order::Global(perm) => perm.apply(p),
            Order::Block {
                shards,
                prefix,
                starts,
                window,
                key,
            } => {
                // The window holding p, its span of positions, and p's place inside it.
                let k = prefix.partition_point(|&x| x <= p) - 1;
                let w = k / window;
                let first = w * window;
                let last = (first + window).min(shards.len());
                let (lo, hi) = (prefix[first], prefix[last]);
                let q = Permutation::new(hi - lo, derive_key(&[*key, w as u64])).apply(p - lo);
                let pos = lo + q;
                let j = first + prefix[first..=last].partition_point(|&x| x <= pos) - 1;
                starts[shards[j] as usize] + (pos - prefix[j])
            }
        }
    }

    /// Global sample ids of this rank's samples `range` (as [`Plan::get`] gives them one by
    /// one), appended to `out`. Faster for a batch: its positions come as runs where the
    /// slice is contiguous, a global shuffle permutes them eight at a time (AVX-512 where the
    /// CPU has it), and block mode keys each window's permutation once instead of once per
    /// sample and finds each image's shard by a branchless count over the window's bounds.
    ///
    /// # Panics
    /// If `range.end > len()`.
    pub fn extend_ids(&self, range: std::ops::Range<u64>, out: &mut Vec<u64>) {
        assert!(
            range.end <= self.len,
            "samples {range:?} of a plan with {} samples",
            self.len
        );
        let base = out.len();
        self.extend_positions(range, out);
        let (shards, prefix, starts, window, key) = match &self.order {
            Order::Identity => return,
            Order::Global(perm) => return perm.apply_slice(&mut out[base..]),
            Order::Block {
                shards,
                prefix,
                starts,
                window,
                key,
            } => (shards, prefix, starts, *window, *key),
        };
        // Runs of positions in one window: each run's permutation is keyed once and applied
        // to the whole run at once, in place; then each image becomes its sample id.
        let mut at = base;
        let mut deltas = Vec::with_capacity(window.min(shards.len()));
        while at < out.len() {
            let p = out[at];
            let k = prefix.partition_point(|&x| x <= p) - 1;
            let first = k / window * window;
            let last = (first + window).min(shards.len());
            let (lo, hi) = (prefix[first], prefix[last]);
            let end = at
                + out[at..]
                    .iter()
                    .take_while(|&&q| (lo..hi).contains(&q))
                    .count();
            let run = &mut out[at..end];
            for q in run.iter_mut() {
                *q -= lo;
            }
            Permutation::new(hi - lo, derive_key(&[key, (k / window) as u64])).apply_slice(run);
            // The window's shard holding an image is the number of its later shards' starts
            // at or before it (empty shards share a start, and are passed over); its sample
            // id is the image plus that shard's offset from positions to ids.
            let inner = &prefix[first + 1..last];
            deltas.clear();
            deltas.extend(
                (first..last).map(|j| starts[shards[j] as usize].wrapping_sub(prefix[j] - lo)),
            );
            if inner.len() <= 16 {
                for q in run.iter_mut() {
                    let pos = lo + *q;
                    let j = inner.iter().map(|&x| (x <= pos) as usize).sum::<usize>();
                    *q = deltas[j].wrapping_add(*q);
                }
            } else {
                for q in run.iter_mut() {
                    let j = inner.partition_point(|&x| x <= lo + *q);
                    *q = deltas[j].wrapping_add(*q);
                }
            }
            at = end;
        }
    }

    /// The positions of this rank's samples `range` in the epoch order, appended to `out`:
    /// runs of consecutive positions where the slice is contiguous and holds no padding,
    /// one by one otherwise.
    fn extend_positions(&self, range: std::ops::Range<u64>, out: &mut Vec<u64>) {
        if range.is_empty() {
            return;
        }
        let (a, b) = (self.slot(range.start), self.slot(range.end - 1) + 1);
        if self.is_contiguous() && b <= self.remaining {
            let mut runs = Vec::new();
            self.positions_of(a, b, &mut runs);
            for (p, q) in runs {
                out.extend(p..q);
            }
        } else {
            out.extend(range.map(|i| self.position(self.slot(i))));
        }
    }

    /// The positions rank `rank` of this plan's configuration reads, as `(first, count)` of
    /// a contiguous run (block mode) or of a run strided by the world size; positions past
    /// the epoch wrap to its start (padding), as [`Plan::get`] does. For the planner, on a
    /// split with nothing `taken`.
    pub(crate) fn rank_positions(&self, rank: u64) -> (u64, u64) {
        debug_assert!(self.cfg.taken.is_empty());
        let first = if self.is_contiguous() {
            self.cfg.start + rank * self.per_rank
        } else {
            self.cfg.start + rank
        };
        (first, self.len)
    }

    /// Block mode: the shuffled shard order, the positions where each of its shards starts
    /// (with the end), and the shards per window. For the planner.
    pub(crate) fn block_layout(&self) -> Option<(&[u32], &[u64], usize)> {
        match &self.order {
            Order::Block {
                shards,
                prefix,
                window,
                ..
            } => Some((shards, prefix, *window)),
            _ => None,
        }
    }

    /// This rank's sample ids in order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.len).map(|i| self.get(i))
    }

    /// How many shards this rank reads at once when it reads them one after the other, or
    /// `None` when it reads them at random. `block` shuffles read a window of shards at a
    /// time, each rank its own contiguous run; `none` reads shards in order, but splits them
    /// across ranks sample by sample, so only a single rank reads them one after the other;
    /// `global` jumps around every shard. Streaming sources download whole shards, with
    /// read-ahead along [`Plan::shard_order`], when this is `Some`, and read samples by range
    /// otherwise.
    pub fn shard_window(&self) -> Option<usize> {
        match self.cfg.shuffle {
            Shuffle::Block { window } => Some(window as usize),
            Shuffle::None if self.cfg.world_size == 1 => Some(1),
            _ => None,
        }
    }

    /// The shards this rank touches, in the order it first reads them (block mode: a
    /// contiguous run of the shuffled shard order). Useful for streaming read-ahead.
    pub fn shard_order(&self, manifest: &Manifest) -> Vec<usize> {
        let mut seen = vec![false; manifest.shards.len()];
        let mut out = Vec::new();
        for id in self.iter() {
            if let Some((s, _)) = manifest.locate(id)
                && !seen[s]
            {
                seen[s] = true;
                out.push(s);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use proptest::prelude::*;

    use super::*;

    fn manifest(counts: &[u64]) -> Manifest {
        crate::testing::manifest_sized(counts, |_, n| n)
    }

    fn shuffle_modes() -> impl Strategy<Value = Shuffle> {
        prop_oneof![
            Just(Shuffle::None),
            Just(Shuffle::Global),
            (1u32..5).prop_map(|window| Shuffle::Block { window }),
        ]
    }

    #[test]
    fn permutation_is_a_bijection() {
        for n in [0u64, 1, 2, 3, 5, 16, 17, 1000, 4097] {
            let p = Permutation::new(n, 99);
            let mut seen = vec![false; n as usize];
            for x in 0..n {
                let y = p.apply(x);
                assert!(!seen[y as usize], "n={n}: {y} hit twice");
                seen[y as usize] = true;
            }
        }
    }

    #[test]
    fn billion_sample_shuffle_needs_no_memory() {
        let m = manifest(&[1_000_000_000]);
        let cfg = PlanConfig {
            shuffle: Shuffle::Global,
            batch_size: 1,
            ..Default::default()
        };
        let plan = Plan::new(&m, &cfg).unwrap();
        assert!(size_of_val(&plan) < 512);
        let first: Vec<u64> = (0..5).map(|i| plan.get(i)).collect();
        assert!(first.iter().all(|&x| x < 1_000_000_000));
        assert_ne!(first, [0, 1, 2, 3, 4]);
    }

    #[test]
    fn block_shuffle_reads_a_units_shards_together() {
        // Shards 0-2, 3, 4-8 and 9-10 are units (the chunks of four row groups).
        let counts = [5u64, 5, 2, 7, 5, 5, 5, 5, 1, 4, 4];
        let m = manifest(&counts).with_units(vec![0, 3, 4, 9]);
        let unit = |s: u32| match s {
            0..=2 => 0,
            3 => 1,
            4..=8 => 2,
            _ => 3,
        };
        let mut orders = HashSet::new();
        for epoch in 0..20 {
            let cfg = PlanConfig {
                shuffle: Shuffle::Block { window: 2 },
                epoch,
                ..Default::default()
            };
            let plan = Plan::new(&m, &cfg).unwrap();
            let (shards, ..) = plan.block_layout().unwrap();
            let mut sorted = shards.to_vec();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..counts.len() as u32).collect::<Vec<_>>());
            // Each unit's shards are one run of the order.
            let mut runs: Vec<u32> = shards.iter().map(|&s| unit(s)).collect();
            runs.dedup();
            assert_eq!(runs.len(), 4, "epoch {epoch}: {shards:?}");
            orders.insert(shards.to_vec());
            // Every sample once.
            let mut ids: Vec<u64> = plan.iter().collect();
            ids.sort_unstable();
            assert_eq!(ids, (0..m.total_samples()).collect::<Vec<_>>());
        }
        assert!(
            orders.len() > 10,
            "units and shards within them both shuffle"
        );
        // Units take part in the fingerprint (a state saved under others would resume
        // elsewhere); a manifest without units hashes as it did.
        assert_ne!(m.fingerprint(), manifest(&counts).fingerprint());
        let back = Manifest::from_json(&m.to_json(), "m.json").unwrap();
        assert_eq!(back.units, m.units);
        let mut bad = m.clone();
        bad.units = vec![0, 4, 4];
        let e = Manifest::from_json(&bad.to_json(), "m.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("m.json") && e.contains("units"), "{e}");
    }

    #[test]
    fn shuffle_changes_with_epoch_and_seed() {
        let m = manifest(&[100, 100]);
        for shuffle in [Shuffle::Global, Shuffle::block()] {
            let ids = |seed, epoch| {
                let cfg = PlanConfig {
                    seed,
                    epoch,
                    shuffle,
                    ..Default::default()
                };
                Plan::new(&m, &cfg).unwrap().iter().collect::<Vec<_>>()
            };
            assert_eq!(ids(1, 0), ids(1, 0));
            assert_ne!(ids(1, 0), ids(1, 1));
            assert_ne!(ids(1, 0), ids(2, 0));
        }
    }

    #[test]
    fn block_mode_keeps_windows_of_shards_together() {
        let m = manifest(&[10; 8]);
        let cfg = PlanConfig {
            shuffle: Shuffle::Block { window: 2 },
            ..Default::default()
        };
        let plan = Plan::new(&m, &cfg).unwrap();
        let ids: Vec<u64> = plan.iter().collect();
        for chunk in ids.chunks(20) {
            let mut shards: Vec<u64> = chunk.iter().map(|id| id / 10).collect();
            shards.sort();
            shards.dedup();
            assert_eq!(
                shards.len(),
                2,
                "a window spans exactly two shards: {chunk:?}"
            );
        }
    }

    #[test]
    fn block_mode_ranks_read_about_their_share_of_shards() {
        let m = manifest(&[100; 16]);
        for rank in 0..4 {
            let cfg = PlanConfig {
                shuffle: Shuffle::block(),
                rank,
                world_size: 4,
                ..Default::default()
            };
            let plan = Plan::new(&m, &cfg).unwrap();
            assert_eq!(plan.shard_order(&m).len(), 4);
        }
    }

    #[test]
    fn config_errors_name_the_option() {
        let m = manifest(&[10]);
        let bad = PlanConfig {
            rank: 3,
            world_size: 2,
            ..Default::default()
        };
        let e = Plan::new(&m, &bad).unwrap_err();
        assert_eq!(e.option, "rank");
        assert!(e.to_string().contains("[0, 2)"), "{e}");
        let e = Plan::new(
            &m,
            &PlanConfig {
                batch_size: 0,
                ..Default::default()
            },
        )
        .unwrap_err();
        assert_eq!(e.option, "batch_size");
        assert_eq!(
            "block:3".parse::<Shuffle>().unwrap(),
            Shuffle::Block { window: 3 }
        );
        assert!("bloc".parse::<Shuffle>().is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Ranks are disjoint, cover the epoch exactly once (plus the fewest repeats), and
        /// get equal sample and batch counts.
        #[test]
        fn ranks_partition_the_epoch(
            counts in prop::collection::vec(0u64..40, 1..8),
            world_size in 1u64..7,
            batch_size in 1u64..9,
            drop_last: bool,
            shuffle in shuffle_modes(),
            seed: u64,
            epoch in 0u64..3,
        ) {
            let m = manifest(&counts);
            let n = m.total_samples();
            let mut hits: HashMap<u64, u64> = HashMap::new();
            let mut lens = Vec::new();
            let mut batches = Vec::new();
            for rank in 0..world_size {
                let cfg = PlanConfig {
                    seed, epoch, rank, world_size, shuffle, batch_size, drop_last, start: 0,
                    taken: Vec::new(),
                };
                let plan = Plan::new(&m, &cfg).unwrap();
                lens.push(plan.len());
                batches.push(plan.num_batches());
                // The batch form agrees with `get`, from any starting point.
                let one: Vec<u64> = plan.iter().collect();
                let mut ids = Vec::new();
                let cut = plan.len() / 3;
                plan.extend_ids(0..cut, &mut ids);
                plan.extend_ids(cut..plan.len(), &mut ids);
                prop_assert_eq!(&ids, &one);
                for id in plan.iter() {
                    prop_assert!(id < n);
                    *hits.entry(id).or_default() += 1;
                }
            }
            prop_assert!(lens.iter().all(|&l| l == lens[0]), "unequal samples {lens:?}");
            prop_assert!(batches.iter().all(|&b| b == batches[0]), "unequal batches {batches:?}");
            let delivered: u64 = lens.iter().sum();
            if drop_last {
                // Every sample at most once; only the remainder dropped.
                prop_assert!(hits.values().all(|&c| c == 1));
                prop_assert!(n - delivered < world_size * batch_size);
                prop_assert!(lens[0] % batch_size == 0);
            } else {
                // Every sample at least once; the fewest repeats that equalise the ranks.
                prop_assert_eq!(hits.len() as u64, n);
                prop_assert_eq!(delivered, n.div_ceil(world_size) * world_size);
                let extra: u64 = hits.values().map(|&c| c - 1).sum();
                prop_assert!(extra < world_size);
            }
        }

        /// Consumed positions are a prefix of the epoch order under the strided split, so
        /// continuing from `start` on another world size reads exactly the rest.
        #[test]
        fn elastic_continuation_reads_the_rest(
            n in 1u64..200,
            w1 in 1u64..5,
            w2 in 1u64..5,
            delivered_frac in 0.0f64..1.0,
            global: bool,
            seed: u64,
        ) {
            let m = manifest(&[n]);
            let shuffle = if global { Shuffle::Global } else { Shuffle::None };
            let base = PlanConfig { seed, shuffle, world_size: w1, drop_last: true, ..Default::default() };
            let per = Plan::new(&m, &base).unwrap().len();
            let d = (per as f64 * delivered_frac) as u64;
            let mut seen: Vec<u64> = Vec::new();
            for rank in 0..w1 {
                let plan = Plan::new(&m, &PlanConfig { rank, ..base.clone() }).unwrap();
                seen.extend((0..d).map(|i| plan.get(i)));
            }
            let start = d * w1;
            for rank in 0..w2 {
                let cfg = PlanConfig { rank, world_size: w2, start, drop_last: false, ..base.clone() };
                seen.extend(Plan::new(&m, &cfg).unwrap().iter());
            }
            seen.sort();
            let before = seen.len();
            seen.dedup();
            prop_assert_eq!(seen.len() as u64, n, "every sample read");
            prop_assert!((before - seen.len()) < w2 as usize, "only padding repeats");
        }

        /// The batch form agrees with `get` over any cut, on block windows of many shards
        /// (empty ones among them) as well as few, and on the other orders.
        #[test]
        fn extend_ids_agrees_with_get(
            counts in prop::collection::vec(0u64..20, 1..60),
            window in 1u32..40,
            mode in 0u8..3,
            world_size in 1u64..5,
            drop_last: bool,
            cuts in prop::collection::vec(0.0f64..1.0, 0..4),
            seed: u64,
        ) {
            let m = manifest(&counts);
            let shuffle = match mode {
                0 => Shuffle::Block { window },
                1 => Shuffle::Global,
                _ => Shuffle::None,
            };
            for rank in 0..world_size {
                let cfg = PlanConfig {
                    seed, rank, world_size, shuffle, batch_size: 1, drop_last,
                    ..Default::default()
                };
                let plan = Plan::new(&m, &cfg).unwrap();
                let mut at: Vec<u64> = cuts.iter().map(|&c| (c * plan.len() as f64) as u64).collect();
                at.push(plan.len());
                at.sort();
                let (mut ids, mut from) = (Vec::new(), 0);
                for to in at {
                    plan.extend_ids(from..to, &mut ids);
                    from = to;
                }
                prop_assert_eq!(ids, plan.iter().collect::<Vec<_>>());
            }
        }

        /// A chain of elastic resumes (each world size reads a fraction of what is left, the
        /// last one reads to the end) reads every sample once, in every shuffle mode.
        #[test]
        fn elastic_chains_read_every_sample_once(
            counts in prop::collection::vec(1u64..40, 1..8),
            worlds in prop::collection::vec(1u64..6, 2..5),
            fracs in prop::collection::vec(0.0f64..1.0, 4),
            shuffle in shuffle_modes(),
            batch_size in 1u64..5,
            drop_last: bool,
            seed: u64,
        ) {
            let m = manifest(&counts);
            let n = m.total_samples();
            let (mut start, mut taken) = (0, Vec::new());
            let mut seen: Vec<u64> = Vec::new();
            let last = worlds.len() - 1;
            for (k, &w) in worlds.iter().enumerate() {
                let base = PlanConfig {
                    seed, shuffle, world_size: w, batch_size, drop_last,
                    start, taken: taken.clone(), ..Default::default()
                };
                let len = Plan::new(&m, &base).unwrap().len();
                let d = if k == last { len } else { (len as f64 * fracs[k]) as u64 };
                for rank in 0..w {
                    let plan = Plan::new(&m, &PlanConfig { rank, ..base.clone() }).unwrap();
                    let mut ids = Vec::new();
                    plan.extend_ids(0..d, &mut ids);
                    prop_assert_eq!(&ids, &(0..d).map(|i| plan.get(i)).collect::<Vec<_>>());
                    seen.extend(ids);
                }
                (start, taken) = Plan::new(&m, &base).unwrap().rest_after(d);
                prop_assert!(taken.len() as u64 <= worlds.iter().sum::<u64>());
            }
            let w = worlds[last];
            let before = seen.len() as u64;
            seen.sort();
            seen.dedup();
            let distinct = seen.len() as u64;
            if drop_last {
                prop_assert_eq!(distinct, before, "nothing twice");
                prop_assert!(n - distinct < w * batch_size, "only a last remainder unread");
            } else {
                prop_assert_eq!(distinct, n, "every sample");
                // Padding repeats: fewer than a world size at each resize that reached it.
                prop_assert!(before - distinct < worlds.iter().sum::<u64>());
            }
        }

        #[test]
        fn permutation_is_bijective(n in 0u64..3000, key: u64) {
            let p = Permutation::new(n, key);
            let mut seen = vec![false; n as usize];
            for x in 0..n {
                let y = p.apply(x) as usize;
                prop_assert!(!seen[y]);
                seen[y] = true;
            }
        }

        /// The eight-lane forms (AVX-512 where the CPU has it, and the portable one every
        /// CPU can run) give `apply`'s images, in any order and slice length.
        #[test]
        fn apply_slice_agrees_with_apply(
            n in 1u64..100_000,
            key: u64,
            picks in prop::collection::vec(any::<u64>(), 0..50),
        ) {
            let p = Permutation::new(n, key);
            let mut xs: Vec<u64> = picks.iter().map(|x| x % n).collect();
            let mut portable = xs.clone();
            let want: Vec<u64> = xs.iter().map(|&x| p.apply(x)).collect();
            p.apply_slice(&mut xs);
            p.apply_lanes(&mut portable);
            prop_assert_eq!(&xs, &want);
            prop_assert_eq!(portable, want);
        }
    }
}
