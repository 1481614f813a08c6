//! Chat and instruction data for fine-tuning: conversations rendered with a model's chat
//! template as `transformers`' `apply_chat_template` renders them, tokenized as it tokenizes
//! them, and labelled for the loss as TRL labels them (feature `chat`).
//!
//! - [`ChatTemplate`] ([`template`]): a compiled Jinja chat template.
//! - [`ChatTokenizer`]: a tokenizer folder (a `tokenizer.json`, its `tokenizer_config.json`
//!   with the `chat_template` and special tokens, or a `chat_template.jinja`), loaded once.
//! - [`ChatEncoder`]: a [`ChatTokenizer`] with [`ChatOptions`]; [`ChatEncoder::encode`] turns
//!   one row ([`Row`]: a conversation, a prompt and completion, a preference pair) into ids and
//!   labels (-100 where the loss does not count).
//!
//! How labels are found:
//!
//! - A template with `{% generation %}` blocks: the tokens overlapping a block's output are
//!   the assistant's (exactly `return_assistant_tokens_mask`).
//! - Any other template: the assistant's header is what `add_generation_prompt=True` adds
//!   to a conversation, and its end-of-turn token the special token a probe conversation puts
//!   right after an assistant's content; each assistant message's span runs from the end of its
//!   header to the end of its end-of-turn token (or to the end of its content without
//!   `train_on_eos`), found in order in the rendered text, in one pass (nothing is rendered
//!   twice, no prefix is assumed to be kept: a template may drop earlier reasoning). A template
//!   with neither header nor end-of-turn token is located by each message's content.
//! - Prompt and completion, preference pairs: as TRL 1.x: the prompt rendered with the
//!   generation prompt, the whole rendered, and the ids they share from the start masked.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use minijinja::value::{Value as Jv, ValueKind};

use crate::text::{EncodeOptions, TextTokenizer};

mod python;
pub mod template;

pub use template::{ChatTemplate, Rendered, TemplateError};

/// The ignore index of PyTorch's cross-entropy: a label the loss skips.
pub const IGNORE: i64 = -100;

/// What the special-token variables of a template are called (`transformers`' named special
/// tokens).
const SPECIAL_NAMES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// Probe contents: Unicode noncharacters, which real conversations do not hold.
const PROBE_USER: &str = "\u{FDD2}";
const PROBE_ASSISTANT: &str = "\u{FDD3}";

pub(crate) fn digest(bytes: &[u8]) -> u64 {
    bytes.chunks(8).fold(bytes.len() as u64, |h, c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        chute_core::mix64(h ^ u64::from_le_bytes(w))
    })
}

/// The time `strftime_now` formats, from a date (`2024-07-26`, midnight UTC) or a date and
/// time (`2024-07-26T12:30:00`, UTC); `None`: today at midnight UTC (a pinned day, so every
/// conversation of a run renders the same date).
pub fn chat_time(date: Option<&str>) -> Result<i64, String> {
    let Some(d) = date else {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        return Ok(now - now.rem_euclid(86_400));
    };
    let bad = || format!("{d:?} is not a date (YYYY-MM-DD, or YYYY-MM-DDTHH:MM:SS in UTC)");
    let (day, time) = d.split_once(['T', ' ']).unwrap_or((d, "00:00:00"));
    let p: Vec<&str> = day.split('-').collect();
    let [y, m, dd] = p.as_slice() else {
        return Err(bad());
    };
    let (y, m, dd): (i64, u32, u32) = (
        y.parse().map_err(|_| bad())?,
        m.parse().map_err(|_| bad())?,
        dd.parse().map_err(|_| bad())?,
    );
    if !(1..=12).contains(&m) || !(1..=31).contains(&dd) {
        return Err(bad());
    }
    let t: Vec<i64> = time
        .split(':')
        .map(|x| x.parse().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    let secs = match t.as_slice() {
        [h, mi] => h * 3600 + mi * 60,
        [h, mi, s] => h * 3600 + mi * 60 + s,
        _ => return Err(bad()),
    };
    Ok(python::days_from_civil(y, m, dd) * 86_400 + secs)
}

/// Which tokens count in the loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TrainOn {
    /// Every assistant turn (TRL's `assistant_only_loss`, axolotl's `roles_to_train:
    /// [assistant]`).
    #[default]
    Assistant,
    /// The last assistant turn only (torchtune's `train_on_input=False` with the last turn).
    LastAssistant,
    /// Every token.
    All,
}

impl std::str::FromStr for TrainOn {
    type Err = String;

    fn from_str(s: &str) -> Result<TrainOn, String> {
        match s {
            "assistant" => Ok(TrainOn::Assistant),
            "last" | "last_assistant" => Ok(TrainOn::LastAssistant),
            "all" => Ok(TrainOn::All),
            _ => Err(format!(
                "{s:?} is not a choice of tokens to train on; use assistant, last or all"
            )),
        }
    }
}

/// What a sequence longer than [`ChatOptions::max_length`] becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Truncation {
    /// Cut at the end (TRL's `keep_start`).
    #[default]
    KeepStart,
    /// The end kept, and the system prompt (the tokens the first message renders to, when
    /// it is a system message, and they take at most half the row).
    KeepEnd,
    /// Left out (a counted skip).
    Drop,
    /// Split at turn boundaries into conversations that fit, each with the system prompt
    /// (rows of their own: the dataset path only).
    Split,
}

impl std::str::FromStr for Truncation {
    type Err = String;

    fn from_str(s: &str) -> Result<Truncation, String> {
        match s {
            "keep_start" | "right" => Ok(Truncation::KeepStart),
            "keep_end" | "left" => Ok(Truncation::KeepEnd),
            "drop" => Ok(Truncation::Drop),
            "split" => Ok(Truncation::Split),
            _ => Err(format!(
                "{s:?} is not a truncation; use keep_start, keep_end, drop or split"
            )),
        }
    }
}

/// How conversations become ids and labels.
#[derive(Debug, Clone)]
pub struct ChatOptions {
    /// Which tokens count in the loss (default: the assistant's).
    pub train_on: TrainOn,
    /// Whether an assistant turn's end-of-turn token counts (default true; templates with
    /// `{% generation %}` blocks say it themselves).
    pub train_on_eos: bool,
    /// At most this many ids a sequence.
    pub max_length: Option<usize>,
    /// What a longer one becomes.
    pub truncation: Truncation,
    /// More template variables (`enable_thinking`, ...), as JSON; a row's own
    /// `chat_template_kwargs` override them.
    pub kwargs: Vec<(String, serde_json::Value)>,
    /// Which of a tokenizer's named templates to use (default: `tool_use` for a row with
    /// tools when there is one, else `default`).
    pub template_name: Option<String>,
    /// A conversation rendered with the assistant's header after it (`add_generation_prompt`:
    /// prompts for evaluation or generation).
    pub add_generation_prompt: bool,
    /// A conversation whose last message is left open, as `transformers`'
    /// `continue_final_message` leaves it: rendered, then cut after that message's content.
    pub continue_final_message: bool,
}

