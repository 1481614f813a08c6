//! A mixture's [`MixMode`] and [`Policy`], the name of its format, and the hash that seeds
//! its components by name.

use std::fmt;
use std::str::FromStr;

use chute_core::ConfigError;

/// The format name of a mixture's manifest.
pub const MIXTURE_FORMAT: &str = "mixture";
/// How components are assigned to positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MixMode {
    /// Each component's share, rounded with carry, in every prefix (and so every batch).
    #[default]
    Stratified,
    /// Components drawn i.i.d. by weight from the seeded RNG.
    Random,
}

impl fmt::Display for MixMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MixMode::Stratified => "stratified",
            MixMode::Random => "random",
        })
    }
}

impl FromStr for MixMode {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "stratified" => Ok(MixMode::Stratified),
            "random" => Ok(MixMode::Random),
            _ => Err(ConfigError::new(
                "mode",
                format!("{s:?} is not a mixing mode; use stratified or random"),
            )),
        }
    }
}

/// Where a mixture's epoch ends. Components never run dry whatever the policy: an exhausted
/// component starts its next epoch, reshuffled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// When the first component finishes its first epoch (no sample seen twice in epoch 0).
    StopOnFirst,
    /// When the last component finishes its first epoch (every sample seen in epoch 0).
    #[default]
    StopOnAll,
    /// After `samples_per_epoch` samples, whatever the components' epochs.
    Cycle,
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Policy::StopOnFirst => "stop_on_first",
            Policy::StopOnAll => "stop_on_all",
            Policy::Cycle => "cycle",
        })
    }
}

impl FromStr for Policy {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "stop_on_first" => Ok(Policy::StopOnFirst),
            "stop_on_all" => Ok(Policy::StopOnAll),
            "cycle" => Ok(Policy::Cycle),
            _ => Err(ConfigError::new(
                "policy",
                format!("{s:?} is not a mixture policy; use stop_on_first, stop_on_all or cycle"),
            )),
        }
    }
}

/// A stable 64-bit hash of a name (FNV-1a), for seeds.
pub(super) fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
