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
