//! Documents packed into training rows: [`PackedSource`] over [`Documents`].
//!
//! Every mode is a pure function of the documents, the options and the loader's plan (seed,
//! epoch), so order, the rank split, resumption from any batch and elastic resumption work as
//! for any source, and the epoch's sample count is known when the source is opened.
//!
//! | mode | sample `i` | columns (per sample) |
//! | --- | --- | --- |
//! | `concat` | window `i` of `seq_len + 1` tokens of the epoch's documents concatenated | `tokens` `[seq_len + 1]` (`out_dtype`) |
//! | `document` | the same window | `tokens`; `position_ids` `[seq_len + 1]` `int64`, from 0 at the window's start and at every document's; `segment_ids` `[seq_len + 1]` `int32`, 1 for the window's first document (piece), 2 for the next, ...; `cu_seqlens` `[k + 1]` `int32`, the offsets where the window's `k` pieces start, then `seq_len + 1` (a list per batch; `pad=True` pads it); `max_seqlen` `int32`, its longest piece |
//! | `pad` | document `i` (or, with a `bucket`, a document of similar length to its batch's others), cut to `seq_len` tokens (its EOS kept) | `tokens` `[L]` (`out_dtype`): padded with `pad_id` to the batch's longest rounded up to `pad_to_multiple_of`; `tokens_mask` `[L]` `bool` (false on padding) |
//! | `best_fit` | row `i` of whole documents packed into `seq_len` tokens | `tokens` `[seq_len]`, padded with `pad_id`; `position_ids` `[seq_len]` `int64` (0 on padding); `segment_ids` `[seq_len]` `int32` (0 on padding); `loss_mask` `[seq_len]` `bool` (false on padding); `cu_seqlens` `[k + 1]` `int32`, where the row's `k` documents start, then where they end (a list per batch); `max_seqlen` `int32` |
//!
//! `concat` and `document`: with a shuffling plan the documents are put in a new order every
//! epoch (keyed by the plan's seed and epoch; the plan then shuffles the windows too, as
//! Megatron's `GPTDataset` shuffles both); without, they keep the files' order, so the windows
//! are the files' token stream cut every `seq_len + 1` tokens, across document and file
//! boundaries. Every token of an epoch is in exactly one window, except the tail: the
//! `T mod (seq_len + 1)` tokens after the epoch's last whole window (of the `T` tokens of
//! the concatenation) are not read that epoch. The epoch's document order comes through
//! [`Source::set_plan`], so a packed source, like a mixture, follows one loader at a time. As a
//! mixture's component it keeps one document order for every epoch (keyed by the component's
//! seed; [`Source::keep_one_order`]), since a mixture reads several of a component's epochs
//! at once; the component's plans still reshuffle the windows every epoch (and `pad` does not
//! bucket there).
//!
//! `best_fit`: documents, in an order keyed by [`PackOptions::seed`], are taken a window of
//! [`PackOptions::window`] at a time and placed, longest first, each into the open row with
//! the least room that holds it (best-fit decreasing), a new row when none does; a window's
//! rows close when it ends, so memory stays bounded. A document never splits unless it is
//! longer than `seq_len` ([`Long`]: split into `seq_len`-token pieces, or dropped). The rows
//! are made once, when the source is opened; epochs shuffle them through the plan.
//!
//! `pad` with [`PackOptions::padding_free`]: a batch is its rows end to end, `[1, N]`
//! (`tokens`, `position_ids`, `labels`), with `cu_seqlens` `[B + 1]` and `max_seqlen` `[1]`
//! (`int32`), as `transformers`' `DataCollatorWithFlattening` lays a batch out.
//!
//! Documents with labels ([`Documents::has_labels`]: a tokenized column's `labels`) add a
//! `labels` column (`int64`, the same shape as `tokens`): each token's label, the appended
//! EOS's `eos_id`, padding -100.
//!
//! [`PackOptions::eos_id`] is appended after every document (for documents stored without
//! one; flat files split at their end-of-sequence id keep it as their last token already).

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use chute_core::{
    Array, BufferPool, Column, ConfigError, DType, Error, Field, FieldName, Manifest, Permutation,
    Plan, Sample, ShardInfo, Shuffle, Source, Tensor, cast_into, check_cast, derive_key,
};

use crate::documents::Documents;

/// How documents become rows (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pack {
    /// Windows of `seq_len + 1` tokens across documents.
    #[default]
    Concat,
    /// `concat`'s windows with position and segment ids and `cu_seqlens`.
    Document,
    /// Whole documents in rows of `seq_len` tokens, best-fit decreasing.
    BestFit,
    /// One document per row, cut to `seq_len` tokens: variable-length rows, which the loader
    /// pads to the batch's longest with `pad` (a `tokens_mask`), for fine-tuning.
    Pad,
}

impl Pack {
    /// Every mode.
    pub const ALL: [Pack; 4] = [Pack::Concat, Pack::Document, Pack::BestFit, Pack::Pad];

    /// `concat`, `document` or `best_fit`.
    pub fn name(self) -> &'static str {
        match self {
            Pack::Concat => "concat",
            Pack::Document => "document",
            Pack::BestFit => "best_fit",
            Pack::Pad => "pad",
        }
    }
}

impl std::fmt::Display for Pack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Pack {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Pack, ConfigError> {
        Pack::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                ConfigError::new(
                    "pack",
                    format!("{s:?} is not a packing mode; use concat, document, best_fit or pad"),
                )
            })
    }
}

/// `best_fit`: what happens to a document longer than `seq_len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Long {
    /// Split into pieces of `seq_len` tokens (and a last, shorter piece), packed as
    /// documents of their own.
    #[default]
    Split,
    /// Left out.
    Drop,
}

impl std::str::FromStr for Long {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Long, ConfigError> {
        match s {
            "split" => Ok(Long::Split),
            "drop" => Ok(Long::Drop),
            _ => Err(ConfigError::new(
                "long",
                format!("{s:?}: documents longer than seq_len are `split` or `drop`ped"),
            )),
        }
    }
}

