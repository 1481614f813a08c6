//! One way to open a dataset: [`Opened::open`] and [`open`] (and [`Dataset`], what it
//! resolves), used by the command line and the Python package alike.
//!
//! Inputs are shard files, URLs, brace patterns (`train-{000000..000127}.tar`), globs
//! (`data/*.parquet`, `shards/**/*.tar`, local paths only), directories (every shard of the
//! format inside, sorted by name, or the `manifest.json` inside when there is one) and
//! manifests (`manifest.json` written by `chute index` or `chute convert --index`, a path or a
//! URL). The format is given ([`OpenOptions::format`]) or detected: from the manifest, or from
//! the files' extensions ([`Format::from_path`]), which must agree. A single mixture file opens
//! its mixture; with a tokenizer the inputs are text files of any kind ([`open_texts`]).
//!
//! ```
//! use chute_core::{DType, Source};
//! use chute_dataset::{OpenOptions, open};
//! use chute_formats::{Format, TokenWriter};
//!
//! let dir = tempfile::tempdir()?;
//! for name in ["b.bin", "a.bin"] {
//!     let mut w = TokenWriter::create(&dir.path().join(name), DType::U16)?;
//!     w.write_tokens(&[1, 2, 3, 4, 5, 6, 7, 8])?;
//!     w.finish()?;
//! }
//! // A folder: its token files, sorted; windows of seq_len + 1 = 4 tokens.
//! let options = OpenOptions { seq_len: Some(3), ..Default::default() };
//! let source = open(&[dir.path()], &options)?;
//! assert_eq!(source.manifest().format, Format::Tokens.name());
//! assert_eq!(source.manifest().total_samples(), 4);
//! assert!(source.manifest().shards[0].path.ends_with("a.bin"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use chute_core::{ConfigError, Corruption, DType, Error, Manifest, Source};
use chute_formats::example::ExampleOptions;
use chute_formats::webdataset::{CompressedTarSource, is_compressed_tar};
use chute_formats::{
    Format, Structs, TfRecordOptions, TfRecordSource, TokenOptions, TokenSource, WebDatasetOptions,
    WebDatasetSource, expand_braces, format_of, is_megatron_bin, open_whole,
};
use chute_io::Location;

use crate::documents::Documents;
use crate::mixture::file::{is_mixture_file, open_mixture_file};
use crate::mixture::{MIXTURE_FORMAT, Mixture};
use crate::options::{DEFAULT_SEQ_LEN, OpenOptions};
use crate::pack::{PackOptions, PackedSource};
use crate::text_files::TextFile;

/// The file name [`open`] looks for in a directory, and `chute index` writes.
pub const MANIFEST_NAME: &str = "manifest.json";

/// What a list of inputs names: the format, the shard files (paths or URLs) in order and the
/// manifest they came from, if any. [`Dataset::resolve`] makes it; [`Dataset::open`] opens it.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// The format (given, the manifest's or detected).
    pub format: Format,
    /// The shard files, in dataset order: local paths or URLs held in `PathBuf`s, as the
    /// format sources take them.
    pub files: Vec<PathBuf>,
    /// The manifest (its path or URL, and its contents) when the inputs named one.
    pub manifest: Option<(String, Manifest)>,
}

/// What [`Opened::open`] opened: the source, and what its callers would otherwise work out
/// again (which format it is, the mixture it is).
#[derive(Clone)]
pub struct Opened {
    /// The source.
    pub source: Arc<dyn Source>,
    /// What the inputs were.
    pub kind: Kind,
}

/// What the inputs of [`Opened::open`] were.
#[derive(Clone)]
pub enum Kind {
    /// A dataset of one format (shard files, a folder, a manifest...): what they resolved to.
    Dataset(Dataset),
    /// A mixture file: the mixture (also [`Opened::source`]).
    Mixture(Arc<Mixture>),
    /// Text files tokenized when opened ([`OpenOptions::tokenizer`]).
    Text,
}

impl fmt::Debug for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kind::Dataset(d) => write!(f, "Dataset({}, {} files)", d.format, d.files.len()),
            Kind::Mixture(_) => f.write_str("Mixture"),
            Kind::Text => f.write_str("Text"),
        }
    }
}

impl fmt::Debug for Opened {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Opened")
            .field("kind", &self.kind_name())
            .field("samples", &self.source.manifest().total_samples())
            .finish()
    }
}

impl Opened {
    /// Resolves `inputs` and opens them (see the module documentation): the mixture when the
    /// only input is a mixture file and no format is given ([`crate::mixture::file`]); else
    /// text tokenized when `options` has a tokenizer; else [`Dataset::resolve`] then
    /// [`Dataset::open`].
    pub fn open<P: AsRef<Path>>(inputs: &[P], options: &OpenOptions) -> Result<Opened, Error> {
        if let [one] = inputs
            && options.format.is_none()
            && is_mixture_file(one.as_ref())
        {
            let mixture = Arc::new(open_mixture_file(one.as_ref(), &|paths, o| open(paths, o))?);
            return Ok(Opened {
                source: Arc::clone(&mixture) as Arc<dyn Source>,
                kind: Kind::Mixture(mixture),
            });
        }
        if let Some(encoder) = &options.rows {
            let files = expand_files(inputs)?;
            if files.is_empty() {
                return Err(ConfigError::new("paths", "no files of records given").into());
            }
            let name = files
                .iter()
                .map(|f| f.display().to_string())
                .collect::<Vec<_>>()
                .join(",");
            let (docs, counts) =
                crate::rows::encode_rows(name, &mut open_records(&files), encoder.as_ref())?;
            return Ok(Opened {
                source: Arc::new(packed_rows(docs, &counts, options)?),
                kind: Kind::Text,
            });
        }
        if let Some(encoder) = &options.tokenizer {
            let files = expand_files(inputs)?;
            if files.is_empty() {
                return Err(ConfigError::new("paths", "no text files given").into());
            }
            let name = files
                .iter()
                .map(|f| f.display().to_string())
                .collect::<Vec<_>>()
                .join(",");
            let field = options.text_field.as_deref().unwrap_or("text");
            let docs = crate::text_files::tokenize(
                name,
                &mut open_texts(&files, field),
                field,
                encoder.as_ref(),
            )?;
            let source = Arc::new(PackedSource::new(docs, pack_options(options, None))?);
            return Ok(Opened {
                source,
                kind: Kind::Text,
            });
        }
        let dataset = Dataset::resolve(inputs, options.format)?;
        Ok(Opened {
            source: dataset.open(options)?,
            kind: Kind::Dataset(dataset),
        })
    }

