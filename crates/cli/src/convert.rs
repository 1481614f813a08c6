//! `chute convert`: CSV, JSON Lines, a folder of files (ImageFolder layout) or `.npy` arrays
//! to WebDataset, TFRecord or Parquet shards.
//!
//! A first pass reads the input's layout: the rows and each column's type (CSV, JSON Lines),
//! the file list (a folder), the shapes (`.npy`); it also notes where every shard's first
//! row starts. Then each output shard is a job: jobs run on `--workers` threads, each reading
//! its rows and writing its shard under a temporary name that the writer renames when the
//! shard is complete. So shard contents and names never depend on the number of workers,
//! and an interrupted convert leaves no partial shard under a final name.

use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail, ensure};
use bytes::Bytes;
use chute::core::{Array, DType, Field, Sample};
use chute::formats::parquet::ParquetWriter;
use chute::formats::tfrecord::{self, TfRecordFileWriter};
use chute::formats::webdataset::{ShardWriter, ShardWriterOptions};
use chute::formats::{NpyHeader, write_npy};
use chute::io::MappedFile;
use chute::pipeline::for_each_parallel;
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};

/// What `chute convert` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum InputFormat {
    /// Comma-separated values with a header row (`--delimiter` for others); a row is a sample.
    Csv,
    /// JSON Lines: one JSON object per line; a line is a sample, its keys the fields.
    Jsonl,
    /// A folder in ImageFolder layout: `root/<class>/<name>.<ext>`; files sharing a name up to
    /// the first dot form one sample, the class folder's position in sorted order its label.
    Folder,
    /// `.npy` arrays sharing their first axis: sample `i` takes row `i` of each, one field per
    /// file named by its stem.
    Npy,
}

/// What `chute convert` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OutputFormat {
    /// WebDataset tar shards (`.tar`).
    Webdataset,
    /// TFRecord files of `tf.train.Example`s (`.tfrecord`; `.tfrecord.gz` with `--gzip`).
    Tfrecord,
    /// Apache Parquet files (`.parquet`).
    Parquet,
}

/// `chute convert` arguments.
#[derive(Debug, Clone, Args)]
pub(crate) struct ConvertArgs {
    /// The input: CSV or JSON Lines files (read in the order given, as one table), one folder
    /// in ImageFolder layout, or `.npy` files (one field each).
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// The input format; by default from the extension (`.csv`, `.tsv`, `.jsonl`, `.ndjson`,
    /// `.npy`) or, for a folder, `folder`.
    #[arg(long, value_enum)]
    from: Option<InputFormat>,
    /// The output format.
    #[arg(long, value_enum)]
    to: OutputFormat,
    /// The output folder (created if missing).
    #[arg(short, long)]
    output: PathBuf,
    /// Shard names: `<output>/<name>-000000.<ext>`, numbered from 0.
    #[arg(long, default_value = "data")]
    name: String,
    /// Samples per shard (the last shard holds the rest).
    #[arg(long, default_value_t = 10_000)]
    shard_size: u64,
    /// Threads writing shards (default: the number of CPUs).
    #[arg(long)]
    workers: Option<usize>,
    /// CSV: the field separator (default `,`, or a tab for `.tsv`).
    #[arg(long)]
    delimiter: Option<char>,
    /// CSV and JSON Lines: take each sample's key from this column (the WebDataset key)
    /// instead of the row number; the column is not written as a field.
    #[arg(long)]
    key: Option<String>,
    /// Parquet: rows per row group (default: the shard size, at most 65,536).
    #[arg(long)]
    row_group_rows: Option<usize>,
    /// TFRecord: GZIP-compress the files (TensorFlow's `compression_type="GZIP"`).
    #[arg(long)]
    gzip: bool,
    /// Also write each shard's index file (tar, TFRecord) and `<output>/manifest.json`, for
    /// the global shuffle without scanning (what `chute index` writes).
    #[arg(long)]
    index: bool,
    /// Replace shards that already exist (by default an existing shard is an error).
    #[arg(long)]
    overwrite: bool,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

/// A column's type, inferred from every value (CSV, JSON Lines) or given by the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Whole numbers (JSON booleans too, as 0 and 1).
    Int,
    /// Numbers with a fraction or exponent; missing values become NaN.
    Float,
    /// UTF-8 text.
    Text,
    /// Bytes (a file's contents).
    Bytes,
    /// JSON arrays of numbers; `len` is `None` when the lengths differ between rows.
    List { float: bool, len: Option<usize> },
    /// Other JSON (objects, nested or mixed arrays, columns of mixed types): its JSON text.
    Json,
    /// A `.npy` row: any dtype and shape.
    Array,
}

impl Kind {
    /// The kind of a column holding values of kinds `self` and `other`.
    fn unify(self, other: Kind) -> Kind {
        use Kind::*;
        match (self, other) {
            (a, b) if a == b => a,
            (Int | Float, Int | Float) => Float,
            (Text, Int | Float) | (Int | Float, Text) => Text,
            (List { float: f1, len: l1 }, List { float: f2, len: l2 }) => List {
                float: f1 || f2,
                len: if l1 == l2 { l1 } else { None },
            },
            _ => Json,
        }
    }
}

