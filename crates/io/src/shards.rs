//! [`ShardSet`]: the bytes of a dataset's shards, local or remote, behind one interface.

// Without the `remote` feature every shard is local, and the fetch state goes unused.
#![cfg_attr(not(feature = "remote"), allow(dead_code))]

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use bytes::Bytes;
use chute_core::Error;

use crate::{DiskCache, Location, MappedFile, RemoteOptions};
use chute_core::iostats::{IoSnapshot, IoStats};

/// The shards of one dataset: each either a local file (memory-mapped when the set is opened)
/// or a remote object (fetched when needed).
///
/// Format readers take every shard's bytes from here, so one parser serves every source:
///
/// - [`ShardSet::get`]: the whole shard as [`Bytes`]. Local: a view of the map. Remote: the
///   shard downloaded whole into memory (or read from the node-local [`DiskCache`]), kept
///   while it is in use and dropped (least recently used first) when newer shards need the
///   room.
/// - [`ShardSet::set_order`]: the order this rank will read shards in (from
///   `Plan::shard_order`). With it, asking for a shard also starts fetching the next
///   [`RemoteOptions::read_ahead`] shards of that order, so they download while this one is
///   decoded; and [`ShardSet::get_range`] reads those shards whole.
/// - [`ShardSet::get_range`]: a byte range of a shard. Without an order (random access: a
///   global shuffle reads a few samples of every shard), a remote range is a range request
///   and nothing else is downloaded.
///
/// Memory: at most `2 * window + read_ahead` remote shards are held by the set (`window`:
/// the shards read at once, from [`ShardSet::set_order`]), plus any the caller still holds
/// views of. Failed fetches are remembered until the next [`ShardSet::set_order`], so a
/// skipped shard's other samples fail at once instead of retrying again.
#[derive(Clone)]
pub struct ShardSet {
    inner: Arc<Inner>,
}

struct Inner {
    entries: Vec<Entry>,
    options: RemoteOptions,
    cache: Option<DiskCache>,
    stats: Arc<IoStats>,
    state: Mutex<State>,
    ready: Condvar,
}

enum Entry {
    Local {
        uri: String,
        file: MappedFile,
    },
    #[cfg(feature = "remote")]
    Remote {
        object: crate::remote::Object,
        meta: crate::remote::Meta,
    },
}

#[derive(Default)]
struct State {
    slots: HashMap<usize, Slot>,
    /// Position of each shard in the read order, if one was given.
    position: HashMap<usize, usize>,
    order: Vec<usize>,
    /// Shards read at once (the shuffle window).
    window: usize,
    /// The furthest position asked for so far.
    cursor: usize,
    tick: u64,
    /// The process that started the fetches in flight (a forked child inherits `Loading`
    /// slots whose tasks ran on its parent's runtime, and must start them again).
    pid: u32,
}

enum Slot {
    Loading,
    Ready {
        bytes: Bytes,
        used: u64,
    },
    Failed {
        kind: io::ErrorKind,
        message: String,
    },
}

impl ShardSet {
    /// Opens `locations` with the process-wide [`crate::remote_options`]. Local files are
    /// mapped now; remote objects are only asked for their size and version (HEAD requests,
    /// concurrently), nothing is downloaded.
    ///
    /// Fails with [`Error::Io`] naming the path or URL if a file cannot be mapped or an
    /// object does not exist or cannot be reached (after retries), with [`Error::Config`] if
    /// the remote options in the environment are invalid.
    pub fn open(locations: &[Location]) -> Result<ShardSet, Error> {
        let options = if locations.iter().any(Location::is_remote) {
            crate::remote_options()?
        } else {
            RemoteOptions::default()
        };
        ShardSet::open_with(locations, options)
    }

