//! `chute bench`: run the loader over a dataset, as a training loop would.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chute::core::{OnError, Shuffle, Source, State};
use chute::io::write_atomically;
use chute::ops::SampleOps;
use chute::pipeline::StreamDigest;
use chute::pipeline::{Loader, LoaderOptions, StatsSnapshot};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::dataset_args::DatasetArgs;
use crate::plot::Point;

/// Loader options shared by `bench` and `demo`.
#[derive(Debug, Clone, Args)]
pub(crate) struct LoaderArgs {
    /// Samples per batch.
    #[arg(long, default_value_t = 16)]
    pub(crate) batch_size: usize,
    /// Worker threads (0 builds batches in the consumer's thread); default: one per core.
    #[arg(long)]
    pub(crate) workers: Option<usize>,
    /// Finished batches that may wait for the consumer, on top of one per worker.
    #[arg(long, default_value_t = 2)]
    pub(crate) prefetch: usize,
    /// Ordering: none, global, block or block:N (N shards per shuffle window) [default:
    /// global; none for a mixture file, which orders its own samples].
    #[arg(long, value_parser = parse_shuffle)]
    pub(crate) shuffle: Option<Shuffle>,
    /// Seed for the order and the per-sample randomness.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// First epoch.
    #[arg(long, default_value_t = 0)]
    pub(crate) epoch: u64,
    /// This process's rank.
    #[arg(long, default_value_t = 0)]
    pub(crate) rank: u64,
    /// Number of ranks.
    #[arg(long, default_value_t = 1)]
    pub(crate) world_size: u64,
    /// Drop each rank's last incomplete batch (otherwise it is delivered short).
    #[arg(long)]
    pub(crate) drop_last: bool,
    /// A sample that fails to read or transform: raise (stop with the error) or skip (count
    /// it, report it, and use the next sample in its place).
    #[arg(long, default_value = "raise", value_parser = parse_on_error)]
    pub(crate) on_error: OnError,
    /// Allocate batch buffers page-locked through the CUDA runtime, if one is installed.
    #[arg(long)]
    pub(crate) pin_memory: bool,
    /// Ops per field, run on the workers: JSON text, or the path of a JSON file (for example
    /// `{"jpg": [{"op": "decode"}, {"op": "random_resized_crop", "size": 224},
    /// {"op": "horizontal_flip"}], "cls": [{"op": "label"}]}`; see chute_ops::spec).
    #[arg(long, value_parser = parse_transform)]
    pub(crate) transform: Option<SampleOps>,
    /// Arrays whose shapes differ within a batch: pad them with zeros to the batch's largest
    /// shape and add a `<name>_mask` column (otherwise they come as a list, one per sample).
    #[arg(long)]
    pub(crate) pad: bool,
}

/// `--transform`: JSON text, or a file holding it.
pub(crate) fn parse_transform(s: &str) -> Result<SampleOps, String> {
    let text = if s.trim_start().starts_with('{') {
        s.to_string()
    } else {
        std::fs::read_to_string(s).map_err(|e| {
            format!("{s:?} is neither JSON (it does not start with '{{') nor a readable file: {e}")
        })?
    };
    SampleOps::from_json(&text).map_err(|e| e.to_string())
}

fn parse_on_error(s: &str) -> Result<OnError, String> {
    s.parse::<OnError>().map_err(|e| e.to_string())
}

pub(crate) fn parse_shuffle(s: &str) -> Result<Shuffle, String> {
    s.parse::<Shuffle>().map_err(|e| e.to_string())
}

impl LoaderArgs {
    pub(crate) fn build(&self, source: Arc<dyn Source>) -> anyhow::Result<Loader> {
        let workers = self
            .workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
        let orders_itself = source.own_order().is_some();
        let shuffle = self.shuffle.unwrap_or(if orders_itself {
            Shuffle::None
        } else {
            Shuffle::Global
        });
        let loader = Loader::builder_arc(source).options(LoaderOptions {
            batch_size: self.batch_size,
            shuffle,
            seed: self.seed,
            num_workers: workers,
            prefetch: self.prefetch,
            drop_last: self.drop_last,
            rank: self.rank,
            world_size: self.world_size,
            epoch: self.epoch,
            pin_memory: self.pin_memory,
            on_error: self.on_error,
            pad: self.pad,
            ..LoaderOptions::default()
        });
        let loader = match &self.transform {
            Some(t) => loader.transform(t.clone()),
            None => loader,
        }
        .build()?;
        if let Some(why) = loader.pin_memory_fallback() {
            eprintln!("warning: --pin-memory: using ordinary memory ({why})");
        }
        Ok(loader)
    }
}