/// One value of a row.
#[derive(Debug, Clone)]
enum Value {
    /// An empty CSV cell, a JSON `null` or a key the line lacks.
    Missing,
    Int(i64),
    Float(f64),
    Text(String),
    Bytes(Bytes),
    List(Vec<f64>, Vec<i64>),
    /// JSON text of a value that is not one of the above.
    Json(String),
    Array(Array),
}

/// A column: its name in the input and its kind.
#[derive(Debug, Clone)]
struct Column {
    name: String,
    kind: Kind,
    /// Whether some row lacks a value.
    missing: bool,
}

/// A row on its way to a shard: its key (the WebDataset key) and values in column order.
struct Row {
    key: String,
    values: Vec<Value>,
}

/// An input read in ranges of rows, from any thread.
trait Input: Sync {
    /// Rows in all.
    fn len(&self) -> u64;
    /// The columns, in order.
    fn columns(&self) -> &[Column];
    /// Calls `out` with rows `range`, in order.
    fn read(
        &self,
        range: Range<u64>,
        out: &mut dyn FnMut(Row) -> anyhow::Result<()>,
    ) -> anyhow::Result<()>;
}

/// Converts, printing what was written.
pub(crate) fn run(args: ConvertArgs) -> anyhow::Result<()> {
    ensure!(args.shard_size > 0, "--shard-size 0: pass at least 1");
    ensure!(
        !args.name.is_empty() && !args.name.contains(['/', '\\']),
        "--name {:?}: give a file name prefix without a path separator",
        args.name
    );
    if args.gzip && args.to != OutputFormat::Tfrecord {
        bail!("--gzip applies to --to tfrecord only");
    }
    if args.gzip && args.index {
        bail!("--gzip with --index: compressed TFRecord files cannot be indexed; drop one");
    }
    let from = match args.from {
        Some(f) => f,
        None => guess_input(&args.inputs)?,
    };
    let input: Box<dyn Input> = match from {
        InputFormat::Csv => Box::new(CsvInput::open(&args)?),
        InputFormat::Jsonl => Box::new(JsonlInput::open(&args)?),
        InputFormat::Folder => {
            let [root] = args.inputs.as_slice() else {
                bail!("--from folder takes one folder, the ImageFolder root");
            };
            Box::new(FolderInput::open(root)?)
        }
        InputFormat::Npy => Box::new(NpyInput::open(&args.inputs)?),
    };
    let total = input.len();
    ensure!(total > 0, "the input has no samples; nothing to write");
    let columns = input.columns().to_vec();
    let names = field_names(&columns, args.to)?;
    if args.to == OutputFormat::Parquet {
        for c in &columns {
            if let Kind::List { len: None, .. } = c.kind {
                bail!(
                    "column {:?} holds lists of different lengths; Parquet columns here are \
                     fixed-size lists: pad the lists, or write tfrecord or webdataset",
                    c.name
                );
            }
        }
    }

    std::fs::create_dir_all(&args.output)
        .with_context(|| format!("creating the output folder {}", args.output.display()))?;
    let shards = total.div_ceil(args.shard_size);
    let paths: Vec<PathBuf> = (0..shards).map(|n| shard_path(&args, n)).collect();
    if !args.overwrite
        && let Some(p) = paths.iter().find(|p| p.exists())
    {
        bail!(
            "{} exists; pass --overwrite to replace existing shards, or another --output or \
             --name",
            p.display()
        );
    }

    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total).with_style(
            ProgressStyle::with_template(
                "{bar:40} {pos}/{len} samples, {per_sec}, {elapsed} (eta {eta})",
            )
            .expect("a valid template"),
        )
    };
    let workers = args
        .workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let started = std::time::Instant::now();
    let bytes = std::sync::atomic::AtomicU64::new(0);
    for_each_parallel(shards as usize, workers, |n| {
        let lo = n as u64 * args.shard_size;
        let rows = lo..(lo + args.shard_size).min(total);
        let written = write_shard(&args, &*input, &columns, &names, n as u64, rows, &bar)
            .with_context(|| format!("writing {}", paths[n].display()))?;
        bytes.fetch_add(written, std::sync::atomic::Ordering::Relaxed);
        Ok::<(), anyhow::Error>(())
    })?;
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    let bytes = bytes.into_inner();
    println!(
        "{total} samples to {shards} {} shard(s) in {} ({:.1} MB, {:.0} samples/s, {:.1}s)",
        format_name(args.to),
        args.output.display(),
        bytes as f64 / 1e6,
        total as f64 / secs.max(1e-9),
        secs
    );
    if args.index {
        let manifest = args.output.join("manifest.json");
        crate::index::index_files(&paths, dataset_format(args.to), &manifest)?;
    }
    Ok(())
}

