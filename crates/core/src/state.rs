//! [`State`]: a loader's checkpoint: a position, not a buffer.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::StateError;
use crate::plan::Shuffle;

/// Version of the state layout this build writes and reads.
pub const STATE_VERSION: u32 = 1;

/// Where a loader stands, as of the last batch delivered to the consumer (never of what was
/// prefetched). A few integers, so a checkpoint is instant and resuming replays nothing.
///
/// `start` and `delivered` locate the position: this rank has delivered `delivered` samples of
/// the split that began at global position `start` of epoch `epoch`'s order. All ranks of a
/// job have the same state, so any rank's state restores any rank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// Layout version ([`STATE_VERSION`]).
    pub version: u32,
    /// Fingerprint of the dataset's manifest (see [`crate::Manifest::fingerprint`]).
    pub dataset: String,
    /// Seed of the run.
    pub seed: u64,
    /// Epoch in progress.
    pub epoch: u64,
    /// Global position where the current split of the epoch began (non-zero only after a
    /// resume on a different world size).
    pub start: u64,
    /// Ranges of positions after `start` that the current split skips: what ranks read
    /// before an elastic resume of a block-shuffled run (see
    /// [`crate::plan::PlanConfig::taken`]). Empty otherwise. Always written, so that a
    /// checkpointer that loads into a fresh state's keys (`torch.distributed.checkpoint`)
    /// carries it.
    #[serde(default)]
    pub taken: Vec<(u64, u64)>,
    /// Samples this rank has delivered in the current split.
    pub delivered: u64,
    /// Whether the run dropped its last partial batches: with `block` shuffle it decides the
    /// ranks' slices, so an elastic resume needs it to know what the old ranks had read.
    #[serde(default)]
    pub drop_last: bool,
    /// Number of ranks when the state was taken.
    pub world_size: u64,
    /// Ordering mode.
    pub shuffle: Shuffle,
    /// For a source with a definition of parts (a mixture), a fingerprint of each part (see
    /// [`crate::Source::definition_parts`]), so a state from another definition is refused
    /// with what differs named. Empty (and not written) otherwise.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parts: BTreeMap<String, String>,
}

impl State {
    /// The state as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a state always serializes")
    }

    /// Parses a state, refusing unknown versions before looking at anything else.
    pub fn from_json(text: &str) -> Result<State, StateError> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| StateError::Invalid(e.to_string()))?;
        let version = value
            .get("version")
            .and_then(|v| v.as_u64())
            .ok_or_else(|| {
                StateError::Invalid("no \"version\" field: not a chute loader state".into())
            })?;
        if version != u64::from(STATE_VERSION) {
            return Err(StateError::Version {
                found: u32::try_from(version).unwrap_or(u32::MAX),
                supported: STATE_VERSION,
            });
        }
        serde_json::from_value(value).map_err(|e| StateError::Invalid(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_version_check() {
        let s = State {
            version: STATE_VERSION,
            dataset: "abc".into(),
            seed: 1,
            epoch: 2,
            start: 0,
            taken: vec![(60, 70)],
            delivered: 48,
            drop_last: true,
            world_size: 4,
            shuffle: Shuffle::block(),
            parts: BTreeMap::new(),
        };
        assert_eq!(State::from_json(&s.to_json()).unwrap(), s);
        let future = s.to_json().replace("\"version\": 1", "\"version\": 9");
        let e = State::from_json(&future).unwrap_err();
        assert!(matches!(e, StateError::Version { found: 9, .. }), "{e}");
        assert!(matches!(
            State::from_json("[]").unwrap_err(),
            StateError::Invalid(_)
        ));
    }
}
