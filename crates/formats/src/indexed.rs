//! Opening indexed shards: what WebDataset tar shards and TFRecord files share.
//!
//! Both formats read each shard at random through per-shard sample offsets, which come from a
//! `<shard>.idx` file next to the shard ([`index_path`], written by `chute index`) or from a
//! scan of the shard at open ([`IndexMode`]). [`IndexedShards::open`] is the one place that
//! does this: paths to [`Location`]s, a [`ShardSet`], the index file read (or not) as the mode
//! says, parsed or the shard scanned, and the memory map advised for the access pattern. The
//! format supplies only its own pieces, through [`ShardFormat`]: how to parse and check an
//! index file, how to scan a shard, and any check of a shard before either.
//!
//! One opener means one behaviour: with [`IndexMode::Require`], a missing index file is an
//! [`Error::Io`] of kind [`io::ErrorKind::NotFound`] naming the index file (a
//! `FileNotFoundError` in Python) for every format.

use std::io;
use std::path::{Path, PathBuf};

use chute_core::{Error, Manifest, Plan};
use chute_io::{Location, ShardSet};

/// What an index file's name adds to its shard's.
pub const INDEX_SUFFIX: &str = ".idx";

/// Where a shard's index file is: `<shard>.idx` next to it (`train-00000.tar.idx` for
/// `train-00000.tar`, `train-00000.tfrecord.idx` for `train-00000.tfrecord`).
pub fn index_path(shard: &Path) -> PathBuf {
    let mut p = shard.as_os_str().to_owned();
    p.push(INDEX_SUFFIX);
    PathBuf::from(p)
}

/// Removes the index file of `shard`, if there is one: what a writer does before it replaces
/// a shard, since an index of an older version of the shard must not outlive it. Fails with
/// [`Error::Io`] naming the index file if it exists and cannot be removed.
pub(crate) fn remove_stale_index(shard: &Path) -> Result<(), Error> {
    let idx = index_path(shard);
    match std::fs::remove_file(&idx) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(Error::io(idx.display().to_string(), e))
        }
        _ => Ok(()),
    }
}

/// The format-specific pieces of opening an indexed shard.
pub(crate) trait ShardFormat {
    /// A shard's index as the source keeps it in memory.
    type Index;

    /// Checks shard `i` of `files` before its index is read or built (TFRecord refuses
    /// GZIP-compressed files here). The default accepts every shard.
    fn check_shard(&self, files: &ShardSet, i: usize) -> Result<(), Error> {
        let _ = (files, i);
        Ok(())
    }

    /// Parses the bytes of an index file (`origin` names it in errors) and checks that it
    /// fits its shard: `size` bytes long, whose bytes are `shard` when they are at hand (a
    /// local file's map; `None` for a remote shard, which is not downloaded for the check).
    /// Fails with [`Error::Corrupt`] naming `origin` if the file is malformed or belongs to
    /// another shard.
    fn parse_index(
        &self,
        text: &[u8],
        origin: &str,
        shard: Option<&[u8]>,
        size: u64,
    ) -> Result<Self::Index, Error>;

    /// Builds the index of the whole shard `data` (named `uri` in errors) by scanning it.
    fn scan(&self, data: &[u8], uri: &str) -> Result<Self::Index, Error>;
}

/// Shards opened with their indexes, in the order of the paths.
#[derive(Debug)]
pub(crate) struct IndexedShards<I> {
    /// Where the shards' bytes come from.
    pub(crate) files: ShardSet,
    /// One index per shard.
    pub(crate) indexes: Vec<I>,
}

