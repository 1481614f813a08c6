//! Mixture files: a [`Mixture`] described in JSON, its components opened by the opener it is
//! handed ([`crate::open`] when the opener reads the file).
//!
//! ```json
//! {
//!   "components": [
//!     {"name": "web",  "paths": ["web/*.bin"], "seq_len": 1024},
//!     {"name": "code", "paths": ["code/"], "shuffle": "block", "seed": 7},
//!     {"name": "more", "mixture": "other.mix.json"}
//!   ],
//!   "weights": {"web": 0.7, "code": 0.2, "more": 0.1},
//!   "mode": "stratified", "policy": "stop_on_all"
//! }
//! ```
//!
//! - `components`: a list of objects with a `name` (the order is the components' order), or
//!   an object of name -> component (ordered by name). A component has `paths` (or `path`:
//!   files, URLs, patterns, folders, a manifest, as the command line takes them) and the
//!   opener's options `format`, `seq_len`, `token_dtype`, `out_dtype`, `columns`,
//!   `chunk_rows`, `index`, `raw`, `verify_checksums`; or `mixture`, another mixture file or
//!   an inline mixture object. Also `shuffle` (default `global`) and `seed`.
//! - `weights`: name -> weight, or a schedule `{"0": {...}, "100000": {...}}` keyed by global
//!   sample position; `ramp` (default false) moves linearly between points. Default: equal.
//! - `mode` (`stratified`, `random`), `policy` (`stop_on_first`, `stop_on_all`, `cycle`),
//!   `samples_per_epoch`, `seed`, `source_column`: as [`super::MixtureBuilder`] takes them.
//!
//! Relative paths are relative to the file's folder.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use chute_core::{ConfigError, DType, Error, Shuffle, Source};
use chute_formats::IndexMode;
use serde_json::{Map, Value};

use super::{Component, MixMode, Mixture, Policy};
use crate::options::OpenOptions;

/// Whether `path` is a mixture file: a `.json` file holding an object with `components`.
pub fn is_mixture_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "json")
        && std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() <= MAX_FILE)
        && std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .is_some_and(|v| v.get("components").is_some())
}

/// Opens the mixture file at `path` (see the module documentation), its components opened by
/// `open`.
pub fn open_mixture_file(path: &Path, open: Opener<'_>) -> Result<Mixture, Error> {
    open_mixture_file_at(path, 0, open)
}

/// How a mixture file's components are opened: their paths and options to a source.
pub type Opener<'a> = &'a dyn Fn(&[PathBuf], &OpenOptions) -> Result<Arc<dyn Source>, Error>;

/// A mixture from the JSON text of a mixture file, its components opened by `open`; `origin`
/// names it in errors and `base` is the folder its relative paths start from. (What
/// [`open_mixture_file`] does after reading the file; the fuzz target's way in.)
pub fn mixture_from_json(
    text: &[u8],
    origin: &str,
    base: &Path,
    open: Opener<'_>,
) -> Result<Mixture, Error> {
    let value: Value = serde_json::from_slice(text)
        .map_err(|e| Error::corrupt(origin, e.column() as u64, format!("not JSON: {e}")))?;
    mixture(&value, base, origin, 0, open)
}

/// Largest mixture file read (a mixture file is a few lines; this keeps a path to a device
/// or a huge file from being read whole).
const MAX_FILE: u64 = 16 << 20;

fn bad(origin: &str, what: impl Into<String>) -> Error {
    ConfigError::new(format!("mixture file {origin}"), what).into()
}

