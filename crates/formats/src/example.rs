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

use std::ops::Range;

use bytes::Bytes;
use chute_core::{
    Array, BufferPool, Column, ConfigError, DType, Error, Field, FieldName, PooledBuf, Sample,
    Tensor, VarColumn,
};

/// Groups (a deprecated protobuf encoding) nest at most this deep in unknown fields; deeper
/// input is rejected rather than followed. Protobuf's own default recursion limit is 100.
pub const MAX_DEPTH: usize = 64;

/// Protobuf wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
const FIXED32: u8 = 5;

/// One feature's values.
#[derive(Debug, Clone, PartialEq)]
pub enum Feature {
    /// `bytes_list`: byte strings (encoded images, text, serialized tensors).
    Bytes(Vec<Bytes>),
    /// `float_list`: 32-bit floats.
    Float(Vec<f32>),
    /// `int64_list`: 64-bit signed integers.
    Int64(Vec<i64>),
}

impl Feature {
    /// The number of values in the list.
    pub fn len(&self) -> usize {
        match self {
            Feature::Bytes(v) => v.len(),
            Feature::Float(v) => v.len(),
            Feature::Int64(v) => v.len(),
        }
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The list's protobuf name: `bytes_list`, `float_list` or `int64_list`.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Feature::Bytes(_) => Kind::Bytes.name(),
            Feature::Float(_) => Kind::Float.name(),
            Feature::Int64(_) => Kind::Int64.name(),
        }
    }
}

/// A decoded `tf.train.Example`: features sorted by name, each name once.
///
/// ```
/// use bytes::Bytes;
/// use chute_formats::example::{Example, Feature};
///
/// let mut ex = Example::default();
/// ex.insert("label", Feature::Int64(vec![7]));
/// ex.insert("image", Feature::Bytes(vec![Bytes::from_static(b"\x89PNG...")]));
/// let bytes = Bytes::from(ex.encode());
/// let back = Example::decode(&bytes, "example.bin")?;
/// assert_eq!(back, ex);
/// assert_eq!(back.get("label"), Some(&Feature::Int64(vec![7])));
/// assert_eq!(back.features()[0].0, "image"); // sorted by name
/// # Ok::<(), chute_core::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Example {
    features: Vec<(String, Feature)>,
}

impl Example {
    /// Decodes a serialized `tf.train.Example`. Byte values are zero-copy views of `data`.
    ///
    /// Fails with [`Error::Corrupt`] naming `origin` and the byte offset in `data` of the
    /// first field that is not valid protobuf (a length past the end, a varint longer than 10
    /// bytes, a packed float list whose length is not a multiple of 4, ...) or a feature name
    /// that is not UTF-8.
    pub fn decode(data: &Bytes, origin: &str) -> Result<Example, Error> {
        let ctx = Ctx {
            origin,
            base: 0,
            data,
        };
        Example::decode_parsed(data).map_err(|b| ctx.bad(b))
    }

    fn decode_parsed(data: &Bytes) -> Parsed<Example> {
        let mut entries = Vec::new();
        visit(data, |name, feature| entries.push((name, feature)))?;
        let entries = last_of_each_name(entries);
        let mut features = Vec::with_capacity(entries.len());
        for (name, f) in entries {
            let feature = match f.kind {
                Kind::Bytes => {
                    let mut v = Vec::new();
                    f.for_each_bytes(|r| v.push(data.slice(r)))?;
                    Feature::Bytes(v)
                }
                Kind::Float => {
                    let mut v = Vec::new();
                    f.for_each_float_chunk(|chunk| {
                        v.extend(
                            chunk
                                .chunks_exact(4)
                                .map(|c| f32::from_le_bytes(c.try_into().expect("chunks of 4"))),
                        );
                    })?;
                    Feature::Float(v)
                }
                Kind::Int64 => {
                    let mut v = Vec::new();
                    f.for_each_int64(|x| v.push(x))?;
                    Feature::Int64(v)
                }
            };
            features.push((name.to_owned(), feature));
        }
        Ok(Example { features })
    }

    /// The features, sorted by name.
    pub fn features(&self) -> &[(String, Feature)] {
        &self.features
    }

    /// The feature called `name`.
    pub fn get(&self, name: &str) -> Option<&Feature> {
        self.position(name).ok().map(|i| &self.features[i].1)
    }

    /// Sets feature `name`, replacing any feature of that name; returns the old one.
    pub fn insert(&mut self, name: impl Into<String>, feature: Feature) -> Option<Feature> {
        let name = name.into();
        match self.position(&name) {
            Ok(i) => Some(std::mem::replace(&mut self.features[i].1, feature)),
            Err(i) => {
                self.features.insert(i, (name, feature));
                None
            }
        }
    }

    /// Removes and returns feature `name`.
    pub fn remove(&mut self, name: &str) -> Option<Feature> {
        let i = self.position(name).ok()?;
        Some(self.features.remove(i).1)
    }

    /// Number of features.
    pub fn len(&self) -> usize {
        self.features.len()
    }

    /// Whether the example has no features.
    pub fn is_empty(&self) -> bool {
        self.features.is_empty()
    }

    fn position(&self, name: &str) -> Result<usize, usize> {
        self.features
            .binary_search_by(|(n, _)| n.as_str().cmp(name))
    }

    /// Serializes the example: features sorted by name, float and int64 lists packed.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_to(&mut out);
        out
    }

    /// Appends the serialized example to `out` (see [`Example::encode`]).
    pub fn encode_to(&self, out: &mut Vec<u8>) {
        // Sizes first, bottom-up: protobuf writes each message's length before its body.
        let sizes: Vec<(usize, usize, usize)> = self
            .features
            .iter()
            .map(|(name, f)| {
                let list = list_len(f);
                let feature = 1 + varint_len(list as u64) + list;
                let entry = 1
                    + varint_len(name.len() as u64)
                    + name.len()
                    + 1
                    + varint_len(feature as u64)
                    + feature;
                (list, feature, entry)
            })
            .collect();
        let features_len: usize = sizes
            .iter()
            .map(|&(_, _, entry)| 1 + varint_len(entry as u64) + entry)
            .sum();
        out.reserve(1 + varint_len(features_len as u64) + features_len);
        // Example.features (1, LEN) is always written, even when empty: that is what
        // `tf.train.Example(features=tf.train.Features())` serializes to.
        put_tag(out, 1, LEN);
        put_varint(out, features_len as u64);
        for ((name, f), &(list, feature, entry)) in self.features.iter().zip(&sizes) {
            put_tag(out, 1, LEN); // Features.feature: a map entry
            put_varint(out, entry as u64);
            put_tag(out, 1, LEN); // key
            put_varint(out, name.len() as u64);
            out.extend_from_slice(name.as_bytes());
            put_tag(out, 2, LEN); // value: a Feature
            put_varint(out, feature as u64);
            let kind = match f {
                Feature::Bytes(_) => Kind::Bytes,
                Feature::Float(_) => Kind::Float,
                Feature::Int64(_) => Kind::Int64,
            };
            put_tag(out, kind.field(), LEN);
            put_varint(out, list as u64);
            match f {
                Feature::Bytes(values) => {
                    for v in values {
                        put_tag(out, 1, LEN);
                        put_varint(out, v.len() as u64);
                        out.extend_from_slice(v);
                    }
                }
                Feature::Float(values) if !values.is_empty() => {
                    put_tag(out, 1, LEN);
                    put_varint(out, 4 * values.len() as u64);
                    for v in values {
                        out.extend_from_slice(&v.to_le_bytes());
                    }
                }
                Feature::Int64(values) if !values.is_empty() => {
                    put_tag(out, 1, LEN);
                    let packed: usize = values.iter().map(|&v| varint_len(v as u64)).sum();
                    put_varint(out, packed as u64);
                    for &v in values {
                        // int64 is encoded as the two's complement u64: negatives take 10 bytes.
                        put_varint(out, v as u64);
                    }
                }
                // An empty packed list writes nothing: the list message is empty.
                Feature::Float(_) | Feature::Int64(_) => {}
            }
        }
    }
}

/// Length of the body of the list message holding `f`'s values.
fn list_len(f: &Feature) -> usize {
    let packed = |payload: usize| {
        if payload == 0 {
            0
        } else {
            1 + varint_len(payload as u64) + payload
        }
    };
    match f {
        Feature::Bytes(values) => values
            .iter()
            .map(|v| 1 + varint_len(v.len() as u64) + v.len())
            .sum(),
        Feature::Float(values) => packed(4 * values.len()),
        Feature::Int64(values) => packed(values.iter().map(|&v| varint_len(v as u64)).sum()),
    }
}