    /// [`ShardSet::open`] with explicit options.
    pub fn open_with(locations: &[Location], options: RemoteOptions) -> Result<ShardSet, Error> {
        let stats = Arc::new(IoStats::default());
        let mut entries: Vec<Option<Entry>> = Vec::with_capacity(locations.len());
        #[cfg(feature = "remote")]
        let mut remote = Vec::new();
        for (i, loc) in locations.iter().enumerate() {
            match loc {
                Location::Local(p) => entries.push(Some(Entry::Local {
                    uri: p.display().to_string(),
                    file: MappedFile::open(p)?,
                })),
                #[cfg(feature = "remote")]
                Location::Remote(url) => {
                    remote.push((i, crate::remote::object(url)?));
                    entries.push(None);
                }
                #[cfg(not(feature = "remote"))]
                Location::Remote(url) => {
                    let _ = i;
                    return Err(crate::location::no_remote(url));
                }
            }
        }
        #[cfg(feature = "remote")]
        if !remote.is_empty() {
            let metas = head_all(&remote, &options, &stats)?;
            for ((i, object), meta) in remote.into_iter().zip(metas) {
                entries[i] = Some(Entry::Remote { object, meta });
            }
        }
        let cache = match &options.cache_dir {
            Some(dir) => Some(DiskCache::new(dir, options.cache_limit)?),
            None => None,
        };
        Ok(ShardSet {
            inner: Arc::new(Inner {
                entries: entries
                    .into_iter()
                    .map(|e| e.expect("every entry set"))
                    .collect(),
                options,
                cache,
                stats,
                state: Mutex::new(State {
                    window: 1,
                    pid: std::process::id(),
                    ..State::default()
                }),
                ready: Condvar::new(),
            }),
        })
    }

    /// Number of shards.
    pub fn len(&self) -> usize {
        self.inner.entries.len()
    }

    /// Whether the set has no shards.
    pub fn is_empty(&self) -> bool {
        self.inner.entries.is_empty()
    }

    /// Shard `i`'s path or URL, for errors and manifests.
    ///
    /// # Panics
    /// If `i` is out of range.
    pub fn uri(&self, i: usize) -> &str {
        match &self.inner.entries[i] {
            Entry::Local { uri, .. } => uri,
            #[cfg(feature = "remote")]
            Entry::Remote { object, .. } => &object.url,
        }
    }

    /// Shard `i`'s size in bytes.
    ///
    /// # Panics
    /// If `i` is out of range.
    pub fn size(&self, i: usize) -> u64 {
        match &self.inner.entries[i] {
            Entry::Local { file, .. } => file.len() as u64,
            #[cfg(feature = "remote")]
            Entry::Remote { meta, .. } => meta.size,
        }
    }

    /// Whether shard `i` is remote.
    pub fn is_remote(&self, i: usize) -> bool {
        !matches!(self.inner.entries[i], Entry::Local { .. })
    }

    /// Shard `i`'s memory map, if it is local.
    pub fn mapped(&self, i: usize) -> Option<&MappedFile> {
        match &self.inner.entries[i] {
            Entry::Local { file, .. } => Some(file),
            #[cfg(feature = "remote")]
            Entry::Remote { .. } => None,
        }
    }

    /// What this set's remote reads cost so far.
    pub fn stats(&self) -> IoSnapshot {
        self.inner.stats.snapshot()
    }

    /// A file beside the shards (a shard's index file), whole, or `None` if it does not exist:
    /// [`Location::read_optional`], with a remote object's requests counted in this set's
    /// [`stats`](ShardSet::stats), as its shards' are.
    pub fn read_optional(&self, location: &Location) -> Result<Option<Bytes>, Error> {
        match location {
            #[cfg(feature = "remote")]
            Location::Remote(url) => crate::remote::fetch_optional_counted(url, &self.inner.stats),
            _ => location.read_optional(),
        }
    }

    /// The order this rank reads shards in, and how many it reads at once (`window`: a block
    /// shuffle's window; 1 for sequential reading). Clears remembered failures (a new epoch
    /// tries failed shards again). Local-only sets ignore it.
    pub fn set_order(&self, order: &[usize], window: usize) {
        let mut st = self.inner.lock();
        st.order = order.to_vec();
        st.position = order.iter().enumerate().map(|(p, &s)| (s, p)).collect();
        st.window = window.max(1);
        st.cursor = 0;
        st.slots.retain(|_, s| !matches!(s, Slot::Failed { .. }));
    }

    /// Shard `i` whole. Local: a view of its map. Remote: from memory, the node-local cache or
    /// the network (blocking until fetched, with retries), and the next shards of the read
    /// order start downloading.
    ///
    /// Fails with [`Error::Io`] naming the URL, the attempts and the last cause if the fetch
    /// fails for good.
    ///
    /// # Panics
    /// If `i` is out of range.
    pub fn get(&self, i: usize) -> Result<Bytes, Error> {
        match &self.inner.entries[i] {
            Entry::Local { file, .. } => Ok(file.bytes(0..file.len())),
            #[cfg(feature = "remote")]
            Entry::Remote { .. } => self.inner.get_remote(i),
        }
    }

