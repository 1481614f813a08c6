//! chute's vocabulary: what every other layer speaks. No I/O, no threads.
//!
//! - [`Sample`] and [`Field`]: one example as named fields that borrow the source's bytes.
//! - [`Tensor`], [`DType`], [`BufferPool`]: 64-byte-aligned, pooled, C-contiguous arrays.
//! - [`Batch`] and [`Column`]: `[B, ...]` tensors and variable-length columns.
//! - [`Manifest`]: shards with sample counts and sizes (JSON on disk).
//! - [`Plan`] and [`Shuffle`]: the exact, pure order of samples a rank reads in an epoch.
//! - [`planner`]: what every rank and node of a job reads, from the manifest alone.
//! - [`State`]: a checkpoint as a position.
//! - [`SampleRng`]: per-sample randomness seeded from (seed, epoch, index).
//! - [`Error`], [`ConfigError`], [`StateError`]: variants by what the caller does next.
//! - [`Source`]: random access to samples by global id; [`FnSource`] (a closure) and
//!   [`VecSource`] (samples in memory) make one from your own code.
//! - [`Transform`] and [`Compose`], [`Cast`], [`Select`], [`Rename`], [`Slot`]: per-sample
//!   transforms as the engine runs them (closures implement the trait).
//! - [`alloc::CachingAlloc`]: the global allocator of the binary and the Python extension,
//!   keeping freed large blocks (decoded columns, images) for reuse.
//! - [`TextEncoder`]: text to token ids, handed to sources that tokenize text when opened.
//! - [`iostats`]: counters of remote reads (the process's and a shard set's), which chute-io
//!   adds to and the engine's statistics report.
//! - [`Limits`]: bounds on what a size read from the data may make chute allocate
//!   (image pixels, record and decoded bytes, Example features, tokenizer inputs).
//! - [`quiet`]: third-party decoders' panics on hostile bytes caught without a message.
//! - `testing` (feature `testing`): manifests of synthetic shards from sample counts.
//! - [`Value`]: a nested value (lists, records, maps) of a column that is not numbers or bytes.
//! - [`npy`]: numpy's `.npy` header parser and writer, shared by the formats and the ops.
//!
//! ```
//! use chute_core::{Manifest, Plan, PlanConfig, ShardInfo, Shuffle};
//!
//! let manifest = Manifest::new("tokens", vec![
//!     ShardInfo { path: "a.bin".into(), samples: 10, bytes: 20_500 },
//!     ShardInfo { path: "b.bin".into(), samples: 7, bytes: 14_350 },
//! ]);
//! let cfg = PlanConfig { shuffle: Shuffle::Global, world_size: 2, rank: 1, batch_size: 4,
//!                        ..Default::default() };
//! let plan = Plan::new(&manifest, &cfg)?;
//! assert_eq!(plan.len(), 9); // ceil(17 / 2): one sample repeated so both ranks get 9
//! let ids: Vec<u64> = plan.iter().collect();
//! assert!(ids.iter().all(|&id| id < 17));
//! # Ok::<(), chute_core::ConfigError>(())
//! ```

#![warn(missing_docs)]

pub mod alloc;
mod batch;
mod buffer;
mod dtype;
mod encode;
mod error;
pub mod files;
pub mod iostats;
pub mod limits;
mod manifest;
pub mod npy;
mod plan;
pub mod planner;
pub mod quiet;
pub mod redact;
mod rng;
mod sample;
mod source;
mod state;
mod tensor;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod transform;
mod value;

pub use batch::{Batch, Column, Opaque, VarColumn};
pub use buffer::{ALIGN, AlignedBuf, Allocator, BufferPool, PooledBuf};
pub use dtype::{DType, Element, cast_into, check_cast};
pub use encode::{EncodedRow, RowData, RowEncoder, TextEncoder};
pub use error::{BoxError, ConfigError, Corruption, Error, OnError, Result, SampleRef, StateError};
pub use limits::Limits;
pub use manifest::{MANIFEST_VERSION, Manifest, ShardInfo};
pub use plan::{MAX_WORLD_SIZE, Permutation, Plan, PlanConfig, Shuffle};
pub use rng::{SampleRng, derive_key, mix64, tag};
pub use sample::{Array, Field, FieldName, Sample};
pub use source::{
    ColumnType, FnSource, MetricFamily, OwnOrder, SAMPLES_PER_VIRTUAL_SHARD, Source, VecSource,
    virtual_manifest,
};
pub use state::{STATE_VERSION, State};
pub use tensor::Tensor;
pub use transform::{Cast, Compose, Rename, Select, Slot, Transform};
pub use value::{Keys, NestedRows, Value};
