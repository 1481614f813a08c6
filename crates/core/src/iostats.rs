//! [`IoStats`]: what remote reading cost: bytes, requests, retries, cache hits. Plain
//! counters (the I/O itself is chute-io's, which adds to them); they live here so that the
//! engine's statistics can report the process's remote traffic without depending on the I/O
//! layer.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counters of remote reads, shared by the fetches that update them. Every shard set of
/// chute-io keeps its own, and every fetch also counts in the process-wide [`io_stats`].
#[derive(Debug, Default)]
pub struct IoStats {
    bytes_fetched: AtomicU64,
    requests: AtomicU64,
    retries: AtomicU64,
    cache_hits: AtomicU64,
    shards_fetched: AtomicU64,
    failures: AtomicU64,
}

/// A copy of [`IoStats`]' counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct IoSnapshot {
    /// Body bytes received from remote stores (not from the node-local cache).
    pub bytes_fetched: u64,
    /// Requests sent (GET and HEAD, first attempts and retries).
    pub requests: u64,
    /// Requests that were retries or resumptions of a failed one.
    pub retries: u64,
    /// Whole shards served by the node-local cache instead of the network.
    pub cache_hits: u64,
    /// Whole shards downloaded.
    pub shards_fetched: u64,
    /// Fetches that failed for good (after their retries).
    pub failures: u64,
}

static GLOBAL: IoStats = IoStats {
    bytes_fetched: AtomicU64::new(0),
    requests: AtomicU64::new(0),
    retries: AtomicU64::new(0),
    cache_hits: AtomicU64::new(0),
    shards_fetched: AtomicU64::new(0),
    failures: AtomicU64::new(0),
};

/// The process-wide counters: every remote read since the process started.
pub fn io_stats() -> IoSnapshot {
    GLOBAL.snapshot()
}

impl IoStats {
    /// The counters now.
    pub fn snapshot(&self) -> IoSnapshot {
        IoSnapshot {
            bytes_fetched: self.bytes_fetched.load(Relaxed),
            requests: self.requests.load(Relaxed),
            retries: self.retries.load(Relaxed),
            cache_hits: self.cache_hits.load(Relaxed),
            shards_fetched: self.shards_fetched.load(Relaxed),
            failures: self.failures.load(Relaxed),
        }
    }

    /// Adds `n` to one counter, here and in the process-wide ones.
    pub fn add(&self, what: Counter, n: u64) {
        for s in [self, &GLOBAL] {
            let c = match what {
                Counter::Bytes => &s.bytes_fetched,
                Counter::Requests => &s.requests,
                Counter::Retries => &s.retries,
                Counter::CacheHits => &s.cache_hits,
                Counter::Shards => &s.shards_fetched,
                Counter::Failures => &s.failures,
            };
            c.fetch_add(n, Relaxed);
        }
    }
}

/// Which [`IoStats`] counter [`IoStats::add`] adds to.
#[derive(Debug, Clone, Copy)]
pub enum Counter {
    /// [`IoSnapshot::bytes_fetched`].
    Bytes,
    /// [`IoSnapshot::requests`].
    Requests,
    /// [`IoSnapshot::retries`].
    Retries,
    /// [`IoSnapshot::cache_hits`].
    CacheHits,
    /// [`IoSnapshot::shards_fetched`].
    Shards,
    /// [`IoSnapshot::failures`].
    Failures,
}

impl IoSnapshot {
    /// Each counter of `self` plus the one of `other` (a source made of several: a mixture).
    pub fn plus(&self, other: &IoSnapshot) -> IoSnapshot {
        IoSnapshot {
            bytes_fetched: self.bytes_fetched.saturating_add(other.bytes_fetched),
            requests: self.requests.saturating_add(other.requests),
            retries: self.retries.saturating_add(other.retries),
            cache_hits: self.cache_hits.saturating_add(other.cache_hits),
            shards_fetched: self.shards_fetched.saturating_add(other.shards_fetched),
            failures: self.failures.saturating_add(other.failures),
        }
    }

    /// Each counter of `self` minus the one of `earlier` (zero where it was larger).
    pub fn since(&self, earlier: &IoSnapshot) -> IoSnapshot {
        IoSnapshot {
            bytes_fetched: self.bytes_fetched.saturating_sub(earlier.bytes_fetched),
            requests: self.requests.saturating_sub(earlier.requests),
            retries: self.retries.saturating_sub(earlier.retries),
            cache_hits: self.cache_hits.saturating_sub(earlier.cache_hits),
            shards_fetched: self.shards_fetched.saturating_sub(earlier.shards_fetched),
            failures: self.failures.saturating_sub(earlier.failures),
        }
    }
}