/// How [`example_to_sample`] turns features into fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExampleOptions {
    /// Keep only these features, in this order (a projection: the other features are skipped
    /// without being decoded). A record that lacks one of them is an error naming it. `None`
    /// (the default) keeps every feature, sorted by name.
    pub features: Option<Vec<String>>,
    /// Whether a numeric list of exactly one value becomes a scalar (shape `[]`), so that a
    /// label collates to a `[B]` column. The default; `false` keeps shape `[1]`.
    pub scalars: bool,
}

impl Default for ExampleOptions {
    fn default() -> Self {
        ExampleOptions {
            features: None,
            scalars: true,
        }
    }
}

impl ExampleOptions {
    /// Checks the options: `features`, when given, must be non-empty and name each feature
    /// once. Fails with a [`ConfigError`] naming the option.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let Some(features) = &self.features else {
            return Ok(());
        };
        if features.is_empty() {
            return Err(ConfigError::new(
                "features",
                "an empty list keeps no feature; pass None to keep them all, or name some",
            ));
        }
        for (i, f) in features.iter().enumerate() {
            if features[..i].contains(f) {
                return Err(ConfigError::new(
                    "features",
                    format!("{f:?} is listed twice; name each feature once"),
                ));
            }
        }
        Ok(())
    }
}

/// Decodes a serialized `tf.train.Example` into a [`Sample`] with global id `index` and key
/// `key`.
///
/// Each feature becomes a field of the same name:
///
/// | feature | field |
/// | --- | --- |
/// | `int64_list` of n values | [`Field::Array`] of [`DType::I64`], shape `[n]` |
/// | `float_list` of n values | [`Field::Array`] of [`DType::F32`], shape `[n]` |
/// | `bytes_list` of exactly 1 value | [`Field::Bytes`], a zero-copy view of `data` |
///
/// A numeric list of exactly one value has shape `[]` (a scalar) unless
/// [`ExampleOptions::scalars`] is false. Fields come in sorted name order, so every sample of
/// a dataset has the same field order whatever order its writer used, or in the order of
/// [`ExampleOptions::features`] when that is given. Packed float lists (what TensorFlow
/// writes) are zero-copy views of `data`; int64 lists are decoded from varints into a new
/// little-endian buffer.
///
/// Fails with [`Error::Corrupt`] if `data` is not a valid `Example`, if a `bytes_list` holds
/// other than one value (chute reads one byte string per feature: split such lists into
/// several features when writing), or if a feature named in `features` is missing. The error's
/// `uri` is `key` (or `tf.train.Example` when `key` is empty) and its offset is within `data`;
/// [`TfRecordSource`](crate::tfrecord::TfRecordSource) reports the shard and file offset
/// instead.
pub fn example_to_sample(
    index: u64,
    key: String,
    data: Bytes,
    options: &ExampleOptions,
) -> Result<Sample, Error> {
    let origin = if key.is_empty() {
        "tf.train.Example".to_owned()
    } else {
        key.clone()
    };
    decode_sample(index, key, &data, options, &origin, 0)
}

/// [`example_to_sample`] with errors naming `origin` and offsets shifted by `base` (the
/// record's position in its shard).
pub(crate) fn decode_sample(
    index: u64,
    key: String,
    data: &Bytes,
    options: &ExampleOptions,
    origin: &str,
    base: u64,
) -> Result<Sample, Error> {
    let ctx = Ctx { origin, base, data };
    let fields = match &options.features {
        None => {
            let mut entries = Vec::with_capacity(8);
            visit(data, |name, f| entries.push((name, f))).map_err(|b| ctx.bad(b))?;
            let entries = last_of_each_name(entries);
            let mut fields = Vec::with_capacity(entries.len());
            for (name, f) in entries {
                let field =
                    to_field(&f, data, options.scalars).map_err(|r| r.into_error(name, &ctx))?;
                fields.push((FieldName::Owned(name.to_owned()), field));
            }
            fields
        }
        Some(wanted) => {
            let mut slots: Vec<Option<FeatureRef<'_>>> = vec![None; wanted.len()];
            visit(data, |name, f| {
                if let Some(i) = wanted.iter().position(|w| w == name) {
                    slots[i] = Some(f); // the last entry of a name wins
                }
            })
            .map_err(|b| ctx.bad(b))?;
            let mut fields = Vec::with_capacity(wanted.len());
            for (name, slot) in wanted.iter().zip(slots) {
                let Some(f) = slot else {
                    return Err(missing_feature(data, name, &ctx));
                };
                let field =
                    to_field(&f, data, options.scalars).map_err(|r| r.into_error(name, &ctx))?;
                fields.push((FieldName::Owned(name.clone()), field));
            }
            fields
        }
    };
    Ok(Sample { index, key, fields })
}

/// The error for a projected feature the record lacks, listing what it has.
fn missing_feature(data: &Bytes, name: &str, ctx: &Ctx<'_>) -> Error {
    let mut present = Vec::new();
    // The record was just visited without error, so visiting it again cannot fail.
    let _ = visit(data, |n, _| present.push(n));
    present.sort_unstable();
    present.dedup();
    ctx.error(
        0,
        format!(
            "feature {name:?} (requested in features) is missing from this record, which has \
             {present:?}; remove it from features, or skip such records with on_error=skip"
        ),
    )
}

/// Why a feature did not become a field; small, like [`Bad`], for the same reason.
#[derive(Debug, Clone, Copy)]
enum Refused {
    Parse(Bad),
    BytesCount { at: usize, count: usize },
}

impl Refused {
    fn into_error(self, name: &str, ctx: &Ctx<'_>) -> Error {
        match self {
            Refused::Parse(b) => ctx.bad(b),
            Refused::BytesCount { at, count } => ctx.error(
                at,
                format!(
                    "feature {name:?} is a bytes_list of {count} values; chute reads exactly \
                     one byte string per bytes feature (write a list as several features, or \
                     as one serialized value)"
                ),
            ),
        }
    }
}

