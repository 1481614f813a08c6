//! Arrow values of any type as [`Value`]s: what a nested column (lists of strings, lists of
//! structs such as a chat's `messages`, maps, unions, lists of lists) gives per row.
//!
//! | Arrow type | value |
//! | --- | --- |
//! | null, and any null slot | [`Value::Null`] (Python `None`) |
//! | `bool` | [`Value::Bool`] |
//! | signed integers; timestamps, dates, times, durations (counts of their unit); `interval<year_month>` (months) | [`Value::Int`] |
//! | unsigned integers | [`Value::UInt`] |
//! | floats (`float16` too); decimals (the nearest double) | [`Value::Float`] |
//! | `interval<day_time>`, `interval<month_day_nano>` | a list of 2 or 3 integers |
//! | strings (plain, large, views) | [`Value::Text`] |
//! | binary (plain, large, views, fixed-size) | [`Value::Bytes`] |
//! | lists (plain, large, fixed-size, views) | [`Value::List`] |
//! | `struct` | [`Value::Record`]: every field, nulls included (as `datasets` gives them) |
//! | `map` | [`Value::Map`]: its entries in order (pyarrow's `to_pylist` pairs) |
//! | `union` (sparse, dense) | the value of the member the row selects |
//! | `dictionary`, `run_end_encoded` | the value the row stands for |
//! | the `arrow.json` extension (`datasets`' `Json` feature: JSON text) | the text parsed: objects as [`Value::Record`] (their own keys, in order), arrays as [`Value::List`], numbers, strings, `true`/`false`, `null` (what `datasets` decodes) |
//!
//! A [`Shape`] is made once per column and type (a record's keys are allocated there, once,
//! not once per row), then [`Shape::value`] reads any row.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Date64Type, Decimal32Type, Decimal64Type, Decimal128Type, Decimal256Type,
    DurationMicrosecondType, DurationMillisecondType, DurationNanosecondType, DurationSecondType,
    Float16Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type,
    IntervalDayTimeType, IntervalMonthDayNanoType, IntervalYearMonthType, RunEndIndexType,
    Time32MillisecondType, Time32SecondType, Time64MicrosecondType, Time64NanosecondType,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef, ArrowPrimitiveType, RunArray};
use arrow_schema::{DataType, IntervalUnit, TimeUnit, UnionMode};
use bytes::Bytes;
use chute_core::{Keys, Value};

/// How to read values of one Arrow type: a tree mirroring the type, with each struct's keys
/// made once.
#[derive(Debug, Clone)]
pub enum Shape {
    /// A type without children.
    Leaf,
    /// A list of any kind: its values' shape.
    List(Box<Shape>),
    /// A struct: its keys and the shape of each field.
    Record(Keys, Vec<Shape>),
    /// A map: its keys' and values' shapes.
    Map(Box<Shape>, Box<Shape>),
    /// A union: per type id (0..=127), the place of its member and the member's shape.
    Union(Vec<Option<usize>>, Vec<Shape>),
    /// A dictionary or run-end-encoded array: its values' shape.
    Values(Box<Shape>),
    /// A decimal read exactly, as its text ([`Build::decimal`]), not the nearest double.
    Decimal,
    /// JSON text (a string column of the `arrow.json` extension type): each value parsed
    /// ([`Build::json`]).
    Json,
}

/// The extension name Arrow gives JSON text (`pa.json_()`, `datasets`' `Json` feature),
/// in a field's `ARROW:extension:name` metadata.
const JSON_EXTENSION: &str = "arrow.json";

/// Whether `field` holds JSON text: a string field of the `arrow.json` extension type.
pub(crate) fn is_json(field: &arrow_schema::Field) -> bool {
    field
        .metadata()
        .get("ARROW:extension:name")
        .is_some_and(|n| n == JSON_EXTENSION)
        && matches!(
            field.data_type(),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        )
}