/// How the loop runs and what it records.
#[derive(Debug, Clone, Args)]
pub(crate) struct RunArgs {
    /// Epochs to run.
    #[arg(long, default_value_t = 1)]
    pub(crate) epochs: u64,
    /// Simulated training step per batch, in milliseconds (0: consume as fast as possible).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) step_ms: f64,
    /// Print a machine-readable JSON summary instead of text.
    #[arg(long)]
    pub(crate) json: bool,
    /// Print a hex digest of every delivered batch's contents, in order.
    #[arg(long)]
    pub(crate) digest: bool,
    /// Write the global sample ids delivered to FILE, one per line.
    #[arg(long, value_name = "FILE")]
    pub(crate) ids: Option<PathBuf>,
    /// After N batches, write the loader's state to STATE.json and stop (as if killed).
    #[arg(long, num_args = 2, value_names = ["N", "STATE.json"])]
    pub(crate) save_state_at: Option<Vec<String>>,
    /// Continue from a state written by --save-state-at (or by a training job).
    #[arg(long, value_name = "STATE.json")]
    pub(crate) resume: Option<PathBuf>,
    /// Hide the progress bar.
    #[arg(long)]
    pub(crate) quiet: bool,
    /// Serve the loader's metrics for Prometheus at http://ADDRESS:PORT/metrics during the
    /// run (0: any free port, printed).
    #[arg(long, value_name = "PORT")]
    pub(crate) metrics_port: Option<u16>,
    /// The address the metrics endpoint binds to (default: this machine only).
    #[arg(long, default_value = "127.0.0.1", value_name = "ADDRESS")]
    pub(crate) metrics_address: std::net::IpAddr,
    /// Keep serving metrics this many seconds after the run, so a scraper sees the final
    /// figures.
    #[arg(long, default_value_t = 0.0, value_name = "SECS")]
    pub(crate) metrics_hold: f64,
    /// Write charts of the run (throughput, wait, stage busy time, queue depth over time)
    /// to FILE: a PNG, or a self-contained page when the name ends in .html.
    #[arg(long, value_name = "FILE")]
    pub(crate) plot: Option<PathBuf>,
}

/// How often `--plot` records a point.
const PLOT_INTERVAL: Duration = Duration::from_millis(200);

/// `chute bench` arguments.
#[derive(Debug, Clone, Args)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    pub(crate) dataset: DatasetArgs,
    #[command(flatten)]
    pub(crate) loader: LoaderArgs,
    #[command(flatten)]
    pub(crate) run: RunArgs,
}

/// What a run reports.
#[derive(Debug, Serialize)]
pub(crate) struct Summary {
    pub(crate) samples: u64,
    pub(crate) batches: u64,
    pub(crate) epochs_completed: u64,
    pub(crate) elapsed_secs: f64,
    pub(crate) samples_per_sec: f64,
    pub(crate) batches_per_sec: f64,
    pub(crate) bytes_per_sec: f64,
    /// Fraction of the loop's time spent waiting in `next()`.
    pub(crate) wait_fraction: f64,
    pub(crate) wait_secs: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) digest: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) saved_state: Option<State>,
    pub(crate) workers: usize,
    /// Peak anonymous resident memory (`RssAnon`) seen during the run, in MB (Linux only):
    /// heap and buffers, not the file pages a memory map touches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) peak_rss_anon_mb: Option<f64>,
    pub(crate) stages: StatsSnapshot,
    /// Remote reading since the process started (opening included); absent if nothing was
    /// fetched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) remote: Option<RemoteSummary>,
    /// `--plot`'s time series.
    #[serde(skip)]
    pub(crate) points: Vec<Point>,
}

/// What remote shards cost: [`chute::io::IoSnapshot`] as the summary shows it.
#[derive(Debug, Serialize)]
pub(crate) struct RemoteSummary {
    pub(crate) bytes_fetched: u64,
    pub(crate) requests: u64,
    pub(crate) retries: u64,
    pub(crate) cache_hits: u64,
    pub(crate) shards_fetched: u64,
    pub(crate) failures: u64,
}

