//! The batcher: copies a batch's samples straight into pooled, 64-byte-aligned column
//! buffers, converting dtypes on the way (one pass, no intermediate per-sample copies).

use chute_core::{
    Array, BufferPool, Column, Error, Field, Sample, SampleRef, Tensor, VarColumn, cast_into,
};

/// Collates `samples` (all non-empty batches) into columns named after the first sample's
/// fields. Every sample must have the same fields; arrays must agree in dtype and number of
/// dimensions. Arrays of differing shapes become a [`Column::List`]; with `pad`, arrays of
/// one or more dimensions become one zero-padded tensor plus a `<name>_mask` column.
pub(crate) fn collate(
    samples: &[Sample],
    pool: &BufferPool,
    pad: bool,
) -> Result<Vec<(String, Column)>, Error> {
    let first = &samples[0];
    for s in &samples[1..] {
        if s.fields.len() != first.fields.len() {
            return Err(field_mismatch(first, s));
        }
    }
    let mut columns = Vec::with_capacity(first.fields.len());
    for (j, (name, field)) in first.fields.iter().enumerate() {
        let column = match field {
            Field::Array(a) => {
                let arrays = arrays(samples, j, name, a)?;
                let same = arrays.iter().all(|x| x.shape == a.shape);
                // A field that brings its own `<name>_mask` (audio `crop_audio` padded) is
                // not masked again.
                let masked =
                    pad && !a.shape.is_empty() && first.get(&format!("{name}_mask")).is_none();
                if same && !masked {
                    collate_arrays(&arrays, a, pool)
                } else if masked {
                    // Every batch of a padded field has its mask, even when no value needed
                    // padding.
                    let (values, mask) = collate_padded(&arrays, a, pool);
                    columns.push((name.to_string(), values));
                    columns.push((format!("{name}_mask"), mask));
                    continue;
                } else {
                    collate_list(&arrays, a, pool)
                }
            }
            Field::Bytes(_) => collate_var(samples, j, name, false, pool)?,
            Field::Text(_) => collate_var(samples, j, name, true, pool)?,
            Field::Value(_) => collate_values(samples, j, name)?,
            _ => {
                return Err(Error::Collate {
                    sample: sample_ref(first),
                    reason: format!("field {name:?} has a kind the batcher does not know"),
                });
            }
        };
        columns.push((name.to_string(), column));
    }
    Ok(columns)
}

/// Collates `samples` as the loader's batcher does (for batches built outside the engine,
/// such as those of a stream without random access): every sample must have the first one's
/// fields, arrays of differing shapes become a [`Column::List`], or with `pad` a zero-padded
/// tensor plus a `<name>_mask`.
pub fn collate_samples(
    samples: &[Sample],
    pool: &BufferPool,
    pad: bool,
) -> Result<Vec<(String, Column)>, Error> {
    if samples.is_empty() {
        return Ok(Vec::new());
    }
    collate(samples, pool, pad)
}

