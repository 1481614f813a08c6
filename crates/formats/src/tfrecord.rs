//! TFRecord files: the framing codec, writers, DALI-style index files, GZIP streaming and
//! [`TfRecordSource`].
//!
//! A TFRecord file is a sequence of records, each framed as
//!
//! ```text
//! u64 length (little-endian) | u32 masked_crc32c(length bytes) | data[length] | u32 masked_crc32c(data)
//! ```
//!
//! where `masked_crc32c(x) = crc32c(x).rotate_right(15) + 0xa282ead8` (TensorFlow's
//! `core/lib/hash/crc32c.h`: masking keeps a CRC of data that contains CRCs from being
//! trivially zero). A record usually holds a serialized `tf.train.Example` (see
//! [`crate::example`]); [`TfRecordOptions::example`] says whether to decode it.
//!
//! The pieces, from the bottom up:
//!
//! - [`RecordDecoder`]: the sans-IO codec. It is handed bytes that start at a record and
//!   answers "here is a record" ([`Frame::Record`], a range of the input, never a copy) or
//!   "I need N bytes" ([`Frame::Incomplete`]); it never reads, never allocates per record, and
//!   a hostile length costs nothing: it is checked against its CRC and
//!   [`FramingOptions::max_record_bytes`], and then only against the bytes present.
//! - [`records`]: every record of an in-memory shard (a slice or a memory map).
//! - [`TfRecordReader`]: sequential reading of any [`Read`] with bounded memory, the same
//!   decoder over an internal buffer; [`TfRecordReader::open`] reads plain or GZIP-compressed
//!   files.
//! - [`TfRecordWriter`] (any [`Write`]) and [`TfRecordFileWriter`] (a file written under a
//!   temporary name and renamed when finished, optionally GZIP-compressed, optionally with
//!   its index).
//! - Index files in the text format of NVIDIA DALI's `tfrecord2idx`: one line
//!   `offset size` per record, `size` being the whole framed record (`length + 16`):
//!   [`build_index`], [`write_index`], [`parse_index`], [`read_index`], [`index_path`].
//! - [`TfRecordSource`]: random access to the records of local files for the loader, one shard
//!   per file, each record a zero-copy view of the file's memory map.
//!
//! ```
//! use chute_core::{Field, Source};
//! use chute_formats::example::{Example, Feature};
//! use chute_formats::tfrecord::{TfRecordFileWriter, TfRecordOptions, TfRecordSource, WriterOptions};
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("train.tfrecord");
//! let mut writer = TfRecordFileWriter::create(&path, WriterOptions::default())?;
//! for label in 0..3i64 {
//!     let mut ex = Example::default();
//!     ex.insert("label", Feature::Int64(vec![label]));
//!     writer.write_record(&ex.encode())?;
//! }
//! assert_eq!(writer.finish()?, 3);
//!
//! let source = TfRecordSource::open(&[&path], TfRecordOptions::default())?;
//! assert_eq!(source.manifest().total_samples(), 3);
//! let sample = source.read(2)?;
//! assert_eq!(sample.key, "train/2");
//! let Some(Field::Array(label)) = sample.get("label") else { unreachable!() };
//! assert_eq!(label.shape, [0usize; 0]); // one value: a scalar
//! assert_eq!(&label.data[..], &2i64.to_le_bytes());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};
use chute_core::{
    BufferPool, Column, ConfigError, Error, Field, Manifest, Plan, Sample, ShardInfo, Source,
    VarColumn,
};
use chute_io::{IoSnapshot, Location, ShardSet};

use crate::example::{ExampleOptions, collate_examples, decode_sample, sample_to_example};

/// Bytes before a record's data: the length and its CRC.
pub const HEADER_LEN: usize = 12;
/// Bytes after a record's data: its CRC.
pub const FOOTER_LEN: usize = 4;
/// Framing bytes per record: a record of `n` data bytes takes `n + 16` bytes in the file.
pub const FRAME_OVERHEAD: usize = HEADER_LEN + FOOTER_LEN;
/// The default [`FramingOptions::max_record_bytes`]: 1 GiB.
pub const DEFAULT_MAX_RECORD_BYTES: u64 = 1 << 30;
/// The manifest's format name.
pub const FORMAT: &str = "tfrecord";
/// The name of the one field of a raw record sample ([`TfRecordOptions::example`] `None`).
pub const RECORD_FIELD: &str = "record";

/// The GZIP magic number and the deflate method byte.
const GZIP_MAGIC: [u8; 3] = [0x1f, 0x8b, 0x08];

/// TensorFlow's masked CRC-32C of `data` (hardware CRC32 instructions where the CPU has them).
#[inline]
pub fn masked_crc32c(data: &[u8]) -> u32 {
    mask(crc32c::crc32c(data))
}

#[inline]
fn mask(crc: u32) -> u32 {
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// How the framing is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FramingOptions {
    /// Verify both CRCs of every record (the default). Off, a corrupt length is still caught
    /// by `max_record_bytes` and the file's end, but corrupt data is not.
    pub verify_checksums: bool,
    /// The largest record accepted, in data bytes (default [`DEFAULT_MAX_RECORD_BYTES`]). A
    /// longer declared length is reported as corruption instead of being trusted.
    pub max_record_bytes: u64,
}

impl Default for FramingOptions {
    fn default() -> Self {
        FramingOptions {
            verify_checksums: true,
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
        }
    }
}

impl FramingOptions {
    /// `max_record_bytes`, capped so that a framed record's size fits in `usize`.
    fn max_len(&self) -> u64 {
        self.max_record_bytes
            .min(usize::MAX as u64 - FRAME_OVERHEAD as u64)
    }
}

/// A record found by the decoder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Byte offset of the record's frame (its length field) in the shard or stream.
    pub offset: u64,
    /// Where the record's data lies in the input the decoder was given.
    pub data: Range<usize>,
}

impl Record {
    /// Bytes the framed record takes: `data.len() + 16`.
    pub fn framed_len(&self) -> usize {
        self.data.len() + FRAME_OVERHEAD
    }
}

/// What [`RecordDecoder::decode`] found at the front of its input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A whole, verified record. Its frame is `input[..record.data.end + 4]`; the decoder has
    /// moved past it.
    Record(Record),
    /// The input holds only the start of a record: at least `needed` bytes, counted from the
    /// start of the input, are required (12 while the header is incomplete, then the whole
    /// framed record). At the end of the stream, call [`RecordDecoder::finish`].
    Incomplete {
        /// Bytes required from the start of the input.
        needed: usize,
    },
}

/// The sans-IO TFRecord decoder: bytes in, records out.
///
/// The caller owns the bytes. It hands [`RecordDecoder::decode`] a slice that starts at the
/// next record (at [`RecordDecoder::position`] in the stream) and gets either a record, as a
/// range of that slice, or how many bytes to gather before asking again. The same decoder
/// serves a memory-mapped file (the whole file is one slice: [`records`]), a streaming reader
/// ([`TfRecordReader`]), and fuzzing.
///
/// Every problem is an [`Error::Corrupt`] naming the origin given to [`RecordDecoder::new`],
/// the record's offset and what to do.
#[derive(Debug, Clone)]
pub struct RecordDecoder {
    origin: String,
    options: FramingOptions,
    position: u64,
    records: u64,
    /// Whether `decode` checks data CRCs (index building checks only the headers).
    check_data: bool,
}

impl RecordDecoder {
    /// A decoder for a stream named `origin` (a path or URL, for errors), at offset 0.
    pub fn new(origin: impl Into<String>, options: FramingOptions) -> Self {
        RecordDecoder {
            origin: origin.into(),
            options,
            position: 0,
            records: 0,
            check_data: options.verify_checksums,
        }
    }

    /// The same decoder, positioned at `offset` (resuming mid-stream at a record boundary).
    pub fn at(mut self, offset: u64) -> Self {
        self.position = offset;
        self
    }

    /// The stream offset of the next record: where the input to the next `decode` starts.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Records decoded so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// The origin named in errors.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The options.
    pub fn options(&self) -> FramingOptions {
        self.options
    }

    /// Decodes the record at the front of `input`, which must start at
    /// [`RecordDecoder::position`].
    ///
    /// Returns [`Frame::Record`] (and moves past it) when `input` holds the whole record,
    /// [`Frame::Incomplete`] when it holds less. Fails with [`Error::Corrupt`] at the record's
    /// offset when a CRC does not match or the length exceeds
    /// [`FramingOptions::max_record_bytes`]; after an error the decoder does not move, and
    /// there is no way to find the next record (TFRecord has no sync markers).
    #[inline]
    pub fn decode(&mut self, input: &[u8]) -> Result<Frame, Error> {
        let Some(header) = input.first_chunk::<HEADER_LEN>() else {
            return Ok(Frame::Incomplete { needed: HEADER_LEN });
        };
        let len = check_header(header, input, self.position, &self.origin, &self.options)?;
        let total = len + FRAME_OVERHEAD;
        let Some(frame) = input.get(..total) else {
            return Ok(Frame::Incomplete { needed: total });
        };
        if self.check_data {
            check_data(frame, self.position, &self.origin)?;
        }
        let record = Record {
            offset: self.position,
            data: HEADER_LEN..HEADER_LEN + len,
        };
        self.position += total as u64;
        self.records += 1;
        Ok(Frame::Record(record))
    }

    /// Ends the stream: `rest` is what is left of the input after the last record. Empty is
    /// a clean end; anything else is a truncated record, reported with what it declared and
    /// what is present.
    pub fn finish(&self, rest: &[u8]) -> Result<(), Error> {
        if rest.is_empty() {
            Ok(())
        } else {
            Err(truncated(rest, self.position, &self.origin, &self.options))
        }
    }
}

/// Checks a record header (`input` starts with it; more of `input` helps the message when it
/// is not a TFRecord file at all) and returns the data length.
#[inline]
fn check_header(
    header: &[u8; HEADER_LEN],
    input: &[u8],
    offset: u64,
    origin: &str,
    options: &FramingOptions,
) -> Result<usize, Error> {
    let (len_bytes, crc_bytes) = header.split_at(8);
    let len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes"));
    if options.verify_checksums {
        let stored = u32::from_le_bytes(crc_bytes.try_into().expect("4 bytes"));
        let computed = masked_crc32c(len_bytes);
        if stored != computed {
            return Err(Error::corrupt(
                origin,
                offset,
                format!(
                    "length crc mismatch (stored {stored:#010x}, computed {computed:#010x}): {}",
                    not_tfrecord_hint(input, offset)
                ),
            ));
        }
    }
    if len > options.max_len() {
        return Err(Error::corrupt(
            origin,
            offset,
            format!(
                "record declares {len} bytes of data, more than max_record_bytes ({}); the \
                 file is corrupt or not a TFRecord file, or raise max_record_bytes",
                options.max_record_bytes
            ),
        ));
    }
    Ok(len as usize)
}

