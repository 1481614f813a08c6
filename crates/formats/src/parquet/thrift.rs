//! Parquet's Thrift (compact protocol), walked before arrow-rs reads a footer or a page
//! header, so that arrow-rs reads the bytes exactly as the protocol says.
//!
//! arrow-rs walks the element counts the bytes claim. A count past the input is harmless
//! where each element takes a byte (the read runs out of input), and a hang where none
//! does. arrow-rs 60 parts from the protocol in four ways, each of which lets a hostile
//! file make it read bytes as something other than what they are, meet a list of
//! 2^31 - 1 elements that take no byte, and loop for minutes over a 1 KB file (two were
//! found by the `parquet_file` fuzz target). They can also make it read a page's size from
//! other bytes than the ones chute checked:
//!
//! - it skips a bool in a list, set or map (of a field it does not know) without taking a
//!   byte, where the protocol gives it one;
//! - its typed readers read a field it knows as the type parquet.thrift declares, whatever
//!   type the bytes give it (an `i32` read where the bytes hold a list, say);
//! - it ends a struct at any field header whose type is 0, where the protocol ends it only
//!   at a zero byte;
//! - it cuts a field id to 16 bits.
//!
//! The walk here refuses each of these: a bool in a container (no parquet.thrift struct
//! has one), a field of a struct arrow-rs reads (the [`FILE_META_DATA`] and [`PAGE_HEADER`]
//! trees) whose bytes give another type than the declared one, a field header of type 0,
//! and an id past 16 bits. It also refuses every count past the bytes left. Bytes it accepts
//! are read by arrow-rs exactly as walked here.
//!
//! A footer is mended ([`mended`]) rather than refused where the format allows it and
//! arrow-rs alone would misread it: a field whose bytes give another type than the declared
//! one is dropped, as Thrift's generated readers (parquet-cpp's, so pyarrow's) skip it (a
//! writer that used a field id for something of its own: Dremio's parquet-mr wrote a list as
//! `ColumnMetaData`'s field 15, now `bloom_filter_length`), and so is a dictionary page offset
//! inside the file's leading magic (parquet-mr wrote 0 for "none"; parquet-cpp ignores it,
//! arrow-rs would read the chunk from byte 0). The mended footer is what arrow-rs reads.

// Thrift compact protocol types.
pub(super) const TRUE: u8 = 1;
pub(super) const FALSE: u8 = 2;
const I8: u8 = 3;
const I16: u8 = 4;
pub(super) const I32: u8 = 5;
const I64: u8 = 6;
const DOUBLE: u8 = 7;
const BINARY: u8 = 8;
const LIST: u8 = 9;
const SET: u8 = 10;
const MAP: u8 = 11;
pub(super) const STRUCT: u8 = 12;
const UUID: u8 = 13;

/// Nesting deeper than this is not a page header or a footer (Parquet's go about 10 deep).
const MAX_DEPTH: u32 = 32;

