//! Arrow's other types brought to the kinds a batch holds ([`crate::columnar`]'s `Kind`), and
//! nulls filled where a source keeps their places in a `<name>_valid` column.
//!
//! [`normal_type`] says what a column's type becomes and [`normalize`] makes it so, as a
//! column is decoded:
//!
//! | Arrow type | becomes |
//! | --- | --- |
//! | `timestamp` (any unit, any zone), `date64`, `time64`, `duration` | `int64`: counts of its unit (the unit and zone stay in the schema: [`describe`], and [`numpy_type`] for the numpy dtype the Python package views them as) |
//! | `date32`, `time32`, `interval<year_month>` | `int64`: days, counts of the unit, months |
//! | `interval<day_time>`, `interval<month_day_nano>` | `[2]` int64 (days, milliseconds), `[3]` int64 (months, days, nanoseconds) |
//! | `decimal32/64/128/256` | `float64`: the nearest double to the value (exact to 15 significant digits) |
//! | `fixed_size_binary[k]` | `[k]` uint8 |
//! | `dictionary<k, v>` | its values, as `v` becomes |
//! | `null` | `bool` (every row null) |
//! | lists and fixed-size lists of these | lists of what they become |
//!
//! [`fill`] writes a fill value into the null slots of a column (the null buffer stays: it
//! is the `<name>_valid` column): [`Fill`]'s number for numbers (NaN for floats, 0 for
//! integers unless given), false for bools, an empty value for bytes, text and lists. Nulls
//! inside a list (`[1, null, 3]`) are filled the same way, with no mask of their own.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal32Type, Decimal64Type, Decimal128Type, Decimal256Type, IntervalDayTimeType,
    IntervalMonthDayNanoType, IntervalYearMonthType, Time32MillisecondType, Time32SecondType,
};
use arrow_array::{
    Array, ArrayRef, ArrowPrimitiveType, BooleanArray, FixedSizeListArray, GenericByteArray,
    GenericListArray, Int64Array, OffsetSizeTrait, UInt8Array, make_array,
};
use arrow_buffer::{ArrowNativeType, BooleanBuffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field as ArrowField, IntervalUnit, TimeUnit};

pub(crate) use crate::nulls::Fill;

/// The type `dt` becomes (see the module's table); other types are returned as they are.
pub(crate) fn normal_type(dt: &DataType) -> DataType {
    let list_of = |n: usize| {
        DataType::FixedSizeList(
            Arc::new(ArrowField::new("item", DataType::Int64, false)),
            n as i32,
        )
    };
    match dt {
        DataType::Timestamp(..)
        | DataType::Date32
        | DataType::Date64
        | DataType::Time32(_)
        | DataType::Time64(_)
        | DataType::Duration(_)
        | DataType::Interval(IntervalUnit::YearMonth) => DataType::Int64,
        DataType::Interval(IntervalUnit::DayTime) => list_of(2),
        DataType::Interval(IntervalUnit::MonthDayNano) => list_of(3),
        DataType::Decimal32(..)
        | DataType::Decimal64(..)
        | DataType::Decimal128(..)
        | DataType::Decimal256(..) => DataType::Float64,
        DataType::FixedSizeBinary(k) => DataType::FixedSizeList(
            Arc::new(ArrowField::new("item", DataType::UInt8, false)),
            *k,
        ),
        DataType::Dictionary(_, v) => normal_type(v),
        DataType::Null => DataType::Boolean,
        DataType::List(f) | DataType::ListView(f) => DataType::List(normal_field(f)),
        DataType::LargeList(f) | DataType::LargeListView(f) => DataType::LargeList(normal_field(f)),
        DataType::RunEndEncoded(_, v) => normal_type(v.data_type()),
        DataType::FixedSizeList(f, k) => DataType::FixedSizeList(normal_field(f), *k),
        other => other.clone(),
    }
}

fn normal_field(f: &Arc<ArrowField>) -> Arc<ArrowField> {
    Arc::new(
        f.as_ref()
            .clone()
            .with_data_type(normal_type(f.data_type())),
    )
}

/// A short name of `unit`: `s`, `ms`, `us`, `ns` (numpy's and pyarrow's).
fn unit_name(unit: &arrow_schema::TimeUnit) -> &'static str {
    use arrow_schema::TimeUnit as U;
    match unit {
        U::Second => "s",
        U::Millisecond => "ms",
        U::Microsecond => "us",
        U::Nanosecond => "ns",
    }
}

