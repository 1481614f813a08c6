//! Remote objects through `object_store`: the process's one I/O runtime, a store per bucket
//! or host, and fetches with chute's own retries and resumption.
//!
//! # Retries: why chute owns them
//!
//! `object_store` retries 5xx/429 responses and connection errors itself, and resumes a body
//! broken mid-stream with a range request, but only when the response had an ETag, under one
//! shared budget, and without telling the caller how many retries it made. chute turns its
//! retries off (`max_retries = 0`) and runs one loop for every request instead:
//!
//! - retried: transport errors (connection refused or reset, a body cut short), responses
//!   500-599, 429 and 408, and chute's own timeouts (no response headers, or no body bytes,
//!   within [`RemoteOptions::timeout`]);
//! - not retried: 404 (a missing object), 401/403 (credentials), 412 (the object changed
//!   while being read), other 4xx, bad configuration;
//! - backoff: exponential from [`RemoteOptions::backoff_base`] to
//!   [`RemoteOptions::backoff_max`], each sleep drawn from half to all of it (jitter), under
//!   [`RemoteOptions::max_attempts`] and [`RemoteOptions::retry_budget`];
//! - a body that breaks is resumed with a range request from the first byte not received,
//!   with `If-Match` on the first response's ETag, so the bytes kept and the bytes fetched
//!   are one version of the object: no byte is duplicated or lost, whatever the format;
//! - a fetch that still fails is an [`Error::Io`] naming the URL, the attempts, the time and
//!   the last cause.
//!
//! # The runtime
//!
//! One multi-threaded tokio runtime per process ([`RemoteOptions::io_threads`] threads,
//! created on first use, created again in a forked child): it only moves bytes. Callers on
//! worker threads block on a channel until their fetch completes; decoding never runs here.
//! `clippy.toml` keeps thread creation in `chute-pipeline`; the runtime's own threads are the
//! one exception, and this module is the only place that builds a runtime.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::ops::Range;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use chute_core::Error;
use futures_util::{Stream, StreamExt};
use object_store::client::{ClientConfigKey, HttpError};
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt, RetryConfig};

use crate::options::{RemoteOptions, remote_options};
use chute_core::iostats::{Counter, IoStats};

/// The runtime and the stores of this process (re-created after a fork: a child inherits
/// neither the runtime's threads nor the connections' sockets in a usable state).
struct Io {
    pid: u32,
    runtime: Arc<tokio::runtime::Runtime>,
    stores: HashMap<String, Arc<dyn ObjectStore>>,
}

static IO: Mutex<Option<Io>> = Mutex::new(None);

/// Most threads of the I/O runtime's blocking pool (DNS lookups); idle ones exit after 10 s.
const BLOCKING_THREADS: usize = 4;

fn with_io<T>(f: impl FnOnce(&mut Io) -> Result<T, Error>) -> Result<T, Error> {
    let mut guard = IO.lock().unwrap_or_else(|p| p.into_inner());
    let pid = std::process::id();
    if guard.as_ref().is_none_or(|io| io.pid != pid) {
        let threads = remote_options().map(|o| o.io_threads).unwrap_or(2).max(1);
        // The process's one async runtime (see the module docs): its threads only wait on
        // sockets.
        #[allow(clippy::disallowed_methods)]
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            // The blocking pool runs DNS lookups; bounded, so a burst of fetches cannot
            // grow the process by hundreds of threads (tokio's default is 512).
            .max_blocking_threads(BLOCKING_THREADS)
            .thread_name("chute-io")
            .enable_all()
            .build()
            .map_err(|e| Error::io("chute I/O runtime", e))?;
        if let Some(old) = guard.take() {
            // The parent's runtime: its threads do not exist in this process, so dropping it
            // (which joins them) could hang. Leak it.
            std::mem::forget(old);
        }
        *guard = Some(Io {
            pid,
            runtime: Arc::new(runtime),
            stores: HashMap::new(),
        });
    }
    f(guard.as_mut().expect("set above"))
}

/// Runs `fut` on the I/O runtime and blocks the calling thread until it completes. Works from
/// any thread, inside another tokio runtime too (it waits on a channel, not `block_on`).
pub(crate) fn block_on<F>(fut: F) -> Result<F::Output, Error>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = mpsc::sync_channel(1);
    spawn(async move {
        let _ = tx.send(fut.await);
    })?;
    rx.recv().map_err(|_| {
        Error::io(
            "chute I/O runtime",
            io::Error::other("the I/O task ended without an answer (did it panic?)"),
        )
    })
}

