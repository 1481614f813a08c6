//! Arrow IPC: [`ArrowSource`] reads Arrow IPC files (`.arrow`, `.feather` version 2, the
//! random-access format with a footer) and streams (`.arrows`, and the `.arrow` files
//! Hugging Face `datasets` writes), in place: local files are memory-mapped and their columns
//! are views of the map, so opening a dataset reads only its messages' metadata. A record
//! batch is decoded (its arrays built, checked and, if the file is compressed with LZ4 or
//! zstd, decompressed) when a worker first needs it, then kept.
//!
//! Sources over Arrow data that is already in memory come from [`ArrowSource::from_batches`]
//! (a Hugging Face dataset's table handed over through the Arrow C stream interface), with an
//! optional indices mapping: sample `i` is row `indices[i]`, as after a `datasets`
//! `shuffle()` or `select()`.
//!
//! A shard of the manifest is a chunk of at most [`ArrowOptions::chunk_rows`] rows of one
//! record batch (`data.arrow#batch3:0+1000`), or of the indices mapping
//! (`data.arrow#indices:4096+4096`). Columns become what `columnar.rs` says: numbers,
//! bools and fixed-size lists as tensors, lists of numbers one tensor per row, binary and
//! strings as variable-length columns.

use crate::codes::Codes;
use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use arrow_array::{ArrayRef, RecordBatch, RecordBatchReader};
use arrow_buffer::Buffer;
use arrow_ipc::reader::{read_dictionary, read_footer_length, read_record_batch};
use arrow_ipc::{MessageHeader, MetadataVersion, root_as_footer, root_as_message};
use arrow_schema::{Schema, SchemaRef};
use chute_core::{
    BufferPool, Column, ConfigError, Corruption, Error, Manifest, Sample, ShardInfo, Source,
};

use chute_io::AtomicFile;

use crate::columnar::{self, Table};

/// How to read Arrow IPC data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArrowOptions {
    /// Columns to read, in this order (projection); `None` reads every column.
    pub columns: Option<Vec<String>>,
    /// Rows per shard (default 16,384): record batches (or the indices mapping) are split
    /// into chunks of this many rows.
    pub chunk_rows: Option<usize>,
    /// Columns stacked into one `[B, k]` column (see [`Stack`](crate::Stack)).
    pub stack: crate::Stack,
    /// What a null does: filled, with a `<name>_valid` column (the default), or an error.
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

/// The magic bytes that open and close an Arrow IPC file (the stream format has none).
const MAGIC: &[u8; 6] = b"ARROW1";

/// An opened IPC file: its bytes and what its record batches need to be decoded.
struct IpcFile {
    origin: String,
    data: Buffer,
    schema: SchemaRef,
    /// The dictionaries by id as each record batch saw them: a stream may replace a
    /// dictionary between batches, so each batch names its state here ([`Part::dictionaries`]).
    dictionaries: Vec<HashMap<i64, ArrayRef>>,
    /// The schema's place of each projected column.
    projection: Vec<usize>,
}

/// A record batch: its rows, where it is, and its columns once decoded.
struct Part {
    rows: u64,
    /// The file it is in (an index into `files`), or `None` for data handed over in memory.
    file: Option<usize>,
    /// Byte offset of its message in the file, for errors.
    offset: u64,
    /// The message's flatbuffer and its body, in the file.
    meta: Range<usize>,
    body: Range<usize>,
    /// JSON Lines decoded into this record batch on first use.
    json: Option<crate::json::Piece>,
    /// The dictionaries it refers to: an index into its file's [`IpcFile::dictionaries`].
    dictionaries: usize,
    columns: OnceLock<Result<Vec<ArrayRef>, String>>,
}

/// Arrow IPC files or streams, or Arrow record batches, as a [`Source`].
pub struct ArrowSource {
    files: Vec<IpcFile>,
    parts: Vec<Part>,
    /// Global row of each part's first row, then the total.
    starts: Vec<u64>,
    /// Sample `i` is row `indices[i]` (a Hugging Face indices mapping), when set.
    indices: Option<Vec<u64>>,
    origin: String,
    table: Table,
    manifest: Manifest,
    /// Samples in the dataset.
    len: u64,
}

impl std::fmt::Debug for ArrowSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArrowSource")
            .field("files", &self.files.len())
            .field("record_batches", &self.parts.len())
            .field("indices", &self.indices.as_ref().map(Vec::len))
            .field("columns", &self.table.names)
            .finish()
    }
}

impl ArrowSource {
    /// Opens `paths` (local files memory-mapped, URLs downloaded whole), each an IPC file or
    /// stream: only the messages' metadata is read here. Every file must have the projected
    /// columns with the same types.
    pub fn open<P: AsRef<Path>>(paths: &[P], options: ArrowOptions) -> Result<Self, Error> {
        Self::from_bytes(columnar::read_files(paths, "Arrow IPC")?, options)
    }

    /// Opens IPC files or streams already in memory, each `(name, bytes)` (a memory map's
    /// view, a download): what [`ArrowSource::open`] does once it has the bytes.
    pub fn from_bytes(
        contents: Vec<(String, bytes::Bytes)>,
        options: ArrowOptions,
    ) -> Result<Self, Error> {
        columnar::given(&contents, "Arrow IPC")?;
        let mut files = Vec::new();
        let mut parts = Vec::new();
        let mut first: Option<(String, columnar::Projected)> = None;
        // Per projected column: whether some file holds a null in it.
        let mut nulls: Vec<bool> = Vec::new();
        for (fi, (origin, bytes)) in contents.into_iter().enumerate() {
            let data = Buffer::from(bytes);
            // The flatbuffer verifier bounds what it reads, but a decoder that panics on a
            // corrupt message is a bad file, not a crash.
            let scanned = chute_core::quiet::catch_quietly(|| scan(&origin, &data, fi))
                .unwrap_or_else(|why| {
                    Err(Error::corrupt(
                        &origin,
                        0,
                        format!("the IPC metadata is corrupt (the reader failed: {why})"),
                    ))
                })?;
            let (schema, dictionaries, these_parts) = scanned;
            let these = columnar::Projected::of(
                &schema,
                options.columns.as_deref(),
                options.structs,
                options.decimals,
                options.dictionaries,
                &origin,
            )?;
            let projection = these.roots();
            let holes = nulls_in(&schema, &these, &dictionaries, &these_parts, &data);
            columnar::add_nulls(&mut nulls, holes);
            match &first {
                None => first = Some((origin.clone(), these)),
                Some((name, cols)) => cols.check_same(&these, name, &origin)?,
            }
            parts.extend(these_parts);
            files.push(IpcFile {
                origin,
                data,
                schema: Arc::new(schema),
                dictionaries,
                projection,
            });
        }
        let (origin, projected) = first.expect("at least one file");
        let mut source = Self::assemble(files, parts, None, origin, projected, nulls, &options)?;
        source.read_codes()?;
        Ok(source)
    }

    /// The source's dictionary of each column read as codes (see [`crate::codes`]), from
    /// every record batch's, in file order: each batch's dictionary columns decoded once.
    fn read_codes(&mut self) -> Result<(), Error> {
        for c in self.table.coded() {
            let mut dict = Codes::default();
            for p in (0..self.parts.len()).filter(|&p| self.parts[p].file.is_some()) {
                let top = chute_core::quiet::catch_quietly(|| self.top_columns(p))
                    .unwrap_or_else(|why| Err(format!("the decoder failed on corrupt data: {why}")))
                    .and_then(|top| self.table.pick(&top, c));
                top.and_then(|col| dict.add(col.as_ref())).map_err(|why| {
                    let name = &self.table.names[c];
                    Error::corrupt(
                        self.part_origin(p),
                        self.parts[p].offset,
                        format!("record batch {p}: column {name:?}: {why}"),
                    )
                })?;
            }
            self.table.codes[c] = Some(Arc::new(dict));
        }
        Ok(())
    }