/// Whether `dt` has a field of JSON text anywhere inside it ([`is_json`]).
pub(crate) fn holds_json(dt: &DataType) -> bool {
    let inside = |f: &arrow_schema::FieldRef| is_json(f) || holds_json(f.data_type());
    match dt {
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::FixedSizeList(f, _)
        | DataType::Map(f, _) => inside(f),
        DataType::Struct(fields) => fields.iter().any(inside),
        DataType::Union(fields, _) => fields.iter().any(|(_, f)| inside(f)),
        DataType::RunEndEncoded(_, v) => inside(v),
        DataType::Dictionary(_, v) => holds_json(v),
        _ => false,
    }
}

/// Deepest nesting of types a column may have: Arrow files may declare types nested without
/// end; past this they are refused when the source is opened.
pub(crate) const MAX_DEPTH: usize = 64;

/// How deep `dt` nests (a flat type is 1).
pub(crate) fn depth(dt: &DataType) -> usize {
    1 + match dt {
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::FixedSizeList(f, _)
        | DataType::Map(f, _) => depth(f.data_type()),
        DataType::Struct(fields) => fields
            .iter()
            .map(|f| depth(f.data_type()))
            .max()
            .unwrap_or(0),
        DataType::Union(fields, _) => fields
            .iter()
            .map(|(_, f)| depth(f.data_type()))
            .max()
            .unwrap_or(0),
        DataType::Dictionary(_, v) => depth(v),
        DataType::RunEndEncoded(_, v) => depth(v.data_type()),
        _ => 0,
    }
}

impl Shape {
    /// The shape of values of type `dt` (at most [`MAX_DEPTH`] deep: see [`depth`]).
    #[cfg(test)]
    pub(crate) fn of(dt: &DataType) -> Shape {
        Shape::read(dt, crate::Decimals::Float)
    }

    /// The shape of values of type `dt` (at most [`MAX_DEPTH`] deep: see [`depth`]), its
    /// decimals read as `decimals` says.
    pub(crate) fn read(dt: &DataType, decimals: crate::Decimals) -> Shape {
        // A field's shape: JSON text where its metadata says so, else its type's.
        let of = |f: &arrow_schema::Field| Shape::read_field(f, decimals);
        match dt {
            DataType::List(f)
            | DataType::LargeList(f)
            | DataType::ListView(f)
            | DataType::LargeListView(f)
            | DataType::FixedSizeList(f, _) => Shape::List(Box::new(of(f))),
            DataType::Struct(fields) => Shape::Record(
                fields
                    .iter()
                    .map(|f| Arc::from(f.name().as_str()))
                    .collect(),
                fields.iter().map(|f| of(f)).collect(),
            ),
            DataType::Map(entries, _) => match entries.data_type() {
                DataType::Struct(kv) if kv.len() == 2 => {
                    Shape::Map(Box::new(of(&kv[0])), Box::new(of(&kv[1])))
                }
                _ => Shape::Leaf,
            },
            DataType::Union(fields, _) => {
                let mut places = vec![None; 128];
                let mut shapes = Vec::new();
                for (id, f) in fields.iter() {
                    if let Ok(id) = usize::try_from(id) {
                        places[id] = Some(shapes.len());
                        shapes.push(of(f));
                    }
                }
                Shape::Union(places, shapes)
            }
            DataType::Dictionary(_, v) => Shape::Values(Box::new(Shape::read(v, decimals))),
            DataType::RunEndEncoded(_, v) => Shape::Values(Box::new(of(v))),
            DataType::Decimal32(..)
            | DataType::Decimal64(..)
            | DataType::Decimal128(..)
            | DataType::Decimal256(..)
                if decimals == crate::Decimals::Exact =>
            {
                Shape::Decimal
            }
            _ => Shape::Leaf,
        }
    }

    /// The shape of `field`'s values: [`Shape::Json`] for JSON text ([`is_json`]), else
    /// [`Shape::read`] of its type.
    pub(crate) fn read_field(field: &arrow_schema::Field, decimals: crate::Decimals) -> Shape {
        if is_json(field) {
            Shape::Json
        } else {
            Shape::read(field.data_type(), decimals)
        }
    }