    /// The name of what was opened: the format's ([`Format::name`]), `mixture` or `text`.
    pub fn kind_name(&self) -> &'static str {
        match &self.kind {
            Kind::Dataset(d) => d.format.name(),
            Kind::Mixture(_) => MIXTURE_FORMAT,
            Kind::Text => "text",
        }
    }

    /// The dataset the inputs resolved to, when they were of one format.
    pub fn dataset(&self) -> Option<&Dataset> {
        match &self.kind {
            Kind::Dataset(d) => Some(d),
            _ => None,
        }
    }

    /// The mixture, when the inputs were a mixture file.
    pub fn mixture(&self) -> Option<&Arc<Mixture>> {
        match &self.kind {
            Kind::Mixture(m) => Some(m),
            _ => None,
        }
    }
}

/// The rows of `source` (a table in memory, a Hugging Face dataset's) encoded by
/// `options.rows` and packed as `options` say (`pad` by default), as [`Opened::open`] does
/// with files of records.
pub fn open_rows(
    name: &str,
    source: Arc<dyn Source>,
    options: &OpenOptions,
) -> Result<Arc<dyn Source>, Error> {
    let Some(encoder) = &options.rows else {
        return Err(ConfigError::new("rows", "no encoder of rows given").into());
    };
    let file = TextFile::Records {
        name: name.to_string(),
        source,
    };
    let (docs, counts) = crate::rows::encode_rows(
        name.to_string(),
        &mut std::iter::once(Ok(file)),
        encoder.as_ref(),
    )?;
    Ok(Arc::new(packed_rows(docs, &counts, options)?))
}

/// Encoded rows packed as `options` say: one row a sample (`pad`) unless `pack` is set.
fn packed_rows(
    docs: Documents,
    counts: &crate::rows::RowCounts,
    options: &OpenOptions,
) -> Result<PackedSource, Error> {
    let mut pack = pack_options(options, None);
    if options.pack.is_none() {
        pack.pack = crate::pack::Pack::Pad;
    }
    Ok(PackedSource::new(docs, pack)?.with_counts(counts))
}

/// Resolves `inputs` and opens them: the source of [`Opened::open`].
pub fn open<P: AsRef<Path>>(inputs: &[P], options: &OpenOptions) -> Result<Arc<dyn Source>, Error> {
    Ok(Opened::open(inputs, options)?.source)
}

/// Each of `files` as text to read ([`crate::text_files`]), opened one at a time as the
/// iterator is advanced: JSON Lines (`.jsonl`, `.ndjson`, `.json`) read whole; Parquet,
/// Arrow, tar and TFRecord files opened as sources with `field` as their only column; any
/// other file read whole as one document. Paths or URLs (a URL is downloaded whole, through
/// the node cache when one is set).
pub fn open_texts<'a>(
    files: &'a [PathBuf],
    field: &'a str,
) -> impl Iterator<Item = Result<TextFile, Error>> + 'a {
    open_text_files(files, Some(field))
}

/// Each of `files` as records to read ([`crate::rows`]): as [`open_texts`], columnar files
/// opened with every column, structs whole.
pub fn open_records(files: &[PathBuf]) -> impl Iterator<Item = Result<TextFile, Error>> + '_ {
    open_text_files(files, None)
}

fn open_text_files<'a>(
    files: &'a [PathBuf],
    field: Option<&'a str>,
) -> impl Iterator<Item = Result<TextFile, Error>> + 'a {
    files.iter().map(move |file| {
        let name = file.display().to_string();
        let whole = || -> Result<Bytes, Error> {
            Ok(open_whole(std::slice::from_ref(file), false)?
                .pop()
                .expect("one file")
                .1)
        };
        if is_json_lines(file) {
            return Ok(TextFile::JsonLines {
                name,
                data: whole()?,
            });
        }
        match Format::from_path(file) {
            Some(
                format @ (Format::Parquet | Format::Arrow | Format::WebDataset | Format::TfRecord),
            ) => {
                let options = OpenOptions {
                    format: Some(format),
                    columns: field.map(|f| vec![f.to_string()]),
                    structs: if field.is_some() {
                        Structs::Flatten
                    } else {
                        Structs::Record
                    },
                    ..Default::default()
                };
                let dataset = Dataset::resolve(std::slice::from_ref(file), Some(format))?;
                Ok(TextFile::Records {
                    name,
                    source: dataset.open(&options)?,
                })
            }
            _ => Ok(TextFile::Whole {
                name,
                data: whole()?,
            }),
        }
    })
}

/// Whether `path` is read as JSON Lines.
fn is_json_lines(path: &Path) -> bool {
    let name = path.to_string_lossy();
    let name = name.split(['?', '#']).next().unwrap_or_default();
    [".jsonl", ".ndjson", ".json"]
        .iter()
        .any(|e| name.ends_with(e))
}

