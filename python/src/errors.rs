//! The one place where chute's Rust errors become Python exceptions.
//!
//! The hierarchy is defined in Python (`chute/_errors.py`) because `ConfigError` has two
//! bases (`ChuteError` and `ValueError`), which PyO3's `create_exception!` cannot express:
//!
//! | Rust | Python |
//! | --- | --- |
//! | `Error::Io` (not found / permission denied / other) | `FileNotFoundError` / `PermissionError` / `OSError`, with `errno` and `filename` |
//! | `Error::Corrupt` | `chute.CorruptDataError`, with `kind` (`"truncated"`, `"checksum"`, `"malformed"`, `"stale_index"`, `"too_large"`, `"unsupported"`), `path` and `offset` |
//! | `Error::Transform` whose source is an `ops::BadData` (every `ops::OpError`: an undecodable, unsupported or too large image, a bad label, `.npy`, JSON or text, a missing field) | `chute.CorruptDataError`, `kind` from `OpError::corruption`, `path` the shard, `offset` `None` |
//! | `Error::Config`, `ConfigError` | `chute.ConfigError` (a `ValueError`) |
//! | `Error::State`, `StateError` | `chute.StateError` |
//! | `Error::Transform` whose source is a Python exception | that exception object itself, with a note naming the sample |
//! | anything else (`Collate`, `WorkerPanicked`, ...) | `chute.ChuteError` |
//!
//! Messages are the Rust messages: they name the file, the offset, the sample and the option.

use std::io;

use chute::core::{Corruption, SampleRef};
use pyo3::exceptions::{PyFileNotFoundError, PyIsADirectoryError, PyOSError, PyPermissionError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// Looks up (once per process) an exception class of `chute._errors`.
fn class<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyType>>,
    name: &str,
) -> PyResult<&'py Bound<'py, PyType>> {
    cell.import(py, "chute._errors", name)
}

macro_rules! exception {
    ($fn_name:ident, $class:literal) => {
        #[doc = concat!("A `chute.", $class, "` with `msg`.")]
        pub(crate) fn $fn_name(msg: impl Into<String>) -> PyErr {
            let msg = msg.into();
            Python::attach(|py| {
                static CELL: PyOnceLock<Py<PyType>> = PyOnceLock::new();
                match class(py, &CELL, $class) {
                    Ok(ty) => PyErr::from_type(ty.clone(), (msg,)),
                    Err(e) => e,
                }
            })
        }
    };
}

exception!(chute_error, "ChuteError");
exception!(corrupt_data_error, "CorruptDataError");
exception!(config_error, "ConfigError");
exception!(state_error, "StateError");

/// Maps an engine error to the Python exception a user catches.
pub(crate) fn to_py(err: chute::Error) -> PyErr {
    match err {
        chute::Error::Io { path, source } => io_error(&path, source),
        e @ chute::Error::Corrupt { .. } => {
            let msg = e.to_string();
            let chute::Error::Corrupt {
                uri, offset, kind, ..
            } = e
            else {
                unreachable!("matched as Corrupt")
            };
            corrupt(msg, kind, Some(uri), Some(offset))
        }
        chute::Error::Config(e) => from_config(e),
        chute::Error::State(e) => from_state(e),
        chute::Error::Transform { sample, source } => match source.downcast::<PyErr>() {
            Ok(py_err) => with_note(*py_err, &sample),
            // A native op that found the sample's data unusable: every kind of `OpError` is
            // data to fix or skip.
            Err(source) if source.is::<chute::ops::BadData>() => {
                let kind = source
                    .downcast_ref::<chute::ops::BadData>()
                    .map_or(Corruption::Malformed, |b| b.error.corruption());
                let shard = (!sample.shard.is_empty()).then(|| sample.shard.clone());
                let msg = chute::Error::Transform { sample, source }.to_string();
                corrupt(msg, kind, shard, None)
            }
            Err(source) => chute_error(chute::Error::Transform { sample, source }.to_string()),
        },
        other => chute_error(other.to_string()),
    }
}

/// A `chute.CorruptDataError` with its `kind` (a [`Corruption`] name), `path` (the shard, when
/// known) and `offset` (the byte, when known) attributes set.
fn corrupt(msg: String, kind: Corruption, path: Option<String>, offset: Option<u64>) -> PyErr {
    let err = corrupt_data_error(msg);
    Python::attach(|py| {
        let value = err.value(py);
        // Setting attributes on a fresh exception cannot fail short of memory; the exception
        // itself matters more than its attributes.
        let _ = value.setattr("kind", kind.name());
        let _ = value.setattr("path", path);
        let _ = value.setattr("offset", offset);
    });
    err
}

/// A [`chute::ConfigError`] as `chute.ConfigError`.
pub(crate) fn from_config(e: chute::ConfigError) -> PyErr {
    config_error(e.to_string())
}

/// A [`chute::StateError`] as `chute.StateError`.
pub(crate) fn from_state(e: chute::StateError) -> PyErr {
    state_error(e.to_string())
}

/// An OS error as the `OSError` subclass Python itself would raise (`OSError(errno, strerror,
/// filename)` picks `FileNotFoundError`, `PermissionError`... from the errno).
fn io_error(path: &str, source: io::Error) -> PyErr {
    match source.raw_os_error() {
        Some(errno) => {
            let text = source.to_string();
            let strerror = text
                .strip_suffix(&format!(" (os error {errno})"))
                .unwrap_or(&text)
                .to_string();
            PyOSError::new_err((errno, strerror, path.to_string()))
        }
        None => {
            // An error chute made itself (no errno): the class by its kind. (Setting
            // `filename` without an errno would make str() print "[Errno None] None".)
            let msg = format!("{path}: {source}");
            match source.kind() {
                io::ErrorKind::NotFound => PyFileNotFoundError::new_err(msg),
                io::ErrorKind::PermissionDenied => PyPermissionError::new_err(msg),
                io::ErrorKind::IsADirectory => PyIsADirectoryError::new_err(msg),
                _ => PyOSError::new_err(msg),
            }
        }
    }
}

/// The user's own exception, annotated (PEP 678 notes, Python 3.11+) with the sample it was
/// raised on, so the traceback says which sample and shard to look at.
fn with_note(err: PyErr, sample: &SampleRef) -> PyErr {
    Python::attach(|py| {
        let value = err.value(py);
        if value.hasattr("add_note").unwrap_or(false) {
            // A failure to annotate must not hide the user's exception.
            let _ = value.call_method1(
                "add_note",
                (format!("raised by a chute transform on {sample}"),),
            );
        }
    });
    err
}