/// A type parquet.thrift declares for a field, as arrow-rs reads it (enums are `I32`,
/// strings `Binary`, unions `Struct`, a union's empty variants `Struct(&[])`).
#[derive(Clone, Copy)]
pub(super) enum Ty {
    Bool,
    I8,
    I16,
    I32,
    I64,
    /// An `i64` offset into the file, which a mended footer drops where it points inside the
    /// leading magic (see [`mended`]).
    Offset,
    Double,
    Binary,
    List(&'static Ty),
    /// A struct's (or a union's) fields by id; any other id is skipped.
    Struct(&'static [(i16, Ty)]),
}

impl Ty {
    /// Whether the bytes' type `wire` (of a field, or of a list's elements) is this one.
    fn is(self, wire: u8) -> bool {
        match self {
            Ty::Bool => wire == TRUE || wire == FALSE,
            Ty::I8 => wire == I8,
            Ty::I16 => wire == I16,
            Ty::I32 => wire == I32,
            Ty::I64 | Ty::Offset => wire == I64,
            Ty::Double => wire == DOUBLE,
            Ty::Binary => wire == BINARY,
            Ty::List(_) => wire == LIST,
            Ty::Struct(_) => wire == STRUCT,
        }
    }
}

const EMPTY: Ty = Ty::Struct(&[]);

const KEY_VALUE: Ty = Ty::Struct(&[(1, Ty::Binary), (2, Ty::Binary)]);

const STATISTICS: Ty = Ty::Struct(&[
    (1, Ty::Binary),
    (2, Ty::Binary),
    (3, Ty::I64),
    (4, Ty::I64),
    (5, Ty::Binary),
    (6, Ty::Binary),
    (7, Ty::Bool),
    (8, Ty::Bool),
    (9, Ty::I64),
]);

const TIME_UNIT: Ty = Ty::Struct(&[(1, EMPTY), (2, EMPTY), (3, EMPTY)]);
const TIMESTAMP: Ty = Ty::Struct(&[(1, Ty::Bool), (2, TIME_UNIT)]);

const LOGICAL_TYPE: Ty = Ty::Struct(&[
    (1, EMPTY),
    (2, EMPTY),
    (3, EMPTY),
    (4, EMPTY),
    (5, Ty::Struct(&[(1, Ty::I32), (2, Ty::I32)])),
    (6, EMPTY),
    (7, TIMESTAMP),
    (8, TIMESTAMP),
    (10, Ty::Struct(&[(1, Ty::I8), (2, Ty::Bool)])),
    (11, EMPTY),
    (12, EMPTY),
    (13, EMPTY),
    (14, EMPTY),
    (15, EMPTY),
    (16, Ty::Struct(&[(1, Ty::I8)])),
    (17, Ty::Struct(&[(1, Ty::Binary)])),
    (18, Ty::Struct(&[(1, Ty::Binary), (2, Ty::I32)])),
    (19, EMPTY),
]);

const SCHEMA_ELEMENT: Ty = Ty::Struct(&[
    (1, Ty::I32),
    (2, Ty::I32),
    (3, Ty::I32),
    (4, Ty::Binary),
    (5, Ty::I32),
    (6, Ty::I32),
    (7, Ty::I32),
    (8, Ty::I32),
    (9, Ty::I32),
    (10, LOGICAL_TYPE),
]);

const BOUNDING_BOX: Ty = Ty::Struct(&[
    (1, Ty::Double),
    (2, Ty::Double),
    (3, Ty::Double),
    (4, Ty::Double),
    (5, Ty::Double),
    (6, Ty::Double),
    (7, Ty::Double),
    (8, Ty::Double),
]);

const COLUMN_META_DATA: Ty = Ty::Struct(&[
    (1, Ty::I32),
    (2, Ty::List(&Ty::I32)),
    (3, Ty::List(&Ty::Binary)),
    (4, Ty::I32),
    (5, Ty::I64),
    (6, Ty::I64),
    (7, Ty::I64),
    (8, Ty::List(&KEY_VALUE)),
    (9, Ty::I64),
    (10, Ty::I64),
    (11, Ty::Offset),
    (12, STATISTICS),
    // PageEncodingStats.
    (
        13,
        Ty::List(&Ty::Struct(&[(1, Ty::I32), (2, Ty::I32), (3, Ty::I32)])),
    ),
    (14, Ty::I64),
    (15, Ty::I32),
    // SizeStatistics.
    (
        16,
        Ty::Struct(&[
            (1, Ty::I64),
            (2, Ty::List(&Ty::I64)),
            (3, Ty::List(&Ty::I64)),
        ]),
    ),
    // GeospatialStatistics.
    (
        17,
        Ty::Struct(&[(1, BOUNDING_BOX), (2, Ty::List(&Ty::I32))]),
    ),
]);

/// ColumnCryptoMetaData and EncryptionAlgorithm: arrow-rs reads them only when built with
/// encryption (chute's is not, so it skips them), but the declared types are checked all
/// the same, so that building it with encryption opens no gap.
const COLUMN_CRYPTO_META_DATA: Ty = Ty::Struct(&[
    (1, EMPTY),
    (
        2,
        Ty::Struct(&[(1, Ty::List(&Ty::Binary)), (2, Ty::Binary)]),
    ),
]);
const AES_GCM: Ty = Ty::Struct(&[(1, Ty::Binary), (2, Ty::Binary), (3, Ty::Bool)]);

const COLUMN_CHUNK: Ty = Ty::Struct(&[
    (1, Ty::Binary),
    (2, Ty::I64),
    (3, COLUMN_META_DATA),
    (4, Ty::I64),
    (5, Ty::I32),
    (6, Ty::I64),
    (7, Ty::I32),
    (8, COLUMN_CRYPTO_META_DATA),
    (9, Ty::Binary),
]);

const ROW_GROUP: Ty = Ty::Struct(&[
    (1, Ty::List(&COLUMN_CHUNK)),
    (2, Ty::I64),
    (3, Ty::I64),
    // SortingColumn.
    (
        4,
        Ty::List(&Ty::Struct(&[(1, Ty::I32), (2, Ty::Bool), (3, Ty::Bool)])),
    ),
    (5, Ty::I64),
    (6, Ty::I64),
    (7, Ty::I16),
]);

/// A file's footer: parquet.thrift's `FileMetaData`.
pub(super) const FILE_META_DATA: Ty = Ty::Struct(&[
    (1, Ty::I32),
    (2, Ty::List(&SCHEMA_ELEMENT)),
    (3, Ty::I64),
    (4, Ty::List(&ROW_GROUP)),
    (5, Ty::List(&KEY_VALUE)),
    (6, Ty::Binary),
    // ColumnOrder.
    (
        7,
        Ty::List(&Ty::Struct(&[(1, EMPTY), (2, EMPTY), (3, EMPTY)])),
    ),
    (8, Ty::Struct(&[(1, AES_GCM), (2, AES_GCM)])),
    (9, Ty::Binary),
]);

/// A page's header: parquet.thrift's `PageHeader`.
pub(super) const PAGE_HEADER: Ty = Ty::Struct(&[
    (1, Ty::I32),
    (2, Ty::I32),
    (3, Ty::I32),
    (4, Ty::I32),
    // DataPageHeader.
    (
        5,
        Ty::Struct(&[
            (1, Ty::I32),
            (2, Ty::I32),
            (3, Ty::I32),
            (4, Ty::I32),
            (5, STATISTICS),
        ]),
    ),
    // IndexPageHeader.
    (6, EMPTY),
    // DictionaryPageHeader.
    (7, Ty::Struct(&[(1, Ty::I32), (2, Ty::I32), (3, Ty::Bool)])),
    // DataPageHeaderV2.
    (
        8,
        Ty::Struct(&[
            (1, Ty::I32),
            (2, Ty::I32),
            (3, Ty::I32),
            (4, Ty::I32),
            (5, Ty::I32),
            (6, Ty::I32),
            (7, Ty::Bool),
            (8, STATISTICS),
        ]),
    ),
]);

/// Walks the struct of type `ty` at the start of `bytes` as arrow-rs 60 reads it (see the
/// module's doc), or `None` where arrow-rs would read a field as another type than its
/// bytes give, or where the walk itself refuses the bytes.
pub(super) fn reads_as_arrow_rs(bytes: &[u8], ty: Ty) -> Option<()> {
    Compact::new(bytes).value(ty, 0)
}

/// The footer `bytes` (a struct of type `ty`: [`FILE_META_DATA`]) as arrow-rs is to read it:
/// with the fields the module's doc names dropped, or `None` where the walk refuses the
/// bytes. The rest is copied as it is.
pub(super) fn mended(bytes: &[u8], ty: Ty) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(bytes.len());
    Compact::new(bytes).mend(ty, 0, &mut out)?;
    Some(out)
}

/// Writes a field header of `id` and type `wire` after the field `last` (compact protocol:
/// the id as a delta from the last where it is 1 to 15, else in full).
fn field_header(out: &mut Vec<u8>, id: i16, wire: u8, last: &mut i16) {
    match id.checked_sub(*last) {
        Some(delta @ 1..=15) => out.push(((delta as u8) << 4) | wire),
        _ => {
            out.push(wire);
            let mut v = u64::from(((i32::from(id) << 1) ^ (i32::from(id) >> 31)) as u32);
            while v >= 0x80 {
                out.push((v as u8) | 0x80);
                v >>= 7;
            }
            out.push(v as u8);
        }
    }
    *last = id;
}

/// A cursor over Thrift compact-protocol bytes.
pub(super) struct Compact<'a> {
    bytes: &'a [u8],
    pub(super) at: usize,
}