/// Converts one feature into a field (see [`example_to_sample`]).
fn to_field(f: &FeatureRef<'_>, data: &Bytes, scalars: bool) -> Result<Field, Refused> {
    let shape = |n: usize| {
        if n == 1 && scalars {
            Vec::new()
        } else {
            vec![n]
        }
    };
    // Shapes and lengths agree by construction, so the arrays are built without
    // `Array::new`'s check.
    let array = |dtype: DType, n: usize, data: Bytes| {
        Field::Array(Array {
            dtype,
            shape: shape(n),
            data,
            cast: None,
        })
    };
    let parsed = Refused::Parse;
    match f.kind {
        Kind::Bytes => {
            let mut first = None;
            let mut count = 0usize;
            f.for_each_bytes(|r| {
                count += 1;
                first.get_or_insert(r);
            })
            .map_err(parsed)?;
            match (count, first) {
                (1, Some(r)) => Ok(Field::Bytes(data.slice(r))),
                _ => Err(Refused::BytesCount { at: f.at, count }),
            }
        }
        Kind::Float => {
            let mut chunks = 0usize;
            let mut only: &[u8] = &[];
            let mut total = 0usize;
            f.for_each_float_chunk(|chunk| {
                chunks += 1;
                only = chunk;
                total += chunk.len();
            })
            .map_err(parsed)?;
            let bytes = if chunks == 1 {
                // TensorFlow writes one packed chunk: its little-endian floats are already the
                // array's bytes, so the field is a view of the record.
                data.slice_ref(only)
            } else {
                let mut v = Vec::with_capacity(total);
                f.for_each_float_chunk(|chunk| v.extend_from_slice(chunk))
                    .map_err(parsed)?;
                Bytes::from(v)
            };
            Ok(array(DType::F32, bytes.len() / 4, bytes))
        }
        Kind::Int64 => {
            let n = f.count_int64().map_err(parsed)?;
            let mut v = Vec::with_capacity(n * 8);
            f.for_each_int64(|x| v.extend_from_slice(&x.to_le_bytes()))
                .map_err(parsed)?;
            // A malformed packed run can hold fewer values than its last bytes suggested.
            let n = v.len() / 8;
            Ok(array(DType::I64, n, Bytes::from(v)))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Batches.

/// One column of [`collate_examples`]: its feature's kind and, for numeric lists, the number
/// of values, as the batch's first record has them.
struct Plan<'a> {
    name: &'a str,
    kind: Kind,
    len: usize,
}

/// Where [`collate_examples`] puts a column's values.
enum Out<'a> {
    /// Numeric lists: `[B, len]` values, a row per record.
    Fixed(PooledBuf),
    /// Byte strings: one view of its record per record, copied into a [`VarColumn`] at the end.
    Var(Vec<&'a [u8]>),
}

/// Collates serialized `tf.train.Example`s straight into batch columns: the columnar fast path
/// of [`TfRecordSource`](crate::tfrecord::TfRecordSource). Each record is visited once with
/// borrowing cursors, its values copied straight into buffers from `pool`: no [`Sample`], no
/// [`Bytes`] handles and no allocation per record.
///
/// The columns are exactly what decoding each record ([`example_to_sample`]) and collating the
/// samples gives: the first record's features (sorted by name, or in the order of
/// [`ExampleOptions::features`]); numeric lists as `[B]` tensors (lists of one value, with
/// [`ExampleOptions::scalars`]) or `[B, n]`; byte strings as a [`VarColumn`] of bytes.
///
/// `record(i)` gives the data of the batch's record `i`, or `None` if it cannot be read (a
/// bad CRC, say); it is called for record 0, then for each record in order.
///
/// Returns `None` wherever that path fails, or would need more than this one does: a record
/// that does not decode, lacks a feature, has features the first record lacks, or a feature
/// of another kind or length than the first record's. The caller then reads those records
/// one by one, so errors (and `on_error = skip`) are the sample path's own.
pub(crate) fn collate_examples<'a>(
    rows: usize,
    mut record: impl FnMut(usize) -> Option<&'a [u8]>,
    options: &ExampleOptions,
    pool: &BufferPool,
) -> Option<Vec<(String, Column)>> {
    if rows == 0 {
        return None;
    }
    let first = record(0)?;
    // The columns and their features in the first record.
    let firsts: Vec<(&str, FeatureRef<'_>)> = match &options.features {
        None => {
            let mut entries = Vec::with_capacity(8);
            visit(first, |name, f| entries.push((name, f))).ok()?;
            last_of_each_name(entries)
        }
        Some(wanted) => {
            let mut slots = vec![None; wanted.len()];
            visit(first, |name, f| {
                if let Some(i) = wanted.iter().position(|w| w == name) {
                    slots[i] = Some(f);
                }
            })
            .ok()?;
            let found = wanted.iter().zip(slots);
            found
                .map(|(name, f)| Some((name.as_str(), f?)))
                .collect::<Option<_>>()?
        }
    };
    let mut plans = Vec::with_capacity(firsts.len());
    let mut outs = Vec::with_capacity(firsts.len());
    for &(name, f) in &firsts {
        let (len, out) = match f.kind {
            Kind::Bytes => {
                single_bytes(&f)?;
                (1, Out::Var(Vec::with_capacity(rows)))
            }
            Kind::Float => {
                let mut bytes = 0;
                f.for_each_float_chunk(|c| bytes += c.len()).ok()?;
                (bytes / 4, Out::Fixed(pool.take(rows * bytes)))
            }
            Kind::Int64 => {
                let mut n = 0;
                f.for_each_int64(|_| n += 1).ok()?;
                (n, Out::Fixed(pool.take(rows * n * 8)))
            }
        };
        plans.push(Plan {
            name,
            kind: f.kind,
            len,
        });
        outs.push(out);
    }
    // Each record's entries usually come in the first record's order: try the column at the
    // same place before searching by name.
    let mut order: Vec<(&str, Option<usize>)> = Vec::with_capacity(firsts.len());
    visit(first, |name, _| {
        order.push((name, plans.iter().position(|p| p.name == name)));
    })
    .ok()?;
    let mut slots: Vec<Option<FeatureRef<'_>>> = vec![None; plans.len()];
    for row in 0..rows {
        let record = if row == 0 { first } else { record(row)? };
        slots.fill(None);
        let mut k = 0;
        let mut stray = false;
        visit(record, |name, f| {
            let column = match order.get(k) {
                Some(&(n, column)) if n == name => column,
                _ => plans.iter().position(|p| p.name == name),
            };
            k += 1;
            match column {
                Some(c) => slots[c] = Some(f), // the last entry of a name wins
                None => stray = true,
            }
        })
        .ok()?;
        if stray && options.features.is_none() {
            return None; // another set of features: collating would fail
        }
        for ((slot, plan), out) in slots.iter().zip(&plans).zip(&mut outs) {
            let f = (*slot)?;
            if f.kind != plan.kind {
                return None;
            }
            let whole = match out {
                Out::Var(values) => {
                    values.push(single_bytes(&f)?);
                    continue;
                }
                Out::Fixed(buf) => buf.as_mut_slice(),
            };
            let width = whole.len() / rows;
            let dst = &mut whole[row * width..(row + 1) * width];
            let filled = match f.kind {
                Kind::Float => floats_into(&f, dst),
                _ => int64s_into(&f, dst),
            };
            if !filled {
                return None;
            }
        }
    }
    let columns = plans.iter().zip(outs).map(|(plan, out)| {
        let column = match out {
            Out::Var(values) => Column::Var(VarColumn::collect(pool, values.into_iter(), false)),
            Out::Fixed(buf) => {
                let dtype = if plan.kind == Kind::Float {
                    DType::F32
                } else {
                    DType::I64
                };
                let shape = if plan.len == 1 && options.scalars {
                    vec![rows]
                } else {
                    vec![rows, plan.len]
                };
                Column::Tensor(Tensor::new(dtype, shape, buf))
            }
        };
        (plan.name.to_owned(), column)
    });
    Some(columns.collect())
}

/// The one value of a `bytes_list` (a view of its record), or `None` if it holds another
/// number of values (an error on the sample path) or does not parse.
fn single_bytes<'a>(f: &FeatureRef<'a>) -> Option<&'a [u8]> {
    let mut count = 0usize;
    let mut first = None;
    f.for_each_bytes(|r| {
        count += 1;
        first.get_or_insert(r);
    })
    .ok()?;
    let data = f.data;
    first.filter(|_| count == 1).map(|r| &data[r])
}

/// Copies a `float_list`'s values into `dst`; whether they parse and fill it exactly.
#[inline]
fn floats_into(f: &FeatureRef<'_>, dst: &mut [u8]) -> bool {
    let mut at = 0usize;
    let parsed = f.for_each_float_chunk(|chunk| {
        if let Some(d) = dst.get_mut(at..at + chunk.len()) {
            d.copy_from_slice(chunk);
        }
        at += chunk.len();
    });
    parsed.is_ok() && at == dst.len()
}

/// Writes an `int64_list`'s values into `dst` (little-endian); whether they parse and fill it
/// exactly.
#[inline]
fn int64s_into(f: &FeatureRef<'_>, dst: &mut [u8]) -> bool {
    let mut at = 0usize;
    let parsed = f.for_each_int64(|x| {
        if let Some(d) = dst.get_mut(at..at + 8) {
            d.copy_from_slice(&x.to_le_bytes());
        }
        at += 8;
    });
    parsed.is_ok() && at == dst.len()
}

/// Encodes a sample as a serialized `tf.train.Example`, for writers.
///
/// Each field becomes a feature of the same name (written sorted by name):
///
/// | field | feature |
/// | --- | --- |
/// | [`Field::Bytes`], [`Field::Text`] | `bytes_list` of one value |
/// | [`Field::Array`] of an integer or bool dtype | `int64_list` |
/// | [`Field::Array`] of a float dtype | `float_list` (`float64` is rounded to `float32`) |
///
/// The list type follows the array's output dtype ([`Array::out_dtype`]); values are read in
/// the stored dtype and converted. Arrays are flattened in C order (an `Example` has no
/// shapes): a scalar becomes a list of one value, which [`example_to_sample`] reads back as a
/// scalar. The sample's key and index are not stored.
///
/// Fails with [`Error::Config`] naming the field if two fields share a name, an array's data
/// does not match its shape, or a `uint64` value exceeds `int64`'s range.
pub fn sample_to_example(sample: &Sample) -> Result<Vec<u8>, Error> {
    let mut ex = Example::default();
    let bad = |name: &str, reason: String| -> Error {
        ConfigError::new(
            "sample",
            format!(
                "field {name:?} of sample {} ({:?}): {reason}",
                sample.index, sample.key
            ),
        )
        .into()
    };
    for (name, field) in &sample.fields {
        let feature = match field {
            Field::Bytes(b) | Field::Text(b) => Feature::Bytes(vec![b.clone()]),
            Field::Array(a) => array_feature(a).map_err(|reason| bad(name, reason))?,
            other => {
                return Err(bad(
                    name,
                    format!("{other:?} cannot be written as a tf.train.Example feature"),
                ));
            }
        };
        if ex.insert(name.to_string(), feature).is_some() {
            return Err(bad(
                name,
                "two fields have this name; a tf.train.Example holds each name once".into(),
            ));
        }
    }
    Ok(ex.encode())
}

