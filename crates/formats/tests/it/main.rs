//! chute-formats' integration tests: one binary, one module per format.

mod corruption;
mod tfrecord;
