//! CSV (and TSV) input: files with a header row, read as one table; a row is a sample.

use std::fs::File;
use std::io::BufReader;
use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail, ensure};

use super::infer::{Column, Inferred, Kind, Value, cell_kind};
use super::table::{RowReader, TextTable, open_at};
use super::{Input, Row, row_key};

/// CSV files with a header row, read as one table.
#[derive(Debug)]
pub(super) struct CsvInput {
    table: TextTable,
    delimiter: u8,
    columns: Vec<Column>,
    /// The column holding keys, if any (not among `columns`).
    key: Option<usize>,
    /// Header names, in file order.
    header: Vec<String>,
}

impl CsvInput {
    /// The first pass over `files`: their header (the same in each), rows and column types.
    /// `delimiter` is `,` by default, a tab for `.tsv`; `key` names the column of keys.
    pub(super) fn open(
        files: &[PathBuf],
        delimiter: Option<char>,
        key: Option<&str>,
        shard_size: u64,
    ) -> anyhow::Result<CsvInput> {
        let tsv = files[0]
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("tsv"));
        let delimiter = match delimiter {
            Some(c) if c.is_ascii() => c as u8,
            Some(c) => bail!("--delimiter {c:?}: use a single ASCII character"),
            None if tsv => b'\t',
            None => b',',
        };
        let mut table = TextTable::new(files.to_vec(), shard_size);
        let mut header: Option<Vec<String>> = None;
        let mut kinds: Vec<Inferred> = Vec::new();
        for (file, path) in files.iter().enumerate() {
            let mut records = Records::open(path, None, delimiter)?;
            let names: Vec<String> = records.header.iter().map(str::to_owned).collect();
            match &header {
                None => {
                    kinds = vec![Inferred::default(); names.len()];
                    header = Some(names);
                }
                Some(h) if *h == names => {}
                Some(h) => bail!(
                    "{}: the header {names:?} differs from the first file's {h:?}; convert \
                     files with the same columns together",
                    path.display()
                ),
            }
            while let Some((byte, record)) = records.next_row(table.rows())? {
                table.push(file, byte);
                for (k, cell) in record.iter().enumerate() {
                    kinds[k].add(cell_kind(cell));
                }
            }
        }
        let header = header.expect("at least one input");
        let key = match key {
            Some(k) => Some(header.iter().position(|h| h == k).with_context(|| {
                format!("--key {k:?}: no such column; the columns are {header:?}")
            })?),
            None => None,
        };
        let columns = header
            .iter()
            .zip(kinds)
            .enumerate()
            .filter(|(i, _)| Some(*i) != key)
            .map(|(_, (name, kind))| kind.column(name.clone()))
            .collect();
        Ok(CsvInput {
            table,
            delimiter,
            columns,
            key,
            header,
        })
    }

    fn row(&self, record: &csv::StringRecord, row: u64, path: &Path) -> anyhow::Result<Row> {
        ensure!(
            record.len() == self.header.len(),
            "{}: row {} has {} fields, the header {}",
            path.display(),
            row + 1,
            record.len(),
            self.header.len()
        );
        let key = match self.key {
            Some(k) => record[k].to_owned(),
            None => row_key(row),
        };
        let mut values = Vec::with_capacity(self.columns.len());
        let mut c = 0;
        for (i, cell) in record.iter().enumerate() {
            if Some(i) == self.key {
                continue;
            }
            let kind = self.columns[c].kind;
            c += 1;
            values.push(if cell.is_empty() {
                Value::Missing
            } else {
                match kind {
                    Kind::Int => Value::Int(cell.parse().with_context(|| {
                        format!(
                            "{}: row {}: {cell:?} is not an integer",
                            path.display(),
                            row + 1
                        )
                    })?),
                    Kind::Float => Value::Float(cell.parse().with_context(|| {
                        format!(
                            "{}: row {}: {cell:?} is not a number",
                            path.display(),
                            row + 1
                        )
                    })?),
                    _ => Value::Text(cell.to_owned()),
                }
            });
        }
        Ok(Row { key, values })
    }
}

impl Input for CsvInput {
    fn len(&self) -> u64 {
        self.table.rows()
    }

    fn columns(&self) -> &[Column] {
        &self.columns
    }

