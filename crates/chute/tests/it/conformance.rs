//! The engine's conformance checks against every real source, opened the one way users open
//! them (`chute::open` on a folder): the delivered stream is identical for every worker count
//! and prefetch depth, and resuming from the state before every batch continues exactly, in
//! every shuffle mode. Each dataset has shards of unequal sizes, so batches cross shards.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use chute::core::{Array, Field, Sample};
use chute::formats::ipc::IpcWriter;
use chute::formats::parquet::ParquetWriter;
use chute::formats::tfrecord::{TfRecordFileWriter, WriterOptions};
use chute::formats::webdataset::{ShardWriter, ShardWriterOptions};
use chute::ops::SampleOps;
use chute::pipeline::Loader;
use chute::pipeline::check::{check_matrix, check_resume};
use chute::{DType, Format, OpenOptions, Shuffle, Source, TokenSource};

fn row(id: u64) -> Sample {
    let x: Vec<u8> = (0..3)
        .flat_map(|k| (id as f32 * 0.5 + k as f32).to_le_bytes())
        .collect();
    Sample::new(id)
        .with(
            "y",
            Field::Array(Array::new(
                DType::I64,
                vec![],
                Bytes::copy_from_slice(&(id as i64 * 3).to_le_bytes()),
            )),
        )
        .with(
            "x",
            Field::Array(Array::new(DType::F32, vec![3], Bytes::from(x))),
        )
}

/// Shard sizes: unequal, so shard and batch boundaries fall in different places.
const SHARDS: [u64; 3] = [11, 4, 8];

fn write_tokens(dir: &Path) {
    let mut next = 0u32;
    for (i, &n) in SHARDS.iter().enumerate() {
        let mut w = chute::formats::TokenWriter::create(dir.join(format!("t-{i}.bin")), DType::U16)
            .unwrap();
        // Windows of seq_len + 1 = 6 tokens, plus a ragged tail that is not a sample.
        let ids: Vec<u32> = (0..n as u32 * 6 + 2).map(|k| (next + k) % 50_000).collect();
        next += ids.len() as u32;
        w.write_tokens(&ids).unwrap();
        w.finish().unwrap();
    }
}

fn write_webdataset(dir: &Path) {
    let pattern = dir.join("w-%03d.tar");
    let mut id = 0;
    for (i, &n) in SHARDS.iter().enumerate() {
        let opts = ShardWriterOptions {
            start_shard: i as u64,
            max_count: n,
            ..Default::default()
        };
        let mut w = ShardWriter::new(pattern.to_str().unwrap(), opts).unwrap();
        for _ in 0..n {
            let label = (id % 10).to_string();
            let img = jpeg(id);
            w.write(
                &format!("k{id:04}"),
                &[("cls", label.as_bytes()), ("jpg", &img)],
            )
            .unwrap();
            id += 1;
        }
        w.finish().unwrap();
    }
}

/// A small RGB JPEG, its size and pixels varying with `id`.
pub(crate) fn jpeg(id: u64) -> Vec<u8> {
    let (w, h) = (24 + (id % 5) as u16 * 4, 20 + (id % 3) as u16 * 6);
    let px: Vec<u8> = (0..w as usize * h as usize * 3)
        .map(|k| ((k as u64 * 7 + id * 13) % 251) as u8)
        .collect();
    let mut out = Vec::new();
    jpeg_encoder::Encoder::new(&mut out, 90)
        .encode(&px, w, h, jpeg_encoder::ColorType::Rgb)
        .unwrap();
    out
}

fn write_tfrecord(dir: &Path) {
    let mut id = 0;
    for (i, &n) in SHARDS.iter().enumerate() {
        let mut w = TfRecordFileWriter::create(
            dir.join(format!("r-{i}.tfrecord")),
            WriterOptions::default(),
        )
        .unwrap();
        for _ in 0..n {
            w.write_sample(&row(id)).unwrap();
            id += 1;
        }
        w.finish().unwrap();
    }
}

fn write_parquet(dir: &Path) {
    let mut id = 0;
    for (i, &n) in SHARDS.iter().enumerate() {
        let mut w = ParquetWriter::create(dir.join(format!("p-{i}.parquet")), 5).unwrap();
        for _ in 0..n {
            w.write(&row(id)).unwrap();
            id += 1;
        }
        w.finish().unwrap();
    }
}