/// An array's values as an int64 or float list.
fn array_feature(a: &Array) -> Result<Feature, String> {
    let n: usize = a.shape.iter().product();
    let size = a.dtype.size();
    if n.checked_mul(size) != Some(a.data.len()) {
        return Err(format!(
            "{} bytes of data for {} {:?} (expected {} elements of {size} bytes)",
            a.data.len(),
            a.dtype,
            a.shape,
            n
        ));
    }
    let d = &a.data[..];
    let le2 = |c: &[u8]| u16::from_le_bytes([c[0], c[1]]);
    let le4 = |c: &[u8]| u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    let le8 = |c: &[u8]| u64::from_le_bytes(c.try_into().expect("chunks of 8"));
    let float_out = matches!(
        a.out_dtype(),
        DType::F16 | DType::BF16 | DType::F32 | DType::F64
    );
    // Float dtypes become f32 directly (never through f64, which would quiet a signalling
    // NaN and so change its bits); integer dtypes become i64.
    let floats: Option<Vec<f32>> = match a.dtype {
        DType::F16 => Some(d.chunks_exact(2).map(|c| f16_to_f32(le2(c))).collect()),
        DType::BF16 => Some(
            d.chunks_exact(2)
                .map(|c| f32::from_bits(u32::from(le2(c)) << 16))
                .collect(),
        ),
        DType::F32 => Some(d.chunks_exact(4).map(|c| f32::from_bits(le4(c))).collect()),
        DType::F64 => Some(
            d.chunks_exact(8)
                .map(|c| f64::from_bits(le8(c)) as f32)
                .collect(),
        ),
        _ => None,
    };
    if let Some(floats) = floats {
        return Ok(if float_out {
            Feature::Float(floats)
        } else {
            // A float array cast to an integer type: truncate as numpy's astype does.
            Feature::Int64(floats.iter().map(|&v| v as i64).collect())
        });
    }
    let ints = |f: &dyn Fn(&[u8]) -> i64| d.chunks_exact(size).map(f).collect::<Vec<i64>>();
    let values = match a.dtype {
        DType::Bool | DType::U8 => ints(&|c| i64::from(c[0])),
        DType::I8 => ints(&|c| i64::from(c[0] as i8)),
        DType::U16 => ints(&|c| i64::from(le2(c))),
        DType::I16 => ints(&|c| i64::from(le2(c) as i16)),
        DType::U32 => ints(&|c| i64::from(le4(c))),
        DType::I32 => ints(&|c| i64::from(le4(c) as i32)),
        DType::I64 => ints(&|c| le8(c) as i64),
        DType::U64 => {
            if let Some(v) = d.chunks_exact(8).map(le8).find(|&v| v > i64::MAX as u64) {
                return Err(format!(
                    "uint64 value {v} does not fit in an int64_list (at most {}); store it as \
                     bytes or cast it",
                    i64::MAX
                ));
            }
            ints(&|c| le8(c) as i64)
        }
        other => return Err(format!("{other} arrays cannot be written")),
    };
    Ok(if float_out {
        Feature::Float(values.iter().map(|&v| v as f32).collect())
    } else {
        Feature::Int64(values)
    })
}

/// IEEE half to single precision, exactly.
fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: normalise the mantissa.
            let shift = man.leading_zeros() - 21;
            let man = (man << shift) & 0x3ff;
            sign | ((127 - 15 + 1 - shift) << 23) | (man << 13)
        }
        (0x1f, _) => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

// ---------------------------------------------------------------------------------------------
// The wire format.
//
// The parsing functions return a small error ([`Bad`]: an offset and a [`Problem`]) and the
// callers turn it into chute's [`Error`] once, at the boundary: a `Result` carrying the full
// `Error` is several times larger, and moving it through every varint read cost more than
// the parsing itself.

/// Where errors point: the shard (or record) name, the record's offset in it, and the record.
struct Ctx<'a> {
    origin: &'a str,
    base: u64,
    data: &'a [u8],
}

impl Ctx<'_> {
    fn error(&self, at: usize, reason: impl Into<String>) -> Error {
        let reason = reason.into();
        let reason = if self.base == 0 {
            format!("not a valid tf.train.Example: {reason}")
        } else {
            format!(
                "not a valid tf.train.Example (in the record whose data starts at byte {}): \
                 {reason}",
                self.base
            )
        };
        Error::corrupt(self.origin, self.base + at as u64, reason)
    }

    fn bad(&self, bad: Bad) -> Error {
        self.error(bad.at, bad.problem.describe(self.data, bad.at))
    }
}

/// A parse failure at byte `at` of the record.
#[derive(Debug, Clone, Copy)]
struct Bad {
    at: usize,
    problem: Problem,
}

/// What was wrong, with what the message needs.
#[derive(Debug, Clone, Copy)]
enum Problem {
    VarintPastEnd,
    VarintTooLong,
    FieldNumber(u64),
    LengthPastEnd { len: u64, left: usize },
    FixedPastEnd(usize),
    StrayEndGroup(u32),
    WireType(u8),
    GroupNotClosed(u32),
    GroupTooDeep,
    GroupMismatch { end: u32, start: u32 },
    FloatPacking(usize),
    NameNotUtf8(usize),
}

impl Problem {
    fn describe(self, data: &[u8], at: usize) -> String {
        match self {
            Problem::VarintPastEnd => "a varint runs past the end of its message".into(),
            Problem::VarintTooLong => "a varint is longer than 10 bytes".into(),
            Problem::FieldNumber(n) => format!("field number {n} is not valid"),
            Problem::LengthPastEnd { len, left } => {
                format!("a field declares {len} bytes but only {left} remain in its message")
            }
            Problem::FixedPastEnd(n) => {
                format!("a {n}-byte fixed field runs past the end of its message")
            }
            Problem::StrayEndGroup(f) => format!("an end-group tag (field {f}) has no start"),
            Problem::WireType(w) => format!("wire type {w} is not valid"),
            Problem::GroupNotClosed(f) => format!("group (field {f}) is not closed"),
            Problem::GroupTooDeep => format!("groups nest deeper than {MAX_DEPTH} levels"),
            Problem::GroupMismatch { end, start } => {
                format!("end-group tag for field {end} closes a group of field {start}")
            }
            Problem::FloatPacking(n) => {
                format!("a packed float_list holds {n} bytes, not a multiple of 4")
            }
            Problem::NameNotUtf8(len) => format!(
                "feature name {:?} is not UTF-8",
                String::from_utf8_lossy(data.get(at..at + len).unwrap_or_default())
            ),
        }
    }
}

type Parsed<T> = Result<T, Bad>;

fn bad<T>(at: usize, problem: Problem) -> Parsed<T> {
    Err(Bad { at, problem })
}

/// The three lists of a `Feature`'s oneof.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bytes,
    Float,
    Int64,
}

impl Kind {
    fn field(self) -> u32 {
        match self {
            Kind::Bytes => 1,
            Kind::Float => 2,
            Kind::Int64 => 3,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Bytes => "bytes_list",
            Kind::Float => "float_list",
            Kind::Int64 => "int64_list",
        }
    }
}

