//! `chute doctor`: the engine's measurements ([`chute_pipeline::doctor`]) plus the rules that
//! need to know formats, storage and ops. Each rule has a name (the `rule` of its
//! [`Advice`]) and a test that produces it:
//!
//! | rule | when | advice |
//! | --- | --- | --- |
//! | `not-indexed` | tar or TFRecord shards without a `.idx` file | `chute index`: opening then reads an index instead of scanning every shard |
//! | `page-cache` | under half of the local data in the page cache when the doctor started | reads go to disk; what would help (memory, local disk, block shuffle) |
//! | `remote-read-ahead` | remote shards streamed whole (block shuffle) and reading binds | raise `read_ahead` |
//! | `streaming-shuffle` | remote shards under global shuffle | block shuffle: whole shards, fetched once, in order |
//! | `reduced-decode` | the transform binds on JPEG fields decoded at full size | decode fused with the resize or crop (a reduced-size DCT decode) |
//!
//! and, from the engine, `workers`, `prefetch`, `no-scaling` and `consumer`.

use std::path::Path;
use std::time::Duration;

use chute_core::{Batch, Error, Shuffle};
use chute_ops::spec::{Op, SampleOps};
use chute_pipeline::Loader;
pub use chute_pipeline::doctor::{Advice, Diagnosis, DoctorOptions, StageFigure, Trial};

/// What the doctor knows beyond the loader.
#[derive(Debug, Default, Clone, Copy)]
pub struct Context<'a> {
    /// The native ops the loader runs, if any (for the decode rule).
    pub ops: Option<&'a SampleOps>,
    /// How long opening the dataset took, if the caller timed it.
    pub opened_in: Option<Duration>,
}

/// Runs the engine's doctor on `loader`, then the format, storage and ops rules. `crossing`
/// is the consumer's hand-over of a batch (Python's conversion), timed when given; it returns
/// false to stop (an interrupt).
pub fn diagnose(
    loader: &Loader,
    options: &DoctorOptions,
    context: Context<'_>,
    crossing: Option<&mut dyn FnMut(Batch) -> bool>,
) -> Result<Diagnosis, Error> {
    let cache = page_cache(loader);
    let mut d = chute_pipeline::doctor::diagnose(loader, options, crossing)?;
    let manifest = loader.source().manifest();
    let paths: Vec<&str> = manifest.shards.iter().map(|s| s.path.as_str()).collect();
    let remote = paths.iter().any(|p| is_url(p));
    let shuffle = loader.options().shuffle;

    if matches!(manifest.format.as_str(), "webdataset" | "tfrecord") {
        let local: Vec<&&str> = paths.iter().filter(|p| !is_url(p)).collect();
        let missing = local
            .iter()
            .filter(|p| !Path::new(&format!("{p}.idx")).exists())
            .count();
        if missing > 0 {
            let took = context
                .opened_in
                .filter(|t| t.as_secs_f64() >= 0.05)
                .map(|t| format!(" (opening took {:.2} s)", t.as_secs_f64()))
                .unwrap_or_default();
            d.advise(
                "not-indexed",
                format!(
                    "{missing} of {} shards have no index file, so each is scanned from end to \
                     end when the dataset is opened{took}; run `chute index` on them once (it \
                     writes <shard>.idx and a manifest.json), and opening reads the index instead",
                    local.len()
                ),
            );
        }
    }

    if let Some((resident, total)) = cache
        && total > 0
        && (resident as f64) < 0.5 * total as f64
    {
        let available = mem_available();
        let fits = match available {
            Some(m) if total > m => format!(
                "the data ({}) is larger than the memory available ({}), so every epoch reads \
                 from disk: use a faster local disk, store fewer bytes (resize or recompress \
                 ahead of time), or block shuffle so reads are long and sequential",
                gib(total),
                gib(m)
            ),
            _ => format!(
                "the data ({}) fits in memory, so later epochs read from the page cache; the \
                 first epoch runs at disk speed",
                gib(total)
            ),
        };
        d.advise(
            "page-cache",
            format!(
                "{:.0}% of the local data was in the page cache when the doctor started: reads \
                 go to disk (page cache misses), and the read stage's figure is the disk's; {fits}",
                100.0 * resident as f64 / total as f64
            ),
        );
    }

    if remote {
        let read_ahead = chute_io::remote_options().map_or(2, |o| o.read_ahead);
        if matches!(shuffle, Shuffle::Block { .. } | Shuffle::None) && d.bottleneck == "read" {
            d.advise(
                "remote-read-ahead",
                format!(
                    "reading remote shards binds: they stream whole, {read_ahead} ahead of the \
                     one being read; raise the read-ahead (CHUTE_READ_AHEAD={}, or \
                     chute.set_remote_options(read_ahead={})) so more downloads overlap, and \
                     set a node-local cache (CHUTE_CACHE_DIR) so later epochs read none",
                    (read_ahead * 2).max(4),
                    (read_ahead * 2).max(4)
                ),
            );
        }
        if matches!(shuffle, Shuffle::Global) {
            d.advise(
                "streaming-shuffle",
                "global shuffle over remote shards reads every sample with its own range \
                 request, in random order: use shuffle=\"block\" (whole shards streamed in a \
                 shuffled order, samples shuffled within a window of them), which downloads each \
                 shard once and in order",
            );
        }
    }

    if d.bottleneck == "transform"
        && let Some(message) = reduced_decode(loader, &d, context.ops)
    {
        d.advise("reduced-decode", message);
    }
    Ok(d)
}

