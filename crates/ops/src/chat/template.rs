//! A chat template, compiled once and rendered on any thread, as `transformers`'
//! `apply_chat_template` renders it: a sandboxed Jinja environment (MiniJinja) with
//! `trim_blocks`, `lstrip_blocks`, loop controls and Python's string methods;
//! `raise_exception`, `strftime_now` and a `tojson` that writes what Python's `json.dumps`
//! writes; values printed as Python prints them (`None`, `True`, `{'a': 1}`); and
//! `{% generation %}` blocks, whose output spans are the assistant tokens' mask.

use std::cell::Cell;
use std::ops::Range;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{Environment, Error as JinjaError, ErrorKind};

use super::python::{Dumps, strftime, write_str};

/// Marks where a `{% generation %}` block's output starts and ends in the rendered text
/// (Unicode noncharacters, for a process's internal use: a conversation holding one is
/// refused).
const GEN_OPEN: char = '\u{FDD0}';
const GEN_CLOSE: char = '\u{FDD1}';

/// What a template may do before it is stopped: instructions run per rendering (loops of a
/// hostile template end here), nesting of calls.
const FUEL: u64 = 50_000_000;
const RECURSION: usize = 200;

/// The text the `raise_exception` function puts before its message, to tell it from the
/// engine's own errors.
const RAISED: &str = "chat template raised: ";

thread_local! {
    /// `{% generation %}` blocks rendered on this thread by the current rendering.
    static BLOCKS: Cell<usize> = const { Cell::new(0) };
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Whether the template marks the assistant's output with `{% generation %}` blocks.
    generation: bool,
    /// What it was made from (a hash of the text), for fingerprints.
    digest: u64,
}

/// A rendered conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// The text.
    pub text: String,
    /// The byte ranges of `text` that `{% generation %}` blocks rendered, in order.
    pub generation: Vec<Range<usize>>,
}

/// Why a template could not be compiled or rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateError {
    /// The template called `raise_exception(message)`.
    Raised(String),
    /// Any other failure: a syntax error, an undefined call, a limit.
    Failed(String),
}

