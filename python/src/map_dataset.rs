//! [`MapDataset`]: any map-style Python dataset (`__len__` and `__getitem__`: a
//! `torch.utils.data.Dataset`, a list, a numpy array, ...) as a chute [`Source`], read on the
//! engine's worker threads.
//!
//! Indices come from chute's plan, so order, rank split, resume and skipping are the engine's.
//! `__getitem__` runs with the GIL held; what it does without the GIL (PIL decoding, numpy,
//! torch ops, file reads) runs in parallel across the workers.
//!
//! Collation follows `torch.utils.data.default_collate`: the first sample read fixes the
//! structure (nested dicts and other mappings, tuples, lists and namedtuples), and every leaf
//! becomes one batch column: numpy arrays, numpy scalars and torch tensors stacked
//! (`[B, ...]`), Python `int` as int64, `float` as float64, `bool` as bool, `str` / `bytes` /
//! `None` as lists. Array leaves are copied while the GIL is held (so a dataset may reuse its
//! buffers), then collated into the engine's pooled buffers; the Python facade
//! rebuilds the structure from [`MapDataset::structure`]. Sample 0 fixes the structure (read
//! when the source is made, so it is the same for any order and number of workers); a sample
//! whose structure differs (a missing key, another length, another kind of leaf) is a
//! `TypeError` naming its index and the path inside it, as default_collate refuses it.

use std::sync::Arc;

use bytes::Bytes;
use chute::core::npy::dtype_from_descr;
use chute::core::{
    Array, BoxError, BufferPool, Column, Error, Field, FieldName, Manifest, Opaque, Sample,
    SampleRef, virtual_manifest,
};
use chute::{DType, Source};
use pyo3::exceptions::{PyException, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyFloat, PyInt, PyList, PyString, PyTuple};

use crate::transform::{Interrupt, SHUTTING_DOWN, on_worker};

/// What a leaf of the sample structure is, and so how its column is collated and rebuilt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leaf {
    /// A numpy array or scalar (`torch: false`) or a torch tensor: stacked.
    Array { torch: bool },
    /// Python `int`: int64.
    Int,
    /// Python `float`: float64.
    Float,
    /// Python `bool`.
    Bool,
    /// `str`: a list of `str`.
    Str,
    /// `bytes` / `bytearray`: a list of `bytes`.
    Bytes,
    /// `None`: a list of `None`.
    Null,
}

impl Leaf {
    fn name(self) -> &'static str {
        match self {
            Leaf::Array { torch: true } => "tensor",
            Leaf::Array { torch: false } => "array",
            Leaf::Int => "int",
            Leaf::Float => "float",
            Leaf::Bool => "bool",
            Leaf::Str => "str",
            Leaf::Bytes => "bytes",
            Leaf::Null => "None",
        }
    }
}

/// The structure of a sample, fixed by the first one read.
#[derive(Debug)]
enum Node {
    /// A mapping: its keys in the first sample's order, each key's column-name part and the
    /// path to it (`meta/label`), and its node.
    Map(Vec<(Py<PyAny>, String, String, Node)>),
    /// A tuple, list or namedtuple of this many items: the path to each, and its node.
    Seq(Vec<(String, Node)>),
    /// A leaf: its column (interned: naming each sample's field costs no allocation) and
    /// kind.
    Leaf(FieldName, Leaf),
}

/// The structure with its Python description (for the facade, which rebuilds batches).
#[derive(Debug)]
struct Schema {
    root: Node,
    /// `("map", type, [(key, node)...])`, `("seq", type, [node...])` or
    /// `("leaf", column, kind)`; `type` is the container's class (dict, list, a namedtuple...).
    tree: Py<PyAny>,
}

