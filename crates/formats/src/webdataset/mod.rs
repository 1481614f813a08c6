//! WebDataset shards: tar files whose consecutive members sharing a key form one sample.
//!
//! - [`WebDatasetSource`]: shards as a [`Source`] with random access through a per-shard
//!   [`ShardIndex`]: local files memory-mapped, URLs streamed whole along the rank's shard
//!   order or read by byte ranges (see `chute_io::ShardSet`).
//! - [`Samples`]: one pass over a shard in memory, sample by sample.
//! - [`ShardIndex`]: where each sample's bytes are, built by one scan or read from a
//!   `<shard>.idx` file.
//! - [`ShardWriter`]: writes samples into shards named by a pattern (`out-%06d.tar`), rotating
//!   at a sample count or a byte size; [`SampleWriter`] writes one shard to any [`Write`].
//! - [`expand_braces`]: shard lists such as `train-{000000..000127}.tar`.
//!
//! # What a sample is
//!
//! chute groups members exactly as the `webdataset` Python package (1.0.2) does:
//!
//! - only regular files count; directories, links and other members are skipped;
//! - members `webdataset` treats as metadata are skipped: names matching `__[^/]*__($|/)`
//!   (`__meta__`, `__index__/x`) and top-level names that start and end with `__`;
//! - a name splits into key and field at the first dot of its *last* path component (the
//!   regex `^((?:.*/|)[^.]+)[.]([^/]*)$` of `webdataset.tariterators.base_plus_ext`):
//!   `a.b/c.d.jpg` is key `a.b/c`, field `d.jpg`. Names with no such dot (`README`, `dir.x/y`)
//!   are skipped. The field is lower-cased (`JPG` reads as `jpg`);
//! - consecutive members with one key form a sample; a key that comes back later starts a
//!   new sample. A field repeated within a sample is an error, as in `webdataset`. Each shard
//!   is grouped on its own: a sample never spans two shards.
//!
//! A [`Sample`] holds the key in [`Sample::key`] and, as its first field, a [`Field::Text`]
//! named [`KEY_FIELD`] (`__key__`), so batches carry keys as `webdataset`'s do. The other
//! fields follow **sorted by name** (byte order), each a [`Field::Bytes`] viewing the shard's
//! bytes (no copy). Sorting makes every sample of a dataset list its fields in one order
//! whatever order the tar has (what collation into columns needs); `webdataset`'s writer
//! writes them sorted anyway, so for its shards it is also the tar order. `webdataset`'s
//! `__url__` is not added: a sample error names its shard already.
//!
//! # Index files
//!
//! `chute index` writes, next to each shard, `<shard>.idx` ([`index_path`]): UTF-8 text, the
//! first line `chute-wds-index 1`, then one line per sample, `<offset> <size>` in decimal: the
//! byte range from the sample's first header (its pax or GNU long-name header included) to
//! the end of its last member's padding. Offsets are multiples of 512, increasing, and ranges
//! do not overlap. [`WebDatasetSource`] uses the file when present ([`IndexMode`]); without
//! one it scans the shard (one pass over the headers, no data read).
//!
//! ```
//! use chute_core::{Field, Source};
//! use chute_formats::webdataset::{ShardWriter, ShardWriterOptions, WebDatasetOptions,
//!     WebDatasetSource};
//!
//! let dir = tempfile::tempdir()?;
//! let pattern = dir.path().join("train-%03d.tar");
//! let mut writer = ShardWriter::new(pattern.to_str().unwrap(), ShardWriterOptions {
//!     max_count: 2,
//!     ..ShardWriterOptions::default()
//! })?;
//! for i in 0..3 {
//!     let label = i.to_string();
//!     writer.write(&format!("img{i}"), &[("jpg", b"\xff\xd8..."), ("cls", label.as_bytes())])?;
//! }
//! let shards = writer.finish()?; // train-000.tar (2 samples), train-001.tar (1)
//! assert_eq!(shards.iter().map(|s| s.samples).collect::<Vec<_>>(), [2, 1]);
//!
//! let paths: Vec<_> = shards.iter().map(|s| s.path.clone()).collect();
//! let source = WebDatasetSource::open(&paths, WebDatasetOptions::default())?;
//! let sample = source.read(2)?;
//! assert_eq!(sample.key, "img2");
//! let names: Vec<_> = sample.fields.iter().map(|(n, _)| n.as_ref()).collect();
//! assert_eq!(names, ["__key__", "cls", "jpg"]);
//! let Some(Field::Bytes(cls)) = sample.get("cls") else { unreachable!() };
//! assert_eq!(&cls[..], b"2");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`Source`]: chute_core::Source
//! [`Write`]: std::io::Write
//! [`Sample`]: chute_core::Sample
//! [`Sample::key`]: chute_core::Sample::key
//! [`Field::Text`]: chute_core::Field::Text
//! [`Field::Bytes`]: chute_core::Field::Bytes

// One module per concept (names, index, group, source, writer); everything public is
// re-exported here, so paths stay `chute_formats::webdataset::X`.
mod compressed;
mod group;
mod index;
mod names;
mod source;
#[cfg(test)]
mod testing;
mod writer;

pub use crate::braces::{MAX_EXPANSIONS, expand_braces, expand_braces_at_most};
pub use crate::indexed::{INDEX_SUFFIX, index_path};
pub use compressed::{CompressedTarSource, is_compressed_tar};
pub use group::SampleSpan;
pub use group::{Samples, read_sample, read_span};
pub use index::{INDEX_HEADER, ShardIndex};
pub use names::{KEY_FIELD, is_meta, split_name};
pub use source::{FORMAT, IndexMode, WebDatasetOptions, WebDatasetSource};
pub use writer::{SampleWriter, ShardWriter, ShardWriterOptions};
