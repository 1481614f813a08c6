//! [`Loader`]: the engine's `Loader` behind a Python iterator.
//!
//! Three things make it behave in Python:
//! - **GIL and Ctrl-C.** `__next__` polls the engine in 50 ms slices with the GIL released
//!   and runs Python's signal handlers between slices, so other Python threads run while it
//!   waits and Ctrl-C interrupts a blocked `next()` (nothing is consumed: the next call
//!   continues where it was). Everything that may stop worker threads (`set_epoch`,
//!   `load_state_dict`, `close`, dropping the loader) also releases the GIL, because a worker
//!   may be waiting for it inside a Python transform.
//! - **fork.** The engine's threads belong to the process that started them. The loader
//!   remembers its pid; the first call in another process (a `fork`ed child) calls
//!   `Loader::after_fork`, and the child starts its own threads at the same position.
//! - **Errors** go through `errors::to_py`; a `KeyboardInterrupt` raised inside a transform is
//!   raised by `__next__` (see `transform::Interrupt`).

use std::sync::Arc;
use std::time::Duration;

use chute::core::OnError;
use chute::pipeline::Poll;
use chute::{Batch, Shuffle, State};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use crate::errors;
use crate::source::Source;
use crate::tensor::columns_to_dict;
use crate::transform::{Interrupt, SHUTTING_DOWN};

/// How long `__next__` waits with the GIL released before it checks for Ctrl-C.
const POLL: Duration = Duration::from_millis(50);

/// The engine's loader as a Python iterator over one epoch (see the package docs for the
/// arguments; `chute.Loader` is the public face with DataLoader's conventions).
#[pyclass(module = "chute._chute", name = "Loader", weakref)]
pub(crate) struct Loader {
    /// `None` once closed.
    inner: Option<chute::Loader>,
    /// The process the loader last ran in.
    pid: u32,
    /// Applied to each `Tensor` column (`numpy.asarray`, `torch.from_dlpack`...); `None`
    /// yields the `Tensor` objects themselves.
    output: Option<Py<PyAny>>,
    interrupt: Arc<Interrupt>,
    /// DataLoader's `timeout`: the longest `next()` waits for a batch (`None`: for ever).
    timeout: Option<Duration>,
    /// The first native op spec among the transforms, for the doctor's decode rule.
    ops: Option<chute::ops::SampleOps>,
}

/// A non-negative integer option, or `chute.ConfigError` naming it.
fn count(option: &str, v: i64) -> PyResult<u64> {
    u64::try_from(v).map_err(|_| {
        errors::from_config(chute::ConfigError::new(
            option,
            format!("must be at least 0, got {v}"),
        ))
    })
}

impl Loader {
    /// The engine's loader, after the fork check; an error once closed.
    fn loader(&mut self) -> PyResult<&mut chute::Loader> {
        let loader = self
            .inner
            .as_mut()
            .ok_or_else(|| PyValueError::new_err("the loader is closed"))?;
        let pid = std::process::id();
        if pid != self.pid {
            loader.after_fork();
            self.pid = pid;
        }
        Ok(loader)
    }

    /// The batch as `{name: array}` (see [`columns_to_dict`]).
    fn to_dict<'py>(&self, py: Python<'py>, batch: Batch) -> PyResult<Bound<'py, PyDict>> {
        columns_to_dict(py, batch.columns, self.output.as_ref())
    }
}

