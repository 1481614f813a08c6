//! The schedule's arithmetic: weights per segment of positions, stratified periods laid out by
//! earliest deadline first ([`Pattern`]), the bonuses that round a batch's shares with carry
//! ([`Bonus`]), and where each component's first epoch ends.

use std::sync::Arc;

use chute_core::ConfigError;

/// Parts of a period: stratified weights are rounded to multiples of `1 / QUANTUM`.
pub const QUANTUM: u64 = 1 << 16;

/// Positions between memoized counts in `random` mode.
pub const RANDOM_CHUNK: u64 = 4096;

/// Positions between the counts kept for a period's pattern.
const CHECK: usize = 64;

/// Most components of one mixture (nest mixtures for more).
pub const MAX_COMPONENTS: usize = 1024;
/// Most schedule points.
pub const MAX_SEGMENTS: usize = 4096;
/// Most (constant-weight segment, component) pairs: each segment lays out a period of
/// [`QUANTUM`] positions over its components when built.
pub const MAX_SEGMENT_WORK: usize = 1 << 13;
/// Most epochs before the schedule's last point (counts before an epoch are summed epoch by
/// epoch up to there).
pub const MAX_SCHEDULE_EPOCHS: u64 = 10_000_000;
/// Most positions `random` mode counts draws up to (it counts them chunk by chunk).
pub const MAX_RANDOM_POSITION: u64 = RANDOM_CHUNK << 24;

/// Most steps a linear ramp is resolved into.
const RAMP_STEPS: u64 = 64;

/// A period of a stratified segment: the component of each offset, and each component's
/// count before every `CHECK`-th offset.
pub(super) struct Pattern {
    pub(super) quotas: Vec<u64>,
    pub(super) seq: Vec<u16>,
    pub(super) checks: Vec<u32>,
}

/// Earliest deadline first over `steps` steps of `picks` distinct picks each, component `c`
/// getting `rates[c]` picks per `steps` (the rates sum to `picks * steps`), with every prefix
/// of `n` steps holding `rates[c] n / steps` picks of `c` within one, both ways: pick `j` of
/// `c` is released at step `floor((j - 1) steps / rate)` and due by `ceil(j steps / rate) - 1`,
/// and each step takes the released picks due first (the lowest index on ties). For unit jobs
/// with release times and deadlines EDF meets every deadline when any schedule does, and the
/// shares' fluid schedule is one. (Tightening the margin, so that prefixes stay within less
/// than one, made windows no better on the weights tried: they are bounded by twice it, and
/// within one for every window is impossible in general for three or more components.)
pub(super) fn edf(rates: &[u64], steps: u64, picks: usize) -> Vec<u16> {
    let k = rates.len();
    let mut counts = vec![0u64; k];
    // Each component's next pick: the step it is released at (`u64::MAX` once it has all its
    // picks) and its deadline, updated only when it is picked (no division in the loop).
    let mut release = vec![u64::MAX; k];
    let mut deadline = vec![0u64; k];
    let next = |c: usize, n: u64, release: &mut [u64], deadline: &mut [u64]| {
        let rate = rates[c];
        if rate == 0 || n >= rate {
            release[c] = u64::MAX;
        } else {
            release[c] = n * steps / rate;
            deadline[c] = ((n + 1) * steps).div_ceil(rate);
        }
    };
    for c in 0..k {
        next(c, 0, &mut release, &mut deadline);
    }
    let mut out = Vec::with_capacity(steps as usize * picks);
    let mut due: Vec<(u64, usize)> = Vec::with_capacity(k);
    for t in 0..steps {
        due.clear();
        if picks == 1 {
            // The released pick due first, the lowest index on ties.
            let mut best: Option<(u64, usize)> = None;
            for c in 0..k {
                if release[c] <= t && best.is_none_or(|(d, _)| deadline[c] < d) {
                    best = Some((deadline[c], c));
                }
            }
            due.extend(best);
        } else {
            due.extend(
                (0..k)
                    .filter(|&c| release[c] <= t)
                    .map(|c| (deadline[c], c)),
            );
            due.sort_unstable();
        }
        for &(_, c) in due.iter().take(picks) {
            out.push(c as u16);
            counts[c] += 1;
            next(c, counts[c], &mut release, &mut deadline);
        }
        // Unreachable when the rates sum to `picks * steps`: fill with any with room.
        for _ in due.len()..picks {
            let c = (0..k).find(|&c| counts[c] < rates[c]).unwrap_or(0);
            out.push(c as u16);
            counts[c] += 1;
            next(c, counts[c], &mut release, &mut deadline);
        }
    }
    out
}

