//! What a chute loader reads: the one opener, and the sources made of other sources.
//!
//! - [`Opened::open`], [`open`], [`Dataset`], [`OpenOptions`]: the one way to open a dataset from
//!   shard files, URLs, brace patterns, globs, folders, a manifest or a mixture file, the
//!   format given or detected; what it opened is told back (the format, whether the source
//!   orders itself).
//! - [`mixture`]: weighted mixtures of sources ([`Mixture`]: exact proportions, schedules,
//!   policies), and mixture files ([`mixture::file`], JSON).
//! - [`Documents`]: where documents lie in token files (a Megatron index, flat files split at
//!   an end-of-sequence id, a tokenized list column, text tokenized when opened);
//!   [`PackedSource`]: documents packed into training rows (`concat`, `document`,
//!   `best_fit`, `pad`; [`pack`]).
//! - [`text_files`]: documents' text read in order from JSON Lines, Parquet, Arrow, tar,
//!   TFRecord or text files, each handed over by the opener, tokenized by a
//!   [`chute_core::TextEncoder`] (a trait object: this crate knows no tokenizer library).
//! - [`rows`]: rows of records (chat conversations, prompts and completions) read from the
//!   same files and encoded into ids and labels by a [`chute_core::RowEncoder`] (the facade's
//!   chat templates), for the packers.
//! - [`parse_token_text`], [`token_ids_from_npy`]: token ids from text or `.npy` arrays, to
//!   feed a `TokenWriter`.
//!
//! Single-format sources and codecs are `chute-formats`'; this crate builds on it, and only
//! the facade, the command line and the Python binding build on this one.

#![warn(missing_docs)]

pub mod documents;
mod ids;
pub mod mixture;
mod open;
mod options;
pub mod pack;
pub mod rows;
pub mod text_files;

pub use documents::Documents;
pub use ids::{parse_token_text, token_ids_from_npy};
pub use mixture::{Component, MixMode, Mixture, MixtureBuilder, Policy};
pub use open::{
    Dataset, Kind, MANIFEST_NAME, Opened, expand_files, open, open_records, open_rows, open_texts,
};
pub use options::{DEFAULT_SEQ_LEN, OpenOptions};
pub use pack::{Long, Pack, PackOptions, PackedSource};
