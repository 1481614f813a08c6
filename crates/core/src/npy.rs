//! numpy's `.npy` format: a sans-I/O header parser ([`NpyHeader::parse`], [`read_npy`]) and a
//! writer ([`write_npy`]).
//!
//! Layout (numpy's `numpy/lib/format.py`, "Format Version 1.0" and on): the magic
//! `\x93NUMPY`, a major and a minor version byte, the header length (`u16` little-endian in
//! version 1.0, `u32` in 2.0 and 3.0), then the header: a Python dict literal such as
//! `{'descr': '<u2', 'fortran_order': False, 'shape': (10,), }` padded with spaces and a final
//! `\n` so that the data starts at a multiple of 64 bytes. Version 3.0 differs from 2.0 only in
//! encoding the header as UTF-8 instead of latin-1. The data follows the header, raw.
//!
//! Decisions: big-endian arrays (`'>u2'`) are refused rather than byte-swapped, because a swap
//! is a copy and every reader here hands out views of the file; numpy converts with one call.
//! Fortran-order arrays are refused unless at most one dimension exceeds 1, where both orders
//! lay out the same bytes.

use std::fmt::Write as _;
use std::ops::Range;

use crate::{ConfigError, Corruption, DType, Error};

/// The magic string every `.npy` file starts with.
const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// numpy aligns the data to this many bytes (`ARRAY_ALIGN`).
const ARRAY_ALIGN: usize = 64;

/// Current numpy pads the header so the first axis can grow to this many digits in
/// place (`GROWTH_AXIS_MAX_DIGITS`); [`write_npy`] does the same so its headers are
/// byte-identical to numpy's.
const GROWTH_AXIS_MAX_DIGITS: usize = 21;

/// Deepest nesting of tuples, lists and dicts the header parser follows: real headers nest at
/// most two levels, and a bound keeps a hostile header from exhausting the stack.
const MAX_DEPTH: usize = 32;

/// What a `.npy` file holds: element type, shape and memory order.
///
/// Made by [`NpyHeader::parse`], which guarantees that [`NpyHeader::data_len`] does not
/// overflow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyHeader {
    version: (u8, u8),
    dtype: DType,
    shape: Vec<usize>,
    fortran_order: bool,
    data_len: usize,
}

impl NpyHeader {
    /// Parses the header at the start of `bytes`; returns it and the offset of the data.
    ///
    /// `bytes` may be the whole file or any prefix holding the whole header (the first 4 KiB
    /// hold every header numpy writes for up to 64 dimensions); the data itself is not looked
    /// at: check its length with [`NpyHeader::data_range`], or use [`read_npy`] for both.
    /// `origin` names the file in errors.
    ///
    /// Fails with [`Error::Corrupt`], naming `origin` and the byte offset, if the magic,
    /// version or header is malformed or the header is cut short; and if the array is of a
    /// type chute does not read (objects, strings, complex numbers, structured or big-endian
    /// dtypes), or is in Fortran order with more than one dimension above 1.
    pub fn parse(bytes: &[u8], origin: &str) -> Result<(NpyHeader, usize), Error> {
        let corrupt = |offset: usize, reason: String| Error::corrupt(origin, offset as u64, reason);
        let have = bytes.len().min(MAGIC.len());
        if bytes.is_empty() || bytes[..have] != MAGIC[..have] {
            return Err(corrupt(
                0,
                format!(
                    "not an .npy file: it starts with {} instead of the magic \"\\x93NUMPY\"; \
                     save arrays with np.save",
                    escape(&bytes[..have])
                ),
            ));
        }
        if bytes.len() < 10 {
            return Err(Error::truncated(
                origin,
                bytes.len() as u64,
                format!("the .npy header is cut short after {} bytes", bytes.len()),
            ));
        }
        let version = (bytes[6], bytes[7]);
        let (start, header_len): (usize, usize) = match version {
            (1, 0) => (10, usize::from(u16::from_le_bytes([bytes[8], bytes[9]]))),
            (2, 0) | (3, 0) => {
                let Some(len) = bytes.get(8..12) else {
                    return Err(Error::truncated(
                        origin,
                        bytes.len() as u64,
                        format!("the .npy header is cut short after {} bytes", bytes.len()),
                    ));
                };
                let len = u32::from_le_bytes(len.try_into().expect("4 bytes"));
                (12, usize::try_from(len).unwrap_or(usize::MAX))
            }
            (major, minor) => {
                return Err(corrupt(
                    6,
                    format!(
                        "npy format version {major}.{minor} is not supported; chute reads \
                         versions 1.0, 2.0 and 3.0 (re-save with np.save)"
                    ),
                ));
            }
        };
        let end = start.saturating_add(header_len);
        if end > bytes.len() {
            return Err(corrupt(
                bytes.len(),
                format!(
                    "the .npy header says it is {header_len} bytes long, ending at byte {end}, \
                     but only {} bytes are there; the file is truncated",
                    bytes.len()
                ),
            ));
        }
        let mut parser = Parser {
            text: &bytes[start..end],
            pos: 0,
            base: start,
            utf8: version.0 >= 3,
            origin,
        };
        let dict = parser.header()?;
        let header = interpret(dict, version, start, origin)?;
        Ok((header, end))
    }

