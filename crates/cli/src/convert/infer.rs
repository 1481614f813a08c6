//! Column types: what a column holds ([`Kind`]), how the first pass infers it from every value
//! of a CSV or JSON Lines input ([`cell_kind`], [`json_kind`], [`Inferred`]), and the values
//! rows carry ([`Value`]).

use bytes::Bytes;
use chute::core::Array;

/// A column's type, inferred from every value (CSV, JSON Lines) or given by the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Whole numbers (JSON booleans too, as 0 and 1).
    Int,
    /// Numbers with a fraction or exponent; missing values become NaN.
    Float,
    /// UTF-8 text.
    Text,
    /// Bytes (a file's contents).
    Bytes,
    /// JSON arrays of numbers; `len` is `None` when the lengths differ between rows.
    List { float: bool, len: Option<usize> },
    /// Other JSON (objects, nested or mixed arrays, columns of mixed types): its JSON text.
    Json,
    /// A `.npy` row: any dtype and shape.
    Array,
}

impl Kind {
    /// The kind of a column holding values of kinds `self` and `other`.
    pub(super) fn unify(self, other: Kind) -> Kind {
        use Kind::*;
        match (self, other) {
            (a, b) if a == b => a,
            (Int | Float, Int | Float) => Float,
            (Text, Int | Float) | (Int | Float, Text) => Text,
            (List { float: f1, len: l1 }, List { float: f2, len: l2 }) => List {
                float: f1 || f2,
                len: if l1 == l2 { l1 } else { None },
            },
            _ => Json,
        }
    }
}

/// The kind of a CSV cell; `None` for an empty one (a missing value).
pub(super) fn cell_kind(cell: &str) -> Option<Kind> {
    if cell.is_empty() {
        None
    } else if cell.parse::<i64>().is_ok() {
        Some(Kind::Int)
    } else if cell.parse::<f64>().is_ok() {
        Some(Kind::Float)
    } else {
        Some(Kind::Text)
    }
}

/// The kind of a JSON value; `None` for `null` (a missing value).
pub(super) fn json_kind(v: &serde_json::Value) -> Option<Kind> {
    use serde_json::Value as J;
    Some(match v {
        J::Null => return None,
        J::Bool(_) => Kind::Int,
        J::Number(n) if n.is_i64() => Kind::Int,
        J::Number(_) => Kind::Float,
        J::String(_) => Kind::Text,
        J::Array(items) if items.iter().all(|x| x.is_number()) => Kind::List {
            float: items.iter().any(|x| !x.is_i64()),
            len: Some(items.len()),
        },
        _ => Kind::Json,
    })
}

/// What the first pass has learnt of a column: the kind of its values so far, and whether some
/// row lacks a value.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Inferred {
    kind: Option<Kind>,
    missing: bool,
}

impl Inferred {
    /// Notes a value of kind `kind`, or a missing one (`None`).
    pub(super) fn add(&mut self, kind: Option<Kind>) {
        match kind {
            None => self.missing = true,
            Some(k) => self.kind = Some(self.kind.map_or(k, |k0| k0.unify(k))),
        }
    }

    /// The column named `name`.
    pub(super) fn column(self, name: String) -> Column {
        Column {
            name,
            // No value at all: text; whole numbers with gaps: float (NaN fills them).
            kind: match (self.kind, self.missing) {
                (None, _) => Kind::Text,
                (Some(Kind::Int), true) => Kind::Float,
                (Some(k), _) => k,
            },
            missing: self.missing,
        }
    }
}

/// One value of a row.
#[derive(Debug, Clone)]
pub(super) enum Value {
    /// An empty CSV cell, a JSON `null` or a key the line lacks.
    Missing,
    Int(i64),
    Float(f64),
    Text(String),
    Bytes(Bytes),
    List(Vec<f64>, Vec<i64>),
    /// JSON text of a value that is not one of the above.
    Json(String),
    Array(Array),
}

/// A column: its name in the input and its kind.
#[derive(Debug, Clone)]
pub(super) struct Column {
    pub(super) name: String,
    pub(super) kind: Kind,
    /// Whether some row lacks a value.
    pub(super) missing: bool,
}

#[cfg(test)]
mod tests {
    use super::Kind::*;
    use super::*;
    use serde_json::json;

    const fn list(float: bool, len: Option<usize>) -> Kind {
        List { float, len }
    }

    /// Every kind, lists of both element types and of fixed and varying length among them.
    const ALL: [Kind; 10] = [
        Int,
        Float,
        Text,
        Bytes,
        list(false, Some(2)),
        list(true, Some(2)),
        list(false, Some(3)),
        list(false, None),
        Json,
        Array,
    ];

    /// The pairs of different kinds in `ALL` whose column is not JSON text, and what it is.
    const NOT_JSON: [(Kind, Kind, Kind); 9] = [
        (Int, Float, Float),
        (Text, Int, Text),
        (Text, Float, Text),
        (
            list(false, Some(2)),
            list(true, Some(2)),
            list(true, Some(2)),
        ),
        (
            list(false, Some(2)),
            list(false, Some(3)),
            list(false, None),
        ),
        (list(false, Some(2)), list(false, None), list(false, None)),
        (list(true, Some(2)), list(false, Some(3)), list(true, None)),
        (list(true, Some(2)), list(false, None), list(true, None)),
        (list(false, Some(3)), list(false, None), list(false, None)),
    ];

