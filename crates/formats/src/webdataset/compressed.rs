//! [`CompressedTarSource`]: gzip-compressed WebDataset shards (`.tar.gz`, `.tgz`, as the
//! `webdataset` package reads them) as a [`Source`].
//!
//! A gzip stream has no random access, so each shard is indexed by scanning it once when the
//! source is opened (decompressed as a stream, at most `max_decoded_bytes`, and dropped), and
//! read by decompressing it whole when its first sample is asked for: the few shards being
//! read stay decompressed (the current ones in file order, a shuffle window's in block
//! shuffle). A global shuffle draws every batch from every shard, so it is served only when
//! every shard fits decompressed in `max_decoded_bytes` at once; otherwise the first read
//! refuses it, naming the fix (block shuffle, or decompressed shards).

use std::collections::VecDeque;
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use chute_core::{ConfigError, Error, Limits, Manifest, Plan, Sample, ShardInfo, Shuffle, Source};

use super::group::read_span;
use super::index::ShardIndex;
use super::source::{FORMAT, WebDatasetOptions};

/// Whether `path` names a gzip-compressed tar shard.
pub fn is_compressed_tar(path: &Path) -> bool {
    let name = path.to_string_lossy();
    let name = name.split(['?', '#']).next().unwrap_or_default();
    name.ends_with(".tar.gz") || name.ends_with(".tgz")
}

#[derive(Debug)]
struct Shard {
    uri: String,
    /// The compressed shard (a memory map, or the download).
    data: Bytes,
    index: ShardIndex,
    /// Its size decompressed.
    size: u64,
}

/// A shard decompressed (or why it could not be), made once however many readers ask.
type Decompressed = Arc<OnceLock<Result<Bytes, String>>>;

/// Gzip-compressed WebDataset shards as a [`Source`]: samples by extension, as
/// [`super::WebDatasetSource`] gives them, read from shards decompressed whole when first
/// read.
#[derive(Debug)]
pub struct CompressedTarSource {
    shards: Vec<Shard>,
    manifest: Manifest,
    options: WebDatasetOptions,
    /// The shards decompressed now, most recently asked for last.
    held: Mutex<VecDeque<(usize, Decompressed)>>,
    /// How many shards stay decompressed (set by the plan).
    keep: AtomicUsize,
    /// Set when the plan is a global shuffle the held shards cannot serve.
    refused: Mutex<Option<String>>,
}

impl CompressedTarSource {
    /// Opens `paths` (local paths or URLs, each read whole: memory-mapped or downloaded), one
    /// shard each, in order, each scanned once decompressed to index its samples. Plain
    /// `.tar` shards among them are read as they are.
    pub fn open<P: AsRef<Path>>(
        paths: &[P],
        options: WebDatasetOptions,
    ) -> Result<CompressedTarSource, Error> {
        if paths.is_empty() {
            return Err(ConfigError::new("paths", "no shards given; pass at least one").into());
        }
        let mut shards = Vec::with_capacity(paths.len());
        let mut infos = Vec::with_capacity(paths.len());
        for (path, (uri, data)) in paths.iter().zip(crate::open_whole(paths, false)?) {
            let compressed = is_compressed_tar(path.as_ref());
            let whole = if compressed {
                decompress(&data).map_err(|why| Error::corrupt(&uri, 0, why))?
            } else {
                data.clone()
            };
            let index = ShardIndex::scan(&whole, &uri, options.tar)?;
            infos.push(ShardInfo {
                path: uri.clone(),
                samples: index.len() as u64,
                bytes: data.len() as u64,
            });
            shards.push(Shard {
                uri,
                size: whole.len() as u64,
                data: if compressed { data } else { whole },
                index,
            });
        }
        Ok(CompressedTarSource {
            shards,
            manifest: Manifest::new(FORMAT, infos),
            options,
            held: Mutex::new(VecDeque::new()),
            keep: AtomicUsize::new(3),
            refused: Mutex::new(None),
        })
    }

    /// Shard `s` whole (decompressed), from those held or decompressed now.
    fn whole(&self, s: usize) -> Result<Bytes, Error> {
        let shard = &self.shards[s];
        if !is_compressed_tar(Path::new(&shard.uri)) {
            return Ok(shard.data.clone());
        }
        let cell = {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            match held.iter().position(|(h, _)| *h == s) {
                Some(at) => {
                    let entry = held.remove(at).expect("found");
                    let cell = entry.1.clone();
                    held.push_back(entry);
                    cell
                }
                None => {
                    let cell = Decompressed::default();
                    held.push_back((s, cell.clone()));
                    let keep = self.keep.load(Ordering::Relaxed).max(1);
                    while held.len() > keep {
                        held.pop_front();
                    }
                    cell
                }
            }
        };
        cell.get_or_init(|| decompress(&shard.data))
            .clone()
            .map_err(|why| Error::corrupt(&shard.uri, 0, why))
    }
}

/// `data`, a gzip-compressed shard, decompressed whole (at most `max_decoded_bytes`), or
/// what is wrong with it.
fn decompress(data: &[u8]) -> Result<Bytes, String> {
    let limit = Limits::current().max_decoded_bytes;
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(data)
        .take(limit.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| format!("the shard is not valid gzip: {e}"))?;
    if out.len() as u64 > limit {
        return Err(chute_core::limits::exceeded(
            "the gzip-compressed shard",
            format!("more than {limit}"),
            "decompressed bytes",
            "max_decoded_bytes",
            limit,
        ));
    }
    Ok(Bytes::from(out))
}

