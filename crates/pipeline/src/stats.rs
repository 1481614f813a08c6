//! Per-stage counters and the consumer's wait: "how long would the GPU have waited for data".
//!
//! Totals since the loader was built, the same over the last [`LoaderOptions::stats_window`]
//! seconds and over the current and the last epoch, queue depths, the remote I/O of the
//! loader's source (see [`RemoteCounts`]) and a histogram of each batch's wait. Workers add to atomics once per batch; the consumer
//! records a tick (a copy of the counters) at each delivery, keeping one per 1/50 of the
//! window, so a window is the difference between now and the last tick before its start, and
//! a snapshot costs about a microsecond.
//!
//! [`LoaderOptions::stats_window`]: crate::LoaderOptions::stats_window

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use std::sync::Arc;

use chute_core::iostats::{IoSnapshot, io_stats};
use chute_core::{Error, Source};

use crate::autotune::AutotuneStats;
use serde::Serialize;

/// Live counters, shared by the workers and the consumer. Workers add per batch, not per
/// sample, so counting costs nothing measurable.
#[derive(Debug)]
pub(crate) struct Stats {
    created: Instant,
    read: Stage,
    transform: Stage,
    collate: Stage,
    wait_ns: AtomicU64,
    next_calls: AtomicU64,
    samples: AtomicU64,
    batches: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    skipped: AtomicU64,
    /// The most recent skipped samples' errors, newest last.
    skipped_recent: Mutex<VecDeque<String>>,
    /// Finished batches waiting for the consumer.
    ready: AtomicU64,
    /// Batches being built by workers.
    in_flight: AtomicU64,
    /// The ring's slots (`workers + prefetch`) and the workers of the current run.
    capacity: AtomicU64,
    workers: AtomicU64,
    /// Batches whose wait fell at or under each of [`WAIT_BUCKETS`], and over the last.
    wait_buckets: [AtomicU64; WAIT_BUCKETS.len() + 1],
    /// The values the autotuner chose (`num_workers="auto"`).
    autotune: Mutex<Option<AutotuneStats>>,
    /// Where the loader's remote I/O figures come from.
    io: RemoteCounts,
    window: Duration,
    history: Mutex<History>,
}

/// Upper bounds (seconds) of the wait histogram's buckets, Prometheus style: a batch the
/// consumer waited 3 ms for counts in the `0.005` bucket and every one above it.
pub const WAIT_BUCKETS: [f64; 14] = [
    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// Skip reports kept for `stats()`.
const SKIPPED_KEPT: usize = 32;

/// Ticks per window: while batches arrive more often than that, the window's figures span
/// between `window` and `window * (1 + 1/50)`; after a pause they span back to the last
/// delivery before the window's start (`Window::secs` says how long).
const TICKS_PER_WINDOW: u32 = 50;

#[derive(Debug, Default)]
struct Stage {
    busy_ns: AtomicU64,
    items: AtomicU64,
}

impl Stage {
    fn add(&self, busy: Duration, items: u64) {
        self.busy_ns.fetch_add(busy.as_nanos() as u64, Relaxed);
        self.items.fetch_add(items, Relaxed);
    }
}

/// Which worker stage a measurement belongs to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum StageKind {
    Read,
    Transform,
    Collate,
}

/// Every cumulative counter at one moment.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    samples: u64,
    batches: u64,
    bytes: u64,
    wait_ns: u64,
    errors: u64,
    skipped: u64,
    stages: [(u64, u64); 3],
    io: IoSnapshot,
}

#[derive(Debug, Clone, Copy)]
struct Tick {
    /// Nanoseconds since the loader was built.
    at: u64,
    counters: Counters,
}

#[derive(Debug)]
struct History {
    /// Oldest first; the first is at or before the window's start once the loader is older.
    ticks: VecDeque<Tick>,
    epoch: u64,
    epoch_start: Tick,
    /// The epoch's figures were closed by [`Stats::epoch_ended`].
    closed: bool,
    last_epoch: Option<Window>,
}

/// Where a loader's remote I/O figures come from: its source's own counters (every fetch,
/// cache hit and retry of its shards since the source was opened, its opening included), or,
/// for a source that keeps none, the process's counters since the loader was built.
pub(crate) enum RemoteCounts {
    Source(Arc<dyn Source>),
    ProcessSince(IoSnapshot),
}

impl RemoteCounts {
    pub(crate) fn of(source: &Arc<dyn Source>) -> RemoteCounts {
        match source.remote_io() {
            Some(_) => RemoteCounts::Source(Arc::clone(source)),
            None => RemoteCounts::ProcessSince(io_stats()),
        }
    }

