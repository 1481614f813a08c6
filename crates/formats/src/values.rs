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
pub(crate) enum Shape {
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
    pub(crate) fn of(dt: &DataType) -> Shape {
        match dt {
            DataType::List(f)
            | DataType::LargeList(f)
            | DataType::ListView(f)
            | DataType::LargeListView(f)
            | DataType::FixedSizeList(f, _) => Shape::List(Box::new(Shape::of(f.data_type()))),
            DataType::Struct(fields) => Shape::Record(
                fields
                    .iter()
                    .map(|f| Arc::from(f.name().as_str()))
                    .collect(),
                fields.iter().map(|f| Shape::of(f.data_type())).collect(),
            ),
            DataType::Map(entries, _) => match entries.data_type() {
                DataType::Struct(kv) if kv.len() == 2 => Shape::Map(
                    Box::new(Shape::of(kv[0].data_type())),
                    Box::new(Shape::of(kv[1].data_type())),
                ),
                _ => Shape::Leaf,
            },
            DataType::Union(fields, _) => {
                let mut places = vec![None; 128];
                let mut shapes = Vec::new();
                for (id, f) in fields.iter() {
                    if let Ok(id) = usize::try_from(id) {
                        places[id] = Some(shapes.len());
                        shapes.push(Shape::of(f.data_type()));
                    }
                }
                Shape::Union(places, shapes)
            }
            DataType::Dictionary(_, v) => Shape::Values(Box::new(Shape::of(v))),
            DataType::RunEndEncoded(_, v) => Shape::Values(Box::new(Shape::of(v.data_type()))),
            _ => Shape::Leaf,
        }
    }

    /// Row `row` of `col` (an array of this shape's type, validated) as a value; an error
    /// names what the array holds that this reader does not know.
    pub(crate) fn value(&self, col: &dyn Array, row: usize) -> Result<Value, String> {
        if col.is_null(row) {
            return Ok(Value::Null);
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
                Value::List(
                    (start..end)
                        .map(|i| inner.value(values, i))
                        .collect::<Result<_, _>>()?,
                )
            }
            (Shape::Record(keys, shapes), DataType::Struct(_)) => {
                let s = col.as_struct();
                Value::Record(
                    keys.clone(),
                    shapes
                        .iter()
                        .zip(s.columns())
                        .map(|(shape, c)| shape.value(c.as_ref(), row))
                        .collect::<Result<_, _>>()?,
                )
            }
            (Shape::Map(k, v), DataType::Map(..)) => {
                let m = col.as_map();
                let o = m.value_offsets();
                let (keys, values) = (m.keys().as_ref(), m.values().as_ref());
                Value::Map(
                    (o[row] as usize..o[row + 1] as usize)
                        .map(|i| Ok((k.value(keys, i)?, v.value(values, i)?)))
                        .collect::<Result<_, String>>()?,
                )
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
                shapes[place].value(u.child(id).as_ref(), at)?
            }
            (Shape::Values(inner), DataType::Dictionary(..)) => {
                let d = col.as_any_dictionary();
                let key = d.normalized_keys()[row];
                inner.value(d.values().as_ref(), key)?
            }
            (Shape::Values(inner), DataType::RunEndEncoded(ends, _)) => {
                let (values, at) = match ends.data_type() {
                    DataType::Int16 => run::<arrow_array::types::Int16Type>(col, row),
                    DataType::Int32 => run::<arrow_array::types::Int32Type>(col, row),
                    _ => run::<arrow_array::types::Int64Type>(col, row),
                };
                inner.value(values.as_ref(), at)?
            }
            (_, dt) => leaf(col, dt, row)?,
        })
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

