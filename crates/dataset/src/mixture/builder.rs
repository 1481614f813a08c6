//! [`MixtureBuilder`]: a mixture's components, weights or schedule, mode, policy and seeds,
//! checked and turned into a [`Mixture`].

use std::fmt;
use std::sync::{Mutex, OnceLock, RwLock};

use chute_core::{ConfigError, Manifest, virtual_manifest};

use super::mode::{MIXTURE_FORMAT, MixMode, Policy};
use super::schedule::{
    MAX_COMPONENTS, MAX_SCHEDULE_EPOCHS, MAX_SEGMENT_WORK, MAX_SEGMENTS, first_epoch_end,
    normalize, segments,
};
use super::source::{Component, Ctx, GridCache, Mixture, RandomMemo};

/// Builds a [`Mixture`]: [`Mixture::builder`], the weights or a schedule, then
/// [`MixtureBuilder::build`].
pub struct MixtureBuilder {
    components: Vec<Component>,
    points: Vec<(u64, Vec<f64>)>,
    ramp: bool,
    mode: MixMode,
    policy: Option<Policy>,
    samples_per_epoch: Option<u64>,
    source_column: Option<String>,
    seed: Option<u64>,
}

impl fmt::Debug for MixtureBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MixtureBuilder")
            .field("components", &self.components)
            .field("points", &self.points)
            .finish()
    }
}

impl MixtureBuilder {
    /// Constant weights, one per component (normalized; need not sum to 1).
    pub fn weights(mut self, weights: Vec<f64>) -> Self {
        self.points = vec![(0, weights)];
        self
    }

    /// Weights by global sample position: `(position, weights)` points, the first at 0. Each
    /// holds until the next (or, with `ramp`, moves linearly towards it).
    pub fn schedule(mut self, points: Vec<(u64, Vec<f64>)>, ramp: bool) -> Self {
        self.points = points;
        self.ramp = ramp;
        self
    }

    /// `stratified` (default) or `random`.
    pub fn mode(mut self, mode: MixMode) -> Self {
        self.mode = mode;
        self
    }

    /// Where the epoch ends (default `stop_on_all`, or `cycle` with `samples_per_epoch`).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// The epoch's length in samples (policy `cycle`).
    pub fn samples_per_epoch(mut self, n: u64) -> Self {
        self.samples_per_epoch = Some(n);
        self
    }

    /// Adds an int64 column of this name holding each sample's component index.
    pub fn source_column(mut self, name: impl Into<String>) -> Self {
        self.source_column = Some(name.into());
        self
    }

