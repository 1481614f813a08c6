//! JSON Lines as records: `.jsonl` and `.ndjson` files (and `.gz` / `.zst` compressed ones),
//! or a `.json` file of JSON Lines or of one array of records, read into Arrow record batches
//! and served by [`ArrowSource`] (so columns, kinds, nulls, structs by path and nested values
//! are those of Parquet and Arrow files: the columnar skeleton's).
//!
//! When a source is opened, every file is read (a compressed one decompressed whole, bounded
//! by `max_decoded_bytes`) and its schema inferred over every line, as `datasets`' JSON
//! loader (pyarrow's JSON reader) infers one: integers `int64`, numbers with a fraction (or
//! integers beside them) `float64`, `bool`, strings, lists, objects as structs (fields in the
//! order first seen), a field that is `null` on every line the null type, and a field missing
//! from a line null there; and as `datasets` 5's default (`on_mixed_types="use_json"`), JSON
//! values (the `arrow.json` extension type: each row's value kept as its text, parsed when
//! read) where a field's values are of different kinds, or where objects below the top level
//! do not all have the same keys (a chat's messages where only some carry `tool_calls`).
//! The lines are cut into pieces of about 4 MiB, each decoded into a record batch when first
//! read (on the loader's workers, in parallel): every row is in memory, so a global shuffle,
//! an exact rank split and a resume read any row. A line that
//! is not JSON, or not an object, is an error naming the file and the line.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
use bytes::Bytes;
use chute_core::{Error, Limits};

use crate::columnar;
use crate::ipc::{ArrowOptions, ArrowSource};

/// Bytes of lines decoded together into one record batch (a piece ends at a line's end).
const PIECE_BYTES: usize = 4 << 20;

/// Opens JSON Lines files (paths or URLs) as one source of records.
pub fn open<P: AsRef<Path>>(paths: &[P], options: ArrowOptions) -> Result<ArrowSource, Error> {
    from_bytes(columnar::read_files(paths, "JSON Lines")?, options)
}

/// Opens JSON Lines files already in memory, each `(name, bytes)`; a name ending in `.gz` or
/// `.zst` is decompressed.
pub fn from_bytes(
    contents: Vec<(String, Bytes)>,
    options: ArrowOptions,
) -> Result<ArrowSource, Error> {
    columnar::given(&contents, "JSON Lines")?;
    let mut files = Vec::with_capacity(contents.len());
    for (origin, data) in contents {
        let data = without_bom(decompressed(&origin, data)?);
        let data = records_of_array(&origin, data)?;
        files.push((origin, data));
    }
    let (schema, seen) = infer(&files)?;
    let schema = Arc::new(schema);
    let width: u64 = schema
        .fields()
        .iter()
        .map(|f| fields_in(f.data_type()))
        .sum();
    let max_rows = (PIECE_DECODED / (width.max(1) * 8)).max(1);
    let mut pieces = Vec::new();
    let mut decoded = 0u64;
    for (origin, data) in &files {
        let origin: Arc<str> = Arc::from(origin.as_str());
        for (range, line, rows) in cut(data, max_rows) {
            let offset = range.start as u64;
            let data = data.slice(range);
            decoded = decoded
                .saturating_add(rows.saturating_mul(width.max(1) * 8))
                .saturating_add(data.len() as u64);
            pieces.push(Piece {
                origin: origin.clone(),
                data,
                line,
                offset,
                rows,
                schema: schema.clone(),
            });
        }
    }
    let origin = match files.len() {
        1 => files[0].0.clone(),
        n => format!("{} and {} more JSON Lines files", files[0].0, n - 1),
    };
    // Every record stays decoded once read: refuse what would not fit in this machine.
    let memory = crate::ipc::physical_memory();
    if decoded > memory {
        return Err(Error::corrupt_as(
            chute_core::Corruption::TooLarge,
            &origin,
            0,
            format!(
                "its {} records of {width} fields would decode to about {decoded} bytes, more \
                 than this machine's {memory} bytes of memory; convert it to Parquet (chute \
                 convert) or split it",
                seen.rows
            ),
        ));
    }
    // A field holds nulls where some line gives it no value.
    let holds_nulls = |name: &str| seen.present.get(name).copied().unwrap_or(0) < seen.rows;
    ArrowSource::from_json(schema, pieces, holds_nulls, &origin, options)
}