impl Default for ChatOptions {
    fn default() -> Self {
        ChatOptions {
            train_on: TrainOn::Assistant,
            train_on_eos: true,
            max_length: None,
            truncation: Truncation::KeepStart,
            kwargs: Vec::new(),
            template_name: None,
            add_generation_prompt: false,
            continue_final_message: false,
        }
    }
}

/// A tokenizer with its chat templates and special tokens.
#[derive(Debug)]
pub struct ChatTokenizer {
    tokenizer: TextTokenizer,
    /// The unnamed (or `default`) template, then the named ones.
    templates: Vec<(Option<String>, Arc<Probed>)>,
    /// `bos_token`, `eos_token`, ...: the template variables.
    specials: Vec<(String, String)>,
    digest: u64,
}

/// A template, with what a probe conversation showed about it.
#[derive(Debug)]
struct Probed {
    template: ChatTemplate,
    /// What `add_generation_prompt=True` adds (the assistant's header), if found.
    header: String,
    /// The end-of-turn token after an assistant's content, if any.
    eot: String,
}

impl ChatTokenizer {
    /// The tokenizer in `path`: a folder holding `tokenizer.json` (and `tokenizer_config.json`,
    /// `chat_template.jinja`, `additional_chat_templates/*.jinja` as `save_pretrained` writes
    /// them), or a `tokenizer.json` with those beside it. `chat_template` replaces the folder's:
    /// a template's text (it holds `{{` or `{%`), or a `.jinja` file's path. `now` is what
    /// `strftime_now` formats (seconds since the Unix epoch).
    pub fn load(
        path: &Path,
        chat_template: Option<&str>,
        now: i64,
    ) -> Result<ChatTokenizer, String> {
        let (dir, json) = if path.is_dir() {
            (path.to_path_buf(), path.join("tokenizer.json"))
        } else {
            (
                path.parent().map(Path::to_path_buf).unwrap_or_default(),
                path.to_path_buf(),
            )
        };
        let tokenizer = TextTokenizer::load(&json)?;
        let config_path = dir.join("tokenizer_config.json");
        let config: serde_json::Value = match std::fs::read(&config_path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| format!("{}: not JSON: {e}", config_path.display()))?,
            Err(_) => serde_json::Value::Null,
        };
        let mut specials = Vec::new();
        for name in SPECIAL_NAMES {
            let text = match config.get(name) {
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                Some(serde_json::Value::Object(o)) => o
                    .get("content")
                    .and_then(|c| c.as_str())
                    .map(str::to_string),
                _ => None,
            };
            if let Some(t) = text {
                specials.push((name.to_string(), t));
            }
        }
        let mut sources: Vec<(Option<String>, String)> = Vec::new();
        match chat_template {
            Some(t) if t.contains("{{") || t.contains("{%") => sources.push((None, t.to_string())),
            Some(file) => {
                let text = std::fs::read_to_string(file)
                    .map_err(|e| format!("chat_template {file:?}: neither a template (no {{{{ or {{%}} nor a file that can be read: {e}"))?;
                sources.push((None, text));
            }
            None => {
                let jinja = dir.join("chat_template.jinja");
                if let Ok(text) = std::fs::read_to_string(&jinja) {
                    sources.push((None, text));
                } else {
                    match config.get("chat_template") {
                        Some(serde_json::Value::String(s)) => sources.push((None, s.clone())),
                        Some(serde_json::Value::Array(named)) => {
                            for t in named {
                                let (Some(name), Some(text)) = (
                                    t.get("name").and_then(|n| n.as_str()),
                                    t.get("template").and_then(|n| n.as_str()),
                                ) else {
                                    return Err(format!(
                                        "{}: chat_template is a list whose items are not {{\"name\", \"template\"}}",
                                        config_path.display()
                                    ));
                                };
                                let name = (name != "default").then(|| name.to_string());
                                sources.push((name, text.to_string()));
                            }
                        }
                        _ => {}
                    }
                }
                if let Ok(entries) = std::fs::read_dir(dir.join("additional_chat_templates")) {
                    let mut named: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
                    named.sort();
                    for p in named {
                        if p.extension().is_some_and(|e| e == "jinja")
                            && let (Some(stem), Ok(text)) =
                                (p.file_stem(), std::fs::read_to_string(&p))
                        {
                            sources.push((Some(stem.to_string_lossy().into_owned()), text));
                        }
                    }
                }
            }
        }
        if sources.is_empty() {
            return Err(format!(
                "{} has no chat template (no chat_template in tokenizer_config.json, no \
                 chat_template.jinja): give one (chat_template=...)",
                dir.display()
            ));
        }
        let special_tokens = tokenizer.special_tokens();
        let mut templates = Vec::new();
        let uses_time = sources.iter().any(|(_, t)| t.contains("strftime_now"));
        let mut h = digest(&std::fs::read(&json).unwrap_or_default());
        for (name, text) in sources {
            let template = ChatTemplate::new(&text, now).map_err(|e| {
                format!(
                    "chat template {}: {e}",
                    name.as_deref().unwrap_or("default")
                )
            })?;
            h = chute_core::mix64(h ^ template.digest());
            let mut probed = Probed {
                template,
                header: String::new(),
                eot: String::new(),
            };
            probe(&mut probed, &specials, &special_tokens);
            templates.push((name, Arc::new(probed)));
        }
        for (n, t) in &specials {
            h = chute_core::mix64(h ^ digest(n.as_bytes()) ^ digest(t.as_bytes()).rotate_left(7));
        }
        Ok(ChatTokenizer {
            tokenizer,
            templates,
            specials,
            digest: if uses_time { h ^ now as u64 } else { h },
        })
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    /// What identifies the tokenizer, its templates and the pinned time.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    /// The special token variables (`eos_token` ...).
    pub fn special(&self, name: &str) -> Option<&str> {
        self.specials
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.as_str())
    }

    fn template(&self, name: Option<&str>, tools: bool) -> Result<&Probed, String> {
        let find = |n: Option<&str>| {
            self.templates
                .iter()
                .find(|(tn, _)| tn.as_deref() == n)
                .map(|(_, t)| t.as_ref())
        };
        if let Some(n) = name {
            return find(Some(n))
                .or_else(|| (n == "default").then(|| find(None)).flatten())
                .ok_or_else(|| {
                    let names: Vec<&str> = self
                        .templates
                        .iter()
                        .map(|(n, _)| n.as_deref().unwrap_or("default"))
                        .collect();
                    format!(
                        "no chat template named {n:?} (there are: {})",
                        names.join(", ")
                    )
                });
        }
        if tools && let Some(t) = find(Some("tool_use")) {
            return Ok(t);
        }
        find(None).ok_or_else(|| {
            let names: Vec<&str> = self.templates.iter().filter_map(|(n, _)| n.as_deref()).collect();
            format!(
                "the tokenizer has named chat templates ({}) and no default: choose one (chat_template_name=...)",
                names.join(", ")
            )
        })
    }
}