    /// The format version, `(major, minor)`: `(1, 0)`, `(2, 0)` or `(3, 0)`.
    pub fn version(&self) -> (u8, u8) {
        self.version
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape; empty for a scalar.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Whether the header says Fortran order. [`NpyHeader::parse`] accepts it only where the
    /// bytes are the same in C order, so the data can always be read as C order.
    pub fn fortran_order(&self) -> bool {
        self.fortran_order
    }

    /// Number of elements: the product of the shape (1 for a scalar).
    pub fn numel(&self) -> usize {
        self.data_len / self.dtype.size()
    }

    /// Size of the data in bytes: `numel() * dtype().size()`.
    pub fn data_len(&self) -> usize {
        self.data_len
    }

    /// The byte range of the data in a file of `file_len` bytes whose data starts at
    /// `data_offset` (as returned by [`NpyHeader::parse`]).
    ///
    /// Fails with [`Error::Corrupt`] naming `origin` if the file is shorter (truncated) or
    /// longer (something appended) than the header says.
    pub fn data_range(
        &self,
        data_offset: usize,
        file_len: usize,
        origin: &str,
    ) -> Result<Range<usize>, Error> {
        let end = data_offset.saturating_add(self.data_len);
        if file_len < end {
            return Err(Error::truncated(
                origin,
                file_len as u64,
                format!(
                    "the array's data is cut short: shape {} of {} needs {} bytes from byte \
                     {data_offset} (to byte {end}), but the file ends at byte {file_len}; the \
                     file is truncated",
                    shape_repr(&self.shape),
                    self.dtype,
                    self.data_len
                ),
            ));
        }
        if file_len > end {
            return Err(Error::corrupt(
                origin,
                end as u64,
                format!(
                    "{} bytes follow the array's data, which ends at byte {end} (shape {} of \
                     {}); this is not a single .npy array (an .npz archive, or data appended \
                     to the file?)",
                    file_len - end,
                    shape_repr(&self.shape),
                    self.dtype
                ),
            ));
        }
        Ok(data_offset..end)
    }
}

/// Parses a whole `.npy` file held in `bytes`: its header and exactly its data.
///
/// The data is little-endian and, thanks to [`NpyHeader::parse`]'s checks, in C order. Errors
/// as in [`NpyHeader::parse`] and [`NpyHeader::data_range`].
pub fn read_npy<'a>(bytes: &'a [u8], origin: &str) -> Result<(NpyHeader, &'a [u8]), Error> {
    let (header, offset) = NpyHeader::parse(bytes, origin)?;
    let range = header.data_range(offset, bytes.len(), origin)?;
    Ok((header, &bytes[range]))
}

/// numpy's `descr` for `dtype`: `'<u2'`, `'|b1'`, ...; `None` for bfloat16, which numpy does
/// not have.
pub fn npy_descr(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::Bool => "|b1",
        DType::U8 => "|u1",
        DType::I8 => "|i1",
        DType::U16 => "<u2",
        DType::I16 => "<i2",
        DType::U32 => "<u4",
        DType::I32 => "<i4",
        DType::U64 => "<u8",
        DType::I64 => "<i8",
        DType::F16 => "<f2",
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        _ => return None,
    })
}

