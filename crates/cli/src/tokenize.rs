//! `chute tokenize`: text to token ids with a `tokenizer.json` (Hugging Face's `tokenizers`),
//! written as a Megatron-Core indexed dataset (`PREFIX.bin` + `PREFIX.idx`) or a chute token
//! file, in parallel, the output the same for any number of workers.
//!
//! Documents are read in input order (JSON Lines objects, Parquet or Arrow rows, or whole text
//! files), tokenized a chunk at a time by the workers and written in order by this thread;
//! both output files sit under temporary names until the last document is written, so a
//! killed run never leaves a dataset that looks complete (rerun it to start over).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, mpsc};

use anyhow::{Context, bail};
use chute::core::DType;
use chute::formats::{MegatronWriter, TokenWriter};
use chute::ops::text::{EncodeOptions, TextTokenizer};
use chute::pipeline::for_each_parallel;
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};

/// What `chute tokenize` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Output {
    /// A Megatron-Core indexed dataset: `OUTPUT.bin` and `OUTPUT.idx`.
    Megatron,
    /// A chute token file (flat ids, `OUTPUT`); use --append-eod to keep documents apart.
    Tokens,
}

/// `chute tokenize` arguments.
#[derive(Debug, Clone, Args)]
pub(crate) struct TokenizeArgs {
    /// Inputs, in order: JSON Lines (`.jsonl`, `.ndjson`, `.json`; one object a line), Parquet
    /// or Arrow files (a text column), WebDataset tar or TFRecord files (a text member or
    /// feature: --field txt), or text files (any other name: one document each). Paths or
    /// URLs (http(s), s3, gs, az); brace patterns and globs as for every command's DATA.
    #[arg(required = true)]
    inputs: Vec<String>,
    /// The `tokenizer.json` (Hugging Face's tokenizers format).
    #[arg(long)]
    tokenizer: PathBuf,
    /// The output: a Megatron dataset's prefix, or (with `--to tokens`) the token file.
    #[arg(short, long)]
    output: PathBuf,
    /// The JSON key, column, tar member extension or feature holding each document's text.
    #[arg(long, default_value = "text")]
    field: String,
    /// What to write.
    #[arg(long, value_enum, default_value = "megatron")]
    to: Output,
    /// Put the end-of-document id after every document (Megatron's `--append-eod`).
    #[arg(long)]
    append_eod: bool,
    /// The end-of-document id (default: the tokenizer's `<|endoftext|>`, `</s>`, `<eos>` or
    /// `<|end_of_text|>`, the first it has).
    #[arg(long)]
    eod_id: Option<u32>,
    /// Leave out the tokenizer's own special tokens (its post-processor's BOS, CLS, ...).
    #[arg(long)]
    no_special_tokens: bool,
    /// Stored token type: auto (Megatron's rule: uint16 below a vocabulary of 65,500 ids,
    /// else int32; uint32 for token files), or a type.
    #[arg(long, default_value = "auto")]
    dtype: String,
    /// Worker threads [default: one per core].
    #[arg(long)]
    workers: Option<usize>,
    /// Replace an existing output.
    #[arg(long)]
    overwrite: bool,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
    /// Chat and instruction data: the inputs hold conversations (`messages`, with `tools`),
    /// prompts and completions, or instruction records; each is rendered with the chat
    /// template of --tokenizer (a folder as `save_pretrained` writes it), tokenized and
    /// labelled, and written as Parquet (`input_ids`, `labels` with -100 where the loss does
    /// not count) to --output.
    #[arg(long)]
    chat: bool,
    /// With --chat: a chat template (its text or a .jinja file) instead of the tokenizer's.
    #[arg(long)]
    chat_template: Option<String>,
    /// With --chat: which tokens count in the loss: assistant, last or all.
    #[arg(long, default_value = "assistant")]
    train_on: String,
    /// With --chat: leave the assistant's end-of-turn token out of the loss.
    #[arg(long)]
    no_train_on_eos: bool,
    /// With --chat: at most this many ids a conversation.
    #[arg(long)]
    max_length: Option<usize>,
    /// With --chat: what a longer conversation becomes: keep_start, keep_end or drop.
    #[arg(long, default_value = "keep_start")]
    truncation: String,
    /// With --chat: the date `strftime_now` gives (YYYY-MM-DD; default today, UTC).
    #[arg(long)]
    chat_date: Option<String>,
}

/// Documents per chunk a worker tokenizes at once.
const CHUNK: usize = 256;

