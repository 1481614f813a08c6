//! Rows of records encoded into token documents with labels when a source is opened: chat
//! conversations (a `messages` column), prompts and completions, instruction records, read
//! from JSON Lines, Parquet, Arrow (Hugging Face datasets) or WebDataset / TFRecord files,
//! and turned into ids and labels by a [`RowEncoder`] (the facade's chat templates) on its
//! threads.
//!
//! JSON Lines are read as `json.loads` reads them (a field missing from a line is missing
//! from its record); columnar files whole-record (`structs = record`), so a `messages`
//! column is a list of dicts.

use std::sync::Arc;

use bytes::Bytes;
use chute_core::{ConfigError, DType, EncodedRow, Error, RowEncoder, Source, Value};

use crate::documents::Documents;
use crate::text_files::TextFile;

/// Gets a row, its file's name, `line` or `row`, and its number.
type RowFn<'a> = dyn FnMut(Value, &str, &'static str, u64) -> Result<(), Error> + 'a;

/// Gets a kept row's ids and labels.
pub type EncodedFn<'a> = dyn FnMut(&[u32], &[i64]) -> Result<(), Error> + 'a;

/// Rows handed to the encoder at once.
const CHUNK: usize = 4096;

/// What the rows of a source became, counted (the packed source's manifest holds them:
/// `chat_rows`, `chat_kept`, `chat_truncated`, `chat_skipped_<why>`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RowCounts {
    /// Rows read.
    pub rows: u64,
    /// Rows kept.
    pub kept: u64,
    /// Kept rows cut to the maximum length.
    pub truncated: u64,
    /// Rows left out, by reason.
    pub skipped: Vec<(&'static str, u64)>,
}

/// The record of `wanted` fields of a JSON object (those it has).
fn pick(object: &Value, wanted: &[String]) -> Option<Value> {
    let Value::Record(keys, values) = object else {
        return None;
    };
    let mut k: Vec<Arc<str>> = Vec::new();
    let mut v = Vec::new();
    for w in wanted {
        if let Some(i) = keys.iter().position(|key| &**key == w.as_str()) {
            k.push(Arc::clone(&keys[i]));
            v.push(values[i].clone());
        }
    }
    Some(Value::Record(k.into(), v))
}

/// Calls `each` with every row of `files` (a record of `fields`) and where it is (file name,
/// `line` or `row`, its number), in order.
fn read_rows(
    files: &mut dyn Iterator<Item = Result<TextFile, Error>>,
    fields: &[String],
    each: &mut RowFn<'_>,
) -> Result<(), Error> {
    for file in files {
        match file? {
            TextFile::JsonLines { name, data } => {
                let mut offset = 0u64;
                for (i, line) in data.split(|&b| b == b'\n').enumerate() {
                    let at = offset;
                    offset += line.len() as u64 + 1;
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    let line_no = i as u64 + 1;
                    let value = Value::from_json(line).map_err(|e| {
                        Error::corrupt(
                            name.as_str(),
                            at,
                            format!("line {line_no} is not JSON ({e}); JSON Lines hold one object a line"),
                        )
                    })?;
                    let Some(row) = pick(&value, fields) else {
                        return Err(Error::corrupt(
                            name.as_str(),
                            at,
                            format!("line {line_no} is {}, not a JSON object", value.describe()),
                        ));
                    };
                    each(row, &name, "line", line_no)?;
                }
            }
            TextFile::Records { name, source } => {
                for row in 0..source.manifest().total_samples() {
                    let sample = source.read(row)?;
                    let mut k: Vec<Arc<str>> = Vec::new();
                    let mut v = Vec::new();
                    for f in fields {
                        if let Some(field) = sample.get(f) {
                            k.push(Arc::from(f.as_str()));
                            v.push(field.to_value());
                        }
                    }
                    each(Value::Record(k.into(), v), &name, "row", row)?;
                }
            }
            TextFile::Whole { name, .. } => {
                return Err(ConfigError::new(
                    "chat",
                    format!(
                        "{name}: a text file holds no records; conversations come from JSON \
                         Lines, Parquet, Arrow, Hugging Face datasets, tar or TFRecord files"
                    ),
                )
                .into());
            }
        }
    }
    Ok(())
}

