//! Arrow arrays as chute samples and batch columns: the skeleton the Parquet and Arrow IPC
//! sources (and Hugging Face tables) share. [`read_files`] opens their files, [`Projected`]
//! picks and checks the columns, [`Table`] holds what a source reads (the columns' names,
//! kinds and stacks), makes its manifest, reads a row ([`Table::sample_at`]) or gathers a
//! batch ([`Table::gather`]), and words each failure one way ([`Table::null_error`]). Each
//! format supplies only what is its own: footers and pages, IPC messages, and where a row
//! lies ([`At`]). A column's [`Kind`] says what it becomes; [`field_at`] reads one row as a
//! [`Field`], [`gather`] copies a batch's rows straight from the arrays into pooled column
//! buffers (no object per row).
//!
//! | Arrow type | batch column |
//! | --- | --- |
//! | integers, floats (`float16` too), `bool` | `[B]` tensor |
//! | `fixed_size_list<number>` | `[B, k]` tensor |
//! | `list<number>`, `large_list<number>` | one tensor per row ([`Column::List`]); the loader stacks equal lengths and pads with `pad` |
//! | `binary`, `large_binary`, `binary_view` | variable-length bytes |
//! | `string`, `large_string`, `string_view` | variable-length text |
//! | `struct<bytes: binary, ...>` (Hugging Face `Image`, `Audio`) | its `bytes`, as bytes |
//! | temporal, decimal, fixed-size binary, dictionary and null columns | as [`crate::arrow_types`] brings them to these |
//! | `struct<...>` | one column per leaf, named by its path (`meta.a`): see [`Projected`] |
//! | lists of strings, bytes, bools, structs or lists; maps; unions | a [`chute_core::Value`] per row ([`Column::Values`], [`crate::values`]) |
//!
//! A column that holds nulls (as the files say when the source is opened) has its null slots
//! filled and a `<name>_valid` bool column, true where a value is present, at the end of every
//! batch ([`crate::Nulls::Mask`], the default); under [`crate::Nulls::Raise`] a null is an error
//! naming the column and the row.

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float16Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type,
    UInt16Type, UInt32Type, UInt64Type,
};
use std::sync::Arc;

use crate::Stack;
use crate::arrow_types::{self, Fill};
use crate::values::Shape;
use arrow_array::{
    Array as ArrowArray, ArrayRef, BinaryArray, FixedSizeListArray, PrimitiveArray, RecordBatch,
    StringArray, make_array,
};
use arrow_buffer::{NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field as ArrowField, Schema, SchemaRef};
use bytes::Bytes;
use chute_core::{
    Array, BufferPool, Column, ConfigError, DType, Error, Field, FieldName, Sample, Tensor,
    VarColumn,
};

/// What a column becomes in a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A numeric or bool scalar per row: `[B]`.
    Scalar(DType),
    /// A fixed-size list of numbers per row: `[B, k]`.
    List(DType, usize),
    /// A variable-length list of numbers per row: one tensor each.
    VarList(DType),
    /// Bytes per row: variable-length.
    Binary,
    /// UTF-8 per row: variable-length.
    Text,
    /// Anything else (lists of strings or structs, lists of lists, maps, unions, a struct read
    /// whole): a [`chute_core::Value`] per row ([`crate::values`]).
    Nested,
}

fn numeric(dt: &DataType) -> Option<DType> {
    Some(match dt {
        DataType::Int8 => DType::I8,
        DataType::Int16 => DType::I16,
        DataType::Int32 => DType::I32,
        DataType::Int64 => DType::I64,
        DataType::UInt8 => DType::U8,
        DataType::UInt16 => DType::U16,
        DataType::UInt32 => DType::U32,
        DataType::UInt64 => DType::U64,
        DataType::Float16 => DType::F16,
        DataType::Float32 => DType::F32,
        DataType::Float64 => DType::F64,
        _ => return None,
    })
}

/// The place of a struct's `bytes` child (Hugging Face's `Image` and `Audio` features are
/// `struct<bytes: binary, path: string>`), if it is such a struct.
fn bytes_child(dt: &DataType) -> Option<usize> {
    let DataType::Struct(fields) = dt else {
        return None;
    };
    fields.iter().position(|f| {
        f.name() == "bytes"
            && matches!(
                f.data_type(),
                DataType::Binary | DataType::LargeBinary | DataType::BinaryView
            )
    })
}

/// What `field` becomes in a batch, or an error naming it and `origin`.
pub(crate) fn kind_of(field: &ArrowField, origin: &str) -> Result<Kind, Error> {
    let dt = field.data_type();
    if crate::values::depth(dt) > crate::values::MAX_DEPTH {
        return Err(ConfigError::new(
            "columns",
            format!(
                "{origin}: column {:?} nests types more than {} deep; chute refuses it (project \
                 it away with columns=[...])",
                field.name(),
                crate::values::MAX_DEPTH
            ),
        )
        .into());
    }
    kind_of_type(dt).ok_or_else(|| unsupported(field, origin))
}

/// What a column of type `dt` becomes in a batch, if chute reads it.
pub(crate) fn kind_of_type(dt: &DataType) -> Option<Kind> {
    let dt = &arrow_types::normal_type(dt);
    if let Some(d) = numeric(dt) {
        return Some(Kind::Scalar(d));
    }
    let flat = match dt {
        DataType::Boolean => Some(Kind::Scalar(DType::Bool)),
        DataType::FixedSizeList(child, k) => {
            numeric(child.data_type()).map(|d| Kind::List(d, (*k).max(0) as usize))
        }
        DataType::List(child) | DataType::LargeList(child) => {
            numeric(child.data_type()).map(Kind::VarList)
        }
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => Some(Kind::Binary),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Some(Kind::Text),
        DataType::Struct(_) => bytes_child(dt).map(|_| Kind::Binary),
        _ => None,
    };
    flat.or_else(|| readable(dt).then_some(Kind::Nested))
}

/// The columns (of `paths` and `types`) read as dictionary codes under `dictionaries`: the
/// top-level dictionaries of strings, bytes and integers.
fn coded_columns(
    dictionaries: crate::Dictionaries,
    paths: &[Vec<String>],
    types: &[DataType],
) -> Vec<usize> {
    if dictionaries != crate::Dictionaries::Codes {
        return Vec::new();
    }
    (0..types.len())
        .filter(|&c| paths[c].is_empty() && crate::codes::coded(&types[c]))
        .collect()
}

/// Whether `dt` is, or holds, a decimal type.
fn holds_decimals(dt: &DataType) -> bool {
    match dt {
        DataType::Decimal32(..)
        | DataType::Decimal64(..)
        | DataType::Decimal128(..)
        | DataType::Decimal256(..) => true,
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::FixedSizeList(f, _)
        | DataType::Map(f, _) => holds_decimals(f.data_type()),
        DataType::Struct(fields) => fields.iter().any(|f| holds_decimals(f.data_type())),
        DataType::Union(fields, _) => fields.iter().any(|(_, f)| holds_decimals(f.data_type())),
        DataType::Dictionary(_, v) => holds_decimals(v),
        DataType::RunEndEncoded(_, v) => holds_decimals(v.data_type()),
        _ => false,
    }
}

/// Whether every type inside `dt` is one [`crate::values`] reads.
fn readable(dt: &DataType) -> bool {
    match dt {
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::FixedSizeList(f, _) => readable(f.data_type()),
        DataType::Struct(fields) => fields.iter().all(|f| readable(f.data_type())),
        DataType::Map(entries, _) => {
            matches!(entries.data_type(), DataType::Struct(kv) if kv.len() == 2)
                && readable(entries.data_type())
        }
        DataType::Union(fields, _) => fields.iter().all(|(_, f)| readable(f.data_type())),
        DataType::Dictionary(_, v) => readable(v),
        DataType::RunEndEncoded(_, v) => readable(v.data_type()),
        DataType::Null
        | DataType::Boolean
        | DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View
        | DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_)
        | DataType::Timestamp(..)
        | DataType::Date32
        | DataType::Date64
        | DataType::Time32(_)
        | DataType::Time64(_)
        | DataType::Duration(_)
        | DataType::Interval(_)
        | DataType::Decimal32(..)
        | DataType::Decimal64(..)
        | DataType::Decimal128(..)
        | DataType::Decimal256(..) => true,
        other => numeric(other).is_some(),
    }
}

/// Whether a column of type `dt` is read as nested values (and so is not normalized: its
/// values are read as they are).
pub(crate) fn nested(dt: &DataType) -> bool {
    kind_of_type(dt) == Some(Kind::Nested)
}

fn unsupported(field: &ArrowField, origin: &str) -> Error {
    ConfigError::new(
        "columns",
        format!(
            "{origin}: column {:?} has type {}, which chute does not read (project it away \
             with columns=[...] or convert it)",
            field.name(),
            field.data_type()
        ),
    )
    .into()
}

/// The whole contents of `paths` (local files memory-mapped, URLs downloaded whole), refused
/// when there are none: how a columnar source of files of `what` (`Parquet`, `Arrow IPC`)
/// begins.
pub(crate) fn read_files<P: AsRef<std::path::Path>>(
    paths: &[P],
    what: &str,
) -> Result<Vec<(String, Bytes)>, Error> {
    let contents = crate::open_whole(paths, false)?;
    given(&contents, what)?;
    Ok(contents)
}

/// Refuses an empty list of files of `what`.
pub(crate) fn given<T>(contents: &[T], what: &str) -> Result<(), Error> {
    if contents.is_empty() {
        return Err(ConfigError::new("paths", format!("no {what} files given")).into());
    }
    Ok(())
}

/// Adds one file's `holes` (per projected column: whether it holds a null) to `nulls`, what
/// the files before it hold.
pub(crate) fn add_nulls(nulls: &mut Vec<bool>, holes: impl IntoIterator<Item = bool>) {
    for (c, hole) in holes.into_iter().enumerate() {
        match nulls.get_mut(c) {
            Some(n) => *n |= hole,
            None => nulls.push(hole),
        }
    }
}

