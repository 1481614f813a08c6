//! [`Source`]: an opened dataset, and the functions that open one (`tokens` today;
//! `webdataset`, `tfrecord` and `parquet` return the same class as their readers land).

use std::path::PathBuf;
use std::sync::Arc;

use chute::{DType, TokenOptions, TokenSource};
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::errors;

/// A dataset chute can load: samples addressed by a global id, in shards. Made by
/// `chute.tokens(...)` (and later `chute.webdataset(...)`, ...); passed to `chute.Loader`.
#[pyclass(module = "chute._chute", name = "Source", frozen)]
pub(crate) struct Source {
    pub(crate) inner: Arc<dyn chute::Source>,
    /// The format (`tokens`), for `repr`.
    kind: &'static str,
}

#[pymethods]
impl Source {
    /// Number of samples in the dataset (all shards).
    fn __len__(&self) -> usize {
        self.inner.manifest().total_samples() as usize
    }

    /// `(path, samples)` of each shard, in order.
    #[getter]
    fn shards(&self) -> Vec<(String, u64)> {
        self.inner
            .manifest()
            .shards
            .iter()
            .map(|s| (s.path.clone(), s.samples))
            .collect()
    }

    /// The dataset's fingerprint (what a `state_dict` is checked against).
    #[getter]
    fn fingerprint(&self) -> String {
        self.inner.manifest().fingerprint()
    }

    fn __repr__(&self) -> String {
        let m = self.inner.manifest();
        format!(
            "chute.Source({}, shards={}, samples={})",
            self.kind,
            m.shards.len(),
            m.total_samples()
        )
    }
}

/// One path or a sequence of paths (`str` or `os.PathLike`).
fn paths(obj: &Bound<'_, PyAny>) -> PyResult<Vec<PathBuf>> {
    if obj.is_instance_of::<PyString>() || obj.hasattr("__fspath__")? {
        return Ok(vec![obj.extract()?]);
    }
    obj.try_iter()?.map(|p| p?.extract()).collect()
}

/// A dtype argument (`"uint16"`, `"int64"`, a numpy dtype or type: anything whose `str()` or
/// `__name__` is a numpy name).
pub(crate) fn dtype(option: &str, obj: &Bound<'_, PyAny>) -> PyResult<DType> {
    let name: String = match obj.extract::<String>() {
        Ok(s) => s,
        Err(_) => match obj.getattr("__name__") {
            Ok(n) => n.extract()?,
            Err(_) => obj.str()?.extract()?,
        },
    };
    name.parse::<DType>()
        .map_err(|e| errors::from_config(chute::ConfigError::new(option, e.reason)))
}

/// Token files (nanoGPT's `.bin`: flat little-endian `uint16` or `uint32` ids, no header),
/// one shard per file. Sample `i` of a file is the window of `seq_len + 1` tokens starting at
/// token `i * (seq_len + 1)`; batches have one column, `tokens`, of `out_dtype`.
#[pyfunction]
#[pyo3(signature = (paths, seq_len, dtype=None, out_dtype=None),
       text_signature = "(paths, seq_len, dtype='uint16', out_dtype='int64')")]
pub(crate) fn tokens(
    py: Python<'_>,
    paths: &Bound<'_, PyAny>,
    seq_len: i64,
    dtype: Option<&Bound<'_, PyAny>>,
    out_dtype: Option<&Bound<'_, PyAny>>,
) -> PyResult<Source> {
    let files = self::paths(paths)?;
    let seq_len = usize::try_from(seq_len).map_err(|_| {
        errors::from_config(chute::ConfigError::new(
            "seq_len",
            format!("{seq_len} tokens per sequence; pass at least 1"),
        ))
    })?;
    let options = TokenOptions {
        seq_len,
        dtype: match dtype {
            Some(d) => self::dtype("dtype", d)?,
            None => DType::U16,
        },
        out_dtype: match out_dtype {
            Some(d) => self::dtype("out_dtype", d)?,
            None => DType::I64,
        },
    };
    let source = py
        .detach(|| TokenSource::open(&files, options))
        .map_err(errors::to_py)?;
    Ok(Source {
        inner: Arc::new(source),
        kind: "tokens",
    })
}