/// Lines of a JSON Lines file decoded together, on first use, into one record batch.
pub(crate) struct Piece {
    /// The file's name, for errors.
    pub(crate) origin: Arc<str>,
    /// The lines, whole.
    pub(crate) data: Bytes,
    /// The number of the first line (from 1), and its byte offset in the (decompressed) file.
    pub(crate) line: usize,
    pub(crate) offset: u64,
    /// Records in it (lines that are not blank).
    pub(crate) rows: u64,
    pub(crate) schema: SchemaRef,
}

impl Piece {
    /// The piece's records as a record batch of its schema; an error names the line.
    pub(crate) fn decode(&self) -> Result<RecordBatch, Error> {
        piece(&self.origin, &self.data, self.line, self.rows, &self.schema)
    }
}

/// `data` decompressed where `origin` says it is compressed (`.gz`, `.zst`), at most
/// `max_decoded_bytes` of it.
fn decompressed(origin: &str, data: Bytes) -> Result<Bytes, Error> {
    let name = origin.split(['?', '#']).next().unwrap_or(origin);
    let reader: Box<dyn Read + '_> = if name.ends_with(".gz") {
        Box::new(flate2::read::MultiGzDecoder::new(&data[..]))
    } else if name.ends_with(".zst") {
        Box::new(
            zstd::stream::read::Decoder::new(&data[..])
                .map_err(|e| Error::corrupt(origin, 0, format!("not zstd: {e}")))?,
        )
    } else {
        return Ok(data);
    };
    let limit = Limits::current().max_decoded_bytes;
    let mut out = Vec::new();
    reader
        .take(limit.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| Error::corrupt(origin, 0, format!("its compressed data is corrupt: {e}")))?;
    if out.len() as u64 > limit {
        return Err(Error::corrupt(
            origin,
            0,
            chute_core::limits::exceeded(
                "the file",
                format!("more than {limit}"),
                "decompressed bytes",
                "max_decoded_bytes",
                limit,
            ),
        ));
    }
    Ok(Bytes::from(out))
}

/// `data` without a UTF-8 byte-order mark at its start (Windows tools write one; pyarrow's
/// reader, and so `datasets`, skip it).
fn without_bom(data: Bytes) -> Bytes {
    if data.starts_with(b"\xEF\xBB\xBF") {
        data.slice(3..)
    } else {
        data
    }
}

/// A file that holds one JSON array (a `.json` file of records, as `datasets` reads one) as
/// JSON Lines of its elements; other data as it is.
fn records_of_array(origin: &str, data: Bytes) -> Result<Bytes, Error> {
    if data.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'[') {
        return Ok(data);
    }
    let values: Vec<serde_json::Value> = serde_json::from_slice(&data).map_err(|e| {
        Error::corrupt(
            origin,
            0,
            format!("line {}: not a JSON array of records: {e}", e.line()),
        )
    })?;
    let mut out = Vec::with_capacity(data.len());
    for v in &values {
        serde_json::to_writer(&mut out, v).expect("a value writes to memory");
        out.push(b'\n');
    }
    Ok(Bytes::from(out))
}

/// The lines of `data` (1-based numbers), blank ones left out.
fn lines(data: &[u8], first: usize) -> impl Iterator<Item = (usize, &[u8])> {
    data.split(|&b| b == b'\n')
        .enumerate()
        .map(move |(i, l)| (first + i, l))
        .filter(|(_, l)| !l.iter().all(u8::is_ascii_whitespace))
}

/// The schema of every line of `files`, or an error naming the file and line that is not
/// JSON, not an object, or whose types cannot join the others'; and what the lines hold
/// ([`Seen`]).
fn infer(files: &[(String, Bytes)]) -> Result<(Schema, Seen), Error> {
    let mut root = Node::default();
    let mut rows = 0u64;
    for (origin, data) in files {
        for (line, text) in lines(data, 1) {
            let first = text.iter().find(|b| !b.is_ascii_whitespace());
            if first != Some(&b'{') {
                let why = match serde_json::from_slice::<serde_json::Value>(text) {
                    Err(e) => format!("line {line}: not JSON: {e}"),
                    Ok(v) => format!(
                        "line {line}: a JSON {}, not an object (a record is one object a line)",
                        kind_of(&v)
                    ),
                };
                return Err(Error::corrupt(origin, 0, why));
            }
            let conflict = std::cell::RefCell::new(None);
            let at = At {
                line,
                file: origin,
                conflict: &conflict,
            };
            let mut de = serde_json::Deserializer::from_slice(text);
            let parsed = serde::de::DeserializeSeed::deserialize(
                Walk {
                    node: &mut root,
                    at: &at,
                    listed: false,
                    path: &FieldPath::Root,
                },
                &mut de,
            )
            .and_then(|()| de.end());
            if let Err(e) = parsed {
                let why = conflict
                    .into_inner()
                    .unwrap_or_else(|| format!("line {line}: not JSON: {e}"));
                return Err(Error::corrupt(origin, 0, why));
            }
            rows += 1;
        }
    }
    let Ty::Object(fields) = &root.ty else {
        return Ok((Schema::empty(), Seen::default()));
    };
    let schema = Schema::new(
        fields
            .iter()
            .map(|(name, n)| n.field(name))
            .collect::<Vec<_>>(),
    );
    let mut present = std::collections::HashMap::new();
    root.present_into("", &mut present);
    Ok((schema, Seen { present, rows }))
}

