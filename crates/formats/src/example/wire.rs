//! The protobuf wire format, read with borrowing cursors and written with varints.
//!
//! The parsing functions return a small error ([`Bad`]: an offset and a [`Problem`]) and the
//! callers turn it into chute's [`Error`] once, at the boundary: a `Result` carrying the full
//! `Error` is several times larger, and moving it through every varint read cost more than
//! the parsing itself.

use std::ops::Range;

use chute_core::Error;

/// Groups (a deprecated protobuf encoding) nest at most this deep in unknown fields; deeper
/// input is rejected rather than followed. Protobuf's own default recursion limit is 100.
pub const MAX_DEPTH: usize = 64;

/// Protobuf wire types.
pub(super) const VARINT: u8 = 0;
pub(super) const FIXED64: u8 = 1;
pub(super) const LEN: u8 = 2;
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
pub(super) const FIXED32: u8 = 5;

/// Where errors point: the shard (or record) name, the record's offset in it, and the record.
pub(super) struct Ctx<'a> {
    pub(super) origin: &'a str,
    pub(super) base: u64,
    pub(super) data: &'a [u8],
}

impl Ctx<'_> {
    pub(super) fn error(&self, at: usize, reason: impl Into<String>) -> Error {
        let reason = reason.into();
        let reason = if self.base == 0 {
            format!("not a valid tf.train.Example: {reason}")
        } else {
            format!(
                "not a valid tf.train.Example (in the record whose data starts at byte {}): \
                 {reason}",
                self.base
            )
        };
        Error::corrupt(self.origin, self.base + at as u64, reason)
    }

    pub(super) fn bad(&self, bad: Bad) -> Error {
        self.error(bad.at, bad.problem.describe(self.data, bad.at))
    }
}

/// A parse failure at byte `at` of the record.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bad {
    at: usize,
    problem: Problem,
}

/// What was wrong, with what the message needs.
#[derive(Debug, Clone, Copy)]
enum Problem {
    VarintPastEnd,
    VarintTooLong,
    FieldNumber(u64),
    LengthPastEnd { len: u64, left: usize },
    FixedPastEnd(usize),
    StrayEndGroup(u32),
    WireType(u8),
    GroupNotClosed(u32),
    GroupTooDeep,
    GroupMismatch { end: u32, start: u32 },
    FloatPacking(usize),
    NameNotUtf8(usize),
    TooManyFeatures { limit: u64 },
}

impl Problem {
    fn describe(self, data: &[u8], at: usize) -> String {
        match self {
            Problem::VarintPastEnd => "a varint runs past the end of its message".into(),
            Problem::VarintTooLong => "a varint is longer than 10 bytes".into(),
            Problem::FieldNumber(n) => format!("field number {n} is not valid"),
            Problem::LengthPastEnd { len, left } => {
                format!("a field declares {len} bytes but only {left} remain in its message")
            }
            Problem::FixedPastEnd(n) => {
                format!("a {n}-byte fixed field runs past the end of its message")
            }
            Problem::StrayEndGroup(f) => format!("an end-group tag (field {f}) has no start"),
            Problem::WireType(w) => format!("wire type {w} is not valid"),
            Problem::GroupNotClosed(f) => format!("group (field {f}) is not closed"),
            Problem::GroupTooDeep => format!("groups nest deeper than {MAX_DEPTH} levels"),
            Problem::GroupMismatch { end, start } => {
                format!("end-group tag for field {end} closes a group of field {start}")
            }
            Problem::FloatPacking(n) => {
                format!("a packed float_list holds {n} bytes, not a multiple of 4")
            }
            Problem::TooManyFeatures { limit } => chute_core::limits::exceeded(
                "the Example",
                limit + 1,
                "features or more",
                "max_features",
                limit,
            ),
            Problem::NameNotUtf8(len) => format!(
                "feature name {:?} is not UTF-8",
                String::from_utf8_lossy(data.get(at..at + len).unwrap_or_default())
            ),
        }
    }
}

pub(super) type Parsed<T> = Result<T, Bad>;

fn bad<T>(at: usize, problem: Problem) -> Parsed<T> {
    Err(Bad { at, problem })
}