/// A map-style Python dataset as a [`Source`].
pub(crate) struct MapDataset {
    dataset: Py<PyAny>,
    manifest: Manifest,
    /// The structure, from sample 0 (none for an empty dataset).
    schema: Option<Schema>,
    /// `KeyboardInterrupt` raised inside `__getitem__`, for the loader to raise.
    pub(crate) interrupt: Arc<Interrupt>,
    /// DataLoader's `worker_init_fn(worker_id)`, called on each worker thread before its
    /// first sample, and the number of workers the ids count.
    worker_init: Option<(Py<PyAny>, usize)>,
    /// DataLoader's `collate_fn(samples)`: when set, a batch is the list of the samples
    /// `__getitem__` returned, as they are, passed to it on the worker thread; its result is
    /// the batch ([`Column::Object`]).
    collate_fn: Option<Py<PyAny>>,
    /// Threads that have started, to number them.
    started: std::sync::atomic::AtomicUsize,
    /// Unique in the process, so a thread tells datasets apart even after one is freed.
    id: u64,
}

/// Numbers every [`MapDataset`] made in the process.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

thread_local! {
    /// The datasets (by id) whose `worker_init_fn` this thread has run.
    static INITIALIZED: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl std::fmt::Debug for MapDataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapDataset")
            .field("format", &self.manifest.format)
            .field("samples", &self.manifest.total_samples())
            .finish()
    }
}

impl MapDataset {
    /// Wraps `dataset`; its type's qualified name and its length make the fingerprint.
    pub(crate) fn new(
        dataset: &Bound<'_, PyAny>,
        worker_init: Option<(Py<PyAny>, usize)>,
        collate_fn: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let len = dataset.len().map_err(|_| {
            PyTypeError::new_err(format!(
                "chute.Loader takes a chute source or a map-style dataset (with __len__ and \
                 __getitem__); {} has no __len__",
                type_name(dataset)
            ))
        })?;
        if !dataset.hasattr("__getitem__")? {
            return Err(PyTypeError::new_err(format!(
                "{} has __len__ but no __getitem__: chute.Loader needs a map-style dataset",
                type_name(dataset)
            )));
        }
        let ty = dataset.get_type();
        let name = format!("{}.{}", ty.module()?, ty.qualname()?);
        // The structure comes from sample 0, read here once: the same whatever the order or
        // the number of workers (default_collate takes each batch's first sample). Samples
        // for a collate_fn of the user's are theirs to make sense of.
        let schema = match len {
            _ if collate_fn.is_some() => None,
            0 => None,
            _ => {
                let first = dataset.get_item(0)?;
                Some(discover(dataset.py(), &first)?)
            }
        };
        Ok(MapDataset {
            dataset: dataset.clone().unbind(),
            manifest: virtual_manifest(&name, len as u64),
            schema,
            interrupt: Arc::default(),
            worker_init,
            collate_fn,
            started: Default::default(),
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        })
    }

    /// The `collate_fn`, when the dataset has one.
    pub(crate) fn collate_fn(&self) -> Option<&Py<PyAny>> {
        self.collate_fn.as_ref()
    }

    /// The structure's description once a sample has been read (`None` before).
    pub(crate) fn structure(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.schema.as_ref().map(|s| s.tree.clone_ref(py))
    }

    /// Runs `worker_init_fn` once on this thread (the first read of this dataset on it).
    fn init_worker(&self, py: Python<'_>) -> PyResult<()> {
        let Some((f, workers)) = &self.worker_init else {
            return Ok(());
        };
        let me = self.id;
        if INITIALIZED.with(|d| d.borrow().contains(&me)) {
            return Ok(());
        }
        INITIALIZED.with(|d| d.borrow_mut().push(me));
        let n = self
            .started
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = f.call1(py, (n % (*workers).max(1),)) {
            // As in DataLoader, a failing worker_init_fn fails the loader, not one sample
            // (on_error="skip" must not carry on with an uninitialized worker).
            let msg = format!("worker_init_fn failed: {e}");
            self.interrupt.set(e);
            return Err(pyo3::exceptions::PyRuntimeError::new_err(msg));
        }
        Ok(())
    }

    /// Sample `id` as this dataset's fields (its structure flattened), the GIL held.
    pub(crate) fn sample(&self, py: Python<'_>, id: u64) -> PyResult<Sample> {
        self.init_worker(py)?;
        let item = self.dataset.bind(py).get_item(id)?;
        let Some(schema) = &self.schema else {
            return Err(PyTypeError::new_err(format!(
                "sample {id} of a dataset whose len() was 0"
            )));
        };
        let mut fields = Vec::new();
        flatten(py, &schema.root, &item, "", id, &mut fields)?;
        let mut s = Sample::new(id);
        s.fields = fields;
        Ok(s)
    }
}

