//! The doctor: runs a loader's stages alone and together, briefly, on its own data, and says
//! which one binds, how many workers keep a given training step fed, and what else to change.
//!
//! [`diagnose`] measures, each for [`DoctorOptions::trial`]:
//!
//! 1. **read** alone: `Source::read_many` in plan order on one thread;
//! 2. **transform** alone: the loader's transforms on the samples read, one thread;
//! 3. **collate** alone: those samples collated into batches, one thread;
//! 4. **consumer**: the caller's per-batch hand-over (`crossing`: Python's conversion of a
//!    batch into tensors), timed during the next trials;
//! 5. **whole**: the loader itself with each worker count of [`DoctorOptions::workers`].
//!
//! A worker runs read, transform and collate one after the other, so its cost per sample is
//! the sum of the three: the largest share binds the workers. The consumer binds when the best
//! whole throughput is close to what the hand-over alone allows. The recommended worker count
//! is the smallest measured one that delivers the required rate (`batch_size / step`, or the
//! target) with a margin, or else the one within 5% of the best; the predicted wait fraction
//! for the step follows from the measured rate: a step of `S` seconds waits
//! `max(0, batch_size / rate - S)` per batch. The rules that apply to every loader (worker
//! count, prefetch depth, a stage that does not scale, a consumer-bound pipeline) are here;
//! rules that need to know formats and ops (files not indexed, remote read-ahead, shuffle of a
//! streaming source, reduced-size JPEG decodes, page cache misses) are the facade's
//! (`chute::doctor`), which adds them to [`Diagnosis::advice`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use chute_core::{Batch, ConfigError, Error, Field, Sample, SampleRng};
use serde::Serialize;

use crate::Loader;
use crate::collate::collate_samples;

/// How [`diagnose`] runs.
#[derive(Debug, Clone)]
pub struct DoctorOptions {
    /// How long each measurement runs (each stage alone, each worker count). Default 1.5 s.
    pub trial: Duration,
    /// The training step's time per batch, if known: the doctor then predicts the wait.
    pub step: Option<Duration>,
    /// Or the samples per second the training needs.
    pub target_samples_per_sec: Option<f64>,
    /// Worker counts to try (empty: 1, 2, 4... up to twice the cores, the cores, and the
    /// loader's own).
    pub workers: Vec<usize>,
}

impl Default for DoctorOptions {
    fn default() -> Self {
        DoctorOptions {
            trial: Duration::from_millis(1500),
            step: None,
            target_samples_per_sec: None,
            workers: Vec::new(),
        }
    }
}

/// One stage measured alone.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StageFigure {
    /// `read`, `transform`, `collate` or `consumer`.
    pub stage: String,
    /// Samples per second on one thread.
    pub samples_per_sec: f64,
    /// Mean seconds per sample.
    pub secs_per_sample: f64,
    /// Samples measured.
    pub samples: u64,
}

/// The whole loader with one worker count.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Trial {
    /// Worker threads.
    pub workers: usize,
    /// Prefetch depth.
    pub prefetch: usize,
    /// Samples delivered per second (the first batch, start-up, excluded).
    pub samples_per_sec: f64,
    /// Batches measured.
    pub batches: u64,
    /// Median and 95th percentile of the time between two deliveries, in milliseconds.
    pub gap_p50_ms: f64,
    /// See `gap_p50_ms`.
    pub gap_p95_ms: f64,
    /// The fraction of a step's time it would wait for data at this rate (with a step or
    /// target given).
    pub predicted_wait_fraction: Option<f64>,
    /// How the workers' busy time split between read, transform and collate during the
    /// measurement (shares of their sum).
    pub busy_shares: Vec<(String, f64)>,
}

/// One piece of advice: the rule that produced it and what to do.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Advice {
    /// The rule's name (`workers`, `prefetch`, `not-indexed`...).
    pub rule: String,
    /// What was found and what to change, in plain words.
    pub message: String,
}

