//! `chute plan`: what every rank and node of a job will read, from the manifest and the
//! options alone ([`chute::core::planner`]), without reading data.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::bail;
use chute::core::Shuffle;
use chute::core::planner::{JobPlan, PlanQuery, plan_job};
use clap::Args;

use crate::bench::{human_bytes, parse_shuffle};
use crate::dataset_args::DatasetArgs;

/// `chute plan` arguments.
#[derive(Debug, Clone, Args)]
pub(crate) struct PlanArgs {
    #[command(flatten)]
    dataset: DatasetArgs,
    /// Ranks in all (torchrun's WORLD_SIZE).
    #[arg(long, default_value_t = 1)]
    world_size: u64,
    /// Nodes (machines) the ranks run on, world_size / nodes each.
    #[arg(long, default_value_t = 1)]
    nodes: u64,
    /// Samples per batch.
    #[arg(long, default_value_t = 16)]
    batch_size: u64,
    /// Ordering: none, global, block or block:N [default: global].
    #[arg(long, value_parser = parse_shuffle)]
    shuffle: Option<Shuffle>,
    /// Seed of the run.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// First epoch.
    #[arg(long, default_value_t = 0)]
    epoch: u64,
    /// Epochs to plan.
    #[arg(long, default_value_t = 1)]
    epochs: u64,
    /// Drop each rank's last incomplete batch.
    #[arg(long)]
    drop_last: bool,
    /// Bytes per second of each node's link (K/M/G suffixes: 1.25G), for the time estimate.
    #[arg(long, value_name = "BYTES_PER_S")]
    bandwidth: Option<String>,
    /// The training step per batch in milliseconds, for the time estimate.
    #[arg(long, value_name = "MS")]
    step_ms: Option<f64>,
    /// Print every rank's figures too.
    #[arg(long)]
    ranks: bool,
    /// Print the plan as JSON (every rank and node of every epoch).
    #[arg(long)]
    json: bool,
    /// Chart the bytes each node downloads per epoch to FILE (.png or .html).
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
}

pub(crate) fn run(args: PlanArgs) -> anyhow::Result<()> {
    if let Some(p) = &args.plot {
        crate::plot::check_name(p)?;
    }
    if args.epochs == 0 {
        bail!("--epochs must be at least 1");
    }
    let bandwidth = match &args.bandwidth {
        Some(b) => {
            let v = chute::io::parse_size(b)
                .map_err(|why| anyhow::anyhow!("--bandwidth {b:?}: {why}"))?;
            if v == 0 {
                bail!("--bandwidth must be more than 0");
            }
            Some(v as f64)
        }
        None => None,
    };
    if let Some(ms) = args.step_ms
        && !(ms > 0.0 && ms.is_finite())
    {
        bail!("--step-ms must be more than 0, got {ms}");
    }
    let source = args.dataset.open()?;
    let manifest = source.manifest();
    let query = PlanQuery {
        seed: args.seed,
        shuffle: args.shuffle.unwrap_or(Shuffle::Global),
        world_size: args.world_size,
        nodes: args.nodes,
        batch_size: args.batch_size,
        drop_last: args.drop_last,
        first_epoch: args.epoch,
        epochs: args.epochs,
        bandwidth,
        step_secs: args.step_ms.map(|ms| ms / 1e3),
    };
    let t0 = Instant::now();
    let job = plan_job(manifest, &query)?;
    let took = t0.elapsed();
    if args.json {
        println!(
            "{}",
            chute::core::redact::redact(&serde_json::to_string_pretty(&job)?)
        );
    } else {
        print!("{}", text(&job, args.ranks));
        println!("planned in {:.2} s", took.as_secs_f64());
    }
    if let Some(path) = &args.plot {
        crate::plot::plan(path, &job)?;
        if !args.json {
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// The plan in plain words.
fn text(job: &JobPlan, ranks: bool) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "{} samples in {} shards ({}), {} ranks on {} nodes, shuffle {}",
        job.total_samples,
        job.shards,
        human_bytes(job.total_bytes as f64),
        job.world_size,
        job.nodes,
        job.shuffle
    );
    let equalize = match (job.dropped, job.repeated) {
        (0, 0) => "every sample once".to_string(),
        (d, 0) => format!("{d} samples dropped (drop_last)"),
        (_, r) => format!("{r} samples repeated so every rank has as many"),
    };
    let _ = writeln!(
        t,
        "each rank: {} samples, {} batches an epoch; {equalize}",
        job.samples_per_rank, job.batches_per_rank
    );
    let _ = writeln!(
        t,
        "{}",
        if job.streams_whole_shards {
            "shards stream whole (each rank reads a run of whole shards)"
        } else {
            "samples are read by range from the shards (global shuffle, or ranks strided \
             through them): bytes are the samples' mean size times their number"
        }
    );
    for e in &job.epochs {
        let mut per_node: Vec<u64> = e.nodes.iter().map(|k| k.bytes).collect();
        per_node.sort_unstable();
        let _ = writeln!(
            t,
            "\nepoch {}: the nodes download {} (per node: min {}, median {}, max {}); {} shards \
             read by more than one rank, {} by more than one node",
            e.epoch,
            human_bytes(e.bytes as f64),
            human_bytes(*per_node.first().unwrap_or(&0) as f64),
            human_bytes(per_node.get(per_node.len() / 2).copied().unwrap_or(0) as f64),
            human_bytes(*per_node.last().unwrap_or(&0) as f64),
            e.shards_split_across_ranks,
            e.shards_split_across_nodes
        );
        if let Some(secs) = e.epoch_secs {
            let parts = match (
                e.compute_secs,
                e.nodes
                    .iter()
                    .filter_map(|k| k.download_secs)
                    .reduce(f64::max),
            ) {
                (Some(c), Some(d)) => {
                    format!("steps {c:.1} s, the slowest node's downloads {d:.1} s")
                }
                (Some(c), None) => format!("steps {c:.1} s"),
                (None, Some(d)) => format!("the slowest node's downloads {d:.1} s"),
                (None, None) => String::new(),
            };
            let wait = e
                .wait_fraction
                .map(|w| format!("; the steps would wait {:.0}% of it", w * 100.0))
                .unwrap_or_default();
            let _ = writeln!(t, "  about {secs:.1} s an epoch ({parts}){wait}");
        }
        if e.nodes.len() <= 32 {
            for k in &e.nodes {
                let _ = writeln!(
                    t,
                    "  node {:>3} (ranks {}..{}): {} samples, {:.0} shards, {}",
                    k.node,
                    k.first_rank,
                    k.first_rank + k.ranks,
                    k.samples,
                    k.shards,
                    human_bytes(k.bytes as f64)
                );
            }
        }
        if ranks {
            for r in &e.ranks {
                let _ = writeln!(
                    t,
                    "  rank {:>5} (node {}): {} samples, {} batches, {:.1} shards, {}",
                    r.rank,
                    r.node,
                    r.samples,
                    r.batches,
                    r.shards,
                    human_bytes(r.bytes as f64)
                );
            }
        }
    }
    t
}
