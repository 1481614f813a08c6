//! Records to [`Sample`]s and back: [`ExampleOptions`], [`example_to_sample`] (and the
//! crate's `decode_sample`, which names the shard and offset in errors), [`sample_to_example`].

use bytes::Bytes;
use chute_core::{Array, ConfigError, DType, Error, Field, FieldName, Sample};

use super::message::{Example, Feature};
use super::wire::{Bad, Ctx, FeatureRef, Kind, last_of_each_name, visit};

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
                    format!(
                        "{} cannot be written as a tf.train.Example feature",
                        other.describe()
                    ),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::example::testing::{array, decode, f32s, full_example, i64s, opts};

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
            ..
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