fn remote_summary() -> Option<RemoteSummary> {
    let s = chute::io::io_stats();
    (s.requests > 0 || s.cache_hits > 0).then_some(RemoteSummary {
        bytes_fetched: s.bytes_fetched,
        requests: s.requests,
        retries: s.retries,
        cache_hits: s.cache_hits,
        shards_fetched: s.shards_fetched,
        failures: s.failures,
    })
}

/// The process's anonymous resident memory in bytes, from `/proc/self/status`.
fn rss_anon() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

pub(crate) fn run(args: BenchArgs) -> anyhow::Result<()> {
    if let Some(p) = &args.run.plot {
        crate::plot::check_name(p)?;
    }
    let source = args.dataset.open()?;
    let mut loader = args.loader.build(source)?;
    let summary = run_loop(&mut loader, &args.run)?;
    print_summary(&summary, &args.run);
    finish(&summary, &args.run, "chute bench")
}

/// Starts `--metrics-port`'s endpoint, if asked for.
fn serve_metrics(run: &RunArgs) -> anyhow::Result<()> {
    if let Some(port) = run.metrics_port {
        let server =
            chute::pipeline::metrics::serve(std::net::SocketAddr::new(run.metrics_address, port))?;
        eprintln!("serving metrics at http://{}/metrics", server.addr());
    }
    Ok(())
}

/// After a run: `--plot` and `--metrics-hold`.
pub(crate) fn finish(summary: &Summary, run: &RunArgs, title: &str) -> anyhow::Result<()> {
    if let Some(path) = &run.plot {
        let text = format!(
            "{} samples in {:.2} s: {:.0} samples/s, waited {:.1}% of the time, {} workers",
            summary.samples,
            summary.elapsed_secs,
            summary.samples_per_sec,
            summary.wait_fraction * 100.0,
            summary.workers
        );
        crate::plot::bench(path, title, &summary.points, &text)?;
        if !run.json {
            println!("wrote {}", path.display());
        }
    }
    if run.metrics_port.is_some() && run.metrics_hold > 0.0 {
        // At most a day (and no panic on a huge or infinite value).
        std::thread::sleep(Duration::from_secs_f64(run.metrics_hold.min(86_400.0)));
    }
    Ok(())
}

