//! The `chute` command: `demo`, `bench`, `doctor`, `plan`, `tokens`, `convert`, `index`, `inspect`, `verify`, `cat`.

mod bench;
mod convert;
mod dataset_args;
mod demo;
mod doctor;
mod index;
mod inspect;
mod plan;
#[cfg(feature = "plot")]
mod plot;
#[cfg(not(feature = "plot"))]
mod plot {
    //! Without the `plot` feature, `--plot` says how to get it.
    use std::path::Path;

    fn missing() -> anyhow::Result<()> {
        anyhow::bail!("--plot: this chute was built without its `plot` feature (on by default)")
    }

    pub(crate) fn bench(
        _: &Path,
        _: &str,
        _: &[crate::bench::Point],
        _: &str,
    ) -> anyhow::Result<()> {
        missing()
    }

    pub(crate) fn doctor(_: &Path, _: &chute::doctor::Diagnosis) -> anyhow::Result<()> {
        missing()
    }

    pub(crate) fn check_name(_: &Path) -> anyhow::Result<()> {
        missing()
    }

    pub(crate) fn plan(_: &Path, _: &chute::core::planner::JobPlan) -> anyhow::Result<()> {
        missing()
    }
}
mod tokenize;
mod tokens;

use clap::{Parser, Subcommand};

/// Freed large blocks (decoded columns, images) are kept for reuse: see `CachingAlloc`.
#[global_allocator]
static ALLOC: chute::core::alloc::CachingAlloc = chute::core::alloc::CachingAlloc;

/// chute keeps accelerators fed: deterministic, resumable, parallel batches from sharded data.
#[derive(Debug, Parser)]
#[command(name = "chute", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Set a limit on sizes read from the data, NAME=N (repeatable): max_image_pixels
    /// (default 178956970), max_record_bytes and max_decoded_bytes (1073741824 each),
    /// max_features (100000), max_text_bytes (16777216). A size over one is a data error.
    #[arg(long = "limit", value_name = "NAME=N", global = true)]
    limits: Vec<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Build a synthetic dataset in a temporary folder and train on it for two epochs with a
    /// simulated step, showing throughput and how long the step waited for data.
    Demo(demo::DemoArgs),
    /// Run the loader over a dataset and report throughput, wait time and per-stage figures.
    Bench(Box<bench::BenchArgs>),
    /// Run the pipeline briefly on a dataset and say which stage binds (read, transform,
    /// collate), how many workers keep a given step fed, and what else to change.
    Doctor(Box<doctor::DoctorArgs>),
    /// Compute, without reading data, what each rank and node of a job reads: samples,
    /// batches, shards, bytes to download, shards split between ranks, samples dropped or
    /// repeated, and with --bandwidth / --step-ms the epoch time and the steps' wait.
    Plan(Box<plan::PlanArgs>),
    /// Write a token file (flat little-endian uint16/uint32 ids) from text or .npy.
    Tokens(tokens::TokensArgs),
    /// Tokenize text (JSON Lines, Parquet, Arrow, text files) with a tokenizer.json into a
    /// Megatron indexed dataset (.bin + .idx) or a token file, in parallel.
    Tokenize(tokenize::TokenizeArgs),
    /// Convert CSV, JSON Lines, an ImageFolder-style folder or .npy arrays to WebDataset,
    /// TFRecord or Parquet shards, in parallel.
    Convert(convert::ConvertArgs),
    /// Write each shard's index file (tar, TFRecord) and the dataset's manifest.json, so the
    /// loader can shuffle globally and split ranks exactly without scanning.
    Index(index::IndexArgs),
    /// Show a dataset's format, fields, sample count, sizes and first records.
    Inspect(inspect::InspectArgs),
    /// Read every record of every shard; report each problem with its shard and byte offset
    /// (exit status 1 if there is any).
    Verify(inspect::VerifyArgs),
    /// Print records as JSON lines.
    Cat(inspect::CatArgs),
}

/// A reader that stops reading (`chute inspect ... | head`) ends chute quietly with status 0,
/// as `chute cat` stops when its reader is gone, not with a panic's message. Rust ignores
/// SIGPIPE (so sockets report a closed peer as an error), and `println!` panics when stdout's
/// reader is gone; this hook turns that one panic into the exit.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.contains("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(0);
        }
        default(info);
    }));
}

fn main() -> std::process::ExitCode {
    quiet_on_closed_stdout();
    let cli = Cli::parse();
    let mut limits = chute::core::Limits::current();
    for assignment in &cli.limits {
        match limits.with_assignment(assignment) {
            Ok(l) => limits = l,
            Err(e) => {
                eprintln!("error: --limit: {e}");
                return std::process::ExitCode::from(2);
            }
        }
    }
    limits.install();
    chute::read_files_with_io();
    let result = match cli.command {
        Command::Demo(a) => demo::run(a),
        Command::Bench(a) => bench::run(*a),
        Command::Doctor(a) => doctor::run(*a),
        Command::Plan(a) => plan::run(*a),
        Command::Tokens(a) => tokens::run(a),
        Command::Tokenize(a) => tokenize::run(a),
        Command::Convert(a) => convert::run(a),
        Command::Index(a) => index::run(a),
        Command::Inspect(a) => inspect::inspect(a),
        Command::Verify(a) => inspect::verify(a),
        Command::Cat(a) => inspect::cat(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", chute::core::redact::redact(&message(&e)));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, leaving out a cause whose text the line already
/// holds (chute's errors name their cause in their own message).
fn message(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}
