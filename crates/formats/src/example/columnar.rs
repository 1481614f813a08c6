//! The columnar fast path: serialized Examples parsed straight into a batch's columns
//! ([`collate_examples`]), with no [`Sample`] per record.
//!
//! [`Sample`]: chute_core::Sample

use chute_core::{BufferPool, Column, DType, PooledBuf, Tensor, VarColumn};

use super::sample::ExampleOptions;
use super::wire::{FeatureRef, Kind, last_of_each_name, visit};

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
///
/// [`Sample`]: chute_core::Sample
/// [`Bytes`]: bytes::Bytes
/// [`example_to_sample`]: super::example_to_sample
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