    fn now(&self) -> IoSnapshot {
        match self {
            RemoteCounts::Source(s) => s.remote_io().unwrap_or_default(),
            RemoteCounts::ProcessSince(base) => io_stats().since(base),
        }
    }
}

impl std::fmt::Debug for RemoteCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RemoteCounts::Source(_) => f.write_str("RemoteCounts::Source"),
            RemoteCounts::ProcessSince(base) => write!(f, "RemoteCounts::ProcessSince({base:?})"),
        }
    }
}

impl Stats {
    pub(crate) fn new(window: Duration, io: RemoteCounts) -> Self {
        let zero = Tick {
            at: 0,
            counters: Counters::default(),
        };
        Stats {
            created: Instant::now(),
            read: Stage::default(),
            transform: Stage::default(),
            collate: Stage::default(),
            wait_ns: AtomicU64::new(0),
            next_calls: AtomicU64::new(0),
            samples: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            skipped_recent: Mutex::new(VecDeque::new()),
            ready: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            capacity: AtomicU64::new(0),
            workers: AtomicU64::new(0),
            wait_buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            autotune: Mutex::new(None),
            io,
            window: window.max(Duration::from_millis(1)),
            history: Mutex::new(History {
                ticks: VecDeque::from([zero]),
                epoch: 0,
                epoch_start: zero,
                closed: false,
                last_epoch: None,
            }),
        }
    }

    pub(crate) fn skipped(&self, error: &Error) {
        self.skipped.fetch_add(1, Relaxed);
        let mut recent = self
            .skipped_recent
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if recent.len() == SKIPPED_KEPT {
            recent.pop_front();
        }
        recent.push_back(error.to_string());
    }

    pub(crate) fn stage(&self, kind: StageKind, busy: Duration, items: u64) {
        match kind {
            StageKind::Read => &self.read,
            StageKind::Transform => &self.transform,
            StageKind::Collate => &self.collate,
        }
        .add(busy, items);
    }

    /// Time the consumer spent in `next()` in one call.
    pub(crate) fn waited(&self, d: Duration) {
        self.wait_ns.fetch_add(d.as_nanos() as u64, Relaxed);
    }

    /// A batch (or a failed one) handed to the consumer, which waited `wait` for it in all
    /// (over every `next_timeout` call that returned pending before it).
    pub(crate) fn delivered(&self, samples: u64, bytes: u64, wait: Duration) {
        self.samples.fetch_add(samples, Relaxed);
        self.batches.fetch_add(1, Relaxed);
        self.bytes.fetch_add(bytes, Relaxed);
        self.observe(wait);
    }

    pub(crate) fn failed(&self, wait: Duration) {
        self.errors.fetch_add(1, Relaxed);
        self.observe(wait);
    }

    fn observe(&self, wait: Duration) {
        self.next_calls.fetch_add(1, Relaxed);
        let secs = wait.as_secs_f64();
        let bucket = WAIT_BUCKETS
            .iter()
            .position(|&le| secs <= le)
            .unwrap_or(WAIT_BUCKETS.len());
        self.wait_buckets[bucket].fetch_add(1, Relaxed);
        let tick = self.tick(self.now());
        self.history()
            .record(tick, self.tick_ns(), self.window_ns());
    }

    /// A worker claimed a batch.
    pub(crate) fn claimed(&self) {
        self.in_flight.fetch_add(1, Relaxed);
    }

