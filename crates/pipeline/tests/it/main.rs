//! The engine's integration tests (one binary).

mod engine;
mod observe;
mod resume;
mod support;