/// The input format from the inputs' names.
fn guess_input(inputs: &[PathBuf]) -> anyhow::Result<InputFormat> {
    let first = &inputs[0];
    if first.is_dir() {
        return Ok(InputFormat::Folder);
    }
    let ext = first
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    Ok(match ext.as_deref() {
        Some("csv" | "tsv") => InputFormat::Csv,
        Some("jsonl" | "ndjson") => InputFormat::Jsonl,
        Some("npy") => InputFormat::Npy,
        _ => bail!(
            "cannot tell the format of {} from its name; pass --from csv, jsonl, folder or npy",
            first.display()
        ),
    })
}

fn format_name(f: OutputFormat) -> &'static str {
    match f {
        OutputFormat::Webdataset => "WebDataset",
        OutputFormat::Tfrecord => "TFRecord",
        OutputFormat::Parquet => "Parquet",
    }
}

fn dataset_format(f: OutputFormat) -> crate::dataset::Format {
    match f {
        OutputFormat::Webdataset => crate::dataset::Format::Webdataset,
        OutputFormat::Tfrecord => crate::dataset::Format::Tfrecord,
        OutputFormat::Parquet => crate::dataset::Format::Parquet,
    }
}

/// Shard `n`'s path.
fn shard_path(args: &ConvertArgs, n: u64) -> PathBuf {
    let ext = match args.to {
        OutputFormat::Webdataset => "tar",
        OutputFormat::Tfrecord if args.gzip => "tfrecord.gz",
        OutputFormat::Tfrecord => "tfrecord",
        OutputFormat::Parquet => "parquet",
    };
    args.output.join(format!("{}-{n:06}.{ext}", args.name))
}

/// The field name each column gets in the output. WebDataset fields are file extensions that
/// readers decode by: lists and other JSON become `<name>.json`, arrays `<name>.npy`, and
/// names are lower-cased (as `webdataset` reads them).
fn field_names(columns: &[Column], to: OutputFormat) -> anyhow::Result<Vec<String>> {
    let names: Vec<String> = columns
        .iter()
        .map(|c| match to {
            OutputFormat::Webdataset => {
                let name = c.name.to_lowercase();
                match c.kind {
                    Kind::List { .. } | Kind::Json if !name.ends_with(".json") => {
                        format!("{name}.json")
                    }
                    Kind::Array if !name.ends_with(".npy") => format!("{name}.npy"),
                    _ => name,
                }
            }
            _ => c.name.clone(),
        })
        .collect();
    for (i, n) in names.iter().enumerate() {
        ensure!(!n.is_empty(), "column {} has an empty name; name it", i + 1);
        if let Some(j) = names[..i].iter().position(|m| m == n) {
            bail!(
                "columns {:?} and {:?} would both be written as field {n:?}; rename one",
                columns[j].name,
                columns[i].name
            );
        }
    }
    Ok(names)
}

/// Writes rows `rows` of `input` as shard `n`; returns its size in bytes.
fn write_shard(
    args: &ConvertArgs,
    input: &dyn Input,
    columns: &[Column],
    names: &[String],
    n: u64,
    rows: Range<u64>,
    bar: &ProgressBar,
) -> anyhow::Result<u64> {
    let path = &shard_path(args, n);
    let (count, rows_end) = (rows.end - rows.start, rows.end);
    let mut sink = match args.to {
        OutputFormat::Webdataset => {
            // One writer per shard, starting at this shard's number and never rotating.
            let prefix = args.output.join(format!("{}-", args.name));
            let pattern = prefix.display().to_string().replace('%', "%%") + "%06d.tar";
            Sink::Tar(ShardWriter::new(
                &pattern,
                ShardWriterOptions {
                    max_count: u64::MAX,
                    max_size: u64::MAX,
                    start_shard: n,
                    write_index: args.index,
                },
            )?)
        }
        OutputFormat::Tfrecord => Sink::Tf(TfRecordFileWriter::create(
            path,
            tfrecord::WriterOptions {
                gzip: args.gzip,
                index: args.index,
            },
        )?),
        OutputFormat::Parquet => {
            let group = args
                .row_group_rows
                .unwrap_or(args.shard_size.min(65_536) as usize);
            Sink::Parquet(ParquetWriter::create(path, group.max(1))?)
        }
    };
    let mut index = rows.start;
    input.read(rows, &mut |row| {
        let sample = to_sample(row, index, columns, names, args.to)?;
        match &mut sink {
            Sink::Tar(w) => w.write_sample(&sample)?,
            Sink::Tf(w) => w.write_sample(&sample)?,
            Sink::Parquet(w) => w.write(&sample)?,
        }
        index += 1;
        bar.inc(1);
        Ok(())
    })?;
    ensure!(
        index == rows_end,
        "the input ended after {} of {count} rows: was it changed during the convert?",
        count - (rows_end - index)
    );
    match sink {
        Sink::Tar(w) => drop(w.finish()?),
        Sink::Tf(w) => drop(w.finish()?),
        Sink::Parquet(w) => drop(w.finish()?),
    }
    Ok(std::fs::metadata(path).map_or(0, |m| m.len()))
}
/// A shard being written.
enum Sink {
    Tar(ShardWriter),
    Tf(TfRecordFileWriter),
    Parquet(ParquetWriter),
}