/// `dt` as a [`chute_core::ColumnType`]'s `source` text, where a batch's dtype does not say
/// all of it (temporal types with their unit and zone, decimals, dictionaries, nested
/// types); `None` for types a batch holds as they are.
pub(crate) fn describe(dt: &DataType) -> Option<String> {
    Some(match dt {
        DataType::Timestamp(u, None) => format!("timestamp[{}]", unit_name(u)),
        DataType::Timestamp(u, Some(tz)) => format!("timestamp[{}, tz={tz}]", unit_name(u)),
        DataType::Date32 => "date32[day]".into(),
        DataType::Date64 => "date64[ms]".into(),
        DataType::Time32(u) => format!("time32[{}]", unit_name(u)),
        DataType::Time64(u) => format!("time64[{}]", unit_name(u)),
        DataType::Duration(u) => format!("duration[{}]", unit_name(u)),
        DataType::Interval(u) => format!("interval[{u:?}]"),
        DataType::Decimal32(p, sc) => format!("decimal32({p}, {sc})"),
        DataType::Decimal64(p, sc) => format!("decimal64({p}, {sc})"),
        DataType::Decimal128(p, sc) => format!("decimal128({p}, {sc})"),
        DataType::Decimal256(p, sc) => format!("decimal256({p}, {sc})"),
        DataType::Dictionary(k, v) => format!(
            "dictionary<{k}, {}>",
            describe(v).unwrap_or_else(|| v.to_string())
        ),
        DataType::FixedSizeBinary(k) => format!("fixed_size_binary[{k}]"),
        DataType::Null => "null".into(),
        DataType::List(_)
        | DataType::LargeList(_)
        | DataType::FixedSizeList(..)
        | DataType::ListView(_)
        | DataType::LargeListView(_)
        | DataType::Struct(_)
        | DataType::Map(..)
        | DataType::Union(..)
        | DataType::RunEndEncoded(..) => dt
            .to_string()
            // JSON text fields (their extension in their metadata) named for what they hold.
            .replace(
                r#"Utf8, metadata: {"ARROW:extension:name": "arrow.json"}"#,
                "json",
            ),
        _ => return None,
    })
}

/// The numpy dtype whose values a column of type `dt` becomes as int64 counts, where numpy
/// has one: timestamps (any zone: UTC instants) and dates `datetime64`, durations
/// `timedelta64`; dictionaries of those as their values. Times of day and intervals have no
/// numpy type and stay counts.
pub(crate) fn numpy_type(dt: &DataType) -> Option<String> {
    Some(match dt {
        DataType::Timestamp(u, _) => format!("datetime64[{}]", unit_name(u)),
        DataType::Date32 => "datetime64[D]".into(),
        DataType::Date64 => "datetime64[ms]".into(),
        DataType::Duration(u) => format!("timedelta64[{}]", unit_name(u)),
        DataType::Dictionary(_, v) => return numpy_type(v),
        _ => return None,
    })
}

/// The unit the numbers of a column of type `dt` count, where [`normal_type`] turns it into
/// counts (`timestamp[Microsecond]`, `date32 (days)`), looking into lists and dictionaries.
pub(crate) fn unit(dt: &DataType) -> Option<String> {
    match dt {
        DataType::Timestamp(u, _) => Some(format!("timestamp[{u:?}]")),
        DataType::Date32 => Some("date32 (days)".into()),
        DataType::Date64 => Some("date64 (milliseconds)".into()),
        DataType::Time32(u) | DataType::Time64(u) => Some(format!("time[{u:?}]")),
        DataType::Duration(u) => Some(format!("duration[{u:?}]")),
        DataType::Interval(u) => Some(format!("interval[{u:?}]")),
        DataType::Dictionary(_, v) => unit(v),
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            unit(f.data_type())
        }
        _ => None,
    }
}