/// The three lists of a `Feature`'s oneof.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Bytes,
    Float,
    Int64,
}

impl Kind {
    pub(super) fn field(self) -> u32 {
        match self {
            Kind::Bytes => 1,
            Kind::Float => 2,
            Kind::Int64 => 3,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Bytes => "bytes_list",
            Kind::Float => "float_list",
            Kind::Int64 => "int64_list",
        }
    }
}

/// A cursor over one message, `data[pos..]`, where `data` is the record cut at the message's
/// end: positions are offsets in the whole record, so errors can name them.
struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor over `record[range]`. `range` always comes from a length already checked
    /// against the record.
    fn new(record: &'a [u8], range: Range<usize>) -> Self {
        Cursor {
            data: &record[..range.end],
            pos: range.start,
        }
    }

    #[inline(always)]
    fn at_end(&self) -> bool {
        self.pos >= self.data.len()
    }

    #[inline(always)]
    fn varint(&mut self) -> Parsed<u64> {
        // Tags and short lengths are one byte: that case inlines; the loop does not.
        match self.data.get(self.pos) {
            Some(&b) if b < 0x80 => {
                self.pos += 1;
                Ok(u64::from(b))
            }
            _ => self.varint_slow(),
        }
    }

    #[inline(never)]
    fn varint_slow(&mut self) -> Parsed<u64> {
        let start = self.pos;
        let mut value = 0u64;
        for i in 0..10 {
            let Some(&b) = self.data.get(self.pos) else {
                return bad(start, Problem::VarintPastEnd);
            };
            self.pos += 1;
            value |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return Ok(value);
            }
        }
        bad(start, Problem::VarintTooLong)
    }

    /// A field's tag: (field number, wire type, offset of the tag).
    #[inline(always)]
    fn tag(&mut self) -> Parsed<(u32, u8, usize)> {
        let at = self.pos;
        let tag = self.varint()?;
        let field = tag >> 3;
        if field == 0 || field > u64::from(u32::MAX >> 3) {
            return bad(at, Problem::FieldNumber(field));
        }
        Ok((field as u32, (tag & 7) as u8, at))
    }

    /// The body of a length-delimited field whose tag was just read.
    #[inline(always)]
    fn len_delimited(&mut self) -> Parsed<Range<usize>> {
        let at = self.pos;
        let len = self.varint()?;
        let left = self.data.len() - self.pos;
        if len > left as u64 {
            return bad(at, Problem::LengthPastEnd { len, left });
        }
        let start = self.pos;
        self.pos += len as usize;
        Ok(start..self.pos)
    }

    fn fixed(&mut self, n: usize) -> Parsed<Range<usize>> {
        if self.data.len() - self.pos < n {
            return bad(self.pos, Problem::FixedPastEnd(n));
        }
        let start = self.pos;
        self.pos += n;
        Ok(start..self.pos)
    }

    /// Skips the value of an unknown field whose tag (`field`, `wire`, at `at`) was just read.
    fn skip(&mut self, field: u32, wire: u8, at: usize) -> Parsed<()> {
        match wire {
            VARINT => self.varint().map(drop),
            FIXED64 => self.fixed(8).map(drop),
            LEN => self.len_delimited().map(drop),
            FIXED32 => self.fixed(4).map(drop),
            START_GROUP => self.skip_group(field),
            END_GROUP => bad(at, Problem::StrayEndGroup(field)),
            _ => bad(at, Problem::WireType(wire)),
        }
    }

    /// Skips a group's fields up to its end tag, without recursion.
    #[inline(never)]
    fn skip_group(&mut self, field: u32) -> Parsed<()> {
        let mut open = [0u32; MAX_DEPTH];
        open[0] = field;
        let mut depth = 1;
        while depth > 0 {
            if self.at_end() {
                return bad(self.pos, Problem::GroupNotClosed(field));
            }
            let (f, wire, at) = self.tag()?;
            match wire {
                START_GROUP => {
                    if depth == MAX_DEPTH {
                        return bad(at, Problem::GroupTooDeep);
                    }
                    open[depth] = f;
                    depth += 1;
                }
                END_GROUP => {
                    if open[depth - 1] != f {
                        let start = open[depth - 1];
                        return bad(at, Problem::GroupMismatch { end: f, start });
                    }
                    depth -= 1;
                }
                _ => self.skip(f, wire, at)?,
            }
        }
        Ok(())
    }
}