/// Learns a template's assistant header and end-of-turn token from a probe conversation.
fn probe(p: &mut Probed, specials: &[(String, String)], special_tokens: &[String]) {
    let message = |role: &str, content: &str| {
        Jv::from_object(
            [("role", role), ("content", content)]
                .into_iter()
                .map(|(k, v)| (Jv::from(k), Jv::from(v)))
                .collect::<indexmap::IndexMap<Jv, Jv>>(),
        )
    };
    let render = |messages: Vec<Jv>, generation: bool| {
        let ctx = context(
            specials,
            &[],
            None,
            Jv::from(messages),
            None,
            None,
            generation,
        );
        p.template.render(ctx, 1 << 20).ok().map(|r| r.text)
    };
    let user = message("user", PROBE_USER);
    let alone = render(vec![user.clone()], false);
    // What add_generation_prompt adds, and what an assistant's message renders before its
    // content: the header is what they share (a generation prompt may prefill more, such as
    // DeepSeek-R1's `<think>`; a last message may render more, such as Qwen 3's empty think).
    let prompted = match (&alone, render(vec![user.clone()], true)) {
        (Some(a), Some(b)) => b.strip_prefix(a.as_str()).map(str::to_string),
        _ => None,
    };
    let with_reply = render(
        vec![user.clone(), message("assistant", PROBE_ASSISTANT)],
        false,
    );
    let in_history = match (&alone, &with_reply) {
        (Some(a), Some(t)) => t
            .strip_prefix(a.as_str())
            .and_then(|rest| rest.find(PROBE_ASSISTANT).map(|at| rest[..at].to_string())),
        _ => None,
    };
    // An earlier reply's header (Qwen 3.5 renders a think block before the last reply only).
    let earlier = match &alone {
        Some(a) => render(
            vec![
                user.clone(),
                message("assistant", PROBE_ASSISTANT),
                message("user", PROBE_USER),
                message("assistant", PROBE_USER),
            ],
            false,
        )
        .and_then(|t| {
            let rest = t.strip_prefix(a.as_str())?;
            rest.find(PROBE_ASSISTANT).map(|at| rest[..at].to_string())
        }),
        None => None,
    };
    let common = |a: &str, b: &str| -> usize {
        a.char_indices()
            .zip(b.chars())
            .take_while(|((_, x), y)| x == y)
            .last()
            .map_or(0, |((i, c), _)| i + c.len_utf8())
    };
    // The header is what they all start with.
    p.header = [prompted, in_history, earlier]
        .into_iter()
        .flatten()
        .filter(|h| !h.is_empty())
        .reduce(|a, b| a[..common(&a, &b)].to_string())
        .unwrap_or_default();
    if let Some(t) = with_reply
        && let Some(at) = t.find(PROBE_ASSISTANT)
    {
        let after = &t[at + PROBE_ASSISTANT.len()..];
        let ws = after.len() - after.trim_start().len();
        if let Some(tok) = special_tokens
            .iter()
            .find(|s| after[ws..].starts_with(s.as_str()))
        {
            p.eot = after[..ws + tok.len()].to_string();
        }
    }
}

/// The template's variables: the special tokens, then the options' and the row's keyword
/// arguments, then the conversation's.
fn context(
    specials: &[(String, String)],
    kwargs: &[(String, Jv)],
    row_kwargs: Option<&Jv>,
    messages: Jv,
    tools: Option<&Jv>,
    documents: Option<&Jv>,
    add_generation_prompt: bool,
) -> Jv {
    let mut m = indexmap::IndexMap::with_capacity(specials.len() + kwargs.len() + 4);
    for (k, v) in specials {
        m.insert(Jv::from(k.as_str()), Jv::from(v.as_str()));
    }
    for (k, v) in kwargs {
        m.insert(Jv::from(k.as_str()), v.clone());
    }
    if let Some(rk) = row_kwargs
        && let Ok(keys) = rk.try_iter()
    {
        for k in keys {
            let v = rk.get_item(&k).unwrap_or_default();
            m.insert(k, v);
        }
    }
    m.insert(Jv::from("messages"), messages);
    m.insert(Jv::from("tools"), tools.cloned().unwrap_or(Jv::from(())));
    m.insert(
        Jv::from("documents"),
        documents.cloned().unwrap_or(Jv::from(())),
    );
    m.insert(
        Jv::from("add_generation_prompt"),
        Jv::from(add_generation_prompt),
    );
    Jv::from_object(m)
}

/// A chute value as a template sees it: records as dicts in their field order, without the
/// fields that are null (Arrow gives a record every field of its column, null where the
/// original JSON had none: dropped, `'tool_calls' in message` is as on the original JSON).
pub fn template_value(v: &chute_core::Value) -> Jv {
    use chute_core::Value as V;
    match v {
        V::Null => Jv::from(()),
        V::Bool(b) => Jv::from(*b),
        V::Int(i) => Jv::from(*i),
        V::UInt(u) => Jv::from(*u),
        V::Float(f) => Jv::from(*f),
        V::Text(b) => match std::str::from_utf8(b) {
            Ok(t) => Jv::from(t),
            Err(_) => Jv::from(String::from_utf8_lossy(b).into_owned()),
        },
        V::Bytes(b) => Jv::from_bytes(b.to_vec()),
        V::List(items) => Jv::from(items.iter().map(template_value).collect::<Vec<_>>()),
        V::Record(keys, values) => Jv::from_object(
            keys.iter()
                .zip(values)
                .filter(|(_, v)| !matches!(v, V::Null))
                .map(|(k, v)| (Jv::from(&**k), template_value(v)))
                .collect::<indexmap::IndexMap<Jv, Jv>>(),
        ),
        V::Map(pairs) => Jv::from_object(
            pairs
                .iter()
                .map(|(k, v)| (template_value(k), template_value(v)))
                .collect::<indexmap::IndexMap<Jv, Jv>>(),
        ),
        _ => Jv::from(()),
    }
}

