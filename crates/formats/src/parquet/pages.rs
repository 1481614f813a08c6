//! What a Parquet file declares before arrow-rs allocates for it, checked first.
//!
//! arrow-rs trusts three sizes it reads from the file: a row group's row count (it reserves
//! a batch of that many values per column), a page header's uncompressed size (it reserves
//! that much before decompressing) and a column chunk's byte range (it panics on a negative
//! one). A bit flip or a hostile writer turns any of them into an allocation the process
//! cannot survive. [`check_group`] bounds the first and third when a file is opened and
//! [`check_pages`] the second before a column chunk is decoded, against
//! [`Limits::max_decoded_bytes`](chute_core::Limits); [`check_shards`] bounds the shards the
//! row counts make against the files' bytes.

use arrow_schema::DataType;
use parquet::basic::Type as Physical;
use parquet::file::metadata::{ColumnChunkMetaData, RowGroupMetaData};

use super::thrift::{self, Compact, FILE_META_DATA, I32, PAGE_HEADER, STRUCT};

/// Shards a dataset may have beyond one per 64 bytes of its files: a row count is a claim
/// (constant columns encode many rows a byte), and each shard of rows costs an entry in the
/// manifest when the files are opened, so a footer claiming 2^40 rows must not make 2^26.
pub(super) const FREE_SHARDS: u64 = 1 << 20;

/// Refuses a dataset that would have `shards` shards over `bytes` bytes of files: more
/// than [`FREE_SHARDS`] and one per 64 bytes. `at` names the row group that went over.
pub(super) fn check_shards(shards: u64, bytes: u64, at: &str) -> Result<(), String> {
    let most = FREE_SHARDS.max(bytes / 64);
    if shards <= most {
        return Ok(());
    }
    Err(format!(
        "{at}: the row counts declared so far make {shards} shards of rows in {bytes} bytes of \
         files, more than such files can hold ({most}); a footer is corrupt, or raise chunk_rows"
    ))
}

/// The bytes a column chunk's values take decoded, per row: its physical width (4 for a
/// variable-length value's offset) plus its definition and repetition levels.
fn width(c: &ColumnChunkMetaData) -> u64 {
    let d = c.column_descr();
    let value = match d.physical_type() {
        Physical::BOOLEAN => 1,
        Physical::INT32 | Physical::FLOAT | Physical::BYTE_ARRAY => 4,
        Physical::INT64 | Physical::DOUBLE => 8,
        Physical::INT96 => 12,
        Physical::FIXED_LEN_BYTE_ARRAY => d.type_length().max(1) as u64,
    };
    value + 2 * u64::from(d.max_def_level() > 0) + 2 * u64::from(d.max_rep_level() > 0)
}

/// A column chunk's byte range in a file of `file_len` bytes, if it lies inside it.
pub(super) fn byte_range(c: &ColumnChunkMetaData, file_len: u64) -> Option<(u64, u64)> {
    let start = c.dictionary_page_offset().unwrap_or(c.data_page_offset());
    let (start, len) = (
        u64::try_from(start).ok()?,
        u64::try_from(c.compressed_size()).ok()?,
    );
    (start.checked_add(len)? <= file_len).then_some((start, len))
}

/// The values each row of a column of type `t` holds at least, per leaf: the product of the
/// fixed-size lists around it (arrow-rs writes that many values for each null row of such a
/// list, so a schema claiming lists of 2^30 floats makes a few null rows gigabytes). Variable
/// lists count one: their values are in the pages, which [`check_pages`] bounds.
pub(super) fn values_per_row(t: &DataType) -> u64 {
    match t {
        DataType::FixedSizeList(f, k) => u64::try_from(*k)
            .unwrap_or(0)
            .max(1)
            .saturating_mul(values_per_row(f.data_type())),
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::Map(f, _) => values_per_row(f.data_type()),
        DataType::Struct(fields) => fields
            .iter()
            .map(|f| values_per_row(f.data_type()))
            .max()
            .unwrap_or(1),
        DataType::Dictionary(_, v) => values_per_row(v),
        _ => 1,
    }
}

