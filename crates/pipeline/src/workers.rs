//! The only module that starts threads: an epoch's worker pool and its ordered hand-off.
//!
//! The unit of parallel work is a batch. Worker `k` claims the next batch number, reads its
//! samples in plan order, transforms them and collates them into pooled buffers, then files
//! the batch in a ring of `workers + prefetch` slots indexed by batch number. The consumer
//! takes slots strictly in batch order. So the delivered stream depends only on the plan,
//! never on which worker built what or when; the ring bounds memory (no worker runs more than
//! `workers + prefetch` batches ahead of the consumer) and needs no per-sample
//! synchronisation. Two exceptions share a batch's work among workers: the run's first batch
//! has its reads split among all of them ([`Assist`]), and a worker that finds no batch left to
//! claim helps the batches still being built with their transforms ([`Helpers`]), so the end
//! of a run does not leave workers idle. Threads are created lazily on the first `next()` of
//! an epoch (fork-safe) and stop when the epoch ends or the run is dropped.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chute_core::Transform;
use chute_core::{
    Batch, BufferPool, Column, Error, OnError, Plan, Sample, SampleRef, SampleRng, Source, Tensor,
};

use crate::collate::collate;
use crate::stats::{StageKind, Stats};

/// Samples a worker reads with one [`Source::read_many`] call: few enough that a cancelled
/// run (a dropped loader) stops soon, enough that a per-call cost is paid rarely.
const READ_CHUNK: usize = 32;

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
    pub(crate) on_error: OnError,
    /// Pad arrays of differing shapes (with a mask column) instead of listing them.
    pub(crate) pad: bool,
    /// The run's first batch, its reads shared out among the workers ([`Run::start`] sets it
    /// when there are several).
    pub(crate) assist: Option<Assist>,
    /// The batches whose samples are being transformed, open to workers that have no batch
    /// left to claim (the epoch's last batches).
    pub(crate) helpers: Helpers,
    /// The run's workers ([`Run::start`] sets it): transforms are shared when several.
    pub(crate) share: usize,
}

/// Workers left without a batch at the end of a run help the batches still being built:
/// each such batch's transforms are claimed sample by sample (in chunks), by its own worker
/// and by the idle ones, each sample with its own RNG and writing its own rows of the batch
/// buffers, so the batch is the same whoever transformed what. Without it, a run's last
/// `workers - 1` batches each take one worker's time while the others wait: with few batches
/// an epoch (videos, large images) that is a large part of the epoch.
#[derive(Default)]
pub(crate) struct Helpers {
    state: Mutex<HelpState>,
    /// Signalled when a batch opens its work, when a batch is filed, and on cancellation.
    changed: Condvar,
}

#[derive(Default)]
struct HelpState {
    /// The batches whose transforms may be shared.
    open: Vec<Arc<Work>>,
    /// Batches claimed and not yet filed.
    building: usize,
}

impl Helpers {
    fn lock(&self) -> MutexGuard<'_, HelpState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A batch was claimed.
    fn claimed(&self) {
        self.lock().building += 1;
    }

    /// A batch was filed.
    fn filed(&self) {
        self.lock().building -= 1;
        self.changed.notify_all();
    }

    /// Wakes the idle workers (the run is cancelled, or the first batch's reads are open).
    fn wake(&self) {
        let _state = self.lock();
        self.changed.notify_all();
    }

    /// An idle worker's life at the end of a run: helps the first batch's reads (when the
    /// run has fewer batches than workers) and each open batch's transforms until no batch
    /// is being built (or the run is cancelled).
    fn help_until_done(&self, job: &Job) {
        loop {
            let work = {
                let mut state = self.lock();
                loop {
                    if job.cancel.load(Ordering::Relaxed) {
                        return;
                    }
                    if let Some(a) = job.assist.as_ref().filter(|a| a.unclaimed()) {
                        drop(state);
                        a.help(job);
                        state = self.lock();
                        continue;
                    }
                    let Some(t) = &job.transform else {
                        if state.building == 0 {
                            return;
                        }
                        state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
                        continue;
                    };
                    // The lowest batch first: the consumer waits for it.
                    if let Some(w) = state
                        .open
                        .iter()
                        .filter(|w| w.unclaimed())
                        .min_by_key(|w| w.batch)
                    {
                        break (Arc::clone(w), Arc::clone(t));
                    }
                    if state.building == 0 {
                        return;
                    }
                    state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
                }
            };
            work.0.help(job, work.1.as_ref());
        }
    }
}