impl<'a> Compact<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Compact { bytes, at: 0 }
    }

    fn byte(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    fn advance(&mut self, n: usize) -> Option<()> {
        self.at = self.at.checked_add(n).filter(|&a| a <= self.bytes.len())?;
        Some(())
    }

    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f).checked_shl(shift)?;
            if b < 0x80 {
                return Some(v);
            }
        }
        None
    }

    pub(super) fn zigzag(&mut self) -> Option<i64> {
        let v = self.varint()?;
        Some((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    /// The next field's id and type, `None` at the struct's end. A field header of type 0
    /// other than the stop byte, and an id past 16 bits, are refused (arrow-rs would read a
    /// stop, or cut the id to 16 bits, and so read other fields than the protocol says).
    pub(super) fn field(&mut self, last: &mut i16) -> Option<Option<(i16, u8)>> {
        let b = self.byte()?;
        if b == 0 {
            return Some(None);
        }
        let (delta, ty) = (b >> 4, b & 0x0f);
        if ty == 0 {
            return None;
        }
        let id = if delta == 0 {
            i16::try_from(self.zigzag()?).ok()?
        } else {
            last.checked_add(i16::from(delta))?
        };
        *last = id;
        Some(Some((id, ty)))
    }

    /// `None` unless `n` elements could fit in what is left: every element of a list, set
    /// or map takes at least a byte, so a count past the input ends the walk at once instead
    /// of looping over elements that are not there.
    fn fits(&self, n: u64) -> Option<()> {
        (n <= (self.bytes.len() - self.at) as u64).then_some(())
    }

    /// A list's or set's element type and count.
    fn list_header(&mut self) -> Option<(u8, u64)> {
        let h = self.byte()?;
        let n = match h >> 4 {
            15 => self.varint()?,
            n => u64::from(n),
        };
        self.fits(n)?;
        Some((h & 0x0f, n))
    }

    /// Skips an element of a list, set or map of type `ty`. A bool there is refused: it takes
    /// a byte in the protocol and none when arrow-rs skips it.
    fn element(&mut self, ty: u8, depth: u32) -> Option<()> {
        if ty == TRUE || ty == FALSE {
            return None;
        }
        self.skip(ty, depth + 1)
    }

    /// Skips a value of type `ty`.
    pub(super) fn skip(&mut self, ty: u8, depth: u32) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match ty {
            TRUE | FALSE => Some(()),
            I8 => self.advance(1),
            I16 | I32 | I64 => self.varint().map(drop),
            DOUBLE => self.advance(8),
            UUID => self.advance(16),
            BINARY => {
                let n = usize::try_from(self.varint()?).ok()?;
                self.advance(n)
            }
            LIST | SET => {
                let (ty, n) = self.list_header()?;
                for _ in 0..n {
                    self.element(ty, depth)?;
                }
                Some(())
            }
            MAP => {
                let n = self.varint()?;
                if n == 0 {
                    return Some(());
                }
                let kv = self.byte()?;
                self.fits(n.saturating_mul(2))?;
                for _ in 0..n {
                    self.element(kv >> 4, depth)?;
                    self.element(kv & 0x0f, depth)?;
                }
                Some(())
            }
            STRUCT => {
                let mut last = 0;
                while let Some((_, t)) = self.field(&mut last)? {
                    self.skip(t, depth + 1)?;
                }
                Some(())
            }
            _ => None,
        }
    }

    /// Walks a value of declared type `ty` as [`Compact::value`] does, writing it to `out`
    /// with the fields [`mended`] drops left out.
    fn mend(&mut self, ty: Ty, depth: u32, out: &mut Vec<u8>) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match ty {
            Ty::Struct(known) => {
                let (mut last, mut written) = (0, 0);
                while let Some((id, wire)) = self.field(&mut last)? {
                    let start = self.at;
                    match known.iter().find(|(k, _)| *k == id) {
                        Some(&(_, Ty::Offset)) if wire == I64 => {
                            // Within the magic ("PAR1"): not an offset of anything.
                            if self.zigzag()? >= 4 {
                                field_header(out, id, wire, &mut written);
                                out.extend(&self.bytes[start..self.at]);
                            }
                        }
                        Some(&(_, ty)) if ty.is(wire) => {
                            field_header(out, id, wire, &mut written);
                            self.mend(ty, depth + 1, out)?;
                        }
                        // Dropped, as Thrift's generated readers skip it.
                        Some(_) => self.skip(wire, depth + 1)?,
                        None => {
                            self.skip(wire, depth + 1)?;
                            field_header(out, id, wire, &mut written);
                            out.extend(&self.bytes[start..self.at]);
                        }
                    }
                }
                out.push(0);
                Some(())
            }
            Ty::List(elem) => {
                let start = self.at;
                let (wire, n) = self.list_header()?;
                if n > 0 && !elem.is(wire) {
                    return None;
                }
                out.extend(&self.bytes[start..self.at]);
                for _ in 0..n {
                    match elem {
                        Ty::Struct(_) | Ty::List(_) => self.mend(*elem, depth + 1, out)?,
                        _ => {
                            let at = self.at;
                            match elem {
                                Ty::Bool => self.advance(1)?,
                                _ => self.value(*elem, depth + 1)?,
                            }
                            out.extend(&self.bytes[at..self.at]);
                        }
                    }
                }
                Some(())
            }
            _ => {
                let start = self.at;
                self.value(ty, depth)?;
                out.extend(&self.bytes[start..self.at]);
                Some(())
            }
        }
    }

    /// Reads a value of declared type `ty` as arrow-rs's typed readers do: a struct's known
    /// fields as their declared types (refused where the bytes give another), the rest
    /// skipped.
    fn value(&mut self, ty: Ty, depth: u32) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match ty {
            Ty::Struct(known) => {
                let mut last = 0;
                while let Some((id, wire)) = self.field(&mut last)? {
                    match known.iter().find(|(k, _)| *k == id) {
                        Some(&(_, ty)) if ty.is(wire) => self.value(ty, depth + 1)?,
                        Some(_) => return None,
                        None => self.skip(wire, depth + 1)?,
                    }
                }
                Some(())
            }
            Ty::List(elem) => {
                let (wire, n) = self.list_header()?;
                if n > 0 && !elem.is(wire) {
                    return None;
                }
                for _ in 0..n {
                    match elem {
                        // A bool element read (not skipped) takes its byte.
                        Ty::Bool => self.advance(1)?,
                        _ => self.value(*elem, depth + 1)?,
                    }
                }
                Some(())
            }
            Ty::Bool => Some(()),
            Ty::I8 => self.advance(1),
            Ty::I16 | Ty::I32 | Ty::I64 | Ty::Offset => self.varint().map(drop),
            Ty::Double => self.advance(8),
            Ty::Binary => {
                let n = usize::try_from(self.varint()?).ok()?;
                self.advance(n)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use arrow_array::builder::{ListBuilder, StringBuilder};
    use arrow_array::{
        ArrayRef, Date32Array, Decimal128Array, Float64Array, Int8Array, RecordBatch,
        TimestampMicrosecondArray,
    };
    use bytes::Bytes;
    use parquet::arrow::ArrowWriter;
    use parquet::file::metadata::{KeyValue, SortingColumn};
    use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};

    use super::super::{ParquetOptions, ParquetSource, pages};
    use super::*;

    fn file(footer: &[u8]) -> Vec<u8> {
        let mut file = b"PAR1".to_vec();
        file.extend(footer);
        file.extend((footer.len() as u32).to_le_bytes());
        file.extend(b"PAR1");
        file
    }

    #[test]
    fn a_known_field_of_another_type_is_refused_or_dropped() {
        // FileMetaData's version (an i32) sent as a list of one i32, whose 7-byte value is,
        // to arrow-rs (which reads an i32 from the list header), field 16: a list claiming
        // 2^31 - 1 bools, which it skips taking no byte each.
        let footer = [0x19, 0x15, 0xf9, 0xf1, 0xff, 0xff, 0xff, 0xff, 0x07, 0x00];
        assert!(Compact::new(&footer).skip(STRUCT, 0).is_some());
        assert_eq!(reads_as_arrow_rs(&footer, FILE_META_DATA), None);
        // A footer drops it, as Thrift's generated readers skip it: arrow-rs never sees it
        // (and reports the required field missing, at once).
        assert_eq!(mended(&footer, FILE_META_DATA), Some(vec![0x00]));
        let start = Instant::now();
        let file = Bytes::from(file(&footer));
        assert!(pages::check_footer(&file).is_ok());
        let err = pages::metadata(&file).unwrap_err();
        assert!(err.contains("not a readable Parquet file"), "{err}");
        assert!(start.elapsed() < Duration::from_secs(1));
        // A dropped field's neighbours keep their ids: version (1) as a list, then
        // num_rows (3, an i64 of 7) written with a delta from 1, rewritten as one from 0.
        assert_eq!(
            mended(&[0x19, 0x15, 0x02, 0x26, 0x0e, 0x00], FILE_META_DATA),
            Some(vec![0x36, 0x0e, 0x00])
        );
        // The same field as an i32 reads; so does an unknown field of any type, and a known
        // one deep inside (a schema element's name, a binary, given as an i32: refused).
        assert!(reads_as_arrow_rs(&[0x15, 0x04, 0x00], FILE_META_DATA).is_some());
        assert!(reads_as_arrow_rs(&[0x05, 0xc8, 0x01, 0x04, 0x00], FILE_META_DATA).is_some());
        let schema = [0x29, 0x1c, 0x15, 0x02, 0x35, 0x04, 0x00, 0x00];
        assert_eq!(reads_as_arrow_rs(&schema, FILE_META_DATA), None);
        let schema = [0x29, 0x1c, 0x15, 0x02, 0x38, 0x01, b'x', 0x00, 0x00];
        assert!(reads_as_arrow_rs(&schema, FILE_META_DATA).is_some());
        // A list whose elements are not the declared type (list<SchemaElement> of i32s).
        assert_eq!(
            reads_as_arrow_rs(&[0x29, 0x15, 0x02, 0x00], FILE_META_DATA),
            None
        );
        // A field id past 16 bits: arrow-rs reads 65538 as 2 (the schema), the protocol as
        // an unknown field; refused by the protocol walk.
        let footer = [0x05, 0x84, 0x80, 0x08, 0x04, 0x00];
        assert_eq!(Compact::new(&footer).skip(STRUCT, 0), None);
        // A page header's uncompressed size sent as an i64 (arrow-rs reads it as an i32,
        // which the size check, reading fields 2 and 3 as i32s only, would not see).
        assert_eq!(
            reads_as_arrow_rs(
                &[0x15, 0x00, 0x16, 0x80, 0x80, 0x80, 0x80, 0x20, 0x00],
                PAGE_HEADER
            ),
            None
        );
    }

    #[test]
    fn a_file_with_a_field_of_its_own_and_a_dictionary_offset_of_zero_is_mended() {
        // parquet-testing's dict-page-offset-zero.parquet (testdata/parquet/README.md).
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/parquet");
        let data = Bytes::from(std::fs::read(dir.join("dict-page-offset-zero.parquet")).unwrap());
        let footer = pages::footer(&data).unwrap().unwrap();
        assert!(footer.len() < 550);
        let meta = pages::metadata(&data).unwrap();
        let chunk = meta.metadata().row_group(0).column(0);
        assert_eq!(chunk.dictionary_page_offset(), None);
        assert_eq!(chunk.bloom_filter_length(), None);
        assert_eq!(chunk.data_page_offset(), 4);
        assert_eq!(meta.metadata().file_metadata().num_rows(), 39);
        // FileMetaData { row_groups: [{ columns: [{ meta_data: { dictionary_page_offset:
        // 100 } }] }] }: an offset past the magic is kept, one of 0 dropped.
        let footer = [0x49, 0x1c, 0x19, 0x1c, 0x3c, 0xb6, 0xc8, 0x01, 0, 0, 0, 0];
        assert_eq!(mended(&footer, FILE_META_DATA).unwrap(), footer);
        let footer = [0x49, 0x1c, 0x19, 0x1c, 0x3c, 0xb6, 0x00, 0, 0, 0, 0];
        let dropped = [0x49, 0x1c, 0x19, 0x1c, 0x3c, 0, 0, 0, 0];
        assert_eq!(mended(&footer, FILE_META_DATA).unwrap(), dropped);
    }

    #[test]
    fn the_fuzzers_typed_desync_is_refused_at_once() {
        // Found by the parquet_file fuzz target: a 1,098-byte file whose footer kept
        // arrow-rs's parser busy for minutes.
        let data = include_bytes!("../../../../fuzz/seeds/parquet_file/arrow-rs-desync-skip");
        let start = Instant::now();
        let contents = vec![("desync.parquet".to_string(), Bytes::from_static(data))];
        let err = ParquetSource::from_bytes(contents, ParquetOptions::default()).unwrap_err();
        assert!(err.to_string().contains("desync.parquet"), "{err}");
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    /// Checks that the footer and every page header of the Parquet file `data` (`name` in
    /// messages) walk, and that arrow-rs reads the footer; returns its row groups.
    fn accepted(data: &[u8], name: &str) -> usize {
        pages::check_footer(data).unwrap_or_else(|e| panic!("{name}: {e}"));
        // Nothing in a well-formed footer is mended: the bytes arrow-rs reads are the file's.
        let n = data.len();
        let len = u32::from_le_bytes(data[n - 8..n - 4].try_into().unwrap()) as usize;
        let footer = &data[n - 8 - len..n - 8];
        assert_eq!(
            mended(footer, FILE_META_DATA).as_deref(),
            Some(footer),
            "{name}"
        );
        let meta = parquet::file::metadata::ParquetMetaDataReader::new()
            .parse_and_finish(&Bytes::copy_from_slice(data))
            .unwrap();
        for (gi, rg) in meta.row_groups().iter().enumerate() {
            for c in rg.columns() {
                pages::check_pages(c, gi, data, 1 << 30).unwrap_or_else(|e| panic!("{name}: {e}"));
            }
        }
        meta.num_row_groups()
    }

    #[test]
    fn files_other_writers_wrote_are_accepted() {
        // pyarrow's golden files and DuckDB's and Polars' (testdata/parquet/README.md): every
        // footer and page header walks, and arrow-rs reads the same footer.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/parquet");
        let names = [
            "pyarrow_golden.parquet",
            "pyarrow_golden_zstd.parquet",
            "duckdb.parquet",
            "duckdb_zstd_v2.parquet",
            "polars.parquet",
            "polars_lz4.parquet",
        ];
        for name in names {
            accepted(&std::fs::read(dir.join(name)).unwrap(), name);
        }
    }

    #[test]
    fn files_arrow_rs_writes_are_accepted() {
        let mut tokens = ListBuilder::new(StringBuilder::new());
        for i in 0..300 {
            let valid = i % 7 != 0;
            for j in 0..(i % 4) * usize::from(valid) {
                tokens.values().append_value(format!("t{i}.{j}"));
            }
            tokens.append(valid);
        }
        let columns: Vec<(&str, ArrayRef)> = vec![
            (
                "ts",
                Arc::new(TimestampMicrosecondArray::from_iter_values(0..300).with_timezone("UTC")),
            ),
            ("day", Arc::new(Date32Array::from_iter_values(0..300))),
            (
                "price",
                Arc::new(
                    Decimal128Array::from_iter_values(0..300)
                        .with_precision_and_scale(12, 2)
                        .unwrap(),
                ),
            ),
            (
                "small",
                Arc::new(Int8Array::from_iter_values((0..300).map(|i| i as i8))),
            ),
            (
                "x",
                Arc::new(Float64Array::from_iter(
                    (0..300).map(|i| (i % 3 != 0).then_some(i as f64)),
                )),
            ),
            ("tokens", Arc::new(tokens.finish())),
        ];
        let batch = RecordBatch::try_from_iter(columns).unwrap();
        for version in [WriterVersion::PARQUET_1_0, WriterVersion::PARQUET_2_0] {
            let props = WriterProperties::builder()
                .set_writer_version(version)
                .set_statistics_enabled(EnabledStatistics::Page)
                .set_data_page_row_count_limit(64)
                .set_write_batch_size(64)
                .set_max_row_group_row_count(Some(128))
                .set_sorting_columns(Some(vec![SortingColumn {
                    column_idx: 1,
                    descending: false,
                    nulls_first: true,
                }]))
                .set_key_value_metadata(Some(vec![KeyValue::new("k".into(), "v".to_string())]))
                .build();
            let mut data = Vec::new();
            let mut w = ArrowWriter::try_new(&mut data, batch.schema(), Some(props)).unwrap();
            w.write(&batch).unwrap();
            w.close().unwrap();
            assert_eq!(accepted(&data, "written"), 3);
        }
    }
}
