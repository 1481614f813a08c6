//! Dictionary codes ([`crate::Dictionaries::Codes`], `dictionaries="codes"`): a dictionary-encoded column read as `int64`
//! codes into one dictionary for the whole source, since categorical features feed
//! embeddings.
//!
//! Each file, row group or record batch may carry a dictionary of its own. The source's
//! dictionary ([`Codes`]) is every value those dictionaries hold, in the order first met
//! (parts in file order, each dictionary in its own order): a source whose parts share one
//! dictionary (a pandas categorical written by pyarrow) keeps its codes, and the codes never
//! depend on which worker reads what. It is built when the source is opened, and each part's
//! codes are mapped onto it as the part is read (one lookup per dictionary value, not per row).

use std::collections::HashMap;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef, Int64Array};
use arrow_buffer::{BooleanBufferBuilder, NullBuffer};
use arrow_schema::DataType;
use chute_core::Value;

/// Whether a top-level column of type `dt` is read as codes under [`Dictionaries::Codes`]:
/// a dictionary of strings, bytes or integers.
pub(crate) fn coded(dt: &DataType) -> bool {
    matches!(dt, DataType::Dictionary(_, v) if key_type(v))
}

/// Whether dictionary values of type `dt` have codes (and a key for the source's index).
fn key_type(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
            | DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
            | DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64
    )
}

/// A source's dictionary of one column: its values in the order first met, and each one's
/// code.
#[derive(Debug, Default)]
pub(crate) struct Codes {
    index: HashMap<Vec<u8>, i64>,
    values: Vec<Value>,
}

impl Codes {
    /// The dictionary's values, code by code.
    pub(crate) fn values(&self) -> &[Value] {
        &self.values
    }

    /// Adds the values of `col`'s dictionary (a dictionary array) not met before.
    pub(crate) fn add(&mut self, col: &dyn Array) -> Result<(), String> {
        let d = col
            .as_any_dictionary_opt()
            .ok_or_else(|| format!("a {} column where a dictionary was", col.data_type()))?;
        let values = d.values();
        for i in 0..values.len() {
            if values.is_null(i) {
                continue;
            }
            let (key, value) = entry(values.as_ref(), i)?;
            if !self.index.contains_key(&key) {
                self.index.insert(key, self.values.len() as i64);
                self.values.push(value);
            }
        }
        Ok(())
    }

    /// `col` (a dictionary array) as int64 codes into this dictionary, null where the row or
    /// its value is null.
    pub(crate) fn codes(&self, col: &dyn Array) -> Result<ArrayRef, String> {
        let d = col
            .as_any_dictionary_opt()
            .ok_or_else(|| format!("a {} column where a dictionary was", col.data_type()))?;
        let values = d.values();
        let remap = (0..values.len())
            .map(|i| {
                if values.is_null(i) {
                    return Ok(None);
                }
                let (key, _) = entry(values.as_ref(), i)?;
                self.index.get(&key).copied().map(Some).ok_or_else(|| {
                    "a dictionary value not in the source's dictionary (the data changed since \
                     the source was opened); open it again"
                        .to_string()
                })
            })
            .collect::<Result<Vec<Option<i64>>, String>>()?;
        let keys = d.normalized_keys();
        let mut out = Vec::with_capacity(keys.len());
        let mut valid = BooleanBufferBuilder::new(keys.len());
        for (row, &k) in keys.iter().enumerate() {
            match remap
                .get(k)
                .copied()
                .flatten()
                .filter(|_| !col.is_null(row))
            {
                Some(code) => {
                    out.push(code);
                    valid.append(true);
                }
                None => {
                    out.push(0);
                    valid.append(false);
                }
            }
        }
        let nulls = NullBuffer::new(valid.finish());
        let nulls = (nulls.null_count() > 0).then_some(nulls);
        Ok(std::sync::Arc::new(Int64Array::new(out.into(), nulls)))
    }
}

