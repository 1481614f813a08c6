//! End-to-end tests of the facade: formats through the engine.

mod bombs;
mod conformance;
mod parquet;
#[cfg(feature = "remote")]
mod remote;
mod tfrecord;