/// A row as the output format stores it.
fn to_sample(
    row: Row,
    index: u64,
    columns: &[Column],
    names: &[String],
    to: OutputFormat,
) -> anyhow::Result<Sample> {
    let mut sample = Sample::new(index);
    sample.key = row.key;
    let tar = to == OutputFormat::Webdataset;
    for ((value, column), name) in row.values.into_iter().zip(columns).zip(names) {
        let field = match (column.kind, value) {
            // A tar sample or an Example may lack a field; a Parquet row needs a value.
            (_, Value::Missing) if tar => continue,
            (Kind::Float, Value::Missing) => float_field(f64::NAN, tar),
            (_, Value::Missing) if to == OutputFormat::Tfrecord => continue,
            (Kind::Text, Value::Missing) => Field::Text(Bytes::new()),
            (Kind::Json, Value::Missing) => Field::Text(Bytes::from_static(b"null")),
            (_, Value::Missing) => bail!(
                "sample {index} ({:?}) has no value for {:?}, which {} needs; fill it in, or \
                 write webdataset or tfrecord",
                sample.key,
                column.name,
                format_name(to)
            ),
            (Kind::Int, Value::Int(v)) if tar => Field::Text(v.to_string().into()),
            (Kind::Int, Value::Int(v)) => Field::Array(Array::scalar_i64(v)),
            (Kind::Float, Value::Int(v)) => float_field(v as f64, tar),
            (Kind::Float, Value::Float(v)) => float_field(v, tar),
            (Kind::Text, Value::Text(s)) => Field::Text(s.into()),
            (Kind::Text, Value::Int(v)) => Field::Text(v.to_string().into()),
            (Kind::Text, Value::Float(v)) => Field::Text(v.to_string().into()),
            (Kind::Bytes, Value::Bytes(b)) => Field::Bytes(b),
            (Kind::List { float, .. }, Value::List(f, i)) => {
                if tar {
                    let text = if float {
                        serde_json::to_string(&f)
                    } else {
                        serde_json::to_string(&i)
                    };
                    Field::Text(text.expect("numbers serialize").into())
                } else if float {
                    let data: Vec<u8> = f.iter().flat_map(|v| v.to_le_bytes()).collect();
                    Field::Array(Array::new(DType::F64, vec![f.len()], data.into()))
                } else {
                    let data: Vec<u8> = i.iter().flat_map(|v| v.to_le_bytes()).collect();
                    Field::Array(Array::new(DType::I64, vec![i.len()], data.into()))
                }
            }
            (Kind::Json, Value::Json(s)) => Field::Text(s.into()),
            (Kind::Array, Value::Array(a)) => match to {
                OutputFormat::Webdataset => {
                    Field::Bytes(write_npy(a.dtype, &a.shape, &a.data)?.into())
                }
                OutputFormat::Tfrecord => Field::Array(a),
                // Parquet columns here are scalars or fixed-size lists: flatten (C order).
                OutputFormat::Parquet if a.shape.len() > 1 => {
                    let n = a.shape.iter().product();
                    Field::Array(Array::new(a.dtype, vec![n], a.data))
                }
                OutputFormat::Parquet => Field::Array(a),
            },
            (kind, value) => bail!(
                "sample {index}: value {value:?} of column {:?} does not fit its type {kind:?} \
                 (an internal inconsistency; please report it)",
                column.name
            ),
        };
        sample.fields.push((name.clone().into(), field));
    }
    Ok(sample)
}

fn float_field(v: f64, tar: bool) -> Field {
    if tar {
        Field::Text(v.to_string().into())
    } else {
        Field::Array(Array::new(
            DType::F64,
            Vec::new(),
            Bytes::copy_from_slice(&v.to_le_bytes()),
        ))
    }
}

/// A position in a list of text inputs: file, byte offset, and the row number there.
#[derive(Debug, Clone, Copy)]
struct Position {
    file: usize,
    byte: u64,
}

/// The key of row `row` when no key column is given.
fn row_key(row: u64) -> String {
    format!("{row:09}")
}

/// CSV files with a header row, read as one table.
struct CsvInput {
    files: Vec<PathBuf>,
    delimiter: u8,
    columns: Vec<Column>,
    /// The column holding keys, if any (not among `columns`).
    key: Option<usize>,
    /// Header names, in file order.
    header: Vec<String>,
    rows: u64,
    /// Where rows `k * shard_size` start.
    starts: Vec<Position>,
    shard_size: u64,
}

