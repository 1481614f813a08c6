//! [`Mixture`]: weighted mixtures of sources, as one source.
//!
//! The mixture is an endless stream of positions `G = 0, 1, 2, ...` (across its epochs). Each
//! position belongs to one component, and is that component's `k`-th draw, where `k` counts
//! the component's earlier positions; the draw is sample `k % len` of the component's epoch
//! `k / len`, in that epoch's order (the component's own shuffle and seed). So components run
//! through their epochs independently, reshuffled each time, and every figure is a pure
//! function of `G`: the state of a mixed run stays a position.
//!
//! - **`stratified`** (the default): the weights in effect are quantized to [`QUANTUM`]
//!   parts. With the loader's batches of `B` (`B > 1`), each batch of an epoch holds each
//!   component's share `w B` rounded down or up, and the components that get one more are
//!   chosen by earliest deadline first over a period of [`QUANTUM`] batches, so every run of
//!   batches from the start of a schedule segment keeps each count within one of its share
//!   ("rounded with carry"); inside a batch its samples are interleaved the same way. With
//!   `B = 1` (and inside nested mixtures) the same holds position by position. (Within one
//!   over *every* window, not only runs from a segment's start, is impossible in general for
//!   three or more components: Fraenkel's balanced words.)
//! - **`random`**: each position draws its component i.i.d. by weight from the seeded RNG
//!   (tf.data's `sample_from_datasets`); counts are memoized every [`RANDOM_CHUNK`] positions.
//!
//! Weights may change with the position ([`Mixture::schedule`]: piecewise constant, or linear
//! ramps resolved into steps). The mixture's epoch length is stated up front: given, or where
//! the first (`stop_on_first`) or the last (`stop_on_all`) component finishes its first epoch.
//!
//! Ranks: the engine hands a rank the epoch positions `i * W + r` (its strided split). The
//! mixture reads those as "rank `r`'s `i`-th sample" and serves it position
//! `(i / B) * B * W + r * B + i % B` of the stream: each rank's batch is a run of `B`
//! consecutive positions, so its proportions hold on every rank, the ranks' batches are
//! disjoint and together are the single-rank stream, and the split is the same for any world
//! size from a position on (elastic resume).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use crate::batch::Column;
use crate::buffer::BufferPool;
use crate::error::{ConfigError, Error, SampleRef};
use crate::manifest::Manifest;
use crate::plan::{Plan, PlanConfig, Shuffle};
use crate::rng::{SampleRng, derive_key, mix64, tag};
use crate::sample::{Array, Field, Sample};
use crate::source::{Source, virtual_manifest};
use crate::tensor::Tensor;
use crate::transform::Transform;

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

/// The format name of a mixture's manifest.
pub const MIXTURE_FORMAT: &str = "mixture";

/// How components are assigned to positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MixMode {
    /// Each component's share, rounded with carry, in every prefix (and so every batch).
    #[default]
    Stratified,
    /// Components drawn i.i.d. by weight from the seeded RNG.
    Random,
}

impl fmt::Display for MixMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MixMode::Stratified => "stratified",
            MixMode::Random => "random",
        })
    }
}

impl FromStr for MixMode {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "stratified" => Ok(MixMode::Stratified),
            "random" => Ok(MixMode::Random),
            _ => Err(ConfigError::new(
                "mode",
                format!("{s:?} is not a mixing mode; use stratified or random"),
            )),
        }
    }
}

/// Where a mixture's epoch ends. Components never run dry whatever the policy: an exhausted
/// component starts its next epoch, reshuffled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// When the first component finishes its first epoch (no sample seen twice in epoch 0).
    StopOnFirst,
    /// When the last component finishes its first epoch (every sample seen in epoch 0).
    #[default]
    StopOnAll,
    /// After `samples_per_epoch` samples, whatever the components' epochs.
    Cycle,
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Policy::StopOnFirst => "stop_on_first",
            Policy::StopOnAll => "stop_on_all",
            Policy::Cycle => "cycle",
        })
    }
}

impl FromStr for Policy {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "stop_on_first" => Ok(Policy::StopOnFirst),
            "stop_on_all" => Ok(Policy::StopOnAll),
            "cycle" => Ok(Policy::Cycle),
            _ => Err(ConfigError::new(
                "policy",
                format!("{s:?} is not a mixture policy; use stop_on_first, stop_on_all or cycle"),
            )),
        }
    }
}

/// What a component draws from.
enum Inner {
    Source(Arc<dyn Source>),
    Mixture(Arc<Mixture>),
}

/// One component of a mixture: a source (or a mixture) with its own shuffle, seed and
/// transform.
pub struct Component {
    name: String,
    inner: Inner,
    shuffle: Shuffle,
    seed: Option<u64>,
    transform: Option<Arc<dyn Transform>>,
    /// The plans of the component's epochs last used: `(epoch, seed, plan)`.
    plans: Mutex<Vec<(u64, u64, Arc<Plan>)>>,
    served: AtomicU64,
    tokens: AtomicU64,
}

impl fmt::Debug for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Component")
            .field("name", &self.name)
            .field("samples", &self.len())
            .field("shuffle", &self.shuffle)
            .field("seed", &self.seed)
            .finish()
    }
}

impl Component {
    fn with_inner(name: impl Into<String>, inner: Inner) -> Component {
        Component {
            name: name.into(),
            inner,
            shuffle: Shuffle::Global,
            seed: None,
            transform: None,
            plans: Mutex::new(Vec::new()),
            served: AtomicU64::new(0),
            tokens: AtomicU64::new(0),
        }
    }

    /// A component named `name` drawing from `source`, shuffled globally each of its epochs
    /// with a seed derived from the run's seed and the name.
    pub fn new(name: impl Into<String>, source: Arc<dyn Source>) -> Component {
        source.keep_one_order();
        Component::with_inner(name, Inner::Source(source))
    }

    /// A nested mixture as a component: its stream is drawn in order.
    pub fn mixture(name: impl Into<String>, mixture: Arc<Mixture>) -> Component {
        Component::with_inner(name, Inner::Mixture(mixture))
    }

    /// The order of each of the component's epochs (default [`Shuffle::Global`]).
    pub fn shuffle(mut self, shuffle: Shuffle) -> Component {
        self.shuffle = shuffle;
        self
    }

    /// A seed of its own (default: derived from the run's seed and the name).
    pub fn seed(mut self, seed: u64) -> Component {
        self.seed = Some(seed);
        self
    }

    /// A transform applied to each of the component's samples, before the mixture checks
    /// that every component delivers the same fields.
    pub fn transform(mut self, transform: Arc<dyn Transform>) -> Component {
        self.transform = Some(transform);
        self
    }

    /// The component's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Samples in one of the component's epochs.
    pub fn len(&self) -> u64 {
        match &self.inner {
            Inner::Source(s) => s.manifest().total_samples(),
            Inner::Mixture(m) => m.samples_per_epoch(),
        }
    }

    /// True when the component has no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn fingerprint(&self) -> String {
        match &self.inner {
            Inner::Source(s) => s.manifest().fingerprint(),
            Inner::Mixture(m) => m.manifest.fingerprint(),
        }
    }

    fn seed_for(&self, run_seed: u64) -> u64 {
        self.seed
            .unwrap_or_else(|| derive_key(&[run_seed, tag::MIX, name_hash(&self.name)]))
    }

    /// The plan of the component's epoch `epoch` under `seed`, built once and kept while
    /// it is in use.
    fn plan(&self, source: &Arc<dyn Source>, epoch: u64, seed: u64) -> Result<Arc<Plan>, Error> {
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, _, p)) = plans.iter().find(|(e, s, _)| *e == epoch && *s == seed) {
            return Ok(Arc::clone(p));
        }
        let cfg = PlanConfig {
            seed,
            epoch,
            shuffle: self.shuffle,
            ..PlanConfig::default()
        };
        let plan = Arc::new(Plan::new(source.manifest(), &cfg)?);
        source.set_plan(&plan);
        if plans.len() >= 4 {
            plans.remove(0);
        }
        plans.push((epoch, seed, Arc::clone(&plan)));
        Ok(plan)
    }
}

