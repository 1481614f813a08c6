//! chute's format codecs: how bytes become samples, and samples bytes.
//!
//! Decoders here never do I/O of their own: they read from a slice or a memory map handed in
//! by `chute-io`, so the same code serves local files and remote objects, and can be fuzzed.
//!
//! - [`TokenSource`], [`TokenOptions`], [`TokenWriter`]: nanoGPT-style token files (flat
//!   `uint16`/`uint32` ids), read as non-overlapping windows of `seq_len + 1` tokens.
//! - [`NpyHeader`], [`read_npy`], [`write_npy`]: numpy's `.npy` format, versions 1.0 to 3.0.
//! - [`webdataset`]: WebDataset tar shards: [`WebDatasetSource`] (random access through
//!   per-shard indexes), [`webdataset::ShardWriter`], [`expand_braces`]; over the sans-IO
//!   [`tar`] decoder and writer (ustar, pax, GNU long names).
//! - [`tfrecord`] and [`example`]: TFRecord framing with CRC32C, [`TfRecordSource`], writers,
//!   DALI-format index files, GZIP streaming; a hand-written `tf.train.Example` codec.
//! - `parquet` (feature `parquet`): `ParquetSource` with projection and a columnar fast path,
//!   `ParquetWriter`.
//! - `ipc` (feature `arrow`): `ArrowSource` over Arrow IPC files and streams (memory-mapped,
//!   decoded per record batch on first use), or over record batches handed over through the
//!   Arrow C stream interface with a Hugging Face indices mapping.
//! - [`megatron`]: Megatron-Core's indexed datasets (`.bin` + `.idx`), [`MegatronIndex`] and
//!   [`MegatronWriter`]; [`Documents`]: where documents lie in token files (a Megatron index,
//!   or flat files split at an end-of-sequence id); [`PackedSource`]: documents packed into
//!   training rows (`concat`, `document`, `best_fit`, `pad`; [`pack`]); [`text`]: documents'
//!   text from JSON Lines, Parquet, Arrow, tar, TFRecord or text files, tokenized when opened
//!   with [`OpenOptions::tokenizer`].
//! - [`open`], [`Dataset`], [`Format`], [`OpenOptions`]: the one way to open a dataset from
//!   paths, URLs, brace patterns, globs, folders or a manifest, the format given or detected.
//! - `check::check_reader` (feature `testing`): the conformance suite every reader passes.
//! - [`parse_token_text`], [`token_ids_from_npy`]: token ids from text or `.npy` arrays, to
//!   feed a [`TokenWriter`].
//!
//! ```
//! use chute_core::{DType, Field, Source};
//! use chute_formats::{TokenOptions, TokenSource, TokenWriter, parse_token_text};
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("train.bin");
//! let mut writer = TokenWriter::create(&path, DType::U16)?;
//! writer.write_tokens(&parse_token_text("10 11 12 13 14 15 16 17 18", "ids.txt")?)?;
//! assert_eq!(writer.finish()?, 9);
//!
//! // Windows of seq_len + 1 = 4 tokens: [10..14), [14..18); token 18 is left over.
//! let source = TokenSource::open(&[&path], TokenOptions {
//!     seq_len: 3, dtype: DType::U16, out_dtype: DType::I64,
//! })?;
//! assert_eq!(source.manifest().total_samples(), 2);
//! let sample = source.read(1)?;
//! let Some(Field::Array(tokens)) = sample.get("tokens") else { unreachable!() };
//! assert_eq!(tokens.dtype, DType::U16);
//! assert_eq!(tokens.shape, [4]);
//! assert_eq!(tokens.cast, Some(DType::I64)); // the batcher widens while it copies
//! assert_eq!(&tokens.data[..], &[14, 0, 15, 0, 16, 0, 17, 0]); // a view of the file's bytes
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

mod braces;
#[cfg(any(test, feature = "testing"))]
pub mod check;
#[cfg(feature = "arrow")]
mod columnar;
mod dataset;
pub mod documents;
pub mod example;
mod ids;
mod indexed;
#[cfg(feature = "arrow")]
pub mod ipc;
pub mod megatron;
pub mod mixture;
pub mod pack;
#[cfg(feature = "parquet")]
pub mod parquet;
pub mod tar;
#[cfg(test)]
mod test_support;
pub mod text;
pub mod tfrecord;
mod tokens;
pub mod webdataset;

pub use dataset::{
    DEFAULT_SEQ_LEN, Dataset, Format, MANIFEST_NAME, OpenOptions, expand_files, is_megatron_bin,
    open,
};
pub use documents::Documents;
pub use ids::{parse_token_text, token_ids_from_npy};
pub use megatron::{MegatronIndex, MegatronWriter};
pub use pack::{Long, Pack, PackOptions, PackedSource};

