//! Index files in the text format of NVIDIA DALI's `tfrecord2idx`: one line `offset size`
//! per record, `size` being the whole framed record (`length + 16`).

use std::io::{self, Write};
use std::path::Path;

use chute_core::Error;
use chute_io::AtomicFile;

use super::framing::{FRAME_OVERHEAD, Frame, FramingOptions, RecordDecoder};

/// One line of an index file: where a framed record starts and how many bytes it takes
/// (`length + 16`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IndexEntry {
    /// Byte offset of the record's frame in the shard.
    pub offset: u64,
    /// Size of the framed record: data length + 16.
    pub size: u64,
}

/// The index of the in-memory shard `input`: one entry per record.
///
/// Checks what DALI's `tfrecord2idx` trusts: each length CRC (when
/// [`FramingOptions::verify_checksums`]), [`FramingOptions::max_record_bytes`], and that the
/// records tile the input exactly. Data CRCs are not read here, so indexing touches only the
/// pages holding headers; they are checked when a record is read. Fails with
/// [`Error::Corrupt`] naming `origin` and the bad record's offset.
pub fn build_index(
    input: &[u8],
    origin: &str,
    options: FramingOptions,
) -> Result<Vec<IndexEntry>, Error> {
    let mut decoder = RecordDecoder::new(origin, options);
    decoder.check_data = false;
    let mut entries = Vec::new();
    let mut pos = 0usize;
    loop {
        let rest = &input[pos..];
        match decoder.decode(rest)? {
            Frame::Record(r) => {
                entries.push(IndexEntry {
                    offset: r.offset,
                    size: r.framed_len() as u64,
                });
                pos += r.framed_len();
            }
            Frame::Incomplete { .. } => {
                decoder.finish(rest)?;
                return Ok(entries);
            }
        }
    }
}

/// Writes `entries` in `tfrecord2idx`'s format (`offset size` per line) to `out`.
pub fn write_index_to(mut out: impl Write, entries: &[IndexEntry]) -> io::Result<()> {
    for e in entries {
        writeln!(out, "{} {}", e.offset, e.size)?;
    }
    Ok(())
}

/// Writes the index file `path` through an [`AtomicFile`] (under a temporary name, renamed
/// when complete). Fails with [`Error::Io`] naming the temporary file, or `path` if the
/// rename fails.
pub fn write_index(path: &Path, entries: &[IndexEntry]) -> Result<(), Error> {
    let mut file = AtomicFile::create(path)?;
    write_index_to(&mut file, entries).map_err(|e| file.error(e))?;
    file.finish()?;
    Ok(())
}

/// Parses an index file's text: one `offset size` line per record (DALI's `tfrecord2idx`
/// format), records in file order, each starting where the previous one ends, the first at
/// byte 0. Blank lines at the end are ignored.
///
/// Fails with [`Error::Corrupt`] naming `origin` (the index file), the line's byte offset and
/// its line number if a line is not two unsigned integers, a size is smaller than the 16 bytes
/// of framing, or the records do not follow each other (the index belongs to another file, or
/// to another version of this one: rebuild it).
pub fn parse_index(text: &[u8], origin: &str) -> Result<Vec<IndexEntry>, Error> {
    let mut entries = Vec::new();
    let mut line_start = 0usize;
    let mut expect = 0u64;
    let body_end = text.len()
        - text
            .iter()
            .rev()
            .take_while(|b| b.is_ascii_whitespace())
            .count();
    if body_end == 0 {
        return Ok(entries);
    }
    for (i, line) in text[..body_end].split(|&b| b == b'\n').enumerate() {
        let at = line_start;
        line_start += line.len() + 1;
        let n = i + 1;
        let bad = |reason: String| {
            Error::corrupt(
                origin,
                at as u64,
                format!("line {n} of the index: {reason}; rebuild the index"),
            )
        };
        let shown = || String::from_utf8_lossy(line).into_owned();
        let mut fields = line
            .split(|b| b.is_ascii_whitespace())
            .filter(|f| !f.is_empty())
            .map(|f| {
                std::str::from_utf8(f)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
            });
        let (Some(Some(offset)), Some(Some(size)), None) =
            (fields.next(), fields.next(), fields.next())
        else {
            return Err(bad(format!(
                "expected `offset size` (two unsigned integers), found {:?}",
                shown()
            )));
        };
        if size < FRAME_OVERHEAD as u64 {
            return Err(bad(format!(
                "a record of {size} bytes is smaller than the {FRAME_OVERHEAD} bytes of framing"
            )));
        }
        if offset != expect {
            return Err(bad(format!(
                "the record at byte {offset} does not start where the previous one ends (byte \
                 {expect}); the index belongs to another file or another version of it"
            )));
        }
        expect = offset
            .checked_add(size)
            .ok_or_else(|| bad(format!("offset {offset} + size {size} overflows")))?;
        entries.push(IndexEntry { offset, size });
    }
    Ok(entries)
}

/// Reads and parses the index file `path` (see [`parse_index`]). Fails with [`Error::Io`] if
/// it cannot be read.
pub fn read_index(path: &Path) -> Result<Vec<IndexEntry>, Error> {
    let text = std::fs::read(path).map_err(|e| Error::io(path.display().to_string(), e))?;
    parse_index(&text, &path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tfrecord::index_path;
    use crate::tfrecord::testing::corrupt;

    #[test]
    fn index_files_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let entries = vec![
            IndexEntry {
                offset: 0,
                size: 16,
            },
            IndexEntry {
                offset: 16,
                size: 1000,
            },
            IndexEntry {
                offset: 1016,
                size: 17,
            },
        ];
        let path = dir.path().join("a.tfrecord.idx");
        write_index(&path, &entries).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "0 16\n16 1000\n1016 17\n"
        );
        assert_eq!(read_index(&path).unwrap(), entries);
        assert_eq!(
            index_path(Path::new("d/a.tfrecord")),
            Path::new("d/a.tfrecord.idx")
        );
        // Tolerated: no final newline, CRLF, extra spaces, blank lines at the end.
        assert_eq!(
            parse_index(b"0 16\r\n16  1000\n1016\t17", "i").unwrap(),
            entries
        );
        assert_eq!(
            parse_index(b"0 16\n16 1000\n1016 17\n\n\n", "i").unwrap(),
            entries
        );
        assert!(parse_index(b"", "i").unwrap().is_empty());
        assert!(read_index(&dir.path().join("missing.idx")).is_err());
    }

    #[test]
    fn index_errors_name_the_file_and_line() {
        let cases: &[(&[u8], u64, &str)] = &[
            (
                b"0 16\nx 16\n",
                5,
                "line 2 of the index: expected `offset size`",
            ),
            (b"0 16\n16\n", 5, "line 2 of the index: expected"),
            (b"0 16 3\n", 0, "line 1 of the index: expected"),
            (b"0 16\n\n16 16\n", 5, "line 2 of the index: expected"),
            (b"0 -16\n", 0, "line 1"),
            (b"0 15\n", 0, "smaller than the 16 bytes of framing"),
            (
                b"0 16\n17 16\n",
                5,
                "line 2 of the index: the record at byte 17 does not start",
            ),
            (b"16 16\n", 0, "line 1"),
            (b"0 16\n16 18446744073709551615\n", 5, "overflows"),
        ];
        for &(text, offset, want) in cases {
            let (uri, got, reason) = corrupt(parse_index(text, "x.idx").unwrap_err());
            assert_eq!(uri, "x.idx");
            assert_eq!(got, offset, "{reason}");
            assert!(reason.contains(want), "{reason}");
        }
    }
}
