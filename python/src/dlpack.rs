//! The DLPack C structures and the capsules that carry them, hand-written from `dlpack.h`
//! (v1.0 and later; the layouts below have not changed since) so that nothing is needed at
//! build time.
//!
//! Protocol (<https://dmlc.github.io/dlpack/latest/python_spec.html>): `__dlpack__` returns a
//! `PyCapsule` named `"dltensor"` holding a `DLManagedTensor*`, or, when the consumer passes
//! `max_version >= (1, 0)`, one named `"dltensor_versioned"` holding a
//! `DLManagedTensorVersioned*`. A consumer that takes ownership renames the capsule to
//! `"used_dltensor"` (`"used_dltensor_versioned"`) and later calls the managed tensor's
//! `deleter`; a capsule that was never consumed still has its original name when it is
//! destroyed, and its destructor calls the deleter itself.
//!
//! The managed tensor owns an `Arc` of the batch column ([`chute::Tensor`]), so the buffer
//! goes back to chute's pool when the consumer (torch, JAX, numpy) is done with it, on
//! whatever thread it drops it: the deleter never touches Python.

use std::ffi::{CStr, c_void};
use std::ptr::NonNull;
use std::sync::Arc;

use chute::DType;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// `kDLCPU`: chute's buffers are host memory (page-locked or not; consumers import both as
/// CPU tensors).
pub(crate) const KDL_CPU: i32 = 1;

/// `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// `DLTensor`: strides are in elements and always given (DLPack 1.2 requires them for
/// `ndim > 0`; older consumers accept them too).
#[repr(C)]
#[derive(Debug)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

/// `DLManagedTensor` (capsule `"dltensor"`).
#[repr(C)]
#[derive(Debug)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLPackVersion`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

/// `DLManagedTensorVersioned` (capsule `"dltensor_versioned"`).
#[repr(C)]
#[derive(Debug)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

// The layouts every consumer relies on (64-bit targets), checked at compile time.
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<DLDevice>() == 8);
    assert!(size_of::<DLDataType>() == 4);
    assert!(size_of::<DLTensor>() == 48);
    assert!(std::mem::offset_of!(DLTensor, shape) == 24);
    assert!(size_of::<DLManagedTensor>() == 64);
    assert!(std::mem::offset_of!(DLManagedTensor, deleter) == 56);
    assert!(size_of::<DLManagedTensorVersioned>() == 80);
    assert!(std::mem::offset_of!(DLManagedTensorVersioned, flags) == 24);
    assert!(std::mem::offset_of!(DLManagedTensorVersioned, dl_tensor) == 32);
};

/// The DLPack version this module produces.
const VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 0 };
/// `DLPACK_FLAG_BITMASK_IS_COPIED`.
const FLAG_IS_COPIED: u64 = 1 << 1;

const LEGACY_NAME: &CStr = c"dltensor";
const VERSIONED_NAME: &CStr = c"dltensor_versioned";

/// `(code, bits)` of a dtype (`kDLInt` 0, `kDLUInt` 1, `kDLFloat` 2, `kDLBfloat` 4,
/// `kDLBool` 6).
fn data_type(dtype: DType) -> PyResult<DLDataType> {
    let (code, bits) = match dtype {
        DType::Bool => (6, 8),
        DType::U8 => (1, 8),
        DType::I8 => (0, 8),
        DType::U16 => (1, 16),
        DType::I16 => (0, 16),
        DType::U32 => (1, 32),
        DType::I32 => (0, 32),
        DType::U64 => (1, 64),
        DType::I64 => (0, 64),
        DType::F16 => (2, 16),
        DType::BF16 => (4, 16),
        DType::F32 => (2, 32),
        DType::F64 => (2, 64),
        other => {
            return Err(PyBufferError::new_err(format!(
                "chute cannot export {other} through DLPack"
            )));
        }
    };
    Ok(DLDataType {
        code,
        bits,
        lanes: 1,
    })
}

/// What a capsule owns: the DLPack header (first, so a pointer to it is a pointer to the
/// whole), the shape and strides it points into, and the tensor that keeps the memory alive.
#[repr(C)]
struct Owned<H> {
    header: H,
    shape: Vec<i64>,
    strides: Vec<i64>,
    _tensor: Arc<chute::Tensor>,
}

