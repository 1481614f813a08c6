//! Writers: [`SampleWriter`] writes samples as members into one tar stream; [`ShardWriter`]
//! into numbered shard files, rotating by count or size.

use std::borrow::Cow;
use std::io::Write;
use std::path::PathBuf;

use chute_core::{ConfigError, Error, Field, Sample, ShardInfo};
use chute_io::AtomicFile;

use super::group::SampleSpan;
use super::index::ShardIndex;
use super::names::{KEY_FIELD, is_meta, split_name};
use crate::indexed::{index_path, remove_stale_index};
use crate::tar::{self, END_OF_ARCHIVE_LEN, TarWriter};

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
pub(super) type NamedBytes<'a> = (&'a str, &'a [u8]);

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

/// A sample's tar members, in order: each path and its bytes (compressed where the field
/// is `.gz`).
type Members<'a> = Vec<(String, Cow<'a, [u8]>)>;

/// The members of one sample, sorted by field name, after checking that they read back as
/// `key` and these fields.
fn plan_sample<'a>(
    key: &str,
    fields: &[(&str, &'a [u8])],
    last_key: Option<&str>,
) -> Result<Members<'a>, ConfigError> {
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
        // A `.gz` field reads back decompressed (as the `webdataset` package decodes it), so
        // it is written compressed: what is read is what was written.
        let data = if name == "gz" || name.ends_with(".gz") {
            use std::io::Write;
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            gz.write_all(data)
                .and_then(|()| gz.finish())
                .map(Cow::Owned)
                .map_err(|e| bad("fields", format!("field {name:?} of sample {key:?}: {e}")))?
        } else {
            Cow::Borrowed(data)
        };
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
    writer: SampleWriter<AtomicFile>,
    spans: Vec<SampleSpan>,
}

/// Writes samples into numbered shards: `pattern` with its `%06d` (or `%d`) replaced by the
/// shard number, a new shard when the current one reaches
/// [`ShardWriterOptions::max_count`] samples or the next sample would take it past
/// [`ShardWriterOptions::max_size`] bytes.
///
/// Each shard is written as `<shard>.tmp` and renamed when complete (an [`AtomicFile`]), so an
/// interrupted run never leaves a partial shard under a final name; dropping the writer
/// without [`ShardWriter::finish`] deletes the shard in progress (finished ones stay).
/// `finish` returns each shard's path, sample count and size, enough for a [`Manifest`]
/// without rescanning.
///
/// [`Manifest`]: chute_core::Manifest
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
        let file = AtomicFile::create(self.pattern.path(self.next_shard))?;
        self.next_shard += 1;
        let name = file.temp_path().display().to_string();
        self.current = Some(Current {
            writer: SampleWriter::new(file, name),
            spans: Vec::new(),
        });
        Ok(())
    }

    /// Finishes the shard in progress: the end-of-archive block, the file renamed into place,
    /// its index written if asked. On failure the shard's temporary file is deleted.
    fn close_current(&mut self) -> Result<(), Error> {
        let Some(cur) = self.current.take() else {
            return Ok(());
        };
        let samples = cur.writer.samples();
        let file = cur.writer.finish()?;
        let path = file.path().to_path_buf();
        // An index left by an earlier run would not fit the new shard.
        remove_stale_index(&path)?;
        let bytes = file.finish()?;
        if self.options.write_index {
            ShardIndex { spans: cur.spans }.save(&index_path(&path))?;
        }
        self.done.push(ShardInfo {
            path: path.display().to_string(),
            samples,
            bytes,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::webdataset::testing::{plain, read_all};

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

    #[test]
    fn gzip_fields_are_written_compressed_and_read_back_as_written() {
        let mut w = SampleWriter::new(Vec::new(), "mem");
        w.write("k", &[("txt.gz", b"hello, again"), ("cls", b"1")])
            .unwrap();
        let shard = w.finish().unwrap();
        // The member holds gzip (its magic), the sample reads back as written.
        assert!(shard.windows(2).any(|w| w == [0x1f, 0x8b]));
        assert!(!shard.windows(12).any(|w| w == b"hello, again"));
        let back: Vec<_> = read_all(&shard).unwrap().iter().map(plain).collect();
        assert_eq!(
            back[0].1,
            [
                ("cls".into(), b"1".to_vec()),
                ("txt.gz".into(), b"hello, again".to_vec())
            ]
        );
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
}
