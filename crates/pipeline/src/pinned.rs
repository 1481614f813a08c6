//! Page-locked ("pinned") host memory through the CUDA runtime, loaded at run time.
//!
//! Nothing CUDA is needed to build chute: `libcudart` is opened with `dlopen` when a loader
//! asks for `pin_memory`. Buffers from `cudaHostAlloc` let the GPU copy a batch with DMA
//! (`tensor.to(device, non_blocking=True)` overlaps with compute) instead of staging it
//! through a pinned bounce buffer. Without a CUDA runtime the loader uses ordinary memory
//! and says so once.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

use chute_core::Allocator;

type HostAlloc = unsafe extern "C" fn(*mut *mut c_void, usize, u32) -> i32;
type FreeHost = unsafe extern "C" fn(*mut c_void) -> i32;

/// `cudaHostAllocPortable`: the memory is pinned for every CUDA context, not just the
/// current one (workers allocate on their own threads).
const HOST_ALLOC_PORTABLE: u32 = 1;

/// The CUDA runtime's page-locked host allocator.
pub(crate) struct CudaHostAllocator {
    alloc: HostAlloc,
    free: FreeHost,
    _lib: libloading::Library,
}

// SAFETY: cudaHostAlloc returns page-aligned (>= 4096 > ALIGN) memory valid for `cap` bytes
// until cudaFreeHost; the CUDA runtime is thread-safe.
unsafe impl Allocator for CudaHostAllocator {
    fn allocate(&self, cap: usize) -> Option<NonNull<u8>> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the function has the documented signature.
        let status = unsafe { (self.alloc)(&mut ptr, cap, HOST_ALLOC_PORTABLE) };
        if status != 0 {
            return None;
        }
        NonNull::new(ptr.cast())
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, _cap: usize) {
        // SAFETY: ptr came from cudaHostAlloc (the trait's contract).
        unsafe { (self.free)(ptr.as_ptr().cast()) };
    }

    fn name(&self) -> &str {
        "cuda-pinned"
    }
}

/// Library names tried in order: `CHUTE_CUDART` (a path), then the runtime's sonames. A CUDA
/// runtime that PyTorch or JAX already loaded is found by its soname.
fn candidates() -> Vec<String> {
    let mut names = Vec::new();
    if let Ok(p) = std::env::var("CHUTE_CUDART") {
        names.push(p);
    }
    for v in ["", ".13", ".12", ".11.0"] {
        names.push(format!("libcudart.so{v}"));
    }
    names
}

fn load() -> Result<CudaHostAllocator, String> {
    let mut last = String::from("no candidate library");
    for name in candidates() {
        // SAFETY: loading the CUDA runtime runs its initialisers, which have no preconditions.
        let lib = match unsafe { libloading::Library::new(&name) } {
            Ok(lib) => lib,
            Err(e) => {
                last = format!("{name}: {e}");
                continue;
            }
        };
        // SAFETY: the symbols have these signatures in every CUDA runtime since 4.0.
        let found = unsafe {
            lib.get::<HostAlloc>(b"cudaHostAlloc\0")
                .map(|s| *s)
                .and_then(|a| lib.get::<FreeHost>(b"cudaFreeHost\0").map(|f| (a, *f)))
        };
        match found {
            Ok((alloc, free)) => {
                let allocator = CudaHostAllocator {
                    alloc,
                    free,
                    _lib: lib,
                };
                // A runtime without a driver or a device loads fine but cannot pin: probe.
                let probe = allocator.allocate(4096);
                return match probe {
                    Some(p) => {
                        // SAFETY: just allocated with this size.
                        unsafe { allocator.deallocate(p, 4096) };
                        Ok(allocator)
                    }
                    None => Err(format!(
                        "{name} loaded, but cudaHostAlloc failed (no GPU or driver?)"
                    )),
                };
            }
            Err(e) => last = format!("{name}: {e}"),
        }
    }
    Err(last)
}

/// The process's pinned allocator, or why there is none (looked up once per process).
pub(crate) fn cuda_host_allocator() -> Result<Arc<dyn Allocator>, String> {
    static ALLOCATOR: OnceLock<Result<Arc<dyn Allocator>, String>> = OnceLock::new();
    ALLOCATOR
        .get_or_init(|| load().map(|a| Arc::new(a) as Arc<dyn Allocator>))
        .clone()
}
