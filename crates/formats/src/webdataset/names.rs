//! Member names as `webdataset` reads them: where a name splits into key and field, and which
//! names are metadata.

/// The name of the text field holding a sample's key, first in every sample.
pub const KEY_FIELD: &str = "__key__";

/// Splits a member name into (key, field) as `webdataset`'s `base_plus_ext` does (before it
/// lower-cases the field): at the first dot of the last path component. `None` for names
/// `webdataset` skips because they have no such dot.
///
/// ```
/// use chute_formats::webdataset::split_name;
///
/// assert_eq!(split_name("a.b/c.d.jpg"), Some(("a.b/c", "d.jpg")));
/// assert_eq!(split_name("README"), None);
/// assert_eq!(split_name("dir.x/y"), None);
/// ```
pub fn split_name(name: &str) -> Option<(&str, &str)> {
    // The regex is ^((?:.*/|)[^.]+)[.]([^/]*)$. The field has no '/', so the dot is in the
    // last component, and the `[^.]+` run before it has no dot, so it is the component's
    // first dot. The run must be non-empty and start at the beginning or right after a '/'
    // that `.*` can reach (`.` does not match a newline): for a component that starts with a
    // dot (`x/.jpg`) the run is the previous component and its slash.
    let b = name.as_bytes();
    let comp = b.iter().rposition(|&c| c == b'/').map_or(0, |i| i + 1);
    let dot = comp + b[comp..].iter().position(|&c| c == b'.')?;
    let first_newline = b.iter().position(|&c| c == b'\n').unwrap_or(b.len());
    let start = b[..dot]
        .iter()
        .enumerate()
        .filter(|&(i, &c)| c == b'/' && i + 1 < dot && i < first_newline)
        .map(|(i, _)| i + 1)
        .next_back()
        .unwrap_or(0);
    if start >= dot || b[start..dot].contains(&b'.') {
        return None;
    }
    Some((&name[..dot], &name[dot + 1..]))
}

/// Whether `webdataset`'s `tar_file_iterator` skips a member of this name as metadata:
/// names matching `__[^/]*__($|/)` from the start, and top-level names that start and end
/// with `__`.
pub fn is_meta(name: &str) -> bool {
    let b = name.as_bytes();
    if !b.starts_with(b"__") {
        return false;
    }
    if !b.contains(&b'/') && b.ends_with(b"__") {
        return true;
    }
    // re.match(r"__[^/]*__($|/)"): `$` also matches before a final newline.
    let n = b.len();
    (2..n.saturating_sub(1))
        .take_while(|&j| !b[2..j].contains(&b'/'))
        .any(|j| {
            &b[j..j + 2] == b"__"
                && (j + 2 == n || b[j + 2] == b'/' || (j + 3 == n && b[n - 1] == b'\n'))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_name_matches_webdataset() {
        // Expected values printed by webdataset 1.0.2's base_plus_ext (see testdata README).
        let cases: &[(&str, Option<(&str, &str)>)] = &[
            ("a.jpg", Some(("a", "jpg"))),
            ("a.b/c.d.jpg", Some(("a.b/c", "d.jpg"))),
            ("dir/sub/k.seg.png", Some(("dir/sub/k", "seg.png"))),
            ("./a.jpg", Some(("./a", "jpg"))),
            ("a..b", Some(("a", ".b"))),
            ("a.", Some(("a", ""))),
            ("README", None),
            ("dir.x/y", None),
            (".hidden", None),
            ("a/.hidden", Some(("a/", "hidden"))),
            ("a.x/.hidden", None),
            ("a//.x", Some(("a//", "x"))),
            ("/.x", Some(("/", "x"))),
            ("a.b\nc/d.e", None),
            ("ab\nc/d.e", Some(("ab\nc/d", "e"))),
            ("a/b.c/.d", None),
            ("x/y/.z", Some(("x/y/", "z"))),
            ("", None),
            ("/", None),
        ];
        for (name, want) in cases {
            assert_eq!(split_name(name), *want, "{name:?}");
        }
    }

    #[test]
    fn is_meta_matches_webdataset() {
        let cases = [
            ("__meta__", true),
            ("__", true),
            ("___", true),
            ("__index__/a.json", true),
            ("__a__\n", true),
            ("__a__.txt", false),
            ("__foo.jpg", false),
            ("x/__meta__", false),
            ("__a/b__", false),
            ("__a__b", false),
            ("a__b__", false),
            ("_a_", false),
        ];
        for (name, want) in cases {
            assert_eq!(is_meta(name), want, "{name:?}");
        }
    }
}
