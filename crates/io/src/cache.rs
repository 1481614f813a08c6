//! [`DiskCache`]: a node-local directory of whole shards, shared by every loader and process
//! on the machine, bounded in size (least recently used shards go first).
//!
//! Safety between processes comes from the file system alone (no lock files, no shared
//! memory): an entry is written under a temporary name in the cache directory, `fsync`ed and
//! renamed into place, so a reader sees a whole entry or none. A process killed mid-download
//! leaves only its temporary file (`*.part`), which the next eviction pass removes once it is
//! an hour old. Readers memory-map entries; an entry evicted (unlinked) by another process
//! while mapped stays readable until unmapped. Recency is the file's modification time,
//! bumped on every hit.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use chute_core::Error;

use crate::{AtomicFile, MappedFile};

/// Suffix of entries being written.
const PART: &str = ".part";
/// Age after which a temporary file is taken to be a crashed writer's.
const STALE_PART: Duration = Duration::from_secs(3600);

/// A node-local cache of whole shards in one directory. See the module docs.
#[derive(Debug, Clone)]
pub struct DiskCache {
    dir: PathBuf,
    limit: u64,
}

impl DiskCache {
    /// A cache in `dir` (created if missing) holding at most `limit` bytes of entries.
    pub fn new(dir: impl Into<PathBuf>, limit: u64) -> Result<DiskCache, Error> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|e| {
            Error::io(
                dir.display().to_string(),
                io::Error::new(e.kind(), format!("creating the cache directory: {e}")),
            )
        })?;
        Ok(DiskCache { dir, limit })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The size limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The entry name for an object: a hash of its URL, size and version tag (so a changed
    /// object never reads as its old bytes), then its file name for people looking at the
    /// directory.
    pub fn key(url: &str, size: u64, version: Option<&str>) -> String {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(url.as_bytes());
        h.update(&size.to_le_bytes());
        h.update(version.unwrap_or("").as_bytes());
        let name: String = url
            .rsplit('/')
            .next()
            .unwrap_or("")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .take(80)
            .collect();
        format!("{:016x}-{name}", h.digest())
    }

    /// The entry `key`, memory-mapped, if present with `size` bytes; marks it recently used.
    pub fn get(&self, key: &str, size: u64) -> Option<MappedFile> {
        let path = self.dir.join(key);
        // Not shared: eviction deletes entries to free their space, which a resting map
        // would hold on to.
        let file = MappedFile::open_unshared(&path).ok()?;
        if file.len() as u64 != size {
            return None;
        }
        // Recency for eviction; a failure only makes the entry look older.
        if let Ok(f) = File::options().write(true).open(&path) {
            let _ = f.set_modified(SystemTime::now());
        }
        Some(file)
    }

    /// Stores `bytes` as entry `key`: written to a temporary name ([`AtomicFile`]), synced,
    /// renamed into place; then evicts least recently used entries until the cache fits its
    /// limit. An entry larger than the limit is not stored.
    pub fn put(&self, key: &str, bytes: &[u8]) -> Result<(), Error> {
        if bytes.len() as u64 > self.limit {
            return Ok(());
        }
        let path = self.dir.join(key);
        // A name of this process's own: another process may be storing the same entry.
        let temp = self.dir.join(format!(
            "{key}.{}.{:08x}{PART}",
            std::process::id(),
            fastrand::u32(..)
        ));
        let write = || -> Result<(), Error> {
            let mut file = AtomicFile::create_with_temp(&path, &temp)?;
            file.write_all(bytes).map_err(|e| file.error(e))?;
            file.finish()?;
            Ok(())
        };
        write().map_err(|e| match e {
            Error::Io { path, source } => Error::io(
                path,
                io::Error::new(source.kind(), format!("writing a cache entry: {source}")),
            ),
            e => e,
        })?;
        self.evict(key);
        Ok(())
    }

    /// Removes least recently used entries (never `keep`) until the total fits the limit, and
    /// temporary files older than an hour. Entries vanishing under us (another process
    /// evicting) are fine.
    fn evict(&self, keep: &str) {
        let Ok(dir) = fs::read_dir(&self.dir) else {
            return;
        };
        let now = SystemTime::now();
        let mut entries = Vec::new();
        let mut total = 0u64;
        for e in dir.flatten() {
            let Ok(meta) = e.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            let mtime = meta.modified().unwrap_or(now);
            if name.ends_with(PART) {
                if now.duration_since(mtime).unwrap_or_default() > STALE_PART {
                    let _ = fs::remove_file(e.path());
                }
                continue;
            }
            total += meta.len();
            if name != keep {
                entries.push((mtime, meta.len(), e.path()));
            }
        }
        entries.sort();
        for (_, len, path) in entries {
            if total <= self.limit {
                break;
            }
            if fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_reads_and_evicts_least_recent() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::new(dir.path().join("c"), 250).unwrap();
        let keys: Vec<String> = (0..3)
            .map(|i| DiskCache::key(&format!("s3://b/x-{i}.tar"), 100, None))
            .collect();
        assert_ne!(keys[0], keys[1]);
        assert!(keys[0].ends_with("-x-0.tar"), "{}", keys[0]);
        cache.put(&keys[0], &[0u8; 100]).unwrap();
        cache.put(&keys[1], &[1u8; 100]).unwrap();
        // Make entry 0 the most recent, so entry 1 goes when entry 2 arrives.
        let old = SystemTime::now() - Duration::from_secs(60);
        File::options()
            .write(true)
            .open(dir.path().join("c").join(&keys[1]))
            .unwrap()
            .set_modified(old)
            .unwrap();
        assert_eq!(cache.get(&keys[0], 100).unwrap().as_slice(), &[0u8; 100]);
        cache.put(&keys[2], &[2u8; 100]).unwrap();
        assert!(cache.get(&keys[1], 100).is_none());
        assert!(cache.get(&keys[0], 100).is_some());
        assert!(cache.get(&keys[2], 100).is_some());
        // A wrong size is a miss; an entry over the limit is not stored.
        assert!(cache.get(&keys[0], 99).is_none());
        cache.put("big", &[0u8; 300]).unwrap();
        assert!(cache.get("big", 300).is_none());
    }

    #[test]
    fn crashed_writers_leave_no_entry_and_are_cleaned() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::new(dir.path(), 1000).unwrap();
        let key = DiskCache::key("http://h/a.tar", 10, Some("etag"));
        // A writer killed mid-download leaves a partial temporary file, never the entry.
        let part = dir.path().join(format!("{key}.999.0{PART}"));
        fs::write(&part, [7u8; 5]).unwrap();
        assert!(cache.get(&key, 10).is_none());
        assert!(cache.get(&key, 5).is_none());
        File::options()
            .write(true)
            .open(&part)
            .unwrap()
            .set_modified(SystemTime::now() - 2 * STALE_PART)
            .unwrap();
        cache.put(&key, &[1u8; 10]).unwrap();
        assert!(!part.exists(), "a stale temporary file is removed");
        assert_eq!(cache.get(&key, 10).unwrap().len(), 10);
    }
}