/// A C-order `.npy` file holding `data`, little-endian elements of `dtype` with `shape`.
///
/// The header is byte for byte the one numpy writes (checked against numpy 2.4): format version 1.0 (2.0 if the header
/// would not fit, which takes thousands of dimensions), keys sorted, room for the first axis
/// to grow, padded with spaces and a `\n` so the data starts at a multiple of 64 bytes.
///
/// Fails with a [`ConfigError`] if `dtype` has no numpy equivalent (bfloat16) or `data` is not
/// `product(shape) * dtype.size()` bytes long.
pub fn write_npy(dtype: DType, shape: &[usize], data: &[u8]) -> Result<Vec<u8>, ConfigError> {
    let descr = npy_descr(dtype).ok_or_else(|| {
        ConfigError::new(
            "dtype",
            format!("{dtype} has no .npy equivalent (numpy has no {dtype}); cast to float32"),
        )
    })?;
    let want = shape
        .iter()
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d));
    if want != Some(data.len()) {
        return Err(ConfigError::new(
            "data",
            format!(
                "{} bytes given for shape {} of {dtype}, which needs {}",
                data.len(),
                shape_repr(shape),
                want.map_or_else(|| "more than fits in memory".to_owned(), |n| n.to_string())
            ),
        ));
    }
    // Exactly numpy's `_write_array_header` and `_wrap_header`.
    let shape_text = shape_repr(shape);
    let mut dict =
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_text}, }}");
    if let Some(first) = shape.first() {
        let digits = first.to_string().len();
        dict.extend(std::iter::repeat_n(
            ' ',
            GROWTH_AXIS_MAX_DIGITS.saturating_sub(digits),
        ));
    }
    let hlen = dict.len() + 1; // + '\n'
    let wrap = |prefix: usize| {
        let pad = ARRAY_ALIGN - (MAGIC.len() + 2 + prefix + hlen) % ARRAY_ALIGN;
        (pad, hlen + pad)
    };
    let (pad, total, version) = match wrap(2) {
        (pad, total) if total <= usize::from(u16::MAX) => (pad, total, 1u8),
        _ => {
            let (pad, total) = wrap(4);
            (pad, total, 2u8)
        }
    };
    let mut out = Vec::with_capacity(12 + total + data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[version, 0]);
    if version == 1 {
        out.extend_from_slice(&(total as u16).to_le_bytes());
    } else {
        let total = u32::try_from(total).map_err(|_| {
            ConfigError::new(
                "shape",
                format!("{} dimensions make an .npy header too large", shape.len()),
            )
        })?;
        out.extend_from_slice(&total.to_le_bytes());
    }
    out.extend_from_slice(dict.as_bytes());
    out.extend(std::iter::repeat_n(b' ', pad));
    out.push(b'\n');
    out.extend_from_slice(data);
    Ok(out)
}

/// Python's `repr` of a shape tuple: `()`, `(10,)`, `(2, 3)`.
fn shape_repr(shape: &[usize]) -> String {
    match shape {
        [] => "()".to_owned(),
        [n] => format!("({n},)"),
        _ => {
            let mut s = String::from("(");
            for (i, d) in shape.iter().enumerate() {
                if i > 0 {
                    s.push_str(", ");
                }
                let _ = write!(s, "{d}");
            }
            s.push(')');
            s
        }
    }
}

/// Bytes as a readable string literal for error messages.
fn escape(bytes: &[u8]) -> String {
    format!("\"{}\"", bytes.escape_ascii())
}

/// A value of the Python literal subset numpy writes in headers.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Str(String),
    Int(i64),
    Bool(bool),
    None,
    Tuple(Vec<(usize, Value)>),
    List(Vec<(usize, Value)>),
    Dict(Vec<(usize, String, usize, Value)>),
}

impl Value {
    fn kind(&self) -> &'static str {
        match self {
            Value::Str(_) => "a string",
            Value::Int(_) => "an integer",
            Value::Bool(_) => "a bool",
            Value::None => "None",
            Value::Tuple(_) => "a tuple",
            Value::List(_) => "a list",
            Value::Dict(_) => "a dict",
        }
    }
}

/// A recursive-descent parser for the header's Python literal; positions are file offsets.
struct Parser<'a> {
    text: &'a [u8],
    pos: usize,
    /// File offset of `text[0]`.
    base: usize,
    /// Version 3.0 headers are UTF-8; older ones latin-1.
    utf8: bool,
    origin: &'a str,
}