impl CsvInput {
    fn open(args: &ConvertArgs) -> anyhow::Result<CsvInput> {
        let tsv = args.inputs[0]
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("tsv"));
        let delimiter = match args.delimiter {
            Some(c) if c.is_ascii() => c as u8,
            Some(c) => bail!("--delimiter {c:?}: use a single ASCII character"),
            None if tsv => b'\t',
            None => b',',
        };
        let mut header: Option<Vec<String>> = None;
        let mut kinds: Vec<Option<Kind>> = Vec::new();
        let mut missing: Vec<bool> = Vec::new();
        let mut starts = Vec::new();
        let mut rows = 0u64;
        for (file, path) in args.inputs.iter().enumerate() {
            let mut reader = csv_reader(open_at(path, 0)?, delimiter, true);
            let names: Vec<String> = reader
                .headers()
                .with_context(|| format!("{}: reading the header row", path.display()))?
                .iter()
                .map(str::to_owned)
                .collect();
            match &header {
                None => {
                    kinds = vec![None; names.len()];
                    missing = vec![false; names.len()];
                    header = Some(names);
                }
                Some(h) if *h == names => {}
                Some(h) => bail!(
                    "{}: the header {names:?} differs from the first file's {h:?}; convert \
                     files with the same columns together",
                    path.display()
                ),
            }
            let mut record = csv::StringRecord::new();
            loop {
                let byte = reader.position().byte();
                let more = reader.read_record(&mut record).with_context(|| {
                    format!(
                        "{} at byte {byte}: reading row {}",
                        path.display(),
                        rows + 1
                    )
                })?;
                if !more {
                    break;
                }
                if rows.is_multiple_of(args.shard_size) {
                    starts.push(Position { file, byte });
                }
                for (k, cell) in record.iter().enumerate() {
                    if cell.is_empty() {
                        missing[k] = true;
                        continue;
                    }
                    let kind = cell_kind(cell);
                    kinds[k] = Some(kinds[k].map_or(kind, |k0| k0.unify(kind)));
                }
                rows += 1;
            }
        }
        let header = header.expect("at least one input");
        let key = match &args.key {
            Some(k) => Some(header.iter().position(|h| h == k).with_context(|| {
                format!("--key {k:?}: no such column; the columns are {header:?}")
            })?),
            None => None,
        };
        let columns = header
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != key)
            .map(|(i, name)| Column {
                name: name.clone(),
                // An all-empty column is text; a numeric column with gaps is float (NaN).
                kind: match (kinds[i], missing[i]) {
                    (None, _) => Kind::Text,
                    (Some(Kind::Int), true) => Kind::Float,
                    (Some(k), _) => k,
                },
                missing: missing[i],
            })
            .collect();
        Ok(CsvInput {
            files: args.inputs.clone(),
            delimiter,
            columns,
            key,
            header,
            rows,
            starts,
            shard_size: args.shard_size,
        })
    }
}

/// `path`, opened and positioned at `byte`.
fn open_at(path: &Path, byte: u64) -> anyhow::Result<File> {
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    file.seek(SeekFrom::Start(byte))
        .with_context(|| format!("seeking in {}", path.display()))?;
    Ok(file)
}

fn csv_reader(file: File, delimiter: u8, headers: bool) -> csv::Reader<BufReader<File>> {
    csv::ReaderBuilder::new()
        .delimiter(delimiter)
        .has_headers(headers)
        .from_reader(BufReader::with_capacity(1 << 20, file))
}

/// The kind of a non-empty CSV cell.
fn cell_kind(cell: &str) -> Kind {
    if cell.parse::<i64>().is_ok() {
        Kind::Int
    } else if cell.parse::<f64>().is_ok() {
        Kind::Float
    } else {
        Kind::Text
    }
}

impl Input for CsvInput {
    fn len(&self) -> u64 {
        self.rows
    }

    fn columns(&self) -> &[Column] {
        &self.columns
    }

    fn read(
        &self,
        range: Range<u64>,
        out: &mut dyn FnMut(Row) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let start = self.starts[(range.start / self.shard_size) as usize];
        let mut row = range.start;
        let mut file = start.file;
        let mut at = Some(start.byte);
        let mut record = csv::StringRecord::new();
        while row < range.end {
            ensure!(
                file < self.files.len(),
                "the input ended before row {}: was it changed during the convert?",
                range.end
            );
            let path = &self.files[file];
            // The shard's first file from its first row; the next ones after their header.
            let mut reader = match at.take() {
                Some(byte) => csv_reader(open_at(path, byte)?, self.delimiter, false),
                None => csv_reader(open_at(path, 0)?, self.delimiter, true),
            };
            while row < range.end {
                let more = reader
                    .read_record(&mut record)
                    .with_context(|| format!("{}: reading row {}", path.display(), row + 1))?;
                if !more {
                    break;
                }
                out(self.row(&record, row, path)?)?;
                row += 1;
            }
            file += 1;
        }
        Ok(())
    }
}

