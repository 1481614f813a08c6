//! [`Loader`] and [`LoaderBuilder`]: the public face of the engine.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use chute_core::{
    Batch, BufferPool, ConfigError, Error, OnError, Plan, PlanConfig, STATE_VERSION, Shuffle,
    Source, State, StateError,
};
use chute_core::{Compose, Transform};

use crate::autotune::{Autotune, Tuner};
use crate::pinned::cuda_host_allocator;
use crate::stats::{RemoteCounts, Stats, StatsSnapshot, snapshot};
use crate::workers::{Job, Polled, Run};

/// Options of a [`Loader`], with `torch.utils.data.DataLoader`'s names and meanings where
/// they exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoaderOptions {
    /// Samples per batch. Default 1.
    pub batch_size: usize,
    /// Ordering mode. Default [`Shuffle::None`].
    pub shuffle: Shuffle,
    /// Seed of the run (orders and per-sample RNGs). Default 0.
    pub seed: u64,
    /// Worker threads; 0 builds batches in the consumer's thread. Default 0.
    pub num_workers: usize,
    /// Finished batches allowed to wait for the consumer, on top of one being built per
    /// worker. Default 2.
    pub prefetch: usize,
    /// Drop the last incomplete batch (true) or deliver it short (false). Default false.
    pub drop_last: bool,
    /// This process's rank. Default 0.
    pub rank: u64,
    /// Number of ranks. Default 1.
    pub world_size: u64,
    /// First epoch. Default 0.
    pub epoch: u64,
    /// Allocate batch buffers page-locked through the CUDA runtime (loaded at run time), so
    /// host-to-device copies can run asynchronously. Without a CUDA runtime, ordinary memory
    /// is used and [`Loader::pin_memory_fallback`] says why. Default false.
    pub pin_memory: bool,
    /// What to do with a sample that fails to read or transform. Default [`OnError::Raise`].
    pub on_error: OnError,
    /// Arrays whose shapes differ within a batch: `false` delivers them as a
    /// [`Column::List`](chute_core::Column::List) of per-sample tensors (a batch whose arrays
    /// happen to share one shape gets a plain tensor); `true` pads them with zeros (at the end
    /// of every dimension) to the batch's largest shape, in one tensor, and adds a
    /// `<name>_mask` column (`bool`, the same shape, true where a value is real) to every
    /// array field of one or more dimensions that the batcher collates, in every batch.
    /// Default false.
    pub pad: bool,
    /// The span of [`StatsSnapshot::window`]: `stats()` reports rates and the wait fraction
    /// over the last this long. Default 10 s.
    pub stats_window: Duration,
    /// The loader's name in its metrics (the `loader` label of
    /// [`metrics`](crate::metrics)), for a process with several (`"train"`, `"val"`).
    /// Default: empty, which names it by the order loaders were built (`"0"`, `"1"`...).
    pub name: String,
    /// Serve every live loader's metrics for Prometheus at `http://ADDR/metrics` once this
    /// loader is built ([`metrics::serve`](crate::metrics::serve); an address already served
    /// is served once). Default: none.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Tune the workers and the prefetch depth while the loader runs, to the consumer's
    /// pace (see [`Autotune`]); `num_workers` and `prefetch` are then the most it may use.
    /// The delivered stream is the same. Default: none (fixed).
    pub autotune: Option<Autotune>,
}

impl Default for LoaderOptions {
    fn default() -> Self {
        LoaderOptions {
            batch_size: 1,
            shuffle: Shuffle::None,
            seed: 0,
            num_workers: 0,
            prefetch: 2,
            drop_last: false,
            rank: 0,
            world_size: 1,
            epoch: 0,
            pin_memory: false,
            on_error: OnError::Raise,
            pad: false,
            stats_window: Duration::from_secs(10),
            name: String::new(),
            metrics_addr: None,
            autotune: None,
        }
    }
}

