//! chute's sample transforms, run on the loader's worker threads.
//!
//! - [`Transform`]: the trait (closures implement it), with its randomness contract.
//! - [`Compose`]: several transforms in order.
//! - [`Cast`], [`Select`], [`Rename`]: field-level conveniences. `Cast` is fused into
//!   collation, so `u16` tokens become `int64` in the batch without an extra pass.
//!
//! - [`SampleOps`] ([`spec`]): ops per field declared as data (JSON), the same from Rust, the
//!   CLI and Python: image decoding and torchvision-style augmentation ([`image`]), labels,
//!   `.npy`, JSON and text; audio decoding, resampling and speech features ([`audio`]); video clips (`video`,
//!   feature `video`). The ops are checked and compiled into steps when it is built,
//!   with the fusions decided then (region decoding, writing straight into the batch slot).
//! - [`BadData`]: a sample's field the ops cannot use, and what was wrong with it, an
//!   [`OpError`] (an undecodable, unsupported or too large image, a bad label, ...).
//!
//! ```
//! use chute_core::{Array, BoxError, DType, Field, Sample, SampleRng};
//! use chute_ops::{Cast, Compose, Transform};
//!
//! let t = Compose::new()
//!     .then(Cast::new("tokens", DType::I64))
//!     .then(|s: &mut Sample, rng: &mut SampleRng| -> Result<(), BoxError> {
//!         if rng.chance(0.5) { s.key.push_str("-flipped"); }
//!         Ok(())
//!     });
//! let mut s = Sample::new(0).with("tokens",
//!     Field::Array(Array::new(DType::U16, vec![1], bytes::Bytes::from_static(&[7, 0]))));
//! t.apply(&mut s, &mut SampleRng::for_sample(1, 0, 0)).unwrap();
//! ```

#![warn(missing_docs)]

#[cfg(feature = "audio")]
pub mod audio;
#[cfg(feature = "chat")]
pub mod chat;
mod error;
mod files;
pub mod image;
mod jpeg;
#[cfg(feature = "libjpeg")]
mod libjpeg;
pub mod members;
mod pixels;
pub mod spec;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(feature = "tokenizers")]
pub mod text;
#[cfg(feature = "video")]
pub mod video;

pub use chute_core::{Cast, Compose, Rename, Select, Slot, Transform};
pub use error::{BadData, OpError};
pub use spec::{FieldOps, Op, SampleOps};
