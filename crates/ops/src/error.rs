//! The ops layer's errors: [`OpError`] says what was wrong with a value (an undecodable image,
//! a label that is not a number, ...), [`BadData`] adds the sample's field it was found in.
//!
//! A [`SampleOps`](crate::SampleOps) fails a sample with a [`BadData`] (boxed, as every
//! transform's error is); the loader reports it with the sample's key and shard, and with
//! `on_error = skip` the sample is counted and replaced. The Python bindings raise every
//! [`BadData`] as `chute.CorruptDataError`.

use std::fmt;
use std::str::Utf8Error;

use chute_core::Corruption;

use crate::image::ImageFormat;

/// What an op found wrong with the value it was given, by what the caller does next. The
/// image API ([`crate::image`]) returns it too. Free text (`reason`) is the detail: the
/// decoder's own message, the value received.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpError {
    /// The bytes are no image format chute decodes (JPEG and PNG, told by their signature):
    /// the field holds something else, or the images need converting.
    #[error("not a JPEG or PNG image ({})", describe_start(*.len, .head))]
    NotAnImage {
        /// The number of bytes.
        len: usize,
        /// Their first bytes (up to 8).
        head: Vec<u8>,
    },
    /// A JPEG or PNG that is corrupt or cut short: repair the file, or skip the sample.
    #[error("corrupt or truncated {format}: {reason}")]
    CorruptImage {
        /// The image's format.
        format: ImageFormat,
        /// What the decoder found.
        reason: String,
    },
    /// A JPEG or PNG that uses a feature chute's decoders lack (12-bit samples, arithmetic
    /// coding in a build without it, ...): convert the image.
    #[error("unsupported {format}: {reason}")]
    UnsupportedImage {
        /// The image's format.
        format: ImageFormat,
        /// The feature, as the decoder names it.
        reason: String,
    },
    /// An image whose dimensions exceed the decoder's limits or memory.
    #[error("{format} too large to decode: {reason}")]
    ImageTooLarge {
        /// The image's format.
        format: ImageFormat,
        /// The limit, as the decoder states it.
        reason: String,
    },
    /// `label` bytes that are not an integer.
    #[error("label {label:?} is not an integer (a cls or txt field holding a class index is)")]
    BadLabel {
        /// The label's text (its first 40 characters; undecodable bytes replaced).
        label: String,
    },
    /// `npy` bytes that are not a single `.npy` array.
    #[error("{reason}")]
    BadNpy {
        /// The kind of damage the `.npy` reader found (truncated, unsupported dtype, ...).
        kind: Corruption,
        /// What the `.npy` reader found.
        reason: String,
    },
    /// `json` bytes that are not JSON, or a JSON value `json` does not take.
    #[error("{reason}")]
    BadJson {
        /// What was wrong, and what `json` takes.
        reason: String,
    },
    /// A WebDataset member (msgpack, `.npz`, tenbin, a pickle) that its op cannot decode.
    #[error("{format}: {reason}")]
    BadMember {
        /// The member's format (`msgpack`, `npz`, `tenbin`, `pickle`).
        format: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// `text` bytes that are not UTF-8.
    #[error("not UTF-8 text: {source}")]
    NotUtf8 {
        /// Where the bytes stop being UTF-8.
        source: Utf8Error,
    },
    /// A value or argument the op cannot take though the pipeline's ops fit together: an
    /// array that is not `[H, W, C]` before `chw`, a mean per channel for another number of
    /// channels, a resize to 0 pixels.
    #[error("{op}: {reason}")]
    WrongInput {
        /// The op (or image function) that refused it.
        op: &'static str,
        /// What it got and what it takes.
        reason: String,
    },
    /// The bytes are in no audio container chute reads (WAV, AIFF, CAF, FLAC, MP3, Ogg,
    /// MKV/WebM, MP4/M4A, ADTS AAC, told by their content).
    #[error("not audio chute decodes ({})", describe_start(*.len, .head))]
    NotAudio {
        /// The number of bytes.
        len: usize,
        /// Their first bytes (up to 8).
        head: Vec<u8>,
    },
    /// An audio stream that is corrupt or cut short: repair the file, or skip the sample.
    #[error("corrupt or truncated audio: {reason}")]
    CorruptAudio {
        /// What the demuxer or decoder found.
        reason: String,
    },
    /// An audio codec or container feature chute's decoders lack, or a codec library that
    /// is not installed (libopus): the message says which.
    #[error("unsupported audio: {reason}")]
    UnsupportedAudio {
        /// What is missing.
        reason: String,
    },
    /// Audio beyond the op's limits (channels, rate, seconds decoded).
    #[error("audio too large: {reason}; raise the op's limit if that much is expected")]
    AudioTooLarge {
        /// The limit and what the stream has.
        reason: String,
    },
    /// The bytes are in no container the system's FFmpeg reads, or hold no video stream.
    #[error("not video chute decodes ({}): {reason}", describe_start(*.len, .head))]
    NotVideo {
        /// The number of bytes.
        len: usize,
        /// Their first bytes (up to 8).
        head: Vec<u8>,
        /// What FFmpeg's demuxers said.
        reason: String,
    },
    /// A video stream that is corrupt or cut short: repair the file, or skip the sample.
    #[error("corrupt or truncated video: {reason}")]
    CorruptVideo {
        /// What the demuxer, the decoder or the sampler found.
        reason: String,
    },
    /// A codec or pixel format the system's FFmpeg lacks: the message says which.
    #[error("unsupported video: {reason}")]
    UnsupportedVideo {
        /// What is missing.
        reason: String,
    },
    /// Video beyond the op's limits (pixels per frame, frames, bytes of a sample's clips).
    #[error("video too large: {reason}; raise the op's limit if that much is expected")]
    VideoTooLarge {
        /// The limit and what the stream has.
        reason: String,
    },
    /// The sample has none of the names the pipeline looks for: name the field the data has,
    /// or mark it optional.
    #[error("no such field (the sample has {have:?})")]
    MissingField {
        /// The names the sample has.
        have: Vec<String>,
    },
    /// The field holds a value the ops do not start from (they take bytes or an array).
    #[error("holds {holds}, not bytes")]
    NotBytes {
        /// What the field holds ([`chute_core::Field::describe`]).
        holds: String,
    },
}

