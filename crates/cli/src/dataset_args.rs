//! Dataset arguments of the command line, turned into [`chute::dataset::Opened::open`]'s inputs and
//! [`OpenOptions`]; the process's remote options from the flags.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::bail;
use chute::core::{DType, Source};
use chute::dataset::{Dataset, Long, OpenOptions, Opened, Pack, PackOptions};
use chute::formats::{Format, IndexMode};
use chute::io::{RemoteOptions, set_remote_options};
use clap::Args;
use clap::builder::{PossibleValuesParser, TypedValueParser};

/// Where the data is and how to read it.
#[derive(Debug, Clone, Args)]
pub(crate) struct DatasetArgs {
    /// Shard files or URLs (http(s)://, s3://, gs://, az://, file://), brace patterns such as
    /// `train-{000000..000127}.tar`, globs (`data/*.parquet`), folders (every shard inside,
    /// sorted, or their manifest.json), one `manifest.json` (a path or URL) written by
    /// `chute index`, or one mixture file (JSON: components, weights, schedule, policy).
    #[arg(required = true)]
    pub(crate) paths: Vec<PathBuf>,
    /// Format; by default from the manifest or the file extension.
    #[arg(long, value_parser = format_parser())]
    pub(crate) format: Option<Format>,
    /// Token files: tokens per training sequence; a sample is a window of seq_len + 1 tokens
    /// [default: the manifest's, else 1024].
    #[arg(long)]
    pub(crate) seq_len: Option<usize>,
    /// Token files: the stored token type [default: the manifest's, else uint16].
    #[arg(long, value_parser = parse_dtype)]
    pub(crate) token_dtype: Option<DType>,
    /// Token files: the dtype of the batch tensor (uint16, int32 or int64).
    #[arg(long, default_value = "int64", value_parser = parse_dtype)]
    pub(crate) out_dtype: DType,
    /// Parquet columns or TFRecord features to read, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub(crate) columns: Option<Vec<String>>,
    /// Parquet: rows per shard (row groups are split into chunks of this many rows).
    #[arg(long)]
    pub(crate) chunk_rows: Option<usize>,
    /// Parquet: keep the decoded data for later epochs when it fits in this many bytes, e.g.
    /// 4G (default: none kept; each piece of a row group is dropped once read). A global
    /// shuffle needs room for the whole dataset.
    #[arg(long, value_parser = parse_size)]
    pub(crate) decoded_cache: Option<u64>,
    /// Parquet and Arrow: stack numeric columns into one `[B, k]` column, NAME=COL,COL,...
    /// (brace patterns allowed: `x=f{0..15}`); repeat for several stacks.
    #[arg(long, value_parser = parse_stack)]
    pub(crate) stack: Vec<(String, Vec<String>)>,
    /// Parquet and Arrow: what a null does: mask (its slot filled, and a <name>_valid bool
    /// column, true where a value is present, for each column that holds nulls), fill (its
    /// slot filled, no mask) or raise.
    #[arg(long, default_value = "mask", value_parser = chute::formats::Nulls::parse)]
    pub(crate) nulls: chute::formats::Nulls,
    /// Parquet and Arrow: the number null slots of numeric columns get [default: NaN for
    /// floats, 0 for integers].
    #[arg(long)]
    pub(crate) fill_null: Option<f64>,
    /// Parquet, Arrow and JSON Lines: how a struct column is read: flatten (a column per
    /// leaf, named by its path, meta.a) or record (the whole struct, one nested value a row).
    #[arg(long, default_value = "flatten", value_parser = chute::formats::Structs::parse)]
    pub(crate) structs: chute::formats::Structs,
    /// Parquet and Arrow: how a decimal column is read: float (float64, the nearest double)
    /// or exact (its text, a value a row).
    #[arg(long, default_value = "float", value_parser = chute::formats::Decimals::parse)]
    pub(crate) decimals: chute::formats::Decimals,
    /// Parquet and Arrow: how a dictionary column is read: values (its values) or codes
    /// (int64 codes into one dictionary for the whole dataset, which inspect shows).
    #[arg(long, default_value = "values", value_parser = chute::formats::Dictionaries::parse)]
    pub(crate) dictionaries: chute::formats::Dictionaries,
    /// Token files and Megatron datasets: pack documents into rows: concat (windows of
    /// seq_len + 1 tokens across documents), document (the same with position_ids,
    /// segment_ids, cu_seqlens), best_fit (whole documents in rows of seq_len, padded) or pad
    /// (one document per row, cut to seq_len, each batch padded to its longest).
    /// Megatron datasets are packed (concat) without it; token files need --eos-id with it.
    #[arg(long)]
    pub(crate) pack: Option<Pack>,
    /// Packing: the end-of-sequence id. Token files: the id that ends each document. Megatron
    /// datasets: an id appended after every document.
    #[arg(long)]
    pub(crate) eos_id: Option<u32>,
    /// best_fit and pad: the padding id [default: 0].
    #[arg(long, default_value_t = 0)]
    pub(crate) pad_id: u32,
    /// best_fit: what happens to documents longer than seq_len: split or drop.
    #[arg(long, default_value = "split")]
    pub(crate) long: Long,
    /// best_fit: documents per packing window.
    #[arg(long, default_value_t = 1024)]
    pub(crate) pack_window: usize,
    /// best_fit: the key of the order documents are packed in.
    #[arg(long, default_value_t = 0)]
    pub(crate) pack_seed: u64,
    /// pad: each batch is padded to its longest row rounded up to a multiple of this.
    #[arg(long, default_value_t = 1)]
    pub(crate) pad_to_multiple_of: usize,
    /// pad: length bucketing; runs of this many rows of the epoch's order are sorted by
    /// length, so a batch holds documents of similar lengths [default: 0, off].
    #[arg(long, default_value_t = 0)]
    pub(crate) bucket: u64,
    /// Text documents tokenized when opened with this `tokenizer.json` (Hugging Face's
    /// tokenizers): DATA is JSON Lines, Parquet, Arrow, tar, TFRecord or text files, packed by
    /// --pack (concat by default) with --seq-len, --eos-id appended after every document.
    #[arg(long)]
    pub(crate) tokenizer: Option<std::path::PathBuf>,
    /// With --tokenizer: the JSON key, column, tar member extension or feature holding the
    /// text.
    #[arg(long, default_value = "text")]
    pub(crate) text_field: String,
    /// With --tokenizer: leave out the tokenizer's own special tokens (its post-processor's).
    #[arg(long)]
    pub(crate) no_special_tokens: bool,
    /// Tar and TFRecord: where shard indexes come from.
    #[arg(long, default_value_t = IndexMode::Auto, value_parser = index_parser())]
    pub(crate) index: IndexMode,
    /// TFRecord: records as raw bytes (a `record` field) instead of `tf.train.Example`s.
    #[arg(long)]
    pub(crate) raw: bool,
    /// TFRecord: skip CRC32C verification of record data.
    #[arg(long)]
    pub(crate) no_verify: bool,
    /// Remote shards: whole shards downloaded ahead of the one being read (default 2, or
    /// CHUTE_READ_AHEAD).
    #[arg(long)]
    pub(crate) read_ahead: Option<usize>,
    /// Remote shards: retries per request before a shard fails (default 9, or CHUTE_RETRIES).
    #[arg(long)]
    pub(crate) retries: Option<u32>,
    /// Remote shards: seconds without response or body bytes before a request is retried
    /// (default 30, or CHUTE_TIMEOUT).
    #[arg(long)]
    pub(crate) timeout: Option<f64>,
    /// Remote shards: a node-local cache directory, shared by every process on the machine
    /// (default none, or CHUTE_CACHE_DIR).
    #[arg(long)]
    pub(crate) cache_dir: Option<PathBuf>,
    /// Remote shards: the cache's size limit, e.g. 500G (default 64G, or CHUTE_CACHE_LIMIT).
    #[arg(long, value_parser = parse_size)]
    pub(crate) cache_limit: Option<u64>,
}

