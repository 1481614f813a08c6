//! Brace expansion of shard lists, as `webdataset` does it (with the `braceexpand` package):
//! `train-{000000..000127}.tar`, `{a,b}/part-{0..3}.tar`.
//!
//! The grammar and the output order are `braceexpand` 0.1.7's, so one pattern names the same
//! shards, in the same order, in Python and in chute:
//!
//! - `{a,b,c}`: alternatives, each itself a pattern (nesting works: `{a,b{1,2}}`), empty ones
//!   included (`x{,.bak}`);
//! - `{1..10}`, `{1..10..3}`: integer ranges, bounds included, an optional step (its sign is
//!   ignored); if either bound (other than a bare `0`) starts with `0` or `-0`, every number is
//!   zero-padded to the width of the wider bound (`{07..10}` gives `07 08 09 10`,
//!   `{000000..000127}` gives six-digit names);
//! - `{a..e}`: letter ranges over `A..Za..z`;
//! - several groups multiply, leftmost slowest: `{a,b}{1,2}` gives `a1 a2 b1 b2`;
//! - braces that hold neither a range nor a comma stay literal: `{x}` is `{x}`;
//! - a backslash escapes the next character (`\{`, `\,`) and is removed from the output.
//!
//! Where `braceexpand` would go on but a shard list is almost surely wrong, chute refuses with
//! a [`ConfigError`] naming the pattern: unbalanced braces (as `braceexpand` does), ranges that
//! count down (`{10..1}`; `braceexpand` lists them backwards), bounds that do not fit in 64
//! bits, and patterns that expand to more than [`MAX_EXPANSIONS`] names (counted before any
//! string is built, so a huge range costs nothing).

use chute_core::ConfigError;

/// The most names one pattern may expand to.
pub const MAX_EXPANSIONS: usize = 1_000_000;

/// The most bytes of names one pattern may expand to (a name is never longer than its
/// pattern, so this is checked before any is built).
const MAX_EXPANDED_BYTES: u128 = 1 << 28;

/// Expands `pattern` into the list of names it stands for, in `braceexpand`'s order.
///
/// ```
/// use chute_formats::webdataset::expand_braces;
///
/// assert_eq!(
///     expand_braces("train-{000..002}.tar")?,
///     ["train-000.tar", "train-001.tar", "train-002.tar"]
/// );
/// assert_eq!(expand_braces("{a,b}/{0..1}")?, ["a/0", "a/1", "b/0", "b/1"]);
/// assert!(expand_braces("train-{0..3.tar").is_err());
/// # Ok::<(), chute_core::ConfigError>(())
/// ```
pub fn expand_braces(pattern: &str) -> Result<Vec<String>, ConfigError> {
    expand_braces_at_most(pattern, MAX_EXPANSIONS)
}

/// [`expand_braces`] with at most `max` names instead of [`MAX_EXPANSIONS`] (the fuzz target
/// uses a small one, so each execution stays cheap).
pub fn expand_braces_at_most(pattern: &str, max: usize) -> Result<Vec<String>, ConfigError> {
    let items = parse_pattern(pattern, pattern)?;
    let count = count(&items).filter(|&n| n <= max as u128);
    let Some(count) = count else {
        return Err(error(
            pattern,
            format!(
                "expands to more than {max} names; split the dataset into several patterns or \
                 shorten its ranges"
            ),
        ));
    };
    if count * pattern.len() as u128 > MAX_EXPANDED_BYTES {
        return Err(error(
            pattern,
            format!(
                "its {count} names of up to {} bytes could take more than {} MiB; split the \
                 dataset into several patterns or shorten the names",
                pattern.len(),
                MAX_EXPANDED_BYTES >> 20
            ),
        ));
    }
    let mut out = Vec::with_capacity(count as usize);
    expand(&items, &mut String::new(), &mut out);
    // As braceexpand does, escapes are removed after expansion.
    for s in &mut out {
        if s.contains('\\') {
            *s = unescape(s);
        }
    }
    Ok(out)
}

/// One piece of a pattern: its expansions are the product of its items'.
#[derive(Debug)]
enum Item {
    /// Text (escapes still in).
    Lit(String),
    /// `{p,q,...}`: the expansions of each pattern, one after the other.
    Alt(Vec<Vec<Item>>),
    /// `{a..b..s}` over integers.
    Int {
        start: i64,
        end: i64,
        step: u64,
        width: usize,
    },
    /// `{a..b..s}` over letters: indices into [`ALPHABET`].
    Char {
        start: usize,
        end: usize,
        step: usize,
    },
}

/// braceexpand's letter order: `A..Z` then `a..z`.
const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

