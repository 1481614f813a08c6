//! Sequential reading with bounded memory: [`TfRecordReader`] over any [`Read`], plain or
//! GZIP-compressed, the same [`RecordDecoder`] over an internal buffer.

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use bytes::{Bytes, BytesMut};
use chute_core::Error;

use super::framing::{Frame, FramingOptions, RecordDecoder, looks_gzip};

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

/// Whether `path` ends in `.gz` or `.gzip`.
pub(super) fn has_gz_extension(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gz") || e.eq_ignore_ascii_case("gzip"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tfrecord::testing::{all, framed};
    use crate::tfrecord::{TfRecordFileWriter, WriterOptions};

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
    fn hostile_lengths_grow_the_buffer_only_as_bytes_arrive() {
        // 100 MiB declared, with checks off so that the header passes: the reader asks for
        // the bytes and allocates for those that arrive, not for the declared length.
        let mut bytes = (100u64 << 20).to_le_bytes().to_vec();
        bytes.extend([0; 4]);
        let off = FramingOptions {
            verify_checksums: false,
            ..Default::default()
        };
        let mut r = TfRecordReader::new(&bytes[..], "mem", off);
        assert!(r.next().unwrap().is_err());
        assert!(r.buf.capacity() <= 2 * READ_CHUNK, "{}", r.buf.capacity());
        assert!(r.next().is_none());
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
}
