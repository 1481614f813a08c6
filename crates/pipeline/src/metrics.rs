//! Prometheus metrics: every live loader's figures in the text exposition format, served over
//! HTTP by [`serve`].
//!
//! Loaders register themselves when built (a weak reference: a dropped loader leaves the
//! exposition at the next scrape). [`render`] writes them all, each series labelled with the
//! loader's `rank` and name (`loader`, [`LoaderOptions::name`]), so one dashboard shows every
//! rank of a job. Names follow Prometheus' conventions: base units (`_seconds`, `_bytes`),
//! `_total` on counters, and counters rather than rates (a query takes `rate(...[1m])`):
//!
//! | metric | type | what |
//! | --- | --- | --- |
//! | `chute_samples_total{stage}` | counter | samples read, transformed, delivered (`stage="read"`, `"transform"`, `"delivered"`) |
//! | `chute_batches_total{stage}` | counter | batches collated and delivered |
//! | `chute_stage_busy_seconds_total{stage}` | counter | worker time in `read`, `transform`, `collate` |
//! | `chute_wait_seconds_total` | counter | time the consumer (the training step) waited in `next()` |
//! | `chute_batch_wait_seconds` | histogram | that wait per batch |
//! | `chute_delivered_bytes_total` | counter | payload bytes delivered |
//! | `chute_batch_errors_total`, `chute_skipped_samples_total` | counter | failed batches, skipped samples |
//! | `chute_ready_batches`, `chute_inflight_batches`, `chute_queue_capacity_batches`, `chute_workers` | gauge | the queue now |
//! | `chute_epoch` | gauge | the epoch being read |
//! | `chute_window_samples_per_second`, `chute_window_wait_ratio` | gauge | over the loader's `stats_window` |
//! | `chute_remote_bytes_total`, `_requests_total`, `_retries_total`, `_cache_hits_total`, `_shards_total`, `_failures_total` | counter | the remote reads of the loader's source (as `stats()`'s `remote`) |
//!
//! and each source's own families ([`chute_core::Source::metrics`]), labelled the same way.
//!
//! The server is bound to `127.0.0.1` unless another address is given; it answers `GET
//! /metrics` (and `/`), one connection at a time, each given 5 s in all. A loader whose rank
//! and name a live loader already has is labelled `name#2`, `name#3`...
//!
//! [`LoaderOptions::name`]: crate::LoaderOptions::name

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use chute_core::{MetricFamily, Source};

use crate::stats::{Stats, StatsSnapshot, snapshot};

struct Entry {
    stats: Weak<Stats>,
    source: Weak<dyn Source>,
    labels: Labels,
}

/// The labels of one loader's series.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Labels {
    /// The loader's rank.
    pub rank: u64,
    /// The loader's name (its build order when it was given none).
    pub loader: String,
}

static REGISTRY: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
static BUILT: AtomicU64 = AtomicU64::new(0);

fn registry() -> std::sync::MutexGuard<'static, Vec<Entry>> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the registry keeps of one loader: its counters, its source, its rank and name.
pub(crate) struct Series<'a> {
    pub(crate) stats: &'a Arc<Stats>,
    pub(crate) source: &'a Arc<dyn Source>,
    pub(crate) rank: u64,
    pub(crate) name: &'a str,
}

/// Adds a newly built loader to the exposition. A name a live loader of the same rank has
/// already gets `#2`, `#3`... so no two series share their labels.
pub(crate) fn register(loader: &Series<'_>) {
    let mut r = registry();
    add(&mut r, loader);
}

/// [`register`] in a forked child: the registry's lock may have been held by the parent's
/// metrics thread, which does not exist here, so the loader is registered only if the lock
/// is free (its metrics are then missing in the child rather than the child hanging).
/// The entry of the parent's counters (`old`, leaked there) is replaced.
pub(crate) fn register_after_fork(loader: &Series<'_>, old: *const Stats) {
    if let Ok(mut r) = REGISTRY.try_lock() {
        r.retain(|e| !std::ptr::eq(e.stats.as_ptr(), old));
        add(&mut r, loader);
    }
}