    /// A source over record batches already in memory (say, a table handed over through the
    /// Arrow C stream interface), all of `schema`; sample `i` is row `indices[i]` of their
    /// concatenation when `indices` is given, else row `i`. `origin` names the data in
    /// manifests and errors.
    pub fn from_batches(
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
        indices: Option<Vec<u64>>,
        origin: &str,
        options: ArrowOptions,
    ) -> Result<Self, Error> {
        let projected = columnar::Projected::of(
            &schema,
            options.columns.as_deref(),
            options.structs,
            options.decimals,
            options.dictionaries,
            origin,
        )?;
        let roots = projected.roots();
        // Each batch's columns, picked out of their top-level columns.
        let picked = batches
            .iter()
            .enumerate()
            .map(|(b, batch)| {
                let top: Vec<ArrayRef> = roots.iter().map(|&i| batch.column(i).clone()).collect();
                (0..projected.names.len())
                    .map(|c| {
                        projected.pick(&top, c).map_err(|why| {
                            let name = &projected.names[c];
                            format!("record batch {b}: column {name:?}: {why}")
                        })
                    })
                    .collect::<Result<Vec<_>, String>>()
            })
            .collect::<Result<Vec<_>, String>>()
            .map_err(|reason| Error::corrupt(origin, 0, reason))?;
        let nulls: Vec<bool> = (0..projected.names.len())
            .map(|c| {
                picked
                    .iter()
                    .any(|cols| crate::arrow_types::has_nulls(cols[c].as_ref()))
            })
            .collect();
        let masked = columnar::masked(&nulls, options.nulls);
        // The source's dictionary of each column read as codes, from every batch's.
        let mut codes: Vec<Option<Arc<Codes>>> = vec![None; projected.names.len()];
        for c in projected.coded() {
            let mut dict = Codes::default();
            for (b, cols) in picked.iter().enumerate() {
                dict.add(cols[c].as_ref()).map_err(|why| {
                    let name = &projected.names[c];
                    Error::corrupt(
                        origin,
                        0,
                        format!("record batch {b}: column {name:?}: {why}"),
                    )
                })?;
            }
            codes[c] = Some(Arc::new(dict));
        }
        let mut parts = Vec::with_capacity(batches.len());
        for (b, (batch, cols)) in batches.into_iter().zip(picked).enumerate() {
            let rows = batch.num_rows();
            let columns = cols
                .into_iter()
                .zip(&projected.names)
                .zip(&masked)
                .zip(&projected.kinds)
                .zip(&codes)
                .map(|((((col, name), &m), &kind), dict)| {
                    let fill = m.then_some(options.fill_null);
                    columnar::checked(col, rows, false, kind, fill, dict.as_deref(), || {
                        format!("record batch {b}: column {name:?}")
                    })
                })
                .collect::<Result<Vec<_>, String>>()
                .map_err(|reason| Error::corrupt(origin, 0, reason))?;
            parts.push(Part {
                rows: rows as u64,
                file: None,
                offset: 0,
                meta: 0..0,
                body: 0..0,
                json: None,
                dictionaries: 0,
                columns: OnceLock::from(Ok(columns)),
            });
        }
        let mut source = Self::assemble(
            Vec::new(),
            parts,
            indices,
            origin.to_string(),
            projected,
            nulls,
            &options,
        )?;
        source.table.codes = codes;
        Ok(source)
    }

    /// Reads an Arrow C stream (`struct ArrowArrayStream`, as `__arrow_c_stream__` exports
    /// it: pyarrow, Polars, DuckDB) to its end, then makes a source of its batches as
    /// [`ArrowSource::from_batches`] does. The arrays stay where the producer put them (a
    /// memory-mapped file's pages for a Hugging Face dataset): nothing is copied.
    ///
    /// # Safety
    ///
    /// `stream` must point to a valid, unreleased `ArrowArrayStream`; it is moved out (the
    /// pointee is left released, as the interface requires of a consumer).
    pub unsafe fn from_c_stream(
        stream: *mut std::ffi::c_void,
        indices: Option<Vec<u64>>,
        origin: &str,
        options: ArrowOptions,
    ) -> Result<Self, Error> {
        use arrow_array::ffi_stream::{FFI_ArrowArrayStream, RecordBatchStreamReader};
        let bad = |e: arrow_schema::ArrowError| {
            Error::corrupt(origin, 0, format!("the Arrow C stream failed: {e}"))
        };
        // SAFETY: the caller guarantees a valid stream; `from_raw` takes it over.
        let reader =
            unsafe { RecordBatchStreamReader::from_raw(stream.cast::<FFI_ArrowArrayStream>()) }
                .map_err(bad)?;
        let schema = reader.schema();
        let batches = reader.collect::<Result<Vec<_>, _>>().map_err(bad)?;
        Self::from_batches(schema, batches, indices, origin, options)
    }

    /// A source over JSON Lines `pieces` of `schema`, each decoded on first use; a column
    /// holds nulls where `holds_nulls(name)` says so (its name a field path, `meta.a`).
    pub(crate) fn from_json(
        schema: SchemaRef,
        pieces: Vec<crate::json::Piece>,
        holds_nulls: impl Fn(&str) -> bool,
        origin: &str,
        options: ArrowOptions,
    ) -> Result<Self, Error> {
        let projected = columnar::Projected::of(
            &schema,
            options.columns.as_deref(),
            options.structs,
            options.decimals,
            options.dictionaries,
            origin,
        )?;
        let nulls = projected
            .names
            .iter()
            .zip(&projected.types)
            .map(|(name, dt)| holds_nulls(name) || *dt == arrow_schema::DataType::Null)
            .collect();
        let parts = pieces
            .into_iter()
            .map(|piece| Part {
                rows: piece.rows,
                file: None,
                offset: piece.offset,
                meta: 0..0,
                body: 0..0,
                json: Some(piece),
                dictionaries: 0,
                columns: OnceLock::new(),
            })
            .collect();
        Self::assemble(
            Vec::new(),
            parts,
            None,
            origin.to_string(),
            projected,
            nulls,
            &options,
        )
    }

    fn assemble(
        files: Vec<IpcFile>,
        parts: Vec<Part>,
        indices: Option<Vec<u64>>,
        origin: String,
        projected: columnar::Projected,
        nulls: Vec<bool>,
        options: &ArrowOptions,
    ) -> Result<Self, Error> {
        let chunk_rows = options.chunk_rows.unwrap_or(DEFAULT_CHUNK_ROWS).max(1) as u64;
        let starts: Vec<u64> = std::iter::once(0)
            .chain(parts.iter().scan(0, |acc, p| {
                *acc += p.rows;
                Some(*acc)
            }))
            .collect();
        let total = starts.last().copied().unwrap_or(0);
        // Bytes of a part's body (in memory: its columns' buffers), for shard sizes.
        let part_bytes = |p: &Part| -> u64 {
            match p.columns.get() {
                Some(Ok(cols)) if p.file.is_none() => cols
                    .iter()
                    .map(|c| c.to_data().get_slice_memory_size().unwrap_or(0) as u64)
                    .sum(),
                _ => match &p.json {
                    Some(piece) => piece.data.len() as u64,
                    None => p.body.len() as u64,
                },
            }
        };
        let mut shards = Vec::new();
        match &indices {
            None => {
                for (b, p) in parts.iter().enumerate() {
                    let name = match (p.file, &p.json) {
                        (Some(f), _) => files[f].origin.as_str(),
                        (None, Some(piece)) => &piece.origin,
                        (None, None) => origin.as_str(),
                    };
                    let bytes = part_bytes(p);
                    let mut first = 0;
                    loop {
                        let n = chunk_rows.min(p.rows - first);
                        shards.push(ShardInfo {
                            path: format!("{name}#batch{b}:{first}+{n}"),
                            samples: n,
                            bytes: (bytes * n).checked_div(p.rows).unwrap_or(0),
                        });
                        first += n;
                        if first >= p.rows {
                            break;
                        }
                    }
                }
            }
            Some(ix) => {
                if let Some((i, &row)) = ix.iter().enumerate().find(|&(_, &r)| r >= total) {
                    return Err(ConfigError::new(
                        "indices",
                        format!(
                            "{origin}: the indices mapping's entry {i} is row {row}, but the \
                             data has {total} rows"
                        ),
                    )
                    .into());
                }
                let all: u64 = parts.iter().map(part_bytes).sum();
                let per_row = all.checked_div(total).unwrap_or(0);
                let len = ix.len() as u64;
                let mut first = 0;
                while first < len {
                    let n = chunk_rows.min(len - first);
                    shards.push(ShardInfo {
                        path: format!("{origin}#indices:{first}+{n}"),
                        samples: n,
                        bytes: per_row * n,
                    });
                    first += n;
                }
            }
        }
        let (stack, fill) = (&options.stack, options.fill_null);
        let masked = columnar::masked(&nulls, options.nulls);
        let table = Table::new(projected, stack, &origin, masked, options.nulls, fill)?;
        let manifest = table.manifest(crate::Format::Arrow, shards, &options.stack);
        let len = manifest.total_samples();
        Ok(ArrowSource {
            files,
            parts,
            starts,
            indices,
            origin,
            table,
            manifest,
            len,
        })
    }

