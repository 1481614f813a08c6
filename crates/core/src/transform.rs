//! The [`Transform`] trait and the generic transforms every pipeline can use.

use std::fmt;
use std::sync::Arc;

use crate::{BoxError, ConfigError, DType, Field, FieldName, Sample, SampleRng, check_cast};

/// A per-sample transformation, run on the loader's worker threads.
///
/// Contract: `apply` may read and rewrite any field of the sample. Its only source of
/// randomness is `rng`, which the engine seeds from (seed, epoch, global sample index), so the
/// output never depends on the number of workers, their timing or the prefetch depth. An
/// error (or a panic) surfaces from the loader's `next()` naming the sample; it never hangs
/// the loader.
///
/// Closures `Fn(&mut Sample, &mut SampleRng) -> Result<(), BoxError>` are transforms.
pub trait Transform: Send + Sync + 'static {
    /// Transforms `sample` in place.
    fn apply(&self, sample: &mut Sample, rng: &mut SampleRng) -> Result<(), BoxError>;

    /// A short name for stats and error messages.
    fn name(&self) -> &str {
        "transform"
    }

    /// Fields whose final value this transform can write straight into the batch: the batcher
    /// then hands [`Transform::apply_into`] each sample's slot of those columns, and no
    /// per-sample copy of the value is made after the last op. Empty (the default) means
    /// every field goes through the sample.
    fn slots(&self) -> &[Slot] {
        &[]
    }

    /// [`Transform::apply`], except that the fields listed by [`Transform::slots`] are written
    /// into `out` (one slice per slot, in order, each `Slot::nbytes` long) instead of being
    /// set on the sample. Called only when `slots()` is non-empty. The default applies and
    /// then moves the fields into their slots.
    fn apply_into(
        &self,
        sample: &mut Sample,
        rng: &mut SampleRng,
        out: &mut [&mut [u8]],
    ) -> Result<(), BoxError> {
        self.apply(sample, rng)?;
        for (slot, dst) in self.slots().iter().zip(out.iter_mut()) {
            slot.fill_from(sample, dst)?;
        }
        Ok(())
    }
}

/// A field a transform writes straight into the batch: its name and per-sample dtype and
/// shape (fixed, so every sample's slot has the same size).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// Output field (batch column) name.
    pub name: String,
    /// dtype in the batch.
    pub dtype: DType,
    /// Per-sample shape.
    pub shape: Vec<usize>,
}

impl Slot {
    /// Bytes of one sample's value.
    pub fn nbytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }

    /// Moves field `name` out of `sample` into `dst`, converting its dtype; an error if it is
    /// missing or not an array of this slot's shape.
    pub fn fill_from(&self, sample: &mut Sample, dst: &mut [u8]) -> Result<(), BoxError> {
        match sample.remove(&self.name) {
            Some(Field::Array(a)) if a.shape == self.shape => {
                check_cast(a.dtype, self.dtype)?;
                crate::cast_into(a.dtype, &a.data, self.dtype, dst);
                Ok(())
            }
            Some(Field::Array(a)) => Err(format!(
                "field {:?} is {} {:?}, but its batch column is {} {:?}",
                self.name, a.dtype, a.shape, self.dtype, self.shape
            )
            .into()),
            Some(_) => Err(format!("field {:?} is not an array", self.name).into()),
            None => Err(format!("the transform did not produce field {:?}", self.name).into()),
        }
    }
}

impl<F> Transform for F
where
    F: Fn(&mut Sample, &mut SampleRng) -> Result<(), BoxError> + Send + Sync + 'static,
{
    fn apply(&self, sample: &mut Sample, rng: &mut SampleRng) -> Result<(), BoxError> {
        self(sample, rng)
    }

    fn name(&self) -> &str {
        "closure"
    }
}

/// Several transforms applied in order, sharing one RNG stream.
#[derive(Clone, Default)]
pub struct Compose {
    steps: Vec<Arc<dyn Transform>>,
}

impl Compose {
    /// An empty composition (the identity).
    pub fn new() -> Self {
        Compose::default()
    }

    /// Appends a transform.
    pub fn push(&mut self, t: Arc<dyn Transform>) {
        self.steps.push(t);
    }

    /// Appends a transform (builder style).
    pub fn then(mut self, t: impl Transform) -> Self {
        self.steps.push(Arc::new(t));
        self
    }

    /// Number of steps.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// True when there are no steps.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
}

impl fmt::Debug for Compose {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.steps.iter().map(|t| t.name()))
            .finish()
    }
}

impl Transform for Compose {
    fn apply(&self, sample: &mut Sample, rng: &mut SampleRng) -> Result<(), BoxError> {
        for t in &self.steps {
            t.apply(sample, rng)?;
        }
        Ok(())
    }

    fn name(&self) -> &str {
        "compose"
    }

    /// The last step's slots: it is the one that writes the final values.
    fn slots(&self) -> &[Slot] {
        self.steps.last().map_or(&[], |t| t.slots())
    }