fn add(r: &mut Vec<Entry>, loader: &Series<'_>) {
    let n = BUILT.fetch_add(1, Ordering::Relaxed);
    let (stats, source, rank) = (loader.stats, loader.source, loader.rank);
    r.retain(|e| e.stats.strong_count() > 0);
    let base = if loader.name.is_empty() {
        n.to_string()
    } else {
        loader.name.to_string()
    };
    let taken = |name: &str| {
        r.iter()
            .any(|e| e.labels.rank == rank && e.labels.loader == name)
    };
    let mut name = base.clone();
    let mut k = 2;
    while taken(&name) {
        name = format!("{base}#{k}");
        k += 1;
    }
    r.push(Entry {
        stats: Arc::downgrade(stats),
        source: Arc::downgrade(source),
        labels: Labels { rank, loader: name },
    });
}

/// Every live loader's labels and figures, in the order they were built.
pub fn snapshots() -> Vec<(Labels, StatsSnapshot)> {
    let live: Vec<_> = {
        let mut r = registry();
        r.retain(|e| e.stats.strong_count() > 0);
        r.iter()
            .filter_map(|e| Some((e.labels.clone(), e.stats.upgrade()?, e.source.upgrade()?)))
            .collect()
    };
    live.into_iter()
        .map(|(l, stats, source)| (l, snapshot(&stats, &*source)))
        .collect()
}

/// Every live loader's metrics in Prometheus' text exposition format (version 0.0.4).
pub fn render() -> String {
    render_snapshots(&snapshots())
}