/// Builds a [`Loader`]; `build()` checks every option.
pub struct LoaderBuilder {
    source: Arc<dyn Source>,
    options: LoaderOptions,
    transforms: Compose,
}

impl fmt::Debug for LoaderBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoaderBuilder")
            .field("options", &self.options)
            .field("transforms", &self.transforms)
            .finish()
    }
}

impl LoaderBuilder {
    /// Samples per batch.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.options.batch_size = n;
        self
    }

    /// Ordering mode.
    pub fn shuffle(mut self, s: Shuffle) -> Self {
        self.options.shuffle = s;
        self
    }

    /// Seed of the run.
    pub fn seed(mut self, s: u64) -> Self {
        self.options.seed = s;
        self
    }

    /// Worker threads (0: build batches in the consumer's thread).
    pub fn num_workers(mut self, n: usize) -> Self {
        self.options.num_workers = n;
        self
    }

    /// Finished batches allowed to wait for the consumer.
    pub fn prefetch(mut self, n: usize) -> Self {
        self.options.prefetch = n;
        self
    }

    /// Drop the last incomplete batch.
    pub fn drop_last(mut self, d: bool) -> Self {
        self.options.drop_last = d;
        self
    }

    /// This process's rank and the number of ranks.
    pub fn distributed(mut self, rank: u64, world_size: u64) -> Self {
        self.options.rank = rank;
        self.options.world_size = world_size;
        self
    }

    /// First epoch.
    pub fn epoch(mut self, e: u64) -> Self {
        self.options.epoch = e;
        self
    }

    /// Page-locked batch buffers (see [`LoaderOptions::pin_memory`]).
    pub fn pin_memory(mut self, p: bool) -> Self {
        self.options.pin_memory = p;
        self
    }

    /// What to do with a sample that fails (see [`OnError`]).
    pub fn on_error(mut self, e: OnError) -> Self {
        self.options.on_error = e;
        self
    }

    /// Pad arrays of differing shapes and add a mask (see [`LoaderOptions::pad`]).
    pub fn pad(mut self, pad: bool) -> Self {
        self.options.pad = pad;
        self
    }

    /// The span of the windowed figures of `stats()` (see [`LoaderOptions::stats_window`]).
    pub fn stats_window(mut self, window: Duration) -> Self {
        self.options.stats_window = window;
        self
    }

    /// The loader's name in its metrics (see [`LoaderOptions::name`]).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.options.name = name.into();
        self
    }

    /// Serve the metrics at `addr` (see [`LoaderOptions::metrics_addr`]).
    pub fn metrics_addr(mut self, addr: std::net::SocketAddr) -> Self {
        self.options.metrics_addr = Some(addr);
        self
    }

    /// Tune the workers and the prefetch depth while the loader runs (see
    /// [`LoaderOptions::autotune`]).
    pub fn autotune(mut self, a: Autotune) -> Self {
        self.options.autotune = Some(a);
        self
    }

    /// All options at once.
    pub fn options(mut self, o: LoaderOptions) -> Self {
        self.options = o;
        self
    }

    /// Appends a transform (run in order, on the workers).
    pub fn transform(mut self, t: impl Transform) -> Self {
        self.transforms.push(Arc::new(t));
        self
    }

    /// Appends a shared transform.
    pub fn transform_arc(mut self, t: Arc<dyn Transform>) -> Self {
        self.transforms.push(t);
        self
    }

    /// Checks the options and builds the loader. No thread starts until the first `next()`.
    pub fn build(self) -> Result<Loader, ConfigError> {
        let o = &self.options;
        if o.batch_size == 0 {
            return Err(ConfigError::new("batch_size", "must be at least 1, got 0"));
        }
        if o.prefetch == 0 && o.num_workers > 0 {
            return Err(ConfigError::new(
                "prefetch",
                "must be at least 1 when num_workers > 0 (it is the depth of the ready queue)",
            ));
        }
        if o.num_workers > 1024 {
            return Err(ConfigError::new(
                "num_workers",
                format!(
                    "{} threads is more than 1024; use about one per core",
                    o.num_workers
                ),
            ));
        }
        if o.autotune.is_some() && o.num_workers == 0 {
            return Err(ConfigError::new(
                "num_workers",
                "autotune needs num_workers >= 1: it is the most workers the tuner may use",
            ));
        }
        if o.stats_window.is_zero() {
            return Err(ConfigError::new(
                "stats_window",
                "must be longer than zero (the default is 10 seconds)",
            ));
        }
        // A source that orders itself (see `Source::own_order`) keeps the plan in order; a
        // loader shuffle that agrees with its own order (DataLoader's `shuffle=True` habit)
        // is accepted as the plan's `none`, so states and order are those of shuffle off.
        let plan_shuffle = match self.source.own_order() {
            Some(order) => order.plan_shuffle(o.shuffle)?,
            None => o.shuffle,
        };
        let (pool, pin_memory_fallback) = if o.pin_memory {
            match cuda_host_allocator() {
                Ok(a) => (BufferPool::with_allocator(POOL_IDLE, a), None),
                Err(why) => (BufferPool::new(POOL_IDLE), Some(why)),
            }
        } else {
            (BufferPool::new(POOL_IDLE), None)
        };
        let stats = Arc::new(Stats::new(o.stats_window, RemoteCounts::of(&self.source)));
        let tuner = o.autotune.map(|a| Tuner::new(a, o.num_workers, o.prefetch));
        stats.autotuned(tuner.as_ref().map(Tuner::stats));
        let loader = Loader {
            plan_cfg: PlanConfig {
                seed: o.seed,
                epoch: o.epoch,
                rank: o.rank,
                world_size: o.world_size,
                shuffle: plan_shuffle,
                batch_size: o.batch_size as u64,
                drop_last: o.drop_last,
                start: 0,
                taken: Vec::new(),
            },
            transform: (!self.transforms.is_empty())
                .then(|| Arc::new(self.transforms) as Arc<dyn Transform>),
            fingerprint: self.source.manifest().fingerprint(),
            source: self.source,
            options: self.options,
            delivered: 0,
            pool,
            pin_memory_fallback,
            stats,
            run: None,
            pending_wait: Duration::ZERO,
            end_pending: false,
            tuner,
        };
        // Validates rank/world_size/shuffle against the manifest up front.
        loader.plan()?;
        crate::metrics::register(&loader.series());
        if let Some(addr) = loader.options.metrics_addr {
            crate::metrics::serve(addr)
                .map_err(|e| ConfigError::new("metrics_addr", e.to_string()))?;
        }
        Ok(loader)
    }
}

