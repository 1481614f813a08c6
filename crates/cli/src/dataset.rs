//! Opening a dataset from the command line: shard paths (with brace expansion) or a
//! `manifest.json` written by `chute index`; the format from `--format`, the manifest or the
//! extension.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use chute::core::{DType, Manifest, Source};
use chute::formats::example::ExampleOptions;
use chute::formats::parquet::{ParquetOptions, ParquetSource};
use chute::formats::tfrecord::{TfRecordOptions, TfRecordSource};
use chute::formats::webdataset::{self, WebDatasetOptions, WebDatasetSource, expand_braces};
use chute::formats::{IndexMode, TokenOptions, TokenSource, tfrecord};
use chute::io::{Location, RemoteOptions, set_remote_options};
use clap::{Args, ValueEnum};

/// Formats chute reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// Flat little-endian token ids (nanoGPT's `.bin`).
    Tokens,
    /// WebDataset tar shards (`.tar`): files sharing a key form a sample.
    Webdataset,
    /// TFRecord files of `tf.train.Example`s (`.tfrecord`, `.tfrecords`, `.tfrec`).
    Tfrecord,
    /// Apache Parquet (`.parquet`): columns become batch columns.
    Parquet,
}

impl Format {
    /// The manifest's name for the format.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Format::Tokens => "tokens",
            Format::Webdataset => webdataset::FORMAT,
            Format::Tfrecord => tfrecord::FORMAT,
            Format::Parquet => "parquet",
        }
    }

    fn from_name(name: &str) -> Option<Format> {
        [
            Format::Tokens,
            Format::Webdataset,
            Format::Tfrecord,
            Format::Parquet,
        ]
        .into_iter()
        .find(|f| f.name() == name)
    }
}

/// How shard indexes are found (tar and TFRecord).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub(crate) enum IndexArg {
    /// `<shard>.idx` when present, else scan the shard.
    #[default]
    Auto,
    /// Every shard must have its `.idx` (written by `chute index`).
    Require,
    /// Ignore index files and scan.
    Scan,
}

/// Where the data is and how to read it.
#[derive(Debug, Clone, Args)]
pub(crate) struct DatasetArgs {
    /// Shard files or URLs (http(s)://, s3://, gs://, az://, file://; brace patterns such as
    /// `train-{000000..000127}.tar` are expanded), or one `manifest.json` (a path or URL)
    /// written by `chute index`.
    #[arg(required = true)]
    pub(crate) paths: Vec<PathBuf>,
    /// Format; by default from the manifest or the file extension.
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
    /// Parquet columns or TFRecord features to read, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub(crate) columns: Option<Vec<String>>,
    /// Parquet: rows per shard (row groups are split into chunks of this many rows).
    #[arg(long)]
    pub(crate) chunk_rows: Option<usize>,
    /// Tar and TFRecord: where shard indexes come from.
    #[arg(long, value_enum, default_value_t = IndexArg::Auto)]
    pub(crate) index: IndexArg,
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

/// The shard files and format a command line names.
pub(crate) struct Resolved {
    pub(crate) format: Format,
    pub(crate) paths: Vec<PathBuf>,
    /// The manifest it came from, if any (its fingerprint must match the shards').
    pub(crate) manifest: Option<(PathBuf, Manifest)>,
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

    /// Expands brace patterns and reads a manifest, if one was given.
    pub(crate) fn resolve(&self) -> anyhow::Result<Resolved> {
        self.apply_remote_options()?;
        if let [one] = self.paths.as_slice()
            && one.extension().is_some_and(|e| e == "json")
        {
            let loc = Location::from_path(one)?;
            let text = loc
                .read()
                .with_context(|| format!("reading manifest {}", one.display()))?;
            let text = std::str::from_utf8(&text)
                .with_context(|| format!("manifest {} is not UTF-8 text", one.display()))?;
            let m = Manifest::from_json(text, &one.display().to_string())?;
            let format = match self.format {
                Some(f) => f,
                None => Format::from_name(&m.format).with_context(|| {
                    format!(
                        "manifest {} has unknown format {:?}",
                        one.display(),
                        m.format
                    )
                })?,
            };
            let mut paths: Vec<PathBuf> = Vec::new();
            for s in &m.shards {
                // Parquet shards are chunks of row groups: `file.parquet#rowgroup0:0+65536`.
                let file = s
                    .path
                    .split_once("#rowgroup")
                    .map_or(s.path.as_str(), |(f, _)| f);
                // Relative to the manifest's folder, or its URL's.
                let p = PathBuf::from(loc.join_sibling(file)?.to_string());
                if paths.last() != Some(&p) {
                    paths.push(p);
                }
            }
            return Ok(Resolved {
                format,
                paths,
                manifest: Some((one.clone(), m)),
            });
        }
        let mut paths = Vec::new();
        for p in &self.paths {
            let s = p.to_string_lossy();
            if s.contains('{') {
                paths.extend(expand_braces(&s)?.into_iter().map(PathBuf::from));
            } else {
                paths.push(p.clone());
            }
        }
        let format = match self.format {
            Some(f) => f,
            None => detect(&paths[0])?,
        };
        Ok(Resolved {
            format,
            paths,
            manifest: None,
        })
    }

