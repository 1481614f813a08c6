//! chute's own decoder for flat numeric columns: a top-level `int32`, `int64`, `float` or
//! `double` column (no lists around it) whose pages are PLAIN or dictionary-encoded and
//! uncompressed or compressed by snappy, zstd, LZ4 (raw), or gzip: what pyarrow, Polars and
//! Spark write for numeric features by default. A page with a few nulls (at most a sixteenth
//! of its rows) is read too: its definition levels become the array's validity bits.
//!
//! arrow-rs decodes such a column into buffers it zero-fills first (each page decompressed,
//! each dictionary, each batch of values), and it reads a dictionary page into a buffer of
//! its own once per reader: a third of a file-order epoch went to `memset`. This decoder
//! decompresses pages into buffers that are recycled, their bytes already written
//! ([`Scratch`]), and appends values to the output with no fill ahead of them. It is a
//! reader that goes on where the last piece left it, like arrow-rs's, and skips whole pages
//! by their headers to start at a later row.
//!
//! Anything it does not read exactly as the Parquet format says (another encoding, a level
//! that is neither 0 nor 1, a null count that its levels contradict, a page cut short, an
//! index past the dictionary, an unknown page type), and a page of more nulls, makes it give
//! the piece back ([`Unread`]): arrow-rs then decodes it, with its own errors, and what it
//! reports stays what chute reports.

use std::io::Read;
use std::sync::{Arc, Mutex};

use arrow_array::types::{Float32Type, Float64Type, Int32Type, Int64Type, UInt32Type, UInt64Type};
use arrow_array::{ArrayRef, ArrowPrimitiveType, PrimitiveArray};
use arrow_buffer::bit_chunk_iterator::{BitChunks, UnalignedBitChunk};
use arrow_buffer::{BooleanBufferBuilder, Buffer, NullBuffer, ScalarBuffer};
use arrow_schema::DataType;
use bytes::Bytes;
use parquet::basic::{Compression, Encoding};

use super::pages::{self, Header};

/// A page or column chunk this decoder does not read (arrow-rs decodes the piece instead).
#[derive(Debug)]
pub(super) struct Unread;

/// Page types (parquet.thrift `PageType`).
const DATA_PAGE: i32 = 0;
const DICTIONARY_PAGE: i32 = 2;
const DATA_PAGE_V2: i32 = 3;

/// Encodings (parquet.thrift `Encoding`).
const PLAIN: i32 = 0;
const PLAIN_DICTIONARY: i32 = 2;
const RLE: i32 = 3;
const RLE_DICTIONARY: i32 = 8;

/// Indices decoded at a time, into a buffer on the stack (it stays in L1).
const BATCH: usize = 1024;

/// Page buffers kept for reuse at most.
const KEPT: usize = 64;

/// Largest page buffer kept for reuse.
const KEPT_BYTES: usize = 16 << 20;

/// A value of a flat column as stored: 4 or 8 little-endian bytes.
pub(super) trait Word: Copy + Default + arrow_buffer::ArrowNativeType {
    const BYTES: usize;
    fn from_le(b: &[u8]) -> Self;
}

impl Word for u32 {
    const BYTES: usize = 4;
    #[inline(always)]
    fn from_le(b: &[u8]) -> Self {
        u32::from_le_bytes(b.try_into().expect("4 bytes"))
    }
}

impl Word for u64 {
    const BYTES: usize = 8;
    #[inline(always)]
    fn from_le(b: &[u8]) -> Self {
        u64::from_le_bytes(b.try_into().expect("8 bytes"))
    }
}

/// Buffers that pages are decompressed into, handed from one reader to the next with their
/// bytes written, so a page never waits on a zero fill (only a buffer's growth is filled).
#[derive(Default)]
pub(super) struct Scratch(Mutex<Vec<Vec<u8>>>);

impl Scratch {
    /// A kept buffer, or a new one. The list is only tried, never waited on (as
    /// `chute_core::alloc` does: a list another thread holds at that instant, or held when
    /// the process forked, is passed by).
    fn take(&self) -> Vec<u8> {
        match self.0.try_lock() {
            Ok(mut kept) => kept.pop().unwrap_or_default(),
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner().pop().unwrap_or_default(),
            Err(std::sync::TryLockError::WouldBlock) => Vec::new(),
        }
    }

    /// Keeps `buf` for another reader, unless [`KEPT`] are kept or it is larger than
    /// [`KEPT_BYTES`] (a page that large is rare: its buffer is not held on to).
    fn give(&self, buf: Vec<u8>) {
        if buf.capacity() == 0 || buf.capacity() > KEPT_BYTES {
            return;
        }
        let mut kept = match self.0.try_lock() {
            Ok(kept) => kept,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        if kept.len() < KEPT {
            kept.push(buf);
        }
    }
}

/// The codecs read here.
#[derive(Debug, Clone, Copy)]
enum Codec {
    None,
    Snappy,
    Gzip,
    Lz4Raw,
    Zstd,
}

impl Codec {
    fn of(c: Compression) -> Option<Codec> {
        Some(match c {
            Compression::UNCOMPRESSED => Codec::None,
            Compression::SNAPPY => Codec::Snappy,
            Compression::GZIP(_) => Codec::Gzip,
            Compression::LZ4_RAW => Codec::Lz4Raw,
            Compression::ZSTD(_) => Codec::Zstd,
            _ => return None,
        })
    }