/// A `Feature` message, not yet decoded: its kind and where its lists are.
#[derive(Clone, Copy)]
pub(super) struct FeatureRef<'a> {
    pub(super) kind: Kind,
    pub(super) data: &'a [u8],
    /// Where the last run of fields of `kind` starts: earlier fields of another kind were
    /// replaced (oneof), so only fields of `kind` from here on count.
    run: usize,
    /// The end of the `Feature` message.
    end: usize,
    /// Offset of the `Feature` message, for errors.
    pub(super) at: usize,
}

impl<'a> FeatureRef<'a> {
    /// Parses a `Feature` body; `None` when no kind is set.
    #[inline(always)]
    fn parse(data: &'a [u8], body: Range<usize>) -> Parsed<Option<FeatureRef<'a>>> {
        let mut c = Cursor::new(data, body.clone());
        let mut kind = None;
        let mut run = body.start;
        while !c.at_end() {
            let (field, wire, at) = c.tag()?;
            let k = match (field, wire) {
                (1, LEN) => Kind::Bytes,
                (2, LEN) => Kind::Float,
                (3, LEN) => Kind::Int64,
                _ => {
                    c.skip(field, wire, at)?;
                    continue;
                }
            };
            if kind != Some(k) {
                kind = Some(k);
                run = at;
            }
            c.len_delimited()?;
        }
        Ok(kind.map(|kind| FeatureRef {
            kind,
            data,
            run,
            end: body.end,
            at: body.start,
        }))
    }

    /// Calls `f` with a cursor over each list message of the feature's kind, in order.
    #[inline]
    fn for_each_list(&self, mut f: impl FnMut(Cursor<'a>) -> Parsed<()>) -> Parsed<()> {
        let mut c = Cursor::new(self.data, self.run..self.end);
        let want = self.kind.field();
        while !c.at_end() {
            let (field, wire, at) = c.tag()?;
            if field == want && wire == LEN {
                let r = c.len_delimited()?;
                f(Cursor::new(self.data, r))?;
            } else {
                c.skip(field, wire, at)?;
            }
        }
        Ok(())
    }

    /// Calls `f` with the range of each value of a `bytes_list`.
    #[inline]
    pub(super) fn for_each_bytes(&self, mut f: impl FnMut(Range<usize>)) -> Parsed<()> {
        self.for_each_list(|mut c| {
            while !c.at_end() {
                let (field, wire, at) = c.tag()?;
                if field == 1 && wire == LEN {
                    f(c.len_delimited()?);
                } else {
                    c.skip(field, wire, at)?;
                }
            }
            Ok(())
        })
    }

    /// Calls `f` with each run of little-endian floats of a `float_list`: a packed chunk, or
    /// one unpacked value.
    #[inline]
    pub(super) fn for_each_float_chunk(&self, mut f: impl FnMut(&'a [u8])) -> Parsed<()> {
        let data = self.data;
        self.for_each_list(|mut c| {
            while !c.at_end() {
                let (field, wire, at) = c.tag()?;
                match (field, wire) {
                    (1, LEN) => {
                        let r = c.len_delimited()?;
                        if r.len() % 4 != 0 {
                            return bad(at, Problem::FloatPacking(r.len()));
                        }
                        f(&data[r]);
                    }
                    (1, FIXED32) => f(&data[c.fixed(4)?]),
                    _ => c.skip(field, wire, at)?,
                }
            }
            Ok(())
        })
    }

    /// Calls `f` with each value of an `int64_list`.
    #[inline]
    pub(super) fn for_each_int64(&self, mut f: impl FnMut(i64)) -> Parsed<()> {
        let data = self.data;
        self.for_each_list(|mut c| {
            while !c.at_end() {
                let (field, wire, at) = c.tag()?;
                match (field, wire) {
                    (1, LEN) => {
                        let mut p = Cursor::new(data, c.len_delimited()?);
                        while !p.at_end() {
                            f(p.varint()? as i64);
                        }
                    }
                    (1, VARINT) => f(c.varint()? as i64),
                    _ => c.skip(field, wire, at)?,
                }
            }
            Ok(())
        })
    }

    /// The number of values of an `int64_list`, without decoding them: packed varints are
    /// counted by their last bytes. Malformed varints are reported by the decoding pass.
    #[inline]
    pub(super) fn count_int64(&self) -> Parsed<usize> {
        let data = self.data;
        let mut n = 0;
        self.for_each_list(|mut c| {
            while !c.at_end() {
                let (field, wire, at) = c.tag()?;
                match (field, wire) {
                    (1, LEN) => {
                        let r = c.len_delimited()?;
                        n += data[r].iter().filter(|&&b| b < 0x80).count();
                    }
                    (1, VARINT) => {
                        c.varint()?;
                        n += 1;
                    }
                    _ => c.skip(field, wire, at)?,
                }
            }
            Ok(())
        })?;
        Ok(n)
    }
}

/// Calls `f(name, feature)` for each map entry of the example, in the order of the record
/// (duplicates included; features with no kind set left out). More map entries than the
/// process's [`Limits::max_features`](chute_core::Limits) are an error at the first one over
/// (each feature costs far more memory decoded than its few bytes on the wire).
#[inline]
pub(super) fn visit<'a>(data: &'a [u8], mut f: impl FnMut(&'a str, FeatureRef<'a>)) -> Parsed<()> {
    let limit = chute_core::Limits::current().max_features;
    let mut count = 0u64;
    let mut example = Cursor::new(data, 0..data.len());
    while !example.at_end() {
        let (field, wire, at) = example.tag()?;
        if (field, wire) != (1, LEN) {
            example.skip(field, wire, at)?;
            continue;
        }
        let mut features = Cursor::new(data, example.len_delimited()?);
        while !features.at_end() {
            let (field, wire, at) = features.tag()?;
            if (field, wire) != (1, LEN) {
                features.skip(field, wire, at)?;
                continue;
            }
            let entry_range = features.len_delimited()?;
            count += 1;
            if count > limit {
                return bad(at, Problem::TooManyFeatures { limit });
            }
            let mut entry = Cursor::new(data, entry_range.clone());
            let mut key = entry_range.start..entry_range.start;
            let mut value = None;
            while !entry.at_end() {
                let (field, wire, at) = entry.tag()?;
                match (field, wire) {
                    (1, LEN) => key = entry.len_delimited()?,
                    (2, LEN) => value = Some(entry.len_delimited()?),
                    _ => entry.skip(field, wire, at)?,
                }
            }
            let Ok(name) = std::str::from_utf8(&data[key.clone()]) else {
                return bad(key.start, Problem::NameNotUtf8(key.len()));
            };
            let Some(value) = value else { continue };
            if let Some(feature) = FeatureRef::parse(data, value)? {
                f(name, feature);
            }
        }
    }
    Ok(())
}

/// Sorts entries by name and keeps the last entry of each name (protobuf's map semantics).
pub(super) fn last_of_each_name<T>(mut entries: Vec<(&str, T)>) -> Vec<(&str, T)> {
    // Writers usually emit each name once, often already sorted: check before sorting.
    if entries.windows(2).all(|w| w[0].0 < w[1].0) {
        return entries;
    }
    // Reversed, a stable sort puts the last entry of each name first; dedup keeps it.
    entries.reverse();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    entries.dedup_by(|later, kept| later.0 == kept.0);
    entries
}

pub(super) fn varint_len(v: u64) -> usize {
    // 1 byte per 7 bits, at least 1.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

pub(super) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(super) fn put_tag(out: &mut Vec<u8>, field: u32, wire: u8) {
    put_varint(out, (u64::from(field) << 3) | u64::from(wire));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::example::testing::varint;

    #[test]
    fn varint_helpers_agree() {
        for v in [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            u64::from(u32::MAX),
            1 << 56,
            u64::MAX,
        ] {
            let bytes = varint(v);
            assert_eq!(varint_len(v), bytes.len(), "{v}");
            let mut c = Cursor::new(&bytes, 0..bytes.len());
            assert_eq!(c.varint().unwrap(), v);
            assert!(c.at_end());
        }
        assert_eq!(varint_len(-1i64 as u64), 10);
    }
}
