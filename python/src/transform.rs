//! [`PyTransform`]: a Python callable as a chute [`Transform`], run on the worker threads
//! with the GIL held for the length of the call.
//!
//! The callable gets the sample as a `dict`: numeric fields as writable numpy arrays (copies,
//! already in the dtype the batch will have), bytes fields as `bytes`, text as `str`, plus
//! `"__index__"` (the global sample id) and, when the format has keys, `"__key__"`. If it
//! accepts two positional arguments, the second is a `numpy.random.Generator` seeded from the
//! sample's own RNG, so augmentations depend on (seed, epoch, sample) only. It returns the new
//! dict (or `None` after editing the given one in place); `"__index__"`/`"__key__"` are
//! ignored on the way back, arrays become array fields, `bytes` bytes fields and `str` text.
//!
//! An exception raised by the callable travels inside the engine's `Error::Transform` as the
//! `PyErr` itself and is raised again, unchanged, from `next()` (see `errors.rs`).
//! `KeyboardInterrupt` and `SystemExit` are not per-sample errors: they are parked in
//! [`Interrupt`] (so `on_error="skip"` cannot swallow them) and raised by the loader.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use chute::core::{Array, BoxError, Field, FieldName, Sample, SampleRng, cast_into};
use chute::{DType, Transform};
use pyo3::exceptions::{PyException, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyModule, PyString, PyTuple};

use crate::errors;

use crate::tensor::{Tensor, dtype};

/// Set when the interpreter starts shutting down (an `atexit` hook of the package): from then
/// on transforms fail at once instead of trying to take the GIL, which a finalizing
/// interpreter never gives back to other threads.
pub(crate) static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);

/// A `KeyboardInterrupt` (or other non-`Exception`) raised inside a transform, waiting for
/// the loader to raise it. Shared by a loader and its transforms.
#[derive(Debug, Default)]
pub(crate) struct Interrupt(Mutex<Option<PyErr>>);

impl Interrupt {
    pub(crate) fn is_set(&self) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    pub(crate) fn set(&self, err: PyErr) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(err);
    }

    /// The parked exception, if any (taken: it is raised once).
    pub(crate) fn take(&self) -> Option<PyErr> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// Runs `f` with the GIL held, from one of the engine's worker threads.
///
/// A thread that Python did not create has no Python thread state; `Python::attach` would
/// make one and free it again on every call (most of the cost of a small `__getitem__`). The
/// first call on such a thread makes one and keeps it, with the GIL released, until the
/// thread ends.
pub(crate) fn on_worker<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> R {
    KEEP_ALIVE.with(|k| {
        if k.borrow().is_none() {
            // SAFETY: a thread-state query is allowed without the GIL.
            let own = unsafe { pyo3::ffi::PyGILState_GetThisThreadState() }.is_null();
            if own {
                *k.borrow_mut() = Some(ThreadState::new());
            }
        }
    });
    Python::attach(f)
}

/// A worker thread's Python thread state, kept between calls (see [`on_worker`]).
struct ThreadState {
    gil: pyo3::ffi::PyGILState_STATE,
    saved: *mut pyo3::ffi::PyThreadState,
}

impl ThreadState {
    fn new() -> Self {
        // SAFETY: this thread has no thread state and does not hold the GIL: Ensure makes the
        // state and takes the GIL, SaveThread releases the GIL and keeps the state.
        unsafe {
            let gil = pyo3::ffi::PyGILState_Ensure();
            let saved = pyo3::ffi::PyEval_SaveThread();
            ThreadState { gil, saved }
        }
    }
}

impl Drop for ThreadState {
    fn drop(&mut self) {
        // At exit (or once the interpreter is gone) the state is left: taking the GIL from a
        // thread that is ending then is what must not happen.
        // SAFETY: Py_IsInitialized may be called at any time.
        if SHUTTING_DOWN.load(Ordering::Relaxed) || unsafe { pyo3::ffi::Py_IsInitialized() } == 0 {
            return;
        }
        // SAFETY: `saved` is this thread's state from SaveThread, and `gil` its Ensure.
        unsafe {
            pyo3::ffi::PyEval_RestoreThread(self.saved);
            pyo3::ffi::PyGILState_Release(self.gil);
        }
    }
}

thread_local! {
    static KEEP_ALIVE: std::cell::RefCell<Option<ThreadState>> = const { std::cell::RefCell::new(None) };
}

/// A Python callable `f(sample)` or `f(sample, rng)` as a chute transform.
pub(crate) struct PyTransform {
    func: Py<PyAny>,
    takes_rng: bool,
    name: String,
    interrupt: std::sync::Arc<Interrupt>,
}