/// Columns from a source's columnar path ([`chute_core::Source::collate`], which knows
/// nothing of padding) made what [`collate`] gives for the same samples: a list whose tensors
/// share one shape becomes one tensor; with `pad`, lists are zero-padded and every column of
/// arrays of one or more dimensions gets its `<name>_mask`, unless the source padded its
/// columns itself (it gave a `<name>_mask` beside a `<name>`).
pub(crate) fn settle(
    columns: Vec<(String, Column)>,
    pool: &BufferPool,
    pad: bool,
) -> Vec<(String, Column)> {
    let padded = columns.iter().any(|(n, _)| {
        n.strip_suffix("_mask")
            .is_some_and(|stem| columns.iter().any(|(m, _)| m == stem))
    });
    let pad = pad && !padded;
    let mut out = Vec::with_capacity(columns.len());
    for (name, column) in columns {
        match column {
            Column::List(ts) if pad && !ts.is_empty() => {
                let arrays: Vec<Array> = ts
                    .iter()
                    .map(|t| {
                        Array::new(
                            t.dtype(),
                            t.shape().to_vec(),
                            bytes::Bytes::copy_from_slice(t.as_bytes()),
                        )
                    })
                    .collect();
                let refs: Vec<&Array> = arrays.iter().collect();
                let (values, mask) = collate_padded(&refs, &arrays[0], pool);
                out.push((name.clone(), values));
                out.push((format!("{name}_mask"), mask));
            }
            Column::List(ts) if !ts.is_empty() && ts.iter().all(|t| t.shape() == ts[0].shape()) => {
                let row = ts[0].as_bytes().len();
                let mut buf = pool.take(row * ts.len());
                for (t, dst) in ts
                    .iter()
                    .zip(buf.as_mut_slice().chunks_exact_mut(row.max(1)))
                {
                    dst[..row].copy_from_slice(t.as_bytes());
                }
                let mut shape = vec![ts.len()];
                shape.extend_from_slice(ts[0].shape());
                out.push((name, Column::Tensor(Tensor::new(ts[0].dtype(), shape, buf))));
            }
            Column::Tensor(t) if pad && t.shape().len() >= 2 => {
                let mut mask = pool.take(t.numel());
                mask.as_mut_slice().fill(1);
                let shape = t.shape().to_vec();
                out.push((name.clone(), Column::Tensor(t)));
                out.push((
                    format!("{name}_mask"),
                    Column::Tensor(Tensor::new(chute_core::DType::Bool, shape, mask)),
                ));
            }
            other => out.push((name, other)),
        }
    }
    out
}

/// Field `j` of `s`, which must be called `name` (the fast path: same position as in the
/// first sample), else looked up by name.
fn field<'a>(s: &'a Sample, j: usize, name: &str) -> Option<&'a Field> {
    match s.fields.get(j) {
        Some((n, f)) if n == name => Some(f),
        _ => s.get(name),
    }
}

/// Field `j` (`name`) of every sample, checked to be arrays of `proto`'s output dtype and
/// number of dimensions.
fn arrays<'a>(
    samples: &'a [Sample],
    j: usize,
    name: &str,
    proto: &Array,
) -> Result<Vec<&'a Array>, Error> {
    let out = proto.out_dtype();
    samples
        .iter()
        .map(|s| {
            let a = match field(s, j, name) {
                Some(Field::Array(a)) => a,
                Some(_) => return Err(kind_mismatch(s, name, "a numeric array")),
                None => return Err(missing(s, name)),
            };
            if a.shape.len() != proto.shape.len() || a.out_dtype() != out {
                return Err(Error::Collate {
                    sample: sample_ref(s),
                    reason: format!(
                        "field {name:?} is {} {:?}, but the batch's first sample has {} {:?}; \
                         a column needs one dtype and one number of dimensions",
                        a.out_dtype(),
                        a.shape,
                        out,
                        proto.shape
                    ),
                });
            }
            Ok(a)
        })
        .collect()
}

/// Arrays of one shape: one `[B, ...]` tensor.
fn collate_arrays(arrays: &[&Array], proto: &Array, pool: &BufferPool) -> Column {
    let out = proto.out_dtype();
    let row = proto.out_len();
    let mut shape = Vec::with_capacity(proto.shape.len() + 1);
    shape.push(arrays.len());
    shape.extend_from_slice(&proto.shape);
    let mut buf = pool.take(row * arrays.len());
    for (a, dst) in arrays
        .iter()
        .zip(buf.as_mut_slice().chunks_exact_mut(row.max(1)))
    {
        cast_into(a.dtype, &a.data, out, &mut dst[..row]);
    }
    Column::Tensor(Tensor::new(out, shape, buf))
}

