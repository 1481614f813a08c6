//! Opening a dataset from the command line: the format from `--format` or the extension.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use chute::core::{DType, Source};
use chute::formats::parquet::{ParquetOptions, ParquetSource};
use chute::formats::{TokenOptions, TokenSource};
use clap::{Args, ValueEnum};

/// Formats `chute bench` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// Flat little-endian token ids (nanoGPT's `.bin`).
    Tokens,
    /// Apache Parquet (`.parquet`): columns become batch columns.
    Parquet,
}

/// Where the data is and how to read it.
#[derive(Debug, Clone, Args)]
pub(crate) struct DatasetArgs {
    /// Shard files (token files: one `.bin` per shard; Parquet files: each row group is a
    /// shard).
    #[arg(required = true)]
    pub(crate) paths: Vec<PathBuf>,
    /// Format; by default taken from the file extension (`.bin` = tokens).
    #[arg(long, value_enum)]
    pub(crate) format: Option<Format>,
    /// Token files: tokens per training sequence; a sample is a window of seq_len + 1 tokens.
    #[arg(long, default_value_t = 1024)]
    pub(crate) seq_len: usize,
    /// Token files: the stored token type.
    #[arg(long, default_value = "uint16", value_parser = parse_dtype)]
    pub(crate) token_dtype: DType,
    /// Token files: the dtype of the batch tensor (uint16, int32 or int64).
    #[arg(long, default_value = "int64", value_parser = parse_dtype)]
    pub(crate) out_dtype: DType,
    /// Parquet: the columns to read, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub(crate) columns: Option<Vec<String>>,
    /// Parquet: rows per shard (row groups are split into chunks of this many rows).
    #[arg(long)]
    pub(crate) chunk_rows: Option<usize>,
}

pub(crate) fn parse_dtype(s: &str) -> Result<DType, String> {
    s.parse::<DType>().map_err(|e| e.to_string())
}

impl DatasetArgs {
    /// The format, from `--format` or the first path's extension.
    pub(crate) fn format(&self) -> anyhow::Result<Format> {
        if let Some(f) = self.format {
            return Ok(f);
        }
        let first = &self.paths[0];
        match first.extension().and_then(|e| e.to_str()) {
            Some("bin") => Ok(Format::Tokens),
            Some("parquet" | "pq") => Ok(Format::Parquet),
            other => bail!(
                "cannot tell the format of {} from its extension {other:?}; pass --format \
                 tokens or --format parquet",
                first.display()
            ),
        }
    }

    /// Opens the source over every path.
    pub(crate) fn open(&self) -> anyhow::Result<Arc<dyn Source>> {
        self.open_paths(&self.paths)
    }

    /// Opens the source over `paths` with this dataset's format and options.
    pub(crate) fn open_paths(&self, paths: &[PathBuf]) -> anyhow::Result<Arc<dyn Source>> {
        match self.format()? {
            Format::Tokens => {
                let opts = TokenOptions {
                    seq_len: self.seq_len,
                    dtype: self.token_dtype,
                    out_dtype: self.out_dtype,
                };
                let source = TokenSource::open(paths, opts)
                    .with_context(|| format!("opening token files {paths:?}"))?;
                Ok(Arc::new(source))
            }
            Format::Parquet => {
                let opts = ParquetOptions {
                    columns: self.columns.clone(),
                    chunk_rows: self.chunk_rows,
                    ..Default::default()
                };
                let source = ParquetSource::open(paths, opts)
                    .with_context(|| format!("opening Parquet files {paths:?}"))?;
                Ok(Arc::new(source))
            }
        }
    }
}
