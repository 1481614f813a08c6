//! `chute index`: per-shard index files and the dataset's manifest.

use std::path::{Path, PathBuf};

use anyhow::Context;
use chute::formats::{IndexMode, tfrecord, webdataset};
use chute::io::{Location, write_atomically};
use clap::{Args, Parser};

use chute::formats::Format;

use crate::dataset_args::DatasetArgs;

/// `chute index` arguments.
#[derive(Debug, Clone, Args)]
pub(crate) struct IndexArgs {
    #[command(flatten)]
    dataset: DatasetArgs,
    /// Where to write the manifest (default: `manifest.json` next to the first shard).
    #[arg(short, long)]
    output: Option<PathBuf>,
}

/// Indexes `paths` as `chute index --format <format> -o <manifest> <paths>` with every other
/// option at its default (what `chute convert --index` runs on the shards it wrote).
pub(crate) fn index_files(
    paths: &[PathBuf],
    format: Format,
    manifest: &Path,
) -> anyhow::Result<()> {
    #[derive(Parser)]
    struct Line {
        #[command(flatten)]
        index: IndexArgs,
    }
    let mut argv: Vec<std::ffi::OsString> = vec!["chute-index".into(), "--format".into()];
    argv.push(format.name().into());
    argv.push("--output".into());
    argv.push(manifest.into());
    argv.extend(paths.iter().map(|p| p.into()));
    run(Line::try_parse_from(argv)?.index)
}

/// Scans every shard, writes `<shard>.idx` for tar and TFRecord shards (random access for
/// the global shuffle), and the manifest: shards with sample counts and byte sizes, paths
/// relative to the manifest's folder.
pub(crate) fn run(mut args: IndexArgs) -> anyhow::Result<()> {
    let r = args.dataset.resolve_shards()?;
    let mut indexes = 0;
    let mut remote = 0;
    match r.format {
        Format::WebDataset | Format::TfRecord => {
            // Scan each shard on its own (ignoring any old index) to reach the format's index,
            // which the Source trait hides.
            for path in &r.files {
                if Location::from_path(path)?.is_remote() {
                    // No writing next to a remote object: the manifest (below) is written,
                    // and reading uses `<shard>.idx` objects where they were uploaded.
                    remote += 1;
                    continue;
                }
                match r.format {
                    Format::WebDataset => {
                        let s = webdataset::WebDatasetSource::open(
                            std::slice::from_ref(path),
                            webdataset::WebDatasetOptions {
                                index: IndexMode::Scan,
                                ..Default::default()
                            },
                        )?;
                        s.shard_index(0).save(&webdataset::index_path(path))?;
                    }
                    _ => {
                        let s = tfrecord::TfRecordSource::open(
                            std::slice::from_ref(path),
                            tfrecord::TfRecordOptions {
                                index: IndexMode::Scan,
                                example: None,
                                ..Default::default()
                            },
                        )?;
                        tfrecord::write_index(&tfrecord::index_path(path), &s.index_entries(0))?;
                    }
                }
                indexes += 1;
            }
        }
        _ => {}
    }
    // The indexes just written describe the shards as they are now, so opening through them
    // (not scanning a second time) gives the manifest.
    args.dataset.index = IndexMode::Auto;
    let source = r.open(&args.dataset.options()?)?;
    let out = match args.output.clone() {
        Some(out) => out,
        None if remote > 0 => anyhow::bail!(
            "remote shards: pass --output with a local file for the manifest (upload it next \
             to the shards to load them by the manifest's URL)"
        ),
        None => r.files[0]
            .parent()
            .unwrap_or(std::path::Path::new("."))
            .join("manifest.json"),
    };
    let base = out.parent().map(|p| p.to_path_buf()).unwrap_or_default();
    let mut manifest = source.manifest().clone();
    // Shard paths relative to the manifest's folder (so the dataset can move), absolute for
    // local shards outside it (a glob over several folders), URLs as they are.
    for s in &mut manifest.shards {
        let p = PathBuf::from(&s.path);
        if let Ok(rel) = p.strip_prefix(&base) {
            s.path = rel.display().to_string();
        } else if !Location::from_path(&p)?.is_remote() {
            s.path = std::path::absolute(&p)
                .with_context(|| format!("locating {}", p.display()))?
                .display()
                .to_string();
        }
    }
    write_atomically(&out, manifest.to_json().as_bytes())
        .with_context(|| format!("writing {}", out.display()))?;
    println!(
        "{}: {} shard(s), {} samples, {} bytes; {indexes} index file(s) written",
        out.display(),
        manifest.shards.len(),
        manifest.total_samples(),
        manifest.total_bytes()
    );
    if remote > 0 {
        println!(
            "{remote} remote shard(s): no index files written next to them (index local copies \
             and upload the .idx files, so that opening them does not download every shard)"
        );
    }
    Ok(())
}