/// The exposition of the given figures.
pub fn render_snapshots(loaders: &[(Labels, StatsSnapshot)]) -> String {
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, series: &str| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        out.push_str(series);
    };
    let labels = |l: &Labels, extra: &[(&str, &str)]| {
        let mut s = format!("rank=\"{}\",loader=\"{}\"", l.rank, escape(&l.loader));
        for (k, v) in extra {
            let _ = write!(s, ",{k}=\"{}\"", escape(v));
        }
        s
    };
    type Get = fn(&StatsSnapshot) -> f64;
    let per_stage = |name: &str, stages: &[(&str, Get)]| {
        let mut text = String::new();
        for (l, s) in loaders {
            for (stage, get) in stages {
                let _ = writeln!(
                    text,
                    "{name}{{{}}} {}",
                    labels(l, &[("stage", stage)]),
                    num(get(s))
                );
            }
        }
        text
    };
    let simple = |name: &str, get: Get| {
        let mut text = String::new();
        for (l, s) in loaders {
            let _ = writeln!(text, "{name}{{{}}} {}", labels(l, &[]), num(get(s)));
        }
        text
    };
    let samples = per_stage(
        "chute_samples_total",
        &[
            ("read", |s| s.read.items as f64),
            ("transform", |s| s.transform.items as f64),
            ("delivered", |s| s.samples as f64),
        ],
    );
    family(
        "chute_samples_total",
        "counter",
        "Samples handled per stage.",
        &samples,
    );
    let batches = per_stage(
        "chute_batches_total",
        &[
            ("collate", |s| s.collate.items as f64),
            ("delivered", |s| s.batches as f64),
        ],
    );
    family(
        "chute_batches_total",
        "counter",
        "Batches collated and delivered.",
        &batches,
    );
    let busy = per_stage(
        "chute_stage_busy_seconds_total",
        &[
            ("read", |s| s.read.busy_secs),
            ("transform", |s| s.transform.busy_secs),
            ("collate", |s| s.collate.busy_secs),
        ],
    );
    family(
        "chute_stage_busy_seconds_total",
        "counter",
        "Worker time spent per stage, summed over workers.",
        &busy,
    );
    let plain: [(&str, &str, &str, Get); 17] = [
        (
            "chute_wait_seconds_total",
            "counter",
            "Time the consumer (the training step) waited in next().",
            |s| s.wait_secs,
        ),
        (
            "chute_delivered_bytes_total",
            "counter",
            "Payload bytes delivered.",
            |s| s.bytes as f64,
        ),
        (
            "chute_batch_errors_total",
            "counter",
            "Batches that failed.",
            |s| s.errors as f64,
        ),
        (
            "chute_skipped_samples_total",
            "counter",
            "Samples that failed and were replaced (on_error=skip).",
            |s| s.skipped as f64,
        ),
        (
            "chute_ready_batches",
            "gauge",
            "Finished batches waiting for the consumer.",
            |s| s.queue.ready as f64,
        ),
        (
            "chute_inflight_batches",
            "gauge",
            "Batches being built by workers.",
            |s| s.queue.in_flight as f64,
        ),
        (
            "chute_queue_capacity_batches",
            "gauge",
            "Batches the workers may build ahead of the consumer (workers + prefetch; the autotuner's choice with num_workers=auto).",
            |s| s.queue.capacity as f64,
        ),
        (
            "chute_workers",
            "gauge",
            "Workers building batches in the current epoch's run (the autotuner's choice with num_workers=auto).",
            |s| s.queue.workers as f64,
        ),
        ("chute_epoch", "gauge", "The epoch being read.", |s| {
            s.epoch as f64
        }),
        (
            "chute_window_samples_per_second",
            "gauge",
            "Samples delivered per second over the loader's stats window.",
            |s| s.window.samples_per_sec,
        ),
        (
            "chute_window_wait_ratio",
            "gauge",
            "Fraction of the stats window the consumer waited.",
            |s| s.window.wait_fraction,
        ),
        (
            "chute_remote_bytes_total",
            "counter",
            "Bytes fetched from remote stores by the process since the loader was built.",
            |s| s.remote.bytes_fetched as f64,
        ),
        (
            "chute_remote_requests_total",
            "counter",
            "Remote requests sent (retries included).",
            |s| s.remote.requests as f64,
        ),
        (
            "chute_remote_retries_total",
            "counter",
            "Remote requests that retried or resumed a failed one.",
            |s| s.remote.retries as f64,
        ),
        (
            "chute_remote_cache_hits_total",
            "counter",
            "Whole shards served by the node-local cache.",
            |s| s.remote.cache_hits as f64,
        ),
        (
            "chute_remote_shards_total",
            "counter",
            "Whole shards downloaded.",
            |s| s.remote.shards_fetched as f64,
        ),
        (
            "chute_remote_failures_total",
            "counter",
            "Remote fetches that failed after their retries.",
            |s| s.remote.failures as f64,
        ),
    ];
    for (name, kind, help, get) in plain {
        let text = simple(name, get);
        family(name, kind, help, &text);
    }
    let mut hist = String::new();
    for (l, s) in loaders {
        let h = &s.wait_histogram;
        for (le, n) in &h.buckets {
            let le = num(*le);
            let _ = writeln!(
                hist,
                "chute_batch_wait_seconds_bucket{{{}}} {n}",
                labels(l, &[("le", &le)])
            );
        }
        let _ = writeln!(
            hist,
            "chute_batch_wait_seconds_bucket{{{}}} {}",
            labels(l, &[("le", "+Inf")]),
            h.count
        );
        let _ = writeln!(
            hist,
            "chute_batch_wait_seconds_sum{{{}}} {}",
            labels(l, &[]),
            num(h.sum)
        );
        let _ = writeln!(
            hist,
            "chute_batch_wait_seconds_count{{{}}} {}",
            labels(l, &[]),
            h.count
        );
    }
    family(
        "chute_batch_wait_seconds",
        "histogram",
        "Time the consumer waited for each batch.",
        &hist,
    );
    // The sources' own families (`Source::metrics`), each family's series from every loader
    // together, in the order the families first appear.
    let mut own: Vec<(MetricFamily, String)> = Vec::new();
    for (l, s) in loaders {
        for f in &s.source_metrics {
            let at = match own.iter().position(|(g, _)| g.name == f.name) {
                Some(at) => at,
                None => {
                    own.push((f.clone(), String::new()));
                    own.len() - 1
                }
            };
            for (labels_of, value) in &f.series {
                let pairs: Vec<(&str, &str)> = labels_of
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                let _ = writeln!(
                    own[at].1,
                    "{}{{{}}} {}",
                    f.name,
                    labels(l, &pairs),
                    num(*value)
                );
            }
        }
    }
    for (f, text) in &own {
        if !text.is_empty() {
            family(&f.name, f.kind, &f.help, text);
        }
    }
    out
}