/// What to tell a user whose file fails the first length CRC.
fn not_tfrecord_hint(input: &[u8], offset: u64) -> &'static str {
    if offset == 0 && input.starts_with(&GZIP_MAGIC) {
        "the file is GZIP-compressed; read it with compression (TfRecordReader::open with \
         Compression::Gzip or Auto), or decompress it"
    } else if offset == 0
        && input.len() >= 2
        && input[0] & 0x0f == 8
        && (u16::from(input[0]) << 8 | u16::from(input[1])) % 31 == 0
    {
        "the file looks ZLIB-compressed (TFRecord's compression_type=\"ZLIB\"), which chute \
         does not read; rewrite it uncompressed or with GZIP"
    } else {
        "the file is corrupt or not a TFRecord file"
    }
}

/// Checks the data CRC of a whole frame (`frame.len() == len + 16`).
#[inline]
fn check_data(frame: &[u8], offset: u64, origin: &str) -> Result<(), Error> {
    let (body, footer) = frame.split_at(frame.len() - FOOTER_LEN);
    let data = &body[HEADER_LEN..];
    let stored = u32::from_le_bytes(footer.try_into().expect("4 bytes"));
    let computed = masked_crc32c(data);
    if stored != computed {
        return Err(Error::corrupt(
            origin,
            offset,
            format!(
                "data crc mismatch in a record of {} bytes (stored {stored:#010x}, computed \
                 {computed:#010x}): the record is corrupt; re-create the file, or skip bad \
                 records with on_error=skip",
                data.len()
            ),
        ));
    }
    Ok(())
}

/// The error for a stream that ends inside a record (`rest` is non-empty).
fn truncated(rest: &[u8], offset: u64, origin: &str, options: &FramingOptions) -> Error {
    let cut = "the file was cut short (an interrupted write or copy?); re-create it, or \
               drop the partial record";
    let Some(header) = rest.first_chunk::<HEADER_LEN>() else {
        return Error::corrupt(
            origin,
            offset,
            format!(
                "truncated record header: {} of its {HEADER_LEN} bytes present; {cut}",
                rest.len()
            ),
        );
    };
    let len = match check_header(header, rest, offset, origin, options) {
        Ok(len) => len,
        Err(e) => return e,
    };
    let present = rest.len() - HEADER_LEN;
    if present < len {
        Error::corrupt(
            origin,
            offset,
            format!("truncated record: {len} bytes declared, {present} present; {cut}"),
        )
    } else {
        Error::corrupt(
            origin,
            offset,
            format!(
                "truncated record: its {len} bytes of data are present but {} of the 4 bytes of \
                 its data crc are missing; {cut}",
                FOOTER_LEN - (present - len)
            ),
        )
    }
}

/// Every record of `input`, an in-memory shard (a slice or a memory map) starting at a
/// record; see [`Records`].
pub fn records<'a>(
    input: &'a [u8],
    origin: impl Into<String>,
    options: FramingOptions,
) -> Records<'a> {
    Records {
        input,
        pos: 0,
        decoder: RecordDecoder::new(origin, options),
        done: false,
    }
}

/// Iterator over the records of an in-memory shard, made by [`records`]. Each item is a
/// verified [`Record`] whose `data` range indexes the whole input, or the first error, after
/// which the iterator ends.
#[derive(Debug, Clone)]
pub struct Records<'a> {
    input: &'a [u8],
    pos: usize,
    decoder: RecordDecoder,
    done: bool,
}

impl Iterator for Records<'_> {
    type Item = Result<Record, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let rest = &self.input[self.pos..];
        match self.decoder.decode(rest) {
            Ok(Frame::Record(r)) => {
                let base = self.pos;
                self.pos += r.framed_len();
                Some(Ok(Record {
                    offset: r.offset,
                    data: base + r.data.start..base + r.data.end,
                }))
            }
            Ok(Frame::Incomplete { .. }) => {
                self.done = true;
                self.decoder.finish(rest).err().map(Err)
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Index files.

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

/// Where [`TfRecordSource`] looks for a shard's index: `<shard>.idx` next to it
/// (`train-00000.tfrecord.idx` for `train-00000.tfrecord`).
pub fn index_path(shard: &Path) -> PathBuf {
    let mut p = shard.as_os_str().to_owned();
    p.push(".idx");
    PathBuf::from(p)
}

/// Writes `entries` in `tfrecord2idx`'s format (`offset size` per line) to `out`.
pub fn write_index_to(mut out: impl Write, entries: &[IndexEntry]) -> io::Result<()> {
    for e in entries {
        writeln!(out, "{} {}", e.offset, e.size)?;
    }
    Ok(())
}

/// Writes the index file `path` (under a temporary name, renamed when complete). Fails with
/// [`Error::Io`] naming the file.
pub fn write_index(path: &Path, entries: &[IndexEntry]) -> Result<(), Error> {
    let tmp = tmp_path(path);
    let result = (|| {
        let mut out = BufWriter::new(File::create(&tmp)?);
        write_index_to(&mut out, entries)?;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, path)
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(path.display().to_string(), e)
    })
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

// ---------------------------------------------------------------------------------------------
// Writers.

/// Writes TFRecord framing and CRCs to any [`Write`]. Wrap files in a [`BufWriter`]: each
/// record is three small writes and one large one.
#[derive(Debug)]
pub struct TfRecordWriter<W: Write> {
    out: W,
    records: u64,
    bytes: u64,
}

impl<W: Write> TfRecordWriter<W> {
    /// A writer appending to `out`.
    pub fn new(out: W) -> Self {
        TfRecordWriter {
            out,
            records: 0,
            bytes: 0,
        }
    }

    /// Writes one record; returns its index entry (offset counted from this writer's start).
    pub fn write_record(&mut self, data: &[u8]) -> io::Result<IndexEntry> {
        let mut header = [0u8; HEADER_LEN];
        header[..8].copy_from_slice(&(data.len() as u64).to_le_bytes());
        let len_crc = masked_crc32c(&header[..8]);
        header[8..].copy_from_slice(&len_crc.to_le_bytes());
        self.out.write_all(&header)?;
        self.out.write_all(data)?;
        self.out.write_all(&masked_crc32c(data).to_le_bytes())?;
        let entry = IndexEntry {
            offset: self.bytes,
            size: (data.len() + FRAME_OVERHEAD) as u64,
        };
        self.records += 1;
        self.bytes += entry.size;
        Ok(entry)
    }

    /// Records written.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Bytes written (the framed size of the records).
    pub fn bytes_written(&self) -> u64 {
        self.bytes
    }

    /// The underlying writer.
    pub fn get_ref(&self) -> &W {
        &self.out
    }

    /// Flushes and returns the underlying writer.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// How [`TfRecordFileWriter`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriterOptions {
    /// Compress the file with GZIP (TensorFlow's `compression_type="GZIP"`). Such files are
    /// read sequentially ([`TfRecordReader`]), not by [`TfRecordSource`].
    pub gzip: bool,
    /// Also write the index file ([`index_path`]) when finishing. Not with `gzip`: offsets in
    /// a compressed file mean nothing.
    pub index: bool,
}

/// A TFRecord file being written: records go to `<path>.tmp`, which
/// [`TfRecordFileWriter::finish`] flushes, syncs and renames to `path` (and writes the index,
/// if asked), so an interrupted write never leaves a file at `path` that looks complete.
/// Dropping the writer without `finish` deletes the temporary file.
#[derive(Debug)]
pub struct TfRecordFileWriter {
    path: PathBuf,
    tmp: PathBuf,
    /// `None` once finished.
    out: Option<TfRecordWriter<Sink>>,
    index: Option<Vec<IndexEntry>>,
}

/// Where a file writer's bytes go.
enum Sink {
    Plain(BufWriter<File>),
    Gzip(Box<flate2::write::GzEncoder<BufWriter<File>>>),
}

impl fmt::Debug for Sink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Sink::Plain(_) => "Plain",
            Sink::Gzip(_) => "Gzip",
        })
    }
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sink::Plain(w) => w.write(buf),
            Sink::Gzip(w) => w.write(buf),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Sink::Plain(w) => w.write_all(buf),
            Sink::Gzip(w) => w.write_all(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sink::Plain(w) => w.flush(),
            Sink::Gzip(w) => w.flush(),
        }
    }
}

impl TfRecordFileWriter {
    /// Creates `<path>.tmp`. Fails with a [`ConfigError`] if both `gzip` and `index` are
    /// set, or [`Error::Io`] naming the temporary file if it cannot be created.
    pub fn create(path: impl AsRef<Path>, options: WriterOptions) -> Result<Self, Error> {
        if options.gzip && options.index {
            return Err(ConfigError::new(
                "index",
                "GZIP-compressed TFRecord files cannot be indexed (they are not random-access); \
                 turn off gzip or index",
            )
            .into());
        }
        let path = path.as_ref().to_path_buf();
        let tmp = tmp_path(&path);
        let file = File::create(&tmp).map_err(|e| Error::io(tmp.display().to_string(), e))?;
        let buffered = BufWriter::with_capacity(1 << 20, file);
        let sink = if options.gzip {
            Sink::Gzip(Box::new(flate2::write::GzEncoder::new(
                buffered,
                flate2::Compression::default(),
            )))
        } else {
            Sink::Plain(buffered)
        };
        Ok(TfRecordFileWriter {
            path,
            tmp,
            out: Some(TfRecordWriter::new(sink)),
            index: options.index.then(Vec::new),
        })
    }

    /// Appends one record. Fails with [`Error::Io`] naming the temporary file.
    pub fn write_record(&mut self, data: &[u8]) -> Result<(), Error> {
        let out = self.out.as_mut().expect("finish consumes the writer");
        let entry = out
            .write_record(data)
            .map_err(|e| Error::io(self.tmp.display().to_string(), e))?;
        if let Some(index) = &mut self.index {
            index.push(entry);
        }
        Ok(())
    }

    /// Appends `sample` as a `tf.train.Example` ([`sample_to_example`]).
    pub fn write_sample(&mut self, sample: &Sample) -> Result<(), Error> {
        let bytes = sample_to_example(sample)?;
        self.write_record(&bytes)
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.out.as_ref().map_or(0, TfRecordWriter::records)
    }

    /// The final path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Flushes and syncs the records, renames the temporary file to the final path, writes
    /// the index file if asked, and returns the number of records. Fails with [`Error::Io`]
    /// naming the file.
    pub fn finish(mut self) -> Result<u64, Error> {
        let out = self.out.take().expect("finish runs once");
        let records = out.records();
        let tmp_error = |e| Error::io(self.tmp.display().to_string(), e);
        let buffered = match out.into_inner().map_err(tmp_error)? {
            Sink::Plain(w) => w,
            Sink::Gzip(w) => w.finish().map_err(tmp_error)?,
        };
        let file = buffered
            .into_inner()
            .map_err(|e| tmp_error(e.into_error()))?;
        file.sync_all().map_err(tmp_error)?;
        drop(file);
        let index_file = index_path(&self.path);
        // An index of an older version of the file must not outlive it.
        match std::fs::remove_file(&index_file) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                let _ = std::fs::remove_file(&self.tmp);
                return Err(Error::io(index_file.display().to_string(), e));
            }
            _ => {}
        }
        if let Err(e) = std::fs::rename(&self.tmp, &self.path) {
            let _ = std::fs::remove_file(&self.tmp);
            return Err(Error::io(self.path.display().to_string(), e));
        }
        if let Some(index) = &self.index {
            write_index(&index_file, index)?;
        }
        Ok(records)
    }
}