impl Source for CompressedTarSource {
    fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Sample `id`: `__key__` then the fields sorted by name, from its shard decompressed.
    fn read(&self, id: u64) -> Result<Sample, Error> {
        if let Some(why) = self
            .refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Err(ConfigError::new("shuffle", why).into());
        }
        let (shard, pos) = self.manifest.locate_checked(id)?;
        let s = &self.shards[shard];
        let whole = self.whole(shard)?;
        let span = s.index.spans()[pos as usize];
        let range = span.range();
        let bytes = usize::try_from(range.end)
            .ok()
            .filter(|&end| end <= whole.len())
            .map(|end| whole.slice(range.start as usize..end))
            .ok_or_else(|| {
                Error::truncated(
                    &s.uri,
                    range.start,
                    format!(
                        "sample {id} runs past the shard's end ({} bytes)",
                        whole.len()
                    ),
                )
            })?;
        let mut sample = read_span(&bytes, span, &s.uri, self.options.tar)?;
        sample.index = id;
        Ok(sample)
    }

    /// Keeps as many shards decompressed as the plan reads at once: a few in file order, a
    /// window's (and one more) in block shuffle, all of them in a global shuffle if they fit
    /// in `max_decoded_bytes`, else the global shuffle is refused at the first read.
    fn set_plan(&self, plan: &Plan) {
        self.plan_for(plan.config().shuffle, Limits::current().max_decoded_bytes);
    }
}

impl CompressedTarSource {
    /// What [`Source::set_plan`] does for `shuffle` under a `limit` of decompressed bytes.
    fn plan_for(&self, shuffle: Shuffle, limit: u64) {
        let n = self.shards.len();
        let total: u64 = self.shards.iter().map(|s| s.size).sum();
        let mut refused = None;
        let keep = match shuffle {
            Shuffle::None => 3,
            Shuffle::Block { window } => window as usize + 2,
            Shuffle::Global if total <= limit => n,
            Shuffle::Global => {
                refused = Some(format!(
                    "a global shuffle reads every batch from every shard, and these {n} \
                     gzip-compressed shards hold {total} bytes decompressed, more than \
                     max_decoded_bytes = {limit}: use shuffle=\"block\" (shards in random \
                     order, samples shuffled within a window), or decompress the shards \
                     (gunzip, so .tar shards are read in place)"
                ));
                3
            }
        };
        self.keep.store(keep.max(1), Ordering::Relaxed);
        *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = refused;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::webdataset::SampleWriter;
    use chute_core::{Field, PlanConfig};

    fn shard(dir: &Path, name: &str, first: usize, n: usize) -> std::path::PathBuf {
        let mut w = SampleWriter::new(Vec::new(), name);
        for i in first..first + n {
            let label = i.to_string();
            w.write(&format!("s{i:04}"), &[("cls", label.as_bytes())])
                .unwrap();
        }
        let tar = w.finish().unwrap();
        let gz = dir.join(format!("{name}.tar.gz"));
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut enc, &tar).unwrap();
        std::fs::write(&gz, enc.finish().unwrap()).unwrap();
        gz
    }

    fn label(s: &Sample) -> String {
        let Some(Field::Bytes(b)) = s.get("cls") else {
            panic!("{s:?}")
        };
        String::from_utf8(b.to_vec()).unwrap()
    }

    #[test]
    fn gzip_shards_are_indexed_once_and_read_in_any_order() {
        let dir = tempfile::tempdir().unwrap();
        let a = shard(dir.path(), "a", 0, 5);
        let b = shard(dir.path(), "b", 5, 7);
        let src = CompressedTarSource::open(&[&a, &b], WebDatasetOptions::default()).unwrap();
        assert_eq!(src.manifest().total_samples(), 12);
        for id in [11, 0, 6, 3, 5] {
            let s = src.read(id).unwrap();
            assert_eq!(label(&s), id.to_string());
            assert_eq!(s.key, format!("s{id:04}"));
        }
        // A global shuffle over shards that fit decompressed is served; past the limit it is
        // refused, naming the fix.
        let plan = Plan::new(
            src.manifest(),
            &PlanConfig {
                shuffle: Shuffle::Global,
                batch_size: 4,
                ..Default::default()
            },
        )
        .unwrap();
        src.set_plan(&plan);
        assert!(src.read(4).is_ok());
        src.plan_for(Shuffle::Global, 100);
        let e = src.read(4).unwrap_err().to_string();
        assert!(
            e.contains("shuffle=\"block\"") && e.contains("gunzip"),
            "{e}"
        );
        src.plan_for(Shuffle::block(), 100);
        assert!(src.read(4).is_ok());
    }

    #[test]
    fn bad_gzip_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.tgz");
        std::fs::write(&p, b"\x1f\x8b\x08\x00junk").unwrap();
        let e = CompressedTarSource::open(&[&p], WebDatasetOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad.tgz") && e.contains("not valid gzip"), "{e}");
    }
}
