//! The engine's integration tests (one binary).

mod engine;
mod mixture;
mod observe;
mod resume;
mod support;