    #[test]
    fn unify_every_pair() {
        for a in ALL {
            for b in ALL {
                let expected = if a == b {
                    a
                } else {
                    NOT_JSON
                        .iter()
                        .find(|(x, y, _)| (*x, *y) == (a, b) || (*x, *y) == (b, a))
                        .map_or(Json, |(_, _, k)| *k)
                };
                assert_eq!(a.unify(b), expected, "{a:?} with {b:?}");
            }
        }
    }

    #[test]
    fn unify_numbers_widen_and_text_absorbs_numbers_only() {
        assert_eq!(Int.unify(Int), Int);
        assert_eq!(Int.unify(Float), Float);
        assert_eq!(Float.unify(Int), Float);
        assert_eq!(Text.unify(Int), Text);
        assert_eq!(Float.unify(Text), Text);
        // Text beside anything but numbers is no longer text: the column keeps JSON text.
        assert_eq!(Text.unify(Bytes), Json);
        assert_eq!(Text.unify(list(false, Some(2))), Json);
        assert_eq!(Text.unify(Json), Json);
        assert_eq!(Int.unify(list(false, Some(1))), Json);
        assert_eq!(Array.unify(Int), Json);
    }

    #[test]
    fn unify_lists_turn_float_if_either_is_and_lose_a_length_that_differs() {
        assert_eq!(
            list(false, Some(2)).unify(list(true, Some(2))),
            list(true, Some(2))
        );
        assert_eq!(
            list(false, Some(2)).unify(list(false, Some(3))),
            list(false, None)
        );
        assert_eq!(
            list(true, None).unify(list(false, Some(3))),
            list(true, None)
        );
        // Once a length has varied it stays unknown, even when a later list matches.
        assert_eq!(
            list(false, Some(2))
                .unify(list(false, Some(3)))
                .unify(list(false, Some(2))),
            list(false, None)
        );
    }

    #[test]
    fn cell_kinds() {
        for (cell, kind) in [
            ("0", Some(Int)),
            ("-17", Some(Int)),
            ("+5", Some(Int)),
            ("9223372036854775807", Some(Int)),
            // Past i64: a float, as Rust parses it.
            ("9223372036854775808", Some(Float)),
            ("1.5", Some(Float)),
            ("-.5", Some(Float)),
            ("1.", Some(Float)),
            ("1e5", Some(Float)),
            ("2.5E-3", Some(Float)),
            // Rust's float syntax takes these words, so a column of them is numeric.
            ("nan", Some(Float)),
            ("NaN", Some(Float)),
            ("inf", Some(Float)),
            ("-infinity", Some(Float)),
            ("", None),
            ("abc", Some(Text)),
            ("1,5", Some(Text)),
            (" 1", Some(Text)),
            ("0x10", Some(Text)),
            ("true", Some(Text)),
        ] {
            assert_eq!(cell_kind(cell), kind, "{cell:?}");
        }
    }

    #[test]
    fn json_kinds() {
        for (v, kind) in [
            (json!(null), None),
            (json!(true), Some(Int)),
            (json!(false), Some(Int)),
            (json!(3), Some(Int)),
            (json!(-3), Some(Int)),
            (json!(3.0), Some(Float)),
            (json!(1e300), Some(Float)),
            // Past i64: not an integer here, so a float.
            (json!(u64::MAX), Some(Float)),
            (json!("3"), Some(Text)),
            (json!(""), Some(Text)),
            (json!([]), Some(list(false, Some(0)))),
            (json!([1, 2, 3]), Some(list(false, Some(3)))),
            (json!([1, 2.5]), Some(list(true, Some(2)))),
            (json!([1, "a"]), Some(Json)),
            (json!([1, null]), Some(Json)),
            (json!([[1], [2]]), Some(Json)),
            (json!({"a": 1}), Some(Json)),
            (json!({"a": {"b": [1]}}), Some(Json)),
        ] {
            assert_eq!(json_kind(&v), kind, "{v}");
        }
    }

    fn infer(kinds: &[Option<Kind>]) -> Column {
        let mut c = Inferred::default();
        for &k in kinds {
            c.add(k);
        }
        c.column("c".into())
    }

    #[test]
    fn inferred_columns_from_values_and_gaps() {
        let c = infer(&[Some(Int), Some(Int)]);
        assert_eq!((c.name.as_str(), c.kind, c.missing), ("c", Int, false));
        // Whole numbers with a gap become floats, so the gap can be NaN.
        let c = infer(&[Some(Int), None, Some(Int)]);
        assert_eq!((c.kind, c.missing), (Float, true));
        let c = infer(&[Some(Int), Some(Float)]);
        assert_eq!((c.kind, c.missing), (Float, false));
        // Other kinds keep their kind with gaps.
        let c = infer(&[None, Some(Text)]);
        assert_eq!((c.kind, c.missing), (Text, true));
        let c = infer(&[Some(list(false, Some(2))), None]);
        assert_eq!((c.kind, c.missing), (list(false, Some(2)), true));
        // Nothing but gaps, or no rows: text.
        let c = infer(&[None, None]);
        assert_eq!((c.kind, c.missing), (Text, true));
        let c = infer(&[]);
        assert_eq!((c.kind, c.missing), (Text, false));
    }
}
