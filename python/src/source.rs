//! [`Source`]: an opened dataset, and the functions that open one: `dataset` (any format,
//! folders and manifests included) and, with the format fixed, `tokens`, `webdataset`,
//! `tfrecord` and `parquet`. All of them go through `chute::dataset::Opened`, the one opener
//! the command line uses too.

use std::path::PathBuf;
use std::sync::Arc;

use chute::DType;
use chute::dataset::{Dataset, Long, OpenOptions, Opened, Pack, PackOptions};
use chute::formats::Fill;
use chute::formats::ipc::{ArrowOptions, ArrowSource};
use chute::formats::{Format, IndexMode};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyString};

use crate::errors;
use crate::map_dataset::MapDataset;

/// A dataset chute can load: samples addressed by a global id, in shards. Made by
/// `chute.dataset(...)`, `chute.tokens(...)`, `chute.webdataset(...)`, `chute.tfrecord(...)`
/// or `chute.parquet(...)`; passed to `chute.Loader`.
#[pyclass(module = "chute._chute", name = "Source", frozen)]
pub(crate) struct Source {
    pub(crate) inner: Arc<dyn chute::Source>,
    /// The format's name, for `repr` and `format` (`"python"` for a map-style dataset).
    format: &'static str,
    /// The Python dataset behind the source, when it is one.
    pub(crate) dataset: Option<Arc<MapDataset>>,
    /// The mixture behind the source, when it is one (so it nests in another).
    pub(crate) mixture: Option<Arc<chute::dataset::Mixture>>,
    /// Where Python transforms inside the source (a mixture's) park `KeyboardInterrupt`.
    pub(crate) interrupt: Option<Arc<crate::transform::Interrupt>>,
}

impl Source {
    /// A map-style Python dataset as a source.
    pub(crate) fn from_dataset(dataset: Arc<MapDataset>) -> Source {
        Source {
            inner: Arc::clone(&dataset) as Arc<dyn chute::Source>,
            format: "python",
            dataset: Some(dataset),
            mixture: None,
            interrupt: None,
        }
    }

    /// A map-style Python dataset read through another source (its worker processes, with
    /// `worker_mode="process"`): the dataset still gives the structure.
    pub(crate) fn read_through(dataset: Arc<MapDataset>, inner: Arc<dyn chute::Source>) -> Source {
        Source {
            inner,
            format: "python",
            dataset: Some(dataset),
            mixture: None,
            interrupt: None,
        }
    }

    /// A mixture as a source.
    pub(crate) fn from_mixture(
        mixture: Arc<chute::dataset::Mixture>,
        interrupt: Arc<crate::transform::Interrupt>,
    ) -> Source {
        Source {
            inner: Arc::clone(&mixture) as Arc<dyn chute::Source>,
            format: chute::dataset::mixture::MIXTURE_FORMAT,
            dataset: None,
            mixture: Some(mixture),
            interrupt: Some(interrupt),
        }
    }
}

#[pymethods]
impl Source {
    /// Number of samples in the dataset (all shards).
    fn __len__(&self) -> usize {
        self.inner.manifest().total_samples() as usize
    }

    /// `(path, samples)` of each shard, in order.
    #[getter]
    fn shards(&self) -> Vec<(String, u64)> {
        self.inner
            .manifest()
            .shards
            .iter()
            .map(|s| (s.path.clone(), s.samples))
            .collect()
    }

