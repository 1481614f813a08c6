//! WebDataset shards: tar files whose consecutive members sharing a key form one sample.
//!
//! - [`WebDatasetSource`]: local shards as a [`Source`] with random access (memory-mapped,
//!   through a per-shard [`ShardIndex`]).
//! - [`Samples`]: one pass over a shard in memory, sample by sample.
//! - [`ShardIndex`]: where each sample's bytes are, built by one scan or read from a
//!   `<shard>.idx` file.
//! - [`ShardWriter`]: writes samples into shards named by a pattern (`out-%06d.tar`), rotating
//!   at a sample count or a byte size; [`SampleWriter`] writes one shard to any [`Write`].
//! - [`expand_braces`]: shard lists such as `train-{000000..000127}.tar`.
//!
//! # What a sample is
//!
//! chute groups members exactly as the `webdataset` Python package (1.0.2) does:
//!
//! - only regular files count; directories, links and other members are skipped;
//! - members `webdataset` treats as metadata are skipped: names matching `__[^/]*__($|/)`
//!   (`__meta__`, `__index__/x`) and top-level names that start and end with `__`;
//! - a name splits into key and field at the first dot of its *last* path component (the
//!   regex `^((?:.*/|)[^.]+)[.]([^/]*)$` of `webdataset.tariterators.base_plus_ext`):
//!   `a.b/c.d.jpg` is key `a.b/c`, field `d.jpg`. Names with no such dot (`README`, `dir.x/y`)
//!   are skipped. The field is lower-cased (`JPG` reads as `jpg`);
//! - consecutive members with one key form a sample; a key that comes back later starts a
//!   new sample. A field repeated within a sample is an error, as in `webdataset`. Each shard
//!   is grouped on its own: a sample never spans two shards.
//!
//! A [`Sample`] holds the key in [`Sample::key`] and, as its first field, a [`Field::Text`]
//! named [`KEY_FIELD`] (`__key__`), so batches carry keys as `webdataset`'s do. The other
//! fields follow **sorted by name** (byte order), each a [`Field::Bytes`] viewing the shard's
//! bytes (no copy). Sorting makes every sample of a dataset list its fields in one order
//! whatever order the tar has (what collation into columns needs); `webdataset`'s writer
//! writes them sorted anyway, so for its shards it is also the tar order. `webdataset`'s
//! `__url__` is not added: a sample error names its shard already.
//!
//! # Index files
//!
//! `chute index` writes, next to each shard, `<shard>.idx` ([`index_path`]): UTF-8 text, the
//! first line `chute-wds-index 1`, then one line per sample, `<offset> <size>` in decimal: the
//! byte range from the sample's first header (its pax or GNU long-name header included) to
//! the end of its last member's padding. Offsets are multiples of 512, increasing, and ranges
//! do not overlap. [`WebDatasetSource`] uses the file when present ([`IndexMode`]); without
//! one it scans the shard (one pass over the headers, no data read).
//!
//! ```
//! use chute_core::{Field, Source};
//! use chute_formats::webdataset::{ShardWriter, ShardWriterOptions, WebDatasetOptions,
//!     WebDatasetSource};
//!
//! let dir = tempfile::tempdir()?;
//! let pattern = dir.path().join("train-%03d.tar");
//! let mut writer = ShardWriter::new(pattern.to_str().unwrap(), ShardWriterOptions {
//!     max_count: 2,
//!     ..ShardWriterOptions::default()
//! })?;
//! for i in 0..3 {
//!     let label = i.to_string();
//!     writer.write(&format!("img{i}"), &[("jpg", b"\xff\xd8..."), ("cls", label.as_bytes())])?;
//! }
//! let shards = writer.finish()?; // train-000.tar (2 samples), train-001.tar (1)
//! assert_eq!(shards.iter().map(|s| s.samples).collect::<Vec<_>>(), [2, 1]);
//!
//! let paths: Vec<_> = shards.iter().map(|s| s.path.clone()).collect();
//! let source = WebDatasetSource::open(&paths, WebDatasetOptions::default())?;
//! let sample = source.read(2)?;
//! assert_eq!(sample.key, "img2");
//! let names: Vec<_> = sample.fields.iter().map(|(n, _)| n.as_ref()).collect();
//! assert_eq!(names, ["__key__", "cls", "jpg"]);
//! let Some(Field::Bytes(cls)) = sample.get("cls") else { unreachable!() };
//! assert_eq!(&cls[..], b"2");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::borrow::Cow;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use chute_core::{ConfigError, Error, Field, FieldName, Manifest, Plan, Sample, ShardInfo, Source};
use chute_io::{IoSnapshot, Location, ShardSet};

use crate::tar::{self, BLOCK_SIZE, END_OF_ARCHIVE_LEN, Member, TarDecoder, TarOptions, TarWriter};

pub use crate::braces::{MAX_EXPANSIONS, expand_braces};

/// The manifest's format name.
pub const FORMAT: &str = "webdataset";

/// The name of the text field holding a sample's key, first in every sample.
pub const KEY_FIELD: &str = "__key__";

/// The first line of an index file.
pub const INDEX_HEADER: &str = "chute-wds-index 1";

/// What an index file's name adds to its shard's.
pub const INDEX_SUFFIX: &str = ".idx";

/// Splits a member name into (key, field) as `webdataset`'s `base_plus_ext` does (before it
/// lower-cases the field): at the first dot of the last path component. `None` for names
/// `webdataset` skips because they have no such dot.
///
/// ```
/// use chute_formats::webdataset::split_name;
///
/// assert_eq!(split_name("a.b/c.d.jpg"), Some(("a.b/c", "d.jpg")));
/// assert_eq!(split_name("README"), None);
/// assert_eq!(split_name("dir.x/y"), None);
/// ```
pub fn split_name(name: &str) -> Option<(&str, &str)> {
    // The regex is ^((?:.*/|)[^.]+)[.]([^/]*)$. The field has no '/', so the dot is in the
    // last component, and the `[^.]+` run before it has no dot, so it is the component's
    // first dot. The run must be non-empty and start at the beginning or right after a '/'
    // that `.*` can reach (`.` does not match a newline): for a component that starts with a
    // dot (`x/.jpg`) the run is the previous component and its slash.
    let b = name.as_bytes();
    let comp = b.iter().rposition(|&c| c == b'/').map_or(0, |i| i + 1);
    let dot = comp + b[comp..].iter().position(|&c| c == b'.')?;
    let first_newline = b.iter().position(|&c| c == b'\n').unwrap_or(b.len());
    let start = b[..dot]
        .iter()
        .enumerate()
        .filter(|&(i, &c)| c == b'/' && i + 1 < dot && i < first_newline)
        .map(|(i, _)| i + 1)
        .next_back()
        .unwrap_or(0);
    if start >= dot || b[start..dot].contains(&b'.') {
        return None;
    }
    Some((&name[..dot], &name[dot + 1..]))
}

/// Whether `webdataset`'s `tar_file_iterator` skips a member of this name as metadata:
/// names matching `__[^/]*__($|/)` from the start, and top-level names that start and end
/// with `__`.
pub fn is_meta(name: &str) -> bool {
    let b = name.as_bytes();
    if !b.starts_with(b"__") {
        return false;
    }
    if !b.contains(&b'/') && b.ends_with(b"__") {
        return true;
    }
    // re.match(r"__[^/]*__($|/)"): `$` also matches before a final newline.
    let n = b.len();
    (2..n.saturating_sub(1))
        .take_while(|&j| !b[2..j].contains(&b'/'))
        .any(|j| {
            &b[j..j + 2] == b"__"
                && (j + 2 == n || b[j + 2] == b'/' || (j + 3 == n && b[n - 1] == b'\n'))
        })
}

/// Where one sample's members are in its shard: `size` bytes from `offset`, from its first
/// header to the end of its last member's padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SampleSpan {
    /// Offset of the sample's first header block.
    pub offset: u64,
    /// Bytes up to the end of the last member's padding.
    pub size: u64,
}

