//! The error vocabulary. Variants are chosen by what the caller does next: fix the
//! arguments ([`ConfigError`]), fix or skip the data ([`Error::Corrupt`]), check the path or
//! retry ([`Error::Io`]), fix their own code ([`Error::Transform`], [`Error::WorkerPanicked`]),
//! or use a matching checkpoint ([`StateError`]).

use std::borrow::Cow;
use std::fmt;

use crate::redact::redact;

/// `text` with a URL's credentials hidden, reusing it when it has none.
fn redacted(text: String) -> String {
    match redact(&text) {
        Cow::Owned(hidden) => hidden,
        Cow::Borrowed(_) => text,
    }
}

/// A result with chute's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A boxed error from user code (a transform) or a lower layer.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Where a sample came from, for error messages: its global index and, when known, its key
/// and shard.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SampleRef {
    /// Global sample id (position in the manifest's concatenated shards).
    pub index: u64,
    /// The sample's key (WebDataset key, record number...); empty when the format has none.
    pub key: String,
    /// The shard the sample lives in; empty when unknown.
    pub shard: String,
}

impl fmt::Display for SampleRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sample {}", self.index)?;
        if !self.key.is_empty() {
            write!(f, " (key {:?})", self.key)?;
        }
        if !self.shard.is_empty() {
            write!(f, " in shard {}", redact(&self.shard))?;
        }
        Ok(())
    }
}

/// Everything that can go wrong while loading.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The operating system refused a read or an open: check the path, permissions or disk.
    #[error("{path}: {source}")]
    Io {
        /// The file or URL.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The data is malformed: the shard, the byte offset, the kind of damage and what was
    /// wrong. Messages of [`Corruption::Truncated`] data start with `truncated:` after the
    /// offset.
    #[error("{uri} at byte {offset}: {}{reason}", kind.prefix())]
    Corrupt {
        /// The shard (or index, manifest) file or URL.
        uri: String,
        /// Byte offset of the bad record or header in the shard.
        offset: u64,
        /// What kind of damage: what a caller (or Python's `CorruptDataError.kind`) tells
        /// apart.
        kind: Corruption,
        /// What was wrong and, where possible, what to do.
        reason: String,
    },
    /// The loader's options are invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A checkpoint cannot be restored.
    #[error(transparent)]
    State(#[from] StateError),
    /// A transform returned an error for a sample.
    #[error("transform failed on {sample}: {}", redact(&.source.to_string()))]
    Transform {
        /// The sample being transformed.
        sample: SampleRef,
        /// The transform's error.
        #[source]
        source: BoxError,
    },
    /// Samples of one batch disagree in a way that prevents collating them.
    #[error("cannot collate {sample}: {}", redact(.reason))]
    Collate {
        /// The first sample that disagreed with the batch's first sample.
        sample: SampleRef,
        /// What differed, and what to do.
        reason: String,
    },
    /// A worker thread panicked (in a transform or a reader) while handling a sample.
    #[error("worker panicked on {sample}: {}", redact(.message))]
    WorkerPanicked {
        /// The sample being handled.
        sample: SampleRef,
        /// The panic payload, when it was a string.
        message: String,
    },
}

impl Error {
    /// An [`Error::Io`] for `path`. Credentials in a URL, in `path` or in the cause's text,
    /// are hidden ([`redact`]).
    pub fn io(path: impl Into<String>, source: std::io::Error) -> Self {
        let source = match redact(&source.to_string()) {
            Cow::Owned(text) => std::io::Error::new(source.kind(), text),
            Cow::Borrowed(_) => source,
        };
        Error::Io {
            path: redacted(path.into()),
            source,
        }
    }

    /// An [`Error::Corrupt`] of kind [`Corruption::Malformed`] for `uri` at `offset`.
    pub fn corrupt(uri: impl Into<String>, offset: u64, reason: impl Into<String>) -> Self {
        Error::corrupt_as(Corruption::Malformed, uri, offset, reason)
    }

    /// An [`Error::Corrupt`] of `kind` for `uri` at `offset`.
    pub fn corrupt_as(
        kind: Corruption,
        uri: impl Into<String>,
        offset: u64,
        reason: impl Into<String>,
    ) -> Self {
        Error::Corrupt {
            uri: redacted(uri.into()),
            offset,
            kind,
            reason: redacted(reason.into()),
        }
    }

    /// An [`Error::Corrupt`] of kind [`Corruption::Truncated`]: the data ends at `offset`
    /// inside what `reason` names.
    pub fn truncated(uri: impl Into<String>, offset: u64, reason: impl Into<String>) -> Self {
        Error::corrupt_as(Corruption::Truncated, uri, offset, reason)
    }

    /// The kind of damage, for an [`Error::Corrupt`].
    pub fn corruption(&self) -> Option<Corruption> {
        match self {
            Error::Corrupt { kind, .. } => Some(*kind),
            _ => None,
        }
    }
}

/// The kinds of damage an [`Error::Corrupt`] reports, by what the user does next. The detail
/// is the error's `reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Corruption {
    /// The data ends inside a record, header or member: a partial download or copy, a write
    /// that was interrupted. Copy the file again.
    Truncated,
    /// A checksum does not match the bytes (TFRecord's CRC32C): bit rot or a bad copy.
    Checksum,
    /// Bytes that do not follow the format: a damaged file, or a file of another format.
    Malformed,
    /// An index or manifest that no longer describes its shard (the shard changed since it
    /// was written): run `chute index` again.
    StaleIndex,
    /// A size or count read from the data beyond what chute accepts (a record of 2^60 bytes):
    /// damaged data, or a limit to raise.
    TooLarge,
    /// Valid data of a kind chute does not read (a dtype, a compression, a tar entry type).
    Unsupported,
}