    /// A worker filed the batch it claimed.
    pub(crate) fn filed(&self) {
        self.ready.fetch_add(1, Relaxed);
        let _ = self
            .in_flight
            .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1));
    }

    /// The consumer took a filed batch.
    pub(crate) fn taken(&self) {
        let _ = self
            .ready
            .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1));
    }

    /// Finished batches waiting for the consumer, now.
    pub(crate) fn ready(&self) -> u64 {
        self.ready.load(Relaxed)
    }

    /// The autotuner chose these values.
    pub(crate) fn autotuned(&self, a: Option<AutotuneStats>) {
        *self.autotune.lock().unwrap_or_else(|e| e.into_inner()) = a;
    }

    /// A run started (`workers` threads, `capacity` slots) or, with zeros, ended.
    pub(crate) fn run(&self, workers: usize, capacity: usize) {
        self.workers.store(workers as u64, Relaxed);
        self.capacity.store(capacity as u64, Relaxed);
        if workers == 0 {
            self.ready.store(0, Relaxed);
            self.in_flight.store(0, Relaxed);
        }
    }

    /// The loader is reading `epoch`: its figures count from now (from the first time it is
    /// read, a resumed run's too). A new epoch makes the one before `last_epoch`.
    pub(crate) fn epoch(&self, epoch: u64) {
        let now = self.now();
        let tick = self.tick(now);
        let mut h = self.history();
        if h.epoch != epoch || h.epoch_start.at == 0 {
            if !h.closed
                && (h.epoch_start.at != 0
                    || h.epoch_start.counters.batches != tick.counters.batches)
            {
                h.last_epoch = Some(self.figures(&h.epoch_start, &tick));
            }
            let first = h.epoch_start.at == 0 && h.last_epoch.is_none();
            h.epoch = epoch;
            h.epoch_start = tick;
            if first {
                // The source's remote reads before the first batch (its opening: index
                // files, cache hits) belong to the first epoch's figures.
                h.epoch_start.counters.io = IoSnapshot::default();
            }
            h.closed = false;
        }
    }

    /// The loader delivered the last batch of its epoch: the epoch's figures end here (the
    /// time until the next epoch starts, a validation pass say, is in neither).
    pub(crate) fn epoch_ended(&self) {
        let tick = self.tick(self.now());
        let mut h = self.history();
        if !h.closed {
            h.last_epoch = Some(self.figures(&h.epoch_start, &tick));
            h.closed = true;
        }
    }

    fn now(&self) -> u64 {
        // At least 1, so a tick taken at once is not mistaken for the one at creation.
        (self.created.elapsed().as_nanos() as u64).max(1)
    }

    fn window_ns(&self) -> u64 {
        self.window.as_nanos() as u64
    }

    fn tick_ns(&self) -> u64 {
        self.window_ns() / u64::from(TICKS_PER_WINDOW)
    }

    fn history(&self) -> MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn tick(&self, at: u64) -> Tick {
        let stage = |s: &Stage| (s.busy_ns.load(Relaxed), s.items.load(Relaxed));
        Tick {
            at,
            counters: Counters {
                samples: self.samples.load(Relaxed),
                batches: self.batches.load(Relaxed),
                bytes: self.bytes.load(Relaxed),
                wait_ns: self.wait_ns.load(Relaxed),
                errors: self.errors.load(Relaxed),
                skipped: self.skipped.load(Relaxed),
                stages: [
                    stage(&self.read),
                    stage(&self.transform),
                    stage(&self.collate),
                ],
                io: self.io.now(),
            },
        }
    }

    /// The figures between two ticks.
    fn figures(&self, a: &Tick, b: &Tick) -> Window {
        let secs = b.at.saturating_sub(a.at) as f64 * 1e-9;
        let (x, y) = (&a.counters, &b.counters);
        let per_sec = |n: f64| if secs > 0.0 { n / secs } else { 0.0 };
        let wait = y.wait_ns.saturating_sub(x.wait_ns) as f64 * 1e-9;
        let stage = |k: usize| StageStats {
            busy_secs: y.stages[k].0.saturating_sub(x.stages[k].0) as f64 * 1e-9,
            items: y.stages[k].1.saturating_sub(x.stages[k].1),
        };
        let samples = y.samples.saturating_sub(x.samples);
        let batches = y.batches.saturating_sub(x.batches);
        let bytes = y.bytes.saturating_sub(x.bytes);
        let remote = y.io.since(&x.io);
        Window {
            secs,
            samples,
            batches,
            bytes,
            samples_per_sec: per_sec(samples as f64),
            batches_per_sec: per_sec(batches as f64),
            bytes_per_sec: per_sec(bytes as f64),
            wait_secs: wait,
            wait_fraction: if secs > 0.0 {
                (wait / secs).min(1.0)
            } else {
                0.0
            },
            errors: y.errors.saturating_sub(x.errors),
            skipped: y.skipped.saturating_sub(x.skipped),
            read: stage(0),
            transform: stage(1),
            collate: stage(2),
            remote_bytes_per_sec: per_sec(remote.bytes_fetched as f64),
            remote,
        }
    }

    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let now = self.now();
        let tick = self.tick(now);
        let (window, epoch, current_epoch, last_epoch) = {
            let h = self.history();
            // The counters as of the window's start: the last tick at or before it (counters
            // change only at ticks, as far as the window is concerned), else the oldest.
            let start = now.saturating_sub(self.window_ns());
            let base = h
                .ticks
                .iter()
                .rev()
                .find(|t| t.at <= start)
                .or(h.ticks.front())
                .copied()
                .unwrap_or(tick);
            (
                self.figures(&base, &tick),
                h.epoch,
                match (&h.last_epoch, h.closed) {
                    (Some(ended), true) => ended.clone(),
                    _ => self.figures(&h.epoch_start, &tick),
                },
                h.last_epoch.clone(),
            )
        };
        let total = self.figures(
            &Tick {
                at: 0,
                counters: Counters::default(),
            },
            &tick,
        );
        let mut cumulative = 0;
        let wait_histogram = WaitHistogram {
            buckets: WAIT_BUCKETS
                .iter()
                .zip(&self.wait_buckets)
                .map(|(&le, n)| {
                    cumulative += n.load(Relaxed);
                    (le, cumulative)
                })
                .collect(),
            count: self.next_calls.load(Relaxed),
            sum: total.wait_secs,
        };
        StatsSnapshot {
            elapsed_secs: total.secs,
            samples: total.samples,
            batches: total.batches,
            bytes: total.bytes,
            errors: total.errors,
            skipped: total.skipped,
            skipped_recent: self
                .skipped_recent
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .cloned()
                .collect(),
            samples_per_sec: total.samples_per_sec,
            bytes_per_sec: total.bytes_per_sec,
            wait_secs: total.wait_secs,
            wait_fraction: total.wait_fraction,
            read: total.read,
            transform: total.transform,
            collate: total.collate,
            remote: total.remote,
            window_secs: self.window.as_secs_f64(),
            window,
            epoch,
            current_epoch,
            last_epoch,
            queue: QueueStats {
                ready: self.ready.load(Relaxed),
                in_flight: self.in_flight.load(Relaxed),
                capacity: self.capacity.load(Relaxed),
                workers: self.workers.load(Relaxed),
            },
            wait_histogram,
            autotune: *self.autotune.lock().unwrap_or_else(|e| e.into_inner()),
            source: None,
            source_metrics: Vec::new(),
        }
    }
}

