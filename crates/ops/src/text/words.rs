//! A byte-level BPE's ids and offsets without building an `Encoding`: the tokenizer's own
//! added-token split, normalizer and pre-tokenizer cut the text into words, and each word's
//! tokens come from a cache of what the model gave for it.
//!
//! `Tokenizer::encode` builds, for every token, its string (a copy of the vocabulary's),
//! its word index, type id and masks, then a copy of all of it in the post-processor; for
//! the ids and byte offsets a chat's labels need, that is most of the tokenizer's time after
//! the regex. A BPE without dropout gives a word the same tokens every time, so the tokens of
//! each word seen are kept here (ids and the span of the word's characters each covers), and
//! a word seen before costs a hash lookup.
//!
//! The offsets are `encode`'s exactly: after the byte-level step each character of a word
//! stands for one byte of the text it came from, and `encode` maps a token back to the
//! bytes of the whole characters of the text its bytes belong to. That holds only where the
//! word is the byte-level form of its part of the text: every word is checked against it
//! (a normalizer that changed the text, a prefix space), and a text with a word that is not
//! goes through `encode`. [`Words::new`] takes only tokenizers whose steps are known to keep
//! it (a BPE without dropout, a byte-level last pre-tokenizer without a prefix space, no
//! truncation or padding, post-processors that keep the ids without special tokens), and
//! makes offsets only where the post-processor leaves them alone (GPT-2's trims them: its ids
//! are made here, its offsets by `encode`).
//!
//! Where the tokenizer's steps are few and plain (added tokens that neither strip nor are
//! normalized, no normalizer or NFC, split regexes isolating their matches, then the byte-level
//! step: GPT-2's, Llama 3's and Qwen's `tokenizer.json`), the words are cut here too
//! ([`Direct`]): the added tokens found as `tokenizers` finds them (leftmost longest), the
//! tokenizer's own regexes run over the rest, and a word seen before is looked up by its text,
//! without `tokenizers`' `NormalizedString` (a copy of the text, an alignment per byte, a string
//! per split and per transform). A text NFC would change goes the checked way above.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;

use aho_corasick::{AhoCorasick, MatchKind};
use tokenizers::models::ModelWrapper;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::split::SplitPattern;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::utils::SysRegex;
use tokenizers::{
    Model, OffsetReferential, OffsetType, PreTokenizer, SplitDelimiterBehavior, Tokenizer,
};

/// Words kept per shard (131,072 in all, a few MB); past it, new words are tokenized but not
/// kept (as `tokenizers`' own cache does).
const SHARD_WORDS: usize = 1 << 13;
const SHARDS: usize = 16;

/// A token of a cached word: its id and the characters `[start, end)` of the word it covers.
type Piece = (u32, u32, u32);

/// A shard of the cache: words and their tokens.
type Shard = Mutex<HashMap<Box<str>, Box<[Piece]>, BuildHasherDefault<Fx>>>;

/// The word cache of one tokenizer, and what its post-processor adds.
pub(super) struct Words {
    /// Keyed by a word's text (the byte-level form is one-to-one with it).
    shards: Vec<Shard>,
    /// Where the words can be cut here.
    direct: Option<Direct>,
    /// The post-processor adds no token even with `add_special_tokens` (none, or byte-level).
    pub(super) adds_nothing: bool,
    /// The post-processor leaves the offsets alone (else only ids are made here).
    pub(super) keeps_offsets: bool,
}

impl Words {
    /// The cache for `t`, or `None` when its ids or offsets could differ from
    /// `t.encode(text, false)`'s done this way.
    pub(super) fn new(t: &Tokenizer) -> Option<Words> {
        let ModelWrapper::BPE(bpe) = t.get_model() else {
            return None;
        };
        if bpe.dropout.is_some_and(|p| p > 0.0) {
            return None;
        }
        if t.get_truncation().is_some() || t.get_padding().is_some() {
            return None;
        }
        if t.get_added_vocabulary().get_encode_special_tokens() {
            return None;
        }
        if !last_is_byte_level(t.get_pre_tokenizer()?) {
            return None;
        }
        let post = match t.get_post_processor() {
            None => Post {
                adds_nothing: true,
                keeps_offsets: true,
            },
            Some(p) => post(p)?,
        };
        Some(Words {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            direct: Direct::new(t),
            adds_nothing: post.adds_nothing,
            keeps_offsets: post.keeps_offsets,
        })
    }

