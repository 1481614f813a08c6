//! Test support (feature `testing`): manifests of synthetic shards, for the tests of the plan,
//! the planner, the engine and the sources built on them, and the parts of a corrupt-data
//! error, for the tests of every parser.

use crate::error::Error;
use crate::manifest::{Manifest, ShardInfo};

/// The parts of an [`Error::Corrupt`]: uri, offset and reason; panics on any other error.
pub fn corrupt(e: Error) -> (String, u64, String) {
    match e {
        Error::Corrupt {
            uri,
            offset,
            reason,
            ..
        } => (uri, offset, reason),
        other => panic!("expected a corrupt error, got {other}"),
    }
}

/// A manifest of format `test` whose shard `i` is named `s{i}` and holds `counts[i]` samples
/// of 10 bytes each.
pub fn manifest(counts: &[u64]) -> Manifest {
    manifest_sized(counts, |_, n| 10 * n)
}

/// [`manifest`] with shard `i` of `bytes(i, counts[i])` bytes.
pub fn manifest_sized(counts: &[u64], bytes: impl Fn(usize, u64) -> u64) -> Manifest {
    Manifest::new(
        "test",
        counts
            .iter()
            .enumerate()
            .map(|(i, &n)| ShardInfo {
                path: format!("s{i}"),
                samples: n,
                bytes: bytes(i, n),
            })
            .collect(),
    )
}
