//! [`Mixture`] and its [`Component`]s (a component may itself be a mixture): the mixture as a
//! [`Source`]: where each position's draw lies, the reads, the columnar path, the figures it
//! keeps.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use chute_core::{
    Array, BufferPool, Column, ConfigError, Error, Field, Manifest, Plan, PlanConfig, Sample,
    SampleRef, SampleRng, Shuffle, Source, Tensor, Transform, derive_key, mix64, tag,
};

use super::mode::{MixMode, Policy, name_hash};
use super::schedule::{
    Bonus, MAX_RANDOM_POSITION, Pattern, QUANTUM, RANDOM_CHUNK, Segment, rounded, segment_at,
    stratified_count,
};

/// What a component draws from.
pub(super) enum Inner {
    Source(Arc<dyn Source>),
    Mixture(Arc<Mixture>),
}

/// One component of a mixture: a source (or a mixture) with its own shuffle, seed and
/// transform.
pub struct Component {
    pub(super) name: String,
    pub(super) inner: Inner,
    pub(super) shuffle: Shuffle,
    pub(super) seed: Option<u64>,
    pub(super) transform: Option<Arc<dyn Transform>>,
    /// The plans of the component's epochs last used: `(epoch, seed, plan)`.
    pub(super) plans: Mutex<Vec<(u64, u64, Arc<Plan>)>>,
    pub(super) served: AtomicU64,
    pub(super) tokens: AtomicU64,
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

    pub(super) fn fingerprint(&self) -> String {
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

/// The engine's plan, as the mixture needs it to place a rank's positions.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ctx {
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
pub(super) struct Reading {
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

    pub(super) fn new(m: &Mixture) -> Reading {
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
pub(super) struct GridCache {
    bonuses: Vec<((usize, u64), Arc<Bonus>)>,
    layouts: std::collections::HashMap<Vec<u64>, Arc<Pattern>>,
}

/// A component's share of a batch: its index, its collated columns and their batch rows.
type Part = (usize, Vec<(String, Column)>, Vec<usize>);

/// `random` mode's memo: the seed, each component's count before every chunk, and the
/// chunks last laid out.
#[derive(Default)]
pub(super) struct RandomMemo {
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
    pub(super) components: Vec<Component>,
    /// Schedule points as given, normalized: (position, weights).
    pub(super) points: Vec<(u64, Vec<f64>)>,
    pub(super) ramp: bool,
    pub(super) segments: Vec<Segment>,
    pub(super) mode: MixMode,
    pub(super) policy: Policy,
    pub(super) epoch_len: u64,
    pub(super) source_column: Option<String>,
    pub(super) seed: Option<u64>,
    pub(super) manifest: Manifest,
    pub(super) ctx: RwLock<Ctx>,
    pub(super) memo: Mutex<RandomMemo>,
    /// The first sample's fields (sorted) and its component: every component must match.
    pub(super) fields: OnceLock<(usize, Vec<String>)>,
    /// Batch-level stratification: each segment's [`Bonus`] per batch size and the layouts of
    /// batch compositions.
    pub(super) grid: Mutex<GridCache>,
    /// Each component's draws before every epoch, for the batch size in use.
    pub(super) epoch_starts: Mutex<(u64, Vec<Vec<u64>>)>,
    /// Set once a component had no columnar path for a batch ([`Source::collate`]): later
    /// batches go straight to the sample path instead of locating their rows twice.
    pub(super) no_columnar: std::sync::atomic::AtomicBool,
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

impl Mixture {
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
    pub(super) fn epoch_start(&self, e: u64, b: u64) -> Vec<u64> {
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
    pub(super) fn draw(&self, g: u64, seed: u64, b: u64, r: &mut Reading) -> (usize, u64) {
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
    pub(super) fn sample_at(
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

    /// `chute_mixture_samples_total{component}` and `chute_mixture_target_ratio{component}`:
    /// the samples each component served, and the share it should have served.
    fn metrics(&self) -> Vec<chute_core::MetricFamily> {
        let served = self.served();
        let per: Vec<(&String, &serde_json::Value)> = served
            .as_object()
            .map(|m| m.iter().collect())
            .unwrap_or_default();
        let family = |name: &str, kind, help: &str, key: &str| chute_core::MetricFamily {
            name: name.into(),
            kind,
            help: help.into(),
            series: per
                .iter()
                .map(|(c, v)| {
                    let value = v.get(key).and_then(|x| x.as_f64()).unwrap_or(0.0);
                    (vec![("component".to_string(), (*c).clone())], value)
                })
                .collect(),
        };
        vec![
            family(
                "chute_mixture_samples_total",
                "counter",
                "Samples a mixture served per component.",
                "samples",
            ),
            family(
                "chute_mixture_target_ratio",
                "gauge",
                "The share of the mixture's samples each component should have served.",
                "target",
            ),
        ]
    }

    /// A mixture orders its samples: each component by its own shuffle mode.
    fn own_order(&self) -> Option<chute_core::OwnOrder> {
        Some(chute_core::OwnOrder {
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
    fn remote_io(&self) -> Option<chute_core::iostats::IoSnapshot> {
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
