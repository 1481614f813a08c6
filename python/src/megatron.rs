//! `chute.MegatronWriter`: Megatron-Core indexed datasets written from Python.

use chute::DType;
use chute::formats::MegatronWriter as Writer;
use pyo3::prelude::*;

use crate::errors;

/// Writes a Megatron-Core indexed dataset, `<prefix>.bin` and `<prefix>.idx`, byte for byte as
/// Megatron-Core's `IndexedDatasetBuilder` writes it (one `add_item` and `end_document` per
/// document). `dtype` is the stored token type (`"uint16"`, as Megatron's `preprocess_data.py`
/// picks below a vocabulary of 65,500 ids, or `"int32"`; any integer type Megatron reads).
/// Both files are written under temporary names and renamed by `finish()` (the `.idx` last);
/// a writer left unfinished (or used as a context manager that raises) deletes them.
#[pyclass(module = "chute._chute")]
pub(crate) struct MegatronWriter {
    inner: Option<Writer>,
}

#[pymethods]
impl MegatronWriter {
    #[new]
    #[pyo3(signature = (prefix, dtype=None))]
    fn new(prefix: std::path::PathBuf, dtype: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let dtype = match dtype {
            Some(d) => crate::tensor::dtype("dtype", d)?,
            None => DType::U16,
        };
        let inner = Writer::create(prefix, dtype).map_err(errors::to_py)?;
        Ok(MegatronWriter { inner: Some(inner) })
    }

    /// Appends one document: a sequence of token ids (a list, a numpy array).
    fn add_document(&mut self, ids: Vec<u32>) -> PyResult<()> {
        self.writer()?.add_document(&ids).map_err(errors::to_py)
    }

    /// Documents written so far.
    #[getter]
    fn documents(&mut self) -> PyResult<u64> {
        Ok(self.writer()?.documents())
    }

    /// Writes the index and renames both files into place; returns the document count.
    fn finish(&mut self) -> PyResult<u64> {
        let w = self.inner.take().ok_or_else(finished)?;
        w.finish().map_err(errors::to_py)
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// Finishes when the block ends normally; drops (deletes) the files when it raised.
    fn __exit__(
        &mut self,
        kind: Option<&Bound<'_, PyAny>>,
        _value: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        if kind.is_some() {
            self.inner = None;
        } else if self.inner.is_some() {
            self.finish()?;
        }
        Ok(false)
    }
}

impl MegatronWriter {
    fn writer(&mut self) -> PyResult<&mut Writer> {
        self.inner.as_mut().ok_or_else(finished)
    }
}

fn finished() -> PyErr {
    pyo3::exceptions::PyValueError::new_err("the MegatronWriter is finished")
}
