//! Helpers shared by the tests of the `tf.train.Example` modules.

use bytes::Bytes;
use chute_core::{Array, DType, Field};

use super::wire::{LEN, put_varint};
use super::{Example, ExampleOptions, Feature};

// Hand-built protobuf, to test encodings our encoder never writes.
pub(super) fn varint(v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    put_varint(&mut out, v);
    out
}

pub(super) fn field(number: u32, wire: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = varint(u64::from(number) << 3 | u64::from(wire));
    if wire == LEN {
        out.extend(varint(payload.len() as u64));
    }
    out.extend_from_slice(payload);
    out
}

pub(super) fn entry(name: &[u8], feature: &[u8]) -> Vec<u8> {
    field(
        1,
        LEN,
        &[field(1, LEN, name), field(2, LEN, feature)].concat(),
    )
}

/// An Example of the given map entries, all in one `features` field.
pub(super) fn example_of(entries: &[Vec<u8>]) -> Bytes {
    Bytes::from(field(1, LEN, &entries.concat()))
}

pub(super) fn decode(b: &Bytes) -> Example {
    Example::decode(b, "test").unwrap()
}

pub(super) fn opts() -> ExampleOptions {
    ExampleOptions::default()
}

pub(super) fn array(f: &Field) -> &Array {
    match f {
        Field::Array(a) => a,
        other => panic!("expected an array, got {other:?}"),
    }
}

pub(super) fn i64s(a: &Array) -> Vec<i64> {
    assert_eq!(a.dtype, DType::I64);
    a.data
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

pub(super) fn f32s(a: &Array) -> Vec<f32> {
    assert_eq!(a.dtype, DType::F32);
    a.data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

pub(super) fn full_example() -> Example {
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
