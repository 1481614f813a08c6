//! `tf.train.Example`: a hand-written protobuf decoder and encoder, and the conversion to and
//! from chute's [`Sample`].
//!
//! The messages (from TensorFlow's `example.proto` and `feature.proto`):
//!
//! ```text
//! Example   { Features features = 1; }
//! Features  { map<string, Feature> feature = 1; }
//! Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
//!                          Int64List int64_list = 3; } }
//! BytesList { repeated bytes value = 1; }
//! FloatList { repeated float value = 1 [packed = true]; }
//! Int64List { repeated int64 value = 1 [packed = true]; }
//! ```
//!
//! Six messages do not justify `prost` and `protoc` in the build, and a hand-written decoder can
//! do what a generated one cannot: hand out byte values and packed floats as zero-copy
//! [`Bytes`] views of the record, and convert a record straight into a [`Sample`] without
//! building an intermediate message.
//!
//! # Decoding follows protobuf's rules
//!
//! The decoder reads anything a conforming protobuf parser reads:
//!
//! - repeated scalars packed (what TensorFlow writes) or unpacked, or a mix of both;
//! - unknown fields of any wire type, groups included (skipped); a known field number with an
//!   unexpected wire type is an unknown field too, as in protobuf's own parsers;
//! - map entries in any order; for a name that appears twice the last entry wins, and an
//!   entry without a key has the key `""`; several `features` fields merge;
//! - a `Feature` whose `kind` is set more than once takes the last kind, and lists of the same
//!   kind that follow each other concatenate (protobuf's merge of repeated occurrences);
//! - a `Feature` with no kind set is treated as absent (TensorFlow's parser does the same).
//!
//! One simplification: a map entry whose `value` field appears more than once keeps the last
//! one (protobuf would merge them). No writer produces such entries.
//!
//! Hostile input never panics, and allocations stay within a small multiple of the input's
//! size (an int64 value takes 8 bytes, its varint at least 1): every length is checked against
//! the bytes that remain before anything is allocated for it, varints are at most 10 bytes,
//! groups nest at most [`MAX_DEPTH`] deep, and nothing recurses. The `example_parse` fuzz
//! target checks this.
//!
//! # Encoding is deterministic
//!
//! [`Example::encode`] writes features sorted by name (byte order) and packs float and int64
//! lists, as TensorFlow does. TensorFlow does not promise any order for the map; sorting makes
//! the same sample always give the same bytes, so shards can be compared and checksummed.
//!
//! # Samples
//!
//! [`example_to_sample`] turns a record into a [`Sample`] with one field per feature; see its
//! documentation for the exact mapping. [`sample_to_example`] is the inverse used by writers.
//! Without transforms, [`TfRecordSource`](crate::tfrecord::TfRecordSource) skips the samples:
//! it parses a batch's records straight into its columns, with the same result.
//!
//! [`Bytes`]: bytes::Bytes
//! [`Sample`]: chute_core::Sample

// One module per concept: the messages, samples, the columnar path, and the wire format under
// them; everything public is re-exported here, so paths stay `chute_formats::example::X`.
mod columnar;
mod message;
mod sample;
#[cfg(test)]
mod testing;
mod wire;

pub(crate) use columnar::collate_examples;
pub use message::{Example, Feature};
pub(crate) use sample::decode_sample;
pub use sample::{ExampleOptions, example_to_sample, sample_to_example};
pub use wire::MAX_DEPTH;