    /// The format, from `--format`, the manifest or the first path's extension.
    pub(crate) fn format(&self) -> anyhow::Result<Format> {
        Ok(self.resolve()?.format)
    }

    /// Opens the source over every shard.
    pub(crate) fn open(&self) -> anyhow::Result<Arc<dyn Source>> {
        let r = self.resolve()?;
        let source = self.open_paths_as(r.format, &r.paths, r.manifest.as_ref())?;
        if let Some((path, m)) = &r.manifest {
            let (want, got) = (m.fingerprint(), source.manifest().fingerprint());
            if want != got {
                bail!(
                    "manifest {} does not match its shards (fingerprint {want}, the shards give \
                     {got}): they changed since `chute index`; run it again",
                    path.display()
                );
            }
        }
        Ok(source)
    }

    /// Opens the source over `paths` with this dataset's format and options.
    pub(crate) fn open_paths(&self, paths: &[PathBuf]) -> anyhow::Result<Arc<dyn Source>> {
        let r = self.resolve()?;
        self.open_paths_as(r.format, paths, r.manifest.as_ref())
    }

    fn open_paths_as(
        &self,
        format: Format,
        paths: &[PathBuf],
        manifest: Option<&(PathBuf, Manifest)>,
    ) -> anyhow::Result<Arc<dyn Source>> {
        let ctx = || format!("opening {} shards {paths:?}", format.name());
        Ok(match format {
            Format::Tokens => {
                // A manifest records what a sample is; it wins over the defaults.
                let param = |k: &str| manifest.and_then(|(_, m)| m.params.get(k).cloned());
                let seq_len = param("seq_len")
                    .and_then(|v| v.as_u64())
                    .map_or(self.seq_len, |v| v as usize);
                let dtype = match param("dtype").and_then(|v| v.as_str().map(str::to_owned)) {
                    Some(d) => d.parse()?,
                    None => self.token_dtype,
                };
                let opts = TokenOptions {
                    seq_len,
                    dtype,
                    out_dtype: self.out_dtype,
                };
                Arc::new(TokenSource::open(paths, opts).with_context(ctx)?)
            }
            Format::Webdataset => {
                let opts = WebDatasetOptions {
                    index: self.index_mode(),
                    ..Default::default()
                };
                Arc::new(WebDatasetSource::open(paths, opts).with_context(ctx)?)
            }
            Format::Tfrecord => {
                let example = (!self.raw).then(|| ExampleOptions {
                    features: self.columns.clone(),
                    ..Default::default()
                });
                let opts = TfRecordOptions {
                    verify_checksums: !self.no_verify,
                    example,
                    index: self.index_mode(),
                    ..Default::default()
                };
                Arc::new(TfRecordSource::open(paths, opts).with_context(ctx)?)
            }
            Format::Parquet => {
                let opts = ParquetOptions {
                    columns: self.columns.clone(),
                    chunk_rows: self.chunk_rows,
                    ..Default::default()
                };
                Arc::new(ParquetSource::open(paths, opts).with_context(ctx)?)
            }
        })
    }

    fn index_mode(&self) -> IndexMode {
        match self.index {
            IndexArg::Auto => IndexMode::Auto,
            IndexArg::Require => IndexMode::Require,
            IndexArg::Scan => IndexMode::Scan,
        }
    }
}

/// The format a file's extension implies.
fn detect(path: &Path) -> anyhow::Result<Format> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let name = name.strip_suffix(".gz").unwrap_or(name);
    Ok(match name.rsplit_once('.').map(|(_, e)| e) {
        Some("bin") => Format::Tokens,
        Some("tar") => Format::Webdataset,
        Some("tfrecord" | "tfrecords" | "tfrec") => Format::Tfrecord,
        Some("parquet" | "pq") => Format::Parquet,
        other => bail!(
            "cannot tell the format of {} from its extension {other:?}; pass --format \
             (tokens, webdataset, tfrecord or parquet)",
            path.display()
        ),
    })
}
