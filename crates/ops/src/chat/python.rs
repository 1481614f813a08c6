//! What Python prints, for templates written against Jinja2 running in Python: `json.dumps`
//! (transformers' `tojson` filter), `str()` of values (what `{{ value }}` writes), `repr()` of
//! floats, and `datetime.strftime` (the `strftime_now` function).

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};

/// `json.dumps(value, ensure_ascii=.., indent=.., separators=.., sort_keys=..)`.
#[derive(Debug, Clone)]
pub(crate) struct Dumps {
    pub(crate) ensure_ascii: bool,
    pub(crate) indent: Option<String>,
    pub(crate) item_sep: String,
    pub(crate) key_sep: String,
    pub(crate) sort_keys: bool,
}

impl Dumps {
    /// Python's defaults for `indent` (`None`, or a count of spaces, or a string) and
    /// `separators` (`(", ", ": ")`, or `(",", ": ")` with an indent).
    pub(crate) fn new(
        ensure_ascii: bool,
        indent: Option<String>,
        separators: Option<(String, String)>,
        sort_keys: bool,
    ) -> Dumps {
        let (item_sep, key_sep) = separators.unwrap_or_else(|| {
            let item = if indent.is_some() { "," } else { ", " };
            (item.to_string(), ": ".to_string())
        });
        Dumps {
            ensure_ascii,
            indent,
            item_sep,
            key_sep,
            sort_keys,
        }
    }

    /// `value` as JSON text; an error names what JSON cannot hold.
    pub(crate) fn dumps(&self, value: &Value) -> Result<String, String> {
        let mut out = String::new();
        self.write(value, 0, &mut out)?;
        Ok(out)
    }

    fn newline(&self, depth: usize, out: &mut String) {
        if let Some(ind) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(ind);
            }
        }
    }

    fn write(&self, value: &Value, depth: usize, out: &mut String) -> Result<(), String> {
        if depth > 256 {
            return Err("the value nests more than 256 levels".into());
        }
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => number(value, true, out),
            ValueKind::String => json_string(value.as_str().unwrap_or(""), self.ensure_ascii, out),
            ValueKind::Map => {
                let mut keys: Vec<Value> = value.try_iter().map_err(|e| e.to_string())?.collect();
                if keys.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                if self.sort_keys {
                    keys.sort();
                }
                out.push('{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(depth + 1, out);
                    match k.kind() {
                        ValueKind::String => {
                            json_string(k.as_str().unwrap_or(""), self.ensure_ascii, out)
                        }
                        ValueKind::Number | ValueKind::Bool | ValueKind::None => {
                            // Python writes other scalar keys as strings of their JSON.
                            let mut s = String::new();
                            self.write(k, depth + 1, &mut s)?;
                            json_string(&s, self.ensure_ascii, out);
                        }
                        _ => {
                            return Err(format!(
                                "keys must be str, int, float, bool or None, not {}",
                                k.kind()
                            ));
                        }
                    }
                    out.push_str(&self.key_sep);
                    let v = value.get_item(k).map_err(|e| e.to_string())?;
                    self.write(&v, depth + 1, out)?;
                }
                self.newline(depth, out);
                out.push('}');
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter().map_err(|e| e.to_string())?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(depth + 1, out);
                    self.write(v, depth + 1, out)?;
                }
                self.newline(depth, out);
                out.push(']');
            }
            ValueKind::Bytes => return Err("Object of type bytes is not JSON serializable".into()),
            other => return Err(format!("Object of type {other} is not JSON serializable")),
        }
        Ok(())
    }
}

/// A number as Python writes it: integers in full, floats as `repr` (`1.0`, `1e-05`,
/// `1e+16`); `json` writes the non-finite ones as `NaN` / `Infinity`, `str` as `nan` / `inf`.
fn number(value: &Value, json: bool, out: &mut String) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return;
    }
    let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    float_repr(f, json, out);
}