    fn apply_into(
        &self,
        sample: &mut Sample,
        rng: &mut SampleRng,
        out: &mut [&mut [u8]],
    ) -> Result<(), BoxError> {
        let Some((last, first)) = self.steps.split_last() else {
            return Ok(());
        };
        for t in first {
            t.apply(sample, rng)?;
        }
        last.apply_into(sample, rng, out)
    }
}

/// Casts a numeric field to another dtype. Lazy: the batcher converts while it copies the
/// field into the batch, so the cast costs no extra pass over the data.
#[derive(Debug, Clone)]
pub struct Cast {
    field: FieldName,
    dtype: DType,
}

impl Cast {
    /// Casts `field` to `dtype`.
    pub fn new(field: impl Into<FieldName>, dtype: DType) -> Self {
        Cast {
            field: field.into(),
            dtype,
        }
    }
}

impl Transform for Cast {
    fn apply(&self, sample: &mut Sample, _rng: &mut SampleRng) -> Result<(), BoxError> {
        match sample.get_mut(&self.field) {
            Some(Field::Array(a)) => {
                check_cast(a.dtype, self.dtype)?;
                a.cast = (a.dtype != self.dtype).then_some(self.dtype);
                Ok(())
            }
            Some(_) => Err(format!("cast: field {:?} is not a numeric array", self.field).into()),
            None => Err(missing(&self.field, sample)),
        }
    }

    fn name(&self) -> &str {
        "cast"
    }
}

/// Keeps only the named fields, in the given order (and fails if one is missing).
#[derive(Debug, Clone)]
pub struct Select {
    fields: Vec<FieldName>,
}

impl Select {
    /// Keeps `fields`.
    pub fn new<I, S>(fields: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: Into<FieldName>,
    {
        let fields: Vec<FieldName> = fields.into_iter().map(Into::into).collect();
        if fields.is_empty() {
            return Err(ConfigError::new("select", "needs at least one field name"));
        }
        Ok(Select { fields })
    }
}

impl Transform for Select {
    fn apply(&self, sample: &mut Sample, _rng: &mut SampleRng) -> Result<(), BoxError> {
        let mut kept = Vec::with_capacity(self.fields.len());
        for name in &self.fields {
            match sample.remove(name) {
                Some(f) => kept.push((name.clone(), f)),
                None => return Err(missing(name, sample)),
            }
        }
        sample.fields = kept;
        Ok(())
    }

    fn name(&self) -> &str {
        "select"
    }
}

/// Renames a field.
#[derive(Debug, Clone)]
pub struct Rename {
    from: FieldName,
    to: FieldName,
}

impl Rename {
    /// Renames `from` to `to`.
    pub fn new(from: impl Into<FieldName>, to: impl Into<FieldName>) -> Self {
        Rename {
            from: from.into(),
            to: to.into(),
        }
    }
}

impl Transform for Rename {
    fn apply(&self, sample: &mut Sample, _rng: &mut SampleRng) -> Result<(), BoxError> {
        match sample.fields.iter_mut().find(|(n, _)| *n == self.from) {
            Some((name, _)) => {
                *name = self.to.clone();
                Ok(())
            }
            None => Err(missing(&self.from, sample)),
        }
    }

    fn name(&self) -> &str {
        "rename"
    }
}

fn missing(name: &str, sample: &Sample) -> BoxError {
    let have: Vec<&str> = sample.fields.iter().map(|(n, _)| n.as_ref()).collect();
    format!("no field {name:?}; the sample has {have:?}").into()
}

#[cfg(test)]
mod tests {
    use crate::Array;
    use bytes::Bytes;

    use super::*;

    fn sample() -> Sample {
        Sample::new(3)
            .with(
                "a",
                Field::Array(Array::new(
                    DType::U16,
                    vec![2],
                    Bytes::from_static(&[1, 0, 2, 0]),
                )),
            )
            .with("b", Field::Text(Bytes::from_static(b"hi")))
    }

    #[test]
    fn compose_runs_in_order_with_closures() {
        let t = Compose::new()
            .then(Cast::new("a", DType::I64))
            .then(Rename::new("b", "caption"))
            .then(
                |s: &mut Sample, rng: &mut SampleRng| -> Result<(), BoxError> {
                    s.key = format!("k{}", rng.below(10));
                    Ok(())
                },
            );
        let mut s = sample();
        t.apply(&mut s, &mut SampleRng::for_sample(0, 0, 3))
            .unwrap();
        let Some(Field::Array(a)) = s.get("a") else {
            panic!()
        };
        assert_eq!(a.out_dtype(), DType::I64);
        assert!(s.get("caption").is_some());
        assert!(s.key.starts_with('k'));
    }

    #[test]
    fn errors_name_the_missing_field() {
        let mut s = sample();
        let e = Select::new(["a", "zzz"])
            .unwrap()
            .apply(&mut s, &mut SampleRng::from_key(0));
        let msg = e.unwrap_err().to_string();
        assert!(msg.contains("zzz") && msg.contains("\"b\""), "{msg}");
        let e = Cast::new("a", DType::Bool).apply(&mut sample(), &mut SampleRng::from_key(0));
        assert!(e.unwrap_err().to_string().contains("bool"));
    }
}