/// A deterministic, resumable, parallel batch loader over a [`Source`].
///
/// Iterating yields the batches of the current epoch, then `None` once (so `for batch in &mut
/// loader` is one epoch). An epoch is over as soon as its last batch is delivered: from then
/// on [`epoch`](Loader::epoch) and [`state`](Loader::state) name the next epoch, and a consumer
/// that took exactly [`len`](Loader::len) batches and never asked for the `None` starts the
/// next epoch by calling [`begin_pass`](Loader::begin_pass) (what Python's `iter(loader)`
/// does) instead of getting an empty one.
/// The stream is a pure function of the source's manifest and the options: identical for any
/// `num_workers` and `prefetch`.
///
/// An error from `next()` concerns one batch (named sample and reason); that batch is
/// skipped and iteration may continue, as with PyTorch's DataLoader.
pub struct Loader {
    source: Arc<dyn Source>,
    transform: Option<Arc<dyn Transform>>,
    options: LoaderOptions,
    fingerprint: String,
    /// Epoch, seed, rank split and `start` of the current epoch.
    plan_cfg: PlanConfig,
    /// Samples delivered in the current epoch's split.
    delivered: u64,
    pool: BufferPool,
    /// Why `pin_memory` could not be honoured, if it was asked for and could not.
    pin_memory_fallback: Option<String>,
    stats: Arc<Stats>,
    run: Option<Run>,
    /// Time waited in `next_timeout` calls that returned pending since the last batch.
    pending_wait: Duration,
    /// The epoch before the current one ended with its last batch and its closing `None` has
    /// not been returned yet: the next `next()` returns it (unless [`Loader::begin_pass`]
    /// says a new pass over the data begins).
    end_pending: bool,
    /// With [`LoaderOptions::autotune`]: the workers and prefetch depth it chose so far.
    tuner: Option<Tuner>,
}

