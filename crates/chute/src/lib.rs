//! chute: a data loader for machine-learning training that keeps accelerators fed.
//!
//! This facade re-exports the layers: [`core`] (vocabulary, plan, state), [`io`] (byte
//! sources), [`formats`] (codecs and single-format readers), [`dataset`] (the opener,
//! mixtures, documents and packing, tokenized text), [`ops`] (transforms) and [`pipeline`]
//! (the engine). The most used names are also at the top level, among them [`open`]: the one
//! way to open a dataset (files, URLs, brace patterns, globs, folders, a manifest or a
//! mixture file; the format detected or given in [`OpenOptions`]).
//! [`tokenizer::Tokenizer`] tokenizes text on every core for a text source
//! ([`OpenOptions::tokenizer`]).
//!
//! A source from your own code is a closure ([`FnSource`]) or a `Vec` of samples
//! ([`VecSource`]), and gets every guarantee (order, ranks, resume):
//!
//! ```
//! use chute::core::{Array, Field};
//! use chute::{DType, FnSource, Loader, Sample, Shuffle};
//!
//! let source = FnSource::new("squares", 100, |id| {
//!     let x = ((id * id) as f32).to_le_bytes().to_vec();
//!     Ok(Sample::new(id).with("x", Field::Array(Array::new(DType::F32, vec![], x.into()))))
//! });
//! let mut loader = Loader::builder(source)
//!     .batch_size(10).shuffle(Shuffle::Global).seed(1).num_workers(2).build()?;
//! let mut n = 0;
//! for batch in &mut loader {
//!     n += batch?.len();
//! }
//! assert_eq!(n, 100);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ```no_run
//! let source = chute::open(&["data/"], &chute::OpenOptions::default())?; // every shard inside
//! let loader = chute::Loader::builder_arc(source).batch_size(32).build()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
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

#![warn(missing_docs)]

pub use chute_core as core;
pub use chute_dataset as dataset;
pub use chute_formats as formats;
pub use chute_io as io;
pub use chute_ops as ops;
pub use chute_pipeline as pipeline;

pub mod chat;
pub mod doctor;
mod files;
pub mod tokenizer;

pub use chute_core::Transform;
pub use chute_core::{
    Batch, Column, ConfigError, DType, Error, FnSource, Keys, Manifest, Sample, Shuffle, Source,
    State, StateError, Tensor, Value, VecSource,
};
pub use chute_dataset::{Dataset, OpenOptions, Opened, open};
pub use chute_formats::{Format, TokenOptions, TokenSource};
pub use chute_pipeline::{Autotune, Loader, LoaderBuilder, LoaderOptions, StatsSnapshot};
pub use files::read_files_with_io;