/// One batch's transforms, shared: the samples, where each writes its rows, and who has done
/// what.
pub(crate) struct Work {
    batch: u64,
    /// The batch's first plan position (a failed sample's replacement is searched from it).
    lo: u64,
    samples: Vec<Mutex<Option<Sample>>>,
    /// Each slot's buffer (its address) and row size; sample `k` writes bytes
    /// `k * row .. (k + 1) * row` of each.
    rows: Vec<(usize, usize)>,
    chunk: usize,
    next: AtomicUsize,
    /// Samples transformed (or failed), and each failure.
    done: Mutex<(usize, Vec<Option<Error>>)>,
    finished: Condvar,
}

impl Work {
    fn unclaimed(&self) -> bool {
        self.next.load(Ordering::Relaxed) * self.chunk < self.samples.len()
    }

    /// Transforms unclaimed chunks of samples until none is left.
    fn help(&self, job: &Job, t: &dyn Transform) {
        let n = self.samples.len();
        loop {
            let c = self.next.fetch_add(1, Ordering::AcqRel);
            let start = c.saturating_mul(self.chunk);
            if start >= n {
                return;
            }
            let end = (start + self.chunk).min(n);
            let failed: Vec<(usize, Error)> = (start..end)
                .filter_map(|k| self.transform(job, t, k).err().map(|e| (k, e)))
                .collect();
            let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
            done.0 += end - start;
            for (k, e) in failed {
                done.1[k] = Some(e);
            }
            drop(done);
            self.finished.notify_all();
        }
    }

    /// Sample `k`: transformed into its rows (or, with `on_error="skip"`, replaced), put back.
    fn transform(&self, job: &Job, t: &dyn Transform, k: usize) -> Result<(), Error> {
        let cell = &self.samples[k];
        let Some(mut s) = cell.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Ok(());
        };
        let (index, key) = (s.index, s.key.clone());
        let run = || {
            // SAFETY: each row belongs to one sample, and each sample is claimed by one thread
            // (`next` hands out each chunk once); the buffers outlive every claim, since their
            // owner waits for all claimed samples ([`Opened`]'s drop) before touching or
            // dropping them.
            let mut out: Vec<&mut [u8]> = self
                .rows
                .iter()
                .map(|&(base, row)| unsafe {
                    std::slice::from_raw_parts_mut((base + k * row) as *mut u8, row)
                })
                .collect();
            job.check_cancel(s.index)?;
            match job.transform_one(t, &mut s, &mut out) {
                Ok(()) => Ok(s),
                Err(e) => job.replace(self.lo + k as u64, e, true, &mut out),
            }
        };
        let s = catch_unwind(AssertUnwindSafe(run))
            .unwrap_or_else(|p| Err(job.panicked(index, key, p)))?;
        *cell.lock().unwrap_or_else(|e| e.into_inner()) = Some(s);
        Ok(())
    }
}

/// A batch's work, open to helpers while it lives; dropping it closes the work (no further
/// claims) and waits for the samples already claimed, so no helper writes a buffer after.
struct Opened<'a> {
    helpers: &'a Helpers,
    work: Arc<Work>,
}

impl<'a> Opened<'a> {
    fn new(helpers: &'a Helpers, work: Arc<Work>) -> Self {
        helpers.lock().open.push(Arc::clone(&work));
        helpers.changed.notify_all();
        Opened { helpers, work }
    }
}