/// How to pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackOptions {
    /// The mode.
    pub pack: Pack,
    /// Tokens a model trains on per row (windows hold one more: the shifted targets).
    pub seq_len: usize,
    /// The dtype of `tokens` (default `int64`).
    pub out_dtype: DType,
    /// An id appended after every document.
    pub eos_id: Option<u32>,
    /// `best_fit`: the padding id (default 0).
    pub pad_id: u32,
    /// `best_fit`: documents longer than `seq_len`.
    pub long: Long,
    /// `best_fit`: documents per packing window (default 1,024).
    pub window: usize,
    /// `best_fit`: the key of the order documents are packed in (default 0).
    pub seed: u64,
    /// `pad`: the batch's rows are padded to its longest rounded up to a multiple of this
    /// (default 1: the longest; 8 or 64 suit tensor cores).
    pub pad_to_multiple_of: usize,
    /// `pad`: length bucketing; each run of this many rows of the epoch's order (all ranks)
    /// holds the same documents as without it, sorted longest first, so a batch's documents
    /// are of similar lengths (Hugging Face's `group_by_length` with megabatches of this
    /// size). 0 (the default) leaves it off; a few dozen batches of every rank together is
    /// a good size.
    pub bucket: u64,
    /// `pad`: the batch's rows laid end to end in one row, `[1, N]`, no padding (what
    /// `transformers`' `DataCollatorWithFlattening` gives variable-length attention):
    /// `tokens`, `position_ids` restarting at each row, `labels` (-100 at each row's first
    /// token), `cu_seqlens` `[B + 1]` `int32` and `max_seqlen` `[1]` `int32`. On the columnar
    /// path only (a loader without transforms).
    pub padding_free: bool,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            pack: Pack::Concat,
            seq_len: 1024,
            out_dtype: DType::I64,
            eos_id: None,
            pad_id: 0,
            long: Long::Split,
            window: 1024,
            seed: 0,
            pad_to_multiple_of: 1,
            bucket: 0,
            padding_free: false,
        }
    }
}

/// A tag for the keys of packing orders.
const TAG_DOCS: u64 = 0x7061_636b_646f_6373; // "packdocs"
const TAG_FIT: u64 = 0x7061_636b_5f66_6974; // "pack_fit"

/// Samples per virtual shard (what block shuffle permutes).
const PER_SHARD: u64 = 1024;

/// An epoch's document order for `concat` / `document`.
#[derive(Debug)]
struct Order {
    /// `(seed, epoch)` of a shuffled order; `None` for the files' order.
    key: Option<(u64, u64)>,
    perm: Option<Permutation>,
    /// Tokens (with `eos_id`) before each document of the order, then the total.
    prefix: Vec<u64>,
}

/// A piece of a document in a `best_fit` row: tokens `off..off + len` of the document with
/// its `eos_id` appended.
#[derive(Debug, Clone, Copy)]
struct Piece {
    doc: u64,
    off: u64,
    len: u32,
}

/// `best_fit`'s rows: row `r` is `pieces[starts[r]..starts[r + 1]]`.
#[derive(Debug, Default)]
struct Rows {
    starts: Vec<u64>,
    pieces: Vec<Piece>,
}

/// Documents packed into rows, as a [`Source`] (see the module documentation).
#[derive(Debug)]
pub struct PackedSource {
    docs: Documents,
    options: PackOptions,
    manifest: Manifest,
    order: RwLock<Arc<Order>>,
    rows: Rows,
    /// `best_fit`: documents left out (longer than `seq_len` with [`Long::Drop`]).
    dropped: u64,
    /// `pad` with a `bucket`: the epoch's document of each row.
    bucketed: RwLock<Arc<Bucketed>>,
    /// A mixture's component ([`Source::keep_one_order`]): one document order for every
    /// epoch, no bucketing.
    one_order: std::sync::atomic::AtomicBool,
}

/// `pad` with a `bucket`: the document each row reads in the epoch `key` names, `None`
/// before the first plan (rows read their own document).
#[derive(Debug, Default)]
struct Bucketed {
    key: Option<(u64, u64, Shuffle)>,
    doc: Vec<u64>,
}

impl PackedSource {
    /// The source with what its rows became in its manifest's parameters (`chat_rows`,
    /// `chat_kept`, `chat_truncated`, `chat_skipped_<why>`): rows encoded when opened.
    pub fn with_counts(mut self, counts: &crate::rows::RowCounts) -> PackedSource {
        let p = &mut self.manifest.params;
        p.insert("chat_rows".into(), counts.rows.into());
        p.insert("chat_kept".into(), counts.kept.into());
        p.insert("chat_truncated".into(), counts.truncated.into());
        p.insert("chat_split".into(), counts.split.into());
        p.insert("chat_documents".into(), counts.documents.into());
        for (why, n) in &counts.skipped {
            p.insert(format!("chat_skipped_{why}"), (*n).into());
        }
        self
    }

