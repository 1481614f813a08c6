//! The engine's integration tests (one binary).

mod engine;
mod mixture;
mod resume;
mod support;