impl History {
    /// Records the counters after a delivery. Ticks stay at least `spacing` apart except the
    /// newest, which always holds the latest delivery (it is moved forward until it is
    /// `spacing` past the one before), so no delivery is missing from a window; ticks the
    /// window no longer needs (all but the last one at or before its start) are forgotten.
    fn record(&mut self, tick: Tick, spacing: u64, window: u64) {
        let n = self.ticks.len();
        if n >= 2 && self.ticks[n - 1].at - self.ticks[n - 2].at < spacing {
            self.ticks[n - 1] = tick;
        } else {
            self.ticks.push_back(tick);
        }
        let start = tick.at.saturating_sub(window);
        while self.ticks.len() >= 2 && self.ticks[1].at <= start {
            self.ticks.pop_front();
        }
    }
}

/// Busy time and item count of one stage, summed over worker threads.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct StageStats {
    /// Seconds spent in the stage, summed over threads (can exceed wall time).
    pub busy_secs: f64,
    /// Items the stage handled (samples; batches for collation).
    pub items: u64,
}

impl StageStats {
    /// Mean busy time per item, in microseconds.
    pub fn micros_per_item(&self) -> f64 {
        if self.items == 0 {
            0.0
        } else {
            self.busy_secs * 1e6 / self.items as f64
        }
    }
}