impl PyTransform {
    pub(crate) fn new(
        func: Bound<'_, PyAny>,
        takes_rng: bool,
        interrupt: std::sync::Arc<Interrupt>,
    ) -> PyResult<Self> {
        if !func.is_callable() {
            return Err(PyTypeError::new_err(format!(
                "transforms must be callables f(sample) or f(sample, rng), got {}",
                func.get_type().name()?
            )));
        }
        let name = match func.getattr("__qualname__") {
            Ok(n) => n.extract::<String>()?,
            Err(_) => func.get_type().name()?.to_string(),
        };
        Ok(PyTransform {
            func: func.unbind(),
            takes_rng,
            name,
            interrupt,
        })
    }

    fn call(&self, py: Python<'_>, sample: &mut Sample, rng: &mut SampleRng) -> PyResult<()> {
        let np = numpy(py)?;
        let d = to_dict(py, sample)?;
        let out = if self.takes_rng {
            let seed = rng.next_u64();
            let generator = np.getattr("random")?.call_method1("default_rng", (seed,))?;
            self.func.call1(py, (&d, generator))?
        } else {
            self.func.call1(py, (&d,))?
        };
        let out = out.bind(py);
        let fields = if out.is_none() {
            from_dict(py, np, &d)?
        } else {
            let out = out.cast::<PyDict>().map_err(|_| {
                PyTypeError::new_err(format!(
                    "transform {} returned {}; return a dict (or None after editing the \
                     sample in place)",
                    self.name,
                    out.get_type()
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default()
                ))
            })?;
            from_dict(py, np, out)?
        };
        // A source's `__key__` field (WebDataset's) stays in the batch: the dict's copy is
        // ignored on the way back, as documented, not dropped.
        let key = sample.remove("__key__");
        sample.fields = fields;
        if let Some(key) = key {
            sample
                .fields
                .insert(0, (FieldName::Borrowed("__key__"), key));
        }
        Ok(())
    }
}

impl Transform for PyTransform {
    fn apply(&self, sample: &mut Sample, rng: &mut SampleRng) -> Result<(), BoxError> {
        if SHUTTING_DOWN.load(Ordering::Relaxed) {
            return Err("the Python interpreter is shutting down".into());
        }
        if self.interrupt.is_set() {
            return Err("interrupted".into());
        }
        on_worker(|py| match self.call(py, sample, rng) {
            Ok(()) => Ok(()),
            Err(e) if e.is_instance_of::<PyException>(py) => Err(Box::new(e) as BoxError),
            Err(e) => {
                // KeyboardInterrupt, SystemExit: not this sample's fault; the loader raises it.
                let msg = format!("interrupted by {}", e.get_type(py));
                self.interrupt.set(e);
                Err(msg.into())
            }
        })
    }

    fn name(&self) -> &str {
        &self.name
    }
}

/// The `numpy` module (imported once per process).
fn numpy(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static NUMPY: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    NUMPY
        .get_or_try_init(py, || Ok::<_, PyErr>(py.import("numpy")?.unbind()))
        .map(|m| m.bind(py))
}

/// The sample as the dict a transform sees.
fn to_dict<'py>(py: Python<'py>, sample: &Sample) -> PyResult<Bound<'py, PyDict>> {
    let np = numpy(py)?;
    let d = PyDict::new(py);
    for (name, field) in &sample.fields {
        let name: &str = name;
        match field {
            Field::Bytes(b) => d.set_item(name, PyBytes::new(py, b))?,
            Field::Text(b) => d.set_item(name, PyString::new(py, &String::from_utf8_lossy(b)))?,
            Field::Array(a) => d.set_item(name, to_numpy(py, np, a)?)?,
            Field::Value(v) => d.set_item(
                name,
                crate::values::to_py(py, v, &mut crate::values::KeyStrings::default())?,
            )?,
            _ => {
                return Err(PyTypeError::new_err(format!(
                    "field {name:?} has a kind this version of the Python package cannot pass \
                     to a transform"
                )));
            }
        }
    }
    d.set_item("__index__", sample.index)?;
    if !sample.key.is_empty() {
        d.set_item("__key__", &sample.key)?;
    }
    Ok(d)
}

/// A copy of `a` as a numpy array (an array inside a nested value).
pub(crate) fn array_to_py<'py>(py: Python<'py>, a: &Array) -> PyResult<Bound<'py, PyAny>> {
    to_numpy(py, numpy(py)?, a)
}

/// A numpy array (or anything numpy makes one of) inside a nested value as an array.
pub(crate) fn array_from_py(py: Python<'_>, name: &str, v: &Bound<'_, PyAny>) -> PyResult<Array> {
    to_array(py, numpy(py)?, name, v)
}