/// A row, as the template and the tokenizer take it: each part a template value (a string,
/// or a list of messages).
#[derive(Debug, Clone)]
pub enum Row {
    /// A conversation.
    Messages {
        /// The messages: dicts with a `role`, and `content` (a string, a list of parts, or none
        /// for an assistant's tool calls), `tool_calls`, `reasoning_content`, `train`, ...
        messages: Jv,
        /// The tools (JSON-schema dicts).
        tools: Option<Jv>,
        /// Documents for retrieval-augmented templates.
        documents: Option<Jv>,
        /// The row's own template arguments (a dict).
        kwargs: Option<Jv>,
    },
    /// A prompt and its completion: both strings (tokenized as they are, the completion
    /// ending with the EOS token), or both lists of messages (rendered).
    PromptCompletion {
        /// The prompt.
        prompt: Jv,
        /// The completion.
        completion: Jv,
        /// The tools.
        tools: Option<Jv>,
        /// The row's template arguments.
        kwargs: Option<Jv>,
    },
    /// A preference pair for DPO: a prompt (found as the longest shared start when absent)
    /// and the chosen and rejected completions.
    Preference {
        /// The prompt, if given.
        prompt: Option<Jv>,
        /// The preferred completion.
        chosen: Jv,
        /// The other.
        rejected: Jv,
        /// The tools.
        tools: Option<Jv>,
        /// The row's template arguments.
        kwargs: Option<Jv>,
    },
}

/// The names of the fields rows are read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowFields {
    /// A conversation's messages (default `messages`).
    pub messages: String,
    /// Its tools (default `tools`).
    pub tools: String,
    /// Its documents (default `documents`).
    pub documents: String,
    /// Its template arguments, a dict (default `chat_template_kwargs`).
    pub kwargs: String,
    /// A prompt (default `prompt`).
    pub prompt: String,
    /// Its completion (default `completion`).
    pub completion: String,
    /// An instruction record's instruction, input and output (defaults `instruction`,
    /// `input`, `output`).
    pub instruction: [String; 3],
    /// A preference pair's chosen and rejected completions (defaults `chosen`, `rejected`).
    pub chosen: String,
    /// See `chosen`.
    pub rejected: String,
}

impl Default for RowFields {
    fn default() -> Self {
        RowFields {
            messages: "messages".into(),
            tools: "tools".into(),
            documents: "documents".into(),
            kwargs: "chat_template_kwargs".into(),
            prompt: "prompt".into(),
            completion: "completion".into(),
            instruction: ["instruction".into(), "input".into(), "output".into()],
            chosen: "chosen".into(),
            rejected: "rejected".into(),
        }
    }
}

/// A record's row, as the encoder takes it, told by the fields it has (see [`RowFields`]).
pub fn row_of(record: &chute_core::Value, f: &RowFields) -> Result<Row, String> {
    use chute_core::Value;
    let get = |name: &str| -> Option<&Value> {
        record.get(name).filter(|v| match v {
            Value::Null => false,
            Value::Text(t) => name != f.tools.as_str() || !t.is_empty(),
            Value::List(l) => name != f.tools.as_str() || !l.is_empty(),
            _ => true,
        })
    };
    let jv = |v: &Value| -> Jv {
        // A JSON string column of tools (as some datasets store them) is parsed.
        template_value(v)
    };
    let tools = get(&f.tools).map(|t| match t {
        Value::Text(b) => match Value::from_json(b) {
            Ok(v) => jv(&v),
            Err(_) => jv(t),
        },
        other => jv(other),
    });
    let kwargs = get(&f.kwargs).map(jv);
    if let Some(m) = get(&f.messages) {
        return Ok(Row::Messages {
            messages: jv(m),
            tools,
            documents: get(&f.documents).map(jv),
            kwargs,
        });
    }
    if let (Some(c), Some(r)) = (get(&f.chosen), get(&f.rejected)) {
        return Ok(Row::Preference {
            prompt: get(&f.prompt).map(jv),
            chosen: jv(c),
            rejected: jv(r),
            tools,
            kwargs,
        });
    }
    if let (Some(p), Some(c)) = (get(&f.prompt), get(&f.completion)) {
        return Ok(Row::PromptCompletion {
            prompt: jv(p),
            completion: jv(c),
            tools,
            kwargs,
        });
    }
    let [i, x, o] = &f.instruction;
    if let (Some(instruction), Some(output)) = (get(i), get(o)) {
        let text = |v: &Value| v.as_str().map(str::to_string).unwrap_or_default();
        let mut user = text(instruction);
        if let Some(input) = get(x).map(text).filter(|s| !s.is_empty()) {
            user.push_str("\n\n");
            user.push_str(&input);
        }
        let message = |role: &str, content: String| {
            Jv::from_object(indexmap::IndexMap::from([
                (Jv::from("role"), Jv::from(role)),
                (Jv::from("content"), Jv::from(content)),
            ]))
        };
        return Ok(Row::PromptCompletion {
            prompt: Jv::from(vec![message("user", user)]),
            completion: Jv::from(vec![message("assistant", text(output))]),
            tools,
            kwargs,
        });
    }
    let has = match record {
        Value::Record(k, _) => k
            .iter()
            .map(|k| k.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        _ => String::new(),
    };
    Err(format!(
        "no {:?} field, no {:?} and {:?}, no {:?} and {:?} (it has: {}); name the fields \
         (messages_field=...)",
        f.messages, f.prompt, f.completion, i, o, has
    ))
}

/// Token ids and their labels (the id where the loss counts it, [`IGNORE`] elsewhere).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Sequence {
    /// The ids.
    pub ids: Vec<u32>,
    /// The labels, as many.
    pub labels: Vec<i64>,
    /// Whether it was cut to the maximum length.
    pub truncated: bool,
}

impl Sequence {
    /// Whether any token counts in the loss.
    pub fn trains(&self) -> bool {
        self.labels.iter().any(|&l| l != IGNORE)
    }
}

/// What a row became.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Encoded {
    /// One sequence.
    One(Sequence),
    /// A preference pair: the chosen and rejected sequences, each with the prompt masked.
    Pair(Sequence, Sequence),
    /// A conversation longer than the maximum split at turn boundaries
    /// ([`Truncation::Split`]), each part a conversation of its own.
    Split(Vec<Sequence>),
    /// Left out, for this reason (counted by the caller).
    Skipped(Skip),
}

/// Why a row was left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// No token counts in the loss.
    NothingTrained,
    /// Longer than the maximum length, with [`Truncation::Drop`].
    TooLong,
}

/// A [`ChatTokenizer`] with its options: rows to ids and labels, on any thread.
#[derive(Debug, Clone)]
pub struct ChatEncoder {
    chat: Arc<ChatTokenizer>,
    options: ChatOptions,
    kwargs: Vec<(String, Jv)>,
}