    /// Decompresses `input` into `out[..size]` (`out` grows, never shrinks: its bytes stay
    /// written for the next page). `None` unless exactly `size` bytes come out.
    fn decompress(self, input: &[u8], out: &mut Vec<u8>, size: usize) -> Option<()> {
        if out.len() < size {
            out.resize(size, 0);
        }
        let dst = &mut out[..size];
        let n = match self {
            Codec::None => {
                dst.copy_from_slice(input.get(..size)?);
                size
            }
            Codec::Snappy => snap::raw::Decoder::new().decompress(input, dst).ok()?,
            Codec::Lz4Raw => lz4_flex::block::decompress_into(input, dst).ok()?,
            Codec::Zstd => zstd::zstd_safe::decompress(dst, input).ok()?,
            Codec::Gzip => {
                let mut r = flate2::read::MultiGzDecoder::new(input);
                r.read_exact(dst).ok()?;
                // Nothing may follow the page's bytes.
                let mut more = [0u8; 1];
                if r.read(&mut more).ok()? != 0 {
                    return None;
                }
                size
            }
        };
        (n == size).then_some(())
    }
}

/// The bytes a value of Arrow type `dt` takes, if it is one this decoder reads (a type
/// whose values are the stored ones, bit for bit).
pub(super) fn width(dt: &DataType) -> Option<usize> {
    match dt {
        DataType::Int32 | DataType::UInt32 | DataType::Float32 => Some(4),
        DataType::Int64 | DataType::UInt64 | DataType::Float64 => Some(8),
        _ => None,
    }
}

/// `rows` values of Arrow type `dt` (see [`width`]) in `values`, with `valid` marking the
/// present ones (all where `None`), as an array.
pub(super) fn array(
    dt: &DataType,
    values: Buffer,
    rows: usize,
    valid: Option<BooleanBufferBuilder>,
) -> Option<ArrayRef> {
    fn of<A: ArrowPrimitiveType>(values: Buffer, rows: usize, n: Option<NullBuffer>) -> ArrayRef {
        Arc::new(PrimitiveArray::<A>::new(
            ScalarBuffer::new(values, 0, rows),
            n,
        ))
    }
    if values.len() != rows * width(dt)? || valid.as_ref().is_some_and(|v| v.len() != rows) {
        return None;
    }
    let n = valid.map(|mut v| NullBuffer::new(v.finish()));
    Some(match dt {
        DataType::Int32 => of::<Int32Type>(values, rows, n),
        DataType::UInt32 => of::<UInt32Type>(values, rows, n),
        DataType::Float32 => of::<Float32Type>(values, rows, n),
        DataType::Int64 => of::<Int64Type>(values, rows, n),
        DataType::UInt64 => of::<UInt64Type>(values, rows, n),
        DataType::Float64 => of::<Float64Type>(values, rows, n),
        _ => return None,
    })
}

/// Whether this decoder reads a column chunk: a flat column (`max_rep_level` 0, a
/// `max_def_level` of at most 1) whose stored values are those of Arrow type `dt` bit for
/// bit (`int32` for `Int32` and `UInt32`, `float` for `Float32`, and so on), in a codec read
/// here, whose footer lists no encoding but PLAIN, dictionaries and levels.
#[allow(deprecated)] // BIT_PACKED: old writers list it for levels they do not write
pub(super) fn reads(c: &parquet::file::metadata::ColumnChunkMetaData, dt: &DataType) -> bool {
    use parquet::basic::Type as Physical;
    let d = c.column_descr();
    let same = matches!(
        (d.physical_type(), dt),
        (Physical::INT32, DataType::Int32 | DataType::UInt32)
            | (Physical::FLOAT, DataType::Float32)
            | (Physical::INT64, DataType::Int64 | DataType::UInt64)
            | (Physical::DOUBLE, DataType::Float64)
    );
    same && d.max_rep_level() == 0
        && d.max_def_level() <= 1
        && Codec::of(c.compression()).is_some()
        && c.encodings().all(|e| {
            matches!(
                e,
                Encoding::PLAIN
                    | Encoding::PLAIN_DICTIONARY
                    | Encoding::RLE_DICTIONARY
                    | Encoding::RLE
                    | Encoding::BIT_PACKED
            )
        })
}

/// An RLE / bit-packed hybrid run being read (Parquet's levels and dictionary indices).
#[derive(Debug, Clone, Copy)]
enum Run {
    /// `left` repeats of `value`.
    Repeat { value: u32, left: usize },
    /// `left` packed values more, of a run from byte `start` of the page whose first `done`
    /// values have been read.
    Packed {
        start: usize,
        done: usize,
        left: usize,
    },
}

/// A reader of RLE / bit-packed hybrid data in `buf[at..end]` of `width` bits a value.
#[derive(Debug, Clone, Copy)]
struct Hybrid {
    at: usize,
    end: usize,
    width: u32,
    run: Run,
}

impl Hybrid {
    fn new(at: usize, end: usize, width: u32) -> Option<Hybrid> {
        (width <= 32).then_some(Hybrid {
            at,
            end,
            width,
            run: Run::Repeat { value: 0, left: 0 },
        })
    }

    /// Starts the next run; `None` at the end of the data or if a run does not fit in it.
    fn next_run(&mut self, buf: &[u8]) -> Option<()> {
        let mut header = 0u64;
        let mut shift = 0;
        loop {
            let b = *buf.get(self.at..self.end)?.first()?;
            self.at += 1;
            header |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                break;
            }
            shift += 7;
            if shift > 56 {
                return None;
            }
        }
        let count = usize::try_from(header >> 1).ok()?;
        if header & 1 == 1 {
            // `count` groups of 8 values, `width` bytes a group.
            let bytes = count.checked_mul(self.width as usize)?;
            let start = self.at;
            self.at = start.checked_add(bytes).filter(|&a| a <= self.end)?;
            self.run = Run::Packed {
                start,
                done: 0,
                left: count.checked_mul(8)?,
            };
        } else {
            let bytes = self.width.div_ceil(8) as usize;
            let raw = buf.get(self.at..self.at.checked_add(bytes)?.min(self.end))?;
            if raw.len() != bytes {
                return None;
            }
            let mut v = [0u8; 4];
            v[..bytes].copy_from_slice(raw);
            self.at += bytes;
            self.run = Run::Repeat {
                value: u32::from_le_bytes(v),
                left: count,
            };
        }
        Some(())
    }