    /// The format: `"tokens"`, `"webdataset"`, `"tfrecord"`, `"parquet"`, `"arrow"`, or
    /// `"python"` for a map-style Python dataset.
    #[getter]
    fn format(&self) -> &'static str {
        self.format
    }

    /// The source types of the columns a batch holds as numbers of another type
    /// (`{"ts": "timestamp[us, tz=UTC]", "day": "date32[day]", "price": "decimal128(10, 2)"}`),
    /// in column order; empty for sources without such columns.
    #[getter]
    fn column_types<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for c in self.inner.column_types() {
            d.set_item(c.name, c.source)?;
        }
        Ok(d)
    }

    /// The dictionary of each column read as codes (`dictionaries="codes"`): `{"color":
    /// ["red", "green", "blue"]}`, code `i` standing for value `i`.
    #[getter]
    fn dictionaries<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for c in self.inner.column_types() {
            if let Some(values) = &c.dictionary {
                d.set_item(c.name, crate::values::list_of(py, values)?)?;
            }
        }
        Ok(d)
    }

    /// The numpy dtypes of the columns whose int64 counts numpy has a type for
    /// (`{"ts": "datetime64[us]", "took": "timedelta64[ms]"}`): what the loader views them as.
    #[getter]
    fn numpy_types<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for c in self.inner.column_types() {
            if let Some(numpy) = c.numpy {
                d.set_item(c.name, numpy)?;
            }
        }
        Ok(d)
    }

    /// For a Python dataset, the structure of its samples once one has been read (what the
    /// loader rebuilds batches with: `("map", type, [(key, node)])`, `("seq", type, [node])`,
    /// `("leaf", column, kind)`); `None` otherwise.
    #[getter]
    fn structure(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.dataset.as_ref().and_then(|d| d.structure(py))
    }

    /// For a mixture: `{"components": [(name, samples)], "samples_per_epoch", "mode",
    /// "policy", "schedule": [(position, weights)], "ramp", "epochs_per_epoch": {name: epochs
    /// of the component one mixture epoch consumes}}`; `None` for other sources.
    #[getter]
    fn mixture<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(m) = &self.mixture else {
            return Ok(None);
        };
        let (points, ramp) = m.schedule();
        let info = serde_json::json!({
            "components": m.components().iter().map(|c| (c.name(), c.len())).collect::<Vec<_>>(),
            "samples_per_epoch": m.samples_per_epoch(),
            "mode": m.mode().to_string(),
            "policy": m.policy().to_string(),
            "schedule": points,
            "ramp": ramp,
            "epochs_per_epoch": m.epochs_per_epoch().into_iter()
                .map(|(n, e)| (n, serde_json::Value::from(e)))
                .collect::<serde_json::Map<_, _>>(),
        });
        py.import("json")?
            .call_method1("loads", (info.to_string(),))
            .map(Some)
    }

    /// The source's own figures, as `Loader.stats()["source"]` gives them (a chat source's
    /// `{"chat": {"rows", "kept", "truncated", "skipped_<why>"}}`); `None` when it has none.
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(s) = self.inner.stats() else {
            return Ok(None);
        };
        py.import("json")?
            .call_method1("loads", (s.to_string(),))
            .map(Some)
    }

    /// The dataset's fingerprint (what a `state_dict` is checked against).
    #[getter]
    fn fingerprint(&self) -> String {
        self.inner.manifest().fingerprint()
    }

    fn __repr__(&self) -> String {
        let m = self.inner.manifest();
        format!(
            "chute.Source({}, shards={}, samples={})",
            self.format,
            m.shards.len(),
            m.total_samples()
        )
    }
}

/// One path or a sequence of paths (`str` or `os.PathLike`); the opener expands brace
/// patterns and globs and lists folders.
fn paths(obj: &Bound<'_, PyAny>) -> PyResult<Vec<PathBuf>> {
    if obj.is_instance_of::<PyString>() || obj.hasattr("__fspath__")? {
        return Ok(vec![obj.extract()?]);
    }
    obj.try_iter()?.map(|item| item?.extract()).collect()
}

/// `index="auto" | "require" | "scan"`.
fn index_mode(index: &str) -> PyResult<IndexMode> {
    index.parse().map_err(errors::from_config)
}

/// Resolves `paths` and opens them with `options`, the GIL released.
fn open(py: Python<'_>, paths: &Bound<'_, PyAny>, options: OpenOptions) -> PyResult<Source> {
    let files = self::paths(paths)?;
    let opened = py
        .detach(|| Opened::open(&files, &options))
        .map_err(errors::to_py)?;
    if let Some(mixture) = opened.mixture() {
        return Ok(Source::from_mixture(
            Arc::clone(mixture),
            Arc::new(crate::transform::Interrupt::default()),
        ));
    }
    Ok(Source {
        format: opened.kind_name(),
        inner: opened.source,
        dataset: None,
        mixture: None,
        interrupt: None,
    })
}