impl Source for MapDataset {
    fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn read(&self, id: u64) -> Result<Sample, Error> {
        self.read_many(&[id]).pop().expect("one result per id")
    }

    /// Reads `ids` under one hold of the GIL (Python still hands it to other threads at its
    /// switch interval while `__getitem__` runs Python code).
    fn read_many(&self, ids: &[u64]) -> Vec<Result<Sample, Error>> {
        if SHUTTING_DOWN.load(std::sync::atomic::Ordering::Relaxed) {
            let msg = "the Python interpreter is shutting down";
            return ids.iter().map(|&id| Err(failed(id, msg.into()))).collect();
        }
        on_worker(|py| ids.iter().map(|&id| self.read_one(py, id)).collect())
    }

    /// With a `collate_fn`, the whole batch: its samples read and collated by it under one
    /// hold of the GIL, on this worker thread.
    fn collate(&self, ids: &[u64], _: &BufferPool) -> Option<Result<Vec<(String, Column)>, Error>> {
        let f = self.collate_fn.as_ref()?;
        if SHUTTING_DOWN.load(std::sync::atomic::Ordering::Relaxed) {
            return Some(Err(failed(
                ids[0],
                "the Python interpreter is shutting down".into(),
            )));
        }
        Some(on_worker(|py| {
            let samples = PyList::empty(py);
            for &id in ids {
                let item = self
                    .init_worker(py)
                    .and_then(|()| self.dataset.bind(py).get_item(id))
                    .map_err(|e| self.exception(py, id, e))?;
                samples
                    .append(item)
                    .map_err(|e| self.exception(py, id, e))?;
            }
            let batch = f
                .call1(py, (samples,))
                .map_err(|e| self.exception(py, ids[0], e))?;
            Ok(vec![(
                COLLATED.to_string(),
                Column::Object(Opaque(Arc::new(batch))),
            )])
        }))
    }
}

/// The column a `collate_fn`'s batch travels in.
pub(crate) const COLLATED: &str = "__collated__";

impl MapDataset {
    fn read_one(&self, py: Python<'_>, id: u64) -> Result<Sample, Error> {
        if self.interrupt.is_set() {
            return Err(failed(id, "interrupted".into()));
        }
        self.sample(py, id).map_err(|e| self.exception(py, id, e))
    }

    /// Sample `id`'s exception as an engine error: raised again as itself, or, for
    /// `KeyboardInterrupt` and other non-`Exception`s, kept for the loader to raise.
    fn exception(&self, py: Python<'_>, id: u64, e: PyErr) -> Error {
        if e.is_instance_of::<PyException>(py) {
            return failed(id, Box::new(e));
        }
        let msg = format!("interrupted by {}", e.get_type(py));
        self.interrupt.set(e);
        failed(id, msg.into())
    }
}

/// Sample `id` failed with `source` (an exception of `__getitem__`, raised again as itself).
pub(crate) fn failed(id: u64, source: BoxError) -> Error {
    Error::Transform {
        sample: SampleRef {
            index: id,
            key: String::new(),
            shard: String::new(),
        },
        source,
    }
}

fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type()
        .qualname()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// The path of `part` inside `path`, as a column name and in messages: `image`, `meta/label`,
/// `1/0`.
fn join(path: &str, part: &str) -> String {
    if path.is_empty() {
        part.to_string()
    } else {
        format!("{path}/{part}")
    }
}

