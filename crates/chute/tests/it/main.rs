//! End-to-end tests of the facade: formats and mixtures through the engine.

mod bombs;
mod conformance;
mod mixture;
mod parquet;
#[cfg(feature = "remote")]
mod remote;
mod tfrecord;