fn error(pattern: &str, reason: String) -> ConfigError {
    ConfigError::new("shard pattern", format!("{pattern:?} {reason}"))
}

/// braceexpand's `parse_pattern`: splits `s` into literals and top-level `{...}` groups.
fn parse_pattern(s: &str, whole: &str) -> Result<Vec<Item>, ConfigError> {
    let b = s.as_bytes();
    let (mut start, mut pos, mut depth) = (0usize, 0usize, 0usize);
    let mut open = 0usize;
    let mut items = Vec::new();
    while pos < b.len() {
        match b[pos] {
            b'\\' => {
                pos += 2;
                continue;
            }
            b'{' => {
                if depth == 0 {
                    if pos > start {
                        items.push(Item::Lit(s[start..pos].to_string()));
                    }
                    start = pos;
                    open = pos;
                }
                depth += 1;
            }
            b'}' => {
                if depth == 0 {
                    return Err(error(
                        whole,
                        format!(
                            "has unbalanced braces: the '}}' at byte {} closes nothing; escape \
                             a literal brace as \\}}",
                            offset_in(whole, s) + pos
                        ),
                    ));
                }
                depth -= 1;
                if depth == 0 {
                    let expr = &s[start + 1..pos];
                    match parse_expression(expr, whole)? {
                        Some(item) => items.push(item),
                        None => {
                            // Literal braces around a nested pattern (one alternative, so
                            // its escapes are stripped at its own level too, as below).
                            items.push(Item::Lit("{".into()));
                            items.push(Item::Alt(vec![parse_pattern(expr, whole)?]));
                            items.push(Item::Lit("}".into()));
                        }
                    }
                    start = pos + 1;
                }
            }
            _ => {}
        }
        pos += 1;
    }
    if depth != 0 {
        return Err(error(
            whole,
            format!(
                "has unbalanced braces: the '{{' at byte {} is never closed; escape a literal \
                 brace as \\{{",
                offset_in(whole, s) + open
            ),
        ));
    }
    if start < b.len() {
        items.push(Item::Lit(s[start..].to_string()));
    }
    Ok(items)
}

/// Where `part` (a subslice of `whole`) starts in `whole`, for messages.
fn offset_in(whole: &str, part: &str) -> usize {
    (part.as_ptr() as usize).saturating_sub(whole.as_ptr() as usize)
}

/// braceexpand's `parse_expression`: a range, a sequence, or `None` (literal braces).
fn parse_expression(expr: &str, whole: &str) -> Result<Option<Item>, ConfigError> {
    if let Some(item) = int_range(expr, whole)? {
        return Ok(Some(item));
    }
    if let Some(item) = char_range(expr, whole)? {
        return Ok(Some(item));
    }
    parse_sequence(expr, whole)
}

/// Splits `a..b` or `a..b..s` as braceexpand's range regexes do; `None` if `expr` has
/// another shape.
fn range_parts(expr: &str) -> Option<(&str, &str, Option<&str>)> {
    let mut parts = expr.split("..");
    let (a, b) = (parts.next()?, parts.next()?);
    let step = parts.next();
    if parts.next().is_some() {
        return None;
    }
    // The step's sign is dropped (`-?(\d+)`), and it must be digits.
    let step = match step {
        Some(s) => {
            let s = s.strip_prefix('-').unwrap_or(s);
            (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit())).then_some(s)?;
            Some(s)
        }
        None => None,
    };
    Some((a, b, step))
}

fn is_int(s: &str) -> bool {
    let d = s.strip_prefix('-').unwrap_or(s);
    !d.is_empty() && d.bytes().all(|c| c.is_ascii_digit())
}

/// Parses a step: `0` means 1, as in braceexpand.
fn step_of(step: Option<&str>, expr: &str, whole: &str) -> Result<u64, ConfigError> {
    match step {
        None => Ok(1),
        Some(s) => s.parse::<u64>().map(|n| n.max(1)).map_err(|_| {
            error(
                whole,
                format!("has a range {{{expr}}} with a step too large"),
            )
        }),
    }
}

fn int_range(expr: &str, whole: &str) -> Result<Option<Item>, ConfigError> {
    let Some((a, b, step)) = range_parts(expr) else {
        return Ok(None);
    };
    if !is_int(a) || !is_int(b) {
        return Ok(None);
    }
    let bound = |s: &str| {
        s.parse::<i64>().map_err(|_| {
            error(
                whole,
                format!("has a range {{{expr}}} whose bound {s} does not fit in 64 bits"),
            )
        })
    };
    let (start, end) = (bound(a)?, bound(b)?);
    let step = step_of(step, expr, whole)?;
    if start > end {
        return Err(error(
            whole,
            format!(
                "has a range {{{expr}}} that counts down; braceexpand would list it backwards, \
                 which is rarely meant for shards: write {{{b}..{a}}}"
            ),
        ));
    }
    let padded = [a, b]
        .iter()
        .any(|s| *s != "0" && *s != "-0" && (s.starts_with('0') || s.starts_with("-0")));
    let width = if padded { a.len().max(b.len()) } else { 0 };
    Ok(Some(Item::Int {
        start,
        end,
        step,
        width,
    }))
}

