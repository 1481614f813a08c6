//! `.npy` input: arrays sharing their first axis; sample `i` takes row `i` of each, one field
//! per file named by its stem.

use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure};
use chute::core::Array;
use chute::formats::NpyHeader;
use chute::io::MappedFile;

use super::infer::{Column, Kind, Value};
use super::{Input, Row, row_key};

/// `.npy` files sharing their first axis, memory-mapped.
pub(super) struct NpyInput {
    arrays: Vec<(MappedFile, NpyHeader, usize)>,
    columns: Vec<Column>,
    rows: u64,
}

impl NpyInput {
    /// Maps `paths`, checking that every array has the same first axis.
    pub(super) fn open(paths: &[PathBuf]) -> anyhow::Result<NpyInput> {
        let mut arrays = Vec::new();
        let mut columns = Vec::new();
        let mut rows: Option<(usize, &Path)> = None;
        for path in paths {
            let origin = path.display().to_string();
            let file = MappedFile::open(path)?;
            let (header, offset) = NpyHeader::parse(file.as_slice(), &origin)?;
            header.data_range(offset, file.len(), &origin)?;
            let Some(&n) = header.shape().first() else {
                bail!(
                    "{origin}: a 0-d array (a single value); each .npy file needs a first axis \
                     of samples"
                );
            };
            match rows {
                None => rows = Some((n, path)),
                Some((m, first)) if m != n => bail!(
                    "{origin} has {n} rows (first axis), {} has {m}; every .npy file needs the \
                     same number",
                    first.display()
                ),
                Some(_) => {}
            }
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            ensure!(
                !columns.iter().any(|c: &Column| c.name == name),
                "two .npy files are named {name:?}; each file's stem names a field"
            );
            columns.push(Column {
                name,
                kind: Kind::Array,
                missing: false,
            });
            arrays.push((file, header, offset));
        }
        Ok(NpyInput {
            arrays,
            columns,
            rows: rows.map_or(0, |(n, _)| n as u64),
        })
    }
}

impl Input for NpyInput {
    fn len(&self) -> u64 {
        self.rows
    }

    fn columns(&self) -> &[Column] {
        &self.columns
    }

    fn read(
        &self,
        range: Range<u64>,
        out: &mut dyn FnMut(Row) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        for row in range {
            let values = self
                .arrays
                .iter()
                .map(|(file, header, offset)| {
                    let shape = header.shape()[1..].to_vec();
                    let size = shape.iter().product::<usize>() * header.dtype().size();
                    let at = offset + row as usize * size;
                    Value::Array(Array::new(header.dtype(), shape, file.bytes(at..at + size)))
                })
                .collect();
            out(Row {
                key: row_key(row),
                values,
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chute::core::DType;
    use chute::formats::write_npy;

    use crate::convert::testing;

    /// An array file `dir/name`.
    fn write(dir: &Path, name: &str, dtype: DType, shape: &[usize], data: &[u8]) -> PathBuf {
        testing::write(dir, name, write_npy(dtype, shape, data).unwrap())
    }

    #[test]
    fn sample_i_takes_row_i_of_every_array() {
        let dir = tempfile::tempdir().unwrap();
        let x: Vec<u8> = (0..12).collect();
        let x = write(dir.path(), "x.npy", DType::U8, &[3, 2, 2], &x);
        let y: Vec<u8> = [7i64, 8, 9].iter().flat_map(|v| v.to_le_bytes()).collect();
        let y = write(dir.path(), "y.npy", DType::I64, &[3], &y);
        let input = NpyInput::open(&[x, y]).unwrap();
        let names: Vec<_> = input.columns().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["x", "y"]);
        let mut rows = Vec::new();
        input
            .read(1..3, &mut |r| {
                let arrays: Vec<_> = r
                    .values
                    .iter()
                    .map(|v| match v {
                        Value::Array(a) => (a.shape.clone(), a.data.to_vec()),
                        other => panic!("{other:?}"),
                    })
                    .collect();
                rows.push((r.key, arrays));
                Ok(())
            })
            .unwrap();
        assert_eq!(
            rows,
            [
                (
                    "000000001".into(),
                    vec![
                        (vec![2, 2], vec![4, 5, 6, 7]),
                        (vec![], 8i64.to_le_bytes().to_vec())
                    ]
                ),
                (
                    "000000002".into(),
                    vec![
                        (vec![2, 2], vec![8, 9, 10, 11]),
                        (vec![], 9i64.to_le_bytes().to_vec())
                    ]
                ),
            ]
        );
    }

    #[test]
    fn arrays_need_the_same_first_axis_and_distinct_stems() {
        let dir = tempfile::tempdir().unwrap();
        let a = write(dir.path(), "a.npy", DType::U8, &[3], &[0; 3]);
        let b = write(dir.path(), "b.npy", DType::U8, &[2], &[0; 2]);
        let err = NpyInput::open(&[a.clone(), b]).map(|_| ()).unwrap_err();
        assert!(err.to_string().contains("same number"), "{err}");
        let a2 = write(dir.path(), "d/a.npy", DType::U8, &[3], &[0; 3]);
        let err = NpyInput::open(&[a, a2]).map(|_| ()).unwrap_err();
        assert!(
            err.to_string().contains("each file's stem names a field"),
            "{err}"
        );
    }
}