fn parse_size(s: &str) -> Result<u64, String> {
    chute::io::parse_size(s)
}

pub(crate) fn parse_dtype(s: &str) -> Result<DType, String> {
    s.parse::<DType>().map_err(|e| e.to_string())
}

fn parse_stack(s: &str) -> Result<(String, Vec<String>), String> {
    chute::formats::parse_stack(s).map_err(|e| e.to_string())
}

/// `--format`: one of [`Format::ALL`]'s names (listed by `--help`).
pub(crate) fn format_parser() -> impl TypedValueParser<Value = Format> {
    PossibleValuesParser::new(Format::ALL.map(Format::name))
        .try_map(|s| s.parse::<Format>().map_err(|e| e.to_string()))
}

/// `--index`: one of [`IndexMode::ALL`]'s names.
fn index_parser() -> impl TypedValueParser<Value = IndexMode> {
    PossibleValuesParser::new(IndexMode::ALL.map(IndexMode::name))
        .try_map(|s| s.parse::<IndexMode>().map_err(|e| e.to_string()))
}

impl DatasetArgs {
    /// Sets the process's remote options: the environment's, overridden by the flags.
    fn apply_remote_options(&self) -> anyhow::Result<()> {
        let mut o = RemoteOptions::from_env()?;
        if let Some(n) = self.read_ahead {
            o.read_ahead = n;
        }
        if let Some(n) = self.retries {
            o.max_attempts = n.saturating_add(1);
        }
        if let Some(t) = self.timeout {
            if !(t > 0.0 && t.is_finite()) {
                bail!("--timeout must be a positive number of seconds, got {t}");
            }
            o.timeout = std::time::Duration::from_secs_f64(t);
        }
        if let Some(d) = &self.cache_dir {
            o.cache_dir = Some(d.clone());
        }
        if let Some(n) = self.cache_limit {
            o.cache_limit = n;
        }
        set_remote_options(o);
        Ok(())
    }

