//! `chute convert`: CSV, JSON Lines, a folder of files (ImageFolder layout) or `.npy` arrays
//! to WebDataset, TFRecord or Parquet shards.
//!
//! A first pass reads the input's layout: the rows and each column's type (CSV, JSON Lines),
//! the file list (a folder), the shapes (`.npy`); it also notes where every shard's first
//! row starts. Then each output shard is a job: jobs run on `--workers` threads, each reading
//! its rows and writing its shard under a temporary name that the writer renames when the
//! shard is complete. So shard contents and names never depend on the number of workers,
//! and an interrupted convert leaves no partial shard under a final name.
//!
//! Each input format is a file here (`csv`, `jsonl`, `folder`, `npy`) implementing [`Input`];
//! column types and their inference are in `infer`; `table` keeps where the shards of the
//! text formats (CSV, JSON Lines) start, and reads a shard's rows from there.

mod csv;
mod folder;
mod infer;
mod jsonl;
mod npy;
mod table;
#[cfg(test)]
mod testing;

use std::ops::Range;
use std::path::PathBuf;

use anyhow::{Context, bail, ensure};
use bytes::Bytes;
use chute::core::{Array, DType, Field, Sample};
use chute::formats::parquet::ParquetWriter;
use chute::formats::tfrecord::{self, TfRecordFileWriter};
use chute::formats::webdataset::{ShardWriter, ShardWriterOptions};
use chute::formats::write_npy;
use chute::pipeline::for_each_parallel;
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};

use self::csv::CsvInput;
use self::folder::FolderInput;
use self::infer::{Column, Kind, Value};
use self::jsonl::JsonlInput;
use self::npy::NpyInput;

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
        InputFormat::Csv => Box::new(CsvInput::open(
            &args.inputs,
            args.delimiter,
            args.key.as_deref(),
            args.shard_size,
        )?),
        InputFormat::Jsonl => Box::new(JsonlInput::open(
            &args.inputs,
            args.key.as_deref(),
            args.shard_size,
        )?),
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

fn dataset_format(f: OutputFormat) -> chute::formats::Format {
    match f {
        OutputFormat::Webdataset => chute::formats::Format::WebDataset,
        OutputFormat::Tfrecord => chute::formats::Format::TfRecord,
        OutputFormat::Parquet => chute::formats::Format::Parquet,
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
            Sink::Parquet(Box::new(ParquetWriter::create(path, group.max(1))?))
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
    Parquet(Box<ParquetWriter>),
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

/// The key of row `row` when no key column is given.
fn row_key(row: u64) -> String {
    format!("{row:09}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn column(name: &str, kind: Kind) -> Column {
        Column {
            name: name.into(),
            kind,
            missing: true,
        }
    }

    #[test]
    fn webdataset_field_names_are_lower_case_extensions() {
        let list = Kind::List {
            float: false,
            len: None,
        };
        let columns = [
            column("Label", Kind::Int),
            column("l", list),
            column("meta.JSON", Kind::Json),
            column("x", Kind::Array),
            column("y.npy", Kind::Array),
        ];
        let names = field_names(&columns, OutputFormat::Webdataset).unwrap();
        assert_eq!(names, ["label", "l.json", "meta.json", "x.npy", "y.npy"]);
        let names = field_names(&columns, OutputFormat::Parquet).unwrap();
        assert_eq!(names, ["Label", "l", "meta.JSON", "x", "y.npy"]);
    }

    #[test]
    fn field_names_must_be_distinct_and_not_empty() {
        let columns = [column("A", Kind::Int), column("a", Kind::Int)];
        let err = field_names(&columns, OutputFormat::Webdataset).unwrap_err();
        assert!(
            err.to_string().contains("both be written as field \"a\""),
            "{err}"
        );
        assert!(field_names(&columns, OutputFormat::Tfrecord).is_ok());
        let err = field_names(&[column("", Kind::Int)], OutputFormat::Parquet).unwrap_err();
        assert!(
            err.to_string().contains("column 1 has an empty name"),
            "{err}"
        );
    }

    /// The fields `to` stores for a row of `values`, in Debug form.
    fn fields(to: OutputFormat, columns: &[Column], values: Vec<Value>) -> anyhow::Result<String> {
        let names: Vec<String> = columns.iter().map(|c| c.name.clone()).collect();
        let row = Row {
            key: "k".into(),
            values,
        };
        let sample = to_sample(row, 0, columns, &names, to)?;
        Ok(sample
            .fields
            .iter()
            .map(|(name, field)| format!("{name}={field:?}"))
            .collect::<Vec<_>>()
            .join(" "))
    }

    #[test]
    fn missing_values_by_output_format() {
        let columns = [
            column("f", Kind::Float),
            column("t", Kind::Text),
            column("j", Kind::Json),
        ];
        let missing = || vec![Value::Missing, Value::Missing, Value::Missing];
        // A tar sample lacks the file; an Example lacks the feature, but a float is NaN.
        assert_eq!(
            fields(OutputFormat::Webdataset, &columns, missing()).unwrap(),
            ""
        );
        let tf = fields(OutputFormat::Tfrecord, &columns, missing()).unwrap();
        assert!(tf.starts_with("f=Array") && !tf.contains("t="), "{tf}");
        // A Parquet row needs a value: NaN, empty text, JSON null; none for a whole number.
        let pq = fields(OutputFormat::Parquet, &columns, missing()).unwrap();
        assert!(pq.starts_with("f=Array"), "{pq}");
        assert!(
            pq.contains("t=Text(b\"\")") && pq.contains("j=Text(b\"null\")"),
            "{pq}"
        );
        let err = fields(
            OutputFormat::Parquet,
            &[column("n", Kind::Int)],
            vec![Value::Missing],
        )
        .unwrap_err();
        assert!(err.to_string().contains("has no value for \"n\""), "{err}");
    }

    #[test]
    fn webdataset_numbers_are_text() {
        let columns = [column("i", Kind::Int), column("f", Kind::Float)];
        let got = fields(
            OutputFormat::Webdataset,
            &columns,
            vec![Value::Int(-3), Value::Int(2)],
        )
        .unwrap();
        assert_eq!(got, "i=Text(b\"-3\") f=Text(b\"2\")");
    }
}