/// The packing options: `options.pack` (or the defaults) with the `seq_len` and
/// `out_dtype` of `tokens` (token files: with the manifest's), else of `options`.
fn pack_options(options: &OpenOptions, tokens: Option<TokenOptions>) -> PackOptions {
    let (seq_len, out_dtype) = match tokens {
        Some(t) => (t.seq_len, t.out_dtype),
        None => (
            options.seq_len.unwrap_or(DEFAULT_SEQ_LEN),
            options.out_dtype,
        ),
    };
    PackOptions {
        seq_len,
        out_dtype,
        ..options.pack.clone().unwrap_or_default()
    }
}

/// Whether a directory's `manifest.json` stands for the directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InDirectory {
    /// Use the manifest when there is one (opening).
    Manifest,
    /// List the shards (indexing them anew).
    Shards,
}

impl Dataset {
    /// Resolves `inputs` (see the module docs) into a format and shard files. A manifest must
    /// be the only input; an empty expansion, a folder with no shards, or files of several
    /// formats without `format` are [`ConfigError`]s naming the input.
    pub fn resolve<P: AsRef<Path>>(inputs: &[P], format: Option<Format>) -> Result<Dataset, Error> {
        resolve(inputs, format, InDirectory::Manifest)
    }

    /// [`Dataset::resolve`] for token files: every input is a token file whatever its
    /// extension (a folder's `.bin` files), and the dataset is a Megatron one when every file
    /// is a `.bin` with a Megatron index beside it ([`is_megatron_bin`]).
    pub fn resolve_token_files<P: AsRef<Path>>(inputs: &[P]) -> Result<Dataset, Error> {
        let mut dataset = Dataset::resolve(inputs, Some(Format::Tokens))?;
        if !dataset.files.is_empty() && dataset.files.iter().all(|f| is_megatron_bin(f)) {
            dataset.format = Format::Megatron;
        }
        Ok(dataset)
    }

    /// [`Dataset::resolve`], except that a directory always stands for the shards inside,
    /// never for its `manifest.json` (for `chute index`, which writes that manifest), and a
    /// manifest input is refused.
    pub fn resolve_shards<P: AsRef<Path>>(
        inputs: &[P],
        format: Option<Format>,
    ) -> Result<Dataset, Error> {
        resolve(inputs, format, InDirectory::Shards)
    }

    /// Opens the source over every shard. When the dataset came from a manifest, its
    /// parameters (a token file's `seq_len` and `dtype`) apply unless `options` set them, and
    /// the shards must still match it: files with other sample counts or sizes than it
    /// records are an [`Error::Corrupt`] of kind [`Corruption::StaleIndex`] telling to run
    /// `chute index` again. Options that only change what is read (Parquet columns, TFRecord
    /// features, Parquet chunking) are not a mismatch.
    pub fn open(&self, options: &OpenOptions) -> Result<Arc<dyn Source>, Error> {
        let source = self.open_files(&self.files, options)?;
        if let Some((path, m)) = &self.manifest
            && let Some(why) = stale(m, source.manifest())
        {
            return Err(Error::corrupt_as(
                Corruption::StaleIndex,
                path.clone(),
                0,
                format!(
                    "the manifest does not match its shards ({why}): they changed since it was \
                     written; run `chute index` again"
                ),
            ));
        }
        Ok(source)
    }

    /// Opens the source over `files` (some of this dataset's, such as one shard) with this
    /// dataset's format and the manifest's parameters. No fingerprint check.
    pub fn open_files(
        &self,
        files: &[PathBuf],
        options: &OpenOptions,
    ) -> Result<Arc<dyn Source>, Error> {
        Ok(match self.format {
            Format::Tokens if options.pack.is_some() => {
                let tokens = self.token_options(options)?;
                let mut pack = pack_options(options, Some(tokens));
                let eos = pack.eos_id.take().ok_or_else(|| {
                    ConfigError::new(
                        "eos_id",
                        "flat token files hold no document boundaries: pass the \
                         end-of-sequence id that ends each document (eos_id) to pack them",
                    )
                })?;
                let docs = Documents::split_at_eos(files, tokens.dtype, eos)?;
                Arc::new(PackedSource::new(docs, pack)?)
            }
            Format::Tokens => Arc::new(TokenSource::open(files, self.token_options(options)?)?),
            Format::Megatron => {
                let docs = Documents::megatron(files)?;
                Arc::new(PackedSource::new(docs, pack_options(options, None))?)
            }
            Format::WebDataset => {
                let opts = WebDatasetOptions {
                    index: options.index,
                    ..Default::default()
                };
                if files.iter().any(|f| is_compressed_tar(f)) {
                    Arc::new(CompressedTarSource::open(files, opts)?)
                } else {
                    Arc::new(WebDatasetSource::open(files, opts)?)
                }
            }
            Format::TfRecord => {
                let example = (!options.raw).then(|| ExampleOptions {
                    features: options.columns.clone(),
                    ..Default::default()
                });
                let opts = TfRecordOptions {
                    verify_checksums: options.verify_checksums,
                    example,
                    index: options.index,
                    ..Default::default()
                };
                Arc::new(TfRecordSource::open(files, opts)?)
            }
            Format::Parquet | Format::Arrow | Format::Json if options.pack.is_some() => {
                // Tokenized documents: one row each, its ids in a list column.
                let column = options
                    .columns
                    .as_ref()
                    .and_then(|c| c.first().cloned())
                    .unwrap_or_else(|| "input_ids".to_string());
                let labels = options.columns.as_ref().and_then(|c| c.get(1).cloned());
                let projected = OpenOptions {
                    columns: Some(
                        std::iter::once(column.clone())
                            .chain(labels.clone())
                            .collect(),
                    ),
                    pack: None,
                    ..options.clone()
                };
                let rows = self.open_files(files, &projected)?;
                let name = files
                    .first()
                    .map(|f| f.display().to_string())
                    .unwrap_or_default();
                let docs =
                    Documents::from_column(rows.as_ref(), &column, labels.as_deref(), &name)?;
                Arc::new(PackedSource::new(docs, pack_options(options, None))?)
            }
            Format::Parquet => open_parquet(files, options)?,
            Format::Arrow => open_arrow(files, options)?,
            Format::Json => open_json(files, options)?,
        })
    }