/// Picks of component `c` in the first `steps` steps of `seq` (`picks` entries a step), from
/// the [`checkpoints`] before the last `CHECK`-th step and a scan of the rest.
pub(super) fn counted(
    seq: &[u16],
    checks: &[u32],
    k: usize,
    picks: usize,
    c: usize,
    steps: usize,
) -> u64 {
    let base = steps / CHECK;
    let rest = &seq[base * CHECK * picks..steps * picks];
    u64::from(checks[base * k + c]) + rest.iter().filter(|&&p| usize::from(p) == c).count() as u64
}

/// Each component's count before every `CHECK`-th step of `seq` (`picks` entries a step).
pub(super) fn checkpoints(seq: &[u16], k: usize, picks: usize) -> Vec<u32> {
    let steps = seq.len() / picks.max(1);
    let mut counts = vec![0u32; k];
    let mut checks = Vec::with_capacity(steps.div_ceil(CHECK) * k);
    for t in 0..steps {
        if t.is_multiple_of(CHECK) {
            checks.extend_from_slice(&counts);
        }
        for &c in &seq[t * picks..(t + 1) * picks] {
            counts[usize::from(c)] += 1;
        }
    }
    checks
}

impl Pattern {
    /// One period of `n = sum(quotas)` offsets laid out by [`edf`] (one pick per offset): every prefix keeps each count within one of its share `q / n`, both ways.
    pub(super) fn new(quotas: Vec<u64>) -> Pattern {
        let n: u64 = quotas.iter().sum();
        let seq = if n == 0 {
            Vec::new()
        } else {
            edf(&quotas, n, 1)
        };
        let checks = checkpoints(&seq, quotas.len(), 1);
        Pattern {
            quotas,
            seq,
            checks,
        }
    }

    /// A layout given position by position (`random` mode's chunks), over `k` components;
    /// `quotas` are then its draws per component.
    pub(super) fn from_seq(seq: Vec<u16>, k: usize) -> Pattern {
        let mut quotas = vec![0u64; k];
        for &c in &seq {
            quotas[usize::from(c)] += 1;
        }
        let checks = checkpoints(&seq, k, 1);
        Pattern {
            quotas,
            seq,
            checks,
        }
    }

    /// Draws of component `c` in the first `off` offsets of a period.
    pub(super) fn before(&self, c: usize, off: usize) -> u64 {
        counted(&self.seq, &self.checks, self.quotas.len(), 1, c, off)
    }
}

/// Batch-level stratification for batches of `batch` samples at constant quotas: each
/// component gets `floor(q * batch / Q)` samples of every batch, and `r` components one more,
/// chosen over a period of [`QUANTUM`] batches by earliest deadline first among released
/// bonuses (as [`Pattern`] does for single positions, `r` distinct picks per batch), so every
/// batch holds each share rounded down or up and every run of batches from the period's start
/// keeps each count within one of its share.
pub(super) struct Bonus {
    pub(super) floors: Vec<u64>,
    /// Bonuses per component per period.
    pub(super) per_period: Vec<u64>,
    pub(super) r: usize,
    pub(super) picks: Vec<u16>,
    pub(super) checks: Vec<u32>,
}

impl Bonus {
    pub(super) fn new(quotas: &[u64], batch: u64) -> Bonus {
        let k = quotas.len();
        let floors: Vec<u64> = quotas.iter().map(|q| q * batch / QUANTUM).collect();
        let phi: Vec<u64> = quotas.iter().map(|q| q * batch % QUANTUM).collect();
        let r = (phi.iter().sum::<u64>() / QUANTUM) as usize;
        let picks = if r == 0 {
            Vec::new()
        } else {
            edf(&phi, QUANTUM, r)
        };
        let checks = if r == 0 {
            vec![0; (QUANTUM as usize / CHECK) * k]
        } else {
            checkpoints(&picks, k, r)
        };
        Bonus {
            floors,
            per_period: phi,
            r,
            picks,
            checks,
        }
    }