/// `col` as [`normal_type`] says, its nulls kept; nulls inside its lists filled with `fill`.
pub(crate) fn normalize(col: ArrayRef, fill: Fill) -> Result<ArrayRef, String> {
    let dt = col.data_type().clone();
    Ok(match &dt {
        DataType::Timestamp(..)
        | DataType::Date64
        | DataType::Time64(_)
        | DataType::Duration(_) => {
            // Stored as i64 counts already: the same buffers, seen as int64.
            let data = col
                .to_data()
                .into_builder()
                .data_type(DataType::Int64)
                .build()
                .map_err(|e| format!("{dt} column: {e}"))?;
            make_array(data)
        }
        DataType::Date32 => widen::<Date32Type>(&col, i64::from),
        DataType::Time32(TimeUnit::Second) => widen::<Time32SecondType>(&col, i64::from),
        DataType::Time32(_) => widen::<Time32MillisecondType>(&col, i64::from),
        DataType::Interval(IntervalUnit::YearMonth) => {
            widen::<IntervalYearMonthType>(&col, i64::from)
        }
        DataType::Interval(IntervalUnit::DayTime) => {
            let a = col.as_primitive::<IntervalDayTimeType>();
            let v: Vec<i64> = a
                .values()
                .iter()
                .flat_map(|d| [i64::from(d.days), i64::from(d.milliseconds)])
                .collect();
            int64_lists(v, 2, a.nulls().cloned())?
        }
        DataType::Interval(IntervalUnit::MonthDayNano) => {
            let a = col.as_primitive::<IntervalMonthDayNanoType>();
            let v: Vec<i64> = a
                .values()
                .iter()
                .flat_map(|d| [i64::from(d.months), i64::from(d.days), d.nanoseconds])
                .collect();
            int64_lists(v, 3, a.nulls().cloned())?
        }
        DataType::Decimal32(_, s) => decimal::<Decimal32Type>(&col, *s, f64::from),
        DataType::Decimal64(_, s) => decimal::<Decimal64Type>(&col, *s, |v| v as f64),
        DataType::Decimal128(_, s) => decimal::<Decimal128Type>(&col, *s, |v| v as f64),
        DataType::Decimal256(_, s) => decimal::<Decimal256Type>(&col, *s, |v| {
            let (low, high) = v.to_parts();
            high as f64 * 2f64.powi(128) + low as f64
        }),
        DataType::FixedSizeBinary(k) => {
            let a = col.as_fixed_size_binary();
            let k = *k;
            let bytes = a.value_data();
            let start = a.offset() * k.max(0) as usize;
            let end = start + a.len() * k.max(0) as usize;
            let values = UInt8Array::from(bytes.get(start..end).unwrap_or(&[]).to_vec());
            let field = Arc::new(ArrowField::new("item", DataType::UInt8, false));
            Arc::new(
                FixedSizeListArray::try_new(field, k, Arc::new(values), a.nulls().cloned())
                    .map_err(|e| format!("{dt} column: {e}"))?,
            )
        }
        DataType::Dictionary(..) => {
            let d = col.as_any_dictionary();
            let values = arrow_select::take::take(d.values().as_ref(), d.keys(), None)
                .map_err(|e| format!("{dt} column: {e}"))?;
            normalize(values, fill)?
        }
        DataType::Null => Arc::new(BooleanArray::new(
            BooleanBuffer::new_unset(col.len()),
            Some(NullBuffer::new_null(col.len())),
        )),
        DataType::List(_) => list::<i32>(&col, fill)?,
        DataType::LargeList(_) => list::<i64>(&col, fill)?,
        DataType::ListView(_) => normalize(view_to_list::<i32>(&col)?, fill)?,
        DataType::LargeListView(_) => normalize(view_to_list::<i64>(&col)?, fill)?,
        DataType::RunEndEncoded(ends, _) => {
            let (values, at) = match ends.data_type() {
                DataType::Int16 => runs::<arrow_array::types::Int16Type>(&col),
                DataType::Int32 => runs::<arrow_array::types::Int32Type>(&col),
                _ => runs::<arrow_array::types::Int64Type>(&col),
            };
            let taken = arrow_select::take::take(values.as_ref(), &at, None)
                .map_err(|e| format!("{dt} column: {e}"))?;
            normalize(taken, fill)?
        }
        DataType::FixedSizeList(f, k) => {
            let a = col.as_fixed_size_list();
            let values = inner(a.values().clone(), fill)?;
            if Arc::ptr_eq(&values, a.values()) {
                return Ok(col);
            }
            Arc::new(
                FixedSizeListArray::try_new(normal_field(f), *k, values, a.nulls().cloned())
                    .map_err(|e| format!("{dt} column: {e}"))?,
            )
        }
        _ => col,
    })
}

/// A list's values: normalized, their nulls filled (a list holds no mask of its own).
fn inner(values: ArrayRef, fill: Fill) -> Result<ArrayRef, String> {
    let normal = normalize(values.clone(), fill)?;
    let filled = if normal.null_count() > 0 {
        without_nulls(&fill_values(&normal, fill)?)
    } else {
        normal
    };
    Ok(
        if filled.data_type() == values.data_type() && values.null_count() == 0 {
            values
        } else {
            filled
        },
    )
}

fn list<O: OffsetSizeTrait>(col: &ArrayRef, fill: Fill) -> Result<ArrayRef, String> {
    let a = col.as_list::<O>();
    let values = inner(a.values().clone(), fill)?;
    if Arc::ptr_eq(&values, a.values()) {
        return Ok(col.clone());
    }
    let (DataType::List(f) | DataType::LargeList(f)) = col.data_type() else {
        unreachable!("a list")
    };
    Ok(Arc::new(
        GenericListArray::<O>::try_new(
            normal_field(f),
            a.offsets().clone(),
            values,
            a.nulls().cloned(),
        )
        .map_err(|e| format!("{} column: {e}", col.data_type()))?,
    ))
}

