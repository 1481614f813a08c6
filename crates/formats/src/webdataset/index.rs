//! Where each sample's bytes are: [`ShardIndex`] of [`SampleSpan`]s (built by a scan or read from
//! a `<shard>.idx` file) and the checks that an index file belongs to its shard.

use std::path::Path;

use chute_core::{Corruption, Error};
use chute_io::write_atomically;

use super::group::{Grouper, SampleSpan};
use crate::indexed::ShardFormat;
use crate::tar::{self, BLOCK_SIZE, TarDecoder, TarOptions};

/// The first line of an index file.
pub const INDEX_HEADER: &str = "chute-wds-index 1";

/// The samples of one shard, in order: where each one's bytes are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardIndex {
    pub(super) spans: Vec<SampleSpan>,
}

impl ShardIndex {
    /// Scans a whole shard in one pass over its headers (data is skipped, not read) and
    /// records each sample's span. Fails as reading the shard would: a truncated or damaged
    /// shard, or a field repeated within a sample, is an [`Error::Corrupt`] naming `uri`.
    pub fn scan(shard: &[u8], uri: &str, options: TarOptions) -> Result<ShardIndex, Error> {
        let mut decoder = TarDecoder::new(uri, options);
        let mut grouper = Grouper::default();
        let mut spans = Vec::new();
        let mut pos = 0;
        while pos < shard.len() {
            let (used, member) = decoder.decode(&shard[pos..])?;
            pos += used;
            if let Some(m) = member
                && grouper.add(&m, uri)?
            {
                spans.push(grouper.done.span);
            }
        }
        decoder.finish()?;
        if grouper.finish() {
            spans.push(grouper.done.span);
        }
        Ok(ShardIndex { spans })
    }

