//! Nested values ([`chute::Value`]) to and from Python: lists, dicts, `None`, `bool`, `int`,
//! `float`, `str` and `bytes`, as `datasets`' Python formatting and pyarrow's `to_pylist`
//! give them (a map's entries as `(key, value)` tuples).

use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use chute::{Keys, Value};
use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyModule, PyString, PyTuple};

/// The Python strings of the record keys met so far (a column's records share one `Keys`:
/// its strings are made once a batch, not once a row).
#[derive(Default)]
pub(crate) struct KeyStrings {
    seen: Vec<(Keys, Rc<[Py<PyString>]>)>,
}

impl KeyStrings {
    fn of(&mut self, py: Python<'_>, keys: &Keys) -> Rc<[Py<PyString>]> {
        if let Some((_, strings)) = self.seen.iter().find(|(k, _)| Arc::ptr_eq(k, keys)) {
            return strings.clone();
        }
        let strings: Rc<[Py<PyString>]> = keys
            .iter()
            .map(|k| PyString::intern(py, k).unbind())
            .collect();
        self.seen.push((keys.clone(), strings.clone()));
        strings
    }
}

/// Python's cyclic garbage collector paused for as long as this lives (if it was running):
/// for making many small acyclic objects (a batch's nested values), which it would otherwise
/// traverse several times over as they are made. Another thread that pauses the collector
/// meanwhile finds it paused and leaves it; this one resumes it when dropped.
pub(crate) struct GcPause<'py> {
    gc: Option<Bound<'py, PyModule>>,
}

impl<'py> GcPause<'py> {
    pub(crate) fn new(py: Python<'py>) -> PyResult<GcPause<'py>> {
        static GC: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
        let gc = GC
            .get_or_try_init(py, || Ok::<_, PyErr>(py.import("gc")?.unbind()))?
            .bind(py)
            .clone();
        if !gc.call_method0("isenabled")?.is_truthy()? {
            return Ok(GcPause { gc: None });
        }
        gc.call_method0("disable")?;
        Ok(GcPause { gc: Some(gc) })
    }
}

impl Drop for GcPause<'_> {
    fn drop(&mut self) {
        if let Some(gc) = &self.gc
            && let Err(e) = gc.call_method0("enable")
        {
            e.restore(gc.py());
        }
    }
}

/// `v` as a Python object.
pub(crate) fn to_py<'py>(
    py: Python<'py>,
    v: &Value,
    keys: &mut KeyStrings,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: `new_ref` returns a new reference or null with an exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, new_ref(py, v, keys)) }
}

/// `v` as a new reference to a Python object, or null with the exception set: CPython's own
/// constructors, each list and dict made at its size, no intermediate vectors (a batch of
/// chat messages is hundreds of thousands of objects).
fn new_ref(py: Python<'_>, v: &Value, keys: &mut KeyStrings) -> *mut ffi::PyObject {
    // SAFETY: the GIL is held (`py`); every call below is given valid objects and sizes, and
    // each reference made is either handed on (stolen by a list or tuple, returned) or
    // released.
    unsafe {
        match v {
            Value::Null => {
                let none = ffi::Py_None();
                ffi::Py_IncRef(none);
                none
            }
            Value::Bool(b) => ffi::PyBool_FromLong(i64::from(*b) as _),
            Value::Int(i) => ffi::PyLong_FromLongLong(*i),
            Value::UInt(u) => ffi::PyLong_FromUnsignedLongLong(*u),
            Value::Float(f) => ffi::PyFloat_FromDouble(*f),
            Value::Text(b) => ffi::PyUnicode_DecodeUTF8(
                b.as_ptr().cast(),
                b.len() as ffi::Py_ssize_t,
                c"replace".as_ptr(),
            ),
            Value::Bytes(b) => {
                ffi::PyBytes_FromStringAndSize(b.as_ptr().cast(), b.len() as ffi::Py_ssize_t)
            }
            Value::List(items) => {
                let list = ffi::PyList_New(items.len() as ffi::Py_ssize_t);
                if list.is_null() {
                    return list;
                }
                for (i, x) in items.iter().enumerate() {
                    let item = new_ref(py, x, keys);
                    if item.is_null() {
                        ffi::Py_DecRef(list);
                        return item;
                    }
                    ffi::PyList_SetItem(list, i as ffi::Py_ssize_t, item); // steals `item`
                }
                list
            }
            Value::Record(k, values) => {
                let names = keys.of(py, k);
                let d = ffi::PyDict_New();
                if d.is_null() {
                    return d;
                }
                for (name, x) in names.iter().zip(values) {
                    let item = new_ref(py, x, keys);
                    if item.is_null() {
                        ffi::Py_DecRef(d);
                        return item;
                    }
                    let set = ffi::PyDict_SetItem(d, name.as_ptr(), item);
                    ffi::Py_DecRef(item);
                    if set != 0 {
                        ffi::Py_DecRef(d);
                        return std::ptr::null_mut();
                    }
                }
                d
            }
            Value::Array(a) => match crate::transform::array_to_py(py, a) {
                Ok(o) => o.into_ptr(),
                Err(e) => {
                    e.restore(py);
                    std::ptr::null_mut()
                }
            },
            Value::Map(entries) => {
                let list = ffi::PyList_New(entries.len() as ffi::Py_ssize_t);
                if list.is_null() {
                    return list;
                }
                for (i, (k, x)) in entries.iter().enumerate() {
                    let pair = ffi::PyTuple_New(2);
                    if pair.is_null() {
                        ffi::Py_DecRef(list);
                        return pair;
                    }
                    ffi::PyList_SetItem(list, i as ffi::Py_ssize_t, pair);
                    for (j, part) in [k, x].into_iter().enumerate() {
                        let item = new_ref(py, part, keys);
                        if item.is_null() {
                            ffi::Py_DecRef(list);
                            return item;
                        }
                        ffi::PyTuple_SetItem(pair, j as ffi::Py_ssize_t, item);
                    }
                }
                list
            }
            _ => {
                PyTypeError::new_err(
                    "a nested value of a kind this version of the Python package cannot convert",
                )
                .restore(py);
                std::ptr::null_mut()
            }
        }
    }
}

