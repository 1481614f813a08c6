//! [`Source`]: an opened dataset, and the functions that open one: `tokens`, `webdataset`,
//! `tfrecord` and `parquet`.

use std::path::PathBuf;
use std::sync::Arc;

use chute::formats::IndexMode;
use chute::formats::example::ExampleOptions;
use chute::formats::parquet::{ParquetOptions, ParquetSource};
use chute::formats::tfrecord::{TfRecordOptions, TfRecordSource};
use chute::formats::webdataset::{WebDatasetOptions, WebDatasetSource, expand_braces};
use chute::{DType, TokenOptions, TokenSource};
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::errors;

/// A dataset chute can load: samples addressed by a global id, in shards. Made by
/// `chute.tokens(...)`, `chute.webdataset(...)`, `chute.tfrecord(...)` or
/// `chute.parquet(...)`; passed to `chute.Loader`.
#[pyclass(module = "chute._chute", name = "Source", frozen)]
pub(crate) struct Source {
    pub(crate) inner: Arc<dyn chute::Source>,
    /// The format (`tokens`, `webdataset`, ...), for `repr`.
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

/// One path or a sequence of paths (`str` or `os.PathLike`); strings with braces are
/// expanded as WebDataset shard lists are (`train-{000000..000127}.tar`).
fn paths(obj: &Bound<'_, PyAny>) -> PyResult<Vec<PathBuf>> {
    let items: Vec<Bound<'_, PyAny>> =
        if obj.is_instance_of::<PyString>() || obj.hasattr("__fspath__")? {
            vec![obj.clone()]
        } else {
            obj.try_iter()?.collect::<PyResult<_>>()?
        };
    let mut out = Vec::new();
    for item in items {
        if let Ok(s) = item.extract::<String>()
            && s.contains('{')
        {
            let expanded = expand_braces(&s).map_err(errors::from_config)?;
            out.extend(expanded.into_iter().map(PathBuf::from));
        } else {
            out.push(item.extract()?);
        }
    }
    Ok(out)
}

/// `index="auto" | "require" | "scan"`.
fn index_mode(index: &str) -> PyResult<IndexMode> {
    Ok(match index {
        "auto" => IndexMode::Auto,
        "require" => IndexMode::Require,
        "scan" => IndexMode::Scan,
        other => {
            return Err(errors::from_config(chute::ConfigError::new(
                "index",
                format!("{other:?}; use \"auto\", \"require\" or \"scan\""),
            )));
        }
    })
}

/// WebDataset tar shards: local paths or URLs (`http(s)://`, `s3://`, `gs://`, `az://`,
/// `file://`); brace patterns expand. Members sharing a key form a
/// sample; fields are named by extension (`jpg`, `cls`, ...) and hold bytes, with the key in
/// a `__key__` text field. `index`: use `<shard>.idx` from `chute index` when present
/// (`"auto"`), always (`"require"`) or never (`"scan"` the headers).
#[pyfunction]
#[pyo3(signature = (urls, *, index="auto"))]
pub(crate) fn webdataset(py: Python<'_>, urls: &Bound<'_, PyAny>, index: &str) -> PyResult<Source> {
    let files = paths(urls)?;
    let options = WebDatasetOptions {
        index: index_mode(index)?,
        ..Default::default()
    };
    let source = py
        .detach(|| WebDatasetSource::open(&files, options))
        .map_err(errors::to_py)?;
    Ok(Source {
        inner: Arc::new(source),
        kind: "webdataset",
    })
}

/// TFRecord files of `tf.train.Example`s: local paths or URLs (`http(s)://`, `s3://`,
/// `gs://`, `az://`, `file://`); brace patterns expand. Each feature
/// becomes a column: int64 and float lists as arrays (a one-value list as a scalar), a bytes
/// list of one value as bytes. `features` keeps only those (in that order); `raw=True` gives
/// each record's bytes as a `record` column instead. CRC32C checks are on unless
/// `verify_checksums=False`.
#[pyfunction]
#[pyo3(signature = (urls, *, features=None, raw=false, verify_checksums=true, index="auto"))]
pub(crate) fn tfrecord(
    py: Python<'_>,
    urls: &Bound<'_, PyAny>,
    features: Option<Vec<String>>,
    raw: bool,
    verify_checksums: bool,
    index: &str,
) -> PyResult<Source> {
    let files = paths(urls)?;
    let options = TfRecordOptions {
        verify_checksums,
        example: (!raw).then(|| ExampleOptions {
            features,
            ..Default::default()
        }),
        index: index_mode(index)?,
        ..Default::default()
    };
    let source = py
        .detach(|| TfRecordSource::open(&files, options))
        .map_err(errors::to_py)?;
    Ok(Source {
        inner: Arc::new(source),
        kind: "tfrecord",
    })
}

/// Parquet files (paths or URLs, downloaded whole when opened; brace patterns expand). `columns` projects (default: all);
/// numeric columns come out as `[B]`, fixed-size lists as `[B, k]`, binary and string columns
/// as lists. Row groups are split into shards of at most `chunk_rows` rows (default 16,384).
#[pyfunction]
#[pyo3(signature = (urls, *, columns=None, chunk_rows=None))]
pub(crate) fn parquet(
    py: Python<'_>,
    urls: &Bound<'_, PyAny>,
    columns: Option<Vec<String>>,
    chunk_rows: Option<usize>,
) -> PyResult<Source> {
    let files = paths(urls)?;
    let options = ParquetOptions {
        columns,
        chunk_rows,
        ..Default::default()
    };
    let source = py
        .detach(|| ParquetSource::open(&files, options))
        .map_err(errors::to_py)?;
    Ok(Source {
        inner: Arc::new(source),
        kind: "parquet",
    })
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
/// one shard per file; paths, or URLs downloaded whole when opened. Sample `i` of a file is the window of `seq_len + 1` tokens starting at
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
