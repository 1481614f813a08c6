//! JSON Lines input: one JSON object per non-blank line; a line is a sample, its keys the fields.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::bail;

use super::infer::{Column, Inferred, Kind, Value, json_kind};
use super::table::{RowReader, TextTable, open_at};
use super::{Input, Row, row_key};

type Object = serde_json::Map<String, serde_json::Value>;

/// JSON Lines files, read as one table: one object per non-blank line.
#[derive(Debug)]
pub(super) struct JsonlInput {
    table: TextTable,
    columns: Vec<Column>,
    key: Option<String>,
}

impl JsonlInput {
    /// The first pass over `files`: their rows, and the columns in the order first met (a
    /// line's keys in sorted order: serde_json's maps keep them sorted), typed by every value.
    /// `key` names the key that holds each sample's key.
    pub(super) fn open(
        files: &[PathBuf],
        key: Option<&str>,
        shard_size: u64,
    ) -> anyhow::Result<JsonlInput> {
        let mut table = TextTable::new(files.to_vec(), shard_size);
        let mut names: Vec<String> = Vec::new();
        let mut kinds: Vec<Inferred> = Vec::new();
        // Per column: whether the current row has it.
        let mut seen: Vec<bool> = Vec::new();
        for (file, path) in files.iter().enumerate() {
            let mut lines = Lines::open(path, 0)?;
            while let Some((byte, line)) = lines.next_row(table.rows())? {
                let object = parse_object(path, byte, line)?;
                seen.iter_mut().for_each(|s| *s = false);
                for (name, v) in &object {
                    if key == Some(name.as_str()) {
                        continue;
                    }
                    let i = names.iter().position(|n| n == name).unwrap_or_else(|| {
                        let mut kind = Inferred::default();
                        if table.rows() > 0 {
                            kind.add(None); // the rows before this one lack it
                        }
                        names.push(name.clone());
                        kinds.push(kind);
                        seen.push(false);
                        names.len() - 1
                    });
                    seen[i] = true;
                    kinds[i].add(json_kind(v));
                }
                for (kind, _) in kinds.iter_mut().zip(&seen).filter(|(_, s)| !**s) {
                    kind.add(None);
                }
                table.push(file, byte);
            }
        }
        let columns = names
            .into_iter()
            .zip(kinds)
            .map(|(name, kind)| kind.column(name))
            .collect();
        Ok(JsonlInput {
            table,
            columns,
            key: key.map(str::to_owned),
        })
    }

    fn row(&self, mut object: Object, row: u64, path: &Path, byte: u64) -> anyhow::Result<Row> {
        use serde_json::Value as J;
        let key = match &self.key {
            Some(k) => match object.remove(k) {
                Some(J::String(s)) => s,
                Some(J::Number(n)) => n.to_string(),
                _ => bail!(
                    "{} at byte {byte}: the line has no string or number {k:?} for --key",
                    path.display()
                ),
            },
            None => row_key(row),
        };
        let values = self
            .columns
            .iter()
            .map(|c| {
                let v = object.remove(&c.name).unwrap_or(J::Null);
                match (c.kind, v) {
                    (_, J::Null) => Value::Missing,
                    (Kind::Int, J::Bool(b)) => Value::Int(i64::from(b)),
                    (Kind::Int, J::Number(n)) => Value::Int(n.as_i64().unwrap_or_default()),
                    (Kind::Float, J::Bool(b)) => Value::Float(f64::from(u8::from(b))),
                    (Kind::Float, J::Number(n)) => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
                    (Kind::Text, J::String(s)) => Value::Text(s),
                    (Kind::Text, J::Number(n)) => Value::Text(n.to_string()),
                    (Kind::List { float: true, .. }, J::Array(items)) => Value::List(
                        items
                            .iter()
                            .map(|x| x.as_f64().unwrap_or(f64::NAN))
                            .collect(),
                        Vec::new(),
                    ),
                    (Kind::List { float: false, .. }, J::Array(items)) => Value::List(
                        Vec::new(),
                        items
                            .iter()
                            .map(|x| x.as_i64().unwrap_or_default())
                            .collect(),
                    ),
                    (_, other) => Value::Json(other.to_string()),
                }
            })
            .collect();
        Ok(Row { key, values })
    }
}