    /// Token options: explicit ones, else the manifest's (it records what a sample is), else
    /// the defaults. An explicit value that contradicts the manifest is refused, since the
    /// shards would no longer match it.
    fn token_options(&self, options: &OpenOptions) -> Result<TokenOptions, Error> {
        let param = |k: &str| self.manifest.as_ref().and_then(|(_, m)| m.params.get(k));
        let manifest_seq_len = param("seq_len").and_then(|v| v.as_u64());
        let manifest_dtype = match param("dtype").and_then(|v| v.as_str()) {
            Some(d) => Some(d.parse::<DType>()?),
            None => None,
        };
        let conflict = |option: &str, given: String, recorded: String| {
            let (path, _) = self.manifest.as_ref().expect("only with a manifest");
            ConfigError::new(
                option,
                format!(
                    "{given} differs from the {recorded} manifest {path} was written with; \
                     leave it unset to use the manifest's"
                ),
            )
        };
        let seq_len = match (options.seq_len, manifest_seq_len) {
            (Some(s), Some(m)) if s as u64 != m => {
                return Err(conflict("seq_len", s.to_string(), m.to_string()).into());
            }
            (Some(s), _) => s,
            (None, Some(m)) => usize::try_from(m).map_err(|_| {
                ConfigError::new("seq_len", format!("the manifest's {m} is too large"))
            })?,
            (None, None) => DEFAULT_SEQ_LEN,
        };
        let dtype = match (options.token_dtype, manifest_dtype) {
            (Some(d), Some(m)) if d != m => {
                return Err(conflict("dtype", d.to_string(), m.to_string()).into());
            }
            (Some(d), _) | (None, Some(d)) => d,
            (None, None) => DType::U16,
        };
        Ok(TokenOptions {
            seq_len,
            dtype,
            out_dtype: options.out_dtype,
        })
    }
}

/// Each file's name (a shard's path up to `#`, without folders), total samples, total bytes
/// and number of shards, in order.
fn per_file(m: &Manifest) -> Vec<(&str, u64, u64, usize)> {
    let mut out: Vec<(&str, u64, u64, usize)> = Vec::new();
    for s in &m.shards {
        let file = s.path.split_once('#').map_or(s.path.as_str(), |(f, _)| f);
        let name = file.rsplit(['/', '\\']).next().unwrap_or(file);
        match out.last_mut() {
            Some(last) if last.0 == name => {
                last.1 += s.samples;
                last.2 += s.bytes;
                last.3 += 1;
            }
            _ => out.push((name, s.samples, s.bytes, 1)),
        }
    }
    out
}

/// How the shards opened differ from what the manifest records, if they do: other files,
/// other sample counts, or (when both cut files into the same number of shards) other sizes.
fn stale(recorded: &Manifest, opened: &Manifest) -> Option<String> {
    let (want, got) = (per_file(recorded), per_file(opened));
    if want.len() != got.len() {
        return Some(format!(
            "it lists {} files, the inputs hold {}",
            want.len(),
            got.len()
        ));
    }
    for (w, g) in want.iter().zip(&got) {
        if w.0 != g.0 {
            return Some(format!("it lists {} where the inputs hold {}", w.0, g.0));
        }
        if w.1 != g.1 {
            return Some(format!(
                "{} holds {} samples, the manifest says {}",
                g.0, g.1, w.1
            ));
        }
        if w.3 == g.3 && w.2 != g.2 {
            return Some(format!(
                "{} is {} bytes, the manifest says {}",
                g.0, g.2, w.2
            ));
        }
    }
    None
}

#[cfg(feature = "arrow")]
fn open_arrow(files: &[PathBuf], options: &OpenOptions) -> Result<Arc<dyn Source>, Error> {
    Ok(Arc::new(chute_formats::ipc::ArrowSource::open(
        files,
        arrow_options(options),
    )?))
}

/// The options of a source of Arrow record batches (IPC files, JSON Lines).
#[cfg(feature = "arrow")]
fn arrow_options(options: &OpenOptions) -> chute_formats::ipc::ArrowOptions {
    chute_formats::ipc::ArrowOptions {
        columns: options.columns.clone(),
        chunk_rows: options.chunk_rows,
        stack: options.stack.clone(),
        nulls: options.nulls,
        fill_null: options.fill_null,
        structs: options.structs,
        decimals: options.decimals,
        dictionaries: options.dictionaries,
    }
}

#[cfg(feature = "arrow")]
fn open_json(files: &[PathBuf], options: &OpenOptions) -> Result<Arc<dyn Source>, Error> {
    Ok(Arc::new(chute_formats::json::open(
        files,
        arrow_options(options),
    )?))
}

#[cfg(not(feature = "arrow"))]
fn open_json(_: &[PathBuf], _: &OpenOptions) -> Result<Arc<dyn Source>, Error> {
    Err(ConfigError::new(
        "format",
        "json: this build of chute has no JSON Lines records (the cargo feature `arrow`)",
    )
    .into())
}