/// Runs `loader` through `run.epochs` epochs (from its current epoch, or from the state in
/// `--resume`) as a training loop would.
pub(crate) fn run_loop(loader: &mut Loader, run: &RunArgs) -> anyhow::Result<Summary> {
    if run.epochs == 0 {
        bail!("--epochs must be at least 1");
    }
    let last_epoch = loader.epoch() + run.epochs - 1;
    if let Some(path) = &run.resume {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading state {}", path.display()))?;
        let state = State::from_json(&text).with_context(|| format!("state {}", path.display()))?;
        loader
            .restore(&state)
            .with_context(|| format!("restoring {}", path.display()))?;
    }
    let save_at = match &run.save_state_at {
        Some(v) => {
            let n: u64 = v[0].parse().with_context(|| {
                format!(
                    "--save-state-at takes a batch count and a file, got {:?}",
                    v[0]
                )
            })?;
            Some((n, PathBuf::from(&v[1])))
        }
        None => None,
    };
    let mut ids = match &run.ids {
        Some(p) => Some(BufWriter::new(
            File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => None,
    };
    let mut digest = run.digest.then(StreamDigest::new);
    let step = Duration::from_secs_f64(run.step_ms.max(0.0) / 1000.0);

    let remaining_epochs = last_epoch.saturating_sub(loader.epoch()) + 1;
    let bar = if run.quiet || run.json {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::new(loader.len() as u64 * remaining_epochs);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} epoch {msg} [{bar:30}] {pos}/{len} batches, {per_sec}, eta {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        bar
    };

    serve_metrics(run)?;
    let before = loader.stats();
    let t0 = Instant::now();
    let workers = loader.options().num_workers;
    let mut points = Vec::new();
    let mut last_point = (t0, before.clone());
    let (mut batches, mut samples, mut epochs_completed) = (0u64, 0u64, 0u64);
    let mut saved_state = None;
    let mut peak_rss = rss_anon();
    'epochs: while loader.epoch() <= last_epoch {
        bar.set_message(loader.epoch().to_string());
        loop {
            let Some(batch) = loader.next() else {
                epochs_completed += 1;
                break;
            };
            let batch = batch?;
            if let Some(d) = &mut digest {
                d.update(&batch);
            }
            if let Some(w) = &mut ids {
                for id in &batch.ids {
                    writeln!(w, "{id}")?;
                }
            }
            batches += 1;
            samples += batch.len() as u64;
            if batches % 64 == 0 {
                peak_rss = peak_rss.max(rss_anon());
            }
            drop(batch);
            if !step.is_zero() {
                std::thread::sleep(step);
            }
            bar.inc(1);
            if run.plot.is_some() && last_point.0.elapsed() >= PLOT_INTERVAL {
                let now = loader.stats();
                let t = t0.elapsed().as_secs_f64();
                points.push(Point::between(t, &last_point.1, &now, workers));
                last_point = (Instant::now(), now);
            }
            if let Some((n, path)) = &save_at
                && batches == *n
            {
                let state = loader.state();
                // Through a temporary file, so a killed run never leaves half a state file.
                write_atomically(path, state.to_json().as_bytes())
                    .with_context(|| format!("writing {}", path.display()))?;
                saved_state = Some(state);
                break 'epochs;
            }
        }
    }
    bar.finish_and_clear();
    if let Some(w) = &mut ids {
        w.flush()?;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let stats = loader.stats();
    let wait = stats.wait_secs - before.wait_secs;
    let bytes = stats.bytes - before.bytes;
    Ok(Summary {
        samples,
        batches,
        epochs_completed,
        elapsed_secs: elapsed,
        samples_per_sec: samples as f64 / elapsed,
        batches_per_sec: batches as f64 / elapsed,
        bytes_per_sec: bytes as f64 / elapsed,
        wait_fraction: if elapsed > 0.0 {
            (wait / elapsed).min(1.0)
        } else {
            0.0
        },
        wait_secs: wait,
        digest: digest.map(|d| d.hex()),
        saved_state,
        workers: loader.options().num_workers,
        peak_rss_anon_mb: peak_rss.max(rss_anon()).map(|b| b as f64 / 1e6),
        stages: stats,
        remote: remote_summary(),
        points,
    })
}

pub(crate) fn print_summary(s: &Summary, run: &RunArgs) {
    if run.json {
        let text = serde_json::to_string_pretty(s).expect("summary serializes");
        println!("{}", chute::core::redact::redact(&text));
        return;
    }
    println!(
        "{} samples in {} batches, {} epoch(s) completed, {:.2} s with {} workers",
        s.samples, s.batches, s.epochs_completed, s.elapsed_secs, s.workers
    );
    println!(
        "throughput: {:.0} samples/s, {:.1} batches/s, {}/s",
        s.samples_per_sec,
        s.batches_per_sec,
        human_bytes(s.bytes_per_sec)
    );
    println!(
        "waited for data: {:.1}% of the time ({:.3} s in next())",
        s.wait_fraction * 100.0,
        s.wait_secs
    );
    let st = &s.stages;
    println!(
        "stage busy time (summed over workers): read {:.3} s ({:.2} us/sample), transform {:.3} s \
         ({:.2} us/sample), collate {:.3} s ({:.1} us/batch)",
        st.read.busy_secs,
        st.read.micros_per_item(),
        st.transform.busy_secs,
        st.transform.micros_per_item(),
        st.collate.busy_secs,
        st.collate.micros_per_item(),
    );
    if st.skipped > 0 {
        println!(
            "skipped {} bad sample(s) (on_error = skip); the last ones:",
            st.skipped
        );
        for m in st.skipped_recent.iter().rev().take(5) {
            println!("  {m}");
        }
    }
    if let Some(r) = &s.remote {
        println!(
            "remote: {} fetched in {} requests ({} retries, {} failures), {} shards downloaded, \
             {} cache hits",
            human_bytes(r.bytes_fetched as f64),
            r.requests,
            r.retries,
            r.failures,
            r.shards_fetched,
            r.cache_hits
        );
    }
    if let Some(mb) = s.peak_rss_anon_mb {
        println!("peak anonymous memory (RssAnon): {mb:.1} MB");
    }
    if let Some(state) = &s.saved_state {
        println!(
            "saved state after {} batches: epoch {}, {} samples delivered",
            s.batches, state.epoch, state.delivered
        );
    }
    if let Some(d) = &s.digest {
        println!("digest: {d}");
    }
}

pub(crate) fn human_bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < UNITS.len() {
        v /= 1000.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}