/// What the lines of a source hold: per field path outside lists (`a`, `meta.a`), the lines
/// that give it a value, and the lines.
#[derive(Default)]
struct Seen {
    present: std::collections::HashMap<String, u64>,
    rows: u64,
}

/// The type inferred for a field, as pyarrow's JSON reader infers one.
#[derive(Default)]
enum Ty {
    /// Only nulls so far.
    #[default]
    Null,
    Bool,
    Int,
    Float,
    Str,
    /// A list: its items' node.
    List(Box<Node>),
    /// An object: its fields, in the order first seen.
    Object(Vec<(String, Node)>),
    /// Values kept as JSON text, parsed per row (the `arrow.json` extension, `datasets`'
    /// `Json` feature): where the values' types conflict (a number here, text there, an
    /// object beside a string), or, below the top level, where objects do not all have the
    /// same keys (or the first has none), as `datasets`' JSON loader (`on_mixed_types=
    /// "use_json"`, its default) decides.
    Json,
}

impl Ty {
    /// The JSON kind, for messages.
    fn kind(&self) -> &'static str {
        match self {
            Ty::Null => "null",
            Ty::Bool => "bool",
            Ty::Int | Ty::Float => "number",
            Ty::Str => "string",
            Ty::List(_) => "array",
            Ty::Object(_) => "object",
            Ty::Json => "JSON value",
        }
    }

    fn arrow(&self) -> arrow_schema::DataType {
        use arrow_schema::DataType;
        match self {
            Ty::Null => DataType::Null,
            Ty::Bool => DataType::Boolean,
            Ty::Int => DataType::Int64,
            Ty::Float => DataType::Float64,
            Ty::Str | Ty::Json => DataType::Utf8,
            Ty::List(item) => DataType::List(Arc::new(item.field("item"))),
            Ty::Object(fields) => {
                DataType::Struct(fields.iter().map(|(name, n)| n.field(name)).collect())
            }
        }
    }
}

/// A field's inferred type, the line that first gave it a kind, and (outside lists) the
/// lines that gave it a value.
#[derive(Default)]
struct Node {
    ty: Ty,
    /// An object's field places by name, once it has more than [`FEW_FIELDS`].
    index: std::collections::HashMap<String, usize>,
    line: usize,
    file: String,
    present: u64,
    /// For an object below the top level, how many keys the first one had: the others must
    /// have the same keys, or the values are JSON ([`Ty::Json`]).
    first_keys: Option<usize>,
}

impl Node {
    /// The Arrow field `name` of this node's type (JSON text marked as the `arrow.json`
    /// extension type).
    fn field(&self, name: &str) -> arrow_schema::Field {
        let f = arrow_schema::Field::new(name, self.ty.arrow(), true);
        if matches!(self.ty, Ty::Json) {
            let ext: std::collections::HashMap<String, String> =
                [("ARROW:extension:name".to_string(), "arrow.json".to_string())].into();
            f.with_metadata(ext)
        } else {
            f
        }
    }

    /// Adds the present counts of this node's object fields under `path` to `out`.
    fn present_into(&self, path: &str, out: &mut std::collections::HashMap<String, u64>) {
        if let Ty::Object(fields) = &self.ty {
            for (name, n) in fields {
                let p = if path.is_empty() {
                    name.clone()
                } else {
                    format!("{path}.{name}")
                };
                n.present_into(&p, out);
                out.insert(p, n.present);
            }
        }
    }