/// What [`diagnose`] found.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Diagnosis {
    /// Samples per batch.
    pub batch_size: usize,
    /// Cores available to the process.
    pub cores: usize,
    /// The loader's own worker count and prefetch depth.
    pub num_workers: usize,
    /// See `num_workers`.
    pub prefetch: usize,
    /// The first sample's fields, described (`jpg: JPEG image (110 KB)`...).
    pub fields: Vec<(String, String)>,
    /// The shapes of the array fields the transforms made of that sample.
    pub output_shapes: Vec<(String, Vec<usize>)>,
    /// Each stage alone.
    pub stages: Vec<StageFigure>,
    /// The whole loader per worker count, in the order tried.
    pub trials: Vec<Trial>,
    /// The stage that binds: `read`, `transform`, `collate` or `consumer`.
    pub bottleneck: String,
    /// Each worker stage's share of the workers' busy time in the fastest trial (read,
    /// transform, collate); from the stages alone when the trials measured none.
    pub worker_shares: Vec<(String, f64)>,
    /// The samples per second the step or the target needs.
    pub required_samples_per_sec: Option<f64>,
    /// Worker threads that keep the step fed (or give the best throughput).
    pub recommended_workers: usize,
    /// Prefetch depth that absorbs the measured jitter.
    pub recommended_prefetch: usize,
    /// The throughput measured with the recommended workers.
    pub expected_samples_per_sec: f64,
    /// The wait fraction predicted for the step with the recommended workers.
    pub predicted_wait_fraction: Option<f64>,
    /// What to change, rule by rule.
    pub advice: Vec<Advice>,
}

impl Diagnosis {
    /// A stage's figure, by name.
    pub fn stage(&self, name: &str) -> Option<&StageFigure> {
        self.stages.iter().find(|s| s.stage == name)
    }

    /// The trial with `workers` threads, if one ran.
    pub fn trial(&self, workers: usize) -> Option<&Trial> {
        self.trials.iter().find(|t| t.workers == workers)
    }

    /// Adds a piece of advice.
    pub fn advise(&mut self, rule: &str, message: impl Into<String>) {
        self.advice.push(Advice {
            rule: rule.into(),
            message: message.into(),
        });
    }

    /// True if a rule of this name gave advice.
    pub fn has(&self, rule: &str) -> bool {
        self.advice.iter().any(|a| a.rule == rule)
    }

    /// The report in plain words.
    pub fn to_text(&self) -> String {
        use std::fmt::Write as _;
        let mut t = String::new();
        let _ = writeln!(
            t,
            "batch size {}, {} cores, the loader as given: {} workers, prefetch {}",
            self.batch_size, self.cores, self.num_workers, self.prefetch
        );
        if !self.fields.is_empty() {
            let fields: Vec<String> = self
                .fields
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            let _ = writeln!(t, "a sample: {}", fields.join(", "));
        }
        let _ = writeln!(t, "\neach stage alone, one thread:");
        for s in &self.stages {
            let _ = writeln!(
                t,
                "  {:<10} {:>12} samples/s  ({:.1} us a sample)",
                s.stage,
                rate(s.samples_per_sec),
                s.secs_per_sample * 1e6
            );
        }
        let _ = writeln!(t, "\nthe whole loader:");
        for r in &self.trials {
            let wait = r
                .predicted_wait_fraction
                .map(|w| format!(", the step would wait {:.0}%", w * 100.0))
                .unwrap_or_default();
            let _ = writeln!(
                t,
                "  {:>3} workers {:>12} samples/s{wait}",
                r.workers,
                rate(r.samples_per_sec)
            );
        }
        let shares: Vec<String> = self
            .worker_shares
            .iter()
            .map(|(s, f)| format!("{s} {:.0}%", f * 100.0))
            .collect();
        let _ = writeln!(
            t,
            "\nbottleneck: {} (the workers' time: {})",
            self.bottleneck,
            shares.join(", ")
        );
        if let Some(r) = self.required_samples_per_sec {
            let _ = writeln!(t, "the step needs {} samples/s", rate(r));
        }
        let wait = self
            .predicted_wait_fraction
            .map(|w| format!(", the step would wait {:.0}% of the time", w * 100.0))
            .unwrap_or_default();
        let _ = writeln!(
            t,
            "recommended: num_workers={}, prefetch={} -> {} samples/s{wait}",
            self.recommended_workers,
            self.recommended_prefetch,
            rate(self.expected_samples_per_sec)
        );
        if !self.advice.is_empty() {
            let _ = writeln!(t, "\nadvice:");
            for a in &self.advice {
                let _ = writeln!(t, "  [{}] {}", a.rule, a.message);
            }
        }
        t
    }
}

