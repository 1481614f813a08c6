//! [`OpenOptions`]: how the opener reads a dataset, each format's options side by side.

use std::sync::Arc;

use chute_core::{DType, RowEncoder, TextEncoder};
use chute_formats::{Decimals, Dictionaries, Fill, Format, IndexMode, Nulls, Stack, Structs};

use crate::pack::PackOptions;

/// How [`crate::open`] reads a dataset: the format (detected when `None`) and each format's
/// options. Fields a format does not use are ignored.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// The format; by default the manifest's, or the one the files' extensions imply.
    pub format: Option<Format>,
    /// Token files: tokens per training sequence (a sample is `seq_len + 1` tokens). By
    /// default the manifest's, else 1,024.
    pub seq_len: Option<usize>,
    /// Token files: the stored token type. By default the manifest's, else `uint16`.
    pub token_dtype: Option<DType>,
    /// Token files: the dtype of the batch tensor (default `int64`).
    pub out_dtype: DType,
    /// Parquet or Arrow columns, or TFRecord features, to read, in this order (default: all).
    pub columns: Option<Vec<String>>,
    /// Parquet and Arrow: rows per shard (row groups and record batches are split into
    /// chunks of this many rows).
    pub chunk_rows: Option<usize>,
    /// Parquet and Arrow: columns stacked into one `[B, k]` column (see [`Stack`]).
    pub stack: Stack,
    /// Parquet and Arrow: what a null does (filled, with a `<name>_valid` column, by
    /// default; filled without one; or an error).
    pub nulls: Nulls,
    /// Parquet and Arrow: what null slots are filled with.
    pub fill_null: Fill,
    /// How struct columns are read (Parquet, Arrow, JSON Lines): a column per leaf, or whole.
    pub structs: Structs,
    /// How decimal columns are read (Parquet, Arrow): float64, or exactly (their text; a
    /// `decimal.Decimal` in Python).
    pub decimals: Decimals,
    /// How dictionary columns are read (Parquet, Arrow): their values, or `int64` codes into
    /// one dictionary for the source.
    pub dictionaries: Dictionaries,
    /// Parquet: bytes of decoded data kept in memory for later epochs (default: none kept,
    /// pieces of row groups are dropped once read; see `ParquetOptions::cache_bytes`).
    pub cache_bytes: Option<usize>,
    /// Tar and TFRecord: where shard indexes come from.
    pub index: IndexMode,
    /// TFRecord: records as raw bytes (a `record` field) instead of `tf.train.Example`s.
    pub raw: bool,
    /// TFRecord: verify each record's CRC32Cs (the default).
    pub verify_checksums: bool,
    /// Token files, Megatron datasets, tokenized Parquet and Arrow: documents packed into rows
    /// ([`PackedSource`](crate::PackedSource); its `seq_len` and `out_dtype` are the options above). Megatron
    /// datasets are packed (`concat` by default) whether set or not; token files only when
    /// set, their documents ending with `eos_id` (which is then their delimiter, not
    /// appended); Parquet and Arrow only when set, one document a row, its ids in the list
    /// column `columns[0]` (default `input_ids`) and, when named, its labels in `columns[1]`
    /// (a `labels` column in every packing mode, -100 on padding).
    pub pack: Option<PackOptions>,
    /// Text documents tokenized when opened ([`crate::text_files`]): with a tokenizer the inputs are
    /// JSON Lines, Parquet, Arrow, tar, TFRecord or text files whatever their format, every
    /// document is tokenized by it (on its threads) and packed by `pack` (`concat` by
    /// default), `seq_len` and `out_dtype` as for token files.
    pub tokenizer: Option<Arc<dyn TextEncoder>>,
    /// Rows of records (chat conversations, prompts and completions) encoded into ids and
    /// labels when opened ([`crate::rows`]), then packed by `pack` (`pad`, one row a sample,
    /// by default). The inputs are JSON Lines, Parquet, Arrow, tar or TFRecord files.
    pub rows: Option<Arc<dyn RowEncoder>>,
    /// With `tokenizer`: the JSON key, column, tar member extension or feature holding each
    /// document's text (default `text`).
    pub text_field: Option<String>,
}

/// Tokens per sequence when neither the options nor a manifest say.
pub const DEFAULT_SEQ_LEN: usize = 1024;

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            format: None,
            seq_len: None,
            token_dtype: None,
            out_dtype: DType::I64,
            columns: None,
            chunk_rows: None,
            stack: Stack::new(),
            nulls: Nulls::Mask,
            fill_null: Fill::default(),
            structs: Structs::Flatten,
            decimals: Decimals::Float,
            dictionaries: Dictionaries::Values,
            cache_bytes: None,
            index: IndexMode::Auto,
            raw: false,
            verify_checksums: true,
            pack: None,
            tokenizer: None,
            rows: None,
            text_field: None,
        }
    }
}
