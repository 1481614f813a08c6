use bytes::Bytes;
use chute_core::{Array, BoxError, DType, Error, Field, Manifest, Sample, SampleRng, Source};

/// A synthetic source: sample `id` has an array `x = [id, id+1, id+2]` (u32, cast to i64 by
/// default) and a text field `key`.
pub(crate) struct Synthetic {
    pub(crate) manifest: Manifest,
}

impl Synthetic {
    pub(crate) fn new(counts: &[u64]) -> Self {
        Synthetic {
            manifest: chute_core::testing::manifest_sized(counts, |_, n| n * 12),
        }
    }
}

impl Source for Synthetic {
    fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn read(&self, id: u64) -> Result<Sample, Error> {
        let x: Vec<u8> = (0..3u32)
            .flat_map(|k| (id as u32 + k).to_le_bytes())
            .collect();
        let mut a = Array::new(DType::U32, vec![3], Bytes::from(x));
        a.cast = Some(DType::I64);
        let mut s = Sample::new(id)
            .with("x", Field::Array(a))
            .with("key", Field::Text(Bytes::from(format!("k{id}"))));
        s.key = format!("k{id}");
        Ok(s)
    }
}

/// A transform that draws from the per-sample RNG (like a random crop would).
pub(crate) fn noise(s: &mut Sample, rng: &mut SampleRng) -> Result<(), BoxError> {
    let v = rng.next_u64();
    s.set(
        "noise",
        Field::Array(Array::new(
            DType::U64,
            vec![],
            Bytes::copy_from_slice(&v.to_le_bytes()),
        )),
    );
    Ok(())
}