fn mixture(
    v: &Value,
    base: &Path,
    origin: &str,
    depth: usize,
    open: Opener<'_>,
) -> Result<Mixture, Error> {
    if depth > 16 {
        return Err(bad(
            origin,
            "mixtures nested more than 16 deep (a file including itself?)",
        ));
    }
    let obj = v
        .as_object()
        .ok_or_else(|| bad(origin, "a mixture is a JSON object with \"components\""))?;
    let known = [
        "components",
        "weights",
        "ramp",
        "mode",
        "policy",
        "samples_per_epoch",
        "seed",
        "source_column",
    ];
    if let Some(k) = obj.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(bad(
            origin,
            format!("unknown key {k:?}; the keys are {known:?}"),
        ));
    }
    let list: Vec<(String, &Map<String, Value>)> = match obj.get("components") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|c| {
                let c = c
                    .as_object()
                    .ok_or_else(|| bad(origin, "a component is an object"))?;
                let name = c
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(origin, "a component in a list needs a \"name\""))?;
                Ok((name.to_string(), c))
            })
            .collect::<Result<_, Error>>()?,
        Some(Value::Object(map)) => map
            .iter()
            .map(|(name, c)| {
                let c = c
                    .as_object()
                    .ok_or_else(|| bad(origin, format!("component {name:?} is not an object")))?;
                Ok((name.clone(), c))
            })
            .collect::<Result<_, Error>>()?,
        _ => {
            return Err(bad(
                origin,
                "\"components\" is a list or an object of components",
            ));
        }
    };
    let names: Vec<&str> = list.iter().map(|(n, _)| n.as_str()).collect();
    let mut components = Vec::with_capacity(list.len());
    for (name, c) in &list {
        components.push(component(name, c, base, origin, depth, open)?);
    }
    let schedule = schedule(obj.get("weights"), &names, origin)?;
    let mut b = Mixture::builder(components)
        .schedule(schedule, flag(obj, "ramp", origin)?.unwrap_or(false));
    if let Some(m) = string(obj, "mode", origin)? {
        b = b.mode(m.parse::<MixMode>()?);
    }
    if let Some(p) = string(obj, "policy", origin)? {
        b = b.policy(p.parse::<Policy>()?);
    }
    if let Some(n) = integer(obj, "samples_per_epoch", origin)? {
        b = b.samples_per_epoch(n);
    }
    if let Some(s) = integer(obj, "seed", origin)? {
        b = b.seed(s);
    }
    if let Some(c) = string(obj, "source_column", origin)? {
        b = b.source_column(c);
    }
    Ok(b.build()?)
}

fn component(
    name: &str,
    c: &Map<String, Value>,
    base: &Path,
    origin: &str,
    depth: usize,
    open: Opener<'_>,
) -> Result<Component, Error> {
    let here = format!("{origin}, component {name:?}");
    let known = [
        "name",
        "path",
        "paths",
        "mixture",
        "shuffle",
        "seed",
        "format",
        "seq_len",
        "token_dtype",
        "out_dtype",
        "columns",
        "chunk_rows",
        "index",
        "raw",
        "verify_checksums",
    ];
    if let Some(k) = c.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(bad(
            &here,
            format!("unknown key {k:?}; the keys are {known:?}"),
        ));
    }
    let mut comp = match c.get("mixture") {
        Some(Value::String(file)) => {
            let path = relative(base, file);
            let inner = open_mixture_file_at(&path, depth + 1, open)?;
            Component::mixture(name, Arc::new(inner))
        }
        Some(inline @ Value::Object(_)) => Component::mixture(
            name,
            Arc::new(mixture(inline, base, &here, depth + 1, open)?),
        ),
        Some(_) => return Err(bad(&here, "\"mixture\" is a file name or a mixture object")),
        None => {
            let paths: Vec<PathBuf> = match (c.get("paths"), c.get("path")) {
                (Some(Value::Array(items)), None) => items
                    .iter()
                    .map(|p| {
                        p.as_str()
                            .map(|s| relative(base, s))
                            .ok_or_else(|| bad(&here, "\"paths\" is a list of strings"))
                    })
                    .collect::<Result<_, Error>>()?,
                (None, Some(Value::String(p))) => vec![relative(base, p)],
                _ => {
                    return Err(bad(
                        &here,
                        "give the data as \"paths\" (a list) or \"path\", or a \"mixture\"",
                    ));
                }
            };
            let options = open_options(c, &here)?;
            Component::new(name, open(&paths, &options)?)
        }
    };
    if let Some(s) = string(c, "shuffle", &here)? {
        comp = comp.shuffle(s.parse::<Shuffle>()?);
    }
    if let Some(s) = integer(c, "seed", &here)? {
        comp = comp.seed(s);
    }
    Ok(comp)
}

