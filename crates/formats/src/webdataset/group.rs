//! Grouping consecutive members into samples, as `webdataset`'s `group_by_keys` does: one pass
//! over a shard ([`Samples`]) or one sample's range ([`read_sample`], [`read_span`]).

use std::borrow::Cow;
use std::ops::Range;

use bytes::Bytes;
use chute_core::{Corruption, Error, Field, FieldName, Sample};

use super::names::{KEY_FIELD, is_meta, split_name};
use crate::tar::{Member, TarDecoder, TarOptions};

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

/// One sample being grouped: its key, field names (in an arena reused from sample to
/// sample, so scanning allocates nothing per member) and data ranges.
#[derive(Debug, Default)]
pub(super) struct Group {
    pub(super) key: String,
    names: String,
    /// (name range in `names`, data range in the shard).
    fields: Vec<(Range<usize>, Range<u64>)>,
    pub(super) span: SampleSpan,
}

impl Group {
    fn name(&self, i: usize) -> &str {
        &self.names[self.fields[i].0.clone()]
    }
}

/// Groups consecutive members by key, as `webdataset`'s `group_by_keys` does.
#[derive(Debug, Default)]
pub(super) struct Grouper {
    cur: Group,
    /// The last finished sample.
    pub(super) done: Group,
    open: bool,
}

impl Grouper {
    /// Adds a member. Returns true when the member started a new sample after a finished one,
    /// which is then in `done`.
    pub(super) fn add(&mut self, m: &Member<'_>, uri: &str) -> Result<bool, Error> {
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
    pub(super) fn finish(&mut self) -> bool {
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
                Error::truncated(
                    uri,
                    range.start,
                    format!(
                        "field {:?} of sample {:?} runs past the shard's end (byte {})",
                        g.name(i),
                        g.key,
                        shard.len()
                    ),
                )
            })?;
        let name = g.name(i);
        let data = if name == "gz" || name.ends_with(".gz") {
            gunzip(&data, uri, range.start, name, &g.key)?
        } else {
            data
        };
        fields.push((field_name(name), Field::Bytes(data)));
    }
    Ok(Sample {
        index,
        key: g.key.clone(),
        fields,
    })
}

/// A gzip-compressed member (`x.txt.gz`) decompressed, as the `webdataset` package's default
/// decoder gives it (the field keeps its name), at most
/// [`Limits::max_decoded_bytes`](chute_core::Limits) of it; the error names the shard, the
/// member's offset, the field and the sample.
fn gunzip(data: &Bytes, uri: &str, at: u64, name: &str, key: &str) -> Result<Bytes, Error> {
    use std::io::Read;
    let limit = chute_core::Limits::current().max_decoded_bytes;
    let mut out = Vec::new();
    let read = flate2::read::MultiGzDecoder::new(&data[..])
        .take(limit.saturating_add(1))
        .read_to_end(&mut out);
    match read {
        Err(e) => Err(Error::corrupt(
            uri,
            at,
            format!(
                "field {name:?} of sample {key:?} is not valid gzip ({e}); the `.gz` extension \
                 says it is gzip-compressed"
            ),
        )),
        Ok(n) if n as u64 > limit => Err(Error::corrupt_as(
            chute_core::Corruption::TooLarge,
            uri,
            at,
            chute_core::limits::exceeded(
                &format!("field {name:?} of sample {key:?}"),
                n as u64,
                "bytes once decompressed",
                "max_decoded_bytes",
                limit,
            ),
        )),
        Ok(_) => Ok(Bytes::from(out)),
    }
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
    Error::corrupt_as(
        Corruption::StaleIndex,
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

#[cfg(test)]
mod tests {
    #[test]
    fn gzip_members_are_decompressed_and_bad_ones_named() {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(b"hello, gzip").unwrap();
        let gz = gz.finish().unwrap();
        let mut tar = crate::tar::TarWriter::new(Vec::new());
        tar.append("a.txt.gz", &gz).unwrap();
        tar.append("a.cls", b"1").unwrap();
        tar.append("b.txt.gz", b"not gzip at all").unwrap();
        let shard = Bytes::from(tar.finish().unwrap());
        let mut samples = Samples::new(shard, "mem://gz.tar", TarOptions::default());
        let a = samples.next().unwrap().unwrap();
        let Some(Field::Bytes(txt)) = a.get("txt.gz") else {
            panic!("{a:?}")
        };
        assert_eq!(&txt[..], b"hello, gzip");
        let e = samples.next().unwrap().unwrap_err().to_string();
        assert!(
            e.contains("mem://gz.tar")
                && e.contains("\"txt.gz\" of sample \"b\" is not valid gzip"),
            "{e}"
        );
    }

    use super::*;
    use crate::check::{ReaderUnderTest, check_reader};
    use crate::webdataset::testing::{URI, plain, raw, read_all, reason};
    use crate::webdataset::{SampleWriter, ShardIndex};

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
}