    /// Packs `docs` as `options` say. Fails with a [`ConfigError`] for a zero `seq_len` or
    /// `window`, an `out_dtype` the tokens cannot be cast to, or ids that do not fit it.
    pub fn new(docs: Documents, options: PackOptions) -> Result<PackedSource, Error> {
        if options.seq_len == 0 || options.seq_len >= u32::MAX as usize {
            return Err(ConfigError::new(
                "seq_len",
                format!("{} tokens per row; pass 1 to 2^32 - 2", options.seq_len),
            )
            .into());
        }
        if options.window == 0 {
            return Err(ConfigError::new("window", "0 documents per packing window").into());
        }
        if options.pad_to_multiple_of == 0 {
            return Err(ConfigError::new(
                "pad_to_multiple_of",
                "0: rows are padded to a multiple of 1 (the batch's longest) or more",
            )
            .into());
        }
        check_cast(docs.dtype(), options.out_dtype)
            .map_err(|e| ConfigError::new("out_dtype", e.reason))?;
        check_cast(DType::U32, options.out_dtype)
            .map_err(|e| ConfigError::new("out_dtype", e.reason))?;
        let order = Arc::new(Self::order(&docs, &options, None));
        let (rows, dropped) = match options.pack {
            Pack::BestFit => Self::best_fit(&docs, &options),
            _ => (Rows::default(), 0),
        };
        let samples = match options.pack {
            Pack::BestFit => rows.starts.len().saturating_sub(1) as u64,
            Pack::Pad => docs.len(),
            _ => order.prefix.last().copied().unwrap_or(0) / (options.seq_len as u64 + 1),
        };
        let name = docs.names().first().cloned().unwrap_or_default();
        let shards = (0..samples.div_ceil(PER_SHARD))
            .map(|i| ShardInfo {
                path: format!("{name}#{}{}", options.pack, i * PER_SHARD),
                samples: PER_SHARD.min(samples - i * PER_SHARD),
                bytes: 0,
            })
            .collect();
        let mut manifest = Manifest::new("packed", shards)
            .with_param("documents", docs.kind())
            .with_param("pack", options.pack.name())
            .with_param("seq_len", options.seq_len)
            .with_param("files", docs.names().join(","))
            .with_param(
                "sizes",
                docs.sizes()
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            );
        if let Some(e) = options.eos_id {
            manifest = manifest.with_param("eos_id", e);
        }
        if options.pack == Pack::Pad {
            manifest = manifest
                .with_param("pad_id", options.pad_id)
                .with_param("pad_to_multiple_of", options.pad_to_multiple_of)
                .with_param("bucket", options.bucket)
                .with_param("padding_free", options.padding_free);
        }
        if options.pack == Pack::BestFit {
            manifest = manifest
                .with_param("pad_id", options.pad_id)
                .with_param("long", format!("{:?}", options.long))
                .with_param("window", options.window)
                .with_param("seed", options.seed);
        }
        Ok(PackedSource {
            docs,
            options,
            manifest,
            order: RwLock::new(order),
            rows,
            dropped,
            bucketed: RwLock::default(),
            one_order: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The documents.
    pub fn documents(&self) -> &Documents {
        &self.docs
    }

    /// The options.
    pub fn options(&self) -> &PackOptions {
        &self.options
    }

    /// `best_fit`: documents left out for being longer than `seq_len` ([`Long::Drop`]).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// `best_fit`: the fraction of row tokens that are padding.
    pub fn padding_fraction(&self) -> f64 {
        let rows = self.rows.starts.len().saturating_sub(1) as u64;
        if rows == 0 {
            return 0.0;
        }
        let used: u64 = self.rows.pieces.iter().map(|p| u64::from(p.len)).sum();
        1.0 - used as f64 / (rows * self.options.seq_len as u64) as f64
    }

    /// Document `d`'s length with `eos_id`.
    fn eff_len(docs: &Documents, options: &PackOptions, d: u64) -> u64 {
        docs.doc_len(d) + u64::from(options.eos_id.is_some())
    }

    /// The document order for `key` (`None`: the files' order) and its token prefix.
    fn order(docs: &Documents, options: &PackOptions, key: Option<(u64, u64)>) -> Order {
        let n = docs.len();
        let perm =
            key.map(|(seed, epoch)| Permutation::new(n, derive_key(&[seed, epoch, TAG_DOCS])));
        let mut prefix = Vec::with_capacity(n as usize + 1);
        let mut acc = 0u64;
        prefix.push(0);
        for k in 0..n {
            let d = perm.as_ref().map_or(k, |p| p.apply(k));
            acc += Self::eff_len(docs, options, d);
            prefix.push(acc);
        }
        Order { key, perm, prefix }
    }

    /// `best_fit`'s rows and the documents dropped.
    fn best_fit(docs: &Documents, options: &PackOptions) -> (Rows, u64) {
        let n = docs.len();
        let cap = options.seq_len as u64;
        let perm = Permutation::new(n, derive_key(&[options.seed, TAG_FIT]));
        let mut rows = Rows {
            starts: vec![0],
            pieces: Vec::new(),
        };
        let mut dropped = 0;
        let mut pieces: Vec<Piece> = Vec::new();
        let mut open: Vec<Vec<Piece>> = Vec::new();
        // Open rows by room left: (room, row).
        let mut room: BTreeSet<(u64, usize)> = BTreeSet::new();
        let mut k = 0;
        while k < n {
            let end = (k + options.window as u64).min(n);
            pieces.clear();
            for j in k..end {
                let doc = perm.apply(j);
                let len = Self::eff_len(docs, options, doc);
                if len > cap && options.long == Long::Drop {
                    dropped += 1;
                    continue;
                }
                let mut off = 0;
                while off < len {
                    let take = (len - off).min(cap);
                    pieces.push(Piece {
                        doc,
                        off,
                        len: take as u32,
                    });
                    off += take;
                }
            }
            // Longest first; ties keep the window's order (a stable sort).
            pieces.sort_by_key(|p| std::cmp::Reverse(p.len));
            for &p in &pieces {
                let len = u64::from(p.len);
                let fit = room.range((len, 0)..).next().copied();
                let row = match fit {
                    Some((left, row)) => {
                        room.remove(&(left, row));
                        if left > len {
                            room.insert((left - len, row));
                        }
                        row
                    }
                    None => {
                        open.push(Vec::new());
                        if cap > len {
                            room.insert((cap - len, open.len() - 1));
                        }
                        open.len() - 1
                    }
                };
                open[row].push(p);
            }
            for row in open.drain(..) {
                rows.pieces.extend(row);
                rows.starts.push(rows.pieces.len() as u64);
            }
            room.clear();
            k = end;
        }
        (rows, dropped)
    }

    /// The order for the current epoch.
    fn current(&self) -> Arc<Order> {
        Arc::clone(&self.order.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Copies tokens `off..off + len` of document `doc` (with `eos_id` after its last token)
    /// into `dst` (`len` values of `out_dtype`).
    fn copy_tokens(&self, doc: u64, off: u64, len: u64, dst: &mut [u8]) {
        let (file, first, n) = self.docs.doc(doc);
        let os = self.options.out_dtype.size();
        let real = len.min(n.saturating_sub(off));
        if real > 0 {
            let src = self.docs.token_bytes(file, first + off, real);
            cast_into(
                self.docs.dtype(),
                src,
                self.options.out_dtype,
                &mut dst[..real as usize * os],
            );
        }
        if real < len {
            // The rest is the appended EOS (one token: `len` never runs past it).
            let eos = self.options.eos_id.unwrap_or(0).to_le_bytes();
            cast_into(
                DType::U32,
                &eos,
                self.options.out_dtype,
                &mut dst[real as usize * os..(real as usize + 1) * os],
            );
        }
    }

    /// Copies the labels of tokens `off..off + len` of document `doc` (the appended EOS's is
    /// `eos_id`) into `dst` (`len` `int64`s), when the documents have labels.
    fn copy_labels(&self, doc: u64, off: u64, len: u64, dst: &mut [u8]) {
        let (_, first, n) = self.docs.doc(doc);
        let real = len.min(n.saturating_sub(off));
        if let Some(src) = self.docs.label_bytes(first + off, real) {
            dst[..real as usize * 8].copy_from_slice(src);
        }
        if real < len {
            let eos = i64::from(self.options.eos_id.unwrap_or(0)).to_le_bytes();
            dst[real as usize * 8..(real as usize + 1) * 8].copy_from_slice(&eos);
        }
    }

    /// The pieces of sample `id`: (document, offset, length) in order.
    fn pieces(&self, order: &Order, id: u64, out: &mut Vec<(u64, u64, u64)>) {
        out.clear();
        match self.options.pack {
            Pack::BestFit => {
                let r = id as usize;
                let (a, b) = (
                    self.rows.starts[r] as usize,
                    self.rows.starts[r + 1] as usize,
                );
                out.extend(
                    self.rows.pieces[a..b]
                        .iter()
                        .map(|p| (p.doc, p.off, u64::from(p.len))),
                );
            }
            _ => {
                let w = self.options.seq_len as u64 + 1;
                let start = id * w;
                let mut k = order.prefix.partition_point(|&p| p <= start) - 1;
                let mut off = start - order.prefix[k];
                let mut need = w;
                while need > 0 {
                    let d = order.perm.as_ref().map_or(k as u64, |p| p.apply(k as u64));
                    let len = order.prefix[k + 1] - order.prefix[k];
                    let take = (len - off).min(need);
                    if take > 0 {
                        out.push((d, off, take));
                    }
                    need -= take;
                    off = 0;
                    k += 1;
                }
            }
        }
    }

    /// Writes sample `id`'s columns into `cols` (each one row's bytes, in [`Self::fields`]
    /// order) and, for `document`, its `cu_seqlens` into `cu`.
    fn fill(
        &self,
        order: &Order,
        id: u64,
        pieces: &mut Vec<(u64, u64, u64)>,
        cols: &mut [&mut [u8]],
        cu: &mut Vec<i32>,
    ) {
        self.pieces(order, id, pieces);
        let os = self.options.out_dtype.size();
        let labels = self.docs.has_labels().then(|| cols.len() - 1);
        let mut at = 0usize;
        let extra = self.options.pack != Pack::Concat;
        cu.clear();
        for (s, &(doc, off, len)) in pieces.iter().enumerate() {
            let n = len as usize;
            self.copy_tokens(doc, off, len, &mut cols[0][at * os..(at + n) * os]);
            if let Some(li) = labels {
                self.copy_labels(doc, off, len, &mut cols[li][at * 8..(at + n) * 8]);
            }
            if extra {
                for j in 0..n {
                    let pos = (j as i64).to_le_bytes();
                    cols[1][(at + j) * 8..(at + j + 1) * 8].copy_from_slice(&pos);
                    let seg = (s as i32 + 1).to_le_bytes();
                    cols[2][(at + j) * 4..(at + j + 1) * 4].copy_from_slice(&seg);
                }
                if self.options.pack == Pack::BestFit {
                    cols[3][at..at + n].fill(1);
                }
            }
            cu.push(at as i32);
            at += n;
        }
        cu.push(at as i32);
        if self.options.pack == Pack::BestFit {
            // Padding.
            let rows = self.options.seq_len;
            let pad = self.options.pad_id.to_le_bytes();
            for j in at..rows {
                cast_into(
                    DType::U32,
                    &pad,
                    self.options.out_dtype,
                    &mut cols[0][j * os..(j + 1) * os],
                );
            }
            cols[1][at * 8..].fill(0);
            cols[2][at * 4..].fill(0);
            cols[3][at..].fill(0);
            if let Some(li) = labels {
                fill_ignored(&mut cols[li][at * 8..]);
            }
        }
    }

    /// `pad`: this epoch's documents of the rows (see [`Self::pad_doc`]).
    fn bucketed(&self) -> Arc<Bucketed> {
        Arc::clone(&self.bucketed.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// `pad`: the document row `id` reads this epoch.
    fn pad_doc(b: &Bucketed, id: u64) -> u64 {
        b.doc.get(id as usize).copied().unwrap_or(id)
    }

    /// `pad`: the tokens of document `doc`'s row (with its EOS, cut to `seq_len`).
    fn pad_len(&self, doc: u64) -> u64 {
        Self::eff_len(&self.docs, &self.options, doc).min(self.options.seq_len as u64)
    }

    /// `pad`: writes document `doc`'s row of `n` tokens (its EOS kept when cut) into `dst`.
    fn pad_row(&self, doc: u64, n: u64, dst: &mut [u8]) {
        let os = self.options.out_dtype.size();
        let eos = u64::from(self.options.eos_id.is_some() && n > 0);
        self.copy_tokens(doc, 0, n - eos, &mut dst[..(n - eos) as usize * os]);
        if eos == 1 {
            let e = self.options.eos_id.unwrap_or(0).to_le_bytes();
            cast_into(
                DType::U32,
                &e,
                self.options.out_dtype,
                &mut dst[(n as usize - 1) * os..n as usize * os],
            );
        }
    }

    /// `pad`: writes document `doc`'s row's `n` labels (its EOS's `eos_id`) into `dst`.
    fn pad_labels(&self, doc: u64, n: u64, dst: &mut [u8]) {
        let eos = u64::from(self.options.eos_id.is_some() && n > 0);
        self.copy_labels(doc, 0, n - eos, &mut dst[..(n - eos) as usize * 8]);
        if eos == 1 {
            let e = i64::from(self.options.eos_id.unwrap_or(0)).to_le_bytes();
            dst[(n as usize - 1) * 8..n as usize * 8].copy_from_slice(&e);
        }
    }

    /// `pad`: the batch's rows padded with `pad_id` to its longest, rounded up to
    /// `pad_to_multiple_of`, and `tokens_mask` (true on the documents' tokens).
    fn collate_padded(&self, ids: &[u64], pool: &BufferPool) -> Vec<(String, Column)> {
        let os = self.options.out_dtype.size();
        let bucketed = self.bucketed();
        let rows: Vec<(u64, u64)> = ids
            .iter()
            .map(|&id| {
                let doc = Self::pad_doc(&bucketed, id);
                (doc, self.pad_len(doc))
            })
            .collect();
        let longest = rows.iter().map(|r| r.1).max().unwrap_or(0) as usize;
        let width =
            longest.div_ceil(self.options.pad_to_multiple_of) * self.options.pad_to_multiple_of;
        let mut pad = vec![0u8; os];
        cast_into(
            DType::U32,
            &self.options.pad_id.to_le_bytes(),
            self.options.out_dtype,
            &mut pad,
        );
        let mut tokens = pool.take(ids.len() * width * os);
        let mut mask = pool.take(ids.len() * width);
        let (t, m) = (tokens.as_mut_slice(), mask.as_mut_slice());
        for (i, &(doc, n)) in rows.iter().enumerate() {
            let row = &mut t[i * width * os..(i + 1) * width * os];
            let n = n as usize;
            self.pad_row(doc, n as u64, &mut row[..n * os]);
            for v in row[n * os..].chunks_exact_mut(os) {
                v.copy_from_slice(&pad);
            }
            m[i * width..i * width + n].fill(1);
            m[i * width + n..(i + 1) * width].fill(0);
        }
        let shape = vec![ids.len(), width];
        let mut out = vec![
            (
                "tokens".to_string(),
                Column::Tensor(Tensor::new(self.options.out_dtype, shape.clone(), tokens)),
            ),
            (
                "tokens_mask".to_string(),
                Column::Tensor(Tensor::new(DType::Bool, shape.clone(), mask)),
            ),
        ];
        if self.docs.has_labels() {
            let mut labels = pool.take(ids.len() * width * 8);
            let l = labels.as_mut_slice();
            for (i, &(doc, n)) in rows.iter().enumerate() {
                let row = &mut l[i * width * 8..(i + 1) * width * 8];
                self.pad_labels(doc, n, &mut row[..n as usize * 8]);
                fill_ignored(&mut row[n as usize * 8..]);
            }
            out.push((
                "labels".to_string(),
                Column::Tensor(Tensor::new(DType::I64, shape, labels)),
            ));
        }
        out
    }

    /// `pad` with `padding_free`: the batch's rows end to end in one row (see
    /// [`PackOptions::padding_free`]).
    fn collate_flat(&self, ids: &[u64], pool: &BufferPool) -> Vec<(String, Column)> {
        let os = self.options.out_dtype.size();
        let bucketed = self.bucketed();
        let rows: Vec<(u64, usize)> = ids
            .iter()
            .map(|&id| {
                let doc = Self::pad_doc(&bucketed, id);
                (doc, self.pad_len(doc) as usize)
            })
            .collect();
        let total: usize = rows.iter().map(|r| r.1).sum();
        let mut tokens = pool.take(total * os);
        let mut positions = pool.take(total * 8);
        let mut cu = pool.take((rows.len() + 1) * 4);
        let mut at = 0usize;
        let (t, p, c) = (
            tokens.as_mut_slice(),
            positions.as_mut_slice(),
            cu.as_mut_slice(),
        );
        let mut longest = 0usize;
        for (i, &(doc, n)) in rows.iter().enumerate() {
            c[i * 4..(i + 1) * 4].copy_from_slice(&(at as i32).to_le_bytes());
            self.pad_row(doc, n as u64, &mut t[at * os..(at + n) * os]);
            for j in 0..n {
                p[(at + j) * 8..(at + j + 1) * 8].copy_from_slice(&(j as i64).to_le_bytes());
            }
            longest = longest.max(n);
            at += n;
        }
        let end = rows.len() * 4;
        c[end..end + 4].copy_from_slice(&(at as i32).to_le_bytes());
        let mut max = pool.take(4);
        max.as_mut_slice()
            .copy_from_slice(&(longest as i32).to_le_bytes());
        let mut out = vec![
            (
                "tokens".to_string(),
                Column::Tensor(Tensor::new(self.options.out_dtype, vec![1, total], tokens)),
            ),
            (
                "position_ids".to_string(),
                Column::Tensor(Tensor::new(DType::I64, vec![1, total], positions)),
            ),
            (
                "cu_seqlens".to_string(),
                Column::Tensor(Tensor::new(DType::I32, vec![rows.len() + 1], cu)),
            ),
            (
                "max_seqlen".to_string(),
                Column::Tensor(Tensor::new(DType::I32, vec![1], max)),
            ),
        ];
        if self.docs.has_labels() {
            let mut labels = pool.take(total * 8);
            let l = labels.as_mut_slice();
            let mut at = 0usize;
            for &(doc, n) in &rows {
                self.pad_labels(doc, n as u64, &mut l[at * 8..(at + n) * 8]);
                if n > 0 {
                    // No label crosses from one row to the next.
                    l[at * 8..at * 8 + 8].copy_from_slice(&IGNORE.to_le_bytes());
                }
                at += n;
            }
            out.push((
                "labels".to_string(),
                Column::Tensor(Tensor::new(DType::I64, vec![1, total], labels)),
            ));
        }
        out
    }

    /// `pad` with a `bucket`: for the epoch `plan` is in, each run of `bucket` positions of
    /// its order (all ranks) gets the documents those positions hold, longest first. Depends
    /// on the seed, the epoch and the shuffle mode only, so every rank, a resumed run and one
    /// on another world size agree.
    fn bucket(&self, plan: &Plan) {
        let cfg = plan.config();
        let key = Some((cfg.seed, cfg.epoch, cfg.shuffle));
        if self.bucketed().key == key {
            return;
        }
        let n = plan.epoch_samples();
        if n != self.docs.len() {
            return; // a plan over other samples (a mixture's): rows read their own documents
        }
        let mut doc = vec![0u64; n as usize];
        let mut ids = Vec::new();
        let mut sorted = Vec::new();
        let mut p = 0;
        while p < n {
            let end = (p + self.options.bucket).min(n);
            ids.clear();
            ids.extend((p..end).map(|q| plan.order_at(q)));
            sorted.clear();
            sorted.extend_from_slice(&ids);
            sorted.sort_by_key(|&d| std::cmp::Reverse(self.pad_len(d)));
            for (&id, &d) in ids.iter().zip(&sorted) {
                doc[id as usize] = d;
            }
            p = end;
        }
        *self.bucketed.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Bucketed { key, doc });
    }

    /// Tokens per row.
    fn row_len(&self) -> usize {
        match self.options.pack {
            Pack::BestFit => self.options.seq_len,
            _ => self.options.seq_len + 1,
        }
    }

    /// The fixed-width columns: (name, dtype), in order.
    fn fields(&self) -> Vec<(&'static str, DType)> {
        let mut f = vec![("tokens", self.options.out_dtype)];
        if self.options.pack != Pack::Concat {
            f.push(("position_ids", DType::I64));
            f.push(("segment_ids", DType::I32));
        }
        if self.options.pack == Pack::BestFit {
            f.push(("loss_mask", DType::Bool));
        }
        if self.docs.has_labels() {
            f.push(("labels", DType::I64));
        }
        f
    }
}

impl Source for PackedSource {
    fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn read(&self, id: u64) -> Result<Sample, Error> {
        self.manifest.locate_checked(id)?;
        if self.options.pack == Pack::Pad {
            let doc = Self::pad_doc(&self.bucketed(), id);
            let n = self.pad_len(doc);
            let mut buf = vec![0u8; n as usize * self.options.out_dtype.size()];
            self.pad_row(doc, n, &mut buf);
            let mut sample = Sample::new(id);
            sample.fields.push((
                FieldName::Borrowed("tokens"),
                Field::Array(Array::new(
                    self.options.out_dtype,
                    vec![n as usize],
                    Bytes::from(buf),
                )),
            ));
            if self.docs.has_labels() {
                let mut l = vec![0u8; n as usize * 8];
                self.pad_labels(doc, n, &mut l);
                sample.fields.push((
                    FieldName::Borrowed("labels"),
                    Field::Array(Array::new(DType::I64, vec![n as usize], Bytes::from(l))),
                ));
            }
            return Ok(sample);
        }
        let order = self.current();
        let n = self.row_len();
        let fields = self.fields();
        let mut bufs: Vec<Vec<u8>> = fields
            .iter()
            .map(|(_, d)| vec![0u8; n * d.size()])
            .collect();
        let mut cu = Vec::new();
        let mut pieces = Vec::new();
        {
            let mut cols: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
            self.fill(&order, id, &mut pieces, &mut cols, &mut cu);
        }
        let mut sample = Sample::new(id);
        for ((name, dtype), buf) in fields.into_iter().zip(bufs) {
            sample.fields.push((
                FieldName::Borrowed(name),
                Field::Array(Array::new(dtype, vec![n], Bytes::from(buf))),
            ));
        }
        if matches!(self.options.pack, Pack::Document | Pack::BestFit) {
            let raw: Vec<u8> = cu.iter().flat_map(|v| v.to_le_bytes()).collect();
            sample.fields.push((
                FieldName::Borrowed("cu_seqlens"),
                Field::Array(Array::new(DType::I32, vec![cu.len()], Bytes::from(raw))),
            ));
            sample.fields.push((
                FieldName::Borrowed("max_seqlen"),
                Field::Array(Array::new(
                    DType::I32,
                    vec![],
                    Bytes::copy_from_slice(&max_seqlen(&cu).to_le_bytes()),
                )),
            ));
        }
        Ok(sample)
    }

    /// A new epoch: `concat` and `document` put the documents in its order.
    fn set_plan(&self, plan: &Plan) {
        let one = self.one_order.load(std::sync::atomic::Ordering::Relaxed);
        if self.options.pack == Pack::Pad && self.options.bucket > 0 && !one {
            self.bucket(plan);
        }
        if matches!(self.options.pack, Pack::BestFit | Pack::Pad) {
            return;
        }
        let cfg = plan.config();
        // In a mixture, epochs are read interleaved: one order, keyed by the seed alone.
        let epoch = if one { 0 } else { cfg.epoch };
        let key = (cfg.shuffle != Shuffle::None).then_some((cfg.seed, epoch));
        if self.current().key == key {
            return;
        }
        let order = Arc::new(Self::order(&self.docs, &self.options, key));
        *self.order.write().unwrap_or_else(|e| e.into_inner()) = order;
    }

    /// Rows encoded when opened (chat): what they became (`rows`, `kept`, `truncated`,
    /// `skipped_<why>`).
    fn stats(&self) -> Option<serde_json::Value> {
        let p = &self.manifest.params;
        let rows: serde_json::Map<String, serde_json::Value> = p
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("chat_")?.to_string(), v.clone())))
            .collect();
        (!rows.is_empty()).then(|| serde_json::json!({ "chat": rows }))
    }

    fn keep_one_order(&self) {
        self.one_order
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The columnar path: rows written straight into the batch's buffers.
    fn collate(
        &self,
        ids: &[u64],
        pool: &BufferPool,
    ) -> Option<Result<Vec<(String, Column)>, Error>> {
        if let Some(&bad) = ids.iter().find(|&&id| id >= self.manifest.total_samples())
            && let Err(e) = self.manifest.locate_checked(bad)
        {
            return Some(Err(e.into()));
        }
        if self.options.pack == Pack::Pad {
            if self.options.padding_free {
                return Some(Ok(self.collate_flat(ids, pool)));
            }
            return Some(Ok(self.collate_padded(ids, pool)));
        }
        let order = self.current();
        let n = self.row_len();
        let b = ids.len();
        let fields = self.fields();
        let mut bufs: Vec<_> = fields
            .iter()
            .map(|(_, d)| pool.take(b * n * d.size()))
            .collect();
        let mut lists = Vec::new();
        let varlen = matches!(self.options.pack, Pack::Document | Pack::BestFit);
        let mut longest = pool.take(if varlen { b * 4 } else { 0 });
        let mut cu = Vec::new();
        let mut pieces = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let mut cols: Vec<&mut [u8]> = bufs
                .iter_mut()
                .zip(&fields)
                .map(|(buf, (_, d))| {
                    let w = n * d.size();
                    &mut buf.as_mut_slice()[i * w..(i + 1) * w]
                })
                .collect();
            self.fill(&order, id, &mut pieces, &mut cols, &mut cu);
            if varlen {
                longest.as_mut_slice()[i * 4..(i + 1) * 4]
                    .copy_from_slice(&max_seqlen(&cu).to_le_bytes());
                let mut t = pool.take(cu.len() * 4);
                for (dst, v) in t.as_mut_slice().chunks_exact_mut(4).zip(&cu) {
                    dst.copy_from_slice(&v.to_le_bytes());
                }
                lists.push(Tensor::new(DType::I32, vec![cu.len()], t));
            }
        }
        let mut out: Vec<(String, Column)> = fields
            .into_iter()
            .zip(bufs)
            .map(|((name, dtype), buf)| {
                (
                    name.to_string(),
                    Column::Tensor(Tensor::new(dtype, vec![b, n], buf)),
                )
            })
            .collect();
        if varlen {
            out.push(("cu_seqlens".into(), Column::List(lists)));
            out.push((
                "max_seqlen".into(),
                Column::Tensor(Tensor::new(DType::I32, vec![b], longest)),
            ));
        }
        Some(Ok(out))
    }
}

/// The longest piece of a row whose pieces start at `cu` (then its end).
fn max_seqlen(cu: &[i32]) -> i32 {
    cu.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0)
}

/// The label the loss ignores (PyTorch's `ignore_index`).
const IGNORE: i64 = -100;

/// Fills `dst` (`int64`s) with [`IGNORE`].
fn fill_ignored(dst: &mut [u8]) {
    for v in dst.chunks_exact_mut(8) {
        v.copy_from_slice(&IGNORE.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chute_core::{PlanConfig, SampleRng};
    use chute_formats::megatron::MegatronWriter;

    /// Random documents (ids 1..1000; lengths 0 to `max`) in two Megatron files.
    fn corpus(dir: &std::path::Path, n: usize, max: u64) -> (Documents, Vec<Vec<u32>>) {
        let mut rng = SampleRng::from_key(7);
        let docs: Vec<Vec<u32>> = (0..n)
            .map(|_| {
                let len = rng.below(max + 1);
                (0..len).map(|_| 1 + rng.below(999) as u32).collect()
            })
            .collect();
        let half = n / 2;
        for (name, part) in [("a", &docs[..half]), ("b", &docs[half..])] {
            let mut w = MegatronWriter::create(dir.join(name), DType::U16).unwrap();
            for d in part {
                w.add_document(d).unwrap();
            }
            w.finish().unwrap();
        }
        let d = Documents::megatron(&[dir.join("a"), dir.join("b")]).unwrap();
        (d, docs)
    }

    fn tokens_of(s: &Sample, name: &str) -> Vec<i64> {
        let Some(Field::Array(a)) = s.get(name) else {
            panic!("no {name}")
        };
        match a.dtype {
            DType::I64 => a
                .data
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            DType::I32 => a
                .data
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
                .collect(),
            DType::Bool => a.data.iter().map(|&b| b as i64).collect(),
            d => panic!("{d}"),
        }
    }

    fn plan(src: &PackedSource, shuffle: Shuffle, epoch: u64) -> Plan {
        let cfg = PlanConfig {
            shuffle,
            epoch,
            seed: 3,
            ..Default::default()
        };
        Plan::new(src.manifest(), &cfg).unwrap()
    }

    /// Every sample's fields from `read` equal the columnar path's rows.
    fn same_paths(src: &PackedSource, ids: &[u64]) {
        let pool = BufferPool::new(4);
        let cols = src.collate(ids, &pool).unwrap().unwrap();
        for (i, &id) in ids.iter().enumerate() {
            let s = src.read(id).unwrap();
            for (name, col) in &cols {
                let want = match s.get(name) {
                    Some(Field::Array(a)) => a.data.to_vec(),
                    _ => panic!("{name}"),
                };
                let got = match col {
                    Column::Tensor(t) => {
                        let w = t.as_bytes().len() / ids.len();
                        t.as_bytes()[i * w..(i + 1) * w].to_vec()
                    }
                    Column::List(l) => l[i].as_bytes().to_vec(),
                    _ => panic!(),
                };
                assert_eq!(got, want, "{name} of sample {id}");
            }
        }
    }

    #[test]
    fn concat_windows_hold_every_token_of_the_epoch_once() {
        let dir = tempfile::tempdir().unwrap();
        let (docs, raw) = corpus(dir.path(), 300, 40);
        let seq_len = 15;
        let opts = PackOptions {
            seq_len,
            eos_id: Some(0),
            ..Default::default()
        };
        let src = PackedSource::new(docs, opts).unwrap();
        let total: usize = raw.iter().map(|d| d.len() + 1).sum();
        let w = seq_len + 1;
        assert_eq!(
            src.manifest().total_samples(),
            (total / w) as u64,
            "the tail is not a window"
        );
        let stream = |src: &PackedSource| -> Vec<i64> {
            (0..src.manifest().total_samples())
                .flat_map(|id| {
                    let t = tokens_of(&src.read(id).unwrap(), "tokens");
                    assert_eq!(t.len(), w);
                    t
                })
                .collect()
        };
        // Files' order: the documents' tokens, each followed by EOS, cut every 16 tokens.
        let flat: Vec<i64> = raw
            .iter()
            .flat_map(|d| d.iter().map(|&t| t as i64).chain([0]))
            .collect();
        assert_eq!(stream(&src), flat[..flat.len() / w * w]);
        // Shuffled epochs: a new document order each, the windows still its concatenation.
        let mut seen = Vec::new();
        for epoch in 0..2 {
            src.set_plan(&plan(&src, Shuffle::Global, epoch));
            let order = src.current();
            let perm = order.perm.as_ref().unwrap();
            let want: Vec<i64> = (0..raw.len() as u64)
                .flat_map(|k| {
                    let d = &raw[perm.apply(k) as usize];
                    d.iter().map(|&t| t as i64).chain([0])
                })
                .collect();
            let got = stream(&src);
            assert_eq!(got, want[..want.len() / w * w], "epoch {epoch}");
            seen.push(got);
            same_paths(&src, &[0, 5, 3, src.manifest().total_samples() - 1]);
        }
        assert_ne!(seen[0], seen[1], "epochs reorder the documents");
        // Back to epoch 0: the same windows (a resumption rebuilds them).
        src.set_plan(&plan(&src, Shuffle::Global, 0));
        assert_eq!(stream(&src), seen[0]);
    }

    #[test]
    fn document_mode_restarts_positions_at_every_document() {
        let dir = tempfile::tempdir().unwrap();
        let (docs, raw) = corpus(dir.path(), 200, 30);
        let opts = PackOptions {
            pack: Pack::Document,
            seq_len: 31,
            eos_id: Some(0),
            ..Default::default()
        };
        let src = PackedSource::new(docs, opts).unwrap();
        let ends: Vec<i64> = {
            // The concatenation's document starts, in token positions (files' order).
            let mut at = 0i64;
            let mut starts = vec![];
            for d in &raw {
                starts.push(at);
                at += d.len() as i64 + 1;
            }
            starts
        };
        for id in 0..src.manifest().total_samples() {
            let s = src.read(id).unwrap();
            let (tok, pos, seg, cu) = (
                tokens_of(&s, "tokens"),
                tokens_of(&s, "position_ids"),
                tokens_of(&s, "segment_ids"),
                tokens_of(&s, "cu_seqlens"),
            );
            let first = id as i64 * 32;
            for j in 0..32 {
                let g = first + j as i64;
                let starts_doc = ends.binary_search(&g).is_ok();
                assert_eq!(pos[j] == 0, j == 0 || starts_doc, "window {id}, token {j}");
                if j > 0 {
                    assert_eq!(seg[j] == seg[j - 1] + 1, pos[j] == 0);
                    if pos[j] != 0 {
                        assert_eq!(pos[j], pos[j - 1] + 1);
                    }
                }
            }
            assert_eq!(seg[0], 1);
            assert_eq!(*cu.first().unwrap(), 0);
            assert_eq!(*cu.last().unwrap(), 32);
            assert_eq!(cu.len() as i64 - 1, seg[31]);
            for (k, c) in cu[..cu.len() - 1].iter().enumerate() {
                assert_eq!(pos[*c as usize], 0);
                assert_eq!(seg[*c as usize], k as i64 + 1);
            }
            assert_eq!(tok.len(), 32);
        }
        same_paths(&src, &[0, 1, 2, 9]);
    }

    #[test]
    fn best_fit_never_splits_a_document_that_fits() {
        let dir = tempfile::tempdir().unwrap();
        let (docs, raw) = corpus(dir.path(), 500, 80);
        for long in [Long::Split, Long::Drop] {
            let opts = PackOptions {
                pack: Pack::BestFit,
                seq_len: 64,
                eos_id: Some(0),
                pad_id: 9999,
                long,
                window: 100,
                ..Default::default()
            };
            let src = PackedSource::new(docs.clone(), opts).unwrap();
            // Each row's documents, recovered from the segment ids.
            let mut found: Vec<Vec<i64>> = Vec::new();
            for id in 0..src.manifest().total_samples() {
                let s = src.read(id).unwrap();
                let (tok, seg, mask, pos) = (
                    tokens_of(&s, "tokens"),
                    tokens_of(&s, "segment_ids"),
                    tokens_of(&s, "loss_mask"),
                    tokens_of(&s, "position_ids"),
                );
                assert_eq!(tok.len(), 64);
                let used = mask.iter().filter(|&&m| m == 1).count();
                assert!(
                    mask[..used].iter().all(|&m| m == 1) && mask[used..].iter().all(|&m| m == 0)
                );
                assert!(tok[used..].iter().all(|&t| t == 9999), "padded with pad_id");
                assert!(seg[used..].iter().all(|&t| t == 0) && pos[used..].iter().all(|&t| t == 0));
                let mut j = 0;
                while j < used {
                    let k = (j..used).find(|&k| seg[k] != seg[j]).unwrap_or(used);
                    assert_eq!(pos[j..k], (0..(k - j) as i64).collect::<Vec<_>>()[..]);
                    found.push(tok[j..k].to_vec());
                    j = k;
                }
            }
            let with_eos =
                |d: &Vec<u32>| -> Vec<i64> { d.iter().map(|&t| t as i64).chain([0]).collect() };
            let mut want: Vec<Vec<i64>> = Vec::new();
            for d in &raw {
                let d = with_eos(d);
                if d.len() <= 64 {
                    want.push(d);
                } else if long == Long::Split {
                    want.extend(d.chunks(64).map(<[i64]>::to_vec));
                }
            }
            found.sort();
            want.sort();
            assert_eq!(found, want, "{long:?}: every document whole, once");
            let dropped = raw.iter().filter(|d| d.len() + 1 > 64).count() as u64;
            assert_eq!(src.dropped(), if long == Long::Drop { dropped } else { 0 });
            assert!(src.padding_fraction() < 0.1, "{}", src.padding_fraction());
            same_paths(&src, &[0, 7, 3]);
        }
    }

    #[test]
    fn pad_rows_are_the_documents_cut_to_seq_len() {
        let dir = tempfile::tempdir().unwrap();
        let (docs, raw) = corpus(dir.path(), 50, 30);
        let opts = PackOptions {
            pack: Pack::Pad,
            seq_len: 20,
            eos_id: Some(0),
            ..Default::default()
        };
        let src = PackedSource::new(docs, opts).unwrap();
        assert_eq!(src.manifest().total_samples(), 50);
        for (id, d) in raw.iter().enumerate() {
            let got = tokens_of(&src.read(id as u64).unwrap(), "tokens");
            let mut want: Vec<i64> = d.iter().take(19).map(|&t| t as i64).collect();
            want.push(0);
            assert_eq!(got, want, "document {id}");
        }
        let cols = src.collate(&[3, 1], &BufferPool::new(2)).unwrap().unwrap();
        let width = raw[3].len().max(raw[1].len()).min(19) + 1;
        let t = cols[0].1.as_tensor().unwrap();
        assert_eq!(t.shape(), &[2, width]);
        let m = cols[1].1.as_tensor().unwrap().as_bytes();
        assert_eq!(
            m.iter().filter(|&&v| v == 1).count(),
            raw[3].len().min(19) + raw[1].len().min(19) + 2
        );
    }

    #[test]
    fn pad_rounds_up_and_buckets_keep_every_document_once() {
        let dir = tempfile::tempdir().unwrap();
        let (docs, raw) = corpus(dir.path(), 300, 60);
        let opts = PackOptions {
            pack: Pack::Pad,
            seq_len: 64,
            pad_id: 7,
            pad_to_multiple_of: 8,
            bucket: 64,
            ..Default::default()
        };
        let src = PackedSource::new(docs, opts).unwrap();
        let pool = BufferPool::new(4);
        for shuffle in [Shuffle::None, Shuffle::Global] {
            let p = plan(&src, shuffle, 1);
            src.set_plan(&p);
            let mut seen = Vec::new();
            let (mut padded, mut spread) = (0usize, 0usize);
            let ids: Vec<u64> = p.iter().collect();
            for batch in ids.chunks(8) {
                let cols = src.collate(batch, &pool).unwrap().unwrap();
                let t = cols[0].1.as_tensor().unwrap();
                let w = t.shape()[1];
                assert_eq!(w % 8, 0, "rounded up to a multiple of 8");
                let tok = t.as_slice::<i64>().unwrap();
                let mask = cols[1].1.as_tensor().unwrap().as_bytes();
                let lens: Vec<usize> = mask
                    .chunks(w)
                    .map(|r| r.iter().filter(|&&v| v == 1).count())
                    .collect();
                assert!(lens.iter().max().unwrap() + 8 > w);
                for (r, &n) in lens.iter().enumerate() {
                    let row = &tok[r * w..(r + 1) * w];
                    assert!(row[n..].iter().all(|&v| v == 7), "padded with pad_id");
                    seen.push(row[..n].to_vec());
                    padded += w - n;
                }
                spread += lens.iter().max().unwrap() - lens.iter().min().unwrap();
            }
            let mut want: Vec<Vec<i64>> = raw
                .iter()
                .map(|d| d.iter().map(|&v| v as i64).collect())
                .collect();
            want.sort();
            seen.sort();
            assert_eq!(seen, want, "{shuffle:?}: every document once");
            // Sorted groups: batches hold documents of similar lengths.
            assert!(
                spread < ids.len() / 8 * 20,
                "{shuffle:?}: spread {spread}, padding {padded}"
            );
        }
    }

    #[test]
    fn options_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let (docs, _) = corpus(dir.path(), 10, 5);
        let bad = |o: PackOptions| PackedSource::new(docs.clone(), o).unwrap_err().to_string();
        assert!(
            bad(PackOptions {
                seq_len: 0,
                ..Default::default()
            })
            .contains("seq_len")
        );
        assert!(
            bad(PackOptions {
                window: 0,
                ..Default::default()
            })
            .contains("window")
        );
        assert!(
            bad(PackOptions {
                out_dtype: DType::F16,
                ..Default::default()
            })
            .contains("out_dtype")
        );
        assert!("best_fit".parse::<Pack>().is_ok() && "nope".parse::<Pack>().is_err());
    }
}