fn rate(x: f64) -> String {
    if x >= 100.0 {
        format!("{:.0}", x)
    } else {
        format!("{:.1}", x)
    }
}

/// The consumer's hand-over of each batch (in Python: the conversion into tensors), timed by
/// the doctor; it returns false to stop the doctor (an interrupt), which then fails.
pub type Crossing<'a> = &'a mut dyn FnMut(Batch) -> bool;

/// Runs the doctor on `loader`'s source, transforms and options (the loader itself is not
/// advanced; its source is given the loader's plan again at the end, but a source's own
/// counters, such as samples per part of a source made of several, include the doctor's
/// reads). Fails with the first error a stage met (a sample that does not read, say), or when
/// `crossing` asks to stop.
pub fn diagnose(
    loader: &Loader,
    options: &DoctorOptions,
    mut crossing: Option<Crossing<'_>>,
) -> Result<Diagnosis, Error> {
    let o = loader.options().clone();
    let source = Arc::clone(loader.source());
    let transform = loader.transform().cloned();
    let plan = loader.plan()?;
    source.set_plan(&plan);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let trial = options.trial.max(Duration::from_millis(50));
    let n = plan.len();

    // 1. read alone.
    let mut kept: Vec<Sample> = Vec::new();
    let mut kept_bytes = 0usize;
    let (mut read, mut pos) = (0u64, 0u64);
    let t0 = Instant::now();
    while pos < n && t0.elapsed() < trial {
        let ids: Vec<u64> = (pos..(pos + 32).min(n)).map(|i| plan.get(i)).collect();
        pos += ids.len() as u64;
        for s in source.read_many(&ids) {
            let s = s?;
            read += 1;
            if kept_bytes < KEEP_BYTES / 2 && kept.len() < KEEP_SAMPLES {
                kept_bytes += sample_bytes(&s);
                kept.push(s);
            }
        }
    }
    let read_secs = t0.elapsed().as_secs_f64();
    let fields = kept.first().map(describe_fields).unwrap_or_default();
    let mut stages = vec![figure("read", read, read_secs)];

    // 2. transform alone, over the kept samples (again and again if they run out).
    let mut transformed: Vec<Sample> = Vec::with_capacity(kept.len());
    let mut transformed_bytes = 0usize;
    if let Some(t) = &transform
        && !kept.is_empty()
    {
        let (mut done, t0) = (0u64, Instant::now());
        while t0.elapsed() < trial {
            let mut s = kept[done as usize % kept.len()].clone();
            let mut rng = SampleRng::for_sample(o.seed, loader.epoch(), s.index);
            t.apply(&mut s, &mut rng)
                .map_err(|source| Error::Transform {
                    sample: chute_core::SampleRef {
                        index: s.index,
                        key: s.key.clone(),
                        shard: String::new(),
                    },
                    source,
                })?;
            if transformed.len() < kept.len() && transformed_bytes < KEEP_BYTES / 2 {
                transformed_bytes += sample_bytes(&s);
                transformed.push(s);
            }
            done += 1;
        }
        stages.push(figure("transform", done, t0.elapsed().as_secs_f64()));
    } else {
        transformed = kept;
        stages.push(figure("transform", 0, 0.0));
    }

    // 3. collate alone.
    let b = o.batch_size.max(1);
    if !transformed.is_empty() && transformed.len() < b {
        let have = transformed.len();
        for k in 0..b - have {
            let s = transformed[k % have].clone();
            transformed.push(s);
        }
    }
    if transformed.len() >= b {
        let pool = chute_core::BufferPool::new(8);
        let batches = transformed.len() / b;
        let (mut done, t0) = (0u64, Instant::now());
        while t0.elapsed() < trial {
            let k = (done as usize) % batches;
            collate_samples(&transformed[k * b..(k + 1) * b], &pool, o.pad)?;
            done += 1;
        }
        stages.push(figure(
            "collate",
            done * b as u64,
            t0.elapsed().as_secs_f64(),
        ));
    } else {
        stages.push(figure("collate", 0, 0.0));
    }
    let output_shapes = transformed
        .first()
        .map(|s| {
            s.fields
                .iter()
                .filter_map(|(k, f)| match f {
                    Field::Array(a) => Some((k.to_string(), a.shape.clone())),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    drop(transformed);

    // 4 and 5. the whole loader per worker count, the consumer's hand-over timed.
    let mut counts = options.workers.clone();
    if counts.is_empty() {
        let mut w = 1;
        while w <= 2 * cores {
            counts.push(w);
            w *= 2;
        }
        counts.push(cores);
        counts.push(o.num_workers);
    }
    counts.sort_unstable();
    counts.dedup();
    let mut trials = Vec::new();
    let (mut cross_secs, mut cross_samples) = (0.0, 0u64);
    for &w in &counts {
        let mut opts = o.clone();
        opts.num_workers = w;
        opts.prefetch = o.prefetch.max(1);
        opts.name = "doctor".into();
        opts.metrics_addr = None;
        let mut builder = Loader::builder_arc(Arc::clone(&source)).options(opts);
        if let Some(t) = &transform {
            builder = builder.transform_arc(Arc::clone(t));
        }
        let mut l = builder.build()?;
        l.set_epoch(loader.epoch());
        // Timed after a warm-up: the start-up (threads, the first batches built side by side,
        // then handed over in a burst) is skipped, and the rate is that of the batches after
        // the first `workers + 1` and a tenth of the trial, over as many epochs as the trial
        // takes (each epoch's own start-up then counts, as in training). A trial too slow to
        // warm up is timed from its start instead.
        let warm_batches = w as u64 + 1;
        let mut gaps = Vec::new();
        let (mut seen, mut samples, mut batches, mut all_samples) = (0u64, 0u64, 0u64, 0u64);
        let mut started: Option<Instant> = None;
        let mut busy_before = [0.0; 3];
        let mut last = Instant::now();
        let t0 = Instant::now();
        'trial: loop {
            let mut any = false;
            // Not a `for` loop: the loader's stats are read between batches.
            #[allow(clippy::while_let_on_iterator)]
            while let Some(batch) = l.next() {
                let batch = batch?;
                any = true;
                let now = Instant::now();
                let len = batch.len() as u64;
                if let Some(c) = crossing.as_mut() {
                    let tc = Instant::now();
                    let go_on = c(batch);
                    cross_secs += tc.elapsed().as_secs_f64();
                    cross_samples += len;
                    if !go_on {
                        source.set_plan(&plan);
                        return Err(ConfigError::new(
                            "doctor",
                            "stopped by the consumer (interrupted)",
                        )
                        .into());
                    }
                } else {
                    drop(batch);
                }
                seen += 1;
                match started {
                    None if seen >= warm_batches && t0.elapsed() >= trial / 10 => {
                        started = Some(Instant::now());
                        busy_before = busy(&l);
                    }
                    None => {}
                    Some(_) => {
                        samples += len;
                        batches += 1;
                        gaps.push(now.duration_since(last).as_secs_f64());
                    }
                }
                all_samples += len;
                last = now;
                let enough = t0.elapsed() >= trial && batches >= 3;
                if enough || t0.elapsed() >= trial.saturating_mul(4) {
                    break 'trial;
                }
            }
            if !any {
                break;
            }
        }
        let (samples, secs) = match started {
            Some(s) => (samples, s.elapsed().as_secs_f64()),
            None => (all_samples, t0.elapsed().as_secs_f64()),
        };
        let busy_after = busy(&l);
        let spent: Vec<f64> = (0..3)
            .map(|k| (busy_after[k] - busy_before[k]).max(0.0))
            .collect();
        let total: f64 = spent.iter().sum();
        let busy_shares = STAGES
            .iter()
            .zip(&spent)
            .map(|(s, x)| (s.to_string(), if total > 0.0 { x / total } else { 0.0 }))
            .collect();
        gaps.sort_by(f64::total_cmp);
        let pct = |p: f64| {
            if gaps.is_empty() {
                0.0
            } else {
                gaps[((gaps.len() - 1) as f64 * p).round() as usize] * 1e3
            }
        };
        trials.push(Trial {
            workers: w,
            prefetch: o.prefetch.max(1),
            samples_per_sec: if secs > 0.0 {
                samples as f64 / secs
            } else {
                0.0
            },
            batches,
            gap_p50_ms: pct(0.5),
            gap_p95_ms: pct(0.95),
            predicted_wait_fraction: None,
            busy_shares,
        });
    }
    // The loader's source reads the loader's plan again.
    source.set_plan(&plan);
    if crossing.is_some() {
        stages.push(figure("consumer", cross_samples, cross_secs));
    }

    let required = match (options.step, options.target_samples_per_sec) {
        (_, Some(r)) if r > 0.0 => Some(r),
        (Some(s), _) if !s.is_zero() => Some(b as f64 / s.as_secs_f64()),
        _ => None,
    };
    let step = required.map(|r| b as f64 / r);
    for t in &mut trials {
        t.predicted_wait_fraction = step.map(|s| wait_fraction(s, b, t.samples_per_sec));
    }
    let mut d = Diagnosis {
        batch_size: b,
        cores,
        num_workers: o.num_workers,
        prefetch: o.prefetch,
        fields,
        output_shapes,
        stages,
        trials,
        bottleneck: String::new(),
        worker_shares: Vec::new(),
        required_samples_per_sec: required,
        recommended_workers: o.num_workers,
        recommended_prefetch: o.prefetch,
        expected_samples_per_sec: 0.0,
        predicted_wait_fraction: None,
        advice: Vec::new(),
    };
    conclude(&mut d);
    Ok(d)
}

/// The worker stages, in order.
const STAGES: [&str; 3] = ["read", "transform", "collate"];

/// The busy seconds of each worker stage so far.
fn busy(l: &Loader) -> [f64; 3] {
    let s = l.stats();
    [s.read.busy_secs, s.transform.busy_secs, s.collate.busy_secs]
}

/// Samples kept from the read stage for the transform and collate stages.
const KEEP_SAMPLES: usize = 4096;
const KEEP_BYTES: usize = 256 << 20;

fn figure(stage: &str, samples: u64, secs: f64) -> StageFigure {
    StageFigure {
        stage: stage.into(),
        samples_per_sec: if secs > 0.0 {
            samples as f64 / secs
        } else {
            0.0
        },
        secs_per_sample: if samples > 0 {
            secs / samples as f64
        } else {
            0.0
        },
        samples,
    }
}

fn sample_bytes(s: &Sample) -> usize {
    s.fields
        .iter()
        .map(|(_, f)| match f {
            Field::Bytes(b) | Field::Text(b) => b.len(),
            Field::Array(a) => a.data.len(),
            _ => 0,
        })
        .sum()
}

/// The fields of a sample as `(name, what it holds)`, encoded images named by their magic.
fn describe_fields(s: &Sample) -> Vec<(String, String)> {
    s.fields
        .iter()
        .map(|(k, f)| {
            let what = match f {
                Field::Bytes(b) if b.starts_with(&[0xFF, 0xD8, 0xFF]) => {
                    format!("JPEG image ({} bytes)", b.len())
                }
                Field::Bytes(b) if b.starts_with(b"\x89PNG") => {
                    format!("PNG image ({} bytes)", b.len())
                }
                f => f.describe(),
            };
            (k.to_string(), what)
        })
        .collect()
}

/// The fraction of the time a step of `step` seconds waits when the loader delivers `rate`
/// samples per second in batches of `b`.
pub fn wait_fraction(step: f64, b: usize, rate: f64) -> f64 {
    if rate <= 0.0 {
        return 1.0;
    }
    let produce = b as f64 / rate;
    let wait = (produce - step).max(0.0);
    wait / (step + wait)
}

/// The bottleneck, the recommendations and the rules every loader has.
fn conclude(d: &mut Diagnosis) {
    // Where the workers spent their time in the fastest trial (a stage that waits on the
    // network or a lock shows there, whatever it costs alone); failing that, the stages'
    // costs alone (a worker runs the three in turn).
    let fastest = d
        .trials
        .iter()
        .filter(|t| t.busy_shares.iter().any(|(_, x)| *x > 0.0))
        .max_by(|a, b| a.samples_per_sec.total_cmp(&b.samples_per_sec));
    d.worker_shares = match fastest {
        Some(t) => t.busy_shares.clone(),
        None => {
            let cost: Vec<f64> = STAGES
                .iter()
                .map(|name| d.stage(name).map_or(0.0, |s| s.secs_per_sample))
                .collect();
            let total: f64 = cost.iter().sum();
            STAGES
                .iter()
                .zip(&cost)
                .map(|(s, c)| (s.to_string(), if total > 0.0 { c / total } else { 0.0 }))
                .collect()
        }
    };
    let mut bottleneck = d
        .worker_shares
        .iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map_or("read".to_string(), |(s, _)| s.clone());
    let best = d
        .trials
        .iter()
        .map(|t| t.samples_per_sec)
        .fold(0.0f64, f64::max);
    let consumer_limit = d
        .stage("consumer")
        .filter(|s| s.secs_per_sample > 0.0)
        .map(|s| 1.0 / s.secs_per_sample);
    if let Some(limit) = consumer_limit
        && best >= 0.8 * limit
    {
        bottleneck = "consumer".into();
    }
    d.bottleneck = bottleneck;

    // The recommendation: the fewest workers that keep up, else about the best.
    let pick = match d.required_samples_per_sec {
        Some(r) => d
            .trials
            .iter()
            .filter(|t| t.samples_per_sec >= 1.1 * r)
            .min_by_key(|t| t.workers)
            .or_else(|| near_best(&d.trials, best)),
        None => near_best(&d.trials, best),
    };
    if let Some(t) = pick.cloned() {
        d.recommended_workers = t.workers;
        d.expected_samples_per_sec = t.samples_per_sec;
        d.predicted_wait_fraction = t.predicted_wait_fraction;
        // Bursty deliveries (shard downloads, uneven samples) need a deeper queue: enough
        // slots to cover the slow gaps.
        // (A gap under a millisecond is noise, whatever the ratio.)
        d.recommended_prefetch = if t.gap_p95_ms >= 1.0 && t.gap_p95_ms > 2.0 * t.gap_p50_ms {
            ((t.gap_p95_ms / t.gap_p50_ms.max(0.1)).ceil() as usize).clamp(2, 16)
        } else {
            2
        };
    }
    let current = d.trial(d.num_workers).cloned();
    if d.recommended_workers != d.num_workers {
        let now = current
            .as_ref()
            .map(|t| {
                format!(
                    " ({} samples/s with {})",
                    rate(t.samples_per_sec),
                    d.num_workers
                )
            })
            .unwrap_or_default();
        let message = match d.required_samples_per_sec {
            Some(r) if d.recommended_workers < d.num_workers => format!(
                "num_workers={} is enough: {} samples/s against the {} the step needs{now}; \
                 the spare cores can go to the training process",
                d.recommended_workers,
                rate(d.expected_samples_per_sec),
                rate(r)
            ),
            _ => format!(
                "use num_workers={} instead of {}: {} samples/s{now}",
                d.recommended_workers,
                d.num_workers,
                rate(d.expected_samples_per_sec)
            ),
        };
        d.advise("workers", message);
    }
    if d.recommended_prefetch > d.prefetch
        && let Some(t) = d.trial(d.recommended_workers).cloned()
    {
        let message = format!(
            "use prefetch={}: batches arrive unevenly (a 95th percentile gap of {:.1} ms \
             against a median of {:.1} ms), and a deeper queue rides out the slow ones",
            d.recommended_prefetch, t.gap_p95_ms, t.gap_p50_ms
        );
        d.advise("prefetch", message);
    }
    // A worker stage that does not scale: two workers barely beat one.
    if let (Some(one), Some(two)) = (d.trial(1), d.trial(2))
        && d.cores >= 2
        && one.samples_per_sec > 0.0
        && two.samples_per_sec < 1.25 * one.samples_per_sec
        && d.bottleneck != "consumer"
    {
        let message = format!(
            "throughput does not grow with workers ({} samples/s with 1, {} with 2): the {} \
             stage runs one at a time (a Python transform holding the GIL, a lock in the \
             source, or the storage's bandwidth); native ops (JSON op specs) run without the \
             GIL",
            rate(one.samples_per_sec),
            rate(two.samples_per_sec),
            d.bottleneck
        );
        d.advise("no-scaling", message);
    }
    if d.bottleneck == "consumer"
        && let Some(limit) = consumer_limit
    {
        let message = format!(
            "the consumer's hand-over binds: it takes {:.2} ms a batch, so at most {} samples/s \
             reach the training step whatever the workers do; convert fewer columns, or use \
             output=\"numpy\"/\"torch\" without extra copies in the loop",
            d.batch_size as f64 / limit * 1e3,
            rate(limit)
        );
        d.advise("consumer", message);
    }
}

fn near_best(trials: &[Trial], best: f64) -> Option<&Trial> {
    trials
        .iter()
        .filter(|t| t.samples_per_sec >= 0.95 * best)
        .min_by_key(|t| t.workers)
}
