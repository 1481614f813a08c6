//! [`Sample`]: one training example as named fields that borrow the source's bytes.

use std::borrow::Cow;

use bytes::Bytes;

use crate::dtype::DType;

/// A field name. Static names cost nothing per sample; names read from data are owned.
pub type FieldName = Cow<'static, str>;

/// One training example: its global index, its key and named fields.
///
/// Fields hold [`Bytes`], so a field read from a memory map or a record buffer is a view,
/// not a copy; the batcher copies each field once, into the batch buffer.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Global sample id: the position in the manifest's concatenated shards.
    pub index: u64,
    /// The sample's key (WebDataset key, ...), empty when the format has none.
    pub key: String,
    /// Named fields, in the order the format yields them.
    pub fields: Vec<(FieldName, Field)>,
}

impl Sample {
    /// An empty sample with the given global index.
    pub fn new(index: u64) -> Self {
        Sample {
            index,
            key: String::new(),
            fields: Vec::new(),
        }
    }

    /// Adds a field (builder style).
    pub fn with(mut self, name: impl Into<FieldName>, field: Field) -> Self {
        self.fields.push((name.into(), field));
        self
    }

    /// The field called `name`.
    pub fn get(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|(n, _)| n == name).map(|(_, f)| f)
    }

    /// The field called `name`, mutably.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut Field> {
        self.fields
            .iter_mut()
            .find(|(n, _)| n == name)
            .map(|(_, f)| f)
    }

    /// Sets `name` to `field`, replacing any field of that name.
    pub fn set(&mut self, name: impl Into<FieldName>, field: Field) {
        let name = name.into();
        match self.get_mut(&name) {
            Some(slot) => *slot = field,
            None => self.fields.push((name, field)),
        }
    }

    /// Removes and returns the field called `name`.
    pub fn remove(&mut self, name: &str) -> Option<Field> {
        let i = self.fields.iter().position(|(n, _)| n == name)?;
        Some(self.fields.remove(i).1)
    }
}

/// A field's value.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Field {
    /// Opaque bytes (an encoded image, a serialized record): collated into a variable-length
    /// bytes column.
    Bytes(Bytes),
    /// UTF-8 text: collated into a variable-length string column.
    Text(Bytes),
    /// A fixed-shape numeric array: collated into a `[B, ...shape]` tensor column.
    Array(Array),
    /// A nested value (a list of strings, a record, a chat's messages): collated into a
    /// [`crate::Column::Values`] column.
    Value(crate::Value),
}

impl Field {
    /// The field as a nested value: text, bytes, numbers (an array's elements, a list; a
    /// scalar, a number), nested values as they are.
    pub fn to_value(&self) -> crate::Value {
        use crate::Value;
        let field = self;
        match field {
            Field::Text(b) => Value::Text(b.clone()),
            Field::Bytes(b) => Value::Bytes(b.clone()),
            Field::Value(v) => v.clone(),
            Field::Array(a) => {
                let n = a.shape.iter().product::<usize>();
                let d = &a.data;
                let at = |i: usize, w: usize| -> [u8; 8] {
                    let mut b = [0u8; 8];
                    b[..w].copy_from_slice(&d[i * w..(i + 1) * w]);
                    b
                };
                let one = |i: usize| -> Value {
                    match a.dtype {
                        DType::Bool => Value::Bool(d[i] != 0),
                        DType::U8 => Value::UInt(u64::from(d[i])),
                        DType::I8 => Value::Int(i64::from(d[i] as i8)),
                        DType::U16 => Value::UInt(u64::from_le_bytes(at(i, 2))),
                        DType::I16 => {
                            Value::Int(i64::from(i16::from_le_bytes([d[2 * i], d[2 * i + 1]])))
                        }
                        DType::U32 => Value::UInt(u64::from_le_bytes(at(i, 4))),
                        DType::I32 => Value::Int(i64::from(i32::from_le_bytes(
                            d[4 * i..4 * i + 4].try_into().unwrap_or_default(),
                        ))),
                        DType::U64 => Value::UInt(u64::from_le_bytes(at(i, 8))),
                        DType::I64 => Value::Int(i64::from_le_bytes(at(i, 8))),
                        DType::F32 => Value::Float(f64::from(f32::from_le_bytes(
                            d[4 * i..4 * i + 4].try_into().unwrap_or_default(),
                        ))),
                        DType::F64 => Value::Float(f64::from_le_bytes(at(i, 8))),
                        _ => Value::Null,
                    }
                };
                if d.len() < n * a.dtype.size() {
                    return Value::Null;
                }
                if a.shape.is_empty() {
                    one(0)
                } else {
                    Value::List((0..n).map(one).collect())
                }
            }
        }
    }

    /// What the field holds, for messages: `bytes (12 bytes)`, `text (5 bytes)` or `a uint8
    /// [224, 224, 3] array`.
    pub fn describe(&self) -> String {
        match self {
            Field::Bytes(b) => format!("bytes ({} bytes)", b.len()),
            Field::Text(b) => format!("text ({} bytes)", b.len()),
            Field::Array(a) => format!("a {} {:?} array", a.out_dtype(), a.shape),
            Field::Value(v) => v.describe(),
        }
    }
}

/// A numeric array inside a sample: little-endian elements of `dtype` in `data` (no
/// alignment required, so it can be a slice of a memory map), C order.
///
/// `cast` asks the batcher to convert while collating (`u16` tokens to `int64`, say), so the
/// conversion costs no extra pass and no intermediate buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct Array {
    /// Element type of `data`.
    pub dtype: DType,
    /// Shape, C order.
    pub shape: Vec<usize>,
    /// `product(shape) * dtype.size()` bytes.
    pub data: Bytes,
    /// Output dtype in the batch, if different from `dtype`.
    pub cast: Option<DType>,
}

impl Array {
    /// An array over `data`.
    ///
    /// # Panics
    /// If `data` does not hold exactly `product(shape)` elements.
    pub fn new(dtype: DType, shape: Vec<usize>, data: Bytes) -> Self {
        let want = shape.iter().product::<usize>() * dtype.size();
        assert_eq!(
            data.len(),
            want,
            "array data of {} bytes for {dtype} {shape:?}",
            data.len()
        );
        Array {
            dtype,
            shape,
            data,
            cast: None,
        }
    }

    /// A scalar `int64` (a class label, say).
    pub fn scalar_i64(v: i64) -> Self {
        Array::new(
            DType::I64,
            Vec::new(),
            Bytes::copy_from_slice(&v.to_le_bytes()),
        )
    }

    /// The dtype this array will have in the batch.
    pub fn out_dtype(&self) -> DType {
        self.cast.unwrap_or(self.dtype)
    }

    /// Bytes this array occupies in the batch.
    pub fn out_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.out_dtype().size()
    }
}