impl ChatEncoder {
    /// `chat` encoding with `options`.
    pub fn new(chat: Arc<ChatTokenizer>, options: ChatOptions) -> ChatEncoder {
        let kwargs = options
            .kwargs
            .iter()
            .map(|(k, v)| (k.clone(), Jv::from(minijinja::value::Serde(v))))
            .collect();
        ChatEncoder {
            chat,
            options,
            kwargs,
        }
    }

    /// The tokenizer and templates.
    pub fn chat(&self) -> &ChatTokenizer {
        &self.chat
    }

    /// The options.
    pub fn options(&self) -> &ChatOptions {
        &self.options
    }

    /// What identifies the tokenizer, templates and options (for fingerprints).
    pub fn fingerprint(&self) -> String {
        let o = &self.options;
        let kw =
            serde_json::to_string(&o.kwargs.iter().cloned().collect::<serde_json::Map<_, _>>())
                .unwrap_or_default();
        format!(
            "chat:{:016x}:{:?}:eos={}:max={:?}:{:?}:{:016x}:{:?}:gen={}:cont={}",
            self.chat.digest,
            o.train_on,
            o.train_on_eos,
            o.max_length,
            o.truncation,
            digest(kw.as_bytes()),
            o.template_name,
            o.add_generation_prompt,
            o.continue_final_message
        )
    }

    /// Renders, tokenizes and labels one row. The error says what was wrong (the caller
    /// names the file and row).
    pub fn encode(&self, row: &Row) -> Result<Encoded, String> {
        match row {
            Row::Messages {
                messages,
                tools,
                documents,
                kwargs,
            } => {
                let messages = normalize(messages)?;
                let seq = self.messages(
                    &messages,
                    tools.as_ref(),
                    documents.as_ref(),
                    kwargs.as_ref(),
                )?;
                if self.options.truncation == Truncation::Split
                    && let Some(max) = self.options.max_length
                    && seq.ids.len() > max
                {
                    let parts = (tools.as_ref(), documents.as_ref(), kwargs.as_ref());
                    return self.split(&messages, parts, max);
                }
                Ok(self.finish(seq, &messages, tools.as_ref(), kwargs.as_ref()))
            }
            Row::PromptCompletion {
                prompt,
                completion,
                tools,
                kwargs,
            } => {
                let seq =
                    self.prompt_completion(prompt, completion, tools.as_ref(), kwargs.as_ref())?;
                Ok(self.finish(seq, &[], None, None))
            }
            Row::Preference {
                prompt,
                chosen,
                rejected,
                tools,
                kwargs,
            } => self.preference(
                prompt.as_ref(),
                chosen,
                rejected,
                tools.as_ref(),
                kwargs.as_ref(),
            ),
        }
    }

    /// Length and the nothing-trained check.
    fn finish(
        &self,
        mut seq: Sequence,
        messages: &[Jv],
        tools: Option<&Jv>,
        kwargs: Option<&Jv>,
    ) -> Encoded {
        if let Some(max) = self.options.max_length
            && seq.ids.len() > max
        {
            match self.options.truncation {
                Truncation::Drop => return Encoded::Skipped(Skip::TooLong),
                Truncation::KeepStart | Truncation::Split => {
                    seq.ids.truncate(max);
                    seq.labels.truncate(max);
                }
                Truncation::KeepEnd => {
                    // The system prompt is kept when it leaves at least half the row to the
                    // end of the conversation.
                    let system = self.system_prefix(&seq, messages, tools, kwargs);
                    let keep = if system <= max / 2 { system } else { 0 };
                    let tail = seq.ids.len() - (max - keep);
                    seq.ids.drain(keep..tail);
                    seq.labels.drain(keep..tail);
                }
            }
            seq.truncated = true;
        }
        if !seq.trains() {
            return Encoded::Skipped(Skip::NothingTrained);
        }
        Encoded::One(seq)
    }

    /// A conversation longer than `max` ids split at turn boundaries: its system messages,
    /// then as many whole turns (a user message and what follows it up to the next) as fit in
    /// `max`, each part rendered as a conversation of its own; a turn that does not fit alone
    /// is cut at the end. Parts with nothing to train on are left out.
    fn split(
        &self,
        messages: &[Jv],
        (tools, documents, kwargs): (Option<&Jv>, Option<&Jv>, Option<&Jv>),
        max: usize,
    ) -> Result<Encoded, String> {
        let head = messages
            .iter()
            .take_while(|m| role(m).as_deref() == Some("system"))
            .count();
        let mut turns: Vec<Range<usize>> = Vec::new();
        for (i, m) in messages.iter().enumerate().skip(head) {
            match turns.last_mut() {
                Some(t) if role(m).as_deref() != Some("user") => t.end = i + 1,
                _ => turns.push(i..i + 1),
            }
        }
        let encode = |range: Range<usize>| -> Result<Sequence, String> {
            let part: Vec<Jv> = messages[..head]
                .iter()
                .chain(&messages[range])
                .cloned()
                .collect();
            self.messages(&part, tools, documents, kwargs)
        };
        let mut parts = Vec::new();
        let mut t = 0;
        while t < turns.len() {
            let mut seq = encode(turns[t].start..turns[t].end)?;
            let mut end = t + 1;
            while end < turns.len() && seq.ids.len() <= max {
                let longer = encode(turns[t].start..turns[end].end)?;
                if longer.ids.len() > max {
                    break;
                }
                seq = longer;
                end += 1;
            }
            if seq.ids.len() > max {
                seq.ids.truncate(max);
                seq.labels.truncate(max);
                seq.truncated = true;
            }
            if seq.trains() {
                parts.push(seq);
            }
            t = end;
        }
        Ok(match parts.len() {
            0 => Encoded::Skipped(Skip::NothingTrained),
            _ => Encoded::Split(parts),
        })
    }

    /// How many of `seq`'s first ids are the system prompt's: those of the first message
    /// rendered alone, when it is a system message and its ids start `seq`.
    fn system_prefix(
        &self,
        seq: &Sequence,
        messages: &[Jv],
        tools: Option<&Jv>,
        kwargs: Option<&Jv>,
    ) -> usize {
        let Some(first) = messages.first() else {
            return 0;
        };
        if role(first).as_deref() != Some("system") {
            return 0;
        }
        let Ok(t) = self
            .chat
            .template(self.options.template_name.as_deref(), tools.is_some())
        else {
            return 0;
        };
        let ctx = self.context(Jv::from(vec![first.clone()]), tools, None, kwargs, false);
        let Ok(r) = t.template.render(ctx, self.max_text()) else {
            return 0;
        };
        let Ok((ids, _)) = self.chat.tokenizer.encode_with_offsets(&r.text) else {
            return 0;
        };
        common_prefix(&ids, &seq.ids)
    }