    /// Whether JSON text ([`Shape::Json`]) lies anywhere in this shape.
    pub(crate) fn has_json(&self) -> bool {
        match self {
            Shape::Json => true,
            Shape::Leaf | Shape::Decimal => false,
            Shape::List(inner) | Shape::Values(inner) => inner.has_json(),
            Shape::Record(_, shapes) | Shape::Union(_, shapes) => {
                shapes.iter().any(Shape::has_json)
            }
            Shape::Map(k, v) => k.has_json() || v.has_json(),
        }
    }

    /// Row `row` of `col` (an array of this shape's type, validated) as a value; an error
    /// names what the array holds that this reader does not know.
    pub fn value(&self, col: &dyn Array, row: usize) -> Result<Value, String> {
        self.build(col, row, &mut Values)
    }

    /// Row `row` of `col` (an array of this shape's type, validated) made by `b`: each list,
    /// record and map made at its size, then filled.
    pub fn build<B: Build>(
        &self,
        col: &dyn Array,
        row: usize,
        b: &mut B,
    ) -> Result<B::Out, String> {
        if col.is_null(row) {
            return Ok(b.null());
        }
        Ok(match (self, col.data_type()) {
            (Shape::List(inner), dt) => {
                let (values, start, end) = match dt {
                    DataType::List(_) => {
                        let l = col.as_list::<i32>();
                        let o = l.value_offsets();
                        (l.values(), o[row] as usize, o[row + 1] as usize)
                    }
                    DataType::LargeList(_) => {
                        let l = col.as_list::<i64>();
                        let o = l.value_offsets();
                        (l.values(), o[row] as usize, o[row + 1] as usize)
                    }
                    DataType::ListView(_) => {
                        let l = col.as_list_view::<i32>();
                        let at = l.value_offsets()[row] as usize;
                        (l.values(), at, at + l.value_sizes()[row] as usize)
                    }
                    DataType::LargeListView(_) => {
                        let l = col.as_list_view::<i64>();
                        let at = l.value_offsets()[row] as usize;
                        (l.values(), at, at + l.value_sizes()[row] as usize)
                    }
                    DataType::FixedSizeList(_, _) => {
                        let l = col.as_fixed_size_list();
                        let at = l.value_offset_at(row);
                        (l.values(), at, at + l.value_length() as usize)
                    }
                    other => return Err(format!("a list shape read a {other} array")),
                };
                let values = values.as_ref();
                let mut list = b.list(end - start);
                for (i, at) in (start..end).enumerate() {
                    let item = inner.build(values, at, b)?;
                    b.item(&mut list, i, item);
                }
                list
            }
            (Shape::Record(keys, shapes), DataType::Struct(_)) => {
                let s = col.as_struct();
                let mut record = b.record(keys);
                for (i, (shape, c)) in shapes.iter().zip(s.columns()).enumerate() {
                    let v = shape.build(c.as_ref(), row, b)?;
                    b.field(&mut record, keys, i, v);
                }
                record
            }
            (Shape::Map(k, v), DataType::Map(..)) => {
                let m = col.as_map();
                let o = m.value_offsets();
                let (keys, values) = (m.keys().as_ref(), m.values().as_ref());
                let (start, end) = (o[row] as usize, o[row + 1] as usize);
                let mut map = b.map(end - start);
                for (i, at) in (start..end).enumerate() {
                    let key = k.build(keys, at, b)?;
                    let value = v.build(values, at, b)?;
                    b.entry(&mut map, i, key, value);
                }
                map
            }
            (Shape::Union(places, shapes), DataType::Union(_, mode)) => {
                let u = col.as_union();
                let id = u.type_id(row);
                let place = usize::try_from(id)
                    .ok()
                    .and_then(|i| places.get(i).copied().flatten())
                    .ok_or_else(|| format!("a union row selects type id {id}, not a member"))?;
                let at = match mode {
                    UnionMode::Dense => u.value_offset(row),
                    UnionMode::Sparse => row,
                };
                shapes[place].build(u.child(id).as_ref(), at, b)?
            }
            (Shape::Values(inner), DataType::Dictionary(..)) => {
                let d = col.as_any_dictionary();
                let key = d.normalized_keys()[row];
                inner.build(d.values().as_ref(), key, b)?
            }
            (Shape::Values(inner), DataType::RunEndEncoded(ends, _)) => {
                let (values, at) = match ends.data_type() {
                    DataType::Int16 => run::<arrow_array::types::Int16Type>(col, row),
                    DataType::Int32 => run::<arrow_array::types::Int32Type>(col, row),
                    _ => run::<arrow_array::types::Int64Type>(col, row),
                };
                inner.build(values.as_ref(), at, b)?
            }
            (Shape::Decimal, dt) => b.decimal(&decimal_text(col, dt, row)?),
            (Shape::Json, dt) => {
                let text: &[u8] = match dt {
                    DataType::Utf8 => col.as_string::<i32>().value(row).as_bytes(),
                    DataType::LargeUtf8 => col.as_string::<i64>().value(row).as_bytes(),
                    DataType::Utf8View => col.as_string_view().value(row).as_bytes(),
                    other => return Err(format!("a JSON shape read a {other} array")),
                };
                b.json(text)?
            }
            (_, dt) => leaf(col, dt, row, b)?,
        })
    }
}

