//! Chat and instruction data encoded on every core: [`ChatRows`], a
//! [`chute_ops::chat::ChatEncoder`] (a chat template as `transformers` renders it, labels as
//! TRL makes them) as the [`RowEncoder`] that [`crate::OpenOptions::rows`] takes.
//!
//! A row's shape is told by its fields ([`RowFields`]): `messages` (with `tools`,
//! `documents`, `chat_template_kwargs` when present) is a conversation; `prompt` and
//! `completion` a prompt and its completion (strings, or lists of messages); `instruction`,
//! `input` and `output` an Alpaca-style record, which becomes a user message (the
//! instruction, then a blank line and the input when there is one) and the assistant's
//! reply, as a prompt and completion.
//!
//! ```no_run
//! use std::sync::Arc;
//! use chute::chat::ChatRows;
//! use chute::dataset::{Pack, PackOptions};
//! use chute::ops::chat::{ChatOptions, ChatTokenizer};
//!
//! let chat = ChatTokenizer::load("models/qwen".as_ref(), None, 0)?;
//! let rows = ChatRows::new(Arc::new(chat), ChatOptions::default(), Default::default(), 0);
//! let options = chute::OpenOptions {
//!     rows: Some(Arc::new(rows)),
//!     seq_len: Some(4096),
//!     pack: Some(PackOptions { pack: Pack::BestFit, ..Default::default() }),
//!     ..Default::default()
//! };
//! let source = chute::open(&["chats.jsonl"], &options)?; // tokens, labels, position_ids
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::{Arc, Mutex};

use chute_core::{EncodedRow, RowData, RowEncoder, Value};
use chute_ops::chat::{ChatEncoder, ChatOptions, ChatTokenizer, Encoded, RowFields, Skip, row_of};
use chute_pipeline::for_each_parallel;

/// Rows to ids and labels with a chat template, on `workers` threads.
#[derive(Debug, Clone)]
pub struct ChatRows {
    encoder: ChatEncoder,
    fields: RowFields,
    workers: usize,
}

impl ChatRows {
    /// `chat` with `options`, reading `fields`, on `workers` threads (0: one per core).
    pub fn new(
        chat: Arc<ChatTokenizer>,
        options: ChatOptions,
        fields: RowFields,
        workers: usize,
    ) -> ChatRows {
        let workers = match workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        ChatRows {
            encoder: ChatEncoder::new(chat, options),
            fields,
            workers,
        }
    }

    fn encode_one(&self, data: &RowData) -> Result<EncodedRow, String> {
        let parsed;
        let record = match data {
            RowData::Record(r) => r,
            RowData::Json(line) => {
                parsed = Value::from_json(line)
                    .map_err(|e| format!("not JSON ({e}); JSON Lines hold one object a line"))?;
                if !matches!(parsed, Value::Record(..)) {
                    return Err(format!("{}, not a JSON object", parsed.describe()));
                }
                &parsed
            }
        };
        let row = row_of(record, &self.fields)?;
        Ok(match self.encoder.encode(&row)? {
            Encoded::One(s) => EncodedRow::Kept {
                ids: s.ids,
                labels: s.labels,
                truncated: s.truncated,
            },
            Encoded::Split(parts) => {
                EncodedRow::Split(parts.into_iter().map(|s| (s.ids, s.labels)).collect())
            }
            Encoded::Pair(..) => {
                return Err("a preference pair: read chosen and rejected with the chat op".into());
            }
            Encoded::Skipped(Skip::NothingTrained) => EncodedRow::Skipped("no_trained_token"),
            Encoded::Skipped(Skip::TooLong) => EncodedRow::Skipped("too_long"),
        })
    }
}

impl RowEncoder for ChatRows {
    fn fields(&self) -> Vec<String> {
        let f = &self.fields;
        let mut v = vec![
            f.messages.clone(),
            f.tools.clone(),
            f.documents.clone(),
            f.kwargs.clone(),
            f.prompt.clone(),
            f.completion.clone(),
        ];
        v.extend(f.instruction.iter().cloned());
        v.extend([f.chosen.clone(), f.rejected.clone()]);
        v
    }

    fn encode_rows(&self, rows: &[RowData]) -> Vec<Result<EncodedRow, String>> {
        let per = rows.len().div_ceil(self.workers * 8).max(1);
        let parts: Vec<Mutex<Vec<Result<EncodedRow, String>>>> = (0..rows.len().div_ceil(per))
            .map(|_| Mutex::new(Vec::new()))
            .collect();
        let _ = for_each_parallel(parts.len(), self.workers, |j| -> Result<(), String> {
            let out = rows[j * per..((j + 1) * per).min(rows.len())]
                .iter()
                .map(|r| self.encode_one(r))
                .collect();
            *parts[j].lock().unwrap_or_else(|e| e.into_inner()) = out;
            Ok(())
        });
        parts
            .into_iter()
            .flat_map(|p| p.into_inner().unwrap_or_else(|e| e.into_inner()))
            .collect()
    }

    fn vocab_size(&self) -> usize {
        self.encoder.chat().tokenizer().vocab_size()
    }

    fn fingerprint(&self) -> String {
        format!("{}:{:?}", self.encoder.fingerprint(), self.fields)
    }
}
