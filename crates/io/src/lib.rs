//! chute's byte sources: where the bytes of a shard come from.
//!
//! Format readers in `chute-formats` parse bytes; this crate fetches them. Today that is the
//! local file system:
//!
//! - [`MappedFile`]: a read-only memory map of a local file, with zero-copy [`bytes::Bytes`]
//!   views that keep the map alive, and `madvise` hints for random or sequential reading.
//! - [`LocalFile`]: positioned reads (`pread`) without a shared cursor, for formats that read
//!   small pieces of files too large or too remote to map.
//!
//! HTTP and object-store sources (S3, GCS, Azure) will land here later, behind the same kind
//! of interface, so the format readers never learn where their bytes came from.
//!
//! ```
//! use chute_io::MappedFile;
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
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod local;

pub use local::{LocalFile, MappedFile};
