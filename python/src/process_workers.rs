//! Process workers (`chute.Loader(..., worker_mode="process")`): a map-style dataset's
//! `__getitem__` (and a `collate_fn`) run in worker processes, each with its own interpreter
//! and GIL, so Python that holds the GIL uses every core.
//!
//! The Python side (`chute/_workers.py`) starts the processes (spawn or forkserver: never a
//! fork of this threaded process), gives each the dataset once, and hands this module each
//! one's end of a socket pair and its arena, a `memfd` the worker writes samples into.
//! [`ProcessDataset`] is the [`Source`] the engine reads: a worker thread's `read_many` takes
//! an idle process, sends it the ids (a few bytes), and the process answers with each
//! sample's fields laid out in its arena and a small description of them (no pickling of
//! samples); the thread copies them out of the arena, without the GIL, and gives the process
//! back. Order, ranks, resume and `on_error` stay the engine's: the ids come from its plan.
//!
//! [`serve_worker`] is the loop a worker process runs: it reads a sample with the same code
//! as thread mode ([`MapDataset`]), so the fields, their names and the errors are the same.
//! An arena is anonymous shared memory (`memfd_create`): nothing in `/dev/shm` (no size limit
//! of a container's `/dev/shm` applies), and nothing outlives the last process holding it.
//!
//! A worker that dies (a SIGKILL, the out-of-memory killer) is a `RuntimeError` naming the
//! worker, its pid, how it ended and the samples it held, for every read that follows; a
//! worker that takes longer than `timeout` seconds is one too.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::Bytes;
use chute::core::{Array, BufferPool, Column, Error, Field, Manifest, Opaque, Sample, SampleRng};
use chute::{DType, Source};
use memmap2::{Mmap, MmapMut};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::map_dataset::{MapDataset, failed, intern};
use crate::source::Source as PySource;

/// A request: read these samples.
const READ: u8 = 1;
/// A request: read these samples and collate them with the `collate_fn`.
const COLLATE: u8 = 2;

/// A sample's answer: its fields.
const OK: u8 = 0;
/// A sample's answer: `__getitem__` raised (the exception pickled, and its traceback).
const RAISED: u8 = 1;
/// A batch's answer: the `collate_fn`'s batch, pickled.
const BATCH: u8 = 2;
/// A batch's answer: reading or collating it raised (as [`RAISED`]).
const BATCH_RAISED: u8 = 3;

/// Field kinds in an answer.
const BYTES: u8 = 0;
const TEXT: u8 = 1;
const ARRAY: u8 = 2;

/// Most ids in one request, and most fields in one sample, an answer may declare.
const MAX_IDS: u32 = 1 << 20;
const MAX_FIELDS: u32 = 1 << 16;

/// One worker process, as the parent holds it.
struct Worker {
    /// Its number (0-based), as `worker_init_fn` got it.
    index: usize,
    pid: u32,
    stream: UnixStream,
    /// Its arena: the memfd, and the part of it mapped here.
    arena: File,
    map: Option<Mmap>,
}

/// Why the pool cannot serve: the first worker that died or timed out, described.
#[derive(Default)]
struct Pool {
    idle: Vec<Worker>,
    broken: Option<String>,
    /// Worker processes started so far (they are numbered in that order).
    started: usize,
    /// Those of them still starting (not yet handed over with [`WorkerSockets::add`]).
    pending: usize,
}

/// A map-style dataset read by worker processes (see the module documentation).
pub(crate) struct ProcessDataset {
    /// The dataset as thread mode reads it in this process: its manifest and structure.
    map: Arc<MapDataset>,
    pool: Mutex<Pool>,
    free: Condvar,
    /// The most worker processes: more than those given at the start are started on demand
    /// by `grow` (`num_workers="auto"`, whose tuner adds worker threads as the consumer needs).
    limit: usize,
    /// Starts worker process `index` when every one started is busy and fewer than `limit`
    /// are: returns its `(socket fd, memfd, index, pid)`.
    grow: Option<Py<PyAny>>,
    /// Seconds a worker may take over one request (0: no limit).
    timeout: Option<Duration>,
    /// Requests answered, for the figures.
    served: AtomicUsize,
    /// The seed and epoch of the engine's plan, which the workers' transforms draw their
    /// per-sample randomness from (as the engine's do).
    plan: Mutex<(u64, u64)>,
    /// Starts a worker process in place of one that died: `restart(index)` returns its
    /// `(socket fd, memfd, index, pid)` (given under `on_error="skip"`).
    restart: Option<Py<PyAny>>,
    /// Workers restarted.
    restarts: AtomicUsize,
    /// Reads made in this process while every worker process was still starting.
    local_reads: AtomicUsize,
    /// While no worker process has started yet, read in this process (as thread mode does)
    /// instead of waiting: the Python transforms the workers run, built here. `None` when
    /// reads must wait for the workers (a `worker_init_fn` they run has not run here).
    early: Option<Early>,
}