impl CsvInput {
    fn row(&self, record: &csv::StringRecord, row: u64, path: &Path) -> anyhow::Result<Row> {
        ensure!(
            record.len() == self.header.len(),
            "{}: row {} has {} fields, the header {}",
            path.display(),
            row + 1,
            record.len(),
            self.header.len()
        );
        let key = match self.key {
            Some(k) => record[k].to_owned(),
            None => row_key(row),
        };
        let mut values = Vec::with_capacity(self.columns.len());
        let mut c = 0;
        for (i, cell) in record.iter().enumerate() {
            if Some(i) == self.key {
                continue;
            }
            let kind = self.columns[c].kind;
            c += 1;
            values.push(if cell.is_empty() {
                Value::Missing
            } else {
                match kind {
                    Kind::Int => Value::Int(cell.parse().with_context(|| {
                        format!(
                            "{}: row {}: {cell:?} is not an integer",
                            path.display(),
                            row + 1
                        )
                    })?),
                    Kind::Float => Value::Float(cell.parse().with_context(|| {
                        format!(
                            "{}: row {}: {cell:?} is not a number",
                            path.display(),
                            row + 1
                        )
                    })?),
                    _ => Value::Text(cell.to_owned()),
                }
            });
        }
        Ok(Row { key, values })
    }
}

/// JSON Lines files, read as one table: one object per non-blank line.
struct JsonlInput {
    files: Vec<PathBuf>,
    columns: Vec<Column>,
    key: Option<String>,
    rows: u64,
    starts: Vec<Position>,
    shard_size: u64,
}

/// The kind of a JSON value; `None` for `null`.
fn json_kind(v: &serde_json::Value) -> Option<Kind> {
    use serde_json::Value as J;
    Some(match v {
        J::Null => return None,
        J::Bool(_) => Kind::Int,
        J::Number(n) if n.is_i64() => Kind::Int,
        J::Number(_) => Kind::Float,
        J::String(_) => Kind::Text,
        J::Array(items) if items.iter().all(|x| x.is_number()) => Kind::List {
            float: items.iter().any(|x| !x.is_i64()),
            len: Some(items.len()),
        },
        _ => Kind::Json,
    })
}

impl JsonlInput {
    fn open(args: &ConvertArgs) -> anyhow::Result<JsonlInput> {
        // Per column: name, kind (None until a non-null value), whether some row lacks it.
        let mut names: Vec<String> = Vec::new();
        let mut kinds: Vec<Option<Kind>> = Vec::new();
        let mut missing: Vec<bool> = Vec::new();
        let mut seen: Vec<bool> = Vec::new();
        let mut starts = Vec::new();
        let mut rows = 0u64;
        for (file, path) in args.inputs.iter().enumerate() {
            let mut lines = Lines::open(path, 0)?;
            while let Some((byte, line)) = lines.next_line()? {
                let object = parse_object(path, byte, line)?;
                if rows.is_multiple_of(args.shard_size) {
                    starts.push(Position { file, byte });
                }
                seen.iter_mut().for_each(|s| *s = false);
                for (name, v) in &object {
                    if args.key.as_deref() == Some(name.as_str()) {
                        continue;
                    }
                    let i = names.iter().position(|n| n == name).unwrap_or_else(|| {
                        names.push(name.clone());
                        kinds.push(None);
                        missing.push(rows > 0); // the rows before this one lack it
                        seen.push(false);
                        names.len() - 1
                    });
                    seen[i] = true;
                    match json_kind(v) {
                        None => missing[i] = true,
                        Some(k) => kinds[i] = Some(kinds[i].map_or(k, |k0| k0.unify(k))),
                    }
                }
                for (m, s) in missing.iter_mut().zip(&seen) {
                    *m |= !s;
                }
                rows += 1;
            }
        }
        let columns = names
            .into_iter()
            .zip(kinds)
            .zip(missing)
            .map(|((name, kind), missing)| Column {
                name,
                // Only nulls: text; whole numbers with gaps: float (NaN).
                kind: match (kind, missing) {
                    (None, _) => Kind::Text,
                    (Some(Kind::Int), true) => Kind::Float,
                    (Some(k), _) => k,
                },
                missing,
            })
            .collect();
        Ok(JsonlInput {
            files: args.inputs.clone(),
            columns,
            key: args.key.clone(),
            rows,
            starts,
            shard_size: args.shard_size,
        })
    }
}

fn parse_object(
    path: &Path,
    byte: u64,
    line: &[u8],
) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    match serde_json::from_slice::<serde_json::Value>(line) {
        Ok(serde_json::Value::Object(o)) => Ok(o),
        Ok(other) => bail!(
            "{} at byte {byte}: the line is JSON but not an object ({}); JSON Lines input \
             needs one object per line",
            path.display(),
            json_type(&other)
        ),
        Err(e) => bail!(
            "{} at byte {byte}: not JSON ({e}); JSON Lines input needs one object per line",
            path.display()
        ),
    }
}

fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Non-blank lines of a file with their byte offsets.
struct Lines {
    reader: BufReader<File>,
    byte: u64,
    buf: Vec<u8>,
}

impl Lines {
    fn open(path: &Path, byte: u64) -> anyhow::Result<Lines> {
        let file = open_at(path, byte)?;
        Ok(Lines {
            reader: BufReader::with_capacity(1 << 20, file),
            byte,
            buf: Vec::new(),
        })
    }

