//! The engine's integration tests (one binary).

mod engine;
mod resume;
mod support;
