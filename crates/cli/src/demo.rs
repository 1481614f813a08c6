//! `chute demo`: the README's main job on a built-in synthetic dataset.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use chute::core::{DType, OnError, SampleRng, Shuffle};
use chute::formats::{TokenOptions, TokenSource, TokenWriter};
use clap::Args;

use crate::bench::{LoaderArgs, RunArgs, human_bytes, print_summary, run_loop};

/// `chute demo` arguments.
#[derive(Debug, Clone, Args)]
pub(crate) struct DemoArgs {
    /// Tokens in the synthetic corpus.
    #[arg(long, default_value_t = 16 << 20)]
    tokens: u64,
    /// Tokens per training sequence.
    #[arg(long, default_value_t = 1024)]
    seq_len: usize,
    /// Samples per batch.
    #[arg(long, default_value_t = 16)]
    batch_size: usize,
    /// Epochs to train.
    #[arg(long, default_value_t = 2)]
    epochs: u64,
    /// Simulated training step per batch, in milliseconds.
    #[arg(long, default_value_t = 3.0)]
    step_ms: f64,
    /// Worker threads; default: one per core.
    #[arg(long)]
    workers: Option<usize>,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print the JSON summary instead of text.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: DemoArgs) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("chute-demo-").tempdir()?;
    let path = dir.path().join("train.bin");
    let t = Instant::now();
    write_corpus(&path, args.tokens, args.seed)?;
    let bytes = std::fs::metadata(&path)?.len();
    if !args.json {
        println!(
            "chute demo: wrote a synthetic corpus of {} uint16 tokens ({}) in {:.2} s to {}",
            args.tokens,
            human_bytes(bytes as f64),
            t.elapsed().as_secs_f64(),
            path.display()
        );
    }
    let source = TokenSource::open(
        &[&path],
        TokenOptions {
            seq_len: args.seq_len,
            dtype: DType::U16,
            out_dtype: DType::I64,
        },
    )?;
    let loader_args = LoaderArgs {
        batch_size: args.batch_size,
        workers: args.workers,
        prefetch: 2,
        shuffle: Shuffle::Global,
        seed: args.seed,
        epoch: 0,
        rank: 0,
        world_size: 1,
        drop_last: true,
        on_error: OnError::Raise,
        pin_memory: false,
    };
    let mut loader = loader_args.build(Arc::new(source))?;
    if !args.json {
        println!(
            "training: {} sequences of {} tokens, batches of {} as int64 [{}, {}], global \
             shuffle, {} workers, {} epochs, {} ms simulated step",
            loader.source().manifest().total_samples(),
            args.seq_len,
            args.batch_size,
            args.batch_size,
            args.seq_len + 1,
            loader.options().num_workers,
            args.epochs,
            args.step_ms
        );
    }
    let run = RunArgs {
        epochs: args.epochs,
        step_ms: args.step_ms,
        json: args.json,
        digest: true,
        ids: None,
        save_state_at: None,
        resume: None,
        quiet: false,
    };
    let summary = run_loop(&mut loader, &run)?;
    print_summary(&summary, &run);
    Ok(())
}

/// Writes `n` pseudo-random tokens with a Zipf-like spread over a GPT-2-sized vocabulary.
fn write_corpus(path: &std::path::Path, n: u64, seed: u64) -> anyhow::Result<()> {
    let mut w = TokenWriter::create(path, DType::U16)
        .with_context(|| format!("creating {}", path.display()))?;
    let mut rng = SampleRng::from_key(seed);
    let mut chunk = Vec::with_capacity(1 << 16);
    let mut left = n;
    while left > 0 {
        chunk.clear();
        let k = left.min(1 << 16);
        for _ in 0..k {
            // Squaring a uniform draw skews ids towards small values, as real text does.
            let u = rng.next_f64();
            chunk.push((u * u * 50_257.0) as u32);
        }
        w.write_tokens(&chunk)?;
        left -= k;
    }
    w.finish()?;
    Ok(())
}
