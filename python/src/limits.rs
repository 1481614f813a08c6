//! The limits on sizes read from the data: `chute.set_limits`, `chute.limits`.

use chute::core::Limits;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors;

/// Sets the limits on what a size read from the data may make chute allocate, for this
/// process (as PIL's `Image.MAX_IMAGE_PIXELS`); sources opened and transforms built from now
/// on check against them. Limits left as `None` keep their value. A size over a limit is a
/// data error naming the sample, the size and the limit (skipped under `on_error="skip"`).
#[pyfunction]
#[pyo3(signature = (*, max_image_pixels=None, max_record_bytes=None, max_decoded_bytes=None,
                    max_features=None, max_text_bytes=None))]
pub(crate) fn set_limits(
    max_image_pixels: Option<u64>,
    max_record_bytes: Option<u64>,
    max_decoded_bytes: Option<u64>,
    max_features: Option<u64>,
    max_text_bytes: Option<u64>,
) -> PyResult<()> {
    let given = [
        max_image_pixels,
        max_record_bytes,
        max_decoded_bytes,
        max_features,
        max_text_bytes,
    ];
    let mut l = Limits::current();
    for (name, value) in Limits::NAMES.into_iter().zip(given) {
        if let Some(v) = value {
            l = l.with(name, v).map_err(errors::from_config)?;
        }
    }
    l.install();
    Ok(())
}

/// The limits in force: `max_image_pixels`, `max_record_bytes`, `max_decoded_bytes`,
/// `max_features`, `max_text_bytes`.
#[pyfunction]
pub(crate) fn limits(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    for (name, value) in Limits::current().pairs() {
        d.set_item(name, value)?;
    }
    Ok(d)
}