/// Any dataset chute reads: shard files or URLs, brace patterns, globs, a folder (every shard
/// inside, sorted; or its `manifest.json`) or a `manifest.json` (path or URL, written by
/// `chute index`; its shards must still match it). The format comes from the manifest or
/// the extensions unless `format` names it. The other options apply to the formats that use
/// them: `seq_len`, `dtype`, `out_dtype` (token files; by default the manifest's, else 1024,
/// uint16 and int64), `columns` (Parquet, Arrow and JSON Lines columns, TFRecord features),
/// `chunk_rows` (Parquet, Arrow, JSON Lines), `stack` (Parquet, Arrow, JSON Lines: `{name:
/// [columns]}`), `cache_bytes` (Parquet: see `parquet`), `index` (tar and
/// TFRecord), `raw` and `verify_checksums` (TFRecord), and packing for token files and
/// Megatron datasets (`pack`, `eos_id`, `pad_id`, `long`, `pack_window`, `pack_seed`,
/// `pad_to_multiple_of`, `bucket`: see `tokens`). With `tokenizer` (a `tokenizer.json`), the
/// paths are text: JSON Lines, Parquet, Arrow, tar, TFRecord or text files, the text in
/// `text_field` (a key, column, member extension or feature); every document is tokenized
/// when opened, on every core (`add_special_tokens` as the tokenizers package's `encode`),
/// and packed (`concat` by default, `eos_id` appended after each document).
///
/// With `chat=True` (or a `chat_template`), `tokenizer` is a tokenizer folder (as
/// `save_pretrained` writes it: `tokenizer.json`, `tokenizer_config.json` with the chat
/// template and special tokens, or `chat_template.jinja`) and the paths (or a Hugging Face
/// `datasets.Dataset`) hold rows of conversations (`messages`, with `tools`, `documents`,
/// `chat_template_kwargs`), prompts and completions, or instruction records: each rendered
/// with the chat template as `transformers`' `apply_chat_template` renders it, tokenized, and
/// labelled (-100 where the loss does not count: `train_on` = `assistant`, `last` or `all`;
/// `train_on_eos`), cut to `seq_len` (`truncation` = `keep_start`, `keep_end`, `drop` or
/// `split` at turn boundaries), and
/// packed (`pad` by default: one conversation a row). `chat_date` pins `strftime_now`;
/// `add_generation_prompt` and `continue_final_message` render as `apply_chat_template` does.
/// `padding_free` (`pack="pad"`): a batch is its rows end to end, `[1, N]`, with
/// `position_ids`, `cu_seqlens` and `max_seqlen`, as `DataCollatorWithFlattening` gives them.
#[pyfunction]
#[pyo3(signature = (paths, format=None, *, seq_len=None, dtype=None, out_dtype=None,
                    columns=None, chunk_rows=None, stack=None, cache_bytes=None,
                    nulls="mask", fill_null=None, structs="flatten", decimals="float",
                    dictionaries="values", index="auto",
                    raw=false,
                    verify_checksums=true, pack=None, eos_id=None, pad_id=0, long="split",
                    pack_window=1024, pack_seed=0, pad_to_multiple_of=1, bucket=0,
                    tokenizer=None, text_field="text", add_special_tokens=true, chat=None,
                    chat_template=None, chat_template_name=None, chat_template_kwargs=None,
                    train_on="assistant", train_on_eos=true, truncation="keep_start",
                    chat_date=None, messages_field="messages", padding_free=false,
                    add_generation_prompt=false, continue_final_message=false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn dataset(
    py: Python<'_>,
    paths: &Bound<'_, PyAny>,
    format: Option<&str>,
    seq_len: Option<i64>,
    dtype: Option<&Bound<'_, PyAny>>,
    out_dtype: Option<&Bound<'_, PyAny>>,
    columns: Option<Vec<String>>,
    chunk_rows: Option<usize>,
    stack: Option<&Bound<'_, PyAny>>,
    cache_bytes: Option<usize>,
    nulls: &str,
    fill_null: Option<f64>,
    structs: &str,
    decimals: &str,
    dictionaries: &str,
    index: &str,
    raw: bool,
    verify_checksums: bool,
    pack: Option<&str>,
    eos_id: Option<u32>,
    pad_id: u32,
    long: &str,
    pack_window: usize,
    pack_seed: u64,
    pad_to_multiple_of: usize,
    bucket: u64,
    tokenizer: Option<PathBuf>,
    text_field: &str,
    add_special_tokens: bool,
    chat: Option<bool>,
    chat_template: Option<String>,
    chat_template_name: Option<String>,
    chat_template_kwargs: Option<&Bound<'_, PyAny>>,
    train_on: &str,
    train_on_eos: bool,
    truncation: &str,
    chat_date: Option<String>,
    messages_field: &str,
    padding_free: bool,
    add_generation_prompt: bool,
    continue_final_message: bool,
) -> PyResult<Source> {
    let chat = chat.unwrap_or(chat_template.is_some());
    let rows = if chat {
        let Some(path) = tokenizer.clone() else {
            return Err(errors::from_config(chute::ConfigError::new(
                "tokenizer",
                "chat=True needs a tokenizer (a folder as save_pretrained writes it)",
            )));
        };
        let config =
            |what: &str, why: String| errors::from_config(chute::ConfigError::new(what, why));
        let kwargs: Vec<(String, serde_json::Value)> = match chat_template_kwargs {
            None => Vec::new(),
            Some(d) => {
                let json = py.import("json")?.call_method1("dumps", (d,))?;
                let text: String = json.extract()?;
                match serde_json::from_str::<serde_json::Value>(&text) {
                    Ok(serde_json::Value::Object(m)) => m.into_iter().collect(),
                    _ => {
                        return Err(config(
                            "chat_template_kwargs",
                            "a dict of template variables".into(),
                        ));
                    }
                }
            }
        };
        let options = chute::ops::chat::ChatOptions {
            train_on: train_on.parse().map_err(|e| config("train_on", e))?,
            train_on_eos,
            max_length: Some(match seq_len {
                Some(n) => self::seq_len(n)?,
                None => chute::dataset::DEFAULT_SEQ_LEN,
            }),
            truncation: truncation.parse().map_err(|e| config("truncation", e))?,
            kwargs,
            template_name: chat_template_name,
            add_generation_prompt,
            continue_final_message,
        };
        let now = chute::ops::chat::chat_time(chat_date.as_deref())
            .map_err(|e| config("chat_date", e))?;
        let loaded = py
            .detach(|| chute::ops::chat::ChatTokenizer::load(&path, chat_template.as_deref(), now))
            .map_err(|e| config("tokenizer", e))?;
        let fields = chute::ops::chat::RowFields {
            messages: messages_field.to_string(),
            ..Default::default()
        };
        Some(Arc::new(chute::chat::ChatRows::new(
            Arc::new(loaded),
            options,
            fields,
            0,
        )) as Arc<dyn chute::core::RowEncoder>)
    } else {
        None
    };
    let tokenizer = if rows.is_some() { None } else { tokenizer };
    let tokenizer = match tokenizer {
        Some(path) => {
            let options = chute::ops::text::EncodeOptions {
                add_special_tokens,
                ..Default::default()
            };
            let t = py
                .detach(|| chute::tokenizer::Tokenizer::load(&path, options, 0))
                .map_err(errors::to_py)?;
            Some(Arc::new(t) as Arc<dyn chute::core::TextEncoder>)
        }
        None => None,
    };
    // Text needs packing: `concat` unless `pack` says; chat rows `pad`.
    let pack = pack
        .or(tokenizer.as_ref().map(|_| "concat"))
        .or(rows.as_ref().map(|_| "pad"));
    let format = match format {
        Some(f) => Some(f.parse::<Format>().map_err(errors::from_config)?),
        None => None,
    };
    let options = OpenOptions {
        format,
        seq_len: seq_len.map(self::seq_len).transpose()?,
        token_dtype: dtype
            .map(|d| crate::tensor::dtype("dtype", d))
            .transpose()?,
        out_dtype: match out_dtype {
            Some(d) => crate::tensor::dtype("out_dtype", d)?,
            None => DType::I64,
        },
        columns,
        chunk_rows,
        stack: self::stack(stack)?,
        cache_bytes,
        nulls: self::nulls(nulls)?,
        fill_null: Fill { number: fill_null },
        structs: self::structs(structs)?,
        decimals: self::decimals(decimals)?,
        dictionaries: self::dictionaries(dictionaries)?,
        index: index_mode(index)?,
        raw,
        verify_checksums,
        tokenizer,
        rows,
        text_field: Some(text_field.to_string()),
        pack: PackArgs {
            pack,
            eos_id,
            pad_id,
            long,
            window: pack_window,
            seed: pack_seed,
            pad_to_multiple_of,
            bucket,
            padding_free,
        }
        .options()?,
    };
    if options.rows.is_some()
        && !paths.is_instance_of::<PyString>()
        && !paths.hasattr("__fspath__")?
        && paths.hasattr("cache_files")?
    {
        // A Hugging Face dataset: its Arrow table, read in place.
        let table = py
            .import("chute._loader")?
            .call_method1("_hf_arrow", (paths,))?;
        if table.is_none() {
            return Err(errors::from_config(chute::ConfigError::new(
                "paths",
                "a datasets.Dataset with a Python transform (set_transform, with_transform) \
                 has no Arrow table to read rows from: pass the dataset without it",
            )));
        }
        let table: PyRef<'_, Source> = table.extract()?;
        let inner = Arc::clone(&table.inner);
        let name = table
            .inner
            .manifest()
            .shards
            .first()
            .map(|s| s.path.clone())
            .unwrap_or_default();
        let source = py
            .detach(|| chute::dataset::open_rows(&name, inner, &options))
            .map_err(errors::to_py)?;
        return Ok(Source {
            format: "text",
            inner: source,
            dataset: None,
            mixture: None,
            interrupt: None,
        });
    }
    open(py, paths, options)
}