    /// The projected column names, in batch order.
    pub fn columns(&self) -> &[String] {
        &self.table.names
    }

    /// The columns of part `p`, decoded on first use.
    fn part(&self, p: usize) -> Result<&[ArrayRef], Error> {
        let part = &self.parts[p];
        part.columns
            .get_or_init(|| {
                chute_core::quiet::catch_quietly(|| self.decode(p))
                    .unwrap_or_else(|why| Err(format!("the decoder failed on corrupt data: {why}")))
            })
            .as_deref()
            .map_err(|reason| {
                Error::corrupt(
                    self.part_origin(p),
                    part.offset,
                    format!("record batch {p}: {reason}"),
                )
            })
    }

    fn part_origin(&self, p: usize) -> &str {
        let part = &self.parts[p];
        match (part.file, &part.json) {
            (Some(f), _) => &self.files[f].origin,
            (None, Some(piece)) => &piece.origin,
            (None, None) => &self.origin,
        }
    }

    fn decode(&self, p: usize) -> Result<Vec<ArrayRef>, String> {
        let part = &self.parts[p];
        if let Some(piece) = &part.json {
            let batch = piece.decode().map_err(|e| match e {
                Error::Corrupt { reason, .. } => reason,
                other => other.to_string(),
            })?;
            let top: Vec<ArrayRef> = self
                .table
                .roots()
                .into_iter()
                .map(|i| batch.column(i).clone())
                .collect();
            return self.columns_of(&top, part.rows as usize);
        }
        let top = self.top_columns(p)?;
        self.columns_of(&top, part.rows as usize)
    }

    /// The top-level columns (those of [`Table::roots`], in order) of file part `p`, decoded
    /// as they are in the file (before [`columnar::checked`]).
    fn top_columns(&self, p: usize) -> Result<Vec<ArrayRef>, String> {
        let part = &self.parts[p];
        let f = &self.files[part.file.expect("parts in memory are decoded")];
        let message = root_as_message(&f.data[part.meta.clone()])
            .map_err(|e| format!("its metadata is corrupt: {e}"))?;
        let batch = message
            .header_as_record_batch()
            .ok_or("its message is not a record batch")?;
        let body = f.data.slice_with_length(part.body.start, part.body.len());
        let decoded = read_record_batch(
            &body,
            batch,
            f.schema.clone(),
            &f.dictionaries[part.dictionaries],
            Some(&f.projection),
            &message.version(),
        )
        .map_err(|e| e.to_string())?;
        Ok(decoded.columns().to_vec())
    }

    /// The projected columns of a record batch of `rows` rows whose top-level columns are
    /// `top` (those of [`Table::roots`], in order), checked, filled where masked.
    fn columns_of(&self, top: &[ArrayRef], rows: usize) -> Result<Vec<ArrayRef>, String> {
        (0..self.table.names.len())
            .map(|c| {
                let name = &self.table.names[c];
                let col = self
                    .table
                    .pick(top, c)
                    .map_err(|why| format!("column {name:?}: {why}"))?;
                let (fill, kind) = (self.table.fill_of(c), self.table.kinds[c]);
                let codes = self.table.codes[c].as_deref();
                columnar::checked(col, rows, false, kind, fill, codes, || {
                    format!("column {name:?}")
                })
            })
            .collect()
    }

    fn null_error(&self, p: usize, row: usize, c: usize, why: Option<String>) -> Error {
        let at = columnar::At {
            origin: self.part_origin(p).to_string(),
            offset: self.parts[p].offset,
            part: format!("record batch {p}"),
        };
        self.table.null_error(at, row, c, why)
    }

    /// The row behind sample `id`, checked against the dataset's length.
    fn row(&self, id: u64) -> Result<u64, Error> {
        if id >= self.len {
            self.manifest.locate_checked(id)?;
        }
        Ok(match &self.indices {
            Some(ix) => ix[id as usize],
            None => id,
        })
    }

    /// The part and the row in it of global row `row`.
    fn locate(&self, row: u64) -> (usize, usize) {
        let p = self.starts.partition_point(|&s| s <= row) - 1;
        (p, (row - self.starts[p]) as usize)
    }
}

impl Source for ArrowSource {
    fn column_types(&self) -> Vec<chute_core::ColumnType> {
        self.table.column_types()
    }

    fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn read(&self, id: u64) -> Result<Sample, Error> {
        let (p, row) = self.locate(self.row(id)?);
        let columns = self.part(p)?;
        self.table
            .sample_at(id, columns, row, |c, why| self.null_error(p, row, c, why))
    }

    fn collate(
        &self,
        ids: &[u64],
        pool: &BufferPool,
    ) -> Option<Result<Vec<(String, Column)>, Error>> {
        Some(self.gather(ids, pool))
    }
}

impl ArrowSource {
    /// The columnar fast path: rows gathered from the record batches into batch buffers.
    fn gather(&self, ids: &[u64], pool: &BufferPool) -> Result<Vec<(String, Column)>, Error> {
        let mut rows = Vec::with_capacity(ids.len());
        // The parts this batch reads, in first-use order, and each one's place in that list.
        let mut used: Vec<usize> = Vec::new();
        let mut place: HashMap<usize, usize> = HashMap::new();
        // The part last used: its place and its span of rows.
        let mut last = (usize::MAX, 0u64, 0u64);
        for &id in ids {
            let row = self.row(id)?;
            if !(last.1..last.2).contains(&row) {
                let (p, _) = self.locate(row);
                let at = *place.entry(p).or_insert_with(|| {
                    used.push(p);
                    used.len() - 1
                });
                last = (at, self.starts[p], self.starts[p + 1]);
            }
            rows.push((last.0, (row - last.1) as usize));
        }
        let parts = used
            .iter()
            .map(|&p| self.part(p))
            .collect::<Result<Vec<_>, _>>()?;
        self.table
            .gather(&parts, None, &rows, pool, |at, row, c, why| {
                self.null_error(used[at], row, c, why)
            })
    }
}

/// Writes samples to an Arrow IPC file (the random-access format, uncompressed, so readers
/// map it in place): the columns `columnar.rs`'s builder makes (numbers, fixed-shape
/// 1-D arrays as fixed-size lists, bytes, text), a record batch every `batch_rows` samples.
/// Written under `<path>.tmp` (an [`AtomicFile`]) and renamed by [`IpcWriter::finish`].
pub struct IpcWriter {
    path: std::path::PathBuf,
    batch_rows: usize,
    rows: columnar::RowBuilder,
    writer: Option<arrow_ipc::writer::FileWriter<AtomicFile>>,
    written: u64,
}

