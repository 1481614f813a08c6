//! [`Tensor`]: a batch column crossing into Python without a copy.

use std::sync::Arc;

use chute::DType;
use chute::core::Column;
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCapsule, PyDict, PyList, PyString, PyTuple};

use crate::ndarray::{self, Handover};
use crate::{dlpack, errors};

/// One batch column: a C-contiguous array in chute's 64-byte-aligned pooled buffer.
///
/// numpy views it through `__array_interface__` (`numpy.asarray(t)` shares the memory and
/// keeps `t` as the array's base), torch and JAX through `__dlpack__`. The buffer returns to
/// the loader's pool when the last view, capsule and this object are gone.
#[pyclass(module = "chute._chute", name = "Tensor", frozen)]
pub(crate) struct Tensor {
    inner: Arc<chute::Tensor>,
}

impl Tensor {
    pub(crate) fn new(t: chute::Tensor) -> Self {
        Tensor { inner: Arc::new(t) }
    }
}

/// numpy's array-interface type string (`'<i8'`, `'|u1'`...), or `None` where numpy has no
/// such type (bfloat16): the same string as a `.npy` header's `descr`.
fn typestr(dtype: DType) -> Option<&'static str> {
    chute::formats::npy_descr(dtype)
}

#[pymethods]
impl Tensor {
    /// Address of the first element (64-byte aligned).
    #[getter]
    fn data_ptr(&self) -> usize {
        self.inner.data_ptr() as usize
    }

    /// The shape, `(batch, ...)`.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.shape())
    }

    /// The element type, by numpy's name (`'int64'`, `'uint16'`, `'bfloat16'`...).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.inner.dtype().name()
    }

    /// Bytes of data.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.as_bytes().len()
    }

    /// Number of dimensions.
    #[getter]
    fn ndim(&self) -> usize {
        self.inner.shape().len()
    }

    /// Length of the first dimension (the batch size).
    fn __len__(&self) -> PyResult<usize> {
        self.inner
            .shape()
            .first()
            .copied()
            .ok_or_else(|| PyTypeError::new_err("len() of a 0-d tensor"))
    }

    fn __repr__(&self) -> String {
        format!(
            "chute.Tensor(dtype={}, shape={:?})",
            self.inner.dtype(),
            self.inner.shape()
        )
    }

    /// numpy's array interface (version 3): the data pointer, writable, C-contiguous.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let t = &self.inner;
        let typestr = typestr(t.dtype()).ok_or_else(|| {
            PyBufferError::new_err(format!(
                "numpy has no {} type; take this column with output=\"torch\", \"jax\" or \
                 \"dlpack\"",
                t.dtype()
            ))
        })?;
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", PyTuple::new(py, t.shape())?)?;
        d.set_item("typestr", typestr)?;
        // (address, read_only): writable, so torch.from_numpy takes it without a warning.
        d.set_item("data", (t.data_ptr() as usize, false))?;
        d.set_item("strides", py.None())?;
        Ok(d)
    }

    /// Exports the column as a DLPack capsule (no copy unless `copy=True`).
    ///
    /// `max_version >= (1, 0)` gets a versioned capsule (`"dltensor_versioned"`), otherwise
    /// the legacy `"dltensor"` one. The memory is CPU memory: `dl_device`, if given, must be
    /// `(1, 0)`; `stream` must be `None` or `-1` (CPU has no streams).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        if let Some(s) = stream
            && !s.is_none()
            && s.extract::<i64>().ok() != Some(-1)
        {
            return Err(PyBufferError::new_err(
                "chute tensors are in CPU memory: stream must be None",
            ));
        }
        if let Some(d) = dl_device
            && d != (dlpack::KDL_CPU, 0)
        {
            return Err(PyBufferError::new_err(format!(
                "chute tensors are in CPU memory (device (1, 0)), not on device {d:?}; copy \
                 them to the device with the consumer (tensor.to(device))"
            )));
        }
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        let copied = copy == Some(true);
        let tensor = if copied {
            let mut c = chute::Tensor::zeros(self.inner.dtype(), self.inner.shape().to_vec());
            c.as_bytes_mut().copy_from_slice(self.inner.as_bytes());
            Arc::new(c)
        } else {
            Arc::clone(&self.inner)
        };
        dlpack::capsule(py, tensor, versioned, copied)
    }

    /// `(kDLCPU, 0)`.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (dlpack::KDL_CPU, 0)
    }
}

