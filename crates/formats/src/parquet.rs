//! Parquet: [`ParquetSource`] reads projected columns, [`ParquetWriter`] writes samples.
//!
//! A shard of the manifest is a chunk of at most [`ParquetOptions::chunk_rows`] rows of one
//! row group (`file.parquet#rowgroup3:16384+16384`), so block shuffle works on a window of
//! chunks whose columns fit in the CPU's cache, and the plan's rank split hands each rank
//! whole chunks where it can. A row group is decoded a piece at a time: a run of whole
//! chunks of about [`ParquetOptions::piece_bytes`] decoded (16 MiB), each column by a reader
//! that goes on where the last piece left it (or, for a piece read out of order, skips the
//! pages before it by their headers); a flat numeric column chunk is read by chute's own
//! reader (`parquet/flat.rs`: no zero fill, recycled page buffers, pages with few nulls),
//! anything else by arrow-rs's.
//! A piece's chunks are a unit of the manifest
//! ([`chute_core::Manifest::units`]): block shuffle reads pieces in random order and a
//! piece's chunks together, so a piece is decoded once an epoch and only the pieces being
//! read are in memory. Decoded pieces (only the projected columns, as Arrow arrays) are kept
//! in a cache shared by the workers; a piece leaves it as soon as all its rows have been
//! read in the epoch (its buffers then serve the next piece: see `chute_core::alloc`), unless
//! [`ParquetOptions::cache_bytes`] asks to keep a dataset that fits for later epochs. A batch
//! is gathered straight from the Arrow arrays into the batch's column buffers
//! ([`Source::collate`]): numeric columns become `[B]` tensors, fixed-size lists `[B, k]`,
//! binary and string columns variable-length columns. No object per row on that path.
//!
//! Nulls are refused with the column and row named: batches have no null representation.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use arrow_array::ArrayRef;
use bytes::Bytes;
use chute_core::{
    BufferPool, Column, ConfigError, Error, Manifest, Plan, Sample, ShardInfo, Shuffle, Source,
};
use chute_io::AtomicFile;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReaderBuilder};
use parquet::arrow::arrow_writer::ArrowWriter;

use crate::Stack;
use crate::columnar::{self, RowMajor, Table};

mod flat;
mod pages;
mod thrift;

/// How to read Parquet files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParquetOptions {
    /// Columns to read, in this order (projection); `None` reads every column.
    pub columns: Option<Vec<String>>,
    /// Decoded data kept in memory, in bytes. Unset (the default), a decoded piece of a
    /// row group leaves memory as soon as the epoch has read its rows (streaming: memory is
    /// bounded by the pieces being read, and their buffers serve the next pieces), and at
    /// most 1 GiB of pieces is held at once. Set, the pieces stay for later epochs when this
    /// many bytes hold the whole dataset (epochs after the first decode nothing), and bound
    /// the pieces held at once otherwise. At least a few pieces are kept whatever the
    /// figure, so workers never evict each other's pieces mid-batch.
    pub cache_bytes: Option<usize>,
    /// Decoded bytes of a piece (default 16 MiB): a row group is decoded a piece of whole
    /// chunks at a time, each column by a reader that goes on where the last piece left it,
    /// so a row group of gigabytes is never all in memory at once.
    pub piece_bytes: Option<usize>,
    /// Rows per shard (default 16,384): row groups are split into chunks of this many rows.
    /// Block shuffle reads pieces (see `piece_bytes`) in random order, a piece's chunks
    /// together in random order (they are a unit of the manifest: each piece is decoded once
    /// an epoch), and shuffles rows within windows of chunks, so smaller chunks keep a
    /// window's columns in cache (gathers from memory that is not in cache cost a miss per
    /// column per row).
    pub chunk_rows: Option<usize>,
    /// Columns stacked into one `[B, k]` column (see [`Stack`]).
    pub stack: Stack,
    /// What a null does: filled, with a `<name>_valid` column (the default), filled without
    /// one, or an error.
    pub nulls: crate::Nulls,
    /// What null slots are filled with (see [`Fill`](crate::Fill)).
    pub fill_null: crate::Fill,
    /// How struct columns are read: a column per leaf (the default) or whole.
    pub structs: crate::Structs,
    /// How decimal columns are read: float64 (the default) or exact.
    pub decimals: crate::Decimals,
    /// How dictionary columns are read: their values (the default) or codes.
    pub dictionaries: crate::Dictionaries,
}

/// Default rows per shard.
const DEFAULT_CHUNK_ROWS: usize = 1 << 14;

/// Default bound on the decoded pieces held at once.
const DEFAULT_CACHE_BYTES: usize = 1 << 30;

/// Row groups whose column cursors are kept at once (see `ParquetSource::cursor_groups`).
const CURSOR_GROUPS: usize = 8;

/// Default decoded bytes of a piece of a row group (see [`ParquetOptions::piece_bytes`]).
const PIECE_BYTES: usize = 16 << 20;

struct FileMeta {
    path: PathBuf,
    data: Bytes,
    meta: ArrowReaderMetadata,
    /// Each requested column's projection, as Parquet leaves (its top-level field's, or
    /// those under its path: a list's leaves come with it).
    projections: Vec<Vec<usize>>,
    /// Each requested column's Parquet leaves: every leaf under its top-level field.
    leaves: Vec<Vec<usize>>,
    /// Each requested column's leaf and Arrow type, for a flat numeric column that chute's
    /// own decoder may read (see [`flat`]; each column chunk's codec and encodings decide).
    flat: Vec<Option<(usize, arrow_schema::DataType)>>,
}

/// One decoded column of a row group, shared by the workers that read from it. Whoever
/// claims it first decodes it; the others decode other columns meanwhile, then wait.
#[derive(Default)]
struct ColumnSlot {
    claimed: AtomicBool,
    value: OnceLock<Result<ArrayRef, String>>,
}

/// A run of whole chunks of one row group, decoded together: the unit of the decoded cache.
#[derive(Debug, Clone, Copy)]
struct Piece {
    /// Its row group's place in `groups`.
    group: usize,
    /// Its first row in the group, and its rows.
    first: u64,
    rows: u64,
}

/// A row group's column being decoded a piece at a time: the reader, and the row of the
/// group it reads next. The next piece is decoded on from there (no page decompressed
/// twice); another piece makes a new reader, which skips whole pages by their headers.
struct Cursor {
    next: u64,
    reader: Reader,
}

/// A column chunk's reader: arrow-rs's, or chute's own for a flat numeric column.
enum Reader {
    Arrow(parquet::arrow::arrow_reader::ParquetRecordBatchReader),
    U32(flat::Flat<u32>),
    U64(flat::Flat<u64>),
}

impl Reader {
    /// The next `rows` values as an array of type `dt`, if this is chute's own reader
    /// (`Err` where it gave the piece back: see [`flat::Unread`]).
    fn flat(
        &mut self,
        rows: usize,
        dt: &arrow_schema::DataType,
    ) -> Option<Result<ArrayRef, flat::Unread>> {
        fn take<T: flat::Word>(
            f: &mut flat::Flat<T>,
            rows: usize,
            dt: &arrow_schema::DataType,
        ) -> Result<ArrayRef, flat::Unread> {
            let mut values = Vec::with_capacity(rows);
            let mut valid = None;
            f.read(rows, &mut values, &mut valid)?;
            flat::array(dt, arrow_buffer::Buffer::from_vec(values), rows, valid).ok_or(flat::Unread)
        }
        match self {
            Reader::Arrow(_) => None,
            Reader::U32(f) => Some(take(f, rows, dt)),
            Reader::U64(f) => Some(take(f, rows, dt)),
        }
    }

    /// Its column chunk's page index, if this is chute's own reader and it has one.
    fn page_index(&self) -> Option<flat::PageIndex> {
        match self {
            Reader::Arrow(_) => None,
            Reader::U32(f) => f.page_index(),
            Reader::U64(f) => f.page_index(),
        }
    }
}

/// A row group's column: its cursor, if a piece has been decoded and the column goes on,
/// whether its page headers have been checked (once: pieces out of order make readers
/// again and again), and its page index once a reader has walked one (kept when the cursor
/// goes: a few bytes a page).
#[derive(Default)]
struct Reading {
    checked: bool,
    cursor: Option<Cursor>,
    pages: Option<flat::PageIndex>,
}

/// A cached piece: its projected columns, in the requested order, and (for plans in
/// random order) the row-major copy of each of its chunks, made by the first gather that
/// needs it and dropped once all the chunk's rows have been read (so the next chunk's copy
/// reuses its memory instead of mapping new pages).
struct Cached {
    slots: Box<[ColumnSlot]>,
    rows: Box<[Mutex<Option<Arc<RowMajor>>>]>,
}

type Group = Arc<Cached>;

/// A decoded piece: its projected columns, in the requested order.
type Columns = Vec<ArrayRef>;