    /// Reads `n` values, handing them to `f` a run (or [`BATCH`] values) at a time as a
    /// slice or as `(value, repeats)`.
    fn read(
        &mut self,
        buf: &[u8],
        mut n: usize,
        mut each: impl FnMut(Values<'_>) -> Option<()>,
    ) -> Option<()> {
        let mask = if self.width == 32 {
            u32::MAX
        } else {
            (1u32 << self.width) - 1
        };
        let mut out = [0u32; BATCH];
        while n > 0 {
            match &mut self.run {
                Run::Repeat { left: 0, .. } | Run::Packed { left: 0, .. } => {
                    self.next_run(buf)?;
                }
                Run::Repeat { value, left } => {
                    let k = n.min(*left);
                    *left -= k;
                    n -= k;
                    each(Values::Repeat(*value, k))?;
                }
                Run::Packed { start, done, left } => {
                    let k = n.min(*left).min(BATCH);
                    let w = self.width as usize;
                    let one = |i: usize| {
                        let bit = *start * 8 + i * w;
                        (load(buf, bit >> 3) >> (bit & 7)) as u32 & mask
                    };
                    // The values before the next group of 8 one by one, then whole groups
                    // (`w` bytes each) by the unpacker for this width, then the rest.
                    let head = ((8 - *done % 8) % 8).min(k);
                    for (i, slot) in out[..head].iter_mut().enumerate() {
                        *slot = one(*done + i);
                    }
                    let groups = (k - head) / 8;
                    let from = *start + (*done + head) / 8 * w;
                    buf.get(from..from + groups * w)?;
                    unpack(w, buf, from, &mut out[head..head + groups * 8]);
                    let tail = head + groups * 8;
                    for (i, slot) in out[tail..k].iter_mut().enumerate() {
                        *slot = one(*done + tail + i);
                    }
                    *done += k;
                    *left -= k;
                    n -= k;
                    each(Values::Slice(&out[..k]))?;
                }
            }
        }
        Some(())
    }

    /// Reads `n` one-bit values (definition levels): appended to `to` as bits when `to` is
    /// given (a bit-packed run's bytes are copied as they are: they are Arrow's validity bits
    /// already), else passed over. Returns how many are 1; `None` where a value is over 1 or
    /// the data ends.
    fn bits(
        &mut self,
        buf: &[u8],
        mut n: usize,
        mut to: Option<&mut BooleanBufferBuilder>,
    ) -> Option<usize> {
        if self.width != 1 {
            return None;
        }
        let mut ones = 0;
        while n > 0 {
            match &mut self.run {
                Run::Repeat { left: 0, .. } | Run::Packed { left: 0, .. } => {
                    self.next_run(buf)?;
                }
                Run::Repeat { value, left } => {
                    if *value > 1 {
                        return None;
                    }
                    let k = n.min(*left);
                    *left -= k;
                    n -= k;
                    if let Some(to) = to.as_deref_mut() {
                        to.append_n(k, *value == 1);
                    }
                    ones += k * *value as usize;
                }
                Run::Packed { start, done, left } => {
                    let k = n.min(*left);
                    let bytes = buf.get(*start..*start + (*done + *left).div_ceil(8))?;
                    if let Some(to) = to.as_deref_mut() {
                        to.append_packed_range(*done..*done + k, bytes);
                    }
                    ones += UnalignedBitChunk::new(bytes, *done, k).count_ones();
                    *done += k;
                    *left -= k;
                    n -= k;
                }
            }
        }
        Some(ones)
    }

    /// Passes over `n` values.
    fn skip(&mut self, buf: &[u8], mut n: usize) -> Option<()> {
        while n > 0 {
            match &mut self.run {
                Run::Repeat { left: 0, .. } | Run::Packed { left: 0, .. } => {
                    self.next_run(buf)?;
                }
                Run::Repeat { left, .. } => {
                    let k = n.min(*left);
                    *left -= k;
                    n -= k;
                }
                Run::Packed { done, left, .. } => {
                    let k = n.min(*left);
                    *done += k;
                    *left -= k;
                    n -= k;
                }
            }
        }
        Some(())
    }
}

/// Values handed out by [`Hybrid::read`].
enum Values<'a> {
    Slice(&'a [u32]),
    Repeat(u32, usize),
}

/// Unpacks the groups of 8 values of `w` bits (`w` bytes a group) in `buf` from byte
/// `from` into `out` (8 values a group, `out.len() / 8` groups, which `buf` holds), by a
/// function compiled for each width: its shifts and offsets are constants.
fn unpack(w: usize, buf: &[u8], from: usize, out: &mut [u32]) {
    fn groups<const W: usize>(buf: &[u8], from: usize, out: &mut [u32]) {
        let mask = if W == 32 { u32::MAX } else { (1u32 << W) - 1 };
        let decode = |b: &[u8; 40], o: &mut [u32]| {
            for (i, slot) in o.iter_mut().enumerate() {
                let bit = i * W;
                let word = u64::from_le_bytes(b[bit / 8..bit / 8 + 8].try_into().expect("8"));
                *slot = (word >> (bit % 8)) as u32 & mask;
            }
        };
        for (g, o) in out.chunks_exact_mut(8).enumerate() {
            let at = from + g * W;
            match buf.get(at..at + 40) {
                // Read where it is (no copy: a copy's stores would stall the loads).
                Some(b) => decode(b.try_into().expect("40 bytes"), o),
                None => {
                    // Near the end of the page: the group with room after it for the loads.
                    let mut b = [0u8; 40];
                    b[..W].copy_from_slice(&buf[at..at + W]);
                    decode(&b, o);
                }
            }
        }
    }
    macro_rules! widths {
        ($($w:literal)*) => {
            match w {
                0 => out.fill(0),
                $($w => groups::<$w>(buf, from, out),)*
                _ => unreachable!("bit widths above 32 are refused by Hybrid::new"),
            }
        };
    }
    widths!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30
        31 32);
}

/// Eight bytes of `buf` from `at` as a little-endian word (zeros past its end: a packed
/// run's last values are inside it, their bits are all that is kept).
#[inline(always)]
fn load(buf: &[u8], at: usize) -> u64 {
    match buf.get(at..at + 8) {
        Some(b) => u64::from_le_bytes(b.try_into().expect("8 bytes")),
        None => {
            let mut w = [0u8; 8];
            let tail = buf.get(at..).unwrap_or_default();
            w[..tail.len()].copy_from_slice(tail);
            u64::from_le_bytes(w)
        }
    }
}