#[pymethods]
impl Loader {
    #[new]
    #[pyo3(signature = (source, *, batch_size=1, shuffle="none", seed=0, num_workers=0,
                        prefetch=2, drop_last=false, pin_memory=false, rank=0, world_size=1,
                        epoch=0, transforms=None, on_error="raise", output=None, pad=false,
                        timeout=0.0, name=None, stats_window=10.0, autotune=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        source: &Bound<'_, Source>,
        batch_size: i64,
        shuffle: &str,
        seed: i128,
        num_workers: i64,
        prefetch: i64,
        drop_last: bool,
        pin_memory: bool,
        rank: i64,
        world_size: i64,
        epoch: i64,
        transforms: Option<Vec<Bound<'_, PyAny>>>,
        on_error: &str,
        output: Option<Py<PyAny>>,
        pad: bool,
        timeout: f64,
        name: Option<String>,
        stats_window: f64,
        autotune: Option<(i64, i64)>,
    ) -> PyResult<Self> {
        if !(stats_window > 0.0 && stats_window <= 86_400.0) {
            return Err(errors::from_config(chute::ConfigError::new(
                "stats_window",
                format!(
                    "{stats_window} seconds; it must be more than 0 and at most a day (the \
                     default is 10)"
                ),
            )));
        }
        if !(timeout >= 0.0 && timeout.is_finite()) {
            return Err(errors::from_config(chute::ConfigError::new(
                "timeout",
                format!("{timeout} seconds; pass 0 (wait for ever, the default) or more"),
            )));
        }
        let timeout = (timeout > 0.0).then(|| Duration::from_secs_f64(timeout));
        let seed = u64::try_from(seed).map_err(|_| {
            errors::from_config(chute::ConfigError::new(
                "seed",
                format!("must be in [0, 2**64), got {seed}"),
            ))
        })?;
        let shuffle: Shuffle = shuffle.parse().map_err(errors::from_config)?;
        let on_error: OnError = on_error.parse().map_err(errors::from_config)?;
        // A Python dataset parks its own KeyboardInterrupts where the loader looks for them.
        let interrupt = match (&source.get().dataset, &source.get().interrupt) {
            (Some(d), _) => Arc::clone(&d.interrupt),
            (None, Some(i)) => Arc::clone(i),
            (None, None) => Arc::new(Interrupt::default()),
        };
        let mut builder = chute::Loader::builder_arc(Arc::clone(&source.get().inner))
            .batch_size(count("batch_size", batch_size)? as usize)
            .shuffle(shuffle)
            .seed(seed)
            .num_workers(count("num_workers", num_workers)? as usize)
            .prefetch(count("prefetch", prefetch)? as usize)
            .drop_last(drop_last)
            .distributed(count("rank", rank)?, count("world_size", world_size)?)
            .epoch(count("epoch", epoch)?)
            .pin_memory(pin_memory)
            .on_error(on_error)
            .pad(pad)
            .stats_window(Duration::from_secs_f64(stats_window))
            .name(name.unwrap_or_default());
        if let Some((initial_workers, memory_budget)) = autotune {
            builder = builder.autotune(chute::Autotune {
                initial_workers: count("num_workers", initial_workers)? as usize,
                memory_budget: count("memory_budget", memory_budget)?,
            });
        }
        let transforms = transforms.unwrap_or_default();
        let ops = transforms
            .iter()
            .find_map(|t| t.extract::<String>().ok())
            .and_then(|spec| chute::ops::SampleOps::from_json(&spec).ok());
        // Each transform is a JSON op spec (str: native ops, no GIL) or (callable, takes_rng).
        if let Some(t) = crate::transform::build(transforms, &interrupt)? {
            builder = builder.transform_arc(t);
        }
        // Building may load the CUDA runtime (pin_memory): not under the GIL.
        let loader = py.detach(|| builder.build()).map_err(errors::from_config)?;
        Ok(Loader {
            inner: Some(loader),
            pid: std::process::id(),
            output,
            interrupt,
            timeout,
            ops,
        })
    }

    /// A new pass: the rest of the current epoch, or the next epoch when the last one's
    /// batches were all delivered (a consumer that took exactly `len(loader)` batches gets a
    /// full next epoch, not an empty one).
    fn __iter__(mut slf: PyRefMut<'_, Self>) -> PyResult<PyRefMut<'_, Self>> {
        slf.loader()?.begin_pass();
        Ok(slf)
    }

    /// The next batch of the epoch; `StopIteration` at its end. The loader stands at the start
    /// of the next epoch as soon as an epoch's last batch is delivered.
    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let timeout = self.timeout;
        let started = std::time::Instant::now();
        let loader = self.loader()?;
        let polled = loop {
            match py.detach(|| loader.next_timeout(POLL)) {
                Poll::Pending => {
                    py.check_signals()?;
                    if let Some(t) = timeout
                        && started.elapsed() >= t
                    {
                        return Err(pyo3::exceptions::PyTimeoutError::new_err(format!(
                            "no batch within timeout={} seconds (nothing was consumed: the \
                             next call waits for the same batch)",
                            t.as_secs_f64()
                        )));
                    }
                }
                Poll::Ready(r) => break r,
            }
        };
        if let Some(e) = self.interrupt.take() {
            return Err(e);
        }
        match polled {
            None => Ok(None),
            Some(Ok(batch)) => self.to_dict(py, batch).map(Some),
            Some(Err(e)) => Err(errors::to_py(e)),
        }
    }

    /// Batches per epoch on this rank.
    fn __len__(&mut self) -> PyResult<usize> {
        Ok(self.loader()?.len())
    }

    /// The current epoch.
    #[getter]
    fn epoch(&mut self) -> PyResult<u64> {
        Ok(self.loader()?.epoch())
    }

    /// Moves to the start of `epoch` (setting the current epoch keeps the position).
    fn set_epoch(&mut self, py: Python<'_>, epoch: i64) -> PyResult<()> {
        let epoch = count("epoch", epoch)?;
        let loader = self.loader()?;
        py.detach(|| loader.set_epoch(epoch));
        Ok(())
    }

    /// The position as of the last batch delivered, as a plain dict of the state's fields.
    fn state_dict<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let json = self.loader()?.state().to_json();
        py.import("json")?.call_method1("loads", (json,))
    }

    /// Continues from a `state_dict()` (or its JSON text): the next batch is the one after
    /// the state's last delivered batch.
    fn load_state_dict(&mut self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let text: String = match state.extract::<String>() {
            Ok(s) => s,
            Err(_) => {
                let kwargs = PyDict::new(py);
                // Integers that are not Python ints (numpy, 0-d tensors) as ints.
                kwargs.set_item("default", py.get_type::<pyo3::types::PyInt>())?;
                py.import("json")?
                    .call_method("dumps", (state,), Some(&kwargs))
                    .map_err(|e| {
                        errors::from_state(chute::StateError::Invalid(format!(
                            "not a chute state_dict: {e}"
                        )))
                    })?
                    .extract()?
            }
        };
        let state = State::from_json(&text).map_err(errors::from_state)?;
        let loader = self.loader()?;
        py.detach(|| loader.restore(&state))
            .map_err(errors::from_state)
    }

    /// The engine's figures since the loader was built, as a dict.
    fn stats<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let value = serde_json::to_value(self.loader()?.stats())
            .map_err(|e| errors::chute_error(e.to_string()))?;
        json_to_py(py, &value)
    }

    /// Runs the doctor on this loader's source, transforms and options (the loader itself is
    /// not advanced): each stage alone, the whole with a few worker counts, each batch handed
    /// to Python as `__next__` hands it. Returns the diagnosis as JSON text, with the report in
    /// plain words under `text`.
    #[pyo3(signature = (*, step_ms=None, target_samples_per_s=None, seconds=1.5, try_workers=None))]
    fn doctor(
        &mut self,
        py: Python<'_>,
        step_ms: Option<f64>,
        target_samples_per_s: Option<f64>,
        seconds: f64,
        try_workers: Option<Vec<usize>>,
    ) -> PyResult<String> {
        let duration = |name: &str, v: f64| {
            // Up to a day: more is a mistake, and Duration would overflow far beyond.
            if v > 0.0 && v <= 86_400.0 {
                Ok(Duration::from_secs_f64(v))
            } else {
                Err(errors::from_config(chute::ConfigError::new(
                    name,
                    format!("{v}; it must be more than 0 and at most a day"),
                )))
            }
        };
        let positive = |name: &str, v: f64| {
            if v > 0.0 && v.is_finite() {
                Ok(v)
            } else {
                Err(errors::from_config(chute::ConfigError::new(
                    name,
                    format!("{v}; it must be more than 0"),
                )))
            }
        };
        let options = chute::doctor::DoctorOptions {
            trial: duration("seconds", seconds)?,
            step: step_ms
                .map(|ms| duration("step_ms", ms / 1e3))
                .transpose()?,
            target_samples_per_sec: target_samples_per_s
                .map(|r| positive("target_samples_per_s", r))
                .transpose()?,
            workers: try_workers.unwrap_or_default(),
        };
        let output = self.output.as_ref().map(|o| o.clone_ref(py));
        let ops = self.ops.clone();
        let interrupt = Arc::clone(&self.interrupt);
        let loader = self.loader()?;
        let mut failed: Option<PyErr> = None;
        // Each batch as `__next__` hands it over; Ctrl-C (or a conversion error) stops the
        // doctor at the next batch.
        let mut crossing = |batch: Batch| {
            Python::attach(|py| {
                let result = py
                    .check_signals()
                    .and_then(|()| columns_to_dict(py, batch.columns, output.as_ref()).map(drop));
                match result {
                    Ok(()) => true,
                    Err(e) => {
                        failed.get_or_insert(e);
                        false
                    }
                }
            })
        };
        let context = chute::doctor::Context {
            ops: ops.as_ref(),
            opened_in: None,
        };
        let d =
            py.detach(|| chute::doctor::diagnose(loader, &options, context, Some(&mut crossing)));
        // An interrupt raised in a transform or a dataset, or in the hand-over, is raised as
        // itself, before the error it caused.
        if let Some(e) = interrupt.take() {
            return Err(e);
        }
        if let Some(e) = failed {
            return Err(e);
        }
        let d = d.map_err(errors::to_py)?;
        let mut json = serde_json::to_value(&d).map_err(|e| errors::chute_error(e.to_string()))?;
        json["text"] = d.to_text().into();
        Ok(json.to_string())
    }

    /// True when batch buffers are page-locked.
    #[getter]
    fn pinned(&mut self) -> PyResult<bool> {
        Ok(self.loader()?.pinned())
    }

    /// Why `pin_memory=True` fell back to ordinary memory, or `None`.
    #[getter]
    fn pin_memory_fallback(&mut self) -> PyResult<Option<String>> {
        Ok(self.loader()?.pin_memory_fallback().map(str::to_string))
    }

    /// The engine's options (`prefetch` is the ready-queue depth).
    #[getter]
    fn options<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let o = self.loader()?.options().clone();
        let d = PyDict::new(py);
        d.set_item("batch_size", o.batch_size)?;
        d.set_item("shuffle", o.shuffle.to_string())?;
        d.set_item("seed", o.seed)?;
        d.set_item("num_workers", o.num_workers)?;
        d.set_item("prefetch", o.prefetch)?;
        d.set_item("drop_last", o.drop_last)?;
        d.set_item("rank", o.rank)?;
        d.set_item("world_size", o.world_size)?;
        d.set_item("pin_memory", o.pin_memory)?;
        d.set_item("on_error", o.on_error.to_string())?;
        d.set_item("pad", o.pad)?;
        d.set_item("autotune", o.autotune.is_some())?;
        Ok(d)
    }

    /// True once `release()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_none()
    }

    /// Stops the worker threads and frees the buffers the loader holds (batches already
    /// delivered stay valid). Waits for transforms in progress to return.
    ///
    /// Not called `close`: this object is what `iter(loader)` returns, and `yield from`
    /// calls `close()` on its iterator when the generator is dropped.
    fn release(&mut self, py: Python<'_>) {
        if let Some(mut loader) = self.inner.take() {
            if std::process::id() != self.pid {
                loader.after_fork();
            }
            py.detach(move || drop(loader));
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        if let Some(mut loader) = self.inner.take() {
            if std::process::id() != self.pid {
                // The parent's threads do not exist here: joining them would hang.
                loader.after_fork();
            }
            // Workers may be waiting for the GIL inside a transform: let them finish.
            Python::attach(|py| py.detach(move || drop(loader)));
        }
    }
}