/// Arrays of differing shapes, one tensor each.
fn collate_list(arrays: &[&Array], proto: &Array, pool: &BufferPool) -> Column {
    let out = proto.out_dtype();
    let tensors = arrays
        .iter()
        .map(|a| {
            let mut buf = pool.take(a.out_len());
            cast_into(a.dtype, &a.data, out, buf.as_mut_slice());
            Tensor::new(out, a.shape.clone(), buf)
        })
        .collect();
    Column::List(tensors)
}

/// Arrays of differing shapes zero-padded to the largest extent of every dimension, and the
/// mask of real values.
fn collate_padded(arrays: &[&Array], proto: &Array, pool: &BufferPool) -> (Column, Column) {
    let out = proto.out_dtype();
    let size = out.size();
    let mut max = vec![0usize; proto.shape.len()];
    for a in arrays {
        for (m, &d) in max.iter_mut().zip(&a.shape) {
            *m = (*m).max(d);
        }
    }
    let row: usize = max.iter().product();
    let mut shape = Vec::with_capacity(max.len() + 1);
    shape.push(arrays.len());
    shape.extend_from_slice(&max);
    let mut values = pool.take(row * size * arrays.len());
    let mut mask = pool.take(row * arrays.len());
    values.as_mut_slice().fill(0);
    mask.as_mut_slice().fill(0);
    let mut converted = Vec::new();
    for (i, a) in arrays.iter().enumerate() {
        converted.resize(a.out_len(), 0);
        cast_into(a.dtype, &a.data, out, &mut converted);
        // Copy runs of the innermost dimension to their padded positions.
        let inner = a.shape.last().copied().unwrap_or(1);
        let runs = a.shape.iter().rev().skip(1).product::<usize>();
        for r in 0..runs {
            // The run's index in the array's shape, then its offset in the padded shape.
            let (mut rem, mut at, mut stride) = (r, 0, max.last().copied().unwrap_or(1));
            for (d, &n) in a.shape.iter().enumerate().rev().skip(1) {
                at += (rem % n) * stride;
                rem /= n;
                stride *= max[d];
            }
            let dst = i * row + at;
            values.as_mut_slice()[dst * size..(dst + inner) * size]
                .copy_from_slice(&converted[r * inner * size..(r + 1) * inner * size]);
            mask.as_mut_slice()[dst..dst + inner].fill(1);
        }
    }
    (
        Column::Tensor(Tensor::new(out, shape.clone(), values)),
        Column::Tensor(Tensor::new(chute_core::DType::Bool, shape, mask)),
    )
}

fn collate_var(
    samples: &[Sample],
    j: usize,
    name: &str,
    text: bool,
    pool: &BufferPool,
) -> Result<Column, Error> {
    let value = |s: &Sample| match (field(s, j, name), text) {
        (Some(Field::Text(b)), true) | (Some(Field::Bytes(b)), false) => Ok(b.clone()),
        (Some(_), _) => Err(kind_mismatch(s, name, if text { "text" } else { "bytes" })),
        (None, _) => Err(missing(s, name)),
    };
    let values = samples.iter().map(value).collect::<Result<Vec<_>, _>>()?;
    Ok(Column::Var(VarColumn::collect(
        pool,
        values.iter().map(|b| &b[..]),
        text,
    )))
}

/// Field `j` (`name`) of every sample, each a nested value: kept as they are, one a row.
fn collate_values(samples: &[Sample], j: usize, name: &str) -> Result<Column, Error> {
    let value = |s: &Sample| match field(s, j, name) {
        Some(Field::Value(v)) => Ok(v.clone()),
        Some(_) => Err(kind_mismatch(s, name, "a nested value")),
        None => Err(missing(s, name)),
    };
    Ok(Column::Values(
        samples.iter().map(value).collect::<Result<_, _>>()?,
    ))
}

pub(crate) fn sample_ref(s: &Sample) -> SampleRef {
    SampleRef {
        index: s.index,
        key: s.key.clone(),
        shard: String::new(),
    }
}