/// Which columns have their nulls filled: those that hold `nulls`, unless they raise (under
/// [`crate::Nulls::Mask`] each also gets a `<name>_valid` column: see [`Layout::valid`]).
pub(crate) fn masked(nulls: &[bool], policy: crate::Nulls) -> Vec<bool> {
    nulls
        .iter()
        .map(|&n| n && policy != crate::Nulls::Raise)
        .collect()
}

/// Where a part of a columnar source lies, for errors: the file (or the data's name), the
/// byte offset of the part in it, and what the part is (`row group 3`, `record batch 2`).
#[derive(Debug)]
pub(crate) struct At {
    pub(crate) origin: String,
    pub(crate) offset: u64,
    pub(crate) part: String,
}

/// What a columnar source reads: the projected columns' names and kinds and how they are laid
/// out in a batch (stacks).
#[derive(Debug)]
pub(crate) struct Table {
    pub(crate) names: Vec<String>,
    pub(crate) kinds: Vec<Kind>,
    /// The top-level columns the columns lie in, and the path to each ([`Projected`]'s).
    pub(crate) roots: Roots,
    pub(crate) paths: Vec<Vec<String>>,
    /// Per nested column, how its values are read.
    pub(crate) shapes: Vec<Option<Arc<Shape>>>,
    pub(crate) layout: Layout,
    /// What null slots of the masked columns (`layout.masked`) are filled with.
    pub(crate) fill: Fill,
    /// Per column, its Arrow type.
    pub(crate) types: Vec<DataType>,
    /// How decimals are read.
    pub(crate) decimals: crate::Decimals,
    /// Per column read as dictionary codes, the source's dictionary (set by the source as it
    /// opens, from every part's dictionary: see [`crate::codes`]).
    pub(crate) codes: Vec<Option<Arc<crate::codes::Codes>>>,
    /// How dictionary columns are read.
    pub(crate) dictionaries: crate::Dictionaries,
}

impl Table {
    /// The columns `projected` (of `origin`) laid out with `stack`; those `masked` get their
    /// nulls filled with `fill` and, under `nulls`' [`crate::Nulls::Mask`], a `<name>_valid`
    /// column.
    pub(crate) fn new(
        projected: Projected,
        stack: &Stack,
        origin: &str,
        masked: Vec<bool>,
        nulls: crate::Nulls,
        fill: Fill,
    ) -> Result<Table, Error> {
        let Projected {
            names,
            kinds,
            roots,
            paths,
            types,
            decimals,
            dictionaries,
            json,
            ..
        } = projected;
        let valid = nulls == crate::Nulls::Mask;
        let layout = Layout::new(&names, &kinds, stack, origin, masked, valid)?;
        let shapes = kinds
            .iter()
            .zip(&types)
            .zip(&json)
            .map(|((&k, dt), &json)| {
                (k == Kind::Nested).then(|| {
                    Arc::new(if json {
                        Shape::Json
                    } else {
                        Shape::read(dt, decimals)
                    })
                })
            })
            .collect();
        Ok(Table {
            names,
            kinds,
            roots,
            paths,
            shapes,
            layout,
            fill,
            codes: vec![None; types.len()],
            types,
            decimals,
            dictionaries,
        })
    }

    /// The columns read as dictionary codes.
    pub(crate) fn coded(&self) -> Vec<usize> {
        coded_columns(self.dictionaries, &self.paths, &self.types)
    }

    /// The source types of the columns a batch holds as numbers of another type (see
    /// [`chute_core::Source::column_types`]); a column stacked into another is left out.
    pub(crate) fn column_types(&self) -> Vec<chute_core::ColumnType> {
        let out: std::collections::HashSet<String> =
            self.layout.names(&self.names).into_iter().collect();
        self.names
            .iter()
            .zip(&self.types)
            .zip(&self.codes)
            .zip(&self.shapes)
            .filter(|(((name, _), _), _)| out.contains(*name))
            .filter_map(|(((name, dt), codes), shape)| {
                let source = match shape.as_deref() {
                    Some(Shape::Json) => "json".to_string(),
                    _ => arrow_types::describe(dt)?,
                };
                Some(match codes {
                    Some(codes) => chute_core::ColumnType {
                        name: name.clone(),
                        source: format!("{source} (codes)"),
                        numpy: None,
                        dictionary: Some(codes.values().to_vec()),
                    },
                    None => chute_core::ColumnType {
                        name: name.clone(),
                        source,
                        numpy: arrow_types::numpy_type(dt),
                        dictionary: None,
                    },
                })
            })
            .collect()
    }

    /// The distinct top-level columns the columns lie in (see [`Projected::roots`]).
    pub(crate) fn roots(&self) -> Vec<usize> {
        self.roots.list.clone()
    }

    /// Column `c` from the top-level columns of [`Table::roots`] (see [`Projected::pick`]).
    pub(crate) fn pick(&self, roots: &[ArrayRef], c: usize) -> Result<ArrayRef, String> {
        pick(&self.roots, &self.paths, roots, c)
    }

    /// The fill for column `c`'s nulls, where it is masked.
    pub(crate) fn fill_of(&self, c: usize) -> Option<Fill> {
        self.layout.masked[c].then_some(self.fill)
    }

    /// The source's manifest: `shards` of `format`, with the columns (and the stacks) as
    /// parameters, so a projection or a stack is part of the fingerprint.
    pub(crate) fn manifest(
        &self,
        format: crate::Format,
        shards: Vec<chute_core::ShardInfo>,
        stack: &Stack,
    ) -> chute_core::Manifest {
        let mut manifest = chute_core::Manifest::new(format.name(), shards)
            .with_param("columns", self.names.join(","));
        if self.decimals == crate::Decimals::Exact {
            // Exact decimals are other values than floats: part of the fingerprint.
            manifest = manifest.with_param("decimals", "exact");
        }
        if !self.coded().is_empty() {
            manifest = manifest.with_param("dictionaries", "codes");
        }
        let masked: Vec<&str> = (0..self.names.len())
            .filter(|&c| self.layout.masked[c])
            .map(|c| self.names[c].as_str())
            .collect();
        if !masked.is_empty() {
            let fill = self.fill.number.map_or("default".into(), |x| x.to_string());
            // Filled without masks, the batches have other fields: another fingerprint.
            let key = if self.layout.valid { "valid" } else { "filled" };
            manifest = manifest
                .with_param(key, masked.join(","))
                .with_param("fill_null", fill);
        }
        if !stack.is_empty() {
            manifest = manifest.with_param("stack", stack_param(stack));
        }
        manifest
    }

    /// Row `row` of `columns` as a sample with id `id`; `fail(c, why)` makes the error for
    /// a null in column `c` (`why` is `None`), or a value it cannot read (see
    /// [`Table::null_error`]).
    pub(crate) fn sample_at(
        &self,
        id: u64,
        columns: &[ArrayRef],
        row: usize,
        fail: impl Fn(usize, Option<String>) -> Error,
    ) -> Result<Sample, Error> {
        sample_at(self, id, columns, row, fail)
    }

    /// A batch's rows gathered into columns (see [`gather`]).
    pub(crate) fn gather(
        &self,
        parts: &[&[ArrayRef]],
        mirrors: Option<Mirrors<'_>>,
        rows: &[(usize, usize)],
        pool: &BufferPool,
        fail: impl Fn(usize, usize, usize, Option<String>) -> Error,
    ) -> Result<Vec<(String, Column)>, Error> {
        gather(self, parts, mirrors, rows, pool, fail)
    }

    /// The error for a null in column `c`, row `row` of the part `at` (`why` is `None`), or
    /// for a value there that cannot be read (`why` says what): the one message every
    /// columnar source gives.
    pub(crate) fn null_error(&self, at: At, row: usize, c: usize, why: Option<String>) -> Error {
        if let Some(why) = why {
            return Error::corrupt(
                at.origin,
                at.offset,
                format!(
                    "column {:?}, row {row} of {}: {why}",
                    self.names[c], at.part
                ),
            );
        }
        Error::corrupt(
            at.origin,
            at.offset,
            format!(
                "column {:?} is null in row {row} of {} (read with nulls=\"raise\", or the \
                 file's metadata said the column holds none); read it with nulls=\"mask\" \
                 (its nulls filled, with a <name>_valid column), or fill them (or filter \
                 those rows) first",
                self.names[c], at.part
            ),
        )
    }
}

/// Whether a field is a struct read as its leaves (not a Hugging Face `struct<bytes, ...>`,
/// which is read as its bytes, nor a struct whose fields' names repeat, such as unnamed
/// ones, which paths cannot tell apart: read whole, a record a row).
fn flattens(field: &ArrowField) -> bool {
    let DataType::Struct(f) = field.data_type() else {
        return false;
    };
    let mut names: Vec<&str> = f.iter().map(|c| c.name().as_str()).collect();
    names.sort_unstable();
    !f.is_empty()
        && names.windows(2).all(|w| w[0] != w[1])
        && bytes_child(field.data_type()).is_none()
}

/// A field found in a schema: its top-level column's place, the path of struct fields to it
/// from there, its name in a batch and the field.
type Found = (usize, Vec<String>, String, ArrowField);

/// Adds `field` (at `path` under top-level column `place`, named `name`) to `out`: itself,
/// or, for a struct, each of its leaves, named by their paths (`meta.a`).
fn leaves(
    place: usize,
    path: Vec<String>,
    name: String,
    field: &ArrowField,
    structs: crate::Structs,
    out: &mut Vec<Found>,
) {
    match field.data_type() {
        DataType::Struct(children) if structs == crate::Structs::Flatten && flattens(field) => {
            for child in children {
                let mut path = path.clone();
                path.push(child.name().clone());
                let name = format!("{name}.{}", child.name());
                leaves(place, path, name, child, structs, out);
            }
        }
        _ => out.push((place, path, name, field.clone())),
    }
}