/// The kind of leaf `v` is, or `None` for a container or an unsupported value.
fn leaf_kind(v: &Bound<'_, PyAny>) -> PyResult<Option<Leaf>> {
    let np = Numpy::get(v.py())?;
    Ok(Some(if v.get_type().is(np.ndarray.bind(v.py())) {
        Leaf::Array { torch: false }
    } else if v.is_none() {
        Leaf::Null
    } else if v.is_instance_of::<PyBool>() {
        Leaf::Bool
    } else if v.is_instance_of::<PyInt>() {
        Leaf::Int
    } else if v.is_instance_of::<PyFloat>() {
        Leaf::Float
    } else if v.is_instance_of::<PyString>() {
        Leaf::Str
    } else if v.is_instance_of::<PyBytes>() || v.is_instance_of::<PyByteArray>() {
        Leaf::Bytes
    } else if is_torch_tensor(v)? {
        Leaf::Array { torch: true }
    } else if v.hasattr("__array_interface__")? && v.hasattr("dtype")? {
        Leaf::Array { torch: false }
    } else {
        return Ok(None);
    }))
}

fn is_torch_tensor(v: &Bound<'_, PyAny>) -> PyResult<bool> {
    let ty = v.get_type();
    Ok(ty.module()?.to_string().starts_with("torch")
        && v.hasattr("numpy")?
        && v.hasattr("detach")?)
}

/// Learns the structure from the first sample read.
fn discover(py: Python<'_>, item: &Bound<'_, PyAny>) -> PyResult<Schema> {
    let mut columns = std::collections::HashSet::new();
    let (root, tree) = node(py, item, "", &mut columns).map_err(|e| {
        if e.is_instance_of::<PyTypeError>(py) {
            PyTypeError::new_err(format!(
                "sample 0 (which sets the batch structure): {}",
                e.value(py)
            ))
        } else {
            e
        }
    })?;
    Ok(Schema { root, tree })
}

fn node(
    py: Python<'_>,
    v: &Bound<'_, PyAny>,
    path: &str,
    columns: &mut std::collections::HashSet<String>,
) -> PyResult<(Node, Py<PyAny>)> {
    if let Some(kind) = leaf_kind(v)? {
        let column = if path.is_empty() {
            "data".to_string()
        } else {
            path.to_string()
        };
        if !columns.insert(column.clone()) {
            return Err(PyTypeError::new_err(format!(
                "two leaves of the sample are both named {column:?} (a key containing '/'?); \
                 rename one"
            )));
        }
        let tree = ("leaf", &column, kind.name())
            .into_pyobject(py)?
            .into_any()
            .unbind();
        return Ok((Node::Leaf(intern(&column), kind), tree));
    }
    let abc = py.import("collections.abc")?;
    if v.is_instance(&abc.getattr("Mapping")?)? {
        let mut entries = Vec::new();
        let described = PyList::empty(py);
        for key in v.try_iter()? {
            let key = key?;
            let part = if let Ok(s) = key.cast::<PyString>() {
                s.to_string()
            } else {
                key.str()?.to_string()
            };
            let child = v.get_item(&key)?;
            let full = join(path, &part);
            let (n, t) = node(py, &child, &full, columns)?;
            described.append((&key, t))?;
            entries.push((key.unbind(), part, full, n));
        }
        let tree = ("map", v.get_type(), described)
            .into_pyobject(py)?
            .into_any()
            .unbind();
        return Ok((Node::Map(entries), tree));
    }
    if v.is_instance_of::<PyTuple>() || v.is_instance_of::<PyList>() {
        let mut items = Vec::new();
        let described = PyList::empty(py);
        for (i, child) in v.try_iter()?.enumerate() {
            let full = join(path, &i.to_string());
            let (n, t) = node(py, &child?, &full, columns)?;
            described.append(t)?;
            items.push((full, n));
        }
        let tree = ("seq", v.get_type(), described)
            .into_pyobject(py)?
            .into_any()
            .unbind();
        return Ok((Node::Seq(items), tree));
    }
    Err(PyTypeError::new_err(format!(
        "{} holds a {}; default_collate batches tensors, numpy arrays, numbers, str, bytes, \
         None and dicts, tuples or lists of them",
        if path.is_empty() { "the sample" } else { path },
        type_name(v)
    )))
}

