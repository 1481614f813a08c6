//! `chute._chute`: the extension module behind the `chute` Python package.
//!
//! A thin layer, as the style guide asks: each function converts its arguments, releases the
//! GIL, calls the Rust engine and maps errors in one place (`errors.rs`). The Python facade
//! (`python/chute/`) adds what is about Python conventions only (torchrun's environment,
//! DataLoader's `prefetch_factor`, the output framework).
//!
//! - `Loader` (`loader.rs`): iterates one epoch per `for`, yielding `dict[str, array]`;
//!   state, stats, epochs. Polls the engine with the GIL released and checks for Ctrl-C
//!   between polls; rebuilds its threads after `fork()`.
//! - `Tensor` (`tensor.rs`): one batch column, owning chute's pooled buffer, exposed
//!   without copies through `__array_interface__` (numpy) and `__dlpack__` (`dlpack.rs`);
//!   the loader's numpy output makes the same arrays through numpy's C API (`ndarray.rs`).
//! - `Source` (`source.rs`): an opened dataset (`dataset` for any format, `tokens`,
//!   `webdataset`, `tfrecord`, `parquet`; `arrow_table` for Arrow data in memory through the
//!   C stream interface); shards may be URLs.
//! - `set_remote_options`, `io_stats` (`remote.rs`): how URLs are read, and what it cost.
//! - `set_limits`, `limits` (`limits.rs`): bounds on sizes read from the data.
//! - `PyTransform` (`transform.rs`): a Python callable as a chute transform, run on
//!   the worker threads under the GIL.

use pyo3::prelude::*;

/// Freed large blocks (decoded columns, images) are kept for reuse: see `CachingAlloc`.
/// Rust allocations only: Python's and numpy's are not affected.
#[global_allocator]
static ALLOC: chute::core::alloc::CachingAlloc = chute::core::alloc::CachingAlloc;

mod dlpack;
mod errors;
mod limits;
mod loader;
mod map_dataset;
mod megatron;
mod mix;
mod ndarray;
mod process_workers;
mod remote;
mod source;
mod tensor;
mod transform;
mod values;

#[pymodule]
mod _chute {
    #[pymodule_export]
    use crate::limits::{limits, set_limits};
    #[pymodule_export]
    use crate::loader::Loader;
    #[pymodule_export]
    use crate::loader::{serve_metrics, shutdown};
    #[pymodule_export]
    use crate::map_dataset::collate_samples;
    #[pymodule_export]
    use crate::megatron::MegatronWriter;
    #[pymodule_export]
    use crate::mix::mix;
    #[pymodule_export]
    use crate::process_workers::{WorkerSockets, process_dataset, serve_worker};
    #[pymodule_export]
    use crate::remote::{io_stats, set_remote_options};
    #[pymodule_export]
    use crate::source::{
        Source, arrow, arrow_table, dataset, map_dataset, parquet, tfrecord, tokens, webdataset,
    };
    #[pymodule_export]
    use crate::tensor::Tensor;

    use pyo3::prelude::*;

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        // Values naming files (a manifest's paths and URLs) are read by chute's I/O layer.
        chute::read_files_with_io();
        m.add("__version__", env!("CARGO_PKG_VERSION"))
    }
}