impl Drop for TfRecordFileWriter {
    fn drop(&mut self) {
        if let Some(out) = self.out.take() {
            // Not finished: the partial file must not stay behind.
            drop(out);
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    PathBuf::from(tmp)
}

// ---------------------------------------------------------------------------------------------
// Streaming.

/// Whether a stream is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// GZIP when the path ends in `.gz` or the file starts with GZIP's magic bytes (and not
    /// with a valid TFRecord header); otherwise none. The default.
    #[default]
    Auto,
    /// A plain TFRecord file.
    None,
    /// GZIP (TensorFlow's `compression_type="GZIP"`); concatenated GZIP members are read as
    /// one stream.
    Gzip,
}

/// Smallest read into the buffer.
const READ_CHUNK: usize = 256 * 1024;

/// Reads records one at a time from any [`Read`] (a pipe, a socket, a GZIP stream) with
/// bounded memory: one buffer of about the largest record plus a read chunk, and whatever
/// records the caller still holds.
///
/// Items are `(offset, data)`: the record's offset in the (decompressed) stream, and its data
/// as a [`Bytes`] view of the reader's buffer. Views share the buffer they came from without
/// copying; the reader starts a new buffer when it needs space while old views are alive, so
/// holding a record never pins more than the buffer it came from. Errors name the origin and
/// the stream offset (for GZIP files, an offset in the decompressed stream); the iterator
/// ends after the first error.
///
/// ```
/// use chute_formats::tfrecord::{FramingOptions, TfRecordReader, TfRecordWriter};
///
/// let mut w = TfRecordWriter::new(Vec::new());
/// w.write_record(b"first")?;
/// w.write_record(b"second")?;
/// let bytes = w.into_inner()?;
/// let reader = TfRecordReader::new(&bytes[..], "mem", FramingOptions::default());
/// let records: Vec<_> = reader.map(|r| r.map(|(_, data)| data)).collect::<Result<_, _>>()?;
/// assert_eq!(records, ["first", "second"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct TfRecordReader<R: Read> {
    inner: R,
    /// `buf[..filled]` holds bytes read and not yet returned; `buf[filled..]` is zeroed
    /// space for the next reads (zeroed once, not per read).
    buf: BytesMut,
    filled: usize,
    decoder: RecordDecoder,
    eof: bool,
    done: bool,
}

impl<R: Read> fmt::Debug for TfRecordReader<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TfRecordReader")
            .field("decoder", &self.decoder)
            .field("buffered", &self.filled)
            .field("eof", &self.eof)
            .finish()
    }
}

impl TfRecordReader<Box<dyn Read + Send>> {
    /// Opens the file `path` for sequential reading, decompressing GZIP as `compression`
    /// says.
    pub fn open(
        path: impl AsRef<Path>,
        compression: Compression,
        options: FramingOptions,
    ) -> Result<Self, Error> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let file = File::open(path).map_err(|e| Error::io(&name, e))?;
        let mut file = BufReader::with_capacity(READ_CHUNK, file);
        let gzip = match compression {
            Compression::None => false,
            Compression::Gzip => true,
            Compression::Auto => {
                has_gz_extension(path) || {
                    let head = file.fill_buf().map_err(|e| Error::io(&name, e))?;
                    looks_gzip(head)
                }
            }
        };
        let inner: Box<dyn Read + Send> = if gzip {
            Box::new(flate2::read::MultiGzDecoder::new(file))
        } else {
            Box::new(file)
        };
        Ok(TfRecordReader::new(inner, name, options))
    }
}

impl<R: Read> TfRecordReader<R> {
    /// A reader over `inner`, named `origin` in errors.
    pub fn new(inner: R, origin: impl Into<String>, options: FramingOptions) -> Self {
        TfRecordReader {
            inner,
            buf: BytesMut::new(),
            filled: 0,
            decoder: RecordDecoder::new(origin, options),
            eof: false,
            done: false,
        }
    }

    /// The stream offset of the next record.
    pub fn position(&self) -> u64 {
        self.decoder.position()
    }

    /// Records read so far.
    pub fn records(&self) -> u64 {
        self.decoder.records()
    }

    /// Reads until the buffer holds at least `needed` bytes or the stream ends.
    fn fill(&mut self, needed: usize) -> Result<(), Error> {
        while self.filled < needed && !self.eof {
            let have = self.filled;
            if self.buf.len() - have < READ_CHUNK.min(needed - have) {
                // At least a read chunk; at most doubling what has arrived, so that memory
                // follows the bytes present, not a declared length.
                let grow = (needed - have).min(have).max(READ_CHUNK);
                self.buf.resize(have + grow, 0);
            }
            let n = loop {
                match self.inner.read(&mut self.buf[have..]) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    r => break r.map_err(|e| self.read_error(e))?,
                }
            };
            self.filled += n;
            self.eof = n == 0;
        }
        Ok(())
    }

    fn read_error(&self, e: io::Error) -> Error {
        let origin = self.decoder.origin();
        match e.kind() {
            // What flate2 reports for a corrupt or cut-short GZIP stream.
            io::ErrorKind::InvalidInput
            | io::ErrorKind::InvalidData
            | io::ErrorKind::UnexpectedEof => Error::corrupt(
                origin,
                self.decoder.position() + self.filled as u64,
                format!(
                    "the compressed stream is corrupt or cut short ({e}); offsets count \
                     decompressed bytes"
                ),
            ),
            _ => Error::io(origin, e),
        }
    }
}