impl SampleSpan {
    /// The byte range.
    pub fn range(&self) -> Range<u64> {
        self.offset..self.offset + self.size
    }
}

/// The samples of one shard, in order: where each one's bytes are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardIndex {
    spans: Vec<SampleSpan>,
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

    /// Writes the index file at `path` (through `<path>.tmp` and a rename, so a reader never
    /// sees half an index).
    pub fn save(&self, path: &Path) -> Result<(), Error> {
        write_atomically(path, self.to_text().as_bytes())
    }
}

/// The index file of `shard`: `<shard>.idx`.
pub fn index_path(shard: &Path) -> PathBuf {
    let mut p = shard.as_os_str().to_owned();
    p.push(INDEX_SUFFIX);
    PathBuf::from(p)
}

/// One sample being grouped: its key, field names (in an arena reused from sample to
/// sample, so scanning allocates nothing per member) and data ranges.
#[derive(Debug, Default)]
struct Group {
    key: String,
    names: String,
    /// (name range in `names`, data range in the shard).
    fields: Vec<(Range<usize>, Range<u64>)>,
    span: SampleSpan,
}

impl Group {
    fn name(&self, i: usize) -> &str {
        &self.names[self.fields[i].0.clone()]
    }
}

/// Groups consecutive members by key, as `webdataset`'s `group_by_keys` does.
#[derive(Debug, Default)]
struct Grouper {
    cur: Group,
    /// The last finished sample.
    done: Group,
    open: bool,
}

impl Grouper {
    /// Adds a member. Returns true when the member started a new sample after a finished one,
    /// which is then in `done`.
    fn add(&mut self, m: &Member<'_>, uri: &str) -> Result<bool, Error> {
        let path = std::str::from_utf8(m.path).map_err(|_| {
            Error::corrupt(
                uri,
                m.header_offset,
                format!(
                    "member name {:?} is not UTF-8, so it has no webdataset key; rename it",
                    String::from_utf8_lossy(m.path)
                ),
            )
        })?;
        if is_meta(path) {
            return Ok(false);
        }
        let Some((key, field)) = split_name(path) else {
            return Ok(false);
        };
        let mut finished = false;
        if self.open && self.cur.key != key {
            std::mem::swap(&mut self.cur, &mut self.done);
            self.open = false;
            finished = true;
        }
        let g = &mut self.cur;
        if !self.open {
            g.key.clear();
            g.key.push_str(key);
            g.names.clear();
            g.fields.clear();
            g.span.offset = m.header_offset;
            self.open = true;
        }
        let start = g.names.len();
        if field.bytes().any(|c| c.is_ascii_uppercase()) || !field.is_ascii() {
            // str::to_lowercase, as Python's str.lower, handles a final sigma.
            g.names.push_str(&field.to_lowercase());
        } else {
            g.names.push_str(field);
        }
        let name = &g.names[start..];
        let repeated = g.fields.iter().any(|(r, _)| &g.names[r.clone()] == name);
        if repeated || name == KEY_FIELD || name == "__url__" {
            let what = if repeated {
                "repeats the field"
            } else {
                "is a field named like webdataset's metadata"
            };
            return Err(Error::corrupt(
                uri,
                m.header_offset,
                format!(
                    "member {path:?} {what} {name:?} of sample {key:?}; webdataset refuses \
                     such shards too: rename the member"
                ),
            ));
        }
        g.fields.push((start..g.names.len(), m.data_range()));
        g.span.size = m.end_offset() - g.span.offset;
        Ok(finished)
    }

    /// Closes the open sample, if any, into `done`; returns whether there was one.
    fn finish(&mut self) -> bool {
        if !self.open {
            return false;
        }
        std::mem::swap(&mut self.cur, &mut self.done);
        self.open = false;
        true
    }
}

/// Field names common enough to be static, so most samples allocate no name.
const COMMON_FIELDS: &[&str] = &[
    "jpg",
    "jpeg",
    "png",
    "webp",
    "gif",
    "bmp",
    "tif",
    "tiff",
    "ppm",
    "pgm",
    "pbm",
    "cls",
    "cls2",
    "index",
    "inx",
    "id",
    "txt",
    "text",
    "caption",
    "json",
    "jsonl",
    "yaml",
    "xml",
    "html",
    "csv",
    "npy",
    "npz",
    "pt",
    "pth",
    "pyd",
    "pkl",
    "pickle",
    "mp",
    "msgpack",
    "cbor",
    "ten",
    "mp3",
    "wav",
    "flac",
    "ogg",
    "mp4",
    "webm",
    "avi",
    "mkv",
    "bin",
    "label",
    "seg.png",
    "mask.png",
    "depth.png",
    "input.jpg",
    "output.jpg",
    "safetensors",
];

fn field_name(name: &str) -> FieldName {
    match COMMON_FIELDS.iter().find(|c| **c == name) {
        Some(c) => Cow::Borrowed(c),
        None => Cow::Owned(name.to_owned()),
    }
}

/// Builds the sample `g` describes, its fields viewing `shard`.
fn build(g: &mut Group, shard: &Bytes, index: u64, uri: &str) -> Result<Sample, Error> {
    let names = &g.names;
    g.fields
        .sort_unstable_by(|a, b| names[a.0.clone()].cmp(&names[b.0.clone()]));
    let mut fields = Vec::with_capacity(g.fields.len() + 1);
    fields.push((
        Cow::Borrowed(KEY_FIELD),
        Field::Text(Bytes::from(g.key.clone().into_bytes())),
    ));
    for (i, (_, range)) in g.fields.iter().enumerate() {
        let data = usize::try_from(range.end)
            .ok()
            .filter(|&end| end <= shard.len())
            .map(|end| shard.slice(range.start as usize..end))
            .ok_or_else(|| {
                Error::corrupt(
                    uri,
                    range.start,
                    format!(
                        "truncated: field {:?} of sample {:?} runs past the shard's end (byte {})",
                        g.name(i),
                        g.key,
                        shard.len()
                    ),
                )
            })?;
        fields.push((field_name(g.name(i)), Field::Bytes(data)));
    }
    Ok(Sample {
        index,
        key: g.key.clone(),
        fields,
    })
}

/// The samples of one shard held in memory (or mapped), in order, in one pass.
///
/// Yields each sample as soon as the first member of the next one (or the end of the shard)
/// shows it is complete; [`Sample::index`] is the sample's position in the shard. A damaged
/// or truncated shard yields the samples before the damage, then one error, then nothing:
/// a shard cut short never looks complete.
#[derive(Debug)]
pub struct Samples {
    data: Bytes,
    uri: String,
    pos: usize,
    decoder: TarDecoder,
    grouper: Grouper,
    next_index: u64,
    done: bool,
}

impl Samples {
    /// Reads `data`, a whole shard; `uri` names it in errors.
    pub fn new(data: Bytes, uri: impl Into<String>, options: TarOptions) -> Samples {
        let uri = uri.into();
        Samples {
            decoder: TarDecoder::new(uri.clone(), options),
            data,
            uri,
            pos: 0,
            grouper: Grouper::default(),
            next_index: 0,
            done: false,
        }
    }

    fn step(&mut self) -> Result<Option<Sample>, Error> {
        loop {
            if self.pos == self.data.len() {
                self.decoder.finish()?;
                self.done = true;
                let finished = self.grouper.finish();
                return self.emit_if(finished);
            }
            let (used, member) = self.decoder.decode(&self.data[self.pos..])?;
            self.pos += used;
            if let Some(m) = member
                && self.grouper.add(&m, &self.uri)?
            {
                return self.emit_if(true);
            }
        }
    }

    fn emit_if(&mut self, finished: bool) -> Result<Option<Sample>, Error> {
        if !finished {
            return Ok(None);
        }
        let s = build(
            &mut self.grouper.done,
            &self.data,
            self.next_index,
            &self.uri,
        )?;
        self.next_index += 1;
        Ok(Some(s))
    }
}