/// Starts `fut` on the I/O runtime.
pub(crate) fn spawn<F>(fut: F) -> Result<(), Error>
where
    F: Future<Output = ()> + Send + 'static,
{
    let rt = with_io(|io| Ok(Arc::clone(&io.runtime)))?;
    rt.spawn(fut);
    Ok(())
}

/// One object: its store, its key in the store and the URL it was named by.
#[derive(Clone)]
pub(crate) struct Object {
    pub(crate) url: String,
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
}

impl std::fmt::Debug for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.url)
    }
}

/// The store and key of `url` (`scheme://authority/key`). Stores are made once per
/// scheme and authority, with credentials and endpoints from the environment (the
/// `object_store` builders' `from_env`: `AWS_*`, `GOOGLE_*`, `AZURE_*`), retries off
/// (chute's own run instead) and a long overall timeout (chute's per-read timeout catches
/// stalls; a large shard must not be cut off for being large).
pub(crate) fn object(url: &str) -> Result<Object, Error> {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let scheme = scheme.to_ascii_lowercase();
    let (authority, key) = rest.split_once('/').unwrap_or((rest, ""));
    let base = format!("{scheme}://{authority}");
    let bad = |why: String| Error::io(url, io::Error::new(io::ErrorKind::InvalidInput, why));
    if scheme.starts_with("http") && key.contains('?') {
        // The HTTP client takes the key as a path and would encode the query into it,
        // asking for another object.
        return Err(bad(
            "URLs with a query string (presigned URLs) are not supported for \
                        http(s) shards; serve the shards without one, or read the bucket \
                        through s3://, gs:// or az:// with credentials in the environment"
                .into(),
        ));
    }
    let path =
        ObjectPath::from_url_path(key).map_err(|e| bad(format!("not a valid object key: {e}")))?;
    let store = with_io(|io| {
        if let Some(s) = io.stores.get(&base) {
            return Ok(Arc::clone(s));
        }
        let store = build_store(&scheme, &base).map_err(|e| {
            bad(format!(
                "cannot set up the {scheme} client: {e}; check the credentials and endpoint \
                 environment variables (AWS_*, GOOGLE_*, AZURE_*)"
            ))
        })?;
        io.stores.insert(base.clone(), Arc::clone(&store));
        Ok(store)
    })?;
    Ok(Object {
        url: url.to_owned(),
        store,
        path,
    })
}

fn build_store(scheme: &str, base: &str) -> Result<Arc<dyn ObjectStore>, object_store::Error> {
    let retry = RetryConfig {
        max_retries: 0,
        ..RetryConfig::default()
    };
    const TIMEOUT: &str = "24h";
    const CONNECT: &str = "10s";
    Ok(match scheme {
        "s3" | "s3a" => {
            use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey as K};
            Arc::new(
                AmazonS3Builder::from_env()
                    .with_url(base)
                    .with_retry(retry)
                    .with_config(K::Client(ClientConfigKey::Timeout), TIMEOUT)
                    .with_config(K::Client(ClientConfigKey::ConnectTimeout), CONNECT)
                    .build()?,
            )
        }
        "gs" => {
            use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey as K};
            Arc::new(
                GoogleCloudStorageBuilder::from_env()
                    .with_url(base)
                    .with_retry(retry)
                    .with_config(K::Client(ClientConfigKey::Timeout), TIMEOUT)
                    .with_config(K::Client(ClientConfigKey::ConnectTimeout), CONNECT)
                    .build()?,
            )
        }
        "az" | "abfs" | "abfss" => {
            use object_store::azure::{AzureConfigKey as K, MicrosoftAzureBuilder};
            Arc::new(
                MicrosoftAzureBuilder::from_env()
                    .with_url(base)
                    .with_retry(retry)
                    .with_config(K::Client(ClientConfigKey::Timeout), TIMEOUT)
                    .with_config(K::Client(ClientConfigKey::ConnectTimeout), CONNECT)
                    .build()?,
            )
        }
        _ => Arc::new(
            object_store::http::HttpBuilder::new()
                .with_url(base)
                .with_retry(retry)
                .with_config(ClientConfigKey::AllowHttp, "true")
                .with_config(ClientConfigKey::Timeout, TIMEOUT)
                .with_config(ClientConfigKey::ConnectTimeout, CONNECT)
                .build()?,
        ),
    })
}