/// Every row of `files` encoded by `encoder`, in order, a chunk of rows at a time: `each`
/// gets each kept row's ids and labels. Returns the counts of what the rows became. A row the
/// encoder refuses is an error naming its file and line or row.
pub fn encode_each(
    files: &mut dyn Iterator<Item = Result<TextFile, Error>>,
    encoder: &dyn RowEncoder,
    each: &mut EncodedFn<'_>,
) -> Result<RowCounts, Error> {
    let fields = encoder.fields();
    let mut counts = RowCounts::default();
    let mut chunk: Vec<Value> = Vec::with_capacity(CHUNK);
    let mut places: Vec<(String, &'static str, u64)> = Vec::with_capacity(CHUNK);
    let mut flush = |chunk: &mut Vec<Value>,
                     places: &mut Vec<(String, &'static str, u64)>,
                     counts: &mut RowCounts|
     -> Result<(), Error> {
        if chunk.is_empty() {
            return Ok(());
        }
        let out = encoder.encode_rows(chunk);
        for (result, (file, what, at)) in out.into_iter().zip(places.iter()) {
            counts.rows += 1;
            match result {
                Ok(EncodedRow::Kept {
                    ids,
                    labels,
                    truncated,
                }) => {
                    counts.kept += 1;
                    counts.truncated += u64::from(truncated);
                    each(&ids, &labels)?;
                }
                Ok(EncodedRow::Skipped(why)) => {
                    match counts.skipped.iter_mut().find(|(w, _)| *w == why) {
                        Some((_, n)) => *n += 1,
                        None => counts.skipped.push((why, 1)),
                    }
                }
                Err(e) => {
                    return Err(Error::corrupt(
                        file.as_str(),
                        *at,
                        format!("{what} {at}: {e}"),
                    ));
                }
            }
        }
        chunk.clear();
        places.clear();
        Ok(())
    };
    read_rows(files, &fields, &mut |row, file, what, at| {
        chunk.push(row);
        places.push((file.to_string(), what, at));
        if chunk.len() == CHUNK {
            flush(&mut chunk, &mut places, &mut counts)?;
        }
        Ok(())
    })?;
    flush(&mut chunk, &mut places, &mut counts)?;
    Ok(counts)
}

/// Every row of `files` encoded by `encoder` ([`encode_each`]) into documents with labels
/// (`uint16` ids when the vocabulary fits, else `uint32`), and the counts of what the rows
/// became. A document's first label is -100, so no label crosses from one document to the
/// next when they are packed (what `DataCollatorWithFlattening` does).
pub fn encode_rows(
    name: String,
    files: &mut dyn Iterator<Item = Result<TextFile, Error>>,
    encoder: &dyn RowEncoder,
) -> Result<(Documents, RowCounts), Error> {
    let dtype = if encoder.vocab_size() <= 1 << 16 {
        DType::U16
    } else {
        DType::U32
    };
    let mut data: Vec<u8> = Vec::new();
    let mut labels: Vec<u8> = Vec::new();
    let mut starts = vec![0u64];
    let counts = encode_each(files, encoder, &mut |ids, l| {
        match dtype {
            DType::U16 => data.extend(ids.iter().flat_map(|&t| (t as u16).to_le_bytes())),
            _ => data.extend(ids.iter().flat_map(|&t| t.to_le_bytes())),
        }
        for (i, x) in l.iter().enumerate() {
            let x = if i == 0 { -100 } else { *x };
            labels.extend(x.to_le_bytes());
        }
        starts.push((data.len() / dtype.size()) as u64);
        Ok(())
    })?;
    if counts.kept == 0 {
        let why: Vec<String> = counts
            .skipped
            .iter()
            .map(|(w, n)| format!("{n} {w}"))
            .collect();
        return Err(ConfigError::new(
            "chat",
            format!(
                "{name}: none of its {} rows is left to train on ({})",
                counts.rows,
                if why.is_empty() {
                    "no rows".to_string()
                } else {
                    why.join(", ")
                }
            ),
        )
        .into());
    }
    let docs = Documents::in_memory(
        Bytes::from(data),
        name,
        starts,
        dtype,
        format!("rows:{}", encoder.fingerprint()),
    )
    .with_labels(Bytes::from(labels));
    Ok((docs, counts))
}
