//! The only module that starts threads: an epoch's worker pool and its ordered hand-off.
//!
//! The unit of parallel work is a batch. Worker `k` claims the next batch number, reads its
//! samples in plan order, transforms them and collates them into pooled buffers, then files
//! the batch in a ring of `workers + prefetch` slots indexed by batch number. The consumer
//! takes slots strictly in batch order. So the delivered stream depends only on the plan,
//! never on which worker built what or when; the ring bounds memory (no worker runs more than
//! `workers + prefetch` batches ahead of the consumer) and needs no per-sample
//! synchronisation. Threads are created lazily on the first `next()` of an epoch (fork-safe)
//! and stop when the epoch ends or the run is dropped.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use chute_core::{Batch, BufferPool, Error, Plan, Sample, SampleRef, SampleRng, Source};
use chute_ops::Transform;

use crate::collate::collate;
use crate::stats::{StageKind, Stats};

/// What one epoch's run needs; immutable once built, shared by all workers.
pub(crate) struct Job {
    pub(crate) source: Arc<dyn Source>,
    pub(crate) transform: Option<Arc<dyn Transform>>,
    pub(crate) plan: Plan,
    /// First plan position to deliver (non-zero after a mid-epoch resume).
    pub(crate) first: u64,
    pub(crate) batch_size: u64,
    pub(crate) seed: u64,
    pub(crate) epoch: u64,
    pub(crate) pool: BufferPool,
    pub(crate) stats: Arc<Stats>,
    pub(crate) cancel: AtomicBool,
}

impl Job {
    /// Batches left to deliver in this run.
    pub(crate) fn num_batches(&self) -> u64 {
        (self.plan.len() - self.first).div_ceil(self.batch_size)
    }

    /// Plan positions of batch `b` of this run.
    pub(crate) fn batch_range(&self, b: u64) -> (u64, u64) {
        let lo = self.first + b * self.batch_size;
        (lo, (lo + self.batch_size).min(self.plan.len()))
    }

    /// Builds batch `b`: read, transform, collate. Every failure, panics included, becomes an
    /// error naming the sample.
    pub(crate) fn build(&self, b: u64) -> Result<Batch, Error> {
        let (lo, hi) = self.batch_range(b);
        let mut ids = Vec::with_capacity((hi - lo) as usize);
        let mut samples: Vec<Sample> = Vec::with_capacity((hi - lo) as usize);

        let t0 = Instant::now();
        for i in lo..hi {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(self.cancelled(self.plan.get(i)));
            }
            let id = self.plan.get(i);
            ids.push(id);
            let sample = catch_unwind(AssertUnwindSafe(|| self.source.read(id)))
                .map_err(|p| self.panicked(id, String::new(), p))?
                .map_err(|e| self.with_shard(e))?;
            samples.push(sample);
        }
        let t1 = Instant::now();
        self.stats.stage(StageKind::Read, t1 - t0, hi - lo);

        if let Some(t) = &self.transform {
            for s in &mut samples {
                if self.cancel.load(Ordering::Relaxed) {
                    return Err(self.cancelled(s.index));
                }
                let mut rng = SampleRng::for_sample(self.seed, self.epoch, s.index);
                let (index, key) = (s.index, s.key.clone());
                match catch_unwind(AssertUnwindSafe(|| t.apply(s, &mut rng))) {
                    Ok(Ok(())) => {}
                    Ok(Err(source)) => {
                        return Err(Error::Transform {
                            sample: self.describe(index, key),
                            source,
                        });
                    }
                    Err(p) => return Err(self.panicked(index, key, p)),
                }
            }
        }
        let t2 = Instant::now();
        self.stats.stage(StageKind::Transform, t2 - t1, hi - lo);

        let columns = collate(&samples, &self.pool).map_err(|e| self.with_shard(e))?;
        self.stats.stage(StageKind::Collate, t2.elapsed(), 1);
        Ok(Batch {
            columns,
            ids,
            epoch: self.epoch,
            index: lo / self.batch_size,
        })
    }

    /// A sample reference with its shard filled in from the manifest.
    fn describe(&self, index: u64, key: String) -> SampleRef {
        let manifest = self.source.manifest();
        let shard = manifest
            .locate(index)
            .map(|(s, _)| manifest.shards[s].path.clone())
            .unwrap_or_default();
        SampleRef { index, key, shard }
    }

    fn with_shard(&self, e: Error) -> Error {
        match e {
            Error::Collate { sample, reason } => Error::Collate {
                sample: self.describe(sample.index, sample.key),
                reason,
            },
            other => other,
        }
    }

    fn panicked(&self, index: u64, key: String, payload: Box<dyn Any + Send>) -> Error {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string panic payload".into());
        Error::WorkerPanicked {
            sample: self.describe(index, key),
            message,
        }
    }

    fn cancelled(&self, index: u64) -> Error {
        Error::WorkerPanicked {
            sample: self.describe(index, String::new()),
            message: "the loader was dropped while this batch was being built".into(),
        }
    }
}