/// How this process reads while its worker processes start (see [`ProcessDataset::early`]).
struct Early {
    transform: Option<Arc<dyn chute::core::Transform>>,
}

impl std::fmt::Debug for ProcessDataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessDataset")
            .field("limit", &self.limit)
            .finish()
    }
}

impl ProcessDataset {
    /// Takes an idle worker, waiting for one; the pool's error once a worker has died.
    /// `None` while every worker is still starting and this process may read meanwhile.
    fn take(&self) -> Result<Option<Worker>, String> {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(why) = &pool.broken {
                return Err(why.clone());
            }
            if let Some(w) = pool.idle.pop() {
                return Ok(Some(w));
            }
            if pool.pending > 0 && pool.pending == pool.started && self.early.is_some() {
                return Ok(None);
            }
            if pool.started < self.limit && self.grow.is_some() {
                let index = pool.started;
                pool.started += 1;
                drop(pool);
                return self
                    .start(index)
                    .map(Some)
                    .inspect_err(|why| self.break_pool(why.clone()));
            }
            pool = self.free.wait(pool).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn give_back(&self, w: Worker) {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if pool.broken.is_none() {
            pool.idle.push(w);
        }
        drop(pool);
        self.free.notify_one();
    }

    /// Closes every worker's socket (each process then ends at its next read); reads after
    /// this fail.
    fn shut_down(&self) {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        pool.broken
            .get_or_insert_with(|| "the loader's worker processes were closed".to_string());
        pool.idle.clear();
        drop(pool);
        self.free.notify_all();
    }

    /// Marks the pool broken by `why` (the worker is dropped: its socket closes, and the
    /// process, if alive, ends at its next read).
    fn break_pool(&self, why: String) {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        pool.broken.get_or_insert(why);
        drop(pool);
        self.free.notify_all();
    }

    /// Sends `op` for `ids` to an idle worker and reads its answer; the worker goes back to
    /// the pool once the answer is read.
    /// `None` when the read is this process's to make (see [`ProcessDataset::early`]).
    fn request(&self, op: u8, ids: &[u64]) -> Result<Option<Answer>, String> {
        let Some(mut w) = self.take()? else {
            self.local_reads.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        };
        let plan = *self.plan.lock().unwrap_or_else(|e| e.into_inner());
        match w.ask(op, plan, ids, self.timeout) {
            Ok(answer) => {
                self.served.fetch_add(1, Ordering::Relaxed);
                self.give_back(w);
                Ok(Some(answer))
            }
            Err(e) => {
                let why = w.failure(&e, ids, self.timeout);
                let timed_out = matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                );
                if !timed_out && let Some(new) = self.restart(w.index) {
                    self.restarts.fetch_add(1, Ordering::Relaxed);
                    self.give_back(new);
                    return Err(format!("{why} (a new worker process took its place)"));
                }
                self.break_pool(why.clone());
                Err(why)
            }
        }
    }

    /// The samples `ids` read in this process while the workers start: as thread mode reads
    /// them, then through the Python transforms the workers would run, with the same RNG.
    fn read_here(&self, ids: &[u64]) -> Vec<Result<Sample, Error>> {
        let reads = self.map.read_many(ids);
        let Some(t) = self.early.as_ref().and_then(|e| e.transform.as_ref()) else {
            return reads;
        };
        let (seed, epoch) = *self.plan.lock().unwrap_or_else(|e| e.into_inner());
        reads
            .into_iter()
            .map(|r| {
                let mut s = r?;
                let mut rng = SampleRng::for_sample(seed, epoch, s.index);
                t.apply(&mut s, &mut rng).map_err(|e| failed(s.index, e))?;
                Ok(s)
            })
            .collect()
    }