/// Checks row group `gi` of a file of `file_len` bytes when it is opened: every column
/// chunk lies in the file, and the projected leaves do not decode to more than
/// `max_decoded` bytes, one by one or all together (a leaf: its row count times its width
/// times `per_row(leaf)`, the values per row of its column, `None` for a leaf not projected;
/// a file of a few KB can declare a hundred columns of RLE-encoded rows). The reason names
/// what and the limit. Returns the bytes the projected leaves decode to, all together: what
/// the group costs in the decoded cache (the footer's own `total_byte_size` is a claim that
/// may be far less).
pub(super) fn check_group(
    rg: &RowGroupMetaData,
    gi: usize,
    file_len: u64,
    max_decoded: u64,
    per_row: impl Fn(usize) -> Option<u64>,
) -> Result<u64, String> {
    let rows = u64::try_from(rg.num_rows())
        .map_err(|_| format!("row group {gi} declares {} rows", rg.num_rows()))?;
    for c in rg.columns() {
        if byte_range(c, file_len).is_none() {
            return Err(format!(
                "row group {gi}, column {}: its chunk (offset {}, {} bytes) does not lie in \
                 the file's {file_len} bytes; the file is cut short or corrupt",
                c.column_path(),
                c.dictionary_page_offset().unwrap_or(c.data_page_offset()),
                c.compressed_size()
            ));
        }
    }
    let mut total = 0u64;
    for (leaf, c) in rg.columns().iter().enumerate() {
        let Some(values) = per_row(leaf) else {
            continue;
        };
        let decoded = rows.saturating_mul(values).saturating_mul(width(c));
        total = total.saturating_add(decoded);
        if decoded > max_decoded {
            return Err(chute_core::limits::exceeded(
                &format!("row group {gi}, column {} ({rows} rows)", c.column_path()),
                decoded,
                "bytes decoded",
                "max_decoded_bytes",
                max_decoded,
            ));
        }
    }
    if total > max_decoded {
        return Err(chute_core::limits::exceeded(
            &format!("row group {gi} ({rows} rows, its projected columns together)"),
            total,
            "bytes decoded",
            "max_decoded_bytes",
            max_decoded,
        ));
    }
    Ok(total)
}

/// Bytes a dictionary page's value may take decoded, at most (a byte array's offset and
/// handle, or a fixed-width value): arrow-rs reserves a dictionary's declared count of
/// values before decoding them.
const DICTIONARY_VALUE_BYTES: u64 = 32;

/// Walks the page headers of column chunk `c` of row group `gi` in `data` (the file) and
/// refuses a page whose header declares more than `max_decoded` bytes uncompressed (arrow-rs
/// reserves that much before decompressing it), a dictionary page whose declared count of
/// values would take more than that decoded (arrow-rs reserves them too, found by
/// fuzzing), and bytes that are not a page header. A page whose size points past the chunk
/// ends the walk (arrow-rs reports that itself).
pub(super) fn check_pages(
    c: &ColumnChunkMetaData,
    gi: usize,
    data: &[u8],
    max_decoded: u64,
) -> Result<(), String> {
    let Some((start, len)) = byte_range(c, data.len() as u64) else {
        return Ok(()); // refused when opened
    };
    let (mut at, end) = (start as usize, (start + len) as usize);
    while at < end {
        let Some((header_len, uncompressed, compressed, dictionary)) = page_header(&data[at..end])
        else {
            // Refused here rather than left to arrow-rs, whose Thrift reader walks a hostile
            // header's claimed container sizes (a second per 1 KB file, found by fuzzing).
            return Err(format!(
                "row group {gi}, column {}: the bytes at offset {at} are not a page header \
                 (the file is corrupt)",
                c.column_path()
            ));
        };
        if uncompressed as u64 > max_decoded {
            return Err(chute_core::limits::exceeded(
                &format!(
                    "row group {gi}, column {}: the page at offset {at}",
                    c.column_path()
                ),
                uncompressed as u64,
                "bytes uncompressed",
                "max_decoded_bytes",
                max_decoded,
            ));
        }
        let values = u64::from(dictionary.unwrap_or(0));
        if values * DICTIONARY_VALUE_BYTES > max_decoded {
            return Err(chute_core::limits::exceeded(
                &format!(
                    "row group {gi}, column {}: the dictionary page at offset {at} ({values} \
                     values)",
                    c.column_path()
                ),
                values * DICTIONARY_VALUE_BYTES,
                "bytes decoded",
                "max_decoded_bytes",
                max_decoded,
            ));
        }
        at = match at
            .checked_add(header_len)
            .and_then(|a| a.checked_add(compressed as usize))
        {
            Some(next) => next,
            None => return Ok(()),
        };
    }
    Ok(())
}

