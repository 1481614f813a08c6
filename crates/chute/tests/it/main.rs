//! End-to-end tests of the facade: formats through the engine.

mod conformance;
mod parquet;
#[cfg(feature = "remote")]
mod remote;
mod tfrecord;