/// How the current data page's values are stored.
enum Stored {
    /// PLAIN: the next value's byte in the page.
    Plain(usize),
    /// Dictionary indices.
    Indices(Hybrid),
}

/// A data page's definition levels (1 bit each) where it holds a null: read along with
/// the values, a row at a time.
struct Levels {
    hybrid: Hybrid,
    buf: Bytes,
}

/// The data page being read: its rows left, where its values are, and its levels if it
/// holds nulls (its values are then only the present rows').
struct Page {
    left: usize,
    stored: Stored,
    levels: Option<Levels>,
    /// The page's bytes: decompressed into the reader's buffer, or (uncompressed v1 and v2
    /// pages) a view of the file.
    shared: Option<Bytes>,
}

/// Where each data page of a column chunk starts: `(its header's place in the chunk, the
/// chunk's row its first value is)`, in order. Walked from the headers once per chunk, the
/// first time a reader starts past row 0: readers of pieces in random order then go straight
/// to the page that holds their first row instead of walking every header before it.
pub(super) type PageIndex = Arc<[(usize, u64)]>;

/// A column chunk's values read in order, from any row on: the reader of one column of a
/// row group that [`super::ParquetSource`] keeps between pieces.
pub(super) struct Flat<T: Word> {
    /// The column chunk's bytes (a view of the file), its pages from the first.
    chunk: Bytes,
    /// The next page header's place in `chunk`.
    at: usize,
    codec: Codec,
    /// `max_def_level` is 1: data pages hold definition levels.
    optional: bool,
    dict: Option<Arc<Vec<T>>>,
    /// The chunk's page index, once a reader of it has walked one.
    index: Option<PageIndex>,
    page: Option<Page>,
    /// The decompressed page (taken from, and given back to, `scratch`).
    buf: Vec<u8>,
    /// The present rows' values of the rows being read from a page with nulls.
    present: Vec<T>,
    scratch: Arc<Scratch>,
}

impl<T: Word> Drop for Flat<T> {
    fn drop(&mut self) {
        self.scratch.give(std::mem::take(&mut self.buf));
    }
}

impl<T: Word> Flat<T> {
    /// A reader of column chunk `c` of a file whose bytes are `file`, from row `first` of
    /// its row group on (whole pages before it are passed: found in the chunk's page index,
    /// walked now if `index` is `None`). `dict` is the chunk's dictionary if another reader
    /// of it has one.
    pub(super) fn new(
        file: &Bytes,
        c: &parquet::file::metadata::ColumnChunkMetaData,
        first: u64,
        dict: Option<Arc<Vec<T>>>,
        index: Option<PageIndex>,
        scratch: Arc<Scratch>,
    ) -> Result<Self, Unread> {
        let (start, len) = pages::byte_range(c, file.len() as u64).ok_or(Unread)?;
        let mut flat = Flat {
            chunk: file.slice(start as usize..(start + len) as usize),
            at: 0,
            codec: Codec::of(c.compression()).ok_or(Unread)?,
            optional: c.column_descr().max_def_level() == 1,
            dict,
            index,
            page: None,
            buf: scratch.take(),
            present: Vec::new(),
            scratch,
        };
        let at = if first > 0 {
            flat.seek(first).ok_or(Unread)?
        } else {
            0
        };
        flat.skip_rows(first - at).ok_or(Unread)?;
        Ok(flat)
    }

    /// The dictionary read so far, for another reader of the same column chunk.
    pub(super) fn dictionary(&self) -> Option<Arc<Vec<T>>> {
        self.dict.clone()
    }

    /// The chunk's page index, if this reader has it, for the chunk's later readers.
    pub(super) fn page_index(&self) -> Option<PageIndex> {
        self.index.clone()
    }

    /// Moves to the data page holding row `first` (walking the page index first if there
    /// is none), having read the chunk's dictionary page if it has one and no other reader
    /// gave its dictionary. Returns the row the reader is at then (the page's first).
    fn seek(&mut self, first: u64) -> Option<u64> {
        if self.dict.is_none() {
            // A dictionary page is the chunk's first page.
            let h = self.next_header()?;
            if h.kind == DICTIONARY_PAGE {
                self.open_page(h)?;
            }
        }
        if self.index.is_none() {
            let (mut at, mut row, mut pages) = (0usize, 0u64, Vec::new());
            while at < self.chunk.len() {
                let h = pages::parse_header(self.chunk.get(at..)?)?;
                if h.kind == DATA_PAGE || h.kind == DATA_PAGE_V2 {
                    pages.push((at, row));
                    row += u64::from(h.values);
                }
                at = at.checked_add(h.len)?.checked_add(h.compressed as usize)?;
            }
            self.index = Some(pages.into());
        }
        let index = self.index.as_deref()?;
        let k = index.partition_point(|&(_, row)| row <= first);
        match k.checked_sub(1).and_then(|k| index.get(k)) {
            Some(&(at, row)) if at >= self.at => {
                self.at = at;
                Some(row)
            }
            _ => Some(0),
        }
    }

    /// Passes over the chunk's first `n` rows: whole pages by their headers, then values.
    fn skip_rows(&mut self, mut n: u64) -> Option<()> {
        while n > 0 {
            if self.page.as_ref().is_none_or(|p| p.left == 0) {
                let h = self.next_header()?;
                if (h.kind == DATA_PAGE || h.kind == DATA_PAGE_V2) && u64::from(h.values) <= n {
                    n -= u64::from(h.values);
                    self.at += h.len + h.compressed as usize;
                    continue;
                }
                self.open_page(h)?;
                continue;
            }
            let page = self.page.as_mut()?;
            let k = n.min(page.left as u64) as usize;
            let buf = page.shared.as_deref().unwrap_or(&self.buf);
            // The rows' values: those of the present ones.
            let m = match &mut page.levels {
                None => k,
                Some(l) => l.present(k)?,
            };
            match &mut page.stored {
                Stored::Plain(at) => *at += m * T::BYTES,
                Stored::Indices(h) => h.skip(buf, m)?,
            }
            page.left -= k;
            n -= k as u64;
        }
        Some(())
    }