/// The field of `schema` named `name`: a top-level column, or a field inside struct columns
/// named by its path (`meta.a`, `meta.b.c`); its top-level column's place and the path to it.
fn resolve(schema: &Schema, name: &str) -> Option<(usize, Vec<String>, ArrowField)> {
    fn inside(
        fields: &arrow_schema::Fields,
        name: &str,
    ) -> Option<(usize, Vec<String>, ArrowField)> {
        if let Some(i) = fields.iter().position(|f| f.name() == name) {
            return Some((i, Vec::new(), fields[i].as_ref().clone()));
        }
        fields.iter().enumerate().find_map(|(i, f)| {
            let rest = name.strip_prefix(f.name().as_str())?.strip_prefix('.')?;
            let DataType::Struct(children) = f.data_type() else {
                return None;
            };
            let (j, mut path, leaf) = inside(children, rest)?;
            path.insert(0, children[j].name().clone());
            Some((i, path, leaf))
        })
    }
    inside(schema.fields(), name)
}

/// Every column of `schema` as a batch has them (structs as their leaves, or whole).
fn all_leaves(schema: &Schema, structs: crate::Structs) -> Vec<Found> {
    let mut all = Vec::new();
    for (i, f) in schema.fields().iter().enumerate() {
        leaves(i, Vec::new(), f.name().clone(), f, structs, &mut all);
    }
    all
}

/// The columns a source reads from a file's schema: their places in it, names and kinds.
/// A struct column is read as its leaves, each a column named by its path (`meta.a`), or
/// whole under [`crate::Structs::Record`]; a leaf is selected by its path, a struct by its
/// name (all of its leaves, or the record).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Projected {
    /// Per column, the place in the schema of the top-level column it is, or lies in.
    pub(crate) places: Vec<usize>,
    /// Per column, the struct fields from its top-level column down to it (empty: the
    /// top-level column itself).
    pub(crate) paths: Vec<Vec<String>>,
    pub(crate) names: Vec<String>,
    pub(crate) kinds: Vec<Kind>,
    /// Per column, the unit its numbers count where the type has one (`timestamp[us]`,
    /// `date32`), or a nested column's type: files of one source must agree on it as on the
    /// kinds.
    pub(crate) units: Vec<Option<String>>,
    /// Per column, its Arrow type (what a nested column's values are read by).
    pub(crate) types: Vec<DataType>,
    /// The top-level columns `places` holds, and each column's place among them.
    pub(crate) roots: Roots,
    /// How decimals are read (exact ones make their columns nested).
    pub(crate) decimals: crate::Decimals,
    /// How dictionary columns are read (codes make top-level ones `int64`).
    pub(crate) dictionaries: crate::Dictionaries,
    /// Per column, whether it is JSON text (the `arrow.json` extension: its field's
    /// metadata, which its type does not carry), read as parsed values.
    pub(crate) json: Vec<bool>,
}

impl Projected {
    /// `columns` (in that order; every column when `None`) of `schema`, the schema of
    /// `origin`, its structs read as `structs` says.
    pub(crate) fn of(
        schema: &Schema,
        columns: Option<&[String]>,
        structs: crate::Structs,
        decimals: crate::Decimals,
        dictionaries: crate::Dictionaries,
        origin: &str,
    ) -> Result<Projected, Error> {
        let found = match columns {
            None => all_leaves(schema, structs),
            Some(cols) => {
                let mut found = Vec::new();
                for c in cols {
                    let Some((i, path, field)) = resolve(schema, c) else {
                        let all = all_leaves(schema, crate::Structs::Flatten);
                        let have: Vec<&str> = all.iter().map(|(.., n, _)| n.as_str()).collect();
                        return Err(ConfigError::new(
                            "columns",
                            format!("{origin} has no column {c:?}; it has {have:?}"),
                        )
                        .into());
                    };
                    leaves(i, path, c.clone(), &field, structs, &mut found);
                }
                found
            }
        };
        let mut projected = Projected {
            places: Vec::with_capacity(found.len()),
            paths: Vec::with_capacity(found.len()),
            names: Vec::with_capacity(found.len()),
            kinds: Vec::with_capacity(found.len()),
            units: Vec::with_capacity(found.len()),
            types: Vec::with_capacity(found.len()),
            roots: Roots::default(),
            decimals,
            dictionaries,
            json: Vec::with_capacity(found.len()),
        };
        for (place, path, name, field) in found {
            let mut kind = kind_of(&field.clone().with_name(name.clone()), origin)?;
            let dt = field.data_type();
            let json = crate::values::is_json(&field);
            if json || crate::values::holds_json(dt) {
                kind = Kind::Nested; // JSON text parsed, a value a row
            }
            if decimals == crate::Decimals::Exact && holds_decimals(dt) {
                kind = Kind::Nested; // a value a row: the decimals' text
            }
            if dictionaries == crate::Dictionaries::Codes
                && path.is_empty()
                && matches!(dt, DataType::Dictionary(..))
            {
                if !crate::codes::coded(dt) {
                    return Err(ConfigError::new(
                        "dictionaries",
                        format!(
                            "{origin}: column {name:?} is a {dt}: codes are made for \
                             dictionaries of strings, bytes and integers; read its values \
                             (dictionaries=\"values\") or leave it out (columns=[...])"
                        ),
                    )
                    .into());
                }
                kind = Kind::Scalar(DType::I64); // codes into the source's dictionary
            }
            projected.units.push(match kind {
                Kind::Nested if json => Some("json".to_string()),
                Kind::Nested => Some(dt.to_string()),
                _ => arrow_types::unit(dt),
            });
            projected.json.push(json);
            projected.places.push(place);
            projected.paths.push(path);
            projected.names.push(name);
            projected.kinds.push(kind);
            projected.types.push(dt.clone());
        }
        dedupe(&mut projected.names);
        projected.roots = Roots::of(&projected.places);
        Ok(projected)
    }

    /// The columns read as dictionary codes.
    pub(crate) fn coded(&self) -> Vec<usize> {
        coded_columns(self.dictionaries, &self.paths, &self.types)
    }

    /// The distinct top-level columns the columns lie in, in order of first use: what a
    /// reader of whole top-level columns projects.
    pub(crate) fn roots(&self) -> Vec<usize> {
        self.roots.list.clone()
    }

    /// Column `c` from the top-level columns `roots` (those of [`Projected::roots`], in that
    /// order): the top-level column, or the field its path names, null wherever a struct
    /// above it is.
    pub(crate) fn pick(&self, roots: &[ArrayRef], c: usize) -> Result<ArrayRef, String> {
        pick(&self.roots, &self.paths, roots, c)
    }

    /// Refuses `other` (the columns of `origin`) unless they are these (those of `first`):
    /// every file of a source has the same schema.
    pub(crate) fn check_same(
        &self,
        other: &Projected,
        first: &str,
        origin: &str,
    ) -> Result<(), Error> {
        if other.names == self.names && other.kinds == self.kinds && other.units == self.units {
            return Ok(());
        }
        let units = |p: &Projected| -> Vec<String> {
            let named = p.names.iter().zip(&p.units);
            named
                .filter_map(|(n, u)| u.as_ref().map(|u| format!("{n}: {u}")))
                .collect()
        };
        Err(ConfigError::new(
            "paths",
            format!(
                "{origin} has columns {:?} of kinds {:?} (units {:?}), but {first} has {:?} of \
                 kinds {:?} (units {:?}); every file needs the same schema",
                other.names,
                other.kinds,
                units(other),
                self.names,
                self.kinds,
                units(self)
            ),
        )
        .into())
    }
}

/// Makes `names` distinct, as a batch's fields must be: a name met again (Arrow allows two
/// columns of one name, and struct fields without names) gets `_1`, `_2`... (the first
/// number that makes it new); the first keeps its name.
fn dedupe(names: &mut [String]) {
    let mut seen: std::collections::HashSet<String> = std::collections::HashSet::new();
    for name in names.iter_mut() {
        if !seen.insert(name.clone()) {
            let mut k = 1;
            while seen.contains(&format!("{name}_{k}")) {
                k += 1;
            }
            *name = format!("{name}_{k}");
            seen.insert(name.clone());
        }
    }
}

/// The distinct top-level columns the columns lie in, in order of first use, and each
/// column's place among them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Roots {
    list: Vec<usize>,
    slot: Vec<usize>,
}

impl Roots {
    /// The roots of columns at `places` (top-level places in a schema).
    fn of(places: &[usize]) -> Roots {
        let mut at = std::collections::HashMap::new();
        let mut list = Vec::new();
        let slot = places
            .iter()
            .map(|&p| {
                *at.entry(p).or_insert_with(|| {
                    list.push(p);
                    list.len() - 1
                })
            })
            .collect();
        Roots { list, slot }
    }
}

/// Column `c` (at `paths[c]` under its root) from `roots_read`, the top-level columns of
/// `roots`' list.
fn pick(
    roots: &Roots,
    paths: &[Vec<String>],
    roots_read: &[ArrayRef],
    c: usize,
) -> Result<ArrayRef, String> {
    let col = roots_read
        .get(roots.slot[c])
        .ok_or("a top-level column is missing")?
        .clone();
    descend(col, &paths[c])
}

/// The field at `path` (names of struct fields, one a level) inside `col`, null wherever a
/// struct on the way is.
pub(crate) fn descend(mut col: ArrayRef, path: &[String]) -> Result<ArrayRef, String> {
    for name in path {
        let Some(s) = col.as_struct_opt() else {
            return Err(format!(
                "field {name:?} is read inside a {} column",
                col.data_type()
            ));
        };
        let child = s
            .column_by_name(name)
            .ok_or_else(|| format!("the struct has no field {name:?}"))?;
        col = under(s, child).map_err(|e| format!("struct field {name:?}: {e}"))?;
    }
    Ok(col)
}

/// `child`, a field of the struct `s`, null wherever `s` is.
fn under(s: &arrow_array::StructArray, child: &ArrayRef) -> Result<ArrayRef, String> {
    if s.null_count() == 0 {
        return Ok(child.clone());
    }
    let nulls = NullBuffer::union(s.nulls(), child.nulls());
    let data = child
        .to_data()
        .into_builder()
        .nulls(nulls)
        .build()
        .map_err(|e| e.to_string())?;
    Ok(make_array(data))
}