    /// The next non-blank line (without its end of line) and where it starts.
    fn next_line(&mut self) -> anyhow::Result<Option<(u64, &[u8])>> {
        loop {
            self.buf.clear();
            let start = self.byte;
            let n = self.reader.read_until(b'\n', &mut self.buf)?;
            if n == 0 {
                return Ok(None);
            }
            self.byte += n as u64;
            if !self.buf.iter().all(u8::is_ascii_whitespace) {
                return Ok(Some((start, &self.buf)));
            }
        }
    }
}

impl Input for JsonlInput {
    fn len(&self) -> u64 {
        self.rows
    }

    fn columns(&self) -> &[Column] {
        &self.columns
    }

    fn read(
        &self,
        range: Range<u64>,
        out: &mut dyn FnMut(Row) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let start = self.starts[(range.start / self.shard_size) as usize];
        let mut row = range.start;
        let mut file = start.file;
        let mut byte = start.byte;
        while row < range.end {
            ensure!(
                file < self.files.len(),
                "the input ended before row {}: was it changed during the convert?",
                range.end
            );
            let path = &self.files[file];
            let mut lines = Lines::open(path, byte)?;
            while row < range.end {
                let Some((at, line)) = lines.next_line()? else {
                    break;
                };
                let object = parse_object(path, at, line)?;
                out(self.row(object, row, path, at)?)?;
                row += 1;
            }
            file += 1;
            byte = 0;
        }
        Ok(())
    }
}

impl JsonlInput {
    fn row(
        &self,
        mut object: serde_json::Map<String, serde_json::Value>,
        row: u64,
        path: &Path,
        byte: u64,
    ) -> anyhow::Result<Row> {
        use serde_json::Value as J;
        let key = match &self.key {
            Some(k) => match object.remove(k) {
                Some(J::String(s)) => s,
                Some(J::Number(n)) => n.to_string(),
                _ => bail!(
                    "{} at byte {byte}: the line has no string or number {k:?} for --key",
                    path.display()
                ),
            },
            None => row_key(row),
        };
        let values = self
            .columns
            .iter()
            .map(|c| {
                let v = object.remove(&c.name).unwrap_or(J::Null);
                match (c.kind, v) {
                    (_, J::Null) => Value::Missing,
                    (Kind::Int, J::Bool(b)) => Value::Int(i64::from(b)),
                    (Kind::Int, J::Number(n)) => Value::Int(n.as_i64().unwrap_or_default()),
                    (Kind::Float, J::Bool(b)) => Value::Float(f64::from(u8::from(b))),
                    (Kind::Float, J::Number(n)) => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
                    (Kind::Text, J::String(s)) => Value::Text(s),
                    (Kind::Text, J::Number(n)) => Value::Text(n.to_string()),
                    (Kind::List { float: true, .. }, J::Array(items)) => Value::List(
                        items
                            .iter()
                            .map(|x| x.as_f64().unwrap_or(f64::NAN))
                            .collect(),
                        Vec::new(),
                    ),
                    (Kind::List { float: false, .. }, J::Array(items)) => Value::List(
                        Vec::new(),
                        items
                            .iter()
                            .map(|x| x.as_i64().unwrap_or_default())
                            .collect(),
                    ),
                    (_, other) => Value::Json(other.to_string()),
                }
            })
            .collect();
        Ok(Row { key, values })
    }
}

/// One sample of a folder: its key (`<class>/<name>`), label and files by field.
struct FolderSample {
    key: String,
    label: i64,
    files: Vec<(String, PathBuf)>,
}

/// A folder in ImageFolder layout.
struct FolderInput {
    samples: Vec<FolderSample>,
    columns: Vec<Column>,
}

