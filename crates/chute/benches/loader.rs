//! Engine benchmarks, each measured side by side with its reference in one run:
//!
//! - `overhead`: trivial samples end to end with 2 workers (engine cost per sample);
//! - `stats`: `Loader::stats()` (cheap enough to call every step?) and the Prometheus
//!   exposition of one loader, beside one delivered batch of `overhead` (256 samples);
//! - `planner`: `chute plan`'s computation for 1,024 ranks on 128 nodes over 10^9 samples
//!   in 100,000 shards (block and global shuffle);
//! - `tokens`: token batches (seq_len 1024, batch 16, global shuffle, int64 out) from a
//!   memory-mapped file in page cache, against single-thread memcpy of the same bytes.
//!
//! Run: `cargo bench -p chute --bench loader`.

use std::hint::black_box;
use std::time::Duration;

use bytes::Bytes;
use chute::core::{Array, Field, Manifest, Sample, ShardInfo, Source};
use chute::formats::TokenWriter;
use chute::{DType, Error, Loader, Shuffle, TokenOptions, TokenSource};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

/// The cheapest possible source: a scalar per sample, no I/O.
struct Trivial(Manifest);

impl Source for Trivial {
    fn manifest(&self) -> &Manifest {
        &self.0
    }

    fn read(&self, id: u64) -> Result<Sample, Error> {
        static ZERO: [u8; 8] = [0; 8];
        let _ = id;
        Ok(Sample::new(id).with(
            "x",
            Field::Array(Array::new(DType::U64, vec![], Bytes::from_static(&ZERO))),
        ))
    }
}

fn overhead(c: &mut Criterion) {
    const N: u64 = 1_000_000;
    let manifest = Manifest::new(
        "trivial",
        vec![ShardInfo {
            path: "t".into(),
            samples: N,
            bytes: 8 * N,
        }],
    );
    let source: std::sync::Arc<dyn Source> = std::sync::Arc::new(Trivial(manifest));
    let mut g = c.benchmark_group("overhead");
    g.throughput(Throughput::Elements(N))
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));
    for (workers, shuffle) in [
        (2, Shuffle::None),
        (2, Shuffle::Global),
        (0, Shuffle::Global),
    ] {
        g.bench_function(
            format!("trivial_1M_samples/workers={workers}/shuffle={shuffle}"),
            |b| {
                b.iter(|| {
                    let mut loader = Loader::builder_arc(source.clone())
                        .batch_size(256)
                        .shuffle(shuffle)
                        .num_workers(workers)
                        .prefetch(4)
                        .build()
                        .unwrap();
                    let mut n = 0;
                    for batch in &mut loader {
                        n += batch.unwrap().len();
                    }
                    assert_eq!(n as u64, N);
                })
            },
        );
    }
    g.finish();
}

fn stats(c: &mut Criterion) {
    const N: u64 = 1 << 30;
    let manifest = Manifest::new(
        "trivial",
        vec![ShardInfo {
            path: "t".into(),
            samples: N,
            bytes: 8 * N,
        }],
    );
    let mut loader = Loader::builder(Trivial(manifest))
        .batch_size(256)
        .num_workers(2)
        .prefetch(4)
        .name("bench")
        .build()
        .unwrap();
    for b in (&mut loader).take(1000) {
        b.unwrap();
    }
    let mut g = c.benchmark_group("stats");
    g.bench_function("loader_stats", |b| b.iter(|| black_box(loader.stats())));
    g.bench_function("next_batch_of_256", |b| {
        b.iter(|| black_box(loader.next().unwrap().unwrap().len()))
    });
    g.bench_function("metrics_render_one_loader", |b| {
        b.iter(|| black_box(chute::pipeline::metrics::render().len()))
    });
    g.finish();
}

fn planner(c: &mut Criterion) {
    use chute::core::planner::{PlanQuery, plan_job};
    let shards = (0..100_000)
        .map(|i| ShardInfo {
            path: format!("s3://bucket/train-{i:06}.tar"),
            samples: 10_000,
            bytes: 1 << 30,
        })
        .collect();
    let manifest = Manifest::new("webdataset", shards);
    let mut g = c.benchmark_group("planner");
    g.sample_size(10);
    for shuffle in [Shuffle::block(), Shuffle::Global] {
        let q = PlanQuery {
            shuffle,
            world_size: 1024,
            nodes: 128,
            batch_size: 32,
            ..PlanQuery::default()
        };
        g.bench_function(format!("1024_ranks_1e9_samples/shuffle={shuffle}"), |b| {
            b.iter(|| black_box(plan_job(&manifest, &q).unwrap().epochs[0].bytes))
        });
    }
    g.finish();
}