fn seq_len(n: i64) -> PyResult<usize> {
    usize::try_from(n).map_err(|_| {
        errors::from_config(chute::ConfigError::new(
            "seq_len",
            format!("{n} tokens per sequence; pass at least 1"),
        ))
    })
}

/// WebDataset tar shards: what `chute.dataset` takes (paths or URLs: `http(s)://`, `s3://`,
/// `gs://`, `az://`, `file://`; brace patterns, globs, folders, manifests), read as
/// WebDataset whatever the extensions. Members sharing a key form a
/// sample; fields are named by extension (`jpg`, `cls`, ...) and hold bytes, with the key in
/// a `__key__` text field. `index`: use `<shard>.idx` from `chute index` when present
/// (`"auto"`), always (`"require"`) or never (`"scan"` the headers).
#[pyfunction]
#[pyo3(signature = (urls, *, index="auto"))]
pub(crate) fn webdataset(py: Python<'_>, urls: &Bound<'_, PyAny>, index: &str) -> PyResult<Source> {
    let options = OpenOptions {
        format: Some(Format::WebDataset),
        index: index_mode(index)?,
        ..Default::default()
    };
    open(py, urls, options)
}

/// TFRecord files of `tf.train.Example`s: what `chute.dataset` takes (paths or URLs, brace
/// patterns, globs, folders, manifests), read as TFRecord. Each feature
/// becomes a column: int64 and float lists as arrays (a one-value list as a scalar), a bytes
/// list of one value as bytes. `features` keeps only those (in that order); `raw=True` gives
/// each record's bytes as a `record` column instead. CRC32C checks are on unless
/// `verify_checksums=False`.
#[pyfunction]
#[pyo3(signature = (urls, *, features=None, raw=false, verify_checksums=true, index="auto"))]
pub(crate) fn tfrecord(
    py: Python<'_>,
    urls: &Bound<'_, PyAny>,
    features: Option<Vec<String>>,
    raw: bool,
    verify_checksums: bool,
    index: &str,
) -> PyResult<Source> {
    let options = OpenOptions {
        format: Some(Format::TfRecord),
        columns: features,
        raw,
        verify_checksums,
        index: index_mode(index)?,
        ..Default::default()
    };
    open(py, urls, options)
}