    fn max_text(&self) -> usize {
        chute_core::Limits::current().max_text_bytes as usize
    }

    fn context(
        &self,
        messages: Jv,
        tools: Option<&Jv>,
        documents: Option<&Jv>,
        kwargs: Option<&Jv>,
        generation: bool,
    ) -> Jv {
        context(
            &self.chat.specials,
            &self.kwargs,
            kwargs,
            messages,
            tools,
            documents,
            generation,
        )
    }

    fn render(
        &self,
        messages: &[Jv],
        tools: Option<&Jv>,
        documents: Option<&Jv>,
        kwargs: Option<&Jv>,
        generation: bool,
    ) -> Result<(Rendered, &Probed), String> {
        let t = self
            .chat
            .template(self.options.template_name.as_deref(), tools.is_some())?;
        let ctx = self.context(
            Jv::from(messages.to_vec()),
            tools,
            documents,
            kwargs,
            generation,
        );
        let r = t
            .template
            .render(ctx, self.max_text())
            .map_err(|e| e.to_string())?;
        Ok((r, t))
    }

    fn messages(
        &self,
        messages: &[Jv],
        tools: Option<&Jv>,
        documents: Option<&Jv>,
        kwargs: Option<&Jv>,
    ) -> Result<Sequence, String> {
        let (r, probed) = if self.options.continue_final_message {
            self.render_continued(messages, tools, documents, kwargs)?
        } else {
            let prompt = self.options.add_generation_prompt;
            self.render(messages, tools, documents, kwargs, prompt)?
        };
        let spans = if self.options.train_on == TrainOn::All {
            std::iter::once(0..r.text.len()).collect()
        } else {
            self.spans(&r, probed, messages)?
        };
        let (ids, offsets) = self.chat.tokenizer.encode_with_offsets(&r.text)?;
        Ok(Sequence {
            labels: labels_of(&ids, &offsets, &spans),
            ids,
            truncated: false,
        })
    }

    /// `continue_final_message`, as `transformers` does it: the last message's content (or
    /// its last text part) tagged, the conversation rendered, and the text cut where the tag
    /// is (and its trailing space too when the template trimmed the tag's).
    fn render_continued(
        &self,
        messages: &[Jv],
        tools: Option<&Jv>,
        documents: Option<&Jv>,
        kwargs: Option<&Jv>,
    ) -> Result<(Rendered, &Probed), String> {
        const TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";
        if self.options.add_generation_prompt {
            return Err(
                "continue_final_message and add_generation_prompt are not compatible".into(),
            );
        }
        let Some((last, head)) = messages.split_last() else {
            return Err("continue_final_message is set but the conversation is empty".into());
        };
        let content = last.get_attr("content").unwrap_or_default();
        let tagged = |text: &str| Jv::from(format!("{text}{TAG}"));
        let (final_text, new_content) = match content.as_str() {
            Some(t) => (t.to_string(), tagged(t)),
            None if content.kind() == ValueKind::Seq => {
                let mut parts: Vec<Jv> = content.try_iter().map_err(|e| e.to_string())?.collect();
                let Some(at) = parts
                    .iter()
                    .rposition(|p| p.get_attr("text").is_ok_and(|t| t.as_str().is_some()))
                else {
                    return Err("continue_final_message is set but the final message has no text to continue".into());
                };
                let text = parts[at].get_attr("text").unwrap_or_default();
                let text = text.as_str().unwrap_or_default().to_string();
                parts[at] = with_field(&parts[at], "text", tagged(&text))?;
                (text, Jv::from(parts))
            }
            None => {
                return Err("continue_final_message is set but the final message has no content to continue".into());
            }
        };
        let mut all = head.to_vec();
        all.push(with_field(last, "content", new_content)?);
        let (mut r, t) = self.render(&all, tools, documents, kwargs, false)?;
        let tag = TAG.trim();
        let Some(at) = r
            .text
            .rfind(tag)
            .filter(|_| r.text.contains(final_text.trim()))
        else {
            return Err("continue_final_message is set but the final message does not appear in the rendered text (the template changes it)".into());
        };
        let end = if r.text[at..].starts_with(TAG) {
            at
        } else {
            r.text[..at].trim_end().len()
        };
        r.text.truncate(end);
        for s in &mut r.generation {
            s.end = s.end.min(end);
            s.start = s.start.min(end);
        }
        r.generation.retain(|s| !s.is_empty());
        Ok((r, t))
    }