/// Walks the Thrift footer of the Parquet file `data` before arrow-rs parses it: arrow-rs's
/// reader walks the element counts a hostile footer claims (a list of 2^60 bools in a 1 KB
/// file kept it busy for minutes: found by the `parquet_file` fuzz target), where this
/// walker refuses a count past the bytes left, and whatever arrow-rs would read otherwise
/// than the protocol says (see [`thrift`]). Returns the footer as arrow-rs is to read it
/// (mended: see [`thrift::mended`]), or `None` for a file without a readable footer length,
/// left to arrow-rs to report.
pub(super) fn footer(data: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let n = data.len();
    if n < 12 || &data[n - 4..] != b"PAR1" {
        return Ok(None);
    }
    let len = u32::from_le_bytes(data[n - 8..n - 4].try_into().expect("4 bytes")) as usize;
    if len > n - 8 {
        return Ok(None);
    }
    match thrift::mended(&data[n - 8 - len..n - 8], FILE_META_DATA) {
        Some(footer) => Ok(Some(footer)),
        None => Err(format!(
            "its footer ({len} bytes) is not valid Thrift: a count, length or type inside it \
             is corrupt"
        )),
    }
}

/// [`footer`]'s verdict alone.
#[cfg(test)]
pub(super) fn check_footer(data: &[u8]) -> Result<(), String> {
    footer(data).map(drop)
}

/// The metadata of the Parquet file `data` as arrow-rs reads it, from its [`footer`].
pub(super) fn metadata(
    data: &bytes::Bytes,
) -> Result<parquet::arrow::arrow_reader::ArrowReaderMetadata, String> {
    use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
    let footer = footer(data)?;
    chute_core::quiet::catch_quietly(|| {
        match footer {
            Some(footer) => {
                parquet::file::metadata::ParquetMetaDataReader::decode_metadata(&footer)
                    .and_then(|m| ArrowReaderMetadata::try_new(m.into(), ArrowReaderOptions::new()))
            }
            None => ArrowReaderMetadata::load(data, ArrowReaderOptions::new()),
        }
        .map_err(|e| format!("not a readable Parquet file: {e}"))
    })
    .map_err(|e| format!("not a readable Parquet file: {e}"))
    .and_then(|r| r)
}

/// A page header, as far as chute reads pages itself ([`super::flat`]): the fields of
/// Parquet's Thrift `PageHeader` (compact protocol) a flat numeric column needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Header {
    /// The header's own length in bytes.
    pub(super) len: usize,
    /// The page type: 0 a data page, 1 an index page, 2 a dictionary page, 3 a data page v2.
    pub(super) kind: i32,
    pub(super) uncompressed: u32,
    pub(super) compressed: u32,
    /// Values in the page (a dictionary page's entries).
    pub(super) values: u32,
    /// The values' encoding.
    pub(super) encoding: i32,
    /// A data page's definition level encoding (v1).
    pub(super) def_encoding: i32,
    /// A v2 page's nulls, and the bytes of its levels (which are never compressed).
    pub(super) nulls: u32,
    pub(super) def_bytes: u32,
    pub(super) rep_bytes: u32,
    /// A v2 page's values are compressed (the default).
    pub(super) v2_compressed: bool,
    /// A dictionary page's count of values (field 1 of its `DictionaryPageHeader`).
    pub(super) dictionary: Option<u32>,
}

/// The header at the start of `bytes`, or `None` if the bytes are not one or a size or
/// count is negative. The header is also walked as arrow-rs reads it.
pub(super) fn header(bytes: &[u8]) -> Option<Header> {
    let h = parse_header(bytes)?;
    thrift::reads_as_arrow_rs(&bytes[..h.len], PAGE_HEADER)?;
    Some(h)
}