/// A list view (offsets and sizes per row, in any order) as a list of the same rows.
fn view_to_list<O: OffsetSizeTrait>(col: &ArrayRef) -> Result<ArrayRef, String> {
    let a = col.as_list_view::<O>();
    let (DataType::ListView(f) | DataType::LargeListView(f)) = col.data_type() else {
        unreachable!("a list view")
    };
    let (o, sizes) = (a.value_offsets(), a.value_sizes());
    let rows = (0..a.len()).map(|i| o[i].as_usize()..o[i].as_usize() + sizes[i].as_usize());
    gathered_list::<O>(f, a.values(), a.nulls(), rows)
}

/// A list of `field`s whose row `i` holds `values[rows[i]]` (nothing where `nulls` says the
/// row is null): the values gathered in row order into one new array.
fn gathered_list<O: OffsetSizeTrait>(
    field: &Arc<ArrowField>,
    values: &ArrayRef,
    nulls: Option<&NullBuffer>,
    rows: impl Iterator<Item = std::ops::Range<usize>>,
) -> Result<ArrayRef, String> {
    let (mut offsets, mut take) = (vec![O::usize_as(0)], Vec::new());
    for (i, range) in rows.enumerate() {
        if nulls.is_none_or(|n| n.is_valid(i)) {
            take.extend(range.map(|j| j as u64));
        }
        offsets.push(O::usize_as(take.len()));
    }
    let values =
        arrow_select::take::take(values.as_ref(), &arrow_array::UInt64Array::from(take), None)
            .map_err(|e| e.to_string())?;
    Ok(Arc::new(
        GenericListArray::<O>::try_new(
            field.clone(),
            OffsetBuffer::new(ScalarBuffer::from(offsets)),
            values,
            nulls.cloned(),
        )
        .map_err(|e| e.to_string())?,
    ))
}

/// A run-end-encoded array's values and, per row, the place of its value in them.
fn runs<R: arrow_array::types::RunEndIndexType>(
    col: &ArrayRef,
) -> (ArrayRef, arrow_array::UInt64Array) {
    let r = col
        .as_any()
        .downcast_ref::<arrow_array::RunArray<R>>()
        .expect("a run-end-encoded array");
    let at = (0..r.len())
        .map(|i| r.get_physical_index(i) as u64)
        .collect();
    (r.values().clone(), at)
}

fn widen<T: ArrowPrimitiveType>(col: &ArrayRef, f: impl Fn(T::Native) -> i64) -> ArrayRef {
    let a = col.as_primitive::<T>();
    let v: ScalarBuffer<i64> = a.values().iter().map(|&x| f(x)).collect();
    Arc::new(Int64Array::new(v, a.nulls().cloned()))
}

fn decimal<T: ArrowPrimitiveType>(
    col: &ArrayRef,
    scale: i8,
    f: impl Fn(T::Native) -> f64,
) -> ArrayRef {
    let a = col.as_primitive::<T>();
    let div = 10f64.powi(i32::from(scale));
    let v: ScalarBuffer<f64> = a.values().iter().map(|&x| f(x) / div).collect();
    Arc::new(arrow_array::Float64Array::new(v, a.nulls().cloned()))
}

fn int64_lists(v: Vec<i64>, k: i32, nulls: Option<NullBuffer>) -> Result<ArrayRef, String> {
    let field = Arc::new(ArrowField::new("item", DataType::Int64, false));
    Ok(Arc::new(
        FixedSizeListArray::try_new(field, k, Arc::new(Int64Array::from(v)), nulls)
            .map_err(|e| e.to_string())?,
    ))
}

/// `col` (normalized) with `fill` written into its null slots, its null buffer kept (the
/// places of the nulls: a source's `<name>_valid` column): numbers get the fill's number,
/// bools false, fixed-size lists a row of it, bytes, text and lists an empty value.
pub(crate) fn fill(col: ArrayRef, fill: Fill) -> Result<ArrayRef, String> {
    if col.null_count() == 0 {
        return Ok(col);
    }
    fill_values(&col, fill)
}