/// The fields of sample `v`, walking the structure of the first sample.
fn flatten(
    py: Python<'_>,
    node: &Node,
    v: &Bound<'_, PyAny>,
    path: &str,
    id: u64,
    out: &mut Vec<(FieldName, Field)>,
) -> PyResult<()> {
    let at = || {
        if path.is_empty() {
            format!("sample {id}")
        } else {
            format!("sample {id}, {path},")
        }
    };
    match node {
        Node::Map(entries) => {
            for (key, part, full, child) in entries {
                let value = v.get_item(key.bind(py)).map_err(|e| {
                    if !e.is_instance_of::<pyo3::exceptions::PyKeyError>(py) {
                        return e; // the mapping's own failure, raised as itself
                    }
                    PyTypeError::new_err(format!(
                        "{} has no key {part:?}, which sample 0 has (every sample must have the \
                         same structure)",
                        at()
                    ))
                })?;
                flatten(py, child, &value, full, id, out)?;
            }
            Ok(())
        }
        Node::Seq(items) => {
            let len = v.len().unwrap_or(usize::MAX);
            if v.is_instance_of::<PyString>() || len != items.len() {
                return Err(PyTypeError::new_err(format!(
                    "{} is a {} of length {}, but in sample 0 it has {} items \
                     (each element in a batch must be of equal size)",
                    at(),
                    type_name(v),
                    if len == usize::MAX {
                        "?".to_string()
                    } else {
                        len.to_string()
                    },
                    items.len()
                )));
            }
            for (i, (full, child)) in items.iter().enumerate() {
                flatten(py, child, &v.get_item(i)?, full, id, out)?;
            }
            Ok(())
        }
        Node::Leaf(column, kind) => {
            let got = leaf_kind(v)?;
            let field = match (kind, got) {
                (Leaf::Array { .. }, Some(Leaf::Array { .. })) => Field::Array(array(py, v, at)?),
                (Leaf::Int, Some(Leaf::Int)) => {
                    let x: i64 = v.extract().map_err(|_| {
                        PyTypeError::new_err(format!("{}: {} does not fit in int64", at(), v))
                    })?;
                    Field::Array(scalar(DType::I64, &x.to_le_bytes()))
                }
                (Leaf::Float, Some(Leaf::Float)) => {
                    Field::Array(scalar(DType::F64, &v.extract::<f64>()?.to_le_bytes()))
                }
                (Leaf::Bool, Some(Leaf::Bool)) => {
                    Field::Array(scalar(DType::Bool, &[u8::from(v.extract::<bool>()?)]))
                }
                (Leaf::Str, Some(Leaf::Str)) => Field::Text(Bytes::from(v.extract::<String>()?)),
                (Leaf::Bytes, Some(Leaf::Bytes)) => Field::Bytes(Bytes::from(
                    v.call_method0("__bytes__")
                        .or_else(|_| py.import("builtins")?.getattr("bytes")?.call1((v,)))?
                        .cast::<PyBytes>()?
                        .as_bytes()
                        .to_vec(),
                )),
                (Leaf::Null, Some(Leaf::Null)) => Field::Bytes(Bytes::new()),
                (want, got) => {
                    return Err(PyTypeError::new_err(format!(
                        "{} is {}, but in sample 0 it is {} (every sample must \
                         have the same structure)",
                        at(),
                        got.map_or_else(
                            || format!("a {}", type_name(v)),
                            |g| format!("a {}", g.name())
                        ),
                        want.name()
                    )));
                }
            };
            out.push((column.clone(), field));
            Ok(())
        }
    }
}

/// `name` as a field name that lives for the process, so that each sample's field names are
/// borrowed, not allocated; past 65,536 distinct names (samples with ever new keys), owned.
pub(crate) fn intern(name: &str) -> FieldName {
    static NAMES: std::sync::Mutex<Option<std::collections::HashSet<&'static str>>> =
        std::sync::Mutex::new(None);
    let mut guard = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    let names = guard.get_or_insert_with(Default::default);
    if let Some(&known) = names.get(name) {
        return FieldName::Borrowed(known);
    }
    if names.len() >= 1 << 16 {
        return FieldName::Owned(name.to_string());
    }
    let leaked: &'static str = Box::leak(name.to_string().into_boxed_str());
    names.insert(leaked);
    FieldName::Borrowed(leaked)
}

