//! [`Source`]: what the engine reads samples from.

use crate::error::Error;
use crate::manifest::Manifest;
use crate::sample::Sample;

/// A dataset with random access by global sample id.
///
/// Implementations are shared by all worker threads, so `read` takes `&self` and must be
/// cheap to call concurrently (pread or a memory map, never a shared cursor). A failed read
/// returns an error naming the shard, the byte offset and what was wrong.
pub trait Source: Send + Sync + 'static {
    /// The shards and their sample counts; global ids are `0..manifest().total_samples()`.
    fn manifest(&self) -> &Manifest;

    /// Reads sample `id`; `id` is always `< manifest().total_samples()`.
    fn read(&self, id: u64) -> Result<Sample, Error>;
}

impl<S: Source + ?Sized> Source for std::sync::Arc<S> {
    fn manifest(&self) -> &Manifest {
        (**self).manifest()
    }

    fn read(&self, id: u64) -> Result<Sample, Error> {
        (**self).read(id)
    }
}