/// Idle buffers a loader's pool keeps for reuse.
const POOL_IDLE: usize = 64;

/// What [`Loader::next_timeout`] found.
#[derive(Debug)]
pub enum Poll {
    /// What `next()` would have returned: a batch, an error, or `None` at the end of an epoch.
    Ready(Option<Result<Batch, Error>>),
    /// No batch was ready in time; nothing was consumed, call again.
    Pending,
}

impl fmt::Debug for Loader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loader")
            .field("options", &self.options)
            .field("epoch", &self.plan_cfg.epoch)
            .field("delivered", &self.delivered)
            .finish()
    }
}

impl Loader {
    /// A builder over `source`.
    pub fn builder(source: impl Source) -> LoaderBuilder {
        Self::builder_arc(Arc::new(source))
    }

    /// A builder over a shared source.
    pub fn builder_arc(source: Arc<dyn Source>) -> LoaderBuilder {
        LoaderBuilder {
            source,
            options: LoaderOptions::default(),
            transforms: Compose::new(),
        }
    }

    /// The options the loader was built with.
    pub fn options(&self) -> &LoaderOptions {
        &self.options
    }

    /// The source.
    pub fn source(&self) -> &Arc<dyn Source> {
        &self.source
    }

    /// The transforms run on the workers, composed (none when there are none).
    pub fn transform(&self) -> Option<&Arc<dyn Transform>> {
        self.transform.as_ref()
    }

    /// The current epoch.
    pub fn epoch(&self) -> u64 {
        self.plan_cfg.epoch
    }

    /// The current epoch's plan for this rank.
    pub fn plan(&self) -> Result<Plan, ConfigError> {
        Plan::new(self.source.manifest(), &self.plan_cfg)
    }

    /// Batches per epoch on this rank (a full epoch, from the start).
    pub fn len(&self) -> usize {
        let cfg = PlanConfig {
            start: 0,
            taken: Vec::new(),
            ..self.plan_cfg.clone()
        };
        Plan::new(self.source.manifest(), &cfg)
            .map(|p| p.num_batches() as usize)
            .unwrap_or(0)
    }

    /// True when an epoch has no batches on this rank.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Moves to the start of epoch `epoch`. Setting the epoch the loader is already in keeps
    /// its position, so `set_epoch(e)` at the top of an epoch loop is safe after a restore.
    ///
    /// As with `DistributedSampler.set_epoch`, the epoch set is the one the next pass reads;
    /// calling it is optional (each finished epoch moves the loader to the next one).
    pub fn set_epoch(&mut self, epoch: u64) {
        self.end_pending = false;
        if epoch != self.plan_cfg.epoch {
            self.run = None;
            self.pending_wait = Duration::ZERO;
            self.plan_cfg.epoch = epoch;
            self.rewind();
        }
    }

    /// For a source with a definition of parts (`Source::definition_parts`), a fingerprint
    /// of each part, and the batch size (its batches may be stratified for it): what its
    /// states carry and are checked against.
    fn definition_parts(&self) -> Option<std::collections::BTreeMap<String, String>> {
        let mut parts = self.source.definition_parts()?;
        parts.insert("batch_size".into(), self.plan_cfg.batch_size.to_string());
        Some(parts)
    }

