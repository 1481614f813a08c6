//! Nested values ([`chute::Value`]) to and from Python: lists, dicts, `None`, `bool`, `int`,
//! `float`, `str` and `bytes`, as `datasets`' Python formatting and pyarrow's `to_pylist`
//! give them (a map's entries as `(key, value)` tuples).

use std::sync::Arc;

use bytes::Bytes;
use chute::{Keys, Value};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

/// The Python strings of the record keys met so far (a column's records share one `Keys`:
/// its strings are made once a batch, not once a row).
#[derive(Default)]
pub(crate) struct KeyStrings {
    seen: Vec<(Keys, Vec<Py<PyString>>)>,
}

impl KeyStrings {
    fn of<'a>(&'a mut self, py: Python<'_>, keys: &Keys) -> &'a [Py<PyString>] {
        let at = match self.seen.iter().position(|(k, _)| Arc::ptr_eq(k, keys)) {
            Some(at) => at,
            None => {
                let strings = keys
                    .iter()
                    .map(|k| PyString::intern(py, k).unbind())
                    .collect();
                self.seen.push((keys.clone(), strings));
                self.seen.len() - 1
            }
        };
        &self.seen[at].1
    }
}

/// `v` as a Python object.
pub(crate) fn to_py<'py>(
    py: Python<'py>,
    v: &Value,
    keys: &mut KeyStrings,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Int(i) => i.into_pyobject(py)?.into_any(),
        Value::UInt(u) => u.into_pyobject(py)?.into_any(),
        Value::Float(f) => PyFloat::new(py, *f).into_any(),
        Value::Text(b) => PyString::new(py, &String::from_utf8_lossy(b)).into_any(),
        Value::Bytes(b) => PyBytes::new(py, b).into_any(),
        Value::List(items) => {
            let items = items
                .iter()
                .map(|x| to_py(py, x, keys))
                .collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any()
        }
        Value::Record(k, values) => {
            let d = PyDict::new(py);
            let names: Vec<Py<PyString>> = keys.of(py, k).iter().map(|s| s.clone_ref(py)).collect();
            for (name, x) in names.iter().zip(values) {
                d.set_item(name.bind(py), to_py(py, x, keys)?)?;
            }
            d.into_any()
        }
        Value::Map(entries) => {
            let items = entries
                .iter()
                .map(|(k, x)| {
                    PyTuple::new(py, [to_py(py, k, keys)?, to_py(py, x, keys)?])
                        .map(Bound::into_any)
                })
                .collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any()
        }
        _ => {
            return Err(PyTypeError::new_err(
                "a nested value of a kind this version of the Python package cannot convert",
            ));
        }
    })
}

/// A column of nested values as a Python list.
pub(crate) fn list_of<'py>(py: Python<'py>, values: &[Value]) -> PyResult<Bound<'py, PyList>> {
    let mut keys = KeyStrings::default();
    let items = values
        .iter()
        .map(|v| to_py(py, v, &mut keys))
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, items)
}

/// A Python object built of lists, tuples, dicts (with `str` keys), `None`, `bool`, `int`,
/// `float`, `str` and `bytes` as a nested value; `name` is the field it is, for errors.
pub(crate) fn from_py(name: &str, v: &Bound<'_, PyAny>) -> PyResult<Value> {
    from_py_at(name, v, 0)
}

/// Deepest nesting a Python value handed over may have (a self-containing list never ends).
const MAX_DEPTH: usize = 64;

fn from_py_at(name: &str, v: &Bound<'_, PyAny>, depth: usize) -> PyResult<Value> {
    if depth > MAX_DEPTH {
        return Err(PyTypeError::new_err(format!(
            "field {name:?} nests values more than {MAX_DEPTH} deep"
        )));
    }
    Ok(if v.is_none() {
        Value::Null
    } else if let Ok(b) = v.cast::<PyBool>() {
        Value::Bool(b.is_true())
    } else if v.is_instance_of::<PyInt>() {
        match v.extract::<i64>() {
            Ok(i) => Value::Int(i),
            Err(_) => Value::UInt(v.extract::<u64>()?),
        }
    } else if let Ok(f) = v.cast::<PyFloat>() {
        Value::Float(f.value())
    } else if let Ok(s) = v.cast::<PyString>() {
        Value::Text(Bytes::from(s.extract::<String>()?))
    } else if let Ok(b) = v.cast::<PyBytes>() {
        Value::Bytes(Bytes::copy_from_slice(b.as_bytes()))
    } else if let Ok(d) = v.cast::<PyDict>() {
        let mut keys: Vec<Arc<str>> = Vec::with_capacity(d.len());
        let mut values = Vec::with_capacity(d.len());
        for (k, x) in d.iter() {
            let k: String = k.extract().map_err(|_| {
                PyTypeError::new_err(format!(
                    "field {name:?} holds a dict whose keys are not str"
                ))
            })?;
            keys.push(Arc::from(k));
            values.push(from_py_at(name, &x, depth + 1)?);
        }
        Value::Record(Arc::from(keys), values)
    } else if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        Value::List(
            v.try_iter()?
                .map(|x| from_py_at(name, &x?, depth + 1))
                .collect::<PyResult<_>>()?,
        )
    } else {
        return Err(PyTypeError::new_err(format!(
            "field {name:?} holds a {}, which a nested value cannot (lists, dicts, None, bool, \
             int, float, str and bytes)",
            v.get_type().name()?
        )));
    })
}