#[cfg(not(feature = "arrow"))]
fn open_arrow(_: &[PathBuf], _: &OpenOptions) -> Result<Arc<dyn Source>, Error> {
    Err(ConfigError::new(
        "format",
        "arrow: this build of chute has no Arrow IPC support (the cargo feature `arrow`)",
    )
    .into())
}

#[cfg(feature = "parquet")]
fn open_parquet(files: &[PathBuf], options: &OpenOptions) -> Result<Arc<dyn Source>, Error> {
    let opts = chute_formats::parquet::ParquetOptions {
        columns: options.columns.clone(),
        chunk_rows: options.chunk_rows,
        stack: options.stack.clone(),
        cache_bytes: options.cache_bytes,
        nulls: options.nulls,
        fill_null: options.fill_null,
        structs: options.structs,
        decimals: options.decimals,
        dictionaries: options.dictionaries,
        ..Default::default()
    };
    Ok(Arc::new(chute_formats::parquet::ParquetSource::open(
        files, opts,
    )?))
}

#[cfg(not(feature = "parquet"))]
fn open_parquet(_: &[PathBuf], _: &OpenOptions) -> Result<Arc<dyn Source>, Error> {
    Err(ConfigError::new(
        "format",
        "parquet: this build of chute has no Parquet support (the cargo feature `parquet`)",
    )
    .into())
}

fn resolve<P: AsRef<Path>>(
    inputs: &[P],
    format: Option<Format>,
    dirs: InDirectory,
) -> Result<Dataset, Error> {
    if inputs.is_empty() {
        return Err(ConfigError::new(
            "paths",
            "no input: name shard files, a folder or a manifest",
        )
        .into());
    }
    let mut files: Vec<PathBuf> = Vec::new();
    for input in inputs {
        let input = input.as_ref();
        let dirs = if inputs.len() > 1 {
            InDirectory::Shards
        } else {
            dirs
        };
        // With the JSON format named, a `.json` input is records, not a manifest.
        let records =
            format == Some(Format::Json) && input.extension().is_some_and(|e| e == "json");
        if let Some(manifest) = manifest_input(input, dirs)?.filter(|_| !records) {
            if inputs.len() > 1 {
                return Err(ConfigError::new(
                    "paths",
                    format!(
                        "{}: a manifest must be the only input (it lists the shards)",
                        manifest.display()
                    ),
                )
                .into());
            }
            if dirs == InDirectory::Shards {
                return Err(ConfigError::new(
                    "paths",
                    format!(
                        "{}: expected shard files, not a manifest",
                        manifest.display()
                    ),
                )
                .into());
            }
            return from_manifest(&manifest, format);
        }
        expand_input(input, format, &mut files)?;
    }
    let format = match format {
        Some(f) => f,
        None => detect(&files)?,
    };
    Ok(Dataset {
        format,
        files,
        manifest: None,
    })
}

/// The files `inputs` name, in order: brace patterns and globs expanded and folders listed as
/// the opener does, with no format taken from the manifest (for inputs in no dataset format,
/// such as the JSON Lines that `chute tokenize` reads). Globs with `*` must match something.
pub fn expand_files<P: AsRef<Path>>(inputs: &[P]) -> Result<Vec<PathBuf>, Error> {
    let mut files = Vec::new();
    for input in inputs {
        expand_input(input.as_ref(), None, &mut files)?;
    }
    Ok(files)
}

/// Adds the files one input names, its brace pattern expanded first.
fn expand_input(input: &Path, format: Option<Format>, out: &mut Vec<PathBuf>) -> Result<(), Error> {
    match input.to_str() {
        Some(s) if s.contains('{') => {
            for name in expand_braces(s)? {
                expand_one(Path::new(&name), format, out)?;
            }
            Ok(())
        }
        _ => expand_one(input, format, out),
    }
}

/// The manifest `input` stands for, if any: a `.json` path or URL, or (when opening) a local
/// directory holding `manifest.json`.
fn manifest_input(input: &Path, dirs: InDirectory) -> Result<Option<PathBuf>, Error> {
    if input.extension().is_some_and(|e| e == "json") {
        return Ok(Some(input.to_path_buf()));
    }
    let Location::Local(dir) = Location::from_path(input)? else {
        return Ok(None);
    };
    if dirs == InDirectory::Manifest && dir.is_dir() {
        let m = dir.join(MANIFEST_NAME);
        if m.is_file() {
            return Ok(Some(m));
        }
    }
    Ok(None)
}

/// Adds the files one (brace-expanded) input names: itself, a glob's matches or a
/// directory's shards.
///
/// A local input with `*` is a glob (no match is an error); one with only `?` or `[` is a
/// glob when it matches something and a literal path otherwise (`shard[1].tar`). URLs are
/// never globs (`?` starts a query there): a URL with `*`, or ending in `/`, is refused.
fn expand_one(input: &Path, format: Option<Format>, out: &mut Vec<PathBuf>) -> Result<(), Error> {
    let local = match Location::from_path(input)? {
        Location::Local(p) => p,
        Location::Remote(url) => {
            if url.contains('*') || url.ends_with('/') {
                return Err(ConfigError::new(
                    "paths",
                    format!(
                        "{url}: globs and folders are listed on local disks only; name remote \
                         shards with a brace pattern (shard-{{000000..000127}}.tar) or a manifest"
                    ),
                )
                .into());
            }
            out.push(input.to_path_buf());
            return Ok(());
        }
    };
    if local.is_dir() {
        return list_directory(&local, format, out);
    }
    // A Megatron dataset named by its prefix or its `.idx`: its `.bin` stands for it.
    if !local.is_file() || local.extension().is_some_and(|e| e == "idx") {
        let (_, bin) = chute_formats::megatron::paths_of(&local);
        if bin != local && is_megatron_bin(&bin) {
            out.push(bin);
            return Ok(());
        }
    }
    let text = local.to_str().unwrap_or_default();
    if !text.contains(['*', '?', '[']) || local.exists() {
        out.push(local);
        return Ok(());
    }
    let options = glob::MatchOptions {
        require_literal_leading_dot: true,
        ..glob::MatchOptions::new()
    };
    let matches = glob::glob_with(text, options)
        .map_err(|e| ConfigError::new("paths", format!("{text}: not a valid glob pattern: {e}")))?;
    let mut found: Vec<PathBuf> = Vec::new();
    for m in matches {
        let path = m.map_err(|e| {
            let path = e.path().display().to_string();
            Error::io(path, e.into())
        })?;
        if path.is_file() && !is_bookkeeping(&path) {
            found.push(path);
        }
    }
    if found.is_empty() {
        if text.contains('*') {
            return Err(
                ConfigError::new("paths", format!("{text}: no files match the pattern")).into(),
            );
        }
        out.push(local); // a literal name with `?` or `[`: opening it says it is missing
        return Ok(());
    }
    found.sort();
    out.extend(found);
    Ok(())
}

