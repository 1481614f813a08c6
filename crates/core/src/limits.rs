//! Bounds on what a size read from the data may make chute allocate.
//!
//! A file declares sizes (an image's pixels, a tar member's length, a Parquet page's
//! uncompressed size, a TFRecord's length) before the bytes that fill them. chute checks
//! every such size against a limit *before* allocating for it, so a decompression bomb or a
//! bit flip in a header is a data error naming the sample, the field, the declared size and
//! the limit to raise (a counted skip under `on_error="skip"`), never an aborted process.
//!
//! The limits are process-wide, as PIL's `Image.MAX_IMAGE_PIXELS` is: [`Limits::current`]
//! reads them, [`Limits::install`] replaces them (Python: `chute.set_limits(...)`; the CLI:
//! `--limit NAME=N`). Sources and transforms read them when opened or built (some checks
//! read them again when they run): set them before opening the data. Sizes a format can
//! check against the bytes actually present (an index's entry count, a `.npy` shape, a
//! Megatron `.idx`'s sequence count) are checked
//! against those bytes instead and need no limit.
//!
//! ```
//! use chute_core::Limits;
//!
//! let raised = Limits::current().with("max_image_pixels", 1 << 30)?;
//! assert_eq!(raised.max_image_pixels, 1 << 30);
//! assert!(Limits::current().with("max_pixels", 1).is_err()); // names the five limits
//! # Ok::<(), chute_core::ConfigError>(())
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

use crate::ConfigError;

/// The limits, by name. Every field is a count or a size in bytes; 0 is not allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Pixels an image's header may declare before it is decoded (default 178,956,970:
    /// twice PIL's warning threshold, where PIL raises `DecompressionBombError`). The
    /// `decode` op's own `max_pixels` overrides it for that op.
    pub max_image_pixels: u64,
    /// Bytes one stored record may declare: a tar member, a TFRecord record (default 1 GiB).
    pub max_record_bytes: u64,
    /// Bytes one unit may decode or decompress to: a Parquet page, a dictionary page's
    /// values, a Parquet column of a row group and the columns read from it together, an
    /// Arrow record batch (default 1 GiB).
    pub max_decoded_bytes: u64,
    /// Features in one `tf.train.Example` (default 100,000).
    pub max_features: u64,
    /// Bytes of text handed to a tokenizer at once (one document, or a prompt and its
    /// response; default 16 MiB: tokenizing takes about 20 times a text's size in memory).
    pub max_text_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_image_pixels: 178_956_970,
            max_record_bytes: 1 << 30,
            max_decoded_bytes: 1 << 30,
            max_features: 100_000,
            max_text_bytes: 16 << 20,
        }
    }
}

/// The process's limits, in [`Limits::NAMES`] order (0 until first installed: the defaults).
static CURRENT: [AtomicU64; 5] = [
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
];

impl Limits {
    /// The limits' names, as options spell them.
    pub const NAMES: [&'static str; 5] = [
        "max_image_pixels",
        "max_record_bytes",
        "max_decoded_bytes",
        "max_features",
        "max_text_bytes",
    ];

    /// The limits in force in this process.
    pub fn current() -> Limits {
        let d = Limits::default().values();
        let mut v = [0u64; 5];
        for (i, slot) in CURRENT.iter().enumerate() {
            v[i] = match slot.load(Ordering::Relaxed) {
                0 => d[i],
                x => x,
            };
        }
        Limits::from_values(v)
    }

    /// Makes `self` the limits in force in this process (every source checks against them
    /// from now on, open ones included).
    pub fn install(self) {
        for (slot, v) in CURRENT.iter().zip(self.values()) {
            slot.store(v, Ordering::Relaxed);
        }
    }

    /// `self` with limit `name` set to `value`; an unknown name or 0 is refused.
    pub fn with(self, name: &str, value: u64) -> Result<Limits, ConfigError> {
        let Some(i) = Limits::NAMES.iter().position(|n| *n == name) else {
            return Err(ConfigError::new(
                "limits",
                format!(
                    "{name:?} is not a limit; chute has {}",
                    Limits::NAMES.join(", ")
                ),
            ));
        };
        if value == 0 {
            return Err(ConfigError::new(
                name,
                "0 would refuse everything; pass a positive count or size",
            ));
        }
        let mut v = self.values();
        v[i] = value;
        Ok(Limits::from_values(v))
    }

    /// `self` with a `NAME=VALUE` assignment applied (the CLI's `--limit`); the value may be
    /// written with `_` separators (`1_000_000`).
    pub fn with_assignment(self, assignment: &str) -> Result<Limits, ConfigError> {
        let Some((name, value)) = assignment.split_once('=') else {
            return Err(ConfigError::new(
                "limit",
                format!(
                    "{assignment:?}: write NAME=VALUE, NAME one of {}",
                    Limits::NAMES.join(", ")
                ),
            ));
        };
        let value: u64 = value.trim().replace('_', "").parse().map_err(|_| {
            ConfigError::new(name.trim(), format!("{value:?} is not a whole number"))
        })?;
        self.with(name.trim(), value)
    }

    /// The limits as `(name, value)` pairs, in [`Limits::NAMES`] order.
    pub fn pairs(&self) -> [(&'static str, u64); 5] {
        let v = self.values();
        std::array::from_fn(|i| (Limits::NAMES[i], v[i]))
    }

    fn values(&self) -> [u64; 5] {
        [
            self.max_image_pixels,
            self.max_record_bytes,
            self.max_decoded_bytes,
            self.max_features,
            self.max_text_bytes,
        ]
    }

    fn from_values(v: [u64; 5]) -> Limits {
        Limits {
            max_image_pixels: v[0],
            max_record_bytes: v[1],
            max_decoded_bytes: v[2],
            max_features: v[3],
            max_text_bytes: v[4],
        }
    }
}

/// The reason of an error for a declared size over limit `name` (`limit` its value):
/// `what` declares `declared` `unit`, more than the limit, and how to raise it.
///
/// ```
/// let r = chute_core::limits::exceeded("member x.jpg", 1u64 << 33, "bytes", "max_record_bytes", 1 << 30);
/// assert!(r.contains("declares 8589934592 bytes") && r.contains("max_record_bytes = 1073741824"));
/// ```
pub fn exceeded(
    what: &str,
    declared: impl std::fmt::Display,
    unit: &str,
    name: &str,
    limit: u64,
) -> String {
    format!(
        "{what} declares {declared} {unit}, more than {name} = {limit} (a corrupt or hostile \
         file, such as a decompression bomb, or a very large one: raise the limit with \
         chute.set_limits({name}=...) in Python, --limit {name}=... on the command line or \
         chute_core::Limits in Rust)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_values_and_assignments() {
        let l = Limits::default();
        assert_eq!(l.pairs().map(|(n, _)| n), Limits::NAMES);
        let l = l.with_assignment("max_features = 1_000").unwrap();
        assert_eq!(l.max_features, 1000);
        assert_eq!(l.with("max_text_bytes", 7).unwrap().max_text_bytes, 7);
        let e = l.with("max_pixels", 3).unwrap_err();
        assert!(e.reason.contains("max_image_pixels"), "{e}");
        assert!(l.with("max_features", 0).is_err());
        assert!(l.with_assignment("max_features").is_err());
        assert!(l.with_assignment("max_features=lots").is_err());
    }
}