impl<R: Read> Iterator for TfRecordReader<R> {
    type Item = Result<(u64, Bytes), Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        loop {
            match self.decoder.decode(&self.buf[..self.filled]) {
                Ok(Frame::Record(r)) => {
                    let frame = self.buf.split_to(r.framed_len()).freeze();
                    self.filled -= r.framed_len();
                    return Some(Ok((r.offset, frame.slice(r.data))));
                }
                Ok(Frame::Incomplete { needed }) if !self.eof => {
                    if let Err(e) = self.fill(needed) {
                        self.done = true;
                        return Some(Err(e));
                    }
                }
                Ok(Frame::Incomplete { .. }) => {
                    self.done = true;
                    return self.decoder.finish(&self.buf[..self.filled]).err().map(Err);
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

fn has_gz_extension(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gz") || e.eq_ignore_ascii_case("gzip"))
}

/// Whether `head` (the start of a file) is GZIP rather than TFRecord: GZIP's magic bytes, and
/// not a valid TFRecord header (whose length could start with the same bytes).
fn looks_gzip(head: &[u8]) -> bool {
    head.starts_with(&GZIP_MAGIC)
        && head
            .first_chunk::<HEADER_LEN>()
            .is_none_or(|h| masked_crc32c(&h[..8]).to_le_bytes() != h[8..12])
}

// ---------------------------------------------------------------------------------------------
// The source.

pub use crate::IndexMode;

/// How [`TfRecordSource`] reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TfRecordOptions {
    /// Verify both CRCs of each record when it is read (the default), and the length CRCs
    /// while scanning.
    pub verify_checksums: bool,
    /// The largest record accepted, in bytes of data (default [`DEFAULT_MAX_RECORD_BYTES`]).
    pub max_record_bytes: u64,
    /// Decode records as `tf.train.Example`s into fields (the default, with default
    /// options), or `None` for raw records: one [`Field::Bytes`] field, [`RECORD_FIELD`].
    pub example: Option<ExampleOptions>,
    /// Where record offsets come from.
    pub index: IndexMode,
}

impl Default for TfRecordOptions {
    fn default() -> Self {
        TfRecordOptions {
            verify_checksums: true,
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
            example: Some(ExampleOptions::default()),
            index: IndexMode::Auto,
        }
    }
}

impl TfRecordOptions {
    fn framing(&self) -> FramingOptions {
        FramingOptions {
            verify_checksums: self.verify_checksums,
            max_record_bytes: self.max_record_bytes,
        }
    }
}

/// TFRecord files as a [`Source`]: sample `id` is one record, one shard per file.
///
/// Files are memory-mapped, never read whole. Record offsets come from index files or a scan
/// of the headers at open ([`IndexMode`]); a scan checks each length CRC and reads only the
/// pages holding headers. Offsets are kept in memory, 8 bytes per record. [`Source::read`]
/// verifies the record's CRCs (unless [`TfRecordOptions::verify_checksums`] is off) and
/// decodes the `tf.train.Example` ([`crate::example::example_to_sample`]); byte fields and
/// packed float lists are zero-copy views of the map.
///
/// Without per-sample transforms the loader takes the columnar path ([`Source::collate`]):
/// a batch's records are checked and their Examples parsed straight into the batch's columns,
/// the same columns as the sample path's, with no [`Sample`], [`Bytes`] or allocation per
/// record.
///
/// A sample's key is `<file stem>/<record number in the file>` (`train-00003/17`): cheap to
/// build, and enough to find the record again (`chute cat`). Keys repeat across files with the
/// same name in different folders.
///
/// GZIP-compressed files cannot be read at random: opening one fails with a [`ConfigError`];
/// read them with [`TfRecordReader`], or decompress them.
pub struct TfRecordSource {
    shards: Vec<Shard>,
    /// Where the shards' bytes come from (`None` for [`TfRecordSource::from_bytes`]).
    files: Option<ShardSet>,
    /// Whether any shard is remote (read through `files`, not `Shard::data`).
    remote: bool,
    manifest: Manifest,
    options: TfRecordOptions,
}

/// One file: where its records start (`offsets[i]..offsets[i + 1]` is record `i`'s frame;
/// the last entry is the end of the last record) and, unless it is remote, its bytes.
struct Shard {
    name: String,
    stem: String,
    /// The whole file (a view of its map, or bytes in memory); `None` for a remote shard.
    data: Option<Bytes>,
    len: u64,
    offsets: Vec<u64>,
}

impl fmt::Debug for TfRecordSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not the bytes: a shard can be gigabytes.
        f.debug_struct("TfRecordSource")
            .field("shards", &self.manifest.shards)
            .field("options", &self.options)
            .finish()
    }
}

impl TfRecordSource {
    /// Opens `paths` (local paths or URLs, see [`chute_io::Location`]), one shard each, in
    /// order. Remote shards stream through a [`ShardSet`]: whole, with read-ahead, when the
    /// loader reads shards in order ([`Source::set_plan`]), else by (coalesced) range
    /// requests. A remote shard without an index file is downloaded once at open to be
    /// scanned; `chute index` writes the index files that spare that.
    ///
    /// Fails with a [`ConfigError`] (in [`Error::Config`]) if `paths` is empty, the example
    /// options are invalid, a file is GZIP-compressed, or [`IndexMode::Require`] is set and an
    /// index file is missing; with [`Error::Io`] if a file cannot be opened, mapped or fetched;
    /// with [`Error::Corrupt`] if a scanned header is corrupt or truncated, or an index file is
    /// malformed or does not match its shard.
    pub fn open<P: AsRef<Path>>(paths: &[P], options: TfRecordOptions) -> Result<Self, Error> {
        check_options(&options, paths.len())?;
        let locations = paths
            .iter()
            .map(|p| Location::from_path(p.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        for (path, loc) in paths.iter().zip(&locations) {
            if has_gz_extension(path.as_ref()) {
                return Err(gzip_error(&loc.to_string()));
            }
        }
        let files = ShardSet::open(&locations)?;
        let mut shards = Vec::with_capacity(paths.len());
        for (i, loc) in locations.iter().enumerate() {
            let name = files.uri(i).to_owned();
            let len = files.size(i);
            let head = files.get_range(i, 0..len.min(HEADER_LEN as u64))?;
            if looks_gzip(&head) {
                return Err(gzip_error(&name));
            }
            let idx = loc.with_suffix(".idx");
            let index = match options.index {
                IndexMode::Scan => None,
                IndexMode::Auto => idx.read_optional()?,
                IndexMode::Require => match idx.read_optional()? {
                    Some(text) => Some(text),
                    None => {
                        return Err(ConfigError::new(
                            "index",
                            format!(
                                "{name} has no index file {idx}; build it (chute index, or \
                                 tfrecord::build_index and write_index), or use index mode \
                                 auto or scan"
                            ),
                        )
                        .into());
                    }
                },
            };
            let offsets = match index {
                Some(text) => {
                    let origin = idx.to_string();
                    offsets_from_index(&parse_index(&text, &origin)?, len, &origin)?
                }
                None => {
                    if let Some(file) = files.mapped(i) {
                        file.advise_sequential();
                    }
                    offsets_by_scan(&files.get(i)?, &name, &options)?
                }
            };
            let data = files.mapped(i).map(|file| {
                file.advise_random();
                file.bytes(0..file.len())
            });
            shards.push(Shard {
                stem: stem_of(&name),
                name,
                data,
                len,
                offsets,
            });
        }
        Ok(Self::assemble(shards, Some(files), options))
    }

    /// Shards already in memory (fetched from remote storage, say), as `(name, bytes)` pairs;
    /// `name` is used in errors and keys as a path would be. Offsets are found by scanning:
    /// [`IndexMode::Require`] is a [`ConfigError`] here.
    pub fn from_bytes(
        shards: Vec<(String, Bytes)>,
        options: TfRecordOptions,
    ) -> Result<Self, Error> {
        check_options(&options, shards.len())?;
        if options.index == IndexMode::Require {
            return Err(ConfigError::new(
                "index",
                "in-memory shards have no index files; use index mode auto or scan",
            )
            .into());
        }
        let mut out = Vec::with_capacity(shards.len());
        for (name, data) in shards {
            if looks_gzip(&data) {
                return Err(gzip_error(&name));
            }
            let offsets = offsets_by_scan(&data, &name, &options)?;
            out.push(Shard {
                stem: stem_of(&name),
                name,
                len: data.len() as u64,
                data: Some(data),
                offsets,
            });
        }
        Ok(Self::assemble(out, None, options))
    }

    fn assemble(shards: Vec<Shard>, files: Option<ShardSet>, options: TfRecordOptions) -> Self {
        let infos = shards
            .iter()
            .map(|s| ShardInfo {
                path: s.name.clone(),
                samples: (s.offsets.len() - 1) as u64,
                bytes: s.len,
            })
            .collect();
        let mut manifest = Manifest::new(FORMAT, infos);
        manifest = match &options.example {
            None => manifest.with_param("records", "raw"),
            Some(ex) => {
                let mut m = manifest.with_param("records", "example");
                if let Some(features) = &ex.features {
                    m = m.with_param("features", features.clone());
                }
                if !ex.scalars {
                    m = m.with_param("scalars", false);
                }
                m
            }
        };
        let remote = shards.iter().any(|s| s.data.is_none());
        TfRecordSource {
            shards,
            files,
            remote,
            manifest,
            options,
        }
    }

    /// What reading remote shards has cost so far (zero for local shards).
    pub fn io_stats(&self) -> IoSnapshot {
        self.files.as_ref().map(ShardSet::stats).unwrap_or_default()
    }

    /// The options the source was opened with.
    pub fn options(&self) -> &TfRecordOptions {
        &self.options
    }

    /// The index of shard `shard` (what [`write_index`] writes), from the offsets in memory.
    ///
    /// # Panics
    /// If `shard` is not below the number of shards.
    pub fn index_entries(&self, shard: usize) -> Vec<IndexEntry> {
        self.shards[shard]
            .offsets
            .windows(2)
            .map(|w| IndexEntry {
                offset: w[0],
                size: w[1] - w[0],
            })
            .collect()
    }

    /// The verified data of record `pos` of shard `s`, a view of the shard's bytes (or of the
    /// bytes fetched for it), and the frame's offset.
    fn record(&self, s: usize, pos: usize) -> Result<(u64, Bytes), Error> {
        let shard = &self.shards[s];
        let (start, end) = (shard.offsets[pos], shard.offsets[pos + 1]);
        let frame = match &shard.data {
            // Offsets were checked against the shard's length at open, so they fit in usize.
            Some(data) => data.slice(start as usize..end as usize),
            None => self.files().get_range(s, start..end)?,
        };
        let data = self.check_frame(shard, start, &frame)?;
        Ok((start, frame.slice(data)))
    }

    fn files(&self) -> &ShardSet {
        self.files
            .as_ref()
            .expect("only shards opened from paths are remote")
    }

    /// Checks the frame of a record at `start` of `shard`; returns where its data lies in
    /// `frame`.
    #[inline]
    fn check_frame(&self, shard: &Shard, start: u64, frame: &[u8]) -> Result<Range<usize>, Error> {
        let framing = self.options.framing();
        let header = frame.first_chunk::<HEADER_LEN>().ok_or_else(|| {
            Error::corrupt(
                &shard.name,
                start,
                "a record is shorter than its 12-byte header",
            )
        })?;
        let len = check_header(header, frame, start, &shard.name, &framing)?;
        if len + FRAME_OVERHEAD != frame.len() {
            // Only an index can disagree with a header; a scan made the offsets from them.
            return Err(Error::corrupt(
                &shard.name,
                start,
                format!(
                    "the index says this record takes {} bytes, its header says {len} + \
                     {FRAME_OVERHEAD}; the index is stale: rebuild it",
                    frame.len()
                ),
            ));
        }
        if self.options.verify_checksums {
            check_data(frame, start, &shard.name)?;
        }
        Ok(HEADER_LEN..HEADER_LEN + len)
    }

    /// The frames of remote records `places` ((shard, record) pairs), one shard's ranges per
    /// request batch (coalesced when read by range); `None` if a fetch fails (the sample path
    /// then reports it).
    fn fetch_frames(&self, places: &[(usize, usize)]) -> Option<Vec<Bytes>> {
        let mut by_shard: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for (i, &(s, _)) in places.iter().enumerate() {
            by_shard.entry(s).or_default().push(i);
        }
        let mut frames = vec![Bytes::new(); places.len()];
        for (s, rows) in by_shard {
            let shard = &self.shards[s];
            let range = |i: usize| {
                let pos = places[i].1;
                shard.offsets[pos]..shard.offsets[pos + 1]
            };
            match &shard.data {
                Some(data) => {
                    for i in rows {
                        let r = range(i);
                        frames[i] = data.slice(r.start as usize..r.end as usize);
                    }
                }
                None => {
                    let ranges: Vec<_> = rows.iter().map(|&i| range(i)).collect();
                    let got = self.files().get_ranges(s, &ranges).ok()?;
                    for (i, b) in rows.into_iter().zip(got) {
                        frames[i] = b;
                    }
                }
            }
        }
        Some(frames)
    }

    /// The columnar fast path ([`Source::collate`]): the records of `ids`, checked as
    /// [`Source::read`] checks them, parsed straight into batch columns
    /// ([`crate::example::collate_examples`]), or copied into one bytes column when raw.
    /// `None` for anything the sample path would report (an id out of range, a bad CRC, an
    /// odd record): the engine then reads the batch record by record, which gives the same
    /// error, or skips the record under `on_error = skip`.
    fn collate_records(&self, ids: &[u64], pool: &BufferPool) -> Option<Vec<(String, Column)>> {
        let places = ids
            .iter()
            .map(|&id| {
                let (s, pos) = self.manifest.locate(id)?;
                Some((s, pos as usize))
            })
            .collect::<Option<Vec<_>>>()?;
        if self.remote {
            let frames = self.fetch_frames(&places)?;
            let record = |i: usize| {
                let (s, pos) = places[i];
                let shard = &self.shards[s];
                let data = self
                    .check_frame(shard, shard.offsets[pos], &frames[i])
                    .ok()?;
                Some(&frames[i][data])
            };
            return self.collate_rows(ids.len(), record, pool);
        }
        let places: Vec<(&Shard, usize)> = places
            .into_iter()
            .map(|(s, pos)| (&self.shards[s], pos))
            .collect();
        // A shuffled batch's records lie all over the files, so each is a cache miss and,
        // with small pages, a TLB miss. Taken one after the other, each miss stalls the core
        // on its own (a third of the time of a shuffled epoch); touched a window at a time,
        // the misses overlap, and the window's records are still in cache (and its pages in
        // the TLB) when they are checked and parsed.
        let mut window = 0..0;
        let record = |i: usize| {
            if !window.contains(&i) {
                window = i..(i + TOUCH_WINDOW).min(places.len());
                touch(&places[window.clone()]);
            }
            let (shard, pos) = places[i];
            let data = shard.data.as_ref()?;
            let (start, end) = (shard.offsets[pos], shard.offsets[pos + 1]);
            let frame = &data[start as usize..end as usize];
            let range = self.check_frame(shard, start, frame).ok()?;
            Some(&frame[range])
        };
        self.collate_rows(ids.len(), record, pool)
    }

    fn collate_rows<'a>(
        &self,
        rows: usize,
        mut record: impl FnMut(usize) -> Option<&'a [u8]>,
        pool: &BufferPool,
    ) -> Option<Vec<(String, Column)>> {
        match &self.options.example {
            None => {
                let records = (0..rows).map(&mut record).collect::<Option<Vec<_>>>()?;
                let column = VarColumn::collect(pool, records.into_iter(), false);
                Some(vec![(RECORD_FIELD.to_owned(), Column::Var(column))])
            }
            Some(ex) => collate_examples(rows, record, ex, pool),
        }
    }
}

impl Source for TfRecordSource {
    fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Record `id`: its `tf.train.Example` decoded into fields, or one [`RECORD_FIELD`] bytes
    /// field. Fails with [`Error::Config`] if `id` is out of range, [`Error::Corrupt`] naming
    /// the shard and offset if a CRC does not match or the example does not decode.
    fn read(&self, id: u64) -> Result<Sample, Error> {
        let (s, pos) = self.manifest.locate_checked(id)?;
        let (start, data) = self.record(s, pos as usize)?;
        let shard = &self.shards[s];
        let key = key_of(&shard.stem, pos);
        match &self.options.example {
            None => Ok(Sample {
                index: id,
                key,
                fields: vec![(RECORD_FIELD.into(), Field::Bytes(data))],
            }),
            Some(ex) => decode_sample(id, key, &data, ex, &shard.name, start + HEADER_LEN as u64),
        }
    }

