//! [`Source`]: what the engine reads samples from.

use std::collections::BTreeMap;

use crate::batch::Column;
use crate::buffer::BufferPool;
use crate::error::{ConfigError, Error};
use crate::iostats::IoSnapshot;
use crate::manifest::Manifest;
use crate::plan::{Plan, Shuffle};
use crate::sample::Sample;

/// A dataset with random access by global sample id.
///
/// Implementations are shared by all worker threads, so `read` takes `&self` and must be
/// cheap to call concurrently (pread or a memory map, never a shared cursor). A failed read
/// returns an error naming the shard, the byte offset and what was wrong.
pub trait Source: Send + Sync + 'static {
    /// The shards and their sample counts; global ids are `0..manifest().total_samples()`.
    fn manifest(&self) -> &Manifest;

    /// Reads sample `id`; `id` is always `< manifest().total_samples()`.
    fn read(&self, id: u64) -> Result<Sample, Error>;

    /// Reads the samples `ids`, in order: the engine reads a batch's samples through it, a
    /// few dozen at a time. One result per id, each standing for that id alone (a failed id
    /// does not fail the others). The default calls [`Source::read`] for each; a source whose
    /// calls share a cost (taking Python's GIL, a lock, a request) pays it once per call.
    fn read_many(&self, ids: &[u64]) -> Vec<Result<Sample, Error>> {
        ids.iter().map(|&id| self.read(id)).collect()
    }

    /// Called by the loader before each epoch (and each resumption) with the plan this rank
    /// will follow, before any `read`. A source streaming remote shards uses it to fetch them
    /// in this rank's order, ahead of the workers ([`Plan::shard_order`],
    /// [`Plan::shard_window`]). A hint: reads must work without it. The default does nothing.
    fn set_plan(&self, plan: &Plan) {
        let _ = plan;
    }

    /// Called once by a mixture (`chute_dataset::Mixture`) the source becomes a component
    /// of: the mixture keeps plans of several of the component's epochs and reads them interleaved (a
    /// component rolls over to its next epoch mid-batch), so a source whose samples depend on
    /// the epoch of the last [`Source::set_plan`] (a packed source's document order) must from
    /// now on give every epoch the same samples; the plans still order them anew. The default
    /// does nothing.
    fn keep_one_order(&self) {}

    /// The columnar fast path: collates the samples `ids` (in order) straight into batch
    /// columns from buffers in `pool`, without building a [`Sample`] per row. Returns `None`
    /// when the source has no such path (the default); the engine then reads sample by sample.
    /// Used only when the loader has no per-sample transforms. The columns must equal what
    /// collating `read(id)` for each id would give.
    fn collate(
        &self,
        ids: &[u64],
        pool: &BufferPool,
    ) -> Option<Result<Vec<(String, Column)>, Error>> {
        let _ = (ids, pool);
        None
    }

    /// Figures of the source's own (a mixture's samples per component), merged into the
    /// loader's `stats()` under `source`. `None` (the default) adds nothing.
    fn stats(&self) -> Option<serde_json::Value> {
        None
    }

    /// Metric families of the source's own (a mixture's samples per component and their
    /// target shares), served beside the loader's in the Prometheus exposition, each series
    /// labelled with the loader's labels too. Empty (the default) adds nothing.
    fn metrics(&self) -> Vec<MetricFamily> {
        Vec::new()
    }

    /// `Some` for a source that orders its own samples (its definition says how each of its
    /// parts is shuffled): the loader then keeps its plan in order, accepts `shuffle` only
    /// where it agrees with the source's own order, and refuses a contradiction with the
    /// message the [`OwnOrder`] gives. `None` (the default): the loader's shuffle orders it.
    fn own_order(&self) -> Option<OwnOrder> {
        None
    }

    /// A fingerprint of each part of the source's definition (for a mixture: `weights`,
    /// `components`, `seeds`, ...), kept in its loader's states so that a state of another
    /// definition is refused with the parts that differ named. `None` (the default) for a
    /// source whose manifest fingerprint says all.
    fn definition_parts(&self) -> Option<BTreeMap<String, String>> {
        None
    }

    /// What reading this source's remote shards has cost since it was opened (its opening
    /// included: the HEAD requests, index reads, cache hits): what its loaders report as
    /// their `remote` figures. `None` (the default) for a source that keeps no counters of
    /// its own; its loaders then report the process's remote reads since they were built.
    fn remote_io(&self) -> Option<IoSnapshot> {
        None
    }

    /// The source types of the columns whose batch dtype does not say all (timestamps, dates,
    /// durations, decimals, dictionaries, nested columns), in column order: what `inspect`
    /// shows, and how the Python package views a column of time counts as numpy's
    /// `datetime64` / `timedelta64`. Empty (the default) for a source with none.
    fn column_types(&self) -> Vec<ColumnType> {
        Vec::new()
    }
}