/// The ring of batch slots shared by the workers and the consumer.
struct Ring {
    next_claim: u64,
    next_deliver: u64,
    slots: Vec<Option<Result<Batch, Error>>>,
}

struct Shared {
    job: Job,
    ring: Mutex<Ring>,
    /// Signalled when the consumer frees a slot (or the run is cancelled).
    room: Condvar,
    /// Signalled when a worker files a batch.
    ready: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Ring> {
        // A panic never happens while the lock is held (batches are built outside it), but a
        // poisoned lock must not hang or abort the consumer either.
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn cap(&self) -> u64 {
        self.lock().slots.len() as u64
    }
}

/// One epoch's run: workers building batches ahead of the consumer, or (with zero workers)
/// batches built inline in `next()`.
pub(crate) struct Run {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    workers: usize,
}

impl Run {
    /// Starts `workers` threads with `workers + prefetch` slots (no threads for zero workers).
    pub(crate) fn start(job: Job, workers: usize, prefetch: usize) -> Run {
        let cap = (workers + prefetch).max(1);
        let shared = Arc::new(Shared {
            job,
            ring: Mutex::new(Ring {
                next_claim: 0,
                next_deliver: 0,
                slots: (0..cap).map(|_| None).collect(),
            }),
            room: Condvar::new(),
            ready: Condvar::new(),
        });
        let threads = (0..workers)
            .map(|k| {
                let shared = Arc::clone(&shared);
                #[allow(clippy::disallowed_methods)] // this module is the one that spawns
                std::thread::Builder::new()
                    .name(format!("chute-worker-{k}"))
                    .spawn(move || worker(&shared))
                    .expect("the OS refused to start a worker thread")
            })
            .collect();
        Run {
            shared,
            threads,
            workers,
        }
    }

    /// The job this run executes.
    pub(crate) fn job(&self) -> &Job {
        &self.shared.job
    }

    /// The next batch in order with its number, or `None` when the run is complete.
    pub(crate) fn next(&mut self) -> Option<(u64, Result<Batch, Error>)> {
        let job = &self.shared.job;
        let total = job.num_batches();
        if self.workers == 0 {
            let mut ring = self.shared.lock();
            let b = ring.next_deliver;
            if b >= total {
                return None;
            }
            ring.next_deliver += 1;
            drop(ring);
            return Some((b, build_guarded(job, b)));
        }
        let cap = self.shared.cap();
        let mut ring = self.shared.lock();
        let b = ring.next_deliver;
        if b >= total {
            return None;
        }
        let slot = (b % cap) as usize;
        loop {
            if let Some(result) = ring.slots[slot].take() {
                ring.next_deliver += 1;
                drop(ring);
                self.shared.room.notify_all();
                return Some((b, result));
            }
            ring = self
                .shared
                .ready
                .wait(ring)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        self.shared.job.cancel.store(true, Ordering::Relaxed);
        {
            // Taking the lock orders the flag before the wake-up, so no worker misses it.
            let _ring = self.shared.lock();
            self.shared.room.notify_all();
            self.shared.ready.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Builds batch `b`, turning a panic outside the per-sample guards into an error too, so the
/// slot is always filled and the consumer can never wait forever.
fn build_guarded(job: &Job, b: u64) -> Result<Batch, Error> {
    catch_unwind(AssertUnwindSafe(|| job.build(b))).unwrap_or_else(|p| {
        let (lo, _) = job.batch_range(b);
        Err(job.panicked(job.plan.get(lo), String::new(), p))
    })
}

fn worker(shared: &Shared) {
    let job = &shared.job;
    let total = job.num_batches();
    let cap = shared.cap();
    loop {
        let b = {
            let mut ring = shared.lock();
            loop {
                if job.cancel.load(Ordering::Relaxed) || ring.next_claim >= total {
                    return;
                }
                if ring.next_claim < ring.next_deliver + cap {
                    break;
                }
                ring = shared.room.wait(ring).unwrap_or_else(|e| e.into_inner());
            }
            ring.next_claim += 1;
            ring.next_claim - 1
        };
        let result = build_guarded(job, b);
        let mut ring = shared.lock();
        ring.slots[(b % cap) as usize] = Some(result);
        drop(ring);
        shared.ready.notify_one();
    }
}