    /// Worker process `index`, started by the `grow` callback.
    fn start(&self, index: usize) -> Result<Worker, String> {
        let grow = self
            .grow
            .as_ref()
            .ok_or("no worker processes can be added")?;
        if crate::transform::SHUTTING_DOWN.load(Ordering::Relaxed) {
            return Err("the interpreter is shutting down".into());
        }
        let (sock, memfd, index, pid) = Python::attach(|py| {
            grow.call1(py, (index,))
                .and_then(|r| r.extract::<(RawFd, RawFd, usize, u32)>(py))
        })
        .map_err(|e| format!("chute could not start worker process {index}: {e}"))?;
        // SAFETY: the callback hands these fds over, as `process_dataset`'s caller does.
        Ok(unsafe { Worker::adopt(sock, memfd, index, pid) })
    }

    /// A new worker process in place of worker `index`, from the `restart` callback
    /// (given under `on_error="skip"`); `None` without one or when it fails.
    fn restart(&self, index: usize) -> Option<Worker> {
        let restart = self.restart.as_ref()?;
        if crate::transform::SHUTTING_DOWN.load(Ordering::Relaxed) {
            return None;
        }
        let (sock, memfd, index, pid) = Python::attach(|py| {
            restart
                .call1(py, (index,))
                .and_then(|r| r.extract::<(RawFd, RawFd, usize, u32)>(py))
        })
        .ok()?;
        // SAFETY: the callback hands these fds over, as `process_dataset`'s caller does.
        Some(unsafe { Worker::adopt(sock, memfd, index, pid) })
    }
}

/// A worker's answer to one request.
enum Answer {
    Samples(Vec<Reply>),
    Batch(Vec<u8>),
    /// A batch that raised (its first failure).
    Raised {
        pickled: Vec<u8>,
        traceback: String,
    },
}

/// One sample's answer.
enum Reply {
    Fields(Vec<(String, Field)>),
    Raised { pickled: Vec<u8>, traceback: String },
}

impl Worker {
    /// A worker from its socket and arena fds, taken over.
    ///
    /// # Safety
    /// The fds must be open and owned by no one else.
    unsafe fn adopt(sock: RawFd, memfd: RawFd, index: usize, pid: u32) -> Worker {
        // SAFETY: as the caller promises.
        let (sock, memfd) = unsafe { (OwnedFd::from_raw_fd(sock), OwnedFd::from_raw_fd(memfd)) };
        Worker {
            index,
            pid,
            stream: UnixStream::from(sock),
            arena: File::from(memfd),
            map: None,
        }
    }