/// Parquet files: what `chute.dataset` takes (paths or URLs, downloaded whole when opened;
/// brace patterns, globs, folders, manifests), read as Parquet. `columns` projects (default: all);
/// numeric columns come out as `[B]`, fixed-size lists as `[B, k]`, binary and string columns
/// as lists. Row groups are split into shards of at most `chunk_rows` rows (default 16,384).
/// `stack={"x": ["f0", "f1", ...]}` stacks numeric columns of one dtype into one `[B, k]`
/// column `x` on the workers (a list or a brace pattern such as `"f{0..15}"`). Row groups are
/// decoded a piece (about 16 MiB) at a time and a piece leaves memory once read; `cache_bytes`
/// keeps the decoded data of files that fit in that many bytes for later epochs instead.
#[pyfunction]
#[pyo3(signature = (urls, *, columns=None, chunk_rows=None, stack=None, cache_bytes=None,
                    nulls="mask", fill_null=None, structs="flatten", decimals="float",
                    dictionaries="values"))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn parquet(
    py: Python<'_>,
    urls: &Bound<'_, PyAny>,
    columns: Option<Vec<String>>,
    chunk_rows: Option<usize>,
    stack: Option<&Bound<'_, PyAny>>,
    cache_bytes: Option<usize>,
    nulls: &str,
    fill_null: Option<f64>,
    structs: &str,
    decimals: &str,
    dictionaries: &str,
) -> PyResult<Source> {
    let options = OpenOptions {
        format: Some(Format::Parquet),
        columns,
        chunk_rows,
        cache_bytes,
        stack: self::stack(stack)?,
        nulls: self::nulls(nulls)?,
        fill_null: Fill { number: fill_null },
        structs: self::structs(structs)?,
        decimals: self::decimals(decimals)?,
        dictionaries: self::dictionaries(dictionaries)?,
        ..Default::default()
    };
    open(py, urls, options)
}