/// A loader's figures since it was built.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct StatsSnapshot {
    /// Seconds since the loader was built.
    pub elapsed_secs: f64,
    /// Samples delivered to the consumer.
    pub samples: u64,
    /// Batches delivered to the consumer.
    pub batches: u64,
    /// Payload bytes delivered (all columns of all batches).
    pub bytes: u64,
    /// Batches that failed (returned as errors from `next()`).
    pub errors: u64,
    /// Samples that failed and were replaced (`on_error = skip`).
    pub skipped: u64,
    /// The errors of the most recently skipped samples (up to 32), oldest first.
    pub skipped_recent: Vec<String>,
    /// Delivered samples per second of elapsed time.
    pub samples_per_sec: f64,
    /// Delivered bytes per second of elapsed time.
    pub bytes_per_sec: f64,
    /// Seconds the consumer spent blocked in `next()`: how long a GPU would have waited.
    pub wait_secs: f64,
    /// `wait_secs / elapsed_secs`.
    pub wait_fraction: f64,
    /// Reading samples from the source.
    pub read: StageStats,
    /// Running transforms.
    pub transform: StageStats,
    /// Copying samples into batch buffers (items are batches).
    pub collate: StageStats,
    /// Remote reads of the loader's source since it was opened, its opening included (bytes
    /// fetched, requests, retries, shards served by the node-local cache...); for a source
    /// that keeps no counters of its own, the process's since the loader was built.
    pub remote: IoSnapshot,
    /// The length of `window` in seconds ([`LoaderOptions::stats_window`]).
    ///
    /// [`LoaderOptions::stats_window`]: crate::LoaderOptions::stats_window
    pub window_secs: f64,
    /// The same figures over the last `window_secs` seconds: from the last delivery at or
    /// before the window's start (so longer after a pause: `window.secs` says how long), or
    /// from the start while the loader is younger.
    pub window: Window,
    /// The epoch the loader is reading (or last read).
    pub epoch: u64,
    /// The figures since this process started reading `epoch`, frozen once it ended.
    pub current_epoch: Window,
    /// The figures of the last epoch that ended (from its start in this process to its last
    /// batch), if any.
    pub last_epoch: Option<Window>,
    /// Batches finished and waiting, being built, and the ring's size.
    pub queue: QueueStats,
    /// How long the consumer waited for each batch.
    pub wait_histogram: WaitHistogram,
    /// With `num_workers="auto"` ([`LoaderOptions::autotune`](crate::LoaderOptions)): the
    /// workers and prefetch depth the tuner chose, its bounds and how often it changed them.
    pub autotune: Option<AutotuneStats>,
    /// The source's own figures ([`chute_core::Source::stats`]: samples per part of a source
    /// made of several, against its target), when it has any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<serde_json::Value>,
    /// The source's own metric families ([`chute_core::Source::metrics`]), for the metrics
    /// endpoint (not serialized: `source` holds the same figures).
    #[serde(skip)]
    pub source_metrics: Vec<chute_core::MetricFamily>,
}

/// Figures over a span of time: totals within it and rates.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Window {
    /// The span's length in seconds.
    pub secs: f64,
    /// Samples delivered.
    pub samples: u64,
    /// Batches delivered.
    pub batches: u64,
    /// Payload bytes delivered.
    pub bytes: u64,
    /// `samples / secs`.
    pub samples_per_sec: f64,
    /// `batches / secs`.
    pub batches_per_sec: f64,
    /// `bytes / secs`.
    pub bytes_per_sec: f64,
    /// Seconds the consumer was blocked in `next()`.
    pub wait_secs: f64,
    /// `wait_secs / secs`: the fraction of the time a training step would have waited.
    pub wait_fraction: f64,
    /// Batches that failed.
    pub errors: u64,
    /// Samples skipped (`on_error = skip`).
    pub skipped: u64,
    /// Reading samples (busy seconds summed over workers, samples).
    pub read: StageStats,
    /// Running transforms.
    pub transform: StageStats,
    /// Collation (items are batches).
    pub collate: StageStats,
    /// Remote reads of the loader's source (as [`StatsSnapshot::remote`]) in this span.
    pub remote: IoSnapshot,
    /// `remote.bytes_fetched / secs`.
    pub remote_bytes_per_sec: f64,
}

/// Depth of the queue between the workers and the consumer, now.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct QueueStats {
    /// Finished batches waiting for the consumer: near `capacity` the workers are ahead
    /// (the consumer is the bottleneck), near 0 the consumer waits for them.
    pub ready: u64,
    /// Batches being built by workers.
    pub in_flight: u64,
    /// Batches the workers may build ahead of the consumer (`num_workers + prefetch`, or the
    /// autotuner's workers + prefetch) in the current run; 0 between runs.
    pub capacity: u64,
    /// Workers building batches in the current run (all of them, or the autotuner's choice).
    pub workers: u64,
}

/// The consumer's wait per batch as a cumulative histogram (Prometheus' layout).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct WaitHistogram {
    /// `(upper bound in seconds, batches that waited at most that long)`, bounds ascending;
    /// batches over the last bound count only in `count`.
    pub buckets: Vec<(f64, u64)>,
    /// Batches (delivered or failed).
    pub count: u64,
    /// Seconds waited in all (`wait_secs`).
    pub sum: f64,
}

/// A loader's figures from its counters and its source.
pub(crate) fn snapshot(stats: &Stats, source: &dyn Source) -> StatsSnapshot {
    let mut s = stats.snapshot();
    s.source = source.stats();
    s.source_metrics = source.metrics();
    s
}