/// [`fill`], for a column with nulls.
fn fill_values(col: &ArrayRef, fill: Fill) -> Result<ArrayRef, String> {
    let nulls = col.nulls().expect("a column with nulls").clone();
    let dt = col.data_type().clone();
    match &dt {
        DataType::Boolean => {
            let values = col.as_boolean().values() & nulls.inner();
            Ok(Arc::new(BooleanArray::new(values, Some(nulls))))
        }
        DataType::FixedSizeList(f, k) => {
            let a = col.as_fixed_size_list();
            let k = (*k).max(0) as usize;
            let values = a.values().slice(a.value_offset_at(0), a.len() * k);
            // Each null row's k values get the fill: the values seen as rows of k.
            let mut mask = Vec::with_capacity(a.len() * k);
            for i in 0..a.len() {
                mask.extend(std::iter::repeat_n(a.is_valid(i), k));
            }
            let masked = with_nulls(&values, NullBuffer::from(mask))?;
            let filled = without_nulls(&fill_values(&masked, fill)?);
            Ok(Arc::new(
                FixedSizeListArray::try_new(f.clone(), k as i32, filled, Some(nulls))
                    .map_err(|e| format!("{dt} column: {e}"))?,
            ))
        }
        DataType::List(_) => empty_nulls_list::<i32>(col),
        DataType::LargeList(_) => empty_nulls_list::<i64>(col),
        DataType::Binary => empty_nulls_bytes::<arrow_array::types::BinaryType>(col),
        DataType::LargeBinary => empty_nulls_bytes::<arrow_array::types::LargeBinaryType>(col),
        DataType::Utf8 => empty_nulls_bytes::<arrow_array::types::Utf8Type>(col),
        DataType::LargeUtf8 => empty_nulls_bytes::<arrow_array::types::LargeUtf8Type>(col),
        DataType::BinaryView => {
            let a = col.as_binary_view();
            let v: arrow_array::BinaryArray = a.iter().map(|x| Some(x.unwrap_or(&[]))).collect();
            with_nulls(&(Arc::new(v) as ArrayRef), nulls)
        }
        DataType::Utf8View => {
            let a = col.as_string_view();
            let v: arrow_array::StringArray = a.iter().map(|x| Some(x.unwrap_or(""))).collect();
            with_nulls(&(Arc::new(v) as ArrayRef), nulls)
        }
        _ if dt.is_primitive() => {
            let data = col.to_data();
            let width = dt.primitive_width().expect("a primitive type");
            let start = data.offset() * width;
            let mut raw = data.buffers()[0].as_slice()[start..start + col.len() * width].to_vec();
            let value = fill_bytes(&dt, fill);
            // The null slots only: the set bits of the inverted validity.
            for i in (!nulls.inner()).set_indices() {
                raw[i * width..(i + 1) * width].copy_from_slice(&value[..width]);
            }
            let data = data
                .into_builder()
                .offset(0)
                .buffers(vec![arrow_buffer::Buffer::from_vec(raw)])
                .nulls(Some(nulls))
                .build()
                .map_err(|e| format!("{dt} column: {e}"))?;
            Ok(make_array(data))
        }
        other => Err(format!("a {other} column with nulls has no fill")),
    }
}

/// The bytes of `fill`'s value in a primitive type `dt` (little-endian, as Arrow stores it).
fn fill_bytes(dt: &DataType, fill: Fill) -> [u8; 8] {
    let mut out = [0u8; 8];
    let x = fill.number;
    let mut put = |b: &[u8]| out[..b.len()].copy_from_slice(b);
    let int = x.unwrap_or(0.0);
    match dt {
        DataType::Float16 => put(&half::f16::from_f64(x.unwrap_or(f64::NAN)).to_le_bytes()),
        DataType::Float32 => put(&(x.unwrap_or(f64::NAN) as f32).to_le_bytes()),
        DataType::Float64 => put(&x.unwrap_or(f64::NAN).to_le_bytes()),
        DataType::Int8 => put(&(int as i8).to_le_bytes()),
        DataType::Int16 => put(&(int as i16).to_le_bytes()),
        DataType::Int32 => put(&(int as i32).to_le_bytes()),
        DataType::Int64 => put(&(int as i64).to_le_bytes()),
        DataType::UInt8 => put(&(int as u8).to_le_bytes()),
        DataType::UInt16 => put(&(int as u16).to_le_bytes()),
        DataType::UInt32 => put(&(int as u32).to_le_bytes()),
        DataType::UInt64 => put(&(int as u64).to_le_bytes()),
        _ => {}
    }
    out
}

/// A list column whose null rows hold no values (they may, in Arrow): rebuilt where one does.
fn empty_nulls_list<O: OffsetSizeTrait>(col: &ArrayRef) -> Result<ArrayRef, String> {
    let a = col.as_list::<O>();
    let o = a.value_offsets();
    if (0..a.len()).all(|i| a.is_valid(i) || o[i] == o[i + 1]) {
        return Ok(col.clone());
    }
    let (DataType::List(f) | DataType::LargeList(f)) = col.data_type() else {
        unreachable!("a list")
    };
    let rows = (0..a.len()).map(|i| o[i].as_usize()..o[i + 1].as_usize());
    gathered_list::<O>(f, a.values(), a.nulls(), rows)
}

