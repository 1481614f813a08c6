//! `num_workers="auto"`: the workers and the prefetch depth follow the consumer's pace, as
//! tf.data's AUTOTUNE and Grain's autotuning do, within a budget of cores and memory.
//!
//! The loader starts as many worker threads as it may use ([`LoaderOptions::num_workers`]:
//! the budget of cores) and a ring as deep as it may fill ([`LoaderOptions::prefetch`]), and
//! lets [`Tuner::workers`] of them build batches, at most [`Tuner::prefetch`] batches ahead of
//! the workers' own. The tuner watches windows of about half a second (and at least a few
//! batches): how long the consumer waited for its batches, and how many finished batches stood
//! ready behind each one it took.
//!
//! - A consumer that waited more than 5% of the window gets one more worker, or, with
//!   every worker running, one more batch of prefetch (to absorb bursts), within the memory
//!   budget ([`Autotune::memory_budget`]: the batches the ring may hold).
//! - Workers that kept a batch ready ahead of a consumer that did not wait, window after
//!   window, give one worker back, so its core goes to the training step. A worker given back
//!   that the consumer then misses doubles the calm windows the next give-back waits for, so
//!   the tuner settles instead of oscillating.
//!
//! Which worker builds which batch never changes what is delivered (batches are numbered by
//! the plan and delivered in order), so tuning never changes the order, and the values it
//! chose are in [`StatsSnapshot::autotune`](crate::StatsSnapshot) and the metrics.
//!
//! [`LoaderOptions::num_workers`]: crate::LoaderOptions::num_workers
//! [`LoaderOptions::prefetch`]: crate::LoaderOptions::prefetch

use std::time::{Duration, Instant};

use serde::Serialize;

/// Tune the workers and the prefetch depth while the loader runs (see the module
/// documentation); `num_workers` and `prefetch` are then the most it may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Autotune {
    /// Workers building batches at the start (at least 1, at most `num_workers`).
    pub initial_workers: usize,
    /// Bytes the ring's batches (being built and ready) may hold: the prefetch depth is kept
    /// under it.
    pub memory_budget: u64,
}

/// A window the tuner judges is at least this long...
const WINDOW: Duration = Duration::from_millis(500);
/// ...and holds at least this many batches.
const MIN_BATCHES: u32 = 4;
/// The fraction of a window the consumer may wait before the tuner adds a worker.
const STARVED: f64 = 0.05;
/// Under this fraction (with a batch always ready behind the one taken) a window is calm.
const CALM: f64 = 0.01;
/// Calm windows in a row before a worker is given back, at first...
const FIRST_CALM: u32 = 2;
/// ...and at most, after give-backs the consumer missed.
const MAX_CALM: u32 = 64;

/// The values the tuner chose, as `stats()` reports them.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct AutotuneStats {
    /// Workers building batches now.
    pub workers: u64,
    /// Batches the ring may hold ahead of the workers' own, now.
    pub prefetch: u64,
    /// The most workers it may use (the budget of cores).
    pub max_workers: u64,
    /// The deepest prefetch it may use.
    pub max_prefetch: u64,
    /// Bytes the ring's batches may hold.
    pub memory_budget: u64,
    /// How many times it changed a value.
    pub changes: u64,
}

/// The tuner of one loader; it outlives the epochs' runs, so each epoch starts where the last
/// one settled.
#[derive(Debug)]
pub(crate) struct Tuner {
    cfg: Autotune,
    max_workers: usize,
    max_prefetch: usize,
    workers: usize,
    prefetch: usize,
    /// The open window: when it began (none until a run's first batch is delivered, whose
    /// wait is the start-up's), its batches, the consumer's wait, the fewest batches ready.
    start: Option<Instant>,
    batches: u32,
    waited: Duration,
    min_ready: u64,
    /// Calm windows in a row, and how many a give-back needs now.
    calm: u32,
    calm_needed: u32,
    /// The last change was a give-back.
    gave_back: bool,
    changes: u64,
}