    /// The ids of `text` (appended to `ids`) and, where `offsets` is given, the byte range
    /// of `text` each came from, as `t.encode(text, false)` gives them; `false` (and `ids`,
    /// `offsets` as they were) where a word is not the byte-level form of its text, for the
    /// caller to use `encode`.
    pub(super) fn encode(
        &self,
        t: &Tokenizer,
        text: &str,
        ids: &mut Vec<u32>,
        mut offsets: Option<&mut Vec<(usize, usize)>>,
    ) -> Result<bool, String> {
        let (n_ids, n_offsets) = (ids.len(), offsets.as_ref().map_or(0, |o| o.len()));
        let cut_back = |ids: &mut Vec<u32>, offsets: Option<&mut Vec<(usize, usize)>>| {
            ids.truncate(n_ids);
            if let Some(o) = offsets {
                o.truncate(n_offsets);
            }
        };
        if let Some(d) = &self.direct {
            if d.encode(self, t, text, ids, offsets.as_deref_mut())? {
                return Ok(true);
            }
            cut_back(ids, offsets.as_deref_mut());
        }
        if self.encode_checked(t, text, ids, offsets.as_deref_mut())? {
            return Ok(true);
        }
        cut_back(ids, offsets);
        Ok(false)
    }

    /// [`Self::encode`] through `tokenizers`' own split, each word checked; `false` (what
    /// it appended left for the caller to cut) where a word is not the byte-level form of
    /// its text.
    fn encode_checked(
        &self,
        t: &Tokenizer,
        text: &str,
        ids: &mut Vec<u32>,
        mut offsets: Option<&mut Vec<(usize, usize)>>,
    ) -> Result<bool, String> {
        let failed = |e: tokenizers::Error| format!("the tokenizer failed: {e}");
        let mut pre = t
            .get_added_vocabulary()
            .extract_and_normalize(t.get_normalizer(), text);
        if let Some(p) = t.get_pre_tokenizer() {
            p.pre_tokenize(&mut pre).map_err(failed)?;
        }
        let bytes = text.as_bytes();
        for (word, (start, end), tokens) in
            pre.get_splits(OffsetReferential::Original, OffsetType::Byte)
        {
            if let Some(tokens) = tokens {
                // An added token: the text itself, not normalized.
                let [tok] = tokens.as_slice() else {
                    return Ok(false);
                };
                if text.get(start..end) != Some(word) || tok.offsets != (0, word.len()) {
                    return Ok(false);
                }
                ids.push(tok.id);
                if let Some(o) = offsets.as_deref_mut() {
                    o.push((start, end));
                }
                continue;
            }
            if word.is_empty() {
                continue;
            }
            if end < start || !is_byte_level_of(word, bytes.get(start..end).unwrap_or(&[])) {
                return Ok(false);
            }
            let Some(key) = text.get(start..end) else {
                return Ok(false);
            };
            if !self.word(t, key, Some(word), start, text, ids, offsets.as_deref_mut())? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The tokens of the word `key` (the text's bytes from `start`), from the cache or from
    /// the model (given the word's byte-level form, or making it), emitted; `false` where the
    /// model's tokens do not fall on the word's characters.
    #[allow(clippy::too_many_arguments)]
    fn word(
        &self,
        t: &Tokenizer,
        key: &str,
        byte_level: Option<&str>,
        start: usize,
        text: &str,
        ids: &mut Vec<u32>,
        offsets: Option<&mut Vec<(usize, usize)>>,
    ) -> Result<bool, String> {
        let shard = &self.shards[(fx(key.as_bytes()) as usize) % SHARDS];
        {
            let cache = shard.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(pieces) = cache.get(key) {
                emit(pieces, text, start, ids, offsets);
                return Ok(true);
            }
        }
        let made;
        let word = match byte_level {
            Some(w) => w,
            None => {
                made = key
                    .bytes()
                    .map(|b| BYTE_CHARS[b as usize])
                    .collect::<String>();
                &made
            }
        };
        let tokens = t
            .get_model()
            .tokenize(word)
            .map_err(|e| format!("the tokenizer failed: {e}"))?;
        let mut pieces = Vec::with_capacity(tokens.len());
        for tok in &tokens {
            let (a, b) = tok.offsets;
            let (Some(head), Some(body)) = (word.get(..a), word.get(a..b)) else {
                return Ok(false);
            };
            let a = head.chars().count();
            let b = a + body.chars().count();
            pieces.push((tok.id, a as u32, b as u32));
        }
        emit(&pieces, text, start, ids, offsets);
        let mut cache = shard.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() < SHARD_WORDS {
            cache.insert(key.into(), pieces.into_boxed_slice());
        }
        Ok(true)
    }
}

/// GPT-2's split, which the byte-level pre-tokenizer runs with `use_regex` (its text, as
/// `tokenizers` compiles it).
const GPT2_SPLIT: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// A tokenizer's words cut without `tokenizers`' `NormalizedString` (see the module
/// documentation).
struct Direct {
    /// The added tokens, matched leftmost-longest as `tokenizers`' trie matches them, and
    /// their ids by pattern.
    added: Option<(AhoCorasick, Vec<u32>)>,
    /// The pre-tokenizer's splits in order, each isolating its matches.
    splits: Vec<SysRegex>,
    /// The normalizer is NFC: a text with a piece NFC would change goes the checked way
    /// (`tokenizers`' own NFC tables say which).
    nfc: bool,
}

impl Direct {
    fn new(t: &Tokenizer) -> Option<Direct> {
        let nfc = match t.get_normalizer() {
            None => false,
            Some(NormalizerWrapper::NFC(_)) => true,
            Some(_) => return None,
        };
        let steps = match t.get_pre_tokenizer()? {
            PreTokenizerWrapper::Sequence(s) => s.as_ref(),
            p => std::slice::from_ref(p),
        };
        let (PreTokenizerWrapper::ByteLevel(last), rest) = steps.split_last()? else {
            return None;
        };
        let mut splits = Vec::new();
        for step in rest {
            match step {
                PreTokenizerWrapper::Split(s)
                    if !s.invert && s.behavior == SplitDelimiterBehavior::Isolated =>
                {
                    let SplitPattern::Regex(r) = &s.pattern else {
                        return None;
                    };
                    splits.push(SysRegex::new(r).ok()?);
                }
                _ => return None,
            }
        }
        if last.add_prefix_space {
            return None;
        }
        if last.use_regex {
            splits.push(SysRegex::new(GPT2_SPLIT).ok()?);
        }
        let mut pairs: Vec<(u32, &str)> = Vec::new();
        for (&id, tok) in t.get_added_vocabulary().get_added_tokens_decoder() {
            if tok.normalized || tok.lstrip || tok.rstrip || tok.single_word {
                return None;
            }
            if tok.content.is_empty() {
                return None;
            }
            pairs.push((id, &tok.content));
        }
        pairs.sort();
        let added = if pairs.is_empty() {
            None
        } else {
            let ac = AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(pairs.iter().map(|p| p.1))
                .ok()?;
            Some((ac, pairs.iter().map(|p| p.0).collect()))
        };
        Some(Direct { added, splits, nfc })
    }

    /// As [`Words::encode`]; `false` (ids and offsets to be cut back by the caller) where the
    /// text must go the checked way.
    fn encode(
        &self,
        words: &Words,
        t: &Tokenizer,
        text: &str,
        ids: &mut Vec<u32>,
        mut offsets: Option<&mut Vec<(usize, usize)>>,
    ) -> Result<bool, String> {
        let mut spans = Vec::new();
        let mut found = self.added.as_ref().map(|(ac, _)| ac.find_iter(text));
        let mut at = 0;
        loop {
            let next = found.as_mut().and_then(|f| f.next());
            let end = next.as_ref().map_or(text.len(), |m| m.start());
            if at < end {
                let piece = &text[at..end];
                if self.nfc && !piece.is_ascii() && !unicode_normalization_alignments::is_nfc(piece)
                {
                    return Ok(false);
                }
                spans.clear();
                self.cut(0, text, at, end, &mut spans);
                for &(a, b) in &spans {
                    let ok =
                        words.word(t, &text[a..b], None, a, text, ids, offsets.as_deref_mut())?;
                    if !ok {
                        return Ok(false);
                    }
                }
            }
            let Some(m) = next else {
                break;
            };
            if let Some((_, by_pattern)) = &self.added {
                ids.push(by_pattern[m.pattern().as_usize()]);
            }
            if let Some(o) = offsets.as_deref_mut() {
                o.push((m.start(), m.end()));
            }
            at = m.end();
        }
        Ok(true)
    }

    /// The words of `text[a..b]` after split `step` and those after it, into `spans`
    /// (non-empty, in order).
    fn cut(&self, step: usize, text: &str, a: usize, b: usize, spans: &mut Vec<(usize, usize)>) {
        let Some(re) = self.splits.get(step) else {
            if a < b {
                spans.push((a, b));
            }
            return;
        };
        let piece = &text[a..b];
        if piece.is_empty() {
            return;
        }
        let mut prev = 0;
        for (s, e) in re.find_iter(piece) {
            if prev != s {
                self.cut(step + 1, text, a + prev, a + s, spans);
            }
            self.cut(step + 1, text, a + s, a + e, spans);
            prev = e;
        }
        if prev != piece.len() {
            self.cut(step + 1, text, a + prev, b, spans);
        }
    }
}

/// The ids of a word's `pieces`, and the bytes of `text` each covers (the word starts at byte
/// `start`; whole characters of `text`, as `encode` maps them).
fn emit(
    pieces: &[Piece],
    text: &str,
    start: usize,
    ids: &mut Vec<u32>,
    offsets: Option<&mut Vec<(usize, usize)>>,
) {
    ids.extend(pieces.iter().map(|p| p.0));
    if let Some(o) = offsets {
        o.extend(pieces.iter().map(|&(_, a, b)| {
            (
                char_start(text, start + a as usize),
                char_end(text, start + b as usize),
            )
        }));
    }
}

/// Whether the last step of `p` is the byte-level one, without a prefix space.
fn last_is_byte_level(p: &PreTokenizerWrapper) -> bool {
    match p {
        PreTokenizerWrapper::ByteLevel(b) => !b.add_prefix_space,
        PreTokenizerWrapper::Sequence(s) => s.as_ref().last().is_some_and(last_is_byte_level),
        _ => false,
    }
}

/// What post-processor `p` does to an encoding: `None` where it may change the ids without
/// special tokens.
fn post(p: &PostProcessorWrapper) -> Option<Post> {
    match p {
        PostProcessorWrapper::ByteLevel(b) => Some(Post {
            adds_nothing: true,
            keeps_offsets: !b.trim_offsets,
        }),
        // Without special tokens a template keeps the sequence as it is.
        PostProcessorWrapper::Template(_) => Some(Post {
            adds_nothing: false,
            keeps_offsets: true,
        }),
        PostProcessorWrapper::Sequence(s) => s.as_ref().iter().try_fold(
            Post {
                adds_nothing: true,
                keeps_offsets: true,
            },
            |all, p| {
                let one = post(p)?;
                Some(Post {
                    adds_nothing: all.adds_nothing && one.adds_nothing,
                    keeps_offsets: all.keeps_offsets && one.keeps_offsets,
                })
            },
        ),
        _ => None,
    }
}

/// What a post-processor does to ids and offsets without special tokens (it keeps the ids).
#[derive(Clone, Copy)]
struct Post {
    /// It adds no token with special tokens either.
    adds_nothing: bool,
    /// It leaves the offsets alone (a byte-level one that trims them does not).
    keeps_offsets: bool,
}

/// Whether `word` is GPT-2's byte-level form of `bytes`: a character a byte.
fn is_byte_level_of(word: &str, bytes: &[u8]) -> bool {
    let mut chars = word.chars();
    bytes
        .iter()
        .all(|&b| chars.next() == Some(BYTE_CHARS[b as usize]))
        && chars.next().is_none()
}

/// GPT-2's characters for the 256 bytes: the printable ones stand for themselves, the rest
/// are moved to 256 and on, in order.
static BYTE_CHARS: std::sync::LazyLock<[char; 256]> = std::sync::LazyLock::new(|| {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut out = ['\0'; 256];
    let mut moved = 0u32;
    for b in 0..=255u8 {
        out[b as usize] = if printable(b) {
            char::from(b)
        } else {
            moved += 1;
            char::from_u32(255 + moved).expect("a character under 512")
        };
    }
    out
});

/// The start of the character of `text` that byte `i` is in.
fn char_start(text: &str, mut i: usize) -> usize {
    while i > 0 && !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The end of the character of `text` that byte `i - 1` is in.
fn char_end(text: &str, mut i: usize) -> usize {
    while i < text.len() && !text.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// Firefox's hash (as `rustc-hash`): words are short and the cache is not fed by an
/// adversary that could aim at it more than at the tokenizer's own.
#[derive(Default, Clone, Copy)]
struct Fx(u64);

const FX_K: u64 = 0xf135_7aea_2e62_a9c5;

impl Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        self.0 = (self.0 ^ fx(bytes)).wrapping_mul(FX_K);
    }
    fn finish(&self) -> u64 {
        self.0.rotate_left(26)
    }
}

fn fx(bytes: &[u8]) -> u64 {
    let mut h = 0u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let v = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        h = (h.rotate_left(5) ^ v).wrapping_mul(FX_K);
    }
    for &b in chunks.remainder() {
        h = (h.rotate_left(5) ^ u64::from(b)).wrapping_mul(FX_K);
    }
    h.rotate_left(26)
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use serde_json::{Value, json};

    use super::*;

    /// A byte-level BPE over every byte, with merges that build `the`, ` the`, `é`, ` caf`
    /// and half of `東` (a token that ends inside a character), `<|im_end|>` added, and the
    /// given normalizer, pre-tokenizer and post-processor.
    fn tokenizer(normalizer: Value, pre: Value, post: Value) -> Tokenizer {
        let c = |b: u8| BYTE_CHARS[b as usize].to_string();
        let mut vocab: Vec<String> = (0..=255).map(c).collect();
        let mut merges = Vec::new();
        for (word, bytes) in [("the", 3), (" the", 4), ("é", 2), (" caf", 4), ("東", 2)] {
            let mut head = c(word.as_bytes()[0]);
            for &b in &word.as_bytes()[1..bytes] {
                merges.push(json!([head.clone(), c(b)]));
                head.push_str(&c(b));
                if !vocab.contains(&head) {
                    vocab.push(head.clone());
                }
            }
        }
        let n = vocab.len();
        let vocab: serde_json::Map<String, Value> = vocab
            .into_iter()
            .enumerate()
            .map(|(i, s)| (s, json!(i)))
            .collect();
        let added: Vec<Value> = ["<|im_end|>", "<|im", "<tool_call>"]
            .iter()
            .enumerate()
            .map(|(i, t)| {
                json!({"id": n + i, "content": t, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": i == 0})
            })
            .collect();
        let j = json!({"version": "1.0", "truncation": null, "padding": null,
            "added_tokens": added, "normalizer": normalizer, "pre_tokenizer": pre,
            "post_processor": post, "decoder": null,
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                "continuing_subword_prefix": null, "end_of_word_suffix": null,
                "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab, "merges": merges}});
        Tokenizer::from_str(&j.to_string()).expect("a tokenizer")
    }

    fn byte_level(prefix: bool, regex: bool) -> Value {
        json!({"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": false,
            "use_regex": regex})
    }

    /// Qwen 2.5's pre-tokenizer: its split, then the byte-level step without the regex.
    fn qwen() -> Value {
        let pattern = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
                "invert": false},
            byte_level(false, false)]})
    }

    const TEXTS: &[&str] = &[
        "",
        "the the  the   the\n\nthe\r\n the",
        "café naïve 東京 数据 привет мир 42 3.14 🦀🦀",
        "<|im_end|><|im_end|>the<|im_end|> the東東<|im_end|>",
        "<|im<|im_end|><|im_<tool_call><tool_call x <|im",
        "  leading and trailing  \t",
        " caféé東東東 caf",
        "'s 're don't I'M",
    ];

    /// The fast path's ids and offsets, or `None` where it handed the text back.
    fn fast(t: &Tokenizer, w: &Words, text: &str) -> Option<super::super::Encoding> {
        let (mut ids, mut offsets) = (vec![7], vec![(0, 0)]);
        let done = w.encode(t, text, &mut ids, Some(&mut offsets)).unwrap();
        if !done {
            assert_eq!((ids, offsets), (vec![7], vec![(0, 0)]), "left as it was");
            return None;
        }
        let mut alone = Vec::new();
        assert!(w.encode(t, text, &mut alone, None).unwrap());
        assert_eq!(alone, ids[1..], "the ids without the offsets");
        Some((ids[1..].to_vec(), offsets[1..].to_vec()))
    }

    fn slow(t: &Tokenizer, text: &str) -> super::super::Encoding {
        let e = t.encode(text, false).unwrap();
        (e.get_ids().to_vec(), e.get_offsets().to_vec())
    }

    /// The ids and offsets of the checked way alone (as where the words cannot be cut here).
    fn checked(t: &Tokenizer, w: &Words, text: &str) -> Option<super::super::Encoding> {
        let (mut ids, mut offsets) = (Vec::new(), Vec::new());
        w.encode_checked(t, text, &mut ids, Some(&mut offsets))
            .unwrap()
            .then_some((ids, offsets))
    }

    #[test]
    fn ids_and_offsets_are_encodes() {
        let post = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
            "use_regex": false});
        for (pre, post) in [
            (byte_level(false, true), Value::Null),
            (qwen(), post.clone()),
            (
                qwen(),
                json!({"type": "Sequence", "processors": [post,
                {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|im_end|>",
                    "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                 "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
                 "special_tokens": {"<|im_end|>": {"id": "<|im_end|>", "ids": [266],
                    "tokens": ["<|im_end|>"]}}}]}),
            ),
        ] {
            let t = tokenizer(Value::Null, pre, post);
            let w = Words::new(&t).expect("a byte-level BPE");
            assert!(w.direct.is_some(), "words cut here");
            for _ in 0..2 {
                // Twice: the words tokenized, then the words cached.
                for text in TEXTS {
                    let want = slow(&t, text);
                    assert_eq!(fast(&t, &w, text).as_ref(), Some(&want), "{text:?}");
                    assert_eq!(checked(&t, &w, text).as_ref(), Some(&want), "{text:?}");
                }
            }
        }
        // A token of half a character covers the whole character, as encode says.
        let t = tokenizer(Value::Null, qwen(), Value::Null);
        let (ids, offsets) = slow(&t, "東");
        assert_eq!((ids.len(), offsets), (2, vec![(0, 3), (0, 3)]));
    }

