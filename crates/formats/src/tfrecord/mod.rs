//! TFRecord files: the framing codec, writers, DALI-style index files, GZIP streaming and
//! [`TfRecordSource`].
//!
//! A TFRecord file is a sequence of records, each framed as
//!
//! ```text
//! u64 length (little-endian) | u32 masked_crc32c(length bytes) | data[length] | u32 masked_crc32c(data)
//! ```
//!
//! where `masked_crc32c(x) = crc32c(x).rotate_right(15) + 0xa282ead8` (TensorFlow's
//! `core/lib/hash/crc32c.h`: masking keeps a CRC of data that contains CRCs from being
//! trivially zero). A record usually holds a serialized `tf.train.Example` (see
//! [`crate::example`]); [`TfRecordOptions::example`] says whether to decode it.
//!
//! The pieces, from the bottom up:
//!
//! - [`RecordDecoder`]: the sans-IO codec. It is handed bytes that start at a record and
//!   answers "here is a record" ([`Frame::Record`], a range of the input, never a copy) or
//!   "I need N bytes" ([`Frame::Incomplete`]); it never reads, never allocates per record, and
//!   a hostile length costs nothing: it is checked against its CRC and
//!   [`FramingOptions::max_record_bytes`], and then only against the bytes present.
//! - [`records`]: every record of an in-memory shard (a slice or a memory map).
//! - [`TfRecordReader`]: sequential reading of any [`Read`] with bounded memory, the same
//!   decoder over an internal buffer; [`TfRecordReader::open`] reads plain or GZIP-compressed
//!   files.
//! - [`TfRecordWriter`] (any [`Write`]) and [`TfRecordFileWriter`] (a file written under a
//!   temporary name and renamed when finished, optionally GZIP-compressed, optionally with
//!   its index).
//! - Index files in the text format of NVIDIA DALI's `tfrecord2idx`: one line
//!   `offset size` per record, `size` being the whole framed record (`length + 16`):
//!   [`build_index`], [`write_index`], [`parse_index`], [`read_index`], [`index_path`].
//! - [`TfRecordSource`]: random access to the records of files for the loader, one shard per
//!   file (a local path, memory-mapped, each record a zero-copy view of the map, or a URL,
//!   streamed whole or read by byte ranges).
//!
//! [`Read`]: std::io::Read
//! [`Write`]: std::io::Write
//!
//! ```
//! use chute_core::{Field, Source};
//! use chute_formats::example::{Example, Feature};
//! use chute_formats::tfrecord::{TfRecordFileWriter, TfRecordOptions, TfRecordSource, WriterOptions};
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("train.tfrecord");
//! let mut writer = TfRecordFileWriter::create(&path, WriterOptions::default())?;
//! for label in 0..3i64 {
//!     let mut ex = Example::default();
//!     ex.insert("label", Feature::Int64(vec![label]));
//!     writer.write_record(&ex.encode())?;
//! }
//! assert_eq!(writer.finish()?, 3);
//!
//! let source = TfRecordSource::open(&[&path], TfRecordOptions::default())?;
//! assert_eq!(source.manifest().total_samples(), 3);
//! let sample = source.read(2)?;
//! assert_eq!(sample.key, "train/2");
//! let Some(Field::Array(label)) = sample.get("label") else { unreachable!() };
//! assert_eq!(label.shape, [0usize; 0]); // one value: a scalar
//! assert_eq!(&label.data[..], &2i64.to_le_bytes());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

// One module per piece of the list above (framing, index, reader, writer, source); everything
// public is re-exported here, so paths stay `chute_formats::tfrecord::X`.
mod framing;
mod index;
mod reader;
mod source;
#[cfg(test)]
mod testing;
mod writer;

pub use crate::indexed::index_path;
pub use framing::{
    DEFAULT_MAX_RECORD_BYTES, FOOTER_LEN, FRAME_OVERHEAD, Frame, FramingOptions, HEADER_LEN,
    Record, RecordDecoder, Records, masked_crc32c, records,
};
pub use index::{IndexEntry, build_index, parse_index, read_index, write_index, write_index_to};
pub use reader::{Compression, TfRecordReader};
pub use source::{FORMAT, IndexMode, RECORD_FIELD, TfRecordOptions, TfRecordSource};
pub use writer::{TfRecordFileWriter, TfRecordWriter, WriterOptions};