impl Corruption {
    /// Every kind, in declaration order.
    pub const ALL: [Corruption; 6] = [
        Corruption::Truncated,
        Corruption::Checksum,
        Corruption::Malformed,
        Corruption::StaleIndex,
        Corruption::TooLarge,
        Corruption::Unsupported,
    ];

    /// The kind's name (`truncated`, `checksum`, `malformed`, `stale_index`, `too_large`,
    /// `unsupported`): what Python's `CorruptDataError.kind` holds.
    pub fn name(self) -> &'static str {
        match self {
            Corruption::Truncated => "truncated",
            Corruption::Checksum => "checksum",
            Corruption::Malformed => "malformed",
            Corruption::StaleIndex => "stale_index",
            Corruption::TooLarge => "too_large",
            Corruption::Unsupported => "unsupported",
        }
    }

    /// What [`Error::Corrupt`]'s message puts before the reason: `truncated: ` for truncated
    /// data (a documented contract), nothing otherwise (the reason says it).
    fn prefix(self) -> &'static str {
        match self {
            Corruption::Truncated => "truncated: ",
            _ => "",
        }
    }
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Invalid options: the message names the option, the value received and the valid range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {option}: {reason}")]
pub struct ConfigError {
    /// The option, as the user spells it (`batch_size`, `rank`, ...).
    pub option: String,
    /// What was wrong with the value and what would be valid.
    pub reason: String,
}

impl ConfigError {
    /// A config error for `option`.
    pub fn new(option: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            option: option.into(),
            reason: redacted(reason.into()),
        }
    }
}

/// A checkpoint that does not fit this loader.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// The state was written by a format version this build does not know.
    #[error(
        "state format version {found} is not supported (this build reads version {supported}); \
             resume with the chute release that wrote it"
    )]
    Version {
        /// The version in the state.
        found: u32,
        /// The version this build writes and reads.
        supported: u32,
    },
    /// The state was taken on a source whose definition differs from this one's (its
    /// [`Source::definition_parts`](crate::Source::definition_parts): a mixture's).
    #[error(
        "state was taken on another mixture: its {} differ{} (the parts: the components' \
         fingerprints, the weights and schedule, the policy, the seeds, the batch size its \
         batches were stratified for); resume with the mixture and batch size the state was \
         taken with",
        differs.join(", "),
        if differs.len() == 1 { "s" } else { "" }
    )]
    Definition {
        /// The parts of the definition that differ: `weights`, `components`, `seeds`, ...
        differs: Vec<String>,
    },
    /// The state was taken on another dataset.
    #[error(
        "state was taken on another dataset (fingerprint {found}, this loader's is {expected}); \
             resume with the same shards, seq_len and sample counts"
    )]
    Dataset {
        /// Fingerprint in the state.
        found: String,
        /// Fingerprint of this loader's manifest.
        expected: String,
    },
    /// A field of the state does not match this loader's options.
    #[error("state has {field} = {found}, but this loader has {expected}; {hint}")]
    Mismatch {
        /// The field (`seed`, `shuffle`, `world_size`, ...).
        field: &'static str,
        /// The value in the state.
        found: String,
        /// The loader's value.
        expected: String,
        /// What to do.
        hint: &'static str,
    },
    /// The state could not be parsed.
    #[error("state is not valid: {0}")]
    Invalid(String),
}

/// What the loader does with a sample that fails to read, decode or transform.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OnError {
    /// Return the error from `next()` (the batch is lost, iteration may go on). The default.
    #[default]
    Raise,
    /// Count and report the failure in the stats, and put the sample at the next plan
    /// position in its place: the batch stays full and the stream deterministic.
    Skip,
}

impl std::fmt::Display for OnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OnError::Raise => "raise",
            OnError::Skip => "skip",
        })
    }
}

impl std::str::FromStr for OnError {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "raise" => Ok(OnError::Raise),
            "skip" => Ok(OnError::Skip),
            _ => Err(ConfigError::new(
                "on_error",
                format!("{s:?} is not a policy; use raise or skip"),
            )),
        }
    }
}