    /// The columnar path: the batch's records checked as [`Source::read`] checks them and
    /// parsed straight into the batch's columns, with no [`Sample`] per record. It never
    /// fails: a batch holding a record that the sample path would report (an id out of range,
    /// a bad CRC, a missing feature, another shape) or that this path does not take gets
    /// `None`, and the engine reads that batch record by record, so errors and
    /// `on_error = skip` are exactly the sample path's. (A dataset with a bad record in most
    /// batches therefore runs at the sample path's speed.)
    fn collate(
        &self,
        ids: &[u64],
        pool: &BufferPool,
    ) -> Option<Result<Vec<(String, Column)>, Error>> {
        self.collate_records(ids, pool).map(Ok)
    }

    /// Streams remote shards in the plan's shard order, with read-ahead, when the plan reads
    /// them in order; otherwise remote records are read by range.
    fn set_plan(&self, plan: &Plan) {
        if let (true, Some(files)) = (self.remote, &self.files) {
            match plan.shard_window() {
                Some(w) => files.set_order(&plan.shard_order(&self.manifest), w),
                None => files.set_order(&[], 1),
            }
        }
    }
}

/// How many records [`TfRecordSource`]'s columnar path touches ahead of checking them.
const TOUCH_WINDOW: usize = 128;
/// How much of each record's frame it touches (and the last byte, its CRC).
const TOUCH_BYTES: usize = 256;

/// Loads the first bytes and the last of each record's frame. The loads do not depend on each
/// other, so the core has many in flight at once.
fn touch(places: &[(&Shard, usize)]) {
    let mut touched = 0u8;
    for &(shard, pos) in places {
        let Some(data) = &shard.data else { continue };
        let (start, end) = (shard.offsets[pos], shard.offsets[pos + 1]);
        let frame = &data[start as usize..end as usize];
        for at in (0..frame.len().min(TOUCH_BYTES)).step_by(64) {
            touched ^= frame[at];
        }
        touched ^= frame.last().copied().unwrap_or(0);
    }
    std::hint::black_box(touched);
}

/// A sample's key, `<stem>/<pos>`, built without the formatting machinery (it is made for
/// every record read).
fn key_of(stem: &str, pos: u64) -> String {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut n = pos;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let mut key = String::with_capacity(stem.len() + 1 + digits.len() - i);
    key.push_str(stem);
    key.push('/');
    key.push_str(std::str::from_utf8(&digits[i..]).expect("ASCII digits"));
    key
}

fn check_options(options: &TfRecordOptions, shards: usize) -> Result<(), Error> {
    if shards == 0 {
        return Err(ConfigError::new("paths", "no TFRecord files given; pass at least one").into());
    }
    if let Some(ex) = &options.example {
        ex.validate()?;
    }
    Ok(())
}

fn gzip_error(name: &str) -> Error {
    ConfigError::new(
        "paths",
        format!(
            "{name} is GZIP-compressed, and compressed TFRecord files cannot be read at random, \
             which this source needs; stream it with tfrecord::TfRecordReader, or decompress \
             it (gunzip -k) and read the result"
        ),
    )
    .into()
}

/// `train-00003` for `data/train-00003.tfrecord`.
fn stem_of(name: &str) -> String {
    let file = name.rsplit(['/', '\\']).next().unwrap_or(name);
    match file.rfind('.') {
        Some(i) if i > 0 => file[..i].to_owned(),
        _ => file.to_owned(),
    }
}

/// Record offsets (and the end) by scanning the headers of `data`.
fn offsets_by_scan(data: &[u8], name: &str, options: &TfRecordOptions) -> Result<Vec<u64>, Error> {
    let entries = build_index(data, name, options.framing())?;
    let mut offsets: Vec<u64> = entries.iter().map(|e| e.offset).collect();
    offsets.push(data.len() as u64);
    Ok(offsets)
}

/// Record offsets (and the end) from an index, which must cover the shard exactly.
fn offsets_from_index(entries: &[IndexEntry], len: u64, index: &str) -> Result<Vec<u64>, Error> {
    let end = entries.last().map_or(0, |e| e.offset + e.size);
    if end != len {
        return Err(Error::corrupt(
            index,
            0,
            format!(
                "the index describes {} records in {end} bytes, but the shard is {len} bytes \
                 long; the index belongs to another version of the file: rebuild it",
                entries.len()
            ),
        ));
    }
    let mut offsets: Vec<u64> = entries.iter().map(|e| e.offset).collect();
    offsets.push(end);
    Ok(offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(records: &[&[u8]]) -> Vec<u8> {
        let mut w = TfRecordWriter::new(Vec::new());
        for r in records {
            w.write_record(r).unwrap();
        }
        w.into_inner().unwrap()
    }

    fn corrupt(e: Error) -> (String, u64, String) {
        match e {
            Error::Corrupt {
                uri,
                offset,
                reason,
            } => (uri, offset, reason),
            other => panic!("expected a corrupt error, got {other}"),
        }
    }

    fn all(input: &[u8], options: FramingOptions) -> Result<Vec<(u64, Vec<u8>)>, Error> {
        records(input, "mem", options)
            .map(|r| r.map(|r| (r.offset, input[r.data].to_vec())))
            .collect()
    }

    /// A reader that returns at most `step` bytes per call (and sometimes is interrupted).
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
        calls: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.calls += 1;
            if self.calls.is_multiple_of(5) {
                return Err(io::ErrorKind::Interrupted.into());
            }
            let n = self.step.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    fn streamed(input: &[u8], step: usize) -> Result<Vec<(u64, Vec<u8>)>, Error> {
        let trickle = Trickle {
            data: input,
            step,
            calls: 0,
        };
        TfRecordReader::new(trickle, "mem", FramingOptions::default())
            .map(|r| r.map(|(o, d)| (o, d.to_vec())))
            .collect()
    }

    #[test]
    fn masked_crc_matches_tensorflow() {
        // crc32c("123456789") is the standard check value; the mask is TensorFlow's.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(
            masked_crc32c(b"123456789"),
            0xe306_9283u32.rotate_right(15).wrapping_add(0xa282_ead8)
        );
        // The header of an empty record as TensorFlow writes it (testdata/tfrecord/raw.tfrecord).
        assert_eq!(
            masked_crc32c(&0u64.to_le_bytes()).to_le_bytes(),
            [0x29, 0x03, 0x98, 0x07]
        );
        assert_eq!(masked_crc32c(b""), 0xa282_ead8);
    }

    #[test]
    fn writes_and_reads_records() {
        let big = vec![7u8; 300_000];
        let recs: Vec<&[u8]> = vec![b"", b"x", b"hello world", &big];
        let bytes = framed(&recs);
        assert_eq!(bytes.len(), 12 + 300_000 + 4 * FRAME_OVERHEAD);
        let got = all(&bytes, FramingOptions::default()).unwrap();
        let offsets: Vec<u64> = got.iter().map(|(o, _)| *o).collect();
        assert_eq!(offsets, [0, 16, 33, 60]);
        let datas: Vec<&[u8]> = got.iter().map(|(_, d)| d.as_slice()).collect();
        assert_eq!(datas, recs);
        let index = build_index(&bytes, "mem", FramingOptions::default()).unwrap();
        let sizes: Vec<u64> = index.iter().map(|e| e.size).collect();
        assert_eq!(sizes, [16, 17, 27, 300_016]);
        assert_eq!(index[3].offset, 60);
        // The writer's own entries are the same index.
        let mut w = TfRecordWriter::new(Vec::new());
        let entries: Vec<IndexEntry> = recs.iter().map(|r| w.write_record(r).unwrap()).collect();
        assert_eq!(entries, index);
        assert_eq!((w.records(), w.bytes_written()), (4, bytes.len() as u64));
        assert_eq!(w.get_ref().len(), bytes.len());
        assert!(all(&[], FramingOptions::default()).unwrap().is_empty());
    }

    #[test]
    fn the_decoder_asks_for_what_it_needs() {
        let bytes = framed(&[b"abc", b"defg"]);
        let mut d = RecordDecoder::new("mem", FramingOptions::default());
        let mut needs = Vec::new();
        let mut start = 0;
        let mut got = Vec::new();
        // Feed one more byte at a time, as a slow network would.
        for end in 0..=bytes.len() {
            match d.decode(&bytes[start..end]).unwrap() {
                Frame::Incomplete { needed } => needs.push(needed),
                Frame::Record(r) => {
                    assert_eq!(r.framed_len(), end - start);
                    got.push((r.offset, bytes[start..end][r.data].to_vec()));
                    start = end;
                }
            }
        }
        d.finish(&bytes[start..]).unwrap();
        assert_eq!(got, [(0, b"abc".to_vec()), (19, b"defg".to_vec())]);
        assert_eq!((d.position(), d.records(), d.origin()), (39, 2, "mem"));
        // 12 until the header is in, then the whole frame.
        assert_eq!(needs.iter().filter(|&&n| n == 12).count(), 12 + 11);
        assert_eq!(needs.iter().filter(|&&n| n == 19).count(), 7);
        assert_eq!(needs.iter().filter(|&&n| n == 20).count(), 8);
        // A decoder can start mid-stream.
        let mut d = RecordDecoder::new("mem", FramingOptions::default()).at(19);
        let Frame::Record(r) = d.decode(&bytes[19..]).unwrap() else {
            panic!()
        };
        assert_eq!(r.offset, 19);
        assert_eq!(d.options(), FramingOptions::default());
    }

    #[test]
    fn corruption_is_reported_at_the_record() {
        let bytes = framed(&[b"first", b"second record"]);
        // Byte 21 is the second record's length; 29..33 its length crc; 33.. its data.
        let mut bad = bytes.clone();
        bad[21] ^= 1;
        let (uri, offset, reason) = corrupt(all(&bad, FramingOptions::default()).unwrap_err());
        assert_eq!((uri.as_str(), offset), ("mem", 21));
        assert!(
            reason.starts_with("length crc mismatch")
                && reason.contains("corrupt or not a TFRecord"),
            "{reason}"
        );
        let mut bad = bytes.clone();
        bad[40] ^= 1;
        let (_, offset, reason) = corrupt(all(&bad, FramingOptions::default()).unwrap_err());
        assert_eq!(offset, 21);
        assert!(
            reason.starts_with("data crc mismatch in a record of 13 bytes"),
            "{reason}"
        );
        // Without verification the flipped data byte reads through.
        let off = FramingOptions {
            verify_checksums: false,
            ..Default::default()
        };
        assert_eq!(all(&bad, off).unwrap()[1].1, b"second secord");
        // The first record is still delivered before the error.
        let mut it = records(&bad, "mem", FramingOptions::default());
        assert!(it.next().unwrap().is_ok());
        assert!(it.next().unwrap().is_err());
        assert!(it.next().is_none());
    }

    #[test]
    fn truncation_says_what_is_missing() {
        let bytes = framed(&[b"first", &[9u8; 1000]]);
        let msg = |cut: usize| corrupt(all(&bytes[..cut], FramingOptions::default()).unwrap_err());
        let (_, offset, reason) = msg(21 + 5);
        assert_eq!(offset, 21);
        assert!(
            reason.starts_with("truncated record header: 5 of its 12 bytes present"),
            "{reason}"
        );
        let (_, offset, reason) = msg(21 + 12 + 12);
        assert_eq!(offset, 21);
        assert!(
            reason.starts_with("truncated record: 1000 bytes declared, 12 present"),
            "{reason}"
        );
        assert!(reason.contains("cut short"), "{reason}");
        let (_, _, reason) = msg(bytes.len() - 1);
        assert!(
            reason.contains("1 of the 4 bytes of its data crc are missing"),
            "{reason}"
        );
        // Every cut is a clean prefix or an error; never a panic, never garbage.
        for cut in 0..bytes.len() {
            match all(&bytes[..cut], FramingOptions::default()) {
                Ok(v) => assert!(cut == 0 || cut == 21, "cut {cut} read {} records", v.len()),
                Err(e) => assert!(e.to_string().starts_with("mem at byte")),
            }
        }
    }

    #[test]
    fn hostile_lengths_never_allocate() {
        // A header declaring 2^63 bytes with a valid crc.
        let mut bytes = (1u64 << 63).to_le_bytes().to_vec();
        bytes.extend(masked_crc32c(&bytes).to_le_bytes());
        let (_, offset, reason) = corrupt(all(&bytes, FramingOptions::default()).unwrap_err());
        assert_eq!(offset, 0);
        assert!(
            reason.contains("more than max_record_bytes (1073741824)"),
            "{reason}"
        );
        // Within the limit, with checks off: the decoder asks for the bytes and allocates none.
        let mut bytes = (100u64 << 20).to_le_bytes().to_vec();
        bytes.extend([0; 4]);
        let off = FramingOptions {
            verify_checksums: false,
            ..Default::default()
        };
        let mut d = RecordDecoder::new("mem", off);
        assert_eq!(
            d.decode(&bytes).unwrap(),
            Frame::Incomplete {
                needed: (100 << 20) + 16
            }
        );
        let (_, _, reason) = corrupt(all(&bytes, off).unwrap_err());
        assert!(
            reason.starts_with("truncated record: 104857600 bytes declared, 0 present"),
            "{reason}"
        );
        // The streaming reader grows its buffer only as bytes arrive.
        let mut r = TfRecordReader::new(&bytes[..], "mem", off);
        assert!(r.next().unwrap().is_err());
        assert!(r.buf.capacity() <= 2 * READ_CHUNK, "{}", r.buf.capacity());
        assert!(r.next().is_none());
        // A small limit.
        let small = FramingOptions {
            max_record_bytes: 4,
            ..Default::default()
        };
        assert!(all(&framed(&[b"1234"]), small).is_ok());
        assert!(all(&framed(&[b"12345"]), small).is_err());
    }

    #[test]
    fn compressed_files_get_a_hint() {
        let gz = gzip(&framed(&[b"abc"]));
        let (_, _, reason) = corrupt(all(&gz, FramingOptions::default()).unwrap_err());
        assert!(reason.contains("GZIP-compressed"), "{reason}");
        assert!(looks_gzip(&gz));
        assert!(!looks_gzip(&framed(&[b"abc"])));
        // A TFRecord whose length happens to start with GZIP's magic bytes is still TFRecord.
        let tricky = framed(&[&vec![0u8; 0x08_8b1f]]);
        assert!(tricky.starts_with(&GZIP_MAGIC) && !looks_gzip(&tricky));
        let mut z = vec![0x78, 0x9c];
        z.extend([0; 20]);
        let (_, _, reason) = corrupt(all(&z, FramingOptions::default()).unwrap_err());
        assert!(reason.contains("ZLIB"), "{reason}");
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn streaming_agrees_with_slices() {
        let big = vec![3u8; 700_000];
        let recs: Vec<&[u8]> = vec![b"a", b"", &big, b"tail"];
        let bytes = framed(&recs);
        let want = all(&bytes, FramingOptions::default()).unwrap();
        for step in [1, 7, 4096, usize::MAX] {
            assert_eq!(streamed(&bytes, step).unwrap(), want, "step {step}");
        }
        // Truncated and corrupt streams fail like slices do.
        for cut in [5, 20, bytes.len() - 3] {
            let e = streamed(&bytes[..cut], 3).unwrap_err();
            let s = all(&bytes[..cut], FramingOptions::default()).unwrap_err();
            assert_eq!(e.to_string(), s.to_string());
        }
        // Records stay valid while the reader moves on.
        let mut r = TfRecordReader::new(&bytes[..], "mem", FramingOptions::default());
        let first = r.next().unwrap().unwrap();
        let rest: Vec<_> = r.by_ref().collect::<Result<_, _>>().unwrap();
        assert_eq!((first.0, &first.1[..]), (0, &b"a"[..]));
        assert_eq!(rest.len(), 3);
        assert_eq!((r.position(), r.records()), (bytes.len() as u64, 4));
    }

    #[test]
    fn gzip_files_stream() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("a.tfrecord");
        let gz = dir.path().join("a.tfrecord.gz");
        let noext = dir.path().join("gz-without-extension");
        let recs: Vec<Vec<u8>> = (0..50u32)
            .map(|i| vec![i as u8; i as usize * 300])
            .collect();
        for (path, opts) in [
            (&plain, WriterOptions::default()),
            (
                &gz,
                WriterOptions {
                    gzip: true,
                    index: false,
                },
            ),
        ] {
            let mut w = TfRecordFileWriter::create(path, opts).unwrap();
            for r in &recs {
                w.write_record(r).unwrap();
            }
            assert_eq!(w.finish().unwrap(), 50);
        }
        // Two GZIP members back to back, as `cat a.gz b.gz` makes.
        let member = std::fs::read(&gz).unwrap();
        std::fs::write(&noext, [member.clone(), member].concat()).unwrap();
        let read = |path: &Path, c: Compression| -> Result<Vec<Vec<u8>>, Error> {
            TfRecordReader::open(path, c, FramingOptions::default())?
                .map(|r| r.map(|(_, d)| d.to_vec()))
                .collect()
        };
        assert_eq!(read(&plain, Compression::Auto).unwrap(), recs);
        assert_eq!(read(&plain, Compression::None).unwrap(), recs);
        assert_eq!(read(&gz, Compression::Auto).unwrap(), recs);
        assert_eq!(read(&gz, Compression::Gzip).unwrap(), recs);
        assert_eq!(
            read(&noext, Compression::Auto).unwrap(),
            [recs.clone(), recs.clone()].concat()
        );
        // Read plainly, a GZIP file is not TFRecord, and the error says why.
        let e = read(&gz, Compression::None).unwrap_err().to_string();
        assert!(e.contains("GZIP-compressed"), "{e}");
        // A corrupt or cut GZIP stream is corruption in that file.
        let bytes = std::fs::read(&gz).unwrap();
        std::fs::write(&gz, &bytes[..bytes.len() / 2]).unwrap();
        let e = read(&gz, Compression::Auto).unwrap_err();
        assert!(
            matches!(&e, Error::Corrupt { uri, .. } if uri.ends_with("a.tfrecord.gz")),
            "{e}"
        );
        let mut bad = bytes.clone();
        bad[bytes.len() / 2] ^= 0xff;
        std::fs::write(&gz, &bad).unwrap();
        assert!(read(&gz, Compression::Auto).is_err());
        let e = TfRecordReader::open(
            dir.path().join("missing"),
            Compression::Auto,
            FramingOptions::default(),
        )
        .unwrap_err();
        assert!(matches!(e, Error::Io { .. }));
    }

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

    fn source(paths: &[&Path], options: TfRecordOptions) -> Result<TfRecordSource, Error> {
        TfRecordSource::open(paths, options)
    }

    fn raw() -> TfRecordOptions {
        TfRecordOptions {
            example: None,
            ..Default::default()
        }
    }

    fn record_of(s: &Sample) -> &[u8] {
        match s.get(RECORD_FIELD) {
            Some(Field::Bytes(b)) => b,
            other => panic!("expected a record field, got {other:?}"),
        }
    }

    #[test]
    fn the_source_reads_records_by_id() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.tfrecord");
        let b = dir.path().join("b.tfrecord");
        let empty = dir.path().join("empty.tfrecord");
        std::fs::write(&a, framed(&[b"a0", b"a1", b"a2"])).unwrap();
        std::fs::write(&b, framed(&[b"b0", b""])).unwrap();
        std::fs::write(&empty, b"").unwrap();
        for mode in [IndexMode::Auto, IndexMode::Scan] {
            let src = source(
                &[&a, &empty, &b],
                TfRecordOptions {
                    index: mode,
                    ..raw()
                },
            )
            .unwrap();
            let m = src.manifest();
            assert_eq!(m.format, "tfrecord");
            assert_eq!(m.params["records"], "raw");
            assert_eq!(m.total_samples(), 5);
            let counts: Vec<(u64, u64)> = m.shards.iter().map(|s| (s.samples, s.bytes)).collect();
            assert_eq!(counts, [(3, 54), (0, 0), (2, 34)]);
            let got: Vec<(String, Vec<u8>)> = (0..5)
                .map(|id| {
                    let s = src.read(id).unwrap();
                    assert_eq!(s.index, id);
                    (s.key.clone(), record_of(&s).to_vec())
                })
                .collect();
            let want: Vec<(String, Vec<u8>)> = [
                ("a/0", "a0"),
                ("a/1", "a1"),
                ("a/2", "a2"),
                ("b/0", "b0"),
                ("b/1", ""),
            ]
            .iter()
            .map(|(k, d)| (k.to_string(), d.as_bytes().to_vec()))
            .collect();
            assert_eq!(got, want);
            assert!(matches!(src.read(5), Err(Error::Config(_))));
            assert_eq!(
                src.index_entries(0),
                build_index(&std::fs::read(&a).unwrap(), "a", FramingOptions::default()).unwrap()
            );
            assert!(format!("{src:?}").contains("a.tfrecord"));
        }
        // Zero-copy: a record is a view of the file's map, not a copy.
        let src = source(&[&a], raw()).unwrap();
        let s1 = src.read(1).unwrap();
        let s2 = src.read(2).unwrap();
        assert_eq!(
            record_of(&s2).as_ptr() as usize - record_of(&s1).as_ptr() as usize,
            18
        );
    }