    /// The header of the next page (`None` past the chunk's end or if it is not one); the
    /// chunk's headers have been checked by `pages::check_pages` when it was first read.
    fn next_header(&self) -> Option<Header> {
        pages::parse_header(self.chunk.get(self.at..)?)
    }

    /// Reads page `h` (at `self.at`): a dictionary page becomes the dictionary, a data page
    /// the page being read; index pages are passed. Moves `self.at` past it.
    fn open_page(&mut self, h: Header) -> Option<()> {
        let body = self.at + h.len;
        let end = body.checked_add(h.compressed as usize)?;
        let raw = self.chunk.get(body..end)?;
        self.at = end;
        let size = h.uncompressed as usize;
        match h.kind {
            // Another reader of the chunk has read its dictionary.
            DICTIONARY_PAGE if self.dict.is_some() => {}
            DICTIONARY_PAGE => {
                if h.encoding != PLAIN && h.encoding != PLAIN_DICTIONARY {
                    return None;
                }
                self.codec.decompress(raw, &mut self.buf, size)?;
                let n = h.values as usize;
                let bytes = self.buf.get(..n.checked_mul(T::BYTES)?)?;
                let mut dict = Vec::with_capacity(n);
                dict.extend(bytes.chunks_exact(T::BYTES).map(T::from_le));
                self.dict = Some(Arc::new(dict));
            }
            DATA_PAGE => {
                let values = h.values as usize;
                let shared = matches!(self.codec, Codec::None).then(|| self.chunk.slice(body..end));
                if shared.is_none() {
                    self.codec.decompress(raw, &mut self.buf, size)?;
                }
                let buf = match &shared {
                    Some(b) => b,
                    None => &self.buf[..size],
                };
                let (mut at, mut present, mut nulls) = (0, values, None);
                if self.optional {
                    if h.def_encoding != RLE {
                        return None;
                    }
                    let n = u32::from_le_bytes(buf.get(..4)?.try_into().ok()?) as usize;
                    let levels = 4..4usize.checked_add(n).filter(|&e| e <= buf.len())?;
                    present = count_present(&buf[levels.clone()], values)?;
                    sparse(present, values)?;
                    if present < values {
                        nulls = Some(match &shared {
                            Some(b) => b.slice(levels.clone()),
                            None => Bytes::copy_from_slice(&buf[levels.clone()]),
                        });
                    }
                    at = levels.end;
                }
                self.page = Some(Page {
                    left: values,
                    stored: self.stored(h.encoding, buf, at, present)?,
                    levels: match nulls {
                        Some(b) => Some(Levels::new(b)?),
                        None => None,
                    },
                    shared,
                });
            }
            DATA_PAGE_V2 => {
                let values = h.values as usize;
                if h.rep_bytes != 0 || (h.nulls != 0 && !self.optional) {
                    return None;
                }
                let levels = h.def_bytes as usize;
                let packed = raw.get(levels..)?;
                let mut present = values;
                if self.optional && levels > 0 {
                    present = count_present(raw.get(..levels)?, values)?;
                }
                if present != values.checked_sub(h.nulls as usize)? {
                    return None;
                }
                sparse(present, values)?;
                let nulls = (present < values).then(|| self.chunk.slice(body..body + levels));
                let size = size.checked_sub(levels)?;
                let shared = (!h.v2_compressed || matches!(self.codec, Codec::None))
                    .then(|| self.chunk.slice(body + levels..end));
                if shared.is_none() {
                    self.codec.decompress(packed, &mut self.buf, size)?;
                }
                let buf = match &shared {
                    Some(b) => b,
                    None => &self.buf[..size],
                };
                self.page = Some(Page {
                    left: values,
                    stored: self.stored(h.encoding, buf, 0, present)?,
                    levels: match nulls {
                        Some(b) => Some(Levels::new(b)?),
                        None => None,
                    },
                    shared,
                });
            }
            1 => {} // an index page: nothing to read
            _ => return None,
        }
        Some(())
    }

    /// Where a data page's `values` values start in its bytes `buf` (from `at`), in
    /// `encoding`: PLAIN bytes (all there), or dictionary indices (with a dictionary read).
    fn stored(&self, encoding: i32, buf: &[u8], at: usize, values: usize) -> Option<Stored> {
        match encoding {
            PLAIN => {
                let need = at.checked_add(values.checked_mul(T::BYTES)?)?;
                (need <= buf.len()).then_some(Stored::Plain(at))
            }
            PLAIN_DICTIONARY | RLE_DICTIONARY => {
                self.dict.as_ref()?;
                let width = u32::from(*buf.get(at)?);
                Hybrid::new(at + 1, buf.len(), width).map(Stored::Indices)
            }
            _ => None,
        }
    }

    /// Appends the next `n` rows' values to `out` (a null's is zero), and, from the first
    /// null on, every row's validity to `valid` (created then, with the rows before it
    /// valid); [`Unread`] where a page is not read here.
    pub(super) fn read(
        &mut self,
        mut n: usize,
        out: &mut Vec<T>,
        valid: &mut Option<BooleanBufferBuilder>,
    ) -> Result<(), Unread> {
        out.reserve(n);
        while n > 0 {
            if self.page.as_ref().is_none_or(|p| p.left == 0) {
                self.page = None;
                let h = self.next_header().ok_or(Unread)?;
                self.open_page(h).ok_or(Unread)?;
                continue;
            }
            let page = self.page.as_mut().ok_or(Unread)?;
            let k = n.min(page.left);
            let buf = page.shared.as_deref().unwrap_or(&self.buf);
            let dict = self.dict.as_deref().map(Vec::as_slice);
            match &mut page.levels {
                None => {
                    values(&mut page.stored, buf, dict, k, out).ok_or(Unread)?;
                    if let Some(v) = valid {
                        v.append_n(k, true);
                    }
                }
                Some(levels) => {
                    // The rows' validity (the levels' bits), then the present rows' values
                    // in one go, then the two merged: a null's value is zero.
                    let v = valid.get_or_insert_with(|| {
                        let mut v = BooleanBufferBuilder::new(out.capacity());
                        v.append_n(out.len(), true);
                        v
                    });
                    let base = v.len();
                    let m = levels.hybrid.bits(&levels.buf, k, Some(v)).ok_or(Unread)?;
                    let present = &mut self.present;
                    present.clear();
                    values(&mut page.stored, buf, dict, m, present).ok_or(Unread)?;
                    // One more, read (not kept) past the last present row's.
                    present.push(T::default());
                    // 64 rows at a time: all present (one copy), all null, or row by row.
                    let chunks = BitChunks::new(v.as_slice(), base, k);
                    let mut j = 0;
                    let mut merge = |word: u64, len: usize| {
                        if len == 64 && word == u64::MAX {
                            out.extend_from_slice(&present[j..j + 64]);
                            j += 64;
                        } else if word == 0 {
                            out.extend(std::iter::repeat_n(T::default(), len));
                        } else {
                            out.extend((0..len).map(|b| {
                                let x = word >> b & 1 == 1;
                                let p = present[j];
                                j += usize::from(x);
                                if x { p } else { T::default() }
                            }));
                        }
                    };
                    for word in chunks.iter() {
                        merge(word, 64);
                    }
                    merge(chunks.remainder_bits(), chunks.remainder_len());
                }
            }
            page.left -= k;
            n -= k;
        }
        Ok(())
    }
}