/// Row `row` of a decimal column as exact text: its unscaled integer with the point placed
/// by the scale (`1.25`, `-0.05`, `100.00`; a negative scale as an exponent, `12E+3`).
fn decimal_text(col: &dyn Array, dt: &DataType, row: usize) -> Result<String, String> {
    let (digits, scale) = match dt {
        DataType::Decimal32(_, s) => (prim::<Decimal32Type>(col, row).to_string(), *s),
        DataType::Decimal64(_, s) => (prim::<Decimal64Type>(col, row).to_string(), *s),
        DataType::Decimal128(_, s) => (prim::<Decimal128Type>(col, row).to_string(), *s),
        DataType::Decimal256(_, s) => (prim::<Decimal256Type>(col, row).to_string(), *s),
        other => return Err(format!("a decimal shape read a {other} array")),
    };
    Ok(place_point(&digits, scale))
}

/// `digits` (an integer's text, maybe negative) divided by 10^`scale`, as exact text.
fn place_point(digits: &str, scale: i8) -> String {
    let (sign, digits) = match digits.strip_prefix('-') {
        Some(d) => ("-", d),
        None => ("", digits),
    };
    if scale < 0 {
        return format!("{sign}{digits}E+{}", -i32::from(scale));
    }
    let scale = scale as usize;
    if scale == 0 {
        return format!("{sign}{digits}");
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{sign}{int}.{frac}")
}

/// What [`Shape::build`] makes values with: scalars, and lists, records and maps made at
/// their size and then filled, item by item.
pub trait Build {
    /// A value made.
    type Out;
    /// A null.
    fn null(&mut self) -> Self::Out;
    /// A bool.
    fn bool(&mut self, v: bool) -> Self::Out;
    /// A signed integer (temporal values as counts of their unit).
    fn int(&mut self, v: i64) -> Self::Out;
    /// An unsigned integer.
    fn uint(&mut self, v: u64) -> Self::Out;
    /// A float (decimals as the nearest double).
    fn float(&mut self, v: f64) -> Self::Out;
    /// A decimal read exactly (`decimals="exact"`), as its text (`"-12.50"`): text by
    /// default; the Python package makes a `decimal.Decimal`.
    fn decimal(&mut self, text: &str) -> Self::Out {
        self.text(text.as_bytes())
    }
    /// JSON text (a value of the `arrow.json` extension type), parsed: by default into a
    /// [`Value`] ([`Value::from_json`]: keys in order, as `json.loads` keeps them), then made
    /// with the other methods. Text that is not JSON is an error saying so.
    fn json(&mut self, text: &[u8]) -> Result<Self::Out, String> {
        let v = Value::from_json(text).map_err(|e| {
            format!("a value of a JSON column (the arrow.json extension type) is not JSON: {e}")
        })?;
        Ok(made(self, v))
    }
    /// UTF-8 text.
    fn text(&mut self, v: &[u8]) -> Self::Out;
    /// Bytes.
    fn bytes(&mut self, v: &[u8]) -> Self::Out;
    /// A list of `n` items, filled by [`Build::item`].
    fn list(&mut self, n: usize) -> Self::Out;
    /// Item `i` of `list`.
    fn item(&mut self, list: &mut Self::Out, i: usize, v: Self::Out);
    /// A record of `keys`, filled by [`Build::field`].
    fn record(&mut self, keys: &Keys) -> Self::Out;
    /// Field `i` (of `keys`) of `record`.
    fn field(&mut self, record: &mut Self::Out, keys: &Keys, i: usize, v: Self::Out);
    /// A map of `n` entries, filled by [`Build::entry`].
    fn map(&mut self, n: usize) -> Self::Out;
    /// Entry `i` of `map`.
    fn entry(&mut self, map: &mut Self::Out, i: usize, k: Self::Out, v: Self::Out);
}

/// `v` made by `b` (the values [`Value::from_json`] gives: no arrays).
fn made<B: Build + ?Sized>(b: &mut B, v: Value) -> B::Out {
    match v {
        Value::Null => b.null(),
        Value::Bool(x) => b.bool(x),
        Value::Int(x) => b.int(x),
        Value::UInt(x) => b.uint(x),
        Value::Float(x) => b.float(x),
        Value::Text(t) => b.text(&t),
        Value::Bytes(t) => b.bytes(&t),
        Value::List(items) => {
            let mut list = b.list(items.len());
            for (i, item) in items.into_iter().enumerate() {
                let item = made(b, item);
                b.item(&mut list, i, item);
            }
            list
        }
        Value::Record(keys, values) => {
            let mut record = b.record(&keys);
            for (i, item) in values.into_iter().enumerate() {
                let item = made(b, item);
                b.field(&mut record, &keys, i, item);
            }
            record
        }
        Value::Map(entries) => {
            let mut map = b.map(entries.len());
            for (i, (k, v)) in entries.into_iter().enumerate() {
                let (k, v) = (made(b, k), made(b, v));
                b.entry(&mut map, i, k, v);
            }
            map
        }
        // JSON has no n-dimensional arrays (nor any other value).
        _ => b.null(),
    }
}

/// [`Build`]ing [`Value`]s.
struct Values;

impl Build for Values {
    type Out = Value;
    fn null(&mut self) -> Value {
        Value::Null
    }
    fn bool(&mut self, v: bool) -> Value {
        Value::Bool(v)
    }
    fn int(&mut self, v: i64) -> Value {
        Value::Int(v)
    }
    fn uint(&mut self, v: u64) -> Value {
        Value::UInt(v)
    }
    fn float(&mut self, v: f64) -> Value {
        Value::Float(v)
    }
    fn text(&mut self, v: &[u8]) -> Value {
        Value::Text(Bytes::copy_from_slice(v))
    }
    fn bytes(&mut self, v: &[u8]) -> Value {
        Value::Bytes(Bytes::copy_from_slice(v))
    }
    fn list(&mut self, n: usize) -> Value {
        Value::List(Vec::with_capacity(n))
    }
    fn item(&mut self, list: &mut Value, _: usize, v: Value) {
        if let Value::List(items) = list {
            items.push(v);
        }
    }
    fn record(&mut self, keys: &Keys) -> Value {
        Value::Record(keys.clone(), Vec::with_capacity(keys.len()))
    }
    fn field(&mut self, record: &mut Value, _: &Keys, _: usize, v: Value) {
        if let Value::Record(_, values) = record {
            values.push(v);
        }
    }
    fn map(&mut self, n: usize) -> Value {
        Value::Map(Vec::with_capacity(n))
    }
    fn entry(&mut self, map: &mut Value, _: usize, k: Value, v: Value) {
        if let Value::Map(entries) = map {
            entries.push((k, v));
        }
    }
}

/// A batch's rows of a nested column, kept as they are in the source's arrays (no copy):
/// row `i` is row `rows[i].1` of `parts[rows[i].0]`, read by `shape`.
#[derive(Debug)]
pub struct ArrowRows {
    parts: Vec<ArrayRef>,
    rows: Vec<(usize, usize)>,
    shape: Arc<Shape>,
}

impl ArrowRows {
    /// Rows `rows` (`(part, row)`) of `parts`, of `shape`.
    pub(crate) fn new(parts: Vec<ArrayRef>, rows: Vec<(usize, usize)>, shape: Arc<Shape>) -> Self {
        ArrowRows { parts, rows, shape }
    }

    /// Row `i` made by `b`.
    pub fn build<B: Build>(&self, i: usize, b: &mut B) -> Result<B::Out, String> {
        let (p, row) = self.rows[i];
        self.shape.build(self.parts[p].as_ref(), row, b)
    }
}

impl chute_core::NestedRows for ArrowRows {
    fn len(&self) -> usize {
        self.rows.len()
    }
    fn value(&self, i: usize) -> Result<Value, String> {
        self.build(i, &mut Values)
    }
    fn nbytes(&self) -> usize {
        // What the rows' parts hold, shared by the batch's rows.
        self.parts
            .iter()
            .map(|p| p.get_array_memory_size())
            .sum::<usize>()
            .min(self.rows.len().saturating_mul(1 << 10))
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The values of a run-end-encoded array and the place in them of logical row `row`.
fn run<R: RunEndIndexType>(col: &dyn Array, row: usize) -> (ArrayRef, usize) {
    let r = col
        .as_any()
        .downcast_ref::<RunArray<R>>()
        .expect("a run-end-encoded array");
    (r.values().clone(), r.get_physical_index(row))
}

fn prim<T: ArrowPrimitiveType>(col: &dyn Array, row: usize) -> T::Native {
    col.as_primitive::<T>().value(row)
}

/// A list of integers made by `b`.
fn ints<B: Build>(b: &mut B, v: &[i64]) -> B::Out {
    let mut list = b.list(v.len());
    for (i, &x) in v.iter().enumerate() {
        let item = b.int(x);
        b.item(&mut list, i, item);
    }
    list
}

/// A value of a type without children.
fn leaf<B: Build>(col: &dyn Array, dt: &DataType, row: usize, b: &mut B) -> Result<B::Out, String> {
    let decimal = |v: f64, s: i8| v / 10f64.powi(i32::from(s));
    Ok(match dt {
        DataType::Null => b.null(),
        DataType::Boolean => b.bool(col.as_boolean().value(row)),
        DataType::Int8 => b.int(prim::<Int8Type>(col, row).into()),
        DataType::Int16 => b.int(prim::<Int16Type>(col, row).into()),
        DataType::Int32 => b.int(prim::<Int32Type>(col, row).into()),
        DataType::Int64 => b.int(prim::<Int64Type>(col, row)),
        DataType::Timestamp(u, _) => b.int(match u {
            TimeUnit::Second => prim::<TimestampSecondType>(col, row),
            TimeUnit::Millisecond => prim::<TimestampMillisecondType>(col, row),
            TimeUnit::Microsecond => prim::<TimestampMicrosecondType>(col, row),
            TimeUnit::Nanosecond => prim::<TimestampNanosecondType>(col, row),
        }),
        DataType::Duration(u) => b.int(match u {
            TimeUnit::Second => prim::<DurationSecondType>(col, row),
            TimeUnit::Millisecond => prim::<DurationMillisecondType>(col, row),
            TimeUnit::Microsecond => prim::<DurationMicrosecondType>(col, row),
            TimeUnit::Nanosecond => prim::<DurationNanosecondType>(col, row),
        }),
        DataType::Date64 => b.int(prim::<Date64Type>(col, row)),
        DataType::Time64(TimeUnit::Microsecond) => b.int(prim::<Time64MicrosecondType>(col, row)),
        DataType::Time64(_) => b.int(prim::<Time64NanosecondType>(col, row)),
        DataType::UInt8 => b.uint(prim::<UInt8Type>(col, row).into()),
        DataType::UInt16 => b.uint(prim::<UInt16Type>(col, row).into()),
        DataType::UInt32 => b.uint(prim::<UInt32Type>(col, row).into()),
        DataType::UInt64 => b.uint(prim::<UInt64Type>(col, row)),
        DataType::Float16 => b.float(prim::<Float16Type>(col, row).to_f64()),
        DataType::Float32 => b.float(prim::<Float32Type>(col, row).into()),
        DataType::Float64 => b.float(prim::<Float64Type>(col, row)),
        DataType::Date32 => b.int(prim::<Date32Type>(col, row).into()),
        DataType::Time32(TimeUnit::Second) => b.int(prim::<Time32SecondType>(col, row).into()),
        DataType::Time32(_) => b.int(prim::<Time32MillisecondType>(col, row).into()),
        DataType::Interval(IntervalUnit::YearMonth) => {
            b.int(prim::<IntervalYearMonthType>(col, row).into())
        }
        DataType::Interval(IntervalUnit::DayTime) => {
            let d = prim::<IntervalDayTimeType>(col, row);
            let parts = [i64::from(d.days), i64::from(d.milliseconds)];
            ints(b, &parts)
        }
        DataType::Interval(IntervalUnit::MonthDayNano) => {
            let d = prim::<IntervalMonthDayNanoType>(col, row);
            let parts = [i64::from(d.months), i64::from(d.days), d.nanoseconds];
            ints(b, &parts)
        }
        DataType::Decimal32(_, s) => b.float(decimal(prim::<Decimal32Type>(col, row).into(), *s)),
        DataType::Decimal64(_, s) => b.float(decimal(prim::<Decimal64Type>(col, row) as f64, *s)),
        DataType::Decimal128(_, s) => b.float(decimal(prim::<Decimal128Type>(col, row) as f64, *s)),
        DataType::Decimal256(_, s) => {
            let (low, high) = prim::<Decimal256Type>(col, row).to_parts();
            b.float(decimal(high as f64 * 2f64.powi(128) + low as f64, *s))
        }
        DataType::Utf8 => b.text(col.as_string::<i32>().value(row).as_bytes()),
        DataType::LargeUtf8 => b.text(col.as_string::<i64>().value(row).as_bytes()),
        DataType::Utf8View => b.text(col.as_string_view().value(row).as_bytes()),
        DataType::Binary => b.bytes(col.as_binary::<i32>().value(row)),
        DataType::LargeBinary => b.bytes(col.as_binary::<i64>().value(row)),
        DataType::BinaryView => b.bytes(col.as_binary_view().value(row)),
        DataType::FixedSizeBinary(_) => b.bytes(col.as_fixed_size_binary().value(row)),
        other => return Err(format!("chute reads no {other} values")),
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn exact_decimals_place_the_point_by_the_scale() {
        assert_eq!(place_point("125", 2), "1.25");
        assert_eq!(place_point("-5", 2), "-0.05");
        assert_eq!(place_point("10000", 2), "100.00");
        assert_eq!(place_point("0", 3), "0.000");
        assert_eq!(place_point("42", 0), "42");
        assert_eq!(place_point("-123", -3), "-123E+3");
    }

    use super::*;
    use arrow_array::builder::{
        Int64Builder, ListBuilder, MapBuilder, StringBuilder, StructBuilder,
    };
    use arrow_array::{
        DictionaryArray, Int32Array, RunArray, StringArray, TimestampMicrosecondArray, UnionArray,
    };
    use arrow_buffer::ScalarBuffer;
    use arrow_schema::{Field, Fields, UnionFields};

    fn values(col: &dyn Array) -> Vec<Value> {
        let shape = Shape::of(col.data_type());
        (0..col.len())
            .map(|r| shape.value(col, r).unwrap())
            .collect()
    }

    fn t(s: &str) -> Value {
        Value::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    #[test]
    fn chat_messages_are_lists_of_records_with_their_nulls() {
        let fields = Fields::from(vec![
            Field::new("role", DataType::Utf8, true),
            Field::new("content", DataType::Utf8, true),
        ]);
        let mut b = ListBuilder::new(StructBuilder::from_fields(fields, 0));
        for (role, content) in [("user", Some("hi")), ("assistant", None)] {
            let s = b.values();
            s.field_builder::<StringBuilder>(0)
                .unwrap()
                .append_value(role);
            s.field_builder::<StringBuilder>(1)
                .unwrap()
                .append_option(content);
            s.append(true);
        }
        b.append(true);
        b.append(false);
        let col = b.finish();
        let got = values(&col);
        let Value::List(messages) = &got[0] else {
            panic!("{got:?}")
        };
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[0].get("role"), Some(&t("user")));
        assert_eq!(messages[1].get("content"), Some(&Value::Null));
        assert_eq!(got[1], Value::Null);
        // The keys are made once for the column.
        let (Value::Record(a, _), Value::Record(b, _)) = (&messages[0], &messages[1]) else {
            panic!()
        };
        assert!(Arc::ptr_eq(a, b));
    }

    #[test]
    fn maps_unions_dictionaries_runs_and_timestamps() {
        let mut m = MapBuilder::new(None, StringBuilder::new(), Int64Builder::new());
        m.keys().append_value("a");
        m.values().append_value(1);
        m.append(true).unwrap();
        let col = m.finish();
        assert_eq!(
            values(&col),
            vec![Value::Map(vec![(t("a"), Value::Int(1))])]
        );

        let fields = UnionFields::try_new(
            [0, 5],
            [
                Field::new("i", DataType::Int32, true),
                Field::new("s", DataType::Utf8, true),
            ],
        )
        .unwrap();
        let u = UnionArray::try_new(
            fields,
            ScalarBuffer::from(vec![0i8, 5, 0]),
            None,
            vec![
                Arc::new(Int32Array::from(vec![7, 0, 9])) as ArrayRef,
                Arc::new(StringArray::from(vec!["", "x", ""])),
            ],
        )
        .unwrap();
        assert_eq!(values(&u), vec![Value::Int(7), t("x"), Value::Int(9)]);

        let d: DictionaryArray<arrow_array::types::Int8Type> =
            vec!["b", "a", "b"].into_iter().collect();
        assert_eq!(values(&d), vec![t("b"), t("a"), t("b")]);

        let r = RunArray::<arrow_array::types::Int32Type>::try_new(
            &Int32Array::from(vec![2, 3]),
            &StringArray::from(vec!["p", "q"]),
        )
        .unwrap();
        assert_eq!(values(&r), vec![t("p"), t("p"), t("q")]);

        let ts = TimestampMicrosecondArray::from(vec![Some(5), None]).with_timezone("UTC");
        assert_eq!(values(&ts), vec![Value::Int(5), Value::Null]);
    }

    #[test]
    fn depth_counts_nesting() {
        let inner = DataType::List(Arc::new(Field::new("item", DataType::Utf8, true)));
        let outer = DataType::List(Arc::new(Field::new("item", inner, true)));
        assert_eq!(depth(&DataType::Int8), 1);
        assert_eq!(depth(&outer), 3);
    }
}