    #[test]
    fn the_source_uses_and_checks_index_files() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.tfrecord");
        let bytes = framed(&[b"r0", b"r1", b"r2"]);
        std::fs::write(&a, &bytes).unwrap();
        let e = source(
            &[&a],
            TfRecordOptions {
                index: IndexMode::Require,
                ..raw()
            },
        )
        .unwrap_err();
        assert!(
            matches!(&e, Error::Config(c) if c.option == "index" && c.reason.contains("a.tfrecord.idx")),
            "{e}"
        );

        let idx = index_path(&a);
        write_index(
            &idx,
            &build_index(&bytes, "a", FramingOptions::default()).unwrap(),
        )
        .unwrap();
        for mode in [IndexMode::Auto, IndexMode::Require] {
            let src = source(
                &[&a],
                TfRecordOptions {
                    index: mode,
                    ..raw()
                },
            )
            .unwrap();
            assert_eq!(record_of(&src.read(2).unwrap()), b"r2");
        }
        // An index that covers another length of file is refused at open, naming the index.
        std::fs::write(&idx, "0 18\n18 18\n").unwrap();
        let (uri, _, reason) = corrupt(source(&[&a], raw()).unwrap_err());
        assert!(
            uri.ends_with("a.tfrecord.idx") && reason.contains("rebuild"),
            "{uri}: {reason}"
        );
        // Scan mode ignores it.
        assert!(
            source(
                &[&a],
                TfRecordOptions {
                    index: IndexMode::Scan,
                    ..raw()
                }
            )
            .is_ok()
        );
        // One that tiles the file differently is caught when the record is read.
        std::fs::write(&idx, "0 17\n17 19\n36 18\n").unwrap();
        let src = source(&[&a], raw()).unwrap();
        let (uri, offset, reason) = corrupt(src.read(0).unwrap_err());
        assert!(uri.ends_with("a.tfrecord") && offset == 0, "{uri} {offset}");
        assert!(reason.contains("the index is stale"), "{reason}");
        assert!(src.read(2).is_ok());
        std::fs::write(&idx, "0 x\n").unwrap();
        let (uri, _, reason) = corrupt(source(&[&a], raw()).unwrap_err());
        assert!(
            uri.ends_with(".idx") && reason.contains("line 1"),
            "{reason}"
        );
    }