/// The `reduced-decode` rule: a JPEG field at least twice the size (each side) of the largest
/// image the transforms make, decoded at full size (by a Python transform, or by native ops
/// whose decode is not fused with a resize or crop). The size comes from the first sample's
/// JPEG header.
fn reduced_decode(loader: &Loader, d: &Diagnosis, ops: Option<&SampleOps>) -> Option<String> {
    let plan = loader.plan().ok().filter(|p| !p.is_empty())?;
    let first = plan.get(0);
    let sample = loader.source().read(first).ok()?;
    let (name, (h, w)) = sample.fields.iter().find_map(|(k, f)| match f {
        chute_core::Field::Bytes(b) if b.starts_with(&[0xFF, 0xD8, 0xFF]) => {
            Some((k.to_string(), chute_ops::image::image_size(b).ok()?))
        }
        _ => None,
    })?;
    // The largest output image side: the two largest dimensions of each array (HWC or CHW).
    let out = d
        .output_shapes
        .iter()
        .filter(|(_, shape)| shape.len() >= 2)
        .map(|(_, shape)| {
            let mut dims = shape.clone();
            dims.sort_unstable_by(|a, b| b.cmp(a));
            dims[0]
        })
        .max()?;
    if h.min(w) < 2 * out {
        return None;
    }
    let unfused = ops.map(unfused_decodes).unwrap_or_default();
    let what = match ops {
        None => format!(
            "the transform decodes {name}'s {w}x{h} JPEG images at full size for outputs of at \
             most {out} pixels a side"
        ),
        Some(_) if unfused.is_empty() => return None,
        Some(_) => format!(
            "field {} decodes its {w}x{h} JPEG images at full size for outputs of at most {out} \
             pixels a side (its decode is not followed at once by resize or \
             random_resized_crop)",
            unfused.join(", ")
        ),
    };
    Some(format!(
        "decoding binds and {what}; put resize (or random_resized_crop) directly after decode \
         in chute's native ops ({{\"{name}\": [{{\"op\": \"decode\"}}, {{\"op\": \
         \"resize\", \"size\": {out}}}, ...]}}): the two are fused, and the JPEG is decoded at \
         a reduced size (a DCT-scaled decode, up to {}x fewer pixels here) and only the crop's \
         region",
        scaled_fewer_pixels(h.min(w) / out)
    ))
}

/// How many times fewer pixels a DCT-scaled decode gives (1/2, 1/4 or 1/8 a side) when the
/// image is `ratio` times the output.
fn scaled_fewer_pixels(ratio: usize) -> usize {
    let scale = 1usize << ratio.clamp(1, 8).ilog2();
    scale * scale
}

/// Output fields whose ops decode an image without a resize or crop right after.
fn unfused_decodes(p: &SampleOps) -> Vec<String> {
    p.fields()
        .iter()
        .filter(|f| {
            f.ops.iter().enumerate().any(|(i, op)| {
                matches!(op, Op::Decode { .. })
                    && !matches!(
                        f.ops.get(i + 1),
                        Some(Op::Resize { .. } | Op::RandomResizedCrop { .. })
                    )
            })
        })
        .map(|f| {
            f.output
                .clone()
                .or_else(|| f.names.first().cloned())
                .unwrap_or_default()
        })
        .collect()
}

fn is_url(p: &str) -> bool {
    p.contains("://")
}

/// Bytes of the local shards the page cache holds, and their size (at most 4,096 shards
/// looked at; `None` without local shards).
fn page_cache(loader: &Loader) -> Option<(u64, u64)> {
    let (mut resident, mut total) = (0u64, 0u64);
    for s in loader.source().manifest().shards.iter().take(4096) {
        if is_url(&s.path) {
            continue;
        }
        let Ok(file) = chute_io::MappedFile::open(&s.path) else {
            continue;
        };
        if let Some(r) = file.resident_bytes() {
            resident += r;
            total += file.len() as u64;
        }
    }
    (total > 0).then_some((resident, total))
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn gib(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.0} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}