/// A column's type in its source, where the batch holds it as numbers of another type
/// ([`Source::column_types`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ColumnType {
    /// The column's name in a batch.
    pub name: String,
    /// Its type in the source: `timestamp[us, tz=UTC]`, `date32[day]`, `decimal128(10, 2)`,
    /// `dictionary<int32, string>`, `list<struct<role: string, content: string>>`.
    pub source: String,
    /// The numpy dtype whose values the batch's int64 counts are, where numpy has one:
    /// `datetime64[us]` (a timestamp of any zone: UTC instants), `datetime64[D]` (a date),
    /// `timedelta64[ms]` (a duration).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numpy: Option<String>,
    /// For a dictionary column read as codes, the source's dictionary: code `i` stands for
    /// value `i`.
    #[serde(skip)]
    pub dictionary: Option<Vec<crate::Value>>,
}

/// One metric family of a source's own (see [`Source::metrics`]), as Prometheus' text format
/// has it: a name, a type, a help text, and one value per label set.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricFamily {
    /// The name, Prometheus-style (`chute_..._total` for a counter).
    pub name: String,
    /// `counter` or `gauge`.
    pub kind: &'static str,
    /// What it measures, one line.
    pub help: String,
    /// Each series: its labels (name, value) and its value.
    pub series: Vec<(Vec<(String, String)>, f64)>,
}

/// How a source that orders its own samples orders them (see [`Source::own_order`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnOrder {
    /// The parts the source leaves in order (unshuffled); empty when it shuffles all of them.
    pub unshuffled: Vec<String>,
    /// What the user changes to shuffle or order the source itself, for error messages
    /// (e.g. "the mixture's shuffle (chute.mix(..., shuffle=...))").
    pub setting: String,
}

impl OwnOrder {
    /// The loader's plan shuffle for a loader asked for `shuffle`: [`Shuffle::None`] where
    /// the request agrees with the source's own order (off, or `global` when the source
    /// shuffles every part: DataLoader's `shuffle=True` habit), else an error naming the
    /// setting to change.
    pub fn plan_shuffle(&self, shuffle: Shuffle) -> Result<Shuffle, ConfigError> {
        match shuffle {
            Shuffle::None => Ok(Shuffle::None),
            Shuffle::Global if self.unshuffled.is_empty() => Ok(Shuffle::None),
            Shuffle::Global => Err(ConfigError::new(
                "shuffle",
                format!(
                    "global asks for shuffled samples, but this source orders its own and keeps \
                     {} in order: shuffle them with {}, or leave the loader's shuffle off",
                    self.unshuffled.join(", "),
                    self.setting
                ),
            )),
            other => Err(ConfigError::new(
                "shuffle",
                format!(
                    "{other}: this source orders its own samples; set how each part is \
                     shuffled with {}, and leave the loader's shuffle off (or true)",
                    self.setting
                ),
            )),
        }
    }
}

// Forwards every method, defaults included: a method left out would silently fall back to
// the trait's default (a source's own `set_plan` or `collate` lost behind an `Arc`), so clippy
// refuses an impl that misses one.
#[deny(clippy::missing_trait_methods)]
impl<S: Source + ?Sized> Source for std::sync::Arc<S> {
    fn manifest(&self) -> &Manifest {
        (**self).manifest()
    }