    /// Makes this node's kind `kind` (a number joins a number, null anything, and values of
    /// other kinds make JSON values, as `datasets` reads them, below the top level), or says
    /// why it cannot.
    fn join(&mut self, want: Ty, at: &At<'_>, path: &FieldPath<'_>) -> Result<(), String> {
        let same = std::mem::discriminant(&self.ty) == std::mem::discriminant(&want);
        match (&self.ty, &want) {
            (Ty::Null, _) => {
                self.ty = want;
                self.line = at.line;
                at.file.clone_into(&mut self.file);
            }
            (Ty::Int, Ty::Float) => self.ty = Ty::Float,
            (Ty::Float, Ty::Int) => {}
            _ if same => {}
            (_, _) if !matches!(path, FieldPath::Root) => self.ty = Ty::Json,
            (have, _) => {
                let whose = if self.file == at.file {
                    String::new()
                } else {
                    format!(" of {}", self.file)
                };
                let path = path.render();
                return Err(format!(
                    "line {}: field {path:?} is a{} {}, but it is a{} {} on line {}{whose} \
                     (every value of a field must be of one type, as for `datasets`' JSON \
                     loader; integers and floats are both numbers)",
                    at.line,
                    if want.kind() == "array" || want.kind() == "object" {
                        "n"
                    } else {
                        ""
                    },
                    want.kind(),
                    if have.kind() == "array" || have.kind() == "object" {
                        "n"
                    } else {
                        ""
                    },
                    have.kind(),
                    self.line
                ));
            }
        }
        Ok(())
    }
}

/// Where a value lies in its line's record, rendered only for a message (`meta.a`,
/// `messages[].role`).
enum FieldPath<'a> {
    Root,
    Field(&'a FieldPath<'a>, &'a str),
    Item(&'a FieldPath<'a>),
}

impl FieldPath<'_> {
    fn render(&self) -> String {
        match self {
            FieldPath::Root => String::new(),
            FieldPath::Field(FieldPath::Root, name) => (*name).to_string(),
            FieldPath::Field(up, name) => format!("{}.{name}", up.render()),
            FieldPath::Item(up) => format!("{}[]", up.render()),
        }
    }
}

/// Fields of an object searched one by one; past this many, through a map.
const FEW_FIELDS: usize = 16;

/// The line being read, for messages; a conflict found is left in `conflict`.
struct At<'a> {
    line: usize,
    file: &'a str,
    conflict: &'a std::cell::RefCell<Option<String>>,
}

/// A JSON value read into `node` (at field `path`; `listed`: inside a list, where presence is
/// not counted), without keeping it.
struct Walk<'a, 'b> {
    node: &'a mut Node,
    at: &'a At<'b>,
    listed: bool,
    path: &'a FieldPath<'a>,
}

impl Walk<'_, '_> {
    fn join<E: serde::de::Error>(self, ty: Ty) -> Result<(), E> {
        if !self.listed {
            self.node.present += 1;
        }
        self.node.join(ty, self.at, self.path).map_err(|why| {
            *self.at.conflict.borrow_mut() = Some(why);
            E::custom("a type conflict")
        })
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Walk<'_, '_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        if matches!(self.node.ty, Ty::Json) {
            // Kept as text: only whether it is there counts.
            let v: Option<serde::de::IgnoredAny> = serde::Deserialize::deserialize(d)?;
            if v.is_some() && !self.listed {
                self.node.present += 1;
            }
            return Ok(());
        }
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Walk<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
        self.join(Ty::Bool)
    }

    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<(), E> {
        self.join(Ty::Int)
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<(), E> {
        // Past int64, a number is read as a float (as pyarrow's reader does not: it fails).
        self.join(if i64::try_from(v).is_ok() {
            Ty::Int
        } else {
            Ty::Float
        })
    }

    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<(), E> {
        self.join(Ty::Float)
    }

    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<(), E> {
        self.join(Ty::Str)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Walk {
            node,
            at,
            listed,
            path,
        } = self;
        Walk {
            node: &mut *node,
            at,
            listed,
            path,
        }
        .join::<A::Error>(Ty::List(Box::default()))?;
        let Ty::List(item) = &mut node.ty else {
            // A conflict made it JSON just now: the rest of the array is passed over.
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            return Ok(());
        };
        let inner = FieldPath::Item(path);
        while seq
            .next_element_seed(Walk {
                node: item,
                at,
                listed: true,
                path: &inner,
            })?
            .is_some()
        {}
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Walk {
            node,
            at,
            listed,
            path,
        } = self;
        if !matches!(path, FieldPath::Root) {
            Walk {
                node: &mut *node,
                at,
                listed,
                path,
            }
            .join::<A::Error>(Ty::Object(Vec::new()))?;
        } else if matches!(node.ty, Ty::Null) {
            node.ty = Ty::Object(Vec::new());
        }
        if matches!(node.ty, Ty::Json) {
            // A conflict made it JSON just now: the rest of the object is passed over.
            while map
                .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                .is_some()
            {}
            return Ok(());
        }
        let Ty::Object(fields) = &mut node.ty else {
            unreachable!("joined as an object")
        };
        let index = &mut node.index;
        // Below the top level, every object must have the first one's keys (and it some).
        let root = matches!(path, FieldPath::Root);
        let first = node.first_keys;
        let (mut keys, mut mixed) = (0usize, false);
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            keys += 1;
            // A few fields are searched in order; many (a hostile line of a million keys)
            // through a map, so a line costs time in proportion to its length.
            let found = if fields.len() <= FEW_FIELDS {
                fields.iter().position(|(k, _)| *k == key)
            } else {
                for (i, (k, _)) in fields.iter().enumerate().skip(index.len()) {
                    index.insert(k.clone(), i);
                }
                index.get(key.as_ref()).copied()
            };
            let i = match found {
                Some(i) => i,
                None => {
                    mixed |= first.is_some();
                    fields.push((key.into_owned(), Node::default()));
                    fields.len() - 1
                }
            };
            let (name, child) = &mut fields[i];
            let child_path = FieldPath::Field(path, name);
            map.next_value_seed(Walk {
                node: child,
                at,
                listed,
                path: &child_path,
            })?;
        }
        if !root {
            match first {
                None => {
                    node.first_keys = Some(keys);
                    mixed |= keys == 0;
                }
                Some(n) => mixed |= keys != n,
            }
            if mixed {
                node.ty = Ty::Json;
            }
        }
        Ok(())
    }
}