fn open_mixture_file_at(path: &Path, depth: usize, open: Opener<'_>) -> Result<Mixture, Error> {
    let origin = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| Error::io(&origin, e))?;
    if !meta.is_file() || meta.len() > MAX_FILE {
        return Err(bad(
            &origin,
            format!("a mixture file is a regular file of at most {MAX_FILE} bytes"),
        ));
    }
    let text = std::fs::read(path).map_err(|e| Error::io(&origin, e))?;
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let value: Value = serde_json::from_slice(&text)
        .map_err(|e| Error::corrupt(&origin, e.column() as u64, format!("not JSON: {e}")))?;
    mixture(&value, &base, &origin, depth, open)
}

/// A path relative to the mixture file's folder (URLs and absolute paths as they are).
fn relative(base: &Path, p: &str) -> PathBuf {
    if p.contains("://") || Path::new(p).is_absolute() {
        PathBuf::from(p)
    } else {
        base.join(p)
    }
}

fn open_options(c: &Map<String, Value>, here: &str) -> Result<OpenOptions, Error> {
    let dtype = |key: &str| -> Result<Option<DType>, Error> {
        string(c, key, here)?
            .map(|s| {
                s.parse::<DType>()
                    .map_err(|e| bad(here, format!("{key}: {}", e.reason)))
            })
            .transpose()
    };
    let mut o = OpenOptions::default();
    if let Some(f) = string(c, "format", here)? {
        o.format = Some(f.parse()?);
    }
    o.seq_len = integer(c, "seq_len", here)?.map(|n| n as usize);
    o.token_dtype = dtype("token_dtype")?;
    if let Some(d) = dtype("out_dtype")? {
        o.out_dtype = d;
    }
    o.columns = match c.get("columns") {
        None => None,
        Some(Value::Array(items)) => Some(
            items
                .iter()
                .map(|x| {
                    x.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| bad(here, "\"columns\" is a list of strings"))
                })
                .collect::<Result<_, Error>>()?,
        ),
        Some(_) => return Err(bad(here, "\"columns\" is a list of strings")),
    };
    o.chunk_rows = integer(c, "chunk_rows", here)?.map(|n| n as usize);
    if let Some(i) = string(c, "index", here)? {
        o.index = i.parse::<IndexMode>()?;
    }
    o.raw = flag(c, "raw", here)?.unwrap_or(false);
    o.verify_checksums = flag(c, "verify_checksums", here)?.unwrap_or(true);
    Ok(o)
}

fn schedule(
    w: Option<&Value>,
    names: &[&str],
    origin: &str,
) -> Result<Vec<(u64, Vec<f64>)>, Error> {
    let one = |v: &Value, at: u64| -> Result<Vec<f64>, Error> {
        match v {
            Value::Object(m) => {
                if let Some(k) = m.keys().find(|k| !names.contains(&k.as_str())) {
                    return Err(bad(origin, format!("weights: no component named {k:?}")));
                }
                names
                    .iter()
                    .map(|n| {
                        m.get(*n).and_then(Value::as_f64).ok_or_else(|| {
                            bad(
                                origin,
                                format!("weights at {at}: no number for {n:?} (give 0)"),
                            )
                        })
                    })
                    .collect()
            }
            Value::Array(xs) if xs.len() == names.len() => xs
                .iter()
                .map(|x| x.as_f64().ok_or_else(|| bad(origin, "weights are numbers")))
                .collect(),
            _ => Err(bad(
                origin,
                format!("weights at {at}: an object of name -> weight"),
            )),
        }
    };
    match w {
        None => Ok(vec![(0, vec![1.0; names.len()])]),
        Some(Value::Object(m)) if !m.is_empty() && m.keys().all(|k| k.parse::<u64>().is_ok()) => m
            .iter()
            .map(|(k, v)| {
                let at: u64 = k.parse().expect("checked");
                Ok((at, one(v, at)?))
            })
            .collect(),
        Some(v) => Ok(vec![(0, one(v, 0)?)]),
    }
}

fn string<'a>(o: &'a Map<String, Value>, key: &str, here: &str) -> Result<Option<&'a str>, Error> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(bad(here, format!("{key:?} is a string"))),
    }
}

fn integer(o: &Map<String, Value>, key: &str, here: &str) -> Result<Option<u64>, Error> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| bad(here, format!("{key:?} is a non-negative integer"))),
    }
}

fn flag(o: &Map<String, Value>, key: &str, here: &str) -> Result<Option<bool>, Error> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(bad(here, format!("{key:?} is true or false"))),
    }
}
