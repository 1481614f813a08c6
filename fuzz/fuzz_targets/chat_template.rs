//! Chat templates (`ChatTemplate`, what `chat_template=` and a tokenizer folder hand over):
//! any template text is refused with an error or compiles; rendered over any JSON context (the
//! bytes after the first NUL: messages, tools, variables), it gives text or an error, never a
//! panic, within the output cap and the fuel limit. Covers the `{% generation %}` rewrite and
//! its spans, Python's `str()` / `repr` / `json.dumps` of any value, `strftime_now`.

#![no_main]

use chute_ops::chat::ChatTemplate;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (template, context) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &b"{}"[..]),
    };
    let Ok(template) = std::str::from_utf8(template) else {
        return;
    };
    let Ok(t) = ChatTemplate::new(template, 1_722_000_000) else {
        return;
    };
    let Ok(context) = chute_core::Value::from_json(context) else {
        return;
    };
    let context = chute_ops::chat::template_value(&context);
    if let Ok(r) = t.render(context, 1 << 16) {
        assert!(r.text.len() <= 1 << 16);
        for s in &r.generation {
            assert!(s.start <= s.end && s.end <= r.text.len());
            assert!(r.text.is_char_boundary(s.start) && r.text.is_char_boundary(s.end));
        }
    }
});