fn kind_of(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "bool",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

/// `data` cut at line ends into pieces of about [`PIECE_BYTES`], and of at most `max_rows`
/// records: each piece's byte range, the number of its first line and its records.
fn cut(data: &[u8], max_rows: u64) -> Vec<(std::ops::Range<usize>, usize, u64)> {
    let mut pieces = Vec::new();
    let (mut start, mut line, mut rows) = (0usize, 1usize, 0u64);
    let (mut at, mut next_line) = (0usize, 1usize);
    while at < data.len() {
        let end = data[at..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(data.len(), |i| at + i + 1);
        if !data[at..end].iter().all(u8::is_ascii_whitespace) {
            rows += 1;
        }
        at = end;
        next_line += 1;
        if at - start >= PIECE_BYTES || rows >= max_rows || at == data.len() {
            pieces.push((start..at, line, rows));
            (start, line, rows) = (at, next_line, 0);
        }
    }
    pieces
}

/// Bytes one piece's record batch may take decoded, roughly (its records times the schema's
/// fields, 8 bytes each): pieces of a wide schema hold fewer records.
const PIECE_DECODED: u64 = 64 << 20;

/// Fields in `dt`, itself included: what a record of it costs to decode, roughly, in
/// columns.
fn fields_in(dt: &arrow_schema::DataType) -> u64 {
    use arrow_schema::DataType;
    1 + match dt {
        DataType::Struct(fields) => fields.iter().map(|f| fields_in(f.data_type())).sum(),
        DataType::List(f) => fields_in(f.data_type()),
        _ => 0,
    }
}

/// Where a schema's JSON-text fields ([`Ty::Json`]) are: at this place, or below it in an
/// object's fields or a list's items.
#[derive(Default)]
struct JsonPaths {
    here: bool,
    fields: std::collections::HashMap<String, JsonPaths>,
    items: Option<Box<JsonPaths>>,
}

impl JsonPaths {
    /// The places of `fields` that hold JSON text, if any does.
    fn of(fields: &arrow_schema::Fields) -> Option<JsonPaths> {
        fn place(f: &arrow_schema::Field) -> Option<JsonPaths> {
            use arrow_schema::DataType;
            if crate::values::is_json(f) {
                return Some(JsonPaths {
                    here: true,
                    ..Default::default()
                });
            }
            match f.data_type() {
                DataType::Struct(fields) => JsonPaths::of(fields),
                DataType::List(item) => place(item).map(|p| JsonPaths {
                    items: Some(Box::new(p)),
                    ..Default::default()
                }),
                _ => None,
            }
        }
        let fields: std::collections::HashMap<String, JsonPaths> = fields
            .iter()
            .filter_map(|f| place(f).map(|p| (f.name().clone(), p)))
            .collect();
        (!fields.is_empty()).then(|| JsonPaths {
            fields,
            ..Default::default()
        })
    }
}

/// Nothing below: a value copied as it is.
static NO_JSON: std::sync::LazyLock<JsonPaths> = std::sync::LazyLock::new(JsonPaths::default);

/// A line rewritten for Arrow's JSON decoder: the values at `paths` (JSON text fields) as
/// JSON strings of their text, everything else as it was.
struct Rewrite<'a> {
    paths: &'a JsonPaths,
    out: &'a mut Vec<u8>,
}

impl<'de> serde::de::DeserializeSeed<'de> for Rewrite<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        use serde::de::Error as _;
        let paths = self.paths;
        if paths.here || (paths.fields.is_empty() && paths.items.is_none()) {
            let raw: &'de serde_json::value::RawValue = serde::Deserialize::deserialize(d)?;
            let text = raw.get();
            if !paths.here || text == "null" {
                self.out.extend_from_slice(text.as_bytes());
            } else {
                serde_json::to_writer(&mut *self.out, text).map_err(D::Error::custom)?;
            }
            return Ok(());
        }
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Rewrite<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }
    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<(), E> {
        self.out
            .extend_from_slice(if v { b"true".as_slice() } else { b"false" });
        Ok(())
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<(), E> {
        serde_json::to_writer(&mut *self.out, &v).map_err(E::custom)
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<(), E> {
        serde_json::to_writer(&mut *self.out, &v).map_err(E::custom)
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<(), E> {
        serde_json::to_writer(&mut *self.out, &v).map_err(E::custom)
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        serde_json::to_writer(&mut *self.out, v).map_err(E::custom)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let items = self.paths.items.as_deref().unwrap_or(&NO_JSON);
        self.out.push(b'[');
        let mut first = true;
        loop {
            let mark = self.out.len();
            if !first {
                self.out.push(b',');
            }
            let more = seq.next_element_seed(Rewrite {
                paths: items,
                out: &mut *self.out,
            })?;
            if more.is_none() {
                self.out.truncate(mark);
                break;
            }
            first = false;
        }
        self.out.push(b']');
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        use serde::de::Error as _;
        self.out.push(b'{');
        let mut first = true;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if !first {
                self.out.push(b',');
            }
            first = false;
            serde_json::to_writer(&mut *self.out, key.as_ref()).map_err(A::Error::custom)?;
            self.out.push(b':');
            let paths = self.paths.fields.get(key.as_ref()).unwrap_or(&NO_JSON);
            map.next_value_seed(Rewrite {
                paths,
                out: &mut *self.out,
            })?;
        }
        self.out.push(b'}');
        Ok(())
    }
}

/// The lines `data` (the first is line `first`), each with the values of its JSON-text
/// fields (`paths`) made JSON strings, for Arrow's JSON decoder; blank lines kept (so lines
/// keep their numbers).
fn with_json_text(data: &[u8], first: usize, paths: &JsonPaths) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(data.len() + data.len() / 4);
    for (i, text) in data.split(|&b| b == b'\n').enumerate() {
        let line = first + i;
        if i > 0 {
            out.push(b'\n');
        }
        if text.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let mut de = serde_json::Deserializer::from_slice(text);
        serde::de::DeserializeSeed::deserialize(
            Rewrite {
                paths,
                out: &mut out,
            },
            &mut de,
        )
        .and_then(|()| de.end())
        .map_err(|e| format!("line {line}: not JSON: {e}"))?;
    }
    Ok(out)
}