impl std::fmt::Display for TemplateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TemplateError::Raised(m) => write!(f, "the chat template raised an exception: {m}"),
            TemplateError::Failed(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for TemplateError {}

fn describe(e: &JinjaError) -> TemplateError {
    let detail = e.detail().unwrap_or_default();
    if let Some(m) = detail.strip_prefix(RAISED) {
        return TemplateError::Raised(m.to_string());
    }
    let mut text = e.to_string();
    if let Some(line) = e.line()
        && !text.contains("line")
    {
        text.push_str(&format!(" (template line {line})"));
    }
    if e.kind() == ErrorKind::OutOfFuel {
        text.push_str(": the template ran more than 50 million instructions for one conversation");
    }
    TemplateError::Failed(format!("the chat template failed: {text}"))
}

impl ChatTemplate {
    /// Compiles `source`, the Jinja text of a chat template. `now` is the time, in seconds
    /// since the Unix epoch (UTC), that `strftime_now` formats: pinned, so a date in the
    /// template is the same for every conversation and every run.
    pub fn new(source: &str, now: i64) -> Result<ChatTemplate, TemplateError> {
        let (rewritten, generation) = rewrite_generation(source);
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| TemplateError::Failed(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_fuel(Some(FUEL));
        env.set_recursion_limit(RECURSION);
        env.set_formatter(|out, _state, value| {
            if let Some(s) = value.as_str() {
                return out.write_str(s).map_err(JinjaError::from);
            }
            let mut s = String::new();
            write_str(value, &mut s);
            out.write_str(&s).map_err(JinjaError::from)
        });
        env.add_filter("tojson", tojson);
        env.add_filter("string", |v: Value| {
            let mut s = String::new();
            write_str(&v, &mut s);
            s
        });
        env.add_function(
            "raise_exception",
            |message: Value| -> Result<Value, JinjaError> {
                let mut m = String::new();
                write_str(&message, &mut m);
                Err(JinjaError::new(
                    ErrorKind::InvalidOperation,
                    format!("{RAISED}{m}"),
                ))
            },
        );
        env.add_function("strftime_now", move |format: String| strftime(now, &format));
        // Python's `iter()`: `none is iterable` is false in Jinja2 (MiniJinja iterates none as
        // empty), an undefined value's is true.
        env.add_test("iterable", |v: Value| match v.kind() {
            ValueKind::None | ValueKind::Bool | ValueKind::Number => false,
            ValueKind::Plain => v.try_iter().is_ok(),
            _ => true,
        });
        env.add_filter("_chute_generation", |body: String| {
            BLOCKS.with(|b| b.set(b.get() + 1));
            let mut s = String::with_capacity(body.len() + 6);
            s.push(GEN_OPEN);
            s.push_str(&body);
            s.push(GEN_CLOSE);
            Value::from_safe_string(s)
        });
        env.add_template_owned("chat", rewritten)
            .map_err(|e| describe(&e))?;
        Ok(ChatTemplate {
            env,
            generation,
            digest: crate::chat::digest(source.as_bytes()),
        })
    }

    /// Whether the template has `{% generation %}` blocks.
    pub fn has_generation(&self) -> bool {
        self.generation
    }

    /// A hash of the template's text.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    /// Renders the template with `context` (a map: `messages`, `tools`, the special tokens,
    /// ...), the output at most `max_bytes` long.
    pub fn render(&self, context: Value, max_bytes: usize) -> Result<Rendered, TemplateError> {
        let template = self.env.get_template("chat").map_err(|e| describe(&e))?;
        BLOCKS.with(|b| b.set(0));
        let mut sink = Capped {
            out: Vec::with_capacity(4096.min(max_bytes)),
            max: max_bytes,
        };
        template
            .render_captured_to(context, &mut sink)
            .map_err(|e| {
                if sink.out.len() >= sink.max {
                    TemplateError::Failed(format!(
                        "the chat template rendered more than {} bytes for one conversation \
                         (max_text_bytes)",
                        sink.max
                    ))
                } else {
                    describe(&e)
                }
            })?;
        let text = String::from_utf8(sink.out)
            .map_err(|_| TemplateError::Failed("the chat template wrote invalid UTF-8".into()))?;
        if !self.generation {
            return Ok(Rendered {
                text,
                generation: Vec::new(),
            });
        }
        let blocks = BLOCKS.with(Cell::get);
        strip_generation(text, blocks)
    }
}

/// Writes into memory, failing past `max` bytes.
struct Capped {
    out: Vec<u8>,
    max: usize,
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len() + buf.len() > self.max {
            self.out.resize(self.max, 0);
            return Err(std::io::Error::other("the rendered text is too long"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The text without the generation marks, and the ranges they enclosed; `blocks` is how many
/// blocks the template rendered (more marks than that came from the conversation itself).
fn strip_generation(text: String, blocks: usize) -> Result<Rendered, TemplateError> {
    let opens = text.matches(GEN_OPEN).count();
    if opens != blocks || text.matches(GEN_CLOSE).count() != blocks {
        return Err(TemplateError::Failed(format!(
            "the conversation holds U+{:04X} or U+{:04X} (Unicode noncharacters, which chute uses \
             to find {{% generation %}} blocks): remove them",
            GEN_OPEN as u32, GEN_CLOSE as u32
        )));
    }
    let mut out = String::with_capacity(text.len());
    let mut spans = Vec::with_capacity(blocks);
    let mut open: Vec<usize> = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find([GEN_OPEN, GEN_CLOSE]) {
        out.push_str(&rest[..at]);
        let mark = rest[at..].chars().next().unwrap_or(GEN_OPEN);
        if mark == GEN_OPEN {
            open.push(out.len());
        } else {
            let start = open.pop().unwrap_or(out.len());
            // A block inside another counts once, as the outer one.
            if open.is_empty() {
                spans.push(start..out.len());
            }
        }
        rest = &rest[at + mark.len_utf8()..];
    }
    out.push_str(rest);
    spans.retain(|r: &Range<usize>| !r.is_empty());
    spans.sort_by_key(|r| r.start);
    Ok(Rendered {
        text: out,
        generation: spans,
    })
}

/// `{% generation %}` / `{% endgeneration %}` (with any whitespace control) rewritten as a
/// filter block that marks its output; whether there were any.
fn rewrite_generation(source: &str) -> (String, bool) {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    let mut found = false;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        // The tag's end, after its `{%` (`{%}` is not a tag's end).
        let Some(end) = tag[2..].find("%}").map(|e| e + 2) else {
            out.push_str(tag);
            rest = "";
            break;
        };
        let inner = &tag[2..end];
        let (lead, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, trail) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[b.len()..]),
            None => (body, ""),
        };
        match body.trim() {
            "generation" => {
                found = true;
                out.push_str(&format!("{{%{lead} filter _chute_generation {trail}%}}"));
            }
            "endgeneration" => out.push_str(&format!("{{%{lead} endfilter {trail}%}}")),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    (out, found)
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, its arguments by position or name.
fn tojson(value: Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, JinjaError> {
    let arg = |i: usize, name: &str| -> Result<Option<Value>, JinjaError> {
        let by_name: Option<Value> = kwargs.get(name)?;
        Ok(by_name
            .or_else(|| args.get(i).cloned())
            .filter(|v| !v.is_none()))
    };
    let ensure_ascii = arg(0, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = match arg(1, "indent")? {
        None => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or("").to_string()),
        Some(v) => Some(" ".repeat(v.as_usize().unwrap_or(0).min(64))),
    };
    let separators = match arg(2, "separators")? {
        None => None,
        Some(v) => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] => Some((
                    a.as_str().unwrap_or(",").to_string(),
                    b.as_str().unwrap_or(":").to_string(),
                )),
                _ => {
                    return Err(JinjaError::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ));
                }
            }
        }
    };
    let sort_keys = arg(3, "sort_keys")?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let dumps = Dumps::new(ensure_ascii, indent, separators, sort_keys);
    dumps
        .dumps(&value)
        .map(Value::from_safe_string)
        .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, ctx: serde_json::Value) -> Result<Rendered, TemplateError> {
        ChatTemplate::new(source, 0)?.render(Value::from(minijinja::value::Serde(ctx)), 1 << 20)
    }

    #[test]
    fn renders_as_jinja2_in_python() {
        let t = "{% for m in messages %}{{ m.role }}: {{ m['content'] | trim }}\n{% endfor %}";
        let r = render(
            t,
            serde_json::json!({"messages": [{"role": "user", "content": " hi "}]}),
        );
        assert_eq!(r.unwrap().text, "user: hi\n");
        // Python's str() of values, tojson as json.dumps, string methods, negative slices.
        let t = "{{ x }}|{{ none }}|{{ true }}|{{ 1.0 }}|{{ x | tojson }}|{{ 'a,b'.split(',') }}|\
                 {{ [1,2,3][::-1] }}|{{ ' q '.strip() }}|{{ 'ab'.startswith('a') }}";
        let r = render(t, serde_json::json!({"x": {"k": [1, "é<"], "n": null}})).unwrap();
        assert_eq!(
            r.text,
            "{'k': [1, 'é<'], 'n': None}|None|True|1.0|{\"k\": [1, \"é<\"], \"n\": null}|\
             ['a', 'b']|[3, 2, 1]|q|True"
        );
        // Tests as Jinja2's: none is not iterable.
        let t =
            "{{ tools is iterable }}|{{ x is iterable }}|{{ 'a' is iterable }}|{{ 3 is iterable }}";
        let r = render(t, serde_json::json!({"tools": null, "x": [1]})).unwrap();
        assert_eq!(r.text, "False|True|True|False");
        // trim_blocks and lstrip_blocks, loop controls.
        let t = "{% for i in [1, 2, 3] %}\n  {% if i == 2 %}{% continue %}{% endif %}\n{{ i }}\n{% endfor %}";
        assert_eq!(render(t, serde_json::json!({})).unwrap().text, "1\n3\n");
        assert_eq!(
            render("{{ strftime_now('%d %b %Y') }}", serde_json::json!({}))
                .unwrap()
                .text,
            "01 Jan 1970"
        );
    }

    #[test]
    fn generation_blocks_give_spans() {
        let t = "{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}\
                 {%- generation -%}{{ m.content }}</s>{%- endgeneration -%}\
                 {% else %}{{ m.content }}{% endif %}{% endfor %}";
        let r = render(
            t,
            serde_json::json!({"messages": [
                {"role": "user", "content": "q"}, {"role": "assistant", "content": "é"},
                {"role": "user", "content": "r"}, {"role": "assistant", "content": "s"}]}),
        )
        .unwrap();
        assert_eq!(r.text, "<user>q<assistant>é</s><user>r<assistant>s</s>");
        let spans: Vec<&str> = r.generation.iter().map(|s| &r.text[s.clone()]).collect();
        assert_eq!(spans, ["é</s>", "s</s>"]);
        let bad = render(
            t,
            serde_json::json!({"messages": [{"role": "user", "content": "\u{FDD0}"}]}),
        );
        assert!(bad.unwrap_err().to_string().contains("noncharacters"));
    }

    #[test]
    fn errors_name_the_cause() {
        let e = render(
            "{{ raise_exception('roles must alternate') }}",
            serde_json::json!({}),
        );
        assert_eq!(e, Err(TemplateError::Raised("roles must alternate".into())));
        let e = render(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            serde_json::json!({}),
        );
        assert!(e.unwrap_err().to_string().contains("50 million"));
        let e = render("{{ 'x' * 2000000 }}", serde_json::json!({}));
        assert!(
            e.unwrap_err()
                .to_string()
                .contains("more than 1048576 bytes")
        );
        let e = render(
            "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
            serde_json::json!({}),
        );
        assert!(e.is_err());
        assert!(ChatTemplate::new("{% if %}", 0).is_err());
    }
}