impl Tuner {
    pub(crate) fn new(cfg: Autotune, max_workers: usize, max_prefetch: usize) -> Tuner {
        let max_workers = max_workers.max(1);
        let max_prefetch = max_prefetch.max(1);
        Tuner {
            cfg,
            max_workers,
            max_prefetch,
            workers: cfg.initial_workers.clamp(1, max_workers),
            prefetch: 2.min(max_prefetch),
            start: None,
            batches: 0,
            waited: Duration::ZERO,
            min_ready: u64::MAX,
            calm: 0,
            calm_needed: FIRST_CALM,
            gave_back: false,
            changes: 0,
        }
    }

    /// Workers building batches now.
    pub(crate) fn workers(&self) -> usize {
        self.workers
    }

    /// Batches the ring may hold ahead of the workers' own, now.
    pub(crate) fn prefetch(&self) -> usize {
        self.prefetch
    }

    /// What `stats()` reports.
    pub(crate) fn stats(&self) -> AutotuneStats {
        AutotuneStats {
            workers: self.workers as u64,
            prefetch: self.prefetch as u64,
            max_workers: self.max_workers as u64,
            max_prefetch: self.max_prefetch as u64,
            memory_budget: self.cfg.memory_budget,
            changes: self.changes,
        }
    }

    /// A run (an epoch, or its resumed rest) starts: its first batch's wait is not judged.
    pub(crate) fn run_started(&mut self) {
        self.start = None;
    }

    /// A batch was delivered: the consumer waited `wait` for it, `ready` other finished
    /// batches stood ready when it was taken, and it holds `bytes`. True when the workers or
    /// the prefetch depth changed.
    pub(crate) fn observe(&mut self, wait: Duration, ready: u64, bytes: u64) -> bool {
        self.observe_at(Instant::now(), wait, ready, bytes)
    }

    fn observe_at(&mut self, now: Instant, wait: Duration, ready: u64, bytes: u64) -> bool {
        let Some(start) = self.start else {
            self.open(now);
            return false;
        };
        self.batches += 1;
        self.waited += wait;
        self.min_ready = self.min_ready.min(ready);
        let span = now.saturating_duration_since(start);
        if span < WINDOW || self.batches < MIN_BATCHES {
            return false;
        }
        let waited = self.waited.as_secs_f64() / span.as_secs_f64();
        let before = (self.workers, self.prefetch);
        let fits = |w: usize, p: usize| (w + p) as u64 * bytes.max(1) <= self.cfg.memory_budget;
        if waited > STARVED {
            self.calm = 0;
            if self.gave_back {
                // The worker given back was missed: wait longer before the next give-back.
                self.calm_needed = (self.calm_needed * 2).min(MAX_CALM);
            }
            if self.workers < self.max_workers && fits(self.workers + 1, self.prefetch) {
                self.workers += 1;
            } else if self.prefetch < self.max_prefetch && fits(self.workers, self.prefetch + 1) {
                self.prefetch += 1;
            }
        } else if waited < CALM && self.min_ready >= 1 {
            self.calm += 1;
            if self.calm >= self.calm_needed && self.workers > 1 {
                self.workers -= 1;
                self.calm = 0;
            }
        } else {
            self.calm = 0;
        }
        while self.prefetch > 1 && !fits(self.workers, self.prefetch) {
            self.prefetch -= 1;
        }
        self.open(now);
        let changed = (self.workers, self.prefetch) != before;
        if changed {
            self.gave_back = self.workers < before.0;
            self.changes += 1;
        }
        changed
    }