/// `col` as its kind reads it: a struct with a `bytes` child becomes that child, null where
/// the struct is null. Other columns are returned as they are. Rows whose `bytes` are null
/// but whose `path` is set (a Hugging Face `Image` or `Audio` column of files left where they
/// are) hold the path instead: the decode ops read the file a path names, when they run.
pub(crate) fn project(col: ArrayRef) -> Result<ArrayRef, String> {
    let Some(i) = bytes_child(col.data_type()) else {
        return Ok(col);
    };
    let s = col.as_struct();
    let bytes = under(s, s.column(i)).map_err(|e| format!("struct column's bytes: {e}"))?;
    let path = s
        .column_names()
        .iter()
        .position(|n| *n == "path")
        .map(|p| s.column(p))
        .filter(|p| matches!(p.data_type(), DataType::Utf8 | DataType::LargeUtf8));
    let Some(path) = path else {
        return Ok(bytes);
    };
    let by_path = |row: usize| bytes.is_null(row) && s.is_valid(row) && path.is_valid(row);
    if bytes.null_count() == 0 || !(0..bytes.len()).any(by_path) {
        return Ok(bytes);
    }
    let values = (0..bytes.len()).map(|row| {
        if by_path(row) {
            Some(bytes_at(path.as_ref(), row))
        } else if bytes.is_valid(row) {
            Some(bytes_at(bytes.as_ref(), row))
        } else {
            None
        }
    });
    Ok(Arc::new(arrow_array::LargeBinaryArray::from_iter(values)))
}

/// The little-endian bytes of a primitive array's values (no copy).
pub(crate) fn primitive_bytes(a: &dyn ArrowArray) -> Option<&[u8]> {
    fn raw<T: arrow_array::ArrowPrimitiveType>(a: &dyn ArrowArray) -> &[u8] {
        let v: &[T::Native] = a.as_primitive::<T>().values();
        // SAFETY: Arrow's native types are plain old data; the slice covers exactly the values.
        unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
    }
    Some(match a.data_type() {
        DataType::Int8 => raw::<Int8Type>(a),
        DataType::Int16 => raw::<Int16Type>(a),
        DataType::Int32 => raw::<Int32Type>(a),
        DataType::Int64 => raw::<Int64Type>(a),
        DataType::UInt8 => raw::<UInt8Type>(a),
        DataType::UInt16 => raw::<UInt16Type>(a),
        DataType::UInt32 => raw::<UInt32Type>(a),
        DataType::UInt64 => raw::<UInt64Type>(a),
        DataType::Float16 => raw::<Float16Type>(a),
        DataType::Float32 => raw::<Float32Type>(a),
        DataType::Float64 => raw::<Float64Type>(a),
        _ => return None,
    })
}

/// The bytes of row `row` of a binary or string column (any offset width, views too).
fn bytes_at(col: &dyn ArrowArray, row: usize) -> &[u8] {
    match col.data_type() {
        DataType::Binary => col.as_binary::<i32>().value(row),
        DataType::LargeBinary => col.as_binary::<i64>().value(row),
        DataType::BinaryView => col.as_binary_view().value(row),
        DataType::Utf8 => col.as_string::<i32>().value(row).as_bytes(),
        DataType::LargeUtf8 => col.as_string::<i64>().value(row).as_bytes(),
        DataType::Utf8View => col.as_string_view().value(row).as_bytes(),
        other => unreachable!("kind_of admits no {other} as bytes"),
    }
}

/// Row `row` of a binary or string column as `Bytes` that share the column's buffer (an
/// image read from Parquet or a memory-mapped Arrow file is not copied per sample); views are
/// copied.
fn shared_bytes(col: &dyn ArrowArray, row: usize) -> Bytes {
    fn slice<O: arrow_array::OffsetSizeTrait>(
        offsets: &OffsetBuffer<O>,
        values: &arrow_buffer::Buffer,
        row: usize,
    ) -> Bytes {
        let (start, end) = (offsets[row].as_usize(), offsets[row + 1].as_usize());
        Bytes::from(values.slice_with_length(start, end - start))
    }
    match col.data_type() {
        DataType::Binary => {
            let a = col.as_binary::<i32>();
            slice(a.offsets(), a.values(), row)
        }
        DataType::LargeBinary => {
            let a = col.as_binary::<i64>();
            slice(a.offsets(), a.values(), row)
        }
        DataType::Utf8 => {
            let a = col.as_string::<i32>();
            slice(a.offsets(), a.values(), row)
        }
        DataType::LargeUtf8 => {
            let a = col.as_string::<i64>();
            slice(a.offsets(), a.values(), row)
        }
        _ => Bytes::copy_from_slice(bytes_at(col, row)),
    }
}

/// The value bytes of row `row` of a list column of numbers of `d`, and its length.
fn list_at(col: &dyn ArrowArray, d: DType, row: usize) -> (&[u8], usize) {
    let (values, start, end) = match col.data_type() {
        DataType::List(_) => {
            let l = col.as_list::<i32>();
            let o = l.value_offsets();
            (l.values(), o[row] as usize, o[row + 1] as usize)
        }
        DataType::LargeList(_) => {
            let l = col.as_list::<i64>();
            let o = l.value_offsets();
            (l.values(), o[row] as usize, o[row + 1] as usize)
        }
        other => unreachable!("kind_of admits no {other} as a list"),
    };
    let raw = primitive_bytes(values.as_ref()).expect("a list of numbers");
    let s = d.size();
    (&raw[start * s..end * s], end - start)
}

/// The `[B]` values of a scalar column's row as bytes: a bool is one byte, 0 or 1.
fn scalar_at(col: &dyn ArrowArray, d: DType, row: usize, out: &mut [u8]) {
    if d == DType::Bool {
        out[0] = col.as_boolean().value(row) as u8;
    } else {
        let raw = primitive_bytes(col).expect("numeric column");
        let s = d.size();
        out.copy_from_slice(&raw[row * s..(row + 1) * s]);
    }
}

/// The bytes of a fixed-size list column's values, from its row 0.
fn fixed_list_values(col: &dyn ArrowArray, d: DType) -> &[u8] {
    let list = col.as_fixed_size_list();
    let raw = primitive_bytes(list.values().as_ref()).expect("numeric list");
    &raw[list.value_offset_at(0) * d.size()..]
}

/// Row `row` of `col` (of `kind`, not null there unless nested; read by `shape` where
/// nested) as a field.
pub(crate) fn field_at(
    col: &dyn ArrowArray,
    kind: Kind,
    shape: Option<&Shape>,
    row: usize,
) -> Result<Field, String> {
    Ok(match kind {
        Kind::Scalar(d) => {
            let mut v = vec![0u8; d.size()];
            scalar_at(col, d, row, &mut v);
            Field::Array(Array::new(d, vec![], Bytes::from(v)))
        }
        Kind::List(d, k) => {
            let s = d.size() * k;
            let raw = fixed_list_values(col, d);
            Field::Array(Array::new(
                d,
                vec![k],
                Bytes::copy_from_slice(&raw[row * s..(row + 1) * s]),
            ))
        }
        Kind::VarList(d) => {
            let (raw, n) = list_at(col, d, row);
            Field::Array(Array::new(d, vec![n], Bytes::copy_from_slice(raw)))
        }
        Kind::Binary => Field::Bytes(shared_bytes(col, row)),
        Kind::Text => Field::Text(shared_bytes(col, row)),
        Kind::Nested => Field::Value(
            shape
                .ok_or("a nested column without its shape")?
                .value(col, row)?,
        ),
    })
}

/// One field of a batch: a projected column as it is, or columns stacked into one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Out {
    /// Projected column `c`.
    Column(usize),
    /// Columns side by side in one `[B, width]` tensor of `dtype`: each member is a
    /// projected column and its values per row (1 for a scalar, `k` for a fixed-size list).
    Stacked {
        name: String,
        dtype: DType,
        members: Vec<(usize, usize)>,
        width: usize,
    },
    /// Projected column `c`'s validity: `<name>_valid`, `[B]` bool, true where a value is
    /// present.
    Valid(usize),
}

/// A batch's fields, in order: the projected columns, with a [`Stack`]'s members replaced by
/// their stacked column where the earliest of them was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) outs: Vec<Out>,
    /// Per projected column: whether its nulls are filled.
    pub(crate) masked: Vec<bool>,
    /// Whether each filled column has an [`Out::Valid`] ([`crate::Nulls::Mask`]) or not
    /// ([`crate::Nulls::Fill`]).
    pub(crate) valid: bool,
}