/// Arrow IPC files or streams (`.arrow`, `.arrows`, `.feather`: what pyarrow, Polars, Ray
/// and Hugging Face `datasets` write), what `chute.dataset` takes (paths or URLs, brace
/// patterns, globs, folders such as a `save_to_disk` folder, manifests), read as Arrow and
/// memory-mapped; or Arrow data in memory (anything with `__arrow_c_stream__`: a pyarrow
/// `Table`, a Polars `DataFrame`), read in place. `columns` projects (default: all); numbers
/// and bools come out as `[B]`, fixed-size lists as `[B, k]`, lists of numbers as one array
/// per sample (or padded, with the loader's `pad`), binary and string columns as lists.
/// Record batches are split into shards of at most `chunk_rows` rows (default 16,384).
/// `stack` as for `parquet`.
#[pyfunction]
#[pyo3(signature = (data, *, columns=None, chunk_rows=None, stack=None, nulls="mask",
                    fill_null=None, structs="flatten", decimals="float",
                    dictionaries="values"))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn arrow(
    py: Python<'_>,
    data: &Bound<'_, PyAny>,
    columns: Option<Vec<String>>,
    chunk_rows: Option<usize>,
    stack: Option<&Bound<'_, PyAny>>,
    nulls: &str,
    fill_null: Option<f64>,
    structs: &str,
    decimals: &str,
    dictionaries: &str,
) -> PyResult<Source> {
    if !data.hasattr("__arrow_c_stream__")? && data.hasattr("cache_files")? {
        // A Hugging Face dataset: its Arrow table read in place, its indices mapping applied.
        let source = py.import("chute._loader")?.call_method1(
            "_hf_arrow",
            (
                data,
                decimals,
                dictionaries,
                nulls,
                fill_null,
                structs,
                columns,
                chunk_rows,
                stack,
            ),
        )?;
        if source.is_none() {
            return Err(errors::from_config(chute::ConfigError::new(
                "data",
                "a datasets.Dataset with a Python transform (set_transform, with_transform) \
                 has no Arrow table to read: pass the dataset without it",
            )));
        }
        let source: PyRef<'_, Source> = source.extract()?;
        return Ok(Source {
            inner: Arc::clone(&source.inner),
            format: source.format,
            dataset: None,
            mixture: None,
            interrupt: None,
        });
    }
    if data.hasattr("__arrow_c_stream__")? {
        let name = data.get_type().name()?.to_string();
        return arrow_table(
            py,
            data,
            None,
            columns,
            chunk_rows,
            stack,
            &name,
            nulls,
            fill_null,
            structs,
            decimals,
            dictionaries,
        );
    }
    let options = OpenOptions {
        format: Some(Format::Arrow),
        columns,
        chunk_rows,
        stack: self::stack(stack)?,
        nulls: self::nulls(nulls)?,
        fill_null: Fill { number: fill_null },
        structs: self::structs(structs)?,
        decimals: self::decimals(decimals)?,
        dictionaries: self::dictionaries(dictionaries)?,
        ..Default::default()
    };
    open(py, data, options)
}

/// Arrow data in memory as a source, without a copy: `data` is anything with
/// `__arrow_c_stream__` (a pyarrow `Table` or `RecordBatchReader`, a Polars `DataFrame`, the
/// table behind a Hugging Face dataset, memory-mapped from its cache files). `indices`, the
/// little-endian `uint64` bytes of a row mapping (sample `i` is row `indices[i]`, a Hugging
/// Face dataset after `shuffle()` or `select()`), is applied when given. `columns` projects,
/// `chunk_rows` sizes shards (default 16,384), `stack` as for `parquet`, `name` names the
/// data in errors.
#[pyfunction]
#[pyo3(signature = (data, *, indices=None, columns=None, chunk_rows=None, stack=None,
                    name="arrow", nulls="mask", fill_null=None, structs="flatten",
                    decimals="float", dictionaries="values"))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn arrow_table(
    py: Python<'_>,
    data: &Bound<'_, PyAny>,
    indices: Option<&[u8]>,
    columns: Option<Vec<String>>,
    chunk_rows: Option<usize>,
    stack: Option<&Bound<'_, PyAny>>,
    name: &str,
    nulls: &str,
    fill_null: Option<f64>,
    structs: &str,
    decimals: &str,
    dictionaries: &str,
) -> PyResult<Source> {
    let capsule = data.call_method0("__arrow_c_stream__")?;
    let capsule = capsule.cast::<PyCapsule>()?;
    let stream = capsule.pointer_checked(Some(c"arrow_array_stream"))?;
    let indices = indices.map(|b| {
        b.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect::<Vec<u64>>()
    });
    let options = ArrowOptions {
        columns,
        chunk_rows,
        stack: self::stack(stack)?,
        nulls: self::nulls(nulls)?,
        fill_null: Fill { number: fill_null },
        structs: self::structs(structs)?,
        decimals: self::decimals(decimals)?,
        dictionaries: self::dictionaries(dictionaries)?,
    };
    let stream = stream.as_ptr() as usize;
    let inner = py
        .detach(|| {
            // SAFETY: the capsule holds an unreleased `ArrowArrayStream` (its name says so);
            // the source takes it over, leaving it released for the capsule's destructor.
            unsafe {
                ArrowSource::from_c_stream(stream as *mut std::ffi::c_void, indices, name, options)
            }
        })
        .map_err(errors::to_py)?;
    Ok(Source {
        inner: Arc::new(inner),
        format: Format::Arrow.name(),
        dataset: None,
        mixture: None,
        interrupt: None,
    })
}