    fn ask(
        &mut self,
        op: u8,
        (seed, epoch): (u64, u64),
        ids: &[u64],
        timeout: Option<Duration>,
    ) -> io::Result<Answer> {
        let mut req = Vec::with_capacity(21 + 8 * ids.len());
        req.push(op);
        req.extend(seed.to_le_bytes());
        req.extend(epoch.to_le_bytes());
        req.extend((ids.len() as u32).to_le_bytes());
        for id in ids {
            req.extend(id.to_le_bytes());
        }
        self.stream.set_read_timeout(timeout)?;
        self.stream.write_all(&req)?;
        let mut r = Reader(&mut self.stream);
        let arena_len = r.u64()?;
        let kind = r.u8()?;
        if kind == BATCH {
            let n = r.u64()?;
            return Ok(Answer::Batch(r.bytes(n)?));
        }
        if kind == BATCH_RAISED {
            let n = r.u64()?;
            let pickled = r.bytes(n)?;
            let n = r.u64()?;
            let traceback = String::from_utf8_lossy(&r.bytes(n)?).into_owned();
            return Ok(Answer::Raised { pickled, traceback });
        }
        let n = r.u32()?;
        if n as usize != ids.len() {
            return Err(bad(format!("{n} answers to {} ids", ids.len())));
        }
        let mut replies = Vec::with_capacity(ids.len());
        let mut layouts = Vec::with_capacity(ids.len());
        for _ in 0..n {
            match r.u8()? {
                OK => {
                    let k = r.u32()?;
                    if k > MAX_FIELDS {
                        return Err(bad(format!("{k} fields")));
                    }
                    let mut fields = Vec::with_capacity(k as usize);
                    for _ in 0..k {
                        let len = r.u16()?;
                        let name = String::from_utf8(r.bytes(u64::from(len))?)
                            .map_err(|_| bad("a field name that is not UTF-8".into()))?;
                        let kind = r.u8()?;
                        let shape = match kind {
                            ARRAY => {
                                let dtype = dtype_at(r.u8()?)?;
                                let cast = match r.u8()? {
                                    u8::MAX => None,
                                    c => Some(dtype_at(c)?),
                                };
                                let ndim = r.u8()?;
                                let mut shape = Vec::with_capacity(usize::from(ndim));
                                for _ in 0..ndim {
                                    shape.push(r.u64()? as usize);
                                }
                                Some((dtype, cast, shape))
                            }
                            BYTES | TEXT => None,
                            other => return Err(bad(format!("field kind {other}"))),
                        };
                        let (off, len) = (r.u64()?, r.u64()?);
                        fields.push((name, kind, shape, off, len));
                    }
                    layouts.push(Some(fields));
                    replies.push(None);
                }
                RAISED => {
                    let n = r.u64()?;
                    let pickled = r.bytes(n)?;
                    let n = r.u64()?;
                    let traceback = String::from_utf8_lossy(&r.bytes(n)?).into_owned();
                    layouts.push(None);
                    replies.push(Some(Reply::Raised { pickled, traceback }));
                }
                other => return Err(bad(format!("answer kind {other}"))),
            }
        }
        // The fields' bytes, copied out of the arena (the worker writes its next answer
        // over them).
        if self.map.as_ref().map_or(0, |m| m.len() as u64) < arena_len && arena_len > 0 {
            // SAFETY: the worker only writes the arena while it works on a request; it has
            // answered this one and waits for the next, which this thread sends only after
            // its bytes are copied out. The memfd may grow, never shrink.
            self.map = Some(unsafe {
                memmap2::MmapOptions::new()
                    .len(arena_len as usize)
                    .map(&self.arena)?
            });
        }
        let arena: &[u8] = self.map.as_deref().unwrap_or(&[]);
        let mut out = Vec::with_capacity(replies.len());
        for (layout, reply) in layouts.into_iter().zip(replies) {
            let Some(fields) = layout else {
                out.push(reply.expect("a raised sample's reply"));
                continue;
            };
            let mut done = Vec::with_capacity(fields.len());
            for (name, kind, shape, off, len) in fields {
                let end = off.checked_add(len).filter(|&e| e <= arena.len() as u64);
                let Some(end) = end else {
                    return Err(bad(format!(
                        "field {name:?} at {off}+{len}, past the arena's {} bytes",
                        arena.len()
                    )));
                };
                let data = Bytes::copy_from_slice(&arena[off as usize..end as usize]);
                let field = match (kind, shape) {
                    (ARRAY, Some((dtype, cast, shape))) => {
                        let want = shape
                            .iter()
                            .try_fold(dtype.size(), |n, &d| n.checked_mul(d))
                            .filter(|&n| n == data.len());
                        if want.is_none() {
                            return Err(bad(format!(
                                "array {name:?} of shape {shape:?} in {} bytes",
                                data.len()
                            )));
                        }
                        let mut a = Array::new(dtype, shape, data);
                        a.cast = cast;
                        Field::Array(a)
                    }
                    (TEXT, _) => Field::Text(data),
                    _ => Field::Bytes(data),
                };
                done.push((name, field));
            }
            out.push(Reply::Fields(done));
        }
        Ok(Answer::Samples(out))
    }

    /// What went wrong with this worker, for the error every later read gets too.
    fn failure(&self, e: &io::Error, ids: &[u64], timeout: Option<Duration>) -> String {
        let what = match ids {
            [one] => format!("sample {one}"),
            [first, .., last] => format!("samples {first} to {last} ({} samples)", ids.len()),
            [] => "no sample".to_string(),
        };
        let timed_out = matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        );
        let how = match (timed_out, timeout) {
            (true, Some(t)) => format!(
                "took more than timeout={}s over {what}; it is left running and the loader \
                 stops (raise timeout=, or find what blocks in __getitem__)",
                t.as_secs_f64()
            ),
            _ => format!(
                "{} while reading {what}",
                ended_soon(self.pid).unwrap_or_else(|| format!("stopped answering ({e})"))
            ),
        };
        format!(
            "chute worker process {} (pid {}) {how}. Worker processes end this way when the \
             system runs out of memory (see dmesg for the out-of-memory killer) or something \
             kills them; with worker_mode=\"thread\" the samples are read in this process",
            self.index, self.pid
        )
    }
}

