//! [`Format`]: the formats chute reads, their names and the file names that mean them.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use chute_core::ConfigError;

/// The formats chute reads. The name ([`Format::name`], `Display`, `FromStr`) is the one
/// manifests record and the CLI and Python take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// Flat little-endian token ids (nanoGPT's `.bin`).
    Tokens,
    /// WebDataset tar shards (`.tar`): files sharing a key form a sample.
    WebDataset,
    /// TFRecord files (`.tfrecord`, `.tfrecords`, `.tfrec`, optionally `.gz`).
    TfRecord,
    /// Apache Parquet (`.parquet`, `.pq`).
    Parquet,
    /// Apache Arrow IPC files and streams (`.arrow`, `.arrows`, `.feather`, `.ipc`), such as
    /// a Hugging Face `save_to_disk` folder's.
    Arrow,
    /// Megatron-Core indexed datasets: `<prefix>.bin` with its `<prefix>.idx` (named by the
    /// prefix, either file, or a folder). A `.bin` whose `.idx` is a Megatron index is one.
    Megatron,
    /// JSON Lines records (`.jsonl`, `.ndjson`, optionally `.gz` or `.zst`; a `.json` file of
    /// JSON Lines or of one array of records when the format is named).
    Json,
}

impl Format {
    /// Every format, in the order they are listed in messages.
    pub const ALL: [Format; 7] = [
        Format::Tokens,
        Format::WebDataset,
        Format::TfRecord,
        Format::Parquet,
        Format::Arrow,
        Format::Megatron,
        Format::Json,
    ];

    /// The format's name: `tokens`, `webdataset`, `tfrecord`, `parquet`, `arrow` or
    /// `megatron`.
    pub const fn name(self) -> &'static str {
        match self {
            Format::Tokens => "tokens",
            Format::WebDataset => "webdataset",
            Format::TfRecord => "tfrecord",
            Format::Parquet => "parquet",
            Format::Arrow => "arrow",
            Format::Megatron => "megatron",
            Format::Json => "json",
        }
    }

    /// The file extensions that mean this format (a trailing `.gz` is looked through for
    /// TFRecord).
    pub fn extensions(self) -> &'static [&'static str] {
        match self {
            Format::Tokens => &["bin"],
            Format::WebDataset => &["tar"],
            Format::TfRecord => &["tfrecord", "tfrecords", "tfrec"],
            Format::Parquet => &["parquet", "pq"],
            Format::Arrow => &["arrow", "arrows", "feather", "ipc"],
            // `.bin`, told from token files by its index ([`is_megatron_bin`]).
            Format::Megatron => &[],
            Format::Json => &["jsonl", "ndjson"],
        }
    }

    /// The format a file name's extension implies, if any: `train-000.tar` is WebDataset,
    /// `x.tfrecord.gz` TFRecord, `https://host/x.parquet?sig=...` Parquet.
    pub fn from_path(path: &Path) -> Option<Format> {
        let text = path.to_str()?;
        // A URL's query or fragment is not part of the object's name.
        let name = match text.split_once("://") {
            Some((_, rest)) => rest.split(['?', '#']).next()?.rsplit('/').next()?,
            None => path.file_name()?.to_str()?,
        };
        let zst = name.strip_suffix(".zst");
        let gz = name.strip_suffix(".gz");
        let base = gz.or(zst).unwrap_or(name);
        // TensorFlow Datasets numbers shards after the extension:
        // `mnist-train.tfrecord-00000-of-00004`.
        if base.contains(".tfrecord-") || base.contains(".tfrecords-") {
            return Some(Format::TfRecord);
        }
        let ext = base.rsplit_once('.')?.1;
        if name.ends_with(".tgz") || (gz.is_some() && ext == "tar") {
            return Some(Format::WebDataset);
        }
        Format::ALL
            .into_iter()
            .filter(|f| match (gz, zst) {
                (None, None) => true,
                (Some(_), _) => matches!(f, Format::TfRecord | Format::Json),
                (_, Some(_)) => *f == Format::Json,
            })
            .find(|f| f.extensions().contains(&ext))
    }

    /// Every format's name, comma-separated (for messages).
    pub fn names() -> String {
        let names: Vec<&str> = Format::ALL.iter().map(|f| f.name()).collect();
        names.join(", ")
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Format {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Format, ConfigError> {
        Format::ALL
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                ConfigError::new(
                    "format",
                    format!("{s:?} is not a format chute reads; use {}", Format::names()),
                )
            })
    }
}

/// True when `path` is a local `.bin` whose `.idx` beside it is a Megatron index.
pub fn is_megatron_bin(path: &Path) -> bool {
    use std::io::Read;
    if path.extension().is_none_or(|e| e != "bin") {
        return false;
    }
    let (idx, _) = crate::megatron::paths_of(path);
    let mut head = [0u8; 9];
    std::fs::File::open(idx)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| crate::megatron::is_index(&head))
}

/// The format of a shard file by its name, and by its index for a Megatron `.bin`.
pub fn format_of(path: &Path) -> Option<Format> {
    match Format::from_path(path) {
        Some(Format::Tokens) if is_megatron_bin(path) => Some(Format::Megatron),
        f => f,
    }
}