/// Shape, C-contiguous strides (in elements) and the `DLTensor` viewing `tensor`. The
/// pointers in the `DLTensor` are filled in once the owner is boxed.
fn describe(tensor: &chute::Tensor) -> PyResult<(DLTensor, Vec<i64>, Vec<i64>)> {
    let shape: Vec<i64> = tensor.shape().iter().map(|&d| d as i64).collect();
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1].max(1);
    }
    let dl = DLTensor {
        data: tensor.data_ptr().cast_mut().cast(),
        device: DLDevice {
            device_type: KDL_CPU,
            device_id: 0,
        },
        ndim: i32::try_from(shape.len())
            .map_err(|_| PyBufferError::new_err("too many dimensions for DLPack"))?,
        dtype: data_type(tensor.dtype())?,
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    Ok((dl, shape, strides))
}

/// Boxes an owner and points its `DLTensor` at its own shape and strides (the vectors'
/// heap buffers do not move when the box is made).
fn boxed<H>(
    header: H,
    shape: Vec<i64>,
    strides: Vec<i64>,
    tensor: Arc<chute::Tensor>,
    dl_tensor: impl Fn(&mut H) -> &mut DLTensor,
) -> NonNull<Owned<H>> {
    let mut owned = Box::new(Owned {
        header,
        shape,
        strides,
        _tensor: tensor,
    });
    let (shape_ptr, strides_ptr) = (owned.shape.as_mut_ptr(), owned.strides.as_mut_ptr());
    let dl = dl_tensor(&mut owned.header);
    dl.shape = shape_ptr;
    dl.strides = strides_ptr;
    NonNull::from(Box::leak(owned))
}

unsafe extern "C" fn delete_legacy(m: *mut DLManagedTensor) {
    if !m.is_null() {
        // SAFETY: `m` is the header of an `Owned<DLManagedTensor>` leaked in `capsule`, and
        // the protocol calls the deleter once.
        drop(unsafe { Box::from_raw(m.cast::<Owned<DLManagedTensor>>()) });
    }
}

unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    if !m.is_null() {
        // SAFETY: as in `delete_legacy`, for the versioned owner.
        drop(unsafe { Box::from_raw(m.cast::<Owned<DLManagedTensorVersioned>>()) });
    }
}

/// Capsule destructor: frees the managed tensor only if no consumer took it (a consumer
/// renames the capsule, so the original name means "never consumed").
unsafe extern "C" fn destroy_legacy_capsule(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: called by Python with the capsule being destroyed; IsValid sets no exception.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, LEGACY_NAME.as_ptr()) == 1 {
            let m = pyo3::ffi::PyCapsule_GetPointer(capsule, LEGACY_NAME.as_ptr());
            delete_legacy(m.cast());
        }
    }
}

unsafe extern "C" fn destroy_versioned_capsule(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: as in `destroy_legacy_capsule`.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, VERSIONED_NAME.as_ptr()) == 1 {
            let m = pyo3::ffi::PyCapsule_GetPointer(capsule, VERSIONED_NAME.as_ptr());
            delete_versioned(m.cast());
        }
    }
}

/// A DLPack capsule viewing `tensor` (which it keeps alive): versioned when `versioned`,
/// flagged as a copy when `copied`.
pub(crate) fn capsule<'py>(
    py: Python<'py>,
    tensor: Arc<chute::Tensor>,
    versioned: bool,
    copied: bool,
) -> PyResult<Bound<'py, PyCapsule>> {
    let (dl_tensor, shape, strides) = describe(&tensor)?;
    if versioned {
        let header = DLManagedTensorVersioned {
            version: VERSION,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_versioned),
            flags: if copied { FLAG_IS_COPIED } else { 0 },
            dl_tensor,
        };
        let owned = boxed(header, shape, strides, tensor, |h| &mut h.dl_tensor);
        // SAFETY: `owned` is a leaked box whose first field is the header; the destructor
        // frees it unless a consumer took it (and then calls the deleter, which frees it).
        let made = unsafe {
            PyCapsule::new_with_pointer_and_destructor(
                py,
                owned.cast(),
                VERSIONED_NAME,
                Some(destroy_versioned_capsule),
            )
        };
        // SAFETY: no capsule owns `owned` when PyCapsule_New failed.
        made.inspect_err(|_| unsafe { delete_versioned(owned.as_ptr().cast()) })
    } else {
        let header = DLManagedTensor {
            dl_tensor,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_legacy),
        };
        let owned = boxed(header, shape, strides, tensor, |h| &mut h.dl_tensor);
        // SAFETY: as above, for the legacy layout.
        let made = unsafe {
            PyCapsule::new_with_pointer_and_destructor(
                py,
                owned.cast(),
                LEGACY_NAME,
                Some(destroy_legacy_capsule),
            )
        };
        // SAFETY: as above.
        made.inspect_err(|_| unsafe { delete_legacy(owned.as_ptr().cast()) })
    }
}