/// How process `pid` ended, waiting up to a second for it to finish dying: its socket
/// closes a moment before the kernel has made it a zombie.
fn ended_soon(pid: u32) -> Option<String> {
    for _ in 0..100 {
        if let Some(how) = ended(pid) {
            return Some(how);
        }
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return None; // reaped already: how it ended is no longer known
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// How process `pid` ended, from `/proc` (without reaping it: multiprocessing does that).
fn ended(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces), in parentheses.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    if fields.first() != Some(&"Z") {
        return None;
    }
    // Field 52, the exit code as waitpid reports it: fields[0] is field 3.
    let code: i32 = fields.get(49)?.parse().ok()?;
    let signal = code & 0x7f;
    Some(if signal != 0 {
        let name = match signal {
            9 => " (SIGKILL)",
            11 => " (SIGSEGV)",
            6 => " (SIGABRT)",
            15 => " (SIGTERM)",
            _ => "",
        };
        format!("was killed by signal {signal}{name}")
    } else {
        format!("exited with status {}", (code >> 8) & 0xff)
    })
}

fn bad(what: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("a malformed answer: {what}"),
    )
}

fn dtype_at(code: u8) -> io::Result<DType> {
    DType::ALL
        .get(usize::from(code))
        .copied()
        .ok_or_else(|| bad(format!("dtype {code}")))
}

fn dtype_code(d: DType) -> u8 {
    DType::ALL.iter().position(|&x| x == d).unwrap_or(0) as u8
}

/// Little-endian reads from a stream.
struct Reader<'a, R: Read>(&'a mut R);

impl<R: Read> Reader<'_, R> {
    fn array<const N: usize>(&mut self) -> io::Result<[u8; N]> {
        let mut b = [0u8; N];
        self.0.read_exact(&mut b)?;
        Ok(b)
    }
    fn u8(&mut self) -> io::Result<u8> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> io::Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> io::Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> io::Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// `n` bytes, read as they come (never allocated ahead of them on a length's word).
    fn bytes(&mut self, n: u64) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        (&mut *self.0).take(n).read_to_end(&mut out)?;
        if out.len() as u64 != n {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        Ok(out)
    }
}

impl Source for ProcessDataset {
    fn manifest(&self) -> &Manifest {
        self.map.manifest()
    }

    fn read(&self, id: u64) -> Result<Sample, Error> {
        self.read_many(&[id]).pop().expect("one result per id")
    }

    /// The samples `ids`, read by one worker process.
    fn read_many(&self, ids: &[u64]) -> Vec<Result<Sample, Error>> {
        let replies = match self.request(READ, ids) {
            Ok(None) => return self.read_here(ids),
            Ok(Some(Answer::Samples(r))) => r,
            Ok(Some(Answer::Batch(_) | Answer::Raised { .. })) => {
                let why = "a worker answered a read with a batch".to_string();
                return ids.iter().map(|&id| Err(dead(id, &why))).collect();
            }
            Err(why) => return ids.iter().map(|&id| Err(dead(id, &why))).collect(),
        };
        ids.iter()
            .zip(replies)
            .map(|(&id, reply)| match reply {
                Reply::Fields(fields) => {
                    let mut s = Sample::new(id);
                    s.fields = fields.into_iter().map(|(n, f)| (intern(&n), f)).collect();
                    Ok(s)
                }
                Reply::Raised { pickled, traceback } => Err(raised(id, &pickled, &traceback)),
            })
            .collect()
    }

    /// With a `collate_fn`: the batch the worker process made of `ids`.
    fn collate(
        &self,
        ids: &[u64],
        pool: &BufferPool,
    ) -> Option<Result<Vec<(String, Column)>, Error>> {
        self.map.collate_fn()?;
        let first = ids.first().copied().unwrap_or(0);
        Some(match self.request(COLLATE, ids) {
            Ok(None) => return self.map.collate(ids, pool),
            Ok(Some(Answer::Batch(pickled))) => Python::attach(|py| {
                let batch = py
                    .import("pickle")?
                    .call_method1("loads", (PyBytes::new(py, &pickled),))?
                    .unbind();
                Ok::<_, PyErr>(vec![(
                    crate::map_dataset::COLLATED.to_string(),
                    Column::Object(Opaque(Arc::new(batch))),
                )])
            })
            .map_err(|e| failed(first, Box::new(e))),
            Ok(Some(Answer::Raised { pickled, traceback })) => {
                Err(raised(first, &pickled, &traceback))
            }
            Ok(Some(Answer::Samples(_))) => {
                Err(dead(first, "a worker answered a batch with samples"))
            }
            Err(why) => Err(dead(first, &why)),
        })
    }