/// The ids of one batch of 4,096 from a plan (what a worker computes per batch): 5,000,000
/// samples in shards of 16,384, as a Parquet file's row groups become.
fn batch_ids(c: &mut Criterion) {
    use chute::core::{Plan, PlanConfig};
    let shards = (0..306)
        .map(|i| ShardInfo {
            path: format!("part-{i}"),
            samples: 16_384,
            bytes: 1 << 20,
        })
        .collect();
    let manifest = Manifest::new("parquet", shards);
    let mut g = c.benchmark_group("plan");
    g.throughput(Throughput::Elements(4096));
    for shuffle in [Shuffle::block(), Shuffle::Global, Shuffle::None] {
        let cfg = PlanConfig {
            shuffle,
            batch_size: 4096,
            ..PlanConfig::default()
        };
        let plan = Plan::new(&manifest, &cfg).unwrap();
        let mut ids = Vec::with_capacity(4096);
        let mut at = 0;
        g.bench_function(format!("batch_ids_of_4096/shuffle={shuffle}"), |b| {
            b.iter(|| {
                ids.clear();
                at = (at + 4096) % (plan.len() - 4096);
                plan.extend_ids(at..at + 4096, &mut ids);
                black_box(ids[4095])
            })
        });
    }
    g.finish();
}

fn tokens(c: &mut Criterion) {
    const TOKENS: u64 = 64 << 20; // 128 MiB of uint16, in page cache after the first epoch
    const SEQ: usize = 1024;
    const BATCH: usize = 16;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.bin");
    let mut w = TokenWriter::create(&path, DType::U16).unwrap();
    let chunk: Vec<u32> = (0..1u32 << 16)
        .map(|i| i.wrapping_mul(2_654_435_761) % 50_257)
        .collect();
    for _ in 0..TOKENS >> 16 {
        w.write_tokens(&chunk).unwrap();
    }
    w.finish().unwrap();
    let source: std::sync::Arc<dyn Source> = std::sync::Arc::new(
        TokenSource::open(
            &[&path],
            TokenOptions {
                seq_len: SEQ,
                dtype: DType::U16,
                out_dtype: DType::I64,
            },
        )
        .unwrap(),
    );
    let windows = source.manifest().total_samples();
    let epoch_bytes = windows / BATCH as u64 * (BATCH * (SEQ + 1) * 8) as u64;

    let mut g = c.benchmark_group("tokens");
    g.throughput(Throughput::Bytes(epoch_bytes))
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));
    for workers in [2, 1] {
        g.bench_function(
            format!("epoch_seq1024_batch16_global_int64/workers={workers}"),
            |b| {
                b.iter(|| {
                    let mut loader = Loader::builder_arc(source.clone())
                        .batch_size(BATCH)
                        .shuffle(Shuffle::Global)
                        .drop_last(true)
                        .num_workers(workers)
                        .prefetch(4)
                        .build()
                        .unwrap();
                    let mut bytes = 0;
                    for batch in &mut loader {
                        bytes += black_box(batch.unwrap()).nbytes() as u64;
                    }
                    assert_eq!(bytes, epoch_bytes);
                })
            },
        );
    }
    // The reference: one thread copying the same number of bytes, batch-sized blocks from a
    // buffer far larger than the caches into a recycled destination (as the engine does).
    let batch_bytes = BATCH * (SEQ + 1) * 8;
    let src = vec![1u8; 512 << 20];
    let mut dst = vec![0u8; batch_bytes];
    let blocks = (epoch_bytes / batch_bytes as u64) as usize;
    g.bench_function("memcpy_single_thread/batch_sized_blocks", |b| {
        b.iter(|| {
            let mut off = 0usize;
            for _ in 0..blocks {
                if off + batch_bytes > src.len() {
                    off = 0;
                }
                dst.copy_from_slice(&src[off..off + batch_bytes]);
                black_box(&dst);
                off += batch_bytes * 3; // skip ahead so the source is never cached
            }
        })
    });
    let mut big = vec![0u8; 256 << 20];
    g.throughput(Throughput::Bytes(big.len() as u64));
    g.bench_function("memcpy_single_thread/256MiB", |b| {
        b.iter(|| {
            big.copy_from_slice(&src[..256 << 20]);
            black_box(&big);
        })
    });
    g.finish();
}

criterion_group!(benches, overhead, stats, planner, batch_ids, tokens);
criterion_main!(benches);