    /// The loader's position as of the last batch delivered. After the last batch of an epoch
    /// it is the start of the next epoch.
    pub fn state(&self) -> State {
        let (mut epoch, mut start, mut taken, mut delivered) = (
            self.plan_cfg.epoch,
            self.plan_cfg.start,
            self.plan_cfg.taken.clone(),
            self.delivered,
        );
        if self.plan().map(|p| delivered >= p.len()).unwrap_or(false) {
            (epoch, start, taken, delivered) = (epoch + 1, 0, Vec::new(), 0);
        }
        State {
            version: STATE_VERSION,
            dataset: self.fingerprint.clone(),
            seed: self.plan_cfg.seed,
            epoch,
            start,
            taken,
            delivered,
            drop_last: self.plan_cfg.drop_last,
            world_size: self.plan_cfg.world_size,
            shuffle: self.plan_cfg.shuffle,
            parts: self.definition_parts().unwrap_or_default(),
        }
    }

    /// Continues from `state`: the next batch is the one that followed the state's last
    /// delivered batch. Refuses states of another dataset, version, seed or shuffle mode.
    ///
    /// A state taken with another world size (an elastic resume) continues with the samples
    /// the old ranks had not read, split among the new ones: under `none`/`global` shuffle
    /// they are the rest of the epoch order from a position on; under `block` shuffle the
    /// old ranks had each read the head of a contiguous slice, and the new ranks divide what
    /// is left of those slices, in order (see [`Plan::rest_after`]). The batch size may
    /// change with the world size (a fixed global batch), except for a source whose definition
    /// parts include it ([`chute_core::Source::definition_parts`]).
    pub fn restore(&mut self, state: &State) -> Result<(), StateError> {
        if state.version != STATE_VERSION {
            return Err(StateError::Version {
                found: state.version,
                supported: STATE_VERSION,
            });
        }
        if let Some(parts) = self.definition_parts()
            && !state.parts.is_empty()
            && state.parts != parts
        {
            let mut differs: Vec<String> = parts
                .iter()
                .filter(|(k, v)| state.parts.get(*k) != Some(*v))
                .map(|(k, _)| k.clone())
                .collect();
            differs.extend(
                state
                    .parts
                    .keys()
                    .filter(|k| !parts.contains_key(*k))
                    .cloned(),
            );
            return Err(StateError::Definition { differs });
        }
        if state.dataset != self.fingerprint {
            return Err(StateError::Dataset {
                found: state.dataset.clone(),
                expected: self.fingerprint.clone(),
            });
        }
        if state.seed != self.plan_cfg.seed {
            return Err(StateError::Mismatch {
                field: "seed",
                found: state.seed.to_string(),
                expected: self.plan_cfg.seed.to_string(),
                hint: "build the loader with the seed the state was taken with",
            });
        }
        if state.shuffle != self.plan_cfg.shuffle {
            return Err(StateError::Mismatch {
                field: "shuffle",
                found: state.shuffle.to_string(),
                expected: self.plan_cfg.shuffle.to_string(),
                hint: "build the loader with the shuffle mode the state was taken with",
            });
        }
        let invalid = |e: ConfigError| StateError::Invalid(e.to_string());
        let past = |delivered: u64, len: u64| {
            StateError::Invalid(format!(
                "delivered = {delivered} is past a rank's {len} samples of epoch {}",
                state.epoch
            ))
        };
        let (start, taken, delivered) = if state.world_size == self.plan_cfg.world_size {
            (state.start, state.taken.clone(), state.delivered)
        } else {
            // What each old rank had read, from the old split; the rest is the new split.
            let old = Plan::new(
                self.source.manifest(),
                &PlanConfig {
                    epoch: state.epoch,
                    rank: 0,
                    world_size: state.world_size,
                    batch_size: 1,
                    drop_last: state.drop_last,
                    start: state.start,
                    taken: state.taken.clone(),
                    ..self.plan_cfg.clone()
                },
            )
            .map_err(invalid)?;
            if state.delivered > old.len() {
                return Err(past(state.delivered, old.len()));
            }
            let (start, taken) = old.rest_after(state.delivered);
            (start, taken, 0)
        };
        let cfg = PlanConfig {
            epoch: state.epoch,
            start,
            taken,
            ..self.plan_cfg.clone()
        };
        let plan = Plan::new(self.source.manifest(), &cfg).map_err(invalid)?;
        if delivered > plan.len() {
            return Err(past(delivered, plan.len()));
        }
        self.run = None;
        self.pending_wait = Duration::ZERO;
        self.end_pending = false;
        self.plan_cfg = cfg;
        if state.world_size != self.plan_cfg.world_size && plan.is_empty() {
            // The old ranks had read everything (or left less than a batch per new rank,
            // with drop_last): the epoch is over.
            self.plan_cfg.epoch += 1;
            self.rewind();
            return Ok(());
        }
        self.delivered = delivered;
        Ok(())
    }