    fn read(&self, id: u64) -> Result<Sample, Error> {
        (**self).read(id)
    }

    fn read_many(&self, ids: &[u64]) -> Vec<Result<Sample, Error>> {
        (**self).read_many(ids)
    }

    fn set_plan(&self, plan: &Plan) {
        (**self).set_plan(plan)
    }

    fn keep_one_order(&self) {
        (**self).keep_one_order()
    }

    fn collate(
        &self,
        ids: &[u64],
        pool: &BufferPool,
    ) -> Option<Result<Vec<(String, Column)>, Error>> {
        (**self).collate(ids, pool)
    }

    fn stats(&self) -> Option<serde_json::Value> {
        (**self).stats()
    }

    fn metrics(&self) -> Vec<MetricFamily> {
        (**self).metrics()
    }

    fn own_order(&self) -> Option<OwnOrder> {
        (**self).own_order()
    }

    fn definition_parts(&self) -> Option<BTreeMap<String, String>> {
        (**self).definition_parts()
    }

    fn remote_io(&self) -> Option<IoSnapshot> {
        (**self).remote_io()
    }

    fn column_types(&self) -> Vec<ColumnType> {
        (**self).column_types()
    }
}

/// Samples per shard of the sources made from your own code ([`FnSource`], [`VecSource`]):
/// their "shards" are runs of ids, so block shuffle has windows to permute.
pub const SAMPLES_PER_VIRTUAL_SHARD: u64 = 1024;

/// The manifest of `len` samples from code named `name`: shards of
/// [`SAMPLES_PER_VIRTUAL_SHARD`] consecutive ids, so the fingerprint (what a checkpoint is
/// checked against) is the name and the length.
pub fn virtual_manifest(name: &str, len: u64) -> Manifest {
    let per = SAMPLES_PER_VIRTUAL_SHARD;
    let shards = (0..len.div_ceil(per))
        .map(|i| crate::ShardInfo {
            path: format!("{name}#{}", i * per),
            samples: per.min(len - i * per),
            bytes: 0,
        })
        .collect();
    Manifest::new(format!("code:{name}"), shards)
}

/// A source from your own code: `len` samples, sample `id` made by a closure (called on the
/// worker threads, concurrently, so it takes `&self` state only). `name` names it in the
/// manifest and in errors, and with `len` makes its fingerprint.
///
/// ```
/// use chute_core::{Array, DType, Field, FnSource, Sample, Source};
///
/// let squares = FnSource::new("squares", 10, |id| {
///     let v = (id * id).to_le_bytes().to_vec();
///     Ok(Sample::new(id).with("x", Field::Array(Array::new(DType::U64, vec![], v.into()))))
/// });
/// assert_eq!(squares.manifest().total_samples(), 10);
/// let Some(Field::Array(x)) = squares.read(3)?.get("x").cloned() else { unreachable!() };
/// assert_eq!(&x.data[..], &9u64.to_le_bytes());
/// # Ok::<(), chute_core::Error>(())
/// ```
pub struct FnSource<F> {
    manifest: Manifest,
    read: F,
}

impl<F> FnSource<F>
where
    F: Fn(u64) -> Result<Sample, Error> + Send + Sync + 'static,
{
    /// `len` samples named `name`, sample `id` being `read(id)`.
    pub fn new(name: &str, len: u64, read: F) -> Self {
        FnSource {
            manifest: virtual_manifest(name, len),
            read,
        }
    }
}

impl<F> std::fmt::Debug for FnSource<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FnSource")
            .field("format", &self.manifest.format)
            .field("samples", &self.manifest.total_samples())
            .finish()
    }
}

impl<F> Source for FnSource<F>
where
    F: Fn(u64) -> Result<Sample, Error> + Send + Sync + 'static,
{
    fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn read(&self, id: u64) -> Result<Sample, Error> {
        let mut s = (self.read)(id)?;
        s.index = id;
        Ok(s)
    }
}