pub(crate) fn run(args: TokenizeArgs) -> anyhow::Result<()> {
    if args.chat {
        return run_chat(&args);
    }
    let tokenizer = TextTokenizer::load(&args.tokenizer).map_err(anyhow::Error::msg)?;
    let eod = match (args.append_eod, args.eod_id) {
        (_, Some(id)) => Some(id),
        (true, None) => Some(
            ["<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>"]
                .iter()
                .find_map(|t| tokenizer.token_id(t))
                .with_context(|| {
                    format!(
                        "{} has none of <|endoftext|>, </s>, <eos>, <|end_of_text|>: pass \
                         --eod-id",
                        args.tokenizer.display()
                    )
                })?,
        ),
        (false, None) => None,
    };
    let options = EncodeOptions {
        add_special_tokens: !args.no_special_tokens,
        eos: eod.filter(|_| args.append_eod),
        ..Default::default()
    };
    let vocab = tokenizer.vocab_size();
    let dtype = match (args.dtype.as_str(), args.to) {
        ("auto", Output::Megatron) if vocab < 65_500 => DType::U16,
        ("auto", Output::Megatron) => DType::I32,
        ("auto", Output::Tokens) if vocab <= 65_536 => DType::U16,
        ("auto", Output::Tokens) => DType::U32,
        (other, _) => other.parse::<DType>()?,
    };
    let files = chute::dataset::expand_files(&args.inputs)?;
    let outputs = match args.to {
        Output::Megatron => {
            let (idx, bin) = chute::formats::megatron::paths_of(&args.output);
            vec![bin, idx]
        }
        Output::Tokens => vec![args.output.clone()],
    };
    if !args.overwrite
        && let Some(p) = outputs.iter().find(|p| p.exists())
    {
        bail!("{} exists; pass --overwrite to replace it", p.display());
    }
    let sink = match args.to {
        Output::Megatron => Sink::Megatron(MegatronWriter::create(&args.output, dtype)?),
        Output::Tokens => Sink::Tokens(TokenWriter::create(&args.output, dtype)?),
    };
    let workers = args
        .workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{spinner} {pos} documents, {per_sec}, {elapsed} {msg}")
                .expect("a valid template"),
        )
    };
    let started = std::time::Instant::now();
    // Job 0 reads documents into chunks, job 1 writes the tokenized chunks in order, the
    // others tokenize; any failure stops them all.
    let (work_tx, work_rx) = mpsc::sync_channel::<(u64, Vec<String>)>(workers * 2);
    let (done_tx, done_rx) = mpsc::channel::<(u64, anyhow::Result<Vec<Vec<u32>>>)>();
    let work_tx = Mutex::new(Some(work_tx));
    let work_rx = Mutex::new(work_rx);
    let done_rx = Mutex::new(done_rx);
    let stop = AtomicBool::new(false);
    // Chunks the reader made, once it has finished.
    let chunks: Mutex<Option<u64>> = Mutex::new(None);
    let counts = Mutex::new((0u64, 0u64));
    let sink = Mutex::new(Some(sink));
    let field = args.field.clone();
    let result = for_each_parallel(workers + 2, workers + 2, |job| -> anyhow::Result<()> {
        let out = match job {
            0 => {
                let tx = work_tx.lock().unwrap_or_else(|e| e.into_inner()).take();
                read_chunks(&files, &field, tx, &stop, &chunks)
            }
            1 => {
                let mut sink = sink.lock().unwrap_or_else(|e| e.into_inner());
                let rx = done_rx.lock().unwrap_or_else(|e| e.into_inner());
                write_chunks(
                    &rx,
                    sink.as_mut().expect("one writer"),
                    &stop,
                    &chunks,
                    &bar,
                )
                .map(|c| *counts.lock().unwrap_or_else(|e| e.into_inner()) = c)
            }
            _ => {
                let done = done_tx.clone();
                loop {
                    let next = work_rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    let Ok((n, texts)) = next else { break Ok(()) };
                    let ids = texts
                        .iter()
                        .map(|t| tokenizer.encode(t, options).map_err(anyhow::Error::msg))
                        .collect();
                    if done.send((n, ids)).is_err() {
                        break Ok(());
                    }
                }
            }
        };
        if out.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        out
    });
    result?;
    let (docs, tokens) = counts.into_inner().unwrap_or_else(|e| e.into_inner());
    let sink = sink
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .expect("the writer hands it back");
    sink.finish()?;
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    println!(
        "wrote {docs} documents, {tokens} {dtype} tokens ({:.2} M tokens/s on {workers} workers) \
         to {}",
        tokens as f64 / secs.max(1e-9) / 1e6,
        outputs
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" and ")
    );
    Ok(())
}