    /// True when batch buffers are page-locked (`pin_memory` was asked for and a CUDA runtime
    /// provided it).
    pub fn pinned(&self) -> bool {
        self.pool.allocator_name().is_some()
    }

    /// Why `pin_memory` fell back to ordinary memory (no CUDA runtime, no device...), if it
    /// did. The loader does not print this; callers warn their users once.
    pub fn pin_memory_fallback(&self) -> Option<&str> {
        self.pin_memory_fallback.as_deref()
    }

    /// Makes the loader usable in a child process after `fork()`: the parent's worker threads
    /// do not exist in the child, and its locks may have been held by them, so the run, the
    /// buffer pool and the stats are abandoned (leaked, never touched) and rebuilt. The next
    /// `next()` starts fresh workers at the same position. Page-locked memory is not used in
    /// the child (CUDA does not survive a fork).
    pub fn after_fork(&mut self) {
        if let Some(run) = self.run.take() {
            std::mem::forget(run);
        }
        std::mem::forget(std::mem::replace(
            &mut self.pool,
            BufferPool::new(POOL_IDLE),
        ));
        let old = Arc::as_ptr(&self.stats);
        std::mem::forget(std::mem::replace(
            &mut self.stats,
            Arc::new(Stats::new(
                self.options.stats_window,
                RemoteCounts::of(&self.source),
            )),
        ));
        self.pending_wait = Duration::ZERO;
        crate::metrics::register_after_fork(&self.series(), old);
        if self.options.pin_memory {
            self.pin_memory_fallback = Some("a forked child cannot use CUDA".into());
        }
    }

    /// Figures since the loader was built, over the last `stats_window` and per epoch,
    /// queue depths and the wait histogram (see [`StatsSnapshot`]). About a microsecond: cheap
    /// enough to call every step.
    pub fn stats(&self) -> StatsSnapshot {
        snapshot(&self.stats, &*self.source)
    }

