//! chute's engine: plan-driven parallel workers, a batcher writing into pooled buffers,
//! bounded prefetch and a resumable [`Loader`].
//!
//! ```text
//! Plan (pure) -> workers: read -> transform -> collate (one batch each, in parallel)
//!             -> ring of workers + prefetch slots, taken in batch order -> Loader::next()
//! ```
//!
//! - [`Loader`] / [`LoaderBuilder`]: the iterator over batches; `state()` / `restore()`.
//! - [`StatsSnapshot`]: per-stage busy time and items, the consumer's wait, throughput; the
//!   same over a recent [`Window`] and per epoch, queue depths, a wait histogram.
//! - [`metrics`]: every live loader's figures for Prometheus, and the HTTP endpoint serving them.
//! - [`Autotune`]: `num_workers="auto"`, the workers and the prefetch depth following the
//!   consumer's pace within a budget of cores and memory (see the `autotune` module).
//! - [`doctor`]: runs a loader's stages alone and together and says which one binds, how many
//!   workers would keep a given step fed, and what else to change.
//! - [`StreamDigest`]: a digest of delivered batches (`chute bench --digest`).
//! - `check` (feature `testing`): reusable conformance checks (resume from every batch,
//!   worker/prefetch matrix) that any source and transform chain can be run through.
//!
//! ```
//! use chute_core::{Array, DType, Error, Field, Manifest, Sample, ShardInfo, Shuffle, Source};
//! use chute_pipeline::Loader;
//!
//! struct Squares(Manifest);
//! impl Source for Squares {
//!     fn manifest(&self) -> &Manifest { &self.0 }
//!     fn read(&self, id: u64) -> Result<Sample, Error> {
//!         let v = (id * id).to_le_bytes().to_vec();
//!         Ok(Sample::new(id).with("x", Field::Array(Array::new(DType::U64, vec![], v.into()))))
//!     }
//! }
//! let manifest = Manifest::new("squares", vec![ShardInfo { path: "s".into(), samples: 10, bytes: 80 }]);
//! let mut loader = Loader::builder(Squares(manifest))
//!     .batch_size(4).shuffle(Shuffle::Global).seed(1).num_workers(2).build()?;
//! let mut seen = 0;
//! for batch in &mut loader {
//!     let batch = batch?;
//!     seen += batch.len();
//! }
//! assert_eq!(seen, 10);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

mod autotune;
#[cfg(any(test, feature = "testing"))]
pub mod check;
mod collate;
mod digest;
pub mod doctor;
mod loader;
pub mod metrics;
mod pinned;
mod stats;
mod workers;

pub use autotune::{Autotune, AutotuneStats};
pub use collate::collate_samples;
pub use digest::{StreamDigest, batch_digest};
pub use loader::{Loader, LoaderBuilder, LoaderOptions, Poll};
pub use stats::{QueueStats, StageStats, StatsSnapshot, WAIT_BUCKETS, WaitHistogram, Window};
pub use workers::for_each_parallel;