/// A cursor over one message, `data[pos..]`, where `data` is the record cut at the message's
/// end: positions are offsets in the whole record, so errors can name them.
struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor over `record[range]`. `range` always comes from a length already checked
    /// against the record.
    fn new(record: &'a [u8], range: Range<usize>) -> Self {
        Cursor {
            data: &record[..range.end],
            pos: range.start,
        }
    }

    #[inline(always)]
    fn at_end(&self) -> bool {
        self.pos >= self.data.len()
    }

    #[inline(always)]
    fn varint(&mut self) -> Parsed<u64> {
        // Tags and short lengths are one byte: that case inlines; the loop does not.
        match self.data.get(self.pos) {
            Some(&b) if b < 0x80 => {
                self.pos += 1;
                Ok(u64::from(b))
            }
            _ => self.varint_slow(),
        }
    }

    #[inline(never)]
    fn varint_slow(&mut self) -> Parsed<u64> {
        let start = self.pos;
        let mut value = 0u64;
        for i in 0..10 {
            let Some(&b) = self.data.get(self.pos) else {
                return bad(start, Problem::VarintPastEnd);
            };
            self.pos += 1;
            value |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return Ok(value);
            }
        }
        bad(start, Problem::VarintTooLong)
    }

    /// A field's tag: (field number, wire type, offset of the tag).
    #[inline(always)]
    fn tag(&mut self) -> Parsed<(u32, u8, usize)> {
        let at = self.pos;
        let tag = self.varint()?;
        let field = tag >> 3;
        if field == 0 || field > u64::from(u32::MAX >> 3) {
            return bad(at, Problem::FieldNumber(field));
        }
        Ok((field as u32, (tag & 7) as u8, at))
    }

    /// The body of a length-delimited field whose tag was just read.
    #[inline(always)]
    fn len_delimited(&mut self) -> Parsed<Range<usize>> {
        let at = self.pos;
        let len = self.varint()?;
        let left = self.data.len() - self.pos;
        if len > left as u64 {
            return bad(at, Problem::LengthPastEnd { len, left });
        }
        let start = self.pos;
        self.pos += len as usize;
        Ok(start..self.pos)
    }

    fn fixed(&mut self, n: usize) -> Parsed<Range<usize>> {
        if self.data.len() - self.pos < n {
            return bad(self.pos, Problem::FixedPastEnd(n));
        }
        let start = self.pos;
        self.pos += n;
        Ok(start..self.pos)
    }

    /// Skips the value of an unknown field whose tag (`field`, `wire`, at `at`) was just read.
    fn skip(&mut self, field: u32, wire: u8, at: usize) -> Parsed<()> {
        match wire {
            VARINT => self.varint().map(drop),
            FIXED64 => self.fixed(8).map(drop),
            LEN => self.len_delimited().map(drop),
            FIXED32 => self.fixed(4).map(drop),
            START_GROUP => self.skip_group(field),
            END_GROUP => bad(at, Problem::StrayEndGroup(field)),
            _ => bad(at, Problem::WireType(wire)),
        }
    }

    /// Skips a group's fields up to its end tag, without recursion.
    #[inline(never)]
    fn skip_group(&mut self, field: u32) -> Parsed<()> {
        let mut open = [0u32; MAX_DEPTH];
        open[0] = field;
        let mut depth = 1;
        while depth > 0 {
            if self.at_end() {
                return bad(self.pos, Problem::GroupNotClosed(field));
            }
            let (f, wire, at) = self.tag()?;
            match wire {
                START_GROUP => {
                    if depth == MAX_DEPTH {
                        return bad(at, Problem::GroupTooDeep);
                    }
                    open[depth] = f;
                    depth += 1;
                }
                END_GROUP => {
                    if open[depth - 1] != f {
                        let start = open[depth - 1];
                        return bad(at, Problem::GroupMismatch { end: f, start });
                    }
                    depth -= 1;
                }
                _ => self.skip(f, wire, at)?,
            }
        }
        Ok(())
    }
}

/// A `Feature` message, not yet decoded: its kind and where its lists are.
#[derive(Clone, Copy)]
struct FeatureRef<'a> {
    kind: Kind,
    data: &'a [u8],
    /// Where the last run of fields of `kind` starts: earlier fields of another kind were
    /// replaced (oneof), so only fields of `kind` from here on count.
    run: usize,
    /// The end of the `Feature` message.
    end: usize,
    /// Offset of the `Feature` message, for errors.
    at: usize,
}