/// A value of a type without children.
fn leaf(col: &dyn Array, dt: &DataType, row: usize) -> Result<Value, String> {
    let text = |s: &str| Value::Text(Bytes::copy_from_slice(s.as_bytes()));
    let bytes = |b: &[u8]| Value::Bytes(Bytes::copy_from_slice(b));
    let decimal = |v: f64, s: i8| Value::Float(v / 10f64.powi(i32::from(s)));
    Ok(match dt {
        DataType::Null => Value::Null,
        DataType::Boolean => Value::Bool(col.as_boolean().value(row)),
        DataType::Int8 => Value::Int(prim::<Int8Type>(col, row).into()),
        DataType::Int16 => Value::Int(prim::<Int16Type>(col, row).into()),
        DataType::Int32 => Value::Int(prim::<Int32Type>(col, row).into()),
        DataType::Int64 => Value::Int(prim::<Int64Type>(col, row)),
        DataType::Timestamp(u, _) => Value::Int(match u {
            TimeUnit::Second => prim::<TimestampSecondType>(col, row),
            TimeUnit::Millisecond => prim::<TimestampMillisecondType>(col, row),
            TimeUnit::Microsecond => prim::<TimestampMicrosecondType>(col, row),
            TimeUnit::Nanosecond => prim::<TimestampNanosecondType>(col, row),
        }),
        DataType::Duration(u) => Value::Int(match u {
            TimeUnit::Second => prim::<DurationSecondType>(col, row),
            TimeUnit::Millisecond => prim::<DurationMillisecondType>(col, row),
            TimeUnit::Microsecond => prim::<DurationMicrosecondType>(col, row),
            TimeUnit::Nanosecond => prim::<DurationNanosecondType>(col, row),
        }),
        DataType::Date64 => Value::Int(prim::<Date64Type>(col, row)),
        DataType::Time64(TimeUnit::Microsecond) => {
            Value::Int(prim::<Time64MicrosecondType>(col, row))
        }
        DataType::Time64(_) => Value::Int(prim::<Time64NanosecondType>(col, row)),
        DataType::UInt8 => Value::UInt(prim::<UInt8Type>(col, row).into()),
        DataType::UInt16 => Value::UInt(prim::<UInt16Type>(col, row).into()),
        DataType::UInt32 => Value::UInt(prim::<UInt32Type>(col, row).into()),
        DataType::UInt64 => Value::UInt(prim::<UInt64Type>(col, row)),
        DataType::Float16 => Value::Float(prim::<Float16Type>(col, row).to_f64()),
        DataType::Float32 => Value::Float(prim::<Float32Type>(col, row).into()),
        DataType::Float64 => Value::Float(prim::<Float64Type>(col, row)),
        DataType::Date32 => Value::Int(prim::<Date32Type>(col, row).into()),
        DataType::Time32(TimeUnit::Second) => Value::Int(prim::<Time32SecondType>(col, row).into()),
        DataType::Time32(_) => Value::Int(prim::<Time32MillisecondType>(col, row).into()),
        DataType::Interval(IntervalUnit::YearMonth) => {
            Value::Int(prim::<IntervalYearMonthType>(col, row).into())
        }
        DataType::Interval(IntervalUnit::DayTime) => {
            let d = prim::<IntervalDayTimeType>(col, row);
            Value::List(vec![
                Value::Int(d.days.into()),
                Value::Int(d.milliseconds.into()),
            ])
        }
        DataType::Interval(IntervalUnit::MonthDayNano) => {
            let d = prim::<IntervalMonthDayNanoType>(col, row);
            Value::List(vec![
                Value::Int(d.months.into()),
                Value::Int(d.days.into()),
                Value::Int(d.nanoseconds),
            ])
        }
        DataType::Decimal32(_, s) => decimal(prim::<Decimal32Type>(col, row).into(), *s),
        DataType::Decimal64(_, s) => decimal(prim::<Decimal64Type>(col, row) as f64, *s),
        DataType::Decimal128(_, s) => decimal(prim::<Decimal128Type>(col, row) as f64, *s),
        DataType::Decimal256(_, s) => {
            let (low, high) = prim::<Decimal256Type>(col, row).to_parts();
            decimal(high as f64 * 2f64.powi(128) + low as f64, *s)
        }
        DataType::Utf8 => text(col.as_string::<i32>().value(row)),
        DataType::LargeUtf8 => text(col.as_string::<i64>().value(row)),
        DataType::Utf8View => text(col.as_string_view().value(row)),
        DataType::Binary => bytes(col.as_binary::<i32>().value(row)),
        DataType::LargeBinary => bytes(col.as_binary::<i64>().value(row)),
        DataType::BinaryView => bytes(col.as_binary_view().value(row)),
        DataType::FixedSizeBinary(_) => bytes(col.as_fixed_size_binary().value(row)),
        other => return Err(format!("chute reads no {other} values")),
    })
}

#[cfg(test)]
mod tests {
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
