//! Files named instead of held: a field whose value is a path or URL (a manifest's `path`
//! column, a Hugging Face `Image` or `Audio` cell of a file left where it is) is read when a
//! decode op runs, on the worker thread that decodes it.
//!
//! A value is taken as a reference when it could not be an encoded file (every audio and
//! image format starts with bytes that are not printable text): at most 4,096 bytes of UTF-8
//! with no control characters, with a `/` (or `\\`) or a file extension, or naming a file that
//! exists: a URL (`scheme://...`: HTTP(S), S3, GCS, Azure, through the reader the facade
//! installs, [`chute_core::files`]) or a local path. Relative paths are relative to the
//! working directory (as `datasets` and `open()` take them). A file that cannot be read is
//! the sample's error, naming the path.

use bytes::Bytes;

use crate::OpError;

/// The longest reference.
const MAX_REFERENCE: usize = 4096;

/// The path or URL `value` names, if it is a reference (see the module docs).
pub(crate) fn reference(value: &[u8]) -> Option<&str> {
    if value.is_empty() || value.len() > MAX_REFERENCE {
        return None;
    }
    let text = std::str::from_utf8(value).ok()?;
    if text.chars().any(char::is_control) {
        return None;
    }
    // A path names a folder, a URL or a file with an extension (or one that exists).
    let extension = std::path::Path::new(text)
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| {
            !e.is_empty() && e.len() <= 8 && e.chars().all(|c| c.is_ascii_alphanumeric())
        });
    let pathlike = text.contains(['/', '\\']) || extension;
    (pathlike || std::path::Path::new(text).is_file()).then_some(text)
}

/// `value`, or the contents of the file it names (for `op`'s errors).
pub(crate) fn resolve(value: Bytes, op: &'static str) -> Result<Bytes, OpError> {
    let Some(name) = reference(&value) else {
        return Ok(value);
    };
    read(name).map_err(|why| OpError::wrong_input(op, format!("cannot read {name:?}: {why}")))
}

fn read(name: &str) -> Result<Bytes, String> {
    if let Some(read) = chute_core::files::file_reader() {
        return read(name);
    }
    if name.contains("://") && !name.starts_with("file://") {
        return Err(
            "reading URLs needs chute's I/O layer: call chute::read_files_with_io() once (the \
             command line and the Python package do)"
                .into(),
        );
    }
    let path = name.strip_prefix("file://").unwrap_or(name);
    std::fs::read(path)
        .map(Bytes::from)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_paths_that_exist_or_urls_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.wav");
        std::fs::write(&file, b"RIFF").unwrap();
        let name = file.to_str().unwrap();
        assert_eq!(reference(name.as_bytes()), Some(name));
        assert_eq!(
            reference(b"https://host/x.flac"),
            Some("https://host/x.flac")
        );
        assert_eq!(reference(b"/no/such/file.wav"), Some("/no/such/file.wav"));
        assert_eq!(reference(b"RIFF\x00\x01"), None);
        assert_eq!(reference(b"ID3\x04"), None);
        assert_eq!(reference(b"GIF89a"), None);
        assert_eq!(reference(b"clip.flac"), Some("clip.flac"));
        assert_eq!(
            resolve(Bytes::from(name.to_string()), "decode_audio").unwrap(),
            &b"RIFF"[..]
        );
        for missing in ["nosuch://x", "/no/such/file.wav"] {
            let e = resolve(Bytes::from(missing), "decode_audio").unwrap_err();
            assert!(
                e.to_string().contains("cannot read") && e.to_string().contains(missing),
                "{e}"
            );
        }
    }
}