/// Parquet files as a [`Source`], one shard per row group.
pub struct ParquetSource {
    files: Vec<FileMeta>,
    /// (file, row group in the file, rows) of each row group of the dataset.
    groups: Vec<(usize, usize, u64)>,
    /// Byte offset of each row group's first column chunk, for error messages.
    offsets: Vec<u64>,
    /// The pieces the row groups are decoded in, group by group.
    pieces: Vec<Piece>,
    /// Rows of each row group's pieces (its last piece may hold fewer).
    piece_rows: Vec<u64>,
    /// Each row group's column cursors, by projected column.
    cursors: Vec<Box<[Mutex<Reading>]>>,
    /// Row groups with cursors, least recently given one first: a cursor holds a page of its
    /// column decompressed, so at most [`CURSOR_GROUPS`] groups keep theirs (pieces read in
    /// random order would otherwise leave one in every group of the dataset).
    cursor_groups: Mutex<VecDeque<usize>>,
    /// Page buffers of chute's own column readers, recycled (see [`flat::Scratch`]).
    scratch: Arc<flat::Scratch>,
    /// (piece, first row in the piece) of each shard.
    chunks: Vec<(usize, u64)>,
    /// Rows per shard (a row group's last shard may hold fewer).
    chunk_rows: u64,
    manifest: Manifest,
    table: Table,
    /// Decoded pieces by place in `pieces`, and the order they were last used in.
    cache: Mutex<(HashMap<usize, Group>, VecDeque<usize>)>,
    /// Pieces the cache holds at most.
    cache_pieces: usize,
    /// Bytes the dataset's projected columns take decoded, all together.
    decoded: u64,
    /// [`ParquetOptions::cache_bytes`] was given: pieces stay for later epochs when the
    /// cache holds every one of them.
    keep: bool,
    /// The plan reads rows in random order (global or block shuffle): gathers read from
    /// row-major copies of the pieces, which count against the cache (half as many pieces).
    random: AtomicBool,
    /// The plan is a global shuffle and the cache cannot hold every piece: each batch would
    /// decode most of the dataset again, so reads are refused (see [`ParquetSource::order`]).
    thrashing: AtomicBool,
    /// Rows of each piece read since the plan was last set: a piece all of whose rows have
    /// been read leaves the cache at once (this epoch needs it no more), so its buffers are
    /// reused for the next piece instead of new pages being mapped.
    consumed: Vec<AtomicU64>,
    /// Rows of each shard read since the plan was last set (for its row-major copy).
    chunk_consumed: Vec<AtomicU64>,
    /// Place in `chunks` of each piece's first shard.
    piece_chunks: Vec<usize>,
    /// Some batch field is fixed-width (row-major copies serve random orders).
    mirrored: bool,
}

impl std::fmt::Debug for ParquetSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParquetSource")
            .field("files", &self.files.len())
            .field("row_groups", &self.groups.len())
            .field("pieces", &self.pieces.len())
            .field("shards", &self.chunks.len())
            .field("columns", &self.table.names)
            .finish()
    }
}

impl ParquetSource {
    /// Opens `paths` (local files memory-mapped, URLs downloaded whole; only footers are read
    /// here). Every file must have the projected columns with the same types.
    pub fn open<P: AsRef<Path>>(paths: &[P], options: ParquetOptions) -> Result<Self, Error> {
        Self::from_bytes(columnar::read_files(paths, "Parquet")?, options)
    }

    /// Opens Parquet files already in memory, each `(name, bytes)` (a memory map's view, a
    /// download): what [`ParquetSource::open`] does once it has the bytes.
    pub fn from_bytes(
        contents: Vec<(String, Bytes)>,
        options: ParquetOptions,
    ) -> Result<Self, Error> {
        columnar::given(&contents, "Parquet")?;
        let mut files = Vec::new();
        let mut groups = Vec::new();
        let mut offsets = Vec::new();
        let mut chunks = Vec::new();
        let mut pieces = Vec::new();
        let mut piece_rows = Vec::new();
        let mut piece_chunks = Vec::new();
        let mut shards = Vec::new();
        let chunk_rows = options.chunk_rows.unwrap_or(DEFAULT_CHUNK_ROWS).max(1) as u64;
        let piece_bytes = options.piece_bytes.unwrap_or(PIECE_BYTES).max(1) as u64;
        let mut first: Option<(String, columnar::Projected)> = None;
        // What the groups cost decoded, all together: the larger of what each footer says
        // and what its row counts make (sizes the decoded cache's capacity in groups).
        let mut total_decoded = 0u64;
        // Bytes of the files opened before this one (their row counts are checked against
        // them, with this file's, by `pages::check_shards`).
        let mut files_bytes = 0u64;
        // Per projected column: whether some file holds a null in it.
        let mut nulls: Vec<bool> = Vec::new();
        for (fi, (origin, data)) in contents.into_iter().enumerate() {
            let path = PathBuf::from(&origin);
            let meta =
                pages::metadata(&data).map_err(|reason| Error::corrupt(&origin, 0, reason))?;
            let schema = meta.schema().clone();
            let these = columnar::Projected::of(
                &schema,
                options.columns.as_deref(),
                options.structs,
                options.decimals,
                options.dictionaries,
                &origin,
            )?;
            let indices = these.places.clone();
            let paths = these.paths.clone();
            match &first {
                None => first = Some((origin.clone(), these)),
                Some((name, cols)) => cols.check_same(&these, name, &origin)?,
            }
            // Whether a projected column holds a null: a leaf under it whose statistics count
            // one, or a nullable leaf without a count.
            let descr = meta.parquet_schema();
            // The Parquet leaves under each top-level column, in one pass (a file may have
            // many thousands of columns: no pass over every leaf per column).
            let mut by_root: Vec<Vec<usize>> = vec![Vec::new(); schema.fields().len()];
            for l in 0..descr.num_columns() {
                if let Some(leaves) = by_root.get_mut(descr.get_column_root_idx(l)) {
                    leaves.push(l);
                }
            }
            let no_leaves = Vec::new();
            let leaves_of = |i: usize| by_root.get(i).unwrap_or(&no_leaves);
            // Per projected column, the Parquet leaves under it.
            let under: Vec<Vec<usize>> = indices
                .iter()
                .zip(&paths)
                .map(|(&i, path)| {
                    let root = schema.field(i).name();
                    leaves_of(i)
                        .iter()
                        .copied()
                        .filter(|&l| {
                            let column = descr.column(l);
                            let parts = column.path().parts();
                            parts.first() == Some(root)
                                && parts.len() > path.len()
                                && parts[1..=path.len()] == path[..]
                        })
                        .collect()
                })
                .collect();
            let holes = under.iter().map(|leaves| {
                leaves.iter().any(|&l| {
                    meta.metadata().row_groups().iter().any(|rg| {
                        match rg.column(l).statistics().and_then(|s| s.null_count_opt()) {
                            Some(n) => n > 0,
                            None => descr.column(l).max_def_level() > 0,
                        }
                    })
                })
            });
            columnar::add_nulls(&mut nulls, holes);
            // What each column's reader projects: every leaf of its top-level column, or those
            // under its path (masks are made when a reader starts: one here per column would
            // be a flag per leaf per column, quadratic in a wide file).
            let projections: Vec<Vec<usize>> = indices
                .iter()
                .zip(&paths)
                .zip(&under)
                .map(|((&i, path), leaves)| match path.is_empty() {
                    true => leaves_of(i).clone(),
                    false => leaves.clone(),
                })
                .collect();
            let flat = indices
                .iter()
                .zip(&paths)
                .map(|(&i, path)| {
                    if !path.is_empty() {
                        return None; // read by arrow-rs, then picked out of its struct
                    }
                    let dt = schema.field(i).data_type();
                    match (leaves_of(i).as_slice(), flat::width(dt)) {
                        ([leaf], Some(_)) => Some((*leaf, dt.clone())),
                        _ => None,
                    }
                })
                .collect();
            let file_len = data.len() as u64;
            let max_decoded = chute_core::Limits::current().max_decoded_bytes;
            let descr = meta.parquet_schema();
            // Each projected root's values per row (fixed-size lists multiply them).
            let per_root: HashMap<usize, u64> = indices
                .iter()
                .map(|&i| (i, pages::values_per_row(schema.field(i).data_type())))
                .collect();
            for (gi, rg) in meta.metadata().row_groups().iter().enumerate() {
                let decoded = pages::check_group(rg, gi, file_len, max_decoded, |leaf| {
                    (leaf < descr.num_columns())
                        .then(|| per_root.get(&descr.get_column_root_idx(leaf)).copied())
                        .flatten()
                })
                .map_err(|reason| Error::corrupt(&origin, 0, reason))?;
                let rows = rg.num_rows().max(0) as u64;
                let g = groups.len();
                groups.push((fi, gi, rows));
                offsets.push(
                    rg.columns()
                        .first()
                        .and_then(|c| pages::byte_range(c, file_len))
                        .map_or(0, |r| r.0),
                );
                let decoded = u64::try_from(rg.total_byte_size())
                    .unwrap_or(0)
                    .max(decoded);
                total_decoded = total_decoded.saturating_add(decoded);
                // Pieces of whole chunks, about `piece_bytes` decoded each.
                let per_piece =
                    (piece_bytes.saturating_mul(rows) / decoded.max(1)) / chunk_rows * chunk_rows;
                let per_piece = per_piece.max(chunk_rows).min(rows.max(1));
                piece_rows.push(per_piece);
                let mut first = 0;
                while first < rows || (rows == 0 && first == 0) {
                    let n = chunk_rows.min(rows - first);
                    if first % per_piece == 0 {
                        pieces.push(Piece {
                            group: g,
                            first,
                            rows: per_piece.min(rows - first),
                        });
                        piece_chunks.push(chunks.len());
                    }
                    let p = pieces.len() - 1;
                    chunks.push((p, first - pieces[p].first));
                    shards.push(ShardInfo {
                        path: format!("{origin}#rowgroup{gi}:{first}+{n}"),
                        samples: n,
                        // Compressed bytes, in proportion to the chunk's rows.
                        bytes: (rg.compressed_size().max(0) as u64 * n)
                            .checked_div(rows)
                            .unwrap_or(0),
                    });
                    if rows == 0 {
                        break;
                    }
                    first += n;
                    if shards.len() as u64 > pages::FREE_SHARDS {
                        pages::check_shards(
                            shards.len() as u64,
                            files_bytes + file_len,
                            &format!("row group {gi}"),
                        )
                        .map_err(|reason| Error::corrupt(&origin, 0, reason))?;
                    }
                }
            }
            files_bytes += file_len;
            files.push(FileMeta {
                path: path.to_path_buf(),
                data,
                meta,
                projections,
                leaves: indices.iter().map(|&i| leaves_of(i).clone()).collect(),
                flat,
            });
        }
        let (origin, projected) = first.expect("at least one file");
        let (stack, fill) = (&options.stack, options.fill_null);
        let masked = columnar::masked(&nulls, options.nulls);
        let table = Table::new(projected, stack, &origin, masked, options.nulls, fill)?;
        let avg = (total_decoded.max(1) / pieces.len().max(1) as u64) as usize;
        let cache_bytes = options.cache_bytes.unwrap_or(DEFAULT_CACHE_BYTES);
        let cache_pieces = (cache_bytes / avg.max(1)).max(8);
        let mut manifest = table.manifest(crate::Format::Parquet, shards, &options.stack);
        if chunks.len() > pieces.len() {
            // A piece's chunks are a unit: a block shuffle reads them together, so each
            // piece is decoded once an epoch, not once per chunk, and only the pieces of
            // the windows being read are in memory.
            manifest = manifest.with_units(piece_chunks.iter().map(|&c| c as u64).collect());
        }
        let width = table.names.len();
        Ok(ParquetSource {
            files,
            consumed: (0..pieces.len()).map(|_| AtomicU64::new(0)).collect(),
            chunk_consumed: (0..chunks.len()).map(|_| AtomicU64::new(0)).collect(),
            cursors: (0..groups.len())
                .map(|_| (0..width).map(|_| Mutex::default()).collect())
                .collect(),
            cursor_groups: Mutex::new(VecDeque::new()),
            scratch: Arc::default(),
            pieces,
            piece_rows,
            piece_chunks,
            mirrored: columnar::has_fixed(&table.kinds, &table.layout),
            groups,
            offsets,
            chunks,
            chunk_rows,
            manifest,
            table,
            cache: Mutex::new((HashMap::new(), VecDeque::new())),
            cache_pieces,
            decoded: total_decoded,
            keep: options.cache_bytes.is_some(),
            random: AtomicBool::new(false),
            thrashing: AtomicBool::new(false),
        })
        .and_then(|mut source: ParquetSource| {
            source.read_codes()?;
            Ok(source)
        })
    }

