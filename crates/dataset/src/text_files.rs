//! Documents' text, read in order from the files that hold it: JSON Lines (`.jsonl`,
//! `.ndjson`, `.json`: one object a line, the text under a key), the rows of Parquet or Arrow
//! files and the samples of WebDataset tar shards or TFRecord files (a string or bytes field:
//! a column, a tar member's extension such as `txt`, a feature), or whole text files (any
//! other name: one document each). Paths or URLs (a URL is downloaded whole, through the
//! node cache when one is set).
//!
//! The opener decides what each file is and hands it over as a [`TextFile`]
//! ([`crate::open_texts`]). [`read_texts`] is what `chute tokenize` reads; [`tokenize`]
//! is what the opener calls for a text source with a tokenizer: every document tokenized when
//! opened, on the encoder's threads, into [`Documents`] in memory, so packing knows the
//! epoch's rows up front.

use std::sync::Arc;

use bytes::Bytes;
use chute_core::{ConfigError, DType, Error, Field, Source, TextEncoder};

use crate::documents::Documents;

/// Documents handed to the encoder at once.
const CHUNK: usize = 16_384;

/// One file of text, as the opener hands it over ([`crate::open_texts`]).
pub enum TextFile {
    /// JSON Lines: one object a line, the text under the field.
    JsonLines {
        /// The file's path or URL.
        name: String,
        /// Its bytes.
        data: Bytes,
    },
    /// The rows of a Parquet or Arrow file, or the samples of a tar shard or TFRecord file,
    /// opened with the text field as their only column.
    Records {
        /// The file's path or URL.
        name: String,
        /// The file opened as a source.
        source: Arc<dyn Source>,
    },
    /// A whole text file: one document.
    Whole {
        /// The file's path or URL.
        name: String,
        /// Its bytes.
        data: Bytes,
    },
}

impl std::fmt::Debug for TextFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (kind, name) = match self {
            TextFile::JsonLines { name, .. } => ("JsonLines", name),
            TextFile::Records { name, .. } => ("Records", name),
            TextFile::Whole { name, .. } => ("Whole", name),
        };
        f.debug_tuple(kind).field(name).finish()
    }
}

/// Calls `each` with every document's text of `files` in order (see the module
/// documentation), `field` naming the JSON key, column, tar member extension or feature that
/// holds it; stops when `each` returns `false`. A line that is not a JSON object, a document
/// without `field` or whose text is not UTF-8 is an error naming the file and the line or row.
pub fn read_texts(
    files: &mut dyn Iterator<Item = Result<TextFile, Error>>,
    field: &str,
    each: &mut dyn FnMut(String) -> Result<bool, Error>,
) -> Result<(), Error> {
    for file in files {
        let more = match file? {
            TextFile::JsonLines { name, data } => json_lines(&name, &data, field, each)?,
            TextFile::Records { name, source } => records(&name, source.as_ref(), field, each)?,
            TextFile::Whole { name, data } => each(utf8(&name, "file", 0, &data)?)?,
        };
        if !more {
            return Ok(());
        }
    }
    Ok(())
}

