//! [`Tensor`]: a dtype, a shape and a 64-byte-aligned pooled buffer, C-contiguous.

use std::fmt;

use crate::buffer::{AlignedBuf, PooledBuf};
use crate::dtype::{DType, Element};

/// A C-contiguous n-dimensional array in a 64-byte-aligned buffer. Batch columns are tensors
/// of shape `[B, ...]`; the buffer returns to the loader's pool when the tensor is dropped.
pub struct Tensor {
    dtype: DType,
    shape: Vec<usize>,
    buf: PooledBuf,
}

impl Tensor {
    /// A tensor over `buf`, whose length must be `product(shape) * dtype.size()`.
    ///
    /// # Panics
    /// If the buffer length disagrees with the shape.
    pub fn new(dtype: DType, shape: Vec<usize>, buf: PooledBuf) -> Self {
        let want = shape.iter().product::<usize>() * dtype.size();
        assert_eq!(
            buf.len(),
            want,
            "buffer of {} bytes for {dtype} {shape:?}",
            buf.len()
        );
        Tensor { dtype, shape, buf }
    }

    /// A zeroed tensor outside any pool.
    pub fn zeros(dtype: DType, shape: Vec<usize>) -> Self {
        let len = shape.iter().product::<usize>() * dtype.size();
        Tensor::new(dtype, shape, PooledBuf::unpooled(AlignedBuf::zeroed(len)))
    }

    /// A tensor holding a copy of `values` with `shape`.
    ///
    /// # Panics
    /// If `values.len()` is not the product of `shape`.
    pub fn from_slice<T: Element>(values: &[T], shape: Vec<usize>) -> Self {
        let mut t = Tensor::zeros(T::DTYPE, shape);
        t.as_mut_slice::<T>().copy_from_slice(values);
        t
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape (`[B, ...]` for a batch column).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The raw little-endian bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.as_slice()
    }

    /// The raw bytes, mutably.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        self.buf.as_mut_slice()
    }

    /// Address of the data (64-byte aligned): what numpy and DLPack consumers point at.
    pub fn data_ptr(&self) -> *const u8 {
        self.buf.as_ptr()
    }

    /// Typed view; `None` if `T` is not this tensor's dtype.
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        (T::DTYPE == self.dtype).then(|| {
            // SAFETY: the buffer is 64-byte aligned, holds numel * size_of::<T>() initialised
            // bytes, and T is plain old data (Element's contract).
            unsafe { std::slice::from_raw_parts(self.buf.as_ptr().cast::<T>(), self.numel()) }
        })
    }

    /// Typed mutable view.
    ///
    /// # Panics
    /// If `T` is not this tensor's dtype.
    pub fn as_mut_slice<T: Element>(&mut self) -> &mut [T] {
        assert_eq!(T::DTYPE, self.dtype, "typed view of the wrong dtype");
        let n = self.numel();
        let bytes = self.buf.as_mut_slice();
        // SAFETY: as in as_slice, and we hold the only reference.
        unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<T>(), n) }
    }

    /// Splits into parts (for bindings that hand the buffer to another owner).
    pub fn into_parts(self) -> (DType, Vec<usize>, PooledBuf) {
        (self.dtype, self.shape, self.buf)
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .finish()
    }
}
