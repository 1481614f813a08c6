//! The batcher: copies a batch's samples straight into pooled, 64-byte-aligned column
//! buffers, converting dtypes on the way (one pass, no intermediate per-sample copies).

use chute_core::{
    Array, BufferPool, Column, Error, Field, Sample, SampleRef, Tensor, VarColumn, cast_into,
};

/// Collates `samples` (all non-empty batches) into columns named after the first sample's
/// fields. Every sample must have the same fields; arrays must agree in shape and dtype.
pub(crate) fn collate(
    samples: &[Sample],
    pool: &BufferPool,
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
            Field::Array(a) => collate_arrays(samples, j, name, a, pool)?,
            Field::Bytes(_) => collate_var(samples, j, name, false, pool)?,
            Field::Text(_) => collate_var(samples, j, name, true, pool)?,
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

/// Field `j` of `s`, which must be called `name` (the fast path: same position as in the
/// first sample), else looked up by name.
fn field<'a>(s: &'a Sample, j: usize, name: &str) -> Option<&'a Field> {
    match s.fields.get(j) {
        Some((n, f)) if n == name => Some(f),
        _ => s.get(name),
    }
}

fn collate_arrays(
    samples: &[Sample],
    j: usize,
    name: &str,
    proto: &Array,
    pool: &BufferPool,
) -> Result<Column, Error> {
    let out = proto.out_dtype();
    let row = proto.out_len();
    let mut shape = Vec::with_capacity(proto.shape.len() + 1);
    shape.push(samples.len());
    shape.extend_from_slice(&proto.shape);
    let mut buf = pool.take(row * samples.len());
    for (s, dst) in samples
        .iter()
        .zip(buf.as_mut_slice().chunks_exact_mut(row.max(1)))
    {
        let a = match field(s, j, name) {
            Some(Field::Array(a)) => a,
            Some(_) => return Err(kind_mismatch(s, name, "a numeric array")),
            None => return Err(missing(s, name)),
        };
        if a.shape != proto.shape || a.out_dtype() != out {
            return Err(Error::Collate {
                sample: sample_ref(s),
                reason: format!(
                    "field {name:?} is {} {:?}, but the batch's first sample has {} {:?}; \
                     resize or crop to a fixed shape, or emit it as bytes",
                    a.out_dtype(),
                    a.shape,
                    out,
                    proto.shape
                ),
            });
        }
        cast_into(a.dtype, &a.data, out, &mut dst[..row]);
    }
    Ok(Column::Tensor(Tensor::new(out, shape, buf)))
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

    #[test]
    fn shape_mismatch_names_sample_and_field() {
        let pool = BufferPool::new(8);
        let e = collate(&[sample(0, &[1, 2], "a"), sample(7, &[1], "b")], &pool).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("sample 7") && msg.contains("tokens"), "{msg}");
    }
}