impl Levels {
    fn new(buf: Bytes) -> Option<Levels> {
        Some(Levels {
            hybrid: Hybrid::new(0, buf.len(), 1)?,
            buf,
        })
    }

    /// Passes over `k` rows' levels; how many of them are present.
    fn present(&mut self, k: usize) -> Option<usize> {
        self.hybrid.bits(&self.buf, k, None)
    }
}

/// Appends the next `k` stored values (of a page stored as `stored` in `buf`, with the
/// chunk's dictionary `dict`) to `out`; `None` where they are not there or an index is past
/// the dictionary.
fn values<T: Word>(
    stored: &mut Stored,
    buf: &[u8],
    dict: Option<&[T]>,
    k: usize,
    out: &mut Vec<T>,
) -> Option<()> {
    match stored {
        Stored::Plain(at) => {
            let bytes = buf.get(*at..*at + k * T::BYTES)?;
            extend_le(out, bytes);
            *at += k * T::BYTES;
        }
        Stored::Indices(h) => {
            let dict = dict?;
            h.read(buf, k, |v| {
                match v {
                    Values::Slice(ids) => {
                        let top = ids.iter().copied().max().unwrap_or(0);
                        if top as usize >= dict.len() {
                            return None;
                        }
                        // SAFETY: every index is below `top`, inside the dictionary.
                        out.extend(
                            ids.iter()
                                .map(|&i| unsafe { *dict.get_unchecked(i as usize) }),
                        );
                    }
                    Values::Repeat(i, k) => {
                        let v = *dict.get(i as usize)?;
                        out.extend(std::iter::repeat_n(v, k));
                    }
                }
                Some(())
            })?;
        }
    }
    Some(())
}

/// Appends the little-endian values in `bytes` to `out`: one copy.
fn extend_le<T: Word>(out: &mut Vec<T>, bytes: &[u8]) {
    let n = bytes.len() / T::BYTES;
    out.reserve(n);
    if cfg!(target_endian = "little") {
        let len = out.len();
        // SAFETY: `out` has room for `n` more values (reserved above); `T` is a plain integer
        // whose bytes are the little-endian ones on this target, and any bytes are a value.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                out.as_mut_ptr().add(len).cast::<u8>(),
                n * T::BYTES,
            );
            out.set_len(len + n);
        }
    } else {
        out.extend(bytes.chunks_exact(T::BYTES).map(T::from_le));
    }
}

/// `Some` where at most 1/16 of a page's `values` rows are null (`present` are not): pages
/// with more are given back, since arrow-rs, which writes the present values in place and
/// moves them apart, reads them as fast (a fifth slower here at 10% of rows null, a third
/// faster at 1%).
fn sparse(present: usize, values: usize) -> Option<()> {
    (values - present <= values / 16).then_some(())
}