    /// Bytes `range` of shard `i`: a slice of the whole shard when it is local, in memory, or
    /// part of the read order ([`ShardSet::set_order`]); otherwise (random access) a range
    /// request for just these bytes.
    ///
    /// Fails with [`Error::Io`] as [`ShardSet::get`] does, or of kind `UnexpectedEof` if the
    /// range ends past the shard.
    pub fn get_range(&self, i: usize, range: Range<u64>) -> Result<Bytes, Error> {
        Ok(self.get_ranges(i, std::slice::from_ref(&range))?.remove(0))
    }

    /// [`ShardSet::get_range`] for several ranges of one shard; for a random-access remote
    /// shard, ranges less than 1 MiB apart are fetched together (coalesced requests).
    pub fn get_ranges(&self, i: usize, ranges: &[Range<u64>]) -> Result<Vec<Bytes>, Error> {
        let size = self.size(i);
        if let Some(r) = ranges.iter().find(|r| r.start > r.end || r.end > size) {
            return Err(Error::io(
                self.uri(i),
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "bytes {}..{} asked for, but the shard has {size} bytes (is the index \
                         stale?)",
                        r.start, r.end
                    ),
                ),
            ));
        }
        #[cfg(feature = "remote")]
        if let Entry::Remote { object, meta } = &self.inner.entries[i] {
            let whole = {
                let st = self.inner.lock();
                st.position.contains_key(&i) || st.slots.contains_key(&i)
            };
            if !whole {
                let (object, etag) = (object.clone(), meta.etag.clone());
                let (opts, stats) = (self.inner.options.clone(), Arc::clone(&self.inner.stats));
                let ranges = ranges.to_vec();
                return crate::remote::block_on(async move {
                    if ranges.len() == 1 {
                        let r = ranges[0].clone();
                        crate::remote::fetch_range(&object, r, false, etag, &opts, &stats)
                            .await
                            .map(|b| vec![b])
                    } else {
                        crate::remote::fetch_ranges(&object, &ranges, &opts, &stats).await
                    }
                })?;
            }
        }
        let all = self.get(i)?;
        Ok(ranges
            .iter()
            .map(|r| all.slice(r.start as usize..r.end as usize))
            .collect())
    }
}

impl fmt::Debug for ShardSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardSet")
            .field("shards", &self.len())
            .field("stats", &self.stats())
            .finish()
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(feature = "remote")]
impl Inner {
    fn get_remote(self: &Arc<Self>, i: usize) -> Result<Bytes, Error> {
        let mut st = self.lock();
        let pid = std::process::id();
        if st.pid != pid {
            st.slots.retain(|_, s| !matches!(s, Slot::Loading));
            st.pid = pid;
        }
        if let Some(&p) = st.position.get(&i) {
            st.cursor = st.cursor.max(p);
            let ahead: Vec<usize> = st.order[p + 1..]
                .iter()
                .take(self.options.read_ahead)
                .copied()
                .collect();
            self.start(&mut st, i);
            for j in ahead {
                self.start(&mut st, j);
            }
        }
        loop {
            st.tick += 1;
            let tick = st.tick;
            match st.slots.get_mut(&i) {
                Some(Slot::Ready { bytes, used }) => {
                    *used = tick;
                    return Ok(bytes.clone());
                }
                Some(Slot::Failed { kind, message }) => {
                    return Err(Error::io(
                        self.uri(i),
                        io::Error::new(*kind, message.clone()),
                    ));
                }
                Some(Slot::Loading) => {
                    st = self.ready.wait(st).unwrap_or_else(|p| p.into_inner());
                }
                None => self.start(&mut st, i),
            }
        }
    }

    fn uri(&self, i: usize) -> &str {
        match &self.entries[i] {
            Entry::Local { uri, .. } => uri,
            Entry::Remote { object, .. } => &object.url,
        }
    }