impl Input for JsonlInput {
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
            |path, at| Lines::open(path, at.unwrap_or(0)),
            |row, path, byte, line| {
                let object = parse_object(path, byte, line)?;
                out(self.row(object, row, path, byte)?)
            },
        )
    }
}

fn parse_object(path: &Path, byte: u64, line: &[u8]) -> anyhow::Result<Object> {
    match serde_json::from_slice::<serde_json::Value>(line) {
        Ok(serde_json::Value::Object(o)) => Ok(o),
        Ok(other) => bail!(
            "{} at byte {byte}: the line is JSON but not an object ({}); JSON Lines input \
             needs one object per line",
            path.display(),
            json_type(&other)
        ),
        Err(e) => bail!(
            "{} at byte {byte}: not JSON ({e}); JSON Lines input needs one object per line",
            path.display()
        ),
    }
}

fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Non-blank lines of a file with their byte offsets.
struct Lines {
    reader: BufReader<File>,
    byte: u64,
    buf: Vec<u8>,
}

impl Lines {
    fn open(path: &Path, byte: u64) -> anyhow::Result<Lines> {
        let file = open_at(path, byte)?;
        Ok(Lines {
            reader: BufReader::with_capacity(1 << 20, file),
            byte,
            buf: Vec::new(),
        })
    }
}

impl RowReader for Lines {
    /// The line, without its end of line.
    type Item<'a> = &'a [u8];

    fn next_row(&mut self, _row: u64) -> anyhow::Result<Option<(u64, &[u8])>> {
        loop {
            self.buf.clear();
            let start = self.byte;
            let n = self.reader.read_until(b'\n', &mut self.buf)?;
            if n == 0 {
                return Ok(None);
            }
            self.byte += n as u64;
            if !self.buf.iter().all(u8::is_ascii_whitespace) {
                return Ok(Some((start, &self.buf)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::testing::{columns, rows, write};

    #[test]
    fn columns_in_the_order_met_typed_by_every_value() {
        let dir = tempfile::tempdir().unwrap();
        let a = write(
            dir.path(),
            "a.jsonl",
            "{\"id\": \"x\", \"n\": 1, \"l\": [1, 2]}\n\n  \n{\"id\": 7, \"n\": 2.5, \"b\": true}\n",
        );
        let b = write(
            dir.path(),
            "b.jsonl",
            "{\"id\": \"z\", \"n\": null, \"l\": [1, 2.5], \"o\": {\"k\": 1}}\n",
        );
        let input = JsonlInput::open(&[a, b], Some("id"), 2).unwrap();
        let got = columns(&input);
        let list = Kind::List {
            float: true,
            len: Some(2),
        };
        assert_eq!(
            got,
            [
                ("l", list, true),
                ("n", Kind::Float, true),
                // Whole numbers (a boolean here) that some row lacks: floats.
                ("b", Kind::Float, true),
                ("o", Kind::Json, true),
            ]
        );
        assert_eq!(input.len(), 3);
        assert_eq!(
            rows(&input, 2),
            [
                (
                    "x".into(),
                    "[List([1.0, 2.0], []), Float(1.0), Missing, Missing]".into()
                ),
                (
                    "7".into(),
                    "[Missing, Float(2.5), Float(1.0), Missing]".into()
                ),
                (
                    "z".into(),
                    r#"[List([1.0, 2.5], []), Missing, Missing, Json("{\"k\":1}")]"#.into()
                ),
            ]
        );
    }

    #[test]
    fn lines_must_be_objects_and_hold_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let a = write(dir.path(), "a.jsonl", "{\"a\": 1}\n[1]\n");
        let err = JsonlInput::open(&[a], None, 2).unwrap_err();
        assert!(
            err.to_string()
                .contains("at byte 9: the line is JSON but not an object (an array)"),
            "{err}"
        );
        let b = write(
            dir.path(),
            "b.jsonl",
            "{\"a\": 1}\n{\"a\": 2, \"k\": \"x\"}\n",
        );
        let input = JsonlInput::open(&[b], Some("k"), 2).unwrap();
        let err = input.read(0..2, &mut |_| Ok(())).unwrap_err();
        assert!(
            err.to_string()
                .contains("at byte 0: the line has no string"),
            "{err}"
        );
    }
}
