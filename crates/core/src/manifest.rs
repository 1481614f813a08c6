//! [`Manifest`]: the shards of a dataset with their sample counts and byte sizes.
//!
//! The manifest is what makes the plan exact: with every shard's sample count known, a global
//! sample id maps to (shard, position) and every rank can compute the same epoch order without
//! talking to the others. On disk it is JSON (`manifest.json`, written by `chute index`).

use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, Error};

/// Version of the manifest's JSON layout.
pub const MANIFEST_VERSION: u32 = 1;

/// One shard: a file or object holding consecutive samples.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    /// Path or URL, as given by the user (relative paths are relative to the manifest).
    pub path: String,
    /// Number of samples in the shard.
    pub samples: u64,
    /// Size of the shard in bytes.
    pub bytes: u64,
}

/// The shards of a dataset, in order. Global sample ids number the samples of all shards
/// consecutively: shard 0's samples first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Layout version ([`MANIFEST_VERSION`]).
    pub version: u32,
    /// The format (`tokens`, `webdataset`, `tfrecord`, `parquet`, ...).
    pub format: String,
    /// Format parameters that change what a sample is (for token files: `seq_len`, `dtype`),
    /// so that they take part in the fingerprint.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub params: serde_json::Map<String, serde_json::Value>,
    /// The shards.
    pub shards: Vec<ShardInfo>,
    /// Where units of shards start, as shard indices (`0` first, increasing; empty: each
    /// shard is a unit of its own). A unit is shards that are cheapest read together, such as
    /// the chunks of one Parquet row group, which is decoded whole: a `block` shuffle visits
    /// units in random order and a unit's shards one after the other, in random order (see
    /// [`crate::Shuffle::Block`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub units: Vec<u64>,
    /// `starts[i]` is the global id of shard `i`'s first sample; `starts[len]` the total.
    #[serde(skip)]
    starts: Vec<u64>,
}

impl Manifest {
    /// A manifest over `shards` of `format`.
    pub fn new(format: impl Into<String>, shards: Vec<ShardInfo>) -> Self {
        let mut m = Manifest {
            version: MANIFEST_VERSION,
            format: format.into(),
            params: serde_json::Map::new(),
            shards,
            units: Vec::new(),
            starts: Vec::new(),
        };
        m.index();
        m
    }

    /// Adds a format parameter (builder style).
    pub fn with_param(mut self, key: &str, value: impl Into<serde_json::Value>) -> Self {
        self.params.insert(key.to_owned(), value.into());
        self
    }

    /// Groups the shards into units starting at shard indices `starts` (builder style; see
    /// [`Manifest::units`]). Starts that are not increasing from `0` and within the shards
    /// are an error in the caller (this panics), as in a manifest file they are an error in
    /// the file.
    pub fn with_units(mut self, starts: Vec<u64>) -> Self {
        self.units = starts;
        if let Err(why) = self.check_units() {
            panic!("{why}");
        }
        self
    }

    /// Each unit's shards, as a range of shard indices, in order (one unit per shard when
    /// [`Manifest::units`] is empty).
    pub fn unit_ranges(&self) -> Vec<std::ops::Range<usize>> {
        if self.units.is_empty() {
            return (0..self.shards.len()).map(|i| i..i + 1).collect();
        }
        let n = self.shards.len();
        let starts = self.units.iter().map(|&u| u as usize);
        let ends = self.units[1..].iter().map(|&u| u as usize).chain([n]);
        starts.zip(ends).map(|(a, b)| a..b).collect()
    }

    fn check_units(&self) -> Result<(), String> {
        let n = self.shards.len() as u64;
        let Some(&first) = self.units.first() else {
            return Ok(());
        };
        if first != 0
            || self.units.windows(2).any(|w| w[0] >= w[1])
            || self.units[self.units.len() - 1] >= n
        {
            return Err(format!(
                "the manifest's units must be increasing shard indices from 0, below its {n} \
                 shards; they are {:?}",
                &self.units[..self.units.len().min(8)]
            ));
        }
        Ok(())
    }

    fn index(&mut self) {
        self.starts.clear();
        self.starts.reserve(self.shards.len() + 1);
        let mut total = 0u64;
        self.starts.push(0);
        for s in &self.shards {
            total += s.samples;
            self.starts.push(total);
        }
    }

    /// Parses a manifest from JSON; `origin` names the file in errors.
    pub fn from_json(text: &str, origin: &str) -> Result<Self, Error> {
        let mut m: Manifest = serde_json::from_str(text).map_err(|e| {
            Error::corrupt(
                origin,
                e.column() as u64,
                format!("not a chute manifest: {e}"),
            )
        })?;
        if m.version != MANIFEST_VERSION {
            return Err(ConfigError::new(
                "manifest",
                format!(
                    "{origin} has manifest version {}, this build reads version {MANIFEST_VERSION}; \
                     rebuild it with `chute index`",
                    m.version
                ),
            )
            .into());
        }
        m.check_units().map_err(|why| {
            Error::corrupt(origin, 0, format!("{why}; rebuild it with `chute index`"))
        })?;
        m.index();
        Ok(m)
    }

