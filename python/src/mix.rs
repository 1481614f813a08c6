//! `mix`: a weighted mixture of sources (`chute::dataset::Mixture`) as a [`Source`].

use std::sync::Arc;

use chute::Shuffle;
use chute::dataset::{Component, MixMode, Mixture, Policy};
use pyo3::prelude::*;

use crate::errors;
use crate::source::Source;
use crate::transform::{self, Interrupt};

/// A weighted mixture of `components` (`(name, source, shuffle, seed, transforms)`, sources
/// made by this module, mixtures included) as one source. `schedule`: `(position, weights)`
/// points (the first at 0; `ramp` moves linearly between them). See `chute.mix` for the
/// options.
#[pyfunction]
#[pyo3(signature = (components, schedule, *, ramp=false, mode="stratified", policy=None,
                    samples_per_epoch=None, seed=None, source_column=None))]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
pub(crate) fn mix(
    py: Python<'_>,
    components: Vec<(
        String,
        Bound<'_, Source>,
        String,
        Option<u64>,
        Vec<Bound<'_, PyAny>>,
    )>,
    schedule: Vec<(u64, Vec<f64>)>,
    ramp: bool,
    mode: &str,
    policy: Option<&str>,
    samples_per_epoch: Option<u64>,
    seed: Option<u64>,
    source_column: Option<String>,
) -> PyResult<Source> {
    let interrupt = Arc::new(Interrupt::default());
    let mut parts = Vec::with_capacity(components.len());
    for (name, source, shuffle, comp_seed, specs) in components {
        let src = source.get();
        let mut c = match &src.mixture {
            Some(m) => Component::mixture(name, Arc::clone(m)),
            None => Component::new(name, Arc::clone(&src.inner)),
        };
        c = c.shuffle(shuffle.parse::<Shuffle>().map_err(errors::from_config)?);
        if let Some(s) = comp_seed {
            c = c.seed(s);
        }
        if let Some(t) = transform::build(specs, &interrupt)? {
            c = c.transform(t);
        }
        parts.push(c);
    }
    let mut b = Mixture::builder(parts)
        .schedule(schedule, ramp)
        .mode(mode.parse::<MixMode>().map_err(errors::from_config)?);
    if let Some(p) = policy {
        b = b.policy(p.parse::<Policy>().map_err(errors::from_config)?);
    }
    if let Some(n) = samples_per_epoch {
        b = b.samples_per_epoch(n);
    }
    if let Some(s) = seed {
        b = b.seed(s);
    }
    if let Some(c) = source_column {
        b = b.source_column(c);
    }
    let mixture = Arc::new(py.detach(|| b.build()).map_err(errors::from_config)?);
    Ok(Source::from_mixture(mixture, interrupt))
}