/// Called by the package's `atexit` hook: transforms stop calling into Python, which a
/// finalizing interpreter would not let other threads do.
#[pyfunction]
pub(crate) fn shutdown() {
    SHUTTING_DOWN.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Serves every live loader's metrics for Prometheus at `http://ADDRESS:PORT/metrics` on a
/// background thread for the rest of the process; returns the port (chosen when 0).
#[pyfunction]
#[pyo3(signature = (port=0, address="127.0.0.1"))]
pub(crate) fn serve_metrics(port: u16, address: &str) -> PyResult<u16> {
    let ip: std::net::IpAddr = address.parse().map_err(|_| {
        errors::from_config(chute::ConfigError::new(
            "address",
            format!("{address:?} is not an IP address (use 127.0.0.1, 0.0.0.0, ::1...)"),
        ))
    })?;
    chute::pipeline::metrics::serve(std::net::SocketAddr::new(ip, port))
        .map(|s| s.addr().port())
        .map_err(|e| pyo3::exceptions::PyOSError::new_err(e.to_string()))
}

/// A JSON value as the Python object `json.loads` would make, built directly (no text in
/// between: `stats()` is called every step).
pub(crate) fn json_to_py<'py>(
    py: Python<'py>,
    v: &serde_json::Value,
) -> PyResult<Bound<'py, PyAny>> {
    use pyo3::IntoPyObjectExt;
    use serde_json::Value;
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_bound_py_any(py)?,
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u.into_bound_py_any(py)?,
            (None, Some(i)) => i.into_bound_py_any(py)?,
            _ => n.as_f64().unwrap_or(f64::NAN).into_bound_py_any(py)?,
        },
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(a) => {
            let list = PyList::empty(py);
            for x in a {
                list.append(json_to_py(py, x)?)?;
            }
            list.into_any()
        }
        Value::Object(o) => {
            let d = PyDict::new(py);
            for (k, x) in o {
                d.set_item(k, json_to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}