    /// The byte ranges of the rendered text that count in the loss.
    fn spans(
        &self,
        r: &Rendered,
        probed: &Probed,
        messages: &[Jv],
    ) -> Result<Vec<Range<usize>>, String> {
        let flags: Vec<Option<bool>> = messages.iter().map(train_flag).collect();
        let flagged = flags.iter().any(Option::is_some);
        let assistants: Vec<usize> = (0..messages.len())
            .filter(|&i| role(&messages[i]).as_deref() == Some("assistant"))
            .collect();
        let wanted = |i: usize| -> bool {
            let is_assistant = role(&messages[i]).as_deref() == Some("assistant");
            match flags[i] {
                Some(f) => f,
                None if !is_assistant => false,
                None => match self.options.train_on {
                    TrainOn::LastAssistant => assistants.last() == Some(&i),
                    _ => true,
                },
            }
        };
        if probed.template.has_generation() {
            let g = &r.generation;
            if !flagged {
                return Ok(match self.options.train_on {
                    TrainOn::LastAssistant => g.last().cloned().into_iter().collect(),
                    _ => g.clone(),
                });
            }
            if g.len() != assistants.len()
                || flags
                    .iter()
                    .enumerate()
                    .any(|(i, f)| *f == Some(true) && !assistants.contains(&i))
            {
                return Err(format!(
                    "the messages have train flags, but the template's {} {{% generation %}} blocks \
                     do not match its {} assistant messages one to one (flags are honoured on \
                     assistant messages only with such templates)",
                    g.len(),
                    assistants.len()
                ));
            }
            return Ok(assistants
                .iter()
                .zip(g)
                .filter(|(i, _)| wanted(**i))
                .map(|(_, s)| s.clone())
                .collect());
        }
        // No generation blocks: each message found in order in the text.
        let text = r.text.as_str();
        let mut cursor = 0usize;
        let mut spans = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            let is_assistant = role(m).as_deref() == Some("assistant");
            let body = content_text(m);
            let core = body.as_deref().map(str::trim).unwrap_or("");
            let found = |what: &str| {
                (!what.is_empty())
                    .then(|| text[cursor..].find(what))
                    .flatten()
            };
            let content_at = found(core);
            let (start, content_end) = if is_assistant {
                let header_at = found(&probed.header);
                let start = match (header_at, content_at) {
                    // The content before any header: a turn the template renders without one
                    // (DeepSeek's reply after tool outputs).
                    (Some(h), Some(c)) if c < h => cursor + c,
                    (Some(h), _) => cursor + h + probed.header.len(),
                    (None, Some(c)) => cursor + c,
                    (None, None) if wanted(i) && !core.is_empty() => {
                        return Err(format!(
                            "assistant message {i} is not in the rendered text where its header \
                             ({:?}) or content would be (the template changes it); give the \
                             template {{% generation %}} blocks (chat_template=...) to say what \
                             to train on",
                            probed.header
                        ));
                    }
                    // An empty reply without a header: just its end-of-turn token, if any.
                    (None, None) => {
                        let eot = probed.eot.trim_start();
                        (!eot.is_empty())
                            .then(|| text[cursor..].find(eot))
                            .flatten()
                            .map_or(cursor, |p| cursor + p)
                    }
                };
                let end = if core.is_empty() {
                    start
                } else {
                    text[start..]
                        .find(core)
                        .map_or(start, |p| start + p + core.len())
                };
                (start, end)
            } else {
                match content_at {
                    Some(p) => (cursor + p, cursor + p + core.len()),
                    None => (cursor, cursor),
                }
            };
            let mut end = content_end;
            let mut turn_end = content_end;
            if is_assistant && !probed.eot.is_empty() {
                let eot = probed.eot.trim_start();
                let from = content_end.max(start);
                // Its own end-of-turn token: one before the next assistant header (gpt-oss
                // ends earlier turns otherwise than the last).
                let limit = (!probed.header.is_empty())
                    .then(|| text[from..].find(probed.header.as_str()))
                    .flatten()
                    .map_or(text.len(), |p| from + p);
                if let Some(p) = text[from..limit].find(eot) {
                    let at = from + p;
                    turn_end = at + eot.len();
                    end = if self.options.train_on_eos {
                        turn_end
                    } else {
                        at
                    };
                }
            }
            if wanted(i) && end > start {
                spans.push(start..end);
            }
            cursor = cursor.max(turn_end).max(end);
        }
        Ok(spans)
    }

    /// The ids of a prompt alone (with the generation prompt) and of the prompt and its
    /// completion, as TRL tokenizes them: strings as they are (the tokenizer's special tokens
    /// added, the EOS text after the completion), messages rendered.
    fn prompt_and_whole(
        &self,
        prompt: &Jv,
        completion: &Jv,
        tools: Option<&Jv>,
        kwargs: Option<&Jv>,
    ) -> Result<(Vec<u32>, Vec<u32>), String> {
        if let (Some(p), Some(c)) = (prompt.as_str(), completion.as_str()) {
            let mut whole = format!("{p}{c}");
            if let Some(eos) = self.chat.special("eos_token")
                && !c.ends_with(eos)
            {
                whole.push_str(eos);
            }
            let special = EncodeOptions {
                add_special_tokens: true,
                ..Default::default()
            };
            return Ok((
                self.chat.tokenizer.encode(p, special)?,
                self.chat.tokenizer.encode(&whole, special)?,
            ));
        }
        let p = normalize(prompt).map_err(|e| format!("prompt: {e}"))?;
        let c = normalize(completion).map_err(|e| format!("completion: {e}"))?;
        let (rp, _) = self.render(&p, tools, None, kwargs, true)?;
        let (pi, _) = self.chat.tokenizer.encode_with_offsets(&rp.text)?;
        let all: Vec<Jv> = p.iter().chain(&c).cloned().collect();
        let (rw, _) = self.render(&all, tools, None, kwargs, false)?;
        let (wi, _) = self.chat.tokenizer.encode_with_offsets(&rw.text)?;
        Ok((pi, wi))
    }

    fn prompt_completion(
        &self,
        prompt: &Jv,
        completion: &Jv,
        tools: Option<&Jv>,
        kwargs: Option<&Jv>,
    ) -> Result<Sequence, String> {
        let (prompt_ids, full) = self.prompt_and_whole(prompt, completion, tools, kwargs)?;
        let n = common_prefix(&prompt_ids, &full);
        Ok(masked_prefix(full, n))
    }

    fn preference(
        &self,
        prompt: Option<&Jv>,
        chosen: &Jv,
        rejected: &Jv,
        tools: Option<&Jv>,
        kwargs: Option<&Jv>,
    ) -> Result<Encoded, String> {
        let (prompt, chosen, rejected) = match prompt {
            Some(p) => (p.clone(), chosen.clone(), rejected.clone()),
            None => extract_prompt(chosen, rejected)?,
        };
        let sequences = |completion: &Jv| self.prompt_and_whole(&prompt, completion, tools, kwargs);
        let (pc, c) = sequences(&chosen)?;
        let (pr, r) = sequences(&rejected)?;
        let n = common_prefix(&pc, &c).min(common_prefix(&pr, &r));
        let mut out = Vec::with_capacity(2);
        for ids in [c, r] {
            match self.finish(masked_prefix(ids, n), &[], None, None) {
                Encoded::One(s) => out.push(s),
                skipped => return Ok(skipped),
            }
        }
        let rejected = out.pop().unwrap_or_default();
        let chosen = out.pop().unwrap_or_default();
        Ok(Encoded::Pair(chosen, rejected))
    }
}

/// TRL's `extract_prompt`: the longest shared start of the chosen and rejected completions
/// (messages, or characters with a space before the first difference left to the
/// completions).
fn extract_prompt(chosen: &Jv, rejected: &Jv) -> Result<(Jv, Jv, Jv), String> {
    if let (Some(c), Some(r)) = (chosen.as_str(), rejected.as_str()) {
        let c: Vec<char> = c.chars().collect();
        let r: Vec<char> = r.chars().collect();
        let n = c.len().min(r.len());
        let mut idx = n.saturating_sub(1);
        for i in 0..n {
            if c[i] != r[i] {
                idx = if i > 0 && c[i - 1] == ' ' { i - 1 } else { i };
                break;
            }
        }
        let s = |v: &[char]| Jv::from(v.iter().collect::<String>());
        return Ok((s(&c[..idx]), s(&c[idx..]), s(&r[idx..])));
    }
    let c = normalize(chosen).map_err(|e| format!("chosen: {e}"))?;
    let r = normalize(rejected).map_err(|e| format!("rejected: {e}"))?;
    let n = c.len().min(r.len());
    let mut idx = n.saturating_sub(1);
    for i in 0..n {
        if c[i] != r[i] {
            idx = i;
            break;
        }
    }
    Ok((
        Jv::from(c[..idx].to_vec()),
        Jv::from(c[idx..].to_vec()),
        Jv::from(r[idx..].to_vec()),
    ))
}