impl Parser<'_> {
    fn error(&self, at: usize, reason: impl Into<String>) -> Error {
        Error::corrupt(self.origin, (self.base + at) as u64, reason)
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r' | b'\x0c') = self.text.get(self.pos) {
            self.pos += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.pos).copied()
    }

    /// The whole header: one dict, then only padding.
    fn header(&mut self) -> Result<(usize, Value), Error> {
        self.skip_ws();
        if self.peek() != Some(b'{') {
            return Err(self.error(
                self.pos,
                format!(
                    "the .npy header is not a Python dict: it starts with {}",
                    self.snippet(self.pos)
                ),
            ));
        }
        let dict = self.value(0)?;
        self.skip_ws();
        if self.pos != self.text.len() {
            return Err(self.error(
                self.pos,
                format!(
                    "unexpected {} after the .npy header's dict",
                    self.snippet(self.pos)
                ),
            ));
        }
        Ok(dict)
    }

    /// Up to 20 bytes from `at`, for messages.
    fn snippet(&self, at: usize) -> String {
        let end = (at + 20).min(self.text.len());
        if at >= end {
            "the end of the header".to_owned()
        } else {
            escape(&self.text[at..end])
        }
    }

    fn value(&mut self, depth: usize) -> Result<(usize, Value), Error> {
        self.skip_ws();
        let at = self.pos;
        if depth > MAX_DEPTH {
            return Err(self.error(
                at,
                format!("the .npy header nests deeper than {MAX_DEPTH} levels"),
            ));
        }
        let value = match self.peek() {
            Some(q @ (b'\'' | b'"')) => Value::Str(self.string(q)?),
            Some(b'(') => Value::Tuple(self.items(b')', depth)?),
            Some(b'[') => Value::List(self.items(b']', depth)?),
            Some(b'{') => self.dict(depth)?,
            Some(b'-' | b'0'..=b'9') => Value::Int(self.int()?),
            Some(b'A'..=b'Z' | b'a'..=b'z') => {
                let start = self.pos;
                while let Some(b'A'..=b'Z' | b'a'..=b'z' | b'_' | b'0'..=b'9') = self.peek() {
                    self.pos += 1;
                }
                match &self.text[start..self.pos] {
                    b"True" => Value::Bool(true),
                    b"False" => Value::Bool(false),
                    b"None" => Value::None,
                    word => {
                        return Err(self.error(
                            start,
                            format!(
                                "unexpected name {} in the .npy header; expected a literal",
                                escape(word)
                            ),
                        ));
                    }
                }
            }
            _ => {
                return Err(self.error(
                    at,
                    format!(
                        "unexpected {} in the .npy header; expected a value",
                        self.snippet(at)
                    ),
                ));
            }
        };
        Ok((at, value))
    }

    fn string(&mut self, quote: u8) -> Result<String, Error> {
        let start = self.pos;
        self.pos += 1;
        let mut raw = Vec::new();
        loop {
            match self.peek() {
                None => {
                    return Err(self.error(start, "unterminated string in the .npy header"));
                }
                Some(b) if b == quote => {
                    self.pos += 1;
                    break;
                }
                Some(b'\\') => {
                    // Escapes only occur in field names of structured dtypes, which are
                    // refused anyway; keeping the escaped byte is enough to get there.
                    self.pos += 1;
                    if let Some(b) = self.peek() {
                        raw.push(b);
                        self.pos += 1;
                    }
                }
                Some(b) => {
                    raw.push(b);
                    self.pos += 1;
                }
            }
        }
        if self.utf8 {
            String::from_utf8(raw)
                .map_err(|_| self.error(start, "a string in the .npy 3.0 header is not UTF-8"))
        } else {
            Ok(raw.into_iter().map(char::from).collect())
        }
    }

    fn int(&mut self) -> Result<i64, Error> {
        let start = self.pos;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        let digits = self.pos;
        let mut v: i64 = 0;
        while let Some(b @ b'0'..=b'9') = self.peek() {
            v = v
                .checked_mul(10)
                .and_then(|v| v.checked_add(i64::from(b - b'0')))
                .ok_or_else(|| self.error(start, "an integer in the .npy header is too large"))?;
            self.pos += 1;
        }
        if self.pos == digits {
            return Err(self.error(start, "a '-' in the .npy header is not followed by digits"));
        }
        // Python 2's long suffix, still found in old files (numpy's reader accepts it too).
        if let Some(b'L' | b'l') = self.peek() {
            self.pos += 1;
        }
        Ok(if negative { -v } else { v })
    }

    /// Comma-separated values up to `close`, with an optional trailing comma.
    fn items(&mut self, close: u8, depth: usize) -> Result<Vec<(usize, Value)>, Error> {
        self.pos += 1;
        let mut items = Vec::new();
        loop {
            self.skip_ws();
            if self.peek() == Some(close) {
                self.pos += 1;
                return Ok(items);
            }
            items.push(self.value(depth + 1)?);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b) if b == close => {}
                _ => {
                    return Err(self.error(
                        self.pos,
                        format!(
                            "expected ',' or '{}' in the .npy header, found {}",
                            char::from(close),
                            self.snippet(self.pos)
                        ),
                    ));
                }
            }
        }
    }

    fn dict(&mut self, depth: usize) -> Result<Value, Error> {
        self.pos += 1;
        let mut entries = Vec::new();
        loop {
            self.skip_ws();
            match self.peek() {
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Value::Dict(entries));
                }
                Some(q @ (b'\'' | b'"')) => {
                    let key_at = self.pos;
                    let key = self.string(q)?;
                    self.skip_ws();
                    if self.peek() != Some(b':') {
                        return Err(self.error(
                            self.pos,
                            format!(
                                "expected ':' after the key {key:?} in the .npy header, found {}",
                                self.snippet(self.pos)
                            ),
                        ));
                    }
                    self.pos += 1;
                    let (at, value) = self.value(depth + 1)?;
                    entries.push((key_at, key, at, value));
                }
                _ => {
                    return Err(self.error(
                        self.pos,
                        format!(
                            "expected a string key or '}}' in the .npy header, found {}",
                            self.snippet(self.pos)
                        ),
                    ));
                }
            }
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {}
                _ => {
                    return Err(self.error(
                        self.pos,
                        format!(
                            "expected ',' or '}}' in the .npy header, found {}",
                            self.snippet(self.pos)
                        ),
                    ));
                }
            }
        }
    }
}

