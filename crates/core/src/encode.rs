//! Text to token ids, for sources that tokenize text when they are opened.
//!
//! The formats layer reads documents' text; what turns it into ids (Hugging Face's
//! `tokenizers` on every core, in the facade) is handed in as a [`TextEncoder`], so neither
//! layer depends on the other.

/// Turns texts into token ids.
pub trait TextEncoder: Send + Sync + std::fmt::Debug {
    /// The ids of each of `texts`, in order. The error says what failed.
    fn encode_batch(&self, texts: &[String]) -> Result<Vec<Vec<u32>>, String>;

    /// Every id is below this (the vocabulary with its added tokens).
    fn vocab_size(&self) -> usize;

    /// What identifies the tokenizer and its options (a hash of its file, the options), for
    /// the fingerprint of a source's manifest: other ids, another fingerprint.
    fn fingerprint(&self) -> String;
}

/// One row's token ids and labels, from a [`RowEncoder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EncodedRow {
    /// The ids and their labels (-100 where the loss does not count), as many of each.
    Kept {
        /// The ids.
        ids: Vec<u32>,
        /// The labels.
        labels: Vec<i64>,
        /// Whether the row was cut to a maximum length.
        truncated: bool,
    },
    /// Several rows' ids and labels: one row split (a conversation at turn boundaries).
    Split(Vec<(Vec<u32>, Vec<i64>)>),
    /// Left out, and why (a short name the source counts: `no_trained_token`, `too_long`).
    Skipped(&'static str),
}

/// A row as the opener hands it to a [`RowEncoder`]: a record, or the text of a JSON Lines
/// line, parsed by the encoder on its own threads.
#[derive(Debug, Clone, PartialEq)]
pub enum RowData {
    /// A record of the encoder's fields (those the row has).
    Record(crate::Value),
    /// One line of JSON Lines: an object, by what the file says.
    Json(bytes::Bytes),
}

/// Turns rows of records (chat conversations, prompts and completions) into token ids and
/// labels, for sources that encode them when they are opened.
pub trait RowEncoder: Send + Sync + std::fmt::Debug {
    /// The fields a row is read with (those a file lacks are left out of its rows).
    fn fields(&self) -> Vec<String>;

    /// Each of `rows` encoded, in order; an error says what was wrong with that row (a line
    /// that is not a JSON object included).
    fn encode_rows(&self, rows: &[RowData]) -> Vec<Result<EncodedRow, String>>;

    /// Every id is below this.
    fn vocab_size(&self) -> usize;

    /// What identifies the encoder and its options, for the fingerprint of a source.
    fn fingerprint(&self) -> String;
}