fn missing(s: &Sample, name: &str) -> Error {
    let have: Vec<&str> = s.fields.iter().map(|(n, _)| n.as_ref()).collect();
    Error::Collate {
        sample: sample_ref(s),
        reason: format!(
            "it has no field {name:?} (it has {have:?}), but the batch's first sample has"
        ),
    }
}

fn kind_mismatch(s: &Sample, name: &str, want: &str) -> Error {
    Error::Collate {
        sample: sample_ref(s),
        reason: format!("field {name:?} is not {want}, as it is in the batch's first sample"),
    }
}

fn field_mismatch(first: &Sample, s: &Sample) -> Error {
    let names = |s: &Sample| {
        s.fields
            .iter()
            .map(|(n, _)| n.to_string())
            .collect::<Vec<_>>()
    };
    Error::Collate {
        sample: sample_ref(s),
        reason: format!(
            "it has fields {:?}, but the batch's first sample has {:?}; every sample of a batch \
             needs the same fields (drop or fill the odd ones with a transform)",
            names(s),
            names(first)
        ),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use chute_core::DType;

    use super::*;

    fn sample(i: u64, tokens: &[u16], text: &str) -> Sample {
        let data: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        let mut a = Array::new(DType::U16, vec![tokens.len()], Bytes::from(data));
        a.cast = Some(DType::I64);
        Sample::new(i)
            .with("tokens", Field::Array(a))
            .with("text", Field::Text(Bytes::copy_from_slice(text.as_bytes())))
    }

    #[test]
    fn collates_with_cast_and_offsets() {
        let pool = BufferPool::new(8);
        let cols = collate(
            &[sample(0, &[1, 2], "ab"), sample(1, &[3, 65535], "")],
            &pool,
            false,
        )
        .unwrap();
        let t = cols[0].1.as_tensor().unwrap();
        assert_eq!(t.shape(), [2, 2]);
        assert_eq!(t.as_slice::<i64>().unwrap(), [1, 2, 3, 65535]);
        assert_eq!(t.data_ptr() as usize % 64, 0);
        let Column::Var(v) = &cols[1].1 else { panic!() };
        assert_eq!(
            (v.get(0), v.get(1), v.len(), v.text),
            (&b"ab"[..], &b""[..], 2, true)
        );
    }

    /// A source's columnar lists end as `collate` would leave the same samples.
    #[test]
    fn settled_columnar_lists_match_collated_samples() {
        let pool = BufferPool::new(8);
        let list = |rows: &[&[i64]]| {
            Column::List(
                rows.iter()
                    .map(|r| {
                        let mut buf = pool.take(r.len() * 8);
                        for (d, v) in buf.as_mut_slice().chunks_exact_mut(8).zip(*r) {
                            d.copy_from_slice(&v.to_le_bytes());
                        }
                        Tensor::new(DType::I64, vec![r.len()], buf)
                    })
                    .collect(),
            )
        };
        let as_samples = |rows: &[&[i64]]| -> Vec<Sample> {
            rows.iter()
                .enumerate()
                .map(|(i, r)| {
                    let data: Vec<u8> = r.iter().flat_map(|v| v.to_le_bytes()).collect();
                    Sample::new(i as u64).with(
                        "ids",
                        Field::Array(Array::new(DType::I64, vec![r.len()], Bytes::from(data))),
                    )
                })
                .collect()
        };
        for rows in [&[&[1i64, 2][..], &[3, 4]][..], &[&[1, 2], &[3], &[]]] {
            for pad in [false, true] {
                let settled = settle(vec![("ids".into(), list(rows))], &pool, pad);
                let collated = collate(&as_samples(rows), &pool, pad).unwrap();
                assert_eq!(settled.len(), collated.len(), "rows {rows:?} pad {pad}");
                for ((n1, c1), (n2, c2)) in settled.iter().zip(&collated) {
                    assert_eq!(n1, n2);
                    match (c1, c2) {
                        (Column::Tensor(a), Column::Tensor(b)) => {
                            assert_eq!(
                                (a.shape(), a.dtype(), a.as_bytes()),
                                (b.shape(), b.dtype(), b.as_bytes())
                            );
                        }
                        (Column::List(a), Column::List(b)) => {
                            let a: Vec<&[u8]> = a.iter().map(|t| t.as_bytes()).collect();
                            let b: Vec<&[u8]> = b.iter().map(|t| t.as_bytes()).collect();
                            assert_eq!(a, b);
                        }
                        other => panic!("rows {rows:?} pad {pad}: {other:?}"),
                    }
                }
            }
        }
    }

    #[test]
    fn differing_shapes_are_listed_or_padded_with_a_mask() {
        let pool = BufferPool::new(8);
        let batch = [
            sample(0, &[1, 2], "a"),
            sample(7, &[3], "b"),
            sample(8, &[], "c"),
        ];
        let cols = collate(&batch, &pool, false).unwrap();
        let Column::List(ts) = &cols[0].1 else {
            panic!("{:?}", cols[0].1)
        };
        let got: Vec<&[i64]> = ts.iter().map(|t| t.as_slice::<i64>().unwrap()).collect();
        assert_eq!(got, [&[1, 2][..], &[3], &[]]);

        let cols = collate(&batch, &pool, true).unwrap();
        let names: Vec<&str> = cols.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["tokens", "tokens_mask", "text"]);
        let values = cols[0].1.as_tensor().unwrap();
        assert_eq!(values.shape(), [3, 2]);
        assert_eq!(values.as_slice::<i64>().unwrap(), [1, 2, 3, 0, 0, 0]);
        let mask = cols[1].1.as_tensor().unwrap();
        assert_eq!(mask.dtype(), DType::Bool);
        assert_eq!(mask.as_bytes(), [1, 1, 1, 0, 0, 0]);

        // With padding on, a batch that needs none still has its mask; scalars have none.
        let scalar = |i: u64| {
            sample(i, &[4, 5], "").with(
                "label",
                Field::Array(Array::new(DType::U8, vec![], Bytes::from_static(&[3]))),
            )
        };
        let cols = collate(&[scalar(0), scalar(1)], &pool, true).unwrap();
        let names: Vec<&str> = cols.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["tokens", "tokens_mask", "text", "label"]);
        assert_eq!(cols[1].1.as_tensor().unwrap().as_bytes(), [1, 1, 1, 1]);
    }

    #[test]
    fn padding_places_every_row_of_a_2d_array() {
        let pool = BufferPool::new(8);
        let a = |i: u64, h: usize, w: usize| {
            let data: Vec<u8> = (0..(h * w) as u8).map(|v| v + 1).collect();
            Sample::new(i).with(
                "img",
                Field::Array(Array::new(DType::U8, vec![h, w], data.into())),
            )
        };
        let cols = collate(&[a(0, 2, 3), a(1, 3, 1)], &pool, true).unwrap();
        let values = cols[0].1.as_tensor().unwrap();
        assert_eq!(values.shape(), [2, 3, 3]);
        #[rustfmt::skip]
        assert_eq!(values.as_bytes(), [
            1, 2, 3,  4, 5, 6,  0, 0, 0,
            1, 0, 0,  2, 0, 0,  3, 0, 0,
        ]);
        let mask = cols[1].1.as_tensor().unwrap();
        assert_eq!(
            mask.as_bytes(),
            [1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0]
        );
    }

    #[test]
    fn dtype_or_rank_mismatch_names_sample_and_field() {
        let pool = BufferPool::new(8);
        let mut odd = sample(7, &[1], "b");
        odd.set(
            "tokens",
            Field::Array(Array::new(DType::U8, vec![1, 1], Bytes::from_static(&[1]))),
        );
        let e = collate(&[sample(0, &[1, 2], "a"), odd], &pool, false).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("sample 7") && msg.contains("tokens"), "{msg}");
    }
}
