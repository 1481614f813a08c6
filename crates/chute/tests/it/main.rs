//! End-to-end tests of the facade: formats through the engine.

mod parquet;
mod remote;
mod tfrecord;