    #[test]
    fn the_source_reports_bad_records_one_by_one() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.tfrecord");
        let mut bytes = framed(&[b"good", b"bad!", b"good"]);
        bytes[20 + 12] ^= 0x20; // the second record's data
        std::fs::write(&a, &bytes).unwrap();
        let src = source(&[&a], raw()).unwrap();
        assert!(src.read(0).is_ok() && src.read(2).is_ok());
        let (uri, offset, reason) = corrupt(src.read(1).unwrap_err());
        assert_eq!((uri, offset), (a.display().to_string(), 20));
        assert!(reason.contains("data crc mismatch"), "{reason}");
        let off = source(
            &[&a],
            TfRecordOptions {
                verify_checksums: false,
                ..raw()
            },
        )
        .unwrap();
        assert_eq!(record_of(&off.read(1).unwrap()), b"Bad!");
        // A broken header cannot be stepped over: the shard fails to open.
        bytes[20] ^= 1;
        std::fs::write(&a, &bytes).unwrap();
        let (_, offset, reason) = corrupt(source(&[&a], raw()).unwrap_err());
        assert_eq!(offset, 20);
        assert!(reason.starts_with("length crc mismatch"), "{reason}");
    }

    #[test]
    fn the_source_refuses_gzip_and_bad_options() {
        let dir = tempfile::tempdir().unwrap();
        let gz = dir.path().join("a.tfrecord.gz");
        let hidden = dir.path().join("b.tfrecord");
        std::fs::write(&gz, gzip(&framed(&[b"x"]))).unwrap();
        std::fs::write(&hidden, gzip(&framed(&[b"x"]))).unwrap();
        for p in [&gz, &hidden] {
            let e = source(&[p], raw()).unwrap_err();
            let Error::Config(c) = &e else { panic!("{e}") };
            assert_eq!(c.option, "paths");
            assert!(
                c.reason.contains("GZIP-compressed") && c.reason.contains("TfRecordReader"),
                "{e}"
            );
        }
        let none: &[&Path] = &[];
        assert!(matches!(source(none, raw()), Err(Error::Config(c)) if c.option == "paths"));
        let bad = TfRecordOptions {
            example: Some(ExampleOptions {
                features: Some(vec![]),
                scalars: true,
            }),
            ..Default::default()
        };
        assert!(matches!(source(&[&hidden], bad), Err(Error::Config(c)) if c.option == "features"));
        let missing = dir.path().join("missing.tfrecord");
        assert!(matches!(source(&[&missing], raw()), Err(Error::Io { .. })));
        assert!(
            TfRecordSource::from_bytes(vec![("g".into(), Bytes::from(gzip(b"x")))], raw()).is_err()
        );
        assert!(TfRecordSource::from_bytes(vec![], raw()).is_err());
        let require = TfRecordOptions {
            index: IndexMode::Require,
            ..raw()
        };
        assert!(TfRecordSource::from_bytes(vec![("m".into(), Bytes::new())], require).is_err());
    }

    #[test]
    fn the_source_decodes_examples() {
        use crate::example::{Example, Feature};
        let mut recs = Vec::new();
        for i in 0..4i64 {
            let mut ex = Example::default();
            ex.insert("label", Feature::Int64(vec![i]));
            ex.insert("text", Feature::Bytes(vec![Bytes::from(format!("n{i}"))]));
            recs.push(ex.encode());
        }
        recs[3] = b"\x0a\x05oops".to_vec(); // framed fine, not an Example
        let refs: Vec<&[u8]> = recs.iter().map(Vec::as_slice).collect();
        let bytes = Bytes::from(framed(&refs));
        let opts = TfRecordOptions {
            example: Some(ExampleOptions {
                features: Some(vec!["text".into()]),
                scalars: false,
            }),
            ..Default::default()
        };
        let src = TfRecordSource::from_bytes(
            vec![("mem://x/shard.tfrecord".into(), bytes.clone())],
            opts,
        )
        .unwrap();
        let m = src.manifest();
        assert_eq!(m.params["records"], "example");
        assert_eq!(m.params["features"].to_string(), r#"["text"]"#);
        assert_eq!(m.params["scalars"], false);
        let s = src.read(1).unwrap();
        assert_eq!(s.key, "shard/1");
        assert_eq!(s.fields.len(), 1);
        assert!(matches!(s.get("text"), Some(Field::Bytes(b)) if &b[..] == b"n1"));
        let (uri, offset, reason) = corrupt(src.read(3).unwrap_err());
        let record_start = bytes.len() as u64 - 16 - 6;
        assert_eq!(uri, "mem://x/shard.tfrecord");
        assert_eq!(offset, record_start + 12 + 1); // the length that runs past the end
        assert!(
            reason.contains(&format!("data starts at byte {}", record_start + 12)),
            "{reason}"
        );
        assert_eq!(src.options().index, IndexMode::Auto);
    }

    #[test]
    fn file_writer_renames_on_finish_and_cleans_up_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.tfrecord");
        let mut w = TfRecordFileWriter::create(
            &path,
            WriterOptions {
                gzip: false,
                index: true,
            },
        )
        .unwrap();
        w.write_record(b"one").unwrap();
        w.write_sample(&Sample::new(0).with("x", Field::Bytes(Bytes::from_static(b"2"))))
            .unwrap();
        assert_eq!((w.records(), w.path()), (2, path.as_path()));
        assert!(dir.path().join("w.tfrecord.tmp").exists() && !path.exists());
        assert_eq!(w.finish().unwrap(), 2);
        assert!(!dir.path().join("w.tfrecord.tmp").exists());
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(
            read_index(&index_path(&path)).unwrap(),
            build_index(&bytes, "w", FramingOptions::default()).unwrap()
        );
        // Rewriting without an index removes the old one, which no longer fits.
        let w = TfRecordFileWriter::create(&path, WriterOptions::default()).unwrap();
        assert_eq!(w.finish().unwrap(), 0);
        assert!(!index_path(&path).exists());
        assert_eq!(std::fs::read(&path).unwrap(), b"");
        // Dropped unfinished: nothing new is left behind.
        let mut w =
            TfRecordFileWriter::create(dir.path().join("x.tfrecord"), WriterOptions::default())
                .unwrap();
        w.write_record(b"partial").unwrap();
        drop(w);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["w.tfrecord"]);
        let e = TfRecordFileWriter::create(
            &path,
            WriterOptions {
                gzip: true,
                index: true,
            },
        )
        .unwrap_err();
        assert!(matches!(e, Error::Config(c) if c.option == "index"));
        let e = TfRecordFileWriter::create(
            dir.path().join("no/such/dir.tfrecord"),
            WriterOptions::default(),
        )
        .unwrap_err();
        assert!(
            matches!(&e, Error::Io { path, .. } if path.ends_with("dir.tfrecord.tmp")),
            "{e}"
        );
    }

    #[test]
    fn stems_make_keys() {
        assert_eq!(stem_of("data/train-00003.tfrecord"), "train-00003");
        assert_eq!(stem_of("c:\\d\\x.tfrecords"), "x");
        assert_eq!(stem_of("mem://shard-under-test"), "shard-under-test");
        assert_eq!(stem_of(".hidden"), ".hidden");
        assert_eq!(stem_of("a.b.c"), "a.b");
        for pos in [0, 7, 10, 99, 12345, u64::MAX] {
            assert_eq!(key_of("train", pos), format!("train/{pos}"));
        }
    }

    // The columnar path against the sample path.

    use crate::example::{Example, Feature};
    use chute_core::{DType, SampleRng};

    /// A column, comparable: a tensor's dtype, shape and bytes, or byte strings.
    #[derive(Debug, PartialEq)]
    enum Col {
        Tensor(DType, Vec<usize>, Vec<u8>),
        Var(Vec<Vec<u8>>),
    }

    fn comparable(columns: Vec<(String, Column)>) -> Vec<(String, Col)> {
        columns
            .into_iter()
            .map(|(name, c)| {
                let col = match c {
                    Column::Tensor(t) => {
                        Col::Tensor(t.dtype(), t.shape().to_vec(), t.as_bytes().to_vec())
                    }
                    Column::Var(v) => {
                        assert!(!v.text);
                        Col::Var((0..v.len()).map(|i| v.get(i).to_vec()).collect())
                    }
                    other => panic!("{other:?}"),
                };
                (name, col)
            })
            .collect()
    }

    /// The batch the engine's sample path builds from `ids`: each record read, then collated
    /// as `chute_pipeline` collates (columns named after the first sample's fields, arrays of
    /// one shape and dtype stacked, byte strings gathered). `None` where that path fails: a
    /// read fails, or the samples' fields differ in names, kinds, dtypes or shapes.
    fn by_reads(src: &TfRecordSource, ids: &[u64]) -> Option<Vec<(String, Col)>> {
        let samples = ids
            .iter()
            .map(|&id| src.read(id).ok())
            .collect::<Option<Vec<_>>>()?;
        let first = &samples[0];
        if samples.iter().any(|s| s.fields.len() != first.fields.len()) {
            return None;
        }
        let mut out = Vec::new();
        for (name, field) in &first.fields {
            let col = match field {
                Field::Array(a) => {
                    let mut data = Vec::new();
                    for s in &samples {
                        match s.get(name) {
                            Some(Field::Array(b)) if b.dtype == a.dtype && b.shape == a.shape => {
                                data.extend_from_slice(&b.data)
                            }
                            _ => return None,
                        }
                    }
                    let shape = [&[ids.len()][..], &a.shape].concat();
                    Col::Tensor(a.dtype, shape, data)
                }
                Field::Bytes(_) => Col::Var(
                    samples
                        .iter()
                        .map(|s| match s.get(name) {
                            Some(Field::Bytes(b)) => Some(b.to_vec()),
                            _ => None,
                        })
                        .collect::<Option<_>>()?,
                ),
                other => panic!("{other:?}"),
            };
            out.push((name.to_string(), col));
        }
        Some(out)
    }

    fn by_columns(src: &TfRecordSource, ids: &[u64]) -> Option<Vec<(String, Col)>> {
        let columns = src.collate(ids, &BufferPool::new(8))?;
        Some(comparable(
            columns.expect("the columnar path never fails: it falls back"),
        ))
    }

    /// One feature as a serialized Example of its own: records made by concatenating such
    /// pieces are valid Examples (protobuf merges the `features` maps), in any entry order.
    fn piece(name: &str, f: Feature) -> Vec<u8> {
        let mut ex = Example::default();
        ex.insert(name, f);
        ex.encode()
    }

    /// A record of the features every record of `random_records` has, in a random order,
    /// sometimes with a feature written twice (the last one counts).
    fn random_record(rng: &mut SampleRng) -> Vec<u8> {
        let mut int = || rng.next_u64() as i64 >> rng.below(64);
        let label = int();
        let ids = vec![int(), int(), -1];
        let mut pieces = vec![
            piece("label", Feature::Int64(vec![label])),
            piece("ids", Feature::Int64(ids)),
            piece("empty", Feature::Float(vec![])),
        ];
        let x: Vec<f32> = (0..8).map(|_| rng.next_f64() as f32 - 0.5).collect();
        pieces.push(piece("x", Feature::Float(x)));
        pieces.push(piece(
            "w",
            Feature::Float(vec![f32::from_bits(rng.next_u64() as u32)]),
        ));
        let b: Vec<u8> = (0..rng.below(20)).map(|_| rng.next_u64() as u8).collect();
        pieces.push(piece("b", Feature::Bytes(vec![Bytes::from(b)])));
        for i in (1..pieces.len()).rev() {
            pieces.swap(i, rng.below(i as u64 + 1) as usize);
        }
        if rng.chance(0.2) {
            let stale = piece("label", Feature::Int64(vec![label ^ 1]));
            pieces.insert(0, stale);
        }
        pieces.concat()
    }

    fn source_of(records: &[Vec<u8>], options: TfRecordOptions) -> TfRecordSource {
        let half = records.len() / 2;
        let shards = [&records[..half], &records[half..]]
            .iter()
            .enumerate()
            .map(|(i, recs)| {
                let refs: Vec<&[u8]> = recs.iter().map(Vec::as_slice).collect();
                (format!("mem://s{i}.tfrecord"), Bytes::from(framed(&refs)))
            })
            .collect();
        TfRecordSource::from_bytes(shards, options).unwrap()
    }

    fn with_example(features: Option<&[&str]>, scalars: bool) -> TfRecordOptions {
        TfRecordOptions {
            example: Some(ExampleOptions {
                features: features.map(|f| f.iter().map(|s| s.to_string()).collect()),
                scalars,
            }),
            ..Default::default()
        }
    }

    fn random_ids(rng: &mut SampleRng, total: u64, n: usize) -> Vec<u64> {
        (0..n).map(|_| rng.below(total)).collect()
    }

    #[test]
    fn the_columnar_path_gives_the_sample_paths_batches() {
        let mut rng = SampleRng::from_key(7);
        let records: Vec<Vec<u8>> = (0..300).map(|_| random_record(&mut rng)).collect();
        let all: Vec<u64> = (0..300).collect();
        let options = [
            with_example(None, true),
            with_example(None, false),
            with_example(Some(&["x", "label", "b"]), true),
            with_example(Some(&["b"]), true),
            with_example(Some(&["empty", "w", "ids"]), false),
            raw(),
        ];
        for opts in options {
            let src = source_of(&records, opts.clone());
            let mut batches = vec![all.clone(), vec![299], vec![5, 5, 5], all[150..].to_vec()];
            for n in [1, 7, 64, 200, 300] {
                batches.push(random_ids(&mut rng, 300, n));
            }
            for ids in &batches {
                let fast = by_columns(&src, ids);
                assert!(fast.is_some(), "{opts:?}: fell back on well-formed records");
                assert_eq!(fast, by_reads(&src, ids), "{opts:?} {ids:?}");
            }
            let got = by_columns(&src, &[3, 1]).unwrap();
            let names: Vec<String> = got.into_iter().map(|(n, _)| n).collect();
            let want: Vec<String> = match &opts.example {
                None => vec![RECORD_FIELD.into()],
                Some(ExampleOptions {
                    features: Some(f), ..
                }) => f.clone(),
                Some(_) => ["b", "empty", "ids", "label", "w", "x"]
                    .map(String::from)
                    .to_vec(),
            };
            assert_eq!(names, want);
            // Out-of-range ids are the sample path's to report.
            assert!(src.collate(&[0, 300], &BufferPool::new(1)).is_none());
        }
        // Scalars, lists, empty lists and byte strings, shaped as the sample path shapes them.
        let src = source_of(&records, with_example(None, true));
        let shapes: Vec<(String, Vec<usize>)> = by_columns(&src, &[4, 2])
            .unwrap()
            .into_iter()
            .map(|(n, c)| match c {
                Col::Tensor(_, shape, _) => (n, shape),
                Col::Var(v) => (n, vec![v.len()]),
            })
            .collect();
        let want = [
            ("b", [2].as_slice()),
            ("empty", &[2, 0]),
            ("ids", &[2, 3]),
            ("label", &[2]),
            ("w", &[2]),
            ("x", &[2, 8]),
        ];
        assert_eq!(shapes, want.map(|(n, s)| (n.to_string(), s.to_vec())));
    }

    #[test]
    fn records_the_columnar_path_cannot_take_fall_back_to_the_sample_path() {
        let mut rng = SampleRng::from_key(11);
        let good: Vec<Vec<u8>> = (0..20).map(|_| random_record(&mut rng)).collect();
        // An Example with every feature but `label`.
        let mut no_label = Example::default();
        no_label.insert("x", Feature::Float(vec![0.0; 8]));
        let mut bad_name = piece("n", Feature::Int64(vec![1]));
        let n_at = bad_name.iter().position(|&c| c == b'n').unwrap();
        bad_name[n_at] = 0xff;
        // Whole records, or pieces appended to a good record (where the last entry wins).
        let odd: Vec<(&str, bool, Vec<u8>)> = vec![
            ("no label", true, no_label.encode()),
            ("not an Example", true, b"\x0a\x05oops".to_vec()),
            (
                "a longer x",
                false,
                piece("x", Feature::Float(vec![0.0; 9])),
            ),
            (
                "label as a float",
                false,
                piece("label", Feature::Float(vec![1.0])),
            ),
            ("b as an int", false, piece("b", Feature::Int64(vec![1]))),
            (
                "two byte strings",
                false,
                piece("b", Feature::Bytes(vec![Bytes::new(), Bytes::new()])),
            ),
            (
                "an extra feature",
                false,
                piece("extra", Feature::Int64(vec![1])),
            ),
            ("a non-UTF-8 name", false, bad_name),
        ];
        for (what, whole, odd) in odd {
            let mut records = good.clone();
            // The odd record is record 13: in the middle of a batch, or its first record.
            records[13] = if whole {
                odd
            } else {
                [good[13].clone(), odd].concat()
            };
            let src = source_of(&records, with_example(None, true));
            for ids in [vec![12, 13, 14], vec![13, 12, 14]] {
                assert_eq!(by_reads(&src, &ids), None, "{what}");
                assert_eq!(by_columns(&src, &ids), None, "{what}");
            }
            assert!(by_columns(&src, &[12, 14]).is_some(), "{what}");
            // Projected, the features left out do not matter; the ones kept do.
            let src = source_of(&records, with_example(Some(&["ids", "w"]), true));
            let fast = by_columns(&src, &[12, 13]);
            assert_eq!(fast, by_reads(&src, &[12, 13]), "{what}");
            let kept_intact = matches!(
                what,
                "a longer x"
                    | "label as a float"
                    | "b as an int"
                    | "two byte strings"
                    | "an extra feature"
            );
            assert_eq!(fast.is_some(), kept_intact, "{what}");
        }
    }

    #[test]
    fn bad_records_fall_back_so_the_sample_path_reports_them() {
        let mut rng = SampleRng::from_key(3);
        let records: Vec<Vec<u8>> = (0..10).map(|_| random_record(&mut rng)).collect();
        let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
        let mut bytes = framed(&refs);
        let at = bytes.len() - 20; // the last record's data
        bytes[at] ^= 0x40;
        let shards = || vec![("mem://bad.tfrecord".to_string(), Bytes::from(bytes.clone()))];
        let src = TfRecordSource::from_bytes(shards(), with_example(None, true)).unwrap();
        assert!(by_columns(&src, &[0, 8]).is_some());
        assert!(src.collate(&[0, 9], &BufferPool::new(1)).is_none());
        let (uri, offset, reason) = corrupt(src.read(9).unwrap_err());
        let last = bytes.len() - records[9].len() - FRAME_OVERHEAD;
        assert_eq!((uri.as_str(), offset), ("mem://bad.tfrecord", last as u64));
        assert!(reason.contains("data crc mismatch"), "{reason}");
        // Unchecked, the flipped byte is read as it is, the same on both paths.
        let unchecked = TfRecordOptions {
            verify_checksums: false,
            ..with_example(None, true)
        };
        let src = TfRecordSource::from_bytes(shards(), unchecked).unwrap();
        let ids = [9, 0, 9];
        if let Some(fast) = by_columns(&src, &ids) {
            assert_eq!(Some(fast), by_reads(&src, &ids));
        } else {
            assert_eq!(by_reads(&src, &ids), None);
        }
    }
}
