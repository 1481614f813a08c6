//! [`redact`]: the secrets a URL can carry, hidden wherever chute prints one.
//!
//! Credentials reach URLs two ways: user info (`https://user:password@host/...`) and query
//! strings (S3 and GCS presigned URLs sign in `X-Amz-Signature` / `X-Goog-Signature`, Azure
//! SAS tokens in `sig`, and object_store appends a SAS token from the environment to every
//! request it makes, so a failed request's error text carries it). Every error chute builds
//! passes its file names and messages through [`redact`], as do the CLI's outputs.

use std::borrow::Cow;

/// What replaces a hidden value.
pub const HIDDEN: &str = "***";

/// `text` with every URL in it (`scheme://...`) stripped of its secrets: the user info before
/// `@` becomes [`HIDDEN`], and so does the value of every query parameter (names are kept, so
/// `?X-Amz-Signature=***&X-Amz-Expires=***`). The rest of the text is unchanged; text
/// without `://` is returned as is, without copying.
pub fn redact(text: &str) -> Cow<'_, str> {
    if !text.contains("://") {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (before, after) = rest.split_at(at + 3);
        out.push_str(before);
        // The URL runs to the first character that ends one in prose or in a message.
        let end = after
            .find(|c: char| {
                c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`' | ')' | ',')
            })
            .unwrap_or(after.len());
        let (url, tail) = after.split_at(end);
        push_redacted(url, &mut out);
        rest = tail;
    }
    out.push_str(rest);
    if out == text {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(out)
    }
}

/// Appends `url` (what follows `scheme://`) with its user info and query values hidden.
fn push_redacted(url: &str, out: &mut String) {
    let authority_end = url.find(['/', '?', '#']).unwrap_or(url.len());
    let (authority, path) = url.split_at(authority_end);
    match authority.rfind('@') {
        Some(at) => {
            out.push_str(HIDDEN);
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    // A query string as written, or percent-encoded into the path (`%3F`) by a client that
    // took the whole URL for an object key.
    let lower = path.to_ascii_lowercase();
    let Some((q, mark)) = [
        path.find('?').map(|q| (q, 1)),
        lower.find("%3f").map(|q| (q, 3)),
    ]
    .into_iter()
    .flatten()
    .min() else {
        out.push_str(path);
        return;
    };
    out.push_str(&path[..q + mark]);
    let query = &path[q + mark..];
    let (query, fragment) = query.split_at(query.find('#').unwrap_or(query.len()));
    for (i, pair) in query.split('&').enumerate() {
        if i > 0 {
            out.push('&');
        }
        match pair.split_once('=') {
            Some((name, _)) => {
                out.push_str(name);
                out.push('=');
                out.push_str(HIDDEN);
            }
            // A bare token (`?sv...` without `=`) may be a secret itself.
            None if !pair.is_empty() => out.push_str(HIDDEN),
            None => {}
        }
    }
    out.push_str(fragment);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hides_user_info_and_query_values_only() {
        let cases = [
            ("no url here", "no url here"),
            ("s3://bucket/train-000.tar", "s3://bucket/train-000.tar"),
            (
                "https://alice:s3cret@host:8080/d/x.tar: 403",
                "https://***@host:8080/d/x.tar: 403",
            ),
            (
                "GET https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIA%2F1&X-Amz-Signature=abc#f failed",
                "GET https://b.s3.amazonaws.com/k?X-Amz-Credential=***&X-Amz-Signature=***#f failed",
            ),
            (
                "error sending request for url (https://a.blob.core.windows.net/c/k?sv=2021&sig=S%2B)",
                "error sending request for url (https://a.blob.core.windows.net/c/k?sv=***&sig=***)",
            ),
            (
                "HEAD http://h:1/always503/x.tar%3FX-Amz-Credential=A&X-Amz-Signature=B in 1ms",
                "HEAD http://h:1/always503/x.tar%3FX-Amz-Credential=***&X-Amz-Signature=*** in 1ms",
            ),
            (
                "\"http://u@h/p?token\" and https://h2/q?a=1",
                "\"http://***@h/p?***\" and https://h2/q?a=***",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(redact(text), want, "{text}");
        }
        assert!(matches!(redact("s3://b/k"), Cow::Borrowed(_)));
    }
}