/// A stable 64-bit hash of a name (FNV-1a), for seeds.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A period of a stratified segment: the component of each offset, and each component's
/// count before every `CHECK`-th offset.
struct Pattern {
    quotas: Vec<u64>,
    seq: Vec<u16>,
    checks: Vec<u32>,
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
fn edf(rates: &[u64], steps: u64, picks: usize) -> Vec<u16> {
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
fn counted(seq: &[u16], checks: &[u32], k: usize, picks: usize, c: usize, steps: usize) -> u64 {
    let base = steps / CHECK;
    let rest = &seq[base * CHECK * picks..steps * picks];
    u64::from(checks[base * k + c]) + rest.iter().filter(|&&p| usize::from(p) == c).count() as u64
}

/// Each component's count before every `CHECK`-th step of `seq` (`picks` entries a step).
fn checkpoints(seq: &[u16], k: usize, picks: usize) -> Vec<u32> {
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
    fn new(quotas: Vec<u64>) -> Pattern {
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
    fn from_seq(seq: Vec<u16>, k: usize) -> Pattern {
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
    fn before(&self, c: usize, off: usize) -> u64 {
        counted(&self.seq, &self.checks, self.quotas.len(), 1, c, off)
    }
}

/// Batch-level stratification for batches of `batch` samples at constant quotas: each
/// component gets `floor(q * batch / Q)` samples of every batch, and `r` components one more,
/// chosen over a period of [`QUANTUM`] batches by earliest deadline first among released
/// bonuses (as [`Pattern`] does for single positions, `r` distinct picks per batch), so every
/// batch holds each share rounded down or up and every run of batches from the period's start
/// keeps each count within one of its share.
struct Bonus {
    floors: Vec<u64>,
    /// Bonuses per component per period.
    per_period: Vec<u64>,
    r: usize,
    picks: Vec<u16>,
    checks: Vec<u32>,
}

impl Bonus {
    fn new(quotas: &[u64], batch: u64) -> Bonus {
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
    fn before(&self, c: usize, j: u64) -> u64 {
        let (full, j) = (j / QUANTUM, (j % QUANTUM) as usize);
        let k = self.floors.len();
        full * self.per_period[c] + counted(&self.picks, &self.checks, k, self.r, c, j)
    }

    /// The composition of batch `j` of the run.
    fn batch(&self, j: u64) -> Vec<u64> {
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
fn rounded(quotas: &[u64], len: u64) -> Vec<u64> {
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
struct Segment {
    start: u64,
    weights: Vec<f64>,
    /// Each component's draws before `start`.
    counts: Vec<u64>,
    pattern: Arc<Pattern>,
}

/// Rounds `weights` (normalized) to integer quotas summing to [`QUANTUM`] by largest
/// remainder; a positive weight gets at least one part.
fn quotas(weights: &[f64]) -> Vec<u64> {
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

/// The engine's plan, as the mixture needs it to place a rank's positions.
#[derive(Debug, Clone, Copy)]
struct Ctx {
    seed: u64,
    epoch: u64,
    world: u64,
    batch: u64,
    start: u64,
}

impl Default for Ctx {
    fn default() -> Ctx {
        Ctx {
            seed: 0,
            epoch: 0,
            world: 1,
            batch: 1,
            start: 0,
        }
    }
}

/// A stratified batch: ((epoch, batch, batch size), each component's draws before it, its
/// layout).
type GridBatch = ((u64, u64, u64), Vec<u64>, Arc<Pattern>);

/// What one call of the engine's keeps while it reads: each component's plan in use and
/// its counts served (added to the totals once, at the end).
struct Reading {
    /// The stratified batch in use: ((epoch, batch, batch size), draws before it, layout).
    batch: Option<GridBatch>,
    /// `random` mode's chunk in use: (seed, chunk, chunk).
    random: Option<(u64, u64, Arc<RandomChunk>)>,
    plans: Vec<Option<(u64, u64, Arc<Plan>)>>,
    tally: Vec<(u64, u64)>,
    nested: Vec<Option<Reading>>,
}

impl Reading {
    /// Component `c`'s plan of its epoch `epoch` under `seed`: the one in use, or the
    /// component's (one lock per component epoch per call, not per sample).
    fn plan(
        &mut self,
        c: usize,
        comp: &Component,
        src: &Arc<dyn Source>,
        epoch: u64,
        seed: u64,
    ) -> Result<Arc<Plan>, Error> {
        if let Some((e, s, p)) = &self.plans[c]
            && *e == epoch
            && *s == seed
        {
            return Ok(Arc::clone(p));
        }
        let p = comp.plan(src, epoch, seed)?;
        self.plans[c] = Some((epoch, seed, Arc::clone(&p)));
        Ok(p)
    }

    fn new(m: &Mixture) -> Reading {
        let k = m.components.len();
        Reading {
            batch: None,
            random: None,
            plans: vec![None; k],
            tally: vec![(0, 0); k],
            nested: (0..k).map(|_| None).collect(),
        }
    }
}

/// Built pieces of the batch-level stratification (see [`Mixture::grid_batch`]).
#[derive(Default)]
struct GridCache {
    bonuses: Vec<((usize, u64), Arc<Bonus>)>,
    layouts: std::collections::HashMap<Vec<u64>, Arc<Pattern>>,
}

/// A component's share of a batch: its index, its collated columns and their batch rows.
type Part = (usize, Vec<(String, Column)>, Vec<usize>);

/// `random` mode's memo: the seed, each component's count before every chunk, and the
/// chunks last laid out.
#[derive(Default)]
struct RandomMemo {
    seed: u64,
    starts: Vec<Vec<u64>>,
    chunks: std::collections::VecDeque<(u64, Arc<RandomChunk>)>,
}

/// A chunk of `random` mode's positions: each component's draws before it, and its layout.
struct RandomChunk {
    counts: Vec<u64>,
    pattern: Pattern,
}

/// A weighted mixture of sources (see the module documentation).
///
/// The loader's plan (epoch, rank split, batch size) reaches the mixture through
/// [`Source::set_plan`], and it places every read by it: a mixture serves one loader at a
/// time. For a second loader (evaluation, another rank in the same process), build a second
/// mixture from the same components and options: it has the same definition and fingerprint.
pub struct Mixture {
    components: Vec<Component>,
    /// Schedule points as given, normalized: (position, weights).
    points: Vec<(u64, Vec<f64>)>,
    ramp: bool,
    segments: Vec<Segment>,
    mode: MixMode,
    policy: Policy,
    epoch_len: u64,
    source_column: Option<String>,
    seed: Option<u64>,
    manifest: Manifest,
    ctx: RwLock<Ctx>,
    memo: Mutex<RandomMemo>,
    /// The first sample's fields (sorted) and its component: every component must match.
    fields: OnceLock<(usize, Vec<String>)>,
    /// Batch-level stratification: each segment's [`Bonus`] per batch size and the layouts of
    /// batch compositions.
    grid: Mutex<GridCache>,
    /// Each component's draws before every epoch, for the batch size in use.
    epoch_starts: Mutex<(u64, Vec<Vec<u64>>)>,
    /// Set once a component had no columnar path for a batch ([`Source::collate`]): later
    /// batches go straight to the sample path instead of locating their rows twice.
    no_columnar: std::sync::atomic::AtomicBool,
}

impl fmt::Debug for Mixture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mixture")
            .field("components", &self.components)
            .field("mode", &self.mode)
            .field("policy", &self.policy)
            .field("samples_per_epoch", &self.epoch_len)
            .finish()
    }
}

/// Builds a [`Mixture`]: [`Mixture::builder`], the weights or a schedule, then
/// [`MixtureBuilder::build`].
pub struct MixtureBuilder {
    components: Vec<Component>,
    points: Vec<(u64, Vec<f64>)>,
    ramp: bool,
    mode: MixMode,
    policy: Option<Policy>,
    samples_per_epoch: Option<u64>,
    source_column: Option<String>,
    seed: Option<u64>,
}

impl fmt::Debug for MixtureBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MixtureBuilder")
            .field("components", &self.components)
            .field("points", &self.points)
            .finish()
    }
}

impl MixtureBuilder {
    /// Constant weights, one per component (normalized; need not sum to 1).
    pub fn weights(mut self, weights: Vec<f64>) -> Self {
        self.points = vec![(0, weights)];
        self
    }

    /// Weights by global sample position: `(position, weights)` points, the first at 0. Each
    /// holds until the next (or, with `ramp`, moves linearly towards it).
    pub fn schedule(mut self, points: Vec<(u64, Vec<f64>)>, ramp: bool) -> Self {
        self.points = points;
        self.ramp = ramp;
        self
    }

    /// `stratified` (default) or `random`.
    pub fn mode(mut self, mode: MixMode) -> Self {
        self.mode = mode;
        self
    }

    /// Where the epoch ends (default `stop_on_all`, or `cycle` with `samples_per_epoch`).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// The epoch's length in samples (policy `cycle`).
    pub fn samples_per_epoch(mut self, n: u64) -> Self {
        self.samples_per_epoch = Some(n);
        self
    }

    /// Adds an int64 column of this name holding each sample's component index.
    pub fn source_column(mut self, name: impl Into<String>) -> Self {
        self.source_column = Some(name.into());
        self
    }

    /// The mixture's own seed (default: the loader's), for `random` draws and the
    /// components' derived seeds.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Checks everything and builds the mixture.
    pub fn build(self) -> Result<Mixture, ConfigError> {
        let k = self.components.len();
        if k == 0 {
            return Err(ConfigError::new(
                "components",
                "a mixture needs at least one",
            ));
        }
        for (i, c) in self.components.iter().enumerate() {
            if c.name.is_empty() {
                return Err(ConfigError::new(
                    "components",
                    "a component has an empty name",
                ));
            }
            if self.components[..i].iter().any(|d| d.name == c.name) {
                return Err(ConfigError::new(
                    "components",
                    format!("two components are named {:?}", c.name),
                ));
            }
            if c.is_empty() {
                return Err(ConfigError::new(
                    "components",
                    format!("component {:?} has no samples", c.name),
                ));
            }
        }
        if k > MAX_COMPONENTS {
            return Err(ConfigError::new(
                "components",
                format!("{k} components; at most {MAX_COMPONENTS} (nest mixtures for more)"),
            ));
        }
        let names: Vec<&str> = self.components.iter().map(|c| c.name.as_str()).collect();
        let points = normalize(self.points, &names)?;
        if points.len() > MAX_SEGMENTS {
            return Err(ConfigError::new(
                "weights",
                format!("{} schedule points; at most {MAX_SEGMENTS}", points.len()),
            ));
        }
        let segments = segments(&points, self.ramp);
        if segments.len() * k > MAX_SEGMENT_WORK {
            return Err(ConfigError::new(
                "weights",
                format!(
                    "{} constant-weight segments (ramps count 64 each) of {k} components is more \
                     than {MAX_SEGMENT_WORK} segment-components; use fewer points or ramps",
                    segments.len()
                ),
            ));
        }
        let policy = match (self.policy, self.samples_per_epoch) {
            (None, Some(_)) | (Some(Policy::Cycle), Some(_)) => Policy::Cycle,
            (None, None) => Policy::StopOnAll,
            (Some(Policy::Cycle), None) => {
                return Err(ConfigError::new(
                    "samples_per_epoch",
                    "policy cycle needs samples_per_epoch (the epoch's length in samples)",
                ));
            }
            (Some(p), None) => p,
            (Some(p), Some(_)) => {
                return Err(ConfigError::new(
                    "samples_per_epoch",
                    format!(
                        "policy {p} sets the epoch's length itself; give samples_per_epoch \
                         with policy cycle"
                    ),
                ));
            }
        };
        let epoch_len = match policy {
            Policy::Cycle => self.samples_per_epoch.unwrap_or(0),
            Policy::StopOnFirst | Policy::StopOnAll => {
                let ends = self
                    .components
                    .iter()
                    .enumerate()
                    .filter_map(|(c, comp)| first_epoch_end(&segments, c, comp.len()));
                let end = if policy == Policy::StopOnFirst {
                    ends.min()
                } else {
                    ends.max()
                };
                end.ok_or_else(|| {
                    ConfigError::new("weights", "every component's weight is zero throughout")
                })?
            }
        };
        if epoch_len == 0 {
            return Err(ConfigError::new(
                "samples_per_epoch",
                "the mixture's epoch would be empty; pass at least 1",
            ));
        }
        let last = segments.last().expect("segments").start;
        if last / epoch_len > MAX_SCHEDULE_EPOCHS {
            return Err(ConfigError::new(
                "weights",
                format!(
                    "the schedule's last point, at sample {last}, is more than \
                     {MAX_SCHEDULE_EPOCHS} epochs of {epoch_len} samples away"
                ),
            ));
        }
        let definition = serde_json::json!({
            "mode": self.mode.to_string(),
            "policy": policy.to_string(),
            "samples_per_epoch": epoch_len,
            "components": self.components.iter()
                .map(|c| (c.name.clone(), serde_json::Value::from(c.fingerprint())))
                .collect::<serde_json::Map<_, _>>(),
            "weights": points.iter().map(|(p, w)| serde_json::json!([p, w])).collect::<Vec<_>>(),
            "ramp": self.ramp,
            "shuffle": self.components.iter()
                .map(|c| (c.name.clone(), serde_json::Value::from(c.shuffle.to_string())))
                .collect::<serde_json::Map<_, _>>(),
            "seeds": serde_json::json!({
                "mixture": self.seed,
                "components": self.components.iter()
                    .map(|c| (c.name.clone(), serde_json::Value::from(c.seed)))
                    .collect::<serde_json::Map<_, _>>(),
            }),
            "transforms": self.components.iter()
                .map(|c| (c.name.clone(),
                          serde_json::Value::from(c.transform.as_ref().map(|t| t.name().to_string()))))
                .collect::<serde_json::Map<_, _>>(),
            "source_column": self.source_column,
        });
        let manifest = Manifest::new(
            MIXTURE_FORMAT,
            virtual_manifest(MIXTURE_FORMAT, epoch_len).shards,
        )
        .with_param("mixture", definition);
        Ok(Mixture {
            components: self.components,
            points,
            ramp: self.ramp,
            segments,
            mode: self.mode,
            policy,
            epoch_len,
            source_column: self.source_column,
            seed: self.seed,
            manifest,
            ctx: RwLock::new(Ctx::default()),
            memo: Mutex::new(RandomMemo::default()),
            fields: OnceLock::new(),
            no_columnar: std::sync::atomic::AtomicBool::new(false),
            grid: Mutex::new(GridCache::default()),
            epoch_starts: Mutex::new((0, Vec::new())),
        })
    }
}

/// Checks and normalizes schedule points: sorted, the first at 0, one finite non-negative
/// weight per component, a positive sum.
fn normalize(
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
fn segments(points: &[(u64, Vec<f64>)], ramp: bool) -> Vec<Segment> {
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
fn stratified_count(seg: &Segment, c: usize, g: u64) -> u64 {
    let t = g - seg.start;
    let (full, off) = (t / QUANTUM, (t % QUANTUM) as usize);
    seg.counts[c] + full * seg.pattern.quotas[c] + seg.pattern.before(c, off)
}

/// The segment holding position `g`.
fn segment_at(segments: &[Segment], g: u64) -> &Segment {
    let i = segments.partition_point(|s| s.start <= g) - 1;
    &segments[i]
}

/// The first position by which component `c` has drawn `len` samples (stratified counts),
/// or `None` when its weight falls to zero for good before that.
fn first_epoch_end(segments: &[Segment], c: usize, len: u64) -> Option<u64> {
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

impl Mixture {
    /// A builder over `components` (then `weights` or `schedule`, and `build`).
    pub fn builder(components: Vec<Component>) -> MixtureBuilder {
        MixtureBuilder {
            components,
            points: Vec::new(),
            ramp: false,
            mode: MixMode::Stratified,
            policy: None,
            samples_per_epoch: None,
            source_column: None,
            seed: None,
        }
    }

    /// The components, in order.
    pub fn components(&self) -> &[Component] {
        &self.components
    }

    /// Samples in one epoch of the mixture.
    pub fn samples_per_epoch(&self) -> u64 {
        self.epoch_len
    }

    /// The mixing mode.
    pub fn mode(&self) -> MixMode {
        self.mode
    }

    /// The epoch policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The schedule: `(position, normalized weights)` points, and whether they ramp.
    pub fn schedule(&self) -> (&[(u64, Vec<f64>)], bool) {
        (&self.points, self.ramp)
    }

    /// The normalized weights in effect at global position `g`.
    pub fn weights_at(&self, g: u64) -> &[f64] {
        &segment_at(&self.segments, g).weights
    }

    /// The component at global position `g` (across epochs) and its draw number there,
    /// under `seed` (which only `random` mode uses), for the loader's batch size (the last
    /// plan's; 1 before any).
    pub fn locate(&self, g: u64, seed: u64) -> (usize, u64) {
        let b = self.ctx.read().unwrap_or_else(|e| e.into_inner()).batch;
        self.draw(g, seed, b, &mut Reading::new(self))
    }

    /// Draws of each component before global position `g` (as [`Mixture::locate`]).
    pub fn counts_before(&self, g: u64, seed: u64) -> Vec<u64> {
        let b = self.ctx.read().unwrap_or_else(|e| e.into_inner()).batch;
        match self.mode {
            MixMode::Stratified if b > 1 => {
                let (e, p) = (g / self.epoch_len, g % self.epoch_len);
                let (before, layout) = self.grid_batch(e, p / b, b);
                let t = (p % b) as usize;
                before
                    .iter()
                    .enumerate()
                    .map(|(c, n)| n + layout.before(c, t))
                    .collect()
            }
            MixMode::Stratified => (0..self.components.len())
                .map(|c| stratified_count(segment_at(&self.segments, g), c, g))
                .collect(),
            MixMode::Random => (0..self.components.len())
                .map(|c| self.random_count(c, g, seed))
                .collect(),
        }
    }

    fn random_pick(&self, g: u64, seed: u64) -> usize {
        let u = (mix64(derive_key(&[seed, tag::MIX, g])) >> 11) as f64 / (1u64 << 53) as f64;
        let w = &segment_at(&self.segments, g).weights;
        let mut acc = 0.0;
        for (c, x) in w.iter().enumerate() {
            acc += x;
            if u < acc {
                return c;
            }
        }
        // Rounding: the last component with a positive weight.
        w.iter().rposition(|&x| x > 0.0).unwrap_or(0)
    }

    fn random_count(&self, c: usize, g: u64, seed: u64) -> u64 {
        let chunk = self.random_chunk(g / RANDOM_CHUNK, seed);
        chunk.counts[c] + chunk.pattern.before(c, (g % RANDOM_CHUNK) as usize)
    }

    /// `random` mode's chunk `i` under `seed`: each component's draws before it, and its
    /// components laid out as a pattern (built once, kept for the last few chunks used).
    fn random_chunk(&self, i: u64, seed: u64) -> Arc<RandomChunk> {
        let mut memo = self.memo.lock().unwrap_or_else(|e| e.into_inner());
        let memo = &mut *memo;
        if memo.seed != seed || memo.starts.is_empty() {
            memo.seed = seed;
            memo.starts = vec![vec![0; self.components.len()]];
            memo.chunks.clear();
        }
        if let Some((_, c)) = memo.chunks.iter().find(|(j, _)| *j == i) {
            return Arc::clone(c);
        }
        let layout = |j: u64| -> Vec<u16> {
            (j * RANDOM_CHUNK..(j + 1) * RANDOM_CHUNK)
                .map(|p| self.random_pick(p, seed) as u16)
                .collect()
        };
        while memo.starts.len() as u64 <= i {
            let j = memo.starts.len() as u64 - 1;
            let mut next = memo.starts[j as usize].clone();
            for c in layout(j) {
                next[usize::from(c)] += 1;
            }
            memo.starts.push(next);
        }
        let counts = memo.starts[i as usize].clone();
        let chunk = Arc::new(RandomChunk {
            counts,
            pattern: Pattern::from_seq(layout(i), self.components.len()),
        });
        if memo.chunks.len() >= 8 {
            memo.chunks.pop_front();
        }
        memo.chunks.push_back((i, Arc::clone(&chunk)));
        chunk
    }

    /// Epoch `e`'s full batches of `b` samples as runs at constant weights: (first batch, end,
    /// segment). A batch takes the weights in effect at its first position.
    fn pieces(&self, e: u64, b: u64) -> Vec<(u64, u64, usize)> {
        let (l, e0) = (self.epoch_len, e.saturating_mul(self.epoch_len));
        let nb = l / b;
        let mut out = Vec::new();
        for (i, seg) in self.segments.iter().enumerate() {
            let first = |start: u64| start.saturating_sub(e0).div_ceil(b).min(nb);
            let lo = first(seg.start);
            let hi = self.segments.get(i + 1).map_or(nb, |n| first(n.start));
            if lo < hi {
                out.push((lo, hi, i));
            }
        }
        out
    }

    fn bonus(&self, seg: usize, b: u64) -> Arc<Bonus> {
        let mut grid = self.grid.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, x)) = grid.bonuses.iter().find(|(key, _)| *key == (seg, b)) {
            return Arc::clone(x);
        }
        let x = Arc::new(Bonus::new(&self.segments[seg].pattern.quotas, b));
        grid.bonuses.push(((seg, b), Arc::clone(&x)));
        x
    }

    /// The layout of a batch of composition `a` (earliest deadline first over its positions).
    fn layout(&self, a: &[u64]) -> Arc<Pattern> {
        let mut grid = self.grid.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(x) = grid.layouts.get(a) {
            return Arc::clone(x);
        }
        if grid.layouts.len() >= 1024 {
            grid.layouts.clear();
        }
        let x = Arc::new(Pattern::new(a.to_vec()));
        grid.layouts.insert(a.to_vec(), Arc::clone(&x));
        x
    }

    /// Draws of each component within epoch `e` before its batch `m` (batches of `b`), and
    /// that batch's composition. Full batches hold each share rounded down or up (see
    /// [`Bonus`]); an epoch's last, shorter batch its share of its length.
    fn grid_batch_in_epoch(&self, e: u64, m: u64, b: u64) -> (Vec<u64>, Vec<u64>) {
        let k = self.components.len();
        let mut before = vec![0u64; k];
        for (lo, hi, seg) in self.pieces(e, b) {
            let bonus = self.bonus(seg, b);
            let upto = m.min(hi);
            if upto > lo {
                for (c, n) in before.iter_mut().enumerate() {
                    *n += (upto - lo) * bonus.floors[c] + bonus.before(c, upto - lo);
                }
            }
            if (lo..hi).contains(&m) {
                return (before, bonus.batch(m - lo));
            }
        }
        let nb = self.epoch_len / b;
        let start = e.saturating_mul(self.epoch_len).saturating_add(nb * b);
        let quotas = &segment_at(&self.segments, start).pattern.quotas;
        (before, rounded(quotas, self.epoch_len - nb * b))
    }

    /// Each component's draws before epoch `e` (batches of `b`), memoized. Epochs from the
    /// first that lies wholly in the schedule's last segment on draw the same counts, so
    /// those are added up in closed form (the builder bounds how many epochs come before).
    fn epoch_start(&self, e: u64, b: u64) -> Vec<u64> {
        let last = self.segments.last().expect("segments").start;
        let settled = last.div_ceil(self.epoch_len);
        let mut memo = self.epoch_starts.lock().unwrap_or_else(|e| e.into_inner());
        let (memo_b, starts) = &mut *memo;
        if *memo_b != b || starts.is_empty() {
            *memo_b = b;
            *starts = vec![vec![0; self.components.len()]];
        }
        let nb = self.epoch_len / b;
        let upto = e.min(settled + 1);
        while starts.len() as u64 <= upto {
            let i = starts.len() as u64 - 1;
            let (mut n, last) = self.grid_batch_in_epoch(i, nb, b);
            if self.epoch_len > nb * b {
                for (x, y) in n.iter_mut().zip(last) {
                    *x += y;
                }
            }
            let next = starts[i as usize]
                .iter()
                .zip(n)
                .map(|(a, b)| a + b)
                .collect();
            starts.push(next);
        }
        if e <= upto {
            return starts[e as usize].clone();
        }
        // Every epoch from `settled` on adds what epoch `settled` added.
        let (a, z) = (&starts[settled as usize], &starts[settled as usize + 1]);
        a.iter()
            .zip(z)
            .map(|(x, y)| x.saturating_add((y - x).saturating_mul(e - settled)))
            .collect()
    }

    /// Each component's draws before batch `m` of epoch `e` (of `b` samples), and the
    /// batch's layout.
    fn grid_batch(&self, e: u64, m: u64, b: u64) -> (Vec<u64>, Arc<Pattern>) {
        let (mut before, a) = self.grid_batch_in_epoch(e, m, b);
        for (x, y) in before.iter_mut().zip(self.epoch_start(e, b)) {
            *x += y;
        }
        (before, self.layout(&a))
    }

    /// Stratified `(component, draw)` at global position `g` for batches of `b` (> 1).
    fn grid_draw(&self, g: u64, b: u64, r: &mut Reading) -> (usize, u64) {
        let (e, p) = (g / self.epoch_len, g % self.epoch_len);
        let (m, t) = (p / b, (p % b) as usize);
        let key = (e, m, b);
        if !matches!(&r.batch, Some((k, _, _)) if *k == key) {
            let (before, layout) = self.grid_batch(e, m, b);
            r.batch = Some((key, before, layout));
        }
        let (_, before, layout) = r.batch.as_ref().expect("set above");
        let c = usize::from(layout.seq[t]);
        (c, before[c] + layout.before(c, t))
    }

    /// `(component, draw)` at global position `g`, for the loader's batches of `b`.
    fn draw(&self, g: u64, seed: u64, b: u64, r: &mut Reading) -> (usize, u64) {
        match self.mode {
            MixMode::Stratified if b > 1 => self.grid_draw(g, b, r),
            MixMode::Stratified => self.locate_sample(g),
            MixMode::Random => {
                let i = g / RANDOM_CHUNK;
                let chunk = match &r.random {
                    Some((s, j, ch)) if *s == seed && *j == i => Arc::clone(ch),
                    _ => {
                        let ch = self.random_chunk(i, seed);
                        r.random = Some((seed, i, Arc::clone(&ch)));
                        ch
                    }
                };
                let off = (g % RANDOM_CHUNK) as usize;
                let c = usize::from(chunk.pattern.seq[off]);
                (c, chunk.counts[c] + chunk.pattern.before(c, off))
            }
        }
    }

    /// Stratified at the level of single positions (batches of 1, nested mixtures).
    fn locate_sample(&self, g: u64) -> (usize, u64) {
        let seg = segment_at(&self.segments, g);
        let off = ((g - seg.start) % QUANTUM) as usize;
        let c = usize::from(seg.pattern.seq[off]);
        (c, stratified_count(seg, c, g))
    }

    /// `random` mode counts draws chunk by chunk from position 0: refuse a position (an
    /// epoch from a hostile state) that would take hours.
    fn check_position(&self, g: u64) -> Result<(), Error> {
        if self.mode == MixMode::Random && g > MAX_RANDOM_POSITION {
            return Err(ConfigError::new(
                "epoch",
                format!(
                    "position {g} of a random-mode mixture is past the {MAX_RANDOM_POSITION} it \
                     counts draws up to; use mode stratified for runs that long"
                ),
            )
            .into());
        }
        Ok(())
    }

    /// The seed the mixture runs under, given the loader's.
    fn run_seed(&self, loader_seed: u64) -> u64 {
        self.seed.unwrap_or(loader_seed)
    }

    /// The global stream position of epoch position `p` under `ctx`: a rank's batch is a run
    /// of consecutive positions (see the module documentation).
    fn position(&self, ctx: &Ctx, p: u64) -> u64 {
        let s = if p >= ctx.start && ctx.world > 1 {
            let q = p - ctx.start;
            let round = ctx.batch.saturating_mul(ctx.world);
            let full = (self.epoch_len - ctx.start) / round * round;
            if q < full {
                let (i, r) = (q / ctx.world, q % ctx.world);
                ctx.start + (i / ctx.batch) * round + r * ctx.batch + i % ctx.batch
            } else {
                p
            }
        } else {
            p
        };
        ctx.epoch.saturating_mul(self.epoch_len).saturating_add(s)
    }

    /// The sample at global stream position `g` under `seed`, as sample `index`; `r` keeps
    /// the plans in use and the counts served for one call of the engine's.
    fn sample_at(
        &self,
        g: u64,
        seed: u64,
        batch: u64,
        index: u64,
        r: &mut Reading,
    ) -> Result<Sample, Error> {
        let seed = self.run_seed(seed);
        self.check_position(g)?;
        let (c, k) = self.draw(g, seed, batch, r);
        let comp = &self.components[c];
        let comp_seed = comp.seed_for(seed);
        let mut sample = match &comp.inner {
            Inner::Mixture(m) => {
                let inner = r.nested[c].get_or_insert_with(|| Reading::new(m));
                m.sample_at(k, comp_seed, 1, index, inner)?
            }
            Inner::Source(src) => {
                let len = src.manifest().total_samples();
                let (epoch, i) = (k / len, k % len);
                let id = r.plan(c, comp, src, epoch, comp_seed)?.order_at(i);
                let mut s = src.read(id)?;
                if let Some(t) = &comp.transform {
                    let mut rng = SampleRng::for_sample(comp_seed, epoch, id);
                    t.apply(&mut s, &mut rng).map_err(|e| Error::Transform {
                        sample: SampleRef {
                            index: id,
                            key: s.key.clone(),
                            shard: format!("component {:?}", comp.name),
                        },
                        source: e,
                    })?;
                }
                s
            }
        };
        self.check_fields(c, &sample, index)?;
        r.tally[c].0 += 1;
        if let Some(Field::Array(a)) = sample.get("tokens").or_else(|| sample.get("input_ids")) {
            r.tally[c].1 += a.shape.iter().product::<usize>() as u64;
        }
        if let Some(col) = &self.source_column {
            sample.set(col.clone(), Field::Array(Array::scalar_i64(c as i64)));
        }
        sample.index = index;
        Ok(sample)
    }

    /// Adds what `r` counted to the components' totals.
    fn flush(&self, r: Reading) {
        for ((comp, (n, t)), nested) in self.components.iter().zip(r.tally).zip(r.nested) {
            if n > 0 {
                comp.served.fetch_add(n, Ordering::Relaxed);
                comp.tokens.fetch_add(t, Ordering::Relaxed);
            }
            if let (Inner::Mixture(m), Some(inner)) = (&comp.inner, nested) {
                m.flush(inner);
            }
        }
    }

    /// [`Source::collate`]'s work: `Ok(None)` when a component has no columnar path or a
    /// column that is not a fixed-shape tensor.
    fn collate_rows(
        &self,
        ids: &[u64],
        ctx: &Ctx,
        seed: u64,
        pool: &BufferPool,
    ) -> Result<Option<Vec<(String, Column)>>, Error> {
        let k = self.components.len();
        // Each component's ids (in its own id space) and their rows in the batch.
        let mut own: Vec<(Vec<u64>, Vec<usize>)> = vec![(Vec::new(), Vec::new()); k];
        // The plan each component used last in this batch (one lock per epoch, not per row).
        let mut reading = Reading::new(self);
        for (row, &id) in ids.iter().enumerate() {
            let g = self.position(ctx, id);
            self.check_position(g)?;
            let (c, draw) = self.draw(g, seed, ctx.batch, &mut reading);
            let comp = &self.components[c];
            let Inner::Source(src) = &comp.inner else {
                return Ok(None);
            };
            let len = src.manifest().total_samples();
            let plan = reading.plan(c, comp, src, draw / len, comp.seed_for(seed))?;
            own[c].0.push(plan.order_at(draw % len));
            own[c].1.push(row);
        }
        let mut parts: Vec<Part> = Vec::new();
        for (c, (cids, rows)) in own.into_iter().enumerate() {
            if cids.is_empty() {
                continue;
            }
            let Inner::Source(src) = &self.components[c].inner else {
                return Ok(None);
            };
            let Some(cols) = src.collate(&cids, pool) else {
                self.no_columnar.store(true, Ordering::Relaxed);
                return Ok(None);
            };
            parts.push((c, cols?, rows));
        }
        let Some((first_c, first, _)) = parts.first() else {
            return Ok(Some(Vec::new()));
        };
        let n = ids.len();
        let mut out = Vec::with_capacity(first.len() + 1);
        for (name, col) in first {
            let Column::Tensor(proto) = col else {
                return Ok(None);
            };
            let row_shape = &proto.shape()[1..];
            let row_bytes = proto.as_bytes().len() / proto.shape()[0].max(1);
            let mut buf = pool.take(n * row_bytes);
            let dst = buf.as_mut_slice();
            for (c, cols, rows) in &parts {
                let theirs = cols.iter().find(|(m, _)| m == name).map(|(_, col)| col);
                let Some(Column::Tensor(t)) = theirs else {
                    return Err(self.field_error(*c, *first_c, name, ids[rows[0]]));
                };
                if t.dtype() != proto.dtype() || &t.shape()[1..] != row_shape {
                    return Ok(None); // the sample path names what differs
                }
                for (j, &row) in rows.iter().enumerate() {
                    dst[row * row_bytes..(row + 1) * row_bytes]
                        .copy_from_slice(&t.as_bytes()[j * row_bytes..(j + 1) * row_bytes]);
                }
            }
            let mut shape = vec![n];
            shape.extend_from_slice(row_shape);
            out.push((
                name.clone(),
                Column::Tensor(Tensor::new(proto.dtype(), shape, buf)),
            ));
        }
        for (c, cols, rows) in &parts {
            if cols.len() != first.len() {
                let extra = cols
                    .iter()
                    .find(|(m, _)| !first.iter().any(|(f, _)| f == m));
                let name = extra.map_or("?", |(m, _)| m.as_str());
                return Err(self.field_error(*c, *first_c, name, ids[rows[0]]));
            }
            let comp = &self.components[*c];
            comp.served.fetch_add(rows.len() as u64, Ordering::Relaxed);
            if let Some((_, Column::Tensor(t))) =
                cols.iter().find(|(m, _)| m == "tokens" || m == "input_ids")
            {
                comp.tokens.fetch_add(t.numel() as u64, Ordering::Relaxed);
            }
        }
        if let Some(col) = &self.source_column {
            let mut labels = vec![0i64; n];
            for (c, _, rows) in &parts {
                for &row in rows {
                    labels[row] = *c as i64;
                }
            }
            out.push((
                col.clone(),
                Column::Tensor(Tensor::from_slice(&labels, vec![n])),
            ));
        }
        Ok(Some(out))
    }

    fn field_error(&self, c: usize, first: usize, field: &str, index: u64) -> Error {
        Error::Collate {
            sample: SampleRef {
                index,
                key: String::new(),
                shard: format!("component {:?}", self.components[c].name),
            },
            reason: format!(
                "component {:?} and component {:?} differ in field {field:?}; every component \
                 must deliver the same fields after its transforms",
                self.components[c].name, self.components[first].name
            ),
        }
    }

    /// Every component must deliver the fields the first sample had.
    fn check_fields(&self, c: usize, sample: &Sample, index: u64) -> Result<(), Error> {
        let (first, names) = self.fields.get_or_init(|| {
            let mut names: Vec<String> = sample.fields.iter().map(|(n, _)| n.to_string()).collect();
            names.sort();
            (c, names)
        });
        let same = sample.fields.len() == names.len()
            && sample
                .fields
                .iter()
                .all(|(n, _)| names.binary_search_by(|x| x.as_str().cmp(n)).is_ok());
        if same {
            return Ok(());
        }
        let mut got: Vec<String> = sample.fields.iter().map(|(n, _)| n.to_string()).collect();
        got.sort();
        let missing: Vec<&String> = names.iter().filter(|n| !got.contains(n)).collect();
        let extra: Vec<&String> = got.iter().filter(|n| !names.contains(n)).collect();
        Err(Error::Collate {
            sample: SampleRef {
                index,
                key: sample.key.clone(),
                shard: format!("component {:?}", self.components[c].name),
            },
            reason: format!(
                "component {:?} delivers fields {got:?} but component {:?} delivers {names:?} \
                 (missing {missing:?}, extra {extra:?}); every component must deliver the same \
                 fields after its transforms",
                self.components[c].name, self.components[*first].name
            ),
        })
    }

    /// Samples (and tokens) each component has served so far, with its target share of the
    /// samples served: `{name: {samples, tokens, share, target}}`.
    pub fn served(&self) -> serde_json::Value {
        let total: u64 = self
            .components
            .iter()
            .map(|c| c.served.load(Ordering::Relaxed))
            .sum();
        // The target: the schedule's counts over as many positions as were served (in random
        // mode, the run's own draws: its seed's).
        let seed = self.run_seed(self.ctx.read().unwrap_or_else(|e| e.into_inner()).seed);
        let targets = self.counts_before(total.min(MAX_RANDOM_POSITION), seed);
        let per: serde_json::Map<String, serde_json::Value> = self
            .components
            .iter()
            .zip(&targets)
            .map(|(c, &t)| {
                let n = c.served.load(Ordering::Relaxed);
                (
                    c.name.clone(),
                    serde_json::json!({
                        "samples": n,
                        "tokens": c.tokens.load(Ordering::Relaxed),
                        "share": if total > 0 { n as f64 / total as f64 } else { 0.0 },
                        "target": if total > 0 { t as f64 / total as f64 } else { 0.0 },
                    }),
                )
            })
            .collect();
        serde_json::Value::Object(per)
    }

    /// How many of each component's epochs one mixture epoch consumes (at the schedule's
    /// weights from position 0), by name.
    pub fn epochs_per_epoch(&self) -> Vec<(String, f64)> {
        let counts = self.counts_before(self.epoch_len, self.seed.unwrap_or(0));
        self.components
            .iter()
            .zip(counts)
            .map(|(c, n)| (c.name.clone(), n as f64 / c.len() as f64))
            .collect()
    }
}

impl Source for Mixture {
    fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn read(&self, id: u64) -> Result<Sample, Error> {
        let ctx = *self.ctx.read().unwrap_or_else(|e| e.into_inner());
        let mut r = Reading::new(self);
        let s = self.sample_at(self.position(&ctx, id), ctx.seed, ctx.batch, id, &mut r);
        self.flush(r);
        s
    }

    /// One look at the plan and one update of the counts per call, not per sample.
    fn read_many(&self, ids: &[u64]) -> Vec<Result<Sample, Error>> {
        let ctx = *self.ctx.read().unwrap_or_else(|e| e.into_inner());
        let mut r = Reading::new(self);
        let out = ids
            .iter()
            .map(|&id| self.sample_at(self.position(&ctx, id), ctx.seed, ctx.batch, id, &mut r))
            .collect();
        self.flush(r);
        out
    }

    fn keep_one_order(&self) {} // its components keep theirs already

    fn set_plan(&self, plan: &Plan) {
        let cfg = plan.config();
        *self.ctx.write().unwrap_or_else(|e| e.into_inner()) = Ctx {
            seed: cfg.seed,
            epoch: cfg.epoch,
            world: cfg.world_size.max(1),
            batch: cfg.batch_size.max(1),
            start: cfg.start,
        };
    }

    fn stats(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({ "components": self.served() }))
    }

    /// A mixture orders its samples: each component by its own shuffle mode.
    fn own_order(&self) -> Option<crate::source::OwnOrder> {
        Some(crate::source::OwnOrder {
            unshuffled: self
                .components
                .iter()
                .filter(|c| c.shuffle == Shuffle::None)
                .map(|c| format!("component {:?}", c.name))
                .collect(),
            setting: "the mixture's shuffle (chute.mix(..., shuffle=...), or a component's \
                      \"shuffle\" in a mixture file)"
                .into(),
        })
    }

    fn definition_parts(&self) -> Option<BTreeMap<String, String>> {
        part_fingerprints(&self.manifest)
    }

    /// The components' counters added up (`None` when none of them keeps any).
    fn remote_io(&self) -> Option<crate::iostats::IoSnapshot> {
        self.components
            .iter()
            .filter_map(|c| match &c.inner {
                Inner::Source(s) => s.remote_io(),
                Inner::Mixture(m) => m.remote_io(),
            })
            .reduce(|a, b| a.plus(&b))
    }

    /// The columnar path when every component is a plain source with one (no transforms, no
    /// nested mixtures): each component collates its rows of the batch, and the rows are
    /// interleaved back into batch order. `None` (the sample-by-sample path) otherwise.
    fn collate(
        &self,
        ids: &[u64],
        pool: &BufferPool,
    ) -> Option<Result<Vec<(String, Column)>, Error>> {
        if self.no_columnar.load(Ordering::Relaxed)
            || self
                .components
                .iter()
                .any(|c| c.transform.is_some() || matches!(c.inner, Inner::Mixture(_)))
        {
            return None;
        }
        let ctx = *self.ctx.read().unwrap_or_else(|e| e.into_inner());
        let seed = self.run_seed(ctx.seed);
        self.collate_rows(ids, &ctx, seed, pool).transpose()
    }
}

/// A fingerprint of each part of a mixture's definition (`weights`, `components`, `seeds`,
/// ...), kept in its loader's state so that a state from another mixture is refused with
/// the parts that differ named. `None` for a manifest that is not a mixture's.
pub fn part_fingerprints(manifest: &Manifest) -> Option<BTreeMap<String, String>> {
    let def = manifest.params.get("mixture")?.as_object()?;
    Some(
        def.iter()
            .map(|(k, v)| (k.clone(), format!("{:016x}", name_hash(&v.to_string()))))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::FnSource;
    use crate::{DType, Field};

    /// `edf` as first written (each step recomputes every component's release and deadline
    /// and sorts them): the stream chute has always drawn, which the faster `edf` must give
    /// bit for bit (a mixture's order is part of its states and digests).
    fn edf_reference(rates: &[u64], steps: u64, picks: usize) -> Vec<u16> {
        let k = rates.len();
        let mut counts = vec![0u64; k];
        let mut out = Vec::with_capacity(steps as usize * picks);
        let mut due: Vec<(u64, usize)> = Vec::with_capacity(k);
        for t in 0..steps {
            due.clear();
            for c in 0..k {
                let rate = rates[c];
                if rate == 0 || counts[c] >= rate {
                    continue;
                }
                if counts[c] * steps < (t + 1) * rate {
                    due.push((((counts[c] + 1) * steps).div_ceil(rate), c));
                }
            }
            due.sort_unstable();
            for &(_, c) in due.iter().take(picks) {
                out.push(c as u16);
                counts[c] += 1;
            }
            for _ in due.len()..picks {
                let c = (0..k).find(|&c| counts[c] < rates[c]).unwrap_or(0);
                out.push(c as u16);
                counts[c] += 1;
            }
        }
        out
    }

    #[test]
    fn edf_draws_what_it_always_drew() {
        let mut rng = SampleRng::from_key(99);
        for case in 0..300 {
            let k = 1 + rng.below(8) as usize;
            let picks = 1 + rng.below(k.min(4) as u64) as usize;
            let steps = if case % 10 == 0 {
                QUANTUM
            } else {
                1 + rng.below(3000)
            };
            // Rates summing to picks * steps, as callers give them, or (one case in five) any.
            let mut rates: Vec<u64> = (0..k).map(|_| rng.below(steps + 1)).collect();
            if case % 5 != 0 {
                let total = picks as u64 * steps;
                let sum: u64 = rates.iter().sum::<u64>().max(1);
                rates = rates.iter().map(|r| r * total / sum).collect();
                let short = total - rates.iter().sum::<u64>();
                rates[0] += short;
            }
            assert_eq!(
                edf(&rates, steps, picks),
                edf_reference(&rates, steps, picks),
                "rates {rates:?}, steps {steps}, picks {picks}"
            );
        }
    }

    /// A component of `len` samples whose field `v` is `tag * 1_000_000 + id`.
    fn comp(name: &str, tag: u64, len: u64) -> Component {
        let src = FnSource::new(name, len, move |id| {
            Ok(Sample::new(id).with(
                "v",
                Field::Array(Array::scalar_i64((tag * 1_000_000 + id) as i64)),
            ))
        });
        Component::new(name, Arc::new(src))
    }

    fn value(s: &Sample) -> u64 {
        match s.get("v") {
            Some(Field::Array(a)) => {
                assert_eq!(a.dtype, DType::I64);
                i64::from_le_bytes(a.data[..8].try_into().unwrap()) as u64
            }
            other => panic!("no v: {other:?}"),
        }
    }

    #[test]
    fn stratified_prefixes_hold_each_share_within_one() {
        for weights in [
            vec![0.5, 0.3, 0.2],
            vec![0.61, 0.07, 0.32],
            vec![0.25, 0.25, 0.25, 0.25],
            vec![0.9, 0.05, 0.03, 0.01, 0.01],
            vec![1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0],
        ] {
            let k = weights.len();
            let m = Mixture::builder(
                (0..k)
                    .map(|c| comp(&format!("c{c}"), c as u64, 1000))
                    .collect(),
            )
            .weights(weights.clone())
            .samples_per_epoch(10_000)
            .build()
            .unwrap();
            let q = quotas(&m.points[0].1);
            let mut counts = vec![0u64; k];
            for g in 0..3 * QUANTUM {
                let (c, n) = m.locate(g, 0);
                assert_eq!(n, counts[c], "position {g}");
                counts[c] += 1;
                for (j, &cnt) in counts.iter().enumerate() {
                    let target = q[j] as f64 * (g + 1) as f64 / QUANTUM as f64;
                    assert!(
                        (cnt as f64 - target).abs() < 1.0,
                        "{weights:?} c{j} at {g}: {cnt} vs {target}"
                    );
                }
            }
            // Every batch of 16 holds each share rounded down or up.
            for b in 0..2000u64 {
                let (lo, hi) = (b * 16, (b + 1) * 16);
                let (a, z) = (m.counts_before(lo, 0), m.counts_before(hi, 0));
                for j in 0..k {
                    let share = q[j] as f64 * 16.0 / QUANTUM as f64;
                    let n = (z[j] - a[j]) as f64;
                    assert!(
                        n >= share.floor() - 1.0 && n <= share.ceil() + 1.0,
                        "batch {b} c{j}: {n} vs {share}"
                    );
                }
            }
        }
    }

    #[test]
    fn batches_hold_each_share_rounded_and_runs_of_them_stay_within_one() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..40 {
            let k = 2 + (next() % 5) as usize;
            let raw: Vec<f64> = (0..k).map(|_| (next() % 1000 + 1) as f64).collect();
            let b = [2, 3, 8, 16, 17, 64, 100, 256][round % 8];
            let m = Mixture::builder(
                (0..k)
                    .map(|c| comp(&format!("c{c}"), c as u64, 50))
                    .collect(),
            )
            .weights(raw.clone())
            .samples_per_epoch(b * 300 + 5)
            .build()
            .unwrap();
            let q = quotas(&m.points[0].1);
            let mut cum = vec![0u64; k];
            let mut r = Reading::new(&m);
            for j in 0..300u64 {
                let mut a = vec![0u64; k];
                for t in 0..b {
                    let (c, n) = m.draw(j * b + t, 0, b, &mut r);
                    assert_eq!(n, cum[c] + a[c], "{raw:?} b={b} batch {j} offset {t}");
                    a[c] += 1;
                }
                for c in 0..k {
                    let share = q[c] as f64 * b as f64 / QUANTUM as f64;
                    assert!(
                        a[c] as f64 >= share.floor() && a[c] as f64 <= share.ceil(),
                        "{raw:?} b={b} batch {j}: c{c} has {} of share {share}",
                        a[c]
                    );
                    cum[c] += a[c];
                    let target = share * (j + 1) as f64;
                    assert!(
                        (cum[c] as f64 - target).abs() < 1.0,
                        "{raw:?} b={b} after {} batches: c{c} {} vs {target}",
                        j + 1,
                        cum[c]
                    );
                }
            }
        }
    }

    #[test]
    fn draw_numbers_run_on_across_epochs_and_past_the_schedule() {
        let m = Mixture::builder(vec![comp("a", 0, 9), comp("b", 1, 9), comp("c", 2, 9)])
            .schedule(
                vec![(0, vec![0.5, 0.3, 0.2]), (100, vec![0.1, 0.1, 0.8])],
                false,
            )
            .samples_per_epoch(70)
            .build()
            .unwrap();
        for b in [1, 8, 16, 70, 100] {
            let mut counts = [0u64; 3];
            let mut r = Reading::new(&m);
            for g in 0..70 * 12 {
                let (c, n) = m.draw(g, 0, b, &mut r);
                assert_eq!(n, counts[c], "b={b} position {g}");
                counts[c] += 1;
            }
        }
        let far = m.epoch_start(1_000_000_000_000, 8);
        assert_eq!(far.iter().sum::<u64>(), 70 * 1_000_000_000_000);
    }

    #[test]
    fn hostile_sizes_are_refused_not_computed() {
        let many: Vec<(u64, Vec<f64>)> = (0..5000).map(|i| (i, vec![1.0, 1.0])).collect();
        let e = Mixture::builder(vec![comp("a", 0, 5), comp("b", 1, 5)])
            .schedule(many, false)
            .samples_per_epoch(10)
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("schedule points"), "{e}");
        let e = Mixture::builder(vec![comp("a", 0, 5), comp("b", 1, 5)])
            .schedule(
                vec![(0, vec![1.0, 1.0]), (u64::MAX / 2, vec![1.0, 2.0])],
                false,
            )
            .samples_per_epoch(10)
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("epochs of 10 samples away"), "{e}");
        let m = Mixture::builder(vec![comp("a", 0, 5), comp("b", 1, 5)])
            .weights(vec![1.0, 1.0])
            .mode(MixMode::Random)
            .samples_per_epoch(10)
            .build()
            .unwrap();
        let cfg = PlanConfig {
            epoch: u64::MAX / 20,
            ..PlanConfig::default()
        };
        m.set_plan(&Plan::new(m.manifest(), &cfg).unwrap());
        let e = m.read(3).unwrap_err();
        assert!(e.to_string().contains("random-mode mixture"), "{e}");
    }

    #[test]
    fn components_cycle_through_their_own_epochs_reshuffled() {
        let m = Mixture::builder(vec![comp("a", 0, 10), comp("b", 1, 7)])
            .weights(vec![0.5, 0.5])
            .policy(Policy::StopOnFirst)
            .build()
            .unwrap();
        // b (7 samples at half the positions) runs out first: by position 14.
        assert_eq!(m.samples_per_epoch(), 14);
        let mut b_epochs: Vec<Vec<u64>> = vec![Vec::new(); 4];
        let mut a_seen = Vec::new();
        for g in 0..56 {
            let s = m.sample_at(g, 9, 1, g, &mut Reading::new(&m)).unwrap();
            let v = value(&s);
            if v >= 1_000_000 {
                let (_, k) = m.locate(g, 9);
                b_epochs[(k / 7) as usize].push(v - 1_000_000);
            } else {
                a_seen.push(v);
            }
        }
        for e in &b_epochs {
            let mut sorted = e.clone();
            sorted.sort();
            assert_eq!(
                sorted,
                (0..7).collect::<Vec<_>>(),
                "each epoch of b holds every sample once"
            );
        }
        assert_ne!(b_epochs[0], b_epochs[1], "the next epoch is reshuffled");
        let mut first: Vec<u64> = a_seen[..10].to_vec();
        first.sort();
        assert_eq!(first, (0..10).collect::<Vec<_>>());
        // stop_on_all: a (10 samples, drawn first) finishes last, after 19 positions.
        let all = Mixture::builder(vec![comp("a", 0, 10), comp("b", 1, 7)])
            .weights(vec![0.5, 0.5])
            .build()
            .unwrap();
        assert_eq!(all.samples_per_epoch(), 19);
    }

    #[test]
    fn schedules_change_the_shares_at_their_points_and_ramps_move_smoothly() {
        let m = Mixture::builder(vec![comp("a", 0, 100), comp("b", 1, 100)])
            .schedule(vec![(0, vec![0.75, 0.25]), (1000, vec![0.25, 0.75])], false)
            .samples_per_epoch(4000)
            .build()
            .unwrap();
        let at = |g| m.counts_before(g, 0);
        assert_eq!(at(1000), vec![750, 250]);
        let d: Vec<u64> = at(2000).iter().zip(at(1000)).map(|(x, y)| x - y).collect();
        assert_eq!(d, vec![250, 750]);
        assert_eq!(m.weights_at(999), &[0.75, 0.25]);
        assert_eq!(m.weights_at(1000), &[0.25, 0.75]);
        let r = Mixture::builder(vec![comp("a", 0, 100), comp("b", 1, 100)])
            .schedule(vec![(0, vec![1.0, 0.0]), (6400, vec![0.0, 1.0])], true)
            .samples_per_epoch(8000)
            .build()
            .unwrap();
        assert!(r.weights_at(0)[0] > 0.99 && r.weights_at(0)[0] < 1.0);
        assert!((r.weights_at(3200)[0] - 0.5).abs() < 0.02);
        assert_eq!(r.weights_at(7000), &[0.0, 1.0]);
        // The counts are continuous across the steps.
        let total: u64 = r.counts_before(6400, 0).iter().sum();
        assert_eq!(total, 6400);
    }

    #[test]
    fn random_mode_counts_match_a_scan() {
        let m = Mixture::builder(vec![comp("a", 0, 50), comp("b", 1, 30), comp("c", 2, 20)])
            .weights(vec![0.5, 0.3, 0.2])
            .mode(MixMode::Random)
            .samples_per_epoch(5000)
            .build()
            .unwrap();
        let mut counts = [0u64; 3];
        for g in 0..5000 {
            let (c, n) = m.locate(g, 3);
            assert_eq!(n, counts[c]);
            counts[c] += 1;
        }
        assert!(counts[0] > 2300 && counts[0] < 2700, "{counts:?}");
        let other: Vec<usize> = (0..64).map(|g| m.locate(g, 4).0).collect();
        let same: Vec<usize> = (0..64).map(|g| m.locate(g, 3).0).collect();
        assert_ne!(other, same, "the seed changes the draws");
    }

    #[test]
    fn nested_mixtures_and_field_checks() {
        let inner = Arc::new(
            Mixture::builder(vec![comp("x", 5, 4), comp("y", 6, 4)])
                .weights(vec![0.5, 0.5])
                .build()
                .unwrap(),
        );
        let m = Mixture::builder(vec![comp("a", 0, 8), Component::mixture("xy", inner)])
            .weights(vec![0.5, 0.5])
            .source_column("source")
            .build()
            .unwrap();
        assert_eq!(m.samples_per_epoch(), 16);
        let mut tags = std::collections::BTreeSet::new();
        for g in 0..16 {
            let s = m.read(g).unwrap();
            tags.insert(value(&s) / 1_000_000);
            assert!(s.get("source").is_some());
        }
        assert_eq!(tags.into_iter().collect::<Vec<_>>(), vec![0, 5, 6]);
        let odd = FnSource::new("odd", 5, |id| {
            Ok(Sample::new(id).with("w", Field::Array(Array::scalar_i64(id as i64))))
        });
        let m = Mixture::builder(vec![comp("a", 0, 5), Component::new("odd", Arc::new(odd))])
            .weights(vec![0.5, 0.5])
            .build()
            .unwrap();
        let err = (0..4)
            .map(|g| m.read(g))
            .find_map(Result::err)
            .unwrap()
            .to_string();
        assert!(
            err.contains("\"odd\"") && err.contains("\"w\"") && err.contains("same fields"),
            "{err}"
        );
    }

    /// A source with a columnar path: `v` as in [`comp`], collated into an i64 tensor.
    struct Columnar {
        manifest: Manifest,
        tag: u64,
    }

    impl Source for Columnar {
        fn manifest(&self) -> &Manifest {
            &self.manifest
        }
        fn read(&self, id: u64) -> Result<Sample, Error> {
            let v = (self.tag * 1_000_000 + id) as i64;
            Ok(Sample::new(id).with("v", Field::Array(Array::scalar_i64(v))))
        }
        fn collate(
            &self,
            ids: &[u64],
            _pool: &BufferPool,
        ) -> Option<Result<Vec<(String, Column)>, Error>> {
            let v: Vec<i64> = ids
                .iter()
                .map(|&i| (self.tag * 1_000_000 + i) as i64)
                .collect();
            let t = Tensor::from_slice(&v, vec![ids.len()]);
            Some(Ok(vec![("v".to_string(), Column::Tensor(t))]))
        }
    }

    #[test]
    fn the_columnar_path_gives_the_samples_the_sample_path_gives() {
        let columnar = |tag, len| -> Arc<dyn Source> {
            Arc::new(Columnar {
                manifest: virtual_manifest("c", len),
                tag,
            })
        };
        let m = Mixture::builder(vec![
            Component::new("a", columnar(0, 13)),
            Component::new("b", columnar(1, 7)),
        ])
        .weights(vec![0.7, 0.3])
        .samples_per_epoch(60)
        .source_column("src")
        .build()
        .unwrap();
        let pool = BufferPool::new(1 << 20);
        let ids: Vec<u64> = (0..60).collect();
        let cols = m.collate(&ids, &pool).unwrap().unwrap();
        let get = |name: &str| -> Vec<i64> {
            let Some((_, Column::Tensor(t))) = cols.iter().find(|(n, _)| n == name) else {
                panic!("no {name}")
            };
            t.as_bytes()
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
                .collect()
        };
        let (v, src) = (get("v"), get("src"));
        for (i, &id) in ids.iter().enumerate() {
            let s = m.read(id).unwrap();
            assert_eq!(v[i] as u64, value(&s), "row {i}");
            assert_eq!(src[i], v[i] / 1_000_000);
        }
        assert_eq!(m.served()["a"]["samples"].as_u64().unwrap() % 42, 0);
    }

    #[test]
    fn bad_definitions_are_refused_by_name() {
        let e = |b: MixtureBuilder| b.build().unwrap_err().to_string();
        let two = || vec![comp("a", 0, 5), comp("b", 1, 5)];
        assert!(e(Mixture::builder(two()).weights(vec![1.0])).contains("1 weights"));
        assert!(e(Mixture::builder(two()).weights(vec![1.0, -1.0])).contains("\"b\""));
        assert!(e(Mixture::builder(two()).weights(vec![0.0, 0.0])).contains("all zero"));
        assert!(
            e(Mixture::builder(two())
                .weights(vec![1.0, 1.0])
                .policy(Policy::Cycle))
            .contains("samples_per_epoch")
        );
        assert!(
            e(Mixture::builder(two()).schedule(vec![(5, vec![1.0, 1.0])], false))
                .contains("first point")
        );
        assert!(
            e(Mixture::builder(vec![comp("a", 0, 5), comp("a", 1, 5)]).weights(vec![1.0, 1.0]))
                .contains("two components")
        );
        assert!(
            e(Mixture::builder(two())
                .weights(vec![1.0, 1.0])
                .policy(Policy::StopOnAll)
                .samples_per_epoch(3))
            .contains("cycle")
        );
    }
}