/// The lines `data` of `origin` (the first is line `first`) as one record batch of `schema`;
/// an error names the first line that does not decode.
fn piece(
    origin: &str,
    data: &[u8],
    first: usize,
    rows: u64,
    schema: &SchemaRef,
) -> Result<RecordBatch, Error> {
    let rewritten;
    let data = match JsonPaths::of(schema.fields()) {
        Some(paths) => {
            rewritten =
                with_json_text(data, first, &paths).map_err(|e| Error::corrupt(origin, 0, e))?;
            // Line for line (blank ones kept): errors below name the file's lines.
            rewritten.as_slice()
        }
        None => data,
    };
    let all = || -> Result<RecordBatch, arrow_schema::ArrowError> {
        let mut decoder = arrow_json::ReaderBuilder::new(schema.clone())
            .with_batch_size(rows.max(1) as usize)
            .build_decoder()?;
        let mut at = 0;
        while at < data.len() {
            let read = decoder.decode(&data[at..])?;
            if read == 0 {
                break;
            }
            at += read;
        }
        Ok(decoder
            .flush()?
            .unwrap_or_else(|| RecordBatch::new_empty(schema.clone())))
    };
    all().map_err(|e| {
        // Find the line: each decoded alone.
        let line = lines(data, first).find_map(|(line, text)| {
            let mut one = arrow_json::ReaderBuilder::new(schema.clone())
                .build_decoder()
                .ok()?;
            match one.decode(text).and_then(|_| one.flush()) {
                Ok(_) => None,
                Err(e) => Some((line, e)),
            }
        });
        let why = match line {
            Some((line, e)) => format!("line {line}: {e}"),
            None => format!("lines {first} on: {e}"),
        };
        Error::corrupt(origin, 0, why)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chute_core::{BufferPool, Column, Source, Value};

    fn src(text: &str) -> Result<ArrowSource, Error> {
        from_bytes(
            vec![("a.jsonl".into(), Bytes::from(text.to_string()))],
            ArrowOptions::default(),
        )
    }

    #[test]
    fn records_with_nested_values_missing_fields_and_nulls() {
        let s = src(concat!(
            r#"{"id": 1, "messages": [{"role": "user", "content": "hi"}], "meta": {"a": 1.5}}"#,
            "\n\n",
            r#"{"id": 2, "messages": [], "meta": {"a": 2}, "tag": "x"}"#,
            "\n",
        ))
        .unwrap();
        assert_eq!(s.manifest().total_samples(), 2);
        let pool = BufferPool::new(8);
        let cols = s.collate(&[0, 1], &pool).unwrap().unwrap();
        let names: Vec<&str> = cols.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["id", "messages", "meta.a", "tag", "tag_valid"]);
        let Column::Nested(rows) = &cols[1].1 else {
            panic!("{:?}", cols[1].1)
        };
        let m: Vec<Value> = (0..rows.len()).map(|i| rows.value(i).unwrap()).collect();
        assert_eq!(m[1], Value::List(vec![]));
        let Value::List(first) = &m[0] else { panic!() };
        assert_eq!(first[0].get("content").and_then(Value::as_str), Some("hi"));
        let meta = cols[2].1.as_tensor().unwrap();
        assert_eq!(meta.as_slice::<f64>().unwrap(), [1.5, 2.0]);
    }

    #[test]
    fn bad_lines_name_the_file_and_line() {
        let e = src("{\"a\": 1}\n{\"a\": 2}\nnot json\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("a.jsonl") && e.contains("line 3: not JSON"),
            "{e}"
        );
        let e = src("{\"a\": 1}\n[1, 2]\n").unwrap_err().to_string();
        assert!(e.contains("line 2: a JSON array, not an object"), "{e}");
    }

    /// Every value of column `c` of `s`'s rows, in order.
    fn values(s: &ArrowSource, c: &str) -> Vec<Value> {
        let pool = BufferPool::new(8);
        let ids: Vec<u64> = (0..s.manifest().total_samples()).collect();
        let cols = s.collate(&ids, &pool).unwrap().unwrap();
        let Some((_, Column::Nested(rows))) = cols.iter().find(|(n, _)| n == c) else {
            panic!("{c}: {cols:?}")
        };
        (0..rows.len()).map(|i| rows.value(i).unwrap()).collect()
    }

    #[test]
    fn mixed_values_are_json_as_datasets_reads_them() {
        // Values of conflicting types: each row's own value (datasets' `Json` feature).
        let s = src("{\"a\": 1}\n{\"a\": \"three\"}\n{\"a\": [1, {\"b\": 2}]}\n{}\n").unwrap();
        // A conflict met on an array or an object (its rest passed over), in either order.
        for text in [
            "{\"a\": 1}\n{\"a\": [1, [2]]}\n",
            "{\"a\": 1}\n{\"a\": {\"b\": [1]}}\n",
            "{\"a\": [1]}\n{\"a\": {\"b\": 2}}\n{\"a\": \"x\"}\n",
            "{\"m\": [{\"r\": 1}, 2, [3]]}\n",
        ] {
            let s = src(text).unwrap();
            let c = s.columns()[0].to_string();
            let got = values(&s, &c);
            let want: Vec<Value> = text
                .lines()
                .map(|l| {
                    let Value::Record(_, v) = Value::from_json(l.as_bytes()).unwrap() else {
                        panic!()
                    };
                    v[0].clone()
                })
                .collect();
            assert_eq!(got, want, "{text}");
        }
        let got = values(&s, "a");
        assert_eq!(got[0], Value::Int(1));
        assert_eq!(got[1].as_str(), Some("three"));
        assert_eq!(got[2], Value::from_json(br#"[1, {"b": 2}]"#).unwrap());
        assert_eq!(got[3], Value::Null);
        // Objects below the top level with other keys (a tool call on one message): each
        // keeps its own keys, in order; the same keys everywhere stay a struct.
        let text = concat!(
            r#"{"m": [{"role": "user", "content": "hi"}, {"role": "assistant", "calls": [1]}]}"#,
            "\n\n",
            r#"{"m": [{"role": "user", "content": "x"}], "s": {"k": 1}}"#,
            "\n",
        );
        let s = src(text).unwrap();
        let got = values(&s, "m");
        let Value::List(first) = &got[0] else {
            panic!("{got:?}")
        };
        assert_eq!(
            first[1],
            Value::from_json(br#"{"role": "assistant", "calls": [1]}"#).unwrap()
        );
        assert_eq!(first[0].get("content").and_then(Value::as_str), Some("hi"));
        assert!(first[1].get("content").is_none(), "{:?}", first[1]);
        let names: Vec<String> = s.columns().iter().map(|c| c.to_string()).collect();
        assert_eq!(names, ["m", "s.k"]);
    }

    #[test]
    fn arrays_gzip_and_zstd_read_as_lines() {
        let text = "{\"x\": 1}\n{\"x\": 2}\n";
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, text.as_bytes()).unwrap();
        let zst = zstd::encode_all(text.as_bytes(), 1).unwrap();
        for (name, data) in [
            ("a.jsonl.gz", gz.finish().unwrap()),
            ("a.jsonl.zst", zst),
            ("a.json", b" [{\"x\": 1}, {\"x\": 2}]".to_vec()),
            // A UTF-8 byte-order mark (Windows tools write one) is skipped, as pyarrow does.
            ("bom.jsonl", [b"\xEF\xBB\xBF", text.as_bytes()].concat()),
        ] {
            let s = from_bytes(
                vec![(name.into(), Bytes::from(data))],
                ArrowOptions::default(),
            )
            .unwrap();
            let pool = BufferPool::new(8);
            let cols = s.collate(&[0, 1], &pool).unwrap().unwrap();
            let x = cols[0].1.as_tensor().unwrap();
            assert_eq!(x.as_slice::<i64>().unwrap(), [1, 2], "{name}");
        }
        let e = from_bytes(
            vec![("b.jsonl.gz".into(), Bytes::from_static(b"\x1f\x8bjunk"))],
            ArrowOptions::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("b.jsonl.gz") && e.contains("corrupt"), "{e}");
    }

    #[test]
    fn a_line_of_many_keys_costs_its_length() {
        let mut line = String::from("{");
        for k in 0..50_000 {
            line.push_str(&format!("\"k{k}\": {k},"));
        }
        line.push_str("\"end\": 0}\n");
        // Field by field in order, this line would take minutes (a search a key).
        let (schema, seen) = infer(&[("wide.jsonl".into(), Bytes::from(line.clone()))]).unwrap();
        assert_eq!(schema.fields().len(), 50_001);
        assert_eq!(seen.rows, 1);
        // Decoded in pieces of few records, so a wide schema allocates little per piece.
        let many = line.repeat(50);
        let s = from_bytes(
            vec![("wide.jsonl".into(), Bytes::from(many))],
            ArrowOptions::default(),
        )
        .unwrap();
        assert_eq!(s.manifest().total_samples(), 50);
        let Some(chute_core::Field::Array(a)) = s.read(49).unwrap().get("k7").cloned() else {
            panic!()
        };
        assert_eq!(a.data[..], 7i64.to_le_bytes());
    }

    #[test]
    fn pieces_cut_at_line_ends_keep_line_numbers() {
        let data: String = (0..400_000).map(|i| format!("{{\"i\": {i}}}\n")).collect();
        let pieces = cut(data.as_bytes(), u64::MAX);
        assert!(pieces.len() > 1);
        assert_eq!(pieces.iter().map(|p| p.2).sum::<u64>(), 400_000);
        let few = cut(data.as_bytes(), 1000);
        assert_eq!(few.len(), 400);
        assert!(few.iter().all(|p| p.2 == 1000));
        for (r, line, _) in &pieces {
            assert!(r.start == 0 || data.as_bytes()[r.start - 1] == b'\n');
            let first: String = data[r.clone()].lines().next().unwrap().into();
            assert_eq!(first, format!("{{\"i\": {}}}", line - 1));
        }
        let s = src(&data).unwrap();
        assert_eq!(s.manifest().total_samples(), 400_000);
        let Some(chute_core::Field::Array(a)) = s.read(123_456).unwrap().get("i").cloned() else {
            panic!()
        };
        assert_eq!(a.data[..], 123_456i64.to_le_bytes());
    }
}
