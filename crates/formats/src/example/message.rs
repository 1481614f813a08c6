//! The messages: [`Example`] and its [`Feature`] lists, decoded with zero-copy byte values and
//! encoded deterministically (features sorted by name, lists packed).

use bytes::Bytes;
use chute_core::Error;

use super::wire::{
    Ctx, Kind, LEN, Parsed, last_of_each_name, put_tag, put_varint, varint_len, visit,
};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::example::example_to_sample;
    use crate::example::testing::{
        array, decode, entry, example_of, f32s, field, full_example, i64s, opts, varint,
    };
    use crate::example::wire::{FIXED32, FIXED64, MAX_DEPTH, VARINT};

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
                ..
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
}
