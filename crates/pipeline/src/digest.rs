//! [`StreamDigest`]: a digest of a stream of batches (contents and order), the one
//! `chute bench --digest` prints, to compare runs, worker counts and machines.

use xxhash_rust::xxh3::Xxh3;

use chute_core::{Batch, Column};

/// An incremental digest of batches: column names, dtypes, shapes and bytes, in order.
#[derive(Default, Clone)]
pub struct StreamDigest {
    hasher: Xxh3,
    batches: u64,
}

impl std::fmt::Debug for StreamDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamDigest")
            .field("batches", &self.batches)
            .finish()
    }
}

impl StreamDigest {
    /// An empty digest.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a batch.
    pub fn update(&mut self, batch: &Batch) {
        let h = &mut self.hasher;
        h.update(&(batch.columns.len() as u64).to_le_bytes());
        for (name, col) in &batch.columns {
            h.update(&(name.len() as u64).to_le_bytes());
            h.update(name.as_bytes());
            let tensors = match col {
                Column::Tensor(t) => vec![t],
                Column::Var(v) => vec![&v.offsets, &v.data],
                Column::List(ts) => ts.iter().collect(),
                Column::Values(values) => {
                    h.update(b"values");
                    for v in values {
                        v.encode(&mut |b| h.update(b));
                    }
                    vec![]
                }
                Column::Nested(rows) => {
                    // As the same values collated from samples digest.
                    h.update(b"values");
                    for i in 0..rows.len() {
                        match rows.value(i) {
                            Ok(v) => v.encode(&mut |b| h.update(b)),
                            Err(why) => h.update(why.as_bytes()),
                        }
                    }
                    vec![]
                }
                _ => vec![],
            };
            for t in tensors {
                h.update(t.dtype().name().as_bytes());
                h.update(&(t.shape().len() as u64).to_le_bytes());
                for &d in t.shape() {
                    h.update(&(d as u64).to_le_bytes());
                }
                h.update(t.as_bytes());
            }
        }
        self.batches += 1;
    }

    /// Batches added so far.
    pub fn batches(&self) -> u64 {
        self.batches
    }

    /// The digest as 32 hex digits.
    pub fn hex(&self) -> String {
        format!("{:032x}", self.hasher.digest128())
    }
}

/// The digest of one batch.
pub fn batch_digest(batch: &Batch) -> String {
    let mut d = StreamDigest::new();
    d.update(batch);
    d.hex()
}