    /// Bonuses of component `c` in the first `j` batches of the run.
    pub(super) fn before(&self, c: usize, j: u64) -> u64 {
        let (full, j) = (j / QUANTUM, (j % QUANTUM) as usize);
        let k = self.floors.len();
        full * self.per_period[c] + counted(&self.picks, &self.checks, k, self.r, c, j)
    }

    /// The composition of batch `j` of the run.
    pub(super) fn batch(&self, j: u64) -> Vec<u64> {
        let j = (j % QUANTUM) as usize;
        let mut a = self.floors.clone();
        for &p in &self.picks[j * self.r..(j + 1) * self.r] {
            a[usize::from(p)] += 1;
        }
        a
    }
}

/// The share of each component in `len` positions at `quotas`, rounded by largest remainder
/// (ties to the lowest index): an epoch's last, shorter batch.
pub(super) fn rounded(quotas: &[u64], len: u64) -> Vec<u64> {
    let mut a: Vec<u64> = quotas.iter().map(|q| q * len / QUANTUM).collect();
    let mut rest: Vec<(u64, usize)> = quotas
        .iter()
        .enumerate()
        .map(|(c, q)| (QUANTUM - q * len % QUANTUM, c))
        .filter(|&(r, _)| r < QUANTUM)
        .collect();
    rest.sort_unstable();
    let missing = len - a.iter().sum::<u64>();
    for &(_, c) in rest.iter().take(missing as usize) {
        a[c] += 1;
    }
    a
}

/// Weights constant over `[start, next segment's start)`.
pub(super) struct Segment {
    pub(super) start: u64,
    pub(super) weights: Vec<f64>,
    /// Each component's draws before `start`.
    pub(super) counts: Vec<u64>,
    pub(super) pattern: Arc<Pattern>,
}

/// Rounds `weights` (normalized) to integer quotas summing to [`QUANTUM`] by largest
/// remainder; a positive weight gets at least one part.
pub(super) fn quotas(weights: &[f64]) -> Vec<u64> {
    let q = QUANTUM as f64;
    let mut out: Vec<u64> = weights.iter().map(|w| (w * q).floor() as u64).collect();
    for (o, w) in out.iter_mut().zip(weights) {
        if *w > 0.0 && *o == 0 {
            *o = 1;
        }
    }
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| {
        let fa = weights[a] * q - (weights[a] * q).floor();
        let fb = weights[b] * q - (weights[b] * q).floor();
        fb.total_cmp(&fa).then(a.cmp(&b))
    });
    let mut sum: u64 = out.iter().sum();
    let mut i = 0;
    while sum < QUANTUM {
        let c = order[i % order.len()];
        if weights[c] > 0.0 {
            out[c] += 1;
            sum += 1;
        }
        i += 1;
    }
    while sum > QUANTUM {
        // Only after forcing ones: take from the largest.
        let c = (0..out.len()).max_by_key(|&c| out[c]).expect("components");
        out[c] -= 1;
        sum -= 1;
    }
    out
}