/// A sample value as Prometheus reads it.
fn num(x: f64) -> String {
    if x.is_nan() {
        "NaN".into()
    } else if x.is_infinite() {
        if x > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{x}")
    }
}

/// A label value with `\`, `"` and line feeds escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The HTTP endpoint serving [`render`]. It runs until the process ends.
#[derive(Debug, Clone, Copy)]
pub struct MetricsServer {
    addr: SocketAddr,
    /// The process whose thread serves it (a forked child has none).
    pid: u32,
}

impl MetricsServer {
    /// The address it listens on (the port chosen when 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

static SERVERS: Mutex<Vec<MetricsServer>> = Mutex::new(Vec::new());

/// Serves every live loader's metrics at `http://ADDR/metrics` on a background thread, for
/// the rest of the process. Asking again for an address already served returns that server.
/// Port 0 picks a free port ([`MetricsServer::addr`] says which).
///
/// Fails if the address cannot be bound (in use, not this machine's).
pub fn serve(addr: SocketAddr) -> io::Result<MetricsServer> {
    let mut servers = SERVERS.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    // A forked child inherits the list, not the threads.
    servers.retain(|s| s.pid == pid);
    if addr.port() != 0
        && let Some(s) = servers.iter().find(|s| s.addr == addr)
    {
        return Ok(*s);
    }
    let listener = TcpListener::bind(addr).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot serve metrics on {addr}: {e} (choose another port, or 0 for any)"),
        )
    })?;
    let server = MetricsServer {
        addr: listener.local_addr()?,
        pid,
    };
    crate::workers::spawn_service("chute-metrics", move || {
        for stream in listener.incoming() {
            match stream {
                Ok(stream) => {
                    let _ = answer(stream);
                }
                // Out of file descriptors, say: wait instead of spinning.
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    })?;
    servers.push(server);
    Ok(server)
}

/// How long one connection may take, all reads and writes together.
const CONNECTION_TIME: Duration = Duration::from_secs(5);

/// Answers one HTTP/1.x request on `stream`, then closes it. The request line is all it
/// needs; a client has [`CONNECTION_TIME`] in all to send it and read the answer.
fn answer(mut stream: TcpStream) -> io::Result<()> {
    let deadline = std::time::Instant::now() + CONNECTION_TIME;
    let left = || {
        deadline
            .saturating_duration_since(std::time::Instant::now())
            .max(Duration::from_millis(1))
    };
    let mut request = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !request.contains(&b'\n') && request.len() <= 16 << 10 {
        if std::time::Instant::now() >= deadline {
            return Ok(());
        }
        stream.set_read_timeout(Some(left()))?;
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&buf[..n]);
    }
    stream.set_write_timeout(Some(left()))?;
    let line = request
        .split(|&b| b == b'\r' || b == b'\n')
        .next()
        .unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, kind, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics" | "/") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            render(),
        ),
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "chute serves its metrics at /metrics\n".to_string(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET\n".to_string(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    if method != "HEAD" {
        stream.write_all(body.as_bytes())?;
    }
    stream.flush()
}