    /// The source's dictionary of each column read as codes (see [`crate::codes`]), from
    /// every row group's, in file order: the column read once (its pages checked first).
    fn read_codes(&mut self) -> Result<(), Error> {
        for c in self.table.coded() {
            let mut dict = crate::codes::Codes::default();
            for group in 0..self.groups.len() {
                let (fi, gi, _) = self.groups[group];
                let read = || -> Result<(), String> {
                    self.check_pages(group, c)?;
                    let f = &self.files[fi];
                    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(
                        f.data.clone(),
                        f.meta.clone(),
                    )
                    .with_row_groups(vec![gi])
                    .with_projection(ProjectionMask::leaves(
                        f.meta.parquet_schema(),
                        f.projections[c].iter().copied(),
                    ))
                    .build()
                    .map_err(|e| e.to_string())?;
                    for batch in reader {
                        let batch = batch.map_err(|e| e.to_string())?;
                        dict.add(batch.column(0).as_ref())?;
                    }
                    Ok(())
                };
                chute_core::quiet::catch_quietly(read)
                    .unwrap_or_else(|why| Err(format!("the decoder failed on corrupt data: {why}")))
                    .map_err(|why| {
                        let name = &self.table.names[c];
                        Error::corrupt(
                            self.files[fi].path.display().to_string(),
                            self.offsets[group],
                            format!("row group {gi}, column {name:?}: {why}"),
                        )
                    })?;
            }
            self.table.codes[c] = Some(Arc::new(dict));
        }
        Ok(())
    }

    /// The projected column names, in the files' terms (before any stack).
    pub fn columns(&self) -> &[String] {
        &self.table.names
    }

    /// The batch's field names, in order (stacks in place of their columns).
    pub fn fields(&self) -> Vec<String> {
        self.table.layout.names(&self.table.names)
    }

    /// Decoded piece `p`: its columns from the cache, or decoded now. Columns are the unit
    /// of decoding, so workers that need the same piece decode its columns in parallel
    /// rather than wait for one of them to decode it all.
    fn piece(&self, p: usize) -> Result<Columns, Error> {
        self.cached(p).map(|(columns, _)| columns)
    }

    /// Decoded piece `p` and its cache entry (where its row-major copies live).
    fn cached(&self, p: usize) -> Result<(Columns, Group), Error> {
        let entry = {
            let mut guard = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            let (map, order) = &mut *guard;
            let entry = map
                .entry(p)
                .or_insert_with(|| {
                    Arc::new(Cached {
                        slots: (0..self.table.names.len())
                            .map(|_| ColumnSlot::default())
                            .collect(),
                        rows: (0..self.pieces[p].rows.div_ceil(self.chunk_rows).max(1))
                            .map(|_| Mutex::new(None))
                            .collect(),
                    })
                })
                .clone();
            if let Some(pos) = order.iter().position(|&s| s == p) {
                order.remove(pos);
            }
            order.push_back(p);
            while order.len() > self.capacity() {
                if let Some(old) = order.pop_front() {
                    map.remove(&old);
                }
            }
            entry
        };
        let slots = &entry.slots;
        for (c, slot) in slots.iter().enumerate() {
            if !slot.claimed.swap(true, Ordering::AcqRel) {
                // The claim is ours alone, so this `set` cannot find the slot already set.
                let _ = slot.value.set(self.decode(p, c));
            }
        }
        let columns = slots
            .iter()
            .map(|slot| slot.value.wait().clone())
            .collect::<Result<Columns, String>>()
            .map_err(|reason| {
                let g = self.pieces[p].group;
                let path = self.files[self.groups[g].0].path.display().to_string();
                Error::corrupt(path, self.offsets[g], reason)
            })?;
        Ok((columns, entry))
    }

    /// The row-major copies of the chunks a batch reads (`(piece's place in `pieces`, chunk
    /// of the piece)` each), made now where no gather has made them (or since they were last
    /// dropped). A copy another worker is making is passed over until the rest are had, so
    /// two workers on one window make its copies side by side instead of one waiting on the
    /// other's.
    fn mirrors(
        &self,
        pieces: &[(usize, Columns, Group)],
        wanted: &[(usize, usize)],
    ) -> Vec<Arc<RowMajor>> {
        let make = |place: usize, chunk: usize| {
            let (p, columns, _) = &pieces[place];
            let first = chunk * self.chunk_rows as usize;
            let n = (self.pieces[*p].rows as usize - first).min(self.chunk_rows as usize);
            Arc::new(RowMajor::new(
                &self.table.kinds,
                &self.table.layout,
                columns,
                first,
                n,
            ))
        };
        let mut got: Vec<Option<Arc<RowMajor>>> = vec![None; wanted.len()];
        for wait in [false, true] {
            for (&(place, chunk), out) in wanted.iter().zip(got.iter_mut()) {
                if out.is_some() {
                    continue;
                }
                let slot = &pieces[place].2.rows[chunk];
                let mut guard = match slot.try_lock() {
                    Ok(guard) => guard,
                    Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                    Err(std::sync::TryLockError::WouldBlock) if !wait => continue,
                    Err(std::sync::TryLockError::WouldBlock) => {
                        slot.lock().unwrap_or_else(|e| e.into_inner())
                    }
                };
                *out = Some(guard.get_or_insert_with(|| make(place, chunk)).clone());
            }
        }
        got.into_iter().flatten().collect()
    }

    /// Pieces the cache holds: half as many when their row-major copies are kept too.
    fn capacity(&self) -> usize {
        if self.random.load(Ordering::Relaxed) {
            (self.cache_pieces / 2).max(8)
        } else {
            self.cache_pieces
        }
    }

    /// Counts `n` more rows read from piece `p`; once all of them have been, the piece
    /// leaves the cache (buffers in use by a batch stay alive until it is built), unless
    /// [`ParquetOptions::cache_bytes`] was given and the cache holds every piece of the
    /// dataset: then later epochs read them from it.
    fn consume(&self, p: usize, n: u64) {
        if self.keep && self.pieces.len() <= self.capacity() {
            return;
        }
        let rows = self.pieces[p].rows;
        let before = self.consumed[p].fetch_add(n, Ordering::Relaxed);
        if before < rows && before + n >= rows {
            let mut guard = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            let (map, order) = &mut *guard;
            map.remove(&p);
            if let Some(pos) = order.iter().position(|&s| s == p) {
                order.remove(pos);
            }
        }
    }

    /// Decodes column `c` of piece `p`; never panics (a corrupt page can make the decoder
    /// panic: that is a bad file, not a crash).
    fn decode(&self, p: usize, c: usize) -> Result<ArrayRef, String> {
        let (fi, gi, _) = self.groups[self.pieces[p].group];
        chute_core::quiet::catch_quietly(|| self.decode_inner(p, c))
            .unwrap_or_else(|why| {
                Err(format!(
                    "row group {gi}, column {:?}: the decoder failed on corrupt data ({why})",
                    self.table.names[c]
                ))
            })
            .map_err(|e| format!("{} {e}", self.files[fi].path.display()))
    }

