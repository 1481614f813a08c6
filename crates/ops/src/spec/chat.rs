//! The `chat` op: a sample's conversation (or prompt and completion, or preference pair) to
//! ids and labels with [`crate::chat::ChatEncoder`], loaded once when the ops are built.

use chute_core::{Array, DType, Field, FieldName, Keys, Sample, Value};

use super::Op;
use crate::OpError;

/// A compiled `chat` op.
#[derive(Debug, Clone)]
pub(super) struct ChatOp {
    #[cfg(feature = "chat")]
    encoder: std::sync::Arc<crate::chat::ChatEncoder>,
    /// The fields a row is read from (this op's field in the role its parameters give).
    #[cfg(feature = "chat")]
    fields: crate::chat::RowFields,
    labels: String,
    fingerprint: String,
}

impl PartialEq for ChatOp {
    fn eq(&self, other: &Self) -> bool {
        self.fingerprint == other.fingerprint && self.labels == other.labels
    }
}

impl ChatOp {
    /// Loads the op's tokenizer and templates; the error says what is wrong.
    #[cfg(feature = "chat")]
    pub(super) fn new(op: &Op) -> Result<ChatOp, String> {
        use crate::chat::{ChatEncoder, ChatOptions, ChatTokenizer, RowFields, chat_time};
        let Op::Chat {
            tokenizer,
            chat_template,
            template_name,
            train_on,
            train_on_eos,
            max_length,
            truncation,
            kwargs,
            date,
            tools,
            completion,
            chosen,
            rejected,
            labels,
            add_generation_prompt,
            continue_final_message,
        } = op
        else {
            return Err("not a chat op".into());
        };
        let now = chat_time(date.as_deref())?;
        let chat = ChatTokenizer::load(tokenizer.as_ref(), chat_template.as_deref(), now)?;
        let options = ChatOptions {
            train_on: train_on.as_deref().unwrap_or("assistant").parse()?,
            train_on_eos: *train_on_eos,
            max_length: *max_length,
            truncation: truncation.as_deref().unwrap_or("keep_start").parse()?,
            kwargs: kwargs.clone().unwrap_or_default().into_iter().collect(),
            template_name: template_name.clone(),
            add_generation_prompt: *add_generation_prompt,
            continue_final_message: *continue_final_message,
        };
        let mut fields = RowFields::default();
        if let Some(t) = tools {
            fields.tools = t.clone();
        }
        // The op's own field's role is set when it runs (`row`); these name the others.
        fields.completion = completion.clone().unwrap_or_default();
        fields.chosen = chosen.clone().unwrap_or_default();
        fields.rejected = rejected.clone().unwrap_or_default();
        let encoder = ChatEncoder::new(std::sync::Arc::new(chat), options);
        let fingerprint = format!("{}:{fields:?}", encoder.fingerprint());
        Ok(ChatOp {
            encoder: std::sync::Arc::new(encoder),
            fields,
            labels: labels.clone().unwrap_or_else(|| "labels".into()),
            fingerprint,
        })
    }

    #[cfg(not(feature = "chat"))]
    pub(super) fn new(_: &Op) -> Result<ChatOp, String> {
        Err("this build of chute has no chat templates (cargo feature `chat`)".into())
    }

    /// Runs on `sample`: `name` is the op's field; `output` the ids' field.
    #[cfg(feature = "chat")]
    pub(super) fn apply(
        &self,
        sample: &mut Sample,
        name: &str,
        output: Option<&str>,
    ) -> Result<(), OpError> {
        use crate::chat::{Encoded, Skip, row_of};
        let mut fields = self.fields.clone();
        let pair = !fields.rejected.is_empty();
        if pair && fields.chosen.is_empty() {
            fields.chosen = name.to_string();
        } else if pair || !fields.completion.is_empty() {
            fields.prompt = name.to_string();
        } else {
            fields.messages = name.to_string();
        }
        let wanted = [
            &fields.messages,
            &fields.prompt,
            &fields.completion,
            &fields.chosen,
            &fields.rejected,
            &fields.tools,
            &fields.kwargs,
        ];
        let mut keys: Vec<std::sync::Arc<str>> = Vec::new();
        let mut values = Vec::new();
        for w in wanted {
            if w.is_empty() || keys.iter().any(|k| &**k == w.as_str()) {
                continue;
            }
            if let Some(f) = sample.remove(w) {
                keys.push(std::sync::Arc::from(w.as_str()));
                values.push(f.to_value());
            }
        }
        let record = Value::Record(Keys::from(keys), values);
        let wrong = |why: String| OpError::wrong_input("chat", why);
        let row = row_of(&record, &fields).map_err(wrong)?;
        let ids_of = |ids: &[u32]| -> Field {
            let data: Vec<u8> = ids
                .iter()
                .flat_map(|&i| i64::from(i).to_le_bytes())
                .collect();
            Field::Array(Array::new(DType::I64, vec![ids.len()], data.into()))
        };
        let labels_of = |l: &[i64]| -> Field {
            let data: Vec<u8> = l.iter().flat_map(|x| x.to_le_bytes()).collect();
            Field::Array(Array::new(DType::I64, vec![l.len()], data.into()))
        };
        match self.encoder.encode(&row).map_err(wrong)? {
            Encoded::One(s) => {
                let out = output.unwrap_or("input_ids").to_string();
                sample.set(FieldName::Owned(out), ids_of(&s.ids));
                sample.set(FieldName::Owned(self.labels.clone()), labels_of(&s.labels));
            }
            Encoded::Pair(c, r) => {
                for (prefix, s) in [("chosen", c), ("rejected", r)] {
                    sample.set(
                        FieldName::Owned(format!("{prefix}_input_ids")),
                        ids_of(&s.ids),
                    );
                    sample.set(
                        FieldName::Owned(format!("{prefix}_labels")),
                        labels_of(&s.labels),
                    );
                }
            }
            Encoded::Split(_) => {
                return Err(wrong(
                    "longer than max_length, and truncation=\"split\" makes several rows of it: \
                     split conversations with chute.dataset(..., chat=True), or cut them here \
                     (keep_start, keep_end)"
                        .into(),
                ));
            }
            Encoded::Skipped(Skip::NothingTrained) => {
                return Err(wrong(
                    "no token of this conversation counts in the loss (no assistant turn to \
                     train on); with on_error=\"skip\" it is a counted skip"
                        .into(),
                ));
            }
            Encoded::Skipped(Skip::TooLong) => {
                return Err(wrong(
                    "longer than max_length (truncation=\"drop\"); with on_error=\"skip\" it is a \
                     counted skip"
                        .into(),
                ));
            }
        }
        Ok(())
    }

    #[cfg(not(feature = "chat"))]
    pub(super) fn apply(&self, _: &mut Sample, _: &str, _: Option<&str>) -> Result<(), OpError> {
        Err(OpError::wrong_input(
            "chat",
            "this build has no chat templates".to_string(),
        ))
    }
}