/// A copy of `a` as a writable numpy array of the dtype it will have in the batch.
fn to_numpy<'py>(
    py: Python<'py>,
    np: &Bound<'py, PyModule>,
    a: &Array,
) -> PyResult<Bound<'py, PyAny>> {
    let out = a.out_dtype();
    let mut t = chute::Tensor::zeros(out, a.shape.clone());
    cast_into(a.dtype, &a.data, out, t.as_bytes_mut());
    np.call_method1("asarray", (Py::new(py, Tensor::new(t))?,))
}

/// The fields of a dict a transform returned.
fn from_dict(
    py: Python<'_>,
    np: &Bound<'_, PyModule>,
    d: &Bound<'_, PyDict>,
) -> PyResult<Vec<(FieldName, Field)>> {
    let mut fields = Vec::with_capacity(d.len());
    for (k, v) in d.iter() {
        let name: String = k.extract().map_err(|_| {
            PyTypeError::new_err(format!(
                "transform returned a dict with key {}; keys must be str",
                k.repr().map(|r| r.to_string()).unwrap_or_default()
            ))
        })?;
        if name == "__index__" || name == "__key__" {
            continue;
        }
        let field = if let Ok(b) = v.cast::<PyBytes>() {
            Field::Bytes(Bytes::copy_from_slice(b.as_bytes()))
        } else if let Ok(b) = v.cast::<PyByteArray>() {
            Field::Bytes(Bytes::from(b.to_vec()))
        } else if let Ok(s) = v.cast::<PyString>() {
            Field::Text(Bytes::from(s.extract::<String>()?))
        } else if v.is_none() || v.is_instance_of::<PyDict>() {
            Field::Value(crate::values::from_py(&name, &v)?)
        } else {
            match to_array(py, np, &name, &v) {
                Ok(a) => Field::Array(a),
                // Lists of strings, of dicts, of lists of differing lengths: nested values.
                Err(e) if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() => {
                    crate::values::from_py(&name, &v)
                        .map(Field::Value)
                        .map_err(|_| e)?
                }
                Err(e) => return Err(e),
            }
        };
        fields.push((FieldName::Owned(name), field));
    }
    Ok(fields)
}

/// Anything numpy can make an array of (arrays, numbers, nested lists) as an array field.
fn to_array(
    py: Python<'_>,
    np: &Bound<'_, PyModule>,
    name: &str,
    v: &Bound<'_, PyAny>,
) -> PyResult<Array> {
    let kwargs = PyDict::new(py);
    kwargs.set_item("order", "C")?;
    let mut a = np.call_method("asarray", (v,), Some(&kwargs))?;
    let mut dt = a.getattr("dtype")?;
    if dt.getattr("byteorder")?.extract::<String>()? == ">" {
        // chute's buffers are little-endian.
        let little = dt.call_method1("newbyteorder", ("<",))?;
        a = a.call_method1("astype", (&little,))?;
        dt = little;
    }
    let dtype: DType = dtype(name, &dt.getattr("name")?).map_err(|_| {
        PyTypeError::new_err(format!(
            "transform returned field {name:?} as {}, which chute cannot batch; return numeric \
             arrays, bytes or str",
            v.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
                + &dt
                    .str()
                    .map(|s| format!(" of dtype {s}"))
                    .unwrap_or_default()
        ))
    })?;
    let shape: Vec<usize> = a.getattr("shape")?.extract()?;
    let data = a.call_method0("tobytes")?;
    let data = data.cast::<PyBytes>()?;
    Ok(Array::new(
        dtype,
        shape,
        Bytes::copy_from_slice(data.as_bytes()),
    ))
}

/// Transforms as the loader takes them (JSON op specs, or `(callable, takes_rng)` pairs) as
/// one engine transform; `None` when there are none.
pub(crate) fn build(
    specs: Vec<Bound<'_, PyAny>>,
    interrupt: &std::sync::Arc<Interrupt>,
) -> PyResult<Option<std::sync::Arc<dyn Transform>>> {
    let mut out: Vec<std::sync::Arc<dyn Transform>> = Vec::new();
    for t in specs {
        if let Ok(spec) = t.extract::<String>() {
            let ops = chute::ops::SampleOps::from_json(&spec).map_err(errors::from_config)?;
            out.push(std::sync::Arc::new(ops));
        } else {
            let (func, takes_rng): (Bound<'_, PyAny>, bool) = t.extract()?;
            out.push(std::sync::Arc::new(PyTransform::new(
                func,
                takes_rng,
                std::sync::Arc::clone(interrupt),
            )?));
        }
    }
    Ok(match out.len() {
        0 => None,
        1 => out.pop(),
        _ => {
            let mut all = chute::core::Compose::new();
            for t in out {
                all.push(t);
            }
            Some(std::sync::Arc::new(all))
        }
    })
}
