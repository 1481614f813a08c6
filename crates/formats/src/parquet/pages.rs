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

use parquet::basic::Type as Physical;
use parquet::file::metadata::{ColumnChunkMetaData, RowGroupMetaData};

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

/// Checks row group `gi` of a file of `file_len` bytes when it is opened: every column
/// chunk lies in the file, and no leaf of a projected column (`projected(leaf)`) decodes to
/// more than `max_decoded` bytes (its row count times its width). The reason names what and
/// the limit.
pub(super) fn check_group(
    rg: &RowGroupMetaData,
    gi: usize,
    file_len: u64,
    max_decoded: u64,
    projected: impl Fn(usize) -> bool,
) -> Result<(), String> {
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
    for (leaf, c) in rg.columns().iter().enumerate() {
        if !projected(leaf) {
            continue;
        }
        let decoded = rows.saturating_mul(width(c));
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
    Ok(())
}

/// Walks the page headers of column chunk `c` of row group `gi` in `data` (the file) and
/// refuses a page whose header declares more than `max_decoded` bytes uncompressed (arrow-rs
/// reserves that much before decompressing it), and bytes that are not a page header. A
/// page whose size points past the chunk ends the walk (arrow-rs reports that itself).
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
        let Some((header_len, uncompressed, compressed)) = page_header(&data[at..end]) else {
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
/// walker refuses a count past the bytes left. It walks the footer twice: as the compact
/// protocol says, and as arrow-rs skips fields it does not know (see [`skips_as_arrow_rs`]).
/// Files without a readable footer length are left to arrow-rs to report.
pub(super) fn check_footer(data: &[u8]) -> Result<(), String> {
    let n = data.len();
    if n < 12 || &data[n - 4..] != b"PAR1" {
        return Ok(());
    }
    let len = u32::from_le_bytes(data[n - 8..n - 4].try_into().expect("4 bytes")) as usize;
    if len > n - 8 {
        return Ok(());
    }
    let footer = &data[n - 8 - len..n - 8];
    let mut r = Compact::new(footer);
    match r.skip(STRUCT, 0).and_then(|()| skips_as_arrow_rs(footer)) {
        Some(()) => Ok(()),
        None => Err(format!(
            "its footer ({len} bytes) is not valid Thrift: a count, length or type inside it \
             is corrupt"
        )),
    }
}

/// A page header's length and its uncompressed and compressed sizes (fields 2 and 3 of
/// Parquet's Thrift `PageHeader`, compact protocol), or `None` if the bytes are not one or
/// a size is negative.
fn page_header(bytes: &[u8]) -> Option<(usize, u32, u32)> {
    let mut r = Compact::new(bytes);
    let (mut uncompressed, mut compressed) = (None, None);
    let mut last = 0i64;
    loop {
        let (id, ty) = match r.field(&mut last)? {
            None => break,
            Some(f) => f,
        };
        match (id, ty) {
            (2, I32) => uncompressed = Some(r.zigzag()?),
            (3, I32) => compressed = Some(r.zigzag()?),
            _ => r.skip(ty, 0)?,
        }
    }
    let size = |v: Option<i64>| u32::try_from(v?).ok();
    let at = r.at;
    skips_as_arrow_rs(&bytes[..at])?;
    Some((at, size(uncompressed)?, size(compressed)?))
}

/// Walks the struct at the start of `bytes` the way arrow-rs's `skip_till_depth` skips a
/// field it does not know: a bool in a list, set or map takes no byte there (where the
/// compact protocol gives it one), so arrow-rs reads the bytes after such a list as
/// something else, which may be a list claiming 2^31 bools that it then loops over, taking
/// no byte per element. Found by the `parquet_file` fuzz target (a 1 KB footer took arrow-rs
/// minutes). Any count past the bytes left is refused here as in the compact walk, so
/// arrow-rs, reading the same bytes the same way, meets none.
fn skips_as_arrow_rs(bytes: &[u8]) -> Option<()> {
    let mut r = Compact {
        empty_bools: true,
        ..Compact::new(bytes)
    };
    r.skip(STRUCT, 0)
}

// Thrift compact protocol types.
const TRUE: u8 = 1;
const FALSE: u8 = 2;
const I8: u8 = 3;
const I16: u8 = 4;
const I32: u8 = 5;
const I64: u8 = 6;
const DOUBLE: u8 = 7;
const BINARY: u8 = 8;
const LIST: u8 = 9;
const SET: u8 = 10;
const MAP: u8 = 11;
const STRUCT: u8 = 12;
const UUID: u8 = 13;

/// Nesting deeper than this is not a page header or a footer (Parquet's go about 10 deep).
const MAX_DEPTH: u32 = 32;

/// A cursor over Thrift compact-protocol bytes: just enough to find two fields and skip
/// the rest.
struct Compact<'a> {
    bytes: &'a [u8],
    at: usize,
    /// A bool in a list, set or map takes no byte (arrow-rs's skipping), not one.
    empty_bools: bool,
}

impl<'a> Compact<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Compact {
            bytes,
            at: 0,
            empty_bools: false,
        }
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

    fn zigzag(&mut self) -> Option<i64> {
        let v = self.varint()?;
        Some((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    /// The next field's id and type, `None` at the struct's end.
    fn field(&mut self, last: &mut i64) -> Option<Option<(i64, u8)>> {
        let b = self.byte()?;
        if b == 0 {
            return Some(None);
        }
        let (delta, ty) = (b >> 4, b & 0x0f);
        let id = if delta == 0 {
            self.zigzag()?
        } else {
            *last + i64::from(delta)
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

    /// Skips an element of a list, set or map of type `ty` (a bool there takes a byte, or
    /// none when walking as arrow-rs skips).
    fn element(&mut self, ty: u8, depth: u32) -> Option<()> {
        if ty == TRUE || ty == FALSE {
            self.advance(usize::from(!self.empty_bools))
        } else {
            self.skip(ty, depth + 1)
        }
    }

    fn skip(&mut self, ty: u8, depth: u32) -> Option<()> {
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
                let h = self.byte()?;
                let n = match h >> 4 {
                    15 => self.varint()?,
                    n => u64::from(n),
                };
                self.fits(n)?;
                for _ in 0..n {
                    self.element(h & 0x0f, depth)?;
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sizes_and_skips_the_rest() {
        // type=0 (i32), uncompressed=100, compressed=50, then a struct field 5 holding an
        // i32 and a binary, then stop.
        let mut h = vec![0x15, 0x00, 0x15, 200, 1, 0x15, 100];
        h.extend([0x1c, 0x15, 0x04, 0x18, 0x02, b'h', b'i', 0x00]);
        h.push(0x00);
        assert_eq!(page_header(&h), Some((h.len(), 100, 50)));
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
        assert!(Compact::new(&footer).skip(STRUCT, 0).is_some());
        assert_eq!(skips_as_arrow_rs(&footer), None);
        let mut file = b"PAR1".to_vec();
        file.extend(footer);
        file.extend((footer.len() as u32).to_le_bytes());
        file.extend(b"PAR1");
        assert!(check_footer(&file).is_err());
        // The same in a page header.
        let mut header = vec![0x15, 0x00, 0x15, 200, 1, 0x15, 100];
        header.extend(&footer);
        assert_eq!(page_header(&header), None);
        // A well-formed footer walks (here one made of a stop byte) and a file too short for
        // a footer is left to arrow-rs.
        assert!(check_footer(b"PAR1\x00\x01\x00\x00\x00PAR1").is_ok());
        assert!(check_footer(b"PAR1").is_ok());
    }
}