impl FolderInput {
    fn open(root: &Path) -> anyhow::Result<FolderInput> {
        let mut classes: Vec<String> = Vec::new();
        for entry in
            std::fs::read_dir(root).with_context(|| format!("listing {}", root.display()))?
        {
            let entry = entry.with_context(|| format!("listing {}", root.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.path().is_dir() && !name.starts_with('.') {
                classes.push(name);
            }
        }
        classes.sort();
        ensure!(
            !classes.is_empty(),
            "{} has no class folders; the ImageFolder layout is <root>/<class>/<file>",
            root.display()
        );
        let mut samples: Vec<FolderSample> = Vec::new();
        let mut fields: Vec<String> = Vec::new();
        for (label, class) in classes.iter().enumerate() {
            let mut files = Vec::new();
            walk(&root.join(class), class, &mut files)?;
            files.sort();
            for (rel, path) in files {
                // The WebDataset rule: the key is the path up to the first dot of the file
                // name, the rest (lower-cased) names the field.
                let (dir, file) = rel.rsplit_once('/').expect("under a class folder");
                let Some((stem, ext)) = file.split_once('.') else {
                    bail!(
                        "{}: a file name without an extension; name files <name>.<ext> (the \
                         extension names the field)",
                        path.display()
                    );
                };
                ensure!(
                    !stem.is_empty() && !ext.is_empty(),
                    "{}: the name needs text before and after its first dot",
                    path.display()
                );
                let key = format!("{dir}/{stem}");
                let ext = ext.to_lowercase();
                ensure!(
                    ext != "cls",
                    "{}: the field `cls` holds the label; rename the file",
                    path.display()
                );
                if !fields.contains(&ext) {
                    fields.push(ext.clone());
                }
                match samples.last_mut() {
                    Some(s) if s.key == key => {
                        ensure!(
                            !s.files.iter().any(|(e, _)| *e == ext),
                            "{}: two files give sample {key:?} field {ext:?}",
                            path.display()
                        );
                        s.files.push((ext, path));
                    }
                    _ => samples.push(FolderSample {
                        key,
                        label: label as i64,
                        files: vec![(ext, path)],
                    }),
                }
            }
        }
        fields.sort();
        let mut columns: Vec<Column> = fields
            .into_iter()
            .map(|name| Column {
                name,
                kind: Kind::Bytes,
                missing: false,
            })
            .collect();
        for c in &mut columns {
            c.missing = samples
                .iter()
                .any(|s| !s.files.iter().any(|(e, _)| *e == c.name));
        }
        columns.push(Column {
            name: "cls".into(),
            kind: Kind::Int,
            missing: false,
        });
        Ok(FolderInput { samples, columns })
    }
}

/// Files under `dir` (recursively, hidden ones skipped) as (`rel/path`, full path).
fn walk(dir: &Path, rel: &str, out: &mut Vec<(String, PathBuf)>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        let rel = format!("{rel}/{name}");
        if path.is_dir() {
            walk(&path, &rel, out)?;
        } else {
            out.push((rel, path));
        }
    }
    Ok(())
}

impl Input for FolderInput {
    fn len(&self) -> u64 {
        self.samples.len() as u64
    }

    fn columns(&self) -> &[Column] {
        &self.columns
    }

    fn read(
        &self,
        range: Range<u64>,
        out: &mut dyn FnMut(Row) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        for s in &self.samples[range.start as usize..range.end as usize] {
            let mut values = Vec::with_capacity(self.columns.len());
            for c in &self.columns[..self.columns.len() - 1] {
                values.push(match s.files.iter().find(|(e, _)| *e == c.name) {
                    Some((_, path)) => Value::Bytes(
                        std::fs::read(path)
                            .with_context(|| format!("reading {}", path.display()))?
                            .into(),
                    ),
                    None => Value::Missing,
                });
            }
            values.push(Value::Int(s.label));
            out(Row {
                key: s.key.clone(),
                values,
            })?;
        }
        Ok(())
    }
}

/// `.npy` files sharing their first axis, memory-mapped.
struct NpyInput {
    arrays: Vec<(MappedFile, NpyHeader, usize)>,
    columns: Vec<Column>,
    rows: u64,
}

impl NpyInput {
    fn open(paths: &[PathBuf]) -> anyhow::Result<NpyInput> {
        let mut arrays = Vec::new();
        let mut columns = Vec::new();
        let mut rows: Option<(usize, &Path)> = None;
        for path in paths {
            let origin = path.display().to_string();
            let file = MappedFile::open(path)?;
            let (header, offset) = NpyHeader::parse(file.as_slice(), &origin)?;
            header.data_range(offset, file.len(), &origin)?;
            let Some(&n) = header.shape().first() else {
                bail!(
                    "{origin}: a 0-d array (a single value); each .npy file needs a first axis \
                     of samples"
                );
            };
            match rows {
                None => rows = Some((n, path)),
                Some((m, first)) if m != n => bail!(
                    "{origin} has {n} rows (first axis), {} has {m}; every .npy file needs the \
                     same number",
                    first.display()
                ),
                Some(_) => {}
            }
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            ensure!(
                !columns.iter().any(|c: &Column| c.name == name),
                "two .npy files are named {name:?}; each file's stem names a field"
            );
            columns.push(Column {
                name,
                kind: Kind::Array,
                missing: false,
            });
            arrays.push((file, header, offset));
        }
        Ok(NpyInput {
            arrays,
            columns,
            rows: rows.map_or(0, |(n, _)| n as u64),
        })
    }
}

impl Input for NpyInput {
    fn len(&self) -> u64 {
        self.rows
    }

    fn columns(&self) -> &[Column] {
        &self.columns
    }

    fn read(
        &self,
        range: Range<u64>,
        out: &mut dyn FnMut(Row) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        for row in range {
            let values = self
                .arrays
                .iter()
                .map(|(file, header, offset)| {
                    let shape = header.shape()[1..].to_vec();
                    let size = shape.iter().product::<usize>() * header.dtype().size();
                    let at = offset + row as usize * size;
                    Value::Array(Array::new(header.dtype(), shape, file.bytes(at..at + size)))
                })
                .collect();
            out(Row {
                key: row_key(row),
                values,
            })?;
        }
        Ok(())
    }
}