/// Size and version of an object.
#[derive(Debug, Clone)]
pub(crate) struct Meta {
    pub(crate) size: u64,
    pub(crate) etag: Option<String>,
}

/// Why one attempt failed.
#[derive(Debug)]
struct Failure {
    retry: bool,
    kind: io::ErrorKind,
    cause: String,
}

impl Failure {
    fn from_store(e: &object_store::Error) -> Failure {
        use object_store::Error as E;
        let (retry, kind) = match e {
            E::NotFound { .. } => (false, io::ErrorKind::NotFound),
            E::PermissionDenied { .. } | E::Unauthenticated { .. } => {
                (false, io::ErrorKind::PermissionDenied)
            }
            E::Precondition { .. } => (false, io::ErrorKind::InvalidData),
            E::Generic { .. } => classify_generic(e),
            _ => (false, io::ErrorKind::Other),
        };
        Failure {
            retry,
            kind,
            cause: error_chain(e),
        }
    }

    fn timeout(what: &str, after: Duration) -> Failure {
        Failure {
            retry: true,
            kind: io::ErrorKind::TimedOut,
            cause: format!("no {what} within {after:?} (CHUTE_TIMEOUT)"),
        }
    }
}

/// A generic store error: a transport error (an [`HttpError`] in its chain) is retried, and
/// so is an HTTP status of 5xx, 429 or 408 (`object_store` keeps its status type private, so
/// the status is read from its message, `"... status code: 503 ..."`).
fn classify_generic(e: &object_store::Error) -> (bool, io::ErrorKind) {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<HttpError>() {
            use object_store::client::HttpErrorKind as K;
            let kind = match h.kind() {
                K::Timeout => io::ErrorKind::TimedOut,
                K::Connect => io::ErrorKind::ConnectionRefused,
                _ => io::ErrorKind::ConnectionReset,
            };
            return (true, kind);
        }
        cur = err.source();
    }
    match status_code(e) {
        // 501: the server does not implement the request (it will not start to).
        Some(501) => (false, io::ErrorKind::Unsupported),
        Some(500..=599 | 429 | 408) => (true, io::ErrorKind::Other),
        Some(400 | 416) => (false, io::ErrorKind::InvalidInput),
        _ => (false, io::ErrorKind::Other),
    }
}

/// The HTTP status of a store error, read from its message (`"... status code: 503 ..."`).
fn status_code(e: &object_store::Error) -> Option<u16> {
    let text = e.to_string();
    let at = text.find("status code: ")?;
    text[at + 13..]
        .chars()
        .take(3)
        .collect::<String>()
        .parse()
        .ok()
}

/// An error and its sources, one line.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let s_text = s.to_string();
        if !out.contains(&s_text) {
            out.push_str(": ");
            out.push_str(&s_text);
        }
        cur = s.source();
    }
    out
}

/// The retry loop's state for one fetch.
struct Retrier<'a> {
    url: &'a str,
    what: &'static str,
    opts: &'a RemoteOptions,
    stats: &'a IoStats,
    start: Instant,
    attempts: u32,
}

impl<'a> Retrier<'a> {
    fn new(url: &'a str, what: &'static str, opts: &'a RemoteOptions, stats: &'a IoStats) -> Self {
        Retrier {
            url,
            what,
            opts,
            stats,
            start: Instant::now(),
            attempts: 0,
        }
    }

    /// Counts an attempt about to be sent.
    fn attempt(&mut self) {
        self.attempts += 1;
        self.stats.add(Counter::Requests, 1);
        if self.attempts > 1 {
            self.stats.add(Counter::Retries, 1);
        }
    }

    /// After a failed attempt: sleeps and returns `Ok` to try again, or the final error.
    async fn failed(&mut self, f: Failure) -> Result<(), Error> {
        let sleep = self.backoff();
        let elapsed = self.start.elapsed();
        let why = if !f.retry {
            None
        } else if self.attempts >= self.opts.max_attempts {
            Some("attempts exhausted (CHUTE_RETRIES)")
        } else if elapsed + sleep > self.opts.retry_budget {
            Some("retry budget exhausted (CHUTE_RETRY_BUDGET)")
        } else {
            tokio::time::sleep(sleep).await;
            return Ok(());
        };
        self.stats.add(Counter::Failures, 1);
        let msg = match why {
            None => format!("{} failed: {}", self.what, f.cause),
            Some(why) => format!(
                "{} failed after {} attempts over {:.1} s, {why}; last cause: {}",
                self.what,
                self.attempts,
                elapsed.as_secs_f64(),
                f.cause
            ),
        };
        Err(Error::io(self.url, io::Error::new(f.kind, msg)))
    }

