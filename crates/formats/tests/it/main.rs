//! chute-formats' integration tests: one binary, one module per format.

mod tfrecord;