impl Layout {
    /// The layout of `stack` over projected columns `names` of `kinds` (read from `origin`).
    pub(crate) fn new(
        names: &[String],
        kinds: &[Kind],
        stack: &Stack,
        origin: &str,
        masked: Vec<bool>,
        valid: bool,
    ) -> Result<Layout, Error> {
        let bad = |why: String| -> Error { ConfigError::new("stack", why).into() };
        let mut group_of: Vec<Option<usize>> = vec![None; names.len()];
        let mut stacked = Vec::with_capacity(stack.len());
        for (s, (name, members)) in stack.iter().enumerate() {
            if members.is_empty() {
                return Err(bad(format!("stack {name:?} has no columns")));
            }
            let mut dtype = None;
            let mut cols = Vec::with_capacity(members.len());
            for m in members {
                let c = names.iter().position(|n| n == m).ok_or_else(|| {
                    bad(format!(
                        "stack {name:?}: {origin} has no column {m:?} among those read \
                         ({names:?})"
                    ))
                })?;
                if let Some(t) = group_of[c] {
                    return Err(bad(format!(
                        "column {m:?} is in stack {:?} and in stack {name:?}",
                        stack[t].0
                    )));
                }
                group_of[c] = Some(s);
                let (d, k) = match kinds[c] {
                    Kind::Scalar(d) if d != DType::Bool => (d, 1),
                    Kind::List(d, k) => (d, k),
                    other => {
                        return Err(bad(format!(
                            "stack {name:?}: column {m:?} is {other:?}; only numeric columns \
                             and fixed-size lists of numbers stack"
                        )));
                    }
                };
                match dtype {
                    None => dtype = Some((d, m)),
                    Some((first, f)) if first != d => {
                        return Err(bad(format!(
                            "stack {name:?}: column {f:?} is {first} but {m:?} is {d}; the \
                             columns of a stack share one dtype (cast them when writing, or \
                             stack them apart)"
                        )));
                    }
                    Some(_) => {}
                }
                cols.push((c, k));
            }
            let dtype = dtype.expect("a member").0;
            let width = cols.iter().map(|&(_, k)| k).sum();
            stacked.push(Some(Out::Stacked {
                name: name.clone(),
                dtype,
                members: cols,
                width,
            }));
        }
        let mut outs = Vec::with_capacity(names.len());
        for (c, group) in group_of.iter().enumerate() {
            match group {
                None => outs.push(Out::Column(c)),
                Some(s) => outs.extend(stacked[*s].take()),
            }
        }
        if valid {
            outs.extend((0..names.len()).filter(|&c| masked[c]).map(Out::Valid));
        }
        let layout = Layout {
            outs,
            masked,
            valid,
        };
        let mut seen = std::collections::HashSet::new();
        for name in layout.names(names) {
            if seen.contains(&name) {
                return Err(bad(format!(
                    "the batch would have two fields named {name:?}; name the stack otherwise \
                     (a column that holds nulls adds <name>_valid: rename a column that \
                     clashes, or read with nulls=\"raise\")"
                )));
            }
            seen.insert(name);
        }
        Ok(layout)
    }

    /// The batch's field names, in order.
    pub(crate) fn names(&self, names: &[String]) -> Vec<String> {
        self.outs
            .iter()
            .map(|out| match out {
                Out::Column(c) => names[*c].clone(),
                Out::Stacked { name, .. } => name.clone(),
                Out::Valid(c) => format!("{}_valid", names[*c]),
            })
            .collect()
    }
}

/// A stack as a manifest parameter (`x=f0,f1;y=a,b`).
pub(crate) fn stack_param(stack: &Stack) -> String {
    stack
        .iter()
        .map(|(name, members)| format!("{name}={}", members.join(",")))
        .collect::<Vec<_>>()
        .join(";")
}

/// Row `row` of `columns` (the columns of `table`) as a sample with id `id`; `fail` makes the
/// error for a null value in column `c`, or a value that cannot be read.
fn sample_at(
    table: &Table,
    id: u64,
    columns: &[ArrayRef],
    row: usize,
    fail: impl Fn(usize, Option<String>) -> Error,
) -> Result<Sample, Error> {
    let Table {
        names,
        kinds,
        layout,
        ..
    } = table;
    let null = |c| fail(c, None);
    let mut sample = Sample::new(id);
    for out in &layout.outs {
        match out {
            &Out::Column(c) => {
                let col = columns[c].as_ref();
                if col.is_null(row) && !layout.masked[c] {
                    return Err(null(c));
                }
                let field = field_at(col, kinds[c], table.shapes[c].as_deref(), row)
                    .map_err(|why| fail(c, Some(why)))?;
                sample
                    .fields
                    .push((FieldName::Owned(names[c].clone()), field));
            }
            &Out::Valid(c) => {
                let valid = u8::from(columns[c].is_valid(row));
                sample.fields.push((
                    FieldName::Owned(format!("{}_valid", names[c])),
                    Field::Array(Array::new(DType::Bool, vec![], Bytes::from(vec![valid]))),
                ));
            }
            Out::Stacked {
                name,
                dtype,
                members,
                width,
            } => {
                let s = dtype.size();
                let mut v = Vec::with_capacity(width * s);
                for &(c, k) in members {
                    let col = columns[c].as_ref();
                    if col.is_null(row) && !layout.masked[c] {
                        return Err(null(c));
                    }
                    v.extend_from_slice(&fixed_values(col, kinds[c])[row * k * s..][..k * s]);
                }
                sample.fields.push((
                    FieldName::Owned(name.clone()),
                    Field::Array(Array::new(*dtype, vec![*width], Bytes::from(v))),
                ));
            }
        }
    }
    Ok(sample)
}

/// A fixed-width column's values as bytes, from its row 0 (a numeric scalar or a fixed-size
/// list of numbers).
fn fixed_values(col: &dyn ArrowArray, kind: Kind) -> &[u8] {
    match kind {
        Kind::List(d, _) => fixed_list_values(col, d),
        _ => primitive_bytes(col).expect("numeric"),
    }
}

/// Row-major copies and, for each row of a batch, `(copy, row in it)`.
pub(crate) type Mirrors<'a> = (&'a [&'a RowMajor], &'a [(usize, usize)]);

/// The columnar fast path: the batch whose row `i` is row `rows[i].1` of part `rows[i].0`
/// (a row group, a record batch), where `parts[p]` holds part `p`'s columns (those of
/// `table`). `fail(part, row, column, why)` makes the error for a null value (`why` is
/// `None`) or a value that cannot be read. `mirrors`, [`RowMajor`] copies with the batch's place in them (`(copy, row)` per
/// row, as `rows`) when the caller keeps them, serve the fixed-width fields of a batch whose
/// rows are not consecutive.
fn gather(
    table: &Table,
    parts: &[&[ArrayRef]],
    mirrors: Option<Mirrors<'_>>,
    rows: &[(usize, usize)],
    pool: &BufferPool,
    fail: impl Fn(usize, usize, usize, Option<String>) -> Error,
) -> Result<Vec<(String, Column)>, Error> {
    let Table {
        names,
        kinds,
        layout,
        ..
    } = table;
    let null = |p, row, c| fail(p, row, c, None);
    let n = rows.len();
    // A batch of consecutive rows of one part (a read in file order) copies each fixed-width
    // column with one move.
    let run = match (rows.first(), rows.last()) {
        (Some(&(p, first)), Some(&(q, last)))
            if p == q
                && last >= first
                && last - first + 1 == n
                && rows.iter().enumerate().all(|(i, &r)| r == (p, first + i)) =>
        {
            Some((p, first))
        }
        _ => None,
    };
    let nulls = |c: usize| -> Result<(), Error> {
        if layout.masked[c] {
            return Ok(()); // filled when decoded; the places are its `_valid` column
        }
        for (p, part) in parts.iter().enumerate() {
            if part[c].null_count() > 0
                && let Some(&(_, row)) = rows
                    .iter()
                    .find(|&&(q, row)| q == p && part[c].is_null(row))
            {
                return Err(null(p, row, c));
            }
        }
        Ok(())
    };
    let mirrors = mirrors.filter(|(m, at)| run.is_none() && !m.is_empty() && at.len() == n);
    let mut out: Vec<Option<(String, Column)>> = Vec::with_capacity(layout.outs.len());
    // Fields gathered from the row-major copies, all in one pass over the rows below:
    // (place in `out`, name, dtype, shape, buffer, bytes a row, offset in the copy's row).
    let mut fused = Vec::new();
    for (o, field) in layout.outs.iter().enumerate() {
        if let Some((m, _)) = mirrors
            && let Some(offset) = m[0].at[o]
        {
            let (name, dtype, shape, members) = match field {
                &Out::Column(c) => match kinds[c] {
                    Kind::List(d, k) => (&names[c], d, vec![n, k], vec![c]),
                    Kind::Scalar(d) => (&names[c], d, vec![n], vec![c]),
                    _ => unreachable!("a row-major field is fixed-width"),
                },
                Out::Stacked {
                    name,
                    dtype,
                    members,
                    width,
                } => (
                    name,
                    *dtype,
                    vec![n, *width],
                    members.iter().map(|&(c, _)| c).collect(),
                ),
                Out::Valid(_) => unreachable!("a validity column is not in a row-major copy"),
            };
            for c in members {
                nulls(c)?;
            }
            let w = shape.iter().skip(1).product::<usize>() * dtype.size();
            fused.push((o, name.clone(), dtype, shape, pool.take(n * w), w, offset));
            out.push(None);
            continue;
        }
        let (name, column) = match field {
            &Out::Column(c) if kinds[c] == Kind::Nested => {
                nulls(c)?;
                let shape = table.shapes[c].clone().expect("a nested column's shape");
                // JSON text is parsed as it is handed over: text that is not JSON is found
                // here, an error naming the row, not a failure on the training thread.
                if shape.has_json() {
                    for &(p, row) in rows {
                        if let Err(why) = shape.value(parts[p][c].as_ref(), row) {
                            return Err(fail(p, row, c, Some(why)));
                        }
                    }
                }
                // The rows stay in the parts' arrays; consumers read them from there.
                let rows = crate::values::ArrowRows::new(
                    parts.iter().map(|part| part[c].clone()).collect(),
                    rows.to_vec(),
                    shape,
                );
                (names[c].clone(), Column::Nested(Arc::new(rows)))
            }
            &Out::Column(c) => {
                nulls(c)?;
                (
                    names[c].clone(),
                    column(kinds[c], c, parts, rows, run, pool),
                )
            }
            Out::Stacked {
                name,
                dtype,
                members,
                width,
            } => {
                let s = dtype.size();
                let stride = width * s;
                let mut buf = pool.take(n * stride);
                let dst = buf.as_mut_slice();
                let mut offset = 0;
                let mut fields = Vec::with_capacity(members.len());
                for &(c, k) in members {
                    nulls(c)?;
                    let w = k * s;
                    match run {
                        // Consecutive rows: interleaved below, a tile at a time.
                        Some((p, first)) => fields.push((
                            &fixed_values(parts[p][c].as_ref(), kinds[c])[first * w..][..n * w],
                            w,
                            offset,
                        )),
                        None => {
                            let raws: Vec<&[u8]> = parts
                                .iter()
                                .map(|part| fixed_values(part[c].as_ref(), kinds[c]))
                                .collect();
                            scatter(dst, stride, offset, w, &raws, rows);
                        }
                    }
                    offset += w;
                }
                if !fields.is_empty() {
                    // SAFETY: a `[u8]` seen as `[MaybeUninit<u8>]`, to which `interleave`
                    // writes only initialized bytes.
                    let dst =
                        unsafe { &mut *(dst as *mut [u8] as *mut [std::mem::MaybeUninit<u8>]) };
                    interleave(dst, stride, &fields, n);
                }
                let tensor = Tensor::new(*dtype, vec![n, *width], buf);
                (name.clone(), Column::Tensor(tensor))
            }
            &Out::Valid(c) => {
                let mut buf = pool.take(n);
                valid_bytes(parts, c, rows, run, buf.as_mut_slice());
                let tensor = Tensor::new(DType::Bool, vec![n], buf);
                (format!("{}_valid", names[c]), Column::Tensor(tensor))
            }
        };
        out.push(Some((name, column)));
    }
    if let Some((m, mrows)) = mirrors
        && !fused.is_empty()
    {
        let raws: Vec<&[u8]> = m.iter().map(|m| m.data.as_slice()).collect();
        let mut fields: Vec<(&mut [u8], usize, usize)> = fused
            .iter_mut()
            .map(|(.., buf, w, offset)| (buf.as_mut_slice(), *w, *offset))
            .collect();
        scatter_rows(&mut fields, &raws, m[0].stride, mrows);
        for (o, name, dtype, shape, buf, ..) in fused {
            out[o] = Some((name, Column::Tensor(Tensor::new(dtype, shape, buf))));
        }
    }
    Ok(out
        .into_iter()
        .map(|field| field.expect("every field gathered"))
        .collect())
}