/// Python objects made straight from Arrow arrays ([`chute::formats::values::Build`]): each
/// list and dict made at its size with CPython's constructors, text decoded from the arrays'
/// bytes, a record's keys made once a batch. A failed constructor leaves its exception set,
/// gives a null, and marks the build failed.
struct PyBuild<'py> {
    py: Python<'py>,
    keys: KeyStrings,
    failed: bool,
}

impl PyBuild<'_> {
    fn made(&mut self, obj: *mut ffi::PyObject) -> *mut ffi::PyObject {
        if obj.is_null() {
            self.failed = true;
        }
        obj
    }
}

impl chute::formats::values::Build for PyBuild<'_> {
    type Out = *mut ffi::PyObject;

    // Every method: the GIL is held (`self.py`); each constructor is given valid
    // pointers and sizes; references are stolen by their containers or handed back.
    fn null(&mut self) -> Self::Out {
        // SAFETY: the GIL is held; valid pointers and sizes (see the impl).
        unsafe {
            let none = ffi::Py_None();
            ffi::Py_IncRef(none);
            none
        }
    }
    fn bool(&mut self, v: bool) -> Self::Out {
        // SAFETY: the GIL is held; valid pointers and sizes (see the impl).
        let obj = unsafe { ffi::PyBool_FromLong(i64::from(v) as _) };
        self.made(obj)
    }
    fn int(&mut self, v: i64) -> Self::Out {
        // SAFETY: the GIL is held; valid pointers and sizes (see the impl).
        let obj = unsafe { ffi::PyLong_FromLongLong(v) };
        self.made(obj)
    }
    fn uint(&mut self, v: u64) -> Self::Out {
        // SAFETY: the GIL is held; valid pointers and sizes (see the impl).
        let obj = unsafe { ffi::PyLong_FromUnsignedLongLong(v) };
        self.made(obj)
    }
    fn float(&mut self, v: f64) -> Self::Out {
        // SAFETY: the GIL is held; valid pointers and sizes (see the impl).
        let obj = unsafe { ffi::PyFloat_FromDouble(v) };
        self.made(obj)
    }
    fn text(&mut self, v: &[u8]) -> Self::Out {
        // SAFETY: the GIL is held; valid pointers and sizes (see the impl).
        let obj = unsafe {
            ffi::PyUnicode_DecodeUTF8(
                v.as_ptr().cast(),
                v.len() as ffi::Py_ssize_t,
                c"replace".as_ptr(),
            )
        };
        self.made(obj)
    }
    fn decimal(&mut self, text: &str) -> Self::Out {
        // `decimal.Decimal(text)`, exactly the value (as pyarrow's `to_pylist` gives it).
        static DECIMAL: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        let made = DECIMAL
            .get_or_try_init(self.py, || {
                Ok::<_, PyErr>(self.py.import("decimal")?.getattr("Decimal")?.unbind())
            })
            .and_then(|d| d.bind(self.py).call1((text,)));
        match made {
            Ok(obj) => obj.into_ptr(),
            Err(e) => {
                e.restore(self.py);
                self.made(std::ptr::null_mut())
            }
        }
    }
    fn bytes(&mut self, v: &[u8]) -> Self::Out {
        // SAFETY: the GIL is held; valid pointers and sizes (see the impl).
        let obj = unsafe { ffi::PyBytes_FromStringAndSize(v.as_ptr().cast(), v.len() as _) };
        self.made(obj)
    }
    fn list(&mut self, n: usize) -> Self::Out {
        // SAFETY: the GIL is held; valid pointers and sizes (see the impl).
        let obj = unsafe { ffi::PyList_New(n as ffi::Py_ssize_t) };
        self.made(obj)
    }
    fn item(&mut self, list: &mut Self::Out, i: usize, v: Self::Out) {
        // SAFETY: the GIL is held; valid pointers and sizes (see the impl).
        unsafe {
            if list.is_null() || v.is_null() {
                if !v.is_null() {
                    ffi::Py_DecRef(v);
                }
                return;
            }
            ffi::PyList_SetItem(*list, i as ffi::Py_ssize_t, v);
        }
    }
    fn record(&mut self, _: &Keys) -> Self::Out {
        // SAFETY: the GIL is held; valid pointers and sizes (see the impl).
        let obj = unsafe { ffi::PyDict_New() };
        self.made(obj)
    }
    fn field(&mut self, record: &mut Self::Out, keys: &Keys, i: usize, v: Self::Out) {
        // SAFETY: the GIL is held; valid pointers and sizes (see the impl).
        unsafe {
            if !record.is_null() && !v.is_null() {
                let names = self.keys.of(self.py, keys);
                if ffi::PyDict_SetItem(*record, names[i].as_ptr(), v) != 0 {
                    self.failed = true;
                }
            }
            if !v.is_null() {
                ffi::Py_DecRef(v);
            }
        }
    }
    fn map(&mut self, n: usize) -> Self::Out {
        self.list(n)
    }
    fn entry(&mut self, map: &mut Self::Out, i: usize, k: Self::Out, v: Self::Out) {
        // SAFETY: the GIL is held; valid pointers and sizes (see the impl).
        unsafe {
            let pair = ffi::PyTuple_New(2);
            if pair.is_null() || k.is_null() || v.is_null() {
                self.failed = true;
                for o in [pair, k, v] {
                    if !o.is_null() {
                        ffi::Py_DecRef(o);
                    }
                }
                return;
            }
            ffi::PyTuple_SetItem(pair, 0, k);
            ffi::PyTuple_SetItem(pair, 1, v);
            self.item(map, i, pair);
        }
    }
}