impl Drop for Opened<'_> {
    fn drop(&mut self) {
        self.helpers
            .lock()
            .open
            .retain(|w| !Arc::ptr_eq(w, &self.work));
        let w = &self.work;
        let n = w.samples.len();
        let claimed = w
            .next
            .swap(usize::MAX / 2, Ordering::AcqRel)
            .saturating_mul(w.chunk)
            .min(n);
        let mut done = w.done.lock().unwrap_or_else(|e| e.into_inner());
        while done.0 < claimed {
            done = w.finished.wait(done).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The first batch of a run with its reads shared out among the workers: each worker takes
/// unclaimed chunks of it before each chunk of its own batch, so the first batch arrives in
/// about 1/workers of the time one worker takes (they would otherwise each build a batch of
/// their own meanwhile). Later batches are one worker's each: in steady state that is the
/// same throughput with less coordination. Only reads are shared (the work of a Python
/// dataset's `__getitem__`); transforms stay with the batch's worker.
pub(crate) struct Assist {
    batch: u64,
    ids: Vec<u64>,
    chunk: usize,
    /// Set by the batch's worker once it reads sample by sample (not through the source's
    /// columnar path, which reads nothing here).
    open: AtomicBool,
    next: AtomicUsize,
    results: Mutex<Vec<Option<Reads>>>,
    filled: Condvar,
}

/// The results of reading a chunk of samples, in order.
type Reads = Vec<Result<Sample, Error>>;

impl Assist {
    /// Sharing batch `b` of `job` (plan ids `ids`) among `workers`.
    fn new(b: u64, ids: Vec<u64>, workers: usize) -> Assist {
        let chunk = ids.len().div_ceil(2 * workers.max(1)).clamp(1, READ_CHUNK);
        let chunks = ids.len().div_ceil(chunk);
        Assist {
            batch: b,
            ids,
            chunk,
            open: AtomicBool::new(false),
            next: AtomicUsize::new(0),
            results: Mutex::new((0..chunks).map(|_| None).collect()),
            filled: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Option<Reads>>> {
        self.results.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether chunks are left to read (and the batch's worker has opened it).
    fn unclaimed(&self) -> bool {
        self.open.load(Ordering::Acquire)
            && self.next.load(Ordering::Relaxed) * self.chunk < self.ids.len()
    }

    /// Reads unclaimed chunks until none is left (nothing once the batch is read).
    fn help(&self, job: &Job) {
        if !self.open.load(Ordering::Acquire) {
            return;
        }
        while self.next.load(Ordering::Relaxed) * self.chunk < self.ids.len() {
            let c = self.next.fetch_add(1, Ordering::AcqRel);
            let start = c * self.chunk;
            if start >= self.ids.len() {
                return;
            }
            let ids = &self.ids[start..(start + self.chunk).min(self.ids.len())];
            let read = match job.check_cancel(ids[0]) {
                Ok(()) => job.read_many(ids),
                Err(_) => ids.iter().map(|&id| Err(job.cancelled(id))).collect(),
            };
            self.lock()[c] = Some(read);
            self.filled.notify_all();
        }
    }

    /// The batch's worker: opens the batch to helpers, reads chunks too, waits for the rest;
    /// the reads in order.
    fn gather(&self, job: &Job) -> Vec<Result<Sample, Error>> {
        self.open.store(true, Ordering::Release);
        // Workers with no batch of their own (a run of fewer batches than workers) wait on
        // the helpers' signal.
        job.helpers.wake();
        self.help(job);
        let mut results = self.lock();
        while results.iter().any(Option::is_none) {
            results = self.filled.wait(results).unwrap_or_else(|e| e.into_inner());
        }
        results
            .iter_mut()
            .flat_map(|c| c.take().unwrap_or_default())
            .collect()
    }
}

/// With `on_error = skip`, how many following samples are tried in place of a failed one
/// before the batch fails after all (a run of bad data that long is worth stopping for).
const MAX_REPLACEMENTS: u64 = 16;

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
    /// error naming the sample; with [`OnError::Skip`] a failed sample is replaced instead.
    pub(crate) fn build(&self, b: u64) -> Result<Batch, Error> {
        let (lo, hi) = self.batch_range(b);
        if self.transform.is_none()
            && let Some(batch) = self.build_columnar(lo, hi)
        {
            match batch {
                // A row the columnar path cannot convert: with `on_error="skip"` the batch is
                // read again sample by sample, where the failing samples are replaced.
                Err(Error::Corrupt { .. }) if self.on_error == OnError::Skip => {}
                batch => return batch,
            }
        }
        let mut ids = Vec::with_capacity((hi - lo) as usize);
        let mut samples: Vec<Sample> = Vec::with_capacity((hi - lo) as usize);

        let t0 = Instant::now();
        self.plan.extend_ids(lo..hi, &mut ids);
        let mut take = |k: usize, r: Result<Sample, Error>, ids: &mut [u64]| {
            let sample = match r {
                Ok(s) => s,
                Err(e) => self.replace(lo + k as u64, e, false, &mut [])?,
            };
            ids[k] = sample.index;
            samples.push(sample);
            Ok::<(), Error>(())
        };
        match self.assist.as_ref().filter(|a| a.batch == b) {
            Some(assist) => {
                for (k, r) in assist.gather(self).into_iter().enumerate() {
                    take(k, r, &mut ids)?;
                }
            }
            None => {
                for start in (0..ids.len()).step_by(READ_CHUNK) {
                    if let Some(assist) = &self.assist {
                        assist.help(self);
                    }
                    let end = (start + READ_CHUNK).min(ids.len());
                    self.check_cancel(ids[start])?;
                    let read = self.read_many(&ids[start..end]);
                    for (k, r) in (start..end).zip(read) {
                        take(k, r, &mut ids)?;
                    }
                }
            }
        }
        let t1 = Instant::now();
        self.stats.stage(StageKind::Read, t1 - t0, hi - lo);

        // Columns the transform writes in place: each sample's final pixels go straight
        // into its slot of the batch buffer.
        let mut direct = Vec::new();
        if let Some(t) = &self.transform {
            let slots = t.slots();
            let n = samples.len();
            let mut bufs: Vec<_> = slots
                .iter()
                .map(|s| self.pool.take(s.nbytes() * n))
                .collect();
            let rows = bufs
                .iter_mut()
                .zip(slots)
                .map(|(b, slot)| (b.as_mut_slice().as_mut_ptr() as usize, slot.nbytes()))
                .collect();
            let work = Arc::new(Work {
                batch: b,
                lo,
                samples: samples.drain(..).map(|s| Mutex::new(Some(s))).collect(),
                rows,
                chunk: n.div_ceil(4 * self.share.max(1)).max(1),
                next: AtomicUsize::new(0),
                done: Mutex::new((0, (0..n).map(|_| None).collect())),
                finished: Condvar::new(),
            });
            {
                let _opened =
                    (self.share > 1).then(|| Opened::new(&self.helpers, Arc::clone(&work)));
                work.help(self, t.as_ref());
            }
            let mut done = work.done.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(e) = done.1.iter_mut().find_map(Option::take) {
                return Err(e);
            }
            drop(done);
            for (k, cell) in work.samples.iter().enumerate() {
                let s = cell
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()
                    .expect("every sample transformed or failed");
                ids[k] = s.index;
                samples.push(s);
            }
            for (slot, buf) in slots.iter().zip(bufs) {
                let mut shape = Vec::with_capacity(slot.shape.len() + 1);
                shape.push(n);
                shape.extend_from_slice(&slot.shape);
                direct.push((
                    slot.name.clone(),
                    Column::Tensor(Tensor::new(slot.dtype, shape, buf)),
                ));
            }
        }
        let t2 = Instant::now();
        self.stats.stage(StageKind::Transform, t2 - t1, hi - lo);

        let mut columns =
            collate(&samples, &self.pool, self.pad).map_err(|e| self.with_shard(e))?;
        columns.extend(direct);
        self.stats.stage(StageKind::Collate, t2.elapsed(), 1);
        Ok(Batch {
            columns,
            ids,
            epoch: self.epoch,
            index: lo / self.batch_size,
        })
    }

    /// The source's columnar fast path for plan positions `lo..hi`, if it has one. Failures
    /// here are batch-level (`on_error` applies to single samples on the sample path).
    fn build_columnar(&self, lo: u64, hi: u64) -> Option<Result<Batch, Error>> {
        let t0 = Instant::now();
        let mut ids = Vec::new();
        self.plan.extend_ids(lo..hi, &mut ids);
        let columns = match catch_unwind(AssertUnwindSafe(|| self.source.collate(&ids, &self.pool)))
        {
            Ok(None) => return None,
            Ok(Some(Ok(columns))) => crate::collate::settle(columns, &self.pool, self.pad),
            Ok(Some(Err(e))) => return Some(Err(self.with_shard(e))),
            Err(p) => return Some(Err(self.panicked(ids[0], String::new(), p))),
        };
        self.stats.stage(StageKind::Collate, t0.elapsed(), 1);
        Some(Ok(Batch {
            columns,
            ids,
            epoch: self.epoch,
            index: lo / self.batch_size,
        }))
    }

    fn check_cancel(&self, id: u64) -> Result<(), Error> {
        if self.cancel.load(Ordering::Relaxed) {
            Err(self.cancelled(id))
        } else {
            Ok(())
        }
    }

    /// Reads samples `ids` together ([`Source::read_many`]); if the source panics, reads them
    /// one by one so the panic is reported for its own sample.
    fn read_many(&self, ids: &[u64]) -> Vec<Result<Sample, Error>> {
        match catch_unwind(AssertUnwindSafe(|| self.source.read_many(ids))) {
            Ok(read) if read.len() == ids.len() => read
                .into_iter()
                .map(|r| r.map_err(|e| self.with_shard(e)))
                .collect(),
            _ => ids.iter().map(|&id| self.read(id)).collect(),
        }
    }

    /// Reads sample `id`, a panic in the source included in the errors.
    fn read(&self, id: u64) -> Result<Sample, Error> {
        catch_unwind(AssertUnwindSafe(|| self.source.read(id)))
            .map_err(|p| self.panicked(id, String::new(), p))?
            .map_err(|e| self.with_shard(e))
    }

    /// Runs the transform on `s` with the sample's own RNG, writing the transform's slots
    /// (if it has any) into `out`.
    fn transform_one(
        &self,
        t: &dyn Transform,
        s: &mut Sample,
        out: &mut [&mut [u8]],
    ) -> Result<(), Error> {
        let mut rng = SampleRng::for_sample(self.seed, self.epoch, s.index);
        let run = || {
            if out.is_empty() {
                t.apply(s, &mut rng)
            } else {
                t.apply_into(s, &mut rng, out)
            }
        };
        match catch_unwind(AssertUnwindSafe(run)) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(source)) => Err(Error::Transform {
                sample: self.describe(s.index, s.key.clone()),
                source,
            }),
            Err(p) => Err(self.panicked(s.index, s.key.clone(), p)),
        }
    }

    /// With [`OnError::Raise`], `error`. With [`OnError::Skip`]: counts and reports the
    /// failure, then returns the sample at the next plan position that reads (and, if
    /// `transform`, transforms) cleanly, wrapping around the epoch. The replacement depends
    /// only on the plan and the data, so the stream stays deterministic and the batch full.
    fn replace(
        &self,
        i: u64,
        error: Error,
        transform: bool,
        out: &mut [&mut [u8]],
    ) -> Result<Sample, Error> {
        if self.on_error == OnError::Raise {
            return Err(error);
        }
        self.stats.skipped(&error);
        let len = self.plan.len();
        let manifest = self.source.manifest();
        let shard_of = |id: u64| manifest.locate(id).map(|(s, _)| s);
        // A shard that cannot be read at all (a remote object whose download failed for good)
        // fails every sample in it the same way: its other positions are passed over
        // without counting against the replacements (and without reading them again).
        let dead = match &error {
            Error::Io { .. } => shard_of(self.plan.get(i)),
            _ => None,
        };
        let mut last = error;
        let mut tried = 0;
        for k in 1..len {
            if tried == MAX_REPLACEMENTS {
                break;
            }
            let id = self.plan.get((i + k) % len);
            if dead.is_some() && shard_of(id) == dead {
                continue;
            }
            tried += 1;
            let mut r = self.read(id);
            if let (Ok(s), true, Some(t)) = (&mut r, transform, &self.transform)
                && let Err(e) = self.transform_one(t.as_ref(), s, out)
            {
                r = Err(e);
            }
            match r {
                Ok(s) => return Ok(s),
                Err(e) => last = e,
            }
        }
        Err(last)
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
    /// Workers allowed to claim batches (those numbered under it; all without autotune).
    active: usize,
    /// How far ahead of the consumer batches may be claimed: active workers + prefetch (the
    /// slots without autotune).
    ahead: u64,
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
    /// With `limits` (the autotuner's `(workers, prefetch)`), only that many workers build
    /// batches, at most that far ahead, until [`Run::set_limits`] changes them.
    pub(crate) fn start(
        mut job: Job,
        workers: usize,
        prefetch: usize,
        limits: Option<(usize, usize)>,
    ) -> Run {
        let cap = (workers + prefetch).max(1);
        let (active, ahead) = match limits {
            Some((w, p)) => (
                w.clamp(1, workers.max(1)),
                ((w + p) as u64).clamp(1, cap as u64),
            ),
            None => (workers, cap as u64),
        };
        job.share = workers;
        if workers >= 2 && job.num_batches() > 0 {
            let (lo, hi) = job.batch_range(0);
            let mut ids = Vec::with_capacity((hi - lo) as usize);
            job.plan.extend_ids(lo..hi, &mut ids);
            job.assist = Some(Assist::new(0, ids, workers));
        }
        let shared = Arc::new(Shared {
            job,
            ring: Mutex::new(Ring {
                next_claim: 0,
                next_deliver: 0,
                slots: (0..cap).map(|_| None).collect(),
                active,
                ahead,
            }),
            room: Condvar::new(),
            ready: Condvar::new(),
        });
        shared.job.stats.run(
            active.min(workers),
            if workers == 0 { 0 } else { ahead as usize },
        );
        let threads = (0..workers)
            .map(|k| {
                let shared = Arc::clone(&shared);
                #[allow(clippy::disallowed_methods)] // this module is the one that spawns
                std::thread::Builder::new()
                    .name(format!("chute-worker-{k}"))
                    .spawn(move || worker(&shared, k))
                    .expect("the OS refused to start a worker thread")
            })
            .collect();
        Run {
            shared,
            threads,
            workers,
        }
    }

    /// The autotuner's new limits: `workers` workers build batches, at most `prefetch`
    /// batches ahead of their own. Which worker builds a batch never changes the stream.
    pub(crate) fn set_limits(&self, workers: usize, prefetch: usize) {
        if self.workers == 0 {
            return;
        }
        let mut ring = self.shared.lock();
        ring.active = workers.clamp(1, self.workers);
        ring.ahead = ((ring.active + prefetch) as u64).clamp(1, ring.slots.len() as u64);
        self.shared.job.stats.run(ring.active, ring.ahead as usize);
        drop(ring);
        self.shared.room.notify_all();
    }

    /// The job this run executes.
    pub(crate) fn job(&self) -> &Job {
        &self.shared.job
    }

    /// The next batch in order with its number, [`Polled::Done`] when the run is complete, or
    /// [`Polled::Pending`] if `timeout` passed first (then nothing was consumed). With zero
    /// workers the batch is built here and the timeout does not apply.
    pub(crate) fn next(&mut self, timeout: Option<Duration>) -> Polled {
        let job = &self.shared.job;
        let total = job.num_batches();
        let mut ring = self.shared.lock();
        let b = ring.next_deliver;
        if b >= total {
            return Polled::Done;
        }
        if self.workers == 0 {
            ring.next_deliver += 1;
            drop(ring);
            return Polled::Ready(b, build_guarded(job, b));
        }
        let slot = (b % ring.slots.len() as u64) as usize;
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(result) = ring.slots[slot].take() {
                ring.next_deliver += 1;
                job.stats.taken();
                drop(ring);
                self.shared.room.notify_all();
                return Polled::Ready(b, result);
            }
            ring = match deadline {
                None => self
                    .shared
                    .ready
                    .wait(ring)
                    .unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Polled::Pending;
                    }
                    self.shared
                        .ready
                        .wait_timeout(ring, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
    }
}

/// What [`Run::next`] found.
pub(crate) enum Polled {
    /// Batch number and its result.
    Ready(u64, Result<Batch, Error>),
    /// Every batch of the run was delivered.
    Done,
    /// The timeout passed first.
    Pending,
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
        self.shared.job.helpers.wake();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.shared.job.stats.run(0, 0);
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

/// Worker `k`: claims the next batch while it is among the active workers and the ring has
/// room ahead of the consumer, builds it, files it.
fn worker(shared: &Shared, k: usize) {
    let job = &shared.job;
    let total = job.num_batches();
    let cap = shared.cap();
    loop {
        let b = {
            let mut ring = shared.lock();
            loop {
                if job.cancel.load(Ordering::Relaxed) {
                    return;
                }
                if ring.next_claim >= total {
                    // Nothing left to claim: help the batches still being built.
                    let helps = k < ring.active;
                    drop(ring);
                    if helps {
                        job.helpers.help_until_done(job);
                    }
                    return;
                }
                if k < ring.active && ring.next_claim < ring.next_deliver + ring.ahead {
                    break;
                }
                ring = shared.room.wait(ring).unwrap_or_else(|e| e.into_inner());
            }
            ring.next_claim += 1;
            // The gauges change under the ring's lock, so they never count a batch twice.
            job.stats.claimed();
            job.helpers.claimed();
            ring.next_claim - 1
        };
        let result = build_guarded(job, b);
        let mut ring = shared.lock();
        ring.slots[(b % cap) as usize] = Some(result);
        job.stats.filed();
        drop(ring);
        shared.ready.notify_one();
        job.helpers.filed();
    }
}

/// Starts a named background thread for a process-wide service (the metrics endpoint) that
/// lives as long as the process. Fails if the OS refuses the thread.
pub(crate) fn spawn_service(
    name: &str,
    service: impl FnOnce() + Send + 'static,
) -> std::io::Result<()> {
    #[allow(clippy::disallowed_methods)] // this module is the one that spawns
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(service)
        .map(drop)
}

/// Runs `job(0)`, `job(1)`, ..., `job(jobs - 1)` on up to `threads` threads (on the calling
/// thread when `threads <= 1`), each thread claiming the next job number, and waits for all of
/// them. For tools that produce independent outputs in parallel, such as `chute convert`
/// writing one shard per job. After the first failure no further job is started; the error
/// returned is that of the lowest-numbered failed job. A panic in a job is re-raised here once
/// the other threads have stopped.
pub fn for_each_parallel<E: Send>(
    jobs: usize,
    threads: usize,
    job: impl Fn(usize) -> Result<(), E> + Sync,
) -> Result<(), E> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let errors: Mutex<Vec<(usize, E)>> = Mutex::new(Vec::new());
    let run = || {
        while !failed.load(Ordering::Relaxed) {
            let n = next.fetch_add(1, Ordering::Relaxed);
            if n >= jobs {
                break;
            }
            if let Err(e) = job(n) {
                failed.store(true, Ordering::Relaxed);
                errors
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push((n, e));
            }
        }
    };
    let threads = threads.clamp(1, jobs.max(1));
    if threads == 1 {
        run();
    } else {
        #[allow(clippy::disallowed_methods)] // this module is the one that spawns
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(run);
            }
        });
    }
    let errors = errors
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match errors.into_iter().min_by_key(|(n, _)| *n) {
        Some((_, e)) => Err(e),
        None => Ok(()),
    }
}