impl<'a> FeatureRef<'a> {
    /// Parses a `Feature` body; `None` when no kind is set.
    #[inline(always)]
    fn parse(data: &'a [u8], body: Range<usize>) -> Parsed<Option<FeatureRef<'a>>> {
        let mut c = Cursor::new(data, body.clone());
        let mut kind = None;
        let mut run = body.start;
        while !c.at_end() {
            let (field, wire, at) = c.tag()?;
            let k = match (field, wire) {
                (1, LEN) => Kind::Bytes,
                (2, LEN) => Kind::Float,
                (3, LEN) => Kind::Int64,
                _ => {
                    c.skip(field, wire, at)?;
                    continue;
                }
            };
            if kind != Some(k) {
                kind = Some(k);
                run = at;
            }
            c.len_delimited()?;
        }
        Ok(kind.map(|kind| FeatureRef {
            kind,
            data,
            run,
            end: body.end,
            at: body.start,
        }))
    }

    /// Calls `f` with a cursor over each list message of the feature's kind, in order.
    #[inline]
    fn for_each_list(&self, mut f: impl FnMut(Cursor<'a>) -> Parsed<()>) -> Parsed<()> {
        let mut c = Cursor::new(self.data, self.run..self.end);
        let want = self.kind.field();
        while !c.at_end() {
            let (field, wire, at) = c.tag()?;
            if field == want && wire == LEN {
                let r = c.len_delimited()?;
                f(Cursor::new(self.data, r))?;
            } else {
                c.skip(field, wire, at)?;
            }
        }
        Ok(())
    }

    /// Calls `f` with the range of each value of a `bytes_list`.
    #[inline]
    fn for_each_bytes(&self, mut f: impl FnMut(Range<usize>)) -> Parsed<()> {
        self.for_each_list(|mut c| {
            while !c.at_end() {
                let (field, wire, at) = c.tag()?;
                if field == 1 && wire == LEN {
                    f(c.len_delimited()?);
                } else {
                    c.skip(field, wire, at)?;
                }
            }
            Ok(())
        })
    }

    /// Calls `f` with each run of little-endian floats of a `float_list`: a packed chunk, or
    /// one unpacked value.
    #[inline]
    fn for_each_float_chunk(&self, mut f: impl FnMut(&'a [u8])) -> Parsed<()> {
        let data = self.data;
        self.for_each_list(|mut c| {
            while !c.at_end() {
                let (field, wire, at) = c.tag()?;
                match (field, wire) {
                    (1, LEN) => {
                        let r = c.len_delimited()?;
                        if r.len() % 4 != 0 {
                            return bad(at, Problem::FloatPacking(r.len()));
                        }
                        f(&data[r]);
                    }
                    (1, FIXED32) => f(&data[c.fixed(4)?]),
                    _ => c.skip(field, wire, at)?,
                }
            }
            Ok(())
        })
    }

    /// Calls `f` with each value of an `int64_list`.
    #[inline]
    fn for_each_int64(&self, mut f: impl FnMut(i64)) -> Parsed<()> {
        let data = self.data;
        self.for_each_list(|mut c| {
            while !c.at_end() {
                let (field, wire, at) = c.tag()?;
                match (field, wire) {
                    (1, LEN) => {
                        let mut p = Cursor::new(data, c.len_delimited()?);
                        while !p.at_end() {
                            f(p.varint()? as i64);
                        }
                    }
                    (1, VARINT) => f(c.varint()? as i64),
                    _ => c.skip(field, wire, at)?,
                }
            }
            Ok(())
        })
    }

    /// The number of values of an `int64_list`, without decoding them: packed varints are
    /// counted by their last bytes. Malformed varints are reported by the decoding pass.
    #[inline]
    fn count_int64(&self) -> Parsed<usize> {
        let data = self.data;
        let mut n = 0;
        self.for_each_list(|mut c| {
            while !c.at_end() {
                let (field, wire, at) = c.tag()?;
                match (field, wire) {
                    (1, LEN) => {
                        let r = c.len_delimited()?;
                        n += data[r].iter().filter(|&&b| b < 0x80).count();
                    }
                    (1, VARINT) => {
                        c.varint()?;
                        n += 1;
                    }
                    _ => c.skip(field, wire, at)?,
                }
            }
            Ok(())
        })?;
        Ok(n)
    }
}

/// Calls `f(name, feature)` for each map entry of the example, in the order of the record
/// (duplicates included; features with no kind set left out).
#[inline]
fn visit<'a>(data: &'a [u8], mut f: impl FnMut(&'a str, FeatureRef<'a>)) -> Parsed<()> {
    let mut example = Cursor::new(data, 0..data.len());
    while !example.at_end() {
        let (field, wire, at) = example.tag()?;
        if (field, wire) != (1, LEN) {
            example.skip(field, wire, at)?;
            continue;
        }
        let mut features = Cursor::new(data, example.len_delimited()?);
        while !features.at_end() {
            let (field, wire, at) = features.tag()?;
            if (field, wire) != (1, LEN) {
                features.skip(field, wire, at)?;
                continue;
            }
            let entry_range = features.len_delimited()?;
            let mut entry = Cursor::new(data, entry_range.clone());
            let mut key = entry_range.start..entry_range.start;
            let mut value = None;
            while !entry.at_end() {
                let (field, wire, at) = entry.tag()?;
                match (field, wire) {
                    (1, LEN) => key = entry.len_delimited()?,
                    (2, LEN) => value = Some(entry.len_delimited()?),
                    _ => entry.skip(field, wire, at)?,
                }
            }
            let Ok(name) = std::str::from_utf8(&data[key.clone()]) else {
                return bad(key.start, Problem::NameNotUtf8(key.len()));
            };
            let Some(value) = value else { continue };
            if let Some(feature) = FeatureRef::parse(data, value)? {
                f(name, feature);
            }
        }
    }
    Ok(())
}

/// Sorts entries by name and keeps the last entry of each name (protobuf's map semantics).
fn last_of_each_name<T>(mut entries: Vec<(&str, T)>) -> Vec<(&str, T)> {
    // Writers usually emit each name once, often already sorted: check before sorting.
    if entries.windows(2).all(|w| w[0].0 < w[1].0) {
        return entries;
    }
    // Reversed, a stable sort puts the last entry of each name first; dedup keeps it.
    entries.reverse();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    entries.dedup_by(|later, kept| later.0 == kept.0);
    entries
}

fn varint_len(v: u64) -> usize {
    // 1 byte per 7 bits, at least 1.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_tag(out: &mut Vec<u8>, field: u32, wire: u8) {
    put_varint(out, (u64::from(field) << 3) | u64::from(wire));
}

#[cfg(test)]
mod tests {
    use super::*;

    // Hand-built protobuf, to test encodings our encoder never writes.
    fn varint(v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        put_varint(&mut out, v);
        out
    }

    fn field(number: u32, wire: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = varint(u64::from(number) << 3 | u64::from(wire));
        if wire == LEN {
            out.extend(varint(payload.len() as u64));
        }
        out.extend_from_slice(payload);
        out
    }

    fn entry(name: &[u8], feature: &[u8]) -> Vec<u8> {
        field(
            1,
            LEN,
            &[field(1, LEN, name), field(2, LEN, feature)].concat(),
        )
    }

    /// An Example of the given map entries, all in one `features` field.
    fn example_of(entries: &[Vec<u8>]) -> Bytes {
        Bytes::from(field(1, LEN, &entries.concat()))
    }

    fn decode(b: &Bytes) -> Example {
        Example::decode(b, "test").unwrap()
    }

    fn opts() -> ExampleOptions {
        ExampleOptions::default()
    }

    fn array(f: &Field) -> &Array {
        match f {
            Field::Array(a) => a,
            other => panic!("expected an array, got {other:?}"),
        }
    }

    fn i64s(a: &Array) -> Vec<i64> {
        assert_eq!(a.dtype, DType::I64);
        a.data
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn f32s(a: &Array) -> Vec<f32> {
        assert_eq!(a.dtype, DType::F32);
        a.data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn full_example() -> Example {
        let mut ex = Example::default();
        ex.insert("label", Feature::Int64(vec![3]));
        ex.insert(
            "ids",
            Feature::Int64(vec![0, -1, i64::MIN, i64::MAX, 1 << 40]),
        );
        ex.insert(
            "x",
            Feature::Float(vec![0.5, -1.25, f32::INFINITY, f32::MIN_POSITIVE]),
        );
        ex.insert(
            "img",
            Feature::Bytes(vec![Bytes::from_static(b"\x89PNG\0\x01")]),
        );
        ex.insert(
            "pair",
            Feature::Bytes(vec![Bytes::new(), Bytes::from_static(b"b")]),
        );
        ex.insert("empty_f", Feature::Float(vec![]));
        ex.insert("empty_i", Feature::Int64(vec![]));
        ex.insert("", Feature::Int64(vec![1]));
        ex
    }

    #[test]
    fn encode_decode_round_trip() {
        let ex = full_example();
        let names: Vec<&str> = ex.features().iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["", "empty_f", "empty_i", "ids", "img", "label", "pair", "x"]
        );
        let bytes = Bytes::from(ex.encode());
        let back = decode(&bytes);
        assert_eq!(back, ex);
        // Deterministic: the same example always gives the same bytes.
        assert_eq!(back.encode(), bytes);
        // Byte values are views of the input.
        let Some(Feature::Bytes(img)) = back.get("img") else {
            panic!()
        };
        assert!(bytes.as_ptr_range().contains(&img[0].as_ptr()));
        // NaN payloads survive (compared bitwise, as PartialEq would not).
        let nan = f32::from_bits(0x7fc0_1234);
        let mut ex = Example::default();
        ex.insert("n", Feature::Float(vec![nan]));
        let Some(Feature::Float(v)) = decode(&Bytes::from(ex.encode())).remove("n") else {
            panic!()
        };
        assert_eq!(v[0].to_bits(), 0x7fc0_1234);
    }

    #[test]
    fn empty_examples() {
        assert!(decode(&Bytes::new()).is_empty());
        let ex = Example::default();
        assert_eq!(ex.encode(), b"\n\0"); // what TensorFlow writes for Features()
        assert!(decode(&Bytes::from(ex.encode())).is_empty());
    }

    #[test]
    fn insert_get_remove() {
        let mut ex = full_example();
        assert_eq!(ex.len(), 8);
        assert_eq!(
            ex.insert("label", Feature::Int64(vec![4])),
            Some(Feature::Int64(vec![3]))
        );
        assert_eq!(ex.get("label").map(Feature::len), Some(1));
        assert_eq!(ex.get("label").map(Feature::kind_name), Some("int64_list"));
        assert!(ex.get("empty_f").unwrap().is_empty());
        assert_eq!(ex.remove("label"), Some(Feature::Int64(vec![4])));
        assert_eq!(ex.remove("label"), None);
        assert_eq!(ex.len(), 7);
    }

    #[test]
    fn unpacked_and_mixed_lists_decode() {
        // int64_list with an unpacked value, a packed run, and another unpacked value.
        let ints = [
            field(1, VARINT, &varint(5)),
            field(1, LEN, &[varint(6), varint(-7i64 as u64)].concat()),
            field(1, VARINT, &varint(8)),
        ]
        .concat();
        // float_list: unpacked fixed32 values around a packed run.
        let floats = [
            field(1, FIXED32, &1.5f32.to_le_bytes()),
            field(
                1,
                LEN,
                &[2.5f32.to_le_bytes(), 3.5f32.to_le_bytes()].concat(),
            ),
        ]
        .concat();
        let b = example_of(&[
            entry(b"i", &field(3, LEN, &ints)),
            entry(b"f", &field(2, LEN, &floats)),
        ]);
        let ex = decode(&b);
        assert_eq!(ex.get("i"), Some(&Feature::Int64(vec![5, 6, -7, 8])));
        assert_eq!(ex.get("f"), Some(&Feature::Float(vec![1.5, 2.5, 3.5])));

        let s = example_to_sample(0, String::new(), b.clone(), &opts()).unwrap();
        assert_eq!(i64s(array(s.get("i").unwrap())), [5, 6, -7, 8]);
        let f = array(s.get("f").unwrap());
        assert_eq!(f32s(f), [1.5, 2.5, 3.5]);
        assert_eq!(f.shape, [3]);
        // Several chunks cannot be one view: the floats were copied.
        assert!(!b.as_ptr_range().contains(&f.data.as_ptr()));
    }

    #[test]
    fn repeated_lists_concatenate_and_the_last_kind_wins() {
        // Two int64_list fields in one Feature merge (protobuf concatenates repeated fields).
        let f = [
            field(3, LEN, &field(1, LEN, &varint(1))),
            field(3, LEN, &field(1, LEN, &varint(2))),
        ]
        .concat();
        // A float_list then an int64_list: the oneof keeps the last.
        let g = [
            field(2, LEN, &field(1, FIXED32, &1f32.to_le_bytes())),
            field(3, LEN, &field(1, VARINT, &varint(9))),
        ]
        .concat();
        // int64, float, int64 again: only the last run counts.
        let h = [
            field(3, LEN, &field(1, VARINT, &varint(1))),
            field(2, LEN, &[]),
            field(3, LEN, &field(1, VARINT, &varint(2))),
        ]
        .concat();
        let ex = decode(&example_of(&[
            entry(b"f", &f),
            entry(b"g", &g),
            entry(b"h", &h),
        ]));
        assert_eq!(ex.get("f"), Some(&Feature::Int64(vec![1, 2])));
        assert_eq!(ex.get("g"), Some(&Feature::Int64(vec![9])));
        assert_eq!(ex.get("h"), Some(&Feature::Int64(vec![2])));
    }

    #[test]
    fn map_semantics() {
        let int = |v: u64| field(3, LEN, &field(1, VARINT, &varint(v)));
        let b = Bytes::from(
            [
                // Two `features` fields merge; "b" comes before "a"; "a" appears twice.
                field(
                    1,
                    LEN,
                    &[entry(b"b", &int(1)), entry(b"a", &int(2))].concat(),
                ),
                field(1, LEN, &[entry(b"a", &int(3))].concat()),
                // An entry without a key is the empty name; one without a value is unset.
                field(1, LEN, &field(1, LEN, &field(2, LEN, &int(4)))),
                field(1, LEN, &field(1, LEN, &field(1, LEN, b"novalue"))),
                // A Feature with no kind set is absent.
                field(1, LEN, &entry(b"unset", &[])),
            ]
            .concat(),
        );
        let ex = decode(&b);
        let got: Vec<(&str, &Feature)> =
            ex.features().iter().map(|(n, f)| (n.as_str(), f)).collect();
        assert_eq!(
            got,
            [
                ("", &Feature::Int64(vec![4])),
                ("a", &Feature::Int64(vec![3])),
                ("b", &Feature::Int64(vec![1])),
            ]
        );
        let s = example_to_sample(0, "k".into(), b, &opts()).unwrap();
        let names: Vec<&str> = s.fields.iter().map(|(n, _)| n.as_ref()).collect();
        assert_eq!(names, ["", "a", "b"]);
        assert_eq!(i64s(array(s.get("a").unwrap())), [3]);
    }

    #[test]
    fn unknown_fields_are_skipped_at_every_level() {
        let unknown = [
            field(7, VARINT, &varint(300)),
            field(8, FIXED64, &[1; 8]),
            field(9, FIXED32, &[2; 4]),
            field(10, LEN, b"junk"),
            // A group holding a nested group and a varint.
            varint(11 << 3 | 3),
            varint(12 << 3 | 3),
            field(1, VARINT, &varint(1)),
            varint(12 << 3 | 4),
            varint(11 << 3 | 4),
            // Known field numbers with unexpected wire types are unknown fields too.
            field(1, FIXED64, &[3; 8]),
        ]
        .concat();
        let list = [
            unknown.clone(),
            field(1, VARINT, &varint(42)),
            unknown.clone(),
        ]
        .concat();
        let feature = [unknown.clone(), field(3, LEN, &list), unknown.clone()].concat();
        let e = [
            field(1, LEN, b"key"),
            unknown.clone(),
            field(2, LEN, &feature),
            unknown.clone(),
        ]
        .concat();
        let features = [unknown.clone(), field(1, LEN, &e), unknown.clone()].concat();
        let b = Bytes::from([unknown.clone(), field(1, LEN, &features), unknown].concat());
        assert_eq!(decode(&b).get("key"), Some(&Feature::Int64(vec![42])));
    }

    #[test]
    fn malformed_input_is_an_error_naming_the_origin_and_offset() {
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            (
                "length past end",
                [varint(1 << 3 | 2), varint(50), vec![0; 3]].concat(),
                "declares 50 bytes",
            ),
            (
                "varint too long",
                [vec![1 << 3], vec![0xff; 11]].concat(),
                "longer than 10 bytes",
            ),
            ("varint cut", vec![0x80], "runs past the end"),
            ("field zero", field(0, VARINT, &[0]), "field number 0"),
            ("wire type 6", varint(1 << 3 | 6), "wire type 6"),
            ("stray end group", varint(1 << 3 | 4), "has no start"),
            ("open group", varint(5 << 3 | 3), "not closed"),
            (
                "mismatched group",
                [varint(5 << 3 | 3), varint(6 << 3 | 4)].concat(),
                "closes a group",
            ),
            (
                "deep groups",
                varint(5 << 3 | 3).repeat(MAX_DEPTH + 1),
                "deeper than",
            ),
            (
                "fixed64 cut",
                [varint(5 << 3 | 1), vec![0; 7]].concat(),
                "8-byte fixed field",
            ),
            (
                "bad float packing",
                example_of(&[entry(b"f", &field(2, LEN, &field(1, LEN, &[0; 6])))]).to_vec(),
                "not a multiple of 4",
            ),
            (
                "name not utf-8",
                example_of(&[entry(b"\xff", &field(3, LEN, &[]))]).to_vec(),
                "not UTF-8",
            ),
        ];
        for (what, bytes, want) in cases {
            let b = Bytes::from(bytes);
            let e = Example::decode(&b, "shard.tfrecord").unwrap_err();
            let Error::Corrupt {
                uri,
                offset,
                reason,
            } = &e
            else {
                panic!("{what}: {e}")
            };
            assert_eq!(uri, "shard.tfrecord", "{what}");
            assert!((*offset as usize) <= b.len(), "{what}: offset {offset}");
            assert!(reason.contains(want), "{what}: {reason}");
            assert!(
                reason.starts_with("not a valid tf.train.Example"),
                "{what}: {reason}"
            );
            // The sample path reports the same problems.
            assert!(
                example_to_sample(0, "k".into(), b, &opts()).is_err(),
                "{what}"
            );
        }
    }

    #[test]
    fn every_prefix_and_every_flipped_byte_is_handled_without_panic() {
        let full = Bytes::from(full_example().encode());
        for cut in 0..full.len() {
            let b = full.slice(..cut);
            let _ = Example::decode(&b, "t");
            let _ = example_to_sample(0, String::new(), b, &opts());
        }
        for pos in 0..full.len() {
            for bit in [0x01, 0x80, 0xff] {
                let mut v = full.to_vec();
                v[pos] ^= bit;
                let b = Bytes::from(v);
                if let Ok(ex) = Example::decode(&b, "t") {
                    // Whatever decodes must encode and decode to itself (compared as bytes:
                    // a flipped float may be a NaN).
                    let again = ex.encode();
                    assert_eq!(decode(&Bytes::from(again.clone())).encode(), again);
                }
                let _ = example_to_sample(0, String::new(), b, &opts());
            }
        }
    }

    #[test]
    fn sample_fields_shapes_and_views() {
        let b = Bytes::from(full_example().encode());
        let mut o = opts();
        o.features = Some(vec![
            "label".into(),
            "x".into(),
            "img".into(),
            "ids".into(),
            "empty_f".into(),
        ]);
        let s = example_to_sample(9, "shard/9".into(), b.clone(), &o).unwrap();
        assert_eq!((s.index, s.key.as_str()), (9, "shard/9"));
        let names: Vec<&str> = s.fields.iter().map(|(n, _)| n.as_ref()).collect();
        assert_eq!(names, ["label", "x", "img", "ids", "empty_f"]); // the requested order

        let label = array(s.get("label").unwrap());
        assert_eq!(
            (label.dtype, label.shape.clone(), label.cast),
            (DType::I64, vec![], None)
        );
        assert_eq!(i64s(label), [3]);
        let x = array(s.get("x").unwrap());
        assert_eq!(x.shape, [4]);
        assert_eq!(f32s(x), [0.5, -1.25, f32::INFINITY, f32::MIN_POSITIVE]);
        assert!(
            b.as_ptr_range().contains(&x.data.as_ptr()),
            "packed floats are a view"
        );
        let Some(Field::Bytes(img)) = s.get("img") else {
            panic!()
        };
        assert_eq!(&img[..], b"\x89PNG\0\x01");
        assert!(b.as_ptr_range().contains(&img.as_ptr()), "bytes are a view");
        let ids = array(s.get("ids").unwrap());
        assert_eq!(ids.shape, [5]);
        assert_eq!(i64s(ids), [0, -1, i64::MIN, i64::MAX, 1 << 40]);
        assert_eq!(array(s.get("empty_f").unwrap()).shape, [0]);

        o.scalars = false;
        let s = example_to_sample(9, String::new(), b, &o).unwrap();
        assert_eq!(array(s.get("label").unwrap()).shape, [1]);
    }

    #[test]
    fn sample_errors_name_the_feature() {
        let b = Bytes::from(full_example().encode());
        // "pair" holds two byte strings.
        let e = example_to_sample(0, "s/0".into(), b.clone(), &opts())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"pair\"") && e.contains("bytes_list of 2 values"),
            "{e}"
        );
        assert!(e.starts_with("s/0 at byte"), "{e}");
        let mut o = opts();
        o.features = Some(vec!["label".into(), "nope".into()]);
        let e = example_to_sample(0, String::new(), b, &o)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"nope\"") && e.contains("missing") && e.contains("\"label\""),
            "{e}"
        );
        assert!(e.starts_with("tf.train.Example at byte"), "{e}");
        // Through the crate path, errors carry the shard and the record's place in it.
        let e = decode_sample(
            0,
            String::new(),
            &Bytes::from_static(&[0x80]),
            &opts(),
            "f.tfrecord",
            112,
        )
        .unwrap_err();
        let Error::Corrupt {
            uri,
            offset,
            reason,
        } = e
        else {
            panic!()
        };
        assert_eq!((uri.as_str(), offset), ("f.tfrecord", 112));
        assert!(reason.contains("data starts at byte 112"), "{reason}");
    }

    #[test]
    fn options_are_validated() {
        assert!(opts().validate().is_ok());
        let with = |f: &[&str]| ExampleOptions {
            features: Some(f.iter().map(|s| s.to_string()).collect()),
            scalars: true,
        };
        assert!(with(&["a", "b"]).validate().is_ok());
        let e = with(&["a", "b", "a"]).validate().unwrap_err();
        assert_eq!(e.option, "features");
        assert!(e.reason.contains("\"a\" is listed twice"), "{}", e.reason);
        assert!(with(&[]).validate().is_err());
    }

    #[test]
    fn samples_encode_to_examples() {
        let arr = |dtype: DType, shape: Vec<usize>, data: Vec<u8>| {
            Field::Array(Array::new(dtype, shape, Bytes::from(data)))
        };
        let mut cast = Array::new(DType::U8, vec![2], Bytes::from_static(&[1, 2]));
        cast.cast = Some(DType::F32);
        let s = Sample::new(4)
            .with("label", Field::Array(Array::scalar_i64(-5)))
            .with("u8", arr(DType::U8, vec![3], vec![0, 128, 255]))
            .with(
                "i32",
                arr(
                    DType::I32,
                    vec![2],
                    [(-2i32).to_le_bytes(), 7i32.to_le_bytes()].concat(),
                ),
            )
            .with("bool", arr(DType::Bool, vec![2], vec![1, 0]))
            .with(
                "u64",
                arr(DType::U64, vec![1], (1u64 << 62).to_le_bytes().to_vec()),
            )
            .with(
                "f64",
                arr(
                    DType::F64,
                    vec![2, 1],
                    [0.1f64.to_le_bytes(), 2f64.to_le_bytes()].concat(),
                ),
            )
            .with(
                "f16",
                arr(
                    DType::F16,
                    vec![4],
                    [0x3c00u16, 0xc000, 0x0001, 0x7c00]
                        .iter()
                        .flat_map(|v| v.to_le_bytes())
                        .collect(),
                ),
            )
            .with(
                "bf16",
                arr(DType::BF16, vec![1], 0x3fc0u16.to_le_bytes().to_vec()),
            )
            .with("cast", Field::Array(cast))
            .with("text", Field::Text(Bytes::from_static(b"hi")))
            .with("raw", Field::Bytes(Bytes::from_static(b"\0\x01")));
        let bytes = Bytes::from(sample_to_example(&s).unwrap());
        let ex = decode(&bytes);
        assert_eq!(ex.get("label"), Some(&Feature::Int64(vec![-5])));
        assert_eq!(ex.get("u8"), Some(&Feature::Int64(vec![0, 128, 255])));
        assert_eq!(ex.get("i32"), Some(&Feature::Int64(vec![-2, 7])));
        assert_eq!(ex.get("bool"), Some(&Feature::Int64(vec![1, 0])));
        assert_eq!(
            ex.get("u64"),
            Some(&Feature::Int64(vec![(1u64 << 62) as i64]))
        );
        assert_eq!(ex.get("f64"), Some(&Feature::Float(vec![0.1, 2.0])));
        assert_eq!(
            ex.get("f16"),
            Some(&Feature::Float(vec![
                1.0,
                -2.0,
                2f32.powi(-24),
                f32::INFINITY
            ]))
        );
        assert_eq!(ex.get("bf16"), Some(&Feature::Float(vec![1.5])));
        assert_eq!(ex.get("cast"), Some(&Feature::Float(vec![1.0, 2.0])));
        assert_eq!(
            ex.get("text"),
            Some(&Feature::Bytes(vec![Bytes::from_static(b"hi")]))
        );
        assert_eq!(
            ex.get("raw"),
            Some(&Feature::Bytes(vec![Bytes::from_static(b"\0\x01")]))
        );

        // And back: a scalar stays a scalar, a byte field a byte field.
        let back = example_to_sample(4, String::new(), bytes, &opts()).unwrap();
        assert_eq!(array(back.get("label").unwrap()).shape, [0usize; 0]);
        assert_eq!(i64s(array(back.get("label").unwrap())), [-5]);
        assert!(matches!(back.get("raw"), Some(Field::Bytes(b)) if &b[..] == b"\0\x01"));
        assert_eq!(array(back.get("f64").unwrap()).shape, [2]); // shapes are flattened
    }

    #[test]
    fn float_bits_survive_the_sample_path() {
        // A signalling NaN (found by the example_parse fuzz target): through f64 it would
        // come back quiet, with other bits.
        let bits = [0xffb0_0000u32, 0x7f80_0001, 0x8000_0000];
        let data: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        let s = Sample::new(0).with(
            "f",
            Field::Array(Array::new(DType::F32, vec![3], Bytes::from(data.clone()))),
        );
        let bytes = Bytes::from(sample_to_example(&s).unwrap());
        let back = example_to_sample(0, String::new(), bytes, &opts()).unwrap();
        assert_eq!(&array(back.get("f").unwrap()).data[..], &data[..]);
    }

    #[test]
    fn samples_that_cannot_be_examples_are_refused() {
        let too_big = Sample::new(1).with(
            "big",
            Field::Array(Array::new(
                DType::U64,
                vec![1],
                Bytes::copy_from_slice(&u64::MAX.to_le_bytes()),
            )),
        );
        let e = sample_to_example(&too_big).unwrap_err();
        assert!(
            matches!(&e, Error::Config(c) if c.option == "sample"),
            "{e}"
        );
        let e = e.to_string();
        assert!(
            e.contains("\"big\"") && e.contains(&u64::MAX.to_string()),
            "{e}"
        );

        let twice = Sample::new(1)
            .with("a", Field::Bytes(Bytes::new()))
            .with("a", Field::Bytes(Bytes::new()));
        let e = sample_to_example(&twice).unwrap_err().to_string();
        assert!(e.contains("two fields have this name"), "{e}");

        let bad_shape = Sample::new(1).with(
            "a",
            Field::Array(Array {
                dtype: DType::I32,
                shape: vec![3],
                data: Bytes::from_static(&[0; 8]),
                cast: None,
            }),
        );
        let e = sample_to_example(&bad_shape).unwrap_err().to_string();
        assert!(e.contains("8 bytes of data for int32 [3]"), "{e}");
    }

    #[test]
    fn varint_helpers_agree() {
        for v in [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            u64::from(u32::MAX),
            1 << 56,
            u64::MAX,
        ] {
            let bytes = varint(v);
            assert_eq!(varint_len(v), bytes.len(), "{v}");
            let mut c = Cursor::new(&bytes, 0..bytes.len());
            assert_eq!(c.varint().unwrap(), v);
            assert!(c.at_end());
        }
        assert_eq!(varint_len(-1i64 as u64), 10);
    }

    #[test]
    fn half_precision_converts_exactly() {
        assert_eq!(f16_to_f32(0x0000), 0.0);
        assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0x3555), 0.333_251_95);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0400), 2f32.powi(-14)); // smallest normal
        assert_eq!(f16_to_f32(0x03ff), 1023.0 * 2f32.powi(-24)); // largest subnormal
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
    }
}