fn scalar(dtype: DType, bytes: &[u8]) -> Array {
    Array::new(dtype, vec![], Bytes::copy_from_slice(bytes))
}

/// numpy's functions and types a leaf needs, looked up once per process.
struct Numpy {
    ndarray: Py<PyAny>,
    asarray: Py<PyAny>,
    /// `{"order": "C"}`, the keyword arguments of `asarray`.
    c_order: Py<PyAny>,
}

impl Numpy {
    fn get(py: Python<'_>) -> PyResult<&'static Numpy> {
        static NUMPY: pyo3::sync::PyOnceLock<Numpy> = pyo3::sync::PyOnceLock::new();
        NUMPY.get_or_try_init(py, || {
            let np = py.import("numpy")?;
            let c_order = pyo3::types::PyDict::new(py);
            c_order.set_item("order", "C")?;
            Ok::<_, PyErr>(Numpy {
                ndarray: np.getattr("ndarray")?.unbind(),
                asarray: np.getattr("asarray")?.unbind(),
                c_order: c_order.into_any().unbind(),
            })
        })
    }
}

/// numpy's C-level array interface, what `__array_struct__`'s capsule points to (the array
/// interface protocol, version 3).
#[repr(C)]
struct PyArrayInterface {
    two: std::ffi::c_int,
    nd: std::ffi::c_int,
    typekind: std::ffi::c_char,
    itemsize: std::ffi::c_int,
    flags: std::ffi::c_int,
    shape: *const isize,
    strides: *const isize,
    data: *const std::ffi::c_void,
    descr: *mut std::ffi::c_void,
}

/// `PyArrayInterface::flags`: C-contiguous, and in the machine's byte order.
const NPY_C_CONTIGUOUS: std::ffi::c_int = 0x1;
const NPY_NOTSWAPPED: std::ffi::c_int = 0x200;

/// A C-contiguous native-order ndarray as an array field straight from its
/// `__array_struct__` (one capsule: much cheaper than `__array_interface__`'s dict); `None`
/// when it needs converting first.
fn plain_array(a: &Bound<'_, PyAny>) -> PyResult<Option<Array>> {
    let capsule = a.getattr(pyo3::intern!(a.py(), "__array_struct__"))?;
    let Ok(capsule) = capsule.cast::<pyo3::types::PyCapsule>() else {
        return Ok(None);
    };
    let Ok(ptr) = capsule.pointer_checked(None) else {
        return Ok(None);
    };
    // SAFETY: numpy's `__array_struct__` capsule points to a `PyArrayInterface` that lives
    // as long as the capsule, which we hold.
    let iface = unsafe { &*ptr.as_ptr().cast::<PyArrayInterface>() };
    let wanted = NPY_C_CONTIGUOUS | NPY_NOTSWAPPED;
    if iface.two != 2 || iface.nd < 0 || iface.flags & wanted != wanted {
        return Ok(None);
    }
    let dtype = match (iface.typekind as u8, iface.itemsize) {
        (b'b', 1) => DType::Bool,
        (b'u', 1) => DType::U8,
        (b'u', 2) => DType::U16,
        (b'u', 4) => DType::U32,
        (b'u', 8) => DType::U64,
        (b'i', 1) => DType::I8,
        (b'i', 2) => DType::I16,
        (b'i', 4) => DType::I32,
        (b'i', 8) => DType::I64,
        (b'f', 2) => DType::F16,
        (b'f', 4) => DType::F32,
        (b'f', 8) => DType::F64,
        // Kinds numpy has no letter for (bfloat16 from ml_dtypes): by the dtype's name.
        _ => {
            let descr: String = a.getattr("dtype")?.getattr("str")?.extract()?;
            match dtype_from_descr(&descr) {
                Ok(d) if d.size() == iface.itemsize as usize => d,
                _ => return Ok(None),
            }
        }
    };
    let nd = iface.nd as usize;
    let shape: Vec<usize> = (0..nd)
        // SAFETY: `shape` holds `nd` extents.
        .map(|i| unsafe { *iface.shape.add(i) }.max(0) as usize)
        .collect();
    let len = shape.iter().product::<usize>() * dtype.size();
    let bytes = match len {
        0 => Bytes::new(),
        // SAFETY: `data..data + len` is the C-contiguous buffer of `a`, alive (we hold a
        // reference) and not written by Python while we hold the GIL.
        _ => Bytes::copy_from_slice(unsafe {
            std::slice::from_raw_parts(iface.data.cast::<u8>(), len)
        }),
    };
    Ok(Some(Array::new(dtype, shape, bytes)))
}

/// A numpy array, numpy scalar or torch tensor leaf as an array field.
fn array(py: Python<'_>, v: &Bound<'_, PyAny>, at: impl Fn() -> String) -> PyResult<Array> {
    let np = Numpy::get(py)?;
    if v.get_type().is(np.ndarray.bind(py))
        && let Some(a) = plain_array(v)?
    {
        return Ok(a);
    }
    let v = if is_torch_tensor(v)? {
        let t = v.call_method0("detach")?.call_method0("cpu")?;
        if t.getattr("dtype")?.str()? == "torch.bfloat16" {
            // numpy has no bfloat16: its bits, as int16, then labelled bf16 again.
            let torch = py.import("torch")?;
            let bits = t
                .call_method0("contiguous")?
                .call_method1("view", (torch.getattr("int16")?,))?
                .call_method0("numpy")?;
            let mut a = array(py, &bits, at)?;
            a.dtype = DType::BF16;
            return Ok(a);
        }
        t.call_method0("numpy")?
    } else {
        v.clone()
    };
    // asarray(order="C"), not ascontiguousarray, which makes 0-d arrays (numpy scalars) 1-d;
    // a C-contiguous ndarray comes back as itself.
    let mut a = np.asarray.bind(py).call(
        (&v,),
        Some(np.c_order.bind(py).cast::<pyo3::types::PyDict>()?),
    )?;
    let mut dt = a.getattr("dtype")?;
    if dt.getattr("byteorder")?.extract::<String>()? == ">" {
        let little = dt.call_method1("newbyteorder", ("<",))?;
        a = a.call_method1("astype", (&little,))?;
        dt = little;
    }
    let descr: String = dt.getattr("str")?.extract()?;
    let Ok(dtype) = dtype_from_descr(&descr) else {
        return Err(PyTypeError::new_err(format!(
            "{} is an array of dtype {}, which chute cannot batch (numbers and bool only; \
             default_collate refuses strings and objects too)",
            at(),
            dt.str().map(|s| s.to_string()).unwrap_or_default()
        )));
    };
    match plain_array(&a)? {
        Some(array) => Ok(array),
        None => Err(PyTypeError::new_err(format!(
            "{}: numpy gave a {dtype} array that is not C-contiguous little-endian data",
            at()
        ))),
    }
}

/// `chute._chute.collate_samples(samples, pad=False, output=None)`: a list of samples collated
/// as the loader collates a Python dataset's (default_collate's structure, from the first
/// sample), for batches built outside the engine (an iterable dataset's). Returns the
/// columns as `{name: array}` (handed through `output`) and the structure to rebuild.
#[pyfunction]
#[pyo3(signature = (samples, pad=false, output=None))]
pub(crate) fn collate_samples<'py>(
    py: Python<'py>,
    samples: &Bound<'py, PyList>,
    pad: bool,
    output: Option<Py<PyAny>>,
) -> PyResult<(Bound<'py, pyo3::types::PyDict>, Py<PyAny>)> {
    let view = MapDataset::new(samples.as_any(), None, None)?;
    let items = (0..samples.len() as u64)
        .map(|i| view.sample(py, i))
        .collect::<PyResult<Vec<_>>>()?;
    let pool = BufferPool::new(0);
    let columns = py
        .detach(|| chute::pipeline::collate_samples(&items, &pool, pad))
        .map_err(crate::errors::to_py)?;
    let structure = view.structure(py).unwrap_or_else(|| py.None());
    Ok((
        crate::tensor::columns_to_dict(py, columns, output.as_ref())?,
        structure,
    ))
}
