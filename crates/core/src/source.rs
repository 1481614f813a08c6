//! [`Source`]: what the engine reads samples from.

use crate::batch::Column;
use crate::buffer::BufferPool;
use crate::error::Error;
use crate::manifest::Manifest;
use crate::plan::Plan;
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

    /// Called by the loader before each epoch (and each resumption) with the plan this rank
    /// will follow, before any `read`. A source streaming remote shards uses it to fetch them
    /// in this rank's order, ahead of the workers ([`Plan::shard_order`],
    /// [`Plan::shard_window`]). A hint: reads must work without it. The default does nothing.
    fn set_plan(&self, plan: &Plan) {
        let _ = plan;
    }

    /// The columnar fast path: collates the samples `ids` (in order) straight into batch
    /// columns from buffers in `pool`, without building a [`Sample`] per row. Returns `None`
    /// when the source has no such path (the default); the engine then reads sample by sample.
    /// Used only when the loader has no per-sample transforms. The columns must equal what
    /// collating `read(id)` for each id would give.
    fn collate(
        &self,
        ids: &[u64],
        pool: &BufferPool,
    ) -> Option<Result<Vec<(String, Column)>, Error>> {
        let _ = (ids, pool);
        None
    }
}

impl<S: Source + ?Sized> Source for std::sync::Arc<S> {
    fn manifest(&self) -> &Manifest {
        (**self).manifest()
    }

    fn read(&self, id: u64) -> Result<Sample, Error> {
        (**self).read(id)
    }

    fn set_plan(&self, plan: &Plan) {
        (**self).set_plan(plan)
    }

    fn collate(
        &self,
        ids: &[u64],
        pool: &BufferPool,
    ) -> Option<Result<Vec<(String, Column)>, Error>> {
        (**self).collate(ids, pool)
    }
}
