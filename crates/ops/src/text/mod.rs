//! Tokenization with Hugging Face's `tokenizers` (a `tokenizer.json`), for the `tokenize` op
//! and `chute tokenize`: the same ids the Python `tokenizers` package gives, on chute's
//! threads. Each file is loaded once per process and shared (a tokenizer is immutable and
//! thread-safe).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

mod words;

use words::Words;

/// A loaded `tokenizer.json`, compared by path.
#[derive(Clone)]
pub struct TextTokenizer {
    path: PathBuf,
    inner: Arc<tokenizers::Tokenizer>,
    /// Its word cache, where it is a byte-level BPE (see [`words`]).
    words: Option<Arc<Words>>,
}

/// A tokenizer as loaded, with its word cache.
type Loaded = (Arc<tokenizers::Tokenizer>, Option<Arc<Words>>);

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("path", &self.path)
            .finish()
    }
}

impl PartialEq for TextTokenizer {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path
    }
}

/// Ids and the byte range of the text each came from.
pub type Encoding = (Vec<u32>, Vec<(usize, usize)>);

/// How a text becomes ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EncodeOptions {
    /// The tokenizer's own special tokens (its post-processor: BERT's `[CLS] ... [SEP]`, a
    /// Llama BOS), as `tokenizer.encode(text)` adds them by default in Python.
    pub add_special_tokens: bool,
    /// An id put before the text's.
    pub bos: Option<u32>,
    /// An id put after the text's (Megatron's `--append-eod`).
    pub eos: Option<u32>,
    /// At most this many ids in all (BOS and EOS included; the text's are cut, its EOS kept).
    pub max_length: Option<usize>,
}

impl TextTokenizer {
    /// The tokenizer in `path` (a `tokenizer.json`), loaded on first use and shared.
    pub fn load(path: impl AsRef<Path>) -> Result<TextTokenizer, String> {
        static LOADED: OnceLock<Mutex<HashMap<PathBuf, Loaded>>> = OnceLock::new();
        let path = path.as_ref();
        let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let mut map = LOADED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some((t, words)) = map.get(&key) {
            return Ok(TextTokenizer {
                path: key,
                inner: Arc::clone(t),
                words: words.clone(),
            });
        }
        let t = tokenizers::Tokenizer::from_file(path).map_err(|e| {
            format!(
                "{}: not a tokenizer.json that Hugging Face's tokenizers reads: {e}",
                path.display()
            )
        })?;
        let words = Words::new(&t).map(Arc::new);
        let t = Arc::new(t);
        map.insert(key.clone(), (Arc::clone(&t), words.clone()));
        Ok(TextTokenizer {
            path: key,
            inner: t,
            words,
        })
    }

    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The id of token `token` (`"<|endoftext|>"`), if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Ids in the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The ids of `text`, with `options`' special tokens and length.
    pub fn encode(&self, text: &str, options: EncodeOptions) -> Result<Vec<u32>, String> {
        check_text_len(text.len())?;
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        ids.extend(options.bos);
        let fast = match &self.words {
            Some(w) if w.adds_nothing || !options.add_special_tokens => {
                w.encode(&self.inner, text, &mut ids, None)?
            }
            _ => false,
        };
        if !fast {
            let enc = self
                .inner
                .encode_fast(text, options.add_special_tokens)
                .map_err(|e| format!("the tokenizer failed: {e}"))?;
            ids.extend_from_slice(enc.get_ids());
        }
        if let Some(max) = options.max_length {
            let keep = max.saturating_sub(usize::from(options.eos.is_some()));
            ids.truncate(keep);
        }
        ids.extend(options.eos);
        Ok(ids)
    }

    /// The ids of a prompt and its response, for supervised fine-tuning: `bos`, the prompt's
    /// ids (with the tokenizer's special tokens when `add_special_tokens`), the response's
    /// (without), `eos`; cut to `max_length` (the response's end, its EOS kept). Returns the
    /// ids and how many of them are the prompt's (the labels mask those).
    pub fn encode_pair(
        &self,
        prompt: &str,
        response: &str,
        options: EncodeOptions,
    ) -> Result<(Vec<u32>, usize), String> {
        let head = EncodeOptions {
            eos: None,
            max_length: None,
            ..options
        };
        check_text_len(prompt.len().saturating_add(response.len()))?;
        let mut ids = self.encode(prompt, head)?;
        let prompt_len = ids.len();
        let fast = match &self.words {
            Some(w) => w.encode(&self.inner, response, &mut ids, None)?,
            None => false,
        };
        if !fast {
            let tail = self
                .inner
                .encode_fast(response, false)
                .map_err(|e| format!("the tokenizer failed: {e}"))?;
            ids.extend_from_slice(tail.get_ids());
        }
        if let Some(max) = options.max_length {
            ids.truncate(max.saturating_sub(usize::from(options.eos.is_some())));
        }
        ids.extend(options.eos);
        let n = prompt_len.min(ids.len());
        Ok((ids, n))
    }

    /// The ids of `text` and the byte range of `text` each came from, without the
    /// tokenizer's own special tokens (what `transformers` tokenizes a rendered chat with).
    pub fn encode_with_offsets(&self, text: &str) -> Result<Encoding, String> {
        check_text_len(text.len())?;
        if let Some(w) = self.words.as_ref().filter(|w| w.keeps_offsets) {
            let (mut ids, mut offsets) = (Vec::new(), Vec::new());
            if w.encode(&self.inner, text, &mut ids, Some(&mut offsets))? {
                return Ok((ids, offsets));
            }
        }
        self.encode_with_offsets_slowly(text)
    }

    /// [`Self::encode_with_offsets`] through `tokenizers`' `encode` and its `Encoding`,
    /// whatever the tokenizer.
    fn encode_with_offsets_slowly(&self, text: &str) -> Result<Encoding, String> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| format!("the tokenizer failed: {e}"))?;
        Ok((enc.get_ids().to_vec(), enc.get_offsets().to_vec()))
    }

    /// The text of every added token marked special (`<|im_end|>`, `</s>`, ...), longest
    /// first.
    pub fn special_tokens(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .inner
            .get_added_tokens_decoder()
            .into_values()
            .filter(|t| t.special && !t.content.is_empty())
            .map(|t| t.content)
            .collect();
        v.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        v
    }

    /// The text of `ids` (special tokens skipped when `skip_special`).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| format!("the tokenizer failed to decode: {e}"))
    }
}

/// Refuses a text longer than the process's
/// [`Limits::max_text_bytes`](chute_core::Limits) before the tokenizer sees it (tokenizing
/// takes about 20 times a text's size in memory: offsets, alignments, token strings).
fn check_text_len(len: usize) -> Result<(), String> {
    let limit = chute_core::Limits::current().max_text_bytes;
    if len as u64 > limit {
        return Err(chute_core::limits::exceeded(
            "the text",
            len as u64,
            "bytes",
            "max_text_bytes",
            limit,
        ));
    }
    Ok(())
}