/// Files beside shards that are never shards: index files, manifests, unfinished writes.
fn is_bookkeeping(path: &Path) -> bool {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    name == MANIFEST_NAME || name.ends_with(".idx") || name.ends_with(chute_io::TEMP_SUFFIX)
}

/// Every shard of the format inside `dir` (not its subfolders), sorted by name. Without a
/// format, the one format whose files the folder holds.
fn list_directory(dir: &Path, format: Option<Format>, out: &mut Vec<PathBuf>) -> Result<(), Error> {
    let io = |e| Error::io(dir.display().to_string(), e);
    let mut by_format: Vec<(Format, PathBuf)> = Vec::new();
    // Files no extension speaks for (`train-00000-of-00010`): shards when a format is given.
    let mut unnamed: Vec<PathBuf> = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        let hidden = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_none_or(|n| n.starts_with('.'));
        if hidden || !path.is_file() || is_bookkeeping(&path) {
            continue;
        }
        match format_of(&path) {
            Some(f) => by_format.push((f, path)),
            None if path.extension().is_none() => unnamed.push(path),
            None => {}
        }
    }
    if let Some(f) = format {
        by_format.extend(unnamed.into_iter().map(|p| (f, p)));
    }
    let format = match format {
        Some(f) => f,
        None => {
            let mut found: Vec<Format> = by_format.iter().map(|(f, _)| *f).collect();
            found.sort_by_key(|f| f.name());
            found.dedup();
            match found.as_slice() {
                [one] => *one,
                [] => {
                    return Err(ConfigError::new(
                        "paths",
                        format!(
                            "{}: the folder holds no shards ({} files, by extension; \
                             subfolders are not searched: name them, or use a glob such as \
                             {}/**/*.tar)",
                            dir.display(),
                            Format::names(),
                            dir.display()
                        ),
                    )
                    .into());
                }
                several => {
                    let names: Vec<&str> = several.iter().map(|f| f.name()).collect();
                    return Err(ConfigError::new(
                        "paths",
                        format!(
                            "{}: the folder holds shards of several formats ({}); pass the \
                             format to choose",
                            dir.display(),
                            names.join(", ")
                        ),
                    )
                    .into());
                }
            }
        }
    };
    // A Megatron dataset's `.bin` is a token file too: either format takes it.
    let token_like = |f: Format| matches!(f, Format::Tokens | Format::Megatron);
    let mut files: Vec<PathBuf> = by_format
        .into_iter()
        .filter(|(f, _)| *f == format || (token_like(*f) && token_like(format)))
        .map(|(_, p)| p)
        .collect();
    if files.is_empty() {
        return Err(ConfigError::new(
            "paths",
            format!(
                "{}: the folder holds no {format} shards (files ending in .{})",
                dir.display(),
                format.extensions().join(", .")
            ),
        )
        .into());
    }
    files.sort();
    out.extend(files);
    Ok(())
}

/// The format the files' extensions imply; they must agree.
fn detect(files: &[PathBuf]) -> Result<Format, Error> {
    let mut found: Option<Format> = None;
    for path in files {
        let Some(f) = format_of(path) else {
            let ext = path.extension().map(|e| e.to_string_lossy().into_owned());
            let what = match ext {
                Some(e) => format!("its extension .{e}"),
                None => "a name without an extension".to_owned(),
            };
            return Err(ConfigError::new(
                "format",
                format!(
                    "cannot tell the format of {} from {what}; pass the format ({})",
                    path.display(),
                    Format::names()
                ),
            )
            .into());
        };
        match found {
            Some(g) if g != f => {
                return Err(ConfigError::new(
                    "format",
                    format!(
                        "{} is a {f} file but earlier inputs are {g}; open one format at a time \
                         or pass the format",
                        path.display()
                    ),
                )
                .into());
            }
            _ => found = Some(f),
        }
    }
    Ok(found.expect("resolve never leaves the list empty"))
}

