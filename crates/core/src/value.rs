//! [`Value`]: a nested value of a record (a list of strings, a chat's `messages`, a map),
//! what a column holds where its rows are not numbers, bytes or text of one shape.
//!
//! A source makes one per row of such a column ([`crate::Field::Value`]); the batcher keeps a
//! batch's values as they are ([`crate::Column::Values`]); the Python package hands them over
//! as Python lists, dicts and scalars (what `datasets`' Python formatting and pyarrow's
//! `to_pylist` give), and native transforms read fields inside them by name.

use std::sync::Arc;

use bytes::Bytes;

/// The field names of a record, shared by every record of a column (one allocation per
/// column, not per row).
pub type Keys = Arc<[Arc<str>]>;

/// A nested value.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Value {
    /// No value (a null).
    Null,
    /// A bool.
    Bool(bool),
    /// A signed integer (temporal values as counts of their unit).
    Int(i64),
    /// An unsigned integer.
    UInt(u64),
    /// A float (decimals as the nearest double).
    Float(f64),
    /// UTF-8 text.
    Text(Bytes),
    /// Bytes.
    Bytes(Bytes),
    /// A list.
    List(Vec<Value>),
    /// A record: a value per key of `keys`, in order.
    Record(Keys, Vec<Value>),
    /// A map's entries, in order (keys need not be text; pyarrow gives them as pairs).
    Map(Vec<(Value, Value)>),
    /// An n-dimensional numeric array (a member of an `.npz` archive, one of a `.ten`
    /// file's tensors): a numpy array in Python.
    Array(crate::Array),
}

impl Value {
    /// The value of `key`, if this is a record that has it.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Record(keys, values) => keys
                .iter()
                .position(|k| &**k == key)
                .and_then(|i| values.get(i)),
            _ => None,
        }
    }

    /// The value at `path` (keys of nested records), if every step is a record that has it.
    pub fn at(&self, path: &[&str]) -> Option<&Value> {
        path.iter().try_fold(self, |v, k| v.get(k))
    }

    /// The text, if this is text.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Text(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    /// What the value is, for messages: `a list of 3`, `a record {role, content}`.
    pub fn describe(&self) -> String {
        match self {
            Value::Null => "null".into(),
            Value::Bool(_) => "a bool".into(),
            Value::Int(_) | Value::UInt(_) => "an integer".into(),
            Value::Float(_) => "a float".into(),
            Value::Text(b) => format!("text ({} bytes)", b.len()),
            Value::Bytes(b) => format!("bytes ({} bytes)", b.len()),
            Value::List(v) => format!("a list of {}", v.len()),
            Value::Record(keys, _) => format!("a record {{{}}}", keys.join(", ")),
            Value::Map(e) => format!("a map of {}", e.len()),
            Value::Array(a) => format!("a {} {:?} array", a.dtype, a.shape),
        }
    }

    /// Bytes of payload (text and bytes, 8 a scalar), roughly what the value costs to hand
    /// over.
    pub fn nbytes(&self) -> usize {
        match self {
            Value::Null => 0,
            Value::Bool(_) => 1,
            Value::Int(_) | Value::UInt(_) | Value::Float(_) => 8,
            Value::Text(b) | Value::Bytes(b) => b.len(),
            Value::List(v) | Value::Record(_, v) => v.iter().map(Value::nbytes).sum(),
            Value::Map(e) => e.iter().map(|(k, v)| k.nbytes() + v.nbytes()).sum(),
            Value::Array(a) => a.data.len(),
        }
    }

    /// Feeds a canonical encoding of the value to `out` (a tag byte, then the contents;
    /// lengths before contents), for digests: equal values give equal bytes, and a float is
    /// its bits.
    pub fn encode(&self, out: &mut dyn FnMut(&[u8])) {
        let len = |out: &mut dyn FnMut(&[u8]), n: usize| out(&(n as u64).to_le_bytes());
        match self {
            Value::Null => out(&[0]),
            Value::Bool(b) => out(&[1, u8::from(*b)]),
            Value::Int(i) => {
                out(&[2]);
                out(&i.to_le_bytes());
            }
            Value::UInt(u) => {
                out(&[3]);
                out(&u.to_le_bytes());
            }
            Value::Float(f) => {
                out(&[4]);
                out(&f.to_bits().to_le_bytes());
            }
            Value::Text(b) | Value::Bytes(b) => {
                out(&[if matches!(self, Value::Text(_)) { 5 } else { 6 }]);
                len(out, b.len());
                out(b);
            }
            Value::List(v) => {
                out(&[7]);
                len(out, v.len());
                v.iter().for_each(|x| x.encode(out));
            }
            Value::Record(keys, v) => {
                out(&[8]);
                len(out, v.len());
                for (k, x) in keys.iter().zip(v) {
                    len(out, k.len());
                    out(k.as_bytes());
                    x.encode(out);
                }
            }
            Value::Map(e) => {
                out(&[9]);
                len(out, e.len());
                for (k, v) in e {
                    k.encode(out);
                    v.encode(out);
                }
            }
            Value::Array(a) => {
                out(&[10]);
                let name = a.dtype.to_string();
                len(out, name.len());
                out(name.as_bytes());
                len(out, a.shape.len());
                a.shape.iter().for_each(|&d| len(out, d));
                out(&a.data);
            }
        }
    }
}