/// Columnar columns (Parquet, Arrow) stacked side by side into one column: `(name,
/// members)`. The members, numeric scalars or fixed-size lists of one dtype, leave the batch;
/// `name`, a `[B, k]` tensor (`k` their total width, members in the order given), takes the
/// first member's place. A model's feature matrix this way comes out of the workers whole
/// instead of being stacked from `k` columns on the training thread.
pub type Stack = Vec<(String, Vec<String>)>;

/// `NAME=COL,COL,...` (the CLI's `--stack`) as one [`Stack`] entry; the member list may use
/// brace patterns (`x=f{0..15}` stacks `f0` to `f15`).
///
/// ```
/// use chute_formats::parse_stack;
/// let (name, cols) = parse_stack("x=f{0..2},g{a,b},h")?;
/// assert_eq!(name, "x");
/// assert_eq!(cols, ["f0", "f1", "f2", "ga", "gb", "h"]);
/// assert!(parse_stack("x").is_err() && parse_stack("=a").is_err() && parse_stack("x=").is_err());
/// # Ok::<(), chute_core::ConfigError>(())
/// ```
pub fn parse_stack(spec: &str) -> Result<(String, Vec<String>), chute_core::ConfigError> {
    let bad = |why: &str| {
        chute_core::ConfigError::new(
            "stack",
            format!("{spec:?}: {why}; write NAME=COL,COL,... (e.g. x=f{{0..15}})"),
        )
    };
    let (name, members) = spec.split_once('=').ok_or_else(|| bad("no `=`"))?;
    if name.is_empty() {
        return Err(bad("no name before `=`"));
    }
    // Commas separate columns, except inside a brace pattern (`f{0,2}`).
    let mut cols = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, ch) in members.char_indices().chain([(members.len(), ',')]) {
        match ch {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                if i > start {
                    cols.extend(expand_braces(&members[start..i])?);
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    if cols.is_empty() {
        return Err(bad("no columns after `=`"));
    }
    Ok((name.to_string(), cols))
}

/// Where an indexed source (WebDataset tar shards, TFRecord files) gets each shard's sample
/// offsets: the `<shard>.idx` files `chute index` writes, or a scan of the shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IndexMode {
    /// Read `<shard>.idx` when it exists, scan the shard otherwise. The default.
    #[default]
    Auto,
    /// Read `<shard>.idx`; a missing index is an error (for datasets too large to scan at
    /// start-up).
    Require,
    /// Always scan, ignoring index files (for shards whose indexes may be stale).
    Scan,
}

impl IndexMode {
    /// Every mode, as [`IndexMode::name`]s them.
    pub const ALL: [IndexMode; 3] = [IndexMode::Auto, IndexMode::Require, IndexMode::Scan];

    /// `auto`, `require` or `scan`: what the CLI and Python take.
    pub fn name(self) -> &'static str {
        match self {
            IndexMode::Auto => "auto",
            IndexMode::Require => "require",
            IndexMode::Scan => "scan",
        }
    }
}

impl std::fmt::Display for IndexMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for IndexMode {
    type Err = chute_core::ConfigError;

    fn from_str(s: &str) -> Result<IndexMode, chute_core::ConfigError> {
        IndexMode::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                chute_core::ConfigError::new(
                    "index",
                    format!("{s:?}; use \"auto\", \"require\" or \"scan\""),
                )
            })
    }
}
pub use chute_core::npy::{NpyHeader, npy_descr, read_npy, write_npy};
pub use tfrecord::{TfRecordOptions, TfRecordSource};
pub use tokens::{TOKENS_FIELD, TokenOptions, TokenSource, TokenWriter};
pub use webdataset::{WebDatasetOptions, WebDatasetSource, expand_braces};

/// The whole contents of each of `paths` (local paths or URLs, see [`chute_io::Location`]),
/// with its name: a view of the memory map for a local file (advised for random access when
/// `random`), or the object downloaded whole (through the node-local cache, if one is set)
/// for a URL. For sources that read files in place rather than streaming them as shards.
pub(crate) fn open_whole<P: AsRef<std::path::Path>>(
    paths: &[P],
    random: bool,
) -> Result<Vec<(String, bytes::Bytes)>, chute_core::Error> {
    let locations = paths
        .iter()
        .map(|p| chute_io::Location::from_path(p.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    let set = chute_io::ShardSet::open(&locations)?;
    (0..set.len())
        .map(|i| {
            if let Some(map) = set.mapped(i) {
                // Either way: a map shared with an earlier source keeps its advice.
                if random {
                    map.advise_random();
                } else {
                    map.advise_normal();
                }
                return Ok((set.uri(i).to_string(), map.bytes(0..map.len())));
            }
            Ok((set.uri(i).to_string(), set.get(i)?))
        })
        .collect()
}