/// `"12 bytes starting ff d8 ff e0 ..."`: what a buffer that is not an image starts with.
fn describe_start(len: usize, head: &[u8]) -> String {
    let head: Vec<String> = head.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{len} bytes starting {}",
        if head.is_empty() {
            "with nothing".to_string()
        } else {
            head.join(" ")
        }
    )
}

impl OpError {
    /// The kind of damage, in the vocabulary of [`chute_core::Error::Corrupt`]: what Python's
    /// `CorruptDataError.kind` holds for a sample an op refused.
    pub fn corruption(&self) -> Corruption {
        match self {
            OpError::UnsupportedImage { .. }
            | OpError::UnsupportedAudio { .. }
            | OpError::UnsupportedVideo { .. } => Corruption::Unsupported,
            OpError::ImageTooLarge { .. }
            | OpError::AudioTooLarge { .. }
            | OpError::VideoTooLarge { .. } => Corruption::TooLarge,
            OpError::BadNpy { kind, .. } => *kind,
            _ => Corruption::Malformed,
        }
    }

    /// An [`OpError::NotAnImage`] for `data`.
    pub(crate) fn not_an_image(data: &[u8]) -> OpError {
        OpError::NotAnImage {
            len: data.len(),
            head: data.iter().take(8).copied().collect(),
        }
    }

    /// An [`OpError::CorruptImage`].
    pub(crate) fn corrupt(format: ImageFormat, reason: impl Into<String>) -> OpError {
        OpError::CorruptImage {
            format,
            reason: reason.into(),
        }
    }

    /// An [`OpError::WrongInput`].
    pub(crate) fn wrong_input(op: &'static str, reason: impl Into<String>) -> OpError {
        OpError::WrongInput {
            op,
            reason: reason.into(),
        }
    }
}

/// A sample whose data a [`SampleOps`](crate::SampleOps) cannot use: the field and what was
/// wrong with it. The message names both.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BadData {
    /// The field, as the sample names it; for [`OpError::MissingField`], the names looked
    /// for, `;`-separated.
    pub field: String,
    /// What was wrong.
    pub error: OpError,
}

impl BadData {
    /// `error` found in `field`.
    pub fn new(field: impl Into<String>, error: OpError) -> BadData {
        BadData {
            field: field.into(),
            error,
        }
    }
}

impl fmt::Display for BadData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let field = &self.field;
        match &self.error {
            OpError::MissingField { have } => write!(
                f,
                "no field {field:?} (the sample has {have:?}); name the field the data has, or \
                 mark it optional"
            ),
            OpError::NotBytes { holds } => write!(f, "field {field:?} holds {holds}, not bytes"),
            error => write!(f, "field {field:?}: {error}"),
        }
    }
}

/// The message already holds the [`OpError`]'s text, so it is not repeated as a source; read
/// it from [`BadData::error`].
impl std::error::Error for BadData {}