    fn backoff(&self) -> Duration {
        let exp = self.attempts.saturating_sub(1).min(20);
        let full = self
            .opts
            .backoff_base
            .saturating_mul(1 << exp)
            .min(self.opts.backoff_max);
        full.mul_f64(0.5 + 0.5 * fastrand::f64())
    }
}

/// The size and ETag of `obj` (a HEAD request), with retries.
pub(crate) async fn head(
    obj: &Object,
    opts: &RemoteOptions,
    stats: &IoStats,
) -> Result<Meta, Error> {
    let mut r = Retrier::new(&obj.url, "HEAD", opts, stats);
    loop {
        r.attempt();
        let failure = match tokio::time::timeout(opts.timeout, obj.store.head(&obj.path)).await {
            Ok(Ok(meta)) => {
                return Ok(Meta {
                    size: meta.size,
                    etag: meta.e_tag,
                });
            }
            Ok(Err(e)) if matches!(status_code(&e), Some(501 | 405)) => {
                // A server without HEAD (the GCS emulator's XML API, some HTTP servers): the
                // first byte's GET carries the size and ETag as well.
                return head_by_get(obj, opts, stats).await;
            }
            Ok(Err(e)) => Failure::from_store(&e),
            Err(_) => Failure::timeout("response", opts.timeout),
        };
        r.failed(failure).await?;
    }
}

/// [`head`] for servers that refuse HEAD: a GET of the first byte, with retries.
async fn head_by_get(obj: &Object, opts: &RemoteOptions, stats: &IoStats) -> Result<Meta, Error> {
    let mut r = Retrier::new(
        &obj.url,
        "GET of the first byte (the server refused HEAD)",
        opts,
        stats,
    );
    loop {
        r.attempt();
        let get = GetOptions {
            range: Some(GetRange::Bounded(0..1)),
            ..GetOptions::default()
        };
        let failure =
            match tokio::time::timeout(opts.timeout, obj.store.get_opts(&obj.path, get)).await {
                Ok(Ok(got)) => {
                    return Ok(Meta {
                        size: got.meta.size,
                        etag: got.meta.e_tag,
                    });
                }
                Ok(Err(e)) => Failure::from_store(&e),
                Err(_) => Failure::timeout("response", opts.timeout),
            };
        r.failed(failure).await?;
    }
}

/// Bytes `range` of `obj`, with retries; a broken body resumes from the first byte not yet
/// received, pinned to `etag` (the version the caller saw) when known. `whole`: the range is
/// the whole object, so the first request asks for no range (servers without range support
/// can serve it; only a resumption needs them).
pub(crate) async fn fetch_range(
    obj: &Object,
    range: Range<u64>,
    whole: bool,
    etag: Option<String>,
    opts: &RemoteOptions,
    stats: &IoStats,
) -> Result<Bytes, Error> {
    if range.is_empty() {
        return Ok(Bytes::new());
    }
    let mut received = Received::new(range.clone());
    let mut etag = etag;
    let mut r = Retrier::new(&obj.url, "GET", opts, stats);
    loop {
        r.attempt();
        let from = received.next_byte();
        let get = GetOptions {
            range: (!(whole && from == 0)).then_some(GetRange::Bounded(from..range.end)),
            if_match: etag.clone(),
            ..GetOptions::default()
        };
        let failure =
            match tokio::time::timeout(opts.timeout, obj.store.get_opts(&obj.path, get)).await {
                Err(_) => Failure::timeout("response", opts.timeout),
                Ok(Err(e)) => Failure::from_store(&e),
                Ok(Ok(res)) => {
                    // Resumptions ask for the version this response served.
                    if etag.is_none() {
                        etag = res.meta.e_tag.clone();
                    }
                    match received.read(res.into_stream(), opts.timeout, stats).await {
                        Ok(()) => return Ok(received.into_bytes()),
                        Err(failure) => failure,
                    }
                }
            };
        r.failed(failure).await?;
    }
}

/// The bytes of one range received so far, over every attempt: a resumed request asks for
/// the rest, from [`Received::next_byte`].
struct Received {
    range: Range<u64>,
    buf: BytesMut,
}