/// Column `t` as the consumer gets it: through `output` (or as the `Tensor` itself); made
/// here as `handover` says where it can be (see [`Handover`]).
fn handed<'py>(
    py: Python<'py>,
    t: chute::Tensor,
    output: Option<&Py<PyAny>>,
    handover: &Handover<'py>,
) -> PyResult<Bound<'py, PyAny>> {
    let t = Bound::new(py, Tensor::new(t))?;
    match handover {
        Handover::Numpy => {
            if let Some(a) = ndarray::of(py, &t.get().inner, t.as_any())? {
                return Ok(a);
            }
        }
        Handover::Torch(from_numpy) => {
            if let Some(a) = ndarray::of(py, &t.get().inner, t.as_any())?
                && let Ok(tensor) = from_numpy.call1((a,))
            {
                return Ok(tensor);
            }
        }
        Handover::Call => {}
    }
    match output {
        Some(f) => f.bind(py).call1((t,)),
        None => Ok(t.into_any()),
    }
}

/// Batch columns as `{name: array}`: fixed-shape columns as `chute.Tensor`s handed through
/// `output` (numpy, torch, JAX), variable-length columns as `list[bytes]` / `list[str]`, arrays
/// of differing shapes as a list of arrays, a `collate_fn`'s result as itself.
pub(crate) fn columns_to_dict<'py>(
    py: Python<'py>,
    columns: Vec<(String, Column)>,
    output: Option<&Py<PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    // Nested values are many small lists and dicts: Python's cyclic collector would run
    // several times while they are made, each time promoting the batch's young objects, and
    // so trigger full collections of the whole heap (more than half the time of a batch of
    // chat rows). They hold no cycles, so it pauses while they are made.
    let nested = columns
        .iter()
        .any(|(_, c)| matches!(c, Column::Values(_) | Column::Nested(_)));
    let _pause = if nested {
        Some(crate::values::GcPause::new(py)?)
    } else {
        None
    };
    // `numpy.asarray` and `torch.from_dlpack` (output="numpy", "torch"): the arrays are made
    // straight through numpy's C API.
    let handover = match output {
        Some(f) => Handover::of(py, f.bind(py)),
        None => Handover::Call,
    };
    let d = PyDict::new(py);
    for (name, column) in columns {
        match column {
            Column::Tensor(t) => d.set_item(name, handed(py, t, output, &handover)?)?,
            Column::Var(v) => {
                let values = PyList::empty(py);
                for i in 0..v.len() {
                    let b = v.get(i);
                    if v.text {
                        values.append(PyString::new(py, &String::from_utf8_lossy(b)))?;
                    } else {
                        values.append(PyBytes::new(py, b))?;
                    }
                }
                d.set_item(name, values)?;
            }
            Column::List(tensors) => {
                let values = PyList::empty(py);
                for t in tensors {
                    values.append(handed(py, t, output, &handover)?)?;
                }
                d.set_item(name, values)?;
            }
            Column::Values(values) => d.set_item(name, crate::values::list_of(py, &values)?)?,
            Column::Nested(rows) => {
                d.set_item(name, crate::values::list_of_rows(py, rows.as_ref())?)?
            }
            Column::Object(o) => match o.0.downcast_ref::<Py<PyAny>>() {
                Some(v) => d.set_item(name, v.clone_ref(py))?,
                None => {
                    return Err(PyTypeError::new_err(format!(
                        "column {name:?} holds a value that is not a Python object"
                    )));
                }
            },
            _ => {
                return Err(PyTypeError::new_err(format!(
                    "column {name:?} has a kind this version of the Python package cannot \
                     convert"
                )));
            }
        }
    }
    Ok(d)
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