/// `chute tokenize --chat`: rows rendered, tokenized and labelled on every core, written in
/// order as Parquet.
fn run_chat(args: &TokenizeArgs) -> anyhow::Result<()> {
    use chute::ops::chat::{ChatOptions, ChatTokenizer, RowFields, chat_time};
    let now = chat_time(args.chat_date.as_deref()).map_err(anyhow::Error::msg)?;
    let chat = ChatTokenizer::load(&args.tokenizer, args.chat_template.as_deref(), now)
        .map_err(anyhow::Error::msg)?;
    let options = ChatOptions {
        train_on: args.train_on.parse().map_err(anyhow::Error::msg)?,
        train_on_eos: !args.no_train_on_eos,
        max_length: args.max_length,
        truncation: args.truncation.parse().map_err(anyhow::Error::msg)?,
        ..Default::default()
    };
    let fields = RowFields {
        messages: args.field.clone(),
        ..Default::default()
    };
    let fields = if args.field == "text" {
        RowFields::default()
    } else {
        fields
    };
    let rows = chute::chat::ChatRows::new(
        std::sync::Arc::new(chat),
        options,
        fields,
        args.workers.unwrap_or(0),
    );
    if !args.overwrite && args.output.exists() {
        bail!(
            "{} exists; pass --overwrite to replace it",
            args.output.display()
        );
    }
    let files = chute::dataset::expand_files(&args.inputs)?;
    let started = std::time::Instant::now();
    let mut writer = chute::formats::parquet::TokenListWriter::create(&args.output, 16_384)?;
    let mut tokens = 0u64;
    let mut trained = 0u64;
    let counts = chute::dataset::rows::encode_each(
        &mut chute::dataset::open_records(&files),
        &rows,
        &mut |ids, labels| {
            tokens += ids.len() as u64;
            trained += labels.iter().filter(|&&l| l != -100).count() as u64;
            writer.add(ids, labels)
        },
    )?;
    let written = writer.finish()?;
    let secs = started.elapsed().as_secs_f64();
    let skipped: Vec<String> = counts
        .skipped
        .iter()
        .map(|(w, n)| format!("{n} {w}"))
        .collect();
    println!(
        "wrote {written} of {} rows ({} truncated{}{}), {tokens} tokens ({trained} trained; {:.2} M \
         tokens/s) to {}",
        counts.rows,
        counts.truncated,
        if skipped.is_empty() {
            ""
        } else {
            ", skipped: "
        },
        skipped.join(", "),
        tokens as f64 / secs.max(1e-9) / 1e6,
        args.output.display()
    );
    Ok(())
}

/// Reads `files`' documents into chunks of [`CHUNK`] for the tokenizers, numbered in order;
/// records how many when done. Stops early when `stop` is set.
fn read_chunks(
    files: &[PathBuf],
    field: &str,
    tx: Option<mpsc::SyncSender<(u64, Vec<String>)>>,
    stop: &AtomicBool,
    chunks: &Mutex<Option<u64>>,
) -> anyhow::Result<()> {
    let Some(tx) = tx else { return Ok(()) };
    let mut n = 0u64;
    let mut chunk = Vec::with_capacity(CHUNK);
    let send = |item: (u64, Vec<String>)| -> bool {
        let mut item = item;
        loop {
            match tx.try_send(item) {
                Ok(()) => return true,
                Err(mpsc::TrySendError::Full(back)) if !stop.load(Ordering::Relaxed) => {
                    item = back;
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
                Err(_) => return false,
            }
        }
    };
    let mut stopped = false;
    let mut texts = chute::dataset::open_texts(files, field);
    chute::dataset::text_files::read_texts(&mut texts, field, &mut |text| {
        chunk.push(text);
        if chunk.len() == CHUNK {
            if !send((n, std::mem::take(&mut chunk))) {
                stopped = true;
                return Ok(false);
            }
            n += 1;
        }
        Ok(true)
    })?;
    if stopped {
        return Ok(());
    }
    if !chunk.is_empty() {
        if !send((n, chunk)) {
            return Ok(());
        }
        n += 1;
    }
    *chunks.lock().unwrap_or_else(|e| e.into_inner()) = Some(n);
    Ok(())
}

/// Writes the tokenized chunks in order until all the reader made are written; returns the
/// documents and tokens written.
fn write_chunks(
    rx: &mpsc::Receiver<(u64, anyhow::Result<Vec<Vec<u32>>>)>,
    sink: &mut Sink,
    stop: &AtomicBool,
    chunks: &Mutex<Option<u64>>,
    bar: &ProgressBar,
) -> anyhow::Result<(u64, u64)> {
    let mut pending: BTreeMap<u64, Vec<Vec<u32>>> = BTreeMap::new();
    let (mut next, mut docs, mut tokens) = (0u64, 0u64, 0u64);
    loop {
        if *chunks.lock().unwrap_or_else(|e| e.into_inner()) == Some(next) {
            return Ok((docs, tokens));
        }
        if stop.load(Ordering::Relaxed) {
            bail!("stopped: another part of the job failed");
        }
        let Ok((n, ids)) = rx.recv_timeout(std::time::Duration::from_millis(20)) else {
            continue;
        };
        pending.insert(n, ids?);
        while let Some(chunk) = pending.remove(&next) {
            for ids in &chunk {
                sink.add(ids)?;
                tokens += ids.len() as u64;
            }
            docs += chunk.len() as u64;
            bar.set_position(docs);
            bar.set_message(format!("{tokens} tokens"));
            next += 1;
        }
    }
}

/// The output being written.
enum Sink {
    Megatron(MegatronWriter),
    Tokens(TokenWriter),
}

impl Sink {
    fn add(&mut self, ids: &[u32]) -> anyhow::Result<()> {
        match self {
            Sink::Megatron(w) => w.add_document(ids)?,
            Sink::Tokens(w) => w.write_tokens(ids)?,
        }
        Ok(())
    }

    fn finish(self) -> anyhow::Result<()> {
        match self {
            Sink::Megatron(w) => {
                w.finish()?;
            }
            Sink::Tokens(w) => {
                w.finish()?;
            }
        }
        Ok(())
    }
}