    fn decode_inner(&self, p: usize, c: usize) -> Result<ArrayRef, String> {
        let Piece { group, first, rows } = self.pieces[p];
        let (_, gi, group_rows) = self.groups[group];
        let name = &self.table.names[c];
        let place = &self.cursors[group][c];
        let mut reading = place.lock().unwrap_or_else(|e| {
            // A decoder panicked holding it: its reader is in no known state.
            place.clear_poison();
            let mut reading = e.into_inner();
            reading.cursor = None;
            reading
        });
        if !reading.checked {
            self.check_pages(group, c)?;
            reading.checked = true;
        }
        if reading.cursor.as_ref().is_none_or(|k| k.next != first) {
            let old = reading.cursor.take();
            let k = self.cursor(group, c, first, old, reading.pages.clone())?;
            reading.pages = reading.pages.take().or_else(|| k.reader.page_index());
            reading.cursor = Some(k);
        }
        let cursor = &mut reading.cursor;
        let dt = self.files[self.groups[group].0].flat[c]
            .as_ref()
            .map(|(_, dt)| dt);
        let own = match (cursor.as_mut(), dt) {
            (Some(k), Some(dt)) => k.reader.flat(rows as usize, dt),
            _ => None,
        };
        let column = match own {
            Some(Ok(column)) => column,
            own => {
                if own.is_some() {
                    // chute's reader gave the piece back: arrow-rs reads it (and reports
                    // whatever is wrong with it).
                    *cursor = None;
                    *cursor = Some(self.arrow_cursor(group, c, first)?);
                }
                let k = cursor.as_mut().expect("set above");
                let Reader::Arrow(reader) = &mut k.reader else {
                    return Err(format!("row group {gi}, column {name:?}: no reader"));
                };
                let batch = match reader.next() {
                    Some(Ok(batch)) => batch,
                    end => {
                        *cursor = None;
                        return Err(match end {
                            Some(Err(e)) => format!("row group {gi}, column {name:?}: {e}"),
                            _ => {
                                format!("row group {gi}, column {name:?} ended before row {first}")
                            }
                        });
                    }
                };
                if batch.num_columns() != 1 {
                    return Err(format!(
                        "row group {gi}: column {name:?} decoded into several"
                    ));
                }
                columnar::descend(batch.column(0).clone(), &self.table.paths[c])
                    .map_err(|why| format!("row group {gi}, column {name:?}: {why}"))?
            }
        };
        let k = cursor.as_mut().expect("set above");
        k.next += rows;
        if k.next >= group_rows {
            *cursor = None;
        }
        let (fill, kind) = (self.table.fill_of(c), self.table.kinds[c]);
        let codes = self.table.codes[c].as_deref();
        columnar::checked(column, rows as usize, true, kind, fill, codes, || {
            format!("row group {gi}: column {name:?} (rows {first} on)")
        })
    }

    /// Checks the page headers of column `c` of row group `group` (see
    /// [`pages::check_pages`]) before arrow-rs reads them.
    fn check_pages(&self, group: usize, c: usize) -> Result<(), String> {
        let (fi, gi, _) = self.groups[group];
        let f = &self.files[fi];
        let max_decoded = chute_core::Limits::current().max_decoded_bytes;
        let columns = f.meta.metadata().row_group(gi).columns();
        for &leaf in &f.leaves[c] {
            if let Some(chunk) = columns.get(leaf) {
                pages::check_pages(chunk, gi, &f.data, max_decoded)?;
            }
        }
        Ok(())
    }

    /// A reader of column `c` of row group `group` from its row `first`, yielding a piece a
    /// batch: chute's own for a flat numeric column chunk it reads (taking the dictionary
    /// of `old`, the column's last reader, if it has one, and the chunk's page index `pages`
    /// if one has been walked), else arrow-rs's.
    fn cursor(
        &self,
        group: usize,
        c: usize,
        first: u64,
        old: Option<Cursor>,
        pages: Option<flat::PageIndex>,
    ) -> Result<Cursor, String> {
        let (fi, gi, _) = self.groups[group];
        let f = &self.files[fi];
        if let Some((leaf, dt)) = &f.flat[c] {
            let chunk = f.meta.metadata().row_group(gi).column(*leaf);
            let width = flat::width(dt).unwrap_or(0);
            if flat::reads(chunk, dt) {
                let scratch = self.scratch.clone();
                let old = old.map(|k| k.reader);
                let reader = match (width, old) {
                    (4, old) => {
                        let dict = match old {
                            Some(Reader::U32(o)) => o.dictionary(),
                            _ => None,
                        };
                        flat::Flat::new(&f.data, chunk, first, dict, pages, scratch)
                            .map(Reader::U32)
                    }
                    (_, old) => {
                        let dict = match old {
                            Some(Reader::U64(o)) => o.dictionary(),
                            _ => None,
                        };
                        flat::Flat::new(&f.data, chunk, first, dict, pages, scratch)
                            .map(Reader::U64)
                    }
                };
                if let Ok(reader) = reader {
                    self.hold(group);
                    return Ok(Cursor {
                        next: first,
                        reader,
                    });
                }
            }
        }
        self.arrow_cursor(group, c, first)
    }

    /// arrow-rs's reader of column `c` of row group `group` from its row `first`.
    fn arrow_cursor(&self, group: usize, c: usize, first: u64) -> Result<Cursor, String> {
        let (fi, gi, _) = self.groups[group];
        let f = &self.files[fi];
        let name = &self.table.names[c];
        let mut builder =
            ParquetRecordBatchReaderBuilder::new_with_metadata(f.data.clone(), f.meta.clone())
                .with_row_groups(vec![gi])
                .with_projection(ProjectionMask::leaves(
                    f.meta.parquet_schema(),
                    f.projections[c].iter().copied(),
                ))
                .with_batch_size(self.piece_rows[group].max(1) as usize);
        if first > 0 {
            // Whole pages before it are passed by their headers, not decompressed.
            builder = builder.with_offset(first as usize);
        }
        let reader = builder
            .build()
            .map_err(|e| format!("row group {gi}, column {name:?}: {e}"))?;
        self.hold(group);
        Ok(Cursor {
            next: first,
            reader: Reader::Arrow(reader),
        })
    }

    /// Notes that row group `group` has a cursor now, and drops the cursors of the group
    /// that has had one longest if more than [`CURSOR_GROUPS`] do.
    fn hold(&self, group: usize) {
        let mut groups = self.cursor_groups.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = groups.iter().position(|&h| h == group) {
            groups.remove(at);
        }
        groups.push_back(group);
        while groups.len() > CURSOR_GROUPS {
            let Some(old) = groups.pop_front() else { break };
            for place in self.cursors[old].iter() {
                // A cursor being read is left to its reader (never waited on: the caller
                // holds a cursor of `group`); it ends with its group, or at a later turn.
                if let Ok(mut reading) = place.try_lock() {
                    reading.cursor = None;
                }
            }
        }
    }

    /// An error for a null in column `col`, row `row` of piece `p`.
    fn null_error(&self, p: usize, row: usize, col: usize, why: Option<String>) -> Error {
        let Piece { group, first, .. } = self.pieces[p];
        let (fi, gi, _) = self.groups[group];
        let at = columnar::At {
            origin: self.files[fi].path.display().to_string(),
            offset: self.offsets[group],
            part: format!("row group {gi}"),
        };
        self.table.null_error(at, first as usize + row, col, why)
    }

    /// Refuses reads under a global shuffle the decoded cache cannot serve: a batch of rows
    /// drawn from the whole dataset touches nearly every piece, so with fewer pieces held
    /// than the dataset has, each batch would decode most of them again (an epoch of hours).
    fn order(&self) -> Result<(), Error> {
        if !self.thrashing.load(Ordering::Relaxed) {
            return Ok(());
        }
        let decoded = self.decoded;
        Err(ConfigError::new(
            "shuffle",
            format!(
                "a global shuffle over these Parquet files draws each batch from all {} \
                 pieces of their row groups ({decoded} bytes decoded), and the decoded cache \
                 holds {} of them under a random order: each batch would decode most of the \
                 dataset again. Use shuffle=\"block\" (pieces in random order, rows shuffled \
                 within windows of chunks: memory stays bounded), or give the decoded cache \
                 room for the whole dataset (cache_bytes, or the CLI's --decoded-cache, of at \
                 least {} bytes)",
                self.pieces.len(),
                self.capacity(),
                decoded.saturating_mul(2)
            ),
        )
        .into())
    }

    /// The piece and row in it of sample `id`.
    fn locate(&self, id: u64) -> Result<(usize, usize), Error> {
        let (shard, row) = self.manifest.locate_checked(id)?;
        let (p, first) = self.chunks[shard];
        Ok((p, (first + row) as usize))
    }
}

impl Source for ParquetSource {
    fn column_types(&self) -> Vec<chute_core::ColumnType> {
        self.table.column_types()
    }

    fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn read(&self, id: u64) -> Result<Sample, Error> {
        self.order()?;
        let (p, row) = self.locate(id)?;
        let columns = self.piece(p)?;
        let sample = self
            .table
            .sample_at(id, &columns, row, |c, why| self.null_error(p, row, c, why));
        drop(columns);
        self.consume(p, 1);
        sample
    }

    /// A new epoch (or a resumption): no row has been read yet.
    fn set_plan(&self, plan: &Plan) {
        let random = plan.config().shuffle != Shuffle::None;
        self.random.store(random, Ordering::Relaxed);
        let global = plan.config().shuffle == Shuffle::Global;
        self.thrashing.store(
            global && self.pieces.len() > self.capacity(),
            Ordering::Relaxed,
        );
        for n in self.consumed.iter().chain(&self.chunk_consumed) {
            n.store(0, Ordering::Relaxed);
        }
    }