/// The dataset a manifest describes: its format (unless given) and its shard files, relative
/// to the manifest's folder or URL.
fn from_manifest(path: &Path, format: Option<Format>) -> Result<Dataset, Error> {
    let name = path.display().to_string();
    let location = Location::from_path(path)?;
    let bytes = location.read()?;
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        Error::corrupt(
            name.clone(),
            e.valid_up_to() as u64,
            "the manifest is not UTF-8 text",
        )
    })?;
    let manifest = Manifest::from_json(text, &name)?;
    let recorded = manifest.format.parse::<Format>().map_err(|_| {
        Error::corrupt_as(
            Corruption::Unsupported,
            name.clone(),
            0,
            format!(
                "the manifest names format {:?}, which chute does not read ({})",
                manifest.format,
                Format::names()
            ),
        )
    })?;
    if let Some(f) = format
        && f != recorded
    {
        return Err(ConfigError::new(
            "format",
            format!("{f}, but manifest {name} describes {recorded} shards; leave it unset"),
        )
        .into());
    }
    let format = recorded;
    let mut files: Vec<PathBuf> = Vec::new();
    for s in &manifest.shards {
        // Parquet shards are chunks of row groups: `file.parquet#rowgroup0:0+65536`.
        let file = s
            .path
            .split_once("#rowgroup")
            .map_or(s.path.as_str(), |(f, _)| f);
        let p = PathBuf::from(location.join_sibling(file)?.to_string());
        if files.last() != Some(&p) {
            files.push(p);
        }
    }
    if files.is_empty() {
        return Err(Error::corrupt(name, 0, "the manifest lists no shards"));
    }
    Ok(Dataset {
        format,
        files,
        manifest: Some((name, manifest)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staleness_is_about_files_not_options() {
        let shard = |path: &str, samples, bytes| chute_core::ShardInfo {
            path: path.into(),
            samples,
            bytes,
        };
        let recorded = Manifest::new(
            "parquet",
            vec![
                shard("d/a.parquet#rowgroup0:0+5", 5, 50),
                shard("d/a.parquet#rowgroup0:5+5", 5, 50),
            ],
        )
        .with_param("columns", "x,y");
        // Other columns, other chunks, another folder: the same files.
        let opened = Manifest::new(
            "parquet",
            vec![shard("/e/a.parquet#rowgroup0:0+10", 10, 101)],
        )
        .with_param("columns", "x");
        assert_eq!(stale(&recorded, &opened), None);
        let grown = Manifest::new("parquet", vec![shard("a.parquet#rowgroup0:0+11", 11, 101)]);
        assert!(stale(&recorded, &grown).unwrap().contains("11 samples"));
        let tar = |bytes| Manifest::new("webdataset", vec![shard("x.tar", 3, bytes)]);
        assert!(
            stale(&tar(10240), &tar(11264))
                .unwrap()
                .contains("11264 bytes")
        );
        assert!(stale(&tar(10240), &Manifest::new("webdataset", vec![])).is_some());
    }

    #[test]
    fn format_names_round_trip_and_extensions_detect() {
        for f in Format::ALL {
            assert_eq!(f.name().parse::<Format>().unwrap(), f);
            assert_eq!(f.to_string(), f.name());
            for ext in f.extensions() {
                assert_eq!(Format::from_path(Path::new(&format!("x/a.{ext}"))), Some(f));
            }
        }
        assert_eq!(
            Format::from_path(Path::new("a.tfrecord.gz")),
            Some(Format::TfRecord)
        );
        assert_eq!(
            Format::from_path(Path::new("a.tar.gz")),
            Some(Format::WebDataset)
        );
        assert_eq!(
            Format::from_path(Path::new("s3://b/a.tgz")),
            Some(Format::WebDataset)
        );
        for name in ["a.jsonl.gz", "a.ndjson.zst", "s3://b/a.jsonl?x=1"] {
            assert_eq!(
                Format::from_path(Path::new(name)),
                Some(Format::Json),
                "{name}"
            );
        }
        assert_eq!(Format::from_path(Path::new("a.parquet.zst")), None);
        let tfds = Path::new("mnist-train.tfrecord-00003-of-00004");
        assert_eq!(Format::from_path(tfds), Some(Format::TfRecord));
        assert_eq!(Format::from_path(Path::new("a.txt")), None);
        let e = "csv".parse::<Format>().unwrap_err().to_string();
        assert!(e.contains("\"csv\"") && e.contains("webdataset"), "{e}");
    }

    fn touch(dir: &Path, names: &[&str]) {
        for n in names {
            std::fs::write(dir.join(n), b"").unwrap();
        }
    }

    fn names(d: &Dataset) -> Vec<String> {
        d.files
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn folders_list_their_shards_sorted() {
        let dir = tempfile::tempdir().unwrap();
        touch(
            dir.path(),
            &[
                "b.parquet",
                "a.parquet",
                ".hidden.parquet",
                "README.md",
                "c.pq",
            ],
        );
        std::fs::create_dir(dir.path().join("sub.parquet")).unwrap();
        let d = Dataset::resolve(&[dir.path()], None).unwrap();
        assert_eq!(d.format, Format::Parquet);
        assert_eq!(names(&d), ["a.parquet", "b.parquet", "c.pq"]);

        touch(dir.path(), &["x.tar", "x.tar.idx"]);
        let e = Dataset::resolve(&[dir.path()], None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("several formats") && e.contains("webdataset"),
            "{e}"
        );
        let d = Dataset::resolve(&[dir.path()], Some(Format::WebDataset)).unwrap();
        assert_eq!(names(&d), ["x.tar"]);
        let e = Dataset::resolve(&[dir.path()], Some(Format::TfRecord)).unwrap_err();
        assert!(e.to_string().contains("no tfrecord shards"), "{e}");
        // Names without an extension are shards of a format given, never guessed.
        touch(
            dir.path(),
            &["train-00000-of-00002", "train-00001-of-00002"],
        );
        let d = Dataset::resolve(&[dir.path()], Some(Format::TfRecord)).unwrap();
        assert_eq!(names(&d), ["train-00000-of-00002", "train-00001-of-00002"]);

        let empty = tempfile::tempdir().unwrap();
        let e = Dataset::resolve(&[empty.path()], None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("holds no shards"), "{e}");
    }

    #[test]
    fn globs_and_braces_expand_in_order() {
        let dir = tempfile::tempdir().unwrap();
        touch(dir.path(), &["s-2.tar", "s-0.tar", "s-1.tar", "t-0.tar"]);
        let d = dir.path().display();
        let r = Dataset::resolve(&[format!("{d}/s-*.tar")], None).unwrap();
        assert_eq!(names(&r), ["s-0.tar", "s-1.tar", "s-2.tar"]);
        let r = Dataset::resolve(
            &[format!("{d}/s-{{2,0}}.tar"), format!("{d}/t-?.tar")],
            None,
        )
        .unwrap();
        assert_eq!(names(&r), ["s-2.tar", "s-0.tar", "t-0.tar"]);
        let e = Dataset::resolve(&[format!("{d}/z-*.tar")], None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no files match"), "{e}");
        // Hidden files and bookkeeping never match; file:// URLs glob as paths do.
        touch(dir.path(), &[".s-9.tar", "s-0.tar.idx", "s-5.tar.tmp"]);
        let r = Dataset::resolve(&[format!("file://{d}/s-*")], None).unwrap();
        assert_eq!(names(&r), ["s-0.tar", "s-1.tar", "s-2.tar"]);
        // Without `*`, a name that matches nothing is a literal path (opening reports it).
        let r = Dataset::resolve(&[format!("{d}/shard[1].tar")], None).unwrap();
        assert_eq!(names(&r), ["shard[1].tar"]);
        // URLs are never globs: `?` starts a query.
        let r = Dataset::resolve(&["https://h/x.tar?sig=1"], None).unwrap();
        assert_eq!(r.files, [PathBuf::from("https://h/x.tar?sig=1")]);
    }

    #[test]
    fn detection_names_the_file_and_refuses_mixtures() {
        let e = Dataset::resolve(&["data/x.txt"], None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("data/x.txt") && e.contains("extension .txt"),
            "{e}"
        );
        assert!(!e.contains("Some("), "{e}");
        let e = Dataset::resolve(&["a.tar", "b.parquet"], None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("b.parquet is a parquet file"), "{e}");
        let r = Dataset::resolve(&["a.data"], Some(Format::Tokens)).unwrap();
        assert_eq!(r.format, Format::Tokens);
        let e = Dataset::resolve(&["s3://bucket/x/*.tar"], None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("brace pattern"), "{e}");
    }

    #[test]
    fn manifests_resolve_relative_to_themselves() {
        let dir = tempfile::tempdir().unwrap();
        let m = Manifest::new(
            "parquet",
            vec![
                chute_core::ShardInfo {
                    path: "p.parquet#rowgroup0:0+10".into(),
                    samples: 10,
                    bytes: 1,
                },
                chute_core::ShardInfo {
                    path: "p.parquet#rowgroup0:10+5".into(),
                    samples: 5,
                    bytes: 1,
                },
                chute_core::ShardInfo {
                    path: "q.parquet#rowgroup0:0+3".into(),
                    samples: 3,
                    bytes: 1,
                },
            ],
        );
        std::fs::write(dir.path().join(MANIFEST_NAME), m.to_json()).unwrap();
        touch(dir.path(), &["p.parquet", "q.parquet"]);
        for input in [dir.path().to_path_buf(), dir.path().join(MANIFEST_NAME)] {
            let r = Dataset::resolve(&[&input], None).unwrap();
            assert_eq!(r.format, Format::Parquet);
            assert_eq!(
                r.files,
                [dir.path().join("p.parquet"), dir.path().join("q.parquet")]
            );
            assert!(r.manifest.is_some());
        }
        // Indexing a folder lists its shards, ignoring the manifest.
        let r = Dataset::resolve_shards(&[dir.path()], None).unwrap();
        assert!(r.manifest.is_none());
        assert_eq!(names(&r), ["p.parquet", "q.parquet"]);
        let e = Dataset::resolve(
            &[dir.path().join(MANIFEST_NAME), dir.path().join("p.parquet")],
            None,
        )
        .unwrap_err();
        assert!(e.to_string().contains("only input"), "{e}");
        // A folder among other inputs stands for its shards, not its manifest.
        let other = tempfile::tempdir().unwrap();
        touch(other.path(), &["r.parquet"]);
        let r = Dataset::resolve(&[dir.path(), other.path()], None).unwrap();
        assert!(r.manifest.is_none());
        assert_eq!(names(&r), ["p.parquet", "q.parquet", "r.parquet"]);
        let e = Dataset::resolve(&[dir.path()], Some(Format::TfRecord)).unwrap_err();
        assert!(e.to_string().contains("describes parquet shards"), "{e}");
    }

    #[cfg(feature = "arrow")]
    #[test]
    fn json_lines_open_by_extension_and_a_json_array_when_named() {
        let dir = tempfile::tempdir().unwrap();
        let lines = dir.path().join("a.jsonl");
        std::fs::write(&lines, "{\"x\": 1}\n{\"x\": 2}\n").unwrap();
        let array = dir.path().join("a.json");
        std::fs::write(&array, "[{\"x\": 1}, {\"x\": 2}, {\"x\": 3}]").unwrap();
        let r = Opened::open(&[&lines], &OpenOptions::default()).unwrap();
        assert_eq!(r.source.manifest().total_samples(), 2);
        let named = OpenOptions {
            format: Some(Format::Json),
            ..Default::default()
        };
        let r = Opened::open(&[&array], &named).unwrap();
        assert_eq!(r.source.manifest().total_samples(), 3);
        // Unnamed, a .json input is a manifest, as before.
        assert!(Opened::open(&[&array], &OpenOptions::default()).is_err());
    }
}
