//! Seeing where the time goes: windowed statistics, queue depths, the wait histogram, the
//! Prometheus exposition and its endpoint, and the doctor's diagnosis.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chute_core::{BoxError, Error, Manifest, Sample, SampleRng, Source};
use chute_pipeline::doctor::{DoctorOptions, diagnose};
use chute_pipeline::{Autotune, Loader, batch_digest, metrics};

use crate::support::Synthetic;

/// Polls `cond` every 5 ms for up to 5 s (a condition on other threads' progress, not a timing).
fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

#[test]
fn stats_have_totals_windows_epochs_and_a_wait_histogram() {
    let mut loader = Loader::builder(Synthetic::new(&[300, 200]))
        .batch_size(10)
        .num_workers(2)
        .build()
        .unwrap();
    let n: usize = (&mut loader).map(|b| b.unwrap().len()).sum();
    assert_eq!(n, 500);
    let s = loader.stats();
    assert_eq!((s.samples, s.batches, s.read.items), (500, 50, 500));
    assert_eq!(s.window_secs, 10.0);
    // The loader is younger than its window: the window is everything so far.
    assert_eq!(s.window.samples, 500);
    assert_eq!(s.current_epoch.samples, 500);
    assert_eq!(s.epoch, 0);
    // The epoch ended with its last batch.
    assert_eq!(s.last_epoch.as_ref().map(|w| w.samples), Some(500));
    let h = &s.wait_histogram;
    assert_eq!(h.count, 50);
    assert_eq!(h.buckets.len(), chute_pipeline::WAIT_BUCKETS.len());
    assert!(
        h.buckets
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1)
    );
    assert!(h.buckets.last().unwrap().1 <= h.count);
    assert!((h.sum - s.wait_secs).abs() < 1e-9);
    // The next epoch: the first becomes last_epoch, the current one counts afresh.
    let n: usize = (&mut loader).take(3).map(|b| b.unwrap().len()).sum();
    assert_eq!(n, 30);
    let s = loader.stats();
    assert_eq!(s.epoch, 1);
    assert_eq!(s.last_epoch.as_ref().map(|w| w.samples), Some(500));
    assert_eq!(s.current_epoch.samples, 30);
    assert_eq!(s.samples, 530);
}

#[test]
fn the_window_forgets_what_is_older_than_it() {
    let mut loader = Loader::builder(Synthetic::new(&[100]))
        .batch_size(10)
        .stats_window(Duration::from_millis(40))
        .build()
        .unwrap();
    for b in (&mut loader).take(5) {
        b.unwrap();
    }
    assert_eq!(loader.stats().window.samples, 50);
    std::thread::sleep(Duration::from_millis(120));
    let s = loader.stats();
    assert_eq!(s.window.samples, 0, "{:?}", s.window);
    assert_eq!(s.window.samples_per_sec, 0.0);
    assert_eq!(s.samples, 50);
    assert!(
        Loader::builder(Synthetic::new(&[1]))
            .stats_window(Duration::ZERO)
            .build()
            .is_err()
    );
}

#[test]
fn queue_depths_show_a_full_queue_behind_a_slow_consumer() {
    let mut loader = Loader::builder(Synthetic::new(&[400]))
        .batch_size(4)
        .num_workers(2)
        .prefetch(3)
        .build()
        .unwrap();
    loader.next().unwrap().unwrap();
    // The consumer stops: the workers fill every slot (2 workers + 3 prefetch) and wait.
    assert!(
        eventually(|| {
            let q = loader.stats().queue;
            q.ready == 5 && q.in_flight == 0
        }),
        "{:?}",
        loader.stats().queue
    );
    let q = loader.stats().queue;
    assert_eq!((q.capacity, q.workers), (5, 2));
    loader.next().unwrap().unwrap();
    assert!(eventually(|| loader.stats().queue.ready == 5));
    // The epoch's run ends: nothing is queued any more.
    for b in &mut loader {
        b.unwrap();
    }
    let q = loader.stats().queue;
    assert_eq!((q.ready, q.in_flight, q.capacity), (0, 0, 0));
}

/// A loader over reads of `read_ms` each, tuned from `initial` workers up to 4.
fn tuned(read_ms: u64, initial: usize) -> Loader {
    let source = Slow {
        inner: Synthetic::new(&[100_000]),
        read: Duration::from_millis(read_ms),
    };
    Loader::builder(source)
        .batch_size(4)
        .num_workers(4)
        .prefetch(4)
        .autotune(Autotune {
            initial_workers: initial,
            memory_budget: 1 << 30,
        })
        .build()
        .unwrap()
}