    fn read(
        &self,
        range: Range<u64>,
        out: &mut dyn FnMut(Row) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        self.table.read(
            range,
            |path, at| Records::open(path, at, self.delimiter),
            |row, path, _, record| out(self.row(record, row, path)?),
        )
    }
}

/// One CSV file's records, with the bytes where they start.
struct Records {
    reader: csv::Reader<BufReader<File>>,
    record: csv::StringRecord,
    path: PathBuf,
    /// The header row; empty when opened at a record.
    header: csv::StringRecord,
    /// Where the reader was opened: its positions count from there.
    base: u64,
}

impl Records {
    /// Opens `path` at its first record, reading the header row before it (`at` is `None`),
    /// or at byte `at`, where a record starts.
    fn open(path: &Path, at: Option<u64>, delimiter: u8) -> anyhow::Result<Records> {
        let base = at.unwrap_or(0);
        let mut reader = csv::ReaderBuilder::new()
            .delimiter(delimiter)
            .has_headers(at.is_none())
            .from_reader(BufReader::with_capacity(1 << 20, open_at(path, base)?));
        let header = match at {
            None => reader
                .headers()
                .with_context(|| format!("{}: reading the header row", path.display()))?
                .clone(),
            Some(_) => csv::StringRecord::new(),
        };
        Ok(Records {
            reader,
            record: csv::StringRecord::new(),
            path: path.to_owned(),
            header,
            base,
        })
    }
}

impl RowReader for Records {
    type Item<'a> = &'a csv::StringRecord;

    fn next_row(&mut self, row: u64) -> anyhow::Result<Option<(u64, &csv::StringRecord)>> {
        let byte = self.base + self.reader.position().byte();
        let more = self.reader.read_record(&mut self.record).with_context(|| {
            format!(
                "{} at byte {byte}: reading row {}",
                self.path.display(),
                row + 1
            )
        })?;
        Ok(more.then_some((byte, &self.record)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::testing::{columns, rows, write};

    #[test]
    fn columns_take_their_types_from_every_cell() {
        let dir = tempfile::tempdir().unwrap();
        let a = write(dir.path(), "a.csv", "id,n,x,s,e\nk1,1,1,a,\nk2,2,2.5,3,\n");
        let b = write(dir.path(), "b.csv", "id,n,x,s,e\nk3,,1e3,,\n");
        let input = CsvInput::open(&[a, b], None, Some("id"), 2).unwrap();
        let got = columns(&input);
        assert_eq!(
            got,
            [
                ("n", Kind::Float, true),
                ("x", Kind::Float, false),
                ("s", Kind::Text, true),
                ("e", Kind::Text, true),
            ]
        );
        assert_eq!(input.len(), 3);
        assert_eq!(
            rows(&input, 2),
            [
                (
                    "k1".into(),
                    r#"[Float(1.0), Float(1.0), Text("a"), Missing]"#.into()
                ),
                (
                    "k2".into(),
                    r#"[Float(2.0), Float(2.5), Text("3"), Missing]"#.into()
                ),
                (
                    "k3".into(),
                    r#"[Missing, Float(1000.0), Missing, Missing]"#.into()
                ),
            ]
        );
    }

    #[test]
    fn tsv_files_split_at_tabs_and_rows_are_keyed_by_number() {
        let dir = tempfile::tempdir().unwrap();
        let t = write(dir.path(), "t.TSV", "a\tb\n1\tx,y\n");
        let input = CsvInput::open(&[t], None, None, 2).unwrap();
        assert_eq!(
            rows(&input, 2),
            [("000000000".into(), r#"[Int(1), Text("x,y")]"#.into())]
        );
    }

    #[test]
    fn headers_must_match_and_the_key_must_be_a_column() {
        let dir = tempfile::tempdir().unwrap();
        let a = write(dir.path(), "a.csv", "x,y\n1,2\n");
        let b = write(dir.path(), "b.csv", "x,z\n1,2\n");
        let err = CsvInput::open(&[a.clone(), b], None, None, 2).unwrap_err();
        assert!(
            err.to_string().contains("differs from the first file's"),
            "{err}"
        );
        let err = CsvInput::open(std::slice::from_ref(&a), None, Some("id"), 2).unwrap_err();
        assert!(err.to_string().contains("no such column"), "{err}");
        let err = CsvInput::open(&[a], Some('é'), None, 2).unwrap_err();
        assert!(err.to_string().contains("single ASCII character"), "{err}");
    }
}