    fn set_plan(&self, plan: &chute::core::Plan) {
        let c = plan.config();
        *self.plan.lock().unwrap_or_else(|e| e.into_inner()) = (c.seed, c.epoch);
    }

    fn stats(&self) -> Option<serde_json::Value> {
        let (started, pending) = {
            let pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            (pool.started, pool.pending)
        };
        Some(serde_json::json!({
            "worker_mode": "process",
            "worker_processes": started,
            "ready_processes": started - pending,
            "max_worker_processes": self.limit,
            "requests": self.served.load(Ordering::Relaxed),
            "restarts": self.restarts.load(Ordering::Relaxed),
            "local_reads": self.local_reads.load(Ordering::Relaxed),
        }))
    }
}

/// The error of a read the pool could not serve: a `RuntimeError` naming the worker.
fn dead(id: u64, why: &str) -> Error {
    failed(id, Box::new(PyRuntimeError::new_err(why.to_string())))
}

/// Sample `id`'s exception, raised in a worker process, as itself (unpickled), its traceback
/// from the worker added as a note; a `RuntimeError` with the traceback when it does not
/// unpickle.
fn raised(id: u64, pickled: &[u8], traceback: &str) -> Error {
    let err = Python::attach(|py| {
        let note = format!("raised in a chute worker process:\n{traceback}");
        let e = py
            .import("pickle")
            .and_then(|p| p.call_method1("loads", (PyBytes::new(py, pickled),)));
        match e {
            Ok(exc) if exc.is_instance_of::<pyo3::exceptions::PyBaseException>() => {
                let _ = exc.call_method1("add_note", (note,));
                PyErr::from_value(exc)
            }
            _ => PyRuntimeError::new_err(note),
        }
    });
    failed(id, Box::new(err))
}

/// The worker processes of a [`ProcessDataset`], for Python to close them.
#[pyclass(module = "chute._chute", frozen)]
pub(crate) struct WorkerSockets {
    inner: Arc<ProcessDataset>,
}

#[pymethods]
impl WorkerSockets {
    /// Closes every worker's socket: each process ends at its next read.
    fn close(&self) {
        self.inner.shut_down();
    }

    /// A worker process that started: its `(socket fd, arena memfd, index, pid)`, taken over.
    fn add(&self, worker: (RawFd, RawFd, usize, u32)) {
        let (sock, memfd, index, pid) = worker;
        // SAFETY: the caller hands these fds over (detached from their Python objects).
        let w = unsafe { Worker::adopt(sock, memfd, index, pid) };
        let mut pool = self.inner.pool.lock().unwrap_or_else(|e| e.into_inner());
        pool.pending = pool.pending.saturating_sub(1);
        if pool.broken.is_none() {
            pool.idle.push(w);
        }
        drop(pool);
        self.inner.free.notify_all();
    }

    /// A worker process that failed to start: every read from now on fails with `why`.
    fn fail(&self, why: String) {
        let mut pool = self.inner.pool.lock().unwrap_or_else(|e| e.into_inner());
        pool.pending = pool.pending.saturating_sub(1);
        drop(pool);
        self.inner.break_pool(why);
    }
}

/// `chute._chute.process_dataset(source, starting, timeout=0, restart=None, grow=None,
/// limit=0, early=False, transforms=None)`: `source` (a map-style dataset's source, from
/// `map_dataset`) read by worker processes, `starting` of which are being started: each is
/// handed over with [`WorkerSockets::add`] once it is ready (or its failure with
/// [`WorkerSockets::fail`]). With `early`, reads made while none is ready yet are made in this
/// process, through `transforms` (the Python callables the workers run), instead of waiting.
/// `restart(index)`, when given, starts a process in place of one that died and returns its
/// `(socket fd, arena memfd, index, pid)` (the reads it held fail, and the loader skips
/// them). `grow(index)`, when given, starts process `index` (the next number) when every
/// process started is busy and fewer than `limit` are. Returns the new source and the handle
/// that hands workers over and closes their sockets.
#[pyfunction]
#[pyo3(signature = (source, starting, timeout=0.0, restart=None, grow=None, limit=0,
                    early=false, transforms=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn process_dataset(
    source: &Bound<'_, PySource>,
    starting: usize,
    timeout: f64,
    restart: Option<Py<PyAny>>,
    grow: Option<Py<PyAny>>,
    limit: usize,
    early: bool,
    transforms: Option<Vec<Bound<'_, PyAny>>>,
) -> PyResult<(PySource, WorkerSockets)> {
    let Some(map) = source.get().dataset.clone() else {
        return Err(PyValueError::new_err(
            "worker_mode=\"process\" reads map-style datasets (with __len__ and __getitem__)",
        ));
    };
    if starting == 0 {
        return Err(PyValueError::new_err("no worker processes"));
    }
    let early = if early {
        let interrupt = Arc::clone(&map.interrupt);
        Some(Early {
            transform: crate::transform::build(transforms.unwrap_or_default(), &interrupt)?,
        })
    } else {
        None
    };
    let inner = Arc::new(ProcessDataset {
        map: Arc::clone(&map),
        pool: Mutex::new(Pool {
            idle: Vec::new(),
            broken: None,
            started: starting,
            pending: starting,
        }),
        free: Condvar::new(),
        limit: limit.max(starting),
        grow,
        timeout: (timeout > 0.0).then(|| Duration::from_secs_f64(timeout)),
        served: AtomicUsize::new(0),
        plan: Mutex::new((0, 0)),
        restart,
        restarts: AtomicUsize::new(0),
        local_reads: AtomicUsize::new(0),
        early,
    });
    let handle = WorkerSockets {
        inner: Arc::clone(&inner),
    };
    Ok((PySource::read_through(map, inner), handle))
}