impl<I> IndexedShards<I> {
    /// Opens `paths` (local paths or URLs), one shard each, with each shard's index from its
    /// `<shard>.idx` file or a scan, as `mode` says. A local shard's map is advised for
    /// sequential reading while it is scanned and for random access afterwards; a remote
    /// shard without an index file is downloaded once, to be scanned.
    ///
    /// Fails with [`Error::Io`] if a shard or an index file cannot be opened or fetched, or
    /// (of kind `NotFound`, naming the index file) if `mode` is [`IndexMode::Require`] and an
    /// index file is missing; with [`Error::Config`] for an unknown URL scheme; otherwise as
    /// the format's [`ShardFormat`] methods fail.
    pub(crate) fn open<P, F>(paths: &[P], mode: IndexMode, format: &F) -> Result<Self, Error>
    where
        P: AsRef<Path>,
        F: ShardFormat<Index = I>,
    {
        let locations = paths
            .iter()
            .map(|p| Location::from_path(p.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        let files = ShardSet::open(&locations)?;
        let mut indexes = Vec::with_capacity(locations.len());
        for (i, loc) in locations.iter().enumerate() {
            format.check_shard(&files, i)?;
            let idx = loc.with_suffix(INDEX_SUFFIX);
            let text = match mode {
                IndexMode::Scan => None,
                IndexMode::Auto => files.read_optional(&idx)?,
                IndexMode::Require => {
                    Some(files.read_optional(&idx)?.ok_or_else(|| missing(&idx))?)
                }
            };
            let index = match text {
                Some(text) => {
                    let shard = files.mapped(i).map(|file| file.as_slice());
                    format.parse_index(&text, &idx.to_string(), shard, files.size(i))?
                }
                None => {
                    if let Some(file) = files.mapped(i) {
                        file.advise_sequential();
                    }
                    format.scan(&files.get(i)?, files.uri(i))?
                }
            };
            if let Some(file) = files.mapped(i) {
                file.advise_random();
            }
            indexes.push(index);
        }
        Ok(IndexedShards { files, indexes })
    }
}

/// The error for an index file that [`IndexMode::Require`] needs and that does not exist.
fn missing(idx: &Location) -> Error {
    Error::io(
        idx.to_string(),
        io::Error::new(
            io::ErrorKind::NotFound,
            "no such index file, and index mode require needs one per shard; write them with \
             `chute index <shards>`, or use index mode auto or scan (shards without an index \
             file are then scanned at open)",
        ),
    )
}

/// What an indexed source does with [`chute_core::Source::set_plan`]: remote shards stream in
/// the plan's shard order, whole and with read-ahead, when the plan reads shards in order
/// (a window of them at a time); otherwise they are read by range. Local shards are mapped
/// and need nothing.
pub(crate) fn set_plan(files: &ShardSet, manifest: &Manifest, plan: &Plan) {
    if (0..files.len()).any(|i| files.is_remote(i)) {
        match plan.shard_window() {
            Some(w) => files.set_order(&plan.shard_order(manifest), w),
            None => files.set_order(&[], 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use chute_core::Source;

    use super::*;
    use crate::tfrecord::{self, TfRecordFileWriter, TfRecordOptions, TfRecordSource};
    use crate::webdataset::{SampleWriter, WebDatasetOptions, WebDatasetSource};

    /// One format under test: a shard of 3 samples and its index file are written at a path;
    /// opening gives the source's sample count.
    struct Case {
        name: &'static str,
        write_shard: fn(&Path),
        write_index: fn(&Path),
        open: fn(&Path, IndexMode) -> Result<u64, Error>,
    }

    fn cases() -> [Case; 2] {
        [
            Case {
                name: "a.tar",
                write_shard: |path| {
                    let mut w = SampleWriter::new(Vec::new(), "mem");
                    for key in ["a", "b", "c"] {
                        w.write(key, &[("txt", key.as_bytes())]).unwrap();
                    }
                    std::fs::write(path, w.finish().unwrap()).unwrap();
                },
                write_index: |path| {
                    let src = WebDatasetSource::open(&[path], WebDatasetOptions::default());
                    src.unwrap().shard_index(0).save(&index_path(path)).unwrap();
                },
                open: |path, index| {
                    let options = WebDatasetOptions {
                        index,
                        ..Default::default()
                    };
                    let src = WebDatasetSource::open(&[path], options)?;
                    Ok(src.manifest().total_samples())
                },
            },
            Case {
                name: "a.tfrecord",
                write_shard: |path| {
                    let mut w = TfRecordFileWriter::create(path, Default::default()).unwrap();
                    for record in [&b"a"[..], b"b", b"c"] {
                        w.write_record(record).unwrap();
                    }
                    w.finish().unwrap();
                },
                write_index: |path| {
                    let data = std::fs::read(path).unwrap();
                    let entries = tfrecord::build_index(&data, "a", Default::default()).unwrap();
                    tfrecord::write_index(&index_path(path), &entries).unwrap();
                },
                open: |path, index| {
                    let options = TfRecordOptions {
                        index,
                        example: None,
                        ..Default::default()
                    };
                    let src = TfRecordSource::open(&[path], options)?;
                    Ok(src.manifest().total_samples())
                },
            },
        ]
    }

    #[test]
    fn every_indexed_format_opens_shards_alike() {
        let dir = tempfile::tempdir().unwrap();
        for case in cases() {
            let shard = dir.path().join(case.name);
            let idx = index_path(&shard);
            (case.write_shard)(&shard);
            let open = |mode| (case.open)(&shard, mode);

            // No index file: Require fails with NotFound naming the index file, and says what
            // to do; Auto and Scan scan the shard.
            let e = open(IndexMode::Require).unwrap_err();
            match &e {
                Error::Io { path, source } => {
                    assert_eq!(path, &idx.display().to_string(), "{}", case.name);
                    assert_eq!(source.kind(), io::ErrorKind::NotFound, "{}", case.name);
                }
                other => panic!("{}: expected an I/O error, got {other}", case.name),
            }
            let message = e.to_string();
            assert!(
                message.contains("chute index") && message.contains("auto or scan"),
                "{message}"
            );
            assert_eq!(open(IndexMode::Auto).unwrap(), 3, "{}", case.name);
            assert_eq!(open(IndexMode::Scan).unwrap(), 3, "{}", case.name);

            // A good index file is read by Auto and Require.
            (case.write_index)(&shard);
            assert_eq!(open(IndexMode::Require).unwrap(), 3, "{}", case.name);
            assert_eq!(open(IndexMode::Auto).unwrap(), 3, "{}", case.name);

            // A malformed one shows that it is read (the error names it), and Scan ignores it.
            std::fs::write(&idx, "not an index\n").unwrap();
            for mode in [IndexMode::Auto, IndexMode::Require] {
                match open(mode).unwrap_err() {
                    Error::Corrupt { uri, .. } => assert_eq!(uri, idx.display().to_string()),
                    other => panic!("{}: expected a corrupt index, got {other}", case.name),
                }
            }
            assert_eq!(open(IndexMode::Scan).unwrap(), 3, "{}", case.name);
        }
    }
}

/// Where an indexed source (WebDataset tar shards, TFRecord files) gets each shard's sample
/// offsets: the `<shard>.idx` files `chute index` writes, or a scan of the shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IndexMode {
    /// Read `<shard>.idx` when it exists, scan the shard otherwise. The default.
    #[default]
    Auto,
    /// Read `<shard>.idx`; a missing index is an error (for datasets too large to scan at
    /// start-up).
    Require,
    /// Always scan, ignoring index files (for shards whose indexes may be stale).
    Scan,
}

impl IndexMode {
    /// Every mode, as [`IndexMode::name`]s them.
    pub const ALL: [IndexMode; 3] = [IndexMode::Auto, IndexMode::Require, IndexMode::Scan];

    /// `auto`, `require` or `scan`: what the CLI and Python take.
    pub fn name(self) -> &'static str {
        match self {
            IndexMode::Auto => "auto",
            IndexMode::Require => "require",
            IndexMode::Scan => "scan",
        }
    }
}

impl std::fmt::Display for IndexMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for IndexMode {
    type Err = chute_core::ConfigError;

    fn from_str(s: &str) -> Result<IndexMode, chute_core::ConfigError> {
        IndexMode::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                chute_core::ConfigError::new(
                    "index",
                    format!("{s:?}; use \"auto\", \"require\" or \"scan\""),
                )
            })
    }
}