impl Received {
    fn new(range: Range<u64>) -> Received {
        let want = range.end.saturating_sub(range.start);
        Received {
            range,
            buf: BytesMut::with_capacity(usize::try_from(want).unwrap_or(0)),
        }
    }

    /// Bytes in the whole range.
    fn want(&self) -> u64 {
        self.range.end.saturating_sub(self.range.start)
    }

    /// The first byte of the range not received yet.
    fn next_byte(&self) -> u64 {
        self.range.start + self.buf.len() as u64
    }

    /// Adds a response's body, waiting at most `timeout` for each chunk: `Ok` once the
    /// range is complete, or why the body broke off (the bytes received before stay).
    async fn read<S>(
        &mut self,
        mut body: S,
        timeout: Duration,
        stats: &IoStats,
    ) -> Result<(), Failure>
    where
        S: Stream<Item = Result<Bytes, object_store::Error>> + Unpin,
    {
        let want = self.want();
        loop {
            match tokio::time::timeout(timeout, body.next()).await {
                Err(_) => return Err(Failure::timeout("body bytes", timeout)),
                Ok(Some(Ok(chunk))) => {
                    stats.add(Counter::Bytes, chunk.len() as u64);
                    if chunk.len() as u64 > want - self.buf.len() as u64 {
                        return Err(Failure {
                            retry: false,
                            kind: io::ErrorKind::InvalidData,
                            cause: format!(
                                "the server sent more than the {want} bytes expected: the \
                                 object changed since it was opened; open it again"
                            ),
                        });
                    }
                    self.buf.extend_from_slice(&chunk);
                }
                Ok(Some(Err(e))) => return Err(Failure::from_store(&e)),
                Ok(None) if self.buf.len() as u64 == want => return Ok(()),
                Ok(None) => {
                    return Err(Failure {
                        retry: true,
                        kind: io::ErrorKind::UnexpectedEof,
                        cause: format!(
                            "the body ended at byte {} of {}..{}",
                            self.next_byte(),
                            self.range.start,
                            self.range.end
                        ),
                    });
                }
            }
        }
    }

    fn into_bytes(self) -> Bytes {
        self.buf.freeze()
    }
}

/// Several ranges of one object, adjacent or close ranges coalesced into one request
/// (`object_store`'s [`object_store::coalesce_ranges`], 1 MiB gap), each request with
/// [`fetch_range`]'s retries.
pub(crate) async fn fetch_ranges(
    obj: &Object,
    ranges: &[Range<u64>],
    opts: &RemoteOptions,
    stats: &IoStats,
) -> Result<Vec<Bytes>, Error> {
    object_store::coalesce_ranges(
        ranges,
        |r| async move { fetch_range(obj, r, false, None, opts, stats).await },
        object_store::OBJECT_STORE_COALESCE_DEFAULT,
    )
    .await
}

/// The whole object at `url`, or `None` if it does not exist: for manifests and index files.
pub(crate) fn fetch_optional(url: &str) -> Result<Option<Bytes>, Error> {
    fetch_optional_counted(url, &Arc::new(IoStats::default()))
}