#[test]
fn autotune_adds_workers_for_a_consumer_that_waits() {
    // One worker builds a batch in 20 ms; the consumer takes them as fast as they come, so
    // it waits all the time: the tuner adds workers, then prefetch, and says so.
    let mut loader = tuned(5, 1);
    let mut seen = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(4) {
        seen.push(batch_digest(&loader.next().unwrap().unwrap()));
        if loader.stats().autotune.unwrap().workers == 4 {
            break;
        }
    }
    assert_eq!(
        seen,
        first_batches(seen.len()),
        "the stream is the fixed loader's"
    );
    let s = loader.stats();
    let a = s.autotune.unwrap();
    assert_eq!(a.workers, 4, "{a:?}");
    assert!(a.changes >= 3, "{a:?}");
    assert_eq!(
        s.queue.workers, 4,
        "the queue's figures are the tuner's: {:?}",
        s.queue
    );
    let text = metrics::render();
    assert!(text.contains("chute_workers{"), "{text}");
}

#[test]
fn autotune_gives_workers_back_to_a_consumer_that_never_waits() {
    // Four workers build a batch each in 4 ms; the consumer takes one every 15 ms, with
    // batches always ready: workers are given back, down to the one it needs.
    let mut loader = tuned(1, 4);
    let mut seen = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(8) {
        seen.push(batch_digest(&loader.next().unwrap().unwrap()));
        std::thread::sleep(Duration::from_millis(15));
        if loader.stats().autotune.unwrap().workers == 1 {
            break;
        }
    }
    let a = loader.stats().autotune.unwrap();
    assert!(a.workers < 4, "{a:?}");
    assert_eq!(loader.stats().queue.workers, a.workers);
    assert_eq!(
        seen,
        first_batches(seen.len()),
        "the stream is the fixed loader's"
    );
}

/// The first `n` batches' digests of the tuned loaders' stream, read with fixed workers.
fn first_batches(n: usize) -> Vec<String> {
    let loader = Loader::builder(Synthetic::new(&[100_000]))
        .batch_size(4)
        .num_workers(2)
        .build()
        .unwrap();
    loader.take(n).map(|b| batch_digest(&b.unwrap())).collect()
}

/// Checks the text exposition format line by line: comments, then `name{labels} value`.
fn check_exposition(text: &str) {
    for line in text.lines() {
        if line.starts_with("# HELP ") || line.starts_with("# TYPE ") {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect(line);
        assert!(
            value.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&value),
            "{line}"
        );
        let name = series.split('{').next().unwrap();
        assert!(name.starts_with("chute_"), "{line}");
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{line}"
        );
        if let Some(labels) = series.strip_prefix(name) {
            assert!(labels.is_empty() || (labels.starts_with('{') && labels.ends_with('}')));
        }
    }
}

fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn metrics_render_every_live_loader_labelled_by_rank_and_name() {
    let mut loader = Loader::builder(Synthetic::new(&[64]))
        .batch_size(8)
        .num_workers(2)
        .distributed(1, 2)
        .name("render-test")
        .build()
        .unwrap();
    for b in &mut loader {
        b.unwrap();
    }
    let s = loader.stats();
    let text = metrics::render();
    check_exposition(&text);
    let l = r#"rank="1",loader="render-test""#;
    assert_eq!(
        value(
            &text,
            &format!(r#"chute_samples_total{{{l},stage="delivered"}}"#)
        ),
        Some(s.samples as f64)
    );
    assert_eq!(
        value(
            &text,
            &format!(r#"chute_samples_total{{{l},stage="read"}}"#)
        ),
        Some(s.read.items as f64)
    );
    assert_eq!(
        value(
            &text,
            &format!(r#"chute_batches_total{{{l},stage="delivered"}}"#)
        ),
        Some(4.0)
    );
    assert_eq!(
        value(&text, &format!("chute_batch_wait_seconds_count{{{l}}}")),
        Some(4.0)
    );
    assert_eq!(
        value(
            &text,
            &format!(r#"chute_batch_wait_seconds_bucket{{{l},le="+Inf"}}"#)
        ),
        Some(4.0)
    );
    assert_eq!(
        value(&text, &format!("chute_epoch{{{l}}}")),
        Some(s.epoch as f64)
    );
    assert!(text.contains("# TYPE chute_batch_wait_seconds histogram"));
    assert!(text.contains("# TYPE chute_wait_seconds_total counter"));
    // A dropped loader leaves the exposition.
    drop(loader);
    assert!(!metrics::render().contains("render-test"));
}

fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn the_endpoint_serves_the_exposition_over_http() {
    let mut loader = Loader::builder(Synthetic::new(&[20]))
        .batch_size(5)
        .name("http-test")
        .build()
        .unwrap();
    for b in &mut loader {
        b.unwrap();
    }
    let server = metrics::serve("127.0.0.1:0".parse().unwrap()).unwrap();
    assert!(server.addr().ip().is_loopback());
    let reply = get(server.addr(), "/metrics");
    assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
    assert!(reply.contains("Content-Type: text/plain; version=0.0.4"));
    let body = reply.split("\r\n\r\n").nth(1).unwrap();
    check_exposition(body);
    assert_eq!(
        value(
            body,
            r#"chute_samples_total{rank="0",loader="http-test",stage="delivered"}"#
        ),
        Some(20.0)
    );
    assert!(get(server.addr(), "/other").starts_with("HTTP/1.1 404"));
    // A loader option serves the same way; the same address again is the same server; a
    // taken port is an error naming it.
    let served = Loader::builder(Synthetic::new(&[4]))
        .metrics_addr(server.addr())
        .build()
        .unwrap();
    drop(served);
    assert_eq!(metrics::serve(server.addr()).unwrap().addr(), server.addr());
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let e = metrics::serve(taken.local_addr().unwrap()).unwrap_err();
    assert!(e.to_string().contains("cannot serve metrics on"), "{e}");
    let e = Loader::builder(Synthetic::new(&[4]))
        .metrics_addr(taken.local_addr().unwrap())
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("metrics_addr"), "{e}");
}

/// A source whose reads take `read` each.
struct Slow {
    inner: Synthetic,
    read: Duration,
}

impl Source for Slow {
    fn manifest(&self) -> &Manifest {
        self.inner.manifest()
    }

    fn read(&self, id: u64) -> Result<Sample, Error> {
        std::thread::sleep(self.read);
        self.inner.read(id)
    }
}

fn slow_loader(read_ms: u64, transform_ms: u64, workers: usize) -> Loader {
    let source = Slow {
        inner: Synthetic::new(&[100_000]),
        read: Duration::from_millis(read_ms),
    };
    let t = move |_: &mut Sample, _: &mut SampleRng| -> Result<(), BoxError> {
        std::thread::sleep(Duration::from_millis(transform_ms));
        Ok(())
    };
    Loader::builder(source)
        .batch_size(8)
        .num_workers(workers)
        .transform(t)
        .build()
        .unwrap()
}

fn quick(workers: &[usize]) -> DoctorOptions {
    DoctorOptions {
        trial: Duration::from_millis(400),
        workers: workers.to_vec(),
        ..Default::default()
    }
}

#[test]
fn the_doctor_names_a_slow_transform_and_the_workers_that_keep_up() {
    // 2 ms a sample in the transform: one worker gives about 500 samples/s.
    let loader = slow_loader(0, 2, 1);
    let options = DoctorOptions {
        target_samples_per_sec: Some(1200.0),
        ..quick(&[1, 2, 6])
    };
    let d = diagnose(&loader, &options, None).unwrap();
    assert_eq!(d.bottleneck, "transform", "{}", d.to_text());
    assert!(d.worker_shares[1].1 > 0.9, "{:?}", d.worker_shares);
    assert_eq!(d.recommended_workers, 6, "{}", d.to_text());
    assert!(d.trial(6).unwrap().samples_per_sec > 2.0 * d.trial(1).unwrap().samples_per_sec);
    assert!(d.has("workers"), "{}", d.to_text());
    assert!(d.predicted_wait_fraction.unwrap() < 0.1);
    assert!(d.trial(1).unwrap().predicted_wait_fraction.unwrap() > 0.3);
    // The loader the doctor looked at is where it was.
    assert_eq!(loader.stats().batches, 0);
}

#[test]
fn the_doctor_names_slow_reads() {
    let loader = slow_loader(2, 0, 2);
    let d = diagnose(&loader, &quick(&[1, 2]), None).unwrap();
    assert_eq!(d.bottleneck, "read", "{}", d.to_text());
    assert!(d.stage("read").unwrap().samples_per_sec < 600.0);
}

#[test]
fn the_doctor_names_a_slow_consumer() {
    let loader = Loader::builder(Synthetic::new(&[100_000]))
        .batch_size(8)
        .num_workers(2)
        .build()
        .unwrap();
    // The hand-over takes 10 ms a batch: at most 800 samples/s reach the step.
    let mut crossing = |_b: chute_core::Batch| {
        std::thread::sleep(Duration::from_millis(10));
        true
    };
    let d = diagnose(&loader, &quick(&[1, 2]), Some(&mut crossing)).unwrap();
    assert_eq!(d.bottleneck, "consumer", "{}", d.to_text());
    assert!(d.has("consumer"));
    let c = d.stage("consumer").unwrap();
    assert!((c.secs_per_sample - 0.010 / 8.0).abs() < 0.0008, "{c:?}");
}

#[test]
fn the_doctor_reports_a_stage_that_does_not_scale() {
    // A transform that holds a lock: a second worker waits for it.
    let lock = Arc::new(std::sync::Mutex::new(()));
    let t = move |_: &mut Sample, _: &mut SampleRng| -> Result<(), BoxError> {
        let _held = lock.lock().unwrap();
        std::thread::sleep(Duration::from_millis(1));
        Ok(())
    };
    let loader = Loader::builder(Synthetic::new(&[100_000]))
        .batch_size(8)
        .num_workers(2)
        .transform(t)
        .build()
        .unwrap();
    let d = diagnose(&loader, &quick(&[1, 2]), None).unwrap();
    assert_eq!(d.bottleneck, "transform");
    assert!(d.has("no-scaling"), "{}", d.to_text());
}

#[test]
fn the_doctor_passes_source_errors_on() {
    let source = chute_core::FnSource::new("bad", 10, |id| {
        Err(Error::corrupt(format!("sample {id}"), 0, "broken"))
    });
    let loader = Loader::builder(source).batch_size(2).build().unwrap();
    let e = diagnose(&loader, &quick(&[1]), None).unwrap_err();
    assert!(e.to_string().contains("broken"), "{e}");
}

#[test]
fn the_doctor_deepens_the_queue_for_bursty_batches() {
    // One sample in 80 (a batch in 10) takes 40 ms, as a shard download would.
    let inner = Synthetic::new(&[100_000]);
    let source = chute_core::FnSource::new("bursty", 100_000, move |id| {
        if id % 80 == 0 {
            std::thread::sleep(Duration::from_millis(40));
        }
        inner.read(id)
    });
    let loader = Loader::builder(source)
        .batch_size(8)
        .num_workers(2)
        .build()
        .unwrap();
    let d = diagnose(&loader, &quick(&[2]), None).unwrap();
    let t = d.trial(2).unwrap();
    assert!(t.gap_p95_ms > 2.0 * t.gap_p50_ms, "{t:?}");
    assert!(d.recommended_prefetch > 2, "{}", d.to_text());
    assert!(d.has("prefetch"), "{}", d.to_text());
}

#[test]
fn loaders_sharing_a_name_get_distinct_labels() {
    let a = Loader::builder(Synthetic::new(&[4]))
        .name("twin")
        .build()
        .unwrap();
    let b = Loader::builder(Synthetic::new(&[4]))
        .name("twin")
        .build()
        .unwrap();
    let text = metrics::render();
    assert!(text.contains(r#"loader="twin""#) && text.contains(r#"loader="twin#2""#));
    drop((a, b));
}

#[test]
fn a_silent_client_does_not_block_the_endpoint() {
    let server = metrics::serve("127.0.0.1:0".parse().unwrap()).unwrap();
    // A client that connects and sends a byte now and then, never a whole request line.
    let mut slow = TcpStream::connect(server.addr()).unwrap();
    slow.write_all(b"G").unwrap();
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET /metrics HTTP/1.0\n\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    drop(slow);
}

#[test]
fn an_ended_epoch_is_frozen_until_the_next_starts() {
    let mut loader = Loader::builder(Synthetic::new(&[40]))
        .batch_size(10)
        .build()
        .unwrap();
    for b in &mut loader {
        b.unwrap();
    }
    let ended = loader.stats();
    std::thread::sleep(Duration::from_millis(30));
    let later = loader.stats();
    assert_eq!(ended.last_epoch, later.last_epoch);
    assert_eq!(later.current_epoch, later.last_epoch.clone().unwrap());
    assert_eq!(later.last_epoch.unwrap().samples, 40);
}