    fn open(&mut self, now: Instant) {
        self.start = Some(now);
        self.batches = 0;
        self.waited = Duration::ZERO;
        self.min_ready = u64::MAX;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BIG: u64 = 1 << 40;

    fn tuner(initial: usize, max_workers: usize, max_prefetch: usize, budget: u64) -> Tuner {
        Tuner::new(
            Autotune {
                initial_workers: initial,
                memory_budget: budget,
            },
            max_workers,
            max_prefetch,
        )
    }

    /// Feeds `windows` windows of 5 batches over 0.6 s each, each batch waited for `wait`
    /// with `ready` batches behind it; the (workers, prefetch) after each window.
    fn feed(
        t: &mut Tuner,
        t0: &mut Instant,
        windows: usize,
        wait: Duration,
        ready: u64,
        bytes: u64,
    ) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        if t.start.is_none() {
            t.observe_at(*t0, Duration::ZERO, 0, bytes);
        }
        for _ in 0..windows {
            for k in 1..=5 {
                t.observe_at(*t0 + Duration::from_millis(120 * k), wait, ready, bytes);
            }
            *t0 += Duration::from_millis(600);
            out.push((t.workers(), t.prefetch()));
        }
        out
    }

    #[test]
    fn a_waiting_consumer_gets_workers_then_prefetch_up_to_the_budget() {
        let mut t = tuner(1, 3, 4, BIG);
        let mut t0 = Instant::now();
        // 60 ms of each 120 ms waited: starved.
        let seen = feed(&mut t, &mut t0, 6, Duration::from_millis(60), 0, 1000);
        assert_eq!(seen, vec![(2, 2), (3, 2), (3, 3), (3, 4), (3, 4), (3, 4)]);
        assert_eq!(t.stats().changes, 4);
    }

    #[test]
    fn the_memory_budget_bounds_the_ring() {
        // Batches of 1000 bytes, 5000 bytes: workers + prefetch <= 5.
        let mut t = tuner(1, 8, 8, 5000);
        let mut t0 = Instant::now();
        let seen = feed(&mut t, &mut t0, 8, Duration::from_millis(60), 0, 1000);
        assert_eq!(seen.last(), Some(&(3, 2)));
        // Batches that grow shrink the prefetch first.
        let seen = feed(&mut t, &mut t0, 1, Duration::ZERO, 0, 2000);
        assert_eq!(seen, vec![(3, 1)]);
    }

    #[test]
    fn workers_ahead_of_a_calm_consumer_give_one_back_and_settle() {
        let mut t = tuner(4, 4, 4, BIG);
        let mut t0 = Instant::now();
        let seen = feed(&mut t, &mut t0, 4, Duration::ZERO, 2, 1000);
        assert_eq!(seen, vec![(4, 2), (3, 2), (3, 2), (2, 2)]);
        // The consumer misses the worker: it comes back, and the next give-back waits
        // twice as long.
        let seen = feed(&mut t, &mut t0, 1, Duration::from_millis(60), 0, 1000);
        assert_eq!(seen, vec![(3, 2)]);
        let seen = feed(&mut t, &mut t0, 4, Duration::ZERO, 2, 1000);
        assert_eq!(seen, vec![(3, 2), (3, 2), (3, 2), (2, 2)]);
        // Never under one worker.
        let seen = feed(&mut t, &mut t0, 40, Duration::ZERO, 2, 1000);
        assert_eq!(seen.last(), Some(&(1, 2)));
    }

    #[test]
    fn a_short_window_or_a_consumer_without_slack_changes_nothing() {
        let mut t = tuner(2, 4, 4, BIG);
        let t0 = Instant::now();
        t.observe_at(t0, Duration::from_secs(5), 0, 1000); // the start-up's wait: not judged
        for k in 1..=3 {
            assert!(!t.observe_at(
                t0 + Duration::from_millis(300 * k),
                Duration::from_millis(200),
                0,
                1000
            ));
        }
        assert_eq!((t.workers(), t.prefetch()), (2, 2));
        // Calm, but nothing ready behind the batches taken: the workers are just in time.
        let mut t = tuner(2, 4, 4, BIG);
        let mut t0 = Instant::now();
        let seen = feed(&mut t, &mut t0, 6, Duration::ZERO, 0, 1000);
        assert_eq!(seen, vec![(2, 2); 6]);
        assert_eq!(t.stats().changes, 0);
    }
}