/// The documents of one file's rows or samples; `false` when `each` asked to stop.
fn records(
    name: &str,
    source: &dyn Source,
    field: &str,
    each: &mut dyn FnMut(String) -> Result<bool, Error>,
) -> Result<bool, Error> {
    for row in 0..source.manifest().total_samples() {
        let sample = source.read(row)?;
        let text = match sample.get(field) {
            Some(Field::Text(b) | Field::Bytes(b)) => utf8(name, "row", row, b)?,
            Some(other) => {
                return Err(ConfigError::new(
                    "text_field",
                    format!(
                        "{name} row {row}: {field:?} holds {}, not text",
                        other.describe()
                    ),
                )
                .into());
            }
            None => {
                let has: Vec<&str> = sample.fields.iter().map(|(n, _)| &**n).collect();
                return Err(missing(name, "row", row, field, &has.join(", ")));
            }
        };
        if !each(text)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The documents of one JSON Lines file; `false` when `each` asked to stop.
fn json_lines(
    name: &str,
    data: &[u8],
    field: &str,
    each: &mut dyn FnMut(String) -> Result<bool, Error>,
) -> Result<bool, Error> {
    let mut offset = 0u64;
    for (i, line) in data.split(|&b| b == b'\n').enumerate() {
        let at = offset;
        offset += line.len() as u64 + 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let line_no = i as u64 + 1;
        let value: serde_json::Value = serde_json::from_slice(line).map_err(|e| {
            Error::corrupt(
                name,
                at,
                format!("line {line_no} is not a JSON object ({e}); JSON Lines hold one a line"),
            )
        })?;
        let text = match value.get(field) {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(ConfigError::new(
                    "text_field",
                    format!("{name} line {line_no}: {field:?} holds {other}, not a string"),
                )
                .into());
            }
            None => {
                let keys = match &value {
                    serde_json::Value::Object(m) => {
                        m.keys().cloned().collect::<Vec<_>>().join(", ")
                    }
                    _ => "none".to_string(),
                };
                return Err(missing(name, "line", line_no, field, &keys));
            }
        };
        if !each(text)? {
            return Ok(false);
        }
    }
    Ok(true)
}

fn utf8(name: &str, what: &str, at: u64, bytes: &[u8]) -> Result<String, Error> {
    String::from_utf8(bytes.to_vec()).map_err(|e| {
        Error::corrupt(
            name,
            at,
            format!(
                "{what} {at}: the text is not UTF-8 (byte {} of it)",
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

fn missing(name: &str, what: &str, at: u64, field: &str, has: &str) -> Error {
    ConfigError::new(
        "text_field",
        format!(
            "{name} {what} {at}: no {field:?} (it has: {has}); name the field holding the text \
             (text_field=, --text-field)"
        ),
    )
    .into()
}

/// Every document of `files` (see [`read_texts`]) tokenized by `encoder`, a chunk of
/// documents at a time, into documents in memory: `uint16` ids when the vocabulary fits, else
/// `uint32`. Their manifest's fingerprint covers `name` (the files' names), `field` and the
/// encoder's fingerprint.
pub fn tokenize(
    name: String,
    files: &mut dyn Iterator<Item = Result<TextFile, Error>>,
    field: &str,
    encoder: &dyn TextEncoder,
) -> Result<Documents, Error> {
    let dtype = if encoder.vocab_size() <= 1 << 16 {
        DType::U16
    } else {
        DType::U32
    };
    let mut data: Vec<u8> = Vec::new();
    let mut starts = vec![0u64];
    let mut chunk: Vec<String> = Vec::with_capacity(CHUNK);
    let flush = |chunk: &mut Vec<String>, data: &mut Vec<u8>, starts: &mut Vec<u64>| {
        if chunk.is_empty() {
            return Ok(());
        }
        let first = starts.len() as u64 - 1;
        let ids = encoder.encode_batch(chunk).map_err(|e| {
            Error::corrupt(
                name.as_str(),
                first,
                format!("tokenizing documents {first}.. failed: {e}"),
            )
        })?;
        for doc in &ids {
            append_ids(data, doc, dtype);
            starts.push((data.len() / dtype.size()) as u64);
        }
        chunk.clear();
        Ok::<(), Error>(())
    };
    read_texts(files, field, &mut |text| {
        chunk.push(text);
        if chunk.len() == CHUNK {
            flush(&mut chunk, &mut data, &mut starts)?;
        }
        Ok(true)
    })?;
    flush(&mut chunk, &mut data, &mut starts)?;
    Ok(Documents::in_memory(
        Bytes::from(data),
        name,
        starts,
        dtype,
        format!("text:{field}:{}", encoder.fingerprint()),
    ))
}

/// `ids` appended to `data` as `dtype` (uint16 or uint32), little-endian.
pub(crate) fn append_ids(data: &mut Vec<u8>, ids: &[u32], dtype: DType) {
    let at = data.len();
    data.resize(at + ids.len() * dtype.size(), 0);
    if dtype == DType::U16 {
        for (out, &t) in data[at..].chunks_exact_mut(2).zip(ids) {
            out.copy_from_slice(&(t as u16).to_le_bytes());
        }
    } else {
        for (out, &t) in data[at..].chunks_exact_mut(4).zip(ids) {
            out.copy_from_slice(&t.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids are the texts' bytes (a stand-in for a tokenizer: this tests the reading and the
    /// document bounds; the real tokenizer's ids are tested against its Python package).
    #[derive(Debug)]
    struct Bytewise;

    impl TextEncoder for Bytewise {
        fn encode_batch(&self, texts: &[String]) -> Result<Vec<Vec<u32>>, String> {
            Ok(texts
                .iter()
                .map(|t| t.bytes().map(u32::from).collect())
                .collect())
        }
        fn vocab_size(&self) -> usize {
            256
        }
        fn fingerprint(&self) -> String {
            "bytes".into()
        }
    }

    fn json(text: &[u8]) -> TextFile {
        TextFile::JsonLines {
            name: "a.jsonl".into(),
            data: Bytes::copy_from_slice(text),
        }
    }

    fn docs(a: &[u8]) -> Result<Documents, Error> {
        let files = [
            json(a),
            TextFile::Whole {
                name: "b.txt".into(),
                data: Bytes::new(),
            },
        ];
        tokenize(
            "a,b".into(),
            &mut files.into_iter().map(Ok),
            "text",
            &Bytewise,
        )
    }

    #[test]
    fn json_lines_and_text_files_are_read_in_order() {
        let a = "{\"text\": \"one\"}\n\n{\"text\": \"zwei \\u00fc\", \"n\": 2}\n".as_bytes();
        let files = || {
            [
                json(a),
                TextFile::Whole {
                    name: "b.txt".into(),
                    data: Bytes::from_static(b"three\nlines\n"),
                },
            ]
            .into_iter()
            .map(Ok)
        };
        let mut got = Vec::new();
        read_texts(&mut files(), "text", &mut |t| {
            got.push(t);
            Ok(true)
        })
        .unwrap();
        assert_eq!(got, ["one", "zwei ü", "three\nlines\n"]);
        let docs = tokenize("a,b".into(), &mut files(), "text", &Bytewise).unwrap();
        assert_eq!(docs.len(), 3);
        assert_eq!(docs.doc_len(1), "zwei ü".len() as u64);
        assert_eq!(docs.dtype(), DType::U16);
        // Stopping early reads no further.
        let mut n = 0;
        read_texts(&mut files(), "text", &mut |_| {
            n += 1;
            Ok(false)
        })
        .unwrap();
        assert_eq!(n, 1);
        let e = docs_err(b"{\"text\": \"one\"}\n[1, 2]\n");
        assert!(e.contains("a.jsonl line 2: no \"text\""), "{e}");
        let e = docs_err(b"{\"text\": 3}\n");
        assert!(e.contains("holds 3, not a string"), "{e}");
        let e = docs_err(b"{\"text\": \"ok\"}\n{\"text\": \"\xff\"}\n");
        assert!(e.contains("line 2 is not a JSON object"), "{e}");
    }

    fn docs_err(a: &[u8]) -> String {
        docs(a).unwrap_err().to_string()
    }
}