    /// Starts fetching shard `i` unless it is loading, loaded or failed.
    fn start(self: &Arc<Self>, st: &mut State, i: usize) {
        if st.slots.contains_key(&i) {
            return;
        }
        st.slots.insert(i, Slot::Loading);
        let me = Arc::clone(self);
        let spawned = crate::remote::spawn(async move {
            use futures_util::FutureExt;
            // A panic must not leave the slot loading forever (its readers would hang).
            let result = std::panic::AssertUnwindSafe(me.fetch(i))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    Err(Error::io(
                        me.uri(i),
                        io::Error::other(
                            "the download panicked (a bug in chute: please report it)",
                        ),
                    ))
                });
            let mut st = me.lock();
            st.tick += 1;
            let slot = match result {
                Ok(bytes) => Slot::Ready {
                    bytes,
                    used: st.tick,
                },
                Err(e) => {
                    let (kind, message) = match e {
                        Error::Io { source, .. } => (source.kind(), source.to_string()),
                        other => (io::ErrorKind::Other, other.to_string()),
                    };
                    Slot::Failed { kind, message }
                }
            };
            st.slots.insert(i, slot);
            me.evict(&mut st, i);
            drop(st);
            me.ready.notify_all();
        });
        if let Err(e) = spawned {
            st.slots.insert(
                i,
                Slot::Failed {
                    kind: io::ErrorKind::Other,
                    message: e.to_string(),
                },
            );
        }
    }

    /// Drops loaded shards beyond `2 * window + read_ahead`: first those behind the furthest
    /// position read (least recently used first), then any but `keep`.
    fn evict(&self, st: &mut State, keep: usize) {
        let capacity = 2 * st.window + self.options.read_ahead;
        loop {
            let loaded: Vec<(bool, u64, usize)> = st
                .slots
                .iter()
                .filter_map(|(&s, slot)| match slot {
                    Slot::Ready { used, .. } if s != keep => {
                        let ahead = st.position.get(&s).is_some_and(|&p| p > st.cursor);
                        Some((ahead, *used, s))
                    }
                    _ => None,
                })
                .collect();
            if loaded.len() < capacity {
                return;
            }
            let Some(&(_, _, victim)) = loaded.iter().min() else {
                return;
            };
            st.slots.remove(&victim);
        }
    }

    /// Shard `i` whole: from the node-local cache, else downloaded (and then cached).
    async fn fetch(self: &Arc<Self>, i: usize) -> Result<Bytes, Error> {
        let Entry::Remote { object, meta } = &self.entries[i] else {
            unreachable!("only remote shards are fetched")
        };
        use chute_core::iostats::Counter;
        let key = DiskCache::key(&object.url, meta.size, meta.etag.as_deref());
        if let Some(cache) = &self.cache {
            let (cache, key, size) = (cache.clone(), key.clone(), meta.size);
            let hit = tokio::task::spawn_blocking(move || cache.get(&key, size))
                .await
                .ok()
                .flatten();
            if let Some(file) = hit {
                self.stats.add(Counter::CacheHits, 1);
                return Ok(file.bytes(0..file.len()));
            }
        }
        let bytes = crate::remote::fetch_range(
            object,
            0..meta.size,
            true,
            meta.etag.clone(),
            &self.options,
            &self.stats,
        )
        .await?;
        self.stats.add(Counter::Shards, 1);
        if let Some(cache) = &self.cache {
            let (cache, data) = (cache.clone(), bytes.clone());
            // A cache that cannot be written (a full disk) costs speed, not correctness.
            let _ = tokio::task::spawn_blocking(move || cache.put(&key, &data)).await;
        }
        Ok(bytes)
    }
}

/// HEAD requests for every remote shard, at most 32 at once.
#[cfg(feature = "remote")]
fn head_all(
    objects: &[(usize, crate::remote::Object)],
    options: &RemoteOptions,
    stats: &Arc<IoStats>,
) -> Result<Vec<crate::remote::Meta>, Error> {
    use futures_util::StreamExt;
    let options = Arc::new(options.clone());
    let heads: Vec<_> = objects
        .iter()
        .map(|(_, o)| {
            let (o, options, stats) = (o.clone(), Arc::clone(&options), Arc::clone(stats));
            async move { crate::remote::head(&o, &options, &stats).await }
        })
        .collect();
    crate::remote::block_on(async move {
        futures_util::stream::iter(heads)
            .buffered(32)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<Vec<_>, Error>>()
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_shards_are_views_of_their_maps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        std::fs::write(&path, b"0123456789").unwrap();
        let set = ShardSet::open(&[Location::Local(path.clone())]).unwrap();
        assert_eq!(set.len(), 1);
        assert!(!set.is_remote(0));
        assert_eq!(set.size(0), 10);
        assert_eq!(set.uri(0), path.display().to_string());
        assert_eq!(&set.get(0).unwrap()[..], b"0123456789");
        assert_eq!(&set.get_range(0, 2..5).unwrap()[..], b"234");
        let e = set.get_range(0, 8..12).unwrap_err().to_string();
        assert!(e.contains("8..12") && e.contains("10 bytes"), "{e}");
        assert_eq!(set.stats(), IoSnapshot::default());
    }
}
