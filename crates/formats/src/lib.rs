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
//!   [`MegatronWriter`].
//! - [`Format`]: the formats chute reads, their names and the file names that mean them;
//!   [`IndexMode`]: where indexed shards' offsets come from; [`Stack`]: columns stacked into
//!   one; [`open_whole`]: files read whole.
//! - `check::check_reader` (feature `testing`): the conformance suite every reader passes.
//!
//! What opens a dataset (format detection, brace patterns, globs, folders, manifests) and the
//! sources made of other sources (mixtures, documents, packing, tokenized text) are in
//! `chute-dataset`, which builds on this crate; nothing here calls it.
//!
//! ```
//! use chute_core::{DType, Field, Source};
//! use chute_formats::{TokenOptions, TokenSource, TokenWriter};
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("train.bin");
//! let mut writer = TokenWriter::create(&path, DType::U16)?;
//! writer.write_tokens(&[10, 11, 12, 13, 14, 15, 16, 17, 18])?;
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

#[cfg(feature = "arrow")]
mod arrow_types;
mod braces;
#[cfg(any(test, feature = "testing"))]
pub mod check;
#[cfg(feature = "arrow")]
mod codes;
#[cfg(feature = "arrow")]
mod columnar;
pub mod example;
mod format;
mod indexed;
#[cfg(feature = "arrow")]
pub mod ipc;
#[cfg(feature = "arrow")]
pub mod json;
pub mod megatron;
mod nulls;
#[cfg(feature = "parquet")]
pub mod parquet;
mod stack;
pub mod tar;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tfrecord;
mod tokens;
#[cfg(feature = "arrow")]
pub mod values;
pub mod webdataset;
mod whole;

pub use chute_core::npy::{NpyHeader, npy_descr, read_npy, write_npy};
pub use format::{Format, format_of, is_megatron_bin};
pub use indexed::IndexMode;
pub use megatron::{MegatronIndex, MegatronWriter};
pub use nulls::{Decimals, Dictionaries, Fill, Nulls, Structs};
pub use stack::{Stack, parse_stack};
pub use tfrecord::{TfRecordOptions, TfRecordSource};
pub use tokens::{TOKENS_FIELD, TokenOptions, TokenSource, TokenWriter};
pub use webdataset::{WebDatasetOptions, WebDatasetSource, expand_braces};
pub use whole::open_whole;
