//! In progress.
