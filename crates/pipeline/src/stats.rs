//! Per-stage counters and the consumer's wait: "how long would the GPU have waited for data".

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use chute_core::Error;
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
}

/// Skip reports kept for `stats()`.
const SKIPPED_KEPT: usize = 32;

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

    fn snapshot(&self) -> StageStats {
        StageStats {
            busy_secs: self.busy_ns.load(Relaxed) as f64 * 1e-9,
            items: self.items.load(Relaxed),
        }
    }
}

/// Which worker stage a measurement belongs to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum StageKind {
    Read,
    Transform,
    Collate,
}

impl Stats {
    pub(crate) fn new() -> Self {
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

    /// Time the consumer spent in `next()`; `done` when the call returned a batch.
    pub(crate) fn waited(&self, d: Duration, done: bool) {
        self.wait_ns.fetch_add(d.as_nanos() as u64, Relaxed);
        self.next_calls.fetch_add(u64::from(done), Relaxed);
    }

    pub(crate) fn delivered(&self, samples: u64, bytes: u64) {
        self.samples.fetch_add(samples, Relaxed);
        self.batches.fetch_add(1, Relaxed);
        self.bytes.fetch_add(bytes, Relaxed);
    }

    pub(crate) fn failed(&self) {
        self.errors.fetch_add(1, Relaxed);
    }

    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let elapsed = self.created.elapsed().as_secs_f64();
        let samples = self.samples.load(Relaxed);
        let bytes = self.bytes.load(Relaxed);
        let wait = self.wait_ns.load(Relaxed) as f64 * 1e-9;
        let per_sec = |x: u64| {
            if elapsed > 0.0 {
                x as f64 / elapsed
            } else {
                0.0
            }
        };
        StatsSnapshot {
            elapsed_secs: elapsed,
            samples,
            batches: self.batches.load(Relaxed),
            bytes,
            errors: self.errors.load(Relaxed),
            skipped: self.skipped.load(Relaxed),
            skipped_recent: self
                .skipped_recent
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .cloned()
                .collect(),
            samples_per_sec: per_sec(samples),
            bytes_per_sec: per_sec(bytes),
            wait_secs: wait,
            wait_fraction: if elapsed > 0.0 {
                (wait / elapsed).min(1.0)
            } else {
                0.0
            },
            read: self.read.snapshot(),
            transform: self.transform.snapshot(),
            collate: self.collate.snapshot(),
            source: None,
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
    /// The source's own figures ([`chute_core::Source::stats`]: a mixture's samples per
    /// component against the target), when it has any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<serde_json::Value>,
}