    /// The manifest as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a manifest always serializes")
    }

    /// Total number of samples.
    pub fn total_samples(&self) -> u64 {
        *self.starts.last().unwrap_or(&0)
    }

    /// Total size in bytes.
    pub fn total_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.bytes).sum()
    }

    /// Global id of shard `shard`'s first sample.
    pub fn shard_start(&self, shard: usize) -> u64 {
        self.starts[shard]
    }

    /// The shard holding global sample `id` and the sample's position in it, or `None` if `id`
    /// is out of range.
    pub fn locate(&self, id: u64) -> Option<(usize, u64)> {
        if id >= self.total_samples() {
            return None;
        }
        // partition_point gives the first start > id; the shard is the one before it. Empty
        // shards share a start with their successor and are skipped naturally.
        let shard = self.starts.partition_point(|&s| s <= id) - 1;
        Some((shard, id - self.starts[shard]))
    }

    /// [`Manifest::locate`], or a [`ConfigError`] naming the id and the dataset's size: what
    /// every [`crate::Source::read`] answers for an id past the end.
    pub fn locate_checked(&self, id: u64) -> Result<(usize, u64), ConfigError> {
        self.locate(id).ok_or_else(|| {
            ConfigError::new(
                "id",
                format!(
                    "sample id {id} is out of range: the {} dataset holds {} samples",
                    self.format,
                    self.total_samples()
                ),
            )
        })
    }

    /// A short hex fingerprint of what defines the samples: the format, its parameters and
    /// each shard's file name, sample count and size. Directories are left out so a dataset
    /// can move (or be served from a URL) and keep its checkpoints valid.
    pub fn fingerprint(&self) -> String {
        let mut h = Fnv64::default();
        h.write(self.format.as_bytes());
        h.write(
            serde_json::Value::Object(self.params.clone())
                .to_string()
                .as_bytes(),
        );
        for s in &self.shards {
            let name = s.path.rsplit(['/', '\\']).next().unwrap_or(&s.path);
            h.write(name.as_bytes());
            h.write(&s.samples.to_le_bytes());
            h.write(&s.bytes.to_le_bytes());
        }
        // Units change the order a block shuffle reads: a state saved under other units
        // would resume somewhere else. (Manifests without units hash as before units were.)
        if !self.units.is_empty() {
            h.write(b"units");
            for u in &self.units {
                h.write(&u.to_le_bytes());
            }
        }
        format!("{:016x}", h.0)
    }
}

/// FNV-1a: tiny, stable across platforms and releases, plenty for a fingerprint of a few KB.
struct Fnv64(u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv64 {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        // A separator so ("ab","c") and ("a","bc") differ.
        self.0 = (self.0 ^ 0xff).wrapping_mul(0x0100_0000_01b3);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shards(counts: &[u64]) -> Manifest {
        Manifest::new(
            "test",
            counts
                .iter()
                .enumerate()
                .map(|(i, &n)| ShardInfo {
                    path: format!("d/s{i}"),
                    samples: n,
                    bytes: n * 10,
                })
                .collect(),
        )
    }

    #[test]
    fn locate_skips_empty_shards() {
        let m = shards(&[3, 0, 2]);
        assert_eq!(m.total_samples(), 5);
        assert_eq!(m.locate(0), Some((0, 0)));
        assert_eq!(m.locate(2), Some((0, 2)));
        assert_eq!(m.locate(3), Some((2, 0)));
        assert_eq!(m.locate(4), Some((2, 1)));
        assert_eq!(m.locate(5), None);
    }

    #[test]
    fn json_round_trip_keeps_fingerprint() {
        let m = shards(&[3, 4]).with_param("seq_len", 128);
        let back = Manifest::from_json(&m.to_json(), "m.json").unwrap();
        assert_eq!(back, m);
        assert_eq!(back.fingerprint(), m.fingerprint());
        assert_ne!(shards(&[3, 5]).fingerprint(), shards(&[3, 4]).fingerprint());
        let moved = Manifest::new(
            "test",
            vec![
                ShardInfo {
                    path: "elsewhere/s0".into(),
                    samples: 3,
                    bytes: 30,
                },
                ShardInfo {
                    path: "s1".into(),
                    samples: 4,
                    bytes: 40,
                },
            ],
        );
        assert_eq!(moved.fingerprint(), shards(&[3, 4]).fingerprint());
    }

    #[test]
    fn bad_json_names_the_file() {
        let e = Manifest::from_json("{", "x/manifest.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("x/manifest.json"), "{e}");
    }
}
