//! Batch columns as numpy arrays made straight through numpy's C API: what
//! `numpy.asarray(tensor)` gives (the same dtype, shape, memory and flags, the `chute.Tensor`
//! the array's base), without building and parsing an `__array_interface__` dict for each
//! column: about half the cost of handing a column over, which a batch of many small
//! columns pays many times (the loader's `output="numpy"`, its default).
//!
//! The API is numpy's table of functions (`numpy._core.multiarray._ARRAY_API`, a capsule),
//! whose slots numpy keeps stable across versions: 2 `PyArray_Type`, 45
//! `PyArray_DescrFromType`, 94 `PyArray_NewFromDescr`, 282 `PyArray_SetBaseObject`. Where it
//! cannot be found, or numpy has no type for a column's dtype (bfloat16), the column goes
//! through `numpy.asarray` as before.

use std::ffi::{c_int, c_void};

use chute::DType;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyCapsule;

/// numpy's function table.
struct Api(*const *const c_void);

// SAFETY: the table is numpy's static, read-only array of function pointers, valid for the
// life of the process (numpy is never unloaded); it is only called with the GIL held.
unsafe impl Send for Api {}
// SAFETY: as above.
unsafe impl Sync for Api {}

/// The table and `numpy.asarray`, looked up once.
struct Numpy {
    api: Option<Api>,
    asarray: Py<PyAny>,
}

fn numpy(py: Python<'_>) -> Option<&'static Numpy> {
    static NUMPY: PyOnceLock<Option<Numpy>> = PyOnceLock::new();
    NUMPY
        .get_or_init(py, || {
            let asarray = py.import("numpy").ok()?.getattr("asarray").ok()?.unbind();
            let api = py
                .import("numpy._core.multiarray")
                .or_else(|_| py.import("numpy.core.multiarray"))
                .and_then(|m| m.getattr("_ARRAY_API"))
                .ok()
                .and_then(|c| {
                    let c = c.cast::<PyCapsule>().ok()?;
                    let p = c.pointer_checked(None).ok()?;
                    Some(Api(p.as_ptr() as *const *const c_void))
                });
            Some(Numpy { api, asarray })
        })
        .as_ref()
}

/// How a batch's tensor columns are handed over, told by the loader's `output` function.
pub(crate) enum Handover<'py> {
    /// `numpy.asarray`: the array made here.
    Numpy,
    /// `torch.from_dlpack`: `torch.from_numpy` of the array made here (about half the cost of
    /// a DLPack capsule a column; the same tensor: shared memory, the dtype, writable), this
    /// being `torch.from_numpy`; DLPack for what it does not take.
    Torch(Bound<'py, PyAny>),
    /// Anything else: called with the `chute.Tensor`.
    Call,
}

impl<'py> Handover<'py> {
    /// The handover for the loader's `output` function `f`.
    pub(crate) fn of(py: Python<'py>, f: &Bound<'py, PyAny>) -> Handover<'py> {
        if numpy(py).is_none() {
            return Handover::Call;
        }
        if numpy(py).is_some_and(|n| f.is(n.asarray.bind(py))) {
            return Handover::Numpy;
        }
        let torch = py
            .import("sys")
            .and_then(|sys| sys.getattr("modules"))
            .and_then(|m| m.get_item("torch"))
            .ok();
        if let Some(torch) = torch
            && let Ok(from_dlpack) = torch.getattr("from_dlpack")
            && f.is(&from_dlpack)
            && let Ok(from_numpy) = torch.getattr("from_numpy")
        {
            return Handover::Torch(from_numpy);
        }
        Handover::Call
    }
}

/// numpy's type number for `dtype` (on LP64 Linux, where int64 is C `long`, as numpy's
/// `int64` is there).
fn type_number(dtype: DType) -> Option<c_int> {
    Some(match dtype {
        DType::Bool => 0,
        DType::I8 => 1,
        DType::U8 => 2,
        DType::I16 => 3,
        DType::U16 => 4,
        DType::I32 => 5,
        DType::U32 => 6,
        DType::I64 if cfg!(target_pointer_width = "64") && !cfg!(windows) => 7,
        DType::U64 if cfg!(target_pointer_width = "64") && !cfg!(windows) => 8,
        DType::F32 => 11,
        DType::F64 => 12,
        DType::F16 => 23,
        _ => return None,
    })
}

/// `NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | NPY_ARRAY_WRITEABLE` (`NPY_ARRAY_CARRAY`).
const CARRAY: c_int = 0x1 | 0x100 | 0x400;

type DescrFromType = unsafe extern "C" fn(c_int) -> *mut ffi::PyObject;
type NewFromDescr = unsafe extern "C" fn(
    *mut ffi::PyTypeObject,
    *mut ffi::PyObject,
    c_int,
    *const isize,
    *const isize,
    *mut c_void,
    c_int,
    *mut ffi::PyObject,
) -> *mut ffi::PyObject;
type SetBaseObject = unsafe extern "C" fn(*mut ffi::PyObject, *mut ffi::PyObject) -> c_int;

/// A writable, C-contiguous numpy array over `t`'s memory whose base is `base` (the
/// `chute.Tensor` holding `t`, which keeps the memory alive); `None` where numpy's API or a
/// type for the dtype is missing.
pub(crate) fn of<'py>(
    py: Python<'py>,
    t: &chute::Tensor,
    base: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let (Some(Numpy { api: Some(api), .. }), Some(typenum)) = (numpy(py), type_number(t.dtype()))
    else {
        return Ok(None);
    };
    let dims: Vec<isize> = t.shape().iter().map(|&d| d as isize).collect();
    // SAFETY: the slots hold the functions of numpy's C API with these signatures (see the
    // module docs); the GIL is held. `PyArray_DescrFromType` gives a new reference that
    // `PyArray_NewFromDescr` steals; the data pointer is valid for `dims` elements of the
    // dtype, C-contiguous and 64-byte aligned, for as long as `base` lives, and
    // `PyArray_SetBaseObject` makes the array hold `base` (stealing the reference given).
    unsafe {
        let slot = |i: usize| *api.0.add(i);
        let array_type = slot(2) as *mut ffi::PyTypeObject;
        let descr_from_type: DescrFromType = std::mem::transmute(slot(45));
        let new_from_descr: NewFromDescr = std::mem::transmute(slot(94));
        let set_base: SetBaseObject = std::mem::transmute(slot(282));
        let descr = descr_from_type(typenum);
        if descr.is_null() {
            return Err(PyErr::fetch(py));
        }
        let array = new_from_descr(
            array_type,
            descr,
            dims.len() as c_int,
            dims.as_ptr(),
            std::ptr::null(),
            t.data_ptr() as *mut c_void,
            CARRAY,
            std::ptr::null_mut(),
        );
        let array = Bound::from_owned_ptr_or_err(py, array)?;
        if set_base(array.as_ptr(), base.clone().into_ptr()) < 0 {
            return Err(PyErr::fetch(py));
        }
        Ok(Some(array))
    }
}