/// Python's `repr(float)`: the shortest digits that round-trip, positional for exponents
/// from -4 to 15, else scientific with a signed two-digit-or-more exponent.
pub(crate) fn float_repr(f: f64, json: bool, out: &mut String) {
    if f.is_nan() {
        out.push_str(if json { "NaN" } else { "nan" });
        return;
    }
    if f.is_infinite() {
        let s = match (json, f > 0.0) {
            (true, true) => "Infinity",
            (true, false) => "-Infinity",
            (false, true) => "inf",
            (false, false) => "-inf",
        };
        out.push_str(s);
        return;
    }
    if f == 0.0 {
        out.push_str(if f.is_sign_negative() { "-0.0" } else { "0.0" });
        return;
    }
    // Rust's `{:e}` gives the shortest round-trip digits: `d.ddde[-]x`.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    out.push_str(sign);
    if (-4..16).contains(&exp) {
        if exp < 0 {
            out.push_str("0.");
            for _ in 0..(-exp - 1) {
                out.push('0');
            }
            out.push_str(&digits);
        } else {
            let point = exp as usize + 1;
            if digits.len() <= point {
                out.push_str(&digits);
                for _ in digits.len()..point {
                    out.push('0');
                }
                out.push_str(".0");
            } else {
                out.push_str(&digits[..point]);
                out.push('.');
                out.push_str(&digits[point..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
}

/// A JSON string as Python's `json` writes it.
fn json_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `str(value)` as Python gives it for what a template prints: `None`, `True`, floats as
/// `repr`, lists and dicts as their `repr` (strings quoted), an undefined value as nothing.
pub(crate) fn write_str(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::String => out.push_str(value.as_str().unwrap_or("")),
        _ => write_repr(value, out, 0),
    }
}

fn write_repr(value: &Value, out: &mut String, depth: usize) {
    if depth > 256 {
        out.push_str("...");
        return;
    }
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => number(value, false, out),
        ValueKind::String => py_quote(value.as_str().unwrap_or(""), out),
        ValueKind::Map => {
            out.push('{');
            let keys: Vec<Value> = value.try_iter().map(|i| i.collect()).unwrap_or_default();
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(k, out, depth + 1);
                out.push_str(": ");
                write_repr(&value.get_item(k).unwrap_or_default(), out, depth + 1);
            }
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let tuple = value.is_tuple();
            out.push(if tuple { '(' } else { '[' });
            let items: Vec<Value> = value.try_iter().map(|i| i.collect()).unwrap_or_default();
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(v, out, depth + 1);
            }
            if tuple && items.len() == 1 {
                out.push(',');
            }
            out.push(if tuple { ')' } else { ']' });
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// Python's `repr(str)`: single quotes unless the text has one and no double quote.
fn py_quote(s: &str, out: &mut String) {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(q);
}

/// `datetime.strftime(format)` for a time `secs` seconds after the Unix epoch (UTC), for
/// the directives templates use; others are kept as written.
pub(crate) fn strftime(secs: i64, format: &str) -> String {
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (hour, minute, second) = (rem / 3600, rem / 60 % 60, rem % 60);
    let (year, month, day) = civil_from_days(days);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(mut d) = chars.next() else {
            out.push('%');
            break;
        };
        // glibc's `%-d`: no padding.
        let bare = d == '-';
        if bare {
            match chars.next() {
                Some(n) => d = n,
                None => {
                    out.push_str("%-");
                    break;
                }
            }
        }
        let at = out.len();
        let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
        let _ = match d {
            'd' => write!(out, "{day:02}"),
            'e' => write!(out, "{day:2}"),
            'm' => write!(out, "{month:02}"),
            'Y' => write!(out, "{year}"),
            'y' => write!(out, "{:02}", year.rem_euclid(100)),
            'b' | 'h' => write!(out, "{}", &MONTHS[month as usize - 1][..3]),
            'B' => write!(out, "{}", MONTHS[month as usize - 1]),
            'a' => write!(out, "{}", &DAYS[weekday][..3]),
            'A' => write!(out, "{}", DAYS[weekday]),
            'w' => write!(out, "{}", (weekday + 1) % 7),
            'u' => write!(out, "{}", weekday + 1),
            'j' => write!(out, "{yday:03}"),
            'H' => write!(out, "{hour:02}"),
            'I' => write!(out, "{hour12:02}"),
            'M' => write!(out, "{minute:02}"),
            'S' => write!(out, "{second:02}"),
            'p' => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            'F' => write!(out, "{year}-{month:02}-{day:02}"),
            'T' => write!(out, "{hour:02}:{minute:02}:{second:02}"),
            'D' => write!(out, "{month:02}/{day:02}/{:02}", year.rem_euclid(100)),
            'Z' => write!(out, "UTC"),
            'z' => write!(out, "+0000"),
            '%' => write!(out, "%"),
            other => write!(out, "%{}{other}", if bare { "-" } else { "" }),
        };
        if bare && matches!(d, 'd' | 'e' | 'm' | 'j' | 'H' | 'I' | 'M' | 'S' | 'y') {
            let trimmed = out[at..].trim_start_matches(['0', ' ']).to_string();
            let keep = if trimmed.is_empty() {
                "0".to_string()
            } else {
                trimmed
            };
            out.truncate(at);
            out.push_str(&keep);
        }
    }
    out
}

/// (year, month, day) of a count of days since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Days since 1970-01-01 of a date.
pub(crate) fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repr(f: f64) -> String {
        let mut s = String::new();
        float_repr(f, false, &mut s);
        s
    }

    #[test]
    fn floats_print_as_python_prints_them() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123.456, "123.456"),
            (-2.5e-7, "-2.5e-07"),
            (1.5e300, "1.5e+300"),
            (f64::INFINITY, "inf"),
        ] {
            assert_eq!(repr(f), want, "{f}");
        }
    }

    #[test]
    fn json_is_pythons() {
        let list = Value::from(vec![
            Value::from(1),
            Value::from(2.5),
            Value::from(()),
            Value::from(true),
        ]);
        let v = Value::from_object(indexmap::IndexMap::from([
            (Value::from("b"), list),
            (Value::from("a"), Value::from("é\"\n<")),
        ]));
        let d = Dumps::new(false, None, None, false);
        assert_eq!(
            d.dumps(&v).unwrap(),
            r#"{"b": [1, 2.5, null, true], "a": "é\"\n<"}"#
        );
        let d = Dumps::new(true, Some("  ".into()), None, true);
        assert_eq!(
            d.dumps(&v).unwrap(),
            "{\n  \"a\": \"\\u00e9\\\"\\n<\",\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true\n  ]\n}"
        );
        let mut s = String::new();
        write_str(&v, &mut s);
        assert_eq!(s, r#"{'b': [1, 2.5, None, True], 'a': 'é"\n<'}"#);
    }

    #[test]
    fn strftime_formats_dates() {
        // 2024-07-26 12:34:56 UTC, a Friday.
        let t = days_from_civil(2024, 7, 26) * 86_400 + 12 * 3600 + 34 * 60 + 56;
        assert_eq!(strftime(t, "%d %b %Y"), "26 Jul 2024");
        assert_eq!(
            strftime(t, "%A %B %-d %j %I%p %%"),
            "Friday July 26 208 12PM %"
        );
        assert_eq!(
            strftime(0, "%Y-%m-%d %H:%M:%S %a"),
            "1970-01-01 00:00:00 Thu"
        );
    }
}