/// Value `i` of `values` (a dictionary's values, of a [`key_type`]) as an index key and a
/// value.
fn entry(values: &dyn Array, i: usize) -> Result<(Vec<u8>, Value), String> {
    let text = |s: &str| {
        (
            s.as_bytes().to_vec(),
            Value::Text(bytes::Bytes::copy_from_slice(s.as_bytes())),
        )
    };
    let bin = |b: &[u8]| (b.to_vec(), Value::Bytes(bytes::Bytes::copy_from_slice(b)));
    let int = |v: i64| (v.to_le_bytes().to_vec(), Value::Int(v));
    let uint = |v: u64| (v.to_le_bytes().to_vec(), Value::UInt(v));
    Ok(match values.data_type() {
        DataType::Utf8 => text(values.as_string::<i32>().value(i)),
        DataType::LargeUtf8 => text(values.as_string::<i64>().value(i)),
        DataType::Utf8View => text(values.as_string_view().value(i)),
        DataType::Binary => bin(values.as_binary::<i32>().value(i)),
        DataType::LargeBinary => bin(values.as_binary::<i64>().value(i)),
        DataType::BinaryView => bin(values.as_binary_view().value(i)),
        DataType::Int8 => int(values.as_primitive::<Int8Type>().value(i).into()),
        DataType::Int16 => int(values.as_primitive::<Int16Type>().value(i).into()),
        DataType::Int32 => int(values.as_primitive::<Int32Type>().value(i).into()),
        DataType::Int64 => int(values.as_primitive::<Int64Type>().value(i)),
        DataType::UInt8 => uint(values.as_primitive::<UInt8Type>().value(i).into()),
        DataType::UInt16 => uint(values.as_primitive::<UInt16Type>().value(i).into()),
        DataType::UInt32 => uint(values.as_primitive::<UInt32Type>().value(i).into()),
        DataType::UInt64 => uint(values.as_primitive::<UInt64Type>().value(i)),
        other => return Err(format!("dictionary values of type {other} have no codes")),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{DictionaryArray, StringArray, types::Int32Type};

    use super::*;

    fn dict(keys: &[Option<i32>], values: &[&str]) -> ArrayRef {
        let keys = arrow_array::Int32Array::from(keys.to_vec());
        Arc::new(
            DictionaryArray::<Int32Type>::try_new(
                keys,
                Arc::new(StringArray::from(values.to_vec())),
            )
            .unwrap(),
        )
    }

    #[test]
    fn parts_with_their_own_dictionaries_share_the_sources_codes() {
        let a = dict(
            &[Some(0), Some(1), None, Some(2)],
            &["red", "green", "blue"],
        );
        let b = dict(&[Some(0), Some(1), Some(0)], &["blue", "pink"]);
        let mut codes = Codes::default();
        codes.add(a.as_ref()).unwrap();
        codes.add(b.as_ref()).unwrap();
        let texts: Vec<&str> = codes.values().iter().filter_map(Value::as_str).collect();
        assert_eq!(texts, ["red", "green", "blue", "pink"]);
        let ca = codes.codes(a.as_ref()).unwrap();
        let ca = ca.as_primitive::<Int64Type>();
        assert_eq!(ca.values().to_vec(), [0, 1, 0, 2]);
        assert!(ca.is_null(2));
        let cb = codes.codes(b.as_ref()).unwrap();
        assert_eq!(cb.as_primitive::<Int64Type>().values().to_vec(), [2, 3, 2]);
        assert_eq!(cb.null_count(), 0);
        // A value the source never met is an error, not a wrong code.
        let c = dict(&[Some(0)], &["mauve"]);
        assert!(
            codes
                .codes(c.as_ref())
                .unwrap_err()
                .contains("open it again")
        );
    }

    #[test]
    fn only_strings_bytes_and_integers_have_codes() {
        let d = |v: DataType| DataType::Dictionary(Box::new(DataType::Int32), Box::new(v));
        assert!(coded(&d(DataType::Utf8)) && coded(&d(DataType::UInt16)));
        assert!(!coded(&d(DataType::Float64)) && !coded(&DataType::Utf8));
        assert!(
            crate::Dictionaries::parse("ids")
                .unwrap_err()
                .contains("codes")
        );
    }
}
