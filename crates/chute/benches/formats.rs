//! Raw format throughput on one core, from memory (as from page cache):
//!
//! - `tfrecord`: framing + CRC32C verification of every record (1 MiB records);
//! - `tar`: WebDataset samples (two 512 KiB members each) from a tar shard;
//! - `example`: ~100-byte `tf.train.Example`s (an int64, 8 floats, 8 bytes) to samples.
//!
//! Run: `cargo bench -p chute --bench formats`.

use std::hint::black_box;
use std::time::Duration;

use bytes::Bytes;
use chute::core::{Array, DType, Field, Sample};
use chute::formats::example::{ExampleOptions, example_to_sample, sample_to_example};
use chute::formats::tar::TarOptions;
use chute::formats::tfrecord::{FramingOptions, TfRecordWriter, records};
use chute::formats::webdataset::{SampleWriter, Samples};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn tfrecord(c: &mut Criterion) {
    let payload = vec![7u8; 1 << 20];
    let mut w = TfRecordWriter::new(Vec::new());
    for _ in 0..64 {
        w.write_record(&payload).unwrap();
    }
    let shard = w.into_inner().unwrap();
    let mut g = c.benchmark_group("formats");
    g.throughput(Throughput::Bytes(shard.len() as u64))
        .measurement_time(Duration::from_secs(5));
    g.bench_function("tfrecord_framing_crc_1MiB_records", |b| {
        b.iter(|| {
            let n = records(&shard, "bench", FramingOptions::default())
                .map(|r| black_box(r.unwrap()).data.len())
                .sum::<usize>();
            assert_eq!(n, 64 << 20);
        })
    });

    let mut tar = SampleWriter::new(Vec::new(), "bench.tar");
    let half = vec![3u8; 512 << 10];
    for i in 0..64 {
        tar.write(&format!("s{i:04}"), &[("a.bin", &half), ("b.bin", &half)])
            .unwrap();
    }
    let tar = Bytes::from(tar.finish().unwrap());
    g.throughput(Throughput::Bytes(tar.len() as u64));
    g.bench_function("tar_webdataset_samples_2x512KiB", |b| {
        b.iter(|| {
            // Touch every byte (a sum the compiler vectorises), so the figure is what a reader
            // that uses the data gets, not just the cost of finding the members.
            let mut sum = 0u64;
            for s in Samples::new(tar.clone(), "bench.tar", TarOptions::default()) {
                for (_, f) in &s.unwrap().fields {
                    if let Field::Bytes(b) = f {
                        sum += b.iter().map(|&x| u64::from(x)).sum::<u64>();
                    }
                }
            }
            assert_eq!(sum, 64 * 2 * (512 << 10) * 3);
        })
    });

    let floats: Vec<u8> = (0..8).flat_map(|k| (k as f32).to_le_bytes()).collect();
    let examples: Vec<Bytes> = (0..10_000i64)
        .map(|i| {
            let s = Sample::new(0)
                .with(
                    "label",
                    Field::Array(Array::new(
                        DType::I64,
                        vec![],
                        Bytes::copy_from_slice(&i.to_le_bytes()),
                    )),
                )
                .with(
                    "x",
                    Field::Array(Array::new(DType::F32, vec![8], Bytes::from(floats.clone()))),
                )
                .with("id", Field::Bytes(Bytes::from_static(b"abcdefgh")));
            Bytes::from(sample_to_example(&s).unwrap())
        })
        .collect();
    let opts = ExampleOptions::default();
    g.throughput(Throughput::Elements(examples.len() as u64));
    g.bench_function("example_100B_to_sample", |b| {
        b.iter(|| {
            for (i, e) in examples.iter().enumerate() {
                black_box(example_to_sample(i as u64, String::new(), e.clone(), &opts).unwrap());
            }
        })
    });
    g.finish();
}

criterion_group!(benches, tfrecord);
criterion_main!(benches);
