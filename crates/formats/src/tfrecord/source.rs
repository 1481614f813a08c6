//! [`TfRecordSource`]: random access to the records of TFRecord files for the loader.

use std::fmt;
use std::ops::Range;
use std::path::Path;

use bytes::Bytes;
use chute_core::{
    BufferPool, Column, ConfigError, Corruption, Error, Field, Manifest, Plan, Sample, ShardInfo,
    Source, VarColumn,
};
use chute_io::{IoSnapshot, Location, ShardSet};

use super::framing::{
    FRAME_OVERHEAD, FramingOptions, HEADER_LEN, check_data, check_header, looks_gzip,
};
use super::index::{IndexEntry, build_index, parse_index};
use super::reader::has_gz_extension;
use crate::example::{ExampleOptions, collate_examples, decode_sample};
use crate::indexed::{self, IndexedShards, ShardFormat};

/// The manifest's format name.
pub const FORMAT: &str = crate::Format::TfRecord.name();
/// The name of the one field of a raw record sample ([`TfRecordOptions::example`] `None`).
pub const RECORD_FIELD: &str = "record";

pub use crate::IndexMode;

/// How [`TfRecordSource`] reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TfRecordOptions {
    /// Verify both CRCs of each record when it is read (the default), and the length CRCs
    /// while scanning.
    pub verify_checksums: bool,
    /// The largest record accepted, in bytes of data (default: the process's
    /// [`Limits::max_record_bytes`](chute_core::Limits), [`DEFAULT_MAX_RECORD_BYTES`](super::DEFAULT_MAX_RECORD_BYTES) unless
    /// raised).
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
            max_record_bytes: chute_core::Limits::current().max_record_bytes,
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
///
/// [`TfRecordReader`]: super::TfRecordReader
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
    /// options are invalid or a file is GZIP-compressed; with [`Error::Io`] if a file cannot
    /// be opened, mapped or fetched, or (of kind `NotFound`, naming the index file) if
    /// [`IndexMode::Require`] is set and an index file is missing;
    /// with [`Error::Corrupt`] if a scanned header is corrupt or truncated, or an index file is
    /// malformed or does not match its shard.
    pub fn open<P: AsRef<Path>>(paths: &[P], options: TfRecordOptions) -> Result<Self, Error> {
        check_options(&options, paths.len())?;
        // Caught before anything is opened; a compressed file under another name is caught by
        // its first bytes (`TfRecordShards::check_shard`).
        for path in paths {
            let path = path.as_ref();
            if has_gz_extension(path) {
                return Err(gzip_error(&Location::from_path(path)?.to_string()));
            }
        }
        let IndexedShards { files, indexes } =
            IndexedShards::open(paths, options.index, &TfRecordShards(&options))?;
        let shards = indexes
            .into_iter()
            .enumerate()
            .map(|(i, offsets)| {
                let name = files.uri(i).to_owned();
                Shard {
                    stem: stem_of(&name),
                    name,
                    data: files.mapped(i).map(|file| file.bytes(0..file.len())),
                    len: files.size(i),
                    offsets,
                }
            })
            .collect();
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
    ///
    /// [`write_index`]: super::write_index
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
            return Err(Error::corrupt_as(
                Corruption::StaleIndex,
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
    fn remote_io(&self) -> Option<IoSnapshot> {
        Some(self.io_stats())
    }

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

    /// Streams remote shards in the plan's shard order, whole and with read-ahead, when the
    /// plan reads them in order; otherwise remote samples are read by range.
    fn set_plan(&self, plan: &Plan) {
        if let Some(files) = &self.files {
            indexed::set_plan(files, &self.manifest, plan);
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
        return Err(Error::corrupt_as(
            Corruption::StaleIndex,
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

/// TFRecord files as [`IndexedShards::open`] opens them, with these options. The index is
/// the record offsets and the end of the last record.
struct TfRecordShards<'a>(&'a TfRecordOptions);

impl ShardFormat for TfRecordShards<'_> {
    type Index = Vec<u64>;

    /// Refuses a GZIP-compressed file, by its first bytes (it cannot be read at random).
    fn check_shard(&self, files: &ShardSet, i: usize) -> Result<(), Error> {
        let head = files.get_range(i, 0..files.size(i).min(HEADER_LEN as u64))?;
        if looks_gzip(&head) {
            return Err(gzip_error(files.uri(i)));
        }
        Ok(())
    }

    fn parse_index(
        &self,
        text: &[u8],
        origin: &str,
        _shard: Option<&[u8]>,
        size: u64,
    ) -> Result<Vec<u64>, Error> {
        offsets_from_index(&parse_index(text, origin)?, size, origin)
    }

    fn scan(&self, data: &[u8], uri: &str) -> Result<Vec<u64>, Error> {
        offsets_by_scan(data, uri, self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tfrecord::testing::{corrupt, framed, gzip};
    use crate::tfrecord::{index_path, write_index};

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
            matches!(&e, Error::Io { path, source } if path.ends_with("a.tfrecord.idx")
                && source.kind() == std::io::ErrorKind::NotFound),
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