/// A binary or string column whose null slots are empty: rebuilt where one is not.
fn empty_nulls_bytes<T: arrow_array::types::ByteArrayType>(
    col: &ArrayRef,
) -> Result<ArrayRef, String> {
    let a: &GenericByteArray<T> = col.as_bytes::<T>();
    let o = a.value_offsets();
    if (0..a.len()).all(|i| a.is_valid(i) || o[i] == o[i + 1]) {
        return Ok(col.clone());
    }
    let mut offsets = vec![T::Offset::usize_as(0)];
    let mut values = Vec::new();
    for i in 0..a.len() {
        if a.is_valid(i) {
            let v: &[u8] = a.value(i).as_ref();
            values.extend_from_slice(v);
        }
        offsets.push(T::Offset::usize_as(values.len()));
    }
    let out = GenericByteArray::<T>::try_new(
        OffsetBuffer::new(ScalarBuffer::from(offsets)),
        arrow_buffer::Buffer::from_vec(values),
        a.nulls().cloned(),
    )
    .map_err(|e| e.to_string())?;
    Ok(Arc::new(out))
}

fn with_nulls(col: &ArrayRef, nulls: NullBuffer) -> Result<ArrayRef, String> {
    let data = col
        .to_data()
        .into_builder()
        .nulls(Some(nulls))
        .build()
        .map_err(|e| e.to_string())?;
    Ok(make_array(data))
}

/// `col` (filled) without its null buffer.
fn without_nulls(col: &ArrayRef) -> ArrayRef {
    let data = col.to_data().into_builder().nulls(None);
    // SAFETY: dropping the null buffer leaves a valid array of the same layout.
    make_array(unsafe { data.build_unchecked() })
}

/// Whether `col` (or its dictionary's values) holds a null.
pub(crate) fn has_nulls(col: &dyn Array) -> bool {
    col.logical_null_count() > 0 || matches!(col.data_type(), DataType::Null)
}

#[cfg(test)]
mod tests {
    use arrow_array::builder::{ListBuilder, StringBuilder};
    use arrow_array::types::{Float32Type, Int8Type};
    use arrow_array::{
        Date32Array, Decimal128Array, DictionaryArray, FixedSizeBinaryArray, Float32Array,
        Int64Array, ListArray, NullArray, RecordBatch, StringArray, TimestampMicrosecondArray,
    };
    use chute_core::{BufferPool, Column, DType, Source};

    use super::*;
    use crate::ipc::{ArrowOptions, ArrowSource};
    use crate::{Fill, Nulls};

    fn int64s(a: &ArrayRef) -> Vec<Option<i64>> {
        a.as_primitive::<arrow_array::types::Int64Type>()
            .iter()
            .collect()
    }

    #[test]
    fn temporal_decimal_binary_dictionary_and_null_columns_become_batch_kinds() {
        let f = Fill::default();
        let ts: ArrayRef = Arc::new(
            TimestampMicrosecondArray::from(vec![Some(1_700_000_000_000_000), None])
                .with_timezone("Europe/Paris"),
        );
        let n = normalize(ts, f).unwrap();
        assert_eq!(n.data_type(), &DataType::Int64);
        assert_eq!(int64s(&n), [Some(1_700_000_000_000_000), None]);
        let days: ArrayRef = Arc::new(Date32Array::from(vec![19_000, -3]));
        assert_eq!(
            int64s(&normalize(days, f).unwrap()),
            [Some(19_000), Some(-3)]
        );
        let dec: ArrayRef = Arc::new(
            Decimal128Array::from(vec![Some(12_345), Some(-5), None])
                .with_precision_and_scale(10, 2)
                .unwrap(),
        );
        let d = normalize(dec, f).unwrap();
        let d: Vec<Option<f64>> = d
            .as_primitive::<arrow_array::types::Float64Type>()
            .iter()
            .collect();
        assert_eq!(d, [Some(123.45), Some(-0.05), None]);
        let uuid: ArrayRef = Arc::new(
            FixedSizeBinaryArray::try_from_iter(vec![vec![1u8, 2, 3], vec![4, 5, 6]].into_iter())
                .unwrap(),
        );
        let u = normalize(uuid, f).unwrap();
        let u = u.as_fixed_size_list();
        assert_eq!(u.value_length(), 3);
        assert_eq!(
            u.value(1)
                .as_primitive::<arrow_array::types::UInt8Type>()
                .values(),
            &[4, 5, 6]
        );
        let dict: ArrayRef = Arc::new(
            vec![Some("b"), None, Some("a"), Some("b")]
                .into_iter()
                .collect::<DictionaryArray<Int8Type>>(),
        );
        let s = normalize(dict, f).unwrap();
        let s: Vec<Option<&str>> = s.as_string::<i32>().iter().collect();
        assert_eq!(s, [Some("b"), None, Some("a"), Some("b")]);
        let null: ArrayRef = Arc::new(NullArray::new(3));
        let b = normalize(null, f).unwrap();
        assert_eq!((b.data_type(), b.null_count()), (&DataType::Boolean, 3));
        // A list of dates: a list of int64, its inner nulls filled.
        let mut lb =
            arrow_array::builder::ListBuilder::new(arrow_array::builder::Date32Builder::new());
        lb.values().append_value(1);
        lb.values().append_null();
        lb.append(true);
        let l: ArrayRef = Arc::new(lb.finish());
        let l = normalize(l, f).unwrap();
        assert_eq!(
            normal_type(&DataType::List(Arc::new(ArrowField::new(
                "item",
                DataType::Date32,
                true
            )))),
            *l.data_type()
        );
        let inner = l.as_list::<i32>().value(0);
        assert_eq!(
            (int64s(&inner), inner.null_count()),
            (vec![Some(1), Some(0)], 0)
        );
    }