/// Column `c`'s validity for the batch `rows` of `parts` (`run`: consecutive rows of one
/// part), a byte a row (1 where a value is present), into `out`: unpacked 8 bits at a time
/// from the null buffer for a run, read bit by bit otherwise.
fn valid_bytes(
    parts: &[&[ArrayRef]],
    c: usize,
    rows: &[(usize, usize)],
    run: Option<(usize, usize)>,
    out: &mut [u8],
) {
    // Byte `b`'s 8 bits as 8 bytes of 0 or 1, least significant bit first.
    const SPREAD: [u64; 256] = {
        let mut t = [0u64; 256];
        let mut b = 0;
        while b < 256 {
            let mut v = 0u64;
            let mut i = 0;
            while i < 8 {
                v |= (((b >> i) & 1) as u64) << (8 * i);
                i += 1;
            }
            t[b] = v;
            b += 1;
        }
        t
    };
    let n = rows.len();
    if let Some((p, first)) = run {
        let Some(nulls) = parts[p][c].nulls() else {
            out[..n].fill(1);
            return;
        };
        let bits = nulls.inner().slice(first, n);
        let chunks = bits.bit_chunks();
        let mut at = 0;
        for word in chunks
            .iter()
            .chain(std::iter::once(chunks.remainder_bits()))
        {
            for byte in word.to_le_bytes() {
                let k = (n - at).min(8);
                if k == 0 {
                    return;
                }
                out[at..at + k].copy_from_slice(&SPREAD[byte as usize].to_le_bytes()[..k]);
                at += k;
            }
        }
        return;
    }
    let nulls: Vec<Option<&NullBuffer>> = parts.iter().map(|part| part[c].nulls()).collect();
    for (dst, &(p, row)) in out.iter_mut().zip(rows) {
        *dst = nulls[p].is_none_or(|b| b.is_valid(row)).into();
    }
}

/// Copies each field `(dst, w, offset)` of the rows `rows` (`(copy, row)`) of row-major
/// copies `raws` (rows of `stride` bytes) to `dst[i * w..]` for the batch's row `i`: one pass
/// over the rows, every field of a row copied while its cache lines are in, common widths
/// with one move each.
fn scatter_rows(
    fields: &mut [(&mut [u8], usize, usize)],
    raws: &[&[u8]],
    stride: usize,
    rows: &[(usize, usize)],
) {
    for (dst, w, offset) in fields.iter() {
        assert!(dst.len() >= rows.len() * w && offset + w <= stride);
    }
    for &(p, row) in rows {
        assert!((row + 1) * stride <= raws[p].len());
    }
    for (i, &(p, row)) in rows.iter().enumerate() {
        if let Some(&(q, next)) = rows.get(i + AHEAD) {
            prefetch(raws[q], next * stride);
            prefetch(raws[q], next * stride + stride - 1);
        }
        let from = &raws[p][row * stride..(row + 1) * stride];
        for (dst, w, offset) in fields.iter_mut() {
            let (w, offset) = (*w, *offset);
            let to = &mut dst[i * w..(i + 1) * w];
            match w {
                4 => to.copy_from_slice(&from[offset..offset + 4]),
                8 => to.copy_from_slice(&from[offset..offset + 8]),
                16 => to.copy_from_slice(&from[offset..offset + 16]),
                32 => to.copy_from_slice(&from[offset..offset + 32]),
                64 => to.copy_from_slice(&from[offset..offset + 64]),
                _ => to.copy_from_slice(&from[offset..offset + w]),
            }
        }
    }
}

/// Column `c` (of `kind`) of the batch `rows` of `parts`; `run` is `(part, first row)` when
/// the rows are consecutive rows of one part.
fn column(
    kind: Kind,
    c: usize,
    parts: &[&[ArrayRef]],
    rows: &[(usize, usize)],
    run: Option<(usize, usize)>,
    pool: &BufferPool,
) -> Column {
    let n = rows.len();
    match kind {
        Kind::Scalar(DType::Bool) => {
            let mut buf = pool.take(n);
            for (dst, &(p, row)) in buf.as_mut_slice().iter_mut().zip(rows) {
                *dst = parts[p][c].as_boolean().value(row) as u8;
            }
            Column::Tensor(Tensor::new(DType::Bool, vec![n], buf))
        }
        Kind::Scalar(d) | Kind::List(d, _) => {
            let (w, shape) = match kind {
                Kind::List(_, k) => (d.size() * k, vec![n, k]),
                _ => (d.size(), vec![n]),
            };
            // Each part's values as bytes, from its row 0.
            let raws: Vec<&[u8]> = parts
                .iter()
                .map(|part| fixed_values(part[c].as_ref(), kind))
                .collect();
            let mut buf = pool.take(n * w);
            let dst = buf.as_mut_slice();
            match run {
                Some((p, first)) => dst.copy_from_slice(&raws[p][first * w..(first + n) * w]),
                None => scatter(dst, w, 0, w, &raws, rows),
            }
            Column::Tensor(Tensor::new(d, shape, buf))
        }
        Kind::VarList(d) => Column::List(
            rows.iter()
                .map(|&(p, row)| {
                    let (raw, len) = list_at(parts[p][c].as_ref(), d, row);
                    let mut buf = pool.take(raw.len());
                    buf.as_mut_slice().copy_from_slice(raw);
                    Tensor::new(d, vec![len], buf)
                })
                .collect(),
        ),
        Kind::Nested => unreachable!("gather reads nested columns itself"),
        Kind::Binary | Kind::Text => {
            let values = rows
                .iter()
                .map(|&(p, row)| bytes_at(parts[p][c].as_ref(), row));
            Column::Var(VarColumn::collect(pool, values, kind == Kind::Text))
        }
    }
}

/// Rows in random order are a cache miss each: the gathers ask for the row this many places
/// on while they copy one, so the misses overlap instead of coming one after another.
const AHEAD: usize = 16;

/// Copies the `w`-byte value of each `(part, row)` of `rows`, row `row` of the column
/// `raws[part]` (`w` bytes a row), to `dst[i * stride + offset..]` for the batch's row `i`.
/// Common widths copy with one move each instead of a `memcpy` call.
fn scatter(
    dst: &mut [u8],
    stride: usize,
    offset: usize,
    w: usize,
    raws: &[&[u8]],
    rows: &[(usize, usize)],
) {
    match w {
        1 => scatter_fixed::<1>(dst, stride, offset, raws, rows),
        2 => scatter_fixed::<2>(dst, stride, offset, raws, rows),
        4 => scatter_fixed::<4>(dst, stride, offset, raws, rows),
        8 => scatter_fixed::<8>(dst, stride, offset, raws, rows),
        16 => scatter_fixed::<16>(dst, stride, offset, raws, rows),
        32 => scatter_fixed::<32>(dst, stride, offset, raws, rows),
        64 => scatter_fixed::<64>(dst, stride, offset, raws, rows),
        _ => {
            for (i, &(p, row)) in rows.iter().enumerate() {
                let at = i * stride + offset;
                dst[at..at + w].copy_from_slice(&raws[p][row * w..(row + 1) * w]);
            }
        }
    }
}

fn scatter_fixed<const W: usize>(
    dst: &mut [u8],
    stride: usize,
    offset: usize,
    raws: &[&[u8]],
    rows: &[(usize, usize)],
) {
    let value = |raw: &[u8], row: usize| -> [u8; W] {
        raw[row * W..(row + 1) * W]
            .try_into()
            .expect("a slice of W bytes")
    };
    let slots = dst[offset..].chunks_mut(stride).map(|s| &mut s[..W]);
    let ahead = |i: usize| {
        if let Some(&(p, row)) = rows.get(i + AHEAD) {
            prefetch(raws[p], row * W);
            prefetch(raws[p], row * W + W - 1);
        }
    };
    if let [raw] = raws {
        // The common case: the whole batch from one part.
        for (i, (out, &(_, row))) in slots.zip(rows).enumerate() {
            ahead(i);
            out.copy_from_slice(&value(raw, row));
        }
    } else {
        for (i, (out, &(p, row))) in slots.zip(rows).enumerate() {
            ahead(i);
            out.copy_from_slice(&value(raws[p], row));
        }
    }
}