fn write_arrow(dir: &Path) {
    let mut id = 0;
    for (i, &n) in SHARDS.iter().enumerate() {
        let mut w = IpcWriter::create(dir.join(format!("a-{i}.arrow")), 5).unwrap();
        for _ in 0..n {
            w.write(&row(id)).unwrap();
            id += 1;
        }
        w.finish().unwrap();
    }
}

/// A folder of `format` shards, opened through `chute::open`.
fn open(format: Format, dir: &Path) -> Arc<dyn Source> {
    match format {
        Format::Tokens => write_tokens(dir),
        Format::WebDataset => write_webdataset(dir),
        Format::TfRecord => write_tfrecord(dir),
        Format::Parquet => write_parquet(dir),
        Format::Arrow => write_arrow(dir),
        other => unreachable!("{other}"),
    }
    let options = OpenOptions {
        seq_len: Some(5),
        chunk_rows: Some(3),
        ..Default::default()
    };
    let source = chute::open(&[dir], &options).unwrap();
    let m = source.manifest();
    assert_eq!(m.format, format.name());
    let expected: Vec<u64> = match format {
        // Chunks of at most 3 rows within row groups of 5: 5+5+1, 4, 5+3 rows.
        // The same for Arrow's record batches of 5.
        Format::Parquet | Format::Arrow => vec![3, 2, 3, 2, 1, 3, 1, 3, 2, 3],
        _ => SHARDS.to_vec(),
    };
    assert_eq!(
        m.shards.iter().map(|s| s.samples).collect::<Vec<_>>(),
        expected,
        "{format}"
    );
    source
}

fn conform(source: Arc<dyn Source>, transform: Option<SampleOps>, what: &str) {
    for shuffle in [Shuffle::None, Shuffle::Global, Shuffle::Block { window: 2 }] {
        let make = |w: usize, p: usize| {
            let mut b = Loader::builder_arc(source.clone())
                .batch_size(4)
                .shuffle(shuffle)
                .seed(11)
                .num_workers(w)
                .prefetch(p);
            if let Some(t) = &transform {
                b = b.transform(t.clone());
            }
            b.build().unwrap()
        };
        check_matrix(make, &[0, 1, 3], &[1, 3], 2)
            .unwrap_or_else(|e| panic!("{what} {shuffle}: {e}"));
        check_resume(|| make(2, 2), 2).unwrap_or_else(|e| panic!("{what} {shuffle}: {e}"));
    }
}

#[test]
fn token_files_conform() {
    let dir = tempfile::tempdir().unwrap();
    let source = open(Format::Tokens, dir.path());
    // The opener gives what the format's own constructor gives.
    let direct = TokenSource::open(
        &[
            dir.path().join("t-0.bin"),
            dir.path().join("t-1.bin"),
            dir.path().join("t-2.bin"),
        ],
        chute::TokenOptions {
            seq_len: 5,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        source.manifest().fingerprint(),
        direct.manifest().fingerprint()
    );
    conform(source, None, "tokens");
}

#[test]
fn webdataset_shards_conform_with_and_without_image_ops() {
    let dir = tempfile::tempdir().unwrap();
    let source = open(Format::WebDataset, dir.path());
    conform(source.clone(), None, "webdataset");
    let ops: SampleOps = r#"{"jpg": {"as": "image", "ops": [{"op": "decode"},
        {"op": "random_resized_crop", "size": 16}, {"op": "horizontal_flip"}]},
        "cls": [{"op": "label"}]}"#
        .parse()
        .unwrap();
    conform(source, Some(ops), "webdataset + image ops");
}

#[test]
fn tfrecord_files_conform() {
    let dir = tempfile::tempdir().unwrap();
    conform(open(Format::TfRecord, dir.path()), None, "tfrecord");
}

#[test]
fn arrow_ipc_files_conform() {
    let dir = tempfile::tempdir().unwrap();
    conform(open(Format::Arrow, dir.path()), None, "arrow");
}

#[test]
fn parquet_files_conform() {
    let dir = tempfile::tempdir().unwrap();
    conform(open(Format::Parquet, dir.path()), None, "parquet");
}