impl Iterator for Samples {
    type Item = Result<Sample, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.step() {
            Ok(Some(s)) => Some(Ok(s)),
            Ok(None) => None,
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// Reads the one sample at `span` of `shard` (a whole shard's bytes), decoding only that
/// range. [`Sample::index`] is 0; callers set it.
///
/// Fails with [`Error::Corrupt`] naming `uri` if the range lies outside the shard, does not
/// start at a header or end between members, or holds no sample or more than one: signs of
/// an index that does not belong to this shard.
pub fn read_sample(
    shard: &Bytes,
    span: SampleSpan,
    uri: &str,
    options: TarOptions,
) -> Result<Sample, Error> {
    let end = span
        .offset
        .checked_add(span.size)
        .filter(|&e| e <= shard.len() as u64)
        .ok_or_else(|| {
            stale_span(
                uri,
                span,
                format!("runs past the shard's end (byte {})", shard.len()),
            )
        })?;
    read_span(
        &shard.slice(span.offset as usize..end as usize),
        span,
        uri,
        options,
    )
}

fn stale_span(uri: &str, span: SampleSpan, why: String) -> Error {
    Error::corrupt(
        uri,
        span.offset,
        format!(
            "index entry {} {}: {why}; the index does not match the shard (rebuild it with \
             `chute index`)",
            span.offset, span.size
        ),
    )
}

/// [`read_sample`] given only the span's bytes (`bytes`, `span.size` of them, which sit at
/// `span.offset` in the shard): what a range request returns. Fields view `bytes`.
pub fn read_span(
    bytes: &Bytes,
    span: SampleSpan,
    uri: &str,
    options: TarOptions,
) -> Result<Sample, Error> {
    let stale = |why: String| stale_span(uri, span, why);
    if bytes.len() as u64 != span.size {
        return Err(stale(format!(
            "{} bytes were read for it (the shard is shorter than the index says)",
            bytes.len()
        )));
    }
    let mut decoder = TarDecoder::new(uri, options).starting_at(span.offset);
    let mut grouper = Grouper::default();
    let mut pos = 0;
    while pos < bytes.len() && !decoder.is_end() {
        let (used, member) = decoder.decode(&bytes[pos..])?;
        pos += used;
        if let Some(m) = member
            && grouper.add(&m, uri)?
        {
            return Err(stale(format!(
                "the range holds more than one sample (keys {:?} and {:?})",
                grouper.done.key, grouper.cur.key
            )));
        }
    }
    decoder.finish_fragment()?;
    if !grouper.finish() {
        return Err(stale("the range holds no sample".into()));
    }
    // Member ranges are offsets in the shard; the bytes start at the span.
    for (_, r) in &mut grouper.done.fields {
        *r = r.start - span.offset..r.end - span.offset;
    }
    build(&mut grouper.done, bytes, 0, uri)
}

pub use crate::IndexMode;

/// How a [`WebDatasetSource`] opens shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WebDatasetOptions {
    /// Where indexes come from.
    pub index: IndexMode,
    /// Limits for the tar decoder.
    pub tar: TarOptions,
}

#[derive(Debug)]
struct OpenShard {
    uri: String,
    index: ShardIndex,
}

/// WebDataset shards as a [`Source`]: one shard per tar file or object, random access to
/// every sample through each shard's [`ShardIndex`].
///
/// Local files are memory-mapped read-only and never read whole: [`Source::read`] decodes
/// only the sample's range, and its fields are views of the map. Remote shards (URLs, see
/// [`chute_io::Location`]) come through a [`ShardSet`]: streamed whole with read-ahead when
/// the loader gives the rank's shard order ([`Source::set_plan`]), else read by range
/// requests. The manifest's format is [`FORMAT`]; each shard's byte size is the file's.
#[derive(Debug)]
pub struct WebDatasetSource {
    shards: Vec<OpenShard>,
    files: ShardSet,
    manifest: Manifest,
    options: WebDatasetOptions,
}

impl WebDatasetSource {
    /// Opens `paths` (local paths or URLs), one shard each, in order, with each shard's index
    /// from [`WebDatasetOptions::index`] (`<shard>.idx` next to the shard, fetched for a URL).
    ///
    /// A remote shard without an index is downloaded once at open to be scanned; write
    /// indexes with `chute index` so that opening fetches only them.
    ///
    /// Fails with a [`ConfigError`] if `paths` is empty or names an unknown URL scheme;
    /// [`Error::Io`] if a shard cannot be opened or fetched or a required index is missing;
    /// [`Error::Corrupt`] naming the shard or index file if a scan finds a damaged shard or
    /// an index file is malformed or does not fit its shard.
    pub fn open<P: AsRef<Path>>(
        paths: &[P],
        options: WebDatasetOptions,
    ) -> Result<WebDatasetSource, Error> {
        if paths.is_empty() {
            return Err(ConfigError::new("paths", "no shards given; pass at least one").into());
        }
        let locations = paths
            .iter()
            .map(|p| Location::from_path(p.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        let files = ShardSet::open(&locations)?;
        let mut shards = Vec::with_capacity(paths.len());
        let mut infos = Vec::with_capacity(paths.len());
        for (i, loc) in locations.iter().enumerate() {
            let uri = files.uri(i).to_owned();
            let size = files.size(i);
            let idx = loc.with_suffix(INDEX_SUFFIX);
            let text = match options.index {
                IndexMode::Scan => None,
                IndexMode::Auto => idx.read_optional()?,
                IndexMode::Require => Some(idx.read().map_err(|e| match e {
                    Error::Io { path, source } if source.kind() == io::ErrorKind::NotFound => {
                        Error::io(
                            path,
                            io::Error::new(
                                io::ErrorKind::NotFound,
                                format!(
                                    "no index for shard {uri}; build it with `chute index`, \
                                     or open with IndexMode::Auto to scan the shard"
                                ),
                            ),
                        )
                    }
                    e => e,
                })?),
            };
            let index = match text {
                Some(text) => {
                    let name = idx.to_string();
                    let index = ShardIndex::parse_bytes(&text, &name)?;
                    match files.mapped(i) {
                        Some(file) => check_index_fits(&index, file.as_slice(), &name)?,
                        None => check_index_ends(&index, size, &name)?,
                    }
                    index
                }
                None => {
                    if let Some(file) = files.mapped(i) {
                        file.advise_sequential();
                    }
                    ShardIndex::scan(&files.get(i)?, &uri, options.tar)?
                }
            };
            if let Some(file) = files.mapped(i) {
                file.advise_random();
            }
            infos.push(ShardInfo {
                path: uri.clone(),
                samples: index.len() as u64,
                bytes: size,
            });
            shards.push(OpenShard { uri, index });
        }
        Ok(WebDatasetSource {
            shards,
            files,
            manifest: Manifest::new(FORMAT, infos),
            options,
        })
    }

    /// What reading remote shards has cost so far (zero for local shards).
    pub fn io_stats(&self) -> IoSnapshot {
        self.files.stats()
    }

    /// The index of shard `shard` (manifest order).
    ///
    /// # Panics
    /// If `shard` is out of range.
    pub fn shard_index(&self, shard: usize) -> &ShardIndex {
        &self.shards[shard].index
    }

    /// The options the shards were opened with.
    pub fn options(&self) -> WebDatasetOptions {
        self.options
    }
}

/// For a remote shard (whose bytes are not at hand): the index's last range ends inside it.
fn check_index_ends(index: &ShardIndex, size: u64, origin: &str) -> Result<(), Error> {
    match index.spans.last() {
        Some(last) if last.offset + last.size > size => Err(Error::corrupt(
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
        Error::corrupt(
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

impl Source for WebDatasetSource {
    fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Sample `id`: `__key__` then the fields sorted by name, viewing the map. Fails with
    /// [`Error::Config`] if `id` is out of range, [`Error::Corrupt`] naming the shard if the
    /// sample's bytes are damaged or the index does not match the shard.
    fn read(&self, id: u64) -> Result<Sample, Error> {
        let (shard, pos) = self.manifest.locate_checked(id)?;
        let s = &self.shards[shard];
        let span = s.index.spans[pos as usize];
        let bytes = self.files.get_range(shard, span.range())?;
        let mut sample = read_span(&bytes, span, &s.uri, self.options.tar)?;
        sample.index = id;
        Ok(sample)
    }

    /// Streams remote shards in the plan's shard order, with read-ahead.
    fn set_plan(&self, plan: &Plan) {
        if (0..self.files.len()).any(|i| self.files.is_remote(i)) {
            match plan.shard_window() {
                Some(w) => self.files.set_order(&plan.shard_order(&self.manifest), w),
                None => self.files.set_order(&[], 1),
            }
        }
    }
}

/// Writes samples as WebDataset members into one tar stream: for each sample, one member
/// `<key>.<field>` per field, fields sorted by name (as `webdataset`'s `TarWriter` writes
/// them), through [`TarWriter`] (deterministic POSIX tar).
///
/// Every name is checked before anything is written, so that reading the shard gives back the
/// same samples (with chute or `webdataset`); a refused sample leaves the stream as it was.
#[derive(Debug)]
pub struct SampleWriter<W: Write> {
    tar: TarWriter<W>,
    name: String,
    last_key: Option<String>,
    samples: u64,
}

impl<W: Write> SampleWriter<W> {
    /// A writer into `out`; `name` names it in I/O errors.
    pub fn new(out: W, name: impl Into<String>) -> Self {
        SampleWriter {
            tar: TarWriter::new(out),
            name: name.into(),
            last_key: None,
            samples: 0,
        }
    }

    /// Bytes written so far.
    pub fn position(&self) -> u64 {
        self.tar.position()
    }

    /// Samples written so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Writes one sample; returns its span in the stream.
    ///
    /// Fields named `__key__` and `__url__` (`webdataset`'s metadata, which a read sample
    /// holds) are left out, as `webdataset`'s writer leaves them out. Fails with a [`ConfigError`] naming
    /// the key and field, writing nothing, if the key is empty, equals the previous sample's
    /// (the two would read back as one), or with a field would make a member name that does
    /// not read back as this key and field (a dot in the key's last path component, an
    /// upper-case or empty field name, a `/` in a field name, a metadata-like name), if a
    /// field name repeats or if no field is left; with [`Error::Io`] if writing fails.
    pub fn write(&mut self, key: &str, fields: &[(&str, &[u8])]) -> Result<SampleSpan, Error> {
        let members = plan_sample(key, fields, self.last_key.as_deref())?;
        let start = self.tar.position();
        for (path, data) in &members {
            self.tar
                .append(path, data)
                .map_err(|e| Error::io(&self.name, e))?;
        }
        self.last_key = Some(key.to_owned());
        self.samples += 1;
        Ok(SampleSpan {
            offset: start,
            size: self.tar.position() - start,
        })
    }

    /// Writes a [`Sample`]: its key ([`Sample::key`], or its `__key__` text field when the key
    /// is empty) and its bytes and text fields. Array fields are refused with a
    /// [`ConfigError`]: encode them first (as `.npy`, say).
    pub fn write_sample(&mut self, sample: &Sample) -> Result<SampleSpan, Error> {
        let (key, fields) = sample_parts(sample)?;
        self.write(&key, &fields)
    }

    /// Writes the end-of-archive marker, flushes and returns the underlying writer.
    pub fn finish(self) -> Result<W, Error> {
        let name = self.name;
        self.tar.finish().map_err(|e| Error::io(name, e))
    }
}

/// A field's name and bytes, as the writers take them.
type NamedBytes<'a> = (&'a str, &'a [u8]);

/// The key and fields of `sample`, for writing.
fn sample_parts(sample: &Sample) -> Result<(String, Vec<NamedBytes<'_>>), Error> {
    let mut key = sample.key.clone();
    if key.is_empty()
        && let Some(Field::Text(k)) = sample.get(KEY_FIELD)
    {
        key = String::from_utf8_lossy(k).into_owned();
    }
    let mut fields = Vec::with_capacity(sample.fields.len());
    for (name, field) in &sample.fields {
        let bytes: &[u8] = match field {
            Field::Bytes(b) | Field::Text(b) => b,
            Field::Array(_) => {
                return Err(ConfigError::new(
                    "field",
                    format!(
                        "field {name:?} of sample {key:?} is an array; encode it to bytes \
                         (as .npy, say) before writing a WebDataset shard"
                    ),
                )
                .into());
            }
            _ => {
                return Err(ConfigError::new(
                    "field",
                    format!("field {name:?} of sample {key:?} has a kind tar cannot store"),
                )
                .into());
            }
        };
        fields.push((name.as_ref(), bytes));
    }
    Ok((key, fields))
}

/// Whether a field name is `webdataset` metadata the writer leaves out: `__key__` and
/// `__url__`, the two names a read sample can hold that are not member fields (reading
/// refuses members named like them). Other names are written or refused, never dropped.
fn is_meta_field(name: &str) -> bool {
    name == KEY_FIELD || name == "__url__"
}

/// The members of one sample, sorted by field name, after checking that they read back as
/// `key` and these fields.
fn plan_sample<'a>(
    key: &str,
    fields: &[(&str, &'a [u8])],
    last_key: Option<&str>,
) -> Result<Vec<(String, &'a [u8])>, ConfigError> {
    let bad = |option: &str, why: String| ConfigError::new(option, why);
    if key.is_empty() || key.contains('\0') {
        return Err(bad(
            "key",
            format!("{key:?}: a key must be non-empty and hold no NUL"),
        ));
    }
    if last_key == Some(key) {
        return Err(bad(
            "key",
            format!(
                "{key:?} repeats the previous sample's key; consecutive members with one key \
                 read back as one sample, so give every sample its own key"
            ),
        ));
    }
    let mut sorted: Vec<(&str, &[u8])> = fields
        .iter()
        .filter(|(n, _)| !is_meta_field(n))
        .copied()
        .collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    if sorted.is_empty() {
        return Err(bad(
            "fields",
            format!("sample {key:?} has no fields to write; a key without members vanishes"),
        ));
    }
    if let Some(w) = sorted.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(bad(
            "fields",
            format!("sample {key:?} has two fields named {:?}", w[0].0),
        ));
    }
    let last_component = key.rsplit('/').next().unwrap_or(key);
    if last_component.contains('.') {
        let would = split_name(&format!("{key}.x")).map(|(k, _)| k.to_string());
        return Err(bad(
            "key",
            format!(
                "{key:?} has a dot in its last path component; webdataset splits member names \
                 at the first dot there, so it would read key {would:?}: replace the dot \
                 (with '_', say)"
            ),
        ));
    }
    let mut members = Vec::with_capacity(sorted.len());
    for (name, data) in sorted {
        if name.is_empty() || name.contains('/') || name.contains('\0') {
            return Err(bad(
                "fields",
                format!(
                    "field {name:?} of sample {key:?}: a field name must be non-empty and hold \
                     no '/' or NUL"
                ),
            ));
        }
        if name.to_lowercase() != name {
            return Err(bad(
                "fields",
                format!(
                    "field {name:?} of sample {key:?} has upper-case letters; webdataset \
                     lower-cases field names when reading, so write {:?}",
                    name.to_lowercase()
                ),
            ));
        }
        let path = format!("{key}.{name}");
        if is_meta(&path) || split_name(&path) != Some((key, name)) {
            return Err(bad(
                "key",
                format!(
                    "member name {path:?} would not read back as key {key:?} and field \
                     {name:?} (webdataset skips names like __x__ as metadata, and needs a \
                     non-empty name before the dot); change the key"
                ),
            ));
        }
        members.push((path, data));
    }
    Ok(members)
}

/// How a [`ShardWriter`] cuts shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardWriterOptions {
    /// The most samples per shard. Default 100,000 (`webdataset`'s `maxcount`).
    pub max_count: u64,
    /// The most bytes per shard, end-of-archive block included; a shard holds at least one
    /// sample, so a single larger sample makes a larger shard. Default 3 GB (`webdataset`'s
    /// `maxsize`).
    pub max_size: u64,
    /// The number of the first shard. Default 0.
    pub start_shard: u64,
    /// Also write each shard's index, `<shard>.idx`, so readers need not scan. Default false:
    /// the output is then exactly what `webdataset` users expect, and an existing index of a
    /// replaced shard is removed.
    pub write_index: bool,
}

impl Default for ShardWriterOptions {
    fn default() -> Self {
        ShardWriterOptions {
            max_count: 100_000,
            max_size: 3_000_000_000,
            start_shard: 0,
            write_index: false,
        }
    }
}

/// A shard pattern: `prefix`, a number printed `%0<width>d`, `suffix`.
#[derive(Debug, Clone)]
struct ShardPattern {
    prefix: String,
    width: usize,
    suffix: String,
}

impl ShardPattern {
    fn parse(pattern: &str) -> Result<ShardPattern, ConfigError> {
        let bad = |why: &str| {
            ConfigError::new(
                "pattern",
                format!(
                    "{pattern:?} {why}; use one printf-style number, as in \"out-%06d.tar\" \
                     (%% for a literal %)"
                ),
            )
        };
        let mut parts = (String::new(), None, String::new());
        let mut chars = pattern.chars().peekable();
        while let Some(c) = chars.next() {
            let out = if parts.1.is_none() {
                &mut parts.0
            } else {
                &mut parts.2
            };
            if c != '%' {
                out.push(c);
                continue;
            }
            let mut spec = String::new();
            while let Some(&d) = chars.peek() {
                if !d.is_ascii_digit() {
                    break;
                }
                spec.push(d);
                chars.next();
            }
            match chars.next() {
                Some('%') if spec.is_empty() => out.push('%'),
                Some('d') => {
                    if parts.1.is_some() {
                        return Err(bad("has more than one number"));
                    }
                    if !spec.is_empty() && !spec.starts_with('0') {
                        return Err(bad(
                            "pads the number with spaces (%Nd), which makes file names with spaces",
                        ));
                    }
                    parts.1 = Some(spec.parse::<usize>().unwrap_or(0).min(64));
                }
                _ => return Err(bad("has a % that is not %d, %0Nd or %%")),
            }
        }
        let (prefix, Some(width), suffix) = parts else {
            return Err(bad("has no shard number"));
        };
        Ok(ShardPattern {
            prefix,
            width,
            suffix,
        })
    }

    fn path(&self, n: u64) -> PathBuf {
        PathBuf::from(format!(
            "{}{n:0w$}{}",
            self.prefix,
            self.suffix,
            w = self.width
        ))
    }
}

/// The shard being written.
#[derive(Debug)]
struct Current {
    path: PathBuf,
    tmp: PathBuf,
    writer: SampleWriter<BufWriter<File>>,
    spans: Vec<SampleSpan>,
}

/// Writes samples into numbered shards: `pattern` with its `%06d` (or `%d`) replaced by the
/// shard number, a new shard when the current one reaches
/// [`ShardWriterOptions::max_count`] samples or the next sample would take it past
/// [`ShardWriterOptions::max_size`] bytes.
///
/// Each shard is written as `<shard>.tmp` and renamed when complete (after an `fsync`), so an
/// interrupted run never leaves a partial shard under a final name; dropping the writer
/// without [`ShardWriter::finish`] deletes the shard in progress (finished ones stay).
/// `finish` returns each shard's path, sample count and size, enough for a [`Manifest`]
/// without rescanning.
#[derive(Debug)]
pub struct ShardWriter {
    pattern: ShardPattern,
    options: ShardWriterOptions,
    next_shard: u64,
    current: Option<Current>,
    done: Vec<ShardInfo>,
    last_key: Option<String>,
}

impl ShardWriter {
    /// A writer for shards named by `pattern` (`out/train-%06d.tar`). Creates nothing until
    /// the first sample. Fails with a [`ConfigError`] naming the option if the pattern has no
    /// or several numbers, or a limit is 0.
    pub fn new(pattern: &str, options: ShardWriterOptions) -> Result<ShardWriter, ConfigError> {
        let pattern = ShardPattern::parse(pattern)?;
        if options.max_count == 0 {
            return Err(ConfigError::new(
                "max_count",
                "0 samples per shard; pass at least 1",
            ));
        }
        if options.max_size == 0 {
            return Err(ConfigError::new(
                "max_size",
                "0 bytes per shard; pass at least 1",
            ));
        }
        Ok(ShardWriter {
            pattern,
            options,
            next_shard: options.start_shard,
            current: None,
            done: Vec::new(),
            last_key: None,
        })
    }

    /// Writes one sample (see [`SampleWriter::write`] for what is refused), starting a new
    /// shard first if the current one is full.
    pub fn write(&mut self, key: &str, fields: &[(&str, &[u8])]) -> Result<(), Error> {
        // Check before rotating, so a refused sample creates no shard; the key-repeat check
        // spans shard boundaries, as reading a dataset back would merge nothing there but a
        // repeated key is still a mistake.
        let members = plan_sample(key, fields, self.last_key.as_deref())?;
        let size: u64 = members
            .iter()
            .map(|(p, d)| tar::member_len(p, d.len() as u64))
            .sum();
        if let Some(cur) = &self.current {
            let count = cur.writer.samples();
            let bytes = cur.writer.position();
            if count >= self.options.max_count
                || (count > 0 && bytes + size + END_OF_ARCHIVE_LEN > self.options.max_size)
            {
                self.close_current()?;
            }
        }
        if self.current.is_none() {
            self.open_next()?;
        }
        let cur = self.current.as_mut().expect("a shard is open");
        let span = cur.writer.write(key, fields)?;
        cur.spans.push(span);
        self.last_key = Some(key.to_owned());
        Ok(())
    }

    /// Writes a [`Sample`], as [`SampleWriter::write_sample`] does.
    pub fn write_sample(&mut self, sample: &Sample) -> Result<(), Error> {
        let (key, fields) = sample_parts(sample)?;
        self.write(&key, &fields)
    }

    /// The shards finished so far.
    pub fn shards(&self) -> &[ShardInfo] {
        &self.done
    }

    /// Finishes the shard in progress and returns every shard written: final path, samples,
    /// bytes. No sample written means no shard.
    pub fn finish(mut self) -> Result<Vec<ShardInfo>, Error> {
        self.close_current()?;
        Ok(std::mem::take(&mut self.done))
    }

    fn open_next(&mut self) -> Result<(), Error> {
        let path = self.pattern.path(self.next_shard);
        self.next_shard += 1;
        let mut tmp = path.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let name = tmp.display().to_string();
        let file = File::create(&tmp).map_err(|e| Error::io(&name, e))?;
        self.current = Some(Current {
            path,
            tmp,
            writer: SampleWriter::new(BufWriter::with_capacity(1 << 20, file), name),
            spans: Vec::new(),
        });
        Ok(())
    }

    fn close_current(&mut self) -> Result<(), Error> {
        let Some(cur) = self.current.take() else {
            return Ok(());
        };
        let tmp_name = cur.tmp.display().to_string();
        let samples = cur.writer.samples();
        let result = (|| {
            let out = cur.writer.finish()?;
            let file = out
                .into_inner()
                .map_err(|e| Error::io(&tmp_name, e.into_error()))?;
            // Without the sync a crash soon after the rename can leave a complete-looking
            // name over missing data on some file systems.
            file.sync_all().map_err(|e| Error::io(&tmp_name, e))?;
            let bytes = file.metadata().map_err(|e| Error::io(&tmp_name, e))?.len();
            drop(file);
            let idx = index_path(&cur.path);
            if !self.options.write_index {
                // An index left by an earlier run would not fit the new shard.
                match std::fs::remove_file(&idx) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => {
                        return Err(Error::io(idx.display().to_string(), e));
                    }
                    _ => {}
                }
            }
            std::fs::rename(&cur.tmp, &cur.path)
                .map_err(|e| Error::io(cur.path.display().to_string(), e))?;
            if self.options.write_index {
                ShardIndex { spans: cur.spans }.save(&idx)?;
            }
            Ok(bytes)
        })();
        match result {
            Ok(bytes) => {
                self.done.push(ShardInfo {
                    path: cur.path.display().to_string(),
                    samples,
                    bytes,
                });
                Ok(())
            }
            Err(e) => {
                let _ = std::fs::remove_file(&cur.tmp);
                Err(e)
            }
        }
    }
}

impl Drop for ShardWriter {
    fn drop(&mut self) {
        if let Some(cur) = self.current.take() {
            // Not finished: the partial shard must not stay behind.
            drop(cur.writer);
            let _ = std::fs::remove_file(&cur.tmp);
        }
    }
}

/// Writes `bytes` to `path` through `<path>.tmp`, synced, then renamed.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let name = tmp.display().to_string();
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(name, e));
    }
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(path.display().to_string(), e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{ReaderUnderTest, check_reader, same_sample};

    const URI: &str = "mem://shard.tar";

    fn shard(samples: &[(&str, &[NamedBytes<'_>])]) -> Vec<u8> {
        let mut w = SampleWriter::new(Vec::new(), "mem");
        for (k, f) in samples {
            w.write(k, f).unwrap();
        }
        w.finish().unwrap()
    }

    fn read_all(data: &[u8]) -> Result<Vec<Sample>, Error> {
        Samples::new(Bytes::copy_from_slice(data), URI, TarOptions::default()).collect()
    }

    /// A sample as (key, [(field, bytes)]).
    type Plain = (String, Vec<(String, Vec<u8>)>);

    /// (key, [(field, bytes)]) without the __key__ field, which is checked here.
    fn plain(s: &Sample) -> Plain {
        let (first, rest) = s.fields.split_first().expect("a __key__ field");
        assert_eq!(first.0, KEY_FIELD);
        match &first.1 {
            Field::Text(k) => assert_eq!(&k[..], s.key.as_bytes()),
            other => panic!("__key__ is {other:?}"),
        }
        let fields = rest
            .iter()
            .map(|(n, f)| match f {
                Field::Bytes(b) => (n.to_string(), b.to_vec()),
                other => panic!("field {n} is {other:?}"),
            })
            .collect();
        (s.key.clone(), fields)
    }

    fn reason(e: &Error) -> &str {
        match e {
            Error::Corrupt { reason, .. } => reason,
            other => panic!("expected a corrupt error, got {other}"),
        }
    }

    /// Raw tar members (path, data) with our tar writer, for layouts SampleWriter refuses.
    fn raw(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut w = TarWriter::new(Vec::new());
        for (p, d) in members {
            w.append(p, d).unwrap();
        }
        w.finish().unwrap()
    }

    #[test]
    fn split_name_matches_webdataset() {
        // Expected values printed by webdataset 1.0.2's base_plus_ext (see testdata README).
        let cases: &[(&str, Option<(&str, &str)>)] = &[
            ("a.jpg", Some(("a", "jpg"))),
            ("a.b/c.d.jpg", Some(("a.b/c", "d.jpg"))),
            ("dir/sub/k.seg.png", Some(("dir/sub/k", "seg.png"))),
            ("./a.jpg", Some(("./a", "jpg"))),
            ("a..b", Some(("a", ".b"))),
            ("a.", Some(("a", ""))),
            ("README", None),
            ("dir.x/y", None),
            (".hidden", None),
            ("a/.hidden", Some(("a/", "hidden"))),
            ("a.x/.hidden", None),
            ("a//.x", Some(("a//", "x"))),
            ("/.x", Some(("/", "x"))),
            ("a.b\nc/d.e", None),
            ("ab\nc/d.e", Some(("ab\nc/d", "e"))),
            ("a/b.c/.d", None),
            ("x/y/.z", Some(("x/y/", "z"))),
            ("", None),
            ("/", None),
        ];
        for (name, want) in cases {
            assert_eq!(split_name(name), *want, "{name:?}");
        }
    }

    #[test]
    fn is_meta_matches_webdataset() {
        let cases = [
            ("__meta__", true),
            ("__", true),
            ("___", true),
            ("__index__/a.json", true),
            ("__a__\n", true),
            ("__a__.txt", false),
            ("__foo.jpg", false),
            ("x/__meta__", false),
            ("__a/b__", false),
            ("__a__b", false),
            ("a__b__", false),
            ("_a_", false),
        ];
        for (name, want) in cases {
            assert_eq!(is_meta(name), want, "{name:?}");
        }
    }

    #[test]
    fn groups_consecutive_members_like_webdataset() {
        let data = raw(&[
            ("a.jpg", b"A"),
            ("a.CLS", b"1"),
            ("README", b"skipped: no extension"),
            ("__meta__", b"skipped: metadata"),
            ("a.json", b"{}"),
            ("dir.v1/b.seg.png", b"B"),
            ("dir.v1/b.jpg", b"BJ"),
            ("a.txt", b"a again: a new sample"),
        ]);
        let got: Vec<_> = read_all(&data).unwrap().iter().map(plain).collect();
        let s = |k: &str, f: &[(&str, &[u8])]| {
            (
                k.to_string(),
                f.iter()
                    .map(|(n, d)| (n.to_string(), d.to_vec()))
                    .collect::<Vec<_>>(),
            )
        };
        assert_eq!(
            got,
            [
                s("a", &[("cls", b"1"), ("jpg", b"A"), ("json", b"{}")]),
                s("dir.v1/b", &[("jpg", b"BJ"), ("seg.png", b"B")]),
                s("a", &[("txt", b"a again: a new sample")]),
            ]
        );
        let all = read_all(&data).unwrap();
        assert_eq!(all.iter().map(|s| s.index).collect::<Vec<_>>(), [0, 1, 2]);
        // Fields view the shard's bytes (through the one Bytes): no copies.
        let shared = Bytes::copy_from_slice(&data);
        let first = Samples::new(shared.clone(), URI, TarOptions::default())
            .next()
            .unwrap()
            .unwrap();
        let Some(Field::Bytes(jpg)) = first.get("jpg") else {
            panic!()
        };
        assert!(shared.as_ptr_range().contains(&jpg.as_ptr()));
        assert!(matches!(first.fields[1].0, Cow::Borrowed(_)));
    }

    #[test]
    fn repeated_fields_and_bad_names_are_errors() {
        let e = read_all(&raw(&[("a.jpg", b"1"), ("a.JPG", b"2")])).unwrap_err();
        assert!(reason(&e).contains("repeats the field \"jpg\""), "{e}");
        let e = read_all(&raw(&[("a.__key__", b"1")])).unwrap_err();
        assert!(reason(&e).contains("metadata"), "{e}");
        // Empty shards: only the end-of-archive block.
        assert_eq!(read_all(&raw(&[])).unwrap().len(), 0);
        assert_eq!(read_all(&raw(&[("README", b"x")])).unwrap().len(), 0);
    }

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

    #[test]
    fn writer_refuses_samples_that_would_not_read_back() {
        let mut w = SampleWriter::new(Vec::new(), "mem");
        let refuse =
            |w: &mut SampleWriter<Vec<u8>>, key: &str, fields: &[(&str, &[u8])], what: &str| {
                let before = w.position();
                let e = w.write(key, fields).unwrap_err();
                assert!(matches!(e, Error::Config(_)), "{e}");
                assert!(e.to_string().contains(what), "{key:?}: {e}");
                assert_eq!(w.position(), before);
            };
        refuse(&mut w, "", &[("jpg", b"x")], "non-empty");
        refuse(
            &mut w,
            "a.b",
            &[("jpg", b"x")],
            "would read key Some(\"a\")",
        );
        refuse(&mut w, "k", &[("JPG", b"x")], "write \"jpg\"");
        refuse(&mut w, "k", &[("", b"x")], "non-empty");
        refuse(&mut w, "k", &[("a/b", b"x")], "'/'");
        refuse(&mut w, "k", &[("jpg", b"x"), ("jpg", b"y")], "two fields");
        refuse(&mut w, "k", &[("__key__", b"k")], "no fields");
        refuse(&mut w, "__a__/k", &[("jpg", b"x")], "metadata");
        w.write("k", &[("jpg", b"x"), ("__key__", b"ignored")])
            .unwrap();
        refuse(&mut w, "k", &[("jpg", b"x")], "repeats the previous");
        // Dots in directories are fine.
        w.write("a.b/c", &[("seg.png", b"x")]).unwrap();
        let back: Vec<_> = read_all(&w.finish().unwrap())
            .unwrap()
            .iter()
            .map(plain)
            .collect();
        assert_eq!(back[0], ("k".into(), vec![("jpg".into(), b"x".to_vec())]));
        assert_eq!(
            back[1],
            ("a.b/c".into(), vec![("seg.png".into(), b"x".to_vec())])
        );
    }

    struct Wds;

    impl ReaderUnderTest for Wds {
        fn name(&self) -> &str {
            "webdataset"
        }

        fn write(&self, samples: &[Sample]) -> Result<Vec<u8>, Error> {
            let mut w = SampleWriter::new(Vec::new(), "mem");
            for s in samples {
                w.write_sample(s)?;
            }
            w.finish()
        }

        fn read_all(&self, shard: &[u8], origin: &str) -> Result<Vec<Sample>, Error> {
            Samples::new(Bytes::copy_from_slice(shard), origin, TarOptions::default()).collect()
        }

        fn read_at(&self, shard: &[u8], origin: &str, i: usize) -> Result<Sample, Error> {
            let index = ShardIndex::scan(shard, origin, TarOptions::default())?;
            let span = *index
                .spans()
                .get(i)
                .ok_or_else(|| Error::corrupt(origin, 0, format!("no sample {i} in the index")))?;
            let mut s = read_sample(
                &Bytes::copy_from_slice(shard),
                span,
                origin,
                TarOptions::default(),
            )?;
            s.index = i as u64;
            Ok(s)
        }
    }

    fn sample(i: u64, key: &str, fields: &[(&'static str, &[u8])]) -> Sample {
        let mut s = Sample::new(i).with(KEY_FIELD, Field::Text(Bytes::from(key.to_string())));
        s.key = key.to_string();
        for (n, d) in fields {
            s = s.with(*n, Field::Bytes(Bytes::copy_from_slice(d)));
        }
        s
    }

    #[test]
    fn passes_check_reader() {
        let long = format!("{}/k", "x".repeat(150));
        let samples = vec![
            sample(0, "a", &[("cls", b"3"), ("jpg", &[0xff, 0xd8, 1, 2, 3])]),
            sample(1, "dir.v2/b", &[("cls", b"4"), ("jpg", &[7; 600])]),
            sample(2, &long, &[("cls", b""), ("jpg", b"j")]),
        ];
        check_reader(&Wds, &samples).unwrap();
    }

    #[test]
    fn source_reads_shards_with_and_without_index_files() {
        let dir = tempfile::tempdir().unwrap();
        let pattern = dir.path().join("s-%04d.tar");
        let mut w = ShardWriter::new(
            pattern.to_str().unwrap(),
            ShardWriterOptions {
                max_count: 3,
                write_index: true,
                ..ShardWriterOptions::default()
            },
        )
        .unwrap();
        for i in 0..7u8 {
            w.write(
                &format!("k{i}"),
                &[("cls", &[b'0' + i]), ("jpg", &vec![i; 100 * i as usize])],
            )
            .unwrap();
        }
        let shards = w.finish().unwrap();
        let names: Vec<_> = shards
            .iter()
            .map(|s| {
                Path::new(&s.path)
                    .file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(names, ["s-0000.tar", "s-0001.tar", "s-0002.tar"]);
        assert_eq!(
            shards.iter().map(|s| s.samples).collect::<Vec<_>>(),
            [3, 3, 1]
        );
        for s in &shards {
            assert_eq!(std::fs::metadata(&s.path).unwrap().len(), s.bytes);
            assert!(index_path(Path::new(&s.path)).exists());
        }
        let paths: Vec<_> = shards.iter().map(|s| s.path.clone()).collect();
        let mut manifests = Vec::new();
        for mode in [IndexMode::Auto, IndexMode::Require, IndexMode::Scan] {
            let src = WebDatasetSource::open(
                &paths,
                WebDatasetOptions {
                    index: mode,
                    ..WebDatasetOptions::default()
                },
            )
            .unwrap();
            assert_eq!(src.manifest().total_samples(), 7);
            assert_eq!(src.manifest().format, "webdataset");
            for id in 0..7u64 {
                let s = src.read(id).unwrap();
                assert_eq!((s.index, s.key.as_str()), (id, format!("k{id}").as_str()));
                let Some(Field::Bytes(jpg)) = s.get("jpg") else {
                    panic!()
                };
                assert_eq!(jpg.len(), 100 * id as usize);
            }
            assert!(matches!(src.read(7), Err(Error::Config(_))));
            manifests.push(src.manifest().clone());
        }
        assert!(manifests.windows(2).all(|w| w[0] == w[1]));
        // The writer's shard list is the manifest.
        assert_eq!(Manifest::new(FORMAT, shards.clone()), manifests[0]);

        // Require without index files is an error naming the index; Auto scans.
        for s in &shards {
            std::fs::remove_file(index_path(Path::new(&s.path))).unwrap();
        }
        let e = WebDatasetSource::open(
            &paths,
            WebDatasetOptions {
                index: IndexMode::Require,
                ..WebDatasetOptions::default()
            },
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("s-0000.tar.idx") && e.to_string().contains("chute index"),
            "{e}"
        );
        let src = WebDatasetSource::open(&paths, WebDatasetOptions::default()).unwrap();
        assert_eq!(src.manifest(), &manifests[0]);

        // A stale index (from another shard) is caught at open or on read.
        let other = ShardIndex::scan(
            &std::fs::read(&paths[0]).unwrap(),
            "x",
            TarOptions::default(),
        )
        .unwrap();
        other.save(&index_path(Path::new(&paths[2]))).unwrap();
        let e = WebDatasetSource::open(&paths, WebDatasetOptions::default()).unwrap_err();
        assert!(e.to_string().contains("stale"), "{e}");
        let bad = "chute-wds-index 1\n0 1024\n1024 nope\n";
        std::fs::write(index_path(Path::new(&paths[2])), bad).unwrap();
        let e = WebDatasetSource::open(&paths, WebDatasetOptions::default()).unwrap_err();
        assert!(
            e.to_string().contains("s-0002.tar.idx") && e.to_string().contains("line 3"),
            "{e}"
        );
        assert!(
            WebDatasetSource::open(
                &paths,
                WebDatasetOptions {
                    index: IndexMode::Scan,
                    ..Default::default()
                }
            )
            .is_ok()
        );
        let none: &[&Path] = &[];
        assert!(matches!(
            WebDatasetSource::open(none, WebDatasetOptions::default()),
            Err(Error::Config(_))
        ));
    }

    #[test]
    fn shard_writer_rotates_by_size_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let pattern = dir.path().join("b-%d.tar");
        // Each sample: header + 1000 bytes padded to 1024 = 1536 bytes; end block 1024.
        let mut w = ShardWriter::new(
            pattern.to_str().unwrap(),
            ShardWriterOptions {
                max_size: 1536 * 2 + 1024,
                start_shard: 5,
                ..ShardWriterOptions::default()
            },
        )
        .unwrap();
        // A stale index next to a shard about to be replaced is removed.
        std::fs::write(dir.path().join("b-5.tar.idx"), "chute-wds-index 1\n").unwrap();
        for i in 0..5 {
            w.write(&format!("k{i}"), &[("bin", &[0u8; 1000])]).unwrap();
        }
        assert_eq!(w.shards().len(), 2);
        assert!(dir.path().join("b-9.tar.tmp").exists() || dir.path().join("b-7.tar.tmp").exists());
        let shards = w.finish().unwrap();
        assert_eq!(
            shards.iter().map(|s| s.samples).collect::<Vec<_>>(),
            [2, 2, 1]
        );
        assert!(shards.iter().all(|s| s.bytes <= 1536 * 2 + 1024));
        assert!(shards[2].path.ends_with("b-7.tar"));
        assert!(!dir.path().join("b-5.tar.idx").exists());
        // A sample larger than max_size gets a shard of its own.
        let mut w = ShardWriter::new(
            pattern.to_str().unwrap(),
            ShardWriterOptions {
                max_size: 10,
                ..Default::default()
            },
        )
        .unwrap();
        w.write("big", &[("bin", &[1u8; 5000])]).unwrap();
        w.write("big2", &[("bin", &[1u8; 5000])]).unwrap();
        assert_eq!(w.finish().unwrap().len(), 2);
        // Dropped without finish: the shard in progress disappears, finished ones stay.
        let pattern = dir.path().join("d-%02d.tar");
        let mut w = ShardWriter::new(
            pattern.to_str().unwrap(),
            ShardWriterOptions {
                max_count: 1,
                ..Default::default()
            },
        )
        .unwrap();
        w.write("a", &[("x", b"1")]).unwrap();
        w.write("b", &[("x", b"2")]).unwrap();
        drop(w);
        assert!(dir.path().join("d-00.tar").exists());
        assert!(!dir.path().join("d-01.tar").exists());
        assert!(!dir.path().join("d-01.tar.tmp").exists());
        // Nothing written, nothing created.
        let w = ShardWriter::new(
            dir.path().join("e-%d.tar").to_str().unwrap(),
            ShardWriterOptions::default(),
        )
        .unwrap();
        assert!(w.finish().unwrap().is_empty());
        assert!(!dir.path().join("e-0.tar").exists());
    }

    #[test]
    fn shard_patterns() {
        let p = |s: &str| ShardPattern::parse(s).map(|p| p.path(42).display().to_string());
        assert_eq!(p("out-%06d.tar").unwrap(), "out-000042.tar");
        assert_eq!(p("out-%d.tar").unwrap(), "out-42.tar");
        assert_eq!(p("100%%-%03d.tar").unwrap(), "100%-042.tar");
        for bad in ["out.tar", "%d-%d.tar", "%s.tar", "%6d.tar", "x%"] {
            let e = p(bad).unwrap_err();
            assert_eq!(e.option, "pattern");
            assert!(e.reason.contains(&format!("{bad:?}")), "{e}");
        }
        assert!(
            ShardWriter::new(
                "x-%d",
                ShardWriterOptions {
                    max_count: 0,
                    ..Default::default()
                }
            )
            .is_err()
        );
    }

    #[test]
    fn write_sample_refuses_arrays() {
        let mut w = SampleWriter::new(Vec::new(), "mem");
        let s = Sample::new(0).with("x", Field::Array(chute_core::Array::scalar_i64(3)));
        let mut s = s;
        s.key = "k".into();
        let e = w.write_sample(&s).unwrap_err();
        assert!(e.to_string().contains("is an array"), "{e}");
    }

    /// Golden shards made by other tools (testdata/webdataset/README.md says how).
    mod golden {
        use super::*;

        fn testdata(name: &str) -> PathBuf {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../testdata/webdataset")
                .join(name)
        }

        fn open(name: &str) -> WebDatasetSource {
            WebDatasetSource::open(
                &[testdata(name)],
                WebDatasetOptions {
                    index: IndexMode::Scan,
                    ..WebDatasetOptions::default()
                },
            )
            .unwrap()
        }

        fn all(src: &WebDatasetSource) -> Vec<Plain> {
            (0..src.manifest().total_samples())
                .map(|i| plain(&src.read(i).unwrap()))
                .collect()
        }

        fn fields(f: &[(&str, &[u8])]) -> Vec<(String, Vec<u8>)> {
            f.iter().map(|(n, d)| (n.to_string(), d.to_vec())).collect()
        }

        #[test]
        fn webdataset_tarwriter_shard() {
            let src = open("wds-tarwriter.tar");
            let got = all(&src);
            let jpg = |i: u8| -> Vec<u8> { [&[0xff, 0xd8, 0xff, 0xe0][..], &[i; 10][..]].concat() };
            let want = vec![
                (
                    "sample000".to_string(),
                    fields(&[
                        ("cls", b"0"),
                        ("jpg", &jpg(0)),
                        ("json", br#"{"i": 0, "caption": "image 0"}"#),
                    ]),
                ),
                (
                    "sample001".to_string(),
                    fields(&[
                        ("cls", b"1"),
                        ("jpg", &jpg(1)),
                        ("json", br#"{"i": 1, "caption": "image 1"}"#),
                    ]),
                ),
                (
                    "sample002".to_string(),
                    fields(&[
                        ("cls", b"2"),
                        ("jpg", &jpg(2)),
                        ("json", br#"{"i": 2, "caption": "image 2"}"#),
                    ]),
                ),
                (
                    "train.v1/shard.a/sample003".to_string(),
                    fields(&[
                        ("cls", b"3"),
                        ("jpg", &jpg(3)),
                        ("seg.png", b"\x89PNG fake"),
                    ]),
                ),
            ];
            assert_eq!(got, want);
            let seq: Vec<_> = Samples::new(
                Bytes::from(std::fs::read(testdata("wds-tarwriter.tar")).unwrap()),
                "golden",
                TarOptions::default(),
            )
            .map(|s| plain(&s.unwrap()))
            .collect();
            assert_eq!(seq, want);
        }

        #[test]
        fn webdataset_shardwriter_shards() {
            let src = WebDatasetSource::open(
                &[
                    testdata("wds-shard-000000.tar"),
                    testdata("wds-shard-000001.tar"),
                ],
                WebDatasetOptions::default(),
            )
            .unwrap();
            let got = all(&src);
            assert_eq!(
                src.manifest()
                    .shards
                    .iter()
                    .map(|s| s.samples)
                    .collect::<Vec<_>>(),
                [3, 2]
            );
            let keys: Vec<_> = got.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(keys, ["s0", "s1", "s2", "s3", "s4"]);
            for (i, (_, f)) in got.iter().enumerate() {
                assert_eq!(
                    f,
                    &fields(&[
                        ("cls", i.to_string().as_bytes()),
                        ("txt", format!("text {i}").as_bytes())
                    ])
                );
            }
        }

        #[test]
        fn gnu_tar_long_names() {
            let got = all(&open("gnu-longname.tar"));
            let dir = "a.very.long.directory.name.with.dots/".repeat(3);
            assert_eq!(
                got,
                vec![
                    (
                        format!("{dir}sample_with_a_rather_long_key_0001"),
                        fields(&[("cls", b"1\n"), ("txt", b"hello\n")])
                    ),
                    ("short".to_string(), fields(&[("txt", b"short\n")])),
                ]
            );
        }

        #[test]
        fn gnu_tar_ustar_prefix() {
            let got = all(&open("ustar.tar"));
            let dir = "a.very.long.directory.name.with.dots/".repeat(3);
            assert_eq!(
                got,
                vec![
                    (
                        format!("{dir}sample_with_a_rather_long_key_0001"),
                        fields(&[("cls", b"1\n"), ("txt", b"hello\n")])
                    ),
                    ("short".to_string(), fields(&[("txt", b"short\n")])),
                ]
            );
        }

        #[test]
        fn gnu_tar_pax_format() {
            let got = all(&open("pax.tar"));
            let dir = "a.very.long.directory.name.with.dots/".repeat(3);
            assert_eq!(
                got,
                vec![
                    (
                        format!("{dir}sample_with_a_rather_long_key_0001"),
                        fields(&[("cls", b"1\n"), ("txt", b"hello\n")])
                    ),
                    ("short".to_string(), fields(&[("txt", b"short\n")])),
                    (
                        "\u{e9}t\u{e9}".to_string(),
                        fields(&[("txt", b"unicode\n")])
                    ),
                ]
            );
        }
    }
}