/// Asks the CPU to bring the cache line of `raw[at]` in (a hint: nothing when `at` is past
/// the end, or off x86-64).
#[inline(always)]
fn prefetch(raw: &[u8], at: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(byte) = raw.get(at) {
        // SAFETY: a prefetch reads nothing and writes nothing; the address lies in `raw`.
        #[allow(unused_unsafe)]
        unsafe {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(byte).cast());
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (raw, at);
}

/// True when some field of `layout` (over columns of `kinds`) is fixed-width: what a
/// [`RowMajor`] copy holds.
#[cfg(feature = "parquet")]
pub(crate) fn has_fixed(kinds: &[Kind], layout: &Layout) -> bool {
    layout.outs.iter().any(|out| match out {
        &Out::Column(c) => {
            matches!(kinds[c], Kind::List(..))
                || matches!(kinds[c], Kind::Scalar(d) if d != DType::Bool)
        }
        Out::Stacked { .. } => true,
        Out::Valid(_) => false,
    })
}

/// Interleaves `rows` rows of fields into `dst` (`rows * stride` bytes): field `(src, w,
/// offset)` holds `w` bytes per row, consecutive in `src`, and lands at `offset` in each
/// `stride`-byte row. The fields' widths must add up to `stride` (every byte of `dst` is then
/// written: it may start uninitialized). Rows go a tile at a time, a tile small enough to
/// stay in L1 while each field is spread into it.
fn interleave<'a>(
    dst: &mut [std::mem::MaybeUninit<u8>],
    stride: usize,
    fields: &[(&'a [u8], usize, usize)],
    rows: usize,
) {
    debug_assert_eq!(fields.iter().map(|&(_, w, _)| w).sum::<usize>(), stride);
    let tile = (16 << 10) / stride.max(1) + 1;
    for lo in (0..rows).step_by(tile) {
        let n = tile.min(rows - lo);
        let dst = &mut dst[lo * stride..(lo + n) * stride];
        let mut k = 0;
        while k < fields.len() {
            let (raw, w, offset) = fields[k];
            k += 1;
            // Four 4-byte fields side by side (a stack of floats): transposed four rows at
            // a time, a 16-byte store a row instead of four 4-byte ones.
            if w == 4
                && let Some(next) = fields.get(k..k + 3)
                && next
                    .iter()
                    .enumerate()
                    .all(|(j, &(_, w, at))| w == 4 && at == offset + 4 * (j + 1))
            {
                let src = |raw: &'a [u8]| &raw[lo * 4..(lo + n) * 4];
                let four = [src(raw), src(next[0].0), src(next[1].0), src(next[2].0)];
                spread4x4(dst, stride, offset, four);
                k += 3;
                continue;
            }
            let src = &raw[lo * w..(lo + n) * w];
            match w {
                1 => spread::<1>(dst, stride, offset, src),
                2 => spread::<2>(dst, stride, offset, src),
                4 => spread::<4>(dst, stride, offset, src),
                8 => spread::<8>(dst, stride, offset, src),
                16 => spread::<16>(dst, stride, offset, src),
                _ => {
                    for (d, v) in dst[offset..].chunks_mut(stride).zip(src.chunks_exact(w)) {
                        for (d, &v) in d[..w].iter_mut().zip(v) {
                            d.write(v);
                        }
                    }
                }
            }
        }
    }
}

/// Copies the consecutive 4-byte values of four fields, `srcs` (of as many values each), to
/// `dst[i * stride + offset..]`, side by side: row `i` gets the four fields' values `i`, 16
/// bytes. Four rows at a time are a 4x4 transpose in SSE registers (moves only: the bytes are
/// copied as they are, whatever they hold).
fn spread4x4(
    dst: &mut [std::mem::MaybeUninit<u8>],
    stride: usize,
    offset: usize,
    srcs: [&[u8]; 4],
) {
    let rows = srcs[0].len() / 4;
    if rows == 0 {
        return;
    }
    assert!(srcs.iter().all(|s| s.len() / 4 == rows));
    assert!(16 <= stride && offset + (rows - 1) * stride + 16 <= dst.len());
    let to = dst.as_mut_ptr().cast::<u8>();
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    while i + 4 <= rows {
        use std::arch::x86_64::{
            _mm_loadu_ps, _mm_movehl_ps, _mm_movelh_ps, _mm_storeu_ps, _mm_unpackhi_ps,
            _mm_unpacklo_ps,
        };
        // SAFETY: i + 4 <= rows, so bytes `4i..4i + 16` lie in each source and `offset + (i +
        // j) * stride .. + 16` in `dst` for j < 4 (asserted above); loads and stores are
        // unaligned ones, and sources and `dst` do not overlap.
        #[allow(unused_unsafe)]
        unsafe {
            let load = |s: &[u8]| _mm_loadu_ps(s.as_ptr().add(4 * i).cast());
            let (a, b, c, d) = (load(srcs[0]), load(srcs[1]), load(srcs[2]), load(srcs[3]));
            let (ab_lo, ab_hi) = (_mm_unpacklo_ps(a, b), _mm_unpackhi_ps(a, b));
            let (cd_lo, cd_hi) = (_mm_unpacklo_ps(c, d), _mm_unpackhi_ps(c, d));
            let at = |j: usize| to.add(offset + (i + j) * stride).cast::<f32>();
            _mm_storeu_ps(at(0), _mm_movelh_ps(ab_lo, cd_lo));
            _mm_storeu_ps(at(1), _mm_movehl_ps(cd_lo, ab_lo));
            _mm_storeu_ps(at(2), _mm_movelh_ps(ab_hi, cd_hi));
            _mm_storeu_ps(at(3), _mm_movehl_ps(cd_hi, ab_hi));
        }
        i += 4;
    }
    for (j, src) in srcs.into_iter().enumerate() {
        spread::<4>(
            &mut dst[i * stride..],
            stride,
            offset + 4 * j,
            &src[i * 4..],
        );
    }
}

/// Copies consecutive `W`-byte values of `src` to `dst[i * stride + offset..]`, value `i` to
/// row `i` (a tight loop of `W`-byte moves: the bounds are checked once, up front).
fn spread<const W: usize>(
    dst: &mut [std::mem::MaybeUninit<u8>],
    stride: usize,
    offset: usize,
    src: &[u8],
) {
    let rows = src.len() / W;
    if rows == 0 {
        return;
    }
    assert!(W <= stride && offset + (rows - 1) * stride + W <= dst.len());
    let (to, from) = (dst.as_mut_ptr().cast::<u8>(), src.as_ptr());
    for i in 0..rows {
        // SAFETY: i < rows, so `from + i * W .. + W` lies in `src` and `to + offset + i *
        // stride .. + W` in `dst` (asserted above); the two slices do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(from.add(i * W), to.add(offset + i * stride), W) }
    }
}

/// A part's fixed-width fields (numeric columns, fixed-size lists, stacks) interleaved row by
/// row, for gathers in random order: a row's values then share one or two cache lines
/// instead of taking one per column (a batch of random rows from columns that do not fit in
/// cache is a miss per column per row). Fields are in layout order, a stack's members next
/// to each other.
#[derive(Debug)]
pub(crate) struct RowMajor {
    data: Vec<u8>,
    stride: usize,
    /// Each layout field's byte offset in a row (`None`: not fixed-width, gathered from its
    /// column).
    at: Vec<Option<usize>>,
}

#[cfg(feature = "parquet")]
impl RowMajor {
    /// The row-major copy of rows `first..first + rows` of `columns` (of `kinds`, laid out
    /// by `layout`); empty rows when no field is fixed-width ([`has_fixed`]).
    pub(crate) fn new(
        kinds: &[Kind],
        layout: &Layout,
        columns: &[ArrayRef],
        first: usize,
        rows: usize,
    ) -> RowMajor {
        // (column, bytes per row) of every fixed-width column, in layout order.
        let mut cols: Vec<(usize, usize)> = Vec::new();
        let mut at = Vec::with_capacity(layout.outs.len());
        let mut stride = 0;
        for out in &layout.outs {
            let before = cols.len();
            match out {
                &Out::Column(c) => match kinds[c] {
                    Kind::Scalar(d) if d != DType::Bool => cols.push((c, d.size())),
                    Kind::List(d, k) => cols.push((c, d.size() * k)),
                    _ => {}
                },
                Out::Stacked { dtype, members, .. } => {
                    cols.extend(members.iter().map(|&(c, k)| (c, k * dtype.size())));
                }
                Out::Valid(_) => {}
            }
            if cols.len() == before {
                at.push(None);
            } else {
                at.push(Some(stride));
                stride += cols[before..].iter().map(|&(_, w)| w).sum::<usize>();
            }
        }
        // Each column's bytes for the rows and its offset in a row.
        let mut offset = 0;
        let sources: Vec<(&[u8], usize, usize)> = cols
            .iter()
            .map(|&(c, w)| {
                let raw =
                    &fixed_values(columns[c].as_ref(), kinds[c])[first * w..(first + rows) * w];
                offset += w;
                (raw, w, offset - w)
            })
            .collect();
        // Written straight into the copy's memory, once, with no zeroing pass before: the
        // fields' widths add up to the stride, so every byte of every row is written.
        let mut data: Vec<u8> = Vec::with_capacity(rows * stride);
        interleave(
            &mut data.spare_capacity_mut()[..rows * stride],
            stride,
            &sources,
            rows,
        );
        // SAFETY: `interleave` wrote all `rows * stride` bytes (see its comment).
        unsafe { data.set_len(rows * stride) };
        RowMajor { data, stride, at }
    }
}

/// A column of `len` rows whose arrays the gathers can trust, after [`project`]: its length
/// checked and, with `validate`, its offsets and values (arrays a decoder built unchecked;
/// those the IPC decoder or a C-interface producer made are valid already); brought to its
/// batch `kind` (a nested one kept as it is). `what` names the column in errors.
pub(crate) fn checked(
    col: ArrayRef,
    len: usize,
    validate: bool,
    kind: Kind,
    fill: Option<Fill>,
    codes: Option<&crate::codes::Codes>,
    what: impl Fn() -> String,
) -> Result<ArrayRef, String> {
    let mut col = project(col)?;
    if let Some(codes) = codes {
        col = codes
            .codes(col.as_ref())
            .map_err(|e| format!("{}: {e}", what()))?;
    }
    if col.len() != len {
        return Err(format!(
            "{} has {} values for {len} rows",
            what(),
            col.len()
        ));
    }
    if validate {
        col.to_data()
            .validate_full()
            .map_err(|e| format!("{} is corrupt: {e}", what()))?;
    }
    if kind == Kind::Nested || nested(col.data_type()) {
        // Read as it is, by `crate::values`: a null row is `None`, nulls inside are kept
        // (exact decimals too, which are nested values of a flat type).
        return Ok(col);
    }
    let col = arrow_types::normalize(col, fill.unwrap_or_default())
        .map_err(|e| format!("{}: {e}", what()))?;
    match fill {
        Some(fill) => arrow_types::fill(col, fill).map_err(|e| format!("{}: {e}", what())),
        None => Ok(col),
    }
}

/// Samples gathered into Arrow record batches, as writers store them: numeric scalars
/// become numeric columns, fixed-shape 1-D arrays fixed-size lists, bytes binary and text
/// string columns. The first sample gives the schema; every later one must match it.
pub(crate) struct RowBuilder {
    /// The format being written (`parquet`), for messages.
    what: &'static str,
    origin: String,
    columns: Vec<(String, Kind, Vec<u8>, Vec<i32>)>,
    rows: usize,
    schema: Option<SchemaRef>,
}

impl RowBuilder {
    /// An empty builder for a `what` file at `origin`.
    pub(crate) fn new(what: &'static str, origin: String) -> RowBuilder {
        RowBuilder {
            what,
            origin,
            columns: Vec::new(),
            rows: 0,
            schema: None,
        }
    }

    /// The schema, once the first sample has given it.
    pub(crate) fn schema(&self) -> Option<&SchemaRef> {
        self.schema.as_ref()
    }

    /// Rows gathered since the last [`RowBuilder::take_batch`].
    pub(crate) fn len(&self) -> usize {
        self.rows
    }

    /// Adds a row.
    pub(crate) fn push(&mut self, sample: &Sample) -> Result<(), Error> {
        if self.schema.is_none() {
            let mut fields = Vec::new();
            for (name, f) in &sample.fields {
                let (kind, dt) = match f {
                    Field::Array(a) if a.shape.is_empty() => (
                        Kind::Scalar(a.out_dtype()),
                        arrow_type(a.out_dtype(), self.what, &self.origin)?,
                    ),
                    Field::Array(a) if a.shape.len() == 1 => {
                        let child = arrow_type(a.out_dtype(), self.what, &self.origin)?;
                        (
                            Kind::List(a.out_dtype(), a.shape[0]),
                            DataType::FixedSizeList(
                                Arc::new(ArrowField::new("item", child, false)),
                                a.shape[0] as i32,
                            ),
                        )
                    }
                    Field::Bytes(_) => (Kind::Binary, DataType::Binary),
                    Field::Text(_) => (Kind::Text, DataType::Utf8),
                    _ => {
                        return Err(ConfigError::new(
                            self.what,
                            format!("field {name:?}: only scalars, 1-D arrays, bytes and text"),
                        )
                        .into());
                    }
                };
                fields.push(ArrowField::new(name.as_ref(), dt, false));
                self.columns
                    .push((name.to_string(), kind, Vec::new(), vec![0]));
            }
            self.schema = Some(Arc::new(Schema::new(fields)));
        }
        if sample.fields.len() != self.columns.len() {
            return Err(ConfigError::new(
                self.what,
                format!(
                    "sample {} has {} fields, the first sample {}",
                    sample.index,
                    sample.fields.len(),
                    self.columns.len()
                ),
            )
            .into());
        }
        for ((name, kind, data, offsets), (fname, f)) in self.columns.iter_mut().zip(&sample.fields)
        {
            let ok = match (f, *kind) {
                (Field::Array(a), Kind::Scalar(d)) if a.shape.is_empty() && a.out_dtype() == d => {
                    let mut v = vec![0u8; d.size()];
                    chute_core::cast_into(a.dtype, &a.data, d, &mut v);
                    data.extend_from_slice(&v);
                    true
                }
                (Field::Array(a), Kind::List(d, k)) if a.shape == [k] && a.out_dtype() == d => {
                    let mut v = vec![0u8; d.size() * k];
                    chute_core::cast_into(a.dtype, &a.data, d, &mut v);
                    data.extend_from_slice(&v);
                    true
                }
                (Field::Bytes(b), Kind::Binary) | (Field::Text(b), Kind::Text) => {
                    data.extend_from_slice(b);
                    offsets.push(data.len() as i32);
                    true
                }
                _ => false,
            };
            if !ok || name != fname {
                return Err(ConfigError::new(
                    self.what,
                    format!(
                        "sample {}: field {fname:?} differs from the first sample's {name:?}",
                        sample.index
                    ),
                )
                .into());
            }
        }
        self.rows += 1;
        Ok(())
    }

    /// The rows gathered so far as one record batch (`None` when there are none).
    pub(crate) fn take_batch(&mut self) -> Result<Option<RecordBatch>, Error> {
        if self.rows == 0 {
            return Ok(None);
        }
        let mut arrays: Vec<ArrayRef> = Vec::new();
        for (_, kind, data, offsets) in &mut self.columns {
            let raw = std::mem::take(data);
            let offs = std::mem::replace(offsets, vec![0]);
            arrays.push(match *kind {
                Kind::Scalar(d) => primitive_array(d, raw),
                Kind::List(d, k) => {
                    let child = primitive_array(d, raw);
                    let field = Arc::new(ArrowField::new("item", child.data_type().clone(), false));
                    Arc::new(FixedSizeListArray::new(field, k as i32, child, None))
                }
                Kind::Binary => Arc::new(BinaryArray::new(
                    OffsetBuffer::new(ScalarBuffer::from(offs)),
                    raw.into(),
                    None,
                )),
                Kind::VarList(_) | Kind::Nested => {
                    unreachable!("the builder makes no variable-length lists or nested values")
                }
                Kind::Text => Arc::new(
                    StringArray::try_new(
                        OffsetBuffer::new(ScalarBuffer::from(offs)),
                        raw.into(),
                        None,
                    )
                    .map_err(|e| ConfigError::new(self.what, format!("text column: {e}")))?,
                ),
            });
        }
        let schema = self.schema.clone().expect("schema set with the first row");
        let batch = RecordBatch::try_new(schema, arrays)
            .map_err(|e| Error::io(&self.origin, std::io::Error::other(e)))?;
        self.rows = 0;
        Ok(Some(batch))
    }
}

fn arrow_type(d: DType, what: &str, origin: &str) -> Result<DataType, Error> {
    Ok(match d {
        DType::I8 => DataType::Int8,
        DType::I16 => DataType::Int16,
        DType::I32 => DataType::Int32,
        DType::I64 => DataType::Int64,
        DType::U8 => DataType::UInt8,
        DType::U16 => DataType::UInt16,
        DType::U32 => DataType::UInt32,
        DType::U64 => DataType::UInt64,
        DType::F32 => DataType::Float32,
        DType::F64 => DataType::Float64,
        other => {
            return Err(ConfigError::new(
                what,
                format!("{origin}: cannot store {other} in {what}"),
            )
            .into());
        }
    })
}

fn primitive_array(d: DType, raw: Vec<u8>) -> ArrayRef {
    fn make<T: arrow_array::ArrowPrimitiveType>(raw: Vec<u8>) -> ArrayRef {
        let n = raw.len() / std::mem::size_of::<T::Native>();
        let values: Vec<T::Native> = (0..n)
            .map(|i| {
                let s = std::mem::size_of::<T::Native>();
                // SAFETY: `raw` holds n little-endian values of T::Native, a plain old data type;
                // read_unaligned copes with Vec<u8>'s alignment.
                unsafe { std::ptr::read_unaligned(raw[i * s..].as_ptr().cast::<T::Native>()) }
            })
            .collect();
        Arc::new(PrimitiveArray::<T>::new(ScalarBuffer::from(values), None))
    }
    match d {
        DType::I8 => make::<Int8Type>(raw),
        DType::I16 => make::<Int16Type>(raw),
        DType::I32 => make::<Int32Type>(raw),
        DType::I64 => make::<Int64Type>(raw),
        DType::U8 => make::<UInt8Type>(raw),
        DType::U16 => make::<UInt16Type>(raw),
        DType::U32 => make::<UInt32Type>(raw),
        DType::U64 => make::<UInt64Type>(raw),
        DType::F32 => make::<Float32Type>(raw),
        _ => make::<Float64Type>(raw),
    }
}

#[cfg(test)]
mod tests {
    use super::interleave;
    use std::mem::MaybeUninit;

    #[test]
    fn interleave_writes_every_field_of_every_row() {
        // Widths with moves of their own and one without (3), over rows spanning several
        // tiles and ending inside one (tiles of a row count that is not a multiple of 4).
        // Runs of 4-byte fields side by side: five (four transposed, one alone) and three.
        let widths = [1usize, 2, 4, 4, 4, 4, 4, 8, 16, 3, 4, 4, 4];
        let stride: usize = widths.iter().sum();
        let rows = 3 * ((16 << 10) / stride + 1) + 7;
        let cols: Vec<Vec<u8>> = widths
            .iter()
            .enumerate()
            .map(|(k, &w)| (0..rows * w).map(|b| (b * 7 + k * 31) as u8).collect())
            .collect();
        let mut offset = 0;
        let fields: Vec<(&[u8], usize, usize)> = cols
            .iter()
            .zip(widths)
            .map(|(c, w)| {
                offset += w;
                (c.as_slice(), w, offset - w)
            })
            .collect();
        let mut dst = vec![MaybeUninit::new(0xAAu8); rows * stride];
        interleave(&mut dst, stride, &fields, rows);
        // SAFETY: every byte was initialized (to 0xAA) before `interleave` wrote it.
        let dst: Vec<u8> = dst
            .into_iter()
            .map(|b| unsafe { b.assume_init() })
            .collect();
        for r in 0..rows {
            for &(c, w, o) in &fields {
                assert_eq!(
                    &dst[r * stride + o..][..w],
                    &c[r * w..][..w],
                    "row {r}, field at {o}"
                );
            }
        }
    }
}