/// A `nulls` argument: `"mask"`, `"fill"` or `"raise"`.
fn nulls(s: &str) -> PyResult<chute::formats::Nulls> {
    chute::formats::Nulls::parse(s)
        .map_err(|why| errors::from_config(chute::ConfigError::new("nulls", why)))
}

/// A `dictionaries` argument: `"values"` or `"codes"`.
fn dictionaries(s: &str) -> PyResult<chute::formats::Dictionaries> {
    chute::formats::Dictionaries::parse(s)
        .map_err(|why| errors::from_config(chute::ConfigError::new("dictionaries", why)))
}

/// A `decimals` argument: `"float"` or `"exact"`.
fn decimals(s: &str) -> PyResult<chute::formats::Decimals> {
    chute::formats::Decimals::parse(s)
        .map_err(|why| errors::from_config(chute::ConfigError::new("decimals", why)))
}

/// A `structs` argument: `"flatten"` or `"record"`.
fn structs(s: &str) -> PyResult<chute::formats::Structs> {
    chute::formats::Structs::parse(s)
        .map_err(|why| errors::from_config(chute::ConfigError::new("structs", why)))
}

/// A `stack` argument: `{name: columns}`, the columns a list of names or one string of
/// comma-separated names and brace patterns (`"f{0..15}"`).
fn stack(obj: Option<&Bound<'_, PyAny>>) -> PyResult<chute::formats::Stack> {
    let Some(obj) = obj else {
        return Ok(Vec::new());
    };
    let dict = obj.cast::<pyo3::types::PyDict>().map_err(|_| {
        errors::from_config(chute::ConfigError::new(
            "stack",
            "pass a dict {name: [columns]} (for example {\"x\": [\"f0\", \"f1\"]})",
        ))
    })?;
    let mut out = Vec::with_capacity(dict.len());
    for (name, members) in dict.iter() {
        let name: String = name.extract()?;
        let members = match members.extract::<String>() {
            Ok(spec) => {
                chute::formats::parse_stack(&format!("{name}={spec}"))
                    .map_err(errors::from_config)?
                    .1
            }
            Err(_) => members.extract::<Vec<String>>()?,
        };
        out.push((name, members));
    }
    Ok(out)
}

