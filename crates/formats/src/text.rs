//! Documents' text, read in order from the files that hold it: JSON Lines (`.jsonl`,
//! `.ndjson`, `.json`: one object a line, the text under a key), the rows of Parquet or Arrow
//! files and the samples of WebDataset tar shards or TFRecord files (a string or bytes field:
//! a column, a tar member's extension such as `txt`, a feature), or whole text files (any
//! other name: one document each). Paths or URLs (a URL is downloaded whole, through the
//! node cache when one is set).
//!
//! [`read_texts`] is what `chute tokenize` reads; [`tokenize`] is what the one opener calls for
//! a text source with a tokenizer: every document tokenized when opened, on the encoder's
//! threads, into [`Documents`] in memory, so packing knows the epoch's rows up front.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use chute_core::{ConfigError, DType, Error, Field, TextEncoder};

use crate::{Format, OpenOptions, documents::Documents};

/// Documents handed to the encoder at once.
const CHUNK: usize = 16_384;

/// Whether `path` is read as JSON Lines.
fn is_json_lines(path: &Path) -> bool {
    let name = path.to_string_lossy();
    let name = name.split(['?', '#']).next().unwrap_or_default();
    [".jsonl", ".ndjson", ".json"]
        .iter()
        .any(|e| name.ends_with(e))
}

/// Calls `each` with every document's text of `files` in order (see the module
/// documentation), `field` naming the JSON key, column, tar member extension or feature that
/// holds it; stops when `each` returns `false`. A line that is not a JSON object, a document
/// without `field` or whose text is not UTF-8 is an error naming the file and the line or row.
pub fn read_texts(
    files: &[PathBuf],
    field: &str,
    each: &mut dyn FnMut(String) -> Result<bool, Error>,
) -> Result<(), Error> {
    for file in files {
        let name = file.display().to_string();
        if is_json_lines(file) {
            let (_, data) = crate::open_whole(std::slice::from_ref(file), false)?
                .pop()
                .expect("one file");
            if !json_lines(&name, &data, field, each)? {
                return Ok(());
            }
            continue;
        }
        match Format::from_path(file) {
            Some(
                format @ (Format::Parquet | Format::Arrow | Format::WebDataset | Format::TfRecord),
            ) => {
                let options = OpenOptions {
                    format: Some(format),
                    columns: Some(vec![field.to_string()]),
                    ..Default::default()
                };
                let source = crate::open(std::slice::from_ref(file), &options)?;
                let n = source.manifest().total_samples();
                for row in 0..n {
                    let sample = source.read(row)?;
                    let text = match sample.get(field) {
                        Some(Field::Text(b) | Field::Bytes(b)) => utf8(&name, "row", row, b)?,
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
                            return Err(missing(&name, "row", row, field, &has.join(", ")));
                        }
                    };
                    if !each(text)? {
                        return Ok(());
                    }
                }
            }
            _ => {
                let (_, data) = crate::open_whole(std::slice::from_ref(file), false)?
                    .pop()
                    .expect("one file");
                if !each(utf8(&name, "file", 0, &data)?)? {
                    return Ok(());
                }
            }
        }
    }
    Ok(())
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
/// `uint32`. Their manifest's fingerprint covers the files' names, `field` and the encoder's
/// fingerprint.
pub fn tokenize(
    files: &[PathBuf],
    field: &str,
    encoder: &dyn TextEncoder,
) -> Result<Documents, Error> {
    if files.is_empty() {
        return Err(ConfigError::new("paths", "no text files given").into());
    }
    let dtype = if encoder.vocab_size() <= 1 << 16 {
        DType::U16
    } else {
        DType::U32
    };
    let name = files
        .iter()
        .map(|f| f.display().to_string())
        .collect::<Vec<_>>()
        .join(",");
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
            match dtype {
                DType::U16 => data.extend(doc.iter().flat_map(|&t| (t as u16).to_le_bytes())),
                _ => data.extend(doc.iter().flat_map(|&t| t.to_le_bytes())),
            }
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

    #[test]
    fn json_lines_and_text_files_are_read_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.jsonl");
        std::fs::write(
            &a,
            "{\"text\": \"one\"}\n\n{\"text\": \"zwei \\u00fc\", \"n\": 2}\n",
        )
        .unwrap();
        let b = dir.path().join("b.txt");
        std::fs::write(&b, "three\nlines\n").unwrap();
        let files = vec![a.clone(), b];
        let mut got = Vec::new();
        read_texts(&files, "text", &mut |t| {
            got.push(t);
            Ok(true)
        })
        .unwrap();
        assert_eq!(got, ["one", "zwei ü", "three\nlines\n"]);
        let docs = tokenize(&files, "text", &Bytewise).unwrap();
        assert_eq!(docs.len(), 3);
        assert_eq!(docs.doc_len(1), "zwei ü".len() as u64);
        assert_eq!(docs.dtype(), DType::U16);
        // Stopping early reads no further.
        let mut n = 0;
        read_texts(&files, "text", &mut |_| {
            n += 1;
            Ok(false)
        })
        .unwrap();
        assert_eq!(n, 1);
        std::fs::write(&a, "{\"text\": \"one\"}\n[1, 2]\n").unwrap();
        let e = tokenize(&files, "text", &Bytewise).unwrap_err().to_string();
        assert!(e.contains("a.jsonl line 2: no \"text\""), "{e}");
        std::fs::write(&a, "{\"text\": 3}\n").unwrap();
        let e = tokenize(&files, "text", &Bytewise).unwrap_err().to_string();
        assert!(e.contains("holds 3, not a string"), "{e}");
        std::fs::write(&a, b"{\"text\": \"ok\"}\n{\"text\": \"\xff\"}\n").unwrap();
        let e = tokenize(&files, "text", &Bytewise).unwrap_err().to_string();
        assert!(e.contains("line 2 is not a JSON object"), "{e}");
    }
}