/// Checks the header dict's keys and values and turns them into an [`NpyHeader`]. `base` is
/// the file offset of the header text; value positions are relative to it.
fn interpret(
    (_, dict): (usize, Value),
    version: (u8, u8),
    base: usize,
    origin: &str,
) -> Result<NpyHeader, Error> {
    let corrupt = |at: usize, reason: String| Error::corrupt(origin, (base + at) as u64, reason);
    let Value::Dict(entries) = dict else {
        unreachable!("Parser::header only returns dicts")
    };
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    for (key_at, key, at, value) in entries {
        let slot = match key.as_str() {
            "descr" => &mut descr,
            "fortran_order" => &mut fortran,
            "shape" => &mut shape,
            _ => {
                return Err(corrupt(
                    key_at,
                    format!(
                        "the .npy header has an unexpected key {key:?}; numpy writes exactly \
                         'descr', 'fortran_order' and 'shape'"
                    ),
                ));
            }
        };
        if slot.is_some() {
            return Err(corrupt(
                key_at,
                format!("the .npy header has the key {key:?} twice"),
            ));
        }
        *slot = Some((at, value));
    }
    let missing = |key: &str| {
        corrupt(
            0,
            format!("the .npy header has no {key:?} key; numpy always writes one"),
        )
    };

    let (at, descr) = descr.ok_or_else(|| missing("descr"))?;
    let dtype = match descr {
        Value::Str(s) => dtype_from_descr(&s).map_err(|reason| {
            Error::corrupt_as(Corruption::Unsupported, origin, (base + at) as u64, reason)
        })?,
        Value::List(_) => {
            return Err(corrupt(
                at,
                "the array has a structured dtype (a list of named fields); chute reads plain \
                 bool, integer and float arrays: save each field as its own array"
                    .to_owned(),
            ));
        }
        other => {
            return Err(corrupt(
                at,
                format!(
                    "the .npy header's 'descr' is {}, expected a dtype string such as '<u2'",
                    other.kind()
                ),
            ));
        }
    };

    let (at, fortran) = fortran.ok_or_else(|| missing("fortran_order"))?;
    let Value::Bool(fortran_order) = fortran else {
        return Err(corrupt(
            at,
            format!(
                "the .npy header's 'fortran_order' is {}, expected True or False",
                fortran.kind()
            ),
        ));
    };

    let (at, shape) = shape.ok_or_else(|| missing("shape"))?;
    let dims = match shape {
        Value::Tuple(dims) | Value::List(dims) => dims,
        other => {
            return Err(corrupt(
                at,
                format!(
                    "the .npy header's 'shape' is {}, expected a tuple of sizes such as (10,)",
                    other.kind()
                ),
            ));
        }
    };
    let mut shape = Vec::with_capacity(dims.len());
    for (dim_at, dim) in dims {
        match dim {
            Value::Int(n) if n >= 0 => shape.push(usize::try_from(n).map_err(|_| {
                corrupt(
                    dim_at,
                    format!("dimension {n} is larger than this platform can address"),
                )
            })?),
            Value::Int(n) => {
                return Err(corrupt(
                    dim_at,
                    format!("the .npy header's shape has a negative dimension {n}"),
                ));
            }
            other => {
                return Err(corrupt(
                    dim_at,
                    format!(
                        "the .npy header's shape holds {}, expected integer sizes",
                        other.kind()
                    ),
                ));
            }
        }
    }
    let data_len = shape
        .iter()
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            corrupt(
                at,
                format!(
                    "shape {} of {dtype} holds more bytes than this platform can address",
                    shape_repr(&shape)
                ),
            )
        })?;
    if fortran_order && shape.iter().filter(|&&d| d > 1).count() > 1 {
        return Err(Error::corrupt_as(
            Corruption::Unsupported,
            origin,
            (base + at) as u64,
            format!(
                "the array of shape {} is in Fortran order; chute reads C order: save it with \
                 np.save(path, np.ascontiguousarray(arr))",
                shape_repr(&shape)
            ),
        ));
    }
    Ok(NpyHeader {
        version,
        dtype,
        shape,
        fortran_order,
        data_len,
    })
}