/// [`fetch_optional`], counted in `stats` (a shard set's, for the index files of its shards).
pub(crate) fn fetch_optional_counted(
    url: &str,
    stats: &Arc<IoStats>,
) -> Result<Option<Bytes>, Error> {
    let obj = object(url)?;
    let opts = remote_options()?;
    let stats = Arc::clone(stats);
    block_on(async move {
        let meta = match head(&obj, &opts, &stats).await {
            Ok(m) => m,
            Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        fetch_range(&obj, 0..meta.size, true, meta.etag, &opts, &stats)
            .await
            .map(Some)
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_and_caps() {
        let opts = RemoteOptions::default();
        let stats = IoStats::default();
        let mut r = Retrier::new("u", "GET", &opts, &stats);
        let mut last_max = Duration::ZERO;
        for a in 1..=12 {
            r.attempts = a;
            let b = r.backoff();
            let full = opts
                .backoff_base
                .saturating_mul(1 << (a - 1))
                .min(opts.backoff_max);
            assert!(b >= full / 2 && b <= full, "attempt {a}: {b:?} vs {full:?}");
            assert!(full >= last_max);
            last_max = full;
        }
        assert_eq!(last_max, opts.backoff_max);
    }

    /// Reads a body of `chunks` (that then, with `stall`, never ends) into `received`, waiting
    /// 50 ms a chunk; returns `received` and the outcome.
    fn read(
        mut received: Received,
        chunks: Vec<Result<Bytes, object_store::Error>>,
        stall: bool,
        stats: &Arc<IoStats>,
    ) -> (Received, Result<(), Failure>) {
        let stats = Arc::clone(stats);
        block_on(async move {
            let body = futures_util::stream::iter(chunks);
            let timeout = Duration::from_millis(50);
            let result = if stall {
                let body = body.chain(futures_util::stream::pending());
                received.read(body, timeout, &stats).await
            } else {
                received.read(body, timeout, &stats).await
            };
            (received, result)
        })
        .unwrap()
    }

    fn chunks(parts: &[&'static [u8]]) -> Vec<Result<Bytes, object_store::Error>> {
        parts.iter().map(|p| Ok(Bytes::from_static(p))).collect()
    }

    #[test]
    fn a_body_that_ends_short_resumes_from_the_byte_reached() {
        let stats = Arc::new(IoStats::default());
        let received = Received::new(100..110);
        assert_eq!(received.next_byte(), 100);
        let (received, result) = read(received, chunks(&[b"abc", b"de"]), false, &stats);
        let f = result.unwrap_err();
        assert!(f.retry && f.kind == io::ErrorKind::UnexpectedEof);
        assert_eq!(f.cause, "the body ended at byte 105 of 100..110");
        // The next request asks from byte 105; its body completes the range.
        assert_eq!(received.next_byte(), 105);
        let (received, result) = read(received, chunks(&[b"fghij"]), false, &stats);
        result.unwrap();
        assert_eq!(received.into_bytes(), &b"abcdefghij"[..]);
        assert_eq!(stats.snapshot().bytes_fetched, 10);
    }

    #[test]
    fn a_stalled_body_times_out_and_keeps_what_came() {
        let stats = Arc::new(IoStats::default());
        let (received, result) = read(Received::new(0..4), chunks(&[b"ab"]), true, &stats);
        let f = result.unwrap_err();
        assert!(f.retry && f.kind == io::ErrorKind::TimedOut, "{}", f.cause);
        assert!(f.cause.contains("no body bytes within 50ms"), "{}", f.cause);
        assert_eq!(received.next_byte(), 2);
    }

    #[test]
    fn more_bytes_than_the_range_is_a_changed_object() {
        let stats = Arc::new(IoStats::default());
        let (_, result) = read(Received::new(0..4), chunks(&[b"abc", b"de"]), false, &stats);
        let f = result.unwrap_err();
        assert!(!f.retry && f.kind == io::ErrorKind::InvalidData);
        assert!(
            f.cause.contains("more than the 4 bytes expected"),
            "{}",
            f.cause
        );
    }

    #[test]
    fn a_body_error_is_classified_like_a_store_error() {
        let stats = Arc::new(IoStats::default());
        let broken = object_store::Error::Generic {
            store: "test",
            source: "the socket closed".into(),
        };
        let body = vec![Ok(Bytes::from_static(b"a")), Err(broken)];
        let (received, result) = read(Received::new(0..4), body, false, &stats);
        let f = result.unwrap_err();
        // No transport error or retryable status in it: not retried.
        assert!(
            !f.retry && f.cause.contains("the socket closed"),
            "{}",
            f.cause
        );
        assert_eq!(received.next_byte(), 1);
    }

    #[test]
    fn unreachable_hosts_fail_naming_url_attempts_and_cause() {
        // Nothing listens on port 9 (discard) of loopback on a test machine; the connection
        // is refused at once, so three attempts take only their backoff.
        let opts = RemoteOptions {
            max_attempts: 3,
            backoff_base: Duration::from_millis(1),
            ..RemoteOptions::default()
        };
        let stats = Arc::new(IoStats::default());
        let obj = object("http://127.0.0.1:9/x/shard.tar").unwrap();
        let s2 = Arc::clone(&stats);
        let e = block_on(async move { fetch_range(&obj, 0..10, false, None, &opts, &s2).await })
            .unwrap()
            .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("http://127.0.0.1:9/x/shard.tar"), "{msg}");
        assert!(msg.contains("after 3 attempts"), "{msg}");
        assert!(msg.contains("last cause"), "{msg}");
        let s = stats.snapshot();
        assert_eq!((s.requests, s.retries, s.failures), (3, 2, 1));
    }
}