    fn collate(
        &self,
        ids: &[u64],
        pool: &BufferPool,
    ) -> Option<Result<Vec<(String, Column)>, Error>> {
        Some(self.gather(ids, pool))
    }
}

impl ParquetSource {
    /// The columnar fast path: rows gathered from cached Arrow arrays into batch buffers.
    fn gather(&self, ids: &[u64], pool: &BufferPool) -> Result<Vec<(String, Column)>, Error> {
        self.order()?;
        /// A shard the batch reads from.
        struct Span {
            /// Its ids.
            ids: std::ops::Range<u64>,
            shard: usize,
            /// Its piece's place in `pieces`, and its first row in the piece.
            place: usize,
            first: usize,
            /// Its row-major copy's place in `mirrors` (random orders).
            mirror: usize,
            /// Rows of the batch read from it.
            read: u64,
        }
        let mirrored = self.mirrored && self.random.load(Ordering::Relaxed);
        // Locate every row once, by shard (a batch's rows mostly share one, and a block
        // shuffle's batch mixes the few of its window), as (place in `pieces`, row in the
        // piece) and, in random order, (place in `mirrors`, row in the shard).
        let mut rows = Vec::with_capacity(ids.len());
        let mut mrows = Vec::with_capacity(if mirrored { ids.len() } else { 0 });
        let mut pieces: Vec<(usize, Columns, Group)> = Vec::new();
        // (place in `pieces`, chunk of the piece) of each span's row-major copy.
        let mut wanted: Vec<(usize, usize)> = Vec::new();
        let mut spans: Vec<Span> = Vec::new();
        // Each shard's place in `spans`, once there are too many to search one by one (a
        // global shuffle's batch touches hundreds).
        let mut span_of: HashMap<usize, usize> = HashMap::new();
        let mut last = usize::MAX;
        for &id in ids {
            let found = if spans.len() <= 8 {
                // Without branching on each span: a block shuffle's ids alternate among its
                // window's shards at random, so a search that stops at the match (or a check
                // of the last span first) mispredicts at almost every id. The search's answer
                // is used as it is, not checked again (that check waited on the search).
                let at = spans.iter().enumerate().fold(usize::MAX, |at, (i, s)| {
                    if id.wrapping_sub(s.ids.start) < s.ids.end - s.ids.start {
                        i
                    } else {
                        at
                    }
                });
                (at != usize::MAX).then_some(at)
            } else if spans.get(last).is_some_and(|s| s.ids.contains(&id)) {
                Some(last)
            } else {
                let (shard, _) = self.manifest.locate_checked(id)?;
                span_of.get(&shard).copied()
            };
            last = match found {
                Some(at) => at,
                None => {
                    let (shard, row) = self.manifest.locate_checked(id)?;
                    let (p, first) = self.chunks[shard];
                    let place = match pieces.iter().position(|(h, ..)| *h == p) {
                        Some(place) => place,
                        None => {
                            let (columns, entry) = self.cached(p)?;
                            pieces.push((p, columns, entry));
                            pieces.len() - 1
                        }
                    };
                    if mirrored {
                        wanted.push((place, shard - self.piece_chunks[p]));
                    }
                    let lo = id - row;
                    span_of.insert(shard, spans.len());
                    spans.push(Span {
                        ids: lo..lo + self.manifest.shards[shard].samples,
                        shard,
                        place,
                        first: first as usize,
                        mirror: wanted.len().wrapping_sub(1),
                        read: 0,
                    });
                    spans.len() - 1
                }
            };
            let s = &mut spans[last];
            let offset = (id - s.ids.start) as usize;
            rows.push((s.place, s.first + offset));
            if mirrored {
                mrows.push((s.mirror, offset));
            }
            s.read += 1;
        }
        let mirrors = self.mirrors(&pieces, &wanted);
        let parts: Vec<&[ArrayRef]> = pieces.iter().map(|(_, cols, _)| cols.as_slice()).collect();
        let copies: Vec<&RowMajor> = mirrors.iter().map(|m| m.as_ref()).collect();
        let out = self.table.gather(
            &parts,
            Some((copies.as_slice(), mrows.as_slice())),
            &rows,
            pool,
            |at, row, c, why| self.null_error(pieces[at].0, row, c, why),
        );
        drop(copies);
        drop(mirrors);
        drop(parts);
        let mut per = vec![0u64; pieces.len()];
        for span in &spans {
            per[span.place] += span.read;
            if !mirrored {
                continue;
            }
            // A shard all of whose rows have been read needs its copy no more this epoch.
            let rows = self.manifest.shards[span.shard].samples;
            let before = self.chunk_consumed[span.shard].fetch_add(span.read, Ordering::Relaxed);
            if before < rows && before + span.read >= rows {
                let (p, _, entry) = &pieces[span.place];
                entry.rows[span.shard - self.piece_chunks[*p]]
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take();
            }
        }
        let ids: Vec<usize> = pieces.iter().map(|(p, ..)| *p).collect();
        drop(pieces);
        for (p, n) in ids.into_iter().zip(per) {
            self.consume(p, n);
        }
        out
    }
}

/// Writes tokenized documents to a Parquet file, as a tokenized Hugging Face dataset holds
/// them: `input_ids` (`list<int32>`) and `labels` (`list<int64>`, -100 where the loss does not
/// count), a row a document, a row group every `row_group_rows` documents; under a temporary
/// name until [`TokenListWriter::finish`] renames it into place.
pub struct TokenListWriter {
    path: PathBuf,
    row_group_rows: usize,
    ids: Vec<i32>,
    labels: Vec<i64>,
    offsets: Vec<i32>,
    written: u64,
    schema: arrow_schema::SchemaRef,
    writer: ArrowWriter<AtomicFile>,
}

impl std::fmt::Debug for TokenListWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenListWriter")
            .field("path", &self.path)
            .field("rows", &self.written)
            .finish()
    }
}

impl TokenListWriter {
    /// A writer to `path`.
    pub fn create(path: impl AsRef<Path>, row_group_rows: usize) -> Result<Self, Error> {
        use arrow_schema::{DataType, Field, Schema};
        let path = path.as_ref().to_path_buf();
        let list = |t: DataType| DataType::List(Arc::new(Field::new("item", t, true)));
        let schema = Arc::new(Schema::new(vec![
            Field::new("input_ids", list(DataType::Int32), false),
            Field::new("labels", list(DataType::Int64), false),
        ]));
        let file = AtomicFile::create(&path)?;
        let writer = ArrowWriter::try_new(file, Arc::clone(&schema), None)
            .map_err(|e| Error::io(path.display().to_string(), std::io::Error::other(e)))?;
        Ok(TokenListWriter {
            schema,
            path,
            row_group_rows: row_group_rows.max(1),
            ids: Vec::new(),
            labels: Vec::new(),
            offsets: vec![0],
            written: 0,
            writer,
        })
    }

    /// Adds a document: its ids and as many labels.
    pub fn add(&mut self, ids: &[u32], labels: &[i64]) -> Result<(), Error> {
        if ids.len() != labels.len() || ids.iter().any(|&i| i > i32::MAX as u32) {
            return Err(ConfigError::new(
                "labels",
                format!(
                    "{} ids and {} labels (ids below 2^31)",
                    ids.len(),
                    labels.len()
                ),
            )
            .into());
        }
        self.ids.extend(ids.iter().map(|&i| i as i32));
        self.labels.extend_from_slice(labels);
        let end = i32::try_from(self.ids.len()).unwrap_or(i32::MAX);
        self.offsets.push(end);
        if self.offsets.len() > self.row_group_rows || self.ids.len() > (1 << 28) {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), Error> {
        use arrow_array::{Int32Array, Int64Array, ListArray, RecordBatch};
        use arrow_buffer::OffsetBuffer;
        use arrow_schema::{DataType, Field};
        if self.offsets.len() == 1 {
            return Ok(());
        }
        let offsets = OffsetBuffer::new(std::mem::replace(&mut self.offsets, vec![0]).into());
        let item = |t: DataType| Arc::new(Field::new("item", t, true));
        let ids = ListArray::new(
            item(DataType::Int32),
            offsets.clone(),
            Arc::new(Int32Array::from(std::mem::take(&mut self.ids))),
            None,
        );
        let labels = ListArray::new(
            item(DataType::Int64),
            offsets,
            Arc::new(Int64Array::from(std::mem::take(&mut self.labels))),
            None,
        );
        let origin = self.path.display().to_string();
        let io = |e: parquet::errors::ParquetError| Error::io(&origin, std::io::Error::other(e));
        let batch = RecordBatch::try_new(
            Arc::clone(&self.schema),
            vec![Arc::new(ids), Arc::new(labels)],
        )
        .map_err(|e| Error::io(&origin, std::io::Error::other(e)))?;
        self.writer.write(&batch).map_err(io)?;
        self.writer.flush().map_err(io)?;
        self.written += batch.num_rows() as u64;
        Ok(())
    }

    /// Writes the rest and the footer, then renames the file into place; the documents
    /// written.
    pub fn finish(mut self) -> Result<u64, Error> {
        self.flush()?;
        let origin = self.path.display().to_string();
        let file = self
            .writer
            .into_inner()
            .map_err(|e| Error::io(&origin, std::io::Error::other(e)))?;
        file.finish()?;
        Ok(self.written)
    }
}

/// Writes samples to a Parquet file: numeric scalars become numeric columns, fixed-shape 1-D
/// arrays fixed-size lists, bytes binary and text string columns (see
/// `columnar::RowBuilder`). The schema is taken from the first sample; a row group is
/// written every `row_group_rows` samples. The file is written under `<path>.tmp` (an
/// [`AtomicFile`]) and renamed by [`ParquetWriter::finish`]; dropping the writer without
/// finishing (or a failed `finish`) deletes the temporary file.
pub struct ParquetWriter {
    path: PathBuf,
    row_group_rows: usize,
    rows: columnar::RowBuilder,
    written: u64,
    /// Created with the first row, which gives the schema.
    writer: Option<ArrowWriter<AtomicFile>>,
}

impl std::fmt::Debug for ParquetWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParquetWriter")
            .field("path", &self.path)
            .field("rows", &self.written)
            .finish()
    }
}

