//! chute's byte sources: where the bytes of a shard come from.
//!
//! Format readers in `chute-formats` parse bytes; this crate fetches them, so the readers
//! never learn where their bytes came from:
//!
//! - [`Location`]: a local path or a URL (`file://`, `http(s)://`, `s3://`, `gs://`, `az://`).
//! - [`ShardSet`]: the bytes of a dataset's shards. Local files are memory-mapped; remote
//!   objects are downloaded whole, with read-ahead along the rank's shard order, or read by
//!   (coalesced) byte ranges for random access; see its docs for the memory bound.
//! - [`RemoteOptions`]: read-ahead, retries (exponential backoff with jitter, a budget),
//!   timeouts and the node-local [`DiskCache`]; process-wide ([`set_remote_options`]), from
//!   `CHUTE_*` environment variables by default.
//! - [`IoStats`] / [`io_stats`]: bytes fetched, requests, retries, cache hits.
//! - [`MappedFile`]: a read-only memory map of a local file, with zero-copy [`bytes::Bytes`]
//!   views that keep the map alive, and `madvise` hints for random or sequential reading.
//! - [`LocalFile`]: positioned reads (`pread`) without a shared cursor.
//! - [`AtomicFile`], [`write_atomically`]: files written under a temporary name, synced and
//!   renamed into place when complete, so that no reader sees half a file.
//!
//! Remote storage is the cargo feature `remote` (on by default): `object_store` with reqwest
//! and rustls (no OpenSSL), one small tokio runtime per process for network I/O only.
//! Credentials come from the standard environment variables and files of each cloud
//! (`AWS_*`, `GOOGLE_*`, `AZURE_*`); chute never prints them. S3-compatible servers work
//! through `AWS_ENDPOINT_URL` (and `AWS_ALLOW_HTTP=true` for plain HTTP).
//!
//! ```
//! use chute_io::{Location, MappedFile, ShardSet};
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("shard.bin");
//! std::fs::write(&path, b"hello, world")?;
//!
//! let file = MappedFile::open(&path)?;
//! file.advise_random();
//! assert_eq!(file.len(), 12);
//! let view = file.bytes(7..12); // no copy: a view of the map
//! drop(file); // the view keeps the map alive
//! assert_eq!(&view[..], b"world");
//!
//! // The same through a ShardSet, which would fetch a URL instead.
//! let shards = ShardSet::open(&[Location::parse(path.to_str().unwrap())?])?;
//! assert_eq!(&shards.get_range(0, 0..5)?[..], b"hello");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

mod atomic;
mod cache;
mod local;
mod location;
mod maps;
mod options;
#[cfg(feature = "remote")]
mod remote;
mod shards;

pub use atomic::{AtomicFile, TEMP_SUFFIX, write_atomically};
pub use cache::DiskCache;
pub use chute_core::iostats::{IoSnapshot, IoStats, io_stats};
pub use local::{LocalFile, MappedFile};
pub use location::{Location, SCHEMES};
pub use options::{RemoteOptions, parse_size, remote_options, set_remote_options};
pub use shards::ShardSet;