    /// The mixture's own seed (default: the loader's), for `random` draws and the
    /// components' derived seeds.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Checks everything and builds the mixture.
    pub fn build(self) -> Result<Mixture, ConfigError> {
        let k = self.components.len();
        if k == 0 {
            return Err(ConfigError::new(
                "components",
                "a mixture needs at least one",
            ));
        }
        for (i, c) in self.components.iter().enumerate() {
            if c.name.is_empty() {
                return Err(ConfigError::new(
                    "components",
                    "a component has an empty name",
                ));
            }
            if self.components[..i].iter().any(|d| d.name == c.name) {
                return Err(ConfigError::new(
                    "components",
                    format!("two components are named {:?}", c.name),
                ));
            }
            if c.is_empty() {
                return Err(ConfigError::new(
                    "components",
                    format!("component {:?} has no samples", c.name),
                ));
            }
        }
        if k > MAX_COMPONENTS {
            return Err(ConfigError::new(
                "components",
                format!("{k} components; at most {MAX_COMPONENTS} (nest mixtures for more)"),
            ));
        }
        let names: Vec<&str> = self.components.iter().map(|c| c.name.as_str()).collect();
        let points = normalize(self.points, &names)?;
        if points.len() > MAX_SEGMENTS {
            return Err(ConfigError::new(
                "weights",
                format!("{} schedule points; at most {MAX_SEGMENTS}", points.len()),
            ));
        }
        let segments = segments(&points, self.ramp);
        if segments.len() * k > MAX_SEGMENT_WORK {
            return Err(ConfigError::new(
                "weights",
                format!(
                    "{} constant-weight segments (ramps count 64 each) of {k} components is more \
                     than {MAX_SEGMENT_WORK} segment-components; use fewer points or ramps",
                    segments.len()
                ),
            ));
        }
        let policy = match (self.policy, self.samples_per_epoch) {
            (None, Some(_)) | (Some(Policy::Cycle), Some(_)) => Policy::Cycle,
            (None, None) => Policy::StopOnAll,
            (Some(Policy::Cycle), None) => {
                return Err(ConfigError::new(
                    "samples_per_epoch",
                    "policy cycle needs samples_per_epoch (the epoch's length in samples)",
                ));
            }
            (Some(p), None) => p,
            (Some(p), Some(_)) => {
                return Err(ConfigError::new(
                    "samples_per_epoch",
                    format!(
                        "policy {p} sets the epoch's length itself; give samples_per_epoch \
                         with policy cycle"
                    ),
                ));
            }
        };
        let epoch_len = match policy {
            Policy::Cycle => self.samples_per_epoch.unwrap_or(0),
            Policy::StopOnFirst | Policy::StopOnAll => {
                let ends = self
                    .components
                    .iter()
                    .enumerate()
                    .filter_map(|(c, comp)| first_epoch_end(&segments, c, comp.len()));
                let end = if policy == Policy::StopOnFirst {
                    ends.min()
                } else {
                    ends.max()
                };
                end.ok_or_else(|| {
                    ConfigError::new("weights", "every component's weight is zero throughout")
                })?
            }
        };
        if epoch_len == 0 {
            return Err(ConfigError::new(
                "samples_per_epoch",
                "the mixture's epoch would be empty; pass at least 1",
            ));
        }
        let last = segments.last().expect("segments").start;
        if last / epoch_len > MAX_SCHEDULE_EPOCHS {
            return Err(ConfigError::new(
                "weights",
                format!(
                    "the schedule's last point, at sample {last}, is more than \
                     {MAX_SCHEDULE_EPOCHS} epochs of {epoch_len} samples away"
                ),
            ));
        }
        let definition = serde_json::json!({
            "mode": self.mode.to_string(),
            "policy": policy.to_string(),
            "samples_per_epoch": epoch_len,
            "components": self.components.iter()
                .map(|c| (c.name.clone(), serde_json::Value::from(c.fingerprint())))
                .collect::<serde_json::Map<_, _>>(),
            "weights": points.iter().map(|(p, w)| serde_json::json!([p, w])).collect::<Vec<_>>(),
            "ramp": self.ramp,
            "shuffle": self.components.iter()
                .map(|c| (c.name.clone(), serde_json::Value::from(c.shuffle.to_string())))
                .collect::<serde_json::Map<_, _>>(),
            "seeds": serde_json::json!({
                "mixture": self.seed,
                "components": self.components.iter()
                    .map(|c| (c.name.clone(), serde_json::Value::from(c.seed)))
                    .collect::<serde_json::Map<_, _>>(),
            }),
            "transforms": self.components.iter()
                .map(|c| (c.name.clone(),
                          serde_json::Value::from(c.transform.as_ref().map(|t| t.name().to_string()))))
                .collect::<serde_json::Map<_, _>>(),
            "source_column": self.source_column,
        });
        let manifest = Manifest::new(
            MIXTURE_FORMAT,
            virtual_manifest(MIXTURE_FORMAT, epoch_len).shards,
        )
        .with_param("mixture", definition);
        Ok(Mixture {
            components: self.components,
            points,
            ramp: self.ramp,
            segments,
            mode: self.mode,
            policy,
            epoch_len,
            source_column: self.source_column,
            seed: self.seed,
            manifest,
            ctx: RwLock::new(Ctx::default()),
            memo: Mutex::new(RandomMemo::default()),
            fields: OnceLock::new(),
            no_columnar: std::sync::atomic::AtomicBool::new(false),
            grid: Mutex::new(GridCache::default()),
            epoch_starts: Mutex::new((0, Vec::new())),
        })
    }
}

impl Mixture {
    /// A builder over `components` (then `weights` or `schedule`, and `build`).
    pub fn builder(components: Vec<Component>) -> MixtureBuilder {
        MixtureBuilder {
            components,
            points: Vec::new(),
            ramp: false,
            mode: MixMode::Stratified,
            policy: None,
            samples_per_epoch: None,
            source_column: None,
            seed: None,
        }
    }
}