impl ParquetWriter {
    /// A writer to `path`, flushing a row group every `row_group_rows` rows.
    pub fn create(path: impl AsRef<Path>, row_group_rows: usize) -> Result<Self, Error> {
        let path = path.as_ref().to_path_buf();
        Ok(ParquetWriter {
            rows: columnar::RowBuilder::new("parquet", path.display().to_string()),
            path,
            row_group_rows: row_group_rows.max(1),
            written: 0,
            writer: None,
        })
    }

    fn origin(&self) -> String {
        self.path.display().to_string()
    }

    /// Adds a row.
    pub fn write(&mut self, sample: &Sample) -> Result<(), Error> {
        self.rows.push(sample)?;
        if self.writer.is_none() {
            let schema = self.rows.schema().expect("set by the first row").clone();
            let file = AtomicFile::create(&self.path)?;
            let writer = ArrowWriter::try_new(file, schema, None)
                .map_err(|e| Error::io(self.origin(), std::io::Error::other(e)))?;
            self.writer = Some(writer);
        }
        if self.rows.len() >= self.row_group_rows {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), Error> {
        let Some(batch) = self.rows.take_batch()? else {
            return Ok(());
        };
        let origin = self.origin();
        let w = self.writer.as_mut().expect("writer set with the first row");
        w.write(&batch)
            .map_err(|e| Error::io(&origin, std::io::Error::other(e)))?;
        w.flush()
            .map_err(|e| Error::io(&origin, std::io::Error::other(e)))?;
        self.written += batch.num_rows() as u64;
        Ok(())
    }

    /// Writes the last row group and the footer, then renames the file into place. Returns
    /// the rows written.
    pub fn finish(mut self) -> Result<u64, Error> {
        self.flush()?;
        match self.writer.take() {
            Some(w) => {
                let file = w
                    .into_inner()
                    .map_err(|e| Error::io(self.origin(), std::io::Error::other(e)))?;
                file.finish()?;
            }
            None => {
                return Err(ConfigError::new(
                    "parquet",
                    "no rows written: an empty file has no schema",
                )
                .into());
            }
        }
        Ok(self.written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{ReaderUnderTest, check_reader, same_sample};
    use chute_core::{Array, DType, Field, PlanConfig};

    fn sample(i: u64) -> Sample {
        let label = (i as i64 * 7 - 3).to_le_bytes();
        let feats: Vec<u8> = (0..4)
            .flat_map(|k| (i as f32 + k as f32 * 0.5).to_le_bytes())
            .collect();
        Sample::new(i)
            .with(
                "label",
                Field::Array(Array::new(
                    DType::I64,
                    vec![],
                    Bytes::copy_from_slice(&label),
                )),
            )
            .with(
                "x",
                Field::Array(Array::new(DType::F32, vec![4], Bytes::from(feats))),
            )
            .with(
                "raw",
                Field::Bytes(Bytes::from(vec![i as u8; (i % 5) as usize])),
            )
            .with("caption", Field::Text(Bytes::from(format!("row {i} é"))))
    }

    fn write(dir: &Path, name: &str, samples: &[Sample], rg: usize) -> PathBuf {
        let path = dir.join(name);
        let mut w = ParquetWriter::create(&path, rg).unwrap();
        for s in samples {
            w.write(s).unwrap();
        }
        assert_eq!(w.finish().unwrap(), samples.len() as u64);
        path
    }

    struct Under;

    impl ReaderUnderTest for Under {
        fn name(&self) -> &str {
            "parquet"
        }

        fn write(&self, samples: &[Sample]) -> Result<Vec<u8>, Error> {
            let dir = tempfile::tempdir().unwrap();
            let p = write(dir.path(), "w.parquet", samples, 3);
            Ok(std::fs::read(p).unwrap())
        }

        fn read_all(&self, shard: &[u8], origin: &str) -> Result<Vec<Sample>, Error> {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("shard-under-test.parquet");
            std::fs::write(&p, shard).unwrap();
            let src = ParquetSource::open(&[&p], ParquetOptions::default())
                .map_err(|e| Error::corrupt(origin, 0, e.to_string()))?;
            (0..src.manifest().total_samples())
                .map(|id| {
                    src.read(id)
                        .map_err(|e| Error::corrupt(origin, 0, e.to_string()))
                })
                .collect()
        }

        fn read_at(&self, shard: &[u8], origin: &str, i: usize) -> Result<Sample, Error> {
            let all = self.read_all(shard, origin)?;
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("s.parquet");
            std::fs::write(&p, shard).unwrap();
            let src = ParquetSource::open(&[&p], ParquetOptions::default())?;
            // Random access through a cold cache must agree with the sequential pass.
            let got = src.read(i as u64)?;
            same_sample(&all[i], &got).map_err(|e| Error::corrupt(origin, 0, e))?;
            Ok(got)
        }
    }

    fn keyless(s: Sample) -> Sample {
        Sample {
            key: String::new(),
            ..s
        }
    }

    #[test]
    fn round_trips_and_passes_the_reader_suite() {
        let samples: Vec<Sample> = (0..7).map(sample).map(keyless).collect();
        check_reader(&Under, &samples).unwrap();
    }

    #[test]
    fn row_groups_are_shards_and_gather_matches_per_sample_reads() {
        let dir = tempfile::tempdir().unwrap();
        let a = write(
            dir.path(),
            "a.parquet",
            &(0..10).map(sample).collect::<Vec<_>>(),
            4,
        );
        let b = write(
            dir.path(),
            "b.parquet",
            &(10..15).map(sample).collect::<Vec<_>>(),
            4,
        );
        let src = ParquetSource::open(&[&a, &b], ParquetOptions::default()).unwrap();
        let m = src.manifest();
        assert_eq!(m.shards.len(), 5, "4 + 4 + 2 rows, then 4 + 1");
        assert_eq!(m.total_samples(), 15);
        assert!(
            m.shards[1].path.ends_with("a.parquet#rowgroup1:0+4"),
            "{}",
            m.shards[1].path
        );
        // Row groups split into chunks of at most chunk_rows rows.
        let opts = ParquetOptions {
            chunk_rows: Some(3),
            ..Default::default()
        };
        let chunked = ParquetSource::open(&[&a, &b], opts).unwrap();
        let counts: Vec<u64> = chunked
            .manifest()
            .shards
            .iter()
            .map(|s| s.samples)
            .collect();
        assert_eq!(counts, [3, 1, 3, 1, 2, 3, 1, 1]);
        for id in 0..15 {
            same_sample(&src.read(id).unwrap(), &chunked.read(id).unwrap()).unwrap();
        }
        let pool = BufferPool::new(8);
        let ids = [14u64, 0, 7, 3, 11];
        let cols = src.collate(&ids, &pool).unwrap().unwrap();
        assert_eq!(
            cols.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["label", "x", "raw", "caption"]
        );
        let label = cols[0].1.as_tensor().unwrap();
        assert_eq!(label.shape(), [5]);
        assert_eq!(
            label.as_slice::<i64>().unwrap(),
            ids.map(|i| i as i64 * 7 - 3)
        );
        let x = cols[1].1.as_tensor().unwrap();
        assert_eq!(x.shape(), [5, 4]);
        assert_eq!(x.as_slice::<f32>().unwrap()[4..8], [0.0, 0.5, 1.0, 1.5]);
        let Column::Var(caption) = &cols[3].1 else {
            panic!()
        };
        assert_eq!(caption.get(2), "row 7 é".as_bytes());
        let Column::Var(raw) = &cols[2].1 else {
            panic!()
        };
        assert_eq!(raw.get(0), [14u8; 4]);
        for &id in &ids {
            same_sample(&keyless(sample(id)), &src.read(id).unwrap()).unwrap();
        }
    }

    #[test]
    fn row_groups_are_decoded_in_pieces_of_chunks_that_are_units_of_the_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let all: Vec<Sample> = (0..60).map(sample).collect();
        let a = write(dir.path(), "a.parquet", &all, 12);
        let opts = |chunk_rows, piece_bytes| ParquetOptions {
            chunk_rows: Some(chunk_rows),
            piece_bytes: Some(piece_bytes),
            ..Default::default()
        };
        // 5 groups of 12 rows, 3 chunks each; pieces from one chunk to a whole group.
        let whole = ParquetSource::open(&[&a], opts(4, 1 << 20)).unwrap();
        assert_eq!(whole.pieces.len(), 5);
        assert_eq!(whole.manifest().units, [0, 3, 6, 9, 12]);
        assert!(
            ParquetSource::open(&[&a], opts(4, 1))
                .unwrap()
                .manifest()
                .units
                .is_empty(),
            "pieces of one chunk: no units"
        );
        let pool = BufferPool::new(1 << 20);
        let mut split = false;
        for piece_bytes in [1, 100, 200, 300, 400, 600, 1 << 20] {
            let src = ParquetSource::open(&[&a], opts(4, piece_bytes)).unwrap();
            // Pieces tile each group in whole chunks, and each is a unit (when any is
            // more than one chunk).
            let mut next = 0;
            for (p, piece) in src.pieces.iter().enumerate() {
                if piece.first == 0 {
                    assert_eq!(next, piece.group * 12, "{piece_bytes}");
                }
                assert_eq!(piece.group * 12 + piece.first as usize, next);
                assert!(piece.first % 4 == 0 && piece.rows > 0);
                next += piece.rows as usize;
                let chunks = src.chunks.iter().filter(|(q, _)| *q == p).count() as u64;
                assert_eq!(chunks, piece.rows.div_ceil(4));
            }
            assert_eq!(next, 60);
            split |= src.pieces.len() > 5 && src.pieces.iter().any(|p| p.rows > 4);
            if src.pieces.len() < src.chunks.len() {
                let units: Vec<u64> = src.piece_chunks.iter().map(|&c| c as u64).collect();
                assert_eq!(src.manifest().units, units);
            }
            // Windows of one chunk: the epoch reads piece by piece.
            let cfg = PlanConfig {
                shuffle: Shuffle::Block { window: 1 },
                ..Default::default()
            };
            let plan = Plan::new(src.manifest(), &cfg).unwrap();
            src.set_plan(&plan);
            let ids: Vec<u64> = plan.iter().collect();
            let mut at = 0;
            while at < ids.len() {
                let (p, _) = src.locate(ids[at]).unwrap();
                let n = src.pieces[p].rows as usize;
                assert!(
                    ids[at..at + n]
                        .iter()
                        .all(|&i| src.locate(i).unwrap().0 == p),
                    "{ids:?}"
                );
                at += n;
            }
            // Pieces decoded in random order, by gathers and reads, give the rows written.
            for batch in ids.chunks(5) {
                gathers_labels(&src, batch, &pool);
            }
            for &id in ids.iter().rev() {
                same_sample(&keyless(sample(id)), &src.read(id).unwrap()).unwrap();
            }
        }
        assert!(
            split,
            "some piece size splits groups into pieces of several chunks"
        );
    }

    /// Gathers `ids` and checks their labels (the first column of `sample`'s rows).
    fn gathers_labels(src: &ParquetSource, ids: &[u64], pool: &BufferPool) {
        let cols = src.gather(ids, pool).unwrap();
        let Column::Tensor(label) = &cols[0].1 else {
            panic!("labels are a tensor")
        };
        let want: Vec<i64> = ids.iter().map(|&i| i as i64 * 7 - 3).collect();
        assert_eq!(label.as_slice::<i64>().unwrap(), want);
    }

    #[test]
    fn cursors_are_kept_in_a_few_row_groups_only() {
        let dir = tempfile::tempdir().unwrap();
        // 16 groups of 12 rows in pieces of one chunk (4 rows), read piece by piece in
        // random order: a cursor is left in the middle of most groups.
        let all: Vec<Sample> = (0..192).map(sample).collect();
        let a = write(dir.path(), "a.parquet", &all, 12);
        let options = ParquetOptions {
            chunk_rows: Some(4),
            piece_bytes: Some(1),
            ..Default::default()
        };
        let src = ParquetSource::open(&[&a], options).unwrap();
        assert_eq!((src.groups.len(), src.pieces.len()), (16, 48));
        let cfg = PlanConfig {
            shuffle: Shuffle::Block { window: 1 },
            ..Default::default()
        };
        let plan = Plan::new(src.manifest(), &cfg).unwrap();
        src.set_plan(&plan);
        let pool = BufferPool::new(1 << 20);
        let ids: Vec<u64> = plan.iter().collect();
        let mut most = 0;
        for batch in ids.chunks(4) {
            gathers_labels(&src, batch, &pool);
            let live = src
                .cursors
                .iter()
                .filter(|g| g.iter().any(|c| c.lock().unwrap().cursor.is_some()))
                .count();
            most = most.max(live);
        }
        assert!(most > 1 && most <= CURSOR_GROUPS, "{most}");
    }

    #[test]
    fn a_row_group_read_whole_leaves_the_cache_and_reads_again() {
        let dir = tempfile::tempdir().unwrap();
        // 20 groups of 4 rows, more than the cache holds (8 at least, here 8 with 1 byte).
        let all: Vec<Sample> = (0..80).map(sample).collect();
        let a = write(dir.path(), "a.parquet", &all, 4);
        let options = ParquetOptions {
            cache_bytes: Some(1),
            ..ParquetOptions::default()
        };
        let src = ParquetSource::open(&[&a], options).unwrap();
        let pool = BufferPool::new(1 << 20);
        let cached = |g: usize| src.cache.lock().unwrap().0.contains_key(&g);
        src.gather(&[0, 1, 2], &pool).unwrap();
        assert!(cached(0), "rows of group 0 are still to be read");
        src.gather(&[3, 4], &pool).unwrap();
        assert!(!cached(0), "all of group 0 read: dropped");
        assert!(cached(1));
        // Read again (padding, another loader): decoded anew, the same rows.
        let again = src.gather(&[0, 3], &pool).unwrap();
        let direct = [src.read(0).unwrap(), src.read(3).unwrap()];
        assert_eq!(again.len(), direct[0].fields.len());
        // A new plan starts the counts over.
        src.set_plan(&Plan::new(src.manifest(), &Default::default()).unwrap());
        src.gather(&[0, 1, 2], &pool).unwrap();
        assert!(cached(0));
        // A cache given room for the whole dataset keeps it for the next epochs; without a
        // size given, pieces are dropped once read (streaming).
        let all_in = ParquetSource::open(
            &[&a],
            ParquetOptions {
                cache_bytes: Some(1 << 30),
                ..ParquetOptions::default()
            },
        )
        .unwrap();
        all_in.gather(&[0, 1, 2, 3], &pool).unwrap();
        assert!(all_in.cache.lock().unwrap().0.contains_key(&0));
        let streaming = ParquetSource::open(&[&a], ParquetOptions::default()).unwrap();
        streaming.gather(&[0, 1, 2, 3], &pool).unwrap();
        assert!(!streaming.cache.lock().unwrap().0.contains_key(&0));
        // A global shuffle over more pieces than the cache holds is refused with what to do
        // (each batch would decode most of the dataset again); block shuffle is not, and a
        // cache that holds the dataset serves a global shuffle.
        let plan = |shuffle| {
            let cfg = PlanConfig {
                shuffle,
                ..Default::default()
            };
            Plan::new(src.manifest(), &cfg).unwrap()
        };
        src.set_plan(&plan(Shuffle::Global));
        let err = src.gather(&[0, 1], &pool).unwrap_err().to_string();
        assert!(
            err.contains("global shuffle") && err.contains("shuffle=\"block\""),
            "{err}"
        );
        assert!(src.read(0).is_err());
        src.set_plan(&plan(Shuffle::block()));
        src.gather(&[0, 1], &pool).unwrap();
        streaming.set_plan(&plan(Shuffle::Global));
        streaming.gather(&[0, 41, 79], &pool).unwrap();
    }

    /// Row `i` of the stack test: floats `a`, `b`, a 3-float list `v`, an id, a caption.
    fn stack_sample(i: u64) -> Sample {
        let f = |x: f32| {
            Field::Array(Array::new(
                DType::F32,
                vec![],
                Bytes::copy_from_slice(&x.to_le_bytes()),
            ))
        };
        let v: Vec<u8> = (0..3)
            .flat_map(|k| (i as f32 * 10.0 + k as f32).to_le_bytes())
            .collect();
        Sample::new(i)
            .with("a", f(i as f32))
            .with(
                "id",
                Field::Array(Array::new(
                    DType::I64,
                    vec![],
                    Bytes::copy_from_slice(&(i as i64).to_le_bytes()),
                )),
            )
            .with("b", f(-(i as f32)))
            .with(
                "v",
                Field::Array(Array::new(DType::F32, vec![3], Bytes::from(v))),
            )
            .with("t", Field::Text(Bytes::from(format!("t{i}"))))
    }

    /// What the stack `s = [b, v, a]` holds for row `i`.
    fn stacked(i: u64) -> [f32; 5] {
        let x = i as f32;
        [-x, x * 10.0, x * 10.0 + 1.0, x * 10.0 + 2.0, x]
    }

    #[test]
    fn stacks_are_one_column_on_every_path() {
        let dir = tempfile::tempdir().unwrap();
        let rows: Vec<Sample> = (0..40).map(stack_sample).collect();
        let a = write(dir.path(), "a.parquet", &rows[..25], 10);
        let b = write(dir.path(), "b.parquet", &rows[25..], 7);
        let stack = vec![("s".to_string(), vec!["b".into(), "v".into(), "a".into()])];
        let opts = ParquetOptions {
            chunk_rows: Some(4),
            stack: stack.clone(),
            ..Default::default()
        };
        let src = ParquetSource::open(&[&a, &b], opts).unwrap();
        assert_eq!(src.fields(), ["s", "id", "t"], "the stack takes a's place");
        assert!(src.manifest().params.get("stack").is_some());
        // Per sample.
        for id in [0u64, 13, 39] {
            let sample = src.read(id).unwrap();
            let Some(Field::Array(s)) = sample.get("s") else {
                panic!()
            };
            assert_eq!(s.shape, [5]);
            let want: Vec<u8> = stacked(id).iter().flat_map(|x| x.to_le_bytes()).collect();
            assert_eq!(&s.data[..], &want[..]);
            assert!(sample.get("a").is_none() && sample.get("v").is_none());
        }
        let pool = BufferPool::new(8);
        let check = |ids: &[u64]| {
            let cols = src.collate(ids, &pool).unwrap().unwrap();
            let names: Vec<&str> = cols.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names, ["s", "id", "t"]);
            let s = cols[0].1.as_tensor().unwrap();
            assert_eq!(s.shape(), [ids.len(), 5]);
            let want: Vec<f32> = ids.iter().flat_map(|&i| stacked(i)).collect();
            assert_eq!(s.as_slice::<f32>().unwrap(), &want[..], "ids {ids:?}");
            let id = cols[1].1.as_tensor().unwrap();
            let want: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
            assert_eq!(id.as_slice::<i64>().unwrap(), &want[..]);
            let Column::Var(t) = &cols[2].1 else { panic!() };
            assert_eq!(
                t.get(ids.len() - 1),
                format!("t{}", ids[ids.len() - 1]).as_bytes()
            );
        };
        // File order: a run inside a row group, one across groups and files.
        check(&[10, 11, 12, 13]);
        check(&[18, 19, 20, 21, 22, 23, 24, 25, 26]);
        // Random order: from the row-major copies of the chunks, before and after each
        // chunk has been read whole (its copy dropped, then made again).
        for shuffle in [Shuffle::Block { window: 2 }, Shuffle::Global] {
            let cfg = PlanConfig {
                shuffle,
                ..Default::default()
            };
            src.set_plan(&Plan::new(src.manifest(), &cfg).unwrap());
            check(&[39, 0, 17, 3, 25, 24, 9]);
            check(&(0..40).rev().collect::<Vec<_>>());
            check(&[5, 5, 6, 7, 4]);
            check(&[39, 0, 17, 3, 25, 24, 9]);
        }
        // Stacks the columns cannot make are refused, naming what is wrong.
        let bad = |stack: Vec<(&str, Vec<&str>)>| {
            let opts = ParquetOptions {
                stack: stack
                    .into_iter()
                    .map(|(n, m)| (n.to_string(), m.into_iter().map(String::from).collect()))
                    .collect(),
                ..Default::default()
            };
            ParquetSource::open(&[&a], opts).unwrap_err().to_string()
        };
        let e = bad(vec![("s", vec!["a", "nope"])]);
        assert!(e.contains("no column \"nope\""), "{e}");
        let e = bad(vec![("s", vec!["a", "id"])]);
        assert!(e.contains("share one dtype") && e.contains("\"id\""), "{e}");
        let e = bad(vec![("s", vec!["a", "t"])]);
        assert!(e.contains("only numeric columns"), "{e}");
        let e = bad(vec![("s", vec!["a"]), ("u", vec!["b", "a"])]);
        assert!(e.contains("in stack \"s\" and in stack \"u\""), "{e}");
        let e = bad(vec![("id", vec!["a", "b"])]);
        assert!(e.contains("two fields named \"id\""), "{e}");
        let e = bad(vec![("s", vec![])]);
        assert!(e.contains("has no columns"), "{e}");
    }

    #[test]
    fn random_order_gathers_fields_of_every_width() {
        // Fields 1, 2, 5, 8 and 12 bytes wide (5 and 12 take the row-major copy's general
        // path), gathered in random order from the row-major copies, against the values.
        let value = |i: u64, k: u64| (i * 31 + k * 7) as u8;
        let array = |i: u64, dtype: DType, shape: Vec<usize>, bytes: usize, k: u64| {
            let data: Vec<u8> = (0..bytes as u64).map(|b| value(i, k * 16 + b)).collect();
            Field::Array(Array::new(dtype, shape, Bytes::from(data)))
        };
        let sample = |i: u64| {
            Sample::new(i)
                .with("b", array(i, DType::U8, vec![], 1, 0))
                .with("h", array(i, DType::I16, vec![], 2, 1))
                .with("w", array(i, DType::U8, vec![5], 5, 2))
                .with("d", array(i, DType::F64, vec![], 8, 3))
                .with("t", array(i, DType::I32, vec![3], 12, 4))
        };
        let dir = tempfile::tempdir().unwrap();
        let all: Vec<Sample> = (0..300).map(sample).collect();
        let a = write(dir.path(), "w.parquet", &all, 128);
        let opts = ParquetOptions {
            chunk_rows: Some(50),
            ..Default::default()
        };
        let src = ParquetSource::open(&[&a], opts).unwrap();
        let cfg = PlanConfig {
            shuffle: Shuffle::Block { window: 3 },
            ..Default::default()
        };
        src.set_plan(&Plan::new(src.manifest(), &cfg).unwrap());
        let pool = BufferPool::new(8);
        let ids: Vec<u64> = (0..300).map(|i| (i * 97 + 13) % 300).collect();
        for batch in ids.chunks(61) {
            let cols = src.collate(batch, &pool).unwrap().unwrap();
            for (k, (name, width)) in [("b", 1), ("h", 2), ("w", 5), ("d", 8), ("t", 12)]
                .into_iter()
                .enumerate()
            {
                assert_eq!(cols[k].0, name);
                let got = cols[k].1.as_tensor().unwrap().as_bytes();
                let want: Vec<u8> = batch
                    .iter()
                    .flat_map(|&i| (0..width).map(move |b| value(i, k as u64 * 16 + b)))
                    .collect();
                assert_eq!(got, &want[..], "column {name}");
            }
        }
    }

    #[test]
    fn projection_and_errors_name_the_column() {
        let dir = tempfile::tempdir().unwrap();
        let a = write(
            dir.path(),
            "a.parquet",
            &(0..3).map(sample).collect::<Vec<_>>(),
            8,
        );
        let opts = ParquetOptions {
            columns: Some(vec!["caption".into(), "label".into()]),
            ..Default::default()
        };
        let src = ParquetSource::open(&[&a], opts).unwrap();
        assert_eq!(src.columns(), ["caption", "label"]);
        let s = src.read(2).unwrap();
        assert_eq!(
            s.fields.iter().map(|(n, _)| n.as_ref()).collect::<Vec<_>>(),
            ["caption", "label"]
        );
        let bad = ParquetOptions {
            columns: Some(vec!["nope".into()]),
            ..Default::default()
        };
        let e = ParquetSource::open(&[&a], bad).unwrap_err().to_string();
        assert!(e.contains("nope") && e.contains("caption"), "{e}");
        let junk = dir.path().join("junk.parquet");
        std::fs::write(&junk, b"not parquet at all").unwrap();
        let e = ParquetSource::open(&[&junk], ParquetOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("junk.parquet"), "{e}");
    }

    #[test]
    fn reads_a_file_pyarrow_reads_whose_footer_needs_mending() {
        // testdata/parquet/README.md: parquet-mr's dictionary page offset of 0, and a field
        // of Dremio's own; pyarrow reads 39 rows of 1552.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/parquet");
        let path = dir.join("dict-page-offset-zero.parquet");
        let src = ParquetSource::open(&[path], ParquetOptions::default()).unwrap();
        assert_eq!(src.manifest().total_samples(), 39);
        let ids: Vec<u64> = (0..39).collect();
        let batch = src.collate(&ids, &BufferPool::new(4)).unwrap().unwrap();
        assert_eq!(batch[0].0, "l_partkey");
        let v = batch[0]
            .1
            .as_tensor()
            .unwrap()
            .as_slice::<i32>()
            .unwrap()
            .to_vec();
        assert_eq!(v, vec![1552; 39]);
        for id in [0, 17, 38] {
            let s = src.read(id).unwrap();
            assert_eq!(s.fields.len(), 1);
        }
    }

    #[test]
    fn reads_pyarrow_golden_files_exactly() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/parquet");
        for name in ["pyarrow_golden.parquet", "pyarrow_golden_zstd.parquet"] {
            let src = ParquetSource::open(&[dir.join(name)], ParquetOptions::default()).unwrap();
            assert_eq!(src.manifest().total_samples(), 50);
            let cols = src.columns().to_vec();
            assert_eq!(cols.len(), 20, "{cols:?}");
            let ids: Vec<u64> = (0..50).rev().collect();
            let batch = src.collate(&ids, &BufferPool::new(4)).unwrap().unwrap();
            for (j, (name, col)) in batch.iter().enumerate().take(16) {
                assert_eq!(name, &format!("f{j}"));
                let v = col.as_tensor().unwrap().as_slice::<f32>().unwrap();
                for (r, &id) in ids.iter().enumerate() {
                    assert_eq!(v[r], id as f32 * (j as f32 + 1.0) + 0.25);
                }
            }
            let label = batch[16].1.as_tensor().unwrap().as_slice::<i64>().unwrap();
            assert_eq!(label[0], 49 * 3 - 7);
            let Column::Var(caption) = &batch[17].1 else {
                panic!()
            };
            assert_eq!(caption.get(1), "caption 48 ✓".as_bytes());
            let emb = batch[18].1.as_tensor().unwrap();
            assert_eq!(emb.shape(), [50, 3]);
            assert_eq!(&emb.as_slice::<i32>().unwrap()[..3], [147, 148, 149]);
            let Column::Var(blob) = &batch[19].1 else {
                panic!()
            };
            assert_eq!(blob.get(0), [49u8]);
            let s = src.read(5).unwrap();
            let Some(Field::Text(t)) = s.get("caption") else {
                panic!()
            };
            assert_eq!(&t[..], "caption 5 ✓".as_bytes());
        }
    }
}