/// A source over samples already in memory, in order (a test set, a small dataset built in
/// code). Reads are clones: fields are `Bytes` views, so no sample data is copied.
#[derive(Debug, Clone)]
pub struct VecSource {
    manifest: Manifest,
    samples: Vec<Sample>,
}

impl VecSource {
    /// The samples, in order; `name` makes the fingerprint with their number.
    pub fn new(name: &str, samples: Vec<Sample>) -> Self {
        VecSource {
            manifest: virtual_manifest(name, samples.len() as u64),
            samples,
        }
    }
}

impl Source for VecSource {
    fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn read(&self, id: u64) -> Result<Sample, Error> {
        let i = usize::try_from(id).ok().filter(|&i| i < self.samples.len());
        let Some(i) = i else {
            return Err(crate::ConfigError::new(
                "id",
                format!("sample {id} of {}", self.samples.len()),
            )
            .into());
        };
        let mut s = self.samples[i].clone();
        s.index = id;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Array, DType, Field, Plan, PlanConfig, Shuffle};

    fn sample(id: u64) -> Sample {
        let v = id.to_le_bytes().to_vec();
        Sample::new(0).with("x", Field::Array(Array::new(DType::U64, vec![], v.into())))
    }

    #[test]
    fn virtual_shards_cover_the_ids_and_name_the_code() {
        let m = virtual_manifest("mine", 2500);
        assert_eq!(m.format, "code:mine");
        let counts: Vec<u64> = m.shards.iter().map(|s| s.samples).collect();
        assert_eq!(counts, [1024, 1024, 452]);
        assert_eq!(virtual_manifest("mine", 0).shards.len(), 0);
        assert_ne!(
            m.fingerprint(),
            virtual_manifest("mine", 2501).fingerprint()
        );
        assert_ne!(
            m.fingerprint(),
            virtual_manifest("other", 2500).fingerprint()
        );
        // Block shuffle has shards to permute.
        let cfg = PlanConfig {
            shuffle: Shuffle::Block { window: 1 },
            ..Default::default()
        };
        let mut ids: Vec<u64> = Plan::new(&m, &cfg).unwrap().iter().collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..2500).collect::<Vec<_>>());
    }

    #[test]
    fn closures_and_vectors_are_sources() {
        let f = FnSource::new("f", 5, |id| Ok(sample(id * 2)));
        let v = VecSource::new("v", (0..5).map(|id| sample(id * 2)).collect());
        for id in 0..5 {
            let (a, b) = (f.read(id).unwrap(), v.read(id).unwrap());
            assert_eq!((a.index, b.index), (id, id));
            let (Some(Field::Array(x)), Some(Field::Array(y))) = (a.get("x"), b.get("x")) else {
                panic!()
            };
            assert_eq!(x.data, y.data);
        }
        assert!(v.read(5).unwrap_err().to_string().contains("sample 5 of 5"));
    }

    #[test]
    fn own_order_takes_an_agreeing_shuffle_and_names_what_contradicts_it() {
        let all = OwnOrder {
            unshuffled: vec![],
            setting: "the mixture's shuffle".into(),
        };
        assert_eq!(all.plan_shuffle(Shuffle::None).unwrap(), Shuffle::None);
        assert_eq!(all.plan_shuffle(Shuffle::Global).unwrap(), Shuffle::None);
        let e = all.plan_shuffle(Shuffle::block()).unwrap_err().to_string();
        assert!(
            e.contains("shuffle") && e.contains("the mixture's shuffle"),
            "{e}"
        );
        let some = OwnOrder {
            unshuffled: vec!["component \"math\"".into()],
            ..all
        };
        let e = some.plan_shuffle(Shuffle::Global).unwrap_err().to_string();
        assert!(e.contains("keeps component \"math\" in order"), "{e}");
        assert_eq!(some.plan_shuffle(Shuffle::None).unwrap(), Shuffle::None);
    }
}