/// [`header`] without the walk as arrow-rs reads it: for the headers of a column chunk that
/// [`check_pages`] has walked already (chute's own reader reads them again and again when
/// pieces are read out of order).
pub(super) fn parse_header(bytes: &[u8]) -> Option<Header> {
    let mut r = Compact::new(bytes);
    let size = |v: i64| u32::try_from(v).ok();
    let enumerant = |v: i64| i32::try_from(v).ok();
    let mut h = Header {
        v2_compressed: true,
        ..Header::default()
    };
    let (mut uncompressed, mut compressed) = (None, None);
    let mut last = 0;
    while let Some((id, ty)) = r.field(&mut last)? {
        match (id, ty) {
            (1, I32) => h.kind = enumerant(r.zigzag()?)?,
            (2, I32) => uncompressed = Some(size(r.zigzag()?)?),
            (3, I32) => compressed = Some(size(r.zigzag()?)?),
            (5 | 7 | 8, STRUCT) => {
                let mut inner = 0;
                while let Some((field, ty)) = r.field(&mut inner)? {
                    match (id, field, ty) {
                        (_, 1, I32) => {
                            h.values = size(r.zigzag()?)?;
                            if id == 7 {
                                h.dictionary = Some(h.values);
                            }
                        }
                        (5 | 7, 2, I32) | (8, 4, I32) => h.encoding = enumerant(r.zigzag()?)?,
                        (5, 3, I32) => h.def_encoding = enumerant(r.zigzag()?)?,
                        (8, 2, I32) => h.nulls = size(r.zigzag()?)?,
                        (8, 5, I32) => h.def_bytes = size(r.zigzag()?)?,
                        (8, 6, I32) => h.rep_bytes = size(r.zigzag()?)?,
                        (8, 7, thrift::TRUE | thrift::FALSE) => {
                            h.v2_compressed = ty == thrift::TRUE;
                        }
                        _ => r.skip(ty, 1)?,
                    }
                }
            }
            _ => r.skip(ty, 0)?,
        }
    }
    h.len = r.at;
    h.uncompressed = uncompressed?;
    h.compressed = compressed?;
    Some(h)
}