/// Token files (nanoGPT's `.bin`: flat little-endian `uint16` or `uint32` ids, no header),
/// one shard per file, or Megatron indexed datasets (`.bin` + `.idx`, named by their prefix):
/// what `chute.dataset` takes (URLs are downloaded whole when opened). `dtype` (token files)
/// defaults to the manifest's, else uint16; batches hold `out_dtype` (int64).
///
/// Without documents, sample `i` of a file is the window of `seq_len + 1` tokens starting at
/// token `i * (seq_len + 1)`, and batches have one column, `tokens`. With documents (a
/// Megatron dataset; token files with `eos_id`, the id ending each document; `documents`
/// forces `"megatron"` or `"eos"`), they are packed (`pack`): `"concat"` (default: windows of
/// `seq_len + 1` tokens across documents, reshuffled every epoch), `"document"` (the same plus
/// `position_ids`, `segment_ids` and `cu_seqlens`), or `"best_fit"` (whole documents in rows
/// of `seq_len`, padded with `pad_id`, with `loss_mask`; documents longer than `seq_len` are
/// split or dropped, `long`; packed best-fit decreasing in windows of `pack_window`
/// documents ordered by `pack_seed`), or `"pad"` (one document per row, cut to `seq_len`,
/// padded with `pad_id` to the batch's longest rounded up to `pad_to_multiple_of`, with
/// `tokens_mask`; `bucket` rows of the epoch's order at a time sorted by length so batches
/// hold documents of similar lengths). For Megatron datasets `eos_id` is appended after
/// every document.
#[pyfunction]
#[pyo3(signature = (paths, seq_len, dtype=None, out_dtype=None, *, documents=None,
                    eos_id=None, pack=None, pad_id=0, long="split", pack_window=1024,
                    pack_seed=0, pad_to_multiple_of=1, bucket=0),
       text_signature = "(paths, seq_len, dtype=None, out_dtype='int64', *, documents=None, \
                         eos_id=None, pack=None, pad_id=0, long='split', pack_window=1024, \
                         pack_seed=0, pad_to_multiple_of=1, bucket=0)")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn tokens(
    py: Python<'_>,
    paths: &Bound<'_, PyAny>,
    seq_len: i64,
    dtype: Option<&Bound<'_, PyAny>>,
    out_dtype: Option<&Bound<'_, PyAny>>,
    documents: Option<&str>,
    eos_id: Option<u32>,
    pack: Option<&str>,
    pad_id: u32,
    long: &str,
    pack_window: usize,
    pack_seed: u64,
    pad_to_multiple_of: usize,
    bucket: u64,
) -> PyResult<Source> {
    let format = match documents {
        None => None,
        Some("megatron") => Some(Format::Megatron),
        Some("eos") => {
            if eos_id.is_none() {
                return Err(errors::from_config(chute::ConfigError::new(
                    "eos_id",
                    "documents=\"eos\" splits token files at an end-of-sequence id: pass eos_id",
                )));
            }
            Some(Format::Tokens)
        }
        Some(other) => {
            return Err(errors::from_config(chute::ConfigError::new(
                "documents",
                format!("{other:?}: pass \"megatron\" or \"eos\" (or leave it to the files)"),
            )));
        }
    };
    let files = self::paths(paths)?;
    let format = match format {
        Some(f) => f,
        None => {
            py.detach(|| Dataset::resolve_token_files(&files))
                .map_err(errors::to_py)?
                .format
        }
    };
    let options = OpenOptions {
        format: Some(format),
        seq_len: Some(self::seq_len(seq_len)?),
        token_dtype: dtype
            .map(|d| crate::tensor::dtype("dtype", d))
            .transpose()?,
        out_dtype: match out_dtype {
            Some(d) => crate::tensor::dtype("out_dtype", d)?,
            None => DType::I64,
        },
        pack: PackArgs {
            pack,
            eos_id,
            pad_id,
            long,
            window: pack_window,
            seed: pack_seed,
            pad_to_multiple_of,
            bucket,
            padding_free: false,
        }
        .options()?,
        ..Default::default()
    };
    open(py, paths, options)
}

/// The packing arguments of `dataset` and `tokens`.
struct PackArgs<'a> {
    pack: Option<&'a str>,
    eos_id: Option<u32>,
    pad_id: u32,
    long: &'a str,
    window: usize,
    seed: u64,
    pad_to_multiple_of: usize,
    bucket: u64,
    padding_free: bool,
}

impl PackArgs<'_> {
    /// The packing options, when `pack` or `eos_id` asks for documents.
    fn options(self) -> PyResult<Option<PackOptions>> {
        if self.pack.is_none() && self.eos_id.is_none() {
            return Ok(None);
        }
        Ok(Some(PackOptions {
            pack: self
                .pack
                .map(str::parse::<Pack>)
                .transpose()
                .map_err(errors::from_config)?
                .unwrap_or_default(),
            eos_id: self.eos_id,
            pad_id: self.pad_id,
            long: self.long.parse::<Long>().map_err(errors::from_config)?,
            window: self.window,
            seed: self.seed,
            pad_to_multiple_of: self.pad_to_multiple_of,
            bucket: self.bucket,
            padding_free: self.padding_free,
            ..Default::default()
        }))
    }
}

/// `chute._chute.map_dataset(dataset, worker_init_fn=None, num_workers=0, collate_fn=None)`:
/// a map-style dataset as a source (what `chute.Loader` calls for anything that is not a
/// chute source).
#[pyfunction]
#[pyo3(signature = (dataset, worker_init_fn=None, num_workers=0, collate_fn=None))]
pub(crate) fn map_dataset(
    dataset: &Bound<'_, PyAny>,
    worker_init_fn: Option<Py<PyAny>>,
    num_workers: usize,
    collate_fn: Option<Py<PyAny>>,
) -> PyResult<Source> {
    // DataLoader calls worker_init_fn in worker processes only: never with num_workers=0.
    let worker_init = worker_init_fn
        .filter(|_| num_workers > 0)
        .map(|f| (f, num_workers));
    let inner = Arc::new(MapDataset::new(dataset, worker_init, collate_fn)?);
    Ok(Source::from_dataset(inner))
}