/// Nested rows of a batch ([`chute::core::NestedRows`]) as a Python list: built straight
/// from the Arrow arrays where the rows are a columnar source's, else from their values.
pub(crate) fn list_of_rows<'py>(
    py: Python<'py>,
    rows: &dyn chute::core::NestedRows,
) -> PyResult<Bound<'py, PyList>> {
    if let Some(arrow) = rows
        .as_any()
        .downcast_ref::<chute::formats::values::ArrowRows>()
    {
        let mut b = PyBuild {
            py,
            keys: KeyStrings::default(),
            failed: false,
        };
        // SAFETY: the GIL is held; the list is made at its size and each item stolen by it.
        unsafe {
            let out = Bound::from_owned_ptr_or_err(py, ffi::PyList_New(rows.len() as _))?;
            for i in 0..rows.len() {
                let item = arrow.build(i, &mut b).map_err(PyTypeError::new_err)?;
                if b.failed || item.is_null() {
                    if !item.is_null() {
                        ffi::Py_DecRef(item);
                    }
                    return Err(PyErr::take(py).unwrap_or_else(|| {
                        PyTypeError::new_err("a nested value could not be made")
                    }));
                }
                ffi::PyList_SetItem(out.as_ptr(), i as ffi::Py_ssize_t, item);
            }
            return Ok(out.cast_into_unchecked());
        }
    }
    let values = (0..rows.len())
        .map(|i| rows.value(i).map_err(PyTypeError::new_err))
        .collect::<PyResult<Vec<_>>>()?;
    list_of(py, &values)
}

/// A column of nested values as a Python list.
pub(crate) fn list_of<'py>(py: Python<'py>, values: &[Value]) -> PyResult<Bound<'py, PyList>> {
    let mut keys = KeyStrings::default();
    // SAFETY: the GIL is held; the list is made at its size and each item stolen by it.
    unsafe {
        let out = ffi::PyList_New(values.len() as ffi::Py_ssize_t);
        let out = Bound::from_owned_ptr_or_err(py, out)?;
        for (i, v) in values.iter().enumerate() {
            let item = Bound::from_owned_ptr_or_err(py, new_ref(py, v, &mut keys))?;
            ffi::PyList_SetItem(out.as_ptr(), i as ffi::Py_ssize_t, item.into_ptr());
        }
        Ok(out.cast_into_unchecked())
    }
}

/// A Python object built of lists, tuples, dicts (with `str` keys), `None`, `bool`, `int`,
/// `float`, `str`, `bytes` and numpy arrays as a nested value; `name` is the field it is, for errors.
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
    } else if v.hasattr("__array_interface__")? {
        // A numpy array (or scalar) inside a dict or list: an array value.
        Value::Array(crate::transform::array_from_py(v.py(), name, v)?)
    } else if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        Value::List(
            v.try_iter()?
                .map(|x| from_py_at(name, &x?, depth + 1))
                .collect::<PyResult<_>>()?,
        )
    } else {
        return Err(PyTypeError::new_err(format!(
            "field {name:?} holds a {}, which a nested value cannot (lists, dicts, None, bool, \
             int, float, str, bytes and numpy arrays)",
            v.get_type().name()?
        )));
    })
}
