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
use chute_core::{ConfigError, DType, EncodedRow, Error, RowData, RowEncoder, Source, Value};

use crate::documents::Documents;
use crate::text_files::TextFile;

/// Gets a row, its file's name, `line` or `row`, its number, and where it starts (a byte
/// offset, or the row's number).
type RowFn<'a> = dyn FnMut(RowData, &str, &'static str, u64, u64) -> Result<(), Error> + 'a;

/// Gets a kept row's ids and labels.
pub type EncodedFn<'a> = dyn FnMut(&[u32], &[i64]) -> Result<(), Error> + 'a;

/// Where a row is: its file, `line` or `row`, its number, its byte offset (or number).
type Place = (Arc<str>, &'static str, u64, u64);

/// Rows handed to the encoder at once.
const CHUNK: usize = 4096;

/// What the rows of a source became, counted (the packed source's manifest holds them:
/// `chat_rows`, `chat_kept`, `chat_truncated`, `chat_split`, `chat_documents`,
/// `chat_skipped_<why>`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RowCounts {
    /// Rows read.
    pub rows: u64,
    /// Rows kept.
    pub kept: u64,
    /// Kept rows cut to the maximum length.
    pub truncated: u64,
    /// Rows split into several (each part counted in `kept` once per row).
    pub split: u64,
    /// The documents made of the kept rows (a split row makes several).
    pub documents: u64,
    /// Rows left out, by reason.
    pub skipped: Vec<(&'static str, u64)>,
}

/// Calls `each` with every row of `files` (a JSON Lines line, or a record of `fields`) and
/// where it is, in order.
fn read_rows(
    files: &mut dyn Iterator<Item = Result<TextFile, Error>>,
    fields: &[String],
    each: &mut RowFn<'_>,
) -> Result<(), Error> {
    for file in files {
        match file? {
            TextFile::JsonLines { name, data } => {
                let mut offset = 0usize;
                for (i, line) in data.split(|&b| b == b'\n').enumerate() {
                    let at = offset;
                    offset += line.len() + 1;
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    let row = RowData::Json(data.slice(at..at + line.len()));
                    each(row, &name, "line", i as u64 + 1, at as u64)?;
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
                    each(
                        RowData::Record(Value::Record(k.into(), v)),
                        &name,
                        "row",
                        row,
                        row,
                    )?;
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
    let mut chunk: Vec<RowData> = Vec::with_capacity(CHUNK);
    let mut places: Vec<Place> = Vec::with_capacity(CHUNK);
    let mut flush = |chunk: &mut Vec<RowData>,
                     places: &mut Vec<Place>,
                     counts: &mut RowCounts|
     -> Result<(), Error> {
        if chunk.is_empty() {
            return Ok(());
        }
        let out = encoder.encode_rows(chunk);
        for (result, (file, what, at, offset)) in out.into_iter().zip(places.iter()) {
            counts.rows += 1;
            match result {
                Ok(EncodedRow::Kept {
                    ids,
                    labels,
                    truncated,
                }) => {
                    counts.kept += 1;
                    counts.documents += 1;
                    counts.truncated += u64::from(truncated);
                    each(&ids, &labels)?;
                }
                Ok(EncodedRow::Split(parts)) => {
                    counts.kept += 1;
                    counts.split += 1;
                    for (ids, labels) in &parts {
                        counts.documents += 1;
                        each(ids, labels)?;
                    }
                }
                Ok(EncodedRow::Skipped(why)) => {
                    match counts.skipped.iter_mut().find(|(w, _)| *w == why) {
                        Some((_, n)) => *n += 1,
                        None => counts.skipped.push((why, 1)),
                    }
                }
                Err(e) => {
                    return Err(Error::corrupt(
                        &**file,
                        *offset,
                        format!("{what} {at}: {e}"),
                    ));
                }
            }
        }
        chunk.clear();
        places.clear();
        Ok(())
    };
    let mut name: Arc<str> = Arc::from("");
    read_rows(files, &fields, &mut |row, file, what, at, offset| {
        chunk.push(row);
        if &*name != file {
            name = Arc::from(file);
        }
        places.push((Arc::clone(&name), what, at, offset));
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
        crate::text_files::append_ids(&mut data, ids, dtype);
        let at = labels.len();
        labels.resize(at + l.len() * 8, 0);
        for (i, (out, x)) in labels[at..].chunks_exact_mut(8).zip(l).enumerate() {
            let x = if i == 0 { -100 } else { *x };
            out.copy_from_slice(&x.to_le_bytes());
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
