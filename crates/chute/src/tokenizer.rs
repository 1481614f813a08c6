//! Text tokenized on every core: [`Tokenizer`], a `tokenizer.json` (Hugging Face's
//! `tokenizers`, [`chute_ops::text::TextTokenizer`]) with its [`EncodeOptions`], as the
//! [`TextEncoder`] that [`crate::OpenOptions::tokenizer`] takes.
//!
//! ```no_run
//! use std::sync::Arc;
//! use chute::dataset::{Pack, PackOptions};
//! use chute::tokenizer::Tokenizer;
//! use chute::{OpenOptions, ops::text::EncodeOptions};
//!
//! let tokenizer = Tokenizer::load("tokenizer.json", EncodeOptions::default(), 0)?;
//! let eos = tokenizer.token_id("<|endoftext|>");
//! let options = OpenOptions {
//!     tokenizer: Some(Arc::new(tokenizer)),
//!     seq_len: Some(1024),
//!     pack: Some(PackOptions { pack: Pack::Concat, eos_id: eos, ..Default::default() }),
//!     ..Default::default()
//! };
//! let source = chute::open(&["corpus/*.jsonl"], &options)?; // windows of 1,025 tokens
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::Path;
use std::sync::Mutex;

use chute_core::{ConfigError, Error, TextEncoder, mix64};
use chute_ops::text::{EncodeOptions, TextTokenizer};
use chute_pipeline::for_each_parallel;

/// A tokenizer and its options, encoding batches of texts on `workers` threads.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: TextTokenizer,
    options: EncodeOptions,
    workers: usize,
    /// A hash of the `tokenizer.json`'s bytes.
    digest: u64,
}

impl Tokenizer {
    /// The `tokenizer.json` in `path`, encoding with `options` on `workers` threads (0: one
    /// per core).
    pub fn load(
        path: impl AsRef<Path>,
        options: EncodeOptions,
        workers: usize,
    ) -> Result<Tokenizer, Error> {
        let path = path.as_ref();
        let inner = TextTokenizer::load(path).map_err(|e| ConfigError::new("tokenizer", e))?;
        let bytes = std::fs::read(path).map_err(|e| Error::io(path.display().to_string(), e))?;
        let digest = bytes.chunks(8).fold(bytes.len() as u64, |h, c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            mix64(h ^ u64::from_le_bytes(w))
        });
        let workers = match workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        Ok(Tokenizer {
            inner,
            options,
            workers,
            digest,
        })
    }

    /// The id of `token`, if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_id(token)
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.inner
    }
}

impl TextEncoder for Tokenizer {
    fn encode_batch(&self, texts: &[String]) -> Result<Vec<Vec<u32>>, String> {
        // Small jobs, claimed in turn, so a long document does not hold the others up.
        let per = texts.len().div_ceil(self.workers * 8).max(1);
        let parts: Vec<Mutex<Vec<Vec<u32>>>> = (0..texts.len().div_ceil(per))
            .map(|_| Mutex::new(Vec::new()))
            .collect();
        for_each_parallel(parts.len(), self.workers, |j| -> Result<(), String> {
            let ids = texts[j * per..((j + 1) * per).min(texts.len())]
                .iter()
                .map(|t| self.inner.encode(t, self.options))
                .collect::<Result<Vec<_>, _>>()?;
            *parts[j].lock().unwrap_or_else(|e| e.into_inner()) = ids;
            Ok(())
        })?;
        Ok(parts
            .into_iter()
            .flat_map(|p| p.into_inner().unwrap_or_else(|e| e.into_inner()))
            .collect())
    }

    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn fingerprint(&self) -> String {
        let o = &self.options;
        format!(
            "{:016x}:special={}:bos={:?}:eos={:?}:max={:?}",
            self.digest, o.add_special_tokens, o.bos, o.eos, o.max_length
        )
    }
}