    #[test]
    fn nulls_are_filled_and_their_places_kept() {
        let x: ArrayRef = Arc::new(Float32Array::from(vec![Some(1.0), None, Some(3.0)]));
        let filled = fill(x, Fill::default()).unwrap();
        let v = filled.as_primitive::<Float32Type>().values();
        assert!(v[0] == 1.0 && v[1].is_nan() && v[2] == 3.0);
        assert_eq!(filled.null_count(), 1);
        let i: ArrayRef = Arc::new(Int64Array::from(vec![None, Some(7)]));
        let filled = fill(i, Fill { number: Some(-1.0) }).unwrap();
        assert_eq!(
            filled
                .as_primitive::<arrow_array::types::Int64Type>()
                .values(),
            &[-1, 7]
        );
        // A null slot that holds bytes in the file (Arrow allows it) reads as empty.
        let s = StringArray::new(
            OffsetBuffer::new(ScalarBuffer::from(vec![0i32, 2, 5])),
            arrow_buffer::Buffer::from(b"hiyou".to_vec()),
            Some(NullBuffer::from(vec![true, false])),
        );
        let filled = fill(Arc::new(s), Fill::default()).unwrap();
        let a = filled.as_string::<i32>();
        assert_eq!((a.value(0), a.value_offsets()[2]), ("hi", 2));
        let mut lb = ListBuilder::new(StringBuilder::new());
        lb.values().append_value("a");
        lb.append(true);
        lb.values().append_value("junk");
        lb.append(false);
        let l: ListArray = lb.finish();
        let filled = fill(Arc::new(l), Fill::default()).unwrap();
        assert_eq!(filled.as_list::<i32>().value_length(1), 0);
        assert_eq!(filled.null_count(), 1);
    }