/// The [`DType`] of a numpy dtype string (a `.npy` header's `descr`, an array's
/// `dtype.str` or `__array_interface__["typestr"]`: `<f4`, `|u1`, `|b1`), or why it is
/// refused (big-endian data, strings, objects, complex numbers, ...).
pub fn dtype_from_descr(descr: &str) -> Result<DType, String> {
    let (order, code) = match descr.as_bytes().first() {
        Some(b'<' | b'>' | b'|' | b'=') => descr.split_at(1),
        _ => ("=", descr),
    };
    let dtype = match code {
        "b1" | "?" => DType::Bool,
        "u1" => DType::U8,
        "i1" => DType::I8,
        "u2" => DType::U16,
        "i2" => DType::I16,
        "u4" => DType::U32,
        "i4" => DType::I32,
        "u8" => DType::U64,
        "i8" => DType::I64,
        "f2" => DType::F16,
        "f4" => DType::F32,
        "f8" => DType::F64,
        _ => {
            let what = match code.as_bytes().first() {
                Some(b'O') => " (Python objects)",
                Some(b'U') => " (unicode strings)",
                Some(b'S' | b'a') => " (byte strings)",
                Some(b'c') => " (complex numbers)",
                Some(b'M' | b'm') => " (dates or time deltas)",
                Some(b'V') => " (raw or structured records)",
                Some(b'f') => " (extended-precision floats)",
                _ => "",
            };
            return Err(format!(
                "the array's dtype {descr:?}{what} is not supported; chute reads bool, \
                 integer and float arrays ('|b1', '|u1', '|i1', '<u2', '<i2', '<u4', '<i4', \
                 '<u8', '<i8', '<f2', '<f4', '<f8')"
            ));
        }
    };
    let big_endian = order == ">" || (order == "=" && cfg!(target_endian = "big"));
    if big_endian && dtype.size() > 1 {
        return Err(format!(
            "the array's dtype {descr:?} is big-endian; chute reads little-endian arrays: \
             save it with np.save(path, arr.astype(arr.dtype.newbyteorder('<')))"
        ));
    }
    Ok(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file with a hand-written header of the given version, padded as numpy pads.
    fn with_header(version: u8, dict: &str, data: &[u8]) -> Vec<u8> {
        let prefix = if version == 1 { 10 } else { 12 };
        let mut header = dict.to_owned();
        while !(prefix + header.len() + 1).is_multiple_of(64) {
            header.push(' ');
        }
        header.push('\n');
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&[version, 0]);
        if version == 1 {
            out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        } else {
            out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        }
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    use crate::testing::corrupt as corrupt_parts;

    #[test]
    fn reads_the_header_numpy_writes_for_arange_10_uint16() {
        // np.save(f, np.arange(10, dtype=np.uint16)), as numpy 2.4 writes it: a 118-byte header
        // ('v' = 0x76) of the sorted dict, 19 growth spaces, padding and '\n': data at 128.
        let mut file = b"\x93NUMPY\x01\x00\x76\x00".to_vec();
        file.extend_from_slice(b"{'descr': '<u2', 'fortran_order': False, 'shape': (10,), }");
        file.extend_from_slice(&[b' '; 59]);
        file.push(b'\n');
        assert_eq!(file.len(), 128);
        let data: Vec<u8> = (0u16..10).flat_map(u16::to_le_bytes).collect();
        file.extend_from_slice(&data);

        let (h, offset) = NpyHeader::parse(&file, "a.npy").unwrap();
        assert_eq!(offset, 128);
        assert_eq!(h.version(), (1, 0));
        assert_eq!(h.dtype(), DType::U16);
        assert_eq!(h.shape(), [10]);
        assert!(!h.fortran_order());
        assert_eq!((h.numel(), h.data_len()), (10, 20));
        assert_eq!(read_npy(&file, "a.npy").unwrap().1, &data[..]);

        // ... and write_npy writes the same bytes.
        assert_eq!(write_npy(DType::U16, &[10], &data).unwrap(), file);
    }

    #[test]
    fn reads_versions_2_and_3() {
        let data: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        for version in [2, 3] {
            let file = with_header(
                version,
                "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2), }",
                &data,
            );
            let (h, got) = read_npy(&file, "v.npy").unwrap();
            assert_eq!(h.version(), (version, 0));
            assert_eq!(h.dtype(), DType::F32);
            assert_eq!(h.shape(), [1, 2]);
            assert_eq!(got, &data[..]);
        }
        // Version 3.0 headers are UTF-8; a non-ASCII string parses (and is refused as a
        // dtype, naming it).
        let file = with_header(
            3,
            "{'descr': '<é', 'fortran_order': False, 'shape': (), }",
            &[],
        );
        let (_, _, reason) = corrupt_parts(NpyHeader::parse(&file, "v3.npy").unwrap_err());
        assert!(reason.contains("\"<é\""), "{reason}");
    }

    #[test]
    fn reads_scalars_and_every_descr() {
        let cases = [
            ("|b1", DType::Bool),
            ("|u1", DType::U8),
            ("|i1", DType::I8),
            ("<u2", DType::U16),
            ("<i2", DType::I16),
            ("<u4", DType::U32),
            ("=i4", DType::I32),
            ("<u8", DType::U64),
            ("<i8", DType::I64),
            ("<f2", DType::F16),
            ("<f4", DType::F32),
            ("<f8", DType::F64),
            (">u1", DType::U8),
        ];
        for (descr, dtype) in cases {
            let data = vec![7u8; dtype.size()];
            let file = with_header(
                1,
                &format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': (), }}"),
                &data,
            );
            let (h, got) = read_npy(&file, "s.npy").unwrap();
            assert_eq!((h.dtype(), h.shape(), h.numel()), (dtype, &[][..], 1));
            assert_eq!(got, &data[..]);
        }
    }

    #[test]
    fn round_trips_through_write_npy() {
        for (shape, n) in [
            (vec![], 1),
            (vec![3], 3),
            (vec![2, 0, 4], 0),
            (vec![2, 3], 6),
        ] {
            let data: Vec<u8> = (0..n as i64).flat_map(i64::to_le_bytes).collect();
            let file = write_npy(DType::I64, &shape, &data).unwrap();
            let (h, offset) = NpyHeader::parse(&file, "w.npy").unwrap();
            assert_eq!(offset % 64, 0);
            assert_eq!(file[offset - 1], b'\n');
            assert_eq!(h.shape(), &shape[..]);
            assert_eq!(read_npy(&file, "w.npy").unwrap().1, &data[..]);
        }
        assert!(write_npy(DType::BF16, &[1], &[0, 0]).is_err());
        let e = write_npy(DType::U16, &[3], &[0; 4]).unwrap_err();
        assert_eq!(e.option, "data");
        assert!(e.reason.contains("needs 6"), "{}", e.reason);
    }

    #[test]
    fn accepts_python_literal_variants() {
        let file = with_header(
            1,
            "{\"shape\":(3L,),\"fortran_order\":True,\"descr\":\"<i2\"}",
            &[0; 6],
        );
        let (h, _) = read_npy(&file, "l.npy").unwrap();
        assert_eq!(
            (h.dtype(), h.shape(), h.fortran_order()),
            (DType::I16, &[3][..], true)
        );
        // Fortran order where it does not matter: one dimension above 1.
        let file = with_header(
            1,
            "{'descr': '<i2', 'fortran_order': True, 'shape': (1, 3, 1), }",
            &[0; 6],
        );
        assert!(read_npy(&file, "l.npy").is_ok());
    }

    #[test]
    fn refuses_what_chute_cannot_read() {
        let header = |descr: &str, fortran: &str, shape: &str| {
            with_header(
                1,
                &format!("{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, }}"),
                &[],
            )
        };
        let reason = |file: Vec<u8>| corrupt_parts(NpyHeader::parse(&file, "x.npy").unwrap_err()).2;

        let r = reason(header("'>u2'", "False", "(0,)"));
        assert!(
            r.contains("big-endian") && r.contains("newbyteorder"),
            "{r}"
        );
        let r = reason(header("'|O'", "False", "(0,)"));
        assert!(r.contains("\"|O\"") && r.contains("Python objects"), "{r}");
        let r = reason(header("'<U5'", "False", "(0,)"));
        assert!(r.contains("unicode strings"), "{r}");
        let r = reason(header("'<c8'", "False", "(0,)"));
        assert!(r.contains("complex"), "{r}");
        let r = reason(header("[('a', '<i4'), ('b', '<f4')]", "False", "(0,)"));
        assert!(r.contains("structured"), "{r}");
        let r = reason(header("'<i4'", "True", "(2, 3)"));
        assert!(r.contains("np.ascontiguousarray"), "{r}");
        let r = reason(header("'<i4'", "False", "(-1,)"));
        assert!(r.contains("negative dimension -1"), "{r}");
        let r = reason(header("'<i4'", "0", "(1,)"));
        assert!(r.contains("'fortran_order' is an integer"), "{r}");
        let r = reason(header("'<i8'", "False", "(4294967296, 4294967296)"));
        assert!(r.contains("more bytes than"), "{r}");
        let r = reason(with_header(1, "{'descr': '<i4', 'shape': (1,)}", &[]));
        assert!(r.contains("no \"fortran_order\" key"), "{r}");
        let r = reason(with_header(
            1,
            "{'descr': '<i4', 'fortran_order': False, 'shape': (1,), 'x': 1}",
            &[],
        ));
        assert!(r.contains("unexpected key \"x\""), "{r}");
        let r = reason(with_header(1, "{'descr': '<i4', 'descr': '<i4'}", &[]));
        assert!(r.contains("twice"), "{r}");
        let r = reason(with_header(1, &"[".repeat(100), &[]));
        assert!(r.contains("not a Python dict"), "{r}");
        let r = reason(with_header(1, &format!("{{'a': {}", "(".repeat(100)), &[]));
        assert!(r.contains("deeper than"), "{r}");
        let r = reason(with_header(1, "{'descr': '<i4' 'shape'}", &[]));
        assert!(r.contains("expected ',' or '}'"), "{r}");
        let r = reason(with_header(1, "{'descr': '<i4'} x", &[]));
        assert!(r.contains("after the .npy header's dict"), "{r}");
    }

    #[test]
    fn malformed_files_name_the_offset() {
        let (uri, offset, r) =
            corrupt_parts(NpyHeader::parse(b"PK\x03\x04zip", "a.npz").unwrap_err());
        assert_eq!((uri.as_str(), offset), ("a.npz", 0));
        assert!(r.contains("not an .npy file") && r.contains("PK"), "{r}");
        assert!(NpyHeader::parse(b"", "e.npy").is_err());

        let e = NpyHeader::parse(b"\x93NUMPY\x01", "t.npy").unwrap_err();
        assert_eq!(e.corruption(), Some(crate::Corruption::Truncated));
        assert!(e.to_string().contains("truncated: the .npy header"), "{e}");
        let (_, offset, r) = corrupt_parts(e);
        assert_eq!(offset, 7);
        assert!(r.contains("cut short"), "{r}");

        let (_, offset, r) =
            corrupt_parts(NpyHeader::parse(b"\x93NUMPY\x04\x00\x10\x00", "v.npy").unwrap_err());
        assert_eq!(offset, 6);
        assert!(r.contains("version 4.0"), "{r}");

        let full = write_npy(DType::U32, &[4], &[1; 16]).unwrap();
        let (_, offset, r) = corrupt_parts(NpyHeader::parse(&full[..60], "h.npy").unwrap_err());
        assert_eq!(offset, 60);
        assert!(
            r.contains("ending at byte 128") && r.contains("truncated"),
            "{r}"
        );

        // Truncated data: the offset is where the file ends.
        let (_, offset, r) = corrupt_parts(read_npy(&full[..140], "d.npy").unwrap_err());
        assert_eq!(offset, 140);
        assert!(
            r.contains("needs 16 bytes from byte 128") && r.contains("truncated"),
            "{r}"
        );

        let mut long = full.clone();
        long.push(0);
        let (_, offset, r) = corrupt_parts(read_npy(&long, "d.npy").unwrap_err());
        assert_eq!(offset, 144);
        assert!(r.contains("1 bytes follow"), "{r}");

        // Offsets of header errors point into the header.
        let file = with_header(
            1,
            "{'descr': '<q9', 'fortran_order': False, 'shape': (), }",
            &[],
        );
        let (_, offset, _) = corrupt_parts(NpyHeader::parse(&file, "o.npy").unwrap_err());
        assert_eq!(&file[offset as usize..offset as usize + 5], b"'<q9'");
    }
}