/// Checks and normalizes schedule points: sorted, the first at 0, one finite non-negative
/// weight per component, a positive sum.
pub(super) fn normalize(
    mut points: Vec<(u64, Vec<f64>)>,
    names: &[&str],
) -> Result<Vec<(u64, Vec<f64>)>, ConfigError> {
    if points.is_empty() {
        return Err(ConfigError::new("weights", "no weights given"));
    }
    points.sort_by_key(|(p, _)| *p);
    if points[0].0 != 0 {
        return Err(ConfigError::new(
            "weights",
            format!(
                "the schedule starts at position {}; its first point must be at 0",
                points[0].0
            ),
        ));
    }
    for pair in points.windows(2) {
        if pair[0].0 == pair[1].0 {
            return Err(ConfigError::new(
                "weights",
                format!("two schedule points at position {}", pair[0].0),
            ));
        }
    }
    for (p, w) in &mut points {
        if w.len() != names.len() {
            return Err(ConfigError::new(
                "weights",
                format!(
                    "{} weights at position {p} for {} components",
                    w.len(),
                    names.len()
                ),
            ));
        }
        if let Some((i, bad)) = w
            .iter()
            .enumerate()
            .find(|(_, x)| !x.is_finite() || **x < 0.0)
        {
            return Err(ConfigError::new(
                "weights",
                format!(
                    "weight {bad} for {:?} at position {p}; weights are finite and >= 0",
                    names[i]
                ),
            ));
        }
        let sum: f64 = w.iter().sum();
        if sum <= 0.0 {
            return Err(ConfigError::new(
                "weights",
                format!("the weights at position {p} are all zero"),
            ));
        }
        for x in w.iter_mut() {
            *x /= sum;
        }
    }
    Ok(points)
}

/// The constant-weight segments of a schedule (a ramp becomes up to [`RAMP_STEPS`] steps),
/// each with every component's draws before it.
pub(super) fn segments(points: &[(u64, Vec<f64>)], ramp: bool) -> Vec<Segment> {
    let mut steps: Vec<(u64, Vec<f64>)> = Vec::new();
    for (i, (p, w)) in points.iter().enumerate() {
        match points.get(i + 1) {
            Some((q, v)) if ramp => {
                let span = q - p;
                let n = RAMP_STEPS.min(span).max(1);
                for s in 0..n {
                    // Each step holds the weights at its middle.
                    let t = (s as f64 + 0.5) / n as f64;
                    let at = p + span * s / n;
                    let mixed = w.iter().zip(v).map(|(a, b)| a + (b - a) * t).collect();
                    steps.push((at, mixed));
                }
            }
            _ => steps.push((*p, w.clone())),
        }
    }
    steps.dedup_by(|b, a| a.1 == b.1);
    let k = points[0].1.len();
    let mut out: Vec<Segment> = Vec::with_capacity(steps.len());
    let mut cache: Vec<Arc<Pattern>> = Vec::new();
    for (start, weights) in steps {
        let counts = match out.last() {
            None => vec![0; k],
            Some(prev) => (0..k).map(|c| stratified_count(prev, c, start)).collect(),
        };
        let q = quotas(&weights);
        let pattern = match cache.iter().find(|p| p.quotas == q) {
            Some(p) => Arc::clone(p),
            None => {
                let p = Arc::new(Pattern::new(q));
                cache.push(Arc::clone(&p));
                p
            }
        };
        out.push(Segment {
            start,
            weights,
            counts,
            pattern,
        });
    }
    out
}

/// Draws of component `c` before position `g` (>= the segment's start), stratified.
pub(super) fn stratified_count(seg: &Segment, c: usize, g: u64) -> u64 {
    let t = g - seg.start;
    let (full, off) = (t / QUANTUM, (t % QUANTUM) as usize);
    seg.counts[c] + full * seg.pattern.quotas[c] + seg.pattern.before(c, off)
}

/// The segment holding position `g`.
pub(super) fn segment_at(segments: &[Segment], g: u64) -> &Segment {
    let i = segments.partition_point(|s| s.start <= g) - 1;
    &segments[i]
}

/// The first position by which component `c` has drawn `len` samples (stratified counts),
/// or `None` when its weight falls to zero for good before that.
pub(super) fn first_epoch_end(segments: &[Segment], c: usize, len: u64) -> Option<u64> {
    let count = |g: u64| stratified_count(segment_at(segments, g), c, g);
    let last = segments.last().expect("segments");
    if last.pattern.quotas[c] == 0 {
        // It never draws after the last segment starts: it must finish before.
        if count(last.start) < len {
            return None;
        }
    }
    let mut hi = 1u64;
    while count(hi) < len {
        hi = hi.checked_mul(2)?;
    }
    let mut lo = 0;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if count(mid) >= len {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Some(lo)
}