impl Value {
    /// JSON text as a value: objects as records (keys in the text's order, as Python's
    /// `json.loads` keeps them), arrays as lists, integers as `Int` (`UInt` past `i64`),
    /// other numbers as `Float`, strings as `Text`; nesting at most 128 deep (serde_json's
    /// own limit).
    pub fn from_json(text: &[u8]) -> Result<Value, String> {
        use serde::de::DeserializeSeed;
        let mut de = serde_json::Deserializer::from_slice(text);
        let v = JsonValue
            .deserialize(&mut de)
            .and_then(|v| de.end().map(|()| v))
            .map_err(|e| e.to_string())?;
        Ok(v)
    }
}

/// A JSON value read straight into a [`Value`] (no intermediate tree; keys kept in order).
struct JsonValue;

impl<'de> serde::de::DeserializeSeed<'de> for JsonValue {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for JsonValue {
    type Value = Value;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(i64::try_from(v).map_or(Value::UInt(v), Value::Int))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Text(Bytes::copy_from_slice(v.as_bytes())))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(v) = seq.next_element_seed(JsonValue)? {
            items.push(v);
        }
        Ok(Value::List(items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let (mut keys, mut values): (Vec<Arc<str>>, Vec<Value>) = (Vec::new(), Vec::new());
        while let Some(k) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let v = map.next_value_seed(JsonValue)?;
            // A repeated key keeps its last value, as `json.loads` does.
            match keys.iter().position(|x| **x == *k) {
                Some(i) => values[i] = v,
                None => {
                    keys.push(Arc::from(k.as_ref()));
                    values.push(v);
                }
            }
        }
        Ok(Value::Record(Arc::from(keys), values))
    }
}

/// Nested values a source keeps in its own form (rows of Arrow arrays), one a row of a batch
/// ([`crate::Column::Nested`]): read as [`Value`]s where a consumer needs them (digests), or
/// converted straight from that form by one that knows it (the Python package builds its
/// lists and dicts from the arrays, with no `Value` in between).
pub trait NestedRows: Send + Sync + std::fmt::Debug {
    /// Rows.
    fn len(&self) -> usize;
    /// True when there are no rows.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Row `i` as a value, or why it cannot be read.
    fn value(&self, i: usize) -> Result<Value, String>;
    /// Bytes the rows' arrays hold, roughly (what the batch keeps alive).
    fn nbytes(&self) -> usize;
    /// Itself, for a consumer that knows the concrete type.
    fn as_any(&self) -> &dyn std::any::Any;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(role: &str, content: &str) -> Value {
        let keys: Keys = Arc::from(vec![Arc::from("role"), Arc::from("content")]);
        Value::Record(
            keys,
            vec![
                Value::Text(Bytes::copy_from_slice(role.as_bytes())),
                Value::Text(Bytes::copy_from_slice(content.as_bytes())),
            ],
        )
    }

    fn encoded(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        v.encode(&mut |b| out.extend_from_slice(b));
        out
    }

    #[test]
    fn records_are_read_by_key_and_path() {
        let m = message("user", "hi");
        assert_eq!(m.get("role").and_then(Value::as_str), Some("user"));
        assert_eq!(m.get("name"), None);
        let keys: Keys = Arc::from(vec![Arc::from("m")]);
        let outer = Value::Record(keys, vec![m]);
        assert_eq!(
            outer.at(&["m", "content"]).and_then(Value::as_str),
            Some("hi")
        );
        assert_eq!(outer.at(&["m", "x"]), None);
        assert_eq!(outer.describe(), "a record {m}");
        assert_eq!(outer.nbytes(), 6);
    }

    #[test]
    fn json_reads_in_order_with_every_kind() {
        let v =
            Value::from_json(br#"{"z": 1, "a": [true, null, 2.5, "s"], "m": {"k": -3}, "z": 4}"#)
                .unwrap();
        let Value::Record(keys, values) = &v else {
            panic!("{v:?}")
        };
        assert_eq!(
            keys.iter().map(|k| &**k).collect::<Vec<_>>(),
            ["z", "a", "m"]
        );
        assert_eq!(values[0], Value::Int(4));
        assert_eq!(
            values[1],
            Value::List(vec![
                Value::Bool(true),
                Value::Null,
                Value::Float(2.5),
                Value::Text(Bytes::from_static(b"s"))
            ])
        );
        assert_eq!(v.at(&["m", "k"]), Some(&Value::Int(-3)));
        assert!(Value::from_json(b"{\"a\": }").is_err());
        assert!(Value::from_json(b"[1] x").is_err());
    }

    #[test]
    fn the_encoding_tells_values_apart() {
        let a = Value::List(vec![message("user", "hi")]);
        let b = Value::List(vec![message("use", "rhi")]);
        assert_ne!(encoded(&a), encoded(&b));
        assert_eq!(encoded(&a), encoded(&a.clone()));
        assert_ne!(
            encoded(&Value::Text(Bytes::from_static(b"x"))),
            encoded(&Value::Bytes(Bytes::from_static(b"x")))
        );
        assert_ne!(encoded(&Value::Int(1)), encoded(&Value::UInt(1)));
        assert_ne!(
            encoded(&Value::List(vec![Value::Null, Value::Null])),
            encoded(&Value::List(vec![Value::List(vec![Value::Null])]))
        );
    }
}
