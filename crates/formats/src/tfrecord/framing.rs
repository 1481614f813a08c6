//! The record framing: TensorFlow's masked CRC-32C and the sans-IO [`RecordDecoder`], with
//! [`records`] over an in-memory shard.

use std::ops::Range;

use chute_core::{Corruption, Error};

/// Bytes before a record's data: the length and its CRC.
pub const HEADER_LEN: usize = 12;
/// Bytes after a record's data: its CRC.
pub const FOOTER_LEN: usize = 4;
/// Framing bytes per record: a record of `n` data bytes takes `n + 16` bytes in the file.
pub const FRAME_OVERHEAD: usize = HEADER_LEN + FOOTER_LEN;
/// The default [`Limits::max_record_bytes`](chute_core::Limits): 1 GiB. The options'
/// defaults are the process's limit, which is this unless raised.
pub const DEFAULT_MAX_RECORD_BYTES: u64 = 1 << 30;

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
    /// The largest record accepted, in data bytes (default: the process's
    /// [`Limits::max_record_bytes`](chute_core::Limits), [`DEFAULT_MAX_RECORD_BYTES`] unless
    /// raised). A longer declared length is reported as corruption instead of being trusted.
    pub max_record_bytes: u64,
}

impl Default for FramingOptions {
    fn default() -> Self {
        FramingOptions {
            verify_checksums: true,
            max_record_bytes: chute_core::Limits::current().max_record_bytes,
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
///
/// [`TfRecordReader`]: super::TfRecordReader
#[derive(Debug, Clone)]
pub struct RecordDecoder {
    origin: String,
    options: FramingOptions,
    position: u64,
    records: u64,
    /// Whether `decode` checks data CRCs (index building checks only the headers).
    pub(super) check_data: bool,
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
pub(super) fn check_header(
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
            return Err(Error::corrupt_as(
                Corruption::Checksum,
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
        return Err(Error::corrupt_as(
            Corruption::TooLarge,
            origin,
            offset,
            chute_core::limits::exceeded(
                "the record",
                len,
                "bytes of data (is the file a TFRecord file?)",
                "max_record_bytes",
                options.max_record_bytes,
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
pub(super) fn check_data(frame: &[u8], offset: u64, origin: &str) -> Result<(), Error> {
    let (body, footer) = frame.split_at(frame.len() - FOOTER_LEN);
    let data = &body[HEADER_LEN..];
    let stored = u32::from_le_bytes(footer.try_into().expect("4 bytes"));
    let computed = masked_crc32c(data);
    if stored != computed {
        return Err(Error::corrupt_as(
            Corruption::Checksum,
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
        return Error::truncated(
            origin,
            offset,
            format!(
                "record header: {} of its {HEADER_LEN} bytes present; {cut}",
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
        Error::truncated(
            origin,
            offset,
            format!("record: {len} bytes declared, {present} present; {cut}"),
        )
    } else {
        Error::truncated(
            origin,
            offset,
            format!(
                "record: its {len} bytes of data are present but {} of the 4 bytes of \
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

/// Whether `head` (the start of a file) is GZIP rather than TFRecord: GZIP's magic bytes, and
/// not a valid TFRecord header (whose length could start with the same bytes).
pub(super) fn looks_gzip(head: &[u8]) -> bool {
    head.starts_with(&GZIP_MAGIC)
        && head
            .first_chunk::<HEADER_LEN>()
            .is_none_or(|h| masked_crc32c(&h[..8]).to_le_bytes() != h[8..12])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tfrecord::testing::{all, corrupt, framed, gzip};

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
            reason.starts_with("record header: 5 of its 12 bytes present"),
            "{reason}"
        );
        let (_, offset, reason) = msg(21 + 12 + 12);
        assert_eq!(offset, 21);
        assert!(
            reason.starts_with("record: 1000 bytes declared, 12 present"),
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
            reason.contains("more than max_record_bytes = 1073741824"),
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
            reason.starts_with("record: 104857600 bytes declared, 0 present"),
            "{reason}"
        );
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
}
