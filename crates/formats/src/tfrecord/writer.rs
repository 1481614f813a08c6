//! Writers: [`TfRecordWriter`] frames records into any [`Write`]; [`TfRecordFileWriter`]
//! writes a file under a temporary name, optionally GZIP-compressed or with its index.

use std::fmt;
use std::io::{self, Write};
use std::path::Path;

use chute_core::{ConfigError, Error, Sample};
use chute_io::AtomicFile;

use super::framing::{FRAME_OVERHEAD, HEADER_LEN, masked_crc32c};
use super::index::{IndexEntry, write_index};
use crate::example::sample_to_example;
use crate::indexed::{index_path, remove_stale_index};

/// Writes TFRecord framing and CRCs to any [`Write`]. Wrap files in a [`BufWriter`]: each
/// record is three small writes and one large one.
///
/// [`BufWriter`]: std::io::BufWriter
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
    ///
    /// [`TfRecordReader`]: super::TfRecordReader
    /// [`TfRecordSource`]: super::TfRecordSource
    pub gzip: bool,
    /// Also write the index file ([`index_path`]) when finishing. Not with `gzip`: offsets in
    /// a compressed file mean nothing.
    pub index: bool,
}

/// A TFRecord file being written: records go to `<path>.tmp` (an [`AtomicFile`]), which
/// [`TfRecordFileWriter::finish`] flushes, syncs and renames to `path` (and writes the index,
/// if asked), so an interrupted write never leaves a file at `path` that looks complete.
/// Dropping the writer without `finish` deletes the temporary file.
#[derive(Debug)]
pub struct TfRecordFileWriter {
    /// `None` once finished.
    out: Option<TfRecordWriter<Sink>>,
    index: Option<Vec<IndexEntry>>,
}

/// Where a file writer's bytes go.
enum Sink {
    Plain(AtomicFile),
    Gzip(Box<flate2::write::GzEncoder<AtomicFile>>),
}

impl Sink {
    fn file(&self) -> &AtomicFile {
        match self {
            Sink::Plain(f) => f,
            Sink::Gzip(w) => w.get_ref(),
        }
    }
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
        let file = AtomicFile::create(path)?;
        let sink = if options.gzip {
            Sink::Gzip(Box::new(flate2::write::GzEncoder::new(
                file,
                flate2::Compression::default(),
            )))
        } else {
            Sink::Plain(file)
        };
        Ok(TfRecordFileWriter {
            out: Some(TfRecordWriter::new(sink)),
            index: options.index.then(Vec::new),
        })
    }

    fn out(&self) -> &TfRecordWriter<Sink> {
        self.out.as_ref().expect("finish consumes the writer")
    }

    /// Appends one record. Fails with [`Error::Io`] naming the temporary file.
    pub fn write_record(&mut self, data: &[u8]) -> Result<(), Error> {
        let out = self.out.as_mut().expect("finish consumes the writer");
        let entry = match out.write_record(data) {
            Ok(entry) => entry,
            Err(e) => return Err(out.get_ref().file().error(e)),
        };
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
        self.out().records()
    }

    /// The final path.
    pub fn path(&self) -> &Path {
        self.out().get_ref().file().path()
    }

    /// Flushes and syncs the records, renames the temporary file to the final path, writes
    /// the index file if asked, and returns the number of records. Fails with [`Error::Io`]
    /// naming the file.
    pub fn finish(mut self) -> Result<u64, Error> {
        let out = self.out.take().expect("finish runs once");
        let records = out.records();
        let temp = out.get_ref().file().temp_path().display().to_string();
        let file = match out.into_inner().map_err(|e| Error::io(&temp, e))? {
            Sink::Plain(file) => file,
            Sink::Gzip(w) => w.finish().map_err(|e| Error::io(&temp, e))?,
        };
        let path = file.path().to_path_buf();
        // An index of an older version of the file must not outlive it.
        remove_stale_index(&path)?;
        file.finish()?;
        if let Some(index) = &self.index {
            write_index(&index_path(&path), index)?;
        }
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use chute_core::Field;

    use crate::tfrecord::testing::{all, framed};
    use crate::tfrecord::{FramingOptions, build_index, read_index};

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
}