/// A page header's length, its uncompressed and compressed sizes and, for a dictionary
/// page, its count of values (see [`header`]).
fn page_header(bytes: &[u8]) -> Option<(usize, u32, u32, Option<u32>)> {
    let h = header(bytes)?;
    Some((h.len, h.uncompressed, h.compressed, h.dictionary))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_groups_columns_are_bounded_together() {
        use std::sync::Arc;
        // Ten int32 columns of 1,000 rows (no nulls, so no definition levels): 4,000 bytes
        // decoded each, 40,000 together.
        let columns: Vec<(String, arrow_array::ArrayRef)> = (0..10)
            .map(|c| {
                let a = arrow_array::Int32Array::from_iter_values(0..1000);
                (format!("c{c}"), Arc::new(a) as arrow_array::ArrayRef)
            })
            .collect();
        let batch = arrow_array::RecordBatch::try_from_iter(columns).unwrap();
        let mut data = Vec::new();
        let mut w = parquet::arrow::ArrowWriter::try_new(&mut data, batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let meta = parquet::file::metadata::ParquetMetaDataReader::new()
            .parse_and_finish(&bytes::Bytes::from(data.clone()))
            .unwrap();
        let rg = meta.row_group(0);
        let len = data.len() as u64;
        assert_eq!(check_group(rg, 0, len, 40_000, |_| Some(1)), Ok(40_000));
        let err = check_group(rg, 0, len, 10_000, |_| Some(1)).unwrap_err();
        assert!(
            err.contains("together") && err.contains("max_decoded_bytes"),
            "{err}"
        );
        // One column projected: within the limit.
        assert_eq!(
            check_group(rg, 0, len, 10_000, |l| (l == 3).then_some(1)),
            Ok(4_000)
        );
        // A fixed-size list of 4 values a row counts four times.
        let err = check_group(rg, 0, len, 10_000, |l| (l == 3).then_some(4)).unwrap_err();
        assert!(err.contains("column \"c3\""), "{err}");
    }

    #[test]
    fn reads_sizes_and_skips_the_rest() {
        // type=0 (i32), uncompressed=100, compressed=50, then a struct field 5 holding an
        // i32 (field 1) and a binary field it does not know (9), then stop.
        let mut h = vec![0x15, 0x00, 0x15, 200, 1, 0x15, 100];
        h.extend([0x2c, 0x15, 0x04, 0x88, 0x02, b'h', b'i', 0x00]);
        h.push(0x00);
        assert_eq!(page_header(&h), Some((h.len(), 100, 50, None)));
        // A dictionary page (type 2) declaring 2^31 - 1 values: its count is read (and
        // `check_pages` refuses it by max_decoded_bytes: found by the parquet_file fuzz
        // target, where arrow-rs reserved 16 GiB for them).
        let mut d = vec![0x15, 0x04, 0x15, 200, 1, 0x15, 100, 0x4c];
        d.extend([0x15, 0xfe, 0xff, 0xff, 0xff, 0x0f, 0x15, 0x00, 0x00, 0x00]);
        assert_eq!(
            page_header(&d),
            Some((d.len(), 100, 50, Some(i32::MAX as u32)))
        );
        assert!(u64::from(i32::MAX as u32) * DICTIONARY_VALUE_BYTES > 1 << 30);
        // Cut short, negative, or not compact thrift: not a header.
        assert_eq!(page_header(&h[..5]), None);
        assert_eq!(
            page_header(&[0x15, 0x00, 0x15, 0x01, 0x15, 0x02, 0x00]),
            None
        );
        assert_eq!(page_header(&[0x1f, 0x00]), None);
        // A list of a million elements in two bytes ends at the input's end.
        assert_eq!(page_header(&[0x19, 0xf5, 0x80, 0x89, 0x7a]), None);
        // A map claiming 2^63 entries of bools (which take a byte each there): refused at
        // once, not looped over (found by the parquet_file fuzz target: a two-minute walk).
        let map = [
            0x1b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x11, 0x00,
        ];
        let start = std::time::Instant::now();
        assert_eq!(page_header(&map), None);
        assert!(start.elapsed() < std::time::Duration::from_secs(1));
        // A footer holding a list that claims 2^60 bools: refused at once.
        let mut file = b"PAR1".to_vec();
        let footer = [
            0x19, 0xf1, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x10, 0x00,
        ];
        file.extend(footer);
        file.extend((footer.len() as u32).to_le_bytes());
        file.extend(b"PAR1");
        let start = std::time::Instant::now();
        assert!(
            check_footer(&file)
                .unwrap_err()
                .contains("not valid Thrift")
        );
        assert!(start.elapsed() < std::time::Duration::from_secs(1));
        // A footer with an unknown field (id 100) listing 7 bools, which are the bytes of a
        // field listing 2^31 - 1 bools to arrow-rs (it skips a bool there without taking a
        // byte): refused at once. Found by the parquet_file fuzz target (minutes in arrow-rs).
        let footer = [
            0x09, 0xc8, 0x01, 0x71, 0x19, 0xf1, 0xff, 0xff, 0xff, 0xff, 0x07, 0x00,
        ];
        assert_eq!(Compact::new(&footer).skip(thrift::STRUCT, 0), None);
        assert_eq!(thrift::reads_as_arrow_rs(&footer, FILE_META_DATA), None);
        let mut file = b"PAR1".to_vec();
        file.extend(footer);
        file.extend((footer.len() as u32).to_le_bytes());
        file.extend(b"PAR1");
        assert!(check_footer(&file).is_err());
        // The same in a page header.
        let mut header = vec![0x15, 0x00, 0x15, 200, 1, 0x15, 100];
        header.extend(&footer);
        assert_eq!(page_header(&header), None);
        // A header whose unknown field lists 8 bools that arrow-rs, taking no byte for them,
        // reads as a second uncompressed size of 2^31 - 1 (and a stop): refused, where a
        // walk reading the sizes as the protocol says would see only the first (100).
        let mut header = vec![0x15, 0x00, 0x15, 200, 1, 0x15, 100, 0x09, 0xc8, 0x01, 0x81];
        header.extend([0x05, 0x04, 0xfe, 0xff, 0xff, 0xff, 0x0f, 0x00]);
        header.push(0x00);
        assert_eq!(page_header(&header), None);
        // A field header of type 0 other than the stop byte (arrow-rs would stop there).
        assert_eq!(
            page_header(&[0x15, 0x00, 0x15, 200, 1, 0x15, 100, 0x10, 0x00]),
            None
        );
        // A well-formed footer walks (here one made of a stop byte) and a file too short for
        // a footer is left to arrow-rs.
        assert!(check_footer(b"PAR1\x00\x01\x00\x00\x00PAR1").is_ok());
        assert!(check_footer(b"PAR1").is_ok());
    }
}