/// A worker process's arena as it writes it: the memfd, grown as answers need.
struct Arena {
    file: File,
    map: Option<MmapMut>,
    used: usize,
}

impl Arena {
    /// Room for `n` more bytes at the end of what this answer used; their offset.
    fn put(&mut self, data: &[u8]) -> io::Result<u64> {
        let at = self.used;
        let end = at + data.len();
        let cap = self.map.as_ref().map_or(0, |m| m.len());
        if end > cap {
            let grown = end.max(cap * 2).max(1 << 20).next_multiple_of(1 << 20);
            self.file.set_len(grown as u64)?;
            // SAFETY: only this process writes the arena, and the parent reads it only while
            // this process waits for its next request.
            self.map = Some(unsafe { MmapMut::map_mut(&self.file)? });
        }
        if let Some(m) = self.map.as_mut() {
            m[at..end].copy_from_slice(data);
        }
        self.used = end;
        Ok(at as u64)
    }

    fn len(&self) -> u64 {
        self.map.as_ref().map_or(0, |m| m.len() as u64)
    }
}

/// `chute._chute.serve_worker(sock, memfd, dataset, collate_fn=None, transforms=None)`: a
/// worker process's loop (see the module documentation): reads requests from the socket
/// `sock` until the parent closes it, reading samples of `dataset` into the arena `memfd`,
/// each run through `transforms` (Python callables as `chute.Loader` takes them, with the
/// per-sample RNG the engine would give them). Returns when the parent is gone.
#[pyfunction]
#[pyo3(signature = (sock, memfd, dataset, collate_fn=None, transforms=None))]
pub(crate) fn serve_worker(
    py: Python<'_>,
    sock: RawFd,
    memfd: RawFd,
    dataset: &Bound<'_, PyAny>,
    collate_fn: Option<Py<PyAny>>,
    transforms: Option<Vec<Bound<'_, PyAny>>>,
) -> PyResult<()> {
    let map = MapDataset::new(dataset, None, collate_fn.as_ref().map(|f| f.clone_ref(py)))?;
    let interrupt = Arc::new(crate::transform::Interrupt::default());
    let transform = crate::transform::build(transforms.unwrap_or_default(), &interrupt)?;
    // SAFETY: `sock` and `memfd` are this process's, handed over for the loop's life.
    let (mut stream, file) = unsafe {
        (
            UnixStream::from(OwnedFd::from_raw_fd(libc::dup(sock))),
            File::from(OwnedFd::from_raw_fd(libc::dup(memfd))),
        )
    };
    let mut arena = Arena {
        file,
        map: None,
        used: 0,
    };
    let pickle = py.import("pickle")?;
    let format_exception = py.import("traceback")?.getattr("format_exception")?;
    loop {
        let mut r = Reader(&mut stream);
        let (op, seed, epoch, n) = match (r.u8(), r.u64(), r.u64(), r.u32()) {
            (Ok(op), Ok(seed), Ok(epoch), Ok(n)) if n <= MAX_IDS => (op, seed, epoch, n),
            _ => return Ok(()), // the parent closed the socket, or is not chute's
        };
        let mut ids = Vec::with_capacity(n as usize);
        for _ in 0..n {
            match r.u64() {
                Ok(id) => ids.push(id),
                Err(_) => return Ok(()),
            }
        }
        arena.used = 0;
        let mut body = Vec::new();
        let exception = |e: PyErr, body: &mut Vec<u8>, tag: u8| -> PyResult<()> {
            let value = e.value(py);
            let pickled = pickle
                .call_method1("dumps", (value,))
                .and_then(|b| Ok(b.cast::<PyBytes>()?.as_bytes().to_vec()))
                .unwrap_or_default();
            let tb = format_exception
                .call1((e.get_type(py), value, e.traceback(py)))
                .and_then(|l| {
                    Ok(l.cast::<PyList>()?
                        .iter()
                        .map(|s| s.to_string())
                        .collect::<String>())
                })
                .unwrap_or_else(|_| value.to_string());
            if tag == RAISED {
                body.push(RAISED);
            }
            body.extend((pickled.len() as u64).to_le_bytes());
            body.extend(&pickled);
            body.extend((tb.len() as u64).to_le_bytes());
            body.extend(tb.as_bytes());
            Ok(())
        };
        let kind = if let (COLLATE, Some(collate)) = (op, &collate_fn) {
            let samples = PyList::empty(py);
            let mut failed = None;
            for &id in &ids {
                match dataset.get_item(id) {
                    Ok(item) => samples.append(item)?,
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            let batch = match failed {
                None => collate
                    .call1(py, (samples,))
                    .and_then(|b| pickle.call_method1("dumps", (b,)).map(|p| p.unbind())),
                Some(e) => Err(e),
            };
            match batch {
                Ok(p) => {
                    let b = p.bind(py).cast::<PyBytes>()?.as_bytes();
                    body.extend((b.len() as u64).to_le_bytes());
                    body.extend(b);
                    BATCH
                }
                Err(e) => {
                    exception(e, &mut body, BATCH_RAISED)?;
                    BATCH_RAISED
                }
            }
        } else {
            body.extend((ids.len() as u32).to_le_bytes());
            for &id in &ids {
                let read = map.sample(py, id).and_then(|mut s| {
                    if let Some(t) = &transform {
                        let mut rng = SampleRng::for_sample(seed, epoch, id);
                        t.apply(&mut s, &mut rng)
                            .map_err(|e| match e.downcast::<PyErr>() {
                                Ok(e) => *e,
                                Err(e) => PyRuntimeError::new_err(e.to_string()),
                            })?;
                    }
                    Ok(s)
                });
                match read {
                    Ok(s) => encode(&s, &mut body, &mut arena)
                        .map_err(|e| PyRuntimeError::new_err(format!("arena: {e}")))?,
                    Err(e) => exception(e, &mut body, RAISED)?,
                }
            }
            OK
        };
        let mut head = Vec::with_capacity(9);
        head.extend(arena.len().to_le_bytes());
        head.push(kind);
        let sent = py.detach(|| {
            stream
                .write_all(&head)
                .and_then(|()| stream.write_all(&body))
        });
        if sent.is_err() {
            return Ok(()); // the parent is gone
        }
        py.check_signals()?;
    }
}

/// Sample `s`'s fields into an answer: each field's bytes into the arena, its description
/// into `body`.
fn encode(s: &Sample, body: &mut Vec<u8>, arena: &mut Arena) -> io::Result<()> {
    body.push(OK);
    body.extend((s.fields.len() as u32).to_le_bytes());
    for (name, field) in &s.fields {
        let name: &str = name;
        body.extend((name.len() as u16).to_le_bytes());
        body.extend(name.as_bytes());
        let data = match field {
            Field::Bytes(b) => {
                body.push(BYTES);
                b
            }
            Field::Text(b) => {
                body.push(TEXT);
                b
            }
            Field::Array(a) => {
                body.push(ARRAY);
                body.push(dtype_code(a.dtype));
                body.push(a.cast.map_or(u8::MAX, dtype_code));
                body.push(a.shape.len() as u8);
                for &d in &a.shape {
                    body.extend((d as u64).to_le_bytes());
                }
                &a.data
            }
            other => {
                return Err(io::Error::other(format!(
                    "field {name:?} holds {}, which worker processes do not carry",
                    other.describe()
                )));
            }
        };
        let at = arena.put(data)?;
        body.extend(at.to_le_bytes());
        body.extend((data.len() as u64).to_le_bytes());
    }
    Ok(())
}
