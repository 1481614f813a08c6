//! Remote storage settings and counters: `chute.set_remote_options`, `chute.io_stats`.

use std::path::PathBuf;
use std::time::Duration;

use chute::io::{RemoteOptions, io_stats as stats, set_remote_options as set};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors;

/// Sets how remote shards (URLs) are read, for sources opened from now on; options left as
/// `None` keep their `CHUTE_*` environment value or default.
#[pyfunction]
#[pyo3(signature = (*, read_ahead=None, retries=None, retry_budget=None, timeout=None, cache_dir=None, cache_limit=None))]
pub(crate) fn set_remote_options(
    read_ahead: Option<usize>,
    retries: Option<u32>,
    retry_budget: Option<f64>,
    timeout: Option<f64>,
    cache_dir: Option<PathBuf>,
    cache_limit: Option<u64>,
) -> PyResult<()> {
    let mut o = RemoteOptions::from_env().map_err(errors::from_config)?;
    let secs = |name: &str, v: f64| {
        if v > 0.0 && v.is_finite() {
            Ok(Duration::from_secs_f64(v))
        } else {
            Err(errors::from_config(chute::ConfigError::new(
                name,
                format!("{v} is not a positive number of seconds"),
            )))
        }
    };
    if let Some(n) = read_ahead {
        o.read_ahead = n;
    }
    if let Some(n) = retries {
        o.max_attempts = n.saturating_add(1);
    }
    if let Some(v) = retry_budget {
        o.retry_budget = secs("retry_budget", v)?;
    }
    if let Some(v) = timeout {
        o.timeout = secs("timeout", v)?;
    }
    if let Some(d) = cache_dir {
        o.cache_dir = Some(d);
    }
    if let Some(n) = cache_limit {
        o.cache_limit = n;
    }
    set(o);
    Ok(())
}

/// What remote reads cost since the process started: `bytes_fetched`, `requests`,
/// `retries`, `cache_hits`, `shards_fetched`, `failures`.
#[pyfunction]
pub(crate) fn io_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let s = stats();
    let d = PyDict::new(py);
    d.set_item("bytes_fetched", s.bytes_fetched)?;
    d.set_item("requests", s.requests)?;
    d.set_item("retries", s.retries)?;
    d.set_item("cache_hits", s.cache_hits)?;
    d.set_item("shards_fetched", s.shards_fetched)?;
    d.set_item("failures", s.failures)?;
    Ok(d)
}