    fn source(nulls: Nulls) -> Result<ArrowSource, chute_core::Error> {
        let schema = Arc::new(arrow_schema::Schema::new(vec![
            ArrowField::new("x", DataType::Float32, true),
            ArrowField::new("n", DataType::Int64, true),
            ArrowField::new("s", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Float32Array::from(vec![Some(1.0), None, Some(3.0), None])),
                Arc::new(Int64Array::from(vec![1, 2, 3, 4])),
                Arc::new(StringArray::from(vec![
                    Some("a"),
                    Some("b"),
                    None,
                    Some("d"),
                ])),
            ],
        )
        .unwrap();
        let options = ArrowOptions {
            nulls,
            ..Default::default()
        };
        ArrowSource::from_batches(schema, vec![batch], None, "t.arrow", options)
    }

    #[test]
    fn files_whose_time_columns_count_other_units_are_refused() {
        let batch = |ts: ArrayRef| {
            let schema = Arc::new(arrow_schema::Schema::new(vec![ArrowField::new(
                "t",
                ts.data_type().clone(),
                false,
            )]));
            RecordBatch::try_new(schema, vec![ts]).unwrap()
        };
        let us = batch(Arc::new(TimestampMicrosecondArray::from(vec![1, 2])));
        let ns = batch(Arc::new(arrow_array::TimestampNanosecondArray::from(vec![
            1, 2,
        ])));
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, b: &RecordBatch| {
            let path = dir.path().join(name);
            let mut w = arrow_ipc::writer::FileWriter::try_new(
                std::fs::File::create(&path).unwrap(),
                &b.schema(),
            )
            .unwrap();
            w.write(b).unwrap();
            w.finish().unwrap();
            path
        };
        let (a, b, c) = (
            write("a.arrow", &us),
            write("b.arrow", &ns),
            write("c.arrow", &us),
        );
        let e = ArrowSource::open(&[&a, &b], Default::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("t: timestamp[Nanosecond]") && e.contains("t: timestamp[Microsecond]"),
            "{e}"
        );
        assert_eq!(
            ArrowSource::open(&[&a, &c], Default::default())
                .unwrap()
                .manifest()
                .total_samples(),
            4
        );
    }

    #[test]
    fn validity_of_a_run_of_rows_and_of_scattered_rows() {
        let n = 300;
        let schema = Arc::new(arrow_schema::Schema::new(vec![ArrowField::new(
            "x",
            DataType::Int64,
            true,
        )]));
        let x = Int64Array::from_iter((0..n).map(|i| (i % 3 != 0).then_some(i)));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(x)]).unwrap();
        let src =
            ArrowSource::from_batches(schema, vec![batch], None, "t", Default::default()).unwrap();
        let pool = BufferPool::new(4);
        // A run starting off a byte boundary, ending off a word's; then scattered rows.
        for ids in [(5..150).collect::<Vec<u64>>(), vec![299, 3, 4, 100, 0]] {
            let b = src.collate(&ids, &pool).unwrap().unwrap();
            let valid = b[1].1.as_tensor().unwrap().as_bytes().to_vec();
            let want: Vec<u8> = ids.iter().map(|&i| u8::from(i % 3 != 0)).collect();
            assert_eq!(valid, want);
            let x = b[0]
                .1
                .as_tensor()
                .unwrap()
                .as_slice::<i64>()
                .unwrap()
                .to_vec();
            let want: Vec<i64> = ids
                .iter()
                .map(|&i| if i % 3 == 0 { 0 } else { i as i64 })
                .collect();
            assert_eq!(x, want);
        }
    }

    #[test]
    fn a_source_masks_the_columns_that_hold_nulls_or_raises() {
        let src = source(Nulls::Mask).unwrap();
        let batch = src
            .collate(&[3, 1, 2, 0], &BufferPool::new(4))
            .unwrap()
            .unwrap();
        let names: Vec<&str> = batch.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["x", "n", "s", "x_valid", "s_valid"]);
        let x = batch[0]
            .1
            .as_tensor()
            .unwrap()
            .as_slice::<f32>()
            .unwrap()
            .to_vec();
        assert!(x[0].is_nan() && x[1].is_nan() && x[2] == 3.0 && x[3] == 1.0);
        let valid = batch[3].1.as_tensor().unwrap();
        assert_eq!(
            (valid.dtype(), valid.as_bytes()),
            (DType::Bool, &[0u8, 0, 1, 1][..])
        );
        let Column::Var(s) = &batch[2].1 else {
            panic!()
        };
        assert_eq!((s.get(0), s.get(2)), (&b"d"[..], &b""[..]));
        assert_eq!(batch[4].1.as_tensor().unwrap().as_bytes(), &[1, 1, 0, 1]);
        // One by one, the same.
        let one = src.read(2).unwrap();
        let names: Vec<&str> = one.fields.iter().map(|(n, _)| n.as_ref()).collect();
        assert_eq!(names, ["x", "n", "s", "x_valid", "s_valid"]);
        let err = source(Nulls::Raise)
            .unwrap()
            .collate(&[0, 1], &BufferPool::new(4))
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("column \"x\" is null in row 1") && err.contains("t.arrow"),
            "{err}"
        );
    }

    #[test]
    fn a_source_fills_nulls_without_masks_when_asked() {
        let src = source(Nulls::Fill).unwrap();
        let batch = src
            .collate(&[3, 1, 2, 0], &BufferPool::new(4))
            .unwrap()
            .unwrap();
        let names: Vec<&str> = batch.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["x", "n", "s"]);
        let x = batch[0].1.as_tensor().unwrap().as_slice::<f32>().unwrap();
        assert!(x[0].is_nan() && x[1].is_nan() && x[2] == 3.0 && x[3] == 1.0);
        let Column::Var(s) = &batch[2].1 else {
            panic!()
        };
        assert_eq!((s.get(0), s.get(2)), (&b"d"[..], &b""[..]));
        let one = src.read(2).unwrap();
        let names: Vec<&str> = one.fields.iter().map(|(n, _)| n.as_ref()).collect();
        assert_eq!(names, ["x", "n", "s"]);
        // Other fields than the masked reading's: another fingerprint.
        let masked = source(Nulls::Mask).unwrap();
        assert_ne!(
            src.manifest().fingerprint(),
            masked.manifest().fingerprint()
        );
    }
}
