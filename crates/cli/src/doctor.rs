//! `chute doctor`: the pipeline run briefly on the user's data, each stage alone and the
//! whole with a few worker counts, and the bottleneck named with what to change
//! ([`chute::doctor`]).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::bail;
use chute::doctor::{Context, DoctorOptions};
use clap::Args;

use crate::bench::LoaderArgs;
use crate::dataset_args::DatasetArgs;

/// `chute doctor` arguments.
#[derive(Debug, Clone, Args)]
pub(crate) struct DoctorArgs {
    #[command(flatten)]
    dataset: DatasetArgs,
    #[command(flatten)]
    loader: LoaderArgs,
    /// The training step's time per batch, in milliseconds: the doctor predicts how long it
    /// would wait for data, and recommends the workers that keep it fed.
    #[arg(long, value_name = "MS", conflicts_with = "target_samples_per_s")]
    step_ms: Option<f64>,
    /// Or the samples per second the training needs.
    #[arg(long, value_name = "R")]
    target_samples_per_s: Option<f64>,
    /// Seconds each measurement runs (each stage alone, each worker count).
    #[arg(long, default_value_t = 1.5, value_name = "SECS")]
    seconds: f64,
    /// Worker counts to try, comma-separated (default: 1, 2, 4... up to twice the cores).
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    try_workers: Vec<usize>,
    /// Print the diagnosis as JSON.
    #[arg(long)]
    json: bool,
    /// Write charts (each stage alone, throughput per worker count) to FILE: a PNG, or a
    /// self-contained page when the name ends in .html.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
}

pub(crate) fn run(args: DoctorArgs) -> anyhow::Result<()> {
    if !(args.seconds > 0.0 && args.seconds <= 3600.0) {
        bail!(
            "--seconds must be more than 0 and at most 3600, got {}",
            args.seconds
        );
    }
    let step = match args.step_ms {
        Some(ms) if ms > 0.0 && ms <= 86_400_000.0 => Some(Duration::from_secs_f64(ms / 1e3)),
        Some(ms) => bail!("--step-ms must be more than 0, got {ms}"),
        None => None,
    };
    if let Some(r) = args.target_samples_per_s
        && !(r > 0.0 && r.is_finite())
    {
        bail!("--target-samples-per-s must be more than 0, got {r}");
    }
    if let Some(p) = &args.plot {
        crate::plot::check_name(p)?;
    }
    let t0 = Instant::now();
    let source = args.dataset.open()?;
    let opened_in = t0.elapsed();
    let loader = args.loader.build(source)?;
    let options = DoctorOptions {
        trial: Duration::from_secs_f64(args.seconds),
        step,
        target_samples_per_sec: args.target_samples_per_s,
        workers: args.try_workers.clone(),
    };
    if !args.json {
        eprintln!(
            "chute doctor: measuring (about {:.0} s)...",
            estimate(&args)
        );
    }
    let context = Context {
        ops: args.loader.transform.as_ref(),
        opened_in: Some(opened_in),
    };
    let d = chute::doctor::diagnose(&loader, &options, context, None)?;
    if args.json {
        println!(
            "{}",
            chute::core::redact::redact(&serde_json::to_string_pretty(&d)?)
        );
    } else {
        print!("{}", d.to_text());
    }
    if let Some(path) = &args.plot {
        crate::plot::doctor(path, &d)?;
        if !args.json {
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// About how long the measurements take.
fn estimate(args: &DoctorArgs) -> f64 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let trials = if args.try_workers.is_empty() {
        (2 * cores).ilog2() as usize + 2
    } else {
        args.try_workers.len()
    };
    args.seconds * (2.5 + trials as f64)
}