impl std::fmt::Debug for IpcWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcWriter")
            .field("path", &self.path)
            .field("rows", &self.written)
            .finish()
    }
}

impl IpcWriter {
    /// A writer to `path`, writing a record batch every `batch_rows` rows.
    pub fn create(path: impl AsRef<Path>, batch_rows: usize) -> Result<Self, Error> {
        let path = path.as_ref().to_path_buf();
        Ok(IpcWriter {
            rows: columnar::RowBuilder::new("arrow", path.display().to_string()),
            path,
            batch_rows: batch_rows.max(1),
            writer: None,
            written: 0,
        })
    }

    fn failed(&self, e: impl std::error::Error + Send + Sync + 'static) -> Error {
        Error::io(self.path.display().to_string(), std::io::Error::other(e))
    }

    /// Adds a row; the first one gives the schema.
    pub fn write(&mut self, sample: &Sample) -> Result<(), Error> {
        self.rows.push(sample)?;
        if self.writer.is_none() {
            let schema = self.rows.schema().expect("set by the first row").clone();
            let file = AtomicFile::create(&self.path)?;
            let w = arrow_ipc::writer::FileWriter::try_new(file, &schema)
                .map_err(|e| self.failed(e))?;
            self.writer = Some(w);
        }
        if self.rows.len() >= self.batch_rows {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), Error> {
        let Some(batch) = self.rows.take_batch()? else {
            return Ok(());
        };
        let result = self
            .writer
            .as_mut()
            .expect("writer set with the first row")
            .write(&batch);
        result.map_err(|e| self.failed(e))?;
        self.written += batch.num_rows() as u64;
        Ok(())
    }

    /// Writes the last record batch and the footer, then renames the file into place.
    /// Returns the rows written.
    pub fn finish(mut self) -> Result<u64, Error> {
        self.flush()?;
        let Some(mut w) = self.writer.take() else {
            return Err(
                ConfigError::new("arrow", "no rows written: an empty file has no schema").into(),
            );
        };
        w.finish().map_err(|e| self.failed(e))?;
        let file = w.into_inner().map_err(|e| self.failed(e))?;
        file.finish()?;
        Ok(self.written)
    }
}

/// What [`scan`] finds in a file: its schema, its dictionaries (each state record batches
/// saw) and its record batches.
type Scanned = (Schema, Vec<HashMap<i64, ArrayRef>>, Vec<Part>);

/// Reads the metadata of the IPC file or stream `data` (file `file` of the source): the
/// schema, the dictionaries (decoded now: batches refer to them) and where each record batch
/// is. A file's footer lists its messages; a stream's are walked in order.
fn scan(origin: &str, data: &Buffer, file: usize) -> Result<Scanned, Error> {
    let len = data.len();
    let is_file = len >= 8 && &data[..6] == MAGIC;
    let mut offsets = Vec::new();
    if is_file {
        if len < 8 + 10 || &data[len - 6..] != MAGIC {
            return Err(Error::truncated(
                origin,
                len as u64,
                "an Arrow IPC file without its footer (the file is cut short)",
            ));
        }
        let tail: [u8; 10] = data[len - 10..].try_into().expect("10 bytes");
        let footer_len = read_footer_length(tail).map_err(|e| malformed(origin, len - 10, e))?;
        let footer_start = (len - 10)
            .checked_sub(footer_len)
            .filter(|&s| s >= 8)
            .ok_or_else(|| {
                malformed(origin, len - 10, format!("a footer of {footer_len} bytes"))
            })?;
        let footer = root_as_footer(&data[footer_start..len - 10])
            .map_err(|e| malformed(origin, footer_start, e))?;
        for block in footer.dictionaries().iter().flatten() {
            offsets.push(block.offset());
        }
        for block in footer.recordBatches().iter().flatten() {
            offsets.push(block.offset());
        }
        let offsets = offsets
            .into_iter()
            .map(|o| {
                usize::try_from(o)
                    .map_err(|_| malformed(origin, footer_start, "a negative block offset"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let schema = footer
            .schema()
            .ok_or_else(|| malformed(origin, footer_start, "the footer has no schema"))?;
        native_endian(origin, footer_start, schema)?;
        let schema = arrow_ipc::convert::try_fb_to_schema(schema)
            .map_err(|e| malformed(origin, footer_start, e))?;
        walk(
            origin,
            data,
            file,
            Some(schema),
            offsets.into_iter().map(Some),
        )
    } else {
        if len >= 4 {
            let first = u32::from_le_bytes(data[..4].try_into().expect("4 bytes"));
            if first != 0xFFFF_FFFF && first as usize > len {
                return Err(malformed(
                    origin,
                    0,
                    "it starts with neither the file format's ARROW1 nor a stream's message",
                ));
            }
        }
        walk(origin, data, file, None, std::iter::repeat(None))
    }
}

/// Decodes the messages at `offsets` (`Some`: a file's blocks) or one after another from the
/// start (`None`: a stream, until its end-of-stream marker or its last byte).
/// Field nodes an IPC record batch gives a column of type `dt` (itself, then its children,
/// depth first; a dictionary-encoded column's are its indices').
fn nodes_of(dt: &arrow_schema::DataType) -> usize {
    use arrow_schema::DataType as D;
    match dt {
        D::Struct(fields) => {
            1 + fields
                .iter()
                .map(|f| nodes_of(f.data_type()))
                .sum::<usize>()
        }
        D::Union(fields, _) => {
            1 + fields
                .iter()
                .map(|(_, f)| nodes_of(f.data_type()))
                .sum::<usize>()
        }
        D::List(f)
        | D::LargeList(f)
        | D::ListView(f)
        | D::LargeListView(f)
        | D::FixedSizeList(f, _)
        | D::Map(f, _) => 1 + nodes_of(f.data_type()),
        D::RunEndEncoded(r, v) => 1 + nodes_of(r.data_type()) + nodes_of(v.data_type()),
        _ => 1,
    }
}

/// Per column of `projected` (of `schema`): whether a record batch of `parts` (of the file
/// `data`) says it holds a null (or a struct it lies in does), or its dictionary does. Read
/// from the messages' field nodes: nothing is decoded.
fn nulls_in(
    schema: &Schema,
    projected: &columnar::Projected,
    dictionaries: &[HashMap<i64, ArrayRef>],
    parts: &[Part],
    data: &Buffer,
) -> Vec<bool> {
    let mut first_node = Vec::with_capacity(schema.fields().len());
    let mut at = 0;
    for f in schema.fields() {
        first_node.push(at);
        at += nodes_of(f.data_type());
    }
    let dictionary_nulls = dictionaries
        .iter()
        .flat_map(HashMap::values)
        .any(|d| d.null_count() > 0);
    projected
        .places
        .iter()
        .zip(&projected.paths)
        .zip(&projected.types)
        .map(|((&i, path), dt)| {
            if matches!(dt, arrow_schema::DataType::Null) {
                return true;
            }
            if matches!(dt, arrow_schema::DataType::Dictionary(..)) && dictionary_nulls {
                return true;
            }
            // The nodes of the top-level column and of each struct field down the path.
            let mut along = vec![first_node[i]];
            let mut dt = schema.field(i).data_type();
            for name in path {
                let arrow_schema::DataType::Struct(fields) = dt else {
                    break;
                };
                let mut node = along[along.len() - 1] + 1;
                for f in fields {
                    if f.name() == name {
                        dt = f.data_type();
                        break;
                    }
                    node += nodes_of(f.data_type());
                }
                along.push(node);
            }
            // A run-end-encoded column has no validity of its own: its nulls are its values'.
            if let arrow_schema::DataType::RunEndEncoded(ends, _) = dt {
                along.push(along[along.len() - 1] + 1 + nodes_of(ends.data_type()));
            }
            parts.iter().any(|p| {
                let nodes = root_as_message(&data[p.meta.clone()])
                    .ok()
                    .and_then(|m| m.header_as_record_batch())
                    .and_then(|b| b.nodes());
                // A message whose nodes cannot be read fails when it is decoded; until then
                // it may hold anything.
                nodes.is_none_or(|nodes| {
                    along
                        .iter()
                        .any(|&k| nodes.iter().nth(k).is_none_or(|n| n.null_count() > 0))
                })
            })
        })
        .collect()
}

/// Refuses a schema whose buffers are big-endian (a file written on a big-endian machine):
/// Arrow's Rust reader takes their bytes as they are, which would give wrong numbers.
fn native_endian(origin: &str, at: usize, schema: arrow_ipc::Schema<'_>) -> Result<(), Error> {
    let big = schema.endianness() == arrow_ipc::Endianness::Big;
    if big == cfg!(target_endian = "big") {
        return Ok(());
    }
    Err(Error::corrupt_as(
        Corruption::Unsupported,
        origin,
        at as u64,
        "its buffers are big-endian (written on a big-endian machine), and chute reads Arrow \
         IPC in this machine's byte order; rewrite it here with pyarrow, which swaps the bytes \
         as it reads (pyarrow.feather.write_feather(pyarrow.ipc.open_file(path).read_all(), \
         new_path))"
            .to_string(),
    ))
}

/// Whether a column of type `dt` has buffers that grow with its rows (offsets, values,
/// type ids, keys): all but the null type, run-end encoding (its runs may be few), and
/// structs and fixed-size lists of only those.
fn per_row(dt: &arrow_schema::DataType) -> bool {
    use arrow_schema::DataType as T;
    match dt {
        T::Null | T::RunEndEncoded(..) => false,
        T::Struct(fields) => fields.iter().any(|f| per_row(f.data_type())),
        T::FixedSizeList(f, k) => *k > 0 && per_row(f.data_type()),
        _ => true,
    }
}

fn walk(
    origin: &str,
    data: &Buffer,
    file: usize,
    mut schema: Option<Schema>,
    offsets: impl Iterator<Item = Option<usize>>,
) -> Result<Scanned, Error> {
    let mut dictionaries = HashMap::new();
    // The states record batches saw (a stream may replace a dictionary between batches),
    // and whether the current one differs from the last kept.
    let mut states: Vec<HashMap<i64, ArrayRef>> = Vec::new();
    let mut changed = true;
    let mut parts = Vec::new();
    let mut pos = 0usize;
    let mut claimed = 0u64;
    for at in offsets {
        let start = at.unwrap_or(pos);
        if at.is_none() && start >= data.len() {
            break;
        }
        let Some(m) = frame(origin, data, start)? else {
            if at.is_none() {
                break; // end of stream
            }
            return Err(malformed(
                origin,
                start,
                "a footer block points at an end-of-stream marker",
            ));
        };
        pos = m.body.end;
        let message =
            root_as_message(&data[m.meta.clone()]).map_err(|e| malformed(origin, start, e))?;
        let version = message.version();
        if version < MetadataVersion::V4 {
            return Err(Error::corrupt_as(
                Corruption::Unsupported,
                origin,
                start as u64,
                format!(
                    "IPC metadata version {version:?}; chute reads V4 and V5 (Arrow 0.15 and later)"
                ),
            ));
        }
        match message.header_type() {
            MessageHeader::Schema => {
                let fb = message.header_as_schema().expect("a schema header");
                native_endian(origin, start, fb)?;
                let s = arrow_ipc::convert::try_fb_to_schema(fb)
                    .map_err(|e| malformed(origin, start, e))?;
                if schema.is_none() {
                    schema = Some(s);
                }
            }
            MessageHeader::DictionaryBatch => {
                let Some(s) = &schema else {
                    return Err(malformed(origin, start, "a dictionary before the schema"));
                };
                let batch = message
                    .header_as_dictionary_batch()
                    .expect("a dictionary header");
                if let Some(b) = batch.data() {
                    let claim = claims(origin, start, b, &data[m.body.clone()])?.0;
                    bound(origin, start, "dictionary batch", claim)?;
                    claimed += claim;
                    weigh(origin, claimed)?;
                }
                let body = data.slice_with_length(m.body.start, m.body.len());
                read_dictionary(&body, batch, s, &mut dictionaries, &version)
                    .map_err(|e| malformed(origin, start, e))?;
                changed = true;
            }
            MessageHeader::RecordBatch => {
                if schema.is_none() {
                    return Err(malformed(origin, start, "a record batch before the schema"));
                }
                let batch = message
                    .header_as_record_batch()
                    .expect("a record batch header");
                let (claim, payload) = claims(origin, start, batch, &data[m.body.clone()])?;
                bound(origin, start, "record batch", claim)?;
                claimed += claim;
                weigh(origin, claimed)?;
                let rows = u64::try_from(batch.length())
                    .map_err(|_| malformed(origin, start, "a negative row count"))?;
                // A column with buffers takes at least a bit per row: a count the buffers
                // cannot hold is corrupt (and must not size anything). Columns without any
                // (the null type, run-end encoding) take a byte a row once read (their
                // `_valid` masks): bounded by what a unit may decode to.
                let s = schema.as_ref().expect("checked above");
                let most = if s.fields().iter().any(|f| per_row(f.data_type())) {
                    payload.saturating_mul(8) + 8
                } else {
                    chute_core::Limits::current().max_decoded_bytes
                };
                if rows > most {
                    return Err(malformed(
                        origin,
                        start,
                        format!("a record batch of {rows} rows in {payload} bytes of buffers"),
                    ));
                }
                if changed {
                    states.push(dictionaries.clone());
                    changed = false;
                }
                parts.push(Part {
                    rows,
                    file: Some(file),
                    offset: start as u64,
                    meta: m.meta,
                    body: m.body,
                    json: None,
                    dictionaries: states.len() - 1,
                    columns: OnceLock::new(),
                });
            }
            other => {
                return Err(Error::corrupt_as(
                    Corruption::Unsupported,
                    origin,
                    start as u64,
                    format!("an IPC message of type {other:?}; chute reads record batches"),
                ));
            }
        }
    }
    let schema = schema
        .ok_or_else(|| malformed(origin, 0, "no schema message (an empty or non-Arrow file?)"))?;
    if states.is_empty() {
        states.push(dictionaries);
    }
    Ok((schema, states, parts))
}

/// A message's flatbuffer and its body, in the file.
struct Frame {
    meta: Range<usize>,
    body: Range<usize>,
}

/// The message framed at `pos`: `0xFFFFFFFF`, a 4-byte length, the flatbuffer, the body (or,
/// before Arrow 0.15, the length alone first). `None` at an end-of-stream marker.
fn frame(origin: &str, data: &[u8], pos: usize) -> Result<Option<Frame>, Error> {
    let word = |at: usize| -> Result<u32, Error> {
        data.get(at..at + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .ok_or_else(|| {
                Error::truncated(origin, at as u64, "the file ends inside a message header")
            })
    };
    let (len, meta_start) = match word(pos)? {
        0xFFFF_FFFF => (word(pos + 4)?, pos + 8),
        n => (n, pos + 4),
    };
    if len == 0 {
        return Ok(None);
    }
    let len = i32::try_from(len)
        .map_err(|_| malformed(origin, pos, "a negative metadata length"))? as usize;
    let meta = meta_start..meta_start + len;
    if meta.end > data.len() {
        return Err(Error::truncated(
            origin,
            pos as u64,
            format!("a message of {len} metadata bytes, but the file ends first"),
        ));
    }
    let message = root_as_message(&data[meta.clone()]).map_err(|e| malformed(origin, pos, e))?;
    let body_len = usize::try_from(message.bodyLength())
        .map_err(|_| malformed(origin, pos, "a negative body length"))?;
    let body = meta.end..meta.end.saturating_add(body_len);
    if body.end > data.len() {
        return Err(Error::truncated(
            origin,
            pos as u64,
            format!("a message body of {body_len} bytes, but the file ends first"),
        ));
    }
    Ok(Some(Frame { meta, body }))
}

/// What a record batch's buffers hold: `(claimed, payload)`, the bytes its compressed
/// buffers claim once decompressed (each starts with its uncompressed length; -1 means
/// stored as is) and the bytes of all its buffers once decompressed. Every buffer must lie
/// in the body, and no claim may exceed what its codec can expand its bytes to (LZ4 at most
/// 255 to 1, zstd at most one 128 KiB block per 4 bytes), so nothing is allocated on a
/// corrupt length.
fn claims(
    origin: &str,
    at: usize,
    batch: arrow_ipc::RecordBatch<'_>,
    body: &[u8],
) -> Result<(u64, u64), Error> {
    let ratio: u64 = match batch.compression().map(|c| c.codec()) {
        None => 0,
        Some(arrow_ipc::CompressionType::LZ4_FRAME) => 256,
        Some(_) => 32 * 1024,
    };
    let (mut claimed, mut payload) = (0u64, 0u64);
    for b in batch.buffers().iter().flatten() {
        let (off, len) = (b.offset(), b.length());
        let inside = off >= 0
            && len >= 0
            && off
                .checked_add(len)
                .is_some_and(|e| e as u64 <= body.len() as u64);
        if !inside {
            return Err(malformed(
                origin,
                at,
                format!(
                    "a buffer at {off}+{len} outside its body of {} bytes",
                    body.len()
                ),
            ));
        }
        if ratio == 0 || len < 8 {
            payload += len as u64;
            continue;
        }
        let o = off as usize;
        let claim = i64::from_le_bytes(body[o..o + 8].try_into().expect("8 bytes"));
        if claim < 0 {
            payload += len as u64 - 8;
            continue;
        }
        let claim = claim as u64;
        let most = (len as u64 - 8) * ratio + 1024;
        if claim > most {
            return Err(malformed(
                origin,
                at,
                format!(
                    "a compressed buffer of {len} bytes claims {claim} bytes uncompressed, \
                     more than its codec can expand it to"
                ),
            ));
        }
        claimed += claim;
        payload += claim;
    }
    Ok((claimed, payload))
}

fn malformed(origin: &str, at: usize, why: impl std::fmt::Display) -> Error {
    Error::corrupt(
        origin,
        at as u64,
        format!("not a readable Arrow IPC file or stream: {why}"),
    )
}

/// Refuses a batch whose compressed buffers claim more than the process's
/// [`Limits::max_decoded_bytes`](chute_core::Limits) once decompressed.
fn bound(origin: &str, at: usize, what: &str, claim: u64) -> Result<(), Error> {
    let limit = chute_core::Limits::current().max_decoded_bytes;
    if claim <= limit {
        return Ok(());
    }
    Err(Error::corrupt_as(
        Corruption::TooLarge,
        origin,
        at as u64,
        chute_core::limits::exceeded(
            &format!("the {what}'s compressed buffers"),
            claim,
            "bytes once decompressed",
            "max_decoded_bytes",
            limit,
        ),
    ))
}

/// Refuses a file whose compressed buffers claim more memory than this machine has.
fn weigh(origin: &str, claimed: u64) -> Result<(), Error> {
    let memory = physical_memory();
    if claimed > memory {
        return Err(Error::corrupt_as(
            Corruption::TooLarge,
            origin,
            0,
            format!(
                "its compressed buffers claim {claimed} bytes once decompressed, more than this \
                 machine's {memory} bytes of memory; write it uncompressed (it is then read in \
                 place) or split it"
            ),
        ));
    }
    Ok(())
}

/// This machine's physical memory in bytes (unbounded where it cannot be told).
pub(crate) fn physical_memory() -> u64 {
    static MEMORY: OnceLock<u64> = OnceLock::new();
    *MEMORY.get_or_init(|| {
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|s| {
                let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
                let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
                Some(kb * 1024)
            })
            .unwrap_or(u64::MAX)
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use arrow_array::builder::{BinaryBuilder, ListBuilder, StringBuilder, UInt8Builder};
    use arrow_array::{BooleanArray, Int32Array, Int64Array, StructArray};
    use arrow_ipc::writer::{FileWriter, IpcWriteOptions, StreamWriter};
    use arrow_schema::Field as ArrowField;
    use bytes::Bytes;
    use chute_core::{Array, DType, Field};

    use super::*;
    use crate::check::{ReaderUnderTest, check_reader, same_sample};
    use crate::columnar::RowBuilder;

    fn sample(i: u64) -> Sample {
        let feats: Vec<u8> = (0..3)
            .flat_map(|k| (i as f32 + k as f32).to_le_bytes())
            .collect();
        Sample::new(i)
            .with(
                "label",
                Field::Array(Array::new(
                    DType::I64,
                    vec![],
                    Bytes::copy_from_slice(&(i as i64 * 3 - 1).to_le_bytes()),
                )),
            )
            .with(
                "x",
                Field::Array(Array::new(DType::F32, vec![3], Bytes::from(feats))),
            )
            .with(
                "raw",
                Field::Bytes(Bytes::from(vec![i as u8; (i % 4) as usize])),
            )
            .with("text", Field::Text(Bytes::from(format!("row {i} ü"))))
    }

    fn batches(samples: &[Sample], per_batch: usize) -> (SchemaRef, Vec<RecordBatch>) {
        let mut b = RowBuilder::new("arrow", "test".into());
        let mut out = Vec::new();
        for s in samples {
            b.push(s).unwrap();
            if b.len() == per_batch {
                out.extend(b.take_batch().unwrap());
            }
        }
        out.extend(b.take_batch().unwrap());
        (b.schema().unwrap().clone(), out)
    }

    /// `samples` as IPC bytes: the file format (with a footer) or the stream format.
    fn encode(samples: &[Sample], per_batch: usize, file: bool, compress: bool) -> Vec<u8> {
        let (schema, batches) = batches(samples, per_batch);
        let options = if compress {
            IpcWriteOptions::default()
                .try_with_compression(Some(arrow_ipc::CompressionType::LZ4_FRAME))
                .unwrap()
        } else {
            IpcWriteOptions::default()
        };
        let mut out = Vec::new();
        if file {
            let mut w = FileWriter::try_new_with_options(&mut out, &schema, options).unwrap();
            for b in &batches {
                w.write(b).unwrap();
            }
            w.finish().unwrap();
        } else {
            let mut w = StreamWriter::try_new_with_options(&mut out, &schema, options).unwrap();
            for b in &batches {
                w.write(b).unwrap();
            }
            w.finish().unwrap();
        }
        out
    }

    fn keyless(s: Sample) -> Sample {
        Sample {
            key: String::new(),
            ..s
        }
    }

    struct Under {
        file: bool,
        compress: bool,
    }

    impl Under {
        fn open(&self, shard: &[u8]) -> Result<(tempfile::TempDir, ArrowSource), Error> {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("shard-under-test.arrow");
            std::fs::write(&p, shard).unwrap();
            let src = ArrowSource::open(&[&p], ArrowOptions::default())?;
            Ok((dir, src))
        }
    }

    impl ReaderUnderTest for Under {
        fn name(&self) -> &str {
            "arrow"
        }

        fn write(&self, samples: &[Sample]) -> Result<Vec<u8>, Error> {
            Ok(encode(samples, 2, self.file, self.compress))
        }

        fn read_all(&self, shard: &[u8], origin: &str) -> Result<Vec<Sample>, Error> {
            let named = |e: Error| Error::corrupt(origin, 0, e.to_string());
            let (_dir, src) = self.open(shard).map_err(named)?;
            (0..src.manifest().total_samples())
                .map(|id| src.read(id).map_err(named))
                .collect()
        }

        fn read_at(&self, shard: &[u8], origin: &str, i: usize) -> Result<Sample, Error> {
            let all = self.read_all(shard, origin)?;
            let (_dir, src) = self.open(shard)?;
            let got = src.read(i as u64)?;
            same_sample(&all[i], &got).map_err(|e| Error::corrupt(origin, 0, e))?;
            Ok(got)
        }
    }

    #[test]
    fn files_and_streams_pass_the_reader_suite() {
        let samples: Vec<Sample> = (0..7).map(sample).map(keyless).collect();
        for (file, compress) in [(false, false), (true, false), (true, true), (false, true)] {
            check_reader(&Under { file, compress }, &samples)
                .unwrap_or_else(|e| panic!("file={file} compress={compress}: {e}"));
        }
    }

    fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn record_batches_are_shards_and_gather_matches_per_sample_reads() {
        let dir = tempfile::tempdir().unwrap();
        let samples: Vec<Sample> = (0..10).map(sample).collect();
        let a = write_file(
            dir.path(),
            "a.arrow",
            &encode(&samples[..6], 4, true, false),
        );
        let b = write_file(
            dir.path(),
            "b.arrows",
            &encode(&samples[6..], 4, false, false),
        );
        let src = ArrowSource::open(&[&a, &b], ArrowOptions::default()).unwrap();
        let m = src.manifest();
        assert_eq!(m.format, "arrow");
        let counts: Vec<u64> = m.shards.iter().map(|s| s.samples).collect();
        assert_eq!(counts, [4, 2, 4]);
        assert!(
            m.shards[1].path.ends_with("a.arrow#batch1:0+2"),
            "{}",
            m.shards[1].path
        );
        let chunked = ArrowSource::open(
            &[&a, &b],
            ArrowOptions {
                chunk_rows: Some(3),
                columns: Some(vec!["text".into(), "label".into()]),
                ..Default::default()
            },
        )
        .unwrap();
        let counts: Vec<u64> = chunked
            .manifest()
            .shards
            .iter()
            .map(|s| s.samples)
            .collect();
        assert_eq!(counts, [3, 1, 2, 3, 1]);
        assert_eq!(chunked.columns(), ["text", "label"]);
        for id in 0..10 {
            let s = src.read(id).unwrap();
            same_sample(&keyless(samples[id as usize].clone()), &s).unwrap();
            let c = chunked.read(id).unwrap();
            assert_eq!(c.fields.len(), 2);
        }
        let pool = BufferPool::new(8);
        let ids = [9u64, 0, 5, 3, 7];
        let cols = src.collate(&ids, &pool).unwrap().unwrap();
        let label = cols[0].1.as_tensor().unwrap();
        assert_eq!(
            label.as_slice::<i64>().unwrap(),
            ids.map(|i| i as i64 * 3 - 1)
        );
        let x = cols[1].1.as_tensor().unwrap();
        assert_eq!(x.shape(), [5, 3]);
        assert_eq!(x.as_slice::<f32>().unwrap()[..3], [9.0, 10.0, 11.0]);
        let Column::Var(text) = &cols[3].1 else {
            panic!("text is variable-length")
        };
        assert!(text.text);
        assert_eq!(
            text.offsets.as_slice::<i64>().unwrap()[1],
            "row 9 ü".len() as i64
        );
    }

    /// Lists of token ids, bools, an `Image`-like struct, nulls: Hugging Face's shapes.
    fn hf_like() -> (SchemaRef, RecordBatch) {
        let mut ids = ListBuilder::new(arrow_array::builder::Int32Builder::new());
        for n in [3, 0, 5] {
            for t in 0..n {
                ids.values().append_value(t * 10);
            }
            ids.append(true);
        }
        let ids = Arc::new(ids.finish()) as ArrayRef;
        let flag = Arc::new(BooleanArray::from(vec![true, false, true])) as ArrayRef;
        let mut bytes = BinaryBuilder::new();
        let mut paths = StringBuilder::new();
        for i in 0..3u8 {
            bytes.append_value([0xFF, 0xD8, i]);
            paths.append_value(format!("img{i}.jpg"));
        }
        let image = Arc::new(StructArray::from(vec![
            (
                Arc::new(ArrowField::new("bytes", DataType::Binary, true)),
                Arc::new(bytes.finish()) as ArrayRef,
            ),
            (
                Arc::new(ArrowField::new("path", DataType::Utf8, true)),
                Arc::new(paths.finish()) as ArrayRef,
            ),
        ])) as ArrayRef;
        let label = Arc::new(Int64Array::from(vec![7, 8, 9])) as ArrayRef;
        let batch = RecordBatch::try_from_iter([
            ("input_ids", ids),
            ("flag", flag),
            ("image", image),
            ("label", label),
        ])
        .unwrap();
        (batch.schema(), batch)
    }

    use arrow_schema::DataType;

    #[test]
    fn stacks_columns_from_record_batches() {
        use arrow_array::{Float32Array, Int64Array};
        let schema = Arc::new(arrow_schema::Schema::new(vec![
            arrow_schema::Field::new("a", DataType::Float32, false),
            arrow_schema::Field::new("l", DataType::Int64, false),
            arrow_schema::Field::new("b", DataType::Float32, false),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Float32Array::from(vec![0.0, 1.0, 2.0])),
                Arc::new(Int64Array::from(vec![7, 8, 9])),
                Arc::new(Float32Array::from(vec![-0.0, -1.0, -2.0])),
            ],
        )
        .unwrap();
        let options = ArrowOptions {
            stack: vec![("x".into(), vec!["b".into(), "a".into()])],
            ..Default::default()
        };
        let src = ArrowSource::from_batches(schema, vec![batch], None, "mem://t", options).unwrap();
        let s = src.read(2).unwrap();
        let Some(Field::Array(x)) = s.get("x") else {
            panic!("x is an array")
        };
        assert_eq!(x.shape, [2]);
        assert_eq!(
            &x.data[..],
            [(-2.0f32).to_le_bytes(), 2.0f32.to_le_bytes()].concat()
        );
        let pool = BufferPool::new(8);
        let cols = src.collate(&[2, 0], &pool).unwrap().unwrap();
        assert_eq!(cols[0].0, "x");
        let x = cols[0].1.as_tensor().unwrap();
        assert_eq!(x.shape(), [2, 2]);
        assert_eq!(x.as_slice::<f32>().unwrap(), [-2.0, 2.0, -0.0, 0.0]);
        assert_eq!(
            cols[1].1.as_tensor().unwrap().as_slice::<i64>().unwrap(),
            [9, 7]
        );
    }

    #[test]
    fn lists_bools_structs_and_an_indices_mapping() {
        let (schema, batch) = hf_like();
        let src = ArrowSource::from_batches(
            schema.clone(),
            vec![batch.clone(), batch.clone()],
            Some(vec![5, 0, 2, 4]),
            "mem://hf",
            ArrowOptions::default(),
        )
        .unwrap();
        assert_eq!(src.manifest().total_samples(), 4);
        let s = src.read(0).unwrap(); // row 5: the second batch's row 2
        let Some(Field::Array(ids)) = s.get("input_ids") else {
            panic!("input_ids is an array")
        };
        assert_eq!((ids.dtype, ids.shape.as_slice()), (DType::I32, &[5][..]));
        assert_eq!(&ids.data[4..8], 10i32.to_le_bytes());
        let Some(Field::Array(flag)) = s.get("flag") else {
            panic!("flag is an array")
        };
        assert_eq!((flag.dtype, &flag.data[..]), (DType::Bool, &[1u8][..]));
        let Some(Field::Bytes(image)) = s.get("image") else {
            panic!("an Image struct reads as its bytes")
        };
        assert_eq!(&image[..], [0xFF, 0xD8, 2]);
        let pool = BufferPool::new(8);
        let cols = src.collate(&[0, 1, 3], &pool).unwrap().unwrap();
        let Column::List(lists) = &cols[0].1 else {
            panic!("lists of differing lengths are a list column")
        };
        let lens: Vec<usize> = lists.iter().map(|t| t.shape()[0]).collect();
        assert_eq!(lens, [5, 3, 0]);
        assert_eq!(cols[1].1.as_tensor().unwrap().as_bytes(), [1, 1, 0]);
        assert_eq!(
            cols[3].1.as_tensor().unwrap().as_slice::<i64>().unwrap(),
            [9, 7, 8]
        );
        // An index past the data is refused when the source is made.
        let e = ArrowSource::from_batches(
            schema,
            vec![batch],
            Some(vec![3]),
            "mem://hf",
            ArrowOptions::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("entry 0 is row 3") && e.contains("3 rows"),
            "{e}"
        );
    }

    #[test]
    fn nulls_unknown_types_and_bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let values = Arc::new(Int32Array::from(vec![Some(1), None, Some(3)])) as ArrayRef;
        let batch = RecordBatch::try_from_iter([("v", values)]).unwrap();
        let mut out = Vec::new();
        let mut w = StreamWriter::try_new(&mut out, &batch.schema()).unwrap();
        w.write(&batch).unwrap();
        w.finish().unwrap();
        drop(w);
        let p = write_file(dir.path(), "nulls.arrows", &out);
        // By default the null is 0, and `v_valid` says it is not there (the stream's field
        // nodes said the column holds nulls).
        let src = ArrowSource::open(&[&p], ArrowOptions::default()).unwrap();
        let s = src.read(1).unwrap();
        let got: Vec<(&str, Vec<u8>)> = s
            .fields
            .iter()
            .map(|(n, f)| match f {
                Field::Array(a) => (n.as_ref(), a.data.to_vec()),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(got, [("v", vec![0, 0, 0, 0]), ("v_valid", vec![0])]);
        let raise = ArrowOptions {
            nulls: crate::Nulls::Raise,
            ..Default::default()
        };
        let src = ArrowSource::open(&[&p], raise).unwrap();
        src.read(0).unwrap();
        let e = src.read(1).unwrap_err().to_string();
        assert!(
            e.contains("nulls.arrows") && e.contains("\"v\" is null in row 1"),
            "{e}"
        );

        let nested = Arc::new(StructArray::from(vec![(
            Arc::new(ArrowField::new("a", DataType::Int32, false)),
            Arc::new(Int32Array::from(vec![1])) as ArrayRef,
        )])) as ArrayRef;
        let batch = RecordBatch::try_from_iter([("s", nested)]).unwrap();
        let src = ArrowSource::from_batches(
            batch.schema(),
            vec![batch],
            None,
            "mem://x",
            ArrowOptions::default(),
        )
        .unwrap();
        assert_eq!(src.columns(), ["s.a"], "a struct is read as its leaves");
        // Types nested past the limit are refused, named.
        let mut deep = DataType::Int32;
        for _ in 0..70 {
            deep = DataType::List(Arc::new(ArrowField::new("item", deep, true)));
        }
        let schema = Arc::new(arrow_schema::Schema::new(vec![ArrowField::new(
            "d", deep, true,
        )]));
        let e = ArrowSource::from_batches(schema, vec![], None, "mem://x", ArrowOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"d\" nests types more than 64 deep"), "{e}");

        let good = encode(&(0..6).map(sample).collect::<Vec<_>>(), 2, true, false);
        for cut in [7, 20, good.len() - 3] {
            let p = write_file(dir.path(), "cut.arrow", &good[..cut]);
            let e = ArrowSource::open(&[&p], ArrowOptions::default())
                .and_then(|s| {
                    (0..s.manifest().total_samples()).try_for_each(|i| s.read(i).map(|_| ()))
                })
                .unwrap_err();
            assert!(e.to_string().contains("cut.arrow"), "{e}");
        }
        let p = write_file(dir.path(), "junk.arrow", b"this is not arrow at all");
        let e = ArrowSource::open(&[&p], ArrowOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("junk.arrow") && e.contains("not a readable Arrow IPC"),
            "{e}"
        );
    }

    #[test]
    fn columns_without_buffers_are_bounded_by_the_decoded_limit() {
        // A null-type column has no buffers: its rows are bounded by `max_decoded_bytes`
        // (a byte a row once read, its `_valid` mask), not by the buffers' bits.
        let dir = tempfile::tempdir().unwrap();
        let stream = |rows: usize| {
            let column = Arc::new(arrow_array::NullArray::new(rows)) as ArrayRef;
            let batch = RecordBatch::try_from_iter([("z", column)]).unwrap();
            let mut out = Vec::new();
            let mut w = StreamWriter::try_new(&mut out, &batch.schema()).unwrap();
            w.write(&batch).unwrap();
            w.finish().unwrap();
            drop(w);
            out
        };
        let p = write_file(dir.path(), "nulls.arrows", &stream(100));
        let src = ArrowSource::open(&[&p], ArrowOptions::default()).unwrap();
        assert_eq!(src.manifest().total_samples(), 100);
        let limit = chute_core::Limits::current().max_decoded_bytes as usize;
        let p = write_file(dir.path(), "huge.arrows", &stream(limit + 1));
        let e = ArrowSource::open(&[&p], ArrowOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("huge.arrows") && e.contains("rows in 0 bytes"),
            "{e}"
        );
    }

    #[test]
    fn big_endian_files_are_refused_naming_the_fix() {
        // Arrow's writers write this machine's byte order: the schema message of a stream
        // written on a big-endian machine, made here.
        use arrow_ipc::{Endianness, MessageHeader, MetadataVersion};
        let mut fbb = flatbuffers::FlatBufferBuilder::new();
        let fields = fbb.create_vector::<flatbuffers::WIPOffset<arrow_ipc::Field<'_>>>(&[]);
        let schema = arrow_ipc::Schema::create(
            &mut fbb,
            &arrow_ipc::SchemaArgs {
                endianness: Endianness::Big,
                fields: Some(fields),
                custom_metadata: None,
                features: None,
            },
        );
        let message = arrow_ipc::Message::create(
            &mut fbb,
            &arrow_ipc::MessageArgs {
                version: MetadataVersion::V5,
                header_type: MessageHeader::Schema,
                header: Some(schema.as_union_value()),
                bodyLength: 0,
                custom_metadata: None,
            },
        );
        fbb.finish(message, None);
        let meta = fbb.finished_data();
        let padded = meta.len().div_ceil(8) * 8;
        let mut out = Vec::new();
        out.extend(0xFFFF_FFFFu32.to_le_bytes());
        out.extend((padded as u32).to_le_bytes());
        out.extend(meta);
        out.resize(8 + padded, 0);
        out.extend(0xFFFF_FFFFu32.to_le_bytes());
        out.extend(0u32.to_le_bytes());
        let dir = tempfile::tempdir().unwrap();
        let p = write_file(dir.path(), "big.arrows", &out);
        let e = ArrowSource::open(&[&p], ArrowOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("big.arrows") && e.contains("big-endian") && e.contains("pyarrow"),
            "{e}"
        );
    }

    #[test]
    fn lists_settle_like_collated_samples() {
        // The batch path from `collate` leaves lists of one length as a list; the engine
        // stacks them (tested in the pipeline). Here: every list column is a list.
        let mut ids = ListBuilder::new(UInt8Builder::new());
        for _ in 0..2 {
            ids.values().append_slice(&[1, 2]);
            ids.append(true);
        }
        let batch =
            RecordBatch::try_from_iter([("ids", Arc::new(ids.finish()) as ArrayRef)]).unwrap();
        let src = ArrowSource::from_batches(
            batch.schema(),
            vec![batch],
            None,
            "mem://l",
            ArrowOptions::default(),
        )
        .unwrap();
        let cols = src.collate(&[0, 1], &BufferPool::new(2)).unwrap().unwrap();
        assert!(matches!(&cols[0].1, Column::List(ts) if ts.len() == 2));
    }
}