    /// Random texts of pieces where the splits and the byte-level step differ most: runs of
    /// whitespace of every kind, contractions in any case, digits, punctuation, letters of
    /// several scripts, combining marks, emoji, added tokens and pieces of them.
    #[test]
    fn random_texts_are_encodes() {
        const PIECES: &[&str] = &[
            " ",
            "  ",
            "\t",
            "\n",
            "\r\n",
            "\n\n ",
            "\u{a0}",
            "\u{3000}",
            " \u{2003}x",
            "'s",
            "'S",
            "'ll",
            "'RE",
            "don't",
            "the",
            " the",
            "The",
            "42",
            "3.14",
            "1234567",
            "!",
            "?!",
            ",",
            "...",
            "\"",
            "(",
            "){",
            "é",
            "e\u{301}",
            "東京",
            "数据",
            "привет",
            "🦀",
            "👍🏽",
            "<|im_end|>",
            "<|im",
            "<tool_call>",
            "|>",
            "_",
            "-",
            "x",
            " caf",
        ];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        let texts: Vec<String> = (0..400)
            .map(|_| {
                (0..1 + next(12))
                    .map(|_| PIECES[next(PIECES.len())])
                    .collect()
            })
            .collect();
        for (normalizer, pre) in [
            (Value::Null, byte_level(false, true)),
            (Value::Null, qwen()),
            (json!({"type": "NFC"}), qwen()),
            (
                Value::Null,
                json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": r"\p{N}{1,3}"}, "behavior": "Isolated",
                    "invert": false},
                byte_level(false, true)]}),
            ),
        ] {
            let t = tokenizer(normalizer, pre, Value::Null);
            let w = Words::new(&t).expect("a byte-level BPE");
            assert!(w.direct.is_some());
            for text in &texts {
                let want = slow(&t, text);
                let got = fast(&t, &w, text);
                // Under NFC a text it changes goes to encode; any other is the same.
                assert!(got.is_none() || got.as_ref() == Some(&want), "{text:?}");
                assert!(got.is_some() || (text.contains('\u{301}')), "{text:?}");
            }
        }
    }

    #[test]
    fn a_text_the_normalizer_changes_goes_through_encode() {
        let t = tokenizer(json!({"type": "NFC"}), qwen(), Value::Null);
        let w = Words::new(&t).expect("NFC is checked word by word");
        assert!(w.direct.as_ref().is_some_and(|d| d.nfc));
        let d = w.direct.as_ref().expect("cut here");
        for text in ["the <|im_end|> caf", "caf\u{e9} the 東京"] {
            assert_eq!(fast(&t, &w, text), Some(slow(&t, text)));
            let mut ids = Vec::new();
            assert!(
                d.encode(&w, &t, text, &mut ids, None).unwrap(),
                "NFC already"
            );
        }
        let mut ids = Vec::new();
        assert!(!d.encode(&w, &t, "cafe\u{301}", &mut ids, None).unwrap());
        assert_eq!(fast(&t, &w, "cafe\u{301} the"), None);
    }

    #[test]
    fn tokenizers_whose_steps_move_offsets_keep_their_own() {
        let t = tokenizer(Value::Null, byte_level(true, true), Value::Null);
        assert!(Words::new(&t).is_none(), "a prefix space");
        let trim = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
            "use_regex": false});
        let t = tokenizer(Value::Null, qwen(), trim);
        let w = Words::new(&t).expect("the ids are kept");
        assert!(!w.keeps_offsets, "offsets trimmed");
        for text in TEXTS {
            let mut ids = Vec::new();
            assert!(w.encode(&t, text, &mut ids, None).unwrap());
            assert_eq!(ids, slow(&t, text).0, "{text:?}");
        }
        let t = tokenizer(Value::Null, json!({"type": "Whitespace"}), Value::Null);
        assert!(Words::new(&t).is_none(), "not byte-level");
        // Words the pre-tokenizer cuts otherwise: checked, not cut here.
        let digits = json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, byte_level(false, true)]});
        let t = tokenizer(Value::Null, digits, Value::Null);
        let w = Words::new(&t).expect("byte-level last");
        assert!(w.direct.is_none());
        for text in TEXTS {
            assert_eq!(fast(&t, &w, text), Some(slow(&t, text)), "{text:?}");
        }
    }
}
