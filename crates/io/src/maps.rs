//! The process's maps of local files: one per file, shared, and kept a while after use.
//!
//! Every [`MappedFile`](crate::MappedFile) open on one file (the same device, inode and
//! length) shares one map, and a map whose last user is dropped rests for [`REST`] (at most
//! [`RESTING`] maps rest at once, the oldest unmapped first) before it is unmapped. A source
//! opened again on the same files (a loader built anew each epoch, an eval loader over the
//! training files, a mixture naming a file twice) takes the map back with its pages still
//! mapped. Both ends cost: unmapping a file of a few hundred megabytes takes the kernel
//! milliseconds (it removes an entry per 4 KiB page, on the thread that dropped the last
//! view), and reading it through a new map takes a page fault per 64 KiB; the two were a
//! tenth of a Parquet epoch built anew.
//!
//! Reuse is exact: a shared read-only map of an inode shows the file's bytes as they are now,
//! as a new map would, and a file whose length changed (or a new file renamed into place: a
//! new inode) is another key. What resting changes is when the map goes: a file deleted
//! meanwhile keeps its disk space until its map is unmapped, [`REST`] after its last use at
//! most, or when the next [`MappedFile::open`](crate::MappedFile::open) or release after that
//! notices it has expired (so the node-local cache, which deletes entries to free their
//! space, maps its entries unshared: [`MappedFile::open_unshared`](crate::MappedFile::open_unshared)).
//! Maps of files that have no device and inode (platforms other than Unix) are never shared.
//!
//! The table is tried, never waited on for long: a thread that cannot take it at once (after
//! a few tries) maps or unmaps the file itself, so a lock held by a thread when the process
//! forked (which no thread in the child will release) costs the child its reuse, not a hang.
//! Unmapping is never done under the lock.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{File, Metadata};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError, Weak};
use std::time::{Duration, Instant};

use memmap2::{Mmap, MmapOptions};

/// How long a map rests after its last user is dropped.
pub(crate) const REST: Duration = Duration::from_secs(60);
/// Most maps resting at once.
pub(crate) const RESTING: usize = 64;

/// A file's identity: maps of one key are interchangeable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    dev: u64,
    ino: u64,
    len: u64,
}

impl Key {
    #[cfg(unix)]
    fn of(meta: &Metadata) -> Option<Key> {
        use std::os::unix::fs::MetadataExt;
        Some(Key {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
        })
    }

    #[cfg(not(unix))]
    fn of(_meta: &Metadata) -> Option<Key> {
        None
    }
}

/// One map of a file, shared by the [`MappedFile`](crate::MappedFile)s open on it and their
/// views; dropped, it rests in the table instead of being unmapped.
pub(crate) struct Map {
    /// `Some` until dropped.
    map: Option<Mmap>,
    key: Option<Key>,
}

impl Map {
    pub(crate) fn mmap(&self) -> &Mmap {
        self.map.as_ref().expect("a map is only taken when dropped")
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        if let (Some(map), Some(key)) = (self.map.take(), self.key) {
            release(key, map);
        }
    }
}

struct Resting {
    key: Key,
    map: Mmap,
    until: Instant,
}

struct Table {
    /// The maps in use, by key (an entry whose map is gone is replaced or removed later).
    live: BTreeMap<Key, Weak<Map>>,
    /// Maps no one uses, oldest first (so in the order they expire).
    resting: VecDeque<Resting>,
}

static TABLE: Mutex<Table> = Mutex::new(Table {
    live: BTreeMap::new(),
    resting: VecDeque::new(),
});

/// The table, unless it stays taken through a few tries.
fn table() -> Option<MutexGuard<'static, Table>> {
    for _ in 0..64 {
        match TABLE.try_lock() {
            Ok(t) => return Some(t),
            Err(TryLockError::Poisoned(e)) => return Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => std::thread::yield_now(),
        }
    }
    None
}

impl Table {
    /// Takes the resting maps that expired by `now` out of the table (to be unmapped once
    /// it is released).
    fn expire(&mut self, now: Instant) -> Vec<Mmap> {
        let mut gone = Vec::new();
        while self.resting.front().is_some_and(|r| r.until <= now) {
            gone.extend(self.resting.pop_front().map(|r| r.map));
        }
        gone
    }
}

/// A map of the first `len` bytes of `file` (`meta` its metadata, `len` its length): when
/// `shared`, the one in use or resting for the same file, or a new one; else a new one of
/// the caller's alone, unmapped when dropped.
pub(crate) fn map(file: &File, meta: &Metadata, len: usize, shared: bool) -> io::Result<Arc<Map>> {
    let key = Key::of(meta).filter(|_| shared);
    if let Some(key) = key
        && let Some(mut t) = table()
    {
        let gone = t.expire(Instant::now());
        let found = match t.live.get(&key).and_then(Weak::upgrade) {
            Some(m) => Some(m),
            None => t.resting.iter().rposition(|r| r.key == key).map(|i| {
                let r = t.resting.remove(i).expect("found above");
                let m = Arc::new(Map {
                    map: Some(r.map),
                    key: Some(key),
                });
                t.live.insert(key, Arc::downgrade(&m));
                m
            }),
        };
        drop(t);
        drop(gone);
        if let Some(m) = found {
            return Ok(m);
        }
    }
    // SAFETY: the map is read-only and over a file opened read-only, so nothing in this
    // process writes through it. What cannot be ruled out is another process changing the
    // file while it is mapped: a write shows through (the bytes change under a `&[u8]`), and
    // a truncation makes reads past the new end raise SIGBUS. Every mmap-based reader shares
    // that hazard; datasets are written once and read many times, and `TokenWriter`-style
    // writers create a new file and rename it into place, which leaves an existing map (of
    // the old inode) intact.
    let fresh = unsafe { MmapOptions::new().len(len).map(file) }?;
    let m = Arc::new(Map {
        map: Some(fresh),
        key,
    });
    if let Some(key) = key
        && let Some(mut t) = table()
    {
        t.live.insert(key, Arc::downgrade(&m));
    }
    Ok(m)
}

/// Puts the map of `key` no one uses any more to rest (or unmaps it, when the table cannot
/// be had).
fn release(key: Key, map: Mmap) {
    let Some(mut t) = table() else {
        return drop(map);
    };
    if t.live.get(&key).is_some_and(|w| w.strong_count() == 0) {
        t.live.remove(&key);
    }
    let now = Instant::now();
    let mut gone = t.expire(now);
    t.resting.push_back(Resting {
        key,
        map,
        until: now + REST,
    });
    while t.resting.len() > RESTING {
        gone.extend(t.resting.pop_front().map(|r| r.map));
    }
    drop(t);
    drop(gone);
}

/// Whether a map of the file with metadata `meta` rests now (for tests).
#[cfg(test)]
pub(crate) fn resting(meta: &Metadata) -> bool {
    let key = Key::of(meta);
    let t = table().expect("the table");
    t.resting.iter().any(|r| Some(r.key) == key)
}

/// Unmaps every resting map that would have expired by `now` (for tests).
#[cfg(test)]
pub(crate) fn expire_at(now: Instant) {
    let gone = table().expect("the table").expire(now);
    drop(gone);
}
