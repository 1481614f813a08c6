//! `chute inspect`, `chute verify` and `chute cat`: look at shards without writing code.

use std::sync::Arc;

use anyhow::Context;
use chute::core::redact::redact;
use chute::core::{Error, Field, Plan, PlanConfig, Sample, Source};
use chute::dataset::Mixture;
use clap::Args;
use serde_json::{Value, json};

use crate::dataset_args::DatasetArgs;

/// `chute inspect` arguments.
#[derive(Debug, Clone, Args)]
pub(crate) struct InspectArgs {
    #[command(flatten)]
    dataset: DatasetArgs,
    /// Records to show.
    #[arg(short = 'n', long, default_value_t = 3)]
    records: u64,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// `chute verify` arguments.
#[derive(Debug, Clone, Args)]
pub(crate) struct VerifyArgs {
    #[command(flatten)]
    dataset: DatasetArgs,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// `chute cat` arguments.
#[derive(Debug, Clone, Args)]
pub(crate) struct CatArgs {
    #[command(flatten)]
    dataset: DatasetArgs,
    /// Records to print (default: all).
    #[arg(short = 'n', long)]
    records: Option<u64>,
    /// First record (global sample id).
    #[arg(long, default_value_t = 0)]
    skip: u64,
    /// A `tokenizer.json`: token fields (`tokens`, `input_ids`) are decoded back to text too
    /// (a `<name>_text` field). (`--tokenizer` opens text as a source, tokenized.)
    #[arg(long, value_name = "TOKENIZER_JSON")]
    decode: Option<std::path::PathBuf>,
}

/// A nested value as JSON: records as objects, maps as lists of `[key, value]`, bytes as
/// their length.
fn nested_json(v: &chute::Value) -> Value {
    use chute::Value as V;
    match v {
        V::Bool(b) => json!(b),
        V::Int(i) => json!(i),
        V::UInt(u) => json!(u),
        V::Float(f) => json!(f),
        V::Text(b) => Value::String(String::from_utf8_lossy(b).into_owned()),
        V::Bytes(b) => json!({ "bytes": b.len() }),
        V::List(items) => Value::Array(items.iter().map(nested_json).collect()),
        V::Record(keys, values) => Value::Object(
            keys.iter()
                .zip(values)
                .map(|(k, x)| (k.to_string(), nested_json(x)))
                .collect(),
        ),
        V::Map(entries) => Value::Array(
            entries
                .iter()
                .map(|(k, x)| json!([nested_json(k), nested_json(x)]))
                .collect(),
        ),
        V::Array(a) => array_json(a),
        _ => Value::Null,
    }
}

/// An array as JSON: in full when small (16 values at most, 0 or 1 dimensions), else its
/// dtype, shape and first values.
fn array_json(a: &chute::core::Array) -> Value {
    let numel: usize = a.shape.iter().product();
    let values = array_values(a, numel.min(16));
    match (numel <= 16, a.shape.len()) {
        (true, 0) => values.first().cloned().unwrap_or(Value::Null),
        (true, 1) => Value::Array(values),
        _ => json!({ "dtype": a.dtype.name(), "shape": a.shape, "first": values }),
    }
}

/// A sample as JSON: small arrays in full, bytes as their length and first bytes in hex.
pub(crate) fn sample_json(s: &Sample) -> Value {
    let mut fields = serde_json::Map::new();
    for (name, f) in &s.fields {
        let v = match f {
            Field::Text(b) => Value::String(String::from_utf8_lossy(b).into_owned()),
            Field::Bytes(b) => {
                let head: String = b.iter().take(16).map(|x| format!("{x:02x}")).collect();
                let mut v = json!({ "bytes": b.len(), "head": head });
                if let Some(audio) = audio_json(b) {
                    v["audio"] = audio;
                }
                if let Some(video) = video_json(b) {
                    v["video"] = video;
                }
                v
            }
            Field::Array(a) => array_json(a),
            Field::Value(v) => nested_json(v),
            _ => Value::Null,
        };
        fields.insert(name.to_string(), v);
    }
    json!({ "index": s.index, "key": s.key, "fields": fields })
}

/// What an audio file's headers say (container, codec, rate, channels, seconds), if the bytes
/// are audio chute decodes.
#[cfg(feature = "audio")]
fn audio_json(b: &bytes::Bytes) -> Option<Value> {
    let info = chute::ops::audio::probe(b).ok()?;
    Some(json!({
        "container": info.container,
        "codec": info.codec,
        "sample_rate": info.rate,
        "channels": info.channels,
        "seconds": info.seconds(),
    }))
}

#[cfg(not(feature = "audio"))]
fn audio_json(_: &bytes::Bytes) -> Option<Value> {
    None
}

/// What a video's headers and packets say (container, codec, size, fps, frames, seconds), if
/// the bytes are a video chute decodes (still images, which FFmpeg also opens, are not).
#[cfg(feature = "video")]
fn video_json(b: &bytes::Bytes) -> Option<Value> {
    let info = chute::ops::video::probe(b).ok()?;
    if info.container == "image2" || info.container.ends_with("_pipe") {
        return None;
    }
    Some(json!({
        "container": info.container,
        "codec": info.codec,
        "width": info.width,
        "height": info.height,
        "fps": info.fps,
        "frames": info.frames,
        "seconds": info.duration,
    }))
}

#[cfg(not(feature = "video"))]
fn video_json(_: &bytes::Bytes) -> Option<Value> {
    None
}

fn array_values(a: &chute::core::Array, n: usize) -> Vec<Value> {
    use chute::DType::*;
    let size = a.dtype.size();
    (0..n)
        .map(|i| {
            let b = &a.data[i * size..(i + 1) * size];
            match a.dtype {
                Bool | U8 => json!(b[0]),
                I8 => json!(b[0] as i8),
                U16 => json!(u16::from_le_bytes([b[0], b[1]])),
                I16 => json!(i16::from_le_bytes([b[0], b[1]])),
                U32 => json!(u32::from_le_bytes(b.try_into().unwrap())),
                I32 => json!(i32::from_le_bytes(b.try_into().unwrap())),
                U64 => json!(u64::from_le_bytes(b.try_into().unwrap())),
                I64 => json!(i64::from_le_bytes(b.try_into().unwrap())),
                F32 => json!(f32::from_le_bytes(b.try_into().unwrap())),
                F64 => json!(f64::from_le_bytes(b.try_into().unwrap())),
                _ => json!(format!(
                    "0x{}",
                    b.iter()
                        .rev()
                        .map(|x| format!("{x:02x}"))
                        .collect::<String>()
                )),
            }
        })
        .collect()
}

pub(crate) fn inspect(args: InspectArgs) -> anyhow::Result<()> {
    let opened = args.dataset.opened()?;
    if let Some(m) = opened.mixture() {
        return inspect_mixture(m, args.json);
    }
    let source = Arc::clone(&opened.source);
    let m = source.manifest();
    let n = m.total_samples();
    let mut records = Vec::new();
    for id in 0..n.min(args.records) {
        records.push(sample_json(
            &source
                .read(id)
                .with_context(|| format!("reading sample {id}"))?,
        ));
    }
    let fields: Vec<String> = match n {
        0 => Vec::new(),
        _ => source
            .read(0)?
            .fields
            .iter()
            .map(|(name, f)| format!("{name}: {}", kind(f)))
            .collect(),
    };
    let documents = documents_report(opened.dataset(), &args.dataset)?;
    // The source types a field's dtype does not say (a timestamp's unit and zone, ...).
    let types: serde_json::Map<String, serde_json::Value> = source
        .column_types()
        .into_iter()
        .map(|c| {
            let mut v = json!(c);
            if let Some(values) = &c.dictionary {
                // A dictionary column read as codes: code i stands for value i.
                v["dictionary"] = values.iter().map(nested_json).collect();
            }
            (c.name.clone(), v)
        })
        .collect();
    let report = json!({
        "format": opened.kind_name(),
        "documents": documents,
        "shards": m.shards.len(),
        "samples": n,
        "bytes": m.total_bytes(),
        "fields": fields,
        "types": types,
        "params": m.params,
        "fingerprint": m.fingerprint(),
        "first": records,
    });
    if args.json {
        println!("{}", redact(&serde_json::to_string_pretty(&report)?));
    } else {
        println!(
            "format:      {}",
            report["format"].as_str().unwrap_or_default()
        );
        println!("shards:      {}", m.shards.len());
        println!("samples:     {n}");
        println!("bytes:       {}", m.total_bytes());
        println!("fields:      {}", fields.join(", "));
        if !types.is_empty() {
            let types: Vec<String> = source
                .column_types()
                .into_iter()
                .map(|c| match (c.numpy, &c.dictionary) {
                    (Some(numpy), _) => format!("{}: {} (numpy {numpy})", c.name, c.source),
                    (None, Some(values)) => {
                        format!("{}: {} of {} values", c.name, c.source, values.len())
                    }
                    (None, None) => format!("{}: {}", c.name, c.source),
                })
                .collect();
            println!("types:       {}", types.join(", "));
        }
        if let Some(d) = report["documents"].as_object() {
            println!(
                "documents:   {} ({} tokens); lengths min {}, median {}, p90 {}, p99 {}, max {}, \
                 mean {:.1}",
                d["documents"],
                d["tokens"],
                d["min"],
                d["median"],
                d["p90"],
                d["p99"],
                d["max"],
                d["mean"].as_f64().unwrap_or_default()
            );
        }
        println!("fingerprint: {}", m.fingerprint());
        for r in report["first"].as_array().into_iter().flatten() {
            println!("{r}");
        }
    }
    Ok(())
}

/// A document dataset's documents, tokens and length distribution (a Megatron dataset, or
/// token files with `--eos-id`); `null` for other datasets.
fn documents_report(
    dataset: Option<&chute::dataset::Dataset>,
    args: &crate::dataset_args::DatasetArgs,
) -> anyhow::Result<serde_json::Value> {
    use chute::dataset::Documents;
    use chute::formats::Format;
    let Some(dataset) = dataset else {
        return Ok(serde_json::Value::Null);
    };
    let docs = match (dataset.format, args.eos_id) {
        (Format::Megatron, _) => Documents::megatron(&dataset.files)?,
        (Format::Tokens, Some(eos)) => {
            let dtype = args.token_dtype.unwrap_or(chute::core::DType::U16);
            Documents::split_at_eos(&dataset.files, dtype, eos)?
        }
        _ => return Ok(serde_json::Value::Null),
    };
    let mut lens: Vec<u64> = (0..docs.len()).map(|d| docs.doc_len(d)).collect();
    lens.sort_unstable();
    let at = |q: f64| -> u64 {
        if lens.is_empty() {
            0
        } else {
            lens[((lens.len() - 1) as f64 * q).round() as usize]
        }
    };
    Ok(json!({
        "documents": docs.len(),
        "tokens": docs.tokens(),
        "dtype": docs.dtype().name(),
        "min": at(0.0),
        "median": at(0.5),
        "p90": at(0.9),
        "p99": at(0.99),
        "max": at(1.0),
        "mean": docs.tokens() as f64 / docs.len().max(1) as f64,
    }))
}

/// A mixture: its components, the effective proportions at each schedule point, and how
/// many epochs of each component one mixture epoch consumes.
fn inspect_mixture(m: &Mixture, as_json: bool) -> anyhow::Result<()> {
    let (points, ramp) = m.schedule();
    let epochs = m.epochs_per_epoch();
    let seed = 0;
    let served = m.counts_before(m.samples_per_epoch(), seed);
    let components: Vec<_> = m
        .components()
        .iter()
        .zip(&epochs)
        .zip(&served)
        .map(|((c, (_, e)), n)| {
            json!({"name": c.name(), "samples": c.len(), "per_epoch": n, "epochs_per_epoch": e})
        })
        .collect();
    let report = json!({
        "format": "mixture",
        "samples_per_epoch": m.samples_per_epoch(),
        "mode": m.mode().to_string(),
        "policy": m.policy().to_string(),
        "components": components,
        "schedule": points.iter().map(|(p, w)| json!({
            "at": p,
            // The proportions as served: the weights rounded to the period's quotas.
            "weights": m.components().iter().zip(w).map(|(c, x)| (c.name().to_string(), json!(x)))
                .collect::<serde_json::Map<_, _>>(),
        })).collect::<Vec<_>>(),
        "ramp": ramp,
        "params": m.manifest().params,
        "fingerprint": m.manifest().fingerprint(),
    });
    if as_json {
        println!("{}", redact(&serde_json::to_string_pretty(&report)?));
        return Ok(());
    }
    println!("format:            mixture ({}, {})", m.mode(), m.policy());
    println!("samples per epoch: {}", m.samples_per_epoch());
    for c in &components {
        println!(
            "  {:<16} {:>12} samples, {:>12} per mixture epoch = {:.3} of its epochs",
            c["name"].as_str().unwrap_or_default(),
            c["samples"],
            c["per_epoch"],
            c["epochs_per_epoch"].as_f64().unwrap_or(0.0)
        );
    }
    for p in report["schedule"].as_array().into_iter().flatten() {
        let w: Vec<String> = p["weights"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(n, x)| format!("{n} {:.4}", x.as_f64().unwrap_or(0.0)))
            .collect();
        println!("  from sample {:>12}: {}", p["at"], w.join(", "));
    }
    if ramp {
        println!("  (weights ramp linearly between these points)");
    }
    println!("fingerprint:       {}", m.manifest().fingerprint());
    Ok(())
}

fn kind(f: &Field) -> String {
    match f {
        Field::Bytes(_) => "bytes".into(),
        Field::Text(_) => "text".into(),
        Field::Array(a) => format!("{} {:?}", a.out_dtype(), a.shape),
        Field::Value(_) => "nested".into(),
        _ => "?".into(),
    }
}

pub(crate) fn cat(args: CatArgs) -> anyhow::Result<()> {
    let source = args.dataset.open()?;
    let n = source.manifest().total_samples();
    let end = args.records.map_or(n, |k| (args.skip + k).min(n));
    let tokenizer = match &args.decode {
        Some(p) => Some(chute::ops::text::TextTokenizer::load(p).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for id in args.skip..end {
        let s = source
            .read(id)
            .with_context(|| format!("reading sample {id}"))?;
        let mut record = sample_json(&s);
        if let Some(t) = &tokenizer {
            for name in ["tokens", "input_ids"] {
                let Some(Field::Array(a)) = s.get(name) else {
                    continue;
                };
                let n: usize = a.shape.iter().product();
                let mut wide = vec![0u8; n * 8];
                chute::core::cast_into(a.dtype, &a.data, chute::core::DType::I64, &mut wide);
                let ids: Vec<u32> = wide
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")) as u32)
                    .collect();
                let text = t.decode(&ids, false).map_err(anyhow::Error::msg)?;
                record[format!("{name}_text")] = Value::String(text);
            }
        }
        use std::io::Write;
        if writeln!(out, "{record}").is_err() {
            break; // a closed pipe (`| head`) ends the listing quietly
        }
    }
    Ok(())
}

/// One problem `verify` found.
#[derive(Debug, serde::Serialize)]
struct Problem {
    shard: String,
    offset: Option<u64>,
    sample: Option<u64>,
    reason: String,
}

fn problem(shard: &str, sample: Option<u64>, e: &anyhow::Error) -> Problem {
    let (offset, reason) = match e.downcast_ref::<Error>() {
        Some(Error::Corrupt { offset, reason, .. }) => (Some(*offset), reason.clone()),
        _ => (None, format!("{e:#}")),
    };
    Problem {
        shard: shard.to_string(),
        offset,
        sample,
        reason,
    }
}

/// Opens each shard on its own and reads every record, collecting every problem; exits with
/// status 1 if there is any.
pub(crate) fn verify(args: VerifyArgs) -> anyhow::Result<()> {
    let mut problems = Vec::new();
    let (mut shards, mut samples) = (0u64, 0u64);
    let dataset = args.dataset.resolve()?;
    let options = args.dataset.options()?;
    for path in &dataset.files {
        let shard = path.display().to_string();
        shards += 1;
        let source = match dataset.open_files(std::slice::from_ref(path), &options) {
            Ok(s) => s,
            Err(e) => {
                problems.push(problem(&shard, None, &anyhow::Error::new(e)));
                continue;
            }
        };
        // Read in order: a remote shard then streams whole instead of a request per sample.
        if let Ok(plan) = Plan::new(source.manifest(), &PlanConfig::default()) {
            source.set_plan(&plan);
        }
        for id in 0..source.manifest().total_samples() {
            samples += 1;
            if let Err(e) = source.read(id) {
                problems.push(problem(&shard, Some(id), &anyhow::Error::new(e)));
            }
        }
    }
    if args.json {
        let report = json!({ "shards": shards, "samples": samples, "ok": problems.is_empty(), "problems": problems });
        println!("{}", redact(&serde_json::to_string_pretty(&report)?));
    } else {
        for p in &problems {
            match (p.offset, p.sample) {
                (Some(o), _) => println!("{}: byte {o}: {}", redact(&p.shard), p.reason),
                (None, Some(s)) => println!("{}: sample {s}: {}", redact(&p.shard), p.reason),
                (None, None) => println!("{}: {}", redact(&p.shard), p.reason),
            }
        }
        println!(
            "{} shard(s), {samples} sample(s) read: {}",
            shards,
            if problems.is_empty() {
                "ok".to_string()
            } else {
                format!("{} problem(s)", problems.len())
            }
        );
    }
    if problems.is_empty() {
        Ok(())
    } else {
        std::process::exit(1)
    }
}