fn char_range(expr: &str, whole: &str) -> Result<Option<Item>, ConfigError> {
    let Some((a, b, step)) = range_parts(expr) else {
        return Ok(None);
    };
    let letter = |s: &str| {
        let c = s.as_bytes();
        (c.len() == 1 && c[0].is_ascii_alphabetic())
            .then(|| ALPHABET.iter().position(|&x| x == c[0]).expect("a letter"))
    };
    let (Some(start), Some(end)) = (letter(a), letter(b)) else {
        return Ok(None);
    };
    let step = step_of(step, expr, whole)?;
    if start > end {
        return Err(error(
            whole,
            format!(
                "has a range {{{expr}}} that counts down; braceexpand would list it backwards, \
                 which is rarely meant for shards: write {{{b}..{a}}}"
            ),
        ));
    }
    Ok(Some(Item::Char {
        start,
        end,
        step: usize::try_from(step).unwrap_or(usize::MAX),
    }))
}

/// braceexpand's `parse_sequence`: top-level commas split alternatives; `None` without one.
fn parse_sequence(seq: &str, whole: &str) -> Result<Option<Item>, ConfigError> {
    let b = seq.as_bytes();
    let (mut start, mut pos, mut depth) = (0usize, 0usize, 0i64);
    let mut alts = Vec::new();
    while pos < b.len() {
        match b[pos] {
            b'\\' => {
                pos += 2;
                continue;
            }
            b'{' => depth += 1,
            b'}' => depth -= 1,
            b',' if depth == 0 => {
                alts.push(parse_pattern(&seq[start..pos], whole)?);
                start = pos + 1;
            }
            _ => {}
        }
        pos += 1;
    }
    if depth != 0 || alts.is_empty() {
        return Ok(None);
    }
    alts.push(parse_pattern(&seq[start..], whole)?);
    Ok(Some(Item::Alt(alts)))
}

/// How many names `items` expand to; `None` past `u128`.
fn count(items: &[Item]) -> Option<u128> {
    items.iter().try_fold(1u128, |n, item| {
        let k = match item {
            Item::Lit(_) => 1,
            Item::Alt(alts) => alts
                .iter()
                .try_fold(0u128, |sum, alt| sum.checked_add(count(alt)?))?,
            Item::Int {
                start, end, step, ..
            } => (*end as i128 - *start as i128) as u128 / u128::from(*step) + 1,
            Item::Char { start, end, step } => ((end - start) / step + 1) as u128,
        };
        n.checked_mul(k).map(|n| n.min(u128::MAX / 2))
    })
}

/// Appends every expansion of `items`, each prefixed by `prefix`, to `out`.
fn expand(items: &[Item], prefix: &mut String, out: &mut Vec<String>) {
    let Some((first, rest)) = items.split_first() else {
        out.push(prefix.clone());
        return;
    };
    let len = prefix.len();
    let mut go = |piece: &str, out: &mut Vec<String>| {
        prefix.push_str(piece);
        expand(rest, prefix, out);
        prefix.truncate(len);
    };
    match first {
        Item::Lit(s) => go(s, out),
        Item::Alt(alts) => {
            let mut names = Vec::new();
            for alt in alts {
                expand(alt, &mut String::new(), &mut names);
            }
            for name in &names {
                // braceexpand's `_flatten` strips escapes from every nested group's text as
                // it joins it, and again at each level up: a quirk kept for equal output.
                if name.contains('\\') {
                    go(&unescape(name), out);
                } else {
                    go(name, out);
                }
            }
        }
        Item::Int {
            start,
            end,
            step,
            width,
        } => {
            let mut i = *start as i128;
            while i <= *end as i128 {
                go(&format!("{i:0width$}"), out);
                i += *step as i128;
            }
        }
        Item::Char { start, end, step } => {
            for i in (*start..=*end).step_by(*step) {
                go(&(ALPHABET[i] as char).to_string(), out);
            }
        }
    }
}