/// `map` (a dict) with `key` set to `value`, in its place or last.
fn with_field(map: &Jv, key: &str, value: Jv) -> Result<Jv, String> {
    let mut d = indexmap::IndexMap::new();
    for k in map.try_iter().map_err(|e| e.to_string())? {
        let v = map.get_item(&k).unwrap_or_default();
        d.insert(k, v);
    }
    d.insert(Jv::from(key), value);
    Ok(Jv::from_object(d))
}

/// `ids` with the first `n` labelled [`IGNORE`].
fn masked_prefix(ids: Vec<u32>, n: usize) -> Sequence {
    let labels = ids
        .iter()
        .enumerate()
        .map(|(i, &t)| if i < n { IGNORE } else { i64::from(t) })
        .collect();
    Sequence {
        ids,
        labels,
        truncated: false,
    }
}

/// How many ids `a` and `b` share from the start.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// A message's role, if it is a string.
fn role(m: &Jv) -> Option<String> {
    m.get_attr("role").ok()?.as_str().map(str::to_string)
}

/// A message's `train` flag (a bool, or 0/1), if it has one.
fn train_flag(m: &Jv) -> Option<bool> {
    let v = m.get_attr("train").ok()?;
    match v.kind() {
        ValueKind::Bool | ValueKind::Number => Some(v.is_true()),
        _ => None,
    }
}

/// A message's text: its content when a string, or its text parts joined.
fn content_text(m: &Jv) -> Option<String> {
    let c = m.get_attr("content").ok()?;
    if let Some(s) = c.as_str() {
        return Some(s.to_string());
    }
    if c.kind() == ValueKind::Seq {
        let mut out = String::new();
        for part in c.try_iter().ok()? {
            if let Some(t) = part
                .get_attr("text")
                .ok()
                .and_then(|t| t.as_str().map(str::to_string))
            {
                out.push_str(&t);
            }
        }
        return Some(out);
    }
    None
}

/// The messages of a conversation checked (each a dict with a string `role`; `content` a
/// string, a list of parts or absent) and with their reasoning under the names templates read,
/// as `transformers` passes them (`reasoning_content`, `thinking`).
fn normalize(messages: &Jv) -> Result<Vec<Jv>, String> {
    if messages.kind() != ValueKind::Seq {
        return Err(format!(
            "the messages are {}, not a list of messages",
            messages.kind()
        ));
    }
    let mut out = Vec::with_capacity(messages.len().unwrap_or(0));
    for (i, m) in messages.try_iter().map_err(|e| e.to_string())?.enumerate() {
        if m.kind() != ValueKind::Map {
            return Err(format!(
                "message {i} is {}, not a dict with a role and content",
                m.kind()
            ));
        }
        match m.get_attr("role") {
            Ok(r) if r.kind() == ValueKind::String => {}
            Ok(r) if r.is_undefined() || r.is_none() => {
                return Err(format!("message {i} has no role"));
            }
            Ok(r) => return Err(format!("message {i}'s role is {}, not a string", r.kind())),
            Err(e) => return Err(format!("message {i}: {e}")),
        }
        if let Ok(c) = m.get_attr("content")
            && !matches!(
                c.kind(),
                ValueKind::String | ValueKind::Seq | ValueKind::Undefined | ValueKind::None
            )
        {
            return Err(format!(
                "message {i}'s content is {}, not a string or a list of parts",
                c.kind()
            ));
        }
        let reasoning = ["reasoning_content", "thinking", "reasoning"]
            .into_iter()
            .find_map(|k| {
                m.get_attr(k)
                    .ok()
                    .filter(|v| !v.is_undefined() && !v.is_none())
            });
        match reasoning {
            None => out.push(m),
            Some(r) => {
                // {"thinking": r, **message, "reasoning_content": r}, as transformers builds it.
                let mut d = indexmap::IndexMap::new();
                d.insert(Jv::from("thinking"), r.clone());
                for k in m.try_iter().map_err(|e| e.to_string())? {
                    let v = m.get_item(&k).unwrap_or_default();
                    d.insert(k, v);
                }
                d.insert(Jv::from("reasoning_content"), r);
                out.push(Jv::from_object(d));
            }
        }
    }
    Ok(out)
}

/// Labels: a token's id where it overlaps a span, [`IGNORE`] elsewhere (`transformers`'
/// rule for its assistant mask, in one pass: spans and offsets are both in order).
fn labels_of(ids: &[u32], offsets: &[(usize, usize)], spans: &[Range<usize>]) -> Vec<i64> {
    let mut labels = vec![IGNORE; ids.len()];
    let mut s = 0;
    for (t, &(start, end)) in offsets.iter().enumerate() {
        while s < spans.len() && start >= spans[s].end {
            s += 1;
        }
        if s == spans.len() {
            break;
        }
        if end > spans[s].start {
            labels[t] = i64::from(ids[t]);
        }
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_cover_overlapping_tokens() {
        let ids = [10, 11, 12, 13];
        let offsets = [(0, 2), (2, 5), (5, 6), (6, 9)];
        assert_eq!(
            labels_of(&ids, &offsets, std::slice::from_ref(&(3..6))),
            [IGNORE, 11, 12, IGNORE]
        );
        assert_eq!(labels_of(&ids, &offsets, &[]), [IGNORE; 4]);
        assert_eq!(
            labels_of(&ids, &offsets, &[0..1, 8..9]),
            [10, IGNORE, IGNORE, 13]
        );
    }

    #[test]
    fn prompts_are_extracted_as_trl_extracts_them() {
        let (p, c, r) = extract_prompt(
            &Jv::from("The sky is blue."),
            &Jv::from("The sky is green."),
        )
        .unwrap();
        assert_eq!(
            (p.as_str(), c.as_str(), r.as_str()),
            (Some("The sky is"), Some(" blue."), Some(" green."))
        );
        let (p, c, r) = extract_prompt(&Jv::from("abc"), &Jv::from("abcd")).unwrap();
        assert_eq!(
            (p.as_str(), c.as_str(), r.as_str()),
            (Some("ab"), Some("c"), Some("cd"))
        );
    }

    #[test]
    fn malformed_messages_are_named() {
        let m =
            |j: serde_json::Value| normalize(&Jv::from(minijinja::value::Serde(j))).unwrap_err();
        assert_eq!(
            m(serde_json::json!([{"content": "x"}])),
            "message 0 has no role"
        );
        assert!(m(serde_json::json!([{"role": "user", "content": "x"}, {"role": "user", "content": 3}])).contains("message 1's content is number"));
        assert!(m(serde_json::json!("hi")).contains("not a list of messages"));
    }
}
