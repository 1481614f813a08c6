//! chute: a data loader for machine-learning training that keeps accelerators fed.
//!
//! This facade re-exports the layers: [`core`] (vocabulary, plan, state), [`formats`]
//! (codecs and readers), [`io`] (byte sources), [`ops`] (transforms) and [`pipeline`] (the
//! engine). The most used names are also at the top level.
//!
//! ```no_run
//! use chute::{DType, Loader, Shuffle, TokenOptions, TokenSource};
//!
//! let source = TokenSource::open(&["train.bin"], TokenOptions {
//!     seq_len: 1024, dtype: DType::U16, out_dtype: DType::I64,
//! })?;
//! let mut loader = Loader::builder(source)
//!     .batch_size(16).shuffle(Shuffle::Global).seed(0).num_workers(4).build()?;
//! for epoch in 0..2 {
//!     loader.set_epoch(epoch);
//!     for batch in &mut loader {
//!         let batch = batch?;
//!         let tokens = batch.get("tokens").unwrap().as_tensor().unwrap(); // int64 [16, 1025]
//!         let _ = tokens.as_slice::<i64>();
//!     }
//!     let checkpoint = loader.state().to_json(); // a few integers
//!     # let _ = checkpoint;
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub use chute_core as core;
pub use chute_formats as formats;
pub use chute_io as io;
pub use chute_ops as ops;
pub use chute_pipeline as pipeline;

pub use chute_core::{
    Batch, Column, ConfigError, DType, Error, Manifest, Sample, Shuffle, Source, State, StateError,
    Tensor,
};
pub use chute_formats::{TokenOptions, TokenSource};
pub use chute_ops::Transform;
pub use chute_pipeline::{Loader, LoaderBuilder, LoaderOptions, StatsSnapshot};