/// How many of `values` rows the definition levels in `levels` (RLE / bit-packed, 1 bit)
/// mark present; `None` where they are not there or not 0 or 1.
fn count_present(levels: &[u8], values: usize) -> Option<usize> {
    Hybrid::new(0, levels.len(), 1)?.bits(levels, values, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::RecordBatch;
    use parquet::arrow::ArrowWriter;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::basic::{GzipLevel, ZstdLevel};
    use parquet::file::metadata::ParquetMetaData;
    use parquet::file::properties::{WriterProperties, WriterVersion};

    /// A file of 3,000 rows in row groups of 1,000, pages of at most 128 rows and
    /// dictionaries of at most 512 bytes (so most columns fall back to PLAIN mid-chunk):
    /// every flat type, nullable (levels in every page) and not, few distinct values and
    /// many. With `nulls`, the nullable columns hold a few (as many as a page read here may
    /// have): scattered (one in each page, every 29th row in a third of them) and a run
    /// (rows 300 to 305).
    fn file(codec: Compression, v2: bool, dictionary: bool, nulls: bool) -> Bytes {
        use arrow_array::{Float32Array, Float64Array, Int32Array, Int64Array};
        use arrow_array::{UInt32Array, UInt64Array};
        let n = 3000u32;
        let spread = |i: u32| i.wrapping_mul(2_654_435_761);
        let null = |i: u32| {
            nulls && (i % 128 == 5 || (i / 128 % 3 == 1 && i % 29 == 2) || (300..306).contains(&i))
        };
        let batch = RecordBatch::try_from_iter_with_nullable(vec![
            (
                "a",
                Arc::new(Int32Array::from_iter(
                    (0..n).map(|i| (!null(i)).then_some((i % 7) as i32 - 3)),
                )) as ArrayRef,
                true,
            ),
            (
                "b",
                Arc::new(UInt32Array::from_iter_values((0..n).map(spread))) as ArrayRef,
                false,
            ),
            (
                "c",
                Arc::new(Float32Array::from_iter(
                    (0..n).map(|i| (!null(i)).then_some((i % 50) as f32 * 0.5)),
                )) as ArrayRef,
                true,
            ),
            (
                "d",
                Arc::new(Int64Array::from_iter(
                    (0..n).map(|i| (!null(i)).then_some(i64::from(spread(i)) << 20)),
                )) as ArrayRef,
                true,
            ),
            (
                "e",
                Arc::new(UInt64Array::from_iter_values(
                    (0..n).map(|i| u64::from(i / 100)),
                )) as ArrayRef,
                false,
            ),
            (
                "f",
                Arc::new(Float64Array::from_iter_values(
                    (0..n).map(|i| f64::from(spread(i)) / 7.0),
                )) as ArrayRef,
                false,
            ),
        ])
        .unwrap();
        let mut props = WriterProperties::builder();
        if !dictionary {
            // PLAIN in v2 pages too (arrow-rs's v2 default would be a delta encoding).
            props = props.set_encoding(Encoding::PLAIN);
        }
        let props = props
            .set_compression(codec)
            .set_writer_version(if v2 {
                WriterVersion::PARQUET_2_0
            } else {
                WriterVersion::PARQUET_1_0
            })
            .set_dictionary_enabled(dictionary)
            .set_dictionary_page_size_limit(512)
            .set_data_page_row_count_limit(128)
            .set_write_batch_size(64)
            .set_max_row_group_row_count(Some(1000))
            .build();
        let mut data = Vec::new();
        let mut w = ArrowWriter::try_new(&mut data, batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        Bytes::from(data)
    }

    fn metadata(data: &Bytes) -> ParquetMetaData {
        parquet::file::metadata::ParquetMetaDataReader::new()
            .parse_and_finish(data)
            .unwrap()
    }

    /// Column `leaf` of row group `rg` as arrow-rs reads it, as words (zero where null), and
    /// each row's validity.
    fn expected<T: Word>(data: &Bytes, rg: usize, leaf: usize) -> (Vec<T>, Vec<bool>) {
        let b = ParquetRecordBatchReaderBuilder::try_new(data.clone()).unwrap();
        let mask = parquet::arrow::ProjectionMask::leaves(b.parquet_schema(), [leaf]);
        let (mut out, mut valid) = (Vec::new(), Vec::new());
        for batch in b
            .with_row_groups(vec![rg])
            .with_projection(mask)
            .build()
            .unwrap()
        {
            let col = batch.unwrap().column(0).clone();
            let bytes = col.to_data().buffers()[0].clone();
            let bytes = &bytes[col.offset() * T::BYTES..(col.offset() + col.len()) * T::BYTES];
            for (k, v) in bytes.chunks_exact(T::BYTES).map(T::from_le).enumerate() {
                valid.push(col.is_valid(k));
                out.push(if col.is_valid(k) { v } else { T::default() });
            }
        }
        (out, valid)
    }

    /// Reads chunk `leaf` of group `rg` from every row of `firsts`, `step` values a call,
    /// against arrow-rs; the dictionary read by one reader is handed to the next.
    fn agrees<T: Word + std::fmt::Debug + PartialEq>(
        data: &Bytes,
        meta: &ParquetMetaData,
        rg: usize,
        leaf: usize,
        what: &str,
    ) -> bool {
        let dt = [
            DataType::Int32,
            DataType::UInt32,
            DataType::Float32,
            DataType::Int64,
            DataType::UInt64,
            DataType::Float64,
        ][leaf]
            .clone();
        let chunk = meta.row_group(rg).column(leaf);
        let other = chunk.encodings().any(|e| {
            !matches!(
                e,
                Encoding::PLAIN
                    | Encoding::RLE_DICTIONARY
                    | Encoding::PLAIN_DICTIONARY
                    | Encoding::RLE
            )
        });
        assert_eq!(reads(chunk, &dt), !other, "{what}");
        // Values of another type, though as wide, are not read as these.
        let wrong = if leaf % 3 == 2 {
            DataType::Int32
        } else {
            DataType::Float32
        };
        assert!(!reads(chunk, &wrong), "{what}");
        if other {
            return false;
        }
        let (want, want_valid) = expected::<T>(data, rg, leaf);
        let scratch = Arc::new(Scratch::default());
        // Each reader on its own, then each given the dictionary and page index of the ones
        // before it (as the source hands them on).
        for share in [false, true] {
            let (mut dict, mut index) = (None, None);
            for first in [0usize, 1, 63, 127, 128, 129, 500, 999, 1000] {
                for step in [1usize, 7, 64, 1000] {
                    let mut f = Flat::<T>::new(
                        data,
                        chunk,
                        first as u64,
                        dict.clone(),
                        index.clone(),
                        scratch.clone(),
                    )
                    .unwrap_or_else(|_| panic!("{what}: from row {first}"));
                    let (mut got, mut valid) = (Vec::new(), None);
                    while got.len() < want.len() - first {
                        let k = step.min(want.len() - first - got.len());
                        f.read(k, &mut got, &mut valid)
                            .unwrap_or_else(|_| panic!("{what}: from {first} by {step}"));
                    }
                    let valid: Vec<bool> = match valid {
                        Some(mut v) => v.finish().iter().collect(),
                        None => vec![true; got.len()],
                    };
                    assert_eq!(
                        valid,
                        want_valid[first..],
                        "{what}: from row {first} by {step}"
                    );
                    assert_eq!(got, want[first..], "{what}: from row {first} by {step}");
                    // Past the chunk's end: given back.
                    assert!(f.read(1, &mut got, &mut None).is_err(), "{what}");
                    if share {
                        dict = dict.or_else(|| f.dictionary());
                        index = index.or_else(|| f.page_index());
                    }
                }
            }
            if share {
                assert!(
                    index.is_some(),
                    "{what}: a reader from row 1 on walks the index"
                );
            }
        }
        true
    }

    #[test]
    fn reads_what_arrow_rs_reads_in_every_codec_page_version_and_encoding() {
        let codecs = [
            Compression::UNCOMPRESSED,
            Compression::SNAPPY,
            Compression::ZSTD(ZstdLevel::default()),
            Compression::LZ4_RAW,
            Compression::GZIP(GzipLevel::default()),
        ];
        let mut read = 0;
        for codec in codecs {
            for (v2, dictionary, nulls) in itertools_product() {
                let data = file(codec, v2, dictionary, nulls);
                let meta = metadata(&data);
                assert_eq!(meta.num_row_groups(), 3);
                {
                    for rg in 0..3 {
                        let what = |leaf| {
                            format!(
                                "{codec:?}, v2 {v2}, dictionary {dictionary}, nulls {nulls}, \
                                 group {rg}, leaf {leaf}"
                            )
                        };
                        for leaf in 0..3 {
                            read += usize::from(agrees::<u32>(&data, &meta, rg, leaf, &what(leaf)));
                        }
                        for leaf in 3..6 {
                            read += usize::from(agrees::<u64>(&data, &meta, rg, leaf, &what(leaf)));
                        }
                    }
                }
            }
        }
        // Only v2 dictionary chunks that fell back (to a delta encoding) are left to arrow-rs.
        assert!(read >= 2 * 5 * 3 * 6 * 3, "{read} chunks read");
    }

    /// Every (v2, dictionary, nulls).
    fn itertools_product() -> impl Iterator<Item = (bool, bool, bool)> {
        (0..8).map(|k| (k & 1 == 1, k & 2 == 2, k & 4 == 4))
    }

    #[test]
    fn nulls_are_read_other_codecs_and_corrupt_pages_are_given_back_without_a_panic() {
        // A null: zero, and the row marked missing; a page of more nulls than a sixteenth
        // of its rows is given back.
        let scratch = Arc::new(Scratch::default());
        let one = |x: Vec<Option<i32>>| {
            let batch = RecordBatch::try_from_iter(vec![(
                "x",
                Arc::new(arrow_array::Int32Array::from(x)) as ArrayRef,
            )])
            .unwrap();
            let mut data = Vec::new();
            let mut w = ArrowWriter::try_new(&mut data, batch.schema(), None).unwrap();
            w.write(&batch).unwrap();
            w.close().unwrap();
            Bytes::from(data)
        };
        let data = one((0..32).map(|i| (i != 1).then_some(i)).collect());
        let meta = metadata(&data);
        let chunk = meta.row_group(0).column(0);
        let mut f = Flat::<u32>::new(&data, chunk, 0, None, None, scratch.clone()).unwrap();
        let (mut got, mut valid) = (Vec::new(), None);
        f.read(32, &mut got, &mut valid).unwrap();
        assert_eq!(got[..4], [0, 0, 2, 3]);
        let valid: Vec<bool> = valid.unwrap().finish().iter().collect();
        assert_eq!(valid[..4], [true, false, true, true]);
        assert_eq!(valid.iter().filter(|&&v| !v).count(), 1);
        let data = one(vec![Some(1), None, Some(3)]);
        let meta = metadata(&data);
        let chunk = meta.row_group(0).column(0);
        let mut f = Flat::<u32>::new(&data, chunk, 0, None, None, scratch.clone()).unwrap();
        assert!(f.read(3, &mut Vec::new(), &mut None).is_err());
        // LZ4 in Hadoop's framing is not read here.
        let data = file(Compression::LZ4, false, true, false);
        assert!(!reads(
            metadata(&data).row_group(0).column(0),
            &DataType::Int32
        ));
        // Every byte of a chunk's pages flipped in turn: values or given back, never a panic.
        for (v2, codec, nulls) in [
            (false, Compression::SNAPPY, false),
            (true, Compression::UNCOMPRESSED, false),
            (false, Compression::UNCOMPRESSED, true),
            (true, Compression::SNAPPY, true),
        ] {
            let good = file(codec, v2, true, nulls);
            let meta = metadata(&good);
            for leaf in [0, 3] {
                let chunk = meta.row_group(1).column(leaf);
                let (start, len) = pages::byte_range(chunk, good.len() as u64).unwrap();
                for at in start..start + len {
                    let mut bad = good.to_vec();
                    bad[at as usize] ^= 0x5a;
                    let bad = Bytes::from(bad);
                    for first in [0, 300] {
                        if leaf == 0 {
                            if let Ok(mut f) =
                                Flat::<u32>::new(&bad, chunk, first, None, None, scratch.clone())
                            {
                                let _ = f.read(1000 - first as usize, &mut Vec::new(), &mut None);
                            }
                        } else if let Ok(mut f) =
                            Flat::<u64>::new(&bad, chunk, first, None, None, scratch.clone())
                        {
                            let _ = f.read(1000 - first as usize, &mut Vec::new(), &mut None);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn hybrid_runs_read_and_skip() {
        // Width 3: a repeat of 5 ten times (header 20, value byte 5), then one packed group
        // of 8 values 0..8 (header 3: one group, bits little-endian: 3 bytes).
        let mut buf = vec![20, 5, 3];
        let mut bits = 0u32;
        for (i, v) in (0u32..8).enumerate() {
            bits |= v << (3 * i);
        }
        buf.extend(&bits.to_le_bytes()[..3]);
        let read = |skip: usize, n: usize| {
            let mut h = Hybrid::new(0, buf.len(), 3).unwrap();
            h.skip(&buf, skip).unwrap();
            let mut got = Vec::new();
            h.read(&buf, n, |v| {
                match v {
                    Values::Slice(s) => got.extend_from_slice(s),
                    Values::Repeat(x, k) => got.extend(std::iter::repeat_n(x, k)),
                }
                Some(())
            })
            .map(|()| got)
        };
        let all: Vec<u32> = std::iter::repeat_n(5, 10).chain(0..8).collect();
        assert_eq!(read(0, 18).unwrap(), all);
        for skip in 0..18 {
            assert_eq!(read(skip, 18 - skip).unwrap(), all[skip..], "skip {skip}");
        }
        // Past the end, or a run cut short: refused.
        assert!(read(0, 19).is_none());
        let mut h = Hybrid::new(0, buf.len() - 1, 3).unwrap();
        assert!(h.skip(&buf, 11).is_none());
        assert!(Hybrid::new(0, 1, 33).is_none());
    }
}