/// Drops each escaping backslash (`\x` becomes `x`), as braceexpand's `\\(.)` substitution
/// does (its `.` does not match a newline).
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\'
            && let Some(&next) = chars.peek()
            && next != '\n'
        {
            out.push(next);
            chars.next();
            continue;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x(p: &str) -> Vec<String> {
        expand_braces(p).unwrap_or_else(|e| panic!("{p}: {e}"))
    }

    fn err(p: &str) -> String {
        let e = expand_braces(p).unwrap_err();
        assert_eq!(e.option, "shard pattern");
        let msg = e.to_string();
        assert!(msg.contains(&format!("{p:?}")), "{msg}");
        msg
    }

    #[test]
    fn shard_ranges_pad_like_braceexpand() {
        let v = x("train-{000000..000127}.tar");
        assert_eq!(v.len(), 128);
        assert_eq!(v[0], "train-000000.tar");
        assert_eq!(v[127], "train-000127.tar");
        assert_eq!(x("{07..10}"), ["07", "08", "09", "10"]);
        // Padding comes from the wider bound when either has a leading zero.
        assert_eq!(x("{8..010}"), ["008", "009", "010"]);
        assert_eq!(x("{0..2}"), ["0", "1", "2"]);
        assert_eq!(x("{0..10..5}"), ["0", "5", "10"]);
        assert_eq!(x("{1..10..-4}"), ["1", "5", "9"]);
        assert_eq!(x("{1..3..0}"), ["1", "2", "3"]);
        assert_eq!(x("{-2..1}"), ["-2", "-1", "0", "1"]);
        assert_eq!(x("{-02..1}"), ["-02", "-01", "000", "001"]);
        assert_eq!(x("{5..5}"), ["5"]);
    }

    #[test]
    fn lists_groups_and_nesting() {
        assert_eq!(x("{a,b,c}.tar"), ["a.tar", "b.tar", "c.tar"]);
        assert_eq!(
            x("{train,val}-{0..1}.tar"),
            ["train-0.tar", "train-1.tar", "val-0.tar", "val-1.tar"]
        );
        assert_eq!(
            x("python{2.{5..7},3.{2,3}}"),
            [
                "python2.5",
                "python2.6",
                "python2.7",
                "python3.2",
                "python3.3"
            ]
        );
        assert_eq!(
            x("index.html{,.backup}"),
            ["index.html", "index.html.backup"]
        );
        assert_eq!(x("{a..c}"), ["a", "b", "c"]);
        assert_eq!(x("{X..c..2}"), ["X", "Z", "b"]);
        assert_eq!(x("plain.tar"), ["plain.tar"]);
        assert_eq!(x(""), [""]);
        // Braces without a comma or a range stay as they are.
        assert_eq!(x("{x}"), ["{x}"]);
        assert_eq!(x("{}"), ["{}"]);
        assert_eq!(x("a{b{1,2}}"), ["a{b1}", "a{b2}"]);
        assert_eq!(x("{1..b}"), ["{1..b}"]);
        // Escapes.
        assert_eq!(x(r"{1\{2,3}"), ["1{2", "3"]);
        assert_eq!(x(r"a\,b{c,d}"), ["a,bc", "a,bd"]);
        assert_eq!(x(r"\\{1,2}"), [r"\1", r"\2"]);
        // Escapes inside groups are stripped once per level, as braceexpand does.
        assert_eq!(x(r"0\,{\\\.}"), ["0,{.}"]);
        assert_eq!(x(r"{a\\\\b,c}"), [r"a\b", "c"]);
    }

    #[test]
    fn refusals_name_the_pattern() {
        assert!(err("train-{0..3.tar").contains("'{' at byte 6 is never closed"));
        assert!(err("a}b").contains("'}' at byte 1 closes nothing"));
        assert!(err("{1{2,3}").contains("unbalanced"));
        assert!(err("{10..1}").contains("write {1..10}"));
        assert!(err("{c..a}").contains("counts down"));
        assert!(err("{0..99999999999999999999}").contains("64 bits"));
        assert!(err("{0..1000000}").contains("more than 1000000"));
        // A million names of 4 KB each: refused before 4 GB of names are built.
        let long = format!("{}{{0..999999}}", "x".repeat(4000));
        assert!(err(&long).contains("MiB"), "{}", err(&long));
        assert_eq!(
            expand_braces(&format!("{}{{0..9}}", "x".repeat(4000)))
                .unwrap()
                .len(),
            10
        );
        assert!(err("{0..999}{0..999}{0..9}").contains("more than"));
        assert!(err("{0..9223372036854775807}").contains("more than"));
        assert!(err("{-9223372036854775808..9223372036854775807}").contains("more than"));
        assert_eq!(x("{0..999}{0..999}").len(), 1_000_000);
    }
}