    /// The library's options for these flags.
    pub(crate) fn options(&self) -> anyhow::Result<OpenOptions> {
        let tokenizer = match &self.tokenizer {
            Some(path) => {
                let options = chute::ops::text::EncodeOptions {
                    add_special_tokens: !self.no_special_tokens,
                    ..Default::default()
                };
                let t: std::sync::Arc<dyn chute::core::TextEncoder> =
                    std::sync::Arc::new(chute::tokenizer::Tokenizer::load(path, options, 0)?);
                Some(t)
            }
            None => None,
        };
        Ok(OpenOptions {
            format: self.format,
            seq_len: self.seq_len,
            token_dtype: self.token_dtype,
            out_dtype: self.out_dtype,
            columns: self.columns.clone(),
            chunk_rows: self.chunk_rows,
            stack: self.stack.clone(),
            nulls: self.nulls,
            fill_null: chute::formats::Fill {
                number: self.fill_null,
            },
            structs: self.structs,
            decimals: self.decimals,
            dictionaries: self.dictionaries,
            cache_bytes: self
                .decoded_cache
                .map(|b| usize::try_from(b).unwrap_or(usize::MAX)),
            index: self.index,
            raw: self.raw,
            verify_checksums: !self.no_verify,
            // An end-of-sequence id says there are documents: packed, `concat` by default.
            pack: (self.pack.is_some() || self.eos_id.is_some() || tokenizer.is_some()).then(
                || PackOptions {
                    pack: self.pack.unwrap_or_default(),
                    eos_id: self.eos_id,
                    pad_id: self.pad_id,
                    long: self.long,
                    window: self.pack_window,
                    seed: self.pack_seed,
                    pad_to_multiple_of: self.pad_to_multiple_of,
                    bucket: self.bucket,
                    ..Default::default()
                },
            ),
            tokenizer,
            rows: None,
            text_field: Some(self.text_field.clone()),
        })
    }

    /// The format, shard files and manifest the paths name (after setting remote options).
    pub(crate) fn resolve(&self) -> anyhow::Result<Dataset> {
        self.apply_remote_options()?;
        Ok(Dataset::resolve(&self.paths, self.format)?)
    }

    /// [`DatasetArgs::resolve`] for indexing: a folder stands for its shards, never for its
    /// manifest, and a manifest is refused.
    pub(crate) fn resolve_shards(&self) -> anyhow::Result<Dataset> {
        self.apply_remote_options()?;
        Ok(Dataset::resolve_shards(&self.paths, self.format)?)
    }

    /// Opens what the paths name through the one opener: the source over every shard
    /// (checking a manifest's fingerprint), the mixture a single mixture file describes, or
    /// text tokenized when opened.
    pub(crate) fn opened(&self) -> anyhow::Result<Opened> {
        self.apply_remote_options()?;
        Ok(Opened::open(&self.paths, &self.options()?)?)
    }

    /// The source of [`DatasetArgs::opened`].
    pub(crate) fn open(&self) -> anyhow::Result<Arc<dyn Source>> {
        Ok(self.opened()?.source)
    }
}