    /// What the metrics registry keeps of the loader: its counters, its source, its labels.
    fn series(&self) -> crate::metrics::Series<'_> {
        crate::metrics::Series {
            stats: &self.stats,
            source: &self.source,
            rank: self.options.rank,
            name: &self.options.name,
        }
    }

    fn start_run(&mut self) -> Result<(), Error> {
        let plan = self.plan()?;
        self.stats.epoch(self.plan_cfg.epoch);
        self.source.set_plan(&plan);
        let job = Job {
            source: Arc::clone(&self.source),
            transform: self.transform.clone(),
            first: self.delivered,
            plan,
            batch_size: self.options.batch_size as u64,
            seed: self.plan_cfg.seed,
            epoch: self.plan_cfg.epoch,
            pool: self.pool.clone(),
            stats: Arc::clone(&self.stats),
            cancel: AtomicBool::new(false),
            on_error: self.options.on_error,
            pad: self.options.pad,
            assist: None,
            helpers: Default::default(),
            share: 0,
        };
        let limits = self.tuner.as_mut().map(|t| {
            t.run_started();
            (t.workers(), t.prefetch())
        });
        self.run = Some(Run::start(
            job,
            self.options.num_workers,
            self.options.prefetch,
            limits,
        ));
        Ok(())
    }

    /// A new pass over the data begins (Python's `iter(loader)`): if the last epoch ended
    /// with its last batch and the consumer never asked for the `None` after it, that `None`
    /// is not returned, so the pass reads the next epoch instead of an empty one. A pass
    /// that stopped early (batches left) continues the epoch, as before.
    pub fn begin_pass(&mut self) {
        self.end_pending = false;
    }

    /// Ends the epoch: the loader stands at the start of the next one.
    fn end_epoch(&mut self) {
        self.run = None;
        self.pending_wait = Duration::ZERO;
        self.stats.epoch_ended();
        self.plan_cfg.epoch += 1;
        self.rewind();
    }

    /// To the start of the current epoch's whole split.
    fn rewind(&mut self) {
        self.plan_cfg.start = 0;
        self.plan_cfg.taken.clear();
        self.delivered = 0;
    }
}

impl Loader {
    /// Like `next()`, but gives up after `timeout` with [`Poll::Pending`] (nothing consumed),
    /// so a caller can check for interrupts (Python's Ctrl-C) while it waits. With zero
    /// workers the batch is built in the caller's thread and the timeout does not apply.
    pub fn next_timeout(&mut self, timeout: Duration) -> Poll {
        self.poll(Some(timeout))
    }

    fn poll(&mut self, timeout: Option<Duration>) -> Poll {
        let t0 = Instant::now();
        if std::mem::take(&mut self.end_pending) {
            return Poll::Ready(None);
        }
        if self.run.is_none() {
            match self.plan() {
                Ok(p) if self.delivered >= p.len() => {
                    // An epoch with nothing (left) to read on this rank.
                    self.end_epoch();
                    return Poll::Ready(None);
                }
                Ok(_) => {}
                Err(e) => return Poll::Ready(Some(Err(e.into()))),
            }
            if let Err(e) = self.start_run() {
                return Poll::Ready(Some(Err(e)));
            }
        }
        let run = self.run.as_mut().expect("run started above");
        let (b, result) = match run.next(timeout) {
            Polled::Ready(b, result) => (b, result),
            Polled::Done => {
                self.end_epoch();
                return Poll::Ready(None);
            }
            Polled::Pending => {
                let waited = t0.elapsed();
                self.stats.waited(waited);
                self.pending_wait += waited;
                return Poll::Pending;
            }
        };
        // A failed batch is consumed too (as in PyTorch), so the position stays exact.
        self.delivered = run.job().batch_range(b).1;
        let last = self.delivered >= run.job().plan.len();
        let waited = t0.elapsed();
        self.stats.waited(waited);
        let wait = std::mem::take(&mut self.pending_wait) + waited;
        match &result {
            Ok(batch) => {
                self.stats
                    .delivered(batch.len() as u64, batch.nbytes() as u64, wait);
                if let Some(t) = &mut self.tuner
                    && t.observe(wait, self.stats.ready(), batch.nbytes() as u64)
                {
                    run.set_limits(t.workers(), t.prefetch());
                    self.stats.autotuned(Some(t.stats()));
                }
            }
            Err(_) => self.stats.failed(wait),
        }
        if last {
            // The epoch is over with its last batch: the next pass reads the next epoch,
            // whether or not the consumer asks for the `None` that closes this one.
            self.end_epoch();
            self.end_pending = true;
        }
        Poll::Ready(Some(result))
    }
}

impl Iterator for Loader {
    type Item = Result<Batch, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.poll(None) {
            Poll::Ready(r) => r,
            Poll::Pending => unreachable!("no timeout, so never pending"),
        }
    }
}