    /// The spans, one per sample.
    pub fn spans(&self) -> &[SampleSpan] {
        &self.spans
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether the shard holds no sample.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The index file's text: [`INDEX_HEADER`], then `<offset> <size>` per sample.
    pub fn to_text(&self) -> String {
        let mut s = String::with_capacity(INDEX_HEADER.len() + 1 + self.spans.len() * 16);
        s.push_str(INDEX_HEADER);
        s.push('\n');
        for span in &self.spans {
            s.push_str(&format!("{} {}\n", span.offset, span.size));
        }
        s
    }

    /// Parses an index file's text; `origin` names the file in errors, which give the line
    /// number and its byte offset.
    pub fn parse(text: &str, origin: &str) -> Result<ShardIndex, Error> {
        let mut lines = text.split_inclusive('\n');
        let mut at = 0u64;
        let bad = |at: u64, line: usize, why: String| {
            Error::corrupt(
                origin,
                at,
                format!("line {line}: {why}; rebuild the index with `chute index`"),
            )
        };
        let first = lines.next().unwrap_or("");
        if first.trim_end_matches('\n') != INDEX_HEADER {
            return Err(bad(
                0,
                1,
                format!(
                    "expected {INDEX_HEADER:?}, found {:?}: not a chute WebDataset index (or \
                     one of another version)",
                    first.trim_end_matches('\n')
                ),
            ));
        }
        at += first.len() as u64;
        let mut spans: Vec<SampleSpan> = Vec::new();
        for (i, raw) in lines.enumerate() {
            let line_no = i + 2;
            let line = raw.strip_suffix('\n').unwrap_or(raw);
            let mut parts = line.split(' ');
            let number = |s: Option<&str>| {
                s.filter(|s| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
                    .and_then(|s| s.parse::<u64>().ok())
            };
            let (Some(offset), Some(size), None) =
                (number(parts.next()), number(parts.next()), parts.next())
            else {
                return Err(bad(
                    at,
                    line_no,
                    format!("expected \"<offset> <size>\" in decimal, found {line:?}"),
                ));
            };
            let span = SampleSpan { offset, size };
            if offset % BLOCK_SIZE as u64 != 0 || size == 0 || size % BLOCK_SIZE as u64 != 0 {
                return Err(bad(
                    at,
                    line_no,
                    format!(
                        "{offset} {size} is not a range of whole tar blocks (offset and size \
                         must be non-zero multiples of 512, size above 0)"
                    ),
                ));
            }
            if offset.checked_add(size).is_none() {
                return Err(bad(at, line_no, format!("{offset} + {size} overflows")));
            }
            if let Some(prev) = spans.last()
                && offset < prev.offset + prev.size
            {
                return Err(bad(
                    at,
                    line_no,
                    format!(
                        "the range at {offset} starts before the previous one ends (at {}); \
                         ranges must increase",
                        prev.offset + prev.size
                    ),
                ));
            }
            spans.push(span);
            at += raw.len() as u64;
        }
        Ok(ShardIndex { spans })
    }

    /// Reads and parses the index file at `path`.
    pub fn load(path: &Path) -> Result<ShardIndex, Error> {
        let name = path.display().to_string();
        let text = std::fs::read(path).map_err(|e| Error::io(&name, e))?;
        ShardIndex::parse_bytes(&text, &name)
    }

    /// [`ShardIndex::parse`] of the bytes of an index file (`origin` names it).
    pub fn parse_bytes(text: &[u8], origin: &str) -> Result<ShardIndex, Error> {
        let name = origin;
        let text = std::str::from_utf8(text).map_err(|e| {
            Error::corrupt(
                name,
                e.valid_up_to() as u64,
                "not UTF-8 text: not a chute WebDataset index; rebuild it with `chute index`",
            )
        })?;
        ShardIndex::parse(text, name)
    }

    /// Writes the index file at `path` (through `<path>.tmp` and a rename,
    /// [`write_atomically`], so a reader never sees half an index).
    pub fn save(&self, path: &Path) -> Result<(), Error> {
        write_atomically(path, self.to_text().as_bytes())
    }
}

/// Tar shards as [`IndexedShards::open`](crate::indexed::IndexedShards::open) opens them,
/// with these decoder limits.
#[derive(Debug, Clone, Copy)]
pub(super) struct TarShards(pub(super) TarOptions);

impl ShardFormat for TarShards {
    type Index = ShardIndex;

    /// [`ShardIndex::parse_bytes`], then cheap checks that the index belongs to its shard
    /// (full agreement is checked per sample, when it is read).
    fn parse_index(
        &self,
        text: &[u8],
        origin: &str,
        shard: Option<&[u8]>,
        size: u64,
    ) -> Result<ShardIndex, Error> {
        let index = ShardIndex::parse_bytes(text, origin)?;
        match shard {
            Some(bytes) => check_index_fits(&index, bytes, origin)?,
            None => check_index_ends(&index, size, origin)?,
        }
        Ok(index)
    }

    fn scan(&self, data: &[u8], uri: &str) -> Result<ShardIndex, Error> {
        ShardIndex::scan(data, uri, self.0)
    }
}

/// For a remote shard (whose bytes are not at hand): the index's last range ends inside it.
fn check_index_ends(index: &ShardIndex, size: u64, origin: &str) -> Result<(), Error> {
    match index.spans.last() {
        Some(last) if last.offset + last.size > size => Err(Error::corrupt_as(
            Corruption::StaleIndex,
            origin,
            last.offset + last.size,
            format!(
                "its last range ends at byte {}, past the shard's {size} bytes; the index is \
                 stale or belongs to another shard: rebuild it with `chute index`",
                last.offset + last.size
            ),
        )),
        _ => Ok(()),
    }
}

/// Cheap checks that an index file belongs to its shard: the ranges end inside the file, and
/// a header (or the end-of-archive block) sits where the first range starts and the last one
/// ends. Full agreement is checked per sample, when it is read.
fn check_index_fits(index: &ShardIndex, shard: &[u8], origin: &str) -> Result<(), Error> {
    let Some(last) = index.spans.last() else {
        return Ok(());
    };
    let stale = |at: u64, why: String| {
        Error::corrupt_as(
            Corruption::StaleIndex,
            origin,
            at,
            format!(
                "{why}; the index is stale or belongs to another shard: rebuild it with `chute index`"
            ),
        )
    };
    let end = last.offset + last.size;
    if end > shard.len() as u64 {
        return Err(stale(
            end,
            format!(
                "its last range ends at byte {end}, past the shard's {} bytes",
                shard.len()
            ),
        ));
    }
    for at in [index.spans[0].offset, end] {
        let block = shard.get(at as usize..at as usize + BLOCK_SIZE);
        if !block.is_some_and(tar::is_header_or_end) {
            return Err(stale(
                at,
                format!("no tar header at byte {at} of the shard"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::same_sample;
    use crate::webdataset::read_sample;
    use crate::webdataset::testing::{URI, read_all, reason, shard};
    use bytes::Bytes;

    #[test]
    fn index_scan_and_random_access_agree_with_sequential_reading() {
        let long_key = format!("{}/sample", "deep.dir".repeat(20));
        let data = shard(&[
            ("s0", &[("jpg", b"zero"), ("cls", b"0")]),
            (&long_key, &[("jpg", &[1u8; 700][..]), ("cls", b"1")]),
            ("s2", &[("txt", b"")]),
        ]);
        let index = ShardIndex::scan(&data, URI, TarOptions::default()).unwrap();
        assert_eq!(index.len(), 3);
        assert_eq!(index.spans()[0].offset, 0);
        let bytes = Bytes::copy_from_slice(&data);
        let seq = read_all(&data).unwrap();
        for (i, span) in index.spans().iter().enumerate() {
            let s = read_sample(&bytes, *span, URI, TarOptions::default()).unwrap();
            same_sample(&seq[i], &s).unwrap();
        }
        assert_eq!(seq[1].key, long_key);
        // Text round trip.
        let text = index.to_text();
        assert!(text.starts_with("chute-wds-index 1\n0 2048\n"), "{text}");
        assert_eq!(ShardIndex::parse(&text, "i.idx").unwrap(), index);
        // A span that covers two samples, none, or starts mid-member is refused.
        let two = SampleSpan {
            offset: 0,
            size: index.spans()[1].range().end,
        };
        let e = read_sample(&bytes, two, URI, TarOptions::default()).unwrap_err();
        assert!(reason(&e).contains("more than one sample"), "{e}");
        let inside = SampleSpan {
            offset: 512,
            size: 512,
        };
        let e = read_sample(&bytes, inside, URI, TarOptions::default()).unwrap_err();
        assert!(reason(&e).contains("checksum"), "{e}");
        let past = SampleSpan {
            offset: 0,
            size: data.len() as u64 + 512,
        };
        let e = read_sample(&bytes, past, URI, TarOptions::default()).unwrap_err();
        assert!(reason(&e).contains("past the shard's end"), "{e}");
        let end = SampleSpan {
            offset: data.len() as u64 - 1024,
            size: 512,
        };
        let e = read_sample(&bytes, end, URI, TarOptions::default()).unwrap_err();
        assert!(reason(&e).contains("no sample"), "{e}");
    }

    #[test]
    fn index_parse_errors_name_file_and_line() {
        let check = |text: &str, line: usize, offset: u64, what: &str| {
            let e = ShardIndex::parse(text, "x/s.tar.idx").unwrap_err();
            let Error::Corrupt {
                uri,
                offset: o,
                reason,
                ..
            } = &e
            else {
                panic!("{e}")
            };
            assert_eq!((uri.as_str(), *o), ("x/s.tar.idx", offset), "{e}");
            assert!(reason.starts_with(&format!("line {line}:")), "{e}");
            assert!(reason.contains(what), "{e}");
        };
        check("", 1, 0, "expected \"chute-wds-index 1\"");
        check("chute-wds-index 2\n", 1, 0, "another version");
        check(
            "chute-wds-index 1\n0 512\n512 x\n",
            3,
            24,
            "<offset> <size>",
        );
        check("chute-wds-index 1\n0 512 7\n", 2, 18, "<offset> <size>");
        check("chute-wds-index 1\n0 512\n\n", 3, 24, "<offset> <size>");
        check("chute-wds-index 1\n1 512\n", 2, 18, "whole tar blocks");
        check("chute-wds-index 1\n0 0\n", 2, 18, "whole tar blocks");
        check(
            "chute-wds-index 1\n512 1024\n1024 512\n",
            3,
            27,
            "must increase",
        );
        check(
            "chute-wds-index 1\n18446744073709551104 1024\n",
            2,
            18,
            "overflows",
        );
        assert!(
            ShardIndex::parse("chute-wds-index 1\n", "i")
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            ShardIndex::parse("chute-wds-index 1\n0 512\n1024 512", "i")
                .unwrap()
                .len(),
            2
        );
    }
}
